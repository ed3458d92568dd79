//! Forks (PROTOCOL.md 4.2): a creation with `Stream-Forked-From`, planned
//! against its source ([`plan`]: the source's layout, the fork point, a
//! sub-offset's split message). How reads stitch a fork's layout is
//! [`super::layout`].

use super::error::StreamError;
use super::layout::{read, synced_tail, tail, Layout, ReadError};
use super::media_type;
use super::names::{parse_offset, Offset};
use super::Streams;
use crate::auth::Grant;
use crate::App;
use gapless_core::meta::ForkOrigin;
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::{Epoch, Payload};
use std::sync::Arc;

/// Most layouts in a fork chain (a fork of a fork of …); deeper is refused
/// with 400, so a read visits a bounded number of channels.
pub const MAX_DEPTH: usize = 16;

/// What a fork asks: its request's fork headers, as sent.
#[derive(Debug, Clone, Default)]
pub struct ForkAsk {
    /// `Stream-Forked-From`.
    pub from: String,
    /// `Stream-Fork-Offset`.
    pub offset: Option<String>,
    /// `Stream-Fork-Sub-Offset`.
    pub sub: Option<String>,
}

/// A validated fork request: everything [`super::create::create`] needs.
#[derive(Debug)]
pub struct Plan {
    /// The source stream's incarnation (to register the fork with).
    pub source_inc: u64,
    /// The fork's identity.
    pub fork_of: ForkOrigin,
    /// Whether the fork point was given (`Stream-Fork-Offset`), for the
    /// idempotency comparison.
    pub offset_given: bool,
    /// The source's layout.
    pub parent: Arc<Layout>,
    /// The fork's origin: the last inherited position.
    pub origin: u64,
    /// The fork's offset epoch (the source's).
    pub epoch: Epoch,
    /// The content type (the source's).
    pub content_type: String,
    /// The TTL and expiry the fork inherits when it gives none.
    pub ttl_s: Option<u64>,
    /// See `ttl_s`.
    pub expires_at: Option<(String, u64)>,
    /// A byte sub-offset inside a message: its first bytes, the fork's first
    /// own event.
    pub prefix: Option<Payload>,
}

fn bad(code: ErrorCode, m: impl Into<String>) -> StreamError {
    StreamError::invalid(code, m)
}

/// Reads `Stream-Fork-Sub-Offset` (the one rule of integer headers,
/// [`gapless_protocol::ds::parse_int`]).
fn parse_sub(v: &str) -> Result<u64, String> {
    gapless_protocol::ds::parse_int("Stream-Fork-Sub-Offset", v)
}

/// The channel `Stream-Forked-From` names: a stream path under the prefix,
/// given with the prefix (`/ds/a/b`) or relative to it (`/a/b`); an
/// absolute URL's path is taken. The prefixed reading wins when a stream
/// exists there.
async fn source_channel(app: &App, streams: &Streams, v: &str) -> Result<String, StreamError> {
    let mut p = v.trim();
    for scheme in ["http://", "https://"] {
        if let Some(rest) = p.strip_prefix(scheme) {
            p = rest.find('/').map_or("", |i| &rest[i..]);
        }
    }
    let p = p.split(['?', '#']).next().unwrap_or("");
    let rel = p.trim_start_matches('/');
    let prefix = app.config.ds_prefix.trim_matches('/');
    if let Some(inner) = rel
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('/'))
        .filter(|_| !prefix.is_empty())
    {
        if let Ok(c) = super::names::channel_of(inner) {
            if let Ok(Some(_)) = streams.load(&app.hub, &c).await {
                return Ok(c);
            }
        }
    }
    super::names::channel_of(rel).map_err(|super::names::BadPath(m)| {
        bad(
            ErrorCode::InvalidFork,
            format!("Stream-Forked-From {v:?} is not a stream path: {m}"),
        )
    })
}

/// What a fork is made of: its source's state when the fork is planned.
struct Source {
    layout: Arc<Layout>,
    epoch: Epoch,
    content_type: String,
    ttl_s: Option<u64>,
    expires_at: Option<(String, u64)>,
    json: bool,
    inc: u64,
}

