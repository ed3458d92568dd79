//! The first-request-head reader of the fan-out path (`net/conn.rs`): never
//! panics; a head it serves as SSE is a `GET` of an SSE URL; and bytes after
//! a whole head (a pipelined body or request) do not change the answer.
#![no_main]

use gapless_server::net::conn::{parse_first_head, FirstHead};
use gapless_server::transport::sse::is_sse_path;
use libfuzzer_sys::fuzz_target;

/// The default `--max-header-bytes`.
const MAX: usize = 16 * 1024;

/// The SSE transport's URLs (the predicate sees the whole target).
fn sse_target(target: &str) -> bool {
    is_sse_path(target.split('?').next().unwrap_or(target))
}

fuzz_target!(|data: &[u8]| {
    let first = parse_first_head(data, MAX, &sse_target);
    if let FirstHead::Sse(target) = &first {
        let path = target.split('?').next().unwrap_or(target);
        assert!(
            path == "/v1/sse" || (path.starts_with("/v1/channels/") && path.ends_with("/sse")),
            "{target}"
        );
        let mut more = data.to_vec();
        more.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(parse_first_head(&more, MAX, &sse_target), first);
    }
});
