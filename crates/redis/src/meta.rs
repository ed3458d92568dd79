//! Channel metadata ([`gapless_core::meta`]) in Redis: kept in the
//! channel's own metadata hash, `gapless:{<channel>}:meta` (the channel's
//! hash tag: the slot of its events; nothing global, no list of streams;
//! fields in `scripts.rs`, `META`), and changed by compare-and-set.
//!
//! [`Inner::change`] holds a per-channel lock of this node ([`Locks`]: a
//! fair async mutex, so changes of one channel submitted in order from one
//! task are decided in that order), then:
//!
//! 1. takes the channel's metadata, its version and its bounds from this
//!    node's cache ([`Cache`]), or reads them (`META`, one round trip);
//! 2. decides the change with [`meta::decide`] (the rules stay in Rust);
//! 3. sends one `CHANGE` script that checks the version (and, for a
//!    creation, which takes the channel's head, the bounds) is the one
//!    decided against and, in the same atomic step, appends the decision's
//!    events (the append script's own code, `append_events`), writes the
//!    new metadata with the version bumped, and publishes
//!    `meta <node> <channel>` on the bus;
//! 4. on a conflict (another node changed the metadata, or Redis lost it)
//!    the script answers the current metadata, version and bounds, and the
//!    node decides again (at most [`MAX_CONFLICTS`] times).
//!
//! So with the cache warm, a producer append is one script call and one
//! write. A decision that writes nothing (a duplicate, a refusal) is never
//! answered from the cache: it is decided again on metadata read from
//! Redis, so a node whose cache is stale (another node's change it has not
//! heard of yet, a Redis that lost its data) never answers from it. Every
//! write is checked by version in Redis, so none lands on a stale decision.
//!
//! The other nodes hear of a change from its bus message: they drop their
//! cached copy and call [`CommitSink::meta_changed`]; the events it
//! appended reach them as any commit does (`bus.rs`).
//!
//! [`CommitSink::meta_changed`]: gapless_core::CommitSink::meta_changed

use crate::{codec, epoch_of, int_of, request_token, scripts, Inner, BUS_CHANNEL};
use gapless_core::journal::{Appended, ChannelState};
use gapless_core::meta::{self, Change, Changed, ChannelMeta, Decision, Outcome};
use gapless_core::JournalError;
use gapless_protocol::NewEvent;
use redis::Value;
use std::collections::HashMap;
use std::sync::Arc;

/// Most conflicts one change goes through before it fails with
/// [`JournalError::Storage`] (each one is another node's change committed
/// in between; one node's own changes of a channel never conflict).
pub(crate) const MAX_CONFLICTS: usize = 32;

/// Most channels whose metadata a node caches; past it an arbitrary entry
/// goes (a miss costs one read).
pub(crate) const CACHE_MAX: usize = 4096;

/// The prefix of a metadata notice on the bus: `meta <node> <channel>`.
pub(crate) const PREFIX: &[u8] = b"meta ";

/// What a node knows of a channel's metadata: as Redis had it at some point.
#[derive(Debug, Clone)]
pub(crate) struct Known {
    /// The metadata hash's `ver` (`""`: no hash).
    ver: String,
    /// The metadata (`None`: the channel has none).
    meta: Option<ChannelMeta>,
    /// The channel's bounds then.
    state: ChannelState,
}

/// The metadata this node last read or wrote, per channel (at most
/// [`CACHE_MAX`] channels). Only a hint: every write is checked by version.
#[derive(Default)]
pub(crate) struct Cache {
    map: parking_lot::Mutex<HashMap<Arc<str>, Known>>,
}

impl Cache {
    fn get(&self, channel: &str) -> Option<Known> {
        self.map.lock().get(channel).cloned()
    }

    fn put(&self, channel: &str, known: Known) {
        let mut map = self.map.lock();
        if map.len() >= CACHE_MAX && !map.contains_key(channel) {
            if let Some(k) = map.keys().next().cloned() {
                map.remove(&k);
            }
        }
        map.insert(Arc::from(channel), known);
    }

