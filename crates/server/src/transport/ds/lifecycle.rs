//! Finding a stream for a request (an expired one is ended at its next
//! request) and `DELETE` (PROTOCOL.md 5.4), over the product's rules of a
//! stream's life (`crate::ops::streams::lifecycle`).

use super::streams::Stream;
use super::{api_error, empty, error, Ctx};
pub use crate::ops::streams::lifecycle::{end, Ended};
use axum::http::StatusCode;
use axum::response::Response;
use gapless_core::journal::now_ms;
use gapless_protocol::codes::ErrorCode;

/// The stream on the context's channel for an append: the cached copy as
/// it is when there is one (an append needs only what never changes within
/// an incarnation, and what is final once true: the journal decides the
/// rest), so an append goes from its arrival to the journal's per-channel
/// order without waiting on a read; else as [`lookup`].
pub(super) async fn lookup_for_append(ctx: &Ctx) -> Result<Stream, Response> {
    if let Some(s) = ctx.ds.streams.cached(&ctx.channel) {
        let m = s.lock().await;
        if !m.deleted && !m.soft_deleted && !m.expired(now_ms()) {
            drop(m);
            return Ok(s);
        }
    }
    lookup(ctx).await
}

/// The stream on the context's channel, unless it is absent, expired (an
/// expired one is ended here: forgotten, or soft-deleted while forks use
/// it) or soft-deleted (410, PROTOCOL.md 4.2).
pub(super) async fn lookup(ctx: &Ctx) -> Result<Stream, Response> {
    let not_found = || {
        error(
            ErrorCode::StreamNotFound,
            format!("no stream at {}", ctx.url_path),
        )
    };
    let gone = || {
        error(
            ErrorCode::StreamDeleted,
            format!(
                "the stream at {} was deleted; it is kept only for the forks that read it",
                ctx.url_path
            ),
        )
    };
    let s = match ctx.ds.streams.load(&ctx.app.hub, &ctx.channel).await {
        Ok(Some(s)) => s,
        Ok(None) => return Err(not_found()),
        Err(e) => return Err(api_error(e.into())),
    };
    let m = s.lock().await;
    if m.deleted {
        return Err(not_found());
    }
    if m.soft_deleted {
        return Err(gone());
    }
    if m.expired(now_ms()) {
        drop(m);
        return match end(&ctx.app, &ctx.ds.streams, &ctx.channel, &s).await {
            Ok(Ended::Soft) => Err(gone()),
            Ok(Ended::Forgotten) => Err(not_found()),
            Err(e) => Err(api_error(e.into())),
        };
    }
    drop(m);
    Ok(s)
}

/// `DELETE {stream}`: forgets the stream, or soft-deletes it while forks
/// use it (PROTOCOL.md 5.4): its URL then answers 410 until the last fork
/// is gone.
pub async fn delete(ctx: Ctx) -> Response {
    let stream = match lookup(&ctx).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    match end(&ctx.app, &ctx.ds.streams, &ctx.channel, &stream).await {
        Ok(_) => empty(StatusCode::NO_CONTENT),
        Err(e) => api_error(e.into()),
    }
}
