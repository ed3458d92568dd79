//! Publishing: `POST /v1/channels/{channel}/events` (one event, the body is its
//! data) and `POST /v1/channels/{channel}/batch` (several events, atomically).
//!
//! Shapes and rules are in `docs/api.md`; limits come from [`crate::ServerConfig`].

use crate::auth::{Access, Action};
use crate::error::ApiError;
use crate::limits::BodyPace;
use crate::query::{self, Query};
use crate::{App, Peer};
use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::object::Object;
use gapless_protocol::{Cursor, NewEvent};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

/// Longest accepted `Idempotency-Key`, in bytes.
pub const MAX_IDEMPOTENCY_KEY: usize = 256;

/// `POST /v1/channels/{channel}/events`.
pub async fn publish(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    peer: Option<Extension<Peer>>,
    Path(channel): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    query::channel(&channel)?;
    grant.require(Action::Publish, &channel)?;
    let q = Query::parse(raw.as_deref());
    let ephemeral = q.flag("ephemeral")?;
    let (NewEvent { event_type, data }, key) = read_event(&app, &q, &headers, body).await?;
    app.publish_limiter
        .take(&grant, peer.map(|Extension(p)| p.0.ip()), 1)?;
    if ephemeral {
        if key.is_some() {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                "Idempotency-Key does not apply to ephemeral events (they are never journaled)",
            ));
        }
        let reached = app.hub.publish_ephemeral(&channel, event_type, data);
        return Ok((
            StatusCode::ACCEPTED,
            Json(json!({"channel": channel, "subscribers": reached})),
        )
            .into_response());
    }
    let appended = app
        .hub
        .publish(
            &channel,
            vec![NewEvent { event_type, data }],
            key.as_deref(),
        )
        .await?;
    let status = if appended.duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let cursor = Cursor::single(&channel, appended.epoch, appended.last_seq).encode();
    Ok((
        status,
        Json(json!({"channel": channel, "seq": appended.last_seq, "cursor": cursor})),
    )
        .into_response())
}

/// Reads one event from a publish request: `?type=`, the body as data (UTF-8,
/// at most `--max-event-bytes`), and the optional `Idempotency-Key`.
///
/// # Errors
/// 400 `invalid_type`, `invalid_utf8`, `invalid_request`; 413 `too_large`.
pub(crate) async fn read_event(
    app: &App,
    q: &Query,
    headers: &HeaderMap,
    body: Body,
) -> Result<(NewEvent, Option<String>), ApiError> {
    let event_type = query::event_type(q.get("type"))?;
    let key = idempotency_key(headers)?;
    let limit = app.config.max_event_bytes;
    let bytes = read_body(
        app.config.body_pace(),
        headers,
        body,
        limit,
        "event data",
        "--max-event-bytes",
    )
    .await?;
    let data = String::from_utf8(bytes.to_vec()).map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidUtf8,
            format!(
                "event data must be UTF-8 text; invalid byte at offset {}",
                e.utf8_error().valid_up_to()
            ),
        )
    })?;
    Ok((NewEvent { event_type, data }, key))
}

/// One event of a batch publish body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchEvent {
    data: String,
    #[serde(rename = "type")]
    event_type: Option<String>,
}

