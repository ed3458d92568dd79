//! The Rust client SDK's WebSocket subscriptions (`Client::subscribe_ws`)
//! against the real server: the crate doc example, per-channel resumption
//! across kill -9 and SIGTERM restarts (every seq exactly once, in order),
//! typed gaps, and terminal refusals.

use gapless_client::{Backoff, Client, Cursor, GapReason, Update, WsSubscription};
use gapless_testkit::clients::{self, assert_exactly_once, publish_surely};
use gapless_testkit::eventually;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::timeout;

fn fast() -> Backoff {
    Backoff {
        initial: Duration::from_millis(50),
        max: Duration::from_millis(500),
    }
}

async fn next_update(sub: &mut WsSubscription) -> Update {
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

async fn subscribers(client: &Client, channel: &str) -> u64 {
    client
        .channel_info(channel)
        .await
        .map(|i| i.subscribers)
        .unwrap_or(0)
}

/// Backs the crate doc example "Subscribe over WebSocket".
#[tokio::test]
async fn ws_doc_example_since_earliest_then_live_then_resume_from_cursors() {
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
        .subscribe_ws(["orders", "payments", "orders"])
        .since_earliest()
        .backoff(Backoff {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(10),
        })
        .connect()
        .await
        .expect("connect");
    assert_eq!(sub.channels(), ["orders", "payments"]);
    let mut got = vec![];
    for _ in 0..2 {
        let e = event(next_update(&mut sub).await);
        got.push((e.channel, e.seq, e.data));
    }
    got.sort();
    assert_eq!(
        got,
        [
            ("orders".to_owned(), 1, "o1".to_owned()),
            ("payments".to_owned(), 1, "p1".to_owned())
        ]
    );
    // Live: a typed event, then an ephemeral one (which moves no cursor).
    let sent = client
        .publish("orders", "o2")
        .event_type("created")
        .send()
        .await
        .expect("publish");
    let e = event(next_update(&mut sub).await);
    assert_eq!(
        (e.seq, e.event_type.as_deref(), e.data.as_str()),
        (2, Some("created"), "o2")
    );
    assert_eq!(
        e.cursor, sent.cursor,
        "a WebSocket event carries its channel's cursor"
    );
    let before = sub.cursors();
    client
        .publish("payments", "typing")
        .send_ephemeral()
        .await
        .expect("ephemeral");
    match next_update(&mut sub).await {
        Update::Ephemeral(x) => assert_eq!(
            (x.channel.as_str(), x.data.as_str()),
            ("payments", "typing")
        ),
        other => panic!("expected an ephemeral event, got {other:?}"),
    }
    assert_eq!(sub.cursors(), before);
    assert_eq!(sub.cursor("orders"), Some(sent.cursor));

    // Resume elsewhere from the saved per-channel cursors: only what is new.
    let saved: BTreeMap<String, Cursor> = sub.cursors();
    drop(sub);
    client
        .publish("orders", "o3")
        .send()
        .await
        .expect("publish");
    client
        .publish("payments", "p2")
        .send()
        .await
        .expect("publish");
    let mut later = client
        .subscribe_ws(["orders", "payments"])
        .cursors(saved)
        .open();
    let mut got = vec![];
    for _ in 0..2 {
        let e = event(next_update(&mut later).await);
        got.push((e.channel, e.seq));
    }
    got.sort();
    assert_eq!(got, [("orders".to_owned(), 3), ("payments".to_owned(), 2)]);
}

#[tokio::test]
async fn ws_subscription_resumes_each_channel_exactly_once_across_kill9_and_sigterm() {
    let mut server = clients::durable(&[]).await;
    let client = server.client();
    let reconnects = Arc::new(Mutex::new(Vec::new()));
    let log = reconnects.clone();
    let mut sub = client
        .subscribe_ws(["a", "b"])
        .since_earliest()
        .backoff(fast())
        .on_reconnect(move |r| log.lock().expect("lock").push((r.error.is_none(), r.delay)))
        .connect()
        .await
        .expect("connect");
    // The consumer runs on its own, recording what it delivers.
    let seen: Arc<Mutex<BTreeMap<String, Vec<u64>>>> = Arc::default();
    let sink = seen.clone();
    let consumer = tokio::spawn(async move {
        while let Some(u) = sub.next().await {
            match u {
                Ok(Update::Event(e)) => sink
                    .lock()
                    .expect("lock")
                    .entry(e.channel)
                    .or_default()
                    .push(e.seq),
                Ok(other) => panic!("unexpected {other:?}"),
                Err(e) => panic!("subscription failed: {e}"),
            }
            // A slow consumer: at the kill, events are in flight undelivered.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    let count = |ch: &str| seen.lock().expect("lock").get(ch).map_or(0, Vec::len);
    let publish_range = |from: u32, to: u32| {
        let client = client.clone();
        async move {
            for i in from..=to {
                publish_surely(&client, "a", &format!("a{i}")).await;
                publish_surely(&client, "b", &format!("b{i}")).await;
            }
        }
    };

    publish_range(1, 15).await;
    eventually(
        "some events before the kill",
        Duration::from_secs(10),
        || async { count("a") >= 5 },
    )
    .await;
    // kill -9 mid-stream: reset connection, the client backs off and resumes
    // each channel from its last delivered cursor (not from `earliest` again).
    server.kill9().await;
    server.restart().await;
    publish_range(16, 30).await;
    eventually("30 on each channel", Duration::from_secs(10), || async {
        count("a") >= 30 && count("b") >= 30
    })
    .await;

    // SIGTERM: the server closes with 1001 and the client reconnects at once.
    server.sigterm().await;
    let publisher = tokio::spawn(publish_range(31, 40));
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.restart().await;
    publisher.await.expect("publisher");
    eventually("40 on each channel", Duration::from_secs(10), || async {
        count("a") >= 40 && count("b") >= 40
    })
    .await;
    // Nothing more arrives (no duplicate replays).
    tokio::time::sleep(Duration::from_millis(300)).await;
    consumer.abort();
    let seen = seen.lock().expect("lock").clone();
    assert_exactly_once(&seen["a"], 40);
    assert_exactly_once(&seen["b"], 40);
    let log = reconnects.lock().expect("lock").clone();
    assert!(
        log.contains(&(true, Duration::ZERO)),
        "a clean close (1001) reconnects at once: {log:?}"
    );
    assert!(
        log.iter().any(|(clean, _)| !clean),
        "a failure was seen: {log:?}"
    );
}

#[tokio::test]
async fn ws_stale_cursor_gets_a_typed_gap_then_live() {
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
        .subscribe_ws(["g"])
        .after(first.cursor.clone())
        .connect()
        .await
        .expect("connect");
    let gap = match next_update(&mut sub).await {
        Update::Gap(g) => g,
        other => panic!("expected a gap, got {other:?}"),
    };
    assert_eq!(gap.channel, "g");
    assert_eq!(gap.reason, GapReason::Evicted);
    assert_eq!(gap.after, Some(first.cursor));
    // Delivering the gap moves the channel's cursor past the hole.
    assert_eq!(sub.cursor("g"), Some(gap.next.clone()));
    client.publish("g", "11").send().await.expect("publish");
    let e = event(next_update(&mut sub).await);
    assert_eq!((e.seq, e.data.as_str()), (11, "11"));
}

#[tokio::test]
async fn ws_refused_subscribes_are_terminal_typed_errors() {
    let server = clients::memory(&[]).await;
    let client = server.client();
    let err = client
        .subscribe_ws(["x"])
        .after(Cursor::from("garbage"))
        .connect()
        .await
        .expect_err("garbage cursor");
    let api = err.api().expect("API error");
    assert_eq!(api.code, "invalid_cursor");
    assert_eq!(api.extra.get("channel").and_then(|v| v.as_str()), Some("x"));
    assert!(err.is_terminal());

    // Not retried even with reconnection on: the error, then the end.
    let mut sub = client
        .subscribe_ws(["ok", "bad channel"])
        .backoff(fast())
        .open();
    let first = timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("an answer")
        .expect("an item");
    let err = first.expect_err("invalid channel");
    assert_eq!(err.api().map(|a| a.code.as_str()), Some("invalid_channel"));
    assert!(timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("ends")
        .is_none());

    let none: [&str; 0] = [];
    assert!(matches!(
        client.subscribe_ws(none).connect().await,
        Err(gapless_client::Error::InvalidArgument(_))
    ));

    // Nothing listens: retryable, and reported as such by connect().
    let gone = Client::new("http://127.0.0.1:9").expect("url");
    let err = gone
        .subscribe_ws(["c"])
        .connect()
        .await
        .expect_err("refused");
    assert!(
        matches!(err, gapless_client::Error::Unreachable { .. }),
        "{err:?}"
    );
    assert!(!err.is_terminal());
}

#[tokio::test]
async fn ws_live_start_counts_its_subscribed_position_and_drop_closes_the_socket() {
    let server = clients::memory(&[]).await;
    let client = server.client();
    client.publish("l", "old").send().await.expect("publish");
    let mut sub = client.subscribe_ws(["l"]).connect().await.expect("connect");
    // The `subscribed` reply gave a position before any event was delivered.
    assert_eq!(
        sub.cursor("l"),
        None,
        "not delivered until next() handles it"
    );
    assert!(timeout(Duration::from_millis(100), sub.next())
        .await
        .is_err());
    assert!(
        sub.cursor("l").is_some(),
        "the live start's position is known"
    );
    eventually("one subscriber", Duration::from_secs(10), || async {
        subscribers(&client, "l").await == 1
    })
    .await;
    client.publish("l", "new").send().await.expect("publish");
    let e = event(next_update(&mut sub).await);
    assert_eq!((e.seq, e.data.as_str()), (2, "new"));
    drop(sub);
    eventually("no subscriber", Duration::from_secs(10), || async {
        subscribers(&client, "l").await == 0
    })
    .await;
}
