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

use super::channels::receive_error;
use super::Handshake;
use super::{close, configure, json, Beat, Heartbeat};
use crate::admin::openapi::shared::{HandshakeForbidden, SessionPath};
use crate::auth::{Action, Grant};
use crate::error::{ApiError, ErrorBody};
use crate::ops::stream_log::{Ended, Tally};
use crate::transport::query::Query;
use crate::App;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::Response;
use futures::SinkExt;
use gapless_core::session::{Attachment, SessionError, Status, OPENED};
use gapless_core::subscription::Item;
use gapless_protocol::codes::{close as code, ErrorCode};
use gapless_protocol::Event;
use serde_json::{json, Value};
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
pub async fn handler(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    tcp: Option<Extension<crate::net::tcp_info::Peer>>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    super::check_subprotocol(&headers)?;
    let grant = crate::auth::origin::access(&app, &headers, raw.as_deref())?.and_then(|g| {
        g.require_session(Action::Subscribe, &id)?;
        Ok(g)
    });
    let q = Query::parse(raw.as_deref());
    let last_seq = match q.get("last_seq") {
        None => None,
        Some(v) => Some(v.parse::<u64>().map_err(|_| {
            ApiError::new(
                ErrorCode::InvalidRequest,
                format!("last_seq={v:?} must be a whole number"),
            )
        })?),
    };
    let takeover = q.flag("takeover")?;
    let ws = configure(ws, &app);
    let sockets = app.sockets.clone();
    let tcp = tcp.map(|Extension(t)| t);
    Ok(match grant {
        Ok(grant) => ws.on_upgrade(move |socket| {
            sockets.track_future(run(app, socket, id, last_seq, takeover, grant, tcp))
        }),
        Err(e) => ws.on_upgrade(move |socket| sockets.track_future(super::refuse(socket, e))),
    })
}

