//! Channel metadata ([`gapless_core::meta`]) in the embedded store: kept in
//! the channel's journal, decided and written by the writer thread with the
//! appends it guards. (Not the store's own identity: that is `meta.rs`.)
//!
//! - A change ([`gapless_core::Journal::change`]) is a request to the writer
//!   like an append. The writer decides it with [`meta::decide`] in its
//!   place among the batch's requests (so changes sent in order are decided
//!   in that order, and each sees the ones before it, through the writer's
//!   cache), and writes the decision's append record and a metadata record
//!   (`log.rs`) into the batch's WAL frame: a crash keeps both or neither.
//!   Its reply waits for that frame to be durable, like an append's; the
//!   sink hears `committed` for its events, then `meta_changed`.
//! - A plain append to a closed channel is refused
//!   ([`JournalError::ChannelClosed`]) by the writer, so it is before or
//!   after a concurrent close, never beside it. The check reads the writer's
//!   cache ([`MetaSlot`]): a channel without metadata pays a match on its
//!   slot, no read.
//! - Readers ([`read`]) take the metadata and the bounds together from the
//!   overlay (changes not yet checkpointed) and one snapshot of the tables,
//!   as the other reads do (`reader.rs`).
//! - The checkpointer applies metadata records to the `channel_meta` table
//!   (`apply.rs`); replaying the WAL at open does the same, deciding nothing
//!   again. A purge leaves the table alone: only [`Change::Delete`] removes
//!   a row.
//!
//! Memory: the writer reads a channel's metadata the first time it needs it,
//! never all of it at open. It holds at most about [`MAX_HELD`] channels'
//! metadata ([`MetaSlot::Held`]: the decoded [`ChannelMeta`], a few hundred
//! bytes with one producer); the others keep a 24-byte slot in their cache
//! entry ([`MetaSlot::Stored`] with whether they are closed, or
//! [`MetaSlot::Absent`]) and are read again from the tables at their next
//! change.

use crate::apply::{self, AppendCx, Ctx, Notice};
use crate::cache::{Channel, Channels, MetaSlot};
use crate::log;
use crate::overlay::Overlay;
use crate::reader::EpochOf;
use crate::request::Done;
use crate::tables::{corrupt, storage, ChannelRow, CHANNELS, CHANNEL_META};
use gapless_core::meta::{self, Change, Changed, ChannelMeta, Decision};
use gapless_core::{ChannelState, JournalError};
use redb::{Database, ReadTransaction, ReadableDatabase};
use std::sync::Arc;

/// About how many channels' metadata the writer holds decoded; past it the
/// oldest held are let go (to [`MetaSlot::Stored`]) once the tables hold
/// them.
pub(crate) const MAX_HELD: usize = 16_384;

/// Reads channel `name`'s metadata from the `channel_meta` table of
/// `snapshot` (opened from `db` on first use).
///
/// # Errors
/// [`JournalError::Storage`] when the read fails or the row does not decode.
fn stored(
    db: &Database,
    snapshot: &mut Option<ReadTransaction>,
    name: &str,
) -> Result<Option<ChannelMeta>, JournalError> {
    let txn = match snapshot {
        Some(txn) => txn,
        None => snapshot.insert(db.begin_read().map_err(storage)?),
    };
    table_meta(txn, name)
}

/// [`gapless_core::Journal::channels_with_meta`]: the overlay's changes
/// not yet checkpointed (a deletion there hides the table's row) over a
/// range of the `channel_meta` table, the snapshot taken under the
/// overlay's lock so nothing checkpointed in between is missed or doubled.
///
/// # Errors
/// [`JournalError::Storage`] when the tables cannot be read.
pub(crate) fn list(
    db: &Database,
    overlay: &Overlay,
    prefix: &str,
    limit: usize,
) -> Result<Vec<String>, JournalError> {
    let (txn, pending) = {
        let view = overlay.read();
        let pending: std::collections::BTreeMap<String, bool> = view
            .metas
            .iter()
            .filter(|(name, _)| name.starts_with(prefix))
            .map(|(name, m)| (name.to_string(), m.meta.is_some()))
            .collect();
        (db.begin_read().map_err(storage)?, pending)
    };
    let mut names: std::collections::BTreeSet<String> = pending
        .iter()
        .filter(|(_, live)| **live)
        .map(|(name, _)| name.clone())
        .collect();
    let table = match txn.open_table(CHANNEL_META) {
        Ok(t) => Some(t),
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(e) => return Err(storage(e)),
    };
    if let Some(table) = table {
        for row in table.range(prefix..).map_err(storage)? {
            let (name, _) = row.map_err(storage)?;
            let name = name.value();
            if !name.starts_with(prefix) || names.len() >= limit + pending.len() {
                break;
            }
            if !pending.contains_key(name) {
                names.insert(name.to_owned());
            }
        }
    }
    Ok(names.into_iter().take(limit).collect())
}

