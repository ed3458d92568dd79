//! The checkpointer thread: applies completed commits to the indexed tables,
//! off the path of the replies.
//!
//! The writer hands it each durable commit's records (`sync.rs`). Once
//! [`Checkpointer::threshold`] bytes of them are pending (1 MiB by
//! default, `log::CHECKPOINT_BYTES`), one redb transaction applies them all
//! to `channels`, `events`, the idempotency tables and `channel_meta`
//! (metadata records, `channel_meta.rs`), records the last
//! frame applied (`meta["wal_applied"]`), and commits durably; then the
//! readers' overlay drops what the tables now hold (events up to each
//! channel's applied head, metadata changed in the frames applied). Each leaf page is
//! rewritten once for many events, and publishers never wait for it: the
//! writer goes on writing frames meanwhile (redb allows one write
//! transaction at a time, and only this thread writes the tables while the
//! store runs, but for the writer's age evictions, which first wait for it).
//!
//! The WAL frames of applied commits may be overwritten (`wal.rs`); until
//! then, opening the store applies whatever was not ([`recover`]).
//!
//! A failed checkpoint loses nothing (the frames are durable and the
//! records stay pending); it is retried a second later. If checkpoints keep
//! failing, the writer refuses appends once [`MAX_BACKLOG`] bytes are
//! pending ([`Checkpointer::wait_backlog`]). A checkpoint that panics does
//! not stop the thread (the writer waits on it): it refuses every append
//! from then on, and the next start applies the WAL.

use crate::apply::Tables;
use crate::log::{Entry, Records};
use crate::meta;
use crate::overlay::{self, Overlay};
use crate::tables::storage;
use crate::wal;
use gapless_core::JournalError;
use parking_lot::{Condvar, Mutex, MutexGuard};
use redb::Database;
use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Pending record bytes past which the writer waits for checkpoints, and
/// refuses appends while they fail (16 MiB). With [`MAX_BATCH`] this bounds
/// what a checkpointer that falls behind (a slow disk) makes the process
/// hold: the records pending and being applied, their overlay copies and
/// the transaction's pages. At 64 MiB and no bound on a batch, a
/// checkpoint of 300 ms let a server fed 1 MiB events reach 421 MB
/// resident (`crates/gapless/tests/it/memory_bound.rs`).
pub(crate) const MAX_BACKLOG: usize = 16 << 20;
/// Record bytes one checkpoint applies at most (8 MiB; always at least one
/// commit): the rest waits for the next, which starts at once.
pub(crate) const MAX_BATCH: usize = 8 << 20;
/// How long after a failed checkpoint the next is tried.
const RETRY: Duration = Duration::from_secs(1);

/// A caller waiting for everything pending to be applied.
struct Waiter {
    /// Also record a clean shutdown of an `Async` run in the same transaction.
    clean: bool,
    reply: mpsc::SyncSender<Result<u64, JournalError>>,
}

struct State {
    /// Durable commits not yet applied: `(lsn, records)`, in lsn order.
    chunks: VecDeque<(u64, Vec<u8>)>,
    /// Their record bytes.
    bytes: usize,
    waiters: Vec<Waiter>,
    /// After a failure: no threshold checkpoint before this.
    retry_at: Option<Instant>,
    /// The last failure, while checkpoints fail.
    failing: Option<String>,
    /// A checkpoint panicked: no checkpoint is tried again in this process,
    /// and appends are refused (the frames stay in the WAL, applied at the
    /// next open).
    broken: Option<String>,
    stop: bool,
}

impl State {
    /// Nothing pending, nothing failed.
    fn new() -> Self {
        State {
            chunks: VecDeque::new(),
            bytes: 0,
            waiters: Vec::new(),
            retry_at: None,
            failing: None,
            broken: None,
            stop: false,
        }
    }
}

/// The checkpointer's shared half (the thread runs [`run`]).
pub(crate) struct Checkpointer {
    state: Mutex<State>,
    /// Work arrived (or stop).
    work: Condvar,
    /// A checkpoint ended.
    done: Condvar,
    /// The last lsn the tables hold (durably).
    applied: AtomicU64,
    /// Pending bytes that start a checkpoint (0: every hand-over).
    threshold: usize,
    db: Arc<Database>,
    overlay: Arc<Overlay>,
    /// `gapless_journal_checkpoint_seconds`, looked up once.
    seconds: metrics::Histogram,
    /// Test hook: the next checkpoint panics.
    #[cfg(test)]
    panic_next: std::sync::atomic::AtomicBool,
}

