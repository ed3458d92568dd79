//! Events: what a publisher sends ([`NewEvent`]) and what the journal holds ([`Event`]).
//!
//! A journaled event is immutable once committed, so its wire encodings are
//! computed once, on first use, and shared by every subscriber as
//! reference-counted [`Bytes`] (design: "a subscriber is a cursor, not a queue").

use crate::cursor::Cursor;
use crate::sse::{self, Format};
use crate::ws::{EventMessage, ServerMessage};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, OnceLock};

/// The identity of one incarnation of a channel's journal. It changes only
/// when history is really lost. Shown on the wire as 16 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Epoch(pub u64);

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Epoch({self})")
    }
}

impl Serialize for Epoch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl std::str::FromStr for Epoch {
    type Err = String;

    /// Reads the wire form: exactly 16 hex digits.
    fn from_str(s: &str) -> Result<Self, String> {
        if s.len() != 16 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("an epoch is 16 hex digits, not {s:?}"));
        }
        u64::from_str_radix(s, 16)
            .map(Epoch)
            .map_err(|e| format!("epoch {s:?}: {e}"))
    }
}

impl<'de> Deserialize<'de> for Epoch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = Cow::<'de, str>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// An event's data: UTF-8 text (what every event was before binary payloads,
/// and what an event is unless its publisher said otherwise) or bytes.
///
/// The journals store which of the two an event is (a flag beside the data;
/// a record written before the flag existed reads as text). On the wire,
/// text is written as is and bytes as standard base64 (RFC 4648 section 4,
/// padded) marked `"encoding":"base64"` in JSON, or with an `encoding: base64`
/// line in a plain SSE frame (docs/api.md, "Binary data").
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Payload {
    /// UTF-8 text.
    Text(String),
    /// Any bytes, kept exactly.
    Binary(Vec<u8>),
}

impl Payload {
    /// The data's bytes (a text's UTF-8).
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Payload::Text(s) => s.as_bytes(),
            Payload::Binary(b) => b,
        }
    }

    /// Its length in bytes (what `--max-event-bytes` counts).
    pub fn len(&self) -> usize {
        self.as_bytes().len()
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.as_bytes().is_empty()
    }

    /// Whether it is bytes rather than text.
    pub fn is_binary(&self) -> bool {
        matches!(self, Payload::Binary(_))
    }

    /// The text, or `None` for bytes.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Payload::Text(s) => Some(s),
            Payload::Binary(_) => None,
        }
    }

    /// How the wire form of [`Payload::wire`] is encoded: `None` for text,
    /// [`Encoding::Base64`] for bytes.
    pub fn encoding(&self) -> Option<Encoding> {
        self.is_binary().then_some(Encoding::Base64)
    }

    /// The data as a JSON string or SSE `data:` carries it: the text itself,
    /// or the bytes in standard padded base64.
    pub fn wire(&self) -> Cow<'_, str> {
        use base64::Engine;
        match self {
            Payload::Text(s) => Cow::Borrowed(s),
            Payload::Binary(b) => Cow::Owned(base64::engine::general_purpose::STANDARD.encode(b)),
        }
    }

    /// The data from its wire form and encoding (the reverse of
    /// [`Payload::wire`]).
    ///
    /// # Errors
    /// A message naming the fault when `encoding` is base64 and `wire` is
    /// not standard padded base64.
    pub fn from_wire(wire: String, encoding: Option<Encoding>) -> Result<Self, String> {
        use base64::Engine;
        match encoding {
            None => Ok(Payload::Text(wire)),
            Some(Encoding::Base64) => base64::engine::general_purpose::STANDARD
                .decode(wire.as_bytes())
                .map(Payload::Binary)
                .map_err(|e| format!("data is not standard padded base64: {e}")),
        }
    }

    /// Bytes that are read as text when they are UTF-8 (`binary` false) and
    /// kept as bytes otherwise.
    ///
    /// # Errors
    /// The offset of the first byte that is not UTF-8, when `binary` is false.
    pub fn from_bytes(bytes: Vec<u8>, binary: bool) -> Result<Self, usize> {
        if binary {
            return Ok(Payload::Binary(bytes));
        }
        String::from_utf8(bytes)
            .map(Payload::Text)
            .map_err(|e| e.utf8_error().valid_up_to())
    }
}

