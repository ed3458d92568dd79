//! Regression tests for fixes made after an adversarial review: slowloris
//! sockets (closed, and told 408 when part of a head came), JSON errors on every path, duplicate idempotency keys, ephemeral
//! session appends, re-creating an ended session, unknown WebSocket fields,
//! one reply per WebSocket subscribe, close frames for WebSocket protocol
//! violations and answers to every client close frame, the history page byte budget, the subscription-channel flag
//! range, and SIGTERM with a half-sent request open.

use gapless_testkit::ws::{assert_error, Msg, Ws};
use gapless_testkit::Server;
use raw::{raw_status, read_until_closed, Answer, ByteWs, Ending};
use serde_json::{json, Value};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

// ---- 1. slowloris ----

#[tokio::test]
async fn slowloris_sockets_are_closed_by_the_header_timeout_and_free_their_slots() {
    let s = Server::memory(&["--header-timeout-ms", "500", "--max-connections", "5"]).await;
    let partial_heads = [
        "GET /healthz HTTP/1.1\r\nHost: x\r\n",
        "POST /v1/channels/c/events HTTP/1.1\r\nHo",
        "GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n",
        "",
        "",
    ];
    let mut socks = Vec::new();
    for head in partial_heads {
        let mut tcp = TcpStream::connect(s.addr).await.expect("connect");
        if !head.is_empty() {
            tcp.write_all(head.as_bytes()).await.expect("write");
        }
        socks.push((head, tcp));
    }
    let t0 = Instant::now();
    // The five hold every slot: a sixth connection is refused (so they count;
    // /healthz would still be served at the cap, so ask for something else).
    assert_eq!(
        raw_status(s.addr, "GET /v1/channels/c HTTP/1.1\r\nHost: x\r\n\r\n").await,
        Some(503),
        "the five slowloris sockets hold the --max-connections 5 slots"
    );
    let closes = futures::future::join_all(socks.iter_mut().map(|(head, tcp)| async move {
        let ending = read_until_closed(tcp, Duration::from_millis(2500)).await;
        (*head, ending)
    }))
    .await;
    for (head, ending) in closes {
        let Ending::Closed(got) = ending else {
            panic!(
                "a socket that sent {head:?} is still open {:?} after connecting, with \
                 --header-timeout-ms 500 (read: {ending:?})",
                t0.elapsed()
            );
        };
        // Part of a head: told why (408, JSON) before the close; nothing sent: just closed.
        if head.is_empty() {
            assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
        } else {
            assert_head_timeout(head, &got);
        }
    }
    assert!(
        t0.elapsed() < Duration::from_millis(2600),
        "closed within ~2 s: {:?}",
        t0.elapsed()
    );
    // The slots are free again: a normal request is served, not 503.
    let mut last = None;
    let t1 = Instant::now();
    while t1.elapsed() < Duration::from_secs(1) {
        last = raw_status(s.addr, "GET /v1/channels/c HTTP/1.1\r\nHost: x\r\n\r\n").await;
        if last == Some(200) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        last,
        Some(200),
        "a normal request after the slowloris sockets"
    );
    let r = s.get("/healthz").await;
    r.expect(200);
}

/// `got` is a 408 `request_timeout` JSON answer naming the setting.
#[track_caller]
fn assert_head_timeout(what: &str, got: &[u8]) {
    let text = String::from_utf8_lossy(got);
    assert!(text.starts_with("HTTP/1.1 408 "), "{what:?}: {text}");
    let body = &text[text.find("\r\n\r\n").map_or(0, |i| i + 4)..];
    let json: Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{what:?}: {e}: {text}"));
    assert_eq!(json["error"], "request_timeout", "{what:?}: {text}");
    let message = json["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("--header-timeout-ms"),
        "{what:?}: {message}"
    );
}

