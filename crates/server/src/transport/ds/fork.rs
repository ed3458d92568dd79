//! Forks (PROTOCOL.md 4.2): a stream that shares its source's messages up to
//! a fork point and then has its own. docs/durable-streams.md, "Forks",
//! gives the design; in short:
//!
//! - **Stitching, not copying.** A fork's channel holds only the fork's own
//!   events; a Durable Streams read of the fork reads the source's channel up
//!   to the fork point, then the fork's channel ([`read`]). Creation costs
//!   O(1) whatever the source's length.
//! - **One offset space.** A stream's positions are *virtual*: a plain stream's
//!   position of an event is its channel seq; a fork's inherited positions are
//!   its source's, and its own event of channel seq `s` is at
//!   `origin + (s - base)` ([`Layout::virt`]), `origin` being the fork point.
//!   So offsets stay strictly increasing and sortable across the fork point,
//!   and an offset read on the source continues on the fork.
//! - **Data outlives URLs.** A fork holds its source's [`Layout`] (an `Arc`),
//!   and a channel's events are never removed by a Durable Streams delete, so
//!   deleting, expiring or closing the source never changes what a fork reads;
//!   only gapless retention can evict inherited events (a 410, as on any
//!   stream). Soft deletion (410 on the source's URL while forks live) is a
//!   state of the metadata only.

use super::names::{parse_offset, Offset};
use super::streams::media_type;
use super::{error, Ctx};
use crate::App;
use axum::http::StatusCode;
use axum::response::Response;
use gapless_core::journal::JournalError;
use gapless_core::meta::ForkOrigin;
use gapless_protocol::{Epoch, Event, Payload};
use std::sync::Arc;

/// Where a stream's messages are: its own channel and, for a fork, the
/// source it inherits from. Fixed at creation.
#[derive(Debug)]
pub struct Layout {
    /// The stream's own channel.
    pub channel: String,
    /// The own channel's journal epoch at creation.
    pub epoch: Epoch,
    /// The own channel's head at creation: the stream's own events are the
    /// channel's events after it.
    pub base: u64,
    /// The virtual position just before the first own event: `base` for a
    /// plain stream (positions are channel seqs), the fork point for a fork.
    pub origin: u64,
    /// The source's layout; the fork inherits its positions up to `origin`.
    pub parent: Option<Arc<Layout>>,
}

/// One stretch of a stream's positions, served by one channel: the
/// positions `(origin, end]`, position `v` being channel seq
/// `base + (v - origin)`.
#[derive(Debug, Clone)]
pub struct Segment {
    /// The channel.
    pub channel: String,
    /// Its epoch at the stream's creation (another one now: history lost).
    pub epoch: Epoch,
    /// The channel seq at `origin`.
    pub base: u64,
    /// The position before the segment's first event.
    pub origin: u64,
    /// The segment's last position (`u64::MAX`: the stream's own, open end).
    pub end: u64,
}

impl Segment {
    /// The channel seq of position `v` (`v >= origin`).
    pub fn seq(&self, v: u64) -> u64 {
        self.base + v.saturating_sub(self.origin)
    }
    /// The position of channel seq `s` (`s >= base`).
    pub fn virt(&self, s: u64) -> u64 {
        self.origin + s.saturating_sub(self.base)
    }
}

impl Layout {
    /// A plain stream on `channel` (epoch and head at creation).
    pub fn plain(channel: &str, epoch: Epoch, head: u64) -> Self {
        Layout {
            channel: channel.to_owned(),
            epoch,
            base: head,
            origin: head,
            parent: None,
        }
    }

    /// The position of own channel seq `s`.
    pub fn virt(&self, s: u64) -> u64 {
        self.origin + s.saturating_sub(self.base)
    }

    /// The own channel seq of position `v` (`v >= origin`).
    pub fn seq(&self, v: u64) -> u64 {
        self.base + v.saturating_sub(self.origin)
    }

    /// The position before the stream's first message (its root's origin).
    pub fn start(&self) -> u64 {
        let mut l = self;
        while let Some(p) = &l.parent {
            l = p;
        }
        l.origin
    }

    /// How many layouts deep the chain is (1 for a plain stream).
    pub fn depth(&self) -> usize {
        1 + self.parent.as_ref().map_or(0, |p| p.depth())
    }

    /// The segments serving the stream, root first, empty ones left out.
    pub fn segments(&self) -> Vec<Segment> {
        let mut out = Vec::new();
        let mut end = u64::MAX;
        let mut l = Some(self);
        while let Some(x) = l {
            if end > x.origin {
                out.push(Segment {
                    channel: x.channel.clone(),
                    epoch: x.epoch,
                    base: x.base,
                    origin: x.origin,
                    end,
                });
            }
            end = end.min(x.origin);
            l = x.parent.as_deref();
        }
        out.reverse();
        out
    }
}

