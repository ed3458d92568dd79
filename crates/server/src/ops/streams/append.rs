//! Appends to a stream (PROTOCOL.md 5.2 and 5.3): the body's messages, the
//! content type check, closing, idempotent producers and `Stream-Seq`.
//!
//! Every append is one `Journal::change` guarded by the stream's
//! incarnation, its producer tuple, its `Stream-Seq` and `Stream-Closed`:
//! the journal decides the producer and `Stream-Seq` checks
//! (`gapless_core::meta::decide`) where its writes to the channel are
//! serialized, and records what they guard atomically with the events. So
//! appends of one stream are decided in the order they reach the journal
//! (a producer's pipelined seqs all land), one write each, and a crash can
//! never keep an append without its producer state, or the reverse.

use super::error::StreamError;
use super::layout::synced_tail;
use super::{is_json, is_text, media_type, Life, Meta, Stream, Streams};
use crate::auth::Grant;
use crate::App;
use bytes::Bytes;
use gapless_core::journal::now_ms;
use gapless_core::meta::{Change, Guard, Outcome, ProducerTuple, Refusal};
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::{Epoch, NewEvent, Payload};
use std::net::IpAddr;

/// Who appends: the grant checked for the operation and the client's
/// address (the keys of the publish limits).
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    /// The caller's grant.
    pub grant: &'a Grant,
    /// The client's address.
    pub peer: Option<IpAddr>,
}

/// What an append asks.
#[derive(Debug, Clone)]
pub struct Append {
    /// The idempotent producer's tuple (PROTOCOL.md 5.2.1).
    pub producer: Option<ProducerTuple>,
    /// `Stream-Seq`, as sent.
    pub stream_seq: Option<String>,
    /// `Stream-Closed: true`: the append closes the stream.
    pub close: bool,
    /// The request's `Content-Type`.
    pub content_type: Option<String>,
    /// The body (empty only for a close).
    pub body: Bytes,
}

/// A successful append's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// The epoch of the stream's offsets.
    pub epoch: Epoch,
    /// The position after the stream's last message (its next offset).
    pub tail: u64,
    /// A producer's append stored now (`200`, where a duplicate or an
    /// append without producer is `204`).
    pub stored: bool,
    /// The stream is closed (by this append, or a retry of its close).
    pub closed: bool,
    /// The producer seq to echo in `Producer-Seq`: the request's, or for a
    /// duplicate the producer's last.
    pub producer_seq: Option<u64>,
}

/// The messages of `body` for a stream of content type `ct`: JSON mode
/// splits an array into its elements; any other type is one message of the
/// whole body. A text stream (`text/*`, JSON) takes UTF-8 only; any other
/// type's body is stored as bytes, exactly (docs/durable-streams.md,
/// "Binary").
///
/// # Errors
/// `invalid_utf8` (answered 415) naming the byte, `invalid_json` naming
/// what is wrong.
pub fn messages(ct: &str, body: &[u8]) -> Result<Vec<Payload>, StreamError> {
    if !is_text(ct) {
        return Ok(vec![Payload::Binary(body.to_vec())]);
    }
    let text = std::str::from_utf8(body).map_err(|e| {
        StreamError::invalid(
            ErrorCode::InvalidUtf8,
            format!(
                "the body is not UTF-8 (invalid at byte {}), and this stream's content type \
                 is text; create the stream with a binary type (application/octet-stream) \
                 to append bytes",
                e.valid_up_to()
            ),
        )
    })?;
    if is_json(ct) {
        gapless_protocol::ds::json_messages(text)
            .map(|m| m.into_iter().map(Payload::Text).collect())
            .map_err(|m| StreamError::invalid(ErrorCode::InvalidJson, m))
    } else {
        Ok(vec![Payload::Text(text.to_owned())])
    }
}

