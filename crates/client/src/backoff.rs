//! Reconnection delays: exponential backoff with full jitter, capped, whose
//! base is the server's `retry:` (or [`Backoff::initial`] until one arrives;
//! always [`Backoff::initial`] over WebSocket, which has no `retry:`).

use std::time::Duration;

/// How long a subscription, join or session consumer waits before
/// reconnecting after a failure.
///
/// Retry number `n` (0 for the first after a failure) waits a uniformly random
/// time in `[0, min(max, base × 2ⁿ)]` ("full jitter", so that many clients cut
/// off together do not come back together). `base` is the reconnection time the
/// server sent in its last `retry:` field, or `initial` before any (and
/// always `initial` over WebSocket). A clean close by the server reconnects
/// at once, without waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The base before the server has sent `retry:`. Default 1 s.
    pub initial: Duration,
    /// The cap on any one wait. Default 30 s.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// The largest wait before retry number `attempt` (from 0) given `base`:
    /// `min(max, base × 2^attempt)`.
    pub fn ceiling(&self, base: Duration, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX);
        base.saturating_mul(factor).min(self.max)
    }

    /// A random wait in `[0, ceiling(base, attempt)]`, in whole milliseconds.
    pub fn delay(&self, base: Duration, attempt: u32) -> Duration {
        use rand::Rng;
        let ceiling = u64::try_from(self.ceiling(base, attempt).as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(rand::rng().random_range(0..=ceiling))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_and_caps() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(2),
        };
        let base = Duration::from_millis(250);
        assert_eq!(b.ceiling(base, 0), Duration::from_millis(250));
        assert_eq!(b.ceiling(base, 1), Duration::from_millis(500));
        assert_eq!(b.ceiling(base, 3), Duration::from_secs(2));
        assert_eq!(b.ceiling(base, 1000), Duration::from_secs(2));
        for attempt in 0..10 {
            let d = b.delay(base, attempt);
            assert!(d <= b.ceiling(base, attempt), "{d:?}");
        }
        assert_eq!(b.delay(Duration::ZERO, 5), Duration::ZERO);
    }
}
