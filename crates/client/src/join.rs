//! The exact join: a channel's history, then its live events, with every
//! journaled event delivered once and in order however publishes race the
//! switch-over.
//!
//! # The algorithm
//!
//! Reading history and then opening a stream leaves a window: an event
//! committed after the last history page was read but before the stream
//! registered would be lost. Opening the stream first and reading history
//! afterwards closes that window but overlaps: events committed in between
//! arrive both ways. A join therefore:
//!
//! 1. opens the live stream first (`since=live`) and waits for its preamble,
//!    the `id:`-only frame the server sends once the subscription is
//!    registered — from then on every new commit reaches the stream — and
//!    buffers whatever it brings from then on;
//! 2. pages history from its cursor until the page that reports `done: true`.
//!    That page's `next` is the **tip** and its `head` the tip's seq: every
//!    event up to the tip has now been delivered from history, and every
//!    event after it was committed after the stream registered, so it is (or
//!    will be) in the stream;
//! 3. drains the buffer, dropping journaled events whose seq is at or below
//!    the tip (and, defensively, at or below the last one delivered), then
//!    follows the stream with the same filter.
//!
//! Live events are compared by seq, which the stream's `id:` does not give:
//! the id is the *subscription's* cursor and cursors are opaque. So the join
//! asks for `?format=envelope`, whose JSON data carries each event's
//! `channel` and `seq`; the comparison is between seqs of the one channel,
//! from one journal incarnation (a stream ends when its server does, and a
//! walk that meets another incarnation gets a `410 epoch` answer).
//!
//! Ephemeral events have no seq and are never filtered; they are delivered
//! in the order the stream brings them (those that arrive during the history
//! walk are delivered after the history).
//!
//! The join remembers the highest applied cursor (the last event delivered,
//! or the tip). After a reconnection the next walk starts there, so a retry
//! reads only what may have been missed. A gap notice on the stream (the
//! reader fell behind retention) is not passed on: the join walks history
//! again from its applied cursor, with the stream still open and buffering,
//! and the history answer says exactly what, if anything, is really lost: a
//! `410 cursor_not_served` becomes a [`Gap`] update (`after` = the applied
//! cursor, `next` = the server's `floor_cursor`) and the walk continues from
//! the oldest retained event.
//!
//! Reconnection is off by default (a one-shot join): a clean close ends the
//! join and a failure is returned. With [`JoinBuilder::reconnect`] on, a clean
//! close reopens at once and a failure waits per [`Backoff`].
//!
//! Limitation: the stream and the history must come from the same journal
//! incarnation. If a server with an in-memory journal is replaced during a
//! walk, the join relies on the old stream ending before the buffered frames
//! are drained (it does, on any host that closes its sockets when it dies; a
//! host that vanishes silently is noticed after the idle timeout).

use crate::backoff::Backoff;
use crate::client::{read_page, Client};
use crate::error::Error;
use crate::live::{self, Connection, Frame, Target};
use crate::subscribe::{lock, Reconnect, Retrier, StreamOptions};
use crate::types::{Cursor, Gap, Start, Update};
use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use gapless_protocol::codes::GapReason;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// A boundary between two phases of a join, for tests that force publishes
/// into each window. Not part of the stable API.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinPhase {
    /// A cycle starts: the live stream is about to be opened.
    BeforeLive,
    /// The live stream is registered; no history has been read in this cycle.
    LiveOpen,
    /// History page `n` (from 1) of the current walk was read and its events
    /// delivered; `done` on the last page, whose `next` is the tip.
    Page {
        /// The page number within this walk.
        n: usize,
        /// Whether it was the last page.
        done: bool,
    },
    /// A buffered frame was handled during the drain; `remaining` are left.
    Drain {
        /// Buffered frames still to handle.
        remaining: usize,
    },
    /// The buffer is empty: the join follows the stream.
    Following,
}

/// An async callback run at each [`JoinPhase`]; the join waits for it.
#[doc(hidden)]
pub type PhaseHook = Arc<dyn Fn(JoinPhase) -> BoxFuture<'static, ()> + Send + Sync>;

/// Settings of a join. Built by [`Client::join`].
#[must_use = "a join builder does nothing until opened"]
pub struct JoinBuilder {
    client: Client,
    channel: String,
    after: Option<Cursor>,
    /// `since=` of the first history page when there is no cursor (`None`:
    /// from the oldest retained event).
    since: Option<String>,
    page_size: u32,
    max_buffered: usize,
    opts: StreamOptions,
    hook: Option<PhaseHook>,
}

