//! Reads: `HEAD` (metadata), `GET` catch-up (with ETag and 304), long-poll
//! (`live=long-poll`) and SSE (`live=sse`) (PROTOCOL.md 5.5 to 5.8).

use super::lifecycle::lookup;
use super::live;
use super::{api_error, empty, error, set, Ctx};
use crate::metrics::Transport;
use crate::ops::stream;
use crate::ops::streams::layout::{self, ReadError};
use crate::ops::streams::names::{live_cursor, offset, parse_offset, Offset};
use crate::ops::streams::{Meta, Stream};
use crate::transport::query::Query;
use axum::body::Body;
use axum::http::StatusCode;
use axum::response::Response;
use gapless_core::journal::now_ms;
use gapless_core::subscription::{Gap, Item, Start, Subscription};
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::ds::Shape;
use gapless_protocol::Event;
use std::sync::Arc;
use std::time::Duration;

/// Most events in one catch-up answer (and about [`READ_BYTES`] of data);
/// a longer range is read in several requests. The server's page bound
/// (`ops::history::MAX_LIMIT`, 1000), so both stay equal.
pub(crate) const READ_EVENTS: usize = crate::ops::history::MAX_LIMIT;
/// About the most data in one catch-up answer, in bytes (always at least
/// one event): the server's page bound (`ops::history::PAGE_DATA_BYTES`, 4 MiB).
pub(crate) const READ_BYTES: usize = crate::ops::history::PAGE_DATA_BYTES;

/// `HEAD {stream}`: the stream's metadata, never cached.
pub(crate) async fn head(ctx: Ctx) -> Response {
    let stream = match lookup(&ctx).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let mut meta = stream.lock().await;
    let tail = match layout::synced_tail(&ctx.app, &mut meta).await {
        Ok(t) => t,
        Err(e) => return api_error(e.into()),
    };
    let mut r = empty(StatusCode::OK);
    set(&mut r, "content-type", meta.content_type());
    set(&mut r, "stream-next-offset", offset(meta.epoch, tail));
    set(&mut r, "cache-control", "no-store");
    if let Some(t) = meta.ttl_s() {
        set(&mut r, "stream-ttl", t.to_string());
    }
    if let Some((e, _)) = meta.expires_at() {
        set(&mut r, "stream-expires-at", e);
    }
    if meta.closed {
        set(&mut r, "stream-closed", "true");
    }
    r
}

fn gone(m: &str) -> Response {
    error(ErrorCode::OffsetGone, m.to_owned())
}

/// The 410 of a position retention (or a purge) has passed.
fn gone_after() -> Response {
    gone("the data after this offset is no longer retained; read again from -1")
}

/// The answer to a failed stitched read.
fn read_failed(e: ReadError) -> Response {
    match e {
        ReadError::Gone => gone_after(),
        ReadError::Journal(e) => api_error(e.into()),
    }
}

/// The read position an offset names on this stream (the position after
/// which to read), given its tail.
async fn resolve(ctx: &Ctx, meta: &Meta, tail: u64, off: Offset) -> Result<u64, Response> {
    match off {
        // The stream's start, or the oldest retained message when retention
        // has passed it.
        Offset::Start => layout::first_position(&ctx.app, &meta.layout)
            .await
            .map_err(|e| api_error(e.into())),
        Offset::Now => Ok(tail),
        Offset::At { epoch, seq } => {
            if epoch != meta.epoch {
                return Err(gone(
                    "the offset is of another journal epoch: the history it names is lost; \
                     read again from -1",
                ));
            }
            if seq > tail {
                return Err(error(
                    ErrorCode::InvalidOffset,
                    "the offset is beyond the stream's tail",
                ));
            }
            if seq < meta.layout.start() {
                return Err(gone(
                    "the offset is of a deleted stream that was at this path before",
                ));
            }
            Ok(seq)
        }
    }
}

fn cache_control(ctx: &Ctx) -> &'static str {
    if ctx.app.auth.is_open() {
        "public, max-age=60, stale-while-revalidate=300"
    } else {
        "private, max-age=60, stale-while-revalidate=300"
    }
}

/// How a `GET` reads: once, waiting for the next events, or as SSE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Live {
    /// Catch-up: what is there now.
    No,
    /// `live=long-poll`: the next events, or 204 at the timeout.
    LongPoll,
    /// `live=sse`: an SSE response that follows the stream.
    Sse,
}

/// A `GET`'s query, checked: the offset, the live mode, the client's cursor.
struct ReadQuery {
    off: Offset,
    live: Live,
    cursor: Option<String>,
}

