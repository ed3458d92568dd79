//! Fan-out between nodes: the notification listener (which also carries
//! `kick <holder>` messages of session takeovers), and the per-channel
//! tracker that feeds this node's hub every commit in seq order, whoever
//! made it.
//!
//! For each channel its hub follows, a node keeps a [`Track`]: the epoch and
//! head it has reported to the hub. Every report (its own commit, a
//! notification from the bus, a periodic re-read of the head) takes the
//! channel's track lock, so reports are serialized per channel, and:
//!
//! - a report at or below the known head is dropped (already delivered);
//! - a local commit that starts right after the known head is reported as is
//!   (no read);
//! - anything else (a hole: a lost, late or reordered notification, a new
//!   epoch, a commit made on another node) is *filled*: the events after the
//!   known head are read from Redis in pages and reported in order. A hole
//!   longer than [`FILL_MAX`] events reports only the newest `FILL_MAX`; the
//!   hub then sees a discontinuity, and subscribers further behind read the
//!   journal themselves.

use crate::conn::{jitter, MAX_BACKOFF, MIN_BACKOFF};
use crate::{Inner, BUS_CHANNEL};
use futures::StreamExt;
use gapless_core::journal::ChannelState;
use gapless_core::JournalError;
use gapless_protocol::{Epoch, Event};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Most events read to fill one hole (about a default window).
pub(crate) const FILL_MAX: u64 = 1024;
/// Events per read while filling.
const FILL_PAGE: usize = 256;
/// Event data per read while filling, about.
const FILL_BYTES: usize = 1 << 20;
/// Channels re-read at once by a resync.
const RESYNC_CONCURRENCY: usize = 32;

/// What this node has reported to its hub for one channel.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Track {
    /// `(epoch, head, floor)` reported last; `None` before the first report.
    known: Option<(Epoch, u64, u64)>,
}

/// The tracks of the followed channels.
#[derive(Default)]
pub(crate) struct Trackers {
    map: Mutex<HashMap<Arc<str>, Arc<tokio::sync::Mutex<Track>>>>,
}

impl Trackers {
    fn get(&self, channel: &str) -> Arc<tokio::sync::Mutex<Track>> {
        let mut map = self.map.lock();
        if let Some(t) = map.get(channel) {
            return t.clone();
        }
        map.entry(Arc::from(channel)).or_default().clone()
    }

    fn remove(&self, channel: &str) {
        self.map.lock().remove(channel);
    }

    fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.map.lock().retain(|k, _| keep(k));
    }
}

impl Inner {
    /// Reports this node's own commit (see the module doc). Never fails: when
    /// a fill cannot be read, the events are reported as they are, and the
    /// hub's subscribers read any hole from the journal.
    pub(crate) async fn deliver_local(
        &self,
        channel: &str,
        state: ChannelState,
        events: Vec<Arc<Event>>,
    ) {
        if !self.sink.follows(channel) {
            self.trackers.remove(channel);
            self.sink.committed(channel, state, &events);
            return;
        }
        let first = events.first().map_or(state.head, |e| e.seq);
        let track = self.trackers.get(channel);
        let mut t = track.lock().await;
        match t.known {
            Some((epoch, head, _)) if epoch == state.epoch && state.head <= head => {}
            Some((epoch, head, _)) if epoch == state.epoch && first == head + 1 => {
                self.report(&mut t, channel, state, &events);
            }
            None => self.report(&mut t, channel, state, &events),
            Some(_) => {
                if let Err(e) = self.fill(&mut t, channel, state, first - 1).await {
                    tracing::warn!(channel, error = %e, "could not read a hole before a commit; reporting the commit alone");
                    self.report(&mut t, channel, state, &events);
                }
            }
        }
    }

