//! Delivery: one task per node ([`start`]), delivering on one node of a
//! cluster at a time (the holder of the delivery lease, a record of the
//! channel [`store::DELIVERER`] taken and renewed by compare-and-set; a
//! single server always delivers). Nothing is scanned; the task is told:
//!
//! - **appends**: it follows each linked stream's channel through the hub
//!   ([`gapless_core::hub::Hub::watch_head`], as any subscriber does, so
//!   in a cluster another node's commits reach it too); a head that moves
//!   marks the subscriptions linking it;
//! - **subscription changes** (made here or on any node): the journal's
//!   `meta_changed` of the subscription's channel ([`Signal::Meta`]); the
//!   subscription is read again and looked at;
//! - **stream creations**: `meta_changed` of a stream's channel; a stream
//!   that a pattern matches is read and linked before its first message;
//! - **time**: a lease's end and a retry's time are timers of the task
//!   (`tokio::time::sleep_until`), as is the delivery lease's renewal.
//!
//! A look at a subscription expires its lease, links newly matching
//! streams, and, when a linked stream's tail is past its `acked_offset`
//! and no wake is in flight, issues a wake (a webhook request, or wake
//! events appended to the wake stream) with the next generation. Each step
//! is journaled by compare-and-set before it acts, so a wake is sent once
//! even if two nodes looked at once.

use super::model::{self, Kind, Sub, Wake};
use super::rules::Pending;
use super::store::{self, Index, Lease, Roots};
use super::{Cx, Post};
use crate::auth::Grant;
use crate::ops::streams::names;
use gapless_core::hub::HeadWatch;
use gapless_core::journal::{now_ms, JournalError};
use gapless_protocol::NewEvent;
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// How long the delivery lease of a cluster lasts, in milliseconds: the
/// longest pause of deliveries after the node holding it dies.
pub const LEASE_MS: u64 = 10_000;
/// The delivery lease is renewed once it is older than this, in ms.
pub const RENEW_MS: u64 = 3_000;
/// After a failed read of the journal, the next try comes after this, in ms.
pub const RETRY_MS: u64 = 1_000;

/// What the delivery task is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signal {
    /// The metadata of this channel changed (a subscription, an index, the
    /// roots, the lease, or a stream).
    Meta(String),
    /// The head of this linked stream's channel moved.
    Moved(String),
}

/// A followed linked stream: the subscriptions linking it and the task
/// that forwards its head's moves (stopped when dropped).
struct Watched {
    subs: HashSet<String>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a look leaves to do once its change is journaled.
enum Next {
    Nothing,
    /// Send this webhook wake (its record is written).
    Send {
        url: String,
        body: Value,
        generation: u64,
        wake_id: String,
    },
    /// Append these wake events, then record the wake of `generation`.
    PullWake {
        wake_stream: String,
        events: Vec<NewEvent>,
        generation: u64,
    },
}

/// The delivery task's state.
struct Run {
    cx: Cx,
    inbox: mpsc::UnboundedReceiver<Signal>,
    /// The subscriptions, by channel.
    subs: HashMap<String, Arc<Sub>>,
    /// The linked streams followed, by channel.
    links: HashMap<String, Watched>,
    /// Cluster mode: follows of the subscriptions', indexes' and roots'
    /// channels (a node whose notifications were lost is told again of
    /// every followed channel's metadata).
    held: HashMap<String, HeadWatch>,
    /// (when, subscription channel): leases' ends and retries.
    timers: BTreeSet<(u64, String)>,
    due: HashMap<String, u64>,
    dirty: BTreeSet<String>,
    delivering: bool,
    loaded: bool,
    /// While not delivering: when the lease may next be taken (Unix ms).
    other_until: u64,
    /// While delivering: when this node's lease ends.
    lease_until: u64,
    /// The next try after a failure (Unix ms, 0: none).
    retry_at: u64,
}

/// Starts the delivery task, once per [`super::Subscriptions`] (later
/// calls do nothing); outside a tokio runtime, nothing.
pub fn start(cx: &Cx) {
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    let Some(inbox) = cx.subs.inbox.lock().take() else {
        return;
    };
    let run = Run {
        cx: cx.clone(),
        inbox,
        subs: HashMap::new(),
        links: HashMap::new(),
        held: HashMap::new(),
        timers: BTreeSet::new(),
        due: HashMap::new(),
        dirty: BTreeSet::new(),
        delivering: false,
        loaded: false,
        other_until: 0,
        lease_until: 0,
        retry_at: 0,
    };
    tokio::spawn(run.run());
}

impl Run {
    async fn run(mut self) {
        // At once: the subscriptions are read and looked at after a restart
        // before any request or append comes.
        self.tick().await;
        loop {
            let at = self.next_at();
            let sleep = tokio::time::sleep_until(instant_of(at));
            tokio::select! {
                () = self.cx.app.shutdown.cancelled() => break,
                s = self.inbox.recv() => match s {
                    Some(s) => self.on(s).await,
                    None => break,
                },
                () = sleep => {}
            }
            while let Ok(s) = self.inbox.try_recv() {
                self.on(s).await;
            }
            self.tick().await;
        }
        let resign = self.resign();
        let _ = tokio::time::timeout(Duration::from_millis(500), resign).await;
    }

