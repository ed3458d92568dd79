//! The in-memory journal (`gapless serve --memory`): same contract as the
//! durable store, nothing on disk. Its epoch is drawn at random when it is
//! created, so a restarted `--memory` server tells every returning client that
//! history was lost (gap reason `epoch`).

use crate::journal::{
    Appended, ChannelState, CommitSink, Journal, JournalError, Page, Retention, TimeSeek,
};
use crate::meta::{self, Change, Changed, ChannelMeta, Decision};
use crate::namespace::Namespaces;
use async_trait::async_trait;
use gapless_protocol::{Epoch, Event, NewEvent};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A journal held in memory.
pub struct MemoryJournal {
    epoch: Epoch,
    /// The retention of each channel (by its namespace).
    namespaces: Arc<Namespaces>,
    sink: Arc<dyn CommitSink>,
    channels: Mutex<HashMap<Arc<str>, ChannelLog>>,
    /// Set by [`Journal::close`]: appends are refused with
    /// [`JournalError::Closed`] from then on (reads still work).
    closed: AtomicBool,
}

impl std::fmt::Debug for MemoryJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryJournal").finish_non_exhaustive()
    }
}

struct ChannelLog {
    name: Arc<str>,
    /// The channel's epoch: the journal's, or the one its last purge began.
    epoch: Epoch,
    /// Whether `epoch` began with a purge (its fork point is seq 0).
    purged: bool,
    head: u64,
    last_time: u64,
    /// This channel's retention (its namespace's, resolved once).
    retention: Retention,
    events: VecDeque<Arc<Event>>,
    /// Bytes of data of `events`.
    bytes: u64,
    /// idempotency key -> (first_seq, last_seq)
    keys: HashMap<String, (u64, u64)>,
    /// (last_seq, key) in append order, to forget keys as events are evicted
    key_order: VecDeque<(u64, String)>,
    /// The channel's metadata ([`crate::meta`]), if it has any.
    meta: Option<ChannelMeta>,
}

impl ChannelLog {
    fn state(&self) -> ChannelState {
        ChannelState {
            epoch: self.epoch,
            floor: self.events.front().map_or(self.head + 1, |e| e.seq),
            head: self.head,
        }
    }

    fn evict_to(&mut self, floor: u64) -> bool {
        let mut changed = false;
        while self.events.front().is_some_and(|e| e.seq < floor) {
            if let Some(e) = self.events.pop_front() {
                self.bytes -= e.data.len() as u64;
            }
            changed = true;
        }
        while self.key_order.front().is_some_and(|(s, _)| *s < floor) {
            if let Some((_, k)) = self.key_order.pop_front() {
                self.keys.remove(&k);
            }
        }
        changed
    }
}

impl MemoryJournal {
    /// A new, empty journal with a random epoch and one retention for
    /// every channel.
    pub fn new(retention: Retention, sink: Arc<dyn CommitSink>) -> Self {
        Self::with_namespaces(Arc::new(Namespaces::uniform(retention)), sink)
    }

    /// A new, empty journal with a random epoch; each channel has the
    /// retention of its namespace.
    pub fn with_namespaces(namespaces: Arc<Namespaces>, sink: Arc<dyn CommitSink>) -> Self {
        MemoryJournal {
            epoch: Epoch(rand::random::<u64>() | 1),
            namespaces,
            sink,
            channels: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
        }
    }

    /// This journal's epoch.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }
}

