//! `GET /v1/ws`: one socket, many channels, plus publishing.
//!
//! A subscribe with a cursor gets every missed event after it, in order, then
//! its `subscribed` reply, then live events: events up to the head seen at
//! subscribe time are the replay; the reply goes out right after the last of
//! them. A malformed message gets an `error` reply and the socket stays open;
//! [`MAX_ERRORS_IN_A_ROW`] malformed messages in a row close it with 4422.

use super::messages::{self, ClientMessage};
use super::Handshake;
use super::{close, configure, json, text, Beat, Heartbeat};
use crate::admin::openapi::shared::HandshakeForbidden;
use crate::auth::{Action, Grant};
use crate::error::{ApiError, ErrorBody};
use crate::ops::names;
use crate::ops::presence::{self, Seat};
use crate::ops::publish::{self as op, KeyName};
use crate::ops::start::{self, Resume};
use crate::ops::stream::{self, Expiry};
use crate::ops::stream_log::{ChannelList, Ended, Tally};
use crate::{App, Peer};
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::Response;
use futures::SinkExt;
use gapless_core::subscription::{Item, Start, Subscription};
use gapless_protocol::codes::{close as code, ErrorCode};
use gapless_protocol::ws::{PublishedMessage, ServerMessage, Subscribed, Unsubscribed};
use gapless_protocol::{name, Cursor, NewEvent};
use serde_json::Value;
use std::net::IpAddr;
use std::sync::Arc;

/// Malformed messages in a row after which the socket is closed (4422).
pub(crate) const MAX_ERRORS_IN_A_ROW: u32 = 10;

/// The upgrade handler.
///
/// A token that is missing or fails verification is refused after the
/// upgrade (browsers do not show a handshake's HTTP status): one `error`
/// message `unauthorized`, then close 4401. The `gapless_token` cookie
/// from a foreign page is refused before it: 403 ([`crate::auth::origin::access`]).
#[utoipa::path(
    get,
    path = "/v1/ws",
    operation_id = "ws_channels",
    summary = "WebSocket: follow many channels, publish",
    tag = "subscribe",
    description = "A WebSocket (RFC 6455) of subprotocol `gapless.v1`: one socket follows many channels and may publish; messages are JSON text frames (docs/protocol.md). The request must be a WebSocket handshake (`Connection: upgrade`, `Upgrade: websocket`, `Sec-WebSocket-Version: 13`, `Sec-WebSocket-Key`). A token is checked after the upgrade: a refusal is one `error` message, then close 4401 (`unauthorized`) or 4403 (`forbidden`).",
    params(
        Handshake,
    ),
    responses(
        (status = 101, description = "Switching Protocols: the socket is open (`Sec-WebSocket-Protocol: gapless.v1` when the client offered it)."),
        (status = 400, description = "`invalid_request`: not a WebSocket handshake (the message names the header), or subprotocols offered without `gapless.v1`.", body = ErrorBody),
        HandshakeForbidden,
    ),
)]
pub(crate) async fn handler(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    peer: Option<Extension<Peer>>,
    tcp: Option<Extension<crate::net::tcp_info::Peer>>,
    fanout: Option<Extension<crate::net::conn::Fanout>>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    super::check_subprotocol(&headers)?;
    let access = crate::auth::origin::access(&app, &headers, raw.as_deref())?;
    let ws = configure(ws, &app);
    let sockets = app.sockets.clone();
    let peer = peer.map(|Extension(p)| p.0.ip());
    let tcp = tcp.map(|Extension(t)| t);
    Ok(match access {
        Ok(grant) => super::upgrade_on_fanout(ws, &sockets, fanout, move |socket| {
            run(app, socket, grant, peer, tcp)
        }),
        Err(e) => ws.on_upgrade(move |socket| sockets.track_future(super::refuse(socket, e))),
    })
}

/// A subscribe whose replay is still going out.
struct Pending {
    channel: String,
    id: Option<Value>,
    head: u64,
    replayed: u64,
    recovered: bool,
}

struct Conn {
    app: Arc<App>,
    grant: Arc<Grant>,
    peer: Option<IpAddr>,
    sub: Subscription,
    pending: Vec<Pending>,
    errors_in_row: u32,
    /// What the socket sent and why it ended, for its log line.
    tally: Tally,
    /// Its places in the presence of the channels it follows that have it,
    /// and the notices it asked for (`ops::presence`); left when the socket
    /// ends.
    seat: Seat,
}

