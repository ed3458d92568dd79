//! Sessions: a channel with one consumer at a time and a lifecycle (open,
//! then completed or cancelled). The producer side is plain HTTP
//! ([`Client::create_session`], [`Client::append_session`],
//! [`Client::complete_session`], [`Client::cancel_session`],
//! [`Client::session_info`]); the consumer side is a WebSocket
//! ([`Client::attach_session`] → [`SessionStream`]).
//!
//! # The consumer
//!
//! A [`SessionStream`] yields [`SessionUpdate`]s: events, `Resumed` after the
//! replay of an attach with `last_seq`, and the end (`Completed` or
//! `Cancelled`), after which it ends. It remembers the seq of the last event
//! it *delivered* (returned from [`SessionStream::next`]).
//!
//! Reconnection (on by default): after a drop it attaches again with
//! `last_seq` = that seq, so it gets every event after it exactly once, then
//! [`SessionUpdate::Resumed`], then live events. If nothing was delivered yet
//! it uses the starting `last_seq`, or, for a live first attach, the
//! session's head read just before that attach (so events appended while it
//! was away are not lost; events appended between that read and the attach
//! may be delivered although a live attach skips them).
//!
//! **Re-attaches use `takeover=true`.** After a network change the server may
//! still see the old connection as alive (until its keepalive or heartbeat
//! drops it) and would refuse a plain re-attach with 4409
//! `session_attached`; the old connection is this consumer's own, so taking
//! it over is safe. The first attach uses [`AttachBuilder::takeover`]
//! (default false). A consumer that is itself taken over by another
//! connection (error `session_attached`, close 4409) does not fight back:
//! that is a terminal error.
//!
//! The other side of that choice: a consumer that was dropped without
//! noticing (its own idle timeout, or the server's 4408 after two
//! unanswered heartbeats, e.g. because the caller did not poll the stream
//! for that long) and comes back takes the session over from whichever
//! connection holds it then. Run one reconnecting consumer per session.
//!
//! The socket is read only while the stream is polled; the server closes a
//! consumer that has answered none of its pings for two `--heartbeat-ms`
//! intervals (4408), after which this one re-attaches and loses nothing.
//!
//! Terminal errors ([`Error::Api`], with [`ApiError::close_code`]): 4404
//! with [`ApiError::error_code`] `session_not_found` (unknown or expired
//! session) or `session_ended` (completed or cancelled, and attached without
//! `last_seq`: nothing live to attach to; the message says which), 4409
//! `session_attached` (attached elsewhere, without takeover; or taken over),
//! 4410 `session_not_retained` (the events after `last_seq` are gone), 4400
//! `resume_disabled` (`last_seq` on a server started with
//! `--session-resume false`). A clean close (1001, the server shutting
//! down) re-attaches at once; other failures wait per [`Backoff`] (base
//! [`Backoff::initial`]).
//!
//! [`ApiError::close_code`]: crate::ApiError::close_code
//! [`ApiError::error_code`]: crate::ApiError::error_code

use crate::backoff::Backoff;
use crate::client::{segment, Client};
use crate::error::Error;
use crate::subscribe::{lock, Reconnect, Retrier, StreamOptions};
use crate::types::{SessionAppended, SessionEvent, SessionInfo, SessionUpdate};
use crate::ws::{self, Incoming, Socket};
use futures::{Stream, StreamExt};
use gapless_protocol::answers;
use gapless_protocol::ws::SessionMessage;
use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

impl Client {
    /// Creates a session (`POST /v1/sessions`): with `id` (1 to 128 of
    /// `A-Z a-z 0-9 _ -`), or with a random 128-bit hex id drawn by the
    /// server when `None`. Its head is 1: seq 1 is the opening marker.
    ///
    /// # Errors
    /// [`Error::Api`]: 409 `session_exists`, 400 `invalid_request` (a bad
    /// id); or a connection error.
    pub async fn create_session(&self, id: Option<&str>) -> Result<SessionInfo, Error> {
        let body = match id {
            Some(id) => serde_json::json!({ "id": id }).to_string(),
            None => String::new(),
        };
        let req = self
            .inner
            .http
            .post(self.url("/v1/sessions"))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        let (_, body) = self.call(req).await?;
        self.decode(&body)
    }

