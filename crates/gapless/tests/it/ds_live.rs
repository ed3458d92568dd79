//! Durable Streams live reads (`live=sse`) and concurrent appends against
//! the real binary (docs/durable-streams.md, "Reads" and "Appends"): a live
//! read is written by the fan-out writer when it is a connection's first
//! request and by hyper after another request, with the same events either
//! way (one `data` event per batch, each followed by its `control` event);
//! it sends heartbeats and releases its subscriber as soon as the client
//! closes; and appends to one stream in flight together keep every
//! promise: each append once, in order per producer, nothing after a close,
//! the close's offset the final tail.

use gapless_testkit::{eventually, Server};
use reqwest::header::HeaderMap;
use serde_json::{json, Value};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(15);
const JSON: (&str, &str) = ("content-type", "application/json");
const TEXT: (&str, &str) = ("content-type", "text/plain");

/// One SSE event: its type (`event:`), its data lines joined with LF; a
/// comment frame (a heartbeat) has type `:`.
#[derive(Debug, Clone, PartialEq)]
struct Frame {
    kind: String,
    data: String,
}

/// A live read being received.
struct Live {
    resp: reqwest::Response,
    headers: HeaderMap,
    buf: Vec<u8>,
    ended: bool,
}

impl Live {
    /// Opens `GET path` (`live=sse`) with `client`, asserting 200.
    async fn open(client: &reqwest::Client, s: &Server, path: &str) -> Live {
        let resp = tokio::time::timeout(WAIT, client.get(s.url(path)).send())
            .await
            .expect("the live read answers in time")
            .expect("the live read");
        assert_eq!(resp.status(), 200, "{path}");
        Live {
            headers: resp.headers().clone(),
            resp,
            buf: Vec::new(),
            ended: false,
        }
    }

    /// Whether the fan-out writer wrote the answer (it closes the
    /// connection after the stream; hyper keeps it open).
    fn by_fanout_writer(&self) -> bool {
        self.headers
            .get("connection")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"))
    }

    /// The next frame, or `None` once the body ended.
    async fn frame(&mut self) -> Option<Frame> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let raw: Vec<u8> = self.buf.drain(..end + 2).collect();
                let text = String::from_utf8(raw).expect("UTF-8 frames");
                let mut kind = "message".to_owned();
                let mut data: Vec<&str> = Vec::new();
                for line in text.trim_end_matches('\n').split('\n') {
                    if line.starts_with(':') {
                        kind = ":".to_owned();
                    } else if let Some(t) = line.strip_prefix("event:") {
                        kind = t.trim_start().to_owned();
                    } else if let Some(d) = line.strip_prefix("data:") {
                        data.push(d.strip_prefix(' ').unwrap_or(d));
                    }
                }
                return Some(Frame {
                    kind,
                    data: data.join("\n"),
                });
            }
            if self.ended {
                assert!(self.buf.is_empty(), "a partial frame at the end");
                return None;
            }
            let chunk = tokio::time::timeout(WAIT, self.resp.chunk())
                .await
                .expect("a frame in time")
                .expect("reading the live read");
            match chunk {
                Some(c) => self.buf.extend_from_slice(&c),
                None => self.ended = true,
            }
        }
    }

    /// The next `data` event and the `control` event after it (heartbeats
    /// skipped); `None` once the body ended.
    async fn batch(&mut self) -> Option<(String, Value)> {
        let data = loop {
            let f = self.frame().await?;
            match f.kind.as_str() {
                ":" => continue,
                "data" => break f.data,
                "control" => panic!("a control event with no data event before it: {f:?}"),
                k => panic!("unexpected event {k:?}: {f:?}"),
            }
        };
        let control = loop {
            let f = self
                .frame()
                .await
                .expect("a control event after a data event");
            if f.kind == ":" {
                continue;
            }
            assert_eq!(f.kind, "control", "{f:?}");
            break serde_json::from_str::<Value>(&f.data).expect("control JSON");
        };
        Some((data, control))
    }

    /// The next `control` event (heartbeats skipped), which must come
    /// without data.
    async fn control(&mut self) -> Value {
        loop {
            let f = self.frame().await.expect("a control event");
            match f.kind.as_str() {
                ":" => continue,
                "control" => return serde_json::from_str(&f.data).expect("control JSON"),
                _ => panic!("expected a control event, got {f:?}"),
            }
        }
    }
}