/// Reads `offset`, `live` and `cursor` (PROTOCOL.md 5.6): 400
/// `invalid_offset` or `invalid_live` naming what is wrong.
fn read_query(ctx: &Ctx) -> Result<ReadQuery, Response> {
    let q = Query::parse(ctx.query.as_deref());
    let off = parse_offset(q.get("offset")).map_err(|m| error(ErrorCode::InvalidOffset, m))?;
    if q.get("offset") == Some("") {
        return Err(error(
            ErrorCode::InvalidOffset,
            "offset is empty: give -1, now, or an offset this server returned",
        ));
    }
    let live = match q.get("live") {
        None => Live::No,
        Some("long-poll") => Live::LongPoll,
        Some("sse") => Live::Sse,
        Some(v) => {
            return Err(error(
                ErrorCode::InvalidLive,
                format!("live={v:?} is not a live mode: use long-poll or sse"),
            ))
        }
    };
    if live != Live::No && q.get("offset").is_none() {
        return Err(error(
            ErrorCode::InvalidOffset,
            "a live read (live=long-poll or live=sse) needs an offset: -1, now, or one this \
             server returned",
        ));
    }
    let cursor = q.get("cursor").map(str::to_owned);
    Ok(ReadQuery { off, live, cursor })
}

/// `GET {stream}?offset=…[&live=long-poll|sse][&cursor=…]`.
pub(crate) async fn get(ctx: Ctx) -> Response {
    let q = match read_query(&ctx) {
        Ok(q) => q,
        Err(r) => return r,
    };
    let stream = match lookup(&ctx).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let mut meta = stream.lock().await;
    meta.touch(now_ms());
    let tail = match layout::synced_tail(&ctx.app, &mut meta).await {
        Ok(t) => t,
        Err(e) => return api_error(e.into()),
    };
    let from = match resolve(&ctx, &meta, tail, q.off).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    match q.live {
        Live::Sse => {
            let start = sse_start(&ctx, &meta, from, tail, q.cursor.as_deref());
            drop(meta);
            sse(ctx, start).await
        }
        // offset=now without live: the tail, no data (PROTOCOL.md 8).
        Live::No if q.off == Offset::Now => tail_answer(&meta, tail),
        live => catch_up(&ctx, &stream, meta, from, live, q.cursor.as_deref()).await,
    }
}

/// Where a `live=sse` read starts: the stream's layout and shape, `from`,
/// the tail, its close watch, the client's cursor and the token's expiry.
fn sse_start(ctx: &Ctx, meta: &Meta, from: u64, tail: u64, cursor: Option<&str>) -> live::Start {
    let shape = if meta.is_json() {
        Shape::Json
    } else if meta.is_text() {
        Shape::Text
    } else {
        Shape::Binary
    };
    live::Start {
        layout: meta.layout.clone(),
        epoch: meta.epoch,
        shape,
        from,
        head: tail,
        closed_rx: meta.watch(),
        cursor: cursor.and_then(|c| c.parse().ok()),
        expires: stream::expires_at(&ctx.grant),
    }
}

/// `offset=now` without `live`: an empty body at the tail.
fn tail_answer(meta: &Meta, tail: u64) -> Response {
    let mut r = Response::new(Body::from(if meta.is_json() { "[]" } else { "" }));
    set(&mut r, "content-type", meta.content_type());
    set(&mut r, "stream-next-offset", offset(meta.epoch, tail));
    set(&mut r, "stream-up-to-date", "true");
    set(&mut r, "cache-control", "no-store");
    if meta.closed {
        set(&mut r, "stream-closed", "true");
    }
    r
}

/// A catch-up read after `from` (at most [`READ_EVENTS`] and about
/// [`READ_BYTES`]), with its ETag and 304; a long-poll with nothing to read
/// waits ([`long_poll`]).
async fn catch_up(
    ctx: &Ctx,
    stream: &Stream,
    meta: tokio::sync::MutexGuard<'_, Meta>,
    from: u64,
    live: Live,
    cursor: Option<&str>,
) -> Response {
    let read = layout::read(
        &ctx.app,
        &meta.layout,
        from,
        u64::MAX,
        READ_EVENTS,
        READ_BYTES,
    );
    let (events, next) = match read.await {
        Ok(r) => r,
        Err(e) => return read_failed(e),
    };
    let long_poll = live == Live::LongPoll;
    if events.is_empty() && long_poll {
        return self::long_poll(ctx, stream, meta, from, cursor).await;
    }
    // The tail after the read: `Stream-Up-To-Date` only when nothing
    // committed before the answer lies past it.
    let head = match layout::tail(&ctx.app, &meta.layout).await {
        Ok(t) => t,
        Err(e) => return api_error(e.into()),
    };
    let up_to_date = next >= head;
    let etag = format!(
        "\"{}-{}-{}:{}:{}{}\"",
        meta.epoch,
        meta.layout.base,
        meta.layout.origin,
        from,
        next,
        if meta.closed && up_to_date { ":c" } else { "" }
    );
    if !long_poll && matches(ctx.header("if-none-match"), &etag) {
        let mut r = empty(StatusCode::NOT_MODIFIED);
        set(&mut r, "etag", &etag);
        set(&mut r, "cache-control", cache_control(ctx));
        set(&mut r, "stream-next-offset", offset(meta.epoch, next));
        return r;
    }
    stream::delivered_answer(Transport::Ds, &events, head.saturating_sub(next));
    let mut r = data_answer(ctx, &meta, next, &events, long_poll, cursor);
    if !up_to_date {
        r.headers_mut().remove("stream-up-to-date");
        r.headers_mut().remove("stream-closed");
    }
    set(&mut r, "etag", &etag);
    r
}

