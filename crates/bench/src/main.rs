//! `gapless-bench`: the load generator that measures gapless beside its
//! peers, on the same machine and with the same tool.
//!
//! It is target-agnostic: the subscribe, publish and history URLs are
//! templates holding `{channel}` (`--kind gapless|nchan` fills them in for
//! the two servers we compare), and latency comes from the publish time the
//! harness writes into each event's data, not from anything the server says.
//! Every scenario also checks its counts (every event exactly once) and exits
//! with status 2 when they are not exact. See `docs/performance.md`.
//!
//! Run with `cargo run --release -p gapless-bench -- --help`.

mod http;
mod payload;
mod plot;
mod procstat;
mod publisher;
mod report;
mod scenario;
mod sub;

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
}

/// Options every scenario takes.
#[derive(Debug, Args)]
pub struct Common {
    /// URL layout of the target (fills in the templates not given).
    #[arg(long, global = true, value_enum, default_value_t = Kind::Gapless)]
    pub kind: Kind,
    /// Target address for the preset templates.
    #[arg(long, global = true, default_value = "127.0.0.1:8080")]
    pub addr: String,
    /// More nodes of one cluster (`host:port`, comma-separated; gapless cluster mode): subscriber
    /// connections and publishers are spread round robin over `--addr` and these. Default: none.
    #[arg(long, global = true, value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// Subscribe URL template, e.g. `http://127.0.0.1:8080/v1/channels/{channel}/sse`.
    #[arg(long, global = true)]
    pub sub_url: Option<String>,
    /// Publish URL template (POST, body = event data).
    #[arg(long, global = true)]
    pub pub_url: Option<String>,
    /// History page URL template with `{channel}` and `{limit}`; the cursor is appended as `&after=`.
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
    /// N idle SSE subscribers: server RSS per connection and connect time.
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
    /// Print the results of two JSON-lines files side by side with the ratio A/B
    /// (the median of each figure when a file holds several runs).
    Compare {
        /// Results of the first target (numerator).
        a: PathBuf,
        /// Results of the second target (denominator); without it, A alone.
        b: Option<PathBuf>,
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
        Command::Compare { a, b } => {
            report::compare(a, b.as_deref())?;
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
    let ctx = scenario::Ctx::new(&cli.common)?;
    let record = runtime.block_on(async {
        match &cli.command {
            Command::Idle(a) => scenario::idle(&ctx, a).await,
            Command::Fanout(a) => scenario::fanout(&ctx, a).await,
            Command::Channels(a) => scenario::channels(&ctx, a).await,
            Command::Storm(a) => scenario::storm(&ctx, a).await,
            Command::Publish(a) => scenario::publish(&ctx, a).await,
            Command::History(a) => scenario::history(&ctx, a).await,
            Command::Compare { .. } | Command::Plot { .. } => unreachable!("handled above"),
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
