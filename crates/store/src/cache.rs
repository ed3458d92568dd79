//! The writer thread's in-memory view of every channel: its id, head, floor
//! and last time (mirroring the `channels` table), its retention (its
//! namespace's), an index of when each channel's oldest retained event may
//! expire so that age eviction looks only at channels that may have expired
//! events, and, for channels with a byte limit, the data size of each
//! retained event (4 bytes per event), so that an append decides what the
//! limit evicts without reading the tables.
//!
//! Only the writer thread owns it. It is loaded from the database when the
//! store opens, and again after a failed commit, so it never runs ahead of
//! what is on disk.
//!
//! Each channel also has a [`MetaSlot`]: what the writer knows of its
//! metadata (`channel_meta.rs`). No metadata is read when the store opens:
//! a channel's is read from the `channel_meta` table the first time the
//! writer needs it (its first change, or its first append: a closed channel
//! refuses appends), and then known without a read until the cache is
//! loaded again. When the `channel_meta` table is empty every channel is
//! known to have none from the start.

use crate::tables::{
    data_len, event_at, event_time, first_row, row_events, storage, ChannelRow, CHANNELS,
    CHANNEL_META, EVENTS,
};
use gapless_core::meta::ChannelMeta;
use gapless_core::{ChannelState, JournalError, Namespaces, Retention};
use gapless_protocol::Epoch;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

/// One channel as the writer sees it.
#[derive(Debug, Clone)]
pub(crate) struct Channel {
    /// The channel's name, shared with the events built for the sink.
    pub name: Arc<str>,
    /// The persisted row.
    pub row: ChannelRow,
    /// The epoch its last purge began (`None`: the store's).
    pub epoch: Option<Epoch>,
    /// The channel's retention (its namespace's, resolved once).
    pub retention: Retention,
    /// With a byte limit: the data size of each retained event, from the
    /// floor to the head, and their sum.
    pub sizes: Option<Box<Sizes>>,
    /// A lower bound of the time of the event at the floor (`None` when no
    /// event is retained or ages are not tracked).
    oldest: Option<u64>,
    /// What the writer knows of its metadata.
    pub meta: MetaSlot,
}

/// What the writer knows of a channel's metadata (`channel_meta.rs`): 24
/// bytes in every channel's entry, and the metadata itself for the
/// channels whose metadata is [`MetaSlot::Held`] (a bounded number).
#[derive(Debug, Clone)]
pub(crate) enum MetaSlot {
    /// Not read yet: the `channel_meta` table says (it held every change
    /// when the cache was loaded, and no change was made since).
    Unknown,
    /// The channel has none.
    Absent,
    /// It has some, in the `channel_meta` table (not held, to bound the
    /// writer's memory); whether it is closed (so appends need no read).
    Stored {
        /// [`ChannelMeta::is_closed`].
        closed: bool,
    },
    /// Held: the metadata and the WAL frame of its last change here (0:
    /// read from the tables). Let go to [`MetaSlot::Stored`] only once the
    /// tables hold that frame.
    Held {
        /// The metadata.
        meta: Arc<ChannelMeta>,
        /// The WAL frame that wrote it (0: read from the tables).
        lsn: u64,
    },
}

/// The data sizes of a channel's retained events, oldest first (a size
/// above 4 GiB counts as 4 GiB), and their sum.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sizes {
    each: VecDeque<u32>,
    total: u64,
}

impl Sizes {
    /// Adds the newest event's size.
    pub(crate) fn push(&mut self, len: usize) {
        let len = u32::try_from(len).unwrap_or(u32::MAX);
        self.each.push_back(len);
        self.total += u64::from(len);
    }

    /// Forgets the `n` oldest events' sizes (the floor rose by `n`).
    pub(crate) fn pop(&mut self, n: u64) {
        for _ in 0..n {
            match self.each.pop_front() {
                Some(len) => self.total -= u64::from(len),
                None => return,
            }
        }
    }

    /// How many of the oldest events the byte limit `max` evicts: the data
    /// of the rest adds up to at most `max`, and the newest always stays.
    pub(crate) fn over(&self, max: u64) -> u64 {
        let mut total = self.total;
        let mut n = 0;
        for &len in &self.each {
            if total <= max || n + 1 >= self.each.len() {
                break;
            }
            total -= u64::from(len);
            n += 1;
        }
        n as u64
    }
}

impl Channel {
    /// The channel's bounds.
    /// `epoch` is the store's; a purged channel has its own.
    pub(crate) fn state(&self, epoch: Epoch) -> ChannelState {
        ChannelState {
            epoch: self.epoch.unwrap_or(epoch),
            floor: self.row.floor,
            head: self.row.head,
        }
    }
}

/// Every channel ever appended to.
pub(crate) struct Channels {
    map: HashMap<Arc<str>, Channel>,
    /// Channels whose metadata was made [`MetaSlot::Held`], oldest first
    /// (some perhaps no longer held, or twice): the ones let go first when
    /// too many are held (`channel_meta::bound`).
    pub held: VecDeque<Arc<str>>,
    /// `(when the oldest retained event may expire, name)` of channels with
    /// retained events and an age limit: the oldest time's lower bound plus
    /// the channel's `max_age_ms`.
    expiry: BTreeSet<(u64, Arc<str>)>,
    next_id: u64,
    /// Each channel's retention, by its namespace.
    namespaces: Arc<Namespaces>,
}

