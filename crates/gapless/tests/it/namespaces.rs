//! Namespaces (issue 21): a channel's namespace is its name up to the first
//! `:` (`default` without one), and the configuration file's
//! `[namespaces.NAME]` tables give a namespace its own rules, each key it
//! leaves out taking the server's setting. Against the real binary: each
//! key on the embedded journal (retention by count, age and bytes, and a
//! lower retention applied across a restart; `max_event_bytes` over HTTP,
//! batch, WebSocket and Durable Streams; `ephemeral`; `latest`; `public`),
//! retention and `max_event_bytes` on the Redis journal with two nodes,
//! the refusals of a bad table, `gapless config` and the channel info.

use gapless_testkit::redis::Redis;
use gapless_testkit::ws::{assert_error, seqs as ws_seqs, Ws, WAIT};
use gapless_testkit::{eventually, seq_of, Opts, Server};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::json;
use std::process::Command;
use std::time::Duration;

const TEN: &str = "0123456789";

/// Writes `text` as `g.toml` in `dir`; returns its path.
fn write(dir: &tempfile::TempDir, text: &str) -> String {
    let p = dir.path().join("g.toml");
    std::fs::write(&p, text).expect("write config");
    p.display().to_string()
}

/// A server on the embedded journal with the config file `file`.
async fn durable(file: &str, extra: &[&str]) -> Server {
    let mut args = vec!["--config".to_owned(), file.to_owned()];
    args.extend(extra.iter().map(|s| s.to_string()));
    Server::with(Opts {
        args,
        ..Opts::default()
    })
    .await
}

/// `gapless ARGS` with no GAPLESS_* variable of the test's environment.
fn gapless(args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gapless"));
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("GAPLESS_") {
            cmd.env_remove(k);
        }
    }
    cmd.output().expect("run gapless")
}

