//! Fan-out between nodes: the notification listener (which also carries
//! `kick <holder>` messages of session takeovers and the ephemeral events of
//! other nodes, `ephemeral.rs`), and the per-channel
//! tracker that feeds this node's hub every commit in seq order, whoever
//! made it.
//!
//! For each channel its hub follows, a node keeps a [`Track`]: the epoch and
//! head it has reported to the hub. Every report (its own commit, a
//! notification from the bus, a periodic re-read of the head) takes the
//! channel's track lock, so reports are serialized per channel, and:
//!
//! - a report at or below the known head is dropped (already delivered),
//!   unless its events were committed later than the event at the known
//!   head: times never go back within a channel, so that is an event of
//!   another history under the same epoch (Redis came back with an older
//!   copy of the channel), and it is read from Redis as a hole (below);
//! - a local commit that starts right after the known head is reported as is
//!   (no read); so is the first commit of a track that knows nothing yet,
//!   which the append holds from before its script runs (so that no
//!   concurrent append of this node can commit below it and be left
//!   unreported, `Inner::hold_untracked`);
//! - a notification that carries its events (inline, `notification.rs`) and
//!   starts right after the known head, in the known epoch, is reported as is
//!   (no read): the common case of live fan-out from another node, handled in
//!   the listener itself when the track is free;
//! - anything else (a hole: a lost, late or reordered notification, a new
//!   epoch, a notification by reference) is *filled*: the events after the
//!   known head are read from Redis in pages and reported in order. A hole
//!   longer than [`FILL_MAX`] events reports only the newest `FILL_MAX`; the
//!   hub then sees a discontinuity, and subscribers further behind read the
//!   journal themselves.
//!
//! Every script this tracker runs (the append, the reads of a fill, the
//! head re-read) carries what the track knows (`Track::arg`): the script
//! forks the channel into a new epoch when Redis is behind it (a head below
//! the known head, or another event at it), so that nothing is ever
//! delivered under a seq that this node delivered with other content. A
//! fill after a fork starts at the fork point (`Inner::fork_of`), so that
//! subscribers get an `epoch` gap and then every event appended since.

use crate::conn::{jitter, MAX_BACKOFF, MIN_BACKOFF};
use crate::ephemeral;
use crate::notification::{self, Notification};
use crate::{Inner, BUS_CHANNEL};
use futures::StreamExt;
use gapless_core::journal::ChannelState;
use gapless_core::JournalError;
use gapless_protocol::{Epoch, Event};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Most events read to fill one hole (about a default window).
pub(crate) const FILL_MAX: u64 = 1024;
/// Events per read while filling.
const FILL_PAGE: usize = 256;
/// Event data per read while filling, about.
const FILL_BYTES: usize = 1 << 20;
/// Channels re-read at once by a resync.
const RESYNC_CONCURRENCY: usize = 32;

/// How this node handled the commit notifications it received, counted in
/// `gapless_cluster_notifications_total{outcome}` (handles looked up once):
/// `inline` (reported from the notification itself), `read` (a hole, a new
/// epoch or a notification by reference: read from Redis), `known` (already
/// reported: its own commit, or filled before) and `ignored` (a channel this
/// node does not follow).
pub(crate) struct Outcomes {
    inline: metrics::Counter,
    read: metrics::Counter,
    known: metrics::Counter,
    ignored: metrics::Counter,
}

impl Outcomes {
    pub(crate) fn new() -> Self {
        let c = |o: &'static str| metrics::counter!(NOTIFICATIONS, "outcome" => o);
        Outcomes {
            inline: c("inline"),
            read: c("read"),
            known: c("known"),
            ignored: c("ignored"),
        }
    }
}

/// The metric [`Outcomes`] counts in.
const NOTIFICATIONS: &str = "gapless_cluster_notifications_total";

/// What this node has reported to its hub for one channel.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Track {
    /// `(epoch, head, floor)` reported last; `None` before the first report.
    known: Option<(Epoch, u64, u64)>,
    /// The commit time (Unix ms) of the event at the known head, when this
    /// node reported that event itself.
    time: Option<u64>,
}

