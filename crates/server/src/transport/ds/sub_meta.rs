//! The subscriptions' records, journaled: every change of a Durable Streams
//! subscription (creation, links, acks, a wake issued, a claim, a lease
//! extended or ended, a failed delivery and its retry time, deletion) is a
//! record appended to the reserved channel [`CHANNEL`] before the operation
//! is answered, and the delivery lease of a cluster is a record there too.
//! A server reads the channel back at its start ([`catch_up`]) and, in
//! cluster mode, every node keeps following it, so subscriptions survive a
//! restart and are the same on every node. docs/durable-streams.md,
//! "Subscriptions", gives the design (older releases kept streams' metadata the same way).
//!
//! A record is the whole state of one subscription (or a deletion) with its
//! version: version `n + 1` is appended with the journal idempotency key
//! `ds-sub/HASH/n+1`, so of two nodes changing one subscription from version
//! `n` at once only the first is stored; the other's append is answered as
//! a duplicate, and it reads the winner and computes its change again
//! ([`Tx`]). Every stored record is therefore a step of one history,
//! and the newest version of a subscription is its state, whatever point of
//! the channel a node starts reading from.

use super::subscriptions::Sub;
use super::Ds;
use crate::App;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use gapless_core::journal::{now_ms, Appended, JournalError};
use gapless_protocol::{Epoch, NewEvent, Payload};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A subscription's record is rewritten when more than this many records,
/// plus twice the number of subscriptions, were appended after it (so
/// rewriting every one never makes them all old again). The channel's count
/// retention must keep more (docs/durable-streams.md, "Subscriptions").
pub const COMPACT_EVENTS: u64 = 500;

/// A subscription's record is rewritten when it is older than this, in
/// milliseconds (10 minutes; the channel's age retention must be longer).
pub const COMPACT_MS: u64 = 600_000;

/// The reserved channel of the records. `/` is outside the channel
/// alphabet, so gapless's own API refuses this name and no stream path maps
/// to it (as the streams' side channel of older releases did).
pub const CHANNEL: &str = "gapless/ds-subscriptions";

/// How often a cluster node reads the records other nodes appended, in
/// milliseconds (and at once before every subscription request).
pub const FOLLOW_MS: u64 = 250;

/// How often a cluster node that knows no subscription reads the records,
/// in milliseconds: a subscription made on another node is known here
/// within this (at once on a subscription request), so this node can take
/// over its delivery; an unused cluster is not polled more.
pub const IDLE_FOLLOW_MS: u64 = 5_000;

/// How long the delivery lease of a cluster lasts, in milliseconds: the
/// longest pause of deliveries after the node holding it dies.
pub const LEASE_MS: u64 = 10_000;

/// The delivery lease is renewed once it is older than this, in
/// milliseconds (so it has at least `LEASE_MS - RENEW_MS` left).
pub const RENEW_MS: u64 = 3_000;

/// How often one change is computed again after losing to another node's
/// change of the same subscription before the request gives up (503).
pub const ATTEMPTS: usize = 16;

/// Per-node locks, by hash of the subscription: changes of one subscription
/// on one node are made one at a time.
const STRIPES: usize = 64;

/// A subscription's name: its root and id.
pub type Key = (String, String);

/// One record: a subscription's state at a version (`sub`, or none: it was
/// deleted), or the delivery lease (`deliverer`, with an empty `id`).
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    root: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    id: String,
    ver: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sub: Option<Sub>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    deliverer: Option<Lease>,
}

/// The delivery lease of a cluster: the node that scans subscriptions,
/// issues wakes and sends webhooks, until when (Unix ms).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Lease {
    /// The holder's random name ([`Log::node`]).
    pub node: String,
    /// The end of the lease, Unix milliseconds.
    pub until: u64,
}

/// A subscription as the records left it.
#[derive(Clone)]
struct Entry {
    ver: u64,
    /// The record's seq in [`CHANNEL`] (0: to be written again, e.g. after
    /// the channel changed epoch) and its time (Unix ms).
    seq: u64,
    ms: u64,
    /// `None`: deleted (kept while its record is retained, so a creation
    /// again continues its versions).
    sub: Option<Arc<Sub>>,
}

/// Every subscription as read from the records, the delivery lease, and
/// how far the records were read.
pub struct Log {
    entries: parking_lot::Mutex<HashMap<Key, Entry>>,
    deliverer: parking_lot::Mutex<(u64, Option<Lease>)>,
    applied: tokio::sync::Mutex<(Epoch, u64)>,
    loaded: AtomicBool,
    stripes: Vec<tokio::sync::Mutex<()>>,
    /// This process's name in the delivery lease (random at start).
    pub node: String,
}

