//! A damaged journal (`docs/reliability.md`): a journal file truncated at
//! points across its length, or with bytes overwritten in its middle. The
//! server either starts and serves exactly the original events, or refuses
//! to start with an error naming the file and what to do; it never serves an
//! event with wrong content and never panics. `gapless journal check`
//! agrees with it on each file.

use gapless_testkit::Server;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const CHANNELS: u64 = 5;
const EVENTS: u64 = 300;

fn data_of(i: u64) -> String {
    format!("event-{i}-{}", "x".repeat(150 + (i as usize % 50)))
}

/// Every retained event of every channel, as (seq, data) per channel.
async fn contents(s: &Server) -> BTreeMap<String, Vec<(u64, String)>> {
    let mut out = BTreeMap::new();
    for c in 0..CHANNELS {
        let name = format!("c{c}");
        let events: Vec<(u64, String)> = s
            .all_events(&name)
            .await
            .iter()
            .map(|e: &Value| {
                (
                    e["seq"].as_u64().unwrap_or(0),
                    e["data"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect();
        out.insert(name, events);
    }
    out
}

fn check(dir: &Path) -> (bool, String) {
    check_logging(dir, "warn")
}

/// `gapless journal check` on `dir` with `RUST_LOG=level`: whether it calls
/// the journal whole, and all it printed.
fn check_logging(dir: &Path, level: &str) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gapless"))
        .args(["journal", "check", "--data-dir"])
        .arg(dir)
        .env("RUST_LOG", level)
        .output()
        .expect("gapless journal check");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Starts gapless on `dir`; `Ok(contents)` if it serves, `Err(stderr)` if it refuses.
async fn serve(dir: &Path) -> Result<BTreeMap<String, Vec<(u64, String)>>, String> {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_gapless"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn gapless");
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    let mut lines = tokio::io::BufReader::new(stdout);
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(15),
        lines.read_line(&mut line),
    )
    .await
    .expect("gapless answers within 15 s");
    if matches!(read, Ok(n) if n > 0) && line.contains("listening on") {
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .expect("address")
            .to_owned();
        let s = Server::attach(addr.parse().expect("addr"));
        let got = contents(&s).await;
        let _ = child.kill().await;
        Ok(got)
    } else {
        let status = child.wait().await.expect("wait");
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err).await;
        }
        assert!(!status.success(), "exited 0 without listening: {err}");
        Err(err)
    }
}

/// A refusal says what is wrong in plain words, not in the storage
/// engine's (page numbers, layouts, a panic's text).
#[track_caller]
fn assert_plain_words(what: &str, said: &str) {
    assert!(
        said.contains("cut off")
            || said.contains("overwritten or lost")
            || said.contains("of channel \""),
        "{what}: says what is wrong in plain words: {said}"
    );
    for engine in [
        "file_len=",
        "layout_len",
        "page type",
        "DB corrupted",
        "Primary is",
    ] {
        assert!(
            !said.contains(engine),
            "{what}: the engine's words ({engine}) only at debug level: {said}"
        );
    }
}

#[tokio::test]
async fn a_truncated_or_overwritten_journal_is_served_whole_or_refused_never_wrong() {
    // A journal with known content, closed cleanly.
    let mut s = Server::start(&[]).await;
    for i in 1..=EVENTS {
        s.publish(&format!("c{}", i % CHANNELS), &data_of(i)).await;
    }
    let original = contents(&s).await;
    s.sigterm().await;
    let file = s.data_dir().join("journal.redb");
    let pristine = std::fs::read(&file).expect("journal file");
    let len = pristine.len();
    assert!(len > 64 * 1024, "a journal of some size: {len}");

    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    for k in 1..=8 {
        let at = len * k / 9;
        cases.push((
            format!("truncated at {at} of {len}"),
            pristine[..at].to_vec(),
        ));
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for k in 1..=10 {
        let at = len * k / 11;
        let n = 16usize << (k % 8);
        let mut bytes = pristine.clone();
        for b in bytes.iter_mut().skip(at).take(n) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *b = seed as u8;
        }
        cases.push((format!("{n} bytes overwritten at {at}"), bytes));
    }

    let mut served = 0;
    let mut refused = 0;
    for (what, bytes) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("journal.redb"), &bytes).expect("write");
        let (whole, said) = check(dir.path());
        // Check first, on its own copy: it may rebuild allocation state.
        let dir2 = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir2.path().join("journal.redb"), &bytes).expect("write");
        match serve(dir2.path()).await {
            Ok(got) => {
                served += 1;
                assert_eq!(
                    got, original,
                    "{what}: served, so it must serve exactly the original events"
                );
                assert!(
                    whole,
                    "{what}: the server served it, so check must call it whole: {said}"
                );
            }
            Err(err) => {
                refused += 1;
                assert!(!err.contains("panicked"), "{what}: no panic: {err}");
                assert!(
                    err.contains("journal.redb") && err.contains("damaged"),
                    "{what}: the refusal names the file and says it is damaged: {err}"
                );
                assert!(
                    err.contains("move it away")
                        && err.contains("backup")
                        && err.contains("gapless journal check --data-dir"),
                    "{what}: says what to do: {err}"
                );
                assert_plain_words(&what, &err);
                assert!(
                    !whole,
                    "{what}: refused to serve, so check must not call it whole: {said}"
                );
                assert_plain_words(&what, &said);
                // The engine's own words (a caught panic's text among them) are
                // there at debug level only.
                let (_, debug) = check_logging(dir.path(), "debug");
                assert!(
                    debug.contains("the storage engine's words on a damaged journal"),
                    "{what}: RUST_LOG=debug shows the engine's words: {debug}"
                );
            }
        }
    }
    assert!(refused > 0, "some damage is detected");
    eprintln!("damaged journals: {served} served whole, {refused} refused");
}

