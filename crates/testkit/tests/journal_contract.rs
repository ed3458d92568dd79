//! The journal contract (`gapless_core::journal`), one suite over
//! `dyn Journal` run against every implementation alike: the memory journal
//! (`gapless_core::MemoryJournal`), the embedded store
//! (`gapless_store::EmbeddedJournal`, on its own temporary directory) and the
//! Redis journal (`gapless_redis::RedisJournal`, on a `redis-server` the
//! testkit starts for each test; without `redis-server` those tests print
//! `SKIP` and pass).
//!
//! Each contract is one `async fn` taking a [`Fixture`]; [`contract!`] makes
//! a module per contract with one test per journal (`dense_seqs::memory`,
//! `dense_seqs::embedded`, `dense_seqs::redis`). What only one journal does
//! (the store's reopen and checkpoints, Redis's scripts and outages) is
//! tested in that journal's crate.

use gapless_core::journal::{
    now_ms, Appended, ChannelState, CommitSink, Journal, JournalError, NoSink, Retention,
};
use gapless_core::memory::MemoryJournal;
use gapless_core::meta::{Change, ChannelMeta, Guard, Outcome, ProducerTuple, Refusal};
use gapless_core::namespace::{Namespaces, Policy, Table};
use gapless_core::Page;
use gapless_protocol::{Event, NewEvent, Payload};
use gapless_redis::{RedisJournal, RedisOptions};
use gapless_store::{Durability, EmbeddedJournal, StoreOptions};
use gapless_testkit::redis::Redis;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tempfile::TempDir;

type R = Result<(), JournalError>;

/// Which implementation a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Memory,
    Embedded,
    Redis,
}

/// Opens journals of one kind (each its own store: a fresh directory, or
/// the test's own `redis-server`).
struct Fixture {
    kind: Kind,
    redis: Option<Redis>,
    dirs: Mutex<Vec<TempDir>>,
}

impl Fixture {
    /// A journal with `retention` and a fresh recording sink.
    fn open(&self, retention: Retention) -> (Arc<dyn Journal>, Arc<Recorder>) {
        self.open_ns(retention.into())
    }

    /// A journal where each channel has its namespace's retention, and a
    /// fresh recording sink.
    fn open_ns(&self, namespaces: Namespaces) -> (Arc<dyn Journal>, Arc<Recorder>) {
        let rec = Arc::new(Recorder::default());
        let sink: Arc<dyn CommitSink> = rec.clone();
        let namespaces = Arc::new(namespaces);
        let journal: Arc<dyn Journal> = match self.kind {
            Kind::Memory => Arc::new(MemoryJournal::with_namespaces(namespaces, sink)),
            Kind::Embedded => {
                let dir = tempfile::tempdir().expect("tempdir");
                let j = EmbeddedJournal::open(dir.path(), store_options(namespaces), sink)
                    .expect("open the store");
                self.dirs.lock().expect("lock").push(dir);
                Arc::new(j)
            }
            Kind::Redis => {
                let redis = self.redis.as_ref().expect("a redis-server");
                let opts = RedisOptions {
                    url: redis.url(),
                    namespaces,
                    ..RedisOptions::default()
                };
                Arc::new(RedisJournal::open(opts, sink).expect("open the Redis journal"))
            }
        };
        (journal, rec)
    }

    /// A journal on the same store as the last one opened (the embedded
    /// store's directory, the Redis server), with `namespaces`: a restart
    /// with other settings. The last journal must be dropped first. `None`
    /// for the memory journal, which keeps nothing across a restart.
    fn reopen(&self, namespaces: Namespaces) -> Option<(Arc<dyn Journal>, Arc<Recorder>)> {
        let namespaces = Arc::new(namespaces);
        match self.kind {
            Kind::Memory => None,
            Kind::Embedded => {
                let rec = Arc::new(Recorder::default());
                let dirs = self.dirs.lock().expect("lock");
                let dir = dirs.last().expect("a store opened before");
                let j = EmbeddedJournal::open(dir.path(), store_options(namespaces), rec.clone())
                    .expect("reopen the store");
                Some((Arc::new(j), rec))
            }
            Kind::Redis => Some(self.open_ns(Arc::unwrap_or_clone(namespaces))),
        }
    }
}

fn store_options(namespaces: Arc<Namespaces>) -> StoreOptions {
    StoreOptions {
        namespaces,
        durability: Durability::Sync,
        min_free_bytes: 0,
        ..StoreOptions::default()
    }
}

/// Runs `test` against a fixture of `kind` (`None` from Redis: skipped).
async fn run<F, Fut>(kind: Kind, name: &str, test: F) -> R
where
    F: FnOnce(Fixture) -> Fut,
    Fut: Future<Output = R>,
{
    let redis = match kind {
        Kind::Redis => match Redis::start_or_skip(&format!("{name}::redis")).await {
            Some(r) => Some(r),
            None => return Ok(()),
        },
        _ => None,
    };
    let fixture = Fixture {
        kind,
        redis,
        dirs: Mutex::new(Vec::new()),
    };
    test(fixture).await
}

