//! The group-commit writer: one thread owns every write transaction.
//!
//! Appends (and evictions) arrive over a channel. The writer takes everything
//! pending (up to a bound, see `request.rs`), applies it in one transaction,
//! commits once (one fsync for the whole batch under `Durability::Sync`), then
//! tells the sink about every operation in order, then replies to each. While a commit is in progress
//! the next batch queues up, so concurrent publishers share fsyncs.
//!
//! A commit writes its appends as one row of the `log` table; every
//! [`CHECKPOINT_BYTES`] of logged records, a commit instead applies them (and
//! its own appends) to the indexed tables and empties the log (see `log.rs`).
//! A batch with an age eviction due is always a checkpoint.
//!
//! If anything in a batch fails, the transaction is rolled back, every request
//! of the batch gets [`JournalError::Storage`], and before the next batch the
//! log is applied from disk and the channel cache reloaded, so no seq is
//! skipped or reused.

use crate::apply::{self, eviction_due, AppendCx, Ctx, Keys, Notice, Tables};
use crate::cache::Channels;
use crate::log::{self, CHECKPOINT_BYTES};
use crate::meta;
use crate::options::{Durability, StoreOptions};
use crate::overlay::{self, Overlay};
use crate::request::{Batch, Op, Pending, Request};
use crate::tables::{storage, LOG};
use gapless_core::{Appended, ChannelState, CommitSink, JournalError};
use gapless_protocol::Epoch;
use redb::Database;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Capacity the writer's record buffers keep after a checkpoint (they grow
/// with a batch, up to `MAX_BATCH_BYTES` and one request).
const KEPT_BUFFER_BYTES: usize = 1 << 20;

/// Under `Durability::Async`, the longest a commit stays non-durable.
const ASYNC_FLUSH: Duration = Duration::from_secs(1);

/// The writer thread's state.
pub(crate) struct Writer {
    db: Arc<Database>,
    rx: Receiver<Request>,
    sink: Arc<dyn CommitSink>,
    epoch: Epoch,
    options: StoreOptions,
    /// `None` after a failed batch, until recovered from disk.
    cache: Option<Channels>,
    /// What readers see beyond the tables (shared with them).
    overlay: Arc<Overlay>,
    /// Records committed to `log` but not yet applied to the tables.
    logged: Vec<u8>,
    /// Idempotency keys of `logged`.
    keys: Keys,
    /// Key of the next `log` row.
    next_log: u64,
    /// The current batch's records (reused).
    record: Vec<u8>,
    /// Logged bytes after which the next commit is a checkpoint.
    checkpoint_bytes: usize,
    /// When the oldest commit not yet durable was made (`Async` only).
    unsynced_since: Option<Instant>,
    /// Purged channels' epochs (shared with the readers, `purge.rs`).
    epochs: Arc<crate::purge::Epochs>,
    /// Test hook: fail the next commit after applying its batch.
    #[cfg(test)]
    fail_next_commit: Arc<std::sync::atomic::AtomicBool>,
}

impl Writer {
    /// A writer over `db`, fed by `rx`, starting from `cache`.
    pub(crate) fn new(
        db: Arc<Database>,
        rx: Receiver<Request>,
        sink: Arc<dyn CommitSink>,
        epoch: Epoch,
        options: StoreOptions,
        cache: Channels,
        overlay: Arc<Overlay>,
    ) -> Self {
        Writer {
            db,
            rx,
            sink,
            epoch,
            options,
            cache: Some(cache),
            overlay,
            logged: Vec::new(),
            keys: Keys::default(),
            next_log: 0,
            record: Vec::new(),
            checkpoint_bytes: CHECKPOINT_BYTES,
            unsynced_since: None,
            epochs: Arc::default(),
            #[cfg(test)]
            fail_next_commit: Arc::default(),
        }
    }

