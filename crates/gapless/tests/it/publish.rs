//! `POST /v1/channels/{channel}/events`: names, types, body rules, size limit,
//! idempotency and ephemeral events.

use gapless_testkit::{pct, seq_of, Server};
use serde_json::json;

#[tokio::test]
async fn publish_answers_201_with_dense_seqs_and_cursors() {
    let s = Server::start(&[]).await;
    for want in 1..=3u64 {
        let r = s.publish("orders", &format!("e{want}")).await;
        assert_eq!(r["channel"], "orders");
        assert_eq!(r["seq"], want);
        let cursor = r["cursor"].as_str().expect("cursor");
        assert!(
            !cursor.is_empty()
                && cursor
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
            "cursor is URL-safe base64: {cursor}"
        );
        assert_eq!(seq_of(cursor, "orders"), want);
    }
    // Channels are independent: another channel starts at 1.
    assert_eq!(s.publish("other", "x").await["seq"], 1);
    let data = s.all_data("orders").await;
    assert_eq!(data, ["e1", "e2", "e3"]);
}

#[tokio::test]
async fn channel_name_of_200_chars_accepted_201_rejected() {
    let s = Server::start(&[]).await;
    let ok = "a".repeat(200);
    s.publish(&ok, "x").await;
    assert_eq!(s.info(&ok).await["head"], 1);

    let long = "a".repeat(201);
    let r = s
        .post(&format!("/v1/channels/{long}/events"), "x", &[])
        .await;
    r.expect_error(400, "invalid_channel");
    assert!(
        r.message().contains("201") && r.message().contains("200"),
        "names the length rule: {}",
        r.message()
    );
    s.get(&format!("/v1/channels/{long}"))
        .await
        .expect_error(400, "invalid_channel");
}

#[tokio::test]
async fn dot_channels_no_url_can_reach_are_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = Server::memory(&[]).await;
    // Sent raw: an HTTP client library normalises the segment away itself.
    for name in ["%2e", "%2e%2e", "%2E%2E"] {
        for req in [
            format!("POST /v1/channels/{name}/events HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx"),
            format!("GET /v1/channels/{name}/events HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        ] {
            let mut tcp = tokio::net::TcpStream::connect(s.addr).await.expect("connect");
            tcp.write_all(req.as_bytes()).await.expect("write");
            let mut answer = String::new();
            tcp.read_to_string(&mut answer).await.expect("read");
            assert!(answer.starts_with("HTTP/1.1 400"), "{req}: {answer}");
            assert!(answer.contains("invalid_channel"), "{answer}");
            assert!(answer.contains("RFC 3986"), "{answer}");
        }
    }
    let r = s.get("/v1/sse?channels=a,..").await;
    assert_eq!(r.status, 400, "{}", r.text);
    // Dots with anything else are names like any other.
    s.publish("...", "x").await;
    s.publish(".a", "x").await;
}

#[tokio::test]
async fn channel_name_with_bad_character_is_400_naming_the_rule() {
    let s = Server::start(&[]).await;
    let r = s
        .post(&format!("/v1/channels/{}/events", pct("a b")), "x", &[])
        .await;
    r.expect_error(400, "invalid_channel");
    assert!(
        r.message().contains("' ' at position 2")
            && r.message()
                .contains("allowed characters are A-Z a-z 0-9 _ - . : @ ~"),
        "message names the rule: {}",
        r.message()
    );
    for bad in ["é", "a/b", "a%b", "a+b", "a!b"] {
        let r = s
            .post(&format!("/v1/channels/{}/events", pct(bad)), "x", &[])
            .await;
        r.expect_error(400, "invalid_channel");
    }
    // Every endpoint that takes a channel applies the same rule.
    let bad = pct("a b");
    s.get(&format!("/v1/channels/{bad}/events"))
        .await
        .expect_error(400, "invalid_channel");
    s.get(&format!("/v1/channels/{bad}"))
        .await
        .expect_error(400, "invalid_channel");
    s.get(&format!("/v1/channels/{bad}/sse"))
        .await
        .expect_error(400, "invalid_channel");
    s.get(&format!("/v1/sse?channel={bad}"))
        .await
        .expect_error(400, "invalid_channel");
    s.batch(&bad, &serde_json::json!([{"data": "x"}]), &[])
        .await
        .expect_error(400, "invalid_channel");

    // The whole alphabet is accepted.
    let all = "AZaz09_-.:@~";
    s.publish(all, "ok").await;
    assert_eq!(s.all_data(all).await, ["ok"]);
}

