//! The on-disk layout: redb table definitions and the encoding of rows.
//!
//! One redb file holds seven tables, and an eighth once a channel is purged:
//!
//! | table                | key                        | value                              |
//! |----------------------|----------------------------|------------------------------------|
//! | `meta`               | name (`format`, `epoch`, `async_open`) | `u64`                  |
//! | `channels`           | channel name               | `(id, head, floor, last_time)`     |
//! | `events`             | `(channel id, first seq)`  | one event, or a chunk of consecutive events ([`ChunkBuilder`]) |
//! | `idempotency_keys`   | `(channel id, key)`        | `(first_seq, last_seq)`            |
//! | `idempotency_order`  | `(channel id, last_seq, key)` | `()`                            |
//! | `log`                | commit number              | the appends of one commit (see `log.rs`) |
//! | `purged`             | channel name               | the epoch its last purge began (see `purge.rs`) |
//! | `channel_meta`       | channel name               | the channel's metadata, JSON (see `channel_meta.rs`) |
//!
//! Channels get a small numeric id on their first append so event keys stay
//! 16 bytes whatever the name. Rows below a channel's floor are deleted in the
//! transaction that raises the floor; `idempotency_order` finds the keys whose
//! events went with them.
//!
//! An append is first committed as a record in a frame of the write-ahead
//! log beside the file (`wal.rs`); the checkpointer applies the records to
//! the other tables later (`checkpoint.rs`). Format 2 kept the records in
//! the `log` table instead; opening a format-2 store applies whatever a
//! crash left there (`log.rs`), and format 3 leaves it empty.
//!
//! Only channels that have metadata ([`gapless_core::meta`], a Durable
//! Streams stream) have a `channel_meta` row; every such channel also has a
//! `channels` row. A store of format 3 has no `channel_meta` table: opening
//! it creates the table, empty, and makes the store format 4.

use gapless_core::JournalError;
use gapless_protocol::Payload;
use redb::{ReadableTable, TableDefinition};
use std::fmt::Display;

/// Version of this layout, stored under `meta["format"]`: 4 is format 3
/// with the `channel_meta` table and metadata records in the write-ahead
/// log (`log.rs`), which a format-3 build would misread; 3 is format 2
/// with the write-ahead log beside the file (`wal.rs`),
/// `meta["wal_applied"]`, and chunk rows in `events` ([`ChunkBuilder`]); an
/// older build refuses a newer format rather than miss the commits only the
/// WAL holds or misread a chunk or a record.
pub(crate) const FORMAT_VERSION: u64 = 4;
/// Older layout versions this build opens and upgrades (format 1 is format
/// 2 with an empty `log`; format 2 is format 3 with no WAL and no chunk
/// row; format 3 is format 4 without channel metadata).
pub(crate) const FORMAT_COMPATIBLE: [u64; 3] = [1, 2, 3];

/// `meta` key of the layout version.
pub(crate) const META_FORMAT: &str = "format";
/// `meta` key of the store's epoch.
pub(crate) const META_EPOCH: &str = "epoch";
/// `meta` key set to 1 while a process runs the store with `Durability::Async`
/// and back to 0 by its final durable commit.
pub(crate) const META_ASYNC_OPEN: &str = "async_open";
/// `meta` key of the last write-ahead log frame applied to the tables (`wal.rs`).
pub(crate) const META_WAL_APPLIED: &str = "wal_applied";
/// `meta` key set to 1 once a process has its write-ahead log open, and back
/// to 0 by its final checkpoint: at 1, the tables may lack commits only the
/// log holds.
pub(crate) const META_WAL_LIVE: &str = "wal_live";

/// Store-wide values.
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Channel name -> `(id, head, floor, last_time)`.
pub(crate) const CHANNELS: TableDefinition<&str, (u64, u64, u64, u64)> =
    TableDefinition::new("channels");
/// `(channel id, seq)` -> encoded event.
pub(crate) const EVENTS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("events");
/// `(channel id, idempotency key)` -> `(first_seq, last_seq)`.
pub(crate) const KEYS: TableDefinition<(u64, &str), (u64, u64)> =
    TableDefinition::new("idempotency_keys");
/// `(channel id, last_seq, idempotency key)`: keys in eviction order.
pub(crate) const KEY_ORDER: TableDefinition<(u64, u64, &str), ()> =
    TableDefinition::new("idempotency_order");
