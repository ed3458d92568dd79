//! The Durable Streams mapping of names and positions (docs/durable-streams.md):
//! a stream path to its gapless channel, an offset to a journal position, and
//! the `Stream-Cursor` of live reads.

use gapless_protocol::{name, Epoch};

/// The character a `/` of a stream path becomes in the channel name. It is
/// refused inside a stream path's segments, so the mapping is reversible.
pub const SEPARATOR: char = '~';

/// Why a stream path cannot name a channel; the message names the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadPath(pub String);

/// The channel a stream path maps to. `path` is the request path after the
/// prefix and its `/` (still percent-encoded): its segments, percent-decoded,
/// joined by [`SEPARATOR`]. `rooms/42/chat` maps to `rooms~42~chat`.
///
/// # Errors
/// [`BadPath`] for an empty path or segment, a `.` or `..` segment (clients
/// resolve them away), a `__ds` segment (percent-encoded: the literal one
/// routes to the subscription APIs), a segment holding `~`, bytes that
/// are not UTF-8 once decoded, or a channel name its rules refuse
/// (`gapless_protocol::name`: 1 to 200 of `A-Z a-z 0-9 _ - . : @ ~`).
pub fn channel_of(path: &str) -> Result<String, BadPath> {
    if path.is_empty() {
        return Err(BadPath(
            "the stream path is empty; a stream URL is PREFIX/NAME[/NAME...]".into(),
        ));
    }
    let mut out = String::with_capacity(path.len());
    for (i, seg) in path.split('/').enumerate() {
        let seg = percent_decode(seg).ok_or_else(|| {
            BadPath(format!(
                "stream path segment {seg:?} is not valid percent-encoded UTF-8"
            ))
        })?;
        if seg.is_empty() {
            return Err(BadPath(format!(
                "stream path {path:?} has an empty segment (a leading, trailing or doubled `/`)"
            )));
        }
        if seg == "." || seg == ".." {
            return Err(BadPath(format!(
                "stream path {path:?} has a `{seg}` segment: URL libraries and browsers resolve \
                 dot segments before sending (RFC 3986 5.2.4), so such a path would name another \
                 stream for them"
            )));
        }
        if seg == "__ds" {
            return Err(BadPath(format!(
                "stream path {path:?} has a `__ds` segment (here percent-encoded): `__ds` is \
                 reserved for the subscription APIs and never names a stream"
            )));
        }
        if seg.contains(SEPARATOR) || seg.contains('/') {
            return Err(BadPath(format!(
                "stream path segment {seg:?} contains `{SEPARATOR}` or an encoded `/`: the \
                 channel name joins segments with `{SEPARATOR}`, so it cannot appear inside one"
            )));
        }
        if i > 0 {
            out.push(SEPARATOR);
        }
        out.push_str(&seg);
    }
    name::validate_channel(&out).map_err(|e| {
        BadPath(format!(
            "stream path {path:?} maps to channel {out:?}, which is refused: {e}"
        ))
    })?;
    Ok(out)
}

/// The stream path of a channel: the inverse of [`channel_of`].
#[cfg_attr(not(test), allow(dead_code))] // the tests hold the mapping reversible with it
pub fn path_of(channel: &str) -> String {
    channel.replace(SEPARATOR, "/")
}

/// `s` with its `%XX` escapes decoded; `None` for a malformed escape or a
/// result that is not UTF-8.
pub(crate) fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A position in a stream, as an offset names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offset {
    /// `-1` (or no offset): the stream's start.
    Start,
    /// `now`: the tail at the time of the request.
    Now,
    /// After `seq` of journal incarnation `epoch`.
    At {
        /// The journal epoch the offset was minted in.
        epoch: Epoch,
        /// The last seq the reader has.
        seq: u64,
    },
}

/// How far apart the numbers of two consecutive positions are: the offset
/// after `seq` carries `seq * STEP`, and every number from it up to the
/// next position's names the same position (the earlier boundary), as a
/// byte position inside a message does on the protocol's reference server.
/// A client that steps an offset's number by less than `STEP` (the Yjs
/// server of `@durable-streams/y-durable-streams` adds 1) reads the same
/// messages (docs/durable-streams.md, "Offsets and cursors").
pub const STEP: u64 = 1000;

