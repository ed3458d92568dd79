//! Presence (issue 21, "Presence"), against the real binary on one node:
//! who a member is (a token's `sub`, an open server's `client_id`, and the
//! refusals of a bad one), `GET /v1/channels/{channel}/presence`
//! (occupancy, members sorted by id, `presence_disabled`), join and leave
//! over SSE (`event: gapless.presence`, no `id:` line, the cursor does not
//! move) and WebSocket (`{"op":"presence",…}`), a member's SSE and
//! WebSocket connections counting as one member, and `presence_linger_ms`
//! (the leave waits for it; a reconnect within it is neither a leave nor a
//! join); and on the Redis journal with two nodes: the same presence on
//! both, notices from either reaching both, and the members of a node that
//! dies leaving within 30 s.

use gapless_testkit::redis::Redis;
use gapless_testkit::sse::{Item, Next, SseClient};
use gapless_testkit::ws::{assert_error, Ws};
use gapless_testkit::{eventually, Opts, Server};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A server on the embedded journal whose namespace `room` has presence
/// with `presence_linger_ms = linger_ms` (`news` has none); `extra` flags.
async fn server(dir: &tempfile::TempDir, linger_ms: u64, extra: &[&str]) -> Server {
    let p = dir.path().join("g.toml");
    std::fs::write(
        &p,
        format!("[namespaces.room]\npresence = true\npresence_linger_ms = {linger_ms}\n"),
    )
    .expect("write config");
    let mut args = vec!["--config".to_owned(), p.display().to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    Server::with(Opts {
        args,
        ..Opts::default()
    })
    .await
}

async fn presence(s: &Server, channel: &str) -> Value {
    s.get(&format!("/v1/channels/{channel}/presence"))
        .await
        .expect(200)
        .clone()
}

/// `(id, connections)` of each member, in the answer's order.
fn members(p: &Value) -> Vec<(String, u64)> {
    p["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            (
                m["id"].as_str().expect("id").to_owned(),
                m["connections"].as_u64().expect("connections"),
            )
        })
        .collect()
}

/// The next SSE event that is not a heartbeat or `retry:` (panics after 10 s).
async fn next_event(c: &mut SseClient) -> gapless_testkit::sse::Event {
    c.next_event().await
}

/// Asserts no SSE event (comments aside) arrives for `dur`.
async fn sse_quiet(c: &mut SseClient, dur: Duration) {
    let until = Instant::now() + dur;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        match c.next_within(left).await {
            None => return,
            Some(Next::Item(Item::Comment(_) | Item::Retry(_))) => {}
            Some(other) => panic!("expected nothing for {dur:?}, got {other:?}"),
        }
    }
}

/// Asserts that `e` is the notice `action` of `id` on `channel`, with no `id:` line.
fn is_notice(e: &gapless_testkit::sse::Event, action: &str, channel: &str, id: &str) {
    assert_eq!(e.event, "gapless.presence", "{e:?}");
    assert_eq!(e.id, None, "a presence notice has no id: line: {e:?}");
    assert_eq!(
        e.json(),
        json!({"action": action, "channel": channel, "id": id}),
        "{e:?}"
    );
}

async fn ws_notice(ws: &mut Ws, action: &str, channel: &str, id: &str) {
    let m = ws.expect_op("presence").await;
    assert_eq!(
        m,
        json!({"op": "presence", "action": action, "channel": channel, "id": id})
    );
}

/// Subscribes `ws` to `channel` with `extra` and waits for the reply.
async fn ws_subscribe(ws: &mut Ws, channel: &str, extra: Value) {
    ws.subscribe(json!(channel), channel, extra).await;
    let r = ws.expect_op("subscribed").await;
    assert_eq!(r["channel"], channel, "{r}");
}

