//! The embedded store's tests: its contract, crash recovery, WAL damage, checkpoints and chunks.
//!
//! One test binary for the crate (as ripgrep's `tests/tests.rs`): the modules link once, and
//! libtest runs their tests in parallel, `--test-threads` at a time. Run one area with
//! `cargo test -p gapless-store --test it <module>::`.

mod channel_meta;
mod chunks;
mod common;
mod contract;
mod crash;
mod damaged_wal;
mod log;
mod reopen;
mod throughput;