/// The seqs of a channel's retained events (one history page).
async fn retained(s: &Server, channel: &str) -> Vec<u64> {
    s.history(channel, "limit=1000").await.expect(200)["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["seq"].as_u64().expect("seq"))
        .collect()
}

// ---- the configuration ----

#[test]
fn bad_namespace_tables_are_refused_at_start_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (text, says) in [
        (
            "[namespaces.chat]\nretention_event = 5\n",
            vec![
                "[namespaces.chat]",
                "unknown namespace setting `retention_event`",
                "did you mean `retention_events`",
            ],
        ),
        (
            "[namespaces.chat]\npublik = true\n",
            vec!["`publik`", "did you mean `public`"],
        ),
        (
            "[namespace.chat]\nlatest = true\n",
            vec!["unknown setting `namespace`", "did you mean `namespaces`"],
        ),
        (
            "[namespaces.chat]\nlatest = 1\n",
            vec!["[namespaces.chat]", "`latest` must be true or false"],
        ),
        (
            "[namespaces.chat]\nretention_events = \"many\"\n",
            vec!["`retention_events` must be an integer", "\"many\""],
        ),
        (
            "[namespaces.chat]\nretention_ms = -1\n",
            vec!["`retention_ms` must be a whole number from 0", "-1"],
        ),
        (
            "[namespaces.chat]\nmax_event_bytes = 0\n",
            vec!["`max_event_bytes` must be a whole number from 1"],
        ),
        (
            "[namespaces.chat]\npresence_linger_ms = 3600001\n",
            vec!["`presence_linger_ms`", "3600000"],
        ),
        (
            "[namespaces.chat]\npresence = \"yes\"\n",
            vec!["`presence` must be true or false"],
        ),
        (
            "[namespaces.\"a:b\"]\nlatest = true\n",
            vec!["namespace name \"a:b\" contains ':'"],
        ),
        (
            "[namespaces]\nchat = 5\n",
            vec!["`namespaces.chat` must be a table", "the integer 5"],
        ),
        ("namespaces = 5\n", vec!["`namespaces` must be tables"]),
    ] {
        let file = write(&dir, text);
        for sub in [
            &["serve", "--memory", "--listen", "127.0.0.1:0", "--config"][..],
            &["config", "--config"][..],
        ] {
            let mut args = sub.to_vec();
            args.push(&file);
            let out = gapless(&args);
            assert_eq!(out.status.code(), Some(2), "{text:?} {sub:?}: {out:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains(&file), "{text:?}: names the file: {err}");
            for s in &says {
                assert!(err.contains(s), "{text:?}: says {s:?}: {err}");
            }
        }
    }
    // `presence = true` and every other key are taken.
    let file = write(
        &dir,
        "[namespaces.chat]\nretention_events = 0\nretention_ms = 0\nretention_bytes = 0\n\
         max_event_bytes = 1\nephemeral = false\nlatest = true\npublic = false\n\
         presence = true\npresence_linger_ms = 0\n[namespaces.default]\n",
    );
    let out = gapless(&["config", "--config", &file]);
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn gapless_config_shows_each_namespace_and_where_each_setting_came_from() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(
        &dir,
        "retention_ms = 5000\n\
         [namespaces.chat]\nretention_events = 10\nlatest = true\n\
         [namespaces.default]\npublic = true\nretention_bytes = 99\n",
    );
    let out = gapless(&["config", "--config", &file, "--max-event-bytes", "777"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let chat = text
        .split("[namespaces.chat]")
        .nth(1)
        .and_then(|t| t.split("[namespaces.").next())
        .unwrap_or_else(|| panic!("a [namespaces.chat] table in:\n{text}"));
    for line in [
        "retention_events = 10  # file",
        "retention_ms = 5000  # server setting (file)",
        "retention_bytes = 0  # server setting (default)",
        "max_event_bytes = 777  # server setting (flag)",
        "ephemeral = true  # default",
        "latest = true  # file",
        "public = false  # default",
        "presence = false  # default",
        "presence_linger_ms = 5000  # default",
    ] {
        assert!(chat.contains(line), "{line:?} in:\n{chat}");
    }
    let default = text
        .split("[namespaces.default]")
        .nth(1)
        .unwrap_or_else(|| panic!("a [namespaces.default] table in:\n{text}"));
    for line in [
        "public = true  # file",
        "retention_bytes = 99  # file",
        "retention_events = 100000  # server setting (default)",
    ] {
        assert!(default.contains(line), "{line:?} in:\n{default}");
    }
    // The output is a TOML file holding the effective values.
    let table: toml::Table = text.parse().expect("valid TOML");
    assert_eq!(
        table["namespaces"]["chat"]["retention_ms"].as_integer(),
        Some(5000)
    );
    assert_eq!(
        table["namespaces"]["default"]["public"].as_bool(),
        Some(true)
    );
    // Without a table, it says every channel has the server's settings.
    let plain = gapless(&["config"]);
    assert!(String::from_utf8_lossy(&plain.stdout).contains("no [namespaces.NAME] table"));
}

#[test]
fn gapless_config_default_shows_a_namespace() {
    let out = gapless(&["config", "--default"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("# [namespaces.chat]"), "{text}");
    let example = text.split("# [namespaces.chat]").nth(1).expect("example");
    for key in [
        "retention_events",
        "retention_ms",
        "retention_bytes",
        "max_event_bytes",
        "ephemeral",
        "latest",
        "public",
        "presence",
        "presence_linger_ms",
    ] {
        assert!(
            example.contains(&format!("# {key} = ")),
            "{key} in:\n{example}"
        );
    }
    assert!(
        text.contains("# retention_bytes = 0"),
        "the new flag: {text}"
    );
}

// ---- retention on the embedded journal ----

#[tokio::test]
async fn retention_by_count_age_and_bytes_per_namespace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(
        &dir,
        "retention_events = 5\n\
         [namespaces.few]\nretention_events = 3\n\
         [namespaces.small]\nretention_bytes = 25\n\
         [namespaces.brief]\nretention_ms = 400\n\
         [namespaces.default]\nretention_events = 4\n",
    );
    let s = durable(&file, &[]).await;
    for channel in ["few:a", "small:a", "plain", "other:a", "brief:a"] {
        for _ in 0..6 {
            s.publish(channel, TEN).await;
        }
    }
    assert_eq!(retained(&s, "few:a").await, [4, 5, 6], "count");
    assert_eq!(retained(&s, "small:a").await, [5, 6], "25 bytes");
    assert_eq!(
        retained(&s, "plain").await,
        [3, 4, 5, 6],
        "[namespaces.default]"
    );
    assert_eq!(
        retained(&s, "other:a").await,
        [2, 3, 4, 5, 6],
        "no table: the server's"
    );
    // The newest event stays whatever its size.
    s.publish("small:a", &"x".repeat(100)).await;
    assert_eq!(retained(&s, "small:a").await, [7]);
    // Age: only `brief` has a limit this short.
    eventually(
        "brief:a's events expire",
        Duration::from_secs(10),
        || async { retained(&s, "brief:a").await.is_empty() },
    )
    .await;
    assert_eq!(s.info("brief:a").await["floor"], 7);
    assert_eq!(retained(&s, "few:a").await, [4, 5, 6], "no age limit there");
    // The channel info names the namespace and its retention.
    let info = s.info("few:a").await;
    assert_eq!(info["namespace"], "few");
    assert_eq!(
        info["retention"],
        json!({"events": 3, "ms": 86_400_000u64, "bytes": 0})
    );
    let info = s.info("plain").await;
    assert_eq!(info["namespace"], "default");
    assert_eq!(info["retention"]["events"], 4);
    let info = s.info("small:a").await;
    assert_eq!(
        info["retention"],
        json!({"events": 5, "ms": 86_400_000u64, "bytes": 25})
    );
    assert_eq!(s.info("other:x:y").await["namespace"], "other");
}

#[tokio::test]
async fn a_lower_retention_applies_to_existing_channels_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(&dir, "");
    let mut s = durable(&file, &[]).await;
    let mut first = String::new();
    for i in 0..10 {
        let p = s.publish("chat:1", TEN).await;
        s.publish("plain", TEN).await;
        s.publish("keep:1", TEN).await;
        if i == 1 {
            first = p["cursor"].as_str().expect("cursor").to_owned();
        }
    }
    std::fs::write(
        &file,
        "[namespaces.chat]\nretention_events = 4\n\
         [namespaces.default]\nretention_bytes = 35\n",
    )
    .expect("rewrite config");
    s.restart().await;
    // Without any publish: the new floors hold at once.
    assert_eq!(retained(&s, "chat:1").await, [7, 8, 9, 10]);
    assert_eq!(retained(&s, "plain").await, [8, 9, 10], "35 bytes");
    assert_eq!(retained(&s, "keep:1").await.len(), 10, "no table");
    assert_eq!(s.info("chat:1").await["floor"], 7);
    // A cursor below the new floor gets the usual `evicted` gap.
    let (mut sub, pre) = s.resume("chat:1", &first).await;
    assert_eq!(pre.gaps.len(), 1, "{:?}", pre.gaps);
    assert_eq!(pre.gaps[0]["reason"], "evicted");
    assert_eq!(
        seq_of(pre.gaps[0]["after"].as_str().expect("after"), "chat:1"),
        2
    );
    s.publish("chat:1", "next").await;
    let e = sub.next_event().await;
    assert_eq!(e.data, "next");
    assert_eq!(retained(&s, "chat:1").await, [8, 9, 10, 11]);
    // A history read from it is told the same.
    let r = s.history("chat:1", &format!("after={first}")).await;
    r.expect_error(410, "cursor_not_served");
    assert_eq!(r.json["reason"], "evicted");
}

/// The server's own channels (names with `/`: the Durable Streams records,
/// sessions) keep the server's settings whatever `[namespaces.default]`
/// says: a low count there must not forget streams across a restart.
#[tokio::test]
async fn namespace_tables_never_apply_to_the_servers_own_channels() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(&dir, "[namespaces.default]\nretention_events = 2\n");
    let mut s = durable(&file, &[]).await;
    let ct = [("content-type", "text/plain")];
    for i in 0..4 {
        s.request("PUT", &format!("/ds/s{i}"), &ct, "")
            .await
            .expect(201);
    }
    s.restart().await;
    for i in 0..4 {
        let r = s.request("HEAD", &format!("/ds/s{i}"), &[], "").await;
        assert_eq!(r.status, 200, "stream s{i} after a restart");
    }
    // A client channel of the namespace follows the table.
    for _ in 0..3 {
        s.publish("plain", TEN).await;
    }
    assert_eq!(retained(&s, "plain").await, [2, 3]);
}

// ---- max_event_bytes ----

#[tokio::test]
async fn max_event_bytes_per_namespace_on_every_way_to_publish() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(
        &dir,
        "max_event_bytes = 1000\n\
         [namespaces.tiny]\nmax_event_bytes = 8\n\
         [namespaces.big]\nmax_event_bytes = 2000\n",
    );
    let s = durable(&file, &[]).await;
    // HTTP, one event.
    s.publish("tiny:a", "12345678").await;
    let r = s.post("/v1/channels/tiny:a/events", "123456789", &[]).await;
    r.expect_error(413, "too_large");
    assert_eq!(r.json["limit"], 8);
    assert!(r.message().contains("[namespaces.tiny]"), "{}", r.text);
    s.publish("big:a", &"b".repeat(1500)).await;
    let r = s
        .post("/v1/channels/plain/events", "p".repeat(1500), &[])
        .await;
    r.expect_error(413, "too_large");
    assert_eq!(r.json["limit"], 1000);
    assert!(r.message().contains("--max-event-bytes"), "{}", r.text);
    // HTTP, a batch.
    let r = s
        .batch(
            "tiny:a",
            &json!([{"data": "ok"}, {"data": "123456789"}]),
            &[],
        )
        .await;
    r.expect_error(413, "too_large");
    assert_eq!(r.json["limit"], 8);
    assert!(r.message().contains("event 1"), "{}", r.text);
    s.batch("big:a", &json!([{"data": "b".repeat(1500)}]), &[])
        .await
        .expect(201);
    // WebSocket.
    let mut ws = Ws::channels(&s).await;
    ws.send(&json!({"op": "publish", "id": 1, "channel": "tiny:a", "data": "123456789"}))
        .await;
    let e = ws.json().await;
    assert_error(&e, "too_large");
    assert_eq!((e["id"].clone(), e["limit"].clone()), (json!(1), json!(8)));
    ws.send(&json!({"op": "publish", "id": 2, "channel": "big:a", "data": "b".repeat(1500)}))
        .await;
    assert_eq!(ws.expect_op("published").await["id"], 2);
    // Durable Streams: /ds/tiny:a/s is channel tiny:a~s, in namespace tiny.
    let ct = [("content-type", "text/plain")];
    s.request("PUT", "/ds/tiny:a/s", &ct, "").await.expect(201);
    s.request("POST", "/ds/tiny:a/s", &ct, "12345678")
        .await
        .expect(204);
    let r = s.request("POST", "/ds/tiny:a/s", &ct, "123456789").await;
    assert_eq!(r.status, 413, "{}", r.text);
    assert_eq!(r.json["limit"], 8, "{}", r.text);
    assert_eq!(retained(&s, "tiny:a").await, [1]);
    assert_eq!(retained(&s, "tiny:a~s").await, [1]);
}

