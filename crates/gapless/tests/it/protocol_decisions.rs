//! The protocol questions that `docs/protocol.md` once left open, each
//! decided there and checked here against the real binary.

use gapless_testkit::ws::{
    append_ok, consume, consumer_path, end_session, new_session, Msg, Ws, PROTOCOL, WAIT,
};
use gapless_testkit::Server;
use serde_json::json;

#[tokio::test]
async fn a_session_cancelled_by_its_grace_window_is_ended_not_expired() {
    let s = Server::memory(&["--session-grace-ms", "300"]).await;
    let id = new_session(&s, "g").await;
    append_ok(&s, &id, "e2").await;
    gapless_testkit::eventually("the grace window cancels it", WAIT, || async {
        s.get(&format!("/v1/sessions/{id}")).await.json["status"] == "cancelled"
    })
    .await;
    // With last_seq: the rest, then how it ended, then close 1000 (as after a producer's cancel).
    let mut c = consume(&s, &id, "last_seq=1").await;
    assert_eq!(c.expect_op("event").await["data"], "e2");
    assert_eq!(c.expect_op("session.resumed").await["replayed_events"], 1);
    assert_eq!(c.expect_op("session.cancelled").await["seq"], 3);
    assert_eq!(c.expect_close().await.0, 1000);
    // Without last_seq there is nothing live to attach to: close 4404 (the
    // design's "unknown, completed or cancelled session") with the `error`
    // message `session_ended` and its `status` (ended, not expired).
    let mut c = consume(&s, &id, "").await;
    let e = c.expect_op("error").await;
    assert_eq!(
        (&e["code"], &e["status"]),
        (&json!("session_ended"), &json!("cancelled"))
    );
    assert_eq!(c.expect_close().await.0, 4404);
}

#[tokio::test]
async fn last_seq_at_the_end_marker_gets_resumed_then_the_end() {
    let s = Server::memory(&[]).await;
    let id = new_session(&s, "done").await;
    append_ok(&s, &id, "e2").await;
    assert_eq!(
        end_session(&s, &id, "complete").await.expect(200)["head"],
        3
    );
    let mut c = consume(&s, &id, "last_seq=3").await;
    assert_eq!(
        c.json().await,
        json!({"op": "session.resumed", "session": "done", "replayed_events": 0, "head": 3})
    );
    assert_eq!(
        c.json().await,
        json!({"op": "session.completed", "session": "done", "seq": 3})
    );
    assert_eq!(c.expect_close().await.0, 1000);
    // Past the marker: beyond the newest event, 4410.
    let mut c = consume(&s, &id, "last_seq=4").await;
    assert_eq!(c.expect_op("error").await["code"], "session_not_retained");
    assert_eq!(c.expect_close().await.0, 4410);
}

#[tokio::test]
async fn a_negative_or_malformed_last_seq_is_a_400_before_the_upgrade() {
    let s = Server::memory(&[]).await;
    let id = new_session(&s, "n").await;
    for q in ["last_seq=-1", "last_seq=1.5", "last_seq="] {
        let r = Ws::try_connect(s.addr, &consumer_path(&id, q), &[PROTOCOL])
            .await
            .err()
            .unwrap_or_else(|| panic!("{q} was accepted"));
        assert_eq!(
            (r.status, r.json["error"].clone()),
            (400, json!("invalid_request")),
            "{q}"
        );
        assert!(
            r.json["message"]
                .as_str()
                .is_some_and(|m| m.contains("last_seq")),
            "{q}"
        );
    }
}

#[tokio::test]
async fn resume_disabled_also_refuses_last_seq_zero() {
    let s = Server::memory(&["--session-resume", "false"]).await;
    let id = new_session(&s, "z").await;
    let mut c = consume(&s, &id, "last_seq=0").await;
    assert_eq!(c.expect_op("error").await["code"], "resume_disabled");
    assert_eq!(c.expect_close().await.0, 4400);
}

#[tokio::test]
async fn websocket_cursor_null_is_live_and_a_cursor_of_another_channel_is_refused() {
    let s = Server::memory(&[]).await;
    s.publish("a", "old").await;
    let b_cursor = s.publish("b", "x").await["cursor"].clone();
    let mut ws = Ws::channels(&s).await;
    ws.subscribe(json!(1), "a", json!({"cursor": null})).await;
    let r = ws.expect_op("subscribed").await;
    assert_eq!(
        (r["replayed"].clone(), r["recovered"].clone()),
        (json!(0), json!(false))
    );
    s.publish("a", "new").await;
    assert_eq!(ws.expect_op("event").await["data"], "new");
    // A cursor of channel b, given for channel a: refused, the socket stays open.
    ws.subscribe(json!(2), "a", json!({"cursor": b_cursor}))
        .await;
    let e = ws.expect_op("error").await;
    assert_eq!(
        (e["id"].clone(), e["code"].clone()),
        (json!(2), json!("invalid_cursor"))
    );
    ws.subscribe_live("b").await;
}

