//! Presence shared between nodes (cluster mode; issue 21, "Presence"): what
//! the server's presence (`ops::presence` of the server crate) tells the
//! other nodes, and reads back. Each node keeps its own connections and
//! the linger of its members; a [`PresenceRegistry`] (the Redis one in
//! cluster mode) adds them up across nodes, decides the cluster-wide join
//! and leave of each member (its first node holding it, its last one
//! letting go), tells every node of them, and lets the members of a node
//! that stopped go.

use crate::JournalError;

/// One change of this node's presence on a channel, applied in the order
/// the node made them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PresenceChange {
    /// This node's connections to `channel` changed by `delta` (a
    /// connection came or went), `member`'s (`None`: a connection with no
    /// identity).
    Connections {
        /// The channel.
        channel: String,
        /// Whose connection, if anyone's.
        member: Option<String>,
        /// +1 or -1.
        delta: i64,
    },
    /// `member` is now on this node (its first connection here; it was not
    /// lingering): the cluster-wide join when no other node holds it.
    Hold {
        /// The channel.
        channel: String,
        /// The member.
        member: String,
        /// When it joined here, Unix ms (kept when it is the first node).
        since: u64,
    },
    /// `member` left this node (its last connection here gone
    /// `presence_linger_ms`): the cluster-wide leave when no other node
    /// holds it.
    Release {
        /// The channel.
        channel: String,
        /// The member.
        member: String,
    },
    /// All of this node's presence, to replace what the shared store holds
    /// of it: sent when the store may have lost or dropped some of this
    /// node's changes (its liveness lapsed, so other nodes took its members
    /// out; or a change could not be shared). Joins and leaves follow only
    /// from what differs.
    Resync {
        /// Every channel this node holds a place in.
        rooms: Vec<RoomState>,
    },
}

/// One channel's presence on this node, for [`PresenceChange::Resync`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomState {
    /// The channel.
    pub channel: String,
    /// Connections to it on this node, members' or not.
    pub connections: usize,
    /// Its members here: id, connections (0 while it lingers), since
    /// (Unix ms).
    pub members: Vec<(String, usize, u64)>,
}

/// One member of a channel across the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedMember {
    /// The member.
    pub id: String,
    /// Its connections on every node (0 while it lingers everywhere).
    pub connections: usize,
    /// When it joined, Unix ms.
    pub since: u64,
}

/// A channel's presence across the cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedPresence {
    /// Connections on every node, members' or not.
    pub occupancy: usize,
    /// Its members, sorted by id.
    pub members: Vec<SharedMember>,
}

/// Called with `(channel, join, member)` for each cluster-wide join
/// (`join` true) or leave, on every node.
pub type NoticeFn = Box<dyn Fn(&str, bool, &str) + Send + Sync>;

/// Presence shared between nodes.
#[async_trait::async_trait]
pub trait PresenceRegistry: Send + Sync + 'static {
    /// Applies one change of this node's presence.
    ///
    /// # Errors
    /// [`JournalError`] when the shared store fails.
    async fn apply(&self, change: &PresenceChange) -> Result<(), JournalError>;
    /// `channel`'s presence across the cluster.
    ///
    /// # Errors
    /// [`JournalError`] when the shared store fails.
    async fn read(&self, channel: &str) -> Result<SharedPresence, JournalError>;
    /// Sets what to call with each cluster-wide join and leave.
    fn on_notice(&self, notice: NoticeFn);
    /// Sets what to call when the store needs all of this node's presence
    /// again (the caller then sends a [`PresenceChange::Resync`]).
    fn on_resync(&self, resync: ResyncFn);
}

/// Called when the shared store needs this node's whole presence again.
pub type ResyncFn = Box<dyn Fn() + Send + Sync>;
