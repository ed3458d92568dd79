//! Sessions: channels with one consumer at a time and a lifecycle
//! (open, then completed or cancelled).
//!
//! A session's events live in the journal under the channel `session/<id>`
//! (`/` is outside the channel alphabet, so no client channel can collide).
//! Its lifecycle is the channel's own ([`crate::meta`], as for a Durable
//! Streams stream): created with its metadata and the opening marker in one
//! change, ended by a closing append of its end marker, so the journal itself
//! refuses every append after the end, on every node and for every journal
//! ([`crate::JournalError::ChannelClosed`]). The markers stay events of
//! reserved types ([`OPENED`], [`COMPLETED`], [`CANCELLED`]), which consumers
//! read; a closed session's status is its last event's. A session written by
//! a release before channel metadata (markers only) is given its metadata
//! when first touched ([`crate::meta::Change::Import`]). Which
//! connection is attached, and since when nobody is, is kept in memory: after
//! a restart every open session counts as detached since the restart, so a
//! consumer that reconnects within the grace window finds it intact.
//!
//! In cluster mode the binary builds a [`SessionRegistry`] beside the
//! journal, in the same shared store (`gapless_redis::RedisSessions`), and
//! hands it to [`Sessions::with_registry`]; the [`crate::Journal`] knows
//! nothing of sessions. Who is attached is then a lease shared by every
//! node (renewed while the consumer is connected), so a second consumer on
//! another node is refused, a takeover on one node closes the holder on
//! another, the grace window counts from the moment the last holder
//! anywhere left (or its node died and its lease ran out), and the status
//! is re-read from the journal before each append or end, since another
//! node may have ended the session; an append that races another node's end
//! is refused by the journal (the channel is closed), so it is
//! [`SessionError::Ended`] too.

use crate::hub::Hub;
use crate::journal::{Appended, ChannelState, JournalError};
use crate::meta::{Change, ChannelMeta, Guard, Life, Outcome, Refusal};
use crate::subscription::{Start, Subscription};
use gapless_protocol::codes::GapReason;
use gapless_protocol::{NewEvent, Payload};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use thiserror::Error;
use tokio_util::sync::CancellationToken;

/// Marker type of a session's first event.
pub const OPENED: &str = "gapless.session.opened";
/// Marker type of a completed session's last event.
pub const COMPLETED: &str = "gapless.session.completed";
/// Marker type of a cancelled session's last event.
pub const CANCELLED: &str = "gapless.session.cancelled";
/// Longest session id, in characters (`A-Z a-z 0-9 _ -`).
pub const MAX_ID_LEN: usize = gapless_protocol::name::MAX_SESSION_ID_LEN;
/// The content type recorded in a session channel's metadata.
const CONTENT_TYPE: &str = "application/octet-stream";

/// The journal channel of session `id`.
pub fn channel_of(id: &str) -> String {
    format!("session/{id}")
}

/// Checks a session id: 1 to [`MAX_ID_LEN`] characters of `A-Z a-z 0-9 _ -`.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Where a session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Takes events.
    Open,
    /// Ended by its producer after its last event.
    Completed,
    /// Ended by its producer, or by the grace window running out with no consumer.
    Cancelled,
}

impl Status {
    /// `open`, `completed` or `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Open => "open",
            Status::Completed => "completed",
            Status::Cancelled => "cancelled",
        }
    }

    /// The status a marker event type stands for.
    pub fn of_marker(event_type: Option<&str>) -> Option<Status> {
        match event_type {
            Some(COMPLETED) => Some(Status::Completed),
            Some(CANCELLED) => Some(Status::Cancelled),
            _ => None,
        }
    }
}

/// Session settings.
#[derive(Debug, Clone, Copy)]
pub struct SessionConfig {
    /// Milliseconds an open session survives with no consumer attached before it
    /// is cancelled. Default 60000.
    pub grace_ms: u64,
    /// Whether consumers may resume with `last_seq` (false: such a request is
    /// refused with close 4400). Default true.
    pub resume: bool,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            grace_ms: 60_000,
            resume: true,
        }
    }
}