impl Drop for Conn {
    /// The socket's log line (`stream_log.rs`).
    fn drop(&mut self) {
        self.tally.log("ws", &ChannelList(&self.sub));
    }
}

enum Flow {
    Continue,
    Close(u16, String),
}

/// Sends a ping and starts the client's time to answer it.
async fn ping(socket: &mut WebSocket, hb: &mut Heartbeat) -> Result<(), Ended> {
    socket
        .send(Message::Ping(Default::default()))
        .await
        .map_err(|_| Ended::WriteFailed)?;
    hb.pinged();
    Ok(())
}

/// Delivers `item` with the heartbeat running while the delivery waits for
/// a full socket: a ping due meanwhile goes right after it (a silent client
/// is judged again once the write is done). A client that vanished
/// meanwhile is found by the socket itself (`liveness.rs`): the write fails.
async fn deliver_beating(
    conn: &mut Conn,
    socket: &mut WebSocket,
    hb: &mut Heartbeat,
    item: Item,
) -> Result<(), Ended> {
    let mut ping_owed = false;
    {
        let deliver = conn.deliver(item, socket);
        tokio::pin!(deliver);
        loop {
            tokio::select! {
                r = &mut deliver => break r.map_err(|()| Ended::WriteFailed)?,
                beat = hb.tick() => match beat {
                    Beat::Ping => ping_owed = true,
                    // Silent: judged again once the write is done.
                    Beat::Dead => {}
                },
            }
        }
    }
    if ping_owed {
        ping(socket, hb).await?;
    }
    Ok(())
}

async fn run(
    app: Arc<App>,
    mut socket: WebSocket,
    grant: Arc<Grant>,
    peer: Option<IpAddr>,
    tcp: Option<crate::net::tcp_info::Peer>,
) {
    let _open = crate::metrics::Open::<crate::metrics::WsConn>::new();
    let mut hb = Heartbeat::new(app.config.heartbeat_ms, tcp);
    let shutdown = app.shutdown.clone();
    let mut expiry = Expiry::new(&grant);
    let mut conn = Conn {
        sub: app.hub.empty_subscription(app.config.read_batch),
        seat: app.presence.seat(),
        grant,
        peer,
        app,
        pending: Vec::new(),
        errors_in_row: 0,
        tally: Tally::new(0),
    };
    loop {
        let flow = tokio::select! {
            biased;
            _ = shutdown.cancelled() => Flow::Close(code::GOING_AWAY, "server shutting down; reconnect and resume".into()),
            () = expiry.wait() => Flow::Close(code::UNAUTHORIZED, super::EXPIRED_REASON.into()),
            msg = socket.recv() => match msg {
                None => return,
                Some(Ok(Message::Close(_))) => {
                    super::answer_close(&mut socket).await;
                    return;
                }
                Some(Err(e)) => match receive_error(&e, conn.app.config.ws_max_message_bytes) {
                    Some((c, reason)) => Flow::Close(c, reason),
                    None => return,
                },
                Some(Ok(msg)) => {
                    hb.alive();
                    // Boxed: a message's handling (a subscribe's journal
                    // read, a publish) is large and rare; unboxed, its
                    // state would stay allocated in every socket's task.
                    match Box::pin(conn.on_message(msg, &mut socket)).await {
                        Ok(flow) => flow,
                        Err(()) => return conn.tally.ended_by(Ended::WriteFailed),
                    }
                }
            },
            item = conn.sub.next() => match item {
                // Boxed as well: one small allocation per step (a step
                // carries every event ready), rather than the delivery's
                // state in every idle socket's task.
                Ok(item) => match Box::pin(deliver_beating(&mut conn, &mut socket, &mut hb, item)).await {
                    Ok(()) => Flow::Continue,
                    Err(why) => return conn.tally.ended_by(why),
                },
                Err(e) => Flow::Close(code::GOING_AWAY, format!("journal read failed: {e}")),
            },
            notice = conn.seat.next() => {
                match socket.send(json(&ServerMessage::Presence(notice))).await {
                    Ok(()) => Flow::Continue,
                    Err(_) => return conn.tally.ended_by(Ended::WriteFailed),
                }
            }
            beat = hb.tick() => match beat {
                Beat::Ping => match ping(&mut socket, &mut hb).await {
                    Ok(()) => Flow::Continue,
                    Err(why) => return conn.tally.ended_by(why),
                },
                Beat::Dead => Flow::Close(code::HEARTBEAT_TIMEOUT, "no answer to ping".into()),
            },
        };
        if let Flow::Close(c, reason) = flow {
            conn.tally.ended_by(match c {
                code::GOING_AWAY if shutdown.is_cancelled() => Ended::Shutdown,
                code::GOING_AWAY => Ended::JournalFailed,
                code::UNAUTHORIZED => Ended::TokenExpired,
                code::HEARTBEAT_TIMEOUT => Ended::HeartbeatTimeout,
                _ => Ended::ProtocolError,
            });
            Box::pin(close(&mut socket, c, &reason)).await;
            return;
        }
    }
}