    /// Appends one event whose data is `data` to session `id`. Set a type or
    /// an idempotency key on the returned request, then
    /// [`AppendRequest::send`] it.
    pub fn append_session(&self, id: &str, data: impl Into<String>) -> AppendRequest<'_> {
        AppendRequest {
            client: self,
            id: id.to_owned(),
            data: data.into(),
            event_type: None,
            key: None,
        }
    }

    /// Completes session `id` (`POST /v1/sessions/{id}/complete`): its
    /// consumer gets the rest of the events, then
    /// [`SessionUpdate::Completed`].
    ///
    /// # Errors
    /// [`Error::Api`]: 409 `session_ended` when already completed or
    /// cancelled (`extra["status"]` says which), 404 `session_not_found`; or
    /// a connection error.
    pub async fn complete_session(&self, id: &str) -> Result<SessionInfo, Error> {
        self.end_session(id, "complete").await
    }

    /// Cancels session `id` (`POST /v1/sessions/{id}/cancel`): its consumer
    /// gets the rest of the events, then [`SessionUpdate::Cancelled`].
    ///
    /// # Errors
    /// As for [`Client::complete_session`].
    pub async fn cancel_session(&self, id: &str) -> Result<SessionInfo, Error> {
        self.end_session(id, "cancel").await
    }

    async fn end_session(&self, id: &str, verb: &str) -> Result<SessionInfo, Error> {
        let req = self
            .inner
            .http
            .post(self.url(&format!("/v1/sessions/{}/{verb}", segment(id))));
        let (_, body) = self.call(req).await?;
        self.decode(&body)
    }

    /// Session `id`'s status, head and whether a consumer is attached
    /// (`GET /v1/sessions/{id}`).
    ///
    /// # Errors
    /// [`Error::Api`]: 404 `session_not_found`; or a connection error.
    pub async fn session_info(&self, id: &str) -> Result<SessionInfo, Error> {
        let req = self
            .inner
            .http
            .get(self.url(&format!("/v1/sessions/{}", segment(id))));
        let (_, body) = self.call(req).await?;
        self.decode(&body)
    }

    /// Consumes session `id` over WebSocket (`GET /v1/sessions/{id}/ws`);
    /// see [`AttachBuilder`] and the [module docs](crate::session).
    pub fn attach_session(&self, id: &str) -> AttachBuilder {
        AttachBuilder {
            client: self.clone(),
            id: id.to_owned(),
            last_seq: None,
            takeover: false,
            opts: StreamOptions::new(true),
        }
    }
}

/// A session append, ready to send. Built by [`Client::append_session`].
#[derive(Debug)]
#[must_use = "an append request does nothing until sent"]
pub struct AppendRequest<'a> {
    client: &'a Client,
    id: String,
    data: String,
    event_type: Option<String>,
    key: Option<String>,
}

impl AppendRequest<'_> {
    /// The event's type (same rules as for channels: `gapless.*` is reserved).
    pub fn event_type(mut self, t: impl Into<String>) -> Self {
        self.event_type = Some(t.into());
        self
    }

    /// An `Idempotency-Key` (1 to 256 visible ASCII characters): a retry with
    /// the same key appends nothing and answers the first append's seq.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Appends the event (`POST /v1/sessions/{id}/events`).
    ///
    /// A connection error leaves it unknown whether the event was appended:
    /// retry with the same idempotency key to be sure it is appended once.
    ///
    /// # Errors
    /// [`Error::Api`]: 409 `session_ended` once completed or cancelled
    /// (`extra["status"]` says which: a session nobody consumed for the
    /// grace window is cancelled), 404 `session_not_found`, 400
    /// (`invalid_type`, `invalid_request`), 413 `too_large`; or a connection
    /// error.
    pub async fn send(self) -> Result<SessionAppended, Error> {
        let c = self.client;
        let mut req = c
            .inner
            .http
            .post(c.url(&format!("/v1/sessions/{}/events", segment(&self.id))))
            .header(reqwest::header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(self.data);
        if let Some(t) = &self.event_type {
            req = req.query(&[("type", t.as_str())]);
        }
        if let Some(k) = &self.key {
            req = req.header("idempotency-key", k.as_str());
        }
        let (status, body) = c.call(req).await?;
        let a: answers::SessionAppended = c.decode(&body)?;
        Ok(SessionAppended::read(a, status == 200))
    }
}

