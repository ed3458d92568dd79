//! The SDK's exact join (`Client::join`) against the real server: publishes
//! forced into every window of the join (before the live stream opens, between
//! its opening and the history walk, between pages, during the drain, while
//! following), concurrent publishers, clean and killed restarts, evicted
//! cursors and folding. Each durable seq must be delivered once, in order.

use gapless_client::join::JoinPhase;
use gapless_client::{Client, Error, Folded, GapReason, Join, Update};
use gapless_testkit::clients::{self, assert_exactly_once, publish_surely};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::timeout;

/// Reads the join until an event with `data` arrives; returns every event's (seq, data).
async fn read_until(join: &mut Join, data: &str) -> Vec<(u64, String)> {
    let mut got = Vec::new();
    loop {
        match timeout(Duration::from_secs(30), join.next()).await {
            Ok(Some(Ok(Update::Event(e)))) => {
                let end = e.data == data;
                got.push((e.seq, e.data));
                if end {
                    return got;
                }
            }
            Ok(Some(Ok(Update::Ephemeral(_) | Update::Presence(_)))) => {}
            Ok(Some(Ok(Update::Gap(g)))) => panic!("unexpected gap {g:?}"),
            Ok(Some(Err(e))) => panic!("join failed: {e}"),
            Ok(None) => panic!("join ended early after {got:?}"),
            Err(_) => panic!("join stalled after {got:?}"),
        }
    }
}

async fn history_data(client: &Client, channel: &str) -> Vec<(u64, String)> {
    use futures::TryStreamExt;
    let all: Vec<_> = client
        .history(channel)
        .stream()
        .try_collect()
        .await
        .expect("history");
    all.into_iter().map(|e| (e.seq, e.data)).collect()
}

#[tokio::test]
async fn publishes_in_every_window_are_delivered_once_in_order() {
    let server = clients::memory(&[]).await;
    let client = server.client();
    for i in 1..=5 {
        client
            .publish("w", format!("pre{i}"))
            .send()
            .await
            .expect("publish");
    }
    let phases: Arc<Mutex<Vec<JoinPhase>>> = Arc::default();
    let budget = Arc::new(AtomicUsize::new(60));
    let (log, hook_client, left) = (phases.clone(), client.clone(), budget.clone());
    let mut join = client
        .join("w")
        .page_size(2)
        .phase_hook(move |p| {
            log.lock().expect("lock").push(p);
            let (c, left) = (hook_client.clone(), left.clone());
            async move {
                let n = match p {
                    JoinPhase::BeforeLive | JoinPhase::LiveOpen => 2,
                    JoinPhase::Page { .. } | JoinPhase::Drain { .. } => 1,
                    JoinPhase::Following => 0,
                };
                for i in 0..n {
                    if left
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| b.checked_sub(1))
                        .is_ok()
                    {
                        c.publish("w", format!("{p:?}#{i}"))
                            .send()
                            .await
                            .expect("hook publish");
                    }
                }
            }
        })
        .open();
    // Read until the join follows live (every window has passed), then mark the end.
    let mut got = Vec::new();
    while !phases.lock().expect("lock").contains(&JoinPhase::Following) {
        match timeout(Duration::from_secs(30), join.next()).await {
            Ok(Some(Ok(Update::Event(e)))) => got.push((e.seq, e.data)),
            other => panic!("unexpected {other:?}"),
        }
    }
    let published = 60 - budget.load(Ordering::SeqCst) as u64;
    client.publish("w", "end").send().await.expect("publish");
    got.extend(read_until(&mut join, "end").await);
    let seqs: Vec<u64> = got.iter().map(|(s, _)| *s).collect();
    let head = seqs.last().copied().unwrap_or(0);
    assert_exactly_once(&seqs, head);
    assert_eq!(
        got,
        history_data(&client, "w").await,
        "same events as history"
    );
    assert_eq!(head, 5 + published + 1);

    let phases = phases.lock().expect("lock").clone();
    let saw = |f: &dyn Fn(&JoinPhase) -> bool| phases.iter().any(f);
    assert!(saw(&|p| *p == JoinPhase::BeforeLive));
    assert!(saw(&|p| *p == JoinPhase::LiveOpen));
    assert!(
        saw(&|p| matches!(p, JoinPhase::Page { done: false, .. })),
        "between pages"
    );
    assert!(
        saw(&|p| matches!(p, JoinPhase::Page { done: true, .. })),
        "after the tip"
    );
    assert!(
        saw(&|p| matches!(p, JoinPhase::Drain { .. })),
        "during the drain: {phases:?}"
    );
    assert!(saw(&|p| *p == JoinPhase::Following));
}

