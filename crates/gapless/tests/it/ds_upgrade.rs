//! Durable Streams written by the release before per-channel metadata
//! (f3611da, which kept every stream's metadata as records in the side
//! channel `gapless/ds-streams`) open unchanged: a data directory and a
//! Redis dump written by that release (fixtures/ds-f3611da, made by its
//! `make.sh`) are read by today's binary, which moves the records into each
//! stream's channel at the first Durable Streams request
//! (docs/durable-streams.md, "Metadata"), and every stream answers as that
//! release answered: its offsets, its messages, closure, a fork over a
//! soft-deleted source, a deleted stream, and its producers' and
//! `Stream-Seq` state, also after a second restart.

use gapless_testkit::redis::Redis;
use gapless_testkit::Opts;
use gapless_testkit::{copy_dir, Server};
use serde_json::{json, Value};
use std::path::PathBuf;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ds-f3611da")
}

fn offsets(file: &str) -> Value {
    let text = std::fs::read_to_string(fixture().join(file)).expect("offsets file");
    serde_json::from_str(&text).expect("offsets JSON")
}

/// The epoch and the seq an offset names (docs/durable-streams.md,
/// "Offsets and cursors"): 19 digits carry the seq times 1000, the 20
/// digits of the old release the seq itself.
fn position(offset: &str) -> Option<(String, u64)> {
    let (epoch, n) = offset.split_once('_')?;
    let v: u64 = n.parse().ok()?;
    match n.len() {
        19 => Some((epoch.to_owned(), v / 1000)),
        20 => Some((epoch.to_owned(), v)),
        _ => None,
    }
}

const T: (&str, &str) = ("content-type", "text/plain");
const J: (&str, &str) = ("content-type", "application/json");

/// Checks every stream of the fixture against what the old release
/// answered: the same tail offsets (`exact`), or the same positions in new
/// epochs (a Redis restored from a dump: docs/cluster.md, "Loss in Redis is
/// never silent", starts new epochs for what it cannot vouch for).
async fn streams_as_written(s: &Server, want: &Value, exact: bool) {
    let seq = |o: Option<&str>| o.and_then(position).map(|(_, seq)| seq);
    // A fork whose own channel starts a new epoch becomes a plain stream of
    // it (docs/durable-streams.md, "Purge"), as in the older release.
    let names: &[&str] = if exact {
        &["plain", "json", "seq", "closed", "fork"]
    } else {
        &["plain", "json", "seq", "closed"]
    };
    for name in names {
        let head = s.request("HEAD", &format!("/ds/{name}"), &[], "").await;
        assert_eq!(head.status, 200, "HEAD /ds/{name}");
        let got = head.header("stream-next-offset");
        if exact {
            let old = want[name].as_str().expect("an offset");
            assert_eq!(
                got.and_then(position),
                position(old),
                "the tail of /ds/{name}"
            );
            // The offset the old release gave still names the tail.
            let at = s
                .request("GET", &format!("/ds/{name}?offset={old}"), &[], "")
                .await;
            assert_eq!(at.status, 200, "/ds/{name} at {old}: {}", at.text);
            assert_eq!(at.header("stream-up-to-date"), Some("true"), "{name}");
            assert!(matches!(at.text.as_str(), "" | "[]"), "{name}: {}", at.text);
        } else {
            assert_eq!(seq(got), seq(want[name].as_str()), "the tail of /ds/{name}");
        }
    }
    let read = |p: &str| format!("/ds/{p}?offset=-1");
    assert_eq!(s.request("GET", &read("plain"), &[], "").await.text, "ab");
    let json = s.request("GET", &read("json"), &[], "").await;
    assert_eq!(json.json, json!([{"n":0},{"n":1},{"n":2}]));
    let closed = s.request("GET", &read("closed"), &[], "").await;
    assert_eq!(
        (closed.text.as_str(), closed.header("stream-closed")),
        ("x", Some("true"))
    );
    let fork = s.request("GET", &read("fork"), &[], "").await.text;
    assert_eq!(fork, if exact { "s1s2f1" } else { "f1" });
    if exact {
        // An offset before the tail, as the old release gave it, reads the
        // same messages from it.
        let point = want["fork_point"].as_str().expect("an offset");
        let from = s
            .request("GET", &format!("/ds/fork?offset={point}"), &[], "")
            .await;
        assert_eq!(from.text, "f1", "the fork from its fork point");
    }
    assert_eq!(s.request("GET", &read("src"), &[], "").await.status, 410);
    assert_eq!(s.request("GET", &read("gone"), &[], "").await.status, 404);
}

