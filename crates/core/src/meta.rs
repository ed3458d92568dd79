//! A channel's lifecycle and metadata, journaled with the channel itself.
//!
//! Most channels have none: they are created by their first event and live
//! by retention. A channel created explicitly (a Durable Streams stream,
//! PROTOCOL.md 5.1) has a [`ChannelMeta`]: its content type, whether it is
//! open or closed, its expiry, where it begins (a fork's origin), and the
//! state that guards its appends (each idempotent producer's epoch and last
//! seq, the last `Stream-Seq`). The journal keeps it beside the channel's
//! events, in the same store, and changes it only through [`Change`]s that
//! it decides with [`decide`] and commits atomically with the events they
//! guard ([`crate::Journal::change`]): an append with producer headers is
//! one journal write, and a crash can never leave the data and the producer
//! state apart (docs/design.md, "Channel metadata").
//!
//! The rules live here once, as a pure function over the metadata and the
//! channel's bounds; each journal runs it where its writes are serialized
//! (the memory journal's lock, the embedded store's writer thread, a
//! compare-and-set on the channel's keys in Redis).
//!
//! A closed channel takes no more events from anyone: [`crate::Journal::append`]
//! refuses them with [`crate::JournalError::ChannelClosed`].

use crate::journal::{Appended, ChannelState};
use gapless_protocol::NewEvent;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The largest JavaScript-safe integer (2^53 - 1), the bound of producer
/// epochs and seqs (PROTOCOL.md 5.2.1).
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// The metadata of one incarnation of a channel (see the module doc).
/// Serialized as JSON by every journal ([`ChannelMeta::encode`]); fields
/// added later default, so older records read unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelMeta {
    /// Names this incarnation: random and non-zero, drawn at creation. A
    /// channel deleted and created again has another, so a request that
    /// read the old one ([`Guard::incarnation`]) is refused with
    /// [`Refusal::NotFound`] rather than applied to the new one.
    pub incarnation: u64,
    /// When it was created (Unix ms).
    #[serde(default)]
    pub created_ms: u64,
    /// The content type as given at creation (PROTOCOL.md 5.1).
    pub content_type: String,
    /// The sliding time-to-live in seconds (`Stream-TTL`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
    /// The absolute expiry (`Stream-Expires-At`) as given and in Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<(String, u64)>,
    /// Open or closed.
    #[serde(default)]
    pub life: Life,
    /// The producer tuple of the append that closed it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_by: Option<ProducerTuple>,
    /// Deleted while forks still read it (PROTOCOL.md 4.2): kept for them,
    /// refused to everyone else.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub soft_deleted: bool,
    /// Where its messages are (decided at creation by [`decide`]).
    pub layout: Layout,
    /// Idempotent producers: id → (epoch, last seq accepted).
    #[serde(default, skip_serializing_if = "Producers::is_empty")]
    pub producers: Producers,
    /// The newest `Stream-Seq` accepted (compared byte-wise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_seq: Option<String>,
    /// The channels of the forks made of it that may still read it (its
    /// reference count, PROTOCOL.md 4.2).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub forks: BTreeSet<String>,
    /// A record a product keeps with a channel that is not a stream (a
    /// Durable Streams subscription, an index of them): opaque text,
    /// replaced whole and only by [`Change::Put`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<String>,
    /// The version of [`ChannelMeta::record`]: 1 when [`Change::Put`]
    /// created it, one more at each replacement (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub record_version: u64,
}

/// A channel's idempotent producers: id → (epoch, last seq accepted),
/// sorted by id. Stored as a JSON object (as a `BTreeMap` was, so metadata
/// written before reads the same), held as one vector: a stream has one
/// producer or a few, and a `BTreeMap`'s first node costs about 500 bytes
/// in every copy of the metadata (the node's cache, the journal's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Producers(Vec<(String, (u64, u64))>);

impl Producers {
    /// The producer `id`'s (epoch, last seq).
    pub fn get(&self, id: &str) -> Option<&(u64, u64)> {
        self.find(id).ok().map(|i| &self.0[i].1)
    }

    /// Sets the producer `id`'s (epoch, last seq).
    pub fn insert(&mut self, id: String, at: (u64, u64)) {
        match self.find(&id) {
            Ok(i) => self.0[i].1 = at,
            Err(i) => self.0.insert(i, (id, at)),
        }
    }