impl Default for Payload {
    fn default() -> Self {
        Payload::Text(String::new())
    }
}

impl From<String> for Payload {
    fn from(s: String) -> Self {
        Payload::Text(s)
    }
}

impl From<&str> for Payload {
    fn from(s: &str) -> Self {
        Payload::Text(s.to_owned())
    }
}

impl PartialEq<str> for Payload {
    fn eq(&self, other: &str) -> bool {
        self.as_text() == Some(other)
    }
}

impl PartialEq<&str> for Payload {
    fn eq(&self, other: &&str) -> bool {
        self.as_text() == Some(*other)
    }
}

impl PartialEq<String> for Payload {
    fn eq(&self, other: &String) -> bool {
        self.as_text() == Some(other.as_str())
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Payload::Text(s) => fmt::Debug::fmt(s, f),
            Payload::Binary(b) => write!(f, "Binary({} bytes)", b.len()),
        }
    }
}

/// How a wire `data` string encodes bytes: the `encoding` field of an event's
/// JSON shapes, absent for text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Standard padded base64 (RFC 4648 section 4) of the event's bytes.
    Base64,
}

impl Encoding {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Base64 => "base64",
        }
    }
}

/// An event as a publisher submits it, before the journal gives it a seq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// Optional type (already validated by [`crate::name::validate_type`]).
    pub event_type: Option<String>,
    /// The payload: text, or bytes.
    pub data: Payload,
}

/// A journaled event: immutable, with lazily built shared encodings.
pub struct Event {
    /// The channel it belongs to.
    pub channel: Arc<str>,
    /// The journal incarnation that assigned `seq`.
    pub epoch: Epoch,
    /// Position in the channel: dense, from 1.
    pub seq: u64,
    /// Optional type.
    pub event_type: Option<String>,
    /// The payload: text, or bytes.
    pub data: Payload,
    /// Commit time, Unix milliseconds.
    pub time: u64,
    cache: Cache,
}

#[derive(Default)]
struct Cache {
    cursor: OnceLock<String>,
    plain_frame: OnceLock<Bytes>,
    plain_body: OnceLock<Bytes>,
    envelope_frame: OnceLock<Bytes>,
    envelope_body: OnceLock<Bytes>,
    ws_message: OnceLock<Bytes>,
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("channel", &self.channel)
            .field("epoch", &self.epoch)
            .field("seq", &self.seq)
            .field("event_type", &self.event_type)
            .field("data", &self.data)
            .field("time", &self.time)
            .finish()
    }
}

/// JSON shape of an event in history pages: `{"seq","cursor","type","data","time"}`.
//
// (Not in the document:) the server writes it borrowed from the journal's
// `Event`; a client reads it as `EventJson<'static>` (every string owned).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = Event)]
pub struct EventJson<'a> {
    /// The event's seq: its position in the channel, dense from 1.
    #[schema(minimum = 1)]
    pub seq: u64,
    /// The single-channel cursor positioned at this event (pass it as `after`
    /// or `last_event_id` to continue after it).
    #[schema(value_type = crate::Cursor)]
    pub cursor: Cow<'a, str>,
    /// The type, or null.
    #[serde(rename = "type")]
    #[schema(value_type = Option<String>)]
    pub event_type: Option<Cow<'a, str>>,
    /// The payload: UTF-8 text as published, or, with `encoding`, the
    /// event's bytes in that encoding.
    #[schema(value_type = String)]
    pub data: Cow<'a, str>,
    /// `"base64"` when the event's data is bytes (`data` is then their
    /// standard padded base64); absent for text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<Encoding>,
    /// Commit time, Unix milliseconds.
    pub time: u64,
}

