//! The commit log and its checkpoints (see `crates/store/src/log.rs`): whatever
//! the checkpoint interval, reads, states, idempotency keys and count
//! retention match a simple model, across checkpoints and reopens.

use crate::common;

use common::{options, Recorder};
use gapless_core::{Journal, JournalError};
use gapless_protocol::NewEvent;
use gapless_store::{Durability, EmbeddedJournal, StoreOptions};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

type R = Result<(), JournalError>;

/// What a channel should hold: every event data by seq (from 1), and the floor.
#[derive(Default)]
struct Model {
    data: Vec<String>,
    floor: u64,
    keys: HashMap<String, (u64, u64)>,
}

fn open(dir: &Path, opts: StoreOptions, checkpoint: usize) -> EmbeddedJournal {
    EmbeddedJournal::open_with_checkpoint(dir, opts, Arc::new(Recorder::default()), checkpoint)
        .expect("open journal")
}

async fn check(j: &EmbeddedJournal, models: &HashMap<String, Model>, keep: u64) -> R {
    for (name, m) in models {
        let st = j.state(name).await?;
        let head = m.data.len() as u64;
        assert_eq!((st.floor, st.head), (m.floor, head), "state of {name}");
        for after in [0, m.floor.saturating_sub(2), head.saturating_sub(3), head] {
            for limit in [1, 4, 1000] {
                let page = j.read(name, after, limit).await?;
                assert_eq!((page.state.floor, page.state.head), (m.floor, head));
                let start = after.max(m.floor - 1) + 1;
                let want: Vec<(u64, &str)> = (start..=head)
                    .take(limit)
                    .map(|s| (s, m.data[(s - 1) as usize].as_str()))
                    .collect();
                let got: Vec<(u64, &str)> = page
                    .events
                    .iter()
                    .map(|e| (e.seq, e.data.as_text().unwrap_or_default()))
                    .collect();
                assert_eq!(got, want, "{name} after {after} limit {limit}");
            }
        }
        assert!(head + 1 - m.floor <= keep, "{name} keeps at most {keep}");
    }
    Ok(())
}

async fn run(checkpoint: usize, durability: Durability) -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    let keep = 7;
    let opts = options(keep, 0, durability);
    let mut j = open(dir.path(), opts.clone(), checkpoint);
    let mut models: HashMap<String, Model> = HashMap::new();
    for step in 0u64..240 {
        let name = format!("c{}", step % 5);
        let m = models.entry(name.clone()).or_insert_with(|| Model {
            floor: 1,
            ..Model::default()
        });
        // Keys repeat every so often; some come back after their events went.
        let key = (step % 3 == 0).then(|| format!("k{}", (step / 3) % 9));
        let n = 1 + (step % 4) as usize;
        let events: Vec<NewEvent> = (0..n)
            .map(|i| NewEvent {
                event_type: (i % 2 == 1).then(|| "t".to_owned()),
                data: format!("{step}.{i}").into(),
            })
            .collect();
        let a = j.append(&name, events.clone(), key.as_deref()).await?;
        let retained = key
            .as_ref()
            .and_then(|k| m.keys.get(k))
            .filter(|&&(_, last)| last >= m.floor)
            .copied();
        match retained {
            Some((first, last)) => {
                assert!(
                    a.duplicate,
                    "step {step}: key {key:?} should be a duplicate"
                );
                assert_eq!((a.first_seq, a.last_seq), (first, last));
            }
            None => {
                assert!(!a.duplicate, "step {step}");
                let first = m.data.len() as u64 + 1;
                m.data.extend(
                    events
                        .into_iter()
                        .map(|e| e.data.as_text().unwrap_or_default().to_owned()),
                );
                let head = m.data.len() as u64;
                assert_eq!((a.first_seq, a.last_seq), (first, head));
                m.floor = m.floor.max(head.saturating_sub(keep) + 1);
                if let Some(k) = &key {
                    m.keys.insert(k.clone(), (first, head));
                }
            }
        }
        if step % 6 == 0 {
            // A retry right away, maybe in the same commit batch or after a checkpoint.
            let again = j
                .append(&name, vec![common::ev("retry")], key.as_deref())
                .await?;
            assert!(again.duplicate, "step {step}: retry");
            assert_eq!((again.first_seq, again.last_seq), (a.first_seq, a.last_seq));
        }
        if step % 17 == 0 {
            check(&j, &models, keep).await?;
        }
        if step % 97 == 96 {
            // A clean reopen applies the log; the state must not change.
            j.close().await?;
            drop(j);
            j = open(dir.path(), opts.clone(), checkpoint);
            check(&j, &models, keep).await?;
        }
    }
    check(&j, &models, keep).await?;
    Ok(())
}