    /// How many producers.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Forgets every producer.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Each producer, by id.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &(u64, u64))> {
        self.0.iter().map(|(id, at)| (id, at))
    }

    fn find(&self, id: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(id))
    }
}

impl FromIterator<(String, (u64, u64))> for Producers {
    fn from_iter<I: IntoIterator<Item = (String, (u64, u64))>>(items: I) -> Self {
        let mut p = Producers::default();
        for (id, at) in items {
            p.insert(id, at);
        }
        p
    }
}

impl Serialize for Producers {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for Producers {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<String, (u64, u64)>::deserialize(d)?;
        Ok(Producers(map.into_iter().collect()))
    }
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// Where a channel is in its life. Deletion removes the metadata.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Life {
    /// Takes events.
    #[default]
    Open,
    /// Closed: its head is final; appends are refused.
    Closed,
}

/// An idempotent producer's tuple (PROTOCOL.md 5.2.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerTuple {
    /// `Producer-Id`.
    pub id: String,
    /// `Producer-Epoch`.
    pub epoch: u64,
    /// `Producer-Seq`.
    pub seq: u64,
}

/// Where a channel's messages are, fixed at creation: its own events after
/// `base`, and for a fork the source's up to the fork point. The default
/// is a plain channel's before [`decide`] completes it at creation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// The epoch of the stream's offsets: its channel's journal epoch at
    /// creation, a fork's its source's (raw [`gapless_protocol::Epoch`]).
    pub offset_epoch: u64,
    /// The channel's journal epoch at creation (another one now: its
    /// history was purged or lost since).
    pub channel_epoch: u64,
    /// The channel's head at creation: its messages are the events after it.
    pub base: u64,
    /// The position just before its first own message: `base` for a plain
    /// channel, the fork point for a fork.
    pub origin: u64,
    /// The source of a fork.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<ForkOrigin>,
    /// A fork's inherited layouts, its source's first, then the source's
    /// source's, …: what its reads stitch together, kept whole so a fork
    /// reads the same whatever becomes of its sources' metadata.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inherited: Vec<Ancestor>,
}

/// One inherited layout of a fork ([`Layout::inherited`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ancestor {
    /// Its channel.
    pub channel: String,
    /// That channel's journal epoch when the layout was made.
    pub channel_epoch: u64,
    /// That channel's head then.
    pub base: u64,
    /// Its origin (see [`Layout::origin`]).
    pub origin: u64,
}

/// What a fork was made of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkOrigin {
    /// The source's channel.
    pub source: String,
    /// The fork point: the source's position the fork continues after.
    pub at: u64,
    /// The fork's sub-offset (PROTOCOL.md 4.2), 0 when none was given.
    #[serde(default)]
    pub sub: u64,
}

impl ChannelMeta {
    /// The metadata of a new, open, plain channel of `content_type`, made
    /// at `created_ms` (Unix ms) as incarnation `incarnation` (non-zero):
    /// no expiry, producers or forks; its layout is completed by [`decide`].
    pub fn new(incarnation: u64, content_type: String, created_ms: u64) -> Self {
        ChannelMeta {
            incarnation,
            created_ms,
            content_type,
            ttl_s: None,
            expires_at: None,
            life: Life::Open,
            closed_by: None,
            soft_deleted: false,
            layout: Layout::default(),
            producers: Producers::default(),
            stream_seq: None,
            forks: BTreeSet::new(),
            record: None,
            record_version: 0,
        }
    }

    /// The JSON text every journal stores.
    pub fn encode(&self) -> String {
        // A struct of strings, integers and maps with string keys always
        // serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads what [`ChannelMeta::encode`] wrote.
    ///
    /// # Errors
    /// A message when `text` is not such a record (a damaged store).
    pub fn decode(text: &[u8]) -> Result<Self, String> {
        serde_json::from_slice(text).map_err(|e| format!("damaged channel metadata: {e}"))
    }

    /// Whether it is closed.
    pub fn is_closed(&self) -> bool {
        self.life == Life::Closed
    }
}

/// What an append asks of a channel's metadata, checked atomically with it
/// (PROTOCOL.md 5.2 and 5.2.1).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Guard {
    /// The incarnation the request was judged against.
    pub incarnation: u64,
    /// The producer headers, all three.
    pub producer: Option<ProducerTuple>,
    /// `Stream-Seq`.
    pub stream_seq: Option<String>,
    /// `Stream-Closed: true`: the append closes the channel.
    pub close: bool,
}

