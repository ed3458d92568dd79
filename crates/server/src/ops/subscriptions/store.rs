//! Where subscriptions are journaled: each one in its own reserved channel,
//! as that channel's record (`ChannelMeta::record`), changed only by the
//! journal's compare-and-set (`Change::Put`, decided where the journal
//! serializes the channel's changes: the memory journal's lock, the
//! embedded store's writer thread, one Redis script checking the metadata
//! hash's version). Nothing global holds subscriptions:
//!
//! - `gapless/ds-sub/HASH` ([`sub_channel`]): one subscription's whole
//!   state ([`Sub`]); `HASH` is of its root and id, so any length of either
//!   makes a short name. `/` is outside the channel alphabet: no gapless
//!   API and no stream path reaches these channels.
//! - `gapless/ds-sub-index/HASH` ([`index_channel`]): the ids of one
//!   root's subscriptions ([`Index`]), for `PUT`'s limit and for a node
//!   that starts delivering; at most `--ds-max-subscriptions` ids.
//! - [`ROOTS`]: the roots that have subscriptions ([`Roots`]), one entry a
//!   root, changed when a root gets its first subscription or loses its last.
//! - [`DELIVERER`]: the cluster's delivery lease ([`Lease`]).
//!
//! A node reads a subscription when it first needs it and keeps a bounded
//! cache ([`Store`], [`CACHED`] subscriptions), forgotten when the journal
//! reports the channel's metadata changed (`CommitSink::meta_changed`, on
//! every node). A change ([`Tx`]) is written with the version it was
//! computed from: when another node wrote first, the journal refuses it and
//! answers the winner, and the change is computed again on that.

use super::model::Sub;
use crate::App;
use gapless_core::journal::JournalError;
use gapless_core::meta::{Change, ChannelMeta, Outcome};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The prefix of a subscription's channel.
pub const SUB_PREFIX: &str = "gapless/ds-sub/";
/// The prefix of a root's index channel.
pub const INDEX_PREFIX: &str = "gapless/ds-sub-index/";
/// The channel listing the roots that have subscriptions.
pub const ROOTS: &str = "gapless/ds-sub-roots";
/// The channel of the cluster's delivery lease.
pub const DELIVERER: &str = "gapless/ds-sub-deliverer";
/// Most subscriptions a node caches; past it the cache is emptied (each
/// is read again from its channel at its next use).
pub const CACHED: usize = 16_384;
/// How often one change is computed again after losing to another node's
/// change of the same record before it gives up (503).
pub const ATTEMPTS: usize = 16;
/// Per-node locks, by hash of the channel: one node makes the changes of
/// one subscription one at a time (fewer lost races).
const STRIPES: usize = 64;

fn hashed(prefix: &str, text: &str) -> String {
    let h = Sha256::digest(text.as_bytes());
    let hex: String = h[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}{hex}")
}

/// The channel of the subscription `id` under `root`.
pub fn sub_channel(root: &str, id: &str) -> String {
    hashed(SUB_PREFIX, &format!("{}:{root}\n{id}", root.len()))
}

/// The index channel of `root`.
pub fn index_channel(root: &str) -> String {
    hashed(INDEX_PREFIX, root)
}

/// The ids of one root's subscriptions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Index {
    /// The root.
    pub root: String,
    /// Its subscriptions' ids. A crash between a subscription's write and
    /// its index's may leave an id whose subscription does not exist (it
    /// counts toward the limit until its id is deleted or created again).
    pub ids: BTreeSet<String>,
}

/// The roots that have subscriptions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Roots {
    /// The roots.
    pub roots: BTreeSet<String>,
}

/// The delivery lease of a cluster: the node that issues wakes, until when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The holder's random name.
    pub node: String,
    /// The end of the lease, Unix ms.
    pub until: u64,
}

/// A record as the journal holds it: its channel's incarnation, its
/// version (0: none) and its value.
#[derive(Debug, Clone)]
pub struct Held<T> {
    /// The channel metadata's incarnation (0: none).
    pub inc: u64,
    /// The record's version (0: none).
    pub ver: u64,
    /// The record.
    pub value: Option<T>,
}

impl<T> Held<T> {
    /// No record: what a creation is guarded by.
    pub fn none_yet() -> Self {
        Self::none()
    }

    fn none() -> Self {
        Held {
            inc: 0,
            ver: 0,
            value: None,
        }
    }
}

fn storage(e: impl std::fmt::Display) -> JournalError {
    JournalError::Storage(e.to_string())
}

fn decode<T: DeserializeOwned>(meta: Option<ChannelMeta>) -> Result<Held<T>, JournalError> {
    let Some(m) = meta else {
        return Ok(Held::none());
    };
    let Some(r) = m.record else {
        return Err(storage(
            "a subscription channel holds metadata without a record",
        ));
    };
    Ok(Held {
        inc: m.incarnation,
        ver: m.record_version,
        value: Some(serde_json::from_str(&r).map_err(storage)?),
    })
}

