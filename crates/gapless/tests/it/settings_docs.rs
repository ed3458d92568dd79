//! The settings tables and the flags the docs name cannot drift from the
//! flags themselves: every `<!-- settings: HEADING -->` block of the README
//! and docs is what `gapless config --markdown HEADING` prints (rewritten
//! in place with `GAPLESS_UPDATE_DOCS=1`), and every `--flag` a doc or a
//! doc comment names in backticks is a flag of some `gapless` subcommand
//! (or one of [`OTHERS`], named with the tool it belongs to).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Flags of other tools that the docs name in a span of their own (the
/// span starts with the flag), with whose they are.
const OTHERS: &[&str] = &[
    "--test-threads",     // libtest (cargo test -- --test-threads)
    "--nocapture",        // libtest
    "--ignored",          // libtest
    "--test-force-exit",  // node --test
    "--cluster",          // redis-cli --cluster
    "--appendonly",       // redis-server
    "--appendfsync",      // redis-server
    "--maxmemory-policy", // redis-server
    "--timeout",          // redis-server --timeout 1
    "--release",          // cargo
    "--report",           // scripts/bench-cluster-ab.py, bench-cluster-load.py
    "--flag",             // a placeholder for any flag
    "--name",             // a placeholder for any flag
];

/// Files that name the flags of `gapless-bench` (checked against its own
/// `--help` and its subcommands').
fn is_bench_doc(file: &Path) -> bool {
    file.ends_with("docs/performance.md") || file.components().any(|c| c.as_os_str() == "bench")
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn gapless(args: &[&str]) -> String {
    let out = Command::new(gapless_testkit::bin())
        .args(args)
        .output()
        .expect("run gapless");
    assert!(out.status.success(), "gapless {args:?}: {out:?}");
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// The README and every file under docs/.
fn docs() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let mut under: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    under.sort();
    files.extend(under);
    files
}

const OPEN: &str = "<!-- settings: ";
const CLOSE: &str = "<!-- /settings -->";

#[test]
fn the_settings_tables_are_what_the_flags_say() {
    let update = std::env::var_os("GAPLESS_UPDATE_DOCS").is_some();
    let mut blocks = Vec::new();
    let mut stale = Vec::new();
    for file in docs() {
        let text = std::fs::read_to_string(&file).expect("read doc");
        let mut out = String::new();
        let mut rest = text.as_str();
        while let Some(at) = rest.find(OPEN) {
            let head_end = at + rest[at..].find("-->").expect("marker closes") + 3;
            let heading = rest[at + OPEN.len()..head_end - 3].trim().to_owned();
            let end = head_end + rest[head_end..].find(CLOSE).expect("a closing marker");
            let want = format!("\n{}", gapless(&["config", "--markdown", &heading]));
            if rest[head_end..end] != want {
                stale.push(format!("{} ({heading})", file.display()));
            }
            out.push_str(&rest[..head_end]);
            out.push_str(&want);
            blocks.push(heading);
            rest = &rest[end..];
        }
        out.push_str(rest);
        if update && out != text {
            std::fs::write(&file, out).expect("write doc");
        }
    }
    for needed in ["all", "Cluster", "Durable Streams"] {
        assert!(
            blocks.iter().any(|b| b == needed),
            "no `{OPEN}{needed} -->` block in the README or docs: {blocks:?}"
        );
    }
    assert!(
        update || stale.is_empty(),
        "settings tables differ from `gapless config --markdown`: {stale:?}; rewrite them with \
         GAPLESS_UPDATE_DOCS=1 cargo test -p gapless --test it settings_docs::"
    );
}

#[test]
fn every_heading_holds_a_setting_and_every_setting_has_a_heading() {
    let all = gapless(&["config", "--markdown"]);
    let rows = all.lines().filter(|l| l.starts_with("| `--")).count();
    let help = gapless(&["serve", "--help"]);
    let flags = help
        .lines()
        .filter(|l| l.trim_start().starts_with("--"))
        .filter(|l| !l.contains("--help") && !l.contains("--config"))
        .count();
    assert_eq!(
        rows, flags,
        "a flag of `serve --help` is missing from the tables:\n{all}"
    );
    for heading in all.lines().filter_map(|l| l.strip_prefix("#### ")) {
        let one = gapless(&["config", "--markdown", heading]);
        assert!(
            one.lines().filter(|l| l.starts_with("| `--")).count() > 0,
            "{heading}"
        );
    }
    let out = Command::new(gapless_testkit::bin())
        .args(["config", "--markdown", "Nope"])
        .output()
        .expect("run gapless");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the headings are Storage"));
}

/// Every long flag of every subcommand, from their `--help`.
fn known_flags() -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    let subcommands = [
        vec!["serve"],
        vec!["publish"],
        vec!["tail"],
        vec!["history"],
        vec!["token"],
        vec!["journal", "check"],
        vec!["config"],
    ];
    for sub in subcommands {
        let mut args = sub.clone();
        args.push("--help");
        flags.extend(flags_in(&gapless(&args)));
    }
    flags
}