impl Default for Log {
    fn default() -> Self {
        Log {
            entries: parking_lot::Mutex::new(HashMap::new()),
            deliverer: parking_lot::Mutex::new((0, None)),
            applied: tokio::sync::Mutex::new((Epoch::default(), 0)),
            loaded: AtomicBool::new(false),
            stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            node: format!("n{:016x}", rand::random::<u64>()),
        }
    }
}

impl Log {
    /// The current version of `key` (0: never seen) and its state.
    pub fn get(&self, key: &Key) -> (u64, Option<Arc<Sub>>) {
        self.entries
            .lock()
            .get(key)
            .map_or((0, None), |e| (e.ver, e.sub.clone()))
    }

    /// The subscriptions that exist (not deleted).
    pub fn keys(&self) -> Vec<Key> {
        self.entries
            .lock()
            .iter()
            .filter(|(_, e)| e.sub.is_some())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// How many subscriptions exist.
    pub fn count(&self) -> usize {
        self.entries
            .lock()
            .values()
            .filter(|e| e.sub.is_some())
            .count()
    }

    /// Whether the records were read once since the start.
    pub fn loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    fn stripe(&self, key: &Key) -> &tokio::sync::Mutex<()> {
        let h = Sha256::digest(format!("{}\n{}", key.0, key.1).as_bytes());
        &self.stripes[usize::from(h[0]) % STRIPES]
    }

    /// Applies record `rec` (at `seq`, written at `ms`) unless what it names
    /// is already at its version or a newer one.
    fn apply(&self, seq: u64, ms: u64, rec: Record) {
        if rec.id.is_empty() {
            if let Some(l) = rec.deliverer {
                let mut d = self.deliverer.lock();
                if rec.ver > d.0 {
                    *d = (rec.ver, Some(l));
                }
            }
            return;
        }
        let key = (rec.root, rec.id);
        let mut entries = self.entries.lock();
        if entries.get(&key).is_some_and(|e| e.ver >= rec.ver) {
            return;
        }
        entries.insert(
            key,
            Entry {
                ver: rec.ver,
                seq,
                ms,
                sub: rec.sub.map(Arc::new),
            },
        );
    }
}

/// The journal idempotency key of version `ver` of `key` (`None`: the
/// delivery lease): visible ASCII, short whatever the root and id.
fn idempotency_key(key: Option<&Key>, ver: u64) -> String {
    match key {
        Some((root, id)) => {
            let h = Sha256::digest(format!("{root}\n{id}").as_bytes());
            format!("ds-sub/{}/{ver}", URL_SAFE_NO_PAD.encode(&h[..16]))
        }
        None => format!("ds-sub/deliverer/{ver}"),
    }
}

async fn append(app: &App, rec: &Record, key: &str) -> Result<Appended, JournalError> {
    let data = serde_json::to_string(rec).map_err(|e| JournalError::Storage(e.to_string()))?;
    app.hub
        .publish(
            CHANNEL,
            vec![NewEvent {
                event_type: None,
                data: Payload::Text(data),
            }],
            Some(key),
        )
        .await
}

/// Reads the records appended since the last call and applies them: at the
/// first call, the whole channel (a restart's read-back). Serialized per
/// server; cheap when nothing is new.
///
/// # Errors
/// [`JournalError`] when the journal cannot be read.
pub async fn catch_up(app: &App, ds: &Ds) -> Result<(), JournalError> {
    let log = &ds.subs.log;
    let mut guard = log.applied.lock().await;
    let st = app.hub.state(CHANNEL).await?;
    let (epoch, applied) = &mut *guard;
    if *epoch != st.epoch {
        // A new incarnation of the channel (its history was lost): read it
        // all, and write every subscription known here again (compaction
        // takes records at seq 0 first).
        if *epoch != Epoch::default() {
            tracing::warn!(
                "the Durable Streams subscriptions' channel changed epoch; reading it again"
            );
            for e in log.entries.lock().values_mut() {
                e.seq = 0;
                e.ms = 0;
            }
        }
        *epoch = st.epoch;
        *applied = 0;
    }
    let mut after = *applied;
    while after < st.head {
        let page = app
            .hub
            .read(
                CHANNEL,
                after,
                super::read::READ_EVENTS,
                super::read::READ_BYTES,
            )
            .await?;
        let Some(last) = page.events.last() else {
            break;
        };
        after = last.seq;
        for ev in &page.events {
            match serde_json::from_slice::<Record>(ev.data.as_bytes()) {
                Ok(r) => log.apply(ev.seq, ev.time, r),
                Err(e) => tracing::warn!(
                    seq = ev.seq,
                    error = %e,
                    "skipping a malformed Durable Streams subscription record"
                ),
            }
        }
    }
    *applied = after.max(*applied);
    log.loaded.store(true, Ordering::Release);
    Ok(())
}

/// Makes this node's view current enough for a request: the read-back at
/// the first call; in cluster mode, every call reads what other nodes wrote.
///
/// # Errors
/// As [`catch_up`].
pub async fn sync(app: &App, ds: &Ds) -> Result<(), JournalError> {
    if app.config.cluster || !ds.subs.log.loaded() {
        catch_up(app, ds).await?;
    }
    Ok(())
}

/// A change of one subscription through the journal:
///
/// ```text
/// let mut tx = Tx::begin(app, ds, key).await?;
/// loop {
///     let current = tx.current();          // None: no such subscription
///     … compute the new state (may await) …
///     if tx.write(new).await? { break }    // false: lost, compute again
/// }
/// ```
///
/// [`Tx::write`] journals the next version before it returns; when another
/// node stored that version first, it reads the winner and answers false,
/// and the caller computes the change again from [`Tx::current`] (at most
/// [`ATTEMPTS`] times). While a `Tx` lives, no other change of the same
/// subscription runs on this node.
pub struct Tx<'a> {
    app: &'a App,
    ds: &'a Ds,
    key: Key,
    ver: u64,
    attempts: usize,
    _one_at_a_time: tokio::sync::MutexGuard<'a, ()>,
}