/// The close frame owed for a receive error: 1009 for a message over the
/// limit, 1007 for invalid UTF-8 in a text message or a close frame's reason,
/// 1002 for a close frame of 1 byte and any other protocol violation
/// (RFC 6455 sections 5.5.1, 7.4.1, 8.1); `None` when the connection itself
/// failed (nothing can be sent).
pub(crate) fn receive_error(e: &axum::Error, max: usize) -> Option<(u16, String)> {
    let s = e.to_string();
    if s.contains("Space limit exceeded") || s.contains("Message too long") {
        Some((code::TOO_BIG, format!("message larger than {max} bytes")))
    } else if s.contains("UTF-8") || s.contains("utf-8") || s.contains("utf8") {
        Some((
            code::INVALID_DATA,
            "invalid UTF-8 in a text message or a close frame's reason".into(),
        ))
    } else if s.contains("Invalid close sequence") {
        Some((
            code::PROTOCOL_ERROR,
            "a close frame's payload must be empty, or a 2-byte code and a UTF-8 reason".into(),
        ))
    } else if s.contains("IO error") || s.contains("Connection reset") || s.contains("closed") {
        None
    } else {
        let mut reason = format!("protocol error: {s}");
        reason.truncate(100);
        Some((code::PROTOCOL_ERROR, reason))
    }
}

impl Conn {
    async fn on_message(&mut self, msg: Message, socket: &mut WebSocket) -> Result<Flow, ()> {
        let text = match msg {
            Message::Text(t) => t,
            Message::Binary(_) => {
                return self
                    .malformed(
                        socket,
                        None,
                        "binary frames are not accepted; send JSON text",
                    )
                    .await
            }
            _ => return Ok(Flow::Continue),
        };
        let parsed = match messages::parse(text.as_str()) {
            Ok(m) => m,
            Err((id, why)) => return self.malformed(socket, id.as_ref(), &why).await,
        };
        self.errors_in_row = 0;
        let reply = match parsed {
            ClientMessage::Subscribe {
                id,
                channel,
                cursor,
                since,
                client_id,
                presence,
            } => {
                match self
                    .subscribe(
                        id.clone(),
                        channel,
                        (cursor, since),
                        (client_id, presence),
                        socket,
                    )
                    .await?
                {
                    Ok(()) => None,
                    Err(e) => Some(messages::refused(id.as_ref(), &e)),
                }
            }
            ClientMessage::Unsubscribe { id, channel } => {
                if let Some(reply) = self.settle(&channel) {
                    socket.send(json(&reply)).await.map_err(|_| ())?;
                }
                self.seat.exit(&channel);
                if self.sub.unfollow(&channel) {
                    Some(ServerMessage::Unsubscribed(Unsubscribed { id, channel }))
                } else {
                    Some(messages::error(
                        id.as_ref(),
                        ErrorCode::NotSubscribed,
                        &format!("not subscribed to channel {channel:?}"),
                    ))
                }
            }
            ClientMessage::Publish {
                id,
                channel,
                data,
                encoding,
                event_type,
                ephemeral,
                idempotency_key,
            } => Some(
                match self
                    .publish(
                        &channel,
                        (data, encoding),
                        event_type,
                        ephemeral,
                        idempotency_key,
                    )
                    .await
                {
                    Ok(mut m) => {
                        let (PublishedMessage::Journaled { id: slot, .. }
                        | PublishedMessage::Ephemeral { id: slot, .. }) = &mut m;
                        *slot = Some(id.unwrap_or(Value::Null));
                        ServerMessage::Published(m)
                    }
                    Err(e) => messages::refused(id.as_ref(), &e),
                },
            ),
        };
        if let Some(reply) = reply {
            socket.send(json(&reply)).await.map_err(|_| ())?;
        }
        Ok(Flow::Continue)
    }

