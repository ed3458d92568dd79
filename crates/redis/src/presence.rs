//! Presence in Redis (cluster mode; issue 21, "Presence"): the
//! [`PresenceRegistry`] every node shares, [`RedisPresence`], built beside
//! the journal on its connection and bus.
//!
//! Per channel four keys, with the channel's hash tag (one slot):
//!
//! - `gapless:{<channel>}:pp`, a set of `<member> LF <node>`: which node
//!   holds which member (from the member's first connection on the node to
//!   its leave there, after its linger);
//! - `gapless:{<channel>}:pm`, a hash member → how many nodes hold it; the
//!   first node is its cluster-wide join, the last one letting go its
//!   leave, each published on the bus as `pres j <channel> <member>` /
//!   `pres l <channel> <member>` to every node (this one too);
//! - `gapless:{<channel>}:ps`, a hash member → when it joined (Unix ms);
//! - `gapless:{<channel>}:pc`, a hash `<node>` → that node's connections
//!   and `<node> LF <member>` → the member's connections there.
//!
//! Each node keeps `gapless:presence:node:<node>` alive (a key with a TTL
//! of [`NODE_TTL_MS`], set every [`BEAT_MS`]), lists itself in
//! `gapless:presence:nodes` and the channels it touched in
//! `gapless:presence:node:<node>:ch`. Every node looks at the list every
//! [`BEAT_MS`]: a node whose key is gone has stopped, and its members and
//! counts are taken out of each of its channels (its members leave, each
//! once, whichever node does it): within `NODE_TTL_MS + BEAT_MS`, 13 s.

use crate::{Inner, RedisJournal, BUS_CHANNEL};
use async_trait::async_trait;
use gapless_core::presence::{
    NoticeFn, PresenceChange, PresenceRegistry, SharedMember, SharedPresence,
};
use gapless_core::JournalError;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The prefix of a presence notice on the bus.
pub(crate) const PREFIX: &[u8] = b"pres ";

/// How long a node's liveness key lives without renewal, ms.
pub(crate) const NODE_TTL_MS: u64 = 10_000;

/// How often a node renews its key and looks for stopped nodes, ms.
pub(crate) const BEAT_MS: u64 = 3_000;

const NODES: &str = "gapless:presence:nodes";

fn node_key(node: &str) -> String {
    format!("gapless:presence:node:{node}")
}

fn node_channels(node: &str) -> String {
    format!("gapless:presence:node:{node}:ch")
}

fn keys(channel: &str) -> [String; 4] {
    ["pm", "ps", "pp", "pc"].map(|k| format!("gapless:{{{channel}}}:{k}"))
}

/// Lets `member` go from `node` (KEYS = pm, ps, pp, pc; ARGV[3] = bus,
/// ARGV[4] = channel).
const RELEASE_FN: &str = r#"
local function release(node, member)
  if redis.call('SREM', KEYS[3], member .. '\n' .. node) == 1 then
    if redis.call('HINCRBY', KEYS[1], member, -1) <= 0 then
      redis.call('HDEL', KEYS[1], member)
      redis.call('HDEL', KEYS[2], member)
      redis.call('PUBLISH', ARGV[3], 'pres l ' .. ARGV[4] .. ' ' .. member)
    end
  end
end
"#;

/// KEYS = pm, ps, pp, pc; ARGV = node, member, bus, channel, since.
const HOLD: &str = r#"
if redis.call('SADD', KEYS[3], ARGV[2] .. '\n' .. ARGV[1]) == 1 then
  if redis.call('HINCRBY', KEYS[1], ARGV[2], 1) == 1 then
    redis.call('HSET', KEYS[2], ARGV[2], ARGV[5])
    redis.call('PUBLISH', ARGV[3], 'pres j ' .. ARGV[4] .. ' ' .. ARGV[2])
  end
end
return 1
"#;

