//! The Server-Sent Events encoder (WHATWG HTML, "Server-sent events",
//! section 9.2.6 "Interpreting an event stream").
//!
//! Rules kept here:
//! - data is split on CR, LF and CRLF into one `data:` line each, so no byte of
//!   data can end a field or an event (the parser treats all three as line ends);
//! - the event type and id are written only from validated names and cursors,
//!   which cannot contain CR or LF;
//! - a leading space of a value is preserved because we always write `": "`
//!   (the parser strips exactly one space after the colon).

use bytes::Bytes;

/// How event data appears in a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// `data:` is the event's data as published.
    #[default]
    Plain,
    /// `data:` is JSON `{"channel","seq","type","data","time"}`.
    Envelope,
}

/// Appends `data:` lines for `data`, split on CR, LF and CRLF.
pub fn write_data(out: &mut Vec<u8>, data: &str) {
    let bytes = data.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\r' | b'\n' => {
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(&bytes[start..i]);
                out.push(b'\n');
                if bytes[i] == b'\r' && bytes.get(i + 1) == Some(&b'\n') {
                    i += 1;
                }
                i += 1;
                start = i;
            }
            _ => i += 1,
        }
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(&bytes[start..]);
    out.push(b'\n');
}

/// Appends a whole event without an id: optional `event:` line, `data:` lines, blank line.
pub fn write_event(out: &mut Vec<u8>, event_type: Option<&str>, data: &str) {
    if let Some(t) = event_type {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(t.as_bytes());
        out.push(b'\n');
    }
    write_data(out, data);
    out.push(b'\n');
}

/// Appends a whole event whose data is bytes, given in its wire `encoding`
/// (base64, which has no CR or LF): optional `event:` line, an
/// `encoding: <name>` line, one `data:` line, blank line. A conforming
/// EventSource ignores the `encoding` field (WHATWG HTML 9.2.6: an unknown
/// field is ignored); gapless's SDKs read it (docs/api.md, "Binary data").
pub fn write_encoded_event(
    out: &mut Vec<u8>,
    event_type: Option<&str>,
    encoding: crate::event::Encoding,
    data: &str,
) {
    if let Some(t) = event_type {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(t.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"encoding: ");
    out.extend_from_slice(encoding.as_str().as_bytes());
    out.push(b'\n');
    write_data(out, data);
    out.push(b'\n');
}

/// Appends an `id:` line.
pub fn write_id(out: &mut Vec<u8>, cursor: &str) {
    out.extend_from_slice(b"id: ");
    out.extend_from_slice(cursor.as_bytes());
    out.push(b'\n');
}

/// A frame that only sets the client's last event ID (no event fires: the
/// data buffer is empty at dispatch).
pub fn id_frame(cursor: &str) -> Bytes {
    let mut out = Vec::with_capacity(cursor.len() + 6);
    write_id(&mut out, cursor);
    out.push(b'\n');
    Bytes::from(out)
}

/// An `id:` line alone, to precede a shared body in multi-channel streams.
pub fn id_line(cursor: &str) -> Bytes {
    let mut out = Vec::with_capacity(cursor.len() + 5);
    write_id(&mut out, cursor);
    Bytes::from(out)
}

/// The `retry:` field, in milliseconds.
pub fn retry_frame(retry_ms: u64) -> Bytes {
    Bytes::from(format!("retry: {retry_ms}\n\n"))
}

/// The heartbeat: one comment line, which the client ignores.
pub const HEARTBEAT: &[u8] = b":\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(data: &str) -> String {
        let mut v = Vec::new();
        write_event(&mut v, None, data);
        String::from_utf8(v).expect("utf8")
    }

    #[test]
    fn splits_every_line_end() {
        assert_eq!(enc("a"), "data: a\n\n");
        assert_eq!(enc(""), "data: \n\n");
        assert_eq!(enc("a\nb"), "data: a\ndata: b\n\n");
        assert_eq!(enc("a\rb"), "data: a\ndata: b\n\n");
        assert_eq!(enc("a\r\nb"), "data: a\ndata: b\n\n");
        assert_eq!(enc("a\n\nb"), "data: a\ndata: \ndata: b\n\n");
        assert_eq!(enc("a\r\r\nb\n"), "data: a\ndata: \ndata: b\ndata: \n\n");
        assert_eq!(enc(" lead"), "data:  lead\n\n");
    }

    #[test]
    fn injection_stays_inside_data() {
        let out = enc("x\n\nid: evil\nevent: gap\r\ndata: y");
        // every line is a data line or the terminator
        for line in out.split('\n').filter(|l| !l.is_empty()) {
            assert!(line.starts_with("data: "), "{line:?}");
        }
        assert!(out.ends_with("\n\n"));
        assert_eq!(out.matches("\n\n").count(), 1, "{out:?}");
    }
}
