//! The reserved subscription APIs of Durable Streams (PROTOCOL.md 6 and 7):
//! `{root}/__ds/subscriptions/:id` (create, re-confirm, read, delete),
//! explicit stream membership, webhook delivery with callbacks, pull-wake
//! claim / ack / release, generation fencing and leases, and the webhook
//! signing keys at `{root}/__ds/jwks.json`.
//!
//! `{root}` is whatever precedes the `__ds` segment under `--ds-prefix`
//! (the conformance suite uses `v1/stream`): a subscription's `pattern`,
//! `streams[]` and `wake_stream` are paths relative to it, and its id is
//! unique per root.
//!
//! **Durable**: every change of a subscription (its definition, links,
//! `acked_offset`s, generation, wake, lease, failures and retry time) is
//! journaled before it is answered ([`sub_meta`]), read back at the start
//! and, in cluster mode, followed by every node; a change computed on a
//! stale view loses to the one stored first and is computed again, so two
//! nodes never both claim one wake. The webhook signing key comes from a
//! key file (`--ds-signing-key`, by default in the data directory).
//!
//! Delivery runs on one background task, started with the server, that
//! looks at every subscription each [`SCAN_EVERY`]: it links streams newly
//! matching a pattern, expires leases, and issues a wake (a webhook
//! request, or wake events appended to the wake stream) when a linked
//! stream's tail is past its `acked_offset` and the subscription is idle.
//! Looking rather than being told keeps appends made through gapless's own
//! API (not only Durable Streams appends) waking subscribers. In cluster
//! mode only the node holding the delivery lease ([`sub_meta::delivering`])
//! runs it, so a wake is sent once, not once per node.
//!
//! Authorization (gapless's own tokens, docs/durable-streams.md): managing a
//! subscription and claiming it need `subscribe` on every channel under the
//! root (a grant pattern covering the root's channel prefix), a pull-wake
//! subscription also `publish` on its wake stream's channel; callbacks, acks
//! and releases are authorized by the wake's own token instead; the JWK Set
//! is public.

use super::sub_meta::{self, Key, Tx};
use super::webhook::{self, Signer};
use super::{api_error, fork, names, streams::Stream, Ds};
use crate::auth::{Access, Action, Grant};
use crate::App;
use axum::body::Body;
use axum::extract::{FromRequestParts, Request};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use gapless_core::journal::{now_ms, JournalError};
use gapless_protocol::NewEvent;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Starts a change of a subscription ([`Tx::begin`]), or returns the
/// journal's refusal (503 while it cannot be read).
macro_rules! begin {
    ($app:expr, $ds:expr, $key:expr) => {
        match Tx::begin($app, $ds, $key).await {
            Ok(tx) => tx,
            Err(e) => return api_error(e.into()),
        }
    };
}

/// Journals `$new` in `$tx` and returns `$answer`; when another node changed
/// the subscription first, goes round the enclosing `loop` to compute the
/// change again; returns the journal's refusal when it fails.
macro_rules! write_or_retry {
    ($tx:expr, $new:expr, $answer:expr) => {
        match $tx.write($new).await {
            Ok(true) => return $answer,
            Ok(false) => continue,
            Err(e) => return api_error(e.into()),
        }
    };
}

/// How often the delivery task looks at every subscription.
pub const SCAN_EVERY: Duration = Duration::from_millis(50);
/// The lease a subscription gets when it names none (PROTOCOL.md 6.2).
pub const DEFAULT_LEASE_MS: u64 = 30_000;
/// The shortest and longest lease a subscription may ask for (1 s to 10 min).
pub const LEASE_RANGE_MS: (u64, u64) = (1_000, 600_000);
/// The largest subscription request body, in bytes.
pub const MAX_BODY: usize = 64 * 1024;
/// Most explicit streams one subscription may name.
pub const MAX_STREAMS: usize = 1000;

/// The subscription `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Kind {
    Webhook,
    PullWake,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Webhook => "webhook",
            Kind::PullWake => "pull-wake",
        }
    }
}

/// A subscription's configuration, normalized (explicit streams sorted,
/// without duplicates). Two `PUT`s re-confirm when their configurations are
/// equal: the comparison of normalized configurations the protocol asks of
/// a hash (PROTOCOL.md 6.2), done directly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Config {
    kind: Kind,
    pattern: Option<Vec<String>>,
    streams: Vec<String>,
    webhook_url: Option<String>,
    wake_stream: Option<String>,
    lease_ttl_ms: u64,
    description: Option<String>,
}

/// One linked stream of a subscription (PROTOCOL.md 6.1).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Link {
    explicit: bool,
    glob: bool,
    /// The last processed offset, inclusive; `None`: before the stream's
    /// first message (a stream discovered by its first append, or named
    /// before it existed).
    acked: Option<String>,
}

impl Link {
    fn link_type(&self) -> &'static str {
        if self.explicit {
            "explicit"
        } else {
            "glob"
        }
    }
}

/// The wake in flight.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Wake {
    id: String,
    /// The SHA-256 (base64url) of the callback (webhook) or claim
    /// (pull-wake) token: the token itself is only ever sent to its
    /// receiver, never journaled. A pull-wake wake has none until claimed.
    token_hash: Option<String>,
    /// The pull-wake worker holding the lease.
    holder: Option<String>,
    /// When the lease ends (Unix ms); `None` while a pull-wake waits for a claim.
    lease_until: Option<u64>,
    /// The tails the wake was issued with (path, offset), auto-acked on a
    /// webhook's `{"done": true}`.
    snapshot: Vec<(String, String)>,
}

/// One subscription: what its records hold ([`sub_meta`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sub {
    id: String,
    root: String,
    config: Config,
    /// `http(s)://host/PREFIX/ROOT`, from the creating request: the base of
    /// `callback_url` and `jwks_url`.
    base_url: String,
    created_at: String,
    links: BTreeMap<String, Link>,
    generation: u64,
    wake: Option<Wake>,
    /// Consecutive failed webhook deliveries (0: `active`).
    failures: u32,
    /// No wake before this (Unix ms): the webhook retry schedule.
    next_attempt_at: u64,
}

