//! Creating a stream (PROTOCOL.md 5.1), or a fork with `Stream-Forked-From`
//! ([`super::fork`]). A stream exists once its metadata is in its channel's
//! journal: one `Journal::change` writes it with the body's messages, after
//! a fork has registered with its source.

use super::append::{appended_at, checked, messages, Caller};
use super::error::StreamError;
use super::fork::{self, ForkAsk, Plan};
use super::layout::{synced_tail, Layout};
use super::lifecycle::{end, Ended};
use super::{media_type, Meta, Streams};
use crate::App;
use bytes::Bytes;
use gapless_core::journal::now_ms;
use gapless_core::meta::{Ancestor, Change, ChannelMeta, Life, Outcome, Refusal};
use gapless_protocol::{Epoch, NewEvent};

/// What a creation asks, its headers read.
#[derive(Debug, Clone, Default)]
pub struct Create {
    /// `Content-Type`, trimmed (`None` when absent or blank: a plain
    /// stream is `application/octet-stream`, a fork its source's).
    pub content_type: Option<String>,
    /// `Stream-TTL`, in seconds.
    pub ttl_s: Option<u64>,
    /// `Stream-Expires-At` as given and in Unix milliseconds.
    pub expires_at: Option<(String, u64)>,
    /// `Stream-Closed: true`: created closed.
    pub closed: bool,
    /// The fork headers, when `Stream-Forked-From` is given.
    pub fork: Option<ForkAsk>,
    /// The first messages' body (may be empty).
    pub body: Bytes,
}

/// A creation's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    /// Made now (`201`), or the same stream was there (`200`).
    pub new: bool,
    /// The stream's content type.
    pub content_type: String,
    /// The epoch of its offsets.
    pub epoch: Epoch,
    /// Its tail (next offset).
    pub tail: u64,
    /// Whether it is closed.
    pub closed: bool,
}

/// The metadata and first events a creation asks for.
struct Planned {
    template: ChannelMeta,
    plan: Option<Plan>,
    events: Vec<NewEvent>,
}

/// Creates the stream on `channel`, or answers [`Created::new`] false when
/// it exists with the same content type, TTL or expiry, closure and fork.
///
/// # Errors
/// [`StreamError::Exists`] when another stream is there (or the path kept
/// changing under the request), the fork's refusals ([`fork::plan`]), the
/// body's ([`messages`]), the publish limits, the journal.
pub async fn create(
    app: &App,
    streams: &Streams,
    channel: &str,
    caller: Caller<'_>,
    ask: &Create,
) -> Result<Created, StreamError> {
    let planned = planned(app, streams, channel, caller, ask).await?;
    // At most a few rounds: a stream created, or ended, by another request
    // between the look and the creation is looked at again.
    for _ in 0..4 {
        if let Some(c) = existing(app, streams, channel, ask, &planned).await? {
            return Ok(c);
        }
        if let (Some(p), Some(f)) = (&planned.plan, &ask.fork) {
            register(app, channel, p, f).await?;
        }
        let change = Change::Create {
            meta: planned.template.clone(),
            events: planned.events.clone(),
        };
        let c = app.hub.change(channel, change).await?;
        let (Outcome::Created(appended), Some(stored)) = (c.outcome, c.meta) else {
            continue;
        };
        let mut meta = Meta::of(channel, stored, c.state);
        let (tail, epoch) = match appended {
            Some(a) => appended_at(&mut meta, a.epoch, a.last_seq),
            None => (meta.layout.origin, meta.epoch),
        };
        let content_type = meta.content_type().to_owned();
        streams.insert(channel, meta);
        return Ok(Created {
            new: true,
            content_type,
            epoch,
            tail,
            closed: ask.closed,
        });
    }
    Err(StreamError::Exists(
        "kept changing while it was created; try again".into(),
    ))
}

