//! A full disk (`docs/reliability.md`): the data directory on a small tmpfs.
//! Publishes are refused with 507 `journal_full` once the free space falls
//! below `--min-free-disk-bytes`; nothing acknowledged is lost, readers and
//! streams keep working, and publishing resumes without a restart once space
//! is freed. Needs root to mount the tmpfs; skips with a message otherwise.

use gapless_testkit::{Opts, Server};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A tmpfs mounted for the test's life.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?.keep();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            Some(Tmpfs(dir))
        } else {
            eprintln!("skipped: cannot mount a tmpfs here (needs root)");
            None
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn fill(path: &Path, bytes: usize) {
    std::fs::write(path, vec![7u8; bytes]).expect("writing the filler");
}

#[tokio::test]
async fn a_full_disk_refuses_publishes_loses_nothing_and_recovers_without_a_restart() {
    let Some(fs) = Tmpfs::mount("48m") else {
        return;
    };
    let data = fs.0.join("data");
    let s = Server::with(Opts {
        data_dir: Some(data.clone()),
        args: vec!["--min-free-disk-bytes".into(), (8 << 20).to_string()],
        ..Opts::default()
    })
    .await;
    let (mut stream, _) = s.subscribe("c", "").await;
    // Someone else fills most of the disk.
    let filler = fs.0.join("filler");
    fill(&filler, 30 << 20);
    let data_64k = "d".repeat(64 * 1024);
    let mut acked: Vec<u64> = Vec::new();
    let refusal = loop {
        let r = s.post("/v1/channels/c/events", data_64k.clone(), &[]).await;
        match r.status {
            201 => acked.push(r.json["seq"].as_u64().expect("seq")),
            _ => break r,
        }
        assert!(acked.len() < 2000, "the disk never filled");
    };
    let body = refusal.expect_error(507, "journal_full");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("--min-free-disk-bytes")),
        "names the cause: {body}"
    );
    assert!(refusal.header("retry-after").is_some());
    // Readiness says so (a 503 with the reason), liveness does not.
    let ready = s.get("/readyz").await;
    assert_eq!(
        ready.expect_error(503, "unavailable")["reason"],
        "journal_full"
    );
    s.get("/healthz").await.expect(200);
    assert!(
        !acked.is_empty(),
        "some publishes landed before the disk filled"
    );
    // Readers and streams keep working; every acknowledged event is there, intact.
    let history = s.all_events("c").await;
    assert_eq!(history.len(), acked.len());
    assert!(history.iter().all(|e| e["data"] == data_64k.as_str()));
    for seq in &acked {
        let e = stream.next_event().await;
        assert_eq!(gapless_testkit::seq_of(&e.last_event_id, "c"), *seq);
        assert_eq!(e.data.len(), data_64k.len());
    }
    // Still refused while full.
    s.post("/v1/channels/c/events", "x", &[])
        .await
        .expect_error(507, "journal_full");
    // Space is freed: publishing resumes by itself, and the stream goes on.
    std::fs::remove_file(&filler).expect("freeing space");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let resumed = loop {
        let r = s
            .post(
                "/v1/channels/c/events",
                "after",
                &[("Idempotency-Key", "after-1")],
            )
            .await;
        if r.status == 201 {
            break r.json["seq"].as_u64();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "publishing did not resume: {}",
            r.text
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    s.get("/readyz").await.expect(200);
    let e = stream.next_event().await;
    assert_eq!(e.data, "after");
    assert_eq!(
        Some(gapless_testkit::seq_of(&e.last_event_id, "c")),
        resumed
    );
    assert_eq!(
        resumed,
        Some(*acked.last().unwrap_or(&0) + 1),
        "no seq was skipped"
    );
}

#[tokio::test]
async fn without_a_reserve_the_disk_running_out_is_a_507_and_loses_nothing_acknowledged() {
    let Some(fs) = Tmpfs::mount("24m") else {
        return;
    };
    let data = fs.0.join("data");
    let mut s = Server::with(Opts {
        data_dir: Some(data.clone()),
        args: vec!["--min-free-disk-bytes".into(), "0".into()],
        ..Opts::default()
    })
    .await;
    let data_64k = "e".repeat(64 * 1024);
    let mut acked = 0u64;
    let refusal = loop {
        let r = s.post("/v1/channels/c/events", data_64k.clone(), &[]).await;
        match r.status {
            201 => acked = r.json["seq"].as_u64().expect("seq"),
            _ => break r,
        }
        assert!(acked < 2000, "the disk never filled");
    };
    let body = refusal.expect_error(507, "journal_full");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("space")),
        "{body}"
    );
    assert!(s.is_running(), "no crash");
    // After a restart with room (the tmpfs grows), every acknowledged event is there.
    s.kill9().await;
    let grown = Command::new("mount")
        .args(["-o", "remount,size=64m"])
        .arg(&fs.0)
        .status()
        .is_ok_and(|st| st.success());
    assert!(grown, "remounting the tmpfs larger");
    s.restart().await;
    let history = s.all_events("c").await;
    assert_eq!(history.len() as u64, acked);
    assert!(history.iter().all(|e| e["data"] == data_64k.as_str()));
    assert_eq!(s.publish("c", "more").await["seq"], acked + 1);
}
