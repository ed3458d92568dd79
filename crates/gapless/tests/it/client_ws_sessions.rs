//! The Rust client SDK's sessions against the real server: the producer
//! calls, the consumer (`Client::attach_session`) with resume, automatic
//! re-attach across kill -9 (every event once, then `Resumed`, then
//! `Completed` ends the stream), takeover, and terminal refusals (4404
//! `session_not_found` and `session_ended`, 4409, 4410) as typed errors.

use gapless_client::{Backoff, Client, ErrorCode, SessionStatus, SessionStream, SessionUpdate};
use gapless_testkit::clients;
use gapless_testkit::eventually;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::time::timeout;

fn fast() -> Backoff {
    Backoff {
        initial: Duration::from_millis(50),
        max: Duration::from_millis(500),
    }
}

async fn next(s: &mut SessionStream) -> SessionUpdate {
    timeout(Duration::from_secs(10), s.next())
        .await
        .expect("an update within 10 s")
        .expect("the stream goes on")
        .expect("no error")
}

async fn ended(s: &mut SessionStream) {
    let end = timeout(Duration::from_secs(10), s.next())
        .await
        .expect("the stream ends within 10 s");
    assert!(end.is_none(), "expected the end, got {end:?}");
}

fn data(u: SessionUpdate) -> (u64, String) {
    match u {
        SessionUpdate::Event(e) => (e.seq, e.data),
        other => panic!("expected an event, got {other:?}"),
    }
}

/// Appends with an idempotency key derived from `data`, retrying until the
/// server acknowledges it (so an append cut by a restart lands once).
async fn append_surely(client: &Client, id: &str, data: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client
            .append_session(id, data)
            .idempotency_key(format!("k-{data}"))
            .send()
            .await
        {
            Ok(a) => return a.seq,
            Err(e) if !e.is_terminal() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("append {data}: {e}"),
        }
    }
}

async fn attached(client: &Client, id: &str) -> bool {
    client
        .session_info(id)
        .await
        .map(|i| i.attached)
        .unwrap_or(false)
}

/// Backs the crate doc example "Sessions: produce".
#[tokio::test]
async fn session_producer_calls() {
    let server = clients::memory(&[]).await;
    let client = server.client();
    let session = client.create_session(Some("job-42")).await.expect("create");
    assert_eq!(
        (
            session.id.as_str(),
            session.status,
            session.head,
            session.attached
        ),
        ("job-42", SessionStatus::Open, 1, false)
    );
    let sent = client
        .append_session(&session.id, "step 1")
        .event_type("progress")
        .send()
        .await
        .expect("append");
    assert_eq!(
        (sent.id.as_str(), sent.seq, sent.attached, sent.duplicate),
        ("job-42", 2, false, false)
    );
    let k1 = client
        .append_session("job-42", "once")
        .idempotency_key("k1")
        .send()
        .await
        .expect("append");
    let k2 = client
        .append_session("job-42", "once")
        .idempotency_key("k1")
        .send()
        .await
        .expect("retry");
    assert_eq!((k2.seq, k2.duplicate), (k1.seq, true));
    let info = client.session_info("job-42").await.expect("info");
    assert_eq!((info.head, info.attached), (3, false));

    let done = client.complete_session("job-42").await.expect("complete");
    assert_eq!(done.status, SessionStatus::Completed);
    let err = client
        .append_session("job-42", "late")
        .send()
        .await
        .expect_err("ended");
    let api = err.api().expect("API error");
    assert_eq!(
        (api.status, api.error_code()),
        (409, Some(ErrorCode::SessionEnded))
    );
    assert_eq!(
        api.extra.get("status").and_then(|v| v.as_str()),
        Some("completed")
    );
    let err = client
        .create_session(Some("job-42"))
        .await
        .expect_err("exists");
    assert_eq!(
        err.api().and_then(|a| a.error_code()),
        Some(ErrorCode::SessionExists)
    );

    let drawn = client.create_session(None).await.expect("create");
    assert_eq!(drawn.id.len(), 32, "{}", drawn.id);
    let cancelled = client.cancel_session(&drawn.id).await.expect("cancel");
    assert_eq!(cancelled.status, SessionStatus::Cancelled);
    let err = client.session_info("nope").await.expect_err("unknown");
    assert_eq!(
        err.api().map(|a| (a.status, a.code.as_str())),
        Some((404, "session_not_found"))
    );
}

