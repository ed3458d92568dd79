//! Appends: `POST` (append, close, idempotent producers, `Stream-Seq`,
//! PROTOCOL.md 5.2 and 5.3). Creation is in [`super::create`], deletion in
//! [`super::lifecycle`].
//!
//! Every append is one `Journal::change` guarded by the stream's
//! incarnation, its producer headers, its `Stream-Seq` and `Stream-Closed`:
//! the journal decides the producer and `Stream-Seq` checks
//! (`gapless_core::meta::decide`) where its writes to the channel are
//! serialized, and records what they guard atomically with the events. So
//! appends of one stream are decided in the order they reach the journal
//! (a producer's pipelined seqs all land), one write each, and a crash can
//! never keep an append without its producer state, or the reverse.

use super::lifecycle::lookup_for_append;
use super::names::offset;
use super::streams::{self, media_type, Life, Meta, Stream};
use super::{api_error, empty, error, error_as, set, Ctx};
use axum::body::Body;
use axum::http::StatusCode;
use axum::response::Response;
use gapless_core::journal::now_ms;
use gapless_core::meta::{Change, Guard, Outcome, ProducerTuple, Refusal, MAX_SAFE_INTEGER};
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::{Epoch, NewEvent, Payload};

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

/// The messages of a body for a stream of content type `ct`: JSON mode
/// splits an array into its elements; any other type is one message of the
/// whole body. A text stream (`text/*`, JSON) takes UTF-8 only (415
/// otherwise); any other type's body is stored as bytes, exactly
/// (docs/durable-streams.md, "Binary").
pub(super) fn messages(ct: &str, body: &[u8]) -> Result<Vec<Payload>, Response> {
    if !streams::is_text(ct) {
        return Ok(vec![Payload::Binary(body.to_vec())]);
    }
    let text = std::str::from_utf8(body).map_err(|e| {
        error_as(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::InvalidUtf8,
            format!(
                "the body is not UTF-8 (invalid at byte {}), and this stream's content type \
                 is text; create the stream with a binary type (application/octet-stream) \
                 to append bytes",
                e.valid_up_to()
            ),
        )
    })?;
    if streams::is_json(ct) {
        streams::json_messages(text)
            .map(|m| m.into_iter().map(Payload::Text).collect())
            .map_err(|m| error(ErrorCode::InvalidJson, m))
    } else {
        Ok(vec![Payload::Text(text.to_owned())])
    }
}

/// `msgs` as events after the publish limits (`--max-event-bytes` or the
/// namespace's, `--max-batch-events`, `--publish-rate`): the same checks as
/// every publish (`ops::publish::check_batch`).
pub(super) fn checked(ctx: &Ctx, msgs: Vec<Payload>) -> Result<Vec<NewEvent>, Response> {
    let events = msgs
        .into_iter()
        .map(|data| NewEvent {
            event_type: None,
            data,
        })
        .collect();
    crate::ops::publish::check_batch(&ctx.app, &ctx.grant, ctx.peer, &ctx.channel, events)
        .map_err(api_error)
}

/// The idempotency key of an append to a stream of incarnation `inc`: from
/// the producer tuple, else from `Stream-Seq`, else none. The metadata's
/// producer state already makes such an append exact; the key (stored with
/// the events, in the same write) also keeps exact a retry of an append
/// stored by a release that journaled producer state after the append.
/// Parts that are long or not visible ASCII are hashed.
fn append_key(inc: u64, prod: Option<&ProducerTuple>, stream_seq: Option<&str>) -> Option<String> {
    let part = |v: &str| -> String {
        if v.len() <= 96 && v.bytes().all(|b| b.is_ascii_graphic()) {
            v.to_owned()
        } else {
            // FNV-1a, 64 bits: stable across builds, as a key must be.
            let h = v.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
            format!("#{h:016x}{:x}", v.len())
        }
    };
    match (prod, stream_seq) {
        (Some(p), _) => Some(format!(
            "ds/{inc:x}/p/{}/{}/{}",
            p.epoch,
            p.seq,
            part(&p.id)
        )),
        (None, Some(s)) => Some(format!("ds/{inc:x}/s/{}", part(s))),
        (None, None) => None,
    }
}

