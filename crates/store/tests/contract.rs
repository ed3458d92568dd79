//! The journal contract, as the memory journal implements it, on real files.

mod common;

use common::{ev, open, options, Record};
use gapless_core::{ChannelState, Journal, JournalError};
use gapless_protocol::NewEvent;
use gapless_store::Durability;

type R = Result<(), JournalError>;

fn seqs(page: &gapless_core::Page) -> Vec<u64> {
    page.events.iter().map(|e| e.seq).collect()
}

#[tokio::test]
async fn seqs_are_dense_from_one_per_channel() -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    let (j, _) = open(dir.path(), options(1000, 0, Durability::Sync));
    assert_eq!(j.state("a").await?, ChannelState::empty(j.epoch()));
    assert_ne!(j.epoch().0, 0);
    for want in 1..=3 {
        let a = j.append("a", vec![ev("x")], None).await?;
        assert_eq!((a.first_seq, a.last_seq, a.duplicate), (want, want, false));
        assert_eq!(a.epoch, j.epoch());
    }
    let b = j.append("b", vec![ev("y")], None).await?;
    assert_eq!((b.first_seq, b.last_seq), (1, 1));
    let a = j.append("a", vec![ev("z")], None).await?;
    assert_eq!((a.first_seq, a.last_seq), (4, 4));
    let st = j.state("a").await?;
    assert_eq!((st.floor, st.head, st.epoch), (1, 4, j.epoch()));
    Ok(())
}

#[tokio::test]
async fn a_batch_is_atomic_and_in_order() -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    let (j, _) = open(dir.path(), options(1000, 0, Durability::Sync));
    let batch = vec![
        NewEvent {
            event_type: Some("t1".into()),
            data: "one".into(),
        },
        ev("two"),
        ev(""),
    ];
    let a = j.append("c", batch, None).await?;
    assert_eq!((a.first_seq, a.last_seq), (1, 3));
    let page = j.read("c", 0, 10).await?;
    assert_eq!(seqs(&page), [1, 2, 3]);
    let data: Vec<_> = page.events.iter().map(|e| e.data.as_str()).collect();
    assert_eq!(data, ["one", "two", ""]);
    assert_eq!(page.events[0].event_type.as_deref(), Some("t1"));
    assert_eq!(page.events[1].event_type, None);
    assert!(page.events.iter().all(|e| e.time == page.events[0].time));
    assert!(page
        .events
        .iter()
        .all(|e| &*e.channel == "c" && e.epoch == j.epoch()));
    Ok(())
}

#[tokio::test]
async fn times_never_go_backwards() -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    let (j, _) = open(dir.path(), options(1000, 0, Durability::Async));
    for _ in 0..50 {
        j.append("t", vec![ev("x")], None).await?;
    }
    let page = j.read("t", 0, 100).await?;
    assert!(page.events.windows(2).all(|w| w[0].time <= w[1].time));
    Ok(())
}

#[tokio::test]
async fn idempotency_keys_return_the_original_seqs_on_their_channel_only() -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    let (j, rec) = open(dir.path(), options(1000, 0, Durability::Sync));
    j.append("a", vec![ev("0")], None).await?;
    let first = j.append("a", vec![ev("1"), ev("2")], Some("k")).await?;
    assert_eq!(
        (first.first_seq, first.last_seq, first.duplicate),
        (2, 3, false)
    );
    let calls = rec.records().len();
    let again = j.append("a", vec![ev("other")], Some("k")).await?;
    assert_eq!(
        (again.first_seq, again.last_seq, again.duplicate),
        (2, 3, true)
    );
    assert_eq!(rec.records().len(), calls, "a duplicate is not reported");
    assert_eq!(j.state("a").await?.head, 3);
    let other = j.append("b", vec![ev("1")], Some("k")).await?;
    assert_eq!((other.first_seq, other.duplicate), (1, false));
    // Two appends with one key in the same group commit: the second is a duplicate.
    let (x, y) = tokio::join!(
        j.append("a", vec![ev("x")], Some("k2")),
        j.append("a", vec![ev("y")], Some("k2"))
    );
    let (x, y) = (x?, y?);
    assert_eq!(x.first_seq, y.first_seq);
    assert!(x.duplicate != y.duplicate);
    Ok(())
}

