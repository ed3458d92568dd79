//! The upgrade from the side channel: releases before per-channel metadata
//! journaled every stream's metadata as records in one reserved channel,
//! [`CHANNEL`] (creation, close, each producer's progress, `Stream-Seq`,
//! deletion; a record is the whole state of one stream, and the records of
//! one incarnation merge). At its first Durable Streams request a server
//! reads whatever that channel still holds, imports each live stream's
//! metadata into its own channel's journal (`Change::Import`: set only
//! where the channel has none, so nodes upgrading together agree), and
//! purges the side channel. Nothing else reads it (docs/durable-streams.md,
//! "Metadata").

use crate::App;
use gapless_core::journal::JournalError;
use gapless_core::meta::{Ancestor, Change, ChannelMeta, ForkOrigin, Layout, Life, ProducerTuple};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// The reserved channel of the old records. `/` is outside the channel
/// alphabet (`gapless_protocol::name`), so gapless's own API refuses this
/// name everywhere, and no stream path maps to it.
pub const CHANNEL: &str = "gapless/ds-streams";

/// One record: the whole metadata of the stream on `ch` after a change, or
/// its deletion (`del`).
#[derive(Debug, Serialize, Deserialize)]
pub struct Record {
    /// The stream's channel.
    pub ch: String,
    /// The stream was forgotten (deleted, or expired): nothing else counts.
    #[serde(default, skip_serializing_if = "is_false")]
    pub del: bool,
    /// The stream's incarnation (random at creation; part of its appends'
    /// idempotency keys, so a stream created again at the path never
    /// matches its predecessor's keys).
    #[serde(default)]
    pub inc: u64,
    /// Content type.
    #[serde(default)]
    pub ct: String,
    /// Sliding TTL, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<u64>,
    /// Absolute expiry: as given, and Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<(String, u64)>,
    /// The epoch of the stream's offsets.
    #[serde(default)]
    pub epoch: u64,
    /// The own channel's epoch at creation ([`Layout::epoch`]).
    #[serde(default)]
    pub ch_epoch: u64,
    /// [`Layout::base`].
    #[serde(default)]
    pub base: u64,
    /// [`Layout::origin`].
    #[serde(default)]
    pub origin: u64,
    /// A fork's source channel, fork point and sub-offset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<(String, u64, u64)>,
    /// Closed.
    #[serde(default, skip_serializing_if = "is_false")]
    pub closed: bool,
    /// The producer tuple that closed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed_by: Option<(String, u64, u64)>,
    /// The last `Stream-Seq`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sseq: Option<String>,
    /// Producers: id -> (epoch, last seq).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub producers: BTreeMap<String, (u64, u64)>,
    /// Soft-deleted (kept for its forks).
    #[serde(default, skip_serializing_if = "is_false")]
    pub soft: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl Record {
    /// Merges `other`, a record of the same incarnation, into this one:
    /// closed or soft-deleted in either, the closing producer tuple of
    /// either, each producer at the greater (epoch, seq), the greater
    /// `Stream-Seq` (byte-wise).
    pub fn merge_from(&mut self, other: &Record) {
        self.closed |= other.closed;
        if self.closed_by.is_none() {
            self.closed_by = other.closed_by.clone();
        }
        self.soft |= other.soft;
        for (id, &p) in &other.producers {
            let cur = self.producers.entry(id.clone()).or_insert(p);
            *cur = (*cur).max(p);
        }
        if other.sseq > self.sseq {
            self.sseq = other.sseq.clone();
        }
    }
}

impl Record {
    /// The metadata the record describes; a fork's inherited layouts are
    /// its source's layout and inherited ones (`source`, already imported).
    fn to_meta(&self, source: Option<&ChannelMeta>) -> ChannelMeta {
        let inherited = source.map_or_else(Vec::new, |s| {
            let mut v = vec![Ancestor {
                channel: self.fork.as_ref().map(|f| f.0.clone()).unwrap_or_default(),
                channel_epoch: s.layout.channel_epoch,
                base: s.layout.base,
                origin: s.layout.origin,
            }];
            v.extend(s.layout.inherited.iter().cloned());
            v
        });
        ChannelMeta {
            incarnation: self.inc,
            created_ms: 0,
            content_type: self.ct.clone(),
            ttl_s: self.ttl,
            expires_at: self.exp.clone(),
            life: if self.closed {
                Life::Closed
            } else {
                Life::Open
            },
            closed_by: self
                .closed_by
                .clone()
                .map(|(id, epoch, seq)| ProducerTuple { id, epoch, seq }),
            soft_deleted: self.soft,
            layout: Layout {
                offset_epoch: self.epoch,
                channel_epoch: self.ch_epoch,
                base: self.base,
                origin: self.origin,
                fork: self
                    .fork
                    .clone()
                    .map(|(source, at, sub)| ForkOrigin { source, at, sub }),
                inherited,
            },
            producers: self.producers.clone().into_iter().collect(),
            stream_seq: self.sseq.clone(),
            forks: Default::default(),
            record: None,
            record_version: 0,
        }
    }
}

/// Reads every record [`CHANNEL`] holds: each channel's state since its
/// newest deletion or incarnation, merged, in the order of the newest.
async fn records(app: &App) -> Result<Vec<Record>, JournalError> {
    let mut newest: HashMap<String, (u64, Record)> = HashMap::new();
    let mut after = 0;
    loop {
        let page = app.hub.read(CHANNEL, after, 1000, 4 << 20).await?;
        let Some(last) = page.events.last() else {
            break;
        };
        after = last.seq;
        for ev in &page.events {
            let r = match serde_json::from_slice::<Record>(ev.data.as_bytes()) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(seq = ev.seq, error = %e, "skipping a malformed Durable Streams record");
                    continue;
                }
            };
            match newest.get_mut(&r.ch) {
                Some((seq, held)) if !held.del && !r.del && held.inc == r.inc => {
                    held.merge_from(&r);
                    *seq = ev.seq;
                }
                _ => {
                    newest.insert(r.ch.clone(), (ev.seq, r));
                }
            }
        }
        if after >= page.state.head {
            break;
        }
    }
    let mut all: Vec<(u64, Record)> = newest.into_values().filter(|(_, r)| !r.del).collect();
    all.sort_by_key(|(seq, _)| *seq);
    Ok(all.into_iter().map(|(_, r)| r).collect())
}

