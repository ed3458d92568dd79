//! Sessions, once for every transport: the rules of each operation over
//! `gapless_core::session` (who may create, append to, end, read or attach
//! to a session, the id's shape, the publish limit of an append, how a
//! refusal is answered), a session's status on the wire, and what a
//! consumer is sent while it replays ([`Replay`]). The producer side is
//! `transport::http::sessions`, the consumer side `transport::ws::session`:
//! each reads its wire into these calls and writes their answers.

use crate::auth::{Action, Grant};
use crate::error::ApiError;
use crate::App;
use gapless_core::session::{self, Attachment, Info, SessionError, Status};
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::{Event, NewEvent};
use std::net::IpAddr;

/// The largest body of a session create, in bytes (`{"id": ID}` and room).
pub(crate) const CREATE_BODY_BYTES: usize = 4096;

/// Creates a session: `id` given, or drawn by the server when `None`.
///
/// # Errors
/// 403 `forbidden` when `grant` may not publish to `session/ID` (for a drawn
/// id, to `session/*`); 400 `invalid_request` for an id of another shape;
/// 409 `session_exists`; the journal's errors.
pub(crate) async fn create(app: &App, grant: &Grant, id: Option<String>) -> Result<Info, ApiError> {
    match &id {
        Some(id) => grant.require_session(Action::Publish, id)?,
        None => grant.require_any_session()?,
    }
    if let Some(id) = &id {
        if !session::valid_id(id) {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "session id {id:?} must be 1 to {} characters of A-Z a-z 0-9 _ -",
                    session::MAX_ID_LEN
                ),
            ));
        }
    }
    Ok(app.sessions.create(&app.hub, id).await?)
}

/// Whether `grant` may produce to session `id` (append, complete, cancel).
///
/// # Errors
/// 401/403 from the grant.
pub(crate) fn may_produce(grant: &Grant, id: &str) -> Result<(), ApiError> {
    grant.require_session(Action::Publish, id)
}

/// Whether `grant` may read session `id` (its state, its history, attach).
///
/// # Errors
/// 401/403 from the grant.
pub(crate) fn may_consume(grant: &Grant, id: &str) -> Result<(), ApiError> {
    grant.require_session(Action::Subscribe, id)
}

/// The refusal of an ephemeral append: 400 `invalid_request`.
pub(crate) fn no_ephemeral() -> ApiError {
    ApiError::new(
        ErrorCode::InvalidRequest,
        "sessions have no ephemeral events: every event is journaled for its consumer",
    )
}

/// What an append did.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionAppend {
    /// The event's seq (the original one for an idempotent retry).
    pub seq: u64,
    /// Whether a consumer is attached now.
    pub attached: bool,
    /// An idempotent retry: nothing was appended.
    pub duplicate: bool,
}

/// Appends `event` to session `id` (the caller checked [`may_produce`]):
/// one event of the publisher's rate (`--publish-rate`, by `grant` or
/// `ip`), then the append.
///
/// # Errors
/// 429 `rate_limited`; 404 `session_not_found`; 409 `session_ended`; the
/// journal's errors, worded for a publish (`Idempotency-Key`).
pub(crate) async fn append(
    app: &App,
    grant: &Grant,
    ip: Option<IpAddr>,
    id: &str,
    event: NewEvent,
    key: Option<&str>,
) -> Result<SessionAppend, ApiError> {
    app.publish_limiter.take(grant, ip, 1)?;
    let (appended, attached) = app
        .sessions
        .append(&app.hub, id, vec![event], key)
        .await
        .map_err(|e| ApiError::from(e).publish_refused("Idempotency-Key"))?;
    Ok(SessionAppend {
        seq: appended.last_seq,
        attached,
        duplicate: appended.duplicate,
    })
}

/// Ends session `id` with `status` (completed or cancelled; the caller
/// checked [`may_produce`]).
///
/// # Errors
/// 404 `session_not_found`; 409 `session_ended`; the journal's errors.
pub(crate) async fn end(app: &App, id: &str, status: Status) -> Result<Info, ApiError> {
    Ok(app.sessions.end(&app.hub, id, status).await?)
}

