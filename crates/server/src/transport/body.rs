//! Reading a request body, shared by the rooms that take one (`http`,
//! `ds`): at most a limit of bytes (413 `too_large` naming the limit and its
//! flag), at the pace `--min-body-rate` asks after `--header-timeout-ms` of
//! grace (408 `request_timeout`; [`BodyPace`]).

use crate::error::ApiError;
use crate::ops::limits::BodyPace;
use axum::body::Body;
use axum::http::HeaderMap;
use bytes::Bytes;
use gapless_protocol::codes::ErrorCode;

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
