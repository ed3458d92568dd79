//! Restarts: `kill -9` loses no acknowledged event and keeps epoch and seqs;
//! SIGTERM ends streams cleanly and exits within 5 s; `--memory` restarts are
//! a new epoch; a restored backup keeps its epoch and reads newer cursors as
//! `ahead`; an unclean `--durability async` run starts a new epoch.

use gapless_testkit::{copy_dir, epoch_of, seq_of, Event, Next, Server, SseClient};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

fn event_seq(e: &Event, channel: &str) -> u64 {
    seq_of(e.id.as_deref().expect("id"), channel)
}

#[tokio::test]
async fn resume_after_kill9_keeps_epoch_and_seq() {
    let mut s = Server::start(&[]).await;
    let epoch = s.epoch("c").await;
    let (mut sub, _) = s.subscribe("c", "since=earliest").await;
    s.publish_many("c", "e", 3).await;
    // The client has handled two events when the server dies under the open
    // stream (the third may be in flight; the client's position is the second).
    let got = sub.events(2).await;
    let last = got[1].id.clone().expect("id");
    assert_eq!(seq_of(&last, "c"), 2);
    s.kill9().await;
    let (_, end) = sub.until_end(Duration::from_secs(5)).await;
    assert_ne!(
        end,
        Next::End,
        "a killed server does not end the stream cleanly"
    );

    s.restart().await; // same port: the client reconnects to the same URL
    assert_eq!(s.epoch("c").await, epoch, "same data dir, same epoch");
    assert_eq!(s.info("c").await["head"], 3, "seqs survive");
    s.publish_many("c", "f", 2).await;

    let (mut again, pre) = s.resume("c", &last).await;
    assert!(
        pre.gaps.is_empty(),
        "no gap after a restart: {:?}",
        pre.gaps
    );
    assert_eq!(pre.cursor, last);
    let missed = again.events(3).await;
    assert_eq!(
        missed.iter().map(|e| event_seq(e, "c")).collect::<Vec<_>>(),
        [3, 4, 5]
    );
    assert_eq!(
        missed.iter().map(|e| e.data.as_str()).collect::<Vec<_>>(),
        ["e2", "f0", "f1"]
    );
    for e in &missed {
        assert_eq!(epoch_of(e.id.as_deref().expect("id"), "c"), epoch);
    }
    // Exactly what was missed, no duplicates: the next event is a new live one.
    s.publish("c", "live").await;
    let e = again.next_event().await;
    assert_eq!((event_seq(&e, "c"), e.data.as_str()), (6, "live"));
}

