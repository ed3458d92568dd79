//! The write operations: an append is decided in memory (idempotency check,
//! seq assignment, retention by count and bytes, each channel's own) and
//! logged as a record (`log.rs`) in a WAL frame (`wal.rs`); a record is
//! applied to the tables at a checkpoint (`checkpoint.rs`); age eviction runs
//! on the tables once everything is applied. A metadata record
//! (`channel_meta.rs`) is applied to the `channel_meta` table at the same
//! checkpoint as the append it was written with. Appends and evictions return
//! what the sink must be told once they are durable. When the store opens,
//! [`enforce`] applies each channel's count and byte limits to the events it
//! already holds.

use crate::cache::Channels;
use crate::log::{self, MetaRecord, Record};
use crate::tables::{
    event_time, first_row, row_events, row_last, storage, ChannelRow, ChunkBuilder, CHANNELS,
    CHANNEL_META, EVENTS, KEYS, KEY_ORDER,
};
use gapless_core::journal::now_ms;
use gapless_core::meta::ChannelMeta;
use gapless_core::{Appended, ChannelState, JournalError};
use gapless_protocol::{Epoch, Event, NewEvent};
use redb::{Database, ReadTransaction, ReadableDatabase, ReadableTable, Table, WriteTransaction};
use std::collections::HashMap;
use std::sync::Arc;

/// What the sink is told about one operation after its transaction commits.
pub(crate) enum Notice {
    /// `CommitSink::committed`.
    Committed {
        /// The channel.
        channel: Arc<str>,
        /// Its id.
        id: u64,
        /// Its state right after the append.
        state: ChannelState,
        /// The appended events.
        events: Vec<Arc<Event>>,
    },
    /// `CommitSink::evicted`.
    Evicted {
        /// The channel.
        channel: Arc<str>,
        /// Its state after the eviction.
        state: ChannelState,
    },
    /// `CommitSink::meta_changed`, after the channel's metadata changed
    /// (`channel_meta.rs`); the readers' overlay gets `meta` first.
    Meta {
        /// The channel.
        channel: Arc<str>,
        /// Its metadata after the change (`None`: removed).
        meta: Option<Arc<ChannelMeta>>,
    },
}

/// The tables written by the operations, open in one write transaction.
pub(crate) struct Tables<'t> {
    channels: Table<'t, &'static str, (u64, u64, u64, u64)>,
    events: Table<'t, (u64, u64), &'static [u8]>,
    keys: Table<'t, (u64, &'static str), (u64, u64)>,
    key_order: Table<'t, (u64, u64, &'static str), ()>,
    /// Channel name -> metadata JSON (`channel_meta.rs`).
    channel_meta: Table<'t, &'static str, &'static [u8]>,
    /// The chunk row being built for each channel (by id), written when
    /// full or at [`Tables::finish`].
    chunks: HashMap<u64, ChunkBuilder>,
    /// Channel rows of the records applied since the last [`Tables::finish`],
    /// by id: `(name, row, floor before the first of those records)`.
    rows: HashMap<u64, (String, ChannelRow, u64)>,
}

/// What the operations need besides the tables.
pub(crate) struct Ctx<'a> {
    /// The store's epoch.
    pub epoch: Epoch,
    /// The writer's channel cache (updated as rows are written; it holds
    /// each channel's retention).
    pub cache: &'a mut Channels,
}

impl<'t> Tables<'t> {
    /// Opens the tables in `txn`.
    pub(crate) fn open(txn: &'t WriteTransaction) -> Result<Self, JournalError> {
        Ok(Tables {
            channels: txn.open_table(CHANNELS).map_err(storage)?,
            events: txn.open_table(EVENTS).map_err(storage)?,
            keys: txn.open_table(KEYS).map_err(storage)?,
            key_order: txn.open_table(KEY_ORDER).map_err(storage)?,
            channel_meta: txn.open_table(CHANNEL_META).map_err(storage)?,
            chunks: HashMap::new(),
            rows: HashMap::new(),
        })
    }