/// A client that opens a new connection for every request (each live read
/// is its connection's first request: the fan-out writer's).
fn fresh_connections() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client")
}

/// A client whose one pooled connection already carried a `HEAD` of
/// `path`: a live read it opens next is written by hyper.
async fn after_a_head(s: &Server, path: &str) -> reqwest::Client {
    let c = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let h = c.head(s.url(path)).send().await.expect("HEAD");
    assert_eq!(h.status(), 200);
    c
}

/// The stream's tail (`Stream-Next-Offset` of `HEAD`).
async fn tail(s: &Server, path: &str) -> String {
    let h = s.request("HEAD", path, &[], "").await;
    assert_eq!(h.status, 200, "{path}");
    h.header("stream-next-offset").expect("offset").to_owned()
}

/// Every append of a JSON stream once and in order, whichever writer writes
/// the live read: a backlog and live appends, each `data` event one array
/// of what was pending, each followed by a `control` event with the offset
/// after it, and at the close a last control event with `streamClosed`,
/// then the end of the body.
#[tokio::test]
async fn a_live_read_gets_every_append_once_in_order_from_either_writer() {
    let s = Server::memory(&[]).await;
    for (i, fanout) in [(0, true), (1, false)] {
        let path = format!("/ds/live/{i}");
        let r = s.request("PUT", &path, &[JSON], "").await;
        assert_eq!(r.status, 201, "{}", r.text);
        for body in ["[1,2]", "3"] {
            let r = s.request("POST", &path, &[JSON], body).await;
            assert_eq!(r.status, 204, "{}", r.text);
        }
        let client = if fanout {
            fresh_connections()
        } else {
            after_a_head(&s, &path).await
        };
        let mut live = Live::open(&client, &s, &format!("{path}?offset=-1&live=sse")).await;
        assert_eq!(live.by_fanout_writer(), fanout, "{:?}", live.headers);
        assert_eq!(
            live.headers
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("text/event-stream")
        );
        let (data, control) = live.batch().await.expect("the backlog");
        assert_eq!(
            serde_json::from_str::<Value>(&data).expect("an array"),
            json!([1, 2, 3])
        );
        assert_eq!(control["upToDate"], true, "{control}");
        assert_eq!(control["streamNextOffset"], tail(&s, &path).await.as_str());
        assert!(control["streamCursor"].is_string(), "{control}");

        let mut got: Vec<Value> = Vec::new();
        let mut last_offset = control["streamNextOffset"]
            .as_str()
            .expect("offset")
            .to_owned();
        for body in ["[4]", "[5,6]", "7"] {
            let r = s.request("POST", &path, &[JSON], body).await;
            assert_eq!(r.status, 204, "{}", r.text);
        }
        let want = tail(&s, &path).await;
        while got.len() < 4 {
            let (data, control) = live.batch().await.expect("live appends");
            let Value::Array(items) = serde_json::from_str::<Value>(&data).expect("JSON") else {
                panic!("a data event is one array: {data}");
            };
            assert!(!items.is_empty(), "an empty data event");
            got.extend(items);
            let off = control["streamNextOffset"]
                .as_str()
                .expect("offset")
                .to_owned();
            assert!(off > last_offset, "offsets grow: {off} after {last_offset}");
            last_offset = off;
        }
        assert_eq!(got, vec![json!(4), json!(5), json!(6), json!(7)]);
        assert_eq!(last_offset, want, "the last control names the tail");

        let r = s
            .request("POST", &path, &[JSON, ("stream-closed", "true")], "")
            .await;
        assert_eq!(r.status, 204, "{}", r.text);
        let end = live.control().await;
        assert_eq!(end["streamClosed"], true, "{end}");
        assert_eq!(end["streamNextOffset"], want.as_str(), "{end}");
        assert!(
            live.frame().await.is_none(),
            "the body ends after the close"
        );
    }
}

