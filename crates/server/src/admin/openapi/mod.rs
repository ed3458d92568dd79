//! The OpenAPI 3.1 document of the HTTP API, served at `GET /v1/openapi.json`.
//!
//! It is generated, not written: every route of [`crate::router`] is
//! registered through `utoipa_axum`'s `routes!` from its handler's
//! `#[utoipa::path]` annotation (path, method, parameters, every status it
//! can answer), so the router and the document share one path string per
//! handler; the bodies' schemas are derived from the types the handlers
//! serialize (`ToSchema`), and the wire types' schemas from the rules they
//! describe (`gapless_protocol::schema`). A route added without an
//! annotation cannot be registered; `crates/gapless/tests/it/openapi.rs` checks
//! that no route bypasses `routes!`.
//!
//! [`Document::new`] then fits the document to the server that serves it:
//! - tokens on (`--jwt-*`): every operation but the open ones ([`OPEN`])
//!   requires one of the three ways of presenting a token; tokens off: no
//!   security requirement and no 401 or 403 answers, which that server never gives;
//! - the answers the connection layer gives to any request (a request head
//!   over `--max-header-bytes`: 431; a malformed first request head: 400;
//!   a connection over `--max-connections`: 503 `limit_reached`, except on the
//!   probes, which are always served: `busy.rs`) are added to every operation;
//! - the configured `--max-batch-events` and `--max-subscription-channels`
//!   become `maxItems` of the batch body and of `/v1/sse`'s `channel`.
//!
//! The document is built once per router and served as the same bytes.
//! The parameters and answers several operations share are written once, in
//! [`shared`].

// Types never built: they exist for the document only.
#[allow(dead_code)]
pub(crate) mod shared;

use crate::App;
use axum::body::Bytes;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Extension;
use serde_json::{json, Value};
use utoipa::OpenApi;

/// Operations that never need a token: probes, metrics, the console page and
/// this document (`auth` is not consulted by their handlers).
pub(crate) const OPEN: &[&str] = &[
    "healthz",
    "readyz",
    "metrics",
    "console",
    "console_icon",
    "openapi",
];

/// The names of the three security schemes, one per way of presenting a token.
const SCHEMES: [&str; 3] = ["bearer", "cookie", "query"];

/// The document's fixed parts: info, tags, the schemas that no operation
/// names directly, and the security schemes.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "gapless",
        description = "A realtime event-stream server: publishers append events to channels; \
subscribers follow them over Server-Sent Events or WebSocket and get every event once and in \
order, or a gap notice naming the range. Terms (channel, event, seq, cursor, epoch, journal, \
floor, head, gap) are defined in docs/design.md; routes, statuses and bodies in docs/api.md; \
the WebSocket messages in docs/protocol.md; tokens and limits in docs/security.md. Every error \
is JSON `ErrorBody`.",
        license(name = "MIT OR Apache-2.0", identifier = "MIT OR Apache-2.0"),
    ),
    tags(
        (name = "publish", description = "Append events to channels."),
        (name = "read", description = "History pages and a channel's bounds."),
        (name = "subscribe", description = "Follow channels live: Server-Sent Events and WebSocket."),
        (name = "sessions", description = "One producer, one consumer, with an end: docs/api.md and docs/protocol.md."),
        (name = "operations", description = "Probes, metrics, the console page and this document; they never need a token."),
    ),
    components(schemas(
        gapless_protocol::event::Envelope,
        gapless_protocol::event::GapNotice,
        gapless_protocol::codes::GapReason,
        gapless_protocol::schema::Seq,
        // Named only by `shared`'s answers, which do not register their bodies.
        crate::error::ErrorBody,
    )),
    modifiers(&SecuritySchemes),
)]
pub(crate) struct ApiDoc;

/// Adds the three ways of presenting a token as security schemes.
struct SecuritySchemes;

