//! How one event is stored in its channel's hash: `<time>:` then the payload
//! `n<data>` (no type) or `t<type length>:<type><data>` for text, and `b<data>`
//! or `B<type length>:<type><data>` for bytes (binary payloads; every value
//! written before them has `n` or `t`, so it reads as text, unchanged). The
//! script writes the time; the node writes the payload and parses both back.

use gapless_protocol::{Epoch, Event, NewEvent, Payload};
use std::sync::Arc;

/// The payload of one event, as the append script receives it.
pub(crate) fn encode(e: &NewEvent) -> Vec<u8> {
    let mut out = Vec::with_capacity(e.data.len() + 8);
    let binary = e.data.is_binary();
    match &e.event_type {
        None => out.push(if binary { b'b' } else { b'n' }),
        Some(t) => {
            out.push(if binary { b'B' } else { b't' });
            out.extend_from_slice(t.len().to_string().as_bytes());
            out.push(b':');
            out.extend_from_slice(t.as_bytes());
        }
    }
    out.extend_from_slice(e.data.as_bytes());
    out
}

/// Parses a stored value back into an event with seq `seq`.
///
/// # Errors
/// A description of what is malformed (a value not written by this crate).
pub(crate) fn decode(
    channel: &Arc<str>,
    epoch: Epoch,
    seq: u64,
    stored: Vec<u8>,
) -> Result<Event, String> {
    let bad = |why: &str| format!("stored event {seq} of {channel} is malformed: {why}");
    let colon = stored
        .iter()
        .position(|&b| b == b':')
        .ok_or_else(|| bad("no time"))?;
    let time: u64 = std::str::from_utf8(&stored[..colon])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad time"))?;
    let rest = &stored[colon + 1..];
    let binary = matches!(rest.first(), Some(b'b' | b'B'));
    let (event_type, data) = match rest.first() {
        Some(b'n' | b'b') => (None, &rest[1..]),
        Some(b't' | b'B') => {
            let c = rest
                .iter()
                .position(|&b| b == b':')
                .ok_or_else(|| bad("no type length"))?;
            let len: usize = std::str::from_utf8(&rest[1..c])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad("bad type length"))?;
            let body = &rest[c + 1..];
            if body.len() < len {
                return Err(bad("type longer than the value"));
            }
            let t = std::str::from_utf8(&body[..len]).map_err(|_| bad("type not UTF-8"))?;
            (Some(t.to_owned()), &body[len..])
        }
        _ => return Err(bad("unknown payload tag")),
    };
    let data = Payload::from_bytes(data.to_vec(), binary).map_err(|_| bad("data not UTF-8"))?;
    Ok(Event::new(
        channel.clone(),
        epoch,
        seq,
        event_type,
        data,
        time,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip_with_and_without_type() {
        let ch: Arc<str> = Arc::from("c");
        for (t, d) in [
            (None, "plain"),
            (Some("quote"), "{\"p\":1}"),
            (Some("a:b"), ""),
            (None, "x:y\n"),
        ] {
            let ne = NewEvent {
                event_type: t.map(str::to_owned),
                data: d.into(),
            };
            let mut stored = b"1700000000123:".to_vec();
            stored.extend(encode(&ne));
            let e = decode(&ch, Epoch(7), 3, stored).expect("decodes");
            assert_eq!(e.event_type.as_deref(), t);
            assert_eq!(e.data, d);
            assert_eq!(e.time, 1_700_000_000_123);
            assert_eq!(e.seq, 3);
        }
    }

    #[test]
    fn bytes_round_trip_with_and_without_type() {
        let ch: Arc<str> = Arc::from("c");
        let all: Vec<u8> = (0..=255).collect();
        for t in [None, Some("bin"), Some("a:b")] {
            for d in [all.clone(), Vec::new(), b"n".to_vec()] {
                let ne = NewEvent {
                    event_type: t.map(str::to_owned),
                    data: Payload::Binary(d.clone()),
                };
                let mut stored = b"5:".to_vec();
                stored.extend(encode(&ne));
                let e = decode(&ch, Epoch(7), 3, stored).expect("decodes");
                assert_eq!(e.event_type.as_deref(), t);
                assert_eq!(e.data, Payload::Binary(d));
            }
        }
    }

    /// Values as the release before binary payloads stored them (hard-coded:
    /// they must not follow the encoder) read as the same text.
    #[test]
    fn values_of_the_release_before_binary_payloads_read_as_text() {
        let ch: Arc<str> = Arc::from("c");
        let e = decode(&ch, Epoch(1), 1, b"1700000000123:nhello".to_vec()).expect("decodes");
        assert_eq!(
            (e.event_type, e.data, e.time),
            (None, "hello".into(), 1_700_000_000_123)
        );
        let v = "12:t5:quote{\"p\":\"é\r\n\"}".as_bytes().to_vec();
        let e = decode(&ch, Epoch(1), 2, v).expect("decodes");
        assert_eq!(e.event_type.as_deref(), Some("quote"));
        assert_eq!(e.data, Payload::from("{\"p\":\"é\r\n\"}"));
        // An old value is never bytes, even when its text starts with a tag letter.
        let e = decode(&ch, Epoch(1), 3, b"1:nb".to_vec()).expect("decodes");
        assert_eq!(e.data, Payload::from("b"));
    }

    #[test]
    fn malformed_values_are_errors_not_panics() {
        let ch: Arc<str> = Arc::from("c");
        for v in [
            &b""[..],
            b"12",
            b"x:n",
            b"1:",
            b"1:q",
            b"1:t9:ab",
            b"1:tz:a",
        ] {
            assert!(decode(&ch, Epoch(1), 1, v.to_vec()).is_err(), "{v:?}");
        }
    }
}