#[tokio::test]
async fn a_head_sent_byte_by_byte_gets_408_on_the_first_request_and_on_a_later_one() {
    let s = Server::memory(&["--header-timeout-ms", "600"]).await;
    // The first request of a connection (read by the fan-out path's reader),
    // for an SSE URL and another.
    for head in [
        "GET /v1/channels/c/sse HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n",
        "POST /v1/channels/c/events HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx",
    ] {
        let mut tcp = TcpStream::connect(s.addr).await.expect("connect");
        let got = trickle(&mut tcp, head.as_bytes()).await;
        assert_head_timeout(head, &got);
    }
    // A later request on a keep-alive connection (read by hyper).
    let mut tcp = TcpStream::connect(s.addr).await.expect("connect");
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut first = Vec::new();
    while !String::from_utf8_lossy(&first).contains("\"ok\"") {
        let mut chunk = [0u8; 1024];
        let n = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::io::AsyncReadExt::read(&mut tcp, &mut chunk),
        )
        .await
        .expect("the first answer in time")
        .expect("read");
        assert!(n > 0, "closed before the first answer");
        first.extend_from_slice(&chunk[..n]);
    }
    let got = trickle(
        &mut tcp,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: yes\r\n\r\n",
    )
    .await;
    assert_head_timeout("a later head", &got);
    // An idle keep-alive connection that starts no head is closed without a word.
    let mut tcp = TcpStream::connect(s.addr).await.expect("connect");
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    match read_until_closed(&mut tcp, Duration::from_secs(5)).await {
        Ending::Closed(got) => {
            let text = String::from_utf8_lossy(&got);
            assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
            assert!(!text.contains("408"), "{text}");
        }
        Ending::Open(got) => panic!("still open: {}", String::from_utf8_lossy(&got)),
    }
}

/// Sends `head` one byte every 100 ms until the server answers or closes;
/// returns what it sent back.
async fn trickle(tcp: &mut TcpStream, head: &[u8]) -> Vec<u8> {
    for b in head {
        if tcp.write_all(&[*b]).await.is_err() {
            break;
        }
        let mut peek = [0u8; 1];
        if let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_millis(100), tcp.peek(&mut peek)).await
        {
            if n > 0 {
                break;
            }
        }
    }
    match read_until_closed(tcp, Duration::from_secs(5)).await {
        Ending::Closed(got) => got,
        Ending::Open(got) => panic!("still open: {}", String::from_utf8_lossy(&got)),
    }
}

// ---- 2. JSON errors everywhere ----

#[track_caller]
fn assert_utf8_error(r: &gapless_testkit::Resp, what: &str) {
    r.expect_error(400, "invalid_request");
    let m = r.message().to_ascii_lowercase();
    assert!(
        m.contains("utf-8") || m.contains("utf8"),
        "{what}: the message mentions UTF-8: {}",
        r.text
    );
}

#[tokio::test]
async fn a_path_that_is_not_utf8_gets_a_json_invalid_request() {
    let s = Server::memory(&[]).await;
    let r = s.post("/v1/channels/a%FF/events", "x", &[]).await;
    assert_utf8_error(&r, "POST /v1/channels/a%FF/events");
    assert_eq!(r.json["error"], "invalid_request");
    let r = s.get("/v1/channels/a%FF/events").await;
    assert_utf8_error(&r, "GET /v1/channels/a%FF/events");
    let r = s.get("/v1/sessions/a%FF").await;
    assert_utf8_error(&r, "GET /v1/sessions/a%FF");
    let r = s.post("/v1/sessions/a%FF/events", "x", &[]).await;
    assert_utf8_error(&r, "POST /v1/sessions/a%FF/events");
}

#[tokio::test]
async fn websocket_paths_without_upgrade_headers_get_a_json_error() {
    let s = Server::memory(&[]).await;
    for path in ["/v1/ws", "/v1/sessions/a%FF/ws"] {
        let r = s.get(path).await;
        assert!(
            (400..500).contains(&r.status),
            "GET {path} without upgrade headers is a 4xx: {} {}",
            r.status,
            r.text
        );
        assert!(
            r.header("content-type")
                .is_some_and(|c| c.starts_with("application/json")),
            "GET {path}: the error is JSON: {:?} {}",
            r.headers,
            r.text
        );
        assert!(
            r.json["error"].as_str().is_some_and(|e| !e.is_empty())
                && r.json["message"].as_str().is_some_and(|m| !m.is_empty()),
            "GET {path}: body {{error, message}}: {}",
            r.text
        );
    }
}

/// The methods an `Allow` header lists.
fn allowed(r: &reqwest::Response) -> Vec<String> {
    r.headers()
        .get("allow")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .split(',')
        .map(|m| m.trim().to_owned())
        .filter(|m| !m.is_empty())
        .collect()
}

