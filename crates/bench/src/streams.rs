//! The `streams` scenario: what many Durable Streams cost, each created and then written by
//! its own idempotent producer, against plain appends in the same run.
//!
//! 1. **Create** `--streams N` streams (`PUT`, the wire's content type) over `--connections C`
//!    keep-alive connections: server CPU per create, RSS growth per stream.
//! 2. **Producer appends**: `--appends-per-stream A` appends to every stream with
//!    `Producer-Id: p<i>`, `Producer-Epoch: 0`, `Producer-Seq: 0, 1, …`, round robin over
//!    the streams: writer `w` owns streams `w, w+C, …` (so a stream's seqs go in order, one
//!    writer at a time) and appends seq `k` to each of them before seq `k+1`. Every answer
//!    must be 200. Server CPU per append, appends/s, ack latency, RSS per stream.
//! 3. **Plain appends**, the baseline: as many appends again without producer headers, to the
//!    same streams (`--kind gapless`: the same count of `POST /v1/channels/<ch>/events`, the
//!    only phase there). Server CPU per append as its own row, and the ratio
//!    `producer_over_plain_cpu`.
//! 4. **Exactness**: a sample of streams (`--check-sample`, plus the first and the last) is
//!    read back from offset `-1`: each holds exactly its appends, in order.
//!
//! With `--probe-file` the scenario writes the last stream's path and its `Stream-Next-Offset`
//! (a `HEAD` after the appends) for [`restart_probe`], which `bench/compare` runs after
//! restarting the server on the same data: the time until that `HEAD` answers 200 with the
//! same offset is added to the run's record (`restart_to_first_answer_ms`).

use crate::http::{request, Client};
use crate::payload::{self, Wire};
use crate::procstat::{Meter, Usage};
use crate::report::{histogram, Record};
use crate::scenario::{delivery_problems, ds_read, ms, per_s, Ctx};
use crate::sub::Tracker;
use crate::{Common, Kind};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use hdrhistogram::Histogram;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Failed answers whose bodies are kept (and printed) per phase.
const FIRST_FAILURES: usize = 5;

/// `streams` arguments.
#[derive(Debug, Args)]
pub(crate) struct StreamsArgs {
    /// Streams to create (channels with `--kind gapless`).
    #[arg(long, default_value_t = 1000)]
    pub streams: usize,
    /// Concurrent keep-alive HTTP connections, for the creates and for each append phase.
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// Appends with idempotent-producer headers per stream (and as many plain appends).
    #[arg(long, default_value_t = 3)]
    pub appends_per_stream: u64,
    /// Event data size in bytes.
    #[arg(long, default_value_t = 100)]
    pub bytes: usize,
    /// Streams read back from offset `-1` for the exactness check, spread evenly, besides the
    /// first and the last; 0 = every stream.
    #[arg(long, default_value_t = 200)]
    pub check_sample: usize,
    /// Wait this long after a phase before reading the server's RSS, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub settle_ms: u64,
    /// Write `PATH NEXT_OFFSET` of the last stream here after the appends (Durable Streams
    /// kinds), for `restart-probe` after a restart (`bench/compare`).
    #[arg(long)]
    pub probe_file: Option<PathBuf>,
}

/// `restart-probe` arguments.
#[derive(Debug, Args)]
pub(crate) struct RestartProbeArgs {
    /// The file `streams --probe-file` wrote: `PATH NEXT_OFFSET`.
    #[arg(long)]
    pub probe_file: PathBuf,
    /// When the server was started again, Unix nanoseconds (`date +%s%N` just before).
    #[arg(long)]
    pub started_ns: u64,
    /// How long the server took to exit after SIGTERM, in milliseconds (recorded as given).
    #[arg(long)]
    pub stop_ms: Option<f64>,
}

/// One phase's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `PUT` with the wire's content type; 200 or 201.
    Create,
    /// `POST` with producer headers (seq = round); exactly 200.
    Producer,
    /// `POST` without them; any 2xx. Payload numbers start after `base`.
    Plain { base: u64 },
}

