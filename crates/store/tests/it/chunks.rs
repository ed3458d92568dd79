//! Chunk rows (`crates/store/src/tables.rs`, format 3): a checkpoint writes
//! each channel's events as rows of up to 64 consecutive events. Reads at
//! every position, count and age floors that fall inside a chunk, a reopen
//! and `journal check` all see exactly the events retained.

use crate::common;

use common::{ev, options, Recorder};
use gapless_core::{Journal, JournalError};
use gapless_store::{Durability, EmbeddedJournal};
use std::path::Path;
use std::sync::Arc;

type R = Result<(), JournalError>;

fn open(dir: &Path, keep: u64, age_ms: u64) -> EmbeddedJournal {
    // Nothing is applied before the close: one checkpoint, long chunks.
    EmbeddedJournal::open_with_checkpoint(
        dir,
        options(keep, age_ms, Durability::Sync),
        Arc::new(Recorder::default()),
        usize::MAX,
    )
    .expect("open journal")
}

/// Checks that `channel` holds exactly `floor..=head`, each event's data
/// being its seq, read from every position with several limits.
async fn holds(j: &EmbeddedJournal, channel: &str, floor: u64, head: u64) -> R {
    let st = j.state(channel).await?;
    assert_eq!((st.floor, st.head), (floor, head), "{channel} bounds");
    for after in (0..=head + 1).step_by(7).chain([floor - 1, floor, head]) {
        for limit in [1, 63, 64, 65, 1000] {
            let page = j.read(channel, after, limit).await?;
            let start = after.max(floor - 1) + 1;
            let want: Vec<(u64, String)> = (start..=head)
                .take(limit)
                .map(|s| (s, s.to_string()))
                .collect();
            let got: Vec<(u64, String)> = page
                .events
                .iter()
                .map(|e| (e.seq, e.data.as_text().unwrap_or_default().to_owned()))
                .collect();
            assert_eq!(got, want, "{channel} after {after} limit {limit}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn chunks_hold_every_event_across_floors_and_reopens() -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let j = open(dir.path(), 100, 0);
        // One at a time, then one append of 150: 300 events in all.
        for seq in 1..=150u64 {
            j.append("a", vec![ev(&seq.to_string())], None).await?;
        }
        let batch = (151..=300u64).map(|s| ev(&s.to_string())).collect();
        j.append("a", batch, None).await?;
        for seq in 1..=10u64 {
            j.append("b", vec![ev(&seq.to_string())], None).await?;
        }
        // Count retention: the floor (201) is inside a chunk of the tables
        // once they hold it.
        holds(&j, "a", 201, 300).await?;
        j.close().await?;
    }
    let report = gapless_store::check(dir.path())?;
    assert_eq!((report.channels, report.events), (2, 110));
    let j = open(dir.path(), 100, 0);
    holds(&j, "a", 201, 300).await?;
    holds(&j, "b", 1, 10).await?;
    // More after the reopen: the floor moves on, into the next chunk.
    for seq in 301..=340u64 {
        j.append("a", vec![ev(&seq.to_string())], None).await?;
    }
    holds(&j, "a", 241, 340).await?;
    j.close().await?;
    drop(j);
    let j = open(dir.path(), 100, 0);
    holds(&j, "a", 241, 340).await?;
    j.close().await?;
    drop(j);
    assert_eq!(gapless_store::check(dir.path())?.events, 110);
    Ok(())
}

#[tokio::test]
async fn an_age_floor_inside_a_chunk_is_exact() -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    let age = 60_000;
    let j = open(dir.path(), 10_000, age);
    for seq in 1..=90u64 {
        j.append("a", vec![ev(&seq.to_string())], None).await?;
    }
    let t90 = j.read("a", 89, 1).await?.events[0].time;
    // A later millisecond for the rest.
    while gapless_core::journal::now_ms() <= t90 {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    for seq in 91..=130u64 {
        j.append("a", vec![ev(&seq.to_string())], None).await?;
    }
    // Everything at t90 or before goes: the floor is 91, in the second chunk.
    j.evict_expired(t90 + age).await?;
    holds(&j, "a", 91, 130).await?;
    j.close().await?;
    drop(j);
    let j = open(dir.path(), 10_000, age);
    holds(&j, "a", 91, 130).await?;
    // Nothing more is old enough.
    j.evict_expired(t90 + age).await?;
    holds(&j, "a", 91, 130).await?;
    j.close().await?;
    drop(j);
    assert_eq!(gapless_store::check(dir.path())?.events, 40);
    Ok(())
}

/// Options with a byte limit only (`max_bytes` of data per channel).
fn bytes_options(max_bytes: u64) -> gapless_store::StoreOptions {
    gapless_store::StoreOptions {
        namespaces: Arc::new(
            gapless_core::Retention {
                max_events: 0,
                max_age_ms: 0,
                max_bytes,
            }
            .into(),
        ),
        durability: Durability::Sync,
        min_free_bytes: 0,
        ..gapless_store::StoreOptions::default()
    }
}

/// The floor a byte limit gives events `1..=head` whose data is their seq
/// in decimal: the newest events whose data fits in `max` (the newest
/// always stays).
fn byte_floor(head: u64, max: u64) -> u64 {
    let mut total = 0;
    let mut floor = head + 1;
    while floor > 1 {
        let len = (floor - 1).to_string().len() as u64;
        if total + len > max && floor <= head {
            break;
        }
        total += len;
        floor -= 1;
    }
    floor
}

/// Retention by bytes counts each event of a chunk row, not the row: the
/// sizes the writer keeps are read event by event when the store opens,
/// and a limit lowered across a restart, then more appends, put the floor
/// exactly where the events' data fits, inside a chunk.
#[tokio::test]
async fn a_byte_limit_counts_the_events_inside_chunk_rows() -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    let open = |max_bytes| {
        EmbeddedJournal::open_with_checkpoint(
            dir.path(),
            bytes_options(max_bytes),
            Arc::new(Recorder::default()),
            usize::MAX,
        )
        .expect("open journal")
    };
    {
        let j = open(1 << 20);
        for seq in 1..=150u64 {
            j.append("a", vec![ev(&seq.to_string())], None).await?;
        }
        let batch = (151..=300u64).map(|s| ev(&s.to_string())).collect();
        j.append("a", batch, None).await?;
        holds(&j, "a", 1, 300).await?;
        j.close().await?;
    }
    // 200 bytes: 66 events of 3 bytes and the start of a chunk's worth.
    let j = open(200);
    let floor = byte_floor(300, 200);
    assert_eq!(floor, 235);
    holds(&j, "a", floor, 300).await?;
    for seq in 301..=340u64 {
        j.append("a", vec![ev(&seq.to_string())], None).await?;
        let st = j.state("a").await?;
        assert_eq!(
            (st.floor, st.head),
            (byte_floor(seq, 200), seq),
            "seq {seq}"
        );
    }
    holds(&j, "a", byte_floor(340, 200), 340).await?;
    j.close().await?;
    drop(j);
    let j = open(200);
    holds(&j, "a", byte_floor(340, 200), 340).await?;
    // Lowered again: 20 bytes keep the newest six.
    j.close().await?;
    drop(j);
    let j = open(20);
    holds(&j, "a", 335, 340).await?;
    j.append("a", vec![ev("341")], None).await?;
    holds(&j, "a", 336, 341).await?;
    j.close().await?;
    drop(j);
    assert_eq!(gapless_store::check(dir.path())?.events, 6);
    Ok(())
}

/// A purge removes the channel's chunk rows and the events only the
/// write-ahead log holds (not yet applied to the tables): after it the
/// channel is empty in its new epoch, a restart from the directory as it
/// is on disk (no final checkpoint) replays none of the purged events, and
/// another channel keeps every event.
#[tokio::test]
async fn a_purge_removes_chunk_rows_and_events_only_in_the_log() -> R {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let j = open(dir.path(), 10_000, 0);
        for seq in 1..=100u64 {
            j.append("a", vec![ev(&seq.to_string())], None).await?;
            j.append("b", vec![ev(&seq.to_string())], None).await?;
        }
        j.close().await?;
    }
    let sink = Arc::new(Recorder::default());
    let j = EmbeddedJournal::open_with_checkpoint(
        dir.path(),
        options(10_000, 0, Durability::Sync),
        sink.clone(),
        usize::MAX,
    )?;
    // 101..=150 only in the log (and the overlay), one with a key.
    for seq in 101..=150u64 {
        let key = (seq == 120).then_some("k");
        j.append("a", vec![ev(&seq.to_string())], key).await?;
        j.append("b", vec![ev(&seq.to_string())], None).await?;
    }
    let old = j.state("a").await?.epoch;
    let purged = j.purge("a").await?;
    assert_ne!(purged.epoch, old);
    assert_eq!((purged.floor, purged.head), (1, 0));
    assert_eq!(j.state("a").await?, purged);
    assert!(j.read("a", 0, 1000).await?.events.is_empty());
    assert!(sink
        .records()
        .contains(&common::Record::Evicted("a".into(), purged)));
    // The key went with its event; seqs start again at 1.
    let again = j.append("a", vec![ev("1")], Some("k")).await?;
    assert_eq!(
        (again.epoch, again.first_seq, again.duplicate),
        (purged.epoch, 1, false)
    );
    for seq in 2..=3u64 {
        j.append("a", vec![ev(&seq.to_string())], None).await?;
    }
    holds(&j, "a", 1, 3).await?;
    holds(&j, "b", 1, 150).await?;
    // The directory as a crash would leave it: the purge's transaction and
    // the log's frames after it, nothing applied at a close.
    let copy = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(dir.path()).expect("read dir") {
        let path = entry.expect("entry").path();
        let to = copy.path().join(path.file_name().expect("file name"));
        std::fs::copy(&path, to).expect("copy");
    }
    let mut running = Some(j);
    for d in [copy.path(), dir.path()] {
        if d == dir.path() {
            if let Some(j) = running.take() {
                j.close().await?;
            }
        }
        let r = open(d, 10_000, 0);
        let st = r.state("a").await?;
        assert_eq!((st.epoch, st.floor, st.head), (purged.epoch, 1, 3));
        holds(&r, "a", 1, 3).await?;
        holds(&r, "b", 1, 150).await?;
        assert!(r.append("a", vec![ev("4")], Some("k")).await?.duplicate);
        r.close().await?;
        drop(r);
        assert_eq!(gapless_store::check(d)?.events, 153);
    }
    Ok(())
}
