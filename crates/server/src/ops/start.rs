//! Where a subscription starts, once for every transport: a client's cursor
//! (SSE `Last-Event-ID` or `last_event_id=`, a WebSocket `cursor`), or
//! without one `since` (`live`, the default, `earliest`, `last:N` or
//! `time:UNIX_MS`), turned into a [`Start`] per channel (docs/design.md,
//! "Where a stream starts"). A cursor wins over `since`; `since` is checked
//! whether or not one does (a bad value is the caller's bug either way).
//!
//! A cursor that fails its check is the caller's to refuse (each transport
//! words the refusal for its wire); one from another version of gapless is
//! [`Resume::Unreadable`]: a gap notice of reason `unknown`, then live.

use crate::error::ApiError;
use gapless_core::namespace::Namespaces;
use gapless_core::subscription::Start;
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::{Cursor, CursorError, Since};

/// What a client gave to resume from.
#[derive(Debug, Clone)]
pub(crate) enum Resume {
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
pub(crate) fn read(text: &[u8]) -> Result<Resume, CursorError> {
    match Cursor::decode(text) {
        Ok(c) => Ok(Resume::Cursor(c)),
        Err(CursorError::Version(_)) => Ok(Resume::Unreadable),
        Err(e) => Err(e),
    }
}

/// `since`, where a subscription (or a history page) without a cursor
/// starts ([`Since`]): `live` (or absent) from now on, `earliest`
/// everything retained, `last:N` the last N retained events (N from 1 to
/// [`MAX_LAST`](gapless_protocol::since::MAX_LAST)), `time:UNIX_MS` the
/// first retained event whose time is at or after it, and from the floor
/// with an `evicted` gap when an evicted event may be (`Hub::follow`).
///
/// # Errors
/// 400 `invalid_request` naming the value and what is accepted.
pub(crate) fn since(value: Option<&str>) -> Result<Start, ApiError> {
    let Some(v) = value else {
        return Ok(Start::Live);
    };
    match Since::parse(v) {
        Ok(Since::Live) => Ok(Start::Live),
        Ok(Since::Earliest) => Ok(Start::Earliest),
        Ok(Since::Last(n)) => Ok(Start::Last(n)),
        Ok(Since::Time(t)) => Ok(Start::Time(t)),
        Err(e) => Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("since={v:?}: {e} (to resume, pass a cursor instead)"),
        )),
    }
}

/// Where `channel` starts when its client gave no start position at all
/// (`given` false: no cursor, no `since`): its namespace's `latest = true`
/// starts at the newest retained event (`Start::Last(1)`, as `since=last:1`);
/// otherwise, and whenever the client gave one, `start` as resolved.
pub(crate) fn or_latest(
    namespaces: &Namespaces,
    channel: &str,
    given: bool,
    start: Start,
) -> Start {
    if !given && namespaces.policy(channel).latest {
        Start::Last(1)
    } else {
        start
    }
}

/// Where `channel` starts after `cursor`: after the cursor's position on it,
/// or `None` when the cursor names no position on it.
pub(crate) fn on_channel(cursor: &Cursor, channel: &str) -> Option<Start> {
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
pub(crate) fn starts(channels: &[String], resume: &Resume, since: Start) -> Vec<Start> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_values() {
        let ok = [
            (None, Start::Live),
            (Some("live"), Start::Live),
            (Some("earliest"), Start::Earliest),
            (Some("last:10"), Start::Last(10)),
            (Some("time:1764442800123"), Start::Time(1_764_442_800_123)),
        ];
        for (v, want) in ok {
            assert_eq!(since(v).ok(), Some(want), "{v:?}");
        }
        for v in [
            "",
            "last:0",
            "last:1001",
            "last:x",
            "time:",
            "time:-1",
            "soon",
        ] {
            let e = since(Some(v)).expect_err(v);
            assert_eq!(e.code, ErrorCode::InvalidRequest, "{v:?}");
            assert!(
                e.message.contains(&format!("{v:?}")),
                "{v:?}: {}",
                e.message
            );
        }
    }
}
