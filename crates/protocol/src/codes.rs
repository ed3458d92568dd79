//! Every code that appears on the wire, in one registry.
//!
//! HTTP errors are JSON `{"error": <code>, "message": <text>}`; the table maps
//! each code to its status. Gap reasons appear in `gap` notices. The codes of
//! the Durable Streams room (`stream_not_found`, `offset_gone`, …) are here
//! too, with the statuses PROTOCOL.md names (docs/durable-streams.md, "Errors").

/// An HTTP error code with its status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorCode {
    /// 400: a channel name breaks the name rules.
    InvalidChannel,
    /// 400: an event type breaks the type rules or is reserved.
    InvalidType,
    /// 400: the body is not valid UTF-8. The Durable Streams room answers it
    /// 415 (a non-UTF-8 body on a text stream, PROTOCOL.md): the one code
    /// answered with another status than [`ErrorCode::status`] besides
    /// [`ErrorCode::StreamDeleted`] when forking.
    InvalidUtf8,
    /// 400: a cursor fails its check.
    InvalidCursor,
    /// 400: a query parameter or body field is missing or malformed.
    InvalidRequest,
    /// 404: no such route.
    NotFound,
    /// 405: the route exists but not with this method.
    MethodNotAllowed,
    /// 410: the journal cannot serve the cursor (see the reason).
    CursorNotServed,
    /// 413: an event or request is larger than its limit.
    TooLarge,
    /// 429/503: a connection or subscriber limit is reached.
    LimitReached,
    /// 503: the server is shutting down.
    ShuttingDown,
    /// 500: the journal failed (disk error); nothing was acknowledged.
    JournalFailed,
    /// 503: the journal's store (Redis, in cluster mode) is unreachable or did
    /// not answer in time; a publish may still have been applied, so retry it
    /// with the same `Idempotency-Key`.
    Unavailable,
    /// 400 / WebSocket error reply: a WebSocket message is not valid JSON of a known shape.
    InvalidMessage,
    /// WebSocket error reply: unsubscribe from a channel that is not subscribed.
    NotSubscribed,
    /// 404 / close 4404: no such session, or it has expired.
    SessionNotFound,
    /// 409: a session with this id already exists.
    SessionExists,
    /// 409 / close 4404: the session is completed or cancelled; it takes no
    /// more events, and a consumer attaching without `last_seq` has nothing
    /// live to attach to (its `error` message has this code and `status`).
    SessionEnded,
    /// Close 4409: the session is attached to another live connection.
    SessionAttached,
    /// Close 4410: the events after `last_seq` are not all retained, or `last_seq`
    /// is beyond the newest event.
    SessionNotRetained,
    /// Close 4400: resuming sessions is turned off on this server.
    ResumeDisabled,
    /// 401 / close 4401: no token, or a token that fails verification (bad
    /// signature, expired, not yet valid, wrong audience or issuer, malformed
    /// `gapless` claim). `docs/security.md`.
    Unauthorized,
    /// 403 / close 4403: a valid token that does not allow this operation on
    /// this channel or session. The same answer whether or not the channel exists.
    Forbidden,
    /// 429: the publisher's rate limit (`--publish-rate`) is used up; retry
    /// after the `Retry-After` seconds.
    RateLimited,
    /// 408: a request body arrived slower than `--min-body-rate` allows.
    RequestTimeout,
    /// 431: a request head is over `--max-header-bytes` or 100 header lines.
    HeadTooLarge,
    /// 507: the journal's disk is full or below `--min-free-disk-bytes`;
    /// nothing was stored. Publishing resumes once space is freed.
    JournalFull,
    /// 404 / WebSocket error reply: presence asked of a channel whose
    /// namespace has no `presence = true`.
    PresenceDisabled,
    /// 409: the channel is closed (a Durable Streams close,
    /// `gapless_core::meta`): it takes no more events from any transport.
    ChannelClosed,
    /// 400: Durable Streams: a stream path breaks the path rules (docs/durable-streams.md, "Stream paths and channels").
    InvalidStreamPath,
    /// 404: Durable Streams: no stream at the path, or it was deleted (also the answer of a long-poll waiting on a stream that is then deleted).
    StreamNotFound,
    /// 409: Durable Streams: a `PUT` of a stream that exists with other settings (or a soft-deleted one's path).
    StreamExists,
    /// 409: Durable Streams: an append to a closed stream (with `Stream-Closed: true` and the final `Stream-Next-Offset`).
    StreamClosed,
    /// 409: Durable Streams: the request's content type is not the stream's.
    ContentTypeMismatch,
    /// 400: Durable Streams: an append with a body but no `Content-Type`.
    MissingContentType,
    /// 400: Durable Streams: an append with an empty body (and no `Stream-Closed`).
    EmptyBody,
    /// 400: Durable Streams: a JSON-mode append of `[]`.
    EmptyJsonArray,
    /// 400: Durable Streams: a JSON-mode body that is not one JSON value, or nests deeper than the limit (`gapless_protocol::json::MAX_DEPTH`).
    InvalidJson,
    /// 400: Durable Streams: a malformed `Stream-TTL`, or both it and `Stream-Expires-At`.
    InvalidTtl,
    /// 400: Durable Streams: a `Stream-Expires-At` that is not an RFC 3339 timestamp (`gapless_protocol::time`).
    InvalidExpiresAt,
    /// 400: Durable Streams: an offset that is malformed, empty, missing on a live read, or beyond the tail.
    InvalidOffset,
    /// 400: Durable Streams: a `live=` other than `long-poll` or `sse`.
    InvalidLive,
    /// 400: Durable Streams: producer headers that are incomplete or malformed, or a new epoch not starting at seq 0.
    InvalidProducer,
    /// 400: Durable Streams: a malformed fork request (`Stream-Forked-From`, `Stream-Fork-Offset`, `Stream-Fork-Sub-Offset`).
    InvalidFork,
    /// 403: Durable Streams: a producer epoch below the stream's (with `Producer-Epoch`).
    StaleProducerEpoch,
    /// 409: Durable Streams: a producer seq past the next expected (with `Producer-Expected-Seq`, `Producer-Received-Seq`).
    ProducerSeqGap,
    /// 409: Durable Streams: a `Stream-Seq` not byte-wise above the last accepted one.
    StreamSeqRegression,
    /// 410: Durable Streams: the URL of a soft-deleted stream (kept for its forks); 409 when forking one (PROTOCOL.md 4.2).
    StreamDeleted,
    /// 410: Durable Streams: the data after the offset is no longer retained, or the offset is of another journal epoch or a deleted predecessor; read again from `-1`.
    OffsetGone,
    /// 422: an `Idempotency-Key` (WebSocket `idempotency_key`) reused on a
    /// channel with events that differ from the first publish's (another
    /// body, type or count) while those are retained; nothing was appended
    /// (docs/api.md, "Publish").
    IdempotencyKeyReused,
}

