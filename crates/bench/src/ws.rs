//! The little of RFC 6455 a WebSocket subscriber needs, over the raw
//! [`crate::http::Conn`] the SSE subscribers use: the opening handshake's
//! request, a reader of the server's (unmasked) frames straight from the
//! connection's read buffer, and the writer of the client's masked frames (a
//! text message, a pong). No allocation per frame: a subscriber costs its read
//! buffer, as an SSE one does; a message split over continuation frames is
//! put together in a buffer that exists only while it is incomplete.
//!
//! Not for general use: it never sends a close frame of its own, does not
//! check `Sec-WebSocket-Accept` (the status 101 is enough for a load tool),
//! and refuses what a server must not send (a masked frame, reserved bits,
//! a control frame over 125 bytes or fragmented).

use crate::http::request;
use anyhow::{bail, Result};

/// Frame opcodes (RFC 6455 section 5.2).
pub(crate) mod op {
    /// A continuation of a fragmented message.
    pub(crate) const CONTINUATION: u8 = 0x0;
    /// A UTF-8 text message.
    pub(crate) const TEXT: u8 = 0x1;
    /// A binary message.
    pub(crate) const BINARY: u8 = 0x2;
    /// The closing handshake.
    pub(crate) const CLOSE: u8 = 0x8;
    /// A ping, to be answered with a pong carrying the same payload.
    pub(crate) const PING: u8 = 0x9;
    /// A pong.
    pub(crate) const PONG: u8 = 0xA;
}

/// One frame as read from the server: its FIN bit, opcode and payload (borrowed from the
/// read buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frame<'a> {
    /// The last frame of its message.
    pub fin: bool,
    /// See [`op`].
    pub opcode: u8,
    /// The payload, unmasked (a server never masks).
    pub payload: &'a [u8],
}

/// Reads the frame at the start of `buf`: `Ok(None)` when `buf` does not hold all of it
/// yet, else the frame and the bytes it took.
///
/// # Errors
/// A frame a server must not send: masked, reserved bits set, an unknown opcode, a
/// control frame over 125 bytes or not final, or a length over 2^63.
pub(crate) fn parse_frame(buf: &[u8]) -> Result<Option<(Frame<'_>, usize)>> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let (b0, b1) = (buf[0], buf[1]);
    let fin = b0 & 0x80 != 0;
    let opcode = b0 & 0x0F;
    if b0 & 0x70 != 0 {
        bail!("WebSocket frame with reserved bits set ({b0:#04x})");
    }
    if b1 & 0x80 != 0 {
        bail!("masked WebSocket frame from the server");
    }
    match opcode {
        op::CONTINUATION | op::TEXT | op::BINARY => {}
        op::CLOSE | op::PING | op::PONG => {
            if !fin || b1 & 0x7F > 125 {
                bail!("WebSocket control frame {opcode:#x} fragmented or over 125 bytes");
            }
        }
        _ => bail!("WebSocket frame with unknown opcode {opcode:#x}"),
    }
    let (len, head): (u64, usize) = match b1 & 0x7F {
        126 => {
            if buf.len() < 4 {
                return Ok(None);
            }
            (u64::from(u16::from_be_bytes([buf[2], buf[3]])), 4)
        }
        127 => {
            if buf.len() < 10 {
                return Ok(None);
            }
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[2..10]);
            let len = u64::from_be_bytes(b);
            if len >> 63 != 0 {
                bail!("WebSocket frame length over 2^63");
            }
            (len, 10)
        }
        n => (u64::from(n), 2),
    };
    let Ok(len) = usize::try_from(len) else {
        bail!("WebSocket frame of {len} bytes");
    };
    let Some(end) = head.checked_add(len) else {
        bail!("WebSocket frame of {len} bytes");
    };
    if buf.len() < end {
        return Ok(None);
    }
    Ok(Some((
        Frame {
            fin,
            opcode,
            payload: &buf[head..end],
        },
        end,
    )))
}

