//! The Durable Streams room (`/ds`, docs/durable-streams.md) against the real
//! binary, for what is gapless's own: a stream is a channel (read over
//! gapless SSE and history, written by gapless publishes), gapless tokens
//! guard it, and a stream path that cannot name a channel is a 400 naming
//! the rule. The protocol itself is checked by its conformance suite
//! (scripts/ds-conformance.sh).

use gapless_testkit::Server;
use jsonwebtoken::{EncodingKey, Header};
use serde_json::{json, Value};
use std::time::Duration;

const SECRET: &str = "a-test-secret-that-is-long-enough-32";

fn token(subscribe: &[&str], publish: &[&str]) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        + 3600;
    let claims = json!({"exp": exp, "gapless": {"subscribe": subscribe, "publish": publish}});
    jsonwebtoken::encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()).expect("key"),
    )
    .expect("signing")
}

async fn req(
    s: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> gapless_testkit::Resp {
    let m = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut r = s.http.request(m, s.url(path)).body(body.to_owned());
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    s.send(r).await
}

const JSON: (&str, &str) = ("content-type", "application/json");

/// A JSON stream's messages are the channel's events, in order, whichever
/// API wrote them: appended over Durable Streams and published over
/// gapless, read back over Durable Streams catch-up and over gapless SSE.
#[tokio::test]
async fn a_stream_is_a_channel_read_and_written_by_both_apis() {
    let s = Server::memory(&[]).await;
    let created = req(&s, "PUT", "/ds/rooms/1", &[JSON], "").await;
    assert_eq!(created.status, 201, "{}", created.text);
    let (mut sse, pre) = s.subscribe("rooms~1", "since=earliest").await;
    assert!(pre.gaps.is_empty(), "{:?}", pre.gaps);

    let appended = req(&s, "POST", "/ds/rooms/1", &[JSON], r#"[{"a":1}, {"a":2}]"#).await;
    assert_eq!(appended.status, 204, "{}", appended.text);
    s.publish("rooms~1", r#"{"a":3}"#).await;

    let read = req(&s, "GET", "/ds/rooms/1?offset=-1", &[], "").await;
    assert_eq!(read.status, 200, "{}", read.text);
    assert_eq!(read.json, json!([{"a":1}, {"a":2}, {"a":3}]));
    assert_eq!(read.header("stream-up-to-date"), Some("true"));
    let tail = read
        .header("stream-next-offset")
        .expect("offset")
        .to_owned();

    let got: Vec<String> = sse.events(3).await.into_iter().map(|e| e.data).collect();
    assert_eq!(got, vec![r#"{"a":1}"#, r#"{"a":2}"#, r#"{"a":3}"#]);

    // A long-poll at the tail wakes on a gapless publish.
    let poll = {
        let url = s.url(&format!("/ds/rooms/1?offset={tail}&live=long-poll"));
        let http = s.http.clone();
        tokio::spawn(async move { http.get(url).send().await.expect("long-poll") })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.publish("rooms~1", r#"{"a":4}"#).await;
    let answer = tokio::time::timeout(Duration::from_secs(20), poll)
        .await
        .expect("the long-poll answers")
        .expect("task");
    assert_eq!(answer.status(), 200);
    let body: Value = answer.json().await.expect("json");
    assert_eq!(body, json!([{"a":4}]));
}

/// Gapless tokens guard streams: reads need `subscribe`, writes `publish`,
/// on the mapped channel; no token is 401.
#[tokio::test]
async fn tokens_grant_streams_as_channels() {
    let s = Server::memory(&["--jwt-secret", SECRET]).await;
    let none = req(&s, "PUT", "/ds/team/a", &[JSON], "").await;
    none.expect_error(401, "unauthorized");
    let reader = token(&["team~*"], &[]);
    let writer = token(&[], &["team~*"]);
    let bearer = |t: &str| format!("Bearer {t}");

    let r = bearer(&reader);
    let refused = req(&s, "PUT", "/ds/team/a", &[JSON, ("authorization", &r)], "").await;
    refused.expect_error(403, "forbidden");
    let w = bearer(&writer);
    let created = req(
        &s,
        "PUT",
        "/ds/team/a",
        &[JSON, ("authorization", &w)],
        "[1]",
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.text);
    let elsewhere = req(&s, "PUT", "/ds/other/a", &[JSON, ("authorization", &w)], "").await;
    elsewhere.expect_error(403, "forbidden");

    let no_read = req(
        &s,
        "GET",
        "/ds/team/a?offset=-1",
        &[("authorization", &w)],
        "",
    )
    .await;
    no_read.expect_error(403, "forbidden");
    let read = req(
        &s,
        "GET",
        "/ds/team/a?offset=-1",
        &[("authorization", &r)],
        "",
    )
    .await;
    assert_eq!(read.status, 200, "{}", read.text);
    assert_eq!(read.json, json!([1]));
}

/// A stream path that cannot name a channel is refused with 400 naming the
/// rule; an unknown stream is 404; a non-UTF-8 body on a text stream is 415,
/// not stored (a binary stream keeps any bytes: tests/binary_payloads.rs).
#[tokio::test]
async fn bad_paths_and_bodies_are_refused_clearly() {
    let s = Server::memory(&[]).await;
    for (path, says) in [
        ("/ds/a~b", "~"),
        ("/ds/a//b", "empty segment"),
        ("/ds/a%20b", "channel"),
        ("/ds/a%2Fb", "encoded `/`"),
    ] {
        let r = req(&s, "PUT", path, &[], "").await;
        let e = r.expect_error(400, "invalid_stream_path");
        let m = e["message"].as_str().unwrap_or_default();
        assert!(m.contains(says), "{path}: {m}");
    }
    req(&s, "GET", "/ds/nothing-here", &[], "")
        .await
        .expect_error(404, "stream_not_found");

    let created = req(&s, "PUT", "/ds/bin", &[("content-type", "text/plain")], "").await;
    assert_eq!(created.status, 201);
    let bytes = s
        .send(
            s.http
                .post(s.url("/ds/bin"))
                .header("content-type", "text/plain")
                .body(vec![0xffu8, 0x00, 0x80]),
        )
        .await;
    bytes.expect_error(415, "invalid_utf8");
    let read = req(&s, "GET", "/ds/bin?offset=-1", &[], "").await;
    assert_eq!(read.status, 200);
    assert_eq!(read.text, "", "nothing was stored");
}
