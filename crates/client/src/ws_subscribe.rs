//! WebSocket subscriptions: follow one or several channels over one socket
//! (`GET /v1/ws`, subprotocol `gapless.v1`) and resume, after any drop, each
//! channel from the last position handed to the caller.
//!
//! A [`WsSubscription`] yields the same [`Update`]s as an SSE
//! [`Subscription`](crate::Subscription), but keeps **one cursor per
//! channel** (the WebSocket protocol positions each channel on its own; an
//! [`Event::cursor`](crate::Event::cursor) is its channel's cursor). A
//! channel's cursor moves when an update of that channel is *delivered*
//! (returned from [`WsSubscription::next`]): an event moves it to the
//! event's cursor, a gap notice to the gap's `next`. The server's
//! `subscribed` reply, which carries the channel's position once its replay
//! is over, moves it too when nothing of the channel was delivered on that
//! connection yet (e.g. a live start): every message before it has been
//! delivered by then, so nothing is owed before that position.
//!
//! After a drop, each channel is subscribed again with its cursor, or with
//! its original start when it has none yet: so `since: earliest` is applied
//! only until a position is known, never again once events were delivered.
//!
//! Reconnection (on by default) follows the rules of SSE subscriptions: a
//! clean close (1001 going away, the server shutting down) reconnects at
//! once; a failure waits per [`Backoff`] (full jitter; the WebSocket
//! protocol has no `retry:` field, so the base is [`Backoff::initial`]); a
//! terminal error is returned and ends the subscription. A refused
//! `subscribe` (an `error` reply such as `invalid_cursor`, `invalid_channel`
//! or `limit_reached`: retrying it cannot help) is terminal; only
//! `journal_failed` and `shutting_down` (5xx) are retried.
//!
//! The socket is read only while the subscription is polled. The server
//! pings every `--heartbeat-ms` and closes (4408) a client that answered
//! nothing for two intervals: a consumer that holds one update longer than
//! that is dropped and resumes, losing nothing.

use crate::backoff::Backoff;
use crate::client::Client;
use crate::error::{ApiError, Error};
use crate::subscribe::{lock, Reconnect, Retrier, StreamOptions};
use crate::types::{parse_reason, Cursor, Ephemeral, Event, Gap, Start, Update};
use crate::ws::{self, Incoming, Socket};
use futures::{Stream, StreamExt};
use gapless_protocol::ws::{ClientMessage, ServerMessage};
use serde_json::Value;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// What the server sends on `/v1/ws`, as the server writes it (unknown ops
/// and fields are ignored: the protocol may add them).
type ServerMsg = ServerMessage<'static>;

/// Settings of a WebSocket subscription. Built by [`Client::subscribe_ws`].
#[must_use = "a subscription builder does nothing until opened"]
pub struct WsSubscribeBuilder {
    client: Client,
    channels: Vec<String>,
    start: Start,
    cursors: BTreeMap<String, Cursor>,
    opts: StreamOptions,
}

impl fmt::Debug for WsSubscribeBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WsSubscribeBuilder")
            .field("channels", &self.channels)
            .field("start", &self.start)
            .field("cursors", &self.cursors)
            .finish_non_exhaustive()
    }
}

impl WsSubscribeBuilder {
    pub(crate) fn new(client: Client, channels: Vec<String>) -> Self {
        let mut unique: Vec<String> = Vec::with_capacity(channels.len());
        for c in channels {
            if !unique.contains(&c) {
                unique.push(c);
            }
        }
        WsSubscribeBuilder {
            client,
            channels: unique,
            start: Start::Live,
            cursors: BTreeMap::new(),
            opts: StreamOptions::new(true),
        }
    }

    /// Where every channel starts (default [`Start::Live`]: events published
    /// from now on), unless [`WsSubscribeBuilder::cursors`] names its own
    /// position. With [`Start::After`], the cursor must name a position on
    /// every channel (a single-channel cursor, or the multi-channel cursor
    /// of an SSE subscription of these channels); one that does not is
    /// refused with `invalid_cursor`.
    pub fn start(mut self, start: Start) -> Self {
        self.start = start;
        self
    }

    /// Every channel starts after `cursor` (see [`WsSubscribeBuilder::start`]).
    pub fn after(self, cursor: Cursor) -> Self {
        self.start(Start::After(cursor))
    }