/// Every subscription of the server (as journaled, [`sub_meta::Log`]); the
/// signing key; the delivery task's flag.
#[derive(Default)]
pub struct Subscriptions {
    /// The subscriptions, read from their records.
    pub log: sub_meta::Log,
    signer: tokio::sync::OnceCell<Signer>,
    started: AtomicBool,
}

impl Subscriptions {
    /// The webhook signing key: `--ds-signing-key` (or the data
    /// directory's); in cluster mode without one, the key every node shares
    /// (read at its first use, and asked again after a failure); else one
    /// made for this process (`--memory`).
    ///
    /// # Errors
    /// The shared key cannot be read now (Redis unreachable).
    async fn signer(&self, app: &App) -> Result<&Signer, String> {
        let config = &app.config;
        self.signer
            .get_or_try_init(|| async {
                match (&config.ds_signing_key, &config.ds_shared_signing_key) {
                    (Some(k), _) => Ok(Signer::from_bytes(&k.0)),
                    (None, Some(shared)) => shared.get().await.map(|k| Signer::from_bytes(&k.0)),
                    (None, None) => Ok(Signer::generate()),
                }
            })
            .await
    }
}

fn key(root: &str, id: &str) -> Key {
    (root.to_owned(), id.to_owned())
}

/// The hash a wake keeps of its token ([`Wake::token_hash`]).
fn token_hash(token: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(token.as_bytes()))
}

/// Where the `__ds` segment splits a path under the prefix: the root before
/// it (maybe empty) and the rest after it. `None` when no segment is `__ds`.
pub fn split(rest: &str) -> Option<(String, String)> {
    let segs: Vec<&str> = rest.split('/').collect();
    let i = segs.iter().position(|s| *s == "__ds")?;
    Some((segs[..i].join("/"), segs[i + 1..].join("/")))
}

/// A refusal of the subscription APIs, in the protocol's shape
/// `{"error": {"code": CODE, "message": …}}` (PROTOCOL.md 7.1).
fn refuse(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    refuse_with(status, json!({ "code": code, "message": message.into() }))
}

fn refuse_with(status: StatusCode, error: Value) -> Response {
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

/// Answers a request under `{root}/__ds/`; `rest` is the path after `__ds/`
/// (still percent-encoded).
pub async fn handle(
    app: &Arc<App>,
    ds: &Arc<Ds>,
    req: Request,
    root: String,
    rest: &str,
) -> Response {
    let method = req.method().clone();
    if rest == "jwks.json" {
        if method != Method::GET && method != Method::HEAD {
            return refuse(
                StatusCode::METHOD_NOT_ALLOWED,
                "METHOD_NOT_ALLOWED",
                "the JWK Set answers GET",
            );
        }
        let signer = match ds.subs.signer(app).await {
            Ok(s) => s,
            Err(e) => {
                return refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "UNAVAILABLE",
                    format!("the cluster's webhook signing key cannot be read now: {e}"),
                )
            }
        };
        let mut r = json_answer(StatusCode::OK, &signer.jwks());
        let h = r.headers_mut();
        h.insert(
            axum::http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/jwk-set+json"),
        );
        h.insert(
            axum::http::header::CACHE_CONTROL,
            HeaderValue::from_static("public, max-age=300"),
        );
        return r;
    }
    let Some(after) = rest.strip_prefix("subscriptions/") else {
        return refuse(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            format!("no reserved API at __ds/{rest}; see PROTOCOL.md section 6"),
        );
    };
    let (id, op) = after.split_once('/').unwrap_or((after, ""));
    if !valid_id(id) {
        return refuse(
            StatusCode::BAD_REQUEST,
            "INVALID_SUBSCRIPTION_ID",
            "a subscription id is 1 to 200 of A-Z a-z 0-9 _ - . : @",
        );
    }
    if !root.is_empty() {
        if let Err(names::BadPath(m)) = names::channel_of(&root) {
            return refuse(StatusCode::BAD_REQUEST, "INVALID_STREAM_PATH", m);
        }
    }
    // The streams' metadata (links name streams) is read back first.
    if let Err(r) = super::ready(app, ds).await {
        return r;
    }
    let (mut parts, body) = req.into_parts();
    // The wake-scoped operations carry the wake's token, not a gapless one.
    match (&method, op) {
        (&Method::POST, "callback") => {
            return fenced_op(app, ds, &parts.headers, &root, id, body, Op::Callback).await
        }
        (&Method::POST, "ack") => {
            return fenced_op(app, ds, &parts.headers, &root, id, body, Op::Ack).await
        }
        (&Method::POST, "release") => {
            return fenced_op(app, ds, &parts.headers, &root, id, body, Op::Release).await
        }
        _ => {}
    }
    let grant = match Access::from_request_parts(&mut parts, app).await {
        Ok(Access(g)) => g,
        Err(e) => return e.into_response(),
    };
    if !covers_root(&grant, &root) {
        return refuse(
            StatusCode::FORBIDDEN,
            "FORBIDDEN",
            format!(
                "managing or claiming a subscription under {root:?} needs `subscribe` on every \
                 channel under it (a grant pattern covering {:?})",
                root_prefix(&root)
            ),
        );
    }
    let base_url = base_url(app, &parts.headers, &root);
    match (&method, op) {
        (&Method::PUT, "") => create(app, ds, &grant, &root, id, base_url, body).await,
        (&Method::GET, "") => {
            if let Err(e) = sub_meta::sync(app, ds).await {
                return api_error(e.into());
            }
            match ds.subs.log.get(&key(&root, id)).1 {
                Some(s) => json_answer(StatusCode::OK, &view(app, ds, &s).await),
                None => not_found(id),
            }
        }
        // Deletion journals a tombstone: a callback, ack or release still
        // holding the subscription finds none and advances nothing.
        (&Method::DELETE, "") => {
            let mut tx = begin!(app, ds, key(&root, id));
            loop {
                if tx.current().is_none() {
                    return not_found(id);
                }
                write_or_retry!(tx, None, StatusCode::NO_CONTENT.into_response());
            }
        }
        (&Method::POST, "streams") => add_streams(app, ds, &root, id, body).await,
        (&Method::POST, "claim") => claim(app, ds, &root, id, body).await,
        (&Method::DELETE, op) if op.starts_with("streams/") => {
            let Some(path) = names::percent_decode(&op["streams/".len()..]) else {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    "INVALID_STREAM_PATH",
                    "the stream path is not valid percent-encoded UTF-8",
                );
            };
            let mut tx = begin!(app, ds, key(&root, id));
            loop {
                let Some(cur) = tx.current() else {
                    return not_found(id);
                };
                let mut s = (*cur).clone();
                let matches = s.config.pattern.as_ref().is_some_and(|p| glob(p, &path));
                if let Some(l) = s.links.get_mut(&path) {
                    l.explicit = false;
                    l.glob |= matches;
                    if !l.glob {
                        s.links.remove(&path);
                    }
                }
                s.config.streams.retain(|p| *p != path);
                write_or_retry!(tx, Some(s), StatusCode::NO_CONTENT.into_response());
            }
        }
        _ => refuse(
            StatusCode::METHOD_NOT_ALLOWED,
            "METHOD_NOT_ALLOWED",
            format!("{method} __ds/subscriptions/{after} is not an operation of PROTOCOL.md 6-7"),
        ),
    }
}

