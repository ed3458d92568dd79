//! Subscription reconnection rules against a scripted fake server (each
//! connection gets the next canned answer), where timing and failures are
//! exact: resume from the last *delivered* cursor, a clean close reconnects at
//! once, backoff starts from the server's `retry:`, terminal refusals are not
//! retried, idle streams are dropped, and a non-SSE answer is refused.

use gapless_client::{Backoff, Client, Error, Update};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::time::timeout;

/// What the fake server does with one connection.
#[derive(Clone)]
enum Script {
    /// Write these bytes, then close the connection.
    Close(Vec<u8>),
    /// Write these bytes, then keep the connection open.
    Hold(Vec<u8>),
}

struct Fake {
    url: String,
    /// Each request's head and arrival time.
    requests: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Fake {
    async fn start(scripts: Vec<Script>) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let requests: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
        let log = requests.clone();
        tokio::spawn(async move {
            let mut n = 0;
            while let Ok((mut sock, _)) = listener.accept().await {
                let script = scripts
                    .get(n)
                    .or(scripts.last())
                    .cloned()
                    .unwrap_or(Script::Close(Vec::new()));
                n += 1;
                let log = log.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => head.extend_from_slice(&buf[..k]),
                        }
                    }
                    log.lock()
                        .expect("lock")
                        .push((Instant::now(), String::from_utf8_lossy(&head).into_owned()));
                    match script {
                        Script::Close(bytes) => {
                            let _ = sock.write_all(&bytes).await;
                            let _ = sock.shutdown().await;
                        }
                        Script::Hold(bytes) => {
                            let _ = sock.write_all(&bytes).await;
                            tokio::time::sleep(Duration::from_secs(60)).await;
                        }
                    }
                });
            }
        });
        Fake { url, requests }
    }

    fn requests(&self) -> Vec<(Instant, String)> {
        self.requests.lock().expect("lock").clone()
    }
}

/// A 200 event stream delimited by the connection's close (a clean end).
fn sse(body: &str) -> Vec<u8> {
    format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{body}")
        .into_bytes()
}

/// A chunked event stream cut before its last chunk (a failed connection).
fn sse_cut(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n",
        body.len()
    )
    .into_bytes()
}

fn status(code: u16, error: &str) -> Vec<u8> {
    let body = format!("{{\"error\":\"{error}\",\"message\":\"no\"}}");
    format!(
        "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn event(id: &str, seq: u64) -> String {
    format!("id: {id}\ndata: {{\"channel\":\"c\",\"seq\":{seq},\"type\":null,\"data\":\"e{seq}\",\"time\":1}}\n\n")
}

async fn next(sub: &mut gapless_client::Subscription) -> Option<Result<Update, Error>> {
    timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("no stall")
}

fn last_event_id(head: &str) -> Option<String> {
    head.lines()
        .find_map(|l| l.strip_prefix("last-event-id: "))
        .map(str::to_owned)
}

#[tokio::test]
async fn resumes_from_the_last_delivered_cursor_and_a_clean_close_reconnects_at_once() {
    // The first stream ends cleanly in the middle of event 2: it is never
    // delivered and its id never becomes the cursor.
    let first = format!(
        "retry: 5000\n\nid: c0\n\n{}id: c2\ndata: {{\"channel\":\"c\",\"seq\":2",
        event("c1", 1)
    );
    let fake = Fake::start(vec![
        Script::Close(sse(&first)),
        Script::Hold(sse(&format!("retry: 5000\n\nid: c1\n\n{}", event("c2", 2)))),
    ])
    .await;
    let client = Client::new(&fake.url).expect("url");
    let closes: Arc<Mutex<Vec<(bool, Duration)>>> = Arc::default();
    let log = closes.clone();
    let mut sub = client
        .subscribe(["c"])
        .on_reconnect(move |r| log.lock().expect("lock").push((r.error.is_none(), r.delay)))
        .open();
    match next(&mut sub).await {
        Some(Ok(Update::Event(e))) => assert_eq!((e.seq, e.cursor.as_str()), (1, "c1")),
        other => panic!("{other:?}"),
    }
    match next(&mut sub).await {
        Some(Ok(Update::Event(e))) => assert_eq!((e.seq, e.cursor.as_str()), (2, "c2")),
        other => panic!("{other:?}"),
    }
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2);
    assert!(
        reqs[0]
            .1
            .starts_with("GET /v1/channels/c/sse?format=envelope "),
        "{}",
        reqs[0].1
    );
    assert_eq!(last_event_id(&reqs[0].1), None);
    assert_eq!(last_event_id(&reqs[1].1).as_deref(), Some("c1"));
    // retry: 5000 would have meant a wait of up to 5 s after a failure.
    assert_eq!(
        *closes.lock().expect("lock"),
        [(true, Duration::ZERO)],
        "a clean close, no wait"
    );
    let gap = reqs[1].0.duration_since(reqs[0].0);
    assert!(gap < Duration::from_secs(2), "reconnected after {gap:?}");
}

