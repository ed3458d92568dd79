//! `gapless serve`: opens the journal, builds the hub, binds, serves, and
//! shuts down cleanly on SIGTERM or Ctrl-C (streams end, the journal is
//! flushed, the process exits within 5 seconds).

use crate::cli::{DurabilityArg, ForwardedHeaderArg, LogFormat, ServeArgs};
use anyhow::Context;
use gapless_core::hub::{Channels, Hub, WindowLimits};
use gapless_core::memory::MemoryJournal;
use gapless_core::namespace::{Namespaces, Table};
use gapless_core::session::{SessionConfig, SessionRegistry, Sessions};
use gapless_core::Journal;
use gapless_server::auth::{Auth, AuthConfig};
use gapless_server::net::forwarded::ForwardedHeader;
use gapless_server::ops::limits::PublishLimiter;
use gapless_server::{App, ServerConfig};
use gapless_store::{Durability, EmbeddedJournal, StoreOptions};
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Runs the server until a shutdown signal, with the namespace `tables` of
/// the configuration file.
pub(crate) fn run(args: ServeArgs, tables: &BTreeMap<String, Table>) -> anyhow::Result<()> {
    // --log-level (GAPLESS_LOG_LEVEL), else RUST_LOG, else info.
    let filter = match &args.log_level {
        Some(level) => tracing_subscriber::EnvFilter::try_new(level).with_context(|| {
            format!(
                "--log-level {level:?}: not a level or filter (e.g. info, debug, gapless=debug)"
            )
        })?,
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match args.log_format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
    if let Err(e) = rlimit::increase_nofile_limit(u64::MAX) {
        tracing::warn!(error = %e, "could not raise the open-file limit");
    }
    // Memory freed when clients leave goes back to the system even on an
    // idle server (`alloc.rs`).
    if let Err(e) = crate::alloc::start_background_purge() {
        tracing::warn!(error = %e, "could not start the allocator's background thread");
    }
    // Before anything records: the process-wide Prometheus recorder for /metrics.
    let _ = gapless_server::metrics::install();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(crate::alloc::on_thread_idle)
        .build()
        .context("starting the async runtime")?;
    // Resolved once: every rule that depends on a channel's namespace asks this.
    let namespaces = Arc::new(crate::config::namespaces(&args, tables));
    rt.block_on(serve(args, namespaces))
}

async fn serve(args: ServeArgs, namespaces: Arc<Namespaces>) -> anyhow::Result<()> {
    let channels = Arc::new(Channels::new(WindowLimits {
        max_events: args.window_events,
        max_bytes: args.window_bytes,
        ..WindowLimits::default()
    }));
    // Boxed: the futures of the steps nested in one would be deeper than
    // the compiler's layout query allows.
    let store = Box::pin(open_store(&args, &namespaces, channels.clone())).await?;
    let auth = auth(&args)?.public_reads(namespaces.clone());
    let mut config = server_config(&args, cors_origins(&args, &auth)?);
    config.namespaces = namespaces;
    config.ds_signing_key = ds_signing_key(&args)?;
    config.ds_shared_signing_key = store.ds_shared_signing_key;
    let listener = bind(args.listen).with_context(|| {
        format!(
            "listening on {} (is another server on that port? pass another --listen, e.g. 127.0.0.1:0 for a free port)",
            args.listen
        )
    })?;
    let addr = listener.local_addr().context("reading the bound address")?;
    let shutdown = CancellationToken::new();
    let session_config = SessionConfig {
        grace_ms: args.session_grace_ms,
        resume: args.session_resume,
    };
    let app = Arc::new(App {
        hub: Hub::new(channels, store.journal.clone()),
        sessions: match store.session_registry {
            Some(registry) => Sessions::with_registry(session_config, registry),
            None => Sessions::new(session_config),
        },
        config,
        shutdown: shutdown.clone(),
        sockets: tokio_util::task::TaskTracker::new(),
        publish_limiter: PublishLimiter::new(args.publish_rate, args.publish_burst),
        presence: match store.presence_registry {
            Some(registry) => gapless_server::ops::presence::Presence::shared(registry),
            None => Default::default(),
        },
        auth,
        clock: Default::default(),
    });
    println!("gapless listening on http://{addr} ({})", store.described);
    if app.config.console {
        tracing::info!("console: http://{addr}/ (--console false turns it off)");
    }
    std::io::stdout().flush().ok();
    warn_about_settings(&args, addr, &app);
    serve_until_signal(app, listener, store.journal, shutdown).await
}

/// Where events are kept, and what sessions share beside it.
struct Store {
    /// The journal the hub runs on.
    journal: Arc<dyn Journal>,
    /// Cluster mode: the sessions' attach leases, in the journal's Redis
    /// (`None`: sessions keep who is attached in this process).
    session_registry: Option<Arc<dyn SessionRegistry>>,
    /// Cluster mode: presence shared through the journal's Redis.
    presence_registry: Option<Arc<dyn gapless_core::presence::PresenceRegistry>>,
    /// For the start line: `journal in Redis`, `in memory`, `journal in <dir>`.
    described: String,
    /// Cluster mode with the Durable Streams protocol on and no
    /// `--ds-signing-key`: the webhook signing key every node shares, kept
    /// in Redis (made by the first node that needs it).
    ds_shared_signing_key: Option<Arc<dyn gapless_server::config::SharedSigningKey>>,
}

/// Opens the journal `args` name: Redis (`--redis`), memory
/// (`--memory`), or the embedded store in `--data-dir`; each channel with
/// the retention of its namespace.
async fn open_store(
    args: &ServeArgs,
    namespaces: &Arc<Namespaces>,
    channels: Arc<Channels>,
) -> anyhow::Result<Store> {
    if let Some(url) = &args.redis.url {
        let journal = open_redis(url, args, namespaces.clone(), channels).await?;
        // The attach leases live in the same Redis, on the journal's
        // connection and bus (a takeover's kick arrives on it).
        let registry = gapless_redis::RedisSessions::new(&journal);
        let presence = gapless_redis::RedisPresence::new(&journal);
        let ds_shared_signing_key: Option<Arc<dyn gapless_server::config::SharedSigningKey>> =
            if args.ds_prefix.is_empty() || args.ds_signing_key.is_some() {
                None
            } else {
                Some(Arc::new(SharedSigningKey(
                    gapless_redis::SharedValues::new(&journal),
                )))
            };
        return Ok(Store {
            journal: Arc::new(journal),
            session_registry: Some(Arc::new(registry)),
            presence_registry: Some(Arc::new(presence)),
            described: "journal in Redis".to_owned(),
            ds_shared_signing_key,
        });
    }
    if args.memory {
        return Ok(Store {
            journal: Arc::new(MemoryJournal::with_namespaces(namespaces.clone(), channels)),
            session_registry: None,
            presence_registry: None,
            described: "in memory".to_owned(),
            ds_shared_signing_key: None,
        });
    }
    let durability = match args.durability {
        DurabilityArg::Sync => Durability::Sync,
        DurabilityArg::Async => Durability::Async,
    };
    let store = EmbeddedJournal::open(
        &args.data_dir,
        StoreOptions {
            namespaces: namespaces.clone(),
            durability,
            min_free_bytes: args.min_free_disk_bytes,
            cache_bytes: usize::try_from(args.journal_cache_bytes).unwrap_or(usize::MAX),
        },
        channels,
    )
    .with_context(|| format!("opening the journal in {}", args.data_dir.display()))?;
    Ok(Store {
        journal: Arc::new(store),
        session_registry: None,
        presence_registry: None,
        described: format!("journal in {}", args.data_dir.display()),
        ds_shared_signing_key: None,
    })
}

/// The Durable Streams webhook signing key of a cluster started without
/// `--ds-signing-key`: one key for every node, its 32-byte seed kept in
/// Redis (`gapless:{shared/ds-signing-key}`), made by the first node to ask;
/// read when first needed, so a Redis unreachable at start does not stop
/// the server.
#[derive(Debug)]
struct SharedSigningKey(gapless_redis::SharedValues);

impl gapless_server::config::SharedSigningKey for SharedSigningKey {
    fn get(
        &self,
    ) -> futures::future::BoxFuture<'_, Result<gapless_server::config::DsSigningKey, String>> {
        Box::pin(async move {
            let seed = self
                .0
                .get_or_set(
                    "ds-signing-key",
                    &gapless_server::config::DsSigningKey::generate().0,
                )
                .await
                .map_err(|e| format!("reading it from Redis: {e}"))?;
            let seed: [u8; 32] = seed.as_slice().try_into().map_err(|_| {
                format!(
                    "Redis key gapless:{{shared/ds-signing-key}} holds {} bytes, not a 32-byte Ed25519 seed; delete it to have a new key made, or give every node --ds-signing-key",
                    seed.len()
                )
            })?;
            Ok(gapless_server::config::DsSigningKey(seed))
        })
    }
}

