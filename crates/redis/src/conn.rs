//! The node's command connection to the Redis primary: one multiplexed
//! connection (concurrent requests are pipelined on it), reopened after a
//! failure with exponential backoff and jitter, and resolved through Sentinel
//! when one is configured.
//!
//! Every request is bounded by the timeout (`--redis-timeout-ms`): a Redis
//! that is down, hung, loading or read-only (a demoted primary) answers
//! [`JournalError::Unavailable`] within it, never a wait without end.
//!
//! Redis (`timeout` in redis.conf, set by many managed services) and proxies
//! close connections that stay idle. The `redis` crate's connection notices
//! the close only as the error of the next request on it (`broken pipe`),
//! and its `ConnectionManager` reconnects but still fails that request, so
//! this module does what a request needs (docs/cluster.md, "Idle
//! connections"):
//!
//! - [`Connector::run`] takes only commands that are safe to send twice (every
//!   script: reads, state, leases, and appends, which always carry an
//!   idempotency token, `scripts.rs`). When the connection turns out to be
//!   closed (broken pipe, reset, end of stream), it reopens it and sends the
//!   command once more, within the same timeout.
//! - [`Connector::run_unrepeatable`] takes a command that must not be sent
//!   twice (an ephemeral event's `PUBLISH`): on a connection idle for
//!   [`VALIDATE_AFTER`] or more it first sends a `PING` (repeated on a new
//!   connection if the old one was closed), so the command itself goes out on
//!   a connection known to be open, and is never repeated.
//! - [`Connector::keepalive`] sends a `PING` on a connection idle for the
//!   keepalive interval (`--redis-keepalive-ms`), so that it stays open
//!   under any idle timeout longer than that; and every socket has TCP
//!   keepalive on ([`tcp_settings`]), which keeps NAT and load balancer
//!   entries alive and finds a peer that vanished without a word.

use gapless_core::JournalError;
use redis::aio::MultiplexedConnection;
use redis::io::tcp::{socket2::TcpKeepalive, TcpSettings};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, ServerErrorKind};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// Idle time after which TCP keepalive probes start on a Redis socket.
pub(crate) const TCP_KEEPALIVE_TIME: Duration = Duration::from_secs(15);
/// Time between two unanswered TCP keepalive probes.
pub(crate) const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered probes after which the kernel closes the socket (so a peer that
/// vanished is found within about 15 + 3 × 5 = 30 s of silence).
pub(crate) const TCP_KEEPALIVE_RETRIES: u32 = 3;

/// `base` (the URL's TCP settings) with TCP keepalive on: probes after
/// [`TCP_KEEPALIVE_TIME`] of silence, every [`TCP_KEEPALIVE_INTERVAL`], the
/// socket closed after [`TCP_KEEPALIVE_RETRIES`] unanswered ones. Probes keep
/// NAT and load balancer entries alive and find a peer that vanished; they do
/// not reset Redis's own idle `timeout`, which only commands do (hence the
/// `PING` of [`Connector::keepalive`]).
pub(crate) fn tcp_settings(base: TcpSettings) -> TcpSettings {
    let ka = TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE_TIME)
        .with_interval(TCP_KEEPALIVE_INTERVAL);
    #[cfg(any(target_os = "linux", target_os = "macos"))]
    let ka = ka.with_retries(TCP_KEEPALIVE_RETRIES);
    base.set_keepalive(ka)
}

/// Where the primary is.
pub(crate) enum Target {
    /// A `redis://` or `rediss://` URL.
    Direct(Client),
    /// Sentinels, asked for the current primary of a master name at each (re)connect.
    Sentinel(Mutex<SentinelClient>),
}

/// The URL schemes the Redis client accepts (the `redis` crate's
/// `parse_redis_url`): `redis://` and `rediss://` (TLS) are the documented
/// ones (docs/cluster.md); the client also reads the Valkey spellings and
/// Unix sockets (`redis+unix:///path`, `unix:///path`).
pub(crate) const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "valkey",
    "valkeys",
    "redis+unix",
    "valkey+unix",
    "unix",
];