impl Track {
    /// What the scripts take as `known` (`scripts.rs`, `load`):
    /// `<epoch>:<head>:<time or empty>`, or `""` before the first report.
    fn arg(&self) -> String {
        match (self.known, self.time) {
            (Some((e, head, _)), Some(t)) => format!("{}:{head}:{t}", e.0),
            (Some((e, head, _)), None) => format!("{}:{head}:", e.0),
            (None, _) => String::new(),
        }
    }

    /// Whether an event at or below the known head, in the known epoch,
    /// committed at `time` cannot be one this node reported: it is newer
    /// than the event at the known head (or that time is unknown, so it
    /// cannot be told: a read, which carries [`Track::arg`], settles it).
    fn impossible(&self, time: u64) -> bool {
        self.time.is_none_or(|t| time > t)
    }
}

/// The tracks of the followed channels.
#[derive(Default)]
pub(crate) struct Trackers {
    map: Mutex<HashMap<Arc<str>, Arc<tokio::sync::Mutex<Track>>>>,
}

impl Trackers {
    fn get(&self, channel: &str) -> Arc<tokio::sync::Mutex<Track>> {
        let mut map = self.map.lock();
        if let Some(t) = map.get(channel) {
            return t.clone();
        }
        map.entry(Arc::from(channel)).or_default().clone()
    }

    fn remove(&self, channel: &str) {
        self.map.lock().remove(channel);
    }

    fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.map.lock().retain(|k, _| keep(k));
    }

    /// [`Track::arg`] of `channel`'s track; `""` when it has none, or when it
    /// is busy (a fill): the report that follows the script checks again.
    fn arg(&self, channel: &str) -> String {
        let track = self.map.lock().get(channel).cloned();
        track
            .and_then(|t| t.try_lock().ok().map(|t| t.arg()))
            .unwrap_or_default()
    }
}

/// A channel's track, held by an append from before its script runs until
/// its commit is reported ([`Inner::hold_untracked`]).
pub(crate) type HeldTrack = tokio::sync::OwnedMutexGuard<Track>;

impl Inner {
    /// What this node delivered of `channel`, for a script (`Track::arg`).
    pub(crate) fn known_arg(&self, channel: &str) -> String {
        self.trackers.arg(channel)
    }

    /// Called by an append before its script runs: when the hub follows
    /// `channel` but its track has reported nothing yet, the track, to hold
    /// through the script and the report ([`Inner::deliver_local`]).
    ///
    /// Why: an append reported with nothing known before it is reported as
    /// it is, and becomes what the track knows. A concurrent append of this
    /// node whose seqs are lower, and that reports after it, finds its events
    /// at or below the known head and reports nothing: the sink would never
    /// see them, and the append would return before the sink saw its events
    /// (the [`gapless_core::Journal::append`] contract). Holding the track
    /// makes the other appends of this node wait for the first report before
    /// sending their scripts; from then on a commit that does not continue
    /// the known head fills the hole below it from Redis, which reports the
    /// concurrent appends' events in order, before they return. The wait
    /// happens once per channel this node starts following.
    pub(crate) async fn hold_untracked(&self, channel: &str) -> Option<HeldTrack> {
        if !self.sink.follows(channel) {
            return None;
        }
        let held = self.trackers.get(channel).lock_owned().await;
        held.known.is_none().then_some(held)
    }

    /// Reports this node's own commit (see the module doc); `held`: its track,
    /// when the append held it through its script ([`Inner::hold_untracked`]).
    /// Never fails: when a fill cannot be read, the events are reported as
    /// they are, and the hub's subscribers read any hole from the journal.
    pub(crate) async fn deliver_local(
        &self,
        channel: &str,
        state: ChannelState,
        events: Vec<Arc<Event>>,
        held: Option<HeldTrack>,
    ) {
        if !self.sink.follows(channel) {
            self.trackers.remove(channel);
            self.sink.committed(channel, state, &events);
            return;
        }
        let first = events.first().map_or(state.head, |e| e.seq);
        let mut t = match held {
            Some(t) => t,
            None => self.trackers.get(channel).lock_owned().await,
        };
        match t.known {
            Some((epoch, head, _))
                if epoch == state.epoch
                    && first <= head
                    && !events.first().is_some_and(|e| t.impossible(e.time))
                    && state.head <= head => {}
            Some((epoch, head, _)) if epoch == state.epoch && first == head + 1 => {
                self.report(&mut t, channel, state, &events);
            }
            None => self.report(&mut t, channel, state, &events),
            // A hole, a new epoch, or a commit at or below the known head that
            // is not one reported before: the fill's reads carry the track,
            // so Redis forks the channel if it lost what this node delivered.
            Some(_) => {
                if let Err(e) = self.fill(&mut t, channel, state, first - 1).await {
                    tracing::warn!(channel, error = %e, "could not read a hole before a commit; reporting the commit alone");
                    self.report(&mut t, channel, state, &events);
                }
            }
        }
    }