/// Imports what [`CHANNEL`] holds into each stream's channel, then purges
/// it (module doc). Returns how many streams were imported; 0 at once when
/// the channel is empty (every start after the first).
///
/// # Errors
/// [`JournalError`] when the journal cannot be read or written; nothing is
/// purged then, and the next request tries again.
pub async fn run(app: &App) -> Result<usize, JournalError> {
    if app.hub.state(CHANNEL).await?.head == 0 {
        return Ok(0);
    }
    let mut todo = records(app).await?;
    let mut done: HashMap<String, ChannelMeta> = HashMap::new();
    let mut forks: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // Sources before their forks: a record waits until its source is in.
    loop {
        let before = todo.len();
        let mut rest = Vec::new();
        for rec in todo {
            let source = rec.fork.as_ref().map(|f| f.0.clone());
            let src = match &source {
                None => None,
                Some(s) => match done.get(s) {
                    Some(m) => Some(m.clone()),
                    None => {
                        rest.push(rec);
                        continue;
                    }
                },
            };
            let meta = rec.to_meta(src.as_ref());
            if let Some(s) = source {
                forks.entry(s).or_default().push(rec.ch.clone());
            }
            done.insert(rec.ch.clone(), meta);
        }
        todo = rest;
        if todo.is_empty() || todo.len() == before {
            break;
        }
    }
    for rec in todo {
        tracing::warn!(channel = %rec.ch, "a Durable Streams fork's source is unknown; the fork is not restored");
    }
    let n = done.len();
    for (ch, mut meta) in done {
        meta.forks = forks.remove(&ch).unwrap_or_default().into_iter().collect();
        app.hub.change(&ch, Change::Import(meta)).await?;
    }
    app.hub.purge(CHANNEL).await?;
    tracing::info!(
        streams = n,
        "Durable Streams metadata moved from {CHANNEL} into each stream's channel"
    );
    Ok(n)
}
