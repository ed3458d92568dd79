//! WebSocket transport (RFC 6455), subprotocol `gapless.v1`: one socket for
//! many channels ([`channels`], `GET /v1/ws`) and the consumer side of a
//! session ([`session`], `GET /v1/sessions/{id}/ws`). Messages are JSON text
//! frames, one message per frame (`docs/protocol.md`).
//!
//! Shared here: the handshake check and its cookie guard ([`access`]), socket
//! limits, the heartbeat (a ping every `--heartbeat-ms`; a client that has
//! sent nothing for two intervals since its last frame, one of its pings
//! unanswered for a whole interval while the server ran, is closed with
//! 4408, see [`Heartbeat`]) and the close helpers. Close frames never carry
//! 1005 or 1006 (those are for local reporting only); a client's close frame is
//! always answered ([`answer_close`]). What ends a socket on its own
//! (shutdown, the token's expiry) and the accounting of each delivery come
//! from `ops::stream`; the session rules from `ops::sessions`.

pub(crate) mod channels;
pub mod messages;
pub(crate) mod session;

use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::ApiError;
use crate::App;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use gapless_protocol::codes::ErrorCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The WebSocket routes: `GET /v1/ws` and `GET /v1/sessions/{id}/ws`.
pub(crate) fn routes() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(channels::handler))
        .routes(routes!(session::handler))
}

/// The subprotocol this server speaks.
pub(crate) const SUBPROTOCOL: &str = "gapless.v1";

/// Whether `path` is a WebSocket route: `/v1/ws` or `/v1/sessions/{id}/ws`.
pub(crate) fn is_ws_path(path: &str) -> bool {
    path == "/v1/ws"
        || path
            .strip_prefix("/v1/sessions/")
            .and_then(|rest| rest.strip_suffix("/ws"))
            .is_some_and(|id| !id.is_empty() && !id.contains('/'))
}

/// A WebSocket route takes `GET` only, the one method of a handshake (RFC
/// 6455 section 4.1): any other method, `HEAD` included (which the router
/// would otherwise hand to the `GET` handler), is answered `405
/// method_not_allowed` with `Allow: GET` (RFC 9110 section 15.5.6: a 405
/// lists the methods the route takes) before routing. `None`: not a
/// WebSocket route, or a `GET`. Called by the server's request edge (`lib.rs`).
pub(crate) fn wrong_method(req: &axum::extract::Request) -> Option<Response> {
    if req.method() == axum::http::Method::GET || !is_ws_path(req.uri().path()) {
        return None;
    }
    let mut resp = crate::error::method_not_allowed_error(
        req.method(),
        req.uri().path(),
        " (a WebSocket handshake is a GET: RFC 6455 section 4.1)",
    )
    .into_response();
    resp.headers_mut().insert(
        axum::http::header::ALLOW,
        axum::http::HeaderValue::from_static("GET"),
    );
    Some(resp)
}

/// Refuses a handshake that offers subprotocols, none of which is [`SUBPROTOCOL`].
///
/// # Errors
/// 400 `invalid_request` naming the offered protocols.
pub(crate) fn check_subprotocol(headers: &HeaderMap) -> Result<(), ApiError> {
    let offered: Vec<&str> = headers
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if offered.is_empty() || offered.contains(&SUBPROTOCOL) {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("this endpoint speaks the subprotocol {SUBPROTOCOL}; the client offered {offered:?}"),
        ))
    }
}

/// Bytes tungstenite reads from a socket at a time, and what it allocates
/// per socket for reading: 1 KiB. It zeroes that much before every read
/// attempt (tungstenite 0.29 `FrameCodec::read_in`), which a socket's task
/// makes once per wake-up, whether or not the client sent anything; and the
/// buffer stays allocated (and touched) for the socket's life. A client
/// message of any size up to `--ws-max-message-bytes` is still read: the
/// buffer grows to a frame's length, filled in reads of this size. Client
/// messages are small (subscribe, publish of an event); a larger one takes
/// one read per KiB. (16 KiB cost 24.5 KB per idle socket, 4 KiB 8.6 KB:
/// docs/performance.md.)
const READ_BUFFER_BYTES: usize = 1024;

