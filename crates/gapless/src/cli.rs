//! Command-line flags. Every flag of `gapless serve` also reads the environment
//! variable `GAPLESS_<FLAG>` (upper case, `-` as `_`) and the `--config` file
//! (`config.rs`); a flag on the command line wins over the environment, which
//! wins over the file.

use clap::{Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;

/// gapless: a realtime event-stream server where every subscriber gets every
/// event once and in order, or is told exactly which range it missed.
#[derive(Debug, Parser)]
#[command(name = "gapless", version, about)]
pub(crate) struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
// Parsed once per process: the size of the serve flags does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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
    /// Inspect the embedded journal.
    #[command(subcommand)]
    Journal(crate::cmd::journal::JournalCommand),
    /// Print the effective settings of `serve` (with --config, flags and GAPLESS_*
    /// variables applied) and where each came from; --default prints every setting.
    Config(ConfigArgs),
}

/// The parser of a size limit for which 0 would refuse everything and "no
/// limit" would be unsafe: 0 is refused at start with a message. (Every
/// other limit takes 0 as "no limit" or "off", as its help says.)
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err(
            "0 would refuse every request and this limit has no \"no limit\" value: give at least 1"
                .to_owned(),
        ),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("not a whole number: {e}")),
    }
}

/// When a publish is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum DurabilityArg {
    /// After the event is on disk (fsync); concurrent publishers share one fsync.
    Sync,
    /// Before the fsync; a crash may lose up to about one second of acknowledged events.
    Async,
}

/// The header a trusted proxy writes the client's address in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ForwardedHeaderArg {
    /// `X-Forwarded-For: client, proxy1, …`.
    XForwardedFor,
    /// `Forwarded: for=client, for=proxy1, …` (RFC 7239).
    Forwarded,
}

/// How log lines are written (to standard error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// For people: one line per record, with its fields.
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `message`, and the fields).
    Json,
}

/// The headings the settings of `gapless serve` are grouped under (each
/// flag's `help_heading`), in the order `gapless config --markdown` prints
/// them.
pub(crate) const HEADINGS: &[&str] = &[
    "Storage",
    "Retention",
    "Streams",
    "Limits",
    "Network",
    "Authorization",
    "Durable Streams",
    "Sessions",
    "Cluster",
    "Logging and console",
];

/// `gapless config` flags: the same settings as `serve`, printed instead of run.
#[derive(Debug, clap::Args)]
pub(crate) struct ConfigArgs {
    /// Print a commented configuration file with every setting, its unit and its default.
    #[arg(long)]
    pub default: bool,
    /// Print the settings as Markdown tables (flag, default, meaning), every
    /// heading's or one's (`--markdown Cluster`): the tables of the README
    /// and docs.
    #[arg(long, value_name = "HEADING", num_args = 0..=1, default_missing_value = "all", conflicts_with = "default")]
    pub markdown: Option<String>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub serve: ServeArgs,
}

