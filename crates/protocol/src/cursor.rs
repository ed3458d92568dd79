//! Cursors: opaque, self-checking strings that name a position.
//!
//! A cursor holds one [`Position`] per channel: the channel's [`ChannelKey`]
//! (a 64-bit FNV-1a hash of its name), the journal [`Epoch`] it was issued in,
//! and the `seq` of the last event delivered (0 = before the first event).
//! Clients relay cursors and never parse them.
//!
//! Wire form: URL-safe base64 without padding of
//! `version (1 byte) | count (1 byte) | count × (key u64 LE, epoch u64 LE, seq LEB128) | crc32 LE`,
//! where the CRC-32 covers every byte before it. Version is [`VERSION`].
//!
//! Each channel appears at most once (a cursor is one position per channel;
//! [`Cursor::set`] replaces). Decoding distinguishes garbage (bad base64, bad
//! length, failed check, a seq not in its shortest form, a channel twice:
//! [`CursorError::Malformed`]) from a well-formed cursor of another version
//! ([`CursorError::Version`]), which a server answers with an `unknown` gap
//! rather than an error (design: "Resume rules").

use crate::event::Epoch;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use thiserror::Error;

/// The cursor format this build writes.
pub const VERSION: u8 = 1;
/// Most positions one cursor can hold (the count is one byte).
pub const MAX_POSITIONS: usize = 255;
/// Longest cursor string accepted before decoding, in bytes.
pub const MAX_CURSOR_LEN: usize = 8192;

/// A stable 64-bit key for a channel name (FNV-1a), used inside cursors so
/// that a multi-channel cursor stays short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChannelKey(pub u64);

impl ChannelKey {
    /// The key of `channel`.
    pub fn of(channel: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in channel.as_bytes() {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        ChannelKey(h)
    }
}

/// One channel's position: after event `seq` of journal incarnation `epoch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// Which channel.
    pub key: ChannelKey,
    /// The journal incarnation the position belongs to.
    pub epoch: Epoch,
    /// The last seq delivered; 0 means before the first event.
    pub seq: u64,
}

/// A decoded cursor: positions on one or more channels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cursor {
    positions: Vec<Position>,
}

/// Why a cursor string could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CursorError {
    /// Not a cursor at all: bad base64, wrong length, or the check failed.
    #[error("malformed cursor: {0}")]
    Malformed(&'static str),
    /// A well-formed cursor from a format version this server does not read.
    #[error("cursor format version {0} is not supported (this server reads version {VERSION})")]
    Version(u8),
}

impl Cursor {
    /// An empty cursor (no channel positions).
    pub fn new() -> Self {
        Self::default()
    }

    /// A cursor holding one position.
    pub fn single(channel: &str, epoch: Epoch, seq: u64) -> Self {
        let mut c = Self::new();
        c.set(channel, epoch, seq);
        c
    }

    /// Sets (or adds) the position of `channel`.
    pub fn set(&mut self, channel: &str, epoch: Epoch, seq: u64) {
        let key = ChannelKey::of(channel);
        match self.positions.iter_mut().find(|p| p.key == key) {
            Some(p) => {
                p.epoch = epoch;
                p.seq = seq;
            }
            None => self.positions.push(Position { key, epoch, seq }),
        }
    }

    /// The position of `channel`, if this cursor covers it.
    pub fn get(&self, channel: &str) -> Option<Position> {
        let key = ChannelKey::of(channel);
        self.positions.iter().copied().find(|p| p.key == key)
    }

    /// All positions, in insertion order.
    pub fn positions(&self) -> &[Position] {
        &self.positions
    }

