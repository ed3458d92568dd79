//! The syncer thread: makes written WAL frames durable and completes their
//! commits, while the writer thread goes on deciding and writing the next.
//!
//! The writer hands each group commit over once its frame is written
//! ([`Written`]). The syncer takes everything handed over since its last
//! round, calls `fdatasync` once on the files those frames are in (under
//! [`Durability::Sync`]; several group commits share it), then completes
//! each commit in order: its events join the readers' overlay, the sink is
//! told, each publisher gets its reply, and its records go to the
//! checkpointer. So a publisher is answered only once its event is on disk,
//! and while one `fdatasync` runs the writer is already writing the frames
//! the next one will cover.
//!
//! Under [`Durability::Async`] commits are completed as soon as they are
//! written, and the files are synced once the oldest unsynced commit is about
//! a second old.
//!
//! A failed `fdatasync` fails every commit handed over and not yet
//! completed, and every later one, until the writer has recovered
//! ([`Syncer::recovered`], see `writer.rs`): nothing after a failed frame is
//! ever acknowledged.

use crate::apply::Notice;
use crate::checkpoint::Checkpointer;
use crate::options::Durability;
use crate::overlay::{self, Overlay};
use crate::request::Pending;
use crate::wal;
use gapless_core::{Appended, CommitSink, JournalError};
use std::collections::VecDeque;
use std::fs::File;
use std::panic::{catch_unwind, AssertUnwindSafe};
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::sync::Arc;
use std::thread::JoinHandle;
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
    /// Each request's reply and result, in order.
    pub replies: Vec<(Pending, Option<Appended>)>,
}

struct State {
    queue: VecDeque<Written>,
    /// Since a failed write or sync: every commit fails until the writer recovers.
    failed: Option<JournalError>,
    /// The thread is completing commits taken from the queue.
    busy: bool,
    /// The thread is in an `fdatasync` or completing the commits it made
    /// durable (the writer waits meanwhile, gathering requests).
    syncing: bool,
    stop: bool,
}

/// The syncer's shared half (the writer holds it; the thread runs [`run`]).
pub(crate) struct Syncer {
    state: Mutex<State>,
    /// Work arrived (or stop).
    work: Condvar,
    /// The queue emptied and nothing is being completed.
    idle: Condvar,
    /// A round (an `fdatasync` and its completions) ended.
    synced: Condvar,
}

impl Syncer {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Hands a written commit over.
    pub(crate) fn push(&self, written: Written) {
        let mut st = self.lock();
        st.queue.push_back(written);
        drop(st);
        self.work.notify_one();
    }

    /// The failure since which commits fail, if any.
    pub(crate) fn failure(&self) -> Option<JournalError> {
        self.lock().failed.as_ref().map(copy)
    }

    /// Waits until every commit handed over is completed (or failed).
    pub(crate) fn wait_idle(&self) {
        let mut st = self.lock();
        while !st.queue.is_empty() || st.busy {
            self.idle.wait(&mut st);
        }
    }

    /// Waits while an `fdatasync` runs and its commits are completed.
    pub(crate) fn wait_round(&self) {
        let mut st = self.lock();
        while st.syncing {
            self.synced.wait(&mut st);
        }
    }

    /// The writer recovered from a failure: commits complete again.
    pub(crate) fn recovered(&self) {
        self.lock().failed = None;
    }

    /// Stops the thread once the queue is empty.
    pub(crate) fn stop(&self) {
        self.lock().stop = true;
        self.work.notify_one();
    }
}

/// What the syncer thread works with.
pub(crate) struct Parts {
    pub files: [Arc<File>; 2],
    pub durability: Durability,
    pub overlay: Arc<Overlay>,
    pub sink: Arc<dyn CommitSink>,
    pub checkpointer: Arc<Checkpointer>,
    /// Test hook: fail the next `fdatasync`.
    #[cfg(test)]
    pub fail_next_sync: Arc<std::sync::atomic::AtomicBool>,
}

/// Starts the syncer thread.
pub(crate) fn spawn(parts: Parts) -> std::io::Result<(Arc<Syncer>, JoinHandle<()>)> {
    let syncer = Arc::new(Syncer {
        state: Mutex::new(State {
            queue: VecDeque::new(),
            failed: None,
            busy: false,
            syncing: false,
            stop: false,
        }),
        work: Condvar::new(),
        idle: Condvar::new(),
        synced: Condvar::new(),
    });
    let shared = syncer.clone();
    let handle = std::thread::Builder::new()
        .name("gapless-store-sync".into())
        .spawn(move || run(&shared, &parts))?;
    Ok((syncer, handle))
}