/// Channel name -> the epoch its last purge began (`purge.rs`); a channel
/// without a row has the store's epoch. Created by the first purge.
pub(crate) const PURGED: TableDefinition<&str, u64> = TableDefinition::new("purged");
/// Channel name -> its metadata, [`gapless_core::meta::ChannelMeta::encode`]'s
/// JSON (`channel_meta.rs`). Only channels with metadata have a row.
pub(crate) const CHANNEL_META: TableDefinition<&str, &[u8]> = TableDefinition::new("channel_meta");
/// Commit number -> the append records of that commit, not yet applied to
/// the other tables.
pub(crate) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");

/// A `channels` row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChannelRow {
    /// Numeric id used in the other tables' keys.
    pub id: u64,
    /// Newest seq assigned.
    pub head: u64,
    /// Oldest retained seq (`head + 1` when none).
    pub floor: u64,
    /// Commit time of the newest event (times never go backwards).
    pub last_time: u64,
}

impl ChannelRow {
    /// The row as stored.
    pub(crate) fn to_tuple(self) -> (u64, u64, u64, u64) {
        (self.id, self.head, self.floor, self.last_time)
    }

    /// The row from its stored form.
    pub(crate) fn from_tuple((id, head, floor, last_time): (u64, u64, u64, u64)) -> Self {
        ChannelRow {
            id,
            head,
            floor,
            last_time,
        }
    }
}

/// The type-length field of a text event without a type.
const NO_TYPE: u32 = u32::MAX;
/// The type-length field of a binary event without a type.
const NO_TYPE_BINARY: u32 = u32::MAX - 1;
/// Set in the type-length field of a binary event with a type (the type's
/// length is in the other bits; types are at most 64 bytes).
const BINARY: u32 = 1 << 31;
/// Bytes before the type: time (u64 LE) and type length (u32 LE).
const HEADER: usize = 12;

/// Encodes an event row: `time: u64 LE | tag: u32 LE | type | data`.
///
/// `tag` says whether there is a type, its length, and whether the data is
/// text or bytes: `u32::MAX` text without type, below `2^31` text with a type
/// that long (the only two forms before binary payloads, so every older row
/// reads as text, unchanged), `u32::MAX - 1` bytes without type, `2^31 | len`
/// bytes with a type of `len` bytes.
#[cfg(test)]
pub(crate) fn encode_event(time: u64, event_type: Option<&str>, data: &Payload) -> Vec<u8> {
    let mut out = Vec::new();
    encode_event_into(
        &mut out,
        time,
        event_type,
        data.as_bytes(),
        data.is_binary(),
    );
    out
}

/// [`encode_event`] into `out` (cleared first), reusing its allocation; `data`
/// is text's UTF-8 (`binary` false) or bytes.
#[cfg(test)]
pub(crate) fn encode_event_into(
    out: &mut Vec<u8>,
    time: u64,
    event_type: Option<&str>,
    data: &[u8],
    binary: bool,
) {
    out.clear();
    append_event(out, time, event_type, data, binary);
}

/// [`encode_event`] at the end of `out`.
fn append_event(out: &mut Vec<u8>, time: u64, event_type: Option<&str>, data: &[u8], binary: bool) {
    let type_len = event_type.map_or(0, str::len);
    out.reserve(HEADER + type_len + data.len());
    out.extend_from_slice(&time.to_le_bytes());
    // Types are at most 64 bytes (protocol::name::MAX_TYPE_LEN).
    let len = u32::try_from(type_len)
        .unwrap_or(BINARY - 1)
        .min(BINARY - 1);
    let tag = match (event_type.is_some(), binary) {
        (false, false) => NO_TYPE,
        (false, true) => NO_TYPE_BINARY,
        (true, false) => len,
        (true, true) => BINARY | len,
    };
    out.extend_from_slice(&tag.to_le_bytes());
    if let Some(t) = event_type {
        out.extend_from_slice(&t.as_bytes()[..len as usize]);
    }
    out.extend_from_slice(data);
}

/// The time field of a chunk row: no event has it (times are Unix ms).
const CHUNK: u64 = u64::MAX;
/// Bytes before a chunk row's events: the marker and the count (u32 LE).
const CHUNK_HEADER: usize = 12;
/// Most events in one chunk row.
pub(crate) const CHUNK_EVENTS: u32 = 64;
/// A chunk row takes no more events once it holds this many bytes.
pub(crate) const CHUNK_BYTES: usize = 16 << 10;