/// How long a consumer's attach lease lasts in a [`SessionRegistry`], in
/// milliseconds; it is renewed every third of that while the consumer is
/// connected, so a node that dies frees its sessions within this time.
pub const LEASE_MS: u64 = 10_000;

/// What a [`SessionRegistry`] knows of a session's consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedAttach {
    /// Whether a live consumer holds the session on some node.
    pub attached: bool,
    /// Unix ms since which nobody holds it (the release, or the end of the
    /// last lease), when known.
    pub detached_since: Option<u64>,
}

/// Attach state shared between nodes (cluster mode): one lease per session,
/// naming its holder (`<node>:<connection>`, unique across nodes).
#[async_trait::async_trait]
pub trait SessionRegistry: Send + Sync + 'static {
    /// Claims session `id` for `holder` for `lease_ms`. When another holder has
    /// a live lease: with `takeover` the claim replaces it and that holder's
    /// node is told (its kick callback fires); without, nothing changes and
    /// this returns false.
    ///
    /// # Errors
    /// [`JournalError`] when the shared store fails.
    async fn claim(
        &self,
        id: &str,
        holder: &str,
        takeover: bool,
        lease_ms: u64,
    ) -> Result<bool, JournalError>;
    /// Extends `holder`'s lease by `lease_ms`; false when it no longer holds
    /// the session (taken over elsewhere).
    ///
    /// # Errors
    /// [`JournalError`] when the shared store fails.
    async fn renew(&self, id: &str, holder: &str, lease_ms: u64) -> Result<bool, JournalError>;
    /// Releases the session if `holder` has it; nobody holds it from now.
    ///
    /// # Errors
    /// [`JournalError`] when the shared store fails.
    async fn release(&self, id: &str, holder: &str) -> Result<(), JournalError>;
    /// The shared attach state of `id`.
    ///
    /// # Errors
    /// [`JournalError`] when the shared store fails.
    async fn state(&self, id: &str) -> Result<SharedAttach, JournalError>;
    /// Sets what to call with a holder of this node that another node took over.
    fn on_kick(&self, kick: Box<dyn Fn(&str) + Send + Sync>);
}

/// Why a session operation was refused.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SessionError {
    /// No such session, or its events have all expired.
    #[error("no session {0:?} (unknown, or expired)")]
    NotFound(String),
    /// `create` with an id that exists.
    #[error("session {0:?} already exists")]
    Exists(String),
    /// The session is completed or cancelled.
    #[error("session {id:?} is {}; it takes no more events", status.as_str())]
    Ended {
        /// The session.
        id: String,
        /// How it ended.
        status: Status,
    },
    /// Another live connection holds the session.
    #[error("session {0:?} is attached to another live connection; reconnect with takeover=true to replace it")]
    Attached(String),
    /// `last_seq` given while resume is turned off.
    #[error("resuming sessions is turned off on this server (--session-resume false)")]
    ResumeDisabled,
    /// The events after `last_seq` are not all retained, or `last_seq` is past the head.
    #[error("cannot resume session {id:?} after seq {last_seq}: {why}; start over")]
    NotRetained {
        /// The session.
        id: String,
        /// The seq the consumer presented.
        last_seq: u64,
        /// Which of the two.
        why: &'static str,
    },
    /// The journal failed.
    #[error(transparent)]
    Journal(#[from] JournalError),
}

/// A session as a producer or an operator sees it.
#[derive(Debug, Clone)]
pub struct Info {
    /// The id.
    pub id: String,
    /// Its status.
    pub status: Status,
    /// Newest seq.
    pub head: u64,
    /// Whether a consumer is attached now.
    pub attached: bool,
}

struct Entry {
    state: Mutex<EntryState>,
    /// Serializes appends and lifecycle changes of one session.
    ops: tokio::sync::Mutex<()>,
}

