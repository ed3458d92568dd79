//! The group-commit writer: one thread decides and commits every append.
//!
//! Appends, metadata changes (and evictions) wait in the [`Inbox`]. The
//! writer takes everything pending (up to a bound, see `request.rs`),
//! decides each append in memory (a closed channel refuses it; idempotency,
//! seqs, time, retention by count and bytes: `apply.rs`) and each metadata
//! change in its place among them (`channel_meta.rs`),
//! writes the batch's records as one frame of the write-ahead log (`wal.rs`,
//! one `pwrite`), then makes it durable with one `fdatasync` and completes
//! it: overlay, sink, replies (`sync.rs`). While it waits for the disk, new
//! requests gather in the inbox, so the next batch holds everything that
//! arrived meanwhile: concurrent publishers share each `fdatasync`. The
//! checkpointer thread (`checkpoint.rs`) applies the records to the indexed
//! tables later, off the replies' path.
//!
//! Age evictions run here, on the tables, once the checkpointer has applied
//! every commit; so do purges (`purge.rs`), each alone, in its place in the
//! batch: after the appends before it are durable and applied, before those
//! after it.
//!
//! If a batch fails (a WAL write or `fdatasync` fails, or under `Async` a
//! flush's `fdatasync`), its requests get [`JournalError::Storage`] (or
//! `Full`); at once the writer has the checkpointer apply everything
//! acknowledged, starts a new WAL chain after it (the failed frames never
//! join one, and a restart never replays them) and reloads its channel
//! cache from the tables, so no seq is skipped or reused. If that recovery
//! fails, it is tried again before the next batch and at shutdown.

use crate::apply::{self, eviction_due, AppendCx, Ctx, Keys, Notice, Tables};
use crate::cache::Channels;
use crate::checkpoint::Checkpointer;
use crate::options::StoreOptions;
use crate::overlay::Overlay;
use crate::purge::Epochs;
use crate::request::{Batch, Done, Inbox, Op, Pending, Wait};
use crate::sync::{self, Round, Written};
use crate::tables::storage;
use crate::wal::Wal;
use gapless_core::{ChannelState, CommitSink, JournalError};
use gapless_protocol::Epoch;
use redb::Database;
use std::sync::Arc;
use std::thread::JoinHandle;

/// The writer thread's state.
pub(crate) struct Writer {
    db: Arc<Database>,
    inbox: Arc<Inbox>,
    sink: Arc<dyn CommitSink>,
    epoch: Epoch,
    options: StoreOptions,
    /// `None` after a failed batch, until recovered from the tables.
    cache: Option<Channels>,
    /// What readers see beyond the tables (shared with them).
    overlay: Arc<Overlay>,
    /// Idempotency keys not yet in the tables.
    keys: Keys,
    /// The checkpointer's applied lsn when `keys` was last purged.
    purged: u64,
    wal: Wal,
    /// The commits written and not yet durable, and how they are completed.
    round: Round,
    checkpointer: Arc<Checkpointer>,
    /// The checkpointer's thread.
    helpers: Vec<JoinHandle<()>>,
    /// Purged channels' epochs (shared with the readers, `purge.rs`).
    epochs: Arc<Epochs>,
    /// Test hook: fail the next WAL write after deciding its batch.
    #[cfg(test)]
    pub(crate) fail_next_commit: Arc<std::sync::atomic::AtomicBool>,
    /// Test hook: fail the next `fdatasync`.
    #[cfg(test)]
    pub(crate) fail_next_sync: Arc<std::sync::atomic::AtomicBool>,
    /// Test counter: successful `Async` flushes.
    #[cfg(test)]
    pub(crate) flushes: Arc<std::sync::atomic::AtomicU64>,
}

/// What [`Writer::start`] needs beyond the database.
pub(crate) struct Start {
    pub inbox: Arc<Inbox>,
    pub sink: Arc<dyn CommitSink>,
    pub epoch: Epoch,
    pub options: StoreOptions,
    pub cache: Channels,
    pub overlay: Arc<Overlay>,
    /// The WAL, its new chain started after `applied`.
    pub wal: Wal,
    /// The last WAL frame the tables hold.
    pub applied: u64,
    /// Pending record bytes that start a checkpoint.
    pub checkpoint_bytes: usize,
    /// Purged channels' epochs, shared with the readers.
    pub epochs: Arc<Epochs>,
}

