//! The SSE parser against the WHATWG event-stream rules, one table row per
//! rule, plus properties: any chunking of a stream yields the same items.

use gapless_client::sse::{parse_all, Event, OwnedItem, Parser, DEFAULT_MAX_EVENT_BYTES};
use proptest::prelude::*;

fn ev(event_type: &str, data: &str, id: &str) -> OwnedItem {
    OwnedItem::Event(Event {
        event_type: event_type.to_owned(),
        data: data.to_owned(),
        last_event_id: id.to_owned(),
    })
}

fn msg(data: &str) -> OwnedItem {
    ev("message", data, "")
}

fn id(s: &str) -> OwnedItem {
    OwnedItem::LastEventId(s.to_owned())
}

/// Feeds `chunks` one by one, then ends the stream; returns the items and the
/// final last event ID.
fn run(chunks: &[&[u8]]) -> (Vec<OwnedItem>, String) {
    let mut p = Parser::new();
    let mut out = Vec::new();
    for c in chunks {
        p.feed(c, |item| out.push(item.to_owned_item()))
            .expect("within the size limit");
    }
    p.finish();
    (out, p.last_event_id().to_owned())
}

#[test]
fn table_of_rules() {
    let table: Vec<(&str, &[u8], Vec<OwnedItem>)> = vec![
        ("LF line ends", b"data: a\n\n", vec![msg("a")]),
        ("CR line ends", b"data: a\r\r", vec![msg("a")]),
        ("CRLF line ends", b"data: a\r\n\r\n", vec![msg("a")]),
        (
            "mixed line ends in one event",
            b"data: a\rdata: b\ndata: c\r\n\n",
            vec![msg("a\nb\nc")],
        ),
        (
            "leading BOM stripped",
            b"\xEF\xBB\xBFdata: a\n\n",
            vec![msg("a")],
        ),
        (
            "only one BOM stripped: the second is part of the field name",
            b"\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\ndata: b\n\n",
            vec![msg("b")],
        ),
        ("comment line: no dispatch", b": hello\n\n", vec![]),
        ("comment-only heartbeat", b":\n\n", vec![]),
        (
            "comment between data lines",
            b"data: a\n: note\ndata: b\n\n",
            vec![msg("a\nb")],
        ),
        (
            "data lines joined with LF",
            b"data: a\ndata:\ndata: b\n\n",
            vec![msg("a\n\nb")],
        ),
        (
            "field name with no colon: empty data fires",
            b"data\n\n",
            vec![msg("")],
        ),
        ("two empty data lines", b"data\ndata\n\n", vec![msg("\n")]),
        (
            "one optional space removed",
            b"data:  a\n\n",
            vec![msg(" a")],
        ),
        ("no space after the colon", b"data:a\n\n", vec![msg("a")]),
        (
            "colon inside the value",
            b"data: a: b\n\n",
            vec![msg("a: b")],
        ),
        (
            "space before the colon belongs to the name",
            b"data : x\n\n",
            vec![],
        ),
        ("leading space: not a field", b" data: x\n\n", vec![]),
        ("field names are case-sensitive", b"Data: x\n\n", vec![]),
        (
            "unknown field ignored",
            b"foo: bar\ndata: x\n\n",
            vec![msg("x")],
        ),
        (
            "event type",
            b"event: add\ndata: x\n\n",
            vec![ev("add", "x", "")],
        ),
        (
            "empty event type is message",
            b"event\ndata: x\n\n",
            vec![msg("x")],
        ),
        (
            "event type resets after dispatch",
            b"event: a\ndata: 1\n\ndata: 2\n\n",
            vec![ev("a", "1", ""), msg("2")],
        ),
        (
            "event type without data fires nothing",
            b"event: a\n\ndata: 2\n\n",
            vec![msg("2")],
        ),
        (
            "id sets the last event ID",
            b"id: 7\ndata: x\n\n",
            vec![ev("message", "x", "7")],
        ),
        (
            "the last event ID persists across events",
            b"id: 7\ndata: x\n\ndata: y\n\n",
            vec![ev("message", "x", "7"), ev("message", "y", "7")],
        ),
        (
            "id containing NUL is ignored",
            b"id: 1\n\nid: a\x00b\ndata: x\n\n",
            vec![id("1"), ev("message", "x", "1")],
        ),
        (
            "id-only frame sets the last event ID, fires nothing",
            b"id: c1\n\n",
            vec![id("c1")],
        ),
        (
            "an unchanged id-only frame reports nothing",
            b"id: c1\n\nid: c1\n\n",
            vec![id("c1")],
        ),
        (
            "an empty id clears it",
            b"id: 1\n\nid\n\n",
            vec![id("1"), id("")],
        ),
        (
            "retry with digits",
            b"retry: 250\n\n",
            vec![OwnedItem::Retry(250)],
        ),
        (
            "retry applies without a blank line",
            b"retry: 9\n",
            vec![OwnedItem::Retry(9)],
        ),
        (
            "retry other than digits is ignored",
            b"retry: 25x\nretry: -1\nretry:  5\nretry:\nretry: 1.5\n\n",
            vec![],
        ),
        (
            "unterminated event at EOF is dropped",
            b"id: 9\ndata: x",
            vec![],
        ),
        (
            "unterminated event after a complete one",
            b"data: a\n\nid: 9\ndata: b\n",
            vec![msg("a")],
        ),
        (
            "invalid UTF-8 becomes U+FFFD",
            b"data: a\xFFb\n\n",
            vec![msg("a\u{FFFD}b")],
        ),
        ("blank lines alone fire nothing", b"\n\r\n\r\n", vec![]),
        (
            "gapless preamble: retry, gap, id frame, event",
            b"retry: 1000\n\nevent: gap\ndata: {}\n\nid: C0\n\nid: C1\ndata: {\"seq\":1}\n\n",
            vec![
                OwnedItem::Retry(1000),
                ev("gap", "{}", ""),
                id("C0"),
                ev("message", "{\"seq\":1}", "C1"),
            ],
        ),
    ];
    for (name, input, want) in table {
        let (got, _) = run(&[input]);
        assert_eq!(got, want, "rule: {name}");
        // The same rule holds when the stream arrives one byte at a time.
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        let (got, _) = run(&bytes);
        assert_eq!(got, want, "rule, byte by byte: {name}");
    }
}

