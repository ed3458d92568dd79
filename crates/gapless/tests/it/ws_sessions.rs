//! Sessions (docs/protocol.md, "Sessions"): the producer over HTTP, the
//! consumer over `GET /v1/sessions/{id}/ws` (live, resume with `last_seq`,
//! takeover), each refusal (one error message, then its close code), the end
//! of a session (also while the consumer is away), the grace window, restarts
//! within it, and the history endpoint.

use gapless_testkit::ws::{
    append, append_ok, assert_error, consume, consumer_path, create_session, end_session,
    new_session, session_info, Msg, Ws, WAIT,
};
use gapless_testkit::Server;
use serde_json::{json, Value};
use std::time::Duration;

/// Asserts a session `event` message.
#[track_caller]
fn assert_event(v: &Value, id: &str, seq: u64, data: &str) {
    assert_eq!(v["op"], "event", "{v}");
    assert_eq!(v["session"], id, "{v}");
    assert_eq!(v["seq"], seq, "{v}");
    assert_eq!(v["data"], data, "{v}");
    assert!(v.get("type").is_some(), "{v}");
    assert!(
        v["time"].as_u64().is_some_and(|t| t > 1_600_000_000_000),
        "{v}"
    );
}

/// Waits until `GET /v1/sessions/{id}` shows `attached`.
async fn wait_attached(s: &Server, id: &str, attached: bool) {
    gapless_testkit::eventually(
        &format!("session {id} attached={attached}"),
        WAIT,
        || async { session_info(s, id).await.json["attached"] == attached },
    )
    .await;
}

/// A refusal: exactly one error message with `code`, then close `close`.
async fn expect_refusal(s: &Server, id: &str, query: &str, code: &str, close: u16) {
    let mut ws = Ws::connect(s.addr, &consumer_path(id, query)).await;
    let first = ws.recv(WAIT).await;
    match &first {
        Some(Msg::Json(e)) => assert_error(e, code),
        other => panic!("{id}?{query}: expected one error message first, got {other:?}"),
    }
    match ws.recv(WAIT).await {
        Some(Msg::Close(Some((c, _)))) => assert_eq!(c, close, "{id}?{query}: close code"),
        other => panic!("{id}?{query}: expected close {close} after the error, got {other:?}"),
    }
}

