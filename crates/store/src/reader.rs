//! Reads, each in its own redb read transaction (a snapshot), concurrently
//! with the writer: a page's state and events always come from the same
//! committed snapshot.

use crate::tables::{decode_event, storage, ChannelRow, CHANNELS, EVENTS};
use gapless_core::{ChannelState, JournalError, Page};
use gapless_protocol::{Epoch, Event};
use redb::{Database, ReadableDatabase};
use std::sync::Arc;

/// The channel's bounds (empty for a channel never appended to).
pub(crate) fn state(
    db: &Database,
    epoch: Epoch,
    channel: &str,
) -> Result<ChannelState, JournalError> {
    let txn = db.begin_read().map_err(storage)?;
    let channels = txn.open_table(CHANNELS).map_err(storage)?;
    let row = channels.get(channel).map_err(storage)?;
    Ok(row.map_or(ChannelState::empty(epoch), |r| {
        to_state(epoch, ChannelRow::from_tuple(r.value()))
    }))
}

/// Up to `limit` events of `channel` with `seq > max(after, floor - 1)`, ascending.
pub(crate) fn page(
    db: &Database,
    epoch: Epoch,
    channel: &str,
    after: u64,
    limit: usize,
) -> Result<Page, JournalError> {
    let txn = db.begin_read().map_err(storage)?;
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
    let mut events = Vec::new();
    if limit == 0 || start > row.head {
        return Ok(Page { state, events });
    }
    let name: Arc<str> = Arc::from(channel);
    let table = txn.open_table(EVENTS).map_err(storage)?;
    let range = table
        .range((row.id, start)..=(row.id, row.head))
        .map_err(storage)?;
    let available = usize::try_from(row.head - start + 1).unwrap_or(usize::MAX);
    events.reserve(limit.min(available));
    for item in range.take(limit) {
        let (key, value) = item.map_err(storage)?;
        let (time, event_type, data) = decode_event(value.value())?;
        let seq = key.value().1;
        events.push(Arc::new(Event::new(
            name.clone(),
            epoch,
            seq,
            event_type,
            data,
            time,
        )));
    }
    Ok(Page { state, events })
}

fn to_state(epoch: Epoch, row: ChannelRow) -> ChannelState {
    ChannelState {
        epoch,
        floor: row.floor,
        head: row.head,
    }
}