/// Channel `name`'s row of the `channel_meta` table in `txn` (none when the
/// table does not exist: a store from before metadata).
fn table_meta(txn: &ReadTransaction, name: &str) -> Result<Option<ChannelMeta>, JournalError> {
    let table = match txn.open_table(CHANNEL_META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(storage(e)),
    };
    let Some(row) = table.get(name).map_err(storage)? else {
        return Ok(None);
    };
    ChannelMeta::decode(row.value())
        .map(Some)
        .map_err(|_| corrupt("a channel's metadata does not decode"))
}

/// Whether a plain append to `channel` must be refused: its metadata is
/// closed. Reads the tables only the first time for a channel whose slot is
/// [`MetaSlot::Unknown`] (then remembers whether it is closed).
///
/// # Errors
/// [`JournalError::Storage`] when that read fails.
pub(crate) fn closed(
    cache: &mut Channels,
    ax: &mut AppendCx<'_>,
    channel: &str,
) -> Result<bool, JournalError> {
    let Some(ch) = cache.get_mut(channel) else {
        return Ok(false);
    };
    Ok(match &ch.meta {
        MetaSlot::Absent => false,
        MetaSlot::Stored { closed } => *closed,
        MetaSlot::Held { meta, .. } => meta.is_closed(),
        MetaSlot::Unknown => {
            let read = stored(ax.db, ax.snapshot, channel)?;
            let closed = read.as_ref().is_some_and(ChannelMeta::is_closed);
            ch.meta = match read {
                Some(_) => MetaSlot::Stored { closed },
                None => MetaSlot::Absent,
            };
            closed
        }
    })
}

/// The metadata of `ch`, read from the tables if not held (then held).
/// Returns it and whether it was read now (to be queued in
/// [`Channels::held`]).
fn held_meta(
    ch: &mut Channel,
    ax: &mut AppendCx<'_>,
) -> Result<(Option<Arc<ChannelMeta>>, bool), JournalError> {
    match &ch.meta {
        MetaSlot::Absent => Ok((None, false)),
        MetaSlot::Held { meta, .. } => Ok((Some(meta.clone()), false)),
        MetaSlot::Unknown | MetaSlot::Stored { .. } => {
            match stored(ax.db, ax.snapshot, &ch.name)? {
                Some(m) => {
                    let m = Arc::new(m);
                    ch.meta = MetaSlot::Held {
                        meta: m.clone(),
                        lsn: 0,
                    };
                    Ok((Some(m), true))
                }
                None => {
                    ch.meta = MetaSlot::Absent;
                    Ok((None, false))
                }
            }
        }
    }
}

/// Decides `change` to `channel` (see the module doc) against the writer's
/// cache, writing its records to `ax.record` (WAL frame `ax.lsn`). Returns
/// the reply and what the sink and the overlay are told once the frame is
/// durable (nothing for a change that writes nothing).
///
/// # Errors
/// [`JournalError::Storage`] when the tables cannot be read; the batch
/// fails then (the cache may be ahead of what is written).
pub(crate) fn change(
    cx: &mut Ctx<'_>,
    ax: &mut AppendCx<'_>,
    channel: &str,
    change: Change,
) -> Result<(Done, Vec<Notice>), JournalError> {
    // A channel the cache lacks has no row, so no metadata (every channel
    // with metadata has a row).
    let (current, state) = match cx.cache.get_mut(channel) {
        None => (None, ChannelState::empty(cx.epoch)),
        Some(ch) => {
            let (m, read) = held_meta(ch, ax)?;
            let (state, name) = (ch.state(cx.epoch), ch.name.clone());
            if read {
                cx.cache.held.push_back(name);
            }
            (m, state)
        }
    };
    let (events, key, next, outcome) = match meta::decide(current.as_deref(), state, change) {
        Decision::Nothing(outcome) => {
            let changed = Changed {
                outcome,
                meta: current,
                state,
            };
            return Ok((Done::Changed(Box::new(changed)), Vec::new()));
        }
        Decision::Write {
            events,
            key,
            meta,
            outcome,
        } => (events, key, meta, outcome),
    };
    let mut notices = Vec::with_capacity(2);
    let appended = if events.is_empty() {
        // A row-only record: the channel gets its `channels` row with its
        // metadata, at the same checkpoint.
        let ch = cx.cache.get_or_create(channel);
        let row = ch.row;
        log::put_header(
            ax.record,
            row.id,
            &ch.name,
            row.floor,
            row.head,
            row.floor,
            row.last_time,
            None,
            0,
        );
        None
    } else {
        let (appended, notice) = apply::append(cx, ax, channel, events, key.as_deref())?;
        notices.extend(notice);
        Some(appended)
    };
    let ch = cx.cache.get_or_create(channel);
    let next = next.map(Arc::new);
    let json = next.as_ref().map(|m| m.encode());
    log::put_meta(ax.record, &ch.name, json.as_deref());
    ch.meta = match &next {
        Some(m) => MetaSlot::Held {
            meta: m.clone(),
            lsn: ax.lsn,
        },
        None => MetaSlot::Absent,
    };
    let (name, state) = (ch.name.clone(), ch.state(cx.epoch));
    if next.is_some() {
        cx.cache.held.push_back(name.clone());
    }
    notices.push(Notice::Meta {
        channel: name,
        meta: next.clone(),
    });
    let changed = Changed {
        outcome: meta::with_appended(outcome, appended),
        meta: next,
        state,
    };
    Ok((Done::Changed(Box::new(changed)), notices))
}

