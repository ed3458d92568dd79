//! The journal: a channel's retained events, behind one trait.
//!
//! A [`Journal`] assigns seqs (dense, from 1, per channel), keeps events until
//! [`Retention`] evicts them, and reports every commit, in commit order, to
//! the [`CommitSink`] it was opened with (the hub), before `append` returns.
//! Implementations: [`crate::memory::MemoryJournal`] (in memory, one
//! process), the embedded durable store (`gapless_store::EmbeddedJournal`)
//! and the journal in Redis shared by the nodes of a cluster
//! (`gapless_redis::RedisJournal`). All three pass one contract suite
//! (`crates/testkit/tests/journal_contract.rs`).
//!
//! A journal knows channels and events only: features over the hub
//! (sessions, [`crate::session`]) keep their own state beside it, wired by
//! the binary.

use async_trait::async_trait;
use gapless_protocol::{Epoch, Event, NewEvent};
use std::sync::Arc;
use thiserror::Error;

/// A channel's journal bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelState {
    /// The journal incarnation.
    pub epoch: Epoch,
    /// Oldest retained seq; `head + 1` when nothing is retained.
    pub floor: u64,
    /// Newest seq ever assigned; 0 before the first event.
    pub head: u64,
}

impl ChannelState {
    /// The state of a channel that never had an event.
    pub fn empty(epoch: Epoch) -> Self {
        ChannelState {
            epoch,
            floor: 1,
            head: 0,
        }
    }
}

/// How long a channel's events are kept. Every limit applies; whichever
/// evicts more wins. A journal applies the retention of each channel's
/// namespace ([`crate::namespace::Namespaces::retention`]), also to the
/// events a channel already holds when it opens with a lower limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Most events kept per channel; right after a publish a channel serves at
    /// most this many (its newest). 0: no count limit.
    pub max_events: u64,
    /// Age in milliseconds after which events are evicted; 0 keeps them forever.
    /// Eviction by age may lag by at most one second.
    pub max_age_ms: u64,
    /// Most bytes of event data (the events' `data`, not their type or
    /// framing) kept per channel; right after a publish a channel serves its
    /// newest events whose data adds up to at most this many bytes, and
    /// always its newest event, however large. 0: no byte limit.
    pub max_bytes: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            max_events: 100_000,
            max_age_ms: 86_400_000,
            max_bytes: 0,
        }
    }
}

impl Retention {
    /// The floor that the count limit imposes on a channel whose head is
    /// `head` (1 when there is no count limit).
    pub fn count_floor(&self, head: u64) -> u64 {
        if self.max_events == 0 {
            return 1;
        }
        head.saturating_sub(self.max_events) + 1
    }
}

/// What an append did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// The journal incarnation.
    pub epoch: Epoch,
    /// Seq of the first event of the batch.
    pub first_seq: u64,
    /// Seq of the last event of the batch.
    pub last_seq: u64,
    /// True when the idempotency key was seen before: nothing was appended and
    /// the seqs are the original ones.
    pub duplicate: bool,
}

/// One page read from the journal.
#[derive(Debug, Clone)]
pub struct Page {
    /// The channel's bounds at the time of the read.
    pub state: ChannelState,
    /// Events with `seq > max(after, floor - 1)`, ascending, at most `limit`.
    pub events: Vec<Arc<Event>>,
}

/// Where a time falls in a channel: the answer of [`Journal::seek_time`].
///
/// Event times are commit times (Unix ms) that never decrease within a
/// channel: each journal gives an append the later of its clock and the
/// channel's newest time, so a clock that steps back holds a channel's
/// times still (its events get its newest time) until it catches up. The
/// retained events with `time >= T` are therefore exactly `seq ..= head`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeSeek {
    /// The channel's bounds when it was read.
    pub state: ChannelState,
    /// The first retained event whose `time` is at or after the time asked
    /// (`floor <= seq`); `head + 1` when no retained event is.
    pub seq: u64,
    /// The commit time of the event at `head`, retained or not (Unix ms);
    /// 0 before the first event.
    pub head_time: u64,
}

