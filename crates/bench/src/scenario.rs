//! The scenarios. Each returns a [`Record`] with its figures and the result of
//! its exactness check (every event delivered once, nothing failed).
//!
//! Subscribers are known to be attached only when they have received a
//! warm-up event: a server may answer the subscribe request before it routes
//! events to the new stream. Warm-up events carry their own numbering and are
//! never counted as deliveries.
//!
//! Against a Durable Streams target (`--kind electric|dsnode|gapless-ds`) every
//! stream a scenario uses is created with `PUT` first; the publish check reads
//! every stream back from offset `-1`, and `history` is the protocol's
//! catch-up read (`GET ?offset=…` paging on `Stream-Next-Offset` until
//! `Stream-Up-To-Date`).

use crate::http::{request, Client, UrlTemplate};
use crate::payload::{now_us, Payload, Wire};
use crate::procstat::{self, Meter, Usage};
use crate::publisher::{self, Outcome, Plan};
use crate::report::{histogram, Record};
use crate::sub::{self, Board, Tracker};
use crate::{Common, DsType, Kind, Transport};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde::Deserialize;
use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Everything a scenario needs besides its own arguments.
pub(crate) struct Ctx {
    label: String,
    sub: UrlTemplate,
    pub(crate) publ: UrlTemplate,
    pub(crate) history: Option<UrlTemplate>,
    pub(crate) info: Option<UrlTemplate>,
    pub(crate) server: procstat::Server,
    pub(crate) prefix: String,
    gate: Arc<Semaphore>,
    pub(crate) timeout: Duration,
    read_buffer: usize,
    /// How event data travels (`Raw` for gapless and Nchan).
    pub(crate) wire: Wire,
    /// A Durable Streams target: streams are created before a run, followed from an offset.
    pub(crate) ds: bool,
    /// How subscribers follow; with `Ws`, `sub` is the socket's URL (gapless: no `{channel}`).
    pub(crate) transport: Transport,
    /// The gapless WebSocket protocol (`--kind gapless`), else one message per frame.
    ws_gapless: bool,
    /// Cluster mode: every node's address and `Host` (the first is `--addr`);
    /// empty: the templates' own address.
    nodes: Vec<(std::net::SocketAddr, String)>,
    /// The target's kind (for the multi-channel subscribe path).
    pub(crate) kind: Kind,
}

impl Ctx {
    /// Resolves the URL templates.
    ///
    /// # Errors
    /// A template is malformed.
    pub(crate) fn new(c: &Common) -> Result<Self> {
        let a = &c.addr;
        let (mut sub, publ, history, info) = match c.kind {
            Kind::Gapless => (
                format!("http://{a}/v1/channels/{{channel}}/sse"),
                format!("http://{a}/v1/channels/{{channel}}/events"),
                Some(format!(
                    "http://{a}/v1/channels/{{channel}}/events?limit={{limit}}"
                )),
                Some(format!("http://{a}/v1/channels/{{channel}}")),
            ),
            Kind::Nchan => (
                format!("http://{a}/sub/{{channel}}"),
                format!("http://{a}/pub/{{channel}}"),
                None,
                None,
            ),
            Kind::Electric | Kind::Dsnode | Kind::GaplessDs => {
                let p = c.kind.ds_prefix().unwrap_or_default();
                (
                    format!("http://{a}{p}/{{channel}}?offset={{offset}}&live=sse"),
                    format!("http://{a}{p}/{{channel}}"),
                    Some(format!("http://{a}{p}/{{channel}}")),
                    None,
                )
            }
        };
        let ds = c.kind.ds_prefix().is_some();
        if c.transport == Transport::Ws {
            sub = match c.kind {
                Kind::Gapless => format!("http://{a}/v1/ws"),
                Kind::Nchan => format!("http://{a}/ws/{{channel}}"),
                Kind::Electric | Kind::Dsnode | Kind::GaplessDs => {
                    bail!("--transport ws: the Durable Streams kinds have no WebSocket subscribers")
                }
            };
        }
        let wire = match (ds, c.ds_type) {
            (false, _) => Wire::Raw,
            (true, DsType::Json) => Wire::JsonString,
            (true, DsType::Text) => Wire::Line,
        };
        let pick =
            |given: &Option<String>, preset: Option<String>| -> Result<Option<UrlTemplate>> {
                given
                    .clone()
                    .or(preset)
                    .map(|u| UrlTemplate::parse(&u))
                    .transpose()
            };
        let label = c.label.clone().unwrap_or_else(|| c.kind.label().to_owned());
        Ok(Ctx {
            label,
            sub: pick(&c.sub_url, Some(sub))?.ok_or_else(|| anyhow!("no subscribe URL"))?,
            publ: pick(&c.pub_url, Some(publ))?.ok_or_else(|| anyhow!("no publish URL"))?,
            history: pick(&c.history_url, history)?,
            info: pick(&c.info_url, info)?,
            server: procstat::Server {
                pids: c.server_pids.clone(),
            },
            prefix: c
                .prefix
                .clone()
                .unwrap_or_else(|| format!("b{:x}-", now_us())),
            gate: Arc::new(Semaphore::new(c.connect_concurrency.max(1))),
            timeout: Duration::from_secs(c.timeout_secs.max(1)),
            read_buffer: c.read_buffer,
            wire,
            ds,
            transport: c.transport,
            ws_gapless: c.kind == Kind::Gapless,
            nodes: if c.nodes.is_empty() {
                Vec::new()
            } else {
                std::iter::once(a)
                    .chain(c.nodes.iter())
                    .map(|n| {
                        let t = UrlTemplate::parse(&format!("http://{n}/"))?;
                        Ok((t.addr, t.host))
                    })
                    .collect::<Result<Vec<_>>>()?
            },
            kind: c.kind,
        })
    }

