//! `GET /metrics` against the real binary: Prometheus text whose counters
//! move with what the server did (publishes by durability, replays, gaps by
//! reason, refusals by code, histograms), open without a token.

use gapless_testkit::{stream_lines, Server};
use std::collections::HashMap;

/// Parses the Prometheus text format into `name{labels}` -> value.
fn scrape(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

async fn metrics(s: &Server) -> HashMap<String, f64> {
    let r = s.get("/metrics").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(
        r.header("content-type")
            .is_some_and(|c| c.starts_with("text/plain")),
        "{:?}",
        r.headers
    );
    scrape(&r.text)
}

#[tokio::test]
async fn counters_follow_what_the_server_did() {
    let mut s = Server::memory(&[]).await;
    for i in 0..3 {
        s.publish("m", &format!("e{i}")).await;
    }
    let cursor = s.publish("m", "e3").await["cursor"]
        .as_str()
        .expect("cursor")
        .to_owned();
    s.post("/v1/channels/m/events?ephemeral=true", "x", &[])
        .await;
    s.get("/v1/channels/bad%20name").await;
    s.get("/v1/channels/m/events?after=garbage").await;
    // A resume served whole: one replay of the events after the second.
    let first = s.all_events("m").await[0]["cursor"]
        .as_str()
        .expect("cursor")
        .to_owned();
    let (mut sub, _) = s.resume("m", &first).await;
    sub.events(3).await;
    let m = metrics(&s).await;
    assert_eq!(
        m.get("gapless_events_published_total{durability=\"memory\"}"),
        Some(&4.0),
        "{m:?}"
    );
    assert_eq!(
        m.get("gapless_events_published_total{durability=\"ephemeral\"}"),
        Some(&1.0)
    );
    assert_eq!(
        m.get("gapless_refusals_total{code=\"invalid_channel\"}"),
        Some(&1.0)
    );
    assert_eq!(
        m.get("gapless_refusals_total{code=\"invalid_cursor\"}"),
        Some(&1.0)
    );
    assert_eq!(m.get("gapless_replays_total"), Some(&1.0));
    assert_eq!(m.get("gapless_events_replayed_total"), Some(&3.0));
    assert_eq!(m.get("gapless_publish_seconds_count"), Some(&4.0));
    assert_eq!(m.get("gapless_subscribers"), Some(&1.0));
    assert_eq!(m.get("gapless_channels_followed"), Some(&1.0));
    drop(sub);

    // A --memory restart: the resume gets an epoch gap, counted by reason.
    s.restart().await;
    let (_sub, pre) = s.resume("m", &cursor).await;
    assert_eq!(pre.gaps.len(), 1);
    let m = metrics(&s).await;
    assert_eq!(
        m.get("gapless_gaps_total{reason=\"epoch\"}"),
        Some(&1.0),
        "{m:?}"
    );
}

#[tokio::test]
async fn the_embedded_journal_reports_its_size_commit_time_and_durability() {
    let s = Server::start(&["--durability", "async"]).await;
    s.publish("m", "x").await;
    let m = metrics(&s).await;
    assert_eq!(
        m.get("gapless_events_published_total{durability=\"async\"}"),
        Some(&1.0),
        "{m:?}"
    );
    assert!(
        m.get("gapless_journal_size_bytes")
            .is_some_and(|b| *b > 0.0),
        "{m:?}"
    );
    assert!(
        m.get("gapless_journal_commit_seconds_count")
            .is_some_and(|n| *n >= 1.0),
        "{m:?}"
    );
}

#[tokio::test]
async fn metrics_need_no_token() {
    let s = Server::memory(&["--jwt-secret", "a-test-secret-that-is-long-enough-32"]).await;
    s.get("/v1/channels/m")
        .await
        .expect_error(401, "unauthorized");
    let m = metrics(&s).await;
    assert_eq!(
        m.get("gapless_refusals_total{code=\"unauthorized\"}"),
        Some(&1.0),
        "{m:?}"
    );
}

#[tokio::test]
async fn deliveries_are_counted_per_transport_with_lag_histograms_and_open_connections() {
    let s = Server::memory(&[]).await;
    let (mut sse, _) = s.subscribe("d", "").await;
    let mut ws = gapless_testkit::ws::Ws::channels(&s).await;
    ws.subscribe_live("d").await;
    for i in 0..5 {
        s.publish("d", &format!("e{i}")).await;
    }
    sse.events(5).await;
    for _ in 0..5 {
        ws.expect_op("event").await;
    }
    let m = metrics(&s).await;
    assert_eq!(
        m.get("gapless_events_delivered_total{transport=\"sse\"}"),
        Some(&5.0),
        "{m:?}"
    );
    assert_eq!(
        m.get("gapless_events_delivered_total{transport=\"ws\"}"),
        Some(&5.0),
        "{m:?}"
    );
    assert!(
        m.get("gapless_bytes_written_total{transport=\"sse\"}")
            .is_some_and(|b| *b > 50.0),
        "{m:?}"
    );
    assert!(
        m.get("gapless_bytes_written_total{transport=\"ws\"}")
            .is_some_and(|b| *b > 50.0),
        "{m:?}"
    );
    assert!(
        m.get("gapless_delivery_lag_seconds_count{transport=\"sse\"}")
            .is_some_and(|n| *n >= 1.0),
        "{m:?}"
    );
    assert!(
        m.get("gapless_subscriber_lag_events_count")
            .is_some_and(|n| *n >= 2.0),
        "{m:?}"
    );
    assert_eq!(
        m.get("gapless_connections_open{transport=\"sse\"}"),
        Some(&1.0),
        "{m:?}"
    );
    assert_eq!(
        m.get("gapless_connections_open{transport=\"ws\"}"),
        Some(&1.0),
        "{m:?}"
    );
    drop(sse);
    ws.close().await;
    gapless_testkit::eventually(
        "closed connections stop counting",
        std::time::Duration::from_secs(5),
        || async {
            let m = metrics(&s).await;
            m.get("gapless_connections_open{transport=\"sse\"}") == Some(&0.0)
                && m.get("gapless_connections_open{transport=\"ws\"}") == Some(&0.0)
        },
    )
    .await;
}

/// Every metric the Grafana dashboard queries is one the server exports.
#[tokio::test]
async fn the_grafana_dashboard_queries_only_exported_metrics() {
    let dashboard = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/grafana/gapless.json"
    ))
    .expect("deploy/grafana/gapless.json");
    // The names are in metrics.rs, but for the refusals' counter, which
    // error.rs names (it imports no part of the server; metrics.rs
    // re-exports it).
    let source = ["metrics.rs", "error.rs"]
        .map(|f| {
            let path = format!("{}/../server/src/{f}", env!("CARGO_MANIFEST_DIR"));
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
        })
        .concat();
    let mut names: Vec<&str> = dashboard
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("gapless_"))
        .collect();
    names.sort_unstable();
    names.dedup();
    assert!(names.len() > 10, "{names:?}");
    for n in names {
        let base = n
            .trim_end_matches("_bucket")
            .trim_end_matches("_count")
            .trim_end_matches("_sum");
        assert!(
            source.contains(&format!("\"{base}\"")),
            "{n} is not an exported metric"
        );
    }
}