fn run(syncer: &Syncer, parts: &Parts) {
    // Async: files written since their last sync, and since when.
    let mut dirty = [false, false];
    let mut unsynced_since: Option<Instant> = None;
    let mut st = syncer.lock();
    loop {
        if st.queue.is_empty() {
            if let Some(since) = unsynced_since {
                let due = since + ASYNC_FLUSH;
                let now = Instant::now();
                if now >= due || st.stop {
                    drop(st);
                    match sync(&parts.files, dirty) {
                        Ok(()) => {
                            dirty = [false, false];
                            unsynced_since = None;
                        }
                        Err(e) => {
                            tracing::error!("journal durable commit failed (retrying in 1 s): {e}");
                            unsynced_since = Some(Instant::now());
                        }
                    }
                    st = syncer.lock();
                    continue;
                }
                syncer.work.wait_for(&mut st, due - now);
                continue;
            }
            if st.stop {
                return;
            }
            syncer.work.wait(&mut st);
            continue;
        }
        let batch: Vec<Written> = st.queue.drain(..).collect();
        let failed = st.failed.as_ref().map(copy);
        let mut files = [false, false];
        for w in &batch {
            if let Some(f) = w.file {
                files[f] = true;
            }
        }
        st.busy = true;
        st.syncing = failed.is_none()
            && parts.durability == Durability::Sync
            && files.contains(&true);
        drop(st);
        let outcome = match failed {
            Some(e) => Err(e),
            None if parts.durability == Durability::Sync => {
                let started = Instant::now();
                #[cfg(test)]
                let r = if parts
                    .fail_next_sync
                    .swap(false, std::sync::atomic::Ordering::SeqCst)
                {
                    Err(JournalError::Storage("injected fdatasync failure".into()))
                } else {
                    sync(&parts.files, files)
                };
                #[cfg(not(test))]
                let r = sync(&parts.files, files);
                if files.contains(&true) {
                    metrics::histogram!("gapless_journal_commit_seconds").record(started.elapsed());
                }
                r
            }
            None => {
                for (d, f) in dirty.iter_mut().zip(files) {
                    *d |= f;
                }
                if files.contains(&true) {
                    unsynced_since.get_or_insert_with(Instant::now);
                }
                Ok(())
            }
        };
        match outcome {
            Ok(()) => complete(parts, batch),
            Err(e) => {
                tracing::error!("journal commit failed: {e}");
                syncer.lock().failed.get_or_insert_with(|| copy(&e));
                fail(batch, &e);
            }
        }
        st = syncer.lock();
        st.busy = false;
        if std::mem::take(&mut st.syncing) {
            syncer.synced.notify_all();
        }
        if st.queue.is_empty() {
            syncer.idle.notify_all();
        }
    }
}

/// `fdatasync`s the files marked in `which`.
fn sync(files: &[Arc<File>; 2], which: [bool; 2]) -> Result<(), JournalError> {
    for (i, file) in files.iter().enumerate() {
        if which[i] {
            file.sync_data().map_err(|e| wal::sync_error(i, &e))?;
        }
    }
    Ok(())
}

/// Completes durable commits, in order: overlay, sink, replies, checkpointer.
fn complete(parts: &Parts, batch: Vec<Written>) {
    {
        let mut tails = parts.overlay.write();
        for w in &batch {
            for notice in &w.notices {
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
    }
    for w in &batch {
        for notice in &w.notices {
            notify(&*parts.sink, notice);
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
    parts.checkpointer.push(chunks);
}

fn lost() -> JournalError {
    JournalError::Storage("journal writer lost an append result".to_owned())
}

/// Sends `result` to a request's reply (an eviction's gets `()`).
pub(crate) fn reply(pending: Pending, result: Result<Appended, JournalError>) {
    match pending {
        Pending::Append(reply) => {
            let _ = reply.send(result);
        }
        Pending::Evict(reply) => {
            let _ = reply.send(result.map(|_| ()));
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
/// logged, not allowed to stop the thread.
pub(crate) fn notify(sink: &dyn CommitSink, notice: &Notice) {
    let outcome = catch_unwind(AssertUnwindSafe(|| match notice {
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
