//! `GET /v1/openapi.json` against the real binary: an OpenAPI 3.1 document
//! that lists exactly the routes the router serves (the list is read from
//! the router's code, so a route added without its annotation fails here),
//! whose references all resolve, whose security follows the token setting,
//! whose limits are the server's, and whose streams and upgrades answer as it
//! says. `scripts/schemathesis.sh` fuzzes the rest of the document.

use gapless_testkit::ws::{Ws, PROTOCOL};
use gapless_testkit::Server;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

const SECRET: &str = "a-test-secret-that-is-long-enough-32";
const METHODS: &[&str] = &["get", "put", "post", "delete", "options", "head", "patch"];

async fn document(s: &Server) -> Value {
    let r = s.get("/v1/openapi.json").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.header("content-type"), Some("application/json"));
    r.json.clone()
}

/// Every `(path, method, operation)` of the document.
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for m in METHODS {
            if let Some(op) = item.get(*m) {
                out.push((path.clone(), (*m).to_owned(), op.clone()));
            }
        }
    }
    out
}

fn id(op: &Value) -> &str {
    op["operationId"]
        .as_str()
        .expect("every operation has an id")
}

/// The server crate's source directory.
fn server_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/src")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The body of the function that starts with `head` in `src` (up to the
/// first line that is only `}`).
fn fn_body<'a>(src: &'a str, head: &str, what: &str) -> &'a str {
    let start = src
        .find(head)
        .unwrap_or_else(|| panic!("{what}: no `{head}`"));
    let body = &src[start..];
    &body[..body
        .find("\n}\n")
        .unwrap_or_else(|| panic!("{what}: the end of `{head}`"))]
}

/// The source file of module `module` (`transport::http`) of the server crate.
fn module_file(module: &str) -> PathBuf {
    let base = server_src().join(module.replace("::", "/"));
    let rs = base.with_extension("rs");
    if rs.exists() {
        rs
    } else {
        base.join("mod.rs")
    }
}

/// Every `routes!(…)` in `body`, as module paths, each after `prefix`.
fn routes_in(body: &str, prefix: &str, out: &mut Vec<String>) {
    let mut rest = body;
    while let Some(i) = rest.find("routes!(") {
        rest = &rest[i + "routes!(".len()..];
        let end = rest.find(')').expect("routes!( is closed");
        out.extend(
            rest[..end]
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(|h| format!("{prefix}{h}")),
        );
        rest = &rest[end..];
    }
}

/// The handlers the router registers, read from `gapless_server::api`:
/// every `routes!(…)` in it, and in each part's `routes()` that it merges
/// (`.merge(transport::http::routes())`), as module paths
/// (`transport::http::publish::publish`).
fn routed_handlers() -> Vec<String> {
    let lib = read(&server_src().join("lib.rs"));
    let api = fn_body(&lib, "fn api(", "lib.rs");
    let mut out = Vec::new();
    routes_in(api, "", &mut out);
    let mut rest = api;
    while let Some(i) = rest.find(".merge(") {
        rest = &rest[i + ".merge(".len()..];
        let module = rest[..rest.find("::routes(").expect("a part's routes() is merged")].trim();
        let file = module_file(module);
        let src = read(&file);
        let body = fn_body(&src, "fn routes(", &file.display().to_string());
        routes_in(body, &format!("{module}::"), &mut out);
    }
    assert!(
        out.len() >= 10,
        "too few handlers read from lib.rs and the routes() it merges: {out:?}"
    );
    out
}

/// The `#[utoipa::path(…)]` of handler `h` (`module::fn`), read from its
/// source file: `(method, path, operation_id)`.
fn annotation(h: &str) -> (String, String, String) {
    let mut parts: Vec<&str> = h.split("::").collect();
    let name = parts.pop().expect("a handler name");
    let file = if parts.is_empty() {
        server_src().join("lib.rs")
    } else {
        module_file(&parts.join("::"))
    };
    let src = read(&file);
    let f = src
        .find(&format!("async fn {name}("))
        .unwrap_or_else(|| panic!("{h}: no `async fn {name}(` in {}", file.display()));
    let attr = src[..f]
        .rfind("#[utoipa::path(")
        .unwrap_or_else(|| panic!("{h} has no #[utoipa::path] annotation"));
    let text = &src[attr..f];
    assert!(
        !text[1..].contains("\nasync fn ") && !text.contains("\npub async fn "),
        "the annotation above {h} belongs to another handler"
    );
    let method = text["#[utoipa::path(".len()..]
        .trim_start()
        .split(',')
        .next()
        .expect("a method")
        .trim()
        .to_owned();
    let quoted = |key: &str| -> String {
        let i = text
            .find(&format!("{key} = \""))
            .unwrap_or_else(|| panic!("{h}: no {key} in its annotation"));
        let v = &text[i + key.len() + 4..];
        v[..v.find('"').expect("closing quote")].to_owned()
    };
    (method, quoted("path"), quoted("operation_id"))
}

