//! Readers that lag: a slow reader is served from the journal and never
//! skipped silently; a reader that retention passes mid-stream gets an
//! `evicted` gap naming the hole and continues; subscribing while events are
//! being published delivers every seq exactly once, in order.

use gapless_testkit::{seq_of, ConnectOptions, Event, Item, Server, SseClient};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

fn event_seq(e: &Event, channel: &str) -> u64 {
    seq_of(
        e.id.as_deref().expect("a journaled event has an id"),
        channel,
    )
}

/// A small client receive buffer (which also turns off receive autotuning),
/// so a reader that stops reading stalls the server's writes quickly.
const SMALL_RCVBUF: ConnectOptions = ConnectOptions {
    recv_buffer: Some(16 * 1024),
};

/// Publishes `n` events of about `size` bytes, numbered from `from`, in batches of `per_batch`.
async fn publish_padded(
    s: &Server,
    channel: &str,
    from: usize,
    n: usize,
    size: usize,
    per_batch: usize,
) {
    let pad = "p".repeat(size.saturating_sub(8));
    let mut i = from;
    while i < from + n {
        let end = (i + per_batch).min(from + n);
        let items: Vec<_> = (i..end)
            .map(|k| serde_json::json!({"data": format!("{k:07}:{pad}")}))
            .collect();
        s.batch(channel, &serde_json::Value::Array(items), &[])
            .await
            .expect(201);
        i = end;
    }
}

fn number(e: &Event) -> usize {
    e.data[..7].parse().expect("numbered event")
}