    /// Deletes the events of channel `id` in `from..to` and forgets the
    /// idempotency keys whose last event is below `to`.
    fn drop_below(&mut self, id: u64, from: u64, to: u64) -> Result<(), JournalError> {
        if from < to {
            // Rows wholly below the new floor (a chunk reaching past it stays:
            // readers skip its events below the floor). A row below `from`
            // can only be such a chunk, left by an earlier floor.
            self.events
                .retain_in((id, 0)..(id, to), |key, row| row_last(key.1, row) >= to)
                .map_err(storage)?;
        }
        let below = (id, 0, "")..(id, to, "");
        if self
            .key_order
            .range(below.clone())
            .map_err(storage)?
            .next()
            .is_none()
        {
            // The common case: no key to forget (a read, no page copied).
            return Ok(());
        }
        let mut gone = Vec::new();
        for item in self
            .key_order
            .extract_from_if(below, |_, _| true)
            .map_err(storage)?
        {
            let (key, _) = item.map_err(storage)?;
            let (_, last, key) = key.value();
            gone.push((last, key.to_owned()));
        }
        for (last, key) in gone {
            // A key used again since (its events gone by then) has a newer
            // entry: that one stays.
            let current = self.keys.get((id, key.as_str())).map_err(storage)?;
            if current.is_some_and(|seqs| seqs.value().1 == last) {
                self.keys.remove((id, key.as_str())).map_err(storage)?;
            }
        }
        Ok(())
    }

    /// Applies a logged append record: inserts its events and its
    /// idempotency key. The channel's row, and the deletion of what fell below
    /// its floor, are written by [`Tables::finish`], once per channel for all
    /// the records applied before it.
    pub(crate) fn apply(&mut self, rec: &Record<'_>) -> Result<(), JournalError> {
        let id = rec.id;
        let first_seq = rec.first_seq();
        let chunk = self.chunks.entry(id).or_default();
        for (seq, (event_type, data, binary)) in (first_seq..).zip(&rec.events) {
            if !chunk.takes(seq) {
                if chunk.n > 0 {
                    self.events
                        .insert((id, chunk.first), chunk.row.as_slice())
                        .map_err(storage)?;
                }
                chunk.start(seq);
            }
            chunk.push(rec.time, *event_type, data, *binary);
        }
        if let Some(key) = rec.key {
            self.keys
                .insert((id, key), (first_seq, rec.head))
                .map_err(storage)?;
            self.key_order
                .insert((id, rec.head, key), ())
                .map_err(storage)?;
        }
        let row = ChannelRow {
            id,
            head: rec.head,
            floor: rec.floor,
            last_time: rec.time,
        };
        match self.rows.get_mut(&id) {
            Some(entry) => entry.1 = row,
            None => {
                self.rows
                    .insert(id, (rec.name.to_owned(), row, rec.old_floor));
            }
        }
        Ok(())
    }

    /// Applies a logged metadata record: sets (or removes) the channel's
    /// `channel_meta` row. Records apply in log order, so the last change
    /// of a channel wins.
    pub(crate) fn apply_meta(&mut self, rec: &MetaRecord<'_>) -> Result<(), JournalError> {
        match rec.meta {
            Some(json) => {
                self.channel_meta.insert(rec.name, json).map_err(storage)?;
            }
            None => {
                self.channel_meta.remove(rec.name).map_err(storage)?;
            }
        }
        Ok(())
    }

    /// Writes the chunk rows and the channel rows of the records applied so
    /// far, and deletes the events and keys that fell below their floors.
    pub(crate) fn finish(&mut self) -> Result<(), JournalError> {
        for (id, chunk) in &mut self.chunks {
            if chunk.n > 0 {
                self.events
                    .insert((*id, chunk.first), chunk.row.as_slice())
                    .map_err(storage)?;
                chunk.n = 0;
            }
        }
        for (id, (name, row, old_floor)) in std::mem::take(&mut self.rows) {
            self.channels
                .insert(name.as_str(), row.to_tuple())
                .map_err(storage)?;
            if old_floor < row.floor {
                self.drop_below(id, old_floor, row.floor)?;
            }
        }
        Ok(())
    }