/// One log line per stream at its end, at the default level: transport,
/// channels, duration, events and gaps sent, and why it ended; nothing per
/// event.
#[tokio::test]
async fn each_stream_logs_one_line_when_it_ends() {
    use std::time::Duration;
    let s = Server::with(gapless_testkit::Opts {
        memory: true,
        args: vec!["--log-format".into(), "json".into()],
        ..gapless_testkit::Opts::default()
    })
    .await;
    s.publish("logged", "before").await;
    // SSE from the start (1 event replayed), then 3 live; the client closes.
    let (mut sse, _) = s.subscribe("logged", "since=earliest").await;
    for i in 0..3 {
        s.publish("logged", &format!("live {i}")).await;
    }
    assert_eq!(sse.events(4).await.len(), 4);
    // A resume from a cursor of another epoch gets a gap notice first.
    let epoch = s.epoch("logged").await;
    let other = format!("{:016x}", u64::from_str_radix(&epoch, 16).expect("hex") ^ 1);
    let other = gapless_testkit::make_cursor("logged", &other, 1);
    let (mut gapped, pre) = s.resume("logged", &other).await;
    assert!(!pre.gaps.is_empty(), "expected a gap notice at the open");
    drop(sse);
    // A WebSocket that subscribes from the start and reads all 4, then closes.
    let mut ws = gapless_testkit::ws::Ws::channels(&s).await;
    ws.subscribe(
        serde_json::json!(1),
        "logged",
        serde_json::json!({"since": "earliest"}),
    )
    .await;
    ws.read_until_seq("logged", 4, Duration::from_secs(5)).await;
    ws.close().await;
    gapless_testkit::eventually("two stream lines", Duration::from_secs(5), || {
        let n = stream_lines(&s.log()).len();
        async move { n >= 2 }
    })
    .await;
    let lines = stream_lines(&s.log());
    let sse_line = lines
        .iter()
        .find(|l| l["transport"] == "sse")
        .unwrap_or_else(|| panic!("no sse line: {lines:?}"));
    assert_eq!(sse_line["channels"], "logged");
    assert_eq!(sse_line["events"], 4);
    assert_eq!(sse_line["gaps"], 0);
    assert_eq!(sse_line["ended"], "client_closed");
    assert!(sse_line["duration_ms"].as_u64().is_some());
    let ws_line = lines
        .iter()
        .find(|l| l["transport"] == "ws")
        .unwrap_or_else(|| panic!("no ws line: {lines:?}"));
    assert_eq!(ws_line["channels"], "logged");
    assert_eq!(ws_line["events"], 4);
    assert_eq!(ws_line["ended"], "client_closed");
    // The gapped stream ends with the server: shutdown, one gap.
    gapped.next_within(Duration::from_millis(50)).await;
    let mut s = s;
    s.sigterm().await;
    let lines = stream_lines(&s.log());
    let last = lines
        .iter()
        .find(|l| l["transport"] == "sse" && l["gaps"] == 1)
        .unwrap_or_else(|| panic!("no line for the gapped stream: {lines:?}"));
    assert_eq!(last["ended"], "shutdown");
    assert_eq!(
        lines.len(),
        3,
        "one line per stream, none per event: {lines:?}"
    );
}