/// Whether an `If-None-Match` value names `etag` (or is `*`).
fn matches(if_none_match: Option<&str>, etag: &str) -> bool {
    if_none_match.is_some_and(|inm| inm.split(',').any(|t| t.trim() == etag || t.trim() == "*"))
}

/// A long-poll at the tail: 204 at once when closed, else the next events
/// ([`wait`]); a stream deleted meanwhile answers 404, as the reference
/// server does (a 410 would read as retention to the client, PROTOCOL.md 5.6).
async fn long_poll(
    ctx: &Ctx,
    stream: &Stream,
    meta: tokio::sync::MutexGuard<'_, Meta>,
    from: u64,
    cursor: Option<&str>,
) -> Response {
    if meta.closed {
        return long_poll_end(&meta, from, true, None);
    }
    let mut closed_rx = meta.watch();
    let layout = meta.layout.clone();
    drop(meta);
    let waited = wait(ctx, &layout, from, &mut closed_rx).await;
    // After a deletion's purge and its mark (`lifecycle::forget` holds the lock
    // across both), so a deleted stream is seen as deleted.
    let meta = stream.lock().await;
    match waited {
        Ok(Waited::Events(events, lag)) => {
            let next = layout.virt(events.last().map_or(layout.seq(from), |e| e.seq));
            stream::delivered_answer(Transport::Ds, &events, lag);
            data_answer(ctx, &meta, next, &events, true, cursor)
        }
        // Deleted while waiting (its purge woke the wait with a gap, or its
        // watch did).
        Ok(_) if meta.deleted || meta.soft_deleted => {
            error(ErrorCode::StreamNotFound, "the stream was deleted")
        }
        Ok(Waited::Gap) => gone_after(),
        Ok(Waited::Nothing) => long_poll_end(&meta, from, meta.closed, cursor),
        Err(r) => r,
    }
}

/// A 200 with `events` (the last at position `next`): the body,
/// `Stream-Next-Offset` at `next`, `Stream-Up-To-Date` (removed by the caller when more
/// remains), `Stream-Closed` when closed, and for a live read the cursor.
fn data_answer(
    ctx: &Ctx,
    meta: &Meta,
    next: u64,
    events: &[Arc<Event>],
    live: bool,
    client_cursor: Option<&str>,
) -> Response {
    let mut r = Response::new(Body::from(gapless_protocol::ds::body(
        meta.is_json(),
        events,
    )));
    set(&mut r, "content-type", meta.content_type());
    set(&mut r, "stream-next-offset", offset(meta.epoch, next));
    set(&mut r, "stream-up-to-date", "true");
    set(&mut r, "cache-control", cache_control(ctx));
    if meta.closed {
        set(&mut r, "stream-closed", "true");
    }
    if live && !meta.closed {
        set(
            &mut r,
            "stream-cursor",
            live_cursor(now_ms(), client_cursor),
        );
    }
    r
}

/// A long-poll's 204: nothing after `from` (yet, or ever when `closed`).
fn long_poll_end(meta: &Meta, from: u64, closed: bool, client_cursor: Option<&str>) -> Response {
    let mut r = empty(StatusCode::NO_CONTENT);
    set(&mut r, "stream-next-offset", offset(meta.epoch, from));
    set(&mut r, "stream-up-to-date", "true");
    set(&mut r, "cache-control", "no-store");
    if closed {
        set(&mut r, "stream-closed", "true");
    } else {
        set(
            &mut r,
            "stream-cursor",
            live_cursor(now_ms(), client_cursor),
        );
    }
    r
}

/// What a long-poll's wait ([`wait`]) came to.
enum Waited {
    /// The stream's next events, with how many more of its channel follow.
    Events(Vec<Arc<Event>>, u64),
    /// A hole after the position: retention passed it, the channel was
    /// purged, or the stream deleted (its purge): 410, or 404 when deleted.
    Gap,
    /// Nothing: the timeout, the token's expiry, the stream's closure or
    /// deletion, or shutdown.
    Nothing,
}

