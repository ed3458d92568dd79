//! Purging: `DELETE /v1/channels/{channel}` removes every event of the
//! channel and starts a new epoch for it ([`gapless_core::Journal::purge`]).
//! Shapes and rules are in `docs/api.md` ("Purge a channel").

use crate::admin::openapi::shared::{JournalFull, PublishForbidden, ServerErrors};
use crate::auth::Access;
use crate::error::{ApiError, ErrorBody};
use crate::ops::publish as op;
use crate::App;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use gapless_protocol::schema::ChannelName;
use std::sync::Arc;

/// `DELETE /v1/channels/{channel}`: 204 once every event of the channel is
/// gone and its new epoch is durable (and, in cluster mode, in Redis).
/// Needs the publish right on the channel (the token rules of a publish:
/// `Authorization: Bearer`, the `gapless_token` cookie with its origin
/// check, or `access_token`).
#[utoipa::path(
    delete,
    path = "/v1/channels/{channel}",
    operation_id = "purge",
    summary = "Purge a channel: remove every event, start a new epoch",
    tag = "publish",
    params(("channel" = ChannelName, Path, description = "The channel to purge.")),
    responses(
        (status = 204, description = "Purged: the channel has no event, a new epoch, and seqs start again at 1. Every subscriber gets one `epoch` gap, then the events published after the purge; a cursor from before gets the `epoch` gap when it resumes. A channel never published to also answers 204 (nothing changes)."),
        (status = 400, description = "`invalid_channel`.", body = ErrorBody),
        PublishForbidden,
        JournalFull,
        ServerErrors,
    ),
)]
pub(crate) async fn purge(
    State(app): State<Arc<App>>,
    Access(grant): Access,
    Path(channel): Path<String>,
) -> Result<StatusCode, ApiError> {
    op::check_channel(&grant, &channel)?;
    app.hub.purge(&channel).await?;
    crate::metrics::channel_purged();
    tracing::info!(channel = %channel, "channel purged");
    Ok(StatusCode::NO_CONTENT)
}
