//! WebSocket message shapes (`docs/protocol.md`): what clients send, and
//! builders for what the server sends. Every message is a JSON object whose
//! `op` names it.

use gapless_core::subscription::{Ephemeral, Gap};
use gapless_protocol::codes::ErrorCode;
use serde::Deserialize;
use serde_json::{json, Value};

/// A message from a client on `/v1/ws`. `id` is any JSON string or number,
/// echoed in the reply.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientMessage {
    /// Follow a channel from `cursor` (resume), `since: "earliest"`, or live.
    Subscribe {
        /// Request id.
        id: Option<Value>,
        /// The channel.
        channel: String,
        /// Resume after this cursor.
        cursor: Option<String>,
        /// `"earliest"` or `"live"` (default) when there is no cursor.
        since: Option<String>,
    },
    /// Stop following a channel.
    Unsubscribe {
        /// Request id.
        id: Option<Value>,
        /// The channel.
        channel: String,
    },
    /// Publish one event (same rules and limits as the HTTP publish).
    Publish {
        /// Request id.
        id: Option<Value>,
        /// The channel.
        channel: String,
        /// The data.
        data: String,
        /// Optional type.
        #[serde(rename = "type")]
        event_type: Option<String>,
        /// Live only, never journaled.
        #[serde(default)]
        ephemeral: bool,
        /// As the HTTP `Idempotency-Key`.
        idempotency_key: Option<String>,
    },
}

/// Parses a client message; on failure returns the request id (if one could
/// be read) and what is wrong.
pub fn parse(text: &str) -> Result<ClientMessage, (Option<Value>, String)> {
    let value: Value = serde_json::from_str(text).map_err(|e| (None, format!("not JSON: {e}")))?;
    let id = value.get("id").cloned();
    if let Some(id) = &id {
        if !(id.is_string() || id.is_number()) {
            return Err((None, "id must be a string or a number".to_owned()));
        }
    }
    if !value.is_object() {
        return Err((
            id,
            "a message must be a JSON object with an \"op\"".to_owned(),
        ));
    }
    serde_json::from_value(value)
        .map_err(|e| (id, format!("{e} (ops: subscribe, unsubscribe, publish)")))
}

/// `{"op":"error","id","code","message"}`.
pub fn error(id: Option<&Value>, code: ErrorCode, message: &str) -> Value {
    json!({"op": "error", "id": id, "code": code.as_str(), "message": message})
}

/// `{"op":"error","id","code","message",…}` for a request refused with `e`:
/// the extra fields of the HTTP answer too (`limit`, `retry_after`,
/// `retry_after_ms`, …), so that a refusal over the socket says what the
/// same refusal over HTTP says.
pub fn refused(id: Option<&Value>, e: &crate::error::ApiError) -> Value {
    let mut v = error(id, e.code, &e.message);
    if let Some(o) = v.as_object_mut() {
        for (k, x) in &e.extra {
            o.entry(k.clone()).or_insert_with(|| x.clone());
        }
    }
    v
}

/// `{"op":"gap","channel","after","next","reason"}`.
pub fn gap(g: &Gap) -> Value {
    let mut v: Value = serde_json::from_str(&g.to_json()).unwrap_or_else(|_| json!({}));
    if let Some(o) = v.as_object_mut() {
        o.insert("op".into(), "gap".into());
    }
    v
}

/// `{"op":"ephemeral","channel","type","data","time"}`.
pub fn ephemeral(e: &Ephemeral) -> Value {
    json!({
        "op": "ephemeral",
        "channel": &*e.channel,
        "type": e.event_type,
        "data": e.data,
        "time": e.time,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_and_ops_are_refused() {
        assert!(parse(r#"{"op":"publish","channel":"c","data":"x","ephemeral":true}"#).is_ok());
        let (id, why) =
            parse(r#"{"op":"publish","id":7,"channel":"c","data":"x","ephemral":true}"#)
                .expect_err("typo must be refused");
        assert_eq!(id, Some(Value::from(7)));
        assert!(why.contains("ephemral"), "{why}");
        assert!(parse(r#"{"op":"subscribe","channel":"c","sinse":"earliest"}"#).is_err());
        assert!(parse(r#"{"op":"nope"}"#).is_err());
        assert!(parse(r#"[1]"#).is_err());
        assert!(parse(r#"{"op":"subscribe","id":{},"channel":"c"}"#).is_err());
    }
}
