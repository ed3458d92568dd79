//! A round of group commit, after the writer has written its frames: make
//! them durable, then complete each commit.
//!
//! The writer (`writer.rs`) decides a batch of requests and writes it as
//! one WAL frame ([`Written`]); then [`Round::finish`] calls `fdatasync`
//! once on the files written (under [`Durability::Sync`]) and completes each
//! commit in order: its events (and metadata) join the readers' overlay, the
//! sink is told (`committed`, then `meta_changed` for a change),
//! each publisher gets its reply, and its records go to the checkpointer. So
//! a publisher is answered only once its event is on disk. While the
//! `fdatasync` runs, new requests gather in the inbox: the next round takes
//! them all.
//!
//! Under [`Durability::Async`] commits are completed as soon as they are
//! written, and the files are synced once the oldest unsynced commit is about
//! a second old ([`Round::flush`]), after a round or when the writer idles,
//! so a writer that never idles still syncs.
//!
//! A failed `fdatasync` fails every commit of the round (`Sync`); the writer
//! then drops the chain at once: it applies what was acknowledged to the
//! tables and starts a new chain after it (nothing after a failed frame is
//! ever acknowledged, and no `fdatasync` is retried on the same frames).

use crate::apply::Notice;
use crate::checkpoint::Checkpointer;
use crate::options::Durability;
use crate::overlay::{self, Overlay};
use crate::request::{Done, Pending};
use crate::wal;
use gapless_core::{ChannelState, CommitSink, JournalError};
use std::fs::File;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Under `Durability::Async`, the longest a completed commit stays non-durable.
pub(crate) const ASYNC_FLUSH: Duration = Duration::from_secs(1);

/// A group commit whose frame is written (or that wrote none: only
/// duplicates), waiting to be durable and completed.
pub(crate) struct Written {
    /// Its frame's lsn (0 with no frame).
    pub lsn: u64,
    /// The WAL file its frame is in (`None`: no frame).
    pub file: Option<usize>,
    /// Its records, for the checkpointer (empty with no frame).
    pub records: Vec<u8>,
    /// What the sink is told, in order.
    pub notices: Vec<Notice>,
    /// Each request's reply and result, in order (`None`: lost).
    pub replies: Vec<(Pending, Option<Done>)>,
}

/// What completing commits takes, and the state of the files' syncs.
pub(crate) struct Round {
    pub files: [Arc<File>; 2],
    pub durability: Durability,
    pub overlay: Arc<Overlay>,
    pub sink: Arc<dyn CommitSink>,
    pub checkpointer: Arc<Checkpointer>,
    /// Commits written since the last round.
    pub written: Vec<Written>,
    /// When the round's first frame was written (its commit time starts).
    pub started: Option<Instant>,
    /// `gapless_journal_commit_seconds`, looked up once.
    commit_seconds: metrics::Histogram,
    /// Async: files written since their last sync, and since when.
    dirty: [bool; 2],
    unsynced_since: Option<Instant>,
    /// Async: the file holding the oldest unsynced frame (synced first).
    oldest_dirty: usize,
    /// Test hook: fail the next `fdatasync`.
    #[cfg(test)]
    pub fail_next_sync: Arc<std::sync::atomic::AtomicBool>,
    /// Test counter: successful `Async` flushes.
    #[cfg(test)]
    pub flushes: Arc<std::sync::atomic::AtomicU64>,
    /// Test record: the files synced, in order.
    #[cfg(test)]
    pub synced: parking_lot::Mutex<Vec<usize>>,
}

impl Round {
    /// A round over `files`.
    pub(crate) fn new(
        files: [Arc<File>; 2],
        durability: Durability,
        overlay: Arc<Overlay>,
        sink: Arc<dyn CommitSink>,
        checkpointer: Arc<Checkpointer>,
    ) -> Self {
        Round {
            files,
            durability,
            overlay,
            sink,
            checkpointer,
            written: Vec::new(),
            started: None,
            commit_seconds: metrics::histogram!("gapless_journal_commit_seconds"),
            dirty: [false, false],
            unsynced_since: None,
            oldest_dirty: 0,
            #[cfg(test)]
            fail_next_sync: Arc::default(),
            #[cfg(test)]
            flushes: Arc::default(),
            #[cfg(test)]
            synced: parking_lot::Mutex::default(),
        }
    }