    async fn malformed(
        &mut self,
        socket: &mut WebSocket,
        id: Option<&Value>,
        why: &str,
    ) -> Result<Flow, ()> {
        self.errors_in_row += 1;
        if self.errors_in_row >= MAX_ERRORS_IN_A_ROW {
            return Ok(Flow::Close(
                code::TOO_MANY_ERRORS,
                format!("{MAX_ERRORS_IN_A_ROW} malformed messages in a row"),
            ));
        }
        let reply = messages::error(id, ErrorCode::InvalidMessage, why);
        socket.send(json(&reply)).await.map_err(|_| ())?;
        Ok(Flow::Continue)
    }

    /// Outer `Err(())`: the socket failed. Inner error: the reply to send.
    async fn subscribe(
        &mut self,
        id: Option<Value>,
        channel: String,
        (cursor, since): (Option<String>, Option<String>),
        (client_id, listen): (Option<String>, bool),
        socket: &mut WebSocket,
    ) -> Result<Result<(), ApiError>, ()> {
        if let Err(e) = name::validate_channel(&channel) {
            return Ok(Err(ApiError::new(ErrorCode::InvalidChannel, e.to_string())));
        }
        if let Err(e) = self.grant.require(Action::Subscribe, &channel) {
            return Ok(Err(e));
        }
        let member = match presence::member(&self.app, &self.grant, client_id.as_deref()) {
            Ok(member) => member,
            Err(e) => return Ok(Err(e)),
        };
        if listen {
            if let Err(e) = presence::require(&self.app, &channel) {
                return Ok(Err(e));
            }
        }
        let max = self.app.config.max_subscription_channels;
        if self.sub.index_of(&channel).is_none() && self.sub.len() >= max {
            return Ok(Err(ApiError::new(
                ErrorCode::LimitReached,
                format!("a socket may follow at most {max} channels (--max-subscription-channels)"),
            )));
        }
        // Checked whether or not a cursor wins, as on SSE (`ops::start`).
        let given = since.is_some();
        let since = match start::since(since.as_deref()) {
            Ok(since) => since,
            Err(e) => return Ok(Err(e)),
        };
        let start = match cursor.as_deref().filter(|c| !c.is_empty()) {
            Some(c) => match start::read(c.as_bytes()) {
                Ok(Resume::Cursor(cur)) => match start::on_channel(&cur, &channel) {
                    Some(start) => start,
                    None => {
                        return Ok(Err(ApiError::new(
                            ErrorCode::InvalidCursor,
                            format!("the cursor does not name a position on channel {channel:?}"),
                        )))
                    }
                },
                Ok(_) => Start::Unknown,
                Err(e) => return Ok(Err(ApiError::new(ErrorCode::InvalidCursor, e.to_string()))),
            },
            None => start::or_latest(&self.app.config.namespaces, &channel, given, since),
        };
        // A subscribe still replaying on this channel gets its reply before it is replaced.
        if let Some(reply) = self.settle(&channel) {
            socket.send(json(&reply)).await.map_err(|_| ())?;
        }
        let resumed = matches!(start, Start::After { .. });
        let followed = match self.app.hub.follow(&mut self.sub, &channel, start).await {
            Ok(f) => f,
            Err(e) => return Ok(Err(e.into())),
        };
        self.pending.retain(|p| p.channel != channel);
        if presence::enabled(&self.app, &channel) {
            let linger_ms = presence::linger_ms(&self.app, &channel);
            self.seat.enter(&channel, member, listen, linger_ms);
        }
        if let Some(g) = &followed.gap {
            self.tally.gaps(1);
            socket.send(json(&messages::gap(g))).await.map_err(|_| ())?;
        }
        let pending = Pending {
            channel,
            id,
            head: followed.head,
            replayed: 0,
            recovered: resumed && followed.gap.is_none(),
        };
        let pos = self
            .sub
            .index_of(&pending.channel)
            .map_or(followed.head, |i| self.sub.position(i).1);
        if pos >= pending.head {
            socket
                .send(json(&self.subscribed(&pending)))
                .await
                .map_err(|_| ())?;
        } else {
            self.pending.push(pending);
        }
        Ok(Ok(()))
    }

