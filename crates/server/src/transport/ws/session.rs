//! `GET /v1/sessions/{id}/ws?last_seq=N&takeover=true`: the consumer side of a session.
//!
//! Refusals accept the socket first, send one `error` message, then close with
//! the code of the refusal (4404, 4409, 4410, 4400): a refusal before the
//! upgrade would collapse into a bare HTTP status that browsers do not expose.
//! With `last_seq`, every retained event with `seq > last_seq` is replayed in
//! order, then one `session.resumed` message, then live events; without it,
//! `session.resumed` (0 replayed) comes first, then live events. Its `head`
//! is the seq after which delivery continues live. The end of
//! the session (even one that ended while the consumer was away) is
//! `session.completed` or `session.cancelled`, then close 1000.
//!
//! The rules (who may attach, `last_seq`, each refusal's code and message,
//! what a replay sends) are `ops::sessions`'s; this reads the handshake,
//! writes their answers as messages and close codes, and keeps the socket
//! (heartbeat, token expiry, shutdown).

use super::channels::receive_error;
use super::Handshake;
use super::{close, configure, json, Beat, Heartbeat};
use crate::admin::openapi::shared::{HandshakeForbidden, SessionPath};
use crate::auth::Grant;
use crate::error::{ApiError, ErrorBody};
use crate::metrics::Transport;
use crate::ops::sessions::{self, Replay, Step};
use crate::ops::stream::{self, Expiry};
use crate::ops::stream_log::{Ended, Tally};
use crate::transport::query::Query;
use crate::App;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::Response;
use futures::SinkExt;
use gapless_core::session::{Attachment, Status};
use gapless_core::subscription::{Item, Subscription};
use gapless_core::JournalError;
use gapless_protocol::codes::{close as code, ErrorCode};
use gapless_protocol::ws::{ErrorMessage, SessionMessage};
use gapless_protocol::Event;
use serde_json::Map;
use std::borrow::Cow;
use std::sync::Arc;

/// The upgrade handler. A malformed `last_seq` or `takeover` is a 400 before the upgrade.
///
/// The token must allow `subscribe` on `session/ID`: a missing or invalid
/// token is closed with 4401, a forbidden one with 4403, after the upgrade
/// and one `error` message (the same whether or not the session exists).
/// The `gapless_token` cookie from a foreign page is refused before the
/// upgrade: 403 ([`crate::auth::origin::access`]).
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/ws",
    operation_id = "ws_session",
    summary = "WebSocket: a session's consumer",
    tag = "sessions",
    description = "The consumer side of a session: a WebSocket (RFC 6455) of subprotocol `gapless.v1` that delivers the session's events, then its end (docs/protocol.md). The request must be a WebSocket handshake. Refusals come after the upgrade, as one `error` message and a close code: 4401 or 4403 (token), 4404 (no session to attach to: `session_not_found` for an unknown or expired one; `session_ended`, with `status`, for a completed or cancelled one attached without `last_seq`), 4409 (attached elsewhere), 4410 (events after `last_seq` not retained), 4400 (resume turned off).",
    params(
        SessionPath,
        ("last_seq" = Option<gapless_protocol::schema::Seq>, Query, description = "Resume after this seq: every retained event after it is replayed, then `session.resumed`."),
        ("takeover" = Option<crate::transport::query::Flag>, Query, description = "Replace a live attachment instead of being refused with 4409."),
        Handshake,
    ),
    responses(
        (status = 101, description = "Switching Protocols: the socket is open."),
        (status = 400, description = "`invalid_request`: a bad `last_seq` or `takeover`, not a WebSocket handshake, or subprotocols offered without `gapless.v1`.", body = ErrorBody),
        HandshakeForbidden,
    ),
)]
pub(crate) async fn handler(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    tcp: Option<Extension<crate::net::tcp_info::Peer>>,
    fanout: Option<Extension<crate::net::conn::Fanout>>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    super::check_subprotocol(&headers)?;
    let grant = crate::auth::origin::access(&app, &headers, raw.as_deref())?.and_then(|g| {
        sessions::may_consume(&g, &id)?;
        Ok(g)
    });
    let q = Query::parse(raw.as_deref());
    let last_seq = sessions::last_seq(q.get("last_seq"))?;
    let takeover = q.flag("takeover")?;
    let ws = configure(ws, &app);
    let sockets = app.sockets.clone();
    let tcp = tcp.map(|Extension(t)| t);
    Ok(match grant {
        Ok(grant) => super::upgrade_on_fanout(ws, &sockets, fanout, move |socket| {
            run(app, socket, id, last_seq, takeover, grant, tcp)
        }),
        Err(e) => ws.on_upgrade(move |socket| sockets.track_future(super::refuse(socket, e))),
    })
}

