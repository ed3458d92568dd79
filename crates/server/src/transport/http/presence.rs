//! `GET /v1/channels/{channel}/presence`: a channel's occupancy and
//! members. The rules are `ops::presence`'s; this writes its answer.

use crate::admin::openapi::shared::{ServerErrors, SubscribeForbidden, Unauthorized};
use crate::auth::Access;
use crate::error::{ApiError, ErrorBody};
use crate::ops::presence;
use crate::App;
use axum::extract::{Path, State};
use axum::Json;
use gapless_protocol::presence::PresenceAnswer;
use gapless_protocol::schema::ChannelName;
use std::sync::Arc;

/// `GET /v1/channels/{channel}/presence`:
/// `{"channel","occupancy","members":[{"id","connections","since"}]}`.
#[utoipa::path(
    get,
    path = "/v1/channels/{channel}/presence",
    operation_id = "channel_presence",
    summary = "Who follows a channel: occupancy and members",
    tag = "read",
    params(("channel" = ChannelName, Path, description = "The channel; its namespace must have `presence = true`.")),
    responses(
        (status = 200, description = "The channel's occupancy (its connections now, members' or not) and its members sorted by id. A member is a token's `sub`, or on an open server a subscriber's `client_id`.", body = PresenceAnswer),
        (status = 400, description = "`invalid_channel`.", body = ErrorBody),
        Unauthorized,
        SubscribeForbidden,
        (status = 404, description = "`presence_disabled`: the channel's namespace has no presence.", body = ErrorBody),
        ServerErrors,
    ),
)]
pub(crate) async fn presence(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    Path(channel): Path<String>,
) -> Result<Json<PresenceAnswer>, ApiError> {
    presence::get(&app, &grant, &channel).await.map(Json)
}