// ---- ephemeral ----

#[tokio::test]
async fn ephemeral_false_refuses_ephemeral_publishes_naming_the_namespace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(&dir, "[namespaces.logs]\nephemeral = false\n");
    let s = durable(&file, &[]).await;
    let r = s
        .post("/v1/channels/logs:a/events?ephemeral=true", "x", &[])
        .await;
    r.expect_error(403, "forbidden");
    assert_eq!(r.json["namespace"], "logs");
    assert!(r.message().contains("\"logs\""), "{}", r.text);
    // Journaled publishes there are taken; ephemeral ones elsewhere too.
    s.publish("logs:a", "kept").await;
    s.post("/v1/channels/other:a/events?ephemeral=true", "x", &[])
        .await
        .expect(202);
    s.post("/v1/channels/plain/events?ephemeral=true", "x", &[])
        .await
        .expect(202);
    let mut ws = Ws::channels(&s).await;
    ws.send(
        &json!({"op": "publish", "id": 7, "channel": "logs:b", "data": "x", "ephemeral": true}),
    )
    .await;
    let e = ws.json().await;
    assert_error(&e, "forbidden");
    assert_eq!(
        (e["id"].clone(), e["namespace"].clone()),
        (json!(7), json!("logs"))
    );
    ws.send(&json!({"op": "publish", "id": 8, "channel": "logs:b", "data": "x"}))
        .await;
    assert_eq!(ws.expect_op("published").await["id"], 8);
}