impl Channels {
    /// Loads every channel from `db`, each with the retention `namespaces`
    /// gives it: with an age limit, the time of its oldest retained event;
    /// with a byte limit, the size of each retained event (read from the
    /// tables: the data of those channels is read once here).
    pub(crate) fn load(db: &Database, namespaces: &Arc<Namespaces>) -> Result<Self, JournalError> {
        let txn = db.begin_read().map_err(storage)?;
        let channels = txn.open_table(CHANNELS).map_err(storage)?;
        let events = txn.open_table(EVENTS).map_err(storage)?;
        let purged = crate::purge::Epochs::load(db)?.all();
        // No metadata at all (a store from before it, or one without Durable
        // Streams): every channel is known to have none, without a read.
        let any_meta = match txn.open_table(CHANNEL_META) {
            Ok(t) => !t.is_empty().map_err(storage)?,
            Err(redb::TableError::TableDoesNotExist(_)) => false,
            Err(e) => return Err(storage(e)),
        };
        let slot = if any_meta {
            MetaSlot::Unknown
        } else {
            MetaSlot::Absent
        };
        let mut out = Channels {
            map: HashMap::new(),
            held: VecDeque::new(),
            expiry: BTreeSet::new(),
            next_id: 1,
            namespaces: namespaces.clone(),
        };
        for item in channels.iter().map_err(storage)? {
            let (name, row) = item.map_err(storage)?;
            let row = ChannelRow::from_tuple(row.value());
            let name: Arc<str> = Arc::from(name.value());
            let retention = namespaces.retention(&name);
            out.next_id = out.next_id.max(row.id + 1);
            let oldest = if retention.max_age_ms != 0 && row.floor <= row.head {
                // The floor's event may sit inside a chunk row (format 3).
                let first = event_at(&events, row.id, row.floor)?;
                // A missing row only makes the bound 0: eviction then rescans.
                Some(first.map_or(Ok(0), |e| event_time(&e))?)
            } else {
                None
            };
            let sizes = if retention.max_bytes != 0 {
                let mut sizes = Sizes::default();
                if row.floor <= row.head {
                    // From the row holding the floor's event (a chunk row
                    // may begin below the floor: its older events are not
                    // retained), each retained event of each row.
                    let from = first_row(&events, row.id, row.floor)?;
                    for item in events
                        .range((row.id, from)..=(row.id, row.head))
                        .map_err(storage)?
                    {
                        let (key, v) = item.map_err(storage)?;
                        for event in row_events(key.value().1, v.value()) {
                            let (seq, event) = event?;
                            if (row.floor..=row.head).contains(&seq) {
                                sizes.push(data_len(event)?);
                            }
                        }
                    }
                }
                Some(Box::new(sizes))
            } else {
                None
            };
            out.map.insert(
                name.clone(),
                Channel {
                    name: name.clone(),
                    row,
                    epoch: purged.get(&name).copied(),
                    retention,
                    sizes,
                    oldest: None,
                    meta: slot.clone(),
                },
            );
            out.set_oldest(&name, oldest);
        }
        Ok(out)
    }

    /// Every channel's name.
    pub(crate) fn names(&self) -> Vec<Arc<str>> {
        self.map.keys().cloned().collect()
    }

    /// The channel, if it was ever appended to.
    pub(crate) fn get_mut(&mut self, name: &str) -> Option<&mut Channel> {
        self.map.get_mut(name)
    }

    /// The channel, created (with a new id, not yet persisted) if needed.
    pub(crate) fn get_or_create(&mut self, name: &str) -> &mut Channel {
        let next_id = &mut self.next_id;
        let namespaces = &self.namespaces;
        self.map.entry(Arc::from(name)).or_insert_with_key(|name| {
            let id = *next_id;
            *next_id += 1;
            let retention = namespaces.retention(name);
            Channel {
                name: name.clone(),
                row: ChannelRow {
                    id,
                    head: 0,
                    floor: 1,
                    last_time: 0,
                },
                epoch: None,
                retention,
                sizes: (retention.max_bytes != 0).then(Box::default),
                oldest: None,
                // Every channel with metadata has a `channels` row, so is
                // loaded: a new one has none.
                meta: MetaSlot::Absent,
            }
        })
    }

    /// Sets the lower bound of the channel's oldest retained event time
    /// (`None`: nothing retained). No-op for a channel without an age limit.
    pub(crate) fn set_oldest(&mut self, name: &str, oldest: Option<u64>) {
        let Some(ch) = self.map.get_mut(name) else {
            return;
        };
        let age = ch.retention.max_age_ms;
        if age == 0 || ch.oldest == oldest {
            return;
        }
        if let Some(t) = ch.oldest {
            self.expiry
                .remove(&(t.saturating_add(age), ch.name.clone()));
        }
        if let Some(t) = oldest {
            self.expiry.insert((t.saturating_add(age), ch.name.clone()));
        }
        ch.oldest = oldest;
    }

    /// Channels whose oldest retained event may have expired at `now_ms`
    /// (its time plus the channel's `max_age_ms` is at or before it), the
    /// earliest due first.
    pub(crate) fn maybe_expired(&self, now_ms: u64) -> Vec<Arc<str>> {
        self.expiry
            .iter()
            .take_while(|(t, _)| *t <= now_ms)
            .map(|(_, name)| name.clone())
            .collect()
    }

    /// True when some channel's oldest retained event may have expired at `now_ms`.
    pub(crate) fn any_maybe_expired(&self, now_ms: u64) -> bool {
        self.expiry.first().is_some_and(|(t, _)| *t <= now_ms)
    }
}
