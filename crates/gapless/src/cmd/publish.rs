//! `gapless publish CHANNEL [DATA]`: one event from the argument, one event
//! per line of standard input (`-`), or a file of JSON lines
//! `{"data": text, "type": optional name}` (`--file`). Lines and files are
//! sent in batches, each with an idempotency key so that a batch retried
//! after a connection failure is appended once (while its events are
//! retained: a key is remembered with its events); a progress bar shows on a
//! terminal, and a summary line ends the run.

use super::{explain, fail, ServerArg};
use gapless_client::{Client, Error, NewEvent};
use gapless_protocol::object::Object;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;
use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// `gapless publish` flags.
#[derive(Debug, clap::Args)]
pub(crate) struct PublishArgs {
    /// The channel to publish to.
    pub channel: String,
    /// The event's data; `-` reads one event per line from standard input.
    #[arg(value_name = "DATA|-")]
    pub data: Option<String>,
    /// Publish the events of a file of JSON lines {"data": text, "type": optional name}
    /// (`-` for standard input).
    #[arg(long, value_name = "PATH", conflicts_with = "data")]
    pub file: Option<PathBuf>,
    /// The event type of DATA or of every line read from standard input.
    #[arg(long = "type", value_name = "TYPE")]
    pub event_type: Option<String>,
    /// Idempotency-Key of the event; for lines and files, the prefix of each
    /// batch's key (KEY-1, KEY-2, …), so that rerunning the same import appends
    /// nothing twice while the events it appended are still retained
    /// (--retention-events, --retention-ms): a key is remembered only with its
    /// events, so a rerun after they are evicted appends them again (docs/api.md).
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Deliver DATA live only, to current subscribers (never journaled).
    #[arg(long, conflicts_with = "file")]
    pub ephemeral: bool,
    /// Events per batch request for lines and files (1 to 1000).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub batch_size: u32,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub server: ServerArg,
}

/// Most JSON bytes in one batch request (the server's default limit is 16 MiB).
const MAX_BATCH_JSON: usize = 8 * 1024 * 1024;
/// Attempts per batch when the connection fails or the server is unavailable.
const ATTEMPTS: u32 = 5;

/// Runs `gapless publish`.
pub(crate) fn run(args: PublishArgs) -> ExitCode {
    let (client, rt) = match args.server.client_and_runtime() {
        Ok(both) => both,
        Err(status) => return status,
    };
    let result = match (&args.file, args.data.as_deref()) {
        (Some(path), _) => rt.block_on(import(&client, &args, Source::open_file(path))),
        (None, Some("-")) => {
            if args.ephemeral {
                return fail("--ephemeral publishes DATA only: give the data as an argument");
            }
            rt.block_on(import(&client, &args, Ok(Source::stdin_lines())))
        }
        (None, Some(data)) => rt.block_on(single(&client, &args, data)),
        (None, None) => Err(
            "nothing to publish: give DATA, `-` to publish each line of standard input, or --file PATH"
                .to_owned(),
        ),
    };
    match result {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(line) => fail(&line),
    }
}

async fn single(client: &Client, args: &PublishArgs, data: &str) -> Result<String, String> {
    let mut req = client.publish(&args.channel, data);
    if let Some(t) = &args.event_type {
        req = req.event_type(t);
    }
    if let Some(k) = &args.idempotency_key {
        req = req.idempotency_key(k);
    }
    let explain = |e: Error| explain(&e, super::Hint::None);
    if args.ephemeral {
        let sent = req.send_ephemeral().await.map_err(explain)?;
        return Ok(format!(
            "delivered live to {} subscriber{} of {} (not journaled)",
            sent.subscribers,
            if sent.subscribers == 1 { "" } else { "s" },
            args.channel
        ));
    }
    let p = req.send().await.map_err(explain)?;
    Ok(if p.duplicate {
        format!(
            "already published to {} (same idempotency key): seq {}, cursor {}",
            p.channel, p.seq, p.cursor
        )
    } else {
        format!(
            "published to {}: seq {}, cursor {}",
            p.channel, p.seq, p.cursor
        )
    })
}

