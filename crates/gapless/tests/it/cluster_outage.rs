//! Cluster mode while Redis is out (stopped, killed, or refusing writes):
//! what each kind of request is answered, and that a page that reconnects
//! in that window keeps its place. An SSE open is told to retry (200 with
//! `retry:` only, since an EventSource gives up for good on a 503) and the
//! reconnect with the same `Last-Event-ID` gets exactly the missed events;
//! other requests keep their 503, and only publishes say a retry needs the
//! same idempotency key. Also the `--redis` URL check and `/readyz` while
//! Redis is out of memory.

use gapless_testkit::redis::Redis;
use gapless_testkit::sse::{Item, Next};
use gapless_testkit::ws::{append, new_session, Ws};
use gapless_testkit::{eventually, seq_of, Opts, Server, SseClient};
use serde_json::json;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CH: &str = "c";

async fn node(redis: &Redis) -> Server {
    Server::with(Opts {
        args: vec![
            "--redis".into(),
            redis.url(),
            "--redis-timeout-ms".into(),
            "400".into(),
        ],
        ..Opts::default()
    })
    .await
}

/// Asserts that `sub` is the answer to an SSE open while the journal is
/// unreachable: 200 `text/event-stream` holding only a `retry:` of 1 to 5 s
/// and a comment naming the cause (no event, no `id:`), then a clean end.
async fn assert_told_to_retry(sub: &mut SseClient, what: &str) {
    assert_eq!(sub.status, 200, "{what}: {}", sub.raw_text());
    assert_eq!(
        sub.header("content-type"),
        Some("text/event-stream"),
        "{what}"
    );
    let (items, end) = sub.until_end(Duration::from_secs(5)).await;
    assert_eq!(end, Next::End, "{what}: a clean end, not a broken stream");
    let [Item::Retry(ms), Item::Comment(why)] = items.as_slice() else {
        panic!("{what}: only retry: and a comment, got {items:?}");
    };
    assert!((1_000..=5_000).contains(ms), "{what}: retry: {ms}");
    assert!(
        why.contains("unavailable") && why.contains("journal is unreachable"),
        "{what}: the comment names the cause: {why:?}"
    );
    assert!(
        !why.contains("Idempotency-Key"),
        "{what}: the publish hint is for publishes: {why:?}"
    );
}

