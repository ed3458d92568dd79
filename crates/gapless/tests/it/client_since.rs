//! Start positions `last:N` and `time:…` through the Rust SDK (SSE and
//! WebSocket subscriptions, history) and the CLI (`gapless tail --since`,
//! `gapless history --since`, RFC 3339 times): the start applies to the
//! first connection only (a reconnect resumes from the cursor), a start at
//! a time before the floor is told as a gap, bad values are refused.

use gapless_client::{Client, Error, GapReason, Start, Update};
use gapless_testkit::clients::{self, Tail};
use gapless_testkit::{eventually, seq_of};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::timeout;

async fn next<S>(sub: &mut S) -> Update
where
    S: futures::Stream<Item = Result<Update, Error>> + Unpin,
{
    use futures::StreamExt;
    timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("an update within 10 s")
        .expect("the subscription goes on")
        .expect("no error")
}

fn data(u: Update) -> String {
    match u {
        Update::Event(e) => e.data,
        other => panic!("expected an event, got {other:?}"),
    }
}

/// Publishes `prefix1..=prefixN` one at a time, 15 ms apart (each with its
/// own commit time); returns the times.
async fn publish_apart(client: &Client, channel: &str, prefix: &str, n: u32) -> Vec<u64> {
    for i in 1..=n {
        client
            .publish(channel, format!("{prefix}{i}"))
            .send()
            .await
            .expect("publish");
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    let page = client
        .history(channel)
        .limit(1000)
        .page()
        .await
        .expect("history");
    page.events.iter().map(|e| e.time).collect()
}

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

#[tokio::test]
async fn sse_subscription_since_last_then_resumes_from_its_cursor_not_the_start() {
    let mut server = clients::durable(&[]).await;
    let client = server.client();
    publish_apart(&client, "c", "c", 3).await;
    let mut sub = client
        .subscribe(["c"])
        .since_last(2)
        .connect()
        .await
        .expect("connect");
    assert_eq!(data(next(&mut sub).await), "c2");
    assert_eq!(data(next(&mut sub).await), "c3");
    // A restart drops the stream: the reconnect resumes after c3 (it does
    // not ask for the last 2 again).
    server.restart().await;
    clients::publish_surely(&client, "c", "c4").await;
    assert_eq!(data(next(&mut sub).await), "c4");
    assert_eq!(sub.cursor().map(|c| seq_of(c.as_str(), "c")), Some(4));
}

#[tokio::test]
async fn sse_and_ws_subscriptions_since_time() {
    let server = clients::memory(&["--retention-events", "4"]).await;
    let client = server.client();
    let t = publish_apart(&client, "a", "a", 3).await;
    // Between a1 and a2: from a2, over SSE and WebSocket.
    let mut sse = client
        .subscribe(["a"])
        .since_time(at(t[0] + 1))
        .connect()
        .await
        .expect("sse");
    let mut ws = client
        .subscribe_ws(["a"])
        .since_time(at(t[0] + 1))
        .connect()
        .await
        .expect("ws");
    for want in ["a2", "a3"] {
        assert_eq!(data(next(&mut sse).await), want);
        assert_eq!(data(next(&mut ws).await), want);
    }
    client.publish("a", "a4").send().await.expect("publish");
    assert_eq!(data(next(&mut sse).await), "a4");
    assert_eq!(data(next(&mut ws).await), "a4");

    // Before the floor (6 published, 4 kept): a gap naming seqs up to 2, then the floor.
    for i in 1..=6 {
        client
            .publish("b", format!("b{i}"))
            .send()
            .await
            .expect("publish");
    }
    let mut sse = client
        .subscribe(["b"])
        .start(Start::Time(0))
        .connect()
        .await
        .expect("sse");
    let mut ws = client
        .subscribe_ws(["b"])
        .start(Start::Time(0))
        .connect()
        .await
        .expect("ws");
    for (name, u) in [("sse", next(&mut sse).await), ("ws", next(&mut ws).await)] {
        match u {
            Update::Gap(g) => {
                assert_eq!(
                    (g.reason, g.channel.as_str()),
                    (GapReason::Evicted, "b"),
                    "{name}"
                );
                assert_eq!(g.after.map(|c| seq_of(c.as_str(), "b")), Some(0), "{name}");
                assert_eq!(seq_of(g.next.as_str(), "b"), 2, "{name}");
            }
            other => panic!("{name}: expected a gap, got {other:?}"),
        }
    }
    for want in ["b3", "b4", "b5", "b6"] {
        assert_eq!(data(next(&mut sse).await), want);
        assert_eq!(data(next(&mut ws).await), want);
    }

    // WebSocket since_last.
    let mut ws = client
        .subscribe_ws(["b"])
        .since_last(2)
        .connect()
        .await
        .expect("ws");
    assert_eq!(data(next(&mut ws).await), "b5");
    assert_eq!(data(next(&mut ws).await), "b6");

    // Out of range: refused, terminal, naming the value.
    let refused = client.subscribe(["b"]).since_last(1001).connect().await;
    match refused {
        Err(Error::Api(a)) => {
            assert_eq!((a.status, a.code.as_str()), (400, "invalid_request"));
            assert!(a.message.contains("last:1001"), "{}", a.message);
        }
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
    let mut ws = client.subscribe_ws(["b"]).since_last(0).open();
    match timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("an answer")
    {
        Some(Err(e)) => assert!(e.is_terminal(), "{e}"),
        other => panic!("expected a terminal error, got {other:?}"),
    }
}

#[tokio::test]
async fn history_since_last_and_time() {
    use futures::TryStreamExt;
    let server = clients::memory(&["--retention-events", "4"]).await;
    let client = server.client();
    let t = publish_apart(&client, "h", "h", 3).await;
    let data = |p: &gapless_client::HistoryPage| -> Vec<String> {
        p.events.iter().map(|e| e.data.clone()).collect()
    };
    let page = client
        .history("h")
        .start(Start::Last(2))
        .page()
        .await
        .expect("page");
    assert_eq!(
        (data(&page), page.gap.is_none()),
        (vec!["h2".to_owned(), "h3".to_owned()], true)
    );
    let page = client
        .history("h")
        .start(Start::time(at(t[1])))
        .page()
        .await
        .expect("page");
    assert_eq!(data(&page), ["h2", "h3"]);
    let page = client
        .history("h")
        .start(Start::Live)
        .page()
        .await
        .expect("page");
    assert!(page.events.is_empty() && page.done);
    // The stream reads on from the first page with `after`.
    let all: Vec<String> = client
        .history("h")
        .start(Start::Last(3))
        .limit(1)
        .stream()
        .map_ok(|e| e.data)
        .try_collect()
        .await
        .expect("stream");
    assert_eq!(all, ["h1", "h2", "h3"]);
    // Before the floor: the gap on the page.
    for i in 4..=6 {
        client
            .publish("h", format!("h{i}"))
            .send()
            .await
            .expect("publish");
    }
    let page = client
        .history("h")
        .start(Start::Time(t[0]))
        .page()
        .await
        .expect("page");
    assert_eq!(data(&page), ["h3", "h4", "h5", "h6"]);
    let gap = page.gap.expect("a gap");
    assert_eq!(
        (gap.reason, seq_of(gap.next.as_str(), "h")),
        (GapReason::Evicted, 2)
    );
}

// ---- the CLI ----

fn gapless(args: &[&str]) -> std::process::Output {
    Command::new(gapless_testkit::bin())
        .args(args)
        .env_remove("GAPLESS_SERVER")
        .stdin(Stdio::null())
        .output()
        .expect("run gapless")
}

/// Unix ms as RFC 3339 UTC with milliseconds.
fn rfc3339(ms: u64) -> String {
    let (days, rem) = ((ms / 86_400_000) as i64, ms % 86_400_000);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let s = rem / 1000;
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        s / 3600,
        s % 3600 / 60,
        s % 60,
        rem % 1000
    )
}

#[tokio::test]
async fn cli_tail_and_history_since_last_and_time() {
    let server = clients::memory(&["--retention-events", "4"]).await;
    let client = server.client();
    let base = server.base();
    let s = ["--server", base.as_str()];
    let t = publish_apart(&client, "c", "c", 3).await;

    let tail = Tail::start(&[&["c", "--since", "last:2"][..], &s].concat());
    tail.wait_for(2, 20).await;
    client.publish("c", "c4").send().await.expect("publish");
    tail.wait_for(3, 20).await;
    assert_eq!(*tail.lines.lock().expect("lock"), ["c2", "c3", "c4"]);
    drop(tail);

    // An RFC 3339 time just after c1 (its own millisecond + 1), and the
    // same time in Unix ms: from c2.
    for since in [
        format!("time:{}", rfc3339(t[0] + 1)),
        format!("time:{}", t[0] + 1),
    ] {
        let tail = Tail::start(&[&["c", "--since", since.as_str()][..], &s].concat());
        tail.wait_for(3, 20).await;
        assert_eq!(
            *tail.lines.lock().expect("lock"),
            ["c2", "c3", "c4"],
            "{since}"
        );
    }

    // Before the floor: the gap on stderr, then the retained events.
    for i in 5..=6 {
        client
            .publish("c", format!("c{i}"))
            .send()
            .await
            .expect("publish");
    }
    let tail = Tail::start(&[&["c", "--since", "time:1970-01-01T00:00:00Z"][..], &s].concat());
    tail.wait_for(4, 20).await;
    assert_eq!(*tail.lines.lock().expect("lock"), ["c3", "c4", "c5", "c6"]);
    eventually("the gap on stderr", Duration::from_secs(10), || async {
        tail.stderr
            .lock()
            .expect("lock")
            .iter()
            .any(|l| l.contains("gap on c (evicted)"))
    })
    .await;
    drop(tail);

    // history --since.
    let out = gapless(&[&["history", "c", "--since", "last:2"][..], &s].concat());
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "c5\nc6\n");
    let out = gapless(&[&["history", "c", "--since", "time:0"][..], &s].concat());
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "c3\nc4\nc5\nc6\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gap on c (evicted)"), "{err}");

    // Bad values: one line naming the value, status 1, before any request.
    for bad in [
        "last:0",
        "last:1001",
        "last:x",
        "time:",
        "time:-1",
        "time:2025-02-30T00:00:00Z",
        "time:soon",
    ] {
        for cmd in ["tail", "history"] {
            let out = gapless(&[&[cmd, "c", "--since", bad][..], &s].concat());
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{cmd} --since {bad}: {err}");
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(err.starts_with(&format!("gapless: --since {bad}")), "{err}");
        }
    }
}

