//! Reads, concurrently with the writer: each pairs a redb read transaction (a
//! snapshot of the tables) with the overlay of events not yet in them (see
//! `overlay.rs`), taken together under the overlay's read lock, so a page's
//! state and events always come from the same commit.

use crate::overlay::Overlay;
use crate::purge::Epochs;
use crate::tables::{
    corrupt, decode_event, event_time, first_row, row_events, storage, ChannelRow, CHANNELS, EVENTS,
};
use gapless_core::{ChannelState, JournalError, Page, TimeSeek};
use gapless_protocol::{Epoch, Event};
use redb::{Database, ReadTransaction, ReadableDatabase};
use std::sync::Arc;

/// Where a read takes its channel's epoch: the purged channels' epochs
/// (`purge.rs`), else the store's. It is looked up under the overlay's read
/// lock, with the snapshot: a purge sets the new epoch before it releases
/// the overlay's write lock, so a read never pairs an epoch with the state
/// of another (the old epoch with the purged channel, or the reverse).
#[derive(Clone)]
pub(crate) struct EpochOf {
    /// Purged channels' epochs (`None`: the store's for every channel).
    pub epochs: Option<Arc<Epochs>>,
    /// The store's epoch.
    pub store: Epoch,
}

impl EpochOf {
    /// The epoch of `channel`; call it under the overlay's read lock.
    pub(crate) fn of(&self, channel: &str) -> Epoch {
        match &self.epochs {
            Some(epochs) => epochs.of(channel, self.store),
            None => self.store,
        }
    }
}

impl From<Epoch> for EpochOf {
    fn from(store: Epoch) -> Self {
        EpochOf {
            epochs: None,
            store,
        }
    }
}

/// The channel's bounds (empty for a channel never appended to).
pub(crate) fn state(
    db: &Database,
    overlay: &Overlay,
    epoch: impl Into<EpochOf>,
    channel: &str,
) -> Result<ChannelState, JournalError> {
    let epoch_of = epoch.into();
    let (txn, epoch) = {
        let view = overlay.read();
        let tails = &view.tails;
        let epoch = epoch_of.of(channel);
        if let Some(tail) = tails.get(channel) {
            return Ok(tail.state(epoch));
        }
        (db.begin_read().map_err(storage)?, epoch)
    };
    let channels = txn.open_table(CHANNELS).map_err(storage)?;
    let row = channels.get(channel).map_err(storage)?;
    Ok(row.map_or(ChannelState::empty(epoch), |r| {
        to_state(epoch, ChannelRow::from_tuple(r.value()))
    }))
}

/// How much one read may return: at most `limit` events, and no event after
/// the data has passed `max_bytes` (the first is always returned).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bound {
    pub limit: usize,
    pub max_bytes: usize,
}

/// Events of `channel` with `seq > max(after, floor - 1)`, ascending, within `bound`.
pub(crate) fn page(
    db: &Database,
    overlay: &Overlay,
    epoch: impl Into<EpochOf>,
    channel: &str,
    after: u64,
    bound: Bound,
) -> Result<Page, JournalError> {
    let limit = bound.limit;
    let epoch_of = epoch.into();
    let (txn, tail, epoch) = {
        let view = overlay.read();
        let tails = &view.tails;
        let epoch = epoch_of.of(channel);
        let (txn, tail) = match tails.get(channel) {
            Some(tail) => {
                let state = tail.state(epoch);
                let start = after.max(tail.floor.saturating_sub(1)).saturating_add(1);
                if limit == 0 || start > tail.head {
                    return Ok(Page {
                        state,
                        events: Vec::new(),
                    });
                }
                // The overlay's part: seqs max(start, base_head + 1) ..= head.
                let skip =
                    usize::try_from(start.saturating_sub(tail.base_head + 1)).unwrap_or(usize::MAX);
                let from_tables = usize::try_from((tail.base_head + 1).saturating_sub(start))
                    .unwrap_or(usize::MAX);
                let mut mine: Vec<Arc<Event>> = tail
                    .events
                    .iter()
                    .skip(skip)
                    .take(limit.saturating_sub(from_tables))
                    .cloned()
                    .collect();
                if from_tables == 0 {
                    gapless_core::journal::cut_to_bytes(&mut mine, bound.max_bytes);
                    return Ok(Page {
                        state,
                        events: mine,
                    });
                }
                let txn = db.begin_read().map_err(storage)?;
                (txn, Some((tail.id, tail.base_head, start, state, mine)))
            }
            None => (db.begin_read().map_err(storage)?, None),
        };
        (txn, tail, epoch)
    };
    let name: Arc<str> = Arc::from(channel);
    if let Some((id, base_head, start, state, mine)) = tail {
        let mut events = read_events(&txn, &name, epoch, id, start, base_head, bound)?;
        // The overlay continues the tables' part only if that part is whole.
        let whole = events.len() as u64 == base_head + 1 - start;
        if whole {
            events.extend(mine);
            gapless_core::journal::cut_to_bytes(&mut events, bound.max_bytes);
        }
        return Ok(Page { state, events });
    }
    let channels = txn.open_table(CHANNELS).map_err(storage)?;
    let Some(row) = channels.get(channel).map_err(storage)? else {
        return Ok(Page {
            state: ChannelState::empty(epoch),
            events: Vec::new(),
        });
    };
    let row = ChannelRow::from_tuple(row.value());
    let state = to_state(epoch, row);
    let start = after.max(row.floor.saturating_sub(1)).saturating_add(1);
    if limit == 0 || start > row.head {
        return Ok(Page {
            state,
            events: Vec::new(),
        });
    }
    let events = read_events(&txn, &name, epoch, row.id, start, row.head, bound)?;
    Ok(Page { state, events })
}

