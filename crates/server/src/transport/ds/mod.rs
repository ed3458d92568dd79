//! The Durable Streams room: the open Durable Streams protocol
//! (<https://github.com/durable-streams/durable-streams>, PROTOCOL.md) served
//! under `--ds-prefix` (default `/ds`), over the same hub and journal as
//! channels. A stream is a gapless channel ([`names::channel_of`]); its
//! offsets are journal positions ([`names::offset`]); its metadata is its
//! channel's (`gapless_core::meta`), journaled with its events and cached
//! by [`streams`]. docs/durable-streams.md gives the whole mapping and what
//! is not implemented yet.
//!
//! The protocol's paths are free-form under the prefix and the prefix is a
//! setting, so this room is not a set of OpenAPI routes: [`intercept`] is a
//! layer of the router that takes every request under the prefix (its own
//! CORS included) and passes everything else on. The protocol text is its
//! specification; the gapless OpenAPI document does not list it.
//!
//! Authorization is gapless's own ([`Access`]): reads need `subscribe`,
//! creation, appends, close and delete need `publish`, on the mapped channel.

// The room's helpers return a refusal as the finished answer (`Response`,
// 128 bytes): once per request, never in a loop, so the size is no cost.
#![allow(clippy::result_large_err)]

pub(crate) mod create;
pub(crate) mod lifecycle;
pub(crate) mod live;
pub(crate) mod read;
pub(crate) mod subscriptions;
pub(crate) mod webhook;
pub(crate) mod write;

use crate::auth::{Access, Action};
use crate::error::ApiError;
use crate::net::conn::DirectStream;
use crate::net::listener::Refused;
use crate::net::liveness::Flushes;
use crate::ops::streams::names;
use crate::ops::streams::{StreamError, Streams};
use crate::App;
use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use gapless_protocol::codes::ErrorCode;
use std::sync::Arc;

/// The room's shared state: the streams this node serves now.
pub(crate) struct Ds {
    /// The streams' metadata, cached ([`Streams`]).
    pub streams: Arc<Streams>,
    /// The subscriptions (the reserved `__ds/` APIs; `ops::subscriptions`).
    pub subs: Arc<crate::ops::subscriptions::Subscriptions>,
    /// Set once the side channel of older releases was read and emptied
    /// (`ops::streams::upgrade`).
    pub upgraded: tokio::sync::OnceCell<()>,
}

/// The state [`intercept`] runs with.
pub(crate) type DsState = (Arc<App>, Arc<Ds>);

/// The state of the layer [`intercept`] for `app`; starts the subscriptions'
/// delivery task (it reads them at once, so wakes go out after a restart
/// before any request comes).
pub(crate) fn state(app: Arc<App>) -> DsState {
    let ds = Arc::new(Ds {
        streams: Arc::default(),
        subs: Arc::new(crate::ops::subscriptions::Subscriptions::new(
            webhook::poster(),
        )),
        upgraded: tokio::sync::OnceCell::new(),
    });
    if !app.config.ds_prefix.is_empty() {
        listen(&app, &ds);
        crate::ops::subscriptions::deliver::start(&subscriptions::cx(&app, &ds));
    }
    (app, ds)
}

/// Hears of every change of a channel's metadata (`CommitSink::meta_changed`,
/// here or on another node): the cached copy is stale, and when live
/// readers wait on it, it is read again at once so they learn of a close or
/// a deletion; the subscriptions are told too (a subscription changed, a
/// stream was created). Called where the journal commits: it only spawns
/// and sends.
fn listen(app: &Arc<App>, ds: &Arc<Ds>) {
    let (weak_app, weak_ds) = (Arc::downgrade(app), Arc::downgrade(ds));
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    app.hub.channels().on_meta_changed(Box::new(move |channel: &str| {
        let (Some(app), Some(ds)) = (weak_app.upgrade(), weak_ds.upgrade()) else {
            return;
        };
        ds.subs.meta_changed(channel);
        if ds.streams.changed(channel).is_some() {
            let channel = channel.to_owned();
            rt.spawn(async move {
                if let Err(e) = ds.streams.load(&app.hub, &channel).await {
                    tracing::debug!(channel, error = %e, "could not read a stream's metadata again");
                }
            });
        }
    }));
}

/// Whether a request target is a live SSE read of this room
/// (`live=sse` under `prefix`, `--ds-prefix`, outside the reserved
/// `__ds/` APIs): the fan-out writer serves it when it is a connection's
/// first request (`net/conn.rs`), so it is written as gapless's own SSE
/// streams are. Any other read keeps its connection for more requests.
pub(crate) fn is_live_sse(prefix: &str, path: &str, query: Option<&str>) -> bool {
    if prefix.is_empty() {
        return false;
    }
    let prefix = prefix.trim_end_matches('/');
    let Some(rest) = path.strip_prefix(prefix).and_then(|r| r.strip_prefix('/')) else {
        return false;
    };
    if rest.is_empty() || subscriptions::split(rest).is_some() {
        return false;
    }
    query.is_some_and(|q| {
        form_urlencoded::parse(q.as_bytes()).any(|(k, v)| k == "live" && v == "sse")
    })
}

