//! SSE subscribers: one task per connection, each with its own parser (the
//! project's `gapless_client::sse::Parser`, which lends events without
//! allocating) and a [`Tracker`] that checks the events' numbers: every one
//! exactly once, and in order when one publisher feeds the channel.
//!
//! A Durable Streams subscriber (`Target::ds`) reads the protocol's SSE: each
//! `event: data` holds one or more appends (split per [`Wire`]), each
//! `event: control` the offset after them; when the server ends a response
//! (the protocol's collapsing) it reconnects from the last control offset, so
//! a long run sees every append once.
//!
//! A WebSocket subscriber (`Target::ws`, `--transport ws`) reads frames with
//! [`crate::ws`] over the same raw connection: gapless's `event` messages
//! (JSON, the data in `data`, the cursor kept for a resume) or, for a server
//! that sends each message as one frame (Nchan), the frame itself. It answers
//! pings with pongs, so a server's heartbeat does not close it.
//!
//! Tasks report progress through a shared [`Board`]: attached count, warm-up
//! numbers seen, unique deliveries, the time of the latest one, and latency
//! histograms (sharded, recorded once per socket read; with several nodes
//! each shard holds the subscribers of one node, so latency is also known per
//! node).

use crate::http::{request, Conn};
use crate::payload::{self, Payload, Wire};
use crate::report::histogram;
use crate::ws::{self, op};
use anyhow::{bail, Result};
use gapless_client::sse::{Item, Parser};
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const SHARDS: usize = 16;

/// What subscriber tasks share with the scenario driving them.
#[derive(Debug)]
pub(crate) struct Board {
    /// Per subscriber: the highest warm-up number seen.
    pub warm: Vec<AtomicU64>,
    /// Measured events received for the first time, over all subscribers.
    pub delivered: AtomicU64,
    /// Unix µs of the latest first-time delivery.
    pub last_delivery_us: AtomicU64,
    /// Socket reads that brought at least one measured event, over all subscribers.
    pub reads: AtomicU64,
    /// Whether deliveries go into the latency histograms.
    pub record_latency: AtomicBool,
    /// Subscribers whose response head (status 200) arrived.
    pub connected: AtomicUsize,
    /// Subscriber tasks that ended with an error.
    pub failed: AtomicUsize,
    /// Durable Streams: SSE `data` events received (one may hold several appends).
    pub data_events: AtomicU64,
    /// Durable Streams: SSE `control` events received.
    pub control_events: AtomicU64,
    /// Durable Streams: connections opened again after the server ended a response.
    pub reconnects: AtomicU64,
    /// Shard `s` holds subscribers `i` with `i % latency.len() == s`; its
    /// node is `s % nodes` (subscriber `i` is on node `i % nodes`).
    latency: Vec<Mutex<Histogram<u64>>>,
    nodes: usize,
    connect: Mutex<Histogram<u64>>,
    first_error: Mutex<Option<String>>,
}

impl Board {
    /// A board for `n` subscribers spread round robin over `nodes` nodes (1
    /// for a single server).
    pub(crate) fn new(n: usize, nodes: usize) -> Arc<Self> {
        let nodes = nodes.max(1);
        let shards = SHARDS.div_ceil(nodes) * nodes;
        Arc::new(Board {
            warm: (0..n).map(|_| AtomicU64::new(0)).collect(),
            delivered: AtomicU64::new(0),
            last_delivery_us: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            record_latency: AtomicBool::new(true),
            connected: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            data_events: AtomicU64::new(0),
            control_events: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            latency: (0..shards).map(|_| Mutex::new(histogram())).collect(),
            nodes,
            connect: Mutex::new(histogram()),
            first_error: Mutex::new(None),
        })
    }

    /// Delivery latency (µs) over all subscribers.
    pub(crate) fn latency(&self) -> Histogram<u64> {
        let mut all = histogram();
        for s in &self.latency {
            // Same bounds everywhere, so adding cannot fail.
            let _ = all.add(&*s.lock());
        }
        all
    }