/// The close code of a refused attach: one (the design's 4404) for
/// "unknown, completed or cancelled session", whose `error` message's code
/// and `status` say which.
fn refusal_close(e: &ApiError) -> u16 {
    match e.code {
        ErrorCode::SessionAttached => code::SESSION_ATTACHED,
        ErrorCode::SessionNotRetained => code::SESSION_NOT_RETAINED,
        ErrorCode::ResumeDisabled => code::RESUME_DISABLED,
        ErrorCode::JournalFailed => code::GOING_AWAY,
        _ => code::SESSION_NOT_FOUND,
    }
}

/// The `error` message of a refusal: its code, message and `status`, if any.
fn error_message(e: &ApiError) -> SessionMessage<'_> {
    let mut extra = Map::new();
    if let Some(status) = e.extra.get("status") {
        extra.insert("status".to_owned(), status.clone());
    }
    SessionMessage::Error(ErrorMessage {
        id: None,
        code: Cow::Borrowed(e.code.as_str()),
        message: Cow::Borrowed(&e.message),
        extra,
    })
}

async fn run(
    app: Arc<App>,
    mut socket: WebSocket,
    id: String,
    last_seq: Option<u64>,
    takeover: bool,
    grant: Arc<Grant>,
    tcp: Option<crate::net::tcp_info::Peer>,
) {
    let att = match sessions::attach(&app, &id, last_seq, takeover).await {
        Ok(a) => a,
        Err(e) => {
            let _ = send(&mut socket, &error_message(&e)).await;
            close(&mut socket, refusal_close(&e), e.code.as_str()).await;
            return;
        }
    };
    let mut tally = Tally::new(0);
    let (c, reason) = consume(&app, &mut socket, att, &grant, tcp, &mut tally).await;
    tally.ended_by(match c {
        0 => Ended::ClientClosed,
        code::NORMAL | code::SESSION_ATTACHED => Ended::SessionOver,
        code::SESSION_NOT_RETAINED => Ended::NotRetained,
        code::GOING_AWAY if app.shutdown.is_cancelled() => Ended::Shutdown,
        code::GOING_AWAY => Ended::JournalFailed,
        code::UNAUTHORIZED => Ended::TokenExpired,
        code::HEARTBEAT_TIMEOUT => Ended::HeartbeatTimeout,
        _ => Ended::ProtocolError,
    });
    if c != 0 {
        close(&mut socket, c, &reason).await;
    }
    tally.log("ws", &format_args!("session/{id}"));
}

/// Why delivery stops: the close code to send and its reason (code 0: the
/// socket is gone, send nothing).
type Stop = (u16, String);

/// The socket is gone: nothing more can be sent.
fn gone() -> Stop {
    (0, String::new())
}

/// The session ended with `status`: close 1000.
fn ended(status: Status) -> Stop {
    (code::NORMAL, format!("session {}", status.as_str()))
}

/// Delivers the session until it ends or the socket does: what is owed at
/// once (`session.resumed`, the end of an ended session), then each of the
/// socket's events in turn (shutdown, token expiry, a takeover, the
/// client's frames, the heartbeat, the session's events).
async fn consume(
    app: &App,
    socket: &mut WebSocket,
    mut att: Attachment,
    grant: &Grant,
    tcp: Option<crate::net::tcp_info::Peer>,
    tally: &mut Tally,
) -> Stop {
    // A silent consumer whose TCP shows it reading behind is not closed.
    let mut hb = Heartbeat::new(app.config.heartbeat_ms, tcp);
    let mut expiry = Expiry::new(grant);
    let _open = crate::metrics::Open::<crate::metrics::WsConn>::new();
    let id = att.id().to_owned();
    let (mut replay, now) = Replay::start(&att);
    for step in now {
        if let Step::Ended { status, .. } = step {
            let _ = send(socket, &message(&id, step)).await;
            return ended(status);
        }
        if send(socket, &message(&id, step)).await.is_err() {
            return gone();
        }
    }
    let kicked = att.kicked.clone();
    loop {
        let stop = tokio::select! {
            biased;
            _ = app.shutdown.cancelled() => Some((code::GOING_AWAY, "server shutting down; reconnect with last_seq".into())),
            () = expiry.wait() => Some((code::UNAUTHORIZED, super::EXPIRED_REASON.into())),
            _ = kicked.cancelled() => Some(taken_over(socket).await),
            msg = socket.recv() => on_client(app, socket, &mut hb, msg).await,
            beat = hb.tick() => on_beat(socket, &mut hb, beat).await,
            item = att.sub.next() => deliver(socket, &att.sub, &id, &mut replay, tally, item).await,
        };
        if let Some(stop) = stop {
            return stop;
        }
    }
}

/// A newer consumer took the session over: one `error` message, then 4409.
async fn taken_over(socket: &mut WebSocket) -> Stop {
    let e = ApiError::new(ErrorCode::SessionAttached, sessions::TAKEN_OVER);
    let _ = send(socket, &error_message(&e)).await;
    (code::SESSION_ATTACHED, sessions::TAKEN_OVER.into())
}

