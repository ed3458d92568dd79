//! WebSocket helpers of the `ws_*` integration tests: [`Ws`], a client over
//! tokio-tungstenite (it answers pings, as browsers do), [`RawWs`], a client
//! over a bare TCP socket that does only what the test tells it (it never
//! answers a ping), and session helpers over HTTP. The server itself is
//! [`crate::Server`] (the real binary, its own port and data directory).

use crate::{Resp, Server};
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::WebSocketStream;

/// The subprotocol gapless speaks.
pub const PROTOCOL: &str = "gapless.v1";
/// How long a test waits for a message it expects.
pub const WAIT: Duration = Duration::from_secs(10);

/// What a [`Ws`] read (pings and pongs are skipped, and counted).
#[derive(Debug)]
pub enum Msg {
    /// A text frame holding JSON.
    Json(Value),
    /// A text frame that is not JSON (never valid from gapless).
    Text(String),
    /// A binary frame (never valid from gapless).
    Binary(Vec<u8>),
    /// A close frame: its code and reason (`None`: a close frame with no code).
    Close(Option<(u16, String)>),
    /// The connection ended without a close frame, or failed.
    Ended(String),
}

/// A refused handshake: the HTTP status and body.
#[derive(Debug)]
pub struct Refused {
    /// HTTP status.
    pub status: u16,
    /// The body as JSON (`Null` if it is not).
    pub json: Value,
}

/// A WebSocket client (tokio-tungstenite): it answers pings while it reads.
#[derive(Debug)]
pub struct Ws {
    inner: WebSocketStream<TcpStream>,
    /// The subprotocol the server selected.
    pub protocol: Option<String>,
    /// Pings received so far.
    pub pings: usize,
    /// A message read ahead (by [`consume`]) that the next read returns.
    unread: Option<Msg>,
    /// The `head` of the `session.resumed` that answered a live attach.
    pub live_after: Option<u64>,
}

impl Ws {
    /// Connects to `path` offering `gapless.v1`; asserts it was selected.
    pub async fn connect(addr: SocketAddr, path: &str) -> Ws {
        let ws = Self::try_connect(addr, path, &[PROTOCOL])
            .await
            .unwrap_or_else(|r| panic!("handshake to {path} refused: {r:?}"));
        assert_eq!(
            ws.protocol.as_deref(),
            Some(PROTOCOL),
            "the server selects {PROTOCOL}"
        );
        ws
    }

    /// Connects to `path` offering `protocols` (none: no header at all).
    pub async fn try_connect(
        addr: SocketAddr,
        path: &str,
        protocols: &[&str],
    ) -> Result<Ws, Refused> {
        Self::try_connect_with(addr, path, protocols, None, &[]).await
    }

    /// Connects to `path` offering `gapless.v1`, with extra request
    /// `headers` (say, `Origin` and `Cookie`, as a browser sends them).
    pub async fn try_connect_headers(
        addr: SocketAddr,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Ws, Refused> {
        Self::try_connect_with(addr, path, &[PROTOCOL], None, headers).await
    }

    /// Connects to `path` offering `gapless.v1` with a small client receive
    /// buffer (which turns off receive autotuning), so a client that stops
    /// reading stalls the server's writes quickly.
    pub async fn connect_small_rcvbuf(addr: SocketAddr, path: &str, rcvbuf: u32) -> Ws {
        Self::try_connect_with(addr, path, &[PROTOCOL], Some(rcvbuf), &[])
            .await
            .unwrap_or_else(|r| panic!("handshake to {path} refused: {r:?}"))
    }

    async fn try_connect_with(
        addr: SocketAddr,
        path: &str,
        protocols: &[&str],
        rcvbuf: Option<u32>,
        headers: &[(&str, &str)],
    ) -> Result<Ws, Refused> {
        let mut req = format!("ws://{addr}{path}")
            .into_client_request()
            .expect("a valid request");
        for (name, value) in headers {
            req.headers_mut().append(
                tungstenite::http::HeaderName::from_bytes(name.as_bytes()).expect("header name"),
                HeaderValue::from_str(value).expect("header value"),
            );
        }
        if !protocols.is_empty() {
            req.headers_mut().insert(
                "sec-websocket-protocol",
                HeaderValue::from_str(&protocols.join(", ")).expect("header value"),
            );
        }
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        if let Some(n) = rcvbuf {
            socket.set_recv_buffer_size(n).expect("SO_RCVBUF");
        }
        let tcp = tokio::time::timeout(WAIT, socket.connect(addr))
            .await
            .expect("TCP connect timed out")
            .expect("TCP connect");
        let res = tokio::time::timeout(WAIT, tokio_tungstenite::client_async(req, tcp))
            .await
            .expect("WebSocket handshake timed out");
        match res {
            Ok((inner, resp)) => Ok(Ws {
                unread: None,
                live_after: None,
                inner,
                protocol: resp
                    .headers()
                    .get("sec-websocket-protocol")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned),
                pings: 0,
            }),
            Err(tungstenite::Error::Http(resp)) => {
                let body = resp.body().clone().unwrap_or_default();
                Err(Refused {
                    status: resp.status().as_u16(),
                    json: serde_json::from_slice(&body).unwrap_or(Value::Null),
                })
            }
            Err(e) => panic!("WebSocket handshake to {path} failed: {e}"),
        }
    }

