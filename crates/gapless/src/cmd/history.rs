//! `gapless history CHANNEL`: prints every retained event of a channel, page
//! after page, as plain data lines or JSON lines.

use super::{explain, fail, write_failed, Hint, Output, ServerArg};
use futures::StreamExt;
use gapless_client::Cursor;
use std::io::Write;
use std::process::ExitCode;

/// `gapless history` flags.
#[derive(Debug, clap::Args)]
pub struct HistoryArgs {
    /// The channel to read.
    pub channel: String,
    /// Start after this cursor (as printed by `--json`) instead of the oldest retained event.
    #[arg(long, value_name = "CURSOR")]
    pub after: Option<String>,
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
pub fn run(args: HistoryArgs) -> ExitCode {
    let (client, rt) = match args.server.client_and_runtime() {
        Ok(both) => both,
        Err(status) => return status,
    };
    let output = Output::from_flag(args.json);
    rt.block_on(async move {
        let mut events = client
            .history(&args.channel)
            .after_opt(args.after.map(Cursor::from))
            .limit(args.page_size)
            .stream()
            .boxed();
        let stdout = std::io::stdout();
        let mut out = std::io::BufWriter::new(stdout.lock());
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
        match out.flush() {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => write_failed(&err),
        }
    })
}
