//! Writer tests that need its internals: a failed commit loses nothing and
//! skips no seq.

use super::{Start, Writer};
use crate::cache::Channels;
use crate::options::{Durability, StoreOptions};
use crate::overlay::Overlay;
use crate::request::{Inbox, Reply, Request};
use crate::{meta, reader, wal};
use gapless_core::journal::NoSink;
use gapless_core::{Appended, JournalError, Retention};
use gapless_protocol::NewEvent;
use redb::Database;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::oneshot;

fn append(inbox: &Inbox, channel: &str, key: Option<&str>) -> Result<Appended, JournalError> {
    let (reply, rx): (Reply<Appended>, _) = oneshot::channel();
    let events = vec![NewEvent {
        event_type: None,
        data: "x".into(),
    }];
    let request = Request::Append {
        channel: channel.into(),
        events,
        key: key.map(str::to_owned),
        reply,
    };
    inbox.send(request).map_err(|_| JournalError::Closed)?;
    rx.blocking_recv().map_err(|_| JournalError::Closed)?
}

#[test]
fn a_failed_commit_skips_and_reuses_no_seq() -> Result<(), JournalError> {
    let dir = tempfile::tempdir().map_err(crate::tables::storage)?;
    let db = Database::create(dir.path().join("j.redb")).map_err(crate::tables::storage)?;
    let options = StoreOptions {
        namespaces: Arc::new(
            Retention {
                max_events: 2,
                max_age_ms: 60_000,
                max_bytes: 0,
            }
            .into(),
        ),
        durability: Durability::Sync,
        min_free_bytes: 0,
        ..StoreOptions::default()
    };
    let (epoch, _) = meta::init(&db, options.durability)?;
    let cache = Channels::load(&db, &options.namespaces)?;
    let db = Arc::new(db);
    let inbox = Arc::new(Inbox::default());
    let overlay = Arc::new(Overlay::default());
    let writer = Writer::start(
        db.clone(),
        Start {
            inbox: inbox.clone(),
            sink: Arc::new(NoSink),
            epoch,
            options,
            cache,
            overlay: overlay.clone(),
            wal: wal::Wal::open(dir.path(), 0, 1)?,
            applied: 0,
            checkpoint_bytes: 1 << 20,
            epochs: Arc::default(),
        },
    )
    .map_err(crate::tables::storage)?;
    let fail = writer.fail_next_commit.clone();
    let handle = writer.spawn().map_err(crate::tables::storage)?;
    let tx = &*inbox;

    assert_eq!(append(tx, "a", None)?.first_seq, 1);
    assert_eq!(append(tx, "a", Some("k"))?.first_seq, 2);
    fail.store(true, Ordering::SeqCst);
    // Fails after applying: seq 3, a new channel id for "b", count eviction, a key.
    assert!(matches!(
        append(tx, "b", Some("k2")),
        Err(JournalError::Storage(_))
    ));
    fail.store(true, Ordering::SeqCst);
    assert!(matches!(
        append(tx, "a", Some("k3")),
        Err(JournalError::Storage(_))
    ));
    let state = reader::state(&db, &overlay, epoch, "a")?;
    assert_eq!((state.floor, state.head), (1, 2));
    // Nothing was skipped, and the failed appends' keys were not kept.
    let again = append(tx, "a", Some("k3"))?;
    assert_eq!((again.first_seq, again.duplicate), (3, false));
    assert!(append(tx, "a", Some("k"))?.duplicate);
    assert_eq!(append(tx, "b", Some("k2"))?.first_seq, 1);
    let page = reader::page(
        &db,
        &overlay,
        epoch,
        "a",
        0,
        reader::Bound {
            limit: 10,
            max_bytes: usize::MAX,
        },
    )?;
    let seqs: Vec<u64> = page.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [2, 3]);
    assert_eq!(
        reader::page(
            &db,
            &overlay,
            epoch,
            "b",
            0,
            reader::Bound {
                limit: 10,
                max_bytes: usize::MAX
            }
        )?
        .events
        .len(),
        1
    );

    inbox.close();
    handle
        .join()
        .map_err(|_| JournalError::Storage("writer panicked".into()))?;
    Ok(())
}

