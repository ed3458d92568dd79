//! The Durable Streams wire format (PROTOCOL.md), with no I/O: the bodies
//! of reads (5.6), the SSE `data` and `control` events of a live read
//! (5.8), the JSON-mode split of an append's body (9.1) and the
//! `Stream-TTL` header (5.1). The server's Durable Streams room
//! (`transport/ds`) writes these; every SSE line goes through gapless's one
//! line rule ([`crate::sse::DataLines`]).

use crate::sse::{DataLines, Space};
use crate::Event;
use base64::Engine;
use std::sync::Arc;

/// How a stream's messages go into a `data` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `application/json`: the messages as one JSON array.
    Json,
    /// Other text (`text/*`): the bytes one after another.
    Text,
    /// Any other type: the bytes one after another, in base64.
    Binary,
}

/// The largest integer a Durable Streams header may hold: 2^53-1, the
/// largest a JavaScript number holds exactly (PROTOCOL.md 5.2.1).
pub const MAX_INTEGER: u64 = (1 << 53) - 1;

/// Reads the integer header `name` (`Stream-TTL`, `Producer-Epoch`,
/// `Producer-Seq`, `Stream-Fork-Sub-Offset`): one rule for all of them, the
/// strictest the protocol gives (PROTOCOL.md 5.1, for `Stream-TTL`): a
/// non-negative integer in decimal, without sign, leading zeros, decimal
/// point or exponent, at most [`MAX_INTEGER`]. Surrounding spaces are
/// the header's, not the value's.
///
/// # Errors
/// A message naming the header and the rule.
pub fn parse_int(name: &str, v: &str) -> Result<u64, String> {
    let t = v.trim();
    let ok = !t.is_empty()
        && t.bytes().all(|b| b.is_ascii_digit())
        && !(t.len() > 1 && t.starts_with('0'));
    if !ok {
        return Err(format!(
            "{name} {v:?} must be a non-negative integer in decimal, without sign or leading \
             zeros (e.g. 0 or 42)"
        ));
    }
    match t.parse::<u64>() {
        Ok(n) if n <= MAX_INTEGER => Ok(n),
        _ => Err(format!("{name} {v:?} is above 2^53-1")),
    }
}

/// Reads a `Stream-TTL` value, in seconds ([`parse_int`]).
///
/// # Errors
/// A message saying what is wrong.
pub fn parse_ttl(v: &str) -> Result<u64, String> {
    parse_int("Stream-TTL", v)
}

