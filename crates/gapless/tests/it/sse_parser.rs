//! The test suite's own SSE parser, checked against WHATWG examples, so the
//! server tests rest on a parser that is known to follow the spec.

use gapless_testkit::sse::{Event, Item, Parser};

fn parse(chunks: &[&[u8]]) -> (Vec<Item>, Parser) {
    let mut p = Parser::new();
    let mut out = Vec::new();
    for c in chunks {
        p.feed(c);
        out.extend(p.drain());
    }
    (out, p)
}

fn ev(id: Option<&str>, last: &str, event: &str, data: &str) -> Item {
    Item::Event(Event {
        id: id.map(str::to_owned),
        last_event_id: last.to_owned(),
        event: event.to_owned(),
        data: data.to_owned(),
    })
}

#[test]
fn parser_joins_data_lines_and_accepts_every_line_end() {
    let (items, _) = parse(&[b"data: a\r\ndata: b\rdata: c\ndata:d\n\n"]);
    assert_eq!(items, vec![ev(None, "", "message", "a\nb\nc\nd")]);
}

#[test]
fn parser_handles_crlf_split_across_reads() {
    let (items, _) = parse(&[b"data: x\r", b"\n", b"\r", b"\n"]);
    assert_eq!(items, vec![ev(None, "", "message", "x")]);
    // A CR at the end of a read followed by something other than LF.
    let (items, _) = parse(&[b"data: a\r", b"data: b\r", b"\rdata: c\n\n"]);
    assert_eq!(
        items,
        vec![
            ev(None, "", "message", "a\nb"),
            ev(None, "", "message", "c")
        ]
    );
}

#[test]
fn parser_id_without_data_sets_last_event_id_only() {
    let (items, p) = parse(&[b"retry: 1000\n\nid: c1\n\n: hi\ndata: x\n\n"]);
    assert_eq!(
        items,
        vec![
            Item::Retry(1000),
            Item::IdOnly("c1".into()),
            Item::Comment(" hi".into()),
            ev(None, "c1", "message", "x"),
        ]
    );
    assert_eq!(p.last_event_id, "c1");
}

#[test]
fn parser_follows_spec_field_rules() {
    // Unknown fields ignored; "data" without a colon is an empty data line;
    // one leading space stripped, a second kept; event type resets per event;
    // an incomplete block at the end is not dispatched.
    let (items, _) = parse(&[
        b"foo: bar\nevent: t\ndata\ndata:  two\n\ndata: plain\n\nretry: x1\ndata: unfinished",
    ]);
    assert_eq!(
        items,
        vec![
            ev(None, "", "t", "\n two"),
            ev(None, "", "message", "plain")
        ]
    );
}

#[test]
fn parser_ignores_a_leading_bom_and_ids_with_nul() {
    let (items, p) = parse(&[b"\xEF\xBB\xBFid: a\x00b\ndata: y\n\n"]);
    assert_eq!(items, vec![ev(None, "", "message", "y")]);
    assert_eq!(p.last_event_id, "");
}