/// Reads the record of `channel`.
///
/// # Errors
/// [`JournalError`] when the journal cannot be read or the record is damaged.
pub async fn read<T: DeserializeOwned>(app: &App, channel: &str) -> Result<Held<T>, JournalError> {
    decode(app.hub.meta(channel).await?.0)
}

/// Writes `new` (`None`: removes the record) as the version after `held`.
/// `Ok(Ok(now))`: stored; `Ok(Err(current))`: another change came first
/// (or `held` was stale), nothing written, `current` is the journal's.
///
/// # Errors
/// [`JournalError`] when the journal fails.
pub async fn put<T: Serialize + DeserializeOwned>(
    app: &App,
    channel: &str,
    held: &Held<T>,
    new: Option<&T>,
) -> Result<Result<Held<T>, Held<T>>, JournalError> {
    let record = new
        .map(serde_json::to_string)
        .transpose()
        .map_err(storage)?;
    let incarnation = if held.ver == 0 {
        rand::random::<u64>().max(1)
    } else {
        held.inc
    };
    let change = Change::Put {
        incarnation,
        version: held.ver,
        record,
    };
    let c = app.hub.change(channel, change).await?;
    let now = decode(c.meta.map(Arc::unwrap_or_clone))?;
    Ok(match c.outcome {
        Outcome::Created(_) | Outcome::Updated | Outcome::Deleted => Ok(now),
        _ => Err(now),
    })
}

/// Changes the record of `channel` by `f` (given the current value, it
/// answers the new one, `Some(None)` to remove it, or `None` to leave it),
/// computed again on the winner when another change comes first. Returns
/// the value after.
///
/// # Errors
/// [`JournalError`] when the journal fails, or `Unavailable` after
/// [`ATTEMPTS`] lost races.
pub async fn update<T, F>(app: &App, channel: &str, mut f: F) -> Result<Option<T>, JournalError>
where
    T: Serialize + DeserializeOwned,
    F: FnMut(Option<&T>) -> Option<Option<T>>,
{
    let mut held = read::<T>(app, channel).await?;
    for _ in 0..ATTEMPTS {
        let Some(new) = f(held.value.as_ref()) else {
            return Ok(held.value);
        };
        match put(app, channel, &held, new.as_ref()).await? {
            Ok(now) => return Ok(now.value),
            Err(current) => held = current,
        }
    }
    Err(lost(channel))
}

fn lost(what: &str) -> JournalError {
    JournalError::Unavailable(format!(
        "{what} changed on other nodes {ATTEMPTS} times while one change was made; retry"
    ))
}

/// Adds `id` to `root`'s index, then `root` to [`ROOTS`] (in that order:
/// see [`unindex`]).
///
/// # Errors
/// As [`update`].
pub async fn index(app: &App, root: &str, id: &str) -> Result<(), JournalError> {
    update::<Index, _>(app, &index_channel(root), |cur| {
        let mut i = cur.cloned().unwrap_or_else(|| Index {
            root: root.to_owned(),
            ids: BTreeSet::new(),
        });
        i.ids.insert(id.to_owned()).then_some(Some(i))
    })
    .await?;
    update::<Roots, _>(app, ROOTS, |cur| {
        let mut r = cur.cloned().unwrap_or_default();
        r.roots.insert(root.to_owned()).then_some(Some(r))
    })
    .await?;
    Ok(())
}

/// Removes `id` from `root`'s index; the index's last id removes the
/// index and `root` from [`ROOTS`], and the index is read again after: an
/// id added meanwhile (whose creator adds the root after its id) puts the
/// root back.
///
/// # Errors
/// As [`update`].
pub async fn unindex(app: &App, root: &str, id: &str) -> Result<(), JournalError> {
    let channel = index_channel(root);
    let left = update::<Index, _>(app, &channel, |cur| {
        let mut i = cur?.clone();
        if !i.ids.remove(id) {
            return None;
        }
        Some((!i.ids.is_empty()).then_some(i))
    })
    .await?;
    if left.is_some_and(|i| !i.ids.is_empty()) {
        return Ok(());
    }
    let drop_root = |cur: Option<&Roots>| {
        let mut r = cur?.clone();
        r.roots.remove(root).then_some(Some(r))
    };
    update::<Roots, _>(app, ROOTS, drop_root).await?;
    if read::<Index>(app, &channel)
        .await?
        .value
        .is_some_and(|i| !i.ids.is_empty())
    {
        update::<Roots, _>(app, ROOTS, |cur| {
            let mut r = cur.cloned().unwrap_or_default();
            r.roots.insert(root.to_owned()).then_some(Some(r))
        })
        .await?;
    }
    Ok(())
}

/// Every subscription's (root, id) the indexes list.
///
/// # Errors
/// [`JournalError`] when the journal cannot be read.
pub async fn all(app: &App) -> Result<Vec<(String, String)>, JournalError> {
    let roots = read::<Roots>(app, ROOTS).await?.value.unwrap_or_default();
    let mut out = Vec::new();
    for root in roots.roots {
        if let Some(i) = read::<Index>(app, &index_channel(&root)).await?.value {
            out.extend(i.ids.into_iter().map(|id| (root.clone(), id)));
        }
    }
    Ok(out)
}

