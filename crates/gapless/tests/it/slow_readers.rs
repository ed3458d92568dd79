//! Slow readers are kept on every path (issue 12, `docs/reliability.md`,
//! "Slow readers"): a live client whose receive window stays full for
//! several liveness bounds, but whose TCP answers the server's window
//! probes and which reads a few KB a second, keeps its stream and then gets
//! every event once and in order. One test per path a stream can take: an
//! SSE stream written by the fan-out writer (a connection's first request),
//! an SSE stream on a keep-alive connection (served by hyper), a `/v1/ws`
//! socket (events, and replies to its own requests waiting behind them), and
//! a session consumer socket.
//!
//! The short versions (always run) use `--tcp-user-timeout-ms 3000` and
//! read slowly for 12 s, four bounds; with `TCP_USER_TIMEOUT` alone each of
//! these clients was cut about 3 s after its window filled.
//! `GAPLESS_LONG_TESTS=1` adds the fan-out SSE case at the default settings.

use gapless_testkit::slow::{long_tests, raw_sse, read_events, read_slowly, Path, SHORT_TIMERS};
use gapless_testkit::ws::RawWs;
use serde_json::Value;
use std::time::{Duration, Instant};

/// 200 events of 60 KB (12 MB): data starts with the index, 5 digits.
fn publish_200(url: String) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        for i in 0..200u32 {
            let mut data = format!("{i:05}").into_bytes();
            data.resize(60_000, b'.');
            let r = http.post(&url).body(data).send().await.expect("publish");
            assert!(r.status().is_success(), "{}", r.status());
        }
    })
}

fn want_200() -> Vec<String> {
    (0..200).map(|i| format!("{i:05}")).collect()
}

/// An SSE client reads at `rate` bytes/s for `secs` while 200 events of 60 KB
/// are published, then reads the rest at full speed: every event arrives,
/// once and in order.
async fn sse_slow_reader_kept(args: &[&str], path: Path, rcvbuf: u32, rate: usize, secs: u64) {
    let s = gapless_testkit::Server::memory(args).await;
    let mut tcp = raw_sse(s.addr, "slow", "", rcvbuf, path, None).await;
    gapless_testkit::eventually("subscribed", Duration::from_secs(10), || async {
        s.info("slow").await["subscribers"] == 1
    })
    .await;
    let publisher = publish_200(s.url("/v1/channels/slow/events"));
    let got = read_slowly(&mut tcp, rate, secs).await;
    publisher.await.expect("published");
    assert_eq!(
        s.info("slow").await["subscribers"],
        1,
        "the slow reader is still subscribed"
    );
    let events = read_events(&mut tcp, got, 200, 5).await;
    assert_eq!(events, want_200(), "every event once, in order");
}

/// Regression (issue 12): with `TCP_USER_TIMEOUT` alone, a client reading
/// 1 KB/s had its connection reset one user timeout after the server began
/// probing its full window. Short timers: a 3 s bound, read slowly for 12 s.
#[tokio::test]
async fn a_slow_reader_is_kept_short_timers() {
    sse_slow_reader_kept(SHORT_TIMERS, Path::First, 0, 1024, 12).await;
}

/// The same for an SSE stream opened as the second request of a keep-alive
/// connection, which hyper serves (not the fan-out writer); 4 KB receive
/// buffer, 4 KB/s.
#[tokio::test]
async fn a_slow_reader_on_a_keep_alive_connection_is_kept_short_timers() {
    sse_slow_reader_kept(SHORT_TIMERS, Path::KeepAlive, 4096, 4096, 12).await;
}

/// `GAPLESS_LONG_TESTS=1`: the fan-out case at the defaults, reading slowly
/// for 90 s (three times the 30 s bound).
#[tokio::test]
async fn a_slow_reader_is_kept_at_defaults() {
    if !long_tests() {
        eprintln!("SKIP a_slow_reader_is_kept_at_defaults: set GAPLESS_LONG_TESTS=1 (takes 90 s)");
        return;
    }
    sse_slow_reader_kept(&[], Path::First, 0, 1024, 90).await;
}