/// What one phase needs on every connection.
#[derive(Debug, Clone)]
struct Job {
    addr: SocketAddr,
    host: String,
    paths: Arc<Vec<String>>,
    wire: Wire,
    bytes: usize,
    op: Op,
    rounds: u64,
    connections: usize,
    timeout: Duration,
}

/// What one phase did.
#[derive(Debug)]
struct Phase {
    ok: u64,
    failed: u64,
    /// The first few failures: status (or error) and body.
    failures: Vec<String>,
    /// Answer time of each request, µs.
    ack: Histogram<u64>,
    elapsed: Duration,
    usage: Usage,
}

/// Runs `job` over its connections, metering the server.
async fn run_phase(ctx: &Ctx, job: Job) -> Result<Phase> {
    let meter = Meter::start(&ctx.server)?;
    let t0 = Instant::now();
    let lanes = job.connections.clamp(1, job.paths.len().max(1));
    let tasks: Vec<_> = (0..lanes)
        .map(|w| tokio::spawn(lane(job.clone(), w, lanes)))
        .collect();
    let (mut ok, mut failed, mut failures, mut ack) = (0, 0, Vec::new(), histogram());
    for t in tasks {
        match t.await {
            Ok(l) => {
                ok += l.ok;
                failed += l.failed;
                // Both histograms have the same bounds: adding cannot fail.
                let _ = ack.add(&l.ack);
                let room = FIRST_FAILURES.saturating_sub(failures.len());
                failures.extend(l.failures.into_iter().take(room));
            }
            Err(e) => {
                failed += 1;
                failures.push(format!("writer task: {e}"));
            }
        }
    }
    let elapsed = t0.elapsed();
    Ok(Phase {
        ok,
        failed,
        failures,
        ack,
        elapsed,
        usage: meter.stop()?,
    })
}

/// What one connection did.
struct Lane {
    ok: u64,
    failed: u64,
    failures: Vec<String>,
    ack: Histogram<u64>,
}

/// Connection `w` of `lanes`: streams `w, w+lanes, …`, round by round.
async fn lane(job: Job, w: usize, lanes: usize) -> Lane {
    let mut l = Lane {
        ok: 0,
        failed: 0,
        failures: Vec::new(),
        ack: histogram(),
    };
    let mut client = Client::new(job.addr);
    let mut data = Vec::with_capacity(job.bytes + 32);
    let mut body = Vec::new();
    let content_type = job.wire.content_type();
    for round in 0..job.rounds {
        for s in (w..job.paths.len()).step_by(lanes) {
            let path = &job.paths[s];
            let (req, ok): (Vec<u8>, fn(u16) -> bool) = match job.op {
                Op::Create => (
                    request(
                        "PUT",
                        &job.host,
                        path,
                        &[("Content-Type", content_type)],
                        b"",
                    ),
                    |st| matches!(st, 200 | 201),
                ),
                Op::Producer => {
                    payload::encode(&mut data, round + 1, payload::now_us(), job.bytes);
                    job.wire.wrap(&mut data);
                    let (id, seq) = (format!("p{s}"), round.to_string());
                    let headers = [
                        ("Content-Type", content_type),
                        ("Producer-Id", id.as_str()),
                        ("Producer-Epoch", "0"),
                        ("Producer-Seq", seq.as_str()),
                    ];
                    (request("POST", &job.host, path, &headers, &data), |st| {
                        st == 200
                    })
                }
                Op::Plain { base } => {
                    payload::encode(&mut data, base + round + 1, payload::now_us(), job.bytes);
                    job.wire.wrap(&mut data);
                    (
                        request(
                            "POST",
                            &job.host,
                            path,
                            &[("Content-Type", content_type)],
                            &data,
                        ),
                        |st| (200..300).contains(&st),
                    )
                }
            };
            let t = Instant::now();
            match tokio::time::timeout(job.timeout, client.call(&req, &mut body)).await {
                Ok(Ok(status)) if ok(status) => {
                    l.ack.saturating_record(t.elapsed().as_micros() as u64);
                    l.ok += 1;
                }
                Ok(Ok(status)) => {
                    l.failed += 1;
                    if l.failures.len() < FIRST_FAILURES {
                        l.failures.push(format!(
                            "{path} answered {status}: {}",
                            String::from_utf8_lossy(&body)
                        ));
                    }
                }
                Ok(Err(e)) => {
                    l.failed += 1;
                    if l.failures.len() < FIRST_FAILURES {
                        l.failures.push(format!("{path}: {e:#}"));
                    }
                }
                Err(_) => {
                    l.failed += 1;
                    client = Client::new(job.addr);
                    if l.failures.len() < FIRST_FAILURES {
                        l.failures
                            .push(format!("{path}: no answer within {:?}", job.timeout));
                    }
                }
            }
        }
    }
    l
}

