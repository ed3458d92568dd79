//! Just enough HTTP/1.1 for a load generator, over a plain `TcpStream`:
//! URL templates, keep-alive request/response for publishers and history
//! readers, and a streaming body decoder (chunked, sized or until close) that
//! hands SSE bytes to the parser without copying them.
//!
//! Only `http://` on loopback is supported: the harness never leaves the
//! machine.

use anyhow::{anyhow, bail, Context, Result};
use std::net::{SocketAddr, ToSocketAddrs};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest response head accepted, in bytes.
const MAX_HEAD: usize = 16 * 1024;

/// A URL template: `http://HOST:PORT/path` where the path may hold
/// `{channel}` (and, for history, `{limit}`).
#[derive(Debug, Clone)]
pub(crate) struct UrlTemplate {
    /// Where to connect.
    pub addr: SocketAddr,
    /// The `Host` header value.
    pub host: String,
    /// The path and query, with placeholders.
    pub path: String,
}

impl UrlTemplate {
    /// Parses `http://host:port/path…`.
    ///
    /// # Errors
    /// When the URL is not `http://`, has no path, or the host does not resolve.
    pub(crate) fn parse(url: &str) -> Result<Self> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| anyhow!("{url}: only http:// URLs are supported"))?;
        let slash = rest
            .find('/')
            .ok_or_else(|| anyhow!("{url}: the URL needs a path"))?;
        let (host, path) = rest.split_at(slash);
        let addr = host
            .to_socket_addrs()
            .with_context(|| format!("{url}: cannot resolve {host}"))?
            .next()
            .ok_or_else(|| anyhow!("{url}: {host} resolves to nothing"))?;
        Ok(UrlTemplate {
            addr,
            host: host.to_owned(),
            path: path.to_owned(),
        })
    }

    /// The path for one channel (and page size).
    pub(crate) fn path_for(&self, channel: &str, limit: usize) -> String {
        self.path
            .replace("{channel}", channel)
            .replace("{limit}", &limit.to_string())
    }
}

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked(ChunkState),
    UntilClose,
}

/// Position inside a chunked body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    Size { n: u64, digits: u8, ext: bool },
    SizeLf { n: u64 },
    Data { left: u64 },
    DataCr,
    DataLf,
    TrailerStart,
    TrailerLine,
    TrailerLf,
}

/// Decodes one response body incrementally.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyDecoder {
    framing: Framing,
    done: bool,
}

impl BodyDecoder {
    /// True once the body's end was seen (never for an until-close body).
    pub(crate) fn done(&self) -> bool {
        self.done
    }

    /// The connection ended: fine only for an until-close body.
    pub(crate) fn eof_ok(&self) -> bool {
        self.done || self.framing == Framing::UntilClose
    }

    /// Decodes `input`, passing body bytes to `out`; returns how many input
    /// bytes belonged to this body (all of them unless it ended inside).
    ///
    /// # Errors
    /// A malformed chunk header.
    pub(crate) fn decode<'a>(
        &mut self,
        input: &'a [u8],
        out: &mut impl FnMut(&'a [u8]),
    ) -> Result<usize> {
        if self.done {
            return Ok(0);
        }
        match &mut self.framing {
            Framing::UntilClose => {
                if !input.is_empty() {
                    out(input);
                }
                Ok(input.len())
            }
            Framing::Length(left) => {
                let take = usize::try_from(*left)
                    .unwrap_or(usize::MAX)
                    .min(input.len());
                if take > 0 {
                    out(&input[..take]);
                }
                *left -= take as u64;
                if *left == 0 {
                    self.done = true;
                }
                Ok(take)
            }
            Framing::Chunked(state) => {
                let mut i = 0;
                while i < input.len() {
                    if let ChunkState::Data { left } = state {
                        let take = usize::try_from(*left)
                            .unwrap_or(usize::MAX)
                            .min(input.len() - i);
                        out(&input[i..i + take]);
                        i += take;
                        *left -= take as u64;
                        if *left == 0 {
                            *state = ChunkState::DataCr;
                        }
                        continue;
                    }
                    let b = input[i];
                    i += 1;
                    *state = match *state {
                        ChunkState::Size { n, digits, ext } => match b {
                            b'\r' => ChunkState::SizeLf { n },
                            b'\n' => after_size(n),
                            _ if ext => ChunkState::Size { n, digits, ext },
                            b';' | b' ' | b'\t' => ChunkState::Size {
                                n,
                                digits,
                                ext: true,
                            },
                            _ => {
                                let v = (b as char)
                                    .to_digit(16)
                                    .ok_or_else(|| anyhow!("bad chunk size byte {b:#x}"))?;
                                if digits >= 15 {
                                    bail!("chunk size too large");
                                }
                                ChunkState::Size {
                                    n: n * 16 + u64::from(v),
                                    digits: digits + 1,
                                    ext,
                                }
                            }
                        },
                        ChunkState::SizeLf { n } if b == b'\n' => after_size(n),
                        ChunkState::SizeLf { .. } => bail!("chunk size line without LF"),
                        ChunkState::DataCr if b == b'\r' => ChunkState::DataLf,
                        ChunkState::DataCr | ChunkState::DataLf if b == b'\n' => ChunkState::Size {
                            n: 0,
                            digits: 0,
                            ext: false,
                        },
                        ChunkState::DataCr | ChunkState::DataLf => {
                            bail!("chunk data not followed by CRLF")
                        }
                        ChunkState::TrailerStart if b == b'\r' => ChunkState::TrailerLf,
                        ChunkState::TrailerStart | ChunkState::TrailerLf if b == b'\n' => {
                            self.done = true;
                            return Ok(i);
                        }
                        ChunkState::TrailerStart | ChunkState::TrailerLine => {
                            if b == b'\n' {
                                ChunkState::TrailerStart
                            } else {
                                ChunkState::TrailerLine
                            }
                        }
                        ChunkState::TrailerLf => bail!("bad chunked trailer"),
                        ChunkState::Data { .. } => unreachable_state()?,
                    };
                }
                Ok(i)
            }
        }
    }
}

