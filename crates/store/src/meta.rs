//! Store identity, read and written when the database is opened and closed:
//! the layout version, the epoch, and the marker of an `Async` run that has
//! not shut down cleanly (which forces a new epoch, see
//! [`crate::Durability::Async`]).

use crate::options::Durability;
use crate::tables::{
    storage, CHANNELS, CHANNEL_META, EVENTS, FORMAT_COMPATIBLE, FORMAT_VERSION, KEYS, KEY_ORDER,
    LOG, META, META_ASYNC_OPEN, META_EPOCH, META_FORMAT, META_WAL_APPLIED, META_WAL_LIVE,
};
use gapless_core::JournalError;
use gapless_protocol::Epoch;
use redb::{Database, ReadableDatabase, ReadableTable, WriteTransaction};

/// Creates the tables if missing, checks the layout version, and returns the
/// store's epoch: the stored one, or a new random one when the database is new
/// or the last `Async` run did not shut down cleanly; and whether it did not
/// (its write-ahead log may then end at a break in its commits, see
/// `wal::Log::after`). Commits durably.
pub(crate) fn init(db: &Database, durability: Durability) -> Result<(Epoch, bool), JournalError> {
    let txn = db.begin_write().map_err(storage)?;
    let (epoch, unclean) = {
        txn.open_table(CHANNELS).map_err(storage)?;
        txn.open_table(EVENTS).map_err(storage)?;
        txn.open_table(KEYS).map_err(storage)?;
        txn.open_table(KEY_ORDER).map_err(storage)?;
        txn.open_table(LOG).map_err(storage)?;
        // Format 4: a format-3 store gets it here, empty.
        txn.open_table(CHANNEL_META).map_err(storage)?;
        let mut meta = txn.open_table(META).map_err(storage)?;
        let get = |key: &str| -> Result<Option<u64>, JournalError> {
            Ok(meta.get(key).map_err(storage)?.map(|g| g.value()))
        };
        match get(META_FORMAT)? {
            None | Some(FORMAT_VERSION) => {}
            Some(v) if FORMAT_COMPATIBLE.contains(&v) => {}
            Some(v) => {
                return Err(JournalError::Storage(format!(
                    "journal format {v} is not supported (this build reads format {FORMAT_VERSION})"
                )))
            }
        }
        let stored = get(META_EPOCH)?.filter(|&e| e != 0);
        let unclean = get(META_ASYNC_OPEN)? == Some(1);
        let epoch = match stored {
            Some(e) if !unclean => e,
            _ => {
                if unclean {
                    tracing::warn!(
                        "journal was not closed cleanly while running with async durability; \
                         up to a second of acknowledged events may be lost, starting a new epoch"
                    );
                }
                fresh_epoch(stored)
            }
        };
        let async_open = u64::from(durability == Durability::Async);
        // An older format is upgraded once its steps succeed
        // ([`finish_upgrade`]): until then an older build still opens it.
        if get(META_FORMAT)?.is_none() {
            meta.insert(META_FORMAT, FORMAT_VERSION).map_err(storage)?;
        }
        meta.insert(META_EPOCH, epoch).map_err(storage)?;
        meta.insert(META_ASYNC_OPEN, async_open).map_err(storage)?;
        (Epoch(epoch), unclean)
    };
    txn.commit().map_err(storage)?;
    Ok((epoch, unclean))
}

/// Records, durably, that the store is of this build's format
/// (`meta["format"]`), once the steps that upgrade an older one (applying a
/// format-2 `log` table) have succeeded. Writes nothing if it already is.
pub(crate) fn finish_upgrade(db: &Database) -> Result<(), JournalError> {
    let stored = {
        let txn = db.begin_read().map_err(storage)?;
        let meta = txn.open_table(META).map_err(storage)?;
        let stored = meta.get(META_FORMAT).map_err(storage)?.map(|g| g.value());
        stored
    };
    if stored == Some(FORMAT_VERSION) {
        return Ok(());
    }
    let txn = db.begin_write().map_err(storage)?;
    txn.open_table(META)
        .map_err(storage)?
        .insert(META_FORMAT, FORMAT_VERSION)
        .map_err(storage)?;
    txn.commit().map_err(storage)
}