    /// `/v1/ws` of `server`.
    pub async fn channels(server: &Server) -> Ws {
        Ws::connect(server.addr, "/v1/ws").await
    }

    /// Sends one JSON message.
    pub async fn send(&mut self, v: &Value) {
        self.send_msg(Message::text(v.to_string())).await;
    }

    /// Sends one text frame as is.
    pub async fn send_text(&mut self, s: &str) {
        self.send_msg(Message::text(s.to_owned())).await;
    }

    /// Sends any frame.
    pub async fn send_msg(&mut self, m: Message) {
        tokio::time::timeout(WAIT, self.inner.send(m))
            .await
            .expect("send timed out")
            .expect("send failed");
    }

    /// Sends any frame, reporting failure instead of panicking.
    pub async fn try_send_msg(&mut self, m: Message) -> Result<(), String> {
        match tokio::time::timeout(WAIT, self.inner.send(m)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("send timed out".to_owned()),
        }
    }

    /// The next message within `within` (`None`: nothing came).
    pub async fn recv(&mut self, within: Duration) -> Option<Msg> {
        if let Some(m) = self.unread.take() {
            return Some(m);
        }
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let next = match tokio::time::timeout(left, self.inner.next()).await {
                Err(_) => return None,
                Ok(n) => n,
            };
            return Some(match next {
                None => Msg::Ended("stream ended".to_owned()),
                Some(Err(e)) => Msg::Ended(e.to_string()),
                Some(Ok(Message::Ping(_))) => {
                    self.pings += 1;
                    continue;
                }
                Some(Ok(Message::Pong(_) | Message::Frame(_))) => continue,
                Some(Ok(Message::Text(t))) => match serde_json::from_str(t.as_str()) {
                    Ok(v) => Msg::Json(v),
                    Err(_) => Msg::Text(t.as_str().to_owned()),
                },
                Some(Ok(Message::Binary(b))) => Msg::Binary(b.to_vec()),
                Some(Ok(Message::Close(f))) => {
                    Msg::Close(f.map(|f: CloseFrame| (u16::from(f.code), f.reason.to_string())))
                }
            });
        }
    }

    /// The next JSON message; panics on anything else or after [`WAIT`].
    #[track_caller]
    pub fn json(&mut self) -> impl std::future::Future<Output = Value> + '_ {
        let caller = std::panic::Location::caller();
        async move {
            match self.recv(WAIT).await {
                Some(Msg::Json(v)) => v,
                other => panic!("{caller}: expected a JSON message, got {other:?}"),
            }
        }
    }

    /// The next JSON message, which must have `op`.
    #[track_caller]
    pub fn expect_op<'a>(
        &'a mut self,
        op: &'a str,
    ) -> impl std::future::Future<Output = Value> + 'a {
        let caller = std::panic::Location::caller();
        async move {
            match self.recv(WAIT).await {
                Some(Msg::Json(v)) if v["op"] == op => v,
                other => panic!("{caller}: expected op {op:?}, got {other:?}"),
            }
        }
    }

    /// The next message, which must be a close frame with a code; returns code and reason.
    #[track_caller]
    pub fn expect_close(&mut self) -> impl std::future::Future<Output = (u16, String)> + '_ {
        let caller = std::panic::Location::caller();
        async move {
            match self.recv(WAIT).await {
                Some(Msg::Close(Some(c))) => c,
                other => panic!("{caller}: expected a close frame with a code, got {other:?}"),
            }
        }
    }

    /// Asserts that no message (other than pings) arrives for `dur`.
    #[track_caller]
    pub fn expect_quiet(&mut self, dur: Duration) -> impl std::future::Future<Output = ()> + '_ {
        let caller = std::panic::Location::caller();
        async move {
            if let Some(m) = self.recv(dur).await {
                panic!("{caller}: expected nothing for {dur:?}, got {m:?}");
            }
        }
    }

    /// Sends `subscribe` with `extra` fields merged in (e.g. `{"cursor": …}`).
    pub async fn subscribe(&mut self, id: Value, channel: &str, extra: Value) {
        let mut m = json!({"op": "subscribe", "id": id, "channel": channel});
        if let (Some(o), Some(e)) = (m.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                o.insert(k.clone(), v.clone());
            }
        }
        self.send(&m).await;
    }

    /// Subscribes live and waits for the `subscribed` reply.
    pub async fn subscribe_live(&mut self, channel: &str) -> Value {
        self.subscribe(json!(channel), channel, json!({})).await;
        let r = self.expect_op("subscribed").await;
        assert_eq!(r["channel"], channel);
        r
    }

    /// Reads messages until an event of `channel` with seq `>= seq`; returns every
    /// message read (all ops, pings excluded). Panics on a close or after `within`.
    pub async fn read_until_seq(
        &mut self,
        channel: &str,
        seq: u64,
        within: Duration,
    ) -> Vec<Value> {
        let deadline = Instant::now() + within;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.recv(left).await {
                Some(Msg::Json(v)) => {
                    let done = v["op"] == "event"
                        && v["channel"] == channel
                        && v["seq"].as_u64().is_some_and(|s| s >= seq);
                    out.push(v);
                    if done {
                        return out;
                    }
                }
                other => panic!(
                    "waiting for seq {seq} on {channel} after {} messages (last: {:?}): got {other:?}",
                    out.len(),
                    out.last()
                ),
            }
        }
    }

    /// Sends a normal close and waits (briefly) for the server's answer.
    pub async fn close(mut self) {
        let _ = self.inner.close(None).await;
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let Some(Ok(_)) = self.inner.next().await {}
        })
        .await;
    }
}