/// GET `first` then GET `second` (with `Last-Event-ID: cursor`) on one
/// keep-alive connection: the second request is read by the HTTP layer,
/// not by the first-request reader. Returns the second answer's head and body.
async fn second_on_one_connection(
    s: &Server,
    first: &str,
    second: &str,
    cursor: &str,
) -> (String, String) {
    let mut tcp = tokio::net::TcpStream::connect(s.addr)
        .await
        .expect("connect");
    let host = s.addr;
    tcp.write_all(format!("GET {first} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .expect("write");
    // The first answer is whole (content-length); read up to its end.
    let mut buf = Vec::new();
    let first_len = loop {
        let mut tmp = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut tmp))
            .await
            .expect("first answer in time")
            .expect("read");
        assert!(n > 0, "EOF before the first answer ended");
        buf.extend_from_slice(&tmp[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let len: usize = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().expect("length"))
                })
                .expect("the first answer has a content-length");
            if buf.len() >= end + 4 + len {
                break end + 4 + len;
            }
        }
    };
    assert!(
        String::from_utf8_lossy(&buf[..first_len]).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf)
    );
    buf.drain(..first_len);
    tcp.write_all(
        format!(
            "GET {second} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\
             Last-Event-ID: {cursor}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut buf))
        .await
        .expect("the second answer ends in time")
        .expect("read");
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a head");
    (head.to_owned(), body.to_owned())
}

#[tokio::test]
async fn an_sse_reconnect_while_redis_is_stopped_is_told_to_retry_then_gets_exactly_the_missed_events(
) {
    let redis = Redis::start().await;
    let a = node(&redis).await;
    // b has never followed the channel: opening a stream there needs Redis.
    let b = node(&redis).await;
    let (mut sub, _) = a.subscribe(CH, "since=earliest").await;
    a.publish_many(CH, "x", 3).await;
    let seen = sub.events(3).await;
    let cursor = seen[2].last_event_id.clone();
    assert_eq!(seq_of(&cursor, CH), 3);
    drop(sub);
    // Published while the page is away: what the reconnect must get.
    a.publish_many(CH, "missed", 2).await;
    let sid = new_session(&a, "s1").await;

    redis.signal("STOP");
    let hdr = [("Last-Event-ID", cursor.as_bytes())];
    for target in [
        format!("/v1/channels/{CH}/sse"),
        format!("/v1/sse?channel={CH}"),
    ] {
        // The first request on a connection (the stream writer's path) ...
        let mut r = b.sse(&target, &hdr).await;
        assert_told_to_retry(&mut r, &target).await;
        // ... and a later one on a keep-alive connection (the HTTP layer's).
        let (head, body) = second_on_one_connection(&b, "/healthz", &target, &cursor).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{target}: {head}\n{body}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/event-stream"),
            "{head}"
        );
        assert!(body.starts_with("retry: "), "{target}: {body:?}");
        assert!(body.contains("\n: unavailable: "), "{target}: {body:?}");
        assert!(!body.contains("id:") && !body.contains("data:"), "{body:?}");
    }

    // Not SSE: still 503 `unavailable`, and only publishes speak of the key.
    let r = b.get(&format!("/v1/channels/{CH}/events")).await;
    r.expect_error(503, "unavailable");
    assert!(
        r.message().contains("journal is unreachable"),
        "{}",
        r.message()
    );
    assert!(!r.message().contains("Idempotency-Key"), "{}", r.message());
    assert!(r.header("retry-after").is_some());
    let r = b.get(&format!("/v1/channels/{CH}")).await;
    r.expect_error(503, "unavailable");
    assert!(!r.message().contains("Idempotency-Key"), "{}", r.message());
    let r = b.get("/readyz").await;
    assert_eq!(r.expect_error(503, "unavailable")["reason"], "unavailable");
    assert!(!r.message().contains("Idempotency-Key"), "{}", r.message());
    let r = b.post(&format!("/v1/channels/{CH}/events"), "p", &[]).await;
    r.expect_error(503, "unavailable");
    assert!(
        r.message().contains("may still have been applied")
            && r.message().contains("Idempotency-Key"),
        "{}",
        r.message()
    );
    let r = b.batch(CH, &json!([{"data": "p"}]), &[]).await;
    r.expect_error(503, "unavailable");
    assert!(r.message().contains("Idempotency-Key"), "{}", r.message());
    let r = append(&b, &sid, "p").await;
    r.expect_error(503, "unavailable");
    assert!(r.message().contains("Idempotency-Key"), "{}", r.message());
    let mut ws = Ws::channels(&b).await;
    ws.send(&json!({"op": "publish", "id": 1, "channel": CH, "data": "p"}))
        .await;
    let reply = ws.json().await;
    assert_eq!(
        (reply["op"].as_str(), reply["code"].as_str()),
        (Some("error"), Some("unavailable")),
        "{reply}"
    );
    assert!(
        reply["message"]
            .as_str()
            .is_some_and(|m| m.contains("idempotency_key")),
        "{reply}"
    );
    ws.send(&json!({"op": "subscribe", "id": 2, "channel": CH, "cursor": cursor}))
        .await;
    let reply = ws.json().await;
    assert_eq!(reply["code"], "unavailable", "{reply}");
    assert!(
        reply["message"]
            .as_str()
            .is_some_and(|m| !m.contains("idempotency")),
        "{reply}"
    );

    redis.signal("CONT");
    eventually(
        "readyz 200 once Redis runs again",
        Duration::from_secs(10),
        || async { b.get("/readyz").await.status == 200 },
    )
    .await;
    // What the EventSource does after `retry:`: the same URL and Last-Event-ID.
    for target in [
        format!("/v1/channels/{CH}/sse"),
        format!("/v1/sse?channel={CH}"),
    ] {
        let mut r = b.sse(&target, &hdr).await;
        let pre = r.preamble().await;
        assert!(pre.gaps.is_empty(), "{target}: no gap: {:?}", pre.gaps);
        let got = r.events(2).await;
        let data: Vec<&str> = got.iter().map(|e| e.data.as_str()).collect();
        assert_eq!(data, ["missed0", "missed1"], "{target}");
        let seqs: Vec<u64> = got.iter().map(|e| seq_of(&e.last_event_id, CH)).collect();
        assert_eq!(seqs, [4, 5], "{target}");
        // Nothing more until the next publish, which comes once.
        assert!(
            !matches!(
                r.next_within(Duration::from_millis(300)).await,
                Some(Next::Item(Item::Event(_)))
            ),
            "{target}: an event beyond the missed ones"
        );
    }
}