/// Backs the crate doc example "Sessions: consume".
#[tokio::test]
async fn session_consumer_resumes_then_follows_live_until_completed() {
    let server = clients::memory(&[]).await;
    let client = server.client();
    client.create_session(Some("job-42")).await.expect("create");
    client
        .append_session("job-42", "a")
        .event_type("progress")
        .send()
        .await
        .expect("append");
    client
        .append_session("job-42", "b")
        .send()
        .await
        .expect("append");
    let mut consumer = client
        .attach_session("job-42")
        .last_seq(1)
        .connect()
        .await
        .expect("attach");
    assert_eq!(consumer.id(), "job-42");
    match next(&mut consumer).await {
        SessionUpdate::Event(e) => {
            assert_eq!(
                (
                    e.session.as_str(),
                    e.seq,
                    e.event_type.as_deref(),
                    e.data.as_str()
                ),
                ("job-42", 2, Some("progress"), "a")
            );
            assert!(e.time > 0);
        }
        other => panic!("expected an event, got {other:?}"),
    }
    assert_eq!(data(next(&mut consumer).await), (3, "b".to_owned()));
    assert_eq!(
        next(&mut consumer).await,
        SessionUpdate::Resumed { replayed_events: 2 }
    );
    let live = client
        .append_session("job-42", "c")
        .send()
        .await
        .expect("append");
    assert!(live.attached);
    assert_eq!(data(next(&mut consumer).await), (4, "c".to_owned()));
    client.complete_session("job-42").await.expect("complete");
    assert_eq!(
        next(&mut consumer).await,
        SessionUpdate::Completed { seq: 5 }
    );
    ended(&mut consumer).await;
    assert_eq!(consumer.last_seq(), Some(4));
}

