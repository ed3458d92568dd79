//! Purge: `DELETE /v1/channels/{channel}` removes every event of a channel
//! and starts a new epoch. A live subscriber (SSE, WebSocket) gets exactly
//! one `epoch` gap, then the events published after the purge; a cursor from
//! before gets the `epoch` gap on resume; history is empty after; an unknown
//! channel answers 204 too; the publish right is needed; a purge survives a
//! `kill -9`; in cluster mode a subscriber on another node gets the gap.
//! On the memory journal, the embedded store and the Redis journal.

use gapless_testkit::redis::Redis;
use gapless_testkit::ws::Ws;
use gapless_testkit::{epoch_of, seq_of, Opts, Server, SseClient};
use jsonwebtoken::{EncodingKey, Header};
use serde_json::{json, Value};
use std::time::Duration;

async fn purge(s: &Server, channel: &str) -> gapless_testkit::Resp {
    s.request("DELETE", &format!("/v1/channels/{channel}"), &[], "")
        .await
}

async fn purge_ok(s: &Server, channel: &str) {
    let r = purge(s, channel).await;
    assert_eq!(r.status, 204, "purge {channel}: {}", r.text);
    assert!(r.text.is_empty(), "a 204 has no body: {:?}", r.text);
}

/// The next `n` events of an SSE stream, asserting none is a gap.
async fn sse_events(c: &mut SseClient, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    while out.len() < n {
        let e = c.next_event().await;
        assert!(!e.is_gap(), "no further gap: {}", e.data);
        out.push(e.data);
    }
    out
}

/// The next `n` events of a WebSocket, asserting none is a gap.
async fn ws_events(ws: &mut Ws, n: usize) -> Vec<Value> {
    let mut out = Vec::new();
    while out.len() < n {
        let m = ws.json().await;
        assert_ne!(m["op"], "gap", "no further gap: {m}");
        if m["op"] == "event" {
            out.push(m);
        }
    }
    out
}

