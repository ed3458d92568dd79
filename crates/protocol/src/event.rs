//! Events: what a publisher sends ([`NewEvent`]) and what the journal holds ([`Event`]).
//!
//! A journaled event is immutable once committed, so its wire encodings are
//! computed once, on first use, and shared by every subscriber as
//! reference-counted [`Bytes`] (design: "a subscriber is a cursor, not a queue").

use crate::cursor::Cursor;
use crate::sse::{self, Format};
use bytes::Bytes;
use serde::Serialize;
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
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = Event)]
pub struct EventJson<'a> {
    /// The event's seq: its position in the channel, dense from 1.
    #[schema(minimum = 1)]
    pub seq: u64,
    /// The single-channel cursor positioned at this event (pass it as `after`
    /// or `last_event_id` to continue after it).
    #[schema(value_type = crate::Cursor)]
    pub cursor: &'a str,
    /// The type, or null.
    #[serde(rename = "type")]
    pub event_type: Option<&'a str>,
    /// The payload, UTF-8 text as published.
    pub data: &'a str,
    /// Commit time, Unix milliseconds.
    pub time: u64,
}

/// JSON shape of `?format=envelope` SSE data: `{"channel","seq","type","data","time"}`;
/// `seq` is null for an ephemeral event.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Envelope<'a> {
    /// The channel.
    pub channel: &'a str,
    /// The seq, or null for an ephemeral event.
    #[schema(minimum = 1)]
    pub seq: Option<u64>,
    /// The type, or null.
    #[serde(rename = "type")]
    pub event_type: Option<&'a str>,
    /// The payload.
    pub data: &'a str,
    /// Unix ms.
    pub time: u64,
}

/// JSON shape of a gap notice (the data of an SSE `event: gap`, and the
/// WebSocket `gap` message's fields): the hole is every event after `after`
/// up to and including `next`, which is where delivery continues.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct GapNotice<'a> {
    /// The channel.
    #[schema(value_type = crate::schema::ChannelName)]
    pub channel: &'a str,
    /// The client's position before the hole, as a single-channel cursor;
    /// null when it could not be read (reason `unknown`).
    #[schema(value_type = Option<crate::Cursor>)]
    pub after: Option<String>,
    /// Where delivery continues, as a single-channel cursor.
    #[schema(value_type = crate::Cursor)]
    pub next: String,
    /// Why.
    #[schema(value_type = crate::codes::GapReason)]
    pub reason: &'static str,
}

#[derive(Serialize)]
struct WsEvent<'a> {
    op: &'static str,
    channel: &'a str,
    seq: u64,
    cursor: &'a str,
    #[serde(rename = "type")]
    event_type: Option<&'a str>,
    data: &'a str,
    time: u64,
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
            cursor: self.cursor(),
            event_type: self.event_type.as_deref(),
            data: &self.data,
            time: self.time,
        }
    }

    /// The envelope shape of this event.
    pub fn envelope(&self) -> Envelope<'_> {
        Envelope {
            channel: &self.channel,
            seq: Some(self.seq),
            event_type: self.event_type.as_deref(),
            data: &self.data,
            time: self.time,
        }
    }

    /// The WebSocket message of this event (JSON text, see `docs/protocol.md`):
    /// `{"op":"event","channel","seq","cursor","type","data","time"}`.
    pub fn ws_message(&self) -> &Bytes {
        self.cache.ws_message.get_or_init(|| {
            let msg = WsEvent {
                op: "event",
                channel: &self.channel,
                seq: self.seq,
                cursor: self.cursor(),
                event_type: self.event_type.as_deref(),
                data: &self.data,
                time: self.time,
            };
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
