//! The shape of the server crate stays: this reads every `.rs` file under
//! `crates/server/src`, collects the paths it names through `crate::`
//! (`use crate::x::…;`, `use crate::{x, y};` and `crate::x::…` in code), and
//! fails, naming the file and line, when an import breaks a rule of
//! docs/design.md, "Parts":
//!
//! - the five parts (`ops`, `auth`, `net`, `transport`, `admin`) import each
//!   other only along [`ALLOWED`], and without a cycle;
//! - a transport room (`transport::sse`, `transport::ws`, `transport::http`)
//!   never imports another room; what the rooms share (`transport::query`)
//!   imports no room;
//! - `ops` is plain Rust over the hub: no `axum`, no `hyper`, no sockets;
//! - a part takes from the top (`lib.rs`) only what every handler shares
//!   ([`TOP_SHARED`]), and `config`, `error` and `metrics` (the registry
//!   every part records into), which every part may use;
//! - so `config`, `error` and `metrics` import no part.
//!
//! Comments are not read: a doc link to another part is not an import.
//!
//! And one rule of every crate's sources: no message holds a run of spaces
//! ([`no_message_holds_a_run_of_spaces`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The five parts.
const PARTS: [&str; 5] = ["ops", "auth", "net", "transport", "admin"];

/// Which part may import which (everything else between parts is refused).
/// A DAG: auth and net at the bottom; admin (probes, `GET /metrics`, the
/// document) and ops over auth; the transports on top. (The metrics
/// registry is a top module, [`TOP_MODULES`], under every part.)
const ALLOWED: &[(&str, &[&str])] = &[
    ("auth", &[]),
    ("admin", &["auth"]),
    ("net", &[]),
    ("ops", &["auth"]),
    ("transport", &["ops", "auth", "net", "admin"]),
];

/// The transport rooms: one per wire protocol; none imports another.
const ROOMS: [&str; 4] = ["sse", "ws", "http", "ds"];

/// What a part may take from `lib.rs`: the state every handler shares.
const TOP_SHARED: [&str; 3] = ["App", "Peer", "ServerConfig"];

/// The top modules every part may use.
const TOP_MODULES: [&str; 3] = ["config", "error", "metrics"];

/// Crates `ops` may not name: it is plain Rust over the hub.
const NOT_IN_OPS: [&str; 4] = ["axum", "hyper", "tokio::net", "socket2"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file under `src` (`transport/sse/mod.rs` ->
/// `["transport", "sse"]`; `lib.rs` -> `[]`).
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_owned());
    }
    parts
}

/// The source with comments blanked (line structure kept): `//` to the end
/// of the line, outside string literals.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_str = false;
        let mut prev = ' ';
        let mut cut = line.len();
        for (i, c) in line.char_indices() {
            if c == '"' && prev != '\\' {
                in_str = !in_str;
            }
            if !in_str && c == '/' && prev == '/' {
                cut = i - 1;
                break;
            }
            prev = if prev == '\\' && c == '\\' { ' ' } else { c };
        }
        out.push_str(&line[..cut]);
        out.push('\n');
    }
    out
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Every `crate::` path in `code`: `(line, segments)`, the segments as far
/// as they are plain names (`crate::transport::sse::Feed` ->
/// `["transport", "sse", "Feed"]`); a group (`crate::{a::b, c}`) gives one
/// path per member.
fn crate_paths(code: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = code[from..].find("crate::") {
        let at = from + i;
        from = at + "crate::".len();
        // `gapless_crate::` or `$crate::` are not this crate's paths.
        if code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
        {
            continue;
        }
        let line = code[..at].matches('\n').count() + 1;
        let rest = &code[from..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut end = group.len();
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = j;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let mut depth = 0;
            let mut item = String::new();
            let mut items = Vec::new();
            for c in group[..end].chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        items.push(std::mem::take(&mut item));
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            items.push(item);
            for item in items {
                let segs = segments(item.trim());
                if !segs.is_empty() {
                    out.push((line, segs));
                }
            }
        } else {
            out.push((line, segments(rest)));
        }
    }
    out
}

fn segments(mut s: &str) -> Vec<String> {
    let mut segs = Vec::new();
    loop {
        let id = ident(s);
        if id.is_empty() {
            break;
        }
        segs.push(id.to_owned());
        match s[id.len()..].strip_prefix("::") {
            Some(rest) => s = rest,
            None => break,
        }
    }
    segs
}

/// The part (and room) of a module path: `("transport", Some("sse"))`,
/// `("top", None)` for `lib.rs`, `config`, `error` and `metrics`.
fn place(module: &[String]) -> (String, Option<String>) {
    match module.first() {
        Some(p) if PARTS.contains(&p.as_str()) => (p.clone(), module.get(1).cloned()),
        _ => ("top".to_owned(), None),
    }
}

