//! The metrics registry: every metric's name, unit and help, and the
//! recorder, through the `metrics` facade and `metrics-exporter-prometheus`.
//! Every part records into it (it imports no part, as `config` and `error`:
//! `tests/layers.rs`); `admin` serves it at `GET /metrics` in the
//! Prometheus text format, on our own route (no second listener). Names follow Prometheus conventions: the
//! `gapless_` prefix, base units in the name, `_total` on counters. Every
//! name is a constant here, so code, docs (`docs/deploy.md`, "Metrics") and
//! the Grafana dashboard use one spelling.
//!
//! The fan-out path counts per write step (one batch of frames to one
//! socket), never per event per subscriber. Gauges that the hub already
//! knows (subscribers, followed channels) and the journal's size are read
//! when `/metrics` is scraped, so they cost nothing between scrapes.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

/// Open client connections, by `transport` (`sse`, `ws`, `http`).
pub(crate) const CONNECTIONS_OPEN: &str = "gapless_connections_open";
/// Connections (and, from a trusted proxy, requests) refused by a connection
/// limit, by `limit` (`connections`: `--max-connections`; `per_ip`:
/// `--max-connections-per-ip`, by the forwarded client address behind a
/// trusted proxy).
pub(crate) const CONNECTIONS_REFUSED: &str = "gapless_connections_refused_total";
/// Subscribers (SSE streams and WebSocket channel subscriptions), read at scrape.
pub(crate) const SUBSCRIBERS: &str = "gapless_subscribers";
/// Channels this node follows in memory, read at scrape.
pub(crate) const CHANNELS_FOLLOWED: &str = "gapless_channels_followed";
/// Events published, by `durability` (`sync`, `async`, or `ephemeral`).
pub(crate) const EVENTS_PUBLISHED: &str = "gapless_events_published_total";
/// Events written to subscribers, by `transport` (`sse`, `ws`; `ds`: the
/// Durable Streams room's catch-up, long-poll and SSE answers).
pub(crate) const EVENTS_DELIVERED: &str = "gapless_events_delivered_total";
/// Bytes written to subscribers' sockets, by `transport`.
pub(crate) const BYTES_WRITTEN: &str = "gapless_bytes_written_total";
/// Subscriptions that resumed from a cursor the journal served whole.
pub(crate) const REPLAYS: &str = "gapless_replays_total";
/// Events those replays had to send (the head at resume time minus the cursor).
pub(crate) const EVENTS_REPLAYED: &str = "gapless_events_replayed_total";
/// Gap notices sent, by `reason` (`evicted`, `epoch`, `ahead`, `unknown`).
pub(crate) const GAPS: &str = "gapless_gaps_total";
/// Channel purges (`DELETE /v1/channels/{channel}`) this node answered 204.
pub(crate) const CHANNEL_PURGES: &str = "gapless_channel_purges_total";
/// Error answers, by `code`: counted where an answer is made (`error.rs`,
/// which names it, as it imports no part).
pub(crate) use crate::error::REFUSALS;
/// Time from receiving a publish's body to its acknowledgement, in seconds.
pub(crate) const PUBLISH_SECONDS: &str = "gapless_publish_seconds";
/// Time of one journal commit (with its fsync under `--durability sync`), in seconds.
pub(crate) const JOURNAL_COMMIT_SECONDS: &str = "gapless_journal_commit_seconds";
/// Time of one checkpoint of the embedded journal (records applied to its tables), in seconds.
pub(crate) const JOURNAL_CHECKPOINT_SECONDS: &str = "gapless_journal_checkpoint_seconds";
/// Time from an event's commit to its write to a subscriber, in seconds (per write step).
pub(crate) const DELIVERY_LAG_SECONDS: &str = "gapless_delivery_lag_seconds";
/// How many events a subscriber is still behind its channel's head after a write step.
pub(crate) const SUBSCRIBER_LAG_EVENTS: &str = "gapless_subscriber_lag_events";
/// Size of the journal on disk, in bytes (absent for journals not on a local disk).
pub(crate) const JOURNAL_SIZE_BYTES: &str = "gapless_journal_size_bytes";

/// Buckets of the latency histograms, in seconds (100 µs to 10 s).
const SECONDS_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];
/// Buckets of the subscriber-lag histogram, in events.
const LAG_BUCKETS: &[f64] = &[
    0.0,
    1.0,
    10.0,
    100.0,
    1_000.0,
    10_000.0,
    100_000.0,
    1_000_000.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the process-wide recorder (once; later calls return the same
/// handle). `None` if another recorder was installed first.
pub fn install() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(SUBSCRIBER_LAG_EVENTS.into()),
                        LAG_BUCKETS,
                    )
                });
            match builder.and_then(PrometheusBuilder::install_recorder) {
                Ok(h) => {
                    describe();
                    Some(h)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics are off: could not install the recorder");
                    None
                }
            }
        })
        .clone()
}

