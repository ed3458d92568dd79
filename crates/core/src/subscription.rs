//! A subscription: one client's positions on one or more channels.
//!
//! A subscription holds, per channel, only a cursor (`epoch`, `pos` = last seq
//! delivered) and two wake-up handles. [`Subscription::next`] returns the next
//! thing to deliver: events after the cursor (from the hub's window, or from
//! the journal when the reader is further behind), a [`Gap`] when retention or
//! a new epoch passed the cursor, or an ephemeral event. Replay and live
//! delivery are the same loop; a slow reader just reads older events later.

use crate::hub::{Cell, Pending};
use crate::journal::{ChannelState, Journal, JournalError};
use bytes::Bytes;
use gapless_protocol::codes::GapReason;
use gapless_protocol::event::Envelope;
use gapless_protocol::sse::{self, Format};
use gapless_protocol::{Cursor, Encoding, Epoch, Event, Payload};
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use tokio::sync::watch;

/// Where a subscription starts on one channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// At the head: only events published from now on.
    Live,
    /// At the floor: everything retained, then live.
    Earliest,
    /// The last `n` retained events (all of them when fewer are retained,
    /// with no notice: only retained events are asked for), then live.
    Last(u64),
    /// At the first retained event whose `time` is at or after this Unix
    /// time in milliseconds ([`Journal::seek_time`]), then live; at the head
    /// when none is. When an event no longer retained may be at or after it
    /// ([`crate::journal::TimeSeek::evicted_after`]), at the floor with a
    /// gap notice (`evicted`) naming the evicted seqs.
    Time(u64),
    /// After `seq` of journal incarnation `epoch` (from a cursor).
    After {
        /// The cursor's epoch.
        epoch: Epoch,
        /// The last seq the client has.
        seq: u64,
    },
    /// The client presented a position this server cannot read.
    Unknown,
}

/// A notice that a range of a channel was not delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// The channel.
    pub channel: Arc<str>,
    /// The client's position before the hole (`None`: it could not be read).
    pub after: Option<(Epoch, u64)>,
    /// Where delivery continues: the hole ends at and includes this seq.
    pub next: (Epoch, u64),
    /// Why.
    pub reason: GapReason,
}

impl Gap {
    /// The gap notice's wire shape, with `after` and `next` as
    /// single-channel cursors (`after` null when unknown).
    pub fn notice(&self) -> gapless_protocol::event::GapNotice<'static> {
        let after = self
            .after
            .map(|(e, s)| Cursor::single(&self.channel, e, s).encode());
        let next = Cursor::single(&self.channel, self.next.0, self.next.1).encode();
        gapless_protocol::event::GapNotice {
            channel: self.channel.to_string().into(),
            after,
            next,
            reason: self.reason.as_str().into(),
        }
    }

    /// The JSON of a gap notice: `{"channel","after","next","reason"}`, with
    /// `after` and `next` as single-channel cursors (`after` null when unknown).
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.notice()).unwrap_or_default()
    }

    /// The SSE frame: `event: gap` with the JSON as data, and no `id:` line.
    pub fn sse_frame(&self) -> Bytes {
        let mut out = Vec::with_capacity(256);
        sse::write_event(&mut out, Some("gap"), &self.to_json());
        Bytes::from(out)
    }
}

/// An ephemeral event: live only, no seq, never journaled.
pub struct Ephemeral {
    /// The channel.
    pub channel: Arc<str>,
    /// Optional type.
    pub event_type: Option<String>,
    /// The payload: text, or bytes.
    pub data: Payload,
    /// When it was published, Unix ms.
    pub time: u64,
    plain: OnceLock<Bytes>,
    envelope: OnceLock<Bytes>,
}

impl Ephemeral {
    pub(crate) fn new(channel: Arc<str>, event_type: Option<String>, data: Payload) -> Self {
        Ephemeral {
            channel,
            event_type,
            data,
            time: crate::journal::now_ms(),
            plain: OnceLock::new(),
            envelope: OnceLock::new(),
        }
    }

