//! The JSON bodies of the HTTP API (docs/api.md): the answers of publish,
//! batch, history, channel info and sessions, and the items of a batch.
//!
//! The server writes them and documents them in its OpenAPI document (their
//! `ToSchema` names are the schema names there); the Rust client reads them.
//! Cursors travel as the strings the server wrote (a client never looks
//! inside one). The error body is the server's (`ErrorBody`): it is built
//! from the server's error type.

use crate::event::{Epoch, Event, EventJson};
use crate::schema::{ChannelName, EventType, SessionId};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

/// The answer to a journaled publish (201, or 200 for an idempotent retry).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Published {
    /// The channel.
    #[schema(value_type = ChannelName)]
    pub channel: String,
    /// The event's seq.
    #[schema(minimum = 1)]
    pub seq: u64,
    /// The cursor positioned at the event.
    #[schema(value_type = crate::Cursor)]
    pub cursor: String,
}

/// The answer to an ephemeral publish (202).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EphemeralDelivered {
    /// The channel.
    #[schema(value_type = ChannelName)]
    pub channel: String,
    /// How many current subscribers it was handed to.
    pub subscribers: usize,
}

/// One event of a batch's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BatchItem {
    /// Its seq.
    #[schema(minimum = 1)]
    pub seq: u64,
    /// The cursor positioned at it.
    #[schema(value_type = crate::Cursor)]
    pub cursor: String,
}

/// The answer to a batch publish (201, or 200 for an idempotent retry).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BatchPublished {
    /// The channel.
    #[schema(value_type = ChannelName)]
    pub channel: String,
    /// The first event's seq.
    #[schema(minimum = 1)]
    pub first_seq: u64,
    /// The last event's seq (`first_seq` + the batch's length - 1).
    #[schema(minimum = 1)]
    pub last_seq: u64,
    /// The cursor positioned at the last event.
    #[schema(value_type = crate::Cursor)]
    pub cursor: String,
    /// Every event's seq and cursor, in order.
    pub events: Vec<BatchItem>,
}

/// One event of a batch publish body.
//
// (Not in the document:) read strictly (an unknown field is refused; the
// server reads it through `crate::object::Object`, so only the object form
// is taken); written without `type` when it has none. Its OpenAPI schema is
// written by hand (below): text or bytes, so that a generator of valid
// bodies (schemathesis) never sends base64 the server cannot decode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchEvent {
    /// The event's data: text of at most `--max-event-bytes` bytes, or with
    /// `encoding` the event's bytes (at most that many once decoded).
    pub data: String,
    /// `"base64"` to publish bytes (`data` is their standard padded base64);
    /// absent for text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<crate::Encoding>,
    /// The event's type; none when absent or null.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
}

/// Canonical standard padded base64 (RFC 4648 section 4, the unused bits of
/// the last symbol zero): exactly what the server decodes.
pub const BASE64_PATTERN: &str =
    "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$";

impl utoipa::PartialSchema for BatchEvent {
    /// `oneOf`: text (`data` any string, `encoding` absent or null) or bytes
    /// (`encoding: "base64"`, `data` matching [`BASE64_PATTERN`]); `type`
    /// an [`EventType`] or null in both; no other field.
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, RefBuilder, Type};
        let event_type = || {
            OneOfBuilder::new()
                .item(
                    RefBuilder::new()
                        .ref_location_from_schema_name("EventType")
                        .description(Some("The event's type; none when absent or null.")),
                )
                .item(ObjectBuilder::new().schema_type(Type::Null))
        };
        let text = ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some("A text event."))
            .property(
                "data",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .description(Some(
                        "The event's data: text of at most `--max-event-bytes` bytes.",
                    )),
            )
            .required("data")
            .property(
                "encoding",
                ObjectBuilder::new()
                    .schema_type(Type::Null)
                    .description(Some("Absent or null for text.")),
            )
            .property("type", event_type())
            .additional_properties(Some(
                utoipa::openapi::schema::AdditionalProperties::FreeForm(false),
            ));
        let bytes = ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some("An event of bytes."))
            .property(
                "data",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some(BASE64_PATTERN))
                    .description(Some(
                        "The event's bytes in standard padded base64 (at most \
                         `--max-event-bytes` bytes once decoded).",
                    )),
            )
            .required("data")
            .property(
                "encoding",
                RefBuilder::new().ref_location_from_schema_name("Encoding"),
            )
            .required("encoding")
            .property("type", event_type())
            .additional_properties(Some(
                utoipa::openapi::schema::AdditionalProperties::FreeForm(false),
            ));
        OneOfBuilder::new()
            .description(Some(
                "One event of a batch publish body: text, or bytes in base64.",
            ))
            .item(text)
            .item(bytes)
            .into()
    }
}