#[tokio::test]
async fn event_type_rules_and_reserved_types_are_400_invalid_type() {
    let s = Server::start(&[]).await;
    let t64 = "t".repeat(64);
    s.publish_q("c", "type=chat.message", "a").await;
    s.publish_q("c", "type=A-z_0.9:x", "b").await;
    s.publish_q("c", &format!("type={t64}"), "c").await;
    let cases = [
        ("gap", "reserved"),
        ("gapless.notice", "reserved"),
        ("gapless.", "reserved"),
        ("", "empty"),
        ("a%40b", "'@'"),
        ("a%20b", "' '"),
        ("a%0Ab", "position 2"),
    ];
    for (t, needle) in cases {
        let r = s
            .post(&format!("/v1/channels/c/events?type={t}"), "x", &[])
            .await;
        r.expect_error(400, "invalid_type");
        assert!(r.message().contains(needle), "type {t:?}: {}", r.message());
    }
    let r = s
        .post(
            &format!("/v1/channels/c/events?type={}", "t".repeat(65)),
            "x",
            &[],
        )
        .await;
    r.expect_error(400, "invalid_type");
    assert!(r.message().contains("64"), "{}", r.message());

    let events = s.all_events("c").await;
    let types: Vec<_> = events
        .iter()
        .map(|e| e["type"].as_str().expect("type").to_owned())
        .collect();
    assert_eq!(
        types,
        ["chat.message", "A-z_0.9:x", t64.as_str()],
        "only valid publishes were appended"
    );
    // An untyped event has type null.
    s.publish("d", "x").await;
    assert!(s.all_events("d").await[0]["type"].is_null());
}

#[tokio::test]
async fn non_utf8_body_is_400_with_offset_and_appends_nothing() {
    let s = Server::start(&[]).await;
    let r = s
        .post("/v1/channels/c/events", b"ok\xff\xfe".to_vec(), &[])
        .await;
    r.expect_error(400, "invalid_utf8");
    assert!(
        r.message().contains("offset 2"),
        "names the first bad byte: {}",
        r.message()
    );
    // A truncated multi-byte sequence is also refused.
    let r = s
        .post("/v1/channels/c/events", b"abc\xc3".to_vec(), &[])
        .await;
    r.expect_error(400, "invalid_utf8");
    assert!(r.message().contains("offset 3"), "{}", r.message());
    assert_eq!(s.info("c").await["head"], 0);
    // Any content type is fine for valid UTF-8, data is kept as is.
    let r = s
        .post(
            "/v1/channels/c/events",
            "{\"k\": \"é\"}\r\n",
            &[("content-type", "application/json")],
        )
        .await;
    r.expect(201);
    assert_eq!(s.all_data("c").await, ["{\"k\": \"é\"}\r\n"]);
}

#[tokio::test]
async fn event_over_max_event_bytes_is_413_with_limit() {
    let s = Server::start(&["--max-event-bytes", "10"]).await;
    s.publish("c", "0123456789").await;
    let r = s.post("/v1/channels/c/events", "0123456789A", &[]).await;
    r.expect_error(413, "too_large");
    assert_eq!(r.json["limit"], 10);
    // The limit is in bytes, not characters: 5 × 'é' = 10 bytes, 6 × = 12.
    s.publish("c", "ééééé").await;
    s.post("/v1/channels/c/events", "éééééé", &[])
        .await
        .expect_error(413, "too_large");
    // A chunked body without Content-Length is held to the same limit.
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = vec![
        Ok(bytes::Bytes::from_static(b"012345")),
        Ok(bytes::Bytes::from_static(b"6789AB")),
    ];
    let body = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    let r = s
        .send(s.http.post(s.url("/v1/channels/c/events")).body(body))
        .await;
    r.expect_error(413, "too_large");
    assert_eq!(r.json["limit"], 10);
    assert_eq!(
        s.all_data("c").await,
        ["0123456789", "ééééé"],
        "nothing oversized was appended"
    );
}

