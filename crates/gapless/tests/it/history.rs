//! `GET /v1/channels/{channel}/events` (history pages), `GET /v1/channels/{channel}`,
//! `/healthz`, and the JSON 404/405 answers.

use gapless_testkit::{eventually, make_cursor, other_version_cursor, seq_of, Server};
use serde_json::Value;
use std::time::Duration;

fn seqs(page: &Value) -> Vec<u64> {
    page["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["seq"].as_u64().expect("seq"))
        .collect()
}

fn is_epoch(v: &Value) -> bool {
    v.as_str().is_some_and(|s| {
        s.len() == 16
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    })
}

#[tokio::test]
async fn history_without_after_reads_from_floor() {
    let s = Server::start(&["--retention-events", "5"]).await;
    s.publish_many("c", "e", 8).await;
    let r = s.history("c", "").await;
    let page = r.expect(200);
    assert_eq!(page["channel"], "c");
    assert_eq!(page["floor"], 4);
    assert_eq!(page["head"], 8);
    assert_eq!(seqs(page), [4, 5, 6, 7, 8]);
    assert_eq!(page["done"], true);
    let first = &page["events"][0];
    assert_eq!(first["data"], "e3");
    assert!(first["type"].is_null());
    assert_eq!(seq_of(first["cursor"].as_str().expect("cursor"), "c"), 4);
    assert!(
        is_epoch(&page["epoch"]),
        "epoch is 16 hex digits: {}",
        page["epoch"]
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let time = first["time"].as_u64().expect("time");
    assert!(
        now.abs_diff(time) < 60_000,
        "time is Unix ms ({time} vs now {now})"
    );
}

#[tokio::test]
async fn history_limit_default_max_and_invalid() {
    let s = Server::start(&[]).await;
    s.publish_many("c", "e", 1005).await;
    let page = s.history("c", "").await.expect(200).clone();
    assert_eq!(
        seqs(&page),
        (1..=100).collect::<Vec<_>>(),
        "default limit is 100"
    );
    assert_eq!(page["done"], false);
    let page = s.history("c", "limit=1000").await.expect(200).clone();
    assert_eq!(seqs(&page).len(), 1000);
    let page = s.history("c", "limit=1").await.expect(200).clone();
    assert_eq!(seqs(&page), [1]);
    for bad in ["1001", "0", "-1", "abc", "", "1.5"] {
        let r = s.history("c", &format!("limit={bad}")).await;
        r.expect_error(400, "invalid_request");
    }
    // A parameter given twice is read from its first occurrence (docs/api.md).
    let page = s.history("c", "limit=2&limit=5").await.expect(200).clone();
    assert_eq!(seqs(&page), [1, 2]);
    s.history("c", "limit=abc&limit=5")
        .await
        .expect_error(400, "invalid_request");
    let page = s
        .history("c", "limit=3&limit=abc")
        .await
        .expect(200)
        .clone();
    assert_eq!(seqs(&page), [1, 2, 3]);
}

#[tokio::test]
async fn history_paging_follows_next_and_done_page_next_is_the_tip() {
    let s = Server::start(&[]).await;
    // An empty channel: done at once, next is the tip at 0.
    let empty = s.history("c", "").await.expect(200).clone();
    assert_eq!(seqs(&empty), Vec::<u64>::new());
    assert_eq!(empty["done"], true);
    assert_eq!(
        (empty["floor"].clone(), empty["head"].clone()),
        (1.into(), 0.into())
    );
    let tip0 = empty["next"].as_str().expect("next").to_owned();
    assert_eq!(seq_of(&tip0, "c"), 0);

    s.publish_many("c", "e", 5).await;
    // From the empty channel's tip, everything published since.
    let all = s
        .history("c", &format!("after={tip0}"))
        .await
        .expect(200)
        .clone();
    assert_eq!(seqs(&all), [1, 2, 3, 4, 5]);

    let p1 = s.history("c", "limit=2").await.expect(200).clone();
    assert_eq!((seqs(&p1), p1["done"].clone()), (vec![1, 2], false.into()));
    assert_eq!(
        p1["next"], p1["events"][1]["cursor"],
        "next is the last event's cursor"
    );
    let p2 = s
        .history(
            "c",
            &format!("limit=2&after={}", p1["next"].as_str().expect("next")),
        )
        .await;
    let p2 = p2.expect(200).clone();
    assert_eq!((seqs(&p2), p2["done"].clone()), (vec![3, 4], false.into()));
    let p3 = s
        .history(
            "c",
            &format!("limit=2&after={}", p2["next"].as_str().expect("next")),
        )
        .await;
    let p3 = p3.expect(200).clone();
    assert_eq!((seqs(&p3), p3["done"].clone()), (vec![5], true.into()));
    let tip = p3["next"].as_str().expect("next").to_owned();
    assert_eq!(seq_of(&tip, "c"), 5, "the done page's next is the tip");

    // A page that ends exactly at the head is done.
    let exact = s
        .history(
            "c",
            &format!(
                "limit=2&after={}",
                p1["events"][0]["cursor"].as_str().expect("c")
            ),
        )
        .await;
    let exact = exact.expect(200).clone();
    assert_eq!(seqs(&exact), [2, 3]);
    assert_eq!(exact["done"], false);
    let exact = s
        .history(
            "c",
            &format!(
                "limit=2&after={}",
                p2["events"][0]["cursor"].as_str().expect("c")
            ),
        )
        .await;
    let exact = exact.expect(200).clone();
    assert_eq!(
        (seqs(&exact), exact["done"].clone()),
        (vec![4, 5], true.into())
    );

    // At the tip: nothing yet, still done, next stays the tip; then new events follow.
    let at_tip = s
        .history("c", &format!("after={tip}"))
        .await
        .expect(200)
        .clone();
    assert_eq!(
        (seqs(&at_tip), at_tip["done"].clone()),
        (vec![], true.into())
    );
    assert_eq!(at_tip["next"], tip);
    s.publish_many("c", "f", 2).await;
    let more = s
        .history("c", &format!("after={tip}"))
        .await
        .expect(200)
        .clone();
    assert_eq!(seqs(&more), [6, 7]);
}

#[tokio::test]
async fn history_410_evicted_with_floor_cursor() {
    let s = Server::start(&["--retention-events", "3"]).await;
    let c1 = s.publish("c", "e1").await["cursor"]
        .as_str()
        .expect("cursor")
        .to_owned();
    let c3 = {
        s.publish("c", "e2").await;
        s.publish("c", "e3").await["cursor"]
            .as_str()
            .expect("cursor")
            .to_owned()
    };
    s.publish_many("c", "x", 3).await; // head 6, floor 4
    let r = s.history("c", &format!("after={c1}")).await;
    let body = r.expect_error(410, "cursor_not_served");
    assert_eq!(body["reason"], "evicted");
    assert_eq!(body["floor"], 4);
    let floor_cursor = body["floor_cursor"].as_str().expect("floor_cursor");
    let page = s
        .history("c", &format!("after={floor_cursor}"))
        .await
        .expect(200)
        .clone();
    assert_eq!(
        seqs(&page),
        [4, 5, 6],
        "floor_cursor reads everything retained"
    );
    // A cursor right before the floor loses nothing: served.
    let page = s
        .history("c", &format!("after={c3}"))
        .await
        .expect(200)
        .clone();
    assert_eq!(seqs(&page), [4, 5, 6]);
}

#[tokio::test]
async fn history_410_ahead_and_unknown() {
    let s = Server::start(&[]).await;
    s.publish_many("c", "e", 3).await;
    let epoch = s.epoch("c").await;
    let ahead = make_cursor("c", &epoch, 9);
    let r = s.history("c", &format!("after={ahead}")).await;
    let body = r.expect_error(410, "cursor_not_served");
    assert_eq!(body["reason"], "ahead");
    assert_eq!(body["floor"], 1);
    assert_eq!(
        seq_of(body["floor_cursor"].as_str().expect("floor_cursor"), "c"),
        0
    );

    let r = s
        .history("c", &format!("after={}", other_version_cursor()))
        .await;
    let body = r.expect_error(410, "cursor_not_served");
    assert_eq!(body["reason"], "unknown");
    assert!(body["floor_cursor"].is_string());

    // Another epoch.
    let other = format!("{:016x}", u64::from_str_radix(&epoch, 16).expect("hex") ^ 1);
    let r = s
        .history("c", &format!("after={}", make_cursor("c", &other, 1)))
        .await;
    assert_eq!(r.expect_error(410, "cursor_not_served")["reason"], "epoch");
}

#[tokio::test]
async fn history_410_epoch_after_memory_restart() {
    let mut s = Server::memory(&[]).await;
    let old = s.publish("c", "a").await["cursor"]
        .as_str()
        .expect("cursor")
        .to_owned();
    let old_epoch = s.epoch("c").await;
    s.restart().await;
    s.publish("c", "b").await;
    assert_ne!(
        s.epoch("c").await,
        old_epoch,
        "a --memory restart is a new epoch"
    );
    let r = s.history("c", &format!("after={old}")).await;
    let body = r.expect_error(410, "cursor_not_served");
    assert_eq!(body["reason"], "epoch");
    let page = s
        .history(
            "c",
            &format!(
                "after={}",
                body["floor_cursor"].as_str().expect("floor_cursor")
            ),
        )
        .await;
    assert_eq!(page.expect(200)["events"][0]["data"], "b");
}

#[tokio::test]
async fn history_400_on_garbage_cursor() {
    let s = Server::start(&[]).await;
    let c = s.publish("c", "a").await["cursor"]
        .as_str()
        .expect("cursor")
        .to_owned();
    let mut flipped = c.clone().into_bytes();
    flipped[4] = if flipped[4] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).expect("ascii");
    for bad in ["garbage", "!!!", flipped.as_str(), "AAAAAAAAAAAA"] {
        let r = s
            .history("c", &format!("after={}", gapless_testkit::pct(bad)))
            .await;
        r.expect_error(400, "invalid_cursor");
    }
    // A valid cursor of another channel names no position on this one.
    let other = s.publish("d", "x").await["cursor"]
        .as_str()
        .expect("cursor")
        .to_owned();
    s.history("c", &format!("after={other}"))
        .await
        .expect_error(400, "invalid_cursor");
}

#[tokio::test]
async fn channel_info_reports_bounds_and_subscribers() {
    let s = Server::start(&["--retention-events", "2"]).await;
    let info = s.info("never").await;
    assert_eq!(info["channel"], "never");
    assert_eq!(
        (info["floor"].clone(), info["head"].clone()),
        (1.into(), 0.into())
    );
    assert_eq!(info["subscribers"], 0);
    assert!(is_epoch(&info["epoch"]));

    s.publish_many("c", "e", 3).await;
    let info = s.info("c").await;
    assert_eq!(
        (info["floor"].clone(), info["head"].clone()),
        (2.into(), 3.into())
    );
    assert_eq!(info["epoch"], s.history("c", "").await.json["epoch"]);

    let (a, _) = s.subscribe("c", "").await;
    let mut b = s.sse("/v1/sse?channel=c&channel=other", &[]).await;
    b.preamble().await;
    assert_eq!(s.info("c").await["subscribers"], 2);
    assert_eq!(s.info("other").await["subscribers"], 1);
    drop(a);
    drop(b);
    eventually("subscribers drop to 0", Duration::from_secs(5), || async {
        s.info("c").await["subscribers"] == 0
    })
    .await;
}

#[tokio::test]
async fn healthz_is_ok() {
    let s = Server::start(&[]).await;
    let r = s.get("/healthz").await;
    assert_eq!(r.expect(200), &serde_json::json!({"status": "ok"}));
}

#[tokio::test]
async fn unknown_path_is_404_and_wrong_method_is_405_with_json_errors() {
    let s = Server::start(&[]).await;
    for path in [
        "/nope",
        "/v1/channels",
        "/v1/channels/c/nope",
        "/v2/channels/c/events",
    ] {
        s.get(path).await.expect_error(404, "not_found");
    }
    let r = s.send(s.http.delete(s.url("/v1/channels/c/events"))).await;
    r.expect_error(405, "method_not_allowed");
    s.get("/v1/channels/c/batch")
        .await
        .expect_error(405, "method_not_allowed");
    s.post("/healthz", "", &[])
        .await
        .expect_error(405, "method_not_allowed");
    s.post("/v1/channels/c/sse", "", &[])
        .await
        .expect_error(405, "method_not_allowed");
    s.send(s.http.put(s.url("/v1/channels/c")))
        .await
        .expect_error(405, "method_not_allowed");
}
