//! Opening the journal file, and telling a damaged one apart.
//!
//! A file that was truncated or overwritten must never be served with wrong
//! content, and must not crash the server. [`open_db`] opens it (the storage
//! engine may panic on some damaged pages; that is caught), then runs the
//! engine's integrity check, which verifies the checksum of every page
//! reachable from the last commit. A damaged file is refused with
//! [`JournalError::Storage`] naming the file, saying what is wrong in plain
//! words and what to do; the engine's own words (a caught panic's text
//! among them) are logged at debug level only. [`check`] does the same and
//! also decodes every row and checks the `purged` and `channel_meta`
//! tables: the `gapless journal check` command.

use crate::tables::{
    decode_event, row_events, CHANNELS, CHANNEL_META, EVENTS, LOG, META, META_EPOCH, PURGED,
};
use gapless_core::JournalError;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

/// Opens (creating it if missing) the journal file at `path`, refusing a
/// damaged one. The storage engine keeps at most `cache_bytes` of the file's
/// pages in memory ([`crate::StoreOptions::cache_bytes`]).
///
/// # Errors
/// [`JournalError::Storage`]: the file is damaged (the message names it and
/// says what to do), held by another process, or unreadable.
pub(crate) fn open_db(path: &Path, cache_bytes: usize) -> Result<Database, JournalError> {
    let opened = quietly(|| Database::builder().set_cache_size(cache_bytes).create(path));
    let mut db = match opened {
        Err(panic) => return Err(damaged(path, Found::Panic(panic))),
        Ok(Err(redb::DatabaseError::DatabaseAlreadyOpen)) => {
            return Err(JournalError::Storage(format!(
                "{} is open in another process: is another gapless using this directory? \
                 stop it, or pass another --data-dir, or --memory",
                path.display()
            )))
        }
        Ok(Err(redb::DatabaseError::Storage(redb::StorageError::Corrupted(why)))) => {
            return Err(damaged(path, Found::Engine(why)))
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
        Ok(Err(e)) => return Err(damaged(path, Found::Engine(e.to_string()))),
        Err(panic) => return Err(damaged(path, Found::Panic(panic))),
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
    /// Commits logged but not yet applied to the tables (applied at the next
    /// open): rows of a format-2 `log` table, and frames of the write-ahead log.
    pub logged_commits: u64,
    /// Channels purged at least once (rows of the `purged` table: each such
    /// channel has an epoch of its own).
    pub purged: u64,
    /// Channels with metadata (rows of the `channel_meta` table, each
    /// decoded; none in a store from before metadata). Changes only the
    /// write-ahead log holds are not counted.
    pub with_meta: u64,
}

/// Checks the journal in `dir` without serving it: the file opens, every
/// page's checksum verifies, every event row decodes, every channel holds
/// exactly the events from its floor to its head (its log aside), the
/// write-ahead log holds every commit after the tables' last, and every
/// row of the `purged` table (channel -> the epoch its last purge began,
/// `purge.rs`) names a channel of the `channels` table with an epoch of its
/// own: not 0, not the store's (a purge always draws another), and every
/// row of the `channel_meta` table decodes and names a channel of the
/// `channels` table.
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
    // Reading every row once gains nothing from a large cache.
    let db = open_db(&path, crate::options::DEFAULT_CACHE_BYTES)?;
    let mut report = quietly(AssertUnwindSafe(|| rows(&db)))
        .map_err(|panic| damaged(&path, Found::Panic(panic)))?
        .map_err(|found| damaged(&path, found))?;
    // The write-ahead log's commits after the tables' last: they must
    // follow it without a gap, refused exactly as the start refuses them
    // (`checkpoint::recover`).
    let applied = crate::meta::wal_applied(&db)?;
    let log = crate::wal::read(dir)?;
    let lenient = crate::meta::async_unclean(&db)?;
    let live = log.generation == 0 && crate::meta::wal_live(&db)?;
    report.logged_commits += log.pending(applied, live, dir, lenient)?.len() as u64;
    Ok(report)
}

/// The engine's error while reading rows, as damage found.
fn engine(e: impl std::fmt::Display) -> Found {
    Found::Engine(e.to_string())
}

fn rows(db: &Database) -> Result<CheckReport, Found> {
    let txn = db.begin_read().map_err(engine)?;
    let channels = txn.open_table(CHANNELS).map_err(engine)?;
    let events = txn.open_table(EVENTS).map_err(engine)?;
    let logged_commits = match txn.open_table(LOG) {
        Ok(t) => t.len().map_err(engine)?,
        Err(redb::TableError::TableDoesNotExist(_)) => 0,
        Err(e) => return Err(engine(e)),
    };
    let purged = purged_rows(&txn, &channels)?;
    let with_meta = meta_rows(&txn, &channels)?;
    let mut report = CheckReport {
        channels: 0,
        events: 0,
        logged_commits,
        purged,
        with_meta,
    };
    for row in channels.iter().map_err(engine)? {
        let (name, value) = row.map_err(engine)?;
        let (id, head, floor, _) = value.value();
        let name = name.value().to_owned();
        report.channels += 1;
        let mut expect = floor;
        for row in events.range((id, 0)..=(id, u64::MAX)).map_err(engine)? {
            let (key, bytes) = row.map_err(engine)?;
            let (_, first) = key.value();
            for event in row_events(first, bytes.value()) {
                let (seq, event) = event.map_err(|e| {
                    Found::Content(format!(
                        "the row at seq {first} of channel {name:?} does not decode ({e})"
                    ))
                })?;
                decode_event(event).map_err(|e| {
                    Found::Content(format!(
                        "the event at seq {seq} of channel {name:?} does not decode ({e})"
                    ))
                })?;
                // A chunk may start below the floor: those events are gone.
                if seq < floor {
                    continue;
                }
                if seq != expect {
                    return Err(Found::Content(format!(
                        "the events of channel {name:?} have seq {seq} where {expect} was expected \
                         (floor {floor}, head {head})"
                    )));
                }
                expect += 1;
                report.events += 1;
            }
        }
        if logged_commits == 0 && expect != head + 1 {
            return Err(Found::Content(format!(
                "the events of channel {name:?} end at seq {} but its head is {head}",
                expect.saturating_sub(1)
            )));
        }
    }
    Ok(report)
}

/// Checks the `purged` table (absent: a store never purged) against the
/// `channels` table and the store's epoch; returns its number of rows.
fn purged_rows(
    txn: &redb::ReadTransaction,
    channels: &redb::ReadOnlyTable<&str, (u64, u64, u64, u64)>,
) -> Result<u64, Found> {
    let table = match txn.open_table(PURGED) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(engine(e)),
    };
    let store_epoch = match txn.open_table(META) {
        Ok(meta) => meta.get(META_EPOCH).map_err(engine)?.map(|v| v.value()),
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(e) => return Err(engine(e)),
    };
    let mut n = 0;
    for row in table.iter().map_err(engine)? {
        let (name, epoch) = row.map_err(engine)?;
        let (name, epoch) = (name.value().to_owned(), epoch.value());
        if channels.get(name.as_str()).map_err(engine)?.is_none() {
            return Err(Found::Content(format!(
                "the purged table names channel {name:?}, which the channels table does not \
                 have (a purge keeps the channel's row, reset to head 0)"
            )));
        }
        if epoch == 0 || Some(epoch) == store_epoch {
            return Err(Found::Content(format!(
                "the purge epoch of channel {name:?} is {epoch:016x}, {}: a purge draws an \
                 epoch of the channel's own",
                if epoch == 0 {
                    "which is no epoch"
                } else {
                    "the store's own"
                }
            )));
        }
        n += 1;
    }
    Ok(n)
}

