//! Authorization against the real binary (`docs/security.md`): where tokens
//! are read, what each refusal looks like, that a refusal never tells whether
//! a channel exists, patterns, sessions, WebSocket, RS256 and ES256 keys,
//! and a token that expires mid-stream replaced with no loss and no repeat.

use base64::Engine;

use gapless_testkit::ws::{Msg, Ws};
use gapless_testkit::{Item, Next, Server, SseClient};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;

const SECRET: &str = "a-test-secret-that-is-long-enough-32";

fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64
}

fn sign(claims: &Value) -> String {
    sign_with(
        claims,
        Algorithm::HS256,
        &EncodingKey::from_secret(SECRET.as_bytes()).expect("key"),
    )
}

fn sign_with(claims: &Value, alg: Algorithm, key: &EncodingKey) -> String {
    jsonwebtoken::encode(&Header::new(alg), claims, key).expect("signing")
}

fn claims(subscribe: &[&str], publish: &[&str], ttl_s: i64) -> Value {
    json!({"exp": now_s() + ttl_s, "gapless": {"subscribe": subscribe, "publish": publish}})
}

/// A token with these rights, valid for an hour.
fn token(subscribe: &[&str], publish: &[&str]) -> String {
    sign(&claims(subscribe, publish, 3600))
}

async fn secured(extra: &[&str]) -> Server {
    let mut args = vec!["--jwt-secret", SECRET];
    args.extend_from_slice(extra);
    Server::memory(&args).await
}

async fn get_as(s: &Server, path: &str, t: &str) -> gapless_testkit::Resp {
    s.send(s.http.get(s.url(path)).bearer_auth(t)).await
}

async fn post_as(s: &Server, path: &str, body: &str, t: &str) -> gapless_testkit::Resp {
    s.send(
        s.http
            .post(s.url(path))
            .body(body.to_owned())
            .bearer_auth(t),
    )
    .await
}

#[tokio::test]
async fn an_open_server_says_so_and_a_secured_one_refuses_without_a_token() {
    let open = Server::memory(&[]).await;
    open.publish("c", "x").await;
    assert!(
        open.log().contains("running open"),
        "one line at start says the server is open: {}",
        open.log()
    );

    let s = secured(&[]).await;
    assert!(!s.log().contains("running open"), "{}", s.log());
    let r = s.post("/v1/channels/c/events", "x", &[]).await;
    r.expect_error(401, "unauthorized");
    assert_eq!(
        r.header("www-authenticate"),
        Some("Bearer realm=\"gapless\"")
    );
    for path in [
        "/v1/channels/c/events",
        "/v1/channels/c",
        "/v1/channels/c/sse",
        "/v1/sse?channel=c",
        "/v1/sessions/abc",
        "/v1/sessions/abc/events",
    ] {
        s.get(path).await.expect_error(401, "unauthorized");
    }
    // Liveness stays open.
    s.get("/healthz").await.expect(200);
}

#[tokio::test]
async fn each_bad_token_is_a_401_saying_what_is_wrong() {
    let s = secured(&["--jwt-leeway-ms", "0", "--jwt-audience", "gapless-test"]).await;
    let good = |mut c: Value| {
        c["aud"] = "gapless-test".into();
        c
    };
    let bad_sig = sign_with(
        &good(claims(&["*"], &["*"], 60)),
        Algorithm::HS256,
        &EncodingKey::from_secret(b"another-secret-another-secret-xx").expect("key"),
    );
    let expired = sign(&good(claims(&["*"], &["*"], -60)));
    let mut early = good(claims(&["*"], &["*"], 3600));
    early["nbf"] = (now_s() + 600).into();
    let not_yet = sign(&early);
    let wrong_aud = sign(&claims(&["*"], &["*"], 60));
    let no_exp = sign(&json!({"aud": "gapless-test", "gapless": {"subscribe": ["*"]}}));
    let bad_claim = sign(&good(
        json!({"exp": now_s() + 60, "gapless": {"read": ["*"]}}),
    ));
    let bad_pattern = sign(&good(claims(&["a*b"], &[], 60)));
    // The gapless claim by position (serde's array form of a struct): no documented shape.
    let array_claim = sign(&good(
        json!({"exp": now_s() + 60, "gapless": [["*"], ["*"]]}),
    ));
    // Three parts, the last character of the signature changed so that it
    // leaves bits over (not canonical base64url): a malformed signature,
    // not "not a JWT" (issue 29).
    let mut bent = sign(&good(claims(&["*"], &["*"], 60)));
    let last = if bent.ends_with('B') { 'C' } else { 'B' };
    bent.pop();
    bent.push(last);
    let cases = [
        ("not a JWT", "garbage", "not a JWT"),
        (
            "a non-canonical signature",
            bent.as_str(),
            "a JWT whose signature is malformed",
        ),
        ("bad signature", bad_sig.as_str(), "signature"),
        ("expired", expired.as_str(), "expired"),
        ("not yet valid", not_yet.as_str(), "not valid yet"),
        ("wrong audience", wrong_aud.as_str(), "aud"),
        ("no exp", no_exp.as_str(), "exp"),
        ("malformed gapless claim", bad_claim.as_str(), "gapless"),
        ("bad pattern", bad_pattern.as_str(), "*"),
        (
            "gapless claim as an array",
            array_claim.as_str(),
            "expected a JSON object",
        ),
    ];
    for (what, t, says) in cases {
        let r = get_as(&s, "/v1/channels/c", t).await;
        r.expect_error(401, "unauthorized");
        assert!(
            r.message().contains(says),
            "{what}: the message says what is wrong: {}",
            r.text
        );
        assert_eq!(
            r.header("www-authenticate"),
            Some("Bearer realm=\"gapless\", error=\"invalid_token\""),
            "{what}"
        );
    }
    let ok = sign(&good(claims(&["c"], &[], 60)));
    get_as(&s, "/v1/channels/c", &ok).await.expect(200);
    // A valid token without the right: 403, not 401.
    get_as(&s, "/v1/channels/d", &ok)
        .await
        .expect_error(403, "forbidden");
    let r = s
        .send(
            s.http
                .get(s.url("/v1/channels/c"))
                .header("Authorization", "Basic dTpw"),
        )
        .await;
    r.expect_error(401, "unauthorized");
}

