//! JSON Schemas of the wire types (for the server's OpenAPI document, built
//! with `utoipa`): each is derived from the rule it describes, so the
//! document cannot say something the code does not do.
//!
//! - [`Epoch`]: 16 lowercase hex digits (its `Display`).
//! - [`Cursor`]: an opaque URL-safe base64 string of at most
//!   [`MAX_CURSOR_LEN`](crate::cursor::MAX_CURSOR_LEN) bytes.
//! - [`ErrorCode`]: the `error` field, one of [`ErrorCode::ALL`].
//! - [`GapReason`]: one of [`GapReason::ALL`].
//! - [`ChannelName`] and [`EventType`]: the name rules of [`crate::name`] as
//!   patterns; [`SessionId`]: a session id; [`Seq`]: a seq parameter. They
//!   are schema-only types: names and ids travel as `String`s, seqs as `u64`s.
//!
//! No HTTP here: these are schemas of values, whatever carries them.

use crate::codes::{ErrorCode, GapReason};
use crate::cursor::{Cursor, MAX_CURSOR_LEN};
use crate::event::Epoch;
use crate::name::{
    MAX_CHANNEL_LEN, MAX_SESSION_ID_LEN, MAX_TYPE_LEN, RESERVED_TYPES, RESERVED_TYPE_PREFIX,
};
use std::borrow::Cow;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};

fn string(description: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(description))
}

/// Escapes `s` for a regular expression.
fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = matches!(
                c,
                '.' | '*' | '+' | '?' | '(' | ')' | '[' | ']' | '{' | '}' | '|' | '^' | '$' | '\\'
            );
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

impl PartialSchema for Epoch {
    fn schema() -> RefOr<Schema> {
        string(
            "The journal incarnation that issued a seq: 16 lowercase hex digits. It changes \
             only when a channel's history is really lost (docs/design.md).",
        )
        .pattern(Some("^[0-9a-f]{16}$"))
        .examples(["9f0c3a1b2c3d4e5f"])
        .into()
    }
}

impl ToSchema for Epoch {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Epoch")
    }
}

impl PartialSchema for Cursor {
    fn schema() -> RefOr<Schema> {
        string(
            "An opaque position (URL-safe base64, no padding) holding, per channel, the \
             journal's epoch and the last seq delivered. Clients store and relay it; they \
             never parse or build one. It carries a checksum: one that fails it is refused \
             with 400 `invalid_cursor`.",
        )
        .pattern(Some("^[A-Za-z0-9_-]*$"))
        .max_length(Some(MAX_CURSOR_LEN))
        .into()
    }
}

impl ToSchema for Cursor {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Cursor")
    }
}

impl PartialSchema for ErrorCode {
    fn schema() -> RefOr<Schema> {
        string(
            "What went wrong, from the registry of error codes: each code has one HTTP \
             status (docs/api.md, \"Errors\").",
        )
        .enum_values(Some(ErrorCode::ALL.iter().map(|c| c.as_str())))
        .into()
    }
}

impl ToSchema for ErrorCode {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("ErrorCode")
    }
}

impl PartialSchema for GapReason {
    fn schema() -> RefOr<Schema> {
        string(
            "Why a range of a channel cannot be delivered: `evicted` (retention removed it), \
             `epoch` (another incarnation of the journal), `ahead` (beyond the head), \
             `unknown` (a position this server cannot read).",
        )
        .enum_values(Some(GapReason::ALL.iter().map(|r| r.as_str())))
        .into()
    }
}

impl ToSchema for GapReason {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("GapReason")
    }
}

/// The schema of a seq given as a parameter: any `u64` (`int64`, the
/// format the derives give `u64`, would claim a signed range).
#[derive(Debug)]
pub struct Seq;

impl PartialSchema for Seq {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .description(Some(
                "A seq: a position in a channel, dense from 1 (0 is before the first event).",
            ))
            .minimum(Some(0))
            .maximum(Some(u64::MAX))
            .into()
    }
}

impl ToSchema for Seq {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Seq")
    }
}

/// The schema of a channel name ([`crate::name::validate_channel`]).
#[derive(Debug)]
pub struct ChannelName;

