//! Server-Sent Events: `GET /v1/channels/{channel}/sse` and
//! `GET /v1/sse?channel=A&channel=B`.
//!
//! A stream opens with `retry:`, then one gap notice per channel whose start
//! could not be served whole, then an `id:`-only frame carrying the
//! subscription's cursor (so a client that drops before any event still
//! resumes from where it connected), then replayed events, then live ones —
//! all from the one [`Subscription::next`] loop, wrapped with the heartbeat
//! and the shutdown signal in a [`Feed`]. Frames of single-channel streams are
//! the events' shared pre-encoded bytes; multi-channel streams put the
//! subscription's cursor in a per-subscriber `id:` line before the shared body.
//!
//! The stream source (opening the subscription, its end on shutdown or token
//! expiry, the timer's period, delivery accounting) is `ops::stream`'s; the
//! [`Feed`] turns what it gives into SSE frames.
//!
//! The handlers validate and subscribe; who writes the frames depends on the
//! connection (see `conn.rs`): the fan-out writer for a connection's first
//! request, hyper otherwise ([`Feed::into_body`]).

pub(crate) mod busy;
// Types never built: they exist for the document only.
#[allow(dead_code)]
mod doc;

use crate::auth::{Access, Action, Grant};
use crate::error::{ApiError, ErrorBody};
use crate::metrics::Transport;
use crate::net::conn::{DirectStream, Flow, Frames, Gone, Waited};
use crate::net::liveness::Flushes;
use crate::ops::names;
use crate::ops::presence::{self, Seat};
use crate::ops::start::{self, Resume};
use crate::ops::stream::{self, End};
use crate::ops::stream_log::{ChannelList, Ended, Tally};
use crate::transport::query::Query;
use crate::App;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use doc::{LastEventIdHeader, SseAnswers, SseQuery};
use gapless_core::subscription::{Item, Start, Subscription};
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::sse::{self, Format};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// The schemas of a stream that no operation names directly.
#[derive(utoipa::OpenApi)]
#[openapi(components(schemas(
    gapless_protocol::Since,
    SseFormat,
    ExpiredNotice,
    SseEvent,
    gapless_protocol::presence::PresenceNotice
)))]
struct Schemas;

/// The SSE routes, `GET /v1/channels/{channel}/sse` and `GET /v1/sse`, with
/// the schemas of what they stream.
pub(crate) fn routes() -> OpenApiRouter<Arc<App>> {
    use utoipa::OpenApi;
    OpenApiRouter::with_openapi(Schemas::openapi())
        .routes(routes!(channel_sse))
        .routes(routes!(multi_sse))
}

/// `format=`: what a stream's `data:` carries.
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)]
pub(crate) enum SseFormat {
    /// The event's data.
    Plain,
    /// JSON `Envelope`.
    Envelope,
    /// JSON `Envelope`, and every event of the default type `message` (no
    /// `event:` line; its type is the envelope's `type`).
    Message,
}

/// A stream's `format=`: the events' pre-encoded format, and whether their
/// `event:` line is left out (`message`: `Envelope` data, every event of the
/// default SSE type, so an `EventSource`'s `onmessage` sees every event
/// whatever its type; the console follows this way). Gap notices and
/// `gapless.expired` keep their types.
#[derive(Debug, Clone, Copy)]
struct StreamFormat {
    format: Format,
    untyped: bool,
}

/// The data of the last frame of a stream whose token expired
/// (`event: gapless.expired`).
#[derive(serde::Serialize, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExpiredNotice {
    /// Always `token_expired`.
    pub error: ExpiredCode,
    /// What to do, for a person: reconnect with a fresh token and the last event id.
    pub message: String,
}

/// `token_expired`, the only value of an expiry notice's `error`.
#[derive(serde::Serialize, serde::Deserialize, ToSchema, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ExpiredCode {
    /// The token that opened the stream is no longer honoured.
    TokenExpired,
}

/// The schema of one event of a stream, as an `EventSource` (or any SSE
/// parser) delivers it: `event` (`message` when the frame has none), `data`
/// (its `data:` lines joined with LF), `id` (the last `id:` seen) and
/// `retry`. Frames without data (`retry:`, the `id:`-only frame, heartbeat
/// comments) are not events.
pub(crate) struct SseEvent;