#[tokio::test]
async fn a_refused_token_is_told_the_claim_at_fault_and_no_other() {
    let s = secured(&["--jwt-audience", "aud-1", "--jwt-issuer", "iss-1"]).await;
    let exp = now_s() + 600;
    let base = json!({"exp": exp, "aud": "aud-1", "iss": "iss-1", "gapless": {"subscribe": ["c"]}});
    let with = |key: &str, value: Option<Value>| {
        let mut c = base.clone();
        match value {
            Some(v) => c[key] = v,
            None => {
                c.as_object_mut().expect("object").remove(key);
            }
        }
        sign(&c)
    };
    let claims = ["exp", "nbf", "aud", "iss", "sub", "gapless"];
    let cases = [
        // docs/security.md: a `gapless` claim that is not a JSON object is a 401.
        ("gapless", Some(Value::Null), "`gapless` claim"),
        ("gapless", Some(json!("c")), "`gapless` claim"),
        (
            "gapless",
            Some(json!({"subscribe": null})),
            "`gapless` claim",
        ),
        ("aud", None, "`aud` claim"),
        ("aud", Some(json!(5)), "`aud` claim"),
        ("aud", Some(Value::Null), "`aud` claim"),
        ("aud", Some(json!("other")), "`aud`"),
        ("iss", None, "`iss` claim"),
        ("iss", Some(json!(5)), "`iss` claim"),
        ("iss", Some(json!("other")), "`iss`"),
        ("exp", None, "`exp` claim"),
        ("exp", Some(json!("soon")), "`exp` claim"),
        ("exp", Some(Value::Null), "`exp` claim"),
        ("nbf", Some(json!("now")), "`nbf` claim"),
        ("nbf", Some(Value::Null), "`nbf` claim"),
        ("sub", Some(json!(5)), "`sub` claim"),
    ];
    for (claim, value, says) in cases {
        let r = get_as(&s, "/v1/channels/c", &with(claim, value.clone())).await;
        r.expect_error(401, "unauthorized");
        let message = r.message();
        assert!(message.contains(says), "{claim}={value:?}: {message}");
        let words: Vec<&str> = message
            .split(|c: char| !c.is_ascii_alphanumeric())
            .collect();
        for other in claims.iter().filter(|c| **c != claim) {
            assert!(
                !words.contains(other),
                "{claim}={value:?}: the message names only {claim}, not {other}: {message}"
            );
        }
    }
    // A payload that is not a JSON object names the payload, no claim.
    let r = get_as(&s, "/v1/channels/c", &sign(&json!([exp, "aud-1"]))).await;
    r.expect_error(401, "unauthorized");
    assert!(
        r.message().contains("payload is not a JSON object"),
        "{}",
        r.text
    );
    assert!(!r.message().contains("gapless"), "{}", r.text);
    // A header this server does not read is named as such, not as "not a JWT".
    let none = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &base,
        &EncodingKey::from_secret(SECRET.as_bytes()).expect("key"),
    )
    .expect("signing");
    let payload = none.split('.').nth(1).expect("payload");
    let none = format!("eyJhbGciOiJub25lIn0.{payload}.");
    let r = get_as(&s, "/v1/channels/c", &none).await;
    r.expect_error(401, "unauthorized");
    assert!(
        r.message().contains("header") && r.message().contains("none"),
        "{}",
        r.text
    );
    // It names only what this server accepts (an HS256 secret here).
    assert!(r.message().contains("only HS256"), "{}", r.text);
    for not_taken in ["HS384", "HS512", "RS256", "PS256", "ES384", "EdDSA"] {
        assert!(!r.message().contains(not_taken), "{not_taken}: {}", r.text);
    }
    // A header with `crit` (RFC 7515 section 4.1.11) is named as such.
    let crit = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(br#"{"alg":"HS256","typ":"JWT","crit":["exp"]}"#);
    let r = get_as(&s, "/v1/channels/c", &format!("{crit}.{payload}.c2ln")).await;
    r.expect_error(401, "unauthorized");
    assert!(
        r.message().contains("`crit`") && !r.message().contains("not a JWT"),
        "{}",
        r.text
    );
    // An algorithm gapless knows but no key here verifies.
    let rs = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"alg":"RS256"}"#);
    let r = get_as(&s, "/v1/channels/c", &format!("{rs}.{payload}.c2ln")).await;
    r.expect_error(401, "unauthorized");
    assert!(r.message().contains("only HS256"), "{}", r.text);
    for t in ["garbage", "a.b", "!!.??.**"] {
        let r = get_as(&s, "/v1/channels/c", t).await;
        r.expect_error(401, "unauthorized");
        assert!(r.message().contains("not a JWT"), "{t}: {}", r.text);
    }
    // Left out, `gapless` verifies and allows nothing (403, not 401).
    get_as(&s, "/v1/channels/c", &with("gapless", None))
        .await
        .expect_error(403, "forbidden");
    get_as(&s, "/v1/channels/c", &sign(&base)).await.expect(200);
}

