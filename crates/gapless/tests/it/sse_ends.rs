//! Every way an SSE stream ends on its own sends what it queued, whichever
//! transport writes it (crates/server/src/net/conn.rs): the first request of a
//! connection (the first-request writer) and a later request of a keep-alive
//! connection (hyper), one channel and several. At token expiry the last
//! frame is `event: gapless.expired` and the body ends cleanly (its last
//! chunk), so a browser refreshes its credential and resumes with its cursor
//! (docs/security.md); at shutdown the body ends cleanly too. At a journal
//! failure (cluster mode, Redis refusing) the stream sends what it had read,
//! then `retry:` and a comment naming the cause, then breaks off without
//! the last chunk (docs/api.md, "When a journal read fails mid-stream").

use gapless_testkit::{stream_lines, ConnectOptions, Item, Next, Server, SseClient};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;
use std::time::Duration;

const SECRET: &str = "a-test-secret-that-is-long-enough-32";
const WAIT: Duration = Duration::from_secs(10);

fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

/// A token for every channel that expires `ttl_s` seconds from now.
fn token(ttl_s: i64) -> String {
    let claims = json!({"exp": now_s() + ttl_s, "gapless": {"subscribe": ["*"], "publish": ["*"]}});
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()).expect("key"),
    )
    .expect("signing")
}

async fn secured() -> Server {
    Server::memory(&["--jwt-secret", SECRET, "--jwt-leeway-ms", "0"]).await
}

/// One stream of the matrix: first request of its connection or not, one
/// channel or two.
#[derive(Debug, Clone, Copy)]
struct Case {
    after_a_request: bool,
    multi: bool,
}

const CASES: [Case; 4] = [
    Case {
        after_a_request: false,
        multi: false,
    },
    Case {
        after_a_request: true,
        multi: false,
    },
    Case {
        after_a_request: false,
        multi: true,
    },
    Case {
        after_a_request: true,
        multi: true,
    },
];

impl Case {
    /// This case's own channels (so cases on one server do not meet).
    fn channels(self, i: usize) -> Vec<String> {
        let n = if self.multi { 2 } else { 1 };
        (0..n).map(|k| format!("c{i}-{k}")).collect()
    }

    async fn open(self, s: &Server, channels: &[String], token: &str) -> SseClient {
        self.open_with(s, channels, token, ConnectOptions::default())
            .await
    }

    async fn open_with(
        self,
        s: &Server,
        channels: &[String],
        token: &str,
        opts: ConnectOptions,
    ) -> SseClient {
        self.open_from(s, channels, token, "", opts).await
    }

    /// Opens with `query` (`since=earliest`, say; empty for none) added to the URL.
    async fn open_from(
        self,
        s: &Server,
        channels: &[String],
        token: &str,
        query: &str,
        opts: ConnectOptions,
    ) -> SseClient {
        let more = if query.is_empty() {
            String::new()
        } else {
            format!("&{query}")
        };
        let target = if self.multi {
            let q: Vec<String> = channels.iter().map(|c| format!("channel={c}")).collect();
            format!("/v1/sse?{}&access_token={token}{more}", q.join("&"))
        } else {
            format!(
                "/v1/channels/{}/sse?access_token={token}{more}",
                channels[0]
            )
        };
        let c = if self.after_a_request {
            SseClient::connect_after(s.addr, "/healthz", &target, &[], opts).await
        } else {
            SseClient::connect_with(s.addr, &target, &[], opts).await
        };
        assert_eq!(c.status, 200, "{self:?}: {}", c.raw_text());
        if self.after_a_request {
            // hyper's answer: keep-alive, no `connection: close`.
            assert_eq!(c.header("connection"), None, "{self:?}");
        } else {
            assert_eq!(c.header("connection"), Some("close"), "{self:?}");
        }
        c
    }
}