#[tokio::test]
async fn presence_answers_occupancy_and_members_sorted_by_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(&dir, 0, &[]).await;
    let empty = presence(&s, "room:a").await;
    assert_eq!(
        empty,
        json!({"channel": "room:a", "occupancy": 0, "members": []})
    );
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let (_bob, _) = s.subscribe("room:a", "client_id=bob").await;
    let (_ana1, _) = s.subscribe("room:a", "client_id=ana").await;
    let (_anon, _) = s.subscribe("room:a", "").await;
    // Ana's WebSocket subscription is the same member as her SSE stream.
    let mut ana2 = Ws::channels(&s).await;
    ws_subscribe(&mut ana2, "room:a", json!({"client_id": "ana"})).await;
    // A multi-channel stream holds a place in each channel with presence only.
    let (_multi, _) = {
        let mut c = s
            .sse("/v1/sse?channel=room:a&channel=news&client_id=carl", &[])
            .await;
        let p = c.preamble().await;
        (c, p)
    };
    let p = presence(&s, "room:a").await;
    assert_eq!(p["channel"], "room:a");
    assert_eq!(p["occupancy"], 5, "{p}");
    assert_eq!(
        members(&p),
        vec![
            ("ana".to_owned(), 2),
            ("bob".to_owned(), 1),
            ("carl".to_owned(), 1)
        ]
    );
    for m in p["members"].as_array().expect("members") {
        assert!(m["since"].as_u64().expect("since") >= before, "{m}");
    }
    // Another channel of the namespace is its own.
    assert_eq!(presence(&s, "room:b").await["occupancy"], 0);
}

#[tokio::test]
async fn a_namespace_without_presence_answers_presence_disabled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(&dir, 0, &[]).await;
    for ch in ["news", "other:x"] {
        let r = s.get(&format!("/v1/channels/{ch}/presence")).await;
        let body = r.expect_error(404, "presence_disabled");
        assert!(
            body["message"]
                .as_str()
                .unwrap_or("")
                .contains("presence = true"),
            "{body}"
        );
    }
    s.get("/v1/channels/news/sse?presence=true")
        .await
        .expect_error(404, "presence_disabled");
    // One channel with presence is enough for a multi-channel stream.
    let mut c = s
        .sse("/v1/sse?channel=news&channel=room:a&presence=true", &[])
        .await;
    c.preamble().await;
    let mut ws = Ws::channels(&s).await;
    ws.subscribe(json!(1), "news", json!({"presence": true}))
        .await;
    let e = ws.json().await;
    assert_error(&e, "presence_disabled");
    assert_eq!(e["id"], 1);
    // Following a channel without presence, no notices asked: fine, no place held.
    ws_subscribe(&mut ws, "news", json!({"client_id": "ana"})).await;
    s.get("/v1/channels/bad%20name/presence")
        .await
        .expect_error(400, "invalid_channel");
}

#[tokio::test]
async fn a_bad_client_id_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(&dir, 0, &[]).await;
    let long = "x".repeat(129);
    for bad in ["", "a%20b", "a%2Fb", "%C3%A9", long.as_str()] {
        let r = s
            .get(&format!("/v1/channels/room:a/sse?client_id={bad}"))
            .await;
        let body = r.expect_error(400, "invalid_request");
        assert!(
            body["message"].as_str().unwrap_or("").contains("client_id"),
            "{bad}: {body}"
        );
    }
    let mut ws = Ws::channels(&s).await;
    ws.subscribe(json!(7), "room:a", json!({"client_id": "a b"}))
        .await;
    let e = ws.json().await;
    assert_error(&e, "invalid_request");
    assert_eq!(e["id"], 7);
    // The socket stays and takes a good one; nothing was counted for the refusal.
    ws_subscribe(&mut ws, "room:a", json!({"client_id": &"x".repeat(128)})).await;
    let p = presence(&s, "room:a").await;
    assert_eq!(p["occupancy"], 1, "{p}");
    assert_eq!(members(&p), vec![("x".repeat(128), 1)]);
    s.get("/v1/channels/room:a/sse?presence=maybe")
        .await
        .expect_error(400, "invalid_request");
}

const SECRET: &str = "a-test-secret-that-is-long-enough-32";

fn token(sub: Option<&str>) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        + 3600;
    let mut claims = json!({"exp": exp, "gapless": {"subscribe": ["room:*"], "publish": []}});
    if let Some(sub) = sub {
        claims["sub"] = json!(sub);
    }
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()).expect("key"),
    )
    .expect("sign")
}