impl Writer {
    /// The writer over `db`, with its checkpointer thread running.
    pub(crate) fn start(db: Arc<Database>, s: Start) -> std::io::Result<Self> {
        let (checkpointer, ck_thread) =
            crate::checkpoint::spawn(db.clone(), s.overlay.clone(), s.applied, s.checkpoint_bytes)?;
        let round = Round::new(
            s.wal.files.clone(),
            s.options.durability,
            s.overlay.clone(),
            s.sink.clone(),
            checkpointer.clone(),
        );
        #[cfg(test)]
        let fail_next_sync = round.fail_next_sync.clone();
        #[cfg(test)]
        let flushes = round.flushes.clone();
        Ok(Writer {
            db,
            inbox: s.inbox,
            sink: s.sink,
            epoch: s.epoch,
            options: s.options,
            cache: Some(s.cache),
            overlay: s.overlay,
            keys: Keys::default(),
            purged: s.applied,
            wal: s.wal,
            round,
            checkpointer,
            helpers: vec![ck_thread],
            epochs: s.epochs,
            #[cfg(test)]
            fail_next_commit: Arc::default(),
            #[cfg(test)]
            fail_next_sync,
            #[cfg(test)]
            flushes,
        })
    }

    /// Starts the writer thread. It stops on [`crate::request::Request::Close`]
    /// or when the inbox closes, after a final checkpoint either way.
    pub(crate) fn spawn(self) -> std::io::Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("gapless-store-writer".into())
            .spawn(move || self.run())
    }

    fn run(mut self) {
        loop {
            match self.inbox.wait(self.round.flush_due()) {
                Wait::Ready => {}
                Wait::TimedOut => {
                    self.flush();
                    continue;
                }
                Wait::Closed => break,
            }
            let mut batch = Batch::default();
            let close = self.inbox.take(&mut batch);
            if !batch.ops.is_empty() {
                self.process(batch);
            }
            self.finish_round();
            // A writer that never waits (requests always queued) syncs too.
            if self
                .round
                .flush_due()
                .is_some_and(|at| at <= std::time::Instant::now())
            {
                self.flush();
            }
            if let Some(reply) = close {
                let _ = reply.send(self.shutdown());
                return;
            }
        }
        // The journal was dropped without close().
        if let Err(e) = self.shutdown() {
            tracing::error!("journal final commit failed: {e}");
        }
    }

    /// Makes what was written durable and completes it; after a failed
    /// `fdatasync` drops the chain ([`Writer::drop_chain`]).
    fn finish_round(&mut self) {
        if self.round.finish().is_err() {
            self.drop_chain();
        }
    }

    /// `Async`: syncs the WAL; after a failed `fdatasync` drops the chain
    /// rather than syncing those frames again (`Round::flush`).
    fn flush(&mut self) {
        if self.round.flush().is_err() {
            self.drop_chain();
        }
    }

    /// After a failed WAL write or `fdatasync`: recovers at once (applies
    /// what was acknowledged to the tables and starts a new chain after it,
    /// [`Writer::recover`]), so no later restart replays a frame whose
    /// commit failed. If that fails too, the next batch (or the shutdown)
    /// tries again first.
    fn drop_chain(&mut self) {
        self.cache = None;
        if let Err(e) = self.recover() {
            tracing::error!("journal recovery after a failed commit failed (retried before the next batch): {e}");
        }
    }

    /// Commits a batch's appends, and runs its evictions and purges in
    /// their place.
    fn process(&mut self, batch: Batch) {
        let Batch { ops, pending, .. } = batch;
        let mut appends = Vec::new();
        for (op, pending) in ops.into_iter().zip(pending) {
            match op {
                Op::Evict { now_ms } => {
                    if !appends.is_empty() {
                        self.commit(std::mem::take(&mut appends));
                    }
                    let result = self.evict(now_ms);
                    sync::reply_unit(pending, result);
                }
                Op::Purge { channel } => {
                    if !appends.is_empty() {
                        self.commit(std::mem::take(&mut appends));
                    }
                    let result = self.purge(&channel);
                    sync::reply_state(pending, result);
                }
                // Appends and changes share the batch's frame, in order.
                op @ (Op::Append { .. } | Op::Change { .. }) => appends.push((op, pending)),
            }
        }
        if !appends.is_empty() {
            self.commit(appends);
        }
    }

    /// Recovers from an earlier failure if need be, and waits while the
    /// checkpointer is far behind.
    fn ready(&mut self) -> Result<(), JournalError> {
        if self.cache.is_none() {
            self.recover()?;
        }
        self.checkpointer.wait_backlog()?;
        let applied = self.checkpointer.applied();
        if applied != self.purged {
            self.keys.purge(applied);
            self.purged = applied;
        }
        Ok(())
    }

    /// Decides `appends` (and changes) and writes their frame (completed by
    /// the round).
    fn commit(&mut self, appends: Vec<(Op, Pending)>) {
        let mut replies: Vec<(Pending, Option<Done>)> = Vec::with_capacity(appends.len());
        let result = self.decide(appends, &mut replies);
        let (records, notices) = match result {
            Ok(x) => x,
            Err(e) => {
                tracing::error!("journal commit failed: {e}");
                // Heads in the cache may have advanced past what is durable.
                self.cache = None;
                for (pending, _) in replies {
                    sync::reply(pending, Err(sync::copy(&e)));
                }
                return;
            }
        };
        if records.is_empty() {
            // Only duplicates, refusals and changes that wrote nothing:
            // nothing to write, but the replies wait for the batches
            // before (the originals, or what was decided against, may be
            // among them).
            self.round.written.push(Written {
                lsn: 0,
                file: None,
                records: Vec::new(),
                notices,
                replies,
            });
            return;
        }
        match self.write(&records) {
            Ok((lsn, file)) => self.round.written.push(Written {
                lsn,
                file: Some(file),
                records,
                notices,
                replies,
            }),
            Err(e) => {
                tracing::error!("journal commit failed: {e}");
                for (pending, _) in replies {
                    sync::reply(pending, Err(sync::copy(&e)));
                }
                // The frame may be partly (or wholly) written.
                self.drop_chain();
            }
        }
    }

    /// Decides each append (see `apply::append`; refused on a closed
    /// channel) and each metadata change (`channel_meta::change`), in
    /// order, into records and notices; `replies` gets each request's reply
    /// and result.
    fn decide(
        &mut self,
        appends: Vec<(Op, Pending)>,
        replies: &mut Vec<(Pending, Option<Done>)>,
    ) -> Result<(Vec<u8>, Vec<Notice>), JournalError> {
        let ready = self.ready();
        if let Some(cache) = self.cache.as_mut() {
            crate::channel_meta::bound(cache, self.checkpointer.applied());
        }
        let mut notices = Vec::with_capacity(appends.len());
        // A record is its header (about 60 bytes and the names) and its events.
        let mut records = Vec::with_capacity(records_size(&appends));
        let mut failure = ready.err();
        let lsn = self.wal.next_lsn();
        let mut snapshot = None;
        for (op, pending) in appends {
            if failure.is_none() {
                let Some(cache) = self.cache.as_mut() else {
                    failure = Some(JournalError::Storage("journal cache not loaded".into()));
                    replies.push((pending, None));
                    continue;
                };
                let mut cx = Ctx {
                    epoch: self.epoch,
                    cache,
                };
                let mut ax = AppendCx {
                    db: &self.db,
                    snapshot: &mut snapshot,
                    keys: &mut self.keys,
                    record: &mut records,
                    lsn,
                };
                match decide_one(&mut cx, &mut ax, op) {
                    Ok((done, notice)) => {
                        replies.push((pending, done));
                        notices.extend(notice);
                        continue;
                    }
                    Err(e) => failure = Some(e),
                }
            }
            replies.push((pending, None));
        }
        match failure {
            Some(e) => Err(e),
            None => Ok((records, notices)),
        }
    }

    /// Writes `records` as the next WAL frame.
    fn write(&mut self, records: &[u8]) -> Result<(u64, usize), JournalError> {
        self.round
            .started
            .get_or_insert_with(std::time::Instant::now);
        #[cfg(test)]
        if self
            .fail_next_commit
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            // As a write error reported once the frame (or part of it) is
            // in the file.
            let _ = self.wal.append(records, self.checkpointer.applied());
            return Err(JournalError::Storage("injected commit failure".into()));
        }
        self.wal.append(records, self.checkpointer.applied())
    }

    /// After a failure: completes (or fails) what was written, has
    /// everything acknowledged applied to the tables, starts a new WAL chain
    /// after it, and reloads the cache.
    fn recover(&mut self) -> Result<(), JournalError> {
        // Written before the failure, in the chain about to be left:
        // acknowledged (durable) now, or failed.
        let _ = self.round.finish();
        let applied = self.checkpointer.apply_all(false)?;
        self.wal.rewind(applied + 1);
        self.wal.restart_here()?;
        self.keys.pending.clear();
        self.purged = applied;
        // Every acknowledged event is in the tables now.
        self.overlay.write().clear();
        self.cache = Some(Channels::load(&self.db, &self.options.namespaces)?);
        Ok(())
    }

    /// Evicts events older than the retention age, on the tables, once
    /// every batch so far is applied to them.
    fn evict(&mut self, now_ms: u64) -> Result<(), JournalError> {
        self.finish_round();
        if self.cache.is_none() {
            self.recover()?;
        }
        let due = {
            let Some(cache) = self.cache.as_mut() else {
                return Err(JournalError::Storage("journal cache not loaded".into()));
            };
            let cx = Ctx {
                epoch: self.epoch,
                cache,
            };
            eviction_due(&cx, now_ms)
        };
        if !due {
            return Ok(());
        }
        self.checkpointer.apply_all(false)?;
        let result = self.evict_now(now_ms);
        match result {
            Ok(notices) => {
                for notice in &notices {
                    sync::notify(&*self.sink, notice);
                }
                Ok(())
            }
            Err(e) => {
                tracing::error!("journal eviction failed: {e}");
                // Floors in the cache may have advanced past the tables.
                self.cache = None;
                Err(e)
            }
        }
    }

    /// The eviction transaction (the overlay is empty: everything is applied).
    fn evict_now(&mut self, now_ms: u64) -> Result<Vec<Notice>, JournalError> {
        let Some(cache) = self.cache.as_mut() else {
            return Err(JournalError::Storage("journal cache not loaded".into()));
        };
        let mut cx = Ctx {
            epoch: self.epoch,
            cache,
        };
        // Readers pair the overlay with a snapshot: both change together.
        let mut tails = self.overlay.write();
        let txn = self.db.begin_write().map_err(storage)?;
        let notices = {
            let mut tables = Tables::open(&txn)?;
            let notices = tables.evict_expired(&mut cx, now_ms)?;
            tables.finish()?;
            notices
        };
        if notices.is_empty() {
            txn.abort().map_err(storage)?;
            return Ok(notices);
        }
        txn.commit().map_err(storage)?;
        tails.clear();
        Ok(notices)
    }

    /// Purges `channel` (`purge.rs`) once every batch so far is durable and
    /// applied to the tables (nothing of it is left only in the WAL or the
    /// overlay), and tells the sink its new state.
    fn purge(&mut self, channel: &str) -> Result<ChannelState, JournalError> {
        self.finish_round();
        if self.cache.is_none() {
            self.recover()?;
        }
        let applied = self.checkpointer.apply_all(false)?;
        // The tables hold every idempotency key now.
        self.keys.purge(applied);
        self.purged = applied;
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
                sync::notify(
                    &*self.sink,
                    &Notice::Evicted {
                        channel: Arc::from(channel),
                        state,
                    },
                );
                Ok(state)
            }
            Err(e) => {
                tracing::error!("journal purge failed: {e}");
                // The cache may have changed past the tables.
                self.cache = None;
                Err(e)
            }
        }
    }

    /// The final checkpoint: everything completed goes to the tables, and a
    /// clean shutdown is recorded (the log holds nothing the tables lack);
    /// then the checkpointer stops.
    fn shutdown(&mut self) -> Result<(), JournalError> {
        self.finish_round();
        // A failed frame may still head the log: a new chain after what was
        // acknowledged, or the next start would replay it.
        let recovered = if self.cache.is_none() {
            self.recover()
        } else {
            Ok(())
        };
        let result = recovered.and_then(|()| self.checkpointer.apply_all(true).map(|_| ()));
        self.flush();
        self.checkpointer.stop();
        for thread in self.helpers.drain(..) {
            if thread.join().is_err() {
                tracing::error!("a journal thread panicked");
            }
        }
        result
    }
}