/// Checks that `url` is a Redis URL by its scheme, before the client parses
/// it, so the error names what is wrong (the client says only "Redis URL did
/// not parse"). The URL itself is never quoted: it may hold a password.
///
/// # Errors
/// What is wrong, for a person: no `scheme://`, or a scheme not in [`SCHEMES`].
pub(crate) fn check_url(url: &str) -> Result<(), String> {
    const FORM: &str =
        "a Redis URL is redis://[user:password@]host:port[/db], or rediss://… for TLS \
                        (e.g. redis://127.0.0.1:6379)";
    let Some((scheme, _)) = url.split_once("://") else {
        return Err(format!("it has no scheme (no ://): {FORM}"));
    };
    let lower = scheme.to_ascii_lowercase();
    if SCHEMES.contains(&lower.as_str()) {
        return Ok(());
    }
    let plain = !scheme.is_empty()
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b));
    if plain {
        Err(format!(
            "the scheme is {scheme}://, not a Redis one: {FORM}"
        ))
    } else {
        Err(format!("it does not start with a scheme: {FORM}"))
    }
}

impl Target {
    /// Builds the target from `--redis` (one URL, or comma-separated
    /// Sentinel URLs when `sentinel_master` is given).
    pub(crate) fn new(url: &str, sentinel_master: Option<&str>) -> Result<Self, RedisError> {
        match sentinel_master {
            None => {
                let info = redis::IntoConnectionInfo::into_connection_info(url)?;
                let tcp = tcp_settings(info.tcp_settings().clone());
                Ok(Target::Direct(Client::open(info.set_tcp_settings(tcp))?))
            }
            Some(master) => {
                let urls: Vec<&str> = url
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .collect();
                // The primary takes the same password and database as the first
                // Sentinel URL names.
                let first = redis::IntoConnectionInfo::into_connection_info(
                    urls.first().copied().unwrap_or(url),
                )?;
                let node = SentinelNodeConnectionInfo::default()
                    .set_redis_connection_info(first.redis_settings().clone())
                    .set_tcp_settings(tcp_settings(first.tcp_settings().clone()));
                let client = SentinelClient::build(
                    urls,
                    master.to_owned(),
                    Some(node),
                    SentinelServerType::Master,
                )?;
                Ok(Target::Sentinel(Mutex::new(client)))
            }
        }
    }

    /// A client for the current primary.
    pub(crate) async fn client(&self) -> Result<Client, RedisError> {
        match self {
            Target::Direct(c) => Ok(c.clone()),
            Target::Sentinel(s) => s.lock().await.async_get_client().await,
        }
    }
}

struct State {
    conn: Option<MultiplexedConnection>,
    /// Counts the connections opened, so that a failure drops only the
    /// connection it happened on, not a newer one another request opened.
    generation: u64,
    /// When a request last took the connection (or the keepalive pinged it).
    last_used: Instant,
    /// No new connection attempt before this instant (backoff).
    next_try: Instant,
    backoff: Duration,
}

/// The command connection (see the module doc).
pub(crate) struct Connector {
    target: Target,
    timeout: Duration,
    state: Mutex<State>,
}

/// First delay after a failed connect; it doubles up to [`MAX_BACKOFF`].
pub(crate) const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// Longest delay between connection attempts.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// A connection idle this long may have been closed by Redis's `timeout`
/// (whole seconds, at least 1): [`Connector::run_unrepeatable`] checks it
/// with a `PING` first.
pub(crate) const VALIDATE_AFTER: Duration = Duration::from_millis(900);

/// `d` scaled by a random factor in [0.5, 1.0] (so nodes do not reconnect in step).
pub(crate) fn jitter(d: Duration) -> Duration {
    d.mul_f64(0.5 + rand::random::<f64>() * 0.5)
}

/// A connection as [`Connector::get`] hands it out.
struct Taken {
    conn: MultiplexedConnection,
    generation: u64,
    /// How long it had been idle before this request took it.
    idle: Duration,
}

