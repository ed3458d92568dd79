//! Presence (issue 21, "Presence"; docs/api.md, "Presence"): who follows a
//! channel of a namespace with `presence = true`.
//!
//! A *member* is a client identity: the token's `sub`, or on an open server
//! the `client_id` a subscriber gives ([`check_client_id`]). A member's
//! connections to a channel (SSE streams and WebSocket subscriptions alike)
//! count as one member; *occupancy* counts every connection, members' or
//! not. These are the shapes both sides speak: the answer of
//! `GET /v1/channels/{channel}/presence` ([`PresenceAnswer`]) and the
//! join and leave notices ([`PresenceNotice`]: the data of an SSE
//! `event: gapless.presence`, and the fields of the WebSocket `presence`
//! message). A notice is not an event: not journaled, no seq, no cursor.

use crate::schema::ChannelName;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Longest `client_id`, in characters.
pub const MAX_CLIENT_ID_LEN: usize = 128;

/// The SSE event type of a presence notice (no `id:` line goes with it).
pub const SSE_EVENT: &str = "gapless.presence";

/// Checks a `client_id`: 1 to [`MAX_CLIENT_ID_LEN`] characters of
/// `A-Z a-z 0-9 . _ : @ -`.
///
/// # Errors
/// What is wrong with it, for a 400 `invalid_request` (or a WebSocket
/// `error`).
pub fn check_client_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_CLIENT_ID_LEN {
        return Err(format!(
            "client_id must be 1 to {MAX_CLIENT_ID_LEN} characters; this one has {}",
            id.chars().count()
        ));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '@' | '-')))
    {
        return Err(format!(
            "client_id contains {c:?}; it is made of A-Z a-z 0-9 . _ : @ -"
        ));
    }
    Ok(())
}

/// What a presence notice says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PresenceAction {
    /// The member's first connection to the channel started (a reconnect
    /// within `presence_linger_ms` of its last one is not a join).
    Join,
    /// The member's last connection to the channel has been gone
    /// `presence_linger_ms`.
    Leave,
}

/// `{"action","channel","id"}`: a member joined or left a channel. The data
/// of an SSE `event: gapless.presence` (which has no `id:` line), and the
/// fields of the WebSocket message `{"op":"presence",…}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PresenceNotice {
    /// `join` or `leave`.
    pub action: PresenceAction,
    /// The channel.
    #[schema(value_type = ChannelName)]
    pub channel: String,
    /// The member: a token's `sub`, or a `client_id`.
    pub id: String,
}

/// One member of a channel in a [`PresenceAnswer`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PresenceMember {
    /// The member: a token's `sub`, or a `client_id`.
    pub id: String,
    /// Its connections to the channel now; 0 while its last one is gone
    /// for less than `presence_linger_ms` (it has not left yet).
    pub connections: usize,
    /// When it joined, Unix milliseconds.
    pub since: u64,
}

/// The answer of `GET /v1/channels/{channel}/presence`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PresenceAnswer {
    /// The channel.
    #[schema(value_type = ChannelName)]
    pub channel: String,
    /// Connections to the channel now (SSE streams and WebSocket
    /// subscriptions), members' or not.
    pub occupancy: usize,
    /// Its members, sorted by id.
    pub members: Vec<PresenceMember>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids() {
        for ok in ["a", "user-1", "a.b_c:d@e-f", &"x".repeat(128)] {
            assert!(check_client_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a b", "é", "a/b", &"x".repeat(129)] {
            assert!(check_client_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_notice_is_what_the_docs_show() {
        let n = PresenceNotice {
            action: PresenceAction::Join,
            channel: "chat:x".into(),
            id: "ana".into(),
        };
        assert_eq!(
            serde_json::to_string(&n).expect("json"),
            r#"{"action":"join","channel":"chat:x","id":"ana"}"#
        );
    }
}