/// Seqs of the `event` messages of `channel` among `msgs`.
pub fn seqs(msgs: &[Value], channel: &str) -> Vec<u64> {
    msgs.iter()
        .filter(|m| m["op"] == "event" && m["channel"] == channel)
        .map(|m| m["seq"].as_u64().expect("seq"))
        .collect()
}

/// Data of the `event` messages of `channel` among `msgs`.
pub fn datas(msgs: &[Value], channel: &str) -> Vec<String> {
    msgs.iter()
        .filter(|m| m["op"] == "event" && m["channel"] == channel)
        .map(|m| m["data"].as_str().expect("data").to_owned())
        .collect()
}

/// The ops of `msgs`, in order.
pub fn ops(msgs: &[Value]) -> Vec<String> {
    msgs.iter()
        .map(|m| m["op"].as_str().unwrap_or("?").to_owned())
        .collect()
}

/// Asserts the shape of an error message: `op: error`, `code`, a non-empty message.
#[track_caller]
pub fn assert_error(v: &Value, code: &str) {
    assert_eq!(v["op"], "error", "an error message: {v}");
    assert_eq!(v["code"], code, "error code: {v}");
    assert!(
        v["message"].as_str().is_some_and(|m| !m.is_empty()),
        "an error names the problem: {v}"
    );
}

// ---- raw frames over TCP ----

/// One frame read by [`RawWs`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The opcode (1 text, 2 binary, 8 close, 9 ping, 10 pong).
    pub opcode: u8,
    /// The payload (unmasked).
    pub payload: Vec<u8>,
}