fn after_size(n: u64) -> ChunkState {
    if n == 0 {
        ChunkState::TrailerStart
    } else {
        ChunkState::Data { left: n }
    }
}

fn unreachable_state() -> Result<ChunkState> {
    bail!("chunk decoder reached an impossible state")
}

/// A response head.
#[derive(Debug)]
pub(crate) struct Head {
    /// The status code.
    pub status: u16,
    /// The body's decoder.
    pub body: BodyDecoder,
    /// The server asked to close the connection after this response.
    pub close: bool,
    /// Durable Streams: the `Stream-Next-Offset` header.
    pub next_offset: Option<String>,
    /// Durable Streams: `Stream-Up-To-Date: true`.
    pub up_to_date: bool,
}

/// What [`Client::call_full`] learned besides the body.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The status code.
    pub status: u16,
    /// Durable Streams: the `Stream-Next-Offset` header.
    pub next_offset: Option<String>,
    /// Durable Streams: `Stream-Up-To-Date: true`.
    pub up_to_date: bool,
}

/// One client connection with its read buffer.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Conn {
    /// Connects with a read buffer of `buf_size` bytes (at least 4 KiB).
    ///
    /// # Errors
    /// The connect failed.
    pub(crate) async fn connect(addr: SocketAddr, buf_size: usize) -> Result<Self> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connect to {addr}"))?;
        stream.set_nodelay(true).context("TCP_NODELAY")?;
        Ok(Conn {
            stream,
            buf: vec![0; buf_size.max(4096)],
            start: 0,
            end: 0,
        })
    }

    /// Writes a whole request.
    ///
    /// # Errors
    /// The write failed.
    pub(crate) async fn send(&mut self, request: &[u8]) -> Result<()> {
        self.stream
            .write_all(request)
            .await
            .context("write request")
    }

    /// Reads more bytes into the buffer; returns 0 at end of stream.
    async fn fill(&mut self) -> Result<usize> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            bail!("a response head or WebSocket frame larger than the read buffer (--read-buffer)");
        }
        let n = self
            .stream
            .read(&mut self.buf[self.end..])
            .await
            .context("read")?;
        self.end += n;
        Ok(n)
    }

    /// Reads a response head.
    ///
    /// # Errors
    /// The connection closed or the head is malformed.
    pub(crate) async fn read_head(&mut self) -> Result<Head> {
        loop {
            let avail = &self.buf[self.start..self.end];
            if let Some(pos) = memchr::memmem::find(avail, b"\r\n\r\n") {
                let mut headers = [httparse::EMPTY_HEADER; 32];
                let mut resp = httparse::Response::new(&mut headers);
                let parsed = resp
                    .parse(&avail[..pos + 4])
                    .context("malformed response head")?;
                if parsed.is_partial() {
                    bail!("incomplete response head");
                }
                let status = resp.code.unwrap_or(0);
                let mut framing = Framing::UntilClose;
                let mut close = false;
                let (mut next_offset, mut up_to_date) = (None, false);
                for h in resp.headers.iter() {
                    if h.name.eq_ignore_ascii_case("content-length") {
                        let v = std::str::from_utf8(h.value)
                            .ok()
                            .and_then(|s| s.trim().parse::<u64>().ok())
                            .ok_or_else(|| anyhow!("bad Content-Length"))?;
                        if !matches!(framing, Framing::Chunked(_)) {
                            framing = Framing::Length(v);
                        }
                    } else if h.name.eq_ignore_ascii_case("transfer-encoding")
                        && memchr::memmem::find(&h.value.to_ascii_lowercase(), b"chunked").is_some()
                    {
                        framing = Framing::Chunked(ChunkState::Size {
                            n: 0,
                            digits: 0,
                            ext: false,
                        });
                    } else if h.name.eq_ignore_ascii_case("connection")
                        && h.value.eq_ignore_ascii_case(b"close")
                    {
                        close = true;
                    } else if h.name.eq_ignore_ascii_case("stream-next-offset") {
                        next_offset = Some(String::from_utf8_lossy(h.value).trim().to_owned());
                    } else if h.name.eq_ignore_ascii_case("stream-up-to-date") {
                        up_to_date = h.value.trim_ascii().eq_ignore_ascii_case(b"true");
                    }
                }
                // 204 and 304 answers have no body, whatever their headers say (RFC 9112 6.3).
                if matches!(status, 204 | 304) {
                    framing = Framing::Length(0);
                }
                let done = framing == Framing::Length(0);
                self.start += pos + 4;
                return Ok(Head {
                    status,
                    body: BodyDecoder { framing, done },
                    close,
                    next_offset,
                    up_to_date,
                });
            }
            if avail.len() >= MAX_HEAD {
                bail!("response head over {MAX_HEAD} bytes");
            }
            if self.fill().await? == 0 {
                bail!("connection closed before the response head");
            }
        }
    }

    /// Reads the rest of a body into `out` (appending).
    ///
    /// # Errors
    /// The connection failed or closed early, or the body is malformed.
    pub(crate) async fn read_body(
        &mut self,
        body: &mut BodyDecoder,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        loop {
            let used = body.decode(&self.buf[self.start..self.end], &mut |piece| {
                out.extend_from_slice(piece);
            })?;
            self.start += used;
            if body.done() {
                return Ok(());
            }
            if self.fill().await? == 0 {
                if body.eof_ok() {
                    return Ok(());
                }
                bail!("connection closed inside a response body");
            }
        }
    }

    /// Streams a body: decodes whatever is buffered, then waits for more.
    /// Returns false once the body or the connection ended.
    ///
    /// # Errors
    /// The read failed or the body is malformed.
    pub(crate) async fn stream_body(
        &mut self,
        body: &mut BodyDecoder,
        out: &mut impl FnMut(&[u8]),
    ) -> Result<bool> {
        if self.start == self.end && self.fill().await? == 0 {
            return Ok(false);
        }
        let used = body.decode(&self.buf[self.start..self.end], out)?;
        self.start += used;
        if body.done() {
            return Ok(false);
        }
        // Anything left after the body's end is ignored; the stream is over.
        Ok(true)
    }
}

