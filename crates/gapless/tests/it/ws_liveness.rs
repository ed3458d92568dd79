//! Liveness and shutdown on both WebSocket endpoints (docs/protocol.md,
//! "Liveness, shutdown, limits"): the server pings every `--heartbeat-ms`, a
//! client that answers keeps its socket, a client that never answers is closed
//! with 4408; SIGTERM closes every open socket with 1001 and a reason (never a
//! bare TCP close, never 1005/1006).

use gapless_testkit::ws::{append_ok, consume, new_session, Frame, Msg, RawWs, Ws, WAIT};
use gapless_testkit::{seq_of, Server};
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test]
async fn the_server_pings_and_a_client_that_answers_stays_open() {
    let s = Server::start(&["--heartbeat-ms", "200"]).await;
    let mut ch = Ws::channels(&s).await;
    ch.subscribe_live("hb").await;
    new_session(&s, "hb").await;
    let mut sess = consume(&s, "hb", "").await;

    // 1.5 s = 7 intervals: both read (and so answer pings) and see nothing but pings.
    let t0 = Instant::now();
    tokio::join!(
        ch.expect_quiet(Duration::from_millis(1500)),
        sess.expect_quiet(Duration::from_millis(1500))
    );
    assert!(t0.elapsed() >= Duration::from_millis(1500));
    assert!(
        ch.pings >= 4,
        "pings every 200 ms on /v1/ws: got {} in 1.5 s",
        ch.pings
    );
    assert!(
        sess.pings >= 4,
        "pings every 200 ms on a session: got {} in 1.5 s",
        sess.pings
    );

    // Both sockets are still open and deliver.
    s.publish("hb", "x").await;
    let e = ch.expect_op("event").await;
    assert_eq!(e["data"], "x");
    let seq = append_ok(&s, "hb", "y").await;
    let e = sess.expect_op("event").await;
    assert_eq!(
        (e["seq"].clone(), e["data"].clone()),
        (json!(seq), json!("y"))
    );
}

/// Reads raw frames without ever writing: returns the pings seen, the close
/// frame, how long after `t0` it came, and how the connection ended after it.
async fn silent_until_close(raw: &mut RawWs, t0: Instant) -> (usize, Frame, Duration, String) {
    let mut pings = 0;
    loop {
        match raw.read_frame(WAIT).await {
            Ok(Some(f)) if f.opcode == 9 => pings += 1,
            // A text message (a session consumer's `session.resumed`) is not an answer.
            Ok(Some(f)) if f.opcode == 1 => {}
            Ok(Some(f)) if f.opcode == 8 => {
                let at = t0.elapsed();
                let end = match raw.read_frame(Duration::from_secs(3)).await {
                    Err(e) => e,
                    Ok(other) => format!("still open after the close frame: {other:?}"),
                };
                return (pings, f, at, end);
            }
            Ok(Some(f)) => panic!("unexpected frame {f:?}"),
            Ok(None) => panic!("no close within {WAIT:?} ({pings} pings)"),
            Err(e) => panic!("connection ended without a close frame after {pings} pings: {e}"),
        }
    }
}

#[tokio::test]
async fn a_client_that_never_answers_pings_is_closed_with_4408() {
    let s = Server::start(&["--heartbeat-ms", "200"]).await;
    new_session(&s, "quiet").await;

    let t0 = Instant::now();
    let mut chan = RawWs::connect(s.addr, "/v1/ws").await;
    let mut sess = RawWs::connect(s.addr, "/v1/sessions/quiet/ws").await;
    let (a, b) = tokio::join!(
        silent_until_close(&mut chan, t0),
        silent_until_close(&mut sess, t0)
    );
    for (what, (pings, close, at, end)) in [("/v1/ws", a), ("session", b)] {
        assert!(pings >= 1, "{what}: pinged before being closed");
        assert_eq!(close.close_code(), Some(4408), "{what}: {close:?}");
        assert!(close.payload.len() > 2, "{what}: the close has a reason");
        // Two intervals of silence (400 ms), checked at that deadline: well under 2 s.
        assert!(
            at >= Duration::from_millis(400),
            "{what}: not before two intervals ({at:?})"
        );
        assert!(
            at < Duration::from_secs(2),
            "{what}: closed within a bounded time ({at:?})"
        );
        assert!(
            end.contains("EOF") || end.contains("reset"),
            "{what}: then the TCP connection ends: {end}"
        );
    }
    // The session is free again.
    gapless_testkit::eventually("the session to be detached", WAIT, || async {
        s.get("/v1/sessions/quiet").await.json["attached"] == false
    })
    .await;
}

