//! One accepted connection, from its first request head to its close.
//!
//! The first request head is read here. A `GET` of a streaming URL (the SSE
//! transport's `/v1/sse` and `/v1/channels/{channel}/sse`, a Durable Streams
//! read with `live=sse`: [`Shared::direct`]) goes through the same router as
//! any request, and if its handler opens a stream (hands a [`Frames`] source
//! over, [`DirectStream`]), the stream is written
//! straight to the socket: the response head, then each [`Frames::next`]'s
//! frames as one chunk in one `writev` (for HTTP/1.0, no chunks: the body
//! ends with the connection, RFC 9112 §6.3 rule 8); the response says
//! `connection: close`. Nothing else stays allocated for the stream: no HTTP
//! read or write buffer, no chunk header per frame. The socket is also
//! watched for the client's FIN, so a closed stream releases its subscriber at
//! once rather than at the next write.
//!
//! A first head that is not HTTP/1, or whose body's length cannot be
//! determined (RFC 9112 section 6.3), is answered `400 invalid_request` here,
//! with what is wrong (`head_error.rs`); one over `--max-header-bytes` (or
//! 100 header lines), `431 too_large`; one begun but not finished within
//! `--header-timeout-ms`, `408 request_timeout` (so is a later head that
//! hyper's timer cuts part way). Every other connection — and every request after the
//! first on a keep-alive connection, SSE included — is served by hyper's
//! HTTP/1 server, which first re-reads the bytes read here ([`Conn::unread`]).
//!
//! An answer given before the request's body was read to its end (an early
//! refusal: 413, 401, 408, ...) says `connection: close`, and every
//! connection closes with a lingering close ([`crate::net::linger`]: FIN,
//! then what the client still sends is read and dropped, for a bounded
//! while), so a client still sending its body reads the answer rather than
//! a reset.

use crate::net::linger::{linger, shut_write};
use crate::net::listener::{Conn, Refused};
use crate::{Peer, ServerConfig};
use axum::body::Body;
use axum::http::{self, HeaderName, HeaderValue, Method, Request, Response, Version};
use axum::Router;
use bytes::{Buf, Bytes, BytesMut};
use std::future::Future;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// How long a refused connection has to send its one request head.
const REFUSED_HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// Most header lines in a request head (hyper's own limit, for the requests
/// it reads): more are answered 431.
pub(crate) const HEADERS_MAX: usize = 100;
/// Most bytes a streaming client may send after its request that are read
/// (and dropped) while watching for its close.
const DISCARD_MAX: usize = 64 * 1024;

/// A stream this module writes straight to the socket: a source of frames.
/// The SSE transport's feed is one; this module knows nothing else of it.
pub(crate) trait Frames: Send + 'static {
    /// Waits for what is next and appends its frames to `out` (see
    /// [`Flow`]). Cancel-safe: dropping the future loses nothing.
    fn next(&mut self, out: &mut Vec<Bytes>) -> impl Future<Output = Flow> + Send;

    /// For a writer blocked on a full socket: whether the stream must end
    /// now, or, with `ticks`, its timer ticked (time to check the client).
    /// Polled in place by the writer, so the wait holds no future of its own.
    fn poll_blocked(
        &mut self,
        cx: &mut std::task::Context<'_>,
        ticks: bool,
    ) -> std::task::Poll<Waited>;

    /// The client went away (`how`); the first reason given is the one kept.
    fn client_gone(&mut self, how: Gone);
}

/// What [`Frames::next`] left to do.
#[derive(Debug)]
pub(crate) enum Flow {
    /// Frames were appended; call again.
    More,
    /// A heartbeat tick: its frame was appended (none with heartbeats off);
    /// the writer checks the client's liveness, then calls again.
    Tick,
    /// The stream ends cleanly (server shutdown, or token expiry with its
    /// frame appended): the writer writes what was appended, then ends the
    /// body; the client reconnects at once.
    End,
    /// The source failed (the error, for the log): the writer writes what
    /// was appended (the SSE feed appends `retry:` of 1 to 5 s and a comment
    /// naming the failure), then breaks the body off: no last chunk, so the
    /// client backs off and resumes with its cursor; the connection closes
    /// with a FIN after everything written, never a reset, which would drop
    /// what the socket still holds.
    Fail(String),
}

/// How a client of a stream went away, as the writer saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gone {
    /// It closed its side.
    Closed,
    /// It stopped acknowledging (the liveness bound).
    Vanished,
    /// A write to it failed.
    WriteFailed,
}

/// Put in the extensions of a request whose stream this module will write:
/// the handler hands its [`Frames`] over here instead of building a body.
/// Any source of frames may be handed over (the SSE transport's feed, the
/// Durable Streams room's live feed): the stream's task is made for its type
/// when the connection is detached, so the writer stays one function with no
/// box or dynamic call on its path.
#[derive(Clone, Default)]
pub(crate) struct DirectStream(Arc<Mutex<Option<Launch>>>);

