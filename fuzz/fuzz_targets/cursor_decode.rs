//! Cursor decoding never panics, any cursor that decodes re-encodes to
//! exactly the string it was decoded from (one position, one wire form), and
//! names each channel at most once.
//! Two inputs per run: the raw bytes as a cursor string (finds base64 and
//! length faults), and the bytes as a cursor body with a valid check and
//! base64 (so the fuzzer reaches the positions and seq varints past the CRC).
#![no_main]

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use gapless_protocol::Cursor;
use libfuzzer_sys::fuzz_target;

fn check(s: &[u8]) {
    if let Ok(c) = Cursor::decode(s) {
        let again = c.encode();
        assert_eq!(
            again.as_bytes(),
            s,
            "a decoded cursor re-encodes to itself: {c:?}"
        );
        assert_eq!(Cursor::decode(again.as_bytes()).as_ref(), Ok(&c));
        let keys = c.positions().iter().map(|p| p.key.0);
        let distinct: std::collections::HashSet<u64> = keys.clone().collect();
        assert_eq!(
            distinct.len(),
            keys.count(),
            "one position per channel: {c:?}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut body = vec![gapless_protocol::cursor::VERSION];
    body.extend_from_slice(data);
    let crc = crc32fast::hash(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    check(URL_SAFE_NO_PAD.encode(&body).as_bytes());
});