/// Every `$ref` in `v`.
fn refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "$ref" {
                    out.push(x.as_str().expect("a $ref is a string").to_owned());
                } else {
                    refs(x, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
        _ => {}
    }
}

/// A request of `method` to the documented `path`, its parameters filled in.
fn request(s: &Server, method: &str, path: &str) -> reqwest::RequestBuilder {
    let url = s.url(
        &path
            .replace("{channel}", "oa")
            .replace("{id}", "oa-session"),
    );
    match method {
        "get" => s.http.get(url),
        "post" => s.http.post(url).body(""),
        "delete" => s.http.delete(url),
        m => panic!("a method the test does not send: {m}"),
    }
}

/// Sends `req` and returns the status and the first bytes of the body
/// (streams never end: at most what arrives within a moment).
async fn status_and_start(
    req: reqwest::RequestBuilder,
) -> (u16, String, reqwest::header::HeaderMap) {
    let mut resp = tokio::time::timeout(Duration::from_secs(10), req.send())
        .await
        .expect("answered in time")
        .expect("an answer");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let mut body = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    while let Ok(Ok(Some(chunk))) = tokio::time::timeout_at(deadline, resp.chunk()).await {
        body.extend_from_slice(&chunk);
        if body.len() > 64 * 1024 {
            break;
        }
    }
    (status, String::from_utf8_lossy(&body).into_owned(), headers)
}

/// Asserts that an error body has the documented shape: `error` one of the
/// codes, a `message`, no field `ErrorBody` does not list.
fn assert_error_body(doc: &Value, body: &str, what: &str) {
    let v: Value =
        serde_json::from_str(body).unwrap_or_else(|_| panic!("{what}: not JSON: {body}"));
    let schema = &doc["components"]["schemas"]["ErrorBody"];
    let fields: BTreeSet<&String> = schema["properties"]
        .as_object()
        .expect("properties")
        .keys()
        .collect();
    for k in v.as_object().expect("an object").keys() {
        assert!(
            fields.contains(k),
            "{what}: field {k} is not documented: {body}"
        );
    }
    let codes = doc["components"]["schemas"]["ErrorCode"]["enum"]
        .as_array()
        .expect("ErrorCode is an enum");
    assert!(
        codes.contains(&v["error"]),
        "{what}: undocumented code: {body}"
    );
    assert!(v["message"].is_string(), "{what}: no message: {body}");
}

