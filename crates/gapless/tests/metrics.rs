//! `GET /metrics` against the real binary: Prometheus text whose counters
//! move with what the server did (publishes by durability, replays, gaps by
//! reason, refusals by code, histograms), open without a token.

mod support;
mod ws_support;

use std::collections::HashMap;
use support::Server;

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
    let mut ws = ws_support::Ws::channels(&s).await;
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
    support::eventually(
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
    let source = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../server/src/metrics.rs"
    ))
    .expect("metrics.rs");
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
