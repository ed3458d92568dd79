//! The parameters and answers that several operations share, each written
//! once and named in the operations' `#[utoipa::path]` annotations:
//! `params(SessionPath)`, `responses(ServerErrors)`.
//!
//! A parameter set is an `IntoParams` type (its fields are the parameters;
//! their doc comments, kept on one line, are the descriptions). An answer is
//! an `IntoResponses` type of one status (the field is the body); a group of
//! answers ([`group!`]) is the union of its members. None of these types is
//! ever built: they exist for the document only.
//!
//! `IntoResponses` does not register the schemas its bodies name, so each
//! body schema named here is also listed in [`super::ApiDoc`]'s components.

use crate::error::ErrorBody;
use crate::transport::sse::{Since, SseEvent, SseFormat};
use std::collections::BTreeMap;
use utoipa::openapi::{RefOr, Response};
use utoipa::{IntoParams, IntoResponses};

/// Declares `$group`, whose answers are those of every `$part`.
macro_rules! group {
    ($(#[$doc:meta])* $group:ident = $($part:ty),+ $(,)?) => {
        $(#[$doc])*
        pub struct $group;

        impl IntoResponses for $group {
            fn responses() -> BTreeMap<String, RefOr<Response>> {
                let mut all = BTreeMap::new();
                $(all.extend(<$part as IntoResponses>::responses());)+
                all
            }
        }
    };
}

// ---- Parameters ----

/// The `{id}` of every `/v1/sessions/{id}…` operation.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SessionPath {
    /// The session.
    #[param(value_type = crate::transport::http::sessions::SessionId)]
    pub id: String,
}

/// Where an SSE stream starts and how its events are written (both SSE
/// operations; the `Last-Event-ID` header is [`LastEventIdHeader`]).
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SseQuery {
    /// Start after this cursor (EventSource cannot set headers on its first connection). A garbage value is refused with 400 `invalid_cursor`.
    #[param(value_type = Option<gapless_protocol::Cursor>, nullable = false)]
    pub last_event_id: Option<String>,
    /// Without a cursor: `live` (the default) follows events published from now on; `earliest` replays everything retained, then follows live.
    #[param(value_type = Option<Since>, nullable = false)]
    pub since: Option<String>,
    /// `plain` (the default): `data` is the event's data; `envelope`: `data` is JSON `{"channel","seq","type","data","time"}` (schema `Envelope`); `message`: as `envelope`, and every event comes with no `event:` line, as the default type `message` (its type is the envelope's `type`), so an EventSource's `onmessage` sees every event whatever its type. Gap notices and `gapless.expired` keep their types in every format.
    #[param(value_type = Option<SseFormat>, nullable = false)]
    pub format: Option<String>,
}

/// The header a reconnecting EventSource sends (both SSE operations).
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct LastEventIdHeader {
    /// Start after this cursor; wins over the query (a reconnecting EventSource keeps its URL and adds this header). Any bytes; empty is absent; an unreadable one starts the stream with a gap notice of reason `unknown`, not an error.
    #[param(rename = "Last-Event-ID", nullable = false)]
    pub last_event_id: Option<String>,
}

/// The headers of a WebSocket handshake (RFC 6455 section 4.1), on both
/// WebSocket routes.
#[derive(IntoParams)]
#[into_params(parameter_in = Header)]
pub struct Handshake {
    /// Must include `upgrade` (RFC 6455 section 4.1).
    #[param(rename = "Connection", pattern = "[Uu][Pp][Gg][Rr][Aa][Dd][Ee]")]
    pub connection: String,
    /// `websocket`.
    #[param(rename = "Upgrade", pattern = "^[Ww][Ee][Bb][Ss][Oo][Cc][Kk][Ee][Tt]$")]
    pub upgrade: String,
    /// `13`.
    #[param(rename = "Sec-WebSocket-Version", pattern = "^13$")]
    pub version: String,
    /// 16 random bytes in base64.
    #[param(rename = "Sec-WebSocket-Key", pattern = "^[A-Za-z0-9+/]{22}==$")]
    pub key: String,
    /// Subprotocols offered: when present, it must include `gapless.v1`, which the answer then names.
    #[param(rename = "Sec-WebSocket-Protocol", nullable = false)]
    pub protocol: Option<String>,
}

// ---- Answers of one status ----

/// 401 (removed from the document when tokens are off).
#[derive(IntoResponses)]
#[response(status = 401, description = "`unauthorized`.")]
pub struct Unauthorized(pub ErrorBody);

/// 408 for a slow body.
#[derive(IntoResponses)]
#[response(
    status = 408,
    description = "`request_timeout`: the body arrived slower than `--min-body-rate`."
)]
pub struct SlowBody(pub ErrorBody);

