//! The `gapless` binary: parses flags and wires the crates together; no logic
//! of its own lives here.

mod cli;
mod cmd;
mod serve;

use clap::Parser;

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    match cli.command {
        cli::Command::Serve(args) => match serve::run(args) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("gapless: {e:#}");
                std::process::ExitCode::FAILURE
            }
        },
        cli::Command::Publish(args) => cmd::publish::run(args),
        cli::Command::Tail(args) => cmd::tail::run(args),
        cli::Command::History(args) => cmd::history::run(args),
        cli::Command::Token(args) => cmd::token::run(args),
    }
}
