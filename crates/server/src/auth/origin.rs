//! The origin guard: which credential a WebSocket handshake's or an HTTP
//! write's token is taken from, and the refusal of a cookie sent by a
//! foreign page (cross-site WebSocket hijacking and cross-site request
//! forgery; docs/security.md, "The cookie and foreign pages").

use super::{Auth, Grant};
use crate::error::ApiError;
use crate::App;
use axum::http::header::{HOST, ORIGIN};
use axum::http::{HeaderMap, Method};
use gapless_protocol::codes::ErrorCode;
use std::sync::Arc;

/// What a WebSocket handshake may do, with the guard against cross-site
/// WebSocket hijacking (docs/security.md, "The cookie and foreign pages").
///
/// Browsers send a page's WebSocket handshake with the server's cookies,
/// whatever the page's origin, and apply no CORS to it. So when the
/// handshake's credential is the [`COOKIE`](crate::auth::COOKIE) cookie (no
/// `Authorization` header) on a server with keys, its page must not be
/// foreign ([`foreign_page`]: the origin is the server's own or one listed
/// by `--cors-origin`). From a foreign page the cookie is never the
/// credential: the `access_token` parameter is, when the handshake has one
/// (a foreign page can send a token it was given, not read the cookie),
/// else the handshake is refused.
///
/// # Errors
/// Outer: 403 `forbidden` before the upgrade, naming the origin and
/// `--cors-origin`. Inner: the token's refusal, sent after the upgrade
/// (the WebSocket transport's `refuse`).
pub(crate) fn access(
    app: &App,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Result<Arc<Grant>, ApiError>, ApiError> {
    guarded(app, headers, query, "WebSocket handshake")
}

/// What an HTTP request with `method` may do, with the same guard as
/// [`access`] against cross-site request forgery on writes: a method other
/// than `GET`, `HEAD` or `OPTIONS` whose credential is the cookie must not
/// come from a foreign page ([`foreign_page`]). A form or `text/plain`
/// POST needs no CORS preflight, so a browser sends it from any page with
/// the cookie; CORS hides only the answer, after the write is done. Reads
/// are not guarded here: CORS already keeps their answers from foreign
/// pages.
///
/// # Errors
/// 403 `forbidden` naming the origin and `--cors-origin`, before the
/// handler runs; 401 `unauthorized` for a missing or failing token.
pub(crate) fn http_access(
    app: &App,
    method: &Method,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Arc<Grant>, ApiError> {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return app.auth.grant_of(headers, query);
    }
    guarded(app, headers, query, "request")?
}

/// The guard of [`access`] and [`http_access`]; `what` names the request
/// in the refusal ("WebSocket handshake", "request").
fn guarded(
    app: &App,
    headers: &HeaderMap,
    query: Option<&str>,
    what: &str,
) -> Result<Result<Arc<Grant>, ApiError>, ApiError> {
    if app.auth.is_open() || !Auth::cookie_is_credential(headers) {
        return Ok(app.auth.grant_of(headers, query));
    }
    let Some(page) = foreign_page(&app.config.cors_origins, headers) else {
        return Ok(app.auth.grant_of(headers, query));
    };
    let has_query_token = form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .any(|(k, v)| k == crate::auth::QUERY && !v.is_empty());
    if has_query_token {
        return Ok(app.auth.grant_of_query(query));
    }
    let host = headers.get(HOST).and_then(|h| h.to_str().ok());
    tracing::debug!(
        page,
        what,
        "a cookie credential from a foreign page: refused"
    );
    Err(ApiError::new(
        ErrorCode::Forbidden,
        format!(
            "this {what}'s credential is the {cookie} cookie, and its page ({page}) is neither \
             this server's own ({host}) nor one allowed by --cors-origin: browsers send the \
             cookie with any page's request, so it is honoured for WebSockets and writes only \
             from those origins (cross-site request forgery; docs/security.md). If the page is \
             yours, add its origin to --cors-origin; or send the token as \
             `Authorization: Bearer` or ?{query_param}=",
            cookie = crate::auth::COOKIE,
            host = host.unwrap_or("no Host header"),
            query_param = crate::auth::QUERY,
        ),
    ))
}

/// The page a browser request with `headers` comes from, described for a
/// refusal, when that page is foreign: its `Origin` is neither the
/// server's own (the same host and port as the `Host` header; a port left
/// out is the scheme's default, 80 or 443) nor one of `cors_origins`
/// (`--cors-origin`, normalised by [`parse_origin`]; `*` lists none, since
/// it allows no credentials); `null` is foreign. Without `Origin`, the
/// request is foreign only when it says `Sec-Fetch-Site: cross-site`:
/// browsers send `Origin` on every WebSocket handshake and on every
/// cross-origin or same-origin POST, so a request without it is a
/// program's, which chose to send the cookie. `None`: not foreign.
pub(crate) fn foreign_page(cors_origins: &[String], headers: &HeaderMap) -> Option<String> {
    let Some(origin) = headers.get(ORIGIN) else {
        let cross = headers
            .get("sec-fetch-site")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"cross-site"));
        return cross.then(|| "no Origin, Sec-Fetch-Site: cross-site".to_owned());
    };
    let origin = String::from_utf8_lossy(origin.as_bytes()).into_owned();
    let listed = cors_origins
        .iter()
        .map(|o| o.trim().trim_end_matches('/'))
        .any(|o| o != "*" && o.eq_ignore_ascii_case(&origin));
    let host = headers.get(HOST).and_then(|h| h.to_str().ok());
    if listed || host.is_some_and(|h| same_origin(&origin, h)) {
        None
    } else {
        Some(format!("origin {origin:?}"))
    }
}

/// A `--cors-origin` value as the `Origin` header spells it: `*`, or
/// `scheme://host[:port]` with scheme `http` or `https`, no path, query,
/// user or fragment; a trailing `/` is dropped (`https://app.example.com/`
/// is `https://app.example.com`), and scheme and host are lowercased.
///
/// # Errors
/// A message saying what an origin looks like, for any other value (a
/// bare host such as `app.example.com` would never match a browser's
/// `Origin`).
pub fn parse_origin(s: &str) -> Result<String, String> {
    use axum::http::uri::Uri;
    let t = s.trim();
    if t == "*" {
        return Ok("*".to_owned());
    }
    let bad = |why: &str| {
        format!(
            "--cors-origin {s:?} is not an origin ({why}): an origin is scheme://host[:port] \
             with scheme http or https and no path, as a browser's Origin header spells it \
             (https://app.example.com, http://localhost:5173), or `*` for any origin without \
             credentials"
        )
    };
    let bare = t.strip_suffix('/').unwrap_or(t);
    let uri = bare.parse::<Uri>().map_err(|e| bad(&e.to_string()))?;
    let scheme = match uri.scheme_str() {
        Some(sc) if sc.eq_ignore_ascii_case("http") || sc.eq_ignore_ascii_case("https") => {
            sc.to_ascii_lowercase()
        }
        Some(_) => return Err(bad("the scheme must be http or https")),
        None => return Err(bad("no scheme")),
    };
    let Some(auth) = uri.authority() else {
        return Err(bad("no host"));
    };
    if auth.as_str().contains('@') {
        return Err(bad("it names a user"));
    }
    if auth.host().is_empty() {
        return Err(bad("no host"));
    }
    if uri
        .path_and_query()
        .is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty())
        || bare.contains('#')
    {
        return Err(bad("it has a path, query or fragment"));
    }
    Ok(format!("{scheme}://{}", auth.as_str().to_ascii_lowercase()))
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
