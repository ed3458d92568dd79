//! The Rust client SDK (`gapless-client`) against the real server: each crate
//! doc example is backed here, plus resumption, reconnection, terminal
//! refusals and cancellation.

use futures::TryStreamExt;
use gapless_client::{Client, Cursor, Error, GapReason, NewEvent, Update};
use gapless_testkit::clients::{self, assert_exactly_once, publish_surely};
use gapless_testkit::eventually;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::timeout;

async fn next_update(sub: &mut gapless_client::Subscription) -> Update {
    timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("an update within 10 s")
        .expect("the subscription goes on")
        .expect("no error")
}

fn event(u: Update) -> gapless_client::Event {
    match u {
        Update::Event(e) => e,
        other => panic!("expected an event, got {other:?}"),
    }
}

#[tokio::test]
async fn publish_single_typed_idempotent_batch_and_ephemeral() {
    let server = clients::memory(&[]).await;
    let client = server.client();
    let one = client
        .publish("orders", "order 1 created")
        .event_type("created")
        .send()
        .await
        .expect("publish");
    assert_eq!(
        (one.channel.as_str(), one.seq, one.duplicate),
        ("orders", 1, false)
    );

    let first = client
        .publish("orders", "paid")
        .idempotency_key("pay-1")
        .send()
        .await
        .expect("publish");
    let again = client
        .publish("orders", "paid")
        .idempotency_key("pay-1")
        .send()
        .await
        .expect("retry");
    assert_eq!((again.seq, again.duplicate), (first.seq, true));
    assert_eq!(again.cursor, first.cursor);

    let batch = client
        .publish_batch(
            "orders",
            [
                NewEvent {
                    event_type: None,
                    data: "a".into(),
                },
                NewEvent {
                    event_type: Some("note".into()),
                    data: "b".into(),
                },
            ],
        )
        .idempotency_key("import-1")
        .send()
        .await
        .expect("batch");
    assert_eq!(
        (batch.first_seq, batch.last_seq, batch.duplicate),
        (3, 4, false)
    );
    assert_eq!(batch.events.len(), 2);
    assert_eq!(batch.cursor, batch.events[1].cursor);
    let retry = client
        .publish_batch(
            "orders",
            [
                NewEvent {
                    event_type: None,
                    data: "a".into(),
                },
                NewEvent {
                    event_type: Some("note".into()),
                    data: "b".into(),
                },
            ],
        )
        .idempotency_key("import-1")
        .send()
        .await
        .expect("batch retry");
    assert!(retry.duplicate);
    assert_eq!(retry.last_seq, 4);
    // The key reused for other events: the server's 422, as the SDK's error.
    let reused = client
        .publish_batch(
            "orders",
            [NewEvent {
                event_type: None,
                data: "a".into(),
            }],
        )
        .idempotency_key("import-1")
        .send()
        .await;
    assert!(
        matches!(&reused, Err(e) if e.to_string().contains("idempotency_key_reused")),
        "{reused:?}"
    );

    let sent = client
        .publish("orders", "typing…")
        .send_ephemeral()
        .await
        .expect("ephemeral");
    assert_eq!(sent.subscribers, 0);

    let page = client.history("orders").page().await.expect("history");
    let got: Vec<_> = page
        .events
        .iter()
        .map(|e| (e.seq, e.event_type.as_deref(), e.data.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (1, Some("created"), "order 1 created"),
            (2, None, "paid"),
            (3, None, "a"),
            (4, Some("note"), "b")
        ]
    );

    // Refusals are typed and terminal.
    let err = client
        .publish("orders", "x")
        .event_type("gap")
        .send()
        .await
        .expect_err("reserved type");
    let api = err.api().expect("an API error");
    assert_eq!((api.status, api.code.as_str()), (400, "invalid_type"));
    assert!(err.is_terminal());
    let err = client
        .publish_batch("orders", [])
        .send()
        .await
        .expect_err("empty batch");
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
}