/// The origins allowed by CORS: `--cors-origin`, or, without it, `*` on an
/// open server and none with tokens.
///
/// # Errors
/// A value that is not an origin as a browser's `Origin` spells it, or `*`
/// combined with listed origins.
fn cors_origins(args: &ServeArgs, auth: &Auth) -> anyhow::Result<Vec<String>> {
    let cors_origins = if args.cors_origin.is_empty() {
        if auth.is_open() {
            vec!["*".to_owned()]
        } else {
            Vec::new()
        }
    } else {
        // An origin as a browser's `Origin` spells it, or the setting could
        // never match (a bare host, a path): refused here, not ignored. An
        // empty value lists none (`--cors-origin ''`: no CORS at all).
        args.cors_origin
            .iter()
            .filter(|o| !o.trim().is_empty())
            .map(|o| gapless_server::auth::origin::parse_origin(o))
            .collect::<Result<Vec<_>, _>>()
            .map_err(anyhow::Error::msg)?
    };
    if cors_origins.iter().any(|o| o.trim() == "*") && cors_origins.len() > 1 {
        anyhow::bail!(
            "--cors-origin: `*` (any origin, without credentials) cannot be combined with listed origins; give either `*` or the list"
        );
    }
    Ok(cors_origins)
}

/// The webhook signing key of Durable Streams subscriptions: the
/// `--ds-signing-key` file (which must exist), else `ds-signing-key.pem` in
/// the data directory (made at the first start), else none (`--memory`: a
/// key per process; cluster mode: one key shared through Redis,
/// [`SharedSigningKey`]). Nothing when the protocol is off.
fn ds_signing_key(
    args: &ServeArgs,
) -> anyhow::Result<Option<gapless_server::config::DsSigningKey>> {
    use gapless_server::config::DsSigningKey;
    if args.ds_prefix.is_empty() {
        return Ok(None);
    }
    if let Some(path) = &args.ds_signing_key {
        if !path.exists() {
            anyhow::bail!(
                "--ds-signing-key {}: no such file; make one with `openssl genpkey -algorithm ed25519 -out {}` (and chmod 600 it), or leave the setting out to keep a generated key in --data-dir",
                path.display(),
                path.display()
            );
        }
        return Ok(Some(DsSigningKey::load(path).context("--ds-signing-key")?));
    }
    if args.memory || args.redis.url.is_some() {
        // Cluster mode: the key every node shares ([`SharedSigningKey`]).
        return Ok(None);
    }
    let path = args.data_dir.join("ds-signing-key.pem");
    Ok(Some(DsSigningKey::load_or_create(&path)?))
}

