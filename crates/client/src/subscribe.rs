//! Subscriptions: follow one or several channels over Server-Sent Events and
//! resume, after any drop, from the last position handed to the caller.
//!
//! A [`Subscription`] remembers the cursor of the last thing it *delivered*
//! (returned from [`Subscription::next`]), not the last one it received: a
//! frame that was read but not yet handed over is read again after a
//! reconnection. The server's `id:`-only frames (sent when a stream starts and
//! after a gap notice) count as delivered when everything before them has
//! been: nothing is owed before such a position.
//!
//! Reconnection (on by default): a clean close by the server reconnects at
//! once; a failure waits per [`Backoff`] (full jitter, from the server's
//! `retry:`); a terminal refusal ([`Error::is_terminal`]: 400, 401, 403, 404,
//! …) is returned and ends the subscription.

use crate::backoff::Backoff;
use crate::client::Client;
use crate::error::Error;
use crate::live::{self, Connection, Frame, Target};
use crate::sse::DEFAULT_MAX_EVENT_BYTES;
use crate::types::{Cursor, Start, Update};
use futures::{Stream, StreamExt};
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// What a reconnecting stream tells [`SubscribeBuilder::on_reconnect`] before it waits.
#[derive(Debug)]
pub struct Reconnect<'a> {
    /// The failure, or `None` when the server closed the stream cleanly.
    pub error: Option<&'a Error>,
    /// How long it waits before connecting again.
    pub delay: Duration,
    /// Consecutive failures so far, this one included; a clean close counts
    /// only when it follows another within a second of connecting (else 0).
    pub attempt: u32,
    /// The server ended the stream because its token expired (SSE: `event:
    /// gapless.expired`, docs/security.md). The reconnect sends the client's
    /// token again: a fresh one from [`ClientBuilder::token_fn`](crate::ClientBuilder::token_fn),
    /// else the same one, which the server then refuses (401, a terminal error).
    pub token_expired: bool,
}

/// A callback told about each reconnection (e.g. to log it).
pub type ReconnectHook = Arc<dyn Fn(&Reconnect<'_>) + Send + Sync>;

/// Shared connection settings of subscriptions and joins.
#[derive(Clone)]
pub(crate) struct StreamOptions {
    pub(crate) reconnect: bool,
    pub(crate) backoff: Backoff,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) max_event_bytes: usize,
    pub(crate) on_reconnect: Option<ReconnectHook>,
    /// On an open server, who this subscriber is for presence (`client_id`).
    pub(crate) client_id: Option<String>,
    /// Whether to get the join and leave notices of the channels' members.
    pub(crate) presence: bool,
}

impl StreamOptions {
    pub(crate) fn new(reconnect: bool) -> Self {
        StreamOptions {
            reconnect,
            backoff: Backoff::default(),
            idle_timeout: Some(Duration::from_secs(45)),
            max_event_bytes: DEFAULT_MAX_EVENT_BYTES,
            on_reconnect: None,
            client_id: None,
            presence: false,
        }
    }

    pub(crate) fn notify(
        &self,
        error: Option<&Error>,
        delay: Duration,
        attempt: u32,
        token_expired: bool,
    ) {
        if let Some(hook) = &self.on_reconnect {
            hook(&Reconnect {
                error,
                delay,
                attempt,
                token_expired,
            });
        }
    }
}

/// Decides the wait after a stream ended, tracking consecutive failures.
pub(crate) struct Retrier {
    /// The server's `retry:`, or the backoff's initial base.
    pub(crate) base: Duration,
    /// Consecutive failures; reset when a stream delivers its preamble.
    pub(crate) attempt: u32,
    /// The previous clean close came less than a second after connecting.
    quick_close: bool,
    /// The stream that just ended was ended by its token's expiry (told to
    /// the next [`Retrier::closed`]'s notice, then cleared).
    pub(crate) expired: bool,
}

impl Retrier {
    pub(crate) fn new(backoff: &Backoff) -> Self {
        Retrier {
            base: backoff.initial,
            attempt: 0,
            quick_close: false,
            expired: false,
        }
    }

    /// The wait after a failure.
    pub(crate) fn failed(&mut self, opts: &StreamOptions, e: &Error) -> Duration {
        let d = opts.backoff.delay(self.base, self.attempt);
        self.attempt = self.attempt.saturating_add(1);
        self.quick_close = false;
        self.expired = false;
        opts.notify(Some(e), d, self.attempt, false);
        d
    }

    /// The wait after a clean close of a stream opened at `opened`: none,
    /// unless this and the previous one both closed within a second of
    /// opening (a server that accepts and closes at once must not make the
    /// client spin).
    pub(crate) fn closed(&mut self, opts: &StreamOptions, opened: Instant) -> Duration {
        let quick = opened.elapsed() < Duration::from_secs(1);
        let d = if quick && self.quick_close {
            let d = opts.backoff.delay(self.base, self.attempt);
            self.attempt = self.attempt.saturating_add(1);
            d
        } else {
            Duration::ZERO
        };
        self.quick_close = quick;
        opts.notify(None, d, self.attempt, std::mem::take(&mut self.expired));
        d
    }