#[tokio::test]
async fn idempotency_key_returns_original_seq_with_200_and_appends_nothing() {
    let s = Server::start(&[]).await;
    let first = s
        .post(
            "/v1/channels/c/events",
            "one",
            &[("Idempotency-Key", "k-1")],
        )
        .await;
    let first = first.expect(201).clone();
    assert_eq!(first["seq"], 1);
    s.publish("c", "two").await;

    let retry = s
        .post(
            "/v1/channels/c/events",
            "one",
            &[("Idempotency-Key", "k-1")],
        )
        .await;
    let retry = retry.expect(200);
    assert_eq!(retry["seq"], 1, "the original seq");
    assert_eq!(retry["cursor"], first["cursor"], "the original cursor");
    assert_eq!(retry["channel"], "c");
    assert_eq!(s.all_data("c").await, ["one", "two"], "nothing appended");
    assert_eq!(s.info("c").await["head"], 2);

    // Keys are per channel.
    let other = s
        .post("/v1/channels/d/events", "x", &[("Idempotency-Key", "k-1")])
        .await;
    assert_eq!(other.expect(201)["seq"], 1);
    // A new key appends.
    let r = s
        .post(
            "/v1/channels/c/events",
            "three",
            &[("Idempotency-Key", "k-2")],
        )
        .await;
    assert_eq!(r.expect(201)["seq"], 3);
}

/// A key reused for other content is a client's bug: 422, nothing appended,
/// on both journals; the same content again is still the duplicate.
#[tokio::test]
async fn an_idempotency_key_reused_with_other_content_is_422() {
    for memory in [false, true] {
        let s = if memory {
            Server::memory(&[]).await
        } else {
            Server::start(&[]).await
        };
        let key = [("Idempotency-Key", "k-1")];
        let r = s.post("/v1/channels/c/events", "one", &key).await;
        assert_eq!(r.expect(201)["seq"], 1);
        let other = s.post("/v1/channels/c/events", "one again", &key).await;
        let e = other.expect_error(422, "idempotency_key_reused");
        let m = e["message"].as_str().expect("message");
        assert!(
            m.contains("Idempotency-Key") && m.contains("data differs"),
            "{m}"
        );
        assert_eq!(e["seq"], 1, "{e}");
        let typed = s.post("/v1/channels/c/events?type=note", "one", &key).await;
        typed.expect_error(422, "idempotency_key_reused");
        let batch = s
            .batch("c", &json!([{"data": "one"}, {"data": "two"}]), &key)
            .await;
        let e = batch.expect_error(422, "idempotency_key_reused");
        assert!(
            e["message"]
                .as_str()
                .expect("message")
                .contains("1 event(s)"),
            "{e}"
        );
        let same = s.post("/v1/channels/c/events", "one", &key).await;
        assert_eq!(same.expect(200)["seq"], 1, "memory={memory}");
        assert_eq!(s.all_data("c").await, ["one"], "nothing appended");
    }
}

