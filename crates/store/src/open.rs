//! Opening the journal file, and telling a damaged one apart.
//!
//! A file that was truncated or overwritten must never be served with wrong
//! content, and must not crash the server. [`open_db`] opens it (the storage
//! engine may panic on some damaged pages; that is caught), then runs the
//! engine's integrity check, which verifies the checksum of every page
//! reachable from the last commit. A damaged file is refused with
//! [`JournalError::Storage`] naming the file and what to do. [`check`] does the
//! same and also decodes every row: the `gapless journal check` command.

use crate::tables::{decode_event, storage, CHANNELS, EVENTS, LOG};
use gapless_core::JournalError;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

/// Opens (creating it if missing) the journal file at `path`, refusing a
/// damaged one.
///
/// # Errors
/// [`JournalError::Storage`]: the file is damaged (the message names it and
/// says what to do), held by another process, or unreadable.
pub(crate) fn open_db(path: &Path) -> Result<Database, JournalError> {
    let opened = quietly(|| Database::create(path));
    let mut db = match opened {
        Err(panic) => return Err(damaged(path, &panic)),
        Ok(Err(redb::DatabaseError::DatabaseAlreadyOpen)) => {
            return Err(JournalError::Storage(format!(
                "{} is open in another process: is another gapless using this directory? \
                 stop it, or pass another --data-dir, or --memory",
                path.display()
            )))
        }
        Ok(Err(redb::DatabaseError::Storage(redb::StorageError::Corrupted(why)))) => {
            return Err(damaged(path, &why))
        }
        Ok(Err(e)) => {
            return Err(JournalError::Storage(format!(
                "cannot open {}: {e}",
                path.display()
            )))
        }
        Ok(Ok(db)) => db,
    };
    match quietly(AssertUnwindSafe(|| db.check_integrity())) {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => tracing::warn!(
            file = %path.display(),
            "the journal was not closed cleanly; its allocation state was rebuilt"
        ),
        Ok(Err(e)) => return Err(damaged(path, &e.to_string())),
        Err(panic) => return Err(damaged(path, &panic)),
    }
    Ok(db)
}

/// What [`check`] found in a whole journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckReport {
    /// Channels (sessions included).
    pub channels: u64,
    /// Retained events, all decoded.
    pub events: u64,
    /// Commits logged but not yet applied to the tables (applied at the next open).
    pub logged_commits: u64,
}

/// Checks the journal in `dir` without serving it: the file opens, every
/// page's checksum verifies, every event row decodes, and every channel
/// holds exactly the rows from its floor to its head (its log aside).
///
/// # Errors
/// [`JournalError::Storage`] saying what is damaged and where.
pub fn check(dir: &Path) -> Result<CheckReport, JournalError> {
    let path = dir.join(crate::FILE_NAME);
    if !path.exists() {
        return Err(JournalError::Storage(format!(
            "no journal at {} (is --data-dir right?)",
            path.display()
        )));
    }
    let db = open_db(&path)?;
    let report = quietly(AssertUnwindSafe(|| rows(&db)))
        .map_err(|panic| damaged(&path, &panic))?
        .map_err(|e| damaged(&path, &e.to_string()))?;
    Ok(report)
}

fn rows(db: &Database) -> Result<CheckReport, JournalError> {
    let txn = db.begin_read().map_err(storage)?;
    let channels = txn.open_table(CHANNELS).map_err(storage)?;
    let events = txn.open_table(EVENTS).map_err(storage)?;
    let logged_commits = match txn.open_table(LOG) {
        Ok(t) => t.len().map_err(storage)?,
        Err(redb::TableError::TableDoesNotExist(_)) => 0,
        Err(e) => return Err(storage(e)),
    };
    let mut report = CheckReport {
        channels: 0,
        events: 0,
        logged_commits,
    };
    for row in channels.iter().map_err(storage)? {
        let (name, value) = row.map_err(storage)?;
        let (id, head, floor, _) = value.value();
        let name = name.value().to_owned();
        report.channels += 1;
        let mut expect = floor;
        for ev in events.range((id, 0)..=(id, u64::MAX)).map_err(storage)? {
            let (key, bytes) = ev.map_err(storage)?;
            let (_, seq) = key.value();
            decode_event(bytes.value())
                .map_err(|e| JournalError::Storage(format!("channel {name:?} seq {seq}: {e}")))?;
            if seq != expect {
                return Err(JournalError::Storage(format!(
                    "channel {name:?}: seq {seq} found where {expect} was expected \
                     (floor {floor}, head {head})"
                )));
            }
            expect += 1;
            report.events += 1;
        }
        if logged_commits == 0 && expect != head + 1 {
            return Err(JournalError::Storage(format!(
                "channel {name:?}: rows end at seq {} but its head is {head}",
                expect.saturating_sub(1)
            )));
        }
    }
    Ok(report)
}

/// The error for a damaged file: which file, what is wrong, what to do.
fn damaged(path: &Path, why: &str) -> JournalError {
    JournalError::Storage(format!(
        "the journal file {} is damaged ({why}). Restore it from a backup, or move it \
         aside to start with an empty journal (clients resuming are then told: gap, \
         reason epoch). `gapless journal check --data-dir DIR` tells whether a journal is whole",
        path.display()
    ))
}

/// Runs `f`, turning a panic into its message, without the panic printed
/// (the storage engine panics on some damaged pages; that is an answer here,
/// not a crash).
fn quietly<T>(f: impl FnOnce() -> T + std::panic::UnwindSafe) -> Result<T, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let out = catch_unwind(f);
    std::panic::set_hook(hook);
    out.map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "the storage engine failed on a damaged page".to_owned())
    })
}
