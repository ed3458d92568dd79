//! Requests answered whole without hyper or the router: the quick loop of
//! a keep-alive connection.
//!
//! A connection whose first request is not a direct stream (`conn.rs`) is
//! served here first, when the server has a [`Quick`] handler (`lib.rs`
//! wires the HTTP transport's publish of one event). Each request head is
//! read and parsed here. A request the handler takes, and that is plain —
//! HTTP/1.1; a body of one `Content-Length` (or none) that has arrived whole
//! within the head's time; no `Transfer-Encoding`, `Expect` or `Upgrade`;
//! for a connection from a trusted proxy, a forwarded client under its
//! limit — is answered by the handler and written in one `write`: status
//! line, `date`, the answer's headers, `content-length`, the body. The
//! first request that is not plain, or not the handler's, goes with the
//! rest of the connection to hyper, which re-reads the bytes read here
//! ([`Conn::unread`](crate::net::listener::Conn::unread)), so nothing
//! changes for it.
//!
//! What this saves, per request: hyper's dispatcher and its header and
//! extension maps, the router's middleware stack (each layer a future of its
//! own), and a timer allocated per head (docs/performance.md, "The publish
//! path").
//!
//! The rules hyper applies to later heads hold here too: a head must be
//! whole within `--header-timeout-ms` of the end of the previous answer
//! (a connection silent that long closes; one that sent part of a head is
//! answered `408` first), at most `--max-header-bytes` and [`HEADERS_MAX`]
//! lines (longer heads go to hyper, which answers 431). `Connection: close`
//! is honoured (the answer says `connection: close`, then a lingering close),
//! and so is server shutdown (the answer in progress is written, then the
//! connection closes). The socket is the same [`Watched`] hyper writes to.

use crate::net::conn::{head_timeout, linger, send_whole, whole, Shared, HEADERS_MAX};
use crate::net::liveness::Watched;
use axum::body::Body;
use axum::http::{self, HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri};
use bytes::{Bytes, BytesMut};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// A request kind this module answers itself (see the module doc).
pub(crate) trait Quick: Send + Sync + 'static {
    /// Whether a request with `method` and `target` (path and query, as
    /// sent) is this handler's. Called for every head, so cheap.
    fn takes(&self, method: &Method, target: &str) -> bool;

    /// The largest body it answers here; a longer one goes to hyper (where
    /// the handler answers `413` as usual).
    fn max_body(&self) -> usize;

    /// The answer to `req` from `peer` (the client: see [`Peer`]), whose
    /// body has arrived whole; a JSON answer carries the header lines of
    /// `extra` (each `name: value\r\n`; see [`Answer::Json`]).
    fn answer_with(&self, req: Request<Bytes>, peer: SocketAddr, extra: Bytes) -> Pending;

    /// [`Quick::answer_with`] with no extra header lines.
    fn answer(&self, req: Request<Bytes>, peer: SocketAddr) -> Pending {
        self.answer_with(req, peer, Bytes::new())
    }
}

/// A quick answer on its way.
pub(crate) type Pending = Pin<Box<dyn Future<Output = Answer> + Send>>;

/// A quick handler's answer.
pub(crate) enum Answer {
    /// A JSON answer, its head made here: the status line, `date`,
    /// `content-type: application/json`, the lines of `extra` (each
    /// `name: value\r\n`), `content-length`.
    Json {
        status: http::StatusCode,
        extra: Bytes,
        body: Vec<u8>,
    },
    /// Any other answer, as it is.
    Response(Response<Body>),
}

impl Answer {
    /// The answer as a response (for layers that work on responses).
    pub(crate) fn into_response(self) -> Response<Body> {
        match self {
            Answer::Response(resp) => resp,
            Answer::Json {
                status,
                extra,
                body,
            } => {
                let mut resp = Response::new(Body::from(body));
                *resp.status_mut() = status;
                let h = resp.headers_mut();
                h.insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                for line in extra.split(|&b| b == b'\n') {
                    let line = line.strip_suffix(b"\r").unwrap_or(line);
                    let Some(colon) = line.iter().position(|&b| b == b':') else {
                        continue;
                    };
                    if let (Ok(name), Ok(value)) = (
                        HeaderName::from_bytes(&line[..colon]),
                        HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
                    ) {
                        h.append(name, value);
                    }
                }
                resp
            }
        }
    }
}

/// How the quick loop left a connection.
pub(crate) enum Left {
    /// Closed (or to be dropped): nothing more to do.
    Closed,
    /// The next request is hyper's; the bytes read of it are in the buffer.
    Hyper {
        /// Whether requests were answered here before it.
        answered: bool,
    },
}