/// The whole purge story on one server (any journal).
async fn live_and_resume(s: &Server, ch: &str) {
    for d in ["a1", "a2", "a3"] {
        s.publish(ch, d).await;
    }
    let old_epoch = s.epoch(ch).await;
    let old_cursor = s.publish(ch, "a4").await["cursor"]
        .as_str()
        .expect("cursor")
        .to_owned();

    // Live subscribers that have read everything before the purge.
    let (mut sse, pre) = s.subscribe(ch, "since=earliest").await;
    assert!(pre.gaps.is_empty());
    assert_eq!(sse_events(&mut sse, 4).await, ["a1", "a2", "a3", "a4"]);
    let mut ws = Ws::channels(s).await;
    ws.subscribe(json!(1), ch, json!({"since": "earliest"}))
        .await;
    assert_eq!(ws_events(&mut ws, 4).await.len(), 4);
    assert_eq!(ws.expect_op("subscribed").await["replayed"], 4);

    purge_ok(s, ch).await;
    // Published right after the 204: delivered after the gap, none skipped.
    for d in ["b1", "b2"] {
        let p = s.publish(ch, d).await;
        assert_ne!(
            epoch_of(p["cursor"].as_str().expect("cursor"), ch),
            old_epoch
        );
    }
    let new_epoch = s.epoch(ch).await;
    assert_ne!(new_epoch, old_epoch, "a purge starts a new epoch");

    let gap = sse.next_event().await;
    assert!(
        gap.is_gap(),
        "the first thing after a purge is a gap: {gap:?}"
    );
    let g = gap.json();
    assert_eq!(g["reason"], "epoch", "{g}");
    assert_eq!(g["after"], old_cursor.as_str(), "{g}");
    let next = g["next"].as_str().expect("next");
    assert_eq!(
        (epoch_of(next, ch), seq_of(next, ch)),
        (new_epoch.clone(), 0)
    );
    let ev = sse.next_event().await;
    assert_eq!(ev.data, "b1");
    assert_eq!(
        seq_of(ev.id.as_deref().expect("id"), ch),
        1,
        "seqs start at 1"
    );
    assert_eq!(sse_events(&mut sse, 1).await, ["b2"]);

    let gap = ws.expect_op("gap").await;
    assert_eq!(gap["reason"], "epoch", "{gap}");
    let evs = ws_events(&mut ws, 2).await;
    let got: Vec<(&str, u64)> = evs
        .iter()
        .map(|m| {
            (
                m["data"].as_str().unwrap_or(""),
                m["seq"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(got, [("b1", 1), ("b2", 2)]);

    // A cursor from before resumes with the epoch gap, then the new events.
    let (mut again, pre) = s.resume(ch, &old_cursor).await;
    assert_eq!(pre.gaps.len(), 1, "{:?}", pre.gaps);
    assert_eq!(pre.gaps[0]["reason"], "epoch");
    assert_eq!(sse_events(&mut again, 2).await, ["b1", "b2"]);
    let mut ws2 = Ws::channels(s).await;
    ws2.subscribe(json!(2), ch, json!({"cursor": old_cursor}))
        .await;
    assert_eq!(ws2.expect_op("gap").await["reason"], "epoch");
    assert_eq!(ws_events(&mut ws2, 2).await.len(), 2);
    assert_eq!(ws2.expect_op("subscribed").await["replayed"], 2);

    // History holds only what came after, in the new epoch.
    assert_eq!(s.all_data(ch).await, ["b1", "b2"]);
    let info = s.info(ch).await;
    assert_eq!(
        (info["floor"].clone(), info["head"].clone()),
        (json!(1), json!(2))
    );
}

#[tokio::test]
async fn memory_live_subscribers_get_one_epoch_gap_then_new_events() {
    let s = Server::memory(&[]).await;
    live_and_resume(&s, "c").await;
}

#[tokio::test]
async fn store_live_subscribers_get_one_epoch_gap_then_new_events() {
    let s = Server::start(&[]).await;
    live_and_resume(&s, "c").await;
}

#[tokio::test]
async fn history_is_empty_after_and_unknown_channels_answer_204() {
    for s in [Server::memory(&[]).await, Server::start(&[]).await] {
        s.publish("h", "x").await;
        s.publish("h", "y").await;
        purge_ok(&s, "h").await;
        assert!(s.all_data("h").await.is_empty());
        let info = s.info("h").await;
        assert_eq!(
            (info["floor"].clone(), info["head"].clone()),
            (json!(1), json!(0))
        );
        // Twice, and a channel never published to.
        purge_ok(&s, "h").await;
        purge_ok(&s, "never-published").await;
        assert!(s.all_data("never-published").await.is_empty());
        // A bad name is refused, as a publish's is.
        purge(&s, "bad%20name")
            .await
            .expect_error(400, "invalid_channel");
    }
}

const SECRET: &str = "a-test-secret-that-is-long-enough-32";

fn token(subscribe: &[&str], publish: &[&str]) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
        + 3600;
    let claims = json!({"exp": exp, "gapless": {"subscribe": subscribe, "publish": publish}});
    jsonwebtoken::encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()).expect("key"),
    )
    .expect("signing")
}

#[tokio::test]
async fn purge_needs_the_publish_right() {
    let s = Server::memory(&["--jwt-secret", SECRET]).await;
    let url = s.url("/v1/channels/p");
    let publisher = token(&[], &["p"]);
    let pubr = s
        .send(
            s.http
                .post(s.url("/v1/channels/p/events"))
                .body("x")
                .bearer_auth(&publisher),
        )
        .await;
    assert_eq!(pubr.status, 201, "{}", pubr.text);

    s.send(s.http.delete(&url))
        .await
        .expect_error(401, "unauthorized");
    let reader = token(&["p"], &[]);
    s.send(s.http.delete(&url).bearer_auth(&reader))
        .await
        .expect_error(403, "forbidden");
    let other = token(&[], &["q"]);
    s.send(s.http.delete(&url).bearer_auth(&other))
        .await
        .expect_error(403, "forbidden");
    // A cookie from a foreign page is refused (the origin guard).
    let foreign = s
        .send(
            s.http
                .delete(&url)
                .header("Cookie", format!("gapless_token={publisher}"))
                .header("Origin", "https://evil.example"),
        )
        .await;
    assert_eq!(foreign.status, 403, "{}", foreign.text);
    assert_eq!(s.info_as(&reader).await, 1, "nothing purged yet");

    let ok = s.send(s.http.delete(&url).bearer_auth(&publisher)).await;
    assert_eq!(ok.status, 204, "{}", ok.text);
    let q = s
        .send(s.http.delete(format!("{url}?access_token={publisher}")))
        .await;
    assert_eq!(q.status, 204, "access_token: {}", q.text);
}

trait InfoAs {
    async fn info_as(&self, token: &str) -> u64;
}

impl InfoAs for Server {
    /// The head of channel `p`, read with `token`.
    async fn info_as(&self, token: &str) -> u64 {
        let r = self
            .send(self.http.get(self.url("/v1/channels/p")).bearer_auth(token))
            .await;
        let _ = r.expect(200);
        r.json["head"].as_u64().expect("head")
    }
}

#[tokio::test]
async fn a_purge_survives_kill9() {
    let mut s = Server::start(&[]).await;
    for d in ["a1", "a2", "a3"] {
        s.publish("k", d).await;
    }
    let old_cursor = s.publish("k", "a4").await["cursor"]
        .as_str()
        .expect("cursor")
        .to_owned();
    purge_ok(&s, "k").await;
    let new_epoch = s.epoch("k").await;
    s.kill9().await;
    s.restart().await;
    assert!(s.all_data("k").await.is_empty(), "the events stay gone");
    assert_eq!(s.epoch("k").await, new_epoch, "the new epoch stays");
    s.publish("k", "b1").await;
    let (mut c, pre) = s.resume("k", &old_cursor).await;
    assert_eq!(pre.gaps.len(), 1, "{:?}", pre.gaps);
    assert_eq!(pre.gaps[0]["reason"], "epoch");
    assert_eq!(sse_events(&mut c, 1).await, ["b1"]);
}

#[tokio::test]
async fn cluster_a_purge_through_one_node_reaches_every_node() {
    let Some(redis) = Redis::start_or_skip("cluster purge").await else {
        return;
    };
    let node = |redis: &Redis| {
        let args = vec!["--redis".to_owned(), redis.url()];
        Server::with(Opts {
            args,
            ..Opts::default()
        })
    };
    let a = node(&redis).await;
    let b = node(&redis).await;
    for d in ["a1", "a2"] {
        a.publish("r", d).await;
    }
    let old_epoch = b.epoch("r").await;
    let (mut sub_b, _) = b.subscribe("r", "since=earliest").await;
    assert_eq!(sse_events(&mut sub_b, 2).await, ["a1", "a2"]);
    // B's cache holds the channel now (its history was read through B).
    assert_eq!(b.all_data("r").await, ["a1", "a2"]);

    purge_ok(&a, "r").await;
    a.publish("r", "b1").await;
    let gap = tokio::time::timeout(Duration::from_secs(10), sub_b.next_event())
        .await
        .expect("the gap reaches node B");
    assert!(gap.is_gap(), "{gap:?}");
    assert_eq!(gap.json()["reason"], "epoch");
    assert_eq!(sse_events(&mut sub_b, 1).await, ["b1"]);
    assert_eq!(b.all_data("r").await, ["b1"], "B's history starts empty");
    assert_ne!(b.epoch("r").await, old_epoch);
    // And through B, seen on A.
    purge_ok(&b, "r").await;
    assert!(a.all_data("r").await.is_empty());
}

/// A Durable Streams reader of a stream whose channel was purged through
/// the gapless API: an offset from before is of another epoch, so `410
/// offset_gone` (the protocol's "before the earliest retained position");
/// reading from the start again (`-1`) serves what was appended after the
/// purge, with offsets of the new epoch.
#[tokio::test]
async fn a_durable_streams_reader_of_a_purged_channel_gets_410_then_reads_anew() {
    let s = Server::memory(&[]).await;
    let ct = [("Content-Type", "text/plain")];
    assert_eq!(s.request("PUT", "/ds/p/one", &ct, "").await.status, 201);
    let a = s.request("POST", "/ds/p/one", &ct, "before").await;
    assert!(a.status < 300, "{} {}", a.status, a.text);
    let old = s.request("GET", "/ds/p/one?offset=-1", &[], "").await;
    assert_eq!(old.status, 200, "{}", old.text);
    assert_eq!(old.text, "before");
    let old_next = old
        .header("Stream-Next-Offset")
        .expect("Stream-Next-Offset")
        .to_owned();

    purge_ok(&s, "p~one").await;
    let gone = s
        .request("GET", &format!("/ds/p/one?offset={old_next}"), &[], "")
        .await;
    assert_eq!(
        gone.status, 410,
        "an offset of the old epoch: {}",
        gone.text
    );
    let b = s.request("POST", "/ds/p/one", &ct, "after").await;
    assert!(b.status < 300, "{} {}", b.status, b.text);
    let anew = s.request("GET", "/ds/p/one?offset=-1", &[], "").await;
    assert_eq!(anew.status, 200, "{}", anew.text);
    assert_eq!(anew.text, "after", "only what came after the purge");
    let next = anew
        .header("Stream-Next-Offset")
        .expect("Stream-Next-Offset");
    assert_ne!(next[..16], old_next[..16], "offsets of the new epoch");
}

/// A Durable Streams stream across a purge of its channel keeps its
/// metadata (it exists, same content type; `HEAD` names the new epoch's
/// start), and its live readers neither skip nor repeat: a long-poll
/// waiting at an old-epoch offset answers `410 offset_gone` (it is woken by
/// the purge, or sees the old epoch at once), an SSE live read ends without
/// sending anything of the new epoch under an old offset, and its
/// reconnection from its last offset is `410`; from `-1` both read the new
/// epoch's messages, with new-epoch offsets.
#[tokio::test]
async fn durable_streams_live_readers_across_a_purge_neither_skip_nor_repeat() {
    let s = Server::memory(&[]).await;
    let ct = [("Content-Type", "text/plain")];
    assert_eq!(s.request("PUT", "/ds/p/live", &ct, "").await.status, 201);
    let a = s.request("POST", "/ds/p/live", &ct, "a").await;
    assert!(a.status < 300, "{} {}", a.status, a.text);
    let tail = a
        .header("Stream-Next-Offset")
        .expect("Stream-Next-Offset")
        .to_owned();
    let client = reqwest::Client::new();

    // A long-poll waiting at the tail, and an SSE live read from the start.
    let poll = tokio::spawn({
        let (client, url) = (
            client.clone(),
            s.url(&format!("/ds/p/live?offset={tail}&live=long-poll")),
        );
        async move {
            let r = client.get(url).send().await.expect("long-poll");
            let status = r.status().as_u16();
            (status, r.text().await.unwrap_or_default())
        }
    });
    let mut sse = tokio::time::timeout(
        Duration::from_secs(10),
        client.get(s.url("/ds/p/live?offset=-1&live=sse")).send(),
    )
    .await
    .expect("the live read answers in time")
    .expect("the live read");
    assert_eq!(sse.status(), 200);
    let mut seen = String::new();
    while !seen.contains("upToDate") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), sse.chunk())
            .await
            .expect("the first batch in time")
            .expect("reading")
            .expect("not ended yet");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains("data:a"), "{seen}");
    tokio::time::sleep(Duration::from_millis(300)).await;

    purge_ok(&s, "p~live").await;
    let (status, text) = tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .expect("the waiting long-poll answers after the purge")
        .expect("the long-poll task");
    assert_eq!(
        status, 410,
        "the long-poll's offset is of the old epoch: {text}"
    );
    assert!(text.contains("offset_gone"), "{text}");
    let b = s.request("POST", "/ds/p/live", &ct, "b").await;
    assert!(b.status < 300, "{} {}", b.status, b.text);
    let new_tail = b
        .header("Stream-Next-Offset")
        .expect("Stream-Next-Offset")
        .to_owned();
    assert_ne!(
        new_tail[..16],
        tail[..16],
        "the append's offset is of the new epoch"
    );

    // The SSE live read ends; nothing of the new epoch came under an old offset.
    let mut after = String::new();
    while let Ok(Some(c)) = tokio::time::timeout(Duration::from_secs(10), sse.chunk())
        .await
        .expect("the live read ends after the purge")
    {
        after.push_str(&String::from_utf8_lossy(&c));
    }
    assert!(
        !after.contains("data:b") && !after.contains("data:a"),
        "no message after the purge on the old read: {after}"
    );
    let again = s
        .request(
            "GET",
            &format!("/ds/p/live?offset={tail}&live=sse"),
            &[],
            "",
        )
        .await;
    assert_eq!(
        again.status, 410,
        "reconnecting at the old offset: {}",
        again.text
    );

    // The stream's metadata: it exists, same type, its tail the new one.
    let head = s.request("HEAD", "/ds/p/live", &[], "").await;
    assert_eq!(head.status, 200);
    assert_eq!(head.header("Content-Type"), Some("text/plain"));
    assert_eq!(head.header("Stream-Next-Offset"), Some(new_tail.as_str()));
    let all = s.request("GET", "/ds/p/live?offset=-1", &[], "").await;
    assert_eq!((all.status, all.text.as_str()), (200, "b"));
    // A long-poll at the new tail gets the next append, once.
    let poll = tokio::spawn({
        let (client, url) = (
            client.clone(),
            s.url(&format!("/ds/p/live?offset={new_tail}&live=long-poll")),
        );
        async move {
            let r = client.get(url).send().await.expect("long-poll");
            let status = r.status().as_u16();
            (status, r.text().await.unwrap_or_default())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c = s.request("POST", "/ds/p/live", &ct, "c").await;
    assert!(c.status < 300, "{} {}", c.status, c.text);
    let got = tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .expect("the long-poll answers")
        .expect("the long-poll task");
    assert_eq!(got, (200, "c".to_owned()));
}

/// On the embedded journal, across a restart: a purged stream keeps its
/// metadata and reads only what came after the purge (its record, journaled
/// with the old epoch, follows the new one again on first use); a fork of
/// it made before the purge loses the inherited messages but reads its own
/// from `-1` (never stuck at 410), and an offset in the lost part is 410.
#[tokio::test]
async fn a_purged_durable_stream_and_its_fork_across_a_restart() {
    let mut s = Server::start(&[]).await;
    let ct = [("Content-Type", "text/plain")];
    let created = s.request("PUT", "/ds/p/src", &ct, "").await;
    assert_eq!(created.status, 201, "{}", created.text);
    let src_start = created
        .header("Stream-Next-Offset")
        .expect("offset")
        .to_owned();
    let s1 = s.request("POST", "/ds/p/src", &ct, "s1").await;
    assert!(s1.status < 300, "{} {}", s1.status, s1.text);
    let fork = [
        ("Content-Type", "text/plain"),
        ("Stream-Forked-From", "/ds/p/src"),
    ];
    let made = s.request("PUT", "/ds/p/fork", &fork, "").await;
    assert_eq!(made.status, 201, "{}", made.text);
    let f1 = s.request("POST", "/ds/p/fork", &ct, "f1").await;
    assert!(f1.status < 300, "{} {}", f1.status, f1.text);
    let whole = s.request("GET", "/ds/p/fork?offset=-1", &[], "").await;
    assert_eq!((whole.status, whole.text.as_str()), (200, "s1f1"));

    purge_ok(&s, "p~src").await;
    let own = s.request("GET", "/ds/p/fork?offset=-1", &[], "").await;
    assert_eq!(
        (own.status, own.text.as_str()),
        (200, "f1"),
        "the fork reads its own messages; the inherited ones are gone"
    );
    let s2 = s.request("POST", "/ds/p/src", &ct, "s2").await;
    assert!(s2.status < 300, "{} {}", s2.status, s2.text);
    let _ = s.sigterm().await;
    s.restart().await;

    let head = s.request("HEAD", "/ds/p/src", &[], "").await;
    assert_eq!(head.status, 200);
    assert_eq!(head.header("Content-Type"), Some("text/plain"));
    let src = s.request("GET", "/ds/p/src?offset=-1", &[], "").await;
    assert_eq!((src.status, src.text.as_str()), (200, "s2"));
    let old = s1.header("Stream-Next-Offset").expect("offset").to_owned();
    let gone = s
        .request("GET", &format!("/ds/p/src?offset={old}"), &[], "")
        .await;
    assert_eq!(gone.status, 410, "{}", gone.text);
    let own = s.request("GET", "/ds/p/fork?offset=-1", &[], "").await;
    assert_eq!((own.status, own.text.as_str()), (200, "f1"));
    let fork_start = made
        .header("Stream-Next-Offset")
        .expect("offset")
        .to_owned();
    let inherited = s
        .request("GET", &format!("/ds/p/fork?offset={fork_start}"), &[], "")
        .await;
    assert_eq!(
        (inherited.status, inherited.text.as_str()),
        (200, "f1"),
        "from the fork point: its own messages"
    );
    let lost = s
        .request("GET", &format!("/ds/p/fork?offset={src_start}"), &[], "")
        .await;
    assert_eq!(
        lost.status, 410,
        "inside the lost inherited part: {}",
        lost.text
    );
}

async fn next(sub: &mut gapless_client::Subscription) -> gapless_client::Update {
    tokio::time::timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("an update within 10 s")
        .expect("the subscription goes on")
        .expect("no error")
}

/// The Rust SDK's `purge`: its subscriber gets one `epoch` gap, then the
/// events published after the purge.
#[tokio::test]
async fn rust_sdk_purge_and_its_subscriber() {
    use gapless_client::{GapReason, Update};
    let s = Server::memory(&[]).await;
    let client = s.client();
    client.publish("sdk", "a1").send().await.expect("publish");
    let mut sub = client
        .subscribe(["sdk"])
        .since_earliest()
        .connect()
        .await
        .expect("connect");
    assert!(matches!(next(&mut sub).await, Update::Event(e) if e.data == "a1"));
    client.purge("sdk").await.expect("purge");
    client
        .purge("sdk-never")
        .await
        .expect("an unknown channel too");
    client.publish("sdk", "b1").send().await.expect("publish");
    match next(&mut sub).await {
        Update::Gap(g) => assert_eq!(g.reason, GapReason::Epoch),
        other => panic!("expected the epoch gap, got {other:?}"),
    }
    assert!(matches!(next(&mut sub).await, Update::Event(e) if e.data == "b1"));
    let bad = client
        .purge("bad name")
        .await
        .expect_err("a bad name is refused");
    assert_eq!(bad.api().map(|a| a.status), Some(400), "{bad}");
}

/// Deleting a Durable Streams stream removes its messages (its channel is
/// purged), on the embedded journal and in memory: the channel's history is
/// empty and its epoch new; a stream created again at the path starts
/// empty, and an offset of the deleted stream answers `410`.
#[tokio::test]
async fn deleting_a_durable_stream_purges_its_channel() {
    for s in [Server::memory(&[]).await, Server::start(&[]).await] {
        let ct = [("Content-Type", "text/plain")];
        assert_eq!(s.request("PUT", "/ds/p/del", &ct, "").await.status, 201);
        for m in ["a", "b"] {
            let r = s.request("POST", "/ds/p/del", &ct, m).await;
            assert!(r.status < 300, "{} {}", r.status, r.text);
        }
        let before = s.info("p~del").await;
        let old = s.request("GET", "/ds/p/del?offset=-1", &[], "").await;
        assert_eq!(old.text, "ab");
        let old_next = old
            .header("Stream-Next-Offset")
            .expect("Stream-Next-Offset")
            .to_owned();
        let del = s.request("DELETE", "/ds/p/del", &[], "").await;
        assert_eq!(del.status, 204, "{}", del.text);
        assert!(
            s.all_data("p~del").await.is_empty(),
            "the deleted stream's messages are gone from its channel"
        );
        let after = s.info("p~del").await;
        assert_ne!(after["epoch"], before["epoch"], "a new epoch: {after}");

        assert_eq!(s.request("PUT", "/ds/p/del", &ct, "").await.status, 201);
        let anew = s.request("GET", "/ds/p/del?offset=-1", &[], "").await;
        assert_eq!((anew.status, anew.text.as_str()), (200, ""));
        let gone = s
            .request("GET", &format!("/ds/p/del?offset={old_next}"), &[], "")
            .await;
        assert_eq!(gone.status, 410, "{}", gone.text);
    }
}
