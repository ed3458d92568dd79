//! Behind a reverse proxy (`--trusted-proxy`, docs/deploy.md): from a trusted
//! peer the per-IP cap counts each forwarded client's requests in flight,
//! whichever of the proxy's keep-alive connections carries them; an
//! untrusted peer's `X-Forwarded-For` is ignored; malformed headers fall back
//! to the proxy's own address; the refusal is logged once a minute per address.

use gapless_testkit::{Item, Next, Server, SseClient};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One answer read off a raw keep-alive connection.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

/// A raw HTTP/1.1 connection, as a proxy keeps one open to its upstream.
struct ProxyConn {
    tcp: TcpStream,
    buf: Vec<u8>,
}

impl ProxyConn {
    async fn open(s: &Server) -> ProxyConn {
        ProxyConn {
            tcp: TcpStream::connect(s.addr).await.expect("connect"),
            buf: Vec::new(),
        }
    }

    /// Sends `GET path` for the client `xff` (`X-Forwarded-For`).
    async fn send(&mut self, path: &str, xff: &str) {
        let req =
            format!("GET {path} HTTP/1.1\r\nHost: upstream\r\nX-Forwarded-For: {xff}\r\n\r\n");
        self.tcp.write_all(req.as_bytes()).await.expect("write");
    }

    async fn fill(&mut self) {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), self.tcp.read(&mut chunk))
            .await
            .expect("an answer in time")
            .expect("read");
        assert!(
            n > 0,
            "the connection closed: {}",
            String::from_utf8_lossy(&self.buf)
        );
        self.buf.extend_from_slice(&chunk[..n]);
    }

    /// Reads a response head.
    async fn head(&mut self) -> (u16, String) {
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                self.buf.drain(..end + 4);
                let status = head
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .expect("a status");
                return (status, head);
            }
            self.fill().await;
        }
    }

    /// Reads a whole answer whose body has a `content-length`.
    async fn answer(&mut self) -> Answer {
        let (status, head) = self.head().await;
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .unwrap_or_else(|| panic!("a content-length: {head}"));
        while self.buf.len() < len {
            self.fill().await;
        }
        let body = String::from_utf8_lossy(&self.buf[..len]).into_owned();
        self.buf.drain(..len);
        Answer { status, head, body }
    }

    /// Sends `GET path` for `xff` and reads the whole answer.
    async fn get(&mut self, path: &str, xff: &str) -> Answer {
        self.send(path, xff).await;
        self.answer().await
    }
}

fn sse_xff(xff: &str) -> Vec<(&'static str, Vec<u8>)> {
    vec![("X-Forwarded-For", xff.as_bytes().to_vec())]
}

/// An SSE stream opened as a connection's first request, for the client `xff`.
async fn stream_for(s: &Server, xff: &str) -> SseClient {
    let headers = sse_xff(xff);
    let h: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_slice())).collect();
    SseClient::connect(s.addr, "/v1/channels/c/sse", &h).await
}

/// Whether `c` is a refused stream: `retry:` and a comment naming the setting, then the end.
async fn is_refused(c: &mut SseClient) -> bool {
    let (items, end) = c.until_end(Duration::from_millis(1500)).await;
    let refused = matches!(end, Next::End)
        && items.iter().any(|i| matches!(i, Item::Retry(_)))
        && c.raw_text().contains("--max-connections-per-ip");
    refused
}

fn warnings(log: &str, client: &str) -> usize {
    log.lines()
        .filter(|l| {
            l.contains("WARN") && l.contains("--max-connections-per-ip") && l.contains(client)
        })
        .count()
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_cap_counts_each_forwarded_client() {
    let s = Server::memory(&[
        "--trusted-proxy",
        "127.0.0.1/32",
        "--max-connections-per-ip",
        "2",
    ])
    .await;
    // Two streams of one client reach the cap; a third is refused.
    let mut a1 = stream_for(&s, "203.0.113.1").await;
    let _a1 = a1.preamble().await;
    let mut a2 = stream_for(&s, "198.51.100.7, 203.0.113.1").await;
    let _a2 = a2.preamble().await;
    let mut a3 = stream_for(&s, "203.0.113.1").await;
    assert!(is_refused(&mut a3).await, "{}", a3.raw_text());
    // Other clients through the same proxy address are not capped with it:
    // their streams open, on the first-head path and on a keep-alive one.
    let mut b1 = stream_for(&s, "203.0.113.2").await;
    let _ = b1.preamble().await;
    let mut b2 = stream_for(&s, "[2001:db8::2]:4711").await;
    let _ = b2.preamble().await;
    let mut p = ProxyConn::open(&s).await;
    assert_eq!(p.get("/healthz", "203.0.113.3").await.status, 200);
    p.send("/v1/channels/c/sse", "203.0.113.3").await;
    let (status, head) = p.head().await;
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("text/event-stream"), "{head}");
    s.publish("c", "one").await;
    assert_eq!(b1.next_event().await.data, "one");

    // A request of the capped client on another keep-alive connection is
    // refused (503 limit_reached) and the connection stays open for the
    // proxy's other clients.
    let mut q = ProxyConn::open(&s).await;
    let r = q.get("/v1/channels/c/events", "203.0.113.1").await;
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.body.contains("limit_reached"), "{}", r.body);
    assert!(r.body.contains("--max-connections-per-ip"), "{}", r.body);
    assert!(
        !r.head.to_ascii_lowercase().contains("connection: close"),
        "{}",
        r.head
    );
    let r = q.get("/v1/channels/c/events", "203.0.113.9").await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Many clients' short requests in turn on one connection: none refused,
    // and the refused client's own requests pass again once a stream closes.
    for i in 0..20 {
        let r = q
            .get("/v1/channels/c/events", &format!("192.0.2.{i}"))
            .await;
        assert_eq!(r.status, 200, "client {i}: {}", r.body);
    }
    drop(a1);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while q.get("/v1/channels/c/events", "203.0.113.1").await.status != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the client's place was not freed when its stream closed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The refusals were counted, and logged once for the address.
    let metrics = s.get("/metrics").await.text;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("gapless_connections_refused_total{limit=\"per_ip\"}")),
        "{metrics}"
    );
    let log = s.log();
    assert_eq!(warnings(&log, "203.0.113.1"), 1, "{log}");
    assert!(log.contains("127.0.0.1"), "names the proxy: {log}");
}

