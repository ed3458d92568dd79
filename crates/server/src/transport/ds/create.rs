//! `PUT {stream}`: creation (PROTOCOL.md 5.1), a fork with
//! `Stream-Forked-From` ([`super::fork`]). A stream exists once its
//! metadata is in its channel's journal: one `Journal::change` writes it
//! with the body's messages, after a fork has registered with its source.

use super::fork::{self, Plan};
use super::lifecycle::{end, Ended};
use super::names::offset;
use super::streams::{self, media_type, Meta};
use super::write::{appended_at, body_bytes, checked, head, messages};
use super::{api_error, empty, error, error_as, set, Ctx};
use axum::body::Body;
use axum::http::StatusCode;
use axum::response::Response;
use gapless_core::journal::now_ms;
use gapless_core::meta::{Ancestor, Change, ChannelMeta, Life, Outcome, Refusal};
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::NewEvent;

/// What a creation asks, read from its request.
struct Ask {
    /// The metadata to create (its layout completed by the journal).
    template: ChannelMeta,
    /// `Stream-Closed: true`.
    closed: bool,
    /// The fork, when `Stream-Forked-From` names one.
    plan: Option<Plan>,
    /// The first messages.
    events: Vec<NewEvent>,
}

/// `PUT {stream}`: creates the stream, or answers 200 when it exists with
/// the same content type, TTL or expiry, closure and fork (409 otherwise).
pub async fn create(ctx: Ctx, body: Body) -> Response {
    let ask = match read(&ctx, body).await {
        Ok(a) => a,
        Err(r) => return r,
    };
    // At most a few rounds: a stream created, or ended, by another request
    // between the look and the creation is looked at again.
    for _ in 0..4 {
        match existing(&ctx, &ask).await {
            Ok(Some(r)) => return r,
            Ok(None) => {}
            Err(r) => return r,
        }
        if let Some(p) = &ask.plan {
            if let Err(r) = register(&ctx, p).await {
                return r;
            }
        }
        let change = Change::Create {
            meta: ask.template.clone(),
            events: ask.events.clone(),
        };
        let c = match ctx.app.hub.change(&ctx.channel, change).await {
            Ok(c) => c,
            Err(e) => return api_error(e.into()),
        };
        let (Outcome::Created(appended), Some(stored)) = (c.outcome, c.meta) else {
            continue;
        };
        let mut meta = Meta::of(&ctx.channel, stored, c.state);
        let (tail, epoch) = match appended {
            Some(a) => appended_at(&mut meta, a.epoch, a.last_seq),
            None => (meta.layout.origin, meta.epoch),
        };
        let content_type = meta.content_type.clone();
        ctx.ds.streams.insert(&ctx.channel, meta);
        let mut r = empty(StatusCode::CREATED);
        let host = ctx.header("host").unwrap_or("localhost");
        set(&mut r, "location", format!("http://{host}{}", ctx.url_path));
        set(&mut r, "content-type", &content_type);
        set(&mut r, "stream-next-offset", offset(epoch, tail));
        if ask.closed {
            set(&mut r, "stream-closed", "true");
        }
        return r;
    }
    error(
        ErrorCode::StreamExists,
        format!(
            "the stream at {} kept changing while it was created; try again",
            ctx.url_path
        ),
    )
}

/// Reads and checks the request: headers, body, fork plan, limits.
async fn read(ctx: &Ctx, body: Body) -> Result<Ask, Response> {
    let forked_from = ctx.header("stream-forked-from").map(str::to_owned);
    if forked_from.is_none()
        && (ctx.headers.contains_key("stream-fork-offset")
            || ctx.headers.contains_key("stream-fork-sub-offset"))
    {
        return Err(error(
            ErrorCode::InvalidFork,
            "Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From",
        ));
    }
    let ct_given = ctx
        .header("content-type")
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty());
    let ttl = ctx
        .header("stream-ttl")
        .map(streams::parse_ttl)
        .transpose()
        .map_err(|m| error(ErrorCode::InvalidTtl, m))?;
    let expires_at = match ctx.header("stream-expires-at") {
        None => None,
        Some(v) => match gapless_protocol::time::parse_rfc3339(v.trim()) {
            Ok(ms) => Some((v.trim().to_owned(), ms)),
            Err(e) => {
                return Err(error(
                    ErrorCode::InvalidExpiresAt,
                    format!(
                        "Stream-Expires-At {v:?} is not an RFC 3339 timestamp \
                         (e.g. 2030-01-02T03:04:05Z): {e}"
                    ),
                ))
            }
        },
    };
    if ttl.is_some() && expires_at.is_some() {
        return Err(error(
            ErrorCode::InvalidRequest,
            "give Stream-TTL or Stream-Expires-At, not both",
        ));
    }
    let closed = ctx.closes();
    let body = body_bytes(ctx, body).await?;
    let plan = match &forked_from {
        None => None,
        Some(f) => Some(fork::plan(ctx, f, ct_given.as_deref()).await?),
    };
    let mut template = ChannelMeta::new(
        rand::random::<u64>() | 1,
        ct_given.unwrap_or_else(|| "application/octet-stream".to_owned()),
        now_ms(),
    );
    template.ttl_s = ttl;
    template.expires_at = expires_at;
    if closed {
        template.life = Life::Closed;
    }
    let mut msgs = Vec::new();
    if let Some(p) = &plan {
        // PROTOCOL.md 4.2: the source's type; its TTL or expiry unless the
        // fork gives its own; its offsets' epoch.
        template.content_type = p.content_type.clone();
        if template.ttl_s.is_none() && template.expires_at.is_none() {
            template.ttl_s = p.ttl_s;
            template.expires_at = p.expires_at.clone();
        }
        template.layout.offset_epoch = p.epoch.0;
        template.layout.origin = p.origin;
        template.layout.fork = Some(p.fork_of.clone());
        template.layout.inherited = ancestors(&p.parent);
        msgs.extend(p.prefix.clone());
    }
    if !body.is_empty() {
        msgs.extend(messages(&template.content_type, &body)?);
    }
    let events = if msgs.is_empty() {
        Vec::new()
    } else {
        checked(ctx, msgs)?
    };
    Ok(Ask {
        template,
        closed,
        plan,
        events,
    })
}

