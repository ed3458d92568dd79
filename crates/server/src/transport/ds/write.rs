//! Writes: `PUT` (create), `POST` (append, close, idempotent producers,
//! `Stream-Seq`) and `DELETE` (PROTOCOL.md 5.1 to 5.4).

use super::fork::{self, Layout};
use super::names::offset;
use super::streams::{self, media_type, Claim, Life, Meta, Stream};
use super::{api_error, empty, error, set, Ctx};
use axum::body::Body;
use axum::http::StatusCode;
use axum::response::Response;
use gapless_core::journal::now_ms;
use gapless_protocol::{Epoch, NewEvent, Payload};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// The largest JavaScript-safe integer, the bound of producer epochs and seqs.
const MAX_SAFE: u64 = (1 << 53) - 1;

/// The stream on the context's channel, unless it is absent, expired (an
/// expired one is forgotten here, or soft-deleted while forks use it) or
/// soft-deleted (410, PROTOCOL.md 4.2).
pub(super) async fn lookup(ctx: &Ctx) -> Result<Stream, Response> {
    let not_found = || {
        error(
            StatusCode::NOT_FOUND,
            "stream_not_found",
            format!("no stream at {}", ctx.url_path),
        )
    };
    let gone = || {
        error(
            StatusCode::GONE,
            "stream_deleted",
            format!(
                "the stream at {} was deleted; it is kept only for the forks that read it",
                ctx.url_path
            ),
        )
    };
    let s = match ctx.ds.streams.get(&ctx.channel) {
        Some(s) => s,
        None => {
            // Perhaps created on another node since the last catch-up.
            super::meta::catch_up(&ctx.app, &ctx.ds)
                .await
                .map_err(|e| api_error(e.into()))?;
            ctx.ds.streams.get(&ctx.channel).ok_or_else(not_found)?
        }
    };
    let now = now_ms();
    let mut m = s.lock().await;
    if m.deleted {
        return Err(not_found());
    }
    if m.soft_deleted || m.expired(now) {
        // Forgotten (or soft-deleted) alone: the appends in flight finish,
        // and journal their records, before the deletion's.
        let gate = m.order.gate.clone();
        drop(m);
        let _alone = gate.write_owned().await;
        m = s.lock().await;
        if m.deleted {
            return Err(not_found());
        }
        if !(m.soft_deleted || m.expired(now)) {
            // Written to meanwhile (its TTL restarted).
            drop(m);
            return Ok(s);
        }
        if fork::has_live_forks(&m, now) {
            if !m.soft_deleted {
                m.soft_deleted = true;
                m.announce(Life::Gone);
                if let Err(e) = save(ctx, &mut m).await {
                    return Err(api_error(e.into()));
                }
            }
            return Err(gone());
        }
        fork::forget(&ctx.app, &ctx.ds, &ctx.channel, &s, m).await;
        return Err(not_found());
    }
    drop(m);
    Ok(s)
}

/// Reads the request body, at most `--max-batch-bytes`: a larger one is
/// `413 too_large` with `limit` (the connection then closes, lingering so the
/// client still sending reads the answer: `net/conn.rs`); one that arrives
/// slower than `--min-body-rate` (after `--header-timeout-ms` of grace) is
/// `408 request_timeout`, as on every route that takes a body.
async fn body_bytes(ctx: &Ctx, body: Body) -> Result<bytes::Bytes, Response> {
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

/// The messages of a body for a stream of `meta`'s type: JSON mode splits
/// an array into its elements; any other type is one message of the whole
/// body. A text stream (`text/*`, JSON) takes UTF-8 only (415 otherwise); any
/// other type's body is stored as bytes, exactly (docs/durable-streams.md,
/// "Binary").
fn messages(meta: &Meta, body: &[u8]) -> Result<Vec<Payload>, Response> {
    if !meta.is_text() {
        return Ok(vec![Payload::Binary(body.to_vec())]);
    }
    let text = std::str::from_utf8(body).map_err(|e| {
        error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_utf8",
            format!(
                "the body is not UTF-8 (invalid at byte {}), and this stream's content type \
                 is text; create the stream with a binary type (application/octet-stream) \
                 to append bytes",
                e.valid_up_to()
            ),
        )
    })?;
    if meta.is_json() {
        streams::json_messages(text)
            .map(|m| m.into_iter().map(Payload::Text).collect())
            .map_err(|m| error(StatusCode::BAD_REQUEST, "invalid_json", m))
    } else {
        Ok(vec![Payload::Text(text.to_owned())])
    }
}

/// Journals `m`'s state (see [`super::meta`]) before the operation is answered.
async fn save(ctx: &Ctx, m: &mut Meta) -> Result<(), gapless_core::journal::JournalError> {
    super::meta::save(&ctx.app, &ctx.channel, m).await
}

