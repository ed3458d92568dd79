//! Abuse limits and CORS against the real binary (`docs/security.md`):
//! connections per IP (with answers an EventSource retries and probes that
//! keep answering), the publish rate, a trickled body, and CORS preflights
//! and credentials.

use gapless_testkit::{Item, Next, Server, SseClient};
use jsonwebtoken::{EncodingKey, Header};
use serde_json::json;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SECRET: &str = "a-test-secret-that-is-long-enough-32";

fn token_for(sub: &str, publish: &[&str]) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        + 3600;
    let claims =
        json!({"exp": exp, "sub": sub, "gapless": {"subscribe": ["*"], "publish": publish}});
    jsonwebtoken::encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()).expect("key"),
    )
    .expect("sign")
}

#[tokio::test]
async fn past_the_per_ip_limit_sse_is_told_to_retry_others_get_503_and_probes_answer() {
    let s = Server::memory(&["--max-connections-per-ip", "2"]).await;
    let (a, _) = s.subscribe("c", "").await;
    let (mut b, _) = s.subscribe("c", "").await;

    // An SSE request past the limit: 200 text/event-stream with only a
    // jittered retry: and a comment, then the end (what EventSource retries).
    let mut third = s.sse("/v1/channels/c/sse", &[]).await;
    assert_eq!(third.status, 200, "{}", third.raw_text());
    assert_eq!(third.header("content-type"), Some("text/event-stream"));
    let (items, end) = third.until_end(Duration::from_secs(5)).await;
    assert!(matches!(end, Next::End), "{end:?}");
    let retry = items.iter().find_map(|i| match i {
        Item::Retry(ms) => Some(*ms),
        _ => None,
    });
    assert!(
        retry.is_some_and(|ms| (1000..=10_000).contains(&ms)),
        "a jittered retry: {items:?}"
    );
    assert!(
        items
            .iter()
            .all(|i| matches!(i, Item::Retry(_) | Item::Comment(_))),
        "no id and no event: the client keeps its Last-Event-ID: {items:?}"
    );
    assert!(
        third.raw_text().contains("--max-connections-per-ip"),
        "{}",
        third.raw_text()
    );

    // Anything else: 503 limit_reached with Retry-After.
    let other = s.get("/v1/channels/c/events").await;
    other.expect_error(503, "limit_reached");
    let after: u64 = other
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!((1..=5).contains(&after), "{after}");

    // Probes keep answering.
    let probe = SseClient::connect(s.addr, "/healthz", &[]).await;
    assert_eq!(probe.status, 200);

    // The streams that were there are untouched: once one closes, a publish
    // gets through and the other stream receives it.
    drop(a);
    gapless_testkit::eventually("a slot frees", Duration::from_secs(5), || async {
        s.post("/v1/channels/c/events", "after", &[]).await.status == 201
    })
    .await;
    assert_eq!(b.next_event().await.data, "after");
}

#[tokio::test]
async fn the_publish_rate_is_kept_per_subject_and_refuses_whole_batches() {
    let s = Server::memory(&[
        "--jwt-secret",
        SECRET,
        "--publish-rate",
        "1",
        "--publish-burst",
        "5",
    ])
    .await;
    let alice = token_for("alice", &["*"]);
    let bob = token_for("bob", &["*"]);
    let post = |t: &str, path: &str, body: String| {
        let req = s.http.post(s.url(path)).bearer_auth(t).body(body);
        s.send(req)
    };
    for i in 0..5 {
        post(&alice, "/v1/channels/c/events", format!("a{i}"))
            .await
            .expect(201);
    }
    let r = post(&alice, "/v1/channels/c/events", "over".into()).await;
    r.expect_error(429, "rate_limited");
    let after: u64 = r
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!(after >= 1, "{after}");
    assert!(r.message().contains("--publish-rate"), "{}", r.text);
    // Another subject has its own bucket.
    post(&bob, "/v1/channels/c/events", "b".into())
        .await
        .expect(201);
    // A batch larger than the burst can never pass, and nothing of it is appended.
    let items: Vec<_> = (0..6).map(|i| json!({"data": format!("x{i}")})).collect();
    let r = post(&bob, "/v1/channels/c/batch", json!(items).to_string()).await;
    r.expect_error(429, "rate_limited");
    assert!(r.message().contains("--publish-burst"), "{}", r.text);
    let head = s
        .send(s.http.get(s.url("/v1/channels/c")).bearer_auth(&bob))
        .await;
    assert_eq!(head.expect(200)["head"], 6, "5 of alice and 1 of bob");
    // The bucket refills at the rate.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    post(&alice, "/v1/channels/c/events", "later".into())
        .await
        .expect(201);
}

#[tokio::test]
async fn an_open_server_keeps_the_publish_rate_per_ip() {
    let s = Server::memory(&["--publish-rate", "2", "--publish-burst", "2"]).await;
    s.publish("c", "1").await;
    s.publish("c", "2").await;
    s.post("/v1/channels/c/events", "3", &[])
        .await
        .expect_error(429, "rate_limited");
    s.post("/v1/channels/c/events?ephemeral=true", "e", &[])
        .await
        .expect_error(429, "rate_limited");
}

/// Sends `POST path` with a 5000-byte body at 100 bytes/s and returns the
/// answer's head and how long it took.
async fn trickle(s: &Server, path: &str, content_type: &str) -> (String, Duration) {
    let mut tcp = tokio::net::TcpStream::connect(s.addr)
        .await
        .expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: {content_type}\r\nContent-Length: 5000\r\n\r\n",
        s.addr
    );
    tcp.write_all(head.as_bytes()).await.expect("write");
    let t0 = Instant::now();
    let mut answer = Vec::new();
    // 10 bytes every 100 ms = 100 bytes/s, a tenth of the minimum.
    let (mut rd, mut wr) = tcp.split();
    let writer = async {
        for _ in 0..100 {
            if wr.write_all(&[b'x'; 10]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let mut buf = [0u8; 4096];
    let read = async {
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buf[..n]);
                    if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            }
        }
    };
    tokio::select! {
        () = read => {}
        () = writer => {}
    }
    (String::from_utf8_lossy(&answer).into_owned(), t0.elapsed())
}

