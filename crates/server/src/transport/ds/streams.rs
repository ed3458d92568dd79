//! The Durable Streams metadata of each stream: content type, TTL or
//! expiry, closure, the `Stream-Seq` and idempotent producers' state, and
//! where the stream begins in its channel.
//!
//! Held in memory, and journaled by [`super::meta`] before an operation is
//! answered (docs/durable-streams.md, "Metadata").

use super::fork;
use gapless_protocol::Epoch;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::watch;

/// One stream's metadata. Guarded by its own async lock, held only while it
/// is read or changed, never across a journal commit: appends are ordered
/// by [`Meta::gate`], and appends with producer headers or `Stream-Seq`
/// are checked against what is committed and what is in flight
/// ([`Meta::inflight`]), so their checks stay exact (PROTOCOL.md 5.2.1,
/// "Concurrency Requirements"; docs/durable-streams.md, "Appends").
#[derive(Debug)]
pub struct Meta {
    /// The content type as created (compared case-insensitively, without
    /// parameters).
    pub content_type: String,
    /// The sliding time-to-live, in seconds.
    pub ttl_s: Option<u64>,
    /// The absolute expiry as given (RFC 3339) and in Unix milliseconds.
    pub expires_at: Option<(String, u64)>,
    /// When the stream expires (Unix ms): the earlier of the TTL's deadline
    /// (refreshed by reads and writes) and `expires_at`.
    pub deadline_ms: Option<u64>,
    /// The epoch of the stream's offsets: its channel's journal epoch at
    /// creation (a fork's is its source's).
    pub epoch: Epoch,
    /// Where the stream's messages are: its channel's events after the head
    /// at creation (a re-created stream does not show its predecessor's
    /// events), after a fork's inherited ones ([`fork::Layout`]).
    pub layout: Arc<fork::Layout>,
    /// What a fork was forked from (`None` for a plain stream).
    pub fork_of: Option<fork::ForkOf>,
    /// A fork's source (channel and stream), released when the fork is forgotten.
    pub parent: Option<(String, Stream)>,
    /// The stream's forks (its reference count, PROTOCOL.md 4.2).
    pub children: Vec<fork::Child>,
    /// Deleted (or expired) while forks still use it: its URL answers 410
    /// and cannot be created again until the last fork is gone.
    pub soft_deleted: bool,
    /// Whether the stream is closed, and the producer tuple that closed it.
    pub closed: bool,
    /// `(producer id, epoch, seq)` of the append that closed the stream.
    pub closed_by: Option<(String, u64, u64)>,
    /// The newest `Stream-Seq` accepted (scope: the stream).
    pub last_stream_seq: Option<String>,
    /// Idempotent producers: id -> (epoch, last seq accepted).
    pub producers: HashMap<String, (u64, u64)>,
    /// Whether the stream was forgotten (deleted, expired): live readers
    /// holding it end.
    pub deleted: bool,
    /// Bumped on closure and deletion ([`Meta::announce`]), so live readers
    /// waiting at the tail wake up and know which without the lock.
    pub closed_tx: watch::Sender<Life>,
    /// The stream's incarnation: random at creation, part of its appends'
    /// idempotency keys ([`super::meta::Record::inc`]).
    pub inc: u64,
    /// The seq of the newest record of this state in [`super::meta::CHANNEL`]
    /// (0: not journaled yet).
    pub rev: u64,
    /// When that record was written (Unix ms).
    pub rev_ms: u64,
    /// How appends are ordered (see [`Order`]).
    pub order: Order,
}

/// How a stream's appends are ordered without holding its lock across a
/// journal commit.
#[derive(Debug, Default)]
pub struct Order {
    /// An append without `Stream-Closed` holds it shared from its checks to
    /// its answer; a close, a delete and the forgetting of an expired
    /// stream hold it alone (fair: one waiting holds later appends back),
    /// so they come after every append in flight and before every later one.
    pub gate: Arc<tokio::sync::RwLock<()>>,
    /// The appends with producer headers or `Stream-Seq` whose journal
    /// append is in flight: at most one per producer id, and each
    /// `Stream-Seq` above the committed one.
    pub inflight: Vec<Claim>,
    /// Signalled whenever an append of `inflight` settles.
    pub settled: Arc<tokio::sync::Notify>,
}

/// What an append in flight claims of a stream's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// Its `Producer-Id`.
    pub producer: Option<String>,
    /// Its `Stream-Seq`.
    pub stream_seq: Option<String>,
}