    /// Makes the commits written since the last round durable (`Sync`) and
    /// completes them. On a failed `fdatasync`, every one of them fails and
    /// the error is returned (the writer must recover).
    pub(crate) fn finish(&mut self) -> Result<(), JournalError> {
        if self.written.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.written);
        let mut files = [false, false];
        // The file of the round's oldest frame.
        let mut oldest = None;
        for w in &batch {
            if let Some(f) = w.file {
                files[f] = true;
                oldest.get_or_insert(f);
            }
        }
        let started = self.started.take();
        if self.durability == Durability::Sync && files.contains(&true) {
            if let Err(e) = self.sync(files, oldest.unwrap_or(0)) {
                tracing::error!("journal commit failed: {e}");
                fail(batch, &e);
                return Err(e);
            }
        } else if files.contains(&true) {
            for (d, f) in self.dirty.iter_mut().zip(files) {
                *d |= f;
            }
            if self.unsynced_since.is_none() {
                self.unsynced_since = Some(Instant::now());
                self.oldest_dirty = oldest.unwrap_or(0);
            }
        }
        if let Some(started) = started {
            // From the frame's write to its durability (`Sync`) or its
            // write alone (`Async`).
            self.commit_seconds.record(started.elapsed());
        }
        self.complete(batch);
        Ok(())
    }

    /// Under `Async`: when the files must be synced (`None`: nothing unsynced).
    pub(crate) fn flush_due(&self) -> Option<Instant> {
        self.unsynced_since.map(|since| since + ASYNC_FLUSH)
    }

    /// Under `Async`: syncs what was written since the last sync.
    ///
    /// # Errors
    /// The failed `fdatasync`'s error. It is never retried on the same
    /// frames: after a failed `fdatasync` Linux may mark the pages clean
    /// without writing them, so a second call can report success for data
    /// that is not on disk ("fsyncgate"). The writer then drops the chain
    /// instead: those commits (acknowledged, and handed to the
    /// checkpointer) are applied to the tables in a durable redb
    /// transaction, and a new chain starts after them (`writer.rs`).
    pub(crate) fn flush(&mut self) -> Result<(), JournalError> {
        if self.unsynced_since.is_none() {
            return Ok(());
        }
        let result = self.sync(self.dirty, self.oldest_dirty);
        // Synced, or never to be synced again (see above).
        self.dirty = [false, false];
        self.unsynced_since = None;
        match result {
            Ok(()) => {
                #[cfg(test)]
                self.flushes
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            }
            Err(e) => {
                tracing::error!(
                    "journal durable commit failed: {e}; applying the acknowledged commits to \
                     the tables and starting a new write-ahead log chain"
                );
                Err(e)
            }
        }
    }

    /// `fdatasync`s the files marked in `which`, `first` (the one holding
    /// the oldest frames) first: a crash between the two syncs then loses
    /// the newest frames only, not a stretch in the middle of the log
    /// (`wal::Log::after`).
    fn sync(&self, which: [bool; 2], first: usize) -> Result<(), JournalError> {
        #[cfg(test)]
        if self
            .fail_next_sync
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return Err(JournalError::Storage("injected fdatasync failure".into()));
        }
        for i in [first, 1 - first] {
            if which[i] {
                #[cfg(test)]
                self.synced.lock().push(i);
                self.files[i]
                    .sync_data()
                    .map_err(|e| wal::sync_error(i, &e))?;
            }
        }
        Ok(())
    }

    /// Completes durable commits, in order: overlay, sink, replies,
    /// checkpointer.
    fn complete(&self, batch: Vec<Written>) {
        {
            let mut view = self.overlay.write();
            for w in &batch {
                for notice in &w.notices {
                    match notice {
                        Notice::Committed {
                            channel,
                            id,
                            state,
                            events,
                        } => overlay::add(&mut view.tails, channel, *id, *state, events),
                        Notice::Meta { channel, meta } => {
                            overlay::set_meta(&mut view.metas, channel, w.lsn, meta.clone());
                        }
                        Notice::Evicted { .. } => {}
                    }
                }
            }
        }
        for w in &batch {
            for notice in &w.notices {
                notify(&*self.sink, notice);
            }
        }
        let mut chunks = Vec::new();
        for w in batch {
            for (pending, result) in w.replies {
                reply(pending, result.ok_or_else(lost));
            }
            if w.file.is_some() {
                chunks.push((w.lsn, w.records));
            }
        }
        self.checkpointer.push(chunks);
    }
}

fn lost() -> JournalError {
    JournalError::Storage("journal writer lost an append result".to_owned())
}

