//! Durable Streams metadata is durable and shared (docs/durable-streams.md,
//! "Metadata"): streams survive a `kill -9` with their content type, closure,
//! TTL, forks and offsets; an idempotent producer's append acknowledged
//! before a `kill -9` and retried after it is stored once; and in a cluster a
//! stream created on one node is known on the others.

use gapless_testkit::redis::Redis;
use gapless_testkit::{Opts, Server};
use std::time::{Duration, Instant};

const JSON: (&str, &str) = ("content-type", "application/json");
const TEXT: (&str, &str) = ("content-type", "text/plain");

/// What a client sees of a stream: HEAD's headers that matter and a
/// catch-up read from the start.
async fn seen(s: &Server, path: &str) -> (u16, Vec<Option<String>>, String) {
    let h = s.request("HEAD", path, &[], "").await;
    let heads = [
        "content-type",
        "stream-next-offset",
        "stream-closed",
        "stream-ttl",
    ]
    .iter()
    .map(|k| h.header(k).map(str::to_owned))
    .collect();
    let body = s
        .request("GET", &format!("{path}?offset=-1"), &[], "")
        .await;
    (h.status, heads, body.text)
}

#[tokio::test]
async fn streams_survive_a_kill_9_with_type_closure_ttl_forks_and_offsets() {
    let mut s = Server::start(&[]).await;
    let put = |p: &'static str, h: Vec<(&'static str, &'static str)>| {
        let s = &s;
        async move {
            let r = s.request("PUT", p, &h, "").await;
            assert_eq!(r.status, 201, "PUT {p}: {}", r.text);
        }
    };
    put("/ds/r/text", vec![TEXT]).await;
    put("/ds/r/json", vec![JSON]).await;
    put("/ds/r/closed", vec![TEXT]).await;
    put("/ds/r/ttl", vec![TEXT, ("stream-ttl", "3600")]).await;
    for (p, h, b) in [
        ("/ds/r/text", TEXT, "hello "),
        ("/ds/r/text", TEXT, "world"),
        ("/ds/r/json", JSON, r#"[{"a":1},{"a":2}]"#),
        ("/ds/r/closed", TEXT, "last"),
        ("/ds/r/ttl", TEXT, "t"),
    ] {
        let r = s.request("POST", p, &[h], b).await;
        assert_eq!(r.status, 204, "POST {p}: {}", r.text);
    }
    let r = s
        .request("POST", "/ds/r/closed", &[("stream-closed", "true")], "")
        .await;
    assert_eq!(r.status, 204, "{}", r.text);
    let r = s
        .request(
            "PUT",
            "/ds/r/fork",
            &[JSON, ("stream-forked-from", "/ds/r/json")],
            "",
        )
        .await;
    assert_eq!(r.status, 201, "fork: {}", r.text);
    let r = s.request("POST", "/ds/r/fork", &[JSON], r#"{"a":3}"#).await;
    assert_eq!(r.status, 204, "{}", r.text);

    let paths = [
        "/ds/r/text",
        "/ds/r/json",
        "/ds/r/closed",
        "/ds/r/ttl",
        "/ds/r/fork",
    ];
    let mut before = Vec::new();
    for p in paths {
        before.push(seen(&s, p).await);
    }
    assert_eq!(before[4].2, r#"[{"a":1},{"a":2},{"a":3}]"#);
    assert_eq!(before[2].1[2].as_deref(), Some("true"), "closed");
    assert_eq!(before[3].1[3].as_deref(), Some("3600"), "ttl");

    s.kill9().await;
    s.restart().await;

    for (p, b) in paths.iter().zip(&before) {
        assert_eq!(&seen(&s, p).await, b, "{p} after kill -9");
    }
    // Still closed; the others still take appends, at the offsets after theirs.
    let r = s.request("POST", "/ds/r/closed", &[TEXT], "more").await;
    assert_eq!(r.status, 409, "{}", r.text);
    let r = s.request("POST", "/ds/r/text", &[TEXT], "!").await;
    assert_eq!(r.status, 204, "{}", r.text);
    assert!(
        r.header("stream-next-offset") > before[0].1[1].as_deref(),
        "offsets keep growing"
    );
    assert_eq!(
        s.request("GET", "/ds/r/text?offset=-1", &[], "").await.text,
        "hello world!"
    );
    // A deleted stream stays deleted.
    let r = s.request("DELETE", "/ds/r/ttl", &[], "").await;
    assert_eq!(r.status, 204, "{}", r.text);
    s.kill9().await;
    s.restart().await;
    assert_eq!(s.request("HEAD", "/ds/r/ttl", &[], "").await.status, 404);
    assert_eq!(s.request("HEAD", "/ds/r/text", &[], "").await.status, 200);
    // The records' channel is not reachable through gapless's own API.
    let h = s.history("gapless%2Fds-streams", "").await;
    assert_eq!(h.status, 400, "{}", h.text);
}

fn producer<'a>(id: &'a str, epoch: &'a str, seq: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        TEXT,
        ("producer-id", id),
        ("producer-epoch", epoch),
        ("producer-seq", seq),
    ]
}

