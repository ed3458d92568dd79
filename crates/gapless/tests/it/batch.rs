//! `POST /v1/channels/{channel}/batch`: atomic, ordered, consecutive seqs,
//! limits, body rules and idempotency.

use gapless_testkit::{seq_of, Server};
use serde_json::json;

#[tokio::test]
async fn batch_appends_in_order_with_consecutive_seqs() {
    let s = Server::start(&[]).await;
    s.publish("c", "before").await;
    let r = s
        .batch(
            "c",
            &json!([{"data": "a", "type": "t1"}, {"data": "b"}, {"data": "c\nd", "type": "t2"}]),
            &[],
        )
        .await;
    let r = r.expect(201);
    assert_eq!(r["channel"], "c");
    assert_eq!(r["first_seq"], 2);
    assert_eq!(r["last_seq"], 4);
    let events = r["events"].as_array().expect("events");
    assert_eq!(events.len(), 3);
    for (i, e) in events.iter().enumerate() {
        let seq = 2 + i as u64;
        assert_eq!(e["seq"], seq);
        assert_eq!(seq_of(e["cursor"].as_str().expect("cursor"), "c"), seq);
    }
    assert_eq!(
        r["cursor"], events[2]["cursor"],
        "the batch cursor is at the last event"
    );

    let history = s.all_events("c").await;
    let got: Vec<_> = history
        .iter()
        .map(|e| {
            (
                e["seq"].as_u64().expect("seq"),
                e["data"].as_str().expect("data"),
                e["type"].clone(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (1, "before", json!(null)),
            (2, "a", json!("t1")),
            (3, "b", json!(null)),
            (4, "c\nd", json!("t2")),
        ]
    );
    // One batch commits at one time.
    assert_eq!(history[1]["time"], history[3]["time"]);
}

#[tokio::test]
async fn batch_with_one_bad_item_appends_nothing() {
    let s = Server::start(&["--max-event-bytes", "8"]).await;
    s.publish("c", "first").await;
    let r = s
        .batch(
            "c",
            &json!([{"data": "ok"}, {"data": "x", "type": "gap"}, {"data": "z"}]),
            &[],
        )
        .await;
    r.expect_error(400, "invalid_type");
    assert!(
        r.message().contains("event 1"),
        "names the item: {}",
        r.message()
    );
    let r = s
        .batch("c", &json!([{"data": "ok"}, {"data": "way too long"}]), &[])
        .await;
    r.expect_error(413, "too_large");
    assert!(
        r.message().contains("event 1"),
        "names the item: {}",
        r.message()
    );
    assert_eq!(s.all_data("c").await, ["first"], "all or none");
    assert_eq!(s.info("c").await["head"], 1);
    // The seqs continue densely after refused batches.
    assert_eq!(
        s.batch("c", &json!([{"data": "n"}]), &[]).await.expect(201)["first_seq"],
        2
    );
}

#[tokio::test]
async fn batch_over_max_batch_events_or_bytes_is_413() {
    let s = Server::start(&["--max-batch-events", "3", "--max-batch-bytes", "200"]).await;
    let three = json!([{"data": "1"}, {"data": "2"}, {"data": "3"}]);
    assert_eq!(s.batch("c", &three, &[]).await.expect(201)["last_seq"], 3);
    let four = json!([{"data": "1"}, {"data": "2"}, {"data": "3"}, {"data": "4"}]);
    let r = s.batch("c", &four, &[]).await;
    r.expect_error(413, "too_large");
    assert!(r.message().contains('3'), "{}", r.message());
    let big = json!([{"data": "x".repeat(190)}]);
    assert!(big.to_string().len() > 200);
    let r = s.batch("c", &big, &[]).await;
    r.expect_error(413, "too_large");
    assert_eq!(r.json["limit"], 200);
    assert_eq!(s.info("c").await["head"], 3);
}

#[tokio::test]
async fn batch_body_must_be_a_nonempty_array_of_known_objects() {
    let s = Server::start(&[]).await;
    let bodies = [
        "{}",
        "[]",
        "not json",
        r#"[{"data": "x", "extra": 1}]"#,
        r#"[{"type": "t"}]"#,
        r#"[{"data": 5}]"#,
        r#"["x"]"#,
    ];
    for body in bodies {
        let r = s.post("/v1/channels/c/batch", body, &[]).await;
        r.expect_error(400, "invalid_request");
    }
    // The fields by position (serde's array form of a struct) are no
    // documented shape: refused, saying an object is expected.
    for body in [
        r#"[["data", null]]"#,
        r#"[["data"]]"#,
        r#"[["data", "t"]]"#,
        r#"[{"data": "a"}, ["b", null]]"#,
    ] {
        let r = s.post("/v1/channels/c/batch", body, &[]).await;
        r.expect_error(400, "invalid_request");
        assert!(
            r.message().contains("expected a JSON object")
                && r.message().contains("{\"data\": string"),
            "{body}: {}",
            r.text
        );
    }
    // Not UTF-8: refused (the error table allows either code here).
    let r = s
        .post(
            "/v1/channels/c/batch",
            b"[{\"data\": \"\xff\"}]".to_vec(),
            &[],
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(
        r.json["error"] == "invalid_request" || r.json["error"] == "invalid_utf8",
        "{}",
        r.text
    );
    assert_eq!(s.info("c").await["head"], 0);
}

#[tokio::test]
async fn batch_idempotency_key_returns_original_seqs_and_appends_nothing() {
    let s = Server::start(&[]).await;
    let items = json!([{"data": "a"}, {"data": "b"}, {"data": "c"}]);
    let first = s
        .batch("c", &items, &[("Idempotency-Key", "batch-1")])
        .await
        .expect(201)
        .clone();
    s.publish("c", "d").await;
    let retry = s
        .batch("c", &items, &[("Idempotency-Key", "batch-1")])
        .await;
    let retry = retry.expect(200);
    for k in ["first_seq", "last_seq", "cursor", "events", "channel"] {
        assert_eq!(retry[k], first[k], "{k} is the original");
    }
    assert_eq!(retry["first_seq"], 1);
    assert_eq!(retry["last_seq"], 3);
    assert_eq!(s.all_data("c").await, ["a", "b", "c", "d"]);
    // A key used by a single publish also protects it against a batch retry with that key.
    let single = s
        .post(
            "/v1/channels/c/events",
            "e",
            &[("Idempotency-Key", "single")],
        )
        .await;
    assert_eq!(single.expect(201)["seq"], 5);
    let r = s
        .batch(
            "c",
            &json!([{"data": "e"}]),
            &[("Idempotency-Key", "single")],
        )
        .await;
    let r = r.expect(200);
    assert_eq!(
        (r["first_seq"].clone(), r["last_seq"].clone()),
        (json!(5), json!(5))
    );
    assert_eq!(s.info("c").await["head"], 5);
}