/// The producer, `Stream-Seq` and closure state carried over: a retry is a
/// duplicate, the next seq appends, a gap and a regression are refused, a
/// closed stream takes nothing.
async fn guards_as_written(s: &Server) {
    let prod = |seq: &'static str| {
        [
            J,
            ("producer-id", "p"),
            ("producer-epoch", "0"),
            ("producer-seq", seq),
        ]
    };
    let dup = s
        .request("POST", "/ds/json", &prod("2"), r#"{"n":2}"#)
        .await;
    assert_eq!(dup.status, 204, "a retry of seq 2: {}", dup.text);
    let gap = s
        .request("POST", "/ds/json", &prod("5"), r#"{"n":5}"#)
        .await;
    assert_eq!(gap.status, 409, "a gap: {}", gap.text);
    assert_eq!(gap.header("producer-expected-seq"), Some("3"));
    let next = s
        .request("POST", "/ds/json", &prod("3"), r#"{"n":3}"#)
        .await;
    assert_eq!(next.status, 200, "seq 3: {}", next.text);
    let again = s
        .request("POST", "/ds/seq", &[T, ("stream-seq", "002")], "s2")
        .await;
    assert_eq!(again.status, 409, "Stream-Seq 002 again: {}", again.text);
    let closed = s.request("POST", "/ds/closed", &[T], "y").await;
    assert_eq!(closed.status, 409, "{}", closed.text);
    let read = s.request("GET", "/ds/json?offset=-1", &[], "").await;
    assert_eq!(read.json, json!([{"n":0},{"n":1},{"n":2},{"n":3}]));
}

#[tokio::test]
async fn a_data_directory_of_the_release_with_the_side_channel_opens_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    copy_dir(&fixture().join("data"), &data);
    let mut s = Server::with(Opts {
        data_dir: Some(data),
        ..Opts::default()
    })
    .await;
    let want = offsets("offsets.json");
    streams_as_written(&s, &want, true).await;
    guards_as_written(&s).await;
    assert!(
        s.log().contains("moved from gapless/ds-streams"),
        "the first start says it moved the records"
    );
    // The side channel is gone; the metadata now lives with each channel.
    s.kill9().await;
    s.restart().await;
    let dup = s
        .request(
            "POST",
            "/ds/json",
            &[
                J,
                ("producer-id", "p"),
                ("producer-epoch", "0"),
                ("producer-seq", "3"),
            ],
            r#"{"n":3}"#,
        )
        .await;
    assert_eq!(dup.status, 204, "after a restart: {}", dup.text);
    assert_eq!(
        s.request("GET", "/ds/fork?offset=-1", &[], "").await.text,
        "s1s2f1"
    );
}

#[tokio::test]
async fn a_redis_written_by_the_release_with_the_side_channel_opens_unchanged() {
    let Some(_) = Redis::start_or_skip("ds_upgrade::redis").await else {
        return;
    };
    let mut redis = Redis::start_with(&["--appendonly", "no"]).await;
    redis.kill9().await;
    std::fs::copy(fixture().join("dump.rdb"), redis.dir().join("dump.rdb")).expect("copy the dump");
    redis.restart().await;
    let url = redis.url();
    let node = || {
        Server::with(Opts {
            args: vec!["--redis".into(), url.clone()],
            memory: false,
            ..Opts::default()
        })
    };
    let (a, b) = (node().await, node().await);
    let want = offsets("offsets-redis.json");
    // Two nodes upgrading at once agree.
    let (ra, rb) = tokio::join!(
        a.request("HEAD", "/ds/plain", &[], ""),
        b.request("HEAD", "/ds/plain", &[], "")
    );
    assert_eq!((ra.status, rb.status), (200, 200));
    streams_as_written(&a, &want, false).await;
    streams_as_written(&b, &want, false).await;
    guards_as_written(&b).await;
    let dup = a
        .request(
            "POST",
            "/ds/json",
            &[
                J,
                ("producer-id", "p"),
                ("producer-epoch", "0"),
                ("producer-seq", "3"),
            ],
            r#"{"n":3}"#,
        )
        .await;
    assert_eq!(
        dup.status, 204,
        "the other node sees the append: {}",
        dup.text
    );
}
