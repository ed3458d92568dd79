//! The HTTP side of the reserved subscription APIs of Durable Streams
//! (PROTOCOL.md 6 and 7): `{root}/__ds/subscriptions/:id` (create,
//! re-confirm, read, delete), explicit stream membership, claim, callback,
//! ack and release, and the JWK Set at `{root}/__ds/jwks.json`.
//!
//! `{root}` is whatever precedes the `__ds` segment under `--ds-prefix`
//! (the conformance suite uses `v1/stream`). This module reads the request
//! (path, token, body) into a call of `ops::subscriptions`, which holds the
//! rules, the journaling and the delivery, and writes the answer; a refusal
//! is written in the protocol's shape `{"error": {"code": CODE, "message":
//! …}}` (PROTOCOL.md 7.1), a gapless refusal (a token's, the journal's) in
//! gapless's own.

use super::Ds;
use crate::auth::Access;
use crate::ops::streams::names;
use crate::ops::subscriptions::fenced::Op;
use crate::ops::subscriptions::rules::{self, MAX_BODY};
use crate::ops::subscriptions::{Cx, Error};
use crate::App;
use axum::body::Body;
use axum::extract::{FromRequestParts, Request};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::sync::Arc;

/// Where the `__ds` segment splits a path under the prefix: the root before
/// it (maybe empty) and the rest after it. `None` when no segment is `__ds`.
pub(crate) fn split(rest: &str) -> Option<(String, String)> {
    let segs: Vec<&str> = rest.split('/').collect();
    let i = segs.iter().position(|s| *s == "__ds")?;
    Some((segs[..i].join("/"), segs[i + 1..].join("/")))
}

/// The operations context of the room's state.
pub(crate) fn cx(app: &Arc<App>, ds: &Ds) -> Cx {
    Cx {
        app: app.clone(),
        streams: ds.streams.clone(),
        subs: ds.subs.clone(),
    }
}

/// A refusal of the subscription APIs, in the protocol's shape
/// `{"error": {"code": CODE, "message": …}}`; a gapless refusal in its own.
fn refuse(e: Error) -> Response {
    let (status, code) = e.code();
    let Some(code) = code else {
        return match e {
            Error::Api(e) => e.into_response(),
            _ => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        };
    };
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    let error = match &e {
        Error::Claimed { holder, generation } => json!({
            "code": code,
            "current_holder": holder,
            "generation": generation,
        }),
        _ => json!({ "code": code, "message": e.message() }),
    };
    json_answer(status, &json!({ "error": error }))
}

fn json_answer(status: StatusCode, v: &Value) -> Response {
    let mut r = (status, v.to_string()).into_response();
    r.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn answer(r: Result<Response, Error>) -> Response {
    r.unwrap_or_else(refuse)
}

/// Answers a request under `{root}/__ds/`; `rest` is the path after `__ds/`
/// (still percent-encoded).
pub(crate) async fn handle(
    app: &Arc<App>,
    ds: &Arc<Ds>,
    req: Request,
    root: String,
    rest: &str,
) -> Response {
    let cx = cx(app, ds);
    if rest == "jwks.json" {
        return answer(jwks(&cx, req.method()).await);
    }
    let Some(after) = rest.strip_prefix("subscriptions/") else {
        return refuse_with(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("no reserved API at __ds/{rest}; see PROTOCOL.md section 6"),
        );
    };
    let (id, op) = after.split_once('/').unwrap_or((after, ""));
    if let Err(e) = rules::check_names(&root, id) {
        return refuse(e);
    }
    // The streams' metadata (links name streams) is read back first.
    if let Err(r) = super::ready(app, ds).await {
        return r;
    }
    if let Err(e) = cx.ready().await {
        return refuse(e.into());
    }
    let method = req.method().clone();
    let (mut parts, body) = req.into_parts();
    // The wake-scoped operations carry the wake's token, not a gapless one.
    let fenced = match (&method, op) {
        (&Method::POST, "callback") => Some(Op::Callback),
        (&Method::POST, "ack") => Some(Op::Ack),
        (&Method::POST, "release") => Some(Op::Release),
        _ => None,
    };
    if let Some(op) = fenced {
        return answer(fenced_op(&cx, &parts.headers, &root, id, body, op).await);
    }
    let grant = match Access::from_request_parts(&mut parts, app).await {
        Ok(Access(g)) => g,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = rules::authorize(&grant, &root) {
        return refuse(e);
    }
    let call = Call {
        cx: &cx,
        root: &root,
        id,
    };
    match (&method, op) {
        (&Method::PUT, "") => {
            let base = base_url(app, &parts.headers, &root);
            answer(call.create(&grant, base, body).await)
        }
        (&Method::GET, "") => answer(
            cx.get(&root, id)
                .await
                .map(|v| json_answer(StatusCode::OK, &v)),
        ),
        (&Method::DELETE, "") => answer(cx.delete(&root, id).await.map(|()| no_content())),
        (&Method::POST, "streams") => answer(call.add_streams(body).await),
        (&Method::POST, "claim") => answer(call.claim(body).await),
        (&Method::DELETE, op) if op.starts_with("streams/") => {
            answer(call.remove_stream(&op["streams/".len()..]).await)
        }
        _ => refuse_with(
            StatusCode::METHOD_NOT_ALLOWED,
            "METHOD_NOT_ALLOWED",
            format!("{method} __ds/subscriptions/{after} is not an operation of PROTOCOL.md 6-7"),
        ),
    }
}

fn refuse_with(status: StatusCode, code: &str, message: String) -> Response {
    json_answer(
        status,
        &json!({ "error": { "code": code, "message": message } }),
    )
}

fn no_content() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

/// `GET {root}/__ds/jwks.json` (PROTOCOL.md 6.5).
async fn jwks(cx: &Cx, method: &Method) -> Result<Response, Error> {
    if method != Method::GET && method != Method::HEAD {
        return Ok(refuse_with(
            StatusCode::METHOD_NOT_ALLOWED,
            "METHOD_NOT_ALLOWED",
            "the JWK Set answers GET".into(),
        ));
    }
    let mut r = json_answer(StatusCode::OK, &cx.jwks().await?);
    let h = r.headers_mut();
    h.insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/jwk-set+json"),
    );
    h.insert(
        axum::http::header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=300"),
    );
    Ok(r)
}

/// One request on one subscription, authorized.
struct Call<'a> {
    cx: &'a Cx,
    root: &'a str,
    id: &'a str,
}

