//! The Rust SDK and the CLI with tokens (`docs/security.md`): a token
//! callback keeps SSE, WebSocket and session streams whole across token
//! expiries (every event once, in order), a fixed token that runs out ends
//! the stream with `unauthorized`, and `gapless token` / `--token` work
//! together.

use gapless_client::{Client, Update};
use gapless_testkit::clients;
use gapless_testkit::Server;
use jsonwebtoken::{EncodingKey, Header};
use serde_json::json;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SECRET: &str = "a-test-secret-that-is-long-enough-32";

/// A token that is honoured for at least `ttl_s` seconds: `exp` is whole
/// seconds (RFC 7519 section 4.1.4), so it is rounded up, never down (a token
/// minted at x.999 s with `exp = x + 1` would expire 1 ms later).
fn token(subscribe: &[&str], publish: &[&str], ttl_s: u64) -> String {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let exp = (now_ms + ttl_s * 1000).div_ceil(1000);
    let claims = json!({"exp": exp, "gapless": {"subscribe": subscribe, "publish": publish}});
    jsonwebtoken::encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()).expect("key"),
    )
    .expect("sign")
}

async fn server() -> Server {
    clients::memory(&["--jwt-secret", SECRET, "--jwt-leeway-ms", "0"]).await
}

/// A client whose callback mints a 1-second token on every call, counting calls.
fn refreshing(server: &Server, calls: Arc<AtomicUsize>) -> Client {
    Client::builder(&server.base())
        .token_fn(move || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Ok(token(&["c", "session/*"], &[], 1)) }
        })
        .build()
        .expect("client")
}

