//! Reading: `GET /v1/channels/{channel}/events` (one history page) and
//! `GET /v1/channels/{channel}` (the channel's bounds).

use crate::admin::openapi::shared::{
    JournalUnreadable, ServerErrors, SubscribeForbidden, Unauthorized,
};
use crate::auth::{Access, Action};
use crate::error::ApiError;
use crate::error::ErrorBody;
use crate::ops::names;
use crate::transport::query::Query;
use crate::App;
use axum::extract::{Path, RawQuery, State};
use axum::Json;
use gapless_core::ChannelState;
use gapless_protocol::answers::PageEvents;
pub use gapless_protocol::answers::{ChannelInfo, HistoryPage};
use gapless_protocol::codes::{ErrorCode, GapReason};
use gapless_protocol::schema::ChannelName;
use gapless_protocol::{Cursor, CursorError};
use std::sync::Arc;

/// Default page size.
pub const DEFAULT_LIMIT: usize = 100;
/// Largest page size.
pub const MAX_LIMIT: usize = 1000;
/// A page stops early (with `done: false`) once its events hold this many
/// bytes of data, so one request cannot make the server build a huge answer.
/// A page always holds at least one event.
pub const PAGE_DATA_BYTES: usize = 4 << 20;

/// `GET /v1/channels/{channel}/events?after=CURSOR&limit=N`.
#[utoipa::path(
    get,
    path = "/v1/channels/{channel}/events",
    operation_id = "history",
    summary = "One page of a channel's history",
    tag = "read",
    params(
        ("channel" = ChannelName, Path, description = "The channel to read."),
        ("after" = Option<Cursor>, Query, description = "Read the events after this cursor; from the floor (the oldest retained event) when absent or empty."),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "Most events in the page; default 100."),
    ),
    responses(
        (status = 200, description = "One page of history.", body = HistoryPage),
        (status = 400, description = "`invalid_channel`, `invalid_cursor` (`after` fails its check or names no position on this channel), or `invalid_request` (a bad `limit`).", body = ErrorBody),
        Unauthorized,
        SubscribeForbidden,
        (status = 410, description = "`cursor_not_served`: the journal cannot serve `after` (`reason`: `evicted`, `epoch`, `ahead` or `unknown`); `floor` and `floor_cursor` say where reading can restart.", body = ErrorBody),
        JournalUnreadable,
        (status = 503, description = "`unavailable` (cluster mode: Redis unreachable) or `shutting_down`.", body = ErrorBody),
    ),
)]
pub async fn history(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    Path(channel): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<HistoryPage>, ApiError> {
    names::channel(&channel)?;
    grant.require(Action::Subscribe, &channel)?;
    page(
        &app,
        &channel,
        &channel,
        &Query::parse(raw.as_deref()),
        false,
    )
    .await
}

/// One history page of journal channel `channel`; `name` is what the answer
/// calls it (a channel name, or a session id). `by_seq`: `after_seq=N` is
/// accepted instead of a cursor (sessions, whose consumers hold a `last_seq`).
pub(crate) async fn page(
    app: &App,
    channel: &str,
    name: &str,
    q: &Query,
    by_seq: bool,
) -> Result<Json<HistoryPage>, ApiError> {
    let (limit, after) = page_params(channel, q)?;
    let after_seq = match q.get("after_seq") {
        Some(_) if !by_seq => {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                "after_seq is for session history; a channel's history takes after=CURSOR",
            ))
        }
        Some(_) if q.get("after").is_some() => {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                "give after=CURSOR or after_seq=N, not both",
            ))
        }
        Some(v) => Some(v.parse::<u64>().map_err(|_| {
            ApiError::new(
                ErrorCode::InvalidRequest,
                format!("after_seq={v:?} must be a whole number (a session's last_seq)"),
            )
        })?),
        None => None,
    };
    let mut after = after;
    let from = after.map_or(after_seq.unwrap_or(0), |p| p.1);
    let page = app.hub.read(channel, from, limit, PAGE_DATA_BYTES).await?;
    let st = page.state;
    if let Some(n) = after_seq {
        // A seq has no epoch of its own: it is read in the journal's current one.
        after = Some((Some(st.epoch), n));
    }
    if let Some(after) = after {
        let reason = match after {
            (None, _) => Some(GapReason::Unknown),
            (Some(epoch), _) if epoch != st.epoch => Some(GapReason::Epoch),
            (_, seq) if seq > st.head => Some(GapReason::Ahead),
            (_, seq) if seq + 1 < st.floor => Some(GapReason::Evicted),
            _ => None,
        };
        if let Some(reason) = reason {
            let floor_cursor = Cursor::single(channel, st.epoch, st.floor - 1).encode();
            return Err(ApiError::new(
                ErrorCode::CursorNotServed,
                format!(
                    "the journal cannot serve this cursor ({}): read again from floor_cursor",
                    reason_text(reason)
                ),
            )
            .with("reason", reason.as_str())
            .with("floor", st.floor)
            .with("floor_cursor", floor_cursor));
        }
    }
    let events = page.events;
    let done = events.last().is_none_or(|e| e.seq >= st.head);
    let next = match events.last() {
        Some(e) if !done => e.cursor().to_owned(),
        _ => Cursor::single(channel, st.epoch, st.head).encode(),
    };
    Ok(Json(HistoryPage {
        channel: name.to_owned(),
        epoch: st.epoch,
        floor: st.floor,
        head: st.head,
        events: PageEvents::Journal(events),
        next,
        done,
    }))
}

