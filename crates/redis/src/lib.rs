//! The cluster journal: channels kept in Redis, shared by every gapless node
//! (`gapless serve --redis URL`). Design and limits: `docs/cluster.md`.
//!
//! [`RedisJournal`] implements the same [`Journal`] trait as the embedded
//! store, so the hub, the transports and the sessions do not know which one
//! they use. Beside it, [`RedisSessions`] keeps the sessions' attach leases
//! in the same Redis (the session layer's
//! [`gapless_core::session::SessionRegistry`], which the binary builds with
//! the journal and hands to the sessions; `sessions.rs`). Every change to a channel is one Lua script (`scripts.rs`): seq
//! assignment, the idempotency check, retention, the append and the
//! notification to the other nodes happen in one atomic step, and a batch is
//! all or nothing.
//!
//! Keys (every one of a channel has its hash tag `{<channel>}`, so on Redis
//! Cluster they share its slot; nothing global lists channels or streams):
//!
//! - `gapless:{<channel>}`: the channel, a hash of its epoch, bounds,
//!   events and idempotency keys (`scripts.rs`);
//! - `gapless:{<channel>}:meta`: its metadata ([`gapless_core::meta`]), a
//!   hash of the JSON, a version, a `closed` flag the append script reads,
//!   and the token of the change that wrote it (`scripts.rs`, `META`);
//!   absent for a channel without metadata. Changed only by compare-and-set
//!   with the append it guards (`meta.rs`);
//! - `gapless:{<channel>}:pm`, `:ps`, `:pp`, `:pc`: presence (`presence.rs`);
//! - `gapless:{session/<id>}:att`, `:det`: a session's attach lease
//!   (`sessions.rs`);
//! - `gapless:{shared/<name>}`: a value shared by every node ([`SharedValues`]).
//!
//! Fan-out between nodes (`bus.rs`): the append script publishes a
//! notification on the Redis pub/sub channel `gapless:bus`
//! (`notification.rs`): `<epoch> <first> <last> <channel>`, followed by the
//! events themselves when the append is small (`inline_bytes`). A node that
//! follows the channel feeds the events it does not have yet to its hub
//! through the [`CommitSink`], exactly as its own commits: from the
//! notification when they continue exactly what it delivered before,
//! otherwise read from Redis (once per node, not per subscriber). A node
//! that sees a hole (a lost or late notification) reads the whole missing
//! range first, so the order is exact even when the bus drops a message;
//! after losing its bus connection, and every `poll_ms` anyway, it re-reads
//! the heads of the channels it follows. A change of a channel's metadata
//! also publishes `meta <node> <channel>`: the other nodes drop their cached
//! copy and call [`CommitSink::meta_changed`]. `settings.rs` reads Redis's
//! persistence settings (start-up warnings, the durability label).

mod bus;
mod codec;
mod conn;
mod ephemeral;
mod meta;
mod notification;
mod presence;
mod scripts;
mod sessions;
mod settings;

pub use presence::RedisPresence;
pub use sessions::RedisSessions;

use async_trait::async_trait;
use gapless_core::journal::{Appended, ChannelState, CommitSink, Journal, Page, TimeSeek};
use gapless_core::{JournalError, Namespaces};
use gapless_protocol::{Epoch, Event, NewEvent};
use redis::Value;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The Lua source of the append script, for measuring what Redis itself can do
/// with it (`redis-cli SCRIPT LOAD`, then `redis-benchmark … EVALSHA`; see
/// `scripts/bench-cluster.sh`). Its keys and arguments are documented in
/// `scripts.rs`: KEYS[1] = `gapless:{<channel>}`, KEYS[2] =
/// `gapless:{<channel>}:meta` (read for its `closed` flag; when only KEYS[1]
/// is given, as the benchmark does, the script derives it); ARGV = channel,
/// idempotency key (`""`: none; a node sends `<key>` LF `<token>`, or a
/// space and a token, see `scripts.rs`), max events (0: no count limit),
/// max age ms, fresh epoch, bus
/// channel, inline bytes (see [`RedisOptions::inline_bytes`]), what the
/// calling node delivered of the channel (`""`: nothing; else
/// `<epoch>:<head>:<commit time of the head event>`), token lifetime ms
/// (see [`RedisOptions::token_lifetime`]; 0: keep tokens as long as their
/// events), max bytes of retention (0: no byte limit), then one payload
/// (`n<data>`) per event. Returns `{"closed"}` for a closed channel.
pub fn append_script() -> String {
    scripts::append_source()
}

