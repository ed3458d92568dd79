//! The `presence` scenario (issue 21, "Tests and measurement"): members of
//! one channel join and leave over a period while watchers follow the
//! channel's presence notices; join and leave delivery latency and the
//! server's CPU.
//!
//! Member `i` (of `--members`) opens an SSE stream of the channel with
//! `client_id=m<i>` at `i × --duration-ms / --members`, holds it
//! `--hold-ms` once the server registered it (its `id:` frame arrived),
//! then closes it. Each of `--watchers` follows the channel with
//! `presence=true`. A join's delivery time runs from the moment the
//! member's request was written to the moment a watcher read the notice; a
//! leave's from the moment the member's socket was closed (so it includes
//! the namespace's `presence_linger_ms`: run the server with 0 to measure
//! delivery alone). Counts are exact when every watcher got exactly one
//! join and then one leave of every member.
//!
//! The channel is `<--namespace>:<prefix>p`; the server's configuration
//! must give that namespace `presence = true` (e.g. `[namespaces.presence]
//! presence = true` and `presence_linger_ms = 0`). Streams are HTTP/1.0
//! (no chunked framing), gapless only.

use crate::payload::now_us;
use crate::procstat::{Meter, Server};
use crate::report::{histogram, Record};
use crate::Common;
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// `presence` arguments.
#[derive(Debug, Args)]
pub(crate) struct PresenceArgs {
    /// Members that join and leave.
    #[arg(long, default_value_t = 10_000)]
    pub members: usize,
    /// The period over which members arrive, in milliseconds.
    #[arg(long, default_value_t = 60_000)]
    pub duration_ms: u64,
    /// How long each member stays once registered, in milliseconds.
    #[arg(long, default_value_t = 5_000)]
    pub hold_ms: u64,
    /// Subscribers that follow the notices.
    #[arg(long, default_value_t = 1)]
    pub watchers: usize,
    /// The namespace of the channel (its table must have `presence = true`).
    #[arg(long, default_value = "presence")]
    pub namespace: String,
}

/// What one watcher read: per member, when its join and its leave arrived.
#[derive(Default)]
struct Seen {
    joins: Vec<Option<Instant>>,
    leaves: Vec<Option<Instant>>,
    /// Notices that break the rules (a second join, a leave before the join).
    problems: Vec<String>,
}

