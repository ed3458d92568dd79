//! The values the client hands out: cursors, events, gap notices, updates and
//! the answers of publish and history calls.
//!
//! The answers are read as the server writes them, with the wire types of
//! `gapless_protocol` ([`answers`](gapless_protocol::answers) and
//! [`ws`](gapless_protocol::ws)), and keep their names: [`Published`],
//! [`EphemeralDelivered`], [`BatchPublished`] and its [`BatchItem`]s,
//! [`HistoryPage`], [`ChannelInfo`], [`SessionInfo`] (the wire type itself,
//! as is [`SessionStatus`]) and [`SessionAppended`]. Where the client's type
//! differs from the wire's, it is by what the client adds: cursors as
//! [`Cursor`], and `duplicate` (the answer's status, 200 for an idempotent
//! retry).

use gapless_protocol::answers;
pub use gapless_protocol::answers::{RetentionLimits, SessionInfo, SessionStatus};
use gapless_protocol::codes::GapReason;
pub use gapless_protocol::presence::{
    PresenceAction, PresenceAnswer, PresenceMember, PresenceNotice,
};
use gapless_protocol::Since;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A position on one or more channels, as the server issued it.
///
/// Cursors are opaque: the client stores and relays them (as `after`,
/// `last_event_id` or `Last-Event-ID`) and never looks inside. Only the server
/// reads them. The string is URL-safe base64 and safe to log or persist.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Cursor(String);

impl Cursor {
    /// The cursor as the server wrote it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The cursor's string.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl From<String> for Cursor {
    fn from(s: String) -> Self {
        Cursor(s)
    }
}

impl From<&str> for Cursor {
    fn from(s: &str) -> Self {
        Cursor(s.to_owned())
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A journaled event, from history or from a stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The channel.
    pub channel: String,
    /// Its position in the channel: dense, from 1.
    pub seq: u64,
    /// The event's type (`None` when published without one).
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// The payload: UTF-8 text as published, or with `encoding` the event's
    /// bytes in that encoding.
    pub data: String,
    /// `Some(Base64)` when the event's data is bytes: `data` is then their
    /// standard padded base64 ([`Event::bytes`] decodes it); `None` for text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<gapless_protocol::Encoding>,
    /// Commit time, Unix milliseconds.
    pub time: u64,
    /// Where a reader stands after this event. From history and from a
    /// WebSocket subscription, the channel's cursor (one channel's position);
    /// from an SSE subscription, the subscription's cursor (every channel's
    /// position), so resuming from it resumes the whole subscription.
    pub cursor: Cursor,
}

impl Event {
    /// The data as published: text, or the bytes of a binary event.
    ///
    /// # Errors
    /// [`crate::Error::Protocol`]-like text when a binary event's data is not
    /// base64 (a server bug).
    pub fn payload(&self) -> Result<gapless_protocol::Payload, String> {
        gapless_protocol::Payload::from_wire(self.data.clone(), self.encoding)
    }

    /// The bytes of a binary event; `None` for a text event.
    pub fn bytes(&self) -> Option<Vec<u8>> {
        match self.payload() {
            Ok(gapless_protocol::Payload::Binary(b)) => Some(b),
            _ => None,
        }
    }
}

/// A live-only event: it has no seq, is never journaled or replayed, and never
/// moves a cursor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ephemeral {
    /// The channel.
    pub channel: String,
    /// The event's type, if any.
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// The payload (base64 with `encoding`, as for [`Event`]).
    pub data: String,
    /// `Some(Base64)` when the event's data is bytes: `data` is then their
    /// standard padded base64 ([`Payload::from_wire`](gapless_protocol::Payload::from_wire) decodes it); `None` for text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<gapless_protocol::Encoding>,
    /// When it was published, Unix milliseconds.
    pub time: u64,
}

/// A notice that a range of a channel was not delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// The channel.
    pub channel: String,
    /// The position before the hole; `None` when the server could not read it.
    pub after: Option<Cursor>,
    /// Where delivery continues: the hole ends at and includes this position.
    pub next: Cursor,
    /// Why. For `Ahead` and `Unknown` the reader's position does not fit the
    /// journal: re-anchor (fetch current state) rather than patch the hole.
    pub reason: GapReason,
}

/// What a subscription or a join delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    /// A journaled event; its cursor is now the reader's position.
    Event(Event),
    /// A range that was not delivered.
    Gap(Gap),
    /// A live-only event.
    Ephemeral(Ephemeral),
    /// A member joined or left a channel (only for a subscription that
    /// asked: `presence(true)`). Not an event: no seq, no cursor, never
    /// replayed (docs/api.md, "Presence").
    Presence(PresenceNotice),
}