/// Regression (issue 12): the "two intervals" rule was checked only when the
/// next ping was due, so a silent client was closed after about three.
#[tokio::test]
async fn a_silent_client_is_closed_two_intervals_after_its_last_frame() {
    let s = Server::start(&["--heartbeat-ms", "1000"]).await;
    new_session(&s, "two").await;
    // Neither client ever sends a frame: two intervals of silence from its upgrade.
    let t0 = Instant::now();
    let mut chan = RawWs::connect(s.addr, "/v1/ws").await;
    let mut sess = RawWs::connect(s.addr, "/v1/sessions/two/ws").await;
    let (a, b) = tokio::join!(
        silent_until_close(&mut chan, t0),
        silent_until_close(&mut sess, t0)
    );
    for (what, (pings, close, at, _)) in [("/v1/ws", a), ("session", b)] {
        assert_eq!(close.close_code(), Some(4408), "{what}: {close:?}");
        assert!(pings >= 1, "{what}: pinged first");
        assert!(
            at >= Duration::from_millis(1900),
            "{what}: not before two intervals ({at:?})"
        );
        // Three intervals (3 s) before the fix; two and some scheduling slack now.
        assert!(
            at < Duration::from_millis(2700),
            "{what}: closed two intervals after the last frame, not at a later ping ({at:?})"
        );
    }
}

/// Sends `signal` (`STOP`, `CONT`) to process `pid` with kill(1).
fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid}: {status:?}");
}

/// Issue 17: a paused server (`kill -STOP`: a VM pause, a container freeze)
/// sent no ping while it was stopped, so its clients' silence was its own.
/// Clients that answer every ping at once keep their sockets across a pause
/// of 2.5 intervals; one that never answers is still closed with 4408.
#[tokio::test]
async fn a_paused_server_does_not_close_clients_that_answer_its_pings() {
    let s = Server::start(&["--heartbeat-ms", "1000"]).await;
    let mut ch = Ws::channels(&s).await;
    ch.subscribe_live("paused").await;
    new_session(&s, "paused").await;
    let mut sess = consume(&s, "paused", "").await;
    // Both read (and so answer every ping at once) for a while first.
    let settle = Duration::from_millis(1300);
    tokio::join!(ch.expect_quiet(settle), sess.expect_quiet(settle));
    assert!(ch.pings >= 1 && sess.pings >= 1, "pinged before the pause");
    // A client that never answers, connected just before the pause.
    let mut silent = RawWs::connect(s.addr, "/v1/ws").await;

    signal(s.pid(), "STOP");
    let pause = Duration::from_millis(2500);
    // The clients keep reading while the server is stopped: nothing comes.
    tokio::join!(ch.expect_quiet(pause), sess.expect_quiet(pause));
    signal(s.pid(), "CONT");
    let (ch_pings, sess_pings) = (ch.pings, sess.pings);

    // Three intervals after the pause: pings only, no close (before the fix:
    // 4408 "no answer to ping" at once on both).
    let after = Duration::from_millis(3000);
    tokio::join!(ch.expect_quiet(after), sess.expect_quiet(after));
    assert!(
        ch.pings > ch_pings && sess.pings > sess_pings,
        "pinged again after the pause"
    );
    // Both still deliver.
    s.publish("paused", "after").await;
    assert_eq!(ch.expect_op("event").await["data"], "after");
    let seq = append_ok(&s, "paused", "y").await;
    let e = sess.expect_op("event").await;
    assert_eq!(
        (e["seq"].clone(), e["data"].clone()),
        (json!(seq), json!("y"))
    );
    // The client that never answered was closed with 4408 after the pause.
    let (pings, close, _, _) = silent_until_close(&mut silent, Instant::now()).await;
    assert_eq!(close.close_code(), Some(4408), "{close:?}");
    assert!(pings >= 1, "pinged before being closed");
}