impl Checkpointer {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// The last lsn the tables hold.
    pub(crate) fn applied(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }

    /// Hands over durable commits' records, in lsn order.
    pub(crate) fn push(&self, chunks: Vec<(u64, Vec<u8>)>) {
        if chunks.is_empty() {
            return;
        }
        let mut st = self.lock();
        for (lsn, records) in chunks {
            st.bytes += records.len();
            st.chunks.push_back((lsn, records));
        }
        let due = st.bytes >= self.threshold;
        drop(st);
        if due {
            self.work.notify_one();
        }
    }

    /// Applies everything handed over so far (and, with `clean`, records a
    /// clean shutdown) and waits for it. Returns the last lsn applied.
    ///
    /// # Errors
    /// The checkpoint's storage error.
    pub(crate) fn apply_all(&self, clean: bool) -> Result<u64, JournalError> {
        let (reply, result) = mpsc::sync_channel(1);
        self.lock().waiters.push(Waiter { clean, reply });
        self.work.notify_one();
        result
            .recv()
            .map_err(|_| JournalError::Storage("the journal's checkpointer stopped".into()))?
    }

    /// Waits while more than [`MAX_BACKLOG`] bytes are pending.
    ///
    /// # Errors
    /// [`JournalError::Storage`] while checkpoints fail with that much
    /// pending, and always once a checkpoint panicked.
    pub(crate) fn wait_backlog(&self) -> Result<(), JournalError> {
        let mut st = self.lock();
        if let Some(why) = &st.broken {
            return Err(broken(why));
        }
        while st.bytes > MAX_BACKLOG {
            if let Some(why) = &st.failing {
                return Err(JournalError::Storage(format!(
                    "the journal cannot apply its log to its tables ({why}); appends are \
                     refused until it can"
                )));
            }
            self.done.wait(&mut st);
        }
        Ok(())
    }

    /// Stops the thread once everything waiting is served (what is pending
    /// and not asked for stays in the WAL, applied at the next open).
    pub(crate) fn stop(&self) {
        self.lock().stop = true;
        self.work.notify_one();
    }
}

/// The error of every append once a checkpoint panicked (`why`: the panic's text).
fn broken(why: &str) -> JournalError {
    JournalError::Storage(format!(
        "the journal's checkpointer failed ({why}); appends are refused until the server \
         restarts (the write-ahead log keeps every acknowledged commit, applied at the next start)"
    ))
}

/// Starts the checkpointer over `db`, whose tables hold every frame up to
/// `applied`.
pub(crate) fn spawn(
    db: Arc<Database>,
    overlay: Arc<Overlay>,
    applied: u64,
    threshold: usize,
) -> std::io::Result<(Arc<Checkpointer>, JoinHandle<()>)> {
    let ck = Arc::new(Checkpointer {
        state: Mutex::new(State::new()),
        work: Condvar::new(),
        done: Condvar::new(),
        applied: AtomicU64::new(applied),
        threshold,
        db,
        overlay,
        seconds: metrics::histogram!("gapless_journal_checkpoint_seconds"),
        #[cfg(test)]
        panic_next: std::sync::atomic::AtomicBool::new(false),
    });
    let shared = ck.clone();
    let handle = std::thread::Builder::new()
        .name("gapless-store-checkpoint".into())
        .spawn(move || run(&shared))?;
    Ok((ck, handle))
}