#[tokio::test]
async fn journal_check_counts_in_words() {
    let mut s = Server::start(&[]).await;
    s.publish("only", "x").await;
    let _ = s.sigterm().await;
    let (whole, out) = check(&s.data_dir());
    assert!(whole, "{out}");
    assert!(
        out.contains("is whole: 1 channel, 1 event retained, 0 logged commits to apply"),
        "{out}"
    );
}

/// A data directory with a purged channel (the store's `purged` table) is
/// whole, and the check counts the purged channel.
#[tokio::test]
async fn journal_check_knows_purged_channels() {
    let mut s = Server::start(&[]).await;
    s.publish("p", "before-1").await;
    s.publish("p", "before-2").await;
    s.publish("q", "x").await;
    let r = s.request("DELETE", "/v1/channels/p", &[], "").await;
    assert_eq!(r.status, 204, "{}", r.text);
    s.publish("p", "after").await;
    let _ = s.sigterm().await;
    let (whole, out) = check(&s.data_dir());
    assert!(whole, "{out}");
    assert!(
        out.contains("is whole: 2 channels, 2 events retained"),
        "{out}"
    );
    assert!(out.contains(", 1 purged channel"), "{out}");
}

/// A copy of `dir` (the journal file and its write-ahead log) in a new
/// directory, with `damage` applied to the copy of `journal.wal.0`.
fn copy_damaged(dir: &Path, damage: &dyn Fn(&mut Vec<u8>)) -> tempfile::TempDir {
    let copy = tempfile::tempdir().expect("tempdir");
    for name in ["journal.redb", "journal.wal.0", "journal.wal.1"] {
        let mut bytes = std::fs::read(dir.join(name)).expect("read data file");
        if name == "journal.wal.0" {
            damage(&mut bytes);
        }
        std::fs::write(copy.path().join(name), bytes).expect("write copy");
    }
    copy
}

/// After a `kill -9` (the commits only in the write-ahead log), a byte
/// flipped in the log's header, or in a frame with acknowledged frames of
/// the log after it, makes `journal check` exit non-zero with the same
/// refusal the start gives; a torn last frame is accepted by both.
#[tokio::test]
async fn journal_check_and_the_start_agree_on_a_damaged_write_ahead_log() {
    let mut s = Server::start(&[]).await;
    let data = |i: u64| format!("wal-commit-{i}-{}", "z".repeat(100));
    for i in 1..=4 {
        s.publish("c0", &data(i)).await;
    }
    s.kill9().await;
    let dir = s.data_dir();
    let at = |i: u64| {
        move |b: &mut Vec<u8>| {
            let needle = data(i);
            let p = b
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .expect("the commit's data in journal.wal.0");
            b[p + 40] ^= 0x10;
        }
    };
    let header = |b: &mut Vec<u8>| b[20] ^= 0x10;
    let mid = at(2);
    for (what, damage, words) in [
        (
            "the header",
            &header as &dyn Fn(&mut Vec<u8>),
            "write-ahead log (journal.wal.0 and journal.wal.1) is missing",
        ),
        ("commit 2 of 4", &mid, "journal.wal.0 is damaged at byte"),
    ] {
        let (whole, said) = check(copy_damaged(&dir, damage).path());
        assert!(!whole, "{what}: check must refuse: {said}");
        assert!(said.contains(words), "{what}: {said}");
        let refused = serve(copy_damaged(&dir, damage).path())
            .await
            .expect_err("the start refuses");
        assert!(refused.contains(words), "{what}: {refused}");
    }
    let torn = at(4);
    let (whole, said) = check(copy_damaged(&dir, &torn).path());
    assert!(
        whole && said.contains("3 logged commits to apply"),
        "{said}"
    );
    let got = serve(copy_damaged(&dir, &torn).path())
        .await
        .expect("served");
    let want: Vec<(u64, String)> = (1..=3).map(|i| (i, data(i))).collect();
    assert_eq!(
        got.get("c0"),
        Some(&want),
        "the commits before the torn frame"
    );
}
