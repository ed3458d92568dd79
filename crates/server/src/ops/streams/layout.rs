//! Where a stream's messages are ([`Layout`]) and how a read stitches them
//! (PROTOCOL.md 4.2; docs/durable-streams.md, "Forks"):
//!
//! - **Stitching, not copying.** A fork's channel holds only the fork's own
//!   events; a read of the fork reads the source's channel up to the fork
//!   point, then the fork's channel ([`read`]). Creation costs O(1) whatever
//!   the source's length.
//! - **One offset space.** A stream's positions are *virtual*: a plain
//!   stream's position of an event is its channel seq; a fork's inherited
//!   positions are its source's, and its own event of channel seq `s` is at
//!   `origin + (s - base)` ([`Layout::virt`]), `origin` being the fork point.
//!   So offsets stay strictly increasing and sortable across the fork point,
//!   and an offset read on the source continues on the fork.
//! - **Data outlives URLs.** A fork's metadata holds its inherited layouts
//!   whole (`gapless_core::meta::Layout::inherited`), and a source with live
//!   forks is only soft-deleted, so deleting, expiring or closing the source
//!   never changes what a fork reads; only retention can evict inherited
//!   events (a 410, as on any stream).

use super::Meta;
use crate::App;
use gapless_core::journal::JournalError;
use gapless_protocol::{Epoch, Event};
use std::sync::Arc;

/// Where a stream's messages are: its own channel and, for a fork, the
/// source it inherits from. Fixed at creation.
#[derive(Debug)]
pub struct Layout {
    /// The stream's own channel.
    pub channel: Arc<str>,
    /// The own channel's journal epoch at creation.
    pub epoch: Epoch,
    /// The own channel's head at creation: the stream's own events are the
    /// channel's events after it.
    pub base: u64,
    /// The virtual position just before the first own event: `base` for a
    /// plain stream (positions are channel seqs), the fork point for a fork.
    pub origin: u64,
    /// The source's layout; the fork inherits its positions up to `origin`.
    pub parent: Option<Arc<Layout>>,
}

/// One stretch of a stream's positions, served by one channel: the
/// positions `(origin, end]`, position `v` being channel seq
/// `base + (v - origin)`.
#[derive(Debug, Clone)]
pub struct Segment {
    /// The channel.
    pub channel: Arc<str>,
    /// Its epoch at the stream's creation (another one now: history lost).
    pub epoch: Epoch,
    /// The channel seq at `origin`.
    pub base: u64,
    /// The position before the segment's first event.
    pub origin: u64,
    /// The segment's last position (`u64::MAX`: the stream's own, open end).
    pub end: u64,
}

impl Segment {
    /// The channel seq of position `v` (`v >= origin`).
    pub fn seq(&self, v: u64) -> u64 {
        self.base + v.saturating_sub(self.origin)
    }
    /// The position of channel seq `s` (`s >= base`).
    pub fn virt(&self, s: u64) -> u64 {
        self.origin + s.saturating_sub(self.base)
    }
}

impl Layout {
    /// A plain stream on `channel` (epoch and head at creation).
    pub fn plain(channel: Arc<str>, epoch: Epoch, head: u64) -> Self {
        Layout {
            channel,
            epoch,
            base: head,
            origin: head,
            parent: None,
        }
    }

    /// The position of own channel seq `s`.
    pub fn virt(&self, s: u64) -> u64 {
        self.origin + s.saturating_sub(self.base)
    }

    /// The own channel seq of position `v` (`v >= origin`).
    pub fn seq(&self, v: u64) -> u64 {
        self.base + v.saturating_sub(self.origin)
    }

    /// The position before the stream's first message (its root's origin).
    pub fn start(&self) -> u64 {
        let mut l = self;
        while let Some(p) = &l.parent {
            l = p;
        }
        l.origin
    }

    /// How many layouts deep the chain is (1 for a plain stream).
    pub fn depth(&self) -> usize {
        1 + self.parent.as_ref().map_or(0, |p| p.depth())
    }

    /// The segments serving the stream, root first, empty ones left out.
    pub fn segments(&self) -> Vec<Segment> {
        let mut out = Vec::new();
        let mut end = u64::MAX;
        let mut l = Some(self);
        while let Some(x) = l {
            if end > x.origin {
                out.push(Segment {
                    channel: x.channel.clone(),
                    epoch: x.epoch,
                    base: x.base,
                    origin: x.origin,
                    end,
                });
            }
            end = end.min(x.origin);
            l = x.parent.as_deref();
        }
        out.reverse();
        out
    }
}

/// Why a stitched read failed.
#[derive(Debug)]
pub enum ReadError {
    /// The positions asked for are no longer retained (evicted, or their
    /// channel's history was lost): the protocol's 410.
    Gone,
    /// The journal failed.
    Journal(JournalError),
}

impl From<JournalError> for ReadError {
    fn from(e: JournalError) -> Self {
        ReadError::Journal(e)
    }
}

