//! The HTTP contract: `/openapi.json` is an OpenAPI 3.1 document that the
//! official JSON Schema accepts, it names exactly the routes the router
//! serves, its responses say what the server really sends (statuses,
//! content types, JSON shapes), every error response is the one error body,
//! and `/docs` serves Swagger UI from this server alone. Each event
//! stream sends only the events its schema lists, with payloads that fit
//! them; the limits the server checks are in the document; an open
//! server's document asks for no key. (The fuzzing of the whole contract
//! is `tests/contract.rs`.)
//!
//! Routes are compared two ways: the (method, path) table read from the
//! router itself (axum's `Debug` of a `Router` lists each route's path and
//! its methods), and over the wire, where every documented operation must
//! reach a handler (not the router's "no such route" / 405 fallbacks) and
//! every undocumented method on a documented path must hit the 405 fallback.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::{AppOptions, TestApp, spawn_app};

const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

/// Served on purpose without being operations of the document.
const DOCS_ROUTES: [(&str, &str); 4] = [
    ("get", "/openapi.json"),
    ("get", "/docs"),
    ("get", "/docs/"),
    ("get", "/docs/{*rest}"),
];

/// Operations whose failures are the tool's outcome (`ToolExecutionResult`)
/// rather than the error body, by design (see src/http/tools.rs).
const TOOL_OUTCOME_ERRORS: [(&str, &str, &str); 4] = [
    ("post", "/v1/tools/{name}/invoke", "404"),
    ("post", "/v1/tools/{name}/invoke", "502"),
    ("post", "/v1/tools/{name}/invoke", "503"),
    ("post", "/v1/tools/{name}/invoke", "504"),
];

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/openapi-3.1")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("fixture present");
    serde_json::from_str(&text).expect("fixture is JSON")
}

/// An app whose API rate limit does not get in the way of a few hundred
/// requests.
fn app() -> TestApp {
    spawn_app(AppOptions::offline().config_toml("[api_limit]\nper_second = 10000\nburst = 10000\n"))
}

async fn spec(app: &TestApp) -> Value {
    let answer = fetch(app, "get", "/openapi.json", None).await;
    assert_eq!(answer.status, StatusCode::OK);
    answer.json.expect("the document is JSON")
}

/// What came back: status, content type (`""` when none), and the body
/// when it is JSON (an event stream is left unread: it may never end).
struct Answer {
    status: StatusCode,
    content_type: String,
    json: Option<Value>,
    text: Option<String>,
}

async fn fetch(app: &TestApp, method: &str, path: &str, body: Option<&Value>) -> Answer {
    let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
    let mut request = app.client.request(method, path);
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().await.expect("request sent");
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    if content_type.starts_with("text/event-stream") {
        return Answer {
            status,
            content_type,
            json: None,
            text: None,
        };
    }
    let text = response.text().await.expect("body read");
    let json = if content_type.starts_with("application/json") {
        Some(serde_json::from_str(&text).expect("a JSON body"))
    } else {
        None
    };
    Answer {
        status,
        content_type,
        json,
        text: Some(text),
    }
}

/// Every (method, path) the document lists.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in METHODS {
            if item.get(method).is_some() {
                ops.insert((method.to_string(), path.clone()));
            }
        }
    }
    ops
}