/// The Redis pub/sub channel that carries commit notifications between nodes.
pub const BUS_CHANNEL: &str = "gapless:bus";

pub use notification::DEFAULT_INLINE_BYTES;

/// Default of [`RedisOptions::keepalive_ms`]: 15 s, well inside the idle
/// limits of common proxies and load balancers (30 s and more) and of
/// managed Redis services that set one (minutes).
pub const DEFAULT_KEEPALIVE_MS: u64 = 15_000;

/// The shortest token lifetime [`RedisOptions::token_lifetime`] derives: 60 s.
pub const MIN_TOKEN_LIFETIME_MS: u64 = 60_000;

/// How the cluster journal connects and what it keeps.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// `redis://[user:password@]host:port[/db]` or `rediss://…` (TLS); with
    /// [`RedisOptions::sentinel_master`], one or more comma-separated Sentinel
    /// URLs instead (their password, if any, is also used for the primary).
    pub url: String,
    /// The Sentinel master name; `None` connects to `url` directly.
    pub sentinel_master: Option<String>,
    /// Longest wait for Redis per request, connect included, in milliseconds
    /// (default 2000): a publish fails with [`JournalError::Unavailable`] after it.
    pub timeout_ms: u64,
    /// Each channel's retention (by count, age and bytes: its namespace's),
    /// applied by the scripts: with each append, and by every script that
    /// touches a channel (a read, a state, a node's poll), so a lower limit
    /// applies to the events a channel already holds.
    pub namespaces: Arc<Namespaces>,
    /// How often, in milliseconds, a node re-reads the heads of the channels
    /// it follows (catching a notification the bus lost when no later one
    /// comes), and applies retention by age to them (default 1000; 0 = never).
    pub poll_ms: u64,
    /// The largest append, in bytes of payload (type and data of all its
    /// events), whose events the notification carries itself, so that the
    /// other nodes deliver them without reading Redis (default
    /// [`DEFAULT_INLINE_BYTES`]; 0 = never: every node reads every commit).
    /// Larger appends are notified by reference.
    pub inline_bytes: u64,
    /// How long, in milliseconds, a Redis connection may stay idle before
    /// the node sends a `PING` on it (default [`DEFAULT_KEEPALIVE_MS`]; 0 =
    /// never): the command connection when no request used it for that
    /// long, the bus connection always. Keeps connections open under Redis's
    /// idle `timeout` and proxies' idle limits longer than this; a closed one
    /// is reopened at the next request anyway (docs/cluster.md, "Idle
    /// connections").
    pub keepalive_ms: u64,
    /// How long, in milliseconds, Redis keeps the token an append request
    /// carries so that the node can send it again without it landing twice
    /// (docs/cluster.md, "Idle connections"). `None` (the default): the
    /// longer of [`MIN_TOKEN_LIFETIME_MS`] and 4 × [`RedisOptions::timeout_ms`]
    /// ([`RedisOptions::token_lifetime`]); a request is sent again only within
    /// one timeout of its first send, so that is well past its last resend,
    /// with room for Redis clocks that differ after a failover. Shorter
    /// values are for tests; `Some(0)`: this node's appends forget no
    /// tokens (another node's, or a later script once the channel was left
    /// alone for the longest lifetime asked, still may).
    pub token_lifetime_ms: Option<u64>,
    /// Testing only: drop every Nth notification received from the bus, as if
    /// the bus had lost it (0, the default, drops none).
    pub drop_notifications_every: u64,
    /// Testing only: hold back every Nth notification received from the bus
    /// and handle it after the next one, as if the bus had reordered them (0,
    /// the default, holds none).
    pub reorder_notifications_every: u64,
}