#[tokio::test]
async fn session_consumer_reattaches_across_kill9_with_every_event_once() {
    let mut server = clients::durable(&[]).await;
    let client = server.client();
    client.create_session(Some("s")).await.expect("create");
    let mut consumer = client
        .attach_session("s")
        .backoff(fast())
        .connect()
        .await
        .expect("attach");
    let seen: Arc<Mutex<Vec<SessionUpdate>>> = Arc::default();
    let sink = seen.clone();
    let reader = tokio::spawn(async move {
        while let Some(u) = consumer.next().await {
            sink.lock().expect("lock").push(u.expect("no error"));
            // A slow consumer: at the kill, events are in flight undelivered.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        consumer.last_seq()
    });
    let events = || {
        seen.lock()
            .expect("lock")
            .iter()
            .filter(|u| matches!(u, SessionUpdate::Event(_)))
            .count()
    };
    for i in 1..=15 {
        append_surely(&client, "s", &format!("e{i}")).await;
    }
    eventually(
        "some events before the kill",
        Duration::from_secs(10),
        || async { events() >= 5 },
    )
    .await;
    server.kill9().await;
    server.restart().await;
    for i in 16..=30 {
        append_surely(&client, "s", &format!("e{i}")).await;
    }
    client.complete_session("s").await.expect("complete");
    let last = timeout(Duration::from_secs(10), reader)
        .await
        .expect("the stream ends after Completed")
        .expect("reader");
    assert_eq!(last, Some(31));

    let seen = seen.lock().expect("lock").clone();
    let mut want = 2u64;
    let mut resumed = 0;
    for (i, u) in seen.iter().enumerate() {
        match u {
            SessionUpdate::Event(e) => {
                assert_eq!(
                    (e.seq, e.data.clone()),
                    (want, format!("e{}", want - 1)),
                    "every event once, in order: {seen:?}"
                );
                want += 1;
            }
            SessionUpdate::Resumed { .. } => resumed += 1,
            SessionUpdate::Completed { seq } => {
                assert_eq!((*seq, i), (32, seen.len() - 1), "Completed comes last");
            }
            SessionUpdate::Cancelled { .. } => panic!("cancelled: {seen:?}"),
        }
    }
    assert_eq!(want, 32, "30 events: {seen:?}");
    assert!(
        resumed >= 1,
        "the re-attach resumed with last_seq: {seen:?}"
    );
    assert!(
        matches!(seen.last(), Some(SessionUpdate::Completed { .. })),
        "{seen:?}"
    );
}

#[tokio::test]
async fn a_live_first_attach_reattaches_from_the_head_it_started_at() {
    let mut server = clients::durable(&[]).await;
    let client = server.client();
    client.create_session(Some("live")).await.expect("create");
    append_surely(&client, "live", "before").await;
    let mut consumer = client
        .attach_session("live")
        .backoff(fast())
        .connect()
        .await
        .expect("attach");
    assert_eq!(consumer.last_seq(), None);
    // Dropped before any event was delivered; the event appended meanwhile
    // (after the first attach) is not lost, the one before it is not replayed.
    server.kill9().await;
    server.restart().await;
    append_surely(&client, "live", "while-away").await;
    let mut got = vec![];
    loop {
        match next(&mut consumer).await {
            SessionUpdate::Event(e) => {
                got.push(e.data);
                break;
            }
            SessionUpdate::Resumed { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(got, ["while-away"]);
    assert_eq!(consumer.last_seq(), Some(3));
}

#[tokio::test]
async fn refusals_4404_4410_4409_are_terminal_typed_errors() {
    let server = clients::memory(&[]).await;
    let client = server.client();
    let err = client
        .attach_session("nope")
        .connect()
        .await
        .expect_err("unknown session");
    let api = err.api().expect("API error");
    assert_eq!(
        (api.error_code(), api.close_code(), api.status),
        (Some(ErrorCode::SessionNotFound), Some(4404), 404)
    );
    assert!(err.is_terminal());

    // Not retried with reconnection on: the error, then the end.
    let mut s = client.attach_session("nope").backoff(fast()).open();
    let first = timeout(Duration::from_secs(10), s.next())
        .await
        .expect("an answer")
        .expect("an item")
        .expect_err("refused");
    assert_eq!(first.api().and_then(|a| a.close_code()), Some(4404));
    ended(&mut s).await;

    client.create_session(Some("r")).await.expect("create");
    let err = client
        .attach_session("r")
        .last_seq(99)
        .connect()
        .await
        .expect_err("beyond the head");
    assert_eq!(
        err.api().map(|a| (a.error_code(), a.close_code())),
        Some((Some(ErrorCode::SessionNotRetained), Some(4410)))
    );
    assert!(err.is_terminal());

    // 4404 `session_ended`: ended, and attached without last_seq: nothing
    // live to attach to. Terminal, and told apart from an unknown session by
    // the `error` message's code.
    client.create_session(Some("done")).await.expect("create");
    client.complete_session("done").await.expect("complete");
    let err = client
        .attach_session("done")
        .connect()
        .await
        .expect_err("ended");
    assert_eq!(
        err.api().map(|a| (a.error_code(), a.close_code())),
        Some((Some(ErrorCode::SessionEnded), Some(4404)))
    );
    assert!(err.is_terminal());

    // 4409: attached elsewhere, and no takeover.
    let _holder = client.attach_session("r").connect().await.expect("attach");
    let err = client
        .attach_session("r")
        .connect()
        .await
        .expect_err("already attached");
    assert_eq!(
        err.api().map(|a| (a.error_code(), a.close_code())),
        Some((Some(ErrorCode::SessionAttached), Some(4409)))
    );
    assert!(err.is_terminal());
}

#[tokio::test]
async fn takeover_moves_the_session_and_the_old_consumer_ends_with_4409() {
    let server = clients::memory(&["--heartbeat-ms", "2000"]).await;
    let client = server.client();
    client.create_session(Some("t")).await.expect("create");
    let mut old = client
        .attach_session("t")
        .backoff(fast())
        .connect()
        .await
        .expect("attach");
    eventually("attached", Duration::from_secs(10), || async {
        attached(&client, "t").await
    })
    .await;
    let mut new = client
        .attach_session("t")
        .takeover(true)
        .last_seq(1)
        .connect()
        .await
        .expect("take over");
    // A live attach is answered at once.
    assert_eq!(
        next(&mut old).await,
        SessionUpdate::Resumed { replayed_events: 0 }
    );
    // The old consumer is told, and does not fight back: a terminal error, then the end.
    let err = timeout(Duration::from_secs(10), old.next())
        .await
        .expect("an answer")
        .expect("an item")
        .expect_err("taken over");
    let api = err.api().expect("API error");
    assert_eq!(
        (api.error_code(), api.close_code()),
        (Some(ErrorCode::SessionAttached), Some(4409))
    );
    ended(&mut old).await;

    assert_eq!(
        next(&mut new).await,
        SessionUpdate::Resumed { replayed_events: 0 }
    );
    client
        .append_session("t", "x")
        .send()
        .await
        .expect("append");
    assert_eq!(data(next(&mut new).await), (2, "x".to_owned()));
    client.cancel_session("t").await.expect("cancel");
    assert_eq!(next(&mut new).await, SessionUpdate::Cancelled { seq: 3 });
    ended(&mut new).await;
}

#[tokio::test]
async fn idle_drops_reattach_with_last_seq_and_takeover_losing_nothing() {
    // The client gives up on a silent socket long before the server's next
    // ping: every re-attach comes while the server may still hold the old
    // connection, which is what `takeover=true` on re-attach is for.
    let server = clients::memory(&["--heartbeat-ms", "5000"]).await;
    let client = server.client();
    client.create_session(Some("idle")).await.expect("create");
    let drops = Arc::new(Mutex::new(0u32));
    let log = drops.clone();
    let mut consumer = client
        .attach_session("idle")
        .last_seq(1)
        .idle_timeout(Some(Duration::from_millis(250)))
        .backoff(fast())
        .on_reconnect(move |r| {
            assert!(r.error.is_some_and(|e| !e.is_terminal()), "{:?}", r.error);
            *log.lock().expect("lock") += 1;
        })
        .connect()
        .await
        .expect("attach");
    let reader = tokio::spawn(async move {
        let mut got = vec![];
        while let Some(u) = consumer.next().await {
            match u.expect("no error") {
                SessionUpdate::Event(e) => got.push(e.seq),
                SessionUpdate::Resumed { .. } => {}
                end => {
                    got.push(0);
                    assert_eq!(end, SessionUpdate::Completed { seq: 7 });
                }
            }
        }
        got
    });
    for i in 1..=5 {
        append_surely(&client, "idle", &format!("i{i}")).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    client.complete_session("idle").await.expect("complete");
    let got = timeout(Duration::from_secs(10), reader)
        .await
        .expect("ends")
        .expect("reader");
    assert_eq!(got, [2, 3, 4, 5, 6, 0]);
    assert!(*drops.lock().expect("lock") >= 3, "idle drops re-attached");
}

/// A TCP relay to 127.0.0.1:`port`; notifying the returned handle freezes
/// every connection open at that moment: nothing more is relayed either way
/// and neither side is closed, as when a network path silently dies.
async fn freezable_proxy(port: u16) -> (String, Arc<tokio::sync::Notify>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let freeze = Arc::new(tokio::sync::Notify::new());
    let f = freeze.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let f = f.clone();
            tokio::spawn(async move {
                let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                else {
                    return;
                };
                let frozen = f.notified();
                tokio::pin!(frozen);
                frozen.as_mut().enable();
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    () = &mut frozen => {
                        // Hold both sockets open, relaying nothing.
                        std::future::pending::<()>().await;
                    }
                }
            });
        }
    });
    (url, freeze)
}

#[tokio::test]
async fn a_reattach_takes_over_the_connection_the_server_still_holds() {
    // The server would notice the dead path only after two heartbeats (10 s):
    // a re-attach without takeover would be refused with 4409.
    let server = clients::memory(&["--heartbeat-ms", "5000"]).await;
    let client = server.client();
    client.create_session(Some("net")).await.expect("create");
    let (via, freeze) = freezable_proxy(server.addr.port()).await;
    let roaming = Client::new(&via).expect("url");
    let mut consumer = roaming
        .attach_session("net")
        .last_seq(1)
        .idle_timeout(Some(Duration::from_millis(500)))
        .backoff(fast())
        .connect()
        .await
        .expect("attach");
    assert_eq!(
        next(&mut consumer).await,
        SessionUpdate::Resumed { replayed_events: 0 }
    );
    client
        .append_session("net", "before")
        .send()
        .await
        .expect("append");
    assert_eq!(data(next(&mut consumer).await), (2, "before".to_owned()));

    freeze.notify_waiters();
    let sent = client
        .append_session("net", "lost-in-transit")
        .send()
        .await
        .expect("append");
    assert!(
        sent.attached,
        "the server still holds the frozen connection"
    );
    // The client's idle timeout drops the frozen socket; the re-attach takes
    // the session over and replays what was in transit.
    assert_eq!(
        data(next(&mut consumer).await),
        (3, "lost-in-transit".to_owned())
    );
    assert_eq!(
        next(&mut consumer).await,
        SessionUpdate::Resumed { replayed_events: 1 }
    );
    client.complete_session("net").await.expect("complete");
    assert_eq!(
        next(&mut consumer).await,
        SessionUpdate::Completed { seq: 4 }
    );
    ended(&mut consumer).await;
}