#[test]
fn the_parts_import_each_other_only_along_the_rules() {
    let root = src();
    let mut all = Vec::new();
    files(&root, &mut all);
    assert!(all.len() > 20, "too few files under {}", root.display());
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut broken = Vec::new();
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for file in &all {
        let rel = file.strip_prefix(&root).expect("under src");
        let module = module_of(rel);
        let (part, room) = place(&module);
        let text = std::fs::read_to_string(file).expect("readable");
        let code = code_of(&text);
        let at = |line: usize| {
            format!(
                "{}:{line}",
                Path::new("crates/server/src").join(rel).display()
            )
        };
        if part == "ops" {
            for (n, line) in code.lines().enumerate() {
                for name in NOT_IN_OPS {
                    let hit = line.match_indices(name).any(|(i, _)| {
                        !line[..i]
                            .chars()
                            .next_back()
                            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                    });
                    if hit {
                        broken.push(format!(
                            "{}: ops names `{name}`: ops is plain Rust over the hub \
                             (the wire belongs to a transport, sockets to net)",
                            at(n + 1)
                        ));
                    }
                }
            }
        }
        if part == "top" {
            // `config`, `error` and `metrics` sit under every part (each
            // part may use them): they import none, or a part would reach itself.
            if module.len() == 1 && TOP_MODULES.contains(&module[0].as_str()) {
                for (line, path) in crate_paths(&code) {
                    let (to, _) = place(&path);
                    if to != "top" {
                        broken.push(format!(
                            "{}: {} imports the part {to} (`crate::{}`); config.rs, \
                             error.rs and metrics.rs are under every part and import none",
                            at(line),
                            module[0],
                            path.join("::")
                        ));
                    }
                }
            }
            continue;
        }
        for (line, path) in crate_paths(&code) {
            let Some(first) = path.first() else { continue };
            let (to, to_room) = place(&path);
            if to == "top" {
                if !(TOP_SHARED.contains(&first.as_str()) || TOP_MODULES.contains(&first.as_str()))
                {
                    broken.push(format!(
                        "{}: `crate::{}` takes from lib.rs what is not shared state \
                         ({TOP_SHARED:?}, or the modules {TOP_MODULES:?})",
                        at(line),
                        path.join("::")
                    ));
                }
                continue;
            }
            if to == part {
                if part == "transport" {
                    let from_room = room.as_deref().filter(|r| ROOMS.contains(r));
                    let to_room = to_room.as_deref().filter(|r| ROOMS.contains(r));
                    match (from_room, to_room) {
                        (Some(a), Some(b)) if a != b => broken.push(format!(
                            "{}: transport::{a} imports transport::{b} (`crate::{}`): a \
                             transport never uses another; move what both need to ops",
                            at(line),
                            path.join("::")
                        )),
                        (None, Some(b)) => broken.push(format!(
                            "{}: {} is shared by the transports and imports the room \
                             transport::{b} (`crate::{}`)",
                            at(line),
                            module.join("::"),
                            path.join("::")
                        )),
                        _ => {}
                    }
                }
                continue;
            }
            edges
                .entry(part.clone())
                .or_default()
                .entry(to.clone())
                .or_insert_with(|| at(line));
            if !allowed
                .get(part.as_str())
                .is_some_and(|a| a.contains(&to.as_str()))
            {
                broken.push(format!(
                    "{}: {part} imports {to} (`crate::{}`); {part} may use {:?}",
                    at(line),
                    path.join("::"),
                    allowed.get(part.as_str()).copied().unwrap_or(&[])
                ));
            }
        }
    }
    // A cycle between parts, whatever the table above says.
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeMap<String, String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        cycles: &mut Vec<String>,
    ) {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut cycle: Vec<String> = stack[i..].to_vec();
            cycle.push(n.to_owned());
            let hops: Vec<String> = cycle
                .windows(2)
                .map(|w| format!("{} -> {} ({})", w[0], w[1], edges[&w[0]][&w[1]]))
                .collect();
            cycles.push(format!("a cycle between parts: {}", hops.join(", ")));
            return;
        }
        if done.contains(n) {
            return;
        }
        stack.push(n.to_owned());
        for next in edges.get(n).into_iter().flat_map(|m| m.keys()) {
            visit(next, edges, stack, done, cycles);
        }
        stack.pop();
        done.insert(n.to_owned());
    }
    let mut done = BTreeSet::new();
    for part in PARTS {
        visit(part, &edges, &mut Vec::new(), &mut done, &mut broken);
    }
    assert!(
        broken.is_empty(),
        "the server crate breaks its layering (docs/design.md, \"Parts\"):\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_reader_sees_grouped_and_inline_paths() {
    let code = code_of(
        "use crate::{a::b, c::{d, e}};\nfn f() { crate::x::y(); } // crate::no\nlet s = \"//\"; crate::z::w;\n",
    );
    let got: Vec<(usize, String)> = crate_paths(&code)
        .into_iter()
        .map(|(l, p)| (l, p.join("::")))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, "a::b".to_owned()),
            (1, "c".to_owned()),
            (2, "x::y".to_owned()),
            (3, "z::w".to_owned()),
        ]
    );
}

/// The quoted parts of one line of code (between unescaped `"`), or none
/// for a comment or a line with a raw string.
fn quoted(line: &str) -> Vec<&str> {
    let t = line.trim_start();
    if t.starts_with("//") || line.contains("r#\"") || line.contains("r\"") {
        return Vec::new();
    }
    let mut out = Vec::new();
    let (mut start, mut escaped) = (None, false);
    for (i, c) in line.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => match start.take() {
                Some(s) => out.push(&line[s..i]),
                None => start = Some(i + 1),
            },
            _ => {}
        }
    }
    out
}

/// No message of any crate holds a run of spaces inside a line (what a
/// string broken across source lines without `\` leaves, once a formatter
/// joins it: issue 29 found 10 to 26 spaces in the 401 of a server with
/// public namespaces and in three errors of the configuration file).
#[test]
fn no_message_holds_a_run_of_spaces() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut all = Vec::new();
    for entry in std::fs::read_dir(&crates).expect("crates").flatten() {
        let dir = entry.path().join("src");
        if dir.is_dir() {
            files(&dir, &mut all);
        }
    }
    assert!(all.len() > 50, "{} files", all.len());
    let mut found = Vec::new();
    for f in &all {
        let text = std::fs::read_to_string(f).expect("read");
        for (n, line) in text.lines().enumerate() {
            for q in quoted(line) {
                let run = q.trim().contains("    ");
                if run {
                    found.push(format!("{}:{}: {q:?}", f.display(), n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "runs of spaces in messages:\n{}",
        found.join("\n")
    );
}