/// Starts a handed-over stream: spawns its task on the fan-out runtime.
type Launch = Box<dyn FnOnce(Launcher) + Send>;

impl DirectStream {
    /// Keeps `feed` for the socket writer; the response carries only the status and headers.
    pub(crate) fn hand_over<F: Frames>(&self, feed: F) -> axum::response::Response {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(Box::new(move |l: Launcher| l.spawn(feed)));
        }
        axum::response::Response::new(Body::empty())
    }

    fn take(&self) -> Option<Launch> {
        self.0.lock().ok().and_then(|mut slot| slot.take())
    }
}

/// What a handed-over stream's task starts with.
struct Launcher {
    conn: crate::net::listener::Detached,
    head: Vec<u8>,
    chunked: bool,
    bound_ms: u64,
    fanout: tokio::runtime::Handle,
    tracker: tokio_util::task::TaskTracker,
}

impl Launcher {
    /// Spawns the stream of `feed` on the fan-out runtime, its socket
    /// registered there.
    fn spawn<F: Frames>(self, feed: F) {
        let conn = {
            let _on = self.fanout.enter();
            match self.conn.attach_stream() {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::debug!(error = %e, "could not move a stream");
                    return;
                }
            }
        };
        let out = vec![Bytes::from(self.head)];
        let task = self
            .tracker
            .track_future(stream(conn, feed, out, self.chunked, self.bound_ms));
        tracing::trace!(bytes = std::mem::size_of_val(&task), "a stream's task");
        drop(self.fanout.spawn(task));
    }
}

/// Drives `feed` as a hyper response body (chunked), for a stream opened on
/// a connection that already carried another request. Every flow writes
/// what it appended first; [`Flow::End`] then ends the body (its last
/// chunk), [`Flow::Fail`] fails it, which makes hyper close the connection
/// without the last chunk, after waiting (with `flushes`, the connection's,
/// and until `shutdown`) for hyper to hand every byte it holds to the
/// socket: hyper drops what it still buffers when a body fails. The close is
/// a FIN after those bytes.
pub(crate) fn body<F: Frames>(
    mut feed: F,
    flushes: Option<crate::net::liveness::Flushes>,
    shutdown: CancellationToken,
) -> Body {
    Body::from_stream(async_stream::stream! {
        let _open = crate::metrics::Open::<crate::metrics::SseConn>::new();
        let mut out = Vec::new();
        loop {
            let flow = feed.next(&mut out).await;
            // Whatever the flow, what it queued goes out first: the
            // expiry frame comes with `Flow::End`.
            if !out.is_empty() {
                crate::metrics::written(
                    crate::metrics::Transport::Sse,
                    out.iter().map(Bytes::len).sum(),
                );
                for frame in out.drain(..) {
                    yield Ok(frame);
                }
            }
            match flow {
                Flow::More | Flow::Tick => {}
                Flow::End => break,
                Flow::Fail(e) => {
                    tracing::warn!(error = %e, "breaking off a stream: journal read failed");
                    // Read once hyper took the last frame: the next flush
                    // empties its buffer into the socket.
                    if let Some(f) = &flushes {
                        let seen = f.count();
                        tokio::select! {
                            () = f.after(seen) => {}
                            () = shutdown.cancelled() => {}
                        }
                    }
                    yield Err(io::Error::other(e));
                    break;
                }
            }
        }
    })
}

/// The fan-out runtime, in the extensions of every request hyper serves
/// here: an upgraded WebSocket runs its socket's task there (the
/// `transport::ws` delivery), beside the SSE streams, so that a publish on
/// the main runtime never waits behind a round of WebSocket deliveries, and
/// the events published meanwhile go out together (one write each).
#[derive(Clone)]
pub(crate) struct Fanout(pub tokio::runtime::Handle);

/// Whether a request target (path and query) is served by the fan-out
/// writer when it is a connection's first request (see [`Shared::direct`]).
pub type Direct = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// What every connection task shares.
pub(crate) struct Shared {
    pub config: ServerConfig,
    /// Fires when the server shuts down.
    pub shutdown: CancellationToken,
    pub router: Router,
    /// The runtime streams are written on (see [`ServerConfig::fanout_threads`](crate::ServerConfig::fanout_threads)).
    pub fanout: tokio::runtime::Handle,
    /// Every connection and stream, so shutdown can wait for them.
    pub tracker: tokio_util::task::TaskTracker,
    /// Whether a request target (path and query) is one whose `GET` as a
    /// connection's first request this module serves itself: the SSE
    /// transport's paths, and the Durable Streams room's live SSE reads
    /// (composed in `lib.rs`).
    pub direct: Direct,
}

