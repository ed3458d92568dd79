//! The hub: every channel that has subscribers, its recent events, and the
//! wake-up that tells subscribers the head moved.
//!
//! Each followed channel has one [`Cell`] holding a bounded *window* of its
//! newest committed events (shared `Arc<Event>`s whose encodings are built once)
//! and a `watch` of its head. A subscriber is only a cursor into that window
//! (see [`crate::subscription`]); when it falls behind the window it reads the
//! journal, so memory per subscriber does not grow with its lag.
//!
//! The journal reports commits to [`Channels`] (a [`CommitSink`]) in commit
//! order; cells exist only for channels someone follows, so publishing to a
//! channel nobody follows costs the hub nothing.

use crate::journal::{Appended, ChannelState, CommitSink, Journal, JournalError, Page, TimeSeek};
use crate::subscription::{Ephemeral, Follow, Gap, Start, Subscription};
use gapless_protocol::codes::GapReason;
use gapless_protocol::{Epoch, Event, NewEvent, Payload};
use parking_lot::RwLock;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::{watch, OnceCell};

/// Bounds of each channel's in-memory window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowLimits {
    /// Most events kept in memory per followed channel (default 1024).
    pub max_events: usize,
    /// Most bytes of event data kept in memory per followed channel (default
    /// 1 MiB); the newest event is kept whatever its size. Counts the data
    /// only: each kept event also holds about 0.65 KB (itself, its cursor) and
    /// the frames built from it, about the data's size per format in use
    /// (`docs/deploy.md`, "Memory").
    pub max_bytes: usize,
    /// Ephemeral events buffered per channel for slow readers (default 16); a
    /// reader further behind misses the oldest (ephemeral events are best
    /// effort). The buffer is allocated whole for every followed channel, so it
    /// is kept small.
    pub ephemeral_capacity: usize,
    /// A followed channel whose last subscriber left is forgotten after this many
    /// milliseconds (default 30000).
    pub linger_ms: u64,
}

impl Default for WindowLimits {
    fn default() -> Self {
        WindowLimits {
            max_events: 1024,
            max_bytes: 1 << 20,
            ephemeral_capacity: 16,
            linger_ms: 30_000,
        }
    }
}

/// The table of followed channels; the journal's commit sink.
pub struct Channels {
    limits: WindowLimits,
    map: RwLock<HashMap<Arc<str>, Arc<Cell>>>,
    /// Told of every [`CommitSink::meta_changed`] ([`Channels::on_meta_changed`]).
    meta_listener: std::sync::OnceLock<MetaListener>,
}

impl std::fmt::Debug for Channels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channels").finish_non_exhaustive()
    }
}

/// What [`Channels::on_meta_changed`] calls with a channel's name. Called
/// where the journal commits (under its lock, on its writer thread): it
/// must not block or call the journal; it may spawn.
pub type MetaListener = Box<dyn Fn(&str) + Send + Sync>;

/// Wake groups of a channel's subscribers: a subscription is in one
/// ([`Hub::subscribe`]), a commit wakes them all, and [`Hub::wake_group`]
/// wakes one. A server's stream clock wakes one group per step, so its
/// streams' heartbeats are spread over the period without waking an idle
/// stream between its own (`crates/server/src/ops/stream.rs`, `PHASES`).
/// A subscription in no group (`None`: WebSocket, Durable Streams and
/// session subscribers, which keep their own timers) is woken by commits
/// and by `wake_group(None)` only.
pub const WAKE_GROUPS: usize = 4;

/// One followed channel.
pub struct Cell {
    name: Arc<str>,
    window: RwLock<Window>,
    /// The head, sent to each wake group that has had a subscriber (made on
    /// first use, kept while the cell lives, so a channel followed by one
    /// subscriber holds one), and last to the subscribers in no group.
    heads: [std::sync::OnceLock<watch::Sender<u64>>; WAKE_GROUPS + 1],
    subscribers: AtomicUsize,
    idle_since_ms: AtomicU64,
    loaded: OnceCell<()>,
    limits: WindowLimits,
}