fn run(ck: &Checkpointer) {
    let mut st = ck.lock();
    loop {
        let now = Instant::now();
        let due = !st.chunks.is_empty()
            && st.bytes >= ck.threshold
            && st.retry_at.is_none_or(|at| now >= at);
        if !due && st.waiters.is_empty() {
            if st.stop {
                return;
            }
            match st.retry_at {
                Some(at) if !st.chunks.is_empty() && at > now => {
                    ck.work.wait_for(&mut st, at - now);
                }
                _ => ck.work.wait(&mut st),
            }
            continue;
        }
        let (chunks, bytes) = take_batch(&mut st);
        // Waiters are answered by the checkpoint that leaves nothing
        // pending: what they wait for is everything handed over before.
        let waiters = if st.chunks.is_empty() {
            std::mem::take(&mut st.waiters)
        } else {
            Vec::new()
        };
        let clean = waiters.iter().any(|w| w.clean);
        let broken_by = st.broken.clone();
        drop(st);
        let outcome = match broken_by {
            Some(why) => Err(broken(&why)),
            // A panic here must not stop the thread: the writer waits on it
            // (`wait_backlog`, `apply_all`).
            None => catch_unwind(AssertUnwindSafe(|| apply(ck, &chunks, clean))).unwrap_or_else(
                |panic| {
                    let why = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_else(|| "a checkpoint panicked".to_owned());
                    tracing::error!("journal checkpoint panicked: {why}; appends are refused");
                    ck.lock().broken = Some(why.clone());
                    Err(broken(&why))
                },
            ),
        };
        st = ck.lock();
        match &outcome {
            Ok(last) => {
                ck.applied.store(*last, Ordering::Release);
                st.retry_at = None;
                st.failing = None;
            }
            Err(e) => {
                tracing::error!("journal checkpoint failed (retrying in 1 s): {e}");
                // Back at the front, before anything handed over meanwhile.
                for chunk in chunks.into_iter().rev() {
                    st.chunks.push_front(chunk);
                }
                st.bytes += bytes;
                st.retry_at = Some(Instant::now() + RETRY);
                st.failing = Some(e.to_string());
            }
        }
        ck.done.notify_all();
        for w in waiters {
            let _ = w.reply.send(match &outcome {
                Ok(last) => Ok(*last),
                Err(e) => Err(crate::sync::copy(e)),
            });
        }
    }
}

/// The commits of the next checkpoint, oldest first: as many as fit in
/// [`MAX_BATCH`] bytes of records, and at least one. Returns them and their
/// bytes, taken off `st`.
fn take_batch(st: &mut State) -> (Vec<(u64, Vec<u8>)>, usize) {
    let mut chunks = Vec::new();
    let mut bytes = 0;
    while let Some(next) = st.chunks.front() {
        if !chunks.is_empty() && bytes + next.1.len() > MAX_BATCH {
            break;
        }
        bytes += next.1.len();
        chunks.extend(st.chunks.pop_front());
    }
    st.bytes -= bytes;
    (chunks, bytes)
}

/// One checkpoint: applies `chunks` (and, with `clean`, marks a clean
/// shutdown) in one durable transaction, then trims the overlay. Returns
/// the last lsn the tables hold.
fn apply(ck: &Checkpointer, chunks: &[(u64, Vec<u8>)], clean: bool) -> Result<u64, JournalError> {
    #[cfg(test)]
    if ck.panic_next.swap(false, Ordering::SeqCst) {
        panic!("injected checkpoint panic");
    }
    let applied = ck.applied();
    if chunks.is_empty() && !clean {
        return Ok(applied);
    }
    let started = Instant::now();
    let txn = ck.db.begin_write().map_err(storage)?;
    let mut heads: HashMap<String, u64> = HashMap::new();
    {
        let mut tables = Tables::open(&txn)?;
        for (_, records) in chunks {
            for entry in Records::written_here(records) {
                let record = match entry? {
                    Entry::Append(record) => record,
                    Entry::Meta(record) => {
                        tables.apply_meta(&record)?;
                        continue;
                    }
                };
                tables.apply(&record)?;
                match heads.get_mut(record.name) {
                    Some(head) => *head = record.head,
                    None => {
                        heads.insert(record.name.to_owned(), record.head);
                    }
                }
            }
        }
        tables.finish()?;
    }
    let last = chunks.last().map_or(applied, |(lsn, _)| *lsn);
    if last != applied {
        meta::set_wal_applied(&txn, last)?;
    }
    if clean {
        meta::mark_clean(&txn)?;
    }
    txn.commit().map_err(storage)?;
    ck.seconds.record(started.elapsed());
    let mut view = ck.overlay.write();
    overlay::trim(&mut view.tails, &heads);
    overlay::trim_metas(&mut view.metas, last);
    Ok(last)
}