#[tokio::test]
async fn failures_back_off_from_the_servers_retry_with_full_jitter() {
    let fake = Fake::start(vec![
        Script::Close(sse_cut("retry: 200\n\nid: c0\n\n")),
        Script::Close(status(503, "shutting_down")),
        Script::Close(status(503, "shutting_down")),
        Script::Close(status(503, "shutting_down")),
        Script::Hold(sse(&format!("id: c0\n\n{}", event("c1", 1)))),
    ])
    .await;
    let delays: Arc<Mutex<Vec<(u32, Duration, bool)>>> = Arc::default();
    let log = delays.clone();
    let client = Client::new(&fake.url).expect("url");
    let mut sub = client
        .subscribe(["c"])
        .backoff(Backoff {
            initial: Duration::from_secs(20),
            max: Duration::from_millis(500),
        })
        .on_reconnect(move |r| {
            log.lock().expect("lock").push((
                r.attempt,
                r.delay,
                r.error.is_some_and(|e| !e.is_terminal()),
            ))
        })
        .open();
    match next(&mut sub).await {
        Some(Ok(Update::Event(e))) => assert_eq!(e.seq, 1),
        other => panic!("{other:?}"),
    }
    let delays = delays.lock().expect("lock").clone();
    assert_eq!(delays.len(), 4, "{delays:?}");
    for (i, (attempt, delay, retryable)) in delays.iter().enumerate() {
        assert_eq!(*attempt, i as u32 + 1);
        assert!(retryable);
        // Base 200 ms from the server (not the 20 s initial), doubling, capped at 500 ms.
        let ceiling = Duration::from_millis((200u64 << i).min(500));
        assert!(
            *delay <= ceiling,
            "attempt {attempt}: {delay:?} > {ceiling:?}"
        );
    }
    assert_eq!(last_event_id(&fake.requests()[4].1).as_deref(), Some("c0"));
}

#[tokio::test]
async fn terminal_refusals_are_returned_typed_and_not_retried() {
    for (code, error) in [
        (400, "invalid_request"),
        (401, "unauthorized"),
        (403, "forbidden"),
        (404, "not_found"),
    ] {
        let fake = Fake::start(vec![Script::Close(status(code, error))]).await;
        let retries = Arc::new(Mutex::new(0));
        let count = retries.clone();
        let client = Client::new(&fake.url).expect("url");
        let mut sub = client
            .subscribe(["c"])
            .on_reconnect(move |_| *count.lock().expect("lock") += 1)
            .open();
        match next(&mut sub).await {
            Some(Err(Error::Api(a))) => {
                assert_eq!((a.status, a.code.as_str()), (code, error));
                assert!(a.is_terminal());
            }
            other => panic!("{code}: {other:?}"),
        }
        assert!(
            next(&mut sub).await.is_none(),
            "{code}: the subscription ended"
        );
        assert_eq!(*retries.lock().expect("lock"), 0, "{code}: not retried");
        assert_eq!(fake.requests().len(), 1);
    }
}

