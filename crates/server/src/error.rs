//! API errors: every failure answers JSON `{"error": code, "message": text}`
//! with the status of its code (registry: `gapless_protocol::codes`).
//!
//! At the top of the crate, under every part: every part may use it, so it
//! imports none of them (`tests/layers.rs`); a part turns its own errors
//! into an [`ApiError`] (`ops::sessions` for a session's refusals).

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use gapless_core::JournalError;
use gapless_protocol::codes::ErrorCode;
use serde_json::{Map, Value};

/// The JSON body of every error answer: `error` and `message` always, and
/// the extra fields that some errors add.
//
// (Not in the document:) built by `ApiError::into_response` from an
// `ApiError`; the extra fields are the only ones `ApiError::with` is given
// anywhere. The schema allows no others, so a new one fails the
// schemathesis step of `scripts/test.sh` until it is listed here.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ErrorBody {
    /// The code; it decides the status (docs/api.md, "Errors").
    #[schema(value_type = ErrorCode)]
    pub error: &'static str,
    /// What is wrong, for a person.
    pub message: String,
    /// The limit that was passed: bytes (`too_large` for data or a body,
    /// `head_too_large`) or events (`too_large` for a batch, `rate_limited`
    /// for a batch over the burst).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    /// Whole seconds to wait before retrying (also sent as `Retry-After`):
    /// `rate_limited`, `limit_reached`, `journal_full`, `unavailable`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub retry_after: Option<u64>,
    /// `rate_limited`: milliseconds until the publisher's bucket holds enough.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// `cursor_not_served`: why (a gap reason); `unavailable` from
    /// `GET /readyz`: the journal's own code (`journal_full`, `unavailable`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `cursor_not_served`: the oldest retained seq.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor: Option<u64>,
    /// `cursor_not_served`: the cursor that reads everything retained.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<gapless_protocol::Cursor>)]
    pub floor_cursor: Option<String>,
    /// `session_ended`: how the session ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = session_status)]
    pub status: Option<String>,
    /// `idempotency_key_reused`: the first seq of the earlier publish that
    /// holds the key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Any other field given to [`ApiError::with`]: none today. The schema
    /// has no room for one (`additionalProperties: false`), so a new field
    /// that is not listed above breaks the document's promise and the
    /// schemathesis step of `scripts/test.sh` reports it.
    #[serde(flatten)]
    #[schema(ignore)]
    pub other: Map<String, Value>,
}

/// The schema of [`ErrorBody::status`]: the `SessionStatus` schema (defined
/// with the sessions, `ops::sessions`), or null. Named, not imported: this
/// module imports no part.
fn session_status() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, RefBuilder, Type};
    OneOfBuilder::new()
        .item(
            RefBuilder::new()
                .ref_location_from_schema_name("SessionStatus")
                .description(Some("`session_ended`: how the session ended.")),
        )
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .into()
}

impl ErrorBody {
    /// The body of an error with `code`, `message` and the extra fields of
    /// [`ApiError::with`] (the known ones are moved to their fields).
    pub(crate) fn new(code: ErrorCode, message: String, mut extra: Map<String, Value>) -> Self {
        let mut number = |k: &str| extra.remove(k).and_then(|v| v.as_u64());
        let (limit, retry_after, retry_after_ms, floor) = (
            number("limit"),
            number("retry_after"),
            number("retry_after_ms"),
            number("floor"),
        );
        let seq = number("seq");
        let mut text = |k: &str| extra.remove(k).and_then(|v| v.as_str().map(str::to_owned));
        let (reason, floor_cursor, status) = (text("reason"), text("floor_cursor"), text("status"));
        ErrorBody {
            error: code.as_str(),
            message,
            limit,
            retry_after,
            retry_after_ms,
            reason,
            floor,
            floor_cursor,
            status,
            seq,
            other: extra,
        }
    }
}

/// The metric of error answers, by `code` (the `error` of the JSON body:
/// `unauthorized`, `rate_limited`, …); described with the others in
/// `crate::metrics`.
pub(crate) const REFUSALS: &str = "gapless_refusals_total";

/// The end of a 503 `unavailable` message (the journal is unreachable)
/// outside a publish, where [`ApiError::publish_refused`] replaces it.
const RETRY_LATER: &str = "; retry later";

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    /// The registry code; decides the status.
    pub code: ErrorCode,
    /// What is wrong, for a person.
    pub message: String,
    /// Extra fields merged into the JSON body. A `retry_after` field (whole
    /// seconds) is also sent as the `Retry-After` header.
    pub extra: Map<String, Value>,
}