#[test]
fn unterminated_event_id_does_not_become_the_last_event_id() {
    let (items, last) = run(&[b"id: 1\n\nid: 2\ndata: x"]);
    assert_eq!(items, vec![id("1")]);
    assert_eq!(last, "1");
}

#[test]
fn crlf_split_across_reads_is_one_line_end() {
    // If the LF after a chunk-ending CR counted as a line end of its own it
    // would be a blank line and dispatch "a" alone.
    let (items, _) = run(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]);
    assert_eq!(items, vec![msg("a\nb")]);
    // A CR at the very end of a chunk followed by another CR: two line ends.
    let (items, _) = run(&[b"data: a\r", b"\rdata: b\n\n"]);
    assert_eq!(items, vec![msg("a"), msg("b")]);
    // An empty chunk between the CR and the LF changes nothing.
    let (items, _) = run(&[b"data: a\r", b"", b"\n\n"]);
    assert_eq!(items, vec![msg("a")]);
}

#[test]
fn bom_split_across_reads() {
    let (items, _) = run(&[b"\xEF", b"\xBB", b"\xBFdata: a\n\n"]);
    assert_eq!(items, vec![msg("a")]);
    // A partial BOM is content: here an unknown field, then a real one.
    let (items, _) = run(&[b"\xEF\xBB", b"\n", b"data: a\n\n"]);
    assert_eq!(items, vec![msg("a")]);
    // BOM, then nothing else yet.
    let (items, _) = run(&[b"\xEF\xBB\xBF"]);
    assert_eq!(items, vec![]);
}

#[test]
fn utf8_split_across_reads() {
    let text = "data: é€😀 ok\n\n".as_bytes();
    for cut in 0..text.len() {
        let (a, b) = text.split_at(cut);
        let (items, _) = run(&[a, b]);
        assert_eq!(items, vec![msg("é€😀 ok")], "cut at {cut}");
    }
}

#[test]
fn max_event_size_fails_explicitly() {
    let mut p = Parser::with_max_event_bytes(16);
    let mut out = Vec::new();
    // Events within the limit pass (the limit counts a block's lines, line ends excluded).
    p.feed(b"data: 0123456789\n\n", |i| out.push(i.to_owned_item()))
        .expect("16 bytes fit");
    assert_eq!(out, vec![msg("0123456789")]);
    // A block over the limit fails, even before its line is complete.
    let err = p
        .feed(b"data: 0123456789AB", |i| out.push(i.to_owned_item()))
        .expect_err("17 bytes do not fit");
    assert_eq!(err.limit, 16);
    assert!(err.to_string().contains("16 bytes"), "{err}");
    // The failure is sticky until reset.
    assert!(p.feed(b"\n\n", |_| {}).is_err());
    p.reset();
    p.feed(b"data: ok\n\n", |i| out.push(i.to_owned_item()))
        .expect("reset clears the failure");
    assert_eq!(out.last(), Some(&msg("ok")));
    // Several lines add up.
    let err = parse_all(b"data: 0123456\ndata: 0123456\n\n", 20).expect_err("two lines");
    assert_eq!(err.limit, 20);
    // Items before the offending block are delivered.
    let mut p = Parser::with_max_event_bytes(8);
    let mut seen = Vec::new();
    let r = p.feed(b"data: a\n\ndata: 0123456789\n\n", |i| {
        seen.push(i.to_owned_item())
    });
    assert!(r.is_err());
    assert_eq!(seen, vec![msg("a")]);
    assert_eq!(Parser::new().max_event_bytes(), DEFAULT_MAX_EVENT_BYTES);
}