/// The server's settings from the command line.
fn server_config(args: &ServeArgs, cors_origins: Vec<String>) -> ServerConfig {
    ServerConfig {
        heartbeat_ms: args.heartbeat_ms,
        retry_ms: args.retry_ms,
        max_event_bytes: args.max_event_bytes,
        max_batch_events: args.max_batch_events,
        max_batch_bytes: args.max_batch_bytes,
        max_subscription_channels: usize::from(args.max_subscription_channels),
        max_connections: args.max_connections,
        tcp_keepalive_ms: args.tcp_keepalive_ms,
        tcp_user_timeout_ms: args.tcp_user_timeout_ms,
        cors_origins,
        max_connections_per_ip: args.max_connections_per_ip,
        trusted_proxies: gapless_server::net::forwarded::TrustedProxies {
            nets: args.trusted_proxy.clone(),
            header: match args.forwarded_header {
                ForwardedHeaderArg::XForwardedFor => ForwardedHeader::XForwardedFor,
                ForwardedHeaderArg::Forwarded => ForwardedHeader::Forwarded,
            },
        },
        publish_rate: args.publish_rate,
        publish_burst: args.publish_burst,
        min_body_rate: args.min_body_rate,
        ds_prefix: args.ds_prefix.clone(),
        ds_long_poll_timeout_ms: args.ds_long_poll_timeout_ms,
        ds_webhook_allow_loopback: args.ds_webhook_allow_loopback,
        ds_webhook_timeout_ms: args.ds_webhook_timeout_ms,
        ds_max_subscriptions: usize::try_from(args.ds_max_subscriptions).unwrap_or(usize::MAX),
        cluster: args.redis.url.is_some(),
        ws_max_message_bytes: args.ws_max_message_bytes,
        header_timeout_ms: args.header_timeout_ms,
        max_header_bytes: usize::try_from(args.max_header_bytes).unwrap_or(16_384),
        console: args.console.unwrap_or(args.listen.ip().is_loopback()),
        fanout_threads: usize::from(args.fanout_threads),
        on_thread_idle: Some(crate::alloc::on_thread_idle),
        ..ServerConfig::default()
    }
}