#[tokio::test]
async fn every_405_has_an_allow_header_listing_only_methods_its_route_takes() {
    let s = Server::memory(&["--console", "true"]).await;
    let doc = s.get("/v1/openapi.json").await.json;
    let paths = doc["paths"].as_object().expect("paths");
    assert!(paths.len() >= 15, "{paths:?}");
    let send = |method: &str, path: &str| {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        s.http.request(method, s.url(path)).send()
    };
    for (template, item) in paths {
        let path = template.replace("{channel}", "c").replace("{id}", "s1");
        // No route takes PATCH.
        let r = send("PATCH", &path).await.expect("answer");
        assert_eq!(r.status(), 405, "PATCH {path}");
        let allow = allowed(&r);
        for documented in item.as_object().expect("path item").keys() {
            let m = documented.to_ascii_uppercase();
            assert!(allow.contains(&m), "{path}: Allow {allow:?} lacks {m}");
        }
        // Each method listed is taken: answered, not 405.
        for m in &allow {
            let r = send(m, &path).await.expect("answer");
            assert_ne!(r.status(), 405, "{m} {path} is in Allow {allow:?}");
        }
        if path.ends_with("/ws") {
            // A WebSocket handshake is a GET (RFC 6455 section 4.1): HEAD is not taken.
            // (OPTIONS is the CORS layer's, on every path.)
            assert_eq!(allow, ["GET"], "{path}");
            for m in ["HEAD", "POST", "PUT", "DELETE", "get"] {
                let r = send(m, &path).await.expect("answer");
                assert_eq!(r.status(), 405, "{m} {path}");
                assert_eq!(allowed(&r), ["GET"], "{m} {path}");
                if m != "HEAD" {
                    let body: Value = r.json().await.expect("a JSON body");
                    assert_eq!(body["error"], "method_not_allowed", "{m} {path}: {body}");
                    let message = body["message"].as_str().unwrap_or_default();
                    let why = if m == "get" {
                        "case-sensitive"
                    } else {
                        "RFC 6455"
                    };
                    assert!(message.contains(why), "{m} {path}: {message}");
                }
            }
        }
    }
    // GET on both WebSocket routes upgrades.
    let mut ws = Ws::connect(s.addr, "/v1/ws").await;
    ws.subscribe_live("c").await;
    s.post("/v1/sessions", r#"{"id":"s1"}"#, &[])
        .await
        .expect(201);
    let mut consumer = Ws::connect(s.addr, "/v1/sessions/s1/ws").await;
    assert_eq!(consumer.json().await["op"], "session.resumed");
}

// ---- 3. duplicate Idempotency-Key ----

#[tokio::test]
async fn two_idempotency_key_headers_on_one_publish_are_invalid_request() {
    let s = Server::memory(&[]).await;
    let mut headers = reqwest::header::HeaderMap::new();
    headers.append("idempotency-key", "k1".parse().expect("value"));
    headers.append("idempotency-key", "k2".parse().expect("value"));
    let req = s
        .http
        .post(s.url("/v1/channels/c/events"))
        .headers(headers.clone())
        .body("x");
    let r = s.send(req).await;
    r.expect_error(400, "invalid_request");
    let req = s
        .http
        .post(s.url("/v1/channels/c/batch"))
        .headers(headers)
        .body(r#"[{"data":"x"}]"#);
    let r = s.send(req).await;
    r.expect_error(400, "invalid_request");
    assert_eq!(s.info("c").await["head"], 0, "nothing was appended");
}

// ---- 4. ephemeral session appends ----

#[tokio::test]
async fn an_ephemeral_session_append_is_refused_with_400() {
    let s = Server::memory(&[]).await;
    gapless_testkit::ws::new_session(&s, "s").await;
    let r = s
        .post("/v1/sessions/s/events?ephemeral=true", "x", &[])
        .await;
    r.expect_error(400, "invalid_request");
    let info = gapless_testkit::ws::session_info(&s, "s").await;
    assert_eq!(
        info.expect(200)["head"],
        1,
        "nothing was appended: {info:?}"
    );
}

// ---- 5. re-creating an ended session ----

async fn assert_stays_completed(s: &Server, when: &str) {
    let r = gapless_testkit::ws::create_session(s, Some("s")).await;
    r.expect_error(409, "session_exists");
    let info = gapless_testkit::ws::session_info(s, "s").await;
    assert_eq!(
        info.expect(200)["status"],
        "completed",
        "{when}: still completed after the refused re-create"
    );
    let r = gapless_testkit::ws::append(s, "s", "late").await;
    r.expect_error(409, "session_ended");
    assert_eq!(r.json["status"], "completed", "{when}: {}", r.text);
}

#[tokio::test]
async fn recreating_a_completed_session_is_409_and_it_stays_completed_across_restart() {
    let mut s = Server::start(&[]).await;
    gapless_testkit::ws::new_session(&s, "s").await;
    gapless_testkit::ws::append_ok(&s, "s", "one").await;
    gapless_testkit::ws::end_session(&s, "s", "complete")
        .await
        .expect(200);
    assert_stays_completed(&s, "before restart").await;
    s.kill9().await;
    s.restart().await;
    assert_stays_completed(&s, "after kill -9 and restart").await;
}

// ---- 6. unknown WebSocket fields ----

#[tokio::test]
async fn ws_publish_with_an_unknown_field_is_invalid_message_and_journals_nothing() {
    let s = Server::memory(&[]).await;
    let mut ws = Ws::channels(&s).await;
    ws.send_text(r#"{"op":"publish","id":1,"channel":"c","data":"x","ephemral":true}"#)
        .await;
    let r = ws.expect_op("error").await;
    assert_error(&r, "invalid_message");
    assert!(
        r["message"]
            .as_str()
            .is_some_and(|m| m.contains("ephemral")),
        "names the unknown field: {r}"
    );
    assert_eq!(s.info("c").await["head"], 0, "nothing journaled");
    // The socket stays usable, and the next publish is the first event.
    ws.send(&json!({"op": "publish", "id": 2, "channel": "c", "data": "y"}))
        .await;
    let r = ws.expect_op("published").await;
    assert_eq!(r["seq"], 1, "{r}");
}

#[tokio::test]
async fn ws_subscribe_with_an_unknown_field_is_invalid_message_and_subscribes_nothing() {
    let s = Server::memory(&[]).await;
    let mut ws = Ws::channels(&s).await;
    ws.send_text(r#"{"op":"subscribe","id":1,"channel":"c","sinse":"earliest"}"#)
        .await;
    let r = ws.expect_op("error").await;
    assert_error(&r, "invalid_message");
    assert!(
        r["message"].as_str().is_some_and(|m| m.contains("sinse")),
        "names the unknown field: {r}"
    );
    s.publish("c", "after").await;
    ws.expect_quiet(Duration::from_millis(300)).await;
}

// ---- 7. one reply per WebSocket subscribe ----

/// Reads JSON messages until none arrives for `quiet` (at most `cap` in all).
async fn read_until_quiet(ws: &mut Ws, quiet: Duration, cap: Duration) -> Vec<Value> {
    let t0 = Instant::now();
    let mut out = Vec::new();
    loop {
        assert!(
            t0.elapsed() < cap,
            "the socket never went quiet ({} messages)",
            out.len()
        );
        match ws.recv(quiet).await {
            None => return out,
            Some(Msg::Json(v)) => out.push(v),
            Some(other) => panic!("after {} messages: unexpected {other:?}", out.len()),
        }
    }
}

/// The replies (non-event messages) carrying `id`.
fn replies<'a>(msgs: &'a [Value], id: &str) -> Vec<&'a Value> {
    msgs.iter()
        .filter(|m| m["op"] != "event" && m["id"] == id)
        .collect()
}

/// How many sockets race at once in the reply tests (the race is timing-dependent).
const RACERS: usize = 8;

#[tokio::test]
async fn a_subscribe_replaying_3000_events_then_unsubscribe_each_get_exactly_one_reply() {
    let s = Server::memory(&[]).await;
    s.publish_many("c", "e", 3000).await;
    let rounds = futures::future::join_all((0..RACERS).map(|_| async {
        let mut ws = Ws::channels(&s).await;
        ws.send(&json!({"op": "subscribe", "id": "s", "channel": "c", "since": "earliest"}))
            .await;
        ws.send(&json!({"op": "unsubscribe", "id": "u", "channel": "c"}))
            .await;
        read_until_quiet(&mut ws, Duration::from_millis(700), Duration::from_secs(10)).await
    }))
    .await;
    for (round, msgs) in rounds.iter().enumerate() {
        let s_replies = replies(msgs, "s");
        let u_replies = replies(msgs, "u");
        assert_eq!(
            s_replies.len(),
            1,
            "socket {round}: one reply to subscribe \"s\": {s_replies:?}"
        );
        assert_eq!(s_replies[0]["op"], "subscribed", "{}", s_replies[0]);
        assert_eq!(
            u_replies.len(),
            1,
            "socket {round}: one reply to unsubscribe \"u\": {u_replies:?}"
        );
        assert_eq!(u_replies[0]["op"], "unsubscribed", "{}", u_replies[0]);
        let errors: Vec<_> = msgs.iter().filter(|m| m["op"] == "error").collect();
        assert!(errors.is_empty(), "socket {round}: no errors: {errors:?}");
    }
}

#[tokio::test]
async fn two_quick_subscribes_to_one_channel_each_get_exactly_one_subscribed() {
    let s = Server::memory(&[]).await;
    s.publish_many("c", "e", 3000).await;
    // The second subscribe replays from the floor too, or starts live.
    let seconds: Vec<Value> = (0..RACERS)
        .map(|i| {
            if i % 2 == 0 {
                json!({"since": "earliest"})
            } else {
                json!({})
            }
        })
        .collect();
    let rounds = futures::future::join_all(seconds.iter().map(|second| async {
        let mut ws = Ws::channels(&s).await;
        ws.subscribe(json!("a"), "c", json!({"since": "earliest"}))
            .await;
        ws.subscribe(json!("b"), "c", second.clone()).await;
        read_until_quiet(&mut ws, Duration::from_millis(700), Duration::from_secs(10)).await
    }))
    .await;
    for (msgs, second) in rounds.iter().zip(&seconds) {
        for id in ["a", "b"] {
            let r = replies(msgs, id);
            assert_eq!(
                r.len(),
                1,
                "subscribe {id:?} (second subscribe {second}): one reply, got {r:?}"
            );
            assert_eq!(r[0]["op"], "subscribed", "{}", r[0]);
        }
    }
}

// ---- 8. WebSocket protocol violations get a close frame ----

async fn violation_answer(args: &[&str], send: impl AsyncFnOnce(&mut ByteWs)) -> Answer {
    let s = Server::memory(args).await;
    let mut ws = ByteWs::connect(s.addr, "/v1/ws").await;
    send(&mut ws).await;
    ws.close_answer(Duration::from_secs(5)).await
}

#[tokio::test]
async fn a_text_frame_with_invalid_utf8_is_closed_1007() {
    let a = violation_answer(&[], async |ws| {
        ws.write_masked(0x81, b"{\"op\":\"\xff\xfe\"}").await;
    })
    .await;
    assert_eq!(a, Answer::Close(Some(1007)));
}

#[tokio::test]
async fn an_unmasked_client_frame_is_closed_1002() {
    let a = violation_answer(&[], async |ws| {
        let msg = br#"{"op":"subscribe","channel":"c"}"#;
        let mut frame = vec![0x81, msg.len() as u8];
        frame.extend_from_slice(msg);
        ws.write_raw(&frame).await;
    })
    .await;
    assert_eq!(a, Answer::Close(Some(1002)));
}

#[tokio::test]
async fn a_frame_with_rsv_bits_set_is_closed_1002() {
    let a = violation_answer(&[], async |ws| {
        ws.write_masked(0x80 | 0x40 | 0x01, br#"{"op":"subscribe","channel":"c"}"#)
            .await;
    })
    .await;
    assert_eq!(a, Answer::Close(Some(1002)));
}

#[tokio::test]
async fn a_ping_with_a_126_byte_payload_is_closed_1002_not_1009() {
    let a = violation_answer(&[], async |ws| {
        ws.write_masked(0x89, &[7u8; 126]).await;
    })
    .await;
    assert_eq!(a, Answer::Close(Some(1002)));
}

#[tokio::test]
async fn a_raw_message_over_ws_max_message_bytes_is_closed_1009() {
    let a = violation_answer(&["--ws-max-message-bytes", "4096"], async |ws| {
        let big = json!({"op": "publish", "channel": "c", "data": "b".repeat(5000)});
        ws.write_masked(0x81, big.to_string().as_bytes()).await;
    })
    .await;
    assert_eq!(a, Answer::Close(Some(1009)));
}

/// A client still sending a message over the limit when the server closes
/// 1009 (a browser writing a large `send`) finishes its write and reads the
/// close: the server reads on and drops the rest of the message (a
/// lingering close) instead of resetting the connection, which the client
/// would report as 1006. 8 MiB: more than loopback's socket buffers hold,
/// so the client is still writing when the server closes (with 1 MiB the
/// write ends in the buffers and the reset comes too late to matter). On
/// both WebSocket endpoints.
#[tokio::test]
async fn a_client_still_sending_a_message_over_the_limit_reads_the_1009() {
    let s = Server::memory(&["--ws-max-message-bytes", "4096"]).await;
    s.post("/v1/sessions", r#"{"id": "s1"}"#, &[])
        .await
        .expect(201);
    let frame = gapless_testkit::ws::masked_frame(0x81, &vec![b'x'; 8 << 20]);
    for path in ["/v1/ws", "/v1/sessions/s1/ws"] {
        let mut ws = ByteWs::connect(s.addr, path).await;
        let wrote = ws.try_write_raw(&frame).await;
        assert!(
            wrote.is_ok(),
            "{path}: the server reset the connection while the client was still sending: {wrote:?}"
        );
        assert_eq!(
            ws.close_answer(Duration::from_secs(5)).await,
            Answer::Close(Some(1009)),
            "{path}"
        );
    }
}

/// What the server answers a client's close frame with `payload`, on `path`.
async fn close_reply(s: &Server, path: &str, payload: &[u8]) -> Answer {
    let mut ws = ByteWs::connect(s.addr, path).await;
    ws.write_masked(0x88, payload).await;
    let a = ws.close_answer(Duration::from_secs(5)).await;
    // The server then closes the connection.
    assert_eq!(
        ws.close_answer(Duration::from_secs(5)).await,
        Answer::Eof,
        "{path} {payload:?}: closed after the answer"
    );
    a
}

#[tokio::test]
async fn a_client_close_frame_is_answered_and_an_invalid_one_gets_1002_or_1007() {
    let s = Server::memory(&[]).await;
    s.post("/v1/sessions", r#"{"id": "s1"}"#, &[])
        .await
        .expect(201);
    let valid = [
        1000u16, 1001, 1002, 1003, 1007, 1008, 1011, 1013, 3000, 3999, 4000, 4999,
    ];
    // RFC 6455 section 7.4: never sent by an endpoint (1005, 1006, 1015 are
    // local reports; 1016-2999 reserved; 0-999 and 5000 up not used).
    let invalid = [
        0u16, 1, 999, 1004, 1005, 1006, 1014, 1015, 1016, 2000, 2999, 5000, 65535,
    ];
    for path in ["/v1/ws", "/v1/sessions/s1/ws"] {
        for code in valid {
            let mut payload = code.to_be_bytes().to_vec();
            payload.extend_from_slice(b"bye");
            assert_eq!(
                close_reply(&s, path, &payload).await,
                Answer::Close(Some(code)),
                "{path}: a valid code {code} is echoed"
            );
        }
        for code in invalid {
            assert_eq!(
                close_reply(&s, path, &code.to_be_bytes()).await,
                Answer::Close(Some(1002)),
                "{path}: an invalid code {code} is a protocol error"
            );
        }
        // No payload: answered with no code.
        assert_eq!(
            close_reply(&s, path, b"").await,
            Answer::Close(None),
            "{path}"
        );
        // One byte: not a code (section 5.5.1).
        assert_eq!(
            close_reply(&s, path, &[3]).await,
            Answer::Close(Some(1002)),
            "{path}: a 1-byte close payload"
        );
        // A reason that is not UTF-8 (section 8.1).
        assert_eq!(
            close_reply(&s, path, b"\x03\xe8bad \xff\xfe").await,
            Answer::Close(Some(1007)),
            "{path}: a reason that is not UTF-8"
        );
    }
    assert_eq!(s.get("/healthz").await.status, 200);
}

// ---- 9. history page byte budget ----

#[tokio::test]
async fn history_pages_of_1mb_events_stop_at_the_byte_budget_and_reach_every_event_once() {
    let s = Server::memory(&["--max-event-bytes", "2000000"]).await;
    for i in 1..=6u8 {
        let data = format!("{i}{}", "x".repeat(999_999));
        let r = s.post("/v1/channels/big/events", data, &[]).await;
        assert_eq!(r.expect(201)["seq"], u64::from(i));
    }
    let first = s.history("big", "limit=1000").await;
    let page = first.expect(200);
    let n = page["events"].as_array().expect("events").len();
    assert!(
        (1..6).contains(&n),
        "the first page stops early at the byte budget: {n} events"
    );
    assert_eq!(page["done"], false, "more pages follow");
    let mut seqs = Vec::new();
    let mut page = page.clone();
    let mut pages = 0;
    loop {
        pages += 1;
        assert!(pages <= 6, "at most one page per event");
        let events = page["events"].as_array().expect("events");
        assert!(
            !events.is_empty() || page["done"] == true,
            "a page holds an event"
        );
        for e in events {
            let seq = e["seq"].as_u64().expect("seq");
            let data = e["data"].as_str().expect("data");
            assert_eq!(data.len(), 1_000_000, "seq {seq}: whole data");
            assert!(
                data.starts_with(&seq.to_string()),
                "seq {seq}: its own data"
            );
            seqs.push(seq);
        }
        if page["done"] == true {
            break;
        }
        let next = page["next"].as_str().expect("next").to_owned();
        page = s
            .history("big", &format!("limit=1000&after={next}"))
            .await
            .expect(200)
            .clone();
    }
    assert_eq!(seqs, vec![1, 2, 3, 4, 5, 6], "every event exactly once");
}

// ---- 10. --max-subscription-channels range ----

#[tokio::test]
async fn max_subscription_channels_256_is_refused_at_startup() {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_gapless"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--memory",
            "--max-subscription-channels",
            "256",
        ])
        .env_remove("GAPLESS_MAX_SUBSCRIPTION_CHANNELS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn gapless");
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("gapless exits instead of serving with --max-subscription-channels 256")
        .expect("wait");
    let out = child.wait_with_output().await.expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!status.success(), "exit status {status}; stderr: {stderr}");
    assert!(!stdout.contains("listening"), "it never listened: {stdout}");
    assert!(
        stderr.contains("max-subscription-channels"),
        "stderr names the flag: {stderr}"
    );
    assert!(
        stderr.contains('1') && stderr.contains("255"),
        "stderr names the range 1 to 255: {stderr}"
    );
}

// ---- 11. SIGTERM with a half-sent request ----

#[tokio::test]
async fn sigterm_with_half_sent_requests_open_exits_within_5_s() {
    let mut s = Server::memory(&[]).await;
    let mut head_half = TcpStream::connect(s.addr).await.expect("connect");
    head_half
        .write_all(b"POST /v1/channels/c/events HTTP/1.1\r\nHost: x\r\nContent-Le")
        .await
        .expect("write");
    let mut body_half = TcpStream::connect(s.addr).await.expect("connect");
    body_half
        .write_all(
            b"POST /v1/channels/c/events HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc",
        )
        .await
        .expect("write");
    // Let the server accept both and start reading them.
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.get("/healthz").await.expect(200);
    let (status, took) = s.sigterm().await;
    assert!(
        took < Duration::from_secs(5),
        "exited {took:?} after SIGTERM ({status}) with half-sent requests open"
    );
    drop((head_half, body_half));
}

// ---- --fanout-threads range ----

#[tokio::test]
async fn fanout_threads_over_1024_is_refused_at_startup() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_gapless"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--memory",
            "--fanout-threads",
            "5000",
        ])
        .env_remove("GAPLESS_FANOUT_THREADS")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(10), out)
        .await
        .expect("gapless exits instead of serving with --fanout-threads 5000")
        .expect("run gapless");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "exit status {}; stderr: {stderr}",
        out.status
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("listening"),
        "it never listened"
    );
    assert!(
        stderr.contains("fanout-threads"),
        "stderr names the flag: {stderr}"
    );
    assert!(stderr.contains("1024"), "stderr names the limit: {stderr}");
}