#[tokio::test]
async fn a_websocket_through_the_proxy_holds_its_clients_place_until_it_closes() {
    let s = Server::memory(&[
        "--trusted-proxy",
        "127.0.0.1/32",
        "--max-connections-per-ip",
        "1",
    ])
    .await;
    let mut ws = ProxyConn::open(&s).await;
    // A keep-alive connection: a short request first, then the upgrade.
    assert_eq!(ws.get("/healthz", "203.0.113.5").await.status, 200);
    let upgrade = "GET /v1/ws HTTP/1.1\r\nHost: upstream\r\nX-Forwarded-For: 203.0.113.5\r\n\
                   Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
                   Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    ws.tcp.write_all(upgrade.as_bytes()).await.expect("write");
    let (status, head) = ws.head().await;
    assert_eq!(status, 101, "{head}");
    let mut other = ProxyConn::open(&s).await;
    let r = other.get("/v1/channels/c/events", "203.0.113.5").await;
    assert_eq!(
        r.status, 503,
        "the socket holds the client's place: {}",
        r.body
    );
    assert_eq!(
        other
            .get("/v1/channels/c/events", "203.0.113.6")
            .await
            .status,
        200
    );
    drop(ws);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while other
        .get("/v1/channels/c/events", "203.0.113.5")
        .await
        .status
        != 200
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the client's place was not freed when its socket closed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_per_ip_refusal_is_logged_once_a_minute_per_address() {
    let s = Server::memory(&["--max-connections-per-ip", "1"]).await;
    let (_held, _) = s.subscribe("c", "").await;
    for _ in 0..5 {
        let r = s.get("/v1/channels/c/events").await;
        r.expect_error(503, "limit_reached");
    }
    gapless_testkit::eventually("the warning is written", Duration::from_secs(5), || async {
        warnings(&s.log(), "127.0.0.1") >= 1
    })
    .await;
    let log = s.log();
    assert_eq!(warnings(&log, "127.0.0.1"), 1, "{log}");
    assert!(
        log.contains("--trusted-proxy"),
        "advises the proxy setting: {log}"
    );
}

#[tokio::test]
async fn an_untrusted_peers_forwarded_address_is_ignored() {
    let s = Server::memory(&[
        "--trusted-proxy",
        "10.0.0.0/8",
        "--max-connections-per-ip",
        "2",
    ])
    .await;
    let mut a = stream_for(&s, "203.0.113.1").await;
    let _ = a.preamble().await;
    let mut b = stream_for(&s, "203.0.113.2").await;
    let _ = b.preamble().await;
    // The peer (127.0.0.1) is not a trusted proxy: its header is the
    // client's own claim, and all three count as 127.0.0.1.
    let mut c = stream_for(&s, "203.0.113.3").await;
    assert!(is_refused(&mut c).await, "{}", c.raw_text());
    let log = s.log();
    assert_eq!(warnings(&log, "127.0.0.1"), 1, "{log}");
    assert_eq!(warnings(&log, "203.0.113"), 0, "{log}");
}

