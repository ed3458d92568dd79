//! The WebSocket messages of the subprotocol `gapless.v1` (docs/protocol.md):
//! every message is one JSON object in one text frame, named by its `op`.
//!
//! - [`ClientMessage`]: what a client sends on `GET /v1/ws`;
//! - [`ServerMessage`]: what the server sends on `GET /v1/ws`;
//! - [`SessionMessage`]: what the server sends on `GET /v1/sessions/{id}/ws`.
//!
//! The server writes them (borrowing what it has, with `'a` the lifetime of
//! its event or notice) and the Rust client reads them (as `…<'static>`,
//! every string owned), so both sides speak one definition. The server reads
//! [`ClientMessage`] strictly (an unknown field or `op` is an
//! `invalid_message`); a client reads the server's messages leniently (an
//! unknown `op` is [`ServerMessage::Other`], unknown fields are ignored:
//! new fields may be added, docs/protocol.md).

use crate::event::GapNotice;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::borrow::Cow;

/// A message from a client on `/v1/ws`. `id` is any JSON string or number,
/// echoed in the reply. Optional fields are left out when `None` (and
/// `ephemeral` when false).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientMessage {
    /// Follow a channel from `cursor` (resume), or where `since` says, or live.
    Subscribe {
        /// Request id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<Value>,
        /// The channel.
        channel: String,
        /// Resume after this cursor (`null` and `""` are no cursor).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cursor: Option<String>,
        /// Where to start when there is no cursor (a [`crate::Since`] value:
        /// `"live"`, the default, `"earliest"`, `"last:N"`, `"time:UNIX_MS"`);
        /// the server checks it even when a cursor wins.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        since: Option<String>,
        /// On an open server, the subscriber's identity for presence: 1 to
        /// 128 characters of `A-Z a-z 0-9 . _ : @ -`
        /// ([`crate::presence::check_client_id`]); on a server with keys a
        /// member is its token's `sub` and this is refused.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client_id: Option<String>,
        /// Whether to get the channel's join and leave notices
        /// (`{"op":"presence",…}`); its namespace must have presence.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        presence: bool,
    },
    /// Stop following a channel.
    Unsubscribe {
        /// Request id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<Value>,
        /// The channel.
        channel: String,
    },
    /// Publish one event (same rules and limits as the HTTP publish).
    Publish {
        /// Request id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<Value>,
        /// The channel.
        channel: String,
        /// The data: text, or with `encoding` the event's bytes in that
        /// encoding.
        data: String,
        /// `"base64"` to publish bytes (`data` is their standard padded
        /// base64); absent for text.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        encoding: Option<crate::Encoding>,
        /// Optional type.
        #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
        event_type: Option<String>,
        /// Live only, never journaled.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        ephemeral: bool,
        /// As the HTTP `Idempotency-Key`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        idempotency_key: Option<String>,
    },
}

/// `{"op":"event","channel","seq","cursor","type","data","time"}`: a journaled
/// event; `cursor` is the channel's cursor after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventMessage<'a> {
    /// The channel.
    pub channel: Cow<'a, str>,
    /// Its seq.
    pub seq: u64,
    /// The single-channel cursor positioned at it.
    pub cursor: Cow<'a, str>,
    /// Its type, or null.
    #[serde(rename = "type")]
    pub event_type: Option<Cow<'a, str>>,
    /// The data.
    pub data: Cow<'a, str>,
    /// `"base64"` when the data is bytes (`data` is then their standard
    /// padded base64); absent for text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<crate::Encoding>,
    /// Commit time, Unix milliseconds.
    pub time: u64,
}

/// `{"op":"ephemeral","channel","type","data","time"}`: a live-only event
/// (no seq, no cursor).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EphemeralMessage<'a> {
    /// The channel.
    pub channel: Cow<'a, str>,
    /// Its type, or null.
    #[serde(rename = "type")]
    pub event_type: Option<Cow<'a, str>>,
    /// The data.
    pub data: Cow<'a, str>,
    /// `"base64"` when the data is bytes (`data` is then their standard
    /// padded base64); absent for text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<crate::Encoding>,
    /// When the server handled it, Unix milliseconds.
    pub time: u64,
}

/// `{"op":"subscribed","id","channel","replayed","recovered","cursor"}`: the
/// reply to a `subscribe`, once its replay is over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Subscribed {
    /// The request's id (null when it had none).
    #[serde(default)]
    pub id: Option<Value>,
    /// The channel.
    pub channel: String,
    /// How many events were replayed before this reply.
    #[serde(default)]
    pub replayed: u64,
    /// Whether a cursor was served whole (false without a cursor).
    #[serde(default)]
    pub recovered: bool,
    /// The channel's cursor at the end of the replay (null when the channel
    /// is no longer followed).
    #[serde(default)]
    pub cursor: Option<String>,
}

