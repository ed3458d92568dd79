//! Start positions beyond `earliest` and live: `since=last:N` (the last N
//! retained events, then live) and `since=time:UNIX_MS` (the first retained
//! event at or after that time, then live; from the floor with an `evicted`
//! gap when an evicted event may be at or after it), over SSE (one channel
//! and several), WebSocket subscribe and history pages; malformed values
//! refused naming them; a cursor still wins over `since`.

use gapless_testkit::ws::{assert_error, datas, Ws};
use gapless_testkit::{make_cursor, seq_of, Event, Server, SseClient};
use serde_json::{json, Value};
use std::time::Duration;

/// The values every transport refuses.
const MALFORMED: &[&str] = &[
    "last:0",
    "last:1001",
    "last:x",
    "time:",
    "time:-1",
    "last:",
    "last:+1",
    "time:1.5",
    "time:99999999999999",
    "latest",
    "",
];

fn data(events: &[Event]) -> Vec<&str> {
    events.iter().map(|e| e.data.as_str()).collect()
}

/// Publishes `data` one event at a time, `gap_ms` apart, so that each has
/// its own commit time; returns those times.
async fn publish_apart(s: &Server, channel: &str, data: &[&str], gap_ms: u64) -> Vec<u64> {
    for d in data {
        s.publish(channel, d).await;
        tokio::time::sleep(Duration::from_millis(gap_ms)).await;
    }
    let events = s.all_events(channel).await;
    let times: Vec<u64> = events
        .iter()
        .rev()
        .take(data.len())
        .rev()
        .map(|e| e["time"].as_u64().expect("time"))
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] < w[1]),
        "each event has its own time: {times:?}"
    );
    times
}

/// Opens an SSE stream and reads its preamble.
async fn stream(s: &Server, target: &str) -> (SseClient, gapless_testkit::Preamble) {
    let mut c = s.sse(target, &[]).await;
    let p = c.preamble().await;
    (c, p)
}

/// Asserts that the next event of `c` is `want` after publishing it: no
/// event older than it was delivered first (a live start).
async fn next_is_live(s: &Server, c: &mut SseClient, channel: &str, want: &str) {
    s.publish(channel, want).await;
    let e = c.next_event().await;
    assert_eq!(
        e.data, want,
        "the next event is the one published after the start"
    );
}

#[tokio::test]
async fn sse_last_n_replays_the_last_n_retained_then_live() {
    let s = Server::start(&["--retention-events", "5"]).await;
    for d in ["a1", "a2", "a3"] {
        s.publish("a", d).await;
    }
    let (mut c, pre) = stream(&s, "/v1/channels/a/sse?since=last:2").await;
    assert!(pre.gaps.is_empty(), "{:?}", pre.gaps);
    assert_eq!(
        seq_of(&pre.cursor, "a"),
        1,
        "the cursor sits before the replay"
    );
    assert_eq!(data(&c.events(2).await), ["a2", "a3"]);
    next_is_live(&s, &mut c, "a", "a4").await;

    // N larger than the channel: everything, no gap.
    let (mut c, pre) = stream(&s, "/v1/channels/a/sse?since=last:1000").await;
    assert!(pre.gaps.is_empty(), "{:?}", pre.gaps);
    assert_eq!(data(&c.events(4).await), ["a1", "a2", "a3", "a4"]);
    next_is_live(&s, &mut c, "a", "a5").await;

    // After eviction (retention 5, 8 published: floor 4): N at the floor and
    // past it give the retained events, no gap (only retained ones are asked for).
    for i in 1..=8 {
        s.publish("b", &format!("b{i}")).await;
    }
    assert_eq!(s.info("b").await["floor"], 4);
    for n in [5, 6, 1000] {
        let (mut c, pre) = stream(&s, &format!("/v1/channels/b/sse?since=last:{n}")).await;
        assert!(pre.gaps.is_empty(), "last:{n}: {:?}", pre.gaps);
        assert_eq!(
            data(&c.events(5).await),
            ["b4", "b5", "b6", "b7", "b8"],
            "last:{n}"
        );
    }
    let (mut c, _) = stream(&s, "/v1/channels/b/sse?since=last:4").await;
    assert_eq!(data(&c.events(4).await), ["b5", "b6", "b7", "b8"]);

    // Several channels: the last N of each.
    let (mut c, pre) = stream(
        &s,
        "/v1/sse?channel=a&channel=b&since=last:2&format=envelope",
    )
    .await;
    assert!(pre.gaps.is_empty(), "{:?}", pre.gaps);
    let mut got: Vec<(String, String)> = c
        .events(4)
        .await
        .iter()
        .map(|e| {
            let v = e.json();
            (
                v["channel"].as_str().expect("channel").to_owned(),
                v["data"].as_str().expect("data").to_owned(),
            )
        })
        .collect();
    got.sort();
    let want: Vec<(String, String)> = [("a", "a4"), ("a", "a5"), ("b", "b7"), ("b", "b8")]
        .iter()
        .map(|(c, d)| ((*c).to_owned(), (*d).to_owned()))
        .collect();
    assert_eq!(got, want);
    s.publish("b", "b9").await;
    assert_eq!(c.next_event().await.json()["data"], "b9");
}