    /// A notification `<epoch> <first> <last> <channel>` from the bus.
    async fn on_notification(&self, msg: &[u8]) {
        let Some((epoch, first, last, channel)) = parse_notification(msg) else {
            tracing::warn!(message = %String::from_utf8_lossy(msg), "malformed notification on the bus; ignored");
            return;
        };
        if !self.sink.follows(channel) {
            self.trackers.remove(channel);
            return;
        }
        let track = self.trackers.get(channel);
        let mut t = track.lock().await;
        if let Some((e, head, _)) = t.known {
            if e == epoch && head >= last {
                return;
            }
        }
        let target = ChannelState {
            epoch,
            floor: first,
            head: last,
        };
        if let Err(e) = self
            .fill(&mut t, channel, target, first.saturating_sub(1))
            .await
        {
            tracing::warn!(channel, error = %e, "could not read notified events; the next notification or re-read catches up");
        }
    }

    /// Re-reads the state of every followed channel and fills what this node
    /// missed (after a loss of the bus connection, and every `poll_ms`).
    pub(crate) async fn resync(&self) {
        let followed = self.sink.followed();
        self.trackers.retain(|c| self.sink.follows(c));
        // Once Redis is found unreachable, the rest waits for the next round
        // (each attempt would wait the whole timeout).
        let unreachable = AtomicBool::new(false);
        let unreachable = &unreachable;
        futures::stream::iter(followed)
            .for_each_concurrent(RESYNC_CONCURRENCY, |channel| async move {
                if unreachable.load(Ordering::Relaxed) {
                    return;
                }
                let state = match self.state(&channel).await {
                    Ok(s) => s,
                    Err(e) => {
                        if matches!(e, JournalError::Unavailable(_)) {
                            unreachable.store(true, Ordering::Relaxed);
                        }
                        tracing::debug!(channel = %channel, error = %e, "head re-read failed");
                        return;
                    }
                };
                let track = self.trackers.get(&channel);
                let mut t = track.lock().await;
                match t.known {
                    Some((epoch, head, floor)) if epoch == state.epoch && state.head <= head => {
                        if state.floor > floor {
                            t.known = Some((epoch, head, state.floor));
                            self.sink.evicted(&channel, state);
                        }
                    }
                    _ => {
                        if let Err(e) = self
                            .fill(&mut t, &channel, state, state.head.saturating_sub(1))
                            .await
                        {
                            tracing::debug!(channel = %channel, error = %e, "head re-read fill failed");
                        }
                    }
                }
            })
            .await;
    }

    fn report(&self, t: &mut Track, channel: &str, state: ChannelState, events: &[Arc<Event>]) {
        self.sink.committed(channel, state, events);
        let head = match t.known {
            Some((e, h, _)) if e == state.epoch => h.max(state.head),
            _ => state.head,
        };
        t.known = Some((state.epoch, head, state.floor));
    }

    /// Reads and reports, in order, the events after what `t` knows, up to
    /// at least `target.head`. `hint` is where to start when `t` knows
    /// nothing of `target.epoch` (the seq before the notified events).
    async fn fill(
        &self,
        t: &mut Track,
        channel: &str,
        target: ChannelState,
        hint: u64,
    ) -> Result<(), JournalError> {
        let mut epoch = target.epoch;
        let mut after = match t.known {
            Some((e, head, _)) if e == epoch => head,
            _ => hint,
        };
        after = after.max(target.head.saturating_sub(FILL_MAX));
        let mut restarts = 0;
        loop {
            let page = self.read(channel, after, FILL_PAGE, FILL_BYTES).await?;
            if page.state.epoch != epoch {
                // The channel changed incarnation again since the notice.
                restarts += 1;
                if restarts > 3 {
                    return Err(JournalError::Storage(format!(
                        "channel {channel} changed epoch repeatedly while being read"
                    )));
                }
                epoch = page.state.epoch;
                after = page
                    .state
                    .head
                    .saturating_sub(FILL_MAX)
                    .max(page.state.floor.saturating_sub(1));
                continue;
            }
            let reported = page.events.last().map_or(page.state.head, |e| e.seq);
            let state = ChannelState {
                head: reported,
                ..page.state
            };
            self.report(t, channel, state, &page.events);
            if page.events.is_empty() || reported >= page.state.head {
                return Ok(());
            }
            after = reported;
        }
    }
}

