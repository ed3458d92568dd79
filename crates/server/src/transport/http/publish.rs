//! Publishing: `POST /v1/channels/{channel}/events` (one event, the body is its
//! data) and `POST /v1/channels/{channel}/batch` (several events, atomically).
//!
//! Shapes and rules are in `docs/api.md`; limits come from [`crate::ServerConfig`].

use crate::admin::openapi::shared::{PublishForbidden, SlowBody, Unauthorized};
use crate::auth::Access;
use crate::error::{ApiError, ErrorBody};
use crate::ops::limits::BodyPace;
use crate::ops::publish::{self as op, KeyName};
use crate::ops::{names, namespaces};
use crate::transport::body::read_body;
use crate::transport::query::{Flag, Query};
use crate::{App, Peer};
use axum::body::Body;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gapless_protocol::answers::{
    BatchEvent, BatchItem, BatchPublished, EphemeralDelivered, Published,
};
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::object::Object;
use gapless_protocol::schema::{ChannelName, EventType};
use gapless_protocol::{Cursor, NewEvent, Payload};
use std::sync::Arc;

/// `POST /v1/channels/{channel}/events`: publishes one event (the body is its
/// data) or, with `ephemeral=true`, hands it to current subscribers only.
#[utoipa::path(
    post,
    path = "/v1/channels/{channel}/events",
    operation_id = "publish",
    summary = "Publish one event",
    tag = "publish",
    params(
        ("channel" = ChannelName, Path, description = "The channel to append to."),
        ("type" = Option<EventType>, Query, description = "The event's type (the SSE `event:` field); none by default."),
        ("ephemeral" = Option<Flag>, Query, description = "Deliver live only: no seq, never journaled, never replayed, sent without `id:`."),
        ("Idempotency-Key" = Option<String>, Header, nullable = false, min_length = 1, max_length = 256, pattern = r"^[!-~]{1,256}$",
            description = "1 to 256 visible ASCII characters. A retry with the same key on the same channel, while the first publish's events are retained, appends nothing and answers 200 with the original seq and cursor. Not allowed with `ephemeral`."),
    ),
    request_body(
        content = String,
        content_type = "text/plain",
        description = "The event's data, as is, of at most the channel's `max_event_bytes` (its namespace's, else `--max-event-bytes`; default 1 MiB): UTF-8 text, or any bytes with `Content-Type: application/octet-stream` (a binary event: readers get it base64-encoded and marked `encoding: base64`). Any other content type is accepted and the body stored as text.",
    ),
    responses(
        (status = 201, description = "Appended; with `--durability sync` (the default) it is on disk.", body = Published),
        (status = 200, description = "An idempotent retry: nothing was appended; the original seq and cursor.", body = Published),
        (status = 202, description = "Ephemeral: handed to this many current subscribers.", body = EphemeralDelivered),
        (status = 400, description = "`invalid_channel`, `invalid_type`, `invalid_utf8` (the message gives the offset of the first bad byte), or `invalid_request` (a bad `Idempotency-Key`, `ephemeral` not true/false, an `Idempotency-Key` on an ephemeral publish).", body = ErrorBody),
        (status = 401, description = "`unauthorized`: tokens are on and the request has none, or a bad one.", body = ErrorBody),
        PublishForbidden,
        SlowBody,
        (status = 413, description = "`too_large`: the data is over the channel's `max_event_bytes`: its namespace's (`[namespaces.NAME]` in the configuration file), else `--max-event-bytes` (`limit` holds it).", body = ErrorBody),
        (status = 422, description = "`idempotency_key_reused`: the `Idempotency-Key` was used on this channel for other events (body, type or count) still retained; nothing was appended (`seq` names the first publish's).", body = ErrorBody),
        (status = 429, description = "`rate_limited`: over `--publish-rate`; nothing was appended.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Whole seconds to wait."))),
        (status = 500, description = "`journal_failed`: the journal could not write; nothing was acknowledged.", body = ErrorBody),
        (status = 503, description = "`unavailable` (cluster mode: Redis unreachable or too slow; the publish may have been applied: retry with the same `Idempotency-Key`), or `shutting_down`.", body = ErrorBody),
        (status = 507, description = "`journal_full`: the journal's disk is below `--min-free-disk-bytes`; nothing was stored.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Whole seconds to wait (5)."))),
    ),
)]
pub(crate) async fn publish(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    peer: Option<Extension<Peer>>,
    Path(channel): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    op::check_channel(&grant, &channel)?;
    let q = Query::parse(raw.as_deref());
    let ephemeral = q.flag("ephemeral")?;
    let (event, key) = read_event(&app, Some(&channel), &q, &headers, body).await?;
    let peer = peer.map(|Extension(p)| p.0.ip());
    let published = op::one(
        &app,
        &grant,
        peer,
        &channel,
        event,
        ephemeral,
        key.as_deref(),
        KeyName::Header,
    )
    .await?;
    let appended = match published {
        op::Published::Ephemeral { subscribers } => {
            return Ok((
                StatusCode::ACCEPTED,
                Json(EphemeralDelivered {
                    channel,
                    subscribers,
                }),
            )
                .into_response())
        }
        op::Published::Journaled(appended) => appended,
    };
    let status = if appended.duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let cursor = Cursor::single(&channel, appended.epoch, appended.last_seq).encode();
    Ok((
        status,
        Json(Published {
            channel,
            seq: appended.last_seq,
            cursor,
        }),
    )
        .into_response())
}

/// Whether a publish body is bytes: its `Content-Type` is
/// `application/octet-stream` (any case, parameters ignored). Any other
/// type, or none, is UTF-8 text, as before binary payloads.
pub(crate) fn is_octet_stream(headers: &HeaderMap) -> bool {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/octet-stream"))
}

