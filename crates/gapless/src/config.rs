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
//!
//! The file alone may also hold namespace tables (`[namespaces.chat]`, keys
//! [`gapless_core::namespace::KEYS`]): each is read here into a
//! [`Table`], checked (an unknown key is refused naming the closest valid
//! one, a value of the wrong type or out of range naming the key), and
//! [`namespaces`] resolves them over the server's settings into the one
//! [`Namespaces`] the server runs with (issue 21, "Namespaces").

use crate::cli::{Cli, ServeArgs};
use clap::parser::ValueSource;
use clap::{ArgMatches, Command, CommandFactory, FromArgMatches};
use gapless_core::namespace::{self, Namespaces, Policy, Table};
use gapless_core::Retention;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Subcommands whose flags a file may set.
const WITH_FILE: &[&str] = &["serve", "config"];
/// Arguments that are not settings.
const NOT_SETTINGS: &[&str] = &["config", "default", "markdown", "help", "version"];
/// Settings printed redacted.
const SECRETS: &[&str] = &["jwt_secret"];
/// The file's key of the namespace tables.
const NAMESPACES: &str = "namespaces";

/// The parsed command line, and which settings came from the file.
pub(crate) struct Parsed {
    /// The command line, with the file's values applied.
    pub cli: Cli,
    /// The file, if one was given.
    pub file: Option<PathBuf>,
    /// Ids of the settings whose value came from the file.
    pub from_file: BTreeSet<String>,
    /// The file's namespace tables, by namespace (none without a file).
    pub namespaces: BTreeMap<String, Table>,
    /// The matches of the subcommand, for `gapless config`.
    pub matches: Option<ArgMatches>,
}