/// The path with every `{param}` filled with an id nothing has.
fn concrete(path: &str) -> String {
    path.split('/')
        .map(|seg| {
            if seg.starts_with('{') {
                "no-such-id"
            } else {
                seg
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Checks one answer against what the document says of `method path`:
/// its status is documented, its content type too, and a JSON body fits
/// the documented schema.
fn conforms(
    doc: &Value,
    method: &str,
    path: &str,
    status: StatusCode,
    content_type: &str,
    body: Option<&Value>,
) -> Result<(), String> {
    let op = &doc["paths"][path][method];
    let response = op["responses"]
        .get(status.as_str())
        .ok_or_else(|| format!("{method} {path}: status {status} is not documented"))?;
    let Some(content) = response.get("content").and_then(Value::as_object) else {
        return Ok(());
    };
    let media = content_type.split(';').next().unwrap_or("").trim();
    let (_, documented) = content
        .iter()
        .find(|(k, _)| k.split(';').next().unwrap_or("").trim() == media)
        .ok_or_else(|| {
            format!("{method} {path} {status}: content type {content_type} is not documented")
        })?;
    let Some(body) = body else { return Ok(()) };
    let mut schema = documented["schema"].clone();
    let Some(obj) = schema.as_object_mut() else {
        return Ok(());
    };
    obj.insert("components".into(), doc["components"].clone());
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(&schema)
        .map_err(|e| format!("{method} {path} {status}: schema does not compile: {e}"))?;
    let errors: Vec<String> = validator
        .iter_errors(body)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{method} {path} {status}: the body does not fit the documented schema: {errors:?}\nbody: {body}"
        ))
    }
}

/// Sends the request and checks the answer against the document; returns
/// the status and the JSON body.
async fn checked(
    app: &TestApp,
    doc: &Value,
    method: &str,
    template: &str,
    path: &str,
    body: Option<&Value>,
) -> (StatusCode, Value) {
    let answer = fetch(app, method, path, body).await;
    let json = answer.json.as_ref();
    if let Err(e) = conforms(
        doc,
        method,
        template,
        answer.status,
        &answer.content_type,
        json,
    ) {
        panic!("{e}");
    }
    (answer.status, answer.json.unwrap_or(Value::Null))
}

#[tokio::test]
async fn the_document_is_openapi_3_1_and_the_official_schema_accepts_it() {
    let app = app();
    let doc = spec(&app).await;
    let version = doc["openapi"].as_str().expect("openapi version");
    assert!(version.starts_with("3.1."), "{version}");

    // schema-base.json: the document schema, and every Schema Object in it
    // checked against the OAS 3.1 base dialect.
    let resources = [
        (
            "https://spec.openapis.org/oas/3.1/schema/2021-04-15",
            fixture("schema.json"),
        ),
        (
            "https://spec.openapis.org/oas/3.1/dialect/base",
            fixture("dialect/base.schema.json"),
        ),
        (
            "https://spec.openapis.org/oas/3.1/meta/base",
            fixture("meta/base.schema.json"),
        ),
    ];
    let mut registry = jsonschema::Registry::new();
    for (uri, schema) in &resources {
        registry = registry.add(*uri, schema).expect("resource accepted");
    }
    let registry = registry.prepare().expect("registry builds");
    let validator = jsonschema::options()
        .with_registry(&registry)
        .build(&fixture("schema-base.json"))
        .expect("the official schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(&doc)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");

    // What the JSON Schema cannot check: operation ids are unique.
    let mut ids = BTreeSet::new();
    for (method, path) in operations(&doc) {
        let id = doc["paths"][&path][&method]["operationId"]
            .as_str()
            .unwrap_or_else(|| panic!("{method} {path} has no operationId"));
        assert!(ids.insert(id.to_string()), "operationId {id} is used twice");
    }

    // The validator is not a rubber stamp: a document it must refuse.
    let mut broken = doc.clone();
    broken["paths"]["/healthz"]["get"]["responses"] = json!({"200": {"content": 5}});
    assert!(!validator.is_valid(&broken));
    let mut wrong_version = doc.clone();
    wrong_version["openapi"] = json!("3.0.3");
    assert!(!validator.is_valid(&wrong_version));
}

#[tokio::test]
async fn the_router_serves_exactly_the_documented_routes() {
    let (router, doc) = cadre::http::routes();
    let doc = serde_json::to_value(&doc).unwrap();
    let debug = format!("{router:?}");
    // The fallback router has a route table of its own (with its own ids).
    let start = debug.find("path_router:").expect("a path router");
    let end = debug.find("fallback_router:").expect("a fallback router");
    let served = served_routes(&debug[start..end]);
    let mut expected = operations(&doc);
    for (method, path) in DOCS_ROUTES {
        expected.insert((method.to_string(), path.to_string()));
    }
    let undocumented: Vec<_> = served.difference(&expected).collect();
    let unserved: Vec<_> = expected.difference(&served).collect();
    assert!(
        undocumented.is_empty() && unserved.is_empty(),
        "served but not documented: {undocumented:?}\ndocumented but not served: {unserved:?}"
    );
    assert!(
        served.len() > 30,
        "the router's route table was not read: {served:?}"
    );
}

/// The (method, path) table of an axum `Router`, read from its `Debug`:
/// `Node { paths: {RouteId(n): "/path", ...} }` names each route's path and
/// `RouteId(n): MethodRouter(MethodRouter { get: ..., post: None, ... })`
/// its methods (`None` where there is no handler).
fn served_routes(debug: &str) -> BTreeSet<(String, String)> {
    let mut paths = BTreeMap::new();
    let mut methods: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (at, _) in debug.match_indices("RouteId(") {
        let rest = &debug[at + "RouteId(".len()..];
        let Some(close) = rest.find(')') else {
            continue;
        };
        let id = rest[..close].to_string();
        let after = rest[close + 1..].trim_start_matches(':').trim_start();
        if let Some(path) = after.strip_prefix('"') {
            let end = path.find('"').expect("closing quote");
            paths.insert(id, path[..end].to_string());
        } else if let Some(router) = after.strip_prefix("MethodRouter(MethodRouter {") {
            let body = &router[..router.find("allow_header").unwrap_or(router.len())];
            let found = METHODS
                .iter()
                .filter(|m| {
                    body.split(", ")
                        .any(|f| f.trim().starts_with(&format!("{m}:")) && !f.contains("None"))
                })
                .map(|m| m.to_string())
                .collect();
            methods.insert(id, found);
        }
    }
    let mut routes = BTreeSet::new();
    for (id, path) in paths {
        for m in methods.get(&id).into_iter().flatten() {
            routes.insert((m.clone(), path.clone()));
        }
    }
    routes
}

#[tokio::test]
async fn every_documented_operation_reaches_its_handler_and_answers_as_documented() {
    let app = app();
    let doc = spec(&app).await;
    let ops = operations(&doc);
    assert!(ops.len() > 30, "{ops:?}");
    for (method, template) in &ops {
        let path = concrete(template);
        let Answer {
            status,
            content_type,
            json: body,
            ..
        } = fetch(&app, method, &path, None).await;
        assert_ne!(
            status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}: {body:?}"
        );
        if let Some(b) = &body {
            assert_ne!(
                b["error"]["message"], "no such route",
                "{method} {path} is documented but not routed"
            );
        }
        if let Err(e) = conforms(&doc, method, template, status, &content_type, body.as_ref()) {
            panic!("{e}");
        }
    }
}