/// Whether the last run had `Async` durability and did not shut down cleanly
/// (read without changing anything: `gapless journal check`).
pub(crate) fn async_unclean(db: &Database) -> Result<bool, JournalError> {
    let txn = db.begin_read().map_err(storage)?;
    let meta = match txn.open_table(META) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(false),
        Err(e) => return Err(storage(e)),
    };
    let open = meta
        .get(META_ASYNC_OPEN)
        .map_err(storage)?
        .map(|g| g.value());
    Ok(open == Some(1))
}

/// Records, in `txn`, that this run shut down cleanly (to be committed
/// durably): its `Async` acknowledgements and its write-ahead log are all in
/// the tables.
pub(crate) fn mark_clean(txn: &WriteTransaction) -> Result<(), JournalError> {
    let mut meta = txn.open_table(META).map_err(storage)?;
    meta.insert(META_ASYNC_OPEN, 0).map_err(storage)?;
    meta.insert(META_WAL_LIVE, 0).map_err(storage)?;
    Ok(())
}

/// Whether a process had the write-ahead log open and did not stop cleanly.
pub(crate) fn wal_live(db: &Database) -> Result<bool, JournalError> {
    let txn = db.begin_read().map_err(storage)?;
    let meta = txn.open_table(META).map_err(storage)?;
    let live = meta.get(META_WAL_LIVE).map_err(storage)?.map(|g| g.value());
    Ok(live == Some(1))
}

/// Records, durably, that this process has its write-ahead log open.
pub(crate) fn set_wal_live(db: &Database) -> Result<(), JournalError> {
    let txn = db.begin_write().map_err(storage)?;
    set_wal_live_in(&txn, true)?;
    txn.commit().map_err(storage)
}

/// Records, durably, that the tables hold every commit of the write-ahead
/// log (if `wal_live` is set; else nothing is written).
pub(crate) fn clear_wal_live(db: &Database) -> Result<(), JournalError> {
    if !wal_live(db)? {
        return Ok(());
    }
    let txn = db.begin_write().map_err(storage)?;
    set_wal_live_in(&txn, false)?;
    txn.commit().map_err(storage)
}

/// Records, in `txn`, whether a process has the write-ahead log open with
/// commits the tables may lack (`meta["wal_live"]`).
pub(crate) fn set_wal_live_in(txn: &WriteTransaction, live: bool) -> Result<(), JournalError> {
    txn.open_table(META)
        .map_err(storage)?
        .insert(META_WAL_LIVE, u64::from(live))
        .map_err(storage)?;
    Ok(())
}

/// The last WAL frame the tables hold (`wal.rs`; 0 before any).
pub(crate) fn wal_applied(db: &Database) -> Result<u64, JournalError> {
    let txn = db.begin_read().map_err(storage)?;
    let meta = txn.open_table(META).map_err(storage)?;
    let applied = meta
        .get(META_WAL_APPLIED)
        .map_err(storage)?
        .map_or(0, |g| g.value());
    Ok(applied)
}

/// Records, in `txn`, that the tables hold every WAL frame up to `lsn`.
pub(crate) fn set_wal_applied(txn: &WriteTransaction, lsn: u64) -> Result<(), JournalError> {
    let mut meta = txn.open_table(META).map_err(storage)?;
    meta.insert(META_WAL_APPLIED, lsn).map_err(storage)?;
    Ok(())
}

/// A random nonzero epoch different from `previous`.
pub(crate) fn fresh_epoch(previous: Option<u64>) -> u64 {
    loop {
        let e = rand::random::<u64>();
        if e != 0 && Some(e) != previous {
            return e;
        }
    }
}