#[tokio::test]
async fn slow_reader_reads_from_journal_and_gets_every_event_once_in_order() {
    // 3000 events of 4 KiB = 12 MiB (more if the send buffer may grow past
    // 4 MiB) while the reader reads nothing: at most the socket buffers and the
    // in-memory window (1 MiB / 1024 events) can hold what the reader lags by,
    // so most of the backlog must be read back from the journal.
    let s = Server::start(&[]).await;
    let mut sub = SseClient::connect_with(s.addr, "/v1/channels/slow/sse", &[], SMALL_RCVBUF).await;
    let pre = sub.preamble().await;
    assert_eq!(seq_of(&pre.cursor, "slow"), 0);
    let n = (((max_send_buffer() + (8 << 20)) / 4096) as usize).max(3000);
    publish_padded(&s, "slow", 0, n, 4096, 250).await;

    for i in 0..n {
        let e = sub.next_event().await;
        assert!(!e.is_gap(), "a slow reader is never skipped: {}", e.data);
        assert_eq!(event_seq(&e, "slow"), i as u64 + 1);
        assert_eq!(number(&e), i);
        assert_eq!(e.data.len(), 4096);
        if i % 300 == 0 {
            // Read slowly.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Caught up: it follows live.
    s.publish("slow", &format!("{n:07}:live")).await;
    let e = sub.next_event().await;
    assert_eq!(event_seq(&e, "slow"), n as u64 + 1);
    assert_eq!(number(&e), n);
}

/// The most a socket's send buffer can autotune to (`tcp_wmem` max), 4 MiB if unknown.
fn max_send_buffer() -> u64 {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem")
        .ok()
        .and_then(|s| s.split_whitespace().nth(2).and_then(|v| v.parse().ok()))
        .unwrap_or(4 << 20)
}

#[tokio::test]
async fn reader_passed_by_retention_mid_stream_gets_evicted_gap_then_continues() {
    // A reader that stops reading stalls the server once the socket buffers
    // are full: at most the server's send buffer (tcp_wmem max, 4 MiB by
    // default), the client's 32 KiB receive buffer, hyper's write buffer and
    // one journal batch (at most KEEP events). Publishing several times that
    // in 64 KiB events, with KEEP retained, moves the floor far past where
    // the server stopped, so retention must pass the reader: deterministic.
    const SIZE: u64 = 64 * 1024;
    const KEEP: u64 = 20;
    let n: u64 = ((max_send_buffer() + (4 << 20)) / SIZE + 100).max(400);
    let s = Server::start(&[
        "--retention-events",
        &KEEP.to_string(),
        "--durability",
        "async",
    ])
    .await;
    let mut sub = SseClient::connect_with(s.addr, "/v1/channels/lag/sse", &[], SMALL_RCVBUF).await;
    sub.preamble().await;
    publish_padded(&s, "lag", 0, n as usize, SIZE as usize, 10).await;
    assert_eq!(s.info("lag").await["floor"], n - KEEP + 1);

    let mut before = Vec::new();
    let gap = loop {
        let e = sub.next_event().await;
        if e.is_gap() {
            break e;
        }
        before.push(event_seq(&e, "lag"));
    };
    let k = before.len() as u64;
    assert_eq!(
        before,
        (1..=k).collect::<Vec<_>>(),
        "in order, none skipped before the gap"
    );
    assert!(
        k < n - KEEP,
        "the reader had fallen behind the floor (read {k})"
    );
    let g = gap.json();
    assert_eq!(g["channel"], "lag");
    assert_eq!(g["reason"], "evicted");
    assert_eq!(
        seq_of(g["after"].as_str().expect("after"), "lag"),
        k,
        "after: the last event delivered"
    );
    let next = g["next"].as_str().expect("next");
    let next_seq = seq_of(next, "lag");
    assert_eq!(next_seq, n - KEEP, "next: the event before the floor");
    // Mid-stream, the gap is followed by an id-only frame at the new position.
    match sub.next_item().await {
        Item::IdOnly(c) => assert_eq!(c, next),
        other => panic!("expected the id frame after a gap, got {other:?}"),
    }
    // Then everything from the floor, in order.
    for want in next_seq + 1..=n {
        let e = sub.next_event().await;
        assert!(!e.is_gap(), "only one gap");
        assert_eq!(event_seq(&e, "lag"), want);
        assert_eq!(number(&e) as u64, want - 1);
    }
    s.publish("lag", &format!("{n:07}:live")).await;
    assert_eq!(event_seq(&sub.next_event().await, "lag"), n + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_racing_with_publishes_sees_each_seq_once_in_order() {
    const N: u64 = 300;
    let s = Arc::new(Server::start(&[]).await);
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let publisher = {
        let s = s.clone();
        let acked = acked.clone();
        tokio::spawn(async move {
            for i in 1..=N {
                let r = s.publish("race", &format!("e{i}")).await;
                assert_eq!(r["seq"], i);
                acked
                    .lock()
                    .await
                    .push(r["cursor"].as_str().expect("cursor").to_owned());
            }
        })
    };
    // Subscribe at different moments while the publisher runs: live, from the
    // start, and resuming from the newest acknowledged cursor.
    let mut readers = Vec::new();
    for round in 0..6u64 {
        let want = 5 + round * 30;
        let cursor = loop {
            {
                let a = acked.lock().await;
                if a.len() as u64 >= want {
                    break a.last().cloned().expect("an ack");
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        let query = match round % 3 {
            0 => String::new(),
            1 => "since=earliest".to_owned(),
            _ => format!("last_event_id={cursor}"),
        };
        let mut sub =
            SseClient::connect(s.addr, &format!("/v1/channels/race/sse?{query}"), &[]).await;
        readers.push(tokio::spawn(async move {
            let pre = sub.preamble().await;
            assert!(pre.gaps.is_empty(), "{:?}", pre.gaps);
            let start = seq_of(&pre.cursor, "race");
            for want in start + 1..=N {
                let e = sub.next_event().await;
                assert_eq!(
                    event_seq(&e, "race"),
                    want,
                    "{query}: each seq once, in order"
                );
                assert_eq!(e.data, format!("e{want}"));
            }
            start
        }));
    }
    publisher.await.expect("publisher");
    let mut starts = Vec::new();
    for r in readers {
        starts.push(r.await.expect("reader"));
    }
    assert!(
        starts.iter().any(|&st| st > 0),
        "some reader joined mid-publish: {starts:?}"
    );
}
