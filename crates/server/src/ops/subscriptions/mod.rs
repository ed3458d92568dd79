//! Durable Streams subscriptions (PROTOCOL.md 6 and 7) as the product
//! keeps them, below any transport: webhook and pull-wake subscriptions,
//! their links (explicit and by pattern), wakes with generations and
//! fencing, leases, claims, acks and the retry schedule.
//!
//! - [`model`]: what a subscription is, and the pure rules over it (its
//!   configuration, globs, offset order, tokens);
//! - [`store`]: where each one is journaled (its own reserved channel,
//!   changed by the journal's compare-and-set), the per-root indexes, the
//!   node's bounded cache;
//! - [`rules`]: the operations the protocol's APIs ask for (create,
//!   re-confirm, read, delete, membership, claim, callback, ack, release),
//!   each journaled before it answers;
//! - [`deliver`]: the node that delivers (one per cluster, by a lease in
//!   the journal), woken by the linked streams' commits, stream creations
//!   and its own timers (leases, retries), never by a scan;
//! - [`signing`]: the webhook signing key, the SSRF rule, the backoff;
//! - [`upgrade`]: the records older releases kept in one channel, imported.
//!
//! The webhook request itself is a transport's (a [`Poster`], given by the
//! Durable Streams room). docs/durable-streams.md, "Subscriptions", gives
//! the design.

use crate::error::ApiError;
use crate::ops::streams::Streams;
use crate::App;
use futures::future::BoxFuture;
use gapless_core::journal::JournalError;
use signing::Signer;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, OnceCell};

pub mod deliver;
pub mod fenced;
pub mod model;
pub mod rules;
pub mod signing;
pub mod store;
pub mod upgrade;

/// Why a subscription operation was refused. Each maps to one code of the
/// protocol's refusal shape `{"error": {"code": CODE, "message": …}}`
/// ([`Error::code`]), except [`Error::Api`], a gapless refusal (a token's,
/// the journal's) in gapless's own shape.
#[derive(Debug)]
pub enum Error {
    /// 400 `INVALID_REQUEST`.
    Invalid(String),
    /// 400 `INVALID_JSON`.
    Json(String),
    /// 400 `INVALID_STREAM_PATH`.
    Path(String),
    /// 400 `INVALID_SUBSCRIPTION_ID`.
    Id,
    /// 400 `WEBHOOK_URL_REJECTED`, saying why.
    WebhookUrl(String),
    /// 400 `WAKE_STREAM_NOT_FOUND`: the wake stream's path.
    WakeStream(String),
    /// 404 `SUBSCRIPTION_NOT_FOUND`: the id.
    NotFound(String),
    /// 409 `SUBSCRIPTION_EXISTS`: the id.
    Exists(String),
    /// 403 `SUBSCRIPTION_LIMIT`: `--ds-max-subscriptions`.
    Limit(usize),
    /// 409 `ALREADY_CLAIMED`: another worker's lease runs.
    Claimed {
        /// The worker holding it.
        holder: String,
        /// The current generation.
        generation: u64,
    },
    /// 409 `FENCED`: not the current wake.
    Fenced,
    /// 401 `UNAUTHORIZED`: no wake token.
    Unauthorized,
    /// 403 `FORBIDDEN`, saying what is needed.
    Forbidden(String),
    /// 413 `TOO_LARGE`.
    TooLarge,
    /// 503 `UNAVAILABLE`: the cluster's signing key cannot be read now.
    Unavailable(String),
    /// A gapless refusal (authorization, the journal).
    Api(ApiError),
}

