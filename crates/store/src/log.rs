//! The commit log: how an append is made durable cheaply, and how it reaches
//! the indexed tables later.
//!
//! Keyed by `(channel id, seq)`, a commit of appends to 64 channels dirties
//! (copy-on-write) at least 64 leaf pages of `events` and most of their branch
//! pages: about 8 KiB written per 100-byte event. So each commit instead
//! writes what its appends decided, as records, into one row of the `log`
//! table (appended at its end: a few pages per commit). Every
//! [`CHECKPOINT_BYTES`] of records, the writer applies the logged records to
//! `channels`, `events` and the idempotency tables and empties `log`, in one
//! transaction: each leaf page is then rewritten once for many events.
//!
//! A record is physical: it carries the seqs, time, floor and row the writer
//! decided, so applying it (at a checkpoint, or when the store opens after a
//! crash) never decides anything again. Until a checkpoint the writer's cache
//! and [`crate::overlay::Overlay`] (for readers) hold what the tables lack.
//!
//! Record layout (integers little-endian):
//! `id u64 | old_floor u64 | head u64 | floor u64 | time u64 | n u32 |
//! name_len u32 | name | key_len u32 (u32::MAX = none) | key |
//! n × (type_len u32 (u32::MAX = none) | type | data_len u32 | data)`.
//! The events have seqs `head - n + 1 ..= head`. The top bit of `data_len`
//! ([`BINARY`]) marks data that is bytes rather than text; records written
//! before binary payloads never have it, so they read as text, unchanged.
//! A record with no event (`n` 0) changes nothing but makes sure the
//! channel has a `channels` row: a metadata change without events writes
//! one, so every channel with metadata has a row (`channel_meta.rs`).
//!
//! A *metadata record* (format 4) sets or removes a channel's metadata
//! ([`gapless_core::meta::ChannelMeta`]) in the `channel_meta` table:
//! `u64::MAX ([`META_TAG`]) | name_len u32 | name | meta_len u32 (u32::MAX
//! = removed) | meta`, `meta` being [`gapless_core::meta::ChannelMeta::encode`]'s
//! JSON. An append record begins with its channel's id, which is never
//! `u64::MAX` (ids count up from 1), so the two kinds tell apart by their
//! first 8 bytes, and records of format 3 read unchanged. A change's
//! records (its append's, then its metadata's) are in one frame: a crash
//! keeps both or neither, and replaying them decides nothing again.

use crate::apply::Tables;
use crate::tables::{corrupt, storage, LOG};
use gapless_core::JournalError;
use gapless_protocol::Payload;
use redb::{Database, ReadableTable, WriteTransaction};

/// Record bytes of durable commits after which the checkpointer applies
/// them to the tables (`checkpoint.rs`): 1 MiB, about 7000 events of 100
/// bytes, so each leaf page of a busy channel is rewritten once for many of
/// its events.
pub(crate) const CHECKPOINT_BYTES: usize = 1 << 20;

/// Marks an absent key or type.
const NONE: u32 = u32::MAX;
/// The first 8 bytes of a metadata record (where an append record has its
/// channel's id, never this).
pub(crate) const META_TAG: u64 = u64::MAX;
/// Set in an event's `data_len` when its data is bytes (data is far below
/// 2 GiB: `--max-event-bytes`).
const BINARY: u32 = 1 << 31;

/// One append as decided by the writer.
pub(crate) struct Record<'a> {
    /// The channel's id.
    pub id: u64,
    /// The channel's name.
    pub name: &'a str,
    /// Its floor before the append.
    pub old_floor: u64,
    /// Its head after the append.
    pub head: u64,
    /// Its floor after the append.
    pub floor: u64,
    /// The commit time of the events (the channel's `last_time` after).
    pub time: u64,
    /// The idempotency key, if any.
    pub key: Option<&'a str>,
    /// The events, `(type, data, binary)`, in seq order: `data` is text's
    /// UTF-8 (checked when read) or, with `binary`, bytes.
    pub events: Vec<(Option<&'a str>, &'a [u8], bool)>,
}

/// One metadata change as decided by the writer (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MetaRecord<'a> {
    /// The channel's name.
    pub name: &'a str,
    /// The metadata's JSON (`ChannelMeta::encode`); `None`: removed.
    pub meta: Option<&'a [u8]>,
}