fn not_found(id: &str) -> Response {
    refuse(
        StatusCode::NOT_FOUND,
        "SUBSCRIPTION_NOT_FOUND",
        format!("no subscription {id:?}"),
    )
}

fn valid_id(id: &str) -> bool {
    (1..=200).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:@".contains(&b))
}

/// The channel prefix of every stream under `root` (`""` for the empty root).
fn root_prefix(root: &str) -> String {
    if root.is_empty() {
        String::new()
    } else {
        names::channel_of(root)
            .map(|c| format!("{c}{}", names::SEPARATOR))
            .unwrap_or_default()
    }
}

/// Whether `grant` may subscribe to every channel under `root`.
fn covers_root(grant: &Grant, root: &str) -> bool {
    let prefix = root_prefix(root);
    grant.subscribe.0.iter().any(|p| p.covers_prefix(&prefix))
}

/// The full path (under the prefix) of `rel` under `root`.
fn full(root: &str, rel: &str) -> String {
    if root.is_empty() {
        rel.to_owned()
    } else {
        format!("{root}/{rel}")
    }
}

/// `scheme://host/PREFIX[/ROOT]` of the request (`https` when the request
/// says `X-Forwarded-Proto: https`).
fn base_url(app: &App, headers: &axum::http::HeaderMap, root: &str) -> String {
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

/// A glob over path segments: `*` one segment, `**` zero or more (PROTOCOL.md 6.2).
fn glob(pattern: &[String], path: &str) -> bool {
    fn go(p: &[String], s: &[&str]) -> bool {
        match p.split_first() {
            None => s.is_empty(),
            Some((h, rest)) if h == "**" => (0..=s.len()).any(|i| go(rest, &s[i..])),
            Some((h, rest)) => !s.is_empty() && (h == "*" || h == s[0]) && go(rest, &s[1..]),
        }
    }
    let segs: Vec<&str> = path.split('/').collect();
    go(pattern, &segs)
}

/// A stream path of a request body, relative to `root`: it must name a channel.
fn rel_path(root: &str, v: &Value, field: &str) -> Result<String, Response> {
    let p = v.as_str().ok_or_else(|| {
        refuse(
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            format!("{field} must be a stream path (a string)"),
        )
    })?;
    names::channel_of(&full(root, p))
        .map_err(|names::BadPath(m)| refuse(StatusCode::BAD_REQUEST, "INVALID_STREAM_PATH", m))?;
    Ok(p.to_owned())
}

async fn body_json(body: Body) -> Result<Value, Response> {
    let bytes = axum::body::to_bytes(body, MAX_BODY).await.map_err(|_| {
        refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "TOO_LARGE",
            format!("a subscription request body is at most {MAX_BODY} bytes"),
        )
    })?;
    if bytes.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        refuse(
            StatusCode::BAD_REQUEST,
            "INVALID_JSON",
            format!("the body is not JSON: {e}"),
        )
    })
}

fn bad(m: impl Into<String>) -> Response {
    refuse(StatusCode::BAD_REQUEST, "INVALID_REQUEST", m)
}

/// Reads and validates a subscription configuration (PROTOCOL.md 6.2).
fn parse_config(app: &App, root: &str, v: &Value) -> Result<Config, Response> {
    let kind = match v.get("type").and_then(Value::as_str) {
        Some("webhook") => Kind::Webhook,
        Some("pull-wake") => Kind::PullWake,
        _ => return Err(bad("type must be \"webhook\" or \"pull-wake\"")),
    };
    let pattern = match v.get("pattern") {
        None | Some(Value::Null) => None,
        Some(Value::String(p)) => {
            let segs: Vec<String> = p.split('/').map(str::to_owned).collect();
            if segs.iter().any(String::is_empty) {
                return Err(bad(format!(
                    "pattern {p:?} has an empty segment; a pattern is segments joined by `/`, \
                     `*` matching one segment and `**` any number"
                )));
            }
            Some(segs)
        }
        Some(_) => return Err(bad("pattern must be a string")),
    };
    let mut streams = Vec::new();
    match v.get("streams") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) => {
            if a.len() > MAX_STREAMS {
                return Err(bad(format!("streams names at most {MAX_STREAMS} paths")));
            }
            for s in a {
                streams.push(rel_path(root, s, "each of streams")?);
            }
        }
        Some(_) => return Err(bad("streams must be an array of stream paths")),
    }
    streams.sort();
    streams.dedup();
    if pattern.is_none() && streams.is_empty() {
        return Err(bad("a subscription needs a pattern or streams (or both)"));
    }
    let webhook_url = match (kind, v.get("webhook").and_then(|w| w.get("url"))) {
        (Kind::Webhook, Some(Value::String(u))) => {
            if let Err(m) = webhook::check_url(u, app.config.ds_webhook_allow_loopback) {
                return Err(refuse(StatusCode::BAD_REQUEST, "WEBHOOK_URL_REJECTED", m));
            }
            Some(u.clone())
        }
        (Kind::Webhook, _) => return Err(bad("a webhook subscription needs webhook.url")),
        (Kind::PullWake, _) => None,
    };
    let wake_stream = match (kind, v.get("wake_stream")) {
        (Kind::PullWake, Some(w)) => Some(rel_path(root, w, "wake_stream")?),
        (Kind::PullWake, None) => return Err(bad("a pull-wake subscription needs wake_stream")),
        (Kind::Webhook, _) => None,
    };
    if let Some(w) = wake_stream.as_ref().filter(|w| streams.contains(w)) {
        return Err(bad(format!(
            "the wake stream {w:?} cannot be one of the subscription's streams (its wake events \
             would wake it without end)"
        )));
    }
    let lease_ttl_ms = match v.get("lease_ttl_ms") {
        None | Some(Value::Null) => DEFAULT_LEASE_MS,
        Some(n) => match n.as_u64() {
            Some(n) if (LEASE_RANGE_MS.0..=LEASE_RANGE_MS.1).contains(&n) => n,
            _ => {
                return Err(bad(format!(
                    "lease_ttl_ms must be an integer from {} to {}",
                    LEASE_RANGE_MS.0, LEASE_RANGE_MS.1
                )))
            }
        },
    };
    let description = match v.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) if d.len() <= 1024 => Some(d.clone()),
        Some(_) => return Err(bad("description must be a string of at most 1024 bytes")),
    };
    Ok(Config {
        kind,
        pattern,
        streams,
        webhook_url,
        wake_stream,
        lease_ttl_ms,
        description,
    })
}

