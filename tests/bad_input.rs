//! Bad input over HTTP, endpoint by endpoint: malformed JSON, wrong types,
//! missing fields, huge bodies, huge strings inside small bodies, unknown
//! ids, path traversal in names, non-UTF-8 bytes (in bodies, paths and
//! query strings) and bad query strings. Every answer is a 4xx with our
//! JSON error body `{"error": {"code", "message"}}`, never a 5xx and never
//! a hang; the server keeps serving afterwards.
//!
//! One exception is part of the contract: `POST /v1/tools/{name}/invoke`
//! always answers with the full `ToolExecutionResult` once the body parsed
//! and fits the document (`is_success: false`, `error`, `error_type`; the
//! status from the error type), so a caller sees the same outcome the model
//! would. Bodies are JSON objects and nothing else: an array (which serde
//! would read as a struct's fields in order) is a 422 like any other
//! value that breaks the documented schema, and no message names a Rust
//! type. Requests the
//! HTTP parser itself refuses (raw non-UTF-8 bytes in the request line)
//! never reach the router: for those only "a 400, no hang" is checked.
//!
//! Random bodies (proptest, bounded case counts) go to
//! `POST /v1/sessions/{id}/messages`, `POST /v1/tools/calculator/invoke`,
//! `POST /v1/tools/{name}/validate` and `POST /v1/sessions`.

mod support;

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::{AppOptions, Client, TestApp, send, spawn_app};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A session id no session has.
const UNKNOWN_SESSION: &str = "00000000-0000-7000-8000-000000000000";
/// Any request that takes longer than this is a hang.
const HANG: Duration = Duration::from_secs(30);
/// Cases per property: enough to hit odd shapes, few enough for seconds.
const CASES: u32 = 48;

/// Asserts a 4xx whose body is exactly `{"error": {"code", "message"[, "details"]}}`.
#[track_caller]
fn assert_api_error(what: &str, status: StatusCode, body: &Value) {
    assert!(
        status.is_client_error(),
        "{what}: expected a 4xx, got {status}: {body}"
    );
    assert_error_shape(what, status, body);
}

#[track_caller]
fn assert_error_shape(what: &str, status: StatusCode, body: &Value) {
    let Some(outer) = body.as_object() else {
        panic!("{what}: {status} body is not a JSON object: {body}");
    };
    assert_eq!(outer.len(), 1, "{what}: {status} extra keys in {body}");
    let error = body["error"]
        .as_object()
        .unwrap_or_else(|| panic!("{what}: {status} no error object in {body}"));
    let code = error
        .get("code")
        .and_then(Value::as_str)
        .unwrap_or_default();
    assert!(
        !code.is_empty() && code.chars().all(|c| c.is_ascii_uppercase() || c == '_'),
        "{what}: {status} bad error code in {body}"
    );
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or_default();
    assert!(
        !message.is_empty(),
        "{what}: {status} empty message: {body}"
    );
    assert!(
        error
            .keys()
            .all(|k| ["code", "message", "details"].contains(&k.as_str())),
        "{what}: {status} unexpected keys in {body}"
    );
}

/// Asserts an invoke answer: our error body (the request was refused before
/// the executor) or a failed `ToolExecutionResult`, and never a 5xx other
/// than the tool's own failure kinds.
#[track_caller]
fn assert_invoke_refused(what: &str, status: StatusCode, body: &Value) {
    assert!(
        status.is_client_error(),
        "{what}: expected a 4xx, got {status}: {body}"
    );
    if body.get("error").is_some_and(Value::is_object) {
        assert_error_shape(what, status, body);
    } else {
        assert_eq!(body["is_success"], false, "{what}: {status} {body}");
        assert!(body["error"].is_string(), "{what}: {status} {body}");
        assert!(body["error_type"].is_string(), "{what}: {status} {body}");
    }
}

/// Never a 5xx; an error is in our shape (or, for invoke, a failed result).
#[track_caller]
fn assert_sane(what: &str, path: &str, status: StatusCode, body: &Value) {
    assert!(
        !status.is_server_error(),
        "{what}: {path} answered {status}: {body}"
    );
    if status.is_client_error() {
        if path.ends_with("/invoke") {
            assert_invoke_refused(what, status, body);
        } else {
            assert_api_error(what, status, body);
        }
    }
}

struct Api {
    app: TestApp,
    /// The app's client, every request bounded by [`HANG`].
    client: Client,
}

impl Api {
    fn start() -> Api {
        let app = spawn_app(AppOptions::offline());
        let client = app.client.clone().with_timeout(HANG);
        Api { app, client }
    }

    async fn raw(&self, method: Method, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
        self.client.send_raw(method, path, body).await
    }

