//! How an [`crate::EmbeddedJournal`] is opened: retention and durability.

use gapless_core::Namespaces;
use std::sync::Arc;

/// The storage engine's page cache when not set ([`StoreOptions::cache_bytes`]):
/// 64 MiB (`gapless serve --journal-cache-bytes`).
pub const DEFAULT_CACHE_BYTES: usize = 64 << 20;

/// Options of [`crate::EmbeddedJournal::open`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// How long events are kept: each channel has the retention (count, age
    /// and byte limits) of its namespace. Applied with each append (count
    /// and bytes), every 250 ms (age), and when the store opens, to the
    /// events each channel already holds (count and bytes; age at the first
    /// eviction pass), so a lower limit applies across a restart.
    pub namespaces: Arc<Namespaces>,
    /// When an append is acknowledged relative to the disk.
    pub durability: Durability,
    /// Bytes that must stay available on the data directory's filesystem:
    /// below it appends fail with `JournalError::Full` (and succeed again
    /// once space is freed); 0 turns the check off. `gapless serve` default
    /// 67108864 (64 MiB, `--min-free-disk-bytes`).
    pub min_free_bytes: u64,
    /// Most bytes of journal file pages the storage engine (redb) keeps in
    /// memory: pages read (history and catch-up reads) and pages written but
    /// not yet on disk. Without a bound redb keeps up to 1 GiB, which a
    /// stream of large events fills. The cache never holds more than this;
    /// a smaller one only makes reads of old events go to the file (and the
    /// kernel's page cache) more often. Default [`DEFAULT_CACHE_BYTES`].
    pub cache_bytes: usize,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            namespaces: Arc::default(),
            durability: Durability::default(),
            min_free_bytes: 0,
            cache_bytes: DEFAULT_CACHE_BYTES,
        }
    }
}

/// When an append is acknowledged relative to the disk.
///
/// Appends are group-committed either way: one writer thread applies every
/// append pending at that moment in one transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// An append returns only after its transaction is fsynced (redb's
    /// immediate durability). A crash (`kill -9`, power loss on a disk that
    /// honours fsync) loses no acknowledged append. Concurrent publishers
    /// share each fsync.
    #[default]
    Sync,
    /// An append returns once its transaction is committed in memory (visible
    /// to reads and subscribers) without waiting for the disk; the writer
    /// makes everything durable at most about one second later, and on
    /// `close()` or drop.
    ///
    /// What a crash risks: a process crash or power loss loses the appends
    /// acknowledged in roughly the last second (everything after the last
    /// durable commit), although publishers were told they succeeded and
    /// subscribers may have received them. The file itself stays consistent:
    /// it reopens at the last durable commit, never half a transaction. So
    /// that lost seqs are never handed out again under the same epoch (a
    /// client that saw a lost event would otherwise silently skip its
    /// replacement), the first open after an Async run that did not shut down
    /// cleanly draws a new epoch: every client resuming then gets an `epoch`
    /// gap instead of wrong data.
    Async,
}