impl RedisOptions {
    /// The token lifetime in milliseconds: [`RedisOptions::token_lifetime_ms`]
    /// when set, else the longer of [`MIN_TOKEN_LIFETIME_MS`] and 4 ×
    /// [`RedisOptions::timeout_ms`] (60 s for every timeout up to 15 s).
    pub fn token_lifetime(&self) -> u64 {
        self.token_lifetime_ms
            .unwrap_or_else(|| MIN_TOKEN_LIFETIME_MS.max(self.timeout_ms.saturating_mul(4)))
    }
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            url: "redis://127.0.0.1:6379".to_owned(),
            sentinel_master: None,
            timeout_ms: 2000,
            namespaces: Arc::default(),
            poll_ms: 1000,
            inline_bytes: DEFAULT_INLINE_BYTES,
            keepalive_ms: DEFAULT_KEEPALIVE_MS,
            token_lifetime_ms: None,
            drop_notifications_every: 0,
            reorder_notifications_every: 0,
        }
    }
}

/// The journal in Redis (see the crate doc).
pub struct RedisJournal {
    inner: Arc<Inner>,
    tasks: CancellationToken,
}

impl std::fmt::Debug for RedisJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisJournal").finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    conn: conn::Connector,
    scripts: scripts::Scripts,
    sink: Arc<dyn CommitSink>,
    opts: RedisOptions,
    trackers: bus::Trackers,
    closed: AtomicBool,
    last_poll_ms: AtomicU64,
    notifications: AtomicU64,
    outcomes: bus::Outcomes,
    durability: settings::Durability,
    /// Closes a consumer of this node that another node took over.
    kick: parking_lot::RwLock<Option<KickFn>>,
    /// Per channel, the fork its epoch began with, when one did (a failover,
    /// a restart from an RDB snapshot, a loss a node noticed): `(epoch,
    /// previous epoch, fork)` (see [`Journal::fork_of`]).
    lineage: parking_lot::Mutex<std::collections::HashMap<String, (Epoch, Epoch, u64)>>,
    /// This node's name on the bus (random): it skips its own ephemeral messages.
    node: String,
    /// Called with each presence notice on the bus (`presence.rs`).
    presence: parking_lot::RwLock<Option<gapless_core::presence::NoticeFn>>,
    /// The channel metadata this node last read or wrote (`meta.rs`).
    metas: meta::Cache,
    /// The per-channel locks of [`Journal::change`] (`meta.rs`).
    locks: meta::Locks,
}

type KickFn = Box<dyn Fn(&str) + Send + Sync>;

impl RedisJournal {
    /// Prepares the journal and starts its notification listener on the
    /// current tokio runtime. It does not wait for Redis: while Redis is
    /// unreachable, requests fail with [`JournalError::Unavailable`] and
    /// connection attempts continue with backoff.
    ///
    /// # Errors
    /// [`JournalError::Storage`] when the URL (or a Sentinel URL) is invalid.
    pub fn open(opts: RedisOptions, sink: Arc<dyn CommitSink>) -> Result<Self, JournalError> {
        let urls: Vec<&str> = match opts.sentinel_master {
            None => vec![opts.url.as_str()],
            Some(_) => opts
                .url
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect(),
        };
        for (i, url) in urls.iter().enumerate() {
            conn::check_url(url).map_err(|why| {
                let which = if urls.len() > 1 {
                    format!(" (Sentinel URL {} of {})", i + 1, urls.len())
                } else {
                    String::new()
                };
                JournalError::Storage(format!("invalid Redis URL{which}: {why}"))
            })?;
        }
        let target = conn::Target::new(&opts.url, opts.sentinel_master.as_deref())
            .map_err(|e| JournalError::Storage(format!("invalid Redis URL: {e}")))?;
        let timeout = Duration::from_millis(opts.timeout_ms.max(1));
        let inner = Arc::new(Inner {
            conn: conn::Connector::new(target, timeout),
            scripts: scripts::Scripts::new(),
            sink,
            opts,
            trackers: bus::Trackers::default(),
            closed: AtomicBool::new(false),
            last_poll_ms: AtomicU64::new(0),
            notifications: AtomicU64::new(0),
            outcomes: bus::Outcomes::new(),
            durability: settings::Durability::default(),
            kick: parking_lot::RwLock::new(None),
            lineage: parking_lot::Mutex::new(std::collections::HashMap::new()),
            node: format!("{:016x}", rand::random::<u64>()),
            presence: parking_lot::RwLock::new(None),
            metas: meta::Cache::default(),
            locks: meta::Locks::default(),
        });
        let tasks = CancellationToken::new();
        tokio::spawn(bus::listen(inner.clone(), tasks.clone()));
        if inner.opts.keepalive_ms > 0 {
            tokio::spawn(keepalive(inner.clone(), tasks.clone()));
        }
        Ok(RedisJournal { inner, tasks })
    }