/// Events of channel `id` in `start..=end` from the tables, within `bound`:
/// rows are read until the data passes `bound.max_bytes`, no further.
fn read_events(
    txn: &ReadTransaction,
    name: &Arc<str>,
    epoch: Epoch,
    id: u64,
    start: u64,
    end: u64,
    bound: Bound,
) -> Result<Vec<Arc<Event>>, JournalError> {
    let limit = bound.limit;
    let mut bytes = 0usize;
    let mut events = Vec::new();
    if limit == 0 || start > end {
        return Ok(events);
    }
    let table = txn.open_table(EVENTS).map_err(storage)?;
    let from = first_row(&table, id, start)?;
    let range = table.range((id, from)..=(id, end)).map_err(storage)?;
    let available = usize::try_from(end - start + 1).unwrap_or(usize::MAX);
    events.reserve(limit.min(available));
    'rows: for item in range {
        let (key, row) = item.map_err(storage)?;
        for event in row_events(key.value().1, row.value()) {
            let (seq, event) = event?;
            if seq < start {
                continue;
            }
            if seq > end || events.len() >= limit {
                break 'rows;
            }
            let (time, event_type, data) = decode_event(event)?;
            bytes = bytes.saturating_add(data.len());
            if !events.is_empty() && bytes > bound.max_bytes {
                break 'rows;
            }
            events.push(Arc::new(Event::new(
                name.clone(),
                epoch,
                seq,
                event_type,
                data,
                time,
            )));
        }
    }
    Ok(events)
}

/// The first retained event of `channel` at or after `time_ms` (see
/// `Journal::seek_time`): a binary search over seqs, in the overlay's events
/// (in memory) and then, only when the answer may be older than all of
/// them, over the tables' rows (one lookup of an event's time per step,
/// about 17 for 100,000 retained events).
pub(crate) fn seek_time(
    db: &Database,
    overlay: &Overlay,
    epoch: impl Into<EpochOf>,
    channel: &str,
    time_ms: u64,
) -> Result<TimeSeek, JournalError> {
    let epoch_of = epoch.into();
    let (txn, overlaid, epoch) = {
        let view = overlay.read();
        let tails = &view.tails;
        let epoch = epoch_of.of(channel);
        let (txn, overlaid) = match tails.get(channel) {
            Some(tail) => {
                let state = tail.state(epoch);
                let head_time = tail.events.last().map_or(0, |e| e.time);
                // The overlay's retained events: seqs max(floor, base_head + 1) ..= head.
                let skip = usize::try_from(tail.floor.saturating_sub(tail.base_head + 1))
                    .unwrap_or(usize::MAX)
                    .min(tail.events.len());
                let mine = &tail.events[skip..];
                let i = mine.partition_point(|e| e.time < time_ms);
                let found = TimeSeek {
                    state,
                    seq: mine.get(i).map_or(state.head + 1, |e| e.seq),
                    head_time,
                };
                // The tables hold no retained event, or one of the overlay's
                // is older than the time (so every event in the tables is).
                if tail.floor > tail.base_head || i > 0 {
                    return Ok(found);
                }
                let txn = db.begin_read().map_err(storage)?;
                (txn, Some((tail.id, tail.floor, tail.base_head, found)))
            }
            None => (db.begin_read().map_err(storage)?, None),
        };
        (txn, overlaid, epoch)
    };
    let (id, floor, end, found) = match overlaid {
        Some(o) => o,
        None => {
            let channels = txn.open_table(CHANNELS).map_err(storage)?;
            let Some(row) = channels.get(channel).map_err(storage)? else {
                let state = ChannelState::empty(epoch);
                return Ok(TimeSeek {
                    state,
                    seq: state.head + 1,
                    head_time: 0,
                });
            };
            let row = ChannelRow::from_tuple(row.value());
            let found = TimeSeek {
                state: to_state(epoch, row),
                seq: row.head + 1,
                head_time: row.last_time,
            };
            (row.id, row.floor, row.head, found)
        }
    };
    if floor > end {
        return Ok(found);
    }
    // The first seq in floor ..= end whose time is at or after `time_ms`,
    // else `end + 1` (which `found.seq` already is).
    let table = txn.open_table(EVENTS).map_err(storage)?;
    let (mut lo, mut hi) = (floor, end + 1);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if time_at(&table, id, mid)? < time_ms {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    Ok(if lo <= end {
        TimeSeek { seq: lo, ..found }
    } else {
        found
    })
}

/// The time of retained event `seq` of channel `id`, from the row that
/// holds it: its own, or a chunk row that begins at or before it (format 3).
fn time_at(
    table: &redb::ReadOnlyTable<(u64, u64), &'static [u8]>,
    id: u64,
    seq: u64,
) -> Result<u64, JournalError> {
    let first = first_row(table, id, seq)?;
    let row = table
        .get((id, first))
        .map_err(storage)?
        .ok_or_else(|| corrupt("a retained event is missing"))?;
    for event in row_events(first, row.value()) {
        let (at, event) = event?;
        if at == seq {
            return event_time(event);
        }
    }
    Err(corrupt("a retained event is missing"))
}

fn to_state(epoch: Epoch, row: ChannelRow) -> ChannelState {
    ChannelState {
        epoch,
        floor: row.floor,
        head: row.head,
    }
}