/// A row of `events` holding events from the seq of its key on: one event
/// ([`encode_event`], the only form before format 3), or a *chunk* of
/// consecutive events: `u64::MAX LE | n: u32 LE | n × (len: u32 LE | one
/// event's encoding, len bytes)`. A checkpoint writes each channel's new
/// events as chunks of up to [`CHUNK_EVENTS`] events (or [`CHUNK_BYTES`]):
/// one insert for many events.
#[derive(Debug, Default)]
pub(crate) struct ChunkBuilder {
    /// Seq of the first event.
    pub first: u64,
    /// Events so far.
    pub n: u32,
    /// The row.
    pub row: Vec<u8>,
}

impl ChunkBuilder {
    /// Whether the event at `seq`, `bytes` long, joins this chunk.
    pub(crate) fn takes(&self, seq: u64) -> bool {
        self.n > 0
            && seq == self.first + u64::from(self.n)
            && self.n < CHUNK_EVENTS
            && self.row.len() < CHUNK_BYTES
    }

    /// Starts a new chunk at `seq` (the row's buffer is reused).
    pub(crate) fn start(&mut self, seq: u64) {
        self.first = seq;
        self.n = 0;
        self.row.clear();
        self.row.extend_from_slice(&CHUNK.to_le_bytes());
        self.row.extend_from_slice(&0u32.to_le_bytes());
    }

    /// Adds the next event.
    pub(crate) fn push(&mut self, time: u64, event_type: Option<&str>, data: &[u8], binary: bool) {
        let at = self.row.len();
        self.row.extend_from_slice(&0u32.to_le_bytes());
        append_event(&mut self.row, time, event_type, data, binary);
        let len = u32::try_from(self.row.len() - at - 4).unwrap_or(u32::MAX);
        self.row[at..at + 4].copy_from_slice(&len.to_le_bytes());
        self.n += 1;
        self.row[8..12].copy_from_slice(&self.n.to_le_bytes());
    }
}

/// The events of the row whose key's seq is `first`: `(seq, one event's
/// encoding)`, in order.
pub(crate) fn row_events(
    first: u64,
    row: &[u8],
) -> impl Iterator<Item = Result<(u64, &[u8]), JournalError>> {
    let chunk = row.len() >= CHUNK_HEADER && event_time(row).is_ok_and(|t| t == CHUNK);
    let mut single = (!chunk).then_some(row);
    let mut rest = if chunk { &row[CHUNK_HEADER..] } else { &[][..] };
    let mut left = if chunk {
        fixed::<4>(row, 8).map_or(0, u32::from_le_bytes)
    } else {
        0
    };
    let mut seq = first;
    std::iter::from_fn(move || {
        if let Some(one) = single.take() {
            return Some(Ok((seq, one)));
        }
        if left == 0 {
            return (!rest.is_empty()).then(|| {
                rest = &[];
                Err(corrupt("a chunk row holds more than its count"))
            });
        }
        left -= 1;
        let item = fixed::<4>(rest, 0)
            .map(|b| u32::from_le_bytes(b) as usize)
            .and_then(|len| {
                rest.get(4..4 + len)
                    .ok_or_else(|| corrupt("an event overruns its chunk row"))
                    .map(|ev| (len, ev))
            });
        match item {
            Ok((len, ev)) => {
                rest = &rest[4 + len..];
                let at = seq;
                seq += 1;
                Some(Ok((at, ev)))
            }
            Err(e) => {
                left = 0;
                rest = &[];
                Some(Err(e))
            }
        }
    })
}

/// The seq of the last event in the row whose key's seq is `first`.
pub(crate) fn row_last(first: u64, row: &[u8]) -> u64 {
    if row.len() >= CHUNK_HEADER && event_time(row).is_ok_and(|t| t == CHUNK) {
        let n = fixed::<4>(row, 8).map_or(1, u32::from_le_bytes);
        first + u64::from(n.max(1)) - 1
    } else {
        first
    }
}

