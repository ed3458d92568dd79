//! Helpers of the regression tests that the shared modules do not have: a
//! WebSocket over a bare TCP socket that writes arbitrary bytes (unmasked
//! frames, RSV bits), and reads of raw TCP sockets until the server closes them.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How a raw socket read ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    /// The server closed the connection (EOF or reset) after this many bytes.
    Closed(Vec<u8>),
    /// Still open when the deadline passed (with what was read).
    Open(Vec<u8>),
}

/// Reads `tcp` until the server closes it or `within` passes.
pub async fn read_until_closed(tcp: &mut TcpStream, within: Duration) -> Ending {
    let deadline = Instant::now() + within;
    let mut got = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout(left, tcp.read(&mut chunk)).await {
            Err(_) => return Ending::Open(got),
            Ok(Ok(0)) | Ok(Err(_)) => return Ending::Closed(got),
            Ok(Ok(n)) => got.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Sends a whole request (`raw`) on a new connection and returns the status of
/// the answer's status line (`None`: the connection closed or stayed silent).
pub async fn raw_status(addr: SocketAddr, raw: &str) -> Option<u16> {
    let mut tcp = TcpStream::connect(addr).await.ok()?;
    tcp.write_all(raw.as_bytes()).await.ok()?;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    loop {
        if let Some(end) = got.windows(2).position(|w| w == b"\r\n") {
            let line = String::from_utf8_lossy(&got[..end]).into_owned();
            return line.split_whitespace().nth(1)?.parse().ok();
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let mut chunk = [0u8; 1024];
        match tokio::time::timeout(left, tcp.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&chunk[..n]),
            _ => return None,
        }
    }
}

/// A WebSocket on `/v1/ws` over a bare TCP socket: the test writes bytes as is.
pub struct ByteWs {
    tcp: TcpStream,
    buf: Vec<u8>,
}

/// What the server answered a protocol violation with.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    /// A close frame with this code (`None`: a close frame without a code).
    Close(Option<u16>),
    /// The connection ended without a close frame.
    Eof,
    /// Nothing within the deadline.
    Silence,
}

impl ByteWs {
    /// Upgrades `path` with subprotocol `gapless.v1`; asserts 101.
    pub async fn connect(addr: SocketAddr, path: &str) -> ByteWs {
        let mut tcp = TcpStream::connect(addr).await.expect("TCP connect");
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Protocol: gapless.v1\r\n\r\n"
        );
        tcp.write_all(req.as_bytes())
            .await
            .expect("write handshake");
        let mut buf = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(left, tcp.read(&mut chunk))
                .await
                .expect("handshake answer timed out")
                .expect("reading the handshake answer");
            assert!(n > 0, "closed during the handshake: {buf:?}");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        assert!(head.starts_with("HTTP/1.1 101"), "upgrade refused: {head}");
        let buf = buf[end..].to_vec();
        ByteWs { tcp, buf }
    }

    /// Writes `bytes` as they are.
    pub async fn write_raw(&mut self, bytes: &[u8]) {
        self.tcp.write_all(bytes).await.expect("write");
    }

    /// Writes one masked frame: `first` is the first byte (FIN, RSV, opcode).
    pub async fn write_masked(&mut self, first: u8, payload: &[u8]) {
        self.write_raw(&crate::ws_support::masked_frame(first, payload))
            .await;
    }

    /// Reads frames (skipping all but close) until a close frame, EOF or `within`.
    pub async fn close_answer(&mut self, within: Duration) -> Answer {
        let deadline = Instant::now() + within;
        loop {
            while let Some((frame, used)) = crate::ws_support::parse_frame(&self.buf) {
                self.buf.drain(..used);
                if frame.opcode == 8 {
                    return Answer::Close(frame.close_code());
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let mut chunk = [0u8; 16384];
            match tokio::time::timeout(left, self.tcp.read(&mut chunk)).await {
                Err(_) => return Answer::Silence,
                Ok(Ok(0)) | Ok(Err(_)) => return Answer::Eof,
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }
}