/// The stream's tail position now, after following a purge of its channel
/// ([`Meta::follow_epoch`]).
pub(super) async fn head(ctx: &Ctx, meta: &mut Meta) -> Result<u64, Response> {
    super::fork::synced_tail(&ctx.app, meta)
        .await
        .map_err(|e| api_error(e.into()))
}

/// The position of seq `last` of epoch `epoch` that an append stored, and
/// the epoch of the stream's offsets: when the channel was purged since the
/// stream last looked, the stream follows its new epoch first.
pub(super) fn appended_at(meta: &mut Meta, epoch: Epoch, last: u64) -> (u64, Epoch) {
    meta.follow_epoch(epoch);
    (meta.layout.virt(last), meta.epoch)
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
    let int = |name: &str, v: &str| -> Result<u64, Response> {
        let v = v.trim();
        if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(format!("{name} {v:?} must be a non-negative integer")));
        }
        match v.parse::<u64>() {
            Ok(n) if n <= MAX_SAFE_INTEGER => Ok(n),
            _ => Err(bad(format!("{name} {v:?} is above 2^53-1"))),
        }
    };
    Ok(Some(ProducerTuple {
        id: id.to_owned(),
        epoch: int("Producer-Epoch", epoch)?,
        seq: int("Producer-Seq", seq)?,
    }))
}

/// The refusal of an append to a stream that was deleted.
fn deleted(ctx: &Ctx) -> Response {
    error(
        ErrorCode::StreamNotFound,
        format!("the stream at {} was deleted", ctx.url_path),
    )
}

/// The answer to an append to a closed stream: a retry of the append that
/// closed it (`retry`) or a repeated close without a body (`close_only`)
/// succeeds; anything else is `409 stream_closed`. Both name the final tail.
fn to_closed(
    meta: &Meta,
    tail: u64,
    prod: Option<&ProducerTuple>,
    retry: bool,
    close_only: bool,
) -> Response {
    if retry || close_only {
        let mut r = empty(StatusCode::NO_CONTENT);
        set(&mut r, "stream-next-offset", offset(meta.epoch, tail));
        set(&mut r, "stream-closed", "true");
        if let (true, Some(p)) = (retry, prod) {
            prod_headers(&mut r, p, p.seq);
        }
        return r;
    }
    let mut r = error(
        ErrorCode::StreamClosed,
        "the stream is closed; it takes no more appends",
    );
    set(&mut r, "stream-next-offset", offset(meta.epoch, tail));
    set(&mut r, "stream-closed", "true");
    r
}

/// The content type check of an append with a body (PROTOCOL.md 5.2).
fn content_type(ctx: &Ctx, meta: &Meta, body: &[u8]) -> Result<(), Response> {
    if body.is_empty() {
        return Ok(());
    }
    let Some(ct) = ctx.header("content-type") else {
        return Err(error(
            ErrorCode::MissingContentType,
            "an append with a body needs a Content-Type",
        ));
    };
    if media_type(ct) != meta.media_type() {
        return Err(error(
            ErrorCode::ContentTypeMismatch,
            format!(
                "Content-Type {ct:?} differs from the stream's {:?}",
                meta.content_type
            ),
        ));
    }
    Ok(())
}

/// The messages of a non-empty body (an empty JSON array is refused).
fn body_messages(meta: &Meta, body: &[u8]) -> Result<Vec<Payload>, Response> {
    let msgs = messages(&meta.content_type, body)?;
    if msgs.is_empty() {
        return Err(error(
            ErrorCode::EmptyJsonArray,
            "an append of an empty JSON array appends nothing; send at least one message",
        ));
    }
    Ok(msgs)
}

/// Sets the producer headers of an answer: its epoch and `seq`.
fn prod_headers(r: &mut Response, p: &ProducerTuple, seq: u64) {
    set(r, "producer-epoch", p.epoch.to_string());
    set(r, "producer-seq", seq.to_string());
}

/// What an append asks, read from its request.
struct Ask {
    prod: Option<ProducerTuple>,
    stream_seq: Option<String>,
    close: bool,
    body: bytes::Bytes,
}