/// What a stream's watch ([`Meta::closed_tx`]) tells its live readers; it
/// only moves forward.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Life {
    /// Open.
    #[default]
    Open,
    /// Closed: its tail is final.
    Closed,
    /// Deleted, expired or soft-deleted: its live readers end.
    Gone,
}

/// A new stream's watch ([`Meta::closed_tx`]).
pub fn life() -> watch::Sender<Life> {
    watch::Sender::new(Life::Open)
}

impl Meta {
    /// Tells the stream's live readers that it is now `life` (or further
    /// along), waking every one of them.
    pub fn announce(&self, life: Life) {
        self.closed_tx.send_modify(|l| *l = (*l).max(life));
    }

    /// The bare media type: lower case, without parameters.
    pub fn media_type(&self) -> String {
        media_type(&self.content_type)
    }

    /// Whether the stream is JSON mode (PROTOCOL.md 9.1).
    pub fn is_json(&self) -> bool {
        self.media_type() == "application/json"
    }

    /// Whether SSE carries the data as text (`text/*`, `application/json`)
    /// rather than base64.
    pub fn is_text(&self) -> bool {
        let m = self.media_type();
        m.starts_with("text/") || m == "application/json"
    }

    /// Restarts the TTL window at `now_ms` (a read or write that reached the
    /// server; `HEAD` does not).
    pub fn touch(&mut self, now_ms: u64) {
        let ttl = self
            .ttl_s
            .map(|t| now_ms.saturating_add(t.saturating_mul(1000)));
        let abs = self.expires_at.as_ref().map(|e| e.1);
        self.deadline_ms = match (ttl, abs) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// Whether the stream has expired at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.deadline_ms.is_some_and(|d| now_ms >= d)
    }
}

/// The bare media type of a `Content-Type` value: lower case, without parameters.
pub fn media_type(ct: &str) -> String {
    ct.split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// A stream's shared, locked metadata.
pub type Stream = Arc<tokio::sync::Mutex<Meta>>;

/// Every stream this server knows, by channel.
#[derive(Default)]
pub struct Streams {
    map: Mutex<HashMap<String, Stream>>,
}

impl Streams {
    /// The stream on `channel`, if one was created (and not deleted).
    pub fn get(&self, channel: &str) -> Option<Stream> {
        self.map.lock().get(channel).cloned()
    }

    /// Registers `stream` on `channel`, unless one exists: then that one is
    /// returned as `Err`.
    pub fn insert(&self, channel: &str, stream: Stream) -> Result<(), Stream> {
        let mut map = self.map.lock();
        if let Some(s) = map.get(channel) {
            return Err(s.clone());
        }
        map.insert(channel.to_owned(), stream);
        Ok(())
    }

    /// The channels of every stream (the subscriptions' stream listing).
    pub fn channels(&self) -> Vec<String> {
        self.map.lock().keys().cloned().collect()
    }

    /// Every stream, with its channel.
    pub fn all(&self) -> Vec<(String, Stream)> {
        self.map
            .lock()
            .iter()
            .map(|(c, s)| (c.clone(), s.clone()))
            .collect()
    }

    /// Forgets the stream on `channel` if it is still `stream`.
    pub fn remove(&self, channel: &str, stream: &Stream) {
        let mut map = self.map.lock();
        if map.get(channel).is_some_and(|s| Arc::ptr_eq(s, stream)) {
            map.remove(channel);
        }
    }
}

/// Reads a `Stream-TTL` value: a non-negative decimal integer without sign
/// or leading zeros (PROTOCOL.md 5.1).
///
/// # Errors
/// A message saying what is wrong.
pub fn parse_ttl(v: &str) -> Result<u64, String> {
    let ok = !v.is_empty()
        && v.bytes().all(|b| b.is_ascii_digit())
        && !(v.len() > 1 && v.starts_with('0'));
    if !ok {
        return Err(format!(
            "Stream-TTL {v:?} must be whole seconds in decimal, without sign or leading zeros"
        ));
    }
    v.parse::<u64>()
        .map_err(|_| format!("Stream-TTL {v:?} is too large"))
}

/// Reads an RFC 3339 timestamp (`2026-01-02T03:04:05Z`, optional fraction,
/// `Z` or `±HH:MM`) into Unix milliseconds.
///
/// # Errors
/// A message naming the expected shape.
pub fn parse_rfc3339(v: &str) -> Result<u64, String> {
    let bad = || {
        format!("Stream-Expires-At {v:?} is not an RFC 3339 timestamp (e.g. 2030-01-02T03:04:05Z)")
    };
    let b = v.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        let s = v.get(r).ok_or_else(bad)?;
        if !s.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse::<i64>().map_err(|_| bad())
    };
    let (y, mo, d, h, mi, s) = (
        num(0..4)?,
        num(5..7)?,
        num(8..10)?,
        num(11..13)?,
        num(14..16)?,
        num(17..19)?,
    );
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return Err(bad());
    }
    let mut i = 19;
    let mut ms = 0i64;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while b.get(i).is_some_and(|c| c.is_ascii_digit()) {
            i += 1;
        }
        if i == start {
            return Err(bad());
        }
        let frac = &v[start..i.min(start + 3)];
        ms = frac.parse::<i64>().map_err(|_| bad())? * 10i64.pow(3 - frac.len() as u32);
    }
    let tz = &v[i..];
    let offset_s = match tz {
        "Z" | "z" => 0,
        _ => {
            let t = tz.as_bytes();
            if t.len() != 6 || !matches!(t[0], b'+' | b'-') || t[3] != b':' {
                return Err(bad());
            }
            let oh = num(i + 1..i + 3)?;
            let om = num(i + 4..i + 6)?;
            let o = oh * 3600 + om * 60;
            if t[0] == b'-' {
                -o
            } else {
                o
            }
        }
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let yy = if mo <= 2 { y - 1 } else { y };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + s - offset_s;
    u64::try_from(secs * 1000 + ms).map_err(|_| bad())
}