/// Maps a wire reason to [`GapReason`]. A reason this client does not know is
/// read as [`GapReason::Unknown`]: the reader re-anchors, the safe choice.
pub(crate) fn parse_reason(s: &str) -> GapReason {
    match s {
        "evicted" => GapReason::Evicted,
        "epoch" => GapReason::Epoch,
        "ahead" => GapReason::Ahead,
        _ => GapReason::Unknown,
    }
}

/// The answer to a single publish: the wire's
/// [`answers::Published`], and whether it was a retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The channel.
    pub channel: String,
    /// The event's seq.
    pub seq: u64,
    /// The single-channel cursor positioned at the event.
    pub cursor: Cursor,
    /// True when the server recognised the `Idempotency-Key` of an earlier
    /// publish (status 200): nothing was appended and `seq`/`cursor` are the
    /// original ones.
    pub duplicate: bool,
}

impl Published {
    pub(crate) fn read(a: answers::Published, duplicate: bool) -> Self {
        Published {
            channel: a.channel,
            seq: a.seq,
            cursor: a.cursor.into(),
            duplicate,
        }
    }
}

/// One event of a batch answer (the wire's [`answers::BatchItem`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BatchItem {
    /// The event's seq.
    pub seq: u64,
    /// The single-channel cursor positioned at it.
    pub cursor: Cursor,
}

/// The answer to a batch publish: the wire's [`answers::BatchPublished`],
/// and whether it was a retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchPublished {
    /// The channel.
    pub channel: String,
    /// The first event's seq.
    pub first_seq: u64,
    /// The last event's seq; the batch holds `first_seq..=last_seq`.
    pub last_seq: u64,
    /// The cursor positioned at the last event.
    pub cursor: Cursor,
    /// Each event's seq and cursor, in order.
    pub events: Vec<BatchItem>,
    /// True for an idempotent retry (status 200): nothing was appended.
    pub duplicate: bool,
}

impl BatchPublished {
    pub(crate) fn read(a: answers::BatchPublished, duplicate: bool) -> Self {
        BatchPublished {
            channel: a.channel,
            first_seq: a.first_seq,
            last_seq: a.last_seq,
            cursor: a.cursor.into(),
            events: a
                .events
                .into_iter()
                .map(|i| BatchItem {
                    seq: i.seq,
                    cursor: i.cursor.into(),
                })
                .collect(),
            duplicate,
        }
    }
}

/// The answer to an ephemeral publish (the wire's
/// [`answers::EphemeralDelivered`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EphemeralDelivered {
    /// The channel.
    pub channel: String,
    /// How many subscribers it was handed to.
    pub subscribers: u64,
}

impl From<answers::EphemeralDelivered> for EphemeralDelivered {
    fn from(a: answers::EphemeralDelivered) -> Self {
        EphemeralDelivered {
            channel: a.channel,
            subscribers: u64::try_from(a.subscribers).unwrap_or(u64::MAX),
        }
    }
}

/// One page of history (the wire's [`answers::HistoryPage`], each event
/// with its channel).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryPage {
    /// The channel.
    pub channel: String,
    /// The journal incarnation, 16 hex digits.
    pub epoch: String,
    /// The oldest retained seq (`head + 1` when none is).
    pub floor: u64,
    /// The newest seq assigned when the page was read (0 before the first).
    pub head: u64,
    /// The events, ascending by seq.
    pub events: Vec<Event>,
    /// The cursor to pass as `after` for the next page. When `done`, it is the
    /// *tip*: the position of `head`.
    pub next: Cursor,
    /// True on the last page: there was nothing after these events when read.
    pub done: bool,
    /// Only on a page read with [`Start::Time`] that starts at the floor
    /// because an event no longer retained may be at or after that time:
    /// the evicted seqs (reason `Evicted`).
    pub gap: Option<Gap>,
}

impl From<answers::HistoryPage> for HistoryPage {
    fn from(a: answers::HistoryPage) -> Self {
        let channel = a.channel;
        let events = a
            .events
            .into_json()
            .into_iter()
            .map(|e| Event {
                channel: channel.clone(),
                seq: e.seq,
                event_type: e.event_type.map(|t| t.into_owned()),
                data: e.data.into_owned(),
                encoding: e.encoding,
                time: e.time,
                cursor: Cursor(e.cursor.into_owned()),
            })
            .collect();
        HistoryPage {
            channel,
            epoch: a.epoch.to_string(),
            floor: a.floor,
            head: a.head,
            events,
            next: a.next.into(),
            done: a.done,
            gap: a.gap.map(|g| Gap {
                channel: g.channel.into_owned(),
                after: g.after.map(Cursor::from),
                next: Cursor::from(g.next),
                reason: parse_reason(&g.reason),
            }),
        }
    }
}

