//! A damaged write-ahead log (`docs/reliability.md`): on a copy of a data
//! directory taken after a crash, `gapless_store::check` (`gapless journal
//! check`) and the start agree. A frame damaged in the middle of the log,
//! with acknowledged commits behind it, and a damaged file header are
//! refused by both with the same words, and the refused log is left as it
//! was; a torn tail is accepted by both.

use crate::common;

use common::{options, Recorder};
use gapless_core::{Journal, JournalError};
use gapless_store::{Durability, EmbeddedJournal};
use std::path::Path;
use std::sync::Arc;

type R = Result<(), JournalError>;

const WAL: &str = "journal.wal.0";

fn data(i: u64) -> String {
    format!("commit-{i}-{}", "y".repeat(200))
}

/// A directory as a crash under `Sync` leaves it: commits 1 to 4 on channel
/// `a`, acknowledged and only in the write-ahead log.
async fn crashed() -> Result<tempfile::TempDir, JournalError> {
    let dir = tempfile::tempdir().expect("tempdir");
    let j = EmbeddedJournal::open_with_checkpoint(
        dir.path(),
        options(1000, 0, Durability::Sync),
        Arc::new(Recorder::default()),
        usize::MAX,
    )?;
    for i in 1..=4 {
        j.append("a", vec![common::ev(&data(i))], None).await?;
    }
    // No close: the log stays as the crash left it.
    std::mem::forget(j);
    let copy = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(dir.path()).expect("list") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), copy.path().join(entry.file_name())).expect("copy");
    }
    Ok(copy)
}

/// Flips a bit of byte `at` of the first WAL file.
fn flip(dir: &Path, at: usize) {
    let path = dir.join(WAL);
    let mut b = std::fs::read(&path).expect("read wal");
    b[at] ^= 0x10;
    std::fs::write(&path, b).expect("write wal");
}

/// Where the records of commit `i` are in the first WAL file.
fn offset_of(dir: &Path, i: u64) -> usize {
    let b = std::fs::read(dir.join(WAL)).expect("read wal");
    let needle = data(i);
    b.windows(needle.len())
        .position(|w| w == needle.as_bytes())
        .expect("the commit's data in the log")
}

/// The check's and the start's answers on `dir`: the start's error, or the
/// events of `a` it serves.
async fn both(dir: &Path) -> (Result<u64, String>, Result<Vec<String>, String>) {
    let checked = gapless_store::check(dir)
        .map(|r| r.logged_commits)
        .map_err(|e| e.to_string());
    let opened = match EmbeddedJournal::open(
        dir,
        options(1000, 0, Durability::Sync),
        Arc::new(Recorder::default()),
    ) {
        Ok(j) => {
            let page = j.read("a", 0, 100).await.map_err(|e| e.to_string());
            let _ = j.close().await;
            page.map(|p| {
                p.events
                    .iter()
                    .map(|e| e.data.as_text().unwrap_or_default().to_owned())
                    .collect()
            })
        }
        Err(e) => Err(e.to_string()),
    };
    (checked, opened)
}

#[tokio::test]
async fn a_frame_damaged_mid_log_is_refused_by_check_and_start_alike() -> R {
    let dir = crashed().await?;
    flip(dir.path(), offset_of(dir.path(), 2) + 50);
    let before = std::fs::read(dir.path().join(WAL)).expect("read wal");
    let (checked, opened) = both(dir.path()).await;
    let said = match (&checked, &opened) {
        (Err(c), Err(o)) => {
            assert_eq!(c, o, "check and start say the same");
            o.clone()
        }
        _ => panic!("commits 2 to 4 behind a damaged frame: check {checked:?}, start {opened:?}"),
    };
    assert!(
        said.contains(WAL) && said.contains("is damaged at byte") && said.contains("commit 4"),
        "{said}"
    );
    assert!(
        said.contains("backup") && said.contains("truncate -s"),
        "{said}"
    );
    assert_eq!(
        std::fs::read(dir.path().join(WAL)).expect("read wal"),
        before,
        "a refused log is left as it was"
    );
    Ok(())
}

#[tokio::test]
async fn a_damaged_log_header_is_refused_by_check_and_start_alike() -> R {
    let dir = crashed().await?;
    flip(dir.path(), 20);
    let (checked, opened) = both(dir.path()).await;
    match (&checked, &opened) {
        (Err(c), Err(o)) => {
            assert_eq!(c, o, "check and start say the same");
            assert!(
                o.contains("write-ahead log") && o.contains("missing"),
                "{o}"
            );
        }
        _ => panic!("a damaged header: check {checked:?}, start {opened:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn a_torn_last_frame_is_accepted_by_check_and_start_alike() -> R {
    let dir = crashed().await?;
    flip(dir.path(), offset_of(dir.path(), 4) + 50);
    let (checked, opened) = both(dir.path()).await;
    assert_eq!(checked, Ok(3), "{opened:?}");
    assert_eq!(opened, Ok((1..=3).map(data).collect::<Vec<_>>()));
    Ok(())
}