    /// Reads the Redis settings that durability depends on, sets the
    /// durability label from them (`settings.rs`), and returns one warning
    /// per setting that cannot give the promise (`sync`: a 2xx means the
    /// event is in the primary's AOF, fsynced: `appendonly yes` and
    /// `appendfsync always`; either way `maxmemory-policy noeviction`, since
    /// an evicted channel loses its history, which clients are told as an
    /// `epoch` gap). A Redis that refuses `CONFIG GET` gets one warning saying
    /// so, and the label `unknown`.
    ///
    /// # Errors
    /// [`JournalError::Unavailable`] when Redis cannot be reached.
    pub async fn check_settings(&self, sync: bool) -> Result<Vec<String>, JournalError> {
        match self
            .inner
            .read_settings(gapless_core::journal::now_ms())
            .await?
        {
            settings::Read::Settings(s) => Ok(s.warnings(sync)),
            settings::Read::Refused(e) => Ok(vec![format!(
                "could not read the Redis persistence settings (CONFIG GET: {e}); \
                 check appendonly, appendfsync, save and maxmemory-policy by hand"
            )]),
        }
    }

    fn fresh_epoch() -> String {
        (rand::random::<u64>() | 1).to_string()
    }
}

impl Inner {
    /// The fork point of `channel`'s epoch `to` from epoch `from`, if the
    /// scripts said `to` began so (see [`Journal::fork_of`]).
    fn fork_of(&self, channel: &str, from: Epoch, to: Epoch) -> Option<u64> {
        self.lineage
            .lock()
            .get(channel)
            .and_then(|&(epoch, prev, fork)| (epoch == to && prev == from).then_some(fork))
    }

    /// Remembers the fork `channel`'s epoch began with, if the script said so.
    fn note_lineage(
        &self,
        channel: &str,
        epoch: Epoch,
        prev: Option<&Value>,
        fork: Option<&Value>,
    ) {
        if let (Some(prev), Some(fork)) = (epoch_of(prev), int_of(fork)) {
            self.lineage
                .lock()
                .insert(channel.to_owned(), (epoch, prev, fork));
        }
    }

    /// The append script. `known`: what this node delivered of the channel
    /// (`bus::Track::arg`), so that the script forks the channel instead of
    /// appending under an epoch whose newer events Redis lost. The append
    /// always carries a token drawn for this request ([`request_token`]),
    /// with the client's key if it gave one, so that sending it again (after
    /// a connection closed under it, `conn.rs`) never appends twice; the
    /// last value says whether a duplicate was this request's own append
    /// (then reported as `duplicate: false`).
    async fn append(
        &self,
        channel: &str,
        events: &[NewEvent],
        idempotency_key: Option<&str>,
        known: &str,
    ) -> Result<(ChannelState, Appended, u64, bool), JournalError> {
        let key = scripts::key_of(channel);
        let meta_key = scripts::meta_key_of(channel);
        let token = request_token();
        let key_arg = match idempotency_key {
            Some(k) => format!("{k}\n{token}"),
            None => format!(" {token}"),
        };
        let payloads: Vec<Vec<u8>> = events.iter().map(codec::encode).collect();
        let fresh = RedisJournal::fresh_epoch();
        let r = self.opts.namespaces.retention(channel);
        let v: Vec<Value> = self
            .conn
            .run(|mut c| {
                let mut inv = self.scripts.append.prepare_invoke();
                inv.key(&key)
                    .key(&meta_key)
                    .arg(channel)
                    .arg(&key_arg)
                    .arg(r.max_events)
                    .arg(r.max_age_ms)
                    .arg(&fresh)
                    .arg(BUS_CHANNEL)
                    .arg(self.opts.inline_bytes)
                    .arg(known)
                    .arg(self.opts.token_lifetime())
                    .arg(r.max_bytes);
                for p in &payloads {
                    inv.arg(p.as_slice());
                }
                async move { inv.invoke_async(&mut c).await }
            })
            .await?;
        if matches!(v.first(), Some(Value::BulkString(b)) if b == b"closed") {
            return Err(JournalError::ChannelClosed);
        }
        let bad =
            || JournalError::Storage(format!("unexpected answer of the append script: {v:?}"));
        let epoch = epoch_of(v.first()).ok_or_else(bad)?;
        let n = |i: usize| int_of(v.get(i)).ok_or_else(bad);
        let (first, last, dup, floor, head, time) = (n(1)?, n(2)?, n(3)?, n(4)?, n(5)?, n(6)?);
        self.note_lineage(channel, epoch, v.get(7), v.get(8));
        let own = int_of(v.get(9)) == Some(1);
        let state = ChannelState { epoch, floor, head };
        let appended = Appended {
            epoch,
            first_seq: first,
            last_seq: last,
            duplicate: dup == 1 && !own,
        };
        Ok((state, appended, time, dup == 1))
    }

