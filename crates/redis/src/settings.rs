//! Redis's persistence settings, read with `CONFIG GET`: the warnings at
//! start, and what an acknowledged append survives (the `durability` label
//! of `gapless_events_published_total`, [`gapless_core::Journal::durability`]).
//!
//! The label follows what Redis does, not what `--durability` asked for
//! (docs/cluster.md, "What a 2xx means"):
//!
//! | Redis settings | label | a crash or restart of Redis |
//! |---|---|---|
//! | `appendonly yes`, `appendfsync always` | `sync` | loses nothing acknowledged |
//! | `appendonly yes`, `appendfsync everysec` or `no` | `async` | can lose the newest acknowledged events |
//! | `appendonly no`, RDB snapshots on (`save` not empty) | `async` | restores the last snapshot: loses what came after it |
//! | `appendonly no`, `save ""` | `memory` | loses every channel whole (told as an `epoch` gap) |
//! | `CONFIG` refused (some managed services), or not read yet | `unknown` | |
//!
//! Read at start, after every reconnect of the node's bus connection (a
//! restarted or failed-over Redis may have other settings), and at most
//! every [`REREAD_MS`] from the periodic head re-read.

use crate::Inner;
use gapless_core::JournalError;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// The labels, indexed by the value kept in [`Durability`].
const LABELS: [&str; 4] = ["unknown", "sync", "async", "memory"];

/// Longest time between two reads of the settings, in milliseconds.
pub(crate) const REREAD_MS: u64 = 60_000;

/// The label as last read, and when (Unix ms).
#[derive(Default)]
pub(crate) struct Durability {
    label: AtomicU8,
    read_ms: AtomicU64,
}

impl Durability {
    /// The current label (`unknown` before the first read).
    pub(crate) fn label(&self) -> &'static str {
        LABELS[usize::from(self.label.load(Ordering::Relaxed)).min(LABELS.len() - 1)]
    }

    fn set(&self, label: &'static str) -> &'static str {
        let i = LABELS.iter().position(|l| *l == label).unwrap_or(0);
        let old = self.label.swap(i as u8, Ordering::Relaxed);
        LABELS[usize::from(old).min(LABELS.len() - 1)]
    }
}

/// The values of the settings durability depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    pub(crate) appendonly: String,
    pub(crate) appendfsync: String,
    pub(crate) maxmemory_policy: String,
    pub(crate) save: String,
}

impl Settings {
    /// What an acknowledged append survives with these settings (the table above).
    pub(crate) fn durability(&self) -> &'static str {
        match (self.appendonly.as_str(), self.appendfsync.as_str()) {
            ("yes", "always") => "sync",
            ("yes", _) => "async",
            _ if !self.save.trim().is_empty() => "async",
            _ => "memory",
        }
    }

    /// One warning per setting that cannot give the promise: with `sync`
    /// (`--durability sync`) an acknowledged event must be fsynced in the
    /// AOF; either way an evicted channel loses its history.
    pub(crate) fn warnings(&self, sync: bool) -> Vec<String> {
        let mut warnings = Vec::new();
        // What a loss does is docs/cluster.md's ("Durability", "Redis back
        // with an older copy"), tested in tests/it/cluster_restore.rs.
        if sync && self.appendonly != "yes" {
            let loss = if self.save.trim().is_empty() {
                "every channel whole; clients are told with an epoch gap"
            } else {
                "the events acknowledged after the last RDB snapshot (`save`); every channel \
                 forks at the snapshot and the clients that had lost events are told with an \
                 epoch gap, but those events are gone"
            };
            warnings.push(format!(
                "Redis appendonly is '{}': with --durability sync an acknowledged event \
                 must be in the AOF; set `appendonly yes` (a restart of Redis would lose \
                 {loss})",
                self.appendonly
            ));
        }
        if sync && self.appendonly == "yes" && self.appendfsync != "always" {
            warnings.push(format!(
                "Redis appendfsync is '{}': with --durability sync a 2xx must mean fsynced; \
                 set `appendfsync always` (otherwise a crash of Redis can lose up to a second \
                 of acknowledged events: the channel forks and their clients are told with an \
                 epoch gap when a running node had delivered them, and nobody is told when no \
                 node had, e.g. all restarted too; docs/cluster.md)",
                self.appendfsync
            ));
        }
        if self.maxmemory_policy != "noeviction" {
            warnings.push(format!(
                "Redis maxmemory-policy is '{}': set `noeviction` (an evicted channel loses \
                 its whole history; clients are told so with an epoch gap)",
                self.maxmemory_policy
            ));
        }
        warnings
    }
}

