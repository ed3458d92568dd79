//! Where a subscription starts, once for every transport: a client's cursor
//! (SSE `Last-Event-ID` or `last_event_id=`, a WebSocket `cursor`), or
//! without one `since` (`live`, the default, or `earliest`), turned into a
//! [`Start`] per channel (docs/design.md, "Resume rules").
//!
//! A cursor that fails its check is the caller's to refuse (each transport
//! words the refusal for its wire); one from another version of gapless is
//! [`Resume::Unreadable`]: a gap notice of reason `unknown`, then live.

use gapless_core::namespace::Namespaces;
use gapless_core::subscription::Start;
use gapless_protocol::{Cursor, CursorError};

/// What a client gave to resume from.
#[derive(Debug, Clone)]
pub enum Resume {
    /// No cursor: start where `since` says.
    Nothing,
    /// A cursor this version cannot read (well formed, from another version).
    Unreadable,
    /// A cursor.
    Cursor(Cursor),
}

/// Reads a cursor's text.
///
/// # Errors
/// The check it fails ([`CursorError`]), but for one of another version,
/// which is [`Resume::Unreadable`].
pub fn read(text: &[u8]) -> Result<Resume, CursorError> {
    match Cursor::decode(text) {
        Ok(c) => Ok(Resume::Cursor(c)),
        Err(CursorError::Version(_)) => Ok(Resume::Unreadable),
        Err(e) => Err(e),
    }
}

/// `since`: `live` (or absent) follows from now on, `earliest` reads
/// everything retained; `None` for any other value (the caller refuses it).
pub fn since(value: Option<&str>) -> Option<Start> {
    match value {
        None | Some("live") => Some(Start::Live),
        Some("earliest") => Some(Start::Earliest),
        Some(_) => None,
    }
}

/// Where `channel` starts when its client gave no start position at all
/// (`given` false: no cursor, no `since`): its namespace's `latest = true`
/// starts at the newest retained event ([`Start::Latest`]); otherwise, and
/// whenever the client gave one, `start` as resolved.
pub fn or_latest(namespaces: &Namespaces, channel: &str, given: bool, start: Start) -> Start {
    if !given && namespaces.policy(channel).latest {
        Start::Latest
    } else {
        start
    }
}

/// Where `channel` starts after `cursor`: after the cursor's position on it,
/// or `None` when the cursor names no position on it.
pub fn on_channel(cursor: &Cursor, channel: &str) -> Option<Start> {
    cursor.get(channel).map(|p| Start::After {
        epoch: p.epoch,
        seq: p.seq,
    })
}

/// Where each of `channels` starts (one [`Start`] per channel, in order),
/// for a subscription that resumes them together: without a cursor, at
/// `since`; after an unreadable cursor, or one that names none of the
/// channels (it cannot be a position here), at an unknown position (a gap,
/// then live); after a cursor, each channel after its position, and a
/// channel the cursor does not name (added to the subscription since) live,
/// as a first visit.
pub fn starts(channels: &[String], resume: &Resume, since: Start) -> Vec<Start> {
    match resume {
        Resume::Nothing => vec![since; channels.len()],
        Resume::Unreadable => vec![Start::Unknown; channels.len()],
        Resume::Cursor(cursor) => {
            let found: Vec<_> = channels.iter().map(|c| on_channel(cursor, c)).collect();
            if found.iter().all(Option::is_none) {
                vec![Start::Unknown; channels.len()]
            } else {
                found
                    .into_iter()
                    .map(|s| s.unwrap_or(Start::Live))
                    .collect()
            }
        }
    }
}