#[tokio::test]
async fn producer_creates_appends_completes_and_cancels_over_http() {
    let s = Server::start(&[]).await;

    // A server-drawn id: 128 random bits in hex.
    let r = create_session(&s, None).await;
    let v = r.expect(201);
    let id = v["id"].as_str().expect("id").to_owned();
    assert_eq!(id.len(), 32, "{v}");
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{v}");
    assert_eq!(
        *v,
        json!({"id": id, "status": "open", "head": 1, "attached": false})
    );
    let other = create_session(&s, None).await;
    assert_ne!(
        other.expect(201)["id"],
        id.as_str(),
        "ids are drawn, not counted"
    );

    // A named one; the same name again is 409 session_exists; bad names are 400.
    let r = create_session(&s, Some("job-1_A")).await;
    assert_eq!(
        *r.expect(201),
        json!({"id": "job-1_A", "status": "open", "head": 1, "attached": false})
    );
    create_session(&s, Some("job-1_A"))
        .await
        .expect_error(409, "session_exists");
    for bad in ["", "has space", "slash/id", &"x".repeat(129)] {
        let r = create_session(&s, Some(bad)).await;
        assert_eq!(r.status, 400, "{bad:?}: {}", r.text);
    }
    create_session(&s, Some(&"x".repeat(128))).await.expect(201);
    // The body is an object or empty: serde's array form `["id"]` is refused.
    for body in [r#"["array-form"]"#, "[null]", r#""id""#] {
        let r = s.post("/v1/sessions", body, &[]).await;
        r.expect_error(400, "invalid_request");
        assert!(
            r.message().contains("expected a JSON object"),
            "{body}: {}",
            r.text
        );
    }
    s.get("/v1/sessions/array-form")
        .await
        .expect_error(404, "session_not_found");

    // Appends: seqs continue after the opening marker; no consumer, so attached is false.
    let r = s
        .post(
            "/v1/sessions/job-1_A/events?type=step",
            "one",
            &[("Idempotency-Key", "k1")],
        )
        .await;
    assert_eq!(
        *r.expect(201),
        json!({"id": "job-1_A", "seq": 2, "attached": false})
    );
    let retry = s
        .post(
            "/v1/sessions/job-1_A/events?type=step",
            "one",
            &[("Idempotency-Key", "k1")],
        )
        .await;
    assert_eq!(
        retry.expect(200)["seq"],
        2,
        "an idempotent retry appends nothing"
    );
    assert_eq!(append_ok(&s, "job-1_A", "two").await, 3);
    // The reserved marker types cannot be forged.
    let forged = s
        .post(
            "/v1/sessions/job-1_A/events?type=gapless.session.completed",
            "x",
            &[],
        )
        .await;
    forged.expect_error(400, "invalid_type");
    let info = session_info(&s, "job-1_A").await;
    assert_eq!(
        *info.expect(200),
        json!({"id": "job-1_A", "status": "open", "head": 3, "attached": false})
    );

    // Complete: 200, then it takes nothing more.
    let r = end_session(&s, "job-1_A", "complete").await;
    assert_eq!(
        *r.expect(200),
        json!({"id": "job-1_A", "status": "completed", "head": 4, "attached": false})
    );
    end_session(&s, "job-1_A", "complete")
        .await
        .expect_error(409, "session_ended");
    end_session(&s, "job-1_A", "cancel")
        .await
        .expect_error(409, "session_ended");
    let r = append(&s, "job-1_A", "late").await;
    assert_eq!(r.expect_error(409, "session_ended")["status"], "completed");
    assert_eq!(
        session_info(&s, "job-1_A").await.json["status"],
        "completed"
    );

    // Cancel.
    let r = end_session(&s, &id, "cancel").await;
    let v = r.expect(200);
    assert_eq!(
        (v["status"].clone(), v["id"].clone()),
        (json!("cancelled"), json!(id))
    );
    let r = append(&s, &id, "late").await;
    assert_eq!(r.expect_error(409, "session_ended")["status"], "cancelled");

    // Unknown sessions.
    append(&s, "nope", "x")
        .await
        .expect_error(404, "session_not_found");
    session_info(&s, "nope")
        .await
        .expect_error(404, "session_not_found");
    end_session(&s, "nope", "complete")
        .await
        .expect_error(404, "session_not_found");
}

#[tokio::test]
async fn consumer_without_last_seq_gets_live_events_only_then_the_end_and_close_1000() {
    let s = Server::start(&[]).await;
    let id = new_session(&s, "live").await;
    append_ok(&s, &id, "before").await; // seq 2: not for a live consumer
    let mut c = consume(&s, &id, "").await;
    // The attach is answered at once, saying where live delivery starts.
    assert_eq!(
        c.live_after,
        Some(2),
        "session.resumed names the head it continues after"
    );
    wait_attached(&s, &id, true).await;

    let r = s.post("/v1/sessions/live/events?type=t", "e3", &[]).await;
    assert_eq!(
        *r.expect(201),
        json!({"id": "live", "seq": 3, "attached": true})
    );
    let e = c.json().await;
    assert_event(&e, &id, 3, "e3");
    assert_eq!(e["type"], "t");
    append_ok(&s, &id, "e4").await;
    assert_event(&c.json().await, &id, 4, "e4");

    end_session(&s, &id, "complete").await.expect(200);
    let end = c.json().await;
    assert_eq!(
        end,
        json!({"op": "session.completed", "session": "live", "seq": 5})
    );
    match c.recv(WAIT).await {
        Some(Msg::Close(Some((1000, _)))) => {}
        other => panic!("expected close 1000, got {other:?}"),
    }
    // A cancelled session ends the same way.
    let id = new_session(&s, "live2").await;
    let mut c = consume(&s, &id, "").await;
    wait_attached(&s, &id, true).await;
    end_session(&s, &id, "cancel").await.expect(200);
    assert_eq!(
        c.json().await,
        json!({"op": "session.cancelled", "session": "live2", "seq": 2})
    );
    assert!(matches!(
        c.recv(WAIT).await,
        Some(Msg::Close(Some((1000, _))))
    ));
}