/// A change of a channel's metadata, with the events it guards, decided by
/// [`decide`] and committed by [`crate::Journal::change`] as one write.
#[derive(Debug, Clone)]
pub enum Change {
    /// Creates the channel's metadata from `meta`, unless it has some
    /// ([`Outcome::Exists`]). [`decide`] sets the layout's `channel_epoch`
    /// and `base` from the channel's bounds (and `origin` and, unless a
    /// fork's, `offset_epoch`), then `events` are appended.
    Create {
        /// The new metadata (its layout completed by [`decide`]).
        meta: ChannelMeta,
        /// The first events (a body sent with the creation).
        events: Vec<NewEvent>,
    },
    /// Sets the metadata read back from an older layout of the store (an
    /// upgrade), unless the channel has some: exactly `meta`, nothing decided.
    Import(ChannelMeta),
    /// Appends `events` (possibly none, for a close) under `guard`.
    Append {
        /// What the append asks.
        guard: Guard,
        /// The events, in order.
        events: Vec<NewEvent>,
        /// The idempotency key stored with them.
        key: Option<String>,
    },
    /// Marks the incarnation deleted while forks read it.
    SoftDelete {
        /// The incarnation.
        incarnation: u64,
    },
    /// Adds (`true`) or removes a fork's channel from the incarnation's forks.
    Fork {
        /// The incarnation.
        incarnation: u64,
        /// The fork's channel.
        fork: String,
        /// Add or remove.
        add: bool,
    },
    /// Compare-and-set of a channel's record ([`ChannelMeta::record`]):
    /// applied only when the channel's metadata is `version` of
    /// `incarnation` (`version` 0: the channel has no metadata; it is then
    /// created as `incarnation`, non-zero, with the record at version 1).
    /// `record` replaces the record and bumps its version; `None` removes
    /// the metadata. A guard that is not the current one writes nothing and
    /// answers [`Outcome::Exists`] (the channel has other metadata, whose
    /// copy [`Changed::meta`] holds) or [`Refusal::NotFound`] (it has none).
    Put {
        /// The incarnation the caller read (to create: the new one).
        incarnation: u64,
        /// The record's version the caller read (0: none).
        version: u64,
        /// The new record; `None` removes the metadata.
        record: Option<String>,
    },
    /// Removes the incarnation's metadata (its events stay until retention
    /// evicts them; a channel created again starts after them).
    Delete {
        /// The incarnation.
        incarnation: u64,
    },
}

/// Why [`decide`] refused a change. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The channel has no metadata, or another incarnation.
    NotFound,
    /// The incarnation is soft-deleted.
    SoftDeleted,
    /// The channel is closed and this is not a retry of the close.
    Closed,
    /// `Producer-Epoch` below the producer's current one.
    StaleEpoch {
        /// The current epoch.
        current: u64,
    },
    /// A new producer epoch that does not start at seq 0.
    EpochSeqNotZero {
        /// The epoch asked.
        epoch: u64,
    },
    /// A producer seq that is not the next one.
    SeqGap {
        /// The seq expected.
        expected: u64,
        /// The seq received.
        received: u64,
    },
    /// A `Stream-Seq` at or below the newest one accepted.
    StreamSeqRegression {
        /// The newest accepted.
        last: String,
    },
}

/// What a committed change did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Created (or imported), and the first events appended (`None`: none given).
    Created(Option<Appended>),
    /// The channel had metadata (for [`Change::Put`]: other than the one
    /// guarded): nothing changed.
    Exists,
    /// Appended (`None`: a close without events), the metadata updated.
    Appended(Option<Appended>),
    /// The producer's seq was accepted before: nothing appended; its last seq.
    Duplicate(u64),
    /// Already closed, and this is the retry of the closing append (`true`)
    /// or a repeated close without events: nothing changed.
    AlreadyClosed(bool),
    /// The metadata was updated (soft delete, forks).
    Updated,
    /// The metadata was removed.
    Deleted,
    /// Refused; nothing changed.
    Refused(Refusal),
}

