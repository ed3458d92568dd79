//! Server settings: the connection limit, environment variables for flags,
//! CORS origins, and retention by age.

use gapless_testkit::{Opts, Server, SseClient};
use std::time::{Duration, Instant};

#[tokio::test]
async fn connection_over_max_connections_is_503_limit_reached() {
    let s = Server::start(&["--max-connections", "2"]).await;
    let (a, _) = s.subscribe("c", "").await;
    let (_b, _) = s.subscribe("c", "").await;
    let third = s.get("/v1/channels/c").await;
    assert!(third.header("retry-after").is_some(), "{:?}", third.headers);
    let body = third.expect_error(503, "limit_reached");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains('2') && m.contains("--max-connections")),
        "names the limit: {body}"
    );
    // Probes keep answering at the cap.
    let mut probe = SseClient::connect(s.addr, "/healthz", &[]).await;
    assert_eq!(probe.status, 200);
    assert_eq!(probe.body_json().await["status"], "ok");
    drop(a);
    // A slot frees when a connection closes.
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    gapless_testkit::eventually("a connection slot frees up", Duration::from_secs(5), || {
        let client = client.clone();
        let url = s.url("/healthz");
        async move {
            client
                .get(url)
                .send()
                .await
                .is_ok_and(|r| r.status() == 200)
        }
    })
    .await;
}

#[tokio::test]
async fn flags_read_gapless_environment_variables_and_the_flag_wins() {
    let env = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let s = Server::with(Opts {
        env: env(&[
            ("GAPLESS_MAX_EVENT_BYTES", "5"),
            ("GAPLESS_RETRY_MS", "1234"),
        ]),
        ..Opts::default()
    })
    .await;
    s.publish("c", "12345").await;
    let r = s.post("/v1/channels/c/events", "123456", &[]).await;
    assert_eq!(r.expect_error(413, "too_large")["limit"], 5);
    let (_, pre) = s.subscribe("c", "").await;
    assert_eq!(pre.retry, 1234);

    let s = Server::with(Opts {
        args: vec!["--retry-ms".into(), "777".into()],
        env: env(&[
            ("GAPLESS_RETRY_MS", "1234"),
            ("GAPLESS_RETENTION_EVENTS", "2"),
        ]),
        ..Opts::default()
    })
    .await;
    let (_, pre) = s.subscribe("c", "").await;
    assert_eq!(pre.retry, 777, "the command line wins over the environment");
    s.publish_many("c", "e", 3).await;
    assert_eq!(
        s.info("c").await["floor"],
        2,
        "GAPLESS_RETENTION_EVENTS applies"
    );

    // GAPLESS_MEMORY: a restart is a new epoch.
    let mut m = Server::with(Opts {
        env: env(&[("GAPLESS_MEMORY", "true")]),
        ..Opts::default()
    })
    .await;
    let e1 = m.epoch("c").await;
    m.restart().await;
    assert_ne!(m.epoch("c").await, e1);
}

#[tokio::test]
async fn cors_origins_any_list_or_none() {
    async fn allow_origin(s: &Server, origin: &str) -> Option<String> {
        let r = s
            .send(s.http.get(s.url("/healthz")).header("Origin", origin))
            .await;
        r.header("access-control-allow-origin").map(str::to_owned)
    }
    let any = Server::memory(&[]).await;
    assert_eq!(
        allow_origin(&any, "https://a.example").await.as_deref(),
        Some("*")
    );

    let list = Server::memory(&["--cors-origin", "https://a.example,https://b.example"]).await;
    assert_eq!(
        allow_origin(&list, "https://b.example").await.as_deref(),
        Some("https://b.example")
    );
    assert_eq!(allow_origin(&list, "https://evil.example").await, None);
    // A preflight for a resuming EventSource-like request with Last-Event-ID.
    let r = list
        .send(
            list.http
                .request(reqwest::Method::OPTIONS, list.url("/v1/channels/c/sse"))
                .header("Origin", "https://a.example")
                .header("Access-Control-Request-Method", "GET")
                .header("Access-Control-Request-Headers", "last-event-id"),
        )
        .await;
    assert!(r.status < 300, "preflight answered {}", r.status);
    assert!(
        r.header("access-control-allow-headers")
            .is_some_and(|h| h.to_ascii_lowercase().contains("last-event-id")),
        "{:?}",
        r.headers
    );

    let none = Server::memory(&["--cors-origin", ""]).await;
    assert_eq!(allow_origin(&none, "https://a.example").await, None);
}

#[tokio::test]
async fn age_retention_evicts_within_about_a_second_of_expiry() {
    let s = Server::start(&["--retention-ms", "500"]).await;
    let first = s.publish("c", "a").await["cursor"]
        .as_str()
        .expect("cursor")
        .to_owned();
    s.publish("c", "b").await;
    let acked = Instant::now();
    gapless_testkit::eventually("events expire", Duration::from_secs(5), || async {
        s.history("c", "").await.expect(200)["events"]
            .as_array()
            .is_some_and(|e| e.is_empty())
    })
    .await;
    let took = acked.elapsed();
    // 500 ms of age plus at most 1 s of lag, with some slack for a busy machine.
    assert!(took < Duration::from_millis(2000), "expired after {took:?}");
    assert!(
        took >= Duration::from_millis(400),
        "expired too early: {took:?}"
    );
    let info = s.info("c").await;
    assert_eq!(
        (info["floor"].clone(), info["head"].clone()),
        (3.into(), 2.into()),
        "head stays, floor passes it"
    );
    let r = s.history("c", &format!("after={first}")).await;
    assert_eq!(
        r.expect_error(410, "cursor_not_served")["reason"],
        "evicted"
    );
    // New events get the next seqs.
    assert_eq!(s.publish("c", "c").await["seq"], 3);
}

#[tokio::test]
async fn zero_means_no_limit_for_connection_limits_and_is_refused_where_there_is_none() {
    // --max-connections 0, like --max-connections-per-ip 0: no limit.
    let s = Server::memory(&["--max-connections", "0", "--max-connections-per-ip", "0"]).await;
    let (_a, _) = s.subscribe("c", "").await;
    let (_b, _) = s.subscribe("c", "").await;
    s.get("/v1/channels/c").await.expect(200);
    s.publish("c", "x").await;
    // A size limit without a "no limit" value refuses 0 at start.
    for flag in [
        "--max-event-bytes",
        "--max-batch-events",
        "--max-batch-bytes",
        "--ws-max-message-bytes",
        "--window-events",
        "--window-bytes",
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gapless"))
            .args(["serve", "--memory", "--listen", "127.0.0.1:0", flag, "0"])
            .output()
            .expect("run gapless");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} 0: {err}");
        assert!(
            err.contains(flag) && err.contains("at least 1"),
            "{flag}: {err}"
        );
    }
    // --help says what 0 means.
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_gapless"))
        .args(["serve", "--help"])
        .output()
        .expect("run gapless");
    let help = String::from_utf8_lossy(&help.stdout).replace('\n', " ");
    assert!(
        help.contains("Most open client connections; 0 = no limit"),
        "--max-connections: {help}"
    );
}