impl Frame {
    /// A close frame's code.
    pub fn close_code(&self) -> Option<u16> {
        (self.opcode == 8 && self.payload.len() >= 2)
            .then(|| u16::from_be_bytes([self.payload[0], self.payload[1]]))
    }
}

/// A WebSocket client over a bare TCP socket: it writes only what the test
/// sends, so it never answers a ping.
#[derive(Debug)]
pub struct RawWs {
    tcp: TcpStream,
    buf: Vec<u8>,
}

/// The answer to a raw handshake.
#[derive(Debug)]
pub struct RawHandshake {
    /// HTTP status.
    pub status: u16,
    /// The response head, as text.
    pub head: String,
    /// The body read so far (for refusals).
    pub body: String,
}

impl RawWs {
    /// Sends an upgrade request for `path` with `extra` header lines; reads the
    /// response head. On 101 returns the open socket too.
    pub async fn handshake(
        addr: SocketAddr,
        path: &str,
        extra: &[(&str, &str)],
    ) -> (RawHandshake, Option<RawWs>) {
        let tcp = TcpStream::connect(addr).await.expect("TCP connect");
        Self::handshake_on(tcp, addr, path, extra).await
    }

    /// Opens `path` offering `gapless.v1` from a socket with a small receive
    /// buffer (`rcvbuf` bytes, which turns off receive autotuning, so the
    /// server's writes wait as soon as the client stops reading), bound to
    /// `from` if given; asserts the upgrade.
    pub async fn connect_small_rcvbuf(
        addr: SocketAddr,
        path: &str,
        rcvbuf: u32,
        from: Option<std::net::IpAddr>,
    ) -> RawWs {
        let sock = tokio::net::TcpSocket::new_v4().expect("socket");
        sock.set_recv_buffer_size(rcvbuf).expect("SO_RCVBUF");
        if let Some(ip) = from {
            sock.bind(SocketAddr::new(ip, 0)).expect("bind");
        }
        let tcp = tokio::time::timeout(WAIT, sock.connect(addr))
            .await
            .expect("TCP connect timed out")
            .expect("TCP connect");
        let (hs, ws) =
            Self::handshake_on(tcp, addr, path, &[("Sec-WebSocket-Protocol", PROTOCOL)]).await;
        assert_eq!(hs.status, 101, "upgrade: {hs:?}");
        ws.expect("upgraded")
    }

    async fn handshake_on(
        mut tcp: TcpStream,
        addr: SocketAddr,
        path: &str,
        extra: &[(&str, &str)],
    ) -> (RawHandshake, Option<RawWs>) {
        let mut req = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        );
        for (k, v) in extra {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        tcp.write_all(req.as_bytes())
            .await
            .expect("write handshake");
        let mut buf = Vec::new();
        let deadline = Instant::now() + WAIT;
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let mut chunk = [0u8; 4096];
            let left = deadline.saturating_duration_since(Instant::now());
            let n = tokio::time::timeout(left, tcp.read(&mut chunk))
                .await
                .expect("handshake response timed out")
                .expect("reading the handshake response");
            assert!(n > 0, "connection closed during the handshake: {buf:?}");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line: {head:?}"));
        let rest = buf[head_end..].to_vec();
        if status == 101 {
            (
                RawHandshake {
                    status,
                    head,
                    body: String::new(),
                },
                Some(RawWs { tcp, buf: rest }),
            )
        } else {
            // Read a little of the body (error answers are small).
            let mut body = rest;
            let want = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            while body.len() < want {
                let mut chunk = [0u8; 4096];
                match tokio::time::timeout(Duration::from_secs(2), tcp.read(&mut chunk)).await {
                    Ok(Ok(n)) if n > 0 => body.extend_from_slice(&chunk[..n]),
                    _ => break,
                }
            }
            (
                RawHandshake {
                    status,
                    head,
                    body: String::from_utf8_lossy(&body).into_owned(),
                },
                None,
            )
        }
    }

    /// The client's own address (to single out its packets).
    #[allow(dead_code)]
    pub fn local_addr(&self) -> SocketAddr {
        self.tcp
            .local_addr()
            .expect("a connected socket has an address")
    }

