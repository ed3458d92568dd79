//! The producer side of sessions over HTTP: create, append, complete, cancel,
//! inspect, and read history. The consumer side is `ws::session`.

use crate::auth::{Access, Action};
use crate::error::ApiError;
use crate::history;
use crate::publish::{read_body, read_event};
use crate::query::Query;
use crate::{App, Peer};
use axum::body::Body;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gapless_core::session::{self, Info, SessionError, Status};
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::object::Object;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

impl From<SessionError> for ApiError {
    fn from(e: SessionError) -> Self {
        let message = e.to_string();
        match e {
            SessionError::NotFound(_) => ApiError::new(ErrorCode::SessionNotFound, message),
            SessionError::Exists(_) => ApiError::new(ErrorCode::SessionExists, message),
            SessionError::Ended { status, .. } => {
                ApiError::new(ErrorCode::SessionEnded, message).with("status", status.as_str())
            }
            SessionError::Attached(_) => ApiError::new(ErrorCode::SessionAttached, message),
            SessionError::ResumeDisabled => ApiError::new(ErrorCode::ResumeDisabled, message),
            SessionError::NotRetained { .. } => {
                ApiError::new(ErrorCode::SessionNotRetained, message)
            }
            SessionError::Journal(j) => j.into(),
            _ => ApiError::new(ErrorCode::JournalFailed, message),
        }
    }
}

fn info_json(info: &Info) -> Value {
    json!({
        "id": info.id,
        "status": info.status.as_str(),
        "head": info.head,
        "attached": info.attached,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    id: Option<String>,
}

/// `POST /v1/sessions`: body empty (the server draws an id) or `{"id": "name"}`.
/// 201 `{"id","status","head","attached"}`; 409 `session_exists`.
pub async fn create(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(
        app.config.body_pace(),
        &headers,
        body,
        4096,
        "session create body",
        "a fixed limit",
    )
    .await?;
    let id = if bytes.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        let Object(b): Object<CreateBody> = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::new(
                ErrorCode::InvalidRequest,
                format!("body must be empty or {{\"id\": string}}: {e}"),
            )
        })?;
        b.id
    };
    match &id {
        Some(id) => grant.require_session(Action::Publish, id)?,
        None => grant.require_any_session()?,
    }
    if let Some(id) = &id {
        if !session::valid_id(id) {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "session id {id:?} must be 1 to {} characters of A-Z a-z 0-9 _ -",
                    session::MAX_ID_LEN
                ),
            ));
        }
    }
    let info = app.sessions.create(&app.hub, id).await?;
    Ok((StatusCode::CREATED, Json(info_json(&info))).into_response())
}

/// `GET /v1/sessions/{id}`: `{"id","status","head","attached"}`.
pub async fn info(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    grant.require_session(Action::Subscribe, &id)?;
    let info = app.sessions.info(&app.hub, &id).await?;
    Ok(Json(info_json(&info)))
}

/// `POST /v1/sessions/{id}/events`: same body, `?type=` and `Idempotency-Key`
/// rules as a channel publish. 201 `{"id","seq","attached"}` (200 for an
/// idempotent retry); 409 `session_ended` once completed or cancelled.
pub async fn append(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    peer: Option<Extension<Peer>>,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    grant.require_session(Action::Publish, &id)?;
    let q = Query::parse(raw.as_deref());
    if q.get("ephemeral").is_some() {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "sessions have no ephemeral events: every event is journaled for its consumer",
        ));
    }
    let (event, key) = read_event(&app, &q, &headers, body).await?;
    app.publish_limiter
        .take(&grant, peer.map(|Extension(p)| p.0.ip()), 1)?;
    let (appended, attached) = app
        .sessions
        .append(&app.hub, &id, vec![event], key.as_deref())
        .await?;
    let status = if appended.duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((
        status,
        Json(json!({"id": id, "seq": appended.last_seq, "attached": attached})),
    )
        .into_response())
}

/// `POST /v1/sessions/{id}/complete`.
pub async fn complete(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    grant.require_session(Action::Publish, &id)?;
    let info = app.sessions.end(&app.hub, &id, Status::Completed).await?;
    Ok(Json(info_json(&info)))
}

/// `POST /v1/sessions/{id}/cancel`.
pub async fn cancel(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    grant.require_session(Action::Publish, &id)?;
    let info = app.sessions.end(&app.hub, &id, Status::Cancelled).await?;
    Ok(Json(info_json(&info)))
}

/// `GET /v1/sessions/{id}/events?after=CURSOR&limit=N` (or `after_seq=N`,
/// a consumer's `last_seq`, instead of a cursor): history, as for channels;
/// lifecycle markers appear as events of types `gapless.session.*`.
pub async fn history(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, ApiError> {
    grant.require_session(Action::Subscribe, &id)?;
    app.sessions.info(&app.hub, &id).await?;
    history::page(
        &app,
        &session::channel_of(&id),
        &id,
        &Query::parse(raw.as_deref()),
        true,
    )
    .await
}