/// A head in the buffer, parsed. (Returned once per head and taken apart
/// at once: the size of the `Take` variant costs nothing worth a box.)
#[allow(clippy::large_enum_variant)]
enum Head {
    /// Not whole yet.
    Partial,
    /// Not one to answer here (or not parseable here): hyper's.
    Decline,
    /// One to answer: its length in the buffer, its body's length, the
    /// request without its body, and whether the client asked to close.
    Take {
        head_len: usize,
        body_len: usize,
        req: Request<()>,
        close: bool,
    },
}

/// Serves requests on `conn` while they are plain requests `quick` takes.
/// `buf` holds what was read and not yet used (on [`Left::Hyper`], the
/// next request's bytes); `deadline` is when the next head must be whole.
pub(crate) async fn serve(
    shared: &Shared,
    quick: &dyn Quick,
    conn: &mut Watched,
    buf: &mut BytesMut,
    peer: SocketAddr,
    mut deadline: Instant,
) -> Left {
    let max_head = shared.config.max_header_bytes;
    let timeout_ms = shared.config.header_timeout_ms.max(1);
    let mut answered = false;
    // One timer for the connection: moving `deadline` on does not touch it;
    // when it fires early it is set to the deadline then (`read_more`).
    let mut timer = Box::pin(tokio::time::sleep_until(deadline));
    loop {
        let (head_len, body_len, req, close) = match parse(buf, max_head, quick) {
            Head::Decline => return Left::Hyper { answered },
            Head::Take {
                head_len,
                body_len,
                req,
                close,
            } => (head_len, body_len, req, close),
            Head::Partial => {
                match read_more(conn, buf, &mut timer, deadline, &shared.shutdown).await {
                    Read::More => {}
                    Read::Closed => return Left::Closed,
                    Read::TimedOut if buf.is_empty() => {
                        linger(conn.conn(), &shared.shutdown).await;
                        return Left::Closed;
                    }
                    // Part of a head, too slowly: 408, as for a first head.
                    Read::TimedOut => {
                        let out = whole(head_timeout(shared.config.header_timeout_ms, buf.len()));
                        send_whole(conn.conn(), out.await, &shared.shutdown).await;
                        return Left::Closed;
                    }
                }
                continue;
            }
        };
        // The body: what has not arrived with the head must follow within
        // the head's time; a slower one is hyper's (and the handler's pace).
        while buf.len() < head_len + body_len {
            match read_more(conn, buf, &mut timer, deadline, &shared.shutdown).await {
                Read::More => {}
                Read::Closed => return Left::Closed,
                Read::TimedOut => return Left::Hyper { answered },
            }
        }
        let mut client = peer;
        let mut _place = None;
        if let Some(p) = conn.conn().proxied() {
            let (ip, slot) = p.admit(req.headers());
            client = SocketAddr::new(ip, 0);
            match slot {
                Ok(slot) => _place = Some(slot),
                // Over the forwarded client's limit: hyper and the router answer it.
                Err(_) => return Left::Hyper { answered },
            }
        }
        let mut body = buf.split_to(head_len + body_len);
        let body = body.split_off(head_len).freeze();
        let answer = quick.answer(req.map(|()| body), client).await;
        let close = close || shared.shutdown.is_cancelled();
        let out = match answer {
            Answer::Json {
                status,
                extra,
                body,
            } => encode_json(status, &extra, &body, close),
            Answer::Response(resp) => encode(resp, close).await,
        };
        if conn.write_all(&out).await.is_err() {
            return Left::Closed;
        }
        drop(_place);
        answered = true;
        if close {
            linger(conn.conn(), &shared.shutdown).await;
            return Left::Closed;
        }
        deadline = Instant::now() + std::time::Duration::from_millis(timeout_ms);
    }
}

/// What a read gave.
enum Read {
    /// Bytes were added to the buffer.
    More,
    /// The client closed, the read failed, or the server shuts down with
    /// nothing of a request read.
    Closed,
    /// The deadline passed.
    TimedOut,
}

async fn read_more(
    conn: &mut Watched,
    buf: &mut BytesMut,
    timer: &mut Pin<Box<tokio::time::Sleep>>,
    deadline: Instant,
    stop: &tokio_util::sync::CancellationToken,
) -> Read {
    buf.reserve(1024);
    let idle = buf.is_empty();
    loop {
        tokio::select! {
            biased;
            r = conn.read_buf(buf) => return match r {
                Ok(n) if n > 0 => Read::More,
                _ => Read::Closed,
            },
            // Between requests a shutdown closes the connection (hyper's
            // graceful shutdown does the same); part way through a head,
            // the head's timer bounds the wait.
            () = stop.cancelled(), if idle => return Read::Closed,
            () = timer.as_mut() => {
                if Instant::now() >= deadline {
                    return Read::TimedOut;
                }
                timer.as_mut().reset(deadline);
            }
        }
    }
}