/// `msgs` as events after the publish limits (`--max-event-bytes` or the
/// namespace's, `--max-batch-events`, `--publish-rate`): the same checks as
/// every publish (`ops::publish::check_batch`), a message too large named
/// as a stream's (the body, or an element of a JSON array), not as an
/// event of a batch.
///
/// # Errors
/// The limit's refusal.
pub fn checked(
    app: &App,
    caller: Caller<'_>,
    channel: &str,
    msgs: Vec<Payload>,
) -> Result<Vec<NewEvent>, StreamError> {
    let max = crate::ops::namespaces::max_event_bytes(app, channel);
    if let Some((i, m)) = msgs.iter().enumerate().find(|(_, m)| m.len() > max) {
        let len = m.len();
        let what = if msgs.len() == 1 {
            format!("the message has {len} bytes")
        } else {
            format!("element {i} of the JSON array (counting from 0) has {len} bytes")
        };
        let setting = crate::ops::namespaces::max_event_bytes_setting(app, channel);
        let e = crate::error::ApiError::new(
            ErrorCode::TooLarge,
            format!("{what}; a message may have at most {max} bytes ({setting})"),
        )
        .with("limit", max);
        return Err(StreamError::Api(e));
    }
    let events = msgs
        .into_iter()
        .map(|data| NewEvent {
            event_type: None,
            data,
        })
        .collect();
    crate::ops::publish::check_batch(app, caller.grant, caller.peer, channel, events)
        .map_err(StreamError::Api)
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

/// The position of seq `last` of epoch `epoch` that an append stored, and
/// the epoch of the stream's offsets: when the channel was purged since the
/// stream last looked, the stream follows its new epoch first.
pub fn appended_at(meta: &mut Meta, epoch: Epoch, last: u64) -> (u64, Epoch) {
    meta.follow_epoch(epoch);
    (meta.layout.virt(last), meta.epoch)
}

/// The stream's tail now and the epoch of its offsets, after following a
/// purge of its channel.
async fn tail(app: &App, meta: &mut Meta) -> Result<(u64, Epoch), StreamError> {
    let t = synced_tail(app, meta).await?;
    Ok((t, meta.epoch))
}

/// The events of an append's body, after the content type check.
fn events(
    app: &App,
    caller: Caller<'_>,
    channel: &str,
    meta: &Meta,
    ask: &Append,
) -> Result<Vec<NewEvent>, StreamError> {
    if ask.body.is_empty() {
        return Ok(Vec::new());
    }
    let Some(ct) = ask.content_type.as_deref() else {
        return Err(StreamError::invalid(
            ErrorCode::MissingContentType,
            "an append with a body needs a Content-Type",
        ));
    };
    if media_type(ct) != meta.media_type() {
        return Err(StreamError::invalid(
            ErrorCode::ContentTypeMismatch,
            format!(
                "Content-Type {ct:?} differs from the stream's {:?}",
                meta.content_type()
            ),
        ));
    }
    let msgs = messages(meta.content_type(), &ask.body)?;
    if msgs.is_empty() {
        return Err(StreamError::invalid(
            ErrorCode::EmptyJsonArray,
            "an append of an empty JSON array appends nothing; send at least one message",
        ));
    }
    checked(app, caller, channel, msgs)
}

/// Appends `ask` to `stream` (the stream of `channel`, found by
/// [`super::lookup::for_append`]): one journal change (module doc).
///
/// # Errors
/// [`StreamError`]: the stream deleted or closed, the body refused, the
/// producer or `Stream-Seq` checks, the publish limits, the journal.
pub async fn append(
    app: &App,
    streams: &Streams,
    channel: &str,
    stream: &Stream,
    caller: Caller<'_>,
    ask: &Append,
) -> Result<Appended, StreamError> {
    if ask.body.is_empty() && !ask.close {
        return Err(StreamError::invalid(
            ErrorCode::EmptyBody,
            "an append needs a body (only a close, Stream-Closed: true, may be empty)",
        ));
    }
    let (change, inc) = {
        let mut meta = stream.lock().await;
        if meta.deleted || meta.soft_deleted {
            return Err(StreamError::Deleted);
        }
        if meta.closed {
            // Closure is final within an incarnation: the copy is right.
            let retry = ask.producer.is_some() && ask.producer == meta.stored.closed_by;
            let close_only = ask.close && ask.body.is_empty();
            return to_closed(app, &mut meta, ask, retry, close_only).await;
        }
        let events = events(app, caller, channel, &meta, ask)?;
        meta.touch(now_ms());
        let change = Change::Append {
            guard: Guard {
                incarnation: meta.inc,
                producer: ask.producer.clone(),
                stream_seq: ask.stream_seq.clone(),
                close: ask.close,
            },
            key: append_key(meta.inc, ask.producer.as_ref(), ask.stream_seq.as_deref()),
            events,
        };
        (change, meta.inc)
    };
    let before = stream.changes();
    let changed = app.hub.change(channel, change).await.map_err(|e| {
        StreamError::Api(crate::error::ApiError::from(e).publish_refused("Producer-Seq"))
    })?;
    let mut meta = stream.lock().await;
    if meta.inc != inc {
        return Err(StreamError::Deleted);
    }
    if let Some(stored) = changed.meta.clone() {
        meta.refresh(stored);
        if matches!(changed.outcome, Outcome::Appended(_)) {
            // This append's own change (the journal reports it before it
            // answers, here): the copy is current unless another came too.
            stream.current_if(before + 1);
        }
    }
    decided(
        app,
        streams,
        channel,
        stream,
        &mut meta,
        ask,
        changed.outcome,
    )
    .await
}

/// An append to a closed stream: a retry of the append that closed it
/// (`retry`) or a repeated close without a body (`close_only`) succeeds;
/// anything else is refused [`StreamError::Closed`]. Both name the final
/// tail.
async fn to_closed(
    app: &App,
    meta: &mut Meta,
    ask: &Append,
    retry: bool,
    close_only: bool,
) -> Result<Appended, StreamError> {
    let (tail, epoch) = tail(app, meta).await?;
    if retry || close_only {
        return Ok(Appended {
            epoch,
            tail,
            stored: false,
            closed: true,
            producer_seq: ask.producer.as_ref().filter(|_| retry).map(|p| p.seq),
        });
    }
    Err(StreamError::Closed { epoch, tail })
}

/// The answer to an append the journal decided.
async fn decided(
    app: &App,
    streams: &Streams,
    channel: &str,
    stream: &Stream,
    meta: &mut Meta,
    ask: &Append,
    outcome: Outcome,
) -> Result<Appended, StreamError> {
    let seq = ask.producer.as_ref().map(|p| p.seq);
    match outcome {
        Outcome::Appended(a) => {
            let (tail, epoch) = match a {
                Some(a) if !a.duplicate => appended_at(meta, a.epoch, a.last_seq),
                // A duplicate (the retry of an append stored before a crash
                // by a release that journaled producer state after it): the
                // tail is the stream's, not the original append's.
                _ => tail(app, meta).await?,
            };
            if ask.close {
                meta.closed = true;
                meta.announce(Life::Closed);
            }
            Ok(Appended {
                epoch,
                tail,
                stored: ask.producer.is_some() && a.is_some_and(|a| !a.duplicate),
                closed: ask.close,
                producer_seq: seq,
            })
        }
        Outcome::Duplicate(last) => {
            let (tail, epoch) = tail(app, meta).await?;
            Ok(Appended {
                epoch,
                tail,
                stored: false,
                closed: false,
                producer_seq: seq.map(|_| last),
            })
        }
        Outcome::AlreadyClosed(retry) => {
            meta.closed = true;
            meta.announce(Life::Closed);
            to_closed(app, meta, ask, retry, !retry).await
        }
        Outcome::Refused(refusal) => {
            Err(refused(app, streams, channel, stream, meta, ask, refusal).await)
        }
        // Not answers of an append.
        Outcome::Created(_) | Outcome::Exists | Outcome::Updated | Outcome::Deleted => {
            Err(StreamError::Deleted)
        }
    }
}

/// The error of an append the journal refused.
async fn refused(
    app: &App,
    streams: &Streams,
    channel: &str,
    stream: &Stream,
    meta: &mut Meta,
    ask: &Append,
    refusal: Refusal,
) -> StreamError {
    match refusal {
        Refusal::NotFound | Refusal::SoftDeleted => {
            if refusal == Refusal::NotFound {
                meta.deleted = true;
                meta.announce(Life::Gone);
                streams.drop_cached(channel, stream);
            }
            StreamError::Deleted
        }
        Refusal::Closed => {
            meta.closed = true;
            meta.announce(Life::Closed);
            match tail(app, meta).await {
                Ok((tail, epoch)) => StreamError::Closed { epoch, tail },
                Err(e) => e,
            }
        }
        Refusal::StaleEpoch { current } => StreamError::StaleEpoch {
            given: ask.producer.as_ref().map_or(0, |p| p.epoch),
            current,
        },
        Refusal::EpochSeqNotZero { epoch } => StreamError::EpochSeqNotZero { epoch },
        Refusal::SeqGap { expected, received } => StreamError::SeqGap {
            expected,
            received,
            new_producer: ask.producer.as_ref().map(|p| p.id.clone()),
        },
        Refusal::StreamSeqRegression { last } => StreamError::StreamSeqRegression {
            given: ask.stream_seq.clone().unwrap_or_default(),
            last,
        },
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
