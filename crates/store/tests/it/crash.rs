//! Crash safety: a child process (this test binary re-run in "writer" mode)
//! appends and prints every acknowledged seq; the parent SIGKILLs it mid-way,
//! reopens the store, and checks nothing acknowledged was lost and seqs stay
//! dense. Repeated over several kill/reopen rounds on the same directory.

use crate::common;

use common::{ev, options};
use gapless_core::journal::NoSink;
use gapless_core::Journal;
use gapless_store::{Durability, EmbeddedJournal};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DIR_VAR: &str = "GAPLESS_STORE_CRASH_DIR";
const MODE_VAR: &str = "GAPLESS_STORE_CRASH_MODE";
const CHANNELS: usize = 4;

fn opts(mode: &str) -> gapless_store::StoreOptions {
    let durability = if mode.starts_with("async") {
        Durability::Async
    } else {
        Durability::Sync
    };
    options(10_000_000, 0, durability)
}

/// Opens the journal for `mode`: `sync-small` checkpoints every 2 KiB of
/// records and moves between WAL files of 16 KiB, so a round crosses many
/// checkpoints and file moves.
fn open(dir: &Path, mode: &str) -> Result<EmbeddedJournal, gapless_core::JournalError> {
    if mode == "sync-small" {
        return EmbeddedJournal::open_tuned(dir, opts(mode), Arc::new(NoSink), 2048, 16 << 10);
    }
    EmbeddedJournal::open(dir, opts(mode), Arc::new(NoSink))
}

/// The child: does nothing unless run by [`run_round`] with `DIR_VAR` set.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var(DIR_VAR) else {
        return;
    };
    let mode = std::env::var(MODE_VAR).unwrap_or_default();
    let idle = mode == "async-idle";
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let j = open(Path::new(&dir), &mode).expect("child open");
        println!("EPOCH {}", j.epoch().0);
        let j = Arc::new(j);
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut tasks = Vec::new();
        for t in 0..16 {
            let j = j.clone();
            tasks.push(tokio::spawn(async move {
                let channel = format!("c{}", t % CHANNELS);
                let mut i = 0u64;
                let idle_after = if idle { 10 } else { u64::MAX };
                while Instant::now() < deadline && i < idle_after {
                    let data = format!("{t}-{i}");
                    let a = j
                        .append(&channel, vec![ev(&data), ev(&data)], None)
                        .await
                        .expect("child append");
                    println!("ACK {channel} {} {data}", a.first_seq);
                    i += 1;
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        if idle {
            // Past the async flush interval with nothing to do.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            println!("IDLE");
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
    });
}

/// Runs the child on `dir` until it acknowledged `acks` appends (or says it
/// is idle), SIGKILLs it,
/// and returns its epoch and every append it acknowledged.
fn run_round(dir: &Path, mode: &str, acks: usize) -> (u64, Vec<(String, u64, String)>) {
    let exe = std::env::current_exe().expect("current exe");
    let mut child = Command::new(exe)
        .args([
            "crash::crash_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DIR_VAR, dir)
        .env(MODE_VAR, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn child");
    let mut out = BufReader::new(child.stdout.take().expect("child stdout"));
    let mut epoch = 0;
    let mut acked = Vec::new();
    let mut killed = false;
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).expect("read child") == 0 {
            break;
        }
        // A line cut by the kill has no newline: it was not fully acknowledged output.
        let Some(text) = line.strip_suffix('\n') else {
            break;
        };
        // libtest prints "test crash::crash_child ... " before the child's first line.
        let text = text.rsplit(" ... ").next().unwrap_or(text);
        let parts: Vec<&str> = text.split(' ').collect();
        match parts.as_slice() {
            ["EPOCH", e] => epoch = e.parse().expect("epoch"),
            ["ACK", c, seq, data] => {
                acked.push((c.to_string(), seq.parse().expect("seq"), data.to_string()));
            }
            _ => {}
        }
        if !killed && (acked.len() >= acks || text == "IDLE") {
            child.kill().expect("SIGKILL child");
            killed = true;
        }
    }
    let status = child.wait().expect("wait child");
    assert!(killed, "child ended on its own: {status}");
    (epoch, acked)
}

/// Reopens `dir` and checks every acknowledged append (when `check_acked`)
/// and that every channel's seqs are dense from 1 to its head.
fn verify(dir: &Path, mode: &str, acked: &[(String, u64, String)], check_acked: bool) -> u64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let j = open(dir, mode).expect("reopen");
        let mut stored: HashMap<(String, u64), String> = HashMap::new();
        for c in 0..CHANNELS {
            let channel = format!("c{c}");
            let page = j.read(&channel, 0, usize::MAX).await.expect("read");
            let seqs: Vec<u64> = page.events.iter().map(|e| e.seq).collect();
            assert_eq!(
                seqs,
                (1..=page.state.head).collect::<Vec<_>>(),
                "{channel} dense"
            );
            assert_eq!(page.state.floor, 1);
            for e in &page.events {
                stored.insert(
                    (channel.clone(), e.seq),
                    e.data.as_text().unwrap_or_default().to_owned(),
                );
            }
        }
        if check_acked {
            for (c, seq, data) in acked {
                let got = stored.get(&(c.clone(), *seq));
                assert_eq!(got, Some(data), "acknowledged {c}/{seq} lost");
                let got = stored.get(&(c.clone(), seq + 1));
                assert_eq!(got, Some(data), "acknowledged {c}/{} lost", seq + 1);
            }
        }
        let epoch = j.epoch().0;
        j.close().await.expect("close");
        epoch
    })
}

#[test]
fn kill_9_loses_no_acknowledged_sync_append() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut total = 0;
    let mut epoch = None;
    for round in 0..3 {
        let (child_epoch, acked) = run_round(dir.path(), "sync", 200 + 300 * round);
        total += acked.len();
        let reopened = verify(dir.path(), "sync", &acked, true);
        assert_eq!(reopened, child_epoch, "a Sync crash keeps the epoch");
        assert_eq!(*epoch.get_or_insert(child_epoch), child_epoch);
    }
    assert!(total >= 1200);
}

#[test]
fn kill_9_across_checkpoints_and_wal_file_moves_loses_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    for round in 0..3 {
        let (child_epoch, acked) = run_round(dir.path(), "sync-small", 400 + 200 * round);
        let reopened = verify(dir.path(), "sync-small", &acked, true);
        assert_eq!(reopened, child_epoch, "a Sync crash keeps the epoch");
    }
}

#[test]
fn kill_9_under_async_changes_the_epoch_and_keeps_seqs_dense() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (child_epoch, acked) = run_round(dir.path(), "async", 500);
    assert!(!acked.is_empty());
    let reopened = verify(dir.path(), "async", &acked, false);
    assert_ne!(reopened, child_epoch, "history may be lost: new epoch");
    // A clean close keeps the epoch.
    assert_eq!(verify(dir.path(), "async", &[], false), reopened);
}

#[test]
fn async_appends_are_durable_a_second_later() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (child_epoch, acked) = run_round(dir.path(), "async-idle", usize::MAX);
    assert_eq!(acked.len(), 16 * 10);
    // Killed uncleanly, so a new epoch, but nothing acknowledged over a second ago is lost.
    let reopened = verify(dir.path(), "async", &acked, true);
    assert_ne!(reopened, child_epoch);
}