/// A text stream's messages go one `data:` line per line, a CRLF split
/// across two appends being one line break, and a line that begins with a
/// space keeps it (an SSE reader drops one space after `data:`); a binary
/// stream's bytes go in base64, several appends in one event.
#[tokio::test]
async fn text_lines_and_binary_bytes_keep_their_shape_in_one_data_event() {
    let s = Server::memory(&[]).await;
    let client = fresh_connections();

    let r = s.request("PUT", "/ds/t", &[TEXT], "").await;
    assert_eq!(r.status, 201, "{}", r.text);
    for body in [" a\r", "\n  b\nc", "\rd "] {
        let r = s.request("POST", "/ds/t", &[TEXT], body).await;
        assert_eq!(r.status, 204, "{}", r.text);
    }
    let mut live = Live::open(&client, &s, "/ds/t?offset=-1&live=sse").await;
    assert!(live.by_fanout_writer());
    let (data, _) = live.batch().await.expect("the text");
    assert_eq!(
        data, " a\n  b\nc\nd ",
        "every byte but the line breaks' kind"
    );

    let bin = ("content-type", "application/octet-stream");
    let r = s.request("PUT", "/ds/b", &[bin], "").await;
    assert_eq!(r.status, 201, "{}", r.text);
    for body in ["\u{1}\u{2}", "\u{3}"] {
        let r = s.request("POST", "/ds/b", &[bin], body).await;
        assert_eq!(r.status, 204, "{}", r.text);
    }
    let mut live = Live::open(&client, &s, "/ds/b?offset=-1&live=sse").await;
    assert_eq!(
        live.headers
            .get("stream-sse-data-encoding")
            .and_then(|v| v.to_str().ok()),
        Some("base64")
    );
    let (data, _) = live.batch().await.expect("the bytes");
    assert_eq!(data, "AQID", "base64 of the three bytes, in order");
}

/// An idle live read gets gapless's heartbeat (an SSE comment) every
/// `--heartbeat-ms`, as gapless's own SSE streams do, so proxies keep it
/// open and a vanished client is noticed.
#[tokio::test]
async fn an_idle_live_read_gets_heartbeats() {
    let s = Server::memory(&["--heartbeat-ms", "200"]).await;
    let r = s.request("PUT", "/ds/quiet", &[JSON], "").await;
    assert_eq!(r.status, 201, "{}", r.text);
    for (client, fanout) in [
        (fresh_connections(), true),
        (after_a_head(&s, "/ds/quiet").await, false),
    ] {
        let mut live = Live::open(&client, &s, "/ds/quiet?offset=now&live=sse").await;
        assert_eq!(live.by_fanout_writer(), fanout);
        let up = live.control().await;
        assert_eq!(up["upToDate"], true, "{up}");
        let f = live.frame().await.expect("a frame");
        assert_eq!(f.kind, ":", "a heartbeat, then nothing else: {f:?}");
    }
}

/// A client that closes its live read releases its subscriber at once, not
/// at the next write (there is none on an idle stream with heartbeats this
/// far apart).
#[tokio::test]
async fn closing_a_live_read_releases_its_subscriber_at_once() {
    let s = Server::memory(&["--heartbeat-ms", "600000"]).await;
    let r = s.request("PUT", "/ds/idle", &[JSON], "").await;
    assert_eq!(r.status, 201, "{}", r.text);
    let client = fresh_connections();
    let mut live = Live::open(&client, &s, "/ds/idle?offset=now&live=sse").await;
    live.control().await;
    eventually("one subscriber", WAIT, || async {
        s.info("idle").await["subscribers"] == 1
    })
    .await;
    drop(live);
    eventually(
        "no subscriber soon after the close",
        Duration::from_secs(3),
        || async { s.info("idle").await["subscribers"] == 0 },
    )
    .await;
}

