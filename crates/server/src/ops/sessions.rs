//! Sessions as the transports see them: a session's status on the wire and
//! the error answer of each refusal of `gapless_core::session`.

use crate::error::ApiError;
use gapless_core::session::{SessionError, Status};
use gapless_protocol::codes::ErrorCode;
use serde::Serialize;
use utoipa::ToSchema;

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

/// Where a session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionStatus {
    /// Takes events.
    Open,
    /// Ended by its producer after its last event.
    Completed,
    /// Ended by its producer, or by the grace window running out with no consumer.
    Cancelled,
}

impl From<Status> for SessionStatus {
    fn from(s: Status) -> Self {
        match s {
            Status::Open => SessionStatus::Open,
            Status::Completed => SessionStatus::Completed,
            Status::Cancelled => SessionStatus::Cancelled,
        }
    }
}
