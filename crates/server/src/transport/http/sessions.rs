//! The producer side of sessions over HTTP: create, append, complete, cancel,
//! inspect, and read history. The rules are `ops::sessions`'s (and
//! `ops::history`'s for a page); this reads the request and writes the
//! JSON. The consumer side is `transport::ws::session`.

use crate::admin::openapi::shared::{
    JournalFull, PathNotUtf8, ServerErrors, SessionEndErrors, SessionId, SessionMarkerNotStored,
    SessionNotFound, SessionPath, SessionPublishForbidden, SessionSubscribeForbidden, SlowBody,
};
use crate::auth::Access;
use crate::error::{ApiError, ErrorBody};
use crate::ops::history::Reading;
use crate::ops::limits::BodyPace;
use crate::ops::sessions::{self, status_json};
use crate::transport::body::read_body;
use crate::transport::http::history::{self, HistoryPage};
use crate::transport::http::publish::read_event;
use crate::transport::query::Query;
use crate::{App, Peer};
use axum::body::Body;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gapless_core::session::{self, Info, Status};
use gapless_protocol::answers::{SessionAppended, SessionInfo};
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::object::Object;
use serde::Deserialize;
use std::sync::Arc;
use utoipa::ToSchema;

/// A session's state as its answers show it.
fn info_json(info: &Info) -> SessionInfo {
    SessionInfo {
        id: info.id.clone(),
        status: status_json(info.status),
        head: info.head,
        attached: info.attached,
    }
}

/// The body of `POST /v1/sessions`: empty, or this.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateBody {
    /// The id to give the session; the server draws one when absent or null.
    #[schema(value_type = Option<SessionId>)]
    pub id: Option<String>,
}

/// `POST /v1/sessions`: body empty (the server draws an id) or `{"id": "name"}`.
/// 201 `{"id","status","head","attached"}`; 409 `session_exists`.
#[utoipa::path(
    post,
    path = "/v1/sessions",
    operation_id = "session_create",
    summary = "Create a session",
    tag = "sessions",
    request_body(
        content = Option<CreateBody>,
        content_type = "application/json",
        description = "Empty or `null` (the server draws an id), or `{\"id\": ID}`; at most 4096 bytes.",
    ),
    responses(
        (status = 201, description = "Created: an open session with its opening marker (head 1).", body = SessionInfo),
        (status = 400, description = "`invalid_request`: a body that is not `{\"id\": ID}`, or a bad id.", body = ErrorBody),
        (status = 403, description = "`forbidden`: the token may not publish to `session/ID` (or, for a drawn id, to `session/*`); or the token is the `gapless_token` cookie and the request's `Origin` is neither this server's nor one allowed by `--cors-origin` (cross-site request forgery).", body = ErrorBody),
        SlowBody,
        (status = 409, description = "`session_exists`: a session with this id exists.", body = ErrorBody),
        (status = 413, description = "`too_large`: the body is over 4096 bytes.", body = ErrorBody),
        JournalFull,
        ServerErrors,
    ),
)]
pub(crate) async fn create(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(
        BodyPace::of(&app.config),
        &headers,
        body,
        sessions::CREATE_BODY_BYTES,
        "session create body",
        "a fixed limit",
    )
    .await?;
    let id = if bytes.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        // JSON `null` is no body, as `{"id": null}` is no id; any other body is
        // an object (`object.rs`: serde's derive would also take `["id"]`).
        let b: Option<Object<CreateBody>> = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::new(
                ErrorCode::InvalidRequest,
                format!("body must be empty or {{\"id\": string}}: {e}"),
            )
        })?;
        b.and_then(|Object(b)| b.id)
    };
    let info = sessions::create(&app, &grant, id).await?;
    Ok((StatusCode::CREATED, Json(info_json(&info))).into_response())
}

/// `GET /v1/sessions/{id}`: `{"id","status","head","attached"}`.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}",
    operation_id = "session_info",
    summary = "A session's state",
    tag = "sessions",
    params(SessionPath),
    responses(
        (status = 200, description = "The session.", body = SessionInfo),
        PathNotUtf8,
        SessionSubscribeForbidden,
        (status = 404, description = "`session_not_found`: no such session, or it expired.", body = ErrorBody),
        SessionMarkerNotStored,
        ServerErrors,
    ),
)]
pub(crate) async fn info(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    Path(id): Path<String>,
) -> Result<Json<SessionInfo>, ApiError> {
    sessions::may_consume(&grant, &id)?;
    let info = sessions::info(&app, &id).await?;
    Ok(Json(info_json(&info)))
}