#[tokio::test]
async fn a_client_that_sends_messages_but_never_pongs_counts_as_alive() {
    // "closes a client that has sent nothing (a pong counts) for two intervals":
    // any frame counts, so a raw client that keeps sending text is not closed.
    let s = Server::start(&["--heartbeat-ms", "200"]).await;
    let mut raw = RawWs::connect(s.addr, "/v1/ws").await;
    let t0 = Instant::now();
    let mut pings = 0;
    let mut replies = 0;
    while t0.elapsed() < Duration::from_millis(1400) {
        raw.write_frame(1, br#"{"op":"unsubscribe","channel":"none"}"#)
            .await;
        let deadline = Instant::now() + Duration::from_millis(100);
        while let Ok(Some(f)) = raw
            .read_frame(deadline.saturating_duration_since(Instant::now()))
            .await
        {
            match f.opcode {
                9 => pings += 1,
                1 => replies += 1,
                _ => panic!(
                    "unexpected frame while alive: {f:?} (code {:?})",
                    f.close_code()
                ),
            }
        }
    }
    assert!(pings >= 3, "pinged: {pings}");
    assert!(replies >= 5, "answered: {replies}");
}

#[tokio::test]
async fn sigterm_closes_every_open_socket_with_1001_and_a_reason() {
    let mut s = Server::start(&[]).await;
    let mut idle = Ws::channels(&s).await;
    let mut subscribed = Ws::channels(&s).await;
    subscribed.subscribe_live("t").await;
    let published = s.publish("t", "before").await;
    let e = subscribed.expect_op("event").await;
    let cursor = e["cursor"].as_str().expect("cursor").to_owned();
    assert_eq!(e["cursor"], published["cursor"]);
    new_session(&s, "live").await;
    let mut live = consume(&s, "live", "").await;
    new_session(&s, "resumed").await;
    append_ok(&s, "resumed", "r1").await;
    let mut resumed = consume(&s, "resumed", "last_seq=1").await;
    resumed.expect_op("event").await;
    resumed.expect_op("session.resumed").await;
    gapless_testkit::eventually("both sessions attached", WAIT, || async {
        s.get("/v1/sessions/live").await.json["attached"] == true
            && s.get("/v1/sessions/resumed").await.json["attached"] == true
    })
    .await;
    // Raw clients see the frame bytes themselves. Many sockets: a shutdown that
    // exits before every socket's close frame went out shows up reliably.
    let mut raws = Vec::new();
    for i in 0..128 {
        let mut raw = RawWs::connect(s.addr, "/v1/ws").await;
        if i % 2 == 0 {
            raw.write_frame(1, br#"{"op":"subscribe","id":1,"channel":"t"}"#)
                .await;
            let f = raw.read_frame(WAIT).await.expect("open").expect("a reply");
            assert_eq!(f.opcode, 1);
        }
        raws.push(raw);
    }

    let (status, took) = s.sigterm().await;
    assert!(status.success(), "clean exit: {status:?}");
    assert!(took < Duration::from_secs(5), "exit within 5 s: {took:?}");

    let mut wrong = Vec::new();
    for (what, ws) in [
        ("idle /v1/ws", &mut idle),
        ("subscribed /v1/ws", &mut subscribed),
        ("live session", &mut live),
        ("resumed session", &mut resumed),
    ] {
        match ws.recv(WAIT).await {
            Some(Msg::Close(Some((1001, reason)))) if !reason.is_empty() => {}
            other => wrong.push(format!("{what}: {other:?}")),
        }
    }
    for (i, raw) in raws.iter_mut().enumerate() {
        let got = loop {
            match raw.read_frame(WAIT).await {
                Ok(Some(f)) if f.opcode == 9 => continue,
                Ok(Some(f))
                    if f.opcode == 8 && f.close_code() == Some(1001) && f.payload.len() > 2 =>
                {
                    break None
                }
                other => break Some(format!("raw socket {i}: {other:?}")),
            }
        };
        wrong.extend(got);
    }
    assert!(
        wrong.is_empty(),
        "every open socket gets close 1001 with a reason; {} of {} did not: {wrong:#?}",
        wrong.len(),
        raws.len() + 4
    );

    // Reconnect and resume with the cursor: nothing lost across a clean shutdown.
    s.restart().await;
    s.publish("t", "after").await;
    let mut again = Ws::channels(&s).await;
    again
        .subscribe(json!(1), "t", json!({"cursor": cursor}))
        .await;
    let e = again.expect_op("event").await;
    assert_eq!(
        (
            e["data"].clone(),
            seq_of(e["cursor"].as_str().expect("c"), "t")
        ),
        (json!("after"), 2)
    );
    let sub = again.expect_op("subscribed").await;
    assert_eq!(sub["recovered"], true);
}
