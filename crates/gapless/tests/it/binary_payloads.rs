//! Binary payloads: an event published as bytes (`Content-Type:
//! application/octet-stream`, or `"encoding":"base64"` in a batch or a
//! WebSocket `publish`) keeps every byte, on every journal (embedded store,
//! `--memory`, Redis across nodes), and reads back base64-encoded and marked
//! over history, SSE (plain and envelope) and WebSocket; text events are
//! written exactly as before; and a data directory written by the release
//! before binary payloads opens and answers byte for byte as that release
//! did (fixtures/store-v0.1).

use base64::Engine;
use gapless_testkit::redis::Redis;
use gapless_testkit::ws::{Ws, WAIT};
use gapless_testkit::{Opts, Server, SseClient};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

const CH: &str = "blobs";

/// Every byte value, then every byte value backwards (not UTF-8, holds CR, LF, NUL).
fn all_bytes() -> Vec<u8> {
    (0..=255u8).chain((0..=255u8).rev()).collect()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().expect("data is a string"))
        .expect("data is base64")
}

/// Publishes `bytes` as one binary event of type `blob`; returns its seq.
async fn publish_bytes(s: &Server, channel: &str, bytes: &[u8]) -> u64 {
    let r = s
        .post(
            &format!("/v1/channels/{channel}/events?type=blob"),
            bytes.to_vec(),
            &[("content-type", "application/octet-stream")],
        )
        .await;
    r.expect(201)["seq"].as_u64().expect("seq")
}

/// History: the event at `seq` is `bytes`, base64 and marked; the text event
/// at `seq - 1` has no `encoding`.
async fn check_history(s: &Server, channel: &str, seq: u64, bytes: &[u8]) {
    let events = s.all_events(channel).await;
    let e = events
        .iter()
        .find(|e| e["seq"] == seq)
        .unwrap_or_else(|| panic!("seq {seq} in {events:?}"));
    assert_eq!(e["encoding"], "base64", "{e}");
    assert_eq!(e["type"], "blob");
    assert_eq!(unb64(&e["data"]), bytes);
    let text = events.iter().find(|e| e["seq"] == seq - 1).expect("text");
    assert_eq!(text["data"], "before");
    assert!(text.get("encoding").is_none(), "{text}");
}

/// Reads SSE events until seq `seq` of `channel` (single-channel cursors).
async fn sse_until(c: &mut SseClient, seq: u64) -> gapless_testkit::Event {
    loop {
        let e = c.next_event().await;
        if e.is_gap() {
            continue;
        }
        let id = e.id.as_deref().expect("id");
        if gapless_testkit::seq_of(id, CH) >= seq {
            return e;
        }
    }
}

/// SSE, plain and envelope, from the start: the binary event is base64 and
/// marked (an `encoding: base64` line; `"encoding":"base64"`).
async fn check_sse(s: &Server, seq: u64, bytes: &[u8]) {
    let (mut plain, _) = s.subscribe(CH, "since=earliest").await;
    let e = sse_until(&mut plain, seq).await;
    assert_eq!(e.event, "blob");
    assert_eq!(e.data, b64(bytes));
    let frame = format!("event: blob\nencoding: base64\ndata: {}\n\n", b64(bytes));
    assert!(plain.raw_text().contains(&frame), "{}", plain.tail());
    assert!(
        plain.raw_text().contains("data: before\n\n"),
        "the text event is as before: {}",
        plain.tail()
    );
    let (mut env, _) = s.subscribe(CH, "since=earliest&format=envelope").await;
    let e = sse_until(&mut env, seq).await;
    let j = e.json();
    assert_eq!(j["encoding"], "base64", "{j}");
    assert_eq!(unb64(&j["data"]), bytes);
}

/// WebSocket from the start: the event message has `encoding: base64`.
async fn check_ws(s: &Server, seq: u64, bytes: &[u8]) {
    let mut ws = Ws::channels(s).await;
    ws.subscribe(json!(1), CH, json!({"since": "earliest"}))
        .await;
    let msgs = ws.read_until_seq(CH, seq, WAIT).await;
    let e = msgs.last().expect("event");
    assert_eq!(e["encoding"], "base64", "{e}");
    assert_eq!(unb64(&e["data"]), bytes);
    let text = msgs
        .iter()
        .find(|m| m["op"] == "event" && m["seq"] == seq - 1)
        .expect("text event");
    assert!(text.get("encoding").is_none(), "{text}");
}