    /// The read script: up to `limit` events after `after`, the leading ones
    /// whose data adds up to at most `max_bytes` (always at least one). `known` as for [`Inner::append`] (`""` from a
    /// subscriber). Also returns the commit time (Unix ms) of the event at
    /// the page's head.
    async fn read(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
        max_bytes: usize,
        known: &str,
    ) -> Result<(Page, u64), JournalError> {
        let key = scripts::key_of(channel);
        let fresh = RedisJournal::fresh_epoch();
        let r = self.opts.namespaces.retention(channel);
        let limit = limit.min(100_000);
        let max_bytes = max_bytes.min(1 << 40);
        let v: Vec<Value> = self
            .conn
            .run(|mut c| {
                let mut inv = self.scripts.read.prepare_invoke();
                inv.key(&key)
                    .arg(&fresh)
                    .arg(r.max_age_ms)
                    .arg(after)
                    .arg(limit)
                    .arg(max_bytes)
                    .arg(known)
                    .arg(r.max_events)
                    .arg(r.max_bytes);
                async move { inv.invoke_async(&mut c).await }
            })
            .await?;
        let mut it = v.into_iter();
        let bad = |what: &str| {
            JournalError::Storage(format!("unexpected answer of the read script: {what}"))
        };
        let epoch = epoch_of(it.next().as_ref()).ok_or_else(|| bad("epoch"))?;
        let floor = int_of(it.next().as_ref()).ok_or_else(|| bad("floor"))?;
        let head = int_of(it.next().as_ref()).ok_or_else(|| bad("head"))?;
        let (prev, fork) = (it.next(), it.next());
        self.note_lineage(channel, epoch, prev.as_ref(), fork.as_ref());
        let time = int_of(it.next().as_ref()).ok_or_else(|| bad("time"))?;
        let start = int_of(it.next().as_ref()).ok_or_else(|| bad("start"))?;
        let name: Arc<str> = Arc::from(channel);
        let mut events = Vec::new();
        for (i, val) in it.enumerate() {
            let Value::BulkString(bytes) = val else {
                return Err(bad("an event that is not a string"));
            };
            let e = codec::decode(&name, epoch, start + i as u64, bytes)
                .map_err(JournalError::Storage)?;
            events.push(Arc::new(e));
        }
        let page = Page {
            state: ChannelState { epoch, floor, head },
            events,
        };
        Ok((page, time))
    }