    /// The subscribe path that follows every channel of `names` on one SSE connection:
    /// gapless `/v1/sse?channel=A&channel=B…` (docs/protocol.md), Nchan `/msub/A,B,…`
    /// (`nchan_channel_id_split_delimiter ","`, up to 255 channels; bench/nchan/nginx.conf.in);
    /// `None` for a target that follows one stream per URL (the Durable Streams kinds).
    pub(crate) fn multi_path(&self, names: &[&str]) -> Option<String> {
        match self.kind {
            Kind::Gapless => {
                let q: Vec<String> = names.iter().map(|n| format!("channel={n}")).collect();
                Some(format!("/v1/sse?{}", q.join("&")))
            }
            Kind::Nchan => Some(format!("/msub/{}", names.join(","))),
            Kind::Electric | Kind::Dsnode | Kind::GaplessDs => None,
        }
    }

    /// The names of `n` channels (streams) for this run; on a Durable Streams target each
    /// stream is created (`PUT` with the wire's content type, 16 at a time) first.
    pub(crate) async fn streams(&self, tag: &str, n: usize) -> Result<Vec<String>> {
        let names: Vec<String> = (0..n).map(|i| format!("{}{tag}{i}", self.prefix)).collect();
        if !self.ds {
            return Ok(names);
        }
        let lanes = n.clamp(1, 16);
        let paths = self.pub_paths(&names);
        let tasks: Vec<_> = (0..lanes)
            .map(|lane| {
                let (paths, addr, host) = (paths.clone(), self.publ.addr, self.publ.host.clone());
                let content_type = self.wire.content_type();
                tokio::spawn(async move {
                    let mut client = Client::new(addr);
                    let mut body = Vec::new();
                    for path in paths.iter().skip(lane).step_by(lanes) {
                        let req =
                            request("PUT", &host, path, &[("Content-Type", content_type)], b"");
                        let status = client.call(&req, &mut body).await?;
                        if !matches!(status, 200 | 201) {
                            bail!(
                                "create stream {path} answered {status}: {}",
                                String::from_utf8_lossy(&body)
                            );
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for t in tasks {
            t.await.context("stream creation task")??;
        }
        Ok(names)
    }

    pub(crate) fn pub_paths(&self, names: &[String]) -> Arc<Vec<String>> {
        Arc::new(names.iter().map(|n| self.publ.path_for(n, 0)).collect())
    }

    pub(crate) fn plan(
        &self,
        paths: Arc<Vec<String>>,
        total: u64,
        rate: f64,
        bytes: usize,
        publishers: usize,
        max_secs: Option<f64>,
    ) -> Plan {
        Plan {
            addr: self.publ.addr,
            host: self.publ.host.clone(),
            nodes: self.nodes.clone(),
            paths,
            total,
            rate,
            max_time: max_secs.map(Duration::from_secs_f64),
            bytes,
            publishers,
            wire: self.wire,
            tag: false,
        }
    }

    pub(crate) fn record(&self, scenario: &str, params: String) -> Record {
        Record::new(scenario, &self.label, params)
    }

    /// A record of a scenario with subscribers: its parameters name the transport.
    pub(crate) fn sub_record(&self, scenario: &str, params: String) -> Record {
        let params = format!("{params} transport={}", self.transport.name());
        Record::new(scenario, &self.label, params)
    }
}

/// A set of subscriber tasks and their board.
pub(crate) struct Group {
    pub(crate) board: Arc<Board>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<Tracker>>,
}

impl Group {
    /// Subscribes tracker `i` to channel `names[trackers[i].channel]`, resuming
    /// after the tracker's last event ID when `resume` is set.
    pub(crate) fn spawn(
        ctx: &Ctx,
        names: &[String],
        trackers: Vec<Tracker>,
        resume: bool,
    ) -> Group {
        let board = Board::new(trackers.len(), ctx.nodes.len());
        let stop = CancellationToken::new();
        let tasks = trackers
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                let path = if t.follows.is_empty() {
                    ctx.sub.path_for(&names[t.channel], 0)
                } else {
                    let followed: Vec<&str> = t.follows.iter().map(|&c| &*names[c]).collect();
                    // multi() checks that the target has a multi-channel path first.
                    ctx.multi_path(&followed).unwrap_or_default()
                };
                let last = (resume && !t.last_event_id.is_empty()).then(|| t.last_event_id.clone());
                let (addr, host) = match ctx.nodes.len() {
                    0 => (ctx.sub.addr, &ctx.sub.host),
                    n => (ctx.nodes[i % n].0, &ctx.nodes[i % n].1),
                };
                let target = if ctx.transport == Transport::Ws {
                    let mode = if ctx.ws_gapless {
                        sub::WsSub::Gapless {
                            channel: names[t.channel].clone(),
                        }
                    } else {
                        sub::WsSub::Raw
                    };
                    sub::Target::ws(addr, host, &path, mode, last.as_deref(), ctx.read_buffer)
                } else if ctx.ds {
                    // Resuming uses the tracker's last control offset (run() reads it).
                    sub::Target::ds(addr, host, &path, ctx.wire, ctx.read_buffer)
                } else {
                    sub::Target::sse(addr, host, &path, last.as_deref(), ctx.read_buffer)
                };
                sub::spawn(target, t, board.clone(), ctx.gate.clone(), stop.clone())
            })
            .collect();
        Group { board, stop, tasks }
    }

    pub(crate) fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Drops every connection and returns the trackers.
    pub(crate) async fn finish(self) -> Result<Vec<Tracker>> {
        self.stop.cancel();
        let mut out = Vec::with_capacity(self.tasks.len());
        for t in self.tasks {
            out.push(t.await.context("subscriber task")?);
        }
        Ok(out)
    }

    /// Publishes warm-up rounds until every subscriber has received one, then
    /// waits until all have the last round. Returns the last round's number.
    pub(crate) async fn warm_up(&self, ctx: &Ctx, paths: &Arc<Vec<String>>) -> Result<u64> {
        let start = Instant::now();
        let all_at_least = |n: u64| {
            self.board
                .warm
                .iter()
                .all(|w| w.load(Ordering::Relaxed) >= n)
        };
        let mut n = 0;
        'rounds: loop {
            n += 1;
            publisher::warm_round(ctx.publ.addr, &ctx.publ.host, paths, n, ctx.wire).await?;
            let round = Instant::now();
            while round.elapsed() < Duration::from_millis(500) {
                if all_at_least(1) {
                    break 'rounds;
                }
                self.check_alive()?;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if start.elapsed() > ctx.timeout {
                bail!(
                    "warm-up: not every subscriber received an event within {:?}",
                    ctx.timeout
                );
            }
        }
        while !all_at_least(n) {
            self.check_alive()?;
            if start.elapsed() > ctx.timeout {
                bail!("warm-up: round {n} did not reach every subscriber");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(n)
    }

    pub(crate) fn check_alive(&self) -> Result<()> {
        let failed = self.board.failed.load(Ordering::Relaxed);
        if failed > 0 {
            bail!(
                "{failed} subscriber(s) failed; first: {}",
                self.board.first_error().unwrap_or_default()
            );
        }
        Ok(())
    }
}

pub(crate) fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

pub(crate) fn per_s(n: u64, d: Duration) -> f64 {
    if d.is_zero() {
        0.0
    } else {
        n as f64 / d.as_secs_f64()
    }
}

/// Adds server and load-tool CPU figures, per `unit` (deliveries, events).
pub(crate) fn cpu_metrics(r: &mut Record, usage: &Usage, count: u64, unit: &str) {
    let n = count.max(1) as f64;
    if let Some(s) = usage.server {
        r.metric(
            &format!("server_cpu_us_per_{unit}"),
            s.total_us() as f64 / n,
        );
        r.metric("server_cpu_ms", ms(s.total_us()));
        if s.total_us() > 0 {
            r.metric(
                "server_kernel_share_pct",
                100.0 * s.sys_us as f64 / s.total_us() as f64,
            );
        }
        r.metric(
            "server_cpu_cores",
            s.total_us() as f64 / 1e6 / usage.wall_s.max(1e-9),
        );
    }
    r.metric(
        &format!("bench_cpu_us_per_{unit}"),
        usage.own.total_us() as f64 / n,
    );
    r.metric(
        "bench_cpu_cores",
        usage.own.total_us() as f64 / 1e6 / usage.wall_s.max(1e-9),
    );
    // CPU used by everything else on the machine: a noise gauge (0 on a quiet machine).
    let others = usage
        .machine_us
        .saturating_sub(usage.own.total_us() + usage.server.map_or(0, |s| s.total_us()));
    r.metric(
        "other_cpu_cores",
        others as f64 / 1e6 / usage.wall_s.max(1e-9),
    );
}

/// Durable Streams SSE figures: `data` and `control` events (with the SSE's measured
/// deliveries per `data` event in the run) and reconnects after the server ended a response.
pub(crate) fn ds_metrics(ctx: &Ctx, r: &mut Record, board: &Board) {
    if !ctx.ds {
        return;
    }
    r.metric(
        "sse_data_events",
        board.data_events.load(Ordering::Relaxed) as f64,
    );
    r.metric(
        "sse_control_events",
        board.control_events.load(Ordering::Relaxed) as f64,
    );
    r.metric(
        "sse_reconnects",
        board.reconnects.load(Ordering::Relaxed) as f64,
    );
}

pub(crate) fn publish_problems(r: &mut Record, o: &Outcome) {
    if o.failed > 0 {
        r.problem(format!(
            "{} publish(es) failed; first: {}",
            o.failed,
            o.first_error.clone().unwrap_or_default()
        ));
    }
}

/// Checks every tracker against the number of events its channel got.
/// Returns the total duplicates.
pub(crate) fn delivery_problems(
    r: &mut Record,
    trackers: &[Tracker],
    expected: impl Fn(&Tracker) -> u64,
    ordered: bool,
) -> u64 {
    let (mut missing, mut short) = (0u64, 0usize);
    let (mut dups, mut with_dups, mut unexpected, mut disorder) = (0u64, 0usize, 0u64, 0u64);
    let mut warm_dups = 0u64;
    let mut errors = Vec::new();
    for t in trackers {
        let e = expected(t);
        let m = t.missing(e);
        if m > 0 {
            missing += m;
            short += 1;
        }
        if t.duplicates + t.warm_duplicates > 0 {
            with_dups += 1;
        }
        dups += t.duplicates;
        warm_dups += t.warm_duplicates;
        unexpected += t.unexpected(e) + t.foreign;
        disorder += t.out_of_order;
        if let Some(err) = &t.error {
            errors.push(format!("subscriber {}: {err}", t.id));
        }
    }
    r.metric("missing", missing as f64);
    r.metric("duplicates", (dups + warm_dups) as f64);
    if missing > 0 {
        r.problem(format!(
            "{missing} event(s) missing at {short} subscriber(s)"
        ));
    }
    if dups + warm_dups > 0 {
        r.problem(format!(
            "{} duplicate(s) ({dups} events, {warm_dups} warm-up events) at {with_dups} subscriber(s)",
            dups + warm_dups
        ));
    }
    if unexpected > 0 {
        r.problem(format!("{unexpected} unexpected event(s)"));
    }
    if ordered && disorder > 0 {
        r.problem(format!("{disorder} event(s) out of order"));
    }
    if !errors.is_empty() {
        r.problem(format!(
            "{} stream(s) ended early; first: {}",
            errors.len(),
            errors[0]
        ));
    }
    dups + warm_dups
}

// ---------------------------------------------------------------- idle

/// `idle` arguments.
#[derive(Debug, Args)]
pub(crate) struct IdleArgs {
    /// Subscribers.
    #[arg(long, default_value_t = 1000)]
    pub subs: usize,
    /// All subscribers on one channel (default: one channel each).
    #[arg(long)]
    pub one_channel: bool,
    /// How long to hold the connections before reading RSS, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub hold_ms: u64,
    /// After the RSS reading, hold the connections this much longer (ms) and
    /// meter the server's CPU over it: what idle subscribers cost while the
    /// server sends only its heartbeats (`idle_server_cpu_us_per_sub_s`).
    /// 0 = not measured.
    #[arg(long, default_value_t = 0)]
    pub idle_cpu_ms: u64,
}

/// N idle subscribers: server RSS per connection, connect time.
///
/// # Errors
/// Subscribers could not attach.
pub(crate) async fn idle(ctx: &Ctx, a: &IdleArgs) -> Result<Record> {
    let mut r = ctx.sub_record(
        "idle",
        format!(
            "subs={} channels={}",
            a.subs,
            if a.one_channel { "one" } else { "distinct" }
        ),
    );
    let names = ctx
        .streams("i", if a.one_channel { 1 } else { a.subs })
        .await?;
    let trackers = (0..a.subs)
        .map(|i| Tracker::new(i, i % names.len()))
        .collect();
    let rss0 = ctx.server.rss_kb()?;
    let own0 = procstat::rss_kb(None)?;
    let t0 = Instant::now();
    let group = Group::spawn(ctx, &names, trackers, false);
    group.board.wait_connected(group.len(), ctx.timeout).await?;
    let all = t0.elapsed();
    tokio::time::sleep(Duration::from_millis(a.hold_ms)).await;
    let rss1 = ctx.server.rss_kb()?;
    let own1 = procstat::rss_kb(None)?;
    group.check_alive()?;
    let idle = if a.idle_cpu_ms > 0 {
        let meter = Meter::start(&ctx.server)?;
        tokio::time::sleep(Duration::from_millis(a.idle_cpu_ms)).await;
        group.check_alive()?;
        Some(meter.stop()?)
    } else {
        None
    };
    let connect = group.board.connect_times();
    let n = a.subs.max(1) as f64;
    r.metric("subscribers", a.subs as f64);
    r.metric("connect_all_s", all.as_secs_f64());
    r.metric("connects_per_s", per_s(a.subs as u64, all));
    r.metric("connect_p50_ms", ms(connect.value_at_quantile(0.5)));
    r.metric("connect_p99_ms", ms(connect.value_at_quantile(0.99)));
    r.metric("connect_max_ms", ms(connect.max()));
    if let (Some(before), Some(after)) = (rss0, rss1) {
        r.metric("server_rss_before_mb", before as f64 / 1024.0);
        r.metric("server_rss_after_mb", after as f64 / 1024.0);
        r.metric(
            "server_rss_per_sub_kb",
            after.saturating_sub(before) as f64 / n,
        );
    }
    r.metric("bench_rss_per_sub_kb", own1.saturating_sub(own0) as f64 / n);
    if let Some(u) = idle {
        // Server CPU while only heartbeats flow, per subscriber and second.
        if let Some(s) = u.server {
            r.metric("idle_server_cpu_ms", ms(s.total_us()));
            r.metric(
                "idle_server_cpu_us_per_sub_s",
                s.total_us() as f64 / n / u.wall_s.max(1e-9),
            );
        }
        let others = u
            .machine_us
            .saturating_sub(u.own.total_us() + u.server.map_or(0, |s| s.total_us()));
        r.metric("idle_s", u.wall_s);
        r.metric("other_cpu_cores", others as f64 / 1e6 / u.wall_s.max(1e-9));
    }
    ds_metrics(ctx, &mut r, &group.board);
    let trackers = group.finish().await?;
    delivery_problems(&mut r, &trackers, |_| 0, false);
    Ok(r)
}

// ---------------------------------------------------------------- fanout, channels

/// `fanout` arguments.
#[derive(Debug, Args)]
pub(crate) struct FanoutArgs {
    /// Subscribers, all on one channel.
    #[arg(long, default_value_t = 1000)]
    pub subs: usize,
    /// Events to publish.
    #[arg(long, default_value_t = 1000)]
    pub events: u64,
    /// Event data size in bytes.
    #[arg(long, default_value_t = 100)]
    pub bytes: usize,
    /// Events per second; 0 = as fast as the publishers are acknowledged.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Concurrent publisher connections (order is checked only with one).
    #[arg(long, default_value_t = 1)]
    pub publishers: usize,
    /// Stop publishing after this many seconds even if events remain.
    #[arg(long)]
    pub max_secs: Option<f64>,
}

/// `channels` arguments.
#[derive(Debug, Args)]
pub(crate) struct ChannelsArgs {
    /// Channels.
    #[arg(long, default_value_t = 1000)]
    pub channels: usize,
    /// Subscribers per channel.
    #[arg(long, default_value_t = 5)]
    pub subs_per_channel: usize,
    /// Events to publish, round-robin over the channels.
    #[arg(long, default_value_t = 20000)]
    pub events: u64,
    /// Event data size in bytes.
    #[arg(long, default_value_t = 100)]
    pub bytes: usize,
    /// Events per second over all channels; 0 = max.
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Concurrent publisher connections.
    #[arg(long, default_value_t = 4)]
    pub publishers: usize,
    /// Stop publishing after this many seconds even if events remain.
    #[arg(long)]
    pub max_secs: Option<f64>,
}

/// N subscribers on one channel.
///
/// # Errors
/// Subscribers could not attach or warm up.
pub(crate) async fn fanout(ctx: &Ctx, a: &FanoutArgs) -> Result<Record> {
    let rate = if a.rate > 0.0 {
        a.rate.to_string()
    } else {
        "max".to_owned()
    };
    let params = format!(
        "subs={} events={} bytes={} rate={rate} publishers={}",
        a.subs, a.events, a.bytes, a.publishers
    );
    spread(
        ctx,
        "fanout",
        params,
        1,
        a.subs,
        a.events,
        a.bytes,
        a.rate,
        a.publishers,
        a.max_secs,
    )
    .await
}

/// Many channels with a few subscribers each.
///
/// # Errors
/// Subscribers could not attach or warm up.
pub(crate) async fn channels(ctx: &Ctx, a: &ChannelsArgs) -> Result<Record> {
    let rate = if a.rate > 0.0 {
        a.rate.to_string()
    } else {
        "max".to_owned()
    };
    let params = format!(
        "channels={} subs_per_channel={} events={} bytes={} rate={rate} publishers={}",
        a.channels, a.subs_per_channel, a.events, a.bytes, a.publishers
    );
    spread(
        ctx,
        "channels",
        params,
        a.channels.max(1),
        a.subs_per_channel.max(1),
        a.events,
        a.bytes,
        a.rate,
        a.publishers,
        a.max_secs,
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn spread(
    ctx: &Ctx,
    scenario: &str,
    params: String,
    channels: usize,
    subs_per_channel: usize,
    events: u64,
    bytes: usize,
    rate: f64,
    publishers: usize,
    max_secs: Option<f64>,
) -> Result<Record> {
    let mut r = ctx.sub_record(scenario, params);
    let names = ctx.streams("f", channels).await?;
    let paths = ctx.pub_paths(&names);
    let subs = channels * subs_per_channel;
    let trackers = (0..subs).map(|i| Tracker::new(i, i % channels)).collect();
    let group = Group::spawn(ctx, &names, trackers, false);
    group.board.wait_connected(subs, ctx.timeout).await?;
    group.warm_up(ctx, &paths).await?;
    group.board.reset_latency();

    let meter = Meter::start(&ctx.server)?;
    let t0_us = now_us();
    let outcome = publisher::run(ctx.plan(paths, events, rate, bytes, publishers, max_secs)).await;
    let target: u64 = outcome.issued.iter().sum::<u64>() * subs_per_channel as u64;
    let complete = group.board.wait_delivered(target, ctx.timeout, subs).await;
    let usage = meter.stop()?;
    // Give late duplicates a moment to show up before the connections drop.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let delivered = group.board.delivered.load(Ordering::Acquire);
    let reads = group.board.reads.load(Ordering::Relaxed);
    let board = group.board.clone();
    let span_us = group
        .board
        .last_delivery_us
        .load(Ordering::Relaxed)
        .saturating_sub(t0_us);
    let latency = group.board.latency();
    let node_latency: Vec<_> = (0..group.board.nodes())
        .map(|k| group.board.node_latency(k))
        .collect();
    let trackers = group.finish().await?;

    let published: u64 = outcome.issued.iter().sum();
    r.metric("subscribers", subs as f64);
    r.metric("events_published", published as f64);
    r.metric("publish_per_s", per_s(outcome.acked, outcome.elapsed));
    r.metric("deliveries", delivered as f64);
    r.metric(
        "deliveries_per_s",
        per_s(delivered, Duration::from_micros(span_us)),
    );
    r.metric("events_per_read", delivered as f64 / reads.max(1) as f64);
    ds_metrics(ctx, &mut r, &board);
    r.latency("latency", &latency);
    if node_latency.len() > 1 {
        for (k, h) in node_latency.iter().enumerate() {
            r.quantiles(&format!("latency_node{k}"), h);
        }
    }
    r.latency("ack", &outcome.ack);
    cpu_metrics(&mut r, &usage, delivered, "delivery");
    if !complete {
        r.problem(format!(
            "only {delivered} of {target} deliveries within {:?}",
            ctx.timeout
        ));
    }
    publish_problems(&mut r, &outcome);
    delivery_problems(
        &mut r,
        &trackers,
        |t| outcome.issued[t.channel],
        publishers <= 1,
    );
    Ok(r)
}

// ---------------------------------------------------------------- storm

/// `storm` arguments.
#[derive(Debug, Args)]
pub(crate) struct StormArgs {
    /// Subscribers, all on one channel.
    #[arg(long, default_value_t = 1000)]
    pub subs: usize,
    /// Events each subscriber misses while disconnected.
    #[arg(long, default_value_t = 100)]
    pub behind: u64,
    /// Event data size in bytes.
    #[arg(long, default_value_t = 100)]
    pub bytes: usize,
    /// How long to keep the streams after catch-up to catch extra deliveries, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub linger_ms: u64,
}

/// N subscribers drop, fall K events behind, then reconnect at once with
/// their Last-Event-ID.
///
/// # Errors
/// Subscribers could not attach or warm up.
pub(crate) async fn storm(ctx: &Ctx, a: &StormArgs) -> Result<Record> {
    if ctx.transport == Transport::Ws && !ctx.ws_gapless {
        bail!("storm --transport ws needs --kind gapless: Nchan's WebSocket frames carry no message id to resume from");
    }
    let mut r = ctx.sub_record(
        "storm",
        format!("subs={} behind={} bytes={}", a.subs, a.behind, a.bytes),
    );
    let names = ctx.streams("s", 1).await?;
    let paths = ctx.pub_paths(&names);
    let trackers = (0..a.subs).map(|i| Tracker::new(i, 0)).collect();
    let group = Group::spawn(ctx, &names, trackers, false);
    group.board.wait_connected(a.subs, ctx.timeout).await?;
    group.warm_up(ctx, &paths).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let trackers = group.finish().await?;
    let without_id = trackers
        .iter()
        .filter(|t| t.last_event_id.is_empty())
        .count();
    if without_id > 0 {
        r.problem(format!(
            "{without_id} subscriber(s) had no last event ID to resume from"
        ));
    }
    // Publish what they miss, in order, from one connection.
    let outcome = publisher::run(ctx.plan(paths, a.behind, 0.0, a.bytes, 1, None)).await;
    publish_problems(&mut r, &outcome);

    let meter = Meter::start(&ctx.server)?;
    let t0_us = now_us();
    let group = Group::spawn(ctx, &names, trackers, true);
    group.board.record_latency.store(false, Ordering::Relaxed);
    let target = a.subs as u64 * a.behind;
    let complete = group
        .board
        .wait_delivered(target, ctx.timeout, a.subs)
        .await;
    let usage = meter.stop()?;
    let caught_up_us = group
        .board
        .last_delivery_us
        .load(Ordering::Relaxed)
        .saturating_sub(t0_us);
    tokio::time::sleep(Duration::from_millis(a.linger_ms)).await;
    let delivered = group.board.delivered.load(Ordering::Acquire);
    let connect = group.board.connect_times();
    let trackers = group.finish().await?;

    r.metric("subscribers", a.subs as f64);
    r.metric("behind", a.behind as f64);
    r.metric("catch_up_ms", ms(caught_up_us));
    r.metric("reconnect_p50_ms", ms(connect.value_at_quantile(0.5)));
    r.metric("reconnect_p99_ms", ms(connect.value_at_quantile(0.99)));
    r.metric("deliveries", delivered as f64);
    cpu_metrics(&mut r, &usage, delivered, "delivery");
    if !complete {
        r.problem(format!(
            "only {delivered} of {target} deliveries within {:?}",
            ctx.timeout
        ));
    }
    delivery_problems(&mut r, &trackers, |_| a.behind, true);
    Ok(r)
}

// ---------------------------------------------------------------- publish

/// `publish` arguments.
#[derive(Debug, Args)]
pub(crate) struct PublishArgs {
    /// Concurrent publisher connections.
    #[arg(long, default_value_t = 64)]
    pub publishers: usize,
    /// Events to publish in all.
    #[arg(long, default_value_t = 100_000)]
    pub events: u64,
    /// Event data size in bytes.
    #[arg(long, default_value_t = 100)]
    pub bytes: usize,
    /// Stop after this many seconds even if events remain.
    #[arg(long)]
    pub max_secs: Option<f64>,
    /// All publishers on one channel (default: one channel each).
    #[arg(long)]
    pub one_channel: bool,
    /// Free text naming the server's durability setting, for the results.
    #[arg(long, default_value = "")]
    pub durability: String,
}

/// C concurrent publishers: events/s and acknowledgement latency.
///
/// # Errors
/// The server vanished.
pub(crate) async fn publish(ctx: &Ctx, a: &PublishArgs) -> Result<Record> {
    let mut params = format!(
        "publishers={} events={} bytes={} channels={}",
        a.publishers,
        a.events,
        a.bytes,
        if a.one_channel {
            "one"
        } else {
            "one per publisher"
        }
    );
    if !a.durability.is_empty() {
        params.push_str(&format!(" durability={}", a.durability));
    }
    let mut r = ctx.record("publish", params);
    let names = ctx
        .streams(
            "p",
            if a.one_channel {
                1
            } else {
                a.publishers.max(1)
            },
        )
        .await?;
    let paths = ctx.pub_paths(&names);
    let meter = Meter::start(&ctx.server)?;
    let outcome =
        publisher::run(ctx.plan(paths, a.events, 0.0, a.bytes, a.publishers, a.max_secs)).await;
    let usage = meter.stop()?;
    r.metric("events_acked", outcome.acked as f64);
    r.metric("events_per_s", per_s(outcome.acked, outcome.elapsed));
    r.latency("ack", &outcome.ack);
    cpu_metrics(&mut r, &usage, outcome.acked, "event");
    publish_problems(&mut r, &outcome);
    if ctx.ds {
        // Read every stream back: each append exactly once.
        let mut client = Client::new(ctx.publ.addr);
        let mut trackers = Vec::with_capacity(names.len());
        let mut page_time = histogram();
        for (c, name) in names.iter().enumerate() {
            let mut t = Tracker::new(c, c);
            ds_read(
                ctx,
                &mut client,
                name,
                &mut t,
                &mut page_time,
                outcome.issued[c] + 10,
            )
            .await?;
            trackers.push(t);
        }
        delivery_problems(&mut r, &trackers, |t| outcome.issued[t.channel], false);
    } else if let Some(info) = &ctx.info {
        let mut client = Client::new(info.addr);
        let mut body = Vec::new();
        let mut wrong = 0;
        for (name, &issued) in names.iter().zip(&outcome.issued) {
            let req = request("GET", &info.host, &info.path_for(name, 0), &[], b"");
            let status = client.call(&req, &mut body).await?;
            let head = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("head").and_then(serde_json::Value::as_u64));
            if status != 200 || head != Some(issued) {
                wrong += 1;
            }
        }
        if wrong > 0 {
            r.problem(format!(
                "{wrong} channel(s) hold a different number of events than published"
            ));
        }
    }
    Ok(r)
}

// ---------------------------------------------------------------- history

/// `history` arguments.
#[derive(Debug, Args)]
pub(crate) struct HistoryArgs {
    /// Events in the channel.
    #[arg(long, default_value_t = 100_000)]
    pub events: u64,
    /// Events per page (the server's maximum for gapless is 1000).
    #[arg(long, default_value_t = 1000)]
    pub page: usize,
    /// Event data size in bytes.
    #[arg(long, default_value_t = 100)]
    pub bytes: usize,
    /// Publishers filling the channel.
    #[arg(long, default_value_t = 16)]
    pub publishers: usize,
}

#[derive(Deserialize)]
struct Page<'a> {
    #[serde(borrow)]
    events: Vec<PageEvent<'a>>,
    #[serde(borrow)]
    next: Option<Cow<'a, str>>,
    done: bool,
}

#[derive(Deserialize)]
struct PageEvent<'a> {
    #[serde(borrow)]
    data: Cow<'a, str>,
}

/// Fills one channel, then pages through it from the start.
///
/// # Errors
/// No history URL, or a page is malformed.
pub(crate) async fn history(ctx: &Ctx, a: &HistoryArgs) -> Result<Record> {
    let tpl = ctx
        .history
        .as_ref()
        .ok_or_else(|| anyhow!("history needs --history-url (this target has no history API)"))?;
    let page = if ctx.ds {
        "server".to_owned()
    } else {
        a.page.to_string()
    };
    let mut r = ctx.record(
        "history",
        format!("events={} page={page} bytes={}", a.events, a.bytes),
    );
    let names = ctx.streams("h", 1).await?;
    let paths = ctx.pub_paths(&names);
    let fill = publisher::run(ctx.plan(paths, a.events, 0.0, a.bytes, a.publishers, None)).await;
    publish_problems(&mut r, &fill);
    r.metric("fill_events_per_s", per_s(fill.acked, fill.elapsed));

    let base = tpl.path_for(&names[0], a.page);
    let sep = if base.contains('?') { '&' } else { '?' };
    let mut client = Client::new(tpl.addr);
    let mut body = Vec::new();
    let mut tracker = Tracker::new(0, 0);
    let mut after: Option<String> = None;
    let mut pages = 0u64;
    let mut page_time = histogram();
    let max_pages = a.events / a.page.max(1) as u64 + 10;
    let meter = Meter::start(&ctx.server)?;
    let t0 = Instant::now();
    if ctx.ds {
        // The server picks the page size; a page holds at least one message.
        pages = ds_read(
            ctx,
            &mut client,
            &names[0],
            &mut tracker,
            &mut page_time,
            a.events + 10,
        )
        .await?;
    } else {
        loop {
            let path = match &after {
                Some(c) => format!("{base}{sep}after={c}"),
                None => base.clone(),
            };
            let req = request("GET", &tpl.host, &path, &[], b"");
            let t = Instant::now();
            let status = client.call(&req, &mut body).await?;
            if status != 200 {
                bail!(
                    "history page answered {status}: {}",
                    String::from_utf8_lossy(&body)
                );
            }
            let page: Page<'_> = serde_json::from_slice(&body).context("history page")?;
            page_time.saturating_record(t.elapsed().as_micros() as u64);
            pages += 1;
            for e in &page.events {
                match crate::payload::parse(&e.data) {
                    crate::payload::Payload::Event { seq, .. } => {
                        tracker.event(seq);
                    }
                    _ => tracker.foreign += 1,
                }
            }
            if page.done || page.events.is_empty() {
                break;
            }
            after = page.next.map(Cow::into_owned);
            if after.is_none() || pages >= max_pages {
                break;
            }
        }
    }
    let took = t0.elapsed();
    let usage = meter.stop()?;
    r.metric("events_read", tracker.unique as f64);
    r.metric("pages", pages as f64);
    r.metric("events_per_s", per_s(tracker.unique, took));
    r.latency("page", &page_time);
    cpu_metrics(&mut r, &usage, tracker.unique, "event");
    delivery_problems(&mut r, &[tracker], |_| fill.issued[0], false);
    Ok(r)
}

/// Durable Streams catch-up: reads stream `name` from offset `-1` to its tail
/// (`GET ?offset=…`, following `Stream-Next-Offset` until `Stream-Up-To-Date`),
/// recording every message in `tracker` and each answer's time in `page_time`.
/// Returns the number of answers.
///
/// # Errors
/// No history URL, an answer other than 200, no `Stream-Next-Offset`, an answer
/// not of the wire's shape, no progress, or more than `max_pages` answers.
pub(crate) async fn ds_read(
    ctx: &Ctx,
    client: &mut Client,
    name: &str,
    tracker: &mut Tracker,
    page_time: &mut hdrhistogram::Histogram<u64>,
    max_pages: u64,
) -> Result<u64> {
    let tpl = ctx
        .history
        .as_ref()
        .ok_or_else(|| anyhow!("no stream URL for the catch-up read"))?;
    let base = tpl.path_for(name, 0);
    let sep = if base.contains('?') { '&' } else { '?' };
    let mut offset = "-1".to_owned();
    let mut body = Vec::new();
    let mut pages = 0u64;
    loop {
        let req = request(
            "GET",
            &tpl.host,
            &format!("{base}{sep}offset={offset}"),
            &[],
            b"",
        );
        let t = Instant::now();
        let answer = client.call_full(&req, &mut body).await?;
        if answer.status != 200 {
            bail!(
                "catch-up read of {name} at {offset} answered {}: {}",
                answer.status,
                String::from_utf8_lossy(&body)
            );
        }
        let text = std::str::from_utf8(&body).context("catch-up answer is not UTF-8")?;
        let shaped = ctx.wire.split(text, |m| match crate::payload::parse(m) {
            Payload::Event { seq, .. } => {
                tracker.event(seq);
            }
            _ => tracker.foreign += 1,
        });
        page_time.saturating_record(t.elapsed().as_micros() as u64);
        pages += 1;
        if !shaped {
            bail!("catch-up answer of {name} at {offset} is not a JSON array of strings");
        }
        let next = answer
            .next_offset
            .ok_or_else(|| anyhow!("catch-up answer of {name} without Stream-Next-Offset"))?;
        if answer.up_to_date {
            return Ok(pages);
        }
        if next == offset {
            bail!("catch-up read of {name} made no progress at {offset}");
        }
        if pages >= max_pages {
            bail!("catch-up read of {name}: more than {max_pages} answers");
        }
        offset = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inexact_counts_fail_the_check() {
        let mut lost = Tracker::new(0, 0);
        lost.event(1);
        let mut doubled = Tracker::new(1, 0);
        for s in [1, 2, 2] {
            doubled.event(s);
        }
        let mut r = Record::new("t", "x", String::new());
        let dups = delivery_problems(&mut r, &[lost, doubled], |_| 2, true);
        assert_eq!(dups, 1);
        assert!(!r.exact);
        assert_eq!(r.problems.len(), 2, "{:?}", r.problems);

        let mut whole = Tracker::new(0, 0);
        whole.event(1);
        whole.event(2);
        let mut ok = Record::new("t", "x", String::new());
        delivery_problems(&mut ok, &[whole], |_| 2, true);
        assert!(ok.exact);
    }
}
