//! The upgrade from the subscriptions' side channel: older releases
//! journaled every subscription change as a versioned record in one
//! reserved channel, [`CHANNEL`] (`{"root", "id", "ver", "sub"}`, `sub`
//! absent for a deletion, plus the cluster's delivery lease). At its first
//! use a server reads whatever that channel still holds, writes each live
//! subscription's newest version into its own channel (only where that
//! channel has none, so nodes upgrading together agree), indexes it, and
//! purges the side channel. Nothing else reads it (docs/durable-streams.md,
//! "Subscriptions").

use super::model::Sub;
use super::store::{self, Held};
use crate::App;
use gapless_core::journal::JournalError;
use serde::Deserialize;
use std::collections::HashMap;

/// The reserved channel of the old records.
pub const CHANNEL: &str = "gapless/ds-subscriptions";

/// One old record (the delivery lease's have an empty `id`).
#[derive(Debug, Deserialize)]
struct Record {
    #[serde(default)]
    root: String,
    #[serde(default)]
    id: String,
    ver: u64,
    #[serde(default)]
    sub: Option<Sub>,
}

/// Each subscription's newest record in [`CHANNEL`]: the live ones.
async fn newest(app: &App) -> Result<Vec<Sub>, JournalError> {
    let mut newest: HashMap<(String, String), (u64, Option<Sub>)> = HashMap::new();
    let mut after = 0;
    loop {
        let page = app.hub.read(CHANNEL, after, 1000, 4 << 20).await?;
        let Some(last) = page.events.last() else {
            break;
        };
        after = last.seq;
        for ev in &page.events {
            let r = match serde_json::from_slice::<Record>(ev.data.as_bytes()) {
                Ok(r) if !r.id.is_empty() => r,
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(seq = ev.seq, error = %e, "skipping a malformed Durable Streams subscription record");
                    continue;
                }
            };
            let key = (r.root, r.id);
            if newest.get(&key).is_none_or(|(v, _)| *v < r.ver) {
                newest.insert(key, (r.ver, r.sub));
            }
        }
        if after >= page.state.head {
            break;
        }
    }
    Ok(newest.into_values().filter_map(|(_, s)| s).collect())
}

/// Imports what [`CHANNEL`] holds (module doc), then purges it. Returns
/// how many subscriptions were imported; 0 at once when the channel is
/// empty (every start after the first).
///
/// # Errors
/// [`JournalError`] when the journal cannot be read or written; nothing is
/// purged then, and the next use tries again.
pub async fn run(app: &App) -> Result<usize, JournalError> {
    if app.hub.state(CHANNEL).await?.head == 0 {
        return Ok(0);
    }
    let subs = newest(app).await?;
    let n = subs.len();
    for s in subs {
        store::index(app, &s.root, &s.id).await?;
        let channel = store::sub_channel(&s.root, &s.id);
        // Set only where the channel has none: a node that imported first
        // (or a change made since) wins.
        let put = store::put(app, &channel, &Held::<Sub>::none_yet(), Some(&s)).await?;
        if put.is_err() {
            tracing::debug!(subscription = %s.id, "already in its own channel; kept");
        }
    }
    app.hub.purge(CHANNEL).await?;
    tracing::info!(
        subscriptions = n,
        "Durable Streams subscriptions moved from {CHANNEL} into their own channels"
    );
    Ok(n)
}