/// The cluster bus's notification counter (recorded in `gapless-redis`).
pub(crate) const CLUSTER_NOTIFICATIONS: &str = "gapless_cluster_notifications_total";

/// Gives every metric its `# HELP` line: what it counts, in which unit, and
/// what moves it (the same words as docs/deploy.md, "Metrics").
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!(
        CONNECTIONS_OPEN,
        Unit::Count,
        "Open client connections, by transport (sse: streams written by the fan-out writer; ws: \
         upgraded WebSockets; http: other connections). Up on accept or upgrade, down on close."
    );
    describe_counter!(
        CONNECTIONS_REFUSED,
        Unit::Count,
        "Connections refused by a connection limit, by limit (connections: --max-connections; \
         per_ip: --max-connections-per-ip, by forwarded client behind a --trusted-proxy, where \
         it counts refused requests)."
    );
    describe_gauge!(
        SUBSCRIBERS,
        Unit::Count,
        "Subscribers: SSE streams and WebSocket channel subscriptions, read at scrape time."
    );
    describe_gauge!(
        CHANNELS_FOLLOWED,
        Unit::Count,
        "Channels this node holds in memory for their subscribers, read at scrape time."
    );
    describe_counter!(
        EVENTS_PUBLISHED,
        Unit::Count,
        "Events appended, by durability (sync, async, memory, ephemeral; in cluster mode what \
         Redis's persistence gives, unknown when CONFIG GET is refused); a duplicate by \
         idempotency key is not counted."
    );
    describe_counter!(
        EVENTS_DELIVERED,
        Unit::Count,
        "Events written to subscribers' sockets, by transport (sse, ws)."
    );
    describe_counter!(
        BYTES_WRITTEN,
        Unit::Bytes,
        "Bytes written to subscribers' sockets, by transport (sse, ws), frames included."
    );
    describe_counter!(
        REPLAYS,
        Unit::Count,
        "Subscriptions that resumed from a cursor the journal served whole."
    );
    describe_counter!(
        EVENTS_REPLAYED,
        Unit::Count,
        "Events those resumes had to catch up on (the head at resume time minus the cursor)."
    );
    describe_counter!(
        GAPS,
        Unit::Count,
        "Gap notices sent, by reason (evicted, epoch, ahead, unknown): each is a range a client \
         was told it missed."
    );
    describe_counter!(
        CHANNEL_PURGES,
        Unit::Count,
        "Channel purges (DELETE /v1/channels/{channel}) this node answered 204: each removed \
         every event of a channel and started a new epoch (a channel never published to counts \
         too, though nothing changed)."
    );
    describe_counter!(
        REFUSALS,
        Unit::Count,
        "Error answers, by code (the JSON error: unauthorized, rate_limited, journal_full, ...)."
    );
    describe_histogram!(
        PUBLISH_SECONDS,
        Unit::Seconds,
        "Publish acknowledgement latency in seconds, from the body received to the answer \
         (journal append, with its fsync under --durability sync)."
    );
    describe_histogram!(
        JOURNAL_COMMIT_SECONDS,
        Unit::Seconds,
        "One group commit of the embedded journal in seconds: its write-ahead log frame written (and its fdatasync under --durability sync)."
    );
    describe_histogram!(
        JOURNAL_CHECKPOINT_SECONDS,
        Unit::Seconds,
        "One checkpoint of the embedded journal in seconds: committed records applied to its tables, off the publishers' path."
    );
    describe_histogram!(
        DELIVERY_LAG_SECONDS,
        Unit::Seconds,
        "Seconds from the commit of the newest event of a write step to that write, by transport."
    );
    describe_histogram!(
        SUBSCRIBER_LAG_EVENTS,
        Unit::Count,
        "Events a subscriber is still behind its channel's head after a write step."
    );
    describe_gauge!(
        JOURNAL_SIZE_BYTES,
        Unit::Bytes,
        "Size of the embedded journal's file in bytes, read at scrape time."
    );
    describe_counter!(
        CLUSTER_NOTIFICATIONS,
        Unit::Count,
        "Cluster mode: commit notifications from the bus, by outcome (inline: delivered from the \
         notification; read: read from Redis; known: already had; ignored: channel not followed)."
    );
}

/// Which transport a delivery metric is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// Server-Sent Events.
    Sse,
    /// WebSocket (channels and sessions).
    Ws,
    /// The Durable Streams room (catch-up, long-poll and `live=sse` reads).
    Ds,
}

