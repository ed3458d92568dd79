//! Durable Streams streams as the product sees them, over the journal's
//! channel metadata (`gapless_core::meta`): the streams this server serves
//! now, a bounded cache of each stream's
//! metadata, read from its channel's journal when the stream is first
//! touched (`gapless_core::meta`; docs/durable-streams.md, "Metadata").
//!
//! The journal holds the truth: a stream's content type, closure, expiry,
//! layout, producers and `Stream-Seq` live beside its channel's events and
//! change only through `Journal::change`, which decides each append's
//! producer and `Stream-Seq` checks atomically with it. What a node keeps
//! here is a copy of the parts reads need (content type, closure, layout),
//! refreshed when the journal says the metadata changed
//! ([`Streams::changed`], from `CommitSink::meta_changed`), plus what is the
//! node's own: the sliding TTL's deadline and the watch live readers wait on.

pub use error::StreamError;
use gapless_core::journal::{now_ms, ChannelState, JournalError};
use gapless_core::meta::{ChannelMeta, ForkOrigin};
use gapless_protocol::Epoch;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::watch;

pub mod append;
pub mod create;
pub mod error;
pub mod fork;
pub mod layout;
pub mod lifecycle;
pub mod names;
pub mod upgrade;

/// Most streams a node keeps in its cache; past it, streams nobody is using
/// right now are dropped (and read again from the journal when next used).
pub const CACHED_STREAMS: usize = 65_536;

/// One stream's metadata as this node holds it. Guarded by its own async
/// lock, held only while it is read or changed, never across a journal
/// commit (the journal orders a stream's changes).
#[derive(Debug)]
pub struct Meta {
    /// When the stream expires (Unix ms): the earlier of the TTL's deadline
    /// (refreshed by reads and writes on this node) and
    /// [`Meta::expires_at`].
    pub deadline_ms: Option<u64>,
    /// The epoch of the stream's offsets: its channel's journal epoch at
    /// creation (a fork's is its source's), or after a purge the channel's
    /// new one ([`Meta::follow_epoch`]).
    pub epoch: Epoch,
    /// Where the stream's messages are ([`layout::Layout`]).
    pub layout: Arc<layout::Layout>,
    /// Deleted (or expired) while forks still use it: its URL answers 410
    /// and cannot be created again until the last fork is gone.
    pub soft_deleted: bool,
    /// Whether the stream is closed.
    pub closed: bool,
    /// Whether the stream was forgotten (deleted, expired, or its
    /// metadata is gone from the journal): live readers holding it end.
    pub deleted: bool,
    /// How far along its life the stream is, as announced ([`Meta::announce`]).
    life: Life,
    /// The watch of the stream's live readers ([`Meta::watch`]), made for
    /// the first one (about 450 bytes, so a stream no live reader has
    /// followed since it was cached has none): bumped on closure and
    /// deletion, so readers waiting at the tail wake up and know which
    /// without the lock. Dropped with the copy, which ends them too.
    watch: std::sync::OnceLock<watch::Sender<Life>>,
    /// The stream's incarnation ([`ChannelMeta::incarnation`]): part of
    /// every change's guard and of its appends' idempotency keys.
    pub inc: u64,
    /// The journal's metadata as last read or written here (the content
    /// type, expiry and fork origin are read from it: [`Meta::content_type`]).
    pub stored: Arc<ChannelMeta>,
}

/// What a stream's watch ([`Meta::watch`]) tells its live readers; it
/// only moves forward.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Life {
    /// Open.
    #[default]
    Open,
    /// Closed: its tail is final.
    Closed,
    /// Deleted, expired or soft-deleted: its live readers end.
    Gone,
}

impl Meta {
    /// The copy of `stored`, the metadata of `channel` whose bounds are
    /// `state` now (a purge since creation is followed at once).
    pub fn of(channel: &str, stored: impl Into<Arc<ChannelMeta>>, state: ChannelState) -> Self {
        let stored: Arc<ChannelMeta> = stored.into();
        let l = &stored.layout;
        let mut parent: Option<Arc<layout::Layout>> = None;
        for a in l.inherited.iter().rev() {
            parent = Some(Arc::new(layout::Layout {
                channel: Arc::from(a.channel.as_str()),
                epoch: Epoch(a.channel_epoch),
                base: a.base,
                origin: a.origin,
                parent,
            }));
        }
        let layout = Arc::new(layout::Layout {
            channel: Arc::from(channel),
            epoch: Epoch(l.channel_epoch),
            base: l.base,
            origin: l.origin,
            parent,
        });
        let mut m = Meta {
            deadline_ms: None,
            epoch: Epoch(l.offset_epoch),
            layout,
            soft_deleted: stored.soft_deleted,
            closed: stored.is_closed(),
            deleted: false,
            life: Life::Open,
            watch: std::sync::OnceLock::new(),
            inc: stored.incarnation,
            stored,
        };
        m.follow_epoch(state.epoch);
        m.touch(now_ms());
        m.announce_state();
        m
    }