// ---- latest ----

#[tokio::test]
async fn latest_starts_a_subscriber_without_a_start_at_the_newest_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(&dir, "[namespaces.ticker]\nlatest = true\n");
    let s = durable(&file, &[]).await;
    for i in 1..=3 {
        s.publish("ticker:a", &format!("t{i}")).await;
        s.publish("plain", &format!("p{i}")).await;
    }
    // SSE without a start: the newest event, then live.
    let (mut sub, pre) = s.subscribe("ticker:a", "").await;
    assert!(pre.gaps.is_empty());
    assert_eq!(sub.next_event().await.data, "t3");
    s.publish("ticker:a", "t4").await;
    assert_eq!(sub.next_event().await.data, "t4");
    // `since=live` is a start: live only; `since=earliest` everything; a
    // cursor resumes after it.
    let (mut live, _) = s.subscribe("ticker:a", "since=live").await;
    let (mut all, _) = s.subscribe("ticker:a", "since=earliest").await;
    let (mut after, _) = s.resume("ticker:a", &pre.cursor).await;
    s.publish("ticker:a", "t5").await;
    assert_eq!(live.next_event().await.data, "t5");
    let got: Vec<String> = all.events(5).await.into_iter().map(|e| e.data).collect();
    assert_eq!(got, ["t1", "t2", "t3", "t4", "t5"]);
    let got: Vec<String> = after.events(3).await.into_iter().map(|e| e.data).collect();
    assert_eq!(
        got,
        ["t3", "t4", "t5"],
        "after the cursor of the preamble (seq 2)"
    );
    // Another namespace: live only.
    let (mut plain, _) = s.subscribe("plain", "").await;
    s.publish("plain", "p4").await;
    assert_eq!(plain.next_event().await.data, "p4");
    // Several channels on one stream: each by its namespace.
    let mut both = s.sse("/v1/sse?channel=plain&channel=ticker:a", &[]).await;
    both.preamble().await;
    assert_eq!(both.next_event().await.data, "t5");
    s.publish("plain", "p5").await;
    assert_eq!(both.next_event().await.data, "p5");
    // A channel with nothing retained starts live.
    let (mut empty, pre) = s.subscribe("ticker:empty", "").await;
    assert!(pre.gaps.is_empty());
    s.publish("ticker:empty", "e1").await;
    assert_eq!(empty.next_event().await.data, "e1");
    // WebSocket: without `since` the newest, with `since` as asked.
    let mut ws = Ws::channels(&s).await;
    ws.subscribe(json!(1), "ticker:a", json!({})).await;
    let msgs = ws.read_until_seq("ticker:a", 5, WAIT).await;
    assert_eq!(ws_seqs(&msgs, "ticker:a"), [5]);
    let r = ws.expect_op("subscribed").await;
    assert_eq!(
        (r["id"].clone(), r["replayed"].clone()),
        (json!(1), json!(1))
    );
    ws.subscribe(json!(2), "plain", json!({"since": "live"}))
        .await;
    assert_eq!(ws.expect_op("subscribed").await["id"], 2);
    s.publish("ticker:a", "t6").await;
    let msgs = ws.read_until_seq("ticker:a", 6, WAIT).await;
    assert_eq!(ws_seqs(&msgs, "ticker:a"), [6]);
    assert_eq!(ws_seqs(&msgs, "plain"), Vec::<u64>::new());
}