/// The same for a `/v1/ws` subscriber (a tungstenite client, which answers
/// pings when it reads them): it reads one 60 KB event every 4 s, longer than
/// the 3 s bound, so its window stays full; its pongs wait behind unread data.
#[tokio::test]
async fn a_slow_websocket_reader_is_kept_short_timers() {
    let s = gapless_testkit::Server::memory(SHORT_TIMERS).await;
    let mut ws = gapless_testkit::ws::Ws::connect_small_rcvbuf(s.addr, "/v1/ws", 4096).await;
    ws.subscribe_live("wslow").await;
    let publisher = publish_200(s.url("/v1/channels/wslow/events"));
    let mut got = Vec::new();
    let next = |msg: Option<gapless_testkit::ws::Msg>, got: &mut Vec<String>| match msg {
        Some(gapless_testkit::ws::Msg::Json(v)) if v["op"] == "event" => {
            let data = v["data"].as_str().expect("data");
            got.push(data[..5].to_owned());
        }
        other => panic!("after {} events: {other:?}", got.len()),
    };
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(16) {
        next(ws.recv(Duration::from_secs(10)).await, &mut got);
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    publisher.await.expect("published");
    assert_eq!(
        s.info("wslow").await["subscribers"],
        1,
        "the slow WebSocket reader is still subscribed"
    );
    while got.len() < 200 {
        next(ws.recv(Duration::from_secs(10)).await, &mut got);
    }
    assert_eq!(got, want_200(), "every event once, in order");
}

/// The JSON of a text frame.
fn json_of(f: &gapless_testkit::ws::Frame) -> Value {
    assert_eq!(f.opcode, 1, "a text frame: {f:?}");
    serde_json::from_slice(&f.payload).expect("JSON")
}

/// A `/v1/ws` client whose replies wait behind what it has not read: it
/// follows a channel and publishes to it (8 KB ids and data) every 100 ms,
/// reading 4 KB/s through a 4 KB receive buffer for 12 s, so events and
/// `published` replies pile up on the server. It is kept, and then gets
/// every event and every reply, in order.
#[tokio::test]
async fn a_slow_websocket_reader_with_replies_waiting_is_kept_short_timers() {
    let s = gapless_testkit::Server::memory(SHORT_TIMERS).await;
    let mut raw = RawWs::connect_small_rcvbuf(s.addr, "/v1/ws", 4096, None).await;
    raw.write_frame(1, br#"{"op":"subscribe","id":"sub","channel":"wsr"}"#)
        .await;
    let reply = raw
        .next_answering_pings(Duration::from_secs(10))
        .await
        .expect("open")
        .expect("a reply");
    assert_eq!(json_of(&reply)["op"], "subscribed");
    let pad = ".".repeat(8000);
    let mut sent = 0usize;
    let mut frames = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(12) {
        let msg = serde_json::json!({
            "op": "publish", "id": format!("{sent:05}{pad}"), "channel": "wsr",
            "data": format!("{sent:05}{pad}"),
        });
        // The server's receive buffer takes these while it waits on its writes.
        raw.write_frame(1, msg.to_string().as_bytes()).await;
        sent += 1;
        frames.extend(raw.read_slowly(4096, Duration::from_millis(250)).await);
    }
    assert_eq!(
        s.info("wsr").await["subscribers"],
        1,
        "the slow WebSocket reader is still subscribed after {:?}",
        t0.elapsed()
    );
    let (mut events, mut replies) = (Vec::new(), Vec::new());
    let take =
        |f: &gapless_testkit::ws::Frame, events: &mut Vec<String>, replies: &mut Vec<String>| {
            let v = json_of(f);
            match v["op"].as_str() {
                Some("event") => events.push(v["data"].as_str().expect("data")[..5].to_owned()),
                Some("published") => replies.push(v["id"].as_str().expect("id")[..5].to_owned()),
                _ => panic!("unexpected {v}"),
            }
        };
    for f in &frames {
        take(f, &mut events, &mut replies);
    }
    while events.len() < sent || replies.len() < sent {
        let f = raw
            .next_answering_pings(Duration::from_secs(10))
            .await
            .expect("open")
            .unwrap_or_else(|| {
                panic!(
                    "{} events, {} replies of {sent}",
                    events.len(),
                    replies.len()
                )
            });
        take(&f, &mut events, &mut replies);
    }
    let want: Vec<String> = (0..sent).map(|i| format!("{i:05}")).collect();
    assert_eq!(events, want, "every event once, in order");
    assert_eq!(replies, want, "every reply once, in order");
}

/// A session consumer (raw socket, 4 KB receive buffer, answering pings once
/// it reads them) reads 4 KB/s for 12 s while 200 events of 60 KB are
/// appended to its session: it stays attached, and then gets every event
/// once and in order.
#[tokio::test]
async fn a_slow_session_consumer_is_kept_short_timers() {
    let s = gapless_testkit::Server::memory(SHORT_TIMERS).await;
    gapless_testkit::ws::new_session(&s, "slow-session").await;
    let mut raw =
        RawWs::connect_small_rcvbuf(s.addr, "/v1/sessions/slow-session/ws", 4096, None).await;
    let resumed = raw
        .next_answering_pings(Duration::from_secs(10))
        .await
        .expect("open")
        .expect("session.resumed");
    assert_eq!(json_of(&resumed)["op"], "session.resumed");
    let publisher = publish_200(s.url("/v1/sessions/slow-session/events"));
    let mut frames = raw.read_slowly(4096, Duration::from_secs(12)).await;
    publisher.await.expect("published");
    let info = s.get("/v1/sessions/slow-session").await;
    assert_eq!(info.json["attached"], true, "still attached: {}", info.json);
    let mut got: Vec<String> = Vec::new();
    let take = |f: &gapless_testkit::ws::Frame, got: &mut Vec<String>| {
        let v = json_of(f);
        assert_eq!(v["op"], "event", "{v}");
        got.push(v["data"].as_str().expect("data")[..5].to_owned());
    };
    for f in frames.drain(..) {
        take(&f, &mut got);
    }
    while got.len() < 200 {
        let f = raw
            .next_answering_pings(Duration::from_secs(10))
            .await
            .expect("open")
            .unwrap_or_else(|| panic!("{} events", got.len()));
        take(&f, &mut got);
    }
    assert_eq!(got, want_200(), "every event once, in order");
}