impl SseEvent {
    fn variant(
        title: &str,
        event: utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        data: utoipa::openapi::schema::ObjectBuilder,
    ) -> utoipa::openapi::schema::Object {
        use gapless_protocol::Cursor;
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .title(Some(title))
            .schema_type(Type::Object)
            .property("event", event)
            .required("event")
            .property("data", data.schema_type(Type::String))
            .required("data")
            .property(
                "id",
                utoipa::openapi::schema::RefBuilder::new()
                    .ref_location_from_schema_name(<Cursor as ToSchema>::name())
                    .description(Some(
                        "The last `id:` seen: the subscription's cursor after the last \
                         journaled event delivered (or after the first `id:` frame).",
                    )),
            )
            .property(
                "retry",
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(0)),
            )
            .build()
    }
}

impl utoipa::PartialSchema for SseEvent {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use gapless_protocol::event::GapNotice;
        use gapless_protocol::schema::EventType;
        use utoipa::openapi::schema::{AnyOfBuilder, ObjectBuilder, OneOfBuilder, Type};
        use utoipa::openapi::Ref;
        let json = "application/json";
        let named = |name: &str| {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some([name.to_owned()]))
        };
        OneOfBuilder::new()
            .description(Some(
                "One event of the stream, as an EventSource delivers it. Frames without data \
                 (`retry:`, the `id:`-only frame with the subscription's cursor, heartbeat \
                 comments) are not events.",
            ))
            .item(Self::variant(
                "event",
                AnyOfBuilder::new()
                    .item(named("message"))
                    .item(Ref::from_schema_name(<EventType as ToSchema>::name()))
                    .description(Some(
                        "The event's type; `message` when it has none, and for every event with \
                         `format=message` (its type is then the envelope's `type`).",
                    ))
                    .into(),
                ObjectBuilder::new().description(Some(
                    "The event's data; with `format=envelope` or `format=message`, JSON \
                     `Envelope`. Ephemeral events come without an `id:` of their own.",
                )),
            ))
            .item(Self::variant(
                "gap notice",
                named("gap").into(),
                ObjectBuilder::new()
                    .content_media_type(json)
                    .content_schema(Some(Ref::from_schema_name(<GapNotice as ToSchema>::name()))),
            ))
            .item(Self::variant(
                "presence notice",
                named(gapless_protocol::presence::SSE_EVENT).into(),
                ObjectBuilder::new()
                    .content_media_type(json)
                    .content_schema(Some(Ref::from_schema_name(
                        <gapless_protocol::presence::PresenceNotice as ToSchema>::name(),
                    )))
                    .description(Some(
                        "With `presence=true`: a member joined or left a channel of the stream. \
                         No `id:` line: not journaled, the cursor does not move.",
                    )),
            ))
            .item(Self::variant(
                "token expired",
                named("gapless.expired").into(),
                ObjectBuilder::new()
                    .content_media_type(json)
                    .content_schema(Some(Ref::from_schema_name(
                        <ExpiredNotice as ToSchema>::name(),
                    ))),
            ))
            .into()
    }
}

impl ToSchema for SseEvent {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("SseEvent")
    }
}

/// Whether `path` (without its query) is an SSE URL: `/v1/sse`, or
/// `/v1/channels/{channel}/sse` with one non-empty segment as the channel
/// (the routes of this module). The first-request reader serves these
/// itself (`conn.rs`); a refused connection tells them to retry (`busy.rs`).
pub fn is_sse_path(path: &str) -> bool {
    path == "/v1/sse"
        || path
            .strip_prefix("/v1/channels/")
            .and_then(|rest| rest.strip_suffix("/sse"))
            .is_some_and(|channel| !channel.is_empty() && !channel.contains('/'))
}

/// Sets the headers of every SSE answer (a stream, or a refused
/// connection's retry): `Content-Type: text/event-stream`, `Cache-Control:
/// no-cache, no-transform` (no proxy may store or re-encode it) and
/// `X-Accel-Buffering: no` (nginx would otherwise hold frames back).
pub(crate) fn stream_headers(h: &mut HeaderMap) {
    for (name, value) in sse::RESPONSE_HEADERS {
        h.insert(name, HeaderValue::from_static(value));
    }
}

/// The `retry:` (ms, drawn from this range: jittered, so a node's pages do
/// not all come back at once) of an SSE open answered while the journal is
/// unreachable (cluster mode: Redis down, hung or loading); see
/// [`retry_later`]. At least the node's own reconnect backoff (up to 2 s)
/// and short enough that a blip costs a page a few seconds (docs/api.md).
pub(crate) const UNAVAILABLE_RETRY_MS: std::ops::RangeInclusive<u64> = 1_000..=5_000;

