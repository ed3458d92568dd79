//! The client's error type: what failed, whether retrying can help, and the
//! server's own answer when it refused a request.

use crate::types::Cursor;
use gapless_protocol::codes::{ErrorCode, GapReason};
use serde_json::{Map, Value};
use std::time::Duration;

/// Everything a client operation can fail with.
///
/// [`Error::is_terminal`] tells whether retrying the same request can succeed:
/// subscriptions and joins retry the others themselves (when reconnecting is on)
/// and return terminal errors at once.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No connection could be made (refused, unresolvable host, connect timeout).
    #[error("cannot reach {server} ({detail})")]
    Unreachable {
        /// The server's base URL.
        server: String,
        /// What the operating system said, e.g. `connection refused`.
        detail: String,
    },
    /// The connection failed after it was made: reset, closed in the middle of
    /// a response, a request timeout, or a stream silent past its idle timeout.
    #[error("lost the connection to {server} ({detail})")]
    Disconnected {
        /// The server's base URL.
        server: String,
        /// What went wrong.
        detail: String,
    },
    /// The server answered with an error status; see [`ApiError`] (boxed: it
    /// carries the answer's JSON fields).
    #[error(transparent)]
    Api(Box<ApiError>),
    /// The server's answer is not what the gapless API specifies (wrong content
    /// type, JSON of another shape): most likely the URL is not a gapless server.
    #[error("{server} answered something that is not the gapless API: {detail}")]
    Protocol {
        /// The server's base URL.
        server: String,
        /// What was unexpected.
        detail: String,
    },
    /// An SSE event exceeded the subscription's `max_event_bytes`.
    #[error("an event on the stream is larger than the client's limit of {limit} bytes (raise it with max_event_bytes)")]
    EventTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The base URL cannot be used.
    #[error("invalid server URL {url:?}: {detail}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// Why it was refused.
        detail: String,
    },
    /// An argument cannot be sent (e.g. a subscription with no channel).
    #[error("{0}")]
    InvalidArgument(String),
}

impl Error {
    /// True when retrying the same request cannot help: the server refused it
    /// (a 4xx status other than 408 and 429), answered outside the API, or the
    /// request itself is invalid. Connection failures and 5xx/429/408 answers
    /// are not terminal.
    pub fn is_terminal(&self) -> bool {
        match self {
            Error::Unreachable { .. } | Error::Disconnected { .. } => false,
            Error::Api(a) => a.is_terminal(),
            Error::Protocol { .. }
            | Error::EventTooLarge { .. }
            | Error::InvalidUrl { .. }
            | Error::InvalidArgument(_) => true,
        }
    }

    /// The server's answer, when the error is one.
    pub fn api(&self) -> Option<&ApiError> {
        match self {
            Error::Api(a) => Some(a.as_ref()),
            _ => None,
        }
    }

    pub(crate) fn protocol(server: &str, detail: impl Into<String>) -> Self {
        Error::Protocol {
            server: server.to_owned(),
            detail: detail.into(),
        }
    }

    pub(crate) fn idle(server: &str, after: Duration) -> Self {
        Error::Disconnected {
            server: server.to_owned(),
            detail: format!(
                "no data for {} s, not even a heartbeat (idle timeout)",
                after.as_secs_f64()
            ),
        }
    }

    /// Classifies a reqwest failure: before a connection exists it is
    /// [`Error::Unreachable`], afterwards [`Error::Disconnected`].
    pub(crate) fn from_reqwest(server: &str, e: &reqwest::Error) -> Self {
        let detail = describe(e);
        if e.is_connect() {
            Error::Unreachable {
                server: server.to_owned(),
                detail,
            }
        } else if e.is_builder() {
            Error::InvalidUrl {
                url: server.to_owned(),
                detail,
            }
        } else {
            Error::Disconnected {
                server: server.to_owned(),
                detail,
            }
        }
    }
}

/// A short, human description of an I/O error, the common ones named plainly.
pub(crate) fn describe_io(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => "connection refused".to_owned(),
        K::ConnectionReset => "connection reset".to_owned(),
        K::ConnectionAborted => "connection aborted".to_owned(),
        K::TimedOut => "timed out".to_owned(),
        K::UnexpectedEof => "closed in the middle of a response".to_owned(),
        K::BrokenPipe => "broken pipe".to_owned(),
        _ => e.to_string(),
    }
}

/// A short, human description of a reqwest error: the innermost cause, with
/// the common operating-system errors named plainly.
fn describe(e: &reqwest::Error) -> String {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut innermost = e.to_string();
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            let plain = match io.kind() {
                K::ConnectionRefused => Some("connection refused"),
                K::ConnectionReset => Some("connection reset"),
                K::ConnectionAborted => Some("connection aborted"),
                K::TimedOut => Some("timed out"),
                K::UnexpectedEof => Some("closed in the middle of a response"),
                K::BrokenPipe => Some("broken pipe"),
                _ => None,
            };
            if let Some(p) = plain {
                return p.to_owned();
            }
        }
        innermost = s.to_string();
        source = s.source();
    }
    if e.is_timeout() {
        return "timed out".to_owned();
    }
    innermost
}