    /// Caches `known` unless the channel has an entry (a read racing a
    /// change may be older than what the change wrote).
    fn prime(&self, channel: &str, known: Known) {
        let mut map = self.map.lock();
        if map.len() < CACHE_MAX && !map.contains_key(channel) {
            map.insert(Arc::from(channel), known);
        }
    }

    /// Drops `channel`'s entry (it changed elsewhere, or a write may or may
    /// not have landed).
    pub(crate) fn forget(&self, channel: &str) {
        self.map.lock().remove(channel);
    }

    /// Drops every entry (after the bus lost notifications).
    pub(crate) fn clear(&self) {
        self.map.lock().clear();
    }
}

/// The per-channel locks of [`Inner::change`]: a fair (FIFO) async mutex
/// per channel that someone holds or waits for, with the number of those;
/// the entry goes when it drops to zero, so the map holds only channels
/// being changed now.
#[derive(Default)]
pub(crate) struct Locks {
    map: parking_lot::Mutex<HashMap<Arc<str>, LockEntry>>,
}

/// A channel's lock and how many hold or wait for it.
type LockEntry = (Arc<tokio::sync::Mutex<()>>, usize);

/// One holder (or waiter) of a channel's lock; releases it and drops the
/// map's entry, when it was the last, on drop (also when the wait is
/// cancelled).
pub(crate) struct Held<'a> {
    locks: &'a Locks,
    channel: Arc<str>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Locks {
    /// Waits for `channel`'s lock. Its place in the queue is taken at the
    /// first poll, before anything else is awaited, so futures polled in
    /// order get the lock in that order.
    pub(crate) async fn lock(&self, channel: &str) -> Held<'_> {
        let mutex = {
            let mut map = self.map.lock();
            let entry = map
                .entry(Arc::from(channel))
                .or_insert_with(|| (Arc::default(), 0));
            entry.1 += 1;
            entry.0.clone()
        };
        let mut held = Held {
            locks: self,
            channel: Arc::from(channel),
            guard: None,
        };
        held.guard = Some(mutex.lock_owned().await);
        held
    }

    /// How many channels have an entry (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().len()
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.locks.map.lock();
        if let Some(entry) = map.get_mut(&self.channel) {
            entry.1 -= 1;
            if entry.1 == 0 {
                map.remove(&self.channel);
            }
        }
    }
}

/// What one `CHANGE` script call answered.
enum Cas {
    /// Committed: the answer to return.
    Done(Changed),
    /// Another version or other bounds: decide again on these.
    Conflict(Box<Known>),
}

impl Inner {
    /// The channel's metadata, version and bounds, read together (`META`).
    async fn read_meta(&self, channel: &str) -> Result<Known, JournalError> {
        let keys = (scripts::key_of(channel), scripts::meta_key_of(channel));
        let fresh = crate::RedisJournal::fresh_epoch();
        let r = self.opts.namespaces.retention(channel);
        let v: Vec<Value> = self
            .conn
            .run(|mut c| {
                let mut inv = self.scripts.meta.prepare_invoke();
                inv.key(&keys.0)
                    .key(&keys.1)
                    .arg(&fresh)
                    .arg(r.max_age_ms)
                    .arg("")
                    .arg(r.max_events)
                    .arg(r.max_bytes);
                async move { inv.invoke_async(&mut c).await }
            })
            .await?;
        let bad = || JournalError::Storage(format!("unexpected answer of the meta script: {v:?}"));
        let state = ChannelState {
            epoch: epoch_of(v.first()).ok_or_else(bad)?,
            floor: int_of(v.get(1)).ok_or_else(bad)?,
            head: int_of(v.get(2)).ok_or_else(bad)?,
        };
        self.note_lineage(channel, state.epoch, v.get(3), v.get(4));
        Ok(Known {
            ver: text_of(v.get(5)).ok_or_else(bad)?,
            meta: meta_of(v.get(6))?,
            state,
        })
    }

    /// [`gapless_core::Journal::meta`]: read from Redis (never the cache),
    /// which primes the cache.
    pub(crate) async fn meta(
        &self,
        channel: &str,
    ) -> Result<(Option<ChannelMeta>, ChannelState), JournalError> {
        let known = self.read_meta(channel).await?;
        let answer = (known.meta.clone(), known.state);
        self.metas.prime(channel, known);
        Ok(answer)
    }