/// Appends in flight together on one stream: producers appending
/// concurrently (each in order, with retries of seqs already stored) and
/// plain appends, then a close while plain appends keep coming. Every
/// acknowledged append is stored once, each producer's in order, nothing
/// after the close, and the close's `Stream-Next-Offset` is the final tail.
#[tokio::test]
async fn concurrent_appends_keep_producers_exact_and_nothing_passes_a_close() {
    let s = Server::start(&[]).await;
    let path = "/ds/busy";
    let r = s.request("PUT", path, &[JSON], "").await;
    assert_eq!(r.status, 201, "{}", r.text);
    const PRODUCERS: usize = 6;
    const SEQS: u64 = 12;
    let mut tasks = Vec::new();
    for p in 0..PRODUCERS {
        let http = s.http.clone();
        let url = s.url(path);
        tasks.push(tokio::spawn(async move {
            for seq in 0..SEQS {
                // Each seq twice: the second is a duplicate (204), never stored.
                for (attempt, want) in [(0, 200), (1, 204)] {
                    let r = http
                        .post(&url)
                        .header("content-type", "application/json")
                        .header("producer-id", format!("p{p}"))
                        .header("producer-epoch", "0")
                        .header("producer-seq", seq.to_string())
                        .body(format!("\"p{p}-{seq}\""))
                        .send()
                        .await
                        .expect("append");
                    assert_eq!(
                        r.status().as_u16(),
                        want,
                        "p{p} seq {seq} attempt {attempt}"
                    );
                    assert_eq!(
                        r.headers()
                            .get("producer-seq")
                            .and_then(|v| v.to_str().ok()),
                        Some(seq.to_string().as_str())
                    );
                }
            }
            // A gap and a stale epoch are still told exactly.
            let gap = http
                .post(&url)
                .header("content-type", "application/json")
                .header("producer-id", format!("p{p}"))
                .header("producer-epoch", "0")
                .header("producer-seq", (SEQS + 1).to_string())
                .body("\"gap\"")
                .send()
                .await
                .expect("append");
            assert_eq!(gap.status().as_u16(), 409);
            assert_eq!(
                gap.headers()
                    .get("producer-expected-seq")
                    .and_then(|v| v.to_str().ok()),
                Some(SEQS.to_string().as_str())
            );
        }));
    }
    for t in tasks {
        t.await.expect("producer");
    }

    // Plain appenders until the close refuses them.
    let mut plain = Vec::new();
    for w in 0..6 {
        let http = s.http.clone();
        let url = s.url(path);
        plain.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for n in 0.. {
                let r = http
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(format!("\"w{w}-{n}\""))
                    .send()
                    .await
                    .expect("append");
                match r.status().as_u16() {
                    204 => acked.push(format!("w{w}-{n}")),
                    409 => return acked,
                    other => panic!("w{w} append {n}: {other}"),
                }
            }
            acked
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let closed = s
        .request("POST", path, &[JSON, ("stream-closed", "true")], "")
        .await;
    assert_eq!(closed.status, 204, "{}", closed.text);
    let final_offset = closed
        .header("stream-next-offset")
        .expect("offset")
        .to_owned();
    let mut acked = Vec::new();
    for t in plain {
        acked.extend(t.await.expect("writer"));
    }

    let mut stored: Vec<String> = Vec::new();
    let mut offset = "-1".to_owned();
    loop {
        let r = s
            .request("GET", &format!("{path}?offset={offset}"), &[], "")
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        let Value::Array(items) = &r.json else {
            panic!("{}", r.text)
        };
        stored.extend(items.iter().map(|v| v.as_str().expect("text").to_owned()));
        offset = r.header("stream-next-offset").expect("offset").to_owned();
        if r.header("stream-up-to-date") == Some("true") {
            assert_eq!(r.header("stream-closed"), Some("true"));
            break;
        }
    }
    assert_eq!(offset, final_offset, "the close named the final tail");
    let mut sorted = stored.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), stored.len(), "no message twice");
    for p in 0..PRODUCERS {
        let mine: Vec<&String> = stored
            .iter()
            .filter(|m| m.starts_with(&format!("p{p}-")))
            .collect();
        let want: Vec<String> = (0..SEQS).map(|q| format!("p{p}-{q}")).collect();
        assert_eq!(mine, want.iter().collect::<Vec<_>>(), "producer p{p}");
    }
    let plain_stored: Vec<&String> = stored.iter().filter(|m| m.starts_with('w')).collect();
    assert_eq!(
        plain_stored.len(),
        acked.len(),
        "every acknowledged plain append stored, nothing else"
    );
    for a in &acked {
        assert!(stored.contains(a), "{a} acknowledged but not stored");
    }
}

