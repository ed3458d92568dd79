//! The stream source every transport reads, once: opening a subscription
//! (refused while the server shuts down), what ends a stream on its own
//! (shutdown, the expiry of the token that opened it), the timing of its
//! one timer (heartbeat, or a liveness check with heartbeats off), and the
//! accounting of each delivery (its log line's tally, the delivery
//! metrics). `transport::sse` (its `Feed`) and `transport::ws` read it and
//! write what it gives in their own frames.
//!
//! What a stream holds for its life stays small: the end signal is one
//! boxed future and the timer is made on first use, on the runtime that
//! drives the stream (docs/design.md, "Fan-out", "Memory").

use crate::auth::Grant;
use crate::error::ApiError;
use crate::metrics::{self, Transport};
use crate::ops::stream_log::Tally;
use crate::{App, ServerConfig};
use gapless_core::subscription::{Gap, Start, Subscription};
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::Event;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Opens a subscription on `starts` (a channel and where it starts, each),
/// with the gap notices owed at its start.
///
/// # Errors
/// 503 `shutting_down` while the server stops; the journal's errors (a
/// transport may answer `unavailable` and `journal_failed` in its own way).
///
/// `group`: the subscription's wake group in its channels
/// ([`gapless_core::hub::WAKE_GROUPS`]): an SSE stream's is its phase on the
/// [`Clock`] ([`Clock::phase`]); `None` for a stream no clock ticks.
pub(crate) async fn open(
    app: &App,
    starts: Vec<(String, Start)>,
    group: Option<usize>,
) -> Result<(Subscription, Vec<Gap>), ApiError> {
    if app.shutdown.is_cancelled() {
        return Err(ApiError::new(
            ErrorCode::ShuttingDown,
            "the server is shutting down",
        ));
    }
    Ok(app
        .hub
        .subscribe(starts, app.config.read_batch, group)
        .await?)
}

/// Why a stream ends on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// The server shuts down.
    Shutdown,
    /// The token that opened the stream is no longer honoured.
    Expired,
}

/// Resolves when a stream must end. One boxed future, made once, so the
/// stream's task stays small.
pub(crate) type EndSignal = Pin<Box<dyn Future<Output = End> + Send>>;

/// When `grant`'s token stops being honoured (`None`: never, or no token).
pub(crate) fn expires_at(grant: &Grant) -> Option<std::time::Instant> {
    grant
        .remaining()
        .map(|left| std::time::Instant::now() + left)
}

/// The end of a stream: shutdown, or the token's expiry at `expires`. On a
/// child of the server's token (polling a token's future takes the token's
/// lock, and every stream sharing one token's lock on every step would
/// contend for it); its timer, if any, is made when it is first polled, on
/// the runtime that drives the stream.
pub(crate) fn end_signal(app: &App, expires: Option<std::time::Instant>) -> EndSignal {
    let shutdown = app.shutdown.child_token().cancelled_owned();
    match expires {
        None => Box::pin(async move {
            shutdown.await;
            End::Shutdown
        }),
        Some(at) => Box::pin(async move {
            tokio::select! {
                () = shutdown => End::Shutdown,
                () = tokio::time::sleep_until(Instant::from_std(at)) => End::Expired,
            }
        }),
    }
}

/// The end of a stream whose token expiry was already seen: shutdown only.
pub(crate) fn shutdown_signal(app: &App) -> EndSignal {
    end_signal(app, None)
}

/// The end of a socket's token: a timer that fires when the token stops
/// being honoured, and never on an open server (for a transport that waits
/// on it in a `select!`).
pub(crate) struct Expiry(Option<Pin<Box<tokio::time::Sleep>>>);

impl Expiry {
    /// The timer for `grant`'s token.
    pub(crate) fn new(grant: &Grant) -> Self {
        Expiry(
            grant
                .remaining()
                .map(|left| Box::pin(tokio::time::sleep(left))),
        )
    }

    /// Resolves when the token expires (never without one).
    pub(crate) async fn wait(&mut self) {
        match &mut self.0 {
            Some(s) => s.as_mut().await,
            None => std::future::pending().await,
        }
    }
}

/// The period of a stream's one timer, in milliseconds: the heartbeat
/// (`--heartbeat-ms`), or with heartbeats off, a quarter of
/// `--tcp-user-timeout-ms` (a liveness check with no frame); 0 = no timer.
pub(crate) fn tick_ms(config: &ServerConfig) -> u64 {
    match config.heartbeat_ms {
        0 => config.tcp_user_timeout_ms / 4,
        ms => ms,
    }
}

/// The value of a [`Clock`] once the server shuts down.
pub(crate) const SHUT: u64 = u64::MAX;

/// Steps of the [`Clock`] in one period: a stream ticks every `PHASES`
/// steps, in its phase ([`Clock::phase`]: streams take the phases in turn),
/// so the streams of a server (even of one channel, even opened at one
/// instant) heartbeat and check their clients in `PHASES` groups spread over
/// the period rather than all at once. A step wakes only the idle streams
/// of its phase: a stream's subscription is in the hub's wake group of its
/// phase ([`gapless_core::hub::WAKE_GROUPS`]).
pub(crate) const PHASES: u64 = gapless_core::hub::WAKE_GROUPS as u64;

