//! The embedded, durable journal of gapless (`gapless serve --data-dir DIR`).
//!
//! [`EmbeddedJournal`] implements [`gapless_core::Journal`] over one
//! [redb](https://www.redb.org) file, `DIR/journal.redb`:
//!
//! - appends go through one writer thread that decides everything pending,
//!   writes it as one frame of a write-ahead log beside the file, makes it
//!   durable with one `fdatasync` and only then tells the sink and replies
//!   (`writer.rs`, `wal.rs`, `sync.rs`; batches in `request.rs`, the
//!   operations in `apply.rs`, the records in `log.rs`, the writer's channel
//!   cache in `cache.rs`), so concurrent publishers share each fsync;
//! - a channel's metadata ([`gapless_core::meta`]: a Durable Streams
//!   stream's content type, closure, producers) is changed through the same
//!   writer: it decides each change in its place among the appends, with
//!   [`gapless_core::meta::decide`], and writes the change's events and a
//!   metadata record in the same WAL frame, so a crash keeps both or
//!   neither; it refuses plain appends to a closed channel; the
//!   checkpointer applies metadata records to the `channel_meta` table, and
//!   readers see newer ones through the overlay (`channel_meta.rs`);
//! - a checkpointer thread applies the records to the indexed tables of the
//!   redb file every so often, off the replies' path (`checkpoint.rs`);
//! - reads run in their own read transactions, concurrently with the writer,
//!   and see what is not yet applied through an overlay (`reader.rs`,
//!   `overlay.rs`);
//! - the on-disk layout is in `tables.rs`, the store's identity (epoch) in
//!   `meta.rs`.
//!
//! The store has one epoch, drawn at random when the file is created and kept
//! in it, so reopening the directory (or a copy of it) resumes the same
//! history. redb commits are atomic and checksummed, and so are WAL frames:
//! after a crash the file reopens at its last durable checkpoint and the WAL
//! frames after it are applied, which under [`Durability::Sync`] includes
//! every acknowledged append.

mod apply;
mod cache;
mod channel_meta;
mod checkpoint;
mod disk;
mod log;
mod meta;
mod open;
mod options;
mod overlay;
mod purge;
mod reader;
mod request;
mod sync;
mod tables;
mod wal;
mod writer;

pub use open::{check, CheckReport};
pub use options::{Durability, StoreOptions, DEFAULT_CACHE_BYTES};

use async_trait::async_trait;
use gapless_core::{Appended, ChannelState, CommitSink, Journal, JournalError, Page, TimeSeek};
use gapless_protocol::{Epoch, NewEvent};
use redb::Database;
use request::{Inbox, Reply, Request};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use tokio::sync::oneshot;
use writer::Writer;

/// Reads of at most this many events run on the calling task; larger ones
/// (about 0.3 µs per event) run on tokio's blocking pool.
pub const DIRECT_READ_LIMIT: usize = 64;

/// Name of the database file inside the data directory.
pub const FILE_NAME: &str = "journal.redb";

/// The durable journal: a write-ahead log written by one group-commit
/// thread, applied to a redb file by another.
///
/// Dropping it without [`Journal::close`] also stops the writer after a final
/// durable commit; the drop waits for that (one fsync at most).
pub struct EmbeddedJournal {
    /// When appends are acknowledged.
    durability: Durability,
    /// The journal file.
    path: std::path::PathBuf,
    /// Refuses appends while the disk is below its reserve.
    disk: disk::DiskGuard,
    epoch: Epoch,
    db: Arc<Database>,
    /// Appends not yet in the tables, for readers.
    overlay: Arc<overlay::Overlay>,
    /// Purged channels' epochs (`purge.rs`).
    epochs: Arc<purge::Epochs>,
    /// Where requests wait for the writer.
    inbox: Arc<Inbox>,
    closed: AtomicBool,
    writer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for EmbeddedJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedJournal").finish_non_exhaustive()
    }
}

impl EmbeddedJournal {
    /// Opens (creating it if needed) the journal in directory `dir`, and
    /// starts its writer thread.
    ///
    /// # Errors
    /// [`JournalError::Storage`] when the directory or file cannot be created
    /// or opened (for instance another process has it open), or the file is
    /// not a journal this build can read.
    pub fn open(
        dir: &Path,
        options: StoreOptions,
        sink: Arc<dyn CommitSink>,
    ) -> Result<Self, JournalError> {
        Self::open_with_checkpoint(dir, options, sink, log::CHECKPOINT_BYTES)
    }

    /// [`EmbeddedJournal::open`] with logged appends applied to the indexed
    /// tables once `checkpoint_bytes` of records are pending (0: at every
    /// commit). For tests of the log; the default suits every load.
    ///
    /// # Errors
    /// As [`EmbeddedJournal::open`].
    #[doc(hidden)]
    pub fn open_with_checkpoint(
        dir: &Path,
        options: StoreOptions,
        sink: Arc<dyn CommitSink>,
        checkpoint_bytes: usize,
    ) -> Result<Self, JournalError> {
        Self::open_tuned(dir, options, sink, checkpoint_bytes, wal::FILE_BYTES)
    }