    /// Opens `path` offering `gapless.v1`; asserts the upgrade.
    pub async fn connect(addr: SocketAddr, path: &str) -> RawWs {
        let (hs, ws) = Self::handshake(addr, path, &[("Sec-WebSocket-Protocol", PROTOCOL)]).await;
        assert_eq!(hs.status, 101, "upgrade: {hs:?}");
        ws.expect("upgraded")
    }

    /// The next frame within `within`: `Ok(None)` on timeout, `Err` when the
    /// connection ended (with the reason).
    pub async fn read_frame(&mut self, within: Duration) -> Result<Option<Frame>, String> {
        let deadline = Instant::now() + within;
        loop {
            if let Some((frame, used)) = parse_frame(&self.buf) {
                self.buf.drain(..used);
                return Ok(Some(frame));
            }
            let mut chunk = [0u8; 16384];
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.tcp.read(&mut chunk)).await {
                Err(_) => return Ok(None),
                Ok(Ok(0)) => return Err("connection closed (EOF)".to_owned()),
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
                Ok(Err(e)) => return Err(format!("read error: {e}")),
            }
        }
    }

    /// Writes one masked frame (FIN set).
    pub async fn write_frame(&mut self, opcode: u8, payload: &[u8]) {
        let out = masked_frame(0x80 | opcode, payload);
        self.tcp.write_all(&out).await.expect("write frame");
    }

    /// Writes one masked frame unless the socket stays full for `within`
    /// (the server stopped reading): whether it was written whole.
    pub async fn try_write_frame(&mut self, opcode: u8, payload: &[u8], within: Duration) -> bool {
        let frame = masked_frame(0x80 | opcode, payload);
        matches!(
            tokio::time::timeout(within, self.tcp.write_all(&frame)).await,
            Ok(Ok(()))
        )
    }

    /// The next frame other than a ping or pong within `within`, answering
    /// each ping on the way, as a live client does: `Ok(None)` on timeout.
    pub async fn next_answering_pings(
        &mut self,
        within: Duration,
    ) -> Result<Option<Frame>, String> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.read_frame(left).await? {
                Some(f) if f.opcode == 9 => self
                    .tcp
                    .write_all(&masked_frame(0x80 | 10, &f.payload))
                    .await
                    .map_err(|e| format!("pong: {e}"))?,
                Some(f) if f.opcode == 10 => {}
                other => return Ok(other),
            }
        }
    }

    /// Reads about `rate` bytes a second for `time` (a quarter second's
    /// share, then a quarter-second pause) like a live client that is slow:
    /// a ping is answered with a pong as soon as it has been read (behind
    /// whatever came before it). Returns the other frames read whole, in
    /// order; panics if the connection ends.
    pub async fn read_slowly(&mut self, rate: usize, time: Duration) -> Vec<Frame> {
        let t0 = Instant::now();
        let mut frames = Vec::new();
        let mut chunk = vec![0u8; (rate / 4).max(1)];
        while t0.elapsed() < time {
            let n = match self.tcp.read(&mut chunk).await {
                Ok(0) => panic!("the server closed a slow reader after {:?}", t0.elapsed()),
                Ok(n) => n,
                Err(e) => panic!("a slow reader was cut after {:?}: {e}", t0.elapsed()),
            };
            self.buf.extend_from_slice(&chunk[..n]);
            while let Some((frame, used)) = parse_frame(&self.buf) {
                self.buf.drain(..used);
                match frame.opcode {
                    9 => {
                        let pong = masked_frame(0x80 | 10, &frame.payload);
                        self.tcp.write_all(&pong).await.expect("pong");
                    }
                    8 => panic!(
                        "the server closed a slow reader after {:?}: {:?}",
                        t0.elapsed(),
                        frame.close_code()
                    ),
                    _ => frames.push(frame),
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        frames
    }
}

/// One client frame: `first` is its first byte (FIN, RSV bits, opcode), then
/// the length in its shortest form, a mask, and `payload` masked with it.
pub fn masked_frame(first: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x5au8, 0x17, 0xc3, 0x08];
    let mut out = vec![first];
    let n = payload.len();
    if n < 126 {
        out.push(0x80 | n as u8);
    } else if n <= 0xffff {
        out.push(0x80 | 126);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0x80 | 127);
        out.extend_from_slice(&(n as u64).to_be_bytes());
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    out
}

/// Parses one frame from the front of `b` (unmasking a masked one): the
/// frame and the bytes it took, or `None` until it is whole.
pub fn parse_frame(b: &[u8]) -> Option<(Frame, usize)> {
    if b.len() < 2 {
        return None;
    }
    let opcode = b[0] & 0x0f;
    let masked = b[1] & 0x80 != 0;
    let (len, mut at) = match b[1] & 0x7f {
        126 => {
            if b.len() < 4 {
                return None;
            }
            (u64::from(u16::from_be_bytes([b[2], b[3]])), 4)
        }
        127 => {
            if b.len() < 10 {
                return None;
            }
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[2..10]);
            (u64::from_be_bytes(a), 10)
        }
        n => (u64::from(n), 2),
    };
    let mask = if masked {
        if b.len() < at + 4 {
            return None;
        }
        let m = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        at += 4;
        Some(m)
    } else {
        None
    };
    let len = usize::try_from(len).ok()?;
    if b.len() < at + len {
        return None;
    }
    let mut payload = b[at..at + len].to_vec();
    if let Some(m) = mask {
        for (i, x) in payload.iter_mut().enumerate() {
            *x ^= m[i % 4];
        }
    }
    Some((Frame { opcode, payload }, at + len))
}

