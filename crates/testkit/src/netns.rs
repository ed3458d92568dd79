//! A network namespace of its own for the server, for tests whose clients
//! must vanish without a FIN or RST (`vanish.rs`, `memory_returns.rs`).
//!
//! [`Netns`] joins the namespace to the test's by a veth pair: the server
//! at `.1` of a /29, the test at `.2` and `.3` (a second client address, so
//! one rule can drop a whole group of clients). A client "vanishes" when
//! `iptables` in the server's namespace drops every packet it sends.
//! [`NsServer`] runs `gapless serve --memory` inside it. These need root
//! (`ip netns`) and `iptables` (`scripts/test.sh` installs it); a test
//! calls [`netns_or_skip`] and passes with `SKIP` without them.

use serde_json::Value;
use std::net::{IpAddr, SocketAddr};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

/// Runs `cmd args`, returning stdout, or what went wrong.
pub fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A 10.213.a.b/29 that no route of this host uses yet (other tests, of
/// this process or another, may hold namespaces at the same time; two
/// veth pairs on one subnet would send one test's packets to the other's
/// namespace). Starts from the pid and the counter, then looks further.
fn free_subnet(pid: u32, n: u32) -> Result<(u32, u32), String> {
    let routes = run("ip", &["-4", "route", "show"])?;
    let used: Vec<(u32, u32)> = routes
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|net| net.strip_prefix("10.213."))
        .filter_map(|rest| {
            let (ab, _) = rest.split_once('/')?;
            let (a, b) = ab.split_once('.')?;
            Some((a.parse().ok()?, b.parse::<u32>().ok()? / 8 * 8))
        })
        .collect();
    let start = (pid % 250) * 32 + n % 32;
    (0..250 * 32)
        .map(|i| (start + i) % (250 * 32))
        .map(|k| (k / 32, (k % 32) * 8))
        .find(|ab| !used.contains(ab))
        .ok_or_else(|| "no free 10.213.0.0/16 subnet".to_owned())
}

/// A network namespace for the server, joined to the test's namespace by a
/// veth pair: the server at `server_ip`, the test at `client_ips`. Removed on drop.
#[derive(Debug)]
pub struct Netns {
    /// The namespace's name (`ip netns`).
    pub name: String,
    host_if: String,
    /// The server's address in the namespace (`.1`).
    pub server_ip: String,
    /// The test's addresses on the pair: connect from the first by default,
    /// bind to the second to put a client in the other group.
    pub client_ips: [IpAddr; 2],
}

impl Netns {
    /// Creates a namespace with its veth pair and addresses; what failed otherwise.
    pub fn create() -> Result<Netns, String> {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let name = format!("glv{pid}-{n}");
        let host_if = format!("glh{}{n}", pid % 100_000);
        let peer_if = format!("gls{}{n}", pid % 100_000);
        let (a, b) = free_subnet(pid, n)?;
        let server_ip = format!("10.213.{a}.{}", b + 1);
        let client_ip = format!("10.213.{a}.{}", b + 2);
        let second_ip = format!("10.213.{a}.{}", b + 3);
        run("ip", &["netns", "add", &name])?;
        let ns = Netns {
            name: name.clone(),
            host_if: host_if.clone(),
            server_ip: server_ip.clone(),
            client_ips: [
                client_ip.parse().map_err(|e| format!("{e}"))?,
                second_ip.parse().map_err(|e| format!("{e}"))?,
            ],
        };
        run(
            "ip",
            &[
                "link", "add", &host_if, "type", "veth", "peer", "name", &peer_if, "netns", &name,
            ],
        )?;
        for ip in [&client_ip, &second_ip] {
            run("ip", &["addr", "add", &format!("{ip}/29"), "dev", &host_if])?;
        }
        run("ip", &["link", "set", &host_if, "up"])?;
        ns.exec(
            "ip",
            &["addr", "add", &format!("{server_ip}/29"), "dev", &peer_if],
        )?;
        ns.exec("ip", &["link", "set", &peer_if, "up"])?;
        ns.exec("ip", &["link", "set", "lo", "up"])?;
        ns.exec("iptables", &["-L", "INPUT", "-n"])?;
        Ok(ns)
    }

