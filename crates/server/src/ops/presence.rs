//! Presence (issue 21, "Presence"; docs/api.md, "Presence"), once for every
//! transport: who follows each channel of a namespace with
//! `presence = true`, and the join and leave notices of its members.
//!
//! - A subscriber's identity ([`member`]): its token's `sub`; on an open
//!   server the `client_id` it gives (SSE `?client_id=`, WebSocket
//!   `"client_id"`). Without one it counts in occupancy but is no member.
//! - Each connection to a channel (an SSE stream, a WebSocket
//!   subscription) holds a place in it through a [`Seat`], the transport's
//!   for the connection's life. A member's first connection is its join; its
//!   last one gone `presence_linger_ms` (its namespace's) is its leave, and
//!   a connection back within that time is neither.
//! - A connection that asks for notices gets, on its seat
//!   ([`Seat::next`]), the join and leave of every member after its own
//!   arrival (those before it are in [`get`]'s answer). A notice is not an
//!   event: no seq, no cursor, never journaled.
//!
//! In cluster mode (a [`PresenceRegistry`], the Redis one) each node keeps
//! its own connections and lingers, tells the registry of every change in
//! order (one task per node, [`Presence::shared`]), and the registry decides
//! the cluster-wide join and leave (a member's first node, its last one) and
//! tells every node, which hands them to its connections that asked; the
//! presence GET reads the registry.