impl TimeSeek {
    /// Whether an event that is no longer retained may have a time at or
    /// after `time_ms`: the answer is the floor, something was evicted
    /// (`floor > 1`), and either events are retained (the evicted one just
    /// below the floor is at most as new as the floor, and its own time is
    /// gone) or none are and the head event, the newest evicted, is at or
    /// after `time_ms`. False when the answer is past the floor: the event
    /// before it is retained and older than `time_ms`, and so is everything
    /// before that.
    pub fn evicted_after(&self, time_ms: u64) -> bool {
        let st = self.state;
        self.seq <= st.floor && st.floor > 1 && (st.floor <= st.head || self.head_time >= time_ms)
    }
}

/// A journal failure. Nothing was acknowledged when an append fails.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum JournalError {
    /// The storage failed (I/O, corruption); the message says how.
    #[error("journal storage failed: {0}")]
    Storage(String),
    /// The journal's disk is full, or below its free-space reserve; nothing
    /// was stored. Appends succeed again once space is freed.
    #[error("the journal's disk is full: {0}")]
    Full(String),
    /// The journal is closed (the server is shutting down).
    #[error("journal is closed")]
    Closed,
    /// The journal's store cannot be reached now (a Redis that is down, hung or
    /// failing over), or did not answer within its timeout. An append that
    /// fails so may still have been applied: retrying it with the same
    /// idempotency key answers with the original seqs, never a second copy.
    #[error("journal unreachable: {0}")]
    Unavailable(String),
    /// The channel is closed ([`crate::meta::Life::Closed`]): it takes no
    /// more events, from any transport. Nothing was appended.
    #[error("the channel is closed: it takes no more events")]
    ChannelClosed,
}

/// Keeps the leading events whose data adds up to at most `max_bytes`, and
/// always the first: the rule of [`Journal::read_bounded`].
pub fn cut_to_bytes(events: &mut Vec<Arc<Event>>, max_bytes: usize) {
    let mut total = 0usize;
    let keep = events
        .iter()
        .position(|e| {
            total = total.saturating_add(e.data.len());
            total > max_bytes
        })
        .map_or(events.len(), |i| i.max(1));
    events.truncate(keep);
}

/// Receives every commit, in commit order per channel.
pub trait CommitSink: Send + Sync + 'static {
    /// `events` were committed to `channel`; `state` is the channel's state right after.
    fn committed(&self, channel: &str, state: ChannelState, events: &[Arc<Event>]);
    /// Retention by age raised `channel`'s floor (count retention is reported
    /// through `committed`'s state).
    fn evicted(&self, channel: &str, state: ChannelState);
    /// `channel`'s metadata ([`crate::meta`]) changed, here or on another
    /// node sharing the journal: whatever holds a copy reads it again.
    /// Default: nothing.
    fn meta_changed(&self, _channel: &str) {}
    /// Whether `channel` has a window to feed (someone follows it). A journal
    /// shared between nodes asks before reading a commit made elsewhere; the
    /// default, true, makes it read every one.
    fn follows(&self, _channel: &str) -> bool {
        true
    }
    /// The channels that have a window now (a journal shared between nodes
    /// re-reads their heads after losing its notifications). Default: none.
    fn followed(&self) -> Vec<Arc<str>> {
        Vec::new()
    }
    /// An ephemeral event published on another node (a journal shared
    /// between nodes passes them on, see [`Journal::share_ephemeral`]): it
    /// goes to this node's current subscribers of `channel`, like one
    /// published here. Default: dropped.
    fn ephemeral(
        &self,
        _channel: &str,
        _event_type: Option<String>,
        _data: gapless_protocol::Payload,
    ) {
    }
}

/// A sink that drops everything (for tools and tests).
#[derive(Debug)]
pub struct NoSink;

impl CommitSink for NoSink {
    fn committed(&self, _: &str, _: ChannelState, _: &[Arc<Event>]) {}
    fn evicted(&self, _: &str, _: ChannelState) {}
}