/// The key seq of the row holding event `seq` of channel `id`: a chunk that
/// starts before it, or `seq` itself (whether or not a row has it).
pub(crate) fn first_row(
    table: &impl ReadableTable<(u64, u64), &'static [u8]>,
    id: u64,
    seq: u64,
) -> Result<u64, JournalError> {
    let mut back = table.range((id, 0)..=(id, seq)).map_err(storage)?;
    match back.next_back() {
        Some(item) => {
            let (key, row) = item.map_err(storage)?;
            let first = key.value().1;
            Ok(if row_last(first, row.value()) >= seq {
                first
            } else {
                seq
            })
        }
        None => Ok(seq),
    }
}

/// The encoding of event `seq` of channel `id`, if a row holds it.
pub(crate) fn event_at(
    table: &impl ReadableTable<(u64, u64), &'static [u8]>,
    id: u64,
    seq: u64,
) -> Result<Option<Vec<u8>>, JournalError> {
    let first = first_row(table, id, seq)?;
    let Some(row) = table.get((id, first)).map_err(storage)? else {
        return Ok(None);
    };
    for event in row_events(first, row.value()) {
        let (at, event) = event?;
        if at == seq {
            return Ok(Some(event.to_vec()));
        }
    }
    Ok(None)
}

/// A decoded event row: `(time, type, data)`.
pub(crate) type DecodedEvent = (u64, Option<String>, Payload);

/// Decodes an event row written by [`encode_event`] (or by a release before
/// binary payloads: its rows are all text).
pub(crate) fn decode_event(bytes: &[u8]) -> Result<DecodedEvent, JournalError> {
    let time = event_time(bytes)?;
    let tag = u32::from_le_bytes(fixed(bytes, 8)?);
    let rest = bytes
        .get(HEADER..)
        .ok_or_else(|| corrupt("event row too short"))?;
    let (type_len, binary) = match tag {
        NO_TYPE => (None, false),
        NO_TYPE_BINARY => (None, true),
        t if t & BINARY != 0 => (Some((t & !BINARY) as usize), true),
        t => (Some(t as usize), false),
    };
    let (event_type, data) = match type_len {
        None => (None, rest),
        Some(len) => {
            if len > rest.len() {
                return Err(corrupt("event type overruns the row"));
            }
            let (t, d) = rest.split_at(len);
            (Some(utf8(t)?), d)
        }
    };
    let data = Payload::from_bytes(data.to_vec(), binary)
        .map_err(|_| corrupt("event text is not UTF-8"))?;
    Ok((time, event_type, data))
}

/// The length of an encoded event's data, without decoding it (the byte
/// limit of retention counts data only).
pub(crate) fn data_len(bytes: &[u8]) -> Result<usize, JournalError> {
    let tag = u32::from_le_bytes(fixed(bytes, 8)?);
    let type_len = match tag {
        NO_TYPE | NO_TYPE_BINARY => 0,
        t if t & BINARY != 0 => (t & !BINARY) as usize,
        t => t as usize,
    };
    bytes
        .len()
        .checked_sub(HEADER + type_len)
        .ok_or_else(|| corrupt("event type overruns the row"))
}

/// The commit time of an encoded event, without decoding the rest.
pub(crate) fn event_time(bytes: &[u8]) -> Result<u64, JournalError> {
    if bytes.len() < HEADER {
        return Err(corrupt("event row too short"));
    }
    Ok(u64::from_le_bytes(fixed(bytes, 0)?))
}

fn fixed<const N: usize>(bytes: &[u8], at: usize) -> Result<[u8; N], JournalError> {
    bytes
        .get(at..at + N)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| corrupt("event row too short"))
}

fn utf8(bytes: &[u8]) -> Result<String, JournalError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| corrupt("event text is not UTF-8"))
}

pub(crate) fn corrupt(what: &str) -> JournalError {
    JournalError::Storage(format!("corrupt journal: {what}"))
}

