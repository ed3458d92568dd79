//! Channel metadata in the Redis journal across nodes: two `RedisJournal`s
//! on one `redis-server` are two nodes of a cluster. A change on one is
//! read by the other and announced to its sink; producers racing from both
//! are exact; a Redis that lost its data refuses the old incarnation on
//! both; a plain append racing a close never lands after it.

use gapless_core::journal::{ChannelState, CommitSink, Journal, JournalError};
use gapless_core::meta::{Change, ChannelMeta, Guard, Outcome, ProducerTuple, Refusal};
use gapless_protocol::{Event, NewEvent};
use gapless_redis::{RedisJournal, RedisOptions};
use gapless_testkit::redis::Redis;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A sink that follows every channel and records the metadata notices.
#[derive(Default)]
struct Sink {
    metas: Mutex<Vec<String>>,
}

impl CommitSink for Sink {
    fn committed(&self, _: &str, _: ChannelState, _: &[Arc<Event>]) {}
    fn evicted(&self, _: &str, _: ChannelState) {}
    fn meta_changed(&self, channel: &str) {
        self.metas.lock().push(channel.to_owned());
    }
}

/// A node on `redis` with its sink.
fn node(redis: &Redis) -> (Arc<RedisJournal>, Arc<Sink>) {
    let sink = Arc::new(Sink::default());
    let j = RedisJournal::open(
        RedisOptions {
            url: redis.url(),
            ..RedisOptions::default()
        },
        sink.clone(),
    )
    .expect("open");
    (Arc::new(j), sink)
}

fn ev(data: &str) -> NewEvent {
    NewEvent {
        event_type: None,
        data: data.into(),
    }
}

fn new_meta(incarnation: u64) -> ChannelMeta {
    ChannelMeta::new(incarnation, "text/plain".into(), 1)
}

fn producer(inc: u64, id: &str, seq: u64, close: bool) -> Change {
    Change::Append {
        guard: Guard {
            incarnation: inc,
            producer: Some(ProducerTuple {
                id: id.to_owned(),
                epoch: 0,
                seq,
            }),
            stream_seq: None,
            close,
        },
        events: vec![ev(&format!("{id}:{seq}"))],
        key: Some(format!("p/{inc}/{id}/0/{seq}")),
    }
}

async fn create(j: &RedisJournal, channel: &str, inc: u64) {
    let c = j
        .change(
            channel,
            Change::Create {
                meta: new_meta(inc),
                events: Vec::new(),
            },
        )
        .await
        .expect("create");
    assert_eq!(c.outcome, Outcome::Created(None));
}