    /// Every channel starts with everything retained, then follows live.
    pub fn since_earliest(self) -> Self {
        self.start(Start::Earliest)
    }

    /// Every channel starts with its last `n` retained events (1 to 1000),
    /// then follows live ([`Start::Last`]).
    pub fn since_last(self, n: u64) -> Self {
        self.start(Start::Last(n))
    }

    /// Every channel starts at its first retained event at or after `t`,
    /// then follows live ([`Start::Time`]; a gap first when an event no
    /// longer retained may be at or after `t`).
    pub fn since_time(self, t: std::time::SystemTime) -> Self {
        self.start(Start::time(t))
    }

    /// Per-channel starting positions, e.g. what [`WsSubscription::cursors`]
    /// returned before: each named channel resumes after its cursor; the
    /// others start per [`WsSubscribeBuilder::start`]. Positions of channels
    /// not subscribed are ignored.
    pub fn cursors<I, S>(mut self, cursors: I) -> Self
    where
        I: IntoIterator<Item = (S, Cursor)>,
        S: Into<String>,
    {
        self.cursors
            .extend(cursors.into_iter().map(|(c, k)| (c.into(), k)));
        self
    }

    /// Whether to reconnect after a drop (default true). Off, the
    /// subscription ends at a clean close and yields the error of a failed one.
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
    /// server's ping, as dropped (default 45 s, three of the server's default
    /// 15 s heartbeats); `None` waits forever.
    pub fn idle_timeout(mut self, t: Option<Duration>) -> Self {
        self.opts.idle_timeout = t;
        self
    }

    /// The largest WebSocket message accepted, in bytes (default
    /// [`DEFAULT_MAX_EVENT_BYTES`](crate::sse::DEFAULT_MAX_EVENT_BYTES)); a
    /// larger one ends the subscription with [`Error::EventTooLarge`].
    pub fn max_message_bytes(mut self, n: usize) -> Self {
        self.opts.max_event_bytes = n;
        self
    }

