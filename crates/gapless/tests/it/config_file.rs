//! The configuration file and `gapless config` (`--config FILE`): values from
//! the file are used, the environment wins over the file and a flag over
//! both, bad files are refused with the key named, and `gapless config`
//! tells where each value came from.

use gapless_testkit::{Opts, Server};
use std::process::Command;

fn gapless(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gapless"));
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("GAPLESS_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run gapless")
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let p = dir.path().join(name);
    std::fs::write(&p, text).expect("write config");
    p.display().to_string()
}

#[tokio::test]
async fn the_file_is_used_the_environment_wins_over_it_and_a_flag_over_both() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(&dir, "g.toml", "retry_ms = 1234\nmax_event_bytes = 5\n");
    let s = Server::with(Opts {
        memory: true,
        args: vec!["--config".into(), file.clone()],
        ..Opts::default()
    })
    .await;
    let (_c, pre) = s.subscribe("c", "").await;
    assert_eq!(pre.retry, 1234, "retry: from the file");
    s.post("/v1/channels/c/events", "123456", &[])
        .await
        .expect_error(413, "too_large");

    let env = Server::with(Opts {
        memory: true,
        args: vec!["--config".into(), file.clone()],
        env: vec![("GAPLESS_RETRY_MS".into(), "2345".into())],
        ..Opts::default()
    })
    .await;
    assert_eq!(
        env.subscribe("c", "").await.1.retry,
        2345,
        "the environment wins"
    );

    let flag = Server::with(Opts {
        memory: true,
        args: vec!["--config".into(), file, "--retry-ms".into(), "3456".into()],
        env: vec![("GAPLESS_RETRY_MS".into(), "2345".into())],
        ..Opts::default()
    })
    .await;
    assert_eq!(flag.subscribe("c", "").await.1.retry, 3456, "the flag wins");
}

#[test]
fn bad_files_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (text, says) in [
        (
            "retry_mss = 5\n",
            vec!["unknown setting `retry_mss`", "did you mean `retry_ms`"],
        ),
        (
            "retry_ms = \"fast\"\n",
            vec!["`retry_ms` must be an integer", "\"fast\""],
        ),
        ("memory = 1\n", vec!["`memory` must be true or false"]),
        ("fanout_threads = 5000\n", vec!["`fanout_threads`", "5000"]),
        ("durability = \"later\"\n", vec!["`durability`", "later"]),
        (
            "cors_origin = [1]\n",
            vec!["`cors_origin` must be a string or an array of strings"],
        ),
        ("retry_ms = \n", vec!["not valid TOML"]),
    ] {
        let file = write(&dir, "bad.toml", text);
        let out = gapless(
            &[
                "serve",
                "--memory",
                "--listen",
                "127.0.0.1:0",
                "--config",
                &file,
            ],
            &[],
        );
        assert_eq!(out.status.code(), Some(2), "{text:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&file), "{text:?}: names the file: {err}");
        for s in says {
            assert!(err.contains(s), "{text:?}: says {s:?}: {err}");
        }
    }
}

#[test]
fn gapless_config_prints_each_value_and_where_it_came_from() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(
        &dir,
        "g.toml",
        "retry_ms = 1234\nheartbeat_ms = 5000\ncors_origin = [\"https://a.example\"]\njwt_secret = \"s3cret-s3cret-s3cret-s3cret-s3cret\"\n",
    );
    let out = gapless(
        &["config", "--config", &file, "--listen", "127.0.0.1:9999"],
        &[("GAPLESS_HEARTBEAT_MS", "7000")],
    );
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    for line in [
        "listen = \"127.0.0.1:9999\"  # flag",
        "heartbeat_ms = 7000  # env",
        "retry_ms = 1234  # file",
        "cors_origin = [\"https://a.example\"]  # file",
        "retention_events = 100000  # default",
        "jwt_secret = \"<redacted>\"  # file",
    ] {
        assert!(text.contains(line), "{line:?} in:\n{text}");
    }
    assert!(!text.contains("s3cret"), "secrets are not printed");
    // The output is itself a valid TOML file.
    let table: toml::Table = text.parse().expect("valid TOML");
    assert_eq!(table["retry_ms"].as_integer(), Some(1234));
}

#[test]
fn gapless_config_default_lists_every_serve_flag_and_reads_back() {
    let out = gapless(&["config", "--default"], &[]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let help = String::from_utf8_lossy(&gapless(&["serve", "--help"], &[]).stdout).to_string();
    let flags: Vec<String> = help
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("--"))
        .filter_map(|l| l.split_whitespace().next())
        .map(|w| {
            w.trim_start_matches("--")
                .trim_end_matches(',')
                .replace('-', "_")
        })
        .filter(|f| !["help", "config"].contains(&f.as_str()))
        .collect();
    assert!(flags.len() > 30, "{flags:?}");
    for f in &flags {
        assert!(
            text.contains(&format!("# {f} = ")),
            "{f} documented in:\n{text}"
        );
    }
    // Uncommented, the defaults (and the namespace example, a table after
    // them) form a file the server accepts.
    let uncommented: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .filter(|l| {
            let table = l.starts_with("[namespaces.") && l.ends_with(']');
            table
                || l.split_once(" = ").is_some_and(|(k, _)| {
                    !k.is_empty() && k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                }) && !l.contains("(no default")
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(&dir, "defaults.toml", &uncommented);
    let check = gapless(&["config", "--config", &file], &[]);
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

#[tokio::test]
async fn logs_are_json_with_log_format_json_and_filtered_by_log_level() {
    let json = Server::with(Opts {
        memory: true,
        args: vec!["--log-format".into(), "json".into()],
        ..Opts::default()
    })
    .await;
    json.publish("c", "x").await;
    let log = json.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines.iter().any(|v| v["level"] == "WARN"
            && v["message"]
                .as_str()
                .is_some_and(|m| m.contains("running open"))),
        "{log}"
    );
    // --log-level error hides the warning.
    let quiet = Server::with(Opts {
        memory: true,
        args: vec!["--log-level".into(), "error".into()],
        ..Opts::default()
    })
    .await;
    quiet.publish("c", "x").await;
    assert!(!quiet.log().contains("running open"), "{}", quiet.log());
    let bad = gapless(
        &[
            "serve",
            "--memory",
            "--listen",
            "127.0.0.1:0",
            "--log-level",
            "lots==",
        ],
        &[],
    );
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--log-level"));
}
