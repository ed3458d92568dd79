//! A small SSE test client over a raw TCP socket, with its own parser.
//!
//! The client writes the GET request itself (so a test can send any header
//! bytes, including non-UTF-8 ones), decodes `Transfer-Encoding: chunked` or a
//! `Content-Length` body, and feeds the body to [`Parser`], an implementation
//! of WHATWG HTML "Interpreting an event stream" (9.2.6) that is independent of
//! the server's encoder. Besides the events the spec dispatches, the parser
//! reports `retry:` fields, comments and id-only frames (which set the last
//! event ID without firing an event) so tests can assert on a stream's prefix.

use serde_json::Value;
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// How long a read waits before a test fails, unless told otherwise.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The value of the `id:` field of this event's block, if it had one.
    pub id: Option<String>,
    /// The client's last event ID after this event (what a reconnect would send).
    pub last_event_id: String,
    /// The event type (`message` when the block had no `event:` field).
    pub event: String,
    /// The data: `data:` lines joined with LF.
    pub data: String,
}

impl Event {
    /// The data parsed as JSON (for gap notices and envelopes).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("event data is not JSON ({e}): {:?}", self.data))
    }

    /// True for a gap notice.
    pub fn is_gap(&self) -> bool {
        self.event == "gap"
    }
}

/// What the parser reports, in stream order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// A `retry:` field with a valid value.
    Retry(u64),
    /// A comment line (the text after the colon).
    Comment(String),
    /// A block with an `id:` field and no data: sets the last event ID, fires nothing.
    IdOnly(String),
    /// A dispatched event.
    Event(Event),
}

/// An incremental WHATWG event-stream parser.
#[derive(Debug, Default)]
pub struct Parser {
    line: Vec<u8>,
    after_cr: bool,
    first_line: bool,
    data: String,
    event_type: String,
    id_buffer: String,
    block_id: Option<String>,
    /// The last event ID string (updated at each dispatch).
    pub last_event_id: String,
    /// The last valid `retry:` value seen.
    pub retry: Option<u64>,
    out: VecDeque<Item>,
}

impl Parser {
    /// A fresh parser.
    pub fn new() -> Self {
        Parser {
            first_line: true,
            ..Parser::default()
        }
    }

    /// Feeds bytes; complete items become available from [`Parser::pop`].
    pub fn feed(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        while !rest.is_empty() {
            if self.after_cr {
                // CRLF is one line end.
                self.after_cr = false;
                if rest[0] == b'\n' {
                    rest = &rest[1..];
                    continue;
                }
            }
            match rest.iter().position(|&b| b == b'\r' || b == b'\n') {
                None => {
                    self.line.extend_from_slice(rest);
                    return;
                }
                Some(i) => {
                    self.line.extend_from_slice(&rest[..i]);
                    self.end_line();
                    self.after_cr = rest[i] == b'\r';
                    rest = &rest[i + 1..];
                }
            }
        }
    }

    /// The next complete item.
    pub fn pop(&mut self) -> Option<Item> {
        self.out.pop_front()
    }

    /// Every complete item.
    pub fn drain(&mut self) -> Vec<Item> {
        self.out.drain(..).collect()
    }

    fn end_line(&mut self) {
        let mut line = std::mem::take(&mut self.line);
        if self.first_line {
            self.first_line = false;
            if line.starts_with(&[0xEF, 0xBB, 0xBF]) {
                line.drain(..3);
            }
        }
        let line = String::from_utf8_lossy(&line).into_owned();
        if line.is_empty() {
            self.dispatch();
            return;
        }
        if let Some(comment) = line.strip_prefix(':') {
            self.out.push_back(Item::Comment(comment.to_owned()));
            return;
        }
        let (field, value) = match line.find(':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (line.as_str(), ""),
        };
        match field {
            "event" => self.event_type = value.to_owned(),
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
            }
            // An id containing NUL is ignored.
            "id" if !value.contains('\0') => {
                self.id_buffer = value.to_owned();
                self.block_id = Some(value.to_owned());
            }
            // A retry that is not all ASCII digits is ignored.
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                if let Ok(n) = value.parse() {
                    self.retry = Some(n);
                    self.out.push_back(Item::Retry(n));
                }
            }
            _ => {}
        }
    }

    fn dispatch(&mut self) {
        self.last_event_id = self.id_buffer.clone();
        let block_id = self.block_id.take();
        if self.data.is_empty() {
            self.event_type.clear();
            if let Some(id) = block_id {
                self.out.push_back(Item::IdOnly(id));
            }
            return;
        }
        let mut data = std::mem::take(&mut self.data);
        if data.ends_with('\n') {
            data.pop();
        }
        let event_type = std::mem::take(&mut self.event_type);
        self.out.push_back(Item::Event(Event {
            id: block_id,
            last_event_id: self.last_event_id.clone(),
            event: if event_type.is_empty() {
                "message".to_owned()
            } else {
                event_type
            },
            data,
        }));
    }
}