#[tokio::test]
async fn count_retention_keeps_exactly_the_newest() -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    let (j, rec) = open(dir.path(), options(3, 0, Durability::Sync));
    let key = j.append("c", vec![ev("1")], Some("k")).await?;
    for head in 2..=7u64 {
        j.append("c", vec![ev(&head.to_string())], None).await?;
        let st = j.state("c").await?;
        assert_eq!((st.floor, st.head), (head.saturating_sub(3) + 1, head));
        let page = j.read("c", 0, 100).await?;
        assert_eq!(page.state, st);
        assert_eq!(seqs(&page).first(), Some(&st.floor));
        assert_eq!(page.events.len() as u64, head.min(3));
    }
    // The sink saw the floor rise with each commit.
    let last = rec.records().last().cloned();
    let want = ChannelState {
        epoch: j.epoch(),
        floor: 5,
        head: 7,
    };
    assert_eq!(last, Some(Record::Committed("c".into(), want, vec![7])));
    // A batch larger than the limit keeps its newest events only.
    let a = j
        .append("c", (0..5).map(|i| ev(&i.to_string())).collect(), None)
        .await?;
    assert_eq!((a.first_seq, a.last_seq), (8, 12));
    assert_eq!(seqs(&j.read("c", 0, 100).await?), [10, 11, 12]);
    // The key's event is gone, so the key is forgotten.
    let re = j.append("c", vec![ev("again")], Some("k")).await?;
    assert!(!re.duplicate);
    assert_ne!(re.first_seq, key.first_seq);
    // max_events 0 is treated as 1.
    let dir0 = tempfile::tempdir().expect("tempdir");
    let (j0, _) = open(dir0.path(), options(0, 0, Durability::Sync));
    j0.append("z", vec![ev("a"), ev("b")], None).await?;
    assert_eq!(seqs(&j0.read("z", 0, 10).await?), [2]);
    Ok(())
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
async fn age_zero_never_evicts() -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    let (j, rec) = open(dir.path(), options(1000, 0, Durability::Sync));
    j.append("c", vec![ev("1")], None).await?;
    j.evict_expired(u64::MAX).await?;
    assert_eq!(j.state("c").await?.floor, 1);
    assert_eq!(rec.records().len(), 1);
    Ok(())
}

#[tokio::test]
async fn reads_page_from_after_and_skip_below_the_floor() -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    let (j, _) = open(dir.path(), options(6, 0, Durability::Sync));
    for i in 1..=10 {
        j.append("p", vec![ev(&i.to_string())], None).await?;
    }
    assert_eq!(seqs(&j.read("p", 0, 2).await?), [5, 6]);
    assert_eq!(seqs(&j.read("p", 2, 3).await?), [5, 6, 7]);
    assert_eq!(seqs(&j.read("p", 6, 3).await?), [7, 8, 9]);
    assert_eq!(seqs(&j.read("p", 9, 3).await?), [10]);
    assert!(j.read("p", 10, 3).await?.events.is_empty());
    assert!(j.read("p", 99, 3).await?.events.is_empty());
    assert!(j.read("p", 0, 0).await?.events.is_empty());
    let page = j.read("p", 0, 100).await?;
    assert_eq!((page.state.floor, page.state.head), (5, 10));
    assert_eq!(page.events[0].data, "5");
    let none = j.read("nobody", 0, 10).await?;
    assert_eq!(none.state, ChannelState::empty(j.epoch()));
    assert!(none.events.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sink_sees_commits_in_order_before_append_returns() -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    let (j, rec) = open(dir.path(), options(100_000, 0, Durability::Sync));
    let j = std::sync::Arc::new(j);
    let mut tasks = Vec::new();
    for t in 0..16 {
        let (j, rec) = (j.clone(), rec.clone());
        tasks.push(tokio::spawn(async move {
            let channel = format!("c{}", t % 4);
            for _ in 0..20 {
                let a = j.append(&channel, vec![ev("a"), ev("b")], None).await?;
                let seen = rec.records().iter().any(|r| {
                    matches!(r, Record::Committed(c, _, s) if *c == channel && s.last() == Some(&a.last_seq))
                });
                assert!(seen, "sink saw {channel}/{} before the reply", a.last_seq);
            }
            Ok::<_, JournalError>(())
        }));
    }
    for t in tasks {
        t.await.expect("task")?;
    }
    for c in 0..4 {
        let name = format!("c{c}");
        let mut next = 1;
        for r in rec.records() {
            if let Record::Committed(ch, st, s) = r {
                if ch == name {
                    assert_eq!(s.first(), Some(&next));
                    next += s.len() as u64;
                    assert_eq!(st.head, next - 1);
                }
            }
        }
        assert_eq!(next - 1, 4 * 20 * 2);
    }
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