#[tokio::test]
async fn sse_time_starts_at_the_first_event_at_or_after_it() {
    let s = Server::start(&["--retention-events", "5"]).await;
    let t = publish_apart(&s, "t", &["t1", "t2", "t3"], 20).await;

    // At an event's time, and between two events: from the later one.
    for (at, what) in [
        (t[1], "at t2"),
        (t[0] + 1, "just after t1"),
        (t[1] - 1, "just before t2"),
    ] {
        let (mut c, pre) = stream(&s, &format!("/v1/channels/t/sse?since=time:{at}")).await;
        assert!(pre.gaps.is_empty(), "{what}: {:?}", pre.gaps);
        assert_eq!(seq_of(&pre.cursor, "t"), 1, "{what}");
        assert_eq!(data(&c.events(2).await), ["t2", "t3"], "{what}");
    }
    // At the first event's time: everything (nothing evicted, no gap).
    let (mut c, pre) = stream(&s, &format!("/v1/channels/t/sse?since=time:{}", t[0])).await;
    assert!(pre.gaps.is_empty(), "{:?}", pre.gaps);
    assert_eq!(data(&c.events(3).await), ["t1", "t2", "t3"]);

    // After the head: live only.
    let (mut c, pre) = stream(&s, &format!("/v1/channels/t/sse?since=time:{}", t[2] + 1)).await;
    assert!(pre.gaps.is_empty(), "{:?}", pre.gaps);
    assert_eq!(seq_of(&pre.cursor, "t"), 3);
    next_is_live(&s, &mut c, "t", "t4").await;
    // Far in the future (the largest time accepted): live only too.
    let (mut c, pre) = stream(&s, "/v1/channels/t/sse?since=time:9999999999999").await;
    assert!(pre.gaps.is_empty());
    next_is_live(&s, &mut c, "t", "t5").await;

    // Before the floor (retention 5, 8 published: floor 4): from the floor,
    // after an `evicted` gap naming seqs 1 to 3.
    for i in 1..=8 {
        s.publish("f", &format!("f{i}")).await;
    }
    let epoch = s.epoch("f").await;
    for at in [0, t[0]] {
        let (mut c, pre) = stream(&s, &format!("/v1/channels/f/sse?since=time:{at}")).await;
        assert_eq!(pre.gaps.len(), 1, "time:{at}: {:?}", pre.gaps);
        let g = &pre.gaps[0];
        assert_eq!(g["reason"], "evicted");
        assert_eq!(g["channel"], "f");
        assert_eq!(g["after"], make_cursor("f", &epoch, 0));
        assert_eq!(g["next"], make_cursor("f", &epoch, 3));
        assert_eq!(seq_of(&pre.cursor, "f"), 3);
        assert_eq!(data(&c.events(5).await), ["f4", "f5", "f6", "f7", "f8"]);
    }
    // After every retained event: live, no gap.
    let f_times: Vec<u64> = s
        .all_events("f")
        .await
        .iter()
        .map(|e| e["time"].as_u64().expect("time"))
        .collect();
    let after_all = f_times[4] + 1;
    let (mut c, pre) = stream(&s, &format!("/v1/channels/f/sse?since=time:{after_all}")).await;
    assert!(pre.gaps.is_empty(), "{:?}", pre.gaps);
    next_is_live(&s, &mut c, "f", "f9").await;

    // Several channels, one of them before its floor: one gap, for that one.
    let (mut c, pre) = stream(
        &s,
        "/v1/sse?channel=t&channel=f&since=time:0&format=envelope",
    )
    .await;
    assert_eq!(pre.gaps.len(), 1, "{:?}", pre.gaps);
    assert_eq!(pre.gaps[0]["channel"], "f");
    let mut n = std::collections::BTreeMap::<String, usize>::new();
    for e in c.events(10).await {
        *n.entry(e.json()["channel"].as_str().expect("channel").to_owned())
            .or_default() += 1;
    }
    assert_eq!(n.get("t"), Some(&5), "t: every event, 1 to 5: {n:?}");
    assert_eq!(n.get("f"), Some(&5), "f: the retained 5 to 9: {n:?}");
}