#[test]
fn retry_is_kept_and_huge_values_saturate() {
    let mut p = Parser::new();
    p.feed(b"retry: 99999999999999999999999\n", |_| {})
        .expect("small");
    assert_eq!(p.retry(), Some(u64::MAX));
    p.feed(b"retry: 1500\n\n", |_| {}).expect("small");
    assert_eq!(p.retry(), Some(1500));
}

#[test]
fn reset_starts_a_new_stream() {
    let mut p = Parser::new();
    let mut out = Vec::new();
    p.feed(b"id: 5\ndata: a\n\nid: 6\ndata: cut", |i| {
        out.push(i.to_owned_item())
    })
    .expect("small");
    p.reset();
    // The new stream may start with a BOM again; its last event ID buffer starts empty.
    p.feed(b"\xEF\xBB\xBFdata: b\n\n", |i| out.push(i.to_owned_item()))
        .expect("small");
    assert_eq!(out, vec![ev("message", "a", "5"), msg("b")]);
}

/// One line of an SSE-like stream, from the pieces the rules care about.
fn line() -> impl Strategy<Value = Vec<u8>> {
    let name = prop_oneof![
        Just("data".to_owned()),
        Just("id".to_owned()),
        Just("event".to_owned()),
        Just("retry".to_owned()),
        Just("".to_owned()),
        Just("x".to_owned()),
    ];
    let value = prop_oneof![
        "[a-z0-9 :]{0,8}",
        "[0-9]{1,4}",
        "\\PC{0,6}",
        Just("a\u{0}b".to_owned()),
        Just("é😀".to_owned()),
    ];
    let sep = prop_oneof![Just(": "), Just(":"), Just(""), Just(":  ")];
    (name, sep, value).prop_map(|(n, s, v)| {
        if n.is_empty() && s.is_empty() {
            Vec::new()
        } else {
            format!("{n}{s}{v}").into_bytes()
        }
    })
}

fn stream() -> impl Strategy<Value = Vec<u8>> {
    let end = prop_oneof![Just(&b"\n"[..]), Just(&b"\r"[..]), Just(&b"\r\n"[..])];
    (
        any::<bool>(),
        prop::collection::vec((line(), end), 0..40),
        prop::collection::vec(any::<u8>(), 0..4),
    )
        .prop_map(|(bom, lines, tail)| {
            let mut out = Vec::new();
            if bom {
                out.extend_from_slice(b"\xEF\xBB\xBF");
            }
            for (l, e) in lines {
                out.extend_from_slice(&l);
                out.extend_from_slice(e);
            }
            out.extend_from_slice(&tail);
            out
        })
}

fn chunked(bytes: &[u8], cuts: &[usize]) -> (Vec<OwnedItem>, String, Option<u64>) {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    cuts.sort_unstable();
    let mut p = Parser::new();
    let mut out = Vec::new();
    let mut at = 0;
    for c in cuts.into_iter().chain([bytes.len()]) {
        p.feed(&bytes[at..c], |i| out.push(i.to_owned_item()))
            .expect("small");
        at = c;
    }
    p.finish();
    (out, p.last_event_id().to_owned(), p.retry())
}

proptest! {
    #[test]
    fn any_chunking_of_an_sse_stream_yields_the_same_items(
        bytes in stream(),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        prop_assert_eq!(chunked(&bytes, &cuts), chunked(&bytes, &[]));
    }

    #[test]
    fn any_chunking_of_arbitrary_bytes_yields_the_same_items(
        bytes in prop::collection::vec(any::<u8>(), 0..300),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        prop_assert_eq!(chunked(&bytes, &cuts), chunked(&bytes, &[]));
    }

    #[test]
    fn byte_by_byte_equals_whole(bytes in stream()) {
        let cuts: Vec<usize> = (0..bytes.len()).collect();
        prop_assert_eq!(chunked(&bytes, &cuts), chunked(&bytes, &[]));
    }
}
