//! Appends: `POST {stream}` (PROTOCOL.md 5.2 and 5.3): the request's
//! headers and body in, `ops::streams::append` decides, the answer's
//! headers out. Creation is in [`super::create`], deletion in
//! [`super::lifecycle`].

use super::{api_error, empty, error, refuse, set, Ctx};
use crate::ops::streams::append::{self, Append, Caller};
use crate::ops::streams::lifecycle::lookup_for_append;
use crate::ops::streams::names::offset;
use axum::body::Body;
use axum::http::StatusCode;
use axum::response::Response;
use gapless_core::meta::ProducerTuple;
use gapless_protocol::codes::ErrorCode;

/// Reads the request body, at most `--max-batch-bytes`: a larger one is
/// `413 too_large` with `limit` (the connection then closes, lingering so the
/// client still sending reads the answer: `net/conn.rs`); one that arrives
/// slower than `--min-body-rate` (after `--header-timeout-ms` of grace) is
/// `408 request_timeout`, as on every route that takes a body.
pub(super) async fn body_bytes(ctx: &Ctx, body: Body) -> Result<bytes::Bytes, Response> {
    crate::transport::body::read_body(
        crate::ops::limits::BodyPace::of(&ctx.app.config),
        &ctx.headers,
        body,
        ctx.app.config.max_batch_bytes,
        "the body",
        "--max-batch-bytes",
    )
    .await
    .map_err(api_error)
}

/// Who makes the request, for the publish limits.
pub(super) fn caller(ctx: &Ctx) -> Caller<'_> {
    Caller {
        grant: &ctx.grant,
        peer: ctx.peer,
    }
}

/// The producer headers of an append, all three or none (PROTOCOL.md 5.2.1).
fn producer(ctx: &Ctx) -> Result<Option<ProducerTuple>, Response> {
    let id = ctx.headers.get("producer-id");
    let epoch = ctx.header("producer-epoch");
    let seq = ctx.header("producer-seq");
    if id.is_none() && epoch.is_none() && seq.is_none() {
        return Ok(None);
    }
    let bad = |m: String| error(ErrorCode::InvalidProducer, m);
    let (Some(id), Some(epoch), Some(seq)) = (id, epoch, seq) else {
        return Err(bad(
            "Producer-Id, Producer-Epoch and Producer-Seq go together: give all three or none"
                .into(),
        ));
    };
    let id = id
        .to_str()
        .map_err(|_| bad("Producer-Id must be visible ASCII".into()))?;
    if id.trim().is_empty() {
        return Err(bad("Producer-Id is empty".into()));
    }
    let int = |name: &str, v: &str| gapless_protocol::ds::parse_int(name, v).map_err(&bad);
    Ok(Some(ProducerTuple {
        id: id.to_owned(),
        epoch: int("Producer-Epoch", epoch)?,
        seq: int("Producer-Seq", seq)?,
    }))
}

/// `POST {stream}`: appends the body (JSON mode: one message per element of
/// an array), closes with `Stream-Closed: true`, deduplicates idempotent
/// producers' retries and refuses `Stream-Seq` regressions: one journal
/// change (`ops::streams::append`).
pub(crate) async fn append(ctx: Ctx, body: Body) -> Response {
    let streams = &ctx.ds.streams;
    let stream = match lookup_for_append(&ctx.app, streams, &ctx.channel).await {
        Ok(s) => s,
        Err(e) => return refuse(&ctx, e),
    };
    let producer = match producer(&ctx) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let stream_seq = ctx
        .headers
        .get("stream-seq")
        .map(|v| v.to_str().map(str::trim));
    let stream_seq = match stream_seq {
        None => None,
        Some(Ok(s)) if !s.is_empty() => Some(s.to_owned()),
        // An empty value would be below every other and is a client's bug.
        Some(_) => {
            return error(
                ErrorCode::InvalidRequest,
                "Stream-Seq must be a non-empty string of visible ASCII (compared byte-wise)",
            )
        }
    };
    let ask = Append {
        producer,
        stream_seq,
        close: ctx.closes(),
        content_type: ctx.header("content-type").map(str::to_owned),
        body: match body_bytes(&ctx, body).await {
            Ok(b) => b,
            Err(r) => return r,
        },
    };
    let done = append::append(&ctx.app, streams, &ctx.channel, &stream, caller(&ctx), &ask).await;
    let a = match done {
        Ok(a) => a,
        Err(e) => return refuse(&ctx, e),
    };
    let producer_stored = a.stored && ask.producer.is_some();
    let mut r = empty(if producer_stored {
        StatusCode::OK
    } else {
        StatusCode::NO_CONTENT
    });
    set(&mut r, "stream-next-offset", offset(a.epoch, a.tail));
    if a.closed {
        set(&mut r, "stream-closed", "true");
    }
    if let (Some(p), Some(seq)) = (&ask.producer, a.producer_seq) {
        set(&mut r, "producer-epoch", p.epoch.to_string());
        set(&mut r, "producer-seq", seq.to_string());
    }
    r
}