impl std::fmt::Debug for Cell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cell").finish_non_exhaustive()
    }
}

struct Window {
    /// Ephemeral events published to this channel, ever.
    ephemeral_count: u64,
    /// The newest of them (at most `ephemeral_capacity`).
    ephemeral: VecDeque<Arc<Ephemeral>>,
    known: bool,
    state: ChannelState,
    events: VecDeque<Arc<Event>>,
    bytes: usize,
}

/// What a cursor at `pos` can read from a cell right now.
pub(crate) enum Pending {
    /// The next events after the cursor, ascending.
    Events(Vec<Arc<Event>>),
    /// Nothing newer than the cursor.
    AtHead,
    /// Retention passed the cursor: the events after it are gone.
    Evicted(ChannelState),
    /// The journal is another incarnation than the cursor's.
    EpochChanged(ChannelState),
    /// Retained, but older than the window: read the journal.
    Behind,
}

/// The index in [`Cell`]'s heads of wake group `group` (`None`: the last,
/// which no clock wakes).
fn slot(group: Option<usize>) -> usize {
    group.map_or(WAKE_GROUPS, |g| g % WAKE_GROUPS)
}

impl Cell {
    fn new(name: Arc<str>, limits: WindowLimits) -> Self {
        Cell {
            name,
            window: RwLock::new(Window {
                ephemeral_count: 0,
                ephemeral: VecDeque::new(),
                known: false,
                state: ChannelState::empty(Epoch(0)),
                events: VecDeque::new(),
                bytes: 0,
            }),
            heads: Default::default(),
            subscribers: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(crate::journal::now_ms()),
            loaded: OnceCell::new(),
            limits,
        }
    }

    /// The channel's name.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// The channel's bounds as the hub knows them.
    pub fn state(&self) -> ChannelState {
        self.window.read().state
    }

    /// How many subscribers follow this channel now.
    pub fn subscribers(&self) -> usize {
        self.subscribers.load(Ordering::Relaxed)
    }

    pub(crate) fn add_subscriber(&self) {
        self.subscribers.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn remove_subscriber(&self) {
        if self.subscribers.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.idle_since_ms
                .store(crate::journal::now_ms(), Ordering::Relaxed);
        }
    }

    /// A receiver of the head in wake group `group` (modulo [`WAKE_GROUPS`];
    /// `None`: in no group). The group's sender is made with the head read
    /// under the window's lock, so a commit either comes before (and the head
    /// is read after it) or finds the sender and sends to it.
    pub(crate) fn watch_head(&self, group: Option<usize>) -> watch::Receiver<u64> {
        let w = self.window.read();
        self.heads[slot(group)]
            .get_or_init(|| watch::Sender::new(w.state.head))
            .subscribe()
    }

    /// Sends `head` to every wake group (`send_replace`), or, with `None`,
    /// wakes them with the head unchanged.
    fn send_head(&self, head: Option<u64>) {
        for tx in self.heads.iter().filter_map(std::sync::OnceLock::get) {
            match head {
                Some(h) => {
                    tx.send_replace(h);
                }
                None => tx.send_modify(|_| {}),
            }
        }
    }

    /// The number of ephemeral events published so far (a follow starts here,
    /// so it gets only those published after it).
    pub(crate) fn ephemeral_count(&self) -> u64 {
        self.window.read().ephemeral_count
    }

    /// The oldest buffered ephemeral event after number `seen`, with its number.
    /// A reader more than the buffer behind skips to the oldest still buffered.
    pub(crate) fn ephemeral_after(&self, seen: u64) -> Option<(u64, Arc<Ephemeral>)> {
        let w = self.window.read();
        if w.ephemeral_count <= seen {
            return None;
        }
        let oldest = w.ephemeral_count + 1 - w.ephemeral.len() as u64;
        let n = (seen + 1).max(oldest);
        w.ephemeral
            .get((n - oldest) as usize)
            .map(|e| (n, e.clone()))
    }

