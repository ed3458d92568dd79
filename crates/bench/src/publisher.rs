//! Publishers: concurrent keep-alive connections that take numbered tickets
//! from one counter, so the whole run publishes exactly `total` events (fewer
//! when a deadline stops it), spread round-robin over the channels and paced
//! to an open-loop schedule when a rate is set. Each event carries its
//! channel-local number and publish time ([`crate::payload`]).

use crate::http::{request, Client};
use crate::payload::{self, Wire};
use crate::report::histogram;
use anyhow::Result;
use hdrhistogram::Histogram;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where and what to publish.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Server address.
    pub addr: SocketAddr,
    /// `Host` header.
    pub host: String,
    /// Cluster mode: publisher `k` uses node `k % len` (address, `Host`) instead; empty: `addr`.
    pub nodes: Vec<(SocketAddr, String)>,
    /// Publish path of every channel.
    pub paths: Arc<Vec<String>>,
    /// Events to publish in all.
    pub total: u64,
    /// Events per second over all publishers; 0 = as fast as acknowledged.
    pub rate: f64,
    /// Stop taking tickets after this long.
    pub max_time: Option<Duration>,
    /// Event data size in bytes.
    pub bytes: usize,
    /// Concurrent publisher connections.
    pub publishers: usize,
    /// How the data travels in the body (and its `Content-Type`).
    pub wire: Wire,
    /// Tag each event with its channel's index (`cK:`, for subscribers that follow several
    /// channels on one connection).
    pub tag: bool,
}

/// What a publishing run did.
#[derive(Debug)]
pub(crate) struct Outcome {
    /// Events numbered per channel (published or attempted).
    pub issued: Vec<u64>,
    /// 2xx answers.
    pub acked: u64,
    /// Failed publishes.
    pub failed: u64,
    /// The first failure.
    pub first_error: Option<String>,
    /// Acknowledgement latency (µs).
    pub ack: Histogram<u64>,
    /// From the first ticket to the last answer.
    pub elapsed: Duration,
}

struct Shared {
    ticket: AtomicU64,
    counters: Vec<AtomicU64>,
}

/// Publishes per the plan.
pub(crate) async fn run(plan: Plan) -> Outcome {
    let shared = Arc::new(Shared {
        ticket: AtomicU64::new(0),
        counters: plan.paths.iter().map(|_| AtomicU64::new(0)).collect(),
    });
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..plan.publishers.max(1))
        .map(|k| {
            let mut plan = plan.clone();
            if !plan.nodes.is_empty() {
                let (addr, host) = plan.nodes[k % plan.nodes.len()].clone();
                plan.addr = addr;
                plan.host = host;
            }
            tokio::spawn(publisher(plan, shared.clone(), t0))
        })
        .collect();
    let mut out = Outcome {
        issued: Vec::new(),
        acked: 0,
        failed: 0,
        first_error: None,
        ack: histogram(),
        elapsed: Duration::ZERO,
    };
    for t in tasks {
        match t.await {
            Ok(r) => {
                out.acked += r.acked;
                out.failed += r.failed;
                let _ = out.ack.add(&r.ack);
                if out.first_error.is_none() {
                    out.first_error = r.first_error;
                }
            }
            Err(e) => {
                out.failed += 1;
                out.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    out.elapsed = t0.elapsed();
    out.issued = shared
        .counters
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .collect();
    out
}

struct One {
    acked: u64,
    failed: u64,
    first_error: Option<String>,
    ack: Histogram<u64>,
}

async fn publisher(plan: Plan, shared: Arc<Shared>, t0: Instant) -> One {
    let mut one = One {
        acked: 0,
        failed: 0,
        first_error: None,
        ack: histogram(),
    };
    let mut client = Client::new(plan.addr);
    let mut data = Vec::with_capacity(plan.bytes + 32);
    let mut body = Vec::new();
    let n = plan.paths.len() as u64;
    loop {
        let i = shared.ticket.fetch_add(1, Ordering::Relaxed);
        if i >= plan.total || plan.max_time.is_some_and(|m| t0.elapsed() >= m) {
            break;
        }
        if plan.rate > 0.0 {
            let due = t0 + Duration::from_secs_f64(i as f64 / plan.rate);
            tokio::time::sleep_until(due.into()).await;
        }
        let c = (i % n) as usize;
        let seq = shared.counters[c].fetch_add(1, Ordering::Relaxed) + 1;
        let tag = plan.tag.then_some(c);
        payload::encode_tagged(&mut data, seq, payload::now_us(), tag, plan.bytes);
        plan.wire.wrap(&mut data);
        let req = request(
            "POST",
            &plan.host,
            &plan.paths[c],
            &[("Content-Type", plan.wire.content_type())],
            &data,
        );
        let t = Instant::now();
        match client.call(&req, &mut body).await {
            Ok(status) if (200..300).contains(&status) => {
                one.ack.saturating_record(t.elapsed().as_micros() as u64);
                one.acked += 1;
            }
            Ok(status) => {
                one.failed += 1;
                one.first_error.get_or_insert_with(|| {
                    format!(
                        "publish answered {status}: {}",
                        String::from_utf8_lossy(&body)
                    )
                });
            }
            Err(e) => {
                one.failed += 1;
                one.first_error
                    .get_or_insert_with(|| format!("publish: {e:#}"));
            }
        }
    }
    one
}

/// Publishes warm-up event `n` to every channel (16 connections at most), each tagged
/// with its channel's index in `paths`.
///
/// # Errors
/// A warm-up publish failed.
pub(crate) async fn warm_round(
    addr: SocketAddr,
    host: &str,
    paths: &Arc<Vec<String>>,
    n: u64,
    wire: Wire,
) -> Result<()> {
    let lanes = paths.len().clamp(1, 16);
    let tasks: Vec<_> = (0..lanes)
        .map(|lane| {
            let paths = paths.clone();
            let host = host.to_owned();
            tokio::spawn(async move {
                let mut client = Client::new(addr);
                let mut data = Vec::new();
                let mut body = Vec::new();
                for (c, path) in paths.iter().enumerate().skip(lane).step_by(lanes) {
                    payload::encode_warm(&mut data, n, c);
                    wire.wrap(&mut data);
                    let req = request(
                        "POST",
                        &host,
                        path,
                        &[("Content-Type", wire.content_type())],
                        &data,
                    );
                    let status = client.call(&req, &mut body).await?;
                    if !(200..300).contains(&status) {
                        anyhow::bail!(
                            "warm-up publish answered {status}: {}",
                            String::from_utf8_lossy(&body)
                        );
                    }
                }
                Ok(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    Ok(())
}