/// How a response body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// Chunked: waiting for a size line.
    ChunkSize,
    /// Chunked: this many data bytes left in the current chunk.
    ChunkData(usize),
    /// Chunked: the CRLF after a chunk's data.
    ChunkEnd,
    /// `Content-Length`: this many bytes left.
    Length(usize),
    /// No framing: the body ends at EOF.
    UntilEof,
    /// The body ended cleanly.
    Done,
}

/// What a read of the stream gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// A parsed item.
    Item(Item),
    /// The body ended cleanly (terminal chunk, or full length).
    End,
    /// The connection broke before the body ended (reset, EOF mid-body).
    Broken(String),
}

/// A connected SSE (or any GET) response.
#[derive(Debug)]
pub struct SseClient {
    stream: TcpStream,
    buf: Vec<u8>,
    framing: Framing,
    parser: Parser,
    raw: Vec<u8>,
    /// HTTP status.
    pub status: u16,
    /// Response headers, names lower-cased, values lossily decoded.
    pub headers: Vec<(String, String)>,
    ended: Option<Next>,
}

/// Options of [`SseClient::connect_with`].
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    /// `SO_RCVBUF` for the client socket (turns off receive-buffer autotuning,
    /// so a reader that stops reading makes the server block sooner).
    pub recv_buffer: Option<u32>,
}

impl SseClient {
    /// GET `target` (path and query) with extra raw headers.
    pub async fn connect(addr: SocketAddr, target: &str, headers: &[(&str, &[u8])]) -> SseClient {
        Self::connect_with(addr, target, headers, ConnectOptions::default()).await
    }

    /// Like [`SseClient::connect`], with socket options.
    pub async fn connect_with(
        addr: SocketAddr,
        target: &str,
        headers: &[(&str, &[u8])],
        opts: ConnectOptions,
    ) -> SseClient {
        Self::open(addr, None, target, headers, opts).await
    }

    /// Like [`SseClient::connect`], after a GET of `prior` on the same
    /// connection (its answer read whole and dropped): the stream is a later
    /// request of a keep-alive connection, the one hyper serves rather than
    /// the first-request writer (crates/server/src/conn.rs).
    pub async fn connect_after(
        addr: SocketAddr,
        prior: &str,
        target: &str,
        headers: &[(&str, &[u8])],
        opts: ConnectOptions,
    ) -> SseClient {
        Self::open(addr, Some(prior), target, headers, opts).await
    }