/// Records a phase's failures as a problem, and prints the first few answers.
fn phase_problems(r: &mut Record, what: &str, p: &Phase) {
    if p.failed == 0 {
        return;
    }
    eprintln!("streams: {} {what} failed; the first:", p.failed);
    for f in &p.failures {
        eprintln!("  {f}");
    }
    r.problem(format!(
        "{} {what} failed; first: {}",
        p.failed,
        p.failures.join(" | ")
    ));
}

/// Server CPU per request of a phase, and the machine's noise gauge over it.
fn phase_cpu(r: &mut Record, unit: &str, p: &Phase) {
    if let Some(s) = p.usage.server {
        r.metric(
            &format!("server_cpu_us_per_{unit}"),
            s.total_us() as f64 / p.ok.max(1) as f64,
        );
    }
    let others = p
        .usage
        .machine_us
        .saturating_sub(p.usage.own.total_us() + p.usage.server.map_or(0, |s| s.total_us()));
    r.metric(
        &format!("{unit}_other_cpu_cores"),
        others as f64 / 1e6 / p.usage.wall_s.max(1e-9),
    );
}

/// Server RSS after `settle_ms`, KiB (`None` without a server pid).
async fn settled_rss(ctx: &Ctx, settle_ms: u64) -> Result<Option<u64>> {
    tokio::time::sleep(Duration::from_millis(settle_ms)).await;
    ctx.server.rss_kb()
}

/// `(after - before) / n` in KiB, as a figure, when both readings exist.
fn rss_per(r: &mut Record, name: &str, before: Option<u64>, after: Option<u64>, n: usize) {
    if let (Some(b), Some(a)) = (before, after) {
        r.metric(name, (a as f64 - b as f64) / n.max(1) as f64);
    }
}

/// The streams read back: `sample` spread evenly over `n`, and the first and the last.
fn sample_indices(n: usize, sample: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    if sample == 0 || sample + 2 >= n {
        return (0..n).collect();
    }
    let mut v: Vec<usize> = (0..sample).map(|k| (k * n) / sample).collect();
    v.push(0);
    v.push(n - 1);
    v.sort_unstable();
    v.dedup();
    v
}

