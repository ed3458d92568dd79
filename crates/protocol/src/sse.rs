//! The Server-Sent Events encoder (WHATWG HTML, "Server-sent events",
//! section 9.2.6 "Interpreting an event stream").
//!
//! Rules kept here:
//! - data is split on CR, LF and CRLF into one `data:` line each, so no byte of
//!   data can end a field or an event (the parser treats all three as line ends);
//! - the event type and id are written only from validated names and cursors,
//!   which cannot contain CR or LF;
//! - a leading space of a value is preserved: gapless's streams always write
//!   `": "` (the parser strips exactly one space after the colon), the Durable
//!   Streams room writes `:` and one space more before a line that begins with
//!   one ([`Space`]); both through [`DataLines`];
//! - every SSE response carries [`RESPONSE_HEADERS`].

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

/// How a `data:` line begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    /// `data: ` then the line (gapless's own streams): the one space a
    /// reader drops is always there, so a line's own leading space stays.
    Always,
    /// `data:` directly followed by the line, as the Durable Streams
    /// reference server and conformance suite write it; before a line that
    /// begins with a space, one space more (which readers drop), so the line
    /// keeps its own.
    WhenNeeded,
}

/// Writes text into `data:` lines, in pieces (the messages of one event one
/// after another): every line break (CR, LF, or CRLF, also a CR at the end of
/// one piece and an LF at the start of the next) ends a line, so no text can
/// end a field or the event (WHATWG HTML 9.2.6 reads all three as line
/// ends; a lone CR comes back to the reader as LF). The one copy of the rule:
/// [`write_data`] (gapless's streams) and the Durable Streams room's `data`
/// events use it.
#[derive(Debug)]
pub struct DataLines<'a> {
    out: &'a mut Vec<u8>,
    space: Space,
    /// The last byte written was a CR (an LF right after it is the same break).
    after_cr: bool,
    /// The current line's `data:` is written.
    line_open: bool,
}

impl<'a> DataLines<'a> {
    /// Lines appended to `out`, beginning as `space` says.
    pub fn new(out: &'a mut Vec<u8>, space: Space) -> Self {
        DataLines {
            out,
            space,
            after_cr: false,
            line_open: false,
        }
    }

    /// Writes the current line's `data:` unless written, given its first
    /// byte (`None`: an empty line, or the end).
    fn open(&mut self, first: Option<u8>) {
        if !self.line_open {
            match self.space {
                Space::Always => self.out.extend_from_slice(b"data: "),
                Space::WhenNeeded => {
                    self.out.extend_from_slice(b"data:");
                    if first == Some(b' ') {
                        self.out.push(b' ');
                    }
                }
            }
            self.line_open = true;
        }
    }

    /// Appends `text` to the lines.
    pub fn push(&mut self, text: &[u8]) {
        let mut rest = text;
        if self.after_cr {
            if let Some(r) = rest.strip_prefix(b"\n") {
                rest = r;
            }
            self.after_cr = false;
        }
        while let Some(i) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.open(rest.first().copied().filter(|_| i > 0));
            self.out.extend_from_slice(&rest[..i]);
            self.out.push(b'\n');
            self.line_open = false;
            let cr = rest[i] == b'\r';
            rest = &rest[i + 1..];
            if cr {
                match rest.first() {
                    Some(b'\n') => rest = &rest[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
        }
        if let Some(&first) = rest.first() {
            self.open(Some(first));
            self.out.extend_from_slice(rest);
        }
    }

    /// Ends the last line (an empty one when the text ended with a line
    /// break, or there was none): after it, the caller writes the blank line
    /// that ends the event.
    pub fn finish(mut self) {
        self.open(None);
        self.out.push(b'\n');
    }
}

/// Appends `data: ` lines for `data`, split on CR, LF and CRLF ([`DataLines`]).
pub fn write_data(out: &mut Vec<u8>, data: &str) {
    let mut lines = DataLines::new(out, Space::Always);
    lines.push(data.as_bytes());
    lines.finish();
}

/// The headers of every SSE response gapless writes (its own streams and the
/// Durable Streams room's `live=sse`): `Content-Type: text/event-stream`;
/// `Cache-Control: no-cache, no-transform` (no cache may store it, no proxy
/// may re-encode or compress it, which would hold frames back);
/// `X-Accel-Buffering: no` (nginx passes each frame on at once). Names in
/// lower case, as HTTP/2 sends them.
pub const RESPONSE_HEADERS: [(&str, &str); 3] = [
    ("content-type", "text/event-stream"),
    ("cache-control", "no-cache, no-transform"),
    ("x-accel-buffering", "no"),
];

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

    fn pieces(space: Space, parts: &[&str]) -> String {
        let mut v = Vec::new();
        let mut lines = DataLines::new(&mut v, space);
        for p in parts {
            lines.push(p.as_bytes());
        }
        lines.finish();
        String::from_utf8(v).expect("utf8")
    }

    #[test]
    fn lines_end_the_same_across_pieces_in_both_styles() {
        assert_eq!(
            pieces(Space::Always, &["a\r", "\nb"]),
            "data: a\ndata: b\n",
            "CRLF across two pieces is one break"
        );
        assert_eq!(
            pieces(Space::WhenNeeded, &["a\r", "\nb\r\r", "c\n"]),
            "data:a\ndata:b\ndata:\ndata:c\ndata:\n"
        );
        assert_eq!(
            pieces(Space::WhenNeeded, &[" a\n", "  b", "c d"]),
            "data:  a\ndata:   bc d\n",
            "a line that begins with a space gets one more, which readers drop"
        );
        assert_eq!(pieces(Space::WhenNeeded, &["x"]), "data:x\n");
        assert_eq!(pieces(Space::Always, &[""]), "data: \n");
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