/// Waits for the stream's own events after position `from` (at its tail,
/// so past any inherited ones; a source's appends never wake a fork's
/// waiter, PROTOCOL.md 5.7), up to `--ds-long-poll-timeout-ms`, and no
/// longer than the request's token is honoured: its expiry (`exp` plus
/// `--jwt-leeway-ms`) ends the wait as the timeout does, by gapless's one
/// rule for what ends a stream (`ops::stream::end_signal`: expiry and
/// shutdown), so nothing is delivered under an expired token.
async fn wait(
    ctx: &Ctx,
    layout: &layout::Layout,
    from: u64,
    closed_rx: &mut tokio::sync::watch::Receiver<crate::ops::streams::Life>,
) -> Result<Waited, Response> {
    let timeout = Duration::from_millis(ctx.app.config.ds_long_poll_timeout_ms);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut end = stream::end_signal(&ctx.app, stream::expires_at(&ctx.grant));
    let (mut sub, gaps) = follow(ctx, layout, from).await.map_err(api_error)?;
    if !gaps.is_empty() {
        return Ok(Waited::Gap);
    }
    loop {
        tokio::select! {
            item = sub.next() => match item {
                Ok(Item::Events { events, .. }) => {
                    let lag = sub.lag(0);
                    return Ok(Waited::Events(events, lag));
                }
                Ok(Item::Gap(_)) => return Ok(Waited::Gap),
                Ok(Item::Ephemeral(_)) => continue,
                Err(e) => return Err(api_error(e.into())),
            },
            _ = closed_rx.changed() => return Ok(Waited::Nothing),
            _ = tokio::time::sleep_until(deadline) => return Ok(Waited::Nothing),
            _ = end.as_mut() => return Ok(Waited::Nothing),
        }
    }
}

/// `live=sse`: a [`live::Feed`] from `start`, written by the fan-out writer
/// when this is the connection's first request, else by hyper.
async fn sse(ctx: Ctx, start: live::Start) -> Response {
    // The own channel is followed from the later of `from` and the fork
    // point, before the inherited part is read, so nothing is missed.
    let own_from = start.from.max(start.layout.origin);
    let (sub, gaps) = match follow(&ctx, &start.layout, own_from).await {
        Ok(s) => s,
        Err(e) => return api_error(e),
    };
    if !gaps.is_empty() {
        return gone_after();
    }
    let binary = start.shape == Shape::Binary;
    let feed = live::Feed::new(ctx.app.clone(), start, sub);
    let mut r = match &ctx.direct {
        Some(direct) => direct.hand_over(feed),
        None => Response::new(crate::net::conn::body(
            feed,
            ctx.flushes.clone(),
            ctx.app.shutdown.clone(),
        )),
    };
    sse_headers(&mut r, binary);
    r
}

/// The headers of a `live=sse` answer: gapless's SSE response headers
/// ([`gapless_protocol::sse::RESPONSE_HEADERS`], one copy for both rooms),
/// and for a binary stream `Stream-SSE-Data-Encoding: base64` (PROTOCOL.md 5.8).
fn sse_headers(r: &mut Response, binary: bool) {
    for (name, value) in gapless_protocol::sse::RESPONSE_HEADERS {
        set(r, name, value);
    }
    if binary {
        set(r, "stream-sse-data-encoding", "base64");
    }
}

/// Follows the stream's own channel after offset position `from`, through
/// the stream source every transport opens (`ops::stream::open`: refused
/// while the server shuts down).
async fn follow(
    ctx: &Ctx,
    layout: &layout::Layout,
    from: u64,
) -> Result<(Subscription, Vec<Gap>), crate::error::ApiError> {
    let start = Start::After {
        epoch: layout.epoch,
        seq: layout.seq(from),
    };
    // In no wake group: a Durable Streams reader is not on the stream clock.
    crate::ops::stream::open(&ctx.app, vec![(layout.channel.to_string(), start)], None).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_sse_answer_has_gaplesss_sse_headers_and_the_binary_encoding() {
        let mut r = empty(StatusCode::OK);
        sse_headers(&mut r, true);
        let h = |n: &str| r.headers().get(n).and_then(|v| v.to_str().ok());
        assert_eq!(h("content-type"), Some("text/event-stream"));
        assert_eq!(h("cache-control"), Some("no-cache, no-transform"));
        assert_eq!(h("x-accel-buffering"), Some("no"));
        assert_eq!(h("stream-sse-data-encoding"), Some("base64"));
        let mut r = empty(StatusCode::OK);
        sse_headers(&mut r, false);
        assert!(r.headers().get("stream-sse-data-encoding").is_none());
    }

    #[test]
    fn catch_up_pages_have_the_servers_page_bounds() {
        assert_eq!(READ_EVENTS, crate::ops::history::MAX_LIMIT);
        assert_eq!(READ_BYTES, crate::ops::history::PAGE_DATA_BYTES);
        assert_eq!((READ_EVENTS, READ_BYTES), (1000, 4 << 20));
    }
}
