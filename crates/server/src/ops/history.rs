//! History pages, once for every transport: a page's size (`limit`), where
//! it starts (`after=CURSOR`, or for a session `after_seq=N`, which win over
//! `since=`: `earliest`, `live`, `last:N`, `time:UNIX_MS`), the bound on
//! its data, whether the journal can serve the start (410
//! `cursor_not_served` otherwise) and the cursor that continues it
//! (docs/api.md, "History"). A transport reads the parameters' texts from
//! its wire and writes the [`Page`] in its own shape.

use crate::auth::{Action, Grant};
use crate::error::ApiError;
use crate::ops::{names, start};
use crate::App;
use gapless_core::subscription::{Gap, Start};
use gapless_core::ChannelState;
use gapless_protocol::codes::{ErrorCode, GapReason};
use gapless_protocol::{Cursor, CursorError, Epoch, Event};
use std::sync::Arc;

/// Default page size.
pub(crate) const DEFAULT_LIMIT: usize = 100;
/// Largest page size, in events: of a history page (`limit`), and of every
/// other page the server reads in one go (a Durable Streams catch-up answer,
/// a read of its records' channels). One of the pair of page bounds, with
/// [`PAGE_DATA_BYTES`].
pub const MAX_LIMIT: usize = 1000;
/// A page stops early (with `done: false`) once its events hold this many
/// bytes of data (4 MiB), so one request cannot make the server build a huge
/// answer. A page always holds at least one event. The same bound holds for
/// the pages [`MAX_LIMIT`] names.
pub const PAGE_DATA_BYTES: usize = 4 << 20;

/// Where a page starts, as `after` names it: `(Some(epoch), seq)`, or
/// `(None, 0)` for a well-formed cursor of another format version.
pub type Position = (Option<Epoch>, u64);

/// The parameters of a page request, as texts (absent: `None`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PageQuery<'a> {
    /// `limit`: 1 to [`MAX_LIMIT`] events; [`DEFAULT_LIMIT`] when absent.
    pub limit: Option<&'a str>,
    /// `after`: a cursor; from the floor when absent or empty.
    pub after: Option<&'a str>,
    /// `after_seq`: a seq (a session consumer's `last_seq`); only where
    /// [`Reading::Session`] allows it, and never with `after`.
    pub after_seq: Option<&'a str>,
    /// `since`: where the page starts when neither `after` (non-empty) nor
    /// `after_seq` is given, as for a stream ([`start::since`]); checked
    /// also when one of them wins. `earliest` is the floor (as when absent),
    /// `live` the head (an empty page, `done`, whose `next` is the head's
    /// cursor), `last:N` the last N retained events, `time:T` the first
    /// retained event at or after T (from the floor, with
    /// [`Page::gap`], when an evicted event may be at or after T).
    pub since: Option<&'a str>,
}

/// Whose history a page reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reading {
    /// A channel's: `after=CURSOR` only.
    Channel,
    /// A session's: `after=CURSOR` or `after_seq=N` (its consumers hold a `last_seq`).
    Session,
}

/// One page of a journal channel's history.
#[derive(Debug)]
pub(crate) struct Page {
    /// The journal incarnation.
    pub epoch: Epoch,
    /// The oldest retained seq (`head + 1` when nothing is retained).
    pub floor: u64,
    /// The newest seq ever assigned; 0 before the first event.
    pub head: u64,
    /// The events, in seq order: at most `limit`, and fewer once they hold
    /// [`PAGE_DATA_BYTES`] of data (never none while events remain).
    pub events: Vec<Arc<Event>>,
    /// The cursor of the next page; on the page with `done`, the position of
    /// the head when the page was read.
    pub next: String,
    /// Whether this page reaches the head.
    pub done: bool,
    /// For `since=time:T` only: the evicted seqs when an event no longer
    /// retained may be at or after T (the page then starts at the floor),
    /// as a stream's start would name them (`Hub::follow`).
    pub gap: Option<Gap>,
}

/// The rules before reading a channel: a valid name, and a grant that may
/// subscribe to it.
///
/// # Errors
/// 400 `invalid_channel`; 401/403 from the grant.
pub(crate) fn may_read(grant: &Grant, channel: &str) -> Result<(), ApiError> {
    names::channel(channel)?;
    grant.require(Action::Subscribe, channel)
}

/// One history page of journal channel `channel`.
///
/// # Errors
/// 400 `invalid_request` (a bad `limit`, `after_seq` or `since`, `after_seq`
/// on a channel or with `after`) or `invalid_cursor` ([`page_params`]); 410
/// `cursor_not_served` (with `reason`, `floor` and `floor_cursor`) when the
/// journal cannot serve the start; the journal's own errors.
pub(crate) async fn page(
    app: &App,
    channel: &str,
    q: PageQuery<'_>,
    reading: Reading,
) -> Result<Page, ApiError> {
    let (limit, after) = page_params(channel, q.limit, q.after)?;
    let after_seq = after_seq(q, reading)?;
    // Absent, a page starts at the floor (a stream, live).
    let since = match q.since {
        None => Start::Earliest,
        some => start::since(some)?,
    };
    let (from, gap) = match (after, after_seq) {
        (Some(p), _) => (p.1, None),
        (None, Some(seq)) => (seq, None),
        (None, None) => since_position(app, channel, since).await?,
    };
    let page = app.hub.read(channel, from, limit, PAGE_DATA_BYTES).await?;
    let st = page.state;
    // A seq has no epoch of its own: it is read in the journal's current one.
    let after = after_seq.map(|n| (Some(st.epoch), n)).or(after);
    if let Some(after) = after {
        served(channel, after, &st)?;
    }
    let events = page.events;
    let done = events.last().is_none_or(|e| e.seq >= st.head);
    let next = match events.last() {
        Some(e) if !done => e.cursor().to_owned(),
        _ => Cursor::single(channel, st.epoch, st.head).encode(),
    };
    Ok(Page {
        epoch: st.epoch,
        floor: st.floor,
        head: st.head,
        events,
        next,
        done,
        gap,
    })
}

