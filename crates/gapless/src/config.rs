//! The configuration file (`--config FILE`, TOML) and `gapless config`.
//!
//! A file holds any setting a `gapless serve` flag holds, under the flag's
//! name with `_` for `-` (`retention_events = 1000`, `cors_origin =
//! ["https://a.example"]`). Layering is clap's own: each key of the file is
//! offered to clap as the flag's environment variable (`GAPLESS_<NAME>`)
//! when the environment does not set it, so the precedence is flags >
//! environment > file > defaults, and every value goes through the flag's own
//! parser. Unknown keys are an error naming the key, the file and the closest
//! valid key; a value of the wrong type names the key and the type expected.
//! `gapless config` prints the effective settings with where each came from;
//! `gapless config --default` prints a commented file of every setting.

use crate::cli::Cli;
use clap::parser::ValueSource;
use clap::{ArgMatches, Command, CommandFactory, FromArgMatches};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Subcommands whose flags a file may set.
const WITH_FILE: &[&str] = &["serve", "config"];
/// Arguments that are not settings.
const NOT_SETTINGS: &[&str] = &["config", "default", "help", "version"];
/// Settings printed redacted.
const SECRETS: &[&str] = &["jwt_secret"];

/// The parsed command line, and which settings came from the file.
pub struct Parsed {
    /// The command line, with the file's values applied.
    pub cli: Cli,
    /// The file, if one was given.
    pub file: Option<PathBuf>,
    /// Ids of the settings whose value came from the file.
    pub from_file: BTreeSet<String>,
    /// The matches of the subcommand, for `gapless config`.
    pub matches: Option<ArgMatches>,
}

/// Parses the command line, applying a `--config` file if one is named.
/// Exits with clap's message on a command-line error, and with a one-line
/// message (status 2) on a file that cannot be used.
pub fn parse() -> Parsed {
    let first = Cli::command().get_matches();
    let Some((sub, sub_matches)) = first.subcommand() else {
        return finish(first, None, BTreeSet::new());
    };
    if !WITH_FILE.contains(&sub) {
        return finish(first, None, BTreeSet::new());
    }
    let Some(file) = sub_matches.get_one::<PathBuf>("config").cloned() else {
        return finish(first, None, BTreeSet::new());
    };
    let serve = serve_command();
    match apply(&file, &serve) {
        Ok(from_file) => match Cli::command().try_get_matches() {
            Ok(second) => finish(second, Some(file), from_file),
            // The flag's own parser refused a value from the file (a range, a choice).
            Err(e) => {
                let flag = e
                    .get(clap::error::ContextKind::InvalidArg)
                    .map(|v| v.to_string())
                    .unwrap_or_default();
                let serve = serve_command();
                let key = settings(&serve)
                    .into_iter()
                    .filter(|a| from_file.contains(a.get_id().as_str()))
                    .map(key_of)
                    .find(|k| {
                        flag.starts_with(&format!("--{} ", k.replace('_', "-")))
                            || flag == format!("--{}", k.replace('_', "-"))
                    });
                match key {
                    Some(key) => {
                        let why = e.to_string();
                        let why = why
                            .lines()
                            .next()
                            .unwrap_or("")
                            .trim_start_matches("error: ");
                        eprintln!("gapless: {}: `{key}`: {why}", file.display());
                        std::process::exit(2)
                    }
                    None => e.exit(),
                }
            }
        },
        Err(line) => {
            eprintln!("gapless: {line}");
            std::process::exit(2)
        }
    }
}

fn finish(matches: ArgMatches, file: Option<PathBuf>, from_file: BTreeSet<String>) -> Parsed {
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let sub = matches.subcommand().map(|(_, m)| m.clone());
    Parsed {
        cli,
        file,
        from_file,
        matches: sub,
    }
}

/// The `serve` subcommand's definition (its arguments are the settings).
fn serve_command() -> Command {
    Cli::command()
        .find_subcommand("serve")
        .cloned()
        .unwrap_or_else(|| Command::new("serve"))
}

/// The settings: every argument of `serve` but `--config` and help.
fn settings(serve: &Command) -> Vec<&clap::Arg> {
    serve
        .get_arguments()
        .filter(|a| !NOT_SETTINGS.contains(&a.get_id().as_str()) && !a.is_hide_set())
        .collect()
}

/// A setting's key in the file: its long flag with `_` for `-`
/// (`--redis-timeout-ms` is `redis_timeout_ms`).
fn key_of(arg: &clap::Arg) -> String {
    arg.get_long()
        .map(|l| l.replace('-', "_"))
        .unwrap_or_else(|| arg.get_id().as_str().to_owned())
}

/// The kind of value a setting takes, from its default (all numeric
/// settings have numeric defaults, booleans `true`/`false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Integer,
    Boolean,
    Text,
    List,
}

fn kind(arg: &clap::Arg) -> Kind {
    if arg.get_value_delimiter().is_some() {
        return Kind::List;
    }
    let possible: Vec<String> = arg
        .get_possible_values()
        .iter()
        .map(|v| v.get_name().to_owned())
        .collect();
    if matches!(arg.get_action(), clap::ArgAction::SetTrue) || possible == ["true", "false"] {
        return Kind::Boolean;
    }
    match arg.get_default_values().first().and_then(|v| v.to_str()) {
        Some("true" | "false") => Kind::Boolean,
        Some(v) if v.parse::<i64>().is_ok() => Kind::Integer,
        _ => Kind::Text,
    }
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Integer => "an integer",
            Kind::Boolean => "true or false",
            Kind::Text => "a string",
            Kind::List => "a string or an array of strings",
        }
    }
}