/// Serves one connection until it closes or the server shuts down; a stream
/// continues as a task of its own on the fan-out runtime, and this one ends.
///
/// A stream's task holds only the connection, the feed and the write in
/// progress: whatever a future holds across an await stays allocated for
/// the stream's life, which is why routing runs in a box of its own and is
/// freed before the stream starts.
pub(crate) async fn serve(shared: Arc<Shared>, mut conn: Conn, peer: SocketAddr) {
    let refused = conn.refused().cloned();
    let mut timeout = Duration::from_millis(shared.config.header_timeout_ms.max(1));
    if refused.is_some() {
        // A refused connection is answered promptly or dropped.
        timeout = timeout.min(REFUSED_HEAD_TIMEOUT);
    }
    let started = tokio::time::Instant::now();
    let mut buf = BytesMut::with_capacity(1024);
    let first = tokio::select! {
        first = tokio::time::timeout(timeout, read_head(&mut conn, &mut buf, shared.config.max_header_bytes, &*shared.direct)) => first,
        // Nothing has been asked yet: there is nothing to finish.
        () = shared.shutdown.cancelled() => return,
    };
    match first {
        // Silent before its head, or vanished: closed with nothing to say.
        Err(_) if buf.is_empty() => {}
        Ok(Ok(First::Closed)) => {}
        // Part of a head arrived, too slowly (slowloris): 408 first.
        Err(_) => {
            let out = whole(head_timeout(shared.config.header_timeout_ms, buf.len())).await;
            send_whole(&conn, out, &shared.shutdown).await;
        }
        Ok(Err(e)) => tracing::debug!(error = %e, "reading a request head failed"),
        Ok(Ok(First::Sse(mut req))) => {
            drop(buf);
            let mut peer = peer;
            if let Some(p) = conn.proxied() {
                // Behind a trusted proxy: the forwarded client, counted for as
                // long as the connection (it carries only this request).
                let (client, slot) = p.admit(req.headers());
                peer = SocketAddr::new(client, 0);
                match slot {
                    Ok(slot) => p.hold(slot),
                    Err(r) => {
                        req.extensions_mut().insert(r);
                    }
                }
            }
            req.extensions_mut().insert(Peer(peer));
            if let Some(r) = refused {
                req.extensions_mut().insert(r);
            }
            match boxed(route_stream(shared.router.clone(), *req)).await {
                Routed::Stream {
                    launch,
                    head,
                    chunked,
                } => match conn.detach() {
                    // The stream moves to the fan-out runtime, and this task ends.
                    Ok(conn) => launch(Launcher {
                        conn,
                        head,
                        chunked,
                        bound_ms: shared.config.tcp_user_timeout_ms,
                        fanout: shared.fanout.clone(),
                        tracker: shared.tracker.clone(),
                    }),
                    Err(e) => tracing::debug!(error = %e, "could not move a stream"),
                },
                Routed::Whole(out) => send_whole(&conn, out, &shared.shutdown).await,
            }
        }
        Ok(Ok(First::TooLarge)) => {
            let max = shared.config.max_header_bytes;
            let error = crate::error::ApiError::new(
                gapless_protocol::codes::ErrorCode::HeadTooLarge,
                format!(
                    "the request head is over {max} bytes or {HEADERS_MAX} header lines (--max-header-bytes)"
                ),
            )
            .with("limit", max);
            let out = whole(axum::response::IntoResponse::into_response(error)).await;
            send_whole(&conn, out, &shared.shutdown).await;
        }
        Ok(Ok(First::Malformed(e))) => {
            let error = crate::error::ApiError::new(
                gapless_protocol::codes::ErrorCode::InvalidRequest,
                format!("malformed HTTP/1.1 request head: {e}"),
            );
            let out = whole(axum::response::IntoResponse::into_response(error)).await;
            send_whole(&conn, out, &shared.shutdown).await;
        }
        Ok(Ok(First::Other)) => {
            conn.unread(buf.freeze());
            // hyper times the head from scratch: give it only what is left.
            let left = timeout.saturating_sub(started.elapsed());
            let _open = crate::metrics::Open::<crate::metrics::HttpConn>::new();
            boxed(serve_http(shared, conn, left, peer, refused)).await;
        }
    }
}

/// `408 request_timeout` for a connection that sent `received` bytes of a
/// request head but not the whole head in time (`limit_ms`: the setting).
fn head_timeout(limit_ms: u64, received: usize) -> Response<Body> {
    let error = crate::error::ApiError::new(
        gapless_protocol::codes::ErrorCode::RequestTimeout,
        format!(
            "the request head did not arrive in time ({received} bytes of it did; \
             --header-timeout-ms is {limit_ms}): the connection is closed"
        ),
    )
    .with("limit", limit_ms);
    axum::response::IntoResponse::into_response(error)
}

/// `f` on the heap. Large futures that run once (routing, hyper's
/// connection) are boxed through here rather than with `Box::pin` inline,
/// where the compiler may still reserve their size in the caller's state,
/// so a connection still waiting for its first head stays small.
fn boxed<F: Future + Send + 'static>(f: F) -> Pin<Box<dyn Future<Output = F::Output> + Send>> {
    Box::pin(f)
}