impl Connector {
    pub(crate) fn new(target: Target, timeout: Duration) -> Self {
        let now = Instant::now();
        Connector {
            target,
            timeout,
            state: Mutex::new(State {
                conn: None,
                generation: 0,
                last_used: now,
                next_try: now,
                backoff: MIN_BACKOFF,
            }),
        }
    }

    /// The request timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn target(&self) -> &Target {
        &self.target
    }

    /// The connection, opening one if there is none and the backoff allows.
    async fn get(&self) -> Result<Taken, JournalError> {
        let mut st = self.state.lock().await;
        let now = Instant::now();
        if let Some(c) = &st.conn {
            let taken = Taken {
                conn: c.clone(),
                generation: st.generation,
                idle: now.saturating_duration_since(st.last_used),
            };
            st.last_used = now;
            return Ok(taken);
        }
        if now < st.next_try {
            return Err(JournalError::Unavailable(format!(
                "Redis is unreachable; the next connection attempt is in {} ms",
                (st.next_try - now).as_millis()
            )));
        }
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let opened = async {
            let client = self.target.client().await?;
            client
                .get_multiplexed_async_connection_with_config(&cfg)
                .await
        };
        match tokio::time::timeout(self.timeout, opened).await {
            Ok(Ok(c)) => {
                st.conn = Some(c.clone());
                st.generation += 1;
                st.backoff = MIN_BACKOFF;
                st.last_used = Instant::now();
                Ok(Taken {
                    conn: c,
                    generation: st.generation,
                    idle: Duration::ZERO,
                })
            }
            Ok(Err(e)) => {
                st.next_try = Instant::now() + jitter(st.backoff);
                st.backoff = (st.backoff * 2).min(MAX_BACKOFF);
                Err(JournalError::Unavailable(format!(
                    "connecting to Redis: {e}"
                )))
            }
            Err(_) => {
                st.next_try = Instant::now() + jitter(st.backoff);
                st.backoff = (st.backoff * 2).min(MAX_BACKOFF);
                Err(JournalError::Unavailable(format!(
                    "connecting to Redis: no answer within {} ms",
                    self.timeout.as_millis()
                )))
            }
        }
    }

    /// Forgets connection `generation` after a failure on it (not a newer
    /// one), so the next request opens a new one.
    async fn drop_conn(&self, generation: u64) {
        let mut st = self.state.lock().await;
        if st.generation == generation {
            st.conn = None;
        }
    }

    /// Runs `op` on the connection within the timeout. `op` must be safe to
    /// run twice (see the module doc): when the connection turns out to be
    /// closed ([`closed`]), it is reopened and `op` runs once more, within
    /// the same timeout. Connection-level failures (I/O, timeout, a primary
    /// that is loading or became a replica) drop the connection and answer
    /// [`JournalError::Unavailable`]; others (a script error)
    /// [`JournalError::Storage`].
    pub(crate) async fn run<T, F, Fut>(&self, op: F) -> Result<T, JournalError>
    where
        F: Fn(MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = Result<T, RedisError>>,
    {
        self.bounded(async {
            let taken = self.get().await?;
            match op(taken.conn).await {
                Err(e) if closed(&e) => {
                    self.drop_conn(taken.generation).await;
                    let again = self.get().await?;
                    tracing::debug!(error = %e, "the Redis connection was closed; reconnected and sent the command again");
                    self.outcome(op(again.conn).await, again.generation).await
                }
                r => self.outcome(r, taken.generation).await,
            }
        })
        .await
    }

    /// Runs `op`, which must not reach Redis twice, on the connection within
    /// the timeout, once. A connection idle for [`VALIDATE_AFTER`] or more is
    /// checked with a `PING` first (through [`Connector::run`]), so that a
    /// connection Redis closed for idleness is replaced before `op` is sent.
    pub(crate) async fn run_unrepeatable<T, F, Fut>(&self, op: F) -> Result<T, JournalError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = Result<T, RedisError>>,
    {
        self.bounded(async {
            let mut taken = self.get().await?;
            if taken.idle >= VALIDATE_AFTER {
                let pinged = self.run(ping).await;
                pinged?;
                taken = self.get().await?;
            }
            self.outcome(op(taken.conn).await, taken.generation).await
        })
        .await
    }

    /// Sends a `PING` when the connection has been idle for `interval` or
    /// more (a request or an earlier ping resets it), so that Redis's idle
    /// `timeout` and proxies' idle limits longer than `interval` never close
    /// it. Opens no connection when there is none (the next request does).
    pub(crate) async fn keepalive(&self, interval: Duration) {
        {
            let st = self.state.lock().await;
            if st.conn.is_none() || st.last_used.elapsed() < interval {
                return;
            }
        }
        if let Err(e) = self.run(ping).await {
            tracing::debug!(error = %e, "keepalive PING to Redis failed");
        }
    }

    /// How long until the connection has been idle for `interval` (zero when
    /// it has been already).
    pub(crate) async fn idle_left(&self, interval: Duration) -> Duration {
        let st = self.state.lock().await;
        interval.saturating_sub(st.last_used.elapsed())
    }

    /// `work` within the timeout; past it the connection is dropped.
    async fn bounded<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, JournalError>>,
    ) -> Result<T, JournalError> {
        match tokio::time::timeout(self.timeout, work).await {
            Ok(r) => r,
            Err(_) => {
                self.state.lock().await.conn = None;
                Err(JournalError::Unavailable(format!(
                    "Redis did not answer within {} ms",
                    self.timeout.as_millis()
                )))
            }
        }
    }

    /// Maps the result of a command on connection `generation` (see [`Connector::run`]).
    async fn outcome<T>(
        &self,
        r: Result<T, RedisError>,
        generation: u64,
    ) -> Result<T, JournalError> {
        match r {
            Ok(v) => Ok(v),
            Err(e) if connection_level(&e) => {
                self.drop_conn(generation).await;
                Err(JournalError::Unavailable(format!("Redis: {e}")))
            }
            Err(e) => Err(JournalError::Storage(format!("Redis: {e}"))),
        }
    }
}