/// Start-up warnings about settings that work but may surprise: a
/// WebSocket message limit below what a publish the HTTP API accepts needs,
/// and a server without tokens.
fn warn_about_settings(args: &ServeArgs, addr: std::net::SocketAddr, app: &App) {
    let ws_needs = gapless_server::config::ws_message_bytes_for(args.max_event_bytes);
    if args.ws_max_message_bytes < ws_needs {
        tracing::warn!(
            "--ws-max-message-bytes {} is below 6 x --max-event-bytes + 65536 = {ws_needs}: a WebSocket publish of an event the HTTP publish accepts may be closed with 1009 (docs/protocol.md); raise it to {ws_needs}",
            args.ws_max_message_bytes
        );
    }
    for (name, policy) in app.config.namespaces.named() {
        let needs = gapless_server::config::ws_message_bytes_for(policy.max_event_bytes);
        if args.ws_max_message_bytes < needs {
            tracing::warn!(
                "--ws-max-message-bytes {} is below 6 x max_event_bytes of [namespaces.{name}] + 65536 = {needs}: a WebSocket publish of an event the HTTP publish accepts there may be closed with 1009 (docs/protocol.md); raise it to {needs}",
                args.ws_max_message_bytes
            );
        }
    }
    if app.auth.is_open() {
        tracing::warn!(
            "running open: no --jwt-secret or --jwt-public-key, so anyone who can reach {addr} may publish to and read every channel (docs/security.md)"
        );
        if app.config.namespaces.any_public() {
            tracing::info!(
                "`public = true` in a namespace table changes nothing on an open server: every channel is readable without a token already"
            );
        }
    }
}

/// Serves until SIGTERM or Ctrl-C, then ends the streams (waiting at most
/// 3 s for the connections) and flushes the journal.
///
/// # Errors
/// The server loop ended on its own (it failed), or the final flush failed.
async fn serve_until_signal(
    app: Arc<App>,
    listener: tokio::net::TcpListener,
    journal: Arc<dyn Journal>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let mut server = tokio::spawn(gapless_server::serve(app, listener));
    tokio::select! {
        () = wait_for_signal() => {}
        // The server loop ends on its own only if it failed: say so and exit.
        ended = &mut server => {
            shutdown.cancel();
            journal.close().await.context("flushing the journal")?;
            return match ended {
                Ok(Ok(())) => Err(anyhow::anyhow!("the server loop ended unexpectedly")),
                Ok(Err(e)) => Err(e).context("serving"),
                Err(e) => Err(e).context("the server loop panicked"),
            };
        }
    }
    tracing::info!("shutting down: ending streams and flushing the journal");
    shutdown.cancel();
    match tokio::time::timeout(Duration::from_secs(3), server).await {
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "server loop ended with an error"),
        Ok(_) => {}
        Err(_) => tracing::warn!("connections still open after 3 s; closing anyway"),
    }
    journal.close().await.context("flushing the journal")?;
    Ok(())
}

/// Cluster mode: the journal in Redis. Warns, naming the setting, when Redis
/// cannot give the durability asked for; starts even while Redis is down
/// (publishes answer 503 and `/readyz` 503 until it is back).
async fn open_redis(
    url: &str,
    args: &ServeArgs,
    namespaces: Arc<Namespaces>,
    channels: Arc<Channels>,
) -> anyhow::Result<gapless_redis::RedisJournal> {
    let r = &args.redis;
    let journal = gapless_redis::RedisJournal::open(
        gapless_redis::RedisOptions {
            url: url.to_owned(),
            sentinel_master: r.sentinel.clone(),
            timeout_ms: r.timeout_ms,
            namespaces,
            poll_ms: r.poll_ms,
            inline_bytes: r.inline_bytes,
            keepalive_ms: r.keepalive_ms,
            token_lifetime_ms: None,
            drop_notifications_every: r.test_drop_notifications,
            reorder_notifications_every: r.test_reorder_notifications,
        },
        channels,
    )
    .context("opening the Redis journal")?;
    match journal
        .check_settings(args.durability == DurabilityArg::Sync)
        .await
    {
        Ok(warnings) => {
            for w in warnings {
                tracing::warn!("{w}");
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "Redis is unreachable at start; retrying in the background")
        }
    }
    Ok(journal)
}

/// The token verifier from the `--jwt-*` flags (open when none names a key).
fn auth(args: &ServeArgs) -> anyhow::Result<Auth> {
    let secret = match (&args.jwt_secret, &args.jwt_secret_file) {
        (Some(s), _) => Some(s.as_bytes().to_vec()),
        (None, Some(path)) => {
            let mut bytes = std::fs::read(path)
                .with_context(|| format!("reading --jwt-secret-file {}", path.display()))?;
            while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                bytes.pop();
            }
            Some(bytes)
        }
        (None, None) => None,
    };
    Auth::new(&AuthConfig {
        secret,
        public_key: args.jwt_public_key.clone(),
        leeway_ms: args.jwt_leeway_ms,
        audience: args.jwt_audience.clone(),
        issuer: args.jwt_issuer.clone(),
    })
    .context("setting up token verification")
}

/// Binds with a deep accept queue (4096, capped by the kernel's somaxconn), so
/// a burst of connects (a reconnect storm) is not met with dropped SYNs.
fn bind(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = match addr {
        std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(4096)
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