/// KEYS = pm, ps, pp, pc; ARGV = node, member, bus, channel.
const RELEASE: &str = r#"
release(ARGV[1], ARGV[2])
return 1
"#;

/// A stopped node: all of it. KEYS = pm, ps, pp, pc; ARGV = node, "", bus, channel.
const REAP: &str = r#"
for _, pair in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  local m, n = string.match(pair, '^(.*)\n([^\n]*)$')
  if n == ARGV[1] then release(n, m) end
end
local prefix = ARGV[1] .. '\n'
for _, f in ipairs(redis.call('HKEYS', KEYS[4])) do
  if f == ARGV[1] or string.sub(f, 1, #prefix) == prefix then
    redis.call('HDEL', KEYS[4], f)
  end
end
return 1
"#;

/// This node's whole presence in one channel, replacing what Redis holds of
/// it (`PresenceChange::Resync`): members it no longer has are let go,
/// members Redis lacks are held (joins and leaves only for what differs),
/// and its counts are set. KEYS = pm, ps, pp, pc; ARGV = node, "", bus,
/// channel, connections, then member, connections, since for each member.
const RESYNC: &str = r#"
local node = ARGV[1]
local want = {}
local i = 6
while i + 2 <= #ARGV do
  want[ARGV[i]] = {tonumber(ARGV[i + 1]), ARGV[i + 2]}
  i = i + 3
end
for _, pair in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  local m, n = string.match(pair, '^(.*)\n([^\n]*)$')
  if n == node and not want[m] then release(n, m) end
end
for m, v in pairs(want) do
  if redis.call('SADD', KEYS[3], m .. '\n' .. node) == 1 then
    if redis.call('HINCRBY', KEYS[1], m, 1) == 1 then
      redis.call('HSET', KEYS[2], m, v[2])
      redis.call('PUBLISH', ARGV[3], 'pres j ' .. ARGV[4] .. ' ' .. m)
    end
  end
end
local prefix = node .. '\n'
for _, f in ipairs(redis.call('HKEYS', KEYS[4])) do
  if f == node or string.sub(f, 1, #prefix) == prefix then
    redis.call('HDEL', KEYS[4], f)
  end
end
if tonumber(ARGV[5]) > 0 then redis.call('HSET', KEYS[4], node, ARGV[5]) end
for m, v in pairs(want) do
  if v[1] > 0 then redis.call('HSET', KEYS[4], prefix .. m, v[1]) end
end
return 1
"#;

/// Renews a node's liveness key. KEYS = the key; ARGV = its TTL in ms.
/// Returns 1 when the key was still there (0: it lapsed, and other nodes
/// may have taken this node's members out).
const BEAT: &str = r#"
local was = redis.call('EXISTS', KEYS[1])
redis.call('SET', KEYS[1], 1, 'PX', ARGV[1])
return was
"#;

/// KEYS = pc; ARGV = node, member ("" for none), delta.
const CONNECTIONS: &str = r#"
local function add(f)
  if redis.call('HINCRBY', KEYS[1], f, tonumber(ARGV[3])) <= 0 then
    redis.call('HDEL', KEYS[1], f)
  end
end
add(ARGV[1])
if ARGV[2] ~= '' then add(ARGV[1] .. '\n' .. ARGV[2]) end
return 1
"#;

/// KEYS = pc, ps. Returns {HGETALL pc, HGETALL ps}.
const READ: &str = r#"
return {redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2])}
"#;

struct Scripts {
    hold: redis::Script,
    release: redis::Script,
    reap: redis::Script,
    resync: redis::Script,
    beat: redis::Script,
    connections: redis::Script,
    read: redis::Script,
}

/// Presence in the Redis of a [`RedisJournal`], on its connection and its
/// bus (see the module doc).
pub struct RedisPresence {
    inner: Arc<Inner>,
    scripts: Arc<Scripts>,
    /// What to call when this node's whole presence is needed again.
    resync: Arc<parking_lot::RwLock<Option<gapless_core::presence::ResyncFn>>>,
}