/// A stream's offsets now: (start, tail). `None` when no stream is at the path.
async fn offsets(app: &App, ds: &Ds, root: &str, rel: &str) -> Option<(String, String)> {
    let channel = names::channel_of(&full(root, rel)).ok()?;
    let stream: Stream = ds.streams.load(&app.hub, &channel).await.ok()??;
    let mut m = stream.lock().await;
    if m.deleted || m.soft_deleted {
        return None;
    }
    let tail = fork::synced_tail(app, &mut m).await.ok()?;
    Some((
        names::offset(m.epoch, m.layout.start()),
        names::offset(m.epoch, tail),
    ))
}

/// `PUT {root}/__ds/subscriptions/:id`.
async fn create(
    app: &Arc<App>,
    ds: &Arc<Ds>,
    grant: &Grant,
    root: &str,
    id: &str,
    base_url: String,
    body: Body,
) -> Response {
    let v = match body_json(body).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let config = match parse_config(app, root, &v) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if let Some(w) = &config.wake_stream {
        let channel = names::channel_of(&full(root, w)).unwrap_or_default();
        if let Err(e) = grant.require(Action::Publish, &channel) {
            return e.into_response();
        }
        if !matches!(ds.streams.load(&app.hub, &channel).await, Ok(Some(_))) {
            return refuse(
                StatusCode::BAD_REQUEST,
                "WAKE_STREAM_NOT_FOUND",
                format!("no stream at wake_stream {w:?}; create it first (PROTOCOL.md 7.2)"),
            );
        }
    }
    start(app, ds);
    let mut tx = begin!(app, ds, key(root, id));
    loop {
        if let Some(existing) = tx.current() {
            if existing.config == config {
                return json_answer(StatusCode::OK, &view(app, ds, &existing).await);
            }
            return refuse(
                StatusCode::CONFLICT,
                "SUBSCRIPTION_EXISTS",
                format!("subscription {id:?} exists with another configuration"),
            );
        }
        let max = app.config.ds_max_subscriptions;
        if ds.subs.log.count() >= max {
            return refuse(
                StatusCode::FORBIDDEN,
                "SUBSCRIPTION_LIMIT",
                format!("this server holds at most {max} subscriptions (--ds-max-subscriptions)"),
            );
        }
        let mut sub = Sub {
            id: id.to_owned(),
            root: root.to_owned(),
            config: config.clone(),
            base_url: base_url.clone(),
            created_at: rfc3339_ms(now_ms()),
            links: BTreeMap::new(),
            generation: 0,
            wake: None,
            failures: 0,
            next_attempt_at: 0,
        };
        // Existing streams are linked at their tail: creation replays nothing.
        for p in sub.config.streams.clone() {
            let acked = offsets(app, ds, root, &p).await.map(|o| o.1);
            sub.links.insert(
                p,
                Link {
                    explicit: true,
                    glob: false,
                    acked,
                },
            );
        }
        if let Some(pattern) = sub.config.pattern.clone() {
            let wake_stream = sub.config.wake_stream.as_deref();
            let found = match existing(app, ds, root, &pattern, wake_stream).await {
                Ok(found) => found,
                Err(e) => return api_error(e.into()),
            };
            for rel in found {
                let acked = offsets(app, ds, root, &rel).await.map(|o| o.1);
                let l = sub.links.entry(rel).or_default();
                l.glob = true;
                if l.acked.is_none() {
                    l.acked = acked;
                }
            }
        }
        let created = json_answer(StatusCode::CREATED, &view(app, ds, &sub).await);
        write_or_retry!(tx, Some(sub), created);
    }
}

/// The most streams a pattern links when its subscription is created.
pub const MAX_PATTERN_LINKS: usize = 10_000;

/// The stream paths under `root` that `pattern` matches at a subscription's
/// creation: every stream of the journal under the root
/// (`Hub::channels_with_meta`, so also those made on other nodes and never
/// served here), at most [`MAX_PATTERN_LINKS`], with the ones this node
/// caches ([`matching`]).
async fn existing(
    app: &App,
    ds: &Ds,
    root: &str,
    pattern: &[String],
    wake_stream: Option<&str>,
) -> Result<Vec<String>, JournalError> {
    let prefix = root_prefix(root);
    let listed = app
        .hub
        .channels_with_meta(&prefix, MAX_PATTERN_LINKS)
        .await?;
    let mut found: std::collections::BTreeSet<String> = listed
        .iter()
        .filter_map(|c| c.strip_prefix(prefix.as_str()).map(names::path_of))
        .filter(|rel| glob(pattern, rel) && Some(rel.as_str()) != wake_stream)
        .collect();
    found.extend(matching(ds, root, pattern, wake_stream));
    Ok(found.into_iter().collect())
}