/// The server refused a request: its status and JSON error body
/// `{"error": code, "message": text, …}` (shapes in `docs/api.md`).
///
/// Over WebSocket the same type carries an `error` message (`{"op":"error",
/// "code","message"}`) and the close code that followed it, if any
/// ([`ApiError::close_code`]): a session refusal such as 4404
/// `session_not_found` reads like the HTTP 404 of the same code.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status. For a WebSocket close with an application code
    /// (4000 to 4999), that code minus 4000: the server's close codes mirror
    /// HTTP statuses (4404 → 404, 4409 → 409, 4408 → 408), so
    /// [`ApiError::is_terminal`] reads them the same way.
    pub status: u16,
    /// The `error` code, e.g. `invalid_channel`; `http_<status>` when the body
    /// was not a gapless error.
    pub code: String,
    /// The `message`: what is wrong, for a person.
    pub message: String,
    /// Any other fields of the body (e.g. `reason`, `floor`, `floor_cursor`, `limit`).
    pub extra: Map<String, Value>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.close_code() {
            Some(c) => write!(f, "{} ({}, WebSocket close {c})", self.message, self.code),
            None => write!(f, "{} ({}, HTTP {})", self.message, self.code, self.status),
        }
    }
}

impl std::error::Error for ApiError {}

impl From<ApiError> for Error {
    fn from(e: ApiError) -> Self {
        Error::Api(Box::new(e))
    }
}

impl ApiError {
    /// Builds an error from a status and a response body (JSON or not).
    pub(crate) fn from_body(status: u16, body: &[u8]) -> Self {
        if let Ok(Value::Object(mut map)) = serde_json::from_slice::<Value>(body) {
            if let (Some(Value::String(code)), Some(Value::String(message))) =
                (map.remove("error"), map.remove("message"))
            {
                return ApiError {
                    status,
                    code,
                    message,
                    extra: map,
                };
            }
        }
        let text = String::from_utf8_lossy(&body[..body.len().min(200)])
            .trim()
            .to_owned();
        ApiError {
            status,
            code: format!("http_{status}"),
            message: if text.is_empty() {
                format!("HTTP status {status}")
            } else {
                text
            },
            extra: Map::new(),
        }
    }

    /// True for refusals that a retry cannot change: 4xx other than 408 and 429.
    pub fn is_terminal(&self) -> bool {
        (400..500).contains(&self.status) && self.status != 408 && self.status != 429
    }

    /// The code as a registry value, when it is one this client knows.
    pub fn error_code(&self) -> Option<ErrorCode> {
        use ErrorCode as C;
        Some(match self.code.as_str() {
            "invalid_channel" => C::InvalidChannel,
            "invalid_type" => C::InvalidType,
            "invalid_utf8" => C::InvalidUtf8,
            "invalid_cursor" => C::InvalidCursor,
            "invalid_request" => C::InvalidRequest,
            "not_found" => C::NotFound,
            "method_not_allowed" => C::MethodNotAllowed,
            "cursor_not_served" => C::CursorNotServed,
            "too_large" => C::TooLarge,
            "limit_reached" => C::LimitReached,
            "shutting_down" => C::ShuttingDown,
            "journal_failed" => C::JournalFailed,
            "invalid_message" => C::InvalidMessage,
            "not_subscribed" => C::NotSubscribed,
            "session_not_found" => C::SessionNotFound,
            "session_exists" => C::SessionExists,
            "session_ended" => C::SessionEnded,
            "session_attached" => C::SessionAttached,
            "session_not_retained" => C::SessionNotRetained,
            "resume_disabled" => C::ResumeDisabled,
            "unauthorized" => C::Unauthorized,
            "forbidden" => C::Forbidden,
            "rate_limited" => C::RateLimited,
            "request_timeout" => C::RequestTimeout,
            "head_too_large" => C::HeadTooLarge,
            "journal_full" => C::JournalFull,
            "presence_disabled" => C::PresenceDisabled,
            _ => return None,
        })
    }

    /// The WebSocket close code that came with the refusal (e.g. 4404 for a
    /// session that does not exist); `None` for an HTTP answer or a WebSocket
    /// `error` reply that left the socket open.
    pub fn close_code(&self) -> Option<u16> {
        self.extra
            .get("close_code")
            .and_then(Value::as_u64)
            .and_then(|c| u16::try_from(c).ok())
    }

    /// A refusal received over WebSocket: an `error` message (`code`,
    /// `message`), a close frame, or both. `status` is the close code minus
    /// 4000 for an application close code (the server's 4xxx codes mirror
    /// HTTP statuses: 4404 → 404, 4408 → 408), otherwise the status the API
    /// gives `code`.
    pub(crate) fn from_ws(code: String, message: String, close_code: Option<u16>) -> Self {
        let mut extra = Map::new();
        let status = match close_code {
            Some(c) if (4000..5000).contains(&c) => c - 4000,
            _ => {
                let probe = ApiError {
                    status: 0,
                    code: code.clone(),
                    message: String::new(),
                    extra: Map::new(),
                };
                probe.error_code().map_or(400, ErrorCode::status)
            }
        };
        if let Some(c) = close_code {
            extra.insert("close_code".to_owned(), Value::from(c));
        }
        ApiError {
            status,
            code,
            message,
            extra,
        }
    }

    /// For `410 cursor_not_served`: why the cursor cannot be served.
    pub fn gap_reason(&self) -> Option<GapReason> {
        self.extra
            .get("reason")
            .and_then(Value::as_str)
            .map(crate::types::parse_reason)
    }

    /// For `410 cursor_not_served`: the cursor that reads everything retained.
    pub fn floor_cursor(&self) -> Option<Cursor> {
        self.extra
            .get("floor_cursor")
            .and_then(Value::as_str)
            .map(|s| Cursor::from(s.to_owned()))
    }
}
