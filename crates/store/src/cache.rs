//! The writer thread's in-memory view of every channel: its id, head, floor
//! and last time (mirroring the `channels` table), plus an index of the oldest
//! retained event time per channel so that age eviction looks only at
//! channels that may have expired events.
//!
//! Only the writer thread owns it. It is loaded from the database when the
//! store opens, and again after a failed commit, so it never runs ahead of
//! what is on disk.

use crate::tables::{event_at, event_time, storage, ChannelRow, CHANNELS, EVENTS};
use gapless_core::{ChannelState, JournalError};
use gapless_protocol::Epoch;
use redb::{Database, ReadableDatabase, ReadableTable};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// One channel as the writer sees it.
#[derive(Debug, Clone)]
pub(crate) struct Channel {
    /// The channel's name, shared with the events built for the sink.
    pub name: Arc<str>,
    /// The persisted row.
    pub row: ChannelRow,
    /// A lower bound of the time of the event at the floor (`None` when no
    /// event is retained or ages are not tracked).
    oldest: Option<u64>,
}

impl Channel {
    /// The channel's bounds.
    pub(crate) fn state(&self, epoch: Epoch) -> ChannelState {
        ChannelState {
            epoch,
            floor: self.row.floor,
            head: self.row.head,
        }
    }
}

/// Every channel ever appended to.
pub(crate) struct Channels {
    map: HashMap<Arc<str>, Channel>,
    /// `(oldest time, name)` of channels with retained events (age retention only).
    expiry: BTreeSet<(u64, Arc<str>)>,
    next_id: u64,
    track_age: bool,
}

impl Channels {
    /// Loads every channel from `db`; `track_age` keeps the expiry index.
    pub(crate) fn load(db: &Database, track_age: bool) -> Result<Self, JournalError> {
        let txn = db.begin_read().map_err(storage)?;
        let channels = txn.open_table(CHANNELS).map_err(storage)?;
        let events = txn.open_table(EVENTS).map_err(storage)?;
        let mut out = Channels {
            map: HashMap::new(),
            expiry: BTreeSet::new(),
            next_id: 1,
            track_age,
        };
        for item in channels.iter().map_err(storage)? {
            let (name, row) = item.map_err(storage)?;
            let row = ChannelRow::from_tuple(row.value());
            let name: Arc<str> = Arc::from(name.value());
            out.next_id = out.next_id.max(row.id + 1);
            let oldest = if track_age && row.floor <= row.head {
                let first = event_at(&events, row.id, row.floor)?;
                // A missing row only makes the bound 0: eviction then rescans.
                Some(first.map_or(Ok(0), |e| event_time(&e))?)
            } else {
                None
            };
            out.map.insert(
                name.clone(),
                Channel {
                    name: name.clone(),
                    row,
                    oldest: None,
                },
            );
            out.set_oldest(&name, oldest);
        }
        Ok(out)
    }

    /// The channel, if it was ever appended to.
    pub(crate) fn get_mut(&mut self, name: &str) -> Option<&mut Channel> {
        self.map.get_mut(name)
    }

    /// The channel, created (with a new id, not yet persisted) if needed.
    pub(crate) fn get_or_create(&mut self, name: &str) -> &mut Channel {
        let next_id = &mut self.next_id;
        self.map.entry(Arc::from(name)).or_insert_with_key(|name| {
            let id = *next_id;
            *next_id += 1;
            Channel {
                name: name.clone(),
                row: ChannelRow {
                    id,
                    head: 0,
                    floor: 1,
                    last_time: 0,
                },
                oldest: None,
            }
        })
    }

    /// Sets the lower bound of the channel's oldest retained event time
    /// (`None`: nothing retained). No-op when ages are not tracked.
    pub(crate) fn set_oldest(&mut self, name: &str, oldest: Option<u64>) {
        if !self.track_age {
            return;
        }
        let Some(ch) = self.map.get_mut(name) else {
            return;
        };
        if ch.oldest == oldest {
            return;
        }
        if let Some(t) = ch.oldest {
            self.expiry.remove(&(t, ch.name.clone()));
        }
        if let Some(t) = oldest {
            self.expiry.insert((t, ch.name.clone()));
        }
        ch.oldest = oldest;
    }

    /// Channels whose oldest retained event may have `time <= cutoff`, oldest first.
    pub(crate) fn maybe_expired(&self, cutoff: u64) -> Vec<Arc<str>> {
        self.expiry
            .iter()
            .take_while(|(t, _)| *t <= cutoff)
            .map(|(_, name)| name.clone())
            .collect()
    }

    /// True when some channel's oldest retained event may have `time <= cutoff`.
    pub(crate) fn any_maybe_expired(&self, cutoff: u64) -> bool {
        self.expiry.first().is_some_and(|(t, _)| *t <= cutoff)
    }
}
