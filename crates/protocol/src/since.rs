//! `since`: where a subscription or a history page without a cursor starts,
//! as it travels (the SSE and history query parameter `since=`, the
//! WebSocket subscribe's `"since"`): `live`, `earliest`, `last:N`,
//! `time:UNIX_MS` or `time:` and an RFC 3339 time (`crate::time`). What each one delivers is the server's rule
//! (`gapless_server::ops::start`, docs/api.md "Where a stream starts");
//! this module only reads and writes the values, and gives their schema.

use std::borrow::Cow;
use std::fmt;
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

/// Most events `last:N` asks for.
pub const MAX_LAST: u64 = 1000;

/// Latest time `time:UNIX_MS` takes: 9999999999999 ms (13 digits, the year
/// 2286). A time in microseconds or nanoseconds (16 digits and more today)
/// is refused rather than read as a time far in the future.
pub const MAX_TIME_MS: u64 = 9_999_999_999_999;

/// A `since` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Since {
    /// `live`: only events published from now on (the default).
    #[default]
    Live,
    /// `earliest`: every retained event, then live.
    Earliest,
    /// `last:N`: the last N retained events (1 to [`MAX_LAST`]), then live.
    Last(u64),
    /// `time:UNIX_MS`: from the first retained event whose time (commit
    /// time, Unix ms) is at or after this one (0 to [`MAX_TIME_MS`]), then live.
    Time(u64),
}

/// Why a `since` value was refused (its `Display` says what is accepted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinceError {
    /// Not one of the four forms.
    Unknown,
    /// `last:` without a whole number from 1 to [`MAX_LAST`].
    Last,
    /// `time:` without a whole number from 0 to [`MAX_TIME_MS`].
    Time,
    /// `time:` with a text that is not an RFC 3339 time from 1970 to
    /// [`MAX_TIME_MS`] (the reason, from `crate::time`).
    Rfc3339(&'static str),
}

impl fmt::Display for SinceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SinceError::Unknown => write!(
                f,
                "since must be live, earliest, last:N (N from 1 to {MAX_LAST}), time:UNIX_MS \
                 or time:RFC3339 (e.g. time:2025-01-31T12:00:00Z)"
            ),
            SinceError::Last => write!(
                f,
                "last:N takes a whole number of events N from 1 to {MAX_LAST}"
            ),
            SinceError::Time => write!(
                f,
                "time:UNIX_MS takes a whole number of milliseconds since 1970-01-01 UTC, \
                 from 0 to {MAX_TIME_MS}, or time:RFC3339 a time such as \
                 time:2025-01-31T12:00:00Z or time:2025-01-31T13:00:00.250+01:00"
            ),
            SinceError::Rfc3339(why) => write!(
                f,
                "time: takes milliseconds since 1970 or an RFC 3339 time (e.g. \
                 time:2025-01-31T12:00:00Z): {why}"
            ),
        }
    }
}

impl std::error::Error for SinceError {}

/// Plain decimal digits (no sign, no space; leading zeros allowed) as a u64.
fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

impl Since {
    /// Reads a value: `live`, `earliest`, `last:N`, `time:UNIX_MS` (numbers
    /// in plain decimal digits, leading zeros allowed), or `time:` and an
    /// RFC 3339 time read strictly (`crate::time::parse_rfc3339`: `Z` or an
    /// offset, an optional fraction of which milliseconds count).
    ///
    /// # Errors
    /// [`SinceError`] for anything else, or a number out of its range.
    pub fn parse(s: &str) -> Result<Since, SinceError> {
        if let Some(n) = s.strip_prefix("last:") {
            return match digits(n) {
                Some(n) if (1..=MAX_LAST).contains(&n) => Ok(Since::Last(n)),
                _ => Err(SinceError::Last),
            };
        }
        if let Some(t) = s.strip_prefix("time:") {
            // RFC 3339 begins with four digits and `-`; a number never has one.
            if t.len() > 4
                && t.as_bytes()[..4].iter().all(u8::is_ascii_digit)
                && t.as_bytes()[4] == b'-'
            {
                return match crate::time::parse_rfc3339(t) {
                    Ok(ms) if ms <= MAX_TIME_MS => Ok(Since::Time(ms)),
                    Ok(_) => Err(SinceError::Rfc3339("the time is after the year 2286")),
                    Err(e) => Err(SinceError::Rfc3339(e.reason())),
                };
            }
            return match digits(t) {
                Some(t) if t <= MAX_TIME_MS => Ok(Since::Time(t)),
                _ => Err(SinceError::Time),
            };
        }
        match s {
            "live" => Ok(Since::Live),
            "earliest" => Ok(Since::Earliest),
            _ => Err(SinceError::Unknown),
        }
    }
}

impl std::str::FromStr for Since {
    type Err = SinceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Since::parse(s)
    }
}

