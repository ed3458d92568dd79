//! The operations of the subscription APIs (PROTOCOL.md 6.2-6.4, 7.1-7.3),
//! each journaled before it answers ([`super::store::Tx`]): a change
//! computed on a stale view loses to the one stored first and is computed
//! again, so two nodes never both claim one wake. Answers are the
//! protocol's JSON bodies; refusals are [`Error`]s.
//!
//! Authorization (gapless's own tokens, docs/durable-streams.md): managing a
//! subscription and claiming it need `subscribe` on every channel under the
//! root ([`authorize`]), a pull-wake subscription also `publish` on its
//! wake stream's channel; callbacks, acks and releases are authorized by
//! the wake's own token instead.

use super::model::{self, Config, Kind, Link, Sub, Wake};
use super::store::{self, Tx};
use super::{Cx, Error};
use crate::auth::{Action, Grant};
use crate::ops::streams::names;
use gapless_core::journal::now_ms;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The largest subscription request body, in bytes.
pub const MAX_BODY: usize = 64 * 1024;

/// The most streams a pattern links when its subscription is created
/// (found in the journal, `Hub::channels_with_meta`).
pub const MAX_PATTERN_LINKS: usize = 10_000;

/// Whether `grant` may manage or claim the subscriptions under `root`: it
/// subscribes to every channel under it (a grant pattern covering the
/// root's channel prefix).
///
/// # Errors
/// [`Error::Forbidden`] naming what is needed.
pub fn authorize(grant: &Grant, root: &str) -> Result<(), Error> {
    let prefix = model::root_prefix(root);
    if grant.subscribe.0.iter().any(|p| p.covers_prefix(&prefix)) {
        return Ok(());
    }
    Err(Error::Forbidden(format!(
        "managing or claiming a subscription under {root:?} needs `subscribe` on every \
         channel under it (a grant pattern covering {prefix:?})"
    )))
}

/// Checks a request's root and subscription id.
///
/// # Errors
/// [`Error::Id`], or [`Error::Path`] for a root that names no channel.
pub fn check_names(root: &str, id: &str) -> Result<(), Error> {
    if !model::valid_id(id) {
        return Err(Error::Id);
    }
    if !root.is_empty() {
        names::channel_of(root).map_err(|names::BadPath(m)| Error::Path(m))?;
    }
    Ok(())
}

/// A linked stream in a wake: its offsets and whether work is pending.
#[derive(Debug)]
pub struct Pending {
    /// Its path, relative to the root.
    pub path: String,
    /// `explicit` or `glob`.
    pub link_type: &'static str,
    /// The acked offset (the stream's start when none).
    pub acked: String,
    /// Its tail now.
    pub tail: String,
    /// Whether the tail is past the acked offset.
    pub pending: bool,
}

impl Pending {
    /// As a wake or a claim lists it.
    pub fn json(&self) -> Value {
        json!({
            "path": self.path,
            "link_type": self.link_type,
            "acked_offset": self.acked,
            "tail_offset": self.tail,
            "has_pending": self.pending,
        })
    }
}

impl Cx {
    /// A stream's offsets now: (start, tail). `None` when no stream is at
    /// the path (or it is deleted).
    pub async fn offsets(&self, root: &str, rel: &str) -> Option<(String, String)> {
        let channel = names::channel_of(&model::full(root, rel)).ok()?;
        let stream = self.streams.load(&self.app.hub, &channel).await.ok()??;
        let mut m = stream.lock().await;
        if m.deleted || m.soft_deleted {
            return None;
        }
        let tail = crate::ops::streams::layout::synced_tail(&self.app, &mut m)
            .await
            .ok()?;
        Some((
            names::offset(m.epoch, m.layout.start()),
            names::offset(m.epoch, tail),
        ))
    }

    /// The linked streams that exist now, with their offsets.
    pub async fn snapshot(&self, s: &Sub) -> Vec<Pending> {
        let mut out = Vec::new();
        for (path, l) in &s.links {
            let Some((start, tail)) = self.offsets(&s.root, path).await else {
                continue;
            };
            let acked = l.acked.clone().unwrap_or(start);
            let pending = model::after(&tail, &acked);
            out.push(Pending {
                path: path.clone(),
                link_type: l.link_type(),
                acked,
                tail,
                pending,
            });
        }
        out
    }

