//! The Durable Streams settings (docs/durable-streams.md): an out-of-range
//! or malformed `--ds-long-poll-timeout-ms`, `--ds-webhook-timeout-ms`,
//! `--ds-max-subscriptions` or `--ds-prefix`, and an unusable
//! `--ds-signing-key`, are refused at start with a message naming the
//! setting and the rule; values at the bounds start. And the catch-up
//! caching the settings decide: `private` once tokens are on, `public` on
//! an open server, on 200 and 304 alike.

use gapless_testkit::Server;
use jsonwebtoken::{EncodingKey, Header};
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const JSON: (&str, &str) = ("content-type", "application/json");

/// Runs `gapless serve --memory --listen 127.0.0.1:0 ARGS` (with `env`) and
/// returns its exit code and standard error, asserting that it exits (a
/// refusal exits at once; a server that starts would run on).
fn refused_with_env(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gapless"));
    cmd.args(["serve", "--memory", "--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, _) in std::env::vars() {
        if k.starts_with("GAPLESS_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("run gapless");
    let t0 = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} {env:?}: the server started instead of refusing the setting");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
        .expect("read stderr");
    assert!(!status.success(), "{args:?} started: {err}");
    (status.code(), err)
}

fn refused(args: &[&str]) -> String {
    refused_with_env(args, &[]).1
}

/// Each bounded number is refused out of its range and when it is not a
/// whole number, naming the flag and the range.
#[test]
fn out_of_range_or_malformed_numbers_are_refused_at_start() {
    for (flag, range, bad) in [
        (
            "--ds-long-poll-timeout-ms",
            "1..=600000",
            &["0", "600001"][..],
        ),
        ("--ds-webhook-timeout-ms", "100..=600000", &["99", "600001"]),
        ("--ds-max-subscriptions", "1..=100000", &["0", "100001"]),
    ] {
        for v in bad {
            let err = refused(&[flag, v]);
            assert!(
                err.contains(flag) && err.contains(range),
                "{flag} {v}: names the flag and the range {range}: {err}"
            );
        }
        for v in ["abc", "-1", "1.5", "", "1e3"] {
            let err = refused(&[&format!("{flag}={v}")]);
            assert!(err.contains(flag), "{flag} {v:?}: names the flag: {err}");
        }
    }
    // From the environment too.
    let (code, err) = refused_with_env(&[], &[("GAPLESS_DS_MAX_SUBSCRIPTIONS", "0")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--ds-max-subscriptions") && err.contains("1..=100000"),
        "{err}"
    );
}

/// A prefix that would hide gapless's own API, could never be reached, or
/// holds a character outside RFC 3986 path characters is refused, saying
/// what a prefix looks like.
#[test]
fn a_malformed_prefix_is_refused_at_start() {
    let long = format!("/{}", "p".repeat(300));
    for (prefix, says) in [
        ("ds", "starting with `/`"),
        ("/", "gapless's own API"),
        ("/v1", "gapless's own API"),
        ("/v1/channels", "gapless's own API (/v1/channels)"),
        ("/v1/ws/x", "gapless's own API (/v1/ws)"),
        ("/v1/sessions", "gapless's own API (/v1/sessions)"),
        ("/healthz", "gapless's own API (/healthz)"),
        ("/a//b", "empty segment"),
        ("/a?b", "holds '?'"),
        ("/a#b", "holds '#'"),
        ("/a%20b", "holds '%'"),
        ("/a b", "holds ' '"),
        ("/é", "holds 'é'"),
        ("/x/__ds", "reserves for its subscription APIs"),
        ("/x/..", "could never be reached"),
        ("/./x", "could never be reached"),
        (long.as_str(), "at most 256"),
    ] {
        let err = refused(&["--ds-prefix", prefix]);
        assert!(
            err.contains("--ds-prefix") && err.contains(says),
            "--ds-prefix {prefix:?}: says {says:?}: {err}"
        );
    }
}

/// The bounds themselves, and a prefix of several segments with the
/// allowed punctuation, start and serve.
#[tokio::test]
async fn values_at_the_bounds_start() {
    let s = Server::memory(&[
        "--ds-long-poll-timeout-ms",
        "600000",
        "--ds-webhook-timeout-ms",
        "100",
        "--ds-max-subscriptions",
        "100000",
        "--ds-prefix",
        "/api/streams-v2:x/",
    ])
    .await;
    let r = s.request("PUT", "/api/streams-v2:x/a", &[JSON], "").await;
    assert_eq!(r.status, 201, "{}", r.text);
    let s = Server::memory(&[
        "--ds-long-poll-timeout-ms",
        "1",
        "--ds-max-subscriptions",
        "1",
    ])
    .await;
    let r = s.request("PUT", "/ds/a", &[JSON], "").await;
    assert_eq!(r.status, 201, "{}", r.text);
}

/// Durable Streams at `/v1/stream`, where the Yjs server of
/// `@durable-streams/y-durable-streams` looks for them (issue 29): the
/// prefix starts, serves streams, and leaves every path of gapless's own
/// API to it. And `gapless_server::OWN_PATHS`, which the check refuses,
/// covers every path of the OpenAPI document, so a new route cannot be
/// hidden by a prefix.
#[tokio::test]
async fn durable_streams_can_live_under_v1_stream() {
    let s = Server::memory(&["--ds-prefix", "/v1/stream"]).await;
    let r = s.request("PUT", "/v1/stream/docs/a", &[JSON], "[1]").await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = s
        .request("GET", "/v1/stream/docs/a?offset=-1", &[], "")
        .await;
    assert_eq!((r.status, r.text.as_str()), (200, "[1]"));
    s.publish("plain", "own API").await;
    let r = s.request("GET", "/v1/channels/plain/events", &[], "").await;
    assert!(r.status == 200 && r.text.contains("own API"), "{}", r.text);
    let doc = s.request("GET", "/v1/openapi.json", &[], "").await;
    assert_eq!(doc.status, 200);
    let doc: serde_json::Value = serde_json::from_str(&doc.text).expect("JSON");
    let paths = doc["paths"].as_object().expect("paths");
    assert!(paths.len() >= 10, "{paths:?}");
    for path in paths.keys().filter(|p| p.as_str() != "/") {
        assert!(
            gapless_server::OWN_PATHS
                .iter()
                .any(|own| path == own || path.starts_with(&format!("{own}/"))),
            "{path} is gapless's own but not in OWN_PATHS: a --ds-prefix could hide it"
        );
    }
}

/// `--ds-signing-key` names a PKCS#8 PEM Ed25519 key that must exist: a
/// missing file, a file that is not such a key, or a damaged generated key
/// in the data directory is refused at start naming the file and how to
/// make one. A key made by `openssl genpkey -algorithm ed25519` is used:
/// the JWK Set publishes its public key.
#[tokio::test]
async fn the_signing_key_file_is_checked_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("none.pem");
    let missing = missing.to_str().expect("utf-8");
    let err = refused(&["--ds-signing-key", missing]);
    assert!(
        err.contains(missing) && err.contains("openssl genpkey -algorithm ed25519"),
        "{err}"
    );
    let junk = dir.path().join("junk.pem");
    std::fs::write(
        &junk,
        "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n",
    )
    .expect("write");
    let junk = junk.to_str().expect("utf-8");
    let err = refused(&["--ds-signing-key", junk]);
    assert!(
        err.contains("--ds-signing-key")
            && err.contains(junk)
            && err.contains("is not an Ed25519 private key in PKCS#8 PEM"),
        "{err}"
    );
    // The generated key in a data directory, damaged: refused, not replaced.
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("mkdir");
    std::fs::write(data.join("ds-signing-key.pem"), "garbage").expect("write");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gapless"));
    let out = cmd
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .env_remove("GAPLESS_DS_SIGNING_KEY")
        .output()
        .expect("run gapless");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started with a damaged key: {err}");
    assert!(
        err.contains("ds-signing-key.pem") && err.contains("is not an Ed25519 private key"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(data.join("ds-signing-key.pem")).expect("read"),
        "garbage",
        "a damaged key is never overwritten"
    );

    // A key made by openssl, when it is installed.
    let made = dir.path().join("openssl.pem");
    let ok = Command::new("openssl")
        .args(["genpkey", "-algorithm", "ed25519", "-out"])
        .arg(&made)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIP the openssl key: openssl is not installed");
        return;
    }
    let der = Command::new("openssl")
        .args(["pkey", "-pubout", "-outform", "DER", "-in"])
        .arg(&made)
        .output()
        .expect("openssl pkey");
    let public = &der.stdout[der.stdout.len() - 32..];
    let s = Server::memory(&["--ds-signing-key", made.to_str().expect("utf-8")]).await;
    let jwks = s.request("GET", "/ds/__ds/jwks.json", &[], "").await;
    assert_eq!(jwks.status, 200, "{}", jwks.text);
    use base64::Engine as _;
    let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(public);
    assert_eq!(jwks.json["keys"][0]["x"], x.as_str(), "{}", jwks.text);
    assert_eq!(jwks.json["keys"][0]["crv"], "Ed25519");
}

const SECRET: &str = "a-test-secret-that-is-long-enough-32";

fn token() -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        + 3600;
    let claims = json!({"exp": exp, "gapless": {"subscribe": ["*"], "publish": ["*"]}});
    jsonwebtoken::encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()).expect("key"),
    )
    .expect("signing")
}