/// The stream paths under `root` (relative) that `pattern` matches among
/// the streams this node caches (a stream made on another node is cached
/// here when its creation is heard while subscriptions exist, `mod.rs`
/// `listen`), except the subscription's own wake stream (its wake events would wake it
/// again, without end).
fn matching(ds: &Ds, root: &str, pattern: &[String], wake_stream: Option<&str>) -> Vec<String> {
    let prefix = root_prefix(root);
    ds.streams
        .channels()
        .into_iter()
        .filter_map(|c| c.strip_prefix(prefix.as_str()).map(names::path_of))
        .filter(|rel| glob(pattern, rel) && Some(rel.as_str()) != wake_stream)
        .collect()
}

/// A subscription as `GET` answers it (PROTOCOL.md 6.3).
async fn view(app: &App, ds: &Ds, s: &Sub) -> Value {
    let mut streams = Vec::new();
    for (path, l) in &s.links {
        let acked = match &l.acked {
            Some(a) => a.clone(),
            None => offsets(app, ds, &s.root, path)
                .await
                .map_or_else(|| "-1".to_owned(), |o| o.0),
        };
        streams.push(json!({ "path": path, "link_type": l.link_type(), "acked_offset": acked }));
    }
    let kid = ds.subs.signer(app).await.ok().map(|s| s.kid.clone());
    let webhook = s.config.webhook_url.as_ref().map(|u| {
        json!({
            "url": u,
            "signing": {
                "alg": "ed25519",
                "kid": kid,
                "jwks_url": format!("{}/__ds/jwks.json", s.base_url),
            }
        })
    });
    json!({
        "id": s.id,
        "subscription_id": s.id,
        "type": s.config.kind.as_str(),
        "pattern": s.config.pattern.as_ref().map(|p| p.join("/")),
        "streams": streams,
        "webhook": webhook,
        "wake_stream": s.config.wake_stream,
        "lease_ttl_ms": s.config.lease_ttl_ms,
        "created_at": s.created_at,
        "status": if s.failures > 0 { "failed" } else { "active" },
        "description": s.config.description,
        "generation": s.generation,
    })
}

/// `POST {root}/__ds/subscriptions/:id/streams`: adds explicit links at the
/// streams' tails (idempotent).
async fn add_streams(app: &App, ds: &Ds, root: &str, id: &str, body: Body) -> Response {
    let v = match body_json(body).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let Some(list) = v.get("streams").and_then(Value::as_array) else {
        return bad("the body is {\"streams\": [PATH, …]}");
    };
    let mut paths = Vec::new();
    for p in list {
        match rel_path(root, p, "each of streams") {
            Ok(p) => paths.push(p),
            Err(r) => return r,
        }
    }
    let mut tx = begin!(app, ds, key(root, id));
    loop {
        let Some(cur) = tx.current() else {
            return not_found(id);
        };
        let mut s = (*cur).clone();
        if s.config.streams.len() + paths.len() > MAX_STREAMS {
            return bad(format!(
                "a subscription names at most {MAX_STREAMS} streams"
            ));
        }
        for p in &paths {
            if !s.config.streams.contains(p) {
                s.config.streams.push(p.clone());
                s.config.streams.sort();
            }
            let known = s.links.contains_key(p);
            let acked = if known {
                None
            } else {
                offsets(app, ds, root, p).await.map(|o| o.1)
            };
            let l = s.links.entry(p.clone()).or_default();
            l.explicit = true;
            if !known {
                l.acked = acked;
            }
        }
        write_or_retry!(tx, Some(s), StatusCode::NO_CONTENT.into_response());
    }
}

/// A linked stream in a wake: its offsets and whether work is pending.
struct Pending {
    path: String,
    link_type: &'static str,
    acked: String,
    tail: String,
    pending: bool,
}

impl Pending {
    fn json(&self) -> Value {
        json!({
            "path": self.path,
            "link_type": self.link_type,
            "acked_offset": self.acked,
            "tail_offset": self.tail,
            "has_pending": self.pending,
        })
    }
}

/// Whether offset `tail` is past `acked`: offsets of one epoch sort
/// byte-wise; across epochs (history lost) any difference is work.
fn after(tail: &str, acked: &str) -> bool {
    if tail.len() == acked.len() && tail.get(..16) == acked.get(..16) {
        tail > acked
    } else {
        tail != acked
    }
}

/// The linked streams that exist now, with their offsets.
async fn snapshot(app: &App, ds: &Ds, s: &Sub) -> Vec<Pending> {
    let mut out = Vec::new();
    for (path, l) in &s.links {
        let Some((start, tail)) = offsets(app, ds, &s.root, path).await else {
            continue;
        };
        let acked = l.acked.clone().unwrap_or(start);
        let pending = after(&tail, &acked);
        out.push(Pending {
            path: path.clone(),
            link_type: l.link_type(),
            acked,
            tail,
            pending,
        });
    }
    out
}

fn token() -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
}

fn wake_id() -> String {
    format!("w_{:016x}", rand::random::<u64>())
}

/// Starts the delivery task once (at the server's start, `mod.rs`): it
/// reads the records back, follows them in cluster mode every
/// [`sub_meta::FOLLOW_MS`], and, while this node delivers
/// ([`sub_meta::delivering`]), looks at every subscription each
/// [`SCAN_EVERY`] and rewrites records that grew old.
pub fn start(app: &Arc<App>, ds: &Arc<Ds>) {
    if ds.subs.started.swap(true, Ordering::SeqCst) {
        return;
    }
    if tokio::runtime::Handle::try_current().is_err() {
        ds.subs.started.store(false, Ordering::SeqCst);
        return;
    }
    let (app, ds) = (app.clone(), ds.clone());
    tokio::spawn(async move {
        let mut followed = 0u64;
        let mut compacted = 0u64;
        let mut failing = false;
        loop {
            tokio::select! {
                () = app.shutdown.cancelled() => break,
                () = tokio::time::sleep(SCAN_EVERY) => {}
            }
            let now = now_ms();
            let every = if ds.subs.log.count() > 0 {
                sub_meta::FOLLOW_MS
            } else {
                sub_meta::IDLE_FOLLOW_MS
            };
            let follow = app.config.cluster && now.saturating_sub(followed) >= every;
            if !ds.subs.log.loaded() || follow {
                followed = now;
                match sub_meta::catch_up(&app, &ds).await {
                    // Logged once per outage, not every tick.
                    Err(e) => {
                        if !failing {
                            failing = true;
                            tracing::warn!(error = %e, "could not read the Durable Streams subscriptions' records; retrying");
                        }
                        continue;
                    }
                    Ok(()) if failing => {
                        failing = false;
                        tracing::info!("reading the Durable Streams subscriptions' records again");
                    }
                    Ok(()) => {}
                }
            }
            let keys = ds.subs.log.keys();
            if keys.is_empty()
                || super::ready(&app, &ds).await.is_err()
                || !sub_meta::delivering(&app, &ds).await
            {
                continue;
            }
            if now.saturating_sub(compacted) >= 1000 {
                compacted = now;
                sub_meta::compact(&app, &ds).await;
            }
            for k in keys {
                scan(&app, &ds, &k).await;
            }
        }
        let _ = tokio::time::timeout(Duration::from_millis(500), sub_meta::resign(&app, &ds)).await;
    });
}