    /// [`gapless_core::Journal::channels_with_meta`]: `SCAN` over the keys
    /// `gapless:{<prefix>*}:meta`, then one pipelined `HEXISTS … json` for
    /// the keys found (a deleted channel's hash is a tombstone without
    /// `json`). Costs a walk of Redis's whole keyspace: for rare requests.
    pub(crate) async fn channels_with_meta(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<String>, JournalError> {
        let pattern = format!("gapless:{{{}*}}:meta", glob_escape(prefix));
        let mut keys: Vec<String> = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, found): (u64, Vec<String>) = self
                .conn
                .run(|mut c| {
                    let mut cmd = redis::cmd("SCAN");
                    cmd.arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(1000);
                    async move { cmd.query_async(&mut c).await }
                })
                .await?;
            keys.extend(found);
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        keys.sort_unstable();
        keys.dedup();
        let mut names = Vec::new();
        for chunk in keys.chunks(500) {
            let live: Vec<bool> = self
                .conn
                .run(|mut c| {
                    let mut pipe = redis::pipe();
                    for k in chunk {
                        pipe.cmd("HEXISTS").arg(k).arg("json");
                    }
                    async move { pipe.query_async(&mut c).await }
                })
                .await?;
            for (k, live) in chunk.iter().zip(live) {
                let name = k
                    .strip_prefix("gapless:{")
                    .and_then(|r| r.strip_suffix("}:meta"));
                if let (true, Some(name)) = (live, name) {
                    names.push(name.to_owned());
                    if names.len() >= limit {
                        return Ok(names);
                    }
                }
            }
        }
        Ok(names)
    }

    /// [`gapless_core::Journal::change`] (see the module doc).
    pub(crate) async fn change(
        &self,
        channel: &str,
        change: Change,
    ) -> Result<Changed, JournalError> {
        let _held = self.locks.lock(channel).await;
        let mut cached = self.metas.get(channel);
        // Whether what is decided on came from Redis during this call.
        let mut fresh = false;
        let mut conflicts = 0;
        let create = matches!(change, Change::Create { .. });
        loop {
            let known = match cached.take() {
                Some(k) => k,
                None => {
                    fresh = true;
                    self.read_meta(channel).await?
                }
            };
            let decision = meta::decide(known.meta.as_ref(), known.state, change.clone());
            let (events, key, next, outcome) = match decision {
                Decision::Nothing(outcome) if fresh => {
                    self.metas.put(channel, known.clone());
                    return Ok(Changed {
                        outcome,
                        meta: known.meta.map(std::sync::Arc::new),
                        state: known.state,
                    });
                }
                // Perhaps only the cache says so: decided again on a read.
                Decision::Nothing(_) => continue,
                Decision::Write {
                    events,
                    key,
                    meta,
                    outcome,
                } => (events, key, meta, outcome),
            };
            let bounds = create.then_some(known.state);
            let sent = self
                .cas(channel, &known.ver, bounds, events, key, next, outcome)
                .await;
            match sent {
                Ok(Cas::Done(changed)) => return Ok(changed),
                Ok(Cas::Conflict(now)) => {
                    conflicts += 1;
                    if conflicts > MAX_CONFLICTS {
                        self.metas.forget(channel);
                        return Err(JournalError::Storage(format!(
                            "the metadata of {channel} changed {MAX_CONFLICTS} times while one change was decided"
                        )));
                    }
                    fresh = true;
                    cached = Some(*now);
                }
                Err(e) => {
                    // It may have been applied (Unavailable): read next time.
                    self.metas.forget(channel);
                    return Err(e);
                }
            }
        }
    }