/// `POST {stream}`: appends the body (JSON mode: one message per element of
/// an array), closes with `Stream-Closed: true`, deduplicates idempotent
/// producers' retries and refuses `Stream-Seq` regressions: one journal
/// change (module doc).
pub async fn append(ctx: Ctx, body: Body) -> Response {
    let stream = match lookup_for_append(&ctx).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let prod = match producer(&ctx) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let ask = Ask {
        prod,
        stream_seq: ctx.header("stream-seq").map(str::to_owned),
        close: ctx.closes(),
        body: match body_bytes(&ctx, body).await {
            Ok(b) => b,
            Err(r) => return r,
        },
    };
    if ask.body.is_empty() && !ask.close {
        return error(
            ErrorCode::EmptyBody,
            "an append needs a body (only a close, Stream-Closed: true, may be empty)",
        );
    }
    let (change, inc) = {
        let mut meta = stream.lock().await;
        if meta.deleted || meta.soft_deleted {
            return deleted(&ctx);
        }
        if meta.closed {
            // Closure is final within an incarnation: the copy is right.
            return closed_answer(&ctx, &mut meta, &ask).await;
        }
        if let Err(r) = content_type(&ctx, &meta, &ask.body) {
            return r;
        }
        let events = if ask.body.is_empty() {
            Vec::new()
        } else {
            match body_messages(&meta, &ask.body).and_then(|m| checked(&ctx, m)) {
                Ok(e) => e,
                Err(r) => return r,
            }
        };
        meta.touch(now_ms());
        let change = Change::Append {
            guard: Guard {
                incarnation: meta.inc,
                producer: ask.prod.clone(),
                stream_seq: ask.stream_seq.clone(),
                close: ask.close,
            },
            key: append_key(meta.inc, ask.prod.as_ref(), ask.stream_seq.as_deref()),
            events,
        };
        (change, meta.inc)
    };
    let before = stream.changes();
    let changed = match ctx.app.hub.change(&ctx.channel, change).await {
        Ok(c) => c,
        Err(e) => {
            return api_error(crate::error::ApiError::from(e).publish_refused("Producer-Seq"))
        }
    };
    let mut meta = stream.lock().await;
    if meta.inc != inc {
        return deleted(&ctx);
    }
    if let Some(stored) = changed.meta.clone() {
        meta.refresh(stored);
        if matches!(changed.outcome, Outcome::Appended(_)) {
            // This append's own change (the journal reports it before it
            // answers, here): the copy is current unless another came too.
            stream.current_if(before + 1);
        }
    }
    answer(&ctx, &stream, &mut meta, &ask, changed.outcome).await
}

/// The answer to a closed stream (its copy says closed), from its stored
/// closing tuple.
async fn closed_answer(ctx: &Ctx, meta: &mut Meta, ask: &Ask) -> Response {
    let tail = match head(ctx, meta).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let retry = ask.prod.is_some() && ask.prod == meta.stored.closed_by;
    to_closed(
        meta,
        tail,
        ask.prod.as_ref(),
        retry,
        ask.close && ask.body.is_empty(),
    )
}

/// The answer to a decided append.
async fn answer(
    ctx: &Ctx,
    stream: &Stream,
    meta: &mut Meta,
    ask: &Ask,
    outcome: Outcome,
) -> Response {
    match outcome {
        Outcome::Appended(a) => {
            let (tail, epoch) = match a {
                Some(a) if !a.duplicate => appended_at(meta, a.epoch, a.last_seq),
                // A duplicate (the retry of an append stored before a crash
                // by a release that journaled producer state after it): the
                // tail is the stream's, not the original append's.
                _ => match head(ctx, meta).await {
                    Ok(t) => (t, meta.epoch),
                    Err(r) => return r,
                },
            };
            if ask.close {
                meta.closed = true;
                meta.announce(Life::Closed);
            }
            let stored = a.is_some_and(|a| !a.duplicate);
            let status = if ask.prod.is_some() && stored {
                StatusCode::OK
            } else {
                StatusCode::NO_CONTENT
            };
            let mut r = empty(status);
            set(&mut r, "stream-next-offset", offset(epoch, tail));
            if ask.close {
                set(&mut r, "stream-closed", "true");
            }
            if let Some(p) = &ask.prod {
                prod_headers(&mut r, p, p.seq);
            }
            r
        }
        Outcome::Duplicate(last) => {
            let t = match head(ctx, meta).await {
                Ok(t) => t,
                Err(r) => return r,
            };
            let mut r = empty(StatusCode::NO_CONTENT);
            set(&mut r, "stream-next-offset", offset(meta.epoch, t));
            if let Some(p) = &ask.prod {
                prod_headers(&mut r, p, last);
            }
            r
        }
        Outcome::AlreadyClosed(retry) => {
            meta.closed = true;
            meta.announce(Life::Closed);
            match head(ctx, meta).await {
                Ok(t) => to_closed(meta, t, ask.prod.as_ref(), retry, !retry),
                Err(r) => r,
            }
        }
        Outcome::Refused(refusal) => refused(ctx, stream, meta, ask, refusal).await,
        // Not answers of an append.
        Outcome::Created(_) | Outcome::Exists | Outcome::Updated | Outcome::Deleted => deleted(ctx),
    }
}

