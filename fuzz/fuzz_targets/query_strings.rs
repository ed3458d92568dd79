//! History and subscribe query strings: `?after=&limit=` of a history page
//! and `?since=&last_event_id=` (with a `Last-Event-ID` header) of an SSE
//! subscription never panic; an accepted `limit` is within 1..=1000, and a
//! subscription gets one start per channel.
#![no_main]

use arbitrary::Arbitrary;
use axum::http::{HeaderMap, HeaderValue};
use gapless_server::transport::query::Query;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Input {
    query: String,
    header: Option<Vec<u8>>,
    channels: Vec<String>,
}

fuzz_target!(|input: Input| {
    let q = Query::parse(Some(&input.query));
    let channel = input.channels.first().map_or("c", String::as_str);
    if let Ok((limit, _after)) =
        gapless_server::ops::history::page_params(channel, q.get("limit"), q.get("after"))
    {
        assert!((1..=gapless_server::ops::history::MAX_LIMIT).contains(&limit));
    }
    let mut headers = HeaderMap::new();
    if let Some(h) = input
        .header
        .as_deref()
        .and_then(|h| HeaderValue::from_bytes(h).ok())
    {
        headers.insert("last-event-id", h);
    }
    let channels: Vec<String> = input.channels.into_iter().take(8).collect();
    if let Ok(starts) = gapless_server::transport::sse::starts(&channels, &q, &headers) {
        assert_eq!(starts.len(), channels.len());
    }
});