    /// One `CHANGE` script call: the decision's events and metadata `next`,
    /// if the version is still `ver` (and, with `bounds`, the channel's
    /// epoch and head are still those). On success the sink gets the
    /// events (as for an append) and `meta_changed`, and the cache the new
    /// version.
    #[allow(clippy::too_many_arguments)]
    async fn cas(
        &self,
        channel: &str,
        ver: &str,
        bounds: Option<ChannelState>,
        events: Vec<NewEvent>,
        key: Option<String>,
        next: Option<ChannelMeta>,
        outcome: Outcome,
    ) -> Result<Cas, JournalError> {
        let keys = (scripts::key_of(channel), scripts::meta_key_of(channel));
        let token = request_token();
        let key_arg = match &key {
            Some(k) => format!("{k}\n{token}"),
            None => format!(" {token}"),
        };
        let payloads: Vec<Vec<u8>> = events.iter().map(codec::encode).collect();
        let fresh = crate::RedisJournal::fresh_epoch();
        let r = self.opts.namespaces.retention(channel);
        let bounds_arg = bounds.map_or(String::new(), |s| format!("{}:{}", s.epoch.0, s.head));
        let json = next.as_ref().map_or(String::new(), ChannelMeta::encode);
        let closed = if next.as_ref().is_some_and(ChannelMeta::is_closed) {
            "1"
        } else {
            "0"
        };
        // A random base below 2^40: exact in Lua's doubles however long it counts.
        let base = (rand::random::<u64>() >> 24) | 1;
        let tombstone = crate::MIN_TOKEN_LIFETIME_MS.max(self.opts.token_lifetime());
        let held = if events.is_empty() {
            None
        } else {
            self.hold_untracked(channel).await
        };
        let known = self.known_arg(channel);
        let v: Vec<Value> = self
            .conn
            .run(|mut c| {
                let mut inv = self.scripts.change.prepare_invoke();
                inv.key(&keys.0)
                    .key(&keys.1)
                    .arg(ver)
                    .arg(&bounds_arg)
                    .arg(&json)
                    .arg(closed)
                    .arg(base)
                    .arg(&token)
                    .arg(&self.node)
                    .arg(tombstone)
                    .arg(channel)
                    .arg(&key_arg)
                    .arg(r.max_events)
                    .arg(r.max_age_ms)
                    .arg(&fresh)
                    .arg(BUS_CHANNEL)
                    .arg(self.opts.inline_bytes)
                    .arg(&known)
                    .arg(self.opts.token_lifetime())
                    .arg(r.max_bytes);
                for p in &payloads {
                    inv.arg(p.as_slice());
                }
                async move { inv.invoke_async(&mut c).await }
            })
            .await?;
        let bad =
            || JournalError::Storage(format!("unexpected answer of the change script: {v:?}"));
        let n = |i: usize| int_of(v.get(i)).ok_or_else(bad);
        match text_of(v.first()).as_deref() {
            Some("conflict") => {
                let state = ChannelState {
                    epoch: epoch_of(v.get(3)).ok_or_else(bad)?,
                    floor: n(4)?,
                    head: n(5)?,
                };
                self.note_lineage(channel, state.epoch, v.get(6), v.get(7));
                Ok(Cas::Conflict(Box::new(Known {
                    ver: text_of(v.get(1)).ok_or_else(bad)?,
                    meta: meta_of(v.get(2))?,
                    state,
                })))
            }
            Some("own") => {
                // This request, sent again after its answer was lost: its
                // events reach the sink as another node's would (the bus
                // notification of the first send, or the head re-read).
                let epoch = epoch_of(v.get(2)).ok_or_else(bad)?;
                let state = ChannelState {
                    epoch,
                    floor: n(5)?,
                    head: n(6)?,
                };
                self.note_lineage(channel, epoch, v.get(7), v.get(8));
                let appended = (!events.is_empty()).then_some(Appended {
                    epoch,
                    first_seq: n(3)?,
                    last_seq: n(4)?,
                    duplicate: false,
                });
                Ok(Cas::Done(self.committed(
                    channel,
                    text_of(v.get(1)).ok_or_else(bad)?,
                    next,
                    state,
                    outcome,
                    appended,
                )))
            }
            Some("ok") => {
                let epoch = epoch_of(v.get(2)).ok_or_else(bad)?;
                let (first, last, dup, floor, head, time) =
                    (n(3)?, n(4)?, n(5)?, n(6)?, n(7)?, n(8)?);
                self.note_lineage(channel, epoch, v.get(9), v.get(10));
                let own = int_of(v.get(11)) == Some(1);
                let state = ChannelState { epoch, floor, head };
                let mut appended = None;
                if !events.is_empty() {
                    appended = Some(Appended {
                        epoch,
                        first_seq: first,
                        last_seq: last,
                        duplicate: dup == 1 && !own,
                    });
                    if dup != 1 {
                        let committed =
                            crate::committed_events(channel, epoch, first, time, events);
                        self.deliver_local(channel, state, committed, held).await;
                    }
                }
                Ok(Cas::Done(self.committed(
                    channel,
                    text_of(v.get(1)).ok_or_else(bad)?,
                    next,
                    state,
                    outcome,
                    appended,
                )))
            }
            // Not after a version check that passed (a decision to append
            // is never made on closed metadata), but said so if it comes.
            Some("closed") => {
                self.metas.forget(channel);
                Err(JournalError::ChannelClosed)
            }
            _ => Err(bad()),
        }
    }