/// Applies what the WAL in `dir` holds after the tables' last applied frame
/// (what a crash left), durably, and records (`meta["wal_live"] = 0`, in
/// the same transaction) that the tables then lack nothing the log holds, so
/// a crash while the files are emptied and refilled next does not leave a
/// store that refuses to start. Returns the last lsn the tables then hold
/// and the highest WAL generation found. `lenient`: the last run had `Async`
/// durability and did not stop cleanly, so the log may end at a break in
/// its commits (`wal::Log::after`).
///
/// # Errors
/// [`JournalError::Storage`] when the WAL cannot be read, misses commits,
/// holds records that do not decode, or the tables cannot be written.
pub(crate) fn recover(
    db: &Database,
    dir: &Path,
    lenient: bool,
) -> Result<(u64, u64), JournalError> {
    let applied = meta::wal_applied(db)?;
    let log = wal::read(dir)?;
    let live = log.generation == 0 && meta::wal_live(db)?;
    let frames = log.pending(applied, live, dir, lenient)?;
    let Some(last) = frames.last().map(|f| f.lsn) else {
        // Nothing to apply, but the files are about to be emptied
        // (`wal::Wal::open_sized`): a crash then must not find
        // `wal_live` set beside a log without a header.
        meta::clear_wal_live(db)?;
        return Ok((applied, log.generation));
    };
    let txn = db.begin_write().map_err(storage)?;
    {
        let mut tables = Tables::open(&txn)?;
        for frame in frames {
            crate::log::apply_all(&mut tables, &frame.records)?;
        }
        tables.finish()?;
    }
    meta::set_wal_applied(&txn, last)?;
    // The tables hold every commit now: the log may be emptied (see above).
    meta::set_wal_live_in(&txn, false)?;
    txn.commit().map_err(storage)?;
    tracing::info!(
        commits = frames.len(),
        "applied the journal's write-ahead log to its tables"
    );
    Ok((last, log.generation))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A panicking checkpoint neither stops the thread nor leaves the
    /// writer waiting: appends are refused.
    #[test]
    fn a_panicking_checkpoint_refuses_appends_instead_of_hanging() -> Result<(), JournalError> {
        let dir = tempfile::tempdir().map_err(storage)?;
        let db = Arc::new(Database::create(dir.path().join("j.redb")).map_err(storage)?);
        let (ck, thread) = spawn(db, Arc::new(Overlay::default()), 0, 0).map_err(storage)?;
        ck.panic_next.store(true, Ordering::SeqCst);
        assert!(ck.apply_all(false).is_err(), "the panicking checkpoint");
        // More than the backlog bound pending, as appends go on.
        ck.push(vec![(1, vec![0u8; MAX_BACKLOG + 1])]);
        let (tx, rx) = mpsc::channel();
        let waiter = ck.clone();
        std::thread::spawn(move || {
            let _ = tx.send(waiter.wait_backlog());
        });
        let waited = rx.recv_timeout(Duration::from_secs(10)).map_err(|_| {
            storage("wait_backlog still waits 10 s after the checkpointer panicked")
        })?;
        assert!(
            matches!(&waited, Err(JournalError::Storage(m)) if m.contains("checkpointer failed")),
            "{waited:?}"
        );
        assert!(ck.apply_all(false).is_err());
        ck.stop();
        thread
            .join()
            .map_err(|_| storage("the checkpointer thread panicked"))?;
        Ok(())
    }

    /// A checkpoint takes at most [`MAX_BATCH`] bytes of records, oldest
    /// first, and always one commit, however large.
    #[test]
    fn a_checkpoint_takes_a_bounded_batch() {
        let mut st = State::new();
        for (lsn, len) in [(1, MAX_BATCH + 1), (2, 3 << 20), (3, 3 << 20), (4, 3 << 20)] {
            st.bytes += len;
            st.chunks.push_back((lsn, vec![0u8; len]));
        }
        let lsns = |c: &[(u64, Vec<u8>)]| c.iter().map(|(l, _)| *l).collect::<Vec<_>>();
        let (first, bytes) = take_batch(&mut st);
        assert_eq!((lsns(&first), bytes), (vec![1], MAX_BATCH + 1));
        let (second, bytes) = take_batch(&mut st);
        assert_eq!((lsns(&second), bytes), (vec![2, 3], 6 << 20));
        let (third, _) = take_batch(&mut st);
        assert_eq!(lsns(&third), vec![4]);
        assert_eq!((st.bytes, st.chunks.len()), (0, 0));
    }
}
