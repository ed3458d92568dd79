//! The commit notification the append script publishes on the bus
//! ([`crate::BUS_CHANNEL`]), and its parser.
//!
//! Two forms, both starting with the same header line:
//!
//! - by reference: `<epoch> <first> <last> <channel>`; a node that follows
//!   the channel reads the events from Redis;
//! - inline: the header, `\n`, the channel's floor after the append, `\n`,
//!   then for each event `first..=last` its stored value (`<time>:` then the
//!   payload, exactly as in the channel's hash, see `codec.rs`) prefixed by its
//!   length in bytes and `:`. The script sends this form when the payloads of
//!   the append total at most `--redis-inline-bytes` (default
//!   [`DEFAULT_INLINE_BYTES`]); larger appends go by reference.
//!
//! A purge (`scripts.rs`, `PURGE`) publishes the header alone with `first`
//! 1 and `last` 0: an empty commit that starts the channel's new epoch.
//!
//! Channel names have no space and no newline (`A-Z a-z 0-9 _ - . : @ ~ /`),
//! so the header is unambiguous. An inline part that does not parse, or does
//! not hold exactly `last - first + 1` events, is ignored: the notification
//! is then handled as by reference (a read from Redis), never guessed at.

use crate::codec;
use gapless_protocol::{Epoch, Event};
use std::sync::Arc;

/// Default of `--redis-inline-bytes`: the largest total payload (bytes of
/// type and data of every event of one append) carried in the notification.
pub const DEFAULT_INLINE_BYTES: u64 = 4096;

/// One parsed notification.
#[derive(Debug)]
pub(crate) struct Notification<'a> {
    pub(crate) epoch: Epoch,
    pub(crate) first: u64,
    pub(crate) last: u64,
    pub(crate) channel: &'a str,
    /// The inline part, when the notification has a well-formed one.
    pub(crate) inline: Option<Inline<'a>>,
}

/// The events carried in a notification, still as stored values.
#[derive(Debug)]
pub(crate) struct Inline<'a> {
    /// The channel's floor right after the append.
    pub(crate) floor: u64,
    /// One stored value per seq `first..=last`.
    pub(crate) values: Vec<&'a [u8]>,
}

impl Notification<'_> {
    /// The carried events (seqs `first..=last` of `epoch`), decoded; `None`
    /// when the notification is by reference or a value does not decode.
    pub(crate) fn events(&self) -> Option<Vec<Arc<Event>>> {
        let inline = self.inline.as_ref()?;
        let name: Arc<str> = Arc::from(self.channel);
        inline
            .values
            .iter()
            .zip(self.first..=self.last)
            .map(|(v, seq)| {
                codec::decode(&name, self.epoch, seq, v.to_vec())
                    .ok()
                    .map(Arc::new)
            })
            .collect()
    }
}

/// Parses a notification (see the module doc); `None` when its header is malformed.
pub(crate) fn parse(msg: &[u8]) -> Option<Notification<'_>> {
    let (header, rest) = match msg.iter().position(|&b| b == b'\n') {
        Some(i) => (&msg[..i], Some(&msg[i + 1..])),
        None => (msg, None),
    };
    let s = std::str::from_utf8(header).ok()?;
    let mut parts = s.splitn(4, ' ');
    let epoch = parts.next()?.parse().ok()?;
    let first: u64 = parts.next()?.parse().ok()?;
    let last: u64 = parts.next()?.parse().ok()?;
    let channel = parts.next()?;
    if channel.is_empty() || channel.contains(' ') || first == 0 || last + 1 < first {
        return None;
    }
    let inline = match last + 1 - first {
        0 => None,
        n => rest.and_then(|r| parse_inline(r, n)),
    };
    Some(Notification {
        epoch: Epoch(epoch),
        first,
        last,
        channel,
        inline,
    })
}

/// `<floor>\n` then `count` values `<len>:<bytes>`, and nothing after them.
fn parse_inline(mut rest: &[u8], count: u64) -> Option<Inline<'_>> {
    let nl = rest.iter().position(|&b| b == b'\n')?;
    let floor = std::str::from_utf8(&rest[..nl]).ok()?.parse().ok()?;
    rest = &rest[nl + 1..];
    let mut values = Vec::with_capacity(usize::try_from(count).ok()?.min(1024));
    for _ in 0..count {
        let colon = rest.iter().position(|&b| b == b':')?;
        let len: usize = std::str::from_utf8(&rest[..colon]).ok()?.parse().ok()?;
        let body = rest.get(colon + 1..colon + 1 + len)?;
        values.push(body);
        rest = &rest[colon + 1 + len..];
    }
    rest.is_empty().then_some(Inline { floor, values })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_parse_and_bad_ones_are_refused() {
        let n = parse(b"17 3 5 news:eu").expect("parses");
        assert_eq!(
            (n.epoch, n.first, n.last, n.channel),
            (Epoch(17), 3, 5, "news:eu")
        );
        assert!(n.inline.is_none());
        let n = parse(b"17 1 1 session/ab").expect("parses");
        assert_eq!(n.channel, "session/ab");
        // A purge: an empty commit starting the epoch.
        let n = parse(b"17 1 0 c").expect("a purge's notice parses");
        assert_eq!((n.first, n.last, n.inline.is_none()), (1, 0, true));
        for bad in [
            &b""[..],
            b"17 3 5",
            b"x 3 5 c",
            b"17 0 5 c",
            b"17 5 3 c",
            b"17 3 5 ",
            b"17 3 5 a b",
            b"\n1\n3:1:n",
        ] {
            assert!(parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn inline_events_decode_with_their_seqs_and_times() {
        let msg = b"9 4 5 c\n2\n8:100:nabc13:101:t1:xa:b\nc";
        let n = parse(msg).expect("parses");
        let inline = n.inline.as_ref().expect("inline");
        assert_eq!(inline.floor, 2);
        let events = n.events().expect("decodes");
        assert_eq!(events.len(), 2);
        assert_eq!(
            (
                events[0].seq,
                events[0].time,
                events[0].data.as_text().unwrap_or_default()
            ),
            (4, 100, "abc")
        );
        assert_eq!(events[0].event_type, None);
        assert_eq!(
            (
                events[1].seq,
                events[1].time,
                events[1].data.as_text().unwrap_or_default()
            ),
            (5, 101, "a:b\nc")
        );
        assert_eq!(events[1].event_type.as_deref(), Some("x"));
        assert_eq!(events[1].epoch, Epoch(9));
    }

    #[test]
    fn a_malformed_inline_part_falls_back_to_by_reference() {
        for msg in [
            &b"9 4 5 c\n2\n8:100:nabc"[..], // one event of two
            b"9 4 4 c\n2\n8:100:nabcEXTRA", // bytes after the last
            b"9 4 4 c\n2\n99:100:nabc",     // length past the end
            b"9 4 4 c\nx\n8:100:nabc",      // bad floor
            b"9 4 4 c\n2\n8100:nabc",       // no length separator
            b"9 4 4 c\n2",                  // no values line
        ] {
            let n = parse(msg).expect("the header parses");
            assert_eq!((n.first, n.last, n.channel), (4, n.last, "c"));
            assert!(n.inline.is_none(), "{msg:?}");
            assert!(n.events().is_none());
        }
        // A value that is not a stored event: no events, read from Redis instead.
        let n = parse(b"9 4 4 c\n2\n3:abc").expect("parses");
        assert!(n.inline.is_some());
        assert!(n.events().is_none());
    }
}
