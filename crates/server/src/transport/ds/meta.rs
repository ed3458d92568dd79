//! The streams' metadata, journaled: every change of a stream's metadata
//! (creation, close, producer progress, `Stream-Seq`, soft deletion,
//! deletion) is a record appended to the reserved channel [`CHANNEL`] before
//! the operation is answered. At its first Durable Streams request a server
//! reads the channel back into memory ([`catch_up`]), and every node of a
//! cluster keeps following it ([`follow`]), so a restart remembers which
//! channels are streams and a stream created on one node is known on the
//! others. docs/durable-streams.md, "Metadata", gives the design.
//!
//! A record is the whole state of one stream (JSON, [`Record`]). What a
//! record can change of a stream only grows (closed, soft-deleted, each
//! producer's epoch and seq, the last `Stream-Seq`), so the records of one
//! incarnation merge ([`Record::merge_from`]) and their order does not matter:
//! appends of one stream journal their records concurrently. A deletion, or
//! a record of another incarnation, replaces what came before it. The
//! channel can be read from its floor, and [`follow`] rewrites the records
//! of live streams that grow old ([`COMPACT_EVENTS`], [`COMPACT_MS`]) so
//! retention never evicts the only record of a live stream.

use super::fork::{self, ForkOf, Layout};
use super::streams::{Life, Meta, Stream};
use super::Ds;
use crate::App;
use gapless_core::journal::{now_ms, JournalError};
use gapless_protocol::{Epoch, NewEvent, Payload};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The reserved channel of the records. `/` is outside the channel
/// alphabet (`gapless_protocol::name`), so gapless's own API refuses this
/// name everywhere, and no stream path maps to it (a path's `/` becomes `~`).
pub const CHANNEL: &str = "gapless/ds-streams";

/// A stream's record is rewritten when more than this many records, plus
/// twice the number of streams, were appended after it (so rewriting every
/// stream once never makes them all old again: at most one rewrite per
/// other record, amortized). The channel's count retention must keep more
/// (`--retention-events` of at least 1000 plus 3 per stream; see
/// docs/durable-streams.md, "Metadata").
pub const COMPACT_EVENTS: u64 = 500;

/// A stream's record is rewritten when it is older than this, in
/// milliseconds (10 minutes; the channel's age retention must be longer).
pub const COMPACT_MS: u64 = 600_000;

/// How often [`follow`] reads the records other nodes appended, in milliseconds.
pub const FOLLOW_MS: u64 = 250;

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

    /// The record of `m`'s current state on `channel`.
    pub fn of(channel: &str, m: &Meta) -> Self {
        Record {
            ch: channel.to_owned(),
            del: false,
            inc: m.inc,
            ct: m.content_type.clone(),
            ttl: m.ttl_s,
            exp: m.expires_at.clone(),
            epoch: m.epoch.0,
            ch_epoch: m.layout.epoch.0,
            base: m.layout.base,
            origin: m.layout.origin,
            fork: m.fork_of.as_ref().map(|f| (f.source.clone(), f.at, f.sub)),
            closed: m.closed,
            closed_by: m.closed_by.clone(),
            sseq: m.last_stream_seq.clone(),
            producers: m.producers.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            soft: m.soft_deleted,
        }
    }

    /// The deletion record of `channel`.
    pub fn deleted(channel: &str) -> Self {
        Record {
            ch: channel.to_owned(),
            del: true,
            inc: 0,
            ct: String::new(),
            ttl: None,
            exp: None,
            epoch: 0,
            ch_epoch: 0,
            base: 0,
            origin: 0,
            fork: None,
            closed: false,
            closed_by: None,
            sseq: None,
            producers: BTreeMap::new(),
            soft: false,
        }
    }
}

/// Appends `rec`; returns its seq in [`CHANNEL`].
async fn append(app: &App, rec: &Record) -> Result<u64, JournalError> {
    let data = serde_json::to_string(rec).map_err(|e| JournalError::Storage(e.to_string()))?;
    let a = app
        .hub
        .publish(
            CHANNEL,
            vec![NewEvent {
                event_type: None,
                data: Payload::Text(data),
            }],
            None,
        )
        .await?;
    Ok(a.last_seq)
}

