//! The client subcommands of the `gapless` binary: `publish` (argument,
//! stdin lines, JSON-lines file, batching, summaries), `history` and `tail`
//! output (plain and `--json`), gap notices on stderr, and one-line errors.

use gapless_testkit::clients::{self, Tail};
use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Runs `gapless ARGS` with `stdin`, for at most 30 s.
fn gapless(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(gapless_testkit::bin())
        .args(args)
        .env_remove("GAPLESS_SERVER")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().expect("output");
    let _ = writer.join();
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "status {:?}; stderr: {}",
        out.status,
        text(&out.stderr)
    );
    text(&out.stdout)
}

#[tokio::test]
async fn publish_an_argument_stdin_lines_and_a_file_then_read_history() {
    let server = clients::memory(&[]).await;
    let base = server.base();
    let s = ["--server", base.as_str()];
    let out = gapless(
        &[
            &["publish", "c", "hello world", "--type", "greeting"][..],
            &s,
        ]
        .concat(),
        b"",
    );
    let line = ok(&out);
    assert!(line.starts_with("published to c: seq 1, cursor "), "{line}");

    let out = gapless(
        &[&["publish", "c", "-"][..], &s].concat(),
        b"l1\nl2\r\n\nl4",
    );
    let line = ok(&out);
    assert!(
        line.starts_with("published 4 events to c: seq 2 to 5 in 1 batch"),
        "{line}"
    );

    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("events.jsonl");
    std::fs::write(
        &file,
        "{\"data\":\"f1\",\"type\":\"t1\"}\n\n{\"data\":\"two\\nlines\"}\n",
    )
    .expect("write");
    let path = file.display().to_string();
    let out = gapless(&[&["publish", "c", "--file", &path][..], &s].concat(), b"");
    assert!(ok(&out).starts_with("published 2 events to c: seq 6 to 7"));

    let out = gapless(&[&["history", "c"][..], &s].concat(), b"");
    assert_eq!(ok(&out), "hello world\nl1\nl2\n\nl4\nf1\ntwo\nlines\n");

    let out = gapless(
        &[&["history", "c", "--json", "--page-size", "2"][..], &s].concat(),
        b"",
    );
    let rows: Vec<serde_json::Value> = ok(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(rows.len(), 7);
    assert_eq!(rows[0]["channel"], "c");
    assert_eq!(rows[0]["seq"], 1);
    assert_eq!(rows[0]["type"], "greeting");
    assert_eq!(rows[0]["data"], "hello world");
    assert!(rows[0]["cursor"].as_str().is_some_and(|c| !c.is_empty()));
    assert_eq!(rows[5]["type"], "t1");
    assert_eq!(rows[6]["data"], "two\nlines");
    assert!(rows[6]["type"].is_null());

    // --after reads the rest.
    let after = rows[4]["cursor"].as_str().expect("cursor");
    let out = gapless(&[&["history", "c", "--after", after][..], &s].concat(), b"");
    assert_eq!(ok(&out), "f1\ntwo\nlines\n");
}

#[tokio::test]
async fn a_long_import_is_sent_in_batches_and_a_rerun_with_the_same_key_appends_nothing() {
    let server = clients::memory(&[]).await;
    let base = server.base();
    let s = ["--server", base.as_str()];
    let input: String = (1..=1200).map(|i| format!("line {i}\n")).collect();
    let args = [
        &[
            "publish",
            "big",
            "-",
            "--batch-size",
            "500",
            "--idempotency-key",
            "imp",
        ][..],
        &s,
    ]
    .concat();
    let line = ok(&gapless(&args, input.as_bytes()));
    assert!(
        line.starts_with("published 1200 events to big: seq 1 to 1200 in 3 batches"),
        "{line}"
    );
    let line = ok(&gapless(&args, input.as_bytes()));
    assert!(
        line.contains(
            "published no new event to big (1200 already published with the same idempotency keys)"
        ),
        "{line}"
    );
    let out = ok(&gapless(&[&["history", "big"][..], &s].concat(), b""));
    assert_eq!(out, input);
}

#[tokio::test]
async fn errors_are_one_line_that_says_what_to_do() {
    // Nothing listens on port 9 of localhost (discard is not served here).
    let out = gapless(
        &["publish", "c", "x", "--server", "http://127.0.0.1:9"],
        b"",
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "gapless: cannot reach http://127.0.0.1:9 (connection refused): is the server running? start it with `gapless serve`, or point --server (or GAPLESS_SERVER) at it\n"
    );
    // The environment variable names the server too.
    let out = Command::new(gapless_testkit::bin())
        .args(["history", "c"])
        .env("GAPLESS_SERVER", "http://127.0.0.1:9")
        .output()
        .expect("run");
    assert!(text(&out.stderr).starts_with("gapless: cannot reach http://127.0.0.1:9 "));

    let server = clients::memory(&[]).await;
    let base = server.base();
    let s = ["--server", base.as_str()];
    let out = gapless(&[&["publish", "bad channel", "x"][..], &s].concat(), b"");
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("channel name contains ' ' at position 4"),
        "{err}"
    );

    let out = gapless(
        &[&["tail", "c", "--since", "garbage"][..], &s].concat(),
        b"",
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err.starts_with("gapless: the server refused the cursor"),
        "{err}"
    );
    assert!(err.contains("--since earliest"), "{err}");

    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("bad.jsonl");
    std::fs::write(&file, "{\"data\":\"ok\"}\n{\"dta\":\"typo\"}\n").expect("write");
    let path = file.display().to_string();
    let out = gapless(&[&["publish", "c", "--file", &path][..], &s].concat(), b"");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err.contains("bad.jsonl line 2: expected a JSON object {\"data\": text"),
        "{err}"
    );
    // A line of the fields by position (serde's array form) is no documented shape.
    std::fs::write(&file, "{\"data\":\"ok\"}\n[\"x\", null]\n").expect("write");
    let out = gapless(&[&["publish", "c", "--file", &path][..], &s].concat(), b"");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("bad.jsonl line 2: expected a JSON object"),
        "{err}"
    );

    let out = gapless(&[&["publish", "c"][..], &s].concat(), b"");
    assert!(text(&out.stderr).contains("nothing to publish"));

    let out = gapless(
        &["history", "c", "--server", "https://example.invalid"],
        b"",
    );
    assert!(text(&out.stderr).contains("plain http only"));
}

