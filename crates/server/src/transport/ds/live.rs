//! Live SSE reads (`GET {stream}?offset=…&live=sse`, PROTOCOL.md 5.8) as a
//! source of frames ([`Feed`]) for the fan-out writer (`net/conn.rs`), as
//! gapless's own SSE streams are: a connection whose first request is such a
//! read is written straight to its socket, each write carrying everything
//! the follower has pending; on a connection that already carried another
//! request, hyper writes the same feed (`conn::body`).
//!
//! Each write is one `event: data` holding every append the subscription
//! has ready (up to `ServerConfig::read_batch`, 256 messages): a JSON
//! stream's messages as one array, a text stream's bytes one after another
//! (each line its own `data:` line), a binary stream's bytes one after another in base64; then one
//! `event: control` with the offset after them. The feed reads nothing of
//! the stream's metadata on the way and takes no lock: its closure and
//! deletion come through the stream's watch (`Meta::watch`).
//!
//! What ends a feed on its own is gapless's rule for every stream
//! (`ops::stream::end_signal`): shutdown, and the expiry of the token that
//! opened it (`exp` plus `--jwt-leeway-ms`), at which the response ends
//! cleanly (no frame: the protocol has none for it); the client reconnects
//! and its expired token is refused 401. Its deliveries are counted in
//! `gapless_events_delivered_total{transport="ds"}` and its end is logged
//! as every stream's (`ops::stream_log`, `transport=ds`).

use super::read::{READ_BYTES, READ_EVENTS};
use crate::metrics::Transport;
use crate::net::conn::{Flow, Frames, Gone, Waited};
use crate::ops::stream::{self, End, EndSignal};
use crate::ops::stream_log::{ChannelList, Ended, Tally};
use crate::ops::streams::layout::{self, Layout};
use crate::ops::streams::names::{next_cursor, offset};
use crate::ops::streams::Life;
use crate::App;
use bytes::Bytes;
use gapless_core::journal::now_ms;
use gapless_core::subscription::{Item, Subscription};
use gapless_protocol::ds::{control_event, data_event, Shape};
use gapless_protocol::{Epoch, Event};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long one response lasts at least before the server ends it, so the
/// client reconnects from its last `streamNextOffset` (PROTOCOL.md 10.2):
/// the response ends at the tick of its timer ([`period_ms`]) that reaches
/// this (later when ticks come late).
pub(crate) const SSE_LIFETIME: Duration = Duration::from_secs(60);

/// The period of a live read's timer, in milliseconds: gapless's stream
/// timer ([`stream::tick_ms`]: the heartbeat, or a liveness check with
/// heartbeats off); without one, [`SSE_LIFETIME`], so the response still ends.
fn period_ms(config: &crate::ServerConfig) -> u64 {
    match stream::tick_ms(config) {
        0 => u64::try_from(SSE_LIFETIME.as_millis()).unwrap_or(u64::MAX),
        ms => ms,
    }
}

/// Where a live read starts: what the handler knew under the stream's lock.
pub(crate) struct Start {
    /// The stream's layout (where its messages are).
    pub layout: Arc<Layout>,
    /// The epoch of its offsets.
    pub epoch: Epoch,
    /// How its messages are written.
    pub shape: Shape,
    /// The position after which to read.
    pub from: u64,
    /// The stream's tail at the request.
    pub head: u64,
    /// The stream's watch ([`Meta::watch`](crate::ops::streams::Meta::watch)),
    /// subscribed under the same lock, so it says whether the stream was
    /// closed then and nothing after is missed.
    pub closed_rx: watch::Receiver<Life>,
    /// The client's `cursor=` (one that is not a number counts as none).
    pub cursor: Option<u64>,
    /// When the token of the request stops being honoured
    /// (`ops::stream::expires_at`; `None`: never, or an open server).
    pub expires: Option<std::time::Instant>,
}

