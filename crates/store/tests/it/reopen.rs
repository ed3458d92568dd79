//! Reopening a data directory resumes the same history; group commit keeps seqs dense.

use crate::common;

use common::{ev, open, options};
use gapless_core::{Journal, JournalError};
use gapless_store::Durability;
use std::sync::Arc;

type R = Result<(), JournalError>;

#[tokio::test]
async fn reopen_keeps_epoch_heads_floors_events_and_keys() -> R {
    for durability in [Durability::Sync, Durability::Async] {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("nested/data");
        let opts = options(5, 60_000, durability);
        let (epoch, states, pages) = {
            let (j, _) = open(&data, opts.clone());
            j.append("e", vec![ev("gone")], None).await?;
            let e_time = j.read("e", 0, 1).await?.events[0].time;
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            for i in 0..8 {
                j.append("a", vec![ev(&format!("a{i}"))], None).await?;
            }
            j.append("b", vec![ev("b0"), ev("b1")], Some("key")).await?;
            j.evict_expired(e_time + 60_000).await?;
            let mut states = Vec::new();
            let mut pages = Vec::new();
            for c in ["a", "b", "e", "never"] {
                states.push(j.state(c).await?);
                let page = j.read(c, 0, 100).await?;
                pages.push(
                    page.events
                        .iter()
                        .map(|e| (e.seq, e.data.clone(), e.time))
                        .collect::<Vec<_>>(),
                );
            }
            j.close().await?;
            (j.epoch(), states, pages)
        };
        assert_eq!(
            (states[2].floor, states[2].head),
            (2, 1),
            "e was age-evicted"
        );
        assert_eq!(
            (states[0].floor, states[0].head),
            (4, 8),
            "a kept its newest 5"
        );

        // Also a plain copy of the directory.
        let copy = dir.path().join("copy");
        std::fs::create_dir_all(&copy).expect("mkdir");
        std::fs::copy(
            data.join(gapless_store::FILE_NAME),
            copy.join(gapless_store::FILE_NAME),
        )
        .expect("copy");

        for path in [&data, &copy] {
            let (j, _) = open(path, opts.clone());
            assert_eq!(j.epoch(), epoch);
            for (i, c) in ["a", "b", "e", "never"].into_iter().enumerate() {
                assert_eq!(j.state(c).await?, states[i], "{c}");
                let page = j.read(c, 0, 100).await?;
                let got: Vec<_> = page
                    .events
                    .iter()
                    .map(|e| (e.seq, e.data.clone(), e.time))
                    .collect();
                assert_eq!(got, pages[i], "{c}");
            }
            let again = j.append("b", vec![ev("x")], Some("key")).await?;
            assert_eq!(
                (again.first_seq, again.last_seq, again.duplicate),
                (1, 2, true)
            );
            // The age index is rebuilt: everything old enough goes.
            j.evict_expired(gapless_core::journal::now_ms() + 120_000)
                .await?;
            assert!(j.read("a", 0, 100).await?.events.is_empty());
            assert!(j.read("b", 0, 100).await?.events.is_empty());
            let a = j.append("a", vec![ev("next")], None).await?;
            assert_eq!(a.first_seq, states[0].head + 1);
        }
    }
    Ok(())
}

#[tokio::test]
async fn keys_and_count_floors_survive_a_reopen() -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = options(3, 0, Durability::Sync);
    {
        let (j, _) = open(dir.path(), opts.clone());
        j.append("c", vec![ev("1"), ev("2")], Some("k1")).await?;
        for i in 0..4 {
            j.append("c", vec![ev(&i.to_string())], Some(&format!("n{i}")))
                .await?;
        }
        // Dropped without close(): the writer still commits and stops.
    }
    let (j, _) = open(dir.path(), opts);
    let st = j.state("c").await?;
    assert_eq!((st.floor, st.head), (4, 6));
    let dup = j.append("c", vec![ev("x")], Some("n3")).await?;
    assert_eq!((dup.first_seq, dup.duplicate), (6, true));
    let gone = j.append("c", vec![ev("x")], Some("k1")).await?;
    assert_eq!((gone.first_seq, gone.duplicate), (7, false));
    Ok(())
}

#[tokio::test]
async fn a_second_open_of_the_same_directory_fails_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_j, _) = open(dir.path(), options(10, 0, Durability::Sync));
    let rec = Arc::new(common::Recorder::default());
    let second =
        gapless_store::EmbeddedJournal::open(dir.path(), options(10, 0, Durability::Sync), rec);
    assert!(matches!(second, Err(JournalError::Storage(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn concurrent_appends_share_commits_and_stay_dense() -> R {
    for durability in [Durability::Sync, Durability::Async] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (j, rec) = open(dir.path(), options(1_000_000, 0, durability));
        let j = Arc::new(j);
        let mut tasks = Vec::new();
        for t in 0..64 {
            let j = j.clone();
            tasks.push(tokio::spawn(async move {
                let channel = format!("c{}", t % 4);
                let mut got = Vec::new();
                for i in 0..25 {
                    let n = 1 + (i % 3);
                    let events = (0..n).map(|k| ev(&format!("{t}-{i}-{k}"))).collect();
                    let a = j.append(&channel, events, None).await?;
                    assert_eq!(a.last_seq - a.first_seq + 1, n as u64);
                    got.push((channel.clone(), a.first_seq, a.last_seq));
                }
                Ok::<_, JournalError>(got)
            }));
        }
        let mut by_channel: std::collections::HashMap<String, Vec<(u64, u64)>> = Default::default();
        for t in tasks {
            for (c, f, l) in t.await.expect("task")? {
                by_channel.entry(c).or_default().push((f, l));
            }
        }
        for (c, mut ranges) in by_channel {
            ranges.sort_unstable();
            let mut next = 1;
            for (f, l) in &ranges {
                assert_eq!(*f, next, "{c}: hole or duplicate");
                next = l + 1;
            }
            let st = j.state(&c).await?;
            assert_eq!(st.head, next - 1);
            let page = j.read(&c, 0, 1_000_000).await?;
            let seqs: Vec<u64> = page.events.iter().map(|e| e.seq).collect();
            assert_eq!(seqs, (1..next).collect::<Vec<_>>());
        }
        assert_eq!(rec.records().len(), 64 * 25);
        j.close().await?;
    }
    Ok(())
}
