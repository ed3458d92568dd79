//! [`Server`]: the real binary (each test its own process, port and data
//! directory), with HTTP helpers over reqwest, SSE helpers over
//! [`crate::sse`], cursor helpers, and small utilities.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use gapless_protocol::{Cursor, Epoch};
use serde_json::Value;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::sse::{Preamble, SseClient};

/// How a server is started.
#[derive(Debug, Clone, Default)]
pub struct Opts {
    /// Extra flags after `serve --listen … --data-dir …`.
    pub args: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// `--memory` instead of `--data-dir`.
    pub memory: bool,
    /// The data directory (default: `data` in the server's temporary directory).
    pub data_dir: Option<PathBuf>,
    /// The `--listen` address (default `127.0.0.1:0`), e.g. `[::]:0` for a
    /// dual-stack socket whose IPv4 peers arrive as `::ffff:a.b.c.d`.
    pub listen: Option<String>,
}

/// A running (or stopped) `gapless serve` process.
#[derive(Debug)]
pub struct Server {
    child: Option<Child>,
    /// The address it listens on (kept across restarts).
    pub addr: SocketAddr,
    dir: TempDir,
    opts: Opts,
    starts: usize,
    /// A reqwest client without proxies.
    pub http: reqwest::Client,
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Resp {
    /// Status code.
    pub status: u16,
    /// Headers.
    pub headers: reqwest::header::HeaderMap,
    /// The body as text.
    pub text: String,
    /// The body as JSON (`Null` when it is not JSON).
    pub json: Value,
}

impl Resp {
    /// A header value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Asserts the status and returns the JSON body.
    #[track_caller]
    pub fn expect(&self, status: u16) -> &Value {
        assert_eq!(
            self.status, status,
            "unexpected status; body: {}",
            self.text
        );
        &self.json
    }

    /// Asserts an error answer: status, JSON `error` code, and a string `message`.
    #[track_caller]
    pub fn expect_error(&self, status: u16, code: &str) -> &Value {
        assert_eq!(
            self.status, status,
            "unexpected status; body: {}",
            self.text
        );
        assert_eq!(self.json["error"], code, "error code; body: {}", self.text);
        assert!(
            self.json["message"].as_str().is_some_and(|m| !m.is_empty()),
            "an error has a message: {}",
            self.text
        );
        assert!(
            self.header("content-type")
                .is_some_and(|c| c.starts_with("application/json")),
            "errors are JSON: {:?}",
            self.headers
        );
        &self.json
    }

    /// The error message.
    pub fn message(&self) -> &str {
        self.json["message"].as_str().unwrap_or_default()
    }
}

/// The bound on servers starting at once across a test binary's tests
/// (libtest runs several tests per core, `scripts/test.sh`): the number of
/// cores, or `GAPLESS_TEST_STARTS`. Only starts are bounded, never a
/// server's life, so a test holding several servers cannot wait on another.
fn starts() -> &'static tokio::sync::Semaphore {
    static STARTS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    STARTS.get_or_init(|| {
        let n = std::env::var("GAPLESS_TEST_STARTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
        tokio::sync::Semaphore::new(n.max(1))
    })
}

impl Server {
    /// A durable server (its own temporary data directory) with extra flags.
    pub async fn start(args: &[&str]) -> Server {
        Self::with(Opts {
            args: args.iter().map(|s| s.to_string()).collect(),
            ..Opts::default()
        })
        .await
    }

    /// A `--memory` server with extra flags.
    pub async fn memory(args: &[&str]) -> Server {
        Self::with(Opts {
            args: args.iter().map(|s| s.to_string()).collect(),
            memory: true,
            ..Opts::default()
        })
        .await
    }

    /// A server started with `opts`.
    pub async fn with(opts: Opts) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut server = Server {
            child: None,
            addr: "127.0.0.1:0".parse().expect("addr"),
            dir,
            opts,
            starts: 0,
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("reqwest client"),
        };
        let listen = server
            .opts
            .listen
            .clone()
            .unwrap_or_else(|| "127.0.0.1:0".to_owned());
        server.addr = server
            .spawn(&listen)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        server
    }

    /// A handle on a server started elsewhere, listening on `addr` (no process to manage).
    pub fn attach(addr: SocketAddr) -> Server {
        Server {
            child: None,
            addr,
            dir: tempfile::tempdir().expect("tempdir"),
            opts: Opts::default(),
            starts: 0,
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("reqwest client"),
        }
    }