#[tokio::test]
async fn malformed_values_are_refused_naming_them() {
    let s = Server::start(&[]).await;
    s.publish("m", "x").await;
    for v in MALFORMED {
        let q = gapless_testkit::pct(v);
        for path in [
            format!("/v1/channels/m/sse?since={q}"),
            format!("/v1/sse?channel=m&since={q}"),
            format!("/v1/channels/m/events?since={q}"),
        ] {
            let r = s.get(&path).await;
            r.expect_error(400, "invalid_request");
            assert!(
                r.message().contains(&format!("{v:?}")),
                "{path}: {}",
                r.message()
            );
        }
    }
    // Checked also when a cursor wins.
    let cursor = s.history("m", "").await.expect(200)["next"]
        .as_str()
        .expect("next")
        .to_owned();
    s.get(&format!(
        "/v1/channels/m/events?after={cursor}&since=last:0"
    ))
    .await
    .expect_error(400, "invalid_request");
    s.get(&format!(
        "/v1/channels/m/sse?last_event_id={cursor}&since=time:-1"
    ))
    .await
    .expect_error(400, "invalid_request");
}

#[tokio::test]
async fn a_cursor_wins_over_since() {
    let s = Server::start(&[]).await;
    for i in 1..=4 {
        s.publish("w", &format!("w{i}")).await;
    }
    let epoch = s.epoch("w").await;
    let at1 = make_cursor("w", &epoch, 1);
    // SSE: the Last-Event-ID header, and last_event_id=.
    let mut c = s
        .sse(
            "/v1/channels/w/sse?since=last:1",
            &[("Last-Event-ID", at1.as_bytes())],
        )
        .await;
    let pre = c.preamble().await;
    assert!(pre.gaps.is_empty());
    assert_eq!(data(&c.events(3).await), ["w2", "w3", "w4"]);
    let (mut c, _) = stream(
        &s,
        &format!("/v1/channels/w/sse?since=time:9999999999999&last_event_id={at1}"),
    )
    .await;
    assert_eq!(data(&c.events(3).await), ["w2", "w3", "w4"]);
    // WebSocket: cursor and since.
    let mut ws = Ws::channels(&s).await;
    ws.subscribe(json!(1), "w", json!({"cursor": at1, "since": "last:1"}))
        .await;
    let msgs = ws.read_until_seq("w", 4, Duration::from_secs(5)).await;
    assert_eq!(datas(&msgs, "w"), ["w2", "w3", "w4"]);
    // History: after wins.
    let page = s.history("w", &format!("after={at1}&since=last:1")).await;
    let page = page.expect(200);
    assert_eq!(page_data(page), ["w2", "w3", "w4"]);
}