#[tokio::test]
async fn consumer_with_last_seq_gets_the_rest_in_order_then_resumed_then_live() {
    let s = Server::start(&[]).await;
    let id = new_session(&s, "r").await;
    for i in 2..=6 {
        assert_eq!(append_ok(&s, &id, &format!("e{i}")).await, i);
    }

    let mut c = consume(&s, &id, "last_seq=3").await;
    for seq in 4..=6 {
        assert_event(&c.json().await, &id, seq, &format!("e{seq}"));
    }
    assert_eq!(
        c.json().await,
        json!({"op": "session.resumed", "session": "r", "replayed_events": 3, "head": 6})
    );
    append_ok(&s, &id, "e7").await;
    assert_event(&c.json().await, &id, 7, "e7");
    c.expect_quiet(Duration::from_millis(150)).await;
    c.close().await;
    wait_attached(&s, &id, false).await;

    // last_seq=0: everything, without the opening marker.
    let mut c = consume(&s, &id, "last_seq=0").await;
    for seq in 2..=7 {
        assert_event(&c.json().await, &id, seq, &format!("e{seq}"));
    }
    assert_eq!(c.json().await["replayed_events"], 6);
    c.close().await;
    wait_attached(&s, &id, false).await;

    // last_seq at the head: nothing to replay, resumed at once, then live.
    let mut c = consume(&s, &id, "last_seq=7").await;
    assert_eq!(
        c.json().await,
        json!({"op": "session.resumed", "session": "r", "replayed_events": 0, "head": 7})
    );
    append_ok(&s, &id, "e8").await;
    assert_event(&c.json().await, &id, 8, "e8");
}

#[tokio::test]
async fn refusals_send_one_error_then_their_close_code() {
    let s = Server::start(&[]).await;
    // 4404: unknown (or invalid) id.
    expect_refusal(&s, "nope", "", "session_not_found", 4404).await;
    expect_refusal(&s, "nope", "last_seq=1", "session_not_found", 4404).await;
    // 4404 (the design's "unknown, completed or cancelled session"; 4412 is
    // retired): an ended session without last_seq; the `error` message is
    // `session_ended` and says how it ended and what to do (never "unknown,
    // or expired").
    let done = new_session(&s, "done").await;
    append_ok(&s, &done, "x").await;
    end_session(&s, &done, "complete").await.expect(200);
    expect_refusal(&s, &done, "", "session_ended", 4404).await;
    let mut ws = Ws::connect(s.addr, &consumer_path(&done, "")).await;
    let e = ws.expect_op("error").await;
    assert_eq!(e["status"], "completed", "{e}");
    let message = e["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("is completed") && message.contains("last_seq"),
        "{message}"
    );
    assert!(!message.contains("unknown"), "{message}");
    assert_eq!(ws.expect_close().await.0, 4404);
    let gone = new_session(&s, "gone").await;
    end_session(&s, &gone, "cancel").await.expect(200);
    let mut ws = Ws::connect(s.addr, &consumer_path(&gone, "")).await;
    let e = ws.expect_op("error").await;
    assert_eq!(
        (&e["code"], &e["status"]),
        (&json!("session_ended"), &json!("cancelled"))
    );
    assert_eq!(ws.expect_close().await.0, 4404);
    // 4410: last_seq beyond the newest event.
    let open = new_session(&s, "open").await;
    append_ok(&s, &open, "x").await; // head 2
    expect_refusal(&s, &open, "last_seq=3", "session_not_retained", 4410).await;
    expect_refusal(&s, &open, "last_seq=999", "session_not_retained", 4410).await;
    // 4409: already attached to a live connection; the holder is unaffected.
    let mut holder = consume(&s, &open, "").await;
    wait_attached(&s, &open, true).await;
    expect_refusal(&s, &open, "", "session_attached", 4409).await;
    expect_refusal(&s, &open, "last_seq=1", "session_attached", 4409).await;
    append_ok(&s, &open, "still yours").await;
    assert_event(&holder.json().await, &open, 3, "still yours");
    // After the holder leaves, the session can be attached again.
    holder.close().await;
    wait_attached(&s, &open, false).await;
    let mut again = consume(&s, &open, "last_seq=3").await;
    assert_eq!(
        again.expect_op("session.resumed").await["replayed_events"],
        0
    );

    // A malformed query is an HTTP 400 before the upgrade.
    for q in ["last_seq=abc", "last_seq=-1", "takeover=maybe"] {
        let r = Ws::try_connect(
            s.addr,
            &consumer_path(&open, q),
            &[gapless_testkit::ws::PROTOCOL],
        )
        .await
        .err()
        .unwrap_or_else(|| panic!("{q}: expected HTTP 400"));
        assert_eq!(r.status, 400, "{q}: {r:?}");
        assert_eq!(r.json["error"], "invalid_request", "{q}: {r:?}");
    }
}

