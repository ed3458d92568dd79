//! The client subcommands (`publish`, `tail`, `history`), built on
//! `gapless-client`. Each failure is reported as one line that says what went
//! wrong and what to do, and exits with status 1.

pub(crate) mod history;
pub(crate) mod journal;
pub(crate) mod publish;
pub(crate) mod since;
pub(crate) mod tail;
pub(crate) mod token;

use gapless_client::{Client, Ephemeral, Error, Event};
use std::io::{self, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether this command sends a token (`--token` or `GAPLESS_TOKEN`): a 401
/// then means the token was refused, not that one is missing.
static TOKEN_SENT: AtomicBool = AtomicBool::new(false);

/// The `--server` flag shared by every client subcommand.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ServerArg {
    /// Base URL of the gapless server.
    #[arg(long, env = "GAPLESS_SERVER", default_value = "http://127.0.0.1:8080")]
    pub server: String,
    /// Token (JWT) to send, for a server started with --jwt-secret or
    /// --jwt-public-key (make one with `gapless token`).
    #[arg(long, env = "GAPLESS_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

impl ServerArg {
    /// A client for the server, or the line explaining why the URL is unusable.
    pub(crate) fn client(&self) -> Result<Client, String> {
        let mut b = Client::builder(&self.server);
        if let Some(t) = &self.token {
            b = b.token(t.trim());
            TOKEN_SENT.store(true, Ordering::Relaxed);
        }
        b.build().map_err(|e| explain(&e, Hint::None))
    }

    /// What every client subcommand starts with: the client and a runtime
    /// to run it on.
    ///
    /// # Errors
    /// The failure status, its one line already printed ([`fail`]).
    pub(crate) fn client_and_runtime(&self) -> Result<(Client, tokio::runtime::Runtime), ExitCode> {
        let client = self.client().map_err(|line| fail(&line))?;
        let rt = runtime().map_err(|line| fail(&line))?;
        Ok((client, rt))
    }
}

/// Which advice fits a `cursor_not_served` or `invalid_cursor` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hint {
    /// No cursor flag involved.
    None,
    /// The cursor came from `--since`.
    Since,
    /// The cursor came from `--after`.
    After,
}

/// A single-threaded runtime for one command.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}

/// Prints `gapless: <line>` to stderr and returns the failure status.
pub(crate) fn fail(line: &str) -> ExitCode {
    eprintln!("gapless: {line}");
    ExitCode::FAILURE
}

/// One line saying what went wrong and what to do about it.
pub(crate) fn explain(e: &Error, hint: Hint) -> String {
    match e {
        Error::Unreachable { server, detail } => format!(
            "cannot reach {server} ({detail}): is the server running? start it with `gapless serve`, or point --server (or GAPLESS_SERVER) at it"
        ),
        Error::Disconnected { server, detail } => format!(
            "lost the connection to {server} ({detail}): check that the server is still running, then try again"
        ),
        Error::InvalidUrl { url, detail } => {
            format!("invalid --server {url:?}: {detail}; pass e.g. --server http://127.0.0.1:8080")
        }
        Error::Protocol { .. } => format!("{e}: is --server the base URL of a gapless server?"),
        Error::Api(a) => {
            let msg = &a.message;
            let flag = match hint {
                Hint::After => "--after",
                _ => "--since",
            };
            match a.code.as_str() {
                "invalid_cursor" => format!(
                    "the server refused the cursor: {msg}; pass a cursor that gapless printed for this channel (e.g. by `gapless tail --json`), or {}",
                    if hint == Hint::After { "leave out --after" } else { "--since earliest" }
                ),
                "cursor_not_served" => format!(
                    "the server cannot read on from this cursor ({}): {msg}; start over without {flag} to read everything retained",
                    a.extra.get("reason").and_then(|r| r.as_str()).unwrap_or("not served")
                ),
                "too_large" => format!(
                    "the server refused the request as too large: {msg}; split the data or raise the server's limit"
                ),
                "not_found" | "method_not_allowed" => format!(
                    "the server has no such endpoint ({msg}): is --server the base URL of a gapless server?"
                ),
                "unauthorized" if TOKEN_SENT.load(Ordering::Relaxed) => format!(
                    "the server refused the token given by --token (or GAPLESS_TOKEN): {msg}; `gapless token` makes one with the server's --jwt-secret"
                ),
                "unauthorized" => format!(
                    "the server wants a token ({msg}): pass --token (or GAPLESS_TOKEN); `gapless token` makes one"
                ),
                "forbidden" => format!("the token does not allow this ({msg}): use a token whose patterns name the channel"),
                "rate_limited" => format!("the server's publish rate limit was reached ({msg}): slow down and retry"),
                "limit_reached" | "shutting_down" => {
                    format!("the server is not taking requests ({msg}): try again in a moment")
                }
                "journal_failed" => format!(
                    "the server could not write its journal ({msg}): nothing was stored; check the server's log and disk"
                ),
                code if code.starts_with("invalid_") => format!("the server refused the request: {msg}"),
                _ => format!("the server answered HTTP {}: {msg}", a.status),
            }
        }
        other => other.to_string(),
    }
}

/// How events are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    /// The data, then a newline (data containing newlines is printed as is).
    Plain,
    /// One JSON object per line: `channel`, `seq`, `cursor`, `type`, `data`, `time`.
    Json,
}

impl Output {
    /// The mode for a `--json` flag.
    pub(crate) fn from_flag(json: bool) -> Self {
        if json {
            Output::Json
        } else {
            Output::Plain
        }
    }

    /// Writes one journaled event.
    pub(crate) fn event(self, out: &mut impl Write, e: &Event) -> io::Result<()> {
        match self {
            Output::Plain => {
                out.write_all(e.data.as_bytes())?;
                out.write_all(b"\n")
            }
            Output::Json => {
                let v = serde_json::json!({
                    "channel": e.channel,
                    "seq": e.seq,
                    "cursor": e.cursor.as_str(),
                    "type": e.event_type,
                    "data": e.data,
                    "time": e.time,
                });
                writeln!(out, "{v}")
            }
        }
    }

    /// Writes one ephemeral event (`seq` and `cursor` null, `"ephemeral": true`).
    pub(crate) fn ephemeral(self, out: &mut impl Write, e: &Ephemeral) -> io::Result<()> {
        match self {
            Output::Plain => {
                out.write_all(e.data.as_bytes())?;
                out.write_all(b"\n")
            }
            Output::Json => {
                let v = serde_json::json!({
                    "channel": e.channel,
                    "seq": null,
                    "cursor": null,
                    "type": e.event_type,
                    "data": e.data,
                    "time": e.time,
                    "ephemeral": true,
                });
                writeln!(out, "{v}")
            }
        }
    }
}

/// The status for a failed write to stdout: a closed pipe (`| head`) is a
/// normal end, anything else is reported.
pub(crate) fn write_failed(e: &io::Error) -> ExitCode {
    if e.kind() == io::ErrorKind::BrokenPipe {
        ExitCode::SUCCESS
    } else {
        fail(&format!("cannot write to standard output: {e}"))
    }
}
