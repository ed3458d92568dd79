//! A stream's life after its creation: finding it (an expired stream is
//! ended at its next request), `DELETE` (PROTOCOL.md 5.4), soft deletion
//! while forks read it, and the cascade up a fork chain when the last fork
//! of a soft-deleted source goes (PROTOCOL.md 4.2, "Garbage collection
//! cascades"). Each step is one `Journal::change` of a channel's metadata
//! (`gapless_core::meta`).

use super::streams::{Life, Stream};
use super::{api_error, empty, error, Ctx, Ds};
use crate::App;
use axum::http::StatusCode;
use axum::response::Response;
use gapless_core::journal::{now_ms, JournalError};
use gapless_core::meta::Change;
use std::collections::BTreeSet;

/// The stream on the context's channel, unless it is absent, expired (an
/// expired one is ended here: forgotten, or soft-deleted while forks use
/// it) or soft-deleted (410, PROTOCOL.md 4.2).
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
        return match end(&ctx.app, &ctx.ds, &ctx.channel, &s).await {
            Ok(Ended::Soft) => Err(gone()),
            Ok(Ended::Forgotten) => Err(not_found()),
            Err(e) => Err(api_error(e.into())),
        };
    }
    drop(m);
    Ok(s)
}

/// How [`end`] ended a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ended {
    /// Soft-deleted: forks still read it.
    Soft,
    /// Forgotten: its metadata and events are gone.
    Forgotten,
}

/// Ends `stream` (on `channel`; deleted or expired): soft-deleted while a
/// live fork reads it, else forgotten with what it leaves behind.
///
/// # Errors
/// A journal failure; the stream may then still exist.
pub(super) async fn end(
    app: &App,
    ds: &Ds,
    channel: &str,
    stream: &Stream,
) -> Result<Ended, JournalError> {
    let (inc, forks) = {
        let m = stream.lock().await;
        (m.inc, m.stored.forks.clone())
    };
    if has_live_forks(app, ds, channel, &forks).await? {
        let c = app
            .hub
            .change(channel, Change::SoftDelete { incarnation: inc })
            .await?;
        let mut m = stream.lock().await;
        m.soft_deleted = true;
        if let Some(stored) = c.meta {
            m.refresh(stored);
        }
        m.announce(Life::Gone);
        return Ok(Ended::Soft);
    }
    forget(app, ds, channel, stream).await?;
    Ok(Ended::Forgotten)
}

/// Whether one of `forks` (channels named in `channel`'s metadata) is a
/// live fork of it: it exists, was forked from `channel`, and is not
/// expired unless itself kept for its own forks.
///
/// # Errors
/// A journal failure.
pub(super) async fn has_live_forks(
    app: &App,
    ds: &Ds,
    channel: &str,
    forks: &BTreeSet<String>,
) -> Result<bool, JournalError> {
    let now = now_ms();
    for f in forks {
        let Some(s) = ds.streams.load(&app.hub, f).await? else {
            continue;
        };
        let m = s.lock().await;
        let of_this = m.fork_of.as_ref().is_some_and(|o| o.source == channel);
        if !m.deleted && of_this && (m.soft_deleted || !m.expired(now)) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Forgets `stream` on `channel`: its events are purged, its metadata
/// deleted, its live readers end; then its source forgets it as a fork, and
/// a source that is soft-deleted with no live fork left is forgotten too,
/// up the chain.
///
/// # Errors
/// A journal failure (the chain above is then left as it is).
async fn forget(app: &App, ds: &Ds, channel: &str, stream: &Stream) -> Result<(), JournalError> {
    let mut ch = channel.to_owned();
    let mut s = stream.clone();
    loop {
        let (inc, source) = {
            let m = s.lock().await;
            (m.inc, m.fork_of.as_ref().map(|f| f.source.clone()))
        };
        purge_events(app, &ch).await;
        app.hub
            .change(&ch, Change::Delete { incarnation: inc })
            .await?;
        ds.streams.forget(&ch, &s).await;
        let Some(src) = source else {
            return Ok(());
        };
        let Some(src_stream) = ds.streams.load(&app.hub, &src).await? else {
            return Ok(());
        };
        let src_inc = src_stream.lock().await.inc;
        let c = app
            .hub
            .change(
                &src,
                Change::Fork {
                    incarnation: src_inc,
                    fork: ch.clone(),
                    add: false,
                },
            )
            .await?;
        let Some(stored) = c.meta else {
            return Ok(());
        };
        if !stored.soft_deleted || has_live_forks(app, ds, &src, &stored.forks).await? {
            return Ok(());
        }
        ch = src;
        s = src_stream;
    }
}

/// Removes the events of a deleted stream's channel (a journal purge: a new
/// epoch, docs/durable-streams.md "Deletion"). A purge that fails is logged;
/// the stream is gone either way, and its events then stay until retention
/// evicts them (a new stream at the path starts after them).
async fn purge_events(app: &App, channel: &str) {
    if let Err(e) = app.hub.purge(channel).await {
        tracing::warn!(channel, error = %e, "a deleted Durable Streams stream's events were not purged; retention will evict them");
    }
}

/// `DELETE {stream}`: forgets the stream, or soft-deletes it while forks
/// use it (PROTOCOL.md 5.4): its URL then answers 410 until the last fork
/// is gone.
pub async fn delete(ctx: Ctx) -> Response {
    let stream = match lookup(&ctx).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    match end(&ctx.app, &ctx.ds, &ctx.channel, &stream).await {
        Ok(_) => empty(StatusCode::NO_CONTENT),
        Err(e) => api_error(e.into()),
    }
}