/// The answer of [`crate::Journal::change`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    /// What the change did.
    pub outcome: Outcome,
    /// The metadata after it (`None`: the channel has none), shared with
    /// the journal's own copy where it keeps one.
    pub meta: Option<std::sync::Arc<ChannelMeta>>,
    /// The channel's bounds after it.
    pub state: ChannelState,
}

/// What a journal must write for a change: [`decide`]'s answer. Made once
/// per change and consumed at once, never stored, so its size is no cost.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Write nothing; answer `outcome`.
    Nothing(Outcome),
    /// Append `events` (possibly none) with `key`, and set the metadata to
    /// `meta` (`None`: remove it), in one write. The outcome is
    /// [`Outcome::Appended`] or [`Outcome::Created`] with the append's
    /// result, else `outcome` as is.
    Write {
        /// The events.
        events: Vec<NewEvent>,
        /// Their idempotency key.
        key: Option<String>,
        /// The metadata after.
        meta: Option<ChannelMeta>,
        /// The outcome, before the append's result is known.
        outcome: Outcome,
    },
}

/// Decides `change` against the channel's metadata `current` and bounds
/// `state`: the one copy of the rules (module doc). Pure; each journal
/// runs it where its writes to the channel are serialized.
pub fn decide(current: Option<&ChannelMeta>, state: ChannelState, change: Change) -> Decision {
    match change {
        Change::Create { mut meta, events } => {
            if current.is_some() {
                return Decision::Nothing(Outcome::Exists);
            }
            meta.layout.channel_epoch = state.epoch.0;
            meta.layout.base = state.head;
            if meta.layout.fork.is_none() {
                meta.layout.offset_epoch = state.epoch.0;
                meta.layout.origin = state.head;
            }
            Decision::Write {
                events,
                key: None,
                meta: Some(meta),
                outcome: Outcome::Created(None),
            }
        }
        Change::Import(meta) => {
            if current.is_some() {
                return Decision::Nothing(Outcome::Exists);
            }
            Decision::Write {
                events: Vec::new(),
                key: None,
                meta: Some(meta),
                outcome: Outcome::Created(None),
            }
        }
        Change::Append { guard, events, key } => append(current, guard, events, key),
        Change::SoftDelete { incarnation } => match of(current, incarnation) {
            Err(r) => Decision::Nothing(Outcome::Refused(r)),
            Ok(m) => {
                let mut m = m.clone();
                m.soft_deleted = true;
                write_meta(Some(m), Outcome::Updated)
            }
        },
        Change::Fork {
            incarnation,
            fork,
            add,
        } => match current.filter(|m| m.incarnation == incarnation) {
            None => Decision::Nothing(Outcome::Refused(Refusal::NotFound)),
            Some(m) => {
                let mut m = m.clone();
                if add {
                    if m.soft_deleted {
                        return Decision::Nothing(Outcome::Refused(Refusal::SoftDeleted));
                    }
                    m.forks.insert(fork);
                } else {
                    m.forks.remove(&fork);
                }
                write_meta(Some(m), Outcome::Updated)
            }
        },
        Change::Put {
            incarnation,
            version,
            record,
        } => put(current, incarnation, version, record),
        Change::Delete { incarnation } => match current.filter(|m| m.incarnation == incarnation) {
            None => Decision::Nothing(Outcome::Refused(Refusal::NotFound)),
            Some(_) => write_meta(None, Outcome::Deleted),
        },
    }
}

fn write_meta(meta: Option<ChannelMeta>, outcome: Outcome) -> Decision {
    Decision::Write {
        events: Vec::new(),
        key: None,
        meta,
        outcome,
    }
}