/// Where a page without `after` or `after_seq` starts: the seq to read
/// after, and for `since=time:T` the gap notice when an evicted event may
/// be at or after T (the rule of a stream's start, `Hub::follow`).
///
/// # Errors
/// The journal's.
async fn since_position(
    app: &App,
    channel: &str,
    since: Start,
) -> Result<(u64, Option<Gap>), ApiError> {
    Ok(match since {
        Start::Earliest | Start::After { .. } | Start::Unknown => (0, None),
        Start::Live => (app.hub.state(channel).await?.head, None),
        Start::Last(n) => {
            let st = app.hub.state(channel).await?;
            (st.head.saturating_sub(n).max(st.floor - 1), None)
        }
        Start::Time(t) => {
            let seek = app.hub.seek_time(channel, t).await?;
            let from = seek.seq.saturating_sub(1);
            let gap = seek.evicted_after(t).then(|| Gap {
                channel: Arc::from(channel),
                after: Some((seek.state.epoch, 0)),
                next: (seek.state.epoch, from),
                reason: GapReason::Evicted,
            });
            (from, gap)
        }
    })
}

/// `after_seq`, where `reading` takes it.
fn after_seq(q: PageQuery<'_>, reading: Reading) -> Result<Option<u64>, ApiError> {
    match q.after_seq {
        Some(_) if reading == Reading::Channel => Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "after_seq is for session history; a channel's history takes after=CURSOR",
        )),
        Some(_) if q.after.is_some() => Err(ApiError::new(
            ErrorCode::InvalidRequest,
            "give after=CURSOR or after_seq=N, not both",
        )),
        Some(v) => v.parse::<u64>().map(Some).map_err(|_| {
            ApiError::new(
                ErrorCode::InvalidRequest,
                format!("after_seq={v:?} must be a whole number (a session's last_seq)"),
            )
        }),
        None => Ok(None),
    }
}

/// Whether the journal, in state `st`, serves a page after `after`.
///
/// # Errors
/// 410 `cursor_not_served` with `reason`, `floor` and `floor_cursor`.
fn served(channel: &str, after: Position, st: &ChannelState) -> Result<(), ApiError> {
    let reason = match after {
        (None, _) => GapReason::Unknown,
        (Some(epoch), _) if epoch != st.epoch => GapReason::Epoch,
        (_, seq) if seq > st.head => GapReason::Ahead,
        (_, seq) if seq + 1 < st.floor => GapReason::Evicted,
        _ => return Ok(()),
    };
    let floor_cursor = Cursor::single(channel, st.epoch, st.floor - 1).encode();
    Err(ApiError::new(
        ErrorCode::CursorNotServed,
        format!(
            "the journal cannot serve this cursor ({}): read again from floor_cursor",
            reason_text(reason)
        ),
    )
    .with("reason", reason.as_str())
    .with("floor", st.floor)
    .with("floor_cursor", floor_cursor))
}

/// The size and start of a history page for journal channel `channel`:
/// `limit` (default [`DEFAULT_LIMIT`], 1 to [`MAX_LIMIT`]) and `after`
/// decoded as a [`Position`]; `None` without `after` (or with an empty
/// one). Public so the fuzz targets (`fuzz/`) can drive it; [`page`] calls
/// it first.
///
/// # Errors
/// 400 `invalid_request` for a bad `limit`; 400 `invalid_cursor` for an
/// `after` that is not a cursor or names no position on `channel`.
pub fn page_params(
    channel: &str,
    limit: Option<&str>,
    after: Option<&str>,
) -> Result<(usize, Option<Position>), ApiError> {
    let limit = match limit {
        None => DEFAULT_LIMIT,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
            _ => {
                return Err(ApiError::new(
                    ErrorCode::InvalidRequest,
                    format!("limit={v:?} must be a whole number from 1 to {MAX_LIMIT}"),
                ))
            }
        },
    };
    let after = match after.filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => Some(channel_position(channel, s)?),
    };
    Ok((limit, after))
}

fn reason_text(r: GapReason) -> &'static str {
    match r {
        GapReason::Evicted => "events after it are no longer retained",
        GapReason::Epoch => "it belongs to another incarnation of the journal",
        GapReason::Ahead => "it is beyond the channel's head",
        _ => "it was issued by another version of gapless",
    }
}

/// Decodes `after` for `channel`.
fn channel_position(channel: &str, s: &str) -> Result<Position, ApiError> {
    match Cursor::decode(s.as_bytes()) {
        Ok(c) => match c.get(channel) {
            Some(p) => Ok((Some(p.epoch), p.seq)),
            None => Err(ApiError::new(
                ErrorCode::InvalidCursor,
                "the cursor does not name a position on this channel",
            )),
        },
        Err(CursorError::Version(_)) => Ok((None, 0)),
        Err(e) => Err(ApiError::new(
            ErrorCode::InvalidCursor,
            format!("after: {e}"),
        )),
    }
}

/// A channel's bounds and its subscribers on this node.
///
/// # Errors
/// The journal's.
pub(crate) async fn bounds(app: &App, channel: &str) -> Result<(ChannelState, usize), ApiError> {
    let st = app.hub.state(channel).await?;
    Ok((st, app.hub.subscribers(channel)))
}
