//! The tool catalog through a running server: tool files dropped into,
//! changed in and removed from the agents folder go live without a restart;
//! every field error of a call comes back at once; plans decide what a caller
//! sees and may call; the data tools cite their sources; the example agents
//! answer questions of their domain with the offline provider; and the event
//! bus is readable as Server-Sent Events.
//!
//! Waiting is on the event bus (`Runtime::events().subscribe()`), never on a
//! clock: [`EVENT_BOUND`] only turns a hang into a failure.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::response::Html;
use axum::routing::get;
use cadre::events::{Event, EventKind};
use cadre::tools::builtin::echo;
use cadre::tools::{FnHandler, ToolDefinition, ToolRegistry};
use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::{AppOptions, MockModel, Reply, TestApp, agents_dir, repo_agents, spawn_app};
use tokio::sync::broadcast::{self, error::RecvError};

/// A failure bound for anything awaited, not an expected duration.
const EVENT_BOUND: Duration = Duration::from_secs(10);

/// Fast fallback rescans; the watcher should see changes before them anyway.
const FAST_RESCAN: &str = "[tools]\nreload_interval_s = 0.2\n";

// ---------------------------------------------------------------- harness

/// A temp agents folder with an empty `tools/` and no agents.
fn tools_only_agents() -> tempfile::TempDir {
    let dir = agents_dir(&[]);
    std::fs::create_dir(dir.path().join("tools")).expect("create tools dir");
    dir
}

/// A copy of the repository's agents folder (agents, `tools/`, `data/`).
fn repo_agents_copy() -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).expect("create dir");
        for entry in std::fs::read_dir(from).expect("read agents dir") {
            let entry = entry.expect("dir entry");
            let target = to.join(entry.file_name());
            if entry.file_type().expect("file type").is_dir() {
                copy(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), &target).expect("copy agents file");
            }
        }
    }
    let dir = tempfile::tempdir().expect("temp dir");
    copy(&repo_agents(), dir.path());
    dir
}

/// Writes a file under a name no loader reads, then renames it into place,
/// so a reload never sees half a file.
fn put(dir: &Path, name: &str, text: &str) -> PathBuf {
    let staging = dir.join(format!(".{name}.partial"));
    std::fs::write(&staging, text).expect("write staging file");
    let path = dir.join(name);
    std::fs::rename(&staging, &path).expect("rename into place");
    path
}

fn subscribe(app: &TestApp) -> broadcast::Receiver<Event> {
    app.runtime
        .as_ref()
        .expect("app running")
        .events()
        .subscribe()
}