/// What the first request head turned out to be.
enum First {
    /// A `GET` of an SSE URL, parsed.
    Sse(Box<Request<Body>>),
    /// Anything else (including heads this reader declines): for hyper.
    Other,
    /// Not HTTP/1, or a body of unknown length: answered 400 here, with what
    /// is wrong (`head_error.rs`).
    Malformed(String),
    /// Over `--max-header-bytes` or [`HEADERS_MAX`] lines: answered 431 here.
    TooLarge,
    /// The client closed before sending anything.
    Closed,
}

async fn read_head(
    conn: &mut Conn,
    buf: &mut BytesMut,
    max: usize,
    direct: &(dyn Fn(&str) -> bool + Send + Sync),
) -> io::Result<First> {
    loop {
        if let Some(first) = parse_head(buf, max, direct) {
            return Ok(first);
        }
        buf.reserve(1024);
        if conn.read_buf(buf).await? == 0 {
            return Ok(if buf.is_empty() {
                First::Closed
            } else {
                First::Other
            });
        }
    }
}

/// What the head in `buf` is, or `None` if it is not whole yet. (A function
/// of its own so the header array is not held across the read.)
fn parse_head(buf: &[u8], max: usize, direct: &dyn Fn(&str) -> bool) -> Option<First> {
    let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
    let mut parsed = httparse::Request::new(&mut headers);
    match parsed.parse(buf) {
        Ok(httparse::Status::Complete(_)) => {
            // Well formed, but a body of unknown length (or a target that is
            // not a URI): what hyper would refuse with a bare 400.
            let target = parsed.path.unwrap_or_default();
            let version = parsed.version.unwrap_or(1);
            if let Some(e) = crate::net::head_error::framing(target, version, parsed.headers) {
                return Some(First::Malformed(e));
            }
            Some(sse_request(&parsed, direct).map_or(First::Other, |r| First::Sse(Box::new(r))))
        }
        Ok(httparse::Status::Partial) if buf.len() < max => None,
        Ok(httparse::Status::Partial) | Err(httparse::Error::TooManyHeaders) => {
            Some(First::TooLarge)
        }
        // A browser echoes the last id it read: control bytes in it make the
        // id unreadable (200, gap `unknown`), not the head (`head_error.rs`).
        Err(e @ httparse::Error::HeaderValue) => {
            let malformed = || Some(First::Malformed(crate::net::head_error::describe(buf, e)));
            match crate::net::head_error::mask_last_event_id_controls(buf) {
                Some(clean) => match parse_head(&clean, max, direct) {
                    // The rest of the head has not arrived yet.
                    None => None,
                    Some(sse @ First::Sse(_)) => Some(sse),
                    Some(_) => malformed(),
                },
                None => malformed(),
            }
        }
        Err(e) => Some(First::Malformed(crate::net::head_error::describe(buf, e))),
    }
}

/// What the fan-out path makes of a connection's first bytes (see
/// [`parse_first_head`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstHead {
    /// Not a whole head yet: the reader would read more.
    Incomplete,
    /// A `GET` of an SSE URL, served by the fan-out writer: its request target.
    Sse(String),
    /// Anything else, left to hyper (which re-reads the same bytes).
    Other,
    /// Not HTTP/1, or a body of unknown length: answered `400 invalid_request`
    /// with this reason.
    Malformed(String),
    /// Over `max` bytes or [`HEADERS_MAX`] lines: answered `431 head_too_large`.
    TooLarge,
}

/// Classifies `buf`, the first bytes read from a connection, exactly as the
/// connection's first-request reader does (the same private function), with
/// a head limit of `max` bytes (`--max-header-bytes`) and `direct` deciding
/// which request targets (path and query) the fan-out writer serves.
/// Public only for the fuzz targets in `fuzz/`; the server does not call it.
pub fn parse_first_head(buf: &[u8], max: usize, direct: &dyn Fn(&str) -> bool) -> FirstHead {
    match parse_head(buf, max, direct) {
        None => FirstHead::Incomplete,
        Some(First::Sse(req)) => FirstHead::Sse(req.uri().to_string()),
        Some(First::Other) => FirstHead::Other,
        Some(First::Malformed(e)) => FirstHead::Malformed(e),
        Some(First::TooLarge) => FirstHead::TooLarge,
        Some(First::Closed) => FirstHead::Incomplete,
    }
}

/// `parsed` as a request this module serves, or `None` if it is not a plain
/// `GET` of a target `direct` names (or has anything `http` cannot hold).
fn sse_request(
    parsed: &httparse::Request<'_, '_>,
    direct: &dyn Fn(&str) -> bool,
) -> Option<Request<Body>> {
    let target = parsed.path?;
    if parsed.method != Some("GET") || !direct(target) {
        return None;
    }
    let version = match parsed.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let mut req = Request::builder()
        .method(Method::GET)
        .uri(target)
        .version(version);
    for h in parsed.headers.iter() {
        if h.name.eq_ignore_ascii_case("upgrade") || h.name.eq_ignore_ascii_case("content-length") {
            return None;
        }
        req = req.header(
            HeaderName::from_bytes(h.name.as_bytes()).ok()?,
            HeaderValue::from_bytes(h.value).ok()?,
        );
    }
    req.body(Body::empty()).ok()
}

