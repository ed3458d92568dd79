//! The node's command connection to the Redis primary: one multiplexed
//! connection (concurrent requests are pipelined on it), reopened after a
//! failure with exponential backoff and jitter, and resolved through Sentinel
//! when one is configured.
//!
//! Every request is bounded by the timeout (`--redis-timeout-ms`): a Redis
//! that is down, hung, loading or read-only (a demoted primary) answers
//! [`JournalError::Unavailable`] within it, never a wait without end.

use gapless_core::JournalError;
use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{AsyncConnectionConfig, Client, ErrorKind, RedisError, ServerErrorKind};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

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
            None => Ok(Target::Direct(Client::open(url)?)),
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
                    .set_redis_connection_info(first.redis_settings().clone());
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

/// `d` scaled by a random factor in [0.5, 1.0] (so nodes do not reconnect in step).
pub(crate) fn jitter(d: Duration) -> Duration {
    d.mul_f64(0.5 + rand::random::<f64>() * 0.5)
}

impl Connector {
    pub(crate) fn new(target: Target, timeout: Duration) -> Self {
        Connector {
            target,
            timeout,
            state: Mutex::new(State {
                conn: None,
                next_try: Instant::now(),
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
    async fn get(&self) -> Result<MultiplexedConnection, JournalError> {
        let mut st = self.state.lock().await;
        if let Some(c) = &st.conn {
            return Ok(c.clone());
        }
        let now = Instant::now();
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
                st.backoff = MIN_BACKOFF;
                Ok(c)
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

    /// Forgets the connection after a failure, so the next request opens a new one.
    async fn drop_conn(&self) {
        self.state.lock().await.conn = None;
    }

    /// Runs `op` on the connection within the timeout. Connection-level
    /// failures (I/O, timeout, a primary that is loading or became a replica)
    /// drop the connection and answer [`JournalError::Unavailable`]; others
    /// (a script error) [`JournalError::Storage`].
    pub(crate) async fn run<T, F, Fut>(&self, op: F) -> Result<T, JournalError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = Result<T, RedisError>>,
    {
        let work = async {
            let conn = self.get().await?;
            match op(conn).await {
                Ok(v) => Ok(v),
                Err(e) if connection_level(&e) => {
                    self.drop_conn().await;
                    Err(JournalError::Unavailable(format!("Redis: {e}")))
                }
                Err(e) => Err(JournalError::Storage(format!("Redis: {e}"))),
            }
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok(r) => r,
            Err(_) => {
                self.drop_conn().await;
                Err(JournalError::Unavailable(format!(
                    "Redis did not answer within {} ms",
                    self.timeout.as_millis()
                )))
            }
        }
    }
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
