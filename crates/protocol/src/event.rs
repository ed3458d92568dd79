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

/// An event as a publisher submits it, before the journal gives it a seq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// Optional type (already validated by [`crate::name::validate_type`]).
    pub event_type: Option<String>,
    /// The payload, UTF-8 text.
    pub data: String,
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
    /// The payload.
    pub data: String,
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
    /// The payload, UTF-8 text as published.
    #[schema(value_type = String)]
    pub data: Cow<'a, str>,
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
    /// The payload.
    #[schema(value_type = String)]
    pub data: Cow<'a, str>,
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
        data: String,
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
            data: Cow::Borrowed(&self.data),
            time: self.time,
        }
    }

    /// The envelope shape of this event.
    pub fn envelope(&self) -> Envelope<'_> {
        Envelope {
            channel: Cow::Borrowed(&self.channel),
            seq: Some(self.seq),
            event_type: self.event_type.as_deref().map(Cow::Borrowed),
            data: Cow::Borrowed(&self.data),
            time: self.time,
        }
    }

    /// The WebSocket message of this event (JSON text, see `docs/protocol.md`):
    /// `{"op":"event","channel","seq","cursor","type","data","time"}`.
    pub fn ws_message(&self) -> &Bytes {
        self.cache.ws_message.get_or_init(|| {
            let msg = ServerMessage::Event(EventMessage {
                channel: Cow::Borrowed(&self.channel),
                seq: self.seq,
                cursor: Cow::Borrowed(self.cursor()),
                event_type: self.event_type.as_deref().map(Cow::Borrowed),
                data: Cow::Borrowed(&self.data),
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
            Format::Plain => sse::write_event(out, self.event_type.as_deref(), &self.data),
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
}