#[tokio::test]
async fn a_concurrent_publisher_never_causes_a_loss_or_a_duplicate() {
    let server = clients::memory(&[]).await;
    let client = server.client();
    for round in 0..3 {
        let channel = format!("c{round}");
        for i in 0..20 {
            client
                .publish(&channel, format!("pre{i}"))
                .send()
                .await
                .expect("publish");
        }
        let publisher = {
            let (client, channel) = (client.clone(), channel.clone());
            tokio::spawn(async move {
                for i in 0..300 {
                    client
                        .publish(&channel, format!("live{i}"))
                        .send()
                        .await
                        .expect("publish");
                }
                client
                    .publish(&channel, "end")
                    .send()
                    .await
                    .expect("publish");
            })
        };
        let mut join = client.join(&channel).page_size(1 + round).open();
        let got = read_until(&mut join, "end").await;
        publisher.await.expect("publisher");
        let seqs: Vec<u64> = got.iter().map(|(s, _)| *s).collect();
        assert_exactly_once(&seqs, 321);
        assert_eq!(got, history_data(&client, &channel).await);
    }
}

#[tokio::test]
async fn a_join_after_a_cursor_reads_only_the_rest() {
    let server = clients::memory(&[]).await;
    let client = server.client();
    let mut at = None;
    for i in 1..=6 {
        let p = client
            .publish("a", format!("e{i}"))
            .send()
            .await
            .expect("publish");
        if i == 4 {
            at = Some(p.cursor);
        }
    }
    client.publish("a", "end").send().await.expect("publish");
    let mut join = client.join("a").after_opt(at).open();
    let got = read_until(&mut join, "end").await;
    assert_eq!(
        got.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        [5, 6, 7],
        "{got:?}"
    );
    assert_eq!(
        join.cursor(),
        Some(client.history("a").page().await.expect("page").next)
    );
}

#[tokio::test]
async fn an_evicted_cursor_becomes_a_gap_then_the_join_reads_from_the_floor() {
    let server = clients::memory(&["--retention-events", "3"]).await;
    let client = server.client();
    let first = client.publish("e", "1").send().await.expect("publish");
    for i in 2..=10 {
        client
            .publish("e", i.to_string())
            .send()
            .await
            .expect("publish");
    }
    client.publish("e", "end").send().await.expect("publish");
    let mut join = client.join("e").after(first.cursor.clone()).open();
    match timeout(Duration::from_secs(10), join.next()).await {
        Ok(Some(Ok(Update::Gap(g)))) => {
            assert_eq!(g.reason, GapReason::Evicted);
            assert_eq!(g.after, Some(first.cursor));
            assert_eq!(g.channel, "e");
        }
        other => panic!("expected a gap, got {other:?}"),
    }
    let got = read_until(&mut join, "end").await;
    assert_eq!(got.iter().map(|(s, _)| *s).collect::<Vec<_>>(), [9, 10, 11]);
}