/// A channel's bounds and audience (the wire's [`answers::ChannelInfo`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ChannelInfo {
    /// The channel.
    pub channel: String,
    /// The journal incarnation, 16 hex digits.
    pub epoch: String,
    /// The oldest retained seq (`head + 1` when none is).
    pub floor: u64,
    /// The newest seq (0 before the first publish).
    pub head: u64,
    /// Current subscribers.
    pub subscribers: u64,
    /// The channel's namespace: its name up to the first `:`, `default` for
    /// a name without one (docs/api.md, "Namespaces"); empty from a server
    /// before namespaces.
    pub namespace: String,
    /// The retention that applies to the channel (its namespace's): most
    /// events, age in milliseconds, most bytes; 0 is no limit of that kind
    /// (all 0 from a server before namespaces).
    pub retention: RetentionLimits,
}

impl From<answers::ChannelInfo> for ChannelInfo {
    fn from(a: answers::ChannelInfo) -> Self {
        ChannelInfo {
            channel: a.channel,
            epoch: a.epoch.to_string(),
            floor: a.floor,
            head: a.head,
            subscribers: u64::try_from(a.subscribers).unwrap_or(u64::MAX),
            namespace: a.namespace,
            retention: a.retention,
        }
    }
}

/// Where a subscription (or a history read) starts. A subscription applies
/// it on its first connection only: after a drop it resumes from its cursor.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Start {
    /// Only events published from now on.
    #[default]
    Live,
    /// Everything retained, then live.
    Earliest,
    /// The last N retained events (1 to 1000; fewer when fewer are retained),
    /// then live (`since=last:N`). A value out of range is refused by the
    /// server with `invalid_request`.
    Last(u64),
    /// From the first retained event whose `time` is at or after this Unix
    /// time in milliseconds, then live (`since=time:UNIX_MS`; live only when
    /// no event is). When an event no longer retained may be at or after it,
    /// the stream starts at the floor after a [`Gap`] of reason `Evicted`.
    /// [`Start::time`] builds one from a [`std::time::SystemTime`].
    Time(u64),
    /// After a cursor the server issued (resume).
    After(Cursor),
}

impl Start {
    /// [`Start::Time`] at `t` (milliseconds since the Unix epoch; a time
    /// before 1970 counts as 0).
    pub fn time(t: std::time::SystemTime) -> Start {
        let ms = t
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Start::Time(ms)
    }

    /// The `since` value that asks for this start without a cursor (`None`
    /// for [`Start::After`], which is sent as a cursor).
    pub fn since(&self) -> Option<String> {
        let since = match self {
            Start::Live => Since::Live,
            Start::Earliest => Since::Earliest,
            Start::Last(n) => Since::Last(*n),
            Start::Time(t) => Since::Time(*t),
            Start::After(_) => return None,
        };
        Some(since.to_string())
    }
}

/// The answer to a session append: the wire's
/// [`answers::SessionAppended`], and whether it was a retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionAppended {
    /// The session's id.
    pub id: String,
    /// The event's seq.
    pub seq: u64,
    /// Whether a consumer is attached: a producer sees at once that nobody
    /// is listening (and that the grace window is running).
    pub attached: bool,
    /// True when the server recognised the `Idempotency-Key` of an earlier
    /// append (status 200): nothing was appended and `seq` is the original.
    pub duplicate: bool,
}

impl SessionAppended {
    pub(crate) fn read(a: answers::SessionAppended, duplicate: bool) -> Self {
        SessionAppended {
            id: a.id,
            seq: a.seq,
            attached: a.attached,
            duplicate,
        }
    }
}

/// An event of a session, as its consumer receives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionEvent {
    /// The session's id.
    pub session: String,
    /// Its seq: increasing over the whole session (seq 1, the opening
    /// marker, is never delivered, so the first event is seq 2 or later).
    pub seq: u64,
    /// The event's type (`None` when appended without one).
    #[serde(rename = "type")]
    pub event_type: Option<String>,
    /// The payload, UTF-8 text as appended (base64 with `encoding`).
    pub data: String,
    /// `Some(Base64)` when the event's data is bytes: `data` is then their
    /// standard padded base64 ([`Payload::from_wire`](gapless_protocol::Payload::from_wire) decodes it); `None` for text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<gapless_protocol::Encoding>,
    /// Commit time, Unix milliseconds.
    pub time: u64,
}

/// What a session consumer delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionUpdate {
    /// An event; its seq is now the consumer's `last_seq`.
    Event(SessionEvent),
    /// An attach with `last_seq` has replayed everything after it
    /// (`replayed_events` events, possibly 0): what follows is live.
    Resumed {
        /// How many events the replay delivered.
        replayed_events: u64,
    },
    /// The producer completed the session and every event was delivered.
    /// The stream ends after it.
    Completed {
        /// The seq of the end marker.
        seq: u64,
    },
    /// The session was cancelled (by its producer, or by the server after
    /// the grace window) and every event was delivered. The stream ends
    /// after it.
    Cancelled {
        /// The seq of the end marker.
        seq: u64,
    },
}
