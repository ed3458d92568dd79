//! Server-Sent Events: headers, the stream's opening (retry, gaps, id frame),
//! where a stream starts, data encoding, envelopes, multi-channel streams,
//! gap notices at connect, heartbeats and limits.

use gapless_testkit::{
    epoch_of, make_cursor, other_version_cursor, seq_of, Event, Item, Next, Server,
};
use serde_json::{json, Value};
use std::time::Duration;

fn cursor(v: &Value) -> String {
    v["cursor"].as_str().expect("cursor").to_owned()
}

fn data(events: &[Event]) -> Vec<&str> {
    events.iter().map(|e| e.data.as_str()).collect()
}

/// The history tip of `channel` (the `next` of the done page).
async fn tip(s: &Server, channel: &str) -> String {
    let mut after = String::new();
    loop {
        let q = if after.is_empty() {
            "limit=1000".to_owned()
        } else {
            format!("limit=1000&after={after}")
        };
        let page = s.history(channel, &q).await.expect(200).clone();
        after = page["next"].as_str().expect("next").to_owned();
        if page["done"] == true {
            return after;
        }
    }
}

#[tokio::test]
async fn sse_response_headers_are_exact_and_never_compressed() {
    let s = Server::start(&[]).await;
    for target in ["/v1/channels/c/sse", "/v1/sse?channel=c&channel=d"] {
        let mut c = s
            .sse(target, &[("Accept-Encoding", b"gzip, deflate, br")])
            .await;
        assert_eq!(c.status, 200);
        assert_eq!(c.header("content-type"), Some("text/event-stream"));
        assert_eq!(c.header("cache-control"), Some("no-cache, no-transform"));
        assert_eq!(c.header("x-accel-buffering"), Some("no"));
        assert_eq!(c.header("content-encoding"), None, "never compressed");
        assert_eq!(c.header("content-length"), None, "a stream has no length");
        // The body is readable as plain text right away (flushed, uncompressed).
        assert!(matches!(c.next_item().await, Item::Retry(_)));
    }
}

#[tokio::test]
async fn stream_starts_with_retry_then_id_frame_at_the_history_tip() {
    let s = Server::start(&["--retry-ms", "2500"]).await;
    s.publish_many("c", "e", 2).await;
    let (c, pre) = s.subscribe("c", "").await;
    assert_eq!(pre.retry, 2500);
    assert!(pre.gaps.is_empty());
    assert_eq!(
        pre.cursor,
        tip(&s, "c").await,
        "the id frame is the channel's tip"
    );
    assert_eq!(
        c.raw_text(),
        format!("retry: 2500\n\nid: {}\n\n", pre.cursor),
        "exact opening bytes"
    );
    // Default retry is 1000.
    let d = Server::memory(&[]).await;
    let (_, pre) = d.subscribe("c", "").await;
    assert_eq!(pre.retry, 1000);
}

#[tokio::test]
async fn stream_without_cursor_is_live_only() {
    let s = Server::start(&[]).await;
    s.publish_many("c", "old", 3).await;
    for query in ["", "since=live"] {
        let (mut c, pre) = s.subscribe("c", query).await;
        assert_eq!(
            seq_of(&pre.cursor, "c"),
            s.info("c").await["head"].as_u64().expect("head")
        );
        let p = s.publish("c", &format!("live-{query}")).await;
        let e = c.next_event().await;
        assert_eq!(
            e.data,
            format!("live-{query}"),
            "only events published after connecting"
        );
        assert_eq!(e.id.as_deref(), Some(cursor(&p).as_str()));
        assert_eq!(e.event, "message");
        assert_eq!(c.last_event_id(), cursor(&p));
    }
}