impl fmt::Debug for JoinBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinBuilder")
            .field("channel", &self.channel)
            .field("after", &self.after)
            .field("since", &self.since)
            .field("page_size", &self.page_size)
            .finish_non_exhaustive()
    }
}

impl JoinBuilder {
    pub(crate) fn new(client: Client, channel: String) -> Self {
        JoinBuilder {
            client,
            channel,
            after: None,
            since: None,
            page_size: 1000,
            max_buffered: 100_000,
            opts: StreamOptions::new(false),
            hook: None,
        }
    }

    /// Start after this cursor (default: from the oldest retained event).
    pub fn after(mut self, cursor: Cursor) -> Self {
        self.after = Some(cursor);
        self.since = None;
        self
    }

    /// Where the join starts, as a subscription's [`Start`] (default
    /// [`Start::Earliest`]): the history walk's first page asks for it
    /// (`since=` of `GET /v1/channels/{channel}/events`: the oldest retained
    /// event, the last N, from a time, or only what comes next for
    /// [`Start::Live`]), or [`Start::After`] a cursor; the walk goes on from
    /// there, then live, exactly once. A time before the floor gives a
    /// [`Gap`] (reason `Evicted`) first. Applied while the join has no
    /// cursor of its own: after a reconnection it resumes from its cursor.
    /// A value the server refuses (`Last(0)`, `Last(1001)`) ends the join
    /// with [`Error::Api`] 400 `invalid_request`.
    pub fn start(mut self, start: Start) -> Self {
        match start {
            Start::After(c) => return self.after(c),
            Start::Earliest => self.since = None,
            other => self.since = other.since(),
        }
        self.after = None;
        self
    }

    /// The last `n` retained events (1 to 1000), then live ([`Start::Last`]).
    pub fn since_last(self, n: u64) -> Self {
        self.start(Start::Last(n))
    }

    /// From the first retained event at or after `t`, then live
    /// ([`Start::Time`]).
    pub fn since_time(self, t: std::time::SystemTime) -> Self {
        self.start(Start::time(t))
    }

    /// Start after this cursor, or from the oldest retained event when `None`.
    pub fn after_opt(mut self, cursor: Option<Cursor>) -> Self {
        self.after = cursor;
        self.since = None;
        self
    }

    /// Events per history page, 1 to 1000 (default 1000).
    pub fn page_size(mut self, n: u32) -> Self {
        self.page_size = n;
        self
    }

    /// Most live frames buffered during a history walk (default 100 000).
    /// Past it the stream is closed and, once the walk is done, reopened from
    /// the new position: memory stays bounded whatever the publish rate.
    pub fn max_buffered(mut self, n: usize) -> Self {
        self.max_buffered = n.max(1);
        self
    }

    /// Whether to reconnect after a drop (default false: a clean close ends
    /// the join, a failure is returned).
    pub fn reconnect(mut self, on: bool) -> Self {
        self.opts.reconnect = on;
        self
    }

    /// The reconnection delays (default [`Backoff::default`]).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.opts.backoff = backoff;
        self
    }

    /// Treat a stream that brings no byte for this long as dropped (default
    /// 45 s); `None` waits forever.
    pub fn idle_timeout(mut self, t: Option<Duration>) -> Self {
        self.opts.idle_timeout = t;
        self
    }

    /// The largest SSE event accepted, in bytes (default
    /// [`crate::sse::DEFAULT_MAX_EVENT_BYTES`]).
    pub fn max_event_bytes(mut self, n: usize) -> Self {
        self.opts.max_event_bytes = n;
        self
    }

    /// Calls `hook` before each reconnection wait.
    pub fn on_reconnect(mut self, hook: impl Fn(&Reconnect<'_>) + Send + Sync + 'static) -> Self {
        self.opts.on_reconnect = Some(Arc::new(hook));
        self
    }

    /// Runs `hook` at every phase boundary (tests only).
    #[doc(hidden)]
    pub fn phase_hook<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(JoinPhase) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.hook = Some(Arc::new(move |p| Box::pin(hook(p))));
        self
    }

    /// The join; it starts when first polled.
    pub fn open(self) -> Join {
        let cursor = Arc::new(Mutex::new(self.after.clone()));
        Join {
            stream: Box::pin(run(self, cursor.clone())),
            cursor,
        }
    }

    /// The join, folded: see [`Join::fold`].
    pub fn fold<S, E, F>(self, init: S, f: F) -> Fold<S, E>
    where
        F: FnMut(&S, &Update) -> Result<S, E> + Send + 'static,
    {
        self.open().fold(init, f)
    }
}