use crate::auth::{Action, Grant};
use crate::error::ApiError;
use crate::ops::names;
use crate::App;
use gapless_core::namespace::namespace_of;
use gapless_core::presence::{PresenceChange, PresenceRegistry, RoomState};
use gapless_protocol::codes::ErrorCode;
use gapless_protocol::presence::{
    check_client_id, PresenceAction, PresenceAnswer, PresenceMember, PresenceNotice,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::mpsc;

/// Notices a connection may have waiting; the notices that come while this
/// many wait are dropped for it (it loses notices, never events; the
/// presence GET still says who is there).
pub const NOTICE_QUEUE: usize = 1024;

/// Every channel's presence on this node (shared by every transport, in
/// [`App`]).
#[derive(Default, Clone)]
pub struct Presence {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Presence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Presence").finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Inner {
    rooms: Mutex<HashMap<String, Room>>,
    /// Ids of seats and of pending leaves.
    next: AtomicU64,
    /// Cluster mode: the registry, and the queue of this node's changes to it.
    shared: Option<Shared>,
}

struct Shared {
    registry: Arc<dyn PresenceRegistry>,
    changes: mpsc::UnboundedSender<PresenceChange>,
}

/// One channel's presence.
#[derive(Default)]
struct Room {
    /// Connections now, members' or not.
    connections: usize,
    members: BTreeMap<String, Member>,
    /// The seats that asked for notices (seat id, its queue).
    listeners: Vec<(u64, mpsc::Sender<PresenceNotice>)>,
}

struct Member {
    connections: usize,
    /// When it joined, Unix ms.
    since: u64,
    /// With no connection left: the id of its pending leave (0: none).
    leaving: u64,
}

impl Room {
    fn is_empty(&self) -> bool {
        self.connections == 0 && self.members.is_empty() && self.listeners.is_empty()
    }

    fn notify(&mut self, action: PresenceAction, channel: &str, id: &str) {
        if self.listeners.is_empty() {
            return;
        }
        let notice = PresenceNotice {
            action,
            channel: channel.to_owned(),
            id: id.to_owned(),
        };
        self.listeners
            .retain(|(_, tx)| match tx.try_send(notice.clone()) {
                Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => true,
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Inner {
    fn rooms(&self) -> MutexGuard<'_, HashMap<String, Room>> {
        // A panic elsewhere while holding it leaves counts that are still
        // whole (every change is one step): keep going.
        self.rooms.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pending leave `leaving` of `id` on `channel` is due: it leaves
    /// unless it came back (or another leave replaced this one).
    fn expire(&self, channel: &str, id: &str, leaving: u64) {
        let mut rooms = self.rooms();
        let Some(room) = rooms.get_mut(channel) else {
            return;
        };
        if room
            .members
            .get(id)
            .is_some_and(|m| m.connections == 0 && m.leaving == leaving)
        {
            room.members.remove(id);
            self.left(room, channel, id);
        }
        if room.is_empty() {
            rooms.remove(channel);
        }
    }

    /// `id` joined `channel` on this node: its join (to this node's
    /// listeners, or in cluster mode to the registry, which tells every
    /// node when it is the cluster-wide join).
    fn joined(&self, room: &mut Room, channel: &str, id: &str, since: u64) {
        match &self.shared {
            None => room.notify(PresenceAction::Join, channel, id),
            Some(s) => {
                let _ = s.changes.send(PresenceChange::Hold {
                    channel: channel.to_owned(),
                    member: id.to_owned(),
                    since,
                });
            }
        }
    }

    /// `id` left `channel` on this node (after its linger).
    fn left(&self, room: &mut Room, channel: &str, id: &str) {
        match &self.shared {
            None => room.notify(PresenceAction::Leave, channel, id),
            Some(s) => {
                let _ = s.changes.send(PresenceChange::Release {
                    channel: channel.to_owned(),
                    member: id.to_owned(),
                });
            }
        }
    }

    /// Cluster mode: a connection of `member` to `channel` came (+1) or went (-1).
    fn counted(&self, channel: &str, member: Option<&String>, delta: i64) {
        if let Some(s) = &self.shared {
            let _ = s.changes.send(PresenceChange::Connections {
                channel: channel.to_owned(),
                member: member.cloned(),
                delta,
            });
        }
    }

    /// Cluster mode: queues all of this node's presence for the registry
    /// ([`PresenceChange::Resync`]), built under the rooms' lock so that it
    /// comes after every change made before it and before every later one.
    fn resync(&self) {
        if let Some(s) = &self.shared {
            let rooms = self.rooms();
            let state = rooms
                .iter()
                .map(|(channel, room)| RoomState {
                    channel: channel.clone(),
                    connections: room.connections,
                    members: room
                        .members
                        .iter()
                        .map(|(id, m)| (id.clone(), m.connections, m.since))
                        .collect(),
                })
                .collect();
            let _ = s.changes.send(PresenceChange::Resync { rooms: state });
        }
    }

    /// A cluster-wide join or leave from the registry: to this node's
    /// connections of `channel` that asked.
    fn deliver(&self, channel: &str, join: bool, id: &str) {
        let mut rooms = self.rooms();
        if let Some(room) = rooms.get_mut(channel) {
            let action = if join {
                PresenceAction::Join
            } else {
                PresenceAction::Leave
            };
            room.notify(action, channel, id);
        }
    }
}

impl Presence {
    /// Presence shared through `registry` (cluster mode): this node's
    /// changes go to it in order, from one task on the current runtime
    /// (a change the registry fails to take is retried, then dropped with
    /// a warning: presence is best effort while the store is down), and its
    /// notices reach this node's listeners.
    pub fn shared(registry: Arc<dyn PresenceRegistry>) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<PresenceChange>();
        let inner = Arc::new(Inner {
            shared: Some(Shared {
                registry: registry.clone(),
                changes: tx,
            }),
            ..Inner::default()
        });
        let weak = Arc::downgrade(&inner);
        registry.on_notice(Box::new(move |channel, join, id| {
            if let Some(inner) = weak.upgrade() {
                inner.deliver(channel, join, id);
            }
        }));
        let weak = Arc::downgrade(&inner);
        registry.on_resync(Box::new(move || {
            if let Some(inner) = weak.upgrade() {
                inner.resync();
            }
        }));
        let weak = Arc::downgrade(&inner);
        tokio::spawn(async move {
            while let Some(change) = rx.recv().await {
                let mut tries = 0;
                while let Err(e) = registry.apply(&change).await {
                    tries += 1;
                    if tries >= 5 {
                        // The store may now hold less or more than this
                        // node has: send it all again, once it can take it
                        // (one Resync replaces any number of lost changes).
                        let resync = matches!(change, PresenceChange::Resync { .. });
                        if !resync {
                            tracing::warn!(error = %e, ?change, "presence: a change was not shared; all of this node's presence is sent again");
                        }
                        // A dropped Resync is queued again only when nothing
                        // else waits (the store is still down: one retry
                        // every few seconds, not a pile).
                        if !resync || rx.is_empty() {
                            if let Some(inner) = weak.upgrade() {
                                inner.resync();
                            }
                        }
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200 * tries)).await;
                }
            }
        });
        Presence { inner }
    }

    /// A new seat for one connection (it holds no place until
    /// [`Seat::enter`]).
    pub fn seat(&self) -> Seat {
        Seat {
            id: self.inner.next.fetch_add(1, Ordering::Relaxed) + 1,
            inner: self.inner.clone(),
            held: Vec::new(),
            queue: None,
        }
    }

    /// `channel`'s occupancy and members (sorted by id): this node's, or in
    /// cluster mode the cluster's.
    ///
    /// # Errors
    /// The registry's, in cluster mode (`unavailable`, …).
    pub async fn read(&self, channel: &str) -> Result<(usize, Vec<PresenceMember>), ApiError> {
        let Some(shared) = &self.inner.shared else {
            return Ok(self.snapshot(channel));
        };
        let p = shared.registry.read(channel).await?;
        let members = p
            .members
            .into_iter()
            .map(|m| PresenceMember {
                id: m.id,
                connections: m.connections,
                since: m.since,
            })
            .collect();
        Ok((p.occupancy, members))
    }

    /// `channel`'s occupancy and members (sorted by id) on this node.
    pub fn snapshot(&self, channel: &str) -> (usize, Vec<PresenceMember>) {
        let rooms = self.inner.rooms();
        let Some(room) = rooms.get(channel) else {
            return (0, Vec::new());
        };
        let members = room
            .members
            .iter()
            .map(|(id, m)| PresenceMember {
                id: id.clone(),
                connections: m.connections,
                since: m.since,
            })
            .collect();
        (room.connections, members)
    }
}

/// A place a connection holds in each channel it follows with presence.
struct Held {
    channel: String,
    member: Option<String>,
    listening: bool,
    linger_ms: u64,
}

/// One connection's places in the presence of its channels; leaving each
/// when dropped (or [`Seat::exit`]), so a connection that ends for any
/// reason leaves.
pub struct Seat {
    id: u64,
    inner: Arc<Inner>,
    held: Vec<Held>,
    /// The connection's notices, made when it first asks for them.
    queue: Option<(mpsc::Sender<PresenceNotice>, mpsc::Receiver<PresenceNotice>)>,
}

impl std::fmt::Debug for Seat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seat").finish_non_exhaustive()
    }
}

impl Seat {
    /// Takes a place in `channel` as `member` (`None`: occupancy only);
    /// with `listen`, this seat gets the channel's notices from now on.
    /// `linger_ms`: how long the member's last connection is gone before
    /// its leave. Entering a channel the seat holds as the same member only
    /// changes `listen`.
    pub fn enter(&mut self, channel: &str, member: Option<String>, listen: bool, linger_ms: u64) {
        if let Some(i) = self.held.iter().position(|h| h.channel == channel) {
            if self.held[i].member == member {
                self.held[i].listening = listen;
                let tx = listen.then(|| self.sender());
                let mut rooms = self.inner.rooms();
                let room = rooms.entry(channel.to_owned()).or_default();
                room.listeners.retain(|(id, _)| *id != self.id);
                if let Some(tx) = tx {
                    room.listeners.push((self.id, tx));
                }
                return;
            }
            self.exit(channel);
        }
        let tx = listen.then(|| self.sender());
        {
            let mut rooms = self.inner.rooms();
            let room = rooms.entry(channel.to_owned()).or_default();
            room.connections += 1;
            self.inner.counted(channel, member.as_ref(), 1);
            if let Some(id) = &member {
                match room.members.get_mut(id) {
                    Some(m) => {
                        // Back within its linger: neither a leave nor a join.
                        m.connections += 1;
                        m.leaving = 0;
                    }
                    None => {
                        let since = now_ms();
                        room.members.insert(
                            id.clone(),
                            Member {
                                connections: 1,
                                since,
                                leaving: 0,
                            },
                        );
                        self.inner.joined(room, channel, id, since);
                    }
                }
            }
            if let Some(tx) = tx {
                room.listeners.push((self.id, tx));
            }
        }
        self.held.push(Held {
            channel: channel.to_owned(),
            member,
            listening: listen,
            linger_ms,
        });
    }

    /// Gives up the place in `channel` (nothing if it holds none).
    pub fn exit(&mut self, channel: &str) {
        let Some(i) = self.held.iter().position(|h| h.channel == channel) else {
            return;
        };
        let held = self.held.swap_remove(i);
        self.leave(held);
    }

    fn leave(&self, held: Held) {
        let mut rooms = self.inner.rooms();
        let Some(room) = rooms.get_mut(&held.channel) else {
            return;
        };
        room.connections = room.connections.saturating_sub(1);
        self.inner.counted(&held.channel, held.member.as_ref(), -1);
        if held.listening {
            room.listeners.retain(|(id, _)| *id != self.id);
        }
        if let Some(id) = &held.member {
            if let Some(m) = room.members.get_mut(id) {
                m.connections = m.connections.saturating_sub(1);
                if m.connections == 0 {
                    let runtime = tokio::runtime::Handle::try_current().ok();
                    match runtime.filter(|_| held.linger_ms > 0) {
                        None => {
                            room.members.remove(id);
                            self.inner.left(room, &held.channel, id);
                        }
                        Some(rt) => {
                            let leaving = self.inner.next.fetch_add(1, Ordering::Relaxed) + 1;
                            m.leaving = leaving;
                            let inner = self.inner.clone();
                            let (channel, id, linger) = (
                                held.channel.clone(),
                                id.clone(),
                                Duration::from_millis(held.linger_ms),
                            );
                            rt.spawn(async move {
                                tokio::time::sleep(linger).await;
                                inner.expire(&channel, &id, leaving);
                            });
                        }
                    }
                }
            }
        }
        if room.is_empty() {
            rooms.remove(&held.channel);
        }
    }

    fn sender(&mut self) -> mpsc::Sender<PresenceNotice> {
        self.queue
            .get_or_insert_with(|| mpsc::channel(NOTICE_QUEUE))
            .0
            .clone()
    }

    /// Whether the seat holds no place.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// [`Seat::next`] as a poll function, for a stream that waits on it
    /// with no future of its own (docs/design.md, "Fan-out").
    pub fn poll_next(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<PresenceNotice> {
        match &mut self.queue {
            Some((_, rx)) => match rx.poll_recv(cx) {
                std::task::Poll::Ready(Some(n)) => std::task::Poll::Ready(n),
                // The seat holds a sender itself: the queue never closes.
                _ => std::task::Poll::Pending,
            },
            None => std::task::Poll::Pending,
        }
    }

    /// The next notice for this connection; never resolves when it asked
    /// for none. Cancel-safe.
    pub async fn next(&mut self) -> PresenceNotice {
        match &mut self.queue {
            // The seat holds a sender itself: the queue never closes.
            Some((_, rx)) => match rx.recv().await {
                Some(n) => n,
                None => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        for held in std::mem::take(&mut self.held) {
            self.leave(held);
        }
    }
}

/// Whether `channel`'s namespace has presence (`presence = true`).
pub fn enabled(app: &App, channel: &str) -> bool {
    app.config.namespaces.policy(channel).presence
}

/// Checks that `channel`'s namespace has presence.
///
/// # Errors
/// 404 `presence_disabled`, naming the namespace and the key.
pub fn require(app: &App, channel: &str) -> Result<(), ApiError> {
    if enabled(app, channel) {
        return Ok(());
    }
    let ns = namespace_of(channel);
    Err(ApiError::new(
        ErrorCode::PresenceDisabled,
        format!(
            "channel {channel:?} is in namespace {ns:?}, which has no presence \
             (presence = true in [namespaces.{ns}] of the configuration file turns it on)"
        ),
    ))
}

/// The member a subscriber is: on a server with keys, its token's `sub`
/// (`None` without one); on an open server, `client_id` (`None` when not
/// given).
///
/// # Errors
/// 400 `invalid_request`: a `client_id` that breaks
/// [`check_client_id`], or any `client_id` on a server with keys (a member
/// is then its token's `sub`, which a client cannot choose).
pub fn member(
    app: &App,
    grant: &Grant,
    client_id: Option<&str>,
) -> Result<Option<String>, ApiError> {
    if let Some(id) = client_id {
        check_client_id(id).map_err(|m| ApiError::new(ErrorCode::InvalidRequest, m))?;
        if !app.auth.is_open() {
            return Err(ApiError::new(
                ErrorCode::InvalidRequest,
                "client_id is for a server without keys; on this server a member is its \
                 token's sub",
            ));
        }
        return Ok(Some(id.to_owned()));
    }
    Ok(grant.subject.clone().filter(|_| !app.auth.is_open()))
}

/// Reads a `presence` flag (`true` or `false`; absent: false).
///
/// # Errors
/// 400 `invalid_request` for any other value.
pub fn wanted(value: Option<&str>) -> Result<bool, ApiError> {
    match value {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(v) => Err(ApiError::new(
            ErrorCode::InvalidRequest,
            format!("presence={v:?}: it is true or false"),
        )),
    }
}

/// Checks a stream's ask for notices: `listen` needs at least one of
/// `channels` with presence (the others' members are not told).
///
/// # Errors
/// 404 `presence_disabled` when `listen` and none of `channels` has
/// presence.
pub fn check_listen(app: &App, channels: &[String], listen: bool) -> Result<(), ApiError> {
    match channels.first() {
        Some(first) if listen && !channels.iter().any(|c| enabled(app, c)) => require(app, first),
        _ => Ok(()),
    }
}

/// The seat of a stream that follows `channels` (an SSE stream), once it
/// is open: a place in each of them whose namespace has presence, as
/// `member`; with `listen`, their notices ([`check_listen`] first). `None`
/// when none of them has presence.
pub fn stream_seat(
    app: &App,
    channels: &[String],
    member: Option<String>,
    listen: bool,
) -> Option<Seat> {
    let mut seat: Option<Seat> = None;
    for c in channels.iter().filter(|c| enabled(app, c)) {
        seat.get_or_insert_with(|| app.presence.seat()).enter(
            c,
            member.clone(),
            listen,
            linger_ms(app, c),
        );
    }
    seat
}

/// `channel`'s `presence_linger_ms` (its namespace's).
pub fn linger_ms(app: &App, channel: &str) -> u64 {
    app.config.namespaces.policy(channel).presence_linger_ms
}

/// `GET /v1/channels/{channel}/presence`: its occupancy and members.
///
/// # Errors
/// 400 `invalid_channel`; 401/403 without the subscribe right; 404
/// `presence_disabled` ([`require`]); in cluster mode the registry's
/// (503 `unavailable`, …).
pub async fn get(app: &App, grant: &Grant, channel: &str) -> Result<PresenceAnswer, ApiError> {
    names::channel(channel)?;
    grant.require(Action::Subscribe, channel)?;
    require(app, channel)?;
    let (occupancy, members) = app.presence.read(channel).await?;
    Ok(PresenceAnswer {
        channel: channel.to_owned(),
        occupancy,
        members,
    })
}