/// The stream's metadata to create, its fork plan and its first events.
async fn planned(
    app: &App,
    streams: &Streams,
    channel: &str,
    caller: Caller<'_>,
    ask: &Create,
) -> Result<Planned, StreamError> {
    let plan = match &ask.fork {
        None => None,
        Some(f) => {
            let ct = ask.content_type.as_deref();
            Some(fork::plan(app, streams, caller.grant, channel, f, ct).await?)
        }
    };
    let mut template = ChannelMeta::new(
        rand::random::<u64>() | 1,
        ask.content_type
            .clone()
            .unwrap_or_else(|| "application/octet-stream".to_owned()),
        now_ms(),
    );
    template.ttl_s = ask.ttl_s;
    template.expires_at = ask.expires_at.clone();
    if ask.closed {
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
    if !ask.body.is_empty() {
        msgs.extend(messages(&template.content_type, &ask.body)?);
    }
    let events = if msgs.is_empty() {
        Vec::new()
    } else {
        checked(app, caller, channel, msgs)?
    };
    Ok(Planned {
        template,
        plan,
        events,
    })
}

/// The layouts a fork of a stream laid out as `parent` inherits, nearest first.
fn ancestors(parent: &Layout) -> Vec<Ancestor> {
    let mut out = Vec::new();
    let mut l = Some(parent);
    while let Some(x) = l {
        out.push(Ancestor {
            channel: x.channel.to_string(),
            channel_epoch: x.epoch.0,
            base: x.base,
            origin: x.origin,
        });
        l = x.parent.as_deref();
    }
    out
}

/// The answer when a stream is at the path already: the stream when it is
/// the one asked for, else [`StreamError::Exists`]; `None` when there is
/// none (an expired one is ended first, as at any request).
async fn existing(
    app: &App,
    streams: &Streams,
    channel: &str,
    ask: &Create,
    planned: &Planned,
) -> Result<Option<Created>, StreamError> {
    let Some(s) = streams.load(&app.hub, channel).await? else {
        return Ok(None);
    };
    let mut old = s.lock().await;
    if old.deleted {
        return Ok(None);
    }
    if old.soft_deleted || old.expired(now_ms()) {
        drop(old);
        return match end(app, streams, channel, &s).await? {
            Ended::Forgotten => Ok(None),
            Ended::Soft => Err(StreamError::Exists(
                "was deleted but its forks still read it; the path cannot be used until they \
                 are gone"
                    .into(),
            )),
        };
    }
    let t = &planned.template;
    let same_fork = match (old.fork_of(), &t.layout.fork, &ask.fork) {
        (None, None, _) => true,
        (Some(a), Some(b), Some(f)) => {
            a.source == b.source && a.sub == b.sub && (f.offset.is_none() || a.at == b.at)
        }
        _ => false,
    };
    let same = old.media_type() == media_type(&t.content_type)
        && old.ttl_s() == t.ttl_s
        && old.expires_at().map(|e| e.1) == t.expires_at.as_ref().map(|e| e.1)
        && old.closed == ask.closed
        && same_fork;
    if !same {
        return Err(StreamError::Exists(
            "exists with another content type, TTL, expiry, closure or fork".into(),
        ));
    }
    let tail = synced_tail(app, &mut old).await?;
    Ok(Some(Created {
        new: false,
        content_type: old.content_type().to_owned(),
        epoch: old.epoch,
        tail,
        closed: old.closed,
    }))
}

/// Registers the fork on `channel` with its source (its reference count,
/// PROTOCOL.md 4.2) before the fork exists, so the source cannot be
/// forgotten under it.
async fn register(app: &App, channel: &str, p: &Plan, f: &ForkAsk) -> Result<(), StreamError> {
    let change = Change::Fork {
        incarnation: p.source_inc,
        fork: channel.to_owned(),
        add: true,
    };
    let c = app.hub.change(&p.fork_of.source, change).await?;
    match c.outcome {
        Outcome::Refused(Refusal::SoftDeleted) => Err(StreamError::SourceDeleted(f.from.clone())),
        Outcome::Refused(_) => Err(StreamError::SourceNotFound(f.from.clone())),
        _ => Ok(()),
    }
}
