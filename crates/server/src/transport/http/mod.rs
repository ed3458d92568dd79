//! The plain HTTP room: publish and batch ([`publish`]), history pages and a
//! channel's bounds ([`history`]), purge ([`purge`]), presence ([`presence`]), and the producer side of sessions
//! ([`sessions`]), as JSON answers. The rules are `ops::publish`,
//! `ops::history` and `ops::sessions`; this room reads the request into
//! them and writes their answers.

pub(crate) mod history;
pub(crate) mod presence;
pub(crate) mod publish;
pub(crate) mod purge;
pub(crate) mod sessions;

use crate::App;
use std::sync::Arc;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// The schemas of these routes that no operation names directly.
#[derive(utoipa::OpenApi)]
#[openapi(components(schemas(crate::transport::query::Flag)))]
struct Schemas;

/// The plain HTTP routes: a channel's publish, batch, history, bounds and purge;
/// a session's create, state, append, history, complete and cancel.
pub(crate) fn routes() -> OpenApiRouter<Arc<App>> {
    use utoipa::OpenApi;
    OpenApiRouter::with_openapi(Schemas::openapi())
        .routes(routes!(history::channel_info, purge::purge))
        .routes(routes!(publish::publish, history::history))
        .routes(routes!(publish::publish_batch))
        .routes(routes!(presence::presence))
        .routes(routes!(sessions::create))
        .routes(routes!(sessions::info))
        .routes(routes!(sessions::append, sessions::history))
        .routes(routes!(sessions::complete))
        .routes(routes!(sessions::cancel))
}
