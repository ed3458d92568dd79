//! Helpers of the tests of the Rust SDK and the CLI (the `client_*` files):
//! servers with fast reconnects and liveness, a publish that retries across
//! a restart, an exactly-once assertion, and a `gapless tail` process.

use crate::{Opts, Server};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Flags the SDK and CLI tests add unless they set them: fast reconnects
/// (`--retry-ms 50`) and liveness (`--heartbeat-ms 200`).
pub const FAST_TIMERS: &[(&str, &str)] = &[("--retry-ms", "50"), ("--heartbeat-ms", "200")];

fn with_fast_timers(extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
    for (flag, value) in FAST_TIMERS {
        if !args.iter().any(|a| a == flag) {
            args.push((*flag).to_owned());
            args.push((*value).to_owned());
        }
    }
    args
}

/// A `--memory` server with `extra` flags and [`FAST_TIMERS`].
pub async fn memory(extra: &[&str]) -> Server {
    Server::with(Opts {
        args: with_fast_timers(extra),
        memory: true,
        ..Opts::default()
    })
    .await
}

/// A server with a durable journal in its temporary directory (kept across
/// restarts, so the epoch and every acknowledged event survive), with
/// `extra` flags and [`FAST_TIMERS`].
pub async fn durable(extra: &[&str]) -> Server {
    Server::with(Opts {
        args: with_fast_timers(extra),
        ..Opts::default()
    })
    .await
}

/// Publishes `data` with an idempotency key derived from it, retrying until
/// the server acknowledges it (so a publish cut by a restart lands once).
pub async fn publish_surely(client: &gapless_client::Client, channel: &str, data: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client
            .publish(channel, data)
            .idempotency_key(format!("k-{data}"))
            .send()
            .await
        {
            Ok(p) => return p.seq,
            Err(e) if !e.is_terminal() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("publish {data}: {e}"),
        }
    }
}

/// Asserts that `seqs` is exactly `1..=n`, in order.
pub fn assert_exactly_once(seqs: &[u64], n: u64) {
    let want: Vec<u64> = (1..=n).collect();
    if seqs != want.as_slice() {
        let mut dups = Vec::new();
        for w in seqs.windows(2) {
            if w[1] <= w[0] {
                dups.push((w[0], w[1]));
            }
        }
        panic!(
            "expected seqs 1..={n} once each, in order; got {} seqs, first disorder {:?}: {seqs:?}",
            seqs.len(),
            dups.first()
        );
    }
}

/// A `gapless tail` process whose stdout lines are collected.
#[derive(Debug)]
pub struct Tail {
    child: Child,
    /// Lines printed on stdout.
    pub lines: Arc<Mutex<Vec<String>>>,
    /// Lines printed on stderr.
    pub stderr: Arc<Mutex<Vec<String>>>,
}

impl Tail {
    /// Starts `gapless tail ARGS`.
    pub fn start(args: &[&str]) -> Tail {
        let mut child = Command::new(crate::bin())
            .arg("tail")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tail starts");
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let stderr: Arc<Mutex<Vec<String>>> = Arc::default();
        for (pipe, sink) in [
            (
                child
                    .stdout
                    .take()
                    .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
                lines.clone(),
            ),
            (
                child
                    .stderr
                    .take()
                    .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
                stderr.clone(),
            ),
        ] {
            let pipe = pipe.expect("piped");
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    match line {
                        Ok(l) => sink.lock().expect("lock").push(l),
                        Err(_) => break,
                    }
                }
            });
        }
        Tail {
            child,
            lines,
            stderr,
        }
    }

    /// How many stdout lines so far.
    pub fn count(&self) -> usize {
        self.lines.lock().expect("lock").len()
    }

    /// Waits until `n` stdout lines were printed.
    pub async fn wait_for(&self, n: usize, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while self.count() < n {
            assert!(
                Instant::now() < deadline,
                "tail printed {} of {n} lines; stderr: {:?}",
                self.count(),
                self.stderr.lock().expect("lock")
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Tail {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