/// Decides one append or change of a batch (see [`Writer::decide`]):
/// its result (`None`: not an append or a change) and its notices.
fn decide_one(
    cx: &mut Ctx<'_>,
    ax: &mut AppendCx<'_>,
    op: Op,
) -> Result<(Option<Done>, Vec<Notice>), JournalError> {
    match op {
        Op::Append {
            channel,
            events,
            key,
        } => {
            // Decided here, in order: wholly before or after a close; a
            // retry of an append stored before it is still answered.
            if crate::channel_meta::closed(cx.cache, ax, &channel)? {
                return Ok(
                    match apply::stored_before(cx, ax, &channel, key.as_deref())? {
                        Some(a) => (Some(Done::Appended(a)), Vec::new()),
                        None => (Some(Done::ChannelClosed), Vec::new()),
                    },
                );
            }
            let (appended, notice) = apply::append(cx, ax, &channel, events, key.as_deref())?;
            Ok((Some(Done::Appended(appended)), notice.into_iter().collect()))
        }
        Op::Change { channel, change } => {
            let (done, notices) = crate::channel_meta::change(cx, ax, &channel, *change)?;
            Ok((Some(done), notices))
        }
        Op::Evict { .. } | Op::Purge { .. } => Ok((None, Vec::new())),
    }
}

/// About the bytes the records of `appends` take.
fn records_size(appends: &[(Op, Pending)]) -> usize {
    appends
        .iter()
        .map(|(op, _)| match op {
            Op::Append {
                channel,
                events,
                key,
            } => {
                64 + channel.len()
                    + key.as_ref().map_or(0, String::len)
                    + events
                        .iter()
                        .map(|e| 8 + e.data.len() + e.event_type.as_ref().map_or(0, String::len))
                        .sum::<usize>()
            }
            Op::Change { channel, change } => {
                64 + channel.len() + crate::request::change_bytes(change)
            }
            Op::Evict { .. } | Op::Purge { .. } => 0,
        })
        .sum()
}

#[cfg(test)]
#[path = "writer_tests.rs"]
mod tests;