impl<'a> Tx<'a> {
    /// Starts a change of `key`, on a view made current by [`sync`].
    ///
    /// # Errors
    /// As [`catch_up`].
    pub async fn begin(app: &'a App, ds: &'a Ds, key: Key) -> Result<Tx<'a>, JournalError> {
        let tx = Self::begin_on_view(app, ds, key).await;
        sync(app, ds).await?;
        Ok(tx)
    }

    /// Starts a change of `key` on this node's view as it is, without
    /// reading the records first (the delivery task's looks, every 50 ms,
    /// which follows the records on its own): a stale view only makes
    /// [`Tx::write`] lose and read them.
    pub async fn begin_on_view(app: &'a App, ds: &'a Ds, key: Key) -> Tx<'a> {
        let guard = ds.subs.log.stripe(&key).lock().await;
        Tx {
            app,
            ds,
            key,
            ver: 0,
            attempts: 0,
            _one_at_a_time: guard,
        }
    }

    /// The subscription's state now (`None`: none, or deleted).
    pub fn current(&mut self) -> Option<Arc<Sub>> {
        let (ver, sub) = self.ds.subs.log.get(&self.key);
        self.ver = ver;
        sub
    }

    /// Journals `new` (`None`: deleted) as the version after the one
    /// [`Tx::current`] read. True: stored, and applied here; false: another
    /// node stored that version first (this node has read it now).
    ///
    /// # Errors
    /// [`JournalError`] when the journal fails (the change may or may not
    /// be stored: the next read-back tells), or `Unavailable` after
    /// [`ATTEMPTS`] lost races.
    pub async fn write(&mut self, new: Option<Sub>) -> Result<bool, JournalError> {
        self.attempts += 1;
        if self.attempts > ATTEMPTS {
            return Err(JournalError::Unavailable(format!(
                "the subscription {:?} changed on other nodes {ATTEMPTS} times while this \
                 change was made; retry",
                self.key.1
            )));
        }
        let ver = self.ver + 1;
        let rec = Record {
            root: self.key.0.clone(),
            id: self.key.1.clone(),
            ver,
            sub: new,
            deliverer: None,
        };
        let a = append(self.app, &rec, &idempotency_key(Some(&self.key), ver)).await?;
        if !a.duplicate {
            self.ds.subs.log.apply(a.last_seq, now_ms(), rec);
            return Ok(true);
        }
        catch_up(self.app, self.ds).await?;
        Ok(false)
    }
}

/// Whether this node delivers now: always on one server; in cluster mode,
/// while it holds the delivery lease, which it takes when the lease is free
/// or has ended, and renews when older than [`RENEW_MS`].
pub async fn delivering(app: &App, ds: &Ds) -> bool {
    if !app.config.cluster {
        return true;
    }
    let log = &ds.subs.log;
    let now = now_ms();
    let (ver, lease) = log.deliverer.lock().clone();
    let mine = lease.as_ref().is_some_and(|l| l.node == log.node);
    let until = lease.as_ref().map_or(0, |l| l.until);
    if until > now && !mine {
        return false;
    }
    if mine && until > now + (LEASE_MS - RENEW_MS) {
        return true;
    }
    let rec = Record {
        root: String::new(),
        id: String::new(),
        ver: ver + 1,
        sub: None,
        deliverer: Some(Lease {
            node: log.node.clone(),
            until: now + LEASE_MS,
        }),
    };
    match append(app, &rec, &idempotency_key(None, ver + 1)).await {
        Ok(a) if !a.duplicate => {
            if !mine {
                tracing::info!(node = %log.node, "delivering Durable Streams subscriptions");
            }
            log.apply(a.last_seq, now, rec);
            true
        }
        Ok(_) => {
            // Another node took or renewed it first.
            let _ = catch_up(app, ds).await;
            false
        }
        // Still ours for a while if it was.
        Err(_) => mine && until > now + 2_000,
    }
}

