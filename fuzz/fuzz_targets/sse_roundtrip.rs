//! The SSE encoder with the SDK's parser: for any data and any valid event
//! type, parsing the encoded frame (whole, or cut into arbitrary chunks)
//! gives back one event with that type (`message` when none), the frame's
//! cursor as its id, and the data: exactly, in the envelope format; with CR
//! and CRLF read as LF in the plain format (documented in docs/api.md: SSE
//! cannot carry a CR in data).
#![no_main]

use arbitrary::Arbitrary;
use gapless_client::sse::{OwnedItem, Parser};
use gapless_protocol::event::{Epoch, Event};
use gapless_protocol::sse::Format;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    data: String,
    event_type: Option<String>,
    seq: u64,
    cuts: Vec<u16>,
    envelope: bool,
}

fn parse(frame: &[u8], cuts: &[u16]) -> Vec<OwnedItem> {
    let mut p = Parser::new();
    let mut out = Vec::new();
    let mut rest = frame;
    for &c in cuts {
        if rest.is_empty() {
            break;
        }
        let (a, b) = rest.split_at(usize::from(c) % (rest.len() + 1));
        p.feed(a, |i| out.push(i.to_owned_item()))
            .expect("within the limit");
        rest = b;
    }
    p.feed(rest, |i| out.push(i.to_owned_item()))
        .expect("within the limit");
    p.finish();
    out
}

fuzz_target!(|input: Input| {
    let t = input
        .event_type
        .filter(|t| gapless_protocol::name::validate_type(t).is_ok());
    let format = if input.envelope {
        Format::Envelope
    } else {
        Format::Plain
    };
    let e = Event::new(
        "c".into(),
        Epoch(7),
        input.seq,
        t.clone(),
        gapless_protocol::Payload::Text(input.data.clone()),
        1,
    );
    let frame = e.sse_frame(format).clone();
    for cuts in [&[][..], &input.cuts[..]] {
        let items = parse(&frame, cuts);
        assert_eq!(items.len(), 1, "one event per frame: {items:?}");
        let OwnedItem::Event(got) = &items[0] else {
            panic!("an event: {items:?}");
        };
        assert_eq!(got.event_type, t.as_deref().unwrap_or("message"));
        assert_eq!(got.last_event_id, e.cursor());
        let data = match format {
            Format::Envelope => {
                let v: serde_json::Value = serde_json::from_str(&got.data).expect("JSON");
                v["data"].as_str().expect("data is a string").to_owned()
            }
            Format::Plain => got.data.clone(),
        };
        let want = match format {
            Format::Envelope => input.data.clone(),
            Format::Plain => input.data.replace("\r\n", "\n").replace('\r', "\n"),
        };
        assert_eq!(data, want);
    }
});