    async fn json(&self, method: Method, path: &str, body: &Value) -> (StatusCode, Value) {
        self.raw(method, path, serde_json::to_vec(body).unwrap())
            .await
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.client.get(path).await
    }

    /// Sends bytes exactly as given on a fresh connection (no URL
    /// normalisation, no encoding) and returns the status and body.
    async fn wire(&self, request: &[u8]) -> (u16, Vec<u8>) {
        let addr = self.app.base.trim_start_matches("http://").to_owned();
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect");
            stream.write_all(request).await.expect("write");
            let mut response = Vec::new();
            stream
                .read_to_end(&mut response)
                .await
                .expect("read the response");
            response
        };
        let response = tokio::time::timeout(HANG, exchange)
            .await
            .expect("the server answered (no hang)");
        let text = String::from_utf8_lossy(&response);
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {text:?}"));
        let body = match response.windows(4).position(|w| w == b"\r\n\r\n") {
            Some(at) => response[at + 4..].to_vec(),
            None => Vec::new(),
        };
        (status, body)
    }

    async fn wire_get(&self, target: &[u8]) -> (u16, Value) {
        let mut request = b"GET ".to_vec();
        request.extend_from_slice(target);
        request.extend_from_slice(b" HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        let (status, body) = self.wire(&request).await;
        // The body may be chunked; our JSON bodies come with a length.
        let body = serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
        (status, body)
    }

    async fn session(&self) -> String {
        let (status, body) = self
            .json(Method::POST, "/v1/sessions", &json!({"agent": "assistant"}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["id"].as_str().unwrap().to_owned()
    }

    /// The server still serves a normal turn.
    async fn still_serves(&self) {
        let session = self.session().await;
        let (status, body) = self
            .json(
                Method::POST,
                &format!("/v1/sessions/{session}/messages"),
                &json!({"content": "What is 6*7?"}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body["answer"].as_str().unwrap_or_default().contains("42"));
    }
}

/// Every POST route with a JSON body, with a body it would accept.
fn post_routes(session: &str) -> Vec<(String, Value)> {
    vec![
        ("/v1/sessions".into(), json!({"agent": "assistant"})),
        (
            format!("/v1/sessions/{session}/messages"),
            json!({"content": "hello"}),
        ),
        (
            "/v1/tools/calculator/invoke".into(),
            json!({"params": {"expression": "1+1"}}),
        ),
        (
            "/v1/tools/calculator/validate".into(),
            json!({"params": {"expression": "1+1"}}),
        ),
        (
            format!("/v1/confirmations/conf_{}", "0".repeat(32)),
            json!({"approve": false}),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_and_non_utf8_bodies_are_400_everywhere() {
    let api = Api::start();
    let session = api.session().await;
    let bodies: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"{".to_vec(),
        b"}".to_vec(),
        b"{content: 1}".to_vec(),
        b"{\"a\":1,}".to_vec(),
        b"[1,2".to_vec(),
        b"nul".to_vec(),
        b"{\"a\":\"\\uZZZZ\"}".to_vec(),
        b"{\"a\":\"\\ud800\"}".to_vec(),
        b"\xef\xbb\xbf{}".to_vec(),
        vec![0xff, 0xfe, 0x00, 0x7b],
        [b"{\"content\": \"".as_slice(), &[0xc3, 0x28], b"\"}"].concat(),
        [
            b"{\"params\": {\"expression\": \"".as_slice(),
            &[0xed, 0xa0, 0x80],
            b"\"}}",
        ]
        .concat(),
        // Nested deeper than serde_json's recursion limit.
        [b"{\"params\":".repeat(200), b"1".to_vec(), b"}".repeat(200)].concat(),
        "[".repeat(10_000).into_bytes(),
    ];
    for (path, _) in post_routes(&session) {
        for body in &bodies {
            let (status, reply) = api.raw(Method::POST, &path, body.clone()).await;
            let what = format!("POST {path} {:?}", String::from_utf8_lossy(body));
            assert_api_error(&what, status, &reply);
            assert!(
                status == StatusCode::BAD_REQUEST || status == StatusCode::UNPROCESSABLE_ENTITY,
                "{what}: {status} {reply}"
            );
        }
    }
    api.still_serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_types_missing_and_unknown_fields_are_422() {
    let api = Api::start();
    let session = api.session().await;
    let messages = format!("/v1/sessions/{session}/messages");
    let confirm = format!("/v1/confirmations/conf_{}", "0".repeat(32));
    let cases: Vec<(&str, Value)> = vec![
        ("/v1/sessions", json!({})),
        ("/v1/sessions", json!({"agent": 5})),
        ("/v1/sessions", json!({"agent": null})),
        ("/v1/sessions", json!({"agent": ["assistant"]})),
        ("/v1/sessions", json!({"agent": "assistant", "plan": 3})),
        (
            "/v1/sessions",
            json!({"agent": "assistant", "plan": "gold"}),
        ),
        ("/v1/sessions", json!({"agent": "assistant", "user_id": {}})),
        (
            "/v1/sessions",
            json!({"agent": "assistant", "metadata": [1]}),
        ),
        (
            "/v1/sessions",
            json!({"agent": "assistant", "metadata": "x"}),
        ),
        ("/v1/sessions", json!({"agent": "assistant", "admin": true})),
        ("/v1/sessions", json!([])),
        ("/v1/sessions", json!("assistant")),
        ("/v1/sessions", json!(null)),
        (&messages, json!({})),
        (&messages, json!({"content": 1})),
        (&messages, json!({"content": true})),
        (&messages, json!({"content": {"text": "hi"}})),
        (&messages, json!({"content": "   "})),
        (&messages, json!({"content": "hi", "role": "system"})),
        (&messages, json!([{"content": "hi"}])),
        ("/v1/tools/calculator/invoke", json!({"params": 1})),
        ("/v1/tools/calculator/invoke", json!({"params": "1+1"})),
        ("/v1/tools/calculator/invoke", json!({"params": [1]})),
        ("/v1/tools/calculator/invoke", json!({"params": {}})),
        (
            "/v1/tools/calculator/invoke",
            json!({"params": {"expression": 5}}),
        ),
        (
            "/v1/tools/calculator/invoke",
            json!({"params": {"expression": "1+1"}, "plan": "gold"}),
        ),
        (
            "/v1/tools/calculator/invoke",
            json!({"params": {"expression": "1+1"}, "priority": "high"}),
        ),
        (
            "/v1/tools/calculator/invoke",
            json!({"params": {"expression": "1+1"}, "priority": 1e300}),
        ),
        (
            "/v1/tools/calculator/invoke",
            json!({"params": {"expression": "1+1"}, "user_id": 7}),
        ),
        (
            "/v1/tools/calculator/invoke",
            json!({"params": {"expression": "1+1"}, "sudo": true}),
        ),
        ("/v1/tools/calculator/invoke", json!([])),
        ("/v1/tools/calculator/validate", json!({"other": 1})),
        ("/v1/tools/calculator/validate", json!(7)),
        (&confirm, json!({})),
        (&confirm, json!({"approve": "yes"})),
        (&confirm, json!({"approve": 1})),
        (&confirm, json!({"approve": true, "extra": 1})),
    ];
    for (path, body) in cases {
        let (status, reply) = api.json(Method::POST, path, &body).await;
        let what = format!("POST {path} {body}");
        if path.ends_with("/invoke") {
            assert_invoke_refused(&what, status, &reply);
        } else {
            assert_api_error(&what, status, &reply);
        }
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{what}: {reply}");
    }
    // `validate` answers 200 with the errors listed: it is a question.
    let (status, reply) = api
        .json(
            Method::POST,
            "/v1/tools/calculator/validate",
            &json!({"params": {"expression": 5}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["is_valid"], false, "{reply}");
    api.still_serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_bodies_are_413_and_huge_strings_are_refused_or_bounded() {
    let api = Api::start();
    let session = api.session().await;
    let messages = format!("/v1/sessions/{session}/messages");
    // A body over the 1 MiB cap, on every POST route.
    for (path, _) in post_routes(&session) {
        let mut body = b"{\"x\": \"".to_vec();
        body.resize(2 << 20, b'a');
        body.extend_from_slice(b"\"}");
        let (status, reply) = api.raw(Method::POST, &path, body).await;
        assert_api_error(&format!("2 MiB body to {path}"), status, &reply);
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{path}: {reply}");
    }
    // Huge strings inside bodies under the cap.
    let big = "9".repeat(900_000);
    let (status, reply) = api
        .json(Method::POST, &messages, &json!({ "content": big }))
        .await;
    assert_api_error("900 kB content", status, &reply);
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let (status, reply) = api
        .json(
            Method::POST,
            "/v1/tools/calculator/invoke",
            &json!({"params": {"expression": format!("1{}", "+1".repeat(400_000))}}),
        )
        .await;
    assert_invoke_refused("800 kB expression", status, &reply);
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{reply}");
    let nested = format!("{}1{}", "(".repeat(100_000), ")".repeat(100_000));
    let (status, reply) = api
        .json(
            Method::POST,
            "/v1/tools/calculator/invoke",
            &json!({"params": {"expression": nested}}),
        )
        .await;
    assert_invoke_refused("100k nested parentheses", status, &reply);
    for (path, body) in [
        ("/v1/sessions", json!({"agent": big})),
        (
            "/v1/tools/calculator/validate",
            json!({"params": {"expression": big}}),
        ),
        ("/v1/sessions", json!({"agent": "assistant", "plan": big})),
    ] {
        let (status, reply) = api.json(Method::POST, path, &body).await;
        assert_sane("huge string", path, status, &reply);
    }
    // A huge tool name in the path.
    let name = "a".repeat(60_000);
    for path in [
        format!("/v1/tools/{name}"),
        format!("/v1/tools/{name}/validate"),
    ] {
        let (status, reply) = if path.ends_with("validate") {
            api.json(Method::POST, &path, &json!({})).await
        } else {
            api.get(&path).await
        };
        assert_sane("huge name", "…", status, &reply);
        assert!(status.is_client_error(), "{status} {reply}");
    }
    api.still_serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_ids_are_404_everywhere() {
    let api = Api::start();
    let unknown_conf = format!("conf_{}", "0".repeat(32));
    for path in [
        format!("/v1/sessions/{UNKNOWN_SESSION}"),
        format!("/v1/sessions/{UNKNOWN_SESSION}/messages"),
        format!("/v1/sessions/{UNKNOWN_SESSION}/summary"),
        "/v1/sessions/not-a-uuid".into(),
        "/v1/sessions/%20".into(),
        "/v1/tools/no_such_tool".into(),
        format!("/v1/confirmations/{unknown_conf}"),
        "/v1/confirmations/..".into(),
        "/v1/limits/quota?tool=no_such_tool".into(),
        format!("/v1/sessions/{UNKNOWN_SESSION}/export"),
        "/v1/improve".into(),
        "/v2/sessions".into(),
        "/v1/tools/calculator/nope".into(),
    ] {
        let (status, reply) = api.get(&path).await;
        assert_api_error(&format!("GET {path}"), status, &reply);
        assert!(
            status == StatusCode::NOT_FOUND || status == StatusCode::METHOD_NOT_ALLOWED,
            "GET {path}: {status} {reply}"
        );
    }
    for (path, body) in [
        (
            format!("/v1/sessions/{UNKNOWN_SESSION}/messages"),
            json!({"content": "hi"}),
        ),
        ("/v1/sessions".into(), json!({"agent": "no-such-agent"})),
        (
            "/v1/tools/no_such_tool/validate".into(),
            json!({"params": {}}),
        ),
        (
            "/v1/tools/no_such_tool/invoke".into(),
            json!({"params": {}}),
        ),
        (
            format!("/v1/confirmations/{unknown_conf}"),
            json!({"approve": true}),
        ),
        (
            format!("/v1/confirmations/{unknown_conf}"),
            json!({"approve": false}),
        ),
    ] {
        let (status, reply) = api.json(Method::POST, &path, &body).await;
        let what = format!("POST {path}");
        if path.ends_with("/invoke") {
            assert_invoke_refused(&what, status, &reply);
        } else {
            assert_api_error(&what, status, &reply);
        }
        assert_eq!(status, StatusCode::NOT_FOUND, "{what}: {reply}");
    }
    // Filters on unknown ids are empty lists, not errors.
    for path in [
        format!("/v1/calls?conversation_id={UNKNOWN_SESSION}"),
        "/v1/calls?tool=never_invoked_tool".into(),
        "/v1/calls?workflow_id=nope".into(),
    ] {
        let (status, reply) = api.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {reply}");
        assert_eq!(reply["count"], 0, "{path}: {reply}");
    }
}

/// An id or filter holding NUL names nothing stored: 404 or an empty
/// list, as on redb, and never a storage error on PostgreSQL (whose text
/// cannot hold NUL: such a key would make the query fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_holding_nul_names_nothing() {
    let api = Api::start();
    let session = api.app.session("assistant").await;
    for path in [
        format!("/v1/sessions/{session}/turns/t%00"),
        "/v1/workflows/runs/r%00".to_string(),
        "/v1/workflows/runs/r%00/events".to_string(),
        "/v1/keys/k%00".to_string(),
        "/v1/tenants/t%00/config".to_string(),
    ] {
        let (status, reply) = api.get(&path).await;
        assert_api_error(&format!("GET {path}"), status, &reply);
    }
    for path in [
        "/v1/calls?tool=x%00",
        "/v1/calls?conversation_id=x%00",
        "/v1/calls?workflow_id=x%00",
    ] {
        let (status, reply) = api.get(path).await;
        assert_eq!(status, StatusCode::OK, "GET {path}: {reply}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_traversal_in_names_reaches_no_file() {
    let api = Api::start();
    let names = [
        "..%2F..%2Fetc%2Fpasswd",
        "..%2f..%2f..%2fetc%2fpasswd",
        "%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
        "..%5C..%5Cwindows%5Cwin.ini",
        "%2Fetc%2Fpasswd",
        "....%2F%2F....%2F%2Fetc%2Fpasswd",
        "calculator%00",
        "calculator%2F..%2Fecho",
        "%C0%AE%C0%AE%2Fetc%2Fpasswd",
        "http_request%3F",
    ];
    for name in names {
        let (status, reply) = api
            .json(
                Method::POST,
                &format!("/v1/tools/{name}/invoke"),
                &json!({"params": {}}),
            )
            .await;
        let what = format!("invoke {name}");
        assert_invoke_refused(&what, status, &reply);
        assert!(
            !reply.to_string().contains("root:"),
            "{what}: file content leaked: {reply}"
        );
        for (method, suffix) in [(Method::GET, ""), (Method::POST, "/validate")] {
            let path = format!("/v1/tools/{name}{suffix}");
            let (status, reply) = api.json(method.clone(), &path, &json!({})).await;
            let what = format!("{method} {path}");
            assert_api_error(&what, status, &reply);
            assert!(!reply.to_string().contains("root:"), "{what}: {reply}");
        }
        for path in [
            format!("/v1/sessions/{name}"),
            format!("/v1/sessions/{name}/messages"),
            format!("/v1/confirmations/{name}"),
        ] {
            let (status, reply) = api.get(&path).await;
            assert_api_error(&format!("GET {path}"), status, &reply);
        }
    }
    // Unencoded `..` segments go to the router as they are (no normalising).
    for target in [
        "/v1/tools/../../etc/passwd/invoke",
        "/v1/tools/../v1/stats",
        "/v1/sessions/../../../etc/passwd",
        "/v1/../../metrics",
        "//v1/tools",
    ] {
        let (status, body) = api.wire_get(target.as_bytes()).await;
        let status = StatusCode::from_u16(status).unwrap();
        assert_api_error(&format!("GET {target}"), status, &body);
        assert!(!body.to_string().contains("root:"), "{target}: {body}");
    }
    api.still_serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_query_strings_and_encodings_are_json_4xx() {
    let api = Api::start();
    let session = api.session().await;
    let cases = [
        "/v1/calls?limit=abc",
        "/v1/calls?limit=-1",
        "/v1/calls?limit=0",
        "/v1/calls?limit=1001",
        "/v1/calls?limit=99999999999999999999999999",
        "/v1/calls?limit=1e3",
        "/v1/calls?limit=",
        "/v1/calls?unknown=1",
        "/v1/calls?limit=1&limit=2",
        "/v1/tools?plan=gold",
        "/v1/tools?plan=%FF",
        "/v1/tools?plan=",
        "/v1/limits/quota",
        "/v1/limits/quota?user_id=u1",
        "/v1/limits/quota?tool=",
        "/v1/limits/quota?tool=%FF%FE",
        "/v1/limits/quota?tool=calculator&tool=echo",
        "/v1/sessions/%FF",
        "/v1/sessions/%FF%FE/messages",
        "/v1/sessions/%C3%28/summary",
        "/v1/tools/%FF",
        "/v1/tools/%ED%A0%80/validate",
        "/v1/confirmations/%FF",
        "/v1/sessions/%",
        "/v1/tools/%ZZ",
    ];
    for path in cases {
        let (status, reply) = api.get(path).await;
        assert_api_error(&format!("GET {path}"), status, &reply);
    }
    for path in [
        "/v1/tools/%FF/invoke",
        "/v1/tools/%FF/validate",
        "/v1/confirmations/%FF",
    ] {
        let (status, reply) = api.json(Method::POST, path, &json!({"params": {}})).await;
        let what = format!("POST {path}");
        if path.ends_with("/invoke") {
            assert_invoke_refused(&what, status, &reply);
        } else {
            assert_api_error(&what, status, &reply);
        }
    }
    for query in [
        "x=%FF",
        "limit=abc",
        "after=-1",
        "limit=0",
        "limit=1001",
        "after=1&after=2",
    ] {
        let path = format!("/v1/sessions/{session}/messages?{query}");
        let (status, reply) = api.get(&path).await;
        assert_api_error(&format!("GET {path}"), status, &reply);
    }
    // Well-formed queries still work.
    for path in [
        "/v1/calls?limit=1",
        "/v1/tools?plan=pro",
        "/v1/limits/quota?tool=calculator&user_id=u1",
        "/v1/limits?anything=1",
        "/v1/stats?x=%FF",
        "/v1/confirmations?limit=1",
    ] {
        let (status, reply) = api.get(path).await;
        assert_eq!(status, StatusCode::OK, "{path}: {reply}");
    }
    // Listings take `limit` and `cursor`, and nothing else, like the others.
    let (status, reply) = api.get("/v1/confirmations?x=1").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{reply}");
    assert_api_error("GET /v1/confirmations?x=1", status, &reply);
    let (status, body) = api.wire_get(b"/metrics?%FF=%FE").await;
    assert_eq!(status, 200, "{body}");
    // Raw non-UTF-8 bytes in the request line never reach the router: the
    // HTTP parser refuses them. No hang, no 5xx.
    for target in [
        b"/v1/sessions/\xff\xfe".as_slice(),
        b"/v1/tools?plan=\xff",
        b"/v1/tools/calc\x00ulator",
    ] {
        let (status, body) = api.wire_get(target).await;
        assert!((400..500).contains(&status), "{target:?}: {status} {body}");
    }
    api.still_serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_methods_and_content_types_are_json_4xx() {
    let api = Api::start();
    let session = api.session().await;
    let routes = [
        "/healthz".to_string(),
        "/v1/sessions".into(),
        format!("/v1/sessions/{session}"),
        format!("/v1/sessions/{session}/messages"),
        format!("/v1/sessions/{session}/summary"),
        "/v1/tools".into(),
        "/v1/tools/calculator".into(),
        "/v1/tools/calculator/invoke".into(),
        "/v1/tools/calculator/validate".into(),
        "/v1/confirmations".into(),
        format!("/v1/confirmations/conf_{}", "0".repeat(32)),
        "/v1/calls".into(),
        "/v1/stats".into(),
        "/v1/limits".into(),
        "/v1/limits/quota".into(),
        "/v1/events".into(),
        "/metrics".into(),
    ];
    let deletable = format!("/v1/sessions/{session}");
    for path in &routes {
        for method in [Method::PUT, Method::DELETE, Method::PATCH] {
            if method == Method::DELETE && (*path == deletable || path == "/v1/sessions") {
                // `DELETE /v1/sessions/{id}` exists (tests/erase.rs), and
                // so does `DELETE /v1/sessions?before=` (tests/retention.rs).
                continue;
            }
            let (status, reply) = api.json(method.clone(), path, &json!({})).await;
            let what = format!("{method} {path}");
            assert_api_error(&what, status, &reply);
            assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{what}: {reply}");
        }
    }
    for (path, _) in post_routes(&session) {
        for content_type in [
            None,
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
        ] {
            let mut request = api.client.request(Method::POST, &path).body("{}");
            if let Some(t) = content_type {
                request = request.header("content-type", t);
            }
            let (status, reply) = send(request).await;
            let what = format!("POST {path} as {content_type:?}");
            assert_api_error(&what, status, &reply);
            assert_eq!(
                status,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "{what}: {reply}"
            );
        }
    }
    // GET-only resources ignore a body; they never fail on one.
    for path in ["/v1/stats", "/v1/limits", "/v1/calls", "/v1/confirmations"] {
        let (status, reply) = api.raw(Method::GET, path, b"{{{{".to_vec()).await;
        assert_eq!(status, StatusCode::OK, "{path}: {reply}");
    }
    api.still_serves().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_and_metrics_survive_bad_requests() {
    let api = Api::start();
    // The SSE stream opens despite junk in the query and a body.
    let r = api
        .client
        .request(Method::GET, "/v1/events?since=%FF&x")
        .header("accept", "text/event-stream")
        .body("{not json")
        .send()
        .await
        .expect("events answer");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap_or_default()
            .starts_with("text/event-stream")
    );
    drop(r);
    for _ in 0..20 {
        let r = api
            .client
            .request(Method::GET, "/v1/events")
            .send()
            .await
            .expect("events answer");
        assert_eq!(r.status(), StatusCode::OK);
        drop(r);
    }
    let (status, body) = api.get("/metrics?format=json").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body.as_str()
            .unwrap_or_default()
            .contains("cadre_tool_concurrent")
    );
    api.still_serves().await;
}

// ---------------------------------------------------------------------------
// Properties: random bodies
// ---------------------------------------------------------------------------

/// Arbitrary JSON, biased toward the field names the API reads.
fn json_value() -> impl Strategy<Value = Value> {
    let key = prop_oneof![
        Just("content".to_owned()),
        Just("params".to_owned()),
        Just("expression".to_owned()),
        Just("agent".to_owned()),
        Just("plan".to_owned()),
        Just("user_id".to_owned()),
        Just("priority".to_owned()),
        Just("metadata".to_owned()),
        Just("approve".to_owned()),
        "[a-z_]{0,8}",
        ".{0,6}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        ".{0,40}".prop_map(Value::String),
        "[0-9+*/().^%-]{0,40}".prop_map(Value::String),
        Just(Value::String("assistant".into())),
        Just(Value::String("pro".into())),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key.clone(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A body: usually JSON (often an object around the real field), sometimes bytes.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => json_value().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        2 => json_value().prop_map(|v| serde_json::to_vec(&json!({"content": v})).unwrap()),
        2 => json_value().prop_map(|v| serde_json::to_vec(&json!({"params": v})).unwrap()),
        1 => json_value().prop_map(|v| {
            serde_json::to_vec(&json!({"params": {"expression": v}})).unwrap()
        }),
        1 => prop::collection::vec(any::<u8>(), 0..200),
        1 => json_value().prop_map(|v| {
            // Valid JSON cut short.
            let mut b = serde_json::to_vec(&v).unwrap();
            let keep = b.len() / 2;
            b.truncate(keep);
            b
        }),
    ]
}

/// Runs `CASES` random bodies against each path; every answer is sane.
fn random_bodies_against(paths: &[&str]) {
    let api = Api::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let session = rt.block_on(api.session());
    let paths: Vec<String> = paths
        .iter()
        .map(|p| p.replace("{session}", &session))
        .collect();
    let mut runner = TestRunner::new(ProptestConfig {
        cases: CASES,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    for path in &paths {
        runner
            .run(&body(), |bytes| {
                let (status, reply) = rt.block_on(api.raw(Method::POST, path, bytes.clone()));
                let what = format!("POST {path} {:?}", String::from_utf8_lossy(&bytes));
                prop_assert!(!status.is_server_error(), "{}: {} {}", what, status, reply);
                assert_sane(&what, path, status, &reply);
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{path}: {e}"));
    }
    rt.block_on(api.still_serves());
}

#[test]
fn random_bodies_to_messages_are_answered_or_refused_in_json() {
    random_bodies_against(&["/v1/sessions/{session}/messages"]);
}

#[test]
fn random_bodies_to_calculator_invoke_are_answered_or_refused_in_json() {
    random_bodies_against(&["/v1/tools/calculator/invoke", "/v1/tools/echo/invoke"]);
}

#[test]
fn random_bodies_to_validate_and_create_are_answered_or_refused_in_json() {
    random_bodies_against(&[
        "/v1/tools/calculator/validate",
        "/v1/sessions",
        "/v1/confirmations/conf_00000000000000000000000000000000",
    ]);
}

/// Words of Rust's or serde's that an error message must not show.
const RUST_WORDS: [&str; 13] = [
    "struct ",
    "enum ",
    "Body",
    "TenantConfig",
    "ToolConfig",
    "u32",
    "i32",
    "u64",
    "usize",
    "String",
    "Option<",
    "Vec<",
    "serde",
];

#[track_caller]
fn assert_no_rust_words(what: &str, body: &Value) {
    let message = body["error"]["message"].as_str().unwrap_or_default();
    for word in RUST_WORDS {
        assert!(!message.contains(word), "{what}: {word:?} in {message:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_json_objects_and_nothing_else() {
    let api = Api::start();
    let session = api.session().await;
    let (_, before) = api.get("/v1/sessions").await;
    let mut routes: Vec<(Method, String)> = post_routes(&session)
        .into_iter()
        .map(|(path, _)| (Method::POST, path))
        .collect();
    routes.push((Method::POST, "/v1/tenants/default/config".into()));
    routes.push((Method::PATCH, "/v1/tenants/default/config".into()));
    routes.push((Method::POST, "/v1/improve".into()));
    routes.push((Method::POST, "/v1/workflows/market-brief/runs".into()));
    let not_objects = [
        json!([]),
        json!(["assistant", null, null, null]),
        json!([{"content": "hi"}]),
        json!([true, false, true, null, null, null, null, 0, {}]),
        json!("assistant"),
        json!(7),
        json!(true),
        json!(null),
    ];
    for (method, path) in &routes {
        for body in &not_objects {
            let (status, reply) = api.json(method.clone(), path, body).await;
            let what = format!("{method} {path} {body}");
            assert_api_error(&what, status, &reply);
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{what}: {reply}");
            assert_eq!(reply["error"]["code"], "VALIDATION_ERROR", "{what}");
            assert_no_rust_words(&what, &reply);
        }
    }
    let (_, after) = api.get("/v1/sessions").await;
    assert_eq!(before["count"], after["count"], "no session was created");

    // Nested objects too: serde's sequence form of a nested struct.
    let (status, _) = api
        .json(
            Method::PATCH,
            "/v1/tenants/default/config",
            &json!({"temperature": 0.5}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    for body in [
        json!({"tool_config": [true, null, null, true, null]}),
        json!({"tool_config": []}),
        json!([]),
    ] {
        let (status, reply) = api
            .json(Method::PATCH, "/v1/tenants/default/config", &body)
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {reply}");
        assert_no_rust_words(&body.to_string(), &reply);
    }
    let (_, config) = api.get("/v1/tenants/default/config").await;
    assert_eq!(
        config["config"]["temperature"],
        json!(0.5),
        "the config was not reset: {config}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_values_are_422_in_json_terms() {
    let api = Api::start();
    let session = api.session().await;
    let cases = [
        (
            Method::POST,
            "/v1/sessions".to_string(),
            json!({"agent": "assistant", "plan": "Pro"}),
        ),
        (Method::POST, "/v1/sessions".into(), json!({"agent": "   "})),
        (Method::POST, "/v1/sessions".into(), json!({"agent": ""})),
        (
            Method::POST,
            format!("/v1/sessions/{session}/messages"),
            json!({"content": "\u{a0}\n"}),
        ),
        (Method::POST, "/v1/improve".into(), json!({"text": ""})),
        (
            Method::POST,
            "/v1/tools/calculator/invoke".into(),
            json!({"params": {"expression": "1"}, "priority": 3_000_000_000u64}),
        ),
        (
            Method::POST,
            "/v1/tools/calculator/invoke".into(),
            json!({"params": {"expression": "1"}, "priority": 1.5}),
        ),
        (
            Method::PATCH,
            "/v1/tenants/default/config".into(),
            json!({"max_response_tokens": 5e9}),
        ),
        (
            Method::PATCH,
            "/v1/tenants/default/config".into(),
            json!({"temperature": 2.0000001}),
        ),
        (
            Method::PATCH,
            "/v1/tenants/default/config".into(),
            json!({"response_delay_ms": -1}),
        ),
        (
            Method::PATCH,
            "/v1/tenants/default/config".into(),
            json!({"tool_config": {"allowed_paths": ["docs"]}}),
        ),
        (
            Method::POST,
            "/v1/tenants/default/config".into(),
            json!({"custom_system_prompt": "x".repeat(20_001)}),
        ),
    ];
    for (method, path, body) in cases {
        let what = format!(
            "{method} {path} {}",
            body.to_string().chars().take(80).collect::<String>()
        );
        let (status, reply) = api.json(method, &path, &body).await;
        assert_api_error(&what, status, &reply);
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{what}: {reply}");
        assert_no_rust_words(&what, &reply);
    }
    // Integral numbers are integers, as JSON Schema counts them.
    let (status, reply) = api
        .json(
            Method::PATCH,
            "/v1/tenants/default/config",
            &json!({"response_delay_ms": 0.0, "max_response_tokens": 512.0}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["config"]["max_response_tokens"], json!(512));
    // A prompt of 20,000 characters is within bounds, however many bytes.
    let (status, reply) = api
        .json(
            Method::POST,
            "/v1/tenants/default/config",
            &json!({"custom_system_prompt": "é".repeat(20_000)}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_out_of_range_is_422_however_large() {
    let api = Api::start();
    let session = api.session().await;
    let history = format!("/v1/sessions/{session}/messages");
    for path in ["/v1/calls", history.as_str(), "/v1/workflows/runs"] {
        for limit in [
            "0",
            "1001",
            "99999999999999999999999999",
            "-1",
            "abc",
            "1e3",
            "1.5",
        ] {
            let url = format!("{path}?limit={limit}");
            let (status, reply) = api.get(&url).await;
            assert_api_error(&url, status, &reply);
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{url}: {reply}");
            assert_eq!(reply["error"]["code"], "VALIDATION_ERROR", "{url}");
        }
        for limit in ["1", "1000", "12.0"] {
            let url = format!("{path}?limit={limit}");
            let (status, reply) = api.get(&url).await;
            assert_eq!(status, StatusCode::OK, "{url}: {reply}");
        }
    }
    for query in ["wait=maybe", "unknown=1"] {
        let url = format!("/v1/workflows/runs/no-such-run/resume?{query}");
        let (status, reply) = api.json(Method::POST, &url, &json!({})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{url}: {reply}");
    }
    let (status, _) = api.get("/v1/limits/quota").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "tool is required");
    let (status, _) = api.get("/v1/tools?plan=PRO").await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "plans are spelled as documented"
    );
}