#[tokio::test]
async fn idempotency_key_is_forgotten_once_its_events_are_evicted() {
    for memory in [false, true] {
        let args = ["--retention-events", "1"];
        let s = if memory {
            Server::memory(&args).await
        } else {
            Server::start(&args).await
        };
        let r = s
            .post("/v1/channels/c/events", "a", &[("Idempotency-Key", "k")])
            .await;
        assert_eq!(r.expect(201)["seq"], 1);
        // Still retained: deduplicated.
        let r = s
            .post("/v1/channels/c/events", "a", &[("Idempotency-Key", "k")])
            .await;
        assert_eq!(r.expect(200)["seq"], 1);
        s.publish("c", "b").await; // evicts seq 1
                                   // The original is gone: the key no longer names a retained publish,
                                   // so it must not answer with an evicted seq.
        let r = s
            .post("/v1/channels/c/events", "a", &[("Idempotency-Key", "k")])
            .await;
        assert_eq!(r.expect(201)["seq"], 3, "memory={memory}");
    }
}

#[tokio::test]
async fn bad_idempotency_key_or_ephemeral_flag_is_400_invalid_request() {
    let s = Server::start(&[]).await;
    let k256 = "k".repeat(256);
    s.post("/v1/channels/c/events", "x", &[("Idempotency-Key", &k256)])
        .await
        .expect(201);
    let k257 = "k".repeat(257);
    for key in [k257.as_str(), "has space", ""] {
        s.post("/v1/channels/c/events", "x", &[("Idempotency-Key", key)])
            .await
            .expect_error(400, "invalid_request");
    }
    s.post("/v1/channels/c/events?ephemeral=maybe", "x", &[])
        .await
        .expect_error(400, "invalid_request");
    s.post(
        "/v1/channels/c/events?ephemeral=true",
        "x",
        &[("Idempotency-Key", "k")],
    )
    .await
    .expect_error(400, "invalid_request");
    // ephemeral=false is an ordinary publish.
    assert_eq!(
        s.post("/v1/channels/c/events?ephemeral=false", "y", &[])
            .await
            .expect(201)["seq"],
        2
    );
    assert_eq!(s.info("c").await["head"], 2);
}

#[tokio::test]
async fn ephemeral_is_202_delivered_live_without_id_and_never_in_history() {
    let s = Server::start(&[]).await;
    let r = s
        .post("/v1/channels/c/events?ephemeral=true", "nobody", &[])
        .await;
    let r = r.expect(202);
    assert_eq!(r["channel"], "c");
    assert_eq!(r["subscribers"], 0);

    let (mut sub, pre) = s.subscribe("c", "").await;
    let (mut sub2, _) = s.subscribe("c", "").await;
    let r = s
        .post(
            "/v1/channels/c/events?ephemeral=true&type=typing",
            "e1",
            &[],
        )
        .await;
    assert_eq!(r.expect(202)["subscribers"], 2);
    for sub in [&mut sub, &mut sub2] {
        let e = sub.next_event().await;
        assert_eq!((e.event.as_str(), e.data.as_str()), ("typing", "e1"));
        assert_eq!(e.id, None, "an ephemeral event has no id line");
        assert_eq!(
            e.last_event_id, pre.cursor,
            "it does not move the client's cursor"
        );
    }
    // (Published after the ephemeral one arrived: the two kinds are not
    // ordered with each other.)
    let n1 = s.publish("c", "n1").await;
    for sub in [&mut sub, &mut sub2] {
        let n = sub.next_event().await;
        assert_eq!(n.data, "n1");
        assert_eq!(n.id.as_deref(), n1["cursor"].as_str());
    }
    assert!(
        sub.raw_text().contains("\n\nevent: typing\ndata: e1\n\n"),
        "the ephemeral frame has no id line at all: {:?}",
        sub.raw_text()
    );

    // Never journaled: not in history, not replayed.
    assert_eq!(s.all_data("c").await, ["n1"]);
    assert_eq!(s.info("c").await["head"], 1);
    let (mut replay, _) = s.subscribe("c", "since=earliest").await;
    assert_eq!(replay.next_event().await.data, "n1");
    s.publish("c", "n2").await;
    let next = replay.next_event().await;
    assert_eq!(
        next.data, "n2",
        "nothing between the replayed and the live event"
    );
    // (`data: e1`, not `e1`: the base64 cursors in `id:` lines may hold "e1".)
    assert!(!replay.raw_text().contains("data: e1"));
}