    /// [`EmbeddedJournal::open_with_checkpoint`] with write-ahead log files
    /// of `wal_file_bytes` (the writer moves to the other file past it).
    /// For tests of the log; the default suits every load.
    ///
    /// # Errors
    /// As [`EmbeddedJournal::open`].
    #[doc(hidden)]
    pub fn open_tuned(
        dir: &Path,
        options: StoreOptions,
        sink: Arc<dyn CommitSink>,
        checkpoint_bytes: usize,
        wal_file_bytes: u64,
    ) -> Result<Self, JournalError> {
        create_dir(dir)?;
        let path = dir.join(FILE_NAME);
        let db = open::open_db(&path, options.cache_bytes)?;
        let (epoch, async_unclean) = meta::init(&db, options.durability)?;
        // Format 2's commit log table, then the WAL: what a crash left.
        log::recover(&db)?;
        // Format 2's log is applied (and `meta::init` made a format-3
        // store's `channel_meta` table): the store is format 4 from now on.
        meta::finish_upgrade(&db)?;
        let (applied, generation) = checkpoint::recover(&db, dir, async_unclean)?;
        // The tables now hold every commit: each channel's retention applies
        // to them all (a limit lowered since they were appended).
        let mut cache = cache::Channels::load(&db, &options.namespaces)?;
        let trimmed = apply::enforce(&db, &mut cache)?;
        if trimmed > 0 {
            tracing::info!(
                channels = trimmed,
                "retention applied to the events channels held (a limit lower than when they were appended)"
            );
        }
        let epochs = Arc::new(purge::Epochs::load(&db)?);
        let wal = wal::Wal::open_sized(dir, generation, applied + 1, wal_file_bytes)?;
        // From now on the tables may lack commits only the log holds.
        meta::set_wal_live(&db)?;
        let db = Arc::new(db);
        let (durability, min_free_bytes) = (options.durability, options.min_free_bytes);
        let overlay = Arc::new(overlay::Overlay::default());
        let inbox = Arc::new(Inbox::default());
        let thread_error = |e: std::io::Error| {
            JournalError::Storage(format!("cannot start the writer thread: {e}"))
        };
        let writer = Writer::start(
            db.clone(),
            writer::Start {
                inbox: inbox.clone(),
                sink,
                epoch,
                options,
                cache,
                overlay: overlay.clone(),
                wal,
                applied,
                checkpoint_bytes,
                epochs: epochs.clone(),
            },
        )
        .and_then(Writer::spawn)
        .map_err(thread_error)?;
        Ok(EmbeddedJournal {
            durability,
            path: path.clone(),
            disk: disk::DiskGuard::new(dir.to_path_buf(), min_free_bytes),
            epoch,
            db,
            overlay,
            epochs,
            inbox,
            closed: AtomicBool::new(false),
            writer: Some(writer),
        })
    }

    /// The store's epoch (shared by all its channels but those purged,
    /// which have their own).
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Where reads take a channel's epoch (under the overlay's lock, see
    /// [`reader::EpochOf`]).
    fn epoch_of(&self) -> reader::EpochOf {
        reader::EpochOf {
            epochs: Some(self.epochs.clone()),
            store: self.epoch,
        }
    }

    /// Sends `request` to the writer and waits for its reply.
    async fn call<T>(&self, request: impl FnOnce(Reply<T>) -> Request) -> Result<T, JournalError> {
        let (reply, result) = oneshot::channel();
        self.inbox
            .send(request(reply))
            .map_err(|_| JournalError::Closed)?;
        // A dropped reply means the writer stopped before serving it.
        result.await.map_err(|_| JournalError::Closed)?
    }
}

