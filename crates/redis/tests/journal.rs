//! The Redis journal against a real `redis-server` (started by
//! `gapless_testkit::redis` on a free port; `scripts/test.sh` installs it
//! when missing), beyond the contract every journal keeps
//! (`crates/testkit/tests/journal_contract.rs`): seqs, batches,
//! idempotency, retention by count and age, a wiped Redis as a new epoch,
//! an out-of-memory Redis refusing a batch whole, and an unreachable Redis
//! answering `Unavailable` within the timeout.

use gapless_core::journal::{ChannelState, CommitSink, Journal, JournalError, NoSink, Retention};
use gapless_protocol::{Event, NewEvent};
use gapless_redis::{RedisJournal, RedisOptions};
use gapless_testkit::redis::Redis;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The Redis journal on `redis`, with a 500 ms timeout.
fn journal(redis: &Redis, retention: Retention, sink: Arc<dyn CommitSink>) -> RedisJournal {
    RedisJournal::open(
        RedisOptions {
            url: redis.url(),
            retention,
            timeout_ms: 500,
            ..RedisOptions::default()
        },
        sink,
    )
    .expect("open")
}

fn ev(data: &str) -> NewEvent {
    NewEvent {
        event_type: None,
        data: data.to_owned(),
    }
}

fn typed(t: &str, data: &str) -> NewEvent {
    NewEvent {
        event_type: Some(t.to_owned()),
        data: data.to_owned(),
    }
}

#[derive(Default)]
struct Recorder {
    commits: Mutex<Vec<(ChannelState, Vec<u64>)>>,
}

impl CommitSink for Recorder {
    fn committed(&self, _: &str, state: ChannelState, events: &[Arc<Event>]) {
        self.commits
            .lock()
            .push((state, events.iter().map(|e| e.seq).collect()));
    }
    fn evicted(&self, _: &str, _: ChannelState) {}
}

#[tokio::test]
async fn seqs_are_dense_batches_in_order_and_a_key_answers_the_original_seqs() {
    let redis = Redis::start().await;
    let sink = Arc::new(Recorder::default());
    let j = journal(&redis, Retention::default(), sink.clone());
    let a = j
        .append("c", vec![ev("a"), typed("t:x", "b"), ev("")], None)
        .await
        .expect("append");
    assert_eq!((a.first_seq, a.last_seq, a.duplicate), (1, 3, false));
    let k = j
        .append("c", vec![ev("d")], Some("k1"))
        .await
        .expect("append");
    assert_eq!((k.first_seq, k.last_seq, k.duplicate), (4, 4, false));
    let again = j
        .append("c", vec![ev("other")], Some("k1"))
        .await
        .expect("append");
    assert_eq!(
        (again.first_seq, again.last_seq, again.duplicate),
        (4, 4, true)
    );
    assert_eq!(again.epoch, a.epoch);

    let page = j.read("c", 0, 100).await.expect("read");
    assert_eq!(
        page.state,
        ChannelState {
            epoch: a.epoch,
            floor: 1,
            head: 4
        }
    );
    let got: Vec<(u64, Option<&str>, &str)> = page
        .events
        .iter()
        .map(|e| (e.seq, e.event_type.as_deref(), e.data.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (1, None, "a"),
            (2, Some("t:x"), "b"),
            (3, None, ""),
            (4, None, "d")
        ]
    );
    assert!(page.events.windows(2).all(|w| w[0].time <= w[1].time));
    // bounded reads: at least one event, stop past the byte budget
    let page = j.read_bounded("c", 0, 100, 0).await.expect("read");
    assert_eq!(page.events.len(), 1);
    // the sink saw each commit once, in order (the duplicate not at all)
    let commits = sink.commits.lock().clone();
    assert_eq!(
        commits.iter().map(|c| c.1.clone()).collect::<Vec<_>>(),
        [vec![1, 2, 3], vec![4]]
    );
    // a channel never written to has an empty state, and keeps its epoch
    let s1 = j.state("never").await.expect("state");
    assert_eq!((s1.floor, s1.head), (1, 0));
    assert_eq!(j.state("never").await.expect("state").epoch, s1.epoch);
}