/// The answer to an SSE request that cannot be served now but may be soon
/// (a refused connection, `busy.rs`; the journal unreachable or failing at open): 200
/// `text/event-stream` holding only `retry: retry_ms` and the comment
/// `: why` (CR and LF in `why` become spaces), then the end of the stream.
/// A browser's `EventSource` treats any status but 200 as final and never
/// reconnects, but it reconnects after `retry:` from a stream that ends,
/// with the same URL and `Last-Event-ID` (the answer has no `id:`, so the
/// client's last event ID is kept). docs/api.md, "Errors".
pub(crate) fn retry_later(retry_ms: u64, why: &str) -> Response {
    let mut r = Response::new(Body::from(retry_frame(retry_ms, why)));
    stream_headers(r.headers_mut());
    r
}

/// `retry: retry_ms` and the comment `: why` (CR and LF in `why` become
/// spaces), then the blank line: what [`retry_later`] answers, and the last
/// frame of a stream whose journal read failed ([`Feed::next`]).
fn retry_frame(retry_ms: u64, why: &str) -> Bytes {
    let why = why.replace(['\r', '\n'], " ");
    Bytes::from(format!("retry: {retry_ms}\n: {why}\n\n"))
}

/// `GET /v1/channels/{channel}/sse`.
#[utoipa::path(
    get,
    path = "/v1/channels/{channel}/sse",
    operation_id = "channel_sse",
    summary = "Follow one channel over Server-Sent Events",
    tag = "subscribe",
    params(
        ("channel" = gapless_protocol::schema::ChannelName, Path, description = "The channel to follow."),
        SseQuery,
        LastEventIdHeader,
    ),
    responses(
        SseAnswers,
        (status = 400, description = "`invalid_channel`, `invalid_cursor` (a garbage `last_event_id`), or `invalid_request` (a bad `since` or `format`; `channel=` in the query, which is for `/v1/sse`).", body = ErrorBody),
    ),
)]
pub(crate) async fn channel_sse(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    Path(channel): Path<String>,
    RawQuery(raw): RawQuery,
    direct: Option<Extension<DirectStream>>,
    flushes: Option<Extension<Flushes>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref());
    if !q.all("channel").is_empty() {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "channel= is for /v1/sse; this URL already names its channel",
        ));
    }
    open(app, &grant, vec![channel], &q, &headers, direct, flushes).await
}

/// `GET /v1/sse?channel=A&channel=B…`.
#[utoipa::path(
    get,
    path = "/v1/sse",
    operation_id = "multi_sse",
    summary = "Follow several channels over one Server-Sent Events stream",
    tag = "subscribe",
    params(
        ("channel" = Vec<gapless_protocol::schema::ChannelName>, Query, explode, style = Form, min_items = 1,
            description = "The channels to follow (repeat the parameter; duplicates count once): 1 to `--max-subscription-channels` (default 64). The stream's cursors hold every channel's position, so resuming resumes all; a channel added to the URL later starts live."),
        SseQuery,
        LastEventIdHeader,
    ),
    responses(
        SseAnswers,
        (status = 400, description = "`invalid_channel`, `invalid_cursor`, or `invalid_request` (no channel, more than `--max-subscription-channels`, a bad `since` or `format`).", body = ErrorBody),
    ),
)]
pub(crate) async fn multi_sse(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    RawQuery(raw): RawQuery,
    direct: Option<Extension<DirectStream>>,
    flushes: Option<Extension<Flushes>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let q = Query::parse(raw.as_deref());
    // The limit counts `channel` parameters as given, repeats included (the
    // OpenAPI document's `maxItems`), so a request the document calls
    // invalid is refused.
    let named = q.all("channel").len();
    let max = app.config.max_subscription_channels;
    if named > max {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!(
                "a subscription may follow at most {max} channels (--max-subscription-channels); {named} were named"
            ),
        ));
    }
    let mut channels: Vec<String> = Vec::new();
    for c in q.all("channel") {
        if !channels.iter().any(|x| x == c) {
            channels.push(c.to_owned());
        }
    }
    if channels.is_empty() {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "name at least one channel: /v1/sse?channel=A&channel=B",
        ));
    }
    open(app, &grant, channels, &q, &headers, direct, flushes).await
}