impl Conn {
    /// Reads raw bytes after a response head (a WebSocket's frames): calls `take` with
    /// every byte buffered and not yet taken, and moves past the count it returns; waits
    /// for more bytes when nothing is buffered or `take` took nothing (an incomplete
    /// frame). Returns false at end of stream.
    ///
    /// # Errors
    /// The read failed, `take` failed, or an incomplete frame fills the whole buffer.
    pub(crate) async fn read_raw(
        &mut self,
        take: &mut impl FnMut(&[u8]) -> Result<usize>,
    ) -> Result<bool> {
        loop {
            if self.start < self.end {
                let used = take(&self.buf[self.start..self.end])?;
                self.start += used.min(self.end - self.start);
                if used > 0 {
                    return Ok(true);
                }
            }
            if self.fill().await? == 0 {
                return Ok(false);
            }
        }
    }
}

/// Builds a request with an optional body.
pub(crate) fn request(
    method: &str,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Vec<u8> {
    let mut r = Vec::with_capacity(128 + path.len() + body.len());
    r.extend_from_slice(method.as_bytes());
    r.push(b' ');
    r.extend_from_slice(path.as_bytes());
    r.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    r.extend_from_slice(host.as_bytes());
    r.extend_from_slice(b"\r\n");
    for (k, v) in headers {
        r.extend_from_slice(k.as_bytes());
        r.extend_from_slice(b": ");
        r.extend_from_slice(v.as_bytes());
        r.extend_from_slice(b"\r\n");
    }
    if method != "GET" {
        r.extend_from_slice(b"Content-Length: ");
        r.extend_from_slice(body.len().to_string().as_bytes());
        r.extend_from_slice(b"\r\n");
    }
    r.extend_from_slice(b"\r\n");
    r.extend_from_slice(body);
    r
}

/// A keep-alive client for request/response traffic (publishing, history):
/// reconnects when the server closed the previous connection.
#[derive(Debug)]
pub(crate) struct Client {
    addr: SocketAddr,
    conn: Option<Conn>,
}

impl Client {
    /// A client that connects on first use.
    pub(crate) fn new(addr: SocketAddr) -> Self {
        Client { addr, conn: None }
    }

    /// Sends `request` and reads the answer's body into `body` (cleared first);
    /// returns the status.
    ///
    /// # Errors
    /// Connect, write or read failures, or a malformed answer.
    pub(crate) async fn call(&mut self, request: &[u8], body: &mut Vec<u8>) -> Result<u16> {
        Ok(self.call_full(request, body).await?.status)
    }

    /// [`Client::call`], also returning the Durable Streams headers of the answer.
    ///
    /// # Errors
    /// Connect, write or read failures, or a malformed answer.
    pub(crate) async fn call_full(&mut self, request: &[u8], body: &mut Vec<u8>) -> Result<Answer> {
        self.exchange(request, body, false).await
    }

    /// Sends a `HEAD` request (built by [`request`]) and reads its answer, which has no
    /// body whatever its `Content-Length` says (RFC 9110 9.3.2).
    ///
    /// # Errors
    /// Connect, write or read failures, or a malformed answer.
    pub(crate) async fn head(&mut self, request: &[u8]) -> Result<Answer> {
        let mut body = Vec::new();
        self.exchange(request, &mut body, true).await
    }

    async fn exchange(
        &mut self,
        request: &[u8],
        body: &mut Vec<u8>,
        no_body: bool,
    ) -> Result<Answer> {
        body.clear();
        let conn = match &mut self.conn {
            Some(c) => c,
            None => self.conn.insert(Conn::connect(self.addr, 16 * 1024).await?),
        };
        let result = async {
            conn.send(request).await?;
            let mut head = conn.read_head().await?;
            if no_body {
                head.body = BodyDecoder {
                    framing: Framing::Length(0),
                    done: true,
                };
            }
            conn.read_body(&mut head.body, body).await?;
            let close = head.close || !head.body.done();
            let answer = Answer {
                status: head.status,
                next_offset: head.next_offset,
                up_to_date: head.up_to_date,
            };
            Ok::<_, anyhow::Error>((answer, close))
        }
        .await;
        match result {
            Ok((answer, close)) => {
                if close {
                    self.conn = None;
                }
                Ok(answer)
            }
            Err(e) => {
                self.conn = None;
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(framing: Framing, chunks: &[&[u8]]) -> (Vec<u8>, bool, usize) {
        let mut d = BodyDecoder {
            framing,
            done: false,
        };
        let mut out = Vec::new();
        let mut used = 0;
        for c in chunks {
            used += d
                .decode(c, &mut |p: &[u8]| out.extend_from_slice(p))
                .expect("valid body");
        }
        (out, d.done(), used)
    }

    fn chunked() -> Framing {
        Framing::Chunked(ChunkState::Size {
            n: 0,
            digits: 0,
            ext: false,
        })
    }

    #[test]
    fn chunked_body_split_anywhere() {
        let body = b"5\r\nhello\r\nb;ext=1\r\n world!!!!!\r\n0\r\n\r\nNEXT";
        for split in 0..body.len() {
            let (out, done, used) = decode_all(chunked(), &[&body[..split], &body[split..]]);
            assert_eq!(out, b"hello world!!!!!", "split at {split}");
            assert!(done);
            assert_eq!(used, body.len() - 4);
        }
    }

    #[test]
    fn chunked_trailer_and_bad_size() {
        let (out, done, _) = decode_all(chunked(), &[b"3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n"]);
        assert_eq!(out, b"abc");
        assert!(done);
        let mut d = BodyDecoder {
            framing: chunked(),
            done: false,
        };
        assert!(d.decode(b"zz\r\n", &mut |_| {}).is_err());
    }

    #[test]
    fn sized_body_stops_at_length() {
        let (out, done, used) = decode_all(Framing::Length(3), &[b"ab", b"cdef"]);
        assert_eq!(out, b"abc");
        assert!(done);
        assert_eq!(used, 3);
    }

    #[test]
    fn template_paths() {
        let t = UrlTemplate::parse("http://127.0.0.1:9/v1/channels/{channel}/events?limit={limit}")
            .expect("valid url");
        assert_eq!(t.host, "127.0.0.1:9");
        assert_eq!(t.path_for("c1", 50), "/v1/channels/c1/events?limit=50");
        assert!(UrlTemplate::parse("https://x/").is_err());
    }
}
