//! Reads: `HEAD` (metadata), `GET` catch-up (with ETag and 304), long-poll
//! (`live=long-poll`) and SSE (`live=sse`) (PROTOCOL.md 5.5 to 5.8).

use super::fork::{self, ReadError};
use super::lifecycle::lookup;
use super::live::{self, Shape};
use super::names::{live_cursor, offset, parse_offset, Offset};
use super::streams::Meta;
use super::{api_error, empty, error, set, Ctx};
use crate::transport::query::Query;
use axum::body::Body;
use axum::http::StatusCode;
use axum::response::Response;
use gapless_core::journal::now_ms;
use gapless_core::subscription::{Gap, Item, Start, Subscription};
use gapless_protocol::Event;
use std::sync::Arc;
use std::time::Duration;

/// Most events in one catch-up answer (and about [`READ_BYTES`] of data);
/// a longer range is read in several requests.
pub const READ_EVENTS: usize = 1000;
/// About the most data in one catch-up answer, in bytes (always at least one event).
pub const READ_BYTES: usize = 4 << 20;

/// `HEAD {stream}`: the stream's metadata, never cached.
pub async fn head(ctx: Ctx) -> Response {
    let stream = match lookup(&ctx).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let mut meta = stream.lock().await;
    let tail = match fork::synced_tail(&ctx.app, &mut meta).await {
        Ok(t) => t,
        Err(e) => return api_error(e.into()),
    };
    let mut r = empty(StatusCode::OK);
    set(&mut r, "content-type", &meta.content_type);
    set(&mut r, "stream-next-offset", offset(meta.epoch, tail));
    set(&mut r, "cache-control", "no-store");
    if let Some(t) = meta.ttl_s {
        set(&mut r, "stream-ttl", t.to_string());
    }
    if let Some((e, _)) = &meta.expires_at {
        set(&mut r, "stream-expires-at", e);
    }
    if meta.closed {
        set(&mut r, "stream-closed", "true");
    }
    r
}

fn gone(m: &str) -> Response {
    error(StatusCode::GONE, "offset_gone", m.to_owned())
}

/// The answer to a failed stitched read.
fn read_failed(e: ReadError) -> Response {
    match e {
        ReadError::Gone => {
            gone("the data after this offset is no longer retained; read again from -1")
        }
        ReadError::Journal(e) => api_error(e.into()),
    }
}