#[tokio::test]
async fn last_seq_below_retention_is_4410_and_the_floor_boundary_resumes() {
    let s = Server::start(&["--retention-events", "5"]).await;
    let id = new_session(&s, "ret").await;
    for i in 2..=11 {
        append_ok(&s, &id, &format!("e{i}")).await;
    }
    // Retained: seqs 7..=11.
    expect_refusal(&s, &id, "last_seq=1", "session_not_retained", 4410).await;
    expect_refusal(&s, &id, "last_seq=5", "session_not_retained", 4410).await;
    let mut c = consume(&s, &id, "last_seq=6").await;
    for seq in 7..=11 {
        assert_event(&c.json().await, &id, seq, &format!("e{seq}"));
    }
    assert_eq!(c.json().await["replayed_events"], 5);
}

#[tokio::test]
async fn resume_disabled_refuses_last_seq_with_4400_but_attaches_live() {
    let s = Server::start(&["--session-resume", "false"]).await;
    let id = new_session(&s, "nr").await;
    append_ok(&s, &id, "x").await;
    expect_refusal(&s, &id, "last_seq=1", "resume_disabled", 4400).await;
    let mut c = consume(&s, &id, "").await;
    wait_attached(&s, &id, true).await;
    append_ok(&s, &id, "y").await;
    assert_event(&c.json().await, &id, 3, "y");
}

#[tokio::test]
async fn takeover_closes_the_old_connection_with_4409_and_attaches_the_new_one() {
    let s = Server::start(&[]).await;
    let id = new_session(&s, "tk").await;
    let mut old = consume(&s, &id, "").await;
    wait_attached(&s, &id, true).await;
    append_ok(&s, &id, "e2").await;
    assert_event(&old.json().await, &id, 2, "e2");
    append_ok(&s, &id, "e3").await; // the old connection may or may not read this one

    // A newer connection (after a network change) takes over and resumes from what it had.
    let mut new = consume(&s, &id, "takeover=true&last_seq=2").await;
    let mut kicked = None;
    loop {
        match old.recv(WAIT).await {
            Some(Msg::Json(v)) if v["op"] == "event" => assert_event(&v, &id, 3, "e3"),
            Some(Msg::Json(v)) if kicked.is_none() => {
                assert_error(&v, "session_attached");
                assert_eq!(v["message"], "taken over by a newer connection");
                kicked = Some(v);
            }
            Some(Msg::Close(Some((code, _)))) => {
                assert!(kicked.is_some(), "one error message before the close");
                assert_eq!(code, 4409);
                break;
            }
            other => panic!("old connection: expected error then close 4409, got {other:?}"),
        }
    }
    assert_event(&new.json().await, &id, 3, "e3");
    assert_eq!(new.json().await["op"], "session.resumed");
    let r = append(&s, &id, "e4").await;
    assert_eq!(r.expect(201)["attached"], true);
    assert_event(&new.json().await, &id, 4, "e4");

    // Takeover without last_seq: live only for the newest.
    let mut newest = consume(&s, &id, "takeover=true").await;
    assert!(matches!(new.recv(WAIT).await, Some(Msg::Json(v)) if v["code"] == "session_attached"));
    assert!(matches!(
        new.recv(WAIT).await,
        Some(Msg::Close(Some((4409, _))))
    ));
    append_ok(&s, &id, "e5").await;
    assert_event(&newest.json().await, &id, 5, "e5");
    // takeover=false is the default behaviour: refused.
    expect_refusal(&s, &id, "takeover=false", "session_attached", 4409).await;
}

