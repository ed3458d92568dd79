//! The values the client hands out: cursors, events, gap notices, updates and
//! the answers of publish and history calls.

use gapless_protocol::codes::GapReason;
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
    /// The payload, UTF-8 text as published.
    pub data: String,
    /// Commit time, Unix milliseconds.
    pub time: u64,
    /// Where a reader stands after this event. From history, a single-channel
    /// cursor; from a subscription, the subscription's cursor (every channel's
    /// position), so resuming from it resumes the whole subscription.
    pub cursor: Cursor,
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
    /// The payload.
    pub data: String,
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

/// The answer to a single publish.
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

/// One event of a batch answer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SeqCursor {
    /// The event's seq.
    pub seq: u64,
    /// The single-channel cursor positioned at it.
    pub cursor: Cursor,
}

/// The answer to a batch publish.
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
    pub events: Vec<SeqCursor>,
    /// True for an idempotent retry (status 200): nothing was appended.
    pub duplicate: bool,
}

/// The answer to an ephemeral publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EphemeralPublished {
    /// How many subscribers it was handed to.
    pub subscribers: u64,
}

/// One page of history.
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
}

/// A channel's bounds and audience.
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
}

/// Where a subscription starts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Start {
    /// Only events published from now on.
    #[default]
    Live,
    /// Everything retained, then live.
    Earliest,
    /// After a cursor the server issued (resume).
    After(Cursor),
}