/// Session `id` as it is now (the caller checked [`may_consume`]).
///
/// # Errors
/// 404 `session_not_found`; the journal's errors.
pub(crate) async fn info(app: &App, id: &str) -> Result<Info, ApiError> {
    Ok(app.sessions.info(&app.hub, id).await?)
}

/// A consumer's `last_seq` (absent: a live attach).
///
/// # Errors
/// 400 `invalid_request` for anything but a whole number.
pub(crate) fn last_seq(text: Option<&str>) -> Result<Option<u64>, ApiError> {
    text.map(|v| {
        v.parse::<u64>().map_err(|_| {
            ApiError::new(
                ErrorCode::InvalidRequest,
                format!("last_seq={v:?} must be a whole number"),
            )
        })
    })
    .transpose()
}

/// Attaches a consumer to session `id` (the caller checked
/// [`may_consume`]): after `last_seq`, or live; `takeover` replaces a live
/// attachment.
///
/// # Errors
/// The refusal, as [`attach_refused`] words it for the consumer.
pub(crate) async fn attach(
    app: &App,
    id: &str,
    last_seq: Option<u64>,
    takeover: bool,
) -> Result<Attachment, ApiError> {
    app.sessions
        .attach(&app.hub, id, last_seq, takeover, app.config.read_batch)
        .await
        .map_err(|e| attach_refused(&e))
}

/// The answer to a consumer whose attach is refused: its code
/// (`session_ended` with `status`, `session_attached`,
/// `session_not_retained`, `resume_disabled`, `journal_failed`, or
/// `session_not_found`) and a message that says what the consumer can do.
pub(crate) fn attach_refused(e: &SessionError) -> ApiError {
    let code = match e {
        SessionError::Ended { .. } => ErrorCode::SessionEnded,
        SessionError::Attached(_) => ErrorCode::SessionAttached,
        SessionError::NotRetained { .. } => ErrorCode::SessionNotRetained,
        SessionError::ResumeDisabled => ErrorCode::ResumeDisabled,
        SessionError::Journal(_) => ErrorCode::JournalFailed,
        _ => ErrorCode::SessionNotFound,
    };
    match e {
        // Not the producer's "takes no more events": what the consumer can do.
        SessionError::Ended { id, status } => ApiError::new(
            code,
            format!(
                "session {id:?} is {}: there is nothing live to attach to; attach with \
                 last_seq to receive the rest of its events and its end, or read its history",
                status.as_str()
            ),
        )
        .with("status", status.as_str()),
        _ => ApiError::new(code, e.to_string()),
    }
}

/// The message of a consumer taken over by a newer attachment.
pub(crate) const TAKEN_OVER: &str = "taken over by a newer connection";

/// The message of a consumer's socket that sent something: it only receives.
pub(crate) const CONSUMER_TAKES_NOTHING: &str =
    "a session consumer socket takes no messages; it only receives";

/// The refusal of a consumer that retention passed (a session never
/// replays in part): `session_not_retained`, after seq `after`.
pub(crate) fn not_retained(after: u64) -> ApiError {
    ApiError::new(
        ErrorCode::SessionNotRetained,
        format!("events after seq {after} are no longer retained; start over"),
    )
}

/// What a consumer is sent, one step at a time.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Step<'a> {
    /// `session.resumed`: `replayed` events were replayed (0 for a live
    /// attach) and delivery continues live after seq `head`.
    Resumed {
        /// Events replayed.
        replayed: u64,
        /// The seq after which delivery continues live.
        head: u64,
    },
    /// One of the session's events.
    Event(&'a Event),
    /// The session's end (`session.completed` or `session.cancelled`) at
    /// seq `seq`; nothing follows.
    Ended {
        /// How it ended.
        status: Status,
        /// The seq of its end marker.
        seq: u64,
    },
}

