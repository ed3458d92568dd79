//! Transport settings: limits, heartbeat and socket options. Every field but
//! `read_batch` and `on_thread_idle` is a `gapless serve` flag of the same
//! name (see the README's settings table).
//!
//! At the top of the crate, under every part: it imports none of them
//! (`tests/layers.rs`), so what a setting's value is (the trusted proxies)
//! is defined here and what a part makes of it lives in the part
//! (`net::forwarded`, `ops::limits`).

use gapless_core::namespace::Namespaces;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Settings of the HTTP/SSE transport.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Milliseconds between SSE heartbeat comments (every period, whether or not
    /// events flow) and WebSocket pings; 0 sends none.
    /// Default 15000.
    pub heartbeat_ms: u64,
    /// Reconnection delay, in milliseconds, sent to SSE clients in the `retry:` field.
    /// Default 1000.
    pub retry_ms: u64,
    /// Largest event `data`, in bytes; a larger publish gets 413. Default
    /// 1048576. The server's setting: what a channel is held to is its
    /// namespace's ([`ServerConfig::namespaces`]), which is this unless the
    /// namespace's table sets `max_event_bytes`.
    pub max_event_bytes: usize,
    /// Most events in one batch publish; more gets 413. Default 1000.
    pub max_batch_events: usize,
    /// Largest batch publish body, in bytes; larger gets 413. Default 16777216.
    pub max_batch_bytes: usize,
    /// Most channels one SSE subscription or WebSocket may follow; more gets 400
    /// on SSE and a `limit_reached` error on WebSocket. Default 64.
    pub max_subscription_channels: usize,
    /// Most open client connections; a connection past it is answered 503 and
    /// closed. 0 = no limit (as for `max_connections_per_ip`). Default 10000.
    pub max_connections: usize,
    /// TCP keepalive idle time and probe interval on accepted sockets, in
    /// milliseconds (3 probes); 0 leaves keepalive off. Default 15000.
    pub tcp_keepalive_ms: u64,
    /// The liveness bound, in milliseconds: `TCP_USER_TIMEOUT` on accepted
    /// sockets (a connection whose sent data stays unacknowledged this long is
    /// dropped); on an SSE stream written by the fan-out writer and a `/v1/ws`
    /// socket, the server clears that timer (it would cut a slow reader's full
    /// window) and drops the client itself when its TCP owes an answer and has
    /// acknowledged nothing, not even a window probe, for this long
    /// (`tcp_info.rs`). 0 leaves the kernel defaults (about 16 minutes) and no
    /// check. Default 30000. With the keepalive default, a client that vanishes
    /// without a FIN is dropped within 60 seconds (`docs/reliability.md`).
    pub tcp_user_timeout_ms: u64,
    /// Origins allowed by CORS (`--cors-origin`, repeatable): `["*"]` lets any
    /// page call the API without credentials (cookies); listed origins (e.g.
    /// `https://app.example.com`) may also send credentials, so
    /// `new EventSource(url, {withCredentials: true})` works from them; empty
    /// sends no CORS headers (no cross-origin access). `gapless serve`
    /// defaults to `*` on an open server and to none once tokens are on.
    pub cors_origins: Vec<String>,
    /// Most open connections from one client IP address; past it a new
    /// connection is refused like one past `max_connections`. 0 = no limit.
    /// From a trusted proxy (`trusted_proxies`) it counts the requests in
    /// flight per forwarded client address instead (`listener.rs`).
    /// Default 1000.
    pub max_connections_per_ip: usize,
    /// The reverse proxies whose forwarded client address is believed
    /// (`--trusted-proxy`, `--forwarded-header`; `forwarded.rs`). Default none.
    pub trusted_proxies: TrustedProxies,
    /// Publish rate per publisher (token `sub`, or client IP), in events per
    /// second; 0 = no limit. Past it: 429 `rate_limited` with `Retry-After`.
    /// Default 0.
    pub publish_rate: u32,
    /// Events a publisher may send at once above `publish_rate` (the bucket
    /// size); 0 = the same as `publish_rate`. Default 0.
    pub publish_burst: u32,
    /// Slowest accepted request body, in bytes per second on average, counted
    /// after `header_timeout_ms`; a slower body is answered 408
    /// `request_timeout` and the connection closed. 0 = no limit. Default 4096.
    pub min_body_rate: u64,
    /// Largest WebSocket message a client may send, in bytes; a larger one closes
    /// the socket with 1009 (it cannot be read). Default 6356992:
    /// [`ws_message_bytes_for`] the default `max_event_bytes`, so that a
    /// `publish` message fits every event the HTTP publish accepts, however
    /// its data is escaped (docs/protocol.md, "Errors and bad input").
    pub ws_max_message_bytes: usize,
    /// Milliseconds a client has to send a whole request head; a slower one is
    /// answered 408 `request_timeout` if part of a head came, and
    /// disconnected (slowloris). Default 10000.
    pub header_timeout_ms: u64,
    /// Largest request head (request line and headers), in bytes; a larger
    /// one is answered 431 and the connection closed. 8192 to 1048576
    /// (hyper's read buffer cannot be smaller). Default 16384.
    pub max_header_bytes: usize,
    /// Most events a subscriber takes from the journal or window in one step. Default 256.
    pub read_batch: usize,
    /// Whether `GET /` serves the console page (`console.rs`). `gapless serve`
    /// turns it on by default only when listening on a loopback address.
    /// Default false.
    pub console: bool,
    /// Threads of the fan-out runtime, which writes SSE streams; 0 means one
    /// per CPU core but one (at least one); the flag takes 0 to 1024 and
    /// refuses more at startup. Publishes, history and every other request
    /// run on the main runtime, so they are never queued behind a fan-out
    /// (docs/design.md, "Fan-out"). Default 0.
    pub fanout_threads: usize,
    /// Called by a fan-out thread each time it goes idle (the runtime's
    /// `on_thread_park`): the binary hands the thread's allocator cache back
    /// there (`crates/gapless/src/alloc.rs`). Not a flag. Default none.
    pub on_thread_idle: Option<fn()>,
    /// The path prefix the Durable Streams protocol is served under
    /// (`transport/ds`, docs/durable-streams.md): a stream's URL is the
    /// prefix, `/`, then its path. Empty turns the protocol off. Default `/ds`.
    pub ds_prefix: String,
    /// How long a Durable Streams long-poll (`live=long-poll`) waits for
    /// data before answering 204, in milliseconds. Default 30000.
    pub ds_long_poll_timeout_ms: u64,
    /// Whether Durable Streams webhook subscriptions may target loopback
    /// addresses (`localhost`, `127.0.0.0/8`, `::1`, over http or https):
    /// the protocol's development exception (PROTOCOL.md 6.2). Other
    /// internal addresses are always refused. Default false.
    pub ds_webhook_allow_loopback: bool,
    /// How long one webhook delivery may take (connect, send, answer), in
    /// milliseconds; slower counts as a failed delivery, retried with
    /// backoff. Default 10000.
    pub ds_webhook_timeout_ms: u64,
    /// Most Durable Streams subscriptions the server holds (`PUT` of one more
    /// answers 403 `SUBSCRIPTION_LIMIT`). Default 1000.
    pub ds_max_subscriptions: usize,
    /// The key that signs Durable Streams webhooks (`--ds-signing-key`, by
    /// default one kept in the data directory); `None`: a key made for this
    /// process (`--memory`, or cluster mode without the setting), so a
    /// restart publishes a new JWK Set. Default none.
    pub ds_signing_key: Option<DsSigningKey>,
    /// Cluster mode without `--ds-signing-key`: where the key every node
    /// shares is read, at its first use (a Redis that cannot be reached at
    /// start does not stop the server). Used when [`Self::ds_signing_key`]
    /// is `None`.
    pub ds_shared_signing_key: Option<std::sync::Arc<dyn SharedSigningKey>>,
    /// Cluster mode: other servers share the journal (`--redis`). Durable
    /// Streams subscriptions then follow each other's records and share
    /// their delivery through a lease in the journal
    /// (docs/durable-streams.md, "Subscriptions"). Default false.
    pub cluster: bool,
    /// The effective rules of each namespace (`[namespaces.NAME]` tables of
    /// the configuration file over the server's settings): the one lookup
    /// of a channel's event size limit, ephemeral publishes, start without
    /// a position, and public reads (`ops::namespaces`). Default: every
    /// channel has the server's defaults.
    pub namespaces: Arc<Namespaces>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            heartbeat_ms: 15_000,
            retry_ms: 1_000,
            max_event_bytes: 1 << 20,
            max_batch_events: 1000,
            max_batch_bytes: 16 << 20,
            max_subscription_channels: 64,
            max_connections: 10_000,
            tcp_keepalive_ms: 15_000,
            tcp_user_timeout_ms: 30_000,
            cors_origins: vec!["*".to_owned()],
            max_connections_per_ip: 1000,
            trusted_proxies: TrustedProxies::default(),
            publish_rate: 0,
            publish_burst: 0,
            min_body_rate: 4096,
            ws_max_message_bytes: ws_message_bytes_for(1 << 20),
            header_timeout_ms: 10_000,
            max_header_bytes: 16 * 1024,
            read_batch: 256,
            console: false,
            fanout_threads: 0,
            on_thread_idle: None,
            ds_prefix: "/ds".to_owned(),
            ds_long_poll_timeout_ms: 30_000,
            ds_webhook_allow_loopback: false,
            ds_webhook_timeout_ms: 10_000,
            ds_max_subscriptions: 1000,
            ds_signing_key: None,
            ds_shared_signing_key: None,
            cluster: false,
            namespaces: Arc::default(),
        }
    }
}