#[tokio::test]
async fn a_trickled_body_is_cut_off_with_408() {
    let s = Server::memory(&["--min-body-rate", "1000", "--header-timeout-ms", "500"]).await;
    let (text, took) = trickle(&s, "/v1/channels/c/events", "text/plain").await;
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(took < Duration::from_secs(5), "cut off after {took:?}");
    // Nothing was appended; an ordinary publish still works.
    assert_eq!(s.info("c").await["head"], 0);
    s.publish("c", "fine").await;
}

/// The same pace holds on Durable Streams appends (and creates).
#[tokio::test]
async fn a_trickled_durable_streams_body_is_cut_off_with_408() {
    let s = Server::memory(&["--min-body-rate", "1000", "--header-timeout-ms", "500"]).await;
    let ct = [("Content-Type", "text/plain")];
    assert_eq!(s.request("PUT", "/ds/slow", &ct, "").await.status, 201);
    let (text, took) = trickle(&s, "/ds/slow", "text/plain").await;
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(took < Duration::from_secs(5), "cut off after {took:?}");
    let r = s.request("GET", "/ds/slow?offset=-1", &[], "").await;
    assert_eq!((r.status, r.text.as_str()), (200, ""), "nothing appended");
    let ok = s.request("POST", "/ds/slow", &ct, "fine").await;
    assert!(ok.status < 300, "{} {}", ok.status, ok.text);
}

#[tokio::test]
async fn cors_preflights_allow_polyfill_headers_and_listed_origins_get_credentials() {
    let s = Server::memory(&["--cors-origin", "http://app.example"]).await;
    let r = s
        .send(
            s.http
                .request(reqwest::Method::OPTIONS, s.url("/v1/channels/c/sse"))
                .header("Origin", "http://app.example")
                .header("Access-Control-Request-Method", "GET")
                .header(
                    "Access-Control-Request-Headers",
                    "cache-control,last-event-id,authorization,x-requested-with",
                ),
        )
        .await;
    assert!(r.status < 300, "preflight: {} {}", r.status, r.text);
    let allowed = r
        .header("access-control-allow-headers")
        .unwrap_or("")
        .to_ascii_lowercase();
    for h in [
        "cache-control",
        "last-event-id",
        "authorization",
        "x-requested-with",
        "idempotency-key",
        "content-type",
    ] {
        assert!(allowed.contains(h), "{h} allowed: {allowed}");
    }
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://app.example")
    );
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    let other = s
        .send(
            s.http
                .get(s.url("/v1/channels/c"))
                .header("Origin", "http://evil.example"),
        )
        .await;
    assert_eq!(other.header("access-control-allow-origin"), None);

    // `*`: any origin, never with credentials.
    let any = Server::memory(&["--cors-origin", "*"]).await;
    let r = any
        .send(
            any.http
                .get(any.url("/v1/channels/c"))
                .header("Origin", "http://x.example"),
        )
        .await;
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    assert_eq!(r.header("access-control-allow-credentials"), None);

    // With tokens on and no --cors-origin: no cross-origin access.
    let locked = Server::memory(&["--jwt-secret", SECRET]).await;
    let r = locked
        .send(
            locked
                .http
                .get(locked.url("/healthz"))
                .header("Origin", "http://x.example"),
        )
        .await;
    assert_eq!(r.header("access-control-allow-origin"), None);

    // `*` with listed origins is refused at start.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gapless"))
        .args([
            "serve",
            "--memory",
            "--listen",
            "127.0.0.1:0",
            "--cors-origin",
            "*,http://a.example",
        ])
        .output()
        .expect("run gapless");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--cors-origin"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `--cors-origin` that is not an origin as a browser spells it (no
/// scheme, a path, a bad scheme), from the flag or the config file, is
/// refused at start with what an origin looks like; a trailing `/` is
/// dropped, so the listed origin matches the browser's `Origin`.
#[tokio::test]
async fn a_cors_origin_that_is_not_an_origin_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("gapless.toml");
    std::fs::write(&file, "cors_origin = [\"not an origin\"]\n").expect("write config");
    let file = file.to_string_lossy().into_owned();
    for args in [
        vec!["--cors-origin", "app.example.com"],
        vec!["--cors-origin", "https://app.example.com/app"],
        vec!["--cors-origin", "ftp://app.example.com"],
        vec!["--cors-origin", "https://a.example,app.example.com"],
        vec!["--config", &file],
    ] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gapless"))
            .args(["serve", "--memory", "--listen", "127.0.0.1:0"])
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run gapless");
        // A refusal exits at once; a server that starts would run forever.
        let t0 = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait") {
                break status;
            }
            if t0.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{args:?}: the server started instead of refusing the setting");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
            .expect("read stderr");
        assert!(!status.success(), "{args:?} started: {err}");
        assert!(
            err.contains("--cors-origin") && err.contains("scheme://host[:port]"),
            "{args:?}: says what an origin looks like: {err}"
        );
    }
    // A trailing slash is dropped: the browser's Origin never has one.
    let s = Server::memory(&["--cors-origin", "https://App.example.com/"]).await;
    let r = s
        .send(
            s.http
                .get(s.url("/v1/channels/c/events"))
                .header("Origin", "https://app.example.com"),
        )
        .await;
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
}