/// Applies the subprotocol and the socket limits to an upgrade.
pub(crate) fn configure(ws: WebSocketUpgrade, app: &App) -> WebSocketUpgrade {
    let max = app.config.ws_max_message_bytes;
    ws.protocols([SUBPROTOCOL])
        .max_message_size(max)
        .max_frame_size(max)
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(64 * 1024)
        .max_write_buffer_size(max.saturating_mul(2).max(8 << 20))
}

/// Upgrades to a socket served by `task`, on the fan-out runtime when the
/// connection names it ([`crate::net::conn::Fanout`]: every connection
/// hyper serves), else where the upgrade completes. On the fan-out runtime
/// a socket's deliveries do not share the main runtime's threads with
/// publishing and the other requests: a publish is acknowledged without
/// waiting for a round of deliveries, and events published while a round
/// runs go out together in the next (one write per socket), as on the SSE
/// streams.
///
/// The socket is counted in `sockets` ([`App::sockets`]) from the handshake on (this
/// runs in the handler, inside a tracked connection), so shutdown also
/// waits for one between its 101 and its task's start: the task never
/// lands on a fan-out runtime already dropped, and the client gets its 1001.
pub(crate) fn upgrade_on_fanout<F, Fut>(
    ws: WebSocketUpgrade,
    sockets: &tokio_util::task::TaskTracker,
    fanout: Option<axum::extract::Extension<crate::net::conn::Fanout>>,
    task: F,
) -> Response
where
    F: FnOnce(WebSocket) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let sockets = sockets.clone();
    let held = sockets.token();
    ws.on_upgrade(move |socket| {
        let task = sockets.track_future(task(socket));
        drop(held);
        tracing::trace!(bytes = std::mem::size_of_val(&task), "a WebSocket's task");
        async move {
            match fanout {
                Some(axum::extract::Extension(f)) => drop(f.0.spawn(task)),
                None => task.await,
            }
        }
    })
}

/// A text message from pre-encoded JSON bytes.
pub(crate) fn text(bytes: Bytes) -> Message {
    match Utf8Bytes::try_from(bytes) {
        Ok(t) => Message::Text(t),
        // Our encoders only produce UTF-8; this cannot happen.
        Err(_) => Message::Text(Utf8Bytes::from_static("{}")),
    }
}

/// A text message of `v`'s JSON (a `gapless_protocol::ws` message).
pub(crate) fn json(v: &impl serde::Serialize) -> Message {
    Message::Text(Utf8Bytes::from(
        serde_json::to_string(v).unwrap_or_default(),
    ))
}

/// The close reason when a socket's token expires (code 4401).
pub(crate) const EXPIRED_REASON: &str = "token expired; reconnect with a fresh token";

/// Refuses an upgraded socket: one `error` message with the refusal's code
/// and message, then close with 4401 (`unauthorized`) or 4403 (`forbidden`).
pub(crate) async fn refuse(mut socket: WebSocket, e: ApiError) {
    let close_code = if e.code == ErrorCode::Forbidden {
        gapless_protocol::codes::close::FORBIDDEN
    } else {
        gapless_protocol::codes::close::UNAUTHORIZED
    };
    let msg = messages::refusal(e.code, &e.message);
    let _ = socket.send(json(&msg)).await;
    close(&mut socket, close_code, e.code.as_str()).await;
}