/// The subscriptions a node has read, and the locks of its changes.
#[derive(Debug)]
pub struct Store {
    cache: parking_lot::Mutex<HashMap<String, Held<Arc<Sub>>>>,
    /// Bumped by every [`Store::forget`]: a read that saw it move meanwhile
    /// is not cached (it may predate the change).
    forgets: AtomicU64,
    stripes: Vec<tokio::sync::Mutex<()>>,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            cache: parking_lot::Mutex::new(HashMap::new()),
            forgets: AtomicU64::new(0),
            stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
        }
    }
}

impl Store {
    /// The journal changed `channel`'s record: the cached copy goes.
    pub fn forget(&self, channel: &str) {
        self.forgets.fetch_add(1, Ordering::AcqRel);
        self.cache.lock().remove(channel);
    }

    /// The subscription of `channel`: the cached copy unless `fresh`, else
    /// (and when none is cached) read from the journal.
    ///
    /// # Errors
    /// [`JournalError`] when the journal cannot be read.
    pub async fn load(
        &self,
        app: &App,
        channel: &str,
        fresh: bool,
    ) -> Result<Held<Arc<Sub>>, JournalError> {
        if !fresh {
            if let Some(h) = self.cache.lock().get(channel) {
                return Ok(h.clone());
            }
        }
        let seen = self.forgets.load(Ordering::Acquire);
        let h = read::<Sub>(app, channel).await?;
        let h = Held {
            inc: h.inc,
            ver: h.ver,
            value: h.value.map(Arc::new),
        };
        let mut cache = self.cache.lock();
        if self.forgets.load(Ordering::Acquire) == seen {
            if cache.len() >= CACHED && !cache.contains_key(channel) {
                cache.clear();
            }
            cache.insert(channel.to_owned(), h.clone());
        }
        Ok(h)
    }

    /// Starts a change of the subscription on `channel` (read as
    /// [`Store::load`] does), one at a time on this node.
    ///
    /// # Errors
    /// As [`Store::load`].
    pub async fn begin<'a>(
        &'a self,
        app: &'a App,
        channel: String,
        fresh: bool,
    ) -> Result<Tx<'a>, JournalError> {
        let h = Sha256::digest(channel.as_bytes());
        let guard = self.stripes[usize::from(h[0]) % STRIPES].lock().await;
        let held = self.load(app, &channel, fresh).await?;
        Ok(Tx {
            store: self,
            app,
            channel,
            held,
            attempts: 0,
            _one_at_a_time: guard,
        })
    }
}

/// A change of one subscription:
///
/// ```text
/// let mut tx = store.begin(app, channel, fresh).await?;
/// loop {
///     let current = tx.current();          // None: no such subscription
///     … compute the new state (may await) …
///     if tx.write(new).await? { break }    // false: lost, compute again
/// }
/// ```
#[derive(Debug)]
pub struct Tx<'a> {
    store: &'a Store,
    app: &'a App,
    channel: String,
    held: Held<Arc<Sub>>,
    attempts: usize,
    _one_at_a_time: tokio::sync::MutexGuard<'a, ()>,
}

impl Tx<'_> {
    /// The subscription's state now (`None`: none, or deleted).
    pub fn current(&self) -> Option<Arc<Sub>> {
        self.held.value.clone()
    }

    /// Journals `new` (`None`: deleted) as the version after the one
    /// [`Tx::current`] holds. True: stored; false: another change came
    /// first, and [`Tx::current`] is now the journal's.
    ///
    /// # Errors
    /// [`JournalError`] when the journal fails, or `Unavailable` after
    /// [`ATTEMPTS`] lost races.
    pub async fn write(&mut self, new: Option<Sub>) -> Result<bool, JournalError> {
        self.attempts += 1;
        if self.attempts > ATTEMPTS {
            return Err(lost("the subscription"));
        }
        let held = Held {
            inc: self.held.inc,
            ver: self.held.ver,
            value: self.held.value.as_deref().cloned(),
        };
        let r = put(self.app, &self.channel, &held, new.as_ref()).await?;
        self.store.forget(&self.channel);
        let (won, now) = match r {
            Ok(now) => (true, now),
            Err(now) => (false, now),
        };
        self.held = Held {
            inc: now.inc,
            ver: now.ver,
            value: now.value.map(Arc::new),
        };
        Ok(won)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_names_are_short_reserved_and_differ_by_subscription() {
        let long = sub_channel(&"x".repeat(200), &"y".repeat(200));
        assert!(long.starts_with(SUB_PREFIX) && long.len() < 64, "{long}");
        assert_ne!(long, sub_channel(&"x".repeat(200), &"z".repeat(200)));
        assert_ne!(sub_channel("a", "b\nc"), sub_channel("a\nb", "c"));
        assert!(index_channel("v1/stream").starts_with(INDEX_PREFIX));
        assert!(gapless_protocol::name::validate_channel(&long).is_err());
    }
}