    fn push_ephemeral(&self, e: Arc<Ephemeral>) {
        {
            let mut w = self.window.write();
            w.ephemeral_count += 1;
            w.ephemeral.push_back(e);
            while w.ephemeral.len() > self.limits.ephemeral_capacity.max(1) {
                w.ephemeral.pop_front();
            }
        }
        // Wake every follower; the head did not move.
        self.send_head(None);
    }

    async fn ensure_loaded(&self, journal: &dyn Journal) -> Result<(), JournalError> {
        self.loaded
            .get_or_try_init(|| async {
                let st = journal.state(&self.name).await?;
                self.observe(st);
                Ok::<(), JournalError>(())
            })
            .await?;
        Ok(())
    }

    /// Applies a state read from or reported by the journal (see `Window::merge`)
    /// and returns the head.
    fn observe(&self, st: ChannelState) -> u64 {
        let mut w = self.window.write();
        w.merge(st);
        w.trim(&self.limits);
        w.state.head
    }

    fn apply_commit(&self, st: ChannelState, events: &[Arc<Event>]) {
        let head = {
            let mut w = self.window.write();
            w.merge(st);
            for e in events {
                if let Some(last) = w.events.back() {
                    if e.seq <= last.seq {
                        continue;
                    }
                    if e.seq != last.seq + 1 {
                        w.events.clear();
                        w.bytes = 0;
                    }
                }
                w.bytes += e.data.len();
                w.events.push_back(e.clone());
            }
            w.trim(&self.limits);
            w.state.head
        };
        self.send_head(Some(head));
    }

    /// What a cursor at `pos` of `epoch` can read now: at most `max` events
    /// from the window, or what to do instead. Below the head, the answer is
    /// never an empty batch (which a reader would take for the head and wait
    /// on): the window may end before the head (the head was learnt from a
    /// state read or report before the commit notice of its events), and a
    /// cursor at or past the window's last event then reads the journal.
    pub(crate) fn pending(&self, epoch: Epoch, pos: u64, max: usize) -> Pending {
        let w = self.window.read();
        if w.state.epoch != epoch {
            return Pending::EpochChanged(w.state);
        }
        if pos >= w.state.head {
            return Pending::AtHead;
        }
        if pos + 1 < w.state.floor {
            return Pending::Evicted(w.state);
        }
        match (w.events.front(), w.events.back()) {
            (Some(first), Some(last)) if first.seq <= pos + 1 && pos < last.seq => {
                let skip = (pos + 1 - first.seq) as usize;
                Pending::Events(w.events.range(skip..).take(max.max(1)).cloned().collect())
            }
            _ => Pending::Behind,
        }
    }
}

impl Window {
    /// Merges a state read from or reported by the journal: within an epoch,
    /// heads and floors only move forward; a new epoch replaces everything.
    fn merge(&mut self, st: ChannelState) {
        if !self.known || self.state.epoch != st.epoch {
            self.events.clear();
            self.bytes = 0;
            self.known = true;
            self.state = st;
        } else {
            self.state.head = self.state.head.max(st.head);
            self.state.floor = self.state.floor.max(st.floor);
        }
    }

    fn trim(&mut self, limits: &WindowLimits) {
        while let Some(front) = self.events.front() {
            let over = self.events.len() > limits.max_events.max(1)
                || (self.bytes > limits.max_bytes && self.events.len() > 1);
            if front.seq < self.state.floor || over {
                self.bytes -= front.data.len();
                self.events.pop_front();
            } else {
                break;
            }
        }
    }
}

impl Channels {
    /// An empty table.
    pub fn new(limits: WindowLimits) -> Self {
        Channels {
            limits,
            map: RwLock::new(HashMap::new()),
            meta_listener: std::sync::OnceLock::new(),
        }
    }