/// Parses the head at the start of `buf` (a function of its own so the
/// header array is not held across an await).
fn parse(buf: &[u8], max_head: usize, quick: &dyn Quick) -> Head {
    let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut parsed = httparse::Request::new(&mut headers);
    let head_len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n <= max_head => n,
        Ok(httparse::Status::Partial) if buf.len() < max_head => return Head::Partial,
        // Too long, too many lines, or malformed: hyper answers it.
        _ => return Head::Decline,
    };
    if parsed.version != Some(1) {
        return Head::Decline;
    }
    let (Some(method), Some(target)) = (parsed.method, parsed.path) else {
        return Head::Decline;
    };
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Head::Decline;
    };
    if !quick.takes(&method, target) {
        return Head::Decline;
    }
    let Ok(uri) = Uri::try_from(target) else {
        return Head::Decline;
    };
    let mut map = HeaderMap::with_capacity(parsed.headers.len());
    let mut body_len: Option<usize> = None;
    let mut close = false;
    for h in parsed.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            match (body_len, digits(h.value)) {
                (None, Some(n)) => body_len = Some(n),
                _ => return Head::Decline,
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("expect")
            || name.eq_ignore_ascii_case("upgrade")
        {
            return Head::Decline;
        } else if name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if !token.eq_ignore_ascii_case(b"keep-alive") && !token.is_empty() {
                    return Head::Decline;
                }
            }
        }
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(h.value),
        ) else {
            return Head::Decline;
        };
        map.append(name, value);
    }
    let body_len = body_len.unwrap_or(0);
    if body_len > quick.max_body() {
        return Head::Decline;
    }
    let mut req = Request::new(());
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = http::Version::HTTP_11;
    *req.headers_mut() = map;
    Head::Take {
        head_len,
        body_len,
        req,
        close,
    }
}