    /// The state script. `known` as for [`Inner::append`].
    async fn state(&self, channel: &str, known: &str) -> Result<ChannelState, JournalError> {
        let key = scripts::key_of(channel);
        let fresh = RedisJournal::fresh_epoch();
        let r = self.opts.namespaces.retention(channel);
        let v: Vec<Value> = self
            .conn
            .run(|mut c| {
                let mut inv = self.scripts.state.prepare_invoke();
                inv.key(&key)
                    .arg(&fresh)
                    .arg(r.max_age_ms)
                    .arg(known)
                    .arg(r.max_events)
                    .arg(r.max_bytes);
                async move { inv.invoke_async(&mut c).await }
            })
            .await?;
        let bad = || JournalError::Storage(format!("unexpected answer of the state script: {v:?}"));
        let state = ChannelState {
            epoch: epoch_of(v.first()).ok_or_else(bad)?,
            floor: int_of(v.get(1)).ok_or_else(bad)?,
            head: int_of(v.get(2)).ok_or_else(bad)?,
        };
        self.note_lineage(channel, state.epoch, v.get(3), v.get(4));
        Ok(state)
    }

    /// The purge script (`scripts::PURGE`): the channel's new state, `None`
    /// for a channel never appended to.
    async fn purge(&self, channel: &str) -> Result<Option<ChannelState>, JournalError> {
        let key = scripts::key_of(channel);
        let fresh = RedisJournal::fresh_epoch();
        let mut epoch = RedisJournal::fresh_epoch();
        while epoch == fresh {
            epoch = RedisJournal::fresh_epoch();
        }
        let v: Vec<Value> = self
            .conn
            .run(|mut c| {
                let mut inv = self.scripts.purge.prepare_invoke();
                inv.key(&key)
                    .arg(channel)
                    .arg(&fresh)
                    .arg(&epoch)
                    .arg(BUS_CHANNEL);
                async move { inv.invoke_async(&mut c).await }
            })
            .await?;
        if v.is_empty() {
            return Ok(None);
        }
        let bad = || JournalError::Storage(format!("unexpected answer of the purge script: {v:?}"));
        let state = ChannelState {
            epoch: epoch_of(v.first()).ok_or_else(bad)?,
            floor: int_of(v.get(1)).ok_or_else(bad)?,
            head: int_of(v.get(2)).ok_or_else(bad)?,
        };
        self.note_lineage(channel, state.epoch, v.get(3), v.get(4));
        Ok(Some(state))
    }

    /// The seek script (`scripts::SEEK`): the first retained event at or
    /// after `time_ms`, found in Redis by bisection.
    async fn seek_time(&self, channel: &str, time_ms: u64) -> Result<TimeSeek, JournalError> {
        let key = scripts::key_of(channel);
        let fresh = RedisJournal::fresh_epoch();
        let r = self.opts.namespaces.retention(channel);
        let v: Vec<Value> = self
            .conn
            .run(|mut c| {
                let mut inv = self.scripts.seek.prepare_invoke();
                inv.key(&key)
                    .arg(&fresh)
                    .arg(r.max_age_ms)
                    .arg("")
                    .arg(time_ms)
                    .arg(r.max_events)
                    .arg(r.max_bytes);
                async move { inv.invoke_async(&mut c).await }
            })
            .await?;
        let bad = || JournalError::Storage(format!("unexpected answer of the seek script: {v:?}"));
        let state = ChannelState {
            epoch: epoch_of(v.first()).ok_or_else(bad)?,
            floor: int_of(v.get(1)).ok_or_else(bad)?,
            head: int_of(v.get(2)).ok_or_else(bad)?,
        };
        self.note_lineage(channel, state.epoch, v.get(3), v.get(4));
        Ok(TimeSeek {
            state,
            head_time: int_of(v.get(5)).ok_or_else(bad)?,
            seq: int_of(v.get(6)).ok_or_else(bad)?,
        })
    }
}

/// A token for one append request: 128 random bits in 22 base64url
/// characters (never a space or LF, which the append script's key argument
/// uses as separators, `scripts.rs`).
fn request_token() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut bits: u128 = rand::random();
    (0..22)
        .map(|_| {
            let c = ALPHABET[(bits & 63) as usize];
            bits >>= 6;
            char::from(c)
        })
        .collect()
}

/// Pings the command connection whenever it has been idle for
/// `keepalive_ms` ([`conn::Connector::keepalive`]), until `cancel` fires.
async fn keepalive(inner: Arc<Inner>, cancel: CancellationToken) {
    let interval = Duration::from_millis(inner.opts.keepalive_ms);
    loop {
        let wait = inner.conn.idle_left(interval).await.max(interval / 4);
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        inner.conn.keepalive(interval).await;
    }
}