#[tokio::test]
async fn retention_by_count_keeps_the_newest_and_forgets_their_keys() {
    let redis = Redis::start().await;
    let retention = Retention {
        max_events: 3,
        max_age_ms: 0,
    };
    let j = journal(&redis, retention, Arc::new(NoSink));
    j.append("c", vec![ev("1")], Some("first"))
        .await
        .expect("append");
    j.append("c", vec![ev("2"), ev("3"), ev("4"), ev("5")], None)
        .await
        .expect("append");
    let st = j.state("c").await.expect("state");
    assert_eq!((st.floor, st.head), (3, 5));
    let page = j.read("c", 0, 10).await.expect("read");
    assert_eq!(
        page.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [3, 4, 5]
    );
    // the key named an evicted event: it is forgotten with it
    let again = j
        .append("c", vec![ev("1 again")], Some("first"))
        .await
        .expect("append");
    assert_eq!((again.first_seq, again.duplicate), (6, false));
    // nothing of the evicted events is left in the hash
    let fields = redis.cli(&["HLEN", "gapless:{c}"]).await;
    // epoch floor head time lin, events 4 to 6, the node's token of the
    // batch ending at 5 (`k <token>`, i5), and the key of 6 with its request
    // token (`kfirst`, `rfirst`, i6)
    assert_eq!(
        fields,
        "13",
        "{}",
        redis.cli(&["HKEYS", "gapless:{c}"]).await
    );
}

/// The append script run directly, as a node sends it again after its
/// connection was closed under the first send (`conn.rs`): `(first, last,
/// duplicate, own)` and the channel's head.
fn append_raw(con: &mut redis::Connection, key_arg: &str, data: &str) -> (i64, i64, i64, i64) {
    let v: Vec<redis::Value> = redis::Script::new(&gapless_redis::append_script())
        .key("gapless:{raw}")
        .arg("raw")
        .arg(key_arg)
        .arg(2)
        .arg(0)
        .arg("777")
        .arg(gapless_redis::BUS_CHANNEL)
        .arg(4096)
        .arg("")
        .arg(format!("n{data}"))
        .invoke(con)
        .expect("append script");
    let int = |i: usize| match &v[i] {
        redis::Value::Int(n) => *n,
        other => panic!("field {i} of {v:?} is not an integer: {other:?}"),
    };
    (int(1), int(2), int(3), int(9))
}

#[tokio::test]
async fn an_append_sent_twice_lands_once_and_is_told_it_was_its_own() {
    let redis = Redis::start().await;
    let client = redis::Client::open(format!("redis://127.0.0.1:{}", redis.port)).expect("url");
    let mut con = client.get_connection().expect("connect");
    // No client key: the node's token is the key; the second send is its own.
    assert_eq!(append_raw(&mut con, " tokA", "a"), (1, 1, 0, 0));
    assert_eq!(append_raw(&mut con, " tokA", "a"), (1, 1, 1, 1));
    // A client key with the request's token: the same request again is its
    // own; another request with the same key is a duplicate.
    assert_eq!(append_raw(&mut con, "K\ntokB", "b"), (2, 2, 0, 0));
    assert_eq!(append_raw(&mut con, "K\ntokB", "b"), (2, 2, 1, 1));
    assert_eq!(append_raw(&mut con, "K\ntokC", "b"), (2, 2, 1, 0));
    // The forms of older nodes: a key alone is a duplicate, never "own".
    assert_eq!(append_raw(&mut con, "K", "b"), (2, 2, 1, 0));
    assert_eq!(append_raw(&mut con, "", "c"), (3, 3, 0, 0));
    assert_eq!(append_raw(&mut con, "", "d"), (4, 4, 0, 0));
    assert_eq!(redis.cli(&["HGET", "gapless:{raw}", "head"]).await, "4");
    // Retention (2 events here) forgets a token, and a key's request token,
    // with their events: 1 and 2 are gone, so are ` tokA`, `K`, `rK`.
    let keys = redis.cli(&["HKEYS", "gapless:{raw}"]).await;
    assert!(keys.lines().any(|k| k == "e3"), "{keys}");
    for gone in ["k tokA", "kK", "rK", "e1", "e2", "i1", "i2"] {
        assert!(!keys.lines().any(|k| k == gone), "{gone} is left: {keys}");
    }
}

