//! What the embedded store keeps beyond the contract every journal keeps
//! (`crates/testkit/tests/journal_contract.rs` runs that one against the
//! store too): eviction by the caller's clock to the millisecond, close and
//! reopen, and bounded reads across the commit log and the tables.

use crate::common;

use common::{ev, open, options, Record};
use gapless_core::{Journal, JournalError};
use gapless_store::Durability;

type R = Result<(), JournalError>;

fn seqs(page: &gapless_core::Page) -> Vec<u64> {
    page.events.iter().map(|e| e.seq).collect()
}

#[tokio::test]
async fn age_retention_evicts_on_evict_expired() -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    let (j, rec) = open(dir.path(), options(1000, 10_000, Durability::Sync));
    j.append("old", vec![ev("1"), ev("2")], Some("k")).await?;
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    j.append("old", vec![ev("3")], None).await?;
    j.append("other", vec![ev("x")], None).await?;
    let page = j.read("old", 0, 10).await?;
    let (t1, t3) = (page.events[0].time, page.events[2].time);
    assert!(t1 < t3);

    // Nothing expired yet: no sink call, nothing changes.
    let before = rec.records().len();
    j.evict_expired(t1 + 9_999).await?;
    assert_eq!(rec.records().len(), before);
    assert_eq!(j.state("old").await?.floor, 1);

    // Events with time <= now - max_age go.
    j.evict_expired(t1 + 10_000).await?;
    let st = j.state("old").await?;
    assert_eq!((st.floor, st.head), (3, 3));
    assert_eq!(seqs(&j.read("old", 0, 10).await?), [3]);
    let evicted: Vec<_> = rec.records()[before..].to_vec();
    assert!(evicted.contains(&Record::Evicted("old".into(), st)));
    // The key's events are gone, so the key is forgotten.
    assert!(!j.append("old", vec![ev("4")], Some("k")).await?.duplicate);

    // Everything expired: floor = head + 1, reads are empty.
    j.evict_expired(t3 + 1_000_000).await?;
    let st = j.state("old").await?;
    assert_eq!((st.floor, st.head), (5, 4));
    assert!(j.read("old", 0, 10).await?.events.is_empty());
    assert_eq!(j.state("other").await?.floor, 2);
    // Appending again continues the seqs.
    let a = j.append("old", vec![ev("5")], None).await?;
    assert_eq!(a.first_seq, 5);
    assert_eq!(j.state("old").await?.floor, 5);
    Ok(())
}

#[tokio::test]
async fn close_drains_and_then_refuses_appends() -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    let (j, _) = open(dir.path(), options(1000, 0, Durability::Async));
    let j = std::sync::Arc::new(j);
    let mut tasks = Vec::new();
    for i in 0..50 {
        let j = j.clone();
        tasks.push(tokio::spawn(async move {
            j.append("c", vec![ev(&i.to_string())], None).await
        }));
    }
    tokio::task::yield_now().await;
    j.close().await?;
    let mut acked = Vec::new();
    for t in tasks {
        match t.await.expect("task") {
            Ok(a) => acked.push(a.first_seq),
            Err(JournalError::Closed) => {}
            Err(e) => return Err(e),
        }
    }
    assert!(matches!(
        j.append("c", vec![ev("late")], None).await,
        Err(JournalError::Closed)
    ));
    j.close().await?;
    j.evict_expired(u64::MAX).await?;
    // Reads still work, and every acknowledged append is there.
    let page = j.read("c", 0, 1000).await?;
    assert_eq!(page.events.len(), acked.len());
    drop(page);
    let j = std::sync::Arc::into_inner(j).expect("sole owner");
    drop(j);
    let (j, _) = open(dir.path(), options(1000, 0, Durability::Async));
    assert_eq!(j.state("c").await?.head, acked.len() as u64);
    Ok(())
}