/// A running join: a [`Stream`] of [`Update`]s (history, then live).
/// Dropping it closes its connections at once; nothing keeps running.
pub struct Join {
    stream: Pin<Box<dyn Stream<Item = Result<Update, Error>> + Send>>,
    cursor: Arc<Mutex<Option<Cursor>>>,
}

impl fmt::Debug for Join {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Join")
            .field("cursor", &self.cursor())
            .finish_non_exhaustive()
    }
}

impl Join {
    /// The next update; `None` once the join has ended. Cancel-safe.
    pub async fn next(&mut self) -> Option<Result<Update, Error>> {
        StreamExt::next(self).await
    }

    /// The highest applied cursor: the last event delivered, or the tip of
    /// the last history walk. Resume a later join from it.
    pub fn cursor(&self) -> Option<Cursor> {
        lock(&self.cursor).clone()
    }

    /// Folds every update into a state with `f` and yields immutable views of
    /// it. `f` gets the current state and the update and returns the next
    /// state; when it returns an error the state is unchanged, the error is
    /// reported as [`Folded::Rejected`] and the join goes on.
    pub fn fold<S, E, F>(self, init: S, f: F) -> Fold<S, E>
    where
        F: FnMut(&S, &Update) -> Result<S, E> + Send + 'static,
    {
        Fold {
            join: self,
            state: Arc::new(init),
            f: Box::new(f),
        }
    }
}

impl Stream for Join {
    type Item = Result<Update, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.stream.as_mut().poll_next(cx)
    }
}

/// An immutable state of a folded join.
#[derive(Debug)]
pub struct View<S> {
    /// The state after the update.
    pub state: Arc<S>,
    /// The join's applied cursor after the update: persist it with the state
    /// to resume later with [`JoinBuilder::after`].
    pub cursor: Option<Cursor>,
}

impl<S> Clone for View<S> {
    fn clone(&self) -> Self {
        View {
            state: self.state.clone(),
            cursor: self.cursor.clone(),
        }
    }
}

/// One step of a [`Fold`].
#[derive(Debug)]
pub enum Folded<S, E> {
    /// `update` was folded in; `view` is the new state.
    Applied {
        /// The new state.
        view: View<S>,
        /// What was folded in.
        update: Update,
    },
    /// The fold function refused `update`; `view` is the unchanged state.
    Rejected {
        /// The unchanged state.
        view: View<S>,
        /// What was refused.
        update: Update,
        /// The fold function's error.
        error: E,
    },
}

impl<S, E> Folded<S, E> {
    /// The state after this step.
    pub fn view(&self) -> &View<S> {
        match self {
            Folded::Applied { view, .. } | Folded::Rejected { view, .. } => view,
        }
    }
}

type FoldFn<S, E> = Box<dyn FnMut(&S, &Update) -> Result<S, E> + Send>;

/// A join folded into a state: a [`Stream`] of [`Folded`] steps, ending with
/// the join (a join error is yielded as `Err`, then the stream ends).
pub struct Fold<S, E> {
    join: Join,
    state: Arc<S>,
    f: FoldFn<S, E>,
}

impl<S, E> fmt::Debug for Fold<S, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fold")
            .field("join", &self.join)
            .finish_non_exhaustive()
    }
}

impl<S, E> Fold<S, E> {
    /// The current state.
    pub fn state(&self) -> Arc<S> {
        self.state.clone()
    }

    /// The next step; `None` once the join has ended. Cancel-safe.
    pub async fn next(&mut self) -> Option<Result<Folded<S, E>, Error>> {
        StreamExt::next(self).await
    }
}

impl<S, E> Stream for Fold<S, E> {
    type Item = Result<Folded<S, E>, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let update = match ready!(this.join.poll_next_unpin(cx)) {
            None => return Poll::Ready(None),
            Some(Err(e)) => return Poll::Ready(Some(Err(e))),
            Some(Ok(u)) => u,
        };
        let cursor = this.join.cursor();
        Poll::Ready(Some(Ok(match (this.f)(&this.state, &update) {
            Ok(next) => {
                this.state = Arc::new(next);
                Folded::Applied {
                    view: View {
                        state: this.state.clone(),
                        cursor,
                    },
                    update,
                }
            }
            Err(error) => Folded::Rejected {
                view: View {
                    state: this.state.clone(),
                    cursor,
                },
                update,
                error,
            },
        })))
    }
}