#[test]
fn a_failed_fdatasync_fails_its_commit_and_loses_or_reuses_nothing() -> Result<(), JournalError> {
    let dir = tempfile::tempdir().map_err(crate::tables::storage)?;
    let db = Database::create(dir.path().join("j.redb")).map_err(crate::tables::storage)?;
    let options = StoreOptions {
        durability: Durability::Sync,
        ..StoreOptions::default()
    };
    let (epoch, _) = meta::init(&db, options.durability)?;
    let cache = Channels::load(&db, &options.namespaces)?;
    let db = Arc::new(db);
    let inbox = Arc::new(Inbox::default());
    let overlay = Arc::new(Overlay::default());
    let writer = Writer::start(
        db.clone(),
        Start {
            inbox: inbox.clone(),
            sink: Arc::new(NoSink),
            epoch,
            options,
            cache,
            overlay: overlay.clone(),
            wal: wal::Wal::open(dir.path(), 0, 1)?,
            applied: 0,
            checkpoint_bytes: 1 << 20,
            epochs: Arc::default(),
        },
    )
    .map_err(crate::tables::storage)?;
    let fail = writer.fail_next_sync.clone();
    let handle = writer.spawn().map_err(crate::tables::storage)?;
    let tx = &*inbox;

    assert_eq!(append(tx, "a", None)?.first_seq, 1);
    fail.store(true, Ordering::SeqCst);
    assert!(matches!(
        append(tx, "a", Some("k")),
        Err(JournalError::Storage(_))
    ));
    // Recovered before the next batch: the failed append's seq and key are free.
    let again = append(tx, "a", Some("k"))?;
    assert_eq!((again.first_seq, again.duplicate), (2, false));
    assert!(append(tx, "a", Some("k"))?.duplicate);
    assert_eq!(append(tx, "b", None)?.first_seq, 1);
    let bound = reader::Bound {
        limit: 10,
        max_bytes: usize::MAX,
    };
    let page = reader::page(&db, &overlay, epoch, "a", 0, bound)?;
    let seqs: Vec<u64> = page.events.iter().map(|e| e.seq).collect();
    assert_eq!((seqs, page.state.head), (vec![1, 2], 2));
    inbox.close();
    handle
        .join()
        .map_err(|_| JournalError::Storage("writer panicked".into()))?;
    // The tables hold exactly what was acknowledged, and the WAL adds nothing.
    let (applied, _) = crate::checkpoint::recover(&db, dir.path(), false)?;
    assert_eq!(applied, meta::wal_applied(&db)?);
    let empty = Arc::new(Overlay::default());
    let page = reader::page(&db, &empty, epoch, "a", 0, bound)?;
    let seqs: Vec<u64> = page.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2]);
    Ok(())
}

/// A crash while the store opens, after it applied the log of an unclean
/// stop and emptied the WAL files but before their new header: the next
/// start opens (the tables hold everything; nothing is "missing").
#[test]
fn a_crash_while_the_wal_is_emptied_at_open_does_not_block_the_next_start(
) -> Result<(), JournalError> {
    use crate::EmbeddedJournal;
    use gapless_core::Journal;
    let dir = tempfile::tempdir().map_err(crate::tables::storage)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(crate::tables::storage)?;
    let options = || StoreOptions {
        durability: Durability::Sync,
        min_free_bytes: 0,
        ..StoreOptions::default()
    };
    let open = || EmbeddedJournal::open(dir.path(), options(), Arc::new(NoSink));
    let j = open()?;
    rt.block_on(async {
        for data in ["1", "2", "3"] {
            let events = vec![NewEvent {
                event_type: None,
                data: data.into(),
            }];
            j.append("a", events, None).await?;
        }
        j.close().await
    })?;
    drop(j);
    {
        // As an unclean stop leaves it: the log marked live.
        let db =
            Database::open(dir.path().join(crate::FILE_NAME)).map_err(crate::tables::storage)?;
        meta::set_wal_live(&db)?;
    }
    wal::FAIL_OPEN_AFTER_EMPTYING.with(|f| f.set(true));
    assert!(open().is_err(), "the injected failure");
    let j = open()?;
    let page = rt.block_on(j.read("a", 0, 10))?;
    let seqs: Vec<u64> = page.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
    rt.block_on(j.close())
}