    /// Sets what is told when a channel's metadata changes (once; a second
    /// call is ignored and returns false).
    pub fn on_meta_changed(&self, listener: MetaListener) -> bool {
        self.meta_listener.set(listener).is_ok()
    }

    fn get(&self, channel: &str) -> Option<Arc<Cell>> {
        self.map.read().get(channel).cloned()
    }

    fn get_or_create(&self, channel: &str) -> Arc<Cell> {
        if let Some(c) = self.get(channel) {
            return c;
        }
        let mut map = self.map.write();
        map.entry(Arc::from(channel))
            .or_insert_with_key(|k| Arc::new(Cell::new(k.clone(), self.limits)))
            .clone()
    }

    /// Forgets cells nobody has followed for `linger_ms`.
    fn sweep(&self, now: u64) {
        let linger = self.limits.linger_ms;
        self.map.write().retain(|_, c| {
            c.subscribers() > 0
                || now.saturating_sub(c.idle_since_ms.load(Ordering::Relaxed)) < linger
                // a Follow being built holds an Arc but has not counted itself yet
                || Arc::strong_count(c) > 1
        });
    }
}

impl CommitSink for Channels {
    fn committed(&self, channel: &str, state: ChannelState, events: &[Arc<Event>]) {
        if let Some(cell) = self.get(channel) {
            cell.apply_commit(state, events);
        }
    }

    fn evicted(&self, channel: &str, state: ChannelState) {
        if let Some(cell) = self.get(channel) {
            let head = cell.observe(state);
            cell.send_head(Some(head));
        }
    }

    fn follows(&self, channel: &str) -> bool {
        self.map.read().contains_key(channel)
    }

    fn meta_changed(&self, channel: &str) {
        if let Some(l) = self.meta_listener.get() {
            l(channel);
        }
    }

    fn followed(&self) -> Vec<Arc<str>> {
        self.map.read().keys().cloned().collect()
    }

    fn ephemeral(&self, channel: &str, event_type: Option<String>, data: Payload) {
        if let Some(cell) = self.get(channel) {
            cell.push_ephemeral(Arc::new(Ephemeral::new(
                cell.name.clone(),
                event_type,
                data,
            )));
        }
    }
}

/// A follow of one channel's head ([`Hub::watch_head`]); dropping it stops
/// following.
pub struct HeadWatch {
    cell: Arc<Cell>,
    rx: watch::Receiver<u64>,
}

impl HeadWatch {
    /// The channel's head as last signalled (its last seq; 0 when empty).
    pub fn head(&self) -> u64 {
        *self.rx.borrow()
    }

    /// Waits until the head is signalled again (a commit, an eviction, a
    /// purge; sometimes with the head unchanged) and returns it.
    pub async fn changed(&mut self) -> u64 {
        if self.rx.changed().await.is_err() {
            // The cell lives as long as this watch holds it: never closed.
            std::future::pending::<()>().await;
        }
        *self.rx.borrow_and_update()
    }

    /// The channel watched.
    pub fn channel(&self) -> &Arc<str> {
        self.cell.name()
    }
}

impl std::fmt::Debug for HeadWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeadWatch")
            .field("channel", self.cell.name())
            .finish()
    }
}

/// What [`Hub::follow`] resolved.
#[derive(Debug)]
pub struct Followed {
    /// The notice to send before anything else, when the start could not be served whole.
    pub gap: Option<Gap>,
    /// The channel's head when the follow started.
    pub head: u64,
}

/// Counts the hub knows, read by `/metrics` when scraped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HubStats {
    /// Channels followed in memory (with a window of recent events).
    pub channels: usize,
    /// Subscribers over all of them.
    pub subscribers: usize,
}