/// [`Change::Put`]: a compare-and-set on the record's incarnation and version.
fn put(
    current: Option<&ChannelMeta>,
    incarnation: u64,
    version: u64,
    record: Option<String>,
) -> Decision {
    match (current, record) {
        (None, Some(r)) if version == 0 => {
            let mut m = ChannelMeta::new(incarnation, "application/json".to_owned(), 0);
            m.record = Some(r);
            m.record_version = 1;
            write_meta(Some(m), Outcome::Created(None))
        }
        (None, _) => Decision::Nothing(Outcome::Refused(Refusal::NotFound)),
        (Some(m), _)
            if version == 0 || m.incarnation != incarnation || m.record_version != version =>
        {
            Decision::Nothing(Outcome::Exists)
        }
        (Some(_), None) => write_meta(None, Outcome::Deleted),
        (Some(m), Some(r)) => {
            let mut m = m.clone();
            m.record = Some(r);
            m.record_version = version + 1;
            write_meta(Some(m), Outcome::Updated)
        }
    }
}

/// The metadata of `incarnation`, live.
fn of(current: Option<&ChannelMeta>, incarnation: u64) -> Result<&ChannelMeta, Refusal> {
    match current {
        Some(m) if m.incarnation == incarnation && m.soft_deleted => Err(Refusal::SoftDeleted),
        Some(m) if m.incarnation == incarnation => Ok(m),
        _ => Err(Refusal::NotFound),
    }
}

/// The append rules, in the protocol's order (PROTOCOL.md 5.2.1): the
/// stream exists, is open (a retry of the closing append, or a repeated
/// close, succeeds), the producer's epoch and seq, then `Stream-Seq`.
fn append(
    current: Option<&ChannelMeta>,
    guard: Guard,
    events: Vec<NewEvent>,
    key: Option<String>,
) -> Decision {
    let m = match of(current, guard.incarnation) {
        Ok(m) => m,
        Err(r) => return Decision::Nothing(Outcome::Refused(r)),
    };
    if m.is_closed() {
        let retry = guard.producer.is_some() && guard.producer == m.closed_by;
        if retry || (guard.close && events.is_empty()) {
            return Decision::Nothing(Outcome::AlreadyClosed(retry));
        }
        return Decision::Nothing(Outcome::Refused(Refusal::Closed));
    }
    if let Some(p) = &guard.producer {
        match m.producers.get(&p.id).copied() {
            Some((epoch, _)) if p.epoch < epoch => {
                return Decision::Nothing(Outcome::Refused(Refusal::StaleEpoch { current: epoch }));
            }
            Some((epoch, last)) if p.epoch == epoch => {
                if p.seq <= last {
                    return Decision::Nothing(Outcome::Duplicate(last));
                }
                if p.seq > last + 1 {
                    return Decision::Nothing(Outcome::Refused(Refusal::SeqGap {
                        expected: last + 1,
                        received: p.seq,
                    }));
                }
            }
            Some(_) if p.seq != 0 => {
                return Decision::Nothing(Outcome::Refused(Refusal::EpochSeqNotZero {
                    epoch: p.epoch,
                }));
            }
            None if p.seq != 0 => {
                return Decision::Nothing(Outcome::Refused(Refusal::SeqGap {
                    expected: 0,
                    received: p.seq,
                }));
            }
            _ => {}
        }
    }
    if let (Some(s), Some(last)) = (&guard.stream_seq, &m.stream_seq) {
        if s.as_bytes() <= last.as_bytes() {
            return Decision::Nothing(Outcome::Refused(Refusal::StreamSeqRegression {
                last: last.clone(),
            }));
        }
    }
    let mut next = m.clone();
    if let Some(p) = &guard.producer {
        next.producers.insert(p.id.clone(), (p.epoch, p.seq));
    }
    if let Some(s) = guard.stream_seq {
        next.stream_seq = Some(s);
    }
    if guard.close {
        next.life = Life::Closed;
        next.closed_by = guard.producer;
    }
    Decision::Write {
        events,
        key,
        meta: Some(next),
        outcome: Outcome::Appended(None),
    }
}