    /// Reports a purge made through this node (`Journal::purge`): the
    /// channel's new, empty epoch. The bus notification of the purge then
    /// finds it delivered.
    pub(crate) async fn deliver_purge(&self, channel: &str, state: ChannelState) {
        if !self.sink.follows(channel) {
            self.trackers.remove(channel);
            self.sink.evicted(channel, state);
            return;
        }
        let track = self.trackers.get(channel);
        let mut t = track.lock().await;
        if !matches!(t.known, Some((e, _, _)) if e == state.epoch) {
            t.known = Some((state.epoch, state.head, state.floor));
            t.time = None;
        }
        self.sink.evicted(channel, state);
    }

    /// Handles a notification from the bus (format: `notification.rs`) at
    /// once, in the listener, when that needs no wait: a channel this node
    /// does not follow, a notification already delivered, or one that carries
    /// exactly the events after the known head (reported without a read).
    /// Anything else (a hole, a new epoch, a notification by reference, a
    /// track busy with a fill) goes to [`Inner::on_notification`] in a task of
    /// its own, so the listener never waits for Redis.
    pub(crate) fn dispatch(self: &Arc<Self>, msg: &[u8]) {
        let Some(n) = notification::parse(msg) else {
            tracing::warn!(message = %String::from_utf8_lossy(msg), "malformed notification on the bus; ignored");
            return;
        };
        let Some(track) = self.track_of(n.channel) else {
            return;
        };
        if let Ok(mut t) = track.try_lock() {
            if self.settle_known(&mut t, &n) {
                return;
            }
        }
        let payload = msg.to_vec();
        let worker = self.clone();
        tokio::spawn(async move { worker.on_notification(&payload).await });
    }

    /// The slow path of [`Inner::dispatch`]: waits for the channel's track,
    /// then reports the carried events if they continue what it knows, or
    /// fills from Redis everything up to the notified head.
    async fn on_notification(&self, msg: &[u8]) {
        let Some(n) = notification::parse(msg) else {
            return;
        };
        let Some(track) = self.track_of(n.channel) else {
            return;
        };
        let mut t = track.lock().await;
        if self.settle_known(&mut t, &n) {
            return;
        }
        self.outcomes.read.increment(1);
        let target = ChannelState {
            epoch: n.epoch,
            floor: n.first,
            head: n.last,
        };
        if let Err(e) = self
            .fill(&mut t, n.channel, target, n.first.saturating_sub(1))
            .await
        {
            tracing::warn!(channel = n.channel, error = %e, "could not read notified events; the next notification or re-read catches up");
        }
    }

    /// An ephemeral event another node took (`ephemeral.rs`): to this node's
    /// subscribers of the channel, if it has any.
    fn on_ephemeral(&self, rest: &[u8]) {
        match ephemeral::parse(rest) {
            Some(e) if e.node == self.node => {}
            Some(e) => {
                if self.sink.follows(e.channel) {
                    self.sink
                        .ephemeral(e.channel, e.event_type.map(str::to_owned), e.payload());
                }
            }
            None => tracing::warn!("malformed ephemeral event on the bus; ignored"),
        }
    }