/// What a look at a subscription leaves to do once its record is written.
enum Next {
    Nothing,
    /// Send this webhook wake (its record is written).
    Send {
        url: String,
        body: Value,
        generation: u64,
        wake_id: String,
    },
    /// Append these wake events, then record the wake of `generation`.
    PullWake {
        wake_stream: String,
        events: Vec<NewEvent>,
        generation: u64,
    },
}

/// Journals `$new` in `$tx` and returns `Ok($ret)`; when another node
/// changed the subscription first, goes round the enclosing `loop`.
macro_rules! write_then {
    ($tx:expr, $new:expr, $ret:expr) => {
        if $tx.write($new).await? {
            return Ok($ret);
        }
        continue;
    };
}

/// One look at a subscription: new glob links, lease expiry, a wake when
/// work is pending and the subscription is idle.
async fn scan(app: &Arc<App>, ds: &Arc<Ds>, k: &Key) {
    match look(app, ds, k).await {
        Ok(Next::Nothing) => {}
        Ok(Next::Send {
            url,
            body,
            generation,
            wake_id,
        }) => {
            let (app, ds, k) = (app.clone(), ds.clone(), k.clone());
            tokio::spawn(async move {
                send(&app, &ds, &k, &url, body, generation, &wake_id).await;
            });
        }
        Ok(Next::PullWake {
            wake_stream,
            events,
            generation,
        }) => pull_wake(app, ds, k, &wake_stream, events, generation).await,
        // The next look tries again; the records' reader logs outages.
        Err(e) => tracing::debug!(subscription = %k.1, error = %e, "a subscription's look failed"),
    }
}

/// The change of [`scan`], journaled; what is left to do after it.
async fn look(app: &App, ds: &Ds, k: &Key) -> Result<Next, JournalError> {
    let now = now_ms();
    let mut tx = Tx::begin_on_view(app, ds, k.clone()).await;
    loop {
        let Some(cur) = tx.current() else {
            return Ok(Next::Nothing);
        };
        // Copied only when something changes.
        let mut changed: Option<Sub> = None;
        if let Some(pattern) = &cur.config.pattern {
            let found: Vec<String> =
                matching(ds, &cur.root, pattern, cur.config.wake_stream.as_deref())
                    .into_iter()
                    .filter(|rel| !cur.links.get(rel).is_some_and(|l| l.glob))
                    .collect();
            if !found.is_empty() {
                let s = changed.get_or_insert_with(|| (*cur).clone());
                for rel in found {
                    // Discovered by its append: linked before it (acked: none).
                    s.links.entry(rel).or_default().glob = true;
                }
            }
        }
        if cur
            .wake
            .as_ref()
            .is_some_and(|w| w.lease_until.is_some_and(|t| t <= now))
        {
            changed.get_or_insert_with(|| (*cur).clone()).wake = None;
        }
        let s: &Sub = changed.as_ref().unwrap_or(&cur);
        let snap = if s.wake.is_none() && now >= s.next_attempt_at {
            snapshot(app, ds, s).await
        } else {
            Vec::new()
        };
        if !snap.iter().any(|p| p.pending) {
            match changed {
                Some(s) => {
                    write_then!(tx, Some(s), Next::Nothing);
                }
                None => return Ok(Next::Nothing),
            }
        }
        let generation = s.generation + 1;
        match (s.config.kind, s.config.webhook_url.clone()) {
            (Kind::Webhook, Some(url)) => {
                let mut s = changed.unwrap_or_else(|| (*cur).clone());
                let tok = token();
                let id = wake_id();
                s.generation = generation;
                s.wake = Some(Wake {
                    id: id.clone(),
                    token_hash: Some(token_hash(&tok)),
                    holder: None,
                    lease_until: Some(now + s.config.lease_ttl_ms),
                    snapshot: snap
                        .iter()
                        .map(|p| (p.path.clone(), p.tail.clone()))
                        .collect(),
                });
                let body = json!({
                    "subscription_id": s.id,
                    "wake_id": id,
                    "generation": generation,
                    "streams": snap.iter().map(Pending::json).collect::<Vec<_>>(),
                    "callback_url": format!("{}/__ds/subscriptions/{}/callback", s.base_url, s.id),
                    "callback_token": tok,
                });
                // Recorded before it is sent: the node whose record is
                // stored sends it, once.
                write_then!(
                    tx,
                    Some(s),
                    Next::Send {
                        url,
                        body,
                        generation,
                        wake_id: id,
                    }
                );
            }
            (Kind::Webhook, None) => return Ok(Next::Nothing),
            (Kind::PullWake, _) => {
                let events: Vec<NewEvent> = snap
                    .iter()
                    .filter(|p| p.pending)
                    .map(|p| NewEvent {
                        event_type: None,
                        data: gapless_protocol::Payload::Text(
                            json!({
                                "type": "wake",
                                "subscription_id": s.id,
                                "stream": p.path,
                                "generation": generation,
                                "ts": now,
                            })
                            .to_string(),
                        ),
                    })
                    .collect();
                let next = Next::PullWake {
                    wake_stream: s.config.wake_stream.clone().unwrap_or_default(),
                    events,
                    generation,
                };
                // The wake events go before the wake's record: a crash
                // between them leaves a wake event the next wake repeats,
                // never a recorded wake no worker heard of.
                match changed {
                    Some(s) => {
                        write_then!(tx, Some(s), next);
                    }
                    None => return Ok(next),
                }
            }
        }
    }
}