impl ErrorCode {
    /// Every code, in the order of the registry (the OpenAPI document's
    /// `ErrorCode` enum is built from this list; `all_is_complete` below
    /// fails to compile when a variant is missing from its match).
    pub const ALL: &'static [ErrorCode] = &[
        ErrorCode::InvalidChannel,
        ErrorCode::InvalidType,
        ErrorCode::InvalidUtf8,
        ErrorCode::InvalidCursor,
        ErrorCode::InvalidRequest,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::CursorNotServed,
        ErrorCode::TooLarge,
        ErrorCode::LimitReached,
        ErrorCode::ShuttingDown,
        ErrorCode::JournalFailed,
        ErrorCode::Unavailable,
        ErrorCode::InvalidMessage,
        ErrorCode::NotSubscribed,
        ErrorCode::SessionNotFound,
        ErrorCode::SessionExists,
        ErrorCode::SessionEnded,
        ErrorCode::SessionAttached,
        ErrorCode::SessionNotRetained,
        ErrorCode::ResumeDisabled,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::RateLimited,
        ErrorCode::RequestTimeout,
        ErrorCode::HeadTooLarge,
        ErrorCode::JournalFull,
        ErrorCode::PresenceDisabled,
        ErrorCode::ChannelClosed,
        ErrorCode::InvalidStreamPath,
        ErrorCode::StreamNotFound,
        ErrorCode::StreamExists,
        ErrorCode::StreamClosed,
        ErrorCode::ContentTypeMismatch,
        ErrorCode::MissingContentType,
        ErrorCode::EmptyBody,
        ErrorCode::EmptyJsonArray,
        ErrorCode::InvalidJson,
        ErrorCode::InvalidTtl,
        ErrorCode::InvalidExpiresAt,
        ErrorCode::InvalidOffset,
        ErrorCode::InvalidLive,
        ErrorCode::InvalidProducer,
        ErrorCode::InvalidFork,
        ErrorCode::StaleProducerEpoch,
        ErrorCode::ProducerSeqGap,
        ErrorCode::StreamSeqRegression,
        ErrorCode::StreamDeleted,
        ErrorCode::OffsetGone,
        ErrorCode::IdempotencyKeyReused,
    ];

    /// The string used in the `error` field.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidChannel => "invalid_channel",
            ErrorCode::InvalidType => "invalid_type",
            ErrorCode::InvalidUtf8 => "invalid_utf8",
            ErrorCode::InvalidCursor => "invalid_cursor",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::CursorNotServed => "cursor_not_served",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::LimitReached => "limit_reached",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::JournalFailed => "journal_failed",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::InvalidMessage => "invalid_message",
            ErrorCode::NotSubscribed => "not_subscribed",
            ErrorCode::SessionNotFound => "session_not_found",
            ErrorCode::SessionExists => "session_exists",
            ErrorCode::SessionEnded => "session_ended",
            ErrorCode::SessionAttached => "session_attached",
            ErrorCode::SessionNotRetained => "session_not_retained",
            ErrorCode::ResumeDisabled => "resume_disabled",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::HeadTooLarge => "head_too_large",
            ErrorCode::JournalFull => "journal_full",
            ErrorCode::PresenceDisabled => "presence_disabled",
            ErrorCode::ChannelClosed => "channel_closed",
            ErrorCode::InvalidStreamPath => "invalid_stream_path",
            ErrorCode::StreamNotFound => "stream_not_found",
            ErrorCode::StreamExists => "stream_exists",
            ErrorCode::StreamClosed => "stream_closed",
            ErrorCode::ContentTypeMismatch => "content_type_mismatch",
            ErrorCode::MissingContentType => "missing_content_type",
            ErrorCode::EmptyBody => "empty_body",
            ErrorCode::EmptyJsonArray => "empty_json_array",
            ErrorCode::InvalidJson => "invalid_json",
            ErrorCode::InvalidTtl => "invalid_ttl",
            ErrorCode::InvalidExpiresAt => "invalid_expires_at",
            ErrorCode::InvalidOffset => "invalid_offset",
            ErrorCode::InvalidLive => "invalid_live",
            ErrorCode::InvalidProducer => "invalid_producer",
            ErrorCode::InvalidFork => "invalid_fork",
            ErrorCode::StaleProducerEpoch => "stale_producer_epoch",
            ErrorCode::ProducerSeqGap => "producer_seq_gap",
            ErrorCode::StreamSeqRegression => "stream_seq_regression",
            ErrorCode::StreamDeleted => "stream_deleted",
            ErrorCode::OffsetGone => "offset_gone",
            ErrorCode::IdempotencyKeyReused => "idempotency_key_reused",
        }
    }

    /// The HTTP status for this code.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::InvalidChannel
            | ErrorCode::InvalidType
            | ErrorCode::InvalidUtf8
            | ErrorCode::InvalidCursor
            | ErrorCode::InvalidRequest
            | ErrorCode::InvalidMessage
            | ErrorCode::NotSubscribed
            | ErrorCode::ResumeDisabled => 400,
            ErrorCode::NotFound | ErrorCode::SessionNotFound | ErrorCode::PresenceDisabled => 404,
            ErrorCode::SessionExists
            | ErrorCode::SessionEnded
            | ErrorCode::SessionAttached
            | ErrorCode::ChannelClosed => 409,
            ErrorCode::SessionNotRetained => 410,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::CursorNotServed => 410,
            ErrorCode::TooLarge => 413,
            ErrorCode::LimitReached | ErrorCode::ShuttingDown | ErrorCode::Unavailable => 503,
            ErrorCode::JournalFailed => 500,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::RateLimited => 429,
            ErrorCode::RequestTimeout => 408,
            ErrorCode::HeadTooLarge => 431,
            ErrorCode::JournalFull => 507,
            ErrorCode::InvalidStreamPath
            | ErrorCode::MissingContentType
            | ErrorCode::EmptyBody
            | ErrorCode::EmptyJsonArray
            | ErrorCode::InvalidJson
            | ErrorCode::InvalidTtl
            | ErrorCode::InvalidExpiresAt
            | ErrorCode::InvalidOffset
            | ErrorCode::InvalidLive
            | ErrorCode::InvalidProducer
            | ErrorCode::InvalidFork => 400,
            ErrorCode::StaleProducerEpoch => 403,
            ErrorCode::StreamNotFound => 404,
            ErrorCode::StreamExists
            | ErrorCode::StreamClosed
            | ErrorCode::ContentTypeMismatch
            | ErrorCode::ProducerSeqGap
            | ErrorCode::StreamSeqRegression => 409,
            ErrorCode::StreamDeleted | ErrorCode::OffsetGone => 410,
            ErrorCode::IdempotencyKeyReused => 422,
        }
    }
}