/// `{"op":"unsubscribed","id","channel"}`: the reply to an `unsubscribe`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unsubscribed {
    /// The request's id (null when it had none).
    #[serde(default)]
    pub id: Option<Value>,
    /// The channel.
    pub channel: String,
}

/// `{"op":"published",…}`: the reply to a `publish`, with its `id` last.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PublishedMessage {
    /// `{"channel","seq","cursor","duplicate","id"}`: journaled.
    Journaled {
        /// The channel.
        channel: String,
        /// The event's seq.
        seq: u64,
        /// The single-channel cursor positioned at it.
        cursor: String,
        /// True for an idempotent retry: nothing was appended.
        duplicate: bool,
        /// The request's id (null when it had none).
        #[serde(default)]
        id: Option<Value>,
    },
    /// `{"channel","ephemeral":true,"subscribers","id"}`: handed to this
    /// many current subscribers.
    Ephemeral {
        /// The channel.
        channel: String,
        /// Always true.
        ephemeral: bool,
        /// How many subscribers it was handed to.
        subscribers: u64,
        /// The request's id (null when it had none).
        #[serde(default)]
        id: Option<Value>,
    },
}

/// `{"op":"error","id","code","message",…}`: a refused request, or a refused
/// socket (then without `id`, and a close follows).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorMessage<'a> {
    /// The request's id: `Some(Value::Null)` is written as `"id": null` (a
    /// request whose id could not be read), `None` leaves the field out (a
    /// refusal of the socket). Read back, both are `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Value>,
    /// The error code (`gapless_protocol::codes::ErrorCode`'s string).
    pub code: Cow<'a, str>,
    /// What is wrong, for a person.
    pub message: Cow<'a, str>,
    /// The extra fields of the same refusal over HTTP (`limit`,
    /// `retry_after`, `retry_after_ms`, `status`, …).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A message from the server on `/v1/ws`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ServerMessage<'a> {
    /// A journaled event.
    Event(EventMessage<'a>),
    /// A live-only event.
    Ephemeral(EphemeralMessage<'a>),
    /// A range of a channel that was not delivered.
    Gap(GapNotice<'a>),
    /// The reply to a `subscribe`.
    Subscribed(Subscribed),
    /// The reply to an `unsubscribe`.
    Unsubscribed(Unsubscribed),
    /// The reply to a `publish`.
    Published(PublishedMessage),
    /// A refusal.
    Error(ErrorMessage<'a>),
    /// `{"op":"presence","action","channel","id"}`: a member joined or left
    /// a channel the socket follows with `"presence": true` (no seq, no
    /// cursor).
    Presence(crate::presence::PresenceNotice),
    /// An `op` this side does not know (read only: never written).
    #[serde(other, skip_serializing)]
    Other,
}

impl ServerMessage<'_> {
    /// The channel the message is about, if any.
    pub fn channel(&self) -> Option<&str> {
        match self {
            ServerMessage::Event(m) => Some(&m.channel),
            ServerMessage::Ephemeral(m) => Some(&m.channel),
            ServerMessage::Gap(m) => Some(&m.channel),
            ServerMessage::Subscribed(m) => Some(&m.channel),
            ServerMessage::Unsubscribed(m) => Some(&m.channel),
            ServerMessage::Presence(m) => Some(&m.channel),
            ServerMessage::Published(
                PublishedMessage::Journaled { channel, .. }
                | PublishedMessage::Ephemeral { channel, .. },
            ) => Some(channel),
            ServerMessage::Error(_) | ServerMessage::Other => None,
        }
    }
}

/// A message from the server on `/v1/sessions/{id}/ws` (docs/protocol.md,
/// "Consumer").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op")]
pub enum SessionMessage<'a> {
    /// `{"op":"event","session","seq","type","data","time"}`.
    #[serde(rename = "event")]
    Event {
        /// The session's id.
        session: Cow<'a, str>,
        /// The event's seq.
        seq: u64,
        /// Its type, or null.
        #[serde(rename = "type")]
        event_type: Option<Cow<'a, str>>,
        /// The data.
        data: Cow<'a, str>,
        /// `"base64"` when the data is bytes; absent for text.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        encoding: Option<crate::Encoding>,
        /// Commit time, Unix milliseconds.
        time: u64,
    },
    /// `{"op":"session.resumed","session","replayed_events","head"}`: the
    /// replay (of `replayed_events` events, 0 for a live attach) is over;
    /// live delivery continues after seq `head`.
    #[serde(rename = "session.resumed")]
    Resumed {
        /// The session's id.
        #[serde(default)]
        session: Cow<'a, str>,
        /// How many events the replay held.
        replayed_events: u64,
        /// The seq after which live delivery continues (absent from servers
        /// before it was sent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        head: Option<u64>,
    },
    /// `{"op":"session.completed","session","seq"}`: the end, after every event.
    #[serde(rename = "session.completed")]
    Completed {
        /// The session's id.
        #[serde(default)]
        session: Cow<'a, str>,
        /// The end marker's seq.
        seq: u64,
    },
    /// `{"op":"session.cancelled","session","seq"}`: the end, after every event.
    #[serde(rename = "session.cancelled")]
    Cancelled {
        /// The session's id.
        #[serde(default)]
        session: Cow<'a, str>,
        /// The end marker's seq.
        seq: u64,
    },
    /// `{"op":"error","code","message",…}`: a refusal; a close follows.
    #[serde(rename = "error")]
    Error(ErrorMessage<'a>),
    /// An `op` this side does not know (read only: never written).
    #[serde(other, skip_serializing)]
    Other,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(
        m: &T,
        text: &str,
    ) {
        assert_eq!(serde_json::to_string(m).expect("json"), text);
        assert_eq!(&serde_json::from_str::<T>(text).expect("read"), m);
    }

    #[test]
    fn server_messages_have_their_documented_shapes() {
        round_trip(
            &ServerMessage::Event(EventMessage {
                channel: "orders".into(),
                seq: 42,
                cursor: "AQE".into(),
                event_type: Some("created".into()),
                data: "text".into(),
                encoding: None,
                time: 7,
            }),
            r#"{"op":"event","channel":"orders","seq":42,"cursor":"AQE","type":"created","data":"text","time":7}"#,
        );
        round_trip(
            &ServerMessage::Event(EventMessage {
                channel: "orders".into(),
                seq: 43,
                cursor: "AQE".into(),
                event_type: None,
                data: "AP8=".into(),
                encoding: Some(crate::Encoding::Base64),
                time: 7,
            }),
            r#"{"op":"event","channel":"orders","seq":43,"cursor":"AQE","type":null,"data":"AP8=","encoding":"base64","time":7}"#,
        );
        round_trip(
            &ServerMessage::Subscribed(Subscribed {
                id: Some(1.into()),
                channel: "orders".into(),
                replayed: 3,
                recovered: true,
                cursor: Some("AQE".into()),
            }),
            r#"{"op":"subscribed","id":1,"channel":"orders","replayed":3,"recovered":true,"cursor":"AQE"}"#,
        );
        round_trip(
            &ServerMessage::Published(PublishedMessage::Ephemeral {
                channel: "orders".into(),
                ephemeral: true,
                subscribers: 2,
                id: Some(6.into()),
            }),
            r#"{"op":"published","channel":"orders","ephemeral":true,"subscribers":2,"id":6}"#,
        );
        let mut extra = Map::new();
        extra.insert("limit".into(), 10.into());
        round_trip(
            &ServerMessage::Error(ErrorMessage {
                id: Some(5.into()),
                code: "too_large".into(),
                message: "big".into(),
                extra,
            }),
            r#"{"op":"error","id":5,"code":"too_large","message":"big","limit":10}"#,
        );
        round_trip(
            &SessionMessage::Resumed {
                session: "s".into(),
                replayed_events: 0,
                head: Some(1),
            },
            r#"{"op":"session.resumed","session":"s","replayed_events":0,"head":1}"#,
        );
        // A reader takes ops and fields it does not know.
        let m: ServerMessage<'static> =
            serde_json::from_str(r#"{"op":"later","x":1}"#).expect("lenient");
        assert_eq!(m, ServerMessage::Other);
        let m: SessionMessage<'static> =
            serde_json::from_str(r#"{"op":"session.completed","seq":9,"new":true}"#)
                .expect("lenient");
        assert!(matches!(m, SessionMessage::Completed { seq: 9, .. }));
    }

    #[test]
    fn client_messages_leave_out_what_is_not_set_and_refuse_unknown_fields() {
        let m = ClientMessage::Subscribe {
            id: Some(0.into()),
            channel: "c".into(),
            cursor: None,
            since: Some("earliest".into()),
            client_id: None,
            presence: false,
        };
        round_trip(
            &m,
            r#"{"op":"subscribe","id":0,"channel":"c","since":"earliest"}"#,
        );
        round_trip(
            &ClientMessage::Subscribe {
                id: None,
                channel: "c".into(),
                cursor: None,
                since: None,
                client_id: Some("ana".into()),
                presence: true,
            },
            r#"{"op":"subscribe","channel":"c","client_id":"ana","presence":true}"#,
        );
        round_trip(
            &ServerMessage::Presence(crate::presence::PresenceNotice {
                action: crate::presence::PresenceAction::Leave,
                channel: "c".into(),
                id: "ana".into(),
            }),
            r#"{"op":"presence","action":"leave","channel":"c","id":"ana"}"#,
        );
        assert!(serde_json::from_str::<ClientMessage>(
            r#"{"op":"subscribe","channel":"c","sinse":"earliest"}"#
        )
        .is_err());
    }
}