    /// Delivery latency (µs) of the subscribers on node `node` (0-based, in
    /// the order of `--addr` then `--nodes`).
    pub(crate) fn node_latency(&self, node: usize) -> Histogram<u64> {
        let mut all = histogram();
        for (i, s) in self.latency.iter().enumerate() {
            if i % self.nodes == node {
                let _ = all.add(&*s.lock());
            }
        }
        all
    }

    /// How many nodes the subscribers are spread over.
    pub(crate) fn nodes(&self) -> usize {
        self.nodes
    }

    /// Counts a subscriber attached after `since` (its connect time).
    fn attached(&self, since: Instant) {
        self.connect
            .lock()
            .saturating_record(since.elapsed().as_micros() as u64);
        self.connected.fetch_add(1, Ordering::Relaxed);
    }

    /// Publishes what one read brought: `latencies` (µs, cleared) into the shard of
    /// subscriber `id`, `fresh` first-time deliveries read at `now` (Unix µs).
    fn settle(&self, id: usize, latencies: &mut Vec<u64>, fresh: u64, now: u64) {
        if !latencies.is_empty() {
            if self.record_latency.load(Ordering::Relaxed) {
                let mut h = self.latency[id % self.latency.len()].lock();
                for &l in latencies.iter() {
                    h.saturating_record(l);
                }
            }
            latencies.clear();
        }
        if fresh > 0 {
            self.reads.fetch_add(1, Ordering::Relaxed);
            self.last_delivery_us.fetch_max(now, Ordering::Relaxed);
            self.delivered.fetch_add(fresh, Ordering::Release);
        }
    }

    /// Clears the latency histograms.
    pub(crate) fn reset_latency(&self) {
        for s in &self.latency {
            s.lock().reset();
        }
    }

    /// Connect time (µs, connect to response head).
    pub(crate) fn connect_times(&self) -> Histogram<u64> {
        self.connect.lock().clone()
    }

    /// The first subscriber error, if any.
    pub(crate) fn first_error(&self) -> Option<String> {
        self.first_error.lock().clone()
    }