/// The idempotency key of an append to a stream of incarnation `inc`: from
/// the producer tuple, else from `Stream-Seq`, else none. The journal
/// stores an append with a key seen before (while its events are retained)
/// once, atomically with the append, so a retry across a crash is never
/// stored twice. Parts that are long or not visible ASCII are hashed.
fn append_key(inc: u64, prod: Option<&Producer>, stream_seq: Option<&str>) -> Option<String> {
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

/// Appends `msgs` to the channel as one batch (the publish limits apply),
/// with idempotency key `key`; returns the new tail seq, whether the
/// journal had the key already (nothing appended), and the channel's epoch
/// the seq is of.
async fn publish_keyed(
    ctx: &Ctx,
    msgs: Vec<Payload>,
    key: Option<&str>,
) -> Result<(u64, bool, Epoch), Response> {
    let events = msgs
        .into_iter()
        .map(|data| NewEvent {
            event_type: None,
            data,
        })
        .collect();
    crate::ops::publish::batch(&ctx.app, &ctx.grant, ctx.peer, &ctx.channel, events, key)
        .await
        .map(|a| (a.last_seq, a.duplicate, a.epoch))
        .map_err(api_error)
}

/// Appends `msgs` to the channel as one batch (the publish limits apply);
/// returns the new tail seq.
async fn publish(ctx: &Ctx, msgs: Vec<Payload>) -> Result<u64, Response> {
    publish_keyed(ctx, msgs, None).await.map(|(t, _, _)| t)
}

/// The stream's tail position now, after following a purge of its channel
/// ([`Meta::follow_epoch`]).
async fn head(ctx: &Ctx, meta: &mut Meta) -> Result<u64, Response> {
    fork::synced_tail(&ctx.app, meta)
        .await
        .map_err(|e| api_error(e.into()))
}

/// The position of seq `last` of epoch `epoch` that an append stored, and
/// the epoch of the stream's offsets: when the channel was purged since the
/// stream last looked, the stream follows its new epoch first.
fn appended_at(meta: &mut Meta, epoch: Epoch, last: u64) -> (u64, Epoch) {
    meta.follow_epoch(epoch);
    (meta.layout.virt(last), meta.epoch)
}

/// `PUT {stream}`: creates the stream (a fork with `Stream-Forked-From`,
/// see [`fork`]), or answers 200 when it exists with the same content type,
/// TTL or expiry, closure and fork (409 otherwise).
pub async fn create(ctx: Ctx, body: Body) -> Response {
    let forked_from = ctx.header("stream-forked-from").map(str::to_owned);
    if forked_from.is_none()
        && (ctx.headers.contains_key("stream-fork-offset")
            || ctx.headers.contains_key("stream-fork-sub-offset"))
    {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_fork",
            "Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From",
        );
    }
    let ct_given = ctx
        .header("content-type")
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty());
    let ttl = match ctx.header("stream-ttl").map(streams::parse_ttl).transpose() {
        Ok(t) => t,
        Err(m) => return error(StatusCode::BAD_REQUEST, "invalid_ttl", m),
    };
    let expires_at = match ctx.header("stream-expires-at") {
        None => None,
        Some(v) => match streams::parse_rfc3339(v.trim()) {
            Ok(ms) => Some((v.trim().to_owned(), ms)),
            Err(m) => return error(StatusCode::BAD_REQUEST, "invalid_expires_at", m),
        },
    };
    if ttl.is_some() && expires_at.is_some() {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "give Stream-TTL or Stream-Expires-At, not both",
        );
    }
    let closed = ctx.closes();
    let body = match body_bytes(&ctx, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    // A stream created on another node since the last catch-up is the existing one (and a
    // fork's source is known).
    if let Err(e) = super::meta::catch_up(&ctx.app, &ctx.ds).await {
        return api_error(e.into());
    }
    let plan = match &forked_from {
        None => None,
        Some(f) => match fork::plan(&ctx, f, ct_given.as_deref()).await {
            Ok(p) => Some(p),
            Err(r) => return r,
        },
    };
    let now = now_ms();
    let st = match ctx.app.hub.state(&ctx.channel).await {
        Ok(s) => s,
        Err(e) => return api_error(e.into()),
    };
    let mut meta = Meta {
        content_type: ct_given
            .clone()
            .unwrap_or_else(|| "application/octet-stream".to_owned()),
        ttl_s: ttl,
        expires_at,
        deadline_ms: None,
        epoch: st.epoch,
        layout: Arc::new(Layout::plain(&ctx.channel, st.epoch, st.head)),
        fork_of: None,
        parent: None,
        children: Vec::new(),
        soft_deleted: false,
        closed: false,
        closed_by: None,
        deleted: false,
        last_stream_seq: None,
        producers: Default::default(),
        closed_tx: streams::life(),
        inc: rand::random(),
        rev: 0,
        rev_ms: 0,
        order: Default::default(),
    };
    let mut prefix = None;
    if let Some(p) = &plan {
        // PROTOCOL.md 4.2: the source's type; its TTL or expiry unless the
        // fork gives its own; its offsets' epoch.
        meta.content_type = p.content_type.clone();
        if meta.ttl_s.is_none() && meta.expires_at.is_none() {
            meta.ttl_s = p.ttl_s;
            meta.expires_at = p.expires_at.clone();
        }
        meta.epoch = p.epoch;
        meta.layout = Arc::new(Layout {
            channel: ctx.channel.clone(),
            epoch: st.epoch,
            base: st.head,
            origin: p.origin,
            parent: Some(p.parent.clone()),
        });
        meta.fork_of = Some(p.fork_of.clone());
        meta.parent = Some((p.fork_of.source.clone(), p.source.clone()));
        prefix = p.prefix.clone();
    }
    meta.touch(now);
    let mut msgs = if body.is_empty() {
        Vec::new()
    } else {
        match messages(&meta, &body) {
            Ok(m) => m,
            Err(r) => return r,
        }
    };
    if let Some(p) = prefix {
        msgs.insert(0, p);
    }
    let stream: Stream = Arc::new(tokio::sync::Mutex::new(meta));
    let mut guard = stream.clone().lock_owned().await;
    loop {
        match ctx.ds.streams.insert(&ctx.channel, stream.clone()) {
            Ok(()) => break,
            Err(existing) => {
                // Alone on it: an expired stream is forgotten only after its
                // appends in flight (see `lookup`).
                let gate = existing.lock().await.order.gate.clone();
                let _alone = gate.write_owned().await;
                let mut old = existing.lock().await;
                if old.deleted {
                    drop(old);
                    ctx.ds.streams.remove(&ctx.channel, &existing);
                    continue;
                }
                if old.soft_deleted || old.expired(now) {
                    if fork::has_live_forks(&old, now) {
                        if !old.soft_deleted {
                            old.soft_deleted = true;
                            old.announce(Life::Gone);
                            if let Err(e) = save(&ctx, &mut old).await {
                                return api_error(e.into());
                            }
                        }
                        return error(
                            StatusCode::CONFLICT,
                            "stream_exists",
                            format!(
                                "the stream at {} was deleted but its forks still read it; the path cannot be used until they are gone",
                                ctx.url_path
                            ),
                        );
                    }
                    fork::forget(&ctx.app, &ctx.ds, &ctx.channel, &existing, old).await;
                    continue;
                }
                let same_fork = match (&old.fork_of, &guard.fork_of, &plan) {
                    (None, None, _) => true,
                    (Some(a), Some(b), Some(p)) => {
                        a.source == b.source && a.sub == b.sub && (!p.offset_given || a.at == b.at)
                    }
                    _ => false,
                };
                let same = media_type(&old.content_type) == media_type(&guard.content_type)
                    && old.ttl_s == guard.ttl_s
                    && old.expires_at.as_ref().map(|e| e.1)
                        == guard.expires_at.as_ref().map(|e| e.1)
                    && old.closed == closed
                    && same_fork;
                if !same {
                    return error(
                        StatusCode::CONFLICT,
                        "stream_exists",
                        format!(
                            "a stream exists at {} with another content type, TTL, expiry, \
                             closure or fork",
                            ctx.url_path
                        ),
                    );
                }
                let tail = match head(&ctx, &mut old).await {
                    Ok(h) => h,
                    Err(r) => return r,
                };
                let mut r = empty(StatusCode::OK);
                set(&mut r, "content-type", &old.content_type);
                set(&mut r, "stream-next-offset", offset(old.epoch, tail));
                if old.closed {
                    set(&mut r, "stream-closed", "true");
                }
                return r;
            }
        }
    }
    let mut tail = guard.layout.origin;
    if !msgs.is_empty() {
        match publish(&ctx, msgs).await {
            Ok(t) => tail = guard.layout.virt(t),
            Err(r) => {
                ctx.ds.streams.remove(&ctx.channel, &stream);
                guard.deleted = true;
                return r;
            }
        }
    }
    if let Some(p) = &plan {
        fork::register(&p.source, &stream).await;
    }
    if closed {
        guard.closed = true;
    }
    // The stream exists once its record is journaled.
    if let Err(e) = save(&ctx, &mut guard).await {
        ctx.ds.streams.remove(&ctx.channel, &stream);
        guard.deleted = true;
        guard.announce(Life::Gone);
        return api_error(e.into());
    }
    if closed {
        guard.announce(Life::Closed);
    }
    let mut r = empty(StatusCode::CREATED);
    let host = ctx.header("host").unwrap_or("localhost");
    set(&mut r, "location", format!("http://{host}{}", ctx.url_path));
    set(&mut r, "content-type", &guard.content_type);
    set(&mut r, "stream-next-offset", offset(guard.epoch, tail));
    if closed {
        set(&mut r, "stream-closed", "true");
    }
    r
}