struct EntryState {
    /// False until the status was read from the journal or written by `create`.
    known: bool,
    status: Status,
    /// The incarnation of the session channel's metadata (0 until known).
    incarnation: u64,
    attached: Option<(u64, CancellationToken)>,
    detached_since: u64,
}

/// All sessions this server has touched since it started.
pub struct Sessions {
    config: SessionConfig,
    /// When this registry was created (the server's start): sessions found
    /// open in the journal count as detached since then.
    started_ms: u64,
    map: Mutex<HashMap<String, Arc<Entry>>>,
    next_conn: AtomicU64,
    /// Cluster mode: the shared attach leases.
    registry: Option<Arc<dyn SessionRegistry>>,
    /// This process's part of a holder name (random).
    node: String,
    /// Holders attached through this node -> their kick token.
    held: Arc<Mutex<HashMap<String, CancellationToken>>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").finish_non_exhaustive()
    }
}

/// A consumer's hold on a session: its subscription, and a token that fires
/// when a newer connection takes the session over. Dropping it detaches.
pub struct Attachment {
    /// The session's events from the start position on.
    pub sub: Subscription,
    /// Fires when this attachment is taken over.
    pub kicked: CancellationToken,
    /// The session's head when it attached: replay ends there.
    pub head: u64,
    /// The seq the consumer resumed after, if it asked to resume.
    pub last_seq: Option<u64>,
    /// The session's status when it attached (an ended session can be
    /// attached only with `last_seq`, to read the rest).
    pub status: Status,
    guard: Detach,
}

impl std::fmt::Debug for Attachment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attachment").finish_non_exhaustive()
    }
}

impl Attachment {
    /// The session id.
    pub fn id(&self) -> &str {
        &self.guard.id
    }
}

struct Detach {
    id: String,
    conn: u64,
    entry: Arc<Entry>,
    shared: Option<SharedHold>,
}

/// A lease held in the [`SessionRegistry`] for one attachment.
struct SharedHold {
    registry: Arc<dyn SessionRegistry>,
    holder: String,
    held: Arc<Mutex<HashMap<String, CancellationToken>>>,
    /// Stops the renewal task.
    done: CancellationToken,
}

impl Drop for Detach {
    fn drop(&mut self) {
        {
            let mut st = self.entry.state.lock();
            if st.attached.as_ref().is_some_and(|(c, _)| *c == self.conn) {
                st.attached = None;
                st.detached_since = crate::journal::now_ms();
            }
        }
        if let Some(h) = self.shared.take() {
            h.done.cancel();
            h.held.lock().remove(&h.holder);
            let id = self.id.clone();
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    if let Err(e) = h.registry.release(&id, &h.holder).await {
                        tracing::warn!(session = %id, error = %e, "could not release the attach lease; it lapses by itself");
                    }
                });
            }
        }
    }
}

