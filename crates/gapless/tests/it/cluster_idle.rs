//! Cluster mode on a Redis that closes idle connections (`timeout` in
//! redis.conf, as many managed services and proxies do): every kind of
//! request after an idle spell is answered 2xx at the first try, every
//! acknowledged event is stored once, and notifications between nodes go on
//! (docs/cluster.md, "Idle connections").

use gapless_testkit::redis::Redis;
use gapless_testkit::ws::Ws;
use gapless_testkit::{seq_of, Opts, Server};
use serde_json::{json, Value};
use std::time::Duration;

const CH: &str = "idle";

/// Longer than Redis's `--timeout 1` plus its check period: every spell
/// closes the node's idle command connection.
const SPELL: Duration = Duration::from_millis(2300);

async fn node(redis: &Redis, extra: &[&str]) -> Server {
    let mut args = vec!["--redis".to_owned(), redis.url()];
    args.extend(extra.iter().map(|s| s.to_string()));
    Server::with(Opts {
        args,
        ..Opts::default()
    })
    .await
}

/// Connections Redis has accepted since it started (`redis-cli` counts one
/// for each call, this one included).
async fn connections_received(redis: &Redis) -> u64 {
    let info = redis.cli(&["INFO", "stats"]).await;
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("total_connections_received in INFO stats")
}

/// Asserts a 2xx answer (the first try: there is no retry here) and returns its JSON.
#[track_caller]
fn ok(r: &gapless_testkit::Resp, status: u16, what: &str) -> Value {
    assert_eq!(
        r.status, status,
        "{what} after an idle spell: {} {}",
        r.status, r.text
    );
    r.json.clone()
}