#[tokio::test]
async fn since_earliest_replays_everything_retained_then_live() {
    let s = Server::start(&["--retention-events", "5"]).await;
    s.publish_many("c", "e", 8).await;
    let (mut c, pre) = s.subscribe("c", "since=earliest").await;
    assert!(
        pre.gaps.is_empty(),
        "since=earliest is not a gap: {:?}",
        pre.gaps
    );
    assert_eq!(seq_of(&pre.cursor, "c"), 3, "starts just below the floor");
    let replay = c.events(5).await;
    assert_eq!(data(&replay), ["e3", "e4", "e5", "e6", "e7"]);
    let ids: Vec<u64> = replay
        .iter()
        .map(|e| seq_of(e.id.as_deref().expect("id"), "c"))
        .collect();
    assert_eq!(ids, [4, 5, 6, 7, 8]);
    s.publish("c", "live").await;
    assert_eq!(c.next_event().await.data, "live");
}

#[tokio::test]
async fn resume_with_last_event_id_header_gets_exactly_what_was_missed() {
    let s = Server::start(&[]).await;
    let c1 = cursor(&s.publish("c", "e1").await);
    let c2 = cursor(&s.publish("c", "e2").await);
    let c3 = cursor(&s.publish("c", "e3").await);
    let (mut sub, pre) = s.resume("c", &c1).await;
    assert!(pre.gaps.is_empty());
    assert_eq!(pre.cursor, c1, "the id frame is where the stream resumes");
    let got = sub.events(2).await;
    assert_eq!(data(&got), ["e2", "e3"]);
    assert_eq!(got[0].id.as_deref(), Some(c2.as_str()));
    assert_eq!(got[1].id.as_deref(), Some(c3.as_str()));
    let c4 = cursor(&s.publish("c", "e4").await);
    let e4 = sub.next_event().await;
    assert_eq!(
        (e4.data.as_str(), e4.id.as_deref()),
        ("e4", Some(c4.as_str()))
    );
}

#[tokio::test]
async fn resume_with_last_event_id_query() {
    let s = Server::start(&[]).await;
    let c1 = cursor(&s.publish("c", "e1").await);
    s.publish("c", "e2").await;
    let (mut sub, pre) = s.subscribe("c", &format!("last_event_id={c1}")).await;
    assert!(pre.gaps.is_empty());
    assert_eq!(sub.next_event().await.data, "e2");
    s.publish("c", "e3").await;
    assert_eq!(sub.next_event().await.data, "e3");
}

#[tokio::test]
async fn last_event_id_header_wins_over_query_and_empty_header_is_absent() {
    let s = Server::start(&[]).await;
    let c1 = cursor(&s.publish("c", "e1").await);
    let c2 = cursor(&s.publish("c", "e2").await);
    s.publish("c", "e3").await;

    let target = format!("/v1/channels/c/sse?last_event_id={c1}");
    let mut sub = s.sse(&target, &[("Last-Event-ID", c2.as_bytes())]).await;
    sub.preamble().await;
    assert_eq!(sub.next_event().await.data, "e3", "the header wins");

    // An empty header is absent: the query applies.
    let mut sub = s.sse(&target, &[("Last-Event-ID", b"")]).await;
    sub.preamble().await;
    assert_eq!(data(&sub.events(2).await), ["e2", "e3"]);

    // An empty header alone: live only, no gap.
    let mut sub = s.sse("/v1/channels/c/sse", &[("Last-Event-ID", b"")]).await;
    let pre = sub.preamble().await;
    assert!(pre.gaps.is_empty(), "{:?}", pre.gaps);
    s.publish("c", "e4").await;
    assert_eq!(sub.next_event().await.data, "e4");
}

