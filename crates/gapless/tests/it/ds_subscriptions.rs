//! Durable Streams subscriptions are durable and shared
//! (docs/durable-streams.md, "Subscriptions"): a subscription's definition,
//! links, `acked_offset`s, generation, wake, lease, failed status and retry
//! schedule survive a `kill -9`, and so does the webhook signing key (the JWK
//! Set stays the same); in a cluster a subscription made on one node is
//! read, delivered and acked through another, each wake is sent once (not
//! once per node), and two workers claiming through two nodes never both
//! get the lease.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use gapless_testkit::redis::Redis;
use gapless_testkit::{eventually, Opts, Server};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

const JSON: (&str, &str) = ("content-type", "application/json");
const WAIT: Duration = Duration::from_secs(30);

/// How the test's webhook receiver answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// 200 `{"done": true}`: the server acks the wake's tails.
    Done,
    /// 200 `{}`: processing asynchronously; the test calls back.
    Async,
    /// 500: a failed delivery.
    Fail,
}

/// One webhook request the receiver got.
struct Got {
    at: Instant,
    signature: String,
    body: Vec<u8>,
    json: Value,
}

/// A webhook receiver on 127.0.0.1 (the server needs
/// `--ds-webhook-allow-loopback`), answering as its mode says.
struct Hook {
    url: String,
    mode: Arc<Mutex<Mode>>,
    got: mpsc::UnboundedReceiver<Got>,
}

impl Hook {
    async fn start(mode: Mode) -> Hook {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
        let mode = Arc::new(Mutex::new(mode));
        let (tx, got) = mpsc::unbounded_channel();
        let m = mode.clone();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let (tx, m) = (tx.clone(), m.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 8192];
                    let (head, body) = loop {
                        let Ok(k) = sock.read(&mut chunk).await else {
                            return;
                        };
                        if k == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..k]);
                        let text = String::from_utf8_lossy(&buf).to_string();
                        if let Some(end) = text.find("\r\n\r\n") {
                            let len = header_of(&text[..end], "content-length")
                                .and_then(|v| v.parse::<usize>().ok())
                                .unwrap_or(0);
                            if buf.len() >= end + 4 + len {
                                break (
                                    text[..end].to_owned(),
                                    buf[end + 4..end + 4 + len].to_vec(),
                                );
                            }
                        }
                    };
                    let mode = *m.lock().expect("mode");
                    let _ = tx.send(Got {
                        at: Instant::now(),
                        signature: header_of(&head, "webhook-signature").unwrap_or_default(),
                        json: serde_json::from_slice(&body).unwrap_or(Value::Null),
                        body,
                    });
                    let answer = match mode {
                        Mode::Fail => "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_owned(),
                        Mode::Done | Mode::Async => {
                            let b = if mode == Mode::Done { r#"{"done":true}"# } else { "{}" };
                            format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{b}",
                                b.len()
                            )
                        }
                    };
                    let _ = sock.write_all(answer.as_bytes()).await;
                });
            }
        });
        Hook { url, mode, got }
    }

    fn set(&self, mode: Mode) {
        *self.mode.lock().expect("mode") = mode;
    }

    /// The next webhook request, within [`WAIT`].
    async fn next(&mut self) -> Got {
        tokio::time::timeout(WAIT, self.got.recv())
            .await
            .expect("a webhook request in time")
            .expect("the receiver runs")
    }

    /// A webhook request within `within`, if any.
    async fn maybe(&mut self, within: Duration) -> Option<Got> {
        tokio::time::timeout(within, self.got.recv())
            .await
            .ok()
            .flatten()
    }
}