#[tokio::test]
async fn retention_by_age_raises_the_floor() {
    let redis = Redis::start().await;
    let retention = Retention {
        max_events: 100,
        max_age_ms: 300,
    };
    let j = journal(&redis, retention, Arc::new(NoSink));
    j.append("c", vec![ev("old1"), ev("old2")], None)
        .await
        .expect("append");
    tokio::time::sleep(Duration::from_millis(450)).await;
    j.append("c", vec![ev("new")], None).await.expect("append");
    let st = j.state("c").await.expect("state");
    assert_eq!((st.floor, st.head), (3, 3));
    tokio::time::sleep(Duration::from_millis(450)).await;
    let st = j.state("c").await.expect("state");
    assert_eq!(
        (st.floor, st.head),
        (4, 3),
        "everything expired: floor = head + 1"
    );
}

#[tokio::test]
async fn a_wiped_redis_is_a_new_epoch_starting_over() {
    let redis = Redis::start().await;
    let j = journal(&redis, Retention::default(), Arc::new(NoSink));
    let a = j
        .append("c", vec![ev("x"), ev("y")], None)
        .await
        .expect("append");
    redis.cli(&["FLUSHALL"]).await;
    let st = j.state("c").await.expect("state");
    assert_ne!(st.epoch, a.epoch);
    assert_eq!((st.floor, st.head), (1, 0));
    let b = j.append("c", vec![ev("z")], None).await.expect("append");
    assert_eq!((b.epoch, b.first_seq), (st.epoch, 1));
}

#[tokio::test]
async fn an_out_of_memory_redis_refuses_a_batch_whole() {
    let redis = Redis::start().await;
    let j = journal(&redis, Retention::default(), Arc::new(NoSink));
    j.append("c", vec![ev("before")], None)
        .await
        .expect("append");
    redis.cli(&["CONFIG", "SET", "maxmemory", "1"]).await;
    let r = j.append("c", vec![ev("a"), ev("b"), ev("c")], None).await;
    assert!(matches!(r, Err(JournalError::Storage(_))), "{r:?}");
    redis.cli(&["CONFIG", "SET", "maxmemory", "0"]).await;
    let st = j.state("c").await.expect("state");
    assert_eq!(st.head, 1, "nothing of the refused batch");
    assert_eq!(
        j.append("c", vec![ev("after")], None)
            .await
            .expect("append")
            .first_seq,
        2
    );
}

#[tokio::test]
async fn an_unreachable_redis_answers_unavailable_within_the_timeout() {
    let mut redis = Redis::start().await;
    let j = journal(&redis, Retention::default(), Arc::new(NoSink));
    assert!(j.ready().await.is_ok());
    redis.kill9().await;
    let t0 = Instant::now();
    let r = j.append("c", vec![ev("x")], None).await;
    assert!(matches!(r, Err(JournalError::Unavailable(_))), "{r:?}");
    assert!(matches!(j.ready().await, Err(JournalError::Unavailable(_))));
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t0.elapsed()
    );
}

#[tokio::test]
async fn a_session_journal_takes_nothing_after_its_end_marker() {
    let redis = Redis::start().await;
    let j = journal(&redis, Retention::default(), Arc::new(NoSink));
    let ch = "session/s1";
    j.append(ch, vec![typed("gapless.session.opened", "")], None)
        .await
        .expect("append");
    j.append(ch, vec![ev("work")], Some("k"))
        .await
        .expect("append");
    j.append(ch, vec![typed("gapless.session.completed", "")], None)
        .await
        .expect("append");
    let late = j.append(ch, vec![ev("late")], None).await;
    assert!(
        matches!(late, Err(JournalError::Storage(ref m)) if m.contains("has ended")),
        "{late:?}"
    );
    // a retry of an append made before the end still answers its seq
    let retry = j
        .append(ch, vec![ev("work")], Some("k"))
        .await
        .expect("retry");
    assert_eq!((retry.first_seq, retry.duplicate), (2, true));
    assert_eq!(j.state(ch).await.expect("state").head, 3);
    // other channels are not affected by such types
    j.append("plain", vec![typed("gapless.session.completed", "")], None)
        .await
        .expect("append");
    j.append("plain", vec![ev("after")], None)
        .await
        .expect("append");
}