/// `gapless serve` flags.
#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// A TOML file of settings, named as these flags with `_` for `-`
    /// (`retention_events = 1000`), and of namespace tables
    /// (`[namespaces.chat]`: the rules of channels named `chat:…`; see
    /// `gapless config --default`). Flags and GAPLESS_* variables win over it.
    #[arg(long, value_name = "FILE", env = "GAPLESS_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on; port 0 picks a free port (printed at start).
    #[arg(
        help_heading = "Network",
        value_name = "ADDR",
        long,
        env = "GAPLESS_LISTEN",
        default_value = "127.0.0.1:8080"
    )]
    pub listen: SocketAddr,
    /// Directory of the embedded durable journal (created if missing).
    #[arg(
        help_heading = "Storage",
        value_name = "DIR",
        long,
        env = "GAPLESS_DATA_DIR",
        default_value = "./gapless-data"
    )]
    pub data_dir: PathBuf,
    /// Keep everything in memory instead of on disk: a restart loses history,
    /// and clients are told (a gap with reason `epoch`).
    #[arg(help_heading = "Storage", long, env = "GAPLESS_MEMORY")]
    pub memory: bool,
    /// Bytes that must stay free on the data directory's filesystem: below it
    /// publishes are refused (507 journal_full) and resume by themselves once
    /// space is freed; 0 turns the check off.
    #[arg(
        help_heading = "Storage",
        long,
        env = "GAPLESS_MIN_FREE_DISK_BYTES",
        default_value_t = 67_108_864
    )]
    pub min_free_disk_bytes: u64,
    /// Most bytes of journal file pages kept in memory by the embedded
    /// journal's storage engine (pages read by history and catch-up reads,
    /// pages written and not yet on disk); at least 1048576. A larger cache
    /// serves more reads of old events from memory; the kernel's page cache
    /// holds the file beside it (docs/deploy.md, "Memory").
    #[arg(help_heading = "Storage", long, env = "GAPLESS_JOURNAL_CACHE_BYTES", default_value_t = 67_108_864, value_parser = clap::value_parser!(u64).range(1_048_576..))]
    pub journal_cache_bytes: u64,
    /// Most events retained per channel: right after a publish a channel
    /// serves at most its newest N; 0 = no count limit. A namespace table's
    /// retention_events wins over it for its channels.
    #[arg(
        help_heading = "Retention",
        long,
        env = "GAPLESS_RETENTION_EVENTS",
        default_value_t = 100_000
    )]
    pub retention_events: u64,
    /// Age in milliseconds after which events are evicted (eviction lags at
    /// most 1 s); 0 keeps them forever.
    #[arg(
        help_heading = "Retention",
        long,
        env = "GAPLESS_RETENTION_MS",
        default_value_t = 86_400_000
    )]
    pub retention_ms: u64,
    /// Most bytes of event data retained per channel (its newest events
    /// whose data fits; the newest event is always kept); 0 = no byte limit.
    #[arg(
        help_heading = "Retention",
        long,
        env = "GAPLESS_RETENTION_BYTES",
        default_value_t = 0
    )]
    pub retention_bytes: u64,
    /// Milliseconds between SSE heartbeat comments and WebSocket pings (every N ms, whether or not events flow); 0 sends none.
    #[arg(
        help_heading = "Streams",
        long,
        env = "GAPLESS_HEARTBEAT_MS",
        default_value_t = 15_000
    )]
    pub heartbeat_ms: u64,
    /// Threads that write SSE streams, apart from the threads that serve
    /// publishes and other requests; 0 means one per CPU core but one (at least one); at most 1024.
    #[arg(help_heading = "Streams", long, env = "GAPLESS_FANOUT_THREADS", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub fanout_threads: u16,
    /// When a publish is acknowledged (in cluster mode it only decides which
    /// Redis settings are checked at start: docs/cluster.md).
    #[arg(help_heading = "Storage", long, env = "GAPLESS_DURABILITY", value_enum, default_value_t = DurabilityArg::Sync)]
    pub durability: DurabilityArg,
    /// Largest event data, in bytes (413 above); at least 1.
    #[arg(help_heading = "Limits", long, env = "GAPLESS_MAX_EVENT_BYTES", default_value_t = 1_048_576, value_parser = at_least_one)]
    pub max_event_bytes: usize,
    /// Most events in one batch publish (413 above); at least 1.
    #[arg(help_heading = "Limits", long, env = "GAPLESS_MAX_BATCH_EVENTS", default_value_t = 1000, value_parser = at_least_one)]
    pub max_batch_events: usize,
    /// Largest batch publish body, in bytes (413 above); at least 1.
    #[arg(help_heading = "Limits", long, env = "GAPLESS_MAX_BATCH_BYTES", default_value_t = 16_777_216, value_parser = at_least_one)]
    pub max_batch_bytes: usize,
    /// Most channels one SSE subscription or WebSocket may follow (SSE: 400 above; WebSocket: a `limit_reached` error).
    #[arg(help_heading = "Limits", long, env = "GAPLESS_MAX_SUBSCRIPTION_CHANNELS", default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=255))]
    pub max_subscription_channels: u16,
    /// Most open client connections; 0 = no limit. Above it a connection is
    /// answered 503 and closed (an SSE client is told to retry; probes are
    /// still served: docs/security.md, "Limits").
    #[arg(
        help_heading = "Limits",
        long,
        env = "GAPLESS_MAX_CONNECTIONS",
        default_value_t = 10_000
    )]
    pub max_connections: usize,
    /// Reconnect delay sent to SSE clients in `retry:`, in milliseconds.
    #[arg(
        help_heading = "Streams",
        long,
        env = "GAPLESS_RETRY_MS",
        default_value_t = 1000
    )]
    pub retry_ms: u64,
    /// TCP keepalive idle time and probe interval, in milliseconds; 0 turns it off.
    #[arg(
        help_heading = "Network",
        long,
        env = "GAPLESS_TCP_KEEPALIVE_MS",
        default_value_t = 15_000
    )]
    pub tcp_keepalive_ms: u64,
    /// The liveness bound in milliseconds: a client that acknowledges nothing this long while the server
    /// waits for an answer is dropped (TCP_USER_TIMEOUT, and on streams a check by progress that keeps
    /// slow readers); a client that reads slowly but answers stays. 0 = kernel
    /// default (docs/reliability.md).
    #[arg(
        help_heading = "Network",
        long,
        env = "GAPLESS_TCP_USER_TIMEOUT_MS",
        default_value_t = 30_000
    )]
    pub tcp_user_timeout_ms: u64,
    /// An origin allowed to call the API and open streams from a browser
    /// (repeatable, or comma-separated), spelled as a browser's Origin header:
    /// scheme://host[:port], no path, e.g. `https://app.example.com` (a
    /// trailing `/` is dropped; anything else is refused at start). Listed
    /// origins may send credentials (cookies): the gapless_token cookie is
    /// honoured on WebSockets and writes only from this server's own origin
    /// and these. `*` allows any origin without credentials. Default: `*` when the server is open, none (no
    /// cross-origin access) once a JWT key is set.
    #[arg(
        help_heading = "Network",
        value_name = "ORIGIN",
        long = "cors-origin",
        alias = "cors-origins",
        env = "GAPLESS_CORS_ORIGIN",
        value_delimiter = ','
    )]
    pub cors_origin: Vec<String>,
    /// HS256 secret that tokens are verified with (at least 32 bytes advised).
    /// With any JWT key set, every publish, subscribe, history read, channel
    /// read and session operation needs a token (docs/security.md); or
    /// --jwt-secret-file.
    #[arg(
        help_heading = "Authorization",
        value_name = "SECRET",
        long,
        env = "GAPLESS_JWT_SECRET",
        hide_env_values = true
    )]
    pub jwt_secret: Option<String>,
    /// File holding the HS256 secret (its bytes, without a trailing newline).
    #[arg(
        help_heading = "Authorization",
        value_name = "FILE",
        long,
        env = "GAPLESS_JWT_SECRET_FILE",
        conflicts_with = "jwt_secret"
    )]
    pub jwt_secret_file: Option<PathBuf>,
    /// PEM file of a public key tokens are verified with: RSA (RS256) or EC P-256 (ES256).
    #[arg(
        help_heading = "Authorization",
        value_name = "FILE",
        long,
        env = "GAPLESS_JWT_PUBLIC_KEY"
    )]
    pub jwt_public_key: Option<PathBuf>,
    /// Clock skew allowed on a token's `exp` and `nbf`, in milliseconds; a
    /// token is honoured until `exp` plus this.
    #[arg(
        help_heading = "Authorization",
        long,
        env = "GAPLESS_JWT_LEEWAY_MS",
        default_value_t = 5000
    )]
    pub jwt_leeway_ms: u64,
    /// When set, a token's `aud` must contain this.
    #[arg(
        help_heading = "Authorization",
        value_name = "AUD",
        long,
        env = "GAPLESS_JWT_AUDIENCE"
    )]
    pub jwt_audience: Option<String>,
    /// When set, a token's `iss` must be this.
    #[arg(
        help_heading = "Authorization",
        value_name = "ISS",
        long,
        env = "GAPLESS_JWT_ISSUER"
    )]
    pub jwt_issuer: Option<String>,
    /// Most open connections from one client IP address (past it: refused
    /// like past --max-connections); 0 = no limit. Behind a reverse proxy set
    /// --trusted-proxy: from the proxy it counts each forwarded client's
    /// requests in flight instead (docs/deploy.md).
    #[arg(
        help_heading = "Limits",
        long,
        env = "GAPLESS_MAX_CONNECTIONS_PER_IP",
        default_value_t = 1000
    )]
    pub max_connections_per_ip: usize,
    /// A reverse proxy or load balancer whose forwarded client address is
    /// believed: a network in CIDR notation or one address (repeatable, or
    /// comma-separated), e.g. `10.0.0.0/8`. From these peers the client is the
    /// rightmost address of --forwarded-header not itself trusted, and the
    /// per-IP limit, the publish rate per IP and the logs use it. Default:
    /// none (every peer is the client).
    #[arg(
        help_heading = "Network",
        value_name = "CIDR",
        long = "trusted-proxy",
        env = "GAPLESS_TRUSTED_PROXY",
        value_delimiter = ',',
        value_parser = gapless_server::net::forwarded::parse_net
    )]
    pub trusted_proxy: Vec<gapless_server::net::forwarded::IpNet>,
    /// The header a --trusted-proxy writes the client's address in:
    /// `x-forwarded-for` (nginx, HAProxy, Envoy, cloud load balancers) or
    /// `forwarded` (RFC 7239 `for=`). Only this one is read: a proxy passes the
    /// other through from the client untouched.
    #[arg(help_heading = "Network", long, env = "GAPLESS_FORWARDED_HEADER", value_enum, default_value_t = ForwardedHeaderArg::XForwardedFor)]
    pub forwarded_header: ForwardedHeaderArg,
    /// Publish rate per publisher (token `sub`, else client IP), in events per
    /// second (past it: 429 with Retry-After); 0 = no limit.
    #[arg(
        help_heading = "Limits",
        long,
        env = "GAPLESS_PUBLISH_RATE",
        default_value_t = 0
    )]
    pub publish_rate: u32,
    /// Events a publisher may send in a burst above --publish-rate; 0 = the same as the rate.
    #[arg(
        help_heading = "Limits",
        long,
        env = "GAPLESS_PUBLISH_BURST",
        default_value_t = 0
    )]
    pub publish_burst: u32,
    /// Slowest accepted request body, in bytes per second on average after
    /// --header-timeout-ms (slower: 408 and close); 0 = no limit.
    #[arg(
        help_heading = "Limits",
        long,
        env = "GAPLESS_MIN_BODY_RATE",
        default_value_t = 4096
    )]
    pub min_body_rate: u64,
    /// The path prefix the Durable Streams protocol is served under
    /// (docs/durable-streams.md): a stream's URL is PREFIX/PATH. It starts
    /// with `/`, has at most 256 bytes, and its segments are non-empty and
    /// of A-Z a-z 0-9 - . _ ~ ! $ & ' ( ) * + , ; = : @ (not `.`, `..` or
    /// `__ds`); not `/`, `/v1`, or one of gapless's own paths (`/v1/channels`,
    /// `/v1/sessions`, `/v1/sse`, `/v1/ws`, `/v1/openapi.json`, `/healthz`,
    /// `/readyz`, `/metrics`) or under one; `/v1/stream` is free. Empty
    /// turns the protocol off.
    #[arg(help_heading = "Durable Streams", value_name = "PATH", long, env = "GAPLESS_DS_PREFIX", default_value = "/ds", value_parser = ds_prefix)]
    pub ds_prefix: String,
    /// How long a Durable Streams long-poll (`live=long-poll`) waits for data
    /// before answering 204, in milliseconds; 1 to 600000.
    #[arg(help_heading = "Durable Streams", long, env = "GAPLESS_DS_LONG_POLL_TIMEOUT_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub ds_long_poll_timeout_ms: u64,
    /// Let Durable Streams webhook subscriptions target loopback addresses
    /// (localhost, 127.0.0.0/8, ::1), over http or https: the protocol's
    /// development exception. Off: only public https:// URLs are accepted.
    /// Other internal addresses (RFC 1918, link-local, …) are always refused.
    #[arg(help_heading = "Durable Streams", long, env = "GAPLESS_DS_WEBHOOK_ALLOW_LOOPBACK", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub ds_webhook_allow_loopback: bool,
    /// How long one Durable Streams webhook delivery may take, in
    /// milliseconds (slower: a failed delivery, retried with backoff); 100 to 600000.
    #[arg(help_heading = "Durable Streams", long, env = "GAPLESS_DS_WEBHOOK_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub ds_webhook_timeout_ms: u64,
    /// Most Durable Streams subscriptions the server (the cluster, with
    /// --redis) holds (one more: 403); 1 to 100000. The delivery task looks
    /// at every subscription every 50 ms.
    #[arg(help_heading = "Durable Streams", long, env = "GAPLESS_DS_MAX_SUBSCRIPTIONS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub ds_max_subscriptions: u64,
    /// PEM file (PKCS#8) of the Ed25519 key that signs Durable Streams
    /// webhooks, as `openssl genpkey -algorithm ed25519 -out FILE` writes it
    /// (keep it mode 0600); it must exist. Default: `ds-signing-key.pem` in
    /// --data-dir, made at the first start, so the JWK Set stays the same
    /// across restarts; with --memory, a key per process; in cluster mode
    /// (--redis), one key for every node, made by the first and kept in
    /// Redis (give every node the same file to keep it out of Redis).
    #[arg(
        help_heading = "Durable Streams",
        value_name = "FILE",
        long,
        env = "GAPLESS_DS_SIGNING_KEY"
    )]
    pub ds_signing_key: Option<PathBuf>,
    /// Largest WebSocket message a client may send, in bytes (close 1009 above).
    /// Keep it at least 6 x --max-event-bytes + 65536, so that a WebSocket
    /// publish takes every event an HTTP publish takes however its data is
    /// escaped (the default is that for the default --max-event-bytes; the
    /// server warns at start when it is lower).
    #[arg(
        help_heading = "Limits",
        long,
        env = "GAPLESS_WS_MAX_MESSAGE_BYTES",
        default_value_t = 6_356_992,
        value_parser = at_least_one
    )]
    pub ws_max_message_bytes: usize,
    /// Milliseconds an open session survives with no consumer attached before it is cancelled.
    #[arg(
        help_heading = "Sessions",
        long,
        env = "GAPLESS_SESSION_GRACE_MS",
        default_value_t = 60_000
    )]
    pub session_grace_ms: u64,
    /// Whether session consumers may resume with last_seq (false: refused with close 4400).
    #[arg(help_heading = "Sessions", long, env = "GAPLESS_SESSION_RESUME", default_value_t = true, action = clap::ArgAction::Set)]
    pub session_resume: bool,
    /// Milliseconds a client has to send a whole request head (slower: 408 if part of one came, then close).
    #[arg(help_heading = "Limits", long, env = "GAPLESS_HEADER_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout_ms: u64,
    /// Largest request head (request line and headers), in bytes (431 above); 8192 to 1048576.
    #[arg(help_heading = "Limits", long, env = "GAPLESS_MAX_HEADER_BYTES", default_value_t = 16_384, value_parser = clap::value_parser!(u64).range(8192..=1_048_576))]
    pub max_header_bytes: u64,
    /// Log format: text (for people) or json (one object per line), to standard error.
    #[arg(help_heading = "Logging and console", long, env = "GAPLESS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log level or filter (error, warn, info, debug, trace; or e.g. `gapless_server=debug`).
    /// Default: RUST_LOG if set, else info.
    #[arg(
        help_heading = "Logging and console",
        value_name = "LEVEL",
        long,
        env = "GAPLESS_LOG_LEVEL"
    )]
    pub log_level: Option<String>,
    /// Serve the console page at `GET /` (follow channels, publish test
    /// events, read history); the page needs no token, the API calls it makes do.
    /// Default: true when listening on a loopback address, false otherwise.
    #[arg(help_heading = "Logging and console", long, env = "GAPLESS_CONSOLE", action = clap::ArgAction::Set)]
    pub console: Option<bool>,
    /// Most recent events kept in memory per followed channel (older ones are
    /// read from the journal); at least 1.
    #[arg(help_heading = "Storage", long, env = "GAPLESS_WINDOW_EVENTS", default_value_t = 1024, value_parser = at_least_one)]
    pub window_events: usize,
    /// Most bytes of recent event data kept in memory per followed channel;
    /// the newest event is kept whatever its size. The frames built from the
    /// kept events for the streams that read them add about as much per
    /// format in use (docs/deploy.md, "Memory"); at least 1.
    #[arg(help_heading = "Storage", long, env = "GAPLESS_WINDOW_BYTES", default_value_t = 1_048_576, value_parser = at_least_one)]
    pub window_bytes: usize,
    /// Cluster mode (docs/cluster.md).
    #[command(flatten, next_help_heading = "Cluster")]
    pub redis: RedisArgs,
}