#[tokio::test]
async fn the_document_is_openapi_3_1_and_lists_exactly_the_routes_served() {
    let s = Server::memory(&["--console", "true"]).await;
    let doc = document(&s).await;
    assert!(
        doc["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1.")),
        "OpenAPI 3.1: {}",
        doc["openapi"]
    );
    assert_eq!(doc["info"]["title"], "gapless");

    // Every reference resolves.
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(!all.is_empty());
    for r in &all {
        let name = r
            .strip_prefix("#/components/schemas/")
            .unwrap_or_else(|| panic!("a reference outside the schemas: {r}"));
        assert!(
            doc["components"]["schemas"].get(name).is_some(),
            "{r} does not resolve"
        );
    }

    // The routes, from the router's code: each handler's annotation is in
    // the document, and the document has nothing else.
    let handlers = routed_handlers();
    let ops = operations(&doc);
    let ids: BTreeSet<&str> = ops.iter().map(|(_, _, op)| id(op)).collect();
    assert_eq!(ids.len(), ops.len(), "operation ids are unique");
    assert_eq!(
        ops.len(),
        handlers.len(),
        "one operation per routed handler: {handlers:?} vs {ids:?}"
    );
    for h in &handlers {
        let (method, path, op_id) = annotation(h);
        let op = &doc["paths"][&path][&method];
        assert_eq!(
            op["operationId"], op_id,
            "{h}: {method} {path} is documented"
        );
    }

    // Nothing is routed past `routes!` (it would be served undocumented).
    {
        let mut stack = vec![server_src()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    for (n, line) in read(&p).lines().enumerate() {
                        let code = line.split("//").next().unwrap_or_default();
                        for bypass in [
                            ".route(",
                            ".route_service(",
                            ".nest(",
                            ".nest_service(",
                            ".merge(",
                        ] {
                            // A part's `routes()`, itself made of `routes!`
                            // (read above), is merged whole.
                            let part_routes = bypass == ".merge(" && code.contains("::routes(");
                            assert!(
                                part_routes || !code.contains(bypass),
                                "{}:{}: `{bypass}` registers a route without its OpenAPI \
                                 annotation; use `routes!` in a part's routes()",
                                p.display(),
                                n + 1
                            );
                        }
                    }
                }
            }
        }
    }

    // The router serves each documented operation (a request reaches its
    // handler: never the 404 of an unknown path nor a 405), and each answer
    // is one the operation documents.
    for (path, method, op) in &ops {
        let (status, body, headers) = status_and_start(request(&s, method, path)).await;
        let what = format!("{method} {path} -> {status}");
        assert!(
            !(status == 404 && body.contains("no such path")) && status != 405,
            "{what}: not served: {body}"
        );
        let resp = op["responses"]
            .get(status.to_string())
            .unwrap_or_else(|| panic!("{what}: the status is not documented: {body}"));
        let ct = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        // A 204 (a purge) has no body and documents none.
        let no_content = status == 204 && resp.get("content").is_none() && body.is_empty();
        assert!(
            no_content
                || resp["content"].as_object().is_some_and(|c| c
                    .keys()
                    .any(|k| ct.starts_with(k.split(';').next().unwrap_or(k)))),
            "{what}: content type {ct:?} is not documented: {resp}"
        );
        if status >= 400 {
            assert_error_body(&doc, &body, &what);
        }
    }

    // Without --console, `/` is neither served nor documented.
    let quiet = Server::memory(&["--console", "false"]).await;
    let doc = document(&quiet).await;
    assert!(doc["paths"].get("/").is_none() && doc["paths"].get("/favicon.ico").is_none());
    assert_eq!(operations(&doc).len(), handlers.len() - 2);
    quiet.get("/").await.expect_error(404, "not_found");
}

#[tokio::test]
async fn security_and_limits_are_the_servers_own() {
    // Open: no security requirement and no 401 or 403 anywhere.
    let open = Server::memory(&[
        "--max-batch-events",
        "7",
        "--max-subscription-channels",
        "3",
    ])
    .await;
    let doc = document(&open).await;
    for (path, method, op) in operations(&doc) {
        assert!(op.get("security").is_none(), "{method} {path}");
        for st in ["401", "403"] {
            assert!(
                op["responses"].get(st).is_none(),
                "{method} {path} documents {st}"
            );
        }
    }
    let batch = &doc["paths"]["/v1/channels/{channel}/batch"]["post"]["requestBody"]["content"]
        ["application/json"]["schema"];
    assert_eq!(batch["maxItems"], 7, "{batch}");
    assert_eq!(batch["minItems"], 1, "{batch}");
    let channel = doc["paths"]["/v1/sse"]["get"]["parameters"]
        .as_array()
        .expect("parameters")
        .iter()
        .find(|p| p["name"] == "channel")
        .expect("channel")
        .clone();
    assert_eq!(channel["schema"]["maxItems"], 3, "{channel}");
    // ... and they are what the server enforces.
    let eight: Vec<Value> = (0..8)
        .map(|i| serde_json::json!({"data": i.to_string()}))
        .collect();
    open.batch("b", &Value::Array(eight), &[])
        .await
        .expect_error(413, "too_large");

    // Tokens on: the three schemes, required by every operation but the open ones.
    let s = Server::memory(&["--jwt-secret", SECRET]).await;
    let doc = document(&s).await;
    let schemes = &doc["components"]["securitySchemes"];
    assert_eq!(schemes["bearer"]["scheme"], "bearer");
    assert_eq!(schemes["cookie"]["in"], "cookie");
    assert_eq!(schemes["cookie"]["name"], "gapless_token");
    assert_eq!(schemes["query"]["in"], "query");
    assert_eq!(schemes["query"]["name"], "access_token");
    let open_ids = [
        "healthz",
        "readyz",
        "metrics",
        "console",
        "console_icon",
        "openapi",
    ];
    for (path, method, op) in operations(&doc) {
        let what = format!("{method} {path}");
        let secured = op.get("security").is_some();
        assert_eq!(secured, !open_ids.contains(&id(&op)), "{what}");
        // A request without a token: 401 where the document requires one
        // (the WebSocket upgrades refuse in-band, after the upgrade), and
        // never 401 where it does not.
        let upgrade = id(&op).starts_with("ws_");
        let (status, body, headers) = status_and_start(request(&s, &method, &path)).await;
        if secured && !upgrade {
            assert_eq!(status, 401, "{what}: {body}");
            assert!(
                op["responses"].get("401").is_some(),
                "{what}: 401 documented"
            );
            assert!(headers.get("www-authenticate").is_some(), "{what}");
            assert_error_body(&doc, &body, &what);
        } else {
            assert_ne!(status, 401, "{what}: {body}");
        }
    }
}