/// A consumer's replay: every attach is answered with one
/// `session.resumed`, a live one (no `last_seq`) at once with 0 replayed;
/// one with `last_seq` once the events up to the head seen at attach are
/// replayed. The opening marker is never sent; an end marker ends the
/// delivery.
#[derive(Debug)]
pub(crate) struct Replay {
    /// The head seen at attach.
    head: u64,
    /// Events replayed so far; `None` once `session.resumed` went out.
    replayed: Option<u64>,
}

impl Replay {
    /// The replay of `att`, and what to send at once: `session.resumed`
    /// when nothing is to be replayed, then the session's end when it
    /// ended (`last_seq` at its end marker: the consumer has every event;
    /// it is told how the session ended, as if it had read the marker).
    pub(crate) fn start(att: &Attachment) -> (Self, Vec<Step<'static>>) {
        let head = att.head;
        let mut replay = Replay {
            head,
            replayed: att.last_seq.map(|_| 0),
        };
        let mut now = Vec::new();
        if att.last_seq.is_none_or(|n| n >= head) {
            now.push(Step::Resumed { replayed: 0, head });
            replay.replayed = None;
            if att.status != Status::Open {
                now.push(Step::Ended {
                    status: att.status,
                    seq: head,
                });
            }
        }
        (replay, now)
    }

    /// `session.resumed` as it stands, while it is still owed.
    pub(crate) fn resumed(&self) -> Option<Step<'static>> {
        self.replayed.map(|replayed| Step::Resumed {
            replayed,
            head: self.head,
        })
    }

    /// Whether `session.resumed` is due before event `e` (it is past the
    /// head seen at attach); then it counts as sent.
    pub(crate) fn resumed_before(&mut self, e: &Event) -> Option<Step<'static>> {
        let due = self.resumed().filter(|_| e.seq > self.head);
        if due.is_some() {
            self.replayed = None;
        }
        due
    }

    /// What event `e` is for the consumer: the end, nothing (the opening
    /// marker), or an event (counted while replaying).
    pub(crate) fn event<'a>(&mut self, e: &'a Event) -> Option<Step<'a>> {
        if let Some(status) = Status::of_marker(e.event_type.as_deref()) {
            return Some(Step::Ended { status, seq: e.seq });
        }
        if e.event_type.as_deref() == Some(session::OPENED) {
            return None;
        }
        if let Some(n) = self.replayed.as_mut() {
            *n += 1;
        }
        Some(Step::Event(e))
    }

    /// Whether `session.resumed` is due after a batch whose last event is
    /// `last` (it reached the head seen at attach); then it counts as sent.
    pub(crate) fn resumed_after(&mut self, last: Option<&Event>) -> Option<Step<'static>> {
        let due = self
            .resumed()
            .filter(|_| last.is_some_and(|e| e.seq >= self.head));
        if due.is_some() {
            self.replayed = None;
        }
        due
    }
}

impl From<SessionError> for ApiError {
    fn from(e: SessionError) -> Self {
        let message = e.to_string();
        match e {
            SessionError::NotFound(_) => ApiError::new(ErrorCode::SessionNotFound, message),
            SessionError::Exists(_) => ApiError::new(ErrorCode::SessionExists, message),
            SessionError::Ended { status, .. } => {
                ApiError::new(ErrorCode::SessionEnded, message).with("status", status.as_str())
            }
            SessionError::Attached(_) => ApiError::new(ErrorCode::SessionAttached, message),
            SessionError::ResumeDisabled => ApiError::new(ErrorCode::ResumeDisabled, message),
            SessionError::NotRetained { .. } => {
                ApiError::new(ErrorCode::SessionNotRetained, message)
            }
            SessionError::Journal(j) => j.into(),
            _ => ApiError::new(ErrorCode::JournalFailed, message),
        }
    }
}

pub(crate) use gapless_protocol::answers::SessionStatus;

/// A session's status as the wire shows it.
pub(crate) fn status_json(s: Status) -> SessionStatus {
    match s {
        Status::Open => SessionStatus::Open,
        Status::Completed => SessionStatus::Completed,
        Status::Cancelled => SessionStatus::Cancelled,
    }
}
