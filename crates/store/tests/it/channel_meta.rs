//! Channel metadata in the embedded store (`crates/store/src/channel_meta.rs`):
//! replayed from the write-ahead log after a crash with the events it was
//! written with, kept by checkpoints, decided atomically with plain appends
//! racing a close, and absent (then created) in stores from before it.

use crate::common;

use common::{ev, options};
use gapless_core::journal::{ChannelState, CommitSink, JournalError};
use gapless_core::meta::{Change, ChannelMeta, Guard, Outcome, ProducerTuple};
use gapless_core::Journal;
use gapless_protocol::Event;
use gapless_store::{Durability, EmbeddedJournal, StoreOptions};
use std::path::Path;
use std::sync::{Arc, Mutex};

type R = Result<(), JournalError>;

fn opts() -> StoreOptions {
    options(10_000, 0, Durability::Sync)
}

fn open(dir: &Path, checkpoint: usize) -> EmbeddedJournal {
    EmbeddedJournal::open_with_checkpoint(dir, opts(), Arc::new(Calls::default()), checkpoint)
        .expect("open journal")
}

fn new_meta(incarnation: u64) -> ChannelMeta {
    ChannelMeta::new(incarnation, "text/plain".into(), 1)
}

fn create(incarnation: u64, events: &[&str]) -> Change {
    Change::Create {
        meta: new_meta(incarnation),
        events: events.iter().map(|d| ev(d)).collect(),
    }
}

fn produce(inc: u64, seq: u64, data: &str, close: bool) -> Change {
    Change::Append {
        guard: Guard {
            incarnation: inc,
            producer: Some(ProducerTuple {
                id: "p".into(),
                epoch: 0,
                seq,
            }),
            stream_seq: None,
            close,
        },
        events: vec![ev(data)],
        key: None,
    }
}

async fn texts(j: &EmbeddedJournal, channel: &str) -> Result<Vec<String>, JournalError> {
    let page = j.read(channel, 0, 1000).await?;
    Ok(page
        .events
        .iter()
        .map(|e| e.data.as_text().unwrap_or_default().to_owned())
        .collect())
}

/// Copies the files of `dir` (a store whose journal was forgotten: its
/// writer never stops, as after a crash) to a new directory.
fn copy_of(dir: &Path) -> tempfile::TempDir {
    let copy = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(dir).expect("list") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), copy.path().join(entry.file_name())).expect("copy");
    }
    copy
}

/// A crash (the journal forgotten, its files copied as they are) keeps
/// every acknowledged change with the events written with it: replayed
/// from the write-ahead log (no checkpoint since the changes), or read
/// from the tables (a checkpoint at every commit), or both (a checkpoint at
/// a clean close, then changes only the log holds). A deletion is replayed
/// too.
#[tokio::test]
async fn a_crash_keeps_each_change_with_its_events() -> R {
    for (checkpoint, reopened) in [(usize::MAX, false), (0, false), (usize::MAX, true)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut j = open(dir.path(), checkpoint);
        j.change("s", create(7, &["first"])).await?;
        j.change("d", create(9, &[])).await?;
        if reopened {
            // The creations reach the tables at this close; the rest only
            // the log holds.
            j.close().await?;
            drop(j);
            j = open(dir.path(), checkpoint);
        }
        for seq in 0..3 {
            let c = j
                .change("s", produce(7, seq, &format!("p{seq}"), false))
                .await?;
            assert!(matches!(c.outcome, Outcome::Appended(Some(_))), "{c:?}");
        }
        let closing = j.change("s", produce(7, 3, "last", true)).await?;
        assert!(closing.meta.as_ref().is_some_and(|m| m.is_closed()));
        let d = j.change("d", Change::Delete { incarnation: 9 }).await?;
        assert_eq!(d.outcome, Outcome::Deleted);
        let before = j.meta("s").await?;
        assert_eq!(before.1.head, 5);
        // Checkpoints of the last commits may still run: let them end, so
        // the copy is not taken mid-transaction.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        std::mem::forget(j);
        let copy = copy_of(dir.path());
        let report = gapless_store::check(copy.path())?;
        if checkpoint == 0 {
            assert_eq!((report.with_meta, report.events), (1, 5), "{report:?}");
        } else {
            assert!(report.logged_commits >= 5, "{report:?}");
        }
        let j = open(copy.path(), checkpoint);
        assert_eq!(j.meta("s").await?, before, "checkpoint {checkpoint}");
        assert_eq!(j.meta("d").await?.0, None, "the deletion was replayed");
        assert_eq!(texts(&j, "s").await?, ["first", "p0", "p1", "p2", "last"]);
        assert!(matches!(
            j.append("s", vec![ev("no")], None).await,
            Err(JournalError::ChannelClosed)
        ));
        assert_eq!(
            j.change("s", produce(7, 3, "last", true)).await?.outcome,
            Outcome::AlreadyClosed(true),
            "the closing append's retry after the crash"
        );
        j.close().await?;
        drop(j);
        let report = gapless_store::check(copy.path())?;
        assert_eq!((report.with_meta, report.logged_commits), (1, 0));
    }
    Ok(())
}

