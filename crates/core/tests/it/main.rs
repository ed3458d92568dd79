//! The core's tests: the hub and sessions over the in-memory journal.
//!
//! One test binary for the crate (as ripgrep's `tests/tests.rs`): the modules link once, and
//! libtest runs their tests in parallel, `--test-threads` at a time. Run one area with
//! `cargo test -p gapless-core --test it <module>::`.

mod hub;
mod session;
