//! Throughput and read-latency figures (not assertions). Run with
//! `cargo test --release -p gapless-store --test it throughput:: -- --ignored --nocapture`.

use crate::common;

use common::{ev, open, options};
use gapless_core::Journal;
use gapless_store::Durability;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn run(durability: Durability, channels: usize) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let (j, _) = open(dir.path(), options(100_000, 86_400_000, durability));
    let j = Arc::new(j);
    let count = Arc::new(AtomicU64::new(0));
    let data = "x".repeat(200);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(2);
    let mut tasks = Vec::new();
    for t in 0..64 {
        let (j, count, data) = (j.clone(), count.clone(), data.clone());
        tasks.push(tokio::spawn(async move {
            let channel = format!("c{}", t % channels);
            while Instant::now() < deadline {
                j.append(&channel, vec![ev(&data)], None)
                    .await
                    .expect("append");
                count.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let rate = count.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    j.close().await.expect("close");
    rate
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
#[ignore = "benchmark; prints figures"]
async fn throughput() {
    for durability in [Durability::Sync, Durability::Async] {
        for channels in [64, 1] {
            let rate = run(durability, channels).await;
            println!(
                "{durability:?}: 64 tasks, {channels} channel(s), 200-byte events: {rate:.0} events/s"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "benchmark; prints figures"]
async fn read_latency() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (j, _) = open(dir.path(), options(100_000, 0, Durability::Async));
    let j = Arc::new(j);
    let data = "x".repeat(200);
    for _ in 0..10 {
        let batch = (0..1000).map(|_| ev(&data)).collect();
        j.append("r", batch, None).await.expect("append");
    }
    for limit in [1, 64, 65, 100, 1000] {
        let runs = 200;
        let start = Instant::now();
        for i in 0..runs {
            let page = j.read("r", (i * 37) % 9000, limit).await.expect("read");
            assert_eq!(page.events.len(), limit);
        }
        println!(
            "read of {limit} events: {:?}",
            start.elapsed() / runs as u32
        );
    }
    let start = Instant::now();
    for _ in 0..1000 {
        j.state("r").await.expect("state");
    }
    println!("state: {:?}", start.elapsed() / 1000);
}