    /// Sets the logged bytes after which a commit is a checkpoint.
    pub(crate) fn checkpoint_every(mut self, bytes: usize) -> Self {
        self.checkpoint_bytes = bytes;
        self
    }

    /// Shares the purged channels' epochs with the readers.
    pub(crate) fn with_epochs(mut self, epochs: Arc<crate::purge::Epochs>) -> Self {
        self.epochs = epochs;
        self
    }

    /// Starts the writer thread. It stops on [`Request::Close`] or when every
    /// sender is gone, after a final durable commit either way.
    pub(crate) fn spawn(self) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("gapless-store-writer".into())
            .spawn(move || self.run())
    }

    fn run(mut self) {
        // A purge that ended the previous batch, run before the next one.
        let mut purge = None;
        while let Some(first) = purge.take().or_else(|| self.next_request()) {
            if let Request::Purge { channel, reply } = first {
                let _ = reply.send(self.purge(&channel));
                continue;
            }
            let mut batch = Batch::default();
            let mut close = batch.push(first);
            while close.is_none() && !batch.is_full() {
                match self.rx.try_recv() {
                    Ok(request @ Request::Purge { .. }) => {
                        purge = Some(request);
                        break;
                    }
                    Ok(request) => close = batch.push(request),
                    Err(_) => break,
                }
            }
            if !batch.ops.is_empty() {
                self.process(batch);
            }
            if let Some(reply) = close {
                let _ = reply.send(self.shutdown());
                return;
            }
        }
        // Every sender is gone (the journal was dropped without close()).
        if let Err(e) = self.shutdown() {
            tracing::error!("journal final commit failed: {e}");
        }
    }

    /// The next request, making pending `Async` commits durable when one is
    /// due while idle. `None` when every sender is gone.
    fn next_request(&mut self) -> Option<Request> {
        loop {
            let Some(since) = self.unsynced_since else {
                return self.rx.recv().ok();
            };
            let wait = (since + ASYNC_FLUSH).saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(wait) {
                Ok(request) => return Some(request),
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(e) = self.flush() {
                        tracing::error!("journal durable commit failed (retrying in 1 s): {e}");
                        self.unsynced_since = Some(Instant::now());
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// Applies a batch, then notifies the sink and replies.
    fn process(&mut self, batch: Batch) {
        let Batch { ops, pending, .. } = batch;
        match self.commit(ops) {
            Ok((results, notices)) => {
                for notice in notices {
                    self.notify(notice);
                }
                for (pending, result) in pending.into_iter().zip(results) {
                    match (pending, result) {
                        (Pending::Append(reply), Some(appended)) => {
                            let _ = reply.send(Ok(appended));
                        }
                        (Pending::Append(reply), None) => {
                            let msg = "journal writer lost an append result".to_owned();
                            let _ = reply.send(Err(JournalError::Storage(msg)));
                        }
                        (Pending::Evict(reply), _) => {
                            let _ = reply.send(Ok(()));
                        }
                    }
                }
            }
            Err(e) => {
                tracing::error!("journal commit failed: {e}");
                // Heads in the cache may have advanced past what is on disk.
                self.cache = None;
                for pending in pending {
                    let err = match &e {
                        JournalError::Full(msg) => JournalError::Full(msg.clone()),
                        JournalError::Storage(msg) => JournalError::Storage(msg.clone()),
                        other => JournalError::Storage(other.to_string()),
                    };
                    let _ = match pending {
                        Pending::Append(reply) => reply.send(Err(err)).is_ok(),
                        Pending::Evict(reply) => reply.send(Err(err)).is_ok(),
                    };
                }
            }
        }
    }

    /// Applies whatever `log` holds on disk to the tables and reloads the
    /// cache: the state after opening, or after a failed batch.
    fn recover(&mut self) -> Result<(), JournalError> {
        {
            let mut tails = self.overlay.write();
            log::recover(&self.db)?;
            tails.clear();
        }
        self.logged.clear();
        self.keys.pending.clear();
        self.next_log = 0;
        self.cache = Some(Channels::load(&self.db, &self.options.namespaces)?);
        Ok(())
    }

    /// Applies `ops` in one transaction and commits it. Returns each op's
    /// result (`Some` for appends) and the sink notices, in order.
    fn commit(
        &mut self,
        ops: Vec<Op>,
    ) -> Result<(Vec<Option<Appended>>, Vec<Notice>), JournalError> {
        if self.cache.is_none() {
            self.recover()?;
        }
        let Some(cache) = self.cache.as_mut() else {
            return Err(JournalError::Storage("journal cache not loaded".into()));
        };
        let mut cx = Ctx {
            epoch: self.epoch,
            cache,
        };
        let mut evict_due = false;
        let mut appends = false;
        for op in &ops {
            match op {
                Op::Append { .. } => appends = true,
                Op::Evict { now_ms } => evict_due |= eviction_due(&cx, *now_ms),
            }
        }
        if !appends && !evict_due {
            return Ok((ops.iter().map(|_| None).collect(), Vec::new()));
        }
        let checkpoint = evict_due || self.logged.len() >= self.checkpoint_bytes;
        let durable = match self.options.durability {
            Durability::Sync => true,
            Durability::Async => self
                .unsynced_since
                .is_some_and(|since| since.elapsed() >= ASYNC_FLUSH),
        };
        let mut txn = self.db.begin_write().map_err(storage)?;
        txn.set_durability(if durable {
            redb::Durability::Immediate
        } else {
            redb::Durability::None
        })
        .map_err(storage)?;
        let mut results = Vec::with_capacity(ops.len());
        let mut notices = Vec::new();
        let mut record = std::mem::take(&mut self.record);
        record.clear();
        let mut snapshot = None;
        {
            let mut tables = if checkpoint {
                let mut tables = Tables::open(&txn)?;
                log::apply_all(&mut tables, &self.logged)?;
                Some(tables)
            } else {
                None
            };
            let mut ax = AppendCx {
                db: &self.db,
                snapshot: &mut snapshot,
                keys: &mut self.keys,
                record: &mut record,
            };
            for op in ops {
                match op {
                    Op::Append {
                        channel,
                        events,
                        key,
                    } => {
                        let start = ax.record.len();
                        let (appended, notice) =
                            apply::append(&mut cx, &mut ax, &channel, events, key.as_deref())?;
                        if let Some(tables) = tables.as_mut() {
                            log::apply_all(tables, &ax.record[start..])?;
                        }
                        results.push(Some(appended));
                        notices.extend(notice);
                    }
                    Op::Evict { now_ms } => {
                        if let Some(tables) = tables.as_mut() {
                            notices.extend(tables.evict_expired(&mut cx, now_ms)?);
                        }
                        results.push(None);
                    }
                }
            }
            if let Some(tables) = tables.as_mut() {
                tables.finish()?;
            }
        }
        drop(snapshot);
        if notices.is_empty() {
            // Only duplicates, or nothing expired after all: nothing to commit.
            self.record = record;
            txn.abort().map_err(storage)?;
            return Ok((results, notices));
        }
        if checkpoint {
            log::clear(&txn)?;
        } else {
            let mut log = txn.open_table(LOG).map_err(storage)?;
            log.insert(self.next_log, record.as_slice())
                .map_err(storage)?;
        }
        #[cfg(test)]
        if self
            .fail_next_commit
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return Err(JournalError::Storage("injected commit failure".into()));
        }
        let started = std::time::Instant::now();
        if checkpoint {
            // Readers pair the overlay with a snapshot: both change together.
            let mut tails = self.overlay.write();
            txn.commit().map_err(storage)?;
            metrics::histogram!("gapless_journal_commit_seconds").record(started.elapsed());
            tails.clear();
            drop(tails);
            self.logged.clear();
            // A batch of large events grew these; an idle writer keeps no
            // more than a checkpoint's worth.
            self.logged
                .shrink_to(self.checkpoint_bytes.max(KEPT_BUFFER_BYTES));
            record.clear();
            record.shrink_to(KEPT_BUFFER_BYTES);
            self.keys.pending.clear();
            self.next_log = 0;
        } else {
            txn.commit().map_err(storage)?;
            metrics::histogram!("gapless_journal_commit_seconds").record(started.elapsed());
            {
                let mut tails = self.overlay.write();
                for notice in &notices {
                    if let Notice::Committed {
                        channel,
                        id,
                        state,
                        events,
                    } = notice
                    {
                        overlay::add(&mut tails, channel, *id, *state, events);
                    }
                }
            }
            self.logged.extend_from_slice(&record);
            self.next_log += 1;
        }
        self.record = record;
        if durable {
            self.unsynced_since = None;
        } else {
            self.unsynced_since.get_or_insert_with(Instant::now);
        }
        Ok((results, notices))
    }

    /// Purges `channel` (`purge.rs`) and tells the sink its new state.
    fn purge(&mut self, channel: &str) -> Result<ChannelState, JournalError> {
        if self.cache.is_none() {
            self.recover()?;
        }
        let Some(cache) = self.cache.as_mut() else {
            return Err(JournalError::Storage("journal cache not loaded".into()));
        };
        let purged = crate::purge::purge(
            &self.db,
            &self.overlay,
            cache,
            &self.epochs,
            self.epoch,
            channel,
        );
        match purged {
            Ok(None) => Ok(ChannelState::empty(self.epoch)),
            Ok(Some(state)) => {
                // The purge applied the log: nothing is logged any more, and
                // its durable commit made every earlier one durable.
                self.logged.clear();
                self.keys.pending.clear();
                self.next_log = 0;
                self.unsynced_since = None;
                self.notify(Notice::Evicted {
                    channel: Arc::from(channel),
                    state,
                });
                Ok(state)
            }
            Err(e) => {
                tracing::error!("journal purge failed: {e}");
                self.cache = None;
                Err(e)
            }
        }
    }

    /// Tells the sink about one committed operation. A panicking sink is
    /// logged, not allowed to stop the writer.
    fn notify(&self, notice: Notice) {
        let sink = &self.sink;
        let outcome = catch_unwind(AssertUnwindSafe(|| match &notice {
            Notice::Committed {
                channel,
                state,
                events,
                ..
            } => sink.committed(channel, *state, events),
            Notice::Evicted { channel, state } => sink.evicted(channel, *state),
        }));
        if outcome.is_err() {
            tracing::error!("journal commit sink panicked");
        }
    }

    /// Makes every commit so far durable, if some is not.
    fn flush(&mut self) -> Result<(), JournalError> {
        if self.unsynced_since.is_none() {
            return Ok(());
        }
        let txn = self.db.begin_write().map_err(storage)?;
        txn.commit().map_err(storage)?;
        self.unsynced_since = None;
        Ok(())
    }

    /// The final durable commit: applies the log to the tables, and records
    /// a clean shutdown of an `Async` run.
    fn shutdown(&mut self) -> Result<(), JournalError> {
        if self.options.durability == Durability::Sync && self.logged.is_empty() {
            return self.flush();
        }
        // Readers pair the overlay with a snapshot: both change together.
        let mut tails = self.overlay.write();
        let txn = self.db.begin_write().map_err(storage)?;
        log::apply_logged(&txn)?;
        if self.options.durability == Durability::Async {
            meta::mark_clean(&txn)?;
        }
        txn.commit().map_err(storage)?;
        tails.clear();
        self.logged.clear();
        self.keys.pending.clear();
        self.unsynced_since = None;
        Ok(())
    }
}

#[cfg(test)]
#[path = "writer_tests.rs"]
mod tests;
