//! Abuse limits that apply per request: the publish rate per publisher
//! (`--publish-rate`, `--publish-burst`) and the slowest accepted request
//! body (`--min-body-rate`). Connection limits live in `listener.rs`.
//! Every limit, its default and its refusal are in `docs/security.md`.

use crate::auth::Grant;
use crate::error::ApiError;
use crate::ServerConfig;
use gapless_protocol::codes::ErrorCode;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::time::Duration;

/// The publish rate limiter: a token bucket (GCRA) per publisher, keyed by
/// the token's `sub`, or by the client's IP address when the request has no
/// subject (an open server, or a token without `sub`).
#[derive(Debug)]
pub struct PublishLimiter {
    limiter: Option<DefaultKeyedRateLimiter<String>>,
    rate: u32,
    burst: u32,
}

impl PublishLimiter {
    /// `rate` events per second with bursts of `burst` events (0: the same as
    /// `rate`); a `rate` of 0 turns the limit off.
    pub fn new(rate: u32, burst: u32) -> Self {
        let burst = if burst == 0 { rate } else { burst };
        let limiter = NonZeroU32::new(rate).map(|r| {
            let b = NonZeroU32::new(burst).unwrap_or(r);
            RateLimiter::keyed(Quota::per_second(r).allow_burst(b))
        });
        PublishLimiter {
            limiter,
            rate,
            burst,
        }
    }

    /// Takes `events` from the publisher's bucket, all or none.
    ///
    /// # Errors
    /// 429 `rate_limited` with `Retry-After` (whole seconds, at least 1)
    /// when the bucket holds fewer; the message says when and which setting.
    pub fn take(&self, grant: &Grant, ip: Option<IpAddr>, events: usize) -> Result<(), ApiError> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        let key = match (&grant.subject, ip) {
            (Some(sub), _) => format!("sub:{sub}"),
            (None, Some(ip)) => format!("ip:{ip}"),
            (None, None) => "ip:unknown".to_owned(),
        };
        let n =
            NonZeroU32::new(u32::try_from(events).unwrap_or(u32::MAX)).unwrap_or(NonZeroU32::MIN);
        match limiter.check_key_n(&key, n) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => {
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                Err(self.refusal(wait, events))
            }
            Err(_) => Err(ApiError::new(
                ErrorCode::RateLimited,
                format!(
                    "a batch of {events} events is larger than the publish burst of {} \
                     (--publish-burst); send smaller batches",
                    self.burst
                ),
            )
            .with("limit", self.burst)
            .retry_after(1)),
        }
    }

    fn refusal(&self, wait: Duration, events: usize) -> ApiError {
        let secs = wait.as_secs_f64().ceil().max(1.0) as u64;
        ApiError::new(
            ErrorCode::RateLimited,
            format!(
                "publish rate limit reached: at most {} events/s with bursts of {} per publisher \
                 (--publish-rate, --publish-burst); {events} event(s) were refused, nothing was \
                 appended; retry in {:.1} s",
                self.rate,
                self.burst,
                wait.as_secs_f64()
            ),
        )
        .with("retry_after_ms", wait.as_millis() as u64)
        .retry_after(secs)
    }

    /// Forgets publishers whose buckets are full again (called about every 250 ms).
    pub fn sweep(&self) {
        if let Some(l) = &self.limiter {
            l.retain_recent();
        }
    }
}

/// How long a body may take: a grace period, then at least `min_rate`
/// bytes per second on average since the start. `None` when off.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyPace {
    /// Time allowed before the rate counts, in milliseconds (`--header-timeout-ms`).
    pub grace_ms: u64,
    /// Slowest accepted average, in bytes per second (`--min-body-rate`); 0 = no limit.
    pub min_rate: u64,
}

impl BodyPace {
    /// The pace `config` sets: `--header-timeout-ms` of grace, then
    /// `--min-body-rate` (see [`ServerConfig::min_body_rate`]).
    pub(crate) fn of(config: &ServerConfig) -> Self {
        BodyPace {
            grace_ms: config.header_timeout_ms,
            min_rate: config.min_body_rate,
        }
    }

    /// The deadline for the next piece of a body of which `received` bytes
    /// arrived since `start`; `None` when the limit is off.
    pub(crate) fn deadline(
        &self,
        start: tokio::time::Instant,
        received: usize,
    ) -> Option<tokio::time::Instant> {
        if self.min_rate == 0 {
            return None;
        }
        let earned_ms = (received as u64).saturating_mul(1000) / self.min_rate;
        Some(start + Duration::from_millis(self.grace_ms.saturating_add(earned_ms)))
    }

    /// The 408 answer for a body that fell behind.
    pub(crate) fn refusal(&self, received: usize) -> ApiError {
        ApiError::new(
            ErrorCode::RequestTimeout,
            format!(
                "the request body arrived too slowly ({received} bytes so far): after {} ms a body \
                 must average at least {} bytes/s (--min-body-rate)",
                self.grace_ms, self.min_rate
            ),
        )
    }
}
