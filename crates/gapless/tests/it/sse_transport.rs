//! How SSE streams reach the socket (crates/server/src/net/conn.rs): a stream
//! opened by a connection's first request is written straight to the socket
//! (chunked for HTTP/1.1, to the close for HTTP/1.0, `connection: close`
//! either way); a stream opened by a later request on a keep-alive connection
//! is served by hyper; errors on SSE URLs are whole JSON answers; a client
//! that closes its stream stops counting as a subscriber at once; clients
//! that send junk or stop reading cannot stall other streams or shutdown.

use gapless_testkit::{eventually, ConnectOptions, Next, Server, SseClient};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(5);

/// Reads from `tcp` into `buf` until `buf` contains `needle` (panics after [`WAIT`]).
async fn read_until(tcp: &mut TcpStream, buf: &mut Vec<u8>, needle: &str) {
    let found = tokio::time::timeout(WAIT, async {
        while !String::from_utf8_lossy(buf).contains(needle) {
            let mut tmp = [0u8; 4096];
            let n = tcp.read(&mut tmp).await.expect("read");
            assert!(
                n > 0,
                "EOF before {needle:?}; got {:?}",
                String::from_utf8_lossy(buf)
            );
            buf.extend_from_slice(&tmp[..n]);
        }
    })
    .await;
    assert!(
        found.is_ok(),
        "no {needle:?} within {WAIT:?}; got {:?}",
        String::from_utf8_lossy(buf)
    );
}

/// Reads until EOF (panics after [`WAIT`]).
async fn read_to_eof(tcp: &mut TcpStream, buf: &mut Vec<u8>) {
    tokio::time::timeout(WAIT, tcp.read_to_end(buf))
        .await
        .expect("EOF in time")
        .expect("read");
}

fn head_of(buf: &[u8]) -> String {
    let text = String::from_utf8_lossy(buf).into_owned();
    let end = text.find("\r\n\r\n").expect("a whole head");
    text[..end].to_ascii_lowercase()
}

#[tokio::test]
async fn a_first_request_stream_is_chunked_with_connection_close_and_ends_with_the_last_chunk() {
    let mut s = Server::start(&[]).await;
    s.publish("c", "one").await;
    let mut c = s
        .sse(
            "/v1/channels/c/sse?since=earliest",
            &[("origin", b"https://a.example")],
        )
        .await;
    assert_eq!(c.status, 200);
    // Middleware runs as for any request: CORS headers are there.
    assert_eq!(c.header("access-control-allow-origin"), Some("*"));
    assert_eq!(c.header("transfer-encoding"), Some("chunked"));
    assert_eq!(c.header("connection"), Some("close"));
    assert_eq!(c.header("content-type"), Some("text/event-stream"));
    assert_eq!(c.header("content-length"), None);
    let got = c.events(1).await;
    assert_eq!(got[0].data, "one");
    s.publish("c", "two").await;
    assert_eq!(c.events(1).await[0].data, "two");
    // SIGTERM ends the body with its last chunk: a clean end, not a broken one.
    s.sigterm().await;
    let (_, end) = c.until_end(WAIT).await;
    assert_eq!(end, Next::End);
}

