//! Cluster mode: several `gapless serve --redis URL` nodes on one real
//! `redis-server` (AOF on, `appendfsync always`), each test with its own
//! Redis and nodes on free ports. What must hold: every subscriber on every
//! node gets each seq once and in order; a cursor resumes exactly on any
//! node; a node's death, a Redis restart with its AOF and a lost bus
//! notification lose nothing; a FLUSHALL or a failover to a replica that was
//! behind is told as an `epoch` gap, never a different event under a held seq.

use gapless_testkit::redis::Redis;
use gapless_testkit::ws::{
    append, append_ok, consume, end_session, new_session, session_info, Msg, Ws, WAIT,
};
use gapless_testkit::{epoch_of, eventually, seq_of, Event, Opts, Server, SseClient};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const CH: &str = "c";

async fn node(redis: &Redis, extra: &[&str]) -> Server {
    node_at(&redis.url(), extra).await
}

async fn node_at(url: &str, extra: &[&str]) -> Server {
    let mut args = vec!["--redis".to_owned(), url.to_owned()];
    args.extend(extra.iter().map(|s| s.to_string()));
    Server::with(Opts {
        args,
        ..Opts::default()
    })
    .await
}

fn seq(e: &Event) -> u64 {
    seq_of(e.id.as_deref().expect("an event has an id"), CH)
}

/// Reads events (gap notices included) until one with seq `last` arrives.
async fn read_until(sub: &mut SseClient, last: u64) -> Vec<Event> {
    let mut out = Vec::new();
    loop {
        let e = sub.next_event().await;
        let done = !e.is_gap() && seq(&e) >= last;
        out.push(e);
        if done {
            return out;
        }
    }
}

fn seqs(events: &[Event]) -> Vec<u64> {
    events.iter().filter(|e| !e.is_gap()).map(seq).collect()
}

