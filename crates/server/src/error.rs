//! API errors: every failure answers JSON `{"error": code, "message": text}`
//! with the status of its code (registry: `gapless_protocol::codes`).

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use gapless_core::JournalError;
use gapless_protocol::codes::ErrorCode;
use serde_json::{Map, Value};

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
            JournalError::Full(msg) => {
                tracing::warn!(reason = %msg, "journal full: refusing appends");
                ApiError::new(
                    ErrorCode::JournalFull,
                    format!("the journal's disk is full: {msg}"),
                )
                .retry_after(5)
            }
            JournalError::Unavailable(why) => ApiError::new(
                ErrorCode::Unavailable,
                format!(
                    "the journal is unreachable ({why}); a publish may still have been applied: \
                     retry it with the same Idempotency-Key, which answers with the original seq"
                ),
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
        metrics::counter!(crate::metrics::REFUSALS, "code" => self.code.as_str()).increment(1);
        let mut body = Map::new();
        body.insert("error".into(), self.code.as_str().into());
        body.insert("message".into(), self.message.into());
        let mut extra = self.extra;
        // RFC 6750 section 3: a 401 names the scheme; `error="invalid_token"`
        // when a token was presented and failed (not when none was sent).
        let invalid = extra.remove("token_error").is_some();
        let retry_after = extra.get("retry_after").and_then(Value::as_u64);
        body.extend(extra);
        let mut resp = (status, axum::Json(Value::Object(body))).into_response();
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
pub async fn json_errors(resp: Response) -> Response {
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
    metrics::counter!(crate::metrics::REFUSALS, "code" => code.as_str()).increment(1);
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text
    };
    let body = serde_json::json!({"error": code.as_str(), "message": message}).to_string();
    parts.headers.insert(
        CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(body))
}
