//! Running the server: health and readiness (here), `GET /metrics`
//! ([`metrics`], serving the registry of [`crate::metrics`]), the console
//! page ([`console`]) and the OpenAPI document ([`openapi`]), with the
//! `routes()` that `lib.rs` merges. May use: `auth` (the token schemes the
//! document names), `config`, `error` and `App`; the transports' schemas
//! come with their own `routes()`.

pub(crate) mod console;
pub(crate) mod metrics;
pub(crate) mod openapi;

use crate::error::{ApiError, ErrorBody};
use crate::App;
use axum::Json;
use gapless_protocol::codes::ErrorCode;
use serde::Serialize;
use std::sync::Arc;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// The paths served as usual even on a refused connection (the probes and
/// metrics). The OpenAPI document reads them too: their operations have no
/// 503 `limit_reached` ([`openapi`]).
pub(crate) const PROBES: &[&str] = &["/healthz", "/readyz", "/metrics"];

/// The operations routes: the probes, metrics, this document and, with
/// `console`, the console page at `GET /`.
pub(crate) fn routes(console: bool) -> OpenApiRouter<Arc<App>> {
    let api = OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics::render))
        .routes(routes!(openapi::serve));
    if console {
        api.routes(routes!(console::page))
            .routes(routes!(console::icon))
    } else {
        api
    }
}

/// `ok`, the only value of a liveness answer's `status`.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum Alive {
    Ok,
}

/// The answer of `GET /healthz`.
#[derive(Serialize, ToSchema)]
struct Health {
    /// Always `ok`.
    status: Alive,
}

/// `ready`, the only value of a readiness answer's `status`.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum Readiness {
    Ready,
}

/// The answer of `GET /readyz` while the journal accepts appends.
#[derive(Serialize, ToSchema)]
struct Ready {
    /// Always `ready`.
    status: Readiness,
}

/// 200 `{"status":"ok"}` while the process serves (liveness).
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    summary = "Liveness",
    tag = "operations",
    responses((status = 200, description = "The process serves (liveness; the journal is not looked at). Served even on a connection over the connection limit.", body = Health)),
)]
async fn healthz() -> Json<Health> {
    Json(Health { status: Alive::Ok })
}

/// 200 `{"status":"ready"}` while the journal accepts appends; 503
/// `unavailable` while it cannot, with `reason` the journal's own code
/// (`journal_full`, `unavailable`, `journal_failed`, `shutting_down`;
/// docs/api.md). `Retry-After` as the journal's error gives it.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    summary = "Readiness: whether the journal accepts appends",
    tag = "operations",
    responses(
        (status = 200, description = "The journal accepts appends: point a load balancer's readiness check here.", body = Ready),
        (status = 503, description = "`unavailable`, always with `reason`, the journal's own code: `journal_full` (the disk is below `--min-free-disk-bytes`), `unavailable` (cluster mode: Redis unreachable, hung, loading, or a read-only replica), `journal_failed` (cluster mode: Redis refuses writes, e.g. out of memory at `maxmemory` with `noeviction`), `shutting_down` (the server is stopping).", body = ErrorBody),
    ),
)]
async fn readyz(
    axum::extract::State(app): axum::extract::State<Arc<App>>,
) -> Result<Json<Ready>, ApiError> {
    // Not ready is always a 503 (what load balancers and probes expect); the
    // journal's own code is kept as `reason` (docs/api.md, `GET /readyz`).
    if let Err(e) = app.hub.journal().ready().await {
        let inner = ApiError::from(e);
        let mut out = ApiError::new(ErrorCode::Unavailable, inner.message)
            .with("reason", inner.code.as_str());
        if let Some(secs) = inner.extra.get("retry_after").and_then(|v| v.as_u64()) {
            out = out.retry_after(secs);
        }
        return Err(out);
    }
    Ok(Json(Ready {
        status: Readiness::Ready,
    }))
}