    /// When the task must next wake by itself (Unix ms).
    fn next_at(&self) -> u64 {
        let mut at = u64::MAX;
        if let Some((t, _)) = self.timers.first() {
            at = at.min(*t);
        }
        if self.retry_at > 0 {
            at = at.min(self.retry_at);
        }
        if self.cx.app.config.cluster {
            at = at.min(if self.delivering {
                self.lease_until.saturating_sub(LEASE_MS - RENEW_MS)
            } else {
                self.other_until
            });
        }
        at
    }

    async fn on(&mut self, s: Signal) {
        match s {
            Signal::Moved(ch) => {
                if let Some(w) = self.links.get(&ch) {
                    self.dirty.extend(w.subs.iter().cloned());
                }
            }
            Signal::Meta(ch) if ch == store::DELIVERER => self.other_until = 0,
            Signal::Meta(_) if !self.delivering || !self.loaded => {}
            Signal::Meta(ch) if ch.starts_with(store::SUB_PREFIX) => {
                if self.reload(&ch).await.is_err() {
                    self.retry(&ch);
                }
            }
            Signal::Meta(ch) if ch.starts_with(store::INDEX_PREFIX) => {
                if self.read_index(&ch).await.is_err() {
                    self.loaded = false;
                }
            }
            Signal::Meta(ch) if ch == store::ROOTS => {
                if self.read_roots().await.is_err() {
                    self.loaded = false;
                }
            }
            Signal::Meta(ch) => self.created(&ch).await,
        }
    }

    /// A failed look or read of `ch`: tried again in [`RETRY_MS`].
    fn retry(&mut self, ch: &str) {
        self.set_timer(ch, Some(now_ms() + RETRY_MS));
    }

    async fn tick(&mut self) {
        let now = now_ms();
        if self.retry_at > 0 && self.retry_at <= now {
            self.retry_at = 0;
        }
        if !self.lease(now).await {
            return;
        }
        if !self.loaded {
            if let Err(e) = self.load_all().await {
                tracing::warn!(error = %e, "could not read the Durable Streams subscriptions; retrying");
                self.retry_at = now + RETRY_MS;
                return;
            }
        }
        while let Some((t, ch)) = self.timers.first().cloned() {
            if t > now {
                break;
            }
            self.timers.remove(&(t, ch.clone()));
            self.due.remove(&ch);
            self.dirty.insert(ch);
        }
        for ch in std::mem::take(&mut self.dirty) {
            self.look(&ch).await;
        }
    }

    /// Whether this node delivers now: always on one server; in cluster
    /// mode while it holds the delivery lease, taken when free or ended and
    /// renewed once older than [`RENEW_MS`].
    async fn lease(&mut self, now: u64) -> bool {
        if !self.cx.app.config.cluster {
            if !self.delivering {
                self.begin_delivering();
            }
            return true;
        }
        if self.delivering && now < self.lease_until.saturating_sub(LEASE_MS - RENEW_MS) {
            return true;
        }
        if !self.delivering && now < self.other_until {
            return false;
        }
        let node = self.cx.subs.node.clone();
        let took = store::update::<Lease, _>(&self.cx.app, store::DELIVERER, |cur| match cur {
            Some(l) if l.node != node && l.until > now => None,
            _ => Some(Some(Lease {
                node: node.clone(),
                until: now + LEASE_MS,
            })),
        })
        .await;
        match took {
            Ok(Some(l)) if l.node == node => {
                if !self.delivering {
                    tracing::info!(node = %node, "delivering Durable Streams subscriptions");
                    self.begin_delivering();
                }
                self.lease_until = l.until;
                true
            }
            Ok(other) => {
                self.stop_delivering();
                self.other_until = other.map_or(now + RETRY_MS, |l| l.until.max(now + 1));
                false
            }
            // Still ours for a while if it was.
            Err(_) if self.delivering && now + 2_000 < self.lease_until => true,
            Err(e) => {
                tracing::debug!(error = %e, "could not read the delivery lease");
                self.stop_delivering();
                self.other_until = now + RETRY_MS;
                false
            }
        }
    }

