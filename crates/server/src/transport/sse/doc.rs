//! The parameters and answers of both SSE operations, written once and
//! named in their `#[utoipa::path]` annotations (as `admin::openapi::shared`
//! does for what several transports share).

use super::{SseEvent, SseFormat};
use crate::admin::openapi::shared::{group, StreamForbidden, StreamShuttingDown, Unauthorized};
use crate::error::ErrorBody;
use gapless_protocol::Since;
use std::collections::BTreeMap;
use utoipa::openapi::{RefOr, Response};
use utoipa::{IntoParams, IntoResponses};

/// Where an SSE stream starts and how its events are written (both SSE
/// operations; the `Last-Event-ID` header is [`LastEventIdHeader`]).
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct SseQuery {
    /// Start after this cursor (EventSource cannot set headers on its first connection). A garbage value is refused with 400 `invalid_cursor`.
    #[param(value_type = Option<gapless_protocol::Cursor>, nullable = false)]
    pub last_event_id: Option<String>,
    /// The same as `last_event_id`, under the name the `event-source-polyfill` npm package uses when it reconnects (it sends no `Last-Event-ID` header); `last_event_id` wins when both are given.
    #[param(rename = "lastEventId", value_type = Option<gapless_protocol::Cursor>, nullable = false)]
    pub last_event_id_polyfill: Option<String>,
    /// Without a cursor (checked also with one): `live` (the default) follows events published from now on; `earliest` replays everything retained; `last:N` the last N retained events (1 to 1000); `time:UNIX_MS` from the first retained event at or after that time (a gap notice `evicted` first when an event no longer retained may be at or after it); each then follows live. Any other value: 400 `invalid_request` naming it.
    #[param(value_type = Option<Since>, nullable = false)]
    pub since: Option<String>,
    /// `plain` (the default): `data` is the event's data; `envelope`: `data` is JSON `{"channel","seq","type","data","time"}` (schema `Envelope`); `message`: as `envelope`, and every event comes with no `event:` line, as the default type `message` (its type is the envelope's `type`), so an EventSource's `onmessage` sees every event whatever its type. Gap notices and `gapless.expired` keep their types in every format.
    #[param(value_type = Option<SseFormat>, nullable = false)]
    pub format: Option<String>,
    /// On an open server, the subscriber's identity for presence (issue 21): 1 to 128 characters of `A-Z a-z 0-9 . _ : @ -`, else 400 `invalid_request`; the stream's connection to each of its channels whose namespace has presence is then this member's. On a server with keys a member is its token's `sub` and this is refused (400 `invalid_request`).
    #[param(
        nullable = false,
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9._:@-]+$"
    )]
    pub client_id: Option<String>,
    /// `true`: also get the join and leave of the members of the stream's channels that have presence, as `event: gapless.presence` with data `PresenceNotice` and no `id:` line (not journaled, no cursor moves). 404 `presence_disabled` when none of its channels has presence; any value but `true` or `false` is 400 `invalid_request`.
    #[param(value_type = Option<bool>, nullable = false)]
    pub presence: Option<String>,
}

/// The header a reconnecting EventSource sends (both SSE operations).
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub(super) struct LastEventIdHeader {
    /// Start after this cursor; wins over the query (a reconnecting EventSource keeps its URL and adds this header). Any bytes; empty is absent; an unreadable one starts the stream with a gap notice of reason `unknown`, not an error.
    #[param(rename = "Last-Event-ID", nullable = false)]
    pub last_event_id: Option<String>,
}

/// 200 of both SSE operations: the stream.
#[derive(IntoResponses)]
#[response(
    status = 200,
    description = "The stream, which runs until the client leaves or the server shuts down: `retry:`, one gap notice (`event: gap`, data `GapNotice`) per channel whose start cannot be served whole, an `id:`-only frame with the subscription's cursor, then replayed and live events (`id:` the cursor after the event, `event:` its type when it has one, `data:` lines), ephemeral events (no `id:`), a heartbeat comment every `--heartbeat-ms`, and, when the token expires, `event: gapless.expired`. A refused connection (over `--max-connections`) gets a stream holding only `retry:` (1 to 10 s) and a comment instead of a 503, so a browser reconnects later; so does a stream opened while the journal is unreachable (cluster mode: Redis down, hung or loading) or failing (a storage error, e.g. Redis refusing scripts for lack of memory): `retry:` of 1 to 5 s and the comment `: unavailable: …` or `: journal_failed: …`, then the end, and the reconnect with the same `Last-Event-ID` resumes exactly (docs/api.md).",
    content_type = "text/event-stream",
    headers(
        ("Cache-Control" = String, description = "`no-cache, no-transform`"),
        ("X-Accel-Buffering" = String, description = "`no`: proxies must not buffer the stream"),
    )
)]
pub(super) struct SseStream(pub SseEvent);

group! {
    /// Every answer of both SSE operations but their 400: the stream, 401,
    /// 403, 503 `shutting_down` (the journal unreachable or failing at open
    /// is a 200 with `retry:` only, described with the stream).
    SseAnswers = SseStream, Unauthorized, StreamForbidden, StreamPresenceDisabled, StreamShuttingDown
}

/// 404 of both SSE operations.
#[derive(IntoResponses)]
#[response(
    status = 404,
    description = "`presence_disabled`: `presence=true` and none of the stream's channels is in a namespace with presence."
)]
pub(super) struct StreamPresenceDisabled(pub ErrorBody);