async fn open(
    app: Arc<App>,
    grant: &Grant,
    channels: Vec<String>,
    q: &Query,
    headers: &HeaderMap,
    direct: Option<Extension<DirectStream>>,
    flushes: Option<Extension<Flushes>>,
) -> Result<Response, ApiError> {
    let max = app.config.max_subscription_channels;
    if channels.len() > max {
        return Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!(
                "a subscription may follow at most {max} channels (--max-subscription-channels); {} were named",
                channels.len()
            ),
        ));
    }
    for c in &channels {
        names::channel(c)?;
    }
    // Refused whole: one forbidden channel refuses the stream.
    for c in &channels {
        grant.require(Action::Subscribe, c)?;
    }
    let (format, untyped) = match q.get("format") {
        None | Some("plain") => (Format::Plain, false),
        Some("envelope") => (Format::Envelope, false),
        Some("message") => (Format::Envelope, true),
        Some(f) => {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!("format={f:?} must be plain, envelope or message"),
            ))
        }
    };
    let format = StreamFormat { format, untyped };
    let member = presence::member(&app, grant, q.get("client_id"))?;
    let listen = presence::wanted(q.get("presence"))?;
    presence::check_listen(&app, &channels, listen)?;
    let mut starts = starts(&channels, q, headers)?;
    // A namespace's `latest`: only for a client that gave no start at all.
    let given = q.get("since").is_some()
        || query_cursor(q).is_some()
        || headers
            .get("last-event-id")
            .is_some_and(|v| !v.as_bytes().is_empty());
    for (start, channel) in starts.iter_mut().zip(&channels) {
        *start = start::or_latest(&app.config.namespaces, channel, given, *start);
    }
    let followed = channels.clone();
    // The stream's phase on the clock: it ticks in the steps of its wake group.
    let phase = stream::Clock::phase(&app);
    let starts = channels.into_iter().zip(starts).collect();
    let (sub, gaps) = match stream::open(&app, starts, Some(phase.group)).await {
        Ok(opened) => opened,
        Err(e) => {
            if !matches!(e.code, ErrorCode::Unavailable | ErrorCode::JournalFailed) {
                return Err(e);
            }
            // An EventSource gives up for good on a 503 or a 500: tell it to
            // come back (the journal unreachable, or failing: Redis refusing
            // scripts for lack of memory, say).
            metrics::counter!(crate::metrics::REFUSALS, "code" => e.code.as_str()).increment(1);
            let retry_ms = rand::random_range(UNAVAILABLE_RETRY_MS);
            return Ok(retry_later(
                retry_ms,
                &format!("{}: {}", e.code.as_str(), e.message),
            ));
        }
    };
    let mut head = Vec::with_capacity(128);
    head.extend_from_slice(&sse::retry_frame(app.config.retry_ms));
    for g in &gaps {
        head.extend_from_slice(&g.sse_frame());
    }
    head.extend_from_slice(&sse::id_frame(&sub.cursor().encode()));
    let expires = stream::expires_at(grant);
    let seat = presence::stream_seat(&app, &followed, member, listen);
    let feed = Feed::new(
        app,
        sub,
        format,
        head,
        phase.seen,
        expires,
        seat,
        gaps.len(),
    );
    let mut resp = match direct {
        Some(Extension(direct)) => direct.hand_over(feed),
        None => feed
            .into_body(flushes.map(|Extension(f)| f))
            .into_response(),
    };
    stream_headers(resp.headers_mut());
    Ok(resp)
}

/// Where each of `channels` starts (one [`Start`] per channel, in order).
/// `Last-Event-ID` (read as bytes; empty = absent) wins over `last_event_id=`,
/// which wins over `since=`. Public so the fuzz targets (`fuzz/`) can drive
/// it; the SSE handlers call it before subscribing.
///
/// # Errors
/// 400 `invalid_cursor` for an unreadable `last_event_id=`; 400
/// `invalid_request` for a `since=` that [`start::since`] refuses (checked
/// also when a cursor wins).
pub fn starts(channels: &[String], q: &Query, headers: &HeaderMap) -> Result<Vec<Start>, ApiError> {
    let header = headers
        .get("last-event-id")
        .map(|v| v.as_bytes())
        .filter(|b| !b.is_empty());
    // The query is checked even when the header wins: a garbage one is the
    // caller's bug whether or not a reconnect added the header (a browser
    // that put it in the URL got this 400 on its first connection already).
    let query = match query_cursor(q) {
        None => None,
        Some((name, s)) => Some(
            start::read(s.as_bytes())
                .map_err(|e| ApiError::new(ErrorCode::InvalidCursor, format!("{name}: {e}")))?,
        ),
    };
    let resume = match header {
        // A browser cannot change its header: anything unreadable is a gap, not an error.
        Some(h) => start::read(h).unwrap_or(Resume::Unreadable),
        None => query.unwrap_or(Resume::Nothing),
    };
    let since = start::since(q.get("since"))?;
    Ok(start::starts(channels, &resume, since))
}

