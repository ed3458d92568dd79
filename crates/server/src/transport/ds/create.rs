//! `PUT {stream}`: creation (PROTOCOL.md 5.1), a fork with
//! `Stream-Forked-From`: the request's headers and body in,
//! `ops::streams::create` decides, the answer's headers out.

use super::write::{body_bytes, caller};
use super::{empty, error, refuse, set, Ctx};
use crate::ops::streams::create::{self, Create};
use crate::ops::streams::fork::ForkAsk;
use crate::ops::streams::names::offset;
use axum::body::Body;
use axum::http::StatusCode;
use axum::response::Response;
use gapless_protocol::codes::ErrorCode;

/// `PUT {stream}`: creates the stream, or answers 200 when it exists with
/// the same content type, TTL or expiry, closure and fork (409 otherwise).
pub(crate) async fn create(ctx: Ctx, body: Body) -> Response {
    let mut ask = match read(&ctx) {
        Ok(a) => a,
        Err(r) => return r,
    };
    ask.body = match body_bytes(&ctx, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let done = create::create(&ctx.app, &ctx.ds.streams, &ctx.channel, caller(&ctx), &ask).await;
    let c = match done {
        Ok(c) => c,
        Err(e) => return refuse(&ctx, e),
    };
    let mut r = empty(if c.new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    });
    if c.new {
        let host = ctx.header("host").unwrap_or("localhost");
        set(&mut r, "location", format!("http://{host}{}", ctx.url_path));
    }
    set(&mut r, "content-type", &c.content_type);
    set(&mut r, "stream-next-offset", offset(c.epoch, c.tail));
    if c.closed {
        set(&mut r, "stream-closed", "true");
    }
    r
}

/// Reads and checks the request's headers (PROTOCOL.md 5.1, 4.2).
fn read(ctx: &Ctx) -> Result<Create, Response> {
    let fork = ctx.header("stream-forked-from").map(|from| ForkAsk {
        from: from.to_owned(),
        offset: ctx.header("stream-fork-offset").map(str::to_owned),
        sub: ctx.header("stream-fork-sub-offset").map(str::to_owned),
    });
    if fork.is_none()
        && (ctx.headers.contains_key("stream-fork-offset")
            || ctx.headers.contains_key("stream-fork-sub-offset"))
    {
        return Err(error(
            ErrorCode::InvalidFork,
            "Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From",
        ));
    }
    let ttl_s = ctx
        .header("stream-ttl")
        .map(gapless_protocol::ds::parse_ttl)
        .transpose()
        .map_err(|m| error(ErrorCode::InvalidTtl, m))?;
    let expires_at = match ctx.header("stream-expires-at") {
        None => None,
        Some(v) => match gapless_protocol::time::parse_rfc3339(v.trim()) {
            Ok(ms) => Some((v.trim().to_owned(), ms)),
            Err(e) => {
                return Err(error(
                    ErrorCode::InvalidExpiresAt,
                    format!(
                        "Stream-Expires-At {v:?} is not an RFC 3339 timestamp \
                         (e.g. 2030-01-02T03:04:05Z): {e}"
                    ),
                ))
            }
        },
    };
    if ttl_s.is_some() && expires_at.is_some() {
        return Err(error(
            ErrorCode::InvalidRequest,
            "give Stream-TTL or Stream-Expires-At, not both",
        ));
    }
    Ok(Create {
        content_type: ctx
            .header("content-type")
            .map(|c| c.trim().to_owned())
            .filter(|c| !c.is_empty()),
        ttl_s,
        expires_at,
        closed: ctx.closes(),
        fork,
        body: bytes::Bytes::new(),
    })
}