/// A writer over a new store in `dir`, not yet spawned.
fn writer_in(
    dir: &std::path::Path,
    durability: Durability,
) -> Result<(Arc<Database>, Arc<Inbox>, gapless_protocol::Epoch, Writer), JournalError> {
    let db = Database::create(dir.join("j.redb")).map_err(crate::tables::storage)?;
    let options = StoreOptions {
        durability,
        min_free_bytes: 0,
        ..StoreOptions::default()
    };
    let (epoch, _) = meta::init(&db, options.durability)?;
    let cache = Channels::load(&db, &options.namespaces)?;
    let db = Arc::new(db);
    let inbox = Arc::new(Inbox::default());
    let writer = Writer::start(
        db.clone(),
        Start {
            inbox: inbox.clone(),
            sink: Arc::new(NoSink),
            epoch,
            options,
            cache,
            overlay: Arc::new(Overlay::default()),
            wal: wal::Wal::open(dir, 0, 1)?,
            applied: 0,
            checkpoint_bytes: 1 << 20,
            epochs: Arc::default(),
        },
    )
    .map_err(crate::tables::storage)?;
    Ok((db, inbox, epoch, writer))
}

/// The events of `channel` in the tables after a restart's recovery.
fn after_restart(
    db: &Database,
    dir: &std::path::Path,
    epoch: gapless_protocol::Epoch,
    channel: &str,
) -> Result<Vec<u64>, JournalError> {
    crate::checkpoint::recover(db, dir, false)?;
    let bound = reader::Bound {
        limit: 100,
        max_bytes: usize::MAX,
    };
    let page = reader::page(db, &Overlay::default(), epoch, channel, 0, bound)?;
    Ok(page.events.iter().map(|e| e.seq).collect())
}

/// A batch whose `fdatasync` failed (its publisher got an error) is not in
/// the journal after a restart, even when the store stops right after it.
#[test]
fn a_batch_whose_fdatasync_failed_does_not_reappear_after_a_restart() -> Result<(), JournalError> {
    let dir = tempfile::tempdir().map_err(crate::tables::storage)?;
    let (db, inbox, epoch, writer) = writer_in(dir.path(), Durability::Sync)?;
    let fail = writer.fail_next_sync.clone();
    let handle = writer.spawn().map_err(crate::tables::storage)?;
    assert_eq!(append(&inbox, "a", None)?.first_seq, 1);
    fail.store(true, Ordering::SeqCst);
    assert!(matches!(
        append(&inbox, "a", None),
        Err(JournalError::Storage(_))
    ));
    inbox.close();
    handle
        .join()
        .map_err(|_| JournalError::Storage("writer panicked".into()))?;
    assert_eq!(after_restart(&db, dir.path(), epoch, "a")?, [1]);
    Ok(())
}

/// The same for a failed WAL write.
#[test]
fn a_batch_whose_wal_write_failed_does_not_reappear_after_a_restart() -> Result<(), JournalError> {
    let dir = tempfile::tempdir().map_err(crate::tables::storage)?;
    let (db, inbox, epoch, writer) = writer_in(dir.path(), Durability::Sync)?;
    let fail = writer.fail_next_commit.clone();
    let handle = writer.spawn().map_err(crate::tables::storage)?;
    assert_eq!(append(&inbox, "a", None)?.first_seq, 1);
    assert_eq!(append(&inbox, "a", None)?.first_seq, 2);
    fail.store(true, Ordering::SeqCst);
    assert!(append(&inbox, "a", None).is_err());
    inbox.close();
    handle
        .join()
        .map_err(|_| JournalError::Storage("writer panicked".into()))?;
    assert_eq!(after_restart(&db, dir.path(), epoch, "a")?, [1, 2]);
    Ok(())
}

