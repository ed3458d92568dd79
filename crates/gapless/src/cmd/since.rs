//! The `--since` flag of `gapless tail` and `gapless history`: `live`,
//! `earliest`, `last:N`, `time:UNIX_MS`, `time:` followed by an RFC 3339 time
//! (`time:2025-01-31T12:00:00Z`, `time:2025-01-31T13:00:00.250+01:00`), or a
//! cursor printed by `--json` (resume after it).

use gapless_client::{Cursor, Start};
use gapless_protocol::since::Since;

/// What `--since` accepts, for error messages.
pub(crate) const FORMS: &str = "live, earliest, last:N (1 to 1000), time:UNIX_MS, time:RFC3339 \
                         (e.g. time:2025-01-31T12:00:00Z) or a cursor printed by --json";

/// Reads a `--since` value.
///
/// # Errors
/// One line saying what is wrong and what is accepted.
pub(crate) fn parse(text: &str) -> Result<Start, String> {
    let since = match text {
        // One rule for the server and the CLI (`gapless_protocol::since`).
        _ if text.starts_with("last:") || text.starts_with("time:") => {
            Since::parse(text).map_err(|e| format!("--since {text}: {e}"))?
        }
        "live" => Since::Live,
        "earliest" => Since::Earliest,
        "" => return Err(format!("--since is empty: give {FORMS}")),
        cursor => return Ok(Start::After(Cursor::from(cursor))),
    };
    Ok(match since {
        Since::Live => Start::Live,
        Since::Earliest => Start::Earliest,
        Since::Last(n) => Start::Last(n),
        Since::Time(t) => Start::Time(t),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_values() {
        let ok = [
            ("live", Start::Live),
            ("earliest", Start::Earliest),
            ("last:10", Start::Last(10)),
            ("time:1738324800000", Start::Time(1_738_324_800_000)),
            ("time:2025-01-31T12:00:00Z", Start::Time(1_738_324_800_000)),
            (
                "time:2025-01-31T13:00:00.250+01:00",
                Start::Time(1_738_324_800_250),
            ),
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
            "time:2025-02-29T00:00:00Z",
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(e.contains("since"), "{bad}: {e}");
        }
    }
}