fn int_of(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// The events an append stored, as committed: `events` at seqs from
/// `first_seq` on, in `epoch`, at `time` (Unix ms).
pub(crate) fn committed_events(
    channel: &str,
    epoch: Epoch,
    first_seq: u64,
    time: u64,
    events: Vec<NewEvent>,
) -> Vec<Arc<Event>> {
    let name: Arc<str> = Arc::from(channel);
    events
        .into_iter()
        .zip(first_seq..)
        .map(|(e, seq)| {
            Arc::new(Event::new(
                name.clone(),
                epoch,
                seq,
                e.event_type,
                e.data,
                time,
            ))
        })
        .collect()
}

fn epoch_of(v: Option<&Value>) -> Option<Epoch> {
    int_of(v).map(Epoch)
}

#[async_trait]
impl Journal for RedisJournal {
    /// `SCAN` of the metadata hashes (`meta.rs`): for rare requests.
    async fn channels_with_meta(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<String>, JournalError> {
        self.inner.channels_with_meta(prefix, limit).await
    }

    /// One script (`scripts::META`): the metadata hash and the channel's
    /// bounds, read together from Redis (never from the cache).
    async fn meta(
        &self,
        channel: &str,
    ) -> Result<(Option<gapless_core::meta::ChannelMeta>, ChannelState), JournalError> {
        self.inner.meta(channel).await
    }

    /// Compare-and-set (`meta.rs`): with this node's cached metadata, one
    /// `scripts::CHANGE` call in the common case.
    async fn change(
        &self,
        channel: &str,
        change: gapless_core::meta::Change,
    ) -> Result<gapless_core::meta::Changed, JournalError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(JournalError::Closed);
        }
        self.inner.change(channel, change).await
    }

    async fn append(
        &self,
        channel: &str,
        events: Vec<NewEvent>,
        idempotency_key: Option<&str>,
    ) -> Result<Appended, JournalError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(JournalError::Closed);
        }
        let held = self.inner.hold_untracked(channel).await;
        let known = self.inner.known_arg(channel);
        let (state, appended, time, stored_before) = self
            .inner
            .append(channel, &events, idempotency_key, &known)
            .await?;
        if stored_before {
            // A duplicate, or this request's own append sent again: its
            // events reach this node's hub as another node's would (the bus
            // notification of the first send, or the head re-read).
            return Ok(appended);
        }
        let committed = committed_events(channel, appended.epoch, appended.first_seq, time, events);
        self.inner
            .deliver_local(channel, state, committed, held)
            .await;
        Ok(appended)
    }

    async fn read(&self, channel: &str, after: u64, limit: usize) -> Result<Page, JournalError> {
        let (page, _) = self
            .inner
            .read(channel, after, limit, usize::MAX, "")
            .await?;
        Ok(page)
    }

    async fn read_bounded(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Page, JournalError> {
        let (page, _) = self
            .inner
            .read(channel, after, limit, max_bytes, "")
            .await?;
        Ok(page)
    }

    async fn state(&self, channel: &str) -> Result<ChannelState, JournalError> {
        self.inner.state(channel, "").await
    }

    async fn seek_time(&self, channel: &str, time_ms: u64) -> Result<TimeSeek, JournalError> {
        self.inner.seek_time(channel, time_ms).await
    }

    /// One script (`scripts::PURGE`); the other nodes learn of it from its
    /// bus notification, or at their next re-read of the channel.
    async fn purge(&self, channel: &str) -> Result<ChannelState, JournalError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(JournalError::Closed);
        }
        match self.inner.purge(channel).await? {
            Some(state) => {
                self.inner.deliver_purge(channel, state).await;
                Ok(state)
            }
            // Never appended to: nothing to purge; its state, as a read gives.
            None => self.inner.state(channel, "").await,
        }
    }

    /// Every `poll_ms`: re-reads the state of every followed channel (which
    /// applies retention by age in Redis), reports new floors to the hub and
    /// fills any head this node missed. Channels nobody here follows are
    /// trimmed by age at their next read or publish.
    async fn evict_expired(&self, now: u64) -> Result<(), JournalError> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        self.inner.reread_settings(now).await;
        let poll = self.inner.opts.poll_ms;
        if poll == 0 {
            return Ok(());
        }
        let last = self.inner.last_poll_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < poll {
            return Ok(());
        }
        self.inner.last_poll_ms.store(now, Ordering::Relaxed);
        self.inner.resync().await;
        Ok(())
    }

    /// What Redis's persistence settings give an acknowledged append, as
    /// last read: `sync`, `async`, `memory` or `unknown` (`settings.rs`).
    fn durability(&self) -> &'static str {
        self.inner.durability()
    }

    async fn ready(&self) -> Result<(), JournalError> {
        // A script, not `PING`: Redis refuses it whenever it would refuse an
        // append (out of memory, read-only, persistence failing), which
        // `PING` does not tell (`scripts::READY`). A refusal that is not a
        // connection-level one (`OOM`, `MISCONF`) is `JournalError::Storage`,
        // as the append's would be.
        let pong: String = self
            .inner
            .conn
            .run(|mut c| {
                let inv = self.inner.scripts.ready.prepare_invoke();
                async move { inv.invoke_async(&mut c).await }
            })
            .await?;
        if pong == "PONG" {
            Ok(())
        } else {
            Err(JournalError::Unavailable(format!(
                "Redis answered the readiness script with {pong:?}"
            )))
        }
    }

    fn fork_of(&self, channel: &str, from: Epoch, to: Epoch) -> Option<u64> {
        self.inner.fork_of(channel, from, to)
    }

    fn share_ephemeral(
        &self,
        channel: &str,
        event_type: Option<&str>,
        data: &gapless_protocol::Payload,
    ) {
        let msg = ephemeral::encode(&self.inner.node, channel, event_type, data);
        let inner = self.inner.clone();
        tokio::spawn(async move {
            // Not sent twice (an ephemeral event has no seq to tell a copy
            // by): on a connection that may have been closed while idle it
            // goes out after a PING showed the connection open.
            let sent = inner
                .conn
                .run_unrepeatable(|mut c| async move {
                    redis::cmd("PUBLISH")
                        .arg(BUS_CHANNEL)
                        .arg(msg)
                        .query_async::<i64>(&mut c)
                        .await
                })
                .await;
            if let Err(e) = sent {
                tracing::debug!(error = %e, "could not pass an ephemeral event to the other nodes");
            }
        });
    }

    async fn close(&self) -> Result<(), JournalError> {
        self.inner.closed.store(true, Ordering::Release);
        self.tasks.cancel();
        Ok(())
    }
}

