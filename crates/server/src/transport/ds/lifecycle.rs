//! Finding a stream for a request and `DELETE` (PROTOCOL.md 5.4), over the
//! product's rules of a stream's life (`crate::ops::streams::lifecycle`).

use super::{api_error, empty, refuse, Ctx};
use crate::ops::streams::lifecycle::end;
use crate::ops::streams::Stream;
use axum::http::StatusCode;
use axum::response::Response;

/// The stream on the context's channel (`ops::streams::lifecycle::lookup`),
/// or the answer to its absence.
pub(super) async fn lookup(ctx: &Ctx) -> Result<Stream, Response> {
    crate::ops::streams::lifecycle::lookup(&ctx.app, &ctx.ds.streams, &ctx.channel)
        .await
        .map_err(|e| refuse(ctx, e))
}

/// `DELETE {stream}`: forgets the stream, or soft-deletes it while forks
/// use it (PROTOCOL.md 5.4): its URL then answers 410 until the last fork
/// is gone.
pub(crate) async fn delete(ctx: Ctx) -> Response {
    let stream = match lookup(&ctx).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    match end(&ctx.app, &ctx.ds.streams, &ctx.channel, &stream).await {
        Ok(_) => empty(StatusCode::NO_CONTENT),
        Err(e) => api_error(e.into()),
    }
}