/// Wraps any storage-layer error (redb, I/O) as [`JournalError::Storage`],
/// or [`JournalError::Full`] when the disk ran out of space (ENOSPC, EDQUOT).
pub(crate) fn storage(e: impl Display) -> JournalError {
    let text = e.to_string();
    if text.contains("os error 28") || text.contains("os error 122") {
        JournalError::Full(format!(
            "{text}; nothing was stored. Free space under the data directory; if appends \
             still fail after that, restart the server (the store stops after an I/O error)"
        ))
    } else {
        JournalError::Storage(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_rows_round_trip() -> Result<(), JournalError> {
        let all: Vec<u8> = (0..=255).collect();
        for (time, ty, data) in [
            (7, None, Payload::from("x")),
            (u64::MAX, Some("t"), Payload::from("")),
            (0, Some(""), Payload::from("é")),
            (1, None, Payload::Binary(all.clone())),
            (2, Some("bin.t"), Payload::Binary(all.clone())),
            (3, Some("e"), Payload::Binary(Vec::new())),
            (4, None, Payload::Binary(b"text-like".to_vec())),
        ] {
            let row = encode_event(time, ty, &data);
            let (t, ty2, d) = decode_event(&row)?;
            assert_eq!((t, ty2.as_deref(), &d), (time, ty, &data));
            assert_eq!(data_len(&row)?, data.len());
            assert_eq!(event_time(&row)?, time);
        }
        Ok(())
    }

    /// Rows as a release before binary payloads wrote them read as the same
    /// text (the bytes are hard-coded: they must not follow the encoder).
    #[test]
    fn rows_of_the_release_before_binary_payloads_read_as_text() -> Result<(), JournalError> {
        let untyped = [7, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, b'h', b'i'];
        let (t, ty, d) = decode_event(&untyped)?;
        assert_eq!((t, ty, d), (7, None, Payload::from("hi")));
        let mut typed = vec![9, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, b'a', b'b'];
        typed.extend_from_slice("é\r\n".as_bytes());
        let (t, ty, d) = decode_event(&typed)?;
        assert_eq!(
            (t, ty.as_deref(), d),
            (9, Some("ab"), Payload::from("é\r\n"))
        );
        Ok(())
    }

    #[test]
    fn corrupt_rows_are_errors_not_panics() {
        assert!(decode_event(&[1, 2, 3]).is_err());
        let mut row = encode_event(1, Some("type"), &"data".into());
        row[8] = 200;
        assert!(decode_event(&row).is_err());
        let mut row = encode_event(1, Some("type"), &Payload::Binary(vec![1]));
        row[8] = 200;
        assert!(decode_event(&row).is_err());
        let mut row = encode_event(1, None, &"data".into());
        row[HEADER] = 0xff;
        assert!(decode_event(&row).is_err());
    }

    #[test]
    fn chunk_rows_hold_consecutive_events_and_single_rows_one() -> Result<(), JournalError> {
        let mut c = ChunkBuilder::default();
        assert!(!c.takes(5));
        c.start(5);
        for (i, data) in ["a", "", "ccc"].iter().enumerate() {
            assert!(i == 0 || c.takes(5 + i as u64));
            c.push(
                10 + i as u64,
                (i == 1).then_some("t"),
                data.as_bytes(),
                false,
            );
        }
        assert!(!c.takes(9), "not the next seq");
        assert_eq!(row_last(5, &c.row), 7);
        let events: Vec<(u64, DecodedEvent)> = row_events(5, &c.row)
            .map(|e| e.and_then(|(seq, ev)| Ok((seq, decode_event(ev)?))))
            .collect::<Result<_, _>>()?;
        assert_eq!(
            events,
            [
                (5, (10, None, Payload::from("a"))),
                (6, (11, Some("t".to_owned()), Payload::from(""))),
                (7, (12, None, Payload::from("ccc"))),
            ]
        );
        // A single-event row (formats 1 and 2) is a row of one.
        let one = encode_event(3, None, &"x".into());
        assert_eq!(row_last(9, &one), 9);
        assert_eq!(row_events(9, &one).count(), 1);
        // A chunk is full at 64 events.
        c.start(1);
        for _ in 0..CHUNK_EVENTS {
            c.push(1, None, b"x", false);
        }
        assert!(!c.takes(1 + u64::from(CHUNK_EVENTS)));
        // A count beyond the events, or bytes beyond the count: errors.
        let mut row = c.row.clone();
        row[8] = 65;
        assert!(row_events(1, &row).any(|e| e.is_err()));
        let mut row = c.row.clone();
        row.push(0);
        assert!(row_events(1, &row).any(|e| e.is_err()));
        let mut row = c.row.clone();
        row.truncate(row.len() - 1);
        assert!(row_events(1, &row).any(|e| e.is_err()));
        Ok(())
    }
}
