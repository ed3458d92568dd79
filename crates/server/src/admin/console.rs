//! `GET /`: the console, a small page embedded in the binary (`console.html`)
//! to watch channels live, publish a test event and read history. It uses
//! the browser's own `EventSource` and `fetch` against this server's API, so
//! it needs nothing else; a server that requires tokens takes one typed into
//! the page. Served when [`ServerConfig::console`](crate::ServerConfig::console)
//! is on (`--console`; by default only when listening on a loopback address).

use axum::http::header;
use axum::response::IntoResponse;

/// The page.
pub(crate) const PAGE: &str = include_str!("console.html");

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
pub(crate) async fn page() -> impl IntoResponse {
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

/// The console's icon: the page's one, an SVG (a dot on a line, the colour
/// of an open stream), so a browser's request for it is not a 404.
pub(crate) const ICON: &str = "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 16 16\">\
<rect width=\"16\" height=\"16\" rx=\"3\" fill=\"#1d2733\"/>\
<path d=\"M2 8h12\" stroke=\"#6b7d90\" stroke-width=\"1.5\"/>\
<circle cx=\"11\" cy=\"8\" r=\"3\" fill=\"#3fb950\"/></svg>";

/// `GET /favicon.ico`.
#[utoipa::path(
    get,
    path = "/favicon.ico",
    operation_id = "console_icon",
    summary = "The console's icon",
    tag = "operations",
    description = "The console page's icon, an SVG image (served with the console: `--console`).",
    responses(
        (status = 200, description = "The icon.", content_type = "image/svg+xml", body = String),
    ),
)]
pub(crate) async fn icon() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "image/svg+xml"),
            (header::CACHE_CONTROL, "max-age=86400"),
        ],
        ICON,
    )
}
