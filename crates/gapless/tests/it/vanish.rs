//! Vanished clients (issue 12, `docs/reliability.md`, "Vanished clients").
//!
//! The server runs in a network namespace of its own, reached from the test
//! over a veth pair (`gapless_testkit::netns`); a client "vanishes" when `iptables`
//! in the server's namespace drops every packet from its port, so no FIN or
//! RST ever arrives. Each arm measures how long until the server released
//! the subscriber (`subscribers` 0, or the session detached) and closed the
//! socket (no established connection left for the client's port). These
//! tests need root (`ip netns`) and `iptables` (`scripts/test.sh` installs
//! it); without either they print `SKIP` and pass.
//!
//! The short version, always run, uses shortened timers.
//! `GAPLESS_LONG_TESTS=1` runs every arm at the default settings (about 1
//! minute, the arms in parallel) and prints the measured times.
//! `GAPLESS_STALL_VANISH_MINUTES=N` runs the stalled arms at the defaults
//! with a stall of N minutes before the vanish (about N + 5 minutes).
//!
//! Slow readers that stay live are in `slow_readers.rs`.

use gapless_testkit::netns::{netns_or_skip, Netns, NsServer};
use gapless_testkit::slow::{long_tests, raw_sse, Path, SHORT_TIMERS};
use gapless_testkit::ws::RawWs;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Waits until `released` holds and the server no longer holds a
/// connection to `client`; returns the time since `t0`, or panics after `limit`.
async fn released<F, Fut>(
    what: &str,
    ns: &Netns,
    client: SocketAddr,
    t0: Instant,
    limit: Duration,
    mut released: F,
) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    loop {
        if released().await && !ns.holds(client) {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < limit,
            "{what}: still held {:?} after the client vanished",
            t0.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// An SSE subscriber that vanishes: its time until released.
async fn sse_arm(what: &str, ns: &Netns, s: &NsServer, channel: &str, limit: Duration) -> Duration {
    let tcp = raw_sse(s.addr, channel, "", 0, Path::First, None).await;
    gapless_testkit::eventually("subscribed", Duration::from_secs(10), || async {
        s.subscribers(channel).await == 1
    })
    .await;
    let client = tcp.local_addr().expect("addr");
    ns.vanish(client);
    let t0 = Instant::now();
    let took = released(what, ns, client, t0, limit, || async {
        s.subscribers(channel).await == 0
    })
    .await;
    drop(tcp);
    took
}

/// 4 MB of 60 KB events: more than a stalled client's window and the
/// server's send buffer, so the server's writes wait on the client.
const STALL_EVENTS: usize = 70;

/// How long a stalled client stays stalled before it vanishes: 2 s, or
/// `GAPLESS_STALL_VANISH_MINUTES` for [`stalled_for_minutes_then_vanished`].
fn stall() -> Duration {
    Duration::from_secs(2)
}

/// A client of an SSE stream (written by the fan-out writer, or by hyper on a
/// keep-alive connection) that stops reading (its window fills: the server's
/// write waits), stays so for `stall`, and then vanishes: its time until
/// released, from the vanish.
async fn stalled_arm(
    ns: &Netns,
    s: &NsServer,
    channel: &str,
    path: Path,
    stall: Duration,
    limit: Duration,
) -> Duration {
    let tcp = raw_sse(s.addr, channel, "", 4096, path, None).await;
    gapless_testkit::eventually("subscribed", Duration::from_secs(10), || async {
        s.subscribers(channel).await == 1
    })
    .await;
    let data = vec![b'z'; 60_000];
    for _ in 0..STALL_EVENTS {
        s.post(&format!("/v1/channels/{channel}/events"), data.clone())
            .await;
    }
    tokio::time::sleep(stall).await;
    assert_eq!(
        s.subscribers(channel).await,
        1,
        "a client that stopped reading ({path:?}) is kept while its TCP answers"
    );
    let client = tcp.local_addr().expect("addr");
    ns.vanish(client);
    let t0 = Instant::now();
    let took = released(
        &format!("stalled SSE ({path:?})"),
        ns,
        client,
        t0,
        limit,
        || async { s.subscribers(channel).await == 0 },
    )
    .await;
    drop(tcp);
    took
}

/// A session consumer that stops reading while 4 MB of events wait for it,
/// stays so for `stall`, then vanishes: its time until its session is detached.
async fn stalled_session_arm(
    ns: &Netns,
    s: &NsServer,
    id: &str,
    stall: Duration,
    limit: Duration,
) -> Duration {
    create_session(s, id).await;
    let raw =
        RawWs::connect_small_rcvbuf(s.addr, &format!("/v1/sessions/{id}/ws"), 4096, None).await;
    gapless_testkit::eventually("attached", Duration::from_secs(10), || async {
        s.get(&format!("/v1/sessions/{id}")).await["attached"] == true
    })
    .await;
    let data = vec![b'z'; 60_000];
    for _ in 0..STALL_EVENTS {
        s.post(&format!("/v1/sessions/{id}/events"), data.clone())
            .await;
    }
    tokio::time::sleep(stall).await;
    assert_eq!(
        s.get(&format!("/v1/sessions/{id}")).await["attached"],
        true,
        "a session consumer that stopped reading is kept while its TCP answers"
    );
    let client = raw.local_addr();
    ns.vanish(client);
    let t0 = Instant::now();
    let took = released(
        "stalled session consumer",
        ns,
        client,
        t0,
        limit,
        || async { s.get(&format!("/v1/sessions/{id}")).await["attached"] == false },
    )
    .await;
    drop(raw);
    took
}

/// A `/v1/ws` client that stops reading while the replies to its own
/// requests wait (300 publishes with 16 KB ids: 4.8 MB of `published`
/// replies, so the server waits to send a reply), stays so for `stall`, then
/// vanishes: its time until the server dropped the connection.
async fn stalled_replies_arm(
    ns: &Netns,
    s: &NsServer,
    channel: &str,
    stall: Duration,
    limit: Duration,
) -> Duration {
    let mut raw = RawWs::connect_small_rcvbuf(s.addr, "/v1/ws", 4096, None).await;
    let pad = ".".repeat(16_000);
    let mut written = 0;
    for i in 0..300 {
        let msg = serde_json::json!({"op": "publish", "id": format!("{i}{pad}"), "channel": channel, "data": "x"});
        // Once the server waits on a reply it stops reading: so does this.
        if !raw
            .try_write_frame(1, msg.to_string().as_bytes(), Duration::from_millis(500))
            .await
        {
            break;
        }
        written += 1;
    }
    assert!(written > 10, "{written} requests written");
    tokio::time::sleep(stall).await;
    let client = raw.local_addr();
    assert!(
        ns.holds(client),
        "a WebSocket client whose replies wait is kept while its TCP answers"
    );
    ns.vanish(client);
    let t0 = Instant::now();
    let took = released(
        "stalled WebSocket, replies waiting",
        ns,
        client,
        t0,
        limit,
        || async { true },
    )
    .await;
    drop(raw);
    took
}

/// A `/v1/ws` subscriber that vanishes.
async fn ws_arm(ns: &Netns, s: &NsServer, channel: &str, limit: Duration) -> Duration {
    let mut raw = RawWs::connect(s.addr, "/v1/ws").await;
    let sub = format!(r#"{{"op":"subscribe","id":1,"channel":"{channel}"}}"#);
    raw.write_frame(1, sub.as_bytes()).await;
    let reply = raw
        .read_frame(Duration::from_secs(10))
        .await
        .expect("open")
        .expect("a reply");
    assert_eq!(reply.opcode, 1);
    assert_eq!(s.subscribers(channel).await, 1);
    let client = raw.local_addr();
    ns.vanish(client);
    let t0 = Instant::now();
    let took = released("WebSocket", ns, client, t0, limit, || async {
        s.subscribers(channel).await == 0
    })
    .await;
    drop(raw);
    took
}

async fn create_session(s: &NsServer, id: &str) {
    let r = s
        .http
        .post(format!("http://{}/v1/sessions", s.addr))
        .json(&serde_json::json!({"id": id}))
        .send()
        .await
        .expect("create session");
    assert!(r.status().is_success(), "create session: {}", r.status());
}

/// A session consumer that vanishes: its session then counts as detached.
async fn session_arm(ns: &Netns, s: &NsServer, id: &str, limit: Duration) -> Duration {
    create_session(s, id).await;
    let raw = RawWs::connect(s.addr, &format!("/v1/sessions/{id}/ws")).await;
    gapless_testkit::eventually("attached", Duration::from_secs(10), || async {
        s.get(&format!("/v1/sessions/{id}")).await["attached"] == true
    })
    .await;
    let client = raw.local_addr();
    ns.vanish(client);
    let t0 = Instant::now();
    let took = released("session consumer", ns, client, t0, limit, || async {
        let v = s.get(&format!("/v1/sessions/{id}")).await;
        v["attached"] == false && v["status"] == "open"
    })
    .await;
    drop(raw);
    took
}

/// Always run: with short timers (bound 3 s), the heartbeated SSE arm, the
/// WebSocket arm, and every stalled arm (a client whose window is full on
/// each path a stream can take), released well within 20 s.
#[tokio::test]
async fn vanished_clients_are_released_short_timers() {
    let Some(ns) = netns_or_skip("vanished_clients_are_released_short_timers") else {
        return;
    };
    let s = NsServer::start(&ns, SHORT_TIMERS).await;
    let limit = Duration::from_secs(20);
    let (beat, ws, stalled, stalled_ka, stalled_session, stalled_replies) = tokio::join!(
        sse_arm("heartbeated SSE", &ns, &s, "beat", limit),
        ws_arm(&ns, &s, "ws", limit),
        stalled_arm(&ns, &s, "stalled", Path::First, stall(), limit),
        stalled_arm(&ns, &s, "stalled-ka", Path::KeepAlive, stall(), limit),
        stalled_session_arm(&ns, &s, "stalled-session", stall(), limit),
        stalled_replies_arm(&ns, &s, "replies", stall(), limit),
    );
    eprintln!(
        "short timers (heartbeat 1 s, keepalive 1 s, bound 3 s), released after the vanish:\n  \
         heartbeated SSE {beat:.1?}\n  WebSocket {ws:.1?}\n  stalled SSE (fan-out) {stalled:.1?}\n  \
         stalled SSE (keep-alive) {stalled_ka:.1?}\n  stalled session consumer {stalled_session:.1?}\n  \
         stalled WebSocket, replies waiting {stalled_replies:.1?}"
    );
    // The bound, plus a tick to notice it, plus slack for a busy machine.
    assert!(beat < Duration::from_secs(10), "{beat:?}");
    for t in [stalled, stalled_ka, stalled_session, stalled_replies] {
        assert!(t < Duration::from_secs(12), "{t:?}");
    }
    // Two heartbeat intervals, then up to 1 s for the close handshake
    // (5 s when a retransmission was taken for a full window).
    assert!(ws < Duration::from_millis(4500), "{ws:?}");
}

/// `GAPLESS_LONG_TESTS=1`: every arm at the default settings, within 60 s.
#[tokio::test]
async fn vanished_clients_are_released_within_60s_at_defaults() {
    if !long_tests() {
        eprintln!("SKIP vanished_clients_are_released_within_60s_at_defaults: set GAPLESS_LONG_TESTS=1 (takes about a minute)");
        return;
    }
    let Some(ns) = netns_or_skip("vanished_clients_are_released_within_60s_at_defaults") else {
        return;
    };
    let s = NsServer::start(&ns, &[]).await;
    let quiet = NsServer::start(&ns, &["--heartbeat-ms", "0"]).await;
    let limit = Duration::from_secs(60);
    let (beat, off, ws, session) = tokio::join!(
        sse_arm("heartbeated SSE", &ns, &s, "idle", limit),
        sse_arm("SSE, heartbeats off", &ns, &quiet, "quiet", limit),
        ws_arm(&ns, &s, "ws", limit),
        session_arm(&ns, &s, "vanish-session", limit),
    );
    let (stalled, stalled_ka, stalled_session, stalled_replies) = tokio::join!(
        stalled_arm(&ns, &s, "stalled", Path::First, stall(), limit),
        stalled_arm(&ns, &s, "stalled-ka", Path::KeepAlive, stall(), limit),
        stalled_session_arm(&ns, &s, "stalled-session", stall(), limit),
        stalled_replies_arm(&ns, &s, "replies", stall(), limit),
    );
    eprintln!(
        "released after the vanish, at the defaults:\n  idle SSE, heartbeats on   {beat:.1?}\n  \
         idle SSE, heartbeats off  {off:.1?}\n  WebSocket                 {ws:.1?}\n  \
         session consumer          {session:.1?}\n  stopped reading, vanished:\n    \
         SSE (fan-out)           {stalled:.1?}\n    SSE (keep-alive)        {stalled_ka:.1?}\n    \
         session consumer        {stalled_session:.1?}\n    WebSocket, replies      {stalled_replies:.1?}"
    );
}

/// `GAPLESS_STALL_VANISH_MINUTES=N`: clients that stopped reading for N
/// minutes (long enough for the kernel's window probes to back off to one
/// every 120 s) and then vanished, at the default settings, every path at
/// once. Prints the time until each was released; fails past 5 minutes.
#[tokio::test]
async fn stalled_for_minutes_then_vanished() {
    let Some(minutes) = std::env::var("GAPLESS_STALL_VANISH_MINUTES")
        .ok()
        .and_then(|m| m.parse::<u64>().ok())
    else {
        eprintln!("SKIP stalled_for_minutes_then_vanished: set GAPLESS_STALL_VANISH_MINUTES=N (takes N + up to 5 minutes)");
        return;
    };
    let Some(ns) = netns_or_skip("stalled_for_minutes_then_vanished") else {
        return;
    };
    let s = NsServer::start(&ns, &[]).await;
    let stall = Duration::from_secs(minutes * 60);
    let limit = Duration::from_secs(300);
    let (stalled, stalled_ka, stalled_session, stalled_replies, ()) = tokio::join!(
        stalled_arm(&ns, &s, "stalled", Path::First, stall, limit),
        stalled_arm(&ns, &s, "stalled-ka", Path::KeepAlive, stall, limit),
        stalled_session_arm(&ns, &s, "stalled-session", stall, limit),
        stalled_replies_arm(&ns, &s, "replies", stall, limit),
        async {
            // What the kernel does meanwhile: its window probes' back-off.
            tokio::time::sleep(stall.saturating_sub(Duration::from_secs(5))).await;
            let port = s.addr.port().to_string();
            let ss = ns
                .exec(
                    "ss",
                    &[
                        "-tinoH",
                        "state",
                        "established",
                        &format!("( sport = :{port} )"),
                    ],
                )
                .unwrap_or_default();
            eprintln!("before the vanish, `ss -tino` in the server's namespace:\n{ss}");
        },
    );
    eprintln!(
        "stopped reading for {minutes} min, then vanished; released after the vanish (defaults):\n    \
         SSE (fan-out)           {stalled:.1?}\n    SSE (keep-alive)        {stalled_ka:.1?}\n    \
         session consumer        {stalled_session:.1?}\n    WebSocket, replies      {stalled_replies:.1?}"
    );
}