/// Sends `result` to a request's reply: an append's gets its
/// [`Done::Appended`] ([`Done::ChannelClosed`] as
/// [`JournalError::ChannelClosed`]), a change's its [`Done::Changed`]; any
/// other pairing is a lost result (an eviction's gets `()`; a purge never
/// has an append's result).
pub(crate) fn reply(pending: Pending, result: Result<Done, JournalError>) {
    match pending {
        Pending::Append(reply) => {
            let _ = reply.send(result.and_then(|done| match done {
                Done::Appended(a) => Ok(a),
                Done::ChannelClosed => Err(JournalError::ChannelClosed),
                Done::Changed(_) => Err(lost()),
            }));
        }
        Pending::Change(reply) => {
            let _ = reply.send(result.and_then(|done| match done {
                Done::Changed(c) => Ok(*c),
                Done::ChannelClosed => Err(JournalError::ChannelClosed),
                Done::Appended(_) => Err(lost()),
            }));
        }
        Pending::Evict(reply) => {
            let _ = reply.send(result.map(|_| ()));
        }
        Pending::Purge(reply) => {
            let _ = reply.send(result.and_then(|_| Err(lost())));
        }
    }
}

/// Sends an eviction's result to a request's reply.
pub(crate) fn reply_unit(pending: Pending, result: Result<(), JournalError>) {
    match pending {
        Pending::Evict(reply) => {
            let _ = reply.send(result);
        }
        Pending::Append(reply) => {
            let _ = reply.send(result.and_then(|()| Err(lost())));
        }
        Pending::Change(reply) => {
            let _ = reply.send(result.and_then(|()| Err(lost())));
        }
        Pending::Purge(reply) => {
            let _ = reply.send(result.and_then(|()| Err(lost())));
        }
    }
}

/// Sends a purge's result to a request's reply.
pub(crate) fn reply_state(pending: Pending, result: Result<ChannelState, JournalError>) {
    match pending {
        Pending::Purge(reply) => {
            let _ = reply.send(result);
        }
        Pending::Append(reply) => {
            let _ = reply.send(result.and_then(|_| Err(lost())));
        }
        Pending::Change(reply) => {
            let _ = reply.send(result.and_then(|_| Err(lost())));
        }
        Pending::Evict(reply) => {
            let _ = reply.send(result.and_then(|_| Err(lost())));
        }
    }
}

/// Fails every request of `batch` with `e`.
pub(crate) fn fail(batch: Vec<Written>, e: &JournalError) {
    for w in batch {
        for (pending, _) in w.replies {
            reply(pending, Err(copy(e)));
        }
    }
}

/// `e` for another request (a full disk stays `Full`).
pub(crate) fn copy(e: &JournalError) -> JournalError {
    match e {
        JournalError::Full(msg) => JournalError::Full(msg.clone()),
        JournalError::Storage(msg) => JournalError::Storage(msg.clone()),
        other => JournalError::Storage(other.to_string()),
    }
}

/// Tells the sink about one committed operation. A panicking sink is
/// logged, not allowed to stop the writer.
pub(crate) fn notify(sink: &dyn CommitSink, notice: &Notice) {
    let outcome = catch_unwind(AssertUnwindSafe(|| match notice {
        Notice::Committed {
            channel,
            state,
            events,
            ..
        } => sink.committed(channel, *state, events),
        Notice::Evicted { channel, state } => sink.evicted(channel, *state),
        Notice::Meta { channel, .. } => sink.meta_changed(channel),
    }));
    if outcome.is_err() {
        tracing::error!("journal commit sink panicked");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tables::storage;

    /// Async: the file holding the older unsynced frames is synced first,
    /// whichever index it has.
    #[test]
    fn a_flush_syncs_the_file_with_the_older_frames_first() -> Result<(), JournalError> {
        let dir = tempfile::tempdir().map_err(storage)?;
        let db = Arc::new(redb::Database::create(dir.path().join("j.redb")).map_err(storage)?);
        let overlay = Arc::new(Overlay::default());
        let (checkpointer, thread) =
            crate::checkpoint::spawn(db, overlay.clone(), 0, 1 << 20).map_err(storage)?;
        let wal = wal::Wal::open(dir.path(), 0, 1)?;
        let mut round = Round::new(
            wal.files.clone(),
            Durability::Async,
            overlay,
            Arc::new(gapless_core::journal::NoSink),
            checkpointer.clone(),
        );
        let written = |lsn, file| Written {
            lsn,
            file: Some(file),
            records: Vec::new(),
            notices: Vec::new(),
            replies: Vec::new(),
        };
        // Frame 1 in file 1, then frame 2 in file 0 (the writer moved on).
        round.written.push(written(1, 1));
        round.finish()?;
        round.written.push(written(2, 0));
        round.finish()?;
        round.flush()?;
        assert_eq!(*round.synced.lock(), [1, 0]);
        checkpointer.stop();
        thread
            .join()
            .map_err(|_| storage("checkpointer panicked"))?;
        Ok(())
    }
}
