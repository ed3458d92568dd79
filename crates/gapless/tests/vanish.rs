//! Vanished clients and slow readers (issue 12, `docs/reliability.md`).
//!
//! Vanishing: the server runs in a network namespace of its own, reached
//! from the test over a veth pair; a client "vanishes" when `iptables` in
//! the server's namespace drops every packet from its port, so no FIN or RST
//! ever arrives. Each arm measures how long until the server released the
//! subscriber (`subscribers` 0, or the session detached) and closed the
//! socket (no established connection left for the client's port). These
//! tests need root (`ip netns`) and `iptables` (`scripts/test.sh` installs
//! it); without either they print `SKIP` and pass.
//!
//! `GAPLESS_LONG_TESTS=1` runs every arm at the default settings (about 1
//! minute, the arms in parallel) and prints the measured times; the short
//! version, always run, uses shortened timers.
//!
//! Slow readers run on loopback in the test's own namespace: a client that
//! reads 1 KB/s while 200 events of 60 KB are published keeps its stream.

mod support;
mod ws_support;

use serde_json::Value;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpSocket, TcpStream};
use tokio::process::{Child, Command};
use ws_support::RawWs;

fn long_tests() -> bool {
    std::env::var("GAPLESS_LONG_TESTS").is_ok_and(|v| v == "1")
}

/// Runs `cmd args`, returning stdout, or what went wrong.
fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A network namespace for the server, joined to the test's namespace by a
/// veth pair: the server at `server_ip`, the test at `client_ip`. Removed on drop.
struct Netns {
    name: String,
    host_if: String,
    server_ip: String,
}

impl Netns {
    fn create() -> Result<Netns, String> {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let name = format!("glv{pid}-{n}");
        let host_if = format!("glh{}{n}", pid % 100_000);
        let peer_if = format!("gls{}{n}", pid % 100_000);
        // 10.213.a.b/30 per namespace: a from the pid, b from the counter.
        let (a, b) = (pid % 250, (n % 60) * 4);
        let server_ip = format!("10.213.{a}.{}", b + 1);
        let client_ip = format!("10.213.{a}.{}", b + 2);
        run("ip", &["netns", "add", &name])?;
        let ns = Netns {
            name: name.clone(),
            host_if: host_if.clone(),
            server_ip: server_ip.clone(),
        };
        run(
            "ip",
            &[
                "link", "add", &host_if, "type", "veth", "peer", "name", &peer_if, "netns", &name,
            ],
        )?;
        run(
            "ip",
            &["addr", "add", &format!("{client_ip}/30"), "dev", &host_if],
        )?;
        run("ip", &["link", "set", &host_if, "up"])?;
        ns.exec(
            "ip",
            &["addr", "add", &format!("{server_ip}/30"), "dev", &peer_if],
        )?;
        ns.exec("ip", &["link", "set", &peer_if, "up"])?;
        ns.exec("ip", &["link", "set", "lo", "up"])?;
        ns.exec("iptables", &["-L", "INPUT", "-n"])?;
        Ok(ns)
    }