    /// The data directory (unused with `--memory`).
    pub fn data_dir(&self) -> PathBuf {
        if let Some(d) = &self.opts.data_dir {
            return d.clone();
        }
        self.dir.path().join("data")
    }

    /// A scratch path inside this server's temporary directory.
    pub fn scratch(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The base URL joined with `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base())
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .and_then(|c| c.id())
            .expect("server is running")
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    async fn spawn(&mut self, listen: &str) -> Result<SocketAddr, String> {
        // Held from the spawn to the listening line: a start is the costly
        // part of a server's life in a test (exec, the journal's open).
        let _starting = starts().acquire().await.map_err(|e| e.to_string())?;
        self.starts += 1;
        let log_path = self.dir.path().join(format!("server-{}.log", self.starts));
        let log = std::fs::File::create(&log_path).map_err(|e| format!("log file: {e}"))?;
        let mut cmd = Command::new(crate::bin());
        cmd.arg("serve").arg("--listen").arg(listen);
        if self.opts.memory {
            cmd.arg("--memory");
        } else {
            cmd.arg("--data-dir").arg(self.data_dir());
        }
        cmd.args(&self.opts.args);
        for (k, _) in std::env::vars() {
            if k.starts_with("GAPLESS_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("GAPLESS_LOG_LEVEL", "info");
        for (k, v) in &self.opts.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| format!("spawning gapless: {e}"))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout);
        let mut line = String::new();
        let read = tokio::time::timeout(Duration::from_secs(15), lines.read_line(&mut line)).await;
        let addr = match read {
            Ok(Ok(n)) if n > 0 => parse_listening(&line),
            _ => None,
        };
        let Some(addr) = addr else {
            let _ = child.start_kill();
            let _ = child.wait().await;
            return Err(format!(
                "gapless did not print its listening line (got {line:?}); log:\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            ));
        };
        // Keep draining stdout so the server never writes into a closed pipe.
        tokio::spawn(async move {
            let mut sink = Vec::new();
            let _ = lines.read_to_end(&mut sink).await;
        });
        self.child = Some(child);
        Ok(addr)
    }

    /// `kill -9`, and waits for the process to be gone.
    pub async fn kill9(&mut self) {
        let mut child = self.child.take().expect("server is running");
        child.start_kill().expect("SIGKILL");
        child.wait().await.expect("wait after SIGKILL");
    }

    /// Sends SIGTERM (via `kill -TERM`) and waits up to 10 s for the exit;
    /// returns the exit status and how long the exit took.
    pub async fn sigterm(&mut self) -> (ExitStatus, Duration) {
        let pid = self.pid();
        let t0 = Instant::now();
        let ok = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .expect("running kill");
        assert!(ok.success(), "kill -TERM {pid} failed");
        let mut child = self.child.take().expect("server is running");
        match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
            Ok(status) => (status.expect("wait"), t0.elapsed()),
            Err(_) => {
                let _ = child.start_kill();
                panic!(
                    "gapless did not exit within 10 s of SIGTERM; log:\n{}",
                    self.log()
                );
            }
        }
    }

    /// Starts the server again with the same flags, data directory and port
    /// (kills it first if it is still running). Retries for up to 20 s, in
    /// case the port is briefly held.
    pub async fn restart(&mut self) {
        if self.child.is_some() {
            self.kill9().await;
        }
        let listen = self.addr.to_string();
        let t0 = Instant::now();
        loop {
            match self.spawn(&listen).await {
                Ok(addr) => {
                    assert_eq!(addr, self.addr, "restarted on the same address");
                    return;
                }
                Err(e) if t0.elapsed() < Duration::from_secs(20) => {
                    eprintln!("restart: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("restart failed: {e}"),
            }
        }
    }

    /// A Rust SDK client of this server.
    pub fn client(&self) -> gapless_client::Client {
        gapless_client::Client::new(&self.base()).expect("valid URL")
    }

    /// The server's log (stderr) of the current or last run.
    pub fn log(&self) -> String {
        let path = self.dir.path().join(format!("server-{}.log", self.starts));
        std::fs::read_to_string(path).unwrap_or_default()
    }

    // ---- HTTP ----

    /// Sends a request and collects the answer.
    pub async fn send(&self, req: reqwest::RequestBuilder) -> Resp {
        let resp = tokio::time::timeout(Duration::from_secs(15), req.send())
            .await
            .expect("HTTP request timed out")
            .expect("HTTP request failed");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("reading the body");
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        Resp {
            status,
            headers,
            text,
            json,
        }
    }

    /// GET `path`.
    pub async fn get(&self, path: &str) -> Resp {
        self.send(self.http.get(self.url(path))).await
    }

    /// `method` (e.g. `PUT`, `HEAD`) to `path` with headers and `body` (the
    /// Durable Streams tests' one request helper).
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Resp {
        let m = reqwest::Method::from_bytes(method.as_bytes()).expect("an HTTP method");
        let mut req = self.http.request(m, self.url(path)).body(body.to_owned());
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.send(req).await
    }

    /// POST `body` to `path` with headers.
    pub async fn post(
        &self,
        path: &str,
        body: impl Into<reqwest::Body>,
        headers: &[(&str, &str)],
    ) -> Resp {
        let mut req = self.http.post(self.url(path)).body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.send(req).await
    }

    /// Publishes `data` to `channel` (query e.g. `type=t`), asserting 201; returns the JSON.
    pub async fn publish_q(&self, channel: &str, query: &str, data: &str) -> Value {
        let path = if query.is_empty() {
            format!("/v1/channels/{channel}/events")
        } else {
            format!("/v1/channels/{channel}/events?{query}")
        };
        let r = self.post(&path, data.to_owned(), &[]).await;
        r.expect(201).clone()
    }

    /// Publishes `data` to `channel`, asserting 201; returns the JSON.
    pub async fn publish(&self, channel: &str, data: &str) -> Value {
        self.publish_q(channel, "", data).await
    }

    /// Publishes `n` events `prefix0..prefix{n-1}` in batches; returns the last seq.
    pub async fn publish_many(&self, channel: &str, prefix: &str, n: usize) -> u64 {
        let mut last = 0;
        let mut i = 0;
        while i < n {
            let end = (i + 500).min(n);
            let items: Vec<Value> = (i..end)
                .map(|k| serde_json::json!({"data": format!("{prefix}{k}")}))
                .collect();
            let r = self.batch(channel, &Value::Array(items), &[]).await;
            last = r.expect(201)["last_seq"].as_u64().expect("last_seq");
            i = end;
        }
        last
    }

    /// POST a batch.
    pub async fn batch(&self, channel: &str, items: &Value, headers: &[(&str, &str)]) -> Resp {
        self.post(
            &format!("/v1/channels/{channel}/batch"),
            items.to_string(),
            headers,
        )
        .await
    }

    /// GET one history page (`query` without the `?`).
    pub async fn history(&self, channel: &str, query: &str) -> Resp {
        if query.is_empty() {
            self.get(&format!("/v1/channels/{channel}/events")).await
        } else {
            self.get(&format!("/v1/channels/{channel}/events?{query}"))
                .await
        }
    }

    /// Every retained event of `channel`, paging with `limit=1000`.
    pub async fn all_events(&self, channel: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let q = match &after {
                None => "limit=1000".to_owned(),
                Some(c) => format!("limit=1000&after={c}"),
            };
            let r = self.history(channel, &q).await;
            let page = r.expect(200);
            out.extend(page["events"].as_array().expect("events").iter().cloned());
            if page["done"] == true {
                return out;
            }
            after = Some(page["next"].as_str().expect("next").to_owned());
        }
    }

    /// Data of every retained event.
    pub async fn all_data(&self, channel: &str) -> Vec<String> {
        self.all_events(channel)
            .await
            .iter()
            .map(|e| e["data"].as_str().expect("data").to_owned())
            .collect()
    }

    /// `GET /v1/channels/{channel}`, asserting 200.
    pub async fn info(&self, channel: &str) -> Value {
        self.get(&format!("/v1/channels/{channel}"))
            .await
            .expect(200)
            .clone()
    }

    /// The channel's epoch (16 hex digits).
    pub async fn epoch(&self, channel: &str) -> String {
        self.info(channel).await["epoch"]
            .as_str()
            .expect("epoch")
            .to_owned()
    }

    // ---- SSE ----

    /// Opens an SSE request (`target` is path and query) with raw headers.
    pub async fn sse(&self, target: &str, headers: &[(&str, &[u8])]) -> SseClient {
        SseClient::connect(self.addr, target, headers).await
    }

    /// Opens `/v1/channels/{channel}/sse?{query}` and reads its preamble.
    pub async fn subscribe(&self, channel: &str, query: &str) -> (SseClient, Preamble) {
        let target = if query.is_empty() {
            format!("/v1/channels/{channel}/sse")
        } else {
            format!("/v1/channels/{channel}/sse?{query}")
        };
        let mut c = self.sse(&target, &[]).await;
        let p = c.preamble().await;
        (c, p)
    }

    /// Opens `/v1/channels/{channel}/sse` resuming with a `Last-Event-ID` header.
    pub async fn resume(&self, channel: &str, cursor: &str) -> (SseClient, Preamble) {
        let mut c = self
            .sse(
                &format!("/v1/channels/{channel}/sse"),
                &[("Last-Event-ID", cursor.as_bytes())],
            )
            .await;
        let p = c.preamble().await;
        (c, p)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        if std::thread::panicking() {
            let log = self.log();
            let tail: String = log
                .lines()
                .rev()
                .take(40)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            eprintln!("---- gapless server log (last run, tail) ----\n{tail}\n----");
        }
    }
}

fn parse_listening(line: &str) -> Option<SocketAddr> {
    let rest = line.strip_prefix("gapless listening on http://")?;
    let addr = rest.split_whitespace().next()?;
    addr.parse().ok()
}

// ---- cursors (tests may look inside; clients never do) ----

/// The seq a cursor names for `channel`.
#[track_caller]
pub fn seq_of(cursor: &str, channel: &str) -> u64 {
    Cursor::decode(cursor.as_bytes())
        .unwrap_or_else(|e| panic!("cursor {cursor:?}: {e}"))
        .get(channel)
        .unwrap_or_else(|| panic!("cursor {cursor:?} has no position on {channel:?}"))
        .seq
}

/// The epoch a cursor names for `channel`, as 16 hex digits.
#[track_caller]
pub fn epoch_of(cursor: &str, channel: &str) -> String {
    let c = Cursor::decode(cursor.as_bytes()).unwrap_or_else(|e| panic!("cursor {cursor:?}: {e}"));
    let p = c
        .get(channel)
        .unwrap_or_else(|| panic!("cursor {cursor:?} has no position on {channel:?}"));
    p.epoch.to_string()
}

/// A single-channel cursor (for positions a server would not hand out, like `ahead`).
pub fn make_cursor(channel: &str, epoch_hex: &str, seq: u64) -> String {
    let epoch = u64::from_str_radix(epoch_hex, 16).expect("epoch is hex");
    Cursor::single(channel, Epoch(epoch), seq).encode()
}

/// A checked cursor (valid CRC, this version) that names `channel` twice,
/// at seqs 1 and `seq`: no server issues one.
pub fn channel_twice_cursor(channel: &str, epoch_hex: &str, seq: u8) -> String {
    let epoch = u64::from_str_radix(epoch_hex, 16).expect("epoch is hex");
    let key = gapless_protocol::ChannelKey::of(channel).0;
    let mut body = vec![gapless_protocol::cursor::VERSION, 2];
    for s in [1u8, seq & 0x7f] {
        body.extend_from_slice(&key.to_le_bytes());
        body.extend_from_slice(&epoch.to_le_bytes());
        body.push(s);
    }
    body.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    URL_SAFE_NO_PAD.encode(body)
}

/// A well-formed cursor of another format version (checksum valid, version 2).
pub fn other_version_cursor() -> String {
    let mut buf = vec![2u8, 0];
    buf.extend_from_slice(&crc32fast::hash(&buf).to_le_bytes());
    URL_SAFE_NO_PAD.encode(buf)
}

/// Polls `cond` every 20 ms until it holds; panics after `within`.
pub async fn eventually<F, Fut>(what: &str, within: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let t0 = Instant::now();
    loop {
        if cond().await {
            return;
        }
        assert!(
            t0.elapsed() < within,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Copies a directory tree.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("dir entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy file");
        }
    }
}

/// Percent-encodes every byte outside `A-Z a-z 0-9 - _ . ~` (for URLs with odd names).
pub fn pct(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
