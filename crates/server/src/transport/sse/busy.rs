//! The one request a refused connection may carry (`listener.rs`: past
//! `--max-connections` or `--max-connections-per-ip`).
//!
//! - `/healthz`, `/readyz` and `/metrics` are served as usual, so a liveness probe does
//!   not restart a busy server and set off a reconnect storm.
//! - An SSE request gets `200 text/event-stream` carrying only a jittered
//!   `retry:` (1 to 10 s) and a comment, then the end of the stream
//!   ([`crate::transport::sse::retry_later`], also used when the journal is
//!   unreachable at open): a browser's `EventSource` treats any other
//!   status as final and never reconnects, but it reconnects after `retry:`
//!   from a stream that ends, keeping its `Last-Event-ID` (the answer has
//!   no `id:`).
//! - Anything else gets `503 limit_reached` with a jittered `Retry-After`.
//!
//! The connection is closed after the answer, unless only the request was
//! refused on a trusted proxy's connection (`listener.rs`): that connection
//! carries other clients' requests and stays open.

use crate::error::ApiError;
use crate::net::listener::Refused;
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use gapless_protocol::codes::ErrorCode;

/// The answer owed to a request of a refused connection (see the module
/// doc), or `None` for every other request and for the probes, which are
/// served as usual. Called by the server's request edge (`lib.rs`).
pub(crate) fn refusal(req: &Request) -> Option<Response> {
    let Refused { why, close } = req.extensions().get::<Refused>()?.clone();
    if crate::admin::PROBES.contains(&req.uri().path()) {
        return None;
    }
    let mut resp = if req.method() == Method::GET && wants_sse(req) {
        let retry_ms = rand::random_range(1_000..=10_000u64);
        crate::transport::sse::retry_later(retry_ms, &format!("busy: {why}"))
    } else {
        ApiError::new(ErrorCode::LimitReached, why)
            .retry_after(rand::random_range(1..=5u64))
            .into_response()
    };
    if close {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    Some(resp)
}

/// An SSE URL, or a request that accepts `text/event-stream`.
fn wants_sse(req: &Request) -> bool {
    crate::transport::sse::is_sse_path(req.uri().path())
        || req
            .headers()
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("text/event-stream"))
}