/// `POST /v1/sessions/{id}/events`: same body, `?type=` and `Idempotency-Key`
/// rules as a channel publish. 201 `{"id","seq","attached"}` (200 for an
/// idempotent retry); 409 `session_ended` once completed or cancelled.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/events",
    operation_id = "session_append",
    summary = "Append an event to a session",
    tag = "sessions",
    params(
        SessionPath,
        ("type" = Option<gapless_protocol::schema::EventType>, Query, description = "The event's type; none by default."),
        ("Idempotency-Key" = Option<String>, Header, nullable = false, min_length = 1, max_length = 256, pattern = r"^[!-~]{1,256}$",
            description = "As for a channel publish."),
    ),
    request_body(
        content = String,
        content_type = "text/plain",
        description = "The event's data, as is: UTF-8 text of at most `--max-event-bytes` bytes.",
    ),
    responses(
        (status = 201, description = "Appended.", body = SessionAppended),
        (status = 200, description = "An idempotent retry: nothing was appended; the original seq.", body = SessionAppended),
        (status = 400, description = "`invalid_type`, `invalid_utf8`, or `invalid_request` (a bad `Idempotency-Key`; `ephemeral`, which sessions do not have).", body = ErrorBody),
        SessionPublishForbidden,
        SessionNotFound,
        (status = 408, description = "`request_timeout`.", body = ErrorBody),
        (status = 409, description = "`session_ended`: the session is completed or cancelled (`status` says which).", body = ErrorBody),
        (status = 413, description = "`too_large`: over `--max-event-bytes`.", body = ErrorBody),
        (status = 429, description = "`rate_limited`.", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Whole seconds to wait."))),
        JournalFull,
        ServerErrors,
    ),
)]
pub(crate) async fn append(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    peer: Option<Extension<Peer>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    sessions::may_produce(&grant, &id)?;
    let q = Query::parse(raw.as_deref());
    if q.get("ephemeral").is_some() {
        return Err(sessions::no_ephemeral());
    }
    let (event, key) = read_event(&app, None, &q, &headers, body).await?;
    let ip = peer.map(|Extension(p)| p.0.ip());
    let appended = sessions::append(&app, &grant, ip, &id, event, key.as_deref()).await?;
    let status = if appended.duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((
        status,
        Json(SessionAppended {
            id,
            seq: appended.seq,
            attached: appended.attached,
        }),
    )
        .into_response())
}

/// `POST /v1/sessions/{id}/complete`.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/complete",
    operation_id = "session_complete",
    summary = "Complete a session",
    tag = "sessions",
    params(SessionPath),
    responses(
        (status = 200, description = "Completes the session: its consumer gets every event, then the end. The session as it is now.", body = SessionInfo),
        SessionEndErrors,
    ),
)]
pub(crate) async fn complete(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    Path(id): Path<String>,
) -> Result<Json<SessionInfo>, ApiError> {
    sessions::may_produce(&grant, &id)?;
    let info = sessions::end(&app, &id, Status::Completed).await?;
    Ok(Json(info_json(&info)))
}

/// `POST /v1/sessions/{id}/cancel`.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/cancel",
    operation_id = "session_cancel",
    summary = "Cancel a session",
    tag = "sessions",
    params(SessionPath),
    responses(
        (status = 200, description = "Cancels the session. The session as it is now.", body = SessionInfo),
        SessionEndErrors,
    ),
)]
pub(crate) async fn cancel(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    Path(id): Path<String>,
) -> Result<Json<SessionInfo>, ApiError> {
    sessions::may_produce(&grant, &id)?;
    let info = sessions::end(&app, &id, Status::Cancelled).await?;
    Ok(Json(info_json(&info)))
}

/// `GET /v1/sessions/{id}/events?after=CURSOR&limit=N` (or `after_seq=N`,
/// a consumer's `last_seq`, instead of a cursor): history, as for channels;
/// lifecycle markers appear as events of types `gapless.session.*`.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/events",
    operation_id = "session_history",
    summary = "One page of a session's history",
    tag = "sessions",
    params(
        SessionPath,
        ("after" = Option<gapless_protocol::Cursor>, Query, description = "Read the events after this cursor (not with `after_seq`)."),
        ("after_seq" = Option<gapless_protocol::schema::Seq>, Query, description = "Read the events after this seq (a consumer's `last_seq`; not with `after`)."),
        ("since" = Option<gapless_protocol::Since>, Query, description = "Without `after` or `after_seq` (which win; checked also with them): where the page starts, as on a channel's history: `earliest` (the default), `live`, `last:N`, `time:UNIX_MS`."),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "Most events in the page; default 100."),
    ),
    responses(
        (status = 200, description = "One page of the session's history; `channel` is the session's id; lifecycle markers are events of types `gapless.session.*`.", body = HistoryPage),
        (status = 400, description = "`invalid_cursor`, or `invalid_request` (a bad `limit`, `after_seq` or `since`, or both `after` and `after_seq`).", body = ErrorBody),
        SessionSubscribeForbidden,
        SessionNotFound,
        (status = 410, description = "`cursor_not_served`, as for a channel's history.", body = ErrorBody),
        SessionMarkerNotStored,
        ServerErrors,
    ),
)]
pub(crate) async fn history(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<HistoryPage>, ApiError> {
    sessions::may_consume(&grant, &id)?;
    sessions::info(&app, &id).await?;
    history::page(
        &app,
        &session::channel_of(&id),
        &id,
        raw.as_deref(),
        Reading::Session,
    )
    .await
}
