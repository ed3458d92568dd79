//! The Durable Streams header values of a stream's metadata (PROTOCOL.md
//! 5.1) and the JSON-mode split of an append's body (9.1). The streams
//! themselves (their cache, layout and lifecycle) are the product's:
//! `crate::ops::streams`, re-exported here.

pub use crate::ops::streams::*;

/// Reads a `Stream-TTL` value: a non-negative decimal integer without sign
/// or leading zeros (PROTOCOL.md 5.1).
///
/// # Errors
/// A message saying what is wrong.
pub fn parse_ttl(v: &str) -> Result<u64, String> {
    let ok = !v.is_empty()
        && v.bytes().all(|b| b.is_ascii_digit())
        && !(v.len() > 1 && v.starts_with('0'));
    if !ok {
        return Err(format!(
            "Stream-TTL {v:?} must be whole seconds in decimal, without sign or leading zeros"
        ));
    }
    v.parse::<u64>()
        .map_err(|_| format!("Stream-TTL {v:?} is too large"))
}

/// Reads an RFC 3339 timestamp (`2026-01-02T03:04:05Z`, optional fraction,
/// `Z` or `±HH:MM`) into Unix milliseconds.
///
/// # Errors
/// A message naming the expected shape.
pub fn parse_rfc3339(v: &str) -> Result<u64, String> {
    let bad = || {
        format!("Stream-Expires-At {v:?} is not an RFC 3339 timestamp (e.g. 2030-01-02T03:04:05Z)")
    };
    let b = v.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        let s = v.get(r).ok_or_else(bad)?;
        if !s.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse::<i64>().map_err(|_| bad())
    };
    let (y, mo, d, h, mi, s) = (
        num(0..4)?,
        num(5..7)?,
        num(8..10)?,
        num(11..13)?,
        num(14..16)?,
        num(17..19)?,
    );
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return Err(bad());
    }
    let mut i = 19;
    let mut ms = 0i64;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while b.get(i).is_some_and(|c| c.is_ascii_digit()) {
            i += 1;
        }
        if i == start {
            return Err(bad());
        }
        let frac = &v[start..i.min(start + 3)];
        ms = frac.parse::<i64>().map_err(|_| bad())? * 10i64.pow(3 - frac.len() as u32);
    }
    let tz = &v[i..];
    let offset_s = match tz {
        "Z" | "z" => 0,
        _ => {
            let t = tz.as_bytes();
            if t.len() != 6 || !matches!(t[0], b'+' | b'-') || t[3] != b':' {
                return Err(bad());
            }
            let oh = num(i + 1..i + 3)?;
            let om = num(i + 4..i + 6)?;
            let o = oh * 3600 + om * 60;
            if t[0] == b'-' {
                -o
            } else {
                o
            }
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let yy = if mo <= 2 { y - 1 } else { y };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + s - offset_s;
    u64::try_from(secs * 1000 + ms).map_err(|_| bad())
}

/// Splits a JSON-mode body into its messages (PROTOCOL.md 9.1): a
/// top-level array gives its elements (one level flattened), anything else
/// is one message. Each message keeps its exact text.
///
/// # Errors
/// A message for a body that is not one valid JSON value.
pub fn json_messages(body: &str) -> Result<Vec<String>, String> {
    serde_json::from_str::<serde::de::IgnoredAny>(body)
        .map_err(|e| format!("the body is not valid JSON: {e}"))?;
    let t = body.trim_matches(|c: char| matches!(c, ' ' | '\t' | '\n' | '\r'));
    if !t.starts_with('[') {
        return Ok(vec![t.to_owned()]);
    }
    let inner = &t[1..t.len() - 1];
    let mut out = Vec::new();
    let (mut depth, mut in_str, mut esc, mut start) = (0usize, false, false, 0usize);
    for (i, c) in inner.char_indices() {
        if in_str {
            match c {
                _ if esc => esc = false,
                '\\' => esc = true,
                '"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '[' | '{' => depth += 1,
            ']' | '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(inner[start..i].trim().to_owned());
                start = i + 1;
            }
            _ => {}
        }
    }
    let last = inner[start..].trim();
    if !last.is_empty() || !out.is_empty() {
        out.push(last.to_owned());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_bodies_flatten_one_level_and_keep_their_text() {
        assert_eq!(
            json_messages(r#"{"a": 1}"#).unwrap_or_default(),
            vec![r#"{"a": 1}"#]
        );
        assert_eq!(
            json_messages(r#" [ {"a":"x,]"} , [1,2], "s\"," ] "#).unwrap_or_default(),
            vec![r#"{"a":"x,]"}"#, "[1,2]", r#""s\",""#]
        );
        assert_eq!(json_messages("[[[1]]]").unwrap_or_default(), vec!["[[1]]"]);
        assert!(json_messages("[]").unwrap_or_default().is_empty());
        assert!(json_messages("[1,").is_err());
        assert!(json_messages("").is_err());
    }

    #[test]
    fn ttl_and_expiry_are_read_strictly() {
        assert_eq!(parse_ttl("3600"), Ok(3600));
        assert_eq!(parse_ttl("0"), Ok(0));
        for bad in ["", "+1", "01", "1.0", "1e3", "-1", "x"] {
            assert!(parse_ttl(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_rfc3339("1970-01-01T00:00:01Z"), Ok(1000));
        assert_eq!(
            parse_rfc3339("2000-03-01T00:00:00.5+01:00"),
            Ok(951_865_200_500)
        );
        assert!(parse_rfc3339("2000-13-01T00:00:00Z").is_err());
        assert!(parse_rfc3339("tomorrow").is_err());
    }
}
