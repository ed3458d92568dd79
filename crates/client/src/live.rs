//! One SSE connection: the request, the status checks, and the frames it
//! carries, decoded from `?format=envelope` data by [`crate::sse::Parser`].
//!
//! Subscriptions and joins build their reconnecting logic on top of this; a
//! [`Connection`] itself never reconnects.

use crate::client::{read_refusal, segment, Client};
use crate::error::Error;
use crate::sse::{Item, Parser};
use crate::types::{parse_reason, Cursor, Ephemeral, Event, Gap, Start, Update};
use std::collections::VecDeque;
use std::time::Duration;

/// What one SSE connection carries, in stream order.
#[derive(Debug)]
pub(crate) enum Frame {
    /// An event, gap notice or ephemeral event.
    Update(Update),
    /// An `id:`-only frame: the reader now stands at this cursor.
    Cursor(Cursor),
    /// The server's reconnection time.
    Retry(Duration),
}

/// Where and how to open a stream.
pub(crate) struct Target<'a> {
    pub(crate) client: &'a Client,
    pub(crate) channels: &'a [String],
    /// Used when `resume` is `None`.
    pub(crate) start: &'a Start,
    /// A cursor the server issued: sent as `Last-Event-ID`, it wins over `start`.
    pub(crate) resume: Option<&'a Cursor>,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) max_event_bytes: usize,
    /// `?client_id=`, for presence.
    pub(crate) client_id: Option<&'a str>,
    /// `?presence=true`.
    pub(crate) presence: bool,
}

/// An open SSE response and its parser.
pub(crate) struct Connection {
    resp: reqwest::Response,
    parser: Parser,
    queue: VecDeque<Result<Frame, Error>>,
    idle_timeout: Option<Duration>,
    server: String,
    ended: bool,
    /// The server said the token expired (`event: gapless.expired`): the
    /// stream ends next.
    expired: bool,
}

/// The data of `?format=envelope` events, as the server writes it.
type EnvelopeIn = gapless_protocol::event::Envelope<'static>;
/// The data of an `event: gap`, as the server writes it.
type GapIn = gapless_protocol::event::GapNotice<'static>;

/// Opens a stream and checks the answer: 200 with `text/event-stream`.
///
/// # Errors
/// Connection errors; [`Error::Api`] for a refusal; [`Error::Protocol`] for a
/// 2xx answer that is not an event stream.
pub(crate) async fn open(t: Target<'_>) -> Result<Connection, Error> {
    let c = t.client;
    let http = &c.inner.http;
    let mut req = match t.channels {
        [] => {
            return Err(Error::InvalidArgument(
                "a subscription needs at least one channel".to_owned(),
            ))
        }
        [one] => http.get(c.url(&format!("/v1/channels/{}/sse", segment(one)))),
        many => {
            let q: Vec<(&str, &str)> = many.iter().map(|ch| ("channel", ch.as_str())).collect();
            http.get(c.url("/v1/sse")).query(&q)
        }
    };
    if let Some(id) = t.client_id {
        req = req.query(&[("client_id", id)]);
    }
    if t.presence {
        req = req.query(&[("presence", "true")]);
    }
    req = req
        .query(&[("format", "envelope")])
        .header(reqwest::header::ACCEPT, "text/event-stream")
        .header(reqwest::header::CACHE_CONTROL, "no-cache");
    match (t.resume, t.start) {
        (Some(cursor), _) => req = req.header("last-event-id", cursor.as_str()),
        (None, Start::Live) => {}
        (None, Start::After(cursor)) => req = req.query(&[("last_event_id", cursor.as_str())]),
        (None, start) => {
            if let Some(since) = start.since() {
                req = req.query(&[("since", since)]);
            }
        }
    }
    let server = &c.inner.base;
    if let Some(token) = c.inner.token().await? {
        req = req.bearer_auth(token);
    }
    let send = req.send();
    let resp = match t.idle_timeout {
        Some(d) => tokio::time::timeout(d, send)
            .await
            .map_err(|_| Error::idle(server, d))?,
        None => send.await,
    }
    .map_err(|e| Error::from_reqwest(server, &e))?;
    let status = resp.status().as_u16();
    if !(200..300).contains(&status) {
        return Err(read_refusal(server, resp).await);
    }
    let ctype = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if status != 200 || !ctype.starts_with("text/event-stream") {
        return Err(Error::protocol(
            server,
            format!(
                "status {status} with content type {ctype:?} where an event stream was expected"
            ),
        ));
    }
    Ok(Connection {
        resp,
        parser: Parser::with_max_event_bytes(t.max_event_bytes),
        queue: VecDeque::new(),
        idle_timeout: t.idle_timeout,
        server: server.clone(),
        ended: false,
        expired: false,
    })
}

impl Connection {
    /// Whether the server ended this stream because its token expired
    /// (it sent `event: gapless.expired`, docs/security.md).
    pub(crate) fn token_expired(&self) -> bool {
        self.expired
    }

    /// The next frame; `Ok(None)` once the server closed the stream cleanly
    /// (an event it left unterminated is dropped, as the SSE standard says).
    /// Cancel-safe: dropping the future loses nothing.
    ///
    /// # Errors
    /// The connection failed or was silent past the idle timeout, a frame was
    /// malformed, or an event exceeded the size limit. The connection is then
    /// unusable.
    pub(crate) async fn next_frame(&mut self) -> Result<Option<Frame>, Error> {
        loop {
            if let Some(f) = self.queue.pop_front() {
                return f.map(Some);
            }
            if self.ended {
                return Ok(None);
            }
            self.read_chunk().await?;
        }
    }