/// Reads one event from a publish request: `?type=`, the body as data (UTF-8,
/// or bytes with `Content-Type: application/octet-stream`; at most
/// `channel`'s `max_event_bytes`, its namespace's, or without a channel
/// (a session) `--max-event-bytes`), and the optional `Idempotency-Key`.
///
/// # Errors
/// 400 `invalid_type`, `invalid_utf8`, `invalid_request`; 413 `too_large`.
pub(crate) async fn read_event(
    app: &App,
    channel: Option<&str>,
    q: &Query,
    headers: &HeaderMap,
    body: Body,
) -> Result<(NewEvent, Option<String>), ApiError> {
    let event_type = names::event_type(q.get("type"))?;
    let key = idempotency_key(headers)?;
    let (limit, setting) = match channel {
        Some(c) => (
            namespaces::max_event_bytes(app, c),
            namespaces::max_event_bytes_setting(app, c),
        ),
        None => (app.config.max_event_bytes, "--max-event-bytes".to_owned()),
    };
    let bytes = read_body(
        BodyPace::of(&app.config),
        headers,
        body,
        limit,
        "event data",
        &setting,
    )
    .await?;
    let binary = is_octet_stream(headers);
    let data = Payload::from_bytes(bytes.to_vec(), binary).map_err(|at| {
        ApiError::new(
            ErrorCode::InvalidUtf8,
            format!(
                "event data must be UTF-8 text; invalid byte at offset {at} (send \
                 Content-Type: application/octet-stream to publish bytes)"
            ),
        )
    })?;
    Ok((NewEvent { event_type, data }, key))
}

/// `POST /v1/channels/{channel}/batch`: body is a JSON array of objects
/// `{"data": text, "type": optional name, "encoding": optional "base64"}` (an item in any other form, such
/// as an array of the fields, is 400 `invalid_request`); all are appended
/// atomically, in order.
#[utoipa::path(
    post,
    path = "/v1/channels/{channel}/batch",
    operation_id = "publish_batch",
    summary = "Publish several events, atomically and in order",
    tag = "publish",
    params(
        ("channel" = ChannelName, Path, description = "The channel to append to."),
        ("Idempotency-Key" = Option<String>, Header, nullable = false, min_length = 1, max_length = 256, pattern = r"^[!-~]{1,256}$",
            description = "As for a single publish; it applies to the whole batch."),
    ),
    request_body(
        content = Vec<BatchEvent>,
        content_type = "application/json",
        description = "1 to `--max-batch-events` events (default 1000), at most `--max-batch-bytes` bytes in all (default 16 MiB); appended atomically (all or none), in order, with consecutive seqs.",
    ),
    responses(
        (status = 201, description = "Appended.", body = BatchPublished),
        (status = 200, description = "An idempotent retry: nothing was appended; the original seqs and cursors.", body = BatchPublished),
        (status = 400, description = "`invalid_channel`, `invalid_type` (the message names the item), or `invalid_request` (not a JSON array of such objects, an unknown field, empty, a bad `Idempotency-Key`, an item with `encoding` base64 whose data is not standard padded base64).", body = ErrorBody),
        Unauthorized,
        PublishForbidden,
        SlowBody,
        (status = 413, description = "`too_large`: over `--max-batch-events`, `--max-batch-bytes` or, for one item, the channel's `max_event_bytes` (its namespace's, else `--max-event-bytes`) (`limit` holds it).", body = ErrorBody),
        (status = 422, description = "`idempotency_key_reused`: the `Idempotency-Key` was used on this channel for other events (body, type or count) still retained; nothing was appended (`seq` names the first publish's).", body = ErrorBody),
        (status = 429, description = "`rate_limited`: over `--publish-rate`, or a batch larger than `--publish-burst`; nothing was appended.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Whole seconds to wait."))),
        (status = 500, description = "`journal_failed`: nothing was acknowledged.", body = ErrorBody),
        (status = 503, description = "`unavailable` (cluster mode; retry with the same `Idempotency-Key`) or `shutting_down`.", body = ErrorBody),
        (status = 507, description = "`journal_full`: nothing was stored.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Whole seconds to wait (5)."))),
    ),
)]
pub(crate) async fn publish_batch(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    peer: Option<Extension<Peer>>,
    Path(channel): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    op::check_channel(&grant, &channel)?;
    let key = idempotency_key(&headers)?;
    let cfg = &app.config;
    let bytes = read_body(
        BodyPace::of(cfg),
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
    let events = items
        .into_iter()
        .enumerate()
        .map(|(i, Object(item))| {
            let data = Payload::from_wire(item.data, item.encoding).map_err(|m| {
                ApiError::new(ErrorCode::InvalidRequest, format!("batch item {i}: {m}"))
            })?;
            Ok(NewEvent {
                event_type: item.event_type,
                data,
            })
        })
        .collect::<Result<_, ApiError>>()?;
    let peer = peer.map(|Extension(p)| p.0.ip());
    let appended = op::batch(&app, &grant, peer, &channel, events, key.as_deref()).await?;
    let status = if appended.duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let events = (appended.first_seq..=appended.last_seq)
        .map(|seq| BatchItem {
            seq,
            cursor: Cursor::single(&channel, appended.epoch, seq).encode(),
        })
        .collect();
    let cursor = Cursor::single(&channel, appended.epoch, appended.last_seq).encode();
    Ok((
        status,
        Json(BatchPublished {
            channel,
            first_seq: appended.first_seq,
            last_seq: appended.last_seq,
            cursor,
            events,
        }),
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
    let s = v.to_str().map_err(|_| op::bad_key(KeyName::Header))?;
    op::check_key(s, KeyName::Header)?;
    Ok(Some(s.to_owned()))
}