    /// Takes `stored`, a newer copy of the same incarnation: closure and
    /// soft deletion, announced to live readers.
    pub fn refresh(&mut self, stored: impl Into<Arc<ChannelMeta>>) {
        let stored: Arc<ChannelMeta> = stored.into();
        self.closed |= stored.is_closed();
        self.soft_deleted |= stored.soft_deleted;
        self.stored = stored;
        self.announce_state();
    }

    /// Announces what the flags say.
    fn announce_state(&mut self) {
        if self.deleted || self.soft_deleted {
            self.announce(Life::Gone);
        } else if self.closed {
            self.announce(Life::Closed);
        }
    }

    /// Tells the stream's live readers that it is now `life` (or further
    /// along), waking every one of them.
    pub fn announce(&mut self, life: Life) {
        if life <= self.life {
            return;
        }
        self.life = life;
        if let Some(tx) = self.watch.get() {
            tx.send_replace(life);
        }
    }

    /// A live reader's watch of the stream's life: it says where the
    /// stream is now, and changes at each [`Meta::announce`] after; it
    /// ends (`changed` fails) when the stream's copy is dropped.
    pub fn watch(&self) -> watch::Receiver<Life> {
        self.watch
            .get_or_init(|| watch::Sender::new(self.life))
            .subscribe()
    }

    /// Whether a live reader follows the stream now.
    pub fn watched(&self) -> bool {
        self.watch.get().is_some_and(|tx| tx.receiver_count() > 0)
    }

    /// The content type as created (compared case-insensitively, without
    /// parameters).
    pub fn content_type(&self) -> &str {
        &self.stored.content_type
    }

    /// The sliding time-to-live, in seconds.
    pub fn ttl_s(&self) -> Option<u64> {
        self.stored.ttl_s
    }

    /// The absolute expiry as given (RFC 3339) and in Unix milliseconds.
    pub fn expires_at(&self) -> Option<&(String, u64)> {
        self.stored.expires_at.as_ref()
    }

    /// What a fork was forked from (`None` for a plain stream).
    pub fn fork_of(&self) -> Option<&ForkOrigin> {
        self.stored.layout.fork.as_ref()
    }

    /// The bare media type: lower case, without parameters.
    pub fn media_type(&self) -> String {
        media_type(self.content_type())
    }

    /// Whether the stream is JSON mode (PROTOCOL.md 9.1).
    pub fn is_json(&self) -> bool {
        is_json(self.content_type())
    }

    /// Whether SSE carries the data as text (`text/*`, `application/json`)
    /// rather than base64.
    pub fn is_text(&self) -> bool {
        is_text(self.content_type())
    }

    /// Restarts the TTL window at `now_ms` (a read or write that reached the
    /// server; `HEAD` does not).
    pub fn touch(&mut self, now_ms: u64) {
        let ttl = self
            .ttl_s()
            .map(|t| now_ms.saturating_add(t.saturating_mul(1000)));
        let abs = self.expires_at().map(|e| e.1);
        self.deadline_ms = match (ttl, abs) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// Whether the stream has expired at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.deadline_ms.is_some_and(|d| now_ms >= d)
    }

    /// Follows a new journal epoch of the stream's own channel: `epoch` is
    /// the channel's epoch now. When it is not the one the stream's layout
    /// was made in, the channel's history was lost (a purge, `DELETE
    /// /v1/channels/{channel}`, or a journal that lost it): the stream
    /// becomes a plain stream of the whole new epoch (position 0 its start,
    /// offsets in the new epoch, a fork's inherited messages gone too), so
    /// an offset from before answers `410 offset_gone` and `-1` reads what
    /// came after. Its other metadata stays. Deterministic, so not
    /// journaled: the stored layout is rebased the same way on every read
    /// (docs/durable-streams.md, "Purge"). Returns whether the layout changed.
    pub fn follow_epoch(&mut self, epoch: Epoch) -> bool {
        if self.layout.epoch == epoch {
            return false;
        }
        self.layout = Arc::new(layout::Layout::plain(self.layout.channel.clone(), epoch, 0));
        self.epoch = epoch;
        true
    }
}