/// Journals `m`'s state (on `channel`), and marks `m` as at that record.
///
/// # Errors
/// [`JournalError`] when the journal refuses: the change is not durable.
pub async fn save(app: &App, channel: &str, m: &mut Meta) -> Result<(), JournalError> {
    let seq = append(app, &Record::of(channel, m)).await?;
    m.rev = m.rev.max(seq);
    m.rev_ms = now_ms();
    Ok(())
}

/// Journals the state of `stream` (on `channel`) as it is now, without
/// holding its lock across the commit (records merge, so concurrent ones
/// may land in any order), and marks the stream as at that record.
///
/// # Errors
/// [`JournalError`] when the journal refuses: the change is not durable.
pub async fn save_current(app: &App, channel: &str, stream: &Stream) -> Result<(), JournalError> {
    let rec = Record::of(channel, &*stream.lock().await);
    let seq = append(app, &rec).await?;
    let mut m = stream.lock().await;
    if seq > m.rev {
        m.rev = seq;
        m.rev_ms = now_ms();
    }
    Ok(())
}

/// Merges `rec`, a record of `m`'s incarnation, into `m` ([`Record::merge_from`]);
/// live readers wake up when it closes or soft-deletes the stream.
fn merge(m: &mut Meta, rec: &Record) {
    let closes = rec.closed && !m.closed;
    let soft = rec.soft && !m.soft_deleted;
    m.closed |= rec.closed;
    if m.closed_by.is_none() {
        m.closed_by = rec.closed_by.clone();
    }
    m.soft_deleted |= rec.soft;
    for (id, &p) in &rec.producers {
        let cur = m.producers.entry(id.clone()).or_insert(p);
        *cur = (*cur).max(p);
    }
    if rec.sseq > m.last_stream_seq {
        m.last_stream_seq = rec.sseq.clone();
    }
    if soft {
        m.announce(Life::Gone);
    } else if closes {
        m.announce(Life::Closed);
    }
}

/// Journals the deletion of the stream on `channel` (best effort: a failure
/// is logged; the stream then comes back at a restart, where its expiry, if
/// any, forgets it again).
pub async fn save_deleted(app: &App, ds: &Ds, channel: &str) {
    match append(app, &Record::deleted(channel)).await {
        Ok(seq) => {
            if let Ok(mut deleted) = ds.deleted.lock() {
                deleted.insert(channel.to_owned(), seq);
            }
        }
        Err(e) => {
            tracing::warn!(channel, error = %e, "could not journal a Durable Streams deletion")
        }
    }
}

/// Whether the record at `seq` of `channel` is older than a deletion made
/// here that [`catch_up`] has not applied yet ([`Ds::deleted`]).
fn before_deletion(ds: &Ds, channel: &str, seq: u64) -> bool {
    ds.deleted
        .lock()
        .is_ok_and(|d| d.get(channel).is_some_and(|&at| seq < at))
}