#[tokio::test]
async fn an_undocumented_method_on_a_documented_path_is_the_routers_405() {
    let app = app();
    let doc = spec(&app).await;
    let ops = operations(&doc);
    let paths: BTreeSet<&String> = ops.iter().map(|(_, p)| p).collect();
    for template in paths {
        let path = concrete(template);
        for method in METHODS {
            if ops.contains(&(method.to_string(), template.clone())) {
                continue;
            }
            let answer = fetch(&app, method, &path, None).await;
            let (status, body) = (answer.status, answer.json.unwrap_or_default());
            assert_eq!(
                (status, body["error"]["code"].as_str()),
                (StatusCode::METHOD_NOT_ALLOWED, Some("METHOD_NOT_ALLOWED")),
                "{method} {path}: expected the router's 405 (an undocumented method must not be served): {body}"
            );
        }
    }
}

#[tokio::test]
async fn every_error_response_is_the_error_body() {
    let app = app();
    let doc = spec(&app).await;
    let error_ref = json!({"$ref": "#/components/schemas/ErrorBody"});
    let error_body = &doc["components"]["schemas"]["ErrorBody"];
    assert_eq!(error_body["required"], json!(["error"]), "{error_body}");
    let detail = &doc["components"]["schemas"]["ErrorDetail"];
    let required: BTreeSet<&str> = detail["required"]
        .as_array()
        .expect("required fields")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(required, BTreeSet::from(["code", "message"]), "{detail}");

    let mut error_schema = error_ref.clone();
    error_schema["components"] = doc["components"].clone();
    let error_validator = jsonschema::validator_for(&error_schema).expect("ErrorBody compiles");
    // Every public code is one row of the ErrorCode schema, with its status.
    let code_schema = &doc["components"]["schemas"]["ErrorCode"];
    let codes: Vec<&str> = code_schema["enum"]
        .as_array()
        .expect("ErrorCode lists its codes")
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    for code in cadre::error_code::ErrorCode::ALL {
        assert!(
            codes.contains(&code.as_str()),
            "{code} is not in the document"
        );
        assert!(
            code_schema["description"]
                .as_str()
                .unwrap()
                .contains(&format!("| `{code}` | {} |", code.status().as_u16())),
            "{code} has no row in the ErrorCode description"
        );
    }

    let mut errors_seen = 0;
    for (method, path) in operations(&doc) {
        let responses = doc["paths"][&path][&method]["responses"]
            .as_object()
            .expect("responses");
        // The API key and the API's rate limit apply everywhere.
        assert!(responses.contains_key("429"), "{method} {path}: no 429");
        if path != "/healthz" && path != "/readyz" {
            assert!(responses.contains_key("401"), "{method} {path}: no 401");
        }
        for (status, response) in responses {
            if !(status.starts_with('4') || status.starts_with('5')) {
                continue;
            }
            errors_seen += 1;
            let schema = &response["content"]["application/json"]["schema"];
            if TOOL_OUTCOME_ERRORS.contains(&(method.as_str(), path.as_str(), status.as_str())) {
                assert_eq!(
                    schema,
                    &json!({"$ref": "#/components/schemas/ToolResult"}),
                    "{method} {path} {status}"
                );
                continue;
            }
            let direct = schema == &error_ref;
            let resolved = match schema["$ref"].as_str() {
                Some(r) => {
                    &doc["components"]["schemas"][r.trim_start_matches("#/components/schemas/")]
                }
                None => schema,
            };
            let alternative = resolved["oneOf"]
                .as_array()
                .is_some_and(|alts| alts.contains(&error_ref));
            assert!(
                direct || alternative,
                "{method} {path} {status} does not reference ErrorBody: {response}"
            );
            // One example per code the operation may answer, named by the
            // code, each a valid ErrorBody with that code and this status.
            let examples = response["content"]["application/json"]["examples"]
                .as_object()
                .unwrap_or_else(|| panic!("{method} {path} {status}: no examples: {response}"));
            assert!(!examples.is_empty(), "{method} {path} {status}");
            for (code, example) in examples {
                let value = &example["value"];
                assert_eq!(
                    value["error"]["code"],
                    json!(code),
                    "{method} {path} {status}"
                );
                assert!(
                    codes.contains(&code.as_str()),
                    "{method} {path} {status}: {code} is not in the ErrorCode table"
                );
                assert!(
                    error_validator.is_valid(value),
                    "{method} {path} {status}: the example is not an ErrorBody: {value}"
                );
                assert!(
                    response["description"]
                        .as_str()
                        .unwrap()
                        .contains(&format!("`{code}`")),
                    "{method} {path} {status}: {code} is not described"
                );
            }
        }
    }
    assert!(errors_seen > 100, "{errors_seen}");
}