/// How the live stream stopped while a walk was buffering it.
enum LiveEnd {
    Clean,
    Failed(Error),
    Overflow,
}

/// Awaits `fut` while moving the stream's frames into `buffer`.
async fn pump<T>(
    fut: impl Future<Output = T>,
    conn: &mut Connection,
    buffer: &mut VecDeque<Frame>,
    end: &mut Option<LiveEnd>,
    max_buffered: usize,
) -> T {
    let mut fut = std::pin::pin!(fut);
    loop {
        if end.is_some() {
            return fut.await;
        }
        tokio::select! {
            biased;
            out = &mut fut => return out,
            frame = conn.next_frame() => match frame {
                Ok(Some(f)) => {
                    buffer.push_back(f);
                    if buffer.len() > max_buffered {
                        *end = Some(LiveEnd::Overflow);
                    }
                }
                Ok(None) => *end = Some(LiveEnd::Clean),
                Err(e) => *end = Some(LiveEnd::Failed(e)),
            },
        }
    }
}

/// Opens the live stream (`since=live`) and waits for its preamble: once it
/// has come, every new commit reaches the stream (step 1 of the algorithm).
async fn open_live(
    client: &Client,
    channel: &str,
    opts: &StreamOptions,
) -> Result<Connection, Error> {
    let channels = [channel.to_owned()];
    let mut c = live::open(Target {
        client,
        channels: &channels,
        start: &Start::Live,
        resume: None,
        idle_timeout: opts.idle_timeout,
        max_event_bytes: opts.max_event_bytes,
        client_id: None,
        presence: false,
    })
    .await?;
    c.wait_preamble().await?;
    Ok(c)
}

/// The join's applied cursor, mirrored where [`Join::cursor`] reads it.
struct Applied {
    cursor: Option<Cursor>,
    shared: Arc<Mutex<Option<Cursor>>>,
}

impl Applied {
    fn set(&mut self, cursor: Cursor) {
        *lock(&self.shared) = Some(cursor.clone());
        self.cursor = Some(cursor);
    }
}

/// A history read refused with `410 cursor_not_served` and a
/// `floor_cursor`, as the gap it means: everything after `from` up to the
/// floor is lost, and the walk goes on from the floor. Any other error is
/// given back.
fn not_served(channel: &str, from: Option<&Cursor>, e: Error) -> Result<Gap, Error> {
    let a = match e {
        Error::Api(a) if a.status == 410 => a,
        other => return Err(other),
    };
    match a.floor_cursor() {
        Some(floor) => Ok(Gap {
            channel: channel.to_owned(),
            after: from.cloned(),
            next: floor,
            reason: a.gap_reason().unwrap_or(GapReason::Unknown),
        }),
        None => Err(Error::Api(a)),
    }
}

/// What the join does with a live frame once it has delivered up to seq
/// `last_seq` (step 3 of the algorithm).
enum Pass {
    /// Hand it to the caller: a journaled event past `last_seq` (now the
    /// last), or an ephemeral event.
    Deliver(Update),
    /// Nothing to hand on: an event history delivered already, or a cursor.
    Skip,
    /// A gap notice: the stream skipped a range; history says whether it
    /// is really lost, so walk it again.
    Rewalk,
    /// The server's `retry:`, the base of later reconnection waits.
    Retry(Duration),
}

fn pass(frame: Frame, last_seq: &mut u64) -> Pass {
    match frame {
        Frame::Update(Update::Event(e)) if e.seq > *last_seq => {
            *last_seq = e.seq;
            Pass::Deliver(Update::Event(e))
        }
        Frame::Update(Update::Event(_)) | Frame::Cursor(_) => Pass::Skip,
        Frame::Update(Update::Ephemeral(x)) => Pass::Deliver(Update::Ephemeral(x)),
        Frame::Update(Update::Presence(x)) => Pass::Deliver(Update::Presence(x)),
        Frame::Update(Update::Gap(_)) => Pass::Rewalk,
        Frame::Retry(d) => Pass::Retry(d),
    }
}