/// Reads `file` and offers each key to clap as its environment variable
/// (unless the environment already sets it). Returns the keys applied.
fn apply(file: &Path, serve: &Command) -> Result<BTreeSet<String>, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read the config file {}: {e}", file.display()))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e| format!("{}: not valid TOML: {e}", file.display()))?;
    let settings = settings(serve);
    let mut from_file = BTreeSet::new();
    for (key, value) in &table {
        let Some(arg) = settings.iter().find(|a| key_of(a) == *key) else {
            let closest = settings
                .iter()
                .map(|a| key_of(a))
                .min_by_key(|k| strsim::levenshtein(k, key))
                .unwrap_or_default();
            return Err(format!(
                "{}: unknown setting `{key}`; did you mean `{closest}`? (`gapless config --default` lists every setting)",
                file.display()
            ));
        };
        let kind = kind(arg);
        let wrong = || {
            format!(
                "{}: `{key}` must be {}, not {}",
                file.display(),
                kind.name(),
                describe(value)
            )
        };
        let raw = match (kind, value) {
            (Kind::Integer, toml::Value::Integer(n)) => n.to_string(),
            (Kind::Boolean, toml::Value::Boolean(b)) => b.to_string(),
            (Kind::Text | Kind::List, toml::Value::String(s)) => s.clone(),
            (Kind::List, toml::Value::Array(items)) => {
                let mut parts = Vec::with_capacity(items.len());
                for item in items {
                    match item {
                        toml::Value::String(s) => parts.push(s.clone()),
                        _ => return Err(wrong()),
                    }
                }
                parts.join(",")
            }
            _ => return Err(wrong()),
        };
        let Some(env) = arg.get_env() else {
            return Err(format!(
                "{}: `{key}` cannot be set from a file",
                file.display()
            ));
        };
        if std::env::var_os(env).is_none() {
            std::env::set_var(env, &raw);
            from_file.insert(arg.get_id().as_str().to_owned());
        }
    }
    Ok(from_file)
}

fn describe(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => format!("the string {s:?}"),
        toml::Value::Integer(n) => format!("the integer {n}"),
        toml::Value::Float(f) => format!("the number {f}"),
        toml::Value::Boolean(b) => format!("the boolean {b}"),
        toml::Value::Array(_) => "an array".to_owned(),
        toml::Value::Table(_) => "a table".to_owned(),
        toml::Value::Datetime(d) => format!("the date {d}"),
    }
}

/// `gapless config`: the effective settings as TOML, each with its source
/// (`default`, `file`, `env`, `flag`).
pub fn print_effective(p: &Parsed) -> String {
    let serve = serve_command();
    let mut out = String::new();
    if let Some(f) = &p.file {
        let _ = writeln!(out, "# effective settings; file: {}", f.display());
    } else {
        let _ = writeln!(out, "# effective settings (no --config file)");
    }
    let Some(m) = &p.matches else {
        return out;
    };
    for arg in settings(&serve) {
        let id = arg.get_id().as_str();
        let source = match m.value_source(id) {
            Some(ValueSource::CommandLine) => "flag",
            Some(ValueSource::EnvVariable) if p.from_file.contains(id) => "file",
            Some(ValueSource::EnvVariable) => "env",
            Some(ValueSource::DefaultValue) => "default",
            _ => {
                let _ = writeln!(out, "# {} is not set", key_of(arg));
                continue;
            }
        };
        let values: Vec<String> = m
            .get_raw(id)
            .map(|vs| vs.map(|v| v.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let value = if SECRETS.contains(&id) {
            "\"<redacted>\"".to_owned()
        } else {
            toml_value(kind(arg), &values)
        };
        let _ = writeln!(out, "{} = {value}  # {source}", key_of(arg));
    }
    out
}

fn toml_value(kind: Kind, values: &[String]) -> String {
    let quote = |s: &str| toml::Value::String(s.to_owned()).to_string();
    match kind {
        Kind::List => format!(
            "[{}]",
            values
                .iter()
                .map(|v| quote(v))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Kind::Integer | Kind::Boolean => values.first().cloned().unwrap_or_default(),
        Kind::Text => quote(values.first().map(String::as_str).unwrap_or("")),
    }
}

/// `gapless config --default`: every setting, commented, with its help
/// (unit and meaning), its environment variable and its default.
pub fn print_default() -> String {
    let serve = serve_command();
    let mut out = String::from(
        "# gapless configuration file (TOML): `gapless serve --config FILE`.\n\
         # Every setting is a `gapless serve` flag with `_` for `-`. Precedence:\n\
         # command-line flags > environment (GAPLESS_*) > this file > defaults.\n\
         # Uncomment a line to change a setting.\n",
    );
    for arg in settings(&serve) {
        let id = key_of(arg);
        out.push('\n');
        let help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(|h| h.to_string())
            .unwrap_or_default();
        for line in help.lines() {
            let _ = writeln!(out, "# {line}");
        }
        if let Some(env) = arg.get_env() {
            let _ = writeln!(out, "# (environment: {})", env.to_string_lossy());
        }
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        if defaults.is_empty() && matches!(arg.get_action(), clap::ArgAction::SetTrue) {
            let _ = writeln!(out, "# {id} = false");
        } else if defaults.is_empty() {
            let example = match kind(arg) {
                Kind::List => "[]".to_owned(),
                Kind::Boolean => "true".to_owned(),
                _ => "\"\"".to_owned(),
            };
            let _ = writeln!(out, "# {id} = {example}   (no default: unset)");
        } else {
            let _ = writeln!(out, "# {id} = {}", toml_value(kind(arg), &defaults));
        }
    }
    out
}