#[tokio::test]
async fn every_metric_has_a_help_line() {
    let s = Server::start(&["--max-connections-per-ip", "3"]).await;
    let (mut sse, _) = s.subscribe("h", "").await;
    let mut ws = gapless_testkit::ws::Ws::channels(&s).await;
    ws.subscribe_live("h").await;
    s.publish("h", "x").await;
    sse.events(1).await;
    ws.expect_op("event").await;
    s.get("/v1/channels/bad%20name").await;
    // Every place of the address is held (the stream, the socket, reqwest's
    // connection): one refusal by the per-IP cap.
    let mut refused = gapless_testkit::SseClient::connect(s.addr, "/v1/channels/h/sse", &[]).await;
    let _ = refused.until_end(std::time::Duration::from_secs(5)).await;
    drop(ws);
    let text = s.get("/metrics").await.text;
    let types: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    assert!(types.len() >= 12, "most metrics recorded: {text}");
    for name in types {
        let help = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("# HELP {name} ")))
            .unwrap_or_else(|| panic!("no # HELP for {name}: {text}"));
        assert!(help.len() > 20, "{name}: a description: {help:?}");
    }
}

/// `gapless_channel_purges_total` counts the purges answered 204 (also of
/// a channel never published to), not a refused one.
#[tokio::test]
async fn purges_are_counted() {
    let s = Server::memory(&[]).await;
    s.publish("pm", "x").await;
    for (path, status) in [
        ("/v1/channels/pm", 204),
        ("/v1/channels/pm-never", 204),
        ("/v1/channels/bad%20name", 400),
    ] {
        let r = s.request("DELETE", path, &[], "").await;
        assert_eq!(r.status, status, "{path}: {}", r.text);
    }
    let m = metrics(&s).await;
    assert_eq!(m.get("gapless_channel_purges_total"), Some(&2.0), "{m:?}");
    let text = s.get("/metrics").await.text;
    assert!(
        text.contains("# HELP gapless_channel_purges_total "),
        "described: {text}"
    );
}