impl std::fmt::Debug for RedisPresence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPresence").finish_non_exhaustive()
    }
}

impl RedisPresence {
    /// The registry in `journal`'s Redis; starts this node's liveness beat
    /// (and its search for stopped nodes) on the current runtime, until the
    /// journal closes. Notices reach this node through `journal`'s
    /// notification listener.
    pub fn new(journal: &RedisJournal) -> Self {
        let scripts = Arc::new(Scripts {
            hold: redis::Script::new(&format!("{RELEASE_FN}{HOLD}")),
            release: redis::Script::new(&format!("{RELEASE_FN}{RELEASE}")),
            reap: redis::Script::new(&format!("{RELEASE_FN}{REAP}")),
            resync: redis::Script::new(&format!("{RELEASE_FN}{RESYNC}")),
            beat: redis::Script::new(BEAT),
            connections: redis::Script::new(CONNECTIONS),
            read: redis::Script::new(READ),
        });
        let me = RedisPresence {
            inner: journal.inner.clone(),
            scripts,
            resync: Arc::default(),
        };
        let (inner, scripts, cancel, resync) = (
            me.inner.clone(),
            me.scripts.clone(),
            journal.tasks.clone(),
            me.resync.clone(),
        );
        tokio::spawn(async move {
            let mut beat = tokio::time::interval(Duration::from_millis(BEAT_MS));
            beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut first = true;
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    _ = beat.tick() => {}
                }
                match alive_and_reap(&inner, &scripts).await {
                    // This node's key had lapsed (a pause, a partition from
                    // Redis): other nodes may have taken its members out.
                    Ok(false) if !first => {
                        tracing::info!(
                            "presence: this node's liveness had lapsed; its presence is sent again"
                        );
                        if let Some(f) = resync.read().as_ref() {
                            f();
                        }
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!(error = %e, "presence: the node beat failed"),
                }
                first = false;
            }
        });
        me
    }
}

/// Lists `channel` among the channels `node` holds presence in
/// (`gapless:presence:node:<node>:ch`), so a stop of the node is cleaned up
/// there.
async fn list_channel(inner: &Inner, node: &str, channel: &str) -> Result<(), JournalError> {
    let ch_key = node_channels(node);
    inner
        .conn
        .run(|mut c| {
            let (ch_key, channel) = (ch_key.clone(), channel.to_owned());
            async move {
                redis::cmd("SADD")
                    .arg(&ch_key)
                    .arg(&channel)
                    .query_async::<()>(&mut c)
                    .await
            }
        })
        .await
}

/// Takes all of `node` out of `channel`'s presence ([`REAP`]): its members
/// leave (each once, cluster-wide), its counts go.
async fn reap(
    inner: &Inner,
    scripts: &Scripts,
    node: &str,
    channel: &str,
) -> Result<(), JournalError> {
    let ks = keys(channel);
    let s = &scripts.reap;
    let _: i64 = inner
        .conn
        .run(|mut c| {
            let mut inv = s.prepare_invoke();
            for k in &ks {
                inv.key(k);
            }
            inv.arg(node).arg("").arg(BUS_CHANNEL).arg(channel);
            async move { inv.invoke_async(&mut c).await }
        })
        .await?;
    Ok(())
}