#[tokio::test]
async fn malformed_forwarded_headers_count_as_the_proxy() {
    let s = Server::memory(&[
        "--trusted-proxy",
        "127.0.0.1",
        "--max-connections-per-ip",
        "2",
    ])
    .await;
    // Not an address where the proxy's entry should be: the client is the
    // proxy itself (never the spoofable entries left of it).
    let mut a = stream_for(&s, "203.0.113.1, garbage").await;
    let _ = a.preamble().await;
    let mut b = stream_for(&s, "unknown").await;
    let _ = b.preamble().await;
    let mut c = stream_for(&s, "").await;
    assert!(is_refused(&mut c).await, "{}", c.raw_text());
    let headers: Vec<(&str, &[u8])> = vec![("X-Forwarded-For", b"\xff\xfe 1.2.3.4")];
    let mut d = SseClient::connect(s.addr, "/v1/channels/c/sse", &headers).await;
    assert!(is_refused(&mut d).await, "{}", d.raw_text());
    // A well-formed client is its own.
    let mut e = stream_for(&s, "garbage, 203.0.113.1").await;
    let _ = e.preamble().await;
    let publish = s
        .http
        .post(s.url("/v1/channels/c/events"))
        .header("x-forwarded-for", "192.0.2.50")
        .body("x");
    s.send(publish).await.expect(201);
    assert_eq!(e.next_event().await.data, "x");
}

#[tokio::test]
async fn forwarded_is_read_when_chosen_and_the_setting_comes_from_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("gapless.toml");
    std::fs::write(
        &file,
        "trusted_proxy = [\"127.0.0.0/8\"]\nforwarded_header = \"forwarded\"\nmax_connections_per_ip = 1\n",
    )
    .expect("write config");
    let s = Server::memory(&["--config", file.to_str().expect("path")]).await;
    let fwd = |v: &'static str| vec![("Forwarded", v.as_bytes())];
    let mut a = SseClient::connect(
        s.addr,
        "/v1/channels/c/sse",
        &fwd("for=192.0.2.60;proto=http"),
    )
    .await;
    let _ = a.preamble().await;
    let mut b = SseClient::connect(
        s.addr,
        "/v1/channels/c/sse",
        &fwd("for=\"[2001:db8:cafe::17]:4711\""),
    )
    .await;
    let _ = b.preamble().await;
    let mut c = SseClient::connect(s.addr, "/v1/channels/c/sse", &fwd("for=192.0.2.60")).await;
    assert!(is_refused(&mut c).await, "{}", c.raw_text());
    // X-Forwarded-For is not read with --forwarded-header forwarded.
    let xff = vec![("X-Forwarded-For", b"192.0.2.99".as_slice())];
    let mut d = SseClient::connect(s.addr, "/v1/channels/c/sse", &xff).await;
    let _ = d.preamble().await;
    let mut e = SseClient::connect(s.addr, "/v1/channels/c/sse", &xff).await;
    assert!(
        is_refused(&mut e).await,
        "counted as 127.0.0.1: {}",
        e.raw_text()
    );
}

#[tokio::test]
async fn a_bad_trusted_proxy_is_refused_at_start() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gapless"))
        .args(["serve", "--memory", "--trusted-proxy", "10.0.0.0/33"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("CIDR"), "{err}");
}

/// On a dual-stack socket (`--listen [::]:PORT`) an IPv4 peer arrives as
/// `::ffff:127.0.0.1`. `--trusted-proxy ::ffff:127.0.0.1` (the mapped
/// spelling) is the IPv4 address and matches that peer; without it, the
/// per-IP warning names the peer as `127.0.0.1`, the form `--trusted-proxy`
/// takes.
#[tokio::test]
async fn an_ipv4_mapped_trusted_proxy_matches_and_the_log_names_ipv4() {
    let dual = |args: &[&str]| gapless_testkit::Opts {
        args: args.iter().map(|s| s.to_string()).collect(),
        memory: true,
        listen: Some("[::]:0".to_owned()),
        ..gapless_testkit::Opts::default()
    };
    let mut s = Server::with(dual(&[
        "--trusted-proxy",
        "::ffff:127.0.0.1",
        "--max-connections-per-ip",
        "1",
    ]))
    .await;
    s.addr = std::net::SocketAddr::from(([127, 0, 0, 1], s.addr.port()));
    // Two clients through the proxy: each has its own place.
    let mut a = stream_for(&s, "203.0.113.1").await;
    let _ = a.preamble().await;
    let mut b = stream_for(&s, "203.0.113.2").await;
    let _ = b.preamble().await;
    s.publish("c", "one").await;
    assert_eq!(b.next_event().await.data, "one");
    // The same client twice is capped: the proxy is trusted, its header read.
    let mut a2 = stream_for(&s, "203.0.113.1").await;
    assert!(is_refused(&mut a2).await, "{}", a2.raw_text());

    let mut s = Server::with(dual(&["--max-connections-per-ip", "1"])).await;
    s.addr = std::net::SocketAddr::from(([127, 0, 0, 1], s.addr.port()));
    let (_held, _) = s.subscribe("c", "").await;
    s.get("/v1/channels/c/events")
        .await
        .expect_error(503, "limit_reached");
    gapless_testkit::eventually("the warning is written", Duration::from_secs(5), || async {
        warnings(&s.log(), "127.0.0.1") >= 1
    })
    .await;
    let log = s.log();
    assert!(!log.contains("::ffff:"), "the peer is named as IPv4: {log}");
}
