//! The Redis journal's tests against a real `redis-server`.
//!
//! One test binary for the crate (as ripgrep's `tests/tests.rs`): the modules link once, and
//! libtest runs their tests in parallel, `--test-threads` at a time. Run one area with
//! `cargo test -p gapless-redis --test it <module>::`.

mod journal;
mod meta;