/// Creates, appends to with producers and plainly, and checks `--streams` streams.
///
/// # Errors
/// A target without streams or channels (Nchan), the server vanished, or a read-back failed.
pub(crate) async fn streams(ctx: &Ctx, a: &StreamsArgs) -> Result<Record> {
    if !ctx.ds && ctx.kind != Kind::Gapless {
        bail!("streams needs a Durable Streams kind or --kind gapless");
    }
    let n = a.streams.max(1);
    let rounds = a.appends_per_stream;
    let mut r = ctx.record(
        "streams",
        format!(
            "streams={n} connections={} appends_per_stream={rounds} bytes={}",
            a.connections, a.bytes
        ),
    );
    let names: Vec<String> = (0..n)
        .map(|i| {
            if ctx.ds {
                format!("{}st/{i}", ctx.prefix)
            } else {
                format!("{}st-{i}", ctx.prefix)
            }
        })
        .collect();
    let paths = ctx.pub_paths(&names);
    let job = |op| Job {
        addr: ctx.publ.addr,
        host: ctx.publ.host.clone(),
        paths: paths.clone(),
        wire: ctx.wire,
        bytes: a.bytes,
        op,
        rounds: if op == Op::Create { 1 } else { rounds },
        connections: a.connections,
        timeout: ctx.timeout,
    };
    r.metric("streams", n as f64);
    let rss0 = settled_rss(ctx, 0).await?;

    // 1. Create (Durable Streams only: gapless's channels need none).
    let mut produced = 0;
    if ctx.ds {
        let create = run_phase(ctx, job(Op::Create)).await?;
        let rss1 = settled_rss(ctx, a.settle_ms).await?;
        r.metric("streams_created", create.ok as f64);
        r.metric("creates_per_s", per_s(create.ok, create.elapsed));
        r.quantiles("create", &create.ack);
        phase_cpu(&mut r, "create", &create);
        rss_per(&mut r, "rss_kb_per_stream_created", rss0, rss1, n);
        phase_problems(&mut r, "create(s)", &create);
        if create.ok == 0 {
            bail!(
                "no stream could be created; first: {}",
                create.failures.join(" | ")
            );
        }

        // 2. Appends with producer headers.
        let prod = run_phase(ctx, job(Op::Producer)).await?;
        let rss2 = settled_rss(ctx, a.settle_ms).await?;
        r.metric("producer_appends_acked", prod.ok as f64);
        r.metric("producer_appends_per_s", per_s(prod.ok, prod.elapsed));
        r.latency("ack", &prod.ack);
        phase_cpu(&mut r, "producer_append", &prod);
        rss_per(&mut r, "rss_kb_per_stream_after_appends", rss0, rss2, n);
        phase_problems(&mut r, "producer append(s) (each must answer 200)", &prod);
        produced = rounds;
    }

    // 3. The plain baseline: as many appends without producer headers.
    let plain = run_phase(ctx, job(Op::Plain { base: produced })).await?;
    let rss3 = settled_rss(ctx, a.settle_ms).await?;
    r.metric("plain_appends_acked", plain.ok as f64);
    r.metric("plain_appends_per_s", per_s(plain.ok, plain.elapsed));
    r.quantiles("plain_ack", &plain.ack);
    phase_cpu(&mut r, "plain_append", &plain);
    rss_per(&mut r, "rss_kb_per_stream_after_plain", rss0, rss3, n);
    phase_problems(&mut r, "plain append(s)", &plain);
    let cpu_of =
        |r: &Record, name: &str| r.metrics.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
    if let (Some(p), Some(q)) = (
        cpu_of(&r, "server_cpu_us_per_producer_append"),
        cpu_of(&r, "server_cpu_us_per_plain_append"),
    ) {
        if q > 0.0 {
            r.metric("producer_over_plain_cpu", p / q);
        }
    }

    // 4. Read a sample back: every append once, in order.
    let expected = produced + rounds;
    let sample = sample_indices(n, a.check_sample);
    r.metric("streams_checked", sample.len() as f64);
    let mut client = Client::new(ctx.publ.addr);
    if ctx.ds {
        let mut trackers = Vec::with_capacity(sample.len());
        let mut page_time = histogram();
        for &i in &sample {
            let mut t = Tracker::new(i, i);
            ds_read(
                ctx,
                &mut client,
                &names[i],
                &mut t,
                &mut page_time,
                expected + 10,
            )
            .await?;
            trackers.push(t);
        }
        delivery_problems(&mut r, &trackers, |_| expected, true);
        if let Some(file) = &a.probe_file {
            let path = &paths[n - 1];
            let head = client
                .head(&request("HEAD", &ctx.publ.host, path, &[], b""))
                .await?;
            let offset = match (head.status, head.next_offset) {
                (200, Some(o)) => o,
                (status, _) => bail!("HEAD {path} answered {status} without Stream-Next-Offset"),
            };
            std::fs::write(file, format!("{path} {offset}\n"))
                .with_context(|| format!("write {}", file.display()))?;
        }
    } else {
        // gapless's own API: each sampled channel's head is its count of events.
        let info = ctx
            .info
            .as_ref()
            .ok_or_else(|| anyhow!("no channel info URL to check the counts"))?;
        let mut body = Vec::new();
        let mut wrong = 0;
        for &i in &sample {
            let req = request("GET", &info.host, &info.path_for(&names[i], 0), &[], b"");
            let status = client.call(&req, &mut body).await?;
            let head = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("head").and_then(serde_json::Value::as_u64));
            if status != 200 || head != Some(expected) {
                wrong += 1;
            }
        }
        if wrong > 0 {
            r.problem(format!(
                "{wrong} sampled channel(s) hold a number of events other than {expected}"
            ));
        }
    }
    Ok(r)
}