/// Appends a final, masked client frame (`opcode`, `payload`) to `out`, masked with
/// `mask` (RFC 6455 section 5.3: every client frame is masked).
pub(crate) fn client_frame(opcode: u8, payload: &[u8], mask: [u8; 4], out: &mut Vec<u8>) {
    out.push(0x80 | (opcode & 0x0F));
    let len = payload.len();
    if len < 126 {
        out.push(0x80 | len as u8);
    } else if let Ok(l) = u16::try_from(len) {
        out.push(0x80 | 126);
        out.extend_from_slice(&l.to_be_bytes());
    } else {
        out.push(0x80 | 127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
}

/// A masking key from a small xorshift state (the key need not be unpredictable here:
/// no proxy sits between the load tool and the server).
pub(crate) fn next_mask(state: &mut u64) -> [u8; 4] {
    let mut x = *state | 1;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    (x as u32).to_le_bytes()
}

/// The opening handshake's request: `GET path` with `Upgrade: websocket`, offering
/// `subprotocol` when given (gapless: `gapless.v1`).
pub(crate) fn handshake(host: &str, path: &str, subprotocol: Option<&str>) -> Vec<u8> {
    let mut headers = vec![
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        // The RFC's sample nonce: any 16 bytes in base64 will do.
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("Sec-WebSocket-Version", "13"),
    ];
    if let Some(p) = subprotocol {
        headers.push(("Sec-WebSocket-Protocol", p));
    }
    request("GET", host, path, &headers, b"")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_frame(opcode: u8, fin: bool, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![if fin { 0x80 } else { 0 } | opcode];
        match payload.len() {
            n if n < 126 => out.push(n as u8),
            n if n <= 0xFFFF => {
                out.push(126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn frames_of_every_length_form_split_anywhere() {
        let big = vec![b'x'; 70_000];
        let mut wire = server_frame(op::TEXT, true, b"hello");
        wire.extend(server_frame(op::TEXT, true, &[b'y'; 300]));
        wire.extend(server_frame(op::BINARY, true, &big));
        wire.extend(server_frame(op::PING, true, b"p"));
        for split in [0, 1, 2, 3, 7, 9, 300, 310, 70_000, wire.len() - 1] {
            let mut got: Vec<(u8, usize)> = Vec::new();
            let mut pos = 0;
            let mut avail = split;
            loop {
                match parse_frame(&wire[pos..avail]).expect("valid frames") {
                    Some((f, used)) => {
                        assert!(f.fin);
                        got.push((f.opcode, f.payload.len()));
                        pos += used;
                    }
                    None if avail < wire.len() => avail = wire.len(),
                    None => break,
                }
            }
            assert_eq!(
                got,
                [
                    (op::TEXT, 5),
                    (op::TEXT, 300),
                    (op::BINARY, 70_000),
                    (op::PING, 1)
                ],
                "split at {split}"
            );
            assert_eq!(pos, wire.len());
        }
    }

    #[test]
    fn frames_a_server_must_not_send_are_refused() {
        assert!(
            parse_frame(&[0x81, 0x81, 1, 2, 3, 4, b'a']).is_err(),
            "masked"
        );
        assert!(parse_frame(&[0xC1, 0x00]).is_err(), "reserved bit");
        assert!(parse_frame(&[0x83, 0x00]).is_err(), "unknown opcode");
        assert!(parse_frame(&[0x09, 0x00]).is_err(), "fragmented ping");
        assert!(parse_frame(&[0x89, 126, 0, 200]).is_err(), "long ping");
        assert_eq!(parse_frame(&[0x81]).expect("partial"), None);
    }

    #[test]
    fn client_frames_are_masked() {
        let mut out = Vec::new();
        let mask = [1, 2, 3, 4];
        client_frame(op::TEXT, b"abcdef", mask, &mut out);
        assert_eq!(&out[..2], &[0x81, 0x86]);
        assert_eq!(&out[2..6], &mask);
        let clear: Vec<u8> = out[6..]
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ mask[i % 4])
            .collect();
        assert_eq!(clear, b"abcdef");
        out.clear();
        client_frame(op::PONG, &[0; 200], mask, &mut out);
        assert_eq!(&out[..4], &[0x8A, 0x80 | 126, 0, 200]);
        assert_eq!(out.len(), 4 + 4 + 200);
        let mut s = 7;
        assert_ne!(next_mask(&mut s), next_mask(&mut s));
    }
}