fn refusal(e: &SessionError) -> (u16, ErrorCode) {
    match e {
        // One close code for "unknown, completed or cancelled session" (the
        // design's 4404); the `error` message's code and `status` say which.
        SessionError::Ended { .. } => (code::SESSION_NOT_FOUND, ErrorCode::SessionEnded),
        SessionError::Attached(_) => (code::SESSION_ATTACHED, ErrorCode::SessionAttached),
        SessionError::NotRetained { .. } => {
            (code::SESSION_NOT_RETAINED, ErrorCode::SessionNotRetained)
        }
        SessionError::ResumeDisabled => (code::RESUME_DISABLED, ErrorCode::ResumeDisabled),
        SessionError::Journal(_) => (code::GOING_AWAY, ErrorCode::JournalFailed),
        _ => (code::SESSION_NOT_FOUND, ErrorCode::SessionNotFound),
    }
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
    let attach = app
        .sessions
        .attach(&app.hub, &id, last_seq, takeover, app.config.read_batch)
        .await;
    let att = match attach {
        Ok(a) => a,
        Err(e) => {
            let (close_code, err) = refusal(&e);
            let mut msg = json!({"op": "error", "code": err.as_str(), "message": e.to_string()});
            if let SessionError::Ended { id, status } = &e {
                // Not the producer's "takes no more events": what the consumer can do.
                msg["message"] = Value::from(format!(
                    "session {id:?} is {}: there is nothing live to attach to; attach with \
                     last_seq to receive the rest of its events and its end, or read its history",
                    status.as_str()
                ));
                msg["status"] = Value::from(status.as_str());
            }
            let _ = socket.send(json(&msg)).await;
            close(&mut socket, close_code, err.as_str()).await;
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

/// Delivers the session until it ends or the socket does; returns the close
/// code to send (0: the socket is gone, send nothing).
async fn consume(
    app: &App,
    socket: &mut WebSocket,
    mut att: Attachment,
    grant: &Grant,
    tcp: Option<crate::net::tcp_info::Peer>,
    tally: &mut Tally,
) -> (u16, String) {
    // A silent consumer whose TCP shows it reading behind is not closed.
    let mut hb = Heartbeat::new(app.config.heartbeat_ms, tcp);
    let mut expiry = super::Expiry::new(grant);
    let _open = crate::admin::metrics::Open::<crate::admin::metrics::WsConn>::new();
    let id = att.id().to_owned();
    // Replay ends at the head seen at attach; `None` once `session.resumed` went out.
    // Every attach is answered with `session.resumed`: a live attach (no
    // `last_seq`) at once, with 0 replayed and the head it continues after.
    let head = att.head;
    let mut replay: Option<u64> = att.last_seq.map(|_| 0);
    if att.last_seq.is_none_or(|n| n >= att.head) {
        if send(socket, &resumed(&id, 0, head)).await.is_err() {
            return (0, String::new());
        }
        replay = None;
        // `last_seq` at an ended session's end marker: the consumer has every
        // event; it is told how the session ended, as if it had read the marker.
        if att.status != Status::Open {
            let op = format!("session.{}", att.status.as_str());
            let _ = send(socket, &json!({"op": op, "session": id, "seq": head})).await;
            return (code::NORMAL, format!("session {}", att.status.as_str()));
        }
    }
    let kicked = att.kicked.clone();
    loop {
        tokio::select! {
            biased;
            _ = app.shutdown.cancelled() => return (code::GOING_AWAY, "server shutting down; reconnect with last_seq".into()),
            () = expiry.wait() => return (code::UNAUTHORIZED, super::EXPIRED_REASON.into()),
            _ = kicked.cancelled() => {
                let msg = json!({"op": "error", "code": ErrorCode::SessionAttached.as_str(),
                    "message": "taken over by a newer connection"});
                let _ = send(socket, &msg).await;
                return (code::SESSION_ATTACHED, "taken over by a newer connection".into());
            }
            msg = socket.recv() => match msg {
                None => return (0, String::new()),
                Some(Ok(Message::Close(_))) => {
                    super::answer_close(socket).await;
                    return (0, String::new());
                }
                Some(Err(e)) => return receive_error(&e, app.config.ws_max_message_bytes).unwrap_or((0, String::new())),
                Some(Ok(Message::Text(_) | Message::Binary(_))) => {
                    hb.alive();
                    let msg = json!({"op": "error", "code": ErrorCode::InvalidMessage.as_str(),
                        "message": "a session consumer socket takes no messages; it only receives"});
                    if send(socket, &msg).await.is_err() {
                        return (0, String::new());
                    }
                }
                Some(Ok(_)) => hb.alive(),
            },
            beat = hb.tick() => match beat {
                Beat::Ping => {
                    if socket.send(Message::Ping(Default::default())).await.is_err() {
                        return (0, String::new());
                    }
                    hb.pinged();
                }
                Beat::Dead => return (code::HEARTBEAT_TIMEOUT, "no answer to ping".into()),
            },
            item = att.sub.next() => match item {
                Ok(Item::Events { index, events }) => {
                    tally.events(events.len());
                    crate::admin::metrics::delivered(
                        crate::admin::metrics::Transport::Ws,
                        events.len(),
                        events.last().map_or(0, |e| e.time),
                        att.sub.lag(index),
                    );
                    for e in &events {
                        if let Some(n) = replay.as_mut() {
                            if e.seq > att.head {
                                if socket.feed(json(&resumed(&id, *n, head))).await.is_err() {
                                    return (0, String::new());
                                }
                                replay = None;
                            }
                        }
                        if let Some(status) = Status::of_marker(e.event_type.as_deref()) {
                            if let Some(n) = replay {
                                let _ = socket.feed(json(&resumed(&id, n, head))).await;
                            }
                            let op = format!("session.{}", status.as_str());
                            let _ = send(socket, &json!({"op": op, "session": id, "seq": e.seq})).await;
                            return (code::NORMAL, format!("session {}", status.as_str()));
                        }
                        if e.event_type.as_deref() == Some(OPENED) {
                            continue;
                        }
                        if let Some(n) = replay.as_mut() {
                            *n += 1;
                        }
                        if socket.feed(json(&event(&id, e))).await.is_err() {
                            return (0, String::new());
                        }
                    }
                    if let Some(n) = replay {
                        if events.last().is_some_and(|e| e.seq >= att.head) {
                            if socket.feed(json(&resumed(&id, n, head))).await.is_err() {
                                return (0, String::new());
                            }
                            replay = None;
                        }
                    }
                    if socket.flush().await.is_err() {
                        return (0, String::new());
                    }
                }
                Ok(Item::Gap(g)) => {
                    // Retention passed the consumer: a session never replays in part.
                    tally.gaps(1);
                    let msg = json!({"op": "error", "code": ErrorCode::SessionNotRetained.as_str(),
                        "message": format!("events after seq {} are no longer retained; start over", g.after.map_or(0, |a| a.1))});
                    let _ = send(socket, &msg).await;
                    return (code::SESSION_NOT_RETAINED, "events no longer retained".into());
                }
                Ok(Item::Ephemeral(_)) => {}
                Err(e) => return (code::GOING_AWAY, format!("journal read failed: {e}")),
            },
        }
    }
}

async fn send(socket: &mut WebSocket, v: &Value) -> Result<(), axum::Error> {
    socket.send(json(v)).await
}

/// `session.resumed`: `replayed_events` were replayed (0 for a live attach)
/// and delivery continues live after seq `head`.
fn resumed(id: &str, n: u64, head: u64) -> Value {
    json!({"op": "session.resumed", "session": id, "replayed_events": n, "head": head})
}

fn event(id: &str, e: &Event) -> Value {
    json!({
        "op": "event",
        "session": id,
        "seq": e.seq,
        "type": e.event_type,
        "data": e.data,
        "time": e.time,
    })
}