/// `POST /v1/channels/{channel}/batch`: body is a JSON array of objects
/// `{"data": text, "type": optional name}` (an item in any other form, such
/// as an array of the fields, is 400 `invalid_request`); all are appended
/// atomically, in order.
pub async fn publish_batch(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    peer: Option<Extension<Peer>>,
    Path(channel): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    query::channel(&channel)?;
    grant.require(Action::Publish, &channel)?;
    let key = idempotency_key(&headers)?;
    let cfg = &app.config;
    let bytes = read_body(
        cfg.body_pace(),
        &headers,
        body,
        cfg.max_batch_bytes,
        "batch body",
        "--max-batch-bytes",
    )
    .await?;
    // Each item is read as an object only: serde's derive would also take
    // `["text", null]`, which is not a documented shape (`object.rs`).
    let items: Vec<Object<BatchEvent>> = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidRequest,
            format!(
                "batch body must be a JSON array of objects {{\"data\": string, \"type\": string?}}: {e}"
            ),
        )
    })?;
    if items.is_empty() {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "batch is empty; send at least one event",
        ));
    }
    if items.len() > cfg.max_batch_events {
        return Err(ApiError::new(
            ErrorCode::TooLarge,
            format!(
                "batch has {} events; at most {} are allowed (--max-batch-events)",
                items.len(),
                cfg.max_batch_events
            ),
        )
        .with("limit", cfg.max_batch_events));
    }
    let mut events = Vec::with_capacity(items.len());
    for (i, Object(item)) in items.into_iter().enumerate() {
        if item.data.len() > cfg.max_event_bytes {
            return Err(ApiError::new(
                ErrorCode::TooLarge,
                format!(
                    "event {i} of the batch has {} bytes of data; at most {} are allowed (--max-event-bytes)",
                    item.data.len(),
                    cfg.max_event_bytes
                ),
            )
            .with("limit", cfg.max_event_bytes));
        }
        let event_type = query::event_type(item.event_type.as_deref())
            .map_err(|e| ApiError::new(e.code, format!("event {i} of the batch: {}", e.message)))?;
        events.push(NewEvent {
            event_type,
            data: item.data,
        });
    }
    app.publish_limiter
        .take(&grant, peer.map(|Extension(p)| p.0.ip()), events.len())?;
    let appended = app.hub.publish(&channel, events, key.as_deref()).await?;
    let status = if appended.duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let cursors: Vec<_> = (appended.first_seq..=appended.last_seq)
        .map(|seq| json!({"seq": seq, "cursor": Cursor::single(&channel, appended.epoch, seq).encode()}))
        .collect();
    Ok((
        status,
        Json(json!({
            "channel": channel,
            "first_seq": appended.first_seq,
            "last_seq": appended.last_seq,
            "cursor": Cursor::single(&channel, appended.epoch, appended.last_seq).encode(),
            "events": cursors,
        })),
    )
        .into_response())
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all("idempotency-key").iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "send one Idempotency-Key header, not several",
        ));
    }
    let bad = || {
        ApiError::new(
            ErrorCode::InvalidRequest,
            format!("Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} visible ASCII characters"),
        )
    };
    let s = v.to_str().map_err(|_| bad())?;
    if s.is_empty() || s.len() > MAX_IDEMPOTENCY_KEY || !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad());
    }
    Ok(Some(s.to_owned()))
}

/// Reads a body of at most `limit` bytes, at the pace `pace` allows; 413
/// names the limit and its flag, 408 a body that arrived too slowly.
pub(crate) async fn read_body(
    pace: BodyPace,
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    what: &str,
    flag: &str,
) -> Result<Bytes, ApiError> {
    use http_body_util::BodyExt;
    let too_large = |len: Option<u64>| {
        let size = len.map_or_else(
            || "more than the limit".to_owned(),
            |l| format!("{l} bytes"),
        );
        ApiError::new(
            ErrorCode::TooLarge,
            format!("{what} is {size}; at most {limit} bytes are allowed ({flag})"),
        )
        .with("limit", limit)
    };
    if let Some(len) = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > limit as u64 {
            return Err(too_large(Some(len)));
        }
    }
    let start = tokio::time::Instant::now();
    let mut body = body;
    let mut out = bytes::BytesMut::new();
    loop {
        let next = body.frame();
        let frame = match pace.deadline(start, out.len()) {
            None => next.await,
            Some(at) => match tokio::time::timeout_at(at, next).await {
                Ok(f) => f,
                Err(_) => return Err(pace.refusal(out.len())),
            },
        };
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|e| {
            ApiError::new(
                ErrorCode::InvalidRequest,
                format!("could not read the request body: {e}"),
            )
        })?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                return Err(too_large(None));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out.freeze())
}