/// One live SSE read: the subscription to the stream's own channel, and
/// where the follower is. See the module doc.
pub(crate) struct Feed {
    app: Arc<App>,
    sub: Subscription,
    layout: Arc<Layout>,
    epoch: Epoch,
    shape: Shape,
    /// The position of the last message sent (or the start).
    pos: u64,
    /// The newest position known: the tail at the request, then as signalled.
    head: u64,
    /// Whether the position was announced up to date since the last data.
    announced: bool,
    /// The stream's closure as last read.
    closed: bool,
    /// The stream was deleted: the response ends.
    deleted: bool,
    closed_rx: watch::Receiver<Life>,
    /// The last cursor sent (or the client's); 0: none.
    cursor: u64,
    /// Timer ticks left before the response ends ([`SSE_LIFETIME`]).
    ticks_left: u32,
    /// Resolves at shutdown or at the token's expiry ([`stream::end_signal`]).
    end: EndSignal,
    /// `end` has completed (it is not polled again).
    ended: bool,
    /// The token expired while a writer waited for a full socket
    /// ([`Frames::poll_blocked`]): the writer finishes what it holds, and
    /// the next [`Feed::next`] ends the response (as gapless SSE does).
    expired_while_blocked: bool,
    /// What the feed sent and why it ended, for its log line.
    tally: Tally,
    /// The stream's one timer: heartbeat and liveness ([`stream::tick_ms`]),
    /// made on first use on the runtime that drives the stream.
    beat: Option<tokio::time::Interval>,
}

impl Feed {
    /// The feed of a live read from `start`, following the stream's own
    /// channel with `sub` (opened at the later of `start.from` and the fork
    /// point, before anything inherited is read, so nothing is missed).
    pub(crate) fn new(app: Arc<App>, start: Start, sub: Subscription) -> Self {
        let life = *start.closed_rx.borrow();
        let lifetime = u64::try_from(SSE_LIFETIME.as_millis()).unwrap_or(u64::MAX);
        let ticks = lifetime.div_ceil(period_ms(&app.config));
        Feed {
            end: stream::end_signal(&app, start.expires),
            expired_while_blocked: false,
            tally: Tally::new(0),
            app,
            sub,
            epoch: start.epoch,
            shape: start.shape,
            pos: start.from,
            head: start.head,
            layout: start.layout,
            announced: false,
            closed: life >= Life::Closed,
            deleted: life == Life::Gone,
            closed_rx: start.closed_rx,
            cursor: start.cursor.unwrap_or(0),
            ticks_left: u32::try_from(ticks).unwrap_or(u32::MAX),
            ended: false,
            beat: None,
        }
    }

    /// The period of the stream's timer ([`period_ms`]).
    fn tick_ms(&self) -> u64 {
        period_ms(&self.app.config)
    }

    /// Waits for what is next and appends its frames to `out`. Cancel-safe:
    /// dropping the future loses nothing (the subscription's next item and
    /// the watch are cancel-safe; an inherited page is read again).
    pub(crate) async fn next(&mut self, out: &mut Vec<Bytes>) -> Flow {
        if self.expired_while_blocked {
            return Flow::End;
        }
        loop {
            if self.pos < self.layout.origin {
                // A fork's inherited messages, page by page (boxed: rare,
                // and its read must not grow every stream's task).
                return Box::pin(self.inherited(out)).await;
            }
            if self.deleted {
                self.tally.ended_by(Ended::StreamDeleted);
                return Flow::End;
            }
            self.head = self.head.max(self.pos + self.sub.lag(0));
            if self.pos >= self.head && (self.closed || !self.announced) {
                let closed = self.closed;
                self.control(out, true, closed);
                return self.more_unless(closed);
            }
            let tick_ms = self.tick_ms();
            let beat = stream::timer(&mut self.beat, tick_ms);
            let item = tokio::select! {
                biased;
                end = self.end.as_mut(), if !self.ended => {
                    self.ended = true;
                    self.tally.ended_by(match end {
                        End::Expired => Ended::TokenExpired,
                        End::Shutdown => Ended::Shutdown,
                    });
                    return Flow::End;
                }
                changed = self.closed_rx.changed() => {
                    if changed.is_err() {
                        // The stream's metadata is gone with it.
                        self.tally.ended_by(Ended::StreamDeleted);
                        return Flow::End;
                    }
                    let life = *self.closed_rx.borrow_and_update();
                    self.closed = life >= Life::Closed;
                    self.deleted = life == Life::Gone;
                    continue;
                }
                item = self.sub.next() => item,
                _ = std::future::poll_fn(|cx| beat.poll_tick(cx)) => {
                    self.ticks_left = self.ticks_left.saturating_sub(1);
                    if self.ticks_left == 0 {
                        self.tally.ended_by(Ended::Lifetime);
                        return Flow::End;
                    }
                    if self.app.config.heartbeat_ms > 0 {
                        out.push(Bytes::from_static(gapless_protocol::sse::HEARTBEAT));
                    }
                    return Flow::Tick;
                }
            };
            match item {
                Ok(Item::Events { events, .. }) => {
                    let Some(last) = events.last() else { continue };
                    stream::delivered(Transport::Ds, &mut self.tally, &self.sub, 0, &events);
                    self.pos = self.layout.virt(last.seq);
                    self.head = self.head.max(self.pos + self.sub.lag(0));
                    let up = self.pos >= self.head;
                    let closed = self.closed && up;
                    self.data(out, &events);
                    self.control(out, up, closed);
                    return self.more_unless(closed);
                }
                // A hole (retention passed the follower, a purge, the
                // stream's deletion) or a failed read: the response ends;
                // the client reconnects from its last offset and is told
                // (410, or 404 once deleted) or served.
                Ok(Item::Gap(_)) => {
                    self.tally.ended_by(Ended::NotRetained);
                    return Flow::End;
                }
                Err(_) => {
                    self.tally.ended_by(Ended::JournalFailed);
                    return Flow::End;
                }
                Ok(Item::Ephemeral(_)) => {}
            }
        }
    }

