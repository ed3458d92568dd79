//! Sessions in Redis: the attach leases shared by every node (the
//! [`SessionRegistry`] of cluster mode, [`RedisSessions`], which the binary
//! builds beside the journal and hands to the session layer). That nothing
//! is appended after a session's end is the journal's rule for a closed
//! channel (the session's channel metadata, `meta.rs`), not one of its own.
//!
//! Per session two keys, with the hash tag of the session's channel (one
//! slot): `gapless:{session/<id>}:att` holds the holder (`<node>:<conn>`)
//! with a TTL of the lease, and `gapless:{session/<id>}:det` the Unix ms
//! since which nobody holds it (the release, or the end of the current lease
//! should it lapse; kept one day). A takeover publishes `kick <holder>` on
//! the bus; the holder's node closes that consumer with 4409.

use crate::{Inner, RedisJournal, BUS_CHANNEL};
use async_trait::async_trait;
use gapless_core::session::{SessionRegistry, SharedAttach};
use gapless_core::JournalError;
use std::sync::Arc;

const TIME: &str = r#"#!lua
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function S(n) return string.format('%d', n) end
"#;

/// KEYS = att, det; ARGV = holder, takeover (1/0), lease ms, bus. Returns 1 when claimed.
const CLAIM: &str = r#"
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then
  if ARGV[2] ~= '1' then return 0 end
  redis.call('PUBLISH', ARGV[4], 'kick ' .. cur)
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('SET', KEYS[2], S(now + tonumber(ARGV[3])), 'PX', 86400000)
return 1
"#;

/// KEYS = att, det; ARGV = holder, lease ms. Returns 1 while `holder` holds it.
const RENEW: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], S(now + tonumber(ARGV[2])), 'PX', 86400000)
return 1
"#;

/// KEYS = att, det; ARGV = holder.
const RELEASE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[2], S(now), 'PX', 86400000)
end
return 1
"#;

/// KEYS = att, det. Returns {attached (0/1), detached since (-1: unknown)}.
const STATE: &str = r#"#!lua
if redis.call('EXISTS', KEYS[1]) == 1 then return {1, -1} end
local d = redis.call('GET', KEYS[2])
if d then return {0, tonumber(d)} end
return {0, -1}
"#;

/// The scripts, compiled once.
struct LeaseScripts {
    claim: redis::Script,
    renew: redis::Script,
    release: redis::Script,
    state: redis::Script,
}

impl LeaseScripts {
    fn new() -> Self {
        LeaseScripts {
            claim: redis::Script::new(&format!("{TIME}{CLAIM}")),
            renew: redis::Script::new(&format!("{TIME}{RENEW}")),
            release: redis::Script::new(&format!("{TIME}{RELEASE}")),
            state: redis::Script::new(STATE),
        }
    }
}

fn keys(id: &str) -> (String, String) {
    let ch = gapless_core::session::channel_of(id);
    (
        format!("gapless:{{{ch}}}:att"),
        format!("gapless:{{{ch}}}:det"),
    )
}

/// The attach leases of sessions in the Redis of a [`RedisJournal`], on its
/// connection and its bus (see the module doc).
pub struct RedisSessions {
    inner: Arc<Inner>,
    leases: LeaseScripts,
}

impl std::fmt::Debug for RedisSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSessions").finish_non_exhaustive()
    }
}

impl RedisSessions {
    /// The registry in `journal`'s Redis. A takeover's kick reaches this
    /// node through `journal`'s notification listener.
    pub fn new(journal: &RedisJournal) -> Self {
        RedisSessions {
            inner: journal.inner.clone(),
            leases: LeaseScripts::new(),
        }
    }
}

#[async_trait]
impl SessionRegistry for RedisSessions {
    async fn claim(
        &self,
        id: &str,
        holder: &str,
        takeover: bool,
        lease_ms: u64,
    ) -> Result<bool, JournalError> {
        let (att, det) = keys(id);
        let s = &self.leases.claim;
        let n: i64 = self
            .inner
            .conn
            .run(|mut c| {
                let mut inv = s.prepare_invoke();
                inv.key(&att)
                    .key(&det)
                    .arg(holder)
                    .arg(if takeover { "1" } else { "0" })
                    .arg(lease_ms)
                    .arg(BUS_CHANNEL);
                async move { inv.invoke_async(&mut c).await }
            })
            .await?;
        Ok(n == 1)
    }

    async fn renew(&self, id: &str, holder: &str, lease_ms: u64) -> Result<bool, JournalError> {
        let (att, det) = keys(id);
        let s = &self.leases.renew;
        let n: i64 = self
            .inner
            .conn
            .run(|mut c| {
                let mut inv = s.prepare_invoke();
                inv.key(&att).key(&det).arg(holder).arg(lease_ms);
                async move { inv.invoke_async(&mut c).await }
            })
            .await?;
        Ok(n == 1)
    }

    async fn release(&self, id: &str, holder: &str) -> Result<(), JournalError> {
        let (att, det) = keys(id);
        let s = &self.leases.release;
        let _: i64 = self
            .inner
            .conn
            .run(|mut c| {
                let mut inv = s.prepare_invoke();
                inv.key(&att).key(&det).arg(holder);
                async move { inv.invoke_async(&mut c).await }
            })
            .await?;
        Ok(())
    }

    async fn state(&self, id: &str) -> Result<SharedAttach, JournalError> {
        let (att, det) = keys(id);
        let s = &self.leases.state;
        let (attached, since): (i64, i64) = self
            .inner
            .conn
            .run(|mut c| {
                let mut inv = s.prepare_invoke();
                inv.key(&att).key(&det);
                async move { inv.invoke_async(&mut c).await }
            })
            .await?;
        Ok(SharedAttach {
            attached: attached == 1,
            detached_since: u64::try_from(since).ok(),
        })
    }

    fn on_kick(&self, kick: Box<dyn Fn(&str) + Send + Sync>) {
        *self.inner.kick.write() = Some(kick);
    }
}

#[cfg(test)]
mod tests {
    use gapless_core::session::{CANCELLED, COMPLETED, OPENED};

    #[test]
    fn the_append_rule_knows_the_end_markers_by_their_length() {
        // APPEND_RULE matches `^%d+:t25:gapless%.session%.`: only the two end markers.
        assert_eq!((COMPLETED.len(), CANCELLED.len()), (25, 25));
        assert_ne!(OPENED.len(), 25);
        for m in [COMPLETED, CANCELLED, OPENED] {
            assert!(m.starts_with("gapless.session."));
        }
    }
}