/// Fills in the append's result of a [`Decision::Write`]'s outcome.
pub fn with_appended(outcome: Outcome, appended: Option<Appended>) -> Outcome {
    match outcome {
        Outcome::Created(_) => Outcome::Created(appended),
        Outcome::Appended(_) => Outcome::Appended(appended),
        o => o,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gapless_protocol::{Epoch, Payload};

    fn meta() -> ChannelMeta {
        let mut m = ChannelMeta::new(7, "application/json".into(), 1);
        m.producers = [("a".to_owned(), (1, 4))].into_iter().collect();
        m.stream_seq = Some("05".into());
        m
    }

    fn state() -> ChannelState {
        ChannelState {
            epoch: Epoch(9),
            floor: 1,
            head: 12,
        }
    }

    fn ev() -> Vec<NewEvent> {
        vec![NewEvent {
            event_type: None,
            data: Payload::Text("1".into()),
        }]
    }

    fn guard(producer: Option<(&str, u64, u64)>, stream_seq: Option<&str>) -> Guard {
        Guard {
            incarnation: 7,
            producer: producer.map(|(id, epoch, seq)| ProducerTuple {
                id: id.into(),
                epoch,
                seq,
            }),
            stream_seq: stream_seq.map(str::to_owned),
            close: false,
        }
    }

    fn outcome(m: &ChannelMeta, g: Guard) -> Outcome {
        match decide(
            Some(m),
            state(),
            Change::Append {
                guard: g,
                events: ev(),
                key: None,
            },
        ) {
            Decision::Nothing(o) => o,
            Decision::Write { outcome, .. } => outcome,
        }
    }

    #[test]
    fn a_creation_takes_the_channels_epoch_and_head() {
        let mut m = meta();
        m.producers.clear();
        let d = decide(
            None,
            state(),
            Change::Create {
                meta: m.clone(),
                events: ev(),
            },
        );
        let Decision::Write { meta: Some(w), .. } = d else {
            panic!("{d:?}")
        };
        assert_eq!(
            (
                w.layout.offset_epoch,
                w.layout.channel_epoch,
                w.layout.base,
                w.layout.origin
            ),
            (9, 9, 12, 12)
        );
        assert_eq!(
            decide(
                Some(&m),
                state(),
                Change::Create {
                    meta: m.clone(),
                    events: ev()
                }
            ),
            Decision::Nothing(Outcome::Exists)
        );
    }

    #[test]
    fn producer_rules_in_the_protocols_order() {
        let m = meta();
        assert_eq!(
            outcome(&m, guard(Some(("a", 1, 5)), None)),
            Outcome::Appended(None)
        );
        assert_eq!(
            outcome(&m, guard(Some(("a", 1, 3)), None)),
            Outcome::Duplicate(4)
        );
        assert_eq!(
            outcome(&m, guard(Some(("a", 1, 7)), None)),
            Outcome::Refused(Refusal::SeqGap {
                expected: 5,
                received: 7
            })
        );
        assert_eq!(
            outcome(&m, guard(Some(("a", 0, 9)), None)),
            Outcome::Refused(Refusal::StaleEpoch { current: 1 })
        );
        assert_eq!(
            outcome(&m, guard(Some(("a", 2, 1)), None)),
            Outcome::Refused(Refusal::EpochSeqNotZero { epoch: 2 })
        );
        assert_eq!(
            outcome(&m, guard(Some(("a", 2, 0)), None)),
            Outcome::Appended(None)
        );
        assert_eq!(
            outcome(&m, guard(Some(("new", 0, 1)), None)),
            Outcome::Refused(Refusal::SeqGap {
                expected: 0,
                received: 1
            })
        );
        assert_eq!(
            outcome(&m, guard(None, Some("05"))),
            Outcome::Refused(Refusal::StreamSeqRegression { last: "05".into() })
        );
        assert_eq!(
            outcome(&m, guard(None, Some("4"))),
            Outcome::Appended(None),
            "byte-wise: \"4\" > \"05\""
        );
        let mut other = guard(None, None);
        other.incarnation = 8;
        assert_eq!(outcome(&m, other), Outcome::Refused(Refusal::NotFound));
    }

    #[test]
    fn an_accepted_append_records_what_it_guards_and_a_close_is_final() {
        let m = meta();
        let mut g = guard(Some(("a", 1, 5)), Some("06"));
        g.close = true;
        let Decision::Write {
            meta: Some(next), ..
        } = decide(
            Some(&m),
            state(),
            Change::Append {
                guard: g.clone(),
                events: ev(),
                key: None,
            },
        )
        else {
            panic!("not written")
        };
        assert_eq!(next.producers.get("a"), Some(&(1, 5)));
        assert_eq!(next.stream_seq.as_deref(), Some("06"));
        assert!(next.is_closed());
        // The retry of the closing append succeeds; anything else is refused.
        assert_eq!(outcome(&next, g.clone()), Outcome::AlreadyClosed(true));
        assert_eq!(
            outcome(&next, guard(Some(("a", 1, 6)), None)),
            Outcome::Refused(Refusal::Closed)
        );
        let close_only = decide(
            Some(&next),
            state(),
            Change::Append {
                guard: Guard {
                    incarnation: 7,
                    close: true,
                    ..Guard::default()
                },
                events: Vec::new(),
                key: None,
            },
        );
        assert_eq!(close_only, Decision::Nothing(Outcome::AlreadyClosed(false)));
    }

    #[test]
    fn metadata_round_trips_and_old_records_read() {
        let mut m = meta();
        m.layout.fork = Some(ForkOrigin {
            source: "s".into(),
            at: 3,
            sub: 0,
        });
        m.forks.insert("f".into());
        assert_eq!(ChannelMeta::decode(m.encode().as_bytes()), Ok(m));
        let old = br#"{"incarnation":1,"content_type":"text/plain","layout":{"offset_epoch":1,"channel_epoch":1,"base":0,"origin":0}}"#;
        let read = ChannelMeta::decode(old).map(|m| (m.life, m.producers.len()));
        assert_eq!(read, Ok((Life::Open, 0)));
        assert!(ChannelMeta::decode(b"{").is_err());
    }

    #[test]
    fn a_put_is_a_compare_and_set_of_the_record() {
        let put = |cur: Option<&ChannelMeta>, inc, version, record: Option<&str>| {
            decide(
                cur,
                state(),
                Change::Put {
                    incarnation: inc,
                    version,
                    record: record.map(str::to_owned),
                },
            )
        };
        let Decision::Write {
            meta: Some(made), ..
        } = put(None, 3, 0, Some("a"))
        else {
            panic!("a creation writes");
        };
        assert_eq!(
            (made.record.as_deref(), made.record_version),
            (Some("a"), 1)
        );
        assert_eq!(made.incarnation, 3);
        assert_eq!(
            put(Some(&made), 3, 0, Some("b")),
            Decision::Nothing(Outcome::Exists),
            "a second creation loses"
        );
        assert_eq!(
            put(Some(&made), 4, 1, Some("b")),
            Decision::Nothing(Outcome::Exists),
            "another incarnation's guard loses"
        );
        assert_eq!(
            put(Some(&made), 3, 2, Some("b")),
            Decision::Nothing(Outcome::Exists),
            "another version's guard loses"
        );
        let Decision::Write {
            meta: Some(next), ..
        } = put(Some(&made), 3, 1, Some("b"))
        else {
            panic!("the current guard writes");
        };
        assert_eq!(
            (next.record.as_deref(), next.record_version),
            (Some("b"), 2)
        );
        assert!(matches!(
            put(Some(&next), 3, 2, None),
            Decision::Write { meta: None, .. }
        ));
        assert_eq!(
            put(None, 3, 2, Some("c")),
            Decision::Nothing(Outcome::Refused(Refusal::NotFound))
        );
        assert_eq!(ChannelMeta::decode(next.encode().as_bytes()), Ok(next));
    }

    /// Producers are kept sorted by id and stored as a JSON object, as the
    /// `BTreeMap` before them was, so either reads the other's metadata.
    #[test]
    fn producers_are_a_sorted_json_object() {
        let mut p = Producers::default();
        p.insert("b".into(), (0, 3));
        p.insert("a".into(), (1, 1));
        p.insert("b".into(), (0, 4));
        assert_eq!((p.len(), p.get("b"), p.get("c")), (2, Some(&(0, 4)), None));
        let json = serde_json::to_string(&p).unwrap_or_default();
        assert_eq!(json, r#"{"a":[1,1],"b":[0,4]}"#);
        let map: BTreeMap<String, (u64, u64)> = serde_json::from_str(&json).unwrap_or_default();
        assert_eq!(map.len(), 2);
        let back: Producers = serde_json::from_str(r#"{"z":[2,0],"a":[1,1]}"#).unwrap_or_default();
        let ids: Vec<&String> = back.iter().map(|(id, _)| id).collect();
        assert_eq!(ids, ["a", "z"]);
    }
}