impl Error {
    /// The HTTP status and the protocol's code (`None` for [`Error::Api`]).
    pub fn code(&self) -> (u16, Option<&'static str>) {
        match self {
            Error::Invalid(_) => (400, Some("INVALID_REQUEST")),
            Error::Json(_) => (400, Some("INVALID_JSON")),
            Error::Path(_) => (400, Some("INVALID_STREAM_PATH")),
            Error::Id => (400, Some("INVALID_SUBSCRIPTION_ID")),
            Error::WebhookUrl(_) => (400, Some("WEBHOOK_URL_REJECTED")),
            Error::WakeStream(_) => (400, Some("WAKE_STREAM_NOT_FOUND")),
            Error::NotFound(_) => (404, Some("SUBSCRIPTION_NOT_FOUND")),
            Error::Exists(_) => (409, Some("SUBSCRIPTION_EXISTS")),
            Error::Limit(_) => (403, Some("SUBSCRIPTION_LIMIT")),
            Error::Claimed { .. } => (409, Some("ALREADY_CLAIMED")),
            Error::Fenced => (409, Some("FENCED")),
            Error::Unauthorized => (401, Some("UNAUTHORIZED")),
            Error::Forbidden(_) => (403, Some("FORBIDDEN")),
            Error::TooLarge => (413, Some("TOO_LARGE")),
            Error::Unavailable(_) => (503, Some("UNAVAILABLE")),
            Error::Api(e) => (e.code.status(), None),
        }
    }

    /// The refusal's message (the protocol leaves the wording to the server).
    pub fn message(&self) -> String {
        match self {
            Error::Invalid(m)
            | Error::Json(m)
            | Error::Path(m)
            | Error::WebhookUrl(m)
            | Error::Forbidden(m) => m.clone(),
            Error::Id => "a subscription id is 1 to 200 of A-Z a-z 0-9 _ - . : @".into(),
            Error::WakeStream(w) => {
                format!("no stream at wake_stream {w:?}; create it first (PROTOCOL.md 7.2)")
            }
            Error::NotFound(id) => format!("no subscription {id:?}"),
            Error::Exists(id) => format!("subscription {id:?} exists with another configuration"),
            Error::Limit(max) => {
                format!("this server holds at most {max} subscriptions (--ds-max-subscriptions)")
            }
            Error::Claimed { holder, .. } => format!("the wake is claimed by {holder:?}"),
            Error::Fenced => {
                "the wake is not the current one (stale generation, wake_id or token)".into()
            }
            Error::Unauthorized => "send the wake's token (callback_token, or the claim's token) \
                                    as Authorization: Bearer"
                .into(),
            Error::TooLarge => format!(
                "a subscription request body is at most {} bytes",
                rules::MAX_BODY
            ),
            Error::Unavailable(m) => {
                format!("the cluster's webhook signing key cannot be read now: {m}")
            }
            Error::Api(e) => e.message.clone(),
        }
    }
}

impl From<JournalError> for Error {
    fn from(e: JournalError) -> Self {
        Error::Api(e.into())
    }
}

impl From<ApiError> for Error {
    fn from(e: ApiError) -> Self {
        Error::Api(e)
    }
}

/// One webhook request to send ([`Poster`]).
#[derive(Debug, Clone)]
pub struct Post {
    /// The receiver (checked by [`signing::check_url`] at creation; its
    /// addresses are checked again, with [`signing::internal`], when sent).
    pub url: url::Url,
    /// The JSON body.
    pub body: Vec<u8>,
    /// The `Webhook-Signature` value.
    pub signature: String,
    /// The longest the request may take (`--ds-webhook-timeout-ms`).
    pub timeout: Duration,
    /// `--ds-webhook-allow-loopback`.
    pub allow_loopback: bool,
}

/// The answer of a delivered webhook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    /// Whether the receiver answered `{"done": true}` (PROTOCOL.md 7.1).
    pub done: bool,
}

/// Sends one webhook request; `Err` says what failed (resolution, address,
/// connection, timeout, an answer other than 2xx). A transport's.
pub type Poster = Arc<dyn Fn(Post) -> BoxFuture<'static, Result<Delivered, String>> + Send + Sync>;