/// Writes a pull-wake subscription's wake events, then records the wake of
/// `generation` (or the failure and its retry time), unless the
/// subscription moved on meanwhile.
async fn pull_wake(
    app: &App,
    ds: &Ds,
    k: &Key,
    wake_stream: &str,
    events: Vec<NewEvent>,
    generation: u64,
) {
    let written = append_wake(app, ds, &k.0, wake_stream, events).await;
    if let Err(m) = &written {
        tracing::warn!(subscription = %k.1, "pull-wake: writing to the wake stream failed: {m}");
    }
    let recorded = async {
        let mut tx = Tx::begin(app, ds, k.clone()).await?;
        loop {
            let Some(cur) = tx.current() else {
                return Ok(());
            };
            if cur.generation + 1 != generation || cur.wake.is_some() {
                return Ok(());
            }
            let mut s = (*cur).clone();
            match &written {
                Ok(()) => {
                    s.failures = 0;
                    s.generation = generation;
                    s.wake = Some(Wake {
                        id: wake_id(),
                        token_hash: None,
                        holder: None,
                        lease_until: None,
                        snapshot: Vec::new(),
                    });
                }
                Err(_) => {
                    s.failures = s.failures.saturating_add(1);
                    s.next_attempt_at = now_ms() + webhook::backoff(s.failures).as_millis() as u64;
                }
            }
            write_then!(tx, Some(s), ());
        }
    };
    let recorded: Result<(), JournalError> = recorded.await;
    if let Err(e) = recorded {
        tracing::warn!(subscription = %k.1, error = %e, "pull-wake: could not record the wake");
    }
}

/// Appends wake events to the wake stream (JSON messages), under its lock,
/// unless it is gone or closed.
async fn append_wake(
    app: &App,
    ds: &Ds,
    root: &str,
    wake_stream: &str,
    events: Vec<NewEvent>,
) -> Result<(), String> {
    let channel = names::channel_of(&full(root, wake_stream)).map_err(|e| e.0)?;
    let stream = ds
        .streams
        .load(&app.hub, &channel)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no stream at {wake_stream:?}"))?;
    let m = stream.lock().await;
    if m.deleted || m.soft_deleted || m.closed {
        return Err(format!(
            "the wake stream {wake_stream:?} is closed or deleted"
        ));
    }
    crate::ops::publish::batch(app, &Grant::all(), None, &channel, events, None)
        .await
        .map(|_| ())
        .map_err(|e| format!("{e:?}"))
}

/// Delivers one webhook wake and records its answer, if the wake is still
/// the current one.
async fn send(app: &App, ds: &Ds, k: &Key, url: &str, body: Value, generation: u64, wake: &str) {
    let bytes = body.to_string().into_bytes();
    let t = now_ms() / 1000;
    let cfg = &app.config;
    let signer = ds.subs.signer(app).await;
    let res = match (url::Url::parse(url), signer) {
        (_, Err(e)) => Err(format!("no signing key: {e}")),
        (Ok(u), Ok(signer)) => {
            let sig = signer.signature(t, &bytes);
            webhook::deliver(
                &u,
                bytes,
                sig,
                Duration::from_millis(cfg.ds_webhook_timeout_ms),
                cfg.ds_webhook_allow_loopback,
            )
            .await
        }
        (Err(e), Ok(_)) => Err(e.to_string()),
    };
    let recorded = async {
        let mut tx = Tx::begin(app, ds, k.clone()).await?;
        loop {
            let Some(cur) = tx.current() else {
                return Ok(0);
            };
            if cur.generation != generation || cur.wake.as_ref().is_none_or(|w| w.id != wake) {
                return Ok(0);
            }
            let mut s = (*cur).clone();
            match &res {
                Ok(d) if d.done => {
                    s.failures = 0;
                    let snap = s.wake.take().map(|w| w.snapshot).unwrap_or_default();
                    for (path, tail) in snap {
                        ack(&mut s, &path, tail);
                    }
                }
                // Processing asynchronously: the receiver calls back.
                Ok(_) if cur.failures == 0 => return Ok(0),
                Ok(_) => s.failures = 0,
                Err(_) => {
                    s.failures = s.failures.saturating_add(1);
                    s.wake = None;
                    s.next_attempt_at = now_ms() + webhook::backoff(s.failures).as_millis() as u64;
                }
            }
            let attempt = s.failures;
            write_then!(tx, Some(s), attempt);
        }
    };
    let recorded: Result<u32, JournalError> = recorded.await;
    if let Err(m) = &res {
        let attempt = recorded.as_ref().copied().unwrap_or(0);
        tracing::warn!(subscription = %k.1, attempt, "webhook delivery failed: {m}");
    }
    if let Err(e) = recorded {
        tracing::warn!(subscription = %k.1, error = %e, "could not record a webhook delivery's answer");
    }
}

/// Moves a link's `acked_offset` forward to `offset` (never back).
fn ack(s: &mut Sub, path: &str, offset: String) {
    if let Some(l) = s.links.get_mut(path) {
        if l.acked.as_ref().is_none_or(|a| after(&offset, a)) {
            l.acked = Some(offset);
        }
    }
}