    /// What follows a stream opened at `opened` that ended with `end` (`Ok`:
    /// a clean close): `Ok(wait)` to reconnect after `wait`
    /// ([`Retrier::closed`], [`Retrier::failed`]); `Err(None)` to end
    /// quietly (a clean close with reconnecting off); `Err(Some(e))` to end
    /// with `e` (a terminal error, or any with reconnecting off).
    pub(crate) fn after(
        &mut self,
        opts: &StreamOptions,
        opened: Instant,
        end: Result<(), Error>,
    ) -> Result<Duration, Option<Error>> {
        match end {
            Ok(()) if !opts.reconnect => Err(None),
            Ok(()) => Ok(self.closed(opts, opened)),
            Err(e) if e.is_terminal() || !opts.reconnect => Err(Some(e)),
            Err(e) => Ok(self.failed(opts, &e)),
        }
    }
}

/// Settings of a subscription. Built by [`Client::subscribe`].
#[must_use = "a subscription builder does nothing until opened"]
pub struct SubscribeBuilder {
    client: Client,
    channels: Vec<String>,
    start: Start,
    opts: StreamOptions,
}

impl fmt::Debug for SubscribeBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubscribeBuilder")
            .field("channels", &self.channels)
            .field("start", &self.start)
            .finish_non_exhaustive()
    }
}

impl SubscribeBuilder {
    pub(crate) fn new(client: Client, channels: Vec<String>) -> Self {
        SubscribeBuilder {
            client,
            channels,
            start: Start::Live,
            opts: StreamOptions::new(true),
        }
    }

    /// Where to start (default [`Start::Live`]: events published from now on).
    pub fn start(mut self, start: Start) -> Self {
        self.start = start;
        self
    }

    /// Start after `cursor` (one the server issued for these channels); a
    /// garbage cursor is refused with 400 `invalid_cursor` on the first connection.
    pub fn after(self, cursor: Cursor) -> Self {
        self.start(Start::After(cursor))
    }

    /// Start with everything retained, then follow live.
    pub fn since_earliest(self) -> Self {
        self.start(Start::Earliest)
    }

    /// Start with the last `n` retained events of each channel (1 to 1000),
    /// then follow live ([`Start::Last`]).
    pub fn since_last(self, n: u64) -> Self {
        self.start(Start::Last(n))
    }

    /// Start at each channel's first retained event at or after `t`, then
    /// follow live ([`Start::Time`]; a gap first when an event no longer
    /// retained may be at or after `t`).
    pub fn since_time(self, t: std::time::SystemTime) -> Self {
        self.start(Start::time(t))
    }

    /// Whether to reconnect after a drop (default true). Off, the subscription
    /// ends at a clean close and yields the error of a failed one.
    pub fn reconnect(mut self, on: bool) -> Self {
        self.opts.reconnect = on;
        self
    }

    /// The reconnection delays (default [`Backoff::default`]).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.opts.backoff = backoff;
        self
    }

    /// Treat a connection that brings no byte for this long as dropped
    /// (default 45 s, three of the server's default 15 s heartbeats); `None`
    /// waits forever.
    pub fn idle_timeout(mut self, t: Option<Duration>) -> Self {
        self.opts.idle_timeout = t;
        self
    }

    /// The largest SSE event accepted, in bytes (default
    /// [`DEFAULT_MAX_EVENT_BYTES`]); a larger one ends the subscription with
    /// [`Error::EventTooLarge`].
    pub fn max_event_bytes(mut self, n: usize) -> Self {
        self.opts.max_event_bytes = n;
        self
    }

    /// Calls `hook` before each reconnection wait (from the subscription's
    /// task: keep it short).
    pub fn on_reconnect(mut self, hook: impl Fn(&Reconnect<'_>) + Send + Sync + 'static) -> Self {
        self.opts.on_reconnect = Some(Arc::new(hook));
        self
    }

    /// On a server without keys, who this subscriber is for presence
    /// (`?client_id=`: 1 to 128 characters of `A-Z a-z 0-9 . _ : @ -`); on
    /// a server with keys a member is its token's `sub` and this is refused
    /// (400 `invalid_request`). Its connection to each channel whose
    /// namespace has presence makes it a member there (docs/api.md,
    /// "Presence").
    pub fn client_id(mut self, id: impl Into<String>) -> Self {
        self.opts.client_id = Some(id.into());
        self
    }

    /// Whether to get the join and leave of the channels' members as
    /// [`Update::Presence`] (`?presence=true`; default false). A channel
    /// whose namespace has no presence gives none; when none has it, the
    /// connection is refused with 404 `presence_disabled`.
    pub fn presence(mut self, on: bool) -> Self {
        self.opts.presence = on;
        self
    }

    /// The subscription, not yet connected: it connects when first polled, and
    /// retries failed connections like later drops.
    pub fn open(self) -> Subscription {
        Subscription::spawn(self, None)
    }

    /// Connects now and returns once the server has registered the
    /// subscription (its first `id:` frame arrived): every event published
    /// after this returns will be delivered.
    ///
    /// # Errors
    /// Any failure of this first connection, whether or not reconnecting is
    /// on: [`Error::Unreachable`], [`Error::Api`] (400 `invalid_cursor`,
    /// `invalid_channel`, `invalid_request`; 503), [`Error::Protocol`].
    pub async fn connect(self) -> Result<Subscription, Error> {
        let mut conn = live::open(Target {
            client: &self.client,
            channels: &self.channels,
            start: &self.start,
            resume: None,
            idle_timeout: self.opts.idle_timeout,
            max_event_bytes: self.opts.max_event_bytes,
            client_id: self.opts.client_id.as_deref(),
            presence: self.opts.presence,
        })
        .await?;
        conn.wait_preamble().await?;
        Ok(Subscription::spawn(self, Some(conn)))
    }
}