    /// Evicts events with `time <= now_ms - max_age_ms`, each channel by its
    /// own `max_age_ms` (see `Journal::evict_expired`).
    pub(crate) fn evict_expired(
        &mut self,
        cx: &mut Ctx<'_>,
        now_ms: u64,
    ) -> Result<Vec<Notice>, JournalError> {
        let mut notices = Vec::new();
        let due = cx.cache.maybe_expired(now_ms);
        if due.is_empty() {
            return Ok(notices);
        }
        self.finish()?;
        for name in due {
            let Some(ch) = cx.cache.get_mut(&name) else {
                continue;
            };
            let cutoff = now_ms.saturating_sub(ch.retention.max_age_ms);
            let (id, floor, head) = (ch.row.id, ch.row.floor, ch.row.head);
            let mut new_floor = head + 1;
            let mut oldest = None;
            let from = first_row(&self.events, id, floor)?;
            'rows: for item in self
                .events
                .range((id, from)..=(id, head))
                .map_err(storage)?
            {
                let (key, row) = item.map_err(storage)?;
                for event in row_events(key.value().1, row.value()) {
                    let (seq, event) = event?;
                    if seq < floor {
                        continue;
                    }
                    let time = event_time(event)?;
                    if time > cutoff {
                        new_floor = seq;
                        oldest = Some(time);
                        break 'rows;
                    }
                }
            }
            if new_floor > floor {
                ch.row.floor = new_floor;
                if let Some(sizes) = ch.sizes.as_mut() {
                    sizes.pop(new_floor - floor);
                }
                self.channels
                    .insert(&*ch.name, ch.row.to_tuple())
                    .map_err(storage)?;
                notices.push(Notice::Evicted {
                    channel: name.clone(),
                    state: ch.state(cx.epoch),
                });
                self.drop_below(id, floor, new_floor)?;
            }
            cx.cache.set_oldest(&name, oldest);
        }
        Ok(notices)
    }
}

/// True when an eviction at `now_ms` may have something to do (no transaction needed otherwise).
pub(crate) fn eviction_due(cx: &Ctx<'_>, now_ms: u64) -> bool {
    cx.cache.any_maybe_expired(now_ms)
}

/// Applies each channel's count and byte limits to the events it holds,
/// when the store opens: a limit lowered since they were appended (its
/// namespace's retention changed, and the server restarted) raises the
/// floor now, not at the channel's next append. One durable transaction;
/// nobody follows a channel yet, so no sink is told (a cursor below the
/// new floor gets the `evicted` gap as always). Retention by age follows
/// at the first eviction pass. Returns how many channels it trimmed.
///
/// # Errors
/// [`JournalError`] when the transaction fails (the store does not open then).
pub(crate) fn enforce(db: &Database, cache: &mut Channels) -> Result<usize, JournalError> {
    let mut due = Vec::new();
    for name in cache.names() {
        let Some(ch) = cache.get_mut(&name) else {
            continue;
        };
        let mut floor = ch.row.floor.max(ch.retention.count_floor(ch.row.head));
        if let Some(sizes) = ch.sizes.as_mut() {
            sizes.pop(floor - ch.row.floor);
            let over = sizes.over(ch.retention.max_bytes);
            sizes.pop(over);
            floor += over;
        }
        if floor > ch.row.floor {
            due.push((name, floor));
        }
    }
    if due.is_empty() {
        return Ok(0);
    }
    let txn = db.begin_write().map_err(storage)?;
    {
        let mut tables = Tables::open(&txn)?;
        for (name, floor) in &due {
            let Some(ch) = cache.get_mut(name) else {
                continue;
            };
            let old = ch.row.floor;
            ch.row.floor = *floor;
            tables
                .channels
                .insert(&*ch.name, ch.row.to_tuple())
                .map_err(storage)?;
            tables.drop_below(ch.row.id, old, *floor)?;
        }
    }
    txn.commit().map_err(storage)?;
    Ok(due.len())
}

/// Idempotency keys as the writer sees them: those not yet applied to the
/// tables, then the `idempotency_keys` table.
#[derive(Default)]
pub(crate) struct Keys {
    /// `(channel id, key)` -> `(first_seq, last_seq, lsn)`: keys of WAL
    /// frames (lsn) the tables do not hold yet.
    pub pending: HashMap<(u64, String), (u64, u64, u64)>,
}

impl Keys {
    /// Forgets the keys the tables hold (their frames up to `applied`).
    pub(crate) fn purge(&mut self, applied: u64) {
        self.pending.retain(|_, &mut (_, _, lsn)| lsn > applied);
        crate::overlay::shrink(&mut self.pending);
    }

    /// The seqs of `key` on channel `id`, if it is known and its events are
    /// still retained (`last_seq >= floor`). `snapshot` reads the tables as
    /// of the last commit (opened on first use).
    fn get(
        &self,
        db: &Database,
        snapshot: &mut Option<ReadTransaction>,
        id: u64,
        key: &str,
        floor: u64,
    ) -> Result<Option<(u64, u64)>, JournalError> {
        let found = match self.pending.get(&(id, key.to_owned())) {
            Some(&(first, last, _)) => Some((first, last)),
            None => {
                let txn = match snapshot {
                    Some(txn) => txn,
                    None => snapshot.insert(db.begin_read().map_err(storage)?),
                };
                let keys = txn.open_table(KEYS).map_err(storage)?;
                let seqs = keys.get((id, key)).map_err(storage)?.map(|g| g.value());
                seqs
            }
        };
        // Keys below the floor are deleted when the floor rises past them;
        // until a checkpoint applies that, they are skipped here.
        Ok(found.filter(|&(_, last)| last >= floor))
    }
}

