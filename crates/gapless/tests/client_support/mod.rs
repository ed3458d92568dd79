//! Shared helpers of the `client_*` tests: a real `gapless serve` process that
//! can be killed (SIGKILL), stopped cleanly (SIGTERM) and restarted on the same
//! port with the same data, plus small async helpers.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running server process.
pub struct Server {
    child: Option<Child>,
    /// The bound port (kept across restarts).
    pub port: u16,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    args: Vec<String>,
    _dir: Option<tempfile::TempDir>,
}

/// The `gapless` binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gapless"))
}

fn spawn(listen: &str, args: &[String]) -> Result<(Child, u16), String> {
    let mut child = Command::new(bin())
        .arg("serve")
        .arg("--listen")
        .arg(listen)
        .args(args)
        .env("GAPLESS_LOG_LEVEL", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(l) => l,
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the server printed nothing".into());
        }
    };
    let port = line
        .split("http://127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse::<u16>().ok());
    match port {
        Some(p) => Ok((child, p)),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            Err(format!("unexpected first line: {line:?}"))
        }
    }
}

impl Server {
    /// An in-memory server with `extra` flags.
    pub fn memory(extra: &[&str]) -> Server {
        let mut args = vec!["--memory".to_owned()];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        Self::start(args, None)
    }

    /// A server with a durable journal in a temporary directory (kept across
    /// restarts, so the epoch and every acknowledged event survive).
    pub fn durable(extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut args = vec![
            "--data-dir".to_owned(),
            dir.path().join("data").display().to_string(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        Self::start(args, Some(dir))
    }

    fn start(mut args: Vec<String>, dir: Option<tempfile::TempDir>) -> Server {
        // Fast reconnects and liveness in tests.
        for (flag, value) in [("--retry-ms", "50"), ("--heartbeat-ms", "200")] {
            if !args.iter().any(|a| a == flag) {
                args.push(flag.to_owned());
                args.push(value.to_owned());
            }
        }
        let (child, port) = spawn("127.0.0.1:0", &args).expect("server starts");
        Server {
            child: Some(child),
            port,
            url: format!("http://127.0.0.1:{port}"),
            args,
            _dir: dir,
        }
    }

    /// Kills the process with SIGKILL: connections are reset, nothing is flushed.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the process with SIGTERM: streams end cleanly, then it exits.
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the process again on the same port with the same flags.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop the server first");
        let listen = format!("127.0.0.1:{}", self.port);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match spawn(&listen, &self.args) {
                Ok((child, _)) => {
                    self.child = Some(child);
                    return;
                }
                Err(e) if Instant::now() < deadline => {
                    eprintln!("restart: {e}; retrying");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("the server does not restart on port {}: {e}", self.port),
            }
        }
    }

    /// A client of this server.
    pub fn client(&self) -> gapless_client::Client {
        gapless_client::Client::new(&self.url).expect("valid URL")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
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

/// Waits until `check` holds, polling every 20 ms, for at most `secs` seconds.
pub async fn eventually<F, Fut>(secs: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
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
        let mut child = Command::new(bin())
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
