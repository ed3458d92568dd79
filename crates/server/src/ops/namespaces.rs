//! The rules of a channel's namespace, once for every transport: the
//! largest event it takes (`max_event_bytes`), whether it takes ephemeral
//! events (`ephemeral`), and the retention its channel info shows. The
//! namespace of a channel and its effective settings come from
//! [`gapless_core::namespace::Namespaces`], resolved once at start and kept
//! in [`crate::ServerConfig::namespaces`]; the other namespace rules live
//! beside the rules they change: where a subscription starts (`latest`,
//! [`crate::ops::start::or_latest`]) and who may read (`public`,
//! [`crate::auth::Grant`]).

use crate::error::ApiError;
use crate::App;
use gapless_core::namespace::{namespace_of, Policy};
use gapless_protocol::answers::RetentionLimits;
use gapless_protocol::codes::ErrorCode;

/// The effective settings of `channel`'s namespace.
pub(crate) fn policy<'a>(app: &'a App, channel: &str) -> &'a Policy {
    app.config.namespaces.policy(channel)
}

/// How a refusal names the setting `key` that holds for `channel`: the key
/// of its namespace's table when the table sets it, else the server's `flag`.
fn setting(app: &App, channel: &str, key: &str, flag: &str) -> String {
    if app.config.namespaces.table_sets(channel, key) {
        format!("{key} of [namespaces.{}]", namespace_of(channel))
    } else {
        flag.to_owned()
    }
}

/// The largest event data, in bytes, a publish to `channel` takes: its
/// namespace's `max_event_bytes` (the server's `--max-event-bytes` unless
/// the namespace's table sets it).
pub(crate) fn max_event_bytes(app: &App, channel: &str) -> usize {
    policy(app, channel).max_event_bytes
}

/// The setting that holds [`max_event_bytes`] for `channel`, for a refusal:
/// `max_event_bytes of [namespaces.NAME]` or `--max-event-bytes`.
pub(crate) fn max_event_bytes_setting(app: &App, channel: &str) -> String {
    setting(app, channel, "max_event_bytes", "--max-event-bytes")
}

/// Checks the data length `len` of an event for `channel` (`item`: its
/// index in a batch) against [`max_event_bytes`].
///
/// # Errors
/// 413 `too_large` with `limit`, naming the setting that holds it.
pub(crate) fn check_data(
    app: &App,
    channel: &str,
    len: usize,
    item: Option<usize>,
) -> Result<(), ApiError> {
    let max = max_event_bytes(app, channel);
    if len <= max {
        return Ok(());
    }
    let what = match item {
        Some(i) => format!("event {i} of the batch has {len} bytes of data"),
        None => format!("event data is {len} bytes"),
    };
    Err(ApiError::new(
        ErrorCode::TooLarge,
        format!(
            "{what}; at most {max} bytes are allowed ({})",
            max_event_bytes_setting(app, channel)
        ),
    )
    .with("limit", max))
}

/// Checks that `channel`'s namespace takes ephemeral events.
///
/// # Errors
/// 403 `forbidden` naming the namespace and the setting.
pub(crate) fn check_ephemeral(app: &App, channel: &str) -> Result<(), ApiError> {
    if policy(app, channel).ephemeral {
        return Ok(());
    }
    let ns = namespace_of(channel);
    Err(ApiError::new(
        ErrorCode::Forbidden,
        format!(
            "namespace {ns:?} takes no ephemeral events (ephemeral = false in \
             [namespaces.{ns}]); publish without ephemeral to journal the event"
        ),
    )
    .with("namespace", ns))
}

/// `channel`'s namespace and the retention that applies to it, as the
/// channel info answers them (`GET /v1/channels/{channel}`).
pub(crate) fn retention<'a>(app: &App, channel: &'a str) -> (&'a str, RetentionLimits) {
    let r = policy(app, channel).retention;
    (
        namespace_of(channel),
        RetentionLimits {
            events: r.max_events,
            ms: r.max_age_ms,
            bytes: r.max_bytes,
        },
    )
}