/// A record of either kind, as read back.
pub(crate) enum Entry<'a> {
    /// An append (or a row-only record, without events).
    Append(Record<'a>),
    /// A metadata change.
    Meta(MetaRecord<'a>),
}

/// Writes a metadata record for channel `name` to `out`: `meta` is the JSON
/// of the channel's metadata after the change (`None`: removed).
pub(crate) fn put_meta(out: &mut Vec<u8>, name: &str, meta: Option<&str>) {
    out.extend_from_slice(&META_TAG.to_le_bytes());
    put_str(out, Some(name));
    // The metadata is a few KiB at most (names, producers, forks).
    put_str(out, meta);
}

impl Record<'_> {
    /// Seq of the first event.
    pub(crate) fn first_seq(&self) -> u64 {
        self.head + 1 - self.events.len() as u64
    }
}

/// Writes the header of a record with `n` events to `out`; the events follow
/// with [`put_event`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn put_header(
    out: &mut Vec<u8>,
    id: u64,
    name: &str,
    old_floor: u64,
    head: u64,
    floor: u64,
    time: u64,
    key: Option<&str>,
    n: usize,
) {
    for v in [id, old_floor, head, floor, time] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    put_len(out, n);
    put_str(out, Some(name));
    put_str(out, key);
}

/// Writes one event of a record.
pub(crate) fn put_event(out: &mut Vec<u8>, event_type: Option<&str>, data: &Payload) {
    put_str(out, event_type);
    let len = u32::try_from(data.len())
        .unwrap_or(BINARY - 1)
        .min(BINARY - 1);
    let tag = if data.is_binary() { BINARY | len } else { len };
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&data.as_bytes()[..len as usize]);
}

fn put_len(out: &mut Vec<u8>, n: usize) {
    // Names, keys, types and data are far below 4 GiB (server limits).
    let n = u32::try_from(n).unwrap_or(NONE - 1);
    out.extend_from_slice(&n.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => {
            put_len(out, s.len());
            out.extend_from_slice(s.as_bytes());
        }
        None => out.extend_from_slice(&NONE.to_le_bytes()),
    }
}

/// Reads the records of `bytes` one after the other.
pub(crate) struct Records<'a> {
    bytes: &'a [u8],
    /// Whether text data is checked to be UTF-8 (records read from disk);
    /// records this process wrote hold text it checked when published.
    check_text: bool,
}

impl<'a> Records<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Records {
            bytes,
            check_text: true,
        }
    }

    /// Records this process wrote (see [`Records::check_text`]).
    pub(crate) fn written_here(bytes: &'a [u8]) -> Self {
        Records {
            bytes,
            check_text: false,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], JournalError> {
        if self.bytes.len() < n {
            return Err(corrupt("log record too short"));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u64(&mut self) -> Result<u64, JournalError> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(
            b.try_into().map_err(|_| corrupt("log"))?,
        ))
    }

    fn u32(&mut self) -> Result<u32, JournalError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes(
            b.try_into().map_err(|_| corrupt("log"))?,
        ))
    }

    fn str(&mut self) -> Result<Option<&'a str>, JournalError> {
        let len = self.u32()?;
        if len == NONE {
            return Ok(None);
        }
        let b = self.take(len as usize)?;
        std::str::from_utf8(b)
            .map(Some)
            .map_err(|_| corrupt("log text is not UTF-8"))
    }

    fn entry(&mut self) -> Result<Entry<'a>, JournalError> {
        let first = self
            .bytes
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes);
        if first == Some(META_TAG) {
            self.u64()?;
            let name = self
                .str()?
                .ok_or_else(|| corrupt("metadata record without a name"))?;
            let len = self.u32()?;
            let meta = match len {
                NONE => None,
                len => Some(self.take(len as usize)?),
            };
            if self.check_text {
                if let Some(text) = meta {
                    gapless_core::meta::ChannelMeta::decode(text)
                        .map_err(|_| corrupt("metadata record does not decode"))?;
                }
            }
            return Ok(Entry::Meta(MetaRecord { name, meta }));
        }
        self.record().map(Entry::Append)
    }

    fn record(&mut self) -> Result<Record<'a>, JournalError> {
        let (id, old_floor, head, floor, time) = (
            self.u64()?,
            self.u64()?,
            self.u64()?,
            self.u64()?,
            self.u64()?,
        );
        let n = self.u32()? as usize;
        let name = self
            .str()?
            .ok_or_else(|| corrupt("log record without a name"))?;
        let key = self.str()?;
        if n as u64 > head {
            return Err(corrupt("log record has more events than its head"));
        }
        let mut events = Vec::with_capacity(n.min(self.bytes.len() / 8));
        for _ in 0..n {
            let event_type = self.str()?;
            let tag = self.u32()?;
            if tag == NONE {
                return Err(corrupt("log event without data"));
            }
            let binary = tag & BINARY != 0;
            let data = self.take((tag & !BINARY) as usize)?;
            if self.check_text && !binary && std::str::from_utf8(data).is_err() {
                return Err(corrupt("log text is not UTF-8"));
            }
            events.push((event_type, data, binary));
        }
        Ok(Record {
            id,
            name,
            old_floor,
            head,
            floor,
            time,
            key,
            events,
        })
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Entry<'a>, JournalError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.bytes.is_empty() {
            return None;
        }
        let item = self.entry();
        if item.is_err() {
            self.bytes = &[];
        }
        Some(item)
    }
}