#[tokio::test]
async fn a_session_that_ends_while_the_consumer_is_away_is_delivered_on_resume() {
    let s = Server::start(&[]).await;
    for (id, action, op) in [
        ("away1", "complete", "session.completed"),
        ("away2", "cancel", "session.cancelled"),
    ] {
        new_session(&s, id).await;
        let mut c = consume(&s, id, "").await;
        wait_attached(&s, id, true).await;
        append_ok(&s, id, "e2").await;
        append_ok(&s, id, "e3").await;
        assert_event(&c.json().await, id, 2, "e2");
        assert_event(&c.json().await, id, 3, "e3");
        c.close().await;
        wait_attached(&s, id, false).await;

        let r = append(&s, id, "e4").await;
        assert_eq!(
            r.expect(201)["attached"],
            false,
            "the producer sees nobody is there"
        );
        append_ok(&s, id, "e5").await;
        assert_eq!(end_session(&s, id, action).await.expect(200)["head"], 6);

        let mut back = consume(&s, id, "last_seq=3").await;
        assert_event(&back.json().await, id, 4, "e4");
        assert_event(&back.json().await, id, 5, "e5");
        assert_eq!(
            back.json().await,
            json!({"op": "session.resumed", "session": id, "replayed_events": 2, "head": 6})
        );
        assert_eq!(
            back.json().await,
            json!({"op": op, "session": id, "seq": 6})
        );
        match back.recv(WAIT).await {
            Some(Msg::Close(Some((1000, _)))) => {}
            other => panic!("{id}: expected close 1000, got {other:?}"),
        }
    }
    // Resuming with the last event seen: nothing to replay, then the end.
    let mut c = consume(&s, "away1", "last_seq=5").await;
    assert_eq!(c.json().await["replayed_events"], 0);
    assert_eq!(c.json().await["op"], "session.completed");
    assert!(matches!(
        c.recv(WAIT).await,
        Some(Msg::Close(Some((1000, _))))
    ));
}

#[tokio::test]
async fn grace_window_cancels_a_session_nobody_consumes() {
    let s = Server::start(&["--session-grace-ms", "300"]).await;
    let lonely = new_session(&s, "lonely").await;
    let held = new_session(&s, "held").await;
    let mut c = consume(&s, &held, "").await;
    wait_attached(&s, &held, true).await;

    gapless_testkit::eventually("the unconsumed session to be cancelled", WAIT, || async {
        session_info(&s, &lonely).await.json["status"] == "cancelled"
    })
    .await;
    let r = append(&s, &lonely, "too late").await;
    let v = r.expect_error(409, "session_ended");
    assert_eq!(v["status"], "cancelled");

    // The attached one is not cancelled, however long it lasts.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let r = append(&s, &held, "fine").await;
    assert_eq!(
        *r.expect(201),
        json!({"id": "held", "seq": 2, "attached": true})
    );
    assert_event(&c.json().await, &held, 2, "fine");

    // Once its consumer leaves, the window starts; the consumer coming back late
    // learns the end on resume.
    c.close().await;
    gapless_testkit::eventually("the abandoned session to be cancelled", WAIT, || async {
        session_info(&s, &held).await.json["status"] == "cancelled"
    })
    .await;
    append(&s, &held, "x")
        .await
        .expect_error(409, "session_ended");
    let mut back = consume(&s, &held, "last_seq=2").await;
    assert_eq!(back.json().await["op"], "session.resumed");
    assert_eq!(
        back.json().await,
        json!({"op": "session.cancelled", "session": "held", "seq": 3})
    );
    assert!(matches!(
        back.recv(WAIT).await,
        Some(Msg::Close(Some((1000, _))))
    ));
}

