//! Rules on JSON bodies that go beyond "is one JSON value": how deep they
//! may nest.
//!
//! A body stored as JSON is parsed again by every reader, and readers bound
//! how deep they go: Python's `json` module by its recursion limit (about
//! 1000 levels, less inside a client's own frames), serde_json by 128 unless
//! told otherwise, browsers each by their own. A stream holding a deeper
//! value is unreadable to them, so a JSON body nested deeper than
//! [`MAX_DEPTH`] is refused before it is stored (the Durable Streams room's
//! JSON mode: 400 `invalid_json`).

/// The deepest nesting a JSON body may have: arrays and objects inside each
/// other, the outermost counting 1 (`[]` is 1 deep, `[[1]]` 2, a scalar 0).
/// serde_json's default recursion limit, which readers built on it apply too.
pub const MAX_DEPTH: usize = 128;

/// How deeply `text` nests arrays and objects (see [`MAX_DEPTH`] for the
/// count). Brackets inside strings do not count. Linear, no recursion, and
/// meant for text already known to be JSON (for other text it counts the
/// brackets outside strings all the same).
pub fn depth(text: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_str, mut esc) = (false, false);
    for &c in text {
        if in_str {
            match c {
                _ if esc => esc = false,
                b'\\' => esc = true,
                b'"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Refuses `text` when it nests deeper than [`MAX_DEPTH`].
///
/// # Errors
/// A message naming the body's depth and the limit.
pub fn check_depth(text: &[u8]) -> Result<(), String> {
    let d = depth(text);
    if d > MAX_DEPTH {
        return Err(format!(
            "the body nests arrays and objects {d} levels deep; the limit is {MAX_DEPTH}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_brackets_outside_strings() {
        assert_eq!(depth(b"1"), 0);
        assert_eq!(depth(b"[]"), 1);
        assert_eq!(depth(br#"[{"a":[1]},[2]]"#), 3);
        assert_eq!(depth(br#"["[[[[", "\"[[", {"k]":"}"}]"#), 2);
    }

    #[test]
    fn a_body_deeper_than_the_limit_is_refused_with_both_numbers() {
        let at = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(check_depth(at(MAX_DEPTH).as_bytes()).is_ok());
        let e = check_depth(at(2000).as_bytes()).map_err(|e| e.to_string());
        let msg = e.err().unwrap_or_default();
        assert!(msg.contains("2000") && msg.contains("128"), "{msg}");
        assert!(check_depth(at(MAX_DEPTH + 1).as_bytes()).is_err());
    }
}