    /// Calls `hook` before each reconnection wait (from the subscription's
    /// task: keep it short).
    pub fn on_reconnect(mut self, hook: impl Fn(&Reconnect<'_>) + Send + Sync + 'static) -> Self {
        self.opts.on_reconnect = Some(Arc::new(hook));
        self
    }

    /// On a server without keys, who this subscriber is for presence (each
    /// subscribe's `"client_id"`: 1 to 128 characters of
    /// `A-Z a-z 0-9 . _ : @ -`); on a server with keys a member is its
    /// token's `sub` and this is refused (`invalid_request`). Its
    /// subscription to each channel whose namespace has presence makes it a
    /// member there (docs/api.md, "Presence").
    pub fn client_id(mut self, id: impl Into<String>) -> Self {
        self.opts.client_id = Some(id.into());
        self
    }

    /// Whether to get the join and leave of the channels' members as
    /// [`Update::Presence`] (each subscribe's `"presence": true`; default
    /// false). Every channel's namespace must then have presence: one
    /// without is refused (`presence_disabled`).
    pub fn presence(mut self, on: bool) -> Self {
        self.opts.presence = on;
        self
    }

    /// The subscription, not yet connected: it connects when first polled, and
    /// retries failed connections like later drops.
    pub fn open(self) -> WsSubscription {
        WsSubscription::spawn(self, None)
    }

    /// Connects now and returns once the server has handled the subscribe of
    /// every channel (each has answered: its `subscribed` reply, a gap notice
    /// or a first replayed event): every event published after this returns
    /// will be delivered. What arrived meanwhile is kept for
    /// [`WsSubscription::next`].
    ///
    /// # Errors
    /// Any failure of this first connection, whether or not reconnecting is
    /// on: [`Error::InvalidArgument`] (no channel), [`Error::Unreachable`],
    /// [`Error::Api`] (a refused subscribe: `invalid_cursor`,
    /// `invalid_channel`, `limit_reached`…, with the channel in
    /// [`ApiError::extra`]; or a refused handshake), [`Error::Protocol`],
    /// [`Error::Disconnected`].
    pub async fn connect(self) -> Result<WsSubscription, Error> {
        let chans = initial_channels(&self);
        let mut conn = Conn::open(&self.client, &chans, &self.opts).await?;
        conn.wait_subscribed(&chans).await?;
        Ok(WsSubscription::spawn(self, Some(conn)))
    }
}

/// One channel's state: its original start and the cursor of the last
/// update delivered.
struct Chan {
    name: String,
    start: Start,
    cursor: Option<Cursor>,
}

fn initial_channels(b: &WsSubscribeBuilder) -> Vec<Chan> {
    b.channels
        .iter()
        .map(|name| {
            let cursor = b.cursors.get(name).cloned().or(match &b.start {
                Start::After(c) => Some(c.clone()),
                _ => None,
            });
            Chan {
                name: name.clone(),
                start: b.start.clone(),
                cursor,
            }
        })
        .collect()
}

/// The `subscribe` request for channel number `i`: after its cursor, or
/// from its original start when it has none.
fn subscribe_msg(i: usize, ch: &Chan, opts: &StreamOptions) -> ClientMessage {
    let (cursor, since) = match (&ch.cursor, &ch.start) {
        (Some(c), _) | (None, Start::After(c)) => (Some(c.as_str().to_owned()), None),
        (None, start) => (None, start.since()),
    };
    ClientMessage::Subscribe {
        id: Some(Value::from(i)),
        channel: ch.name.clone(),
        cursor,
        since,
        client_id: opts.client_id.clone(),
        presence: opts.presence,
    }
}

/// The error of an `error` reply to the subscribe of `chan`.
fn reply_error(server: &str, chan: Option<&Chan>, code: &str, message: &str) -> (Error, bool) {
    let Some(chan) = chan else {
        // Not a reply to one of our requests: the server could not read
        // something this client sent.
        return (
            Error::protocol(
                server,
                format!("the server refused a message of this client ({code}): {message}"),
            ),
            true,
        );
    };
    let mut a = ApiError::from_ws(
        code.to_owned(),
        format!("subscribe {:?}: {message}", chan.name),
        None,
    );
    a.extra
        .insert("channel".to_owned(), Value::from(chan.name.clone()));
    let terminal = a.is_terminal() || a.code == "limit_reached";
    (Error::Api(Box::new(a)), terminal)
}

/// An open socket with the subscribes sent, and the messages read ahead by
/// [`Conn::wait_subscribed`].
struct Conn {
    socket: Socket,
    ahead: VecDeque<Incoming<ServerMsg>>,
    server: String,
}

impl Conn {
    async fn open(client: &Client, chans: &[Chan], opts: &StreamOptions) -> Result<Conn, Error> {
        if chans.is_empty() {
            return Err(Error::InvalidArgument(
                "a subscription needs at least one channel".to_owned(),
            ));
        }
        let mut socket =
            ws::open(client, "/v1/ws", opts.idle_timeout, opts.max_event_bytes).await?;
        for (i, ch) in chans.iter().enumerate() {
            socket.feed(&subscribe_msg(i, ch, opts)).await?;
        }
        socket.flush().await?;
        Ok(Conn {
            socket,
            ahead: VecDeque::new(),
            server: client.inner.base.clone(),
        })
    }

    async fn next(&mut self) -> Result<Incoming<ServerMsg>, Error> {
        match self.ahead.pop_front() {
            Some(m) => Ok(m),
            None => self.socket.read().await,
        }
    }

    /// Reads ahead until every channel has answered its subscribe.
    async fn wait_subscribed(&mut self, chans: &[Chan]) -> Result<(), Error> {
        let mut answered = vec![false; chans.len()];
        while answered.contains(&false) {
            let m = self.socket.read::<ServerMsg>().await?;
            match &m {
                Incoming::Message(ServerMsg::Error(e)) => {
                    let chan = requester(chans, e.id.as_ref());
                    return Err(reply_error(&self.server, chan, &e.code, &e.message).0);
                }
                Incoming::Message(msg) => {
                    if let Some(i) = msg
                        .channel()
                        .and_then(|c| chans.iter().position(|ch| ch.name == c))
                    {
                        answered[i] = true;
                    }
                }
                Incoming::Pong => {}
                Incoming::Closed(code, reason) => {
                    return Err(
                        ws::close_error(&self.server, *code, reason, None).unwrap_or_else(|| {
                            Error::Disconnected {
                                server: self.server.clone(),
                                detail:
                                    "the server closed the socket before answering every subscribe"
                                        .to_owned(),
                            }
                        }),
                    )
                }
            }
            self.ahead.push_back(m);
        }
        Ok(())
    }
}

/// A live WebSocket subscription: a [`Stream`] of [`Update`]s that resumes
/// across drops, each channel from its own cursor.
///
/// It ends (yields `None`) after a terminal error, or at a clean close or any
/// failure when reconnecting is off. Dropping it closes its socket at once;
/// nothing keeps running.
pub struct WsSubscription {
    stream: Pin<Box<dyn Stream<Item = Result<Update, Error>> + Send>>,
    channels: Vec<String>,
    cursors: Arc<Mutex<Vec<Option<Cursor>>>>,
}

impl fmt::Debug for WsSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WsSubscription")
            .field("cursors", &self.cursors())
            .finish_non_exhaustive()
    }
}

