//! The `gapless` binary: parses flags and wires the crates together; no logic
//! of its own lives here.

mod alloc;
mod cli;
mod cmd;
mod config;
mod serve;
mod settings_table;

fn main() -> std::process::ExitCode {
    let parsed = config::parse();
    if let cli::Command::Config(args) = &parsed.cli.command {
        if let Some(heading) = &args.markdown {
            return match settings_table::print(Some(heading)) {
                Ok(tables) => {
                    print!("{tables}");
                    std::process::ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("gapless: {e}");
                    std::process::ExitCode::from(2)
                }
            };
        }
        print!(
            "{}",
            if args.default {
                config::print_default()
            } else {
                config::print_effective(&parsed)
            }
        );
        return std::process::ExitCode::SUCCESS;
    }
    match parsed.cli.command {
        cli::Command::Serve(args) => match serve::run(args, &parsed.namespaces) {
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
        cli::Command::Journal(c) => cmd::journal::run(c),
        cli::Command::Config(_) => std::process::ExitCode::SUCCESS,
    }
}
