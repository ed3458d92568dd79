//! Durable Streams on a cluster (nodes sharing one Redis), where a stream's
//! metadata lives with its channel's keys (docs/durable-streams.md,
//! "Metadata"): a Redis that lost its data gives the same answer on every
//! node and nothing a node acknowledged ends up in no stream; a producer's
//! pipelined appends, sent while the journal is slow, all land in order;
//! a close made on one node ends a live read on another.

use gapless_testkit::redis::Redis;
use gapless_testkit::Opts;
use gapless_testkit::Server;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const J: (&str, &str) = ("content-type", "application/json");

async fn node(redis: &Redis) -> Server {
    Server::with(Opts {
        args: ["--redis", &redis.url(), "--redis-timeout-ms", "2000"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        ..Opts::default()
    })
    .await
}

/// Sends `req` until it is answered other than 503 (Redis coming back).
async fn settled(
    s: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let t0 = Instant::now();
    loop {
        let r = s.request(method, path, headers, body).await;
        if r.status != 503 || t0.elapsed() > Duration::from_secs(20) {
            return (r.status, r.text);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Issue 28: after a Redis without persistence lost its data, a node that
/// had served a stream kept acknowledging appends to it (204) while a
/// restarted node answered 404, and a creation on the other node won while
/// the first node's acknowledged appends were in no stream.
#[tokio::test]
async fn a_redis_that_lost_its_data_gives_one_answer_and_loses_nothing_acknowledged() {
    let Some(_) = Redis::start_or_skip("ds_cluster::loss").await else {
        return;
    };
    let mut redis = Redis::start_with(&["--appendonly", "no", "--save", ""]).await;
    let (a, b) = (node(&redis).await, node(&redis).await);
    assert_eq!(a.request("PUT", "/ds/lost", &[J], "").await.status, 201);
    assert_eq!(
        a.request("POST", "/ds/lost", &[J], r#"{"n":1}"#)
            .await
            .status,
        204
    );
    assert_eq!(b.request("HEAD", "/ds/lost", &[], "").await.status, 200);
    // Every key gone, as a Redis restarted without persistence.
    redis.restart().await;
    let (on_a, _) = settled(&a, "POST", "/ds/lost", &[J], r#"{"n":2}"#).await;
    let (on_b, _) = settled(&b, "POST", "/ds/lost", &[J], r#"{"n":2}"#).await;
    assert_eq!((on_a, on_b), (404, 404), "both nodes: the stream is gone");
    assert_eq!(settled(&a, "HEAD", "/ds/lost", &[], "").await.0, 404);
    // Created again on B: A's appends go to the new stream (or are refused
    // while A still holds the old one), never acknowledged into nothing.
    assert_eq!(b.request("PUT", "/ds/lost", &[J], "").await.status, 201);
    let mut acknowledged = Vec::new();
    for i in 0..10 {
        let node = if i % 2 == 0 { &a } else { &b };
        let body = json!({"n": 100 + i}).to_string();
        let (status, text) = settled(node, "POST", "/ds/lost", &[J], &body).await;
        match status {
            204 => acknowledged.push(json!({"n": 100 + i})),
            404 => {}
            other => panic!("append {i}: {other} {text}"),
        }
    }
    assert!(
        acknowledged.len() >= 8,
        "at most the first append per node refused: {acknowledged:?}"
    );
    for s in [&a, &b] {
        let read = s.request("GET", "/ds/lost?offset=-1", &[], "").await;
        assert_eq!(read.json, Value::Array(acknowledged.clone()));
    }
}

/// Issue 28: a producer's seqs 1-4 sent in order while its seq 0 was in
/// flight on a slow journal were refused `409 Producer-Expected-Seq 1`.
/// With Redis paused, five pipelined appends are all accepted, in order.
#[tokio::test]
async fn pipelined_producer_appends_on_a_slow_journal_all_land_in_order() {
    let Some(redis) = Redis::start_or_skip("ds_cluster::pipelined").await else {
        return;
    };
    let s = node(&redis).await;
    assert_eq!(s.request("PUT", "/ds/piped", &[J], "").await.status, 201);
    for round in 0..3u64 {
        redis.cli(&["CLIENT", "PAUSE", "400", "WRITE"]).await;
        let mut sent = Vec::new();
        for i in 0..5u64 {
            let seq = (round * 5 + i).to_string();
            let url = s.url("/ds/piped");
            let http = s.http.clone();
            sent.push(tokio::spawn(async move {
                http.post(url)
                    .header("content-type", "application/json")
                    .header("producer-id", "w")
                    .header("producer-epoch", "0")
                    .header("producer-seq", seq.as_str())
                    .body(format!(r#"{{"seq":{seq}}}"#))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
            }));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for (i, t) in sent.into_iter().enumerate() {
            let status = t.await.expect("task").expect("answered");
            assert_eq!(status, 200, "round {round}, append {i}");
        }
    }
    let read = s.request("GET", "/ds/piped?offset=-1", &[], "").await;
    let want: Vec<Value> = (0..15).map(|i| json!({"seq": i})).collect();
    assert_eq!(read.json, Value::Array(want));
}

/// A close made on one node ends a live SSE read on the other (the journal
/// tells every node that the metadata changed).
#[tokio::test]
async fn a_close_on_one_node_ends_a_live_read_on_another() {
    let Some(redis) = Redis::start_or_skip("ds_cluster::close").await else {
        return;
    };
    let (a, b) = (node(&redis).await, node(&redis).await);
    let c = a.request("PUT", "/ds/shut", &[J], r#"[{"n":1}]"#).await;
    assert_eq!(c.status, 201, "{}", c.text);
    let url = b.url("/ds/shut?offset=-1&live=sse");
    let http = b.http.clone();
    let read = tokio::spawn(async move {
        let r = http.get(url).send().await.expect("SSE");
        r.text().await.unwrap_or_default()
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let closed = a
        .request("POST", "/ds/shut", &[("stream-closed", "true")], "")
        .await;
    assert_eq!(closed.status, 204, "{}", closed.text);
    let text = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the live read ends within 10 s of the close")
        .expect("task");
    assert!(text.contains(r#""streamClosed":true"#), "{text}");
}