/// A stream closed before a restart is closed for a live read after it: the
/// read gets its messages, then a control event with `streamClosed` at the
/// final offset, then the end of the body (the stream's watch is restored
/// from its record, not only its metadata).
#[tokio::test]
async fn a_live_read_of_a_stream_closed_before_a_restart_ends_at_its_tail() {
    let mut s = Server::start(&[]).await;
    let r = s.request("PUT", "/ds/done", &[JSON], "").await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = s
        .request(
            "POST",
            "/ds/done",
            &[JSON, ("stream-closed", "true")],
            "[1,2]",
        )
        .await;
    assert_eq!(r.status, 204, "{}", r.text);
    let last = r.header("stream-next-offset").expect("offset").to_owned();
    s.kill9().await;
    s.restart().await;
    for client in [fresh_connections(), after_a_head(&s, "/ds/done").await] {
        let mut live = Live::open(&client, &s, "/ds/done?offset=-1&live=sse").await;
        let (data, control) = live.batch().await.expect("the messages");
        assert_eq!(
            serde_json::from_str::<Value>(&data).expect("JSON"),
            json!([1, 2])
        );
        assert_eq!(control["streamClosed"], true, "{control}");
        assert_eq!(control["streamNextOffset"], last.as_str());
        assert!(
            live.frame().await.is_none(),
            "the body ends at the closed tail"
        );
        let mut live = Live::open(&client, &s, &format!("/ds/done?offset={last}&live=sse")).await;
        let end = live.control().await;
        assert_eq!(end["streamClosed"], true, "{end}");
        assert!(live.frame().await.is_none());
    }
}

/// A connection past `--max-connections` gets the busy answer on the
/// Durable Streams paths too (503 `limit_reached`, with the room's CORS
/// headers), never a stream or a write: the limit holds for every route.
#[tokio::test]
async fn a_refused_connection_gets_the_busy_answer_on_durable_streams_paths() {
    let s = Server::memory(&["--max-connections", "2"]).await;
    let (_a, _) = s.subscribe("c", "").await;
    let (_b, _) = s.subscribe("c", "").await;
    let client = fresh_connections();
    for (method, path) in [
        ("PUT", "/ds/refused"),
        ("GET", "/ds/refused?offset=now&live=sse"),
        ("GET", "/ds/refused?offset=-1"),
    ] {
        let m = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let r = client
            .request(m, s.url(path))
            .header("content-type", "application/json")
            .send()
            .await
            .expect("an answer");
        assert_eq!(r.status().as_u16(), 503, "{method} {path}");
        assert!(r.headers().get("retry-after").is_some(), "{method} {path}");
        assert_eq!(
            r.headers()
                .get("access-control-allow-origin")
                .and_then(|v| v.to_str().ok()),
            Some("*")
        );
        let body: Value = r.json().await.expect("JSON");
        assert_eq!(body["error"], "limit_reached", "{body}");
    }
}

const SECRET: &str = "a-test-secret-that-is-long-enough-32";

/// A token for every channel whose `exp` is `ttl_s` seconds from now.
fn token_for(ttl_s: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let claims = json!({"exp": now + ttl_s, "gapless": {"subscribe": ["*"], "publish": ["*"]}});
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()).expect("key"),
    )
    .expect("signing")
}

/// A live read ends when the token that opened it stops being honoured
/// (`exp` plus `--jwt-leeway-ms`), as gapless's own SSE does: the SSE
/// response ends cleanly with nothing sent after the expiry (an append made
/// after it is not delivered) and its reconnection is refused 401; a
/// long-poll waiting past the expiry answers then as at its timeout (204,
/// `Stream-Up-To-Date`), not at the 30 s timeout.
#[tokio::test]
async fn live_reads_end_when_their_token_expires() {
    let s = Server::memory(&[
        "--jwt-secret",
        SECRET,
        "--jwt-leeway-ms",
        "500",
        "--ds-long-poll-timeout-ms",
        "30000",
    ])
    .await;
    let admin = token_for(3600);
    let bearer = format!("Bearer {admin}");
    let auth = ("authorization", bearer.as_str());
    let r = s.request("PUT", "/ds/exp", &[JSON, auth], "[1]").await;
    assert_eq!(r.status, 201, "{}", r.text);
    for fanout in [true, false] {
        let short = token_for(2);
        let opened = std::time::Instant::now();
        let client = if fanout {
            fresh_connections()
        } else {
            let c = reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("client");
            let h = c
                .head(s.url("/ds/exp"))
                .bearer_auth(&admin)
                .send()
                .await
                .expect("HEAD");
            assert_eq!(h.status(), 200);
            c
        };
        let path = format!("/ds/exp?offset=-1&live=sse&access_token={short}");
        let mut live = Live::open(&client, &s, &path).await;
        assert_eq!(live.by_fanout_writer(), fanout);
        let (data, control) = live.batch().await.expect("the backlog");
        assert_eq!(data, if fanout { "[1]" } else { "[1,2]" });
        assert_eq!(control["upToDate"], true, "{control}");
        // The body ends at the expiry (within ~2.5 s), long before 60 s;
        // nothing but heartbeats comes before.
        while let Some(f) = live.frame().await {
            assert_eq!(f.kind, ":", "nothing but heartbeats before the end: {f:?}");
        }
        let lasted = opened.elapsed();
        assert!(
            lasted < Duration::from_secs(8),
            "the live read ended at its token's expiry, after {lasted:?}"
        );
        let r = s.request("POST", "/ds/exp", &[JSON, auth], "2").await;
        assert_eq!(r.status, 204, "{}", r.text);
        let again = client.get(s.url(&path)).send().await.expect("reconnect");
        assert_eq!(again.status(), 401, "the expired token is refused");
    }
    // A long-poll at the tail, its token expiring while it waits.
    let tail = tail_as(&s, "/ds/exp", &admin).await;
    let short = token_for(2);
    let opened = std::time::Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        s.http
            .get(s.url(&format!("/ds/exp?offset={tail}&live=long-poll")))
            .bearer_auth(&short)
            .send(),
    )
    .await
    .expect("the long-poll answers at the token's expiry, not at its 30 s timeout")
    .expect("the long-poll");
    assert_eq!(r.status(), 204);
    assert_eq!(
        r.headers()
            .get("stream-up-to-date")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    assert_eq!(
        r.headers()
            .get("stream-next-offset")
            .and_then(|v| v.to_str().ok()),
        Some(tail.as_str())
    );
    assert!(opened.elapsed() < Duration::from_secs(8));
    // Nothing more under the expired token.
    let r = s
        .http
        .get(s.url(&format!("/ds/exp?offset={tail}&live=long-poll")))
        .bearer_auth(&short)
        .send()
        .await
        .expect("a second long-poll");
    assert_eq!(r.status(), 401);
}