    /// The next page of a fork's inherited messages, with its control event.
    async fn inherited(&mut self, out: &mut Vec<Bytes>) -> Flow {
        let page = layout::read(
            &self.app,
            &self.layout,
            self.pos,
            self.layout.origin,
            READ_EVENTS,
            READ_BYTES,
        )
        .await;
        let Ok((events, next)) = page else {
            self.tally.ended_by(Ended::JournalFailed);
            return Flow::End;
        };
        if events.is_empty() {
            self.tally.ended_by(Ended::NotRetained);
            return Flow::End;
        }
        self.pos = next;
        self.tally.events(events.len());
        stream::delivered_answer(Transport::Ds, &events, self.head.saturating_sub(next));
        let up = self.pos >= self.head;
        let closed = self.closed && up;
        self.data(out, &events);
        self.control(out, up, closed);
        self.more_unless(closed)
    }

    /// [`Flow::End`] when the reader reached a closed stream's tail (the
    /// reason logged), else [`Flow::More`].
    fn more_unless(&mut self, closed: bool) -> Flow {
        if closed {
            self.tally.ended_by(Ended::StreamClosed);
            Flow::End
        } else {
            Flow::More
        }
    }

    /// Appends one `data` event holding `events`.
    fn data(&mut self, out: &mut Vec<Bytes>, events: &[Arc<Event>]) {
        out.push(Bytes::from(data_event(self.shape, events)));
        self.announced = false;
    }

    /// Appends one `control` event at the current position: `upToDate` when
    /// `up`, `streamClosed` (and no cursor) when `closed`.
    fn control(&mut self, out: &mut Vec<Bytes>, up: bool, closed: bool) {
        let cursor = (!closed).then(|| next_cursor(now_ms(), Some(self.cursor).filter(|&c| c > 0)));
        out.push(Bytes::from(control_event(
            &offset(self.epoch, self.pos),
            cursor,
            up,
            closed,
        )));
        if let Some(c) = cursor {
            self.cursor = c;
        }
        self.announced = up;
    }
}

impl Frames for Feed {
    fn next(&mut self, out: &mut Vec<Bytes>) -> impl Future<Output = Flow> + Send {
        Feed::next(self, out)
    }

    fn poll_blocked(
        &mut self,
        cx: &mut std::task::Context<'_>,
        ticks: bool,
    ) -> std::task::Poll<Waited> {
        use std::task::Poll;
        if self.ended {
            return Poll::Ready(Waited::Ended);
        }
        // Shutdown cuts the write; the token's expiry does not (what the
        // writer holds was read while the token was honoured): the next
        // `next` ends the response, and from now on only shutdown is awaited.
        if let Poll::Ready(end) = self.end.as_mut().poll(cx) {
            if end == End::Shutdown {
                self.ended = true;
                self.tally.ended_by(Ended::Shutdown);
                return Poll::Ready(Waited::Ended);
            }
            self.expired_while_blocked = true;
            self.tally.ended_by(Ended::TokenExpired);
            self.end = stream::shutdown_signal(&self.app);
        }
        if ticks {
            let tick_ms = self.tick_ms();
            let beat = stream::timer(&mut self.beat, tick_ms);
            if beat.poll_tick(cx).is_ready() {
                return Poll::Ready(Waited::Tick);
            }
        }
        Poll::Pending
    }

    fn client_gone(&mut self, how: Gone) {
        self.tally.ended_by(match how {
            Gone::Closed => Ended::ClientClosed,
            Gone::Vanished => Ended::ClientVanished,
            Gone::WriteFailed => Ended::WriteFailed,
        });
    }
}

impl Drop for Feed {
    /// The feed's log line (`ops::stream_log`), as every stream's.
    fn drop(&mut self) {
        self.tally.log("ds", &ChannelList(&self.sub));
    }
}