impl Drop for RedisJournal {
    fn drop(&mut self) {
        self.tasks.cancel();
    }
}

/// Values every node of the cluster shares, made by whichever node asks
/// first (built beside the journal, on its connection): `SET
/// gapless:{shared/<name>} <candidate> NX`, then `GET`, in one script, so
/// every node reads the same bytes. Used for the Durable Streams webhook
/// signing key of a cluster started without `--ds-signing-key`
/// (docs/durable-streams.md, "Signing key").
#[derive(Clone)]
pub struct SharedValues {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SharedValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedValues")
    }
}

impl SharedValues {
    /// The shared values of `journal`'s Redis.
    pub fn new(journal: &RedisJournal) -> Self {
        SharedValues {
            inner: journal.inner.clone(),
        }
    }

    /// The value of `name`: `candidate` when no node set it before.
    ///
    /// # Errors
    /// [`JournalError::Unavailable`] when Redis cannot be reached.
    pub async fn get_or_set(&self, name: &str, candidate: &[u8]) -> Result<Vec<u8>, JournalError> {
        const SHARED: &str = r#"
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
"#;
        let key = format!("gapless:{{shared/{name}}}");
        let candidate = candidate.to_vec();
        self.inner
            .conn
            .run(|mut c| {
                let key = key.clone();
                let candidate = candidate.clone();
                async move {
                    redis::Script::new(SHARED)
                        .key(key)
                        .arg(candidate)
                        .invoke_async::<Vec<u8>>(&mut c)
                        .await
                }
            })
            .await
    }
}