/// Renews this node's key, then takes the stopped nodes out. Returns
/// whether this node's key was still there before the renewal.
async fn alive_and_reap(inner: &Arc<Inner>, scripts: &Scripts) -> Result<bool, JournalError> {
    let me = inner.node.clone();
    let key = node_key(&me);
    let s = &scripts.beat;
    let was: i64 = inner
        .conn
        .run(|mut c| {
            let mut inv = s.prepare_invoke();
            inv.key(&key).arg(NODE_TTL_MS);
            async move { inv.invoke_async(&mut c).await }
        })
        .await?;
    inner
        .conn
        .run(|mut c| {
            let me = me.clone();
            async move {
                redis::cmd("SADD")
                    .arg(NODES)
                    .arg(&me)
                    .query_async::<()>(&mut c)
                    .await
            }
        })
        .await?;
    let nodes: Vec<String> = inner
        .conn
        .run(|mut c| async move { redis::cmd("SMEMBERS").arg(NODES).query_async(&mut c).await })
        .await?;
    for node in nodes.into_iter().filter(|n| *n != me) {
        let k = node_key(&node);
        let alive: bool = inner
            .conn
            .run(|mut c| {
                let k = k.clone();
                async move { redis::cmd("EXISTS").arg(&k).query_async(&mut c).await }
            })
            .await?;
        if alive {
            continue;
        }
        let ch_key = node_channels(&node);
        let channels: Vec<String> = inner
            .conn
            .run(|mut c| {
                let ch_key = ch_key.clone();
                async move {
                    redis::cmd("SMEMBERS")
                        .arg(&ch_key)
                        .query_async(&mut c)
                        .await
                }
            })
            .await?;
        tracing::info!(
            node,
            channels = channels.len(),
            "presence: a node stopped; its members leave"
        );
        for channel in &channels {
            reap(inner, scripts, &node, channel).await?;
        }
        inner
            .conn
            .run(|mut c| {
                let (ch_key, node) = (ch_key.clone(), node.clone());
                async move {
                    redis::pipe()
                        .cmd("DEL")
                        .arg(&ch_key)
                        .ignore()
                        .cmd("SREM")
                        .arg(NODES)
                        .arg(&node)
                        .ignore()
                        .query_async::<()>(&mut c)
                        .await
                }
            })
            .await?;
    }
    Ok(was == 1)
}

#[async_trait]
impl PresenceRegistry for RedisPresence {
    async fn apply(&self, change: &PresenceChange) -> Result<(), JournalError> {
        let node = self.inner.node.clone();
        match change {
            PresenceChange::Connections {
                channel,
                member,
                delta,
            } => {
                if *delta > 0 {
                    // Listed before anything of the channel is kept, so a
                    // stop of this node is cleaned up everywhere it was.
                    list_channel(&self.inner, &node, channel).await?;
                }
                let [_, _, _, pc] = keys(channel);
                let s = &self.scripts.connections;
                let mut inv = s.prepare_invoke();
                inv.key(&pc)
                    .arg(&node)
                    .arg(member.as_deref().unwrap_or(""))
                    .arg(*delta);
                // Not idempotent: never sent twice.
                let _: i64 = self
                    .inner
                    .conn
                    .run_unrepeatable(|mut c| async move { inv.invoke_async(&mut c).await })
                    .await?;
            }
            PresenceChange::Hold {
                channel,
                member,
                since,
            } => {
                let ks = keys(channel);
                let s = &self.scripts.hold;
                let _: i64 = self
                    .inner
                    .conn
                    .run(|mut c| {
                        let mut inv = s.prepare_invoke();
                        for k in &ks {
                            inv.key(k);
                        }
                        inv.arg(&node)
                            .arg(member)
                            .arg(BUS_CHANNEL)
                            .arg(channel)
                            .arg(*since);
                        async move { inv.invoke_async(&mut c).await }
                    })
                    .await?;
            }
            PresenceChange::Release { channel, member } => {
                let ks = keys(channel);
                let s = &self.scripts.release;
                let _: i64 = self
                    .inner
                    .conn
                    .run(|mut c| {
                        let mut inv = s.prepare_invoke();
                        for k in &ks {
                            inv.key(k);
                        }
                        inv.arg(&node).arg(member).arg(BUS_CHANNEL).arg(channel);
                        async move { inv.invoke_async(&mut c).await }
                    })
                    .await?;
            }
            PresenceChange::Resync { rooms } => self.resync(rooms).await?,
        }
        Ok(())
    }