/// Plain appends racing the closing append: each is wholly before the close
/// (stored, below the closing event) or refused (`ChannelClosed`), and
/// none is stored after the closing event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plain_appends_racing_a_close_land_before_it_or_are_refused() -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    let j = Arc::new(open(dir.path(), 4096));
    j.change("s", create(5, &[])).await?;
    let mut tasks = Vec::new();
    for t in 0..8 {
        let j = j.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut refused = 0;
            for i in 0..200 {
                match j.append("s", vec![ev(&format!("{t}-{i}"))], None).await {
                    Ok(a) => {
                        assert_eq!(refused, 0, "an append accepted after one was refused");
                        acked.push(a.first_seq);
                    }
                    Err(JournalError::ChannelClosed) => refused += 1,
                    Err(e) => return Err(e),
                }
            }
            Ok::<_, JournalError>((acked, refused))
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let close = j.change("s", produce(5, 0, "last", true)).await?;
    let Outcome::Appended(Some(last)) = close.outcome else {
        panic!("not closed: {close:?}")
    };
    let (mut acked, mut refused) = (Vec::new(), 0);
    for t in tasks {
        let (a, r) = t.await.expect("task")?;
        acked.extend(a);
        refused += r;
    }
    assert!(refused > 0, "some appends came after the close");
    assert!(
        acked.iter().all(|&s| s < last.first_seq),
        "{acked:?} {last:?}"
    );
    let state = j.state("s").await?;
    assert_eq!(state.head, last.last_seq, "nothing after the closing event");
    assert_eq!(acked.len() as u64 + 1, state.head);
    assert_eq!(
        texts(&j, "s").await?.last().map(String::as_str),
        Some("last")
    );
    Ok(())
}

/// One sink call.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Committed(String, Vec<u64>),
    Meta(String),
}

#[derive(Default)]
struct Calls(Mutex<Vec<Call>>);

impl CommitSink for Calls {
    fn committed(&self, channel: &str, _: ChannelState, events: &[Arc<Event>]) {
        let seqs = events.iter().map(|e| e.seq).collect();
        self.0
            .lock()
            .expect("lock")
            .push(Call::Committed(channel.into(), seqs));
    }
    fn evicted(&self, _: &str, _: ChannelState) {}
    fn meta_changed(&self, channel: &str) {
        self.0
            .lock()
            .expect("lock")
            .push(Call::Meta(channel.into()));
    }
}