/// Checks the `channel_meta` table (absent: a store from before metadata):
/// every row decodes and names a channel of the `channels` table (a change
/// always gives its channel a row). Returns its number of rows.
fn meta_rows(
    txn: &redb::ReadTransaction,
    channels: &redb::ReadOnlyTable<&str, (u64, u64, u64, u64)>,
) -> Result<u64, Found> {
    let table = match txn.open_table(CHANNEL_META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(engine(e)),
    };
    let mut n = 0;
    for row in table.iter().map_err(engine)? {
        let (name, json) = row.map_err(engine)?;
        let name = name.value().to_owned();
        if let Err(e) = gapless_core::meta::ChannelMeta::decode(json.value()) {
            return Err(Found::Content(format!(
                "the metadata of channel {name:?} does not decode ({e})"
            )));
        }
        if channels.get(name.as_str()).map_err(engine)?.is_none() {
            return Err(Found::Content(format!(
                "the channel_meta table names channel {name:?}, which the channels table does \
                 not have (a change always gives its channel a row)"
            )));
        }
        n += 1;
    }
    Ok(n)
}

/// What was found wrong with a journal file.
#[derive(Debug)]
enum Found {
    /// The storage engine panicked on it (the panic's text).
    Panic(String),
    /// The storage engine refused it (its message).
    Engine(String),
    /// Its rows, read by the engine without complaint, are not a journal (our words).
    Content(String),
}