/// The stream's tail (`Stream-Next-Offset` of `HEAD`) read with `token`.
async fn tail_as(s: &Server, path: &str, token: &str) -> String {
    let bearer = format!("Bearer {token}");
    let h = s
        .request("HEAD", path, &[("authorization", bearer.as_str())], "")
        .await;
    assert_eq!(h.status, 200, "{path}");
    h.header("stream-next-offset").expect("offset").to_owned()
}

/// The readers waiting on a stream that is then deleted are told it is
/// gone as the reference server tells them: a long-poll answers `404
/// stream_not_found` (a 410 would read as retention to a client), an SSE
/// live read ends, and every read after answers 404.
#[tokio::test]
async fn a_deleted_streams_waiting_readers_are_told_it_is_not_found() {
    let s = Server::memory(&["--ds-long-poll-timeout-ms", "20000"]).await;
    for (path, ct) in [("/ds/del/json", JSON), ("/ds/del/text", TEXT)] {
        let r = s.request("PUT", path, &[ct], "").await;
        assert_eq!(r.status, 201, "{}", r.text);
        let r = s.request("POST", path, &[ct], "[1]").await;
        assert_eq!(r.status, 204, "{}", r.text);
        let at = tail(&s, path).await;
        let poll = {
            let url = s.url(&format!("{path}?offset={at}&live=long-poll"));
            let http = s.http.clone();
            tokio::spawn(async move {
                let r = http.get(url).send().await.expect("the long-poll");
                let status = r.status().as_u16();
                (status, r.text().await.unwrap_or_default())
            })
        };
        let client = fresh_connections();
        let mut live = Live::open(&client, &s, &format!("{path}?offset={at}&live=sse")).await;
        let up = live.control().await;
        assert_eq!(up["upToDate"], true, "{up}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let r = s.request("DELETE", path, &[], "").await;
        assert_eq!(r.status, 204, "{}", r.text);
        let (status, body) = tokio::time::timeout(WAIT, poll)
            .await
            .expect("the long-poll answers at the deletion")
            .expect("the long-poll task");
        assert_eq!(status, 404, "{body}");
        let body: Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(body["error"], "stream_not_found", "{body}");
        while let Some(f) = live.frame().await {
            assert_eq!(f.kind, ":", "nothing but heartbeats before the end: {f:?}");
        }
        s.get(&format!("{path}?offset=-1"))
            .await
            .expect_error(404, "stream_not_found");
        s.get(&format!("{path}?offset={at}&live=long-poll"))
            .await
            .expect_error(404, "stream_not_found");
        s.get(&format!("{path}?offset={at}&live=sse"))
            .await
            .expect_error(404, "stream_not_found");
    }
}