/// Catch-up reads that need a token are `private` (a shared cache must not
/// hand one reader's answer to another), on 200 and on the 304 of a
/// revalidation alike; an open server's are `public` (PROTOCOL.md 10.1).
#[tokio::test]
async fn catch_up_reads_are_private_once_tokens_are_on() {
    for (args, auth, want) in [
        (
            vec!["--jwt-secret", SECRET],
            Some(format!("Bearer {}", token())),
            "private, max-age=60, stale-while-revalidate=300",
        ),
        (
            vec![],
            None,
            "public, max-age=60, stale-while-revalidate=300",
        ),
    ] {
        let s = Server::memory(&args).await;
        let mut h = vec![JSON];
        if let Some(a) = &auth {
            h.push(("authorization", a.as_str()));
        }
        let r = s.request("PUT", "/ds/c/a", &h, r#"[{"n":1}]"#).await;
        assert_eq!(r.status, 201, "{}", r.text);
        let read = s.request("GET", "/ds/c/a?offset=-1", &h, "").await;
        assert_eq!(read.status, 200, "{}", read.text);
        assert_eq!(read.header("cache-control"), Some(want), "{args:?}: 200");
        let etag = read.header("etag").expect("an ETag").to_owned();
        let mut h304 = h.clone();
        h304.push(("if-none-match", etag.as_str()));
        let again = s.request("GET", "/ds/c/a?offset=-1", &h304, "").await;
        assert_eq!(again.status, 304, "{}", again.text);
        assert_eq!(again.header("cache-control"), Some(want), "{args:?}: 304");
        let live = s
            .request("GET", "/ds/c/a?offset=-1&live=long-poll", &h, "")
            .await;
        assert_eq!(live.status, 200, "{}", live.text);
        assert_eq!(
            live.header("cache-control"),
            Some(want),
            "{args:?}: long-poll"
        );
    }
}

/// Nothing of Durable Streams lives in events that retention evicts (a
/// stream's metadata and a subscription's state are their channels'
/// metadata), so a low retention is not warned about.
#[tokio::test]
async fn a_low_retention_needs_no_warning_for_durable_streams() {
    let low = Server::start(&["--retention-events", "20"]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !low.log().contains("below what its records need"),
        "{}",
        low.log()
    );
}