/// Cluster mode: the journal in Redis, shared by every node (docs/cluster.md).
#[derive(Debug, clap::Args)]
pub(crate) struct RedisArgs {
    /// Keep the journal in Redis: `redis://[user:password@]host:port[/db]` or `rediss://…`
    /// (TLS); with --redis-sentinel, comma-separated Sentinel URLs (docs/cluster.md).
    /// Default: none (the embedded journal).
    #[arg(
        long = "redis",
        value_name = "URL",
        env = "GAPLESS_REDIS",
        conflicts_with = "memory"
    )]
    pub url: Option<String>,
    /// Sentinel master name: --redis then names the Sentinels, asked for the primary at each connect.
    #[arg(
        long = "redis-sentinel",
        value_name = "NAME",
        env = "GAPLESS_REDIS_SENTINEL",
        requires = "url"
    )]
    pub sentinel: Option<String>,
    /// Longest wait for Redis per request, connect included, in milliseconds; a publish then
    /// fails with 503 `unavailable` (retry it with the same Idempotency-Key).
    #[arg(long = "redis-timeout-ms", env = "GAPLESS_REDIS_TIMEOUT_MS", default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_ms: u64,
    /// Milliseconds between re-reads of the heads of the channels this node follows (catches a
    /// lost notification when no later one comes; applies retention by age); 0 = never.
    #[arg(
        long = "redis-poll-ms",
        env = "GAPLESS_REDIS_POLL_MS",
        default_value_t = 1000
    )]
    pub poll_ms: u64,
    /// Largest append (bytes of type and data over its events) whose events the bus notification
    /// carries, so other nodes deliver them without reading Redis; larger ones are read. 0 = never.
    #[arg(
        long = "redis-inline-bytes",
        env = "GAPLESS_REDIS_INLINE_BYTES",
        default_value_t = gapless_redis::DEFAULT_INLINE_BYTES,
        value_parser = clap::value_parser!(u64).range(0..=1_048_576)
    )]
    pub inline_bytes: u64,
    /// Milliseconds a Redis connection may stay idle before the node sends a PING on it (the
    /// command connection when unused that long, the notification connection always), so idle
    /// limits of Redis (`timeout`) or of a proxy longer than this never close it; a connection
    /// closed anyway is reopened and the request sent again, without an error. 0 = no PING.
    #[arg(
        long = "redis-keepalive-ms",
        env = "GAPLESS_REDIS_KEEPALIVE_MS",
        default_value_t = gapless_redis::DEFAULT_KEEPALIVE_MS
    )]
    pub keepalive_ms: u64,
    /// Testing only: drop every Nth notification from the bus, as if it were lost; 0 = none.
    #[arg(
        long = "redis-test-drop-notifications",
        env = "GAPLESS_REDIS_TEST_DROP_NOTIFICATIONS",
        default_value_t = 0,
        hide = true
    )]
    pub test_drop_notifications: u64,
    /// Testing only: handle every Nth notification from the bus after the next one, as if the
    /// bus had reordered them; 0 = none.
    #[arg(
        long = "redis-test-reorder-notifications",
        env = "GAPLESS_REDIS_TEST_REORDER_NOTIFICATIONS",
        default_value_t = 0,
        hide = true
    )]
    pub test_reorder_notifications: u64,
}