    /// A committed change: caches version `ver` of `next`, tells the sink
    /// the metadata changed, and makes the answer.
    fn committed(
        &self,
        channel: &str,
        ver: String,
        next: Option<ChannelMeta>,
        state: ChannelState,
        outcome: Outcome,
        appended: Option<Appended>,
    ) -> Changed {
        self.metas.put(
            channel,
            Known {
                ver,
                meta: next.clone(),
                state,
            },
        );
        self.sink.meta_changed(channel);
        Changed {
            outcome: meta::with_appended(outcome, appended),
            meta: next.map(std::sync::Arc::new),
            state,
        }
    }

    /// A metadata notice from the bus (`meta <node> <channel>`, after
    /// [`PREFIX`]): another node changed the channel's metadata, so this
    /// node drops its copy and tells its sink. Its own are skipped (it told
    /// its sink when it committed).
    pub(crate) fn on_meta(&self, rest: &[u8]) {
        let parsed = std::str::from_utf8(rest)
            .ok()
            .and_then(|s| s.split_once(' '))
            .filter(|(node, channel)| !node.is_empty() && !channel.is_empty());
        match parsed {
            Some((node, _)) if node == self.node => {}
            Some((_, channel)) => {
                self.metas.forget(channel);
                self.sink.meta_changed(channel);
            }
            None => tracing::warn!("malformed metadata notice on the bus; ignored"),
        }
    }
}

/// A string answer of a script (bulk or simple).
fn text_of(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// The metadata in a script's answer: `""` is none.
///
/// # Errors
/// [`JournalError::Storage`] when it is not a string, or not what
/// [`ChannelMeta::encode`] writes.
fn meta_of(v: Option<&Value>) -> Result<Option<ChannelMeta>, JournalError> {
    match v {
        Some(Value::BulkString(b)) if b.is_empty() => Ok(None),
        Some(Value::BulkString(b)) => ChannelMeta::decode(b)
            .map(Some)
            .map_err(JournalError::Storage),
        other => Err(JournalError::Storage(format!(
            "unexpected metadata in a script's answer: {other:?}"
        ))),
    }
}

/// `s` with Redis glob's special characters (`*`, `?`, `[`, `]` and the backslash)
/// escaped, for a `MATCH` pattern that takes it literally.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::Locks;
    use std::sync::Arc;

    /// The lock map holds a channel only while someone holds or waits for
    /// its lock, also when a wait is cancelled.
    #[tokio::test]
    async fn the_lock_map_forgets_a_channel_nobody_holds_or_waits_for() {
        let locks = Arc::new(Locks::default());
        let first = locks.lock("c").await;
        assert_eq!(locks.len(), 1);
        // A waiter that gives up.
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(20), locks.lock("c"));
        assert!(waiting.await.is_err());
        assert_eq!(locks.len(), 1);
        drop(first);
        assert_eq!(locks.len(), 0, "the entry goes with its last holder");
        // Waiters get it in order.
        let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let a = locks.lock("c").await;
        let waits = (0..5).map(|i| {
            let (locks, order) = (locks.clone(), order.clone());
            async move {
                let _h = locks.lock("c").await;
                order.lock().push(i);
            }
        });
        let all = futures::future::join_all(waits);
        let release = async {
            tokio::task::yield_now().await;
            drop(a);
        };
        tokio::join!(all, release);
        assert_eq!(*order.lock(), vec![0, 1, 2, 3, 4]);
        assert_eq!(locks.len(), 0);
    }
}
