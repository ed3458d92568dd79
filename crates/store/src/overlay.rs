//! What readers see beyond the indexed tables: for every channel appended to
//! since the last checkpoint, its bounds and the events still only in `log`
//! (see `log.rs`); for every channel whose metadata changed since, that
//! metadata ([`MetaTail`]).
//!
//! The writer adds to it after each commit that logged appends, and empties it
//! while holding the write lock across the checkpoint's commit; readers take
//! their redb snapshot while holding the read lock. A reader therefore pairs
//! the overlay with a snapshot of the tables that is exactly as far as the
//! overlay assumes: the tables hold every event of a channel up to the tail's
//! `base_head`, the overlay the rest; the tables hold a channel's metadata
//! as of the last checkpoint, the overlay any newer one.

use gapless_core::meta::ChannelMeta;
use gapless_core::ChannelState;
use gapless_protocol::{Epoch, Event};
use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A channel's metadata newer than the tables' (a change not yet
/// checkpointed).
#[derive(Debug, Clone)]
pub(crate) struct MetaTail {
    /// The WAL frame of the change (the checkpoint that applies it drops it).
    pub lsn: u64,
    /// The metadata after the change (`None`: removed).
    pub meta: Option<Arc<ChannelMeta>>,
}

/// Everything the overlay holds, behind one lock.
#[derive(Debug, Default)]
pub(crate) struct View {
    /// Events not yet in the tables, by channel name.
    pub tails: HashMap<Arc<str>, Tail>,
    /// Metadata not yet in the tables, by channel name.
    pub metas: HashMap<Arc<str>, MetaTail>,
}

impl View {
    /// Forgets everything (the tables hold it all).
    pub(crate) fn clear(&mut self) {
        self.tails.clear();
        self.metas.clear();
    }
}

/// A channel's events not yet in the tables.
#[derive(Debug)]
pub(crate) struct Tail {
    /// The channel's id.
    pub id: u64,
    /// The newest seq in the tables (the overlay holds `base_head + 1 ..= head`).
    pub base_head: u64,
    /// The channel's floor.
    pub floor: u64,
    /// The channel's head.
    pub head: u64,
    /// Events `base_head + 1 ..= head`, some possibly below `floor` already.
    pub events: Vec<Arc<Event>>,
}

impl Tail {
    /// The channel's bounds.
    pub(crate) fn state(&self, epoch: Epoch) -> ChannelState {
        ChannelState {
            epoch,
            floor: self.floor,
            head: self.head,
        }
    }
}

/// Tails and metadata by channel name ([`View`]).
#[derive(Debug, Default)]
pub(crate) struct Overlay {
    view: RwLock<View>,
}

impl Overlay {
    /// For readers.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, View> {
        self.view
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// For the writer.
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, View> {
        self.view
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Records channel `name`'s metadata after the change in WAL frame `lsn`
/// (`None`: removed), once that frame is durable.
pub(crate) fn set_meta(
    metas: &mut HashMap<Arc<str>, MetaTail>,
    name: &Arc<str>,
    lsn: u64,
    meta: Option<Arc<ChannelMeta>>,
) {
    metas.insert(name.clone(), MetaTail { lsn, meta });
}

/// Drops the metadata a checkpoint that applied every frame up to `applied`
/// put in the tables.
pub(crate) fn trim_metas(metas: &mut HashMap<Arc<str>, MetaTail>, applied: u64) {
    if !metas.is_empty() {
        metas.retain(|_, m| m.lsn > applied);
        shrink(metas);
    }
}

/// Gives back a map's room once it holds a quarter of it or less: a map
/// of what awaits a checkpoint grows with a burst of appends to many
/// channels (up to the backlog bound) and would otherwise keep that size.
pub(crate) fn shrink<K: Eq + std::hash::Hash, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 1024 && map.capacity() / 4 > map.len() {
        map.shrink_to(map.len() * 2);
    }
}

/// Adds a logged append to `tails`: `events` (`first_seq ..= state.head`) of
/// channel `name` (id `id`).
pub(crate) fn add(
    tails: &mut HashMap<Arc<str>, Tail>,
    name: &Arc<str>,
    id: u64,
    state: ChannelState,
    events: &[Arc<Event>],
) {
    let first_seq = state.head + 1 - events.len() as u64;
    let tail = tails.entry(name.clone()).or_insert_with(|| Tail {
        id,
        base_head: first_seq - 1,
        floor: state.floor,
        head: first_seq - 1,
        events: Vec::new(),
    });
    tail.floor = state.floor;
    tail.head = state.head;
    tail.events.extend(events.iter().cloned());
}

/// Drops from `tails` what a checkpoint applied to the tables: for each
/// channel in `applied`, its events up to that head; a tail the tables now
/// hold whole is removed.
pub(crate) fn trim(tails: &mut HashMap<Arc<str>, Tail>, applied: &HashMap<String, u64>) {
    for (name, &head) in applied {
        let Some(tail) = tails.get_mut(name.as_str()) else {
            continue;
        };
        if head > tail.base_head {
            let n = usize::try_from(head - tail.base_head).unwrap_or(usize::MAX);
            tail.events.drain(..n.min(tail.events.len()));
            tail.base_head = head;
        }
        if tail.base_head >= tail.head {
            tails.remove(name.as_str());
        }
    }
    shrink(tails);
}
