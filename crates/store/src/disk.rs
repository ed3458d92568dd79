//! The free-space guard. Appends are refused with [`JournalError::Full`]
//! while the filesystem of the data directory has less than
//! `min_free_bytes` available, so the journal's own writes (commits,
//! checkpoints) never run into a full disk: reads and streams go on, and
//! publishing resumes by itself once space is freed (`docs/reliability.md`).
//!
//! The available space is read with `statvfs` at most every
//! [`RECHECK_MS`] while it is well above the reserve, and before every
//! append once it is within twice the reserve.

use gapless_core::journal::now_ms;
use gapless_core::JournalError;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// How long a reading well above the reserve is trusted, in milliseconds.
pub(crate) const RECHECK_MS: u64 = 100;

/// Watches the free space of one directory's filesystem.
#[derive(Debug)]
pub(crate) struct DiskGuard {
    dir: PathBuf,
    min_free: u64,
    available: AtomicU64,
    checked_ms: AtomicU64,
}

impl DiskGuard {
    /// A guard of `dir` keeping `min_free` bytes free (0: off).
    pub(crate) fn new(dir: PathBuf, min_free: u64) -> Self {
        DiskGuard {
            dir,
            min_free,
            available: AtomicU64::new(u64::MAX),
            checked_ms: AtomicU64::new(0),
        }
    }

    /// Whether an append may go ahead now.
    ///
    /// # Errors
    /// [`JournalError::Full`] when less than the reserve is available (or
    /// the space cannot be read, which is reported the same way).
    pub(crate) fn check(&self) -> Result<(), JournalError> {
        if self.min_free == 0 {
            return Ok(());
        }
        let now = now_ms();
        let cached = self.available.load(Ordering::Relaxed);
        let fresh = now.saturating_sub(self.checked_ms.load(Ordering::Relaxed)) < RECHECK_MS;
        let available = if fresh && cached / 2 >= self.min_free {
            cached
        } else {
            let read = fs4::available_space(&self.dir).map_err(|e| {
                JournalError::Full(format!(
                    "cannot read the free space of {}: {e}",
                    self.dir.display()
                ))
            })?;
            self.available.store(read, Ordering::Relaxed);
            self.checked_ms.store(now, Ordering::Relaxed);
            read
        };
        if available < self.min_free {
            return Err(JournalError::Full(format!(
                "{available} bytes are free under {}, below the reserve of {} bytes \
                 (--min-free-disk-bytes); nothing was stored. Free some space and retry \
                 (with the same Idempotency-Key): publishing resumes by itself",
                self.dir.display(),
                self.min_free
            )));
        }
        Ok(())
    }
}