/// The read position an offset names on this stream (the position after
/// which to read), given its tail.
async fn resolve(ctx: &Ctx, meta: &Meta, tail: u64, off: Offset) -> Result<u64, Response> {
    match off {
        // The stream's start, or the oldest retained message when retention
        // has passed it.
        Offset::Start => fork::first_position(&ctx.app, &meta.layout)
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
                    StatusCode::BAD_REQUEST,
                    "invalid_offset",
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

/// The body of `events` for a stream of `meta`'s type: JSON mode, an array
/// of the messages; any other type, their bytes one after another.
fn body_of(meta: &Meta, events: &[Arc<Event>]) -> Vec<u8> {
    let mut s = Vec::new();
    if meta.is_json() {
        s.push(b'[');
        for (i, e) in events.iter().enumerate() {
            if i > 0 {
                s.push(b',');
            }
            s.extend_from_slice(&json_element(e.data.as_bytes()));
        }
        s.push(b']');
    } else {
        for e in events {
            s.extend_from_slice(e.data.as_bytes());
        }
    }
    s
}

/// One event as one element of a JSON stream's array: its data as it is
/// when it is exactly one JSON value (every append over Durable Streams:
/// JSON mode checks and splits them), else its text as a JSON string (an
/// event published over gapless's own API into the stream's channel, with
/// data such as `5,6` or `7]` that would forge or break the array's
/// message boundaries; bytes that are not UTF-8 lossily). See
/// docs/durable-streams.md, "JSON mode".
pub(super) fn json_element(data: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if serde_json::from_slice::<serde::de::IgnoredAny>(data).is_ok() {
        return std::borrow::Cow::Borrowed(data);
    }
    let text = String::from_utf8_lossy(data);
    std::borrow::Cow::Owned(serde_json::to_vec(&text).unwrap_or_else(|_| b"\"\"".to_vec()))
}

fn cache_control(ctx: &Ctx) -> &'static str {
    if ctx.app.auth.is_open() {
        "public, max-age=60, stale-while-revalidate=300"
    } else {
        "private, max-age=60, stale-while-revalidate=300"
    }
}

/// `GET {stream}?offset=…[&live=long-poll|sse][&cursor=…]`.
pub async fn get(ctx: Ctx) -> Response {
    let q = Query::parse(ctx.query.as_deref());
    let live = q.get("live").map(str::to_owned);
    let off = match parse_offset(q.get("offset")) {
        Ok(o) => o,
        Err(m) => return error(StatusCode::BAD_REQUEST, "invalid_offset", m),
    };
    if q.get("offset") == Some("") {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_offset",
            "offset is empty: give -1, now, or an offset this server returned",
        );
    }
    match live.as_deref() {
        None | Some("long-poll") | Some("sse") => {}
        Some(v) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_live",
                format!("live={v:?} is not a live mode: use long-poll or sse"),
            )
        }
    }
    if live.is_some() && q.get("offset").is_none() {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_offset",
            "a live read (live=long-poll or live=sse) needs an offset: -1, now, or one this \
             server returned",
        );
    }
    let stream = match lookup(&ctx).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let mut meta = stream.lock().await;
    meta.touch(now_ms());
    let tail = match fork::synced_tail(&ctx.app, &mut meta).await {
        Ok(t) => t,
        Err(e) => return api_error(e.into()),
    };
    let from = match resolve(&ctx, &meta, tail, off).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    let client_cursor = q.get("cursor").map(str::to_owned);
    if live.as_deref() == Some("sse") {
        let shape = if meta.is_json() {
            Shape::Json
        } else if meta.is_text() {
            Shape::Text
        } else {
            Shape::Binary
        };
        let start = live::Start {
            layout: meta.layout.clone(),
            epoch: meta.epoch,
            shape,
            from,
            head: tail,
            closed_rx: meta.closed_tx.subscribe(),
            cursor: client_cursor.and_then(|c| c.parse().ok()),
        };
        drop(meta);
        return sse(ctx, start).await;
    }
    // offset=now without live: the tail, no data (PROTOCOL.md 8).
    if off == Offset::Now && live.is_none() {
        let mut r = Response::new(Body::from(if meta.is_json() { "[]" } else { "" }));
        set(&mut r, "content-type", &meta.content_type);
        set(&mut r, "stream-next-offset", offset(meta.epoch, tail));
        set(&mut r, "stream-up-to-date", "true");
        set(&mut r, "cache-control", "no-store");
        if meta.closed {
            set(&mut r, "stream-closed", "true");
        }
        return r;
    }
    let (events, next) = match fork::read(
        &ctx.app,
        &meta.layout,
        from,
        u64::MAX,
        READ_EVENTS,
        READ_BYTES,
    )
    .await
    {
        Ok(r) => r,
        Err(e) => return read_failed(e),
    };
    let long_poll = live.as_deref() == Some("long-poll");
    if events.is_empty() && long_poll {
        if meta.closed {
            return long_poll_end(&meta, from, true, None);
        }
        let mut closed_rx = meta.closed_tx.subscribe();
        let layout = meta.layout.clone();
        drop(meta);
        let waited = wait(&ctx, &layout, from, &mut closed_rx).await;
        let meta = stream.lock().await;
        return match waited {
            Ok(Some(events)) => {
                let next = layout.virt(events.last().map_or(layout.seq(from), |e| e.seq));
                data_answer(&ctx, &meta, next, &events, true, client_cursor.as_deref())
            }
            Ok(None) if meta.deleted || meta.soft_deleted => error(
                StatusCode::NOT_FOUND,
                "stream_not_found",
                "the stream was deleted",
            ),
            Ok(None) => long_poll_end(&meta, from, meta.closed, client_cursor.as_deref()),
            Err(r) => r,
        };
    }
    // The tail after the read: `Stream-Up-To-Date` only when nothing
    // committed before the answer lies past it.
    let head = match fork::tail(&ctx.app, &meta.layout).await {
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
    if !long_poll {
        if let Some(inm) = ctx.header("if-none-match") {
            if inm.split(',').any(|t| t.trim() == etag || t.trim() == "*") {
                let mut r = empty(StatusCode::NOT_MODIFIED);
                set(&mut r, "etag", &etag);
                set(&mut r, "cache-control", cache_control(&ctx));
                set(&mut r, "stream-next-offset", offset(meta.epoch, next));
                return r;
            }
        }
    }
    let mut r = data_answer(
        &ctx,
        &meta,
        next,
        &events,
        long_poll,
        client_cursor.as_deref(),
    );
    if !up_to_date {
        r.headers_mut().remove("stream-up-to-date");
        r.headers_mut().remove("stream-closed");
    }
    set(&mut r, "etag", &etag);
    r
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
    let mut r = Response::new(Body::from(body_of(meta, events)));
    set(&mut r, "content-type", &meta.content_type);
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

/// Waits up to `--ds-long-poll-timeout-ms` for the stream's own events
/// after position `from` (at its tail, so past any inherited ones; a
/// source's appends never wake a fork's waiter, PROTOCOL.md 5.7):
/// `Some(events)`, or `None` at the timeout, on closure or deletion, or at
/// shutdown.
async fn wait(
    ctx: &Ctx,
    layout: &fork::Layout,
    from: u64,
    closed_rx: &mut tokio::sync::watch::Receiver<super::streams::Life>,
) -> Result<Option<Vec<Arc<Event>>>, Response> {
    let timeout = Duration::from_millis(ctx.app.config.ds_long_poll_timeout_ms);
    let deadline = tokio::time::Instant::now() + timeout;
    let (mut sub, gaps) = follow(ctx, layout, from).await.map_err(api_error)?;
    if !gaps.is_empty() {
        return Err(error(
            StatusCode::GONE,
            "offset_gone",
            "the data after this offset is no longer retained; read again from -1",
        ));
    }
    loop {
        tokio::select! {
            item = sub.next() => match item {
                Ok(Item::Events { events, .. }) => return Ok(Some(events)),
                Ok(Item::Gap(_)) => {
                    return Err(error(
                        StatusCode::GONE,
                        "offset_gone",
                        "the data after this offset is no longer retained; read again from -1",
                    ))
                }
                Ok(Item::Ephemeral(_)) => continue,
                Err(e) => return Err(api_error(e.into())),
            },
            _ = closed_rx.changed() => return Ok(None),
            _ = tokio::time::sleep_until(deadline) => return Ok(None),
            _ = ctx.app.shutdown.cancelled() => return Ok(None),
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
        return gone("the data after this offset is no longer retained; read again from -1");
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
    set(&mut r, "content-type", "text/event-stream");
    set(&mut r, "cache-control", "no-cache");
    set(&mut r, "x-accel-buffering", "no");
    if binary {
        set(&mut r, "stream-sse-data-encoding", "base64");
    }
    r
}

/// Follows the stream's own channel after offset position `from`, through
/// the stream source every transport opens (`ops::stream::open`: refused
/// while the server shuts down).
async fn follow(
    ctx: &Ctx,
    layout: &fork::Layout,
    from: u64,
) -> Result<(Subscription, Vec<Gap>), crate::error::ApiError> {
    let start = Start::After {
        epoch: layout.epoch,
        seq: layout.seq(from),
    };
    // In no wake group: a Durable Streams reader is not on the stream clock.
    crate::ops::stream::open(&ctx.app, vec![(layout.channel.clone(), start)], None).await
}