/// Parses the command line, applying a `--config` file if one is named.
/// Exits with clap's message on a command-line error, and with a one-line
/// message (status 2) on a file that cannot be used.
pub(crate) fn parse() -> Parsed {
    let first = Cli::command().get_matches();
    let Some((sub, sub_matches)) = first.subcommand() else {
        return finish(first, None, BTreeSet::new(), BTreeMap::new());
    };
    if !WITH_FILE.contains(&sub) {
        return finish(first, None, BTreeSet::new(), BTreeMap::new());
    }
    let Some(file) = sub_matches.get_one::<PathBuf>("config").cloned() else {
        return finish(first, None, BTreeSet::new(), BTreeMap::new());
    };
    let serve = serve_command();
    match apply(&file, &serve) {
        Ok((from_file, tables)) => match Cli::command().try_get_matches() {
            Ok(second) => finish(second, Some(file), from_file, tables),
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

fn finish(
    matches: ArgMatches,
    file: Option<PathBuf>,
    from_file: BTreeSet<String>,
    namespaces: BTreeMap<String, Table>,
) -> Parsed {
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let sub = matches.subcommand().map(|(_, m)| m.clone());
    Parsed {
        cli,
        file,
        from_file,
        namespaces,
        matches: sub,
    }
}

/// The `serve` subcommand's definition (its arguments are the settings).
pub(crate) fn serve_command() -> Command {
    Cli::command()
        .find_subcommand("serve")
        .cloned()
        .unwrap_or_else(|| Command::new("serve"))
}

/// The settings: every argument of `serve` but `--config` and help.
pub(crate) fn settings(serve: &Command) -> Vec<&clap::Arg> {
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
pub(crate) enum Kind {
    Integer,
    Boolean,
    Text,
    List,
}

pub(crate) fn kind(arg: &clap::Arg) -> Kind {
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
/// (unless the environment already sets it). Returns the keys applied, and
/// the namespace tables (read by [`namespace_tables`]).
fn apply(
    file: &Path,
    serve: &Command,
) -> Result<(BTreeSet<String>, BTreeMap<String, Table>), String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read the config file {}: {e}", file.display()))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e| format!("{}: not valid TOML: {e}", file.display()))?;
    let settings = settings(serve);
    let mut from_file = BTreeSet::new();
    let mut tables = BTreeMap::new();
    for (key, value) in &table {
        if key == NAMESPACES {
            tables = namespace_tables(value).map_err(|e| format!("{}: {e}", file.display()))?;
            continue;
        }
        let Some(arg) = settings.iter().find(|a| key_of(a) == *key) else {
            let closest = settings
                .iter()
                .map(|a| key_of(a))
                .chain([NAMESPACES.to_owned()])
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
    Ok((from_file, tables))
}

/// Reads the file's `namespaces` value: a table of namespace tables, each
/// named as a namespace ([`namespace::check_name`]) and holding only the keys
/// of [`namespace::KEYS`], each of its type and range.
///
/// # Errors
/// One line naming the table and key at fault (and, for an unknown key,
/// the closest valid one).
fn namespace_tables(value: &toml::Value) -> Result<BTreeMap<String, Table>, String> {
    let toml::Value::Table(all) = value else {
        return Err(format!(
            "`{NAMESPACES}` must be tables of namespace settings ([{NAMESPACES}.chat], retention_events = 1000, ...), not {}",
            describe(value)
        ));
    };
    let mut out = BTreeMap::new();
    for (name, table) in all {
        let at = format!("[{NAMESPACES}.{}]", toml_key(name));
        namespace::check_name(name).map_err(|e| format!("{at}: {e}"))?;
        let toml::Value::Table(table) = table else {
            return Err(format!(
                "`{NAMESPACES}.{}` must be a table ({at} followed by keys such as retention_events = 1000), not {}",
                toml_key(name),
                describe(table)
            ));
        };
        let mut t = Table::default();
        for (key, v) in table {
            let whole = |min: u64, max: u64| -> Result<u64, String> {
                match v {
                    toml::Value::Integer(n)
                        if (min as i128..=max as i128).contains(&i128::from(*n)) =>
                    {
                        Ok(*n as u64)
                    }
                    toml::Value::Integer(n) => Err(format!(
                        "{at}: `{key}` must be a whole number from {min} to {max}, not {n}"
                    )),
                    other => Err(format!(
                        "{at}: `{key}` must be an integer, not {}",
                        describe(other)
                    )),
                }
            };
            let flag = || -> Result<bool, String> {
                match v {
                    toml::Value::Boolean(b) => Ok(*b),
                    other => Err(format!(
                        "{at}: `{key}` must be true or false, not {}",
                        describe(other)
                    )),
                }
            };
            let any = i64::MAX as u64;
            match key.as_str() {
                "retention_events" => t.retention_events = Some(whole(0, any)?),
                "retention_ms" => t.retention_ms = Some(whole(0, any)?),
                "retention_bytes" => t.retention_bytes = Some(whole(0, any)?),
                "max_event_bytes" => {
                    let n = whole(1, any)?;
                    t.max_event_bytes = Some(usize::try_from(n).unwrap_or(usize::MAX));
                }
                "ephemeral" => t.ephemeral = Some(flag()?),
                "latest" => t.latest = Some(flag()?),
                "public" => t.public = Some(flag()?),
                "presence" => t.presence = Some(flag()?),
                "presence_linger_ms" => {
                    t.presence_linger_ms = Some(whole(0, namespace::MAX_PRESENCE_LINGER_MS)?)
                }
                _ => {
                    let closest = namespace::KEYS
                        .iter()
                        .min_by_key(|k| strsim::levenshtein(k, key))
                        .copied()
                        .unwrap_or_default();
                    return Err(format!(
                        "{at}: unknown namespace setting `{key}`; did you mean `{closest}`? (a namespace takes {}; `gapless config --default` shows an example)",
                        namespace::KEYS.join(", ")
                    ));
                }
            }
        }
        out.insert(name.clone(), t);
    }
    Ok(out)
}

/// `name` as a TOML key: bare when it can be, else quoted.
fn toml_key(name: &str) -> String {
    if !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        name.to_owned()
    } else {
        toml::Value::String(name.to_owned()).to_string()
    }
}

/// The namespaces the server runs with: the server's settings of `args`
/// (`--retention-events`, `--retention-ms`, `--retention-bytes`,
/// `--max-event-bytes`; the other keys have no flag and take
/// [`Policy::default`]'s), with each of `tables` over them.
pub(crate) fn namespaces(args: &ServeArgs, tables: &BTreeMap<String, Table>) -> Namespaces {
    let server = Policy {
        retention: Retention {
            max_events: args.retention_events,
            max_age_ms: args.retention_ms,
            max_bytes: args.retention_bytes,
        },
        max_event_bytes: args.max_event_bytes,
        ..Policy::default()
    };
    Namespaces::new(server, tables)
}

/// The flag whose setting a namespace key takes when its table leaves it
/// out (`None`: the key has no server flag, only a default).
fn server_setting(key: &str) -> Option<&'static str> {
    match key {
        "retention_events" => Some("retention_events"),
        "retention_ms" => Some("retention_ms"),
        "retention_bytes" => Some("retention_bytes"),
        "max_event_bytes" => Some("max_event_bytes"),
        _ => None,
    }
}

/// One key of an effective policy, as TOML.
fn policy_value(p: &Policy, key: &str) -> String {
    match key {
        "retention_events" => p.retention.max_events.to_string(),
        "retention_ms" => p.retention.max_age_ms.to_string(),
        "retention_bytes" => p.retention.max_bytes.to_string(),
        "max_event_bytes" => p.max_event_bytes.to_string(),
        "ephemeral" => p.ephemeral.to_string(),
        "latest" => p.latest.to_string(),
        "public" => p.public.to_string(),
        "presence" => p.presence.to_string(),
        "presence_linger_ms" => p.presence_linger_ms.to_string(),
        _ => String::new(),
    }
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
pub(crate) fn print_effective(p: &Parsed) -> String {
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
        let Some(source) = source_of(p, m, id) else {
            let _ = writeln!(out, "# {} is not set", key_of(arg));
            continue;
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
    if let crate::cli::Command::Config(args) = &p.cli.command {
        print_namespaces(&mut out, p, m, &args.serve);
    }
    out
}

/// Where setting `id` came from: `flag`, `file`, `env` or `default`.
fn source_of(p: &Parsed, m: &ArgMatches, id: &str) -> Option<&'static str> {
    match m.value_source(id) {
        Some(ValueSource::CommandLine) => Some("flag"),
        Some(ValueSource::EnvVariable) if p.from_file.contains(id) => Some("file"),
        Some(ValueSource::EnvVariable) => Some("env"),
        Some(ValueSource::DefaultValue) => Some("default"),
        _ => None,
    }
}

/// The namespace part of `gapless config`: each namespace table's
/// effective settings, each with where it came from (`file`: its table;
/// `server setting (SOURCE)`: the table leaves it out, so it is the flag's
/// value, which came from SOURCE; `default`: left out, and no flag sets it).
fn print_namespaces(out: &mut String, p: &Parsed, m: &ArgMatches, args: &ServeArgs) {
    let resolved = namespaces(args, &p.namespaces);
    if p.namespaces.is_empty() {
        let _ = writeln!(
            out,
            "# no [namespaces.NAME] table: every channel has the settings above"
        );
        return;
    }
    let _ = writeln!(
        out,
        "\n# namespaces: a channel's namespace is its name up to the first `:` (`default` without\n\
         # one); a key its table leaves out takes the server's setting. Any other namespace has\n\
         # the settings above."
    );
    for (name, table) in &p.namespaces {
        let policy = resolved.of_namespace(name);
        let _ = writeln!(out, "\n[{NAMESPACES}.{}]", toml_key(name));
        for key in namespace::KEYS {
            let source = if table.sets(key) {
                "file".to_owned()
            } else if let Some(id) = server_setting(key) {
                format!(
                    "server setting ({})",
                    source_of(p, m, id).unwrap_or("default")
                )
            } else {
                "default".to_owned()
            };
            let _ = writeln!(out, "{key} = {}  # {source}", policy_value(policy, key));
        }
    }
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
pub(crate) fn print_default() -> String {
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
    out.push_str(NAMESPACE_EXAMPLE);
    out
}

/// The namespace part of `gapless config --default`: what a namespace is,
/// and one table with every key, its meaning and an example value.
const NAMESPACE_EXAMPLE: &str = "
# Namespaces: a channel's namespace is its name up to the first `:` (`chat:room-1` is in
# `chat`); a name without `:` is in `default` ([namespaces.default]). A table gives a
# namespace its own rules; a key it leaves out takes the server's setting (the flag of
# the same name above, or the default given here); a namespace without a table has the
# server's settings. Changing a namespace's retention and restarting applies it to the
# channels' events already kept. Unknown keys are refused at start (docs/deploy.md).
# [namespaces.chat]
# retention_events = 1000      # at most this many events kept per channel (0: no count limit)
# retention_ms = 86400000      # events older than this evicted (0: no age limit)
# retention_bytes = 10485760   # at most this many bytes of event data kept per channel (0: no limit)
# max_event_bytes = 4096       # a larger event is refused with 413 too_large and `limit`
# ephemeral = false            # ephemeral publishes refused (403 forbidden); default true
# latest = false               # true: a subscriber giving no start position gets the newest event first
# public = false               # true, with a key set: subscribe and history need no token (publish does)
# presence = false             # true: who follows each channel (GET .../presence), join and leave notices
# presence_linger_ms = 5000    # presence: a member's last connection gone this long before its leave
";