/// The sink hears a change's events, then `meta_changed`; a change that
/// writes nothing tells it nothing; a purge keeps the metadata.
#[tokio::test]
async fn the_sink_hears_the_events_then_the_change_and_a_purge_keeps_the_metadata() -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    let calls = Arc::new(Calls::default());
    let j = EmbeddedJournal::open(dir.path(), opts(), calls.clone())?;
    j.change("s", create(3, &["a", "b"])).await?;
    j.change("s", create(4, &["c"])).await?;
    j.change("s", Change::SoftDelete { incarnation: 3 }).await?;
    assert_eq!(
        *calls.0.lock().expect("lock"),
        [
            Call::Committed("s".into(), vec![1, 2]),
            Call::Meta("s".into()),
            Call::Meta("s".into()),
        ]
    );
    let purged = j.purge("s").await?;
    let (kept, state) = j.meta("s").await?;
    assert!(kept.is_some_and(|m| m.incarnation == 3 && m.soft_deleted));
    assert_eq!(state, purged);
    j.close().await?;
    drop(j);
    let j = open(dir.path(), 4096);
    let (kept, state) = j.meta("s").await?;
    assert!(kept.is_some_and(|m| m.soft_deleted));
    assert_eq!((state.epoch, state.head), (purged.epoch, 0));
    Ok(())
}

/// A data directory of the release before binary payloads (format 2, its
/// last commits in the `log` table: `crates/gapless/tests/fixtures`) opens
/// with no metadata anywhere, takes metadata, and keeps it.
#[tokio::test]
async fn a_store_from_before_metadata_opens_and_takes_it() -> R {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../gapless/tests/fixtures/store-v0.1")
        .join(gapless_store::FILE_NAME);
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(&fixture, dir.path().join(gapless_store::FILE_NAME)).expect("copy fixture");
    let j = open(dir.path(), 4096);
    let (none, state) = j.meta("plain").await?;
    assert_eq!(none, None);
    assert_eq!(state.head, 6);
    assert_eq!(
        j.append("plain", vec![ev("more")], None).await?.first_seq,
        7
    );
    let c = j.change("plain", create(11, &["streamed"])).await?;
    assert_eq!(c.meta.map(|m| m.layout.base), Some(7));
    j.close().await?;
    drop(j);
    let report = gapless_store::check(dir.path())?;
    assert_eq!(report.with_meta, 1);
    let j = open(dir.path(), 4096);
    assert_eq!(j.meta("plain").await?.0.map(|m| m.incarnation), Some(11));
    assert_eq!(j.meta("second").await?.0, None);
    Ok(())
}

/// A format-3 store (no `channel_meta` table) opens unchanged and is
/// upgraded: its events stay, the table is created.
#[tokio::test]
async fn a_format_3_store_without_the_metadata_table_opens_and_upgrades() -> R {
    use redb::{ReadableDatabase, TableDefinition};
    const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
    const CHANNEL_META: TableDefinition<&str, &[u8]> = TableDefinition::new("channel_meta");
    let dir = tempfile::tempdir().expect("tempdir");
    let j = open(dir.path(), 4096);
    j.append("a", vec![ev("1"), ev("2")], None).await?;
    j.close().await?;
    drop(j);
    let path = dir.path().join(gapless_store::FILE_NAME);
    {
        let db = redb::Database::open(&path).expect("open redb");
        let txn = db.begin_write().expect("write");
        assert!(txn.delete_table(CHANNEL_META).expect("delete"));
        txn.open_table(META)
            .expect("meta")
            .insert("format", 3)
            .expect("format");
        txn.commit().expect("commit");
    }
    assert_eq!(gapless_store::check(dir.path())?.with_meta, 0);
    let j = open(dir.path(), 4096);
    assert_eq!(j.meta("a").await?.0, None);
    assert_eq!(texts(&j, "a").await?, ["1", "2"]);
    j.change("a", create(2, &["3"])).await?;
    j.close().await?;
    drop(j);
    let db = redb::Database::open(&path).expect("open redb");
    let txn = db.begin_read().expect("read");
    let format = txn
        .open_table(META)
        .expect("meta")
        .get("format")
        .expect("get")
        .map(|g| g.value());
    assert_eq!(format, Some(4));
    let rows = txn.open_table(CHANNEL_META).expect("channel_meta");
    assert!(rows.get("a").expect("get").is_some());
    Ok(())
}