/// The longest `--ds-prefix`, in bytes.
const MAX_DS_PREFIX: usize = 256;

/// `--ds-prefix`: empty, or `/` and then at most [`MAX_DS_PREFIX`] bytes of
/// non-empty segments of RFC 3986 path characters (unreserved, sub-delims,
/// `:` and `@`; no percent-encoding), without a trailing `/` (one is
/// dropped). A segment `.` or `..` could never be reached (clients remove
/// them), and `__ds` is the protocol's reserved segment; it may not be,
/// hold or lie under one of gapless's own paths
/// ([`gapless_server::OWN_PATHS`]; `/v1/stream` is free).
fn ds_prefix(s: &str) -> Result<String, String> {
    let p = s.trim().trim_end_matches('/');
    if s.trim().is_empty() {
        return Ok(String::new());
    }
    let own = |path: &str| {
        let under = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}/"));
        under(p, path) || under(path, p)
    };
    if let Some(path) = gapless_server::OWN_PATHS.iter().find(|path| own(path)) {
        return Err(format!(
            "{s:?} would hide gapless's own API ({path}); pick another prefix, e.g. /ds or \
             /v1/stream"
        ));
    }
    if p.is_empty() {
        return Err(format!(
            "{s:?} would hide gapless's own API (/); pick another prefix, e.g. /ds or /v1/stream"
        ));
    }
    let Some(path) = p.strip_prefix('/') else {
        return Err(format!(
            "{s:?} is not a path prefix: give one starting with `/` (e.g. /ds), or an empty value to turn Durable Streams off"
        ));
    };
    if p.len() > MAX_DS_PREFIX {
        return Err(format!(
            "the prefix has {} bytes; at most {MAX_DS_PREFIX}",
            p.len()
        ));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@".contains(c);
    for seg in path.split('/') {
        if seg.is_empty() {
            return Err(format!(
                "{s:?} has an empty segment (`//`); a prefix is segments joined by single `/`, e.g. /ds or /api/streams"
            ));
        }
        if let Some(c) = seg.chars().find(|c| !allowed(*c)) {
            return Err(format!(
                "{s:?} holds {c:?}: a prefix's segments are of A-Z a-z 0-9 - . _ ~ ! $ & ' ( ) * + , ; = : @ (no `?`, `#`, `%`, spaces or other characters)"
            ));
        }
        if seg == "." || seg == ".." || seg == "__ds" {
            return Err(format!(
                "{s:?} has the segment {seg:?}, which {}; pick another prefix, e.g. /ds",
                if seg == "__ds" {
                    "the Durable Streams protocol reserves for its subscription APIs"
                } else {
                    "clients remove from URLs, so it could never be reached"
                }
            ));
        }
    }
    Ok(p.to_owned())
}