    /// The track of a notified channel this node follows; `None` (the
    /// notification counted as ignored, any old track dropped) when it does
    /// not follow it.
    fn track_of(&self, channel: &str) -> Option<Arc<tokio::sync::Mutex<Track>>> {
        if self.sink.follows(channel) {
            Some(self.trackers.get(channel))
        } else {
            self.trackers.remove(channel);
            self.outcomes.ignored.increment(1);
            None
        }
    }

    /// Settles `n` from what the track knows, without Redis: already
    /// delivered (counted `known`), or carrying exactly the events after the
    /// known head (reported, counted `inline`). Whether it was settled; if
    /// not, the caller reads from Redis (which forks the channel when the
    /// notification shows that Redis lost events this node delivered).
    fn settle_known(&self, t: &mut Track, n: &Notification<'_>) -> bool {
        if delivered(t, n) {
            self.outcomes.known.increment(1);
            return true;
        }
        if let Some((state, events)) = continuation(t, n) {
            self.report(t, n.channel, state, &events);
            self.outcomes.inline.increment(1);
            return true;
        }
        false
    }

    /// Re-reads the state of every followed channel and fills what this node
    /// missed (after a loss of the bus connection, and every `poll_ms`).
    pub(crate) async fn resync(&self) {
        let followed = self.sink.followed();
        self.trackers.retain(|c| self.sink.follows(c));
        // Once Redis is found unreachable, the rest waits for the next round
        // (each attempt would wait the whole timeout).
        let unreachable = AtomicBool::new(false);
        let unreachable = &unreachable;
        futures::stream::iter(followed)
            .for_each_concurrent(RESYNC_CONCURRENCY, |channel| async move {
                if unreachable.load(Ordering::Relaxed) {
                    return;
                }
                let known = self.trackers.get(&channel).lock().await.arg();
                let state = match self.state(&channel, &known).await {
                    Ok(s) => s,
                    Err(e) => {
                        if matches!(e, JournalError::Unavailable(_)) {
                            unreachable.store(true, Ordering::Relaxed);
                        }
                        tracing::debug!(channel = %channel, error = %e, "head re-read failed");
                        return;
                    }
                };
                let track = self.trackers.get(&channel);
                let mut t = track.lock().await;
                match t.known {
                    Some((epoch, head, floor)) if epoch == state.epoch && state.head <= head => {
                        if state.floor > floor {
                            t.known = Some((epoch, head, state.floor));
                            self.sink.evicted(&channel, state);
                        }
                    }
                    _ => {
                        if let Err(e) = self
                            .fill(&mut t, &channel, state, state.head.saturating_sub(1))
                            .await
                        {
                            tracing::debug!(channel = %channel, error = %e, "head re-read fill failed");
                        }
                    }
                }
            })
            .await;
    }

    fn report(&self, t: &mut Track, channel: &str, state: ChannelState, events: &[Arc<Event>]) {
        self.sink.committed(channel, state, events);
        match t.known {
            Some((e, h, _)) if e == state.epoch && h >= state.head => {
                t.known = Some((e, h, state.floor));
            }
            _ => {
                t.known = Some((state.epoch, state.head, state.floor));
                t.time = events
                    .last()
                    .filter(|e| e.seq == state.head)
                    .map(|e| e.time);
            }
        }
    }

    /// Where a fill toward `epoch` starts when the track knows another
    /// epoch: right after the fork point when `epoch` forked from it (every
    /// event after it is new to this node), else `hint`.
    fn fill_start(&self, t: &Track, channel: &str, epoch: Epoch, hint: u64) -> u64 {
        match t.known {
            Some((e, _, _)) => self.fork_of(channel, e, epoch).unwrap_or(hint),
            None => hint,
        }
    }