/// A frame from the client (`None`: the socket ended): every frame shows it
/// alive; a close is answered; a message is refused (the socket only
/// receives) and the socket stays open.
async fn on_client(
    app: &App,
    socket: &mut WebSocket,
    hb: &mut Heartbeat,
    msg: Option<Result<Message, axum::Error>>,
) -> Option<Stop> {
    match msg {
        None => Some(gone()),
        Some(Ok(Message::Close(_))) => {
            super::answer_close(socket).await;
            Some(gone())
        }
        Some(Err(e)) => {
            Some(receive_error(&e, app.config.ws_max_message_bytes).unwrap_or_else(gone))
        }
        Some(Ok(Message::Text(_) | Message::Binary(_))) => {
            hb.alive();
            let e = ApiError::new(ErrorCode::InvalidMessage, sessions::CONSUMER_TAKES_NOTHING);
            send(socket, &error_message(&e)).await.err().map(|_| gone())
        }
        Some(Ok(_)) => {
            hb.alive();
            None
        }
    }
}

/// A heartbeat: a ping, or 4408 for a client that did not answer.
async fn on_beat(socket: &mut WebSocket, hb: &mut Heartbeat, beat: Beat) -> Option<Stop> {
    match beat {
        Beat::Ping => {
            if socket
                .send(Message::Ping(Default::default()))
                .await
                .is_err()
            {
                return Some(gone());
            }
            hb.pinged();
            None
        }
        Beat::Dead => Some((code::HEARTBEAT_TIMEOUT, "no answer to ping".into())),
    }
}

/// What the subscription gave: events to send, a gap (retention passed the
/// consumer: a session never replays in part, 4410), or a journal failure.
async fn deliver(
    socket: &mut WebSocket,
    sub: &Subscription,
    id: &str,
    replay: &mut Replay,
    tally: &mut Tally,
    item: Result<Item, JournalError>,
) -> Option<Stop> {
    match item {
        Ok(Item::Events { index, events }) => {
            stream::delivered(Transport::Ws, tally, sub, index, &events);
            send_events(socket, id, replay, &events).await
        }
        Ok(Item::Gap(g)) => {
            tally.gaps(1);
            let e = sessions::not_retained(g.after.map_or(0, |a| a.1));
            let _ = send(socket, &error_message(&e)).await;
            Some((
                code::SESSION_NOT_RETAINED,
                "events no longer retained".into(),
            ))
        }
        Ok(Item::Ephemeral(_)) => None,
        Err(e) => Some((code::GOING_AWAY, format!("journal read failed: {e}"))),
    }
}

/// Sends one batch of the session's events, with `session.resumed` where
/// the replay owes it, in one flush; stops at the session's end.
async fn send_events(
    socket: &mut WebSocket,
    id: &str,
    replay: &mut Replay,
    events: &[Arc<Event>],
) -> Option<Stop> {
    for e in events {
        if let Some(r) = replay.resumed_before(e) {
            if socket.feed(json(&message(id, r))).await.is_err() {
                return Some(gone());
            }
        }
        match replay.event(e) {
            Some(Step::Ended { status, seq }) => {
                if let Some(r) = replay.resumed() {
                    let _ = socket.feed(json(&message(id, r))).await;
                }
                let _ = send(socket, &message(id, Step::Ended { status, seq })).await;
                return Some(ended(status));
            }
            Some(step) if socket.feed(json(&message(id, step))).await.is_err() => {
                return Some(gone());
            }
            Some(_) | None => {}
        }
    }
    if let Some(r) = replay.resumed_after(events.last().map(|e| &**e)) {
        if socket.feed(json(&message(id, r))).await.is_err() {
            return Some(gone());
        }
    }
    socket.flush().await.err().map(|_| gone())
}

async fn send(socket: &mut WebSocket, v: &impl serde::Serialize) -> Result<(), axum::Error> {
    socket.send(json(v)).await
}

/// The message of one step for the consumer of session `id`:
/// `session.resumed` (`replayed_events`, `head`), `event`, or
/// `session.completed` / `session.cancelled` (`seq`).
fn message<'a>(id: &'a str, step: Step<'a>) -> SessionMessage<'a> {
    let session = Cow::Borrowed(id);
    match step {
        Step::Resumed { replayed, head } => SessionMessage::Resumed {
            session,
            replayed_events: replayed,
            head: Some(head),
        },
        Step::Event(e) => SessionMessage::Event {
            session,
            seq: e.seq,
            event_type: e.event_type.as_deref().map(Cow::Borrowed),
            data: e.data.wire(),
            encoding: e.data.encoding(),
            time: e.time,
        },
        Step::Ended {
            status: Status::Cancelled,
            seq,
        } => SessionMessage::Cancelled { session, seq },
        Step::Ended { seq, .. } => SessionMessage::Completed { session, seq },
    }
}