#[tokio::test]
async fn a_forbidden_channel_with_history_and_one_never_used_get_the_same_answer() {
    let s = secured(&[]).await;
    let admin = token(&["*"], &["*"]);
    for i in 0..3 {
        post_as(&s, "/v1/channels/secret/events", &format!("e{i}"), &admin)
            .await
            .expect(201);
    }
    let reader = token(&["news"], &["news"]);
    let cursor = post_as(&s, "/v1/channels/news/events", "n", &reader)
        .await
        .json["cursor"]
        .as_str()
        .expect("cursor")
        .to_owned();
    let requests = [
        ("GET", "/v1/channels/{}/events"),
        ("GET", "/v1/channels/{}/events?after=garbage"),
        ("GET", "/v1/channels/{}"),
        ("GET", "/v1/channels/{}/sse"),
        ("GET", "/v1/channels/{}/sse?since=earliest"),
        ("GET", "/v1/sse?channel={}"),
        ("POST", "/v1/channels/{}/events"),
        ("POST", "/v1/channels/{}/events?ephemeral=true"),
        ("POST", "/v1/channels/{}/batch"),
    ];
    for (method, template) in requests {
        let mut answers = Vec::new();
        for channel in ["secret", "never-used"] {
            let path = template.replace("{}", channel);
            let req = match method {
                "GET" => s.http.get(s.url(&path)),
                _ => s.http.post(s.url(&path)).body(r#"[{"data":"x"}]"#),
            };
            let r = s
                .send(
                    req.bearer_auth(&reader)
                        .header("Last-Event-ID", cursor.as_str()),
                )
                .await;
            r.expect_error(403, "forbidden");
            answers.push((r.status, r.text.replace(channel, "CHANNEL")));
        }
        assert_eq!(answers[0], answers[1], "{method} {template}");
    }
    // Nothing was appended by the refused publishes.
    let h = get_as(&s, "/v1/channels/secret", &admin).await;
    assert_eq!(h.expect(200)["head"], 3);
}

#[tokio::test]
async fn tokens_are_read_from_header_then_cookie_then_query() {
    let s = secured(&[]).await;
    let good = token(&["c"], &["c"]);
    let bad = "not-a-token";
    let ask = |header: Option<&str>, cookie: Option<&str>, query: Option<&str>| {
        let path = match query {
            Some(q) => format!("/v1/channels/c?access_token={q}"),
            None => "/v1/channels/c".to_owned(),
        };
        let mut req = s.http.get(s.url(&path));
        if let Some(h) = header {
            req = req.bearer_auth(h);
        }
        if let Some(c) = cookie {
            req = req.header("Cookie", format!("theme=dark; gapless_token={c}"));
        }
        let s = &s;
        async move { s.send(req).await.status }
    };
    assert_eq!(ask(Some(&good), None, None).await, 200, "header");
    assert_eq!(ask(None, Some(&good), None).await, 200, "cookie");
    assert_eq!(ask(None, None, Some(&good)).await, 200, "query");
    // The first place in the order wins, even when a later one holds a good token.
    assert_eq!(ask(Some(bad), Some(&good), Some(&good)).await, 401);
    assert_eq!(ask(Some(&good), Some(bad), Some(bad)).await, 200);
    assert_eq!(ask(None, Some(bad), Some(&good)).await, 401);
    assert_eq!(ask(None, Some(&good), Some(bad)).await, 200);
    // SSE with the query token (what a browser's EventSource can do).
    let (mut sse, _) = s.subscribe("c", &format!("access_token={good}")).await;
    post_as(&s, "/v1/channels/c/events", "hello", &good)
        .await
        .expect(201);
    assert_eq!(sse.next_event().await.data, "hello");
}

#[tokio::test]
async fn patterns_name_prefix_and_star() {
    let s = secured(&[]).await;
    let rooms = token(&["rooms:*"], &["rooms:1"]);
    for (channel, read) in [
        ("rooms:42", 200),
        ("rooms:", 200),
        ("room", 403),
        ("xrooms:1", 403),
        ("rooms", 403),
    ] {
        assert_eq!(
            get_as(&s, &format!("/v1/channels/{channel}"), &rooms)
                .await
                .status,
            read,
            "subscribe {channel}"
        );
    }
    assert_eq!(
        post_as(&s, "/v1/channels/rooms:1/events", "x", &rooms)
            .await
            .status,
        201
    );
    // An exact name is exact: rooms:1 gives nothing of rooms:10.
    for (channel, status) in [("rooms:10", 403), ("rooms:1x", 403), ("rooms:", 403)] {
        assert_eq!(
            post_as(&s, &format!("/v1/channels/{channel}/events"), "x", &rooms)
                .await
                .status,
            status,
            "publish {channel}"
        );
    }
    let one = token(&["rooms:1"], &[]);
    get_as(&s, "/v1/channels/rooms:10/events", &one)
        .await
        .expect_error(403, "forbidden");
    let all = token(&["*"], &[]);
    get_as(&s, "/v1/channels/anything.at_all", &all)
        .await
        .expect(200);
    // A token with no gapless claim allows nothing.
    let none = sign(&json!({"exp": now_s() + 60, "sub": "u"}));
    get_as(&s, "/v1/channels/c", &none)
        .await
        .expect_error(403, "forbidden");
}

#[tokio::test]
async fn a_multi_channel_stream_with_one_forbidden_channel_is_refused_whole() {
    let s = secured(&[]).await;
    let t = token(&["a", "b"], &[]);
    let mut ok = s
        .sse(
            &format!("/v1/sse?channel=a&channel=b&access_token={t}"),
            &[],
        )
        .await;
    ok.preamble().await;
    let mut refused = s
        .sse(
            &format!("/v1/sse?channel=a&channel=b&channel=c&access_token={t}"),
            &[],
        )
        .await;
    assert_eq!(refused.status, 403);
    let body = refused.body_json().await;
    assert_eq!(body["error"], "forbidden");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("\"c\"")),
        "{body}"
    );
}