    /// Reads and reports, in order, the events after what `t` knows, up to
    /// at least `target.head`. `hint` is where to start when `t` knows
    /// nothing of `target.epoch` (the seq before the notified events).
    async fn fill(
        &self,
        t: &mut Track,
        channel: &str,
        target: ChannelState,
        hint: u64,
    ) -> Result<(), JournalError> {
        let mut epoch = target.epoch;
        let mut after = match t.known {
            Some((e, head, _)) if e == epoch => head,
            _ => self.fill_start(t, channel, epoch, hint),
        };
        after = after.max(target.head.saturating_sub(FILL_MAX));
        let mut restarts = 0;
        loop {
            let (page, time) = self
                .read(channel, after, FILL_PAGE, FILL_BYTES, &t.arg())
                .await?;
            if page.state.epoch != epoch {
                // The channel changed incarnation again since the notice.
                restarts += 1;
                if restarts > 3 {
                    return Err(JournalError::Storage(format!(
                        "channel {channel} changed epoch repeatedly while being read"
                    )));
                }
                epoch = page.state.epoch;
                let start = self.fill_start(t, channel, epoch, 0);
                after = page
                    .state
                    .head
                    .saturating_sub(FILL_MAX)
                    .max(page.state.floor.saturating_sub(1))
                    .max(start);
                continue;
            }
            let reported = page.events.last().map_or(page.state.head, |e| e.seq);
            let state = ChannelState {
                head: reported,
                ..page.state
            };
            self.report(t, channel, state, &page.events);
            // the hash's `time` is the commit time of the event at its head
            let at_head =
                matches!(t.known, Some((e, h, _)) if e == page.state.epoch && h == page.state.head);
            if at_head && t.time.is_none() {
                t.time = Some(time);
            }
            if page.events.is_empty() || reported >= page.state.head {
                return Ok(());
            }
            after = reported;
        }
    }
}

/// Whether everything `n` announces was reported already (same epoch, at or
/// below the known head: our own commit, or a notification filled before),
/// and, when it carries its events, they are not newer than the event at the
/// known head (else Redis lost what this node delivered, and reused the seqs).
fn delivered(t: &Track, n: &Notification<'_>) -> bool {
    matches!(t.known, Some((e, head, _)) if e == n.epoch && head >= n.last)
        && !first_time(n).is_some_and(|time| t.impossible(time))
}

/// The commit time of the first event an inline notification carries.
fn first_time(n: &Notification<'_>) -> Option<u64> {
    let v = n.inline.as_ref()?.values.first()?;
    let colon = v.iter().position(|&b| b == b':')?;
    std::str::from_utf8(&v[..colon]).ok()?.parse().ok()
}

/// The events `n` carries and the state to report with them, when they are
/// exactly the ones after the known head in the known epoch; `None` (read
/// from Redis instead) for a notification by reference, a hole, an overlap,
/// a new epoch, a track that knows nothing yet, or values that do not decode.
/// So what is delivered never depends on the bus being complete or in order.
fn continuation(t: &Track, n: &Notification<'_>) -> Option<(ChannelState, Vec<Arc<Event>>)> {
    let (epoch, head, _) = t.known?;
    if epoch != n.epoch || n.first != head + 1 {
        return None;
    }
    let floor = n.inline.as_ref()?.floor;
    let mut events = n.events()?;
    // Count retention may have dropped the first events of a large batch
    // already; a read would start at the floor too.
    events.retain(|e| e.seq >= floor);
    let state = ChannelState {
        epoch,
        floor,
        head: n.last,
    };
    Some((state, events))
}