impl PartialSchema for ChannelName {
    fn schema() -> RefOr<Schema> {
        string(&format!(
            "A channel: 1 to {MAX_CHANNEL_LEN} characters of A-Z a-z 0-9 _ - . : @ ~. \
             Channels need no creation. Anything else is refused with 400 `invalid_channel`."
        ))
        .pattern(Some(format!("^[A-Za-z0-9_.:@~-]{{1,{MAX_CHANNEL_LEN}}}$")))
        .min_length(Some(1))
        .max_length(Some(MAX_CHANNEL_LEN))
        .examples(["orders"])
        .into()
    }
}

impl ToSchema for ChannelName {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("ChannelName")
    }
}

/// The schema of a session id (`gapless_core::session::valid_id`); ids
/// travel as `String`s.
#[derive(Debug)]
pub struct SessionId;

impl PartialSchema for SessionId {
    fn schema() -> RefOr<Schema> {
        let max = MAX_SESSION_ID_LEN;
        string(&format!(
            "A session: 1 to {max} characters of A-Z a-z 0-9 _ - (named `session/ID` in \
             token patterns)."
        ))
        .pattern(Some(format!("^[A-Za-z0-9_-]{{1,{max}}}$")))
        .min_length(Some(1))
        .max_length(Some(max))
        .into()
    }
}

impl ToSchema for SessionId {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("SessionId")
    }
}

/// The schema of an event type a publisher may use
/// ([`crate::name::validate_type`]): the reserved names are excluded.
#[derive(Debug)]
pub struct EventType;

impl EventType {
    /// The pattern: the alphabet and length, minus the reserved names and prefix.
    pub fn pattern() -> String {
        let reserved: String = RESERVED_TYPES
            .iter()
            .map(|t| format!("(?!{}$)", regex_escape(t)))
            .collect();
        format!(
            "^{reserved}(?!{})[A-Za-z0-9_.:-]{{1,{MAX_TYPE_LEN}}}$",
            regex_escape(RESERVED_TYPE_PREFIX)
        )
    }
}

impl PartialSchema for EventType {
    fn schema() -> RefOr<Schema> {
        string(&format!(
            "An event type (the SSE `event:` field): 1 to {MAX_TYPE_LEN} characters of \
             A-Z a-z 0-9 _ - . :. {reserved} and every type starting with `{RESERVED_TYPE_PREFIX}` \
             are reserved for the server's own notices. Anything else is refused with 400 \
             `invalid_type`.",
            reserved = RESERVED_TYPES
                .iter()
                .map(|t| format!("`{t}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .pattern(Some(Self::pattern()))
        .min_length(Some(1))
        .max_length(Some(MAX_TYPE_LEN))
        .examples(["order.created"])
        .into()
    }
}

impl ToSchema for EventType {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("EventType")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::name;

    #[test]
    fn event_type_pattern_excludes_reserved_names() {
        let p = EventType::pattern();
        assert_eq!(p, r"^(?!gap$)(?!gapless\.)[A-Za-z0-9_.:-]{1,64}$");
        // The reserved names are refused by the rule the pattern mirrors.
        for t in RESERVED_TYPES {
            assert!(name::validate_type(t).is_err());
        }
        assert!(name::validate_type("gapless.x").is_err());
        assert!(name::validate_type("gaps").is_ok());
    }

    #[test]
    fn enums_list_every_wire_string() {
        let codes: std::collections::BTreeSet<_> =
            ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(codes.len(), ErrorCode::ALL.len(), "no code listed twice");
        let json = serde_json::to_value(ErrorCode::schema()).expect("schema");
        assert_eq!(json["enum"].as_array().map(Vec::len), Some(codes.len()));
        assert!(json["enum"]
            .as_array()
            .is_some_and(|v| v.iter().any(|c| c == "journal_full")));
        let json = serde_json::to_value(GapReason::schema()).expect("schema");
        assert_eq!(
            json["enum"],
            serde_json::json!(["evicted", "epoch", "ahead", "unknown"])
        );
    }

    #[test]
    fn epoch_and_cursor_examples_match_their_patterns() {
        let e = Epoch(0x9f0c).to_string();
        assert_eq!(e.len(), 16);
        assert!(e
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        let c = Cursor::single("orders", Epoch(7), 42).encode();
        assert!(c
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'));
    }
}