#[tokio::test]
async fn unreadable_last_event_id_header_is_200_with_unknown_gap() {
    let s = Server::start(&[]).await;
    s.publish_many("c", "e", 2).await;
    let epoch = s.epoch("c").await;
    let other_channel = make_cursor("elsewhere", &epoch, 1);
    let other_version = other_version_cursor();
    // An id this server issued with a control byte added: a browser echoes
    // whatever id it last read, so control bytes (invalid in a header value,
    // RFC 9110 section 5.5) make the id unreadable, not the request.
    let real = cursor(&s.publish("c", "e3").await);
    let with_control = [real.as_bytes(), b"\x01"].concat();
    let bad: [&[u8]; 8] = [
        b"\xff\xfe\x80 not utf-8",
        b"garbage",
        other_version.as_bytes(),
        other_channel.as_bytes(),
        b"AAAAAAAAAAAA",
        b"a\x01b",
        b"\x7f\x1b[0m",
        &with_control,
    ];
    for (i, header) in bad.into_iter().enumerate() {
        let mut sub = s
            .sse("/v1/channels/c/sse", &[("Last-Event-ID", header)])
            .await;
        assert_eq!(
            sub.status, 200,
            "header {header:?}: a browser gives up on non-200"
        );
        let pre = sub.preamble().await;
        assert_eq!(pre.gaps.len(), 1, "{header:?}");
        let gap = &pre.gaps[0];
        assert_eq!(gap["reason"], "unknown");
        assert_eq!(gap["channel"], "c");
        assert!(
            gap["after"].is_null(),
            "after is null for an unreadable id: {gap}"
        );
        let head = 3 + i as u64;
        assert_eq!(
            gap["next"].as_str().map(|n| seq_of(n, "c")),
            Some(head),
            "next is the head"
        );
        assert_eq!(
            pre.cursor, gap["next"],
            "the id frame carries the new position"
        );
        // Continues live from the head.
        s.publish("c", &format!("live{i}")).await;
        let e = sub.next_event().await;
        assert_eq!(e.data, format!("live{i}"));
        assert_eq!(seq_of(e.id.as_deref().expect("id"), "c"), head + 1);
    }
}

#[tokio::test]
async fn garbage_last_event_id_query_is_400_but_other_version_is_a_gap() {
    let s = Server::start(&[]).await;
    let good = cursor(&s.publish("c", "e1").await);
    let mut flipped = good.clone().into_bytes();
    flipped[5] = if flipped[5] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).expect("ascii");
    // A control byte in the query (percent-encoded) is garbage too: 400, as
    // the query is the caller's own (the header, which a browser replays, is a gap).
    for bad in ["garbage", flipped.as_str(), "%01", &format!("{good}%01")] {
        let mut sub = s
            .sse(&format!("/v1/channels/c/sse?last_event_id={bad}"), &[])
            .await;
        assert_eq!(sub.status, 400, "{bad}");
        let body = sub.body_json().await;
        assert_eq!(body["error"], "invalid_cursor");
        assert!(body["message"].is_string());
        assert!(sub
            .header("content-type")
            .is_some_and(|c| c.starts_with("application/json")));
    }
    let (_, pre) = s
        .subscribe("c", &format!("last_event_id={}", other_version_cursor()))
        .await;
    assert_eq!(pre.gaps.len(), 1);
    assert_eq!(pre.gaps[0]["reason"], "unknown");
}

#[tokio::test]
async fn bad_sse_parameters_are_400() {
    let s = Server::start(&["--max-subscription-channels", "2"]).await;
    for target in [
        "/v1/channels/c/sse?since=yesterday",
        "/v1/channels/c/sse?format=xml",
        "/v1/sse",
        "/v1/sse?channel=a&channel=b&channel=c",
    ] {
        let mut sub = s.sse(target, &[]).await;
        assert_eq!(sub.status, 400, "{target}");
        let body = sub.body_json().await;
        assert_eq!(body["error"], "invalid_request", "{target}: {body}");
    }
    let mut sub = s.sse("/v1/sse?channel=a&channel=b&channel=c", &[]).await;
    let body = sub.body_json().await;
    assert!(
        body["message"].as_str().is_some_and(|m| m.contains('2')),
        "names the limit: {body}"
    );
    let mut ok = s.sse("/v1/sse?channel=a&channel=b", &[]).await;
    ok.preamble().await;
}