impl MemoryJournal {
    /// The log of `channel`, made empty when it has none.
    fn log_of<'a>(
        &self,
        map: &'a mut HashMap<Arc<str>, ChannelLog>,
        channel: &str,
    ) -> &'a mut ChannelLog {
        if !map.contains_key(channel) {
            let name: Arc<str> = Arc::from(channel);
            let retention = self.namespaces.retention(channel);
            map.insert(
                name.clone(),
                ChannelLog {
                    name,
                    epoch: self.epoch,
                    purged: false,
                    head: 0,
                    last_time: 0,
                    retention,
                    events: VecDeque::new(),
                    bytes: 0,
                    keys: HashMap::new(),
                    key_order: VecDeque::new(),
                    meta: None,
                },
            );
        }
        // Inserted just above when it was missing.
        map.get_mut(channel).expect("the channel's log exists")
    }

    /// Appends `events` to `log` under the channels' lock (the sink sees
    /// them in seq order).
    fn append_locked(
        &self,
        log: &mut ChannelLog,
        events: Vec<NewEvent>,
        idempotency_key: Option<&str>,
    ) -> Appended {
        let channel = log.name.clone();
        if let Some(k) = idempotency_key {
            if let Some(&(first_seq, last_seq)) = log.keys.get(k) {
                return Appended {
                    epoch: log.epoch,
                    first_seq,
                    last_seq,
                    duplicate: true,
                };
            }
        }
        let time = crate::journal::now_ms().max(log.last_time);
        log.last_time = time;
        let first_seq = log.head + 1;
        let mut committed = Vec::with_capacity(events.len());
        for ev in events {
            log.head += 1;
            let e = Arc::new(Event::new(
                log.name.clone(),
                log.epoch,
                log.head,
                ev.event_type,
                ev.data,
                time,
            ));
            log.bytes += e.data.len() as u64;
            log.events.push_back(e.clone());
            committed.push(e);
        }
        let last_seq = log.head;
        if let Some(k) = idempotency_key {
            log.keys.insert(k.to_owned(), (first_seq, last_seq));
            log.key_order.push_back((last_seq, k.to_owned()));
        }
        log.evict_to(log.retention.count_floor(log.head));
        let max_bytes = log.retention.max_bytes;
        if max_bytes != 0 && log.bytes > max_bytes {
            // The oldest go until the data fits; the newest event always stays.
            let (mut bytes, mut floor) = (log.bytes, 0);
            for e in &log.events {
                if bytes <= max_bytes || e.seq >= log.head {
                    break;
                }
                bytes -= e.data.len() as u64;
                floor = e.seq + 1;
            }
            log.evict_to(floor);
        }
        let state = log.state();
        // Still under the lock: the sink sees commits in seq order.
        self.sink.committed(&channel, state, &committed);
        Appended {
            epoch: log.epoch,
            first_seq,
            last_seq,
            duplicate: false,
        }
    }
}