async fn round_trip(s: &Server) -> u64 {
    s.publish(CH, "before").await;
    let bytes = all_bytes();
    let seq = publish_bytes(s, CH, &bytes).await;
    check_history(s, CH, seq, &bytes).await;
    check_sse(s, seq, &bytes).await;
    check_ws(s, seq, &bytes).await;
    seq
}

#[tokio::test]
async fn bytes_round_trip_on_the_embedded_store_and_across_a_restart() {
    let mut s = Server::start(&[]).await;
    let seq = round_trip(&s).await;
    s.restart().await;
    let bytes = all_bytes();
    check_history(&s, CH, seq, &bytes).await;
    check_sse(&s, seq, &bytes).await;
}

#[tokio::test]
async fn bytes_round_trip_in_memory() {
    let s = Server::memory(&[]).await;
    round_trip(&s).await;
}

#[tokio::test]
async fn bytes_appended_on_one_node_are_read_live_and_exact_on_another() {
    let Some(redis) = Redis::start_or_skip("binary payloads in cluster mode").await else {
        return;
    };
    let node = |url: String| async move {
        Server::with(Opts {
            args: vec!["--redis".to_owned(), url],
            ..Opts::default()
        })
        .await
    };
    let a = node(redis.url()).await;
    let b = node(redis.url()).await;
    let (mut live, _) = b.subscribe(CH, "").await;
    let (mut live_env, _) = b.subscribe(CH, "format=envelope").await;
    let mut ws = Ws::channels(&b).await;
    ws.subscribe_live(CH).await;
    a.publish(CH, "before").await;
    let bytes = all_bytes();
    let seq = publish_bytes(&a, CH, &bytes).await;
    let e = sse_until(&mut live, seq).await;
    assert_eq!(e.data, b64(&bytes));
    assert!(live.raw_text().contains("encoding: base64\n"));
    let j = sse_until(&mut live_env, seq).await.json();
    assert_eq!(
        (j["encoding"].clone(), unb64(&j["data"])),
        (json!("base64"), bytes.clone())
    );
    let m = ws.read_until_seq(CH, seq, WAIT).await;
    assert_eq!(unb64(&m.last().expect("event")["data"]), bytes);
    // Read back from Redis (not the node's window) on a third node.
    let c = node(redis.url()).await;
    check_history(&c, CH, seq, &bytes).await;
    check_sse(&c, seq, &bytes).await;
    // An ephemeral binary event crosses nodes too.
    let (mut eph, _) = b.subscribe(CH, "format=envelope").await;
    let r = a
        .post(
            &format!("/v1/channels/{CH}/events?ephemeral=true"),
            vec![0u8, 0xff],
            &[("content-type", "application/octet-stream")],
        )
        .await;
    r.expect(202);
    let e = eph.next_event().await.json();
    assert_eq!(
        (e["encoding"].clone(), unb64(&e["data"])),
        (json!("base64"), vec![0, 0xff])
    );
}

/// A batch item and a WebSocket publish say `"encoding":"base64"`; bad base64
/// is refused naming the fault; text without a content type stays text, and
/// non-UTF-8 text still says how to publish bytes.
#[tokio::test]
async fn batch_and_websocket_publish_bytes_as_base64() {
    let s = Server::memory(&[]).await;
    let bytes = all_bytes();
    let r = s
        .batch(
            CH,
            &json!([{"data": "t"}, {"data": b64(&bytes), "encoding": "base64", "type": "blob"}]),
            &[],
        )
        .await;
    r.expect(201);
    let bad = s
        .batch(CH, &json!([{"data": "***", "encoding": "base64"}]), &[])
        .await;
    let m = bad.expect_error(400, "invalid_request")["message"].to_string();
    assert!(m.contains("base64") && m.contains("item 0"), "{m}");
    let not_utf8 = s
        .post(&format!("/v1/channels/{CH}/events"), vec![0xffu8], &[])
        .await;
    let m = not_utf8.expect_error(400, "invalid_utf8")["message"].to_string();
    assert!(m.contains("application/octet-stream"), "{m}");

    let mut ws = Ws::channels(&s).await;
    ws.send(&json!({"op": "publish", "id": 1, "channel": CH, "data": b64(&[1, 2, 0xfe]), "encoding": "base64"}))
        .await;
    ws.expect_op("published").await;
    ws.send(&json!({"op": "publish", "id": 2, "channel": CH, "data": "%%", "encoding": "base64"}))
        .await;
    let e = ws.expect_op("error").await;
    assert!(e["message"].to_string().contains("base64"), "{e}");

    let events = s.all_events(CH).await;
    assert_eq!(events.len(), 3, "{events:?}");
    assert!(events[0].get("encoding").is_none());
    assert_eq!(events[0]["data"], "t");
    assert_eq!(unb64(&events[1]["data"]), bytes);
    assert_eq!(unb64(&events[2]["data"]), [1, 2, 0xfe]);
}