#[tokio::test]
async fn max_subscription_channels_defaults_to_64() {
    let s = Server::memory(&[]).await;
    let names = |n: usize| {
        (0..n)
            .map(|i| format!("channel=ch{i}"))
            .collect::<Vec<_>>()
            .join("&")
    };
    let mut sub = s.sse(&format!("/v1/sse?{}", names(65)), &[]).await;
    assert_eq!(sub.status, 400);
    assert_eq!(sub.body_json().await["error"], "invalid_request");
    let mut sub = s.sse(&format!("/v1/sse?{}", names(64)), &[]).await;
    sub.preamble().await;
    // Repeats count as given (the OpenAPI document's `maxItems`): 65
    // parameters naming one channel are refused too.
    let repeated = vec!["channel=same"; 65].join("&");
    let mut sub = s.sse(&format!("/v1/sse?{repeated}"), &[]).await;
    assert_eq!(sub.status, 400);
    assert_eq!(sub.body_json().await["error"], "invalid_request");
}

#[tokio::test]
async fn data_line_breaks_are_split_and_cannot_inject_fields_or_events() {
    let s = Server::start(&[]).await;
    let (mut sub, _) = s.subscribe("c", "").await;
    let evil = "a\r\nb\rc\nd\n\nid: x\nevent: gap";
    let p = s.publish("c", evil).await;
    s.publish("c", "end").await;
    let e = sub.next_event().await;
    assert_eq!(
        e.data, "a\nb\nc\nd\n\nid: x\nevent: gap",
        "every line end becomes LF"
    );
    assert_eq!(e.event, "message", "no injected event type");
    assert_eq!(e.id.as_deref(), Some(cursor(&p).as_str()), "no injected id");
    assert_eq!(e.last_event_id, cursor(&p));
    let next = sub.next_event().await;
    assert_eq!(next.data, "end", "the evil data was exactly one event");
    let expected_frame = format!(
        "id: {}\ndata: a\ndata: b\ndata: c\ndata: d\ndata: \ndata: id: x\ndata: event: gap\n\n",
        cursor(&p)
    );
    assert!(
        sub.raw_text().contains(&expected_frame),
        "wire frame: {:?}",
        sub.raw_text()
    );
}

#[tokio::test]
async fn data_round_trips_through_a_spec_parser() {
    let s = Server::start(&[]).await;
    let (mut sub, _) = s.subscribe("c", "").await;
    let cases = [
        "",
        " leading space",
        "  two spaces",
        "trailing newline\n",
        "\n",
        "tab\there",
        "unicode é ✓ 🚀",
        ":not a comment",
        "data: not a field",
        "retry: 1",
        "\u{feff}bom-like",
    ];
    for d in cases {
        s.publish("c", d).await;
    }
    for d in cases {
        let e = sub.next_event().await;
        assert_eq!(e.data, d);
        assert_eq!(e.event, "message");
    }
    assert_eq!(sub.last_event_id(), tip(&s, "c").await);
}

#[tokio::test]
async fn envelope_format_carries_channel_seq_type_data_time() {
    let s = Server::start(&[]).await;
    let (mut sub, _) = s.subscribe("c", "format=envelope").await;
    let p = s.publish_q("c", "type=chat.msg", "hello\nworld").await;
    s.publish("c", "plain").await;
    let history = s.all_events("c").await;

    let e = sub.next_event().await;
    assert_eq!(e.event, "chat.msg");
    assert_eq!(e.id.as_deref(), Some(cursor(&p).as_str()));
    assert_eq!(
        e.json(),
        json!({"channel": "c", "seq": 1, "type": "chat.msg", "data": "hello\nworld", "time": history[0]["time"]})
    );
    let e = sub.next_event().await;
    assert_eq!(e.event, "message");
    assert_eq!(
        e.json(),
        json!({"channel": "c", "seq": 2, "type": null, "data": "plain", "time": history[1]["time"]})
    );
    // Ephemeral events are not ordered with journaled ones (they bypass the
    // journal), so this one is published only after the others arrived.
    s.post(
        "/v1/channels/c/events?ephemeral=true&type=typing",
        "eph",
        &[],
    )
    .await
    .expect(202);
    let eph = sub.next_event().await;
    assert_eq!(eph.id, None);
    assert_eq!(eph.event, "typing");
    let env = eph.json();
    assert_eq!(
        (
            env["channel"].clone(),
            env["seq"].clone(),
            env["data"].clone()
        ),
        (json!("c"), json!(null), json!("eph"))
    );
    assert!(env["time"].is_u64());
}

