//! WebSocket client messages (`/v1/ws`): the parser never panics on any
//! text; what it accepts is a JSON object whose `op` is one of the three, and
//! a request id it echoes is a string or a number.
#![no_main]

use gapless_server::transport::ws::messages::{parse, ClientMessage};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse(text) {
        Ok(m) => {
            let v: serde_json::Value = serde_json::from_str(text).expect("accepted = JSON");
            let op = v["op"].as_str().expect("an op");
            let id = match &m {
                ClientMessage::Subscribe { id, .. } => (op == "subscribe", id),
                ClientMessage::Unsubscribe { id, .. } => (op == "unsubscribe", id),
                ClientMessage::Publish { id, .. } => (op == "publish", id),
            };
            assert!(id.0, "op {op} parsed as {m:?}");
            if let Some(id) = id.1 {
                assert!(id.is_string() || id.is_number(), "{id}");
            }
        }
        Err((Some(id), _)) => assert!(id.is_string() || id.is_number(), "{id}"),
        Err((None, _)) => {}
    }
});