/// After a restart: polls `HEAD` of the probe stream until it answers 200 with the offset the
/// probe file holds; adds `restart_to_first_answer_ms` (from `--started-ns`), and
/// `restart_stop_ms` when given, to the last record of `--json` and prints them. A server that
/// never answers so within `--timeout-secs` makes the record inexact.
///
/// # Errors
/// The probe or results file is unreadable or malformed.
pub(crate) async fn restart_probe(common: &Common, a: &RestartProbeArgs) -> Result<bool> {
    let text = std::fs::read_to_string(&a.probe_file)
        .with_context(|| format!("read {}", a.probe_file.display()))?;
    let (path, offset) = text
        .trim()
        .split_once(' ')
        .ok_or_else(|| anyhow!("{}: not `PATH OFFSET`", a.probe_file.display()))?;
    let url = crate::http::UrlTemplate::parse(&format!("http://{}{path}", common.addr))?;
    let timeout = Duration::from_secs(common.timeout_secs.max(1));
    let t0 = Instant::now();
    let mut last = String::from("no answer");
    let mut answered = None;
    while t0.elapsed() < timeout {
        // A fresh connection per try: the first ones are refused until the server listens.
        let mut client = Client::new(url.addr);
        let req = request("HEAD", &url.host, &url.path, &[], b"");
        match tokio::time::timeout(Duration::from_secs(5), client.head(&req)).await {
            Ok(Ok(h)) if h.status == 200 && h.next_offset.as_deref() == Some(offset) => {
                answered = Some(payload::now_us());
                break;
            }
            Ok(Ok(h)) => {
                last = format!("answered {} with offset {:?}", h.status, h.next_offset);
            }
            Ok(Err(e)) => last = format!("{e:#}"),
            Err(_) => last = "no answer within 5 s".to_owned(),
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let json = common
        .json
        .as_ref()
        .ok_or_else(|| anyhow!("restart-probe needs --json (the run's results file)"))?;
    let exact = amend_last(json, |r| {
        if let Some(s) = a.stop_ms {
            r.metric("restart_stop_ms", s);
            println!("  {:<34} {}", "restart_stop_ms", crate::report::fmt_num(s));
        }
        match answered {
            Some(us) => {
                let v = ms((us * 1000).saturating_sub(a.started_ns) / 1000);
                r.metric("restart_to_first_answer_ms", v);
                println!(
                    "  {:<34} {}",
                    "restart_to_first_answer_ms",
                    crate::report::fmt_num(v)
                );
            }
            None => {
                let p = format!("after the restart, HEAD {path} never answered 200 with Stream-Next-Offset {offset} within {timeout:?}; last: {last}");
                println!("  COUNT PROBLEM: {p}");
                r.problem(p);
            }
        }
        r.exact
    })?;
    Ok(exact)
}

/// Rewrites the last record of a JSON-lines results file through `f`; returns what `f` did.
fn amend_last(path: &Path, f: impl FnOnce(&mut Record) -> bool) -> Result<bool> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let mut lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let last = lines
        .pop()
        .ok_or_else(|| anyhow!("{} holds no result", path.display()))?;
    let mut rec: Record =
        serde_json::from_str(last).with_context(|| format!("parse {}", path.display()))?;
    let out = f(&mut rec);
    let mut new = String::with_capacity(text.len() + 64);
    for l in lines {
        new.push_str(l);
        new.push('\n');
    }
    new.push_str(&serde_json::to_string(&rec).context("encode record")?);
    new.push('\n');
    std::fs::write(path, new).with_context(|| format!("write {}", path.display()))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_holds_first_and_last() {
        let s = sample_indices(1000, 200);
        assert_eq!(s.first(), Some(&0));
        assert_eq!(s.last(), Some(&999));
        assert_eq!(s.len(), 201);
        assert_eq!(sample_indices(50, 200), (0..50).collect::<Vec<_>>());
        assert_eq!(sample_indices(10, 0).len(), 10);
        assert!(sample_indices(0, 5).is_empty());
    }
}