/// `format=message`: the envelope, with every event of the default type
/// `message` (the type inside the envelope), so an EventSource's
/// `onmessage` sees every event; the same ids as `envelope`; gap notices keep
/// their type. One channel and several, typed, untyped and ephemeral.
#[tokio::test]
async fn message_format_sends_every_event_as_a_message_with_its_type_inside() {
    let s = Server::memory(&[]).await;
    for (ch, q, d) in [
        ("fa", "type=quote", "q1"),
        ("fa", "", "plain"),
        ("fb", "type=chat.msg", "hello\nworld"),
    ] {
        s.publish_q(ch, q, d).await;
    }
    for target in [
        "/v1/channels/fa/sse?since=earliest",
        "/v1/sse?channel=fa&channel=fb&since=earliest",
    ] {
        let mut env = s.sse(&format!("{target}&format=envelope"), &[]).await;
        env.preamble().await;
        let mut msg = s.sse(&format!("{target}&format=message"), &[]).await;
        msg.preamble().await;
        let n = if target.contains("fb") { 3 } else { 2 };
        let (want, got) = (env.events(n).await, msg.events(n).await);
        for (w, g) in want.iter().zip(&got) {
            assert_eq!(g.event, "message", "{target}: {g:?}");
            assert_eq!((&g.id, &g.data), (&w.id, &w.data), "{target}");
            let t = g.json()["type"].clone();
            let want_t = if w.event == "message" {
                json!(null)
            } else {
                json!(w.event)
            };
            assert_eq!(t, want_t, "{target}");
        }
        // An ephemeral event, typed.
        s.post(
            "/v1/channels/fa/events?ephemeral=true&type=typing",
            "eph",
            &[],
        )
        .await
        .expect(202);
        let e = msg.next_event().await;
        assert_eq!((e.event.as_str(), e.id.as_deref()), ("message", None));
        assert_eq!(
            (e.json()["type"].clone(), e.json()["data"].clone()),
            (json!("typing"), json!("eph"))
        );
    }
    // A notice keeps its type: a cursor of another version is a gap `unknown`.
    let mut c = s
        .sse(
            "/v1/channels/fa/sse?format=message",
            &[("Last-Event-ID", other_version_cursor().as_bytes())],
        )
        .await;
    let pre = c.preamble().await;
    assert_eq!(pre.gaps.len(), 1, "{:?}", pre.gaps);
    // A format that is none of these is refused, naming them.
    let r = s.get("/v1/channels/fa/sse?format=typeless").await;
    r.expect_error(400, "invalid_request");
    assert!(
        r.message().contains("plain, envelope or message"),
        "{}",
        r.message()
    );
}