/// The join takes a start position as subscriptions do: the last N, from a
/// time (a gap first when it is before the floor), live only, or a cursor;
/// then it follows live, each event once.
#[tokio::test]
async fn join_since_last_time_live_and_cursor() {
    let server = clients::memory(&["--retention-events", "4"]).await;
    let client = server.client();
    let t = publish_apart(&client, "j", "j", 3).await;

    let mut last = client.join("j").since_last(2).open();
    assert_eq!(data(next(&mut last).await), "j2");
    assert_eq!(data(next(&mut last).await), "j3");
    let mut time = client.join("j").since_time(at(t[0] + 1)).open();
    assert_eq!(data(next(&mut time).await), "j2");
    let mut live = client.join("j").start(Start::Live).open();
    let mut from_cursor = {
        let page = client.history("j").page().await.expect("history");
        client
            .join("j")
            .start(Start::After(page.events[1].cursor.clone()))
            .open()
    };
    assert_eq!(data(next(&mut from_cursor).await), "j3");
    // The live join has nothing before this publish; the others go on live.
    let publisher = client.clone();
    let publish = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        publisher.publish("j", "j4").send().await.expect("publish");
    });
    assert_eq!(data(next(&mut live).await), "j4");
    assert_eq!(data(next(&mut last).await), "j4");
    assert_eq!(data(next(&mut from_cursor).await), "j4");
    assert_eq!(data(next(&mut time).await), "j3");
    assert_eq!(data(next(&mut time).await), "j4");
    publish.await.expect("publish task");

    // A time before the floor: the evicted gap, then the floor.
    publish_apart(&client, "j", "k", 4).await;
    let mut old = client.join("j").since_time(at(t[0])).open();
    match next(&mut old).await {
        Update::Gap(g) => assert_eq!(g.reason, GapReason::Evicted),
        other => panic!("expected the evicted gap, got {other:?}"),
    }
    assert_eq!(data(next(&mut old).await), "k1");

    // A value the server refuses ends the join with 400 invalid_request.
    let mut bad = client.join("j").since_last(1001).open();
    let err = timeout(Duration::from_secs(10), bad.next())
        .await
        .expect("an answer in time")
        .expect("an item")
        .expect_err("refused");
    match err {
        Error::Api(a) => assert_eq!((a.status, a.code.as_str()), (400, "invalid_request")),
        other => panic!("expected 400 invalid_request, got {other:?}"),
    }
}

/// Channel info carries the namespace and the retention that applies, as
/// `GET /v1/channels/{channel}` gives them.
#[tokio::test]
async fn channel_info_has_the_namespace_and_its_retention() {
    let server = clients::memory(&["--retention-events", "7"]).await;
    let client = server.client();
    client
        .publish("chat:r1", "x")
        .send()
        .await
        .expect("publish");
    let info = client.channel_info("chat:r1").await.expect("info");
    assert_eq!(info.namespace, "chat");
    assert_eq!(info.retention.events, 7);
    assert_eq!(info.head, 1);
    let plain = client.channel_info("plain").await.expect("info");
    assert_eq!(plain.namespace, "default");
    assert_eq!(plain.retention, info.retention, "the server's settings");
}