/// A live subscription: a [`Stream`] of [`Update`]s that resumes across drops.
///
/// It ends (yields `None`) after a terminal error, or at a clean close or any
/// failure when reconnecting is off. Dropping it closes its connection at once;
/// nothing keeps running.
pub struct Subscription {
    stream: Pin<Box<dyn Stream<Item = Result<Update, Error>> + Send>>,
    cursor: Arc<Mutex<Option<Cursor>>>,
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("cursor", &self.cursor())
            .finish_non_exhaustive()
    }
}

impl Subscription {
    fn spawn(b: SubscribeBuilder, first: Option<Connection>) -> Self {
        let preamble = first.as_ref().and_then(Connection::leading_cursor);
        let cursor = Arc::new(Mutex::new(preamble.or(match &b.start {
            Start::After(c) => Some(c.clone()),
            _ => None,
        })));
        Subscription {
            stream: Box::pin(run(b, first, cursor.clone())),
            cursor,
        }
    }

    /// The next update; `None` once the subscription has ended. Cancel-safe.
    pub async fn next(&mut self) -> Option<Result<Update, Error>> {
        StreamExt::next(self).await
    }

    /// The position after the last update delivered (or the last `id:`-only
    /// frame that followed it): resume from it with
    /// [`SubscribeBuilder::after`]. `None` before the first position is known.
    pub fn cursor(&self) -> Option<Cursor> {
        lock(&self.cursor).clone()
    }
}

impl Stream for Subscription {
    type Item = Result<Update, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.stream.as_mut().poll_next(cx)
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn run(
    b: SubscribeBuilder,
    first: Option<Connection>,
    shared: Arc<Mutex<Option<Cursor>>>,
) -> impl Stream<Item = Result<Update, Error>> + Send {
    async_stream::stream! {
        let SubscribeBuilder { client, channels, start, opts } = b;
        let mut cursor: Option<Cursor> = lock(&shared).clone();
        // Reconnect with Last-Event-ID only once the server issued a position.
        let mut issued = false;
        let mut retrier = Retrier::new(&opts.backoff);
        let mut pending = first;
        loop {
            let mut conn = match pending.take() {
                Some(c) => c,
                None => {
                    let opened = live::open(Target {
                        client: &client,
                        channels: &channels,
                        start: &start,
                        resume: if issued { cursor.as_ref() } else { None },
                        idle_timeout: opts.idle_timeout,
                        max_event_bytes: opts.max_event_bytes,
                        client_id: opts.client_id.as_deref(),
                        presence: opts.presence,
                    })
                    .await;
                    match opened {
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
            let opened_at = Instant::now();
            let end = loop {
                match conn.next_frame().await {
                    Ok(Some(Frame::Update(u))) => {
                        if let Update::Event(e) = &u {
                            cursor = Some(e.cursor.clone());
                            issued = true;
                        }
                        // An id-only frame right behind (as after a gap notice)
                        // is delivered with the update.
                        if let Some(c) = conn.take_next_cursor() {
                            cursor = Some(c);
                            issued = true;
                            retrier.attempt = 0;
                        }
                        *lock(&shared) = cursor.clone();
                        yield Ok(u);
                    }
                    Ok(Some(Frame::Cursor(c))) => {
                        cursor = Some(c);
                        issued = true;
                        *lock(&shared) = cursor.clone();
                        retrier.attempt = 0;
                    }
                    Ok(Some(Frame::Retry(d))) => retrier.base = d,
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(e),
                }
            };
            retrier.expired = conn.token_expired();
            drop(conn);
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