/// Async: a failed flush `fdatasync` is not retried on the same frames (a
/// retry may report success without writing them): the acknowledged
/// commits go to the tables in a durable transaction instead.
#[test]
fn a_failed_async_flush_applies_the_commits_instead_of_retrying() -> Result<(), JournalError> {
    let dir = tempfile::tempdir().map_err(crate::tables::storage)?;
    let (db, inbox, epoch, writer) = writer_in(dir.path(), Durability::Async)?;
    let fail = writer.fail_next_sync.clone();
    let flushes = writer.flushes.clone();
    let handle = writer.spawn().map_err(crate::tables::storage)?;
    fail.store(true, Ordering::SeqCst);
    assert_eq!(append(&inbox, "a", None)?.first_seq, 1);
    assert_eq!(append(&inbox, "a", None)?.first_seq, 2);
    // The flush (about a second later) fails; a retry would come a second
    // after that.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while fail.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert_eq!(
        flushes.load(Ordering::SeqCst),
        0,
        "the failed fdatasync was retried on the same frames"
    );
    assert!(
        meta::wal_applied(&db)? >= 2,
        "the acknowledged commits are in the tables"
    );
    // Appends go on, in a new chain.
    assert_eq!(append(&inbox, "a", None)?.first_seq, 3);
    inbox.close();
    handle
        .join()
        .map_err(|_| JournalError::Storage("writer panicked".into()))?;
    assert_eq!(after_restart(&db, dir.path(), epoch, "a")?, [1, 2, 3]);
    Ok(())
}