async fn publish(s: &Server, channel: &str, data: &str) {
    let r = s
        .send(
            s.http
                .post(s.url(&format!("/v1/channels/{channel}/events")))
                .bearer_auth(token(3600))
                .body(data.to_owned()),
        )
        .await;
    r.expect(201);
}

/// The data of the events among `items`, and the types of the others.
fn events(items: &[Item]) -> Vec<(String, String)> {
    items
        .iter()
        .filter_map(|i| match i {
            Item::Event(e) => Some((e.event.clone(), e.data.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn at_token_expiry_every_stream_ends_with_the_expiry_frame_then_its_last_chunk() {
    let s = secured().await;
    // Expires in 1 to 2 s (whole seconds); every stream opens well before.
    let t = token(2);
    let runs = CASES.iter().enumerate().map(|(i, &case)| {
        let s = &s;
        let t = &t;
        async move {
            let channels = case.channels(i);
            let mut c = case.open(s, &channels, t).await;
            for ch in &channels {
                publish(s, ch, &format!("to {ch}")).await;
            }
            let (items, end) = c.until_end(WAIT).await;
            let got = events(&items);
            let want: Vec<(String, String)> = channels
                .iter()
                .map(|ch| ("message".to_owned(), format!("to {ch}")))
                .chain([("gapless.expired".to_owned(), String::new())])
                .collect();
            let types: Vec<&str> = got.iter().map(|(t, _)| t.as_str()).collect();
            let want_types: Vec<&str> = want.iter().map(|(t, _)| t.as_str()).collect();
            assert_eq!(types, want_types, "{case:?}: {items:?}");
            let Some(Item::Event(last)) = items.last() else {
                panic!("{case:?}: the last item is an event: {items:?}");
            };
            assert_eq!(last.event, "gapless.expired", "{case:?}");
            assert_eq!(last.json()["error"], "token_expired", "{case:?}");
            assert_eq!(last.id, None, "{case:?}: the notice carries no id");
            assert_eq!(end, Next::End, "{case:?}: a clean end (the last chunk)");
        }
    });
    futures::future::join_all(runs).await;
}

#[tokio::test]
async fn at_shutdown_every_stream_sends_what_it_has_then_its_last_chunk() {
    let mut s = secured().await;
    let t = token(3600);
    let mut clients = Vec::new();
    for (i, &case) in CASES.iter().enumerate() {
        let channels = case.channels(i);
        let c = case.open(&s, &channels, &t).await;
        for ch in &channels {
            publish(&s, ch, &format!("to {ch}")).await;
        }
        clients.push((case, channels, c));
    }
    // Each stream has written its events before the signal.
    for (case, channels, c) in &mut clients {
        let got = c.events(channels.len()).await;
        assert_eq!(got.len(), channels.len(), "{case:?}");
    }
    s.sigterm().await;
    for (case, _, mut c) in clients {
        let (items, end) = c.until_end(WAIT).await;
        assert!(
            events(&items).is_empty(),
            "{case:?}: no event after the ones published: {items:?}"
        );
        assert_eq!(end, Next::End, "{case:?}: a clean end (the last chunk)");
    }
}

/// A client that stops reading with megabytes on their way to it, and reads
/// again after its token expired: what the server had read for it while the
/// token was honoured arrives whole and in order (nothing more is read after
/// expiry), then the expiry frame, then the last chunk (a writer waiting on the full socket does not cut the stream at
/// expiry; it cuts it at shutdown, sse_transport.rs).
#[tokio::test]
async fn a_reader_that_paused_across_expiry_gets_what_was_queued_then_the_expiry_frame() {
    let s = secured().await;
    // Expires in 2 to 3 s (whole seconds): time to open, publish, and fill the socket.
    let exp = now_s() + 3;
    let t = token(3);
    let blob = "y".repeat(512 * 1024);
    let n = 16;
    let runs = CASES.iter().enumerate().map(|(i, &case)| {
        let (s, t, blob) = (&s, &t, &blob);
        async move {
            let channels = case.channels(i);
            let opts = ConnectOptions {
                recv_buffer: Some(4096),
            };
            let mut c = case.open_with(s, &channels, t, opts).await;
            let _ = c.events(0).await;
            for k in 0..n {
                publish(s, &channels[k % channels.len()], &format!("{k:02}{blob}")).await;
            }
            (case, c)
        }
    });
    let clients = futures::future::join_all(runs).await;
    // Read nothing until the token has expired.
    while now_s() <= exp {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let blob = &blob;
    let reads = clients.into_iter().map(|(case, mut c)| async move {
        let (items, end) = c.until_end(Duration::from_secs(30)).await;
        let got = events(&items);
        let (last, delivered) = got.split_last().expect("events");
        assert_eq!(last.0, "gapless.expired", "{case:?}: {} events", got.len());
        // The events read before expiry, whole and in order (the rest is
        // read on the next stream, from the cursor).
        assert!(!delivered.is_empty() && delivered.len() < n, "{case:?}");
        for (k, (t, d)) in delivered.iter().enumerate() {
            assert_eq!(t, "message", "{case:?}");
            assert_eq!(d.len(), 2 + blob.len(), "{case:?}");
            assert_eq!(&d[..2], format!("{k:02}"), "{case:?}");
        }
        assert_eq!(end, Next::End, "{case:?}: a clean end (the last chunk)");
    });
    futures::future::join_all(reads).await;
}

/// A journal that fails mid-stream (cluster mode: Redis refusing scripts
/// for lack of memory, docs/cluster.md) while each stream reads it (its
/// subscriber far behind the node's window) and its client is not reading
/// (the socket full): once the client reads again it gets every event the
/// stream had read, whole and in order, then `retry:` (1 to 5 s, as at
/// open) and a comment naming the cause, then the body breaks off without
/// its last chunk, so the client backs off (docs/api.md). The break is a
/// FIN after everything, not a reset, which would throw away what the
/// server's socket still held (it did, on the first-request path, with the
/// reset the writer meant to send). Once Redis has room, each client
/// resumes with its last event id and gets exactly the rest.
#[tokio::test]
async fn a_journal_failure_mid_stream_sends_what_the_stream_had_then_breaks_off() {
    let redis =
        gapless_testkit::redis::Redis::start_with(&["--maxmemory-policy", "noeviction"]).await;
    let s = Server::with(gapless_testkit::Opts {
        args: [
            "--redis",
            &redis.url(),
            "--window-events",
            "4",
            // No heartbeat comment among the frames.
            "--heartbeat-ms",
            "0",
            "--jwt-secret",
            SECRET,
            "--log-format",
            "json",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect(),
        ..gapless_testkit::Opts::default()
    })
    .await;
    let t = token(3600);
    // Read from Redis in pages of about 1 MiB; per stream far more than its
    // sockets hold (the server's send buffer grows up to tcp_wmem's maximum;
    // the client's is 4 KiB), so every stream waits on its client with pages
    // still to read when Redis starts refusing.
    let wmem_max: usize = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem")
        .ok()
        .and_then(|v| v.split_whitespace().nth(2)?.parse().ok())
        .unwrap_or(4 << 20);
    let blob = "z".repeat(256 * 1024);
    let n = ((wmem_max + (4 << 20)) / blob.len()).max(32);
    let runs = CASES.iter().enumerate().map(|(i, &case)| {
        let (s, t, blob) = (&s, &t, &blob);
        async move {
            let channels = case.channels(i);
            for k in 0..n {
                publish(s, &channels[k % channels.len()], &format!("{k:04}{blob}")).await;
            }
            let opts = ConnectOptions {
                recv_buffer: Some(4096),
            };
            let mut c = case
                .open_from(s, &channels, t, "since=earliest", opts)
                .await;
            let pre = c.preamble().await;
            assert!(pre.gaps.is_empty(), "{case:?}: {:?}", pre.gaps);
            (case, channels, c)
        }
    });
    let clients = futures::future::join_all(runs).await;
    // Every stream fills its socket and waits.
    tokio::time::sleep(Duration::from_secs(1)).await;
    redis.cli(&["CONFIG", "SET", "maxmemory", "1"]).await;
    let blob = &blob;
    // The indexes of `got`'s events, after checking each is whole.
    let indexes = move |case: Case, got: &[(String, String)]| -> Vec<usize> {
        got.iter()
            .map(|(t, d)| {
                assert_eq!(t, "message", "{case:?}");
                assert_eq!(d.len(), 4 + blob.len(), "{case:?}");
                d[..4].parse().expect("index")
            })
            .collect()
    };
    let reads = clients
        .into_iter()
        .map(|(case, channels, mut c)| async move {
            let (items, end) = c.until_end(Duration::from_secs(30)).await;
            let got = indexes(case, &events(&items));
            // Every channel's events from its first, in order, none missing.
            for (j, ch) in channels.iter().enumerate() {
                let mine: Vec<usize> = got
                    .iter()
                    .copied()
                    .filter(|k| k % channels.len() == j)
                    .collect();
                let want: Vec<usize> = (0..mine.len()).map(|m| j + m * channels.len()).collect();
                assert_eq!(mine, want, "{case:?}: {ch}");
            }
            assert!(
                !got.is_empty() && got.len() < n,
                "{case:?}: the failure came mid-stream: {} of {n} events",
                got.len()
            );
            let tail: Vec<&Item> = items
                .iter()
                .skip_while(|i| matches!(i, Item::Event(_)))
                .collect();
            let [Item::Retry(ms), Item::Comment(why)] = tail.as_slice() else {
                panic!("{case:?}: after the events, retry: and a comment; got {tail:?}");
            };
            assert!((1_000..=5_000).contains(ms), "{case:?}: retry: {ms}");
            assert!(
                why.trim_start().starts_with("journal_failed: ") && why.contains("OOM"),
                "{case:?}: {why:?}"
            );
            let Next::Broken(how) = &end else {
                panic!("{case:?}: the body breaks off (no last chunk), got {end:?}");
            };
            assert!(
                how.contains("EOF"),
                "{case:?}: a FIN after the frames, not a reset: {how}"
            );
            (case, channels, got, c.last_event_id().to_owned())
        });
    let ended = futures::future::join_all(reads).await;
    // What each stream had read from the journal (its log line) is what
    // its client got.
    let lines = stream_lines(&s.log());
    for (case, channels, got, _) in &ended {
        let name = channels.join(",");
        let line = lines
            .iter()
            .find(|l| l["channels"] == name.as_str())
            .unwrap_or_else(|| panic!("{case:?}: no log line for {name}: {lines:?}"));
        assert_eq!(line["ended"], "journal_failed", "{case:?}");
        assert_eq!(
            line["events"],
            got.len(),
            "{case:?}: the events it read, all sent"
        );
    }
    // Redis has room again: each client resumes from its cursor.
    redis.cli(&["CONFIG", "SET", "maxmemory", "0"]).await;
    let resumes = ended.into_iter().map(|(case, channels, mut all, cursor)| {
        let (s, t) = (&s, &t);
        async move {
            let query = format!("last_event_id={}", gapless_testkit::pct(&cursor));
            let mut c = case
                .open_from(s, &channels, t, &query, ConnectOptions::default())
                .await;
            let pre = c.preamble().await;
            assert!(pre.gaps.is_empty(), "{case:?}: {:?}", pre.gaps);
            let rest: Vec<(String, String)> = c
                .events(n - all.len())
                .await
                .into_iter()
                .map(|e| (e.event, e.data))
                .collect();
            all.extend(indexes(case, &rest));
            all.sort_unstable();
            assert_eq!(
                all,
                (0..n).collect::<Vec<_>>(),
                "{case:?}: every event once"
            );
        }
    });
    futures::future::join_all(resumes).await;
}
