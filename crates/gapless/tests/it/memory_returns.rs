//! Memory returns (issue 12, `docs/reliability.md`, "Memory returns"): many
//! clients connect — SSE and `/v1/ws`, half of each resuming with a cursor —
//! then vanish, half with a FIN (the client closes its socket) and half
//! without one (every packet from their address is dropped in the server's
//! network namespace, so no FIN or RST ever arrives). The server must release
//! every subscriber (`gapless_subscribers` 0 on `/metrics`), close every
//! connection, and its resident memory (`VmRSS` of `/proc/PID/status`) must
//! return to within 10 % of what it was before the clients came.
//!
//! Always run: 400 clients, shortened liveness timers (`--heartbeat-ms 5000
//! --tcp-keepalive-ms 1000 --tcp-user-timeout-ms 3000`), about 20 s.
//! `GAPLESS_MEMORY_CLIENTS=10000` runs the full scenario (the same timers;
//! prints the figures recorded in `docs/reliability.md`). Needs root and
//! `iptables` like `vanish.rs`; prints `SKIP` and passes without them.

use gapless_testkit::netns::{netns_or_skip, NsServer};
use gapless_testkit::slow::{raw_sse, Path};
use gapless_testkit::ws::RawWs;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

/// Channels the clients spread over.
const CHANNELS: usize = 50;
/// Events published to each channel before the clients come; resuming
/// clients start after the 10th, so each is replayed 10.
const EVENTS: usize = 20;
/// The bound: resident memory after the clients left, over the baseline.
const SLACK: f64 = 0.10;
/// Clients of the warm-up round before the baseline is read.
const WARMUP: usize = 100;
/// Runs with at most this many clients use [`SHORT_TIMERS`]; larger ones
/// the default settings.
const SHORT_RUN_MAX: usize = 1000;
const SHORT_TIMERS: &[&str] = &[
    "--heartbeat-ms",
    "5000",
    "--tcp-keepalive-ms",
    "1000",
    "--tcp-user-timeout-ms",
    "3000",
];

/// The server's resident memory, from `/proc/PID/status`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// The server's RSS once it stops falling (the same for 5 s, or 40 s at
/// most), in KiB: freed pages go back within the allocator's decay time.
async fn settled_rss(pid: u32) -> u64 {
    let t0 = Instant::now();
    let (mut last, mut same) = (rss_kib(pid), 0);
    while same < 5 && t0.elapsed() < Duration::from_secs(40) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = rss_kib(pid);
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
    last
}