#[tokio::test]
async fn streams_and_upgrades_answer_as_documented() {
    let s = Server::memory(&[]).await;
    let doc = document(&s).await;
    s.publish("oa", "hello").await;

    // A stream: 200 text/event-stream with the documented headers; its
    // events have the documented shapes (a gap notice, then an event).
    for (path, target) in [
        (
            "/v1/channels/{channel}/sse",
            "/v1/channels/oa/sse?since=earliest",
        ),
        ("/v1/sse", "/v1/sse?channel=oa&since=earliest"),
    ] {
        let op = &doc["paths"][path]["get"];
        let ok = &op["responses"]["200"];
        assert!(
            ok["content"].get("text/event-stream").is_some(),
            "{path}: {ok}"
        );
        // The journal unreachable at open is a 200 with `retry:` only (an
        // EventSource gives up on a 503): documented there, not as a 503
        // (tests/it/cluster_outage.rs drives it).
        let ok_text = ok["description"].as_str().unwrap_or_default();
        assert!(
            ok_text.contains("journal is unreachable") && ok_text.contains("`retry:`"),
            "{path}: {ok_text}"
        );
        let busy = op["responses"]["503"]["description"]
            .as_str()
            .unwrap_or_default();
        assert!(
            busy.contains("`shutting_down`") && !busy.starts_with("`unavailable`"),
            "{path}: {busy}"
        );
        let req = s
            .http
            .get(s.url(target))
            .header("last-event-id", "not a cursor");
        let (status, body, headers) = status_and_start(req).await;
        assert_eq!(status, 200, "{path}: {body}");
        assert_eq!(headers["content-type"], "text/event-stream");
        for h in ok["headers"]
            .as_object()
            .expect("documented headers")
            .keys()
        {
            assert!(
                headers.get(h.as_str()).is_some(),
                "{path}: header {h} is documented"
            );
        }
        assert_eq!(headers["cache-control"], "no-cache, no-transform");
        // `Last-Event-ID` that is not a cursor: a gap notice (reason unknown)
        // whose data has exactly the fields of `GapNotice`.
        let gap = body
            .split("\n\n")
            .find(|f| f.starts_with("event: gap\n"))
            .unwrap_or_else(|| panic!("{path}: a gap notice: {body:?}"));
        let data: Value = serde_json::from_str(gap.trim_start_matches("event: gap\ndata: "))
            .unwrap_or_else(|_| panic!("{path}: gap data is JSON: {gap:?}"));
        let schema = &doc["components"]["schemas"]["GapNotice"];
        let documented: BTreeSet<&String> = schema["properties"]
            .as_object()
            .expect("properties")
            .keys()
            .collect();
        let sent: BTreeSet<&String> = data.as_object().expect("an object").keys().collect();
        assert_eq!(sent, documented, "{path}: {data}");
        assert_eq!(data["reason"], "unknown");
        let reasons = doc["components"]["schemas"]["GapReason"]["enum"]
            .as_array()
            .expect("enum");
        assert!(reasons.contains(&data["reason"]));
        let event_types = &doc["components"]["schemas"]["SseEvent"]["oneOf"];
        assert_eq!(
            event_types.as_array().map(Vec::len),
            Some(4),
            "event, gap notice, presence notice, token expired: {event_types}"
        );
    }

    // The upgrades: 101 with a WebSocket handshake, 400 (documented, with an
    // error body) without one.
    for (path, target) in [
        ("/v1/ws", "/v1/ws"),
        ("/v1/sessions/{id}/ws", "/v1/sessions/none/ws"),
    ] {
        let op = &doc["paths"][path]["get"];
        assert!(op["responses"].get("101").is_some(), "{path}");
        let names: BTreeSet<&str> = op["parameters"]
            .as_array()
            .expect("parameters")
            .iter()
            .filter(|p| p["in"] == "header" && p["required"] == true)
            .filter_map(|p| p["name"].as_str())
            .collect();
        assert!(
            [
                "Connection",
                "Upgrade",
                "Sec-WebSocket-Version",
                "Sec-WebSocket-Key"
            ]
            .iter()
            .all(|h| names.contains(h)),
            "{path}: the handshake headers are documented: {names:?}"
        );
        let ws = Ws::connect(s.addr, target).await;
        assert_eq!(ws.protocol.as_deref(), Some(PROTOCOL));
        let (status, body, _) = status_and_start(s.http.get(s.url(target))).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(op["responses"].get("400").is_some());
        assert_error_body(&doc, &body, path);
    }
}

