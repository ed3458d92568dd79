//! The gapless server: publish, history and sessions over HTTP, and
//! subscriptions over Server-Sent Events and WebSocket, all over the hub.
//!
//! Five parts (docs/design.md, "Parts"; `tests/layers.rs` keeps their rules):
//! [`ops`] (what the server does, once for every transport), [`auth`]
//! (tokens and grants), [`net`] (sockets and bytes), [`transport`] (one room
//! per wire protocol) and [`admin`] (probes, `GET /metrics`, console,
//! OpenAPI); beside them [`config`], `error` and [`metrics`] (the registry
//! every part records into), which every part may use.
//! This file assembles them: [`api`] merges each part's `routes()`,
//! [`router`] adds the fallbacks and middleware, and [`serve`] runs it all
//! until the shutdown token fires, then ends every stream so clients
//! reconnect and resume elsewhere.

pub mod admin;
pub mod auth;
pub mod config;
pub(crate) mod error;
pub mod metrics;
pub mod net;
pub mod ops;
pub mod transport;

pub use config::ServerConfig;

/// The paths gapless's own API answers at and under, other than `/` (the
/// console): what a `--ds-prefix` may neither be, nor lie under, nor hold.
/// A prefix anywhere else is free, under `/v1` too (`/v1/stream`, where
/// the Durable Streams Yjs server looks: docs/durable-streams.md,
/// "Integrations"). `crates/gapless/tests/it/ds_settings.rs` checks it
/// against every path of the OpenAPI document.
pub const OWN_PATHS: &[&str] = &[
    "/v1/channels",
    "/v1/sessions",
    "/v1/sse",
    "/v1/ws",
    "/v1/openapi.json",
    "/healthz",
    "/readyz",
    "/metrics",
    "/favicon.ico",
];

use axum::extract::DefaultBodyLimit;
use axum::{Extension, Router};
use error::ApiError;
use gapless_core::hub::Hub;
use gapless_core::session::Sessions;
use gapless_protocol::codes::ErrorCode;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

/// What every handler shares.
#[derive(Debug)]
pub struct App {
    /// The hub.
    pub hub: Hub,
    /// The sessions this server has touched.
    pub sessions: Sessions,
    /// Transport settings.
    pub config: ServerConfig,
    /// Fires when the server shuts down; open streams end on it.
    pub shutdown: CancellationToken,
    /// Upgraded WebSocket connections, which the HTTP server no longer tracks:
    /// shutdown waits for them to send their close frames.
    pub sockets: TaskTracker,
    /// Token verification; open when no key is configured ([`auth`]).
    pub auth: auth::Auth,
    /// The publish rate limit (`limits.rs`).
    pub publish_limiter: ops::limits::PublishLimiter,
    /// Who follows each channel with presence (`ops/presence.rs`).
    pub presence: ops::presence::Presence,
    /// The one timer of every SSE stream: heartbeat ticks and shutdown
    /// (`ops/stream.rs`).
    pub clock: ops::StreamClock,
}

/// The client's address, put in every request's extensions by the
/// connection that carries it (the key of per-IP limits on an open server).
/// From a trusted proxy (`--trusted-proxy`) it is the forwarded client's
/// address with port 0 (`forwarded.rs`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub std::net::SocketAddr);

/// Every route, each registered with its handler's `#[utoipa::path]`
/// annotation, so the router and the OpenAPI document cannot differ (one
/// `routes!` per path; `crates/gapless/tests/it/openapi.rs` checks that nothing
/// is registered another way). `console`: whether `GET /` serves the console.
pub(crate) fn api(console: bool) -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::with_openapi(admin::openapi::ApiDoc::openapi())
        .merge(admin::routes(console))
        .merge(transport::http::routes())
        .merge(transport::sse::routes())
        .merge(transport::ws::routes())
}

/// The v1 router, with the OpenAPI document of exactly its routes at
/// `GET /v1/openapi.json`.
pub(crate) fn router(app: Arc<App>) -> Router {
    let (v1, doc) = api(app.config.console).split_for_parts();
    let doc = admin::openapi::Document::new(doc, &app, transport::sse::is_sse_path);
    let cors = cors(&app.config.cors_origins);
    let ds = transport::ds::state(app.clone());
    let router = v1
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(Extension(doc))
        .layer(DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn(edge))
        .with_state(app);
    let router = match cors {
        Some(layer) => router.layer(layer),
        None => router,
    };
    // Durable Streams, outermost: its paths (under --ds-prefix) carry their
    // own CORS, and everything else passes through.
    router.layer(axum::middleware::from_fn_with_state(
        ds,
        transport::ds::intercept,
    ))
}

/// The request edge: the rules every request meets before routing, in one
/// middleware (each layer of its own costs a boxed future and a move of
/// the whole handler future per request):
/// 1. a request of a refused connection gets its busy answer
///    (`transport/sse/busy.rs`);
/// 2. a WebSocket route takes `GET` only (405 otherwise, `transport/ws`);
/// 3. every 4xx/5xx answer that is not JSON yet (axum's own rejections,
///    the fallbacks) is turned into the JSON error shape ([`error::json_errors`]).
async fn edge(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if let Some(resp) = transport::sse::busy::refusal(&req) {
        return resp;
    }
    if let Some(resp) = transport::ws::wrong_method(&req) {
        return error::json_errors(resp).await;
    }
    error::json_errors(next.run(req).await).await
}