    fn begin_delivering(&mut self) {
        self.delivering = true;
        self.loaded = false;
        self.cx.subs.delivering.store(true, Ordering::Release);
    }

    fn stop_delivering(&mut self) {
        if self.delivering {
            tracing::info!(node = %self.cx.subs.node, "no longer delivering Durable Streams subscriptions");
        }
        self.delivering = false;
        self.loaded = false;
        self.cx.subs.delivering.store(false, Ordering::Release);
        self.subs.clear();
        self.links.clear();
        self.held.clear();
        self.timers.clear();
        self.due.clear();
        self.dirty.clear();
    }

    /// Ends this node's delivery lease at shutdown (best effort), so another
    /// node takes over at once instead of after [`LEASE_MS`].
    async fn resign(&self) {
        if !self.cx.app.config.cluster || !self.delivering {
            return;
        }
        let node = self.cx.subs.node.clone();
        let _ = store::update::<Lease, _>(&self.cx.app, store::DELIVERER, |cur| match cur {
            Some(l) if l.node == node => Some(Some(Lease {
                node: node.clone(),
                until: 0,
            })),
            _ => None,
        })
        .await;
    }

    /// Reads every subscription the indexes list (this node starts
    /// delivering: at the start, or taking over in a cluster).
    async fn load_all(&mut self) -> Result<(), JournalError> {
        self.cx.ready().await?;
        self.hold(store::ROOTS).await;
        self.read_roots().await?;
        self.loaded = true;
        Ok(())
    }

    async fn read_roots(&mut self) -> Result<(), JournalError> {
        let roots = store::read::<Roots>(&self.cx.app, store::ROOTS).await?;
        for root in roots.value.unwrap_or_default().roots {
            self.read_index(&store::index_channel(&root)).await?;
        }
        Ok(())
    }

    /// Reads one root's index and every subscription it lists not known here.
    async fn read_index(&mut self, channel: &str) -> Result<(), JournalError> {
        self.hold(channel).await;
        let Some(index) = store::read::<Index>(&self.cx.app, channel).await?.value else {
            return Ok(());
        };
        for id in &index.ids {
            let ch = store::sub_channel(&index.root, id);
            if !self.subs.contains_key(&ch) {
                self.reload(&ch).await?;
            }
        }
        Ok(())
    }

    /// In a cluster, follows `channel` (its metadata notices are repeated
    /// after lost notifications), once; a single server loses none.
    async fn hold(&mut self, channel: &str) {
        if !self.cx.app.config.cluster || self.held.contains_key(channel) {
            return;
        }
        if let Ok(w) = self.cx.app.hub.watch_head(channel).await {
            self.held.insert(channel.to_owned(), w);
        }
    }

    /// Reads the subscription of `ch` from the journal and follows its links.
    async fn reload(&mut self, ch: &str) -> Result<(), JournalError> {
        let held = self.cx.subs.store.load(&self.cx.app, ch, true).await?;
        match held.value {
            Some(s) => {
                self.hold(ch).await;
                self.follow_links(ch, &s).await;
                self.cx.subs.saw_one();
                self.subs.insert(ch.to_owned(), s);
                self.dirty.insert(ch.to_owned());
            }
            None => self.drop_sub(ch),
        }
        Ok(())
    }

    fn drop_sub(&mut self, ch: &str) {
        self.subs.remove(ch);
        self.held.remove(ch);
        self.set_timer(ch, None);
        self.links.retain(|_, w| {
            w.subs.remove(ch);
            !w.subs.is_empty()
        });
    }