/// Digits of an offset's number: `seq * STEP` for every seq below 10^16.
const DIGITS: usize = 19;

/// Digits of the number in the offsets this server minted before [`STEP`]
/// (f3611da and earlier releases): the seq itself. They keep their meaning.
const EXACT_DIGITS: usize = 20;

/// The offset after `seq` in `epoch`: `EEEEEEEEEEEEEEEE_NNNNNNNNNNNNNNNNNNN`,
/// the epoch in 16 lowercase hex digits and `seq * STEP` in 19 decimal
/// digits, so offsets of one epoch sort as their seqs do (byte-wise, also
/// after the 20-digit offsets of earlier releases) and never equal the
/// reserved `-1` or `now`. A seq of 10^16 or more (unreachable in practice:
/// 317 years at a million events a second) takes the 20-digit exact form.
pub fn offset(epoch: Epoch, seq: u64) -> String {
    match seq
        .checked_mul(STEP)
        .filter(|n| *n < 10u64.pow(DIGITS as u32))
    {
        Some(n) => format!("{epoch}_{n:0DIGITS$}"),
        None => format!("{epoch}_{seq:0EXACT_DIGITS$}"),
    }
}

/// The zero offset, `0000000000000000_0000000000000000`: the form of the
/// protocol's reference server for "before the first byte", which clients
/// and the conformance suite construct (e.g. as a `Stream-Fork-Offset`).
/// This server never mints it (its epochs are never 0 and its numbers have
/// 19 or 20 digits) and reads it as `-1`, the stream's start.
pub const ZERO: &str = "0000000000000000_0000000000000000";

/// Reads an offset query parameter (`None`: absent, the start; `-1` and
/// [`ZERO`]: the start). The number of a 19-digit offset names the
/// position after seq `number / STEP` (rounded down); a 20-digit one, of
/// earlier releases, the position after seq `number`.
///
/// # Errors
/// A message naming the expected shape.
pub fn parse_offset(s: Option<&str>) -> Result<Offset, String> {
    let Some(s) = s else {
        return Ok(Offset::Start);
    };
    match s {
        "-1" | ZERO => return Ok(Offset::Start),
        "now" => return Ok(Offset::Now),
        _ => {}
    }
    let bad = || {
        format!(
            "offset {s:?} is not an offset of this server: give -1, now, or a Stream-Next-Offset \
             it returned (16 hex digits, `_`, 19 digits)"
        )
    };
    let (e, q) = s.split_once('_').ok_or_else(bad)?;
    if e.len() != 16
        || !(q.len() == DIGITS || q.len() == EXACT_DIGITS)
        || !e
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        || !q.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let epoch = u64::from_str_radix(e, 16).map_err(|_| bad())?;
    let n = q.parse::<u64>().map_err(|_| bad())?;
    let seq = if q.len() == DIGITS { n / STEP } else { n };
    Ok(Offset::At {
        epoch: Epoch(epoch),
        seq,
    })
}

/// The protocol's cursor epoch, 2024-10-09T00:00:00Z, in Unix seconds.
const CURSOR_EPOCH_S: u64 = 1_728_432_000;
/// The cursor interval, in seconds.
const CURSOR_INTERVAL_S: u64 = 20;

/// The `Stream-Cursor` of a live answer (PROTOCOL.md section 10.1): the
/// number of 20-second intervals since 2024-10-09; when the client's
/// `cursor` is not behind it, the client's plus 1 to 180 intervals (1 to
/// 3600 s of jitter), so cursors never go back.
pub fn live_cursor(now_ms: u64, client: Option<&str>) -> String {
    next_cursor(now_ms, client.and_then(|c| c.parse::<u64>().ok())).to_string()
}