#[async_trait]
impl Journal for EmbeddedJournal {
    /// On the calling task: the overlay, then one snapshot of the tables
    /// (two row lookups at most), never the writer (`channel_meta::read`).
    /// On the calling task: the overlay, then a range of the
    /// `channel_meta` table (`channel_meta::list`).
    async fn channels_with_meta(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<String>, JournalError> {
        channel_meta::list(&self.db, &self.overlay, prefix, limit)
    }

    async fn meta(
        &self,
        channel: &str,
    ) -> Result<(Option<gapless_core::meta::ChannelMeta>, ChannelState), JournalError> {
        channel_meta::read(&self.db, &self.overlay, self.epoch_of(), channel)
    }

    /// Decided by the writer thread in its place among the appends and
    /// committed in their WAL frame; durable before it returns, like an
    /// append (`channel_meta.rs`).
    async fn change(
        &self,
        channel: &str,
        change: gapless_core::meta::Change,
    ) -> Result<gapless_core::meta::Changed, JournalError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(JournalError::Closed);
        }
        self.disk.check()?;
        self.call(|reply| Request::Change {
            channel: channel.to_owned(),
            change: Box::new(change),
            reply,
        })
        .await
    }

    async fn append(
        &self,
        channel: &str,
        events: Vec<NewEvent>,
        idempotency_key: Option<&str>,
    ) -> Result<Appended, JournalError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(JournalError::Closed);
        }
        self.disk.check()?;
        self.call(|reply| Request::Append {
            channel: channel.to_owned(),
            events,
            key: idempotency_key.map(str::to_owned),
            reply,
        })
        .await
    }

    /// Pages of up to [`DIRECT_READ_LIMIT`] events are read on the calling task
    /// (tens of microseconds); larger ones on tokio's blocking pool.
    async fn read(&self, channel: &str, after: u64, limit: usize) -> Result<Page, JournalError> {
        self.read_bounded(channel, after, limit, usize::MAX).await
    }

    /// Stops reading rows once the data passes `max_bytes`, so a page of
    /// large events never loads more than one event past it.
    async fn read_bounded(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Page, JournalError> {
        let epoch = self.epoch_of();
        let bound = reader::Bound { limit, max_bytes };
        let handle = match tokio::runtime::Handle::try_current() {
            Ok(handle) if limit > DIRECT_READ_LIMIT => handle,
            _ => return reader::page(&self.db, &self.overlay, epoch, channel, after, bound),
        };
        let (db, overlay) = (self.db.clone(), self.overlay.clone());
        let channel = channel.to_owned();
        handle
            .spawn_blocking(move || reader::page(&db, &overlay, epoch, &channel, after, bound))
            .await
            .map_err(|e| JournalError::Storage(format!("journal read task failed: {e}")))?
    }

    async fn state(&self, channel: &str) -> Result<ChannelState, JournalError> {
        let epoch = self.epoch_of();
        reader::state(&self.db, &self.overlay, epoch, channel)
    }

    /// A binary search over seqs, on the calling task: the overlay's events
    /// in memory, then at most about log2(retained events) row lookups in
    /// the tables (`reader::seek_time`).
    async fn seek_time(&self, channel: &str, time_ms: u64) -> Result<TimeSeek, JournalError> {
        let epoch = self.epoch_of();
        reader::seek_time(&self.db, &self.overlay, epoch, channel, time_ms)
    }

    /// After [`Journal::close`] this does nothing.
    fn durability(&self) -> &'static str {
        match self.durability {
            Durability::Sync => "sync",
            Durability::Async => "async",
        }
    }

    fn size_bytes(&self) -> Option<u64> {
        std::fs::metadata(&self.path).ok().map(|m| m.len())
    }

    /// Ready while the disk holds its free-space reserve (`--min-free-disk-bytes`).
    async fn ready(&self) -> Result<(), JournalError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(JournalError::Closed);
        }
        self.disk.check()
    }

    /// Run by the writer thread alone, between two batches, in one durable
    /// transaction (`purge.rs`).
    async fn purge(&self, channel: &str) -> Result<ChannelState, JournalError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(JournalError::Closed);
        }
        self.call(|reply| Request::Purge {
            channel: channel.to_owned(),
            reply,
        })
        .await
    }

    /// A purge's epoch forks at seq 0 from the store's epoch (the one a
    /// channel has before its first purge) or from the previous purge's.
    fn fork_of(&self, channel: &str, from: Epoch, to: Epoch) -> Option<u64> {
        let current = self.epochs.of(channel, self.epoch);
        (current == to && to != self.epoch && from != to).then_some(0)
    }

    async fn evict_expired(&self, now_ms: u64) -> Result<(), JournalError> {
        if self.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        match self.call(|reply| Request::Evict { now_ms, reply }).await {
            Err(JournalError::Closed) => Ok(()),
            other => other,
        }
    }

    async fn close(&self) -> Result<(), JournalError> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        match self.call(|reply| Request::Close { reply }).await {
            // The writer already stopped (after its own final commit).
            Err(JournalError::Closed) => Ok(()),
            other => other,
        }
    }
}

/// Creates the data directory `dir` if missing, durably: each directory
/// created gets its entry synced in its parent (so a power loss cannot take
/// away a directory whose files were already made durable).
///
/// # Errors
/// [`JournalError::Storage`] naming the directory that cannot be created or synced.
fn create_dir(dir: &Path) -> Result<(), JournalError> {
    if dir.is_dir() {
        return Ok(());
    }
    let fail = |what: &str, path: &Path, e: std::io::Error| {
        JournalError::Storage(format!("cannot {what} {}: {e}", path.display()))
    };
    // The missing ancestors, outermost first.
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at {
        if d.as_os_str().is_empty() || d.is_dir() {
            break;
        }
        missing.push(d);
        at = d.parent();
    }
    std::fs::create_dir_all(dir).map_err(|e| fail("create", dir, e))?;
    for d in missing.into_iter().rev() {
        let parent = match d.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        std::fs::File::open(parent)
            .and_then(|p| p.sync_all())
            .map_err(|e| fail("sync", parent, e))?;
    }
    Ok(())
}

impl Drop for EmbeddedJournal {
    fn drop(&mut self) {
        // Closing the inbox makes the writer checkpoint durably and stop.
        self.inbox.close();
        if let Some(writer) = self.writer.take() {
            if writer.thread().id() != std::thread::current().id() && writer.join().is_err() {
                tracing::error!("journal writer thread panicked");
            }
        }
    }
}