mod raw {
    //! Helpers of the regression tests that the shared modules do not have: a
    //! WebSocket over a bare TCP socket that writes arbitrary bytes (unmasked
    //! frames, RSV bits), and reads of raw TCP sockets until the server closes them.

    use std::net::SocketAddr;
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// How a raw socket read ended.
    #[derive(Debug, PartialEq, Eq)]
    pub(super) enum Ending {
        /// The server closed the connection (EOF or reset) after this many bytes.
        Closed(Vec<u8>),
        /// Still open when the deadline passed (with what was read).
        Open(Vec<u8>),
    }

    /// Reads `tcp` until the server closes it or `within` passes.
    pub(super) async fn read_until_closed(tcp: &mut TcpStream, within: Duration) -> Ending {
        let deadline = Instant::now() + within;
        let mut got = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut chunk = [0u8; 4096];
            match tokio::time::timeout(left, tcp.read(&mut chunk)).await {
                Err(_) => return Ending::Open(got),
                Ok(Ok(0)) | Ok(Err(_)) => return Ending::Closed(got),
                Ok(Ok(n)) => got.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Sends a whole request (`raw`) on a new connection and returns the status of
    /// the answer's status line (`None`: the connection closed or stayed silent).
    pub(super) async fn raw_status(addr: SocketAddr, raw: &str) -> Option<u16> {
        let mut tcp = TcpStream::connect(addr).await.ok()?;
        tcp.write_all(raw.as_bytes()).await.ok()?;
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut got = Vec::new();
        loop {
            if let Some(end) = got.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&got[..end]).into_owned();
                return line.split_whitespace().nth(1)?.parse().ok();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let mut chunk = [0u8; 1024];
            match tokio::time::timeout(left, tcp.read(&mut chunk)).await {
                Ok(Ok(n)) if n > 0 => got.extend_from_slice(&chunk[..n]),
                _ => return None,
            }
        }
    }

    /// A WebSocket on `/v1/ws` over a bare TCP socket: the test writes bytes as is.
    pub(super) struct ByteWs {
        tcp: TcpStream,
        buf: Vec<u8>,
    }

    /// What the server answered a protocol violation with.
    #[derive(Debug, PartialEq, Eq)]
    pub(super) enum Answer {
        /// A close frame with this code (`None`: a close frame without a code).
        Close(Option<u16>),
        /// The connection ended without a close frame.
        Eof,
        /// Nothing within the deadline.
        Silence,
    }

    impl ByteWs {
        /// Upgrades `path` with subprotocol `gapless.v1`; asserts 101.
        pub(super) async fn connect(addr: SocketAddr, path: &str) -> ByteWs {
            let mut tcp = TcpStream::connect(addr).await.expect("TCP connect");
            let req = format!(
                "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                 Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
                 Sec-WebSocket-Protocol: gapless.v1\r\n\r\n"
            );
            tcp.write_all(req.as_bytes())
                .await
                .expect("write handshake");
            let mut buf = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(10);
            let end = loop {
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                let mut chunk = [0u8; 4096];
                let n = tokio::time::timeout(left, tcp.read(&mut chunk))
                    .await
                    .expect("handshake answer timed out")
                    .expect("reading the handshake answer");
                assert!(n > 0, "closed during the handshake: {buf:?}");
                buf.extend_from_slice(&chunk[..n]);
            };
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            assert!(head.starts_with("HTTP/1.1 101"), "upgrade refused: {head}");
            let buf = buf[end..].to_vec();
            ByteWs { tcp, buf }
        }

        /// Writes `bytes` as they are.
        pub(super) async fn write_raw(&mut self, bytes: &[u8]) {
            self.tcp.write_all(bytes).await.expect("write");
        }

        /// Writes `bytes` as they are; the error if the write failed.
        pub(super) async fn try_write_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
            self.tcp.write_all(bytes).await
        }

        /// Writes one masked frame: `first` is the first byte (FIN, RSV, opcode).
        pub(super) async fn write_masked(&mut self, first: u8, payload: &[u8]) {
            self.write_raw(&gapless_testkit::ws::masked_frame(first, payload))
                .await;
        }

        /// Reads frames (skipping all but close) until a close frame, EOF or `within`.
        pub(super) async fn close_answer(&mut self, within: Duration) -> Answer {
            let deadline = Instant::now() + within;
            loop {
                while let Some((frame, used)) = gapless_testkit::ws::parse_frame(&self.buf) {
                    self.buf.drain(..used);
                    if frame.opcode == 8 {
                        return Answer::Close(frame.close_code());
                    }
                }
                let left = deadline.saturating_duration_since(Instant::now());
                let mut chunk = [0u8; 16384];
                match tokio::time::timeout(left, self.tcp.read(&mut chunk)).await {
                    Err(_) => return Answer::Silence,
                    Ok(Ok(0)) | Ok(Err(_)) => return Answer::Eof,
                    Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
                }
            }
        }
    }
}