/// The cursor a client put in the query, and the parameter's name:
/// `last_event_id=`, or `lastEventId=` as the `event-source-polyfill` npm
/// package sends it on a reconnect (it sends no `Last-Event-ID` header);
/// empty counts as absent, and `last_event_id` wins when both are given.
fn query_cursor(q: &Query) -> Option<(&'static str, &str)> {
    let get = |name: &'static str| q.get(name).filter(|s| !s.is_empty()).map(|s| (name, s));
    get("last_event_id").or_else(|| get("lastEventId"))
}

/// Appends an event's pre-encoded `frame` to `out`; with `untyped`, without
/// its `event:` line (one or two slices of the shared bytes, no copy). Only
/// the lines before the first `data:` line are looked at (`id:`, `event:`).
fn push_frame(out: &mut Vec<Bytes>, frame: &Bytes, untyped: bool) {
    if untyped {
        let mut start = 0;
        loop {
            let rest = &frame[start..];
            let is_event = rest.starts_with(b"event:");
            if !is_event && !rest.starts_with(b"id:") {
                break;
            }
            let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
                break;
            };
            let end = start + nl + 1;
            if is_event {
                if start > 0 {
                    out.push(frame.slice(..start));
                }
                out.push(frame.slice(end..));
                return;
            }
            start = end;
        }
    }
    out.push(frame.clone());
}

/// `event: gapless.presence` with the notice as data and no `id:` line: a
/// notice is not journaled and moves no cursor.
fn presence_frame(notice: &gapless_protocol::presence::PresenceNotice) -> Bytes {
    let data = serde_json::to_string(notice).unwrap_or_default();
    Bytes::from(format!(
        "event: {}\ndata: {data}\n\n",
        gapless_protocol::presence::SSE_EVENT
    ))
}

/// The last frame of a stream whose token expired: an event of the reserved
/// type `gapless.expired`, with no `id:` (the client's cursor stays the last
/// event's), after which the stream ends. The client reconnects with a fresh
/// token and its cursor (`docs/security.md`).
pub(crate) const EXPIRED_FRAME: &[u8] = b"event: gapless.expired\ndata: {\"error\":\"token_expired\",\"message\":\"the token expired; reconnect with a fresh token and the last event id\"}\n\n";

/// One SSE stream's source of frames: the subscription, its heartbeat and the
/// shutdown signal. Both transports drain it the same way: the socket writer
/// of `conn.rs` writes each call's frames in one `writev`; a stream opened on
/// a connection hyper already serves goes through [`Feed::into_body`].
pub(crate) struct Feed {
    app: Arc<App>,
    sub: Subscription,
    format: StreamFormat,
    /// `retry:`, gap notices and the first `id:` frame; taken by the first call.
    /// A boxed slice (16 bytes, not a `Bytes`' 32), made a `Bytes` without
    /// a copy when taken.
    head: Option<Box<[u8]>>,
    /// The step of the server's stream clock the stream last ticked at
    /// ([`stream::Clock`]): a period of steps later it ticks again
    /// (heartbeat); [`stream::SHUT`] on the clock: the server shuts down.
    /// The clock is shared by every stream, so an idle one holds no timer or
    /// end signal of its own.
    ticks: u64,
    /// What few streams need (a token's expiry, presence, a blocked
    /// write's wait), out of line: 8 bytes in every stream instead of 40.
    rare: Option<Box<Rare>>,
    /// The stream ended (shutdown or expiry seen): nothing is polled again.
    ended: bool,
    /// The token expired while a writer waited for a full socket
    /// ([`Feed::poll_blocked`]): the writer finishes what it holds, and the
    /// next [`Feed::next`] appends the expiry frame and ends the stream.
    expired_while_blocked: bool,
    /// What the stream sent and why it ended, for its log line.
    tally: Tally,
}