/// `read_bounded` stops at the byte budget (always one event), whether the
/// events are still only in the commit log (overlay), already in the tables
/// (checkpoint 0: every commit is a checkpoint), or split between the two.
#[tokio::test]
async fn bounded_reads_stop_at_the_byte_budget_in_the_log_and_in_the_tables() -> R {
    for checkpoint in [usize::MAX, 0, 2500] {
        let dir = tempfile::tempdir().expect("tempdir");
        let j = gapless_store::EmbeddedJournal::open_with_checkpoint(
            dir.path(),
            options(1000, 0, Durability::Sync),
            std::sync::Arc::new(gapless_core::journal::NoSink),
            checkpoint,
        )?;
        for _ in 0..6 {
            j.append("big", vec![ev(&"k".repeat(1000))], None).await?;
        }
        let what = format!("checkpoint every {checkpoint} bytes");
        assert_eq!(
            seqs(&j.read_bounded("big", 0, 100, 2500).await?),
            [1, 2],
            "{what}"
        );
        assert_eq!(
            seqs(&j.read_bounded("big", 2, 100, 2000).await?),
            [3, 4],
            "{what}"
        );
        assert_eq!(
            seqs(&j.read_bounded("big", 0, 100, 10).await?),
            [1],
            "{what}"
        );
        assert_eq!(
            seqs(&j.read_bounded("big", 4, 100, 10).await?),
            [5],
            "{what}"
        );
        assert_eq!(
            seqs(&j.read_bounded("big", 0, 3, 1 << 20).await?),
            [1, 2, 3],
            "{what}"
        );
        assert_eq!(
            seqs(&j.read_bounded("big", 0, 100, usize::MAX).await?).len(),
            6,
            "{what}"
        );
        assert_eq!(seqs(&j.read("big", 3, 100).await?), [4, 5, 6], "{what}");
        j.close().await?;
    }
    Ok(())
}

/// `seek_time` finds the first retained event at or after a time whether
/// the events are only in the commit log (overlay), already in the tables
/// (checkpoint 0), or split between the two, with count retention raising
/// the floor in either (the overlay's floor may pass the tables' rows), and
/// after reopening (everything in the tables, the head's time kept).
#[tokio::test]
async fn seek_time_in_the_log_and_in_the_tables() -> R {
    for checkpoint in [usize::MAX, 0, 2500] {
        for max_events in [1000, 7] {
            let dir = tempfile::tempdir().expect("tempdir");
            let open = || {
                gapless_store::EmbeddedJournal::open_with_checkpoint(
                    dir.path(),
                    options(max_events, 0, Durability::Sync),
                    std::sync::Arc::new(gapless_core::journal::NoSink),
                    checkpoint,
                )
            };
            let j = open()?;
            for i in 0..12 {
                let batch = (0..(i % 3 + 1)).map(|_| ev(&"k".repeat(300))).collect();
                j.append("c", batch, None).await?;
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            let what = format!("checkpoint every {checkpoint} bytes, keep {max_events}");
            seek_matches_a_scan(&j, &what).await?;
            j.close().await?;
            drop(j);
            seek_matches_a_scan(&open()?, &what).await?;
        }
    }
    Ok(())
}

/// Checks `seek_time` on channel `c` against a scan of its events, around
/// every event's time.
async fn seek_matches_a_scan(j: &gapless_store::EmbeddedJournal, what: &str) -> R {
    let page = j.read("c", 0, 100).await?;
    let (all, st) = (&page.events, page.state);
    let head_time = all.last().map_or(0, |e| e.time);
    for e in all {
        for t in [e.time - 1, e.time, e.time + 1] {
            let s = j.seek_time("c", t).await?;
            let want = all
                .iter()
                .find(|x| x.time >= t)
                .map_or(st.head + 1, |x| x.seq);
            assert_eq!(
                (s.seq, s.state, s.head_time),
                (want, st, head_time),
                "{what}: time {t}"
            );
            let evicted = st.floor > 1 && want == st.floor;
            assert_eq!(s.evicted_after(t), evicted, "{what}: time {t}");
        }
    }
    Ok(())
}