/// Async: a writer that always finds requests queued (it never waits for
/// the flush deadline) still syncs the WAL about once a second.
#[test]
fn a_saturated_async_writer_still_flushes() -> Result<(), JournalError> {
    let dir = tempfile::tempdir().map_err(crate::tables::storage)?;
    let (_db, inbox, _epoch, writer) = writer_in(dir.path(), Durability::Async)?;
    let flushes = writer.flushes.clone();
    let handle = writer.spawn().map_err(crate::tables::storage)?;
    let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let mut flushed_while_saturated = 0;
    while std::time::Instant::now() < until {
        // Keep the inbox from ever running dry (replies are not awaited).
        while inbox.queued() < 2000 {
            for _ in 0..100 {
                let (reply, _) = oneshot::channel();
                let request = Request::Append {
                    channel: "a".into(),
                    events: vec![NewEvent {
                        event_type: None,
                        data: "x".into(),
                    }],
                    key: None,
                    reply,
                };
                inbox.send(request).map_err(|_| JournalError::Closed)?;
            }
        }
        flushed_while_saturated = flushes.load(Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    inbox.close();
    handle
        .join()
        .map_err(|_| JournalError::Storage("writer panicked".into()))?;
    assert!(
        flushed_while_saturated >= 1,
        "no flush in 3 s of a saturated async writer"
    );
    Ok(())
}

/// A read racing a purge never pairs the channel's old epoch with its
/// purged state (or the reverse): per epoch, the heads a reader sees never
/// go down, and the store's epoch is never seen without its events.
#[test]
fn reads_racing_purges_pair_each_state_with_its_own_epoch() -> Result<(), JournalError> {
    use crate::EmbeddedJournal;
    use gapless_core::Journal;
    use std::collections::HashMap;
    let dir = tempfile::tempdir().map_err(crate::tables::storage)?;
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(crate::tables::storage)
    };
    let options = StoreOptions {
        durability: Durability::Sync,
        min_free_bytes: 0,
        ..StoreOptions::default()
    };
    let j = Arc::new(EmbeddedJournal::open(
        dir.path(),
        options,
        Arc::new(NoSink),
    )?);
    let one = || {
        vec![NewEvent {
            event_type: None,
            data: "x".into(),
        }]
    };
    let main = rt()?;
    main.block_on(j.append("a", one(), None))?;
    let store = j.epoch();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (reader, done) = (j.clone(), stop.clone());
    let watcher = std::thread::spawn(move || -> Result<Vec<String>, JournalError> {
        let rt = rt()?;
        let mut highest: HashMap<u64, u64> = HashMap::new();
        let mut wrong = Vec::new();
        while !done.load(Ordering::SeqCst) {
            for page in [false, true] {
                let (epoch, head) = if page {
                    let p = rt.block_on(reader.read("a", 0, 10))?;
                    (p.state.epoch, p.state.head)
                } else {
                    let s = rt.block_on(reader.state("a"))?;
                    (s.epoch, s.head)
                };
                let seen = highest.entry(epoch.0).or_insert(head);
                if head < *seen || (epoch == store && head == 0) {
                    wrong.push(format!("epoch {} head {head} after head {seen}", epoch.0));
                }
                *seen = (*seen).max(head);
            }
        }
        Ok(wrong)
    });
    for _ in 0..30 {
        main.block_on(j.purge("a"))?;
        main.block_on(j.append("a", one(), None))?;
    }
    stop.store(true, Ordering::SeqCst);
    let wrong = watcher
        .join()
        .map_err(|_| JournalError::Storage("reader panicked".into()))??;
    assert!(wrong.is_empty(), "{wrong:?}");
    main.block_on(j.close())
}

/// A format-2 store whose upgrade fails (its `log` table holds a record
/// that does not apply) stays format 2, so a format-2 build still opens it.
#[test]
fn a_failed_upgrade_leaves_the_format_as_it_was() -> Result<(), JournalError> {
    use crate::tables::{storage, LOG, META, META_FORMAT};
    use redb::ReadableDatabase;
    let dir = tempfile::tempdir().map_err(storage)?;
    let path = dir.path().join(crate::FILE_NAME);
    {
        let db = Database::create(&path).map_err(storage)?;
        let txn = db.begin_write().map_err(storage)?;
        txn.open_table(META)
            .map_err(storage)?
            .insert(META_FORMAT, 2)
            .map_err(storage)?;
        txn.open_table(LOG)
            .map_err(storage)?
            .insert(1, &b"not a record"[..])
            .map_err(storage)?;
        txn.commit().map_err(storage)?;
    }
    let opened = crate::EmbeddedJournal::open(
        dir.path(),
        StoreOptions {
            min_free_bytes: 0,
            ..StoreOptions::default()
        },
        Arc::new(NoSink),
    );
    assert!(
        matches!(&opened, Err(JournalError::Storage(m)) if m.contains("corrupt")),
        "the log does not apply: {:?}",
        opened.as_ref().err()
    );
    drop(opened);
    let db = Database::open(&path).map_err(storage)?;
    let txn = db.begin_read().map_err(storage)?;
    let format = txn
        .open_table(META)
        .map_err(storage)?
        .get(META_FORMAT)
        .map_err(storage)?
        .map(|g| g.value());
    assert_eq!(format, Some(2));
    Ok(())
}

/// An append queued behind a close (its caller saw the journal open just
/// before `close`) is answered `Closed`, not left waiting on a writer that
/// has stopped. CI once hung here: the journal contract's `close` test.
#[test]
fn an_append_queued_behind_a_close_is_refused() -> Result<(), JournalError> {
    let dir = tempfile::tempdir().map_err(crate::tables::storage)?;
    let (_db, inbox, _epoch, writer) = writer_in(dir.path(), Durability::Sync)?;
    let (close, closed) = oneshot::channel();
    assert!(inbox.send(Request::Close { reply: close }).is_ok());
    let (reply, late) = oneshot::channel::<Result<Appended, JournalError>>();
    let request = Request::Append {
        channel: "a".into(),
        events: vec![NewEvent {
            event_type: None,
            data: "late".into(),
        }],
        key: None,
        reply,
    };
    assert!(inbox.send(request).is_ok());
    let handle = writer.spawn().map_err(crate::tables::storage)?;
    handle
        .join()
        .map_err(|_| JournalError::Storage("writer panicked".into()))?;
    assert!(matches!(closed.blocking_recv(), Ok(Ok(()))));
    // The reply was dropped unanswered: the caller maps that to `Closed`.
    assert!(late.blocking_recv().is_err());
    // And nothing more is queued.
    assert!(inbox
        .send(Request::Close {
            reply: oneshot::channel().0
        })
        .is_err());
    Ok(())
}