/// The parts of a [`Feed`] that few streams need, made only for those.
#[derive(Default)]
struct Rare {
    /// When the token that opened the stream stops being honoured.
    deadline: Deadline,
    /// Its place in the presence of its channels that have it, and the
    /// notices it asked for (`ops::presence`); left when the stream ends.
    seat: Option<Seat>,
    /// The wait on the clock of a writer blocked on a full socket
    /// ([`Feed::poll_blocked`]): made when a write blocks, dropped when it
    /// wakes or the next call begins.
    blocked: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

/// What a [`Rare`] part of a stream asks for.
enum RareEvent {
    /// The token expired.
    Expired,
    /// A presence notice.
    Notice(gapless_protocol::presence::PresenceNotice),
}

impl Rare {
    /// The token's expiry, or the next presence notice (never without either).
    fn poll(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<RareEvent> {
        if self.deadline.poll(cx).is_ready() {
            return std::task::Poll::Ready(RareEvent::Expired);
        }
        match &mut self.seat {
            Some(seat) => seat.poll_next(cx).map(RareEvent::Notice),
            None => std::task::Poll::Pending,
        }
    }
}

impl Drop for Feed {
    /// The stream's log line (`stream_log.rs`).
    fn drop(&mut self) {
        self.tally.log("sse", &ChannelList(&self.sub));
    }
}

/// The expiry of the token that opened a stream: none, the instant (its
/// timer is made when first polled, on the runtime that drives the stream,
/// and only for a stream whose token expires), or that timer.
#[derive(Default)]
enum Deadline {
    #[default]
    Never,
    At(std::time::Instant),
    Timer(Pin<Box<tokio::time::Sleep>>),
}

impl Deadline {
    /// Ready once the token has expired (never for [`Deadline::Never`]).
    fn poll(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if let Deadline::At(at) = *self {
            let at = tokio::time::Instant::from_std(at);
            *self = Deadline::Timer(Box::pin(tokio::time::sleep_until(at)));
        }
        match self {
            Deadline::Timer(t) => t.as_mut().poll(cx),
            _ => std::task::Poll::Pending,
        }
    }
}

impl Feed {
    /// `at`: the step of the clock its first period counts from
    /// ([`stream::Phase::seen`]; the subscription is in the wake group of
    /// that phase).
    #[allow(clippy::too_many_arguments)]
    fn new(
        app: Arc<App>,
        sub: Subscription,
        format: StreamFormat,
        head: Vec<u8>,
        at: u64,
        expires: Option<std::time::Instant>,
        seat: Option<Seat>,
        gaps: usize,
    ) -> Self {
        let rare = (expires.is_some() || seat.is_some()).then(|| {
            Box::new(Rare {
                deadline: expires.map_or(Deadline::Never, Deadline::At),
                seat,
                blocked: None,
            })
        });
        Feed {
            ticks: at,
            rare,
            ended: false,
            expired_while_blocked: false,
            tally: Tally::new(gaps),
            app,
            sub,
            format,
            head: Some(head.into_boxed_slice()),
        }
    }

    /// Waits for what is next (events, a gap, a heartbeat, shutdown) and
    /// appends its frames to `out`: every event the subscription has ready,
    /// up to `read_batch` (from the journal, also about 1 MiB), so a reader
    /// that fell behind catches up in few writes. Cancel-safe: dropping the
    /// future loses nothing.
    ///
    /// An `async` block over `self` and `out`, not an `async fn`, which
    /// would keep both twice in the future (16 bytes of every stream's task).
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn next<'s, 'o>(
        &'s mut self,
        out: &'o mut Vec<Bytes>,
    ) -> impl Future<Output = Flow> + Send + use<'s, 'o> {
        async move {
            if let Some(head) = self.head.take() {
                out.push(Bytes::from(head));
                return Flow::More;
            }
            if self.expired_while_blocked {
                return self.finish(End::Expired, out);
            }
            if let Some(rare) = &mut self.rare {
                rare.blocked = None;
            }
            // The clock is looked at first (shutdown ends even a busy stream)
            // and again after the subscription's wait is registered: a step
            // wakes the subscribers of its phase, and shutdown every one,
            // after moving the count ([`stream::Clock`]).
            if let Some(flow) = self.clock(out) {
                return flow;
            }
            let (rare, ended) = (&mut self.rare, self.ended);
            let item = tokio::select! {
                biased;
                event = std::future::poll_fn(|cx| match rare {
                    Some(rare) => rare.poll(cx),
                    None => std::task::Poll::Pending,
                }), if !ended && rare.is_some() => match event {
                    RareEvent::Expired => {
                        self.ended = true;
                        return self.finish(End::Expired, out);
                    }
                    RareEvent::Notice(notice) => {
                        out.push(presence_frame(&notice));
                        return Flow::More;
                    }
                },
                item = self.sub.next() => item,
                () = std::future::poll_fn(|_| {
                    if stream::Clock::ready(self.app.clock.ticks(), self.ticks) {
                        std::task::Poll::Ready(())
                    } else {
                        std::task::Poll::Pending
                    }
                }), if !ended => {
                    return self.clock(out).unwrap_or(Flow::More);
                }
            };
            match item {
                Err(e) => {
                    self.ended_by(Ended::JournalFailed);
                    let log = e.to_string();
                    // What an open answers while the journal fails: the cause
                    // (the code and message a request would get) and a `retry:`
                    // of 1 to 5 s, drawn for each stream, so an EventSource (which
                    // cannot tell a broken body from a clean end) waits too and
                    // a node's pages do not all come back at once.
                    let e = ApiError::from(e);
                    out.push(retry_frame(
                        rand::random_range(UNAVAILABLE_RETRY_MS),
                        &format!("{}: {}", e.code.as_str(), e.message),
                    ));
                    Flow::Fail(log)
                }
                Ok(Item::Events { index, events }) => {
                    stream::delivered(Transport::Sse, &mut self.tally, &self.sub, index, &events);
                    let StreamFormat { format, untyped } = self.format;
                    if self.sub.len() == 1 {
                        for e in &events {
                            push_frame(out, e.sse_frame(format), untyped);
                        }
                    } else {
                        for e in &events {
                            out.push(sse::id_line(&self.sub.cursor_at(index, e.seq).encode()));
                            push_frame(out, e.sse_body(format), untyped);
                        }
                    }
                    Flow::More
                }
                Ok(Item::Gap(g)) => {
                    self.tally.gaps(1);
                    out.push(g.sse_frame());
                    out.push(sse::id_frame(&self.sub.cursor().encode()));
                    Flow::More
                }
                Ok(Item::Ephemeral(e)) => {
                    self.tally.events(1);
                    push_frame(out, e.sse_frame(self.format.format), self.format.untyped);
                    Flow::More
                }
            }
        }
    }