/// What the server sends on a session socket, as the server writes it
/// (unknown ops and fields are ignored: the protocol may add them).
type ServerMsg = SessionMessage<'static>;

/// Settings of a session consumer. Built by [`Client::attach_session`].
#[must_use = "an attach builder does nothing until opened"]
pub struct AttachBuilder {
    client: Client,
    id: String,
    last_seq: Option<u64>,
    takeover: bool,
    opts: StreamOptions,
}

impl fmt::Debug for AttachBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AttachBuilder")
            .field("id", &self.id)
            .field("last_seq", &self.last_seq)
            .field("takeover", &self.takeover)
            .finish_non_exhaustive()
    }
}

impl AttachBuilder {
    /// Resume after seq `n`: every retained event with `seq > n`, in order,
    /// then [`SessionUpdate::Resumed`], then live. `last_seq(1)` (the opening
    /// marker) reads the whole session. Without it, the first attach is live
    /// only. Refused with 4410 when the events after `n` are not all retained
    /// or `n` is beyond the newest event, and with 4400 on a server started
    /// with `--session-resume false`.
    pub fn last_seq(mut self, n: u64) -> Self {
        self.last_seq = Some(n);
        self
    }

    /// Whether the first attach takes the session over from a connection
    /// that holds it (default false: refused with 4409 `session_attached`).
    /// Re-attaches after a drop always take over (see the
    /// [module docs](crate::session)).
    pub fn takeover(mut self, on: bool) -> Self {
        self.takeover = on;
        self
    }

    /// Whether to re-attach after a drop (default true). Off, the stream
    /// yields the error of a failed connection, or ends at a clean close
    /// that did not end the session.
    pub fn reconnect(mut self, on: bool) -> Self {
        self.opts.reconnect = on;
        self
    }

    /// The reconnection delays (default [`Backoff::default`]); the base of
    /// every wait is [`Backoff::initial`].
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.opts.backoff = backoff;
        self
    }

    /// Treat a socket that brings nothing for this long, not even the
    /// server's ping, as dropped (default 45 s); `None` waits forever.
    pub fn idle_timeout(mut self, t: Option<Duration>) -> Self {
        self.opts.idle_timeout = t;
        self
    }

    /// The largest WebSocket message accepted, in bytes (default
    /// [`DEFAULT_MAX_EVENT_BYTES`](crate::sse::DEFAULT_MAX_EVENT_BYTES)); a
    /// larger one ends the stream with [`Error::EventTooLarge`].
    pub fn max_message_bytes(mut self, n: usize) -> Self {
        self.opts.max_event_bytes = n;
        self
    }

    /// Calls `hook` before each reconnection wait (keep it short).
    pub fn on_reconnect(mut self, hook: impl Fn(&Reconnect<'_>) + Send + Sync + 'static) -> Self {
        self.opts.on_reconnect = Some(Arc::new(hook));
        self
    }

    /// The consumer, not yet attached: it attaches when first polled, and
    /// retries failed connections like later drops.
    pub fn open(self) -> SessionStream {
        SessionStream::spawn(self, None, None)
    }

    /// Attaches now and returns once the server has attached this consumer:
    /// every event appended after this returns will be delivered. (The
    /// server sends nothing on a live attach, so this sends a WebSocket ping
    /// and waits for its pong, or for the first message: the server reads,
    /// and so answers pings, only once the consumer is attached.) What
    /// arrived meanwhile is kept for [`SessionStream::next`].
    ///
    /// # Errors
    /// Any failure of this first attach, whether or not reconnecting is on:
    /// [`Error::Api`] for a refusal (4404 `session_not_found`, 4409
    /// `session_attached`, 4410 `session_not_retained`, 4400
    /// `resume_disabled`, with [`ApiError::close_code`](crate::ApiError::close_code);
    /// or an HTTP 400 for a malformed id), [`Error::Unreachable`],
    /// [`Error::Disconnected`], [`Error::Protocol`].
    pub async fn connect(self) -> Result<SessionStream, Error> {
        let anchor = self.anchor().await;
        let mut conn = Conn::open(&self, self.last_seq, self.takeover).await?;
        conn.wait_attached().await?;
        Ok(SessionStream::spawn(self, Some(conn), anchor))
    }

    /// For a live first attach that may re-attach: the session's head now,
    /// the position to re-attach from if nothing is delivered before a drop.
    async fn anchor(&self) -> Option<u64> {
        if self.last_seq.is_some() || !self.opts.reconnect {
            return None;
        }
        self.client
            .session_info(&self.id)
            .await
            .ok()
            .map(|i| i.head)
    }
}