#[tokio::test]
async fn after_redis_closes_idle_connections_every_request_succeeds_at_once_and_lands_once() {
    let redis = Redis::start_with(&["--timeout", "1"]).await;
    // No periodic head re-read and the default keepalive (15 s, longer than
    // the spells): nothing keeps a's command connection busy, so Redis
    // closes it in every spell and each request finds it closed.
    let a = node(&redis, &["--redis-poll-ms", "0"]).await;
    // b follows the channel over the bus only.
    let b = node(&redis, &["--redis-poll-ms", "0"]).await;
    let (mut far, _) = b.subscribe(CH, "since=earliest").await;
    let before = connections_received(&redis).await;
    let mut published: Vec<(u64, String)> = Vec::new();

    tokio::time::sleep(SPELL).await;
    let r = a
        .post(&format!("/v1/channels/{CH}/events"), "one", &[])
        .await;
    published.push((
        ok(&r, 201, "a publish")["seq"].as_u64().expect("seq"),
        "one".into(),
    ));

    tokio::time::sleep(SPELL).await;
    let r = a
        .batch(CH, &json!([{"data": "two"}, {"data": "three"}]), &[])
        .await;
    let v = ok(&r, 201, "a batch publish");
    let seqs: Vec<u64> = v["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["seq"].as_u64().expect("seq"))
        .collect();
    published.push((seqs[0], "two".into()));
    published.push((seqs[1], "three".into()));

    tokio::time::sleep(SPELL).await;
    let key = [("Idempotency-Key", "idle-key-1")];
    let r = a
        .post(&format!("/v1/channels/{CH}/events"), "four", &key)
        .await;
    let seq4 = ok(&r, 201, "an idempotent publish")["seq"]
        .as_u64()
        .expect("seq");
    published.push((seq4, "four".into()));
    // The same key again: the original seq, nothing appended.
    let r = a
        .post(&format!("/v1/channels/{CH}/events"), "four", &key)
        .await;
    assert_eq!(ok(&r, 200, "a repeated idempotent publish")["seq"], seq4);

    tokio::time::sleep(SPELL).await;
    let r = a.history(CH, "limit=100").await;
    let page = ok(&r, 200, "a history read");
    assert_eq!(page["events"].as_array().map(Vec::len), Some(4), "{page}");

    tokio::time::sleep(SPELL).await;
    let r = a.get(&format!("/v1/channels/{CH}")).await;
    assert_eq!(ok(&r, 200, "channel info")["head"], 4);

    tokio::time::sleep(SPELL).await;
    let mut sse = a
        .sse(&format!("/v1/channels/{CH}/sse?since=earliest"), &[])
        .await;
    assert_eq!(sse.status, 200, "an SSE open after an idle spell");
    let pre = sse.preamble().await;
    assert!(pre.gaps.is_empty(), "no gap: {:?}", pre.gaps);
    let first = sse.events(4).await;
    assert_eq!(
        first.iter().map(|e| e.data.as_str()).collect::<Vec<_>>(),
        ["one", "two", "three", "four"]
    );

    tokio::time::sleep(SPELL).await;
    let mut ws = Ws::channels(&a).await;
    ws.subscribe(json!(1), CH, json!({"cursor": first[3].last_event_id}))
        .await;
    let sub = ws.expect_op("subscribed").await;
    assert_eq!(
        sub["channel"], CH,
        "a WebSocket subscribe after an idle spell"
    );

    tokio::time::sleep(SPELL).await;
    let r = a
        .post(
            &format!("/v1/channels/{CH}/events?ephemeral=true&type=typing"),
            "hi",
            &[],
        )
        .await;
    ok(&r, 202, "an ephemeral publish");

    tokio::time::sleep(SPELL).await;
    let r = gapless_testkit::ws::create_session(&a, Some("idle-s")).await;
    ok(&r, 201, "a session create");

    tokio::time::sleep(SPELL).await;
    let r = gapless_testkit::ws::append(&a, "idle-s", "s1").await;
    let s1 = ok(&r, 201, "a session append")["seq"]
        .as_u64()
        .expect("seq");

    tokio::time::sleep(SPELL).await;
    let r = gapless_testkit::ws::session_info(&a, "idle-s").await;
    assert_eq!(ok(&r, 200, "session info")["status"], "open");

    tokio::time::sleep(SPELL).await;
    let r = gapless_testkit::ws::end_session(&a, "idle-s", "complete").await;
    assert_eq!(ok(&r, 200, "a session complete")["status"], "completed");

    tokio::time::sleep(SPELL).await;
    let r = a.get("/readyz").await;
    ok(&r, 200, "the readiness check");

    tokio::time::sleep(SPELL).await;
    let r = a
        .post(&format!("/v1/channels/{CH}/events"), "five", &[])
        .await;
    published.push((
        ok(&r, 201, "a publish")["seq"].as_u64().expect("seq"),
        "five".into(),
    ));

    // The spells did close connections: the node opened new ones.
    let opened = connections_received(&redis).await - before;
    assert!(
        opened >= 10,
        "Redis closed the idle connections and the node opened new ones ({opened} accepted)"
    );

    // Redis does not close a subscriber for idleness: both nodes' bus
    // connections are the ones they opened at start (a proxy might close
    // them; the node then reconnects and re-reads its heads, cluster.rs).
    let subscribers = redis.cli(&["CLIENT", "LIST", "TYPE", "pubsub"]).await;
    let ages: Vec<u64> = subscribers
        .lines()
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("age=")))
        .filter_map(|a| a.parse().ok())
        .collect();
    assert!(
        ages.len() == 2 && ages.iter().all(|&a| a >= 20),
        "the bus connections stayed open through the spells: {subscribers}"
    );

    // Every acknowledged event once, in seq order, on every path.
    let want: Vec<(u64, String)> = (1..=5)
        .zip(["one", "two", "three", "four", "five"])
        .map(|(s, d)| (s, d.to_owned()))
        .collect();
    assert_eq!(published, want, "the seqs the publishes were answered");
    let stored: Vec<(u64, String)> = a
        .all_events(CH)
        .await
        .iter()
        .map(|e| {
            (
                e["seq"].as_u64().expect("seq"),
                e["data"].as_str().expect("data").to_owned(),
            )
        })
        .collect();
    assert_eq!(stored, want, "history holds each event once");
    // a's own subscribers: the ephemeral event, then seq 5.
    let eph = sse.next_event().await;
    assert_eq!((eph.event.as_str(), eph.data.as_str()), ("typing", "hi"));
    let e5 = sse.next_event().await;
    assert_eq!(
        (seq_of(&e5.last_event_id, CH), e5.data.as_str()),
        (5, "five")
    );
    let msgs = ws.read_until_seq(CH, 5, Duration::from_secs(10)).await;
    let events: Vec<(Option<u64>, &str)> = msgs
        .iter()
        .filter(|m| m["op"] == "event" || m["op"] == "ephemeral")
        .map(|m| (m["seq"].as_u64(), m["data"].as_str().unwrap_or_default()))
        .collect();
    assert_eq!(events, [(None, "hi"), (Some(5), "five")], "{msgs:?}");
    // b, over the bus: every event once, in order, and the ephemeral one.
    let mut seen = Vec::new();
    while seen.len() < 6 {
        let e = far.next_event().await;
        seen.push((e.event, e.data));
    }
    let expect_far: Vec<(String, String)> = [
        ("message", "one"),
        ("message", "two"),
        ("message", "three"),
        ("message", "four"),
        ("typing", "hi"),
        ("message", "five"),
    ]
    .iter()
    .map(|(t, d)| (t.to_string(), d.to_string()))
    .collect();
    assert_eq!(seen, expect_far, "the subscriber on the other node");
    // The session: opened, one event, completed; each once.
    let r = a.get("/v1/sessions/idle-s/events?limit=100").await;
    let page = r.expect(200).clone();
    let kinds: Vec<(u64, String)> = page["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| {
            (
                e["seq"].as_u64().expect("seq"),
                e["type"].as_str().unwrap_or("message").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (1, "gapless.session.opened".to_owned()),
            (s1, "message".to_owned()),
            (s1 + 1, "gapless.session.completed".to_owned())
        ],
        "{page}"
    );
}

#[tokio::test]
async fn a_keepalive_ping_keeps_an_idle_connection_open() {
    let redis = Redis::start_with(&["--timeout", "1"]).await;
    let a = node(
        &redis,
        &["--redis-poll-ms", "0", "--redis-keepalive-ms", "300"],
    )
    .await;
    a.publish(CH, "warm").await;
    let before = connections_received(&redis).await;
    tokio::time::sleep(SPELL).await;
    a.publish(CH, "after").await;
    let after = connections_received(&redis).await;
    // Only this redis-cli call connected: the node's connections stayed open.
    assert_eq!(
        after - before,
        1,
        "the node reconnected although it pinged every 300 ms"
    );
}