#[tokio::test]
async fn an_http_1_0_stream_has_no_chunks_and_runs_to_the_close() {
    let s = Server::memory(&[]).await;
    let mut tcp = TcpStream::connect(s.addr).await.expect("connect");
    tcp.write_all(b"GET /v1/channels/c/sse HTTP/1.0\r\n\r\n")
        .await
        .expect("write");
    let mut buf = Vec::new();
    read_until(&mut tcp, &mut buf, "\r\n\r\nretry:").await;
    let head = head_of(&buf);
    assert!(head.starts_with("http/1.1 200 ok"), "{head}");
    assert!(!head.contains("transfer-encoding"), "{head}");
    assert!(!head.contains("content-length"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    read_until(&mut tcp, &mut buf, "\nid:").await;
    s.publish("c", "plain bytes").await;
    read_until(&mut tcp, &mut buf, "data: plain bytes\n\n").await;
    let body = String::from_utf8_lossy(&buf).into_owned();
    let body = &body[body.find("\r\n\r\n").expect("head") + 4..];
    assert!(
        !body.contains("\r\n"),
        "no chunk framing in the body: {body:?}"
    );
}

#[tokio::test]
async fn a_stream_opened_after_another_request_on_the_connection_is_served_too() {
    let s = Server::memory(&[]).await;
    let mut tcp = TcpStream::connect(s.addr).await.expect("connect");
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut buf = Vec::new();
    read_until(&mut tcp, &mut buf, "\"ok\"}").await;
    assert!(head_of(&buf).starts_with("http/1.1 200"));
    buf.clear();
    tcp.write_all(b"GET /v1/channels/c/sse HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    read_until(&mut tcp, &mut buf, "\nid:").await;
    let head = head_of(&buf);
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    s.publish("c", "over keep-alive").await;
    read_until(&mut tcp, &mut buf, "data: over keep-alive\n\n").await;
}

#[tokio::test]
async fn an_error_on_an_sse_url_is_whole_json_then_the_connection_closes() {
    let s = Server::memory(&[]).await;
    for (target, status, code) in [
        ("/v1/sse", "400", "invalid_request"),
        ("/v1/channels/c/sse?format=xml", "400", "invalid_request"),
        ("/v1/channels/%2F/sse", "400", "invalid_channel"),
        (
            "/v1/channels/c/sse?last_event_id=%25%25",
            "400",
            "invalid_cursor",
        ),
    ] {
        let mut tcp = TcpStream::connect(s.addr).await.expect("connect");
        tcp.write_all(format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .expect("write");
        let mut buf = Vec::new();
        read_to_eof(&mut tcp, &mut buf).await;
        let head = head_of(&buf);
        assert!(
            head.starts_with(&format!("http/1.1 {status}")),
            "{target}: {head}"
        );
        assert!(
            head.contains("content-type: application/json"),
            "{target}: {head}"
        );
        assert!(head.contains("connection: close"), "{target}: {head}");
        let text = String::from_utf8_lossy(&buf).into_owned();
        let body = &text[text.find("\r\n\r\n").expect("head") + 4..];
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .expect("content-length")
            .parse()
            .expect("a number");
        assert_eq!(body.len(), length, "{target}");
        let json: serde_json::Value = serde_json::from_str(body).expect("JSON body");
        assert_eq!(json["error"], code, "{target}: {json}");
    }
}

#[tokio::test]
async fn bytes_sent_after_the_request_are_ignored_and_the_stream_goes_on() {
    let s = Server::memory(&[]).await;
    let mut tcp = TcpStream::connect(s.addr).await.expect("connect");
    tcp.write_all(
        b"GET /v1/channels/c/sse HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n",
    )
    .await
    .expect("write");
    let mut buf = Vec::new();
    read_until(&mut tcp, &mut buf, "\nid:").await;
    tcp.write_all(&[0xff; 10_000]).await.expect("write");
    s.publish("c", "still here").await;
    read_until(&mut tcp, &mut buf, "data: still here\n\n").await;
    assert!(!String::from_utf8_lossy(&buf).contains("\"ok\""));
}

#[tokio::test]
async fn closing_a_stream_releases_its_subscriber_at_once_not_at_the_next_heartbeat() {
    let s = Server::memory(&["--heartbeat-ms", "600000"]).await;
    let c = s.sse("/v1/channels/c/sse", &[]).await;
    assert_eq!(c.status, 200);
    eventually("one subscriber", WAIT, || async {
        s.info("c").await["subscribers"] == 1
    })
    .await;
    drop(c);
    eventually(
        "no subscriber soon after the close",
        Duration::from_secs(2),
        || async { s.info("c").await["subscribers"] == 0 },
    )
    .await;
}

#[tokio::test]
async fn clients_sending_junk_after_their_request_do_not_stall_other_streams() {
    let s = Server::memory(&[]).await;
    // More blasters than fan-out threads: each would hold one if it were read without end.
    let mut blasters = Vec::new();
    for i in 0..4 {
        let mut tcp = TcpStream::connect(s.addr).await.expect("connect");
        tcp.write_all(
            format!("GET /v1/channels/junk{i}/sse HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        )
        .await
        .expect("write");
        blasters.push(tokio::spawn(async move {
            let chunk = vec![b'x'; 64 * 1024];
            // Ends when the server stops reading (the write then waits) or on abort.
            while tcp.write_all(&chunk).await.is_ok() {}
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut c = s.sse("/v1/channels/quiet/sse", &[]).await;
    assert_eq!(c.status, 200);
    let t0 = std::time::Instant::now();
    s.publish("quiet", "through").await;
    let got = tokio::time::timeout(Duration::from_secs(2), c.events(1))
        .await
        .expect("delivered while the junk senders are still at it");
    assert_eq!(got[0].data, "through");
    assert!(t0.elapsed() < Duration::from_secs(2));
    for b in &blasters {
        assert!(
            !b.is_finished(),
            "a junk sender stopped early: the test proves nothing"
        );
    }
    for b in blasters {
        b.abort();
    }
}

#[tokio::test]
async fn sigterm_is_prompt_with_an_idle_connection_and_a_reader_that_stopped_reading() {
    let mut s = Server::start(&[]).await;
    // A connection that never sends a request head.
    let _idle = TcpStream::connect(s.addr).await.expect("connect");
    // A stream whose client stops reading, with megabytes waiting for it.
    let mut stuck = SseClient::connect_with(
        s.addr,
        "/v1/channels/big/sse",
        &[],
        ConnectOptions {
            recv_buffer: Some(4096),
        },
    )
    .await;
    assert_eq!(stuck.status, 200);
    let _ = stuck.events(0).await;
    let blob = "y".repeat(512 * 1024);
    for _ in 0..8 {
        s.publish("big", &blob).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, took) = s.sigterm().await;
    assert!(
        status.success(),
        "exit status {status:?}; log:\n{}",
        s.log()
    );
    assert!(
        took < Duration::from_secs(2),
        "exit took {took:?}; log:\n{}",
        s.log()
    );
    assert!(!s.log().contains("panicked"), "log:\n{}", s.log());
}

#[tokio::test]
async fn a_channel_named_sse_is_not_mistaken_for_a_stream_url() {
    let s = Server::memory(&[]).await;
    s.publish("sse", "x").await;
    let mut tcp = TcpStream::connect(s.addr).await.expect("connect");
    let mut buf = Vec::new();
    for _ in 0..2 {
        // Two requests on one connection: the first answer keeps it open.
        buf.clear();
        tcp.write_all(b"GET /v1/channels/sse HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        read_until(&mut tcp, &mut buf, "\"head\"").await;
        let head = head_of(&buf);
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(!head.contains("connection: close"), "{head}");
        read_until(&mut tcp, &mut buf, "}").await;
    }
}

#[tokio::test]
async fn streams_and_answers_written_here_carry_a_date() {
    let s = Server::memory(&[]).await;
    let c = s.sse("/v1/channels/c/sse", &[]).await;
    let date = c.header("date").expect("a date header");
    assert!(date.ends_with(" GMT"), "{date}");
    let mut tcp = TcpStream::connect(s.addr).await.expect("connect");
    tcp.write_all(b"GET /v1/sse HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut buf = Vec::new();
    read_to_eof(&mut tcp, &mut buf).await;
    assert!(head_of(&buf).contains("\r\ndate: "), "{}", head_of(&buf));
}

#[tokio::test]
async fn a_malformed_first_request_head_gets_a_json_400_saying_what_is_wrong() {
    let s = Server::memory(&[]).await;
    for (head, says) in [
        (
            &b"GET /healthz HTTP/1.1\r\nBad Header\r\n\r\n"[..],
            "header name",
        ),
        (
            b"GET /healthz HTTP/1.1\r\nx: a\x01b\r\n\r\n",
            "header value",
        ),
        (b"GET /healthz HTTP/9.9\r\n\r\n", "version"),
        (b"GET /he\x7flthz HTTP/1.1\r\n\r\n", "request target"),
        // The parser reads METHOD as the target and / as the version; the
        // answer names the real fault, not "invalid HTTP version".
        (b"BAD METHOD / HTTP/1.1\r\n\r\n", "has 4 words"),
        (b"GET /a b HTTP/1.1\r\n\r\n", "%20"),
        (
            b"G(T / HTTP/1.1\r\n\r\n",
            "the method \"G(T\" is not a token",
        ),
        (b"GET  /healthz HTTP/1.1\r\n\r\n", "two spaces"),
        (
            b"GET /healthz http/1.1\r\n\r\n",
            "HTTP version \"http/1.1\"",
        ),
    ] {
        let mut tcp = TcpStream::connect(s.addr).await.expect("connect");
        tcp.write_all(head).await.expect("write");
        let mut buf = Vec::new();
        read_to_eof(&mut tcp, &mut buf).await;
        let text = String::from_utf8_lossy(&buf).into_owned();
        assert!(text.starts_with("HTTP/1.1 400 "), "{head:?}: {text}");
        let body = &text[text.find("\r\n\r\n").expect("head") + 4..];
        let json: serde_json::Value = serde_json::from_str(body).expect("JSON body");
        assert_eq!(json["error"], "invalid_request", "{json}");
        let message = json["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{head:?}: {message}");
    }
    // A method that is a token but unknown, or in lower case, is well formed:
    // 405 naming it, with a word on case for `get`.
    for (line, says) in [
        ("FOO /healthz HTTP/1.1", "FOO is not allowed on /healthz"),
        ("get /healthz HTTP/1.1", "case-sensitive: GET, not get"),
        (
            "get /v1/channels/c/sse HTTP/1.1",
            "case-sensitive: GET, not get",
        ),
    ] {
        let mut tcp = TcpStream::connect(s.addr).await.expect("connect");
        tcp.write_all(format!("{line}\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
            .await
            .expect("write");
        let mut buf = Vec::new();
        read_to_eof(&mut tcp, &mut buf).await;
        let text = String::from_utf8_lossy(&buf).into_owned();
        assert!(text.starts_with("HTTP/1.1 405 "), "{line}: {text}");
        assert!(text.contains(says), "{line}: {text}");
    }
    // The server is fine afterwards.
    assert_eq!(s.get("/healthz").await.status, 200);
}

/// Sends `bytes` on a new connection and reads the answer to the close.
async fn exchange(s: &Server, bytes: &[u8]) -> String {
    let mut tcp = TcpStream::connect(s.addr).await.expect("connect");
    tcp.write_all(bytes).await.expect("write");
    let mut buf = Vec::new();
    read_to_eof(&mut tcp, &mut buf).await;
    String::from_utf8_lossy(&buf).into_owned()
}

#[tokio::test]
async fn a_first_head_whose_body_length_cannot_be_determined_gets_a_json_400_naming_it() {
    let s = Server::memory(&[]).await;
    let publish = "POST /v1/channels/c/events HTTP/1.1\r\nHost: x\r\n";
    for (head, says) in [
        (
            format!("{publish}Content-Length: 2\r\nContent-Length: 3\r\n\r\nabc"),
            "Content-Length is given twice with different values, \"2\" and \"3\"",
        ),
        (
            format!("{publish}Content-Length: -1\r\n\r\nab"),
            "the Content-Length \"-1\" is not a number of bytes",
        ),
        (
            format!("{publish}Content-Length: 2, 2\r\n\r\nab"),
            "the Content-Length \"2, 2\" is not a number of bytes",
        ),
        (
            format!("{publish}Transfer-Encoding: gzip\r\n\r\nab"),
            "the Transfer-Encoding \"gzip\" does not end with chunked",
        ),
        (
            format!("{publish}Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n"),
            "the Transfer-Encoding \"gzip\" does not end with chunked",
        ),
        (
            "POST /v1/channels/c/events HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n"
                .to_owned(),
            "in an HTTP/1.0 request",
        ),
        // On an SSE URL (whose first request this server serves itself) too.
        (
            "GET /v1/channels/c/sse HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n".to_owned(),
            "does not end with chunked",
        ),
        (
            "GET /v1/sse?channel=c HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx"
                .to_owned(),
            "given twice with different values",
        ),
        (
            "GET http:// HTTP/1.1\r\n\r\n".to_owned(),
            "the request target \"http://\" is not a URI",
        ),
    ] {
        let text = exchange(&s, head.as_bytes()).await;
        assert!(text.starts_with("HTTP/1.1 400 "), "{head:?}: {text}");
        assert!(
            head_of(text.as_bytes()).contains("\r\nconnection: close"),
            "{head:?}: the connection is closed (RFC 9112 section 6.3): {text}"
        );
        let body = &text[text.find("\r\n\r\n").expect("head") + 4..];
        let json: serde_json::Value = serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("{head:?}: a JSON body ({e}): {text}"));
        assert_eq!(json["error"], "invalid_request", "{json}");
        let message = json["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{head:?}: {message}");
        assert!(message.contains("RFC 91"), "{head:?}: {message}");
    }
    assert_eq!(s.info("c").await["head"], 0, "nothing was appended");
    // A length given twice with one value is a length (RFC 9110 section 8.6).
    let text = exchange(
        &s,
        format!("{publish}Content-Length: 2\r\nContent-Length: 2\r\nConnection: close\r\n\r\nab")
            .as_bytes(),
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 201 "), "{text}");
    // A later request on a keep-alive connection is read by the HTTP layer:
    // the bare 400 docs/api.md describes.
    let text = exchange(
        &s,
        format!(
            "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n\
             {publish}Content-Length: 2\r\nContent-Length: 3\r\n\r\nabc"
        )
        .as_bytes(),
    )
    .await;
    let later = &text[text.find("{\"status\":\"ok\"}").expect("the first answer")..];
    assert!(later.contains("HTTP/1.1 400 "), "{text}");
    assert!(!later.contains("invalid_request"), "{text}");
    assert_eq!(s.info("c").await["head"], 1);
}

#[tokio::test]
async fn heads_up_to_max_header_bytes_are_served_and_longer_ones_get_431() {
    let s = Server::memory(&[]).await;
    // 13 KiB: under the 16 KiB default, served (a stream, by the fan-out writer).
    let mut tcp = TcpStream::connect(s.addr).await.expect("connect");
    let filler = "f".repeat(13 * 1024);
    tcp.write_all(
        format!("GET /v1/channels/c/sse HTTP/1.1\r\nHost: x\r\nX-Filler: {filler}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .expect("write");
    let mut buf = Vec::new();
    read_until(&mut tcp, &mut buf, "\nid:").await;
    let head = head_of(&buf);
    assert!(head.starts_with("http/1.1 200"), "{head}");
    s.publish("c", "long head").await;
    read_until(&mut tcp, &mut buf, "data: long head\n\n").await;

    // Over it, on the first request of a connection (stream or not): 431 JSON naming the flag.
    for (what, head) in [
        (
            "a 17 KiB stream head",
            format!(
                "GET /v1/channels/c/sse HTTP/1.1\r\nX-Filler: {}\r\n\r\n",
                "f".repeat(17 * 1024)
            ),
        ),
        (
            "a 400 KiB publish head",
            format!(
                "POST /v1/channels/c/events HTTP/1.1\r\nX-Filler: {}\r\n\r\n",
                "f".repeat(400 * 1024)
            ),
        ),
        (
            "101 header lines",
            format!("GET /healthz HTTP/1.1\r\n{}\r\n", "x-h: 1\r\n".repeat(101)),
        ),
    ] {
        let mut tcp = TcpStream::connect(s.addr).await.expect("connect");
        let _ = tcp.write_all(head.as_bytes()).await;
        let mut buf = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut buf)).await;
        let text = String::from_utf8_lossy(&buf).to_string();
        assert!(text.starts_with("HTTP/1.1 431"), "{what}: {text}");
        assert!(
            text.contains("head_too_large") && text.contains("--max-header-bytes"),
            "{what}: {text}"
        );
    }

    // A later request on a keep-alive connection is read by the HTTP layer with the same limit.
    let mut tcp = TcpStream::connect(s.addr).await.expect("connect");
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut buf = Vec::new();
    read_until(&mut tcp, &mut buf, "\"ok\"").await;
    let second = format!(
        "GET /healthz HTTP/1.1\r\nX-Filler: {}\r\n\r\n",
        "f".repeat(17 * 1024)
    );
    let _ = tcp.write_all(second.as_bytes()).await;
    read_until(&mut tcp, &mut buf, "HTTP/1.1 431").await;

    // A smaller limit is a flag.
    let small = Server::memory(&["--max-header-bytes", "8192"]).await;
    let mut tcp = TcpStream::connect(small.addr).await.expect("connect");
    let head = format!(
        "GET /healthz HTTP/1.1\r\nX-Filler: {}\r\n\r\n",
        "f".repeat(9 * 1024)
    );
    let _ = tcp.write_all(head.as_bytes()).await;
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut buf)).await;
    assert!(String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 431"));
    assert_eq!(s.get("/healthz").await.status, 200);
}

#[tokio::test]
async fn a_slow_long_head_is_cut_at_the_first_heads_deadline() {
    let s = Server::memory(&["--header-timeout-ms", "1000"]).await;
    let mut tcp = TcpStream::connect(s.addr).await.expect("connect");
    let t0 = std::time::Instant::now();
    // 9 KiB arrive slowly (about 800 ms), then it keeps trickling: the head
    // is cut when the connection's deadline runs out.
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nX-Filler: ")
        .await
        .expect("write");
    let chunk = [b'f'; 1100];
    let cut = tokio::time::timeout(Duration::from_secs(5), async {
        let mut sent = 0usize;
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let piece: &[u8] = if sent < 9 * 1024 { &chunk } else { b"f" };
            if tcp.write_all(piece).await.is_err() {
                return;
            }
            sent += piece.len();
            let mut tmp = [0u8; 256];
            if let Ok(Ok(0) | Err(_)) =
                tokio::time::timeout(Duration::from_millis(1), tcp.read(&mut tmp)).await
            {
                return;
            }
        }
    })
    .await;
    assert!(cut.is_ok(), "the slow head was never cut off");
    let took = t0.elapsed();
    assert!(
        took < Duration::from_millis(1500),
        "cut off after {took:?}: the 1000 ms deadline runs from the connection's start, \
         not again later"
    );
}
