//! The HTTP contract: `/openapi.json` is an OpenAPI 3.1 document that the
//! official JSON Schema accepts, it names exactly the routes the router
//! serves, its responses say what the server really sends (statuses,
//! content types, JSON shapes), every error response is the one error body,
//! and `/docs` serves Swagger UI from this server alone.
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
const TOOL_OUTCOME_ERRORS: [(&str, &str, &str); 5] = [
    ("post", "/v1/tools/{name}/invoke", "403"),
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
    let mut request = app.client.request(method, format!("{}{path}", app.base));
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
            let example = &response["content"]["application/json"]["example"];
            if direct {
                assert!(
                    error_validator.is_valid(example),
                    "{method} {path} {status}: the example is not an ErrorBody: {example}"
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
    checked(&app, d, "get", "/v1/workflows", "/v1/workflows", None).await;
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
    let store = cadre::store::Store::open(dir.path()).expect("open the data dir");
    cadre::tenants::create_key(&store, "acme", false)
        .await
        .expect("key created");
    drop(store);
    let app = spawn_app(AppOptions::offline().data_dir(dir.path()));

    let (status, body) = app.get("/v1/tools").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let doc = spec(&app).await;
    assert!(doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer");
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