#[tokio::test]
async fn idempotency_key_still_dedups_after_kill9() {
    // The reason for the key: a publisher that lost the answer in a crash retries.
    let mut s = Server::start(&[]).await;
    let first = s
        .post(
            "/v1/channels/c/events",
            "once",
            &[("Idempotency-Key", "retry-me")],
        )
        .await;
    let first = first.expect(201).clone();
    s.kill9().await;
    s.restart().await;
    let retry = s
        .post(
            "/v1/channels/c/events",
            "once",
            &[("Idempotency-Key", "retry-me")],
        )
        .await;
    let retry = retry.expect(200);
    assert_eq!(
        (&retry["seq"], &retry["cursor"]),
        (&first["seq"], &first["cursor"])
    );
    assert_eq!(s.all_data("c").await, ["once"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_event_survives_kill9_with_concurrent_publishers() {
    let mut s = Server::start(&[]).await;
    let url = s.base();
    let http = s.http.clone();
    let epoch = s.epoch("k0").await;
    // channel -> seq -> data, for every 2xx answer
    let acked: Arc<Mutex<BTreeMap<String, BTreeMap<u64, String>>>> = Arc::default();
    let mut publishers = Vec::new();
    for p in 0..4 {
        let (http, url, acked) = (http.clone(), url.clone(), acked.clone());
        publishers.push(tokio::spawn(async move {
            let channel = format!("k{}", p % 2);
            for i in 0.. {
                let data = format!("p{p}-{i}");
                let resp = http
                    .post(format!("{url}/v1/channels/{channel}/events"))
                    .body(data.clone())
                    .timeout(Duration::from_secs(5))
                    .send()
                    .await;
                let Ok(resp) = resp else { break };
                if !resp.status().is_success() {
                    break;
                }
                let Ok(body) = resp.json::<serde_json::Value>().await else {
                    break;
                };
                let seq = body["seq"].as_u64().expect("seq");
                let prev = acked
                    .lock()
                    .await
                    .entry(channel.clone())
                    .or_default()
                    .insert(seq, data);
                assert!(prev.is_none(), "seq {seq} acknowledged twice on {channel}");
            }
        }));
    }
    gapless_testkit::eventually(
        "200 acknowledged publishes",
        Duration::from_secs(20),
        || async {
            acked
                .lock()
                .await
                .values()
                .map(BTreeMap::len)
                .sum::<usize>()
                >= 200
        },
    )
    .await;
    s.kill9().await;
    for p in publishers {
        p.await.expect("publisher");
    }
    s.restart().await;

    let acked = acked.lock().await;
    for (channel, events) in acked.iter() {
        let history = s.all_events(channel).await;
        let stored: BTreeMap<u64, String> = history
            .iter()
            .map(|e| {
                (
                    e["seq"].as_u64().expect("seq"),
                    e["data"].as_str().expect("data").to_owned(),
                )
            })
            .collect();
        let seqs: Vec<u64> = stored.keys().copied().collect();
        assert_eq!(
            seqs,
            (1..=seqs.len() as u64).collect::<Vec<_>>(),
            "{channel}: seqs are dense from 1"
        );
        for (seq, data) in events {
            assert_eq!(
                stored.get(seq),
                Some(data),
                "{channel}: acknowledged seq {seq} survives with its data"
            );
        }
        assert_eq!(s.epoch(channel).await, epoch);
    }
}

#[tokio::test]
async fn sigterm_ends_streams_cleanly_and_exits_within_5s() {
    let mut s = Server::start(&[]).await;
    s.publish("c", "before").await;
    let epoch = s.epoch("c").await;
    let (mut single, _) = s.subscribe("c", "").await;
    let mut multi = SseClient::connect(s.addr, "/v1/sse?channel=c&channel=d", &[]).await;
    multi.preamble().await;
    let (status, took) = s.sigterm().await;
    assert!(status.success(), "exit status {status:?}");
    assert!(took < Duration::from_secs(5), "exited in {took:?}");
    for sub in [&mut single, &mut multi] {
        let (items, end) = sub.until_end(Duration::from_secs(5)).await;
        assert_eq!(
            end,
            Next::End,
            "the stream ends with the chunked terminator, not a reset"
        );
        assert!(
            items
                .iter()
                .all(|i| matches!(i, gapless_testkit::Item::Comment(_))),
            "nothing but heartbeats before the end: {items:?}"
        );
    }
    // Everything was flushed: a restart has the event, same epoch.
    s.restart().await;
    assert_eq!(s.all_data("c").await, ["before"]);
    assert_eq!(s.epoch("c").await, epoch);
}

#[tokio::test]
async fn memory_restart_changes_epoch_and_reconnect_gets_epoch_gap() {
    let mut s = Server::memory(&[]).await;
    let (mut sub, _) = s.subscribe("c", "").await;
    s.publish_many("c", "e", 2).await;
    let last = sub.events(2).await[1].id.clone().expect("id");
    let old_epoch = epoch_of(&last, "c");
    s.restart().await;
    s.publish("c", "new").await;
    let new_epoch = s.epoch("c").await;
    assert_ne!(new_epoch, old_epoch);

    let (mut sub, pre) = s.resume("c", &last).await;
    assert_eq!(pre.gaps.len(), 1, "{:?}", pre.gaps);
    let gap = &pre.gaps[0];
    assert_eq!(gap["reason"], "epoch");
    assert_eq!(gap["channel"], "c");
    assert_eq!(gap["after"], last.as_str());
    let next = gap["next"].as_str().expect("next");
    assert_eq!(
        (epoch_of(next, "c"), seq_of(next, "c")),
        (new_epoch.clone(), 1),
        "next: the new head"
    );
    assert_eq!(pre.cursor, next);
    s.publish("c", "live").await;
    let e = sub.next_event().await;
    assert_eq!((e.data.as_str(), event_seq(&e, "c")), ("live", 2));
}

#[tokio::test]
async fn restored_backup_keeps_epoch_and_newer_cursor_reads_as_ahead() {
    let mut s = Server::start(&[]).await;
    s.publish_many("c", "e", 3).await;
    let epoch = s.epoch("c").await;
    let (status, _) = s.sigterm().await;
    assert!(status.success());
    let backup = s.scratch("backup");
    copy_dir(&s.data_dir(), &backup);

    s.restart().await;
    s.publish_many("c", "f", 3).await;
    let (mut sub, _) = s.subscribe("c", "since=earliest").await;
    let newer = sub.events(6).await[5].id.clone().expect("id");
    assert_eq!(seq_of(&newer, "c"), 6);
    drop(sub);
    let (status, _) = s.sigterm().await;
    assert!(status.success());

    std::fs::remove_dir_all(s.data_dir()).expect("remove data dir");
    copy_dir(&backup, &s.data_dir());
    s.restart().await;
    assert_eq!(s.epoch("c").await, epoch, "a restored copy keeps its epoch");
    assert_eq!(s.info("c").await["head"], 3);

    let (mut sub, pre) = s.resume("c", &newer).await;
    assert_eq!(pre.gaps.len(), 1, "{:?}", pre.gaps);
    let gap = &pre.gaps[0];
    assert_eq!(gap["reason"], "ahead");
    assert_eq!(gap["after"], newer.as_str());
    assert_eq!(gap["next"].as_str().map(|n| seq_of(n, "c")), Some(3));
    let r = s.history("c", &format!("after={newer}")).await;
    let body = r.expect_error(410, "cursor_not_served");
    assert_eq!(body["reason"], "ahead");
    // Re-anchored at the head, the stream continues live.
    s.publish("c", "g").await;
    let e = sub.next_event().await;
    assert_eq!((e.data.as_str(), event_seq(&e, "c")), ("g", 4));
}

#[tokio::test]
async fn async_durability_keeps_epoch_on_sigterm_and_draws_new_one_after_kill9() {
    let mut s = Server::start(&["--durability", "async"]).await;
    let c1 = s.publish("c", "a").await["cursor"]
        .as_str()
        .expect("cursor")
        .to_owned();
    let epoch = s.epoch("c").await;
    let (status, _) = s.sigterm().await;
    assert!(status.success());
    s.restart().await;
    assert_eq!(
        s.epoch("c").await,
        epoch,
        "a clean async shutdown keeps the epoch"
    );
    assert_eq!(s.all_data("c").await, ["a"]);

    s.publish("c", "b").await;
    s.kill9().await;
    s.restart().await;
    assert_ne!(
        s.epoch("c").await,
        epoch,
        "an unclean async run may have lost events: new epoch"
    );
    let (_, pre) = s.resume("c", &c1).await;
    assert_eq!(pre.gaps.len(), 1);
    assert_eq!(pre.gaps[0]["reason"], "epoch");
}