/// Splits a JSON-mode body into its messages (PROTOCOL.md 9.1): a
/// top-level array gives its elements (one level flattened), anything else
/// is one message. Each message keeps its exact text.
///
/// # Errors
/// A message for a body that is not one valid JSON value.
pub fn json_messages(body: &str) -> Result<Vec<String>, String> {
    serde_json::from_str::<serde::de::IgnoredAny>(body)
        .map_err(|e| format!("the body is not valid JSON: {e}"))?;
    let t = body.trim_matches(|c: char| matches!(c, ' ' | '\t' | '\n' | '\r'));
    if !t.starts_with('[') {
        return Ok(vec![t.to_owned()]);
    }
    let inner = &t[1..t.len() - 1];
    let mut out = Vec::new();
    let (mut depth, mut in_str, mut esc, mut start) = (0usize, false, false, 0usize);
    for (i, c) in inner.char_indices() {
        if in_str {
            match c {
                _ if esc => esc = false,
                '\\' => esc = true,
                '"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '[' | '{' => depth += 1,
            ']' | '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(inner[start..i].trim().to_owned());
                start = i + 1;
            }
            _ => {}
        }
    }
    let last = inner[start..].trim();
    if !last.is_empty() || !out.is_empty() {
        out.push(last.to_owned());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_bodies_flatten_one_level_and_keep_their_text() {
        assert_eq!(
            json_messages(r#"{"a": 1}"#).unwrap_or_default(),
            vec![r#"{"a": 1}"#]
        );
        assert_eq!(
            json_messages(r#" [ {"a":"x,]"} , [1,2], "s\"," ] "#).unwrap_or_default(),
            vec![r#"{"a":"x,]"}"#, "[1,2]", r#""s\",""#]
        );
        assert_eq!(json_messages("[[[1]]]").unwrap_or_default(), vec!["[[1]]"]);
        assert!(json_messages("[]").unwrap_or_default().is_empty());
        assert!(json_messages("[1,").is_err());
        assert!(json_messages("").is_err());
    }

    #[test]
    fn ttl_and_expiry_are_read_strictly() {
        assert_eq!(parse_ttl("3600"), Ok(3600));
        assert_eq!(parse_ttl("0"), Ok(0));
        for bad in ["", "+1", "01", "1.0", "1e3", "-1", "x"] {
            assert!(parse_ttl(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_rfc3339("1970-01-01T00:00:01Z"), Ok(1000));
        assert_eq!(
            parse_rfc3339("2000-03-01T00:00:00.5+01:00"),
            Ok(951_865_200_500)
        );
        assert!(parse_rfc3339("2000-13-01T00:00:00Z").is_err());
        assert!(parse_rfc3339("tomorrow").is_err());
    }
}