#[tokio::test]
async fn adversarial_names_reach_no_other_channel() {
    let s = secured(&[]).await;
    let admin = token(&["*"], &["*"]);
    let t = token(&["rooms:1"], &["rooms:1"]);
    post_as(&s, "/v1/channels/rooms:10/events", "ten", &admin)
        .await
        .expect(201);
    // Percent-encoding is decoded once: rooms%3A1 is rooms:1 itself.
    post_as(&s, "/v1/channels/rooms%3A1/events", "one", &t)
        .await
        .expect(201);
    let h = get_as(&s, "/v1/channels/rooms:1/events", &t).await;
    assert_eq!(h.expect(200)["events"][0]["data"], "one");
    for path in [
        "/v1/channels/rooms%3A10/events",
        "/v1/channels/rooms:1%30/events",
        "/v1/channels/../events",
        "/v1/channels/rooms:*/events",
    ] {
        let r = get_as(&s, path, &t).await;
        assert!(
            r.status == 403 || r.status == 400 || r.status == 404,
            "{path}: {} {}",
            r.status,
            r.text
        );
        assert!(!r.text.contains("ten"), "{path} leaked: {}", r.text);
    }
    for path in [
        "/v1/channels/rooms:1%2F..%2Frooms:10/events",
        "/v1/channels/rooms:1%252Frooms:10/events",
        "/v1/channels/rooms%EF%BC%9A1/events",
        "/v1/channels/r%D0%BEoms:1/events",
    ] {
        get_as(&s, path, &admin)
            .await
            .expect_error(400, "invalid_channel");
    }
    let long = "a".repeat(200);
    get_as(&s, &format!("/v1/channels/{long}/events"), &admin)
        .await
        .expect(200);
    get_as(&s, &format!("/v1/channels/{long}a/events"), &admin)
        .await
        .expect_error(400, "invalid_channel");
    // Channels named like routes are channels like any other.
    for name in ["sse", "events", "batch"] {
        post_as(&s, &format!("/v1/channels/{name}/events"), name, &admin)
            .await
            .expect(201);
    }
    for name in ["sse", "events", "batch"] {
        let h = get_as(&s, &format!("/v1/channels/{name}/events"), &admin).await;
        let events = h.expect(200)["events"].as_array().expect("events").clone();
        assert_eq!(events.len(), 1, "{name}: {events:?}");
        assert_eq!(events[0]["data"], name);
    }
}

#[tokio::test]
async fn sessions_need_publish_or_subscribe_on_session_slash_id() {
    let s = secured(&[]).await;
    let producer = token(&[], &["session/*"]);
    let created = post_as(&s, "/v1/sessions", "", &producer).await;
    let id = created.expect(201)["id"].as_str().expect("id").to_owned();
    post_as(&s, &format!("/v1/sessions/{id}/events"), "step", &producer)
        .await
        .expect(201);
    // A producer of one named session cannot draw ids nor touch others.
    let one = token(&[], &["session/mine"]);
    post_as(&s, "/v1/sessions", "", &one)
        .await
        .expect_error(403, "forbidden");
    post_as(&s, "/v1/sessions", r#"{"id":"mine"}"#, &one)
        .await
        .expect(201);
    post_as(&s, &format!("/v1/sessions/{id}/events"), "x", &one)
        .await
        .expect_error(403, "forbidden");
    post_as(&s, &format!("/v1/sessions/{id}/complete"), "", &one)
        .await
        .expect_error(403, "forbidden");

    // The consumer holds subscribe on this session only: the id alone is not the key.
    let consumer = token(&[&format!("session/{id}")], &[]);
    get_as(&s, &format!("/v1/sessions/{id}"), &consumer)
        .await
        .expect(200);
    get_as(&s, &format!("/v1/sessions/{id}/events"), &consumer)
        .await
        .expect(200);
    post_as(&s, &format!("/v1/sessions/{id}/events"), "x", &consumer)
        .await
        .expect_error(403, "forbidden");
    get_as(&s, "/v1/sessions/mine", &consumer)
        .await
        .expect_error(403, "forbidden");
    // The same refusal for a session that does not exist.
    let a = get_as(&s, "/v1/sessions/mine", &consumer).await;
    let b = get_as(&s, "/v1/sessions/nope", &consumer).await;
    assert_eq!(a.text.replace("mine", "X"), b.text.replace("nope", "X"));

    let mut ws = Ws::connect(
        s.addr,
        &format!("/v1/sessions/{id}/ws?last_seq=1&access_token={consumer}"),
    )
    .await;
    let ev = ws.expect_op("event").await;
    assert_eq!(ev["data"], "step");
    ws.expect_op("session.resumed").await;

    for (who, t, code, close) in [
        ("no token", String::new(), "unauthorized", 4401),
        (
            "another session's token",
            token(&["session/mine"], &[]),
            "forbidden",
            4403,
        ),
        ("a bad token", "x.y.z".to_owned(), "unauthorized", 4401),
    ] {
        let mut ws = Ws::connect(s.addr, &format!("/v1/sessions/{id}/ws?access_token={t}")).await;
        let err = ws.expect_op("error").await;
        assert_eq!(err["code"], code, "{who}");
        let (c, _) = ws.expect_close().await;
        assert_eq!(c, close, "{who}");
    }
    post_as(&s, &format!("/v1/sessions/{id}/complete"), "", &producer)
        .await
        .expect(200);
}

#[tokio::test]
async fn websocket_refuses_a_bad_connect_with_4401_and_a_forbidden_subscribe_with_an_error() {
    let s = secured(&[]).await;
    let mut ws = Ws::connect(s.addr, "/v1/ws").await;
    let err = ws.expect_op("error").await;
    assert_eq!(err["code"], "unauthorized");
    assert_eq!(ws.expect_close().await.0, 4401);

    let t = token(&["a"], &["a"]);
    let mut ws = Ws::connect(s.addr, &format!("/v1/ws?access_token={t}")).await;
    ws.subscribe(json!(1), "b", json!({})).await;
    let err = ws.expect_op("error").await;
    assert_eq!(
        (err["id"].clone(), err["code"].clone()),
        (json!(1), json!("forbidden"))
    );
    ws.send(&json!({"op": "publish", "id": 2, "channel": "b", "data": "x"}))
        .await;
    let err = ws.expect_op("error").await;
    assert_eq!(
        (err["id"].clone(), err["code"].clone()),
        (json!(2), json!("forbidden"))
    );
    // The socket stays open and serves what is allowed.
    ws.subscribe_live("a").await;
    ws.send(&json!({"op": "publish", "id": 3, "channel": "a", "data": "y"}))
        .await;
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(ws.json().await["op"].as_str().unwrap_or("").to_owned());
    }
    got.sort();
    assert_eq!(got, ["event", "published"]);
    let admin = token(&["*"], &["*"]);
    let head = get_as(&s, "/v1/channels/b", &admin).await;
    assert_eq!(
        head.expect(200)["head"],
        0,
        "the refused publish appended nothing"
    );
}