#[tokio::test]
async fn three_nodes_publishers_and_subscribers_on_every_node_see_each_seq_once_in_order() {
    let redis = Redis::start().await;
    let nodes = [
        node(&redis, &[]).await,
        node(&redis, &[]).await,
        node(&redis, &[]).await,
    ];
    let mut subs = Vec::new();
    for n in &nodes {
        subs.push(n.subscribe(CH, "since=earliest").await.0);
    }
    // 3 publishers per node, 10 events each, all at once.
    let per = 10;
    let mut tasks = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        for p in 0..3 {
            let http = n.http.clone();
            let url = n.url(&format!("/v1/channels/{CH}/events"));
            tasks.push(tokio::spawn(async move {
                for k in 0..per {
                    let r = http
                        .post(&url)
                        .body(format!("n{i}p{p}k{k}"))
                        .send()
                        .await
                        .expect("publish");
                    assert_eq!(r.status(), 201);
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("publisher");
    }
    let total = (nodes.len() * 3 * per) as u64;
    let mut views = Vec::new();
    for sub in &mut subs {
        let got = read_until(sub, total).await;
        assert!(got.iter().all(|e| !e.is_gap()), "no gap: {got:?}");
        assert_eq!(
            seqs(&got),
            (1..=total).collect::<Vec<_>>(),
            "each seq once, in order"
        );
        let view: BTreeMap<u64, String> = got.iter().map(|e| (seq(e), e.data.clone())).collect();
        views.push(view);
    }
    assert!(
        views.windows(2).all(|w| w[0] == w[1]),
        "every node delivers the same event under a seq"
    );
    let published: std::collections::BTreeSet<&String> = views[0].values().collect();
    assert_eq!(
        published.len(),
        total as usize,
        "every published event, once"
    );
}

#[tokio::test]
async fn a_cursor_from_node_a_resumes_exactly_on_b_and_c() {
    let redis = Redis::start().await;
    let (a, b, c) = (
        node(&redis, &[]).await,
        node(&redis, &[]).await,
        node(&redis, &[]).await,
    );
    let (mut sub, _) = a.subscribe(CH, "since=earliest").await;
    a.publish_many(CH, "a", 4).await;
    let got = sub.events(4).await;
    let cursor = got[3].id.clone().expect("id");
    drop(sub);
    c.publish_many(CH, "c", 3).await;
    let mut resumed = Vec::new();
    for n in [&b, &c] {
        let (mut again, pre) = n.resume(CH, &cursor).await;
        assert!(
            pre.gaps.is_empty(),
            "no gap on another node: {:?}",
            pre.gaps
        );
        let missed = again.events(3).await;
        assert_eq!(seqs(&missed), [5, 6, 7]);
        assert_eq!(
            missed.iter().map(|e| e.data.as_str()).collect::<Vec<_>>(),
            ["c0", "c1", "c2"]
        );
        resumed.push(again);
    }
    // live after the replay, exactly once
    a.publish(CH, "live").await;
    for again in &mut resumed {
        let e = again.next_event().await;
        assert_eq!((seq(&e), e.data.as_str()), (8, "live"));
    }
}

#[tokio::test]
async fn kill9_of_a_node_mid_stream_its_clients_resume_on_another_with_no_gap_or_duplicate() {
    let redis = Redis::start().await;
    let mut a = node(&redis, &[]).await;
    let (b, c) = (node(&redis, &[]).await, node(&redis, &[]).await);
    let (mut sub, _) = a.subscribe(CH, "since=earliest").await;
    let total = 60u64;
    let http = b.http.clone();
    let url = b.url(&format!("/v1/channels/{CH}/events"));
    let publisher = tokio::spawn(async move {
        for k in 1..=total {
            let r = http
                .post(&url)
                .body(format!("e{k}"))
                .send()
                .await
                .expect("publish");
            assert_eq!(r.status(), 201);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let first = sub.events(20).await;
    assert_eq!(seqs(&first), (1..=20).collect::<Vec<_>>());
    a.kill9().await;
    let cursor = first[19].id.clone().expect("id");
    let (mut again, pre) = c.resume(CH, &cursor).await;
    assert!(pre.gaps.is_empty(), "{:?}", pre.gaps);
    let rest = read_until(&mut again, total).await;
    assert_eq!(seqs(&rest), (21..=total).collect::<Vec<_>>());
    for e in &rest {
        assert_eq!(e.data, format!("e{}", seq(e)));
    }
    publisher.await.expect("publisher");
}

#[tokio::test]
async fn redis_restart_with_aof_mid_stream_loses_nothing_and_streams_catch_up() {
    let mut redis = Redis::start().await;
    let a = node(&redis, &["--redis-timeout-ms", "500"]).await;
    let b = node(
        &redis,
        &["--redis-timeout-ms", "500", "--heartbeat-ms", "200"],
    )
    .await;
    let (mut sub, _) = b.subscribe(CH, "since=earliest").await;
    a.publish_many(CH, "x", 5).await;
    assert_eq!(seqs(&sub.events(5).await), [1, 2, 3, 4, 5]);
    assert_eq!(a.get("/readyz").await.status, 200);

    redis.kill9().await;
    let r = a
        .post(&format!("/v1/channels/{CH}/events"), "while down", &[])
        .await;
    r.expect_error(503, "unavailable");
    assert!(r.message().contains("Idempotency-Key"), "{}", r.message());
    a.get("/readyz").await.expect_error(503, "unavailable");
    assert_eq!(
        a.get("/healthz").await.status,
        200,
        "healthz is process-alive"
    );

    redis.restart().await;
    eventually(
        "readyz 200 after Redis is back",
        Duration::from_secs(10),
        || async { a.get("/readyz").await.status == 200 },
    )
    .await;
    for k in 0..5 {
        a.publish(CH, &format!("y{k}")).await;
    }
    // The open stream survived (heartbeats kept it), and continues exactly.
    let rest = read_until(&mut sub, 10).await;
    assert!(
        rest.iter().all(|e| !e.is_gap()),
        "a restart with AOF is no gap: {rest:?}"
    );
    assert_eq!(seqs(&rest), [6, 7, 8, 9, 10]);
    let all = b.all_data(CH).await;
    assert_eq!(
        all,
        ["x0", "x1", "x2", "x3", "x4", "y0", "y1", "y2", "y3", "y4"]
    );
}

#[tokio::test]
async fn hung_redis_fails_publishes_within_the_timeout_and_a_retry_with_the_key_never_duplicates() {
    let redis = Redis::start().await;
    let a = node(&redis, &["--redis-timeout-ms", "400"]).await;
    let b = node(&redis, &["--redis-timeout-ms", "400"]).await;
    let (mut sub, _) = b.subscribe(CH, "since=earliest").await;
    a.publish(CH, "before").await;
    assert_eq!(sub.next_event().await.data, "before");

    redis.signal("STOP");
    let t0 = Instant::now();
    let r = a
        .post(
            &format!("/v1/channels/{CH}/events"),
            "once",
            &[("Idempotency-Key", "k1")],
        )
        .await;
    let took = t0.elapsed();
    r.expect_error(503, "unavailable");
    // Bounded by the 400 ms timeout, not by Redis (stopped for good until
    // CONT): the margin is wide because the tests share a loaded machine.
    assert!(
        took < Duration::from_secs(5),
        "failed after {took:?}, not within the 400 ms timeout"
    );
    a.get("/readyz").await.expect_error(503, "unavailable");
    redis.signal("CONT");

    // The hung request may have been applied when Redis woke: the retry with
    // the same key answers the same seq, never a second copy.
    let mut answer = None;
    for _ in 0..50 {
        let r = a
            .post(
                &format!("/v1/channels/{CH}/events"),
                "once",
                &[("Idempotency-Key", "k1")],
            )
            .await;
        // 201 if the hung request was not applied, 200 (a duplicate) if it was
        if r.status == 201 || r.status == 200 {
            answer = Some(r.json.clone());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answer = answer.expect("the retry succeeds once Redis answers");
    assert_eq!(answer["seq"], 2);
    assert_eq!(b.all_data(CH).await, ["before", "once"]);
    let e = sub.next_event().await;
    assert_eq!((seq(&e), e.data.as_str()), (2, "once"));
    a.publish(CH, "after").await;
    let e = sub.next_event().await;
    assert_eq!(
        (seq(&e), e.data.as_str()),
        (3, "after"),
        "exactly once, in order"
    );
}

#[tokio::test]
async fn flushall_gives_every_subscriber_an_epoch_gap_then_delivery_continues() {
    let redis = Redis::start().await;
    let (a, b) = (node(&redis, &[]).await, node(&redis, &[]).await);
    let (mut sa, _) = a.subscribe(CH, "since=earliest").await;
    let (mut sb, _) = b.subscribe(CH, "since=earliest").await;
    a.publish_many(CH, "old", 3).await;
    let old_epoch = epoch_of(&sa.events(3).await[2].id.clone().expect("id"), CH);
    sb.events(3).await;

    redis.cli(&["FLUSHALL"]).await;
    for k in 0..3 {
        b.publish(CH, &format!("new{k}")).await;
    }
    for sub in [&mut sa, &mut sb] {
        let gap = sub.next_event().await;
        assert!(gap.is_gap(), "an epoch gap first, got {gap:?}");
        let g = gap.json();
        assert_eq!(g["reason"], "epoch");
        assert_eq!(seq_of(g["after"].as_str().expect("after"), CH), 3);
        let next = g["next"].as_str().expect("next");
        assert_ne!(epoch_of(next, CH), old_epoch);
        let from = seq_of(next, CH);
        // then every event after the notice's `next`, in the new epoch
        let rest = if from < 3 {
            read_until(sub, 3).await
        } else {
            Vec::new()
        };
        assert_eq!(seqs(&rest), (from + 1..=3).collect::<Vec<_>>());
        for e in &rest {
            assert_eq!(e.data, format!("new{}", seq(e) - 1));
            assert_ne!(epoch_of(e.id.as_deref().expect("id"), CH), old_epoch);
        }
    }
}

#[tokio::test]
async fn failover_to_a_replica_that_was_behind_is_an_epoch_gap_never_a_reused_seq() {
    let mut primary = Redis::start().await;
    let port = primary.port.to_string();
    let replica = Redis::start_with(&["--replicaof", "127.0.0.1", &port]).await;
    let a = node(&primary, &["--redis-timeout-ms", "500"]).await;
    let (mut sub, _) = a.subscribe(CH, "since=earliest").await;
    a.publish_many(CH, "p", 5).await;
    let first = sub.events(5).await;
    let at5 = first[4].id.clone().expect("id");
    eventually(
        "the replica has the first 5",
        Duration::from_secs(10),
        || async {
            replica
                .try_cli(&["HGET", "gapless:{c}", "head"])
                .await
                .as_deref()
                == Some("5")
        },
    )
    .await;

    // Cut the replica off for real: stopped, and its link dropped by the primary.
    replica.signal("STOP");
    primary.cli(&["CLIENT", "KILL", "TYPE", "replica"]).await;
    a.publish_many(CH, "lost", 3).await;
    let more = sub.events(3).await;
    assert_eq!(seqs(&more), [6, 7, 8]);
    let at8 = more[2].id.clone().expect("id");
    let old_epoch = epoch_of(&at8, CH);

    primary.kill9().await;
    replica.signal("CONT");
    replica.cli(&["REPLICAOF", "NO", "ONE"]).await;
    let b = node(&replica, &[]).await;

    // The client that holds 6..8, which the new primary lacks, is told.
    let (mut again, pre) = b.resume(CH, &at8).await;
    assert_eq!(pre.gaps.len(), 1, "{:?}", pre.gaps);
    assert_eq!(pre.gaps[0]["reason"], "epoch");
    let new_epoch = epoch_of(&pre.cursor, CH);
    assert_ne!(
        new_epoch, old_epoch,
        "a failover to a replica that was behind is a new epoch"
    );
    b.publish(CH, "after-failover").await;
    let e = again.next_event().await;
    assert_eq!(e.data, "after-failover");
    assert_eq!(seq(&e), 6);
    assert_eq!(
        epoch_of(e.id.as_deref().expect("id"), CH),
        new_epoch,
        "seq 6 now names another event: it carries another epoch, so no client holds it"
    );
    // A client at 5 lost nothing: the new primary has 1..5 as they were, so
    // it continues in the new epoch with no gap, and gets the new seq 6.
    let (mut at5_sub, pre5) = b.resume(CH, &at5).await;
    assert!(pre5.gaps.is_empty(), "{:?}", pre5.gaps);
    assert_eq!(epoch_of(&pre5.cursor, CH), new_epoch);
    assert_eq!(seq_of(&pre5.cursor, CH), 5);
    let e = at5_sub.next_event().await;
    assert_eq!((seq(&e), e.data.as_str()), (6, "after-failover"));
    // What the new primary kept is still readable, in the new epoch.
    assert_eq!(
        b.all_data(CH).await,
        ["p0", "p1", "p2", "p3", "p4", "after-failover"]
    );
}

#[tokio::test]
async fn a_dropped_bus_notification_does_not_change_the_order() {
    let redis = Redis::start().await;
    let a = node(&redis, &[]).await;
    // b loses every second notification from the bus (and the last one).
    let b = node(&redis, &["--redis-test-drop-notifications", "2"]).await;
    let (mut sub, _) = b.subscribe(CH, "since=earliest").await;
    let total = 20u64;
    for k in 1..=total {
        a.publish(CH, &format!("e{k}")).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let got = read_until(&mut sub, total).await;
    assert_eq!(seqs(&got), (1..=total).collect::<Vec<_>>());
    for e in &got {
        assert_eq!(e.data, format!("e{}", seq(e)));
    }
}

/// `name{labels}` -> value of a node's `GET /metrics`.
async fn metrics(n: &Server) -> BTreeMap<String, f64> {
    let r = n.get("/metrics").await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

fn notifications(m: &BTreeMap<String, f64>, outcome: &str) -> f64 {
    m.get(&format!(
        "gapless_cluster_notifications_total{{outcome=\"{outcome}\"}}"
    ))
    .copied()
    .unwrap_or(0.0)
}

#[tokio::test]
async fn inline_notifications_and_dropped_or_reordered_ones_all_deliver_exactly() {
    let redis = Redis::start().await;
    let a = node(&redis, &[]).await;
    // b hears the bus as it is: small appends arrive inline, the large one by reference.
    let b = node(&redis, &[]).await;
    // c loses every second notification, d handles every third after the next one.
    let c = node(&redis, &["--redis-test-drop-notifications", "2"]).await;
    let d = node(&redis, &["--redis-test-reorder-notifications", "3"]).await;
    let mut subs = Vec::new();
    for n in [&a, &b, &c, &d] {
        subs.push(n.subscribe(CH, "since=earliest").await.0);
    }
    // (type, data) per seq, in the order published on a.
    let mut want: Vec<(String, String)> = Vec::new();
    let single = |k: usize| format!("e{k}: a colon\nand a second line");
    for k in 1..=12 {
        a.publish(CH, &single(k)).await;
        want.push(("message".into(), single(k)));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let batch = serde_json::json!([
        {"data": "b1", "type": "t1"},
        {"data": "b2\n\nz"},
        {"data": "", "type": "t3"}
    ]);
    a.batch(CH, &batch, &[]).await.expect(201);
    want.extend([
        ("t1".into(), "b1".into()),
        ("message".into(), "b2\n\nz".into()),
        ("t3".into(), String::new()),
    ]);
    tokio::time::sleep(Duration::from_millis(10)).await;
    // Larger than --redis-inline-bytes (4096 by default): notified by reference.
    let large = "L".repeat(5000);
    a.publish(CH, &large).await;
    want.push(("message".into(), large));
    for k in 13..=24 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        a.publish(CH, &single(k)).await;
        want.push(("message".into(), single(k)));
    }
    let total = want.len() as u64;
    for (i, sub) in subs.iter_mut().enumerate() {
        let got = read_until(sub, total).await;
        assert_eq!(seqs(&got), (1..=total).collect::<Vec<_>>(), "node {i}");
        for e in &got {
            let (t, d) = &want[(seq(e) - 1) as usize];
            assert_eq!((&e.event, &e.data), (t, d), "node {i}, seq {}", seq(e));
        }
    }
    // b delivered the small appends from the notifications themselves: of its
    // 26 notifications at most the first (before b knew the channel's head)
    // and the large one were read from Redis. On a loaded machine b's poll of
    // followed channels may fill a head before its notification arrives,
    // which then counts as `known` (nothing read for it either).
    let m = metrics(&b).await;
    let (inline, read) = (notifications(&m, "inline"), notifications(&m, "read"));
    let known = notifications(&m, "known");
    assert!(
        inline + known >= 24.0 && inline >= 12.0,
        "inline {inline}, known {known}, read {read}: {m:?}"
    );
    assert!((1.0..=2.0).contains(&read), "inline {inline}, read {read}");
}

fn published(m: &BTreeMap<String, f64>, durability: &str) -> Option<f64> {
    m.get(&format!(
        "gapless_events_published_total{{durability=\"{durability}\"}}"
    ))
    .copied()
}

#[tokio::test]
async fn the_durability_label_is_what_the_redis_settings_give() {
    // AOF fsynced at every write: `sync`.
    let redis = Redis::start().await;
    let a = node(&redis, &[]).await;
    a.publish(CH, "x").await;
    a.publish(CH, "y").await;
    let m = metrics(&a).await;
    assert_eq!(published(&m, "sync"), Some(2.0), "{m:?}");
    // fsynced once a second: `async`, and the start warns, naming the setting.
    let lazy = Redis::start_with(&["--appendfsync", "everysec"]).await;
    let b = node(&lazy, &[]).await;
    b.publish(CH, "z").await;
    let m = metrics(&b).await;
    assert_eq!(
        (published(&m, "async"), published(&m, "sync")),
        (Some(1.0), None),
        "{m:?}"
    );
    assert!(
        b.log().contains("Redis appendfsync is 'everysec'"),
        "{}",
        b.log()
    );
    // No persistence at all, switched while the node runs: seen when the node
    // reconnects its bus (as after a restart or failover of Redis).
    lazy.cli(&["CONFIG", "SET", "appendonly", "no"]).await;
    lazy.cli(&["CONFIG", "SET", "save", ""]).await;
    lazy.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]).await;
    eventually("publishes counted as `memory`", WAIT, || async {
        b.publish(CH, "w").await;
        published(&metrics(&b).await, "memory").is_some()
    })
    .await;
}

#[tokio::test]
async fn cross_node_delivery_takes_a_few_milliseconds() {
    let redis = Redis::start().await;
    let (a, b) = (node(&redis, &[]).await, node(&redis, &[]).await);
    let (mut sub, _) = b.subscribe(CH, "").await;
    let mut lat = Vec::new();
    for k in 0..100 {
        let t0 = Instant::now();
        a.publish(CH, &format!("m{k}")).await;
        let e = sub.next_event().await;
        lat.push(t0.elapsed());
        assert_eq!(e.data, format!("m{k}"));
    }
    lat.sort();
    let (p50, p99) = (lat[49], lat[98]);
    println!("publish on A to receive on B, 100 sequential events: p50 {p50:?}, p99 {p99:?}");
    assert!(p50 < Duration::from_millis(50), "p50 {p50:?}");
}

fn assert_session_event(v: &Value, seq: u64, data: &str) {
    assert_eq!(v["op"], "event", "{v}");
    assert_eq!(
        (v["seq"].as_u64(), v["data"].as_str()),
        (Some(seq), Some(data)),
        "{v}"
    );
}

/// A refusal or a kick: one `session_attached` error message, then close 4409.
async fn expect_4409(ws: &mut Ws) {
    let mut saw_error = false;
    loop {
        match ws.recv(WAIT).await {
            Some(Msg::Json(v)) if v["op"] == "event" => {}
            Some(Msg::Json(v)) => {
                assert_eq!(v["code"], "session_attached", "{v}");
                saw_error = true;
            }
            Some(Msg::Close(Some((code, _)))) => {
                assert!(saw_error, "an error message before the close");
                assert_eq!(code, 4409);
                return;
            }
            other => panic!("expected session_attached then close 4409, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn session_attach_state_is_shared_second_consumer_4409_and_takeover_across_nodes() {
    let redis = Redis::start().await;
    let (a, b, c) = (
        node(&redis, &[]).await,
        node(&redis, &[]).await,
        node(&redis, &[]).await,
    );
    let id = new_session(&a, "s1").await;
    let mut on_b = consume(&b, &id, "").await;
    eventually("attached, as seen from another node", WAIT, || async {
        session_info(&c, &id).await.json["attached"] == true
    })
    .await;
    // A second consumer on another node is refused; the holder is unaffected.
    let mut refused = consume(&c, &id, "").await;
    expect_4409(&mut refused).await;
    let r = append(&a, &id, "e2").await;
    assert_eq!(
        r.expect(201)["attached"],
        true,
        "attached on another node counts"
    );
    assert_session_event(&on_b.json().await, 2, "e2");

    // Takeover on C closes the consumer on B, and C resumes exactly.
    append_ok(&a, &id, "e3").await;
    let mut on_c = consume(&c, &id, "takeover=true&last_seq=2").await;
    expect_4409(&mut on_b).await;
    assert_session_event(&on_c.json().await, 3, "e3");
    assert_eq!(on_c.json().await["op"], "session.resumed");
    append_ok(&b, &id, "e4").await;
    assert_session_event(&on_c.json().await, 4, "e4");

    // Ended on one node is ended on every node.
    end_session(&a, &id, "complete").await.expect(200);
    append(&b, &id, "late")
        .await
        .expect_error(409, "session_ended");
}

#[tokio::test]
async fn a_session_consumer_whose_node_dies_resumes_on_another_within_the_grace_window() {
    let redis = Redis::start().await;
    let grace = ["--session-grace-ms", "2000"];
    let a = node(&redis, &grace).await;
    let mut b = node(&redis, &grace).await;
    let c = node(&redis, &grace).await;
    let id = new_session(&a, "s2").await;
    let mut on_b = consume(&b, &id, "").await;
    eventually("attached", WAIT, || async {
        session_info(&a, &id).await.json["attached"] == true
    })
    .await;
    append_ok(&a, &id, "e2").await;
    assert_session_event(&on_b.json().await, 2, "e2");
    b.kill9().await;
    append_ok(&a, &id, "e3").await;
    // The consumer comes back on another node (as the SDK does: last_seq, takeover).
    let mut on_c = consume(&c, &id, "takeover=true&last_seq=2").await;
    assert_session_event(&on_c.json().await, 3, "e3");
    assert_eq!(on_c.json().await["op"], "session.resumed");
    // Longer than the grace window: A, which created the session and has no
    // consumer of its own, must not cancel a session attached on C.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert_eq!(append_ok(&a, &id, "e4").await, 4);
    assert_session_event(&on_c.json().await, 4, "e4");
    let info = session_info(&a, &id).await;
    assert_eq!(info.json["status"], "open", "{}", info.text);
}

#[tokio::test]
async fn sentinel_failover_to_a_caught_up_replica_is_seamless_for_open_streams() {
    let mut primary = Redis::start().await;
    let port = primary.port.to_string();
    let replica = Redis::start_with(&["--replicaof", "127.0.0.1", &port]).await;
    let sentinel = Redis::sentinel(primary.port).await;
    eventually(
        "the sentinel knows the replica",
        Duration::from_secs(15),
        || async {
            sentinel
                .try_cli(&["SENTINEL", "REPLICAS", "mymaster"])
                .await
                .is_some_and(|r| r.contains(&replica.port.to_string()))
        },
    )
    .await;
    let via = [
        "--redis-sentinel",
        "mymaster",
        "--redis-timeout-ms",
        "500",
        "--heartbeat-ms",
        "200",
    ];
    let a = node_at(&sentinel.url(), &via).await;
    let b = node_at(&sentinel.url(), &via).await;
    let (mut sub, _) = b.subscribe(CH, "since=earliest").await;
    a.publish_many(CH, "p", 5).await;
    let before = sub.events(5).await;
    assert_eq!(seqs(&before), [1, 2, 3, 4, 5]);
    let old_epoch = epoch_of(before[4].id.as_deref().expect("id"), CH);
    eventually("the replica has all 5", Duration::from_secs(10), || async {
        replica
            .try_cli(&["HGET", "gapless:{c}", "head"])
            .await
            .as_deref()
            == Some("5")
    })
    .await;

    primary.kill9().await;
    // Sentinel promotes the replica; the nodes find it through Sentinel.
    let mut published = false;
    for _ in 0..150 {
        let r = a
            .post(
                &format!("/v1/channels/{CH}/events"),
                "after",
                &[("Idempotency-Key", "after")],
            )
            .await;
        if r.status == 201 || r.status == 200 {
            published = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        published,
        "publishing works again after the failover; log:\n{}",
        a.log()
    );
    // The open stream continues exactly: nothing was lost, so no gap.
    let e = sub.next_event().await;
    assert!(!e.is_gap(), "a failover that lost nothing is no gap: {e:?}");
    assert_eq!((seq(&e), e.data.as_str()), (6, "after"));
    assert_ne!(
        epoch_of(e.id.as_deref().expect("id"), CH),
        old_epoch,
        "the promoted replica is a new epoch, which positions up to 5 continue into"
    );
}

#[tokio::test]
async fn readyz_needs_no_token_where_everything_else_does() {
    let redis = Redis::start().await;
    let a = node(
        &redis,
        &["--jwt-secret", "a-secret-of-at-least-thirty-two-bytes!!"],
    )
    .await;
    let r = a.get("/readyz").await;
    assert_eq!(r.expect(200)["status"], "ready");
    a.post(&format!("/v1/channels/{CH}/events"), "x", &[])
        .await
        .expect_error(401, "unauthorized");
}

#[tokio::test]
async fn after_losing_its_bus_connection_a_node_rereads_the_heads_it_follows() {
    let redis = Redis::start().await;
    let a = node(&redis, &[]).await;
    // No periodic re-read: only the re-read after the reconnect can deliver.
    let b = node(&redis, &["--redis-poll-ms", "0"]).await;
    let (mut sub, _) = b.subscribe(CH, "since=earliest").await;
    a.publish(CH, "before").await;
    assert_eq!(sub.next_event().await.data, "before");
    // Drop every pub/sub connection, then publish at once: b reconnects only
    // after its backoff (25 ms at least), so it cannot hear this notification.
    redis.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]).await;
    a.publish(CH, "while b was deaf").await;
    let e = sub.next_event().await;
    assert_eq!((seq(&e), e.data.as_str()), (2, "while b was deaf"));
}

#[tokio::test]
async fn an_ephemeral_event_reaches_subscribers_on_every_node() {
    let redis = Redis::start().await;
    let (a, b, c) = (
        node(&redis, &[]).await,
        node(&redis, &[]).await,
        node(&redis, &[]).await,
    );
    let mut on_b = b.sse("/v1/channels/eph/sse", &[]).await;
    let mut on_c = c.sse("/v1/channels/eph/sse", &[]).await;
    // Journaled first, so each subscriber is known to be following.
    a.post("/v1/channels/eph/events", "first", &[])
        .await
        .expect(201);
    for sub in [&mut on_b, &mut on_c] {
        assert_eq!(sub.next_event().await.data, "first");
    }
    let r = a
        .post(
            "/v1/channels/eph/events?ephemeral=true&type=typing",
            "hi there",
            &[],
        )
        .await;
    assert_eq!(
        r.expect(202)["subscribers"],
        0,
        "the count is of the publishing node's own subscribers"
    );
    for sub in [&mut on_b, &mut on_c] {
        let e = sub.next_event().await;
        assert_eq!(
            (e.event.as_str(), e.data.as_str(), e.id),
            ("typing", "hi there", None)
        );
    }
    // The node that took it delivers it once to its own subscribers (its
    // own bus message is skipped), and the others once too.
    let mut on_a = a.sse("/v1/channels/eph/sse", &[]).await;
    b.post("/v1/channels/eph/events", "second", &[])
        .await
        .expect(201);
    for sub in [&mut on_a, &mut on_b, &mut on_c] {
        assert_eq!(sub.next_event().await.data, "second");
    }
    a.post("/v1/channels/eph/events?ephemeral=true", "again", &[])
        .await
        .expect(202);
    b.post("/v1/channels/eph/events", "third", &[])
        .await
        .expect(201);
    for sub in [&mut on_a, &mut on_b, &mut on_c] {
        let mut got = vec![sub.next_event().await.data, sub.next_event().await.data];
        got.sort();
        assert_eq!(got, ["again", "third"]);
    }
    // No second copy: the bus is one ordered connection, so a copy of
    // "again" would come before the notification of "fourth".
    b.post("/v1/channels/eph/events", "fourth", &[])
        .await
        .expect(201);
    for sub in [&mut on_a, &mut on_b, &mut on_c] {
        assert_eq!(sub.next_event().await.data, "fourth", "each once");
    }
}

#[tokio::test]
async fn a_session_opened_on_one_node_lives_on_another_that_started_long_before() {
    // Nodes up longer than the grace window: a session opened on A was
    // cancelled the first time B touched it (B counted it detached since
    // B's own start).
    let redis = Redis::start().await;
    let grace = ["--session-grace-ms", "1500"];
    let (a, b, c) = (
        node(&redis, &grace).await,
        node(&redis, &grace).await,
        node(&redis, &grace).await,
    );
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let id = new_session(&a, "late-touch").await;
    assert_eq!(append_ok(&b, &id, "e2").await, 2);
    let info = session_info(&c, &id).await;
    assert_eq!(info.json["status"], "open", "{}", info.text);
    let mut on_c = consume(&c, &id, "").await;
    append_ok(&b, &id, "e3").await;
    assert_session_event(&on_c.json().await, 3, "e3");
    drop(on_c);
    // The grace window still applies once nobody consumes: cancelled on every node.
    eventually("cancelled after the grace window", WAIT, || async {
        session_info(&b, &id).await.json["status"] == "cancelled"
    })
    .await;
    append(&a, &id, "late")
        .await
        .expect_error(409, "session_ended");
}

#[tokio::test]
async fn concurrent_creates_of_one_id_on_two_nodes_one_wins() {
    let redis = Redis::start().await;
    let (a, b) = (node(&redis, &[]).await, node(&redis, &[]).await);
    for round in 0..8 {
        let id = format!("race-{round}");
        let creates: Vec<_> = [&a, &b, &a, &b]
            .into_iter()
            .map(|n| {
                let http = n.http.clone();
                let url = n.url("/v1/sessions");
                let body = serde_json::json!({ "id": id }).to_string();
                tokio::spawn(async move {
                    let r = http
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(body)
                        .send()
                        .await
                        .expect("create");
                    let status = r.status().as_u16();
                    (status, r.json::<Value>().await.unwrap_or(Value::Null))
                })
            })
            .collect();
        let mut created = 0;
        for c in creates {
            match c.await.expect("create task") {
                (201, _) => created += 1,
                (409, body) => assert_eq!(body["error"], "session_exists", "{body}"),
                (other, body) => panic!("create answered {other}: {body}"),
            }
        }
        assert_eq!(created, 1, "round {round}: exactly one create wins");
        let info = session_info(&a, &id).await;
        assert_eq!(info.json["head"], 1, "one opening marker: {}", info.text);
    }
}

#[tokio::test]
async fn no_session_event_lands_after_an_end_written_on_another_node() {
    let redis = Redis::start().await;
    let (a, b) = (node(&redis, &[]).await, node(&redis, &[]).await);
    let id = new_session(&a, "s3").await;
    let mut writers = Vec::new();
    for w in 0..4 {
        let http = b.http.clone();
        let url = b.url(&format!("/v1/sessions/{id}/events"));
        writers.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for k in 0..30 {
                let r = http
                    .post(&url)
                    .body(format!("w{w}k{k}"))
                    .send()
                    .await
                    .expect("append");
                let status = r.status().as_u16();
                let body: Value = r.json().await.unwrap_or(Value::Null);
                answers.push((status, body));
            }
            answers
        }));
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    let end = end_session(&a, &id, "complete").await;
    let end_seq = end.expect(200)["head"].as_u64().expect("head");
    for w in writers {
        for (status, body) in w.await.expect("writer") {
            match status {
                201 => assert!(body["seq"].as_u64().expect("seq") < end_seq, "{body}"),
                409 => assert_eq!(body["error"], "session_ended", "{body}"),
                other => panic!("append answered {other}: {body}"),
            }
        }
    }
    let info = session_info(&b, &id).await;
    assert_eq!(
        (info.json["status"].as_str(), info.json["head"].as_u64()),
        (Some("completed"), Some(end_seq))
    );
}

#[tokio::test]
async fn rediss_with_a_verified_certificate_and_a_password() {
    // A self-signed certificate for 127.0.0.1, trusted through SSL_CERT_FILE.
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let ok = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("running openssl");
    assert!(ok.success(), "openssl req failed");
    let tls_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
        .to_string();
    let (cert_s, key_s) = (cert.display().to_string(), key.display().to_string());
    let redis = Redis::start_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &cert_s,
        "--tls-key-file",
        &key_s,
        "--tls-auth-clients",
        "no",
    ])
    .await;
    redis.cli(&["CONFIG", "SET", "requirepass", "s3cret"]).await;
    let url = format!("rediss://:s3cret@127.0.0.1:{tls_port}");
    let start = |url: String| {
        let cert_s = cert_s.clone();
        async move {
            Server::with(Opts {
                args: vec!["--redis".to_owned(), url],
                env: vec![("SSL_CERT_FILE".to_owned(), cert_s)],
                ..Opts::default()
            })
            .await
        }
    };
    let a = start(url.clone()).await;
    let b = start(url).await;
    let (mut sub, _) = b.subscribe(CH, "since=earliest").await;
    a.publish(CH, "over tls").await;
    assert_eq!(sub.next_event().await.data, "over tls");
    // A wrong password is refused: not ready, and publishes answer 503.
    let wrong = start(format!("rediss://:wrong@127.0.0.1:{tls_port}")).await;
    wrong.get("/readyz").await.expect_error(503, "unavailable");
    wrong
        .post(&format!("/v1/channels/{CH}/events"), "x", &[])
        .await
        .expect_error(503, "unavailable");
    // The certificate is verified: without the trusted file, no connection.
    let untrusting = node_at(&format!("rediss://:s3cret@127.0.0.1:{tls_port}"), &[]).await;
    untrusting
        .get("/readyz")
        .await
        .expect_error(503, "unavailable");
}
