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

/// Splits a JSON-mode body into its messages (PROTOCOL.md 9.1): a
/// top-level array gives its elements (one level flattened), anything else
/// is one message. Each message keeps its exact text.
///
/// # Errors
/// A message for a body that is not one valid JSON value, or that nests
/// deeper than [`gapless_protocol::json::MAX_DEPTH`] (the message names
/// its depth and the limit).
pub fn json_messages(body: &str) -> Result<Vec<String>, String> {
    serde_json::from_str::<serde::de::IgnoredAny>(body)
        .map_err(|e| format!("the body is not valid JSON: {e}"))?;
    gapless_protocol::json::check_depth(body.as_bytes())?;
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
        // Nested deeper than the limit: refused, naming the depth and the limit.
        let deep = format!("{}{}", "[".repeat(2000), "]".repeat(2000));
        let m = json_messages(&deep).err().unwrap_or_default();
        assert!(m.contains("2000") && m.contains("128"), "{m:?}");
        let ok = format!("{}{}", "[".repeat(128), "]".repeat(128));
        assert!(json_messages(&ok).is_ok());
    }

    #[test]
    fn ttls_are_read_strictly() {
        assert_eq!(parse_ttl("3600"), Ok(3600));
        assert_eq!(parse_ttl("0"), Ok(0));
        for bad in ["", "+1", "01", "1.0", "1e3", "-1", "x"] {
            assert!(parse_ttl(bad).is_err(), "{bad:?}");
        }
    }
}