/// What the writer needs to decide an append.
pub(crate) struct AppendCx<'a> {
    /// The database (for idempotency keys already in the tables).
    pub db: &'a Database,
    /// A read snapshot of the last commit, opened on first use.
    pub snapshot: &'a mut Option<ReadTransaction>,
    /// Keys logged since the last checkpoint.
    pub keys: &'a mut Keys,
    /// Where the append's record is written.
    pub record: &'a mut Vec<u8>,
    /// The WAL frame the record goes to.
    pub lsn: u64,
}

/// The seqs an append with `key` to `channel` was answered before (a
/// duplicate), if the key is known: checked before anything else about the
/// append, so a retry is answered so even after the channel was closed.
///
/// # Errors
/// [`JournalError::Storage`] when the key table cannot be read.
pub(crate) fn stored_before(
    cx: &mut Ctx<'_>,
    ax: &mut AppendCx<'_>,
    channel: &str,
    key: Option<&str>,
) -> Result<Option<Appended>, JournalError> {
    let Some(key) = key else {
        return Ok(None);
    };
    let ch = cx.cache.get_or_create(channel);
    let epoch = ch.state(cx.epoch).epoch;
    let known = ax
        .keys
        .get(ax.db, ax.snapshot, ch.row.id, key, ch.row.floor)?;
    Ok(known.map(|(first_seq, last_seq)| Appended {
        epoch,
        first_seq,
        last_seq,
        duplicate: true,
    }))
}
/// Decides an append to `channel` (see `Journal::append`): checks the
/// idempotency key ([`stored_before`]), assigns seqs and the time, applies count retention to the
/// cache, and writes the record to `ax.record` (nothing for a duplicate).
pub(crate) fn append(
    cx: &mut Ctx<'_>,
    ax: &mut AppendCx<'_>,
    channel: &str,
    events: Vec<NewEvent>,
    idempotency_key: Option<&str>,
) -> Result<(Appended, Option<Notice>), JournalError> {
    if let Some(appended) = stored_before(cx, ax, channel, idempotency_key)? {
        return Ok((appended, None));
    }
    let ch = cx.cache.get_or_create(channel);
    // The store's, or the channel's own since a purge (`purge.rs`).
    let epoch = ch.state(cx.epoch).epoch;
    let id = ch.row.id;
    let time = now_ms().max(ch.row.last_time);
    let first_seq = ch.row.head + 1;
    let head = ch.row.head + events.len() as u64;
    let old_floor = ch.row.floor;
    let mut floor = old_floor.max(ch.retention.count_floor(head));
    if let Some(sizes) = ch.sizes.as_mut() {
        for ev in &events {
            sizes.push(ev.data.len());
        }
        sizes.pop(floor - old_floor);
        let over = sizes.over(ch.retention.max_bytes);
        sizes.pop(over);
        floor += over;
    }
    log::put_header(
        ax.record,
        id,
        &ch.name,
        old_floor,
        head,
        floor,
        time,
        idempotency_key,
        events.len(),
    );
    let mut committed = Vec::with_capacity(events.len());
    for (seq, ev) in (first_seq..).zip(events) {
        log::put_event(ax.record, ev.event_type.as_deref(), &ev.data);
        let event = Event::new(ch.name.clone(), epoch, seq, ev.event_type, ev.data, time);
        committed.push(Arc::new(event));
    }
    if let Some(key) = idempotency_key {
        ax.keys
            .pending
            .insert((id, key.to_owned()), (first_seq, head, ax.lsn));
    }
    ch.row.head = head;
    ch.row.floor = floor;
    ch.row.last_time = time;
    let state = ch.state(epoch);
    let name = ch.name.clone();
    if head >= first_seq && floor >= first_seq {
        // Every retained event is from this append.
        cx.cache.set_oldest(&name, Some(time));
    }
    let appended = Appended {
        epoch,
        first_seq,
        last_seq: head,
        duplicate: false,
    };
    let notice = Notice::Committed {
        channel: name,
        id,
        state,
        events: committed,
    };
    Ok((appended, Some(notice)))
}