/// Parses `<epoch> <first> <last> <channel>`.
fn parse_notification(msg: &[u8]) -> Option<(Epoch, u64, u64, &str)> {
    let s = std::str::from_utf8(msg).ok()?;
    let mut parts = s.splitn(4, ' ');
    let epoch = parts.next()?.parse().ok()?;
    let first = parts.next()?.parse().ok()?;
    let last = parts.next()?.parse().ok()?;
    let channel = parts.next()?;
    if channel.is_empty() || first == 0 || last < first {
        return None;
    }
    Some((Epoch(epoch), first, last, channel))
}

/// The notification listener: subscribes to [`BUS_CHANNEL`] on its own
/// connection, hands each notification to a task, and on any loss of the
/// connection reconnects with backoff and jitter, then re-reads the heads of
/// every followed channel. Ends when `cancel` fires.
pub(crate) async fn listen(inner: Arc<Inner>, cancel: CancellationToken) {
    let mut backoff = MIN_BACKOFF;
    let mut was_up = false;
    loop {
        let connect = async {
            let client = inner.conn.target().client().await?;
            let mut ps = client.get_async_pubsub().await?;
            ps.subscribe(BUS_CHANNEL).await?;
            Ok::<_, redis::RedisError>(ps)
        };
        let attempt = tokio::select! {
            () = cancel.cancelled() => return,
            r = tokio::time::timeout(inner.conn.timeout(), connect) => r,
        };
        match attempt {
            Ok(Ok(ps)) => {
                backoff = MIN_BACKOFF;
                if was_up {
                    tracing::info!("Redis notifications reconnected; re-reading followed heads");
                }
                // Whatever was committed while we were not listening.
                let resync = inner.clone();
                tokio::spawn(async move { resync.resync().await });
                let mut stream = ps.into_on_message();
                loop {
                    let msg = tokio::select! {
                        () = cancel.cancelled() => return,
                        m = stream.next() => m,
                    };
                    let Some(msg) = msg else { break };
                    if let Some(holder) = msg.get_payload_bytes().strip_prefix(b"kick ") {
                        if let (Ok(holder), Some(kick)) =
                            (std::str::from_utf8(holder), inner.kick.read().as_ref())
                        {
                            kick(holder);
                        }
                        continue;
                    }
                    let n = inner.notifications.fetch_add(1, Ordering::Relaxed) + 1;
                    let every = inner.opts.drop_notifications_every;
                    if every > 0 && n.is_multiple_of(every) {
                        tracing::debug!(n, "dropping a bus notification (testing)");
                        continue;
                    }
                    let payload = msg.get_payload_bytes().to_vec();
                    let worker = inner.clone();
                    tokio::spawn(async move { worker.on_notification(&payload).await });
                }
                was_up = true;
                tracing::warn!("lost the Redis notification connection; reconnecting");
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "bus connection failed"),
            Err(_) => tracing::debug!("bus connection timed out"),
        }
        let wait = jitter(backoff);
        backoff = (backoff * 2).min(MAX_BACKOFF);
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_parse_and_bad_ones_are_refused() {
        assert_eq!(
            parse_notification(b"17 3 5 news:eu"),
            Some((Epoch(17), 3, 5, "news:eu"))
        );
        assert_eq!(
            parse_notification(b"17 1 1 session/ab"),
            Some((Epoch(17), 1, 1, "session/ab"))
        );
        for bad in [
            &b""[..],
            b"17 3 5",
            b"x 3 5 c",
            b"17 0 5 c",
            b"17 5 3 c",
            b"17 3 5 ",
        ] {
            assert_eq!(parse_notification(bad), None, "{bad:?}");
        }
    }
}