/// Lets go of the oldest held metadata while more than [`MAX_HELD`]
/// channels' is held: each becomes [`MetaSlot::Stored`] if the tables hold
/// its last change (its frame is at or below `applied`), else waits for a
/// later call. Looks at no more than twice the excess entries per call.
pub(crate) fn bound(cache: &mut Channels, applied: u64) {
    let held = &mut cache.held;
    if held.capacity() > 4 * MAX_HELD && held.capacity() / 4 > held.len() {
        held.shrink_to(held.len() * 2);
    }
    let excess = cache.held.len().saturating_sub(MAX_HELD);
    for _ in 0..excess.saturating_mul(2) {
        if cache.held.len() <= MAX_HELD {
            return;
        }
        let Some(name) = cache.held.pop_front() else {
            return;
        };
        let Some(ch) = cache.get_mut(&name) else {
            continue;
        };
        if let MetaSlot::Held { meta, lsn } = &ch.meta {
            if *lsn <= applied {
                ch.meta = MetaSlot::Stored {
                    closed: meta.is_closed(),
                };
            } else {
                // Only the WAL and the overlay have it yet.
                cache.held.push_back(name);
            }
        }
    }
}

/// The metadata of `channel` and its bounds, read together (see
/// `Journal::meta`): from the overlay where it holds them (changes and
/// appends not yet checkpointed), else from one snapshot of the tables
/// taken under the overlay's read lock.
///
/// # Errors
/// [`JournalError::Storage`] when the tables cannot be read or a row does
/// not decode.
pub(crate) fn read(
    db: &Database,
    overlay: &Overlay,
    epoch_of: EpochOf,
    channel: &str,
) -> Result<(Option<ChannelMeta>, ChannelState), JournalError> {
    let (txn, meta, state, epoch) = {
        let view = overlay.read();
        let epoch = epoch_of.of(channel);
        let state = view.tails.get(channel).map(|t| t.state(epoch));
        let meta = view.metas.get(channel).map(|m| m.meta.clone());
        if let (Some(meta), Some(state)) = (&meta, state) {
            return Ok((meta.as_deref().cloned(), state));
        }
        (db.begin_read().map_err(storage)?, meta, state, epoch)
    };
    let meta = match meta {
        Some(m) => m.as_deref().cloned(),
        None => table_meta(&txn, channel)?,
    };
    let state = match state {
        Some(s) => s,
        None => {
            let channels = txn.open_table(CHANNELS).map_err(storage)?;
            let row = channels.get(channel).map_err(storage)?;
            row.map_or(ChannelState::empty(epoch), |r| {
                let row = ChannelRow::from_tuple(r.value());
                ChannelState {
                    epoch,
                    floor: row.floor,
                    head: row.head,
                }
            })
        }
    };
    Ok((meta, state))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gapless_core::Namespaces;

    fn meta() -> Arc<ChannelMeta> {
        let json = br#"{"incarnation":1,"content_type":"text/plain","life":"closed","layout":{"offset_epoch":1,"channel_epoch":1,"base":0,"origin":0}}"#;
        Arc::new(ChannelMeta::decode(json).expect("metadata"))
    }

    /// Past [`MAX_HELD`], the oldest held metadata the tables hold is let
    /// go (its closed flag kept); metadata only the log holds stays.
    #[test]
    fn held_metadata_is_bounded_and_only_what_the_tables_hold_is_let_go() -> Result<(), JournalError>
    {
        assert_eq!(std::mem::size_of::<MetaSlot>(), 24, "the slot's cost");
        let dir = tempfile::tempdir().map_err(storage)?;
        let db = Database::create(dir.path().join("j.redb")).map_err(storage)?;
        crate::meta::init(&db, crate::Durability::Sync)?;
        let mut cache = Channels::load(&db, &Arc::new(Namespaces::default()))?;
        let names: Vec<String> = (0..MAX_HELD + 10).map(|i| format!("c{i}")).collect();
        for (i, name) in names.iter().enumerate() {
            let ch = cache.get_or_create(name);
            // The first five were changed in frames the tables lack.
            let lsn = if i < 5 { 100 } else { 0 };
            ch.meta = MetaSlot::Held { meta: meta(), lsn };
            let name = ch.name.clone();
            cache.held.push_back(name);
        }
        bound(&mut cache, 50);
        assert_eq!(cache.held.len(), MAX_HELD);
        let mut slots = names
            .iter()
            .map(|n| cache.get_mut(n).map(|c| c.meta.clone()));
        for _ in 0..5 {
            assert!(matches!(
                slots.next(),
                Some(Some(MetaSlot::Held { lsn: 100, .. }))
            ));
        }
        for _ in 0..10 {
            assert!(matches!(
                slots.next(),
                Some(Some(MetaSlot::Stored { closed: true }))
            ));
        }
        assert!(slots.all(|s| matches!(s, Some(MetaSlot::Held { lsn: 0, .. }))));
        Ok(())
    }
}