    /// Encodes to the wire string. Positions past [`MAX_POSITIONS`] are dropped
    /// (a subscription never holds that many channels).
    pub fn encode(&self) -> String {
        let n = self.positions.len().min(MAX_POSITIONS);
        let mut buf = Vec::with_capacity(2 + n * 26 + 4);
        buf.push(VERSION);
        buf.push(n as u8);
        for p in &self.positions[..n] {
            buf.extend_from_slice(&p.key.0.to_le_bytes());
            buf.extend_from_slice(&p.epoch.0.to_le_bytes());
            let mut v = p.seq;
            loop {
                let byte = (v & 0x7f) as u8;
                v >>= 7;
                if v == 0 {
                    buf.push(byte);
                    break;
                }
                buf.push(byte | 0x80);
            }
        }
        let crc = crc32fast::hash(&buf);
        buf.extend_from_slice(&crc.to_le_bytes());
        URL_SAFE_NO_PAD.encode(buf)
    }

    /// Decodes a wire string; see the module doc for the two error kinds.
    ///
    /// # Errors
    /// [`CursorError::Malformed`] for garbage, [`CursorError::Version`] for a
    /// checked cursor of another format version.
    pub fn decode(s: &[u8]) -> Result<Self, CursorError> {
        if s.len() > MAX_CURSOR_LEN {
            return Err(CursorError::Malformed("too long"));
        }
        let raw = URL_SAFE_NO_PAD
            .decode(s)
            .map_err(|_| CursorError::Malformed("not URL-safe base64"))?;
        if raw.len() < 6 {
            return Err(CursorError::Malformed("too short"));
        }
        let (body, crc) = raw.split_at(raw.len() - 4);
        let want = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
        if crc32fast::hash(body) != want {
            return Err(CursorError::Malformed("check failed"));
        }
        if body[0] != VERSION {
            return Err(CursorError::Version(body[0]));
        }
        let n = body[1] as usize;
        let mut rest = &body[2..];
        let mut positions = Vec::with_capacity(n);
        for _ in 0..n {
            if rest.len() < 17 {
                return Err(CursorError::Malformed("truncated position"));
            }
            let key = u64::from_le_bytes(to8(&rest[..8]));
            let epoch = u64::from_le_bytes(to8(&rest[8..16]));
            rest = &rest[16..];
            let mut seq: u64 = 0;
            let mut shift = 0u32;
            loop {
                let Some((&b, tail)) = rest.split_first() else {
                    return Err(CursorError::Malformed("truncated seq"));
                };
                rest = tail;
                if shift > 63 || (shift == 63 && b & 0x7e != 0) {
                    return Err(CursorError::Malformed("seq overflows 64 bits"));
                }
                if b == 0 && shift > 0 {
                    // An overlong form (a last byte of 0 after a continuation)
                    // would name the same seq as a shorter string: one wire
                    // form per cursor, so a decoded cursor re-encodes to itself.
                    return Err(CursorError::Malformed("seq not in its shortest form"));
                }
                seq |= u64::from(b & 0x7f) << shift;
                if b & 0x80 == 0 {
                    break;
                }
                shift += 7;
            }
            if positions.iter().any(|p: &Position| p.key.0 == key) {
                // Two positions for one channel: which would `get` mean? No
                // encoder writes this (`set` replaces), so it is not a cursor.
                return Err(CursorError::Malformed("the same channel twice"));
            }
            positions.push(Position {
                key: ChannelKey(key),
                epoch: Epoch(epoch),
                seq,
            });
        }
        if !rest.is_empty() {
            return Err(CursorError::Malformed("trailing bytes"));
        }
        Ok(Cursor { positions })
    }
}