/// Opens an HTTP/1.0 SSE stream at `target` and reads until its `id:`
/// frame (the server registered it); returns the reader.
async fn open(addr: &str, target: &str) -> Result<BufReader<TcpStream>> {
    let mut s = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connect {addr}"))?;
    s.write_all(
        format!("GET {target} HTTP/1.0\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line).await?;
    if !line.contains(" 200 ") {
        bail!("GET {target}: {}", line.trim_end());
    }
    loop {
        line.clear();
        if r.read_line(&mut line).await? == 0 {
            bail!("GET {target}: the stream ended before its id: frame");
        }
        if line.starts_with("id:") {
            return Ok(r);
        }
    }
}

/// Reads a watcher's stream until `stop`, noting each notice in `seen`.
async fn watch(mut r: BufReader<TcpStream>, seen: Arc<Mutex<Seen>>) -> Result<()> {
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(data.trim_end())
            .map_err(|e| anyhow!("presence notice is not JSON ({e}): {data}"))?;
        let now = Instant::now();
        let (Some(action), Some(id)) = (v["action"].as_str(), v["id"].as_str()) else {
            continue;
        };
        let Some(i) = id.strip_prefix('m').and_then(|n| n.parse::<usize>().ok()) else {
            continue;
        };
        let mut s = seen.lock();
        if i >= s.joins.len() {
            continue;
        }
        match action {
            "join" if s.joins[i].is_none() => s.joins[i] = Some(now),
            "leave" if s.joins[i].is_some() && s.leaves[i].is_none() => s.leaves[i] = Some(now),
            other => {
                let p = format!("member m{i}: unexpected {other}");
                s.problems.push(p);
            }
        }
    }
}

/// Runs the scenario.
///
/// # Errors
/// A watcher or member could not connect, or the notices did not all
/// arrive within `--timeout-secs`.
pub(crate) async fn presence(c: &Common, a: &PresenceArgs) -> Result<Record> {
    let label = c.label.clone().unwrap_or_else(|| "gapless".to_owned());
    let mut r = Record::new(
        "presence",
        &label,
        format!(
            "members={} duration_ms={} hold_ms={} watchers={}",
            a.members, a.duration_ms, a.hold_ms, a.watchers
        ),
    );
    let prefix = c
        .prefix
        .clone()
        .unwrap_or_else(|| format!("b{:x}-", now_us()));
    let channel = format!("{}:{prefix}p", a.namespace);
    let timeout = Duration::from_secs(c.timeout_secs.max(1));
    let addr = c.addr.clone();
    let n = a.members;
    let mut watchers = Vec::new();
    for _ in 0..a.watchers {
        let stream = open(&addr, &format!("/v1/channels/{channel}/sse?presence=true")).await?;
        let seen = Arc::new(Mutex::new(Seen {
            joins: vec![None; n],
            leaves: vec![None; n],
            problems: Vec::new(),
        }));
        let task = tokio::spawn(watch(stream, seen.clone()));
        watchers.push((seen, task));
    }
    let server = Server {
        pids: c.server_pids.clone(),
    };
    let meter = Meter::start(&server)?;
    let gate = Arc::new(Semaphore::new(c.connect_concurrency.max(1)));
    let t0 = Instant::now();
    let mut members = Vec::with_capacity(n);
    for i in 0..n {
        let at =
            t0 + Duration::from_millis(a.duration_ms.saturating_mul(i as u64) / n.max(1) as u64);
        let (addr, channel, gate, hold) = (
            addr.clone(),
            channel.clone(),
            gate.clone(),
            Duration::from_millis(a.hold_ms),
        );
        members.push(tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let permit = gate.acquire_owned().await?;
            let sent = Instant::now();
            let stream = open(&addr, &format!("/v1/channels/{channel}/sse?client_id=m{i}")).await?;
            drop(permit);
            tokio::time::sleep(hold).await;
            let closed = Instant::now();
            drop(stream);
            Ok::<_, anyhow::Error>((sent, closed))
        }));
    }
    let mut times = Vec::with_capacity(n);
    for m in members {
        times.push(m.await.context("member task")??);
    }
    // Every watcher has every leave, or the timeout.
    let deadline = Instant::now() + timeout;
    loop {
        let done = watchers
            .iter()
            .all(|(s, _)| s.lock().leaves.iter().all(Option::is_some));
        if done || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let usage = meter.stop()?;
    let mut join = histogram();
    let mut leave = histogram();
    let (mut joins, mut leaves) = (0u64, 0u64);
    for (seen, task) in &watchers {
        task.abort();
        let s = seen.lock();
        for (i, (sent, closed)) in times.iter().enumerate() {
            if let Some(t) = s.joins[i] {
                joins += 1;
                let _ = join.record(t.saturating_duration_since(*sent).as_micros().max(1) as u64);
            }
            if let Some(t) = s.leaves[i] {
                leaves += 1;
                let _ =
                    leave.record(t.saturating_duration_since(*closed).as_micros().max(1) as u64);
            }
        }
        for p in s.problems.iter().take(5) {
            r.problem(p.clone());
        }
    }
    let want = (n * a.watchers) as u64;
    r.metric("members", n as f64);
    r.metric("watchers", a.watchers as f64);
    r.metric("joins_delivered", joins as f64);
    r.metric("leaves_delivered", leaves as f64);
    r.latency("join_delivery", &join);
    r.latency("leave_delivery", &leave);
    if let Some(s) = usage.server {
        r.metric("server_cpu_ms", s.total_us() as f64 / 1000.0);
        r.metric(
            "server_cpu_us_per_member",
            s.total_us() as f64 / n.max(1) as f64,
        );
        r.metric(
            "server_cpu_cores",
            s.total_us() as f64 / 1e6 / usage.wall_s.max(1e-9),
        );
    }
    r.metric("wall_s", usage.wall_s);
    if joins != want {
        r.problem(format!("{joins} joins delivered of {want}"));
    }
    if leaves != want {
        r.problem(format!("{leaves} leaves delivered of {want}"));
    }
    Ok(r)
}