/// 500 of an operation that reads or writes the journal.
#[derive(IntoResponses)]
#[response(status = 500, description = "`journal_failed`.")]
pub struct JournalFailed(pub ErrorBody);

/// 500 of an operation that reads the journal (streams, history).
#[derive(IntoResponses)]
#[response(
    status = 500,
    description = "`journal_failed`: the journal could not be read."
)]
pub struct JournalUnreadable(pub ErrorBody);

/// 503 of an operation that needs the journal.
#[derive(IntoResponses)]
#[response(
    status = 503,
    description = "`unavailable` (cluster mode) or `shutting_down`."
)]
pub struct Unavailable(pub ErrorBody);

/// 503 of the SSE streams: only `shutting_down`. The journal unreachable at
/// open (cluster mode) is answered 200 with `retry:` only ([`SseStream`]):
/// an EventSource gives up for good on any status but 200.
#[derive(IntoResponses)]
#[response(
    status = 503,
    description = "`shutting_down`: the server is stopping. (The journal unreachable, in cluster mode, is not a 503 here: see the 200.)"
)]
pub struct StreamShuttingDown(pub ErrorBody);

/// 507 of a session write.
#[derive(IntoResponses)]
#[response(status = 507, description = "`journal_full`.")]
pub struct JournalFull(pub ErrorBody);

/// 403 of the channel publishes.
#[derive(IntoResponses)]
#[response(
    status = 403,
    description = "`forbidden`: the token may not publish to this channel."
)]
pub struct PublishForbidden(pub ErrorBody);

/// 403 of the channel reads.
#[derive(IntoResponses)]
#[response(
    status = 403,
    description = "`forbidden`: the token may not subscribe to this channel."
)]
pub struct SubscribeForbidden(pub ErrorBody);

/// 403 of the SSE streams.
#[derive(IntoResponses)]
#[response(
    status = 403,
    description = "`forbidden`: the token may not subscribe to a channel of the stream (one refuses the whole stream)."
)]
pub struct StreamForbidden(pub ErrorBody);

/// 403 of the producer's session operations.
#[derive(IntoResponses)]
#[response(
    status = 403,
    description = "`forbidden`: the token may not publish to `session/ID`."
)]
pub struct SessionPublishForbidden(pub ErrorBody);

/// 403 of the session reads.
#[derive(IntoResponses)]
#[response(
    status = 403,
    description = "`forbidden`: the token may not subscribe to `session/ID`."
)]
pub struct SessionSubscribeForbidden(pub ErrorBody);

/// 404 of the session operations.
#[derive(IntoResponses)]
#[response(status = 404, description = "`session_not_found`.")]
pub struct SessionNotFound(pub ErrorBody);

/// 400 of a session operation whose only input is its path.
#[derive(IntoResponses)]
#[response(
    status = 400,
    description = "`invalid_request`: the path is not UTF-8."
)]
pub struct PathNotUtf8(pub ErrorBody);

/// 507 of a session read: looking at a session can cancel it (its grace
/// window ran out), which writes its end marker.
#[derive(IntoResponses)]
#[response(
    status = 507,
    description = "`journal_full`: a session whose grace window ran out is cancelled when it is looked at, and its marker could not be stored."
)]
pub struct SessionMarkerNotStored(pub ErrorBody);

/// 409 of complete and cancel.
#[derive(IntoResponses)]
#[response(
    status = 409,
    description = "`session_ended`: already completed or cancelled (`status` says which)."
)]
pub struct AlreadyEnded(pub ErrorBody);

/// 507 of complete and cancel.
#[derive(IntoResponses)]
#[response(
    status = 507,
    description = "`journal_full`: the end marker could not be stored."
)]
pub struct EndMarkerNotStored(pub ErrorBody);

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
pub struct SseStream(pub SseEvent);

// ---- Groups ----

group! {
    /// What any operation that touches the journal may answer: 401, 500
    /// `journal_failed`, 503.
    ServerErrors = Unauthorized, JournalFailed, Unavailable
}

group! {
    /// Every answer of complete and cancel but their 200.
    SessionEndErrors = PathNotUtf8, SessionPublishForbidden, SessionNotFound, AlreadyEnded,
        EndMarkerNotStored, ServerErrors
}

group! {
    /// Every answer of both SSE operations but their 400: the stream, 401,
    /// 403, 503 `shutting_down` (the journal unreachable or failing at open
    /// is a 200 with `retry:` only, described with the stream).
    SseAnswers = SseStream, Unauthorized, StreamForbidden, StreamShuttingDown
}