/// Receives events until `pick` accepts one; panics after [`EVENT_BOUND`].
async fn wait_for<T>(
    rx: &mut broadcast::Receiver<Event>,
    what: &str,
    mut pick: impl FnMut(&EventKind) -> Option<T>,
) -> T {
    let found = tokio::time::timeout(EVENT_BOUND, async {
        loop {
            match rx.recv().await {
                Ok(event) => {
                    if let Some(t) = pick(&event.kind) {
                        return t;
                    }
                }
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => panic!("event bus closed while waiting for {what}"),
            }
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("no {what} event within {EVENT_BOUND:?}"))
}

async fn invoke(app: &TestApp, tool: &str, body: Value) -> (StatusCode, Value) {
    app.post(&format!("/v1/tools/{tool}/invoke"), &body).await
}

async fn call(app: &TestApp, tool: &str, params: Value) -> (StatusCode, Value) {
    invoke(app, tool, json!({ "params": params })).await
}

/// Names of `GET /v1/tools{query}`, in listing order.
async fn listed(app: &TestApp, query: &str) -> Vec<String> {
    let (status, body) = app.get(&format!("/v1/tools{query}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["tools"]
        .as_array()
        .expect("tools array")
        .iter()
        .map(|t| {
            assert_eq!(t["type"], "function", "OpenAI function format: {t}");
            t["function"]["name"].as_str().expect("name").to_string()
        })
        .collect()
}

fn offered(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

/// `(field, code)` of each field error, sorted.
fn field_codes(errors: &Value) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = errors
        .as_array()
        .expect("errors array")
        .iter()
        .map(|e| {
            assert!(
                e["message"].as_str().is_some_and(|m| !m.is_empty()),
                "every field error has a message: {e}"
            );
            (
                e["field"].as_str().unwrap().to_string(),
                e["code"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    pairs.sort();
    pairs
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = expected
        .iter()
        .map(|(f, c)| (f.to_string(), c.to_string()))
        .collect();
    v.sort();
    v
}

/// A custom tool that returns the parameters it was called with, so a tool
/// file pointing at it (`entry: {type: custom, handler: mirror}`) shows what
/// the validator handed on.
fn mirror() -> (ToolDefinition, Arc<dyn cadre::tools::ToolHandler>) {
    (
        ToolDefinition::new(
            "mirror",
            "Returns its parameters.",
            json!({"type": "object"}),
        ),
        Arc::new(FnHandler(|params: Value| async move {
            Ok(json!({ "params": params }))
        })),
    )
}

// ---------------------------------------------------------------- tool files

const GREETER_V1: &str = r#"
name: greeter
version: "1.0.0"
description: Says the message back.
category: custom
tags: [greeting]
parameters:
  - name: message
    type: string
    required: true
    description: What to say
entry:
  type: builtin
  handler: echo
"#;

const GREETER_V2: &str = r#"
name: greeter
version: "1.1.0"
description: Says a short message back.
category: custom
tags: [greeting]
parameters:
  - name: message
    type: string
    required: true
    description: What to say, at most five characters
    validation:
      max_length: 5
entry:
  type: builtin
  handler: echo
"#;

/// Invalid YAML: line 6 is indented less than the mapping it belongs to.
const GREETER_BROKEN: &str = "name: greeter
version: \"2.0.0\"
description: A broken edit.
parameters:
  - name: message
   type: string
entry:
  type: builtin
  handler: echo
";

const STAMP_TOML: &str = r#"
name = "stamp"
version = "0.3.0"
description = "Stamps a message."
category = "custom"
entry = { type = "builtin", handler = "echo" }

[[parameters]]
name = "message"
type = "string"
required = true
validation = { min_length = 2 }
"#;

/// Every validation rule of the list form.
const ORDER_FORM_LIST: &str = r#"
name: order_form
description: An order form that declares every validation rule.
entry:
  type: custom
  handler: mirror
parameters:
  - name: account
    type: string
    required: true
  - name: code
    type: string
    required: true
    validation: { pattern: "^[A-Z]{3}$", max_length: 3 }
  - name: nickname
    type: string
    validation: { min_length: 2, max_length: 8 }
  - name: side
    type: string
    default: buy
    validation: { enum: [buy, sell] }
  - name: quantity
    type: integer
    default: 1
    validation: { min: 1, max: 100 }
  - name: price
    type: number
    validation: { min: 0.01, max: 1000 }
  - name: tags
    type: array
    validation: { items: string, min_items: 1, max_items: 3 }
  - name: legs
    type: array
    validation: { items: integer, min_items: 2 }
  - name: limits
    type: object
    validation:
      properties: { stop: number, note: string }
      required: [stop]
"#;

/// The same form as a JSON Schema object.
const ORDER_FORM_SCHEMA: &str = r#"
name: order_form_schema
description: The same order form, declared as a JSON Schema object.
entry: { type: custom, handler: mirror }
parameters:
  type: object
  properties:
    account: { type: string }
    code: { type: string, pattern: "^[A-Z]{3}$", maxLength: 3 }
    nickname: { type: string, minLength: 2, maxLength: 8 }
    side: { type: string, default: buy, enum: [buy, sell] }
    quantity: { type: integer, default: 1, minimum: 1, maximum: 100 }
    price: { type: number, minimum: 0.01, maximum: 1000 }
    tags: { type: array, items: { type: string }, minItems: 1, maxItems: 3 }
    legs: { type: array, items: { type: integer }, minItems: 2 }
    limits:
      type: object
      properties: { stop: { type: number }, note: { type: string } }
      required: [stop]
  required: [account, code]
"#;

/// A call that breaks a rule of every kind at once.
fn order_breaking_every_rule() -> Value {
    json!({
        "code": "abcd",
        "nickname": "x",
        "side": "hold",
        "quantity": 0,
        "price": 5000,
        "tags": ["a", 2, "c", "d"],
        "legs": [1],
        "limits": {"note": 5},
    })
}

fn every_rule_broken() -> Vec<(String, String)> {
    pairs(&[
        ("account", "required"),
        ("code", "pattern"),
        ("code", "maxLength"),
        ("nickname", "minLength"),
        ("side", "enum"),
        ("quantity", "minimum"),
        ("price", "maximum"),
        ("tags", "maxItems"),
        ("tags.1", "type"),
        ("legs", "minItems"),
        ("limits.stop", "required"),
        ("limits.note", "type"),
    ])
}

fn order_form_agents() -> tempfile::TempDir {
    let dir = tools_only_agents();
    let tools = dir.path().join("tools");
    put(&tools, "order_form.yaml", ORDER_FORM_LIST);
    put(&tools, "order_form_schema.yaml", ORDER_FORM_SCHEMA);
    dir
}

fn order_form_app(agents: &Path, config: Option<&str>) -> TestApp {
    let (def, handler) = mirror();
    let mut options = AppOptions::offline().agents(agents).tool(def, handler);
    if let Some(text) = config {
        options = options.config_toml(text);
    }
    spawn_app(options)
}

// ---------------------------------------------------------------- hot reload

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_yaml_tool_dropped_into_a_running_server_is_added_changed_kept_on_a_bad_edit_and_removed()
{
    let agents = tools_only_agents();
    let tools = agents.path().join("tools");
    let app = spawn_app(
        AppOptions::offline()
            .agents(agents.path())
            .config_toml(FAST_RESCAN),
    );
    let mut events = subscribe(&app);
    assert!(!listed(&app, "").await.contains(&"greeter".to_string()));

    // Added.
    let path = put(&tools, "greeter.yaml", GREETER_V1);
    let (version, source) = wait_for(&mut events, "tool_added greeter", |k| match k {
        EventKind::ToolAdded {
            tool,
            version,
            source,
        } if tool == "greeter" => Some((version.clone(), source.clone())),
        _ => None,
    })
    .await;
    assert_eq!(version, "1.0.0");
    assert_eq!(source, path.display().to_string());
    let (status, body) = app.get("/v1/tools").await;
    assert_eq!(status, StatusCode::OK);
    let entry = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "greeter")
        .unwrap_or_else(|| panic!("greeter listed: {body}"))
        .clone();
    assert_eq!(entry["function"]["description"], "Says the message back.");
    assert_eq!(
        entry["function"]["parameters"],
        json!({
            "type": "object",
            "properties": {"message": {"type": "string", "description": "What to say"}},
            "required": ["message"]
        })
    );
    let (status, body) = call(&app, "greeter", json!({"message": "hello there"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["output"]["message"], "hello there");

    // Changed: a new description and a new rule.
    put(&tools, "greeter.yaml", GREETER_V2);
    let version = wait_for(&mut events, "tool_updated greeter", |k| match k {
        EventKind::ToolUpdated { tool, version, .. } if tool == "greeter" => Some(version.clone()),
        _ => None,
    })
    .await;
    assert_eq!(version, "1.1.0");
    let (_, shown) = app.get("/v1/tools/greeter").await;
    assert_eq!(
        shown["definition"]["description"],
        "Says a short message back."
    );
    let (status, body) = call(&app, "greeter", json!({"message": "hello there"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(
        field_codes(&body["validation_errors"]),
        pairs(&[("message", "maxLength")])
    );
    let (status, body) = call(&app, "greeter", json!({"message": "hi"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // A bad edit: reported with file and line; the last good version stays.
    put(&tools, "greeter.yaml", GREETER_BROKEN);
    let (line, message) = wait_for(&mut events, "load_error greeter.yaml", |k| match k {
        EventKind::LoadError {
            file,
            line,
            message,
        } if *file == path.display().to_string() => Some((*line, message.clone())),
        _ => None,
    })
    .await;
    assert_eq!(line, Some(6), "{message}");
    let (_, shown) = app.get("/v1/tools/greeter").await;
    assert_eq!(shown["definition"]["version"], "1.1.0");
    assert_eq!(
        shown["definition"]["description"],
        "Says a short message back."
    );
    assert!(listed(&app, "").await.contains(&"greeter".to_string()));
    let (status, body) = call(&app, "greeter", json!({"message": "still"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["output"]["message"], "still");

    // Removed.
    std::fs::remove_file(&path).unwrap();
    wait_for(&mut events, "tool_removed greeter", |k| match k {
        EventKind::ToolRemoved { tool } if tool == "greeter" => Some(()),
        _ => None,
    })
    .await;
    assert!(!listed(&app, "").await.contains(&"greeter".to_string()));
    let (status, body) = call(&app, "greeter", json!({"message": "hi"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error_type"], "TOOL_NOT_FOUND");
    assert_eq!(body["is_success"], false);
    let (status, body) = app.get("/v1/tools/greeter").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "TOOL_NOT_FOUND");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_toml_tool_file_dropped_into_a_running_server_is_listed_and_callable() {
    let agents = tools_only_agents();
    let tools = agents.path().join("tools");
    let app = spawn_app(
        AppOptions::offline()
            .agents(agents.path())
            .config_toml(FAST_RESCAN),
    );
    let mut events = subscribe(&app);

    let path = put(&tools, "stamp.toml", STAMP_TOML);
    let source = wait_for(&mut events, "tool_added stamp", |k| match k {
        EventKind::ToolAdded { tool, source, .. } if tool == "stamp" => Some(source.clone()),
        _ => None,
    })
    .await;
    assert_eq!(source, path.display().to_string());
    assert!(listed(&app, "").await.contains(&"stamp".to_string()));
    let (status, body) = call(&app, "stamp", json!({"message": "ok!"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["output"]["message"], "ok!");
    let (status, body) = call(&app, "stamp", json!({"message": "x"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["validation_errors"][0]["code"], "minLength");
}

fn twin(description: &str) -> String {
    format!(
        "name: twin\ndescription: {description}\nentry: {{type: builtin, handler: echo}}\n\
         parameters:\n  - {{name: message, type: string, required: true}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_file_declaring_a_live_name_is_an_error_naming_both_and_the_first_stays() {
    let agents = tools_only_agents();
    let tools = agents.path().join("tools");
    let app = spawn_app(
        AppOptions::offline()
            .agents(agents.path())
            .config_toml(FAST_RESCAN),
    );
    let mut events = subscribe(&app);

    let first = put(&tools, "a_twin.yaml", &twin("The first twin."));
    wait_for(&mut events, "tool_added twin", |k| match k {
        EventKind::ToolAdded { tool, .. } if tool == "twin" => Some(()),
        _ => None,
    })
    .await;
    let second = put(&tools, "b_twin.yaml", &twin("The second twin."));
    let (file, message) = wait_for(&mut events, "load_error for the duplicate", |k| match k {
        EventKind::LoadError { file, message, .. } if message.contains("twin") => {
            Some((file.clone(), message.clone()))
        }
        _ => None,
    })
    .await;
    assert_eq!(file, second.display().to_string());
    assert!(
        message.contains(&first.display().to_string())
            && message.contains(&second.display().to_string()),
        "{message}"
    );
    let (_, shown) = app.get("/v1/tools/twin").await;
    assert_eq!(shown["definition"]["description"], "The first twin.");
    assert_eq!(shown["source"], first.display().to_string());
    let names = listed(&app, "").await;
    assert_eq!(names.iter().filter(|n| *n == "twin").count(), 1);
}

/// The file first by path order keeps the name even when it arrives second,
/// and the clash must still be reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_takes_a_live_name_by_path_order_is_still_reported_as_a_duplicate() {
    let agents = tools_only_agents();
    let tools = agents.path().join("tools");
    let app = spawn_app(
        AppOptions::offline()
            .agents(agents.path())
            .config_toml(FAST_RESCAN),
    );
    let mut events = subscribe(&app);

    let later = put(&tools, "b_twin.yaml", &twin("The b twin."));
    wait_for(&mut events, "tool_added twin", |k| match k {
        EventKind::ToolAdded { tool, .. } if tool == "twin" => Some(()),
        _ => None,
    })
    .await;
    let earlier = put(&tools, "a_twin.yaml", &twin("The a twin."));
    let message = wait_for(&mut events, "load_error for the duplicate", |k| match k {
        EventKind::LoadError { message, .. } if message.contains("twin") => Some(message.clone()),
        _ => None,
    })
    .await;
    assert!(
        message.contains(&earlier.display().to_string())
            && message.contains(&later.display().to_string()),
        "{message}"
    );
}

// ---------------------------------------------------------------- loader at startup

/// Valid YAML, but `bogus` is not a key of a tool file (line 4).
const BROKEN_AT_STARTUP: &str = "name: broken_tool\ndescription: Never loads.\nentry: {type: builtin, handler: echo}\nbogus: 1\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_tool_file_at_startup_is_skipped_and_reported_while_the_good_ones_load() {
    let agents = tools_only_agents();
    let tools = agents.path().join("tools");
    put(&tools, "greeter.yaml", GREETER_V1);
    put(&tools, "stamp.toml", STAMP_TOML);
    let broken = put(&tools, "broken.yaml", BROKEN_AT_STARTUP);
    let app = spawn_app(AppOptions::offline().agents(agents.path()));

    let names = listed(&app, "").await;
    assert!(names.contains(&"greeter".to_string()), "{names:?}");
    assert!(names.contains(&"stamp".to_string()), "{names:?}");
    assert!(!names.contains(&"broken_tool".to_string()), "{names:?}");
    let (status, body) = call(&app, "greeter", json!({"message": "up"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // What the server reported at startup, through the library API.
    let registry = ToolRegistry::new();
    registry
        .register(echo::definition(), Arc::new(echo::Echo))
        .unwrap();
    let report = registry.reload_dir(&tools);
    let mut added = report.added.clone();
    added.sort();
    assert_eq!(added, ["greeter", "stamp"]);
    assert_eq!(report.errors.len(), 1, "{:?}", report.errors);
    let error = &report.errors[0];
    assert_eq!(error.file, broken);
    assert_eq!(error.line, Some(4), "{error}");
    assert!(error.message.contains("bogus"), "{error}");
}

// ---------------------------------------------------------------- validation

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_call_gets_422_with_every_field_error_at_once() {
    let agents = order_form_agents();
    let app = order_form_app(agents.path(), None);
    let mut events = subscribe(&app);

    let (status, body) = call(&app, "order_form", order_breaking_every_rule()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["is_success"], false);
    assert_eq!(body["error_type"], "VALIDATION_ERROR");
    assert!(body["output"].is_null(), "the handler never ran: {body}");
    assert_eq!(field_codes(&body["validation_errors"]), every_rule_broken());

    let mut fields = wait_for(&mut events, "validation_error", |k| match k {
        EventKind::ValidationError { tool, fields } if tool == "order_form" => Some(fields.clone()),
        _ => None,
    })
    .await;
    fields.sort();
    fields.dedup();
    assert_eq!(
        fields,
        [
            "account",
            "code",
            "legs",
            "limits.note",
            "limits.stop",
            "nickname",
            "price",
            "quantity",
            "side",
            "tags",
            "tags.1"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defaults_are_filled_in_before_the_handler_and_by_validate() {
    let agents = order_form_agents();
    let app = order_form_app(agents.path(), None);

    let (status, body) = call(
        &app,
        "order_form",
        json!({"account": "acc-1", "code": "ABC"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let filled = json!({"account": "acc-1", "code": "ABC", "side": "buy", "quantity": 1});
    assert_eq!(body["output"]["params"], filled);

    let (status, body) = app
        .post(
            "/v1/tools/order_form/validate",
            &json!({"params": {"account": "acc-1", "code": "ABC"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"is_valid": true, "errors": [], "validated_params": filled})
    );

    // A value given wins over the default.
    let (_, body) = call(
        &app,
        "order_form",
        json!({"account": "acc-1", "code": "ABC", "side": "sell"}),
    )
    .await;
    assert_eq!(body["output"]["params"]["side"], "sell");
    assert_eq!(body["output"]["params"]["quantity"], 1);

    let (status, body) = app
        .post(
            "/v1/tools/order_form/validate",
            &json!({"params": order_breaking_every_rule()}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["is_valid"], false);
    assert!(body["validated_params"].is_null());
    assert_eq!(field_codes(&body["errors"]), every_rule_broken());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_form_and_a_json_schema_object_validate_the_same_way() {
    let agents = order_form_agents();
    let app = order_form_app(agents.path(), None);
    let cases = [
        order_breaking_every_rule(),
        json!({"account": "a", "code": "ABC"}),
        json!({"account": "a", "code": "ABC", "tags": [], "limits": {"stop": "low"}}),
        json!({"account": 7, "code": "AB", "quantity": 101, "price": 0.001}),
        json!({"account": "a", "code": "XYZ", "nickname": "toolongname", "legs": [1, 2.5]}),
    ];
    for params in cases {
        let mut answers = Vec::new();
        for tool in ["order_form", "order_form_schema"] {
            let (status, body) = app
                .post(
                    &format!("/v1/tools/{tool}/validate"),
                    &json!({ "params": params }),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            answers.push((
                body["is_valid"].clone(),
                field_codes(&body["errors"]),
                body["validated_params"].clone(),
            ));
        }
        assert_eq!(answers[0], answers[1], "for {params}");
    }
    // And the compiled list form is the JSON Schema written by hand.
    let (_, list) = app.get("/v1/tools/order_form").await;
    let (_, schema) = app.get("/v1/tools/order_form_schema").await;
    let p = &list["definition"]["parameters"];
    let q = &schema["definition"]["parameters"];
    assert_eq!(p["required"], q["required"]);
    for name in [
        "code", "nickname", "side", "quantity", "tags", "legs", "limits",
    ] {
        assert_eq!(p["properties"][name], q["properties"][name], "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_validation_refuses_an_unknown_parameter_that_the_default_mode_accepts() {
    let call_with_extra = json!({"account": "acc-1", "code": "ABC", "colour": "red"});

    let lax_agents = order_form_agents();
    let lax = order_form_app(lax_agents.path(), None);
    let (status, body) = call(&lax, "order_form", call_with_extra.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["output"]["params"]["colour"], "red");

    let strict_agents = order_form_agents();
    let strict = order_form_app(
        strict_agents.path(),
        Some("[tools]\nstrict_validation = true\n"),
    );
    for tool in ["order_form", "order_form_schema"] {
        let (status, body) = call(&strict, tool, call_with_extra.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{tool}: {body}");
        assert_eq!(body["error_type"], "VALIDATION_ERROR");
        let errors = body["validation_errors"].as_array().unwrap();
        assert_eq!(errors.len(), 1, "{body}");
        assert_eq!(errors[0]["code"], "additionalProperties");
        assert!(
            errors[0]["message"].as_str().unwrap().contains("colour"),
            "{body}"
        );
        // Declared parameters still pass in strict mode.
        let (status, body) = call(&strict, tool, json!({"account": "a", "code": "ABC"})).await;
        assert_eq!(status, StatusCode::OK, "{tool}: {body}");
    }
}

// ---------------------------------------------------------------- plans

/// The trading-copilot's tools, in the agent file's order.
const TRADING_TOOLS: [&str; 21] = [
    "get_price",
    "get_ohlcv",
    "get_indicators",
    "get_fundamentals",
    "get_news",
    "get_sentiment",
    "get_ml_signals",
    "get_ml_features",
    "get_portfolio",
    "get_trade_history",
    "create_paper_order",
    "cancel_paper_order",
    "get_pending_orders",
    "create_alert",
    "list_alerts",
    "delete_alert",
    "calculate_position_size",
    "calculate_risk_reward",
    "get_watchlist",
    "add_to_watchlist",
    "remove_from_watchlist",
];

/// The trading tools of the pro plan (the spec's table).
const PRO_TOOLS: [&str; 10] = [
    "get_sentiment",
    "get_ml_signals",
    "get_portfolio",
    "get_trade_history",
    "create_paper_order",
    "cancel_paper_order",
    "get_pending_orders",
    "create_alert",
    "list_alerts",
    "delete_alert",
];

const PREMIUM_TOOLS: [&str; 1] = ["get_ml_features"];

fn free_trading_tools() -> Vec<&'static str> {
    TRADING_TOOLS
        .iter()
        .copied()
        .filter(|t| !PRO_TOOLS.contains(t) && !PREMIUM_TOOLS.contains(t))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_listings_by_plan_differ_as_the_plans_say() {
    let agents = repo_agents_copy();
    let app = spawn_app(AppOptions::offline().agents(agents.path()));

    let free: BTreeSet<String> = listed(&app, "?plan=free").await.into_iter().collect();
    let pro: BTreeSet<String> = listed(&app, "?plan=pro").await.into_iter().collect();
    let premium: BTreeSet<String> = listed(&app, "?plan=premium").await.into_iter().collect();
    let all: BTreeSet<String> = listed(&app, "").await.into_iter().collect();

    for t in free_trading_tools() {
        assert!(free.contains(t), "{t} is free");
    }
    assert!(free.contains("echo") && free.contains("get_positions"));
    assert!(free.is_subset(&pro) && pro.is_subset(&premium));
    assert_eq!(&pro - &free, set(&PRO_TOOLS));
    assert_eq!(&premium - &pro, set(&PREMIUM_TOOLS));
    assert_eq!(premium, all);
    assert!(free.contains("get_price") && !free.contains("get_sentiment"));
    assert!(pro.contains("get_sentiment") && !pro.contains("get_ml_features"));

    let (status, body) = app.get("/v1/tools?plan=bogus").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "VALIDATION_ERROR");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("bogus"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calling_above_ones_plan_is_403_plan_required_naming_the_plan_to_upgrade_to() {
    let agents = repo_agents_copy();
    let app = spawn_app(AppOptions::offline().agents(agents.path()));

    let (status, body) = invoke(
        &app,
        "get_sentiment",
        json!({"params": {"symbol": "NVDA"}, "plan": "free"}),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error_type"], "TOOL_PLAN_REQUIRED");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains("requires the pro plan") && error.contains("Upgrade to pro"),
        "{error}"
    );

    // No plan given is the free plan.
    let (status, _) = call(&app, "get_sentiment", json!({"symbol": "NVDA"})).await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    let (status, body) = invoke(
        &app,
        "get_sentiment",
        json!({"params": {"symbol": "NVDA"}, "plan": "pro"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["output"]["source_id"], "tool:sentiment:v1");

    let (status, body) = invoke(
        &app,
        "get_ml_features",
        json!({"params": {"symbol": "NVDA"}, "plan": "pro"}),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("Upgrade to premium"),
        "{body}"
    );
    let (status, body) = invoke(
        &app,
        "get_ml_features",
        json!({"params": {"symbol": "NVDA"}, "plan": "premium"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let (status, body) = invoke(
        &app,
        "get_price",
        json!({"params": {"symbol": "NVDA"}, "plan": "gold"}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_plan_decides_which_tools_the_model_is_offered() {
    let agents = repo_agents_copy();
    let model = MockModel::start().await;
    model.push_all([Reply::text("free answer"), Reply::text("premium answer")]);
    let app = spawn_app(AppOptions::with_model(&model).agents(agents.path()));

    for plan in ["free", "premium"] {
        let (status, body) = app
            .post(
                "/v1/sessions",
                &json!({"agent": "trading-copilot", "plan": plan}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        assert_eq!(body["plan"], plan);
        let session = body["id"].as_str().unwrap().to_string();
        let (status, body) = app.say(&session, "How is NVDA doing?").await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }

    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(offered(&requests[0]), free_trading_tools());
    assert_eq!(offered(&requests[1]), TRADING_TOOLS);
    assert_eq!(model.overruns(), 0);
}

// ---------------------------------------------------------------- data tools

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_tools_cite_their_documented_source_id_in_output_and_metadata() {
    let agents = repo_agents_copy();
    let app = spawn_app(AppOptions::offline().agents(agents.path()));
    let cases = [
        ("get_account_summary", json!({}), "tool:account_summary:v1"),
        (
            "get_positions",
            json!({"symbol": "AAPL"}),
            "tool:positions:v1",
        ),
        ("get_positions_list", json!({}), "tool:positions:v1"),
        ("get_activity", json!({"limit": 3}), "tool:activity:v1"),
        ("get_transfers", json!({}), "tool:transfers:v1"),
        (
            "get_performance",
            json!({"timeframe": "1M"}),
            "tool:performance:v1",
        ),
        ("get_quotes", json!({"symbol": "msft"}), "tool:quotes:v1"),
        ("get_facts", json!({"topic": "fees"}), "tool:facts:v1"),
        ("get_price", json!({"symbol": "NVDA"}), "tool:price:v1"),
        (
            "get_ohlcv",
            json!({"symbol": "NVDA", "timeframe": "1d", "limit": 5}),
            "tool:ohlcv:v1",
        ),
        (
            "get_fundamentals",
            json!({"symbol": "AAPL"}),
            "tool:fundamentals:v1",
        ),
        ("get_news", json!({"symbol": "TSLA"}), "tool:news:v1"),
    ];
    for (tool, params, source_id) in cases {
        let (status, body) = invoke(&app, tool, json!({"params": params, "user_id": "ada"})).await;
        assert_eq!(status, StatusCode::OK, "{tool}: {body}");
        assert_eq!(body["is_success"], true, "{tool}");
        assert_eq!(body["output"]["source_id"], source_id, "{tool}");
        assert_eq!(body["metadata"]["source_id"], source_id, "{tool}");
        assert!(
            body["output"]["as_of"]
                .as_str()
                .is_some_and(|s| !s.is_empty()),
            "{tool}: {body}"
        );
        assert_eq!(body["metadata"]["as_of"], body["output"]["as_of"], "{tool}");
        assert!(!body["output"]["data"].is_null(), "{tool}: {body}");
    }
    let (_, body) = call(
        &app,
        "get_ohlcv",
        json!({"symbol": "NVDA", "timeframe": "1d", "limit": 5}),
    )
    .await;
    assert_eq!(body["output"]["data"]["bars"].as_array().unwrap().len(), 5);
    let (_, body) = call(&app, "get_positions", json!({"symbol": "aapl"})).await;
    assert_eq!(body["output"]["data"]["position"]["symbol"], "AAPL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_symbol_is_a_clear_failure_not_an_empty_success() {
    let agents = repo_agents_copy();
    let app = spawn_app(AppOptions::offline().agents(agents.path()));
    let cases = [
        ("get_quotes", "no quote for 'XYZ'; quotes: AAPL"),
        ("get_positions", "no position in 'XYZ'; positions: AAPL"),
        ("get_price", "unknown symbol 'XYZ'; known: AAPL"),
    ];
    for (tool, says) in cases {
        let (status, body) = call(&app, tool, json!({"symbol": "XYZ"})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{tool}: {body}");
        assert_eq!(body["is_success"], false, "{tool}");
        assert_eq!(body["error_type"], "VALIDATION_ERROR", "{tool}");
        assert!(body["output"].is_null(), "{tool}: {body}");
        let error = body["error"].as_str().unwrap();
        assert!(error.contains(says), "{tool}: {error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_indicators_returns_numbers_computed_from_the_bars() {
    let agents = repo_agents_copy();
    let app = spawn_app(AppOptions::offline().agents(agents.path()));

    let (status, body) = call(
        &app,
        "get_indicators",
        json!({"symbol": "AAPL", "indicators": ["RSI", "MACD", "BB", "SMA"]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["output"]["source_id"], "tool:indicators:v1");
    let data = &body["output"]["data"];
    assert_eq!(data["symbol"], "AAPL");
    assert_eq!(data["timeframe"], "1d", "the default timeframe");
    assert!(data["bars_used"].as_u64().unwrap() > 26, "{data}");
    let ind = &data["indicators"];
    let number = |v: &Value| {
        v.as_f64()
            .unwrap_or_else(|| panic!("a number, got {v} in {ind}"))
    };

    let rsi = number(&ind["RSI"]["value"]);
    assert!((0.0..=100.0).contains(&rsi), "RSI {rsi}");
    let macd = number(&ind["MACD"]["macd"]);
    let signal = number(&ind["MACD"]["signal"]);
    let histogram = number(&ind["MACD"]["histogram"]);
    assert!((macd - signal - histogram).abs() < 1e-3, "{ind}");
    let (upper, middle, lower) = (
        number(&ind["BB"]["upper"]),
        number(&ind["BB"]["middle"]),
        number(&ind["BB"]["lower"]),
    );
    assert!(upper > middle && middle > lower, "{ind}");
    assert!(
        (middle - number(&ind["SMA"]["value"])).abs() < 1e-3,
        "BB middle is the SMA(20)"
    );
    assert!(ind.get("ATR").is_none(), "only what was asked: {ind}");

    let (status, body) = call(
        &app,
        "get_indicators",
        json!({"symbol": "AAPL", "indicators": ["RSI", "FOO"]}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["validation_errors"][0]["field"], "indicators.1");
}

// ---------------------------------------------------------------- example agents, offline

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_assistant_answers_arithmetic_through_the_calculator() {
    let agents = repo_agents_copy();
    let app = spawn_app(AppOptions::offline().agents(agents.path()));
    let session = app.session("assistant").await;

    let (status, body) = app.say(&session, "What is (2+3)*4?").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["tool_calls"][0]["name"], "calculator");
    assert_eq!(body["tool_calls"][0]["is_success"], true);
    let answer = body["answer"].as_str().unwrap();
    assert!(answer.contains("20"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_brokerage_agent_answers_a_positions_question_citing_its_source() {
    let agents = repo_agents_copy();
    let app = spawn_app(AppOptions::offline().agents(agents.path()));
    let session = app.session("brokerage").await;

    let (status, body) = app
        .say(&session, "How many AAPL shares are in my positions?")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let call = &body["tool_calls"][0];
    assert_eq!(call["name"], "get_positions", "{body}");
    assert_eq!(call["is_success"], true, "{body}");
    let answer = body["answer"].as_str().unwrap();
    assert!(answer.contains("tool:positions:v1"), "{answer}");
    assert!(answer.contains("AAPL"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_trading_copilot_answers_a_price_question_through_get_price() {
    let agents = repo_agents_copy();
    let app = spawn_app(AppOptions::offline().agents(agents.path()));
    let session = app.session("trading-copilot").await;

    let (status, body) = app.say(&session, "What is the price of NVDA?").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let call = &body["tool_calls"][0];
    assert_eq!(call["name"], "get_price", "{body}");
    assert_eq!(call["is_success"], true, "{body}");
    let answer = body["answer"].as_str().unwrap();
    assert!(answer.contains("NVDA"), "{answer}");
    assert!(answer.contains("tool:price:v1"), "{answer}");
}

const START_PAGE: &str = r#"<!doctype html><html><head><title>Start</title></head>
<body><nav><a href="/">Home</a></nav><h1>Getting started</h1>
<p>Install the widget with a single command, then run widget serve.</p></body></html>"#;

/// A small site on 127.0.0.1; returns its port.
async fn serve_site() -> u16 {
    let router = Router::new()
        .route("/docs/start", get(|| async { Html(START_PAGE) }))
        .route("/admin", get(|| async { Html("<p>secret</p>") }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    port
}

/// A site-assistant agent (offline) whose site is [`serve_site`], open
/// under `/docs` and allowlisted for the network policy.
async fn site_assistant() -> (tempfile::TempDir, TestApp) {
    let port = serve_site().await;
    let agent = format!(
        "name = \"site-assistant\"\nsystem_prompt = \"Answer from the site.\"\n\
         tools = [\"fetch_page\"]\nmax_iterations = 1\n\n\
         [site]\nbase_url = \"http://127.0.0.1:{port}\"\nallowed_paths = [\"/docs\"]\n"
    );
    let agents = agents_dir(&[("site-assistant.toml", &agent)]);
    let app = spawn_app(
        AppOptions::offline()
            .agents(agents.path())
            .config_toml(&format!(
                "[tools]\nhttp_allowlist = [\"127.0.0.1:{port}\"]\n"
            )),
    );
    (agents, app)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_site_assistant_answers_from_an_allowed_page_of_its_site() {
    let (_agents, app) = site_assistant().await;
    let session = app.session("site-assistant").await;

    let (status, body) = app.say(&session, "what does /docs/start say?").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let call = &body["tool_calls"][0];
    assert_eq!(call["name"], "fetch_page", "{body}");
    assert_eq!(call["is_success"], true, "{body}");
    assert!(
        call["output"]["text"]
            .as_str()
            .unwrap()
            .contains("Install the widget with a single command"),
        "{body}"
    );
    let answer = body["answer"].as_str().unwrap();
    assert!(answer.contains("Install the widget"), "{answer}");
}

/// What the site assistant does get right: the page is read, only within
/// the allowed paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_site_assistant_reads_the_page_asked_for_and_refuses_other_paths() {
    let (_agents, app) = site_assistant().await;
    let session = app.session("site-assistant").await;

    let (status, body) = app.say(&session, "what does /docs/start say?").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let call = &body["tool_calls"][0];
    assert_eq!(call["name"], "fetch_page", "{body}");
    assert_eq!(call["is_success"], true, "{body}");
    assert_eq!(call["output"]["source_id"], "tool:site:v1");
    assert!(
        call["output"]["text"]
            .as_str()
            .unwrap()
            .contains("Install the widget with a single command"),
        "{body}"
    );
    assert!(
        body["answer"].as_str().unwrap().contains("tool:site:v1"),
        "{body}"
    );

    let (status, body) = app.say(&session, "what does the /admin page say?").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let call = &body["tool_calls"][0];
    assert_eq!(call["is_success"], false, "{body}");
    assert!(
        call["error"]
            .as_str()
            .unwrap()
            .contains("outside the site's allowed paths"),
        "{body}"
    );
}

// ---------------------------------------------------------------- events as SSE

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_events_streams_an_execution_completed_event_for_an_invoked_tool() {
    let agents = tools_only_agents();
    let app = spawn_app(AppOptions::offline().agents(agents.path()));
    let response = app
        .client
        .request(Method::GET, "/v1/events")
        .send()
        .await
        .expect("events stream opens");
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );

    let (status, body) = call(&app, "echo", json!({"message": "over sse"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let mut stream = response.bytes_stream();
    let mut buffer = String::new();
    let data = tokio::time::timeout(EVENT_BOUND, async {
        loop {
            let chunk = stream
                .next()
                .await
                .expect("stream still open")
                .expect("chunk read");
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buffer.find("\n\n") {
                let event: String = buffer.drain(..end + 2).collect();
                let mut name = None;
                let mut data = String::new();
                for line in event.lines() {
                    if let Some(n) = line.strip_prefix("event:") {
                        name = Some(n.trim().to_string());
                    } else if let Some(d) = line.strip_prefix("data:") {
                        data.push_str(d.trim_start());
                    }
                }
                if name.as_deref() == Some("execution_completed") {
                    return serde_json::from_str::<Value>(&data).expect("event data is JSON");
                }
            }
        }
    })
    .await
    .expect("execution_completed arrives on the stream");
    assert_eq!(data["type"], "execution_completed");
    assert_eq!(data["tool"], "echo");
    assert_eq!(data["cached"], false);
    assert!(data["at"].is_string(), "{data}");
}

/// A call answered from the result cache is recorded as such (`cached`),
/// so a reader of `/v1/calls` or a session's export can tell it from a run.
#[tokio::test]
async fn a_call_answered_from_the_cache_is_recorded_cached() {
    let app = spawn_app(AppOptions::offline());
    let invoke = json!({"params": {"symbol": "AAPL"}});
    for expect_cached in [false, true] {
        let (status, body) = app.post("/v1/tools/get_price/invoke", &invoke).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["metadata"]["cached"], expect_cached, "{body}");
    }
    let (status, page) = app.get("/v1/calls?tool=get_price").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let cached: Vec<&Value> = page["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|c| &c["cached"])
        .collect();
    // Newest first: the second call came from the cache.
    assert_eq!(cached, [&json!(true), &json!(false)], "{page}");
}

/// As docs/tools.md says: the default listing is the OpenAI functions
/// alone (to hand to a model as is); `view=definitions` carries each
/// tool's `side_effects`.
#[tokio::test]
async fn side_effects_are_listed_with_view_definitions_not_in_the_openai_view() {
    let app = spawn_app(AppOptions::offline());
    let (status, openai) = app.get("/v1/tools").await;
    assert_eq!(status, StatusCode::OK, "{openai}");
    let tools = openai["tools"].as_array().expect("tools");
    assert!(!tools.is_empty());
    for t in tools {
        assert_eq!(t["type"], "function", "{t}");
        assert!(t.get("side_effects").is_none(), "{t}");
    }
    let (status, defs) = app.get("/v1/tools?view=definitions").await;
    assert_eq!(status, StatusCode::OK, "{defs}");
    let defs = defs["tools"].as_array().expect("tools");
    assert_eq!(defs.len(), tools.len());
    for d in defs {
        let side = d["side_effects"].as_str().unwrap_or_default();
        assert!(
            ["none", "idempotent", "at_most_once"].contains(&side),
            "{d}"
        );
    }
    let calc = defs
        .iter()
        .find(|d| d["name"] == "calculator")
        .expect("calculator");
    assert_eq!(calc["side_effects"], "none");
}