/// The producer headers of an append, all three or none.
#[derive(Debug, Clone)]
struct Producer {
    id: String,
    epoch: u64,
    seq: u64,
}

fn producer(ctx: &Ctx) -> Result<Option<Producer>, Response> {
    let id = ctx.headers.get("producer-id");
    let epoch = ctx.header("producer-epoch");
    let seq = ctx.header("producer-seq");
    if id.is_none() && epoch.is_none() && seq.is_none() {
        return Ok(None);
    }
    let bad = |m: String| error(StatusCode::BAD_REQUEST, "invalid_producer", m);
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
            Ok(n) if n <= MAX_SAFE => Ok(n),
            _ => Err(bad(format!("{name} {v:?} is above 2^53-1"))),
        }
    };
    Ok(Some(Producer {
        id: id.to_owned(),
        epoch: int("Producer-Epoch", epoch)?,
        seq: int("Producer-Seq", seq)?,
    }))
}

/// What the checks of producer headers and `Stream-Seq` decide
/// (PROTOCOL.md 5.2.1).
#[derive(Debug)]
enum Verdict {
    /// Append.
    Go,
    /// The producer's seq was accepted before: `204` naming its last seq.
    Duplicate(u64),
    /// Refused with this answer.
    Refuse(Response),
    /// The answer depends on an append in flight (the same producer's, or
    /// a `Stream-Seq` not below this one): check again once it settles.
    Wait,
}