    /// Runs `cmd args` inside the namespace, returning stdout.
    pub fn exec(&self, cmd: &str, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["netns", "exec", &self.name, cmd];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Drops every packet the client at `client` sends to the server, from
    /// now on: to the server it vanished without a FIN or RST.
    pub fn vanish(&self, client: SocketAddr) {
        let port = client.port().to_string();
        let ip = client.ip().to_string();
        self.exec(
            "iptables",
            &[
                "-I", "INPUT", "-p", "tcp", "-s", &ip, "--sport", &port, "-j", "DROP",
            ],
        )
        .expect("iptables rule");
    }

    /// Drops every packet sent from `ip` (every client bound to it vanishes at once).
    pub fn vanish_ip(&self, ip: IpAddr) {
        let ip = ip.to_string();
        self.exec("iptables", &["-I", "INPUT", "-s", &ip, "-j", "DROP"])
            .expect("iptables rule");
    }

    /// Undoes [`Netns::vanish_ip`].
    pub fn unvanish_ip(&self, ip: IpAddr) {
        let ip = ip.to_string();
        self.exec("iptables", &["-D", "INPUT", "-s", &ip, "-j", "DROP"])
            .expect("iptables rule removed");
    }

    /// Whether the server still holds an open connection to `client`
    /// (established, or closed by the client and not yet by the server).
    pub fn holds(&self, client: SocketAddr) -> bool {
        let filter = format!("( dport = :{} )", client.port());
        let out = self
            .exec("ss", &["-tnH", "state", "established", &filter])
            .unwrap_or_default();
        let waiting = self
            .exec("ss", &["-tnH", "state", "close-wait", &filter])
            .unwrap_or_default();
        !out.trim().is_empty() || !waiting.trim().is_empty()
    }

    /// How many connections the server's namespace holds to clients
    /// (established or close-wait, the server's listening port `port`).
    pub fn held(&self, port: u16) -> usize {
        let filter = format!("( sport = :{port} )");
        ["established", "close-wait"]
            .iter()
            .map(|state| {
                self.exec("ss", &["-tnH", "state", state, &filter])
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .count()
            })
            .sum()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run("ip", &["netns", "del", &self.name]);
        let _ = run("ip", &["link", "del", &self.host_if]);
    }
}

/// A network namespace, or `None` after printing why the test is skipped.
pub fn netns_or_skip(test: &str) -> Option<Netns> {
    match Netns::create() {
        Ok(ns) => Some(ns),
        Err(e) => {
            eprintln!("SKIP {test}: cannot make a network namespace with iptables: {e}");
            None
        }
    }
}

/// `gapless serve --memory` inside a [`Netns`], with extra flags.
#[derive(Debug)]
pub struct NsServer {
    child: Child,
    /// Where it listens (in the namespace).
    pub addr: SocketAddr,
    /// An HTTP client that keeps no idle connections.
    pub http: reqwest::Client,
}

impl NsServer {
    /// Starts `gapless serve --memory` in `ns` with extra flags.
    pub async fn start(ns: &Netns, args: &[&str]) -> NsServer {
        let listen = format!("{}:0", ns.server_ip);
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns.name])
            .arg(crate::bin())
            .args(["serve", "--memory", "--listen", &listen])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(match std::env::var_os("GAPLESS_VANISH_LOG") {
                Some(path) => Stdio::from(std::fs::File::create(path).expect("log file")),
                None => Stdio::null(),
            })
            .kill_on_drop(true);
        for (k, _) in std::env::vars() {
            if k.starts_with("GAPLESS_") {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd.spawn().expect("spawn gapless in the namespace");
        let stdout = child.stdout.take().expect("piped");
        let mut lines = BufReader::new(stdout);
        let mut line = String::new();
        tokio::time::timeout(Duration::from_secs(15), lines.read_line(&mut line))
            .await
            .expect("gapless starts")
            .expect("reads its line");
        let addr: SocketAddr = line
            .strip_prefix("gapless listening on http://")
            .and_then(|r| r.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("listening line: {line:?}"));
        tokio::spawn(async move {
            let mut sink = Vec::new();
            let _ = lines.read_to_end(&mut sink).await;
        });
        NsServer {
            child,
            addr,
            // No idle connections kept: the server's namespace then holds
            // only the clients' connections (see `Netns::held`).
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .expect("HTTP client"),
        }
    }

    /// The server's process id (`ip netns exec` runs it in its own place).
    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// GET `path` as JSON.
    pub async fn get(&self, path: &str) -> Value {
        let r = self
            .http
            .get(format!("http://{}{path}", self.addr))
            .send()
            .await
            .expect("GET");
        r.json().await.expect("JSON")
    }

    /// GET `path` as text.
    pub async fn get_text(&self, path: &str) -> String {
        self.http
            .get(format!("http://{}{path}", self.addr))
            .send()
            .await
            .expect("GET")
            .text()
            .await
            .expect("text")
    }

    /// POST `body` to `path`, asserting success; the JSON answer.
    pub async fn post(&self, path: &str, body: Vec<u8>) -> Value {
        let r = self
            .http
            .post(format!("http://{}{path}", self.addr))
            .body(body)
            .send()
            .await
            .expect("POST");
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json().await.expect("JSON")
    }

    /// The channel's `subscribers` count.
    pub async fn subscribers(&self, channel: &str) -> u64 {
        self.get(&format!("/v1/channels/{channel}")).await["subscribers"]
            .as_u64()
            .expect("subscribers")
    }
}

impl Drop for NsServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}