/// `lastEventId=`, the query parameter the `event-source-polyfill` npm
/// package resumes with (it sends no `Last-Event-ID` header), is read as
/// `last_event_id=` (issue 29: the stream started live and lost what came
/// between), on both SSE operations; a garbage one is 400 naming it, and
/// `last_event_id` wins when both are given.
#[tokio::test]
async fn the_polyfills_last_event_id_parameter_resumes() {
    let s = Server::start(&[]).await;
    for i in 1..=4 {
        s.publish("p", &format!("p{i}")).await;
    }
    let epoch = s.epoch("p").await;
    let (at1, at2) = (make_cursor("p", &epoch, 1), make_cursor("p", &epoch, 2));
    for path in [
        format!("/v1/channels/p/sse?lastEventId={at1}"),
        format!("/v1/sse?channel=p&lastEventId={at1}"),
    ] {
        let (mut c, pre) = stream(&s, &path).await;
        assert!(pre.gaps.is_empty(), "{path}");
        assert_eq!(data(&c.events(3).await), ["p2", "p3", "p4"], "{path}");
    }
    let (mut c, _) = stream(
        &s,
        &format!("/v1/channels/p/sse?last_event_id={at2}&lastEventId={at1}"),
    )
    .await;
    assert_eq!(data(&c.events(2).await), ["p3", "p4"]);
    let r = s.get("/v1/channels/p/sse?lastEventId=garbage").await;
    r.expect_error(400, "invalid_cursor");
    assert!(r.message().contains("lastEventId"), "{}", r.message());
}

/// `since=time:` takes an RFC 3339 time on SSE, WebSocket and history, as
/// `gapless tail --since` does (issue 29: it took Unix milliseconds only):
/// 1970 replays everything, a time to come nothing, an impossible date is
/// 400 naming it.
#[tokio::test]
async fn since_time_takes_rfc3339_everywhere() {
    let s = Server::start(&[]).await;
    for i in 1..=3 {
        s.publish("r", &format!("r{i}")).await;
    }
    let all = "time:1970-01-01T00:00:00Z";
    let later = "time:2200-01-01T00:00:00%2B01:00";
    let (mut c, _) = stream(&s, &format!("/v1/channels/r/sse?since={all}")).await;
    assert_eq!(data(&c.events(3).await), ["r1", "r2", "r3"]);
    let page = s.history("r", &format!("since={all}")).await;
    assert_eq!(page_data(page.expect(200)), ["r1", "r2", "r3"]);
    let page = s.history("r", &format!("since={later}")).await;
    assert!(page_data(page.expect(200)).is_empty());
    let mut ws = Ws::channels(&s).await;
    ws.subscribe(
        json!(1),
        "r",
        json!({"since": "time:1970-01-01T01:00:00+01:00"}),
    )
    .await;
    let msgs = ws.read_until_seq("r", 3, Duration::from_secs(5)).await;
    assert_eq!(datas(&msgs, "r"), ["r1", "r2", "r3"]);
    let bad = "time:2025-02-29T00:00:00Z";
    let r = s.get(&format!("/v1/channels/r/sse?since={bad}")).await;
    r.expect_error(400, "invalid_request");
    assert!(r.message().contains("RFC 3339"), "{}", r.message());
    ws.expect_op("subscribed").await;
    ws.subscribe(json!(2), "r", json!({"since": bad})).await;
    assert_error(&ws.expect_op("error").await, "invalid_request");
}