fn to8(s: &[u8]) -> [u8; 8] {
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `body` with its check appended, as a cursor string.
    fn checked(body: &[u8]) -> String {
        let mut buf = body.to_vec();
        buf.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
        URL_SAFE_NO_PAD.encode(buf)
    }

    #[test]
    fn round_trip_single_and_multi() {
        let c = Cursor::single("orders", Epoch(0xdead_beef), 42);
        let s = c.encode();
        assert!(s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(Cursor::decode(s.as_bytes()), Ok(c));

        let mut m = Cursor::new();
        m.set("a", Epoch(1), 0);
        m.set("b", Epoch(2), u64::MAX);
        m.set("a", Epoch(1), 7);
        let d = Cursor::decode(m.encode().as_bytes()).expect("decodes");
        assert_eq!(d.positions().len(), 2);
        assert_eq!(d.get("a").map(|p| p.seq), Some(7));
        assert_eq!(d.get("b").map(|p| p.seq), Some(u64::MAX));
        assert_eq!(d.get("c"), None);
    }

    #[test]
    fn garbage_is_malformed() {
        for bad in [
            &b""[..],
            b"garbage",
            b"!!!!",
            b"AAAAAAAAAAAA",
            &[0xff, 0xfe][..],
        ] {
            assert!(
                matches!(Cursor::decode(bad), Err(CursorError::Malformed(_))),
                "{bad:?}"
            );
        }
        // one flipped character fails the check
        let mut s = Cursor::single("x", Epoch(9), 3).encode().into_bytes();
        s[3] = if s[3] == b'A' { b'B' } else { b'A' };
        assert!(matches!(Cursor::decode(&s), Err(CursorError::Malformed(_))));
    }

    /// Found by the `cursor_decode` fuzz target: seq 127 written as
    /// `0xff 0x00` (an overlong LEB128) decoded, and re-encoded to another string.
    #[test]
    fn overlong_seq_is_malformed_so_every_cursor_has_one_form() {
        let mut body = vec![VERSION, 1];
        body.extend_from_slice(&[7; 16]);
        let mut shortest = body.clone();
        shortest.push(0x7f);
        let c = Cursor::decode(checked(&shortest).as_bytes()).expect("shortest form decodes");
        assert_eq!(c.encode(), checked(&shortest));
        for overlong in [&[0xff, 0x00][..], &[0x80, 0x00], &[0xff, 0x80, 0x00]] {
            let mut b = body.clone();
            b.extend_from_slice(overlong);
            assert_eq!(
                Cursor::decode(checked(&b).as_bytes()),
                Err(CursorError::Malformed("seq not in its shortest form")),
                "{overlong:?}"
            );
        }
        // u64::MAX still decodes: its last byte is 0x01.
        let c = Cursor::single("x", Epoch(1), u64::MAX);
        assert_eq!(Cursor::decode(c.encode().as_bytes()), Ok(c));
    }

    /// A tester's finding: a checked cursor naming one channel twice decoded,
    /// and `get` silently took the first position.
    #[test]
    fn the_same_channel_twice_is_malformed() {
        let position = |channel: &str, seq: u8| {
            let mut p = ChannelKey::of(channel).0.to_le_bytes().to_vec();
            p.extend_from_slice(&7u64.to_le_bytes());
            p.push(seq);
            p
        };
        for order in [["a", "a", "b"], ["a", "b", "a"], ["b", "a", "a"]] {
            let mut body = vec![VERSION, 3];
            for (i, c) in order.iter().enumerate() {
                body.extend_from_slice(&position(c, i as u8));
            }
            let e = Cursor::decode(checked(&body).as_bytes()).expect_err("refused");
            assert_eq!(
                e,
                CursorError::Malformed("the same channel twice"),
                "{order:?}"
            );
            assert_eq!(e.to_string(), "malformed cursor: the same channel twice");
        }
        // Distinct channels decode, and re-encode to the same string.
        let mut body = vec![VERSION, 2];
        body.extend_from_slice(&position("a", 1));
        body.extend_from_slice(&position("b", 2));
        let s = checked(&body);
        assert_eq!(Cursor::decode(s.as_bytes()).expect("decodes").encode(), s);
    }

    #[test]
    fn other_version_is_recognised() {
        let mut buf = vec![2u8, 0];
        buf.extend_from_slice(&crc32fast::hash(&buf).to_le_bytes());
        let s = URL_SAFE_NO_PAD.encode(buf);
        assert_eq!(Cursor::decode(s.as_bytes()), Err(CursorError::Version(2)));
    }
}