/// Where events come from.
struct Source {
    reader: Box<dyn BufRead>,
    /// `--file` JSON lines, else raw lines.
    json: bool,
    /// For messages: `standard input` or the file's path.
    name: String,
    /// The file's size, for a progress bar by bytes.
    size: Option<u64>,
}

impl Source {
    fn stdin_lines() -> Source {
        Source {
            reader: Box::new(std::io::stdin().lock()),
            json: false,
            name: "standard input".to_owned(),
            size: None,
        }
    }

    fn open_file(path: &PathBuf) -> Result<Source, String> {
        if path.as_os_str() == "-" {
            return Ok(Source {
                json: true,
                ..Source::stdin_lines()
            });
        }
        let file = std::fs::File::open(path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let size = file.metadata().ok().map(|m| m.len());
        Ok(Source {
            reader: Box::new(std::io::BufReader::with_capacity(1 << 16, file)),
            json: true,
            name: path.display().to_string(),
            size,
        })
    }
}

/// One line of a `--file`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEvent {
    data: String,
    #[serde(rename = "type")]
    event_type: Option<String>,
}

/// The progress of an import, and its summary.
struct Tally {
    published: u64,
    duplicates: u64,
    first_seq: Option<u64>,
    last_seq: Option<u64>,
    batches: u64,
    bytes_read: u64,
}

impl Tally {
    fn summary(&self, channel: &str, elapsed: Duration) -> String {
        let mut s = match (self.first_seq, self.last_seq) {
            (Some(a), Some(b)) if self.published > 0 => format!(
                "published {} event{} to {channel}: seq {a} to {b}",
                self.published,
                if self.published == 1 { "" } else { "s" }
            ),
            _ => format!("published no new event to {channel}"),
        };
        if self.duplicates > 0 {
            s.push_str(&format!(
                " ({} already published with the same idempotency keys)",
                self.duplicates
            ));
        }
        s.push_str(&format!(
            " in {} batch{}, {:.1} s",
            self.batches,
            if self.batches == 1 { "" } else { "es" },
            elapsed.as_secs_f64()
        ));
        s
    }

    fn so_far(&self) -> String {
        match (self.first_seq, self.last_seq) {
            (Some(a), Some(b)) => format!(
                "{} events were published before it (seq {a} to {b})",
                self.published
            ),
            _ => "no event was published".to_owned(),
        }
    }
}

/// The JSON size of `s` as a string literal (an upper bound of serde_json's).
fn json_len(s: &str) -> usize {
    2 + s
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum::<usize>()
}

async fn import(
    client: &Client,
    args: &PublishArgs,
    source: Result<Source, String>,
) -> Result<String, String> {
    let mut source = source?;
    let started = Instant::now();
    // Shown once a second batch is needed: only long imports get a bar.
    let mut bar: Option<ProgressBar> = None;
    let prefix = args.idempotency_key.clone().unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("gapless-publish-{}-{nanos}", std::process::id())
    });
    let mut tally = Tally {
        published: 0,
        duplicates: 0,
        first_seq: None,
        last_seq: None,
        batches: 0,
        bytes_read: 0,
    };
    let mut batch: Vec<NewEvent> = Vec::new();
    let mut batch_json = 2usize;
    let mut line_no = 0u64;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = source
            .reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| format!("cannot read {}: {e}", source.name))?;
        let at_end = n == 0;
        if !at_end {
            line_no += 1;
            tally.bytes_read += n as u64;
            let mut line = &buf[..];
            if let Some(l) = line.strip_suffix(b"\n") {
                line = l.strip_suffix(b"\r").unwrap_or(l);
            }
            let event =
                parse_line(line, source.json, args.event_type.as_deref()).map_err(|why| {
                    format!("{} line {line_no}: {why}; {}", source.name, tally.so_far())
                })?;
            if let Some(event) = event {
                let size = json_len(&event.data.wire())
                    + event.event_type.as_deref().map_or(0, json_len)
                    + 40;
                if !batch.is_empty() && batch_json + size > MAX_BATCH_JSON {
                    send_batch(client, args, &prefix, &mut batch, &mut tally).await?;
                    batch_json = 2;
                }
                batch.push(event);
                batch_json += size;
            }
        }
        if batch.len() >= args.batch_size as usize || (at_end && !batch.is_empty()) {
            send_batch(client, args, &prefix, &mut batch, &mut tally).await?;
            batch_json = 2;
            if bar.is_none() && !at_end {
                bar = progress(source.size);
            }
            if let Some(bar) = &bar {
                match source.size {
                    Some(_) => bar.set_position(tally.bytes_read),
                    None => bar.set_position(tally.published + tally.duplicates),
                }
                bar.set_message(format!("{} events", tally.published + tally.duplicates));
            }
        }
        if at_end {
            break;
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if line_no == 0 {
        return Ok(format!("{} is empty: nothing to publish", source.name));
    }
    Ok(tally.summary(&args.channel, started.elapsed()))
}