#[tokio::test]
async fn multi_channel_resume_delivers_every_missed_event_per_channel_in_order() {
    let s = Server::start(&[]).await;
    let url = "/v1/sse?channel=ma&channel=mb&format=envelope";
    let mut first = s.sse(url, &[]).await;
    let c0 = first.preamble().await.cursor;
    assert_eq!((seq_of(&c0, "ma"), seq_of(&c0, "mb")), (0, 0));
    drop(first);

    for (ch, d) in [
        ("ma", "a1"),
        ("mb", "b1"),
        ("mc", "c1"),
        ("ma", "a2"),
        ("mb", "b2"),
        ("ma", "a3"),
        ("mc", "c2"),
    ] {
        s.publish(ch, d).await;
    }
    let mut sub = s.sse(url, &[("Last-Event-ID", c0.as_bytes())]).await;
    let pre = sub.preamble().await;
    assert!(pre.gaps.is_empty(), "{:?}", pre.gaps);
    let got = sub.events(5).await;
    let mut per: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let mut delivered =
        std::collections::HashMap::from([("ma".to_owned(), 0u64), ("mb".to_owned(), 0u64)]);
    for e in &got {
        let env = e.json();
        let ch = env["channel"].as_str().expect("channel").to_owned();
        let seq = env["seq"].as_u64().expect("seq");
        delivered.insert(ch.clone(), seq);
        // The id holds every channel's position after this event.
        let id = e.id.as_deref().expect("id");
        assert_eq!(
            seq_of(id, "ma"),
            delivered["ma"],
            "id position on ma after {env}"
        );
        assert_eq!(
            seq_of(id, "mb"),
            delivered["mb"],
            "id position on mb after {env}"
        );
        per.entry(ch)
            .or_default()
            .push(env["data"].as_str().expect("data").to_owned());
    }
    assert_eq!(per["ma"], ["a1", "a2", "a3"]);
    assert_eq!(per["mb"], ["b1", "b2"]);
    assert!(!per.contains_key("mc"), "no other channel's events");

    // Nothing else pending: a new event is next (and mc is still not delivered).
    s.publish("mc", "c3").await;
    s.publish("mb", "b3").await;
    assert_eq!(sub.next_event().await.json()["data"], "b3");

    // Resuming from the id of a middle event resumes every channel.
    let mid = got[1].id.clone().expect("id");
    let mut again = s.sse(url, &[("Last-Event-ID", mid.as_bytes())]).await;
    assert!(again.preamble().await.gaps.is_empty());
    let rest = again.events(4).await;
    let mut rest_data: Vec<String> = rest
        .iter()
        .map(|e| e.json()["data"].as_str().expect("data").to_owned())
        .collect();
    let mut want: Vec<String> = got[2..]
        .iter()
        .map(|e| e.json()["data"].as_str().expect("d").to_owned())
        .collect();
    want.push("b3".into());
    rest_data.sort();
    want.sort();
    assert_eq!(rest_data, want);

    // The same works through the query parameter.
    let mut q = s.sse(&format!("{url}&last_event_id={c0}"), &[]).await;
    assert!(q.preamble().await.gaps.is_empty());
    assert_eq!(q.events(6).await.len(), 6);
}

#[tokio::test]
async fn multi_channel_cursor_starts_a_channel_new_to_the_url_live() {
    let s = Server::start(&[]).await;
    let mut first = s.sse("/v1/sse?channel=na&channel=nb", &[]).await;
    let c0 = first.preamble().await.cursor;
    drop(first);
    s.publish("na", "a1").await;
    s.publish("nc", "c-old").await;
    let mut sub = s
        .sse(
            "/v1/sse?channel=na&channel=nb&channel=nc",
            &[("Last-Event-ID", c0.as_bytes())],
        )
        .await;
    let pre = sub.preamble().await;
    assert!(
        pre.gaps.is_empty(),
        "a first visit is not a gap: {:?}",
        pre.gaps
    );
    assert_eq!(seq_of(&pre.cursor, "nc"), 1, "nc starts at its head");
    assert_eq!(seq_of(&pre.cursor, "na"), 0, "na resumes from the cursor");
    assert_eq!(sub.next_event().await.data, "a1");
    s.publish("nc", "c-new").await;
    let e = sub.next_event().await;
    assert_eq!(e.data, "c-new", "nc's old events are not replayed");
    assert_eq!(seq_of(e.id.as_deref().expect("id"), "nc"), 2);
    assert_eq!(seq_of(e.id.as_deref().expect("id"), "na"), 1);

    // A cursor covering none of the URL's channels is unreadable: one unknown gap per channel.
    let mut sub = s
        .sse(
            "/v1/sse?channel=x1&channel=x2",
            &[("Last-Event-ID", c0.as_bytes())],
        )
        .await;
    let pre = sub.preamble().await;
    let mut reasons: Vec<_> = pre
        .gaps
        .iter()
        .map(|g| (g["channel"].clone(), g["reason"].clone()))
        .collect();
    reasons.sort_by_key(|(c, _)| c.to_string());
    assert_eq!(
        reasons,
        [
            (json!("x1"), json!("unknown")),
            (json!("x2"), json!("unknown"))
        ]
    );
}