/// An open session socket and the messages read ahead by
/// [`Conn::wait_attached`].
struct Conn {
    socket: Socket,
    ahead: VecDeque<Incoming<ServerMsg>>,
    server: String,
}

impl Conn {
    /// Attaches with `last_seq` (`None`: live) and `takeover`.
    async fn open(b: &AttachBuilder, last_seq: Option<u64>, takeover: bool) -> Result<Conn, Error> {
        let mut path = format!("/v1/sessions/{}/ws", segment(&b.id));
        let mut sep = '?';
        if let Some(n) = last_seq {
            path.push_str(&format!("{sep}last_seq={n}"));
            sep = '&';
        }
        if takeover {
            path.push_str(&format!("{sep}takeover=true"));
        }
        let socket = ws::open(
            &b.client,
            &path,
            b.opts.idle_timeout,
            b.opts.max_event_bytes,
        )
        .await?;
        Ok(Conn {
            socket,
            ahead: VecDeque::new(),
            server: b.client.inner.base.clone(),
        })
    }

    async fn next(&mut self) -> Result<Incoming<ServerMsg>, Error> {
        match self.ahead.pop_front() {
            Some(m) => Ok(m),
            None => self.socket.read().await,
        }
    }

    /// Pings, then reads ahead until the pong or a first session message
    /// shows the consumer attached; a refusal (an `error` message, then its
    /// close code) is returned as an error.
    async fn wait_attached(&mut self) -> Result<(), Error> {
        self.socket.ping().await?;
        let mut refusal = None;
        loop {
            match self.socket.read::<ServerMsg>().await? {
                Incoming::Pong => return Ok(()),
                Incoming::Message(ServerMsg::Error(e)) => {
                    refusal = Some((e.code.into_owned(), e.message.into_owned()));
                }
                Incoming::Message(ServerMsg::Other) => {}
                Incoming::Message(m) => {
                    self.ahead.push_back(Incoming::Message(m));
                    return Ok(());
                }
                Incoming::Closed(code, reason) => {
                    return Err(ws::close_error(&self.server, code, &reason, refusal)
                        .unwrap_or_else(|| Error::Disconnected {
                            server: self.server.clone(),
                            detail: format!(
                                "the server closed the socket ({}) before attaching",
                                code.unwrap_or(0)
                            ),
                        }));
                }
            }
        }
    }
}

/// A session consumer: a [`Stream`] of [`SessionUpdate`]s that re-attaches
/// across drops and ends after the session's end.
///
/// It ends (yields `None`) after [`SessionUpdate::Completed`] or
/// [`SessionUpdate::Cancelled`], after a terminal error, or at a failure
/// when reconnecting is off. Dropping it closes its socket at once; nothing
/// keeps running.
pub struct SessionStream {
    stream: Pin<Box<dyn Stream<Item = Result<SessionUpdate, Error>> + Send>>,
    id: String,
    last_seq: Arc<Mutex<Option<u64>>>,
}

impl fmt::Debug for SessionStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionStream")
            .field("id", &self.id)
            .field("last_seq", &self.last_seq())
            .finish_non_exhaustive()
    }
}

impl SessionStream {
    fn spawn(b: AttachBuilder, first: Option<Conn>, anchor: Option<u64>) -> Self {
        let last_seq = Arc::new(Mutex::new(b.last_seq));
        SessionStream {
            id: b.id.clone(),
            stream: Box::pin(run(b, first, anchor, last_seq.clone())),
            last_seq,
        }
    }