/// Where a stream opened now stands on the [`Clock`] ([`Clock::phase`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Phase {
    /// Its wake group, below [`PHASES`]: it ticks at the steps `group`
    /// modulo [`PHASES`].
    pub group: usize,
    /// The step its first period counts from: the latest step of its phase
    /// at or before the open (or, in the clock's first period, the first).
    pub seen: u64,
}

impl Phase {
    /// The phase `n` (modulo [`PHASES`]) for a stream opened at step `now`.
    pub fn at(n: u64, now: u64) -> Phase {
        let group = n % PHASES;
        let back = (now % PHASES + PHASES - group) % PHASES;
        Phase {
            group: group as usize,
            seen: now.checked_sub(back).unwrap_or(group),
        }
    }
}

/// The one timer of every SSE stream of a server: it counts steps of a
/// [`PHASES`]th of the streams' period ([`tick_ms`]: the heartbeat, or the
/// liveness check with heartbeats off) and turns to [`SHUT`] when the
/// server shuts down. A stream keeps only the step it last ticked at (8
/// bytes) instead of a timer and an end signal of its own (a boxed `Sleep`,
/// 112 bytes, a child cancellation token and its boxed future, about 200
/// bytes: docs/performance.md, "Idle memory, structure by structure").
///
/// A step wakes the subscribers of the hub in its phase's wake group
/// ([`gapless_core::hub::Hub::wake_group`]): a stream waiting for its
/// channels is woken by its subscription and looks at the count
/// ([`Clock::due`]), so an idle stream registers no waker of its own, and is
/// woken once a period. A writer blocked on a full socket waits on
/// [`Clock::changed_from`] instead, and looks at every step. A stream ticks
/// every period in its phase; its first tick comes within one period of
/// its open (within two in the clock's first period). The ticking task
/// starts with the first stream ([`Clock::now`]) and ends at shutdown.
#[derive(Debug)]
pub struct Clock {
    /// Steps so far, or [`SHUT`].
    ticks: AtomicU64,
    /// Streams given a phase so far ([`Clock::phase`]: the phases in turn).
    opened: AtomicU64,
    /// The same count, for waiters that are not subscribers.
    changes: tokio::sync::watch::Sender<u64>,
    started: std::sync::OnceLock<()>,
}

impl Default for Clock {
    fn default() -> Self {
        Clock {
            ticks: AtomicU64::new(0),
            opened: AtomicU64::new(0),
            changes: tokio::sync::watch::Sender::new(0),
            started: std::sync::OnceLock::new(),
        }
    }
}

impl Clock {
    /// The count of `app`'s clock now: ticks so far, or [`SHUT`]. Starts the
    /// clock on first use (on the calling runtime; call it within one).
    pub fn now(app: &Arc<App>) -> u64 {
        app.clock.started.get_or_init(|| {
            drop(tokio::spawn(run(app.clone())));
        });
        app.clock.ticks.load(Ordering::SeqCst)
    }

    /// The phase of a stream opened now: the phases are given in turn, so
    /// streams opened together (a reconnect storm after a restart) are
    /// spread over them as well as streams opened apart. Starts the clock,
    /// as [`Clock::now`].
    pub fn phase(app: &Arc<App>) -> Phase {
        let now = Clock::now(app);
        Phase::at(app.clock.opened.fetch_add(1, Ordering::Relaxed), now)
    }

    /// The count now, the clock started or not.
    pub fn ticks(&self) -> u64 {
        self.ticks.load(Ordering::SeqCst)
    }

    /// Whether a stream that last ticked at step `seen` ticks at step `now`
    /// (a whole period, [`PHASES`] steps, or more since): if so, `seen`
    /// moves on by whole periods, so the stream keeps its phase however late
    /// it is polled. False at [`SHUT`] (the caller ends the stream instead).
    pub fn due(now: u64, seen: &mut u64) -> bool {
        if now == SHUT || !Clock::ready(now, *seen) {
            return false;
        }
        *seen = now - (now - *seen) % PHASES;
        true
    }

    /// Whether a stream that last ticked at step `seen` has something to
    /// do at count `now`: its tick ([`Clock::due`]) or the end ([`SHUT`]).
    /// For a wait that looks without moving `seen`.
    pub fn ready(now: u64, seen: u64) -> bool {
        now == SHUT || now.saturating_sub(seen) >= PHASES
    }

    /// A future that resolves once the count is other than `seen` (a count
    /// read before: a step or shutdown since then is not missed); boxed, for
    /// a writer that waits on a full socket (made only while it waits).
    pub fn changed_from(&self, seen: u64) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let mut rx = self.changes.subscribe();
        Box::pin(async move {
            let _ = rx.wait_for(|count| *count != seen).await;
        })
    }

    fn set(&self, count: u64) {
        // The count first: a stream woken by the hub or the watch reads it.
        self.ticks.store(count, Ordering::SeqCst);
        self.changes.send_replace(count);
    }
}