/// The router layer: a request whose path is under `--ds-prefix` (the
/// prefix, then `/`) is answered by this room; anything else goes on.
pub(crate) async fn intercept(
    State((app, ds)): State<DsState>,
    req: Request,
    next: Next,
) -> Response {
    let prefix = app.config.ds_prefix.trim_end_matches('/');
    if app.config.ds_prefix.is_empty() {
        return next.run(req).await;
    }
    let rest = req
        .uri()
        .path()
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('/'))
        .map(str::to_owned);
    let Some(rest) = rest else {
        return next.run(req).await;
    };
    if req.extensions().get::<Refused>().is_some() {
        // A request of a refused connection (past --max-connections or
        // --max-connections-per-ip): the busy rule answers it, as on every
        // other route (`transport/sse/busy.rs`: 503 `limit_reached`).
        let mut resp = next.run(req).await;
        common_headers(resp.headers_mut());
        return resp;
    }
    let mut resp = handle(&app, &ds, req, &rest).await;
    common_headers(resp.headers_mut());
    resp
}

/// Headers on every answer of the room (PROTOCOL.md 12.7, and CORS for
/// browser clients: `*`, never with credentials).
fn common_headers(h: &mut HeaderMap) {
    let set = |h: &mut HeaderMap, k: &'static str, v: &'static str| {
        h.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
    };
    set(h, "access-control-allow-origin", "*");
    set(
        h,
        "access-control-expose-headers",
        "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, Stream-TTL, \
         Stream-Expires-At, Producer-Epoch, Producer-Seq, Producer-Expected-Seq, \
         Producer-Received-Seq, Stream-SSE-Data-Encoding, ETag, Content-Type, Location",
    );
    set(h, "x-content-type-options", "nosniff");
    set(h, "cross-origin-resource-policy", "cross-origin");
}

async fn handle(app: &Arc<App>, ds: &Arc<Ds>, req: Request, rest: &str) -> Response {
    if req.method() == Method::OPTIONS {
        return preflight();
    }
    if let Some((root, sub)) = subscriptions::split(rest) {
        return subscriptions::handle(app, ds, req, root, &sub).await;
    }
    if let Err(r) = ready(app, ds).await {
        return r;
    }
    let channel = match names::channel_of(rest) {
        Ok(c) => c,
        Err(names::BadPath(m)) => return error(ErrorCode::InvalidStreamPath, m),
    };
    let (mut parts, body) = req.into_parts();
    let grant = match Access::from_request_parts(&mut parts, app).await {
        Ok(Access(g)) => g,
        Err(e) => return e.into_response(),
    };
    let action = match parts.method {
        Method::GET | Method::HEAD => Action::Subscribe,
        _ => Action::Publish,
    };
    if let Err(e) = grant.require(action, &channel) {
        return e.into_response();
    }
    let peer = parts.extensions.get::<crate::Peer>().map(|p| p.0.ip());
    let direct = parts.extensions.get::<DirectStream>().cloned();
    let flushes = parts.extensions.get::<Flushes>().cloned();
    let ctx = Ctx {
        app: app.clone(),
        ds: ds.clone(),
        channel,
        url_path: parts.uri.path().to_owned(),
        headers: parts.headers,
        query: parts.uri.query().map(str::to_owned),
        grant,
        peer,
        direct,
        flushes,
    };
    match parts.method {
        Method::PUT => create::create(ctx, body).await,
        Method::POST => write::append(ctx, body).await,
        Method::DELETE => lifecycle::delete(ctx).await,
        Method::HEAD => read::head(ctx).await,
        Method::GET => read::get(ctx).await,
        m => {
            let mut r = error(
                ErrorCode::MethodNotAllowed,
                format!(
                    "{m} is not a Durable Streams operation; use PUT, POST, GET, HEAD or DELETE"
                ),
            );
            r.headers_mut().insert(
                axum::http::header::ALLOW,
                HeaderValue::from_static("GET, HEAD, PUT, POST, DELETE, OPTIONS"),
            );
            r
        }
    }
}

/// Moves the metadata an older release kept in its side channel into each
/// stream's channel, once, at the first request (`ops::streams::upgrade`); 503 while
/// the journal cannot be read.
async fn ready(app: &Arc<App>, ds: &Arc<Ds>) -> Result<(), Response> {
    ds.upgraded
        .get_or_try_init(|| async { crate::ops::streams::upgrade::run(app).await.map(|_| ()) })
        .await
        .map(|_| ())
        .map_err(|e| api_error(e.into()))
}