#[tokio::test]
async fn every_commit_a_checkpoint() -> R {
    run(0, Durability::Sync).await
}

#[tokio::test]
async fn checkpoints_every_few_commits() -> R {
    run(300, Durability::Sync).await?;
    run(1000, Durability::Async).await
}

#[tokio::test]
async fn no_checkpoint_until_close() -> R {
    run(usize::MAX, Durability::Sync).await
}

/// A journal dropped without close, and one whose log was never applied
/// (the writer thread stopped by the process exiting), reopen with everything.
#[tokio::test]
async fn a_reopen_applies_what_the_log_holds() -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = options(1000, 0, Durability::Sync);
    {
        let j = open(dir.path(), opts.clone(), usize::MAX);
        for i in 0..10 {
            j.append(
                "a",
                vec![common::ev(&format!("{i}"))],
                Some(&format!("k{i}")),
            )
            .await?;
        }
        // Forget the journal: no close, no drop, the log stays as it is.
        std::mem::forget(j);
    }
    // The writer thread still holds the files; wait for nothing and copy
    // the directory (the journal file and its write-ahead log).
    let copy = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(dir.path()).expect("list") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), copy.path().join(entry.file_name())).expect("copy journal");
    }
    // Nothing is in the tables yet: `journal check` counts the log's commits.
    let report = gapless_store::check(copy.path())?;
    assert_eq!((report.events, report.logged_commits), (0, 10));
    let j = open(copy.path(), opts, usize::MAX);
    let page = j.read("a", 0, 100).await?;
    let data: Vec<&str> = page
        .events
        .iter()
        .map(|e| e.data.as_text().unwrap_or_default())
        .collect();
    assert_eq!(data, ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]);
    assert!(
        j.append("a", vec![common::ev("x")], Some("k3"))
            .await?
            .duplicate
    );
    assert_eq!(
        j.append("a", vec![common::ev("x")], None).await?.first_seq,
        11
    );
    Ok(())
}

/// A key used again after its first events fell below the floor, all between
/// two checkpoints: the new use is kept, the old one forgotten.
#[tokio::test]
async fn a_key_used_again_after_its_events_went_survives_the_checkpoint() -> R {
    for checkpoint in [0, usize::MAX] {
        let dir = tempfile::tempdir().expect("tempdir");
        let opts = options(2, 0, Durability::Sync);
        let j = open(dir.path(), opts.clone(), checkpoint);
        assert_eq!(
            j.append("a", vec![common::ev("1")], Some("k"))
                .await?
                .first_seq,
            1
        );
        for i in 2..=4 {
            j.append("a", vec![common::ev(&i.to_string())], None)
                .await?;
        }
        let again = j.append("a", vec![common::ev("5")], Some("k")).await?;
        assert_eq!((again.first_seq, again.duplicate), (5, false));
        j.close().await?;
        drop(j);
        let j = open(dir.path(), opts.clone(), checkpoint);
        let retry = j.append("a", vec![common::ev("x")], Some("k")).await?;
        assert_eq!(
            (retry.first_seq, retry.duplicate),
            (5, true),
            "checkpoint {checkpoint}"
        );
    }
    Ok(())
}

/// A copy of the journal file alone, taken while the store ran, lacks the
/// commits only the write-ahead log holds: it is refused, not served short.
#[tokio::test]
async fn a_running_journal_file_without_its_log_is_refused() -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = options(1000, 0, Durability::Sync);
    let j = open(dir.path(), opts.clone(), usize::MAX);
    j.append("a", vec![common::ev("1")], None).await?;
    std::mem::forget(j);
    let copy = tempfile::tempdir().expect("tempdir");
    let file = gapless_store::FILE_NAME;
    std::fs::copy(dir.path().join(file), copy.path().join(file)).expect("copy journal");
    let err = EmbeddedJournal::open(copy.path(), opts.clone(), Arc::new(Recorder::default()))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("write-ahead log") && err.contains("missing"),
        "{err}"
    );
    // Closed cleanly, the file alone is whole.
    let other = tempfile::tempdir().expect("tempdir");
    {
        let j = open(other.path(), opts.clone(), usize::MAX);
        j.append("a", vec![common::ev("1")], None).await?;
        j.close().await?;
    }
    let copy = tempfile::tempdir().expect("tempdir");
    std::fs::copy(other.path().join(file), copy.path().join(file)).expect("copy journal");
    let j = open(copy.path(), opts, usize::MAX);
    assert_eq!(j.read("a", 0, 10).await?.events.len(), 1);
    Ok(())
}