#[tokio::test]
async fn with_keys_a_member_is_its_tokens_sub() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(&dir, 0, &["--jwt-secret", SECRET]).await;
    let ana = token(Some("ana"));
    let (_a, _) = s.subscribe("room:a", &format!("access_token={ana}")).await;
    let nobody = token(None);
    let (_n, _) = s
        .subscribe("room:a", &format!("access_token={nobody}"))
        .await;
    // A client cannot choose who it is on a server with keys.
    s.get(&format!(
        "/v1/channels/room:a/sse?access_token={nobody}&client_id=bob"
    ))
    .await
    .expect_error(400, "invalid_request");
    let r = s
        .send(
            s.http
                .get(s.url("/v1/channels/room:a/presence"))
                .bearer_auth(&nobody),
        )
        .await;
    let p = r.expect(200);
    assert_eq!(p["occupancy"], 2, "{p}");
    assert_eq!(members(p), vec![("ana".to_owned(), 1)]);
    // The subscribe right is needed.
    s.get("/v1/channels/room:a/presence")
        .await
        .expect_error(401, "unauthorized");
}

#[tokio::test]
async fn join_and_leave_reach_sse_and_websocket_watchers_and_move_no_cursor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let linger = Duration::from_millis(300);
    let s = server(&dir, linger.as_millis() as u64, &[]).await;
    s.publish("room:a", "before").await;
    let (mut sse, pre) = s.subscribe("room:a", "presence=true").await;
    let mut ws = Ws::channels(&s).await;
    ws_subscribe(&mut ws, "room:a", json!({"presence": true})).await;
    // Ana's first connection (SSE) is her join, to both watchers.
    let (ana_sse, _) = s.subscribe("room:a", "client_id=ana").await;
    let e = next_event(&mut sse).await;
    is_notice(&e, "join", "room:a", "ana");
    assert_eq!(e.last_event_id, pre.cursor, "a notice moves no cursor");
    ws_notice(&mut ws, "join", "room:a", "ana").await;
    // Her second (WebSocket) is no join; an event after it is delivered as usual.
    let mut ana_ws = Ws::channels(&s).await;
    ws_subscribe(&mut ana_ws, "room:a", json!({"client_id": "ana"})).await;
    s.publish("room:a", "after").await;
    let e = next_event(&mut sse).await;
    assert_eq!(e.data, "after", "no second join before the event: {e:?}");
    assert!(e.id.is_some());
    let m = ws.expect_op("event").await;
    assert_eq!(m["data"], "after");
    // One connection gone, one left: no leave.
    drop(ana_sse);
    eventually(
        "ana's SSE stream is gone",
        Duration::from_secs(10),
        || async { members(&presence(&s, "room:a").await) == vec![("ana".to_owned(), 1)] },
    )
    .await;
    // Her last one gone: the leave, not before the linger.
    let closed = Instant::now();
    ana_ws.close().await;
    let e = next_event(&mut sse).await;
    is_notice(&e, "leave", "room:a", "ana");
    assert!(
        closed.elapsed() >= linger,
        "leave after {:?}",
        closed.elapsed()
    );
    ws_notice(&mut ws, "leave", "room:a", "ana").await;
    let p = presence(&s, "room:a").await;
    assert_eq!(p["occupancy"], 2, "the two watchers: {p}");
    assert_eq!(members(&p), vec![]);
    // Unsubscribing is a leave too (linger: 300 ms).
    let mut bob = Ws::channels(&s).await;
    ws_subscribe(&mut bob, "room:a", json!({"client_id": "bob"})).await;
    is_notice(&next_event(&mut sse).await, "join", "room:a", "bob");
    ws_notice(&mut ws, "join", "room:a", "bob").await;
    bob.send(&json!({"op": "unsubscribe", "channel": "room:a"}))
        .await;
    bob.expect_op("unsubscribed").await;
    is_notice(&next_event(&mut sse).await, "leave", "room:a", "bob");
    ws_notice(&mut ws, "leave", "room:a", "bob").await;
}