// ---- public ----

const SECRET: &str = "a-test-secret-that-is-long-enough-32";

fn token(subscribe: &[&str], publish: &[&str]) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        + 3600;
    let claims = json!({"exp": exp, "gapless": {"subscribe": subscribe, "publish": publish}});
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()).expect("key"),
    )
    .expect("sign")
}

#[tokio::test]
async fn public_namespaces_are_read_without_a_token_and_published_with_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(&dir, "[namespaces.news]\npublic = true\n");
    let s = durable(&file, &["--jwt-secret", SECRET]).await;
    let writer = token(&[], &["news:*", "secret:*"]);
    let as_writer = |path: &str, body: &str| {
        s.http
            .post(s.url(path))
            .bearer_auth(&writer)
            .body(body.to_owned())
    };
    s.send(as_writer("/v1/channels/news:a/events", "n1"))
        .await
        .expect(201);
    s.send(as_writer("/v1/channels/secret:a/events", "s1"))
        .await
        .expect(201);
    // Without a token: history, channel info and SSE of news:a...
    let page = s.history("news:a", "").await;
    assert_eq!(page.expect(200)["events"][0]["data"], "n1");
    assert_eq!(s.info("news:a").await["namespace"], "news");
    let (mut sub, _) = s.subscribe("news:a", "since=earliest").await;
    assert_eq!(sub.next_event().await.data, "n1");
    // ... but nothing else: reading secret:a, publishing anywhere.
    s.history("secret:a", "")
        .await
        .expect_error(401, "unauthorized");
    s.get("/v1/channels/secret:a/sse")
        .await
        .expect_error(401, "unauthorized");
    s.get("/v1/sse?channel=news:a&channel=secret:a")
        .await
        .expect_error(401, "unauthorized");
    s.post("/v1/channels/news:a/events", "x", &[])
        .await
        .expect_error(401, "unauthorized");
    s.post("/v1/sessions", "", &[])
        .await
        .expect_error(401, "unauthorized");
    // A token that names other channels still reads public ones; 403 stays
    // the answer for what it does not allow.
    let other = token(&["other"], &[]);
    let r = s
        .send(
            s.http
                .get(s.url("/v1/channels/news:a/events"))
                .bearer_auth(&other),
        )
        .await;
    r.expect(200);
    let r = s
        .send(
            s.http
                .get(s.url("/v1/channels/secret:a/events"))
                .bearer_auth(&other),
        )
        .await;
    r.expect_error(403, "forbidden");
    // WebSocket without a token: subscribes to news:a, nothing else.
    let mut ws = Ws::channels(&s).await;
    ws.subscribe(json!(1), "news:a", json!({"since": "earliest"}))
        .await;
    let msgs = ws.read_until_seq("news:a", 1, WAIT).await;
    assert_eq!(ws_seqs(&msgs, "news:a"), [1]);
    assert_eq!(ws.expect_op("subscribed").await["id"], 1);
    ws.subscribe(json!(2), "secret:a", json!({})).await;
    let e = ws.json().await;
    assert_error(&e, "unauthorized");
    ws.send(&json!({"op": "publish", "id": 3, "channel": "news:a", "data": "x"}))
        .await;
    assert_error(&ws.json().await, "unauthorized");
    s.send(as_writer("/v1/channels/news:a/events", "n2"))
        .await
        .expect(201);
    let msgs = ws.read_until_seq("news:a", 2, WAIT).await;
    assert_eq!(ws_seqs(&msgs, "news:a"), [2]);
    // Durable Streams: reads need no token there, writes do.
    let ct = [("content-type", "text/plain")];
    let put = s
        .http
        .put(s.url("/ds/news:b/s"))
        .header("content-type", "text/plain")
        .bearer_auth(&writer);
    s.send(put).await.expect(201);
    s.send(as_writer("/ds/news:b/s", "hello").header("content-type", "text/plain"))
        .await
        .expect(204);
    let r = s.request("GET", "/ds/news:b/s?offset=-1", &[], "").await;
    assert_eq!((r.status, r.text.as_str()), (200, "hello"));
    let r = s.request("POST", "/ds/news:b/s", &ct, "x").await;
    assert_eq!(r.status, 401, "{}", r.text);
    let r = s.request("GET", "/ds/secret:b/s?offset=-1", &[], "").await;
    assert_eq!(r.status, 401, "{}", r.text);
}