impl ApiError {
    /// An error with a code and a message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            extra: Map::new(),
        }
    }

    /// Adds `Retry-After: seconds` (at least 1) and `"retry_after": seconds` to the body.
    pub fn retry_after(self, seconds: u64) -> Self {
        self.with("retry_after", seconds.max(1))
    }

    /// The refusal of a publish (HTTP publish and batch, a WebSocket
    /// `publish`, a session append): a 503 `unavailable` adds that the
    /// publish may still have been applied (the request may have reached
    /// the journal before it stopped answering, docs/cluster.md) and is to
    /// be retried with the same idempotency key, named as the caller sends
    /// it (`key`: `Idempotency-Key`, or `idempotency_key` over WebSocket).
    /// Any other error is returned as is.
    pub fn publish_refused(mut self, key: &str) -> Self {
        if self.code == ErrorCode::Unavailable {
            self.message = format!(
                "{}; a publish may still have been applied: retry it with the same {key}, \
                 which answers with the original seq",
                self.message.trim_end_matches(RETRY_LATER)
            );
        }
        self
    }

    /// Adds a field to the JSON body.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extra.insert(key.to_owned(), value.into());
        self
    }
}

impl From<JournalError> for ApiError {
    fn from(e: JournalError) -> Self {
        match e {
            JournalError::Closed => {
                ApiError::new(ErrorCode::ShuttingDown, "the server is shutting down")
            }
            JournalError::ChannelClosed => ApiError::new(
                ErrorCode::ChannelClosed,
                "the channel is closed: it takes no more events",
            ),
            JournalError::Full(msg) => {
                tracing::warn!(reason = %msg, "journal full: refusing appends");
                ApiError::new(
                    ErrorCode::JournalFull,
                    format!("the journal's disk is full: {msg}"),
                )
                .retry_after(5)
            }
            // Said of every operation: only a publish adds that it may have
            // been applied ([`ApiError::publish_refused`]).
            JournalError::Unavailable(why) => ApiError::new(
                ErrorCode::Unavailable,
                format!("the journal is unreachable ({why}){RETRY_LATER}"),
            )
            .retry_after(1),
            other => {
                tracing::error!(error = %other, "journal failure");
                ApiError::new(ErrorCode::JournalFailed, other.to_string())
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        metrics::counter!(REFUSALS, "code" => self.code.as_str()).increment(1);
        let mut extra = self.extra;
        // RFC 6750 section 3: a 401 names the scheme; `error="invalid_token"`
        // when a token was presented and failed (not when none was sent).
        let invalid = extra.remove("token_error").is_some();
        let body = ErrorBody::new(self.code, self.message, extra);
        let retry_after = body.retry_after;
        let mut resp = (status, axum::Json(body)).into_response();
        if self.code == ErrorCode::Unauthorized {
            let challenge = if invalid {
                "Bearer realm=\"gapless\", error=\"invalid_token\""
            } else {
                "Bearer realm=\"gapless\""
            };
            resp.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        if let Some(secs) = retry_after {
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// Middleware: any error answer that is not already our JSON (an extractor's
/// plain-text rejection, e.g. a path that is not valid UTF-8 or a WebSocket
/// handshake without upgrade headers) becomes `{"error","message"}` with the
/// same status and the original text as the message.
pub(crate) async fn json_errors(resp: Response) -> Response {
    use axum::http::header::CONTENT_TYPE;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let is_json = resp
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 16 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let code = match status.as_u16() {
        404 => ErrorCode::NotFound,
        405 => ErrorCode::MethodNotAllowed,
        413 => ErrorCode::TooLarge,
        s if s >= 500 => ErrorCode::JournalFailed,
        _ => ErrorCode::InvalidRequest,
    };
    metrics::counter!(REFUSALS, "code" => code.as_str()).increment(1);
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text
    };
    let body =
        serde_json::to_string(&ErrorBody::new(code, message, Map::new())).unwrap_or_default();
    parts.headers.insert(
        CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(body))
}

/// `405 method_not_allowed` naming `method` and `path`, then `why`; a method
/// in lower case is told that methods are case-sensitive (RFC 9110 section
/// 9.1: `get` is not `GET`). The caller adds `Allow`.
pub(crate) fn method_not_allowed_error(
    method: &axum::http::Method,
    path: &str,
    why: &str,
) -> ApiError {
    let upper = method.as_str().to_ascii_uppercase();
    let hint = if upper != method.as_str() {
        format!(" (method names are case-sensitive: {upper}, not {method})")
    } else {
        why.to_owned()
    };
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        format!("{method} is not allowed on {path}{hint}"),
    )
}