#[tokio::test]
async fn a_reconnect_within_the_linger_is_neither_a_leave_nor_a_join() {
    let dir = tempfile::tempdir().expect("tempdir");
    let linger = Duration::from_millis(2000);
    let s = server(&dir, linger.as_millis() as u64, &[]).await;
    let (mut watcher, _) = s.subscribe("room:a", "presence=true").await;
    let (ana, _) = s.subscribe("room:a", "client_id=ana").await;
    is_notice(&next_event(&mut watcher).await, "join", "room:a", "ana");
    let since = presence(&s, "room:a").await["members"][0]["since"].clone();
    drop(ana);
    // Gone but lingering: still a member, with no connection.
    eventually("ana's stream is gone", Duration::from_secs(10), || async {
        members(&presence(&s, "room:a").await) == vec![("ana".to_owned(), 0)]
    })
    .await;
    let mut back = Ws::channels(&s).await;
    ws_subscribe(&mut back, "room:a", json!({"client_id": "ana"})).await;
    sse_quiet(&mut watcher, linger + Duration::from_millis(1000)).await;
    let p = presence(&s, "room:a").await;
    assert_eq!(members(&p), vec![("ana".to_owned(), 1)]);
    assert_eq!(p["members"][0]["since"], since, "the same stay: {p}");
    // Once gone for good, she leaves.
    back.close().await;
    is_notice(&next_event(&mut watcher).await, "leave", "room:a", "ana");
    // A subscriber that asked for none gets none.
    let (mut plain, _) = s.subscribe("room:a", "").await;
    let (_bob, _) = s.subscribe("room:a", "client_id=bob").await;
    is_notice(&next_event(&mut watcher).await, "join", "room:a", "bob");
    sse_quiet(&mut plain, Duration::from_millis(300)).await;
}

#[tokio::test]
async fn a_multi_channel_stream_gets_the_notices_of_each_channel_and_a_resubscribe_keeps_its_place()
{
    let dir = tempfile::tempdir().expect("tempdir");
    let s = server(&dir, 0, &[]).await;
    let mut watcher = s
        .sse(
            "/v1/sse?channel=room:a&channel=news&channel=room:b&presence=true",
            &[],
        )
        .await;
    let pre = watcher.preamble().await;
    let mut ana = Ws::channels(&s).await;
    ws_subscribe(&mut ana, "room:b", json!({"client_id": "ana"})).await;
    let e = next_event(&mut watcher).await;
    is_notice(&e, "join", "room:b", "ana");
    assert_eq!(e.last_event_id, pre.cursor, "a notice moves no cursor");
    ws_subscribe(&mut ana, "room:a", json!({"client_id": "ana"})).await;
    is_notice(&next_event(&mut watcher).await, "join", "room:a", "ana");
    // Subscribing again to a followed channel (now asking for notices) keeps the place.
    ws_subscribe(
        &mut ana,
        "room:b",
        json!({"client_id": "ana", "presence": true}),
    )
    .await;
    sse_quiet(&mut watcher, Duration::from_millis(300)).await;
    assert_eq!(
        members(&presence(&s, "room:b").await),
        vec![("ana".to_owned(), 1)]
    );
    let (_bob, _) = s.subscribe("room:b", "client_id=bob").await;
    is_notice(&next_event(&mut watcher).await, "join", "room:b", "bob");
    ws_notice(&mut ana, "join", "room:b", "bob").await;
}

// ---- the Redis journal, two nodes ----

/// A node on `redis` whose namespace `room` has presence with
/// `presence_linger_ms = linger_ms`.
async fn node(redis: &Redis, dir: &tempfile::TempDir, linger_ms: u64) -> Server {
    let p = dir.path().join("g.toml");
    std::fs::write(
        &p,
        format!("[namespaces.room]\npresence = true\npresence_linger_ms = {linger_ms}\n"),
    )
    .expect("write config");
    Server::with(Opts {
        args: vec![
            "--redis".into(),
            redis.url(),
            "--config".into(),
            p.display().to_string(),
        ],
        ..Opts::default()
    })
    .await
}

