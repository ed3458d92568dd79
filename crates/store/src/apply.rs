//! The write operations, applied inside the writer's transaction: an append
//! (idempotency check, seq assignment, count retention) and age eviction.
//! Each returns what the sink must be told once the transaction commits.

use crate::cache::Channels;
use crate::tables::{encode_event, event_time, storage, CHANNELS, EVENTS, KEYS, KEY_ORDER};
use gapless_core::journal::now_ms;
use gapless_core::{Appended, ChannelState, JournalError, Retention};
use gapless_protocol::{Epoch, Event, NewEvent};
use redb::{ReadableTable, Table, WriteTransaction};
use std::sync::Arc;

/// What the sink is told about one operation after its transaction commits.
pub(crate) enum Notice {
    /// `CommitSink::committed`.
    Committed {
        /// The channel.
        channel: Arc<str>,
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
}

/// The tables written by the operations, open in one write transaction.
pub(crate) struct Tables<'t> {
    channels: Table<'t, &'static str, (u64, u64, u64, u64)>,
    events: Table<'t, (u64, u64), &'static [u8]>,
    keys: Table<'t, (u64, &'static str), (u64, u64)>,
    key_order: Table<'t, (u64, u64, &'static str), ()>,
}

/// What the operations need besides the tables.
pub(crate) struct Ctx<'a> {
    /// The store's epoch.
    pub epoch: Epoch,
    /// Retention limits.
    pub retention: Retention,
    /// The writer's channel cache (updated as rows are written).
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
        })
    }

    /// Deletes the events of channel `id` in `from..to` and forgets the
    /// idempotency keys whose last event is below `to`.
    fn drop_below(&mut self, id: u64, from: u64, to: u64) -> Result<(), JournalError> {
        if from < to {
            self.events
                .retain_in((id, from)..(id, to), |_, _| false)
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
            gone.push(key.value().2.to_owned());
        }
        for key in gone {
            self.keys.remove((id, key.as_str())).map_err(storage)?;
        }
        Ok(())
    }

    /// Appends `events` to `channel` (see `Journal::append`), applying count retention.
    pub(crate) fn append(
        &mut self,
        cx: &mut Ctx<'_>,
        channel: &str,
        events: Vec<NewEvent>,
        idempotency_key: Option<&str>,
    ) -> Result<(Appended, Option<Notice>), JournalError> {
        let epoch = cx.epoch;
        let ch = cx.cache.get_or_create(channel);
        let id = ch.row.id;
        if let Some(key) = idempotency_key {
            if let Some(seqs) = self.keys.get((id, key)).map_err(storage)? {
                let (first_seq, last_seq) = seqs.value();
                let appended = Appended {
                    epoch,
                    first_seq,
                    last_seq,
                    duplicate: true,
                };
                return Ok((appended, None));
            }
        }
        let time = now_ms().max(ch.row.last_time);
        let first_seq = ch.row.head + 1;
        let mut head = ch.row.head;
        let mut committed = Vec::with_capacity(events.len());
        for ev in events {
            head += 1;
            let row = encode_event(time, ev.event_type.as_deref(), &ev.data);
            self.events
                .insert((id, head), row.as_slice())
                .map_err(storage)?;
            let event = Event::new(ch.name.clone(), epoch, head, ev.event_type, ev.data, time);
            committed.push(Arc::new(event));
        }
        if let Some(key) = idempotency_key {
            self.keys
                .insert((id, key), (first_seq, head))
                .map_err(storage)?;
            self.key_order
                .insert((id, head, key), ())
                .map_err(storage)?;
        }
        let old_floor = ch.row.floor;
        let floor = old_floor.max(cx.retention.count_floor(head));
        ch.row.head = head;
        ch.row.floor = floor;
        ch.row.last_time = time;
        self.channels
            .insert(&*ch.name, ch.row.to_tuple())
            .map_err(storage)?;
        let state = ch.state(epoch);
        let name = ch.name.clone();
        self.drop_below(id, old_floor, floor)?;
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
            state,
            events: committed,
        };
        Ok((appended, Some(notice)))
    }

    /// Evicts events with `time <= now_ms - max_age_ms` (see `Journal::evict_expired`).
    pub(crate) fn evict_expired(
        &mut self,
        cx: &mut Ctx<'_>,
        now_ms: u64,
    ) -> Result<Vec<Notice>, JournalError> {
        let mut notices = Vec::new();
        if cx.retention.max_age_ms == 0 {
            return Ok(notices);
        }
        let cutoff = now_ms.saturating_sub(cx.retention.max_age_ms);
        for name in cx.cache.maybe_expired(cutoff) {
            let Some(ch) = cx.cache.get_mut(&name) else {
                continue;
            };
            let (id, floor, head) = (ch.row.id, ch.row.floor, ch.row.head);
            let mut new_floor = head + 1;
            let mut oldest = None;
            for item in self
                .events
                .range((id, floor)..=(id, head))
                .map_err(storage)?
            {
                let (key, row) = item.map_err(storage)?;
                let time = event_time(row.value())?;
                if time > cutoff {
                    new_floor = key.value().1;
                    oldest = Some(time);
                    break;
                }
            }
            if new_floor > floor {
                ch.row.floor = new_floor;
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
    cx.retention.max_age_ms != 0
        && cx
            .cache
            .any_maybe_expired(now_ms.saturating_sub(cx.retention.max_age_ms))
}