impl ToSchema for BatchEvent {
    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        use utoipa::PartialSchema;
        schemas.push(("EventType".into(), EventType::schema()));
        schemas.push(("Encoding".into(), crate::Encoding::schema()));
    }
}

/// The events of a [`HistoryPage`], each in its history shape
/// ([`EventJson`]): the journal's own events when the server writes a page
/// (shared, not copied), the events read back when a client reads one.
#[derive(Debug, Clone)]
pub enum PageEvents {
    /// Journaled events, written with [`Event::to_json`].
    Journal(Vec<Arc<Event>>),
    /// Events read from JSON.
    Read(Vec<EventJson<'static>>),
}

impl PageEvents {
    /// How many events.
    pub fn len(&self) -> usize {
        match self {
            PageEvents::Journal(v) => v.len(),
            PageEvents::Read(v) => v.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The events in their history shape, owned.
    pub fn into_json(self) -> Vec<EventJson<'static>> {
        match self {
            PageEvents::Read(v) => v,
            PageEvents::Journal(v) => v
                .iter()
                .map(|e| {
                    let j = e.to_json();
                    EventJson {
                        seq: j.seq,
                        cursor: j.cursor.into_owned().into(),
                        event_type: j.event_type.map(|t| t.into_owned().into()),
                        data: j.data.into_owned().into(),
                        encoding: j.encoding,
                        time: j.time,
                    }
                })
                .collect(),
        }
    }
}

impl Serialize for PageEvents {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            PageEvents::Journal(v) => s.collect_seq(v.iter().map(|e| e.to_json())),
            PageEvents::Read(v) => s.collect_seq(v),
        }
    }
}

impl<'de> Deserialize<'de> for PageEvents {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<EventJson<'static>>::deserialize(d).map(PageEvents::Read)
    }
}

/// One page of history (a channel's, or a session's).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HistoryPage {
    /// The channel (or, for a session's history, the session's id).
    pub channel: String,
    /// The journal incarnation.
    pub epoch: Epoch,
    /// The oldest retained seq (`head + 1` when nothing is retained).
    #[schema(minimum = 1)]
    pub floor: u64,
    /// The newest seq ever assigned; 0 before the first event.
    pub head: u64,
    /// The page's events, in seq order: at most `limit`, and fewer once they
    /// hold 4 MiB of data (never none while events remain).
    #[schema(value_type = Vec<EventJson>)]
    pub events: PageEvents,
    /// The cursor to pass as `after` for the next page; on the page with
    /// `done: true`, the position of the head when the page was read (follow
    /// live from it).
    #[schema(value_type = crate::Cursor)]
    pub next: String,
    /// Whether this page reaches the head.
    pub done: bool,
    /// Only on a page read with `since=time:UNIX_MS` that starts at the
    /// floor because an event no longer retained may be at or after that
    /// time: the evicted seqs, as a gap notice of reason `evicted` (`after`
    /// at seq 0, `next` at the floor - 1; which of them were at or after
    /// the time is not known once they are gone). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::event::GapNotice>, nullable = false)]
    pub gap: Option<crate::event::GapNotice<'static>>,
}

/// A channel's bounds and audience.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChannelInfo {
    /// The channel.
    #[schema(value_type = ChannelName)]
    pub channel: String,
    /// The journal incarnation.
    pub epoch: Epoch,
    /// The oldest retained seq (`head + 1` when nothing is retained; 1 for a
    /// channel never published to).
    #[schema(minimum = 1)]
    pub floor: u64,
    /// The newest seq ever assigned; 0 before the first event.
    pub head: u64,
    /// Subscribers on this node now.
    pub subscribers: usize,
    /// The channel's namespace: its name up to the first `:`, `default` for
    /// a name without one (its rules are the namespace's table in the
    /// server's configuration file, else the server's settings). Empty from
    /// a server before namespaces.
    #[serde(default)]
    pub namespace: String,
    /// The retention that applies to the channel: its namespace's.
    #[serde(default)]
    pub retention: RetentionLimits,
}