/// `gapless_subscribers` from `/metrics`.
async fn subscribers(s: &NsServer) -> u64 {
    let text = s.get_text("/metrics").await;
    text.lines()
        .find_map(|l| l.strip_prefix("gapless_subscribers "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or_else(
            || panic!("no gapless_subscribers in /metrics"),
            |v| v as u64,
        )
}

/// What a client is.
#[derive(Debug, Clone, Copy)]
struct Kind {
    ws: bool,
    resume: bool,
    /// Vanishes without a FIN (its address is dropped); otherwise closes.
    dropped: bool,
}

/// One client: where it connects from and to, and its signals.
struct Client {
    addr: std::net::SocketAddr,
    kind: Kind,
    channel: String,
    cursor: String,
    from: IpAddr,
    vanish: CancellationToken,
    end: CancellationToken,
}

/// Opens one client and keeps it live (reading, answering pings) until
/// `vanish`; then a FIN client closes, a dropped one goes silent and keeps
/// its socket until `end`. Sends on `ready` once subscribed.
async fn client(c: Client, ready: tokio::sync::mpsc::Sender<()>) {
    let Client {
        addr: s_addr,
        kind,
        channel,
        cursor,
        from,
        vanish,
        end,
    } = c;
    if kind.ws {
        let mut raw = RawWs::connect_small_rcvbuf(s_addr, "/v1/ws", 16384, Some(from)).await;
        let sub = if kind.resume {
            serde_json::json!({"op": "subscribe", "id": 1, "channel": channel, "cursor": cursor})
        } else {
            serde_json::json!({"op": "subscribe", "id": 1, "channel": channel})
        };
        raw.write_frame(1, sub.to_string().as_bytes()).await;
        loop {
            let f = raw
                .next_answering_pings(Duration::from_secs(30))
                .await
                .expect("open")
                .expect("subscribed in time");
            let v: serde_json::Value = serde_json::from_slice(&f.payload).expect("JSON");
            if v["op"] == "subscribed" {
                break;
            }
            assert_eq!(v["op"], "event", "{v}");
        }
        let _ = ready.send(()).await;
        tokio::select! {
            r = raw.next_answering_pings(Duration::from_secs(3600)) => panic!("a live WebSocket client got {r:?}"),
            () = vanish.cancelled() => {}
        }
        if kind.dropped {
            end.cancelled().await;
        }
        drop(raw);
    } else {
        let query = if kind.resume {
            format!("?last_event_id={cursor}")
        } else {
            String::new()
        };
        let mut tcp = raw_sse(s_addr, &channel, &query, 16384, Path::First, Some(from)).await;
        let _ = ready.send(()).await;
        let mut buf = vec![0u8; 4096];
        tokio::select! {
            () = async {
                loop {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => panic!("a live SSE client was closed"),
                        Ok(_) => {}
                    }
                }
            } => {}
            () = vanish.cancelled() => {}
        }
        if kind.dropped {
            end.cancelled().await;
        }
        drop(tcp);
    }
}

async fn memory_returns(clients: usize) {
    let Some(ns) = netns_or_skip("memory_returns") else {
        return;
    };
    // Each client is a socket here and one in the server (which raises its own limit).
    if let Err(e) = rlimit::increase_nofile_limit(u64::MAX) {
        eprintln!("could not raise RLIMIT_NOFILE: {e}");
    }
    let max_connections = (clients + 1000).to_string();
    let mut args = vec![
        "--max-connections-per-ip",
        "0",
        "--max-connections",
        &max_connections,
    ];
    // The short run uses short timers; the full run the defaults (a 15 s
    // heartbeat: thousands of clients on a busy machine may answer pings late).
    let timers = if clients <= SHORT_RUN_MAX {
        SHORT_TIMERS
    } else {
        &[]
    };
    args.extend_from_slice(timers);
    let s = NsServer::start(&ns, &args).await;
    let pid = s.pid();
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .expect("comm")
            .trim(),
        "gapless",
        "the pid is the server's"
    );
    // The channels and their events, and a cursor after the 10th of each.
    let mut cursors = Vec::new();
    for c in 0..CHANNELS {
        let mut cursor = String::new();
        for e in 0..EVENTS {
            let v = s
                .post(
                    &format!("/v1/channels/m{c}/events"),
                    format!("event {e}").into_bytes(),
                )
                .await;
            if e == 9 {
                cursor = v["cursor"].as_str().expect("cursor").to_owned();
            }
        }
        cursors.push(cursor);
    }
    let cold = rss_kib(pid);
    // A small warm-up round first: what the server allocates once, whatever
    // the number of clients (code paged in on first use, thread stacks, the
    // allocator's per-thread caches and metadata), is then in the baseline.
    let warmup: usize = std::env::var("GAPLESS_MEMORY_WARMUP")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(WARMUP);
    if warmup > 0 {
        round(&ns, &s, warmup, &cursors).await;
    }
    let baseline = settled_rss(pid).await;
    if std::env::var_os("GAPLESS_MEMORY_TRACE").is_some() {
        let _ = std::fs::copy(format!("/proc/{pid}/smaps"), "/tmp/gapless-smaps-baseline");
    }
    let rounds: usize = std::env::var("GAPLESS_MEMORY_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let trace = std::env::var_os("GAPLESS_MEMORY_TRACE").is_some();
    let bound = (baseline as f64 * (1.0 + SLACK)) as u64;
    let mib = |k: u64| k as f64 / 1024.0;
    let mut after = 0;
    for r in 0..rounds {
        let (connected_in, peak, released_in, t0) = round(&ns, &s, clients, &cursors).await;
        // Then the memory: freed pages go back to the system within the
        // allocator's decay time.
        after = settled_rss(pid).await;
        let waited = Instant::now();
        while (after > bound || trace) && waited.elapsed() < Duration::from_secs(60) {
            if trace {
                eprintln!("  {:.0?}: RSS {after} KiB", t0.elapsed());
            }
            // Requests keep the server's allocator busy, as a live server is.
            let _ = subscribers(&s).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            after = rss_kib(pid);
        }
        let returned_in = t0.elapsed();
        eprintln!(
            "memory_returns, round {}: {clients} clients (SSE and /v1/ws, half resuming; half closed with a FIN, half dropped), flags {timers:?}\n  \
             connected in {connected_in:.1?}\n  RSS at start {:.1} MiB, baseline (after a warm-up round of {warmup}) {:.1} MiB, with the clients {:.1} MiB ({:.1} KiB a client), \
             after they vanished {:.1} MiB ({:+.1} % of the baseline)\n  \
             subscribers 0 and connections closed {released_in:.1?} after the vanish; RSS measured {returned_in:.1?} after it",
            r + 1,
            mib(cold),
            mib(baseline),
            mib(peak),
            (peak.saturating_sub(baseline)) as f64 / clients as f64,
            mib(after),
            (after as f64 / baseline as f64 - 1.0) * 100.0,
        );
    }
    let subs = subscribers(&s).await;
    eprintln!("  gapless_subscribers after: {subs}");
    if trace {
        let _ = std::fs::copy(format!("/proc/{pid}/smaps"), "/tmp/gapless-smaps-after");
        // A clean exit, so `_RJEM_MALLOC_CONF=stats_print:true` prints the allocator's stats.
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    assert_eq!(subs, 0);
    assert!(
        after <= bound,
        "RSS {after} KiB after the clients vanished; baseline {baseline} KiB (bound {bound} KiB)"
    );
}

/// One round: `clients` connect, then vanish; returns how long they took
/// to connect, the server's RSS with them (KiB), how long until every
/// subscriber was released and every connection closed, and when they vanished.
async fn round(
    ns: &gapless_testkit::netns::Netns,
    s: &NsServer,
    clients: usize,
    cursors: &[String],
) -> (Duration, u64, Duration, Instant) {
    let vanish = CancellationToken::new();
    let end = CancellationToken::new();
    let (ready_tx, mut ready) = tokio::sync::mpsc::channel(1024);
    let gate = Arc::new(tokio::sync::Semaphore::new(128));
    let t_connect = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for i in 0..clients {
        let kind = Kind {
            ws: i % 2 == 1,
            resume: (i / 2) % 2 == 1,
            dropped: (i / 4) % 2 == 1,
        };
        let from = ns.client_ips[usize::from(kind.dropped)];
        let channel = format!("m{}", i % CHANNELS);
        let cursor = cursors[i % CHANNELS].clone();
        let c = Client {
            addr: s.addr,
            kind,
            channel,
            cursor,
            from,
            vanish: vanish.clone(),
            end: end.clone(),
        };
        let ready_tx = ready_tx.clone();
        let permit = gate.clone().acquire_owned().await.expect("gate");
        tasks.push(tokio::spawn(async move {
            let (tx, mut rx) = tokio::sync::mpsc::channel(1);
            let run = client(c, tx);
            tokio::pin!(run);
            // Hold the permit until connected and subscribed.
            tokio::select! {
                () = &mut run => {}
                _ = rx.recv() => {
                    drop(permit);
                    let _ = ready_tx.send(()).await;
                    run.await;
                }
            }
        }));
    }
    drop(ready_tx);
    for n in 0..clients {
        tokio::time::timeout(Duration::from_secs(120), ready.recv())
            .await
            .unwrap_or_else(|_| panic!("only {n} of {clients} clients connected"))
            .expect("a client task failed");
    }
    let connected_in = t_connect.elapsed();
    gapless_testkit::eventually(
        "every client counted as a subscriber",
        Duration::from_secs(60),
        || async { subscribers(s).await == clients as u64 },
    )
    .await;
    // Let the connections settle (replays written, heartbeats going).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let peak = rss_kib(s.pid());

    // Vanish: one rule drops the second address; the others close.
    ns.vanish_ip(ns.client_ips[1]);
    vanish.cancel();
    let t0 = Instant::now();
    let mut said = Instant::now();
    loop {
        let (subs, held) = (subscribers(s).await, ns.held(s.addr.port()));
        if subs == 0 && held == 0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{subs} subscribers and {held} connections left {:?} after the vanish",
            t0.elapsed()
        );
        if said.elapsed() > Duration::from_secs(5) {
            eprintln!(
                "  {:.0?} after the vanish: {subs} subscribers, {held} connections",
                t0.elapsed()
            );
            said = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let released_in = t0.elapsed();
    end.cancel();
    for t in tasks {
        t.await.expect("client task");
    }
    ns.unvanish_ip(ns.client_ips[1]);
    (connected_in, peak, released_in, t0)
}

/// Always run: 400 clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_returns_after_clients_vanish() {
    let clients = std::env::var("GAPLESS_MEMORY_CLIENTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(400);
    memory_returns(clients).await;
}