#[tokio::test]
async fn tail_prints_plain_and_json_lines_gaps_on_stderr_and_resumes_from_a_cursor() {
    let server = clients::memory(&["--retention-events", "3"]).await;
    let base = server.base();
    let s = ["--server", base.as_str()];
    for d in ["a", "multi\nline", "c"] {
        ok(&gapless(&[&["publish", "t", d][..], &s].concat(), b""));
    }
    // Plain: data as is, one event per line (so a multi-line event spans lines).
    let tail = Tail::start(&[&["t", "--since", "earliest"][..], &s].concat());
    tail.wait_for(4, 20).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        *tail.lines.lock().expect("lock"),
        ["a", "multi", "line", "c"]
    );
    drop(tail);

    // JSON, then resume after the second event's cursor.
    let tail = Tail::start(&[&["t", "--since", "earliest", "--json"][..], &s].concat());
    tail.wait_for(3, 20).await;
    let rows: Vec<serde_json::Value> = tail
        .lines
        .lock()
        .expect("lock")
        .iter()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    drop(tail);
    for (row, (seq, data)) in rows.iter().zip([(1, "a"), (2, "multi\nline"), (3, "c")]) {
        assert_eq!(row["channel"], "t");
        assert_eq!(row["seq"], seq);
        assert_eq!(row["data"], data);
        assert!(row["type"].is_null());
        assert!(row["cursor"].as_str().is_some());
    }
    let first = rows[0]["cursor"].as_str().expect("cursor").to_owned();
    let second = rows[1]["cursor"].as_str().expect("cursor").to_owned();
    let tail = Tail::start(&[&["t", "--since", second.as_str()][..], &s].concat());
    tail.wait_for(1, 20).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(*tail.lines.lock().expect("lock"), ["c"]);
    drop(tail);

    // Retention passes the first cursor: the gap goes to stderr, the rest to stdout.
    for d in ["d", "e"] {
        ok(&gapless(&[&["publish", "t", d][..], &s].concat(), b""));
    }
    let tail = Tail::start(&[&["t", "--since", first.as_str()][..], &s].concat());
    gapless_testkit::eventually(
        "a gap notice on stderr",
        Duration::from_secs(20),
        || async {
            tail.stderr
                .lock()
                .expect("lock")
                .iter()
                .any(|l| l.contains("gap on t (evicted)"))
        },
    )
    .await;
    ok(&gapless(&[&["publish", "t", "f"][..], &s].concat(), b""));
    tail.wait_for(1, 20).await;
    assert_eq!(*tail.lines.lock().expect("lock"), ["f"]);
}