/// JSON a WebSocket `publish` message holds besides its escaped `data`:
/// `op`, `id`, `channel`, `type`, `idempotency_key` and their escapes, with
/// room to spare (64 KiB).
pub(crate) const WS_MESSAGE_OVERHEAD: usize = 64 << 10;

/// The smallest `ws_max_message_bytes` that fits a `publish` of every event
/// of up to `max_event_bytes` bytes of data: 6 bytes per byte of data (the
/// most a JSON string escape takes: a control character is written
/// `\u0001`, six bytes for one; a quote, a backslash or a newline takes
/// two; a character of 2 to 4 bytes written as `\uXXXX`, or as a surrogate
/// pair, takes at most three per byte) plus [`WS_MESSAGE_OVERHEAD`].
/// Saturates instead of overflowing.
pub fn ws_message_bytes_for(max_event_bytes: usize) -> usize {
    max_event_bytes
        .saturating_mul(6)
        .saturating_add(WS_MESSAGE_OVERHEAD)
}

/// Which header a trusted proxy writes the client's address in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (nginx, HAProxy, Envoy,
    /// cloud load balancers).
    #[default]
    XForwardedFor,
    /// `Forwarded: for=client, for=proxy1` (RFC 7239).
    Forwarded,
}

/// The trusted proxies: peers whose forwarded client address is believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies {
    /// The networks (`--trusted-proxy`); empty: no peer is trusted.
    pub nets: Vec<ipnet::IpNet>,
    /// The header they write (`--forwarded-header`).
    pub header: ForwardedHeader,
}