/// Why a range of a channel was not delivered. Appears as `reason` in gap notices
/// and in 410 answers of the history API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GapReason {
    /// The position is below the journal's floor: retention removed events after it.
    /// The hole is every event after `after` up to and including `next`.
    Evicted,
    /// The position belongs to another incarnation of the journal (e.g. a
    /// `--memory` server restarted). The hole is as for `Evicted`.
    Epoch,
    /// The position is beyond the head (e.g. a cursor from after a restored backup).
    /// The client must re-anchor.
    Ahead,
    /// The client's position could not be read (a Last-Event-ID that is not a
    /// cursor of this server). The client must re-anchor.
    Unknown,
}

impl GapReason {
    /// Every reason.
    pub const ALL: &'static [GapReason] = &[
        GapReason::Evicted,
        GapReason::Epoch,
        GapReason::Ahead,
        GapReason::Unknown,
    ];

    /// The string used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            GapReason::Evicted => "evicted",
            GapReason::Epoch => "epoch",
            GapReason::Ahead => "ahead",
            GapReason::Unknown => "unknown",
        }
    }
}

/// WebSocket close codes (RFC 6455 section 7.4; application codes in 4000-4999).
pub mod close {
    /// Normal closure: a session completed or was cancelled and everything was delivered.
    pub const NORMAL: u16 = 1000;
    /// The server is shutting down; reconnect (elsewhere) and resume.
    pub const GOING_AWAY: u16 = 1001;
    /// The client broke the WebSocket protocol (bad frame, bad opcode, unmasked frame…).
    pub const PROTOCOL_ERROR: u16 = 1002;
    /// A text message was not valid UTF-8.
    pub const INVALID_DATA: u16 = 1007;
    /// A message was larger than the limit (`--ws-max-message-bytes`).
    pub const TOO_BIG: u16 = 1009;
    /// Resuming sessions is turned off on this server (`--session-resume false`).
    pub const RESUME_DISABLED: u16 = 4400;
    /// The token is missing or fails verification at connect, or it expired
    /// while the socket was open (reason `token expired`): connect again with
    /// a fresh token (and, on `/v1/ws`, the cursors held).
    pub const UNAUTHORIZED: u16 = 4401;
    /// The token does not allow attaching to this session.
    pub const FORBIDDEN: u16 = 4403;
    /// No session to attach to: unknown or expired (`error` message
    /// `session_not_found`), or completed or cancelled and attached without
    /// `last_seq`, so nothing live is left (`session_ended`, with `status`:
    /// attach with `last_seq` for the rest of its events and its end, or read
    /// its history). The design gapless follows gives one code to "unknown,
    /// completed or cancelled session"; the `error` message tells them apart.
    ///
    /// 4412, which earlier gapless versions sent for the second case, is
    /// retired: no gapless server sends it any more, and the SDKs read the `error`
    /// message's code, not the close code, to tell the cases apart.
    pub const SESSION_NOT_FOUND: u16 = 4404;
    /// No answer to a ping within the heartbeat interval.
    pub const HEARTBEAT_TIMEOUT: u16 = 4408;
    /// The session is attached to another live connection, or this attachment
    /// was taken over by a newer one.
    pub const SESSION_ATTACHED: u16 = 4409;
    /// The events after `last_seq` are not all retained, or `last_seq` is beyond
    /// the newest event: start over (never a partial replay).
    pub const SESSION_NOT_RETAINED: u16 = 4410;
    /// The client kept sending malformed messages.
    pub const TOO_MANY_ERRORS: u16 = 4422;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_complete() {
        // Exhaustive: a new code does not compile until it has an arm here at
        // the next position; COUNT (one past the last position) must then
        // grow, and the checks below need the code in `ALL` at that position.
        fn position(c: ErrorCode) -> usize {
            match c {
                ErrorCode::InvalidChannel => 0,
                ErrorCode::InvalidType => 1,
                ErrorCode::InvalidUtf8 => 2,
                ErrorCode::InvalidCursor => 3,
                ErrorCode::InvalidRequest => 4,
                ErrorCode::NotFound => 5,
                ErrorCode::MethodNotAllowed => 6,
                ErrorCode::CursorNotServed => 7,
                ErrorCode::TooLarge => 8,
                ErrorCode::LimitReached => 9,
                ErrorCode::ShuttingDown => 10,
                ErrorCode::JournalFailed => 11,
                ErrorCode::Unavailable => 12,
                ErrorCode::InvalidMessage => 13,
                ErrorCode::NotSubscribed => 14,
                ErrorCode::SessionNotFound => 15,
                ErrorCode::SessionExists => 16,
                ErrorCode::SessionEnded => 17,
                ErrorCode::SessionAttached => 18,
                ErrorCode::SessionNotRetained => 19,
                ErrorCode::ResumeDisabled => 20,
                ErrorCode::Unauthorized => 21,
                ErrorCode::Forbidden => 22,
                ErrorCode::RateLimited => 23,
                ErrorCode::RequestTimeout => 24,
                ErrorCode::HeadTooLarge => 25,
                ErrorCode::JournalFull => 26,
                ErrorCode::PresenceDisabled => 27,
                ErrorCode::ChannelClosed => 28,
                ErrorCode::InvalidStreamPath => 29,
                ErrorCode::StreamNotFound => 30,
                ErrorCode::StreamExists => 31,
                ErrorCode::StreamClosed => 32,
                ErrorCode::ContentTypeMismatch => 33,
                ErrorCode::MissingContentType => 34,
                ErrorCode::EmptyBody => 35,
                ErrorCode::EmptyJsonArray => 36,
                ErrorCode::InvalidJson => 37,
                ErrorCode::InvalidTtl => 38,
                ErrorCode::InvalidExpiresAt => 39,
                ErrorCode::InvalidOffset => 40,
                ErrorCode::InvalidLive => 41,
                ErrorCode::InvalidProducer => 42,
                ErrorCode::InvalidFork => 43,
                ErrorCode::StaleProducerEpoch => 44,
                ErrorCode::ProducerSeqGap => 45,
                ErrorCode::StreamSeqRegression => 46,
                ErrorCode::StreamDeleted => 47,
                ErrorCode::OffsetGone => 48,
                ErrorCode::IdempotencyKeyReused => 49,
            }
        }
        const COUNT: usize = 50;
        assert_eq!(ErrorCode::ALL.len(), COUNT);
        for (i, c) in ErrorCode::ALL.iter().enumerate() {
            assert_eq!(position(*c), i, "{c:?}");
        }
        assert_eq!(GapReason::ALL.len(), 4);
    }

    #[test]
    fn durable_streams_codes_keep_their_wire_strings_and_statuses() {
        // What the Durable Streams clients and conformance suite see.
        let want = [
            ("invalid_stream_path", 400),
            ("stream_not_found", 404),
            ("stream_exists", 409),
            ("stream_closed", 409),
            ("content_type_mismatch", 409),
            ("missing_content_type", 400),
            ("empty_body", 400),
            ("empty_json_array", 400),
            ("invalid_json", 400),
            ("invalid_ttl", 400),
            ("invalid_expires_at", 400),
            ("invalid_offset", 400),
            ("invalid_live", 400),
            ("invalid_producer", 400),
            ("invalid_fork", 400),
            ("stale_producer_epoch", 403),
            ("producer_seq_gap", 409),
            ("stream_seq_regression", 409),
            ("stream_deleted", 410),
            ("offset_gone", 410),
            ("idempotency_key_reused", 422),
        ];
        for (code, status) in want {
            let c = ErrorCode::ALL.iter().find(|c| c.as_str() == code);
            assert_eq!(c.map(|c| c.status()), Some(status), "{code}");
        }
    }
}