/// What a handler needs of its request.
pub(crate) struct Ctx {
    /// The shared state.
    pub app: Arc<App>,
    /// The room's state.
    pub ds: Arc<Ds>,
    /// The channel the stream path maps to.
    pub channel: String,
    /// The request path (for `Location`).
    pub url_path: String,
    /// The request headers.
    pub headers: HeaderMap,
    /// The raw query string.
    pub query: Option<String>,
    /// The caller's grant (already checked for the operation).
    pub grant: Arc<crate::auth::Grant>,
    /// The client's address (the key of per-IP limits).
    pub peer: Option<std::net::IpAddr>,
    /// Set when the fan-out writer serves this request (a connection's
    /// first request, a live SSE read: [`is_live_sse`]): a live feed is
    /// handed over to it.
    pub direct: Option<DirectStream>,
    /// The connection's flush count, when hyper serves it (`conn::body`).
    pub flushes: Option<Flushes>,
}

impl Ctx {
    /// A request header as text (`None` when absent or not visible ASCII).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Whether `Stream-Closed: true` (case-insensitive) was sent; any other
    /// value counts as absent (PROTOCOL.md 4.1).
    pub(crate) fn closes(&self) -> bool {
        self.header("stream-closed")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    }
}

/// The answer to a CORS preflight.
fn preflight() -> Response {
    let mut r = StatusCode::NO_CONTENT.into_response();
    let h = r.headers_mut();
    h.insert(
        "access-control-allow-methods",
        HeaderValue::from_static("GET, HEAD, PUT, POST, DELETE, OPTIONS"),
    );
    h.insert(
        "access-control-allow-headers",
        HeaderValue::from_static(
            "Content-Type, Authorization, If-None-Match, Stream-Seq, Stream-TTL, \
             Stream-Expires-At, Stream-Closed, Producer-Id, Producer-Epoch, Producer-Seq, \
             Stream-Forked-From, Stream-Fork-Offset, Stream-Fork-Sub-Offset",
        ),
    );
    h.insert("access-control-max-age", HeaderValue::from_static("600"));
    r
}

/// A refusal of this room: `code` (of the registry,
/// `gapless_protocol::codes`: the codes of docs/durable-streams.md, "Errors")
/// with its status and a JSON body `{"error": code, "message": message}`,
/// made as every gapless refusal is ([`ApiError`]), so it is counted in
/// `gapless_refusals_total`.
pub(crate) fn error(code: ErrorCode, message: impl Into<String>) -> Response {
    api_error(ApiError::new(code, message))
}

/// The answer to a refused stream operation ([`StreamError`]): its code's
/// status (or the one PROTOCOL.md names instead: `invalid_utf8` 415 on a
/// text stream, 409 for a fork of a soft-deleted source), its message, and
/// the headers PROTOCOL.md names for it (5.2: a closed stream's
/// `Stream-Next-Offset` and `Stream-Closed`; 5.2.1: `Producer-Epoch`,
/// `Producer-Expected-Seq`, `Producer-Received-Seq`).
pub(crate) fn refuse(ctx: &Ctx, e: StreamError) -> Response {
    let e = match e {
        StreamError::Api(api) => return api_error(api),
        e => e,
    };
    let mut r = error(e.code(), e.message(&ctx.url_path));
    match e {
        StreamError::Invalid(ErrorCode::InvalidUtf8, _) => {
            *r.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
        }
        StreamError::SourceDeleted(_) => *r.status_mut() = StatusCode::CONFLICT,
        StreamError::Closed { epoch, tail } => {
            set(&mut r, "stream-next-offset", names::offset(epoch, tail));
            set(&mut r, "stream-closed", "true");
        }
        StreamError::StaleEpoch { current, .. } => {
            set(&mut r, "producer-epoch", current.to_string());
        }
        StreamError::SeqGap {
            expected, received, ..
        } => {
            set(&mut r, "producer-expected-seq", expected.to_string());
            set(&mut r, "producer-received-seq", received.to_string());
        }
        _ => {}
    }
    r
}

/// A gapless refusal (auth, limits, the journal) as this room answers it.
pub(crate) fn api_error(e: ApiError) -> Response {
    e.into_response()
}

/// Sets header `name` to `value` (skipped when `value` is not a valid header value).
pub(crate) fn set(r: &mut Response, name: &'static str, value: impl AsRef<str>) {
    if let Ok(v) = HeaderValue::from_str(value.as_ref()) {
        r.headers_mut().insert(HeaderName::from_static(name), v);
    }
}

/// An empty answer with `status`.
pub(crate) fn empty(status: StatusCode) -> Response {
    (status, Body::empty()).into_response()
}
