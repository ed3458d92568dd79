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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::subscriptions::model::{Config, Kind, Link};
    use gapless_core::hub::{Channels, Hub, WindowLimits};
    use gapless_core::journal::Retention;
    use gapless_core::memory::MemoryJournal;
    use gapless_core::session::{SessionConfig, Sessions};
    use gapless_protocol::{NewEvent, Payload};
    use std::sync::Arc;

    fn app() -> App {
        let channels = Arc::new(Channels::new(WindowLimits::default()));
        let journal = Arc::new(MemoryJournal::new(Retention::default(), channels.clone()));
        App {
            hub: Hub::new(channels, journal),
            sessions: Sessions::new(SessionConfig::default()),
            config: crate::config::ServerConfig::default(),
            shutdown: Default::default(),
            sockets: Default::default(),
            auth: crate::auth::Auth::open(),
            publish_limiter: crate::ops::limits::PublishLimiter::new(0, 0),
            presence: Default::default(),
            clock: Default::default(),
        }
    }

    fn sub(id: &str, generation: u64) -> Sub {
        Sub {
            id: id.into(),
            root: "v1/stream".into(),
            config: Config {
                kind: Kind::Webhook,
                pattern: Some(vec!["*".into()]),
                streams: Vec::new(),
                webhook_url: Some("https://example.com/hook".into()),
                wake_stream: None,
                lease_ttl_ms: 30_000,
                description: None,
            },
            base_url: "http://h/ds/v1/stream".into(),
            created_at: "2026-01-01T00:00:00.000Z".into(),
            links: [("a".to_owned(), Link::default())].into_iter().collect(),
            generation,
            wake: None,
            failures: 0,
            next_attempt_at: 0,
        }
    }

    async fn old(app: &App, record: serde_json::Value) {
        let ev = NewEvent {
            event_type: None,
            data: Payload::Text(record.to_string()),
        };
        app.hub
            .publish(CHANNEL, vec![ev], None)
            .await
            .expect("an old record");
    }

    /// The records an older release wrote (two versions of a live
    /// subscription, a deleted one, the delivery lease) are imported at
    /// first use, each newest live version into its own channel and index,
    /// and the side channel is purged; a second run finds nothing.
    #[tokio::test]
    async fn old_records_are_imported_then_purged() {
        let app = app();
        let kept = serde_json::to_value(sub("kept", 1)).expect("json");
        let newer = serde_json::to_value(sub("kept", 4)).expect("json");
        let gone = serde_json::to_value(sub("gone", 1)).expect("json");
        let root = "v1/stream";
        old(
            &app,
            serde_json::json!({"root": root, "id": "kept", "ver": 1, "sub": kept}),
        )
        .await;
        old(
            &app,
            serde_json::json!({"root": root, "id": "gone", "ver": 1, "sub": gone}),
        )
        .await;
        old(
            &app,
            serde_json::json!({"deliverer": {"node": "n", "until": 1}, "ver": 3}),
        )
        .await;
        old(
            &app,
            serde_json::json!({"root": root, "id": "kept", "ver": 2, "sub": newer}),
        )
        .await;
        old(
            &app,
            serde_json::json!({"root": root, "id": "gone", "ver": 2}),
        )
        .await;
        assert_eq!(run(&app).await.expect("imported"), 1);
        let held = store::read::<Sub>(&app, &store::sub_channel(root, "kept"))
            .await
            .expect("read");
        assert_eq!(
            held.value.map(|s| s.generation),
            Some(4),
            "the newest version"
        );
        let gone = store::read::<Sub>(&app, &store::sub_channel(root, "gone")).await;
        assert!(gone.expect("read").value.is_none(), "a deletion stays one");
        assert_eq!(
            store::all(&app).await.expect("indexes"),
            vec![(root.to_owned(), "kept".to_owned())]
        );
        assert_eq!(
            app.hub.state(CHANNEL).await.expect("state").head,
            0,
            "purged"
        );
        assert_eq!(run(&app).await.expect("nothing left"), 0);
    }
}
