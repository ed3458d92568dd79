//! `gapless journal check --data-dir DIR`: tells whether an embedded journal
//! is whole (every page's checksum, every event row, every channel's rows
//! from floor to head, every purged channel's own epoch), without serving it. Exit status 0 when whole, 1 when
//! damaged or unreadable (the line says what and where, and what to do).

use super::fail;
use std::path::PathBuf;
use std::process::ExitCode;

/// `gapless journal` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum JournalCommand {
    /// Check that a journal is whole (stop the server using it first).
    Check {
        /// Directory of the embedded journal.
        #[arg(long, env = "GAPLESS_DATA_DIR", default_value = "./gapless-data")]
        data_dir: PathBuf,
    },
}

/// Runs `gapless journal …`. Logs go to standard error at the level of
/// `RUST_LOG` (default `warn`): `RUST_LOG=debug` shows the storage engine's
/// own words on a damaged file.
pub(crate) fn run(cmd: JournalCommand) -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
    match cmd {
        JournalCommand::Check { data_dir } => match gapless_store::check(&data_dir) {
            Ok(r) => {
                println!(
                    "the journal in {} is whole: {}, {} retained, {} to apply, {}",
                    data_dir.display(),
                    count(r.channels, "channel"),
                    count(r.events, "event"),
                    count(r.logged_commits, "logged commit"),
                    count(r.purged, "purged channel"),
                );
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e.to_string()),
        },
    }
}

/// `n` and `noun`, plural unless `n` is 1: "1 channel", "2 channels", "0 events".
fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_are_singular_only_for_one() {
        assert_eq!(super::count(1, "channel"), "1 channel");
        assert_eq!(super::count(0, "event"), "0 events");
        assert_eq!(super::count(2, "logged commit"), "2 logged commits");
    }
}