/// Reads the stream's messages after position `from`, up to position `upto`
/// (inclusive), at most `limit` events and about `max_bytes` of data (at
/// least one event when any is there), across segments. Returns the events
/// and the position of the last one (`from` when none).
///
/// # Errors
/// [`ReadError::Gone`] when the next message after `from` is no longer
/// retained, [`ReadError::Journal`] on a journal failure.
pub async fn read(
    app: &App,
    layout: &Layout,
    from: u64,
    upto: u64,
    limit: usize,
    max_bytes: usize,
) -> Result<(Vec<Arc<Event>>, u64), ReadError> {
    let mut out: Vec<Arc<Event>> = Vec::new();
    let mut pos = from;
    let mut bytes = 0usize;
    for seg in layout.segments() {
        let end = seg.end.min(upto);
        if pos >= end {
            continue;
        }
        if out.len() >= limit || (bytes >= max_bytes && !out.is_empty()) {
            break;
        }
        if pos < seg.origin {
            // Before the stream's start: a predecessor's positions.
            return Err(ReadError::Gone);
        }
        let after = seg.seq(pos);
        let want = (limit - out.len()).min(usize::try_from(end - pos).unwrap_or(usize::MAX));
        let page = app
            .hub
            .read(
                &seg.channel,
                after,
                want,
                max_bytes.saturating_sub(bytes).max(1),
            )
            .await?;
        if page.state.epoch != seg.epoch {
            return Err(ReadError::Gone);
        }
        if page
            .events
            .first()
            .map_or(page.state.head > after, |e| e.seq > after + 1)
        {
            return Err(ReadError::Gone);
        }
        let mut got = 0usize;
        for e in page.events {
            let v = seg.virt(e.seq);
            if v > end {
                break;
            }
            bytes += e.data.len();
            pos = v;
            got += 1;
            out.push(e);
        }
        if pos < end && (got < want || bytes >= max_bytes) {
            // This segment has no more yet (the own, open one), or the
            // budget is spent: the answer ends here.
            break;
        }
    }
    Ok((out, pos))
}

/// The stream's first readable position: its start, or past what retention
/// has evicted, or past an inherited segment whose channel was purged (its
/// epoch is another now).
///
/// # Errors
/// A journal failure.
pub async fn first_position(app: &App, layout: &Layout) -> Result<u64, JournalError> {
    let segs = layout.segments();
    let mut pos = layout.start();
    for seg in &segs {
        if pos >= seg.end {
            continue;
        }
        let st = app.hub.state(&seg.channel).await?;
        if st.epoch != seg.epoch && seg.end != u64::MAX {
            // An inherited segment whose channel lost its history (a purge
            // of the source): none of it is readable; the stream reads on
            // from the next segment.
            pos = seg.end;
            continue;
        }
        let kept_from = st.floor.saturating_sub(1);
        if kept_from <= seg.seq(pos) {
            return Ok(pos);
        }
        pos = seg.virt(kept_from).min(seg.end);
        if pos < seg.end {
            return Ok(pos);
        }
    }
    Ok(pos)
}

/// The stream's newest position (its tail): its own channel's head, as a
/// position.
///
/// # Errors
/// A journal failure.
pub async fn tail(app: &App, layout: &Layout) -> Result<u64, JournalError> {
    let st = app.hub.state(&layout.channel).await?;
    Ok(layout.virt(st.head.max(layout.base)))
}

/// The stream's tail (as [`tail`]), after following a new epoch of its
/// own channel ([`Meta::follow_epoch`]):
/// the one channel state read serves both.
///
/// # Errors
/// A journal failure.
pub async fn synced_tail(app: &App, meta: &mut Meta) -> Result<u64, JournalError> {
    let st = app.hub.state(&meta.layout.channel).await?;
    meta.follow_epoch(st.epoch);
    Ok(meta.layout.virt(st.head.max(meta.layout.base)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(origin: u64, base: u64, parent: Option<Arc<Layout>>) -> Arc<Layout> {
        Arc::new(Layout {
            channel: format!("c{origin}-{base}").into(),
            epoch: Epoch(1),
            base,
            origin,
            parent,
        })
    }

    #[test]
    fn segments_stitch_a_chain_and_positions_continue_past_the_fork_point() {
        // Root: channel seqs 3.. are its positions 3.. (created at head 3).
        let root = layout(3, 3, None);
        // Fork of root at position 7, its own channel created at head 20.
        let f1 = layout(7, 20, Some(root.clone()));
        assert_eq!(
            f1.virt(21),
            8,
            "the fork's first own event follows the fork point"
        );
        assert_eq!(f1.seq(8), 21);
        // Fork of f1 at 5 (inside f1's inherited range): f1's own part is unused.
        let f2 = layout(5, 0, Some(f1.clone()));
        let s = f2.segments();
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].origin, s[0].end), (3, 5));
        assert_eq!((s[1].origin, s[1].end), (5, u64::MAX));
        assert_eq!(f2.start(), 3);
        // Fork of f1 at 9 (inside f1's own range): three segments.
        let f3 = layout(9, 0, Some(f1));
        let s = f3.segments();
        let spans: Vec<_> = s.iter().map(|g| (g.origin, g.end)).collect();
        assert_eq!(spans, vec![(3, 7), (7, 9), (9, u64::MAX)]);
        assert_eq!(s[1].seq(8), 21);
        assert_eq!(f3.depth(), 3);
    }
}
