//! WebSocket messages (`docs/protocol.md`): reading what clients send, and
//! builders for what the server sends. The shapes are
//! `gapless_protocol::ws`'s, which the Rust client reads too; every message
//! is a JSON object whose `op` names it.

use gapless_core::subscription::{Ephemeral, Gap};
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::cursor::Cursor;
use gapless_protocol::event::GapNotice;
pub use gapless_protocol::ws::ClientMessage;
use gapless_protocol::ws::{EphemeralMessage, ErrorMessage, ServerMessage};
use serde_json::{Map, Value};
use std::borrow::Cow;

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

/// The JSON text of a message.
pub fn text(m: &ServerMessage<'_>) -> String {
    serde_json::to_string(m).unwrap_or_default()
}

/// `{"op":"error","id","code","message"}` (`id` null when the request had none).
pub fn error(id: Option<&Value>, code: ErrorCode, message: &str) -> ServerMessage<'static> {
    ServerMessage::Error(ErrorMessage {
        id: Some(id.cloned().unwrap_or(Value::Null)),
        code: Cow::Borrowed(code.as_str()),
        message: Cow::Owned(message.to_owned()),
        extra: Map::new(),
    })
}

/// `{"op":"error","id","code","message",…}` for a request refused with `e`:
/// the extra fields of the HTTP answer too (`limit`, `retry_after`,
/// `retry_after_ms`, …), so that a refusal over the socket says what the
/// same refusal over HTTP says.
pub fn refused(id: Option<&Value>, e: &crate::error::ApiError) -> ServerMessage<'static> {
    let mut m = error(id, e.code, &e.message);
    if let ServerMessage::Error(m) = &mut m {
        m.extra = e.extra.clone();
    }
    m
}

/// `{"op":"error","code","message"}` without an `id`: the refusal of a
/// whole socket (a close follows).
pub fn refusal(code: ErrorCode, message: &str) -> ServerMessage<'_> {
    ServerMessage::Error(ErrorMessage {
        id: None,
        code: Cow::Borrowed(code.as_str()),
        message: Cow::Borrowed(message),
        extra: Map::new(),
    })
}

/// `{"op":"gap","channel","after","next","reason"}`.
pub fn gap(g: &Gap) -> ServerMessage<'_> {
    let after = g
        .after
        .map(|(e, s)| Cursor::single(&g.channel, e, s).encode());
    ServerMessage::Gap(GapNotice {
        channel: Cow::Borrowed(&g.channel),
        after,
        next: Cursor::single(&g.channel, g.next.0, g.next.1).encode(),
        reason: Cow::Borrowed(g.reason.as_str()),
    })
}

/// `{"op":"ephemeral","channel","type","data","time"}`.
pub fn ephemeral(e: &Ephemeral) -> ServerMessage<'_> {
    ServerMessage::Ephemeral(EphemeralMessage {
        channel: Cow::Borrowed(&e.channel),
        event_type: e.event_type.as_deref().map(Cow::Borrowed),
        data: e.data.wire(),
        encoding: e.data.encoding(),
        time: e.time,
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

    #[test]
    fn errors_name_their_request_or_none() {
        let e = crate::error::ApiError::new(ErrorCode::TooLarge, "big").with("limit", 10);
        assert_eq!(
            text(&refused(Some(&Value::from(5)), &e)),
            r#"{"op":"error","id":5,"code":"too_large","message":"big","limit":10}"#
        );
        assert_eq!(
            text(&error(None, ErrorCode::InvalidMessage, "x")),
            r#"{"op":"error","id":null,"code":"invalid_message","message":"x"}"#
        );
        assert_eq!(
            text(&refusal(ErrorCode::Unauthorized, "x")),
            r#"{"op":"error","code":"unauthorized","message":"x"}"#
        );
    }
}