#[tokio::test]
async fn restart_within_the_grace_window_resumes_across_it() {
    let mut s = Server::start(&["--session-grace-ms", "10000"]).await;
    let id = new_session(&s, "rs").await;
    let mut c = consume(&s, &id, "").await;
    wait_attached(&s, &id, true).await;
    let mut last = 0;
    for i in 2..=4 {
        append_ok(&s, &id, &format!("e{i}")).await;
        let e = c.json().await;
        assert_event(&e, &id, i, &format!("e{i}"));
        last = i;
    }

    s.kill9().await;
    assert!(matches!(
        c.recv(WAIT).await,
        Some(Msg::Ended(_) | Msg::Close(_))
    ));
    s.restart().await;
    let info = session_info(&s, &id).await;
    assert_eq!(
        *info.expect(200),
        json!({"id": "rs", "status": "open", "head": 4, "attached": false})
    );
    let r = append(&s, &id, "e5").await;
    assert_eq!(
        *r.expect(201),
        json!({"id": "rs", "seq": 5, "attached": false})
    );
    append_ok(&s, &id, "e6").await;

    let mut back = consume(&s, &id, &format!("last_seq={last}")).await;
    assert_event(&back.json().await, &id, 5, "e5");
    assert_event(&back.json().await, &id, 6, "e6");
    assert_eq!(
        back.json().await,
        json!({"op": "session.resumed", "session": "rs", "replayed_events": 2, "head": 6})
    );
    let r = append(&s, &id, "e7").await;
    assert_eq!(r.expect(201)["attached"], true);
    assert_event(&back.json().await, &id, 7, "e7");
    end_session(&s, &id, "complete").await.expect(200);
    assert_eq!(back.json().await["op"], "session.completed");
}

#[tokio::test]
async fn after_a_restart_an_open_session_counts_as_detached_since_the_restart() {
    // docs/protocol.md: "after a restart every open session counts as detached
    // since the restart". Nobody touches the session after the restart; once the
    // grace window has passed, the producer's next append learns it was cancelled.
    let mut s = Server::start(&["--session-grace-ms", "400"]).await;
    let id = new_session(&s, "orphan").await;
    let mut c = consume(&s, &id, "").await;
    wait_attached(&s, &id, true).await;
    s.kill9().await;
    drop(c.recv(Duration::from_secs(2)).await);
    s.restart().await;
    tokio::time::sleep(Duration::from_millis(1200)).await; // 3 grace windows, untouched
    let r = append(&s, &id, "too late").await;
    let v = r.expect_error(409, "session_ended");
    assert_eq!(v["status"], "cancelled");
}