/// `POST …/claim` (pull-wake, PROTOCOL.md 7.2): the lease to the first
/// worker; 409 `ALREADY_CLAIMED` while another holds it. Journaled before
/// the answer, so two workers claiming through two nodes at once never both
/// get the lease.
async fn claim(app: &App, ds: &Ds, root: &str, id: &str, body: Body) -> Response {
    let v = match body_json(body).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let worker = match v.get("worker") {
        Some(Value::String(w)) if !w.is_empty() && w.len() <= 200 => w.clone(),
        _ => return bad("the body is {\"worker\": NAME} (1 to 200 bytes)"),
    };
    let mut tx = begin!(app, ds, key(root, id));
    loop {
        let Some(cur) = tx.current() else {
            return not_found(id);
        };
        if cur.config.kind != Kind::PullWake {
            return bad("claim is for pull-wake subscriptions; this one is delivered by webhook");
        }
        let now = now_ms();
        if let Some(w) = &cur.wake {
            if let (Some(h), Some(until)) = (&w.holder, w.lease_until) {
                if until > now {
                    return refuse_with(
                        StatusCode::CONFLICT,
                        json!({
                            "code": "ALREADY_CLAIMED",
                            "current_holder": h,
                            "generation": cur.generation,
                        }),
                    );
                }
            }
        }
        let mut s = (*cur).clone();
        // An unclaimed wake is taken as it is; otherwise a new generation.
        let wake_id = match &s.wake {
            Some(w) if w.holder.is_none() => w.id.clone(),
            _ => {
                s.generation += 1;
                wake_id()
            }
        };
        let snap = snapshot(app, ds, &s).await;
        let tok = token();
        s.wake = Some(Wake {
            id: wake_id.clone(),
            token_hash: Some(token_hash(&tok)),
            holder: Some(worker.clone()),
            lease_until: Some(now + s.config.lease_ttl_ms),
            snapshot: snap
                .iter()
                .map(|p| (p.path.clone(), p.tail.clone()))
                .collect(),
        });
        let claimed = json_answer(
            StatusCode::OK,
            &json!({
                "wake_id": wake_id,
                "generation": s.generation,
                "token": tok,
                "streams": snap.iter().map(Pending::json).collect::<Vec<_>>(),
                "lease_ttl_ms": s.config.lease_ttl_ms,
            }),
        );
        write_or_retry!(tx, Some(s), claimed);
    }
}

/// A wake-scoped operation.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    /// Webhook callback: acks, heartbeat, done.
    Callback,
    /// Pull-wake ack: the same.
    Ack,
    /// Pull-wake release: ends the lease without acks.
    Release,
}

/// Callback, ack and release (PROTOCOL.md 7.1-7.3): the bearer token, the
/// `generation` and the `wake_id` must all be the current wake's, else 409
/// `FENCED` (401 without a token). Acks, lease extensions and the wake's end
/// are journaled before the answer.
async fn fenced_op(
    app: &App,
    ds: &Ds,
    headers: &axum::http::HeaderMap,
    root: &str,
    id: &str,
    body: Body,
    op: Op,
) -> Response {
    let bearer = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned);
    let Some(bearer) = bearer else {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            "send the wake's token (callback_token, or the claim's token) as Authorization: Bearer",
        );
    };
    let v = match body_json(body).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let presented = token_hash(&bearer);
    let mut tx = begin!(app, ds, key(root, id));
    loop {
        let Some(cur) = tx.current() else {
            return not_found(id);
        };
        let kind_ok = match op {
            Op::Callback => cur.config.kind == Kind::Webhook,
            Op::Ack | Op::Release => cur.config.kind == Kind::PullWake,
        };
        if !kind_ok {
            return bad(format!(
                "this operation is not for a {} subscription",
                cur.config.kind.as_str()
            ));
        }
        let current = cur.wake.as_ref().is_some_and(|w| {
            w.token_hash
                .as_deref()
                .is_some_and(|h| constant_eq(h, &presented))
                && v.get("wake_id").and_then(Value::as_str) == Some(w.id.as_str())
        }) && v.get("generation").and_then(Value::as_u64) == Some(cur.generation);
        if !current {
            return refuse(
                StatusCode::CONFLICT,
                "FENCED",
                "the wake is not the current one (stale generation, wake_id or token)",
            );
        }
        let mut s = (*cur).clone();
        if op == Op::Release {
            s.wake = None;
            write_or_retry!(tx, Some(s), StatusCode::NO_CONTENT.into_response());
        }
        let mut acks = Vec::new();
        match v.get("acks") {
            None | Some(Value::Null) => {}
            Some(Value::Array(a)) => {
                for item in a {
                    let (Some(path), Some(off)) = (
                        item.get("stream").and_then(Value::as_str),
                        item.get("offset").and_then(Value::as_str),
                    ) else {
                        return bad("each ack is {\"stream\": PATH, \"offset\": OFFSET}");
                    };
                    if !s.links.contains_key(path) {
                        return bad(format!("{path:?} is not a stream of this subscription"));
                    }
                    if !matches!(names::parse_offset(Some(off)), Ok(names::Offset::At { .. })) {
                        return bad(format!("{off:?} is not a stream offset"));
                    }
                    acks.push((path.to_owned(), off.to_owned()));
                }
            }
            Some(_) => return bad("acks must be an array"),
        }
        for (path, off) in acks {
            ack(&mut s, &path, off);
        }
        let done = v.get("done").and_then(Value::as_bool).unwrap_or(false);
        if !done {
            // A heartbeat: the lease is extended (and journaled, so every
            // node sees it held).
            let until = now_ms() + s.config.lease_ttl_ms;
            if let Some(w) = s.wake.as_mut() {
                w.lease_until = Some(until);
            }
            let ok = json_answer(StatusCode::OK, &json!({ "ok": true, "next_wake": false }));
            write_or_retry!(tx, Some(s), ok);
        }
        s.wake = None;
        // Whether work remains: the delivery task wakes again for it.
        let next = snapshot(app, ds, &s).await.iter().any(|p| p.pending);
        let ok = json_answer(StatusCode::OK, &json!({ "ok": true, "next_wake": next }));
        write_or_retry!(tx, Some(s), ok);
    }
}

fn constant_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// Unix milliseconds as RFC 3339 UTC with milliseconds.
fn rfc3339_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_segments() {
        let p = |s: &str| s.split('/').map(str::to_owned).collect::<Vec<_>>();
        assert!(glob(&p("events/*"), "events/a"));
        assert!(!glob(&p("events/*"), "events/a/b"));
        assert!(!glob(&p("events/*"), "events"));
        assert!(glob(&p("events/**"), "events"));
        assert!(glob(&p("events/**"), "events/a/b"));
        assert!(glob(&p("**/x"), "a/b/x"));
        assert!(!glob(&p("other/*"), "events/a"));
    }

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

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_778_284_800_123), "2026-05-09T00:00:00.123Z");
    }

    #[test]
    fn offsets_compare_within_an_epoch() {
        let a = "00000000000000ab_00000000000000000009";
        let b = "00000000000000ab_00000000000000000010";
        assert!(after(b, a));
        assert!(!after(a, b));
        assert!(!after(a, a));
        assert!(after("00000000000000ac_00000000000000000001", a));
    }
}