/// What reading the settings gave.
pub(crate) enum Read {
    Settings(Settings),
    /// Redis refused `CONFIG GET` (the error).
    Refused(String),
}

impl Inner {
    /// Reads the settings and updates the durability label; warns when the
    /// label changes after the first read.
    ///
    /// # Errors
    /// [`JournalError::Unavailable`] when Redis cannot be reached.
    pub(crate) async fn read_settings(&self, now_ms: u64) -> Result<Read, JournalError> {
        let got = self
            .conn
            .run(|mut c| async move {
                let mut p = redis::pipe();
                for name in ["appendonly", "appendfsync", "maxmemory-policy", "save"] {
                    p.cmd("CONFIG").arg("GET").arg(name);
                }
                p.query_async::<Vec<Vec<String>>>(&mut c).await
            })
            .await;
        self.durability.read_ms.store(now_ms, Ordering::Relaxed);
        let (read, label) = match got {
            Ok(g) => {
                let value = |i: usize| g.get(i).and_then(|v| v.get(1)).cloned().unwrap_or_default();
                let s = Settings {
                    appendonly: value(0),
                    appendfsync: value(1),
                    maxmemory_policy: value(2),
                    save: value(3),
                };
                let label = s.durability();
                (Read::Settings(s), label)
            }
            Err(JournalError::Storage(e)) => (Read::Refused(e), "unknown"),
            Err(e) => return Err(e),
        };
        let old = self.durability.set(label);
        if old != "unknown" && old != label {
            tracing::warn!(
                from = old,
                to = label,
                "Redis persistence settings changed: acknowledged appends are now `{label}` \
                 (docs/cluster.md, \"What a 2xx means\")"
            );
        }
        Ok(read)
    }

    /// Re-reads the settings when [`REREAD_MS`] have passed since the last read.
    pub(crate) async fn reread_settings(&self, now_ms: u64) {
        let last = self.durability.read_ms.load(Ordering::Relaxed);
        if now_ms.saturating_sub(last) >= REREAD_MS {
            // One attempt per period, even when Redis does not answer.
            self.durability.read_ms.store(now_ms, Ordering::Relaxed);
            if let Err(e) = self.read_settings(now_ms).await {
                tracing::debug!(error = %e, "could not re-read the Redis persistence settings");
            }
        }
    }

    /// The durability label (see the module doc).
    pub(crate) fn durability(&self) -> &'static str {
        self.durability.label()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(appendonly: &str, appendfsync: &str, save: &str) -> Settings {
        Settings {
            appendonly: appendonly.into(),
            appendfsync: appendfsync.into(),
            maxmemory_policy: "noeviction".into(),
            save: save.into(),
        }
    }

    #[test]
    fn the_label_is_what_the_settings_give() {
        assert_eq!(s("yes", "always", "").durability(), "sync");
        assert_eq!(s("yes", "always", "3600 1").durability(), "sync");
        assert_eq!(s("yes", "everysec", "").durability(), "async");
        assert_eq!(s("yes", "no", "").durability(), "async");
        assert_eq!(s("no", "always", "3600 1 300 100").durability(), "async");
        assert_eq!(s("no", "always", "").durability(), "memory");
    }

    #[test]
    fn warnings_name_each_setting_that_breaks_the_promise() {
        assert!(s("yes", "always", "").warnings(true).is_empty());
        let w = s("yes", "everysec", "").warnings(true);
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("appendfsync"));
        assert!(s("yes", "everysec", "").warnings(false).is_empty());
        let w = s("no", "always", "").warnings(true);
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("appendonly"));
        // What docs/cluster.md says and cluster_restore.rs tests: after an RDB
        // restart the channels fork and the clients are told.
        assert!(w[0].contains("every channel whole"), "{}", w[0]);
        let w = s("no", "always", "3600 1").warnings(true);
        assert!(
            w[0].contains("forks at the snapshot") && w[0].contains("told with an epoch gap"),
            "{}",
            w[0]
        );
        assert!(!w[0].contains("without a gap notice"), "{}", w[0]);
        let mut evicting = s("yes", "always", "");
        evicting.maxmemory_policy = "allkeys-lru".into();
        assert!(evicting.warnings(false)[0].contains("maxmemory-policy"));
    }

    #[test]
    fn the_label_starts_unknown_and_follows_each_read() {
        let d = Durability::default();
        assert_eq!(d.label(), "unknown");
        assert_eq!(d.set("async"), "unknown");
        assert_eq!(d.label(), "async");
        assert_eq!(d.set("sync"), "async");
        assert_eq!(d.label(), "sync");
    }
}
