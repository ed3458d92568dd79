//! The event data the harness publishes, and reads back on the subscriber
//! side, whatever the server: `SEQ:MICROS:` padded with `x` to the requested
//! size, where SEQ is the event's number in its channel (from 1) and MICROS the
//! publish time (Unix microseconds, taken just before the request is written).
//! Warm-up events, used to learn that every subscriber is attached, are
//! `wN:MICROS:cK:`. Latency is the subscriber's read time minus MICROS.
//! A channel tag `cK:` after MICROS (K the channel's index in the run) tells a
//! subscriber that follows several channels on one connection which channel
//! an event came from ([`channel_tag`]); warm-up events always carry it,
//! measured events when the scenario asks (`multi`).
//!
//! How the data travels in a request body and comes back in a read is the
//! [`Wire`]: as is (gapless, Nchan), or wrapped for a Durable Streams stream so
//! that several appends read back in one piece can be told apart exactly.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in Unix microseconds.
pub(crate) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// What a subscriber read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Payload {
    /// A measured event.
    Event {
        /// Its number in its channel, from 1.
        seq: u64,
        /// Its publish time, Unix µs.
        sent_us: u64,
    },
    /// Warm-up event number N.
    Warm(u64),
    /// Anything else (not ours).
    Foreign,
}

/// How event data travels in an append's body and comes back in reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    /// The body is the data; a read (an SSE event, a history entry) holds one event.
    Raw,
    /// Durable Streams `application/json`: the body is the data as one JSON string; a read
    /// (catch-up answer, SSE `data` event) is a JSON array of such strings.
    JsonString,
    /// Durable Streams `text/plain`: the body is the data and `\n`; a read is the messages
    /// concatenated, split at `\n` (the data never holds one).
    Line,
}

impl Wire {
    /// The `Content-Type` of appends (and of stream creation).
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Wire::Raw | Wire::Line => "text/plain",
            Wire::JsonString => "application/json",
        }
    }

    /// Wraps the data in `out` (as written by [`encode`] or [`encode_warm`]) into a body.
    pub(crate) fn wrap(self, out: &mut Vec<u8>) {
        match self {
            Wire::Raw => {}
            // The data is ASCII digits, `:`, `w` and `x`: nothing to escape.
            Wire::JsonString => {
                out.insert(0, b'"');
                out.push(b'"');
            }
            Wire::Line => out.push(b'\n'),
        }
    }

    /// Calls `each` with every message of one read; returns false when the read is
    /// not of this wire's shape (not a JSON array of strings).
    pub(crate) fn split(self, read: &str, mut each: impl FnMut(&str)) -> bool {
        match self {
            Wire::Raw => {
                each(read);
                true
            }
            Wire::Line => {
                for m in read.split('\n').filter(|m| !m.is_empty()) {
                    each(m);
                }
                true
            }
            Wire::JsonString => {
                match serde_json::from_str::<Vec<std::borrow::Cow<'_, str>>>(read) {
                    Ok(messages) => {
                        for m in &messages {
                            each(m);
                        }
                        true
                    }
                    Err(_) => false,
                }
            }
        }
    }
}

/// Writes a measured event's data into `out` (cleared first).
pub(crate) fn encode(out: &mut Vec<u8>, seq: u64, sent_us: u64, bytes: usize) {
    encode_tagged(out, seq, sent_us, None, bytes);
}

/// Writes a measured event's data into `out` (cleared first), with the channel tag
/// `cK:` after the publish time when `channel` is given.
pub(crate) fn encode_tagged(
    out: &mut Vec<u8>,
    seq: u64,
    sent_us: u64,
    channel: Option<usize>,
    bytes: usize,
) {
    out.clear();
    push_u64(out, seq);
    out.push(b':');
    push_u64(out, sent_us);
    out.push(b':');
    if let Some(c) = channel {
        out.push(b'c');
        push_u64(out, c as u64);
        out.push(b':');
    }
    if out.len() < bytes {
        out.resize(bytes, b'x');
    }
}