impl Call<'_> {
    async fn create(
        &self,
        grant: &crate::auth::Grant,
        base_url: String,
        body: Body,
    ) -> Result<Response, Error> {
        let v = body_json(body).await?;
        let (created, view) = self
            .cx
            .create(grant, self.root, self.id, base_url, &v)
            .await?;
        let status = if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        Ok(json_answer(status, &view))
    }

    async fn add_streams(&self, body: Body) -> Result<Response, Error> {
        let v = body_json(body).await?;
        self.cx.add_streams(self.root, self.id, &v).await?;
        Ok(no_content())
    }

    async fn claim(&self, body: Body) -> Result<Response, Error> {
        let v = body_json(body).await?;
        let claimed = self.cx.claim(self.root, self.id, &v).await?;
        Ok(json_answer(StatusCode::OK, &claimed))
    }

    async fn remove_stream(&self, encoded: &str) -> Result<Response, Error> {
        let path = names::percent_decode(encoded).ok_or_else(|| {
            Error::Path("the stream path is not valid percent-encoded UTF-8".into())
        })?;
        self.cx.remove_stream(self.root, self.id, &path).await?;
        Ok(no_content())
    }
}

/// Callback, ack and release: the bearer token is the wake's (401 without one).
async fn fenced_op(
    cx: &Cx,
    headers: &HeaderMap,
    root: &str,
    id: &str,
    body: Body,
    op: Op,
) -> Result<Response, Error> {
    let bearer = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or(Error::Unauthorized)?;
    let v = body_json(body).await?;
    Ok(match cx.fenced(root, id, bearer, &v, op).await? {
        Some(v) => json_answer(StatusCode::OK, &v),
        None => no_content(),
    })
}

/// `scheme://host/PREFIX[/ROOT]` of the request (`https` when the request
/// says `X-Forwarded-Proto: https`).
fn base_url(app: &App, headers: &HeaderMap, root: &str) -> String {
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("localhost");
    let scheme = match headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
    {
        Some(p) if p.trim().eq_ignore_ascii_case("https") => "https",
        _ => "http",
    };
    let prefix = app.config.ds_prefix.trim_end_matches('/');
    if root.is_empty() {
        format!("{scheme}://{host}{prefix}")
    } else {
        format!("{scheme}://{host}{prefix}/{root}")
    }
}

/// The request body as JSON (`{}` when empty), at most [`MAX_BODY`] bytes.
async fn body_json(body: Body) -> Result<Value, Error> {
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| Error::TooLarge)?;
    if bytes.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_slice(&bytes).map_err(|e| Error::Json(format!("the body is not JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_at_the_reserved_segment() {
        assert_eq!(
            split("v1/stream/__ds/subscriptions/s"),
            Some(("v1/stream".into(), "subscriptions/s".into()))
        );
        assert_eq!(
            split("__ds/jwks.json"),
            Some((String::new(), "jwks.json".into()))
        );
        assert_eq!(split("v1/stream/a"), None);
    }
}
