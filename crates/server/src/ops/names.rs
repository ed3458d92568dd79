//! The names a client gives: a channel and an event type, checked by the
//! rules of `gapless_protocol::name` (docs/api.md, "Names").

use crate::error::ApiError;
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::name;

/// Checks a channel name.
///
/// # Errors
/// 400 `invalid_channel` naming the rule that failed.
pub(crate) fn channel(name: &str) -> Result<(), ApiError> {
    name::validate_channel(name)
        .map_err(|e| ApiError::new(ErrorCode::InvalidChannel, e.to_string()))
}

/// Checks an optional event type.
///
/// # Errors
/// 400 `invalid_type` naming the rule that failed.
pub(crate) fn event_type(t: Option<&str>) -> Result<Option<String>, ApiError> {
    match t {
        None => Ok(None),
        Some(t) => {
            name::validate_type(t)
                .map_err(|e| ApiError::new(ErrorCode::InvalidType, e.to_string()))?;
            Ok(Some(t.to_owned()))
        }
    }
}