/// What routing an SSE request gave.
enum Routed {
    /// A stream: its response head, then the feed (its start).
    Stream {
        launch: Launch,
        head: Vec<u8>,
        chunked: bool,
    },
    /// Any other answer (an error), whole.
    Whole(Vec<Bytes>),
}

/// Routes `req` like any request. (Boxed by the caller and dropped before
/// the stream starts: the router's future is large.)
async fn route_stream(router: Router, mut req: Request<Body>) -> Routed {
    let version = req.version();
    let slot = DirectStream::default();
    req.extensions_mut().insert(slot.clone());
    let resp = match router.oneshot(req).await {
        Ok(resp) => resp,
        Err(never) => match never {},
    };
    let (parts, body) = resp.into_parts();
    match slot.take() {
        Some(launch) if parts.status == http::StatusCode::OK => {
            let chunked = version != Version::HTTP_10;
            Routed::Stream {
                launch,
                head: response_head(&parts, None, chunked),
                chunked,
            }
        }
        _ => Routed::Whole(whole(Response::from_parts(parts, body)).await),
    }
}

/// A whole (non-stream) answer as bytes to write: head, then body.
async fn whole(resp: Response<Body>) -> Vec<Bytes> {
    let (parts, body) = resp.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    vec![
        Bytes::from(response_head(&parts, Some(body.len()), false)),
        body,
    ]
}

