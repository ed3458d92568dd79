//! The client crate's tests: its reconnection rules against a scripted fake server and its SSE parser.
//!
//! One test binary for the crate (as ripgrep's `tests/tests.rs`): the modules link once, and
//! libtest runs their tests in parallel, `--test-threads` at a time. Run one area with
//! `cargo test -p gapless-client --test it <module>::`.

mod reconnect;
mod sse;