    /// Reads until the stream's preamble is complete: its first `id:`-only
    /// frame, which the server sends once the subscription is registered
    /// (after `retry:` and any gap notices, which stay queued).
    ///
    /// # Errors
    /// As [`Connection::next_frame`]; a stream that ends before its preamble is
    /// [`Error::Disconnected`].
    pub(crate) async fn wait_preamble(&mut self) -> Result<(), Error> {
        loop {
            let first = self
                .queue
                .iter()
                .position(|f| matches!(f, Ok(Frame::Cursor(_)) | Err(_)));
            if let Some(i) = first {
                if matches!(self.queue.get(i), Some(Err(_))) {
                    if let Some(Err(e)) = self.queue.remove(i) {
                        return Err(e);
                    }
                }
                return Ok(());
            }
            if self.ended {
                return Err(Error::Disconnected {
                    server: self.server.clone(),
                    detail: "the stream ended before its first position".to_owned(),
                });
            }
            self.read_chunk().await?;
        }
    }

    /// The first `id:`-only frame already received, if no update comes
    /// before it in the queue (a position that owes nothing undelivered).
    pub(crate) fn leading_cursor(&self) -> Option<Cursor> {
        for f in &self.queue {
            match f {
                Ok(Frame::Retry(_)) => {}
                Ok(Frame::Cursor(c)) => return Some(c.clone()),
                _ => return None,
            }
        }
        None
    }

    /// Removes and returns the next frame if it is already received and is an
    /// `id:`-only frame: it takes effect together with the update before it.
    pub(crate) fn take_next_cursor(&mut self) -> Option<Cursor> {
        match self.queue.front() {
            Some(Ok(Frame::Cursor(_))) => match self.queue.pop_front() {
                Some(Ok(Frame::Cursor(c))) => Some(c),
                _ => None,
            },
            _ => None,
        }
    }

    async fn read_chunk(&mut self) -> Result<(), Error> {
        let read = self.resp.chunk();
        let chunk = match self.idle_timeout {
            Some(d) => tokio::time::timeout(d, read)
                .await
                .map_err(|_| Error::idle(&self.server, d))?,
            None => read.await,
        }
        .map_err(|e| Error::from_reqwest(&self.server, &e))?;
        match chunk {
            Some(bytes) => {
                let queue = &mut self.queue;
                let server = &self.server;
                let expired = &mut self.expired;
                if let Err(e) = self
                    .parser
                    .feed(&bytes, |item| push_item(queue, server, expired, item))
                {
                    queue.push_back(Err(Error::EventTooLarge { limit: e.limit }));
                }
            }
            None => {
                self.parser.finish();
                self.ended = true;
            }
        }
        Ok(())
    }
}

fn push_item(
    queue: &mut VecDeque<Result<Frame, Error>>,
    server: &str,
    expired: &mut bool,
    item: Item<'_>,
) {
    let frame = match item {
        Item::Retry(ms) => Ok(Frame::Retry(Duration::from_millis(ms))),
        Item::LastEventId("") => return,
        // The token ran out; the stream ends next and the subscription
        // reconnects with a fresh token from its cursor (docs/security.md).
        Item::Event(e) if e.event_type == "gapless.expired" => {
            *expired = true;
            return;
        }
        Item::LastEventId(id) => Ok(Frame::Cursor(Cursor::from(id))),
        Item::Event(e) if e.event_type == gapless_protocol::presence::SSE_EVENT => {
            serde_json::from_str::<gapless_protocol::presence::PresenceNotice>(e.data)
                .map(|n| Frame::Update(Update::Presence(n)))
                .map_err(|err| Error::protocol(server, format!("malformed presence notice: {err}")))
        }
        Item::Event(e) if e.event_type == "gap" => serde_json::from_str::<GapIn>(e.data)
            .map(|g| {
                Frame::Update(Update::Gap(Gap {
                    channel: g.channel.into_owned(),
                    after: g.after.map(Cursor::from),
                    next: Cursor::from(g.next),
                    reason: parse_reason(&g.reason),
                }))
            })
            .map_err(|err| Error::protocol(server, format!("malformed gap notice: {err}"))),
        Item::Event(e) => match serde_json::from_str::<EnvelopeIn>(e.data) {
            Err(err) => Err(Error::protocol(
                server,
                format!("event data is not a gapless envelope: {err}"),
            )),
            Ok(env) => match env.seq {
                None => Ok(Frame::Update(Update::Ephemeral(Ephemeral {
                    channel: env.channel.into_owned(),
                    event_type: env.event_type.map(|t| t.into_owned()),
                    data: env.data.into_owned(),
                    encoding: env.encoding,
                    time: env.time,
                }))),
                Some(_) if e.last_event_id.is_empty() => Err(Error::protocol(
                    server,
                    "a journaled event arrived with no id",
                )),
                Some(seq) => Ok(Frame::Update(Update::Event(Event {
                    channel: env.channel.into_owned(),
                    seq,
                    event_type: env.event_type.map(|t| t.into_owned()),
                    data: env.data.into_owned(),
                    encoding: env.encoding,
                    time: env.time,
                    cursor: Cursor::from(e.last_event_id),
                }))),
            },
        },
    };
    queue.push_back(frame);
}