/// One module per contract, with a test per journal. `name: redis
/// ignored "why"` marks the Redis journal's test ignored: a known breach
/// of the contract, named in the reason (run it with `--ignored`).
macro_rules! contract {
    ($($name:ident $(: redis ignored $reason:literal)?),* $(,)?) => {
        $(
            mod $name {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn memory() -> R {
                    run(Kind::Memory, stringify!($name), super::$name).await
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn embedded() -> R {
                    run(Kind::Embedded, stringify!($name), super::$name).await
                }

                $(#[ignore = $reason])?
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn redis() -> R {
                    run(Kind::Redis, stringify!($name), super::$name).await
                }
            }
        )*
    };
}

contract!(
    dense_seqs,
    batches,
    times,
    idempotency,
    idempotency_racing,
    count_retention,
    byte_retention,
    namespace_retention,
    retention_lowered_across_restart,
    age_retention,
    age_zero,
    reads,
    bounded_reads,
    sink_order,
    close,
    reports,
    bytes,
    seek_times,
    seek_after_eviction,
    purge,
    purge_racing,
    meta_create,
    meta_guards,
    meta_closed,
    meta_in_order,
    meta_racing,
    meta_lifecycle,
    meta_reopen,
    meta_listing,
    meta_put,
);

// ---- the sink ----

/// One sink call.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Record {
    /// `committed(channel, state, events)`, with the events' seqs.
    Committed(String, ChannelState, Vec<u64>),
    /// `evicted(channel, state)`.
    Evicted(String, ChannelState),
    /// `meta_changed(channel)`.
    Meta(String),
}

/// A sink that records every call and follows every channel it was told of
/// (as the hub follows channels with subscribers).
#[derive(Default)]
struct Recorder {
    log: Mutex<Vec<Record>>,
}

impl Recorder {
    fn records(&self) -> Vec<Record> {
        self.log.lock().expect("lock").clone()
    }

    /// The last state the sink was told for `channel`.
    fn last_state(&self, channel: &str) -> Option<ChannelState> {
        self.records().iter().rev().find_map(|r| match r {
            Record::Committed(c, s, _) | Record::Evicted(c, s) if c == channel => Some(*s),
            _ => None,
        })
    }
}

impl CommitSink for Recorder {
    fn committed(&self, channel: &str, state: ChannelState, events: &[Arc<Event>]) {
        let seqs = events.iter().map(|e| e.seq).collect();
        let rec = Record::Committed(channel.to_owned(), state, seqs);
        self.log.lock().expect("lock").push(rec);
    }

    fn evicted(&self, channel: &str, state: ChannelState) {
        let rec = Record::Evicted(channel.to_owned(), state);
        self.log.lock().expect("lock").push(rec);
    }

    fn meta_changed(&self, channel: &str) {
        let rec = Record::Meta(channel.to_owned());
        self.log.lock().expect("lock").push(rec);
    }

    fn followed(&self) -> Vec<Arc<str>> {
        let mut names: Vec<Arc<str>> = Vec::new();
        for r in self.records() {
            let (Record::Committed(c, ..) | Record::Evicted(c, _) | Record::Meta(c)) = r;
            if !names.iter().any(|n| **n == *c) {
                names.push(Arc::from(c.as_str()));
            }
        }
        names
    }
}

// ---- helpers ----

fn ev(data: &str) -> NewEvent {
    NewEvent {
        event_type: None,
        data: data.into(),
    }
}

fn seqs(page: &Page) -> Vec<u64> {
    page.events.iter().map(|e| e.seq).collect()
}

fn keep(max_events: u64, max_age_ms: u64) -> Retention {
    Retention {
        max_events,
        max_age_ms,
        max_bytes: 0,
    }
}

/// Calls `evict_expired(now)` every 50 ms until `channel`'s floor is
/// `floor`; panics after `within`. Returns the state then.
async fn evict_until(
    j: &dyn Journal,
    channel: &str,
    floor: u64,
    within: Duration,
) -> Result<ChannelState, JournalError> {
    let t0 = Instant::now();
    loop {
        j.evict_expired(now_ms()).await?;
        let st = j.state(channel).await?;
        if st.floor == floor {
            return Ok(st);
        }
        assert!(
            t0.elapsed() < within,
            "{channel}: floor {} after {within:?}, expected {floor}",
            st.floor
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---- the contracts ----

/// Seqs are dense, from 1, per channel; a channel never published to has
/// the empty state; the epoch names the journal's incarnation.
async fn dense_seqs(f: Fixture) -> R {
    let (j, _) = f.open(Retention::default());
    let empty = j.state("a").await?;
    assert_eq!((empty.floor, empty.head), (1, 0));
    assert_ne!(empty.epoch.0, 0, "an epoch is never 0");
    assert_eq!(j.state("a").await?, empty, "reading keeps the state");
    for want in 1..=3 {
        let a = j.append("a", vec![ev("x")], None).await?;
        assert_eq!((a.first_seq, a.last_seq, a.duplicate), (want, want, false));
        assert_eq!(a.epoch, empty.epoch, "the epoch of the empty state");
    }
    let b = j.append("b", vec![ev("y")], None).await?;
    assert_eq!((b.first_seq, b.last_seq), (1, 1));
    let a = j.append("a", vec![ev("z")], None).await?;
    assert_eq!((a.first_seq, a.last_seq), (4, 4));
    let st = j.state("a").await?;
    assert_eq!((st.floor, st.head, st.epoch), (1, 4, a.epoch));
    Ok(())
}

/// A batch is appended atomically and in order, with one time, its types
/// and data as given.
async fn batches(f: Fixture) -> R {
    let (j, _) = f.open(Retention::default());
    let batch = vec![
        NewEvent {
            event_type: Some("t1".into()),
            data: "one".into(),
        },
        ev("two"),
        ev(""),
    ];
    let a = j.append("c", batch, None).await?;
    assert_eq!((a.first_seq, a.last_seq), (1, 3));
    let page = j.read("c", 0, 10).await?;
    assert_eq!(seqs(&page), [1, 2, 3]);
    let data: Vec<_> = page
        .events
        .iter()
        .map(|e| e.data.as_text().unwrap_or_default())
        .collect();
    assert_eq!(data, ["one", "two", ""]);
    assert_eq!(page.events[0].event_type.as_deref(), Some("t1"));
    assert_eq!(page.events[1].event_type, None);
    assert!(page.events.iter().all(|e| e.time == page.events[0].time));
    assert!(page
        .events
        .iter()
        .all(|e| &*e.channel == "c" && e.epoch == a.epoch));
    assert_eq!(page.state, j.state("c").await?);
    Ok(())
}

/// Event times never go backwards within a channel.
async fn times(f: Fixture) -> R {
    let (j, _) = f.open(Retention::default());
    for _ in 0..50 {
        j.append("t", vec![ev("x")], None).await?;
    }
    let page = j.read("t", 0, 100).await?;
    assert_eq!(page.events.len(), 50);
    assert!(page.events.windows(2).all(|w| w[0].time <= w[1].time));
    Ok(())
}

/// A key seen on a channel answers the original seqs, appends nothing and
/// reports nothing to the sink; keys are per channel.
async fn idempotency(f: Fixture) -> R {
    let (j, rec) = f.open(Retention::default());
    j.append("a", vec![ev("0")], None).await?;
    let first = j.append("a", vec![ev("1"), ev("2")], Some("k")).await?;
    assert_eq!(
        (first.first_seq, first.last_seq, first.duplicate),
        (2, 3, false)
    );
    let calls = rec.records().len();
    let again = j.append("a", vec![ev("other")], Some("k")).await?;
    assert_eq!(
        (
            again.first_seq,
            again.last_seq,
            again.duplicate,
            again.epoch
        ),
        (2, 3, true, first.epoch)
    );
    assert_eq!(rec.records().len(), calls, "a duplicate is not reported");
    assert_eq!(j.state("a").await?.head, 3);
    let data: Vec<_> = j
        .read("a", 0, 10)
        .await?
        .events
        .iter()
        .map(|e| e.data.clone())
        .collect();
    assert_eq!(data, ["0", "1", "2"], "nothing of the duplicate is stored");
    let other = j.append("b", vec![ev("1")], Some("k")).await?;
    assert_eq!((other.first_seq, other.duplicate), (1, false));
    Ok(())
}

/// Two appends with one key at the same time: one lands, the other is its
/// duplicate.
async fn idempotency_racing(f: Fixture) -> R {
    let (j, _) = f.open(Retention::default());
    for round in 0..10 {
        let key = format!("k{round}");
        let (x, y) = tokio::join!(
            j.append("a", vec![ev("x")], Some(&key)),
            j.append("a", vec![ev("y")], Some(&key))
        );
        let (x, y) = (x?, y?);
        assert_eq!(x.first_seq, y.first_seq, "round {round}");
        assert!(x.duplicate != y.duplicate, "round {round}: {x:?} {y:?}");
    }
    assert_eq!(j.state("a").await?.head, 10);
    Ok(())
}

/// Retention by count: right after a publish a channel serves at most
/// `max_events` (its newest), the sink sees the floor rise, a key whose
/// events are gone is forgotten, and 0 is no count limit.
async fn count_retention(f: Fixture) -> R {
    let (j, rec) = f.open(keep(3, 0));
    let key = j.append("c", vec![ev("1")], Some("k")).await?;
    for head in 2..=7u64 {
        j.append("c", vec![ev(&head.to_string())], None).await?;
        let st = j.state("c").await?;
        assert_eq!((st.floor, st.head), (head.saturating_sub(3) + 1, head));
        let page = j.read("c", 0, 100).await?;
        assert_eq!(page.state, st);
        assert_eq!(seqs(&page).first(), Some(&st.floor));
        assert_eq!(page.events.len() as u64, head.min(3));
    }
    let want = ChannelState {
        epoch: key.epoch,
        floor: 5,
        head: 7,
    };
    assert_eq!(
        rec.records().last().cloned(),
        Some(Record::Committed("c".into(), want, vec![7])),
        "the sink saw the floor rise with the commit"
    );
    // A batch larger than the limit keeps its newest events only.
    let a = j
        .append("c", (0..5).map(|i| ev(&i.to_string())).collect(), None)
        .await?;
    assert_eq!((a.first_seq, a.last_seq), (8, 12));
    assert_eq!(seqs(&j.read("c", 0, 100).await?), [10, 11, 12]);
    // The key's event is gone, so the key is forgotten.
    let re = j.append("c", vec![ev("again")], Some("k")).await?;
    assert!(!re.duplicate, "{re:?}");
    assert_eq!(re.first_seq, 13);
    // max_events 0 keeps every event. (On Redis, a journal with another
    // retention applies its own to the channels it reads: `j` goes first.)
    j.close().await?;
    drop(j);
    let (j0, _) = f.open(keep(0, 0));
    for _ in 0..3 {
        j0.append("z", vec![ev("a"), ev("b")], None).await?;
    }
    assert_eq!(seqs(&j0.read("z", 0, 10).await?), [1, 2, 3, 4, 5, 6]);
    assert_eq!(j0.state("z").await?.floor, 1);
    Ok(())
}

fn keep_bytes(max_bytes: u64) -> Retention {
    Retention {
        max_events: 0,
        max_age_ms: 0,
        max_bytes,
    }
}

/// Retention by bytes: right after a publish a channel serves its newest
/// events whose data adds up to at most `max_bytes` (only the data counts:
/// not the type; bytes count as bytes), and always its newest event however
/// large; the sink sees the floor rise; a key whose events are gone is
/// forgotten; 0 is no byte limit.
async fn byte_retention(f: Fixture) -> R {
    let (j, rec) = f.open(keep_bytes(25));
    j.append("c", vec![ev("0123456789")], Some("k")).await?;
    j.append("c", vec![ev("0123456789")], None).await?;
    assert_eq!(seqs(&j.read("c", 0, 10).await?), [1, 2], "20 bytes fit");
    j.append("c", vec![ev("0123456789")], None).await?;
    let st = j.state("c").await?;
    assert_eq!(
        (st.floor, st.head),
        (2, 3),
        "30 bytes do not: the oldest goes"
    );
    assert_eq!(seqs(&j.read("c", 0, 10).await?), [2, 3]);
    assert_eq!(
        rec.last_state("c"),
        Some(st),
        "the sink saw the floor rise with the commit"
    );
    // The key's event is gone, so the key is forgotten.
    let re = j.append("c", vec![ev("12345")], Some("k")).await?;
    assert_eq!((re.first_seq, re.duplicate), (4, false));
    assert_eq!(seqs(&j.read("c", 0, 10).await?), [2, 3, 4], "25 bytes fit");
    // The type does not count; binary data counts its bytes.
    let typed = NewEvent {
        event_type: Some("t".repeat(60)),
        data: Payload::Binary(vec![0; 10]),
    };
    j.append("c", vec![typed], None).await?;
    assert_eq!(seqs(&j.read("c", 0, 10).await?), [3, 4, 5]);
    // The newest event stays whatever its size.
    j.append("c", vec![ev(&"x".repeat(100))], None).await?;
    let page = j.read("c", 0, 10).await?;
    assert_eq!(seqs(&page), [6]);
    assert_eq!((page.state.floor, page.state.head), (6, 6));
    // A batch keeps its newest events that fit.
    let a = j
        .append("c", (0..6).map(|_| ev("0123456789")).collect(), None)
        .await?;
    assert_eq!((a.first_seq, a.last_seq), (7, 12));
    assert_eq!(seqs(&j.read("c", 0, 10).await?), [11, 12]);
    // Empty events weigh nothing.
    for _ in 0..5 {
        j.append("e", vec![ev("")], None).await?;
    }
    assert_eq!(j.read("e", 0, 10).await?.events.len(), 5);
    // Both limits apply: whichever evicts more.
    j.close().await?;
    drop(j);
    let (both, _) = f.open(Retention {
        max_events: 2,
        max_age_ms: 0,
        max_bytes: 1000,
    });
    for _ in 0..4 {
        both.append("both", vec![ev("0123456789")], None).await?;
    }
    assert_eq!(seqs(&both.read("both", 0, 10).await?), [3, 4]);
    Ok(())
}

/// Each channel has the retention of its namespace (its name up to the
/// first `:`; `default` without one): a table's keys, the server's for the
/// keys it leaves out, the server's for a namespace without a table.
async fn namespace_retention(f: Fixture) -> R {
    let server = Policy {
        retention: keep(4, 0),
        ..Policy::default()
    };
    let mut tables = BTreeMap::new();
    tables.insert(
        "small".to_owned(),
        Table {
            retention_events: Some(2),
            ..Table::default()
        },
    );
    tables.insert(
        "tiny".to_owned(),
        Table {
            retention_bytes: Some(3),
            ..Table::default()
        },
    );
    tables.insert(
        "brief".to_owned(),
        Table {
            retention_ms: Some(300),
            ..Table::default()
        },
    );
    tables.insert(
        "default".to_owned(),
        Table {
            retention_events: Some(3),
            ..Table::default()
        },
    );
    tables.insert(
        "all".to_owned(),
        Table {
            retention_events: Some(0),
            ..Table::default()
        },
    );
    let (j, _) = f.open_ns(Namespaces::new(server, &tables));
    for channel in ["small:a", "tiny:a", "plain", "other:x", "all:x", "brief:a"] {
        for i in 1..=6 {
            j.append(channel, vec![ev(&i.to_string())], None).await?;
        }
    }
    assert_eq!(seqs(&j.read("small:a", 0, 10).await?), [5, 6]);
    assert_eq!(
        seqs(&j.read("tiny:a", 0, 10).await?),
        [4, 5, 6],
        "3 bytes, and the server's count limit"
    );
    assert_eq!(
        seqs(&j.read("plain", 0, 10).await?),
        [4, 5, 6],
        "[namespaces.default]"
    );
    assert_eq!(
        seqs(&j.read("other:x", 0, 10).await?),
        [3, 4, 5, 6],
        "no table"
    );
    assert_eq!(seqs(&j.read("all:x", 0, 10).await?).len(), 6, "0: no limit");
    // Age: only `brief` has a limit.
    tokio::time::sleep(Duration::from_millis(450)).await;
    j.append("brief:a", vec![ev("new")], None).await?;
    let st = evict_until(&*j, "brief:a", 7, Duration::from_secs(5)).await?;
    assert_eq!((st.floor, st.head), (7, 7));
    assert_eq!(j.state("other:x").await?.floor, 3, "no age limit elsewhere");
    Ok(())
}

/// A lower retention applies to the events a channel already holds once
/// the journal is opened again with it (a restart with new namespace
/// settings): without waiting for the channel's next append, by count and
/// by bytes, each channel by its namespace; reads start at the new floor and
/// seqs continue. A higher one evicts nothing more.
async fn retention_lowered_across_restart(f: Fixture) -> R {
    {
        let (j, _) = f.open(keep(100, 0));
        for channel in ["c", "b:c", "keep:c"] {
            for i in 0..10 {
                j.append(channel, vec![ev(&format!("{i}23456789"))], None)
                    .await?;
            }
        }
        j.close().await?;
    }
    let server = Policy {
        retention: keep(4, 0),
        ..Policy::default()
    };
    let mut tables = BTreeMap::new();
    tables.insert(
        "b".to_owned(),
        Table {
            retention_events: Some(100),
            retention_bytes: Some(30),
            ..Table::default()
        },
    );
    tables.insert(
        "keep".to_owned(),
        Table {
            retention_events: Some(1000),
            ..Table::default()
        },
    );
    let Some((j, _)) = f.reopen(Namespaces::new(server, &tables)) else {
        return Ok(());
    };
    let st = j.state("c").await?;
    assert_eq!((st.floor, st.head), (7, 10), "count: 4 of 10");
    assert_eq!(seqs(&j.read("c", 0, 100).await?), [7, 8, 9, 10]);
    assert_eq!(seqs(&j.read("b:c", 0, 100).await?), [8, 9, 10], "30 bytes");
    assert_eq!(j.state("b:c").await?.floor, 8);
    assert_eq!(seqs(&j.read("keep:c", 0, 100).await?).len(), 10);
    let a = j.append("c", vec![ev("next")], None).await?;
    assert_eq!(a.first_seq, 11);
    assert_eq!(seqs(&j.read("c", 0, 100).await?), [8, 9, 10, 11]);
    let a = j.append("b:c", vec![ev("0123456789")], None).await?;
    assert_eq!(a.first_seq, 11);
    assert_eq!(seqs(&j.read("b:c", 0, 100).await?), [9, 10, 11]);
    Ok(())
}

/// Retention by age: events older than `max_age_ms` go, at most about a
/// second late, once `evict_expired` has run; the sink is told the new
/// floor; reads skip them; a key whose events are gone is forgotten; with
/// everything gone the floor is `head + 1` and seqs continue.
async fn age_retention(f: Fixture) -> R {
    let (j, rec) = f.open(keep(1000, 300));
    j.append("old", vec![ev("1"), ev("2")], Some("k")).await?;
    tokio::time::sleep(Duration::from_millis(450)).await;
    j.append("old", vec![ev("3")], None).await?;
    // Generous margins: the lag allowed is 1 s, this waits for 5.
    let st = evict_until(&*j, "old", 3, Duration::from_secs(5)).await?;
    assert_eq!((st.floor, st.head), (3, 3));
    assert_eq!(seqs(&j.read("old", 0, 10).await?), [3]);
    let told = rec.last_state("old").expect("the sink heard of old");
    assert!(told.floor >= 3, "the sink was told the floor: {told:?}");
    // The key's events are gone, so the key is forgotten.
    let re = j.append("old", vec![ev("4")], Some("k")).await?;
    assert_eq!((re.first_seq, re.duplicate), (4, false));
    // Everything expires: floor = head + 1, reads are empty.
    let st = evict_until(&*j, "old", 5, Duration::from_secs(5)).await?;
    assert_eq!((st.floor, st.head), (5, 4));
    assert!(j.read("old", 0, 10).await?.events.is_empty());
    // The sink hears of the last floor within the same lag.
    let t0 = Instant::now();
    while rec.last_state("old").map(|s| s.floor) != Some(5) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the sink was not told floor 5: {:?}",
            rec.last_state("old")
        );
        j.evict_expired(now_ms()).await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Appending again continues the seqs.
    let a = j.append("old", vec![ev("5")], None).await?;
    assert_eq!(a.first_seq, 5);
    assert_eq!(j.state("old").await?.floor, 5);
    Ok(())
}

/// `max_age_ms` 0 keeps events forever.
async fn age_zero(f: Fixture) -> R {
    let (j, rec) = f.open(keep(1000, 0));
    j.append("c", vec![ev("1")], None).await?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    j.evict_expired(now_ms()).await?;
    j.evict_expired(now_ms() + 365 * 86_400_000).await?;
    assert_eq!(j.state("c").await?.floor, 1);
    assert_eq!(seqs(&j.read("c", 0, 10).await?), [1]);
    assert!(
        !rec.records()
            .iter()
            .any(|r| matches!(r, Record::Evicted(..))),
        "{:?}",
        rec.records()
    );
    Ok(())
}

/// Reads page from `after`, at most `limit`, skipping what is below the
/// floor; a channel never published to reads empty with the empty state.
async fn reads(f: Fixture) -> R {
    let (j, _) = f.open(keep(6, 0));
    for i in 1..=10 {
        j.append("p", vec![ev(&i.to_string())], None).await?;
    }
    assert_eq!(seqs(&j.read("p", 0, 2).await?), [5, 6]);
    assert_eq!(seqs(&j.read("p", 2, 3).await?), [5, 6, 7]);
    assert_eq!(seqs(&j.read("p", 6, 3).await?), [7, 8, 9]);
    assert_eq!(seqs(&j.read("p", 9, 3).await?), [10]);
    assert!(j.read("p", 10, 3).await?.events.is_empty());
    assert!(j.read("p", 99, 3).await?.events.is_empty());
    assert!(j.read("p", 0, 0).await?.events.is_empty());
    let page = j.read("p", 0, 100).await?;
    assert_eq!((page.state.floor, page.state.head), (5, 10));
    assert_eq!(page.events[0].data, "5");
    let none = j.read("nobody", 0, 10).await?;
    assert_eq!((none.state.floor, none.state.head), (1, 0));
    assert_eq!(none.state, j.state("nobody").await?);
    assert!(none.events.is_empty());
    Ok(())
}

/// `read_bounded` stops once the events' data passes the budget, and
/// always returns at least one event.
async fn bounded_reads(f: Fixture) -> R {
    let (j, _) = f.open(Retention::default());
    for _ in 0..6 {
        j.append("big", vec![ev(&"k".repeat(1000))], None).await?;
    }
    assert_eq!(seqs(&j.read_bounded("big", 0, 100, 2500).await?), [1, 2]);
    assert_eq!(seqs(&j.read_bounded("big", 2, 100, 2000).await?), [3, 4]);
    assert_eq!(seqs(&j.read_bounded("big", 0, 100, 10).await?), [1]);
    assert_eq!(seqs(&j.read_bounded("big", 0, 100, 0).await?), [1]);
    assert_eq!(seqs(&j.read_bounded("big", 4, 100, 10).await?), [5]);
    assert_eq!(
        seqs(&j.read_bounded("big", 0, 3, 1 << 20).await?),
        [1, 2, 3]
    );
    assert_eq!(
        seqs(&j.read_bounded("big", 0, 100, usize::MAX).await?).len(),
        6
    );
    assert!(j.read_bounded("big", 6, 100, 10).await?.events.is_empty());
    // Only the data counts: not the type, nor how a journal stores either.
    for _ in 0..3 {
        let typed = NewEvent {
            event_type: Some("t".repeat(200)),
            data: "k".repeat(1000).into(),
        };
        j.append("typed", vec![typed], None).await?;
    }
    assert_eq!(seqs(&j.read_bounded("typed", 0, 100, 2000).await?), [1, 2]);
    assert_eq!(seqs(&j.read_bounded("typed", 0, 100, 1999).await?), [1]);
    for _ in 0..5 {
        j.append("empty", vec![ev("")], None).await?;
    }
    assert_eq!(seqs(&j.read_bounded("empty", 0, 100, 0).await?).len(), 5);
    Ok(())
}

/// The sink sees every commit, in commit order per channel, before the
/// append returns (one sink call may carry several appends: a journal
/// shared between nodes reports a hole it read with the commit after it).
async fn sink_order(f: Fixture) -> R {
    let (j, rec) = f.open(Retention::default());
    let mut tasks = Vec::new();
    for t in 0..16 {
        let (j, rec) = (j.clone(), rec.clone());
        tasks.push(tokio::spawn(async move {
            let channel = format!("c{}", t % 4);
            for _ in 0..20 {
                let a = j.append(&channel, vec![ev("a"), ev("b")], None).await?;
                let seen = |seq| {
                    rec.records().iter().any(|r| {
                        matches!(r, Record::Committed(c, _, s) if *c == channel && s.contains(&seq))
                    })
                };
                assert!(
                    seen(a.first_seq) && seen(a.last_seq),
                    "the sink had not seen {channel}/{}..={} when the append returned",
                    a.first_seq,
                    a.last_seq
                );
            }
            Ok::<_, JournalError>(())
        }));
    }
    for t in tasks {
        t.await.expect("task")?;
    }
    for c in 0..4 {
        let name = format!("c{c}");
        let mut next = 1;
        for r in rec.records() {
            if let Record::Committed(ch, st, s) = r {
                if ch == name {
                    assert_eq!(s.first(), Some(&next), "{name}");
                    next += s.len() as u64;
                    assert_eq!(st.head, next - 1, "{name}");
                }
            }
        }
        assert_eq!(next - 1, 4 * 20 * 2, "{name}");
    }
    // The first commits of a channel race most (nothing reported before
    // them): many fresh channels, each with concurrent first appends.
    let mut tasks = Vec::new();
    for t in 0..64 {
        let (j, rec) = (j.clone(), rec.clone());
        tasks.push(tokio::spawn(async move {
            let channel = format!("fresh{}", t % 16);
            let a = j.append(&channel, vec![ev("a")], None).await?;
            let seen = rec.records().iter().any(|r| {
                matches!(r, Record::Committed(c, _, s) if *c == channel && s.contains(&a.last_seq))
            });
            assert!(
                seen,
                "the sink had not seen {channel}/{} when the append returned",
                a.last_seq
            );
            Ok::<_, JournalError>(())
        }));
    }
    for t in tasks {
        t.await.expect("task")?;
    }
    Ok(())
}

/// Binary payloads: an event's data is text or bytes, and reads back
/// exactly as appended, flag included (bytes that happen to be UTF-8 stay
/// bytes; text stays text), in a batch that mixes both, typed or not. The
/// Redis journal is read again through a second journal on the same server
/// (what another node reads).
async fn bytes(f: Fixture) -> R {
    let (j, _) = f.open(Retention::default());
    let all: Vec<u8> = (0..=255u8).collect();
    let batch = vec![
        NewEvent {
            event_type: None,
            data: Payload::Binary(all.clone()),
        },
        ev("text"),
        NewEvent {
            event_type: Some("blob".into()),
            data: Payload::Binary(all.iter().rev().copied().collect()),
        },
        NewEvent {
            event_type: None,
            data: Payload::Binary(Vec::new()),
        },
        NewEvent {
            event_type: Some("t".into()),
            data: Payload::Binary(b"utf-8 but bytes\r\n".to_vec()),
        },
        NewEvent {
            event_type: Some("t".into()),
            data: "é\r\n".into(),
        },
    ];
    let want: Vec<(Option<String>, Payload)> = batch
        .iter()
        .map(|e| (e.event_type.clone(), e.data.clone()))
        .collect();
    let a = j.append("c", batch, None).await?;
    assert_eq!((a.first_seq, a.last_seq), (1, 6));
    let got = |page: &Page| -> Vec<(Option<String>, Payload)> {
        page.events
            .iter()
            .map(|e| (e.event_type.clone(), e.data.clone()))
            .collect()
    };
    assert_eq!(got(&j.read("c", 0, 10).await?), want);
    if f.kind == Kind::Redis {
        let (other, _) = f.open(Retention::default());
        assert_eq!(got(&other.read("c", 0, 10).await?), want, "another node");
    }
    Ok(())
}

/// `seek_time` answers the first retained event at or after a time
/// (`head + 1` when none is), with the channel's bounds and the head
/// event's time, for every time around every event's; a channel never
/// published to answers seq 1 and time 0. The channel is long enough (300
/// KiB) that the embedded store has applied part of it to its tables and
/// holds the rest in its overlay, so the search crosses both.
async fn seek_times(f: Fixture) -> R {
    let (j, _) = f.open(keep(1000, 0));
    let none = j.seek_time("nobody", now_ms()).await?;
    assert_eq!((none.seq, none.head_time), (1, 0));
    assert_eq!(none.state, j.state("nobody").await?);
    assert!(!none.evicted_after(0));
    for _ in 0..30 {
        let batch = (0..5).map(|_| ev(&"x".repeat(2048))).collect();
        j.append("t", batch, None).await?;
        // Mostly distinct times; equal ones are checked as well.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let page = j.read("t", 0, 1000).await?;
    let (st, all) = (page.state, page.events);
    assert_eq!((st.floor, st.head, all.len()), (1, 150, 150));
    let head_time = all[149].time;
    let first_at = |t: u64| {
        all.iter()
            .find(|e| e.time >= t)
            .map_or(st.head + 1, |e| e.seq)
    };
    let mut times: Vec<u64> = vec![0, 1, head_time + 1, u64::MAX];
    for e in &all {
        times.extend([e.time - 1, e.time, e.time + 1]);
    }
    times.dedup();
    for t in times {
        let s = j.seek_time("t", t).await?;
        assert_eq!(s.seq, first_at(t), "time {t} (events from {})", all[0].time);
        assert_eq!((s.state, s.head_time), (st, head_time), "time {t}");
        assert!(!s.evicted_after(t), "nothing was evicted: {s:?}");
    }
    Ok(())
}

/// After eviction `seek_time` answers among the retained events only, and
/// `evicted_after` says when an evicted event may be at or after the time:
/// the answer is the floor and something was evicted (by count here), or
/// everything was evicted (by age) and the head event, whose time the
/// journal keeps, is at or after it.
async fn seek_after_eviction(f: Fixture) -> R {
    let (j, _) = f.open(keep(4, 0));
    for i in 1..=8 {
        j.append("c", vec![ev(&i.to_string())], None).await?;
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let page = j.read("c", 0, 10).await?;
    assert_eq!(seqs(&page), [5, 6, 7, 8]);
    let t = |seq: u64| page.events[(seq - 5) as usize].time;
    let s = j.seek_time("c", 0).await?;
    assert_eq!((s.seq, s.state, s.head_time), (5, page.state, t(8)));
    assert!(s.evicted_after(0), "events 1 to 4 may be after time 0");
    let s = j.seek_time("c", t(5)).await?;
    assert_eq!(s.seq, 5);
    assert!(s.evicted_after(t(5)), "event 4 is gone, its time with it");
    let s = j.seek_time("c", t(6)).await?;
    assert_eq!(s.seq, 6);
    assert!(!s.evicted_after(t(6)), "event 5 is retained and older");
    let s = j.seek_time("c", t(8) + 1).await?;
    assert_eq!(s.seq, 9);
    assert!(!s.evicted_after(t(8) + 1), "event 8 is retained and older");

    let (j, _) = f.open(keep(1000, 200));
    j.append("old", vec![ev("1")], None).await?;
    tokio::time::sleep(Duration::from_millis(3)).await;
    j.append("old", vec![ev("2")], None).await?;
    let page = j.read("old", 0, 10).await?;
    let (t1, t2) = (page.events[0].time, page.events[1].time);
    assert!(t1 < t2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let st = evict_until(&*j, "old", 3, Duration::from_secs(5)).await?;
    for (time, may) in [(0, true), (t1, true), (t2, true), (t2 + 1, false)] {
        let s = j.seek_time("old", time).await?;
        assert_eq!((s.seq, s.state, s.head_time), (3, st, t2), "time {time}");
        assert_eq!(s.evicted_after(time), may, "time {time}");
    }
    Ok(())
}

/// After `close`, appends are refused with `Closed`; every append
/// acknowledged before is kept.
async fn close(f: Fixture) -> R {
    let (j, _) = f.open(Retention::default());
    let mut tasks = Vec::new();
    for i in 0..50 {
        let j = j.clone();
        tasks.push(tokio::spawn(async move {
            j.append("c", vec![ev(&i.to_string())], None).await
        }));
    }
    tokio::task::yield_now().await;
    j.close().await?;
    let mut acked = 0;
    for t in tasks {
        match t.await.expect("task") {
            Ok(_) => acked += 1,
            Err(JournalError::Closed) => {}
            Err(e) => return Err(e),
        }
    }
    let late = j.append("c", vec![ev("late")], None).await;
    assert!(matches!(late, Err(JournalError::Closed)), "{late:?}");
    // A journal opened on the same store has every acknowledged append.
    if f.kind != Kind::Memory {
        drop(j);
        let dirs = f.dirs.lock().expect("lock").pop();
        let (again, _) = match dirs {
            Some(dir) => {
                let opts = StoreOptions {
                    min_free_bytes: 0,
                    ..StoreOptions::default()
                };
                let rec = Arc::new(Recorder::default());
                let j: Arc<dyn Journal> =
                    Arc::new(EmbeddedJournal::open(dir.path(), opts, rec.clone())?);
                f.dirs.lock().expect("lock").push(dir);
                (j, rec)
            }
            None => f.open(Retention::default()),
        };
        assert_eq!(again.state("c").await?.head, acked);
    }
    Ok(())
}

/// What a journal reports about itself: its durability label is one of the
/// documented ones, a healthy journal is ready, only a journal on local
/// disk has a size, and a fresh channel has no fork.
async fn reports(f: Fixture) -> R {
    let (j, _) = f.open(Retention::default());
    j.append("c", vec![ev("x")], None).await?;
    assert!(
        ["sync", "async", "memory", "unknown"].contains(&j.durability()),
        "{}",
        j.durability()
    );
    j.ready().await?;
    assert_eq!(j.size_bytes().is_some(), f.kind == Kind::Embedded);
    let st = j.state("c").await?;
    assert_eq!(j.fork_of("c", st.epoch, st.epoch), None);
    Ok(())
}

/// A purge removes every event and idempotency key of one channel, gives it
/// a new epoch (a fork at seq 0 of the old one) with seqs from 1 again,
/// tells the sink before it returns, leaves other channels alone, leaves a
/// channel never appended to as it is, and (on a store that outlives the
/// journal) is still there when the store is opened again.
async fn purge(f: Fixture) -> R {
    let (j, rec) = f.open(Retention::default());
    j.append("a", vec![ev("1"), ev("2")], Some("k")).await?;
    j.append("a", vec![ev("3")], None).await?;
    let b = j.append("b", vec![ev("y")], None).await?;
    let old = j.state("a").await?;
    let st = j.purge("a").await?;
    assert_ne!(st.epoch, old.epoch, "a new epoch");
    assert_ne!(st.epoch.0, 0);
    assert_eq!((st.floor, st.head), (1, 0));
    assert_eq!(
        rec.last_state("a"),
        Some(st),
        "the sink knows before it returns"
    );
    assert_eq!(j.state("a").await?, st);
    let page = j.read("a", 0, 100).await?;
    assert!(page.events.is_empty(), "{:?}", seqs(&page));
    assert_eq!(page.state, st);
    assert_eq!(j.fork_of("a", old.epoch, st.epoch), Some(0));
    assert_eq!(j.seek_time("a", 0).await?.state, st);
    let other = j.state("b").await?;
    assert_eq!(
        (other.epoch, other.head),
        (b.epoch, 1),
        "other channels stay"
    );
    let again = j.append("a", vec![ev("4")], Some("k")).await?;
    assert_eq!(
        (again.epoch, again.first_seq, again.duplicate),
        (st.epoch, 1, false),
        "seqs start at 1; the key was forgotten"
    );
    let page = j.read("a", 0, 100).await?;
    assert_eq!(seqs(&page), [1]);
    assert!(page.events.iter().all(|e| e.epoch == st.epoch));
    // A channel never appended to: nothing to purge.
    let never = j.purge("never").await?;
    assert_eq!((never.floor, never.head), (1, 0));
    assert_eq!(j.state("never").await?.head, 0);
    // Purged twice: another epoch again.
    let twice = j.purge("a").await?;
    assert_ne!(twice.epoch, st.epoch);
    assert_eq!(j.fork_of("a", st.epoch, twice.epoch), Some(0));
    if f.kind == Kind::Embedded {
        j.close().await?;
        drop(j);
        let dir = f
            .dirs
            .lock()
            .expect("lock")
            .pop()
            .expect("the store's directory");
        let opts = StoreOptions {
            min_free_bytes: 0,
            ..StoreOptions::default()
        };
        let reopened: Arc<dyn Journal> =
            Arc::new(EmbeddedJournal::open(dir.path(), opts, Arc::new(NoSink))?);
        assert_eq!(reopened.state("a").await?, twice, "the purge is durable");
        assert!(reopened.read("a", 0, 100).await?.events.is_empty());
        assert_eq!(reopened.state("b").await?.epoch, b.epoch);
        let next = reopened.append("a", vec![ev("5")], None).await?;
        assert_eq!((next.epoch, next.first_seq), (twice.epoch, 1));
        f.dirs.lock().expect("lock").push(dir);
    }
    Ok(())
}

/// Appends racing a purge land wholly before it (and are gone) or wholly
/// after it (in the new epoch, dense from seq 1), never half: a batch is
/// never split across the purge.
async fn purge_racing(f: Fixture) -> R {
    let (j, _) = f.open(Retention::default());
    j.append("r", vec![ev("first")], None).await?;
    let mut tasks = Vec::new();
    for i in 0..40 {
        let ja = j.clone();
        tasks.push(tokio::spawn(async move {
            let j = ja;
            let batch = vec![ev(&format!("{i}a")), ev(&format!("{i}b"))];
            j.append("r", batch, None).await
        }));
        if i == 20 {
            let j = j.clone();
            tasks.push(tokio::spawn(async move {
                j.purge("r").await.map(|st| Appended {
                    epoch: st.epoch,
                    first_seq: 0,
                    last_seq: 0,
                    duplicate: true,
                })
            }));
        }
    }
    let mut acks = Vec::new();
    let mut purged = None;
    for t in tasks {
        let a = t.await.expect("task")?;
        if a.first_seq == 0 {
            purged = Some(a.epoch);
        } else {
            acks.push(a);
        }
    }
    let purged = purged.expect("the purge answered");
    let st = j.state("r").await?;
    assert_eq!(st.epoch, purged, "no other epoch since");
    let after: Vec<&Appended> = acks.iter().filter(|a| a.epoch == purged).collect();
    for a in &acks {
        assert_eq!(a.last_seq, a.first_seq + 1, "{a:?}");
    }
    let page = j.read("r", 0, 1000).await?;
    assert_eq!(
        page.events.len(),
        after.len() * 2,
        "exactly the appends answered in the new epoch are there"
    );
    assert_eq!(
        seqs(&page),
        (1..=st.head).collect::<Vec<_>>(),
        "dense from 1"
    );
    for pair in page.events.chunks(2) {
        let text = |e: &Event| String::from_utf8_lossy(e.data.as_bytes()).into_owned();
        let (x, y) = (text(&pair[0]), text(&pair[1]));
        assert_eq!(
            x.trim_end_matches('a'),
            y.trim_end_matches('b'),
            "a batch is whole: {x} {y}"
        );
    }
    Ok(())
}

// ---- channel metadata (`gapless_core::meta`) ----

fn new_meta(content_type: &str) -> ChannelMeta {
    ChannelMeta::new(rand_incarnation(), content_type.to_owned(), now_ms())
}

fn rand_incarnation() -> u64 {
    // Distinct enough for a test: the clock's nanoseconds, never 0.
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64 | 1)
}

fn producer_append(inc: u64, id: &str, epoch: u64, seq: u64, data: &str) -> Change {
    Change::Append {
        guard: Guard {
            incarnation: inc,
            producer: Some(ProducerTuple {
                id: id.to_owned(),
                epoch,
                seq,
            }),
            stream_seq: None,
            close: false,
        },
        events: vec![ev(data)],
        key: Some(format!("p/{inc}/{id}/{epoch}/{seq}")),
    }
}

/// Creation sets the layout from the channel's bounds, appends the first
/// events, and a second creation finds the first; reads give the metadata
/// with the bounds; the sink hears of the change.
async fn meta_create(f: Fixture) -> R {
    let (j, rec) = f.open(Retention::default());
    assert_eq!(j.meta("s").await?.0, None, "no metadata before creation");
    j.append("s", vec![ev("before")], None).await?;
    let m = new_meta("application/json");
    let c = j
        .change(
            "s",
            Change::Create {
                meta: m.clone(),
                events: vec![ev("1"), ev("2")],
            },
        )
        .await?;
    let Outcome::Created(Some(a)) = c.outcome else {
        panic!("not created: {:?}", c.outcome)
    };
    assert_eq!((a.first_seq, a.last_seq), (2, 3));
    let held = c.meta.clone().expect("metadata after creation");
    assert_eq!(
        (
            held.layout.base,
            held.layout.origin,
            held.layout.channel_epoch
        ),
        (1, 1, c.state.epoch.0),
        "the stream begins after the channel's head at creation"
    );
    assert_eq!(c.state.head, 3);
    let (read, st) = j.meta("s").await?;
    assert_eq!(read.as_ref(), Some(&*held));
    assert_eq!(st.head, 3);
    let again = j
        .change(
            "s",
            Change::Create {
                meta: new_meta("text/plain"),
                events: vec![ev("x")],
            },
        )
        .await?;
    assert_eq!(again.outcome, Outcome::Exists);
    assert_eq!(again.meta.as_ref(), Some(&held), "the first creation stays");
    assert_eq!(
        j.state("s").await?.head,
        3,
        "nothing appended by the second"
    );
    assert!(rec.records().contains(&Record::Meta("s".into())));
    assert_eq!(j.meta("other").await?.0, None);
    Ok(())
}

/// Producer appends are checked and recorded with the append they guard:
/// the next seq appends, a retry is a duplicate, a gap and a stale epoch
/// are refused, and nothing refused is stored.
async fn meta_guards(f: Fixture) -> R {
    let (j, _) = f.open(Retention::default());
    let m = new_meta("text/plain");
    let inc = m.incarnation;
    j.change(
        "s",
        Change::Create {
            meta: m,
            events: Vec::new(),
        },
    )
    .await?;
    for seq in 0..3 {
        let c = j
            .change("s", producer_append(inc, "p", 0, seq, "x"))
            .await?;
        assert!(
            matches!(c.outcome, Outcome::Appended(Some(_))),
            "{seq}: {:?}",
            c.outcome
        );
    }
    let dup = j.change("s", producer_append(inc, "p", 0, 1, "x")).await?;
    assert_eq!(dup.outcome, Outcome::Duplicate(2));
    let gap = j.change("s", producer_append(inc, "p", 0, 5, "x")).await?;
    assert_eq!(
        gap.outcome,
        Outcome::Refused(Refusal::SeqGap {
            expected: 3,
            received: 5
        })
    );
    let bumped = j.change("s", producer_append(inc, "p", 1, 0, "x")).await?;
    assert!(matches!(bumped.outcome, Outcome::Appended(Some(_))));
    let stale = j.change("s", producer_append(inc, "p", 0, 3, "x")).await?;
    assert_eq!(
        stale.outcome,
        Outcome::Refused(Refusal::StaleEpoch { current: 1 })
    );
    let other = j
        .change("s", producer_append(inc ^ 2, "p", 1, 1, "x"))
        .await?;
    assert_eq!(
        other.outcome,
        Outcome::Refused(Refusal::NotFound),
        "another incarnation"
    );
    assert_eq!(
        j.state("s").await?.head,
        4,
        "only the four accepted appends are stored"
    );
    let (m, _) = j.meta("s").await?;
    assert_eq!(m.and_then(|m| m.producers.get("p").copied()), Some((1, 0)));
    let seq_guard = |s: &str| Change::Append {
        guard: Guard {
            incarnation: inc,
            stream_seq: Some(s.to_owned()),
            ..Guard::default()
        },
        events: vec![ev("y")],
        key: None,
    };
    assert!(matches!(
        j.change("s", seq_guard("b")).await?.outcome,
        Outcome::Appended(_)
    ));
    assert_eq!(
        j.change("s", seq_guard("a")).await?.outcome,
        Outcome::Refused(Refusal::StreamSeqRegression { last: "b".into() })
    );
    Ok(())
}

/// A closed channel refuses every append, the journal's plain ones too; the
/// retry of the closing append and a repeated close succeed.
async fn meta_closed(f: Fixture) -> R {
    let (j, _) = f.open(Retention::default());
    let m = new_meta("text/plain");
    let inc = m.incarnation;
    j.change(
        "s",
        Change::Create {
            meta: m,
            events: Vec::new(),
        },
    )
    .await?;
    j.append("s", vec![ev("keyed")], Some("k")).await?;
    let mut closing = producer_append(inc, "p", 0, 0, "last");
    if let Change::Append { guard, .. } = &mut closing {
        guard.close = true;
    }
    let c = j.change("s", closing.clone()).await?;
    assert!(matches!(c.outcome, Outcome::Appended(Some(_))));
    assert!(c.meta.as_ref().is_some_and(|m| m.is_closed()));
    assert_eq!(
        j.change("s", closing).await?.outcome,
        Outcome::AlreadyClosed(true)
    );
    let close_only = Change::Append {
        guard: Guard {
            incarnation: inc,
            close: true,
            ..Guard::default()
        },
        events: Vec::new(),
        key: None,
    };
    assert_eq!(
        j.change("s", close_only).await?.outcome,
        Outcome::AlreadyClosed(false)
    );
    assert_eq!(
        j.change("s", producer_append(inc, "p", 0, 1, "more"))
            .await?
            .outcome,
        Outcome::Refused(Refusal::Closed)
    );
    match j.append("s", vec![ev("plain")], None).await {
        Err(JournalError::ChannelClosed) => {}
        other => panic!("a plain append to a closed channel: {other:?}"),
    }
    // A retry of an append stored before the close still answers its seq
    // (a session's producer retrying after another node ended it).
    let retry = j.append("s", vec![ev("keyed")], Some("k")).await?;
    assert_eq!((retry.first_seq, retry.duplicate), (1, true));
    assert_eq!(
        j.state("s").await?.head,
        2,
        "only the keyed and the closing appends are stored"
    );
    j.append("open-channel", vec![ev("fine")], None).await?;
    Ok(())
}

/// Changes submitted in order from one task are decided in that order: a
/// producer's pipelined appends (seq 0, 1, 2, … all in flight at once) are
/// all accepted, in order.
async fn meta_in_order(f: Fixture) -> R {
    let (j, _) = f.open(Retention::default());
    let m = new_meta("text/plain");
    let inc = m.incarnation;
    j.change(
        "s",
        Change::Create {
            meta: m,
            events: Vec::new(),
        },
    )
    .await?;
    let changes =
        (0..20u64).map(|seq| j.change("s", producer_append(inc, "p", 0, seq, &seq.to_string())));
    let outcomes = futures::future::join_all(changes).await;
    for (seq, o) in outcomes.into_iter().enumerate() {
        let o = o?.outcome;
        assert!(matches!(o, Outcome::Appended(Some(_))), "seq {seq}: {o:?}");
    }
    let page = j.read("s", 0, 100).await?;
    let data: Vec<String> = page
        .events
        .iter()
        .map(|e| e.data.wire().into_owned())
        .collect();
    let want: Vec<String> = (0..20).map(|i: u64| i.to_string()).collect();
    assert_eq!(data, want);
    Ok(())
}

/// Producers racing on one channel from many tasks: every append is stored
/// once, each producer's in its order, and its state is its last seq.
async fn meta_racing(f: Fixture) -> R {
    let (j, _) = f.open(Retention::default());
    let m = new_meta("text/plain");
    let inc = m.incarnation;
    j.change(
        "s",
        Change::Create {
            meta: m,
            events: Vec::new(),
        },
    )
    .await?;
    let mut tasks = Vec::new();
    for p in 0..4 {
        let j = j.clone();
        tasks.push(tokio::spawn(async move {
            for seq in 0..25u64 {
                let id = format!("p{p}");
                let c = j
                    .change(
                        "s",
                        producer_append(inc, &id, 0, seq, &format!("{id}:{seq}")),
                    )
                    .await?;
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
        t.await.expect("task")?;
    }
    let page = j.read("s", 0, 1000).await?;
    assert_eq!(page.events.len(), 100);
    for p in 0..4 {
        let id = format!("p{p}:");
        let mine: Vec<String> = page
            .events
            .iter()
            .map(|e| e.data.wire().into_owned())
            .filter(|d| d.starts_with(&id))
            .collect();
        let want: Vec<String> = (0..25).map(|s| format!("{id}{s}")).collect();
        assert_eq!(mine, want);
    }
    let (m, _) = j.meta("s").await?;
    let m = m.expect("metadata");
    for p in 0..4 {
        assert_eq!(m.producers.get(&format!("p{p}")), Some(&(0, 24)));
    }
    Ok(())
}

/// Forks, soft deletion and deletion: a deleted channel's metadata is gone
/// (its events stay), a purge keeps the metadata, and a creation after a
/// deletion is a new incarnation starting after the old events.
async fn meta_lifecycle(f: Fixture) -> R {
    let (j, _) = f.open(Retention::default());
    let m = new_meta("text/plain");
    let inc = m.incarnation;
    j.change(
        "s",
        Change::Create {
            meta: m,
            events: vec![ev("a")],
        },
    )
    .await?;
    let fork = |add| Change::Fork {
        incarnation: inc,
        fork: "f".into(),
        add,
    };
    assert_eq!(j.change("s", fork(true)).await?.outcome, Outcome::Updated);
    let (held, _) = j.meta("s").await?;
    assert!(held.is_some_and(|m| m.forks.contains("f")));
    let soft = j
        .change("s", Change::SoftDelete { incarnation: inc })
        .await?;
    assert_eq!(soft.outcome, Outcome::Updated);
    assert_eq!(
        j.change("s", producer_append(inc, "p", 0, 0, "x"))
            .await?
            .outcome,
        Outcome::Refused(Refusal::SoftDeleted)
    );
    assert_eq!(j.change("s", fork(false)).await?.outcome, Outcome::Updated);
    let purged = j.purge("s").await?;
    let (kept, _) = j.meta("s").await?;
    assert!(
        kept.is_some_and(|m| m.incarnation == inc && m.soft_deleted),
        "a purge keeps the metadata"
    );
    let d = j.change("s", Change::Delete { incarnation: inc }).await?;
    assert_eq!((d.outcome, d.meta), (Outcome::Deleted, None));
    assert_eq!(j.meta("s").await?.0, None);
    assert_eq!(
        j.change("s", Change::Delete { incarnation: inc })
            .await?
            .outcome,
        Outcome::Refused(Refusal::NotFound)
    );
    j.append("s", vec![ev("between")], None).await?;
    let again = j
        .change(
            "s",
            Change::Create {
                meta: new_meta("text/plain"),
                events: Vec::new(),
            },
        )
        .await?;
    assert_eq!(again.outcome, Outcome::Created(None));
    let layout = again.meta.map(|m| m.layout.clone());
    assert_eq!(
        layout.map(|l| (l.base, l.channel_epoch)),
        Some((1, purged.epoch.0))
    );
    Ok(())
}

/// Metadata is as durable as events: after a reopen the stream, its
/// producers' state and its closure are there.
async fn meta_reopen(f: Fixture) -> R {
    let (j, _) = f.open(Retention::default());
    let m = new_meta("application/json");
    let inc = m.incarnation;
    j.change(
        "s",
        Change::Create {
            meta: m,
            events: Vec::new(),
        },
    )
    .await?;
    j.change("s", producer_append(inc, "p", 3, 0, "x")).await?;
    j.change("s", producer_append(inc, "p", 3, 1, "y")).await?;
    let before = j.meta("s").await?;
    j.close().await?;
    drop(j);
    let Some((j, _)) = f.reopen(Retention::default().into()) else {
        return Ok(());
    };
    let after = j.meta("s").await?;
    assert_eq!(after, before);
    assert_eq!(
        j.change("s", producer_append(inc, "p", 3, 1, "y"))
            .await?
            .outcome,
        Outcome::Duplicate(1),
        "a retry after the restart is a duplicate"
    );
    let mut close = producer_append(inc, "p", 3, 2, "z");
    if let Change::Append { guard, .. } = &mut close {
        guard.close = true;
    }
    j.change("s", close).await?;
    j.close().await?;
    drop(j);
    let (j, _) = f.reopen(Retention::default().into()).expect("reopen");
    assert!(j.meta("s").await?.0.is_some_and(|m| m.is_closed()));
    assert!(matches!(
        j.append("s", vec![ev("no")], None).await,
        Err(JournalError::ChannelClosed)
    ));
    Ok(())
}

/// The channels with metadata are found by prefix, in name order and up to
/// the limit: plain channels and deleted ones are not listed, and the list
/// is the same after a reopen (so from the tables, not only from memory).
async fn meta_listing(f: Fixture) -> R {
    let (j, _) = f.open(Retention::default());
    let create = |name: &'static str| {
        let j = j.clone();
        async move {
            j.change(
                name,
                Change::Create {
                    meta: new_meta("text/plain"),
                    events: vec![ev("1")],
                },
            )
            .await
        }
    };
    for name in ["r~b", "r~a", "r~c", "q~a", "r"] {
        create(name).await?;
    }
    j.append("r~plain", vec![ev("p")], None).await?;
    let gone = create("r~gone").await?;
    let inc = gone.meta.map(|m| m.incarnation).expect("created");
    j.change("r~gone", Change::Delete { incarnation: inc })
        .await?;
    let want = vec!["r~a".to_owned(), "r~b".into(), "r~c".into()];
    assert_eq!(j.channels_with_meta("r~", 100).await?, want);
    assert_eq!(j.channels_with_meta("r~", 2).await?, want[..2].to_vec());
    assert_eq!(j.channels_with_meta("x", 100).await?, Vec::<String>::new());
    j.close().await?;
    drop(j);
    let Some((j, _)) = f.reopen(Retention::default().into()) else {
        return Ok(());
    };
    assert_eq!(
        j.channels_with_meta("r~", 100).await?,
        want,
        "after a reopen"
    );
    Ok(())
}

/// `Change::Put` is a compare-and-set: tasks (in Redis, on two journals
/// sharing it, as two nodes) each add to a counter kept as a channel's
/// record, computing again on the winner when they lose, and no increment
/// is lost; a stale guard writes nothing; a removal and a creation again
/// make another incarnation that an old guard cannot touch; the record
/// survives a reopen.
async fn meta_put(f: Fixture) -> R {
    let (j, _) = f.open(Retention::default());
    let other = if f.kind == Kind::Redis {
        f.open(Retention::default()).0
    } else {
        j.clone()
    };
    let put = |inc, version, record: Option<String>| Change::Put {
        incarnation: inc,
        version,
        record,
    };
    let c = j.change("r", put(7, 0, Some("0".into()))).await?;
    assert!(
        matches!(c.outcome, Outcome::Created(None)),
        "{:?}",
        c.outcome
    );
    let lost = j.change("r", put(8, 0, Some("x".into()))).await?;
    assert_eq!(lost.outcome, Outcome::Exists, "a second creation loses");
    assert_eq!(
        lost.meta.as_ref().and_then(|m| m.record.as_deref()),
        Some("0")
    );
    let mut tasks = Vec::new();
    for t in 0..4 {
        let j = if t % 2 == 0 { j.clone() } else { other.clone() };
        tasks.push(tokio::spawn(async move {
            let (mut m, _) = j.meta("r").await?;
            for _ in 0..10 {
                loop {
                    let cur = m.clone().expect("the record");
                    let n: u64 = cur.record.as_deref().unwrap_or("0").parse().unwrap_or(0);
                    let c = j
                        .change(
                            "r",
                            Change::Put {
                                incarnation: cur.incarnation,
                                version: cur.record_version,
                                record: Some((n + 1).to_string()),
                            },
                        )
                        .await?;
                    let won = c.outcome == Outcome::Updated;
                    m = c.meta.map(std::sync::Arc::unwrap_or_clone);
                    if won {
                        break;
                    }
                }
            }
            Ok::<_, JournalError>(())
        }));
    }
    for t in tasks {
        t.await.expect("task")?;
    }
    let m = j.meta("r").await?.0.expect("the record");
    assert_eq!(m.record.as_deref(), Some("40"), "no increment lost");
    assert_eq!(m.record_version, 41);
    let stale = j.change("r", put(7, 3, Some("stale".into()))).await?;
    assert_eq!(
        stale.outcome,
        Outcome::Exists,
        "a stale version writes nothing"
    );
    let gone = j.change("r", put(7, 41, None)).await?;
    assert_eq!(gone.outcome, Outcome::Deleted);
    assert_eq!(j.meta("r").await?.0, None);
    j.change("r", put(9, 0, Some("again".into()))).await?;
    let old = j.change("r", put(7, 1, Some("old".into()))).await?;
    assert_eq!(old.outcome, Outcome::Exists, "another incarnation's guard");
    let before = j.meta("r").await?.0;
    j.close().await?;
    drop((j, other));
    let Some((j, _)) = f.reopen(Retention::default().into()) else {
        return Ok(());
    };
    assert_eq!(j.meta("r").await?.0, before, "the record survives a reopen");
    Ok(())
}
