//! A real `redis-server` for the cluster tests: its own free port and
//! directory, AOF on with `appendfsync always`, stopped on drop. Commands go
//! through `redis-cli`. `scripts/test.sh` installs both when missing.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tempfile::TempDir;
use tokio::process::{Child, Command};

/// A running (or stopped) `redis-server`.
#[derive(Debug)]
pub struct Redis {
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
    dir: TempDir,
    extra: Vec<String>,
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

impl Redis {
    /// Whether `redis-server` can be run here (it is on `PATH`).
    pub fn available() -> bool {
        std::process::Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Starts a primary as [`Redis::start`] does, or prints `SKIP {test}: …`
    /// and returns `None` when `redis-server` cannot be found (a test then
    /// passes without it; `scripts/test.sh` installs it).
    pub async fn start_or_skip(test: &str) -> Option<Redis> {
        if !Self::available() {
            eprintln!("SKIP {test}: redis-server not found (apt-get install redis-server, or run scripts/test.sh)");
            return None;
        }
        Some(Self::start().await)
    }

    /// Starts a primary with AOF (`appendonly yes`, `appendfsync always`).
    pub async fn start() -> Redis {
        Self::start_with(&[]).await
    }

    /// Starts one with extra `--flag value` arguments.
    pub async fn start_with(extra: &[&str]) -> Redis {
        let mut r = Redis {
            child: None,
            port: free_port(),
            dir: tempfile::tempdir().expect("tempdir"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        r.spawn().await;
        r
    }

    /// Starts a Sentinel watching the primary on `primary_port` as `mymaster`
    /// (quorum 1, down after 500 ms).
    pub async fn sentinel(primary_port: u16) -> Redis {
        let mut r = Redis {
            child: None,
            port: free_port(),
            dir: tempfile::tempdir().expect("tempdir"),
            extra: Vec::new(),
        };
        let conf = r.dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {primary_port} 1\n\
                 sentinel down-after-milliseconds mymaster 500\nsentinel failover-timeout mymaster 3000\n",
                r.port,
                r.dir.path().display()
            ),
        )
        .expect("writing sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("starting redis-server --sentinel");
        r.child = Some(child);
        let t0 = Instant::now();
        while r.try_cli(&["PING"]).await.as_deref() != Some("PONG") {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "sentinel did not start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        r
    }

    async fn spawn(&mut self) {
        let mut cmd = Command::new("redis-server");
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--appendonly")
            .arg("yes")
            .arg("--appendfsync")
            .arg("always")
            .arg("--save")
            .arg("")
            .arg("--daemonize")
            .arg("no")
            .arg("--logfile")
            .arg(self.dir.path().join("redis.log"))
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!("starting redis-server ({e}); install it (apt-get install redis-server) or run scripts/test.sh")
        });
        self.child = Some(child);
        let t0 = Instant::now();
        loop {
            if self.try_cli(&["PING"]).await.as_deref() == Some("PONG") {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "redis-server on port {} did not answer PING within 10 s",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .and_then(|c| c.id())
            .expect("redis is running")
    }

    /// Runs `redis-cli -p PORT args…`; `None` when it fails.
    pub async fn try_cli(&self, args: &[&str]) -> Option<String> {
        let out = tokio::time::timeout(
            Duration::from_secs(5),
            Command::new("redis-cli")
                .arg("-p")
                .arg(self.port.to_string())
                .args(args)
                .stdin(Stdio::null())
                .output(),
        )
        .await
        .ok()?
        .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !out.status.success() || text.starts_with("Could not connect") || text.starts_with("ERR")
        {
            return None;
        }
        Some(text)
    }

    /// Runs a command and returns its output; panics when it fails.
    pub async fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args)
            .await
            .unwrap_or_else(|| panic!("redis-cli -p {} {args:?} failed", self.port))
    }

    /// `kill -9` and waits for the exit.
    pub async fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }

    /// Sends a signal (`STOP`, `CONT`) with `kill`.
    pub fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .expect("running kill");
        assert!(ok.success(), "kill -{sig} failed");
    }

    /// Kills it (if running) and starts it again on the same port and
    /// directory: it reloads its AOF.
    pub async fn restart(&mut self) {
        self.kill9().await;
        self.spawn().await;
    }

    /// The directory holding its AOF.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_owned()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.start_kill();
        }
    }
}