impl Transport {
    fn label(self) -> &'static str {
        match self {
            Transport::Sse => "sse",
            Transport::Ws => "ws",
            Transport::Ds => "ds",
        }
    }
}

/// The handles the fan-out path records with, looked up once (after
/// [`install`], which runs before anything is served), so a write step does
/// not build a metric key.
struct Hot {
    delivered: [metrics::Counter; 3],
    bytes: [metrics::Counter; 3],
    lag_seconds: [metrics::Histogram; 3],
    lag_events: metrics::Histogram,
}

static HOT: std::sync::LazyLock<Hot> = std::sync::LazyLock::new(|| {
    let t = [Transport::Sse, Transport::Ws, Transport::Ds];
    Hot {
        delivered: t.map(|t| metrics::counter!(EVENTS_DELIVERED, "transport" => t.label())),
        bytes: t.map(|t| metrics::counter!(BYTES_WRITTEN, "transport" => t.label())),
        lag_seconds: t.map(|t| metrics::histogram!(DELIVERY_LAG_SECONDS, "transport" => t.label())),
        lag_events: metrics::histogram!(SUBSCRIBER_LAG_EVENTS),
    }
});

impl Transport {
    fn index(self) -> usize {
        match self {
            Transport::Sse => 0,
            Transport::Ws => 1,
            Transport::Ds => 2,
        }
    }
}

/// Records one write step of events to one subscriber: `events` events of
/// which the newest was committed at `newest_time_ms` (Unix ms), with `lag`
/// events still after it on the channel. Called once per step, never per
/// event per subscriber.
pub(crate) fn delivered(transport: Transport, events: usize, newest_time_ms: u64, lag: u64) {
    if events == 0 {
        return;
    }
    let hot = &*HOT;
    let i = transport.index();
    let now = gapless_core::journal::now_ms();
    hot.delivered[i].increment(events as u64);
    hot.lag_seconds[i].record(now.saturating_sub(newest_time_ms) as f64 / 1000.0);
    hot.lag_events.record(lag as f64);
}

/// Counts one refusal by the connection limit `limit` (`connections` or
/// `per_ip`; see [`CONNECTIONS_REFUSED`]).
pub(crate) fn connection_refused(limit: &'static str) {
    metrics::counter!(CONNECTIONS_REFUSED, "limit" => limit).increment(1);
}

/// Counts one channel purge answered 204 (see [`CHANNEL_PURGES`]).
pub(crate) fn channel_purged() {
    metrics::counter!(CHANNEL_PURGES).increment(1);
}

/// Records `bytes` written to a subscriber's socket in one step.
pub(crate) fn written(transport: Transport, bytes: usize) {
    if bytes > 0 {
        HOT.bytes[transport.index()].increment(bytes as u64);
    }
}

/// Counts one open connection of transport `T` while it lives (a
/// zero-sized guard: it adds nothing to a stream's task).
#[derive(Debug)]
pub(crate) struct Open<T: Kind>(std::marker::PhantomData<T>);

/// A transport label of [`CONNECTIONS_OPEN`], as a type.
pub(crate) trait Kind {
    /// The label.
    const LABEL: &'static str;
}

/// `transport="sse"`.
#[derive(Debug)]
pub(crate) struct SseConn;
/// `transport="ws"`.
#[derive(Debug)]
pub(crate) struct WsConn;
/// `transport="http"` (a connection carrying other requests).
#[derive(Debug)]
pub(crate) struct HttpConn;

impl Kind for SseConn {
    const LABEL: &'static str = "sse";
}
impl Kind for WsConn {
    const LABEL: &'static str = "ws";
}
impl Kind for HttpConn {
    const LABEL: &'static str = "http";
}

/// The connection gauges, looked up once.
static OPEN: std::sync::LazyLock<[metrics::Gauge; 3]> = std::sync::LazyLock::new(|| {
    ["sse", "ws", "http"].map(|t| metrics::gauge!(CONNECTIONS_OPEN, "transport" => t))
});

fn open_gauge(label: &str) -> &'static metrics::Gauge {
    match label {
        "sse" => &OPEN[0],
        "ws" => &OPEN[1],
        _ => &OPEN[2],
    }
}

impl<T: Kind> Open<T> {
    /// A connection opened.
    pub(crate) fn new() -> Self {
        open_gauge(T::LABEL).increment(1.0);
        Open(std::marker::PhantomData)
    }
}

impl<T: Kind> Default for Open<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Kind> Drop for Open<T> {
    fn drop(&mut self) {
        open_gauge(T::LABEL).decrement(1.0);
    }
}