/// A `Content-Length` value: 1 to 19 digits, nothing else.
fn digits(value: &[u8]) -> Option<usize> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// `resp` as the bytes to write: status line, `date`, its headers,
/// `content-length` (none for 1xx, 204 and 304, which have no body), the
/// body, and `connection: close` when the connection closes after it.
async fn encode(resp: Response<Body>, close: bool) -> Vec<u8> {
    use std::io::Write;
    let (parts, body) = resp.into_parts();
    let status = parts.status;
    let bodiless = status.is_informational()
        || status == http::StatusCode::NO_CONTENT
        || status == http::StatusCode::NOT_MODIFIED;
    let body = if bodiless {
        Bytes::new()
    } else {
        axum::body::to_bytes(body, 1 << 20)
            .await
            .unwrap_or_default()
    };
    let mut out = Vec::with_capacity(160 + body.len());
    let _ = write!(
        out,
        "HTTP/1.1 {} {}\r\ndate: {}\r\n",
        status.as_str(),
        status.canonical_reason().unwrap_or(""),
        date()
    );
    for (name, value) in &parts.headers {
        if matches!(
            name.as_str(),
            "content-length" | "transfer-encoding" | "connection" | "date"
        ) {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !bodiless {
        let _ = write!(out, "content-length: {}\r\n", body.len());
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&body);
    out
}

/// `resp` with the header lines of `lines` (each `name: value\r\n`)
/// appended to its headers.
pub(crate) fn with_lines(mut resp: Response<Body>, lines: &[u8]) -> Response<Body> {
    if lines.is_empty() {
        return resp;
    }
    let extra = Answer::Json {
        status: http::StatusCode::OK,
        extra: Bytes::copy_from_slice(lines),
        body: Vec::new(),
    }
    .into_response();
    for (name, value) in extra.headers() {
        if name != http::header::CONTENT_TYPE {
            resp.headers_mut().append(name.clone(), value.clone());
        }
    }
    resp
}

/// A JSON answer (see [`Answer::Json`]) as the bytes to write.
fn encode_json(status: http::StatusCode, extra: &[u8], body: &[u8], close: bool) -> Vec<u8> {
    use std::io::Write;
    let mut out = Vec::with_capacity(160 + extra.len() + body.len());
    let _ = write!(
        out,
        "HTTP/1.1 {} {}\r\ndate: {}\r\ncontent-type: application/json\r\n",
        status.as_str(),
        status.canonical_reason().unwrap_or(""),
        date()
    );
    out.extend_from_slice(extra);
    let _ = write!(out, "content-length: {}\r\n", body.len());
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// The `date` header's value (RFC 9110 section 6.6.1), made at most once a
/// second per thread.
fn date() -> String {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};
    thread_local! {
        static DATE: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0 != secs {
            *d = (secs, httpdate::fmt_http_date(now));
        }
        d.1.clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Posts;

    impl Quick for Posts {
        fn takes(&self, method: &Method, target: &str) -> bool {
            method == Method::POST && target.starts_with("/p")
        }
        fn max_body(&self) -> usize {
            10
        }
        fn answer_with(&self, _: Request<Bytes>, _: SocketAddr, _: Bytes) -> Pending {
            Box::pin(async { Answer::Response(Response::new(Body::empty())) })
        }
    }

    fn kind(head: &[u8]) -> &'static str {
        match parse(head, 16384, &Posts) {
            Head::Partial => "partial",
            Head::Decline => "decline",
            Head::Take { .. } => "take",
        }
    }

    #[test]
    fn only_plain_heads_of_the_handler_are_taken() {
        assert_eq!(
            kind(b"POST /p HTTP/1.1\r\ncontent-length: 3\r\n\r\nabc"),
            "take"
        );
        assert_eq!(kind(b"POST /p HTTP/1.1\r\n\r\n"), "take");
        assert_eq!(
            kind(b"POST /p HTTP/1.1\r\nconnection: keep-alive, close\r\n\r\n"),
            "take"
        );
        assert_eq!(kind(b"POST /p HTTP/1.1\r\ncontent-le"), "partial");
        for declined in [
            &b"GET /p HTTP/1.1\r\n\r\n"[..],
            b"POST /q HTTP/1.1\r\n\r\n",
            b"POST /p HTTP/1.0\r\n\r\n",
            b"POST /p HTTP/1.1\r\ncontent-length: 11\r\n\r\n",
            b"POST /p HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 3\r\n\r\n",
            b"POST /p HTTP/1.1\r\ncontent-length: +3\r\n\r\n",
            b"POST /p HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n",
            b"POST /p HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 3\r\n\r\n",
            b"POST /p HTTP/1.1\r\nconnection: upgrade\r\nupgrade: x\r\n\r\n",
            b"POST /p HTTP/1.1\r\nbad header\r\n\r\n",
        ] {
            assert_eq!(
                kind(declined),
                "decline",
                "{}",
                String::from_utf8_lossy(declined)
            );
        }
        let long = format!("POST /p HTTP/1.1\r\nx: {}\r\n\r\n", "a".repeat(20000));
        assert_eq!(kind(long.as_bytes()), "decline");
        let Head::Take {
            head_len,
            body_len,
            req,
            close,
        } = parse(
            b"POST /p?x=1 HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
            16384,
            &Posts,
        )
        else {
            panic!("taken");
        };
        assert_eq!((head_len, body_len, close), (62, 2, true));
        assert_eq!(req.uri().query(), Some("x=1"));
        assert_eq!(req.headers()["content-length"], "2");
    }

    #[tokio::test]
    async fn answers_carry_date_length_and_close_when_asked() {
        let resp = Response::builder()
            .status(201)
            .header("content-type", "application/json")
            .body(Body::from("{}"))
            .expect("response");
        let out = String::from_utf8(encode(resp, false).await).expect("text");
        assert!(out.starts_with("HTTP/1.1 201 Created\r\ndate: "), "{out}");
        assert!(out.ends_with("content-type: application/json\r\ncontent-length: 2\r\n\r\n{}"));
        let resp = Response::builder()
            .status(204)
            .body(Body::empty())
            .expect("response");
        let out = String::from_utf8(encode(resp, true).await).expect("text");
        assert!(out.ends_with("GMT\r\nconnection: close\r\n\r\n"), "{out}");
        // A JSON answer made here is the same as through a response.
        let json = || Answer::Json {
            status: http::StatusCode::CREATED,
            extra: Bytes::from_static(b"vary: origin\r\nx-a: 1\r\n"),
            body: b"{}".to_vec(),
        };
        let Answer::Json {
            status,
            extra,
            body,
        } = json()
        else {
            unreachable!()
        };
        let undated = |b: Vec<u8>| -> String {
            let text = String::from_utf8(b).expect("text");
            text.lines()
                .filter(|l| !l.starts_with("date: "))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let direct = undated(encode_json(status, &extra, &body, false));
        let via = undated(encode(json().into_response(), false).await);
        assert_eq!(direct, via);
        assert!(
            direct.ends_with("x-a: 1\ncontent-length: 2\n\n{}"),
            "{direct:?}"
        );
    }
}