    /// Follows the channels of `s`'s links (and stops following those it
    /// no longer links). A watch starts before the look that follows
    /// reads the tails, so no append falls between the two.
    async fn follow_links(&mut self, ch: &str, s: &Sub) {
        let wanted: HashSet<String> = s
            .links
            .keys()
            .filter_map(|p| names::channel_of(&s.full(p)).ok())
            .collect();
        self.links.retain(|stream, w| {
            if !wanted.contains(stream) {
                w.subs.remove(ch);
            }
            !w.subs.is_empty()
        });
        for stream in wanted {
            if let Some(w) = self.links.get_mut(&stream) {
                w.subs.insert(ch.to_owned());
                continue;
            }
            let Ok(mut watch) = self.cx.app.hub.watch_head(&stream).await else {
                self.retry(ch);
                continue;
            };
            let tx = self.cx.subs.signals.clone();
            let name = stream.clone();
            let task = tokio::spawn(async move {
                let mut last = watch.head();
                loop {
                    let head = watch.changed().await;
                    if head != last {
                        last = head;
                        if tx.send(Signal::Moved(name.clone())).is_err() {
                            return;
                        }
                    }
                }
            });
            let subs = HashSet::from([ch.to_owned()]);
            self.links.insert(stream, Watched { subs, task });
        }
    }

    /// A stream's metadata changed (perhaps it was just created): the
    /// subscriptions whose pattern matches it and that do not link it yet
    /// are looked at (the look links it before its first message).
    async fn created(&mut self, channel: &str) {
        if self.links.contains_key(channel) {
            return;
        }
        let matching: Vec<String> = self
            .subs
            .iter()
            .filter(|(_, s)| {
                let Some(pattern) = &s.config.pattern else {
                    return false;
                };
                let prefix = model::root_prefix(&s.root);
                channel.strip_prefix(prefix.as_str()).is_some_and(|rest| {
                    let rel = names::path_of(rest);
                    model::glob(pattern, &rel) && s.config.wake_stream.as_deref() != Some(&rel)
                })
            })
            .map(|(ch, _)| ch.clone())
            .collect();
        if matching.is_empty() {
            return;
        }
        // Read now, so the look finds it among the streams this node knows.
        let _ = self.cx.streams.load(&self.cx.app.hub, channel).await;
        self.dirty.extend(matching);
    }

    fn set_timer(&mut self, ch: &str, at: Option<u64>) {
        if let Some(old) = self.due.remove(ch) {
            self.timers.remove(&(old, ch.to_owned()));
        }
        if let Some(at) = at {
            self.due.insert(ch.to_owned(), at);
            self.timers.insert((at, ch.to_owned()));
        }
    }

    /// Looks at one subscription and does what the look leaves to do.
    async fn look(&mut self, ch: &str) {
        let now = now_ms();
        let (next, after) = match look(&self.cx, ch, now).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(channel = ch, error = %e, "a subscription's look failed");
                self.retry(ch);
                return;
            }
        };
        let Some(sub) = after else {
            self.drop_sub(ch);
            return;
        };
        if self.subs.get(ch).is_none_or(|s| s.links != sub.links) {
            self.follow_links(ch, &sub).await;
        }
        self.set_timer(ch, sub.deadline(now));
        self.subs.insert(ch.to_owned(), sub);
        match next {
            Next::Nothing => {}
            Next::Send {
                url,
                body,
                generation,
                wake_id,
            } => {
                let (cx, ch) = (self.cx.clone(), ch.to_owned());
                tokio::spawn(async move {
                    send(&cx, &ch, &url, body, generation, &wake_id).await;
                });
            }
            Next::PullWake {
                wake_stream,
                events,
                generation,
            } => pull_wake(&self.cx, ch, &wake_stream, events, generation).await,
        }
    }
}

/// The instant of Unix ms `at` (far ahead for `u64::MAX`).
fn instant_of(at: u64) -> tokio::time::Instant {
    let now = now_ms();
    let wait = Duration::from_millis(at.saturating_sub(now).min(3_600_000));
    tokio::time::Instant::now() + wait
}

/// The change of a look, journaled; what is left to do after it, and the
/// subscription after it (`None`: it is gone).
async fn look(cx: &Cx, ch: &str, now: u64) -> Result<(Next, Option<Arc<Sub>>), JournalError> {
    let mut tx = cx.subs.store.begin(&cx.app, ch.to_owned(), false).await?;
    loop {
        let Some(cur) = tx.current() else {
            return Ok((Next::Nothing, None));
        };
        let changed = maintain(cx, &cur, now);
        let s: &Sub = changed.as_ref().unwrap_or(&cur);
        let snap = if s.wake.is_none() && now >= s.next_attempt_at {
            cx.snapshot(s).await
        } else {
            Vec::new()
        };
        let (new, next) = if snap.iter().any(|p| p.pending) {
            wake(s, changed.clone(), &snap, now)
        } else {
            (changed, Next::Nothing)
        };
        let Some(new) = new else {
            return Ok((next, Some(cur)));
        };
        if tx.write(Some(new)).await? {
            return Ok((next, tx.current()));
        }
    }
}