#[tokio::test]
async fn subscribe_to_empty_channel_then_resume_from_id_frame_without_gap() {
    let s = Server::start(&[]).await;
    let (sub, pre) = s.subscribe("fresh", "").await;
    assert_eq!(seq_of(&pre.cursor, "fresh"), 0);
    drop(sub);
    s.publish_many("fresh", "e", 3).await;
    let (mut sub, pre2) = s.resume("fresh", &pre.cursor).await;
    assert!(pre2.gaps.is_empty(), "{:?}", pre2.gaps);
    assert_eq!(data(&sub.events(3).await), ["e0", "e1", "e2"]);
}

#[tokio::test]
async fn gap_evicted_at_connect_names_the_hole_then_continues_live() {
    let s = Server::start(&["--retention-events", "3"]).await;
    let c1 = cursor(&s.publish("c", "e1").await);
    s.publish_many("c", "x", 5).await; // head 6, floor 4
    let (mut sub, pre) = s.resume("c", &c1).await;
    assert_eq!(pre.gaps.len(), 1);
    let gap = &pre.gaps[0];
    assert_eq!(gap["channel"], "c");
    assert_eq!(gap["reason"], "evicted");
    assert_eq!(gap["after"], c1.as_str());
    assert_eq!(
        gap["next"].as_str().map(|n| seq_of(n, "c")),
        Some(6),
        "next is the head"
    );
    assert_eq!(pre.cursor, gap["next"]);
    // The gap frame itself: event: gap, JSON data, no id line.
    assert!(
        sub.raw_text()
            .starts_with("retry: 1000\n\nevent: gap\ndata: {"),
        "{:?}",
        sub.raw_text()
    );
    // Never a partial replay: the next event is the next live one.
    s.publish("c", "e7").await;
    let e = sub.next_event().await;
    assert_eq!(e.data, "e7");
    assert_eq!(seq_of(e.id.as_deref().expect("id"), "c"), 7);
}

#[tokio::test]
async fn gap_when_cursor_ahead_of_head_or_of_another_epoch() {
    let s = Server::start(&[]).await;
    s.publish_many("c", "e", 3).await;
    let epoch = s.epoch("c").await;
    let ahead = make_cursor("c", &epoch, 10);
    let (mut sub, pre) = s.resume("c", &ahead).await;
    assert_eq!(pre.gaps.len(), 1);
    assert_eq!(pre.gaps[0]["reason"], "ahead");
    assert_eq!(pre.gaps[0]["after"], ahead.as_str());
    assert_eq!(
        pre.gaps[0]["next"].as_str().map(|n| seq_of(n, "c")),
        Some(3)
    );
    assert_eq!(pre.cursor, pre.gaps[0]["next"]);
    s.publish("c", "e4").await;
    assert_eq!(
        seq_of(sub.next_event().await.id.as_deref().expect("id"), "c"),
        4
    );

    let other_epoch = format!(
        "{:016x}",
        u64::from_str_radix(&epoch, 16).expect("hex") ^ 0xff
    );
    let old = make_cursor("c", &other_epoch, 2);
    let (_, pre) = s.resume("c", &old).await;
    assert_eq!(pre.gaps.len(), 1);
    assert_eq!(pre.gaps[0]["reason"], "epoch");
    assert_eq!(pre.gaps[0]["after"], old.as_str());
    let next = pre.gaps[0]["next"].as_str().expect("next");
    assert_eq!((seq_of(next, "c"), epoch_of(next, "c")), (4, epoch));
}

