//! The WebSocket origin guard: which credential a handshake's token is taken
//! from, and the refusal of a cookie sent by a foreign page (cross-site
//! WebSocket hijacking; docs/security.md, "WebSockets and the cookie").

use super::{Auth, Grant};
use crate::error::ApiError;
use crate::App;
use axum::http::HeaderMap;
use gapless_protocol::codes::ErrorCode;
use std::sync::Arc;

/// What a WebSocket handshake may do, with the guard against cross-site
/// WebSocket hijacking (docs/security.md, "WebSockets and the cookie").
///
/// Browsers send a page's WebSocket handshake with the server's cookies,
/// whatever the page's origin, and apply no CORS to it. So when the
/// handshake's credential is the [`COOKIE`](crate::auth::COOKIE) cookie (no
/// `Authorization` header) on a server with keys, its `Origin` must be the
/// server's own (the same host and port as the `Host` header; a port left
/// out is the scheme's default, 80 or 443) or one listed by `--cors-origin`
/// (`*` lists none: it allows no credentials). From any other origin the
/// cookie is never the credential: the `access_token` parameter is, when
/// the handshake has one (a foreign page can send its own token, not read
/// the cookie's), else the handshake is refused. A handshake without
/// `Origin` is not a browser's (browsers always send one on a WebSocket), so
/// its cookie is taken, as on HTTP.
///
/// # Errors
/// Outer: 403 `forbidden` before the upgrade, naming the origin and
/// `--cors-origin`. Inner: the token's refusal, sent after the upgrade
/// (the WebSocket transport's `refuse`).
pub fn access(
    app: &App,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Result<Arc<Grant>, ApiError>, ApiError> {
    use axum::http::header::{HOST, ORIGIN};
    let origin = match headers.get(ORIGIN) {
        Some(o) if !app.auth.is_open() && Auth::cookie_is_credential(headers) => {
            String::from_utf8_lossy(o.as_bytes()).into_owned()
        }
        _ => return Ok(app.auth.grant_of(headers, query)),
    };
    let host = headers.get(HOST).and_then(|h| h.to_str().ok());
    let listed = app
        .config
        .cors_origins
        .iter()
        .map(|o| o.trim().trim_end_matches('/'))
        .any(|o| o != "*" && o.eq_ignore_ascii_case(&origin));
    if listed || host.is_some_and(|h| same_origin(&origin, h)) {
        return Ok(app.auth.grant_of(headers, query));
    }
    let has_query_token = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .any(|(k, v)| k == crate::auth::QUERY && !v.is_empty());
    if has_query_token {
        return Ok(app.auth.grant_of_query(query));
    }
    tracing::debug!(origin, "a cookie WebSocket from a foreign origin: refused");
    Err(ApiError::new(
        ErrorCode::Forbidden,
        format!(
            "this WebSocket handshake's credential is the {cookie} cookie, and the page's origin \
             {origin:?} is neither this server's own ({host}) nor one allowed by --cors-origin: \
             browsers send the cookie with any page's WebSocket, so it is honoured only from \
             those origins (cross-site WebSocket hijacking; docs/security.md). If the page is \
             yours, add its origin to --cors-origin; or send the token as \
             `Authorization: Bearer` or ?{query_param}=",
            cookie = crate::auth::COOKIE,
            host = host.unwrap_or("no Host header"),
            query_param = crate::auth::QUERY,
        ),
    ))
}

/// Whether the `Origin` value `origin` (`scheme://host[:port]`) names the
/// host and port of the `Host` header value `host`; a port left out is the
/// default of the origin's scheme (80 for `http`, 443 for `https`). The
/// scheme is not compared further: behind a TLS proxy the server sees
/// `http` for its own `https` pages, and the port already tells them apart.
fn same_origin(origin: &str, host: &str) -> bool {
    use axum::http::uri::{Authority, Uri};
    let Ok(o) = origin.parse::<Uri>() else {
        return false;
    };
    let default = match o.scheme_str() {
        Some(s) if s.eq_ignore_ascii_case("http") => 80,
        Some(s) if s.eq_ignore_ascii_case("https") => 443,
        _ => return false,
    };
    let (Some(oa), Ok(ha)) = (o.authority(), host.parse::<Authority>()) else {
        return false;
    };
    oa.host().eq_ignore_ascii_case(ha.host())
        && oa.port_u16().unwrap_or(default) == ha.port_u16().unwrap_or(default)
}