/// New glob links and an ended lease: the subscription changed, if it did.
fn maintain(cx: &Cx, cur: &Sub, now: u64) -> Option<Sub> {
    let mut changed: Option<Sub> = None;
    if let Some(pattern) = &cur.config.pattern {
        let found: Vec<String> = cx
            .matching(&cur.root, pattern, cur.config.wake_stream.as_deref())
            .into_iter()
            .filter(|rel| !cur.links.get(rel).is_some_and(|l| l.glob))
            .collect();
        if !found.is_empty() {
            let s = changed.get_or_insert_with(|| cur.clone());
            for rel in found {
                // Discovered by its creation: linked before its first
                // message (acked: none).
                s.links.entry(rel).or_default().glob = true;
            }
        }
    }
    if cur
        .wake
        .as_ref()
        .is_some_and(|w| w.lease_until.is_some_and(|t| t <= now))
    {
        changed.get_or_insert_with(|| cur.clone()).wake = None;
    }
    changed
}

/// The wake of `s` (the look's `changed` copy, or the current one) with
/// pending work `snap`: the subscription to journal (`None`: unchanged)
/// and what to do after.
fn wake(s: &Sub, changed: Option<Sub>, snap: &[Pending], now: u64) -> (Option<Sub>, Next) {
    let generation = s.generation + 1;
    match (s.config.kind, s.config.webhook_url.clone()) {
        (Kind::Webhook, Some(url)) => {
            let mut s = s.clone();
            let tok = model::token();
            let id = model::wake_id();
            s.generation = generation;
            s.wake = Some(Wake {
                id: id.clone(),
                token_hash: Some(model::token_hash(&tok)),
                holder: None,
                lease_until: Some(now + s.config.lease_ttl_ms),
                snapshot: snap
                    .iter()
                    .map(|p| (p.path.clone(), p.tail.clone()))
                    .collect(),
            });
            let body = json!({
                "subscription_id": s.id,
                "wake_id": id,
                "generation": generation,
                "streams": snap.iter().map(Pending::json).collect::<Vec<_>>(),
                "callback_url": format!("{}/__ds/subscriptions/{}/callback", s.base_url, s.id),
                "callback_token": tok,
            });
            // Recorded before it is sent: the node whose record is stored
            // sends it, once.
            let next = Next::Send {
                url,
                body,
                generation,
                wake_id: id,
            };
            (Some(s), next)
        }
        (Kind::Webhook, None) => (None, Next::Nothing),
        (Kind::PullWake, _) => {
            let events = snap
                .iter()
                .filter(|p| p.pending)
                .map(|p| NewEvent {
                    event_type: None,
                    data: gapless_protocol::Payload::Text(
                        json!({
                            "type": "wake",
                            "subscription_id": s.id,
                            "stream": p.path,
                            "generation": generation,
                            "ts": now,
                        })
                        .to_string(),
                    ),
                })
                .collect();
            let next = Next::PullWake {
                wake_stream: s.config.wake_stream.clone().unwrap_or_default(),
                events,
                generation,
            };
            // The wake events go before the wake's record: a crash between
            // them leaves a wake event the next wake repeats, never a
            // recorded wake no worker heard of. The look's own changes
            // (links, an ended lease) are journaled first.
            (changed, next)
        }
    }
}

/// Writes a pull-wake subscription's wake events, then records the wake of
/// `generation` (or the failure and its retry time), unless the
/// subscription moved on meanwhile.
async fn pull_wake(cx: &Cx, ch: &str, wake_stream: &str, events: Vec<NewEvent>, generation: u64) {
    let sub = cx.subs.store.load(&cx.app, ch, false).await;
    let Ok(Some(sub)) = sub.map(|h| h.value) else {
        return;
    };
    let written = append_wake(cx, &sub.root, wake_stream, events).await;
    if let Err(m) = &written {
        tracing::warn!(subscription = %sub.id, "pull-wake: writing to the wake stream failed: {m}");
    }
    let recorded = async {
        let mut tx = cx.subs.store.begin(&cx.app, ch.to_owned(), false).await?;
        loop {
            let Some(cur) = tx.current() else {
                return Ok(());
            };
            if cur.generation + 1 != generation || cur.wake.is_some() {
                return Ok(());
            }
            let mut s = (*cur).clone();
            match &written {
                Ok(()) => {
                    s.failures = 0;
                    s.generation = generation;
                    s.wake = Some(Wake {
                        id: model::wake_id(),
                        token_hash: None,
                        holder: None,
                        lease_until: None,
                        snapshot: Vec::new(),
                    });
                }
                Err(_) => {
                    s.failures = s.failures.saturating_add(1);
                    s.next_attempt_at =
                        now_ms() + super::signing::backoff(s.failures).as_millis() as u64;
                }
            }
            if tx.write(Some(s)).await? {
                return Ok(());
            }
        }
    };
    let recorded: Result<(), JournalError> = recorded.await;
    if let Err(e) = recorded {
        tracing::warn!(subscription = %sub.id, error = %e, "pull-wake: could not record the wake");
    }
}