/// The subscriptions of a node: their cache, the signing key, the
/// delivery task's inbox.
pub struct Subscriptions {
    /// The subscriptions read, and their per-node locks.
    pub store: store::Store,
    signer: OnceCell<Signer>,
    ready: OnceCell<()>,
    poster: Poster,
    /// This process's name in the delivery lease (random at start).
    pub node: String,
    /// Whether this node delivers now (the delivery task sets it).
    delivering: AtomicBool,
    /// Whether a subscription was seen since start (one changed, or the
    /// delivery task read one): only then can a stream's change concern
    /// delivery, so a server without subscriptions tells its task nothing
    /// of the streams' appends.
    seen: AtomicBool,
    signals: mpsc::UnboundedSender<deliver::Signal>,
    inbox: parking_lot::Mutex<Option<mpsc::UnboundedReceiver<deliver::Signal>>>,
}

impl std::fmt::Debug for Subscriptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriptions").finish_non_exhaustive()
    }
}

impl Subscriptions {
    /// The subscriptions of a node whose webhooks `poster` sends.
    pub fn new(poster: Poster) -> Self {
        let (signals, inbox) = mpsc::unbounded_channel();
        Subscriptions {
            store: store::Store::default(),
            signer: OnceCell::new(),
            ready: OnceCell::new(),
            poster,
            node: format!("n{:016x}", rand::random::<u64>()),
            delivering: AtomicBool::new(false),
            seen: AtomicBool::new(false),
            signals,
            inbox: parking_lot::Mutex::new(Some(inbox)),
        }
    }

    /// The journal changed `channel`'s metadata, here or on another node
    /// (`CommitSink::meta_changed`): a cached subscription is forgotten,
    /// and the delivery task, if this node delivers, is told (a
    /// subscription changed or appeared, a stream was created). Called
    /// where the journal commits: it neither blocks nor awaits.
    pub fn meta_changed(&self, channel: &str) {
        let ours = channel.starts_with("gapless/ds-sub");
        if channel.starts_with(store::SUB_PREFIX) {
            self.store.forget(channel);
            self.seen.store(true, Ordering::Release);
        }
        let concerns = self.delivering.load(Ordering::Acquire) && self.seen.load(Ordering::Acquire);
        if ours || concerns {
            let _ = self.signals.send(deliver::Signal::Meta(channel.to_owned()));
        }
    }

    /// Notes that a subscription exists (the delivery task read one).
    pub(crate) fn saw_one(&self) {
        self.seen.store(true, Ordering::Release);
    }

    /// The webhook signing key: `--ds-signing-key` (or the data
    /// directory's); in cluster mode without one, the key every node shares
    /// (read at its first use, and asked again after a failure); else one
    /// made for this process (`--memory`).
    ///
    /// # Errors
    /// The shared key cannot be read now (Redis unreachable).
    pub async fn signer(&self, app: &App) -> Result<&Signer, String> {
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

/// What every operation needs: the server, the streams' cache (links name
/// streams), the subscriptions. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Cx {
    /// The shared state.
    pub app: Arc<App>,
    /// The Durable Streams streams this node serves.
    pub streams: Arc<Streams>,
    /// The subscriptions.
    pub subs: Arc<Subscriptions>,
}

impl Cx {
    /// Makes the journal ready for subscriptions, once per process: the
    /// streams' and the subscriptions' records of older releases imported
    /// ([`crate::ops::streams::upgrade`], [`upgrade`]).
    ///
    /// # Errors
    /// [`JournalError`] when the journal cannot be read or written (the
    /// next call tries again).
    pub async fn ready(&self) -> Result<(), JournalError> {
        self.subs
            .ready
            .get_or_try_init(|| async {
                crate::ops::streams::upgrade::run(&self.app).await?;
                upgrade::run(&self.app).await.map(|_| ())
            })
            .await
            .map(|_| ())
    }

    /// Whether a request reads a subscription from the journal rather than
    /// from the cache: in cluster mode always (another node's change may
    /// not have been announced here yet), else the cache is current.
    pub fn fresh(&self) -> bool {
        self.app.config.cluster
    }
}