    async fn open(
        addr: SocketAddr,
        prior: Option<&str>,
        target: &str,
        headers: &[(&str, &[u8])],
        opts: ConnectOptions,
    ) -> SseClient {
        let fut = async {
            let sock = TcpSocket::new_v4()?;
            if let Some(n) = opts.recv_buffer {
                sock.set_recv_buffer_size(n)?;
            }
            let mut stream = sock.connect(addr).await?;
            if let Some(prior) = prior {
                stream
                    .write_all(format!("GET {prior} HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
                    .await?;
            }
            let mut req = Vec::new();
            req.extend_from_slice(
                format!("GET {target} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n")
                    .as_bytes(),
            );
            for (name, value) in headers {
                req.extend_from_slice(name.as_bytes());
                req.extend_from_slice(b": ");
                req.extend_from_slice(value);
                req.extend_from_slice(b"\r\n");
            }
            req.extend_from_slice(b"\r\n");
            stream.write_all(&req).await?;
            let mut client = SseClient {
                stream,
                buf: Vec::new(),
                framing: Framing::UntilEof,
                parser: Parser::new(),
                raw: Vec::new(),
                status: 0,
                headers: Vec::new(),
                ended: None,
            };
            if prior.is_some() {
                client.read_head().await?;
                while client.body_chunk().await?.is_some() {}
                client.headers.clear();
            }
            client.read_head().await?;
            Ok::<_, io::Error>(client)
        };
        match tokio::time::timeout(READ_TIMEOUT, fut).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => panic!("GET {target}: {e}"),
            Err(_) => panic!("GET {target}: no response head within {READ_TIMEOUT:?}"),
        }
    }

    async fn read_more(&mut self) -> io::Result<usize> {
        let mut tmp = [0u8; 16 * 1024];
        let n = self.stream.read(&mut tmp).await?;
        self.buf.extend_from_slice(&tmp[..n]);
        Ok(n)
    }

    async fn read_head(&mut self) -> io::Result<()> {
        let end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i;
            }
            if self.read_more().await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "EOF in the response head",
                ));
            }
        };
        let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        self.buf.drain(..end + 4);
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        self.status = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad status line {status_line:?}"),
                )
            })?;
        for line in lines {
            if let Some((k, v)) = line.split_once(':') {
                self.headers
                    .push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
            }
        }
        self.framing = if self
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
        {
            Framing::ChunkSize
        } else if let Some(n) = self.header("content-length").and_then(|v| v.parse().ok()) {
            if n == 0 {
                Framing::Done
            } else {
                Framing::Length(n)
            }
        } else {
            Framing::UntilEof
        };
        Ok(())
    }

    /// A response header (first value), by lower-case name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every decoded body byte received so far.
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }

    /// The body received so far as text.
    pub fn raw_text(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }

    /// The last 2000 bytes of the body so far, for failure messages.
    pub fn tail(&self) -> String {
        let from = self.raw.len().saturating_sub(2000);
        String::from_utf8_lossy(&self.raw[from..]).into_owned()
    }

    /// The client's last event ID (what an EventSource would send on reconnect).
    pub fn last_event_id(&self) -> &str {
        &self.parser.last_event_id
    }

    /// Decoded body bytes: `Ok(Some)` data, `Ok(None)` clean end.
    async fn body_chunk(&mut self) -> io::Result<Option<Vec<u8>>> {
        loop {
            match self.framing {
                Framing::Done => return Ok(None),
                Framing::UntilEof => {
                    if !self.buf.is_empty() {
                        return Ok(Some(std::mem::take(&mut self.buf)));
                    }
                    if self.read_more().await? == 0 {
                        self.framing = Framing::Done;
                    }
                }
                Framing::Length(n) => {
                    if !self.buf.is_empty() {
                        let take = n.min(self.buf.len());
                        let out = self.buf[..take].to_vec();
                        self.buf.drain(..take);
                        self.framing = if take == n {
                            Framing::Done
                        } else {
                            Framing::Length(n - take)
                        };
                        return Ok(Some(out));
                    }
                    self.need_more("in a Content-Length body").await?;
                }
                Framing::ChunkSize => {
                    if let Some(i) = find(&self.buf, b"\r\n") {
                        let line = String::from_utf8_lossy(&self.buf[..i]).into_owned();
                        self.buf.drain(..i + 2);
                        let hex = line.split(';').next().unwrap_or("").trim();
                        let size = usize::from_str_radix(hex, 16).map_err(|_| {
                            io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!("bad chunk size line {line:?}"),
                            )
                        })?;
                        if size == 0 {
                            // Trailers, then an empty line.
                            loop {
                                if let Some(j) = find(&self.buf, b"\r\n") {
                                    let empty = j == 0;
                                    self.buf.drain(..j + 2);
                                    if empty {
                                        break;
                                    }
                                } else {
                                    self.need_more("in the chunked trailer").await?;
                                }
                            }
                            self.framing = Framing::Done;
                            return Ok(None);
                        }
                        self.framing = Framing::ChunkData(size);
                    } else {
                        self.need_more("before a chunk size").await?;
                    }
                }
                Framing::ChunkData(n) => {
                    if !self.buf.is_empty() {
                        let take = n.min(self.buf.len());
                        let out = self.buf[..take].to_vec();
                        self.buf.drain(..take);
                        self.framing = if take == n {
                            Framing::ChunkEnd
                        } else {
                            Framing::ChunkData(n - take)
                        };
                        return Ok(Some(out));
                    }
                    self.need_more("inside a chunk").await?;
                }
                Framing::ChunkEnd => {
                    if self.buf.len() >= 2 {
                        if &self.buf[..2] != b"\r\n" {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                "chunk not followed by CRLF",
                            ));
                        }
                        self.buf.drain(..2);
                        self.framing = Framing::ChunkSize;
                    } else {
                        self.need_more("after a chunk").await?;
                    }
                }
            }
        }
    }

    async fn need_more(&mut self, what: &str) -> io::Result<()> {
        if self.read_more().await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("EOF {what}"),
            ));
        }
        Ok(())
    }

    /// The next item, a clean end, or a broken connection; `None` if nothing
    /// arrived within `within`. Cancel-safe between socket reads.
    pub async fn next_within(&mut self, within: Duration) -> Option<Next> {
        if let Some(item) = self.parser.pop() {
            return Some(Next::Item(item));
        }
        if let Some(end) = &self.ended {
            return Some(end.clone());
        }
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let chunk = match tokio::time::timeout_at(deadline, self.body_chunk()).await {
                Err(_) => return None,
                Ok(r) => r,
            };
            match chunk {
                Ok(Some(bytes)) => {
                    self.raw.extend_from_slice(&bytes);
                    self.parser.feed(&bytes);
                    if let Some(item) = self.parser.pop() {
                        return Some(Next::Item(item));
                    }
                }
                Ok(None) => {
                    self.ended = Some(Next::End);
                    return Some(Next::End);
                }
                Err(e) => {
                    let end = Next::Broken(e.to_string());
                    self.ended = Some(end.clone());
                    return Some(end);
                }
            }
        }
    }

    /// The next item; panics at the end of the stream or after [`READ_TIMEOUT`].
    pub async fn next_item(&mut self) -> Item {
        match self.next_within(READ_TIMEOUT).await {
            Some(Next::Item(item)) => item,
            Some(other) => panic!(
                "stream ended ({other:?}) while an item was expected; end of body: {:?}",
                self.tail()
            ),
            None => panic!(
                "no item within {READ_TIMEOUT:?}; end of body: {:?}",
                self.tail()
            ),
        }
    }

    /// The next event (gap notices included), skipping comments, `retry:` and id-only frames.
    pub async fn next_event(&mut self) -> Event {
        loop {
            if let Item::Event(e) = self.next_item().await {
                return e;
            }
        }
    }

    /// The next `n` events.
    pub async fn events(&mut self, n: usize) -> Vec<Event> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.next_event().await);
        }
        out
    }

    /// Reads the start of a stream, asserting its shape: `retry:`, then zero or
    /// more gap notices, then the id-only frame.
    pub async fn preamble(&mut self) -> Preamble {
        assert_eq!(self.status, 200, "SSE status; body: {:?}", self.raw_text());
        let retry = match self.next_item().await {
            Item::Retry(n) => n,
            other => panic!("a stream must start with retry:, got {other:?}"),
        };
        let mut gaps = Vec::new();
        loop {
            match self.next_item().await {
                Item::Event(e) if e.is_gap() => {
                    assert_eq!(e.id, None, "a gap notice has no id line of its own");
                    gaps.push(e.json());
                }
                Item::IdOnly(cursor) => {
                    return Preamble {
                        retry,
                        gaps,
                        cursor,
                    }
                }
                other => panic!("expected gap notices then an id-only frame, got {other:?}"),
            }
        }
    }

    /// Reads the whole (non-streaming) body as JSON.
    pub async fn body_json(&mut self) -> Value {
        let mut body = Vec::new();
        loop {
            match tokio::time::timeout(READ_TIMEOUT, self.body_chunk()).await {
                Ok(Ok(Some(b))) => body.extend_from_slice(&b),
                Ok(Ok(None)) => break,
                Ok(Err(e)) => panic!("reading the body: {e}"),
                Err(_) => panic!("body not complete within {READ_TIMEOUT:?}"),
            }
        }
        self.raw.extend_from_slice(&body);
        serde_json::from_slice(&body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&body)
            )
        })
    }

    /// Reads until the stream ends, returning the items seen; panics if it does
    /// not end within `within`.
    pub async fn until_end(&mut self, within: Duration) -> (Vec<Item>, Next) {
        let deadline = tokio::time::Instant::now() + within;
        let mut items = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next_within(left).await {
                Some(Next::Item(i)) => items.push(i),
                Some(end) => return (items, end),
                None => panic!("stream did not end within {within:?}; items: {items:?}"),
            }
        }
    }
}

/// The start of a stream.
#[derive(Debug, Clone)]
pub struct Preamble {
    /// The `retry:` value.
    pub retry: u64,
    /// Gap notices, as JSON.
    pub gaps: Vec<Value>,
    /// The cursor of the id-only frame.
    pub cursor: String,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