impl Sessions {
    /// An empty registry.
    pub fn new(config: SessionConfig) -> Self {
        Sessions {
            config,
            started_ms: crate::journal::now_ms(),
            map: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            registry: None,
            node: format!("{:016x}", rand::random::<u64>()),
            held: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// A registry whose attach state is shared through `registry` (cluster
    /// mode; see the module doc).
    pub fn with_registry(config: SessionConfig, registry: Arc<dyn SessionRegistry>) -> Self {
        let mut s = Self::new(config);
        let held = s.held.clone();
        registry.on_kick(Box::new(move |holder| {
            if let Some(t) = held.lock().get(holder) {
                t.cancel();
            }
        }));
        s.registry = Some(registry);
        s
    }

    /// Whether a consumer is attached: here, or (cluster mode) on any node.
    async fn attached_anywhere(&self, id: &str, entry: &Entry) -> Result<bool, SessionError> {
        if entry.state.lock().attached.is_some() {
            return Ok(true);
        }
        match &self.registry {
            Some(r) => Ok(r.state(id).await?.attached),
            None => Ok(false),
        }
    }

    /// The settings.
    pub fn config(&self) -> SessionConfig {
        self.config
    }

    /// Creates a session; `id` `None` draws an unguessable one (128 random bits, hex).
    ///
    /// # Errors
    /// [`SessionError::Exists`], or a journal failure.
    pub async fn create(&self, hub: &Hub, id: Option<String>) -> Result<Info, SessionError> {
        let id = id.unwrap_or_else(|| format!("{:032x}", rand::random::<u128>()));
        let channel = channel_of(&id);
        let entry = self.entry(&id, crate::journal::now_ms());
        let _ops = entry.ops.lock().await;
        // A session of a release before channel metadata has events only.
        if hub.state(&channel).await?.head > 0 {
            return Err(SessionError::Exists(id));
        }
        let marker = NewEvent {
            event_type: Some(OPENED.to_owned()),
            data: Payload::default(),
        };
        let meta = ChannelMeta::new(
            rand::random::<u64>().max(1),
            CONTENT_TYPE.to_owned(),
            crate::journal::now_ms(),
        );
        let incarnation = meta.incarnation;
        // Two creates of one id may both find it absent (on two nodes, in
        // cluster mode); the journal creates the metadata once and answers
        // the other `Exists`.
        let changed = hub
            .change(
                &channel,
                Change::Create {
                    meta,
                    events: vec![marker],
                },
            )
            .await?;
        let head = match changed.outcome {
            Outcome::Created(_) => changed.state.head,
            _ => return Err(SessionError::Exists(id)),
        };
        {
            let mut st = entry.state.lock();
            st.status = Status::Open;
            st.known = true;
            st.incarnation = incarnation;
            st.detached_since = crate::journal::now_ms();
        }
        Ok(Info {
            id,
            status: Status::Open,
            head,
            attached: false,
        })
    }

    /// The session's status, head and attachment.
    ///
    /// # Errors
    /// [`SessionError::NotFound`], or a journal failure.
    pub async fn info(&self, hub: &Hub, id: &str) -> Result<Info, SessionError> {
        let entry = self.load(hub, id).await?;
        self.refresh(hub, id, &entry).await?;
        // A grace window that ran out is applied before anyone sees the
        // status, not at the next sweep: after a restart, a session nobody
        // touched is cancelled from one grace window after the restart.
        if self.due(&entry) {
            let _ops = entry.ops.lock().await;
            self.expire_if_due(hub, id, &entry).await?;
        }
        let head = hub.state(&channel_of(id)).await?.head;
        let attached = self.attached_anywhere(id, &entry).await?;
        let status = entry.state.lock().status;
        Ok(Info {
            id: id.to_owned(),
            status,
            head,
            attached,
        })
    }

    /// Appends events to an open session; returns what was appended and whether
    /// a consumer is attached right now.
    ///
    /// # Errors
    /// [`SessionError::NotFound`], [`SessionError::Ended`] (also when the grace
    /// window ran out), or a journal failure.
    pub async fn append(
        &self,
        hub: &Hub,
        id: &str,
        events: Vec<NewEvent>,
        idempotency_key: Option<&str>,
    ) -> Result<(Appended, bool), SessionError> {
        let entry = self.load(hub, id).await?;
        let _ops = entry.ops.lock().await;
        self.refresh(hub, id, &entry).await?;
        self.expire_if_due(hub, id, &entry).await?;
        let status = entry.state.lock().status;
        if status != Status::Open {
            return Err(SessionError::Ended {
                id: id.to_owned(),
                status,
            });
        }
        let appended = match hub.publish(&channel_of(id), events, idempotency_key).await {
            Ok(a) => a,
            Err(e) => return Err(self.ended_meanwhile(hub, id, &entry, e).await),
        };
        let attached = self.attached_anywhere(id, &entry).await?;
        Ok((appended, attached))
    }

    /// Completes or cancels an open session.
    ///
    /// # Errors
    /// [`SessionError::NotFound`], [`SessionError::Ended`], or a journal failure.
    pub async fn end(&self, hub: &Hub, id: &str, status: Status) -> Result<Info, SessionError> {
        let entry = self.load(hub, id).await?;
        let _ops = entry.ops.lock().await;
        self.refresh(hub, id, &entry).await?;
        self.expire_if_due(hub, id, &entry).await?;
        let current = entry.state.lock().status;
        if current != Status::Open {
            return Err(SessionError::Ended {
                id: id.to_owned(),
                status: current,
            });
        }
        let head = self.write_end(hub, id, &entry, status).await?;
        let attached = self.attached_anywhere(id, &entry).await?;
        Ok(Info {
            id: id.to_owned(),
            status,
            head,
            attached,
        })
    }

    /// Attaches a consumer. `last_seq`: resume after that seq (strictly: every
    /// event after it must be retained); `None`: live events only.
    /// `takeover`: replace a live attachment instead of being refused.
    ///
    /// # Errors
    /// Each refusal of the session protocol: [`SessionError::NotFound`],
    /// [`SessionError::Ended`] (an ended session without `last_seq`: nothing
    /// live to attach to), [`SessionError::ResumeDisabled`],
    /// [`SessionError::Attached`], [`SessionError::NotRetained`].
    pub async fn attach(
        &self,
        hub: &Hub,
        id: &str,
        last_seq: Option<u64>,
        takeover: bool,
        batch: usize,
    ) -> Result<Attachment, SessionError> {
        let entry = self.load(hub, id).await?;
        let (st, status) = self.attachable(hub, id, &entry, last_seq).await?;
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let kicked = CancellationToken::new();
        if entry.state.lock().attached.is_some() && !takeover {
            return Err(SessionError::Attached(id.to_owned()));
        }
        let shared = self.claim_shared(id, conn, takeover, &kicked).await?;
        // From here on, dropping `guard` releases what was claimed.
        let guard = Detach {
            id: id.to_owned(),
            conn,
            entry: entry.clone(),
            shared,
        };
        {
            let mut es = entry.state.lock();
            if let Some((_, old)) = &es.attached {
                if !takeover {
                    return Err(SessionError::Attached(id.to_owned()));
                }
                old.cancel();
            }
            es.attached = Some((conn, kicked.clone()));
        }
        let (sub, head) = follow_session(hub, id, st, last_seq, batch).await?;
        Ok(Attachment {
            sub,
            kicked,
            head,
            last_seq,
            status,
            guard,
        })
    }

    /// The first step of [`Sessions::attach`]: applies a grace window that
    /// ran out, then checks that a consumer may attach at `last_seq`.
    /// Returns the session's journal state and status.
    ///
    /// # Errors
    /// [`SessionError::ResumeDisabled`], [`SessionError::Ended`] (an ended
    /// session without `last_seq`), [`SessionError::NotRetained`], or a
    /// journal failure.
    async fn attachable(
        &self,
        hub: &Hub,
        id: &str,
        entry: &Entry,
        last_seq: Option<u64>,
    ) -> Result<(ChannelState, Status), SessionError> {
        {
            let _ops = entry.ops.lock().await;
            self.expire_if_due(hub, id, entry).await?;
        }
        if last_seq.is_some() && !self.config.resume {
            return Err(SessionError::ResumeDisabled);
        }
        let st = hub.state(&channel_of(id)).await?;
        let status = entry.state.lock().status;
        if status != Status::Open && last_seq.is_none() {
            // Nothing live to attach to; with `last_seq` the rest and the end are delivered.
            return Err(SessionError::Ended {
                id: id.to_owned(),
                status,
            });
        }
        if let Some(n) = last_seq {
            let why = if n > st.head {
                Some("it is beyond the newest event")
            } else if n + 1 < st.floor {
                Some("events after it are no longer retained")
            } else {
                None
            };
            if let Some(why) = why {
                return Err(SessionError::NotRetained {
                    id: id.to_owned(),
                    last_seq: n,
                    why,
                });
            }
        }
        Ok((st, status))
    }

    /// Cluster mode: claims the shared attach lease of `id` for connection
    /// `conn` of this node, and keeps it renewed until the attachment is
    /// dropped; `kicked` fires when another node takes it over. `None`
    /// without a registry.
    ///
    /// # Errors
    /// [`SessionError::Attached`] when another holder has it and `takeover`
    /// is false, or a failure of the registry.
    async fn claim_shared(
        &self,
        id: &str,
        conn: u64,
        takeover: bool,
        kicked: &CancellationToken,
    ) -> Result<Option<SharedHold>, SessionError> {
        let Some(registry) = &self.registry else {
            return Ok(None);
        };
        let holder = format!("{}:{conn}", self.node);
        // Registered before the claim, so a kick that follows it at once is not missed.
        self.held.lock().insert(holder.clone(), kicked.clone());
        let claimed = registry.claim(id, &holder, takeover, LEASE_MS).await;
        if !matches!(claimed, Ok(true)) {
            self.held.lock().remove(&holder);
            claimed?;
            return Err(SessionError::Attached(id.to_owned()));
        }
        let done = CancellationToken::new();
        tokio::spawn(renew(
            registry.clone(),
            id.to_owned(),
            holder.clone(),
            kicked.clone(),
            done.clone(),
        ));
        Ok(Some(SharedHold {
            registry: registry.clone(),
            holder,
            held: self.held.clone(),
            done,
        }))
    }

    /// Cancels every open session that has had no consumer for the grace window.
    /// The server calls it about every 250 ms.
    ///
    /// # Errors
    /// A journal failure.
    pub async fn sweep(&self, hub: &Hub) -> Result<(), SessionError> {
        let entries: Vec<(String, Arc<Entry>)> = self
            .map
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut failed = None;
        for (id, entry) in entries {
            if self.due(&entry) {
                let _ops = entry.ops.lock().await;
                match self.expire_if_due(hub, &id, &entry).await {
                    Ok(()) => {}
                    // Another node ended it first (cluster mode): nothing to do.
                    Err(SessionError::Ended { .. }) => {}
                    // The other sessions are still swept; the first failure is returned.
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
            }
        }
        // Forget ended sessions nobody holds; they are reloaded from the journal if touched.
        self.map.lock().retain(|_, e| {
            let st = e.state.lock();
            st.status == Status::Open || st.attached.is_some() || Arc::strong_count(e) > 1
        });
        failed.map_or(Ok(()), Err)
    }

    fn due(&self, entry: &Entry) -> bool {
        let st = entry.state.lock();
        st.known
            && st.status == Status::Open
            && st.attached.is_none()
            && crate::journal::now_ms().saturating_sub(st.detached_since) >= self.config.grace_ms
    }

    /// Cancels the session if its grace window ran out. Caller holds `ops`.
    async fn expire_if_due(&self, hub: &Hub, id: &str, entry: &Entry) -> Result<(), SessionError> {
        if self.due(entry) && self.shared_due(id, entry).await? {
            tracing::info!(
                session = id,
                "cancelled: no consumer within the grace window"
            );
            self.write_end(hub, id, entry, Status::Cancelled).await?;
        }
        Ok(())
    }

    /// Cluster mode: whether the grace window also ran out for every node
    /// (nobody attached anywhere, and nobody since the grace window), moving
    /// this node's `detached_since` to what the registry knows.
    async fn shared_due(&self, id: &str, entry: &Entry) -> Result<bool, SessionError> {
        let Some(registry) = &self.registry else {
            return Ok(true);
        };
        let shared = registry.state(id).await?;
        let now = crate::journal::now_ms();
        let mut st = entry.state.lock();
        if shared.attached {
            st.detached_since = now;
            return Ok(false);
        }
        if let Some(t) = shared.detached_since {
            st.detached_since = st.detached_since.max(t);
        }
        Ok(now.saturating_sub(st.detached_since) >= self.config.grace_ms)
    }

    /// Cluster mode: re-reads the status from the journal (another node may
    /// have ended the session). Caller holds `ops` when it is about to write.
    async fn refresh(&self, hub: &Hub, id: &str, entry: &Entry) -> Result<(), SessionError> {
        if self.registry.is_none() || entry.state.lock().status != Status::Open {
            return Ok(());
        }
        if let Some((status, _, _)) = read_status(hub, id).await? {
            entry.state.lock().status = status;
        }
        Ok(())
    }

    /// The journal refuses an append to a closed channel (another node
    /// ended the session between our status read and our append); such a
    /// refusal becomes [`SessionError::Ended`]. Any other failure is
    /// returned as it is.
    async fn ended_meanwhile(
        &self,
        hub: &Hub,
        id: &str,
        entry: &Entry,
        e: JournalError,
    ) -> SessionError {
        if matches!(e, JournalError::ChannelClosed) {
            if let Ok(Some((status, _, _))) = read_status(hub, id).await {
                if status != Status::Open {
                    entry.state.lock().status = status;
                    return SessionError::Ended {
                        id: id.to_owned(),
                        status,
                    };
                }
            }
        }
        e.into()
    }

    /// Appends the end marker. Caller holds `ops`.
    async fn write_end(
        &self,
        hub: &Hub,
        id: &str,
        entry: &Entry,
        status: Status,
    ) -> Result<u64, SessionError> {
        let marker = NewEvent {
            event_type: Some(
                match status {
                    Status::Completed => COMPLETED,
                    _ => CANCELLED,
                }
                .to_owned(),
            ),
            data: Payload::default(),
        };
        let guard = Guard {
            incarnation: entry.state.lock().incarnation,
            close: true,
            ..Guard::default()
        };
        let change = Change::Append {
            guard,
            events: vec![marker],
            key: None,
        };
        let changed = hub.change(&channel_of(id), change).await?;
        match changed.outcome {
            Outcome::Appended(_) => {
                entry.state.lock().status = status;
                Ok(changed.state.head)
            }
            // Ended on another node meanwhile.
            Outcome::Refused(Refusal::Closed) => Err(self
                .ended_meanwhile(hub, id, entry, JournalError::ChannelClosed)
                .await),
            other => Err(JournalError::Storage(format!(
                "the end of session {id} was not recorded: {other:?}"
            ))
            .into()),
        }
    }

    fn entry(&self, id: &str, detached_since: u64) -> Arc<Entry> {
        self.map
            .lock()
            .entry(id.to_owned())
            .or_insert_with(|| {
                Arc::new(Entry {
                    state: Mutex::new(EntryState {
                        known: false,
                        status: Status::Open,
                        incarnation: 0,
                        attached: None,
                        detached_since,
                    }),
                    ops: tokio::sync::Mutex::new(()),
                })
            })
            .clone()
    }

    /// The entry of an existing session, its status read from the journal on first touch.
    async fn load(&self, hub: &Hub, id: &str) -> Result<Arc<Entry>, SessionError> {
        if !valid_id(id) {
            return Err(SessionError::NotFound(id.to_owned()));
        }
        if let Some(e) = self.map.lock().get(id).cloned() {
            if e.state.lock().known {
                return Ok(e);
            }
        }
        let Some((status, incarnation, opened_ms)) = read_status(hub, id).await? else {
            return Err(SessionError::NotFound(id.to_owned()));
        };
        // Detached since it was opened, or since this server started if that
        // is later (what an earlier process knew of its consumers is gone).
        // In cluster mode it may have been opened on another node a moment
        // ago: counting from this node's start would cancel it at once.
        let entry = self.entry(id, self.started_ms.max(opened_ms));
        {
            let mut es = entry.state.lock();
            if !es.known {
                es.status = status;
                es.incarnation = incarnation;
                es.known = true;
            }
        }
        Ok(entry)
    }
}

/// The last step of [`Sessions::attach`]: a subscription to session `id`'s
/// events after `last_seq` (`None`: live events only), and the head the
/// follow saw: a live attach continues right after it, a resume replays up
/// to it (an event appended since `st` was read is then live, not lost).
///
/// # Errors
/// [`SessionError::NotRetained`] when retention moved between the check
/// of `st` and the follow, or a journal failure.
async fn follow_session(
    hub: &Hub,
    id: &str,
    st: ChannelState,
    last_seq: Option<u64>,
    batch: usize,
) -> Result<(Subscription, u64), SessionError> {
    let start = match last_seq {
        Some(seq) => Start::After {
            epoch: st.epoch,
            seq,
        },
        None => Start::Live,
    };
    let mut sub = hub.empty_subscription(batch);
    let followed = hub.follow(&mut sub, &channel_of(id), start).await?;
    if let Some(gap) = followed.gap {
        let why = match gap.reason {
            GapReason::Ahead => "it is beyond the newest event",
            _ => "events after it are no longer retained",
        };
        return Err(SessionError::NotRetained {
            id: id.to_owned(),
            last_seq: last_seq.unwrap_or(0),
            why,
        });
    }
    Ok((sub, followed.head))
}

/// What the journal holds for session `id`: its status (open while its
/// channel is, else its last event's end marker), the incarnation of its
/// metadata and when it was opened (Unix ms); `None` when there is no such
/// session. A session of a release before channel metadata (its markers
/// only) is given its metadata here ([`Change::Import`], set only where
/// there is none, so nodes doing it at once agree).
async fn read_status(hub: &Hub, id: &str) -> Result<Option<(Status, u64, u64)>, SessionError> {
    let channel = channel_of(id);
    let (meta, st) = hub.meta(&channel).await?;
    if let Some(m) = meta {
        let status = match (m.is_closed(), st.head == 0 || st.floor > st.head) {
            (false, _) => Status::Open,
            // Ended, and retention took even its end marker: gone, as a
            // session whose events are all evicted always was.
            (true, true) => return Ok(None),
            (true, false) => match last_marker(hub, &channel, st).await? {
                Status::Open => Status::Cancelled,
                ended => ended,
            },
        };
        return Ok(Some((status, m.incarnation, m.created_ms)));
    }
    if st.head == 0 || st.floor > st.head {
        return Ok(None);
    }
    let status = last_marker(hub, &channel, st).await?;
    let floor = st.floor.max(1);
    let first = hub.read(&channel, floor - 1, 1, usize::MAX).await?;
    let opened_ms = first.events.first().map_or(0, |e| e.time);
    let mut meta = ChannelMeta::new(
        rand::random::<u64>().max(1),
        CONTENT_TYPE.to_owned(),
        opened_ms,
    );
    if status != Status::Open {
        meta.life = Life::Closed;
    }
    let changed = hub.change(&channel, Change::Import(meta)).await?;
    let Some(m) = changed.meta else {
        return Ok(None);
    };
    let status = if m.is_closed() { status } else { Status::Open };
    Ok(Some((status, m.incarnation, m.created_ms)))
}

/// The status of session channel `channel`'s last event: its end marker's,
/// else open.
async fn last_marker(hub: &Hub, channel: &str, st: ChannelState) -> Result<Status, SessionError> {
    if st.head == 0 || st.floor > st.head {
        return Ok(Status::Open);
    }
    let page = hub.read(channel, st.head - 1, 1, usize::MAX).await?;
    Ok(page
        .events
        .last()
        .and_then(|e| Status::of_marker(e.event_type.as_deref()))
        .unwrap_or(Status::Open))
}

/// Keeps `holder`'s lease alive until `done` fires; fires `kicked` when the
/// registry says another holder has the session.
async fn renew(
    registry: Arc<dyn SessionRegistry>,
    id: String,
    holder: String,
    kicked: CancellationToken,
    done: CancellationToken,
) {
    let every = std::time::Duration::from_millis(LEASE_MS / 3);
    loop {
        tokio::select! {
            () = done.cancelled() => return,
            () = kicked.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        match registry.renew(&id, &holder, LEASE_MS).await {
            Ok(true) => {}
            Ok(false) => {
                kicked.cancel();
                return;
            }
            Err(e) => tracing::warn!(session = %id, error = %e, "could not renew the attach lease"),
        }
    }
}
