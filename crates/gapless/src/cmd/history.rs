//! `gapless history CHANNEL`: prints every retained event of a channel, page
//! after page, as plain data lines or JSON lines.

use super::{explain, fail, since, write_failed, Hint, Output, ServerArg};
use futures::StreamExt;
use gapless_client::{Cursor, Start};
use std::io::Write;
use std::process::ExitCode;

/// `gapless history` flags.
#[derive(Debug, clap::Args)]
pub(crate) struct HistoryArgs {
    /// The channel to read.
    pub channel: String,
    /// Start after this cursor (as printed by `--json`) instead of the oldest retained event.
    #[arg(long, value_name = "CURSOR", conflicts_with = "since")]
    pub after: Option<String>,
    /// Start where this says instead of the oldest retained event: `last:N`
    /// (the last N retained events, 1 to 1000), `time:UNIX_MS` or
    /// `time:RFC3339` (from the first retained event at or after it; a line
    /// on stderr when an event no longer retained may be at or after it),
    /// `earliest`, `live` (nothing), or a cursor (as `--after`).
    #[arg(long, value_name = "last:N|time:T|earliest|live|CURSOR")]
    pub since: Option<String>,
    /// Print one JSON object per line: {"channel","seq","cursor","type","data","time"}.
    #[arg(long)]
    pub json: bool,
    /// Events per request (1 to 1000).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub page_size: u32,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub server: ServerArg,
}

/// Runs `gapless history`.
pub(crate) fn run(args: HistoryArgs) -> ExitCode {
    let start = match args.since.as_deref().map(since::parse) {
        None => args
            .after
            .map_or(Start::Earliest, |c| Start::After(Cursor::from(c))),
        Some(Ok(start)) => start,
        Some(Err(line)) => return fail(&line),
    };
    let (client, rt) = match args.server.client_and_runtime() {
        Ok(both) => both,
        Err(status) => return status,
    };
    let output = Output::from_flag(args.json);
    rt.block_on(async move {
        // The first page alone, to report its gap (a start at a time before
        // the floor); then the pages after it.
        let first = client
            .history(&args.channel)
            .start(start)
            .limit(args.page_size)
            .page()
            .await;
        let first = match first {
            Ok(page) => page,
            Err(e) => return fail(&explain(&e, Hint::After)),
        };
        if let Some(g) = &first.gap {
            eprintln!(
                "gapless: gap on {} (evicted): the events up to and including {} are no longer \
                 retained, and some of them may be at or after the time asked",
                g.channel, g.next
            );
        }
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
        for e in &first.events {
            if let Err(err) = output.event(&mut out, e) {
                return write_failed(&err);
            }
        }
        if !first.done {
            let mut events = client
                .history(&args.channel)
                .after(first.next)
                .limit(args.page_size)
                .stream()
                .boxed();
            while let Some(item) = events.next().await {
                match item {
                    Ok(e) => {
                        if let Err(err) = output.event(&mut out, &e) {
                            return write_failed(&err);
                        }
                    }
                    Err(e) => {
                        // Keep what was printed, then report.
                        let _ = out.flush();
                        return fail(&explain(&e, Hint::After));
                    }
                }
            }
        }
        match out.flush() {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => write_failed(&err),
        }
    })
}
