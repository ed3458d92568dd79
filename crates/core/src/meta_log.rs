//! Channel metadata over any journal's own appends: how the embedded store
//! and the Redis journal implement [`Journal::meta`] and
//! [`Journal::change`] today (the memory journal commits the metadata with
//! the events natively, under its lock).
//!
//! A channel's metadata is the newest event of its own metadata channel,
//! [`channel_of`] (`gapless/meta/<channel>`: `/` is outside the channel
//! alphabet, so no client can name it), whose retention keeps exactly its
//! newest event, forever ([`RETENTION`]). A change of one channel is decided
//! by [`crate::meta::decide`] under a per-channel lock of this process (fair:
//! changes submitted in order are decided in that order, so a producer's
//! pipelined seqs all land), then written as two appends: the events (with
//! the change's idempotency key), then the new metadata (`null` once
//! deleted). A crash between them leaves the events stored with the
//! metadata one change behind: the retry of such an append passes the
//! checks again and its idempotency key answers it as the duplicate it is,
//! stored once. Commits of a metadata channel are reported to the sink like
//! any commit, and the hub takes them as [`crate::CommitSink::meta_changed`]
//! of the channel they describe, on every node sharing the journal.
//!
//! What this does not give that a native implementation does: one write per
//! append (this makes two), and, between nodes of a cluster, decisions of
//! one channel serialized across nodes (each node serializes its own).

use crate::journal::{ChannelState, Journal, JournalError, Retention};
use crate::meta::{self, Change, Changed, ChannelMeta, Decision};
use gapless_protocol::{NewEvent, Payload};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// The prefix of metadata channels.
pub const PREFIX: &str = "gapless/meta/";

/// The retention of every metadata channel: its newest event, forever.
pub const RETENTION: Retention = Retention {
    max_events: 1,
    max_age_ms: 0,
    max_bytes: 0,
};

/// Most channels whose closure [`MetaLog`] remembers; past it the memory is
/// dropped and read again.
const REMEMBERED: usize = 100_000;

/// The metadata channel of `channel`.
pub fn channel_of(channel: &str) -> String {
    format!("{PREFIX}{channel}")
}

/// The channel a metadata channel describes (`None` for any other name).
pub fn described(meta_channel: &str) -> Option<&str> {
    meta_channel.strip_prefix(PREFIX)
}

/// A journal's append without the closed check ([`MetaLog::unless_closed`]):
/// what [`MetaLog::change`] appends with, under its lock.
#[async_trait::async_trait]
pub trait RawAppend: Journal {
    /// Appends as [`Journal::append`], whatever the channel's metadata says.
    ///
    /// # Errors
    /// As [`Journal::append`].
    async fn append_raw(
        &self,
        channel: &str,
        events: Vec<NewEvent>,
        idempotency_key: Option<&str>,
    ) -> Result<crate::journal::Appended, JournalError>;
}

/// Per-channel locks and what is known of channels' closure (see the module doc).
#[derive(Default)]
pub struct MetaLog {
    /// One fair lock per channel being changed (dropped when unused).
    locks: Mutex<HashMap<String, Arc<tokio::sync::RwLock<()>>>>,
    /// Whether a channel has metadata, for channels read or changed here: a
    /// plain append to one not known is checked once, to one known to have
    /// none not again.
    has_meta: Mutex<HashMap<String, bool>>,
}

impl MetaLog {
    fn lock_of(&self, channel: &str) -> Arc<tokio::sync::RwLock<()>> {
        let mut locks = self.locks.lock();
        locks.retain(|_, l| Arc::strong_count(l) > 1);
        locks.entry(channel.to_owned()).or_default().clone()
    }

    /// Whether a change of `channel` holds or waits for its lock now.
    fn changing(&self, channel: &str) -> bool {
        self.locks
            .lock()
            .get(channel)
            .is_some_and(|l| Arc::strong_count(l) > 1)
    }

    fn remember(&self, channel: &str, meta: Option<&ChannelMeta>) {
        let mut known = self.has_meta.lock();
        if known.len() >= REMEMBERED {
            known.clear();
        }
        known.insert(channel.to_owned(), meta.is_some());
    }

    /// The channel's metadata and bounds, read from `journal`.
    ///
    /// # Errors
    /// [`JournalError`] when the journal fails, or holds damaged metadata.
    pub async fn meta<J: Journal + ?Sized>(
        &self,
        journal: &J,
        channel: &str,
    ) -> Result<(Option<ChannelMeta>, ChannelState), JournalError> {
        let mc = channel_of(channel);
        let st = journal.state(&mc).await?;
        let meta = if st.head == 0 {
            None
        } else {
            let page = journal.read(&mc, st.head - 1, 1).await?;
            match page.events.last() {
                None => None,
                Some(e) if e.data.as_bytes() == b"null" => None,
                Some(e) => {
                    Some(ChannelMeta::decode(e.data.as_bytes()).map_err(JournalError::Storage)?)
                }
            }
        };
        self.remember(channel, meta.as_ref());
        Ok((meta, journal.state(channel).await?))
    }

    /// Decides and writes `change` (see the module doc).
    ///
    /// # Errors
    /// [`JournalError`] when the journal fails; the change may then be half
    /// written (its events without its metadata), which its retry completes.
    pub async fn change<J: RawAppend + ?Sized>(
        &self,
        journal: &J,
        channel: &str,
        change: Change,
    ) -> Result<Changed, JournalError> {
        let lock = self.lock_of(channel);
        let _alone = lock.write().await;
        let (current, state) = self.meta(journal, channel).await?;
        match meta::decide(current.as_ref(), state, change) {
            Decision::Nothing(outcome) => Ok(Changed {
                outcome,
                meta: current,
                state,
            }),
            Decision::Write {
                events,
                key,
                meta: next,
                outcome,
            } => {
                let appended = if events.is_empty() {
                    None
                } else {
                    Some(journal.append_raw(channel, events, key.as_deref()).await?)
                };
                let record = next
                    .as_ref()
                    .map_or_else(|| "null".to_owned(), ChannelMeta::encode);
                let ev = NewEvent {
                    event_type: None,
                    data: Payload::Text(record),
                };
                journal
                    .append_raw(&channel_of(channel), vec![ev], None)
                    .await?;
                self.remember(channel, next.as_ref());
                Ok(Changed {
                    outcome: meta::with_appended(outcome, appended),
                    meta: next,
                    state: journal.state(channel).await?,
                })
            }
        }
    }

    /// Runs a plain append `append` of `channel` unless the channel is
    /// closed ([`JournalError::ChannelClosed`]); decided against changes of
    /// this process (they wait for each other). A metadata channel is never
    /// closed.
    ///
    /// # Errors
    /// [`JournalError::ChannelClosed`], or the journal's.
    pub async fn unless_closed<J, T, F>(
        &self,
        journal: &J,
        channel: &str,
        append: F,
    ) -> Result<T, JournalError>
    where
        J: Journal + ?Sized,
        F: std::future::Future<Output = Result<T, JournalError>>,
    {
        if channel.starts_with(PREFIX) {
            return append.await;
        }
        let known = self.has_meta.lock().get(channel).copied();
        match known {
            // Known to have no metadata, and not being changed: as is.
            Some(false) if !self.changing(channel) => append.await,
            _ => {
                let lock = self.lock_of(channel);
                let _shared = lock.read().await;
                let (meta, _) = self.meta(journal, channel).await?;
                if meta.is_some_and(|m| m.is_closed()) {
                    return Err(JournalError::ChannelClosed);
                }
                append.await
            }
        }
    }
}