/// JSON shape of `?format=envelope` SSE data: `{"channel","seq","type","data","time"}`;
/// `seq` is null for an ephemeral event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Envelope<'a> {
    /// The channel.
    #[schema(value_type = String)]
    pub channel: Cow<'a, str>,
    /// The seq, or null for an ephemeral event.
    #[schema(minimum = 1)]
    pub seq: Option<u64>,
    /// The type, or null.
    #[serde(rename = "type")]
    #[schema(value_type = Option<String>)]
    pub event_type: Option<Cow<'a, str>>,
    /// The payload: text, or, with `encoding`, the event's bytes in that
    /// encoding.
    #[schema(value_type = String)]
    pub data: Cow<'a, str>,
    /// `"base64"` when the event's data is bytes; absent for text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<Encoding>,
    /// Unix ms.
    pub time: u64,
}

/// JSON shape of a gap notice (the data of an SSE `event: gap`, and the
/// WebSocket `gap` message's fields): the hole is every event after `after`
/// up to and including `next`, which is where delivery continues.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GapNotice<'a> {
    /// The channel.
    #[schema(value_type = crate::schema::ChannelName)]
    pub channel: Cow<'a, str>,
    /// The client's position before the hole, as a single-channel cursor;
    /// null when it could not be read (reason `unknown`).
    #[schema(value_type = Option<crate::Cursor>)]
    pub after: Option<String>,
    /// Where delivery continues, as a single-channel cursor.
    #[schema(value_type = crate::Cursor)]
    pub next: String,
    /// Why.
    //
    // (Not in the document:) one of `GapReason`'s strings; a client reads a
    // reason it does not know as `unknown`.
    #[schema(value_type = crate::codes::GapReason)]
    pub reason: Cow<'a, str>,
}

impl Event {
    /// Builds a journaled event.
    pub fn new(
        channel: Arc<str>,
        epoch: Epoch,
        seq: u64,
        event_type: Option<String>,
        data: Payload,
        time: u64,
    ) -> Self {
        Event {
            channel,
            epoch,
            seq,
            event_type,
            data,
            time,
            cache: Cache::default(),
        }
    }

    /// The single-channel cursor positioned at this event.
    pub fn cursor(&self) -> &str {
        self.cache
            .cursor
            .get_or_init(|| Cursor::single(&self.channel, self.epoch, self.seq).encode())
    }