/// The answer to an append the journal refused.
async fn refused(
    ctx: &Ctx,
    stream: &Stream,
    meta: &mut Meta,
    ask: &Ask,
    refusal: Refusal,
) -> Response {
    match refusal {
        Refusal::NotFound | Refusal::SoftDeleted => {
            if refusal == Refusal::NotFound {
                meta.deleted = true;
                meta.announce(Life::Gone);
                ctx.ds.streams.drop_cached(&ctx.channel, stream);
            }
            deleted(ctx)
        }
        Refusal::Closed => {
            meta.closed = true;
            meta.announce(Life::Closed);
            match head(ctx, meta).await {
                Ok(t) => to_closed(meta, t, ask.prod.as_ref(), false, false),
                Err(r) => r,
            }
        }
        Refusal::StaleEpoch { current } => {
            let epoch = ask.prod.as_ref().map_or(0, |p| p.epoch);
            let mut r = error(
                ErrorCode::StaleProducerEpoch,
                format!("producer epoch {epoch} is older than the current {current}"),
            );
            set(&mut r, "producer-epoch", current.to_string());
            r
        }
        Refusal::EpochSeqNotZero { epoch } => error(
            ErrorCode::InvalidProducer,
            format!("a new producer epoch {epoch} must start at seq 0"),
        ),
        Refusal::SeqGap { expected, received } => {
            let message = match (expected, &ask.prod) {
                (0, Some(p)) => format!("producer {:?} is new here: its first seq must be 0", p.id),
                _ => format!("producer seq {received} skips {expected}"),
            };
            let mut r = error(ErrorCode::ProducerSeqGap, message);
            set(&mut r, "producer-expected-seq", expected.to_string());
            set(&mut r, "producer-received-seq", received.to_string());
            r
        }
        Refusal::StreamSeqRegression { last } => {
            let s = ask.stream_seq.as_deref().unwrap_or_default();
            error(
                ErrorCode::StreamSeqRegression,
                format!("Stream-Seq {s:?} is not above the last one, {last:?}"),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_keys_name_the_incarnation_and_stay_short_visible_ascii() {
        let p = |id: &str| ProducerTuple {
            id: id.to_owned(),
            epoch: 2,
            seq: 7,
        };
        assert_eq!(
            append_key(0xab, Some(&p("w-1")), Some("9")).as_deref(),
            Some("ds/ab/p/2/7/w-1")
        );
        assert_eq!(
            append_key(0xab, None, Some("0005")).as_deref(),
            Some("ds/ab/s/0005")
        );
        assert_eq!(append_key(0xab, None, None), None);
        assert_ne!(
            append_key(1, Some(&p("w")), None),
            append_key(2, Some(&p("w")), None),
            "a stream created again never matches its predecessor's keys"
        );
        let long = "x".repeat(5000);
        let spaced = "a producer id";
        for id in [long.as_str(), spaced] {
            let k = append_key(u64::MAX, Some(&p(id)), None).unwrap_or_default();
            assert!(k.len() <= 128, "{k}");
            assert!(k.bytes().all(|b| b.is_ascii_graphic()), "{k}");
            assert_eq!(Some(k), append_key(u64::MAX, Some(&p(id)), None), "stable");
        }
        assert_ne!(
            append_key(1, Some(&p(&"x".repeat(200))), None),
            append_key(1, Some(&p(&"y".repeat(200))), None)
        );
    }
}