/// A channel's retention (docs/api.md, "Retention"): every limit applies,
/// whichever evicts more wins; 0 is no limit of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RetentionLimits {
    /// Most events kept (`retention_events`); right after a publish the
    /// channel serves at most its newest this many. 0: no count limit.
    pub events: u64,
    /// Age in milliseconds after which events are evicted (`retention_ms`),
    /// at most about a second late. 0: no age limit.
    pub ms: u64,
    /// Most bytes of event data kept (`retention_bytes`): the newest events
    /// whose data fits, and always the newest event. 0: no byte limit.
    pub bytes: u64,
}

/// Where a session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum SessionStatus {
    /// Takes events.
    Open,
    /// Ended by its producer after its last event.
    Completed,
    /// Ended by its producer, or by the grace window running out with no consumer.
    Cancelled,
}

/// A session as its producer sees it.
//
// (Not in the document:) the answer of create, complete, cancel and info.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SessionInfo {
    /// The session's id.
    #[schema(value_type = SessionId)]
    pub id: String,
    /// Where it is in its life.
    pub status: SessionStatus,
    /// Its newest seq (the lifecycle markers count).
    pub head: u64,
    /// Whether a consumer is attached now.
    pub attached: bool,
}

/// The answer to an append (201, or 200 for an idempotent retry).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SessionAppended {
    /// The session's id.
    #[schema(value_type = SessionId)]
    pub id: String,
    /// The event's seq.
    #[schema(minimum = 1)]
    pub seq: u64,
    /// Whether a consumer is attached now.
    pub attached: bool,
}

#[cfg(test)]
mod tests {
    /// The last symbols [`BASE64_PATTERN`] allows are exactly those the
    /// decoder takes: a body the OpenAPI document calls valid is decoded.
    #[test]
    fn base64_pattern_matches_the_decoder() {
        use base64::Engine;
        const ALPHABET: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        for c in ALPHABET.chars() {
            let one = format!("A{c}==");
            let two = format!("AA{c}=");
            let decodes = |t: &str| base64::engine::general_purpose::STANDARD.decode(t).is_ok();
            assert_eq!(decodes(&one), "AQgw".contains(c), "{one}");
            assert_eq!(decodes(&two), "AEIMQUYcgkosw048".contains(c), "{two}");
        }
        assert!(
            BASE64_PATTERN.contains("[AQgw]==") && BASE64_PATTERN.contains("[AEIMQUYcgkosw048]=")
        );
    }

    use super::*;

    #[test]
    fn a_history_page_reads_back_what_the_server_writes() {
        let e = Arc::new(Event::new(
            "c".into(),
            Epoch(0x9f),
            3,
            Some("t".into()),
            "x\"y".into(),
            10,
        ));
        let page = HistoryPage {
            channel: "c".into(),
            epoch: Epoch(0x9f),
            floor: 1,
            head: 3,
            events: PageEvents::Journal(vec![e.clone()]),
            next: e.cursor().to_owned(),
            done: true,
            gap: None,
        };
        let text = serde_json::to_string(&page).expect("json");
        assert!(
            text.starts_with(r#"{"channel":"c","epoch":"000000000000009f","floor":1,"head":3,"events":[{"seq":3,"cursor":""#),
            "{text}"
        );
        let back: HistoryPage = serde_json::from_str(&text).expect("read");
        assert_eq!(back.epoch, Epoch(0x9f));
        assert_eq!(back.events.clone().into_json(), page.events.into_json());
        assert_eq!(serde_json::to_string(&back).expect("json"), text);
        assert!(serde_json::from_str::<Epoch>(r#""9f""#).is_err());
    }

    #[test]
    fn a_batch_item_leaves_out_a_missing_type() {
        let e = BatchEvent {
            data: "a".into(),
            encoding: None,
            event_type: None,
        };
        assert_eq!(serde_json::to_string(&e).expect("json"), r#"{"data":"a"}"#);
        assert!(serde_json::from_str::<BatchEvent>(r#"{"data":"a","x":1}"#).is_err());
    }
}