impl WsSubscription {
    fn spawn(b: WsSubscribeBuilder, first: Option<Conn>) -> Self {
        let chans = initial_channels(&b);
        let channels = chans.iter().map(|c| c.name.clone()).collect();
        let cursors = Arc::new(Mutex::new(chans.iter().map(|c| c.cursor.clone()).collect()));
        WsSubscription {
            stream: Box::pin(run(b, chans, first, cursors.clone())),
            channels,
            cursors,
        }
    }

    /// The next update; `None` once the subscription has ended. Cancel-safe.
    pub async fn next(&mut self) -> Option<Result<Update, Error>> {
        StreamExt::next(self).await
    }

    /// The channels followed, without duplicates, in the order given.
    pub fn channels(&self) -> &[String] {
        &self.channels
    }

    /// `channel`'s position after the last update of it delivered (or its
    /// `subscribed` position): resume from it with
    /// [`WsSubscribeBuilder::cursors`]. `None` before the first position is
    /// known, or for a channel not followed.
    pub fn cursor(&self, channel: &str) -> Option<Cursor> {
        let i = self.channels.iter().position(|c| c == channel)?;
        lock(&self.cursors).get(i).cloned().flatten()
    }

    /// Every channel's known position (see [`WsSubscription::cursor`]), ready
    /// for [`WsSubscribeBuilder::cursors`].
    pub fn cursors(&self) -> BTreeMap<String, Cursor> {
        let cursors = lock(&self.cursors);
        self.channels
            .iter()
            .zip(cursors.iter())
            .filter_map(|(ch, c)| Some((ch.clone(), c.clone()?)))
            .collect()
    }
}

impl Stream for WsSubscription {
    type Item = Result<Update, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.stream.as_mut().poll_next(cx)
    }
}

/// The channel whose subscribe is request `id` (the index this client gave it).
fn requester<'a>(chans: &'a [Chan], id: Option<&Value>) -> Option<&'a Chan> {
    chans.get(usize::try_from(id?.as_u64()?).ok()?)
}

/// Every channel's state, and its cursor mirrored where
/// [`WsSubscription::cursor`] reads it.
struct Positions {
    chans: Vec<Chan>,
    shared: Arc<Mutex<Vec<Option<Cursor>>>>,
}

impl Positions {
    /// Channel `i` is now at `cursor`.
    fn set(&mut self, i: usize, cursor: Cursor) {
        if let Some(slot) = lock(&self.shared).get_mut(i) {
            *slot = Some(cursor.clone());
        }
        self.chans[i].cursor = Some(cursor);
    }
}

/// What one server message means for the subscription.
enum Step {
    /// Hand this update to the caller.
    Deliver(Update),
    /// Nothing to hand on (a reply, a pong, another channel's message).
    Skip,
    /// A refused subscribe: the connection ends with this error, and the
    /// subscription too when it is terminal.
    Refused(Error, bool),
}

