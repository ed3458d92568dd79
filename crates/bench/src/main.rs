//! `gapless-bench`: the load generator that measures gapless beside its
//! peers, on the same machine and with the same tool.
//!
//! It is target-agnostic: the subscribe, publish and history URLs are
//! templates holding `{channel}` (`--kind` fills them in for the servers we
//! compare: gapless, Nchan, and the Durable Streams servers `electric`,
//! `dsnode` and `gapless-ds`), and latency comes from the publish time the
//! harness writes into each event's data, not from anything the server says.
//! Every scenario also checks its counts (every event exactly once) and exits
//! with status 2 when they are not exact. See `docs/performance.md`.
//!
//! Run with `cargo run --release -p gapless-bench -- --help`.

mod http;
mod payload;
mod plot;
mod presence;
mod procstat;
mod publisher;
mod report;
mod scale;
mod scenario;
mod streams;
mod sub;
mod sweep;
mod ws;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// Load generator for gapless and its peers.
#[derive(Debug, Parser)]
#[command(name = "gapless-bench", version, about)]
struct Cli {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    command: Command,
}

/// Which server's URL layout the defaults follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// `/v1/channels/{channel}/sse`, `/v1/channels/{channel}/events`.
    Gapless,
    /// Nchan: `/sub/{channel}`, `/pub/{channel}`.
    Nchan,
    /// Electric's Durable Streams server (`durable-streams-server`): streams at `/{channel}`.
    Electric,
    /// The Durable Streams Node reference server (`@durable-streams/server`): `/{channel}`.
    Dsnode,
    /// gapless over its Durable Streams paths: `/ds/{channel}`.
    GaplessDs,
}

impl Kind {
    /// The path prefix of a Durable Streams target's streams; `None` for the
    /// others (gapless's own API, Nchan).
    pub fn ds_prefix(self) -> Option<&'static str> {
        match self {
            Kind::Gapless | Kind::Nchan => None,
            Kind::Electric | Kind::Dsnode => Some(""),
            Kind::GaplessDs => Some("/ds"),
        }
    }

    /// The default label of the target in the results.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Gapless => "gapless",
            Kind::Nchan => "nchan",
            Kind::Electric => "electric",
            Kind::Dsnode => "dsnode",
            Kind::GaplessDs => "gapless-ds",
        }
    }
}

/// How messages travel over a Durable Streams target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DsType {
    /// `application/json` streams: each append is one JSON string; reads (catch-up and SSE
    /// `data` events) are JSON arrays of the messages, so several appends in one event are
    /// told apart exactly.
    Json,
    /// `text/plain` streams: each append is the event data and a `\n`; reads are the
    /// messages concatenated and are split at `\n`.
    Text,
}

/// How subscribers follow their channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// Server-Sent Events: one HTTP GET per subscriber (gapless `/v1/channels/{channel}/sse`,
    /// Nchan `nchan_subscriber eventsource` at `/sub/{channel}`).
    Sse,
    /// WebSocket: one socket per subscriber. gapless: `/v1/ws` with subprotocol
    /// `gapless.v1`, one `subscribe` message, `event` messages (docs/protocol.md); Nchan:
    /// `nchan_subscriber websocket` at `/ws/{channel}`, one text frame per message.
    Ws,
}

impl Transport {
    /// The name used in results (`sse`, `ws`).
    pub fn name(self) -> &'static str {
        match self {
            Transport::Sse => "sse",
            Transport::Ws => "ws",
        }
    }
}

