//! Cluster mode: Redis comes back with an OLDER copy of a channel under the
//! same epoch (an RDB snapshot taken at head 5 while the head was 15; or an
//! AOF that stopped being written after `CONFIG SET appendonly no`). What
//! must hold (docs/cluster.md, "Loss in Redis is never silent"): every client
//! that held events Redis lost is told with an `epoch` gap, then gets every
//! event acknowledged after the loss, in order, once; nobody ever receives a
//! different event under an (epoch, seq) some client received; a resume past
//! the restored head gets a gap. Two nodes, each with a live SSE subscriber
//! from before the loss, a new subscriber after it, and resumes.

use gapless_testkit::redis::Redis;
use gapless_testkit::{epoch_of, eventually, seq_of, Event, Opts, Server, SseClient};
use std::collections::BTreeMap;
use std::time::Duration;

const CH: &str = "c";

async fn node(redis: &Redis) -> Server {
    Server::with(Opts {
        args: [
            "--redis",
            &redis.url(),
            "--redis-timeout-ms",
            "500",
            "--heartbeat-ms",
            "200",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        ..Opts::default()
    })
    .await
}

fn seq(e: &Event) -> u64 {
    seq_of(e.id.as_deref().expect("an event has an id"), CH)
}

fn epoch(e: &Event) -> String {
    epoch_of(e.id.as_deref().expect("an event has an id"), CH)
}

/// Every (epoch, seq) any client received, with the event type and data it
/// received there: a second client (or the same one again) must receive the
/// same event there.
#[derive(Default)]
struct Seen(BTreeMap<(String, u64), (String, String)>);

impl Seen {
    #[track_caller]
    fn record(&mut self, who: &str, events: &[Event]) {
        for e in events.iter().filter(|e| !e.is_gap()) {
            let at = (epoch(e), seq(e));
            let what = (e.event.clone(), e.data.clone());
            if let Some(before) = self.0.get(&at) {
                assert_eq!(
                    before, &what,
                    "{who} received another event under epoch {} seq {} than a client before",
                    at.0, at.1
                );
            }
            self.0.insert(at, what);
        }
    }
}

/// The next event (gap notices included); panics after 20 s (heartbeats
/// would keep `next_event` waiting for ever on an event that never comes).
async fn next_within(sub: &mut SseClient) -> Event {
    tokio::time::timeout(Duration::from_secs(20), sub.next_event())
        .await
        .expect("an event within 20 s")
}

/// Reads events (gap notices included) until a non-gap one in an epoch other
/// than `old` with seq `last` arrives.
async fn read_until_new(sub: &mut SseClient, old: &str, last: u64) -> Vec<Event> {
    let mut out = Vec::new();
    loop {
        let e = next_within(sub).await;
        let done = !e.is_gap() && epoch(&e) != old && seq(&e) >= last;
        out.push(e);
        if done {
            return out;
        }
    }
}

/// A live subscriber's view after the loss: one `epoch` gap from its
/// position (old epoch, seq 15) to the fork point (new epoch, seq 5), then
/// exactly `new1..new4` as seqs 6..9 of the new epoch.
#[track_caller]
fn assert_told_then_everything(who: &str, got: &[Event], old: &str) -> String {
    let gaps: Vec<&Event> = got.iter().filter(|e| e.is_gap()).collect();
    assert_eq!(gaps.len(), 1, "{who}: one gap notice: {got:?}");
    assert!(got[0].is_gap(), "{who}: the gap notice first: {got:?}");
    let g = got[0].json();
    assert_eq!(g["reason"], "epoch", "{who}: {g}");
    let after = g["after"].as_str().expect("after");
    assert_eq!(
        (epoch_of(after, CH).as_str(), seq_of(after, CH)),
        (old, 15),
        "{who}: the gap starts at what it held"
    );
    let next = g["next"].as_str().expect("next");
    let new = epoch_of(next, CH);
    assert_ne!(new, old, "{who}: the channel forked into a new epoch");
    assert_eq!(
        seq_of(next, CH),
        5,
        "{who}: delivery continues after the restored head"
    );
    let rest = &got[1..];
    assert_eq!(
        rest.iter().map(seq).collect::<Vec<_>>(),
        [6, 7, 8, 9],
        "{who}: every event acknowledged after the loss, in order, once"
    );
    for e in rest {
        assert_eq!(epoch(e), new, "{who}");
        assert_eq!(e.data, format!("new{}", seq(e) - 5), "{who}");
    }
    new
}

/// How Redis comes back older.
#[derive(Clone, Copy, Debug)]
enum Loss {
    /// RDB snapshots only: `SAVE` at head 5, `kill -9`, restart on the same
    /// directory (the restart loads `dump.rdb`).
    RdbSnapshot,
    /// AOF on, then `CONFIG SET appendonly no` at head 5; `kill -9`, restart
    /// with `appendonly yes` (the restart loads the AOF that stopped at 5).
    StaleAof,
}

async fn redis_comes_back_older(loss: Loss) {
    let mut redis = match loss {
        Loss::RdbSnapshot => Redis::start_with(&["--appendonly", "no"]).await,
        Loss::StaleAof => Redis::start().await,
    };
    let (a, b) = (node(&redis).await, node(&redis).await);
    let mut seen = Seen::default();

    let (mut sa, _) = a.subscribe(CH, "since=earliest").await;
    for k in 1..=5 {
        a.publish(CH, &format!("old{k}")).await;
    }
    match loss {
        Loss::RdbSnapshot => {
            redis.cli(&["SAVE"]).await;
        }
        Loss::StaleAof => {
            redis.cli(&["CONFIG", "SET", "appendonly", "no"]).await;
        }
    }
    let (mut sb, _) = b.subscribe(CH, "").await;
    for k in 6..=15 {
        b.publish(CH, &format!("old{k}")).await;
    }
    let got_a = sa.events(15).await;
    assert_eq!(
        got_a.iter().map(seq).collect::<Vec<_>>(),
        (1..=15).collect::<Vec<_>>()
    );
    seen.record("a's subscriber before the loss", &got_a);
    let got_b = sb.events(10).await;
    assert_eq!(
        got_b.iter().map(seq).collect::<Vec<_>>(),
        (6..=15).collect::<Vec<_>>()
    );
    seen.record("b's subscriber before the loss", &got_b);
    let at15 = got_a[14].id.clone().expect("id");
    let at5 = got_a[4].id.clone().expect("id");
    let old = epoch(&got_a[14]);

    redis.restart().await;
    assert_eq!(
        redis.cli(&["HGET", "gapless:{c}", "head"]).await,
        "5",
        "{loss:?}: Redis came back with the older copy"
    );
    for n in [&a, &b] {
        eventually(
            "readyz 200 after Redis is back",
            Duration::from_secs(10),
            || async { n.get("/readyz").await.status == 200 },
        )
        .await;
    }

    for k in 1..=3 {
        let r = a.publish(CH, &format!("new{k}")).await;
        assert_eq!(r["seq"], 5 + k, "{r}");
    }
    let (mut sc, pre) = b.subscribe(CH, "").await;
    assert!(
        pre.gaps.iter().all(|g| g["reason"] == "epoch"),
        "{:?}",
        pre.gaps
    );
    let r = b.publish(CH, "new4").await;
    assert_eq!(r["seq"], 9, "{r}");

    let got = read_until_new(&mut sa, &old, 9).await;
    seen.record("a's subscriber after the loss", &got);
    let new = assert_told_then_everything("a's subscriber", &got, &old);
    let got = read_until_new(&mut sb, &old, 9).await;
    seen.record("b's subscriber after the loss", &got);
    assert_eq!(
        assert_told_then_everything("b's subscriber", &got, &old),
        new
    );

    // The subscriber that came after the loss gets new4 (and anything before
    // it that it gets is consistent with what the others got).
    let got = read_until_new(&mut sc, &old, 9).await;
    seen.record("the new subscriber", &got);
    assert!(got
        .iter()
        .all(|e| !e.is_gap() || e.json()["reason"] == "epoch"));
    let last = got.last().expect("an event");
    assert_eq!((epoch(last), last.data.as_str()), (new.clone(), "new4"));

    // A resume past the restored head, on either node, is told, then gets
    // everything after the fork point; a resume at the restored head
    // continues with no gap.
    for n in [&a, &b] {
        let (mut again, pre) = n.resume(CH, &at15).await;
        assert_eq!(pre.gaps.len(), 1, "{:?}", pre.gaps);
        assert_eq!(pre.gaps[0]["reason"], "epoch");
        let next = pre.gaps[0]["next"].as_str().expect("next");
        assert_eq!((epoch_of(next, CH), seq_of(next, CH)), (new.clone(), 5));
        let mut got = Vec::new();
        for _ in 0..4 {
            got.push(next_within(&mut again).await);
        }
        seen.record("a resume at 15", &got);
        assert_eq!(got.iter().map(seq).collect::<Vec<_>>(), [6, 7, 8, 9]);

        let (mut at, pre) = n.resume(CH, &at5).await;
        assert!(pre.gaps.is_empty(), "{:?}", pre.gaps);
        let mut got = Vec::new();
        for _ in 0..4 {
            got.push(next_within(&mut at).await);
        }
        seen.record("a resume at 5", &got);
        assert_eq!(
            got.iter().map(|e| e.data.as_str()).collect::<Vec<_>>(),
            ["new1", "new2", "new3", "new4"]
        );
    }

    // History holds the restored prefix and everything acknowledged after.
    let mut expect: Vec<String> = (1..=5).map(|k| format!("old{k}")).collect();
    expect.extend((1..=4).map(|k| format!("new{k}")));
    assert_eq!(b.all_data(CH).await, expect);
    assert_eq!(a.epoch(CH).await, new);

    // Live delivery continues exactly once, in order, everywhere.
    a.publish(CH, "new5").await;
    for (who, sub) in [("a", &mut sa), ("b", &mut sb), ("new", &mut sc)] {
        let e = next_within(sub).await;
        seen.record(who, std::slice::from_ref(&e));
        assert_eq!(
            (epoch(&e), seq(&e), e.data.as_str()),
            (new.clone(), 10, "new5"),
            "{who}"
        );
    }
}

#[tokio::test]
async fn redis_back_from_an_older_rdb_snapshot_tells_every_client_and_delivers_what_came_after() {
    redis_comes_back_older(Loss::RdbSnapshot).await;
}

#[tokio::test]
async fn redis_back_with_an_aof_that_stopped_early_is_noticed_by_the_nodes_that_delivered_more() {
    redis_comes_back_older(Loss::StaleAof).await;
}