    /// What the stream clock asks, if it moved since last seen: the end
    /// (shutdown), or a tick (with heartbeats on, its frame appended).
    fn clock(&mut self, out: &mut Vec<Bytes>) -> Option<Flow> {
        if self.ended {
            return None;
        }
        let now = self.app.clock.ticks();
        // Whatever was seen before: a stream opened while the server began
        // to shut down (after `stream::open`'s check) ends too.
        if now == stream::SHUT {
            self.ended = true;
            return Some(self.finish(End::Shutdown, out));
        }
        if !stream::Clock::due(now, &mut self.ticks) {
            return None;
        }
        if self.app.config.heartbeat_ms > 0 {
            out.push(Bytes::from_static(sse::HEARTBEAT));
        }
        Some(Flow::Tick)
    }

    /// The stream ends for `end`: appends its last frame to `out` (the expiry
    /// notice for [`End::Expired`], none at shutdown). Every writer writes
    /// what `out` holds before it ends the body, whatever the [`Flow`].
    fn finish(&mut self, end: End, out: &mut Vec<Bytes>) -> Flow {
        match end {
            End::Expired => {
                out.push(Bytes::from_static(EXPIRED_FRAME));
                self.ended_by(Ended::TokenExpired);
            }
            End::Shutdown => self.ended_by(Ended::Shutdown),
        }
        Flow::End
    }

    /// Records why the stream ends (the first reason given wins).
    pub(crate) fn ended_by(&mut self, why: Ended) {
        self.tally.ended_by(why);
    }

    /// For a writer blocked on a full socket: whether the stream must end
    /// now (shutdown: a client that stopped reading cannot hold it), or,
    /// with `ticks`, its timer ticked (time to check the client). Polled in
    /// place by the writer, so the wait holds no future of its own.
    ///
    /// Token expiry does not cut the write: what the writer holds was read
    /// while the token was honoured, and a client that reads, however
    /// slowly, is owed the expiry frame after it (the next [`Feed::next`]
    /// appends it and reads nothing more). From then on the end future
    /// waits for shutdown only.
    pub(crate) fn poll_blocked(
        &mut self,
        cx: &mut std::task::Context<'_>,
        ticks: bool,
    ) -> std::task::Poll<Waited> {
        use std::task::Poll;
        if self.ended {
            return Poll::Ready(Waited::Ended);
        }
        let rare = self.rare.get_or_insert_with(Box::default);
        if !self.expired_while_blocked && rare.deadline.poll(cx).is_ready() {
            // From now on only shutdown cuts the write.
            rare.deadline = Deadline::Never;
            self.expired_while_blocked = true;
            self.ended_by(Ended::TokenExpired);
        }
        // The clock's wait is made the first time a write blocks, and
        // replaced by a fresh one each time it wakes; it waits for a count
        // other than the one read, so a step or shutdown between the read and
        // the wait's making is not missed.
        loop {
            let now = self.app.clock.ticks();
            if now == stream::SHUT {
                self.ended = true;
                self.ended_by(Ended::Shutdown);
                return Poll::Ready(Waited::Ended);
            }
            if stream::Clock::due(now, &mut self.ticks) && ticks {
                return Poll::Ready(Waited::Tick);
            }
            let app = &self.app;
            let rare = self.rare.get_or_insert_with(Box::default);
            let wait = rare
                .blocked
                .get_or_insert_with(|| app.clock.changed_from(now));
            if wait.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            rare.blocked = None;
        }
    }