    fn exec(&self, cmd: &str, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["netns", "exec", &self.name, cmd];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Drops every packet the client at `client` sends to the server, from
    /// now on: to the server it vanished without a FIN or RST.
    fn vanish(&self, client: SocketAddr) {
        let port = client.port().to_string();
        let ip = client.ip().to_string();
        self.exec(
            "iptables",
            &[
                "-I", "INPUT", "-p", "tcp", "-s", &ip, "--sport", &port, "-j", "DROP",
            ],
        )
        .expect("iptables rule");
    }

    /// Whether the server still holds an open connection to `client`
    /// (established, or closed by the client and not yet by the server).
    fn holds(&self, client: SocketAddr) -> bool {
        let filter = format!("( dport = :{} )", client.port());
        let out = self
            .exec("ss", &["-tnH", "state", "established", &filter])
            .unwrap_or_default();
        let waiting = self
            .exec("ss", &["-tnH", "state", "close-wait", &filter])
            .unwrap_or_default();
        !out.trim().is_empty() || !waiting.trim().is_empty()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run("ip", &["netns", "del", &self.name]);
        let _ = run("ip", &["link", "del", &self.host_if]);
    }
}

/// A network namespace, or `None` after printing why the test is skipped.
fn netns_or_skip(test: &str) -> Option<Netns> {
    match Netns::create() {
        Ok(ns) => Some(ns),
        Err(e) => {
            eprintln!("SKIP {test}: cannot make a network namespace with iptables: {e}");
            None
        }
    }
}

/// `gapless serve --memory` inside `ns`, with `args`.
struct NsServer {
    child: Child,
    addr: SocketAddr,
    http: reqwest::Client,
}

impl NsServer {
    async fn start(ns: &Netns, args: &[&str]) -> NsServer {
        let listen = format!("{}:0", ns.server_ip);
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns.name, env!("CARGO_BIN_EXE_gapless")])
            .args(["serve", "--memory", "--listen", &listen])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(match std::env::var_os("GAPLESS_VANISH_LOG") {
                Some(path) => Stdio::from(std::fs::File::create(path).expect("log file")),
                None => Stdio::null(),
            })
            .kill_on_drop(true);
        for (k, _) in std::env::vars() {
            if k.starts_with("GAPLESS_") {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd.spawn().expect("spawn gapless in the namespace");
        let stdout = child.stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout);
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(15), lines.read_line(&mut line))
            .await
            .expect("gapless starts")
            .expect("reads its line");
        let addr: SocketAddr = line
            .strip_prefix("gapless listening on http://")
            .and_then(|r| r.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("listening line: {line:?}"));
        tokio::spawn(async move {
            let mut sink = Vec::new();
            let _ = lines.read_to_end(&mut sink).await;
        });
        NsServer {
            child,
            addr,
            http: reqwest::Client::new(),
        }
    }

    async fn get(&self, path: &str) -> Value {
        let r = self
            .http
            .get(format!("http://{}{path}", self.addr))
            .send()
            .await
            .expect("GET");
        r.json().await.expect("JSON")
    }

    async fn post(&self, path: &str, body: Vec<u8>) -> Value {
        let r = self
            .http
            .post(format!("http://{}{path}", self.addr))
            .body(body)
            .send()
            .await
            .expect("POST");
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json().await.expect("JSON")
    }

    async fn subscribers(&self, channel: &str) -> u64 {
        self.get(&format!("/v1/channels/{channel}")).await["subscribers"]
            .as_u64()
            .expect("subscribers")
    }
}