/// Every long flag of `gapless-bench` and its subcommands (the binary
/// beside `gapless`, built by `cargo test --workspace`), if it is there.
fn bench_flags() -> Option<BTreeSet<String>> {
    let bench = gapless_testkit::bin().with_file_name("gapless-bench");
    let help = |args: &[&str]| -> String {
        let out = Command::new(&bench)
            .args(args)
            .output()
            .expect("run gapless-bench");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    if !bench.exists() {
        return None;
    }
    let top = help(&["--help"]);
    let mut flags = flags_in(&top);
    let commands = top
        .split("Commands:")
        .nth(1)
        .and_then(|c| c.split("Options:").next())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect::<Vec<_>>();
    for c in commands {
        flags.extend(flags_in(&help(&[&c, "--help"])));
    }
    Some(flags)
}

/// The flag `s` begins with (`--name`, letters, digits and `-`), if any.
fn flag_at(s: &str) -> Option<String> {
    let name: String = s
        .strip_prefix("--")?
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    (!name.is_empty()).then(|| format!("--{name}"))
}

/// The `--flag` words of a help text.
fn flags_in(help: &str) -> BTreeSet<String> {
    help.split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '`' || c == '(')
        .filter_map(flag_at)
        .collect()
}

/// `--flag`s that begin a backtick span in `text`.
fn named_flags(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(flag_at)
        .collect()
}

fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_flag_the_docs_name_exists() {
    let known = known_flags();
    assert!(
        known.contains("--retention-ms") && known.contains("--since"),
        "{known:?}"
    );
    let bench = bench_flags();
    let mut files = docs();
    for krate in std::fs::read_dir(root().join("crates")).expect("crates/") {
        let src = krate.expect("entry").path().join("src");
        if src.is_dir() {
            rust_sources(&src, &mut files);
        }
    }
    let mut unknown = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read");
        // In Rust sources, the comments only (what a reader takes as docs).
        let text: String = if file.extension().is_some_and(|e| e == "rs") {
            text.lines()
                .filter(|l| l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n")
        } else {
            text
        };
        let bench_doc = is_bench_doc(&file);
        if bench_doc && bench.is_none() {
            continue; // `cargo test --workspace` builds it; `-p gapless` may not
        }
        for flag in named_flags(&text) {
            let of_bench = bench_doc && bench.as_ref().is_some_and(|b| b.contains(&flag));
            // `--jwt-…`: a family of flags, named by their prefix.
            let family = flag.ends_with('-') && known.iter().any(|k| k.starts_with(&flag));
            if !known.contains(&flag) && !of_bench && !family && !OTHERS.contains(&flag.as_str()) {
                unknown.push(format!("{}: {flag}", file.display()));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "flags named that no gapless subcommand has:\n{}",
        unknown.join("\n")
    );
}