/// Reads the records appended since the last call and applies them: at the
/// first call, the whole channel (a restart's read-back). Serialized per
/// server; cheap when nothing is new.
///
/// # Errors
/// [`JournalError`] when the journal cannot be read.
pub async fn catch_up(app: &App, ds: &Ds) -> Result<(), JournalError> {
    let mut guard = ds.applied.lock().await;
    let st = app.hub.state(CHANNEL).await?;
    let (epoch, applied) = &mut *guard;
    if *epoch != st.epoch {
        // A new incarnation of the channel (its history was lost, e.g. a
        // Redis that lost its data): its seqs start again, so read it all
        // and let its records replace what they name.
        if *epoch != Epoch::default() {
            tracing::warn!("the Durable Streams records' channel changed epoch; reading it again");
            for (_, s) in ds.streams.all() {
                s.lock().await.rev = 0;
            }
        }
        *epoch = st.epoch;
        *applied = 0;
        // Seqs of the old incarnation.
        if let Ok(mut deleted) = ds.deleted.lock() {
            deleted.clear();
        }
    }
    if st.head <= *applied {
        ds.loaded.store(true, Ordering::Release);
        return Ok(());
    }
    // The state of each channel: the records since its newest deletion or
    // incarnation, merged, at the seq of the newest.
    let mut newest: HashMap<String, (u64, u64, Record)> = HashMap::new();
    let mut after = *applied;
    loop {
        let page = app.hub.read(CHANNEL, after, 1000, 4 << 20).await?;
        let Some(last) = page.events.last() else {
            break;
        };
        after = last.seq;
        for ev in &page.events {
            match serde_json::from_slice::<Record>(ev.data.as_bytes()) {
                Ok(r) => match newest.get_mut(&r.ch) {
                    Some((seq, time, held)) if !held.del && !r.del && held.inc == r.inc => {
                        held.merge_from(&r);
                        (*seq, *time) = (ev.seq, ev.time);
                    }
                    _ => {
                        newest.insert(r.ch.clone(), (ev.seq, ev.time, r));
                    }
                },
                Err(e) => {
                    tracing::warn!(seq = ev.seq, error = %e, "skipping a malformed Durable Streams record")
                }
            }
        }
        if after >= page.state.head {
            break;
        }
    }
    let mut todo: Vec<(u64, u64, Record)> = newest.into_values().collect();
    todo.sort_by_key(|(seq, _, _)| *seq);
    // Sources before their forks: a record waits until its source is known.
    loop {
        let before = todo.len();
        let mut rest = Vec::new();
        for (seq, time, rec) in todo {
            if before_deletion(ds, &rec.ch, seq) {
                continue;
            }
            if !apply(ds, seq, time, &rec).await {
                rest.push((seq, time, rec));
            }
        }
        todo = rest;
        if todo.is_empty() || todo.len() == before {
            break;
        }
    }
    for (_, _, rec) in todo {
        tracing::warn!(channel = %rec.ch, "a Durable Streams fork's source is unknown; the fork is not restored");
    }
    *applied = after.max(*applied);
    // Deletions applied now: no later catch-up reads the records before them.
    let through = *applied;
    if let Ok(mut deleted) = ds.deleted.lock() {
        deleted.retain(|_, at| *at > through);
    }
    ds.loaded.store(true, Ordering::Release);
    Ok(())
}

/// Applies record `rec` (at `seq`, written at `time` Unix ms) to the
/// streams in memory: merged into the stream of its incarnation; a deletion
/// or another incarnation replaces the stream when it is newer (by seq) than
/// what is held. False when it is a fork whose source is not known (yet).
async fn apply(ds: &Ds, seq: u64, time: u64, rec: &Record) -> bool {
    let current = ds.streams.get(&rec.ch);
    if let Some(s) = &current {
        let mut m = s.lock().await;
        if !rec.del && m.inc == rec.inc {
            merge(&mut m, rec);
            if seq > m.rev {
                m.rev = seq;
                m.rev_ms = time;
            }
            return true;
        }
        if m.rev >= seq {
            return true;
        }
        ds.streams.remove(&rec.ch, s);
        m.deleted = true;
        m.announce(Life::Gone);
    }
    if rec.del {
        return true;
    }
    let (parent, parent_layout) = match &rec.fork {
        None => (None, None),
        Some((src, _, _)) => match ds.streams.get(src) {
            None => return false,
            Some(s) => {
                let l = s.lock().await.layout.clone();
                (Some((src.clone(), s)), Some(l))
            }
        },
    };
    let mut m = Meta {
        content_type: rec.ct.clone(),
        ttl_s: rec.ttl,
        expires_at: rec.exp.clone(),
        deadline_ms: None,
        epoch: Epoch(rec.epoch),
        layout: Arc::new(Layout {
            channel: rec.ch.clone(),
            epoch: Epoch(rec.ch_epoch),
            base: rec.base,
            origin: rec.origin,
            parent: parent_layout,
        }),
        fork_of: rec.fork.as_ref().map(|(source, at, sub)| ForkOf {
            source: source.clone(),
            at: *at,
            sub: *sub,
        }),
        parent: parent.clone(),
        children: Vec::new(),
        soft_deleted: rec.soft,
        closed: rec.closed,
        closed_by: rec.closed_by.clone(),
        last_stream_seq: rec.sseq.clone(),
        producers: rec.producers.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        deleted: false,
        closed_tx: super::streams::life(),
        inc: rec.inc,
        rev: seq,
        rev_ms: time,
        order: Default::default(),
    };
    if m.soft_deleted {
        m.announce(Life::Gone);
    } else if m.closed {
        m.announce(Life::Closed);
    }
    // The sliding TTL restarts at the read-back (reads are not journaled).
    m.touch(now_ms());
    let stream: Stream = Arc::new(tokio::sync::Mutex::new(m));
    if ds.streams.insert(&rec.ch, stream.clone()).is_err() {
        // Created here meanwhile: that one is newer.
        return true;
    }
    if let Some((_, src)) = parent {
        fork::register(&src, &stream).await;
    }
    true
}

