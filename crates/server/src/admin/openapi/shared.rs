//! The parameters and answers that several operations share, each written
//! once and named in the operations' `#[utoipa::path]` annotations:
//! `params(SessionPath)`, `responses(ServerErrors)`.
//!
//! A parameter set is an `IntoParams` type (its fields are the parameters;
//! their doc comments, kept on one line, are the descriptions). An answer is
//! an `IntoResponses` type of one status (the field is the body); a group of
//! answers ([`group!`](group_of)) is the union of its members. None of these types is
//! ever built: they exist for the document only.
//!
//! `IntoResponses` does not register the schemas its bodies name, so each
//! body schema named here is also listed in [`super::ApiDoc`]'s components.

use crate::error::ErrorBody;
use std::collections::BTreeMap;
use utoipa::openapi::{RefOr, Response};
use utoipa::{IntoParams, IntoResponses};

/// Declares `$group`, whose answers are those of every `$part`.
macro_rules! group_of {
    ($(#[$doc:meta])* $group:ident = $($part:ty),+ $(,)?) => {
        $(#[$doc])*
        pub(crate) struct $group;

        impl IntoResponses for $group {
            fn responses() -> BTreeMap<String, RefOr<Response>> {
                let mut all = BTreeMap::new();
                $(all.extend(<$part as IntoResponses>::responses());)+
                all
            }
        }
    };
}

/// [`group_of!`] for the transports' own groups.
pub(crate) use group_of as group;

// ---- Parameters ----

/// The `{id}` of every `/v1/sessions/{id}…` operation.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct SessionPath {
    /// The session.
    #[param(value_type = SessionId)]
    pub id: String,
}

pub(crate) use gapless_protocol::schema::SessionId;

// ---- Answers of one status ----

/// 401 (removed from the document when tokens are off).
#[derive(IntoResponses)]
#[response(status = 401, description = "`unauthorized`.")]
pub(crate) struct Unauthorized(pub ErrorBody);

/// 408 for a slow body.
#[derive(IntoResponses)]
#[response(
    status = 408,
    description = "`request_timeout`: the body arrived slower than `--min-body-rate`."
)]
pub(crate) struct SlowBody(pub ErrorBody);

/// 500 of an operation that reads or writes the journal.
#[derive(IntoResponses)]
#[response(status = 500, description = "`journal_failed`.")]
pub(crate) struct JournalFailed(pub ErrorBody);

/// 500 of an operation that reads the journal (streams, history).
#[derive(IntoResponses)]
#[response(
    status = 500,
    description = "`journal_failed`: the journal could not be read."
)]
pub(crate) struct JournalUnreadable(pub ErrorBody);

/// 503 of an operation that needs the journal.
#[derive(IntoResponses)]
#[response(
    status = 503,
    description = "`unavailable` (cluster mode) or `shutting_down`."
)]
pub(crate) struct Unavailable(pub ErrorBody);

/// 503 of the SSE streams: only `shutting_down`. The journal unreachable at
/// open (cluster mode) is answered 200 with `retry:` only ([`SseStream`]):
/// an EventSource gives up for good on any status but 200.
#[derive(IntoResponses)]
#[response(
    status = 503,
    description = "`shutting_down`: the server is stopping. (The journal unreachable, in cluster mode, is not a 503 here: see the 200.)"
)]
pub(crate) struct StreamShuttingDown(pub ErrorBody);

/// 507 of a session write.
#[derive(IntoResponses)]
#[response(status = 507, description = "`journal_full`.")]
pub(crate) struct JournalFull(pub ErrorBody);

/// 403 of the channel publishes.
#[derive(IntoResponses)]
#[response(
    status = 403,
    description = "`forbidden`: the token may not publish to this channel; or the token is the `gapless_token` cookie and the request's `Origin` is neither this server's nor one allowed by `--cors-origin` (cross-site request forgery); or an ephemeral publish (`ephemeral=true`) to a channel whose namespace has `ephemeral = false` (the answer's `namespace` names it)."
)]
pub(crate) struct PublishForbidden(pub ErrorBody);

/// 403 of the channel reads.
#[derive(IntoResponses)]
#[response(
    status = 403,
    description = "`forbidden`: the token may not subscribe to this channel."
)]
pub(crate) struct SubscribeForbidden(pub ErrorBody);

/// 403 of the SSE streams.
#[derive(IntoResponses)]
#[response(
    status = 403,
    description = "`forbidden`: the token may not subscribe to a channel of the stream (one refuses the whole stream)."
)]
pub(crate) struct StreamForbidden(pub ErrorBody);

/// 403 of the WebSocket handshakes (`GET /v1/ws`, `GET /v1/sessions/{id}/ws`):
/// the cookie guard; a token's own refusals come after the upgrade.
#[derive(IntoResponses)]
#[response(
    status = 403,
    description = "`forbidden`: the handshake's token is the `gapless_token` cookie and its `Origin` is neither this server's own nor one allowed by `--cors-origin` (cross-site WebSocket hijacking, docs/security.md). A Bearer header or `access_token` is taken from any origin."
)]
pub(crate) struct HandshakeForbidden(pub ErrorBody);

/// 403 of the producer's session operations.
#[derive(IntoResponses)]
#[response(
    status = 403,
    description = "`forbidden`: the token may not publish to `session/ID`; or the token is the `gapless_token` cookie and the request's `Origin` is neither this server's nor one allowed by `--cors-origin` (cross-site request forgery)."
)]
pub(crate) struct SessionPublishForbidden(pub ErrorBody);

/// 403 of the session reads.
#[derive(IntoResponses)]
#[response(
    status = 403,
    description = "`forbidden`: the token may not subscribe to `session/ID`."
)]
pub(crate) struct SessionSubscribeForbidden(pub ErrorBody);

/// 404 of the session operations.
#[derive(IntoResponses)]
#[response(status = 404, description = "`session_not_found`.")]
pub(crate) struct SessionNotFound(pub ErrorBody);

/// 400 of a session operation whose only input is its path.
#[derive(IntoResponses)]
#[response(
    status = 400,
    description = "`invalid_request`: the path is not UTF-8."
)]
pub(crate) struct PathNotUtf8(pub ErrorBody);

/// 507 of a session read: looking at a session can cancel it (its grace
/// window ran out), which writes its end marker.
#[derive(IntoResponses)]
#[response(
    status = 507,
    description = "`journal_full`: a session whose grace window ran out is cancelled when it is looked at, and its marker could not be stored."
)]
pub(crate) struct SessionMarkerNotStored(pub ErrorBody);

/// 409 of complete and cancel.
#[derive(IntoResponses)]
#[response(
    status = 409,
    description = "`session_ended`: already completed or cancelled (`status` says which)."
)]
pub(crate) struct AlreadyEnded(pub ErrorBody);

/// 507 of complete and cancel.
#[derive(IntoResponses)]
#[response(
    status = 507,
    description = "`journal_full`: the end marker could not be stored."
)]
pub(crate) struct EndMarkerNotStored(pub ErrorBody);

// ---- Groups ----

group_of! {
    /// What any operation that touches the journal may answer: 401, 500
    /// `journal_failed`, 503.
    ServerErrors = Unauthorized, JournalFailed, Unavailable
}

group_of! {
    /// Every answer of complete and cancel but their 200.
    SessionEndErrors = PathNotUtf8, SessionPublishForbidden, SessionNotFound, AlreadyEnded,
        EndMarkerNotStored, ServerErrors
}