/// Reads one message of a connection: moves the positions as the module
/// docs say (`touched[i]`: channel `i` delivered an update on this
/// connection) and says what to hand on.
fn step(
    server: &str,
    pos: &mut Positions,
    touched: &mut [bool],
    retrier: &mut Retrier,
    msg: ServerMsg,
) -> Step {
    if let ServerMsg::Error(e) = &msg {
        let (e, terminal) = reply_error(
            server,
            requester(&pos.chans, e.id.as_ref()),
            &e.code,
            &e.message,
        );
        return Step::Refused(e, terminal);
    }
    // Not a channel this subscription follows: not ours to deliver.
    let Some(i) = msg
        .channel()
        .and_then(|c| pos.chans.iter().position(|ch| ch.name == c))
    else {
        return Step::Skip;
    };
    match msg {
        ServerMsg::Subscribed(s) => {
            retrier.attempt = 0;
            if let (Some(c), false) = (s.cursor, touched[i]) {
                pos.set(i, Cursor::from(c));
            }
            Step::Skip
        }
        ServerMsg::Event(e) => {
            retrier.attempt = 0;
            touched[i] = true;
            let cursor = Cursor::from(e.cursor.into_owned());
            pos.set(i, cursor.clone());
            Step::Deliver(Update::Event(Event {
                channel: e.channel.into_owned(),
                seq: e.seq,
                event_type: e.event_type.map(|t| t.into_owned()),
                data: e.data.into_owned(),
                encoding: e.encoding,
                time: e.time,
                cursor,
            }))
        }
        ServerMsg::Gap(g) => {
            touched[i] = true;
            let next = Cursor::from(g.next);
            pos.set(i, next.clone());
            Step::Deliver(Update::Gap(Gap {
                channel: g.channel.into_owned(),
                after: g.after.map(Cursor::from),
                next,
                reason: parse_reason(&g.reason),
            }))
        }
        ServerMsg::Presence(p) => Step::Deliver(Update::Presence(p)),
        ServerMsg::Ephemeral(e) => Step::Deliver(Update::Ephemeral(Ephemeral {
            channel: e.channel.into_owned(),
            event_type: e.event_type.map(|t| t.into_owned()),
            data: e.data.into_owned(),
            encoding: e.encoding,
            time: e.time,
        })),
        _ => Step::Skip,
    }
}

/// Opens a connection, waiting per the backoff after each failure; the
/// error is one to end the subscription with (terminal, or reconnecting off).
async fn reconnect(
    client: &Client,
    chans: &[Chan],
    opts: &StreamOptions,
    retrier: &mut Retrier,
) -> Result<Conn, Error> {
    loop {
        match Conn::open(client, chans, opts).await {
            Ok(c) => return Ok(c),
            Err(e) if e.is_terminal() || !opts.reconnect => return Err(e),
            Err(e) => {
                let d = retrier.failed(opts, &e);
                tokio::time::sleep(d).await;
            }
        }
    }
}

/// The subscription: connection after connection, each read until it ends,
/// then the wait [`Retrier::after`] decides.
fn run(
    b: WsSubscribeBuilder,
    chans: Vec<Chan>,
    first: Option<Conn>,
    shared: Arc<Mutex<Vec<Option<Cursor>>>>,
) -> impl Stream<Item = Result<Update, Error>> + Send {
    async_stream::stream! {
        let WsSubscribeBuilder { client, opts, .. } = b;
        let server = client.inner.base.clone();
        let mut retrier = Retrier::new(&opts.backoff);
        let mut pos = Positions { chans, shared };
        let mut pending = first;
        loop {
            let mut conn = match pending.take() {
                Some(c) => c,
                None => match reconnect(&client, &pos.chans, &opts, &mut retrier).await {
                    Ok(c) => c,
                    Err(e) => {
                        yield Err(e);
                        return;
                    }
                },
            };
            let opened_at = Instant::now();
            let mut touched = vec![false; pos.chans.len()];
            let mut closed = false;
            let end: Result<(), Error> = loop {
                let msg = match conn.next().await {
                    Ok(Incoming::Message(m)) => m,
                    Ok(Incoming::Pong) => continue,
                    Ok(Incoming::Closed(code, reason)) => {
                        closed = true;
                        break ws::close_error(&server, code, &reason, None).map_or(Ok(()), Err);
                    }
                    Err(e) => break Err(e),
                };
                match step(&server, &mut pos, &mut touched, &mut retrier, msg) {
                    Step::Deliver(update) => yield Ok(update),
                    Step::Skip => {}
                    Step::Refused(e, terminal) if terminal || !opts.reconnect => {
                        yield Err(e);
                        return;
                    }
                    Step::Refused(e, _) => break Err(e),
                }
            };
            if closed {
                conn.socket.finish().await;
            } else {
                drop(conn);
            }
            match retrier.after(&opts, opened_at, end) {
                Ok(wait) if wait.is_zero() => {}
                Ok(wait) => tokio::time::sleep(wait).await,
                Err(None) => return,
                Err(Some(e)) => {
                    yield Err(e);
                    return;
                }
            }
        }
    }
}
