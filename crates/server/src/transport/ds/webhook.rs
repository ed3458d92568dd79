//! The webhook request of Durable Streams subscriptions (PROTOCOL.md 7.1,
//! 12.8): the room's [`Poster`] for `ops::subscriptions`, which decides
//! when to send what, signs it and records the answer. Here: resolve the
//! host, check every address is public (`signing::internal`), `POST` to the
//! address checked (no second resolution to swap it), follow no redirect.

use crate::ops::subscriptions::signing::internal;
use crate::ops::subscriptions::{Delivered, Post, Poster};
use std::net::SocketAddr;
use std::sync::Arc;

/// The [`Poster`] the room gives the subscriptions.
pub(crate) fn poster() -> Poster {
    Arc::new(|p: Post| Box::pin(deliver(p)))
}

/// POSTs `p.body` (JSON) to `p.url` with its `Webhook-Signature`, waiting
/// at most `p.timeout`. Redirects are not followed (they could lead to an
/// internal address). A host name is resolved here and every address it
/// resolves to must be public (unless it is a loopback address and
/// `p.allow_loopback`).
///
/// # Errors
/// What failed: the resolution, the address check, the connection, or an
/// answer other than 2xx.
async fn deliver(p: Post) -> Result<Delivered, String> {
    let url = &p.url;
    let mut builder = reqwest::Client::builder()
        .timeout(p.timeout)
        .redirect(reqwest::redirect::Policy::none());
    if let Some(url::Host::Domain(domain)) = url.host() {
        let port = url.port_or_known_default().unwrap_or(443);
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((domain, port))
            .await
            .map_err(|e| format!("resolving {domain}: {e}"))?
            .collect();
        let ok = |a: &SocketAddr| !internal(a.ip()) || (p.allow_loopback && a.ip().is_loopback());
        let first = addrs
            .first()
            .copied()
            .ok_or_else(|| format!("{domain} resolves to no address"))?;
        if let Some(bad) = addrs.iter().find(|a| !ok(a)) {
            return Err(format!(
                "{domain} resolves to {}, an internal network address",
                bad.ip()
            ));
        }
        builder = builder.resolve(domain, first);
    }
    let client = builder.build().map_err(|e| format!("HTTP client: {e}"))?;
    let resp = client
        .post(url.clone())
        .header("content-type", "application/json")
        .header("webhook-signature", p.signature)
        .body(p.body)
        .send()
        .await
        .map_err(|e| format!("POST {url}: {e}"))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!("POST {url}: the receiver answered {status}"));
    }
    // A body that is not JSON, or has no `done`, means "processing
    // asynchronously": the receiver calls back.
    let bytes = resp.bytes().await.unwrap_or_default();
    let done = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.get("done").and_then(serde_json::Value::as_bool))
        .unwrap_or(false);
    Ok(Delivered { done })
}