fn header_of(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

/// Checks a `Webhook-Signature` (`t=…,kid=…,ed25519=…`, Ed25519 over
/// `t.body`) against the key of its `kid` in `jwks`.
fn verify(jwks: &Value, got: &Got) {
    use ed25519_dalek::{Signature, Verifier as _, VerifyingKey};
    let part = |k: &str| {
        got.signature
            .split(',')
            .find_map(|p| p.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k} in {:?}", got.signature))
            .to_owned()
    };
    let (t, kid, sig) = (part("t"), part("kid"), part("ed25519"));
    let jwk = jwks["keys"]
        .as_array()
        .and_then(|ks| ks.iter().find(|k| k["kid"] == kid.as_str()))
        .unwrap_or_else(|| panic!("kid {kid} is in the JWK Set {jwks}"));
    let x: [u8; 32] = URL_SAFE_NO_PAD
        .decode(jwk["x"].as_str().expect("x"))
        .expect("base64url")
        .try_into()
        .expect("32 bytes");
    let key = VerifyingKey::from_bytes(&x).expect("a public key");
    let sig =
        Signature::from_slice(&URL_SAFE_NO_PAD.decode(sig).expect("base64url")).expect("64 bytes");
    let mut msg = format!("{t}.").into_bytes();
    msg.extend_from_slice(&got.body);
    assert!(
        key.verify(&msg, &sig).is_ok(),
        "the webhook's signature verifies with the published key"
    );
}

async fn put(s: &Server, path: &str, body: &str) -> String {
    let r = s.request("PUT", path, &[JSON], body).await;
    assert!(r.status == 201 || r.status == 200, "PUT {path}: {}", r.text);
    r.header("stream-next-offset")
        .unwrap_or_default()
        .to_owned()
}

async fn append(s: &Server, path: &str, body: &str) -> String {
    let r = s.request("POST", path, &[JSON], body).await;
    assert_eq!(r.status, 204, "POST {path}: {}", r.text);
    r.header("stream-next-offset").expect("offset").to_owned()
}

/// Waits until `GET sub` shows `acked` as the acked offset of `path`.
async fn acked(s: &Server, sub: &str, path: &str, offset: &str) {
    eventually(&format!("{path} acked at {offset}"), WAIT, || async {
        let g = s.request("GET", sub, &[], "").await;
        g.json["streams"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|l| l["path"] == path && l["acked_offset"] == offset)
    })
    .await;
}

/// The callback of a webhook wake (`acks` of `(path, offset)`), sent to `s`.
async fn callback(s: &Server, sub: &str, wake: &Value, acks: &[(&str, &str)], done: bool) -> u16 {
    let auth = format!(
        "Bearer {}",
        wake["callback_token"].as_str().expect("callback_token")
    );
    let acks: Vec<Value> = acks
        .iter()
        .map(|(p, o)| json!({"stream": p, "offset": o}))
        .collect();
    let body = json!({"wake_id": wake["wake_id"], "generation": wake["generation"],
                      "acks": acks, "done": done});
    let r = s
        .request(
            "POST",
            &format!("{sub}/callback"),
            &[JSON, ("authorization", &auth)],
            &body.to_string(),
        )
        .await;
    r.status
}

/// A webhook subscription, its acked offsets, its generation and the signing
/// key (the JWK Set) survive a `kill -9`: after the restart the
/// subscription reads the same, the next wake continues at the next
/// generation from the acked offset (nothing replayed) and verifies with the
/// JWK Set published before; the generated key file is private (0600).
#[tokio::test]
async fn a_webhook_subscription_and_the_signing_key_survive_a_kill_9() {
    let mut s = Server::start(&["--ds-webhook-allow-loopback"]).await;
    let mut hook = Hook::start(Mode::Done).await;
    put(&s, "/ds/w/a", "").await;
    let sub = "/ds/w/__ds/subscriptions/durable";
    let def = json!({"type": "webhook", "pattern": "*", "streams": ["later/b"],
                     "webhook": {"url": hook.url}, "description": "kept"});
    let r = s.request("PUT", sub, &[JSON], &def.to_string()).await;
    assert_eq!(r.status, 201, "{}", r.text);
    let jwks = s.request("GET", "/ds/w/__ds/jwks.json", &[], "").await.json;

    let tail1 = append(&s, "/ds/w/a", r#"{"n":1}"#).await;
    let w1 = hook.next().await;
    verify(&jwks, &w1);
    assert_eq!(w1.json["streams"][0]["path"], "a", "{}", w1.json);
    assert_eq!(w1.json["streams"][0]["tail_offset"], tail1.as_str());
    acked(&s, sub, "a", &tail1).await;
    let before = s.request("GET", sub, &[], "").await.json;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let key = s.data_dir().join("ds-signing-key.pem");
        let mode = std::fs::metadata(&key)
            .expect("the key file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "the generated key is private");
    }

    s.kill9().await;
    s.restart().await;

    let after = s.request("GET", sub, &[], "").await;
    assert_eq!(
        after.status, 200,
        "the subscription is known after the restart: {}",
        after.text
    );
    assert_eq!(after.json, before, "the same subscription");
    assert_eq!(
        s.request("GET", "/ds/w/__ds/jwks.json", &[], "").await.json,
        jwks,
        "the same JWK Set"
    );
    let r = s.request("PUT", sub, &[JSON], &def.to_string()).await;
    assert_eq!(r.status, 200, "re-confirmed: {}", r.text);
    // The records' channel is not reachable through gapless's own API.
    let h = s.history("gapless%2Fds-subscriptions", "").await;
    assert_eq!(h.status, 400, "{}", h.text);

    let tail2 = append(&s, "/ds/w/a", r#"{"n":2}"#).await;
    let w2 = hook.next().await;
    verify(&jwks, &w2);
    assert_eq!(
        w2.json["generation"].as_u64(),
        w1.json["generation"].as_u64().map(|g| g + 1),
        "the next generation: {}",
        w2.json
    );
    assert_eq!(
        w2.json["streams"][0]["acked_offset"],
        tail1.as_str(),
        "nothing replayed"
    );
    assert_eq!(w2.json["streams"][0]["tail_offset"], tail2.as_str());
    acked(&s, sub, "a", &tail2).await;
    // A stream created after the restart that matches the pattern wakes it.
    put(&s, "/ds/w/c", "").await;
    let tail_c = append(&s, "/ds/w/c", r#"{"c":1}"#).await;
    let w3 = hook.next().await;
    assert!(
        w3.json["streams"].as_array().is_some_and(|a| a
            .iter()
            .any(|l| l["path"] == "c" && l["tail_offset"] == tail_c.as_str())),
        "{}",
        w3.json
    );
}

/// A failing webhook's `failed` status, generation and retry schedule
/// survive a `kill -9` (PROTOCOL.md 7.1: retry metadata, `next_attempt_at`
/// included, persists): after the restart the next attempt comes no earlier
/// than the backoff scheduled before it, then succeeds.
#[tokio::test]
async fn a_failing_webhooks_retry_schedule_survives_a_kill_9() {
    let mut s = Server::start(&["--ds-webhook-allow-loopback"]).await;
    let mut hook = Hook::start(Mode::Fail).await;
    put(&s, "/ds/f/a", "").await;
    let sub = "/ds/f/__ds/subscriptions/retry";
    // `failed` shows from the first failure on, also while the next wake is
    // in flight, so the kill below may land after the second wake was
    // recorded and before its failure was: that wake is then lost with the
    // process and issued again when its lease ends (the at-least-once rule
    // of docs/durable-streams.md). A 2 s lease keeps that path as short as
    // the backoff (with the 30 s default the test waited 30 s, about one
    // run in two); either way the next attempt comes at least 1.5 s after
    // the second.
    let def = json!({"type": "webhook", "pattern": "*", "webhook": {"url": hook.url}, "lease_ttl_ms": 2000});
    let r = s.request("PUT", sub, &[JSON], &def.to_string()).await;
    assert_eq!(r.status, 201, "{}", r.text);
    let tail = append(&s, "/ds/f/a", r#"{"n":1}"#).await;
    // Two failures: the next attempt is scheduled 2 s (±20 %) after the second.
    let first = hook.next().await;
    let second = hook.next().await;
    assert!(second.json["generation"].as_u64() > first.json["generation"].as_u64());
    eventually("the second failure recorded", WAIT, || async {
        let g = s.request("GET", sub, &[], "").await.json;
        g["status"] == "failed" && g["generation"] == second.json["generation"]
    })
    .await;
    s.kill9().await;
    // Whatever attempt comes next succeeds. Set before the restart: on a
    // loaded machine the restart may take longer than the backoff, and the
    // retry may then come before the GET below.
    hook.set(Mode::Done);
    s.restart().await;
    let g = s.request("GET", sub, &[], "").await;
    assert_eq!(g.status, 200, "{}", g.text);
    if g.json["generation"] == second.json["generation"] {
        assert_eq!(
            g.json["status"], "failed",
            "still failed after the restart: {}",
            g.text
        );
    } else {
        assert!(
            g.json["generation"].as_u64() > second.json["generation"].as_u64(),
            "the generation never goes back: {}",
            g.text
        );
    }
    let third = hook.next().await;
    let waited = third.at.duration_since(second.at);
    assert!(
        waited >= Duration::from_millis(1500),
        "the retry schedule held across the restart: the next attempt came {waited:?} after the \
         second failure (the backoff was at least 1.6 s)"
    );
    assert!(third.json["generation"].as_u64() > second.json["generation"].as_u64());
    acked(&s, sub, "a", &tail).await;
    let g = s.request("GET", sub, &[], "").await;
    assert_eq!(g.json["status"], "active", "{}", g.text);
}

/// A wake in flight at a `kill -9` keeps its lease and token: its callback
/// (a heartbeat) after the restart is accepted. When its lease then ends
/// without a `done`, the wake is issued again with the next generation
/// (at-least-once), and the old token is fenced.
#[tokio::test]
async fn a_wake_in_flight_survives_a_kill_9_and_is_reissued_when_its_lease_ends() {
    let mut s = Server::start(&["--ds-webhook-allow-loopback"]).await;
    let mut hook = Hook::start(Mode::Async).await;
    put(&s, "/ds/l/a", "").await;
    let sub = "/ds/l/__ds/subscriptions/lease";
    let def = json!({"type": "webhook", "pattern": "*", "webhook": {"url": hook.url},
                     "lease_ttl_ms": 5000});
    let r = s.request("PUT", sub, &[JSON], &def.to_string()).await;
    assert_eq!(r.status, 201, "{}", r.text);
    let tail = append(&s, "/ds/l/a", r#"{"n":1}"#).await;
    let w1 = hook.next().await;
    s.kill9().await;
    s.restart().await;
    // The token issued before the restart still works: a heartbeat.
    assert_eq!(callback(&s, sub, &w1.json, &[], false).await, 200);
    // No done: the lease ends, and the wake is issued again.
    let w2 = hook.next().await;
    assert!(
        w2.json["generation"].as_u64() > w1.json["generation"].as_u64(),
        "{} then {}",
        w1.json,
        w2.json
    );
    assert_ne!(w2.json["wake_id"], w1.json["wake_id"]);
    assert_eq!(w2.json["streams"][0]["tail_offset"], tail.as_str());
    assert_eq!(
        callback(&s, sub, &w1.json, &[("a", &tail)], true).await,
        409,
        "the old wake is fenced"
    );
    assert_eq!(
        callback(&s, sub, &w2.json, &[("a", &tail)], true).await,
        200
    );
    acked(&s, sub, "a", &tail).await;
}

async fn claim(s: &Server, sub: &str, worker: &str) -> gapless_testkit::Resp {
    let body = json!({ "worker": worker }).to_string();
    s.request("POST", &format!("{sub}/claim"), &[JSON], &body)
        .await
}

/// A pull-wake worker's claim (its lease) survives a `kill -9`: another
/// worker is refused with `ALREADY_CLAIMED` after the restart, and the
/// holder's ack with the token from before it moves `acked_offset`.
#[tokio::test]
async fn a_pull_wake_claim_survives_a_kill_9() {
    let mut s = Server::start(&[]).await;
    put(&s, "/ds/p/wake", "").await;
    put(&s, "/ds/p/jobs/1", "").await;
    let sub = "/ds/p/__ds/subscriptions/workers";
    let def =
        r#"{"type":"pull-wake","pattern":"jobs/*","wake_stream":"wake","lease_ttl_ms":60000}"#;
    let r = s.request("PUT", sub, &[JSON], def).await;
    assert_eq!(r.status, 201, "{}", r.text);
    let tail = append(&s, "/ds/p/jobs/1", r#"{"job":1}"#).await;
    eventually("a wake event", WAIT, || async {
        let w = s.request("GET", "/ds/p/wake?offset=-1", &[], "").await;
        w.json
            .as_array()
            .is_some_and(|a| a.iter().any(|e| e["stream"] == "jobs/1"))
    })
    .await;
    let c = claim(&s, sub, "w1").await;
    assert_eq!(c.status, 200, "{}", c.text);

    s.kill9().await;
    s.restart().await;

    let other = claim(&s, sub, "w2").await;
    assert_eq!(other.status, 409, "{}", other.text);
    assert_eq!(other.json["error"]["code"], "ALREADY_CLAIMED");
    assert_eq!(other.json["error"]["current_holder"], "w1");
    assert_eq!(other.json["error"]["generation"], c.json["generation"]);
    let auth = format!("Bearer {}", c.json["token"].as_str().expect("token"));
    let ack = json!({"wake_id": c.json["wake_id"], "generation": c.json["generation"],
                     "acks": [{"stream": "jobs/1", "offset": tail}], "done": true});
    let a = s
        .request(
            "POST",
            &format!("{sub}/ack"),
            &[JSON, ("authorization", &auth)],
            &ack.to_string(),
        )
        .await;
    assert_eq!(a.status, 200, "{}", a.text);
    assert_eq!(a.json, json!({"ok": true, "next_wake": false}));
    acked(&s, sub, "jobs/1", &tail).await;
}

/// Two nodes sharing a Redis journal and one `--ds-signing-key` file: both
/// publish the same JWK Set; a subscription created on one is read,
/// delivered and acked through the other; every wake is sent once (its
/// generation never twice, however many nodes run); two workers claiming
/// through two nodes at once get one lease; and when a node dies, the
/// other keeps delivering.
#[tokio::test]
async fn a_cluster_shares_subscriptions_and_delivers_each_wake_once() {
    let Some(redis) = Redis::start_or_skip("ds subscriptions cluster").await else {
        return;
    };
    // A key file, made by a server with a data directory.
    let keys = Server::start(&[]).await;
    let key_file = keys.scratch("ds-signing-key.pem");
    std::fs::copy(keys.data_dir().join("ds-signing-key.pem"), &key_file).expect("copy the key");
    let node = || async {
        Server::with(Opts {
            args: vec![
                "--redis".to_owned(),
                redis.url(),
                "--ds-webhook-allow-loopback".to_owned(),
                "--ds-signing-key".to_owned(),
                key_file.display().to_string(),
            ],
            ..Opts::default()
        })
        .await
    };
    let mut a = node().await;
    let b = node().await;
    let jwks = a.request("GET", "/ds/c/__ds/jwks.json", &[], "").await.json;
    assert_eq!(
        b.request("GET", "/ds/c/__ds/jwks.json", &[], "").await.json,
        jwks
    );
    assert_eq!(
        keys.request("GET", "/ds/c/__ds/jwks.json", &[], "")
            .await
            .json,
        jwks,
        "the key file's key"
    );

    let mut hook = Hook::start(Mode::Async).await;
    put(&a, "/ds/c/s1", "").await;
    let sub = "/ds/c/__ds/subscriptions/shared";
    let def = json!({"type": "webhook", "pattern": "*", "webhook": {"url": hook.url}});
    let r = a.request("PUT", sub, &[JSON], &def.to_string()).await;
    assert_eq!(r.status, 201, "{}", r.text);
    let on_b = b.request("GET", sub, &[], "").await;
    assert_eq!(on_b.status, 200, "known on b at once: {}", on_b.text);
    assert_eq!(on_b.json["webhook"]["url"], hook.url.as_str());
    let r = b.request("PUT", sub, &[JSON], &def.to_string()).await;
    assert_eq!(r.status, 200, "re-confirmed on b: {}", r.text);

    let mut generations = Vec::new();
    for n in 0..3 {
        let tail = append(&b, "/ds/c/s1", &json!({ "n": n }).to_string()).await;
        let w = hook.next().await;
        verify(&jwks, &w);
        assert_eq!(
            w.json["streams"][0]["tail_offset"],
            tail.as_str(),
            "{}",
            w.json
        );
        generations.push(w.json["generation"].as_u64().expect("generation"));
        // Acked through b (whichever node sent it), and seen on a.
        assert_eq!(
            callback(&b, sub, &w.json, &[("s1", &tail)], true).await,
            200
        );
        acked(&a, sub, "s1", &tail).await;
        // Nothing more for this wake, from any node.
        if let Some(extra) = hook.maybe(Duration::from_millis(700)).await {
            panic!(
                "a second webhook for one wake: {} after {}",
                extra.json, w.json
            );
        }
    }
    assert!(
        generations.windows(2).all(|g| g[1] > g[0]),
        "one generation per wake: {generations:?}"
    );

    two_workers_claim_through_two_nodes(&a, &b).await;

    // The node that created the subscription dies: the other delivers.
    a.kill9().await;
    let tail = append(&b, "/ds/c/s1", r#"{"n":"after"}"#).await;
    let w = hook.next().await;
    assert_eq!(
        w.json["streams"][0]["tail_offset"],
        tail.as_str(),
        "{}",
        w.json
    );
    assert!(w.json["generation"].as_u64() > generations.last().copied());
    assert_eq!(
        callback(&b, sub, &w.json, &[("s1", &tail)], true).await,
        200
    );
}

/// Two workers claim through two nodes at once: one lease (another root,
/// so its wake events wake nothing of the webhook's).
async fn two_workers_claim_through_two_nodes(a: &Server, b: &Server) {
    put(a, "/ds/c2/wake", "").await;
    put(a, "/ds/c2/jobs/1", "").await;
    let pull = "/ds/c2/__ds/subscriptions/pool";
    let def =
        r#"{"type":"pull-wake","pattern":"jobs/*","wake_stream":"wake","lease_ttl_ms":60000}"#;
    let r = b.request("PUT", pull, &[JSON], def).await;
    assert_eq!(r.status, 201, "{}", r.text);
    append(a, "/ds/c2/jobs/1", r#"{"job":1}"#).await;
    eventually("a wake event", WAIT, || async {
        let w = b.request("GET", "/ds/c2/wake?offset=-1", &[], "").await;
        w.json
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["stream"] == "jobs/1"))
    })
    .await;
    let url = format!("{pull}/claim");
    let (wa, wb) = (r#"{"worker":"wa"}"#, r#"{"worker":"wb"}"#);
    let (x, y) = tokio::join!(
        a.request("POST", &url, &[JSON], wa),
        b.request("POST", &url, &[JSON], wb),
    );
    let mut statuses = [x.status, y.status];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 409], "one lease: {} / {}", x.text, y.text);
}

/// A cluster started without `--ds-signing-key` still has one signing key:
/// the first node makes it and keeps its seed in Redis, every other node
/// reads it there, and a node started again later publishes the same JWK
/// Set (a receiver that fetched the set from one node verifies webhooks
/// signed by any node).
#[tokio::test]
async fn a_cluster_without_a_key_file_shares_one_signing_key_through_redis() {
    let Some(redis) = Redis::start_or_skip("ds shared signing key").await else {
        return;
    };
    let node = || async {
        Server::with(Opts {
            args: vec!["--redis".to_owned(), redis.url()],
            ..Opts::default()
        })
        .await
    };
    let a = node().await;
    let b = node().await;
    let jwks = a.request("GET", "/ds/k/__ds/jwks.json", &[], "").await.json;
    assert_eq!(jwks["keys"].as_array().map(Vec::len), Some(1), "{jwks}");
    assert_eq!(
        b.request("GET", "/ds/k/__ds/jwks.json", &[], "").await.json,
        jwks,
        "both nodes sign with one key"
    );
    drop(a);
    drop(b);
    let c = node().await;
    assert_eq!(
        c.request("GET", "/ds/k/__ds/jwks.json", &[], "").await.json,
        jwks,
        "a node started later has the same key"
    );
}

/// A wake follows the append that causes it at once (the linked stream's
/// commit wakes delivery; nothing is scanned): within 1 s of each append,
/// whether made through Durable Streams or through gapless's own publish
/// (a stream is a channel), and for a stream created after the
/// subscription that its pattern matches.
#[tokio::test]
async fn a_wake_follows_an_append_within_a_second() {
    let s = Server::start(&["--ds-webhook-allow-loopback"]).await;
    let mut hook = Hook::start(Mode::Done).await;
    put(&s, "/ds/q/a", "").await;
    let sub = "/ds/q/__ds/subscriptions/quick";
    let def = json!({"type": "webhook", "pattern": "*", "webhook": {"url": hook.url}});
    let r = s.request("PUT", sub, &[JSON], &def.to_string()).await;
    assert_eq!(r.status, 201, "{}", r.text);
    let within = Duration::from_secs(1);
    for n in 0..3 {
        let sent = Instant::now();
        let tail = append(&s, "/ds/q/a", &json!({ "n": n }).to_string()).await;
        let w = hook
            .maybe(within + sent.elapsed())
            .await
            .unwrap_or_else(|| panic!("no wake within 1 s of append {n}"));
        assert!(w.at.duration_since(sent) < within + Duration::from_millis(250));
        assert_eq!(w.json["streams"][0]["tail_offset"], tail.as_str());
        acked(&s, sub, "a", &tail).await;
    }
    // gapless's own publish to the stream's channel wakes it too.
    let sent = Instant::now();
    let p = s
        .request("POST", "/v1/channels/q~a/events", &[], r#"{"own":1}"#)
        .await;
    assert_eq!(p.status, 201, "{}", p.text);
    let w = hook
        .maybe(within)
        .await
        .expect("a wake within 1 s of a gapless publish");
    assert!(w.at.duration_since(sent) < within + Duration::from_millis(250));
    // A stream created later, matching the pattern: its first append wakes.
    put(&s, "/ds/q/b", "").await;
    let sent = Instant::now();
    let tail = append(&s, "/ds/q/b", r#"{"b":1}"#).await;
    let w = loop {
        let w = hook
            .maybe(within)
            .await
            .expect("a wake within 1 s of the new stream's append");
        if w.json["streams"].as_array().is_some_and(|a| {
            a.iter()
                .any(|l| l["path"] == "b" && l["tail_offset"] == tail.as_str())
        }) {
            break w;
        }
    };
    assert!(w.at.duration_since(sent) < within + Duration::from_millis(250));
}

/// In a cluster, a pull-wake subscription made on node A, whose stream is
/// created and appended to on node B after it, is woken, claimed through
/// B (A then refuses another worker), and acked through A.
#[tokio::test]
async fn a_subscription_made_on_one_node_is_claimed_on_another() {
    let Some(redis) = Redis::start_or_skip("ds subscriptions across nodes").await else {
        return;
    };
    let node = || async {
        Server::with(Opts {
            args: vec!["--redis".to_owned(), redis.url()],
            ..Opts::default()
        })
        .await
    };
    let a = node().await;
    let b = node().await;
    put(&a, "/ds/x/wake", "").await;
    let sub = "/ds/x/__ds/subscriptions/pool";
    let def =
        r#"{"type":"pull-wake","pattern":"jobs/*","wake_stream":"wake","lease_ttl_ms":60000}"#;
    let r = a.request("PUT", sub, &[JSON], def).await;
    assert_eq!(r.status, 201, "{}", r.text);
    put(&b, "/ds/x/jobs/1", "").await;
    let tail = append(&b, "/ds/x/jobs/1", r#"{"job":1}"#).await;
    eventually("a wake event", WAIT, || async {
        let w = b.request("GET", "/ds/x/wake?offset=-1", &[], "").await;
        w.json
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["stream"] == "jobs/1"))
    })
    .await;
    let c = claim(&b, sub, "on-b").await;
    assert_eq!(c.status, 200, "claimed on b: {}", c.text);
    assert_eq!(
        c.json["streams"][0]["tail_offset"],
        tail.as_str(),
        "{}",
        c.text
    );
    let other = claim(&a, sub, "on-a").await;
    assert_eq!(other.status, 409, "{}", other.text);
    assert_eq!(other.json["error"]["code"], "ALREADY_CLAIMED");
    assert_eq!(other.json["error"]["current_holder"], "on-b");
    let auth = format!("Bearer {}", c.json["token"].as_str().expect("token"));
    let ack = json!({"wake_id": c.json["wake_id"], "generation": c.json["generation"],
                     "acks": [{"stream": "jobs/1", "offset": tail}], "done": true});
    let done = a
        .request(
            "POST",
            &format!("{sub}/ack"),
            &[JSON, ("authorization", &auth)],
            &ack.to_string(),
        )
        .await;
    assert_eq!(done.status, 200, "acked on a: {}", done.text);
    acked(&b, sub, "jobs/1", &tail).await;
}

/// A subscription's state is its channel's metadata, not events: with a
/// retention of 5 events per channel, many changes (wakes, acks) and a
/// `kill -9`, the subscription reads the same after the restart and its
/// next wake continues from its acked offset.
#[tokio::test]
async fn a_subscription_outlives_retention_and_a_kill_9() {
    let mut s = Server::start(&["--ds-webhook-allow-loopback", "--retention-events", "5"]).await;
    let mut hook = Hook::start(Mode::Done).await;
    put(&s, "/ds/r/a", "").await;
    let sub = "/ds/r/__ds/subscriptions/kept";
    let def = json!({"type": "webhook", "streams": ["a"], "webhook": {"url": hook.url}});
    let r = s.request("PUT", sub, &[JSON], &def.to_string()).await;
    assert_eq!(r.status, 201, "{}", r.text);
    let mut tail = String::new();
    for n in 0..8 {
        tail = append(&s, "/ds/r/a", &json!({ "n": n }).to_string()).await;
        hook.next().await;
        acked(&s, sub, "a", &tail).await;
    }
    let before = s.request("GET", sub, &[], "").await.json;
    s.kill9().await;
    s.restart().await;
    let after = s.request("GET", sub, &[], "").await;
    assert_eq!(after.status, 200, "{}", after.text);
    assert_eq!(after.json, before);
    let next = append(&s, "/ds/r/a", r#"{"n":"after"}"#).await;
    let w = hook.next().await;
    assert_eq!(
        w.json["streams"][0]["acked_offset"],
        tail.as_str(),
        "{}",
        w.json
    );
    assert_eq!(w.json["streams"][0]["tail_offset"], next.as_str());
}