/// Options every scenario takes.
#[derive(Debug, Args)]
pub struct Common {
    /// URL layout and protocol of the target (fills in the templates not given). The
    /// Durable Streams kinds (`electric`, `dsnode`, `gapless-ds`) create each stream with
    /// `PUT` before a run, append with `POST`, follow with `GET ?offset=now&live=sse`
    /// (reconnecting from the last `control` offset when the server ends a response) and
    /// read back with `GET ?offset=-1` paging on `Stream-Next-Offset`.
    #[arg(long, global = true, value_enum, default_value_t = Kind::Gapless)]
    pub kind: Kind,
    /// How subscribers follow (idle, fanout, channels, storm): `sse`, or `ws` (gapless's
    /// WebSocket API with `--kind gapless`, Nchan's WebSocket subscriber with `--kind nchan`;
    /// the Durable Streams kinds have none). With `--sub-url`, the template is the socket's
    /// URL. Storm over `ws` resumes from each subscriber's last event cursor (gapless only:
    /// Nchan's frames carry no message id).
    #[arg(long, global = true, value_enum, default_value_t = Transport::Sse)]
    pub transport: Transport,
    /// Content type of the Durable Streams streams (Durable Streams kinds only).
    #[arg(long, global = true, value_enum, default_value_t = DsType::Json)]
    pub ds_type: DsType,
    /// Target address for the preset templates.
    #[arg(long, global = true, default_value = "127.0.0.1:8080")]
    pub addr: String,
    /// More nodes of one cluster (`host:port`, comma-separated; gapless cluster mode): subscriber
    /// connections and publishers are spread round robin over `--addr` and these. Default: none.
    #[arg(long, global = true, value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// Subscribe URL template, e.g. `http://127.0.0.1:8080/v1/channels/{channel}/sse`
    /// (Durable Streams: `…/{channel}?offset={offset}&live=sse`, `{offset}` filled at each connect).
    #[arg(long, global = true)]
    pub sub_url: Option<String>,
    /// Publish URL template (POST, body = event data).
    #[arg(long, global = true)]
    pub pub_url: Option<String>,
    /// History page URL template with `{channel}` and `{limit}`; the cursor is appended as
    /// `&after=` (Durable Streams: the stream URL; `?offset=` is appended).
    #[arg(long, global = true)]
    pub history_url: Option<String>,
    /// Channel info URL template answering JSON with `head` (used to verify publish counts).
    #[arg(long, global = true)]
    pub info_url: Option<String>,
    /// Server process to measure (RSS, CPU); repeat for several (e.g. nginx workers).
    #[arg(long = "server-pid", global = true)]
    pub server_pids: Vec<u32>,
    /// Name of the target in the results (default: the kind).
    #[arg(long, global = true)]
    pub label: Option<String>,
    /// Channel name prefix (default: unique per run, so no run sees another's events).
    #[arg(long, global = true)]
    pub prefix: Option<String>,
    /// Load-tool worker threads.
    #[arg(long, global = true, default_value_t = 2)]
    pub threads: usize,
    /// Most connection attempts in flight at once.
    #[arg(long, global = true, default_value_t = 512)]
    pub connect_concurrency: usize,
    /// Bound on every wait (attach, delivery, catch-up), in seconds.
    #[arg(long, global = true, default_value_t = 120)]
    pub timeout_secs: u64,
    /// Append the result as a JSON line to this file.
    #[arg(long, global = true)]
    pub json: Option<PathBuf>,
    /// Read buffer per subscriber connection, in bytes.
    #[arg(long, global = true, default_value_t = 8192)]
    pub read_buffer: usize,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// N idle subscribers (SSE or WebSocket): server RSS per connection and connect time.
    Idle(scenario::IdleArgs),
    /// N subscribers on one channel, M events of B bytes at R/s (0 = max).
    Fanout(scenario::FanoutArgs),
    /// Many channels with a few subscribers each; publishes spread over them.
    Channels(scenario::ChannelsArgs),
    /// N subscribers drop, fall K events behind, and reconnect at once with Last-Event-ID.
    Storm(scenario::StormArgs),
    /// C concurrent publishers: events/s and acknowledgement latency.
    Publish(scenario::PublishArgs),
    /// Page through a long channel's history: events/s.
    History(scenario::HistoryArgs),
    /// Members join and leave a channel with presence while watchers follow the notices:
    /// join/leave delivery latency and server CPU.
    Presence(presence::PresenceArgs),
    /// S subscribers each following C channels on one SSE connection (or, with `--split`,
    /// one connection per channel): RSS per followed channel, CPU per delivery, exact
    /// counts per channel.
    Multi(scale::MultiArgs),
    /// N subscribers of one channel; E events, each published alone once all have the one
    /// before: time until the last subscriber has it, p50/p99 across subscribers.
    Burst(scale::BurstArgs),
    /// N Durable Streams created, then A appends each with idempotent-producer headers and
    /// as many without (the plain baseline; `--kind gapless`: plain publishes only): server
    /// CPU per create and per append, RSS per stream, a sample read back exactly.
    Streams(streams::StreamsArgs),
    /// After `streams --probe-file` and a server restart (`bench/compare`): time until the
    /// probe stream's `HEAD` answers 200 with its offset; added to the last `--json` record.
    RestartProbe(streams::RestartProbeArgs),
    /// Draw the percentile curve of the last result of each file as an SVG.
    Plot {
        /// The SVG file to write.
        #[arg(long)]
        out: PathBuf,
        /// Which curve: `latency` (fanout, channels) or `ack` (publish, fanout).
        #[arg(long, default_value = "latency")]
        curve: String,
        /// The chart's title.
        #[arg(long, default_value = "")]
        title: String,
        /// Results files (JSON lines), one line each.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Draw one figure against another over many runs (a sweep, e.g. bench/sweep.sh), one
    /// line per target, as an SVG; print the points as a Markdown table. A figure is a
    /// metric name or `param:NAME` (a number in the runs' parameters, e.g. `param:subs`).
    PlotSweep {
        /// The SVG file to write.
        #[arg(long)]
        out: PathBuf,
        /// The x figure, e.g. `param:subs` or `publish_per_s`.
        #[arg(long)]
        x: String,
        /// The y figure, e.g. `server_cpu_us_per_delivery` or `latency_p99_ms`.
        #[arg(long)]
        y: String,
        /// Only runs of this scenario.
        #[arg(long)]
        scenario: Option<String>,
        /// Logarithmic x axis.
        #[arg(long)]
        log_x: bool,
        /// The chart's title.
        #[arg(long, default_value = "")]
        title: String,
        /// Table rows by this parameter as written (e.g. `rate`, with its `max`), each cell
        /// `y @ x`; default: one row per x.
        #[arg(long)]
        table_key: Option<String>,
        /// Results files (JSON lines), any number of runs each.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Print the results of JSON-lines files side by side with the ratio of the first to
    /// each other (the median of each figure when a file holds several runs).
    Compare {
        /// Results of the first target (numerator).
        a: PathBuf,
        /// Results of the other targets (denominators); without them, A alone.
        others: Vec<PathBuf>,
    },
}

fn main() -> std::process::ExitCode {
    match real_main() {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(2),
        Err(e) => {
            eprintln!("gapless-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn real_main() -> Result<bool> {
    let cli = Cli::parse();
    match &cli.command {
        Command::Compare { a, others } => {
            report::compare(a, others)?;
            return Ok(true);
        }
        Command::Plot {
            out,
            curve,
            title,
            files,
        } => {
            plot::plot(out, curve, title, files)?;
            return Ok(true);
        }
        Command::PlotSweep {
            out,
            x,
            y,
            scenario,
            log_x,
            title,
            table_key,
            files,
        } => {
            let spec = sweep::Spec {
                out,
                x,
                y,
                scenario: scenario.as_deref(),
                log_x: *log_x,
                title,
                table_key: table_key.as_deref(),
            };
            sweep::plot_sweep(&spec, files)?;
            return Ok(true);
        }
        _ => {}
    }
    if let Err(e) = rlimit::increase_nofile_limit(u64::MAX) {
        eprintln!("gapless-bench: cannot raise the open-files limit: {e}");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.common.threads.max(1))
        .enable_all()
        .build()
        .context("start the tokio runtime")?;
    if let Command::RestartProbe(a) = &cli.command {
        let exact = runtime.block_on(streams::restart_probe(&cli.common, a))?;
        runtime.shutdown_background();
        return Ok(exact);
    }
    let ctx = scenario::Ctx::new(&cli.common)?;
    let record = runtime.block_on(async {
        match &cli.command {
            Command::Idle(a) => scenario::idle(&ctx, a).await,
            Command::Fanout(a) => scenario::fanout(&ctx, a).await,
            Command::Channels(a) => scenario::channels(&ctx, a).await,
            Command::Storm(a) => scenario::storm(&ctx, a).await,
            Command::Publish(a) => scenario::publish(&ctx, a).await,
            Command::History(a) => scenario::history(&ctx, a).await,
            Command::Presence(a) => presence::presence(&cli.common, a).await,
            Command::Multi(a) => scale::multi(&ctx, a).await,
            Command::Burst(a) => scale::burst(&ctx, a).await,
            Command::Streams(a) => streams::streams(&ctx, a).await,
            Command::Compare { .. }
            | Command::Plot { .. }
            | Command::PlotSweep { .. }
            | Command::RestartProbe(_) => {
                unreachable!("handled above")
            }
        }
    })?;
    record.print();
    if let Some(path) = &cli.common.json {
        record.append_json(path)?;
    }
    // Drop open sockets without waiting for tasks that may still be reading.
    runtime.shutdown_background();
    Ok(record.exact)
}