#[tokio::test]
async fn a_producer_append_acknowledged_before_a_kill_9_and_retried_after_is_stored_once() {
    let mut s = Server::start(&[]).await;
    let r = s.request("PUT", "/ds/p/1", &[TEXT], "").await;
    assert_eq!(r.status, 201, "{}", r.text);
    for (seq, body) in [("0", "a"), ("1", "b")] {
        let r = s
            .request("POST", "/ds/p/1", &producer("w", "0", seq), body)
            .await;
        assert_eq!(r.status, 200, "seq {seq}: {}", r.text);
    }
    let r = s
        .request("POST", "/ds/p/1", &[TEXT, ("stream-seq", "0005")], "c")
        .await;
    assert_eq!(r.status, 204, "{}", r.text);

    s.kill9().await;
    s.restart().await;

    // The retry of the acknowledged seq 1 is a duplicate (204), not stored.
    let r = s
        .request("POST", "/ds/p/1", &producer("w", "0", "1"), "b")
        .await;
    assert_eq!(r.status, 204, "{}", r.text);
    assert_eq!(r.header("producer-seq"), Some("1"));
    // The producer continues at seq 2; a gap and a stale epoch are refused as before.
    let r = s
        .request("POST", "/ds/p/1", &producer("w", "0", "4"), "x")
        .await;
    assert_eq!(r.status, 409, "{}", r.text);
    assert_eq!(r.header("producer-expected-seq"), Some("2"));
    let r = s
        .request("POST", "/ds/p/1", &producer("w", "0", "2"), "d")
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // Stream-Seq coordination survived too.
    let r = s
        .request("POST", "/ds/p/1", &[TEXT, ("stream-seq", "0005")], "c")
        .await;
    assert_eq!(r.status, 409, "{}", r.text);

    assert_eq!(
        s.request("GET", "/ds/p/1?offset=-1", &[], "").await.text,
        "abcd"
    );
    assert_eq!(s.all_data("p~1").await, ["a", "b", "c", "d"]);
}

