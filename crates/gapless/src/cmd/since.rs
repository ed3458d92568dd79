//! The `--since` flag of `gapless tail` and `gapless history`: `live`,
//! `earliest`, `last:N`, `time:UNIX_MS`, `time:` followed by an RFC 3339 time
//! (`time:2025-01-31T12:00:00Z`, `time:2025-01-31T13:00:00.250+01:00`), or a
//! cursor printed by `--json` (resume after it).

use gapless_client::{Cursor, Start};
use gapless_protocol::since::{Since, MAX_TIME_MS};

/// What `--since` accepts, for error messages.
pub const FORMS: &str = "live, earliest, last:N (1 to 1000), time:UNIX_MS, time:RFC3339 \
                         (e.g. time:2025-01-31T12:00:00Z) or a cursor printed by --json";

/// Reads a `--since` value.
///
/// # Errors
/// One line saying what is wrong and what is accepted.
pub fn parse(text: &str) -> Result<Start, String> {
    let rfc3339 = text
        .strip_prefix("time:")
        .filter(|t| !t.is_empty() && !t.bytes().all(|b| b.is_ascii_digit() || b == b'-'));
    let since = match (text, rfc3339) {
        (_, Some(t)) => {
            let ms = rfc3339_ms(t).map_err(|why| {
                format!(
                    "--since {text}: {why}; a time is time:UNIX_MS or time:RFC3339, \
                     e.g. time:2025-01-31T12:00:00Z"
                )
            })?;
            if ms > MAX_TIME_MS {
                return Err(format!("--since {text}: the time is after the year 2286"));
            }
            Since::Time(ms)
        }
        _ if text.starts_with("last:") || text.starts_with("time:") => {
            Since::parse(text).map_err(|e| format!("--since {text}: {e}"))?
        }
        ("live", _) => Since::Live,
        ("earliest", _) => Since::Earliest,
        ("", _) => return Err(format!("--since is empty: give {FORMS}")),
        (cursor, _) => return Ok(Start::After(Cursor::from(cursor))),
    };
    Ok(match since {
        Since::Live => Start::Live,
        Since::Earliest => Start::Earliest,
        Since::Last(n) => Start::Last(n),
        Since::Time(t) => Start::Time(t),
    })
}

/// An RFC 3339 date and time (`YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`;
/// `t` or a space may stand for `T`, `z` for `Z`) as milliseconds since the
/// Unix epoch; digits of the fraction past milliseconds are dropped, and a
/// leap second (`:60`) counts as the second before it.
///
/// # Errors
/// What is wrong with it.
pub fn rfc3339_ms(s: &str) -> Result<u64, String> {
    let b = s.as_bytes();
    let num = |from: usize, len: usize| -> Result<i64, String> {
        let part = b
            .get(from..from + len)
            .filter(|p| p.iter().all(u8::is_ascii_digit))
            .ok_or_else(|| format!("{s:?} is not an RFC 3339 time"))?;
        Ok(part.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0')))
    };
    let sep = |at: usize, ok: &[u8]| -> Result<(), String> {
        match b.get(at) {
            Some(c) if ok.contains(c) => Ok(()),
            _ => Err(format!("{s:?} is not an RFC 3339 time")),
        }
    };
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    sep(4, b"-")?;
    sep(7, b"-")?;
    sep(10, b"Tt ")?;
    let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    sep(13, b":")?;
    sep(16, b":")?;
    let mut at = 19;
    let mut ms = 0i64;
    if b.get(at) == Some(&b'.') {
        let digits = b[at + 1..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if digits == 0 {
            return Err(format!("{s:?}: a fraction of a second needs digits"));
        }
        for k in 0..3 {
            ms = ms * 10 + if k < digits { num(at + 1 + k, 1)? } else { 0 };
        }
        at += 1 + digits;
    }
    let offset_min = match b.get(at) {
        Some(b'Z' | b'z') if at + 1 == b.len() => 0,
        Some(sign @ (b'+' | b'-')) if at + 6 == b.len() => {
            sep(at + 3, b":")?;
            let (h, m) = (num(at + 1, 2)?, num(at + 4, 2)?);
            if h > 23 || m > 59 {
                return Err(format!("{s:?}: the offset is out of range"));
            }
            let off = h * 60 + m;
            if *sign == b'-' {
                -off
            } else {
                off
            }
        }
        _ => {
            return Err(format!(
                "{s:?} needs a time zone: Z or an offset such as +01:00"
            ))
        }
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    let days_in = usize::try_from(month - 1)
        .ok()
        .and_then(|m| month_days.get(m))
        .copied();
    match days_in {
        Some(n) if (1..=n).contains(&day) => {}
        _ => return Err(format!("{s:?}: no such date")),
    }
    if hour > 23 || minute > 59 || second > 60 {
        return Err(format!("{s:?}: no such time of day"));
    }
    // Days since 1970-01-01 (Howard Hinnant's days_from_civil).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second.min(59) - offset_min * 60;
    let total = secs * 1000 + ms;
    u64::try_from(total).map_err(|_| format!("{s:?} is before 1970-01-01T00:00:00Z"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times() {
        let ok = [
            ("1970-01-01T00:00:00Z", 0),
            ("1970-01-01T00:00:01.5Z", 1500),
            ("2025-01-31T12:00:00Z", 1_738_324_800_000),
            ("2025-01-31T13:00:00.250+01:00", 1_738_324_800_250),
            ("2025-01-31t07:30:00.123456-04:30", 1_738_324_800_123),
            ("2025-01-31 12:00:00z", 1_738_324_800_000),
            ("2024-02-29T00:00:00Z", 1_709_164_800_000),
            ("2000-03-01T00:00:00Z", 951_868_800_000),
            ("2016-12-31T23:59:60Z", 1_483_228_799_000),
        ];
        for (text, want) in ok {
            assert_eq!(rfc3339_ms(text), Ok(want), "{text}");
        }
        for bad in [
            "",
            "2025-01-31",
            "2025-01-31T12:00:00",
            "2025-01-31T12:00Z",
            "2025-13-01T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2025-01-32T00:00:00Z",
            "2025-01-31T24:00:00Z",
            "2025-01-31T12:00:00.Z",
            "2025-01-31T12:00:00+1:00",
            "2025-01-31T12:00:00+01:00x",
            "1969-12-31T23:59:59Z",
            "yesterday",
        ] {
            assert!(rfc3339_ms(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn since_values() {
        let ok = [
            ("live", Start::Live),
            ("earliest", Start::Earliest),
            ("last:10", Start::Last(10)),
            ("time:1738324800000", Start::Time(1_738_324_800_000)),
            ("time:2025-01-31T12:00:00Z", Start::Time(1_738_324_800_000)),
            ("AQEm", Start::After(Cursor::from("AQEm"))),
        ];
        for (text, want) in ok {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
        for bad in [
            "",
            "last:0",
            "last:1001",
            "last:x",
            "time:",
            "time:-1",
            "time:soon",
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(e.contains("since"), "{bad}: {e}");
        }
    }
}