    /// The envelope shape (`seq` null).
    pub fn envelope(&self) -> Envelope<'_> {
        Envelope {
            channel: (&*self.channel).into(),
            seq: None,
            event_type: self.event_type.as_deref().map(Into::into),
            data: self.data.wire(),
            encoding: self.data.encoding(),
            time: self.time,
        }
    }

    /// The SSE frame, without an `id:` line so it never moves a client's cursor.
    pub fn sse_frame(&self, format: Format) -> &Bytes {
        let cell = match format {
            Format::Plain => &self.plain,
            Format::Envelope => &self.envelope,
        };
        cell.get_or_init(|| {
            let mut out = Vec::with_capacity(self.data.len() + 32);
            match format {
                Format::Plain => match &self.data {
                    Payload::Text(text) => {
                        sse::write_event(&mut out, self.event_type.as_deref(), text)
                    }
                    Payload::Binary(_) => sse::write_encoded_event(
                        &mut out,
                        self.event_type.as_deref(),
                        Encoding::Base64,
                        &self.data.wire(),
                    ),
                },
                Format::Envelope => {
                    let json = serde_json::to_string(&self.envelope()).unwrap_or_default();
                    sse::write_event(&mut out, self.event_type.as_deref(), &json)
                }
            }
            Bytes::from(out)
        })
    }
}

/// Event data a reader behind the window takes from the journal in one read,
/// about (see [`Journal::read_bounded`]): a slow reader of large events holds
/// this much, not `batch` events.
pub const READ_BYTES: usize = 1 << 20;

/// One channel of a subscription: a cursor and its wake-up handles.
pub(crate) struct Follow {
    cell: Arc<Cell>,
    epoch: Epoch,
    pos: u64,
    head_rx: watch::Receiver<u64>,
    eph_seen: u64,
}

impl Follow {
    pub(crate) fn new(
        cell: Arc<Cell>,
        epoch: Epoch,
        pos: u64,
        head_rx: watch::Receiver<u64>,
        eph_seen: u64,
    ) -> Self {
        cell.add_subscriber();
        Follow {
            cell,
            epoch,
            pos,
            head_rx,
            eph_seen,
        }
    }
}

impl Drop for Follow {
    fn drop(&mut self) {
        self.cell.remove_subscriber();
    }
}

/// What a subscription delivers next.
#[derive(Debug)]
pub enum Item {
    /// Events of channel number `index` (in subscription order), ascending; the
    /// subscription's position has moved to the last of them.
    Events {
        /// Which channel of the subscription.
        index: usize,
        /// The events.
        events: Vec<Arc<Event>>,
    },
    /// A hole; the position has moved to `gap.next`.
    Gap(Gap),
    /// A live-only event.
    Ephemeral(Arc<Ephemeral>),
}

impl std::fmt::Debug for Ephemeral {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ephemeral")
            .field("channel", &self.channel)
            .field("data", &self.data)
            .finish()
    }
}

/// A client's positions on its channels; see the module doc.
pub struct Subscription {
    follows: Vec<Follow>,
    journal: Arc<dyn Journal>,
    /// Most events one [`Subscription::next`] returns (`u32`, as is `rr`:
    /// 8 bytes less in every subscriber, whose stream holds it).
    batch: u32,
    /// The channel looked at first by the next call (round robin).
    rr: u32,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").finish_non_exhaustive()
    }
}

impl Subscription {
    pub(crate) fn new(follows: Vec<Follow>, journal: Arc<dyn Journal>, batch: usize) -> Self {
        Subscription {
            follows,
            journal,
            batch: u32::try_from(batch.max(1)).unwrap_or(u32::MAX),
            rr: 0,
        }
    }

    /// How many channels this subscription follows.
    pub fn len(&self) -> usize {
        self.follows.len()
    }