/// Applies every record of `bytes` to `tables` (see [`Tables::finish`]).
pub(crate) fn apply_all(tables: &mut Tables<'_>, bytes: &[u8]) -> Result<(), JournalError> {
    for entry in Records::new(bytes) {
        match entry? {
            Entry::Append(record) => tables.apply(&record)?,
            Entry::Meta(record) => tables.apply_meta(&record)?,
        }
    }
    Ok(())
}

/// Applies the records in `log` to the other tables and empties it, in `txn`.
/// Returns how many rows there were.
pub(crate) fn apply_logged(txn: &WriteTransaction) -> Result<usize, JournalError> {
    let mut log = txn.open_table(LOG).map_err(storage)?;
    let mut tables = Tables::open(txn)?;
    let mut rows = 0;
    for item in log.iter().map_err(storage)? {
        let (_, value) = item.map_err(storage)?;
        apply_all(&mut tables, value.value())?;
        rows += 1;
    }
    tables.finish()?;
    if rows > 0 {
        log.retain(|_, _| false).map_err(storage)?;
    }
    Ok(rows)
}

/// Applies whatever `log` holds (what a crash or a failed checkpoint left)
/// and commits that durably. Does nothing when it is empty.
pub(crate) fn recover(db: &Database) -> Result<(), JournalError> {
    let txn = db.begin_write().map_err(storage)?;
    if apply_logged(&txn)? == 0 {
        txn.abort().map_err(storage)?;
        return Ok(());
    }
    txn.commit().map_err(storage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() -> Result<(), JournalError> {
        let mut out = Vec::new();
        put_header(&mut out, 3, "chan", 1, 7, 2, 99, Some("k"), 3);
        put_event(&mut out, None, &"a".into());
        put_event(&mut out, Some("t"), &"".into());
        put_event(&mut out, Some("b"), &Payload::Binary(vec![0xff, 0]));
        put_header(&mut out, 4, "d", 1, 0, 1, 5, None, 0);
        let meta = r#"{"incarnation":1,"content_type":"text/plain","layout":{"offset_epoch":1,"channel_epoch":1,"base":0,"origin":0}}"#;
        put_meta(&mut out, "d", Some(meta));
        put_meta(&mut out, "e", None);
        let entries: Vec<_> = Records::new(&out).collect::<Result<_, _>>()?;
        assert_eq!(entries.len(), 4);
        let metas: Vec<MetaRecord<'_>> = entries
            .iter()
            .filter_map(|e| match e {
                Entry::Meta(m) => Some(*m),
                Entry::Append(_) => None,
            })
            .collect();
        assert_eq!(
            metas,
            [
                MetaRecord {
                    name: "d",
                    meta: Some(meta.as_bytes())
                },
                MetaRecord {
                    name: "e",
                    meta: None
                }
            ]
        );
        let records: Vec<&Record<'_>> = entries
            .iter()
            .filter_map(|e| match e {
                Entry::Append(r) => Some(r),
                Entry::Meta(_) => None,
            })
            .collect();
        assert_eq!(records.len(), 2);
        let r = &records[0];
        assert_eq!(
            (r.id, r.name, r.old_floor, r.head, r.floor),
            (3, "chan", 1, 7, 2)
        );
        assert_eq!((r.time, r.key, r.first_seq()), (99, Some("k"), 5));
        assert_eq!(
            r.events,
            [
                (None, &b"a"[..], false),
                (Some("t"), &b""[..], false),
                (Some("b"), &[0xff, 0][..], true)
            ]
        );
        assert_eq!((records[1].key, records[1].events.len()), (None, 0));
        assert!(Records::new(&out[..out.len() - 3]).any(|r| r.is_err()));
        // Metadata that is not JSON of a `ChannelMeta`, read from disk.
        let mut bad = Vec::new();
        put_meta(&mut bad, "d", Some("{"));
        assert!(Records::new(&bad).any(|r| r.is_err()));
        assert!(Records::written_here(&bad).all(|r| r.is_ok()));
        Ok(())
    }
}
