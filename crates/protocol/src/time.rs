//! RFC 3339 timestamps, read strictly, in one place: `Stream-Expires-At` of
//! the Durable Streams room, and later `since=time:<RFC 3339>`.
//!
//! The grammar is RFC 3339 section 5.6 (`date-time`):
//! `YYYY-MM-DDTHH:MM:SS[.fraction](Z|z|+HH:MM|-HH:MM)`, `T` or `t`. Dates
//! that do not exist are refused (`2021-02-31`, `2021-02-29`, month 13, hour
//! 24), as are offsets past `23:59`. A leap second (`:60`, which the grammar
//! allows) counts as the next second's start. A fraction may have any number
//! of digits; it is truncated to milliseconds. Times before 1970 are
//! refused (nothing here names them).

use std::fmt;

/// Why a timestamp was refused: the part at fault, for a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeError(&'static str);

impl fmt::Display for TimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for TimeError {}

impl TimeError {
    /// What is wrong, as a static text.
    pub fn reason(&self) -> &'static str {
        self.0
    }
}

/// Whether `year` is a leap year of the proleptic Gregorian calendar.
fn leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

/// The number of days of `month` (1 to 12) in `year`.
fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let yy = if m <= 2 { y - 1 } else { y };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Reads an RFC 3339 `date-time` (see the module doc) as Unix milliseconds.
///
/// # Errors
/// [`TimeError`] naming the part at fault: the shape, an impossible date or
/// time, an offset out of range, or a time before 1970.
pub fn parse_rfc3339(v: &str) -> Result<u64, TimeError> {
    let b = v.as_bytes();
    let shape = TimeError("not of the form YYYY-MM-DDTHH:MM:SS[.fraction] then Z or ±HH:MM");
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(shape);
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, TimeError> {
        let s = b.get(r).ok_or(shape.clone())?;
        if !s.iter().all(u8::is_ascii_digit) {
            return Err(shape.clone());
        }
        Ok(s.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0')))
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) {
        return Err(TimeError("the month is not 01 to 12"));
    }
    if d < 1 || d > days_in_month(y, mo) {
        return Err(TimeError("the day does not exist in that month"));
    }
    if h > 23 || mi > 59 || s > 60 {
        return Err(TimeError("the time is not 00:00:00 to 23:59:60"));
    }
    let mut i = 19;
    let mut ms = 0i64;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return Err(TimeError("a fraction needs at least one digit"));
        }
        for (k, digit) in b[start..i.min(start + 3)].iter().enumerate() {
            ms += i64::from(digit - b'0') * [100, 10, 1][k];
        }
    }
    let offset_s = match &b[i..] {
        b"Z" | b"z" => 0,
        t if t.len() == 6 && matches!(t[0], b'+' | b'-') && t[3] == b':' => {
            let (oh, om) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if oh > 23 || om > 59 {
                return Err(TimeError("the offset is not 00:00 to 23:59"));
            }
            let o = oh * 3600 + om * 60;
            if t[0] == b'-' {
                -o
            } else {
                o
            }
        }
        _ => return Err(shape),
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s - offset_s;
    u64::try_from(secs * 1000 + ms).map_err(|_| TimeError("the time is before 1970"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_timestamps_are_read_to_the_millisecond() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:01Z"), Ok(1000));
        assert_eq!(parse_rfc3339("1970-01-01t00:00:01z"), Ok(1000));
        assert_eq!(
            parse_rfc3339("2000-03-01T00:00:00.5+01:00"),
            Ok(951_865_200_500)
        );
        assert_eq!(
            parse_rfc3339("2000-03-01T00:00:00.123456789-00:30"),
            Ok(951_870_600_123)
        );
        assert_eq!(parse_rfc3339("2024-02-29T00:00:00Z"), Ok(1_709_164_800_000));
        assert_eq!(parse_rfc3339("2000-02-29T00:00:00Z"), Ok(951_782_400_000));
        // A leap second is the next second's start.
        assert_eq!(
            parse_rfc3339("2016-12-31T23:59:60Z"),
            parse_rfc3339("2017-01-01T00:00:00Z")
        );
    }

    #[test]
    fn impossible_dates_and_malformed_text_are_refused() {
        for bad in [
            "2021-02-31T00:00:00Z",
            "2021-02-29T00:00:00Z",
            "1900-02-29T00:00:00Z",
            "2021-04-31T00:00:00Z",
            "2021-00-10T00:00:00Z",
            "2021-13-01T00:00:00Z",
            "2021-01-00T00:00:00Z",
            "2021-01-01T24:00:00Z",
            "2021-01-01T00:60:00Z",
            "2021-01-01T00:00:61Z",
            "2021-01-01T00:00:00+24:00",
            "2021-01-01T00:00:00+01:60",
            "2021-01-01T00:00:00",
            "2021-01-01T00:00:00.Z",
            "2021-01-01 00:00:00Z",
            "2021-01-01T00:00:00+0100",
            "2021-01-01T00:00:00Zx",
            "+021-01-01T00:00:00Z",
            "1969-12-31T23:59:59Z",
            "tomorrow",
            "",
        ] {
            assert!(parse_rfc3339(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_rfc3339("2021-02-31T00:00:00Z")
                .map_err(|e| e.to_string())
                .unwrap_err(),
            "the day does not exist in that month"
        );
    }
}