    /// True when it follows no channel.
    pub fn is_empty(&self) -> bool {
        self.follows.is_empty()
    }

    /// The name of channel number `index`.
    pub fn channel(&self, index: usize) -> &Arc<str> {
        self.follows[index].cell.name()
    }

    /// The index of `channel` in this subscription (valid until the next
    /// follow or unfollow).
    pub fn index_of(&self, channel: &str) -> Option<usize> {
        self.follows
            .iter()
            .position(|f| &**f.cell.name() == channel)
    }

    /// The position (epoch, last seq delivered) on channel number `index`.
    pub fn position(&self, index: usize) -> (Epoch, u64) {
        let f = &self.follows[index];
        (f.epoch, f.pos)
    }

    /// How many events the channel at `index` has past this subscription's
    /// position (its head as last signalled, minus the position).
    pub fn lag(&self, index: usize) -> u64 {
        let f = &self.follows[index];
        (*f.head_rx.borrow()).saturating_sub(f.pos)
    }

    /// Stops following `channel`; false if it was not followed.
    pub fn unfollow(&mut self, channel: &str) -> bool {
        match self.index_of(channel) {
            Some(i) => {
                self.follows.remove(i);
                self.rr = 0;
                true
            }
            None => false,
        }
    }

    pub(crate) fn push(&mut self, follow: Follow) {
        self.follows.push(follow);
    }

    /// The cursor of the whole subscription: every channel's position.
    pub fn cursor(&self) -> Cursor {
        let mut c = Cursor::new();
        for f in &self.follows {
            c.set(f.cell.name(), f.epoch, f.pos);
        }
        c
    }

    /// The cursor of the whole subscription with channel `index` at `seq`
    /// (used to give each event of a batch its own resumable id).
    pub fn cursor_at(&self, index: usize, seq: u64) -> Cursor {
        let mut c = self.cursor();
        let f = &self.follows[index];
        c.set(f.cell.name(), f.epoch, seq);
        c
    }