#[tokio::test]
async fn heartbeat_comment_arrives_on_an_idle_stream() {
    let s = Server::memory(&["--heartbeat-ms", "200"]).await;
    let (mut sub, _) = s.subscribe("c", "").await;
    for _ in 0..2 {
        match sub.next_within(Duration::from_secs(3)).await {
            Some(Next::Item(Item::Comment(text))) => assert_eq!(text, ""),
            other => panic!("expected a heartbeat comment, got {other:?}"),
        }
    }
    assert!(
        sub.raw_text().ends_with(":\n\n:\n\n"),
        "{:?}",
        sub.raw_text()
    );
}

/// The server's streams share one clock, but do not all heartbeat at one
/// instant: they take the clock's four phases in turn (`ops/stream.rs`
/// `PHASES`, `Clock::phase`), so even streams opened together (a reconnect
/// storm) write their heartbeats in groups spread over the period rather
/// than in one burst. Four streams opened at once heartbeat in steps about a
/// quarter period apart, each once per period, the first within a period of
/// its open.
#[tokio::test]
async fn streams_opened_together_heartbeat_in_phases_spread_over_the_period() {
    const PERIOD_MS: u64 = 1600;
    let s = Server::memory(&["--heartbeat-ms", &PERIOD_MS.to_string()]).await;
    // Two heartbeats' arrival times on a stream, in ms since `t0`.
    async fn beats(sub: &mut gapless_testkit::SseClient, t0: std::time::Instant) -> [u64; 2] {
        let mut at = [0u64; 2];
        for slot in &mut at {
            match sub.next_within(Duration::from_secs(5)).await {
                Some(Next::Item(Item::Comment(text))) => assert_eq!(text, ""),
                other => panic!("expected a heartbeat comment, got {other:?}"),
            }
            *slot = u64::try_from(t0.elapsed().as_millis()).expect("ms");
        }
        at
    }
    // A first stream starts the clock; the four come a period later, so
    // each first heartbeat comes within one period of their open.
    let (_first, _) = s.subscribe("c", "").await;
    tokio::time::sleep(Duration::from_millis(PERIOD_MS * 9 / 8)).await;
    let t0 = std::time::Instant::now();
    let mut subs = Vec::new();
    for _ in 0..4 {
        subs.push(s.subscribe("c", "").await.0);
    }
    let [a, b, c, d] = &mut subs[..] else {
        unreachable!("four streams")
    };
    let beats = tokio::join!(beats(a, t0), beats(b, t0), beats(c, t0), beats(d, t0));
    let beats = [beats.0, beats.1, beats.2, beats.3];
    for at in beats {
        let apart = at[1] - at[0];
        assert!(
            (PERIOD_MS * 3 / 4..=PERIOD_MS * 5 / 4).contains(&apart),
            "one heartbeat per period ({PERIOD_MS} ms), got {beats:?}"
        );
        assert!(
            at[0] <= PERIOD_MS * 5 / 4,
            "the first heartbeat within a period of the open, got {beats:?}"
        );
    }
    // Four phases a quarter period apart: the first heartbeats span about
    // three quarters of the period (one stream per phase), at least half of
    // it given the scheduling of a loaded machine; one phase would put them
    // all within a few milliseconds.
    let firsts = beats.map(|at| at[0]);
    let spread = firsts.iter().max().unwrap_or(&0) - firsts.iter().min().unwrap_or(&0);
    assert!(
        spread >= PERIOD_MS / 2,
        "heartbeats of streams opened together should be spread over the period; \
         first heartbeats at {firsts:?} ms (spread {spread} ms)"
    );
}

#[tokio::test]
async fn heartbeat_zero_sends_none() {
    let s = Server::memory(&["--heartbeat-ms", "0"]).await;
    let (mut sub, _) = s.subscribe("c", "").await;
    // Silence is the behaviour under test, so this waits a fixed time.
    assert_eq!(sub.next_within(Duration::from_millis(700)).await, None);
    s.publish("c", "x").await;
    match sub.next_item().await {
        Item::Event(e) => assert_eq!(e.data, "x"),
        other => panic!("expected the event and no heartbeat before it, got {other:?}"),
    }
}