/// The next SSE event within `within`, heartbeats skipped.
async fn sse_event_within(c: &mut SseClient, within: Duration) -> gapless_testkit::sse::Event {
    let until = Instant::now() + within;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match c.next_within(left).await {
            Some(Next::Item(Item::Event(e))) => return e,
            Some(Next::Item(_)) => {}
            other => panic!("expected an event within {within:?}, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn on_two_nodes_presence_is_the_same_and_notices_reach_both() {
    let Some(redis) = Redis::start_or_skip("presence on redis").await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let a = node(&redis, &dir, 300).await;
    let b = node(&redis, &dir, 300).await;
    let (mut on_a, _) = a.subscribe("room:c", "presence=true").await;
    let mut on_b = Ws::channels(&b).await;
    ws_subscribe(&mut on_b, "room:c", json!({"presence": true})).await;
    // Ana on node a: her join, on both nodes.
    let (ana_a, _) = a.subscribe("room:c", "client_id=ana").await;
    is_notice(&next_event(&mut on_a).await, "join", "room:c", "ana");
    ws_notice(&mut on_b, "join", "room:c", "ana").await;
    // Ana on node b too: one member, no second join; both nodes say so.
    let mut ana_b = Ws::channels(&b).await;
    ws_subscribe(&mut ana_b, "room:c", json!({"client_id": "ana"})).await;
    for s in [&a, &b] {
        eventually(
            "both nodes count ana twice",
            Duration::from_secs(10),
            || async {
                let p = presence(s, "room:c").await;
                p["occupancy"] == 4 && members(&p) == vec![("ana".to_owned(), 2)]
            },
        )
        .await;
    }
    // Gone from a, still on b: no leave.
    drop(ana_a);
    eventually(
        "ana's stream on a is gone",
        Duration::from_secs(10),
        || async { members(&presence(&b, "room:c").await) == vec![("ana".to_owned(), 1)] },
    )
    .await;
    sse_quiet(&mut on_a, Duration::from_millis(800)).await;
    // Gone from b too: her leave, on both nodes.
    ana_b.close().await;
    is_notice(&next_event(&mut on_a).await, "leave", "room:c", "ana");
    ws_notice(&mut on_b, "leave", "room:c", "ana").await;
    for s in [&a, &b] {
        let p = presence(s, "room:c").await;
        assert_eq!(p["occupancy"], 2, "the two watchers: {p}");
        assert_eq!(members(&p), vec![]);
    }
}

#[tokio::test]
async fn the_members_of_a_node_that_dies_leave_within_30_s() {
    let Some(redis) = Redis::start_or_skip("presence on redis").await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let a = node(&redis, &dir, 300).await;
    let mut b = node(&redis, &dir, 300).await;
    let (mut watcher, _) = a.subscribe("room:d", "presence=true").await;
    let (_bob, _) = b.subscribe("room:d", "client_id=bob").await;
    is_notice(&next_event(&mut watcher).await, "join", "room:d", "bob");
    b.kill9().await;
    let died = Instant::now();
    let e = sse_event_within(&mut watcher, Duration::from_secs(30)).await;
    is_notice(&e, "leave", "room:d", "bob");
    eprintln!("bob left {:?} after his node died", died.elapsed());
    let p = presence(&a, "room:d").await;
    assert_eq!(p["occupancy"], 1, "the watcher: {p}");
    assert_eq!(members(&p), vec![]);
}

/// A node cut off long enough for the others to take its members out (here
/// paused with SIGSTOP past its liveness TTL) sends its whole presence
/// again when it comes back: its member that is still connected joins
/// again, and presence is the same on every node.
#[tokio::test]
async fn a_node_back_after_its_liveness_lapsed_sends_its_presence_again() {
    let Some(redis) = Redis::start_or_skip("presence resync").await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let a = node(&redis, &dir, 300).await;
    let b = node(&redis, &dir, 300).await;
    let (mut watcher, _) = a.subscribe("room:r", "presence=true").await;
    let (_bob, _) = b.subscribe("room:r", "client_id=bob").await;
    is_notice(&next_event(&mut watcher).await, "join", "room:r", "bob");
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &b.pid().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig}");
    };
    signal("-STOP");
    // B's key lives 10 s; A looks every 3 s: bob leaves within 13 s.
    let e = sse_event_within(&mut watcher, Duration::from_secs(30)).await;
    signal("-CONT");
    is_notice(&e, "leave", "room:r", "bob");
    // B's next beat finds its key lapsed and sends its presence again.
    let e = sse_event_within(&mut watcher, Duration::from_secs(20)).await;
    is_notice(&e, "join", "room:r", "bob");
    for s in [&a, &b] {
        let p = presence(s, "room:r").await;
        assert_eq!(p["occupancy"], 2, "the watcher and bob: {p}");
        assert_eq!(p["members"][0]["id"], "bob", "{p}");
        assert_eq!(p["members"][0]["connections"], 1, "{p}");
    }
}