/// Validates a fork of `channel` (a `PUT` with `Stream-Forked-From`)
/// against its source: the source exists and is not soft-deleted (404,
/// 409), `grant` may read it, the content type matches (409), the fork
/// point is an offset of the source within its tail (400), and a
/// sub-offset names a position inside the next message (400).
/// `content_type` is the request's, if given.
///
/// # Errors
/// [`StreamError`] saying which.
pub async fn plan(
    app: &App,
    streams: &Streams,
    grant: &Grant,
    channel: &str,
    ask: &ForkAsk,
    content_type: Option<&str>,
) -> Result<Plan, StreamError> {
    let from = ask.from.as_str();
    let source_ch = source_channel(app, streams, from).await?;
    grant.require(crate::auth::Action::Subscribe, &source_ch)?;
    if source_ch == channel {
        return Err(StreamError::Exists(
            "cannot be forked onto its own path".into(),
        ));
    }
    let offset_header = ask.offset.clone();
    let sub = match ask.sub.as_deref() {
        None => 0,
        Some(v) => parse_sub(v.trim()).map_err(|m| bad(ErrorCode::InvalidFork, m))?,
    };
    if sub > 0 && offset_header.is_none() {
        return Err(bad(
            ErrorCode::InvalidFork,
            "Stream-Fork-Sub-Offset above 0 needs a Stream-Fork-Offset to count from",
        ));
    }
    let src = source(app, streams, from, &source_ch).await?;
    if let Some(ct_req) = content_type {
        if media_type(ct_req) != media_type(&src.content_type) {
            return Err(bad(
                ErrorCode::ContentTypeMismatch,
                format!(
                    "Content-Type {ct_req:?} differs from the source stream's {:?}",
                    src.content_type
                ),
            ));
        }
    }
    if src.layout.depth() >= MAX_DEPTH {
        return Err(bad(
            ErrorCode::InvalidFork,
            format!("the source is already {MAX_DEPTH} forks deep; fork a shallower stream"),
        ));
    }
    let head = tail(app, &src.layout).await?;
    let at = fork_point(
        offset_header.as_deref(),
        head,
        src.layout.start(),
        src.epoch,
    )?;
    let (origin, prefix) = if sub > 0 {
        sub_offset(app, &src, at, sub, head).await?
    } else {
        (at, None)
    };
    Ok(Plan {
        source_inc: src.inc,
        fork_of: ForkOrigin {
            source: source_ch,
            at,
            sub,
        },
        offset_given: offset_header.is_some(),
        parent: src.layout,
        origin,
        epoch: src.epoch,
        content_type: src.content_type,
        ttl_s: src.ttl_s,
        expires_at: src.expires_at,
        prefix,
    })
}

/// The source stream on `source_ch` (named `from` by the request), unless
/// it is absent or expired (404) or soft-deleted (409).
async fn source(
    app: &App,
    streams: &Streams,
    from: &str,
    source_ch: &str,
) -> Result<Source, StreamError> {
    let not_found = || StreamError::SourceNotFound(from.to_owned());
    let source = streams
        .load(&app.hub, source_ch)
        .await?
        .ok_or_else(not_found)?;
    let mut m = source.lock().await;
    if m.deleted {
        return Err(not_found());
    }
    if m.soft_deleted {
        return Err(StreamError::SourceDeleted(from.to_owned()));
    }
    if m.expired(gapless_core::journal::now_ms()) {
        return Err(not_found());
    }
    // A source whose channel was purged is forked from its new epoch.
    synced_tail(app, &mut m).await?;
    Ok(Source {
        layout: m.layout.clone(),
        epoch: m.epoch,
        content_type: m.content_type().to_owned(),
        ttl_s: m.ttl_s(),
        expires_at: m.expires_at().cloned(),
        json: m.is_json(),
        inc: m.inc,
    })
}