#[tokio::test]
async fn a_stream_created_on_one_node_is_appended_read_and_closed_on_another() {
    let Some(redis) = Redis::start_or_skip("ds cluster").await else {
        return;
    };
    let node = || async {
        Server::with(Opts {
            args: vec!["--redis".to_owned(), redis.url()],
            ..Opts::default()
        })
        .await
    };
    let a = node().await;
    let b = node().await;
    // b serves a Durable Streams request first, so it reads the records early.
    assert_eq!(b.request("HEAD", "/ds/c/none", &[], "").await.status, 404);

    let r = a.request("PUT", "/ds/c/1", &[JSON], r#"[{"n":1}]"#).await;
    assert_eq!(r.status, 201, "{}", r.text);
    // Known on b at once: same type, appendable, readable.
    let r = b.request("PUT", "/ds/c/1", &[TEXT], "").await;
    assert_eq!(r.status, 409, "another type on b: {}", r.text);
    let mut p = producer("w", "0", "0");
    p[0] = JSON;
    let r = b.request("POST", "/ds/c/1", &p, r#"{"n":2}"#).await;
    assert_eq!(r.status, 200, "{}", r.text);
    // The producer's retry on a is a duplicate, stored once.
    let r = a.request("POST", "/ds/c/1", &p, r#"{"n":2}"#).await;
    assert_eq!(r.status, 204, "{}", r.text);
    assert_eq!(
        a.request("GET", "/ds/c/1?offset=-1", &[], "").await.text,
        r#"[{"n":1},{"n":2}]"#
    );
    // A close on a reaches b.
    let r = a
        .request("POST", "/ds/c/1", &[("stream-closed", "true")], "")
        .await;
    assert_eq!(r.status, 204, "{}", r.text);
    let t0 = Instant::now();
    while b
        .request("HEAD", "/ds/c/1", &[], "")
        .await
        .header("stream-closed")
        != Some("true")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "b never saw the close"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = b.request("POST", "/ds/c/1", &[JSON], r#"{"n":3}"#).await;
    assert_eq!(r.status, 409, "{}", r.text);
    // Deleted on b: gone on a.
    let r = b.request("DELETE", "/ds/c/1", &[], "").await;
    assert_eq!(r.status, 204, "{}", r.text);
    let t0 = Instant::now();
    while a.request("HEAD", "/ds/c/1", &[], "").await.status != 404 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "a never saw the delete"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Retention applies to the records' channel too: a live stream's record
/// is rewritten before retention evicts it, so a stream idle while others
/// write many records still survives a restart.
#[tokio::test]
async fn a_quiet_streams_record_outlives_retention_of_the_records_channel() {
    // Rewrites start 500 + 2 x 4 streams behind the head; 700 are kept.
    let mut s = Server::start(&["--retention-events", "700"]).await;
    let r = s.request("PUT", "/ds/q/quiet", &[JSON], r#"{"q":1}"#).await;
    assert_eq!(r.status, 201, "{}", r.text);
    for b in 0..3 {
        let r = s
            .request("PUT", &format!("/ds/q/busy{b}"), &[TEXT], "")
            .await;
        assert_eq!(r.status, 201, "{}", r.text);
    }
    // 750 records (one per producer append, three streams at once) in
    // chunks of 150, with pauses longer than the rewrite pass's period (1 s).
    for chunk in 0..5u64 {
        let mut tasks = Vec::new();
        for b in 0..3 {
            let http = s.http.clone();
            let url = s.url(&format!("/ds/q/busy{b}"));
            tasks.push(tokio::spawn(async move {
                for k in 0..50u64 {
                    let seq = (chunk * 50 + k).to_string();
                    let r = http
                        .post(&url)
                        .header("content-type", "text/plain")
                        .header("producer-id", "w")
                        .header("producer-epoch", "0")
                        .header("producer-seq", &seq)
                        .body("x")
                        .send()
                        .await
                        .expect("append");
                    assert_eq!(r.status().as_u16(), 200, "seq {seq}");
                }
            }));
        }
        for t in tasks {
            t.await.expect("appender");
        }
        tokio::time::sleep(Duration::from_millis(1300)).await;
    }
    s.kill9().await;
    s.restart().await;
    let h = s.request("HEAD", "/ds/q/quiet", &[], "").await;
    assert_eq!(h.status, 200, "the quiet stream is known after the restart");
    assert_eq!(h.header("content-type"), Some("application/json"));
    let r = s
        .request("POST", "/ds/q/busy0", &producer("w", "0", "249"), "x")
        .await;
    assert_eq!(r.status, 204, "{}", r.text);
}

/// A producer appends without pause while the server is killed (`kill -9`)
/// under it, twice; after each restart it retries its unacknowledged append
/// and goes on. Whatever the kill interrupted (before, inside or after the
/// append and its record), every message is stored exactly once, in order.
#[tokio::test]
async fn a_producer_killed_under_mid_append_retries_and_every_message_is_stored_once() {
    let mut s = Server::start(&[]).await;
    let r = s.request("PUT", "/ds/k/1", &[TEXT], "").await;
    assert_eq!(r.status, 201, "{}", r.text);
    let mut next = 0u64; // the first seq not acknowledged
    for round in 0..3 {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let http = s.http.clone();
        let url = s.url("/ds/k/1");
        let flag = stop.clone();
        let writer = tokio::spawn(async move {
            let mut seq = next;
            // The retry of the append the last kill interrupted comes first.
            loop {
                let r = http
                    .post(&url)
                    .header("content-type", "text/plain")
                    .header("producer-id", "p")
                    .header("producer-epoch", "0")
                    .header("producer-seq", seq.to_string())
                    .body(format!("<{seq}>"))
                    .timeout(Duration::from_secs(10))
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status().is_success() => seq += 1,
                    Ok(r) => panic!("seq {seq}: {} {:?}", r.status(), r.text().await),
                    Err(_) => return seq, // killed under it: not acknowledged
                }
                if flag.load(std::sync::atomic::Ordering::Relaxed) && seq >= next + 5 {
                    return seq;
                }
            }
        });
        if round < 2 {
            tokio::time::sleep(Duration::from_millis(300 + 170 * round)).await;
            s.kill9().await;
            next = writer.await.expect("writer");
            s.restart().await;
        } else {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            next = writer.await.expect("writer");
        }
    }
    let want: String = (0..next).map(|n| format!("<{n}>")).collect();
    let got = s.request("GET", "/ds/k/1?offset=-1", &[], "").await;
    assert_eq!(got.text, want, "every message once, in order");
}