#[tokio::test]
async fn history_one_page_next_page_and_stream() {
    let server = clients::memory(&[]).await;
    let client = server.client();
    for i in 1..=5 {
        client
            .publish("h", format!("e{i}"))
            .send()
            .await
            .expect("publish");
    }
    let page = client.history("h").limit(2).page().await.expect("page");
    assert_eq!((page.floor, page.head, page.done), (1, 5, false));
    assert_eq!(page.events.len(), 2);
    assert_eq!(page.next, page.events[1].cursor);
    let rest = client
        .history("h")
        .after(page.next.clone())
        .page()
        .await
        .expect("next page");
    assert_eq!(
        rest.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [3, 4, 5]
    );
    assert!(rest.done);

    let all: Vec<_> = client
        .history("h")
        .limit(2)
        .stream()
        .try_collect()
        .await
        .expect("stream");
    assert_eq!(
        all.iter().map(|e| e.data.as_str()).collect::<Vec<_>>(),
        ["e1", "e2", "e3", "e4", "e5"]
    );

    // An empty channel: one done page whose next is the tip.
    let empty = client.history("nothing").page().await.expect("empty");
    assert!(empty.done && empty.events.is_empty() && empty.head == 0);

    // A garbage cursor is a typed, terminal 400.
    let err = client
        .history("h")
        .after(Cursor::from("garbage"))
        .page()
        .await
        .expect_err("garbage");
    assert_eq!(err.api().map(|a| a.code.as_str()), Some("invalid_cursor"));
    assert!(err.is_terminal());
}

#[tokio::test]
async fn history_of_evicted_cursor_is_410_with_floor_cursor() {
    let server = clients::memory(&["--retention-events", "3"]).await;
    let client = server.client();
    let first = client.publish("r", "1").send().await.expect("publish");
    for i in 2..=10 {
        client
            .publish("r", i.to_string())
            .send()
            .await
            .expect("publish");
    }
    let err = client
        .history("r")
        .after(first.cursor)
        .page()
        .await
        .expect_err("evicted");
    let api = err.api().expect("API error");
    assert_eq!(api.status, 410);
    assert_eq!(api.gap_reason(), Some(GapReason::Evicted));
    let floor = api.floor_cursor().expect("floor_cursor");
    let page = client
        .history("r")
        .after(floor)
        .page()
        .await
        .expect("from floor");
    assert_eq!(
        page.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [8, 9, 10]
    );
}

#[tokio::test]
async fn subscribe_several_channels_since_earliest_then_live() {
    let server = clients::memory(&[]).await;
    let client = server.client();
    client
        .publish("orders", "o1")
        .send()
        .await
        .expect("publish");
    client
        .publish("payments", "p1")
        .send()
        .await
        .expect("publish");
    let mut sub = client
        .subscribe(["orders", "payments"])
        .since_earliest()
        .connect()
        .await
        .expect("connect");
    let mut got = vec![];
    for _ in 0..2 {
        let e = event(next_update(&mut sub).await);
        got.push((e.channel, e.data));
    }
    got.sort();
    assert_eq!(
        got,
        [
            ("orders".to_owned(), "o1".to_owned()),
            ("payments".to_owned(), "p1".to_owned())
        ]
    );
    client
        .publish("payments", "p2")
        .send()
        .await
        .expect("publish");
    let e = event(next_update(&mut sub).await);
    assert_eq!(
        (e.channel.as_str(), e.seq, e.data.as_str()),
        ("payments", 2, "p2")
    );
    // The event's cursor is the subscription's: it resumes both channels.
    assert_eq!(sub.cursor(), Some(e.cursor.clone()));
    client
        .publish("orders", "o2")
        .send()
        .await
        .expect("publish");
    drop(sub);
    let mut resumed = client
        .subscribe(["orders", "payments"])
        .after(e.cursor)
        .connect()
        .await
        .expect("resume");
    let e = event(next_update(&mut resumed).await);
    assert_eq!((e.channel.as_str(), e.data.as_str()), ("orders", "o2"));

    // Ephemeral events arrive as such and do not move the cursor. (The server
    // notices the dropped first subscription at its next heartbeat write.)
    eventually("one subscriber", Duration::from_secs(10), || async {
        subscribers(&client, "orders").await == 1
    })
    .await;
    let before = resumed.cursor();
    let sent = client
        .publish("orders", "typing")
        .event_type("presence")
        .send_ephemeral()
        .await
        .expect("ephemeral");
    assert_eq!(sent.subscribers, 1);
    match next_update(&mut resumed).await {
        Update::Ephemeral(x) => {
            assert_eq!((x.channel.as_str(), x.data.as_str()), ("orders", "typing"));
            assert_eq!(x.event_type.as_deref(), Some("presence"));
        }
        other => panic!("expected an ephemeral event, got {other:?}"),
    }
    assert_eq!(resumed.cursor(), before);
}

