//! A stream's life after its creation (PROTOCOL.md 4.2 and 5.4): ending a
//! deleted or expired stream (soft-deleted while forks read it, else
//! forgotten), and the cascade up a fork chain when the last fork of a
//! soft-deleted source goes ("Garbage collection cascades"). Each step is
//! one `Journal::change` of a channel's metadata (`gapless_core::meta`).
//! And finding a stream for a request: an expired one is ended at its next
//! request ([`lookup`]).

use super::error::StreamError;
use super::{Life, Stream, Streams};
use crate::App;
use gapless_core::journal::{now_ms, JournalError};
use gapless_core::meta::Change;
use std::collections::BTreeSet;

/// How [`end`] ended a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Soft-deleted: forks still read it.
    Soft,
    /// Forgotten: its metadata and events are gone.
    Forgotten,
}

/// The stream on `channel` for an append: the cached copy as it is when
/// there is one (an append needs only what never changes within an
/// incarnation, and what is final once true: the journal decides the
/// rest), so an append goes from its arrival to the journal's per-channel
/// order without waiting on a read; else as [`lookup`].
///
/// # Errors
/// As [`lookup`].
pub async fn lookup_for_append(
    app: &App,
    streams: &Streams,
    channel: &str,
) -> Result<Stream, StreamError> {
    if let Some(s) = streams.cached(channel) {
        let m = s.lock().await;
        if !m.deleted && !m.soft_deleted && !m.expired(now_ms()) {
            drop(m);
            return Ok(s);
        }
    }
    lookup(app, streams, channel).await
}

/// The stream on `channel`, unless it is absent, expired (an expired one
/// is ended here: forgotten, or soft-deleted while forks use it) or
/// soft-deleted (PROTOCOL.md 4.2).
///
/// # Errors
/// [`StreamError::NotFound`], [`StreamError::SoftDeleted`], or the
/// journal's failure.
pub async fn lookup(app: &App, streams: &Streams, channel: &str) -> Result<Stream, StreamError> {
    let Some(s) = streams.load(&app.hub, channel).await? else {
        return Err(StreamError::NotFound);
    };
    let m = s.lock().await;
    if m.deleted {
        return Err(StreamError::NotFound);
    }
    if m.soft_deleted {
        return Err(StreamError::SoftDeleted);
    }
    if m.expired(now_ms()) {
        drop(m);
        return match end(app, streams, channel, &s).await? {
            Ended::Soft => Err(StreamError::SoftDeleted),
            Ended::Forgotten => Err(StreamError::NotFound),
        };
    }
    drop(m);
    Ok(s)
}

/// Ends `stream` (on `channel`; deleted or expired): soft-deleted while a
/// live fork reads it, else forgotten with what it leaves behind.
///
/// # Errors
/// A journal failure; the stream may then still exist.
pub async fn end(
    app: &App,
    streams: &Streams,
    channel: &str,
    stream: &Stream,
) -> Result<Ended, JournalError> {
    let (inc, forks) = {
        let m = stream.lock().await;
        (m.inc, m.stored.forks.clone())
    };
    if has_live_forks(app, streams, channel, &forks).await? {
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
    forget(app, streams, channel, stream).await?;
    Ok(Ended::Forgotten)
}

/// Whether one of `forks` (channels named in `channel`'s metadata) is a
/// live fork of it: it exists, was forked from `channel`, and is not
/// expired unless itself kept for its own forks.
///
/// # Errors
/// A journal failure.
pub async fn has_live_forks(
    app: &App,
    streams: &Streams,
    channel: &str,
    forks: &BTreeSet<String>,
) -> Result<bool, JournalError> {
    let now = now_ms();
    for f in forks {
        let Some(s) = streams.load(&app.hub, f).await? else {
            continue;
        };
        let m = s.lock().await;
        let of_this = m.fork_of().is_some_and(|o| o.source == channel);
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
async fn forget(
    app: &App,
    streams: &Streams,
    channel: &str,
    stream: &Stream,
) -> Result<(), JournalError> {
    let mut ch = channel.to_owned();
    let mut s = stream.clone();
    loop {
        let (inc, source) = {
            let m = s.lock().await;
            (m.inc, m.fork_of().map(|f| f.source.clone()))
        };
        purge_events(app, &ch).await;
        app.hub
            .change(&ch, Change::Delete { incarnation: inc })
            .await?;
        streams.forget(&ch, &s).await;
        let Some(src) = source else {
            return Ok(());
        };
        let Some(src_stream) = streams.load(&app.hub, &src).await? else {
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
        if !stored.soft_deleted || has_live_forks(app, streams, &src, &stored.forks).await? {
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