// ---- sessions over HTTP ----

/// `POST /v1/sessions` with `id` (or an empty body); returns the answer.
pub async fn create_session(server: &Server, id: Option<&str>) -> Resp {
    let body = match id {
        Some(id) => json!({ "id": id }).to_string(),
        None => String::new(),
    };
    server.post("/v1/sessions", body, &[]).await
}

/// Creates the session `id`, asserting 201.
pub async fn new_session(server: &Server, id: &str) -> String {
    let r = create_session(server, Some(id)).await;
    r.expect(201);
    id.to_owned()
}

/// `POST /v1/sessions/{id}/events` with `data`.
pub async fn append(server: &Server, id: &str, data: &str) -> Resp {
    server
        .post(&format!("/v1/sessions/{id}/events"), data.to_owned(), &[])
        .await
}

/// Appends `data`, asserting 201; returns the seq.
pub async fn append_ok(server: &Server, id: &str, data: &str) -> u64 {
    let r = append(server, id, data).await;
    r.expect(201)["seq"].as_u64().expect("seq")
}

/// `POST /v1/sessions/{id}/{action}` (`complete` or `cancel`).
pub async fn end_session(server: &Server, id: &str, action: &str) -> Resp {
    server
        .post(&format!("/v1/sessions/{id}/{action}"), String::new(), &[])
        .await
}

/// `GET /v1/sessions/{id}`.
pub async fn session_info(server: &Server, id: &str) -> Resp {
    server.get(&format!("/v1/sessions/{id}")).await
}

/// Opens the consumer socket of session `id` with `query` (without `?`).
/// A live attach (no `last_seq`) is answered first with `session.resumed`
/// (0 replayed, and the `head` it continues after, kept in
/// [`Ws::live_after`]); this checks and consumes it. A refusal (an `error`
/// first) is left for the test to read.
pub async fn consume(server: &Server, id: &str, query: &str) -> Ws {
    let mut ws = Ws::connect(server.addr, &consumer_path(id, query)).await;
    if !query.contains("last_seq") {
        match ws.recv(WAIT).await {
            Some(Msg::Json(v)) if v["op"] == "session.resumed" => {
                assert_eq!(
                    v["replayed_events"], 0,
                    "a live attach replays nothing: {v}"
                );
                assert_eq!(v["session"], id, "{v}");
                ws.live_after = Some(v["head"].as_u64().expect("session.resumed has a head"));
            }
            other => ws.unread = other,
        }
    }
    ws
}

/// `/v1/sessions/{id}/ws[?query]`.
pub fn consumer_path(id: &str, query: &str) -> String {
    if query.is_empty() {
        format!("/v1/sessions/{id}/ws")
    } else {
        format!("/v1/sessions/{id}/ws?{query}")
    }
}