/// Follows [`CHANNEL`] for the life of the server: applies what other nodes
/// journaled every [`FOLLOW_MS`], and rewrites old records of live streams
/// (see the module doc).
pub async fn follow(app: Arc<App>, ds: Arc<Ds>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(FOLLOW_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_compact = 0u64;
    let mut failing = false;
    loop {
        tick.tick().await;
        match catch_up(&app, &ds).await {
            // Logged once per outage, not every tick.
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "could not read the Durable Streams records; retrying");
                continue;
            }
            Err(_) => continue,
            Ok(()) if failing => {
                failing = false;
                tracing::info!("reading the Durable Streams records again");
            }
            Ok(()) => {}
        }
        let now = now_ms();
        if now.saturating_sub(last_compact) < 1000 {
            continue;
        }
        last_compact = now;
        let head = match app.hub.state(CHANNEL).await {
            Ok(s) => s.head,
            Err(_) => continue,
        };
        let all = ds.streams.all();
        let behind = COMPACT_EVENTS + 2 * all.len() as u64;
        for (ch, s) in all {
            let Ok(mut m) = s.try_lock() else { continue };
            if m.deleted || m.rev == 0 {
                continue;
            }
            if head.saturating_sub(m.rev) > behind || now.saturating_sub(m.rev_ms) > COMPACT_MS {
                if let Err(e) = save(&app, &ch, &mut m).await {
                    tracing::warn!(channel = %ch, error = %e, "could not rewrite a Durable Streams record");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_of_one_incarnation_merge_in_any_order() {
        let rec = |closed: bool, producers: &[(&str, (u64, u64))], sseq: Option<&str>| {
            let mut r = Record::deleted("c");
            r.del = false;
            r.inc = 7;
            r.closed = closed;
            r.producers = producers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), *v))
                .collect();
            r.sseq = sseq.map(str::to_owned);
            r
        };
        let a = rec(false, &[("p", (0, 5)), ("q", (1, 0))], Some("09"));
        let b = rec(true, &[("p", (0, 7)), ("q", (0, 9))], Some("10"));
        let mut ab = Record::deleted("c");
        ab.del = false;
        ab.inc = 7;
        ab.merge_from(&a);
        ab.merge_from(&b);
        let mut ba = Record::deleted("c");
        ba.del = false;
        ba.inc = 7;
        ba.merge_from(&b);
        ba.merge_from(&a);
        for m in [&ab, &ba] {
            assert!(m.closed);
            assert_eq!(m.producers.get("p"), Some(&(0, 7)));
            assert_eq!(m.producers.get("q"), Some(&(1, 0)), "a newer epoch wins");
            assert_eq!(m.sseq.as_deref(), Some("10"));
        }
    }
}
