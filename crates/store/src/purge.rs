//! Purging a channel (`Journal::purge`): every event of the channel goes and
//! the channel gets an epoch of its own, kept in the `purged` table
//! (channel name -> epoch; a channel without a row has the store's epoch).
//!
//! The writer thread runs a purge alone, in its place among the requests,
//! so an append is wholly before it (and purged) or wholly after it (in the
//! new epoch). Before it, the writer makes every earlier commit durable and
//! has the checkpointer apply them all to the tables (`writer.rs`): no event
//! of the channel is left only in the write-ahead log or the overlay, and a
//! restart replays no WAL frame from before the purge (`meta["wal_applied"]`
//! is past them). Then one durable transaction deletes the channel's event
//! rows (single events and chunk rows alike) and idempotency keys, resets
//! its row to `head 0, floor 1` (its `last_time` stays: times never decrease
//! within a channel) and records the new epoch, so after a crash the purge
//! either happened whole or not at all.

use crate::cache::Channels;
use crate::overlay::Overlay;
use crate::tables::{storage, CHANNELS, EVENTS, KEYS, KEY_ORDER, PURGED};
use gapless_core::{ChannelState, JournalError};
use gapless_protocol::Epoch;
use redb::{Database, ReadableDatabase, ReadableTable, TableError};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// Per channel, the epoch its last purge began (shared by the writer, which
/// sets it after the purge commits and before it releases the overlay's
/// write lock, and the readers, which look it up under the overlay's read
/// lock: a read pairs the state and the epoch of the same side of a purge).
#[derive(Debug, Default)]
pub(crate) struct Epochs(RwLock<HashMap<Arc<str>, Epoch>>);

impl Epochs {
    /// Loads the `purged` table (none: a store never purged).
    pub(crate) fn load(db: &Database) -> Result<Self, JournalError> {
        let txn = db.begin_read().map_err(storage)?;
        let table = match txn.open_table(PURGED) {
            Ok(t) => t,
            Err(TableError::TableDoesNotExist(_)) => return Ok(Epochs::default()),
            Err(e) => return Err(storage(e)),
        };
        let mut map = HashMap::new();
        for item in table.iter().map_err(storage)? {
            let (name, epoch) = item.map_err(storage)?;
            map.insert(Arc::from(name.value()), Epoch(epoch.value()));
        }
        Ok(Epochs(RwLock::new(map)))
    }

    /// The epoch of `channel`: its purge's, else `store`.
    pub(crate) fn of(&self, channel: &str, store: Epoch) -> Epoch {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(channel)
            .copied()
            .unwrap_or(store)
    }

    /// Every purged channel's epoch (for the writer's cache).
    pub(crate) fn all(&self) -> HashMap<Arc<str>, Epoch> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set(&self, channel: Arc<str>, epoch: Epoch) {
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(channel, epoch);
    }
}

/// Purges `channel` in one durable transaction (see the module doc). The
/// caller (the writer) has made every earlier request durable and applied
/// it to the tables. Returns the channel's new state, `None` for a channel
/// never appended to (nothing changes).
pub(crate) fn purge(
    db: &Database,
    overlay: &Overlay,
    cache: &mut Channels,
    epochs: &Epochs,
    store_epoch: Epoch,
    channel: &str,
) -> Result<Option<ChannelState>, JournalError> {
    let Some(ch) = cache.get_mut(channel) else {
        return Ok(None);
    };
    let old = ch.state(store_epoch).epoch;
    let mut epoch = Epoch(crate::meta::fresh_epoch(Some(old.0)));
    while epoch == store_epoch {
        epoch = Epoch(crate::meta::fresh_epoch(Some(old.0)));
    }
    let (id, last_time) = (ch.row.id, ch.row.last_time);
    // Readers pair the overlay with a snapshot: both change together.
    let mut tails = overlay.write();
    let mut txn = db.begin_write().map_err(storage)?;
    txn.set_durability(redb::Durability::Immediate)
        .map_err(storage)?;
    {
        let mut events = txn.open_table(EVENTS).map_err(storage)?;
        events
            .retain_in((id, 0)..(id + 1, 0), |_, _| false)
            .map_err(storage)?;
        let mut keys = txn.open_table(KEYS).map_err(storage)?;
        keys.retain_in((id, "")..(id + 1, ""), |_, _| false)
            .map_err(storage)?;
        let mut order = txn.open_table(KEY_ORDER).map_err(storage)?;
        order
            .retain_in((id, 0, "")..(id + 1, 0, ""), |_, _| false)
            .map_err(storage)?;
        let mut channels = txn.open_table(CHANNELS).map_err(storage)?;
        channels
            .insert(channel, (id, 0, 1, last_time))
            .map_err(storage)?;
        let mut purged = txn.open_table(PURGED).map_err(storage)?;
        purged.insert(channel, epoch.0).map_err(storage)?;
    }
    txn.commit().map_err(storage)?;
    // The tables held every earlier event already: the overlay has nothing
    // of the channel's left, but a tail of it must not outlive the purge.
    tails.tails.remove(channel);
    let name = ch.name.clone();
    // Readers take the epoch under the overlay's read lock (`reader.rs`):
    // the new one is in place before they can see the purged tables.
    epochs.set(name.clone(), epoch);
    drop(tails);
    ch.row.head = 0;
    ch.row.floor = 1;
    ch.epoch = Some(epoch);
    if let Some(sizes) = ch.sizes.as_mut() {
        **sizes = crate::cache::Sizes::default();
    }
    cache.set_oldest(&name, None);
    Ok(Some(ChannelState::empty(epoch)))
}