/// Durable Streams answers are counted as every other room's: a refused
/// append in `gapless_refusals_total` by its registry code, the messages a
/// catch-up, a long-poll and an SSE read deliver in
/// `gapless_events_delivered_total{transport="ds"}`, and an SSE read's end
/// in the one stream log line (`transport` `ds`, why it ended).
#[tokio::test]
async fn durable_streams_refusals_deliveries_and_stream_ends_are_counted() {
    use std::time::Duration;
    let s = Server::with(gapless_testkit::Opts {
        memory: true,
        args: vec![
            "--log-format".into(),
            "json".into(),
            "--ds-long-poll-timeout-ms".into(),
            "5000".into(),
        ],
        ..gapless_testkit::Opts::default()
    })
    .await;
    let json = [("content-type", "application/json")];
    // Refused: an append to a stream that does not exist, and a bad offset.
    let r = s.request("POST", "/ds/none", &json, "[1]").await;
    r.expect_error(404, "stream_not_found");
    let r = s.request("PUT", "/ds/m", &json, "[1,2,3]").await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = s.get("/ds/m?offset=garbage").await;
    r.expect_error(400, "invalid_offset");
    // Delivered: a catch-up (3), a long-poll (1), an SSE read of a closed stream (4).
    let r = s.get("/ds/m?offset=-1").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let tail = r.header("stream-next-offset").expect("offset").to_owned();
    let poll = {
        let url = s.url(&format!("/ds/m?offset={tail}&live=long-poll"));
        let http = s.http.clone();
        tokio::spawn(async move { http.get(url).send().await.map(|r| r.status().as_u16()) })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = s.request("POST", "/ds/m", &json, "4").await;
    assert_eq!(r.status, 204, "{}", r.text);
    assert_eq!(poll.await.ok().and_then(Result::ok), Some(200));
    let r = s
        .request("POST", "/ds/m", &[json[0], ("stream-closed", "true")], "")
        .await;
    assert_eq!(r.status, 204, "{}", r.text);
    let r = s.get("/ds/m?offset=-1&live=sse").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.text.contains("streamClosed"), "{}", r.text);

    let m = metrics(&s).await;
    assert_eq!(
        m.get("gapless_refusals_total{code=\"stream_not_found\"}"),
        Some(&1.0),
        "{m:?}"
    );
    assert_eq!(
        m.get("gapless_refusals_total{code=\"invalid_offset\"}"),
        Some(&1.0),
        "{m:?}"
    );
    assert_eq!(
        m.get("gapless_events_delivered_total{transport=\"ds\"}"),
        Some(&8.0),
        "{m:?}"
    );
    gapless_testkit::eventually("the ds stream line", Duration::from_secs(5), || {
        let n = stream_lines(&s.log())
            .iter()
            .filter(|l| l["transport"] == "ds")
            .count();
        async move { n >= 1 }
    })
    .await;
    let lines = stream_lines(&s.log());
    let ds = lines
        .iter()
        .find(|l| l["transport"] == "ds")
        .unwrap_or_else(|| panic!("no ds line: {lines:?}"));
    assert_eq!(ds["channels"], "m");
    assert_eq!(ds["events"], 4);
    assert_eq!(ds["ended"], "stream_closed");
}
