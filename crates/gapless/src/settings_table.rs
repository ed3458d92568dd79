//! `gapless config --markdown`: the settings tables of the README and the
//! docs, made from the flags' own definitions (their help, default, value
//! and heading in `cli.rs`), so the tables cannot drift from the flags. The
//! README and docs hold them between `<!-- settings: HEADING -->` and
//! `<!-- /settings -->` markers (`all` for every heading);
//! `crates/gapless/tests/it/settings_docs.rs` fails when a committed table
//! differs from what this prints, and rewrites them with
//! `GAPLESS_UPDATE_DOCS=1`.

use crate::cli::HEADINGS;
use crate::config::{kind, serve_command, settings, Kind};
use std::fmt::Write as _;

/// The tables of `heading` (`None` or `all`: every heading, each under a
/// `####` title, in [`HEADINGS`] order): one row per flag, `| flag |
/// default | meaning |`.
///
/// # Errors
/// An unknown heading, naming the known ones.
pub(crate) fn print(heading: Option<&str>) -> Result<String, String> {
    let serve = serve_command();
    let args = settings(&serve);
    let all = matches!(heading, None | Some("" | "all"));
    if let Some(h) = heading.filter(|_| !all) {
        if !HEADINGS.contains(&h) {
            return Err(format!(
                "no setting has the heading {h:?}; the headings are {}, or `all`",
                HEADINGS.join(", ")
            ));
        }
    }
    let mut out = String::new();
    for h in HEADINGS.iter().filter(|h| all || heading == Some(**h)) {
        if all {
            let _ = writeln!(out, "#### {h}\n");
        }
        out.push_str("| flag | default | meaning |\n|---|---|---|\n");
        for arg in args.iter().filter(|a| a.get_help_heading() == Some(*h)) {
            let (meaning, default) = meaning_and_default(arg);
            let _ = writeln!(
                out,
                "| `{}` | {} | {} |",
                cell(&flag(arg)),
                default,
                cell(&meaning)
            );
        }
        if all {
            out.push('\n');
        }
    }
    Ok(out.trim_end().to_owned() + "\n")
}

/// `--name VALUE`: `N` for a number, `BOOL` for true/false, the choices
/// for an enum (`sync|async`), else the flag's value name; a switch alone.
fn flag(arg: &clap::Arg) -> String {
    let long = format!("--{}", arg.get_long().unwrap_or_default());
    if matches!(arg.get_action(), clap::ArgAction::SetTrue) {
        return long;
    }
    let choices: Vec<String> = arg
        .get_possible_values()
        .iter()
        .map(|v| v.get_name().to_owned())
        .collect();
    let value = match kind(arg) {
        Kind::Integer => "N".to_owned(),
        Kind::Boolean => "BOOL".to_owned(),
        _ if !choices.is_empty() => choices.join("|"),
        _ => arg
            .get_value_names()
            .and_then(|v| v.first())
            .map(|v| v.to_string())
            .unwrap_or_else(|| arg.get_id().as_str().to_uppercase()),
    };
    format!("{long} {value}")
}

/// The help as one line, and the default: the flag's default value, `off`
/// for a switch, else the help's own `Default: …` sentence (moved out of
/// the meaning), else `none`.
fn meaning_and_default(arg: &clap::Arg) -> (String, String) {
    let help = arg
        .get_long_help()
        .or_else(|| arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    let mut meaning = help.split_whitespace().collect::<Vec<_>>().join(" ");
    // An enum's values with their own help: `sync`: …; `async`: ….
    let told: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter_map(|v| Some(format!("`{}`: {}", v.get_name(), v.get_help()?)))
        .collect();
    if !told.is_empty() {
        meaning = format!("{meaning}: {}", told.join("; "));
    }
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if !defaults.is_empty() {
        let shown = defaults
            .iter()
            .map(|d| match kind(arg) {
                Kind::Integer => d.clone(),
                _ => format!("`{d}`"),
            })
            .collect::<Vec<_>>()
            .join(", ");
        return (meaning, shown);
    }
    if matches!(arg.get_action(), clap::ArgAction::SetTrue) {
        return (meaning, "off".to_owned());
    }
    if let Some(at) = meaning.find("Default: ") {
        let rest = &meaning[at + "Default: ".len()..];
        let end = rest.find(". ").map_or(rest.len(), |i| i + 1);
        let default = rest[..end].trim_end_matches('.').to_owned();
        let after = rest[end..].trim_start().to_owned();
        meaning = format!("{}{after}", &meaning[..at]).trim_end().to_owned();
        return (meaning, cell(&default));
    }
    (meaning, "none".to_owned())
}

/// Text made safe for a Markdown table cell.
fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}