// ---- the OpenAPI document ----

#[tokio::test]
async fn the_channel_info_schema_names_the_namespace_and_its_retention() {
    let s = Server::memory(&[]).await;
    let doc = s.get("/v1/openapi.json").await.expect(200).clone();
    let info = &doc["components"]["schemas"]["ChannelInfo"]["properties"];
    assert!(info.get("namespace").is_some(), "{info}");
    let retention = &info["retention"];
    assert!(
        retention.to_string().contains("RetentionLimits"),
        "{retention}"
    );
    let limits = &doc["components"]["schemas"]["RetentionLimits"];
    for key in ["events", "ms", "bytes"] {
        assert!(limits["properties"].get(key).is_some(), "{limits}");
    }
    // And the answer has them, for a server without tables too.
    let info = s.info("a:b").await;
    assert_eq!(info["namespace"], "a");
    assert_eq!(
        info["retention"],
        json!({"events": 100_000, "ms": 86_400_000u64, "bytes": 0})
    );
}

// ---- the Redis journal, two nodes ----

async fn node(redis: &Redis, file: &str) -> Server {
    Server::with(Opts {
        args: vec![
            "--redis".into(),
            redis.url(),
            "--config".into(),
            file.into(),
        ],
        ..Opts::default()
    })
    .await
}