/// The value as sent: `live`, `earliest`, `last:N`, `time:UNIX_MS`.
impl fmt::Display for Since {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Since::Live => f.write_str("live"),
            Since::Earliest => f.write_str("earliest"),
            Since::Last(n) => write!(f, "last:{n}"),
            Since::Time(t) => write!(f, "time:{t}"),
        }
    }
}

/// The pattern of a `since` value: exactly what [`Since::parse`] accepts
/// (for [`MAX_LAST`] 1000 and [`MAX_TIME_MS`] of 13 digits; a unit test
/// holds the two together).
pub const SINCE_PATTERN: &str =
    "^(live|earliest|last:0*([1-9][0-9]{0,2}|1000)|time:0*[0-9]{1,13})$";

impl PartialSchema for Since {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(format!(
                "Where to start without a cursor: `live` (the default) only events published from \
             now on; `earliest` every retained event, then live; `last:N` the last N retained \
             events (N from 1 to {MAX_LAST}; fewer when fewer are retained), then live; \
             `time:UNIX_MS` the first retained event whose `time` is at or after UNIX_MS \
             (milliseconds since 1970, 0 to {MAX_TIME_MS}; `time:RFC3339`, e.g. \
             `time:2025-01-31T12:00:00Z`, is the same time written in RFC 3339, which the \
             pattern leaves out), then live (none: live only; when \
             an event no longer retained may be at or after it: from the floor, after a gap \
             notice of reason `evicted` naming the evicted seqs). A cursor wins over `since`. \
             Any other value is refused with 400 `invalid_request` naming it."
            )))
            .pattern(Some(SINCE_PATTERN))
            .examples(["earliest", "last:10", "time:1764442800000"])
            .into()
    }
}

impl ToSchema for Since {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Since")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_and_write_back() {
        let ok = [
            ("live", Since::Live),
            ("earliest", Since::Earliest),
            ("last:1", Since::Last(1)),
            ("last:1000", Since::Last(1000)),
            ("time:0", Since::Time(0)),
            ("time:1764442800123", Since::Time(1_764_442_800_123)),
            ("time:9999999999999", Since::Time(MAX_TIME_MS)),
        ];
        for (text, want) in ok {
            assert_eq!(Since::parse(text), Ok(want), "{text}");
            assert_eq!(want.to_string(), text);
        }
        assert_eq!(Since::parse("last:0010"), Ok(Since::Last(10)));
        assert_eq!(Since::parse("time:007"), Ok(Since::Time(7)));
        let bad = [
            ("", SinceError::Unknown),
            ("Live", SinceError::Unknown),
            ("latest", SinceError::Unknown),
            ("last", SinceError::Unknown),
            ("time", SinceError::Unknown),
            ("last:", SinceError::Last),
            ("last:0", SinceError::Last),
            ("last:1001", SinceError::Last),
            ("last:x", SinceError::Last),
            ("last:+5", SinceError::Last),
            ("last:-1", SinceError::Last),
            ("last: 5", SinceError::Last),
            ("last:99999999999999999999999", SinceError::Last),
            ("time:", SinceError::Time),
            ("time:-1", SinceError::Time),
            ("time:+1", SinceError::Time),
            ("time:1.5", SinceError::Time),
            ("time:10000000000000", SinceError::Time),
            ("time:1764442800123000", SinceError::Time),
            (
                "time:2025-02-29T00:00:00Z",
                SinceError::Rfc3339("the day does not exist in that month"),
            ),
        ];
        for (text, want) in bad {
            assert_eq!(Since::parse(text), Err(want), "{text:?}");
        }
    }

    /// `time:` takes RFC 3339 as the CLI's `--since` does (issue 29).
    #[test]
    fn time_takes_rfc3339() {
        for (text, ms) in [
            ("time:2025-01-31T12:00:00Z", 1_738_324_800_000),
            ("time:2025-01-31T13:00:00.250+01:00", 1_738_324_800_250),
            ("time:2025-01-31t07:30:00.123456-04:30", 1_738_324_800_123),
            ("time:1970-01-01T00:00:00Z", 0),
        ] {
            assert_eq!(Since::parse(text), Ok(Since::Time(ms)), "{text}");
        }
        for bad in [
            "time:2025-01-31T12:00:00",
            "time:1969-12-31T23:59:59Z",
            "time:2300-01-01T00:00:00Z",
        ] {
            let e = Since::parse(bad).expect_err(bad);
            assert!(matches!(e, SinceError::Rfc3339(_)), "{bad}: {e:?}");
            assert!(e.to_string().contains("RFC 3339"), "{e}");
        }
    }

    /// The pattern is written for these limits.
    #[test]
    fn the_pattern_fits_the_limits() {
        assert_eq!(MAX_LAST, 1000);
        assert!(SINCE_PATTERN.contains("|1000)"));
        assert_eq!(MAX_TIME_MS.to_string(), "9".repeat(13));
        assert!(SINCE_PATTERN.contains("time:0*[0-9]{1,13})"));
    }
}