/// The hub: the journal plus the followed channels.
pub struct Hub {
    channels: Arc<Channels>,
    journal: Arc<dyn Journal>,
    /// Metric handles of the publish path, looked up once (the recorder is
    /// installed before the hub is built; without one they record nothing).
    /// `gapless_events_published_total` under the journal's durability label
    /// as last seen (a journal in Redis reports what Redis's settings give,
    /// which can change while the server runs).
    published: parking_lot::RwLock<(&'static str, metrics::Counter)>,
    published_ephemeral: metrics::Counter,
    publish_seconds: metrics::Histogram,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").finish_non_exhaustive()
    }
}

impl Hub {
    /// How many channels are followed and by how many subscribers (one
    /// pass over the followed channels, under their table's read lock).
    pub fn stats(&self) -> HubStats {
        let map = self.channels.map.read();
        HubStats {
            channels: map.len(),
            subscribers: map.values().map(|c| c.subscribers()).sum(),
        }
    }

    /// Builds a hub. `channels` must be the sink the journal was opened with.
    pub fn new(channels: Arc<Channels>, journal: Arc<dyn Journal>) -> Self {
        Hub {
            published: parking_lot::RwLock::new((
                journal.durability(),
                metrics::counter!(
                    "gapless_events_published_total",
                    "durability" => journal.durability()
                ),
            )),
            published_ephemeral: metrics::counter!(
                "gapless_events_published_total",
                "durability" => "ephemeral"
            ),
            publish_seconds: metrics::histogram!("gapless_publish_seconds"),
            channels,
            journal,
        }
    }

    /// The journal behind this hub.
    pub fn journal(&self) -> &Arc<dyn Journal> {
        &self.journal
    }

    /// Appends events (see [`Journal::append`]); subscribers are woken before it returns.
    ///
    /// # Errors
    /// [`JournalError`] when storage fails; nothing was appended then.
    pub async fn publish(
        &self,
        channel: &str,
        events: Vec<NewEvent>,
        idempotency_key: Option<&str>,
    ) -> Result<Appended, JournalError> {
        let n = events.len() as u64;
        let started = std::time::Instant::now();
        let appended = self
            .journal
            .append(channel, events, idempotency_key)
            .await?;
        self.publish_seconds.record(started.elapsed());
        if !appended.duplicate {
            self.count_published(n);
        }
        Ok(appended)
    }

    /// The channel's metadata and bounds (see [`Journal::meta`]).
    ///
    /// # Errors
    /// [`JournalError`] when storage fails.
    pub async fn meta(
        &self,
        channel: &str,
    ) -> Result<(Option<crate::meta::ChannelMeta>, ChannelState), JournalError> {
        self.journal.meta(channel).await
    }

    /// Decides and commits a change of the channel's metadata with the
    /// events it guards (see [`Journal::change`]); subscribers are woken
    /// before it returns, and appended events are counted as published.
    ///
    /// # Errors
    /// [`JournalError`] when storage fails; nothing was committed then.
    pub async fn change(
        &self,
        channel: &str,
        change: crate::meta::Change,
    ) -> Result<crate::meta::Changed, JournalError> {
        let started = std::time::Instant::now();
        let changed = self.journal.change(channel, change).await?;
        if let crate::meta::Outcome::Created(Some(a)) | crate::meta::Outcome::Appended(Some(a)) =
            &changed.outcome
        {
            self.publish_seconds.record(started.elapsed());
            if !a.duplicate {
                self.count_published(a.last_seq + 1 - a.first_seq);
            }
        }
        Ok(changed)
    }