    /// The JSON history shape of this event.
    pub fn to_json(&self) -> EventJson<'_> {
        EventJson {
            seq: self.seq,
            cursor: Cow::Borrowed(self.cursor()),
            event_type: self.event_type.as_deref().map(Cow::Borrowed),
            data: self.data.wire(),
            encoding: self.data.encoding(),
            time: self.time,
        }
    }

    /// The envelope shape of this event.
    pub fn envelope(&self) -> Envelope<'_> {
        Envelope {
            channel: Cow::Borrowed(&self.channel),
            seq: Some(self.seq),
            event_type: self.event_type.as_deref().map(Cow::Borrowed),
            data: self.data.wire(),
            encoding: self.data.encoding(),
            time: self.time,
        }
    }

    /// The WebSocket message of this event (JSON text, see `docs/protocol.md`):
    /// `{"op":"event","channel","seq","cursor","type","data","time"}`, with
    /// `"encoding":"base64"` after `data` when the data is bytes.
    pub fn ws_message(&self) -> &Bytes {
        self.cache.ws_message.get_or_init(|| {
            let msg = ServerMessage::Event(EventMessage {
                channel: Cow::Borrowed(&self.channel),
                seq: self.seq,
                cursor: Cow::Borrowed(self.cursor()),
                event_type: self.event_type.as_deref().map(Cow::Borrowed),
                data: self.data.wire(),
                encoding: self.data.encoding(),
                time: self.time,
            });
            Bytes::from(serde_json::to_vec(&msg).unwrap_or_default())
        })
    }

    /// The SSE frame without an `id:` line (`event:`, `data:` lines, blank line),
    /// for multi-channel streams whose id is the subscription's cursor.
    pub fn sse_body(&self, format: Format) -> &Bytes {
        let cell = match format {
            Format::Plain => &self.cache.plain_body,
            Format::Envelope => &self.cache.envelope_body,
        };
        cell.get_or_init(|| {
            let mut out = Vec::with_capacity(self.data.len() + 32);
            self.write_body(format, &mut out);
            Bytes::from(out)
        })
    }

    /// The whole SSE frame with `id: <this event's cursor>`, for single-channel streams.
    pub fn sse_frame(&self, format: Format) -> &Bytes {
        let cell = match format {
            Format::Plain => &self.cache.plain_frame,
            Format::Envelope => &self.cache.envelope_frame,
        };
        cell.get_or_init(|| {
            let mut out = Vec::with_capacity(self.data.len() + 80);
            sse::write_id(&mut out, self.cursor());
            self.write_body(format, &mut out);
            Bytes::from(out)
        })
    }

    fn write_body(&self, format: Format, out: &mut Vec<u8>) {
        match format {
            Format::Plain => match &self.data {
                Payload::Text(text) => sse::write_event(out, self.event_type.as_deref(), text),
                Payload::Binary(_) => sse::write_encoded_event(
                    out,
                    self.event_type.as_deref(),
                    Encoding::Base64,
                    &self.data.wire(),
                ),
            },
            Format::Envelope => {
                let json = serde_json::to_string(&self.envelope()).unwrap_or_default();
                sse::write_event(out, self.event_type.as_deref(), &json)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_cached_and_shared() {
        let e = Event::new("c".into(), Epoch(5), 3, Some("t".into()), "x\ny".into(), 10);
        let a = e.sse_frame(Format::Plain).clone();
        let b = e.sse_frame(Format::Plain).clone();
        assert_eq!(a.as_ptr(), b.as_ptr());
        let text = std::str::from_utf8(&a).expect("utf8");
        assert_eq!(
            text,
            format!("id: {}\nevent: t\ndata: x\ndata: y\n\n", e.cursor())
        );
        let env = std::str::from_utf8(e.sse_body(Format::Envelope)).expect("utf8");
        assert_eq!(
            env,
            "event: t\ndata: {\"channel\":\"c\",\"seq\":3,\"type\":\"t\",\"data\":\"x\\ny\",\"time\":10}\n\n"
        );
    }

    /// The flag costs one word per event in memory at most (design.md,
    /// "memory"): a `Payload` is a `String`'s size plus the variant's tag.
    #[test]
    fn a_payload_costs_at_most_one_word_more_than_a_string() {
        assert!(std::mem::size_of::<Payload>() <= std::mem::size_of::<String>() + 8);
    }

    #[test]
    fn binary_data_is_base64_and_marked_in_every_shape() {
        let bytes: Vec<u8> = vec![0, 0xff, b'\n', b'\r', 0x80];
        let e = Event::new(
            "c".into(),
            Epoch(5),
            3,
            None,
            Payload::Binary(bytes.clone()),
            10,
        );
        let plain = std::str::from_utf8(e.sse_body(Format::Plain)).expect("utf8");
        assert_eq!(plain, "encoding: base64\ndata: AP8KDYA=\n\n");
        let env = std::str::from_utf8(e.sse_body(Format::Envelope)).expect("utf8");
        assert_eq!(
            env,
            "data: {\"channel\":\"c\",\"seq\":3,\"type\":null,\"data\":\"AP8KDYA=\",\"encoding\":\"base64\",\"time\":10}\n\n"
        );
        let json = serde_json::to_string(&e.to_json()).expect("json");
        assert!(
            json.contains(r#""data":"AP8KDYA=","encoding":"base64""#),
            "{json}"
        );
        let back: EventJson<'static> = serde_json::from_str(&json).expect("reads");
        let data = Payload::from_wire(back.data.into_owned(), back.encoding).expect("base64");
        assert_eq!(data, Payload::Binary(bytes));
        let ws = std::str::from_utf8(e.ws_message()).expect("utf8");
        assert!(ws.contains(r#""encoding":"base64""#), "{ws}");
        assert!(Payload::from_wire("not base64!".into(), Some(Encoding::Base64)).is_err());
        assert_eq!(Payload::from_bytes(vec![0xff], false), Err(0));
    }
}