fn page_data(page: &Value) -> Vec<&str> {
    page["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["data"].as_str().expect("data"))
        .collect()
}

#[tokio::test]
async fn history_pages_start_where_since_says() {
    let s = Server::start(&["--retention-events", "5"]).await;
    let t = publish_apart(&s, "h", &["h1", "h2", "h3"], 20).await;
    let epoch = s.epoch("h").await;
    let head = make_cursor("h", &epoch, 3);
    let get = |q: String| {
        let s = &s;
        async move { s.history("h", &q).await.expect(200).clone() }
    };

    assert_eq!(
        page_data(&get("since=earliest".into()).await),
        ["h1", "h2", "h3"]
    );
    assert_eq!(page_data(&get("since=last:2".into()).await), ["h2", "h3"]);
    assert_eq!(
        page_data(&get("since=last:1000".into()).await),
        ["h1", "h2", "h3"]
    );
    // Paging on from `next` with `after` (since may stay in the query: after wins).
    let first = get("since=last:2&limit=1".into()).await;
    assert_eq!(
        (page_data(&first), &first["done"]),
        (vec!["h2"], &json!(false))
    );
    let next = first["next"].as_str().expect("next");
    let second = get(format!("since=last:2&limit=1&after={next}")).await;
    assert_eq!(
        (page_data(&second), &second["done"]),
        (vec!["h3"], &json!(true))
    );

    // time: between events, at one, after the head.
    assert_eq!(
        page_data(&get(format!("since=time:{}", t[0] + 1)).await),
        ["h2", "h3"]
    );
    assert_eq!(
        page_data(&get(format!("since=time:{}", t[2])).await),
        ["h3"]
    );
    for q in [format!("since=time:{}", t[2] + 1), "since=live".to_owned()] {
        let p = get(q.clone()).await;
        assert_eq!(page_data(&p), Vec::<&str>::new(), "{q}");
        assert_eq!(
            (&p["done"], &p["next"]),
            (&json!(true), &json!(head)),
            "{q}"
        );
        assert!(p.get("gap").is_none(), "{q}: {p}");
    }
    assert!(get(format!("since=time:{}", t[0]))
        .await
        .get("gap")
        .is_none());

    // time before the floor: from the floor, with the gap.
    for i in 1..=8 {
        s.publish("g", &format!("g{i}")).await;
    }
    let g_epoch = s.epoch("g").await;
    let p = get_of(&s, "g", "since=time:0").await;
    assert_eq!(page_data(&p), ["g4", "g5", "g6", "g7", "g8"]);
    assert_eq!(p["gap"]["reason"], "evicted", "{p}");
    assert_eq!(p["gap"]["channel"], "g");
    assert_eq!(p["gap"]["after"], make_cursor("g", &g_epoch, 0));
    assert_eq!(p["gap"]["next"], make_cursor("g", &g_epoch, 3));
    let p = get_of(&s, "g", "since=last:7").await;
    assert_eq!(
        page_data(&p),
        ["g4", "g5", "g6", "g7", "g8"],
        "last:N past the floor: no gap"
    );
    assert!(p.get("gap").is_none(), "{p}");
}

async fn get_of(s: &Server, channel: &str, q: &str) -> Value {
    s.history(channel, q).await.expect(200).clone()
}

#[tokio::test]
async fn websocket_subscribe_takes_last_and_time() {
    let s = Server::start(&["--retention-events", "5"]).await;
    let t = publish_apart(&s, "a", &["a1", "a2", "a3"], 20).await;
    for i in 1..=8 {
        s.publish("b", &format!("b{i}")).await;
    }
    let epoch_b = s.epoch("b").await;
    let mut ws = Ws::channels(&s).await;

    ws.subscribe(json!(1), "a", json!({"since": "last:2"}))
        .await;
    let msgs = ws.read_until_seq("a", 3, Duration::from_secs(5)).await;
    assert_eq!(datas(&msgs, "a"), ["a2", "a3"]);
    let sub = ws.expect_op("subscribed").await;
    assert_eq!(
        (&sub["id"], &sub["replayed"], &sub["recovered"]),
        (&json!(1), &json!(2), &json!(false))
    );

    // A malformed value: an error for that subscribe only; the socket and
    // its other subscriptions stay.
    for (i, v) in MALFORMED.iter().enumerate() {
        ws.subscribe(json!(100 + i), "c", json!({"since": v})).await;
        let e = ws.expect_op("error").await;
        assert_error(&e, "invalid_request");
        assert_eq!(e["id"], 100 + i);
        assert!(
            e["message"]
                .as_str()
                .unwrap_or_default()
                .contains(&format!("{v:?}")),
            "{e}"
        );
    }
    s.publish("a", "a4").await;
    let live = ws.expect_op("event").await;
    assert_eq!(
        (&live["channel"], &live["data"]),
        (&json!("a"), &json!("a4"))
    );

    // time: between events on a; before the floor on b (gap, then the floor).
    ws.subscribe(
        json!(2),
        "a",
        json!({"since": format!("time:{}", t[1] - 1)}),
    )
    .await;
    let msgs = ws.read_until_seq("a", 4, Duration::from_secs(5)).await;
    assert_eq!(datas(&msgs, "a"), ["a2", "a3", "a4"]);
    assert_eq!(ws.expect_op("subscribed").await["replayed"], 3);
    ws.subscribe(json!(3), "b", json!({"since": "time:0"}))
        .await;
    let gap = ws.expect_op("gap").await;
    assert_eq!(
        (&gap["channel"], &gap["reason"]),
        (&json!("b"), &json!("evicted"))
    );
    assert_eq!(gap["after"], make_cursor("b", &epoch_b, 0));
    assert_eq!(gap["next"], make_cursor("b", &epoch_b, 3));
    let msgs = ws.read_until_seq("b", 8, Duration::from_secs(5)).await;
    assert_eq!(datas(&msgs, "b"), ["b4", "b5", "b6", "b7", "b8"]);
    assert_eq!(ws.expect_op("subscribed").await["replayed"], 5);

    // After the head: live only.
    let a_head = s.all_events("a").await.last().expect("a4")["time"]
        .as_u64()
        .expect("time");
    ws.subscribe(
        json!(4),
        "a",
        json!({"since": format!("time:{}", a_head + 1)}),
    )
    .await;
    let sub = ws.expect_op("subscribed").await;
    assert_eq!((&sub["id"], &sub["replayed"]), (&json!(4), &json!(0)));
    s.publish("a", "a5").await;
    let live = ws.expect_op("event").await;
    assert_eq!(live["data"], "a5");
}

/// Two nodes on one Redis journal: a channel published on one node starts
/// where `since` says on the other (whose hub has not followed it before),
/// over SSE and history, before the floor too.
#[tokio::test]
async fn redis_journal_two_nodes() {
    let Some(redis) = gapless_testkit::redis::Redis::start_or_skip("redis_journal_two_nodes").await
    else {
        return;
    };
    let node = |_: u8| {
        gapless_testkit::Server::with(gapless_testkit::Opts {
            args: vec![
                "--redis".to_owned(),
                redis.url(),
                "--retention-events".to_owned(),
                "5".to_owned(),
            ],
            ..gapless_testkit::Opts::default()
        })
    };
    let (a, b) = (node(1).await, node(2).await);
    let t = publish_apart(&a, "r", &["r1", "r2", "r3"], 20).await;
    let (mut c, pre) = stream(&b, "/v1/channels/r/sse?since=last:2").await;
    assert!(pre.gaps.is_empty(), "{:?}", pre.gaps);
    assert_eq!(data(&c.events(2).await), ["r2", "r3"]);
    let (mut c, pre) = stream(&b, &format!("/v1/channels/r/sse?since=time:{}", t[0] + 1)).await;
    assert!(pre.gaps.is_empty(), "{:?}", pre.gaps);
    assert_eq!(data(&c.events(2).await), ["r2", "r3"]);
    assert_eq!(
        page_data(&get_of(&b, "r", &format!("since=time:{}", t[2])).await),
        ["r3"]
    );
    for i in 4..=8 {
        a.publish("r", &format!("r{i}")).await;
    }
    let epoch = b.epoch("r").await;
    let (mut c, pre) = stream(&b, "/v1/channels/r/sse?since=time:0").await;
    assert_eq!(pre.gaps.len(), 1, "{:?}", pre.gaps);
    assert_eq!(pre.gaps[0]["next"], make_cursor("r", &epoch, 3));
    assert_eq!(data(&c.events(5).await), ["r4", "r5", "r6", "r7", "r8"]);
    let p = get_of(&b, "r", "since=time:0").await;
    assert_eq!(p["gap"]["reason"], "evicted", "{p}");
    assert_eq!(page_data(&p), ["r4", "r5", "r6", "r7", "r8"]);
}