/// The status line and headers of `parts`, then `content-length` or
/// `transfer-encoding: chunked` (or neither: the body runs to the close), and
/// `connection: close`.
fn response_head(parts: &http::response::Parts, length: Option<usize>, chunked: bool) -> Vec<u8> {
    use std::io::Write;
    let mut out = Vec::with_capacity(256);
    let status = parts.status;
    let _ = write!(
        out,
        "HTTP/1.1 {} {}\r\n",
        status.as_str(),
        status.canonical_reason().unwrap_or("")
    );
    let _ = write!(
        out,
        "date: {}\r\n",
        httpdate::fmt_http_date(std::time::SystemTime::now())
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
    if let Some(n) = length {
        let _ = write!(out, "content-length: {n}\r\n");
    } else if chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    out.extend_from_slice(b"connection: close\r\n\r\n");
    out
}

/// Writes the response head (`out`, the first write) and then the feed's frames until the feed ends,
/// the client goes away, or a write fails. The body is chunked for HTTP/1.1
/// (one chunk per write, so a clean end — the last chunk — differs from a
/// dropped connection) and runs to the close for HTTP/1.0.
///
/// Liveness: the stream takes over from `TCP_USER_TIMEOUT` (which would cut
/// a client reading slowly, `tcp_info.rs`) and, on each tick of its
/// heartbeat timer and while a write waits for a full socket, drops a client
/// whose TCP owes an answer and has acknowledged nothing for `bound_ms`.
///
/// Everything the stream's task holds across an await stays allocated for
/// the stream's life, for every subscriber (docs/design.md, "Fan-out"): the
/// waits on the socket are poll functions, with no future of their own.
/// The task is an `async move` block over the arguments, used in place: an
/// `async fn` keeps its arguments and the locals they move into side by
/// side for the task's life (288 bytes more per stream).
// Not `async fn`: see above (clippy would have it so).
#[allow(clippy::manual_async_fn)]
fn stream<F: Frames>(
    (tcp, place): (TcpStream, crate::net::listener::Place),
    mut feed: F,
    // What the next write carries: at first the response head, then empty
    // while the stream waits, so an idle stream holds no buffer; the feed
    // fills it, the write empties it.
    mut out: Vec<Bytes>,
    chunked: bool,
    bound_ms: u64,
) -> impl Future<Output = ()> + Send {
    async move {
        // Held (moved into the task) until the stream ends.
        let _place = &place;
        let _open = crate::metrics::Open::<crate::metrics::SseConn>::new();
        let bound = crate::net::tcp_info::Peer::take_over_bound(&tcp, bound_ms);
        // Whether the response head is still to be written (it is `out[0]`).
        let mut first = true;
        // Bytes of the client's read and dropped while watching for its close.
        let mut discarded = 0u32;
        loop {
            let flow = tokio::select! {
                biased;
                flow = feed.next(&mut out) => flow,
                () = std::future::poll_fn(|cx| poll_peer_closed(&tcp, &mut discarded, cx)) => {
                    feed.client_gone(Gone::Closed);
                    return;
                }
            };
            if matches!(flow, Flow::Tick) && bound.is_some_and(|b| b.dead(&tcp)) {
                tracing::debug!("an SSE client stopped acknowledging: dropped");
                feed.client_gone(Gone::Vanished);
                abort(&tcp);
                return;
            }
            let skip = usize::from(first);
            let body: usize = out[skip..].iter().map(Bytes::len).sum();
            if body == 0 && !first && matches!(flow, Flow::Tick) {
                // A liveness tick with heartbeats off: nothing to write.
                out = Vec::new();
                continue;
            }
            first = false;
            if chunked && body > 0 {
                // The chunk-size line, after the response head (first write only).
                out.insert(skip, chunk_line(body));
                out.push(Bytes::from_static(b"\r\n"));
            }
            if chunked && matches!(flow, Flow::End) {
                out.push(Bytes::from_static(b"0\r\n\r\n"));
            }
            // Counted as handed to the socket (nothing held across the write).
            crate::metrics::written(
                crate::metrics::Transport::Sse,
                out.iter().map(Bytes::len).sum(),
            );
            let ticks = bound.is_some();
            let written =
                write_frames(&tcp, &mut out, |cx| feed.poll_blocked(cx, ticks), bound).await;
            out = Vec::new();
            match (flow, written) {
                (_, Err(e)) => {
                    tracing::debug!(error = %e, "an SSE client went away");
                    if e.kind() == io::ErrorKind::TimedOut {
                        feed.client_gone(Gone::Vanished);
                        abort(&tcp);
                    } else {
                        feed.client_gone(Gone::WriteFailed);
                    }
                    return;
                }
                (Flow::More | Flow::Tick, Ok(())) => {}
                (Flow::End, Ok(())) => {
                    shut_write(&tcp);
                    return;
                }
                (Flow::Fail(e), Ok(())) => {
                    // Everything is written, the failure's `retry:` last: the
                    // body breaks off without its last chunk, so the client
                    // backs off rather than reconnecting at once as after a
                    // clean end. A FIN after the data, never a reset: that would
                    // drop what the socket still holds for a slow reader.
                    tracing::warn!(error = %e, "breaking off a stream: journal read failed");
                    shut_write(&tcp);
                    return;
                }
            }
        }
    }
}

/// Bytes of the future of a stream's task for a feed of type `F`, as
/// spawned (with the task tracker's token): what every open stream holds in
/// its task besides tokio's header and trailer (docs/performance.md, "Idle
/// memory, structure by structure"). For the size test of the SSE feed.
#[cfg(test)]
pub(crate) fn stream_task_bytes<F: Frames>() -> usize {
    fn output<A, B, C, D, E, R>(_: fn(A, B, C, D, E) -> R) -> usize {
        std::mem::size_of::<tokio_util::task::task_tracker::TrackedFuture<R>>()
    }
    output(stream::<F>)
}

/// Makes the close a reset (linger 0): the client (if any) learns the stream
/// broke, and the kernel frees the unsent data at once instead of probing a
/// vanished client with it.
fn abort(tcp: &TcpStream) {
    let _ = socket2::SockRef::from(tcp).set_linger(Some(Duration::ZERO));
}

/// What a blocked write woke up for.
pub(crate) enum Waited {
    /// The socket can take more.
    Writable,
    /// The stream must end now (shutdown; token expiry lets the write finish,
    /// [`Frames::poll_blocked`]).
    Ended,
    /// The stream's timer ticked: time to check the client is alive.
    Tick,
}

/// Longest chunk-size line: 16 hex digits and CRLF.
const CHUNK_LINE_MAX: usize = 18;

/// `n` in hex and CRLF: a chunk-size line (RFC 9112 §7.1). One small
/// allocation per write (not per event); no buffer is kept per stream.
fn chunk_line(n: usize) -> Bytes {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut line = [0u8; CHUNK_LINE_MAX];
    let mut i = CHUNK_LINE_MAX - 2;
    line[i..].copy_from_slice(b"\r\n");
    let mut n = n;
    loop {
        i -= 1;
        line[i] = HEX[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    Bytes::copy_from_slice(&line[i..])
}

/// Ready once the client has closed its side (or reset). Bytes it sends
/// are read and dropped, up to [`DISCARD_MAX`] (counted in `discarded`):
/// nothing is expected after the request. Past that the socket is no longer
/// read (the sender's window fills and it must wait), so a client cannot keep
/// a fan-out thread busy reading its junk; its close is then noticed by the
/// next write. A poll function: the stream's task holds no future for it,
/// and its read buffer lives on the stack only during the call.
fn poll_peer_closed(
    tcp: &TcpStream,
    discarded: &mut u32,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<()> {
    use std::task::Poll;
    // At most a few reads per poll, so a sender cannot hold the thread.
    for _ in 0..4 {
        if *discarded as usize >= DISCARD_MAX {
            return Poll::Pending;
        }
        match tcp.poll_read_ready(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(_)) => return Poll::Ready(()),
            Poll::Ready(Ok(())) => {}
        }
        // Made only when there is something to read: this poll runs once per
        // write of every stream, and zeroing 4 KiB each time showed in profiles.
        let mut scratch = [0u8; 4096];
        match tcp.try_read(&mut scratch) {
            Ok(0) => return Poll::Ready(()),
            Ok(n) => *discarded = discarded.saturating_add(u32::try_from(n).unwrap_or(u32::MAX)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return Poll::Ready(()),
        }
    }
    cx.waker().wake_by_ref();
    Poll::Pending
}

/// Writes every frame of `out` (emptying it), in `writev` calls of up to 64 frames.
///
/// A write that has to wait for the client (its window is full) gives up
/// at shutdown, so a reader that stopped reading cannot hold it (token
/// expiry lets the write finish: [`Frames::poll_blocked`]);
/// with `watch`, it also checks the client on each tick of the stream's timer
/// and gives up (`TimedOut`) once the client is gone ([`Bound::dead`](crate::net::tcp_info::Bound::dead)):
/// a client that reads, however slowly, is waited for.
async fn write_frames(
    tcp: &TcpStream,
    out: &mut Vec<Bytes>,
    mut blocked: impl FnMut(&mut std::task::Context<'_>) -> std::task::Poll<Waited>,
    bound: Option<crate::net::tcp_info::Bound>,
) -> io::Result<()> {
    let mut first = 0;
    while first < out.len() {
        // The slices live only for the call, not across the wait for writability:
        // whatever a future holds across an await stays allocated per stream.
        let written = {
            let mut slices = [IoSlice::new(&[]); 64];
            let mut count = 0;
            for (slot, frame) in slices.iter_mut().zip(&out[first..]) {
                *slot = IoSlice::new(frame);
                count += 1;
            }
            tcp.try_write_vectored(&slices[..count])
        };
        let mut n = match written {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // The stream's own end future (shutdown) and
                // timer are polled in place: no future of their own is held
                // here (this wait is part of every stream's task).
                let waited = std::future::poll_fn(|cx| {
                    if let std::task::Poll::Ready(r) = tcp.poll_write_ready(cx) {
                        return std::task::Poll::Ready(r.map(|()| Waited::Writable));
                    }
                    blocked(cx).map(Ok)
                })
                .await?;
                match waited {
                    Waited::Writable => {}
                    Waited::Ended => {
                        return Err(io::Error::other(
                            "the stream ended while the client was not reading",
                        ))
                    }
                    Waited::Tick => {
                        if bound.is_some_and(|b| b.dead(tcp)) {
                            return Err(io::Error::new(
                                io::ErrorKind::TimedOut,
                                "the client acknowledged nothing while its window was full",
                            ));
                        }
                    }
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        while n > 0 {
            let frame = &mut out[first];
            if n >= frame.len() {
                n -= frame.len();
                first += 1;
            } else {
                frame.advance(n);
                n = 0;
            }
        }
    }
    out.clear();
    Ok(())
}

/// Writes a whole answer, then closes the sending side: no other request is
/// read on this connection; then a [lingering close](crate::net::linger).
async fn send_whole(conn: &Conn, mut out: Vec<Bytes>, stop: &CancellationToken) {
    let wrote = tokio::select! {
        r = write_frames(conn.tcp(), &mut out, |_| std::task::Poll::Pending, None) => r.is_ok(),
        () = stop.cancelled() => false,
    };
    if wrote {
        linger(conn, stop).await;
    }
}

/// Hands the connection to hyper's HTTP/1 server (with upgrades, for
/// WebSocket, and the request-head timeout); on shutdown, the response in
/// flight finishes and the connection closes. The socket judges its client's
/// liveness whatever is written on it ([`crate::net::liveness::Watched`]); each
/// request carries the connection's [`crate::net::tcp_info::Peer`] (a WebSocket's
/// heartbeat reads it).
async fn serve_http(
    shared: Arc<Shared>,
    conn: Conn,
    first_head_timeout: Duration,
    peer: SocketAddr,
    refused: Option<Refused>,
) {
    let bound_ms = shared.config.tcp_user_timeout_ms;
    let tcp = crate::net::tcp_info::Peer::of(conn.tcp(), bound_ms);
    let proxied = conn.proxied().cloned();
    let conn = crate::net::liveness::Watched::new(conn, bound_ms);
    let flushes = conn.flushes();
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    // The first head's clock started in `serve`. hyper has one setting for
    // every head of the connection, so later heads get the same, shorter, limit.
    let header_timeout = first_head_timeout.max(Duration::from_millis(1));
    let router = shared.router.clone();
    let fanout = Fanout(shared.fanout.clone());
    // A refused connection carries one request (`busy.rs`), then closes.
    let keep_alive = refused.is_none();
    let service = tower::service_fn(move |mut req: Request<hyper::body::Incoming>| {
        // Behind a trusted proxy each request is its forwarded client's,
        // counted while it is in flight (`listener.rs`).
        let mut client = peer;
        let mut place = None;
        if let Some(p) = &proxied {
            let (ip, slot) = p.admit(req.headers());
            client = SocketAddr::new(ip, 0);
            match slot {
                Ok(slot) => place = Some((p.clone(), slot)),
                Err(r) => {
                    req.extensions_mut().insert(r);
                }
            }
        }
        req.extensions_mut().insert(Peer(client));
        if let Some(r) = &refused {
            req.extensions_mut().insert(r.clone());
        }
        if let Some(t) = tcp {
            req.extensions_mut().insert(t);
        }
        req.extensions_mut().insert(flushes.clone());
        req.extensions_mut().insert(fanout.clone());
        let (req, read) = ReadToEnd::track(req);
        let answer = router.clone().oneshot(req);
        async move {
            let mut resp = answer.await?;
            if !read.load(std::sync::atomic::Ordering::Relaxed) {
                // Answered before its body was read (an early refusal): the
                // connection cannot carry another request, and says so; it
                // closes with a lingering close (`linger`), so the answer
                // reaches a client still sending.
                resp.headers_mut()
                    .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok::<_, std::convert::Infallible>(match place {
                Some((p, slot)) => held_while_answered(resp, &p, slot),
                None => resp,
            })
        }
    });
    let mut conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(keep_alive)
        // Later heads on this connection: the same limit, answered 431 by hyper.
        .max_buf_size(shared.config.max_header_bytes.max(8192))
        .max_headers(HEADERS_MAX)
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(TokioIo::new(conn), TowerToHyperService::new(service))
        .with_upgrades();
    let result = tokio::select! {
        r = &mut conn => r,
        _ = shared.shutdown.cancelled() => {
            // Finish the response in flight (streams end on the same signal), then close.
            std::pin::Pin::new(&mut conn).graceful_shutdown();
            (&mut conn).await
        }
    };
    let timed_out = match &result {
        Err(e) => {
            tracing::debug!(error = %e, "connection ended with an error");
            e.is_timeout()
        }
        Ok(()) => false,
    };
    // hyper hands back the socket (unless it was upgraded: a WebSocket
    // closes on its own) and the bytes it holds.
    let Some(parts) = conn.into_parts() else {
        return;
    };
    let mut io = parts.io.into_inner();
    io.lingered();
    let tcp = io.conn();
    if timed_out && !parts.read_buf.is_empty() {
        // A later head that timed out part way (slowloris): 408 first, as
        // for a first head.
        let limit = shared.config.header_timeout_ms;
        let out = whole(head_timeout(limit, parts.read_buf.len())).await;
        send_whole(tcp, out, &shared.shutdown).await;
    } else {
        // hyper closes a connection whose request body it did not read
        // (an early refusal: 413, 401, 415, ...) with `connection: close`;
        // a plain close would reset it and could lose that answer.
        linger(tcp, &shared.shutdown).await;
    }
}

/// A request body that notes when it has been read to its end (or had
/// none), so the connection knows whether an answer came before the body
/// was read.
struct ReadToEnd {
    inner: hyper::body::Incoming,
    read: Arc<std::sync::atomic::AtomicBool>,
}

impl ReadToEnd {
    /// `req` with its body tracked, and the flag set once it is read whole.
    fn track(
        req: Request<hyper::body::Incoming>,
    ) -> (Request<ReadToEnd>, Arc<std::sync::atomic::AtomicBool>) {
        use hyper::body::Body as _;
        let read = Arc::new(std::sync::atomic::AtomicBool::new(
            req.body().is_end_stream(),
        ));
        let flag = read.clone();
        (req.map(|inner| ReadToEnd { inner, read }), flag)
    }
}

impl hyper::body::Body for ReadToEnd {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(None)) || self.inner.is_end_stream() {
            self.read.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// `resp`, holding `slot` (a forwarded client's place under the per-IP cap)
/// until its body ends or is dropped (a stream: until it closes); for a
/// WebSocket upgrade, until the connection closes.
fn held_while_answered(
    resp: Response<Body>,
    proxied: &crate::net::listener::Proxied,
    slot: crate::net::listener::ClientSlot,
) -> Response<Body> {
    if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS {
        proxied.hold(slot);
        return resp;
    }
    resp.map(|body| {
        Body::new(http_body_util::BodyExt::map_frame(body, move |frame| {
            let _held = &slot;
            frame
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_lines_are_lower_hex_and_crlf() {
        for (n, want) in [
            (1usize, "1\r\n"),
            (15, "f\r\n"),
            (16, "10\r\n"),
            (0x1234_abcd, "1234abcd\r\n"),
            (usize::MAX, "ffffffffffffffff\r\n"),
        ] {
            let out = chunk_line(n);
            assert_eq!(out, want.as_bytes(), "{n}");
            assert!(out.len() <= CHUNK_LINE_MAX);
        }
    }
}