/// The producer and `Stream-Seq` checks of an append against what is
/// committed (`producers`, `last_stream_seq`) and what is in flight: a
/// producer's checks wait for its append in flight, a `Stream-Seq` at or
/// below the committed one is refused at once, and one not above every
/// `Stream-Seq` in flight waits (only then could the answer differ with
/// how the appends in flight end).
fn verdict(
    producers: &std::collections::HashMap<String, (u64, u64)>,
    last_stream_seq: Option<&str>,
    inflight: &[Claim],
    prod: Option<&Producer>,
    stream_seq: Option<&str>,
) -> Verdict {
    if let Some(p) = prod {
        if inflight
            .iter()
            .any(|c| c.producer.as_deref() == Some(p.id.as_str()))
        {
            return Verdict::Wait;
        }
        match producers.get(&p.id).copied() {
            Some((epoch, _)) if p.epoch < epoch => {
                let mut r = error(
                    StatusCode::FORBIDDEN,
                    "stale_producer_epoch",
                    format!(
                        "producer epoch {} is older than the current {epoch}",
                        p.epoch
                    ),
                );
                set(&mut r, "producer-epoch", epoch.to_string());
                return Verdict::Refuse(r);
            }
            Some((epoch, last)) if p.epoch == epoch => {
                if p.seq <= last {
                    return Verdict::Duplicate(last);
                }
                if p.seq > last + 1 {
                    let mut r = error(
                        StatusCode::CONFLICT,
                        "producer_seq_gap",
                        format!("producer seq {} skips {}", p.seq, last + 1),
                    );
                    set(&mut r, "producer-expected-seq", (last + 1).to_string());
                    set(&mut r, "producer-received-seq", p.seq.to_string());
                    return Verdict::Refuse(r);
                }
            }
            _ if p.seq != 0 => {
                if producers.contains_key(&p.id) {
                    return Verdict::Refuse(error(
                        StatusCode::BAD_REQUEST,
                        "invalid_producer",
                        format!("a new producer epoch {} must start at seq 0", p.epoch),
                    ));
                }
                let mut r = error(
                    StatusCode::CONFLICT,
                    "producer_seq_gap",
                    format!("producer {:?} is new here: its first seq must be 0", p.id),
                );
                set(&mut r, "producer-expected-seq", "0");
                set(&mut r, "producer-received-seq", p.seq.to_string());
                return Verdict::Refuse(r);
            }
            _ => {}
        }
    }
    // Stream-Seq: strictly increasing, byte-wise (scope: the stream).
    if let Some(s) = stream_seq {
        if let Some(last) = last_stream_seq {
            if s.as_bytes() <= last.as_bytes() {
                return Verdict::Refuse(error(
                    StatusCode::CONFLICT,
                    "stream_seq_regression",
                    format!("Stream-Seq {s:?} is not above the last one, {last:?}"),
                ));
            }
        }
        if inflight.iter().any(|c| {
            c.stream_seq
                .as_deref()
                .is_some_and(|x| x.as_bytes() >= s.as_bytes())
        }) {
            return Verdict::Wait;
        }
    }
    Verdict::Go
}

/// The verdict of `meta`'s state on an append.
fn check(meta: &Meta, prod: Option<&Producer>, stream_seq: Option<&str>) -> Verdict {
    verdict(
        &meta.producers,
        meta.last_stream_seq.as_deref(),
        &meta.order.inflight,
        prod,
        stream_seq,
    )
}