#[tokio::test]
async fn a_token_ttl_that_overflows_is_refused() {
    let secret = "a-test-secret-that-is-long-enough-32";
    for ttl in ["18446744073709551615", "9007199254740991"] {
        let out = gapless(
            &[
                "token",
                "--secret",
                secret,
                "--subscribe",
                "*",
                "--ttl",
                ttl,
            ],
            b"",
        );
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "--ttl {ttl}: {err}");
        assert!(err.contains("--ttl") && err.contains("too long"), "{err}");
        assert!(out.stdout.is_empty(), "no token printed");
    }
    // A long but representable TTL still makes a token.
    let out = gapless(
        &[
            "token",
            "--secret",
            secret,
            "--subscribe",
            "*",
            "--ttl",
            "3153600000",
        ],
        b"",
    );
    assert!(!ok(&out).trim().is_empty());
}

#[tokio::test]
async fn publish_help_says_a_rerun_appends_nothing_twice_only_while_retained() {
    let out = gapless(&["publish", "--help"], b"");
    let help = ok(&out).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains("appends nothing twice while the events it appended are still retained"),
        "{help}"
    );
}

/// A token the server refuses is reported as refused, with the server's
/// reason, not as missing (issue 29: "pass --token" though one was
/// passed); without one, the command says to pass one.
#[tokio::test]
async fn a_refused_token_is_told_apart_from_a_missing_one() {
    let secret = "a-test-secret-that-is-long-enough-32";
    let server = clients::memory(&["--jwt-secret", secret]).await;
    let base = server.base();
    for cmd in [
        vec!["tail", "c", "--token", "garbage", "--server", base.as_str()],
        vec![
            "publish",
            "c",
            "x",
            "--token",
            "garbage",
            "--server",
            base.as_str(),
        ],
    ] {
        let out = gapless(&cmd, b"");
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("refused the token")
                && err.contains("not a JWT")
                && !err.contains("pass --token"),
            "{cmd:?}: {err}"
        );
    }
    let out = gapless(&["tail", "c", "--server", base.as_str()], b"");
    let err = text(&out.stderr);
    assert!(err.contains("pass --token"), "{err}");
}

#[tokio::test]
async fn tail_at_token_expiry_says_why_first_and_how_to_resume() {
    let secret = "a-test-secret-that-is-long-enough-32";
    let server = clients::memory(&["--jwt-secret", secret, "--jwt-leeway-ms", "0"]).await;
    let token = ok(&gapless(
        &[
            "token",
            "--secret",
            secret,
            "--subscribe",
            "*",
            // Long enough that a loaded machine still starts `tail` before
            // the token expires (with 2 s it sometimes did not, and the
            // refusal came at connect instead of during the stream).
            "--ttl",
            "5",
        ],
        b"",
    ));
    let out = gapless(
        &[
            "tail",
            "c",
            "--token",
            token.trim(),
            "--server",
            server.base().as_str(),
        ],
        b"",
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        lines.first().is_some_and(|l| l.contains("token expired")),
        "the reason first: {err}"
    );
    assert!(!err.contains("reconnecting in"), "{err}");
    assert!(
        lines.iter().any(
            |l| l.contains("refused the token given by --token") && l.contains("gapless token")
        ),
        "what to do: {err}"
    );
    assert!(
        lines
            .last()
            .is_some_and(|l| l.contains("resume with --since")),
        "{err}"
    );
}