/// The CORS layer for `--cors-origin` (see [`ServerConfig::cors_origins`]):
/// `*` answers any origin without credentials; listed origins are echoed
/// with `Access-Control-Allow-Credentials: true`. Preflights allow the
/// headers gapless reads and the ones EventSource polyfills add.
fn cors(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use axum::http::{header, HeaderName, HeaderValue, Method};
    use tower_http::cors::{AllowOrigin, CorsLayer};
    let origins: Vec<&str> = origins
        .iter()
        .map(|o| o.trim())
        .filter(|o| !o.is_empty())
        .collect();
    if origins.is_empty() {
        return None;
    }
    let layer = CorsLayer::new()
        .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
        .allow_headers([
            header::CONTENT_TYPE,
            header::AUTHORIZATION,
            header::CACHE_CONTROL,
            header::ACCEPT,
            HeaderName::from_static("last-event-id"),
            HeaderName::from_static("idempotency-key"),
            HeaderName::from_static("x-requested-with"),
        ])
        .expose_headers([header::RETRY_AFTER, header::WWW_AUTHENTICATE])
        .max_age(std::time::Duration::from_secs(600));
    Some(if origins.contains(&"*") {
        layer.allow_origin(AllowOrigin::any())
    } else {
        layer
            .allow_origin(AllowOrigin::list(
                origins
                    .iter()
                    .filter_map(|o| HeaderValue::from_str(o.trim_end_matches('/')).ok()),
            ))
            .allow_credentials(true)
    })
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::new(ErrorCode::NotFound, format!("no such path: {}", uri.path()))
}

/// 405 for a path whose route does not take the method (the router adds
/// `Allow`, listing the methods it does take).
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    error::method_not_allowed_error(&method, uri.path(), "")
}

/// Serves `app` on `listener` until `app.shutdown` fires; open streams end then,
/// and this returns once connections have closed and every WebSocket has sent
/// its close frame. The caller bounds how long it waits.
///
/// Each connection is served by `conn::serve`: SSE streams opened by a
/// connection's first request are written straight to the socket by a
/// second runtime of `fanout_threads` threads, everything
/// else goes to hyper's HTTP/1 server with a request-head timeout
/// (`header_timeout_ms`) and upgrades (for WebSocket).
///
/// # Errors
/// I/O errors of the server loop.
pub async fn serve(app: Arc<App>, listener: TcpListener) -> std::io::Result<()> {
    let shutdown = app.shutdown.clone();
    let sockets = app.sockets.clone();
    let mut listener = net::listener::GaplessListener::new(listener, app.config.clone());
    let ticker = tokio::spawn(tick(app.clone()));
    let threads = match app.config.fanout_threads {
        // One core is left to the request path and the journal's writer.
        0 => std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1)),
        n => n,
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder
        .worker_threads(threads)
        .thread_name("gapless-fanout")
        .enable_all();
    if let Some(idle) = app.config.on_thread_idle {
        builder.on_thread_park(idle);
    }
    let runtime = builder.build()?;
    let fanout_handle = runtime.handle().clone();
    let fanout = FanoutRuntime(Some(runtime));
    let connections = TaskTracker::new();
    let shared = Arc::new(net::conn::Shared {
        config: app.config.clone(),
        shutdown: app.shutdown.clone(),
        router: router(app.clone()),
        fanout: fanout_handle,
        tracker: connections.clone(),
        direct: direct_targets(&app.config.ds_prefix),
    });
    loop {
        let (io, addr) = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            conn = listener.accept() => conn,
        };
        connections.spawn(net::conn::serve(shared.clone(), io, addr));
    }
    drop(listener);
    drop(shared);
    connections.close();
    connections.wait().await;
    ticker.abort();
    // WebSockets run on the fan-out runtime (`transport::ws`): their close frames first.
    sockets.close();
    sockets.wait().await;
    // Every stream and socket has ended (they are tracked above): nothing runs on it now.
    drop(fanout);
    Ok(())
}

/// The request targets (path and query) whose `GET` as a connection's first
/// request the fan-out writer serves: the SSE transport's URLs, and Durable
/// Streams SSE reads under `ds_prefix` (`--ds-prefix`; none when empty).
fn direct_targets(ds_prefix: &str) -> net::conn::Direct {
    let ds_prefix = ds_prefix.to_owned();
    Arc::new(move |target: &str| {
        let (path, query) = match target.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (target, None),
        };
        transport::sse::is_sse_path(path) || transport::ds::is_live_sse(&ds_prefix, path, query)
    })
}

/// The fan-out runtime, owned by [`serve`]'s future. A runtime dropped the
/// ordinary way blocks until its threads stop, which panics inside async
/// code; the caller may drop `serve` at any point (it bounds the wait for
/// connections), so this drops it without waiting.
struct FanoutRuntime(Option<tokio::runtime::Runtime>);

impl Drop for FanoutRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Retention by age and idle-channel sweeps, every 250 ms.
async fn tick(app: Arc<App>) {
    let mut every = tokio::time::interval(std::time::Duration::from_millis(250));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if let Err(e) = app.hub.tick(gapless_core::journal::now_ms()).await {
            tracing::error!(error = %e, "retention pass failed");
        }
        if let Err(e) = app.sessions.sweep(&app.hub).await {
            tracing::error!(error = %e, "session grace pass failed");
        }
        app.publish_limiter.sweep();
    }
}