    /// Waits until every subscriber of `n` is attached.
    ///
    /// # Errors
    /// A subscriber failed, or the timeout passed.
    pub(crate) async fn wait_connected(&self, n: usize, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            if self.failed.load(Ordering::Relaxed) > 0 {
                bail!(
                    "{} subscriber(s) failed; first: {}",
                    self.failed.load(Ordering::Relaxed),
                    self.first_error().unwrap_or_default()
                );
            }
            if self.connected.load(Ordering::Relaxed) >= n {
                return Ok(());
            }
            if start.elapsed() > timeout {
                bail!(
                    "only {} of {n} subscribers attached within {timeout:?}",
                    self.connected.load(Ordering::Relaxed)
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Waits until `delivered` reaches `target`; false on timeout or when
    /// every subscriber has failed.
    pub(crate) async fn wait_delivered(&self, target: u64, timeout: Duration, subs: usize) -> bool {
        let start = Instant::now();
        loop {
            if self.delivered.load(Ordering::Acquire) >= target {
                return true;
            }
            if start.elapsed() > timeout || self.failed.load(Ordering::Relaxed) >= subs {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// One subscriber's view of what it received.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tracker {
    /// Index of the subscriber.
    pub id: usize,
    /// Index of its channel.
    pub channel: usize,
    seen: Vec<u64>,
    /// Distinct measured events received.
    pub unique: u64,
    /// Measured events received again.
    pub duplicates: u64,
    /// Events that arrived after a higher number.
    pub out_of_order: u64,
    max_seq: u64,
    /// Highest warm-up number seen.
    pub warm_max: u64,
    /// Warm-up events received again.
    pub warm_duplicates: u64,
    /// Events whose data is not ours.
    pub foreign: u64,
    /// The parser's last event ID when the connection was dropped; for a Durable
    /// Streams subscriber, the offset of the last `control` event; for a WebSocket
    /// subscriber of gapless, the cursor of the last event.
    pub last_event_id: String,
    /// Durable Streams: `data` events that were not of the wire's shape.
    pub malformed: u64,
    /// Why the connection ended, when not by our choice.
    pub error: Option<String>,
    /// A subscriber that follows several channels on one connection: the indexes of its
    /// channels (`channel` is then the first); empty for a one-channel subscriber.
    pub follows: Vec<usize>,
    /// With `follows`: one tracker per followed channel, in the same order (each with
    /// that channel as `channel`); events are told apart by their channel tag.
    pub per: Vec<Tracker>,
}

impl Tracker {
    /// A fresh tracker.
    pub(crate) fn new(id: usize, channel: usize) -> Self {
        Tracker {
            id,
            channel,
            ..Tracker::default()
        }
    }

    /// Records measured event `seq`; true when it is new.
    pub(crate) fn event(&mut self, seq: u64) -> bool {
        let (word, bit) = ((seq / 64) as usize, seq % 64);
        if word >= self.seen.len() {
            self.seen.resize(word + 1, 0);
        }
        let mask = 1u64 << bit;
        if self.seen[word] & mask != 0 {
            self.duplicates += 1;
            return false;
        }
        self.seen[word] |= mask;
        self.unique += 1;
        if seq < self.max_seq {
            self.out_of_order += 1;
        }
        self.max_seq = self.max_seq.max(seq);
        true
    }

    /// A tracker for subscriber `id` following `follows` (channel indexes, at least one)
    /// on one connection.
    pub(crate) fn multi(id: usize, follows: Vec<usize>) -> Self {
        Tracker {
            id,
            channel: follows.first().copied().unwrap_or(0),
            per: follows.iter().map(|&c| Tracker::new(id, c)).collect(),
            follows,
            ..Tracker::default()
        }
    }

    /// The per-channel trackers of a multi-channel subscriber (its error and foreign
    /// events carried by the first), or the tracker itself.
    pub(crate) fn flatten(mut self) -> Vec<Tracker> {
        if self.per.is_empty() {
            return vec![self];
        }
        let mut per = std::mem::take(&mut self.per);
        per[0].error = self.error.take();
        per[0].foreign += self.foreign;
        per
    }

    /// How many of events `1..=expected` never arrived.
    pub(crate) fn missing(&self, expected: u64) -> u64 {
        expected - self.received_in(1, expected)
    }

    /// How many distinct events `from..=to` arrived.
    pub(crate) fn received_in(&self, from: u64, to: u64) -> u64 {
        (from..=to)
            .filter(|&s| {
                self.seen
                    .get((s / 64) as usize)
                    .is_some_and(|w| w & (1 << (s % 64)) != 0)
            })
            .count() as u64
    }

    /// Distinct events with numbers above `expected` (not published by us).
    pub(crate) fn unexpected(&self, expected: u64) -> u64 {
        self.unique - self.received_in(1, expected)
    }
}

/// How to open one subscription.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// Server address.
    pub addr: SocketAddr,
    /// `Host` header.
    pub host: String,
    /// Path and query; for Durable Streams it holds `{offset}`, filled at each connect.
    pub path: String,
    /// gapless/Nchan: resume after this event ID (`Last-Event-ID`).
    pub last_event_id: Option<String>,
    /// Durable Streams: the wire of the stream's messages; `None` for plain SSE.
    pub ds: Option<Wire>,
    /// A WebSocket subscriber: what it speaks after the handshake; `None` for SSE.
    pub ws: Option<WsSub>,
    /// Read buffer size.
    pub buf_size: usize,
}

impl Target {
    /// An SSE GET for `path`, resuming after `last_event_id` when given.
    pub(crate) fn sse(
        addr: SocketAddr,
        host: &str,
        path: &str,
        last_event_id: Option<&str>,
        buf_size: usize,
    ) -> Self {
        Target {
            addr,
            host: host.to_owned(),
            path: path.to_owned(),
            last_event_id: last_event_id.map(str::to_owned),
            ds: None,
            ws: None,
            buf_size,
        }
    }

    /// A Durable Streams SSE GET: `path` holds `{offset}`, which is `from` at the first
    /// connect (`now`, or an offset to resume from), then the last `control` offset.
    pub(crate) fn ds(
        addr: SocketAddr,
        host: &str,
        path: &str,
        wire: Wire,
        buf_size: usize,
    ) -> Self {
        Target {
            addr,
            host: host.to_owned(),
            path: path.to_owned(),
            last_event_id: None,
            ds: Some(wire),
            ws: None,
            buf_size,
        }
    }

    /// A WebSocket to `path` speaking `mode`; a gapless subscriber resumes after `cursor`
    /// when given (its `subscribe` carries it).
    pub(crate) fn ws(
        addr: SocketAddr,
        host: &str,
        path: &str,
        mode: WsSub,
        cursor: Option<&str>,
        buf_size: usize,
    ) -> Self {
        Target {
            addr,
            host: host.to_owned(),
            path: path.to_owned(),
            last_event_id: cursor.map(str::to_owned),
            ds: None,
            ws: Some(mode),
            buf_size,
        }
    }

    fn request(&self, offset: &str) -> Vec<u8> {
        let mut headers = vec![
            ("Accept", "text/event-stream"),
            ("Cache-Control", "no-cache"),
        ];
        if self.ds.is_some() {
            let path = self.path.replace("{offset}", offset);
            return request("GET", &self.host, &path, &headers, b"");
        }
        if let Some(id) = &self.last_event_id {
            headers.push(("Last-Event-ID", id));
        }
        request("GET", &self.host, &self.path, &headers, b"")
    }
}

/// What a WebSocket subscriber speaks after the handshake.
#[derive(Debug, Clone)]
pub(crate) enum WsSub {
    /// gapless `/v1/ws` (docs/protocol.md): subprotocol `gapless.v1`, one `subscribe` for
    /// `channel` (with `cursor` when resuming), then `event` messages whose `data` is the
    /// event data. Attached at `subscribed`; a `gap` or an `error` ends the subscriber.
    Gapless {
        /// The channel to follow.
        channel: String,
    },
    /// A server that sends each message's data as one message (Nchan's
    /// `nchan_subscriber websocket`). Attached at the handshake's 101.
    Raw,
}

/// Starts one subscriber task; it returns its tracker when `stop` fires or
/// its stream ends.
pub(crate) fn spawn(
    target: Target,
    tracker: Tracker,
    board: Arc<Board>,
    gate: Arc<Semaphore>,
    stop: CancellationToken,
) -> JoinHandle<Tracker> {
    tokio::spawn(async move {
        let mut tracker = tracker;
        let mut parser = None;
        let result = tokio::select! {
            r = async {
                match &target.ws {
                    Some(mode) => run_ws(&target, mode, &mut tracker, &board, &gate).await,
                    None => {
                        let p = parser.insert(Parser::new());
                        run(&target, &mut tracker, p, &board, &gate).await
                    }
                }
            } => r,
            _ = stop.cancelled() => Ok(()),
        };
        let result = result.and_then(|()| match tracker.malformed {
            0 => Ok(()),
            n => Err(anyhow::anyhow!(
                "{n} SSE data event(s) not of the stream's shape"
            )),
        });
        if let Err(e) = result {
            let msg = format!("{e:#}");
            board.failed.fetch_add(1, Ordering::Relaxed);
            board.first_error.lock().get_or_insert_with(|| msg.clone());
            tracker.error = Some(msg);
        }
        if let (None, Some(p)) = (target.ds, &parser) {
            tracker.last_event_id = p.last_event_id().to_owned();
        }
        tracker
    })
}

/// What one socket read brought, before it is published to the board.
struct Intake<'a> {
    tracker: &'a mut Tracker,
    warm: &'a AtomicU64,
    latencies: &'a mut Vec<u64>,
    fresh: u64,
    now: u64,
    data_events: u64,
    control_events: u64,
}

impl Intake<'_> {
    /// One event's data (one message).
    fn data(&mut self, data: &str) {
        if !self.tracker.per.is_empty() {
            return self.multi_data(data);
        }
        match payload::parse(data) {
            Payload::Event { seq, sent_us } => {
                if self.tracker.event(seq) {
                    self.fresh += 1;
                    self.latencies.push(self.now.saturating_sub(sent_us));
                }
            }
            Payload::Warm(n) => {
                if n <= self.tracker.warm_max {
                    self.tracker.warm_duplicates += 1;
                } else {
                    self.tracker.warm_max = n;
                    self.warm.fetch_max(n, Ordering::Relaxed);
                }
            }
            Payload::Foreign => self.tracker.foreign += 1,
        }
    }

    /// One event's data at a subscriber that follows several channels: counted by the
    /// tracker of the channel its tag names (an untagged event, or one of a channel not
    /// followed, is foreign). The subscriber's warm-up number is the lowest over its
    /// channels, so it is attached once every channel has brought one.
    fn multi_data(&mut self, data: &str) {
        let p = payload::parse(data);
        let k = payload::channel_tag(data)
            .and_then(|c| self.tracker.follows.iter().position(|&f| f == c));
        let (Some(k), false) = (k, p == Payload::Foreign) else {
            self.tracker.foreign += 1;
            return;
        };
        let t = &mut self.tracker.per[k];
        match p {
            Payload::Event { seq, sent_us } => {
                if t.event(seq) {
                    self.fresh += 1;
                    self.latencies.push(self.now.saturating_sub(sent_us));
                }
            }
            Payload::Warm(n) => {
                if n <= t.warm_max {
                    t.warm_duplicates += 1;
                } else {
                    t.warm_max = n;
                    let lowest = self.tracker.per.iter().map(|t| t.warm_max).min();
                    self.warm.fetch_max(lowest.unwrap_or(0), Ordering::Relaxed);
                }
            }
            Payload::Foreign => self.tracker.foreign += 1,
        }
    }

    /// One Durable Streams SSE event: `data` (one or more messages) or `control`.
    fn ds_event(&mut self, wire: Wire, event_type: &str, data: &str) {
        match event_type {
            "data" => {
                self.data_events += 1;
                if !wire.split(data, |m| self.data(m)) {
                    self.tracker.malformed += 1;
                }
            }
            "control" => {
                self.control_events += 1;
                if let Ok(c) = serde_json::from_str::<Control>(data) {
                    if let Some(offset) = c.stream_next_offset {
                        self.tracker.last_event_id = offset;
                    }
                }
            }
            _ => {}
        }
    }
}

/// A Durable Streams `control` event's data (the fields used here).
#[derive(serde::Deserialize)]
struct Control {
    #[serde(rename = "streamNextOffset")]
    stream_next_offset: Option<String>,
}

async fn run(
    target: &Target,
    tracker: &mut Tracker,
    parser: &mut Parser,
    board: &Board,
    gate: &Semaphore,
) -> Result<()> {
    let mut first = true;
    loop {
        let from = if tracker.last_event_id.is_empty() {
            "now".to_owned()
        } else {
            tracker.last_event_id.clone()
        };
        let request = target.request(&from);
        let permit = gate.acquire().await?;
        let t0 = Instant::now();
        let mut conn = Conn::connect(target.addr, target.buf_size).await?;
        conn.send(&request).await?;
        let mut head = conn.read_head().await?;
        if head.status != 200 {
            bail!("subscribe answered {}", head.status);
        }
        drop(permit);
        if first {
            board.attached(t0);
            first = false;
        } else {
            board.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        *parser = Parser::new();
        follow(target, &mut conn, &mut head.body, tracker, parser, board).await?;
        if target.ds.is_none() {
            bail!("the server ended the stream");
        }
        // Durable Streams: the server ended this response; go on from the last offset.
    }
}

/// Reads one response's events until it ends.
async fn follow(
    target: &Target,
    conn: &mut Conn,
    body: &mut crate::http::BodyDecoder,
    tracker: &mut Tracker,
    parser: &mut Parser,
    board: &Board,
) -> Result<()> {
    let warm = &board.warm[tracker.id];
    let mut latencies: Vec<u64> = Vec::with_capacity(64);
    loop {
        let mut too_large = None;
        let mut intake = Intake {
            tracker: &mut *tracker,
            warm,
            latencies: &mut latencies,
            fresh: 0,
            now: 0,
            data_events: 0,
            control_events: 0,
        };
        let more = conn
            .stream_body(body, &mut |bytes| {
                if intake.now == 0 {
                    intake.now = payload::now_us();
                }
                let fed = parser.feed(bytes, |item| {
                    let Item::Event(e) = item else { return };
                    match target.ds {
                        None => intake.data(e.data),
                        Some(wire) => intake.ds_event(wire, e.event_type, e.data),
                    }
                });
                if let Err(e) = fed {
                    too_large = Some(e);
                }
            })
            .await?;
        let (fresh, now) = (intake.fresh, intake.now);
        if intake.data_events > 0 {
            board
                .data_events
                .fetch_add(intake.data_events, Ordering::Relaxed);
        }
        if intake.control_events > 0 {
            board
                .control_events
                .fetch_add(intake.control_events, Ordering::Relaxed);
        }
        if let Some(e) = too_large {
            return Err(e.into());
        }
        board.settle(tracker.id, &mut latencies, fresh, now);
        if !more {
            return Ok(());
        }
    }
}

/// A gapless WebSocket message (the fields used here).
#[derive(serde::Deserialize)]
struct WsMessage<'a> {
    #[serde(borrow)]
    op: std::borrow::Cow<'a, str>,
    #[serde(borrow, default)]
    data: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    cursor: Option<std::borrow::Cow<'a, str>>,
}

/// One whole WebSocket message; sets `subscribed` at gapless's `subscribed`.
fn ws_message(
    mode: &WsSub,
    payload: &[u8],
    intake: &mut Intake<'_>,
    subscribed: &mut bool,
) -> Result<()> {
    match mode {
        WsSub::Raw => match std::str::from_utf8(payload) {
            Ok(data) => intake.data(data),
            Err(_) => intake.tracker.foreign += 1,
        },
        WsSub::Gapless { .. } => {
            let m: WsMessage<'_> = serde_json::from_slice(payload).map_err(|e| {
                anyhow::anyhow!(
                    "gapless sent a message that is not one: {e}: {}",
                    String::from_utf8_lossy(payload)
                )
            })?;
            match &*m.op {
                "event" => {
                    match &m.data {
                        Some(d) => intake.data(d),
                        None => intake.tracker.foreign += 1,
                    }
                    if let Some(c) = &m.cursor {
                        intake.tracker.last_event_id.clear();
                        intake.tracker.last_event_id.push_str(c);
                    }
                }
                "subscribed" => *subscribed = true,
                "gap" | "error" => {
                    bail!("gapless sent {}", String::from_utf8_lossy(payload))
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// The text of a close frame's payload: its code and reason.
fn describe_close(payload: &[u8]) -> String {
    match payload {
        [a, b, reason @ ..] => format!(
            "{} {}",
            u16::from_be_bytes([*a, *b]),
            String::from_utf8_lossy(reason)
        ),
        _ => "without a code".to_owned(),
    }
}

/// One WebSocket subscriber: handshake, subscribe (gapless), then frames until the
/// connection fails or ends (which is an error: we never close first).
async fn run_ws(
    target: &Target,
    mode: &WsSub,
    tracker: &mut Tracker,
    board: &Board,
    gate: &Semaphore,
) -> Result<()> {
    let permit = gate.acquire().await?;
    let t0 = Instant::now();
    let mut conn = Conn::connect(target.addr, target.buf_size).await?;
    let gapless = matches!(mode, WsSub::Gapless { .. });
    conn.send(&ws::handshake(
        &target.host,
        &target.path,
        gapless.then_some("gapless.v1"),
    ))
    .await?;
    let head = conn.read_head().await?;
    if head.status != 101 {
        bail!("WebSocket handshake answered {}", head.status);
    }
    let mut mask_state =
        payload::now_us() ^ (tracker.id as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut out: Vec<u8> = Vec::new();
    let mut permit = Some(permit);
    if let WsSub::Gapless { channel } = mode {
        let mut msg = serde_json::json!({"op": "subscribe", "id": 1, "channel": channel});
        if let Some(c) = &target.last_event_id {
            msg["cursor"] = serde_json::Value::from(c.as_str());
        }
        let text = msg.to_string();
        ws::client_frame(
            op::TEXT,
            text.as_bytes(),
            ws::next_mask(&mut mask_state),
            &mut out,
        );
        conn.send(&out).await?;
        out.clear();
    } else {
        board.attached(t0);
        permit = None;
    }
    let warm = &board.warm[tracker.id];
    let mut latencies: Vec<u64> = Vec::with_capacity(64);
    // A fragmented message being put together: its opcode and the bytes so far.
    let mut fragment: Option<Vec<u8>> = None;
    loop {
        let mut subscribed = false;
        let mut intake = Intake {
            tracker: &mut *tracker,
            warm,
            latencies: &mut latencies,
            fresh: 0,
            now: 0,
            data_events: 0,
            control_events: 0,
        };
        let more = conn
            .read_raw(&mut |buf: &[u8]| {
                if intake.now == 0 {
                    intake.now = payload::now_us();
                }
                let mut used = 0;
                while let Some((f, n)) = ws::parse_frame(&buf[used..])? {
                    used += n;
                    match f.opcode {
                        op::PING => ws::client_frame(
                            op::PONG,
                            f.payload,
                            ws::next_mask(&mut mask_state),
                            &mut out,
                        ),
                        op::PONG => {}
                        op::CLOSE => bail!(
                            "the server closed the WebSocket: {}",
                            describe_close(f.payload)
                        ),
                        op::CONTINUATION => {
                            let Some(whole) = fragment.as_mut() else {
                                bail!("WebSocket continuation frame outside a message");
                            };
                            whole.extend_from_slice(f.payload);
                            if f.fin {
                                let whole = fragment.take().unwrap_or_default();
                                ws_message(mode, &whole, &mut intake, &mut subscribed)?;
                            }
                        }
                        _ if fragment.is_some() => {
                            bail!("WebSocket message started inside a fragmented one")
                        }
                        _ if f.fin => ws_message(mode, f.payload, &mut intake, &mut subscribed)?,
                        _ => fragment = Some(f.payload.to_vec()),
                    }
                }
                Ok(used)
            })
            .await?;
        let (fresh, now) = (intake.fresh, intake.now);
        if !out.is_empty() {
            conn.send(&out).await?;
            out.clear();
        }
        if subscribed && permit.take().is_some() {
            board.attached(t0);
        }
        board.settle(tracker.id, &mut latencies, fresh, now);
        if !more {
            bail!("the server ended the WebSocket without a close frame");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracker_counts() {
        let mut t = Tracker::new(0, 0);
        for s in [1, 2, 2, 4, 3, 200] {
            t.event(s);
        }
        assert_eq!(t.unique, 5);
        assert_eq!(t.duplicates, 1);
        assert_eq!(t.out_of_order, 1);
        assert_eq!(t.missing(5), 1);
        assert_eq!(t.unexpected(5), 1);
    }

    #[test]
    fn multi_subscriber_counts_each_channel_by_its_tag() {
        let mut t = Tracker::multi(0, vec![4, 9]);
        let warm = AtomicU64::new(0);
        let mut latencies = Vec::new();
        let mut intake = Intake {
            tracker: &mut t,
            warm: &warm,
            latencies: &mut latencies,
            fresh: 0,
            now: 1,
            data_events: 0,
            control_events: 0,
        };
        let mut buf = Vec::new();
        let feed = |intake: &mut Intake<'_>, buf: &[u8]| {
            intake.data(std::str::from_utf8(buf).expect("ascii"));
        };
        payload::encode_warm(&mut buf, 1, 4);
        feed(&mut intake, &buf);
        assert_eq!(
            warm.load(Ordering::Relaxed),
            0,
            "channel 9 has no warm-up yet"
        );
        payload::encode_warm(&mut buf, 1, 9);
        feed(&mut intake, &buf);
        assert_eq!(warm.load(Ordering::Relaxed), 1);
        // The same numbers on both channels are distinct events; a repeat is a duplicate.
        for (seq, c) in [(1, 4), (1, 9), (2, 9), (2, 4), (2, 4)] {
            payload::encode_tagged(&mut buf, seq, 0, Some(c), 0);
            feed(&mut intake, &buf);
        }
        // Untagged data, and a channel not followed, are foreign.
        payload::encode(&mut buf, 3, 0, 0);
        feed(&mut intake, &buf);
        payload::encode_tagged(&mut buf, 3, 0, Some(5), 0);
        feed(&mut intake, &buf);
        assert_eq!(intake.fresh, 4);
        let per = t.flatten();
        assert_eq!((per[0].unique, per[0].duplicates), (2, 1));
        assert_eq!((per[1].unique, per[1].duplicates), (2, 0));
        assert_eq!(per[0].foreign, 2);
        assert_eq!(per[0].out_of_order + per[1].out_of_order, 0);
    }
}