/// The join: cycle after cycle, each one a live stream opened first, then
/// walks of history (buffering the stream) each followed by the drain of the
/// buffer and the stream itself, until the stream ends; then the wait
/// [`Retrier::after`] decides.
fn run(
    b: JoinBuilder,
    shared: Arc<Mutex<Option<Cursor>>>,
) -> impl Stream<Item = Result<Update, Error>> + Send {
    async_stream::stream! {
        let JoinBuilder { client, channel, after, since, page_size, max_buffered, opts, hook } = b;
        let phase = |p: JoinPhase| {
            let fut = hook.as_ref().map(|h| h(p));
            async move {
                if let Some(fut) = fut {
                    fut.await;
                }
            }
        };
        let mut applied = Applied { cursor: after, shared };
        let mut retrier = Retrier::new(&opts.backoff);
        let mut buffer: VecDeque<Frame> = VecDeque::new();
        loop {
            buffer.clear();
            phase(JoinPhase::BeforeLive).await;
            let mut opened_at = Instant::now();
            let end = match open_live(&client, &channel, &opts).await {
                Err(e) => LiveEnd::Failed(e),
                Ok(mut conn) => {
                    retrier.attempt = 0;
                    opened_at = Instant::now();
                    phase(JoinPhase::LiveOpen).await;
                    loop {
                        // Walk history from the applied cursor to the tip, buffering the stream.
                        let mut live_end: Option<LiveEnd> = None;
                        let mut from = applied.cursor.clone();
                        let mut n = 0;
                        let tip = loop {
                            // The start applies while the join has no cursor yet.
                            let first = since.as_deref().filter(|_| from.is_none());
                            let read = read_page(&client, &channel, from.as_ref(), first, Some(page_size));
                            match pump(read, &mut conn, &mut buffer, &mut live_end, max_buffered).await {
                                Ok(page) => {
                                    n += 1;
                                    if let Some(gap) = page.gap {
                                        // A time before the floor: what is gone, then the floor.
                                        yield Ok(Update::Gap(gap));
                                    }
                                    for e in page.events {
                                        applied.set(e.cursor.clone());
                                        yield Ok(Update::Event(e));
                                    }
                                    if page.done {
                                        applied.set(page.next);
                                        phase(JoinPhase::Page { n, done: true }).await;
                                        break Ok(page.head);
                                    }
                                    from = Some(page.next);
                                    phase(JoinPhase::Page { n, done: false }).await;
                                }
                                Err(e) => match not_served(&channel, from.as_ref(), e) {
                                    Ok(gap) => {
                                        applied.set(gap.next.clone());
                                        from = Some(gap.next.clone());
                                        yield Ok(Update::Gap(gap));
                                    }
                                    Err(e) => break Err(e),
                                },
                            }
                        };
                        let tip = match tip {
                            Ok(tip) => tip,
                            Err(e) => break LiveEnd::Failed(e),
                        };
                        // The stream stopped during the walk: its buffer may be stale; start over.
                        if let Some(end) = live_end {
                            break end;
                        }
                        // Drain the buffer, then follow the stream, past the tip only.
                        let mut last_seq = tip;
                        let mut following = false;
                        let end = loop {
                            let (frame, from_buffer) = match buffer.pop_front() {
                                Some(f) => (f, true),
                                None => {
                                    if !following {
                                        following = true;
                                        phase(JoinPhase::Following).await;
                                    }
                                    match conn.next_frame().await {
                                        Ok(Some(f)) => (f, false),
                                        Ok(None) => break Some(LiveEnd::Clean),
                                        Err(e) => break Some(LiveEnd::Failed(e)),
                                    }
                                }
                            };
                            match pass(frame, &mut last_seq) {
                                Pass::Deliver(update) => {
                                    if let Update::Event(e) = &update {
                                        applied.set(e.cursor.clone());
                                    }
                                    yield Ok(update);
                                }
                                Pass::Skip => {}
                                Pass::Rewalk => break None,
                                Pass::Retry(d) => retrier.base = d,
                            }
                            if from_buffer {
                                phase(JoinPhase::Drain { remaining: buffer.len() }).await;
                            }
                        };
                        if let Some(end) = end {
                            break end;
                        }
                    }
                }
            };
            let next = match end {
                LiveEnd::Overflow => continue,
                LiveEnd::Clean => retrier.after(&opts, opened_at, Ok(())),
                LiveEnd::Failed(e) => retrier.after(&opts, opened_at, Err(e)),
            };
            match next {
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