/// Writes warm-up event `n`'s data for channel `channel` (its index in the run) into
/// `out` (cleared first).
pub(crate) fn encode_warm(out: &mut Vec<u8>, n: u64, channel: usize) {
    out.clear();
    out.push(b'w');
    push_u64(out, n);
    out.push(b':');
    push_u64(out, now_us());
    out.push(b':');
    out.push(b'c');
    push_u64(out, channel as u64);
    out.push(b':');
}

/// The channel tag of event data (`SEQ:MICROS:cK:…` or `wN:MICROS:cK:…`): K, the
/// channel's index in the run; `None` when the data carries none.
pub(crate) fn channel_tag(data: &str) -> Option<usize> {
    let b = data.as_bytes();
    let c1 = memchr::memchr(b':', b)?;
    let rest = &b[c1 + 1..];
    let c2 = memchr::memchr(b':', rest)?;
    let tag = rest[c2 + 1..].strip_prefix(b"c")?;
    let end = memchr::memchr(b':', tag)?;
    parse_u64(&tag[..end]).map(|k| k as usize)
}

fn push_u64(out: &mut Vec<u8>, mut v: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() || s.len() > 19 {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &d| {
        d.is_ascii_digit().then(|| acc * 10 + u64::from(d - b'0'))
    })
}

/// Reads event data.
pub(crate) fn parse(data: &str) -> Payload {
    let b = data.as_bytes();
    let Some(c1) = memchr::memchr(b':', b) else {
        return Payload::Foreign;
    };
    if let Some(w) = b[..c1].strip_prefix(b"w") {
        return parse_u64(w).map_or(Payload::Foreign, Payload::Warm);
    }
    let Some(seq) = parse_u64(&b[..c1]) else {
        return Payload::Foreign;
    };
    let rest = &b[c1 + 1..];
    let Some(c2) = memchr::memchr(b':', rest) else {
        return Payload::Foreign;
    };
    match parse_u64(&rest[..c2]) {
        Some(sent_us) => Payload::Event { seq, sent_us },
        None => Payload::Foreign,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut buf = Vec::new();
        encode(&mut buf, 42, 1_700_000_000_123_456, 100);
        assert_eq!(buf.len(), 100);
        let s = std::str::from_utf8(&buf).expect("ascii");
        assert_eq!(
            parse(s),
            Payload::Event {
                seq: 42,
                sent_us: 1_700_000_000_123_456
            }
        );
        encode(&mut buf, 7, 0, 1);
        assert_eq!(buf, b"7:0:");
        encode_warm(&mut buf, 3, 12);
        let warm = std::str::from_utf8(&buf).expect("ascii");
        assert_eq!(parse(warm), Payload::Warm(3));
        assert_eq!(channel_tag(warm), Some(12));
        encode_tagged(&mut buf, 5, 77, Some(3), 40);
        assert_eq!(buf.len(), 40);
        let tagged = std::str::from_utf8(&buf).expect("ascii");
        assert_eq!(
            parse(tagged),
            Payload::Event {
                seq: 5,
                sent_us: 77
            }
        );
        assert_eq!(channel_tag(tagged), Some(3));
        encode(&mut buf, 5, 77, 40);
        assert_eq!(channel_tag(std::str::from_utf8(&buf).expect("ascii")), None);
        assert_eq!(parse("hello"), Payload::Foreign);
        encode(&mut buf, 9, 5, 6);
        Wire::JsonString.wrap(&mut buf);
        assert_eq!(buf, b"\"9:5:xx\"");
        assert_eq!(parse("1:x:"), Payload::Foreign);
    }

    #[test]
    fn wire_splits_shared_reads() {
        let mut got = Vec::new();
        assert!(Wire::JsonString.split(r#"["1:5:x","2:6:x"]"#, |m| got.push(m.to_owned())));
        assert_eq!(got, ["1:5:x", "2:6:x"]);
        got.clear();
        assert!(Wire::Line.split("1:5:x\n2:6:x\n", |m| got.push(m.to_owned())));
        assert_eq!(got, ["1:5:x", "2:6:x"]);
        assert!(!Wire::JsonString.split("1:5:x", |_| {}));
    }
}