#[tokio::test]
async fn a_cursor_naming_one_channel_twice_is_refused_as_malformed_everywhere() {
    let s = Server::memory(&[]).await;
    s.publish_many("c", "e", 3).await;
    let epoch = s.epoch("c").await;
    let twice = gapless_testkit::channel_twice_cursor("c", &epoch, 2);
    let says = "malformed cursor: the same channel twice";
    // History and the SSE query: the caller's own cursor, so 400.
    let r = s.history("c", &format!("after={twice}")).await;
    r.expect_error(400, "invalid_cursor");
    assert!(r.message().contains(says), "{}", r.text);
    let mut sub = s
        .sse(&format!("/v1/channels/c/sse?last_event_id={twice}"), &[])
        .await;
    assert_eq!(sub.status, 400);
    let body = sub.body_json().await;
    assert_eq!(body["error"], "invalid_cursor");
    assert!(
        body["message"].as_str().is_some_and(|m| m.contains(says)),
        "{body}"
    );
    // The header, which a browser replays: 200 and a gap `unknown`, never a replay.
    let mut sub = s
        .sse("/v1/channels/c/sse", &[("Last-Event-ID", twice.as_bytes())])
        .await;
    assert_eq!(sub.status, 200);
    let pre = sub.preamble().await;
    assert_eq!(pre.gaps.len(), 1, "{:?}", pre.gaps);
    assert_eq!(pre.gaps[0]["reason"], "unknown");
    // WebSocket: an error, and the socket stays open.
    let mut ws = Ws::channels(&s).await;
    ws.subscribe(json!(1), "c", json!({"cursor": twice})).await;
    let e = ws.expect_op("error").await;
    assert_eq!(
        (e["id"].clone(), e["code"].clone()),
        (json!(1), json!("invalid_cursor"))
    );
    assert!(
        e["message"].as_str().is_some_and(|m| m.contains(says)),
        "{e}"
    );
    ws.subscribe_live("c").await;
}

#[tokio::test]
async fn refused_well_formed_requests_do_not_count_toward_the_malformed_limit() {
    let s = Server::memory(&[]).await;
    let mut ws = Ws::channels(&s).await;
    for i in 0..15 {
        ws.subscribe(json!(i), "bad channel", json!({})).await;
        assert_eq!(ws.expect_op("error").await["code"], "invalid_channel");
    }
    // Still open and serving.
    ws.subscribe_live("ok").await;
    // Messages that cannot be read at all do count: 10 in a row close with 4422.
    for _ in 0..9 {
        ws.send_text("not json").await;
        assert_eq!(ws.expect_op("error").await["code"], "invalid_message");
    }
    ws.send_text("not json").await;
    match ws.recv(WAIT).await {
        Some(Msg::Close(Some((4422, _)))) => {}
        other => panic!("expected close 4422, got {other:?}"),
    }
}

#[tokio::test]
async fn replayed_with_since_earliest_counts_the_retained_events_sent_before_the_reply() {
    let s = Server::memory(&["--retention-events", "3"]).await;
    for i in 1..=5 {
        s.publish("e", &format!("e{i}")).await;
    }
    let mut ws = Ws::channels(&s).await;
    ws.subscribe(json!(1), "e", json!({"since": "earliest"}))
        .await;
    let mut datas = Vec::new();
    let reply = loop {
        let m = ws.json().await;
        match m["op"].as_str() {
            Some("event") => datas.push(m["data"].as_str().unwrap_or("").to_owned()),
            Some("subscribed") => break m,
            _ => panic!("unexpected {m}"),
        }
    };
    assert_eq!(datas, ["e3", "e4", "e5"]);
    assert_eq!(reply["replayed"], 3);
    assert_eq!(reply["recovered"], false);
}

#[tokio::test]
async fn session_history_reads_on_from_a_last_seq() {
    let s = Server::memory(&[]).await;
    let id = new_session(&s, "h").await;
    for i in 2..=5 {
        append_ok(&s, &id, &format!("e{i}")).await;
    }
    let page = s
        .get(&format!("/v1/sessions/{id}/events?after_seq=3"))
        .await;
    let events = page.expect(200)["events"]
        .as_array()
        .expect("events")
        .clone();
    let seqs: Vec<_> = events
        .iter()
        .map(|e| e["seq"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(seqs, [4, 5]);
    s.get(&format!("/v1/sessions/{id}/events?after_seq=x"))
        .await
        .expect_error(400, "invalid_request");
    s.get("/v1/channels/c/events?after_seq=1")
        .await
        .expect_error(400, "invalid_request");
    let beyond = s
        .get(&format!("/v1/sessions/{id}/events?after_seq=9"))
        .await;
    assert_eq!(
        beyond.expect_error(410, "cursor_not_served")["reason"],
        "ahead"
    );
}