#[tokio::test]
async fn the_preamble_cursor_counts_as_delivered() {
    let server = clients::memory(&[]).await;
    let client = server.client();
    client.publish("p", "old").send().await.expect("publish");
    let sub = client.subscribe(["p"]).connect().await.expect("connect");
    // Nothing delivered yet, but the id-only frame placed the subscription at the head.
    let at = sub.cursor().expect("the preamble's cursor");
    drop(sub);
    client.publish("p", "new").send().await.expect("publish");
    let mut sub = client
        .subscribe(["p"])
        .after(at)
        .connect()
        .await
        .expect("resume");
    let e = event(next_update(&mut sub).await);
    assert_eq!((e.seq, e.data.as_str()), (2, "new"));
}

#[tokio::test]
async fn a_subscription_after_an_evicted_cursor_gets_a_gap_first() {
    let server = clients::memory(&["--retention-events", "3"]).await;
    let client = server.client();
    let first = client.publish("g", "1").send().await.expect("publish");
    for i in 2..=10 {
        client
            .publish("g", i.to_string())
            .send()
            .await
            .expect("publish");
    }
    let mut sub = client
        .subscribe(["g"])
        .after(first.cursor.clone())
        .connect()
        .await
        .expect("connect");
    match next_update(&mut sub).await {
        Update::Gap(g) => {
            assert_eq!(g.channel, "g");
            assert_eq!(g.reason, GapReason::Evicted);
            assert_eq!(g.after, Some(first.cursor));
        }
        other => panic!("expected a gap, got {other:?}"),
    }
    client.publish("g", "11").send().await.expect("publish");
    let e = event(next_update(&mut sub).await);
    assert_eq!(e.seq, 11);
    // Resuming from the delivered position owes nothing: no gap, no replay.
    let at = sub.cursor().expect("cursor");
    drop(sub);
    client.publish("g", "12").send().await.expect("publish");
    let mut sub = client
        .subscribe(["g"])
        .after(at)
        .connect()
        .await
        .expect("resume");
    assert_eq!(event(next_update(&mut sub).await).seq, 12);
}

#[tokio::test]
async fn terminal_refusals_are_typed_and_not_retried() {
    let server = clients::memory(&[]).await;
    let client = server.client();
    let attempts = Arc::new(Mutex::new(0u32));
    let counter = attempts.clone();
    // 400 on the first connection: returned by connect() ...
    let err = client
        .subscribe(["a"])
        .after(Cursor::from("garbage"))
        .on_reconnect(move |_| *counter.lock().expect("lock") += 1)
        .connect()
        .await
        .expect_err("garbage cursor");
    assert_eq!(
        err.api().map(|a| (a.status, a.code.as_str())),
        Some((400, "invalid_cursor"))
    );
    // ... and by the stream of a lazily opened subscription, which then ends.
    let counter = attempts.clone();
    let mut sub = client
        .subscribe(["bad channel"])
        .on_reconnect(move |_| *counter.lock().expect("lock") += 1)
        .open();
    let err = timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("answer")
        .expect("an item")
        .expect_err("invalid channel");
    assert_eq!(err.api().map(|a| a.code.as_str()), Some("invalid_channel"));
    assert!(timeout(Duration::from_secs(5), sub.next())
        .await
        .expect("ends")
        .is_none());
    // 404: a base URL that is not the server's root.
    let wrong = Client::new(&format!("{}/nope", server.base())).expect("url");
    let err = wrong.subscribe(["a"]).connect().await.expect_err("404");
    assert_eq!(err.api().map(|a| a.status), Some(404));
    assert!(err.is_terminal());
    assert_eq!(
        *attempts.lock().expect("lock"),
        0,
        "no retry of a terminal refusal"
    );
    // Unreachable is not terminal.
    server_gone_is_retryable().await;
}

async fn server_gone_is_retryable() {
    let mut s = clients::memory(&[]).await;
    let url = s.base();
    s.kill9().await;
    let err = Client::new(&url)
        .expect("url")
        .publish("a", "x")
        .send()
        .await
        .expect_err("down");
    assert!(matches!(err, Error::Unreachable { .. }), "{err:?}");
    assert!(!err.is_terminal());
    assert!(err.to_string().contains("connection refused"), "{err}");
}

#[tokio::test]
async fn an_event_above_max_event_bytes_is_an_explicit_error() {
    let server = clients::memory(&[]).await;
    let client = server.client();
    let mut sub = client
        .subscribe(["big"])
        .max_event_bytes(200)
        .connect()
        .await
        .expect("connect");
    client
        .publish("big", "x".repeat(1000))
        .send()
        .await
        .expect("publish");
    let err = timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("answer")
        .expect("an item")
        .expect_err("too large");
    assert!(
        matches!(err, Error::EventTooLarge { limit: 200 }),
        "{err:?}"
    );
    assert!(sub.next().await.is_none());
}