/// The query of a history page for journal channel `channel`: `limit`
/// (default [`DEFAULT_LIMIT`], 1 to [`MAX_LIMIT`]) and `after` decoded as
/// `(Some(epoch), seq)`, or `(None, 0)` for a well-formed cursor of another
/// format version; `None` without `after` (or with an empty one). Public so
/// the fuzz targets (`fuzz/`) can drive it; the handler calls it first.
///
/// # Errors
/// 400 `invalid_request` for a bad `limit`; 400 `invalid_cursor` for an
/// `after` that is not a cursor or names no position on `channel`.
#[allow(clippy::type_complexity)]
pub fn page_params(
    channel: &str,
    q: &Query,
) -> Result<(usize, Option<(Option<gapless_protocol::Epoch>, u64)>), ApiError> {
    let limit = match q.get("limit") {
        None => DEFAULT_LIMIT,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
            _ => {
                return Err(ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!("limit={v:?} must be a whole number from 1 to {MAX_LIMIT}"),
                ))
            }
        },
    };
    let after = match q.get("after").filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => Some(channel_position(channel, s)?),
    };
    Ok((limit, after))
}

fn reason_text(r: GapReason) -> &'static str {
    match r {
        GapReason::Evicted => "events after it are no longer retained",
        GapReason::Epoch => "it belongs to another incarnation of the journal",
        GapReason::Ahead => "it is beyond the channel's head",
        _ => "it was issued by another version of gapless",
    }
}

/// Decodes `after` for `channel`: `(Some(epoch), seq)`, or `(None, 0)` for a
/// well-formed cursor of another format version.
fn channel_position(
    channel: &str,
    s: &str,
) -> Result<(Option<gapless_protocol::Epoch>, u64), ApiError> {
    match Cursor::decode(s.as_bytes()) {
        Ok(c) => match c.get(channel) {
            Some(p) => Ok((Some(p.epoch), p.seq)),
            None => Err(ApiError::new(
                ErrorCode::InvalidCursor,
                "the cursor does not name a position on this channel",
            )),
        },
        Err(CursorError::Version(_)) => Ok((None, 0)),
        Err(e) => Err(ApiError::new(
            ErrorCode::InvalidCursor,
            format!("after: {e}"),
        )),
    }
}

/// `GET /v1/channels/{channel}`: `{"channel","epoch","floor","head","subscribers"}`.
#[utoipa::path(
    get,
    path = "/v1/channels/{channel}",
    operation_id = "channel_info",
    summary = "A channel's bounds and subscribers",
    tag = "read",
    params(("channel" = ChannelName, Path, description = "The channel.")),
    responses(
        (status = 200, description = "The channel's bounds. A channel never published to answers `floor: 1, head: 0`.", body = ChannelInfo),
        (status = 400, description = "`invalid_channel`.", body = ErrorBody),
        SubscribeForbidden,
        ServerErrors,
    ),
)]
pub async fn channel_info(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    Path(channel): Path<String>,
) -> Result<Json<ChannelInfo>, ApiError> {
    names::channel(&channel)?;
    grant.require(Action::Subscribe, &channel)?;
    let st: ChannelState = app.hub.state(&channel).await?;
    let subscribers = app.hub.subscribers(&channel);
    Ok(Json(ChannelInfo {
        channel,
        epoch: st.epoch,
        floor: st.floor,
        head: st.head,
        subscribers,
    }))
}
