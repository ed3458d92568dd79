//! Server-Sent Events: `GET /v1/channels/{channel}/sse` and
//! `GET /v1/sse?channel=A&channel=B`.
//!
//! A stream opens with `retry:`, then one gap notice per channel whose start
//! could not be served whole, then an `id:`-only frame carrying the
//! subscription's cursor (so a client that drops before any event still
//! resumes from where it connected), then replayed events, then live ones —
//! all from the one [`Subscription::next`] loop. Frames of single-channel
//! streams are the events' shared pre-encoded bytes; multi-channel streams put
//! the subscription's cursor in a per-subscriber `id:` line before the shared body.

use crate::error::ApiError;
use crate::query::{self, Query};
use crate::App;
use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use gapless_core::subscription::{Item, Start, Subscription};
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::sse::{self, Format};
use gapless_protocol::{Cursor, CursorError};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// `GET /v1/channels/{channel}/sse`.
pub async fn channel_sse(
    State(app): State<Arc<App>>,
    Path(channel): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref());
    if !q.all("channel").is_empty() {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "channel= is for /v1/sse; this URL already names its channel",
        ));
    }
    open(app, vec![channel], &q, &headers).await
}

/// `GET /v1/sse?channel=A&channel=B…`.
pub async fn multi_sse(
    State(app): State<Arc<App>>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref());
    let mut channels: Vec<String> = Vec::new();
    for c in q.all("channel") {
        if !channels.iter().any(|x| x == c) {
            channels.push(c.to_owned());
        }
    }
    if channels.is_empty() {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "name at least one channel: /v1/sse?channel=A&channel=B",
        ));
    }
    open(app, channels, &q, &headers).await
}

async fn open(
    app: Arc<App>,
    channels: Vec<String>,
    q: &Query,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let max = app.config.max_subscription_channels;
    if channels.len() > max {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!(
                "a subscription may follow at most {max} channels (--max-subscription-channels); {} were named",
                channels.len()
            ),
        ));
    }
    for c in &channels {
        query::channel(c)?;
    }
    let format = match q.get("format") {
        None | Some("plain") => Format::Plain,
        Some("envelope") => Format::Envelope,
        Some(f) => {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!("format={f:?} must be plain or envelope"),
            ))
        }
    };
    let starts = starts(&channels, q, headers)?;
    if app.shutdown.is_cancelled() {
        return Err(ApiError::new(
            ErrorCode::ShuttingDown,
            "the server is shutting down",
        ));
    }
    let (sub, gaps) = app
        .hub
        .subscribe(
            channels.into_iter().zip(starts).collect(),
            app.config.read_batch,
        )
        .await?;
    let mut head = Vec::with_capacity(128);
    head.extend_from_slice(&sse::retry_frame(app.config.retry_ms));
    for g in &gaps {
        head.extend_from_slice(&g.sse_frame());
    }
    head.extend_from_slice(&sse::id_frame(&sub.cursor().encode()));
    let stream = frames(app, sub, format, Bytes::from(head));
    let mut resp = Body::from_stream(stream).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-transform"),
    );
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(resp)
}

/// Where each channel starts. `Last-Event-ID` (read as bytes; empty = absent)
/// wins over `last_event_id=`, which wins over `since=`.
fn starts(channels: &[String], q: &Query, headers: &HeaderMap) -> Result<Vec<Start>, ApiError> {
    let header = headers
        .get("last-event-id")
        .map(|v| v.as_bytes())
        .filter(|b| !b.is_empty());
    let decoded = match (header, q.get("last_event_id").filter(|s| !s.is_empty())) {
        // A browser cannot change its header: anything unreadable is a gap, not an error.
        (Some(h), _) => Some(Cursor::decode(h).ok()),
        (None, Some(s)) => match Cursor::decode(s.as_bytes()) {
            Ok(c) => Some(Some(c)),
            Err(CursorError::Version(_)) => Some(None),
            Err(e) => {
                return Err(ApiError::new(
                    ErrorCode::InvalidCursor,
                    format!("last_event_id: {e}"),
                ))
            }
        },
        (None, None) => None,
    };
    let since = match q.get("since") {
        None | Some("live") => Start::Live,
        Some("earliest") => Start::Earliest,
        Some(s) => {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "since={s:?} must be earliest or live (to resume, pass last_event_id=CURSOR)"
                ),
            ))
        }
    };
    Ok(match decoded {
        None => vec![since; channels.len()],
        Some(None) => vec![Start::Unknown; channels.len()],
        Some(Some(cursor)) => {
            let found: Vec<_> = channels.iter().map(|c| cursor.get(c)).collect();
            if found.iter().all(Option::is_none) {
                // A cursor of none of these channels cannot be a position here.
                vec![Start::Unknown; channels.len()]
            } else {
                // A channel added to the subscription starts live, as a first visit.
                found
                    .into_iter()
                    .map(|p| {
                        p.map_or(Start::Live, |p| Start::After {
                            epoch: p.epoch,
                            seq: p.seq,
                        })
                    })
                    .collect()
            }
        }
    })
}

enum Step {
    Item(Item),
    Heartbeat,
    End,
    Fail(String),
}

fn frames(
    app: Arc<App>,
    mut sub: Subscription,
    format: Format,
    head: Bytes,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    let heartbeat_ms = app.config.heartbeat_ms;
    let single = sub.len() == 1;
    async_stream::stream! {
        yield Ok(head);
        // Built once: a fresh timer or cancellation future per event would cost
        // more than the event itself on the fan-out path.
        let mut shutdown = std::pin::pin!(app.shutdown.cancelled());
        let period = Duration::from_millis(heartbeat_ms.max(1));
        let mut beat = tokio::time::interval_at(Instant::now() + period, period);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let step = tokio::select! {
                biased;
                _ = &mut shutdown => Step::End,
                item = sub.next() => match item {
                    Ok(item) => Step::Item(item),
                    Err(e) => Step::Fail(e.to_string()),
                },
                _ = beat.tick(), if heartbeat_ms > 0 => Step::Heartbeat,
            };
            match step {
                Step::End => break,
                Step::Fail(e) => {
                    // Abort the response (no clean end), so clients back off rather
                    // than reconnect at once as after a shutdown.
                    tracing::warn!(error = %e, "aborting a stream: journal read failed");
                    yield Err(std::io::Error::other(e));
                    break;
                }
                Step::Heartbeat => yield Ok(Bytes::from_static(sse::HEARTBEAT)),
                Step::Item(Item::Events { index, events }) => {
                    for e in &events {
                        if single {
                            yield Ok(e.sse_frame(format).clone());
                        } else {
                            yield Ok(sse::id_line(&sub.cursor_at(index, e.seq).encode()));
                            yield Ok(e.sse_body(format).clone());
                        }
                    }
                }
                Step::Item(Item::Gap(g)) => {
                    yield Ok(g.sse_frame());
                    yield Ok(sse::id_frame(&sub.cursor().encode()));
                }
                Step::Item(Item::Ephemeral(e)) => yield Ok(e.sse_frame(format).clone()),
            }
        }
    }
}