/// `since` is documented where it is taken (both SSE operations, both
/// history pages) as the one `Since` schema, whose pattern is the rule's
/// (`gapless_protocol::since`) and whose examples the server accepts there.
#[tokio::test]
async fn since_is_documented_where_it_is_taken() {
    let s = Server::memory(&[]).await;
    s.publish("oa", "hello").await;
    let doc = document(&s).await;
    let since = &doc["components"]["schemas"]["Since"];
    assert_eq!(
        since["pattern"],
        gapless_protocol::since::SINCE_PATTERN,
        "{since}"
    );
    let text = since["description"].as_str().unwrap_or_default();
    for form in [
        "`live`",
        "`earliest`",
        "`last:N`",
        "`time:UNIX_MS`",
        "`evicted`",
    ] {
        assert!(text.contains(form), "the description names {form}: {text}");
    }
    for (path, target) in [
        ("/v1/channels/{channel}/sse", "/v1/channels/oa/sse"),
        ("/v1/sse", "/v1/sse?channel=oa"),
        ("/v1/channels/{channel}/events", "/v1/channels/oa/events"),
        ("/v1/sessions/{id}/events", ""),
    ] {
        let param = doc["paths"][path]["get"]["parameters"]
            .as_array()
            .expect("parameters")
            .iter()
            .find(|p| p["name"] == "since")
            .unwrap_or_else(|| panic!("{path}: a since parameter"))
            .clone();
        assert_eq!(param["in"], "query", "{path}");
        assert_eq!(
            param["schema"]["$ref"], "#/components/schemas/Since",
            "{path}: {param}"
        );
        if target.is_empty() {
            continue;
        }
        for example in since["examples"].as_array().expect("examples") {
            let v = example.as_str().expect("a string");
            let sep = if target.contains('?') { '&' } else { '?' };
            let (status, body, _) =
                status_and_start(s.http.get(s.url(&format!("{target}{sep}since={v}")))).await;
            assert_eq!(status, 200, "{path} since={v}: {body}");
        }
    }
}

/// What schemathesis found in the server, fixed there: each stays fixed.
#[tokio::test]
async fn schemathesis_findings_stay_fixed() {
    let s = Server::memory(&[]).await;
    // A JSON `null` body creates a session with a drawn id (the document
    // allows it, as `{"id": null}`); it was a 400.
    let r = s
        .post(
            "/v1/sessions",
            "null",
            &[("content-type", "application/json")],
        )
        .await;
    let created = r.expect(201);
    assert_eq!(created["status"], "open");
    assert!(
        created["id"].as_str().is_some_and(|id| id.len() == 32),
        "{created}"
    );
    // A garbage `last_event_id` is 400 even when a `Last-Event-ID` header
    // (which decides the start) is present; the garbage was ignored.
    for target in [
        "/v1/channels/c/sse?last_event_id=garbage",
        "/v1/sse?channel=c&last_event_id=garbage",
    ] {
        let req = s
            .http
            .get(s.url(target))
            .header("last-event-id", "anything");
        let (status, body, _) = status_and_start(req).await;
        assert_eq!(status, 400, "{target}: {body}");
        let v: Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(v["error"], "invalid_cursor", "{body}");
    }
    // The header alone still starts with a gap notice, not an error.
    let req = s
        .http
        .get(s.url("/v1/channels/c/sse"))
        .header("last-event-id", "anything");
    let (status, body, _) = status_and_start(req).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("event: gap\n"), "{body}");
}