/// [`live_cursor`] as a number, after the client's cursor `client` (one
/// that is not a number counts as none).
pub fn next_cursor(now_ms: u64, client: Option<u64>) -> u64 {
    let now = (now_ms / 1000).saturating_sub(CURSOR_EPOCH_S) / CURSOR_INTERVAL_S;
    match client {
        Some(c) if c >= now => c.saturating_add(rand::random_range(1..=3600 / CURSOR_INTERVAL_S)),
        _ => now,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_reversibly_or_are_refused() {
        assert_eq!(channel_of("v1/stream/a-1").as_deref(), Ok("v1~stream~a-1"));
        assert_eq!(path_of("v1~stream~a-1"), "v1/stream/a-1");
        assert_eq!(channel_of("a%3Ab").as_deref(), Ok("a:b"));
        for bad in [
            "",
            "a//b",
            "a/",
            "/a",
            "a~b",
            "a%2Fb",
            "a b",
            "a%20b",
            "%ff",
            "a/../b",
            "a/.",
            "./a",
            "a/%2e%2e/b",
            "a/%2E/b",
            "%5F_ds/x",
            "a/%5f%5fds",
        ] {
            assert!(channel_of(bad).is_err(), "{bad:?} is refused");
        }
        assert!(channel_of(&"x".repeat(201)).is_err());
    }

    #[test]
    fn offsets_sort_as_seqs_and_round_trip() {
        let e = Epoch(0xab);
        let a = offset(e, 9);
        let b = offset(e, 10);
        assert!(a < b);
        assert_eq!(b, "00000000000000ab_0000000000000010000");
        assert_eq!(parse_offset(Some(&b)), Ok(Offset::At { epoch: e, seq: 10 }));
        assert_eq!(parse_offset(Some("-1")), Ok(Offset::Start));
        assert_eq!(parse_offset(None), Ok(Offset::Start));
        assert_eq!(parse_offset(Some("now")), Ok(Offset::Now));
        assert_eq!(parse_offset(Some(ZERO)), Ok(Offset::Start));
        for bad in [
            "",
            "x",
            "1_2",
            "00000000000000ab_1",
            "00000000000000AB_0000000000000001000",
            "00000000000000ab_000000000000000001000",
        ] {
            assert!(parse_offset(Some(bad)).is_err(), "{bad:?}");
        }
    }

    /// What the Yjs server does (its `incrementOffset`: the number plus 1,
    /// padded to the same width) reads from the same position.
    #[test]
    fn a_stepped_offset_reads_from_the_earlier_boundary() {
        let e = Epoch(0x9a64d58d9c04a016);
        for seq in [0, 1, 7, 41, 999, 1000, 123_456_789] {
            let o = offset(e, seq);
            let (head, n) = o.split_once('_').expect("EPOCH_N");
            for step in [1, 2, STEP - 1] {
                let n = n.parse::<u64>().expect("digits") + step;
                let stepped = format!("{head}_{n:0width$}", width = DIGITS);
                assert_eq!(
                    parse_offset(Some(&stepped)),
                    Ok(Offset::At { epoch: e, seq })
                );
                assert!(
                    stepped < offset(e, seq + 1),
                    "{stepped} sorts before the next"
                );
            }
        }
    }

    /// Offsets minted before [`STEP`] keep their meaning and sort before
    /// the offsets of the same and later positions minted now.
    #[test]
    fn offsets_of_earlier_releases_keep_their_meaning() {
        let e = Epoch(0x9a64d58d9c04a016);
        let old = "9a64d58d9c04a016_00000000000000000002";
        assert_eq!(parse_offset(Some(old)), Ok(Offset::At { epoch: e, seq: 2 }));
        for seq in [2, 3, 10, 1_000_000] {
            assert!(old < offset(e, seq).as_str());
        }
        let huge = 10u64.pow(16);
        assert_eq!(offset(e, huge), format!("{e}_{huge:020}"));
        assert_eq!(
            parse_offset(Some(&offset(e, huge))),
            Ok(Offset::At {
                epoch: e,
                seq: huge
            })
        );
    }

    #[test]
    fn cursors_never_go_back() {
        let now = (CURSOR_EPOCH_S + 20 * 1000) * 1000;
        assert_eq!(live_cursor(now, None), "1000");
        assert_eq!(live_cursor(now, Some("5")), "1000");
        let c: u64 = live_cursor(now, Some("1000")).parse().expect("number");
        assert!(c > 1000 && c <= 1180);
    }
}