/// An append of `claim` settled (`stored`: the journal holds it): its claim
/// is released, what it guards is recorded when stored, and the appends
/// waiting on it check again.
fn settle(meta: &mut Meta, claim: &Claim, prod: Option<&Producer>, stored: bool) {
    if let Some(i) = meta.order.inflight.iter().position(|c| c == claim) {
        meta.order.inflight.swap_remove(i);
    }
    if stored {
        record(meta, prod, claim.stream_seq.as_deref());
    }
    meta.order.settled.notify_waiters();
}

/// Records a stored append's producer tuple and `Stream-Seq` (each only
/// ever grows: a record of another node may already be newer).
fn record(meta: &mut Meta, prod: Option<&Producer>, stream_seq: Option<&str>) {
    if let Some(s) = stream_seq {
        if meta.last_stream_seq.as_deref() < Some(s) {
            meta.last_stream_seq = Some(s.to_owned());
        }
    }
    if let Some(p) = prod {
        let now = (p.epoch, p.seq);
        let cur = meta.producers.entry(p.id.clone()).or_insert(now);
        *cur = (*cur).max(now);
    }
}

/// The refusal of an append to a stream that was deleted.
fn deleted(ctx: &Ctx) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "stream_not_found",
        format!("the stream at {} was deleted", ctx.url_path),
    )
}

/// The answer to an append to a closed stream: a retry of the append that
/// closed it (or a repeated close-only, `close_only`) succeeds; anything
/// else is `409 stream_closed`. Both name the final tail.
async fn to_closed(
    ctx: &Ctx,
    meta: &mut Meta,
    prod: Option<&Producer>,
    close_only: bool,
) -> Response {
    let tail = match head(ctx, meta).await {
        Ok(h) => h,
        Err(r) => return r,
    };
    let retry =
        prod.is_some_and(|p| meta.closed_by.as_ref() == Some(&(p.id.clone(), p.epoch, p.seq)));
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
        StatusCode::CONFLICT,
        "stream_closed",
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
            StatusCode::BAD_REQUEST,
            "missing_content_type",
            "an append with a body needs a Content-Type",
        ));
    };
    if media_type(ct) != meta.media_type() {
        return Err(error(
            StatusCode::CONFLICT,
            "content_type_mismatch",
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
    let msgs = messages(meta, body)?;
    if msgs.is_empty() {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "empty_json_array",
            "an append of an empty JSON array appends nothing; send at least one message",
        ));
    }
    Ok(msgs)
}

/// Sets the producer headers of an answer: its epoch and `seq`.
fn prod_headers(r: &mut Response, p: &Producer, seq: u64) {
    set(r, "producer-epoch", p.epoch.to_string());
    set(r, "producer-seq", seq.to_string());
}