#[tokio::test]
async fn a_silent_stream_is_dropped_after_the_idle_timeout() {
    let fake = Fake::start(vec![
        Script::Hold(sse("retry: 10\n\nid: c0\n\n")),
        Script::Hold(sse(&format!("id: c0\n\n{}", event("c1", 1)))),
    ])
    .await;
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = errors.clone();
    let client = Client::new(&fake.url).expect("url");
    let mut sub = client
        .subscribe(["c"])
        .idle_timeout(Some(Duration::from_millis(300)))
        .on_reconnect(move |r| {
            log.lock()
                .expect("lock")
                .push(r.error.map(ToString::to_string).unwrap_or_default())
        })
        .open();
    match next(&mut sub).await {
        Some(Ok(Update::Event(e))) => assert_eq!(e.seq, 1),
        other => panic!("{other:?}"),
    }
    let errors = errors.lock().expect("lock").clone();
    assert_eq!(errors.len(), 1);
    assert!(errors[0].contains("idle timeout"), "{errors:?}");
}

#[tokio::test]
async fn without_reconnect_a_clean_close_ends_and_a_failure_is_returned() {
    let fake = Fake::start(vec![Script::Close(sse(&format!(
        "id: c0\n\n{}",
        event("c1", 1)
    )))])
    .await;
    let client = Client::new(&fake.url).expect("url");
    let mut sub = client.subscribe(["c"]).reconnect(false).open();
    assert!(matches!(next(&mut sub).await, Some(Ok(Update::Event(_)))));
    assert!(next(&mut sub).await.is_none());
    assert_eq!(sub.cursor().map(|c| c.into_string()).as_deref(), Some("c1"));

    let fake = Fake::start(vec![Script::Close(sse_cut("id: c0\n\n"))]).await;
    let client = Client::new(&fake.url).expect("url");
    let mut sub = client.subscribe(["c"]).reconnect(false).open();
    match next(&mut sub).await {
        Some(Err(e @ Error::Disconnected { .. })) => assert!(!e.is_terminal()),
        other => panic!("{other:?}"),
    }
    assert!(next(&mut sub).await.is_none());
}

#[tokio::test]
async fn an_answer_that_is_not_an_event_stream_is_refused() {
    let body = "<html>hi</html>";
    let resp = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let fake = Fake::start(vec![Script::Close(resp.into_bytes())]).await;
    let client = Client::new(&fake.url).expect("url");
    let err = client
        .subscribe(["c"])
        .connect()
        .await
        .expect_err("not SSE");
    assert!(matches!(err, Error::Protocol { .. }), "{err:?}");
    assert!(err.is_terminal());
    // Likewise a garbage frame on a real event stream.
    let fake = Fake::start(vec![Script::Hold(sse(
        "id: c0\n\nid: c1\ndata: not json\n\n",
    ))])
    .await;
    let client = Client::new(&fake.url).expect("url");
    let mut sub = client.subscribe(["c"]).open();
    assert!(matches!(
        next(&mut sub).await,
        Some(Err(Error::Protocol { .. }))
    ));
}

#[tokio::test]
async fn several_channels_use_the_multi_channel_url() {
    let fake = Fake::start(vec![Script::Hold(sse("id: c0\n\n"))]).await;
    let client = Client::new(&fake.url).expect("url");
    let sub = client
        .subscribe(["a", "b"])
        .since_earliest()
        .connect()
        .await
        .expect("connect");
    assert_eq!(sub.cursor().map(|c| c.into_string()).as_deref(), Some("c0"));
    let head = &fake.requests()[0].1;
    assert!(
        head.starts_with("GET /v1/sse?channel=a&channel=b&format=envelope&since=earliest "),
        "{head}"
    );
}
