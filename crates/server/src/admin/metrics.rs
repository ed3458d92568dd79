//! `GET /metrics`: the registry ([`crate::metrics`]) in the Prometheus text
//! format, with the gauges the hub already knows (subscribers, followed
//! channels) and the journal's size read at the scrape, so they cost
//! nothing between scrapes.

use crate::metrics::{install, CHANNELS_FOLLOWED, JOURNAL_SIZE_BYTES, SUBSCRIBERS};
use crate::App;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use std::sync::Arc;

/// `GET /metrics`: the Prometheus text format. Never needs a token.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    summary = "Prometheus metrics",
    tag = "operations",
    responses(
        (status = 200, description = "Every metric in the Prometheus text format (version 0.0.4); names and labels in docs/deploy.md. Served even on a connection over the connection limit.",
            content_type = "text/plain; version=0.0.4; charset=utf-8", body = String),
    ),
)]
pub(crate) async fn render(State(app): State<Arc<App>>) -> impl IntoResponse {
    let stats = app.hub.stats();
    metrics::gauge!(SUBSCRIBERS).set(stats.subscribers as f64);
    metrics::gauge!(CHANNELS_FOLLOWED).set(stats.channels as f64);
    if let Some(bytes) = app.hub.journal().size_bytes() {
        metrics::gauge!(JOURNAL_SIZE_BYTES).set(bytes as f64);
    }
    let body = match install() {
        Some(h) => {
            h.run_upkeep();
            h.render()
        }
        None => "# metrics are off: another recorder was installed\n".to_owned(),
    };
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
}