/// A handshake to try: what it is, its target, its extra headers.
type Handshake<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>);

/// Whether a WebSocket opened on `path` works: a subscribe on `news` is
/// answered (`/v1/ws`), or the live attach is answered (a session).
async fn ws_works(ws: &mut Ws, path: &str) -> Value {
    if path.starts_with("/v1/ws") {
        ws.subscribe(json!(1), "news", json!({})).await;
    }
    ws.json().await
}

/// Issue 17: cross-site WebSocket hijacking. Browsers send a page's
/// WebSocket handshake with the server's cookies whatever the page's origin,
/// and apply no CORS to it; so a handshake whose credential is the
/// `gapless_token` cookie must come from the server's own origin or one
/// allowed by `--cors-origin`, else it is refused before the upgrade (403
/// naming the origin and the setting). A Bearer header or `access_token`
/// (which a foreign page cannot read) works from any origin; from a foreign
/// page the cookie is never the credential. No `Origin` (not a browser):
/// the cookie is the credential, as on HTTP. Both WebSocket routes.
#[tokio::test]
async fn a_cookie_websocket_is_taken_only_from_this_server_or_an_allowed_origin() {
    let s = secured(&["--cors-origin", "https://app.example"]).await;
    let producer = token(&[], &["session/*"]);
    post_as(&s, "/v1/sessions", r#"{"id":"s1"}"#, &producer)
        .await
        .expect(201);
    let t = token(&["news", "session/s1"], &[]);
    let cookie = format!("gapless_token={t}");
    // A token that allows neither: used, it makes every request `forbidden`.
    let other = token(&["weather"], &[]);
    let own = format!("http://{}", s.addr);
    for path in ["/v1/ws", "/v1/sessions/s1/ws?takeover=true"] {
        let sep = if path.contains('?') { '&' } else { '?' };
        for origin in [
            "https://evil.example",
            "http://app.example",
            "https://app.example.evil.example",
            "https://app.example:8443",
            "null",
            "http://localhost",
        ] {
            let refused =
                Ws::try_connect_headers(s.addr, path, &[("origin", origin), ("cookie", &cookie)])
                    .await
                    .err()
                    .unwrap_or_else(|| panic!("{path} from {origin} with the cookie: upgraded"));
            assert_eq!(refused.status, 403, "{path} from {origin}: {refused:?}");
            assert_eq!(refused.json["error"], "forbidden", "{refused:?}");
            let message = refused.json["message"].as_str().unwrap_or_default();
            assert!(
                message.contains(&format!("{origin:?}")) && message.contains("--cors-origin"),
                "{path}: the refusal names the origin and the setting: {message}"
            );
        }
        let bearer = format!("Bearer {t}");
        let with_query = format!("{path}{sep}access_token={t}");
        let with_other_query = format!("{path}{sep}access_token={other}");
        let evil = "https://evil.example";
        let accepted: [Handshake; 6] = [
            (
                "own origin, cookie",
                path,
                vec![("origin", &own), ("cookie", &cookie)],
            ),
            (
                "allowed origin, cookie",
                path,
                vec![("origin", "https://app.example"), ("cookie", &cookie)],
            ),
            ("no origin, cookie", path, vec![("cookie", &cookie)]),
            (
                "foreign origin, header",
                path,
                vec![
                    ("origin", evil),
                    ("authorization", &bearer),
                    ("cookie", &cookie),
                ],
            ),
            (
                "foreign origin, access_token",
                &with_query,
                vec![("origin", evil)],
            ),
            (
                "foreign origin, access_token and cookie",
                &with_query,
                vec![("origin", evil), ("cookie", &cookie)],
            ),
        ];
        for (what, target, headers) in accepted {
            let mut ws = Ws::try_connect_headers(s.addr, target, &headers)
                .await
                .unwrap_or_else(|r| panic!("{path}, {what}: refused {r:?}"));
            let got = ws_works(&mut ws, path).await;
            let want = if path == "/v1/ws" {
                "subscribed"
            } else {
                "session.resumed"
            };
            assert_eq!(got["op"], want, "{path}, {what}: {got}");
        }
        // From a foreign page with both, the query's token is the credential,
        // not the cookie: this one allows neither the channel nor the session.
        let mut ws = Ws::try_connect_headers(
            s.addr,
            &with_other_query,
            &[("origin", evil), ("cookie", &cookie)],
        )
        .await
        .unwrap_or_else(|r| panic!("{path}: refused {r:?}"));
        let got = ws_works(&mut ws, path).await;
        assert_eq!(
            (got["op"].clone(), got["code"].clone()),
            (json!("error"), json!("forbidden")),
            "{path}: the cookie was not used: {got}"
        );
    }

    // An open server reads no token: a cookie is no credential there.
    let open = Server::memory(&[]).await;
    let mut ws = Ws::try_connect_headers(
        open.addr,
        "/v1/ws",
        &[("origin", "https://evil.example"), ("cookie", &cookie)],
    )
    .await
    .expect("an open server upgrades");
    assert_eq!(ws_works(&mut ws, "/v1/ws").await["op"], "subscribed");
}

/// Cross-site request forgery (docs/security.md, "The cookie and foreign
/// pages"): a form or `text/plain` POST needs no CORS preflight, so a
/// browser sends it from any page with the `gapless_token` cookie. On every
/// write route, a request whose credential is the cookie is refused 403
/// `forbidden` (naming the origin and `--cors-origin`) from a foreign page,
/// before anything is written; it is taken from the server's own origin, a
/// listed one, or without `Origin`. A Bearer header works from any origin;
/// reads are not guarded; an open server reads no cookie.
#[tokio::test]
async fn a_cookie_write_is_taken_only_from_this_server_or_an_allowed_origin() {
    let s = secured(&["--cors-origin", "https://app.example.com/"]).await;
    let admin = token(&["*"], &["*"]);
    let t = token(&["*"], &["*"]);
    let cookie = format!("gapless_token={t}");
    let bearer = format!("Bearer {t}");
    let own = format!("http://{}", s.addr);
    for id in ["s1", "s2", "s3"] {
        post_as(&s, "/v1/sessions", &format!(r#"{{"id":"{id}"}}"#), &admin)
            .await
            .expect(201);
    }
    let batch = r#"[{"data":"b1"},{"data":"b2"}]"#;
    // (route, body, content type) of every write, on session `id` (ended
    // last: completed) and `end` (cancelled).
    let writes = |id: &str, end: &str| -> Vec<(String, &'static str, &'static str)> {
        vec![
            ("/v1/channels/news/events".into(), "evil=1", "text/plain"),
            (
                "/v1/channels/news/events?ephemeral=true".into(),
                "evil=1",
                "text/plain",
            ),
            ("/v1/channels/news/batch".into(), batch, "text/plain"),
            (
                "/v1/sessions".into(),
                "",
                "application/x-www-form-urlencoded",
            ),
            (format!("/v1/sessions/{id}/events"), "evil=1", "text/plain"),
            (
                format!("/v1/sessions/{id}/complete"),
                "",
                "application/x-www-form-urlencoded",
            ),
            (format!("/v1/sessions/{end}/cancel"), "", "text/plain"),
        ]
    };
    let write = |path: String, body: &str, ctype: &str, headers: Vec<(&str, String)>| {
        let mut req = s
            .http
            .post(s.url(&path))
            .header("content-type", ctype.to_owned())
            .body(body.to_owned());
        for (k, v) in headers {
            req = req.header(k, v);
        }
        s.send(req)
    };
    for (path, body, ctype) in writes("s1", "s2") {
        for foreign in [
            vec![("origin", "https://evil.example".to_owned())],
            vec![("origin", "http://app.example.com".to_owned())],
            vec![("origin", "https://app.example.com.evil.example".to_owned())],
            vec![("origin", "null".to_owned())],
            vec![("sec-fetch-site", "cross-site".to_owned())],
        ] {
            let mut headers = foreign.clone();
            headers.push(("cookie", cookie.clone()));
            let r = write(path.clone(), body, ctype, headers).await;
            r.expect_error(403, "forbidden");
            let message = r.message();
            assert!(
                message.contains("--cors-origin")
                    && foreign.iter().all(|(_, v)| message.contains(v.as_str())),
                "{path}: the refusal names the page and the setting: {message}"
            );
        }
    }
    // Nothing was written: no event on the channel, no session created,
    // s1 and s2 still open with only their opening marker.
    let h = get_as(&s, "/v1/channels/news/events", &admin).await;
    assert_eq!(h.expect(200)["events"], json!([]), "{h:?}");
    for id in ["s1", "s2"] {
        let info = get_as(&s, &format!("/v1/sessions/{id}"), &admin).await;
        assert_eq!(info.expect(200)["status"], "open", "{id}: {info:?}");
        assert_eq!(info.expect(200)["head"], 1, "{id}: {info:?}");
    }

    // Taken: own origin, a listed origin (listed with a trailing `/`, sent
    // without, as browsers do), no Origin, and a Bearer header from anywhere.
    let allowed: [(&str, Vec<(&str, String)>); 4] = [
        (
            "own origin",
            vec![("origin", own.clone()), ("cookie", cookie.clone())],
        ),
        (
            "listed origin",
            vec![
                ("origin", "https://app.example.com".to_owned()),
                ("cookie", cookie.clone()),
            ],
        ),
        ("no origin", vec![("cookie", cookie.clone())]),
        (
            "foreign origin, Bearer",
            vec![
                ("origin", "https://evil.example".to_owned()),
                ("sec-fetch-site", "cross-site".to_owned()),
                ("authorization", bearer.clone()),
                ("cookie", cookie.clone()),
            ],
        ),
    ];
    for (i, (what, headers)) in allowed.into_iter().enumerate() {
        let (id, end) = (format!("ok{i}"), format!("end{i}"));
        for name in [&id, &end] {
            post_as(&s, "/v1/sessions", &format!(r#"{{"id":"{name}"}}"#), &admin)
                .await
                .expect(201);
        }
        for (path, body, ctype) in writes(&id, &end) {
            let r = write(path.clone(), body, ctype, headers.clone()).await;
            assert!(
                (200..300).contains(&r.status),
                "{what}: {path}: {} {}",
                r.status,
                r.text
            );
        }
        let info = get_as(&s, &format!("/v1/sessions/{id}"), &admin).await;
        assert_eq!(info.expect(200)["status"], "completed", "{what}: {info:?}");
    }
    // One event and a batch of two per accepted pass.
    let h = get_as(&s, "/v1/channels/news", &admin).await;
    assert_eq!(h.expect(200)["head"], 4 * 3, "{h:?}");
    // Reads are not guarded (CORS keeps their answers from foreign pages).
    let r = s
        .send(
            s.http
                .get(s.url("/v1/channels/news/events"))
                .header("origin", "https://evil.example")
                .header("cookie", &cookie),
        )
        .await;
    r.expect(200);

    // An open server reads no token: a cookie write from anywhere is taken.
    let open = Server::memory(&[]).await;
    let r = open
        .post(
            "/v1/channels/news/events",
            "x",
            &[("origin", "https://evil.example"), ("cookie", &cookie)],
        )
        .await;
    r.expect(201);
}

/// Generates a key pair with openssl: (private PKCS#8 PEM, public PEM).
fn keypair(dir: &std::path::Path, kind: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let private = dir.join(format!("{kind}.key"));
    let public = dir.join(format!("{kind}.pub"));
    let gen: &[&str] = match kind {
        "rsa" => &[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ],
        _ => &[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ],
    };
    let ok = std::process::Command::new("openssl")
        .args(gen)
        .arg("-out")
        .arg(&private)
        .status()
        .expect("running openssl");
    assert!(ok.success(), "openssl genpkey {kind}");
    let ok = std::process::Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&private)
        .arg("-out")
        .arg(&public)
        .status()
        .expect("running openssl");
    assert!(ok.success(), "openssl pkey -pubout {kind}");
    (private, public)
}

#[tokio::test]
async fn rs256_and_es256_public_keys_and_a_secret_beside_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (kind, alg) in [("rsa", Algorithm::RS256), ("ec", Algorithm::ES256)] {
        let (private, public) = keypair(dir.path(), kind);
        let pem = std::fs::read(&private).expect("private key");
        let key = match kind {
            "rsa" => EncodingKey::from_rsa_pem(&pem),
            _ => EncodingKey::from_ec_pem(&pem),
        }
        .expect("encoding key");
        let public = public.to_str().expect("utf-8 path").to_owned();
        // The public key alone: its algorithm verifies, HS256 does not.
        let s = Server::memory(&["--jwt-public-key", &public]).await;
        let t = sign_with(&claims(&["c"], &["c"], 60), alg, &key);
        post_as(&s, "/v1/channels/c/events", "x", &t)
            .await
            .expect(201);
        post_as(&s, "/v1/channels/c/events", "x", &token(&["c"], &["c"]))
            .await
            .expect_error(401, "unauthorized");
        // Tampered payload: the signature no longer verifies.
        let mut parts: Vec<String> = t.split('.').map(str::to_owned).collect();
        let forged = sign(&claims(&["*"], &["*"], 60));
        parts[1] = forged.split('.').nth(1).expect("payload").to_owned();
        post_as(&s, "/v1/channels/d/events", "x", &parts.join("."))
            .await
            .expect_error(401, "unauthorized");
        // Both configured: either verifies.
        let both = Server::memory(&["--jwt-public-key", &public, "--jwt-secret", SECRET]).await;
        post_as(&both, "/v1/channels/c/events", "x", &t)
            .await
            .expect(201);
        post_as(&both, "/v1/channels/c/events", "x", &token(&["c"], &["c"]))
            .await
            .expect(201);
    }
    // A file that is not a key: the server refuses to start, naming it.
    let bad = dir.path().join("bad.pem");
    std::fs::write(&bad, "not a key").expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gapless"))
        .args([
            "serve",
            "--memory",
            "--listen",
            "127.0.0.1:0",
            "--jwt-public-key",
        ])
        .arg(&bad)
        .output()
        .expect("run gapless");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.pem") && err.contains("public key"),
        "{err}"
    );
}

/// Publishes `n` events to `channel` in the background, one every `every`.
fn publish_in_background(
    s: &Server,
    channel: &str,
    n: u64,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let url = s.url(&format!("/v1/channels/{channel}/events"));
    let http = s.http.clone();
    let t = token(&[], &[channel]);
    tokio::spawn(async move {
        for i in 1..=n {
            let r = http
                .post(&url)
                .bearer_auth(&t)
                .body(format!("e{i}"))
                .send()
                .await
                .expect("publish");
            assert_eq!(r.status(), 201);
            tokio::time::sleep(every).await;
        }
    })
}

#[tokio::test]
async fn sse_ends_at_expiry_and_a_fresh_token_resumes_with_no_loss_and_no_repeat() {
    let s = secured(&["--jwt-leeway-ms", "0"]).await;
    let n = 60;
    let publisher = publish_in_background(&s, "c", n, Duration::from_millis(50));
    let mut seen: Vec<String> = Vec::new();
    let mut last_id = String::new();
    let mut expiries = 0;
    let mut late = 0;
    while seen.len() < n as usize {
        // Each token lives 1 s: the stream is cut at least twice while events flow.
        let t = sign(&claims(&["c"], &[], 1));
        let target = format!("/v1/channels/c/sse?access_token={t}&since=earliest");
        let headers: Vec<(&str, &[u8])> = if last_id.is_empty() {
            vec![]
        } else {
            vec![("Last-Event-ID", last_id.as_bytes())]
        };
        let mut c = SseClient::connect(s.addr, &target, &headers).await;
        if c.status == 401 {
            // `exp` has whole seconds: a token signed late in its second can
            // expire before a loaded machine has connected. Sign another.
            late += 1;
            assert!(late < 20, "refused 20 times: {}", c.raw_text());
            continue;
        }
        assert_eq!(c.status, 200, "{}", c.raw_text());
        loop {
            match c.next_within(Duration::from_secs(5)).await {
                Some(Next::Item(Item::Event(e))) if e.event == "gapless.expired" => {
                    assert_eq!(e.id, None, "the expiry notice carries no id");
                    assert_eq!(e.json()["error"], "token_expired");
                    expiries += 1;
                }
                Some(Next::Item(Item::Event(e))) => {
                    assert!(!e.is_gap(), "no gap across a refresh: {e:?}");
                    seen.push(e.data.clone());
                    last_id = e.last_event_id.clone();
                }
                Some(Next::Item(Item::IdOnly(id))) => last_id = id,
                Some(Next::Item(_)) => {}
                Some(Next::End) => break,
                Some(Next::Broken(e)) => panic!("stream broke: {e}"),
                None => break,
            }
        }
    }
    publisher.await.expect("publisher");
    let want: Vec<String> = (1..=n).map(|i| format!("e{i}")).collect();
    assert_eq!(seen, want, "every event once, in order");
    assert!(
        expiries >= 2,
        "the token expired mid-stream ({expiries} times)"
    );
}

#[tokio::test]
async fn websocket_closes_4401_at_expiry_and_resumes_from_its_cursor() {
    let s = secured(&["--jwt-leeway-ms", "0"]).await;
    let n = 60;
    let publisher = publish_in_background(&s, "c", n, Duration::from_millis(50));
    let mut seqs: Vec<u64> = Vec::new();
    let mut cursor: Option<String> = None;
    let mut expiries = 0;
    while seqs.len() < n as usize {
        // `exp` is in whole seconds: a 1 s lifetime may leave a few
        // milliseconds, too few to connect on a loaded machine.
        let t = sign(&claims(&["c"], &[], 2));
        let mut ws = Ws::connect(s.addr, &format!("/v1/ws?access_token={t}")).await;
        let extra = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({"since": "earliest"}),
        };
        ws.subscribe(json!(1), "c", extra).await;
        loop {
            match ws.recv(Duration::from_secs(5)).await {
                Some(Msg::Json(v)) if v["op"] == "event" => {
                    seqs.push(v["seq"].as_u64().expect("seq"));
                    cursor = v["cursor"].as_str().map(str::to_owned);
                }
                Some(Msg::Json(v)) if v["op"] == "gap" => panic!("no gap across a refresh: {v}"),
                Some(Msg::Json(_)) => {}
                Some(Msg::Close(Some((code, reason)))) => {
                    assert_eq!(code, 4401, "{reason}");
                    assert!(reason.contains("expired"), "{reason}");
                    expiries += 1;
                    break;
                }
                other => {
                    if seqs.len() < n as usize {
                        panic!("unexpected {other:?}");
                    }
                    break;
                }
            }
        }
    }
    publisher.await.expect("publisher");
    assert_eq!(
        seqs,
        (1..=n).collect::<Vec<_>>(),
        "every event once, in order"
    );
    assert!(expiries >= 1, "the token expired mid-stream");
    let distinct: BTreeSet<_> = seqs.iter().collect();
    assert_eq!(distinct.len(), seqs.len());
}

#[tokio::test]
async fn a_channel_pattern_never_reaches_a_session_and_short_secrets_are_refused() {
    let s = secured(&[]).await;
    let owner = token(&[], &["session/*"]);
    let id = post_as(&s, "/v1/sessions", "", &owner).await.expect(201)["id"]
        .as_str()
        .expect("id")
        .to_owned();
    // `s*` reads like "channels starting with s": it names no session.
    for pattern in ["s*", "sess*", "session*"] {
        let t = token(&[pattern], &[pattern]);
        get_as(&s, &format!("/v1/sessions/{id}"), &t)
            .await
            .expect_error(403, "forbidden");
        post_as(&s, "/v1/sessions", "", &t)
            .await
            .expect_error(403, "forbidden");
        let mut ws = Ws::connect(
            s.addr,
            &format!("/v1/sessions/{id}/ws?last_seq=0&access_token={t}"),
        )
        .await;
        assert_eq!(
            ws.expect_op("error").await["code"],
            "forbidden",
            "{pattern}"
        );
        assert_eq!(ws.expect_close().await.0, 4403);
        // It still names channels.
        let channel = format!("{}1", pattern.trim_end_matches('*'));
        post_as(&s, &format!("/v1/channels/{channel}/events"), "x", &t)
            .await
            .expect(201);
    }
    // A secret shorter than 32 bytes is refused at start, saying why.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gapless"))
        .args([
            "serve",
            "--memory",
            "--listen",
            "127.0.0.1:0",
            "--jwt-secret",
            "short",
        ])
        .output()
        .expect("run gapless");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("32 bytes"));
    // `gapless token` refuses a pattern the server would refuse.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gapless"))
        .args(["token", "--secret", SECRET, "--subscribe", "*x"])
        .output()
        .expect("run gapless token");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("*x"));
}
