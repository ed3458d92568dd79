//! The harness the integration tests share (not published): the real
//! `gapless` binary and `redis-server` as child processes, and clients that
//! speak the wire protocols from outside, over real sockets.
//!
//! - [`Server`]: one `gapless serve` process (durable in its own temporary
//!   data directory, `--memory`, or a cluster node with `--redis`; any
//!   flags and environment through [`Opts`]): its address, HTTP helpers
//!   answering a [`Resp`], SSE helpers, `kill -9`, SIGTERM, restart on the
//!   same port and data, and its log (stderr, one file per run, whose tail
//!   is printed when a test panics).
//! - [`redis::Redis`]: one `redis-server` (or Sentinel) on a free port, with
//!   AOF, restart, signals and `redis-cli`.
//! - [`sse`]: a raw-TCP SSE client with its own parser (WHATWG rules);
//!   [`slow`]: SSE sockets with small receive buffers read at a set pace.
//! - [`ws`]: WebSocket clients (tokio-tungstenite, and a raw one that does
//!   only what the test says) and the session helpers over HTTP.
//! - [`clients`]: what the Rust SDK and CLI tests share (servers with fast
//!   timers, a `gapless tail` process).
//! - [`netns`]: a network namespace where clients can vanish (root and
//!   `iptables`; tests print `SKIP` without them).
//! - cursor helpers ([`seq_of`], [`make_cursor`], …), [`eventually`],
//!   [`copy_dir`], [`pct`].
//!
//! Helpers only one test file uses stay in that file.
//!
//! # Which binary
//!
//! [`bin`] names the `gapless` executable every process here runs, taken
//! from the environment at run time, first found of:
//! 1. `CARGO_BIN_EXE_gapless`: set by `cargo test` (cargo 1.94 and later)
//!    when it runs the `gapless` crate's tests, after building the binary;
//!    the same path `env!("CARGO_BIN_EXE_gapless")` gives at compile time.
//! 2. `GAPLESS_BIN`: set it to run another build, or to run a test
//!    executable by hand (as `scripts/test.sh` does for the non-Rust suites).
//! 3. `gapless` in the directory above the test executable's (cargo puts
//!    test executables in `target/<profile>/deps/` and binaries in
//!    `target/<profile>/`): what older cargo leaves for the `gapless`
//!    crate's tests, which always build the binary first.
//!
//! A crate other than `gapless` that starts the binary must build it first
//! (`cargo build -p gapless`) or set `GAPLESS_BIN`. Tests started by `cargo
//! test -p gapless` always get the binary cargo just built.
//!
//! Every child process is killed when its handle is dropped.

pub mod clients;
pub mod netns;
pub mod redis;
mod server;
pub mod slow;
pub mod sse;
pub mod ws;

pub use server::{
    channel_twice_cursor, copy_dir, epoch_of, eventually, make_cursor, other_version_cursor, pct,
    seq_of, Opts, Resp, Server,
};
pub use sse::{ConnectOptions, Event, Item, Next, Preamble, SseClient};

use std::path::PathBuf;

/// The `stream ended` lines of a server's JSON log (`--log-format json`;
/// one per stream, docs/deploy.md), as their field objects.
pub fn stream_lines(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["message"] == "stream ended")
        .collect()
}

/// The `gapless` executable to run (see the crate doc, "Which binary").
///
/// # Panics
/// When none of the places the crate doc lists names an existing file.
pub fn bin() -> PathBuf {
    for var in ["CARGO_BIN_EXE_gapless", "GAPLESS_BIN"] {
        if let Some(path) = std::env::var_os(var).filter(|p| !p.is_empty()) {
            return PathBuf::from(path);
        }
    }
    let beside = std::env::current_exe().ok().and_then(|exe| {
        let dir = exe.parent()?;
        let dir = if dir.ends_with("deps") {
            dir.parent()?
        } else {
            dir
        };
        Some(dir.join(format!("gapless{}", std::env::consts::EXE_SUFFIX)))
    });
    match beside {
        Some(path) if path.is_file() => path,
        _ => panic!(
            "no gapless binary: run the tests with `cargo test -p gapless`, or build it \
             (`cargo build -p gapless`) and set GAPLESS_BIN to its path"
        ),
    }
}