    /// The stream paths under `root` (relative) that `pattern` matches
    /// among the streams this node has read, except the subscription's own
    /// wake stream (its wake events would wake it again, without end).
    pub fn matching(&self, root: &str, pattern: &[String], wake: Option<&str>) -> Vec<String> {
        let prefix = model::root_prefix(root);
        self.streams
            .channels()
            .into_iter()
            .filter_map(|c| c.strip_prefix(prefix.as_str()).map(names::path_of))
            .filter(|rel| model::glob(pattern, rel) && Some(rel.as_str()) != wake)
            .collect()
    }

    async fn begin(&self, root: &str, id: &str) -> Result<Tx<'_>, Error> {
        Ok(self
            .subs
            .store
            .begin(&self.app, store::sub_channel(root, id), self.fresh())
            .await?)
    }

    /// A subscription as `GET` answers it (PROTOCOL.md 6.3).
    pub async fn view(&self, s: &Sub) -> Value {
        let mut streams = Vec::new();
        for (path, l) in &s.links {
            let acked = match &l.acked {
                Some(a) => a.clone(),
                None => self
                    .offsets(&s.root, path)
                    .await
                    .map_or_else(|| "-1".to_owned(), |o| o.0),
            };
            streams
                .push(json!({ "path": path, "link_type": l.link_type(), "acked_offset": acked }));
        }
        let kid = self
            .subs
            .signer(&self.app)
            .await
            .ok()
            .map(|s| s.kid.clone());
        let webhook = s.config.webhook_url.as_ref().map(|u| {
            json!({
                "url": u,
                "signing": {
                    "alg": "ed25519",
                    "kid": kid,
                    "jwks_url": format!("{}/__ds/jwks.json", s.base_url),
                }
            })
        });
        json!({
            "id": s.id,
            "subscription_id": s.id,
            "type": s.config.kind.as_str(),
            "pattern": s.config.pattern.as_ref().map(|p| p.join("/")),
            "streams": streams,
            "webhook": webhook,
            "wake_stream": s.config.wake_stream,
            "lease_ttl_ms": s.config.lease_ttl_ms,
            "created_at": s.created_at,
            "status": if s.failures > 0 { "failed" } else { "active" },
            "description": s.config.description,
            "generation": s.generation,
        })
    }

    /// The JWK Set of the signing key (PROTOCOL.md 6.5).
    ///
    /// # Errors
    /// [`Error::Unavailable`] while the cluster's key cannot be read.
    pub async fn jwks(&self) -> Result<Value, Error> {
        let signer = self
            .subs
            .signer(&self.app)
            .await
            .map_err(Error::Unavailable)?;
        Ok(signer.jwks())
    }

    /// `GET …/subscriptions/ID`.
    ///
    /// # Errors
    /// [`Error::NotFound`], or the journal's refusal.
    pub async fn get(&self, root: &str, id: &str) -> Result<Value, Error> {
        let h = self
            .subs
            .store
            .load(&self.app, &store::sub_channel(root, id), self.fresh())
            .await?;
        match h.value {
            Some(s) => Ok(self.view(&s).await),
            None => Err(Error::NotFound(id.to_owned())),
        }
    }

    /// `PUT …/subscriptions/ID` (PROTOCOL.md 6.2): `(true, view)` when
    /// created, `(false, view)` when the same configuration re-confirms.
    ///
    /// # Errors
    /// What is wrong with the body, [`Error::WakeStream`], [`Error::Exists`],
    /// [`Error::Limit`], a grant without `publish` on the wake stream, or
    /// the journal's refusal.
    pub async fn create(
        &self,
        grant: &Grant,
        root: &str,
        id: &str,
        base_url: String,
        body: &Value,
    ) -> Result<(bool, Value), Error> {
        let config = model::parse_config(self.app.config.ds_webhook_allow_loopback, root, body)?;
        if let Some(w) = &config.wake_stream {
            let channel = names::channel_of(&model::full(root, w)).unwrap_or_default();
            grant.require(Action::Publish, &channel)?;
            if !matches!(
                self.streams.load(&self.app.hub, &channel).await,
                Ok(Some(_))
            ) {
                return Err(Error::WakeStream(w.clone()));
            }
        }
        let channel = store::sub_channel(root, id);
        if let Some(existing) = self.subs.store.load(&self.app, &channel, true).await?.value {
            return self.reconfirm(&existing, &config).await;
        }
        let max = self.app.config.ds_max_subscriptions;
        let all = store::all(&self.app).await?;
        if all.len() >= max && !all.iter().any(|(r, i)| r == root && i == id) {
            return Err(Error::Limit(max));
        }
        // Indexed first: a crash after it leaves an id without a
        // subscription (harmless), never a subscription no index lists.
        store::index(&self.app, root, id).await?;
        let mut tx = self.begin(root, id).await?;
        loop {
            if let Some(existing) = tx.current() {
                return self.reconfirm(&existing, &config).await;
            }
            let sub = self.new_sub(root, id, &config, &base_url).await?;
            let view = self.view(&sub).await;
            if tx.write(Some(sub)).await? {
                return Ok((true, view));
            }
        }
    }

    async fn reconfirm(&self, existing: &Sub, config: &Config) -> Result<(bool, Value), Error> {
        if existing.config == *config {
            return Ok((false, self.view(existing).await));
        }
        Err(Error::Exists(existing.id.clone()))
    }

    /// A new subscription: existing streams linked at their tails
    /// (creation replays nothing).
    async fn new_sub(
        &self,
        root: &str,
        id: &str,
        config: &Config,
        base_url: &str,
    ) -> Result<Sub, Error> {
        let mut sub = Sub {
            id: id.to_owned(),
            root: root.to_owned(),
            config: config.clone(),
            base_url: base_url.to_owned(),
            created_at: model::rfc3339_ms(now_ms()),
            links: BTreeMap::new(),
            generation: 0,
            wake: None,
            failures: 0,
            next_attempt_at: 0,
        };
        for p in &config.streams {
            let acked = self.offsets(root, p).await.map(|o| o.1);
            sub.links.insert(
                p.clone(),
                Link {
                    explicit: true,
                    glob: false,
                    acked,
                },
            );
        }
        if let Some(pattern) = &config.pattern {
            let wake = config.wake_stream.as_deref();
            for rel in self.existing(root, pattern, wake).await? {
                let acked = self.offsets(root, &rel).await.map(|o| o.1);
                let l = sub.links.entry(rel).or_default();
                l.glob = true;
                if l.acked.is_none() {
                    l.acked = acked;
                }
            }
        }
        Ok(sub)
    }

    /// The stream paths under `root` that `pattern` matches at a
    /// subscription's creation: every stream the journal holds under the
    /// root (`Hub::channels_with_meta`, so also those made on other nodes
    /// and never read here), at most [`MAX_PATTERN_LINKS`], with those this
    /// node has read ([`Cx::matching`]).
    ///
    /// # Errors
    /// The journal cannot be read.
    async fn existing(
        &self,
        root: &str,
        pattern: &[String],
        wake: Option<&str>,
    ) -> Result<Vec<String>, Error> {
        let prefix = model::root_prefix(root);
        let listed = self
            .app
            .hub
            .channels_with_meta(&prefix, MAX_PATTERN_LINKS)
            .await?;
        let mut found: std::collections::BTreeSet<String> = listed
            .iter()
            .filter_map(|c| c.strip_prefix(prefix.as_str()).map(names::path_of))
            .filter(|rel| model::glob(pattern, rel) && Some(rel.as_str()) != wake)
            .collect();
        found.extend(self.matching(root, pattern, wake));
        Ok(found.into_iter().collect())
    }

    /// `DELETE …/subscriptions/ID`: the subscription's record goes (a
    /// callback, ack or release still holding it finds none and advances
    /// nothing), then its index entry.
    ///
    /// # Errors
    /// [`Error::NotFound`], or the journal's refusal.
    pub async fn delete(&self, root: &str, id: &str) -> Result<(), Error> {
        let mut tx = self.begin(root, id).await?;
        loop {
            if tx.current().is_none() {
                drop(tx);
                // An index entry a crash left behind goes too.
                store::unindex(&self.app, root, id).await?;
                return Err(Error::NotFound(id.to_owned()));
            }
            if tx.write(None).await? {
                break;
            }
        }
        drop(tx);
        store::unindex(&self.app, root, id).await?;
        Ok(())
    }

    /// `POST …/subscriptions/ID/streams`: adds explicit links at the
    /// streams' tails (idempotent).
    ///
    /// # Errors
    /// A malformed body, too many streams, [`Error::NotFound`], or the
    /// journal's refusal.
    pub async fn add_streams(&self, root: &str, id: &str, body: &Value) -> Result<(), Error> {
        let Some(list) = body.get("streams").and_then(Value::as_array) else {
            return Err(Error::Invalid(
                "the body is {\"streams\": [PATH, …]}".into(),
            ));
        };
        let paths = list
            .iter()
            .map(|p| model::rel_path(root, p, "each of streams"))
            .collect::<Result<Vec<_>, _>>()?;
        let mut tx = self.begin(root, id).await?;
        loop {
            let Some(cur) = tx.current() else {
                return Err(Error::NotFound(id.to_owned()));
            };
            let mut s = (*cur).clone();
            if s.config.streams.len() + paths.len() > model::MAX_STREAMS {
                return Err(Error::Invalid(format!(
                    "a subscription names at most {} streams",
                    model::MAX_STREAMS
                )));
            }
            for p in &paths {
                if !s.config.streams.contains(p) {
                    s.config.streams.push(p.clone());
                    s.config.streams.sort();
                }
                let known = s.links.contains_key(p);
                let acked = if known {
                    None
                } else {
                    self.offsets(root, p).await.map(|o| o.1)
                };
                let l = s.links.entry(p.clone()).or_default();
                l.explicit = true;
                if !known {
                    l.acked = acked;
                }
            }
            if tx.write(Some(s)).await? {
                return Ok(());
            }
        }
    }

    /// `DELETE …/subscriptions/ID/streams/PATH`: removes an explicit link
    /// (a matching glob link stays).
    ///
    /// # Errors
    /// [`Error::NotFound`], or the journal's refusal.
    pub async fn remove_stream(&self, root: &str, id: &str, path: &str) -> Result<(), Error> {
        let mut tx = self.begin(root, id).await?;
        loop {
            let Some(cur) = tx.current() else {
                return Err(Error::NotFound(id.to_owned()));
            };
            let mut s = (*cur).clone();
            let matches = s
                .config
                .pattern
                .as_ref()
                .is_some_and(|p| model::glob(p, path));
            if let Some(l) = s.links.get_mut(path) {
                l.explicit = false;
                l.glob |= matches;
                if !l.glob {
                    s.links.remove(path);
                }
            }
            s.config.streams.retain(|p| p != path);
            if tx.write(Some(s)).await? {
                return Ok(());
            }
        }
    }

    /// `POST …/claim` (pull-wake, PROTOCOL.md 7.2): the lease to the first
    /// worker; [`Error::Claimed`] while another holds it. Journaled before
    /// the answer, so two workers claiming through two nodes at once never
    /// both get the lease.
    ///
    /// # Errors
    /// A malformed body, a webhook subscription, [`Error::NotFound`],
    /// [`Error::Claimed`], or the journal's refusal.
    pub async fn claim(&self, root: &str, id: &str, body: &Value) -> Result<Value, Error> {
        let worker = match body.get("worker") {
            Some(Value::String(w)) if !w.is_empty() && w.len() <= 200 => w.clone(),
            _ => {
                return Err(Error::Invalid(
                    "the body is {\"worker\": NAME} (1 to 200 bytes)".into(),
                ))
            }
        };
        let mut tx = self.begin(root, id).await?;
        loop {
            let Some(cur) = tx.current() else {
                return Err(Error::NotFound(id.to_owned()));
            };
            if cur.config.kind != Kind::PullWake {
                return Err(Error::Invalid(
                    "claim is for pull-wake subscriptions; this one is delivered by webhook".into(),
                ));
            }
            let now = now_ms();
            if let Some(Wake {
                holder: Some(h),
                lease_until: Some(until),
                ..
            }) = &cur.wake
            {
                if *until > now {
                    return Err(Error::Claimed {
                        holder: h.clone(),
                        generation: cur.generation,
                    });
                }
            }
            let (s, answer) = self.claimed(&cur, &worker, now).await;
            if tx.write(Some(s)).await? {
                return Ok(answer);
            }
        }
    }

    /// The subscription after `worker` claims it at `now`, and the answer.
    async fn claimed(&self, cur: &Sub, worker: &str, now: u64) -> (Sub, Value) {
        let mut s = cur.clone();
        // An unclaimed wake is taken as it is; otherwise a new generation.
        let wake_id = match &s.wake {
            Some(w) if w.holder.is_none() => w.id.clone(),
            _ => {
                s.generation += 1;
                model::wake_id()
            }
        };
        let snap = self.snapshot(&s).await;
        let tok = model::token();
        s.wake = Some(Wake {
            id: wake_id.clone(),
            token_hash: Some(model::token_hash(&tok)),
            holder: Some(worker.to_owned()),
            lease_until: Some(now + s.config.lease_ttl_ms),
            snapshot: snap
                .iter()
                .map(|p| (p.path.clone(), p.tail.clone()))
                .collect(),
        });
        let answer = json!({
            "wake_id": wake_id,
            "generation": s.generation,
            "token": tok,
            "streams": snap.iter().map(Pending::json).collect::<Vec<_>>(),
            "lease_ttl_ms": s.config.lease_ttl_ms,
        });
        (s, answer)
    }
}