    /// The feed as a hyper response body (chunked), for a stream opened on a
    /// connection that already carried another request (`conn::body`, with
    /// `flushes`, the connection's).
    pub(crate) fn into_body(self, flushes: Option<Flushes>) -> Body {
        let shutdown = self.app.shutdown.clone();
        crate::net::conn::body(self, flushes, shutdown)
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
        Feed::poll_blocked(self, cx, ticks)
    }

    fn client_gone(&mut self, how: Gone) {
        self.ended_by(match how {
            Gone::Closed => Ended::ClientClosed,
            Gone::Vanished => Ended::ClientVanished,
            Gone::WriteFailed => Ended::WriteFailed,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_untyped_frame_loses_its_event_line_and_nothing_else() {
        let joined = |frame: &[u8]| {
            let mut out = Vec::new();
            push_frame(&mut out, &Bytes::copy_from_slice(frame), true);
            out.concat()
        };
        for (frame, want) in [
            (
                &b"id: C\nevent: quote\ndata: {}\n\n"[..],
                &b"id: C\ndata: {}\n\n"[..],
            ),
            (
                b"event: quote\ndata: a\ndata: b\n\n",
                b"data: a\ndata: b\n\n",
            ),
            (b"id: C\ndata: event: x\n\n", b"id: C\ndata: event: x\n\n"),
            (b"data: x\nevent: y\n\n", b"data: x\nevent: y\n\n"),
        ] {
            assert_eq!(joined(frame), want, "{:?}", String::from_utf8_lossy(frame));
        }
    }

    /// What one idle SSE subscriber holds, structure by structure
    /// (docs/performance.md, "Idle memory, structure by structure"): printed
    /// with `--nocapture`, and bounded so a change that grows an idle
    /// stream fails here rather than in a benchmark.
    #[test]
    fn an_idle_stream_s_structures_stay_small() {
        use std::mem::size_of;
        fn output2<'a, A: 'a, B: 'a, R>(_: impl FnOnce(&'a mut A, &'a mut B) -> R) -> usize {
            size_of::<R>()
        }
        fn output1<'a, A: 'a, R>(_: impl FnOnce(&'a mut A) -> R) -> usize {
            size_of::<R>()
        }
        let sizes = [
            (
                "stream task future",
                crate::net::conn::stream_task_bytes::<Feed>(),
            ),
            ("Feed", size_of::<Feed>()),
            ("Feed::next future", output2(Feed::next)),
            ("Subscription", size_of::<Subscription>()),
            ("Subscription::next future", output1(Subscription::next)),
            ("Tally", size_of::<Tally>()),
            ("tokio Interval", size_of::<tokio::time::Interval>()),
            (
                "tokio Sleep (boxed by Interval)",
                size_of::<tokio::time::Sleep>(),
            ),
            ("tokio TcpStream", size_of::<tokio::net::TcpStream>()),
            ("Conn", size_of::<crate::net::listener::Conn>()),
            (
                "WaitForCancellationFutureOwned",
                size_of::<tokio_util::sync::WaitForCancellationFutureOwned>(),
            ),
        ];
        for (name, bytes) in sizes {
            println!("{name}: {bytes} bytes");
        }
        // tokio allocates a task as one cell: 32 bytes of header, 16 of
        // scheduler and id, the future and the stage's 8, 48 of trailer,
        // rounded up to 128 (its alignment). At most 536 bytes of future
        // keep the cell at 640 bytes, a jemalloc size class; 8 more make it 768.
        let task = sizes[0].1;
        assert!(task <= 536, "a stream's task future is {task} bytes");
    }

    #[test]
    fn the_expired_frame_is_what_the_document_says() {
        let frame = std::str::from_utf8(EXPIRED_FRAME).expect("UTF-8");
        let data = frame
            .strip_prefix("event: gapless.expired\ndata: ")
            .and_then(|d| d.strip_suffix("\n\n"))
            .expect("one event of type gapless.expired");
        let notice: ExpiredNotice = serde_json::from_str(data).expect("an ExpiredNotice");
        assert_eq!(notice.error, ExpiredCode::TokenExpired);
        assert!(!notice.message.is_empty());
    }
}