    /// The channels under `prefix` that have metadata, in name order, at
    /// most `limit` ([`Journal::channels_with_meta`]).
    ///
    /// # Errors
    /// [`JournalError`] when storage fails.
    pub async fn channels_with_meta(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<String>, JournalError> {
        self.journal.channels_with_meta(prefix, limit).await
    }

    /// The table of followed channels (the journal's sink).
    pub fn channels(&self) -> &Arc<Channels> {
        &self.channels
    }

    /// Removes every event of `channel` and starts a new epoch for it (see
    /// [`Journal::purge`]); its subscribers are woken before this returns and
    /// each gets one `epoch` gap, then the events appended after the purge.
    ///
    /// # Errors
    /// [`JournalError`] when storage fails.
    pub async fn purge(&self, channel: &str) -> Result<ChannelState, JournalError> {
        self.journal.purge(channel).await
    }

    /// Counts `n` published events under the journal's current durability label.
    fn count_published(&self, n: u64) {
        let label = self.journal.durability();
        {
            let p = self.published.read();
            if p.0 == label {
                p.1.increment(n);
                return;
            }
        }
        let c = metrics::counter!("gapless_events_published_total", "durability" => label);
        c.increment(n);
        *self.published.write() = (label, c);
    }

    /// Delivers an event live to the channel's current subscribers only: no seq,
    /// never journaled. Returns how many subscribers it reached.
    pub fn publish_ephemeral(
        &self,
        channel: &str,
        event_type: Option<String>,
        data: Payload,
    ) -> usize {
        self.published_ephemeral.increment(1);
        self.journal
            .share_ephemeral(channel, event_type.as_deref(), &data);
        let Some(cell) = self.channels.get(channel) else {
            return 0;
        };
        let e = Arc::new(Ephemeral::new(cell.name.clone(), event_type, data));
        cell.push_ephemeral(e);
        cell.subscribers()
    }

    /// One page of history: at most `limit` events and about `max_bytes` of
    /// data (see [`Journal::read_bounded`]).
    ///
    /// # Errors
    /// [`JournalError`] when storage fails.
    pub async fn read(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Page, JournalError> {
        self.journal
            .read_bounded(channel, after, limit, max_bytes)
            .await
    }

    /// The channel's bounds.
    ///
    /// # Errors
    /// [`JournalError`] when storage fails.
    pub async fn state(&self, channel: &str) -> Result<ChannelState, JournalError> {
        self.journal.state(channel).await
    }

    /// The first retained event of `channel` at or after `time_ms` (see
    /// [`Journal::seek_time`]).
    ///
    /// # Errors
    /// [`JournalError`] when storage fails.
    pub async fn seek_time(&self, channel: &str, time_ms: u64) -> Result<TimeSeek, JournalError> {
        self.journal.seek_time(channel, time_ms).await
    }

    /// How many subscribers follow `channel` now.
    pub fn subscribers(&self, channel: &str) -> usize {
        self.channels.get(channel).map_or(0, |c| c.subscribers())
    }

    /// Starts a subscription on `starts` (channel, where to start). Returns it
    /// with the gap notices to send before anything else (one per channel whose
    /// start position could not be served whole; that channel then starts at
    /// its head, or for [`Start::Time`] at its floor). `group`: its wake
    /// group in each channel (modulo [`WAKE_GROUPS`]; see [`Hub::wake_group`];
    /// `None` for a subscriber no clock wakes).
    ///
    /// # Errors
    /// [`JournalError`] when a channel's state cannot be read.
    pub async fn subscribe(
        &self,
        starts: Vec<(String, Start)>,
        batch: usize,
        group: Option<usize>,
    ) -> Result<(Subscription, Vec<Gap>), JournalError> {
        let mut sub = self.empty_subscription(batch);
        let mut gaps = Vec::new();
        for (channel, start) in starts {
            gaps.extend(self.follow_in(&mut sub, &channel, start, group).await?.gap);
        }
        Ok((sub, gaps))
    }

    /// A subscription that follows nothing yet (channels are added with [`Hub::follow`]).
    pub fn empty_subscription(&self, batch: usize) -> Subscription {
        Subscription::new(Vec::new(), self.journal.clone(), batch)
    }

    /// Adds `channel` to `sub`, starting at `start`. The answer holds the gap
    /// notice to send first when the start position cannot be served whole (the
    /// channel then starts at its head, or for [`Start::Time`] at its floor),
    /// and the head the start was resolved against (replay ends there).
    /// Following a channel already followed replaces its position.
    ///
    /// # Errors
    /// [`JournalError`] when the channel's state cannot be read (or, for
    /// [`Start::Time`], the journal's [`Journal::seek_time`] fails).
    pub async fn follow(
        &self,
        sub: &mut Subscription,
        channel: &str,
        start: Start,
    ) -> Result<Followed, JournalError> {
        self.follow_in(sub, channel, start, None).await
    }

    /// [`Hub::follow`] in wake group `group` of the channel (modulo
    /// [`WAKE_GROUPS`]; see [`Hub::wake_group`]). [`Hub::follow`] puts the
    /// channel in no group (`None`), for a subscriber no clock wakes.
    ///
    /// # Errors
    /// As [`Hub::follow`].
    pub async fn follow_in(
        &self,
        sub: &mut Subscription,
        channel: &str,
        start: Start,
        group: Option<usize>,
    ) -> Result<Followed, JournalError> {
        let cell = self.channels.get_or_create(channel);
        cell.ensure_loaded(self.journal.as_ref()).await?;
        // Watch first, then read the state: a commit after this point wakes us.
        let head_rx = cell.watch_head(group);
        let eph_seen = cell.ephemeral_count();
        let st = cell.state();
        let fork = match start {
            Start::After { epoch, .. } if epoch != st.epoch => {
                self.journal.fork_of(channel, epoch, st.epoch)
            }
            _ => None,
        };
        let seek = match start {
            Start::Time(t) => Some(self.journal.seek_time(channel, t).await?),
            _ => None,
        };
        let start = match start {
            // A position the journal carried into its new epoch (a failover
            // that kept it) is the same position there.
            Start::After { seq, .. } if fork.is_some_and(|fork| seq <= fork) => Start::After {
                epoch: st.epoch,
                seq,
            },
            other => other,
        };
        let (pos, gap) = match (start, seek) {
            (Start::Time(t), Some(seek)) => at_time(&cell.name, st, t, seek),
            _ => resolve(&cell.name, st, start, fork),
        };
        match (&gap, start) {
            (Some(g), _) => {
                metrics::counter!("gapless_gaps_total", "reason" => g.reason.as_str()).increment(1);
            }
            (None, Start::After { .. }) => {
                metrics::counter!("gapless_replays_total").increment(1);
                metrics::counter!("gapless_events_replayed_total")
                    .increment(st.head.saturating_sub(pos));
            }
            (None, _) => {}
        }
        sub.unfollow(channel);
        sub.push(Follow::new(cell, st.epoch, pos, head_rx, eph_seen));
        Ok(Followed { gap, head: st.head })
    }

    /// Watches `channel`'s head without reading its events: the channel is
    /// followed while the watch lives (its cell is held, so it is not
    /// forgotten, and a journal shared between nodes reads the commits
    /// other nodes make to it), so its commits move the head the watch
    /// sees. It is not a subscriber: no count or metric of subscribers
    /// includes it. For a component that
    /// needs to know that a channel grew, not what it holds (a Durable
    /// Streams subscription's delivery).
    ///
    /// # Errors
    /// [`JournalError`] when the channel's state cannot be read.
    pub async fn watch_head(&self, channel: &str) -> Result<HeadWatch, JournalError> {
        let cell = self.channels.get_or_create(channel);
        cell.ensure_loaded(self.journal.as_ref()).await?;
        let rx = cell.watch_head(None);
        Ok(HeadWatch { cell, rx })
    }

    /// Wakes every subscriber in wake group `group` (modulo
    /// [`WAKE_GROUPS`]) of every followed channel, or with `None` every
    /// subscriber: each one's wait ([`Subscription::next`]) returns at once
    /// and, finding nothing new, waits again, so the task that drives it is
    /// polled. A server's stream clock ticks this way: its streams hold no
    /// timer or waker of their own, and look at the clock whenever they are
    /// polled.
    pub fn wake_group(&self, group: Option<usize>) {
        for cell in self.channels.map.read().values() {
            match group {
                Some(g) => {
                    if let Some(tx) = cell.heads[slot(Some(g))].get() {
                        tx.send_modify(|_| {});
                    }
                }
                None => cell.send_head(None),
            }
        }
    }

    /// Periodic work: evicts expired events and forgets idle cells. The server
    /// calls it about every 250 ms.
    ///
    /// # Errors
    /// [`JournalError`] when eviction fails.
    pub async fn tick(&self, now_ms: u64) -> Result<(), JournalError> {
        self.channels.sweep(now_ms);
        self.journal.evict_expired(now_ms).await
    }
}

/// Where a subscription starts on one channel, given the channel's state
/// (design: "Resume rules"). `fork`: for a cursor of another epoch, the
/// point the channel's epoch forked from it ([`Journal::fork_of`]); such a
/// cursor beyond it continues right after it, with an `epoch` gap.
fn resolve(
    channel: &Arc<str>,
    st: ChannelState,
    start: Start,
    fork: Option<u64>,
) -> (u64, Option<Gap>) {
    let gap = |after: Option<(Epoch, u64)>, reason| {
        Some(Gap {
            channel: channel.clone(),
            after,
            next: (st.epoch, st.head),
            reason,
        })
    };
    match start {
        Start::Live => (st.head, None),
        Start::Earliest => (st.floor - 1, None),
        Start::Last(n) => (st.head.saturating_sub(n).max(st.floor - 1), None),
        // Resolved with the journal's answer (`at_time`); without one, the
        // floor delivers everything retained, which includes what was asked.
        Start::Time(_) => (st.floor - 1, None),
        Start::After { epoch, seq } => {
            let after = Some((epoch, seq));
            if epoch != st.epoch {
                let next = fork.map_or(st.head, |fork| fork.min(st.head));
                let gap = Some(Gap {
                    channel: channel.clone(),
                    after,
                    next: (st.epoch, next),
                    reason: GapReason::Epoch,
                });
                (next, gap)
            } else if seq > st.head {
                (st.head, gap(after, GapReason::Ahead))
            } else if seq + 1 < st.floor {
                (st.head, gap(after, GapReason::Evicted))
            } else {
                (seq, None)
            }
        }
        Start::Unknown => (st.head, gap(None, GapReason::Unknown)),
    }
}

/// Where a start at time `t` (Unix ms) begins, given the channel's state as
/// the hub knows it (`st`) and the journal's answer (`seek`, read just
/// after): before the first retained event at or after `t`, and never past
/// the head the hub knows (a journal shared by several nodes may be ahead
/// of this node's hub: the events in between are older than `t` and are
/// delivered too, never skipped). When an event no longer retained may be
/// at or after `t` ([`crate::journal::TimeSeek::evicted_after`]), a gap
/// notice `evicted` names the evicted seqs, from seq 1 to the floor (which
/// of them were at or after `t` is not known once they are gone). An answer
/// of another epoch (the journal changed incarnation in between) starts at
/// the floor, with no notice: everything retained is delivered.
fn at_time(channel: &Arc<str>, st: ChannelState, t: u64, seek: TimeSeek) -> (u64, Option<Gap>) {
    if seek.state.epoch != st.epoch {
        return (st.floor - 1, None);
    }
    let pos = seek.seq.saturating_sub(1).min(st.head);
    if !seek.evicted_after(t) {
        return (pos, None);
    }
    let gap = Gap {
        channel: channel.clone(),
        after: Some((st.epoch, 0)),
        next: (st.epoch, pos),
        reason: GapReason::Evicted,
    };
    (pos, Some(gap))
}