/// Sends a close frame with `code` and `reason` (at most 123 bytes), then waits
/// up to one second for the client's close frame so the closing handshake
/// completes (RFC 6455 section 5.5.1). Errors are ignored: the socket is done.
pub(crate) async fn close(socket: &mut WebSocket, code: u16, reason: &str) {
    let mut reason = reason.to_owned();
    while reason.len() > 123 {
        reason.pop();
    }
    let frame = CloseFrame {
        code,
        reason: Utf8Bytes::from(reason),
    };
    if socket.send(Message::Close(Some(frame))).await.is_err() {
        return;
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(Ok(msg)) = socket.recv().await {
            if matches!(msg, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
}

/// Completes a closing handshake the client started (RFC 6455 section
/// 5.5.1: an endpoint that receives a close frame answers with one). The
/// answer is the one the WebSocket layer queued when it read the client's
/// frame: the client's code echoed, or 1002 (protocol error, reason `Protocol
/// violation`) for a code no endpoint may send (section 7.4: 0-999, 1004-1006,
/// 1014-2999 and 5000 up; 1005 and 1006 are for local reporting only). Waits at
/// most a second for a client that does not read; the socket closes when dropped.
pub(crate) async fn answer_close(socket: &mut WebSocket) {
    use futures::SinkExt;
    // The write ends with `ConnectionClosed` once the answer is out: expected.
    let _ = tokio::time::timeout(Duration::from_secs(1), socket.flush()).await;
}

/// Ping schedule and liveness. A client is closed (4408) when it has sent
/// nothing (any frame, a pong included) for two intervals since its last
/// frame **and** a ping the server sent has stayed unanswered for a whole
/// interval **while the server was running**; the check runs at that
/// deadline, not at the next ping.
///
/// The silence is judged from the pings the server actually sent (the
/// caller reports each with [`Heartbeat::pinged`]) and from time the server
/// itself was running: a wake-up that comes more than a quarter interval
/// after its time means the server was stopped or starved meanwhile (a
/// `SIGSTOP`, a VM pause, a container freeze), so it sent no ping and read
/// no answer. Then nobody is judged at that wake-up: the next ping goes out
/// at once, and the client has a full interval of running time from then to
/// answer it, while an answer already waiting is read first. So a pause of
/// any length closes no client that answers, and a client that never
/// answers is still closed an interval after the pause.
///
/// With the connection's [`tcp_info::Peer`](crate::net::tcp_info::Peer) (every
/// socket hyper serves has one where `tcp_info` can be read), a client that
/// is silent but whose TCP shows it reading behind (its window is full: data
/// waits unsent, so the ping may wait behind data it has not read yet, while
/// everything sent is acknowledged or it acknowledged something within the
/// last interval) is not closed: it reads at its own pace.
/// One whose TCP has acknowledged nothing for the bound is closed. (A write
/// that waits on a client that vanished fails by itself: `liveness.rs`.)
pub(crate) struct Heartbeat {
    /// The next wake-up: the next ping or the liveness deadline, whichever is first.
    sleep: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// When `sleep` is due, to tell how late it woke.
    due: Instant,
    next_ping: Instant,
    last_seen: Instant,
    /// When the oldest ping sent since the client's last frame went out
    /// (moved to the end of a pause: see the type's doc); `None`: every
    /// ping sent is answered.
    unanswered: Option<Instant>,
    period: Duration,
    tcp: Option<crate::net::tcp_info::Peer>,
}

/// What the heartbeat asks for.
pub(crate) enum Beat {
    /// Send a ping.
    Ping,
    /// The client did not answer: close it.
    Dead,
}

impl Heartbeat {
    /// A heartbeat of `heartbeat_ms` (0: none); `tcp` judges a silent client
    /// by its connection (see the type's doc).
    pub(crate) fn new(heartbeat_ms: u64, tcp: Option<crate::net::tcp_info::Peer>) -> Self {
        let period = Duration::from_millis(heartbeat_ms);
        let now = Instant::now();
        let sleep = (heartbeat_ms > 0).then(|| Box::pin(tokio::time::sleep_until(now + period)));
        Heartbeat {
            sleep,
            due: now + period,
            next_ping: now + period,
            last_seen: now,
            unanswered: None,
            period,
            tcp,
        }
    }

    /// The client sent something: every ping sent before is answered.
    pub(crate) fn alive(&mut self) {
        self.last_seen = Instant::now();
        self.unanswered = None;
    }

    /// A ping was handed to the socket just now (after a [`Beat::Ping`]):
    /// the client's time to answer it runs from now.
    pub(crate) fn pinged(&mut self) {
        if self.unanswered.is_none() {
            self.unanswered = Some(Instant::now());
        }
        self.arm(self.next_wake());
    }

    /// The next moment to look: the next ping, or the moment the client
    /// becomes silent enough to close.
    fn next_wake(&self) -> Instant {
        match self.unanswered {
            Some(sent) => self
                .next_ping
                .min((self.last_seen + self.period * 2).max(sent + self.period)),
            None => self.next_ping,
        }
    }

    fn arm(&mut self, at: Instant) {
        self.due = at;
        if let Some(sleep) = self.sleep.as_mut() {
            sleep.as_mut().reset(at);
        }
    }

    /// Whether the client is silent but reading behind (see the type's doc).
    fn excused(&self) -> bool {
        let Some(tcp) = &self.tcp else {
            return false;
        };
        match crate::net::tcp_info::lookup(tcp.local(), tcp.peer()) {
            // Data waits for the client's window: it has not read what came
            // before (the ping may be among it), and its TCP still answers:
            // everything sent is acknowledged (only window probes go out) or
            // it acknowledged something within the last interval. Data
            // waiting because sent data is being retransmitted is no excuse.
            Ok(i) => {
                let recent = u128::from(i.last_ack_recv_ms) < self.period.as_millis();
                i.notsent > 0 && (i.unacked == 0 || recent) && !tcp.judge(&i)
            }
            Err(_) => false,
        }
    }

    /// Waits for the next beat (forever when heartbeats are off). Cancel-safe.
    pub(crate) async fn tick(&mut self) -> Beat {
        let period = self.period;
        if self.sleep.is_none() {
            return std::future::pending().await;
        }
        loop {
            if let Some(sleep) = self.sleep.as_mut() {
                sleep.as_mut().await;
            }
            let now = Instant::now();
            if now.saturating_duration_since(self.due) > period / 4 {
                // The server itself was not running on time (stopped, frozen,
                // starved): no ping went out and no answer was read
                // meanwhile. Judge nobody now; ping at once, and give the
                // client a full interval from now (see the type's doc).
                if self.unanswered.is_some() {
                    self.unanswered = Some(now);
                }
                self.next_ping = now + period;
                self.arm(self.next_wake());
                return Beat::Ping;
            }
            let silent = self.last_seen + period * 2 <= now
                && self.unanswered.is_some_and(|sent| sent + period <= now);
            if silent {
                if self.excused() {
                    // Its answer is queued behind data it has not read: count again from now.
                    self.last_seen = now;
                } else {
                    // Asked again (a caller that cannot close yet) only a period later.
                    self.arm(now + period);
                    return Beat::Dead;
                }
            }
            let ping = now >= self.next_ping;
            if ping {
                self.next_ping = now + period;
            }
            self.arm(self.next_wake());
            if ping {
                return Beat::Ping;
            }
        }
    }
}

/// The headers of a WebSocket handshake (RFC 6455 section 4.1), on both
/// WebSocket routes.
// Never built: it exists for the document only.
#[allow(dead_code)]
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub(crate) struct Handshake {
    /// Must include `upgrade` (RFC 6455 section 4.1).
    #[param(rename = "Connection", pattern = "[Uu][Pp][Gg][Rr][Aa][Dd][Ee]")]
    pub connection: String,
    /// `websocket`.
    #[param(rename = "Upgrade", pattern = "^[Ww][Ee][Bb][Ss][Oo][Cc][Kk][Ee][Tt]$")]
    pub upgrade: String,
    /// `13`.
    #[param(rename = "Sec-WebSocket-Version", pattern = "^13$")]
    pub version: String,
    /// 16 random bytes in base64.
    #[param(rename = "Sec-WebSocket-Key", pattern = "^[A-Za-z0-9+/]{22}==$")]
    pub key: String,
    /// Subprotocols offered: when present, it must include `gapless.v1`, which the answer then names.
    #[param(rename = "Sec-WebSocket-Protocol", nullable = false)]
    pub protocol: Option<String>,
}