/// The error for a damaged file: which file, what is wrong in plain words,
/// what to do. The engine's own words, a panic's text among them, go to the
/// debug log only: they name pages and layouts, not what to do.
fn damaged(path: &Path, found: Found) -> JournalError {
    let what = match &found {
        Found::Content(words) => words.clone(),
        Found::Panic(detail) | Found::Engine(detail) => {
            tracing::debug!(file = %path.display(), ?found, "the storage engine's words on a damaged journal");
            plain(path, detail, matches!(found, Found::Panic(_)))
        }
    };
    let dir = path
        .parent()
        .map_or_else(|| ".".to_owned(), |d| d.display().to_string());
    JournalError::Storage(format!(
        "the journal file {} is damaged: {what}. To go on, with the server stopped: \
         `gapless journal check --data-dir {dir}` tells whether it is whole; restore the file \
         from a backup, or move it away (for example to {}.damaged) to start with an empty \
         journal, and clients resuming are told so (gap, reason epoch). (RUST_LOG=debug shows \
         the storage engine's own words.)",
        path.display(),
        path.display()
    ))
}

/// What is wrong, in plain words, from the engine's `detail` (a panic's text
/// if `panicked`). Known shapes: a file cut short (the engine says
/// `truncated`, with `file_len=` and `layout_len=`), pages whose checksums or
/// structure do not verify.
fn plain(path: &Path, detail: &str, panicked: bool) -> String {
    let number = |key: &str| -> Option<u64> {
        let at = detail.find(key)? + key.len();
        let digits: String = detail[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    if detail.contains("truncated") {
        let len = number("file_len=").or_else(|| std::fs::metadata(path).ok().map(|m| m.len()));
        let sizes = match (len, number("layout_len=")) {
            (Some(len), Some(need)) => format!(" ({len} bytes of the {need} it should have)"),
            (Some(len), None) => format!(" ({len} bytes)"),
            _ => String::new(),
        };
        format!(
            "it is shorter than the data it records{sizes}: it was cut off, as by a copy \
             that did not finish or a disk that filled up"
        )
    } else if panicked {
        "a page in it is not what was written there: bytes in it were overwritten or lost"
            .to_owned()
    } else {
        "its pages do not pass their checksum and structure checks: bytes in it were \
         overwritten or lost"
            .to_owned()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const STORE_EPOCH: u64 = 0x1111;

    /// A journal file with channels `a` (purged at epoch 0x2222) and `b`,
    /// no events, plus the `purged` rows `extra`.
    fn journal(dir: &Path, extra: &[(&str, u64)]) {
        let db = Database::create(dir.join(crate::FILE_NAME)).expect("create");
        let txn = db.begin_write().expect("write");
        {
            let mut meta = txn.open_table(META).expect("meta");
            meta.insert(crate::tables::META_FORMAT, crate::tables::FORMAT_VERSION)
                .expect("format");
            meta.insert(META_EPOCH, STORE_EPOCH).expect("epoch");
            let mut channels = txn.open_table(CHANNELS).expect("channels");
            channels.insert("a", (1, 0, 1, 5)).expect("a");
            channels.insert("b", (2, 0, 1, 5)).expect("b");
            txn.open_table(EVENTS).expect("events");
            let mut purged = txn.open_table(PURGED).expect("purged");
            purged.insert("a", 0x2222).expect("purged a");
            for (name, epoch) in extra {
                purged.insert(*name, *epoch).expect("purged row");
            }
        }
        txn.commit().expect("commit");
    }

    fn checked(extra: &[(&str, u64)]) -> Result<CheckReport, String> {
        let dir = tempfile::tempdir().expect("tempdir");
        journal(dir.path(), extra);
        check(dir.path()).map_err(|e| e.to_string())
    }

    #[test]
    fn check_counts_purged_channels_and_refuses_bad_purged_rows() {
        let ok = checked(&[]).expect("whole");
        assert_eq!((ok.channels, ok.purged), (2, 1), "{ok:?}");
        let orphan = checked(&[("gone", 0x3333)]).expect_err("a row without its channel");
        assert!(
            orphan.contains("purged table names channel \"gone\""),
            "{orphan}"
        );
        let same = checked(&[("b", STORE_EPOCH)]).expect_err("the store's epoch");
        assert!(
            same.contains("\"b\"") && same.contains("the store's own"),
            "{same}"
        );
        let zero = checked(&[("b", 0)]).expect_err("epoch 0");
        assert!(zero.contains("no epoch"), "{zero}");
    }
}