#[tokio::test]
async fn an_sse_open_while_redis_is_down_is_told_to_retry_and_resumes_after_its_restart() {
    let mut redis = Redis::start().await;
    let a = node(&redis).await;
    a.publish_many(CH, "x", 2).await;
    let cursor = a.history(CH, "").await.expect(200)["next"]
        .as_str()
        .expect("next")
        .to_owned();
    redis.kill9().await;
    let hdr = [("Last-Event-ID", cursor.as_bytes())];
    let mut r = a.sse(&format!("/v1/channels/{CH}/sse"), &hdr).await;
    assert_told_to_retry(&mut r, "Redis killed").await;

    redis.restart().await;
    eventually(
        "readyz 200 after the restart",
        Duration::from_secs(10),
        || async { a.get("/readyz").await.status == 200 },
    )
    .await;
    a.publish(CH, "after").await;
    let mut r = a.sse(&format!("/v1/channels/{CH}/sse"), &hdr).await;
    let pre = r.preamble().await;
    assert!(
        pre.gaps.is_empty(),
        "a restart with AOF is no gap: {:?}",
        pre.gaps
    );
    let e = r.next_event().await;
    assert_eq!(
        (e.data.as_str(), seq_of(&e.last_event_id, CH)),
        ("after", 3)
    );
}

/// Redis at `maxmemory` with `noeviction` refuses every write: `/readyz`
/// says so (its check is refused like an append), and says ready again
/// once Redis has room.
#[tokio::test]
async fn readyz_is_503_while_redis_refuses_writes_for_lack_of_memory() {
    let redis = Redis::start_with(&["--maxmemory-policy", "noeviction"]).await;
    let a = node(&redis).await;
    a.publish(CH, "before").await;
    assert_eq!(a.get("/readyz").await.status, 200);

    // 1 byte: Redis is over it at once, and refuses what may write.
    redis.cli(&["CONFIG", "SET", "maxmemory", "1"]).await;
    let r = a.post(&format!("/v1/channels/{CH}/events"), "x", &[]).await;
    r.expect_error(500, "journal_failed");
    assert!(r.message().contains("OOM"), "{}", r.message());
    let r = a.get("/readyz").await;
    assert_eq!(
        r.expect_error(503, "unavailable")["reason"],
        "journal_failed"
    );
    assert!(r.message().contains("OOM"), "{}", r.message());
    assert_eq!(a.get("/healthz").await.status, 200);
    // Reads are refused too: every script may write (docs/cluster.md).
    a.history(CH, "").await.expect_error(500, "journal_failed");
    // A stream opened now (a channel this node has no window for, so it
    // reads Redis) is told to retry, not given a 500 an EventSource would
    // never come back from.
    let mut r = a.sse("/v1/channels/fresh/sse", &[]).await;
    assert_eq!(r.status, 200, "{}", r.raw_text());
    let (items, end) = r.until_end(Duration::from_secs(5)).await;
    assert_eq!(end, Next::End);
    let [Item::Retry(ms), Item::Comment(why)] = items.as_slice() else {
        panic!("only retry: and a comment, got {items:?}");
    };
    assert!((1_000..=5_000).contains(ms), "retry: {ms}");
    assert!(
        why.trim_start().starts_with("journal_failed: ") && why.contains("OOM"),
        "{why:?}"
    );

    redis.cli(&["CONFIG", "SET", "maxmemory", "0"]).await;
    assert_eq!(a.get("/readyz").await.status, 200);
    a.publish(CH, "after").await;
    assert_eq!(a.all_data(CH).await, ["before", "after"]);
}

/// `--redis` with a URL that is not a Redis one names what is wrong.
#[test]
fn a_redis_url_of_another_scheme_is_refused_naming_the_scheme() {
    for (url, says) in [
        ("http://x", "the scheme is http://"),
        ("127.0.0.1:6379", "no scheme"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gapless"))
            .args(["serve", "--listen", "127.0.0.1:0", "--redis", url])
            .env_remove("GAPLESS_REDIS")
            .output()
            .expect("run gapless");
        assert!(!out.status.success(), "{url}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("invalid Redis URL"), "{url}: {err}");
        assert!(err.contains(says), "{url}: says {says:?}: {err}");
        assert!(
            err.contains("redis://") && err.contains("rediss://"),
            "{url}: names the schemes: {err}"
        );
        assert!(!err.contains("InvalidClientConfig"), "{url}: {err}");
    }
}