/// The Durable Streams webhook signing key (`--ds-signing-key`): the 32-byte
/// Ed25519 seed (RFC 8032) of the key that signs webhooks
/// (`ops/subscriptions/signing.rs`, PROTOCOL.md 6.5). `Debug` never shows it.
#[derive(Clone)]
pub struct DsSigningKey(pub [u8; 32]);

impl std::fmt::Debug for DsSigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DsSigningKey(<secret>)")
    }
}

/// A webhook signing key kept outside the process and shared by every node
/// of a cluster (in Redis: `gapless-redis`'s `SharedValues`), read when the
/// key is first needed.
pub trait SharedSigningKey: Send + Sync + std::fmt::Debug {
    /// The shared key, made now if no node made it before.
    ///
    /// # Errors
    /// Why it cannot be read now (the store unreachable, a value that is
    /// not a key); asked again at the next use.
    fn get(&self) -> futures::future::BoxFuture<'_, Result<DsSigningKey, String>>;
}

/// Why a webhook signing key file cannot be used (at start).
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file could not be read or written.
    #[error("the Durable Streams webhook signing key {path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        error: std::io::Error,
    },
    /// The file is there but holds no usable key.
    #[error(
        "{path} is not an Ed25519 private key in PKCS#8 PEM (-----BEGIN PRIVATE KEY-----, as \
         `openssl genpkey -algorithm ed25519 -out {path}` writes): {error}"
    )]
    Bad {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        error: String,
    },
}