    /// The next update; `None` once the stream has ended. Cancel-safe.
    pub async fn next(&mut self) -> Option<Result<SessionUpdate, Error>> {
        StreamExt::next(self).await
    }

    /// The session's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The seq of the last event delivered (or the starting
    /// [`AttachBuilder::last_seq`] before any): attach again later with
    /// `.last_seq(n)` to get the rest. `None` before any is known.
    pub fn last_seq(&self) -> Option<u64> {
        *lock(&self.last_seq)
    }
}

impl Stream for SessionStream {
    type Item = Result<SessionUpdate, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.stream.as_mut().poll_next(cx)
    }
}

fn run(
    b: AttachBuilder,
    first: Option<Conn>,
    mut anchor: Option<u64>,
    shared: Arc<Mutex<Option<u64>>>,
) -> impl Stream<Item = Result<SessionUpdate, Error>> + Send {
    async_stream::stream! {
        let server = b.client.inner.base.clone();
        let opts = b.opts.clone();
        let mut last_seq = b.last_seq;
        // The first attach is as configured; later ones are re-attaches.
        let mut reattach = false;
        let mut retrier = Retrier::new(&opts.backoff);
        let mut pending = first;
        if pending.is_none() {
            anchor = b.anchor().await;
        }
        loop {
            let mut conn = match pending.take() {
                Some(c) => c,
                None => {
                    let (from, takeover) = if reattach {
                        (last_seq.or(anchor), true)
                    } else {
                        (last_seq, b.takeover)
                    };
                    match Conn::open(&b, from, takeover).await {
                        Ok(c) => c,
                        Err(e) => {
                            if e.is_terminal() || !opts.reconnect {
                                yield Err(e);
                                return;
                            }
                            let d = retrier.failed(&opts, &e);
                            tokio::time::sleep(d).await;
                            continue;
                        }
                    }
                }
            };
            // Every later attach is a re-attach: it resumes from the last
            // delivered seq and takes over our own stale connection.
            reattach = true;
            let opened_at = Instant::now();
            let mut refusal: Option<(String, String)> = None;
            let mut closed = false;
            let end: Result<(), Error> = loop {
                let msg = match conn.next().await {
                    Ok(Incoming::Message(m)) => m,
                    Ok(Incoming::Pong) => continue,
                    Ok(Incoming::Closed(code, reason)) => {
                        closed = true;
                        match ws::close_error(&server, code, &reason, refusal.take()) {
                            None => break Ok(()),
                            Some(e) => break Err(e),
                        }
                    }
                    Err(e) => break Err(e),
                };
                match msg {
                    ServerMsg::Event { session, seq, event_type, data, encoding, time } => {
                        retrier.attempt = 0;
                        last_seq = Some(seq);
                        *lock(&shared) = last_seq;
                        let e = SessionEvent {
                            session: session.into_owned(),
                            seq,
                            event_type: event_type.map(|t| t.into_owned()),
                            data: data.into_owned(),
                            encoding,
                            time,
                        };
                        yield Ok(SessionUpdate::Event(e));
                    }
                    ServerMsg::Resumed { replayed_events, .. } => {
                        retrier.attempt = 0;
                        yield Ok(SessionUpdate::Resumed { replayed_events });
                    }
                    ServerMsg::Completed { seq, .. } => {
                        yield Ok(SessionUpdate::Completed { seq });
                        conn.socket.finish().await;
                        return;
                    }
                    ServerMsg::Cancelled { seq, .. } => {
                        yield Ok(SessionUpdate::Cancelled { seq });
                        conn.socket.finish().await;
                        return;
                    }
                    // A refusal or a takeover: its close code follows.
                    ServerMsg::Error(e) => {
                        refusal = Some((e.code.into_owned(), e.message.into_owned()))
                    }
                    ServerMsg::Other => {}
                }
            };
            if closed {
                conn.socket.finish().await;
            } else {
                drop(conn);
            }
            let wait = match end {
                Ok(()) if !opts.reconnect => return,
                Ok(()) => retrier.closed(&opts, opened_at),
                Err(e) => {
                    if e.is_terminal() || !opts.reconnect {
                        yield Err(e);
                        return;
                    }
                    retrier.failed(&opts, &e)
                }
            };
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
        }
    }
}