impl utoipa::Modify for SecuritySchemes {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{
            ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme,
        };
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            SCHEMES[0],
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(
                        "`Authorization: Bearer TOKEN`: a JWT (HS256, RS256 or ES256) whose \
                         `gapless` claim lists the channels it may `subscribe` and `publish` \
                         to (docs/security.md).",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            SCHEMES[1],
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
                crate::auth::COOKIE,
                "The same JWT in a cookie (for browsers' EventSource).",
            ))),
        );
        components.add_security_scheme(
            SCHEMES[2],
            SecurityScheme::ApiKey(ApiKey::Query(ApiKeyValue::with_description(
                crate::auth::QUERY,
                "The same JWT as a query parameter, for clients that can set neither a \
                 header nor a cookie (it can land in access logs).",
            ))),
        );
    }
}

/// The served document: JSON bytes, shared by every request.
#[derive(Clone)]
pub(crate) struct Document(pub Bytes);

impl Document {
    /// Fits `doc` (the router's document) to `app` (see the module doc) and
    /// encodes it. `direct_stream` recognises the paths of the streams that
    /// answer a refused connection with `retry:` rather than a 503 (the SSE
    /// transport's predicate, handed in by `lib.rs`).
    pub(crate) fn new(
        doc: utoipa::openapi::OpenApi,
        app: &App,
        direct_stream: fn(&str) -> bool,
    ) -> Self {
        let mut doc = serde_json::to_value(doc).unwrap_or_default();
        fit(&mut doc, app, direct_stream);
        Document(Bytes::from(serde_json::to_vec(&doc).unwrap_or_default()))
    }
}

/// The HTTP methods an OpenAPI path item may hold.
const METHODS: &[&str] = &[
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

fn error_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    })
}

/// Adds `text` to the description of `status` in `responses`, or adds the
/// status with an error body and `text`.
fn add_response(responses: &mut serde_json::Map<String, Value>, status: &str, text: &str) {
    match responses.get_mut(status) {
        Some(r) => {
            let d = r["description"].as_str().unwrap_or_default();
            r["description"] = Value::from(format!("{d} {text}").trim().to_owned());
        }
        None => {
            responses.insert(status.to_owned(), error_response(text));
        }
    }
}

fn fit(doc: &mut Value, app: &App, direct_stream: fn(&str) -> bool) {
    let tokens = !app.auth.is_open();
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        for method in METHODS {
            let Some(op) = item.get_mut(*method) else {
                continue;
            };
            let id = op["operationId"].as_str().unwrap_or_default().to_owned();
            let open = OPEN.contains(&id.as_str());
            if tokens && !open {
                op["security"] = Value::Array(SCHEMES.iter().map(|s| json!({ *s: [] })).collect());
            }
            let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else {
                continue;
            };
            if !tokens {
                responses.remove("401");
                responses.remove("403");
            }
            add_response(
                responses,
                "431",
                "`head_too_large`: the request head is over `--max-header-bytes` or 100 \
                 header lines (the connection is then closed).",
            );
            add_response(
                responses,
                "400",
                "The first request head on a connection that is not valid HTTP/1.x gets \
                 `invalid_request` naming the problem.",
            );
            if !super::PROBES.contains(&path.as_str()) && !direct_stream(path) {
                add_response(
                    responses,
                    "503",
                    "`limit_reached` (with `Retry-After`): the connection is over \
                     `--max-connections` or `--max-connections-per-ip` (a `GET` that accepts \
                     `text/event-stream` gets instead a 200 stream holding only `retry:`).",
                );
            }
            if id == "publish_batch" {
                if let Some(body) = op.pointer_mut("/requestBody/content/application~1json/schema")
                {
                    body["minItems"] = 1.into();
                    body["maxItems"] = app.config.max_batch_events.into();
                }
            }
            if id == "multi_sse" {
                if let Some(params) = op.get_mut("parameters").and_then(Value::as_array_mut) {
                    for p in params.iter_mut().filter(|p| p["name"] == "channel") {
                        p["schema"]["maxItems"] = app.config.max_subscription_channels.into();
                    }
                }
            }
        }
    }
}

/// `GET /v1/openapi.json`: this server's OpenAPI document.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    operation_id = "openapi",
    summary = "This OpenAPI document",
    tag = "operations",
    responses(
        (status = 200, description = "This document: OpenAPI 3.1, fitted to this server (its token setting and limits).",
            content_type = "application/json", body = Object),
    ),
)]
pub(crate) async fn serve(Extension(doc): Extension<Document>) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        doc.0,
    )
}