#[async_trait]
impl Journal for MemoryJournal {
    fn durability(&self) -> &'static str {
        "memory"
    }

    async fn append(
        &self,
        channel: &str,
        events: Vec<NewEvent>,
        idempotency_key: Option<&str>,
    ) -> Result<Appended, JournalError> {
        let mut map = self.channels.lock();
        // Checked under the lock that `close` takes, so no append lands
        // after `close` returned.
        if self.closed.load(Ordering::Acquire) {
            return Err(JournalError::Closed);
        }
        let log = self.log_of(&mut map, channel);
        let retry = idempotency_key.is_some_and(|k| log.keys.contains_key(k));
        if log.meta.as_ref().is_some_and(ChannelMeta::is_closed) && !retry {
            return Err(JournalError::ChannelClosed);
        }
        Ok(self.append_locked(log, events, idempotency_key))
    }

    async fn channels_with_meta(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<String>, JournalError> {
        let map = self.channels.lock();
        let mut names: Vec<String> = map
            .iter()
            .filter(|(name, l)| name.starts_with(prefix) && l.meta.is_some())
            .map(|(name, _)| name.to_string())
            .collect();
        names.sort_unstable();
        names.truncate(limit);
        Ok(names)
    }

    async fn meta(
        &self,
        channel: &str,
    ) -> Result<(Option<ChannelMeta>, ChannelState), JournalError> {
        let map = self.channels.lock();
        Ok(match map.get(channel) {
            Some(l) => (l.meta.clone(), l.state()),
            None => (None, ChannelState::empty(self.epoch)),
        })
    }

    async fn change(&self, channel: &str, change: Change) -> Result<Changed, JournalError> {
        let mut map = self.channels.lock();
        if self.closed.load(Ordering::Acquire) {
            return Err(JournalError::Closed);
        }
        let (current, state) = match map.get(channel) {
            Some(l) => (l.meta.as_ref(), l.state()),
            None => (None, ChannelState::empty(self.epoch)),
        };
        match meta::decide(current, state, change) {
            Decision::Nothing(outcome) => Ok(Changed {
                outcome,
                meta: current.cloned().map(std::sync::Arc::new),
                state,
            }),
            Decision::Write {
                events,
                key,
                meta: next,
                outcome,
            } => {
                let log = self.log_of(&mut map, channel);
                let appended =
                    (!events.is_empty()).then(|| self.append_locked(log, events, key.as_deref()));
                log.meta = next;
                self.sink.meta_changed(channel);
                Ok(Changed {
                    outcome: meta::with_appended(outcome, appended),
                    meta: log.meta.clone().map(std::sync::Arc::new),
                    state: log.state(),
                })
            }
        }
    }

    async fn read(&self, channel: &str, after: u64, limit: usize) -> Result<Page, JournalError> {
        let map = self.channels.lock();
        let Some(log) = map.get(channel) else {
            return Ok(Page {
                state: ChannelState::empty(self.epoch),
                events: Vec::new(),
            });
        };
        let state = log.state();
        let start = after.max(state.floor.saturating_sub(1)) + 1;
        let skip = (start - state.floor.min(start)) as usize;
        let events = log.events.iter().skip(skip).take(limit).cloned().collect();
        Ok(Page { state, events })
    }

    async fn state(&self, channel: &str) -> Result<ChannelState, JournalError> {
        let map = self.channels.lock();
        Ok(map
            .get(channel)
            .map_or(ChannelState::empty(self.epoch), |l| l.state()))
    }

    /// A binary search of the retained events (times never decrease).
    async fn seek_time(&self, channel: &str, time_ms: u64) -> Result<TimeSeek, JournalError> {
        let map = self.channels.lock();
        let Some(log) = map.get(channel) else {
            let state = ChannelState::empty(self.epoch);
            return Ok(TimeSeek {
                state,
                seq: state.head + 1,
                head_time: 0,
            });
        };
        let state = log.state();
        let i = log.events.partition_point(|e| e.time < time_ms);
        let seq = log.events.get(i).map_or(state.head + 1, |e| e.seq);
        Ok(TimeSeek {
            state,
            seq,
            head_time: log.last_time,
        })
    }

    /// Drops the channel's events and keys under the lock appends take, and
    /// draws a new random epoch for it.
    async fn purge(&self, channel: &str) -> Result<ChannelState, JournalError> {
        let mut map = self.channels.lock();
        if self.closed.load(Ordering::Acquire) {
            return Err(JournalError::Closed);
        }
        let Some(log) = map.get_mut(channel) else {
            return Ok(ChannelState::empty(self.epoch));
        };
        let mut epoch = Epoch(rand::random::<u64>() | 1);
        while epoch == log.epoch || epoch == self.epoch {
            epoch = Epoch(rand::random::<u64>() | 1);
        }
        log.purged = true;
        log.epoch = epoch;
        log.head = 0;
        log.events.clear();
        log.bytes = 0;
        log.keys.clear();
        log.key_order.clear();
        let state = log.state();
        self.sink.evicted(channel, state);
        Ok(state)
    }

    /// A purge's epoch forks at seq 0 from every earlier one: every event
    /// in it was appended after the purge.
    fn fork_of(&self, channel: &str, from: Epoch, to: Epoch) -> Option<u64> {
        let map = self.channels.lock();
        map.get(channel)
            .and_then(|l| (l.purged && l.epoch == to && from != to).then_some(0))
    }

    async fn evict_expired(&self, now_ms: u64) -> Result<(), JournalError> {
        if !self.namespaces.any_age_limit() {
            return Ok(());
        }
        let mut map = self.channels.lock();
        for log in map.values_mut() {
            if log.retention.max_age_ms == 0 {
                continue;
            }
            let cutoff = now_ms.saturating_sub(log.retention.max_age_ms);
            let floor = log
                .events
                .iter()
                .find(|e| e.time > cutoff)
                .map_or(log.head + 1, |e| e.seq);
            if log.evict_to(floor) {
                self.sink.evicted(&log.name, log.state());
            }
        }
        Ok(())
    }

    /// Refuses appends from now on; nothing to flush.
    async fn close(&self) -> Result<(), JournalError> {
        let _map = self.channels.lock();
        self.closed.store(true, Ordering::Release);
        Ok(())
    }
}