#[tokio::test]
async fn documented_response_shapes_match_what_the_server_sends() {
    let app = app();
    let doc = spec(&app).await;
    let d = &doc;

    let (status, session) = checked(
        &app,
        d,
        "post",
        "/v1/sessions",
        "/v1/sessions",
        Some(&json!({"agent": "assistant", "user_id": "u1", "metadata": {"page": "/"}})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let id = session["id"].as_str().unwrap().to_string();
    let s = |suffix: &str| format!("/v1/sessions/{id}{suffix}");
    checked(&app, d, "get", "/v1/sessions/{id}", &s(""), None).await;
    let (status, reply) = checked(
        &app,
        d,
        "post",
        "/v1/sessions/{id}/messages",
        &s("/messages"),
        Some(&json!({"content": "What is (2+3)*4?"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    checked(
        &app,
        d,
        "get",
        "/v1/sessions/{id}/messages",
        &s("/messages?limit=1"),
        None,
    )
    .await;
    checked(
        &app,
        d,
        "get",
        "/v1/sessions/{id}/summary",
        &s("/summary"),
        None,
    )
    .await;
    // The bodies built as JSON outside the HTTP layer (the export, the
    // workflow definitions, the providers) are held to their schemas here.
    checked(
        &app,
        d,
        "get",
        "/v1/sessions/{id}/export",
        &s("/export"),
        None,
    )
    .await;
    checked(
        &app,
        d,
        "get",
        "/v1/sessions/{id}/turns",
        &s("/turns"),
        None,
    )
    .await;
    let turn = format!("/turns/{}", reply["turn_id"].as_str().unwrap());
    checked(
        &app,
        d,
        "get",
        "/v1/sessions/{id}/turns/{turn_id}",
        &s(&turn),
        None,
    )
    .await;
    checked(&app, d, "get", "/v1/sessions", "/v1/sessions", None).await;
    checked(&app, d, "get", "/healthz", "/healthz", None).await;
    checked(&app, d, "get", "/readyz", "/readyz", None).await;
    checked(&app, d, "get", "/v1/keys", "/v1/keys", None).await;
    checked(&app, d, "get", "/v1/usage", "/v1/usage", None).await;

    checked(&app, d, "get", "/v1/tools", "/v1/tools?plan=pro", None).await;
    checked(
        &app,
        d,
        "get",
        "/v1/tools/{name}",
        "/v1/tools/calculator",
        None,
    )
    .await;
    let (status, _) = checked(
        &app,
        d,
        "post",
        "/v1/tools/{name}/validate",
        "/v1/tools/calculator/validate",
        Some(&json!({"params": {}})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = checked(
        &app,
        d,
        "post",
        "/v1/tools/{name}/invoke",
        "/v1/tools/calculator/invoke",
        Some(&json!({"params": {"expression": "1+1"}})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = checked(
        &app,
        d,
        "post",
        "/v1/tools/{name}/invoke",
        "/v1/tools/calculator/invoke",
        Some(&json!({"params": {"expression": 5}})),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = checked(
        &app,
        d,
        "post",
        "/v1/tools/{name}/invoke",
        "/v1/tools/no-such-tool/invoke",
        Some(&json!({})),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (_, calls) = checked(&app, d, "get", "/v1/calls", "/v1/calls", None).await;
    assert!(calls["count"].as_u64().unwrap() >= 1, "{calls}");
    checked(&app, d, "get", "/v1/stats", "/v1/stats", None).await;
    checked(&app, d, "get", "/v1/limits", "/v1/limits", None).await;
    checked(
        &app,
        d,
        "get",
        "/v1/limits/quota",
        "/v1/limits/quota?tool=calculator&user_id=u1",
        None,
    )
    .await;
    checked(
        &app,
        d,
        "get",
        "/v1/confirmations",
        "/v1/confirmations",
        None,
    )
    .await;
    checked(&app, d, "get", "/v1/providers", "/v1/providers", None).await;
    checked(
        &app,
        d,
        "patch",
        "/v1/tenants/{id}/config",
        "/v1/tenants/default/config",
        Some(&json!({"temperature": 0.3})),
    )
    .await;
    let (_, workflows) = checked(&app, d, "get", "/v1/workflows", "/v1/workflows", None).await;
    let name = workflows["workflows"][0]["name"]
        .as_str()
        .expect("the shipped agents folder has a workflow");
    checked(
        &app,
        d,
        "get",
        "/v1/workflows/{name}",
        &format!("/v1/workflows/{name}"),
        None,
    )
    .await;
    checked(
        &app,
        d,
        "get",
        "/v1/workflows/runs",
        "/v1/workflows/runs",
        None,
    )
    .await;
    let (status, _) = checked(
        &app,
        d,
        "get",
        "/v1/sessions/{id}/messages",
        &s("/messages?limit=0"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn docs_serve_swagger_ui_and_its_assets_from_this_server() {
    let app = app();
    let page = fetch(&app, "get", "/docs/", None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.content_type.starts_with("text/html"),
        "{}",
        page.content_type
    );
    let html = page.text.expect("a page");
    assert!(html.contains("swagger-ui"), "{html}");

    let mut assets = Vec::new();
    for attr in ["src=\"", "href=\""] {
        for (at, _) in html.match_indices(attr) {
            let rest = &html[at + attr.len()..];
            assets.push(rest[..rest.find('"').unwrap()].to_string());
        }
    }
    let scripts = assets.iter().filter(|a| a.ends_with(".js")).count();
    let styles = assets.iter().filter(|a| a.ends_with(".css")).count();
    assert!(scripts >= 2 && styles >= 1, "{assets:?}");
    for asset in &assets {
        assert!(
            !asset.contains("://") && !asset.starts_with("//"),
            "{asset} is not served by cadre"
        );
        let url = format!("/docs/{}", asset.trim_start_matches("./"));
        let answer = fetch(&app, "get", &url, None).await;
        assert_eq!(answer.status, StatusCode::OK, "{url}");
        let (kind, body) = (answer.content_type, answer.text.unwrap_or_default());
        assert!(!body.is_empty(), "{url}");
        if asset.ends_with(".js") {
            assert!(kind.contains("javascript"), "{url}: {kind}");
        }
        if asset.ends_with(".css") {
            assert!(kind.starts_with("text/css"), "{url}: {kind}");
        }
        if asset.contains("swagger-initializer") {
            assert!(body.contains("/openapi.json"), "{body}");
        }
    }
    assert!(
        assets.iter().any(|a| a.contains("swagger-initializer")),
        "{assets:?}"
    );

    let (status, body) = app.get("/docs/no-such-asset.js").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "NOT_FOUND");
}

#[tokio::test]
async fn the_spec_and_docs_need_no_key_when_keys_are_configured() {
    let dir = tempfile::tempdir().unwrap();
    let store = support::store::open_store(dir.path());
    cadre::tenants::create_key(&store, "acme", false)
        .await
        .expect("key created");
    drop(store);
    let app = spawn_app(AppOptions::offline().data_dir(dir.path()));

    let (status, body) = app.get("/v1/tools").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let doc = spec(&app).await;
    assert!(doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer");
    assert_eq!(
        doc["security"],
        json!([{"bearer": []}]),
        "every operation needs the key"
    );
    for path in ["/docs/", "/docs/swagger-ui.css"] {
        assert_eq!(
            fetch(&app, "get", path, None).await.status,
            StatusCode::OK,
            "{path}"
        );
    }
    // Public means these paths only, not anything that starts like them.
    let (status, _) = app.get("/docsx").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// One Server-Sent Event: its name and its data, as sent.
struct SseEvent {
    name: String,
    data: String,
}

/// The complete events in `text` (keep-alive comments skipped).
fn parse_events(text: &str) -> Vec<SseEvent> {
    let text = text.replace("\r\n", "\n");
    let complete = &text[..text.rfind("\n\n").map_or(0, |at| at + 2)];
    let mut events = Vec::new();
    for block in complete.split("\n\n") {
        let mut name = None;
        let mut data = Vec::new();
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                name = Some(v.trim().to_string());
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v));
            }
        }
        if let Some(name) = name {
            events.push(SseEvent {
                name,
                data: data.join("\n"),
            });
        }
    }
    events
}

/// Reads an event stream until `done` says so with the events so far (or
/// the stream ends); at most 20 s.
async fn read_events(
    mut response: reqwest::Response,
    done: impl Fn(&[SseEvent]) -> bool,
) -> Vec<SseEvent> {
    let mut text = String::new();
    let reading = async {
        while let Some(chunk) = response.chunk().await.expect("stream chunk") {
            text.push_str(&String::from_utf8_lossy(&chunk));
            if done(&parse_events(&text)) {
                break;
            }
        }
    };
    let in_time = tokio::time::timeout(std::time::Duration::from_secs(20), reading)
        .await
        .is_ok();
    let events = parse_events(&text);
    assert!(
        in_time,
        "the events came in time; so far: {:?}",
        event_names(&events)
    );
    events
}

/// Checks each event against the `text/event-stream` schema of `method
/// path`'s 200: one alternative names the event, and its data is JSON
/// that fits that alternative's `contentSchema`.
fn events_conform(doc: &Value, method: &str, path: &str, events: &[SseEvent]) {
    let schema =
        &doc["paths"][path][method]["responses"]["200"]["content"]["text/event-stream"]["schema"];
    let name = schema["$ref"]
        .as_str()
        .and_then(|r| r.strip_prefix("#/components/schemas/"))
        .unwrap_or_else(|| panic!("{method} {path}: the event schema is a component: {schema}"));
    let alternatives = doc["components"]["schemas"][name]["oneOf"]
        .as_array()
        .unwrap_or_else(|| panic!("{name} lists its events"));
    for event in events {
        let alternative = alternatives
            .iter()
            .find(|a| a["properties"]["event"]["enum"] == json!([event.name]))
            .unwrap_or_else(|| panic!("{method} {path}: event `{}` is not documented", event.name));
        let data = &alternative["properties"]["data"];
        assert_eq!(data["contentMediaType"], "application/json");
        let mut content_schema = data["contentSchema"].clone();
        content_schema["components"] = doc["components"].clone();
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .build(&content_schema)
            .expect("the payload schema compiles");
        let payload: Value = serde_json::from_str(&event.data)
            .unwrap_or_else(|e| panic!("`{}` data is JSON: {e}: {}", event.name, event.data));
        let errors: Vec<String> = validator
            .iter_errors(&payload)
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{method} {path}: `{}` does not fit its documented payload: {errors:?}\n{payload}",
            event.name
        );
    }
}

fn event_names(events: &[SseEvent]) -> Vec<&str> {
    events.iter().map(|e| e.name.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_stream_sends_the_events_its_document_declares() {
    let model = support::MockModel::start().await;
    let app = spawn_app(
        AppOptions::with_model(&model)
            .config_toml("[api_limit]\nper_second = 10000\nburst = 10000\n"),
    );
    let doc = spec(&app).await;

    // A turn with a tool call, then a turn that fails.
    let runtime = app
        .client
        .request(reqwest::Method::GET, "/v1/events")
        .send()
        .await
        .expect("subscribed");
    assert_eq!(runtime.status(), StatusCode::OK);
    model.push_all([
        support::Reply::tool_call("c1", "calculator", r#"{"expression": "2+2"}"#),
        support::Reply::text("It is 4."),
        support::Reply::fail(400),
    ]);
    let session = app.session("assistant").await;
    let turn = read_events(app.post_streaming(&session, "What is 2+2?").await, |_| {
        false
    })
    .await;
    let names = event_names(&turn);
    for expected in [
        "turn_started",
        "tool_call_started",
        "tool_call_completed",
        "model_delta",
        "turn_completed",
    ] {
        assert!(names.contains(&expected), "{expected} in {names:?}");
    }
    events_conform(&doc, "post", "/v1/sessions/{id}/messages/stream", &turn);
    let failed = read_events(app.post_streaming(&session, "Again?").await, |_| false).await;
    assert_eq!(
        event_names(&failed).last(),
        Some(&"turn_failed"),
        "{:?}",
        event_names(&failed)
    );
    events_conform(&doc, "post", "/v1/sessions/{id}/messages/stream", &failed);
    // The check is not a rubber stamp: a payload that misses a field, or
    // an event the document does not list, fails it.
    for (name, data) in [("turn_started", "{}"), ("turn_paused", "{}")] {
        let broken = [SseEvent {
            name: name.into(),
            data: data.into(),
        }];
        let checked = std::panic::catch_unwind(|| {
            events_conform(&doc, "post", "/v1/sessions/{id}/messages/stream", &broken)
        });
        assert!(checked.is_err(), "{name} {data} passed");
    }

    // Runtime events: the calls of those turns, and a direct one.
    let (status, _) = app
        .post(
            "/v1/tools/calculator/invoke",
            &json!({"params": {"expression": 5}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let runtime = read_events(runtime, |events| {
        event_names(events).contains(&"validation_error")
    })
    .await;
    let names = event_names(&runtime);
    assert!(names.contains(&"execution_completed"), "{names:?}");
    events_conform(&doc, "get", "/v1/events", &runtime);

    // A workflow run's events, from its snapshot to `run_finished`.
    model.set_default(Some(support::Reply::text("A fine account.")));
    let (status, run) = app
        .post("/v1/workflows/account-review/runs", &json!({"input": {}}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    let run_events = app
        .client
        .request(
            reqwest::Method::GET,
            &format!("/v1/workflows/runs/{}/events", run["id"].as_str().unwrap()),
        )
        .send()
        .await
        .expect("subscribed");
    let run_events = read_events(run_events, |_| false).await;
    let names = event_names(&run_events);
    assert_eq!(names.first(), Some(&"snapshot"), "{names:?}");
    assert_eq!(names.last(), Some(&"run_finished"), "{names:?}");
    events_conform(&doc, "get", "/v1/workflows/runs/{id}/events", &run_events);
}

#[tokio::test]
async fn the_document_states_the_limits_the_server_checks() {
    let (_, doc) = cadre::http::routes();
    let doc = serde_json::to_value(&doc).unwrap();
    let schemas = &doc["components"]["schemas"];
    let param = |path: &str, name: &str| -> Value {
        doc["paths"][path]["get"]["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("{path} has {name}"))["schema"]
            .clone()
    };
    for path in [
        "/v1/calls",
        "/v1/sessions/{id}/messages",
        "/v1/workflows/runs",
    ] {
        let limit = param(path, "limit");
        assert_eq!(
            (&limit["minimum"], &limit["maximum"]),
            (&json!(1), &json!(1000)),
            "{path}"
        );
    }
    let plans: Vec<&str> = cadre::http::tools::PLANS
        .iter()
        .map(|p| p.as_str())
        .collect();
    assert_eq!(schemas["PlanName"]["enum"], json!(plans));
    assert_eq!(param("/v1/tools", "plan")["enum"], json!(plans));
    assert_eq!(
        param("/v1/tools", "view")["enum"],
        json!(["openai", "definitions"])
    );
    for (body, field) in [
        ("CreateBody", "agent"),
        ("MessageBody", "content"),
        ("ImproveBody", "text"),
    ] {
        let field = &schemas[body]["properties"][field];
        assert_eq!(field["minLength"], 1, "{body}");
        assert_eq!(field["pattern"], cadre::http::extract::NOT_BLANK, "{body}");
    }
    // Tenant configs: no unknown key, and the patch has the config's keys.
    for (config, patch) in [
        ("TenantConfig", "TenantConfigPatch"),
        ("ToolConfig", "ToolConfigPatch"),
    ] {
        let keys = |name: &str| -> BTreeSet<String> {
            assert_eq!(schemas[name]["additionalProperties"], false, "{name}");
            schemas[name]["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect()
        };
        assert_eq!(keys(config), keys(patch));
        let defaults = serde_json::to_value(cadre::tenants::TenantConfig::default()).unwrap();
        if config == "TenantConfig" {
            let served: BTreeSet<String> = defaults.as_object().unwrap().keys().cloned().collect();
            assert_eq!(keys(config), served);
        }
    }
    assert_eq!(
        schemas["SessionView"]["properties"]["metadata"]["type"],
        json!(["object", "null"])
    );
    assert!(
        schemas["ValidateBody"]["properties"]["params"]
            .get("type")
            .is_none(),
        "validate takes any JSON value as params"
    );
    let invoke = &doc["paths"]["/v1/tools/{name}/invoke"]["post"]["responses"];
    assert!(
        invoke["503"]["description"]
            .as_str()
            .unwrap()
            .contains("TOOL_UNAVAILABLE")
    );
    // A tool result's `error_type` is a code of the one table (or the held
    // call's `CONFIRMATION_REQUIRED`), upper-case like every code.
    let error_type = &schemas["ToolResult"]["properties"]["error_type"];
    assert!(
        error_type["oneOf"]
            .as_array()
            .unwrap()
            .contains(&json!({"$ref": "#/components/schemas/ErrorType"})),
        "{error_type}"
    );
    let kinds: Vec<&str> = schemas["ErrorType"]["enum"]
        .as_array()
        .expect("ErrorType lists its codes")
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    let codes = schemas["ErrorCode"]["enum"].as_array().unwrap();
    assert_eq!(kinds.len(), cadre::tools::ErrorType::ALL.len());
    for kind in cadre::tools::ErrorType::ALL {
        assert!(kinds.contains(&kind.as_str()), "{kind} is not documented");
        match kind.code() {
            Some(code) => assert!(codes.contains(&json!(code.as_str())), "{kind}"),
            None => assert_eq!(kind.as_str(), "CONFIRMATION_REQUIRED"),
        }
    }
    for kind in ["RATE_LIMITED", "VALIDATION_ERROR", "TOOL_TIMEOUT"] {
        assert!(kinds.contains(&kind), "{kind}");
    }
    assert_eq!(
        doc["security"],
        json!([{"bearer": []}]),
        "a keyed server's document"
    );
}

#[tokio::test]
async fn an_open_server_documents_that_no_key_is_needed() {
    let app = app();
    let doc = spec(&app).await;
    assert_eq!(doc["security"], json!([]), "{}", doc["security"]);
    assert!(
        doc["info"]["description"]
            .as_str()
            .unwrap()
            .contains("open mode")
    );
    let (status, _) = app.get("/v1/sessions").await;
    assert_eq!(status, StatusCode::OK, "no key needed");
}
