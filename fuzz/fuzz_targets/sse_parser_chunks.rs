//! The SDK's SSE parser on arbitrary bytes cut into arbitrary chunks: never
//! panics, and the items it yields do not depend on where the chunks are cut
//! (the same as parsing the whole stream at once).
#![no_main]

use arbitrary::Arbitrary;
use gapless_client::sse::{parse_all, Parser};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    stream: Vec<u8>,
    cuts: Vec<u16>,
    limit: u16,
}

fuzz_target!(|input: Input| {
    let limit = usize::from(input.limit).max(1);
    let whole = parse_all(&input.stream, limit);
    let mut p = Parser::with_max_event_bytes(limit);
    let mut items = Vec::new();
    let mut rest = &input.stream[..];
    let mut failed = None;
    for &c in input.cuts.iter().chain(std::iter::once(&u16::MAX)) {
        let (a, b) = if c == u16::MAX {
            (rest, &[][..])
        } else {
            rest.split_at(usize::from(c) % (rest.len() + 1))
        };
        if let Err(e) = p.feed(a, |i| items.push(i.to_owned_item())) {
            failed = Some(e);
            break;
        }
        rest = b;
        if rest.is_empty() {
            break;
        }
    }
    match (whole, failed) {
        (Ok(all), None) => {
            p.finish();
            assert_eq!(all, items, "chunking changes nothing");
        }
        (Err(a), Some(b)) => assert_eq!(a, b),
        // The limit counts a block's bytes: the same stream fails the same way.
        (w, f) => panic!("whole: {w:?}, chunked failure: {f:?}"),
    }
});
