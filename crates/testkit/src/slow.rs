//! Raw SSE clients for the slow-reader and vanish tests (`slow_readers.rs`,
//! `vanish.rs`): a stream opened on a socket with a chosen receive buffer,
//! either as the connection's first request (served by the fan-out writer)
//! or after another request on the same keep-alive connection (served by
//! hyper), and a reader that reads at a set pace.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Timers short enough for a test to see a client kept or released in
/// seconds: heartbeat and keepalive 1 s, liveness bound 3 s.
pub const SHORT_TIMERS: &[&str] = &[
    "--heartbeat-ms",
    "1000",
    "--tcp-keepalive-ms",
    "1000",
    "--tcp-user-timeout-ms",
    "3000",
];

/// Whether the long versions run (`GAPLESS_LONG_TESTS=1`; `scripts/test.sh`
/// runs the short ones always).
pub fn long_tests() -> bool {
    std::env::var("GAPLESS_LONG_TESTS").is_ok_and(|v| v == "1")
}

/// Which writer serves a raw SSE stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// The connection's first request: the fan-out writer (`conn.rs`).
    First,
    /// A later request on a keep-alive connection: hyper.
    KeepAlive,
}

/// A socket to `addr` with a receive buffer of `rcvbuf` bytes (0: the
/// kernel's default, autotuned), bound to `from` if given.
pub async fn connect(addr: SocketAddr, rcvbuf: u32, from: Option<IpAddr>) -> TcpStream {
    let sock = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .expect("socket");
    if rcvbuf > 0 {
        sock.set_recv_buffer_size(rcvbuf).expect("SO_RCVBUF");
    }
    if let Some(ip) = from {
        sock.bind(SocketAddr::new(ip, 0)).expect("bind");
    }
    tokio::time::timeout(Duration::from_secs(10), sock.connect(addr))
        .await
        .expect("connect in time")
        .expect("connect")
}

/// Reads one response head from `tcp` (byte by byte: nothing after it is
/// consumed) and returns it.
pub async fn read_head(tcp: &mut TcpStream) -> String {
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
    String::from_utf8_lossy(&head).into_owned()
}

/// An SSE stream of `channel` (`query` appended to the URL, e.g.
/// `?last_event_id=…`, or empty) opened on a raw socket; returns once the
/// response head arrived. With [`Path::KeepAlive`] the connection first
/// carries `GET /healthz` and reads its whole answer.
pub async fn raw_sse(
    addr: SocketAddr,
    channel: &str,
    query: &str,
    rcvbuf: u32,
    path: Path,
    from: Option<IpAddr>,
) -> TcpStream {
    let mut tcp = connect(addr, rcvbuf, from).await;
    if path == Path::KeepAlive {
        tcp.write_all(b"GET /healthz HTTP/1.1\r\nhost: gapless\r\n\r\n")
            .await
            .expect("request");
        let head = read_head(&mut tcp).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(
            !head.to_ascii_lowercase().contains("connection: close"),
            "kept alive: {head}"
        );
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .expect("content-length");
        let mut body = vec![0u8; len];
        tcp.read_exact(&mut body).await.expect("body");
    }
    let req = format!("GET /v1/channels/{channel}/sse{query} HTTP/1.1\r\nhost: gapless\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.expect("request");
    let head = read_head(&mut tcp).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    tcp
}

/// Reads `tcp` at about `rate` bytes/s for `secs`, asserting it stays
/// open; returns what it read.
pub async fn read_slowly(tcp: &mut TcpStream, rate: usize, secs: u64) -> Vec<u8> {
    let mut got = Vec::new();
    let t0 = Instant::now();
    let mut chunk = vec![0u8; (rate / 4).max(1)];
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

/// Takes the whole chunks at the front of `raw` (chunked transfer coding)
/// and returns their payload; a partial chunk stays in `raw`.
pub fn dechunk(raw: &mut Vec<u8>) -> Vec<u8> {
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

/// Reads the rest of a chunked SSE stream (after `got`, bytes read
/// already) at full speed until `n` events arrived; returns the first
/// `prefix` bytes of each event's data, in order.
pub async fn read_events(
    tcp: &mut TcpStream,
    mut got: Vec<u8>,
    n: usize,
    prefix: usize,
) -> Vec<String> {
    let mut parser = gapless_client::sse::Parser::new();
    let mut events = Vec::new();
    let mut buf = vec![0u8; 65536];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let payload = dechunk(&mut got);
        parser
            .feed(&payload, |item| {
                if let gapless_client::sse::Item::Event(e) = item {
                    events.push(e.data[..prefix.min(e.data.len())].to_owned());
                }
            })
            .expect("within the limit");
        if events.len() >= n {
            return events;
        }
        assert!(Instant::now() < deadline, "{} events read", events.len());
        let r = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf))
            .await
            .expect("data in time")
            .expect("read");
        assert!(r > 0, "closed after {} events", events.len());
        got.extend_from_slice(&buf[..r]);
    }
}