#[tokio::test]
async fn a_fold_yields_immutable_views_and_reports_fold_errors() {
    let server = clients::memory(&[]).await;
    let client = server.client();
    for d in ["a", "bad", "b"] {
        client.publish("f", d).send().await.expect("publish");
    }
    let mut fold = client.join("f").fold(
        Vec::<String>::new(),
        |s: &Vec<String>, u: &Update| match u {
            Update::Event(e) if e.data == "bad" => Err(format!("refused seq {}", e.seq)),
            Update::Event(e) => {
                let mut next = s.clone();
                next.push(e.data.clone());
                Ok(next)
            }
            _ => Ok(s.clone()),
        },
    );
    let mut views = Vec::new();
    let mut errors = Vec::new();
    while views.len() + errors.len() < 3 {
        match timeout(Duration::from_secs(10), fold.next()).await {
            Ok(Some(Ok(Folded::Applied { view, .. }))) => views.push(view),
            Ok(Some(Ok(Folded::Rejected { error, view, .. }))) => {
                assert_eq!(
                    *view.state,
                    vec!["a".to_owned()],
                    "unchanged by a refused update"
                );
                errors.push(error);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(errors, ["refused seq 2"]);
    assert_eq!(*views[0].state, ["a"]);
    assert_eq!(*views[1].state, ["a", "b"]);
    // Earlier views are immutable snapshots.
    assert_eq!(views[0].state.len(), 1);
    client.publish("f", "c").send().await.expect("publish");
    match timeout(Duration::from_secs(10), fold.next()).await {
        Ok(Some(Ok(Folded::Applied { view, update }))) => {
            assert_eq!(*view.state, ["a", "b", "c"]);
            assert!(matches!(update, Update::Event(ref e) if e.seq == 4));
            assert!(view.cursor.is_some());
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(*fold.state(), ["a", "b", "c"]);
}

#[tokio::test]
async fn without_reconnect_a_clean_close_ends_the_join_and_a_kill_is_an_error() {
    let mut server = clients::memory(&[]).await;
    let client = server.client();
    client.publish("n", "1").send().await.expect("publish");
    let mut join = client.join("n").open();
    read_until(&mut join, "1").await;
    server.sigterm().await;
    let end = timeout(Duration::from_secs(10), join.next())
        .await
        .expect("ends");
    assert!(end.is_none(), "a clean close ends a one-shot join: {end:?}");

    let server = clients::memory(&[]).await;
    let client = server.client();
    client.publish("n", "1").send().await.expect("publish");
    let mut join = client.join("n").open();
    read_until(&mut join, "1").await;
    let mut server = server;
    server.kill9().await;
    match timeout(Duration::from_secs(10), join.next())
        .await
        .expect("answer")
    {
        Some(Err(Error::Disconnected { .. })) => {}
        other => panic!("expected a disconnection error, got {other:?}"),
    }
    assert!(join.next().await.is_none());
}

#[tokio::test]
async fn with_reconnect_a_join_resumes_from_its_applied_cursor_after_clean_and_killed_restarts() {
    let mut server = clients::durable(&[]).await;
    let client = server.client();
    let phases: Arc<Mutex<Vec<JoinPhase>>> = Arc::default();
    let log = phases.clone();
    let mut join = client
        .join("r")
        .reconnect(true)
        .page_size(3)
        .phase_hook(move |p| {
            log.lock().expect("lock").push(p);
            async {}
        })
        .open();
    for i in 1..=10 {
        publish_surely(&client, "r", &format!("e{i}")).await;
    }
    let mut got = read_until(&mut join, "e10").await;

    // Clean close: SIGTERM ends the stream; the join reopens at once, then
    // backs off until the server is back.
    server.sigterm().await;
    server.restart().await;
    for i in 11..=20 {
        publish_surely(&client, "r", &format!("e{i}")).await;
    }
    got.extend(read_until(&mut join, "e20").await);

    // Error: SIGKILL resets the connection; publishes race the restart.
    server.kill9().await;
    let publisher = {
        let client = client.clone();
        tokio::spawn(async move {
            for i in 21..=30 {
                publish_surely(&client, "r", &format!("e{i}")).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.restart().await;
    publisher.await.expect("publisher");
    got.extend(read_until(&mut join, "e30").await);

    let seqs: Vec<u64> = got.iter().map(|(s, _)| *s).collect();
    // No event twice: so each walk after a reconnect started at the applied cursor.
    assert_exactly_once(&seqs, 30);
    let cycles = phases
        .lock()
        .expect("lock")
        .iter()
        .filter(|p| **p == JoinPhase::BeforeLive)
        .count();
    assert!(
        cycles >= 3,
        "the join reopened after each restart ({cycles} cycles)"
    );
}

#[tokio::test]
async fn a_live_gap_makes_the_join_walk_again_and_report_only_what_is_really_lost() {
    let server = clients::memory(&["--retention-events", "10", "--window-events", "16"]).await;
    let client = server.client();
    client.publish("s", "start").send().await.expect("publish");
    let mut join = client.join("s").open();
    read_until(&mut join, "start").await;
    // The consumer pauses while far more than the socket buffers hold is
    // published: the server's reader falls behind retention and sends a gap.
    let big = "x".repeat(32 * 1024);
    for _ in 0..60 {
        let batch = (0..10).map(|_| gapless_client::NewEvent {
            event_type: None,
            data: big.clone().into(),
        });
        client
            .publish_batch("s", batch)
            .send()
            .await
            .expect("batch");
    }
    client.publish("s", "end").send().await.expect("publish");
    let end_seq = 1 + 600 + 1;
    let mut gaps = Vec::new();
    let mut seqs = Vec::new();
    loop {
        match timeout(Duration::from_secs(30), join.next()).await {
            Ok(Some(Ok(Update::Event(e)))) => {
                seqs.push(e.seq);
                if e.data == "end" {
                    break;
                }
            }
            Ok(Some(Ok(Update::Gap(g)))) => gaps.push((seqs.len(), g)),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(!gaps.is_empty(), "the join reported the eviction");
    for (_, g) in &gaps {
        assert_eq!(g.reason, GapReason::Evicted);
    }
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "in order, no duplicate: {seqs:?}"
    );
    assert_eq!(seqs.last(), Some(&end_seq));
    // Every event missing from the delivery was inside a reported hole: events
    // are contiguous except right where a gap was reported.
    for (i, w) in seqs.windows(2).enumerate() {
        if w[1] != w[0] + 1 {
            assert!(
                gaps.iter().any(|(at, _)| *at == i + 1),
                "a hole between {} and {} with no gap notice",
                w[0],
                w[1]
            );
        }
    }
}