/// `POST {stream}`: appends the body (JSON mode: one message per element of
/// an array), closes with `Stream-Closed: true`, deduplicates idempotent
/// producers' retries and refuses `Stream-Seq` regressions.
///
/// The stream's lock is held for the checks only, never across the journal
/// commit ([`streams::Order`]): appends to one stream are in the journal at
/// once and share its commits; a close waits for those in flight and holds
/// later ones back; producer and `Stream-Seq` checks that depend on an
/// append in flight wait for it ([`verdict`]). The journal append, the
/// record and the release of the stream's order run to their end even if
/// the client goes away ([`Detach`]).
pub async fn append(ctx: Ctx, body: Body) -> Response {
    let stream = match lookup(&ctx).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let close = ctx.closes();
    let prod = match producer(&ctx) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let stream_seq = ctx.header("stream-seq").map(str::to_owned);
    let body = match body_bytes(&ctx, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if body.is_empty() && !close {
        return error(
            StatusCode::BAD_REQUEST,
            "empty_body",
            "an append needs a body (only a close, Stream-Closed: true, may be empty)",
        );
    }
    let gate = stream.lock().await.order.gate.clone();
    if close {
        let _alone = gate.write_owned().await;
        return closing(&ctx, &stream, prod, stream_seq, &body).await;
    }
    let shared = gate.read_owned().await;
    let claim = Claim {
        producer: prod.as_ref().map(|p| p.id.clone()),
        stream_seq: stream_seq.clone(),
    };
    let keyed = claim.producer.is_some() || claim.stream_seq.is_some();
    let (msgs, key, layout, epoch) = loop {
        let mut meta = stream.lock().await;
        if meta.deleted || meta.soft_deleted {
            return deleted(&ctx);
        }
        if meta.closed {
            return to_closed(&ctx, &mut meta, prod.as_ref(), false).await;
        }
        if let Err(r) = content_type(&ctx, &meta, &body) {
            return r;
        }
        match check(&meta, prod.as_ref(), stream_seq.as_deref()) {
            Verdict::Go => {}
            Verdict::Refuse(r) => return r,
            Verdict::Duplicate(last) => {
                let tail = match head(&ctx, &mut meta).await {
                    Ok(h) => h,
                    Err(r) => return r,
                };
                let mut r = empty(StatusCode::NO_CONTENT);
                set(&mut r, "stream-next-offset", offset(meta.epoch, tail));
                if let Some(p) = &prod {
                    prod_headers(&mut r, p, last);
                }
                return r;
            }
            Verdict::Wait => {
                let settled = meta.order.settled.clone();
                let notified = settled.notified();
                tokio::pin!(notified);
                // Registered before the lock is released: no settle is missed.
                notified.as_mut().enable();
                drop(meta);
                notified.await;
                continue;
            }
        }
        let msgs = match body_messages(&meta, &body) {
            Ok(m) => m,
            Err(r) => return r,
        };
        let key = append_key(meta.inc, prod.as_ref(), stream_seq.as_deref());
        if keyed {
            meta.order.inflight.push(claim.clone());
        }
        meta.touch(now_ms());
        break (msgs, key, meta.layout.clone(), meta.epoch);
    };
    let finish = Detach::new({
        let stream = stream.clone();
        let prod = prod.clone();
        async move {
            let _shared = shared;
            let published = publish_keyed(&ctx, msgs, key.as_deref()).await;
            if keyed {
                let mut meta = stream.lock().await;
                settle(&mut meta, &claim, prod.as_ref(), published.is_ok());
            }
            // A duplicate: the retry of an append stored before a crash
            // whose record was not journaled; the tail is the stream's, not
            // the original append's.
            let (tail, duplicate, epoch) = match published? {
                (_, true, _) => {
                    let mut meta = stream.lock().await;
                    (head(&ctx, &mut meta).await?, true, meta.epoch)
                }
                (last, false, e) if e == layout.epoch => (layout.virt(last), false, epoch),
                // Stored in a new epoch: the channel was purged meanwhile.
                (last, false, e) => {
                    let (tail, epoch) = appended_at(&mut *stream.lock().await, e, last);
                    (tail, false, epoch)
                }
            };
            // Producer state and Stream-Seq are journaled after the append
            // they guard and before the answer (docs/durable-streams.md,
            // "Metadata"); records of concurrent appends merge.
            if keyed {
                super::meta::save_current(&ctx.app, &ctx.channel, &stream)
                    .await
                    .map_err(|e| api_error(e.into()))?;
            }
            Ok::<_, Response>((tail, duplicate, epoch))
        }
    });
    let (tail, duplicate, epoch) = match finish.await {
        Ok(done) => done,
        Err(r) => return r,
    };
    let status = if prod.is_some() && !duplicate {
        StatusCode::OK
    } else {
        StatusCode::NO_CONTENT
    };
    let mut r = empty(status);
    set(&mut r, "stream-next-offset", offset(epoch, tail));
    if let Some(p) = &prod {
        prod_headers(&mut r, p, p.seq);
    }
    r
}

/// A future that runs to its end even when its caller is dropped: awaited
/// in place (no task of its own, no extra wake-up per append), and handed
/// to a task of its own if the request goes away before it ends, so a
/// client that closes mid-append cannot leave a claim behind, or let a
/// close pass an append still committing (the order gate is held to the
/// end).
struct Detach<T: Send + 'static>(Option<Pin<Box<dyn Future<Output = T> + Send>>>);

impl<T: Send + 'static> Detach<T> {
    fn new(f: impl Future<Output = T> + Send + 'static) -> Self {
        Detach(Some(Box::pin(f)))
    }
}

impl<T: Send + 'static> Future for Detach<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<T> {
        let Some(f) = self.0.as_mut() else {
            // Polled after it ended (a future is not): it never ends again.
            return std::task::Poll::Pending;
        };
        let out = f.as_mut().poll(cx);
        if out.is_ready() {
            self.0 = None;
        }
        out
    }
}

impl<T: Send + 'static> Drop for Detach<T> {
    /// Not ended: its own task finishes it (on the runtime dropping it; with
    /// no runtime, at shutdown's end, it is dropped).
    fn drop(&mut self) {
        if let (Some(f), Ok(rt)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            drop(rt.spawn(f));
        }
    }
}