/// Why a stitched read failed.
#[derive(Debug)]
pub enum ReadError {
    /// The positions asked for are no longer retained (evicted, or their
    /// channel's history was lost): the protocol's 410.
    Gone,
    /// The journal failed.
    Journal(JournalError),
}

impl From<JournalError> for ReadError {
    fn from(e: JournalError) -> Self {
        ReadError::Journal(e)
    }
}

/// Reads the stream's messages after position `from`, up to position `upto`
/// (inclusive), at most `limit` events and about `max_bytes` of data (at
/// least one event when any is there), across segments. Returns the events
/// and the position of the last one (`from` when none).
///
/// # Errors
/// [`ReadError::Gone`] when the next message after `from` is no longer
/// retained, [`ReadError::Journal`] on a journal failure.
pub async fn read(
    app: &App,
    layout: &Layout,
    from: u64,
    upto: u64,
    limit: usize,
    max_bytes: usize,
) -> Result<(Vec<Arc<Event>>, u64), ReadError> {
    let mut out: Vec<Arc<Event>> = Vec::new();
    let mut pos = from;
    let mut bytes = 0usize;
    for seg in layout.segments() {
        let end = seg.end.min(upto);
        if pos >= end {
            continue;
        }
        if out.len() >= limit || (bytes >= max_bytes && !out.is_empty()) {
            break;
        }
        if pos < seg.origin {
            // Before the stream's start: a predecessor's positions.
            return Err(ReadError::Gone);
        }
        let after = seg.seq(pos);
        let want = (limit - out.len()).min(usize::try_from(end - pos).unwrap_or(usize::MAX));
        let page = app
            .hub
            .read(
                &seg.channel,
                after,
                want,
                max_bytes.saturating_sub(bytes).max(1),
            )
            .await?;
        if page.state.epoch != seg.epoch {
            return Err(ReadError::Gone);
        }
        if page
            .events
            .first()
            .map_or(page.state.head > after, |e| e.seq > after + 1)
        {
            return Err(ReadError::Gone);
        }
        let mut got = 0usize;
        for e in page.events {
            let v = seg.virt(e.seq);
            if v > end {
                break;
            }
            bytes += e.data.len();
            pos = v;
            got += 1;
            out.push(e);
        }
        if pos < end && (got < want || bytes >= max_bytes) {
            // This segment has no more yet (the own, open one), or the
            // budget is spent: the answer ends here.
            break;
        }
    }
    Ok((out, pos))
}

/// The stream's first readable position: its start, or past what retention
/// has evicted, or past an inherited segment whose channel was purged (its
/// epoch is another now).
///
/// # Errors
/// A journal failure.
pub async fn first_position(app: &App, layout: &Layout) -> Result<u64, JournalError> {
    let segs = layout.segments();
    let mut pos = layout.start();
    for seg in &segs {
        if pos >= seg.end {
            continue;
        }
        let st = app.hub.state(&seg.channel).await?;
        if st.epoch != seg.epoch && seg.end != u64::MAX {
            // An inherited segment whose channel lost its history (a purge
            // of the source): none of it is readable; the stream reads on
            // from the next segment.
            pos = seg.end;
            continue;
        }
        let kept_from = st.floor.saturating_sub(1);
        if kept_from <= seg.seq(pos) {
            return Ok(pos);
        }
        pos = seg.virt(kept_from).min(seg.end);
        if pos < seg.end {
            return Ok(pos);
        }
    }
    Ok(pos)
}

/// The stream's newest position (its tail): its own channel's head, as a
/// position.
///
/// # Errors
/// A journal failure.
pub async fn tail(app: &App, layout: &Layout) -> Result<u64, JournalError> {
    let st = app.hub.state(&layout.channel).await?;
    Ok(layout.virt(st.head.max(layout.base)))
}

/// The stream's tail (as [`tail`]), after following a new epoch of its
/// own channel ([`Meta::follow_epoch`](super::streams::Meta::follow_epoch)):
/// the one channel state read serves both.
///
/// # Errors
/// A journal failure.
pub async fn synced_tail(app: &App, meta: &mut super::streams::Meta) -> Result<u64, JournalError> {
    let st = app.hub.state(&meta.layout.channel).await?;
    meta.follow_epoch(st.epoch);
    Ok(meta.layout.virt(st.head.max(meta.layout.base)))
}

/// Most layouts in a fork chain (a fork of a fork of …); deeper is refused
/// with 400, so a read visits a bounded number of channels.
pub const MAX_DEPTH: usize = 16;

/// A validated fork request: everything [`super::write::create`] needs.
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

fn bad(code: &'static str, m: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, code, m)
}