/// Sleeps until `at`; forever when `None`.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// The notification listener: subscribes to [`BUS_CHANNEL`] on its own
/// connection, handles each notification ([`Inner::dispatch`]: at once, or
/// in a task when it needs a read or a wait), sends a `PING` on it every
/// `keepalive_ms` (none when 0), and on any loss of the connection (closed,
/// or a `PING` unanswered within the timeout) reconnects with backoff and
/// jitter, then re-reads the heads of every followed channel: what was
/// committed meanwhile is filled from Redis, so nothing is lost. Ends when
/// `cancel` fires.
pub(crate) async fn listen(inner: Arc<Inner>, cancel: CancellationToken) {
    let keepalive = (inner.opts.keepalive_ms > 0)
        .then(|| std::time::Duration::from_millis(inner.opts.keepalive_ms));
    let mut backoff = MIN_BACKOFF;
    let mut was_up = false;
    loop {
        let connect = async {
            let client = inner.conn.target().client().await?;
            let mut ps = client.get_async_pubsub().await?;
            ps.subscribe(BUS_CHANNEL).await?;
            Ok::<_, redis::RedisError>(ps)
        };
        let attempt = tokio::select! {
            () = cancel.cancelled() => return,
            r = tokio::time::timeout(inner.conn.timeout(), connect) => r,
        };
        match attempt {
            Ok(Ok(ps)) => {
                backoff = MIN_BACKOFF;
                if was_up {
                    tracing::info!("Redis notifications reconnected; re-reading followed heads");
                    // Metadata notices may have been lost too: nothing
                    // cached is trusted, and the followed channels' holders
                    // read their metadata again.
                    inner.metas.clear();
                    for channel in inner.sink.followed() {
                        inner.sink.meta_changed(&channel);
                    }
                }
                // Whatever was committed while we were not listening; and
                // Redis may have restarted or failed over with other settings.
                let resync = inner.clone();
                tokio::spawn(async move {
                    resync.resync().await;
                    if let Err(e) = resync.read_settings(gapless_core::journal::now_ms()).await {
                        tracing::debug!(error = %e, "could not read the Redis persistence settings");
                    }
                });
                let (mut sink, mut stream) = ps.split();
                // Testing only: a notification held back to be handled after the next.
                let mut held: Option<Vec<u8>> = None;
                let mut next_ping = keepalive.map(|k| tokio::time::Instant::now() + k);
                loop {
                    let msg = tokio::select! {
                        () = cancel.cancelled() => return,
                        m = stream.next() => m,
                        () = sleep_until(next_ping) => {
                            // A proxy may close a connection that carries
                            // nothing for a while (Redis itself never closes
                            // a subscriber for idleness).
                            let pong = tokio::time::timeout(
                                inner.conn.timeout(),
                                sink.ping::<redis::Value>(),
                            )
                            .await;
                            if !matches!(pong, Ok(Ok(_))) {
                                tracing::debug!("the Redis notification connection did not answer a PING");
                                break;
                            }
                            next_ping = keepalive.map(|k| tokio::time::Instant::now() + k);
                            continue;
                        }
                    };
                    let Some(msg) = msg else { break };
                    if let Some(rest) = msg.get_payload_bytes().strip_prefix(ephemeral::PREFIX) {
                        inner.on_ephemeral(rest);
                        continue;
                    }
                    if let Some(rest) = msg
                        .get_payload_bytes()
                        .strip_prefix(crate::presence::PREFIX)
                    {
                        match (crate::presence::parse(rest), inner.presence.read().as_ref()) {
                            (Some((channel, join, member)), Some(notice)) => {
                                notice(channel, join, member)
                            }
                            (None, _) => {
                                tracing::warn!("malformed presence notice on the bus; ignored")
                            }
                            _ => {}
                        }
                        continue;
                    }
                    if let Some(rest) = msg.get_payload_bytes().strip_prefix(crate::meta::PREFIX) {
                        inner.on_meta(rest);
                        continue;
                    }
                    if let Some(holder) = msg.get_payload_bytes().strip_prefix(b"kick ") {
                        if let (Ok(holder), Some(kick)) =
                            (std::str::from_utf8(holder), inner.kick.read().as_ref())
                        {
                            kick(holder);
                        }
                        continue;
                    }
                    let n = inner.notifications.fetch_add(1, Ordering::Relaxed) + 1;
                    let every = inner.opts.drop_notifications_every;
                    if every > 0 && n.is_multiple_of(every) {
                        tracing::debug!(n, "dropping a bus notification (testing)");
                        continue;
                    }
                    let reorder = inner.opts.reorder_notifications_every;
                    if reorder > 0 && n.is_multiple_of(reorder) && held.is_none() {
                        tracing::debug!(n, "holding back a bus notification (testing)");
                        held = Some(msg.get_payload_bytes().to_vec());
                        continue;
                    }
                    inner.dispatch(msg.get_payload_bytes());
                    if let Some(h) = held.take() {
                        inner.dispatch(&h);
                    }
                }
                was_up = true;
                tracing::warn!("lost the Redis notification connection; reconnecting");
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "bus connection failed"),
            Err(_) => tracing::debug!("bus connection timed out"),
        }
        let wait = jitter(backoff);
        backoff = (backoff * 2).min(MAX_BACKOFF);
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}
