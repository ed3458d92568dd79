//! Ephemeral events between nodes: a node that takes an ephemeral publish
//! (`?ephemeral=true`, never journaled) also publishes it on the bus
//! ([`crate::BUS_CHANNEL`]), and every other node hands it to its own
//! subscribers of the channel (docs/cluster.md, "Ephemeral events").
//!
//! Format: `eph <node> <channel> <type length or -> <type><data>`, where
//! `<node>` names the sending node (it skips its own), the channel has no
//! space (channel names never do), and the type's length in bytes says where
//! the data begins. Best effort like every ephemeral event: a node that is
//! not on the bus at that moment never gets it. Nodes older than this
//! message log it once as a malformed notification and ignore it.

/// The prefix of an ephemeral message on the bus.
pub(crate) const PREFIX: &[u8] = b"eph ";

/// One parsed ephemeral message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Shared<'a> {
    /// The node that took the publish.
    pub node: &'a str,
    /// The channel.
    pub channel: &'a str,
    /// The event's type, if any.
    pub event_type: Option<&'a str>,
    /// The event's data.
    pub data: &'a str,
}

/// The bus message for an ephemeral event published on `node`.
pub(crate) fn encode(node: &str, channel: &str, event_type: Option<&str>, data: &str) -> Vec<u8> {
    let mut m = Vec::with_capacity(PREFIX.len() + node.len() + channel.len() + data.len() + 32);
    m.extend_from_slice(PREFIX);
    m.extend_from_slice(node.as_bytes());
    m.push(b' ');
    m.extend_from_slice(channel.as_bytes());
    m.push(b' ');
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
    let rest = std::str::from_utf8(rest).ok()?;
    let (node, rest) = rest.split_once(' ')?;
    let (channel, rest) = rest.split_once(' ')?;
    let (len, rest) = rest.split_once(' ')?;
    let (event_type, data) = if len == "-" {
        (None, rest)
    } else {
        let n: usize = len.parse().ok()?;
        if !rest.is_char_boundary(n) || n > rest.len() {
            return None;
        }
        let (t, d) = rest.split_at(n);
        (Some(t), d)
    };
    if node.is_empty() || channel.is_empty() {
        return None;
    }
    Some(Shared {
        node,
        channel,
        event_type,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_and_without_a_type() {
        for t in [None, Some("typing"), Some("a type with spaces"), Some("")] {
            for data in ["", "x", "two words\nand a line", "é ü"] {
                let m = encode("n1", "room/1", t, data);
                let rest = m.strip_prefix(PREFIX).expect("prefix");
                let s = parse(rest).expect("parses");
                assert_eq!(
                    s,
                    Shared {
                        node: "n1",
                        channel: "room/1",
                        event_type: t,
                        data
                    }
                );
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