/// An append with `Stream-Closed: true` (with or without a body), alone on
/// the stream (every append in flight has finished, later ones wait): the
/// checks, the append, then the closed state journaled, all under the
/// stream's lock.
async fn closing(
    ctx: &Ctx,
    stream: &Stream,
    prod: Option<Producer>,
    stream_seq: Option<String>,
    body: &[u8],
) -> Response {
    let mut meta = stream.lock().await;
    if meta.deleted || meta.soft_deleted {
        return deleted(ctx);
    }
    // 1. A closed stream takes nothing more (a retry of the closing append
    //    and a repeated close-only succeed).
    if meta.closed {
        return to_closed(ctx, &mut meta, prod.as_ref(), body.is_empty()).await;
    }
    // 2. The content type, when there is a body.
    if let Err(r) = content_type(ctx, &meta, body) {
        return r;
    }
    let mut tail = match head(ctx, &mut meta).await {
        Ok(h) => h,
        Err(r) => return r,
    };
    // 3. and 4.: the producer's epoch and seq, then Stream-Seq (alone on
    //    the stream: nothing is in flight, so nothing waits).
    match check(&meta, prod.as_ref(), stream_seq.as_deref()) {
        Verdict::Go | Verdict::Wait => {}
        Verdict::Refuse(r) => return r,
        Verdict::Duplicate(last) => {
            let mut r = empty(StatusCode::NO_CONTENT);
            set(&mut r, "stream-next-offset", offset(meta.epoch, tail));
            if let Some(p) = &prod {
                prod_headers(&mut r, p, last);
            }
            return r;
        }
    }
    let mut duplicate = false;
    if !body.is_empty() {
        let msgs = match body_messages(&meta, body) {
            Ok(m) => m,
            Err(r) => return r,
        };
        let key = append_key(meta.inc, prod.as_ref(), stream_seq.as_deref());
        match publish_keyed(ctx, msgs, key.as_deref()).await {
            // A duplicate: see `append`.
            Ok((_, true, _)) => duplicate = true,
            Ok((t, false, epoch)) => tail = appended_at(&mut meta, epoch, t).0,
            Err(r) => return r,
        }
    }
    record(&mut meta, prod.as_ref(), stream_seq.as_deref());
    meta.closed = true;
    meta.closed_by = prod.as_ref().map(|p| (p.id.clone(), p.epoch, p.seq));
    // Producer state, Stream-Seq and closure are journaled after the append
    // they guard and before the answer (docs/durable-streams.md, "Metadata").
    if let Err(e) = save(ctx, &mut meta).await {
        return api_error(e.into());
    }
    meta.announce(Life::Closed);
    meta.touch(now_ms());
    let status = if prod.is_some() && !body.is_empty() && !duplicate {
        StatusCode::OK
    } else {
        StatusCode::NO_CONTENT
    };
    let mut r = empty(status);
    set(&mut r, "stream-next-offset", offset(meta.epoch, tail));
    set(&mut r, "stream-closed", "true");
    if let Some(p) = &prod {
        prod_headers(&mut r, p, p.seq);
    }
    r
}

