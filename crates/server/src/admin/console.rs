//! `GET /`: the console, a small page embedded in the binary (`console.html`)
//! to watch channels live, publish a test event and read history. It uses
//! the browser's own `EventSource` and `fetch` against this server's API, so
//! it needs nothing else; a server that requires tokens takes one typed into
//! the page. Served when [`ServerConfig::console`](crate::ServerConfig::console)
//! is on (`--console`; by default only when listening on a loopback address).

use axum::http::header;
use axum::response::IntoResponse;

/// The page.
pub const PAGE: &str = include_str!("console.html");

/// `GET /`.
#[utoipa::path(
    get,
    path = "/",
    operation_id = "console",
    summary = "The console page",
    tag = "operations",
    description = "The console page, embedded in the binary (`--console`; on by default when listening on a loopback address; without it this path is 404). It follows channels live, publishes a test event, reads history, and shows gaps and reconnects.",
    responses(
        (status = 200, description = "The page.", content_type = "text/html; charset=utf-8", body = String),
    ),
)]
pub async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            // The page loads nothing from elsewhere.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'",
            ),
        ],
        PAGE,
    )
}