/// `--max-event-bytes` counts the event's bytes, not their base64.
#[tokio::test]
async fn the_event_size_limit_counts_bytes() {
    let s = Server::memory(&["--max-event-bytes", "300"]).await;
    publish_bytes(&s, CH, &[0xff; 300]).await;
    let r = s
        .post(
            &format!("/v1/channels/{CH}/events"),
            vec![0xffu8; 301],
            &[("content-type", "application/octet-stream")],
        )
        .await;
    r.expect_error(413, "too_large");
    let ok = s
        .batch(
            CH,
            &json!([{"data": b64(&[7; 300]), "encoding": "base64"}]),
            &[],
        )
        .await;
    ok.expect(201);
    let big = s
        .batch(
            CH,
            &json!([{"data": b64(&[7; 301]), "encoding": "base64"}]),
            &[],
        )
        .await;
    big.expect_error(413, "too_large");
}

/// A Durable Streams stream of a binary type keeps its bytes exactly, and is
/// readable over gapless's own API as base64.
#[tokio::test]
async fn a_binary_durable_stream_keeps_its_bytes() {
    let s = Server::memory(&[]).await;
    let put = s
        .send(
            s.http
                .put(s.url("/ds/files/a"))
                .header("content-type", "application/octet-stream"),
        )
        .await;
    assert_eq!(put.status, 201, "{}", put.text);
    let bytes = all_bytes();
    for half in bytes.chunks(256) {
        let r = s
            .send(
                s.http
                    .post(s.url("/ds/files/a"))
                    .header("content-type", "application/octet-stream")
                    .body(half.to_vec()),
            )
            .await;
        assert!(
            r.status == 204 || r.status == 200,
            "{} {}",
            r.status,
            r.text
        );
    }
    let read = s
        .http
        .get(s.url("/ds/files/a?offset=-1"))
        .send()
        .await
        .expect("read");
    assert_eq!(read.status(), 200);
    assert_eq!(read.bytes().await.expect("body").to_vec(), bytes);
    let events = s.all_events("files~a").await;
    assert_eq!(events.len(), 2);
    assert!(events.iter().all(|e| e["encoding"] == "base64"));
    let joined: Vec<u8> = events.iter().flat_map(|e| unb64(&e["data"])).collect();
    assert_eq!(joined, bytes);
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-v0.1")
}

fn golden(name: &str) -> String {
    std::fs::read_to_string(fixture().join(name)).expect("golden file")
}

/// The data directory written by the release before binary payloads (see
/// fixtures/store-v0.1/README.md) opens, and history and SSE answer exactly
/// what that release answered; its idempotency key still holds.
#[tokio::test]
async fn a_data_directory_of_the_release_before_binary_payloads_reads_unchanged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("mkdir");
    std::fs::copy(fixture().join("journal.redb"), data.join("journal.redb")).expect("copy");
    let s = Server::with(Opts {
        args: vec!["--retention-ms".into(), "0".into()],
        data_dir: Some(data),
        ..Opts::default()
    })
    .await;
    for c in ["plain", "batch-ch", "second", "docs~notes", "j"] {
        let r = s.history(c, "limit=100").await;
        assert_eq!(r.status, 200);
        assert_eq!(
            r.text,
            golden(&format!("history-{c}.json")),
            "history of {c}"
        );
    }
    for (target, file, last) in [
        ("/v1/channels/plain/sse?since=earliest", "sse-plain.txt", 6),
        (
            "/v1/channels/plain/sse?since=earliest&format=envelope",
            "sse-plain-envelope.txt",
            6,
        ),
        (
            "/v1/sse?channel=plain&channel=second&channel=batch-ch&since=earliest",
            "sse-multi.txt",
            10,
        ),
    ] {
        let want = golden(file);
        let mut c = s.sse(target, &[]).await;
        c.preamble().await;
        c.events(last).await;
        // Nothing else is due (heartbeats every 15 s by default).
        let quiet = c.next_within(Duration::from_millis(300)).await;
        assert!(quiet.is_none(), "{target}: more than expected: {quiet:?}");
        assert_eq!(c.raw_text(), want, "{target}");
    }
    // The idempotency key stored by the old release still answers.
    let again = s
        .post(
            "/v1/channels/plain/events",
            r#"{"json":true,"n":[1,2,3]}"#,
            &[("idempotency-key", "key-1")],
        )
        .await;
    assert_eq!(again.expect(200)["seq"], 4);
}