/// `PING` (the keepalive, and the check of an idle connection).
async fn ping(mut c: MultiplexedConnection) -> Result<(), RedisError> {
    redis::cmd("PING").query_async::<()>(&mut c).await
}

/// Whether `e` says the connection was closed under the command (broken
/// pipe, reset, aborted, end of stream, not connected): the case of a
/// connection Redis or a proxy closed while it was idle. A timeout is not
/// (Redis may be hung: a second try would only wait again), nor a refused
/// connect (nothing to retry on).
fn closed(e: &RedisError) -> bool {
    e.is_connection_dropped() && !e.is_connection_refusal() && !e.is_timeout()
}

/// Whether `e` says the connection or the server's role is the problem (retry
/// elsewhere or later) rather than the request.
fn connection_level(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::ReadOnly
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
            )
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_that_is_not_redis_is_named_by_what_is_wrong_and_never_quoted() {
        for ok in [
            "redis://127.0.0.1:6379",
            "rediss://h:6380/#insecure",
            "REDIS://h",
            "redis+unix:///tmp/r.sock",
        ] {
            assert_eq!(check_url(ok), Ok(()), "{ok}");
        }
        let e = check_url("http://x").expect_err("http");
        assert!(e.contains("the scheme is http://"), "{e}");
        assert!(e.contains("redis://") && e.contains("rediss://"), "{e}");
        let e = check_url("127.0.0.1:6379").expect_err("no scheme");
        assert!(e.contains("no scheme"), "{e}");
        let e = check_url("user:secret@h://x").expect_err("garbled");
        assert!(e.contains("does not start with a scheme"), "{e}");
        assert!(!e.contains("secret"), "the URL is not quoted: {e}");
        // Every scheme let through is one the client reads.
        for s in SCHEMES {
            let url = if s.contains("unix") {
                format!("{s}:///tmp/r.sock")
            } else {
                format!("{s}://127.0.0.1:6379")
            };
            assert!(redis::parse_redis_url(&url).is_some(), "{url}");
        }
    }
}