    /// Ends the replay of a pending subscribe on `channel` early (it is being
    /// unsubscribed or replaced): its `subscribed` reply, with what was replayed so
    /// far, so that every request gets exactly one reply.
    fn settle(&mut self, channel: &str) -> Option<ServerMessage<'static>> {
        let i = self.pending.iter().position(|p| p.channel == channel)?;
        let mut p = self.pending.swap_remove(i);
        p.recovered = false;
        Some(self.subscribed(&p))
    }

    fn subscribed(&self, p: &Pending) -> ServerMessage<'static> {
        let cursor = self.sub.index_of(&p.channel).map(|i| {
            let (epoch, seq) = self.sub.position(i);
            Cursor::single(&p.channel, epoch, seq.min(p.head)).encode()
        });
        ServerMessage::Subscribed(Subscribed {
            id: Some(p.id.clone().unwrap_or(Value::Null)),
            channel: p.channel.to_string(),
            replayed: p.replayed,
            recovered: p.recovered,
            cursor,
        })
    }

    async fn publish(
        &self,
        channel: &str,
        (data, encoding): (String, Option<gapless_protocol::Encoding>),
        event_type: Option<String>,
        ephemeral: bool,
        key: Option<String>,
    ) -> Result<PublishedMessage, ApiError> {
        op::check_channel(&self.grant, channel)?;
        let event_type = names::event_type(event_type.as_deref())?;
        let data = gapless_protocol::Payload::from_wire(data, encoding)
            .map_err(|m| ApiError::new(ErrorCode::InvalidRequest, m))?;
        let event = NewEvent { event_type, data };
        let published = op::one(
            &self.app,
            &self.grant,
            self.peer,
            channel,
            event,
            ephemeral,
            key.as_deref(),
            KeyName::Field,
        )
        .await?;
        Ok(match published {
            op::Published::Ephemeral { subscribers } => PublishedMessage::Ephemeral {
                channel: channel.to_owned(),
                ephemeral: true,
                subscribers: subscribers as u64,
                id: None,
            },
            op::Published::Journaled(a) => PublishedMessage::Journaled {
                channel: channel.to_owned(),
                seq: a.last_seq,
                cursor: Cursor::single(channel, a.epoch, a.last_seq).encode(),
                duplicate: a.duplicate,
                id: None,
            },
        })
    }

    async fn deliver(&mut self, item: Item, socket: &mut WebSocket) -> Result<(), ()> {
        match item {
            Item::Events { index, events } => {
                stream::delivered(
                    crate::metrics::Transport::Ws,
                    &mut self.tally,
                    &self.sub,
                    index,
                    &events,
                );
                crate::metrics::written(
                    crate::metrics::Transport::Ws,
                    events.iter().map(|e| e.ws_message().len()).sum(),
                );
                let channel = self.sub.channel(index).clone();
                let mut pending = self
                    .pending
                    .iter()
                    .position(|p| *p.channel == *channel)
                    .map(|i| self.pending.swap_remove(i));
                for e in &events {
                    if let Some(p) = &mut pending {
                        if e.seq > p.head {
                            let reply = self.subscribed(p);
                            socket.feed(json(&reply)).await.map_err(|_| ())?;
                            pending = None;
                        } else {
                            p.replayed += 1;
                        }
                    }
                    socket
                        .feed(text(e.ws_message().clone()))
                        .await
                        .map_err(|_| ())?;
                }
                if let Some(p) = pending {
                    if events.last().is_some_and(|e| e.seq >= p.head) {
                        let reply = self.subscribed(&p);
                        socket.feed(json(&reply)).await.map_err(|_| ())?;
                    } else {
                        self.pending.push(p);
                    }
                }
                socket.flush().await.map_err(|_| ())
            }
            Item::Gap(g) => {
                self.tally.gaps(1);
                // Retention passed a replay mid-way: the reply follows the notice.
                let pending = self
                    .pending
                    .iter()
                    .position(|p| *p.channel == *g.channel)
                    .map(|i| self.pending.swap_remove(i));
                socket
                    .feed(json(&messages::gap(&g)))
                    .await
                    .map_err(|_| ())?;
                if let Some(mut p) = pending {
                    p.recovered = false;
                    if g.next.1 >= p.head {
                        let reply = self.subscribed(&p);
                        socket.feed(json(&reply)).await.map_err(|_| ())?;
                    } else {
                        self.pending.push(p);
                    }
                }
                socket.flush().await.map_err(|_| ())
            }
            Item::Ephemeral(e) => {
                self.tally.events(1);
                socket
                    .send(json(&messages::ephemeral(&e)))
                    .await
                    .map_err(|_| ())
            }
        }
    }
}
