//! The on-disk layout: redb table definitions and the encoding of rows.
//!
//! One redb file holds six tables:
//!
//! | table                | key                        | value                              |
//! |----------------------|----------------------------|------------------------------------|
//! | `meta`               | name (`format`, `epoch`, `async_open`) | `u64`                  |
//! | `channels`           | channel name               | `(id, head, floor, last_time)`     |
//! | `events`             | `(channel id, seq)`        | encoded event (see [`encode_event`]) |
//! | `idempotency_keys`   | `(channel id, key)`        | `(first_seq, last_seq)`            |
//! | `idempotency_order`  | `(channel id, last_seq, key)` | `()`                            |
//! | `log`                | commit number              | the appends of one commit (see `log.rs`) |
//!
//! Channels get a small numeric id on their first append so event keys stay
//! 16 bytes whatever the name. Rows below a channel's floor are deleted in the
//! transaction that raises the floor; `idempotency_order` finds the keys whose
//! events went with them.
//!
//! An append is first committed as a record in `log` (one row per commit,
//! written at the end of the table, so a commit dirties a few pages whatever
//! the number of channels it touches). Every so often the writer applies the
//! logged records to the other tables and empties `log` in one transaction (a
//! checkpoint); opening the store does the same with whatever a crash left
//! there. See `log.rs`.

use gapless_core::JournalError;
use redb::TableDefinition;
use std::fmt::Display;

/// Version of this layout, stored under `meta["format"]`.
pub(crate) const FORMAT_VERSION: u64 = 2;
/// Older layout versions this build opens (format 1 is format 2 with an empty `log`).
pub(crate) const FORMAT_COMPATIBLE: u64 = 1;

/// `meta` key of the layout version.
pub(crate) const META_FORMAT: &str = "format";
/// `meta` key of the store's epoch.
pub(crate) const META_EPOCH: &str = "epoch";
/// `meta` key set to 1 while a process runs the store with `Durability::Async`
/// and back to 0 by its final durable commit.
pub(crate) const META_ASYNC_OPEN: &str = "async_open";

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

/// Marks an absent event type in the type-length field.
const NO_TYPE: u32 = u32::MAX;
/// Bytes before the type: time (u64 LE) and type length (u32 LE).
const HEADER: usize = 12;

/// Encodes an event row: `time: u64 LE | type_len: u32 LE (u32::MAX = none) | type | data`.
#[cfg(test)]
pub(crate) fn encode_event(time: u64, event_type: Option<&str>, data: &str) -> Vec<u8> {
    let mut out = Vec::new();
    encode_event_into(&mut out, time, event_type, data);
    out
}

/// [`encode_event`] into `out` (cleared first), reusing its allocation.
pub(crate) fn encode_event_into(
    out: &mut Vec<u8>,
    time: u64,
    event_type: Option<&str>,
    data: &str,
) {
    out.clear();
    let type_len = event_type.map_or(0, str::len);
    out.reserve(HEADER + type_len + data.len());
    out.extend_from_slice(&time.to_le_bytes());
    let tag = match event_type {
        Some(t) => u32::try_from(t.len()).unwrap_or(NO_TYPE - 1),
        None => NO_TYPE,
    };
    out.extend_from_slice(&tag.to_le_bytes());
    if let Some(t) = event_type {
        out.extend_from_slice(&t.as_bytes()[..tag as usize]);
    }
    out.extend_from_slice(data.as_bytes());
}

/// A decoded event row: `(time, type, data)`.
pub(crate) type DecodedEvent = (u64, Option<String>, String);

/// Decodes an event row written by [`encode_event`].
pub(crate) fn decode_event(bytes: &[u8]) -> Result<DecodedEvent, JournalError> {
    let time = event_time(bytes)?;
    let tag = u32::from_le_bytes(fixed(bytes, 8)?);
    let rest = bytes
        .get(HEADER..)
        .ok_or_else(|| corrupt("event row too short"))?;
    let (event_type, data) = if tag == NO_TYPE {
        (None, rest)
    } else {
        let len = tag as usize;
        if len > rest.len() {
            return Err(corrupt("event type overruns the row"));
        }
        let (t, d) = rest.split_at(len);
        (Some(utf8(t)?), d)
    };
    Ok((time, event_type, utf8(data)?))
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
        for (time, ty, data) in [
            (7, None, "x"),
            (u64::MAX, Some("t"), ""),
            (0, Some(""), "é"),
        ] {
            let row = encode_event(time, ty, data);
            let (t, ty2, d) = decode_event(&row)?;
            assert_eq!((t, ty2.as_deref(), d.as_str()), (time, ty, data));
            assert_eq!(event_time(&row)?, time);
        }
        Ok(())
    }

    #[test]
    fn corrupt_rows_are_errors_not_panics() {
        assert!(decode_event(&[1, 2, 3]).is_err());
        let mut row = encode_event(1, Some("type"), "data");
        row[8] = 200;
        assert!(decode_event(&row).is_err());
        let mut row = encode_event(1, None, "data");
        row[HEADER] = 0xff;
        assert!(decode_event(&row).is_err());
    }
}