/// The layouts a fork of a stream laid out as `parent` inherits, nearest first.
fn ancestors(parent: &fork::Layout) -> Vec<Ancestor> {
    let mut out = Vec::new();
    let mut l = Some(parent);
    while let Some(x) = l {
        out.push(Ancestor {
            channel: x.channel.clone(),
            channel_epoch: x.epoch.0,
            base: x.base,
            origin: x.origin,
        });
        l = x.parent.as_deref();
    }
    out
}

/// The answer when a stream is at the path already: 200 when it is the one
/// asked for, else 409; `None` when there is none (an expired one is ended
/// first, as at any request).
async fn existing(ctx: &Ctx, ask: &Ask) -> Result<Option<Response>, Response> {
    let Some(s) = ctx
        .ds
        .streams
        .load(&ctx.app.hub, &ctx.channel)
        .await
        .map_err(|e| api_error(e.into()))?
    else {
        return Ok(None);
    };
    let mut old = s.lock().await;
    if old.deleted {
        return Ok(None);
    }
    if old.soft_deleted || old.expired(now_ms()) {
        drop(old);
        return match end(&ctx.app, &ctx.ds.streams, &ctx.channel, &s).await {
            Ok(Ended::Forgotten) => Ok(None),
            Ok(Ended::Soft) => Err(error(
                ErrorCode::StreamExists,
                format!(
                    "the stream at {} was deleted but its forks still read it; the path \
                     cannot be used until they are gone",
                    ctx.url_path
                ),
            )),
            Err(e) => Err(api_error(e.into())),
        };
    }
    let t = &ask.template;
    let same_fork = match (&old.fork_of, &t.layout.fork, &ask.plan) {
        (None, None, _) => true,
        (Some(a), Some(b), Some(p)) => {
            a.source == b.source && a.sub == b.sub && (!p.offset_given || a.at == b.at)
        }
        _ => false,
    };
    let same = media_type(&old.content_type) == media_type(&t.content_type)
        && old.ttl_s == t.ttl_s
        && old.expires_at.as_ref().map(|e| e.1) == t.expires_at.as_ref().map(|e| e.1)
        && old.closed == ask.closed
        && same_fork;
    if !same {
        return Err(error(
            ErrorCode::StreamExists,
            format!(
                "a stream exists at {} with another content type, TTL, expiry, closure or fork",
                ctx.url_path
            ),
        ));
    }
    let tail = head(ctx, &mut old).await?;
    let mut r = empty(StatusCode::OK);
    set(&mut r, "content-type", &old.content_type);
    set(&mut r, "stream-next-offset", offset(old.epoch, tail));
    if old.closed {
        set(&mut r, "stream-closed", "true");
    }
    Ok(Some(r))
}

/// Registers the fork with its source (its reference count, PROTOCOL.md
/// 4.2) before the fork exists, so the source cannot be forgotten under it.
async fn register(ctx: &Ctx, p: &Plan) -> Result<(), Response> {
    let change = Change::Fork {
        incarnation: p.source_inc,
        fork: ctx.channel.clone(),
        add: true,
    };
    let c = ctx
        .app
        .hub
        .change(&p.fork_of.source, change)
        .await
        .map_err(|e| api_error(e.into()))?;
    match c.outcome {
        Outcome::Refused(Refusal::SoftDeleted) => Err(error_as(
            StatusCode::CONFLICT,
            ErrorCode::StreamDeleted,
            "the source stream was deleted and is kept only for its forks; it cannot be \
             forked again",
        )),
        Outcome::Refused(_) => Err(error(
            ErrorCode::StreamNotFound,
            "the source stream (Stream-Forked-From) does not exist",
        )),
        _ => Ok(()),
    }
}
