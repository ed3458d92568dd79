//! `gapless tail CHANNEL…`: follows channels and prints events as they
//! arrive, resuming from the last printed position after any drop (server
//! restart, network failure). Gap notices and reconnections go to stderr.

use super::{explain, fail, since, write_failed, Hint, Output, ServerArg};
use futures::FutureExt;
use gapless_client::{GapReason, Reconnect, Update};
use std::io::Write;
use std::process::ExitCode;

/// `gapless tail` flags.
#[derive(Debug, clap::Args)]
pub(crate) struct TailArgs {
    /// The channels to follow.
    #[arg(required = true, value_name = "CHANNEL")]
    pub channels: Vec<String>,
    /// Where to start: `live` (events published from now on), `earliest`
    /// (everything retained, then live), `last:N` (the last N retained events
    /// of each channel, 1 to 1000, then live), `time:UNIX_MS` or
    /// `time:RFC3339` (e.g. `time:2025-01-31T12:00:00Z`: from the first
    /// retained event at or after it, then live; a gap on stderr first when
    /// an event no longer retained may be at or after it), or a CURSOR
    /// printed by `--json` (resume after it).
    #[arg(
        long,
        default_value = "live",
        value_name = "earliest|live|last:N|time:T|CURSOR"
    )]
    pub since: String,
    /// Print one JSON object per line: {"channel","seq","cursor","type","data","time"}
    /// (ephemeral events have null seq and cursor and "ephemeral": true).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub server: ServerArg,
}

/// The status for an interrupted (Ctrl-C) tail.
const INTERRUPTED: u8 = 130;

fn reconnect_line(r: &Reconnect<'_>) -> String {
    if r.token_expired {
        // The reason first: the reconnect sends the same token, which the
        // server refuses, and that refusal ends the tail (with how to resume).
        return "gapless: the token expired, so the server ended the stream; a fresh --token is needed to go on"
            .to_owned();
    }
    let why = match r.error {
        Some(e) => format!("connection lost ({e})"),
        None => "the server closed the stream".to_owned(),
    };
    format!(
        "gapless: {why}; reconnecting in {:.1} s",
        r.delay.as_secs_f64()
    )
}

/// Runs `gapless tail`.
pub(crate) fn run(args: TailArgs) -> ExitCode {
    let start = match since::parse(&args.since) {
        Ok(start) => start,
        Err(line) => return fail(&line),
    };
    let (client, rt) = match args.server.client_and_runtime() {
        Ok(both) => both,
        Err(status) => return status,
    };
    let output = Output::from_flag(args.json);
    rt.block_on(async move {
        let connected = client
            .subscribe(args.channels.iter().map(String::as_str))
            .start(start)
            .on_reconnect(|r| eprintln!("{}", reconnect_line(r)))
            .connect()
            .await;
        let mut sub = match connected {
            Ok(s) => s,
            Err(e) => return fail(&explain(&e, Hint::Since)),
        };
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        let mut ctrl_c = std::pin::pin!(tokio::signal::ctrl_c());
        loop {
            // Write everything already received, flushing only when the stream pauses.
            let item = match sub.next().now_or_never() {
                Some(item) => item,
                None => {
                    if let Err(e) = out.flush() {
                        return write_failed(&e);
                    }
                    tokio::select! {
                        item = sub.next() => item,
                        _ = &mut ctrl_c => {
                            if let Err(e) = out.flush() {
                                return write_failed(&e);
                            }
                            if let Some(c) = sub.cursor() {
                                eprintln!("gapless: stopped; resume with --since {c}");
                            }
                            return ExitCode::from(INTERRUPTED);
                        }
                    }
                }
            };
            let written = match item {
                None => break,
                Some(Ok(Update::Event(e))) => output.event(&mut out, &e),
                Some(Ok(Update::Ephemeral(e))) => output.ephemeral(&mut out, &e),
                // `tail` does not ask for presence notices.
                Some(Ok(Update::Presence(_))) => Ok(()),
                Some(Ok(Update::Gap(g))) => {
                    let after = g.after.as_ref().map_or("an unreadable position".to_owned(), |a| a.to_string());
                    match g.reason {
                        GapReason::Evicted | GapReason::Epoch => eprintln!(
                            "gapless: gap on {} ({}): the events after {after} up to and including {} were not delivered",
                            g.channel,
                            g.reason.as_str(),
                            g.next
                        ),
                        _ => eprintln!(
                            "gapless: gap on {} ({}): the position does not fit the server's journal; continuing live from {}",
                            g.channel,
                            g.reason.as_str(),
                            g.next
                        ),
                    }
                    Ok(())
                }
                Some(Err(e)) => {
                    let _ = out.flush();
                    let status = fail(&explain(&e, Hint::Since));
                    if let Some(c) = sub.cursor() {
                        eprintln!("gapless: resume with --since {c}");
                    }
                    return status;
                }
            };
            if let Err(e) = written {
                return write_failed(&e);
            }
        }
        match out.flush() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => write_failed(&e),
        }
    })
}
