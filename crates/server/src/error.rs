//! API errors: every failure answers JSON `{"error": code, "message": text}`
//! with the status of its code (registry: `gapless_protocol::codes`).

use axum::http::StatusCode;
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
    /// Extra fields merged into the JSON body.
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
        let mut body = Map::new();
        body.insert("error".into(), self.code.as_str().into());
        body.insert("message".into(), self.message.into());
        body.extend(self.extra);
        (status, axum::Json(Value::Object(body))).into_response()
    }
}