/// Ends this node's delivery lease at shutdown (best effort), so another
/// node takes over at once instead of after [`LEASE_MS`].
pub async fn resign(app: &App, ds: &Ds) {
    let log = &ds.subs.log;
    let (ver, lease) = log.deliverer.lock().clone();
    if !app.config.cluster || lease.is_none_or(|l| l.node != log.node) {
        return;
    }
    let rec = Record {
        root: String::new(),
        id: String::new(),
        ver: ver + 1,
        sub: None,
        deliverer: Some(Lease {
            node: log.node.clone(),
            until: 0,
        }),
    };
    let _ = append(app, &rec, &idempotency_key(None, ver + 1)).await;
}

/// Rewrites the records of subscriptions that grew old (as older releases did
/// for streams in older releases, with the thresholds [`COMPACT_EVENTS`] and
/// [`COMPACT_MS`]), so retention never evicts the only record of a
/// live subscription, and forgets deletions whose record was evicted.
pub async fn compact(app: &App, ds: &Ds) {
    let Ok(st) = app.hub.state(CHANNEL).await else {
        return;
    };
    let log = &ds.subs.log;
    let entries: Vec<(Key, Entry)> = log
        .entries
        .lock()
        .iter()
        .map(|(k, e)| (k.clone(), e.clone()))
        .collect();
    let live = entries.iter().filter(|(_, e)| e.sub.is_some()).count() as u64;
    let behind = COMPACT_EVENTS + 2 * live;
    let now = now_ms();
    for (key, e) in entries {
        if e.sub.is_none() {
            if e.seq < st.floor {
                let mut all = log.entries.lock();
                if all.get(&key).is_some_and(|x| x.ver == e.ver) {
                    all.remove(&key);
                }
            }
            continue;
        }
        if st.head.saturating_sub(e.seq) <= behind && now.saturating_sub(e.ms) <= COMPACT_MS {
            continue;
        }
        let r = async {
            let mut tx = Tx::begin(app, ds, key.clone()).await?;
            while let Some(s) = tx.current() {
                if tx.write(Some((*s).clone())).await? {
                    break;
                }
            }
            Ok::<(), JournalError>(())
        };
        if let Err(e) = r.await {
            tracing::warn!(subscription = %key.1, error = %e, "could not rewrite a Durable Streams subscription record");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, ver: u64) -> Record {
        Record {
            root: "r".into(),
            id: id.into(),
            ver,
            sub: None,
            deliverer: None,
        }
    }

    #[test]
    fn the_newest_version_wins_whatever_the_order_read() {
        let log = Log::default();
        let key = ("r".to_owned(), "s".to_owned());
        log.apply(10, 0, rec("s", 2));
        log.apply(11, 0, rec("s", 1));
        assert_eq!(
            log.get(&key).0,
            2,
            "an older version never replaces a newer one"
        );
        log.apply(12, 0, rec("s", 3));
        assert_eq!(log.get(&key).0, 3);
        let lease = |ver, node: &str| Record {
            root: String::new(),
            id: String::new(),
            ver,
            sub: None,
            deliverer: Some(Lease {
                node: node.into(),
                until: 1,
            }),
        };
        log.apply(13, 0, lease(5, "a"));
        log.apply(14, 0, lease(4, "b"));
        assert_eq!(
            log.deliverer.lock().1.as_ref().map(|l| l.node.as_str()),
            Some("a")
        );
    }

    #[test]
    fn idempotency_keys_are_short_visible_ascii_and_differ_by_subscription() {
        let long = ("x".repeat(200), "y".repeat(200));
        let k = idempotency_key(Some(&long), 7);
        assert!(
            k.len() < 64 && k.bytes().all(|b| b.is_ascii_graphic()),
            "{k}"
        );
        assert!(k.ends_with("/7"));
        let other = ("x".repeat(200), "z".repeat(200));
        assert_ne!(k, idempotency_key(Some(&other), 7));
        assert_ne!(k, idempotency_key(Some(&long), 8));
        assert_eq!(idempotency_key(None, 3), "ds-sub/deliverer/3");
    }
}