#[tokio::test]
async fn session_history_shows_events_and_the_lifecycle_markers() {
    let s = Server::start(&[]).await;
    let id = new_session(&s, "h").await;
    s.post("/v1/sessions/h/events?type=step", "a", &[])
        .await
        .expect(201);
    append_ok(&s, &id, "b").await;
    end_session(&s, &id, "complete").await.expect(200);

    let r = s.get("/v1/sessions/h/events").await;
    let page = r.expect(200);
    let evs = page["events"].as_array().expect("events");
    let got: Vec<(u64, Value, String)> = evs
        .iter()
        .map(|e| {
            (
                e["seq"].as_u64().expect("seq"),
                e["type"].clone(),
                e["data"].as_str().expect("data").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (1, json!("gapless.session.opened"), String::new()),
            (2, json!("step"), "a".to_owned()),
            (3, Value::Null, "b".to_owned()),
            (4, json!("gapless.session.completed"), String::new()),
        ]
    );
    assert_eq!(page["done"], true);
    assert_eq!(page["head"], 4);

    // Paging with after/limit.
    let r = s.get("/v1/sessions/h/events?limit=2").await;
    let p1 = r.expect(200);
    assert_eq!(p1["events"].as_array().expect("events").len(), 2);
    assert_eq!(p1["done"], false);
    let next = p1["next"].as_str().expect("next");
    let r = s
        .get(&format!("/v1/sessions/h/events?after={next}&limit=2"))
        .await;
    let p2 = r.expect(200);
    let seqs: Vec<u64> = p2["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["seq"].as_u64().expect("seq"))
        .collect();
    assert_eq!(seqs, [3, 4]);

    s.get("/v1/sessions/nope/events")
        .await
        .expect_error(404, "session_not_found");
}

#[tokio::test]
async fn a_consumer_message_over_the_limit_closes_1009() {
    let s = Server::start(&["--ws-max-message-bytes", "1024"]).await;
    let id = new_session(&s, "big").await;
    let mut c = consume(&s, &id, "").await;
    wait_attached(&s, &id, true).await;
    c.send_text(&"x".repeat(2000)).await;
    let (code, _) = c.expect_close().await;
    assert_eq!(code, 1009);
    wait_attached(&s, &id, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_while_the_producer_appends_delivers_each_seq_once_in_order() {
    const LAST: u64 = 301; // seqs 2..=301
    let s = Server::start(&[]).await;
    let id = new_session(&s, "race").await;
    let mut c = consume(&s, &id, "").await;
    wait_attached(&s, &id, true).await;
    let producer = {
        let (http, url) = (s.http.clone(), s.url("/v1/sessions/race/events"));
        tokio::spawn(async move {
            for i in 2..=LAST {
                let r = http
                    .post(&url)
                    .body(format!("e{i}"))
                    .send()
                    .await
                    .expect("append");
                assert_eq!(r.status().as_u16(), 201);
            }
        })
    };

    let mut got: Vec<u64> = Vec::new();
    let mut reconnects = 0;
    let mut resumed_seen = 0;
    loop {
        // Read a stretch of events on this connection.
        let stop_after = got.len() + 60;
        let mut replayed = 0u64;
        let mut resumed = reconnects == 0; // the first connection is live: no resumed message
        while got.len() < stop_after && got.last() != Some(&LAST) {
            let m = c.json().await;
            match m["op"].as_str() {
                Some("event") => {
                    let seq = m["seq"].as_u64().expect("seq");
                    assert_eq!(m["data"], format!("e{seq}"));
                    got.push(seq);
                    if !resumed {
                        replayed += 1;
                    }
                }
                Some("session.resumed") => {
                    assert!(!resumed, "one session.resumed per connection");
                    assert_eq!(
                        m["replayed_events"], replayed,
                        "replayed_events counts the replay"
                    );
                    resumed = true;
                    resumed_seen += 1;
                }
                _ => panic!("unexpected {m}"),
            }
        }
        if got.last() == Some(&LAST) {
            break;
        }
        // Drop this connection abruptly and come back (takeover: the server may not
        // have noticed the old one is gone yet) with the last seq seen.
        drop(c);
        reconnects += 1;
        let last = *got.last().expect("some events");
        c = consume(&s, &id, &format!("last_seq={last}&takeover=true")).await;
    }
    producer.await.expect("producer");
    assert!(
        reconnects >= 2,
        "the test reconnected mid-stream ({reconnects})"
    );
    assert!(
        resumed_seen >= 1,
        "a resumed connection finished its replay"
    );
    assert_eq!(
        got,
        (2..=LAST).collect::<Vec<_>>(),
        "every seq once, in order"
    );
}

/// Clocks that run from a restart: a session nobody touches after a restart is
/// cancelled one grace window after it, and the first look at it says so
/// (not only after a later sweep); the same after SIGTERM.
#[tokio::test]
async fn an_untouched_session_is_cancelled_one_grace_window_after_a_restart() {
    for stop in ["kill9", "sigterm"] {
        let mut s = Server::start(&["--session-grace-ms", "2000"]).await;
        let id = new_session(&s, "idle").await;
        let peeked = new_session(&s, "peeked").await;
        if stop == "kill9" {
            s.kill9().await;
        } else {
            s.sigterm().await;
        }
        s.restart().await;
        let restarted = std::time::Instant::now();
        // Within the grace window a session is open: a consumer may still come back.
        let early = session_info(&s, &peeked).await;
        assert_eq!(early.expect(200)["status"], "open", "{stop}");
        tokio::time::sleep(Duration::from_millis(2600).saturating_sub(restarted.elapsed())).await;
        // `idle` is looked at for the first time after the window.
        let late = session_info(&s, &id).await;
        assert_eq!(
            late.expect(200)["status"],
            "cancelled",
            "{stop}: the first look after the grace window shows it cancelled"
        );
        assert_eq!(
            late.json["head"], 2,
            "{stop}: the cancel marker was written"
        );
    }
}

/// Retention by age runs from the events' times, across a restart, for
/// channels nobody touched since.
#[tokio::test]
async fn age_retention_applies_to_channels_untouched_since_a_restart() {
    let mut s = Server::start(&["--retention-ms", "1500"]).await;
    s.publish("quiet", "old").await;
    s.kill9().await;
    s.restart().await;
    tokio::time::sleep(Duration::from_millis(2600)).await;
    let info = s.info("quiet").await;
    assert_eq!(
        (info["floor"].clone(), info["head"].clone()),
        (json!(2), json!(1)),
        "the old event is gone: {info}"
    );
}