#[tokio::test]
async fn retention_and_max_event_bytes_per_namespace_on_redis_with_two_nodes() {
    let Some(redis) = Redis::start_or_skip("namespaces on redis").await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(
        &dir,
        "[namespaces.few]\nretention_events = 3\n\
         [namespaces.small]\nretention_bytes = 25\n\
         [namespaces.tiny]\nmax_event_bytes = 8\n\
         [namespaces.brief]\nretention_ms = 400\n",
    );
    let mut a = node(&redis, &file).await;
    let mut b = node(&redis, &file).await;
    let mut first = String::new();
    for i in 0..6 {
        let p = a.publish("few:a", TEN).await;
        if i == 0 {
            first = p["cursor"].as_str().expect("cursor").to_owned();
        }
        b.publish("small:a", TEN).await;
        a.publish("other:a", TEN).await;
        b.publish("brief:a", TEN).await;
    }
    for n in [&a, &b] {
        assert_eq!(retained(n, "few:a").await, [4, 5, 6], "count");
        assert_eq!(retained(n, "small:a").await, [5, 6], "bytes");
        assert_eq!(retained(n, "other:a").await.len(), 6);
        let r = n.post("/v1/channels/tiny:a/events", "123456789", &[]).await;
        r.expect_error(413, "too_large");
        assert_eq!(r.json["limit"], 8);
        n.publish("tiny:a", "12345678").await;
        assert_eq!(n.info("small:a").await["retention"]["bytes"], 25);
    }
    eventually("brief:a expires", Duration::from_secs(10), || async {
        retained(&b, "brief:a").await.is_empty()
    })
    .await;
    assert_eq!(retained(&a, "few:a").await, [4, 5, 6], "no age limit there");
    // Lower limits, both nodes restarted: existing channels follow at once.
    std::fs::write(
        &file,
        "[namespaces.few]\nretention_events = 2\n\
         [namespaces.small]\nretention_bytes = 15\n\
         [namespaces.default]\nretention_events = 4\n",
    )
    .expect("rewrite config");
    a.restart().await;
    b.restart().await;
    assert_eq!(retained(&b, "few:a").await, [5, 6]);
    assert_eq!(retained(&a, "small:a").await, [6], "15 bytes: one event");
    assert_eq!(retained(&a, "other:a").await.len(), 6, "no table");
    let (mut sub, pre) = b.resume("few:a", &first).await;
    assert_eq!(pre.gaps.len(), 1, "{:?}", pre.gaps);
    assert_eq!(pre.gaps[0]["reason"], "evicted");
    a.publish("few:a", "after").await;
    assert_eq!(sub.next_event().await.data, "after");
    assert_eq!(retained(&a, "few:a").await, [6, 7]);
    // The channel's hash keeps the byte count with the range it covers.
    b.publish("small:a", "12345").await;
    assert_eq!(retained(&a, "small:a").await, [6, 7], "10 + 5 bytes");
    let bytes = redis.cli(&["HGET", "gapless:{small:a}", "bytes"]).await;
    assert_eq!(bytes.trim(), "6:7:15");
}