/// Reads `Stream-Fork-Sub-Offset`: a non-negative decimal integer without
/// sign or leading zeros.
fn parse_sub(v: &str) -> Result<u64, String> {
    let ok = !v.is_empty()
        && v.bytes().all(|b| b.is_ascii_digit())
        && !(v.len() > 1 && v.starts_with('0'));
    if !ok {
        return Err(format!(
            "Stream-Fork-Sub-Offset {v:?} must be a non-negative integer, without sign or \
             leading zeros"
        ));
    }
    v.parse::<u64>()
        .map_err(|_| format!("Stream-Fork-Sub-Offset {v:?} is too large"))
}

/// The channel `Stream-Forked-From` names: a stream path under the prefix,
/// given with the prefix (`/ds/a/b`) or relative to it (`/a/b`); an
/// absolute URL's path is taken. The prefixed reading wins when a stream
/// exists there.
async fn source_channel(ctx: &Ctx, v: &str) -> Result<String, Response> {
    let mut p = v.trim();
    for scheme in ["http://", "https://"] {
        if let Some(rest) = p.strip_prefix(scheme) {
            p = rest.find('/').map_or("", |i| &rest[i..]);
        }
    }
    let p = p.split(['?', '#']).next().unwrap_or("");
    let rel = p.trim_start_matches('/');
    let prefix = ctx.app.config.ds_prefix.trim_matches('/');
    if let Some(inner) = rel
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('/'))
        .filter(|_| !prefix.is_empty())
    {
        if let Ok(c) = super::names::channel_of(inner) {
            if let Ok(Some(_)) = ctx.ds.streams.load(&ctx.app.hub, &c).await {
                return Ok(c);
            }
        }
    }
    super::names::channel_of(rel).map_err(|super::names::BadPath(m)| {
        bad(
            "invalid_fork",
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

/// Validates a fork request (`PUT` with `Stream-Forked-From`) against its
/// source: the source exists and is not soft-deleted (404, 409), the
/// caller may read it, the content type matches (409), the fork point is
/// an offset of the source within its tail (400), and a sub-offset names a
/// position inside the next message (400). `content_type` is the request's,
/// if given.
pub async fn plan(ctx: &Ctx, from: &str, content_type: Option<&str>) -> Result<Plan, Response> {
    let source_ch = source_channel(ctx, from).await?;
    if let Err(e) = ctx
        .grant
        .require(crate::auth::Action::Subscribe, &source_ch)
    {
        return Err(super::api_error(e));
    }
    if source_ch == ctx.channel {
        return Err(error(
            StatusCode::CONFLICT,
            "stream_exists",
            "a stream cannot be forked onto its own path",
        ));
    }
    let offset_header = ctx.header("stream-fork-offset").map(str::to_owned);
    let sub = match ctx.header("stream-fork-sub-offset") {
        None => 0,
        Some(v) => parse_sub(v.trim()).map_err(|m| bad("invalid_fork", m))?,
    };
    if sub > 0 && offset_header.is_none() {
        return Err(bad(
            "invalid_fork",
            "Stream-Fork-Sub-Offset above 0 needs a Stream-Fork-Offset to count from",
        ));
    }
    let src = source(ctx, from, &source_ch).await?;
    if let Some(ct_req) = content_type {
        if media_type(ct_req) != media_type(&src.content_type) {
            return Err(error(
                StatusCode::CONFLICT,
                "content_type_mismatch",
                format!(
                    "Content-Type {ct_req:?} differs from the source stream's {:?}",
                    src.content_type
                ),
            ));
        }
    }
    if src.layout.depth() >= MAX_DEPTH {
        return Err(bad(
            "invalid_fork",
            format!("the source is already {MAX_DEPTH} forks deep; fork a shallower stream"),
        ));
    }
    let head = tail(&ctx.app, &src.layout)
        .await
        .map_err(|e| super::api_error(e.into()))?;
    let at = fork_point(
        offset_header.as_deref(),
        head,
        src.layout.start(),
        src.epoch,
    )?;
    let (origin, prefix) = if sub > 0 {
        sub_offset(ctx, &src, at, sub, head).await?
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
async fn source(ctx: &Ctx, from: &str, source_ch: &str) -> Result<Source, Response> {
    let not_found = || {
        error(
            StatusCode::NOT_FOUND,
            "stream_not_found",
            format!("the source stream {from:?} (Stream-Forked-From) does not exist"),
        )
    };
    let source = ctx
        .ds
        .streams
        .load(&ctx.app.hub, source_ch)
        .await
        .map_err(|e| super::api_error(e.into()))?
        .ok_or_else(not_found)?;
    let mut m = source.lock().await;
    if m.deleted {
        return Err(not_found());
    }
    if m.soft_deleted {
        return Err(error(
            StatusCode::CONFLICT,
            "stream_deleted",
            format!(
                "the source stream {from:?} was deleted and is kept only for its forks; \
                 it cannot be forked again"
            ),
        ));
    }
    if m.expired(gapless_core::journal::now_ms()) {
        return Err(not_found());
    }
    // A source whose channel was purged is forked from its new epoch.
    synced_tail(&ctx.app, &mut m)
        .await
        .map_err(|e| super::api_error(e.into()))?;
    Ok(Source {
        layout: m.layout.clone(),
        epoch: m.epoch,
        content_type: m.content_type.clone(),
        ttl_s: m.ttl_s,
        expires_at: m.expires_at.clone(),
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
) -> Result<u64, Response> {
    Ok(match offset_header {
        None => head,
        Some(v) => match parse_offset(Some(v.trim())) {
            Err(m) => return Err(bad("invalid_offset", format!("Stream-Fork-Offset: {m}"))),
            Ok(Offset::Start) => start,
            Ok(Offset::Now) => head,
            Ok(Offset::At { epoch: e, seq }) => {
                if e != epoch {
                    return Err(bad(
                        "invalid_offset",
                        "Stream-Fork-Offset is of another journal epoch: the history it names \
                         is lost",
                    ));
                }
                if seq > head {
                    return Err(bad(
                        "invalid_offset",
                        "Stream-Fork-Offset is beyond the source stream's tail",
                    ));
                }
                if seq < start {
                    return Err(bad(
                        "invalid_offset",
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
    ctx: &Ctx,
    src: &Source,
    at: u64,
    sub: u64,
    head: u64,
) -> Result<(u64, Option<Payload>), Response> {
    let journal = |e: JournalError| super::api_error(e.into());
    let (parent, json) = (&src.layout, src.json);
    let mut origin = at;
    let mut prefix = None;
    {
        if json {
            // JSON mode: `sub` more messages are inherited.
            if at.saturating_add(sub) > head {
                return Err(bad(
                    "invalid_fork",
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
            let next = match read(&ctx.app, parent, at, at + 1, 1, usize::MAX).await {
                Ok((evs, _)) => evs.into_iter().next(),
                Err(ReadError::Gone) => {
                    return Err(error(
                        StatusCode::GONE,
                        "offset_gone",
                        "the source's message after Stream-Fork-Offset is no longer retained",
                    ))
                }
                Err(ReadError::Journal(e)) => return Err(journal(e)),
            };
            let Some(next) = next else {
                return Err(bad(
                    "invalid_fork",
                    "Stream-Fork-Sub-Offset is above 0 but no message follows the fork offset",
                ));
            };
            let len = next.data.len() as u64;
            if sub > len {
                return Err(bad(
                    "invalid_fork",
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
                            return Err(error(
                                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                                "invalid_utf8",
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

    fn layout(origin: u64, base: u64, parent: Option<Arc<Layout>>) -> Arc<Layout> {
        Arc::new(Layout {
            channel: format!("c{origin}-{base}"),
            epoch: Epoch(1),
            base,
            origin,
            parent,
        })
    }

    #[test]
    fn segments_stitch_a_chain_and_positions_continue_past_the_fork_point() {
        // Root: channel seqs 3.. are its positions 3.. (created at head 3).
        let root = layout(3, 3, None);
        // Fork of root at position 7, its own channel created at head 20.
        let f1 = layout(7, 20, Some(root.clone()));
        assert_eq!(
            f1.virt(21),
            8,
            "the fork's first own event follows the fork point"
        );
        assert_eq!(f1.seq(8), 21);
        // Fork of f1 at 5 (inside f1's inherited range): f1's own part is unused.
        let f2 = layout(5, 0, Some(f1.clone()));
        let s = f2.segments();
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].origin, s[0].end), (3, 5));
        assert_eq!((s[1].origin, s[1].end), (5, u64::MAX));
        assert_eq!(f2.start(), 3);
        // Fork of f1 at 9 (inside f1's own range): three segments.
        let f3 = layout(9, 0, Some(f1));
        let s = f3.segments();
        let spans: Vec<_> = s.iter().map(|g| (g.origin, g.end)).collect();
        assert_eq!(spans, vec![(3, 7), (7, 9), (9, u64::MAX)]);
        assert_eq!(s[1].seq(8), 21);
        assert_eq!(f3.depth(), 3);
    }

    #[test]
    fn sub_offsets_are_read_strictly() {
        assert_eq!(parse_sub("0"), Ok(0));
        assert_eq!(parse_sub("12"), Ok(12));
        for b in ["", "-1", "+1", "05", "1.5", "abc"] {
            assert!(parse_sub(b).is_err(), "{b:?}");
        }
    }
}