async fn subscribers(client: &Client, channel: &str) -> u64 {
    client
        .channel_info(channel)
        .await
        .map(|i| i.subscribers)
        .unwrap_or(u64::MAX)
}

#[tokio::test]
async fn dropping_a_subscription_or_a_pending_next_leaves_nothing_running() {
    let server = clients::memory(&[]).await;
    let client = server.client();
    let mut sub = client.subscribe(["c"]).connect().await.expect("connect");
    eventually("one subscriber", Duration::from_secs(10), || async {
        subscribers(&client, "c").await == 1
    })
    .await;
    // Cancel a pending next(): the subscription stays usable.
    assert!(timeout(Duration::from_millis(100), sub.next())
        .await
        .is_err());
    client
        .publish("c", "after cancel")
        .send()
        .await
        .expect("publish");
    assert_eq!(event(next_update(&mut sub).await).data, "after cancel");
    drop(sub);
    eventually("no subscriber", Duration::from_secs(10), || async {
        subscribers(&client, "c").await == 0
    })
    .await;

    // A join dropped in the middle of its history walk.
    for i in 0..5 {
        client
            .publish("c", i.to_string())
            .send()
            .await
            .expect("publish");
    }
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let tx = Arc::new(Mutex::new(Some(tx)));
    let mut join = client
        .join("c")
        .page_size(1)
        .phase_hook(move |p| {
            let tx = tx.clone();
            async move {
                if matches!(p, gapless_client::join::JoinPhase::Page { n: 2, .. }) {
                    if let Some(tx) = tx.lock().expect("lock").take() {
                        let _ = tx.send(());
                    }
                    // Park here: the join is cancelled while awaiting this hook.
                    std::future::pending::<()>().await;
                }
            }
        })
        .open();
    let driver = tokio::spawn(async move { while join.next().await.is_some() {} });
    timeout(Duration::from_secs(10), rx)
        .await
        .expect("page 2")
        .expect("signal");
    assert_eq!(subscribers(&client, "c").await, 1);
    driver.abort();
    let _ = driver.await;
    eventually(
        "no subscriber after the join is dropped",
        Duration::from_secs(10),
        || async { subscribers(&client, "c").await == 0 },
    )
    .await;
}

/// Reads updates until `n` events were seen, returning their seqs.
async fn collect_seqs(sub: &mut gapless_client::Subscription, n: usize) -> Vec<u64> {
    let mut seqs = Vec::new();
    while seqs.len() < n {
        match timeout(Duration::from_secs(30), sub.next()).await {
            Ok(Some(Ok(Update::Event(e)))) => seqs.push(e.seq),
            Ok(Some(Ok(other))) => panic!("unexpected {other:?}"),
            Ok(Some(Err(e))) => panic!("subscription failed: {e}"),
            Ok(None) => panic!("subscription ended"),
            Err(_) => panic!("stalled after {:?}", seqs),
        }
    }
    seqs
}

#[tokio::test]
async fn a_subscription_resumes_exactly_across_clean_and_killed_restarts() {
    let mut server = clients::durable(&[]).await;
    let client = server.client();
    let reconnects = Arc::new(Mutex::new(Vec::new()));
    let log = reconnects.clone();
    let mut sub = client
        .subscribe(["r"])
        .since_earliest()
        .on_reconnect(move |r| log.lock().expect("lock").push(r.error.is_none()))
        .connect()
        .await
        .expect("connect");
    for i in 1..=10 {
        publish_surely(&client, "r", &format!("a{i}")).await;
    }
    let mut seqs = collect_seqs(&mut sub, 5).await;
    // Clean stop: the stream ends cleanly and the client reconnects at once (and
    // then backs off while the server is down).
    server.sigterm().await;
    server.restart().await;
    for i in 11..=20 {
        publish_surely(&client, "r", &format!("a{i}")).await;
    }
    seqs.extend(collect_seqs(&mut sub, 10).await);
    // Kill -9: the connection is reset; the client backs off and resumes.
    server.kill9().await;
    let publisher = {
        let client = client.clone();
        tokio::spawn(async move {
            for i in 21..=30 {
                publish_surely(&client, "r", &format!("a{i}")).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.restart().await;
    publisher.await.expect("publisher");
    seqs.extend(collect_seqs(&mut sub, 15).await);
    assert_exactly_once(&seqs, 30);
    let log = reconnects.lock().expect("lock").clone();
    assert!(log.contains(&true), "a clean close was seen: {log:?}");
    assert!(log.contains(&false), "a failure was seen: {log:?}");
}