impl DsSigningKey {
    /// A new random key (32 bytes from the thread's CSPRNG).
    pub fn generate() -> Self {
        Self(rand::random::<[u8; 32]>())
    }

    /// Reads the Ed25519 signing key in `path` (PKCS#8 PEM, as `openssl genpkey
    /// -algorithm ed25519` writes it) and returns its 32-byte seed. A file that
    /// others than its owner may read is used with a warning (`chmod 600` it).
    ///
    /// # Errors
    /// [`KeyFileError::Io`] when the file cannot be read (a missing file
    /// included), [`KeyFileError::Bad`] when it holds no Ed25519 private key.
    pub fn load(path: &Path) -> Result<Self, KeyFileError> {
        use ed25519_dalek::pkcs8::DecodePrivateKey as _;
        let io = |error| KeyFileError::Io {
            path: path.to_owned(),
            error,
        };
        let text = std::fs::read(path).map_err(io)?;
        let text = String::from_utf8(text).map_err(|_| KeyFileError::Bad {
            path: path.to_owned(),
            error: "the file is not text".to_owned(),
        })?;
        let key =
            ed25519_dalek::SigningKey::from_pkcs8_pem(&text).map_err(|e| KeyFileError::Bad {
                path: path.to_owned(),
                error: e.to_string(),
            })?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            if let Ok(m) = std::fs::metadata(path) {
                if m.permissions().mode() & 0o077 != 0 {
                    tracing::warn!(
                        path = %path.display(),
                        "the webhook signing key file may be read by other users; chmod 600 it"
                    );
                }
            }
        }
        Ok(DsSigningKey(key.to_bytes()))
    }

    /// Makes a new signing key in `path` (PKCS#8 PEM, mode 0600, never
    /// replacing a file already there) and returns its seed; when the file
    /// exists, reads it as [`DsSigningKey::load`] does.
    ///
    /// # Errors
    /// As [`DsSigningKey::load`], or [`KeyFileError::Io`] when the file cannot be written.
    pub fn load_or_create(path: &Path) -> Result<Self, KeyFileError> {
        use ed25519_dalek::pkcs8::EncodePrivateKey as _;
        use std::io::Write as _;
        if path.exists() {
            return Self::load(path);
        }
        let io = |error| KeyFileError::Io {
            path: path.to_owned(),
            error,
        };
        let seed = rand::random::<[u8; 32]>();
        let pem = ed25519_dalek::SigningKey::from_bytes(&seed)
            .to_pkcs8_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
            .map_err(|e| KeyFileError::Bad {
                path: path.to_owned(),
                error: e.to_string(),
            })?;
        // Written whole under a temporary name, then linked in place (a
        // link never replaces a file): a crash never leaves half a key.
        let tmp = path.with_file_name(format!(
            ".{}.{:016x}.tmp",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("key"),
            rand::random::<u64>()
        ));
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            options.mode(0o600);
        }
        let written = options.open(&tmp).and_then(|mut f| {
            f.write_all(pem.as_bytes())?;
            f.sync_all()
        });
        let linked = written.and_then(|()| std::fs::hard_link(&tmp, path));
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => {}
            // Made by another process meanwhile: use that one.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Self::load(path),
            Err(e) => return Err(io(e)),
        }
        tracing::info!(path = %path.display(), "made a new Durable Streams webhook signing key");
        Ok(DsSigningKey(seed))
    }
}
