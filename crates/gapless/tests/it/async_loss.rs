//! The loss window of `--durability async` (`docs/reliability.md`): four
//! publishers publish as fast as they can; the server is killed with -9 at a
//! pseudo-random moment; after the restart, the acknowledged events it lost
//! are counted. The store flushes at least every second, so every lost event
//! must have been acknowledged within the last second before the kill (plus
//! scheduling slack), and the epoch must change so no client mistakes the
//! lost range. Prints the figures; `GAPLESS_ASYNC_LOSS_ROUNDS` sets the
//! number of kills (default 3).

use gapless_testkit::Server;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[tokio::test]
async fn a_kill_9_under_async_durability_loses_at_most_the_last_second_of_acks() {
    let rounds: u64 = std::env::var("GAPLESS_ASYNC_LOSS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mut worst_count = 0usize;
    let mut worst_age = Duration::ZERO;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for round in 0..rounds {
        let mut s = Server::start(&["--durability", "async"]).await;
        let before = s.epoch("c").await;
        let acks: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut publishers = Vec::new();
        for p in 0..4 {
            let url = s.url("/v1/channels/c/events");
            let http = s.http.clone();
            let acks = acks.clone();
            let stop = stop.clone();
            publishers.push(tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    i += 1;
                    let Ok(r) = http.post(&url).body(format!("p{p}-{i}")).send().await else {
                        break;
                    };
                    if r.status() != 201 {
                        break;
                    }
                    let Ok(v) = r.json::<serde_json::Value>().await else {
                        break;
                    };
                    if let Some(seq) = v["seq"].as_u64() {
                        if let Ok(mut a) = acks.lock() {
                            a.push((seq, Instant::now()));
                        }
                    }
                }
            }));
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let wait = Duration::from_millis(700 + seed % 1300);
        tokio::time::sleep(wait).await;
        let killed = Instant::now();
        s.kill9().await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for p in publishers {
            let _ = p.await;
        }
        s.restart().await;
        let head = s.info("c").await["head"].as_u64().expect("head");
        let acks = acks.lock().map(|a| a.clone()).unwrap_or_default();
        assert!(
            !acks.is_empty(),
            "round {round}: publishes were acknowledged"
        );
        let lost: Vec<&(u64, Instant)> = acks.iter().filter(|(seq, _)| *seq > head).collect();
        let oldest_lost = lost
            .iter()
            .map(|(_, at)| killed.saturating_duration_since(*at))
            .max()
            .unwrap_or_default();
        eprintln!(
            "round {round}: killed after {wait:?}, {} acknowledged, {} lost (acknowledged at most {oldest_lost:?} before the kill)",
            acks.len(),
            lost.len()
        );
        assert!(
            oldest_lost <= Duration::from_millis(1500),
            "round {round}: an event acknowledged {oldest_lost:?} before the kill was lost"
        );
        if !lost.is_empty() || s.epoch("c").await != before {
            // An unclean async run draws a new epoch: the lost range is told as a gap.
            assert_ne!(
                s.epoch("c").await,
                before,
                "round {round}: a new epoch after the loss"
            );
        }
        worst_count = worst_count.max(lost.len());
        worst_age = worst_age.max(oldest_lost);
    }
    eprintln!("async durability: worst loss {worst_count} events, acknowledged at most {worst_age:?} before the kill");
}