/// The bare media type of a `Content-Type` value: lower case, without parameters.
pub fn media_type(ct: &str) -> String {
    ct.split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Whether content type `ct` is JSON mode (PROTOCOL.md 9.1).
pub fn is_json(ct: &str) -> bool {
    media_type(ct) == "application/json"
}

/// Whether content type `ct` is text (`text/*`, `application/json`): its
/// appends must be UTF-8 and SSE carries it as text rather than base64.
pub fn is_text(ct: &str) -> bool {
    let m = media_type(ct);
    m.starts_with("text/") || m == "application/json"
}

/// One cached stream: its metadata behind an async lock, and how current
/// that copy is.
#[derive(Debug)]
pub struct Entry {
    /// The copy.
    meta: tokio::sync::Mutex<Meta>,
    /// Bumped each time the journal says the metadata changed.
    changes: AtomicU64,
    /// The value of `changes` the copy was last read at.
    read_at: AtomicU64,
}

impl Entry {
    fn new(meta: Meta) -> Self {
        Entry {
            meta: tokio::sync::Mutex::new(meta),
            changes: AtomicU64::new(0),
            read_at: AtomicU64::new(0),
        }
    }

    /// Locks the copy.
    pub async fn lock(&self) -> tokio::sync::MutexGuard<'_, Meta> {
        self.meta.lock().await
    }

    /// How many metadata changes the journal has reported for the stream.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Marks the copy current when the journal has reported exactly
    /// `expected` changes: the caller made the last of them and took its
    /// result into the copy (held locked), so no other change is missing.
    /// Any other count leaves it stale (read again at its next use).
    pub fn current_if(&self, expected: u64) {
        if self.changes.load(Ordering::Acquire) == expected {
            self.read_at.fetch_max(expected, Ordering::AcqRel);
        }
    }

    /// Whether the journal changed the metadata since the copy was read.
    fn stale(&self) -> bool {
        self.changes.load(Ordering::Acquire) != self.read_at.load(Ordering::Acquire)
    }
}

/// A stream's shared, locked metadata.
pub type Stream = Arc<Entry>;

/// The streams this node serves now, by channel (a bounded cache over the
/// journal: [`CACHED_STREAMS`]).
#[derive(Debug, Default)]
pub struct Streams {
    /// Keyed by the name its layout holds (one copy of it).
    map: Mutex<HashMap<Arc<str>, Stream>>,
}

impl Streams {
    /// The cached stream on `channel`, whether or not it is current.
    pub fn cached(&self, channel: &str) -> Option<Stream> {
        self.map.lock().get(channel).cloned()
    }

    /// The stream on `channel`, read from the journal when it is not cached
    /// or the journal changed it since (`None`: no stream there).
    ///
    /// # Errors
    /// [`JournalError`] when the journal cannot be read.
    pub async fn load(
        &self,
        hub: &gapless_core::hub::Hub,
        channel: &str,
    ) -> Result<Option<Stream>, JournalError> {
        let cached = self.cached(channel);
        if let Some(s) = &cached {
            if !s.stale() {
                return Ok(cached);
            }
        }
        let seen = cached
            .as_ref()
            .map_or(0, |s| s.changes.load(Ordering::Acquire));
        let (stored, state) = hub.meta(channel).await?;
        let Some(stored) = stored else {
            if let Some(s) = cached {
                self.forget(channel, &s).await;
            }
            return Ok(None);
        };
        if let Some(s) = cached {
            let mut m = s.lock().await;
            if !m.deleted && m.inc == stored.incarnation {
                m.follow_epoch(state.epoch);
                m.refresh(stored);
                drop(m);
                // Current unless the journal changed it again meanwhile.
                s.read_at.fetch_max(seen, Ordering::AcqRel);
                return Ok(Some(s));
            }
            drop(m);
            self.forget(channel, &s).await;
        }
        Ok(Some(self.insert(channel, Meta::of(channel, stored, state))))
    }

    /// Caches `meta` as the stream on `channel` (replacing any other), and
    /// returns it.
    pub fn insert(&self, channel: &str, meta: Meta) -> Stream {
        let key = if &*meta.layout.channel == channel {
            meta.layout.channel.clone()
        } else {
            Arc::from(channel)
        };
        let stream = Arc::new(Entry::new(meta));
        let mut map = self.map.lock();
        if map.len() >= CACHED_STREAMS && !map.contains_key(channel) {
            // Dropped: streams nobody holds now (read again when next used).
            map.retain(|_, s| Arc::strong_count(s) > 1);
        }
        map.insert(key, stream.clone());
        stream
    }

    /// The journal changed the metadata of `channel`: the copy is stale.
    /// Returns the cached stream when live readers wait on it (the caller
    /// then reads it again, so they learn of a close or a deletion).
    pub fn changed(&self, channel: &str) -> Option<Stream> {
        let s = self.cached(channel)?;
        s.changes.fetch_add(1, Ordering::AcqRel);
        let watched = s.meta.try_lock().map_or(true, |m| m.watched());
        watched.then_some(s)
    }

    /// The channels of the cached streams (the subscriptions' pattern
    /// matching: streams this node has served since it started).
    pub fn channels(&self) -> Vec<String> {
        self.map.lock().keys().map(|k| k.to_string()).collect()
    }

    /// Drops `stream` (on `channel`) from the cache, if it is still there.
    pub fn drop_cached(&self, channel: &str, stream: &Stream) {
        let mut map = self.map.lock();
        if map.get(channel).is_some_and(|s| Arc::ptr_eq(s, stream)) {
            map.remove(channel);
        }
    }

    /// Drops `stream` (on `channel`) from the cache and ends its live
    /// readers: its metadata is gone from the journal.
    pub async fn forget(&self, channel: &str, stream: &Stream) {
        self.drop_cached(channel, stream);
        let mut m = stream.lock().await;
        m.deleted = true;
        m.announce(Life::Gone);
    }
}
