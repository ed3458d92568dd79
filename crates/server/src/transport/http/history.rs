//! Reading over HTTP: `GET /v1/channels/{channel}/events` (one history
//! page) and `GET /v1/channels/{channel}` (the channel's bounds). The rules
//! of a page (size, start, bounds, refusals) are `ops::history`'s; this
//! reads the query and writes the JSON.

use crate::admin::openapi::shared::{
    JournalUnreadable, ServerErrors, SubscribeForbidden, Unauthorized,
};
use crate::auth::Access;
use crate::error::ApiError;
use crate::error::ErrorBody;
use crate::ops::history::{self, PageQuery, Reading};
use crate::ops::namespaces;
use crate::transport::query::Query;
use crate::App;
use axum::extract::{Path, RawQuery, State};
use axum::Json;
use gapless_protocol::answers::PageEvents;
pub(crate) use gapless_protocol::answers::{ChannelInfo, HistoryPage};
use gapless_protocol::schema::ChannelName;
use gapless_protocol::Cursor;
use std::sync::Arc;

/// `GET /v1/channels/{channel}/events?after=CURSOR&since=…&limit=N`.
#[utoipa::path(
    get,
    path = "/v1/channels/{channel}/events",
    operation_id = "history",
    summary = "One page of a channel's history",
    tag = "read",
    params(
        ("channel" = ChannelName, Path, description = "The channel to read."),
        ("after" = Option<Cursor>, Query, description = "Read the events after this cursor; when absent or empty, where `since` says (the floor, the oldest retained event, by default). Wins over `since`."),
        ("since" = Option<gapless_protocol::Since>, Query, description = "Without `after`: where the first page starts, as for a stream (checked also with `after`). `earliest` (the default) the floor; `live` the head (an empty page, `done`, whose `next` is the head's cursor); `last:N` the last N retained events; `time:UNIX_MS` the first retained event at or after that time (from the floor, with `gap`, when an event no longer retained may be at or after it). Read on with `after` = `next`."),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "Most events in the page; default 100."),
    ),
    responses(
        (status = 200, description = "One page of history.", body = HistoryPage),
        (status = 400, description = "`invalid_channel`, `invalid_cursor` (`after` fails its check or names no position on this channel), or `invalid_request` (a bad `limit` or `since`).", body = ErrorBody),
        Unauthorized,
        SubscribeForbidden,
        (status = 410, description = "`cursor_not_served`: the journal cannot serve `after` (`reason`: `evicted`, `epoch`, `ahead` or `unknown`); `floor` and `floor_cursor` say where reading can restart.", body = ErrorBody),
        JournalUnreadable,
        (status = 503, description = "`unavailable` (cluster mode: Redis unreachable) or `shutting_down`.", body = ErrorBody),
    ),
)]
pub(crate) async fn history(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    Path(channel): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<HistoryPage>, ApiError> {
    history::may_read(&grant, &channel)?;
    page(&app, &channel, &channel, raw.as_deref(), Reading::Channel).await
}

/// One history page of journal channel `channel` (`ops::history`), read
/// from the query `raw`; `name` is what the answer calls it (a channel
/// name, or a session id).
pub(crate) async fn page(
    app: &App,
    channel: &str,
    name: &str,
    raw: Option<&str>,
    reading: Reading,
) -> Result<Json<HistoryPage>, ApiError> {
    let q = Query::parse(raw);
    let query = PageQuery {
        limit: q.get("limit"),
        after: q.get("after"),
        after_seq: q.get("after_seq"),
        since: q.get("since"),
    };
    let page = history::page(app, channel, query, reading).await?;
    Ok(Json(HistoryPage {
        channel: name.to_owned(),
        epoch: page.epoch,
        floor: page.floor,
        head: page.head,
        events: PageEvents::Journal(page.events),
        next: page.next,
        done: page.done,
        gap: page.gap.map(|g| g.notice()),
    }))
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
        (status = 200, description = "The channel's bounds, its namespace and the retention that applies to it. A channel never published to answers `floor: 1, head: 0`.", body = ChannelInfo),
        (status = 400, description = "`invalid_channel`.", body = ErrorBody),
        SubscribeForbidden,
        ServerErrors,
    ),
)]
pub(crate) async fn channel_info(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    Path(channel): Path<String>,
) -> Result<Json<ChannelInfo>, ApiError> {
    history::may_read(&grant, &channel)?;
    let (st, subscribers) = history::bounds(&app, &channel).await?;
    let (namespace, retention) = namespaces::retention(&app, &channel);
    Ok(Json(ChannelInfo {
        namespace: namespace.to_owned(),
        retention,
        channel,
        epoch: st.epoch,
        floor: st.floor,
        head: st.head,
        subscribers,
    }))
}