/// The clock's task: a step every [`PHASES`]th of the period, until shutdown.
async fn run(app: Arc<App>) {
    let step = step(tick_ms(&app.config));
    let mut beat = None;
    let mut count = 0u64;
    loop {
        tokio::select! {
            biased;
            () = app.shutdown.cancelled() => break,
            _ = interval(&mut beat, step).tick(), if !step.is_zero() => {
                count = (count + 1) % SHUT;
                app.clock.set(count);
                app.hub.wake_group(Some((count % PHASES) as usize));
            }
        }
    }
    app.clock.set(SHUT);
    app.hub.wake_group(None);
}

/// The [`Clock`]'s step for a period of `tick_ms` (0: no clock): a
/// [`PHASES`]th of it, at least a millisecond.
fn step(tick_ms: u64) -> Duration {
    if tick_ms == 0 {
        return Duration::ZERO;
    }
    (Duration::from_millis(tick_ms) / PHASES as u32).max(Duration::from_millis(1))
}

/// A stream's timer of `tick_ms`, made on first use in `slot` (on the
/// runtime that drives it): first tick one period from now, a late tick
/// delays the next ones.
pub(crate) fn timer(
    slot: &mut Option<tokio::time::Interval>,
    tick_ms: u64,
) -> &mut tokio::time::Interval {
    interval(slot, Duration::from_millis(tick_ms.max(1)))
}

/// An interval of `period`, made on first use in `slot`: first tick one
/// period from now, a late tick delays the next ones.
fn interval(
    slot: &mut Option<tokio::time::Interval>,
    period: Duration,
) -> &mut tokio::time::Interval {
    slot.get_or_insert_with(|| {
        let mut beat = tokio::time::interval_at(Instant::now() + period, period);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        beat
    })
}

/// Counts a delivery of `events` of the subscription's channel `index`:
/// the stream's tally and the delivery metrics (by `transport`).
pub(crate) fn delivered(
    transport: Transport,
    tally: &mut Tally,
    sub: &Subscription,
    index: usize,
    events: &[Arc<Event>],
) {
    tally.events(events.len());
    delivered_answer(transport, events, sub.lag(index));
}

/// Counts a delivery of `events` outside a stream's tally (a whole answer:
/// a Durable Streams catch-up or long-poll page), with `lag` events of the
/// channel still after the last: the delivery metrics only
/// (`gapless_events_delivered_total` by `transport`, the lag histograms).
pub(crate) fn delivered_answer(transport: Transport, events: &[Arc<Event>], lag: u64) {
    metrics::delivered(
        transport,
        events.len(),
        events.last().map_or(0, |e| e.time),
        lag,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_ticks_once_a_period_in_its_phase() {
        // Counting from step 6: ticks at 10, 14, 18, ...
        let mut seen = 6;
        let ticked: Vec<u64> = (7..=19).filter(|&now| Clock::due(now, &mut seen)).collect();
        assert_eq!(ticked, vec![10, 14, 18]);
        assert_eq!(seen, 18);
    }

    #[test]
    fn a_stream_polled_late_ticks_once_and_keeps_its_phase() {
        let mut seen = 6;
        // Not polled from step 7 to 16: one tick, and the phase stays (14).
        assert!(Clock::due(17, &mut seen));
        assert_eq!(seen, 14);
        assert!(!Clock::due(17, &mut seen));
        assert!(Clock::due(18, &mut seen));
    }

    #[test]
    fn phases_are_given_in_turn_each_counting_from_its_latest_step_at_or_before_the_open() {
        // Opened at step 10 (phase 2): the four next streams take phases
        // 0..3 and count from steps 8, 9, 10 and 7, so each first ticks
        // within one period (at 12, 13, 14, 11).
        let phases: Vec<Phase> = (0..4).map(|n| Phase::at(n, 10)).collect();
        let seen: Vec<u64> = phases.iter().map(|p| p.seen).collect();
        assert_eq!(seen, vec![8, 9, 10, 7]);
        for (n, p) in phases.into_iter().enumerate() {
            assert_eq!(p.group, n);
            let mut seen = p.seen;
            let first = (11..=20).find(|&now| Clock::due(now, &mut seen));
            assert_eq!(first, Some(p.seen + PHASES));
            assert_eq!(first.map(|f| f % PHASES), Some(n as u64));
        }
        // In the clock's first period a phase not yet reached counts from
        // its first step; one reached, from it.
        assert_eq!(Phase::at(3, 1), Phase { group: 3, seen: 3 });
        assert_eq!(Phase::at(1, 1), Phase { group: 1, seen: 1 });
        // What wakes a waiting stream: its tick, or the end.
        assert!(!Clock::ready(9, 6) && Clock::ready(10, 6) && Clock::ready(SHUT, 6));
        assert!(!Clock::due(SHUT, &mut 6));
    }

    #[test]
    fn a_step_is_a_fraction_of_the_period_and_none_without_one() {
        assert_eq!(step(0), Duration::ZERO);
        assert_eq!(step(15_000), Duration::from_millis(15_000 / PHASES));
        assert_eq!(step(1), Duration::from_millis(1));
    }
}