/// The journal contract (see module doc). Channel names are already validated.
#[async_trait]
pub trait Journal: Send + Sync + 'static {
    /// Appends `events` to `channel` atomically and in order. With an
    /// `idempotency_key` seen on this channel before (and whose events are still
    /// retained), appends nothing and returns the original seqs with
    /// `duplicate: true`. The sink has seen the events before this returns.
    ///
    /// # Errors
    /// [`JournalError`] when storage fails; nothing was committed then.
    async fn append(
        &self,
        channel: &str,
        events: Vec<NewEvent>,
        idempotency_key: Option<&str>,
    ) -> Result<Appended, JournalError>;

    /// The names of the channels that start with `prefix` and have metadata
    /// ([`crate::meta`]: channels created explicitly, such as Durable Streams
    /// streams), in name order, at most `limit` of them. For what must find
    /// such channels by name without keeping a list of its own (a Durable
    /// Streams subscription's pattern, docs/durable-streams.md
    /// "Subscriptions"). It walks the journal's index (a range of the
    /// store's `channel_meta` table; Redis `SCAN` over the metadata hashes),
    /// so it is for rare requests, not for every append.
    ///
    /// # Errors
    /// [`JournalError`] when storage fails.
    async fn channels_with_meta(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<String>, JournalError>;

    /// The channel's metadata ([`crate::meta`]; `None` for a channel that
    /// has none) with its bounds, read together.
    ///
    /// # Errors
    /// [`JournalError`] when storage fails.
    async fn meta(
        &self,
        channel: &str,
    ) -> Result<(Option<crate::meta::ChannelMeta>, ChannelState), JournalError>;

    /// Decides `change` against the channel's metadata and bounds with
    /// [`crate::meta::decide`] and commits the decision (its events, with
    /// their idempotency key, and the new metadata) atomically, as one
    /// write: nothing else is decided or appended to the channel between
    /// the read and the write, and a crash leaves both or neither. Changes
    /// of one channel submitted in order from one task are decided in that
    /// order. The sink sees the events as for [`Journal::append`], and
    /// [`CommitSink::meta_changed`] whenever the metadata changed.
    ///
    /// # Errors
    /// [`JournalError`] when storage fails; nothing was committed then
    /// (for [`JournalError::Unavailable`]: perhaps committed, as for
    /// `append`).
    async fn change(
        &self,
        channel: &str,
        change: crate::meta::Change,
    ) -> Result<crate::meta::Changed, JournalError>;

    /// Reads up to `limit` events after seq `after` (events below the floor are skipped).
    ///
    /// # Errors
    /// [`JournalError`] when storage fails.
    async fn read(&self, channel: &str, after: u64, limit: usize) -> Result<Page, JournalError>;

    /// Like [`Journal::read`], and also stops once the events' data passes
    /// `max_bytes` (always at least one event), so a page of large events
    /// stays about that big. Journals that load events from storage should
    /// stop reading there rather than cut afterwards, as this default does.
    ///
    /// # Errors
    /// [`JournalError`] when storage fails.
    async fn read_bounded(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Page, JournalError> {
        let mut page = self.read(channel, after, limit).await?;
        cut_to_bytes(&mut page.events, max_bytes);
        Ok(page)
    }

    /// The channel's bounds (an empty state for a channel never published to).
    ///
    /// # Errors
    /// [`JournalError`] when storage fails.
    async fn state(&self, channel: &str) -> Result<ChannelState, JournalError>;

    /// The first retained event of `channel` whose `time` is at or after
    /// `time_ms` (Unix ms), with the channel's bounds: where a start at a
    /// point in time (`since=time:T`) begins. Times never decrease within a
    /// channel ([`TimeSeek`]), so every journal answers with a binary search
    /// over seqs (a few reads of event times, never the whole channel). A
    /// channel never published to answers its empty state and `seq` 1.
    ///
    /// # Errors
    /// [`JournalError`] when storage fails.
    async fn seek_time(&self, channel: &str, time_ms: u64) -> Result<TimeSeek, JournalError>;

    /// Removes every event of `channel` and starts a new epoch for it
    /// (`DELETE /v1/channels/{channel}`): the answer, also reported to the
    /// sink through [`CommitSink::evicted`] before this returns, is the
    /// channel's new state `{epoch: new, floor: 1, head: 0}`; seqs start
    /// again at 1 and idempotency keys are forgotten. The new epoch is a
    /// fork at seq 0 of the one it replaces ([`Journal::fork_of`] answers
    /// `Some(0)`): a reader of the old epoch gets one `epoch` gap and then
    /// every event appended after the purge. An append racing the purge is
    /// wholly before it (and gone) or wholly after it (in the new epoch).
    /// A channel never published to is left as it is (its empty state is
    /// answered). Durable once it returns, like an append.
    ///
    /// # Errors
    /// [`JournalError`] when storage fails; the channel may then be purged
    /// or not, never half.
    async fn purge(&self, channel: &str) -> Result<ChannelState, JournalError>;

    /// Evicts events older than the retention age, reporting new floors to the
    /// sink. Called about every 250 ms by the server.
    ///
    /// # Errors
    /// [`JournalError`] when storage fails.
    async fn evict_expired(&self, now_ms: u64) -> Result<(), JournalError>;

    /// When an append is acknowledged, as the `durability` label of
    /// `gapless_events_published_total`: `sync`, `async` or `memory`
    /// (`unknown` from a journal that cannot tell). Asked at every publish,
    /// so it may change while the server runs. Default `sync`.
    fn durability(&self) -> &'static str {
        "sync"
    }

    /// Size of the journal on local disk, in bytes (`gapless_journal_size_bytes`);
    /// `None` for journals elsewhere (memory, Redis). Default `None`.
    fn size_bytes(&self) -> Option<u64> {
        None
    }

    /// Whether the journal accepts appends now (`GET /readyz`). The default,
    /// for journals on local storage, is always ready.
    ///
    /// # Errors
    /// [`JournalError::Unavailable`] while its store cannot be reached.
    async fn ready(&self) -> Result<(), JournalError> {
        Ok(())
    }

    /// The fork point when epoch `to` of `channel` began as a fork of epoch
    /// `from`: the journal changed epoch (a Redis failover, or a Redis that
    /// came back with an older copy of the channel) while keeping every event
    /// of `from` up to that seq, and every event after it in `to` is new.
    /// A position at or below it continues in `to` without a gap
    /// ([`Journal::continues`]); a position beyond it held events `to` lacks,
    /// so its subscriber gets an `epoch` gap and continues after the fork
    /// point of `to` (receiving everything appended since the fork). Default:
    /// `None` (a new epoch lost everything; continue at its head).
    fn fork_of(&self, _channel: &str, _from: Epoch, _to: Epoch) -> Option<u64> {
        None
    }

    /// Whether position `seq` of epoch `from` is also position `seq` of epoch
    /// `to` of `channel`: `seq` is at or below [`Journal::fork_of`]. A
    /// subscriber there then continues without a gap.
    fn continues(&self, channel: &str, from: Epoch, seq: u64, to: Epoch) -> bool {
        self.fork_of(channel, from, to)
            .is_some_and(|fork| seq <= fork)
    }

    /// Passes an ephemeral event published on this node to the other nodes
    /// sharing the journal, best effort (ephemeral events are never
    /// journaled: a node that misses it does not get it later). Each of them
    /// hands it to its [`CommitSink::ephemeral`]. Default: nothing (one node).
    fn share_ephemeral(
        &self,
        _channel: &str,
        _event_type: Option<&str>,
        _data: &gapless_protocol::Payload,
    ) {
    }

    /// Makes everything acknowledged durable and stops accepting appends.
    ///
    /// # Errors
    /// [`JournalError`] when the final flush fails.
    async fn close(&self) -> Result<(), JournalError>;
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sized(sizes: &[usize]) -> Vec<Arc<Event>> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                Arc::new(Event::new(
                    Arc::from("c"),
                    Epoch(1),
                    i as u64 + 1,
                    None,
                    "x".repeat(n).into(),
                    0,
                ))
            })
            .collect()
    }

    #[test]
    fn cut_to_bytes_keeps_what_fits_and_always_the_first() {
        let cases: [(&[usize], usize, usize); 6] = [
            (&[10, 10, 10], 30, 3),
            (&[10, 10, 10], 29, 2),
            (&[10, 10, 10], 0, 1),
            (&[100], 1, 1),
            (&[], 5, 0),
            (&[0, 0, 7], 6, 2),
        ];
        for (sizes, max, keep) in cases {
            let mut events = sized(sizes);
            cut_to_bytes(&mut events, max);
            assert_eq!(events.len(), keep, "{sizes:?} within {max}");
        }
    }
}