/// Appends wake events to the wake stream (JSON messages), under its lock,
/// unless it is gone or closed.
async fn append_wake(
    cx: &Cx,
    root: &str,
    wake_stream: &str,
    events: Vec<NewEvent>,
) -> Result<(), String> {
    let channel = names::channel_of(&model::full(root, wake_stream)).map_err(|e| e.0)?;
    let stream = cx
        .streams
        .load(&cx.app.hub, &channel)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no stream at {wake_stream:?}"))?;
    let m = stream.lock().await;
    if m.deleted || m.soft_deleted || m.closed {
        return Err(format!(
            "the wake stream {wake_stream:?} is closed or deleted"
        ));
    }
    crate::ops::publish::batch(&cx.app, &Grant::all(), None, &channel, events, None)
        .await
        .map(|_| ())
        .map_err(|e| format!("{e:?}"))
}

/// Delivers one webhook wake and records its answer, if the wake is still
/// the current one.
async fn send(cx: &Cx, ch: &str, url: &str, body: Value, generation: u64, wake: &str) {
    let res = post(cx, url, body).await;
    let recorded = async {
        let mut tx = cx.subs.store.begin(&cx.app, ch.to_owned(), false).await?;
        loop {
            let Some(cur) = tx.current() else {
                return Ok((String::new(), 0));
            };
            if cur.generation != generation || cur.wake.as_ref().is_none_or(|w| w.id != wake) {
                return Ok((cur.id.clone(), 0));
            }
            let mut s = (*cur).clone();
            match &res {
                Ok(d) if d.done => {
                    s.failures = 0;
                    let snap = s.wake.take().map(|w| w.snapshot).unwrap_or_default();
                    for (path, tail) in snap {
                        s.ack(&path, tail);
                    }
                }
                // Processing asynchronously: the receiver calls back.
                Ok(_) if cur.failures == 0 => return Ok((cur.id.clone(), 0)),
                Ok(_) => s.failures = 0,
                Err(_) => {
                    s.failures = s.failures.saturating_add(1);
                    s.wake = None;
                    s.next_attempt_at =
                        now_ms() + super::signing::backoff(s.failures).as_millis() as u64;
                }
            }
            let attempt = (s.id.clone(), s.failures);
            if tx.write(Some(s)).await? {
                return Ok(attempt);
            }
        }
    };
    let recorded: Result<(String, u32), JournalError> = recorded.await;
    if let Err(m) = &res {
        let (id, attempt) = recorded.as_ref().cloned().unwrap_or_default();
        tracing::warn!(subscription = %id, attempt, "webhook delivery failed: {m}");
    }
    if let Err(e) = recorded {
        tracing::warn!(error = %e, "could not record a webhook delivery's answer");
    }
}

/// Signs and sends one webhook body through the room's [`super::Poster`].
async fn post(cx: &Cx, url: &str, body: Value) -> Result<super::Delivered, String> {
    let bytes = body.to_string().into_bytes();
    let t = now_ms() / 1000;
    let cfg = &cx.app.config;
    let signer = cx.subs.signer(&cx.app).await;
    match (url::Url::parse(url), signer) {
        (_, Err(e)) => Err(format!("no signing key: {e}")),
        (Err(e), Ok(_)) => Err(e.to_string()),
        (Ok(u), Ok(signer)) => {
            let signature = signer.signature(t, &bytes);
            (cx.subs.poster)(Post {
                url: u,
                body: bytes,
                signature,
                timeout: Duration::from_millis(cfg.ds_webhook_timeout_ms),
                allow_loopback: cfg.ds_webhook_allow_loopback,
            })
            .await
        }
    }
}
