//! Chunk rows (`crates/store/src/tables.rs`, format 3): a checkpoint writes
//! each channel's events as rows of up to 64 consecutive events. Reads at
//! every position, count and age floors that fall inside a chunk, a reopen
//! and `journal check` all see exactly the events retained.

mod common;

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