/// Publishes `n` events to `c`, 50 ms apart, with its own long-lived token.
fn publisher(server: &Server, n: u64) -> tokio::task::JoinHandle<()> {
    let client = Client::builder(&server.base())
        .token(token(&[], &["c", "session/*"], 3600))
        .build()
        .expect("client");
    tokio::spawn(async move {
        for i in 1..=n {
            client
                .publish("c", format!("e{i}"))
                .send()
                .await
                .expect("publish");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

async fn collect(
    mut next: impl FnMut() -> futures::future::BoxFuture<'static, Option<Update>>,
    n: usize,
) -> Vec<u64> {
    let mut seqs = Vec::new();
    while seqs.len() < n {
        match tokio::time::timeout(Duration::from_secs(10), next()).await {
            Ok(Some(Update::Event(e))) => seqs.push(e.seq),
            Ok(Some(other)) => panic!("only events expected: {other:?}"),
            Ok(None) => panic!("the subscription ended after {seqs:?}"),
            Err(_) => panic!("nothing within 10 s after {seqs:?}"),
        }
    }
    seqs
}

#[tokio::test]
async fn a_token_callback_keeps_sse_and_websocket_streams_whole_across_expiries() {
    let server = server().await;
    let n = 50u64;
    let calls = Arc::new(AtomicUsize::new(0));
    let client = refreshing(&server, calls.clone());
    let sse = Arc::new(tokio::sync::Mutex::new(
        client.subscribe(["c"]).since_earliest().open(),
    ));
    let ws = Arc::new(tokio::sync::Mutex::new(
        client.subscribe_ws(["c"]).since_earliest().open(),
    ));
    let p = publisher(&server, n);
    let (a, b) = tokio::join!(
        collect(
            || {
                let s = sse.clone();
                Box::pin(async move { s.lock().await.next().await.map(|r| r.expect("sse update")) })
            },
            n as usize
        ),
        collect(
            || {
                let s = ws.clone();
                Box::pin(async move { s.lock().await.next().await.map(|r| r.expect("ws update")) })
            },
            n as usize
        ),
    );
    p.await.expect("publisher");
    let want: Vec<u64> = (1..=n).collect();
    assert_eq!(a, want, "SSE: every event once, in order");
    assert_eq!(b, want, "WebSocket: every event once, in order");
    // 2.5 s of publishing with 1 s tokens: both streams reconnected with fresh ones.
    assert!(
        calls.load(Ordering::SeqCst) >= 4,
        "the callback was asked again at each expiry: {}",
        calls.load(Ordering::SeqCst)
    );
}

#[tokio::test]
async fn a_session_consumer_resumes_across_an_expiry_with_a_fresh_token() {
    let server = server().await;
    let producer = Client::builder(&server.base())
        .token(token(&[], &["session/*"], 3600))
        .build()
        .expect("client");
    let id = producer.create_session(None).await.expect("create").id;
    let calls = Arc::new(AtomicUsize::new(0));
    let consumer = refreshing(&server, calls.clone());
    let mut stream = consumer.attach_session(&id).last_seq(1).open();
    let n = 40u64;
    let feed = {
        let id = id.clone();
        tokio::spawn(async move {
            for i in 1..=n {
                producer
                    .append_session(&id, format!("s{i}"))
                    .send()
                    .await
                    .expect("append");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let mut datas = Vec::new();
    while datas.len() < n as usize {
        match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
            Ok(Some(Ok(gapless_client::SessionUpdate::Event(e)))) => datas.push(e.data),
            Ok(Some(Ok(_))) => {}
            other => panic!("after {datas:?}: {other:?}"),
        }
    }
    feed.await.expect("producer");
    let want: Vec<String> = (1..=n).map(|i| format!("s{i}")).collect();
    assert_eq!(datas, want);
    assert!(
        calls.load(Ordering::SeqCst) >= 2,
        "reattached with a fresh token"
    );
}

#[tokio::test]
async fn a_fixed_token_that_runs_out_ends_the_stream_with_unauthorized() {
    let server = server().await;
    let client = Client::builder(&server.base())
        .token(token(&["c"], &[], 1))
        .build()
        .expect("client");
    let mut sub = client.subscribe(["c"]).open();
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match sub.next().await {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Some(e),
                None => return None,
            }
        }
    })
    .await
    .expect("the stream ends within 10 s");
    let e = end.expect("an error, not a silent end");
    assert!(e.is_terminal(), "{e}");
    assert_eq!(
        e.api().map(|a| a.code.as_str()),
        Some("unauthorized"),
        "{e}"
    );
}

#[tokio::test]
async fn the_cli_makes_a_token_and_uses_it() {
    let server = server().await;
    let bin = gapless_testkit::bin();
    let made = Command::new(&bin)
        .args([
            "token",
            "--subscribe",
            "news",
            "--publish",
            "news",
            "--ttl",
            "60",
        ])
        .env("GAPLESS_JWT_SECRET", SECRET)
        .output()
        .expect("gapless token");
    assert!(made.status.success(), "{made:?}");
    let t = String::from_utf8(made.stdout).expect("utf-8");
    let t = t.trim();
    assert_eq!(t.split('.').count(), 3, "a JWT: {t}");

    let publish = |token: Option<&str>, channel: &str| {
        let mut cmd = Command::new(&bin);
        cmd.args(["publish", channel, "hello", "--server", &server.base()]);
        cmd.env_remove("GAPLESS_TOKEN");
        if let Some(t) = token {
            cmd.env("GAPLESS_TOKEN", t);
        }
        cmd.output().expect("gapless publish")
    };
    let ok = publish(Some(t), "news");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let none = publish(None, "news");
    assert!(!none.status.success());
    assert!(
        String::from_utf8_lossy(&none.stderr).contains("--token"),
        "says how to pass a token: {}",
        String::from_utf8_lossy(&none.stderr)
    );
    let forbidden = publish(Some(t), "other");
    assert!(!forbidden.status.success());
    assert!(
        String::from_utf8_lossy(&forbidden.stderr).contains("does not allow"),
        "{}",
        String::from_utf8_lossy(&forbidden.stderr)
    );
    let history = Command::new(&bin)
        .args(["history", "news", "--server", &server.base(), "--token", t])
        .output()
        .expect("gapless history");
    assert!(history.status.success(), "{history:?}");
    assert_eq!(String::from_utf8_lossy(&history.stdout).trim(), "hello");
    // Without any key to sign with, `gapless token` says what to give.
    let keyless = Command::new(&bin)
        .args(["token", "--subscribe", "x"])
        .env_remove("GAPLESS_JWT_SECRET")
        .output()
        .expect("gapless token");
    assert!(!keyless.status.success());
    assert!(String::from_utf8_lossy(&keyless.stderr).contains("--secret"));
}