    async fn read(&self, channel: &str) -> Result<SharedPresence, JournalError> {
        let [_, ps, _, pc] = keys(channel);
        let s = &self.scripts.read;
        let (counts, since): (Vec<String>, Vec<String>) = self
            .inner
            .conn
            .run(|mut c| {
                let mut inv = s.prepare_invoke();
                inv.key(&pc).key(&ps);
                async move { inv.invoke_async(&mut c).await }
            })
            .await?;
        let mut out = SharedPresence::default();
        let mut members: BTreeMap<String, SharedMember> = BTreeMap::new();
        for pair in since.chunks_exact(2) {
            members.insert(
                pair[0].clone(),
                SharedMember {
                    id: pair[0].clone(),
                    connections: 0,
                    since: pair[1].parse().unwrap_or(0),
                },
            );
        }
        for pair in counts.chunks_exact(2) {
            let n = usize::try_from(pair[1].parse::<i64>().unwrap_or(0)).unwrap_or(0);
            match pair[0].split_once('\n') {
                None => out.occupancy += n,
                Some((_, member)) => {
                    if let Some(m) = members.get_mut(member) {
                        m.connections += n;
                    }
                }
            }
        }
        out.members = members.into_values().collect();
        Ok(out)
    }

    fn on_notice(&self, notice: NoticeFn) {
        *self.inner.presence.write() = Some(notice);
    }

    fn on_resync(&self, resync: gapless_core::presence::ResyncFn) {
        *self.resync.write() = Some(resync);
    }
}

impl RedisPresence {
    /// Replaces what Redis holds of this node with `rooms`: the channels it
    /// listed and no longer holds are reaped (for this node only), the
    /// others set by [`RESYNC`]. Idempotent.
    async fn resync(
        &self,
        rooms: &[gapless_core::presence::RoomState],
    ) -> Result<(), JournalError> {
        let node = self.inner.node.clone();
        let ch_key = node_channels(&node);
        let listed: Vec<String> = self
            .inner
            .conn
            .run(|mut c| {
                let ch_key = ch_key.clone();
                async move {
                    redis::cmd("SMEMBERS")
                        .arg(&ch_key)
                        .query_async(&mut c)
                        .await
                }
            })
            .await?;
        for channel in listed
            .iter()
            .filter(|c| !rooms.iter().any(|r| &r.channel == *c))
        {
            reap(&self.inner, &self.scripts, &node, channel).await?;
        }
        for room in rooms {
            let channel = &room.channel;
            list_channel(&self.inner, &node, channel).await?;
            let ks = keys(channel);
            let s = &self.scripts.resync;
            let _: i64 = self
                .inner
                .conn
                .run(|mut c| {
                    let mut inv = s.prepare_invoke();
                    for k in &ks {
                        inv.key(k);
                    }
                    inv.arg(&node)
                        .arg("")
                        .arg(BUS_CHANNEL)
                        .arg(channel)
                        .arg(room.connections);
                    for (id, connections, since) in &room.members {
                        inv.arg(id).arg(*connections).arg(*since);
                    }
                    async move { inv.invoke_async(&mut c).await }
                })
                .await?;
        }
        Ok(())
    }
}

/// Parses what follows [`PREFIX`]: `(channel, join, member)`.
pub(crate) fn parse(rest: &[u8]) -> Option<(&str, bool, &str)> {
    let rest = std::str::from_utf8(rest).ok()?;
    let (action, rest) = rest.split_once(' ')?;
    let (channel, member) = rest.split_once(' ')?;
    let join = match action {
        "j" => true,
        "l" => false,
        _ => return None,
    };
    Some((channel, join, member))
}

#[cfg(test)]
mod tests {
    #[test]
    fn notices_parse() {
        assert_eq!(super::parse(b"j room:1 ana"), Some(("room:1", true, "ana")));
        assert_eq!(super::parse(b"l c b:c"), Some(("c", false, "b:c")));
        assert_eq!(super::parse(b"x c b"), None);
        assert_eq!(super::parse(b"j c"), None);
    }
}
