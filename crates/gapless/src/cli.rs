//! Command-line flags. Every flag of `gapless serve` also reads the environment
//! variable `GAPLESS_<FLAG>` (upper case, `-` as `_`); a flag on the command
//! line wins over the environment.

use clap::{Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;

/// gapless: a realtime event-stream server where every subscriber gets every
/// event once and in order, or is told exactly which range it missed.
#[derive(Debug, Parser)]
#[command(name = "gapless", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server.
    Serve(ServeArgs),
    /// Publish one event, each line of standard input, or a file of JSON lines.
    Publish(crate::cmd::publish::PublishArgs),
    /// Follow channels and print their events as they arrive, resuming across drops.
    Tail(crate::cmd::tail::TailArgs),
    /// Print a channel's retained events.
    History(crate::cmd::history::HistoryArgs),
    /// Make a signed token (JWT) for a server started with --jwt-secret or --jwt-public-key.
    Token(crate::cmd::token::TokenArgs),
}

/// When a publish is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DurabilityArg {
    /// After the event is on disk (fsync); concurrent publishers share one fsync.
    Sync,
    /// Before the fsync; a crash may lose up to about one second of acknowledged events.
    Async,
}

/// `gapless serve` flags.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on; port 0 picks a free port (printed at start).
    #[arg(long, env = "GAPLESS_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Directory of the embedded durable journal (created if missing).
    #[arg(long, env = "GAPLESS_DATA_DIR", default_value = "./gapless-data")]
    pub data_dir: PathBuf,
    /// Keep everything in memory instead of on disk (history is lost on restart).
    #[arg(long, env = "GAPLESS_MEMORY")]
    pub memory: bool,
    /// Most events retained per channel.
    #[arg(long, env = "GAPLESS_RETENTION_EVENTS", default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub retention_events: u64,
    /// Age in milliseconds after which events are evicted; 0 keeps them forever.
    #[arg(long, env = "GAPLESS_RETENTION_MS", default_value_t = 86_400_000)]
    pub retention_ms: u64,
    /// Milliseconds between SSE heartbeat comments and WebSocket pings (every N ms, whether or not events flow); 0 sends none.
    #[arg(long, env = "GAPLESS_HEARTBEAT_MS", default_value_t = 15_000)]
    pub heartbeat_ms: u64,
    /// Threads that write SSE streams, apart from the threads that serve
    /// publishes and other requests; 0 means one per CPU core but one (at least one); at most 1024.
    #[arg(long, env = "GAPLESS_FANOUT_THREADS", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub fanout_threads: u16,
    /// When a publish is acknowledged.
    #[arg(long, env = "GAPLESS_DURABILITY", value_enum, default_value_t = DurabilityArg::Sync)]
    pub durability: DurabilityArg,
    /// Largest event data, in bytes (413 above).
    #[arg(long, env = "GAPLESS_MAX_EVENT_BYTES", default_value_t = 1_048_576)]
    pub max_event_bytes: usize,
    /// Most events in one batch publish (413 above).
    #[arg(long, env = "GAPLESS_MAX_BATCH_EVENTS", default_value_t = 1000)]
    pub max_batch_events: usize,
    /// Largest batch publish body, in bytes (413 above).
    #[arg(long, env = "GAPLESS_MAX_BATCH_BYTES", default_value_t = 16_777_216)]
    pub max_batch_bytes: usize,
    /// Most channels one SSE subscription or WebSocket may follow (SSE: 400 above; WebSocket: a `limit_reached` error).
    #[arg(long, env = "GAPLESS_MAX_SUBSCRIPTION_CHANNELS", default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=255))]
    pub max_subscription_channels: u16,
    /// Most open client connections (above it a connection is answered 503 and closed).
    #[arg(long, env = "GAPLESS_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,
    /// Reconnect delay sent to SSE clients in `retry:`, in milliseconds.
    #[arg(long, env = "GAPLESS_RETRY_MS", default_value_t = 1000)]
    pub retry_ms: u64,
    /// TCP keepalive idle time and probe interval, in milliseconds; 0 turns it off.
    #[arg(long, env = "GAPLESS_TCP_KEEPALIVE_MS", default_value_t = 15_000)]
    pub tcp_keepalive_ms: u64,
    /// The liveness bound in milliseconds: a client that acknowledges nothing this long while the server
    /// waits for an answer is dropped (TCP_USER_TIMEOUT, and on streams a check by progress that keeps
    /// slow readers); 0 = kernel default.
    #[arg(long, env = "GAPLESS_TCP_USER_TIMEOUT_MS", default_value_t = 30_000)]
    pub tcp_user_timeout_ms: u64,
    /// An origin allowed to call the API and open streams from a browser
    /// (repeatable, or comma-separated), e.g. `https://app.example.com`; listed
    /// origins may send credentials (cookies). `*` allows any origin without
    /// credentials. Default: `*` when the server is open, none (no
    /// cross-origin access) once a JWT key is set.
    #[arg(
        long = "cors-origin",
        alias = "cors-origins",
        env = "GAPLESS_CORS_ORIGIN",
        value_delimiter = ','
    )]
    pub cors_origin: Vec<String>,
    /// HS256 secret that tokens are verified with (at least 32 bytes advised).
    /// With any JWT key set, every publish, subscribe, history read, channel
    /// read and session operation needs a token (docs/security.md).
    #[arg(long, env = "GAPLESS_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<String>,
    /// File holding the HS256 secret (its bytes, without a trailing newline).
    #[arg(long, env = "GAPLESS_JWT_SECRET_FILE", conflicts_with = "jwt_secret")]
    pub jwt_secret_file: Option<PathBuf>,
    /// PEM file of a public key tokens are verified with: RSA (RS256) or EC P-256 (ES256).
    #[arg(long, env = "GAPLESS_JWT_PUBLIC_KEY")]
    pub jwt_public_key: Option<PathBuf>,
    /// Clock skew allowed on a token's `exp` and `nbf`, in milliseconds; a
    /// token is honoured until `exp` plus this.
    #[arg(long, env = "GAPLESS_JWT_LEEWAY_MS", default_value_t = 5000)]
    pub jwt_leeway_ms: u64,
    /// When set, a token's `aud` must contain this.
    #[arg(long, env = "GAPLESS_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,
    /// When set, a token's `iss` must be this.
    #[arg(long, env = "GAPLESS_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,
    /// Most open connections from one client IP address (past it: refused
    /// like past --max-connections); 0 = no limit. Behind a proxy every
    /// client shares the proxy's address: set 0 there and limit at the proxy.
    #[arg(long, env = "GAPLESS_MAX_CONNECTIONS_PER_IP", default_value_t = 1000)]
    pub max_connections_per_ip: usize,
    /// Publish rate per publisher (token `sub`, else client IP), in events per
    /// second (past it: 429 with Retry-After); 0 = no limit.
    #[arg(long, env = "GAPLESS_PUBLISH_RATE", default_value_t = 0)]
    pub publish_rate: u32,
    /// Events a publisher may send in a burst above --publish-rate; 0 = the same as the rate.
    #[arg(long, env = "GAPLESS_PUBLISH_BURST", default_value_t = 0)]
    pub publish_burst: u32,
    /// Slowest accepted request body, in bytes per second on average after
    /// --header-timeout-ms (slower: 408 and close); 0 = no limit.
    #[arg(long, env = "GAPLESS_MIN_BODY_RATE", default_value_t = 4096)]
    pub min_body_rate: u64,
    /// Largest WebSocket message a client may send, in bytes (close 1009 above).
    #[arg(
        long,
        env = "GAPLESS_WS_MAX_MESSAGE_BYTES",
        default_value_t = 1_114_112
    )]
    pub ws_max_message_bytes: usize,
    /// Milliseconds an open session survives with no consumer attached before it is cancelled.
    #[arg(long, env = "GAPLESS_SESSION_GRACE_MS", default_value_t = 60_000)]
    pub session_grace_ms: u64,
    /// Whether session consumers may resume with last_seq (false: refused with close 4400).
    #[arg(long, env = "GAPLESS_SESSION_RESUME", default_value_t = true, action = clap::ArgAction::Set)]
    pub session_resume: bool,
    /// Milliseconds a client has to send a whole request head (slower ones are disconnected).
    #[arg(long, env = "GAPLESS_HEADER_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout_ms: u64,
    /// Most recent events kept in memory per followed channel.
    #[arg(long, env = "GAPLESS_WINDOW_EVENTS", default_value_t = 1024)]
    pub window_events: usize,
    /// Most bytes of recent event data kept in memory per followed channel.
    #[arg(long, env = "GAPLESS_WINDOW_BYTES", default_value_t = 1_048_576)]
    pub window_bytes: usize,
}