/// The fork point `Stream-Fork-Offset` names (`None`: the source's tail,
/// `head`), within the source's `start` and tail, in its offsets' `epoch`.
fn fork_point(
    offset_header: Option<&str>,
    head: u64,
    start: u64,
    epoch: Epoch,
) -> Result<u64, StreamError> {
    Ok(match offset_header {
        None => head,
        Some(v) => match parse_offset(Some(v.trim())) {
            Err(m) => {
                return Err(bad(
                    ErrorCode::InvalidOffset,
                    format!("Stream-Fork-Offset: {m}"),
                ))
            }
            Ok(Offset::Start) => start,
            Ok(Offset::Now) => head,
            Ok(Offset::At { epoch: e, seq }) => {
                if e != epoch {
                    return Err(bad(
                        ErrorCode::InvalidOffset,
                        "Stream-Fork-Offset is of another journal epoch: the history it names \
                         is lost",
                    ));
                }
                if seq > head {
                    return Err(bad(
                        ErrorCode::InvalidOffset,
                        "Stream-Fork-Offset is beyond the source stream's tail",
                    ));
                }
                if seq < start {
                    return Err(bad(
                        ErrorCode::InvalidOffset,
                        "Stream-Fork-Offset is before the source stream's start",
                    ));
                }
                seq
            }
        },
    })
}

/// The fork's origin and first own message for `Stream-Fork-Sub-Offset`
/// `sub` (above 0) after fork point `at`: in JSON mode `sub` more messages
/// are inherited; otherwise `sub` bytes of the next message, the rest of
/// which becomes the fork's first own message.
async fn sub_offset(
    app: &App,
    src: &Source,
    at: u64,
    sub: u64,
    head: u64,
) -> Result<(u64, Option<Payload>), StreamError> {
    let (parent, json) = (&src.layout, src.json);
    let mut origin = at;
    let mut prefix = None;
    {
        if json {
            // JSON mode: `sub` more messages are inherited.
            if at.saturating_add(sub) > head {
                return Err(bad(
                    ErrorCode::InvalidFork,
                    format!(
                        "Stream-Fork-Sub-Offset {sub} is past the source's last message ({} \
                         after the fork offset)",
                        head - at
                    ),
                ));
            }
            origin = at + sub;
        } else {
            // Other types: `sub` bytes of the next message are inherited.
            let next = match read(app, parent, at, at + 1, 1, usize::MAX).await {
                Ok((evs, _)) => evs.into_iter().next(),
                Err(ReadError::Gone) => {
                    return Err(bad(
                        ErrorCode::OffsetGone,
                        "the source's message after Stream-Fork-Offset is no longer retained",
                    ))
                }
                Err(ReadError::Journal(e)) => return Err(e.into()),
            };
            let Some(next) = next else {
                return Err(bad(
                    ErrorCode::InvalidFork,
                    "Stream-Fork-Sub-Offset is above 0 but no message follows the fork offset",
                ));
            };
            let len = next.data.len() as u64;
            if sub > len {
                return Err(bad(
                    ErrorCode::InvalidFork,
                    format!(
                        "Stream-Fork-Sub-Offset {sub} is past the next message, which has {len} \
                         bytes"
                    ),
                ));
            }
            if sub == len {
                origin = at + 1;
            } else {
                let cut = usize::try_from(sub).unwrap_or(usize::MAX);
                let p = match &next.data {
                    Payload::Binary(b) => Payload::Binary(b[..cut.min(b.len())].to_vec()),
                    Payload::Text(t) => match t.get(..cut) {
                        Some(t) => Payload::Text(t.to_owned()),
                        None => {
                            return Err(bad(
                                ErrorCode::InvalidUtf8,
                                format!(
                                    "Stream-Fork-Sub-Offset {sub} splits a UTF-8 character of a \
                                     text stream's message"
                                ),
                            ))
                        }
                    },
                };
                prefix = Some(p);
            }
        }
    }
    Ok((origin, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_offsets_are_read_strictly() {
        assert_eq!(parse_sub("0"), Ok(0));
        assert_eq!(parse_sub("12"), Ok(12));
        for b in ["", "-1", "+1", "05", "1.5", "abc"] {
            assert!(parse_sub(b).is_err(), "{b:?}");
        }
    }
}