    /// Waits for and returns the next item. Cancel-safe: dropping the future
    /// before it completes moves no position.
    ///
    /// # Errors
    /// [`JournalError`] when a read from the journal fails.
    ///
    /// (An `async` block over `self`, not an `async fn`, which would keep
    /// `self` twice in the future every idle subscriber's task holds.)
    // Not `async fn`: see above. `next` as before (not an iterator).
    #[allow(clippy::manual_async_fn, clippy::should_implement_trait)]
    pub fn next(&mut self) -> impl Future<Output = Result<Item, JournalError>> + Send + '_ {
        async move {
            if self.follows.is_empty() {
                return std::future::pending().await;
            }
            loop {
                let n = self.follows.len();
                for k in 0..n {
                    let i = (self.rr as usize + k) % n;
                    if let Some(item) = self.poll_follow(i).await? {
                        self.rr = ((i + 1) % n) as u32;
                        return Ok(item);
                    }
                }
                self.wait().await;
            }
        }
    }

    async fn poll_follow(&mut self, i: usize) -> Result<Option<Item>, JournalError> {
        let batch = self.batch as usize;
        let f = &mut self.follows[i];
        f.head_rx.borrow_and_update();
        if let Some((n, e)) = f.cell.ephemeral_after(f.eph_seen) {
            f.eph_seen = n;
            return Ok(Some(Item::Ephemeral(e)));
        }
        let item = match f.cell.pending(f.epoch, f.pos, batch) {
            Pending::AtHead => None,
            Pending::Events(events) => advance(f, i, events),
            Pending::Evicted(st) => Some(evicted(f, st)),
            Pending::EpochChanged(st)
                if self
                    .journal
                    .continues(f.cell.name(), f.epoch, f.pos, st.epoch) =>
            {
                // The journal kept every event up to our position: same place, new epoch.
                f.epoch = st.epoch;
                return Box::pin(self.poll_follow(i)).await;
            }
            Pending::EpochChanged(st) => {
                let fork = self.journal.fork_of(f.cell.name(), f.epoch, st.epoch);
                Some(epoch_changed(f, st, fork))
            }
            // Boxed: a read from the journal is the largest state of this
            // future, which every idle subscriber holds (its wait is sized
            // beside it); the box is made only for a reader behind the window.
            Pending::Behind => return Box::pin(self.read_behind(i)).await,
        };
        Ok(item)
    }

    /// [`Subscription::poll_follow`] for channel `i` when its cursor is
    /// older than the hub's window: reads the journal.
    async fn read_behind(&mut self, i: usize) -> Result<Option<Item>, JournalError> {
        let batch = self.batch as usize;
        let f = &mut self.follows[i];
        let page = self
            .journal
            .read_bounded(f.cell.name(), f.pos, batch, READ_BYTES)
            .await?;
        if page.state.epoch != f.epoch
            && self
                .journal
                .continues(f.cell.name(), f.epoch, f.pos, page.state.epoch)
        {
            f.epoch = page.state.epoch;
            return self.poll_follow(i).await;
        }
        Ok(if page.state.epoch != f.epoch {
            let fork = self
                .journal
                .fork_of(f.cell.name(), f.epoch, page.state.epoch);
            Some(epoch_changed(f, page.state, fork))
        } else if f.pos + 1 < page.state.floor {
            Some(evicted(f, page.state))
        } else {
            advance(f, i, page.events)
        })
    }

    /// Sleeps until any channel's head moves or an ephemeral event arrives
    /// (both bump the channel's watch).
    async fn wait(&mut self) {
        if let [f] = self.follows.as_mut_slice() {
            // An error means the sender is gone, which cannot happen while we hold the cell.
            let _ = f.head_rx.changed().await;
            return;
        }
        type Wake<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;
        let mut futs: Vec<Wake<'_>> = self
            .follows
            .iter_mut()
            .map(|f| -> Wake<'_> {
                Box::pin(async move {
                    let _ = f.head_rx.changed().await;
                })
            })
            .collect();
        poll_fn(|cx| {
            for fut in futs.iter_mut() {
                if fut.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(());
                }
            }
            Poll::Pending
        })
        .await
    }
}

fn advance(f: &mut Follow, index: usize, events: Vec<Arc<Event>>) -> Option<Item> {
    let last = events.last()?.seq;
    f.pos = last;
    Some(Item::Events { index, events })
}

/// Retention passed a reader mid-stream: name the hole and continue from the floor.
fn evicted(f: &mut Follow, st: ChannelState) -> Item {
    let gap = Gap {
        channel: f.cell.name().clone(),
        after: Some((f.epoch, f.pos)),
        next: (st.epoch, st.floor - 1),
        reason: GapReason::Evicted,
    };
    f.pos = st.floor - 1;
    metrics::counter!("gapless_gaps_total", "reason" => GapReason::Evicted.as_str()).increment(1);
    Item::Gap(gap)
}

/// The journal is a new incarnation: what the reader held of the old one is
/// lost; continue at the head, or right after the fork point when the new
/// epoch is a fork of the reader's ([`Journal::fork_of`]: everything after
/// it in the new epoch was appended since, and is delivered).
fn epoch_changed(f: &mut Follow, st: ChannelState, fork: Option<u64>) -> Item {
    let next = fork.map_or(st.head, |fork| fork.min(st.head));
    let gap = Gap {
        channel: f.cell.name().clone(),
        after: Some((f.epoch, f.pos)),
        next: (st.epoch, next),
        reason: GapReason::Epoch,
    };
    f.epoch = st.epoch;
    f.pos = next;
    metrics::counter!("gapless_gaps_total", "reason" => GapReason::Epoch.as_str()).increment(1);
    Item::Gap(gap)
}
