//! Sessions as the transports see them: a session's status on the wire and
//! the error answer of each refusal of `gapless_core::session`.

use crate::error::ApiError;
use gapless_core::session::{SessionError, Status};
use gapless_protocol::codes::ErrorCode;

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

pub use gapless_protocol::answers::SessionStatus;

/// A session's status as the wire shows it.
pub fn status_json(s: Status) -> SessionStatus {
    match s {
        Status::Open => SessionStatus::Open,
        Status::Completed => SessionStatus::Completed,
        Status::Cancelled => SessionStatus::Cancelled,
    }
}