/// Splits a JSON-mode body into its messages (PROTOCOL.md 9.1): a
/// top-level array gives its elements (one level flattened), anything else
/// is one message. Each message keeps its exact text.
///
/// # Errors
/// A message for a body that is not one valid JSON value, or that nests
/// deeper than [`crate::json::MAX_DEPTH`] (the message names
/// its depth and the limit).
pub fn json_messages(body: &str) -> Result<Vec<String>, String> {
    serde_json::from_str::<serde::de::IgnoredAny>(body)
        .map_err(|e| format!("the body is not valid JSON: {e}"))?;
    crate::json::check_depth(body.as_bytes())?;
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

/// The body of a catch-up or long-poll read of `events` (PROTOCOL.md 5.6):
/// a JSON stream's messages as one array ([`json_element`] each), any other
/// type's bytes one after another.
pub fn body(json: bool, events: &[Arc<Event>]) -> Vec<u8> {
    let mut s = Vec::new();
    if json {
        s.push(b'[');
        for (i, e) in events.iter().enumerate() {
            if i > 0 {
                s.push(b',');
            }
            s.extend_from_slice(&json_element(e.data.as_bytes()));
        }
        s.push(b']');
    } else {
        for e in events {
            s.extend_from_slice(e.data.as_bytes());
        }
    }
    s
}

/// One event as one element of a JSON stream's array: its data as it is
/// when it is exactly one JSON value (every append over Durable Streams:
/// JSON mode checks and splits them), else its text as a JSON string (an
/// event published over gapless's own API into the stream's channel, with
/// data such as `5,6` or `7]` that would forge or break the array's
/// message boundaries; bytes that are not UTF-8 lossily). See
/// docs/durable-streams.md, "JSON mode".
pub fn json_element(data: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if serde_json::from_slice::<serde::de::IgnoredAny>(data).is_ok() {
        return std::borrow::Cow::Borrowed(data);
    }
    let text = String::from_utf8_lossy(data);
    std::borrow::Cow::Owned(serde_json::to_vec(&text).unwrap_or_else(|_| b"\"\"".to_vec()))
}

/// One SSE `data` event holding `events` in `shape` (see [`Shape`]). Text
/// goes one `data:` line per line, a line ending at CRLF, CR or LF (as SSE
/// reads them, also across two messages), so no text can end the event or
/// start another (a lone CR comes back as LF). `data:` is followed directly
/// by the line (as the protocol's reference server and conformance suite
/// have it), except before a line that begins with a space: there one space
/// more, which SSE readers drop, so the line keeps its own. The lines are
/// written by gapless's one SSE line rule ([`DataLines`],
/// [`Space::WhenNeeded`]). A text stream's
/// messages are UTF-8 (appends are checked; one published as bytes over
/// gapless's own API is read lossily).
pub fn data_event(shape: Shape, events: &[Arc<Event>]) -> Vec<u8> {
    let size: usize = events.iter().map(|e| e.data.len() + 1).sum();
    let mut out = Vec::with_capacity(24 + size + size / 3);
    out.extend_from_slice(b"event: data\n");
    match shape {
        Shape::Binary => {
            let mut body = Vec::with_capacity(size);
            for e in events {
                body.extend_from_slice(e.data.as_bytes());
            }
            out.extend_from_slice(b"data:");
            let text = base64::engine::general_purpose::STANDARD.encode(&body);
            out.extend_from_slice(text.as_bytes());
            out.push(b'\n');
        }
        Shape::Json | Shape::Text => {
            let mut lines = DataLines::new(&mut out, Space::WhenNeeded);
            let json = shape == Shape::Json;
            if json {
                lines.push(b"[");
            }
            for (i, e) in events.iter().enumerate() {
                if json && i > 0 {
                    lines.push(b",");
                }
                let bytes = e.data.as_bytes();
                if json {
                    lines.push(&json_element(bytes));
                } else {
                    match std::str::from_utf8(bytes) {
                        Ok(_) => lines.push(bytes),
                        Err(_) => lines.push(String::from_utf8_lossy(bytes).as_bytes()),
                    }
                }
            }
            if json {
                lines.push(b"]");
            }
            lines.finish();
        }
    }
    // The blank line that ends the event.
    out.push(b'\n');
    out
}

/// One SSE `control` event: `streamNextOffset` `next`, `streamCursor` when
/// given (a string of its digits), `upToDate` when `up`, `streamClosed` when
/// `closed`. Offsets are hex digits, `_` and digits only, so they need no
/// JSON escaping.
pub fn control_event(next: &str, cursor: Option<u64>, up: bool, closed: bool) -> Vec<u8> {
    use std::io::Write;
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(b"event: control\ndata:{\"streamNextOffset\":\"");
    out.extend_from_slice(next.as_bytes());
    out.push(b'"');
    if let Some(c) = cursor {
        let _ = write!(out, ",\"streamCursor\":\"{c}\"");
    }
    if up {
        out.extend_from_slice(b",\"upToDate\":true");
    }
    if closed {
        out.extend_from_slice(b",\"streamClosed\":true");
    }
    out.extend_from_slice(b"}\n\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Payload;

    fn ev(seq: u64, data: Payload) -> Arc<Event> {
        Arc::new(Event::new(
            Arc::from("c"),
            crate::Epoch(1),
            seq,
            None,
            data,
            0,
        ))
    }

    fn text(data: &[&str]) -> Vec<Arc<Event>> {
        data.iter()
            .enumerate()
            .map(|(i, d)| ev(i as u64 + 1, Payload::Text((*d).to_owned())))
            .collect()
    }

    #[test]
    fn a_data_event_holds_every_message_in_the_streams_shape() {
        let json = data_event(Shape::Json, &text(&["1", "{\"a\":\n 2}"]));
        assert_eq!(
            String::from_utf8(json).expect("UTF-8"),
            "event: data\ndata:[1,{\"a\":\ndata:  2}]\n\n"
        );
        let lines = data_event(Shape::Text, &text(&["a\r", "\nb\r\r", "c\n"]));
        assert_eq!(
            String::from_utf8(lines).expect("UTF-8"),
            "event: data\ndata:a\ndata:b\ndata:\ndata:c\ndata:\n\n",
            "CRLF across two messages is one break; a lone CR is a break"
        );
        let spaced = data_event(Shape::Text, &text(&[" a\n", "  b", "c d"]));
        assert_eq!(
            String::from_utf8(spaced).expect("UTF-8"),
            "event: data\ndata:  a\ndata:   bc d\n\n",
            "a line that begins with a space gets one more, which readers drop"
        );
        let bin = data_event(
            Shape::Binary,
            &[
                ev(1, Payload::Binary(vec![0, 255])),
                ev(2, Payload::Binary(vec![7])),
            ],
        );
        assert_eq!(
            String::from_utf8(bin).expect("UTF-8"),
            "event: data\ndata:AP8H\n\n"
        );
    }

    #[test]
    fn a_control_event_is_json_with_what_applies() {
        let c = control_event("0a_00000000000000000003", Some(42), true, false);
        let c = String::from_utf8(c).expect("UTF-8");
        let data = c
            .strip_prefix("event: control\ndata:")
            .and_then(|d| d.strip_suffix("\n\n"))
            .expect("one control event");
        let v: serde_json::Value = serde_json::from_str(data).expect("JSON");
        assert_eq!(
            v,
            serde_json::json!({"streamNextOffset": "0a_00000000000000000003",
                "streamCursor": "42", "upToDate": true})
        );
        let c = control_event("x", None, true, true);
        let v: serde_json::Value = serde_json::from_str(
            std::str::from_utf8(&c).expect("UTF-8")["event: control\ndata:".len()..].trim(),
        )
        .expect("JSON");
        assert_eq!(
            v,
            serde_json::json!({"streamNextOffset": "x", "upToDate": true, "streamClosed": true})
        );
    }

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
        for bad in ["", "+1", "01", "1.0", "1e3", "-1", "x", "9007199254740992"] {
            assert!(parse_ttl(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_int("Producer-Seq", "9007199254740991"),
            Ok(MAX_INTEGER)
        );
        let m = parse_int("Producer-Seq", "01").err().unwrap_or_default();
        assert!(
            m.contains("Producer-Seq") && m.contains("leading zeros"),
            "{m}"
        );
    }
}
