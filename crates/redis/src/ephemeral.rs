//! Ephemeral events between nodes: a node that takes an ephemeral publish
//! (`?ephemeral=true`, never journaled) also publishes it on the bus
//! ([`crate::BUS_CHANNEL`]), and every other node hands it to its own
//! subscribers of the channel (docs/cluster.md, "Ephemeral events").
//!
//! Format: `eph <node> <channel> <type length or -> <type><data>`, where
//! `<node>` names the sending node (it skips its own), the channel has no
//! space (channel names never do), and the type's length in bytes says where
//! the data begins. When the data is bytes rather than text, the type length
//! (or `-`) is preceded by `b` (`b-`, `b5`); older nodes ignore such a
//! message as malformed. Best effort like every ephemeral event: a node that is
//! not on the bus at that moment never gets it. Nodes older than this
//! message log it once as a malformed notification and ignore it.

/// The prefix of an ephemeral message on the bus.
pub(crate) const PREFIX: &[u8] = b"eph ";

use gapless_protocol::Payload;

/// One parsed ephemeral message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Shared<'a> {
    /// The node that took the publish.
    pub node: &'a str,
    /// The channel.
    pub channel: &'a str,
    /// The event's type, if any.
    pub event_type: Option<&'a str>,
    /// The event's data: text's UTF-8 (checked) or, with `binary`, bytes.
    pub data: &'a [u8],
    /// Whether `data` is bytes.
    pub binary: bool,
}

impl Shared<'_> {
    /// The data, owned.
    pub(crate) fn payload(&self) -> Payload {
        match std::str::from_utf8(self.data) {
            Ok(text) if !self.binary => Payload::Text(text.to_owned()),
            _ => Payload::Binary(self.data.to_vec()),
        }
    }
}

/// The bus message for an ephemeral event published on `node`.
pub(crate) fn encode(
    node: &str,
    channel: &str,
    event_type: Option<&str>,
    data: &Payload,
) -> Vec<u8> {
    let mut m = Vec::with_capacity(PREFIX.len() + node.len() + channel.len() + data.len() + 32);
    m.extend_from_slice(PREFIX);
    m.extend_from_slice(node.as_bytes());
    m.push(b' ');
    m.extend_from_slice(channel.as_bytes());
    m.push(b' ');
    if data.is_binary() {
        m.push(b'b');
    }
    match event_type {
        Some(t) => {
            m.extend_from_slice(t.len().to_string().as_bytes());
            m.push(b' ');
            m.extend_from_slice(t.as_bytes());
        }
        None => m.extend_from_slice(b"- "),
    }
    m.extend_from_slice(data.as_bytes());
    m
}

/// Parses what follows [`PREFIX`]; `None` when it is not one well-formed
/// message (it is then ignored).
pub(crate) fn parse(rest: &[u8]) -> Option<Shared<'_>> {
    fn word(b: &[u8]) -> Option<(&str, &[u8])> {
        let at = b.iter().position(|&c| c == b' ')?;
        Some((std::str::from_utf8(&b[..at]).ok()?, &b[at + 1..]))
    }
    let (node, rest) = word(rest)?;
    let (channel, rest) = word(rest)?;
    let (len, rest) = word(rest)?;
    let (binary, len) = match len.strip_prefix('b') {
        Some(l) => (true, l),
        None => (false, len),
    };
    let (event_type, data) = if len == "-" {
        (None, rest)
    } else {
        let n: usize = len.parse().ok()?;
        if n > rest.len() {
            return None;
        }
        let (t, d) = rest.split_at(n);
        (Some(std::str::from_utf8(t).ok()?), d)
    };
    if node.is_empty() || channel.is_empty() || (!binary && std::str::from_utf8(data).is_err()) {
        return None;
    }
    Some(Shared {
        node,
        channel,
        event_type,
        data,
        binary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_and_without_a_type() {
        for t in [None, Some("typing"), Some("a type with spaces"), Some("")] {
            let all: Vec<u8> = (0..=255).collect();
            for data in [
                Payload::from(""),
                "x".into(),
                "two words\nand a line".into(),
                "é ü".into(),
                Payload::Binary(all),
                Payload::Binary(b"- 5 x".to_vec()),
            ] {
                let m = encode("n1", "room/1", t, &data);
                let rest = m.strip_prefix(PREFIX).expect("prefix");
                let s = parse(rest).expect("parses");
                assert_eq!(
                    s,
                    Shared {
                        node: "n1",
                        channel: "room/1",
                        event_type: t,
                        data: data.as_bytes(),
                        binary: data.is_binary(),
                    }
                );
                assert_eq!(s.payload(), data);
            }
        }
    }

    #[test]
    fn refuses_what_is_not_one_message() {
        for bad in [
            &b""[..],
            b"n1",
            b"n1 ch",
            b"n1 ch 5 abc",
            b"n1 ch x abc",
            b" ch - d",
            b"n1  - d",
            b"n1 ch 1 \xff",
        ] {
            assert_eq!(parse(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