/// Parses one input line; `Ok(None)` for a blank line of a JSON-lines file.
fn parse_line(
    line: &[u8],
    json: bool,
    event_type: Option<&str>,
) -> Result<Option<NewEvent>, String> {
    let text = std::str::from_utf8(line)
        .map_err(|e| format!("not UTF-8 (invalid byte at offset {})", e.valid_up_to()))?;
    if !json {
        return Ok(Some(NewEvent {
            event_type: event_type.map(str::to_owned),
            data: text.into(),
        }));
    }
    if text.trim().is_empty() {
        return Ok(None);
    }
    // An object only: serde's derive would also take `["text", null]`.
    let Object(e): Object<FileEvent> = serde_json::from_str(text).map_err(|e| {
        format!("expected a JSON object {{\"data\": text, \"type\": optional name}}: {e}")
    })?;
    Ok(Some(NewEvent {
        event_type: e.event_type.or_else(|| event_type.map(str::to_owned)),
        data: e.data.into(),
    }))
}

/// Sends `batch` (then empties it), retrying connection failures and
/// unavailable answers with the same idempotency key.
async fn send_batch(
    client: &Client,
    args: &PublishArgs,
    prefix: &str,
    batch: &mut Vec<NewEvent>,
    tally: &mut Tally,
) -> Result<(), String> {
    tally.batches += 1;
    let key = format!("{prefix}-{}", tally.batches);
    let mut attempt = 0;
    let done = loop {
        attempt += 1;
        let sent = client
            .publish_batch(&args.channel, batch.iter().cloned())
            .idempotency_key(&key)
            .send()
            .await;
        match sent {
            Ok(done) => break done,
            Err(e) if !e.is_terminal() && attempt < ATTEMPTS => {
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
            }
            Err(e) => {
                return Err(format!(
                    "{}; {} (batch {} of {} events was not confirmed)",
                    explain(&e, super::Hint::None),
                    tally.so_far(),
                    tally.batches,
                    batch.len()
                ))
            }
        }
    };
    let count = done.last_seq - done.first_seq + 1;
    if done.duplicate {
        tally.duplicates += count;
    } else {
        tally.published += count;
        tally.first_seq.get_or_insert(done.first_seq);
        tally.last_seq = Some(done.last_seq);
    }
    batch.clear();
    Ok(())
}

/// A progress bar on stderr when it is a terminal: by bytes for a file of
/// known size, else a spinner counting events.
fn progress(size: Option<u64>) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = match size {
        Some(total) => {
            let bar = ProgressBar::new(total);
            if let Ok(style) = ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {msg} (eta {eta})",
            ) {
                bar.set_style(style);
            }
            bar
        }
        None => {
            let bar = ProgressBar::new_spinner();
            if let Ok(style) = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}") {
                bar.set_style(style);
            }
            bar
        }
    };
    bar.enable_steady_tick(Duration::from_millis(200));
    Some(bar)
}
