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
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The Redis journal on `redis`, with a 500 ms timeout.
fn journal(redis: &Redis, retention: Retention, sink: Arc<dyn CommitSink>) -> RedisJournal {
    RedisJournal::open(
        RedisOptions {
            url: redis.url(),
            namespaces: Arc::new(retention.into()),
            timeout_ms: 500,
            ..RedisOptions::default()
        },
        sink,
    )
    .expect("open")
}

/// Blocking looks into the testkit's Redis, for these tests' closures.
trait Inspect {
    /// Runs `redis-cli -p PORT args…` and returns its output, trimmed.
    fn run(&self, args: &[&str]) -> String;
    /// A blocking connection.
    fn con(&self) -> redis::Connection;
    /// The field names of `channel`'s hash.
    fn fields(&self, channel: &str) -> Vec<String>;
    /// `MEMORY USAGE` of `channel`'s hash, every field sampled.
    fn memory(&self, channel: &str) -> u64;
}

fn ev(data: &str) -> NewEvent {
    NewEvent {
        event_type: None,
        data: data.into(),
    }
}

fn typed(t: &str, data: &str) -> NewEvent {
    NewEvent {
        event_type: Some(t.to_owned()),
        data: data.into(),
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
        .map(|e| {
            (
                e.seq,
                e.event_type.as_deref(),
                e.data.as_text().unwrap_or_default(),
            )
        })
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
        max_bytes: 0,
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
    let fields = redis.run(&["HLEN", "gapless:{c}"]);
    // epoch floor head time lin tok, events 4 to 6, the node's token of the
    // batch ending at 5 (`k <token>`, i5), and the key of 6 with its request
    // token (`kfirst`, `rfirst`, i6)
    assert_eq!(fields, "14", "{}", redis.run(&["HKEYS", "gapless:{c}"]));
}

/// The append script run directly, as a node sends it again after its
/// connection was closed under the first send (`conn.rs`): `(first, last,
/// duplicate, own)`. Channel `raw`, retention 2 events, token lifetime 60 s.
fn append_raw(con: &mut redis::Connection, key_arg: &str, data: &str) -> (i64, i64, i64, i64) {
    append_to(con, "raw", 2, 60_000, key_arg, &[data])
}

/// The append script run directly on `channel`: retention `max_events`,
/// token lifetime `life` ms, one event per item of `data`.
fn append_to(
    con: &mut redis::Connection,
    channel: &str,
    max_events: u64,
    life: u64,
    key_arg: &str,
    data: &[&str],
) -> (i64, i64, i64, i64) {
    let script = redis::Script::new(&gapless_redis::append_script());
    let mut inv = script.prepare_invoke();
    inv.key(format!("gapless:{{{channel}}}"))
        .arg(channel)
        .arg(key_arg)
        .arg(max_events)
        .arg(0)
        .arg("777")
        .arg(gapless_redis::BUS_CHANNEL)
        .arg(4096)
        .arg("")
        .arg(life)
        .arg(0);
    for d in data {
        inv.arg(format!("n{d}"));
    }
    let v: Vec<redis::Value> = inv.invoke(con).expect("append script");
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
    assert_eq!(redis.run(&["HGET", "gapless:{raw}", "head"]), "4");
    // Retention (2 events here) forgets a token, and a key's request token,
    // with their events: 1 and 2 are gone, so are ` tokA`, `K`, `rK`.
    let keys = redis.run(&["HKEYS", "gapless:{raw}"]);
    assert!(keys.lines().any(|k| k == "e3"), "{keys}");
    for gone in ["k tokA", "kK", "rK", "e1", "e2", "i1", "i2"] {
        assert!(!keys.lines().any(|k| k == gone), "{gone} is left: {keys}");
    }
}

impl Inspect for Redis {
    fn run(&self, args: &[&str]) -> String {
        Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    }

    fn con(&self) -> redis::Connection {
        redis::Client::open(format!("redis://127.0.0.1:{}", self.port))
            .and_then(|c| c.get_connection())
            .expect("connect")
    }

    fn fields(&self, channel: &str) -> Vec<String> {
        self.run(&["HKEYS", &format!("gapless:{{{channel}}}")])
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn memory(&self, channel: &str) -> u64 {
        let m = self.run(&[
            "MEMORY",
            "USAGE",
            &format!("gapless:{{{channel}}}"),
            "SAMPLES",
            "0",
        ]);
        m.parse().unwrap_or_else(|_| panic!("MEMORY USAGE: {m:?}"))
    }
}

fn has(fields: &[String], f: &str) -> bool {
    fields.iter().any(|x| x == f)
}

#[tokio::test]
async fn tokens_are_forgotten_after_their_lifetime_and_a_resend_within_it_lands_once() {
    let redis = Redis::start().await;
    let mut con = redis.con();
    let life = 600;
    let mut send = |key: &str, data: &str| append_to(&mut con, "t", 1000, life, key, &[data]);
    assert_eq!(send(" tokA", "a"), (1, 1, 0, 0));
    assert_eq!(send("K\ntokB", "b"), (2, 2, 0, 0));
    // Sent again within the lifetime: each lands once, answered as its own.
    assert_eq!(send(" tokA", "a"), (1, 1, 1, 1));
    assert_eq!(send("K\ntokB", "b"), (2, 2, 1, 1));
    let f = redis.fields("t");
    for kept in ["k tokA", "i1", "kK", "rK", "i2"] {
        assert!(has(&f, kept), "{kept} is gone: {f:?}");
    }
    tokio::time::sleep(Duration::from_millis(life + 300)).await;
    // The next append forgets the tokens older than the lifetime: the node's
    // token whole, only the request token of the client's key.
    assert_eq!(send(" tokC", "c"), (3, 3, 0, 0));
    let f = redis.fields("t");
    for gone in ["k tokA", "i1", "rK"] {
        assert!(!has(&f, gone), "{gone} is left: {f:?}");
    }
    for kept in ["kK", "i2", "k tokC", "i3", "e1", "e2", "e3", "tok"] {
        assert!(has(&f, kept), "{kept} is gone: {f:?}");
    }
    // The young token still answers its resend; the client's key still
    // answers the client's retry (a duplicate now: its request token is gone).
    assert_eq!(send(" tokC", "c"), (3, 3, 1, 1));
    assert_eq!(send("K\ntokB", "b"), (2, 2, 1, 0));
    assert_eq!(send("K\ntokD", "b"), (2, 2, 1, 0));
    // Past the lifetime a resend is no longer recognised (which is why the
    // lifetime is far longer than any resend window).
    assert_eq!(send(" tokA", "a"), (4, 4, 0, 0));
    assert_eq!(redis.run(&["HGET", "gapless:{t}", "head"]), "4");
}

#[tokio::test]
async fn a_lifetime_asked_for_holds_for_its_tokens_whatever_others_ask() {
    let redis = Redis::start().await;
    let mut con = redis.con();
    let mut send = |life: u64, key: &str| append_to(&mut con, "m", 1000, life, key, &["x"]);
    // t = 0: a node with a long timeout asks 3 s for its token.
    assert_eq!(send(3000, " a"), (1, 1, 0, 0));
    // t = 1.5 s: another asks 2.5 s (its token must live until t = 4 s).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(send(2500, " b"), (2, 2, 0, 0));
    // t = 3.5 s: one asking 200 ms forgets `a` (3.5 s old) but not `b`
    // (2 s old), though both are older than 200 ms and 3 s have passed.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(send(200, " c"), (3, 3, 0, 0));
    let f = redis.fields("m");
    assert!(!has(&f, "k a") && has(&f, "k b"), "{f:?}");
    assert_eq!(send(200, " b"), (2, 2, 1, 1), "b resent within its 2.5 s");
    // t = 4.5 s: every token is past what its append asked for; the 200 ms
    // of the newest ones take over.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(send(200, " d"), (4, 4, 0, 0));
    let f = redis.fields("m");
    for gone in ["k a", "k b", "k c", "i1", "i2", "i3"] {
        assert!(!has(&f, gone), "{gone} is left: {f:?}");
    }
    assert!(has(&f, "k d"), "{f:?}");
}

#[tokio::test]
async fn batches_larger_than_the_step_budget_still_have_their_tokens_forgotten() {
    let redis = Redis::start().await;
    let mut con = redis.con();
    let batch: Vec<String> = (0..50).map(|i| format!("e{i}")).collect();
    let batch: Vec<&str> = batch.iter().map(String::as_str).collect();
    for i in 0..20 {
        let key = format!(" b{i}");
        let a = append_to(&mut con, "b", 100_000, 300, &key, &batch);
        assert_eq!((a.0, a.1), (i * 50 + 1, i * 50 + 50));
        if i == 9 {
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
    }
    // Batches 0-9 aged out before batch 10: each later batch of 50 walks up
    // to 108 seqs, so the walk has caught up with them...
    let f = redis.fields("b");
    for i in 0..10 {
        assert!(!has(&f, &format!("k b{i}")), "b{i} is left");
    }
    // ...and the young tokens are all kept.
    for i in 10..20 {
        assert!(has(&f, &format!("k b{i}")), "b{i} is gone");
    }
    // The boundary between old and young tokens found by bisection. At t =
    // 0, 20 appends ask 1 s; at 0.6 s one more; at 1.1 s, 9 appends that
    // forget nothing themselves (lifetime 0), then a batch walks past all:
    // the first 20 are older than 1 s, the rest younger.
    for i in 0..20 {
        append_to(&mut con, "s", 100_000, 1000, &format!(" s{i}"), &["x"]);
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    append_to(&mut con, "s", 100_000, 1000, " s20", &["x"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 21..30 {
        append_to(&mut con, "s", 100_000, 0, &format!(" s{i}"), &["x"]);
    }
    append_to(&mut con, "s", 100_000, 300, " last", &batch[..20]);
    let f = redis.fields("s");
    for i in 0..30 {
        assert_eq!(has(&f, &format!("k s{i}")), i >= 20, "s{i}: {f:?}");
    }
    assert_eq!(
        redis.run(&["HGET", "gapless:{s}", "tok"]).split(':').next(),
        Some("21")
    );
}

/// Redis memory per event of 1000 single-event appends of 50-byte events in
/// one channel (`MEMORY USAGE`): without tokens, with tokens kept as long as
/// their events (as before the token lifetime), and with a 100 ms lifetime
/// while appends come at most one a millisecond (at most 100 tokens live at
/// any time; the rest aged out), measured once the last ones aged out too.
/// Prints the figures (docs/cluster.md quotes them).
#[tokio::test]
async fn the_memory_per_event_returns_to_the_figure_without_tokens_once_tokens_age_out() {
    let redis = Redis::start().await;
    let mut con = redis.con();
    let data = "x".repeat(50);
    let n = 1000u64;
    let per_event = |ch: &str, events: u64| redis.memory(ch) as f64 / events as f64;
    let node_key = |i: u64| format!(" {i:022}");
    let client_key = |i: u64| format!("order-{i:08}\n{i:022}");
    let mut fill = |ch: &str, life: u64, key: &dyn Fn(u64) -> String| {
        for i in 0..n {
            append_to(&mut con, ch, 1_000_000, life, &key(i), &[&data]);
            if life > 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if life > 0 {
            // the last ones age out too; then appends without a token of
            // their own (as the benchmark sends) forget them, 10 seqs each
            std::thread::sleep(Duration::from_millis(life + 50));
            for _ in 0..12 {
                append_to(&mut con, ch, 1_000_000, life, "", &[&data]);
            }
        }
    };
    fill("plain", 0, &|_| String::new());
    fill("kept", 0, &node_key);
    fill("aged", 100, &node_key);
    fill("keyed", 0, &client_key);
    fill("keyed-aged", 100, &client_key);
    let plain = per_event("plain", n);
    let kept = per_event("kept", n);
    let aged = per_event("aged", n + 12);
    let keyed = per_event("keyed", n);
    let keyed_aged = per_event("keyed-aged", n + 12);
    println!(
        "bytes per event: no tokens {plain:.0}; node tokens kept {kept:.0}, aged out {aged:.0}; \
         client keys with tokens kept {keyed:.0}, aged out {keyed_aged:.0}"
    );
    let f = redis.fields("aged");
    assert!(!f.iter().any(|x| x.starts_with("k ")), "tokens are left");
    let f = redis.fields("keyed-aged");
    assert!(
        !f.iter().any(|x| x.starts_with('r')),
        "request tokens are left"
    );
    assert_eq!(f.iter().filter(|x| x.starts_with('k')).count() as u64, n);
    assert!(
        kept > plain + 100.0,
        "tokens cost memory: {kept} vs {plain}"
    );
    assert!(
        aged < plain + 25.0,
        "aged-out tokens leave {aged} bytes per event, {plain} without"
    );
    assert!(keyed_aged < keyed - 40.0, "{keyed_aged} vs {keyed}");
}

#[tokio::test]
async fn a_node_forgets_its_request_tokens_after_the_token_lifetime() {
    let redis = Redis::start().await;
    let j = RedisJournal::open(
        RedisOptions {
            url: format!("redis://127.0.0.1:{}", redis.port),
            timeout_ms: 500,
            token_lifetime_ms: Some(300),
            ..RedisOptions::default()
        },
        Arc::new(NoSink),
    )
    .expect("open");
    j.append("c", vec![ev("a")], None).await.expect("append");
    j.append("c", vec![ev("b")], Some("K"))
        .await
        .expect("append");
    let f = redis.fields("c");
    assert_eq!(f.iter().filter(|x| x.starts_with("k ")).count(), 1, "{f:?}");
    assert!(has(&f, "rK"), "{f:?}");
    tokio::time::sleep(Duration::from_millis(450)).await;
    j.append("c", vec![ev("c")], None).await.expect("append");
    let f = redis.fields("c");
    // only the token of the newest append is left; the client's key stays
    assert_eq!(f.iter().filter(|x| x.starts_with("k ")).count(), 1, "{f:?}");
    assert!(has(&f, "i3") && !has(&f, "i1") && !has(&f, "rK"), "{f:?}");
    assert!(has(&f, "kK") && has(&f, "i2"), "{f:?}");
    let again = j
        .append("c", vec![ev("b")], Some("K"))
        .await
        .expect("retry");
    assert_eq!((again.first_seq, again.duplicate), (2, true));
    // Left alone past the lifetime, the channel's last tokens go at the next
    // script that loads it (here a state read, as a node's poll).
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(j.state("c").await.expect("state").head, 3);
    let f = redis.fields("c");
    assert!(!f.iter().any(|x| x.starts_with("k ")), "{f:?}");
    assert!(has(&f, "kK") && !has(&f, "i3"), "{f:?}");
    assert_eq!(
        redis.run(&["HGET", "gapless:{c}", "tok"]).split(':').next(),
        Some("4")
    );
    // the default lifetime: 60 s, or 4 timeouts when longer
    let o = RedisOptions::default();
    assert_eq!(o.token_lifetime(), 60_000);
    let o = RedisOptions {
        timeout_ms: 30_000,
        ..RedisOptions::default()
    };
    assert_eq!(o.token_lifetime(), 120_000);
}

#[tokio::test]
async fn retention_by_age_raises_the_floor() {
    let redis = Redis::start().await;
    let retention = Retention {
        max_events: 100,
        max_age_ms: 300,
        max_bytes: 0,
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
    redis.run(&["FLUSHALL"]);
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
    redis.run(&["CONFIG", "SET", "maxmemory", "1"]);
    let r = j.append("c", vec![ev("a"), ev("b"), ev("c")], None).await;
    assert!(matches!(r, Err(JournalError::Storage(_))), "{r:?}");
    redis.run(&["CONFIG", "SET", "maxmemory", "0"]);
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