impl Drop for NsServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// An SSE stream opened with a raw socket (`rcvbuf`: its receive buffer,
/// 0 = the kernel's default); returns once the response head arrived.
async fn raw_sse(addr: SocketAddr, channel: &str, rcvbuf: u32) -> TcpStream {
    let sock = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .expect("socket");
    if rcvbuf > 0 {
        sock.set_recv_buffer_size(rcvbuf).expect("SO_RCVBUF");
    }
    let mut tcp = sock.connect(addr).await.expect("connect");
    let req = format!("GET /v1/channels/{channel}/sse HTTP/1.1\r\nhost: gapless\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.expect("request");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut byte))
            .await
            .expect("head in time")
            .expect("read");
        assert!(n > 0, "closed before the head");
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    tcp
}

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
    let tcp = raw_sse(s.addr, channel, 0).await;
    support::eventually("subscribed", Duration::from_secs(10), || async {
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

/// A client that stops reading (its window fills: the server's write
/// waits) and then vanishes: its time until released, from the vanish.
async fn stalled_arm(ns: &Netns, s: &NsServer, channel: &str, limit: Duration) -> Duration {
    let tcp = raw_sse(s.addr, channel, 4096).await;
    support::eventually("subscribed", Duration::from_secs(10), || async {
        s.subscribers(channel).await == 1
    })
    .await;
    // 4 MB: more than the client's window and the server's send buffer.
    let data = vec![b'z'; 60_000];
    for _ in 0..70 {
        s.post(&format!("/v1/channels/{channel}/events"), data.clone())
            .await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        s.subscribers(channel).await,
        1,
        "a client that stopped reading is kept while its TCP answers"
    );
    let client = tcp.local_addr().expect("addr");
    ns.vanish(client);
    let t0 = Instant::now();
    let took = released("stalled SSE", ns, client, t0, limit, || async {
        s.subscribers(channel).await == 0
    })
    .await;
    drop(tcp);
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

/// A session consumer that vanishes: its session then counts as detached.
async fn session_arm(ns: &Netns, s: &NsServer, id: &str, limit: Duration) -> Duration {
    s.http
        .post(format!("http://{}/v1/sessions", s.addr))
        .json(&serde_json::json!({"id": id}))
        .send()
        .await
        .expect("create session");
    let raw = RawWs::connect(s.addr, &format!("/v1/sessions/{id}/ws")).await;
    support::eventually("attached", Duration::from_secs(10), || async {
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

/// Always run: the heartbeated and the stalled arm with short timers.
#[tokio::test]
async fn vanished_clients_are_released_short_timers() {
    let Some(ns) = netns_or_skip("vanished_clients_are_released_short_timers") else {
        return;
    };
    let s = NsServer::start(
        &ns,
        &[
            "--heartbeat-ms",
            "1000",
            "--tcp-keepalive-ms",
            "1000",
            "--tcp-user-timeout-ms",
            "3000",
        ],
    )
    .await;
    let limit = Duration::from_secs(20);
    let (beat, stalled, ws) = tokio::join!(
        sse_arm("heartbeated SSE", &ns, &s, "beat", limit),
        stalled_arm(&ns, &s, "stalled", limit),
        ws_arm(&ns, &s, "ws", limit),
    );
    eprintln!("short timers (heartbeat 1 s, keepalive 1 s, bound 3 s): heartbeated SSE {beat:.1?}, stalled SSE {stalled:.1?}, WebSocket {ws:.1?}");
    // The bound, plus a heartbeat tick to notice it, plus slack for a busy machine.
    assert!(beat < Duration::from_secs(10), "{beat:?}");
    assert!(stalled < Duration::from_secs(12), "{stalled:?}");
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
    let (beat, off, ws, stalled, session) = tokio::join!(
        sse_arm("heartbeated SSE", &ns, &s, "idle", limit),
        sse_arm("SSE, heartbeats off", &ns, &quiet, "quiet", limit),
        ws_arm(&ns, &s, "ws", limit),
        stalled_arm(&ns, &s, "stalled", limit),
        session_arm(&ns, &s, "vanish-session", limit),
    );
    eprintln!(
        "released after the vanish, at the defaults:\n  idle SSE, heartbeats on   {beat:.1?}\n  idle SSE, heartbeats off  {off:.1?}\n  WebSocket                 {ws:.1?}\n  stopped reading, vanished {stalled:.1?}\n  session consumer          {session:.1?}"
    );
}

/// Reads `tcp` at about `rate` bytes/s for `secs`, asserting it stays
/// open; returns what it read.
async fn read_slowly(tcp: &mut TcpStream, rate: usize, secs: u64) -> Vec<u8> {
    let mut got = Vec::new();
    let t0 = Instant::now();
    let mut chunk = vec![0u8; rate / 4];
    while t0.elapsed() < Duration::from_secs(secs) {
        let n = match tcp.read(&mut chunk).await {
            Ok(0) => panic!("the server closed a slow reader after {:?}", t0.elapsed()),
            Ok(n) => n,
            Err(e) => panic!("a slow reader was cut after {:?}: {e}", t0.elapsed()),
        };
        got.extend_from_slice(&chunk[..n]);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    got
}

/// Publishes 200 events of 60 KB, reads at 1 KB/s for `secs`, then reads
/// the rest at full speed: every event arrives, once and in order.
async fn slow_reader_kept(args: &[&str], secs: u64) {
    let s = support::Server::memory(args).await;
    let mut tcp = raw_sse(s.addr, "slow", 0).await;
    support::eventually("subscribed", Duration::from_secs(10), || async {
        s.info("slow").await["subscribers"] == 1
    })
    .await;
    let publisher = {
        let url = s.url("/v1/channels/slow/events");
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            for i in 0..200u32 {
                let mut data = format!("{i:05}").into_bytes();
                data.resize(60_000, b'.');
                let r = http.post(&url).body(data).send().await.expect("publish");
                assert!(r.status().is_success());
            }
        })
    };
    let mut got = read_slowly(&mut tcp, 1024, secs).await;
    publisher.await.expect("published");
    assert_eq!(
        s.info("slow").await["subscribers"],
        1,
        "the slow reader is still subscribed"
    );
    // Then read fast to the last event.
    let mut parser = gapless_client::sse::Parser::new();
    let mut events = Vec::new();
    let mut feed = |bytes: &[u8], events: &mut Vec<String>| {
        parser
            .feed(bytes, |item| {
                if let gapless_client::sse::Item::Event(e) = item {
                    events.push(e.data[..5].to_owned());
                }
            })
            .expect("within the limit");
    };
    // The body is chunked: parse the chunks' payload.
    let mut buf = [0u8; 65536];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let dechunked = dechunk(&mut got);
        feed(&dechunked, &mut events);
        if events.len() >= 200 {
            break;
        }
        assert!(Instant::now() < deadline, "{} events read", events.len());
        let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf))
            .await
            .expect("data in time")
            .expect("read");
        assert!(n > 0, "closed after {} events", events.len());
        got.extend_from_slice(&buf[..n]);
    }
    let want: Vec<String> = (0..200).map(|i| format!("{i:05}")).collect();
    assert_eq!(events, want, "every event once, in order");
}

/// Takes the whole chunks at the front of `raw` (chunked transfer coding)
/// and returns their payload; a partial chunk stays in `raw`.
fn dechunk(raw: &mut Vec<u8>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(eol) = raw[at..].windows(2).position(|w| w == b"\r\n") {
        let size_line = std::str::from_utf8(&raw[at..at + eol]).expect("size line");
        let size = usize::from_str_radix(size_line.trim(), 16).expect("hex size");
        let start = at + eol + 2;
        if raw.len() < start + size + 2 {
            break;
        }
        out.extend_from_slice(&raw[start..start + size]);
        at = start + size + 2;
    }
    raw.drain(..at);
    out
}

/// Regression (issue 12): with `TCP_USER_TIMEOUT` alone, a client reading
/// 1 KB/s had its connection reset one user timeout after the server began
/// probing its full window. Short timers: a 3 s bound, read slowly for 12 s.
#[tokio::test]
async fn a_slow_reader_is_kept_short_timers() {
    slow_reader_kept(
        &[
            "--heartbeat-ms",
            "1000",
            "--tcp-keepalive-ms",
            "1000",
            "--tcp-user-timeout-ms",
            "3000",
        ],
        12,
    )
    .await;
}

/// `GAPLESS_LONG_TESTS=1`: the same at the defaults, reading slowly for 90 s
/// (three times the 30 s bound).
#[tokio::test]
async fn a_slow_reader_is_kept_at_defaults() {
    if !long_tests() {
        eprintln!("SKIP a_slow_reader_is_kept_at_defaults: set GAPLESS_LONG_TESTS=1 (takes 90 s)");
        return;
    }
    slow_reader_kept(&[], 90).await;
}

/// The same for a `/v1/ws` subscriber (a tungstenite client, which answers
/// pings when it reads them): it reads one 60 KB event every 4 s, longer than
/// the 3 s bound, so its window stays full; its pongs wait behind unread data.
#[tokio::test]
async fn a_slow_websocket_reader_is_kept_short_timers() {
    let s = support::Server::memory(&[
        "--heartbeat-ms",
        "1000",
        "--tcp-keepalive-ms",
        "1000",
        "--tcp-user-timeout-ms",
        "3000",
    ])
    .await;
    let mut ws = ws_support::Ws::connect_small_rcvbuf(s.addr, "/v1/ws", 4096).await;
    ws.subscribe_live("wslow").await;
    let url = s.url("/v1/channels/wslow/events");
    let publisher = tokio::spawn(async move {
        let http = reqwest::Client::new();
        for i in 0..200u32 {
            let mut data = format!("{i:05}").into_bytes();
            data.resize(60_000, b'.');
            let r = http.post(&url).body(data).send().await.expect("publish");
            assert!(r.status().is_success());
        }
    });
    let mut got = Vec::new();
    let next = |msg: Option<ws_support::Msg>, got: &mut Vec<String>| match msg {
        Some(ws_support::Msg::Json(v)) if v["op"] == "event" => {
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
    let want: Vec<String> = (0..200).map(|i| format!("{i:05}")).collect();
    assert_eq!(got, want, "every event once, in order");
}