/// `DELETE {stream}`: forgets the stream (its events stay in the channel
/// until retention evicts them; a new stream at the path starts after
/// them), or soft-deletes it while forks use it (PROTOCOL.md 5.4): its URL
/// then answers 410 until the last fork is gone.
pub async fn delete(ctx: Ctx) -> Response {
    let stream = match lookup(&ctx).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    // Alone: after every append in flight (and its record), before any later one.
    let gate = stream.lock().await.order.gate.clone();
    let _alone = gate.write_owned().await;
    let mut meta = stream.lock().await;
    if meta.deleted || meta.soft_deleted {
        return error(
            StatusCode::NOT_FOUND,
            "stream_not_found",
            format!("the stream at {} was deleted", ctx.url_path),
        );
    }
    if fork::has_live_forks(&meta, now_ms()) {
        meta.soft_deleted = true;
        if let Err(e) = save(&ctx, &mut meta).await {
            return api_error(e.into());
        }
        // Live readers of the stream's URL end.
        meta.announce(Life::Gone);
        return empty(StatusCode::NO_CONTENT);
    }
    fork::forget(&ctx.app, &ctx.ds, &ctx.channel, &stream, meta).await;
    empty(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(id: &str, epoch: u64, seq: u64) -> Producer {
        Producer {
            id: id.to_owned(),
            epoch,
            seq,
        }
    }

    fn claim(producer: Option<&str>, stream_seq: Option<&str>) -> Claim {
        Claim {
            producer: producer.map(str::to_owned),
            stream_seq: stream_seq.map(str::to_owned),
        }
    }

    fn status(v: &Verdict) -> Option<u16> {
        match v {
            Verdict::Refuse(r) => Some(r.status().as_u16()),
            _ => None,
        }
    }

    #[test]
    fn a_producers_checks_wait_for_its_append_in_flight_and_no_other() {
        let committed: std::collections::HashMap<String, (u64, u64)> =
            [("a".to_owned(), (0, 4))].into_iter().collect();
        let inflight = [claim(Some("a"), None)];
        // Whatever `a` sends now depends on how its append in flight ends.
        for q in [p("a", 0, 5), p("a", 0, 6), p("a", 0, 4), p("a", 1, 0)] {
            let v = verdict(&committed, None, &inflight, Some(&q), None);
            assert!(matches!(v, Verdict::Wait), "{q:?}: {v:?}");
        }
        // Another producer goes on.
        let v = verdict(&committed, None, &inflight, Some(&p("b", 0, 0)), None);
        assert!(matches!(v, Verdict::Go), "{v:?}");
        // Nothing in flight: the committed state decides, exactly.
        let none: [Claim; 0] = [];
        let v = |q: Producer| verdict(&committed, None, &none, Some(&q), None);
        assert!(matches!(v(p("a", 0, 5)), Verdict::Go));
        assert!(matches!(v(p("a", 0, 3)), Verdict::Duplicate(4)));
        assert_eq!(status(&v(p("a", 0, 7))), Some(409), "a gap");
        assert_eq!(
            status(&v(p("a", 1, 2))),
            Some(400),
            "a new epoch starts at 0"
        );
        assert!(matches!(v(p("a", 1, 0)), Verdict::Go));
        let newer: std::collections::HashMap<String, (u64, u64)> =
            [("a".to_owned(), (2, 0))].into_iter().collect();
        let stale = verdict(&newer, None, &none, Some(&p("a", 1, 9)), None);
        assert_eq!(status(&stale), Some(403));
        assert_eq!(
            status(&verdict(
                &committed,
                None,
                &none,
                Some(&p("new", 0, 1)),
                None
            )),
            Some(409),
            "a new producer starts at 0"
        );
    }

    #[test]
    fn a_stream_seq_waits_only_when_an_append_in_flight_could_change_its_answer() {
        let none = std::collections::HashMap::new();
        let inflight = [claim(None, Some("05"))];
        // At or below the committed one: refused whatever is in flight.
        let v = verdict(&none, Some("03"), &inflight, None, Some("03"));
        assert_eq!(status(&v), Some(409));
        // Above the committed one but not above one in flight: waits.
        for s in ["04", "05"] {
            let v = verdict(&none, Some("03"), &inflight, None, Some(s));
            assert!(matches!(v, Verdict::Wait), "{s}: {v:?}");
        }
        // Above everything: goes on.
        let v = verdict(&none, Some("03"), &inflight, None, Some("06"));
        assert!(matches!(v, Verdict::Go), "{v:?}");
        // Byte-wise, not numeric.
        let v = verdict(&none, Some("9"), &[], None, Some("10"));
        assert_eq!(status(&v), Some(409));
    }

    #[tokio::test]
    async fn a_detached_future_dropped_before_its_end_still_ends() {
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let (done_tx, done) = tokio::sync::oneshot::channel::<&str>();
        let mut f = Detach::new(async move {
            let _ = wait.await;
            let _ = done_tx.send("ended");
        });
        // Polled once (it waits), then dropped, as a request whose client left.
        let polled = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(Pin::new(&mut f).poll(cx).is_pending())
        })
        .await;
        assert!(polled);
        drop(f);
        let _ = go.send(());
        let ended = tokio::time::timeout(std::time::Duration::from_secs(10), done).await;
        assert_eq!(ended.ok().and_then(Result::ok), Some("ended"));
        // Awaited whole, it gives its output.
        assert_eq!(Detach::new(async { 7 }).await, 7);
    }

    #[test]
    fn a_settled_append_releases_its_claim_and_records_only_when_stored() {
        let mut m = Meta {
            content_type: "application/json".into(),
            ttl_s: None,
            expires_at: None,
            deadline_ms: None,
            epoch: gapless_protocol::Epoch(1),
            layout: Arc::new(Layout::plain("c", gapless_protocol::Epoch(1), 0)),
            fork_of: None,
            parent: None,
            children: Vec::new(),
            soft_deleted: false,
            closed: false,
            closed_by: None,
            deleted: false,
            last_stream_seq: Some("2".into()),
            producers: Default::default(),
            closed_tx: streams::life(),
            inc: 1,
            rev: 0,
            rev_ms: 0,
            order: Default::default(),
        };
        let a = claim(Some("a"), Some("5"));
        let b = claim(None, Some("7"));
        m.order.inflight = vec![a.clone(), b.clone()];
        settle(&mut m, &b, None, false);
        assert_eq!(m.order.inflight, vec![a.clone()]);
        assert_eq!(
            m.last_stream_seq.as_deref(),
            Some("2"),
            "not stored: not recorded"
        );
        settle(&mut m, &a, Some(&p("a", 0, 0)), true);
        assert!(m.order.inflight.is_empty());
        assert_eq!(m.last_stream_seq.as_deref(), Some("5"));
        assert_eq!(m.producers.get("a"), Some(&(0, 0)));
        // A newer state (another node's record) is never moved back.
        m.producers.insert("a".into(), (0, 9));
        record(&mut m, Some(&p("a", 0, 3)), Some("4"));
        assert_eq!(m.producers.get("a"), Some(&(0, 9)));
        assert_eq!(m.last_stream_seq.as_deref(), Some("5"));
    }

    #[test]
    fn append_keys_name_the_incarnation_and_stay_short_visible_ascii() {
        let p = |id: &str| Producer {
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