/// Waits up to 5 s for `done`.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < Duration::from_secs(5), "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_change_on_one_node_is_read_and_announced_on_the_other() {
    let Some(redis) = Redis::start_or_skip("meta two nodes").await else {
        return;
    };
    let (a, sink_a) = node(&redis);
    let (b, sink_b) = node(&redis);
    // B reads (and caches) the channel before A creates it.
    assert_eq!(b.meta("s").await.expect("meta").0, None);
    // Let B's bus subscription settle so its notice is not missed.
    tokio::time::sleep(Duration::from_millis(200)).await;
    create(&a, "s", 7).await;
    assert_eq!(
        *sink_a.metas.lock(),
        ["s"],
        "the node that changed it is told once"
    );
    eventually("B's sink hears of A's change", || {
        sink_b.metas.lock().iter().any(|c| c == "s")
    })
    .await;
    let (m, st) = b.meta("s").await.expect("meta");
    assert_eq!(m.map(|m| m.incarnation), Some(7));
    assert_eq!(st.head, 0);
    // B appends on it with its own (refreshed) view, and A reads that.
    let c = b
        .change("s", producer(7, "p", 0, false))
        .await
        .expect("append");
    assert!(
        matches!(c.outcome, Outcome::Appended(Some(_))),
        "{:?}",
        c.outcome
    );
    let (m, st) = a.meta("s").await.expect("meta");
    assert_eq!(m.and_then(|m| m.producers.get("p").copied()), Some((0, 0)));
    assert_eq!(st.head, 1);
    // A, whose cache is older than B's change, still decides right.
    let c = a
        .change("s", producer(7, "p", 1, false))
        .await
        .expect("append");
    assert!(
        matches!(c.outcome, Outcome::Appended(Some(_))),
        "{:?}",
        c.outcome
    );
    assert_eq!(
        b.change("s", producer(7, "p", 1, false))
            .await
            .expect("retry")
            .outcome,
        Outcome::Duplicate(1),
        "a retry on the other node is a duplicate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn producers_racing_from_two_nodes_are_exact() {
    let Some(redis) = Redis::start_or_skip("meta racing nodes").await else {
        return;
    };
    let (a, _) = node(&redis);
    let (b, _) = node(&redis);
    create(&a, "s", 9).await;
    let mut tasks = Vec::new();
    for p in 0..6 {
        let j = if p % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            let id = format!("p{p}");
            for seq in 0..20u64 {
                let c = j.change("s", producer(9, &id, seq, false)).await?;
                assert!(
                    matches!(c.outcome, Outcome::Appended(Some(_))),
                    "{id} {seq}: {:?}",
                    c.outcome
                );
            }
            Ok::<_, JournalError>(())
        }));
    }
    for t in tasks {
        t.await.expect("task").expect("changes");
    }
    let page = a.read("s", 0, 1000).await.expect("read");
    assert_eq!(page.events.len(), 120, "every append once");
    let (m, _) = b.meta("s").await.expect("meta");
    let m = m.expect("metadata");
    for p in 0..6 {
        let id = format!("p{p}:");
        let mine: Vec<String> = page
            .events
            .iter()
            .map(|e| e.data.wire().into_owned())
            .filter(|d| d.starts_with(&id))
            .collect();
        let want: Vec<String> = (0..20).map(|s| format!("{id}{s}")).collect();
        assert_eq!(mine, want, "each producer in order");
        assert_eq!(m.producers.get(&format!("p{p}")), Some(&(0, 19)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_that_lost_its_data_refuses_the_old_incarnation_on_every_node() {
    let Some(redis) = Redis::start_or_skip("meta data loss").await else {
        return;
    };
    let (a, _) = node(&redis);
    let (b, _) = node(&redis);
    create(&a, "s", 11).await;
    // Both nodes have the incarnation cached, with producer state.
    a.change("s", producer(11, "p", 0, false)).await.expect("a");
    b.change("s", producer(11, "p", 1, false)).await.expect("b");
    a.change("s", producer(11, "q", 0, false)).await.expect("a");
    redis.cli(&["FLUSHALL"]).await;
    for (name, j, seq) in [("A", &a, 2), ("B", &b, 2)] {
        let c = j
            .change("s", producer(11, "p", seq, false))
            .await
            .expect("change");
        assert_eq!(
            c.outcome,
            Outcome::Refused(Refusal::NotFound),
            "node {name}"
        );
        // Not a duplicate from a stale cache either.
        let c = j
            .change("s", producer(11, "p", 0, false))
            .await
            .expect("retry");
        assert_eq!(
            c.outcome,
            Outcome::Refused(Refusal::NotFound),
            "node {name}"
        );
        assert_eq!(j.meta("s").await.expect("meta").0, None, "node {name}");
    }
    assert_eq!(
        a.state("s").await.expect("state").head,
        0,
        "nothing appended"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plain_append_racing_a_close_never_lands_after_it() {
    let Some(redis) = Redis::start_or_skip("meta close race").await else {
        return;
    };
    let (a, _) = node(&redis);
    let (b, _) = node(&redis);
    for round in 0..5u64 {
        let channel = format!("s{round}");
        let inc = 100 + round;
        create(&a, &channel, inc).await;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut writers = Vec::new();
        for w in 0..4 {
            let (j, stop, channel) = (
                if w % 2 == 0 { a.clone() } else { b.clone() },
                stop.clone(),
                channel.clone(),
            );
            writers.push(tokio::spawn(async move {
                let mut landed = Vec::new();
                let mut refused = false;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match j.append(&channel, vec![ev("plain")], None).await {
                        Ok(app) => {
                            assert!(!refused, "an append landed after one was refused as closed");
                            landed.push(app.last_seq);
                        }
                        Err(JournalError::ChannelClosed) => refused = true,
                        Err(e) => panic!("append: {e}"),
                    }
                }
                (landed, refused)
            }));
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        let c = a
            .change(&channel, producer(inc, "p", 0, true))
            .await
            .expect("close");
        let Outcome::Appended(Some(closing)) = c.outcome else {
            panic!("not closed: {:?}", c.outcome)
        };
        assert!(c.meta.as_ref().is_some_and(|m| m.is_closed()));
        tokio::time::sleep(Duration::from_millis(30)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut refusals = 0;
        for w in writers {
            let (landed, refused) = w.await.expect("writer");
            for seq in landed {
                assert!(
                    seq < closing.last_seq,
                    "{seq} landed after the close at {}",
                    closing.last_seq
                );
            }
            refusals += usize::from(refused);
        }
        assert_eq!(refusals, 4, "every writer was refused after the close");
        let st = b.state(&channel).await.expect("state");
        assert_eq!(st.head, closing.last_seq, "the closing event is the last");
    }
}
