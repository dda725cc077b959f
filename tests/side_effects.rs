//! Side effects and idempotency keys of tool calls, the tool side of
//! durable turns.
//!
//! ExecuteTool {ctx.idempotency_key} ──▶ executor ──at_most_once: CallIntent (durable)──▶ handler
//!                                                    │ HTTP entry: `Idempotency-Key` header
//!                                                    │ command entry: `idempotency_key` in its input
//!                                                    │ MCP: `_meta["cadre/idempotency-key"]`
//!
//! Conversations do not set the key yet, so the calls here are made the
//! way a turn will make them: through the executor's handle, with the
//! context a turn builds (`<session>:<turn>:<tool_call_id>`).
//!
//! - What each kind of tool receives: a local upstream behind a tool file's
//!   `url` (the same key on the retry after a 503) or `http_request` (on
//!   what may act), a command (`cat`) that prints its input, an MCP server
//!   ([`mcp_server`]) that keeps `_meta`.
//! - What each tool declares, as `GET /v1/tools` lists it: builtins, tool
//!   files (said, inherited from a builtin handler, or the default), MCP
//!   annotations and what mcp.toml says over them.
//! - The intent: a call that cannot commit it does not run; one that did is
//!   in the file when the process is killed while the tool runs (a child
//!   process of this test binary, [`child_process`], killed with SIGKILL),
//!   and is erased with its session; an approved call commits its intent
//!   when it runs, not while it waits, and its record survives the kill.

mod support;

#[path = "fixtures/mcp_server.rs"]
mod mcp_server;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode as AxumStatus};
use axum::response::IntoResponse;
use cadre::events::EventKind;
use cadre::executor::{Arguments, CALL_INTENTS, ExecuteTool, ExecutorHandle, call_intent};
use cadre::store::Store;
use cadre::tools::definition::REQUIRE_CONFIRMATION;
use cadre::tools::{
    CallerType, ErrorType, ExecutionContext, FnHandler, SideEffects, ToolDefinition, ToolError,
    ToolExecutionResult, ToolHandler,
};
use mcp_server::McpFixture;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{AppOptions, TestApp, agents_dir, spawn_app};

/// Upper bound for anything a test waits for.
const PATIENCE: Duration = Duration::from_secs(30);

/// The turn every call here is made from.
const TURN: &str = "turn-1";

fn executor(app: &TestApp) -> ExecutorHandle {
    app.runtime
        .as_ref()
        .expect("the app is running")
        .executor()
        .clone()
}

fn store(app: &TestApp) -> Store {
    executor(app).shared().store.clone()
}

/// The key a turn of `session` gives its call `tool_call_id`.
fn key_of(session: &str, tool_call_id: &str) -> String {
    format!("{session}:{TURN}:{tool_call_id}")
}

/// A call as a conversation turn of `session` makes it, with its
/// idempotency key.
fn turn_call(tool: &str, params: Value, session: &str, tool_call_id: &str) -> ExecuteTool {
    let mut ctx = ExecutionContext::new(CallerType::ConversationAgent, "test-turn");
    ctx.conversation_id = Some(session.into());
    ctx.turn_id = Some(TURN.into());
    ctx.idempotency_key = Some(key_of(session, tool_call_id));
    let mut call = ExecuteTool::new(tool, Arguments::Json(params), ctx);
    call.tool_call_id = Some(tool_call_id.into());
    call
}

async fn run(app: &TestApp, call: ExecuteTool) -> ToolExecutionResult {
    tokio::time::timeout(PATIENCE, executor(app).execute(call))
        .await
        .expect("the call finished in time")
}

/// A tool of no parameters that counts its runs.
fn counting(name: &str, side_effects: SideEffects) -> (ToolDefinition, Arc<AtomicU64>) {
    let def = ToolDefinition::new(
        name,
        "counts its runs",
        json!({"type": "object", "properties": {}}),
    )
    .with_side_effects(side_effects);
    (def, Arc::new(AtomicU64::new(0)))
}

fn counter_handler(runs: &Arc<AtomicU64>) -> Arc<dyn ToolHandler> {
    let runs = runs.clone();
    Arc::new(FnHandler(move |_params: Value| {
        let runs = runs.clone();
        async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            Ok::<Value, ToolError>(json!({ "runs": n }))
        }
    }))
}

/// `side_effects` of every tool `GET /v1/tools?view=…` lists, by name.
async fn listed_side_effects(app: &TestApp, view: &str) -> HashMap<String, Value> {
    let (status, body) = app.get(&format!("/v1/tools?view={view}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| {
            let name = match view {
                "openai" => &t["function"]["name"],
                _ => &t["name"],
            };
            (
                name.as_str().unwrap().to_string(),
                t["side_effects"].clone(),
            )
        })
        .collect()
}

// ------------------------------------------------------------ what tools get

/// A local upstream: answers 503 to its first request and `{"ok": true}`
/// after; keeps the `Idempotency-Key` of each request.
async fn flaky_upstream() -> (String, Arc<Mutex<Vec<Option<String>>>>) {
    let keys = Arc::new(Mutex::new(Vec::new()));
    let seen = keys.clone();
    let app = axum::Router::new().route(
        "/pay",
        axum::routing::post(move |headers: HeaderMap| {
            let seen = seen.clone();
            async move {
                let mut keys = seen.lock().unwrap();
                keys.push(
                    headers
                        .get("idempotency-key")
                        .map(|v| v.to_str().unwrap().to_string()),
                );
                if keys.len() == 1 {
                    (AxumStatus::SERVICE_UNAVAILABLE, "busy").into_response()
                } else {
                    axum::Json(json!({"ok": true})).into_response()
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr.to_string(), keys)
}

/// An agents folder whose `tools/` holds `files`.
fn tool_files(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = agents_dir(&[]);
    std::fs::create_dir(dir.path().join("tools")).unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join("tools").join(name), text).unwrap();
    }
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_entry_gets_the_same_idempotency_key_on_every_attempt() {
    let (host, keys) = flaky_upstream().await;
    let pay = format!(
        "name: pay\ndescription: Pays\nentry: {{type: external, url: \"http://{host}/pay\", allowlist: [\"{host}\"]}}\n"
    );
    let agents = tool_files(&[("pay.yaml", &pay)]);
    let app = spawn_app(AppOptions::offline().agents(agents.path()));

    let mut call = turn_call("pay", json!({}), "s-http", "call_pay");
    call.ctx.max_retries = 1;
    let result = run(&app, call).await;
    assert!(result.is_success, "{result:?}");
    assert_eq!(result.metadata.attempts, 2, "the 503 was retried");
    let key = key_of("s-http", "call_pay");
    assert_eq!(
        *keys.lock().unwrap(),
        [Some(key.clone()), Some(key.clone())]
    );

    // Undeclared, a URL may act: at_most_once, so the intent was committed.
    let intent = call_intent(&store(&app), &key).await.unwrap();
    assert_eq!(intent.expect("the intent").tool, "pay");

    // A call without a key (a direct invoke) sends none.
    keys.lock().unwrap().clear();
    keys.lock().unwrap().push(None); // the upstream answers 200 from now on
    let (status, body) = app.post("/v1/tools/pay/invoke", &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(*keys.lock().unwrap(), [None, None]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_gets_the_idempotency_key_in_its_input() {
    let echo_input = "name: echo_input\ndescription: Prints its input\nside_effects: idempotent\nentry: {type: external, command: [\"cat\"]}\nparameters:\n  - {name: n, type: integer, required: true}\n";
    let agents = tool_files(&[("echo_input.yaml", echo_input)]);
    let app = spawn_app(AppOptions::offline().agents(agents.path()));

    let result = run(
        &app,
        turn_call("echo_input", json!({"n": 1}), "s-cmd", "call_cmd"),
    )
    .await;
    assert!(result.is_success, "{result:?}");
    let key = key_of("s-cmd", "call_cmd");
    assert_eq!(
        result.output,
        Some(json!({"n": 1, "idempotency_key": key.clone()}))
    );
    // Declared idempotent: no intent.
    assert_eq!(call_intent(&store(&app), &key).await.unwrap(), None);

    // Without a key the input is the parameters as they were.
    let (status, body) = app
        .post("/v1/tools/echo_input/invoke", &json!({"params": {"n": 2}}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["output"], json!({"n": 2}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_request_sends_the_key_with_what_may_act_unless_the_model_set_one() {
    // Answers with the Idempotency-Key it got ("" for none).
    let app = axum::Router::new().route(
        "/",
        axum::routing::any(|headers: HeaderMap| async move {
            let key = headers
                .get("idempotency-key")
                .map_or("", |v| v.to_str().unwrap())
                .to_string();
            axum::Json(json!({ "key": key }))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let dir = tempfile::tempdir().unwrap();
    let builtins = cadre::tools::builtin::BuiltinContext {
        store: Store::open(dir.path()).unwrap(),
        data_dir: dir.path().join("data"),
        http_allowlist: vec![host.clone()],
    };
    let (_, http_request) = cadre::tools::builtin::http::tools(&builtins)
        .into_iter()
        .find(|(d, _)| d.name == "http_request")
        .unwrap();
    let mut ctx = ExecutionContext::new(CallerType::ConversationAgent, "test-turn");
    ctx.idempotency_key = Some("s:t:c".into());
    let key_sent = |params: Value| {
        let (handler, ctx) = (http_request.clone(), ctx.clone());
        async move {
            let out = handler.call(params, &ctx).await.expect("answered");
            out["body"]["key"].as_str().unwrap().to_string()
        }
    };
    let url = format!("http://{host}/");
    assert_eq!(
        key_sent(json!({"url": url, "method": "POST"})).await,
        "s:t:c"
    );
    assert_eq!(
        key_sent(json!({"url": url, "method": "PATCH"})).await,
        "s:t:c"
    );
    assert_eq!(key_sent(json!({"url": url, "method": "GET"})).await, "");
    let own = json!({"url": url, "method": "POST", "headers": {"Idempotency-Key": "mine"}});
    assert_eq!(key_sent(own).await, "mine");
}

/// Waits until the MCP tool `tool` is served.
async fn until_up(app: &TestApp, tool: &str) {
    let runtime = app.runtime.as_ref().expect("in-process app");
    let mut events = runtime.events().subscribe();
    let server = tool.split('.').next().unwrap().to_string();
    if runtime.registry().mcp_status(tool) == Some(true) {
        return;
    }
    loop {
        let e = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .unwrap_or_else(|_| panic!("{server} never came up"))
            .expect("the event bus is open");
        if matches!(&e.kind, EventKind::McpServerUp { server: s, .. } if *s == server) {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_call_carries_the_key_in_meta_and_annotations_or_mcp_toml_decide_side_effects() {
    let fixture = McpFixture::start().await;
    // The same server twice: as it annotates its tools, and as mcp.toml
    // declares them over that.
    let mcp_toml = format!(
        "[servers.fix]\nurl = \"{url}\"\n\n[servers.decl]\nurl = \"{url}\"\nside_effects = \"none\"\n\n[servers.decl.tool_side_effects]\ncount = \"idempotent\"\n",
        url = fixture.url
    );
    let agents = agents_dir(&[("mcp.toml", &mcp_toml)]);
    let app = spawn_app(AppOptions::offline().agents(agents.path()));
    until_up(&app, "fix.count").await;
    until_up(&app, "decl.count").await;

    let listed = listed_side_effects(&app, "definitions").await;
    for (tool, want) in [
        ("fix.lookup", "none"),
        ("fix.upsert", "idempotent"),
        ("fix.count", "at_most_once"),
        ("decl.lookup", "none"),
        ("decl.upsert", "none"),
        ("decl.count", "idempotent"),
    ] {
        assert_eq!(listed[tool], want, "{tool}");
    }

    let result = run(&app, turn_call("fix.count", json!({}), "s-mcp", "call_1")).await;
    assert!(result.is_success, "{result:?}");
    assert_eq!(fixture.runs(), 1);
    let key = key_of("s-mcp", "call_1");
    let metas = fixture.metas();
    let (tool, meta) = metas.last().expect("the call reached the server");
    assert_eq!(tool, "count");
    assert_eq!(meta["cadre/idempotency-key"], json!(key), "{meta:?}");
    assert!(call_intent(&store(&app), &key).await.unwrap().is_some());

    // A call without a key sends none.
    let (status, body) = app.post("/v1/tools/fix.upsert/invoke", &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let metas = fixture.metas();
    let (tool, meta) = metas.last().unwrap();
    assert_eq!(tool, "upsert");
    assert!(!meta.contains_key("cadre/idempotency-key"), "{meta:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_side_effects_show_in_the_tool_list() {
    let agents = tool_files(&[
        (
            "quote.yaml",
            "name: quote\ndescription: Reads a quote\nside_effects: none\nentry: {type: external, url: \"https://quotes.example.com/q\"}\n",
        ),
        (
            "run.yaml",
            "name: run\ndescription: Runs a command\nentry: {type: external, command: [\"true\"]}\n",
        ),
        (
            "shout.yaml",
            "name: shout\ndescription: The echo builtin\nentry: {type: builtin, handler: echo}\nparameters:\n  - {name: message, type: string, required: true}\n",
        ),
        (
            "loud.yaml",
            "name: loud\ndescription: The echo builtin, declared\nside_effects: at_most_once\nentry: {type: builtin, handler: echo}\nparameters:\n  - {name: message, type: string, required: true}\n",
        ),
    ]);
    let (custom, runs) = counting("custom_tool", SideEffects::Idempotent);
    let plain = ToolDefinition::new(
        "undeclared",
        "says nothing",
        json!({"type": "object", "properties": {}}),
    );
    let app = spawn_app(
        AppOptions::offline()
            .agents(agents.path())
            .tool(custom, counter_handler(&runs))
            .tool(plain, counter_handler(&runs)),
    );
    let want = [
        // builtins
        ("get_price", "none"),
        ("echo", "none"),
        ("fetch_page", "none"),
        ("get_account_summary", "none"),
        ("add_to_watchlist", "idempotent"),
        ("cancel_paper_order", "idempotent"),
        ("create_paper_order", "at_most_once"),
        ("create_alert", "at_most_once"),
        ("http_request", "at_most_once"),
        // tool files: said, the default, inherited from the handler, said over it
        ("quote", "none"),
        ("run", "at_most_once"),
        ("shout", "none"),
        ("loud", "at_most_once"),
        // the library's: said, and the default
        ("custom_tool", "idempotent"),
        ("undeclared", "at_most_once"),
    ];
    let listed = listed_side_effects(&app, "definitions").await;
    for (tool, side_effects) in want {
        assert_eq!(listed[tool], side_effects, "{tool}");
    }
    // The default view is the OpenAI format only, handed to models as is.
    let listed = listed_side_effects(&app, "openai").await;
    assert!(listed.values().all(Value::is_null), "{listed:?}");
}

// ----------------------------------------------------------------- the intent

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_at_most_once_call_whose_intent_cannot_be_stored_does_not_run() {
    let (place, placed) = counting("place", SideEffects::AtMostOnce);
    let (set, sets) = counting("set", SideEffects::Idempotent);
    let app = spawn_app(
        AppOptions::offline()
            .tool(place, counter_handler(&placed))
            .tool(set, counter_handler(&sets)),
    );
    store(&app).close_writes();

    let result = run(&app, turn_call("place", json!({}), "s-closed", "call_1")).await;
    assert_eq!(
        result.error_type,
        Some(ErrorType::ExecutionError),
        "{result:?}"
    );
    assert!(
        result.error.as_deref().unwrap().contains("intent"),
        "{result:?}"
    );
    assert_eq!(placed.load(Ordering::SeqCst), 0, "the tool did not run");

    // What needs no intent runs on the same store: a repeatable tool, and
    // an at_most_once call without a key (nothing to resume it by).
    let result = run(&app, turn_call("set", json!({}), "s-closed", "call_2")).await;
    assert!(result.is_success, "{result:?}");
    let mut keyless = turn_call("place", json!({}), "s-closed", "call_3");
    keyless.ctx.idempotency_key = None;
    let result = run(&app, keyless).await;
    assert!(result.is_success, "{result:?}");
    assert_eq!(
        (placed.load(Ordering::SeqCst), sets.load(Ordering::SeqCst)),
        (1, 1)
    );
}

/// Set in the child process: what [`child_process`] does.
const CHILD_MODE: &str = "CADRE_SIDE_EFFECTS_CHILD";
/// Set in the child process: its data dir.
const CHILD_DATA: &str = "CADRE_SIDE_EFFECTS_DATA";

/// `place`: at_most_once; says `MARK RUNNING` on stdout when it runs, then
/// never finishes.
fn place_forever() -> (ToolDefinition, Arc<dyn ToolHandler>) {
    let def = ToolDefinition::new(
        "place",
        "places an order, slowly",
        json!({"type": "object", "properties": {}}),
    )
    .with_side_effects(SideEffects::AtMostOnce);
    let handler = FnHandler(|_params: Value| async move {
        println!("MARK RUNNING");
        std::future::pending::<Result<Value, ToolError>>().await
    });
    (def, Arc::new(handler))
}

/// `order`: at_most_once and needs a confirmation; answers `{"ordered": true}`.
fn order() -> (ToolDefinition, Arc<dyn ToolHandler>) {
    let def = ToolDefinition::new(
        "order",
        "places an order once approved",
        json!({"type": "object", "properties": {}}),
    )
    .with_side_effects(SideEffects::AtMostOnce)
    .with_post_processor(REQUIRE_CONFIRMATION);
    let handler = FnHandler(|_params: Value| async move { Ok(json!({"ordered": true})) });
    (def, Arc::new(handler))
}

fn app_on(data: &Path) -> TestApp {
    let (place_def, place) = place_forever();
    let (order_def, order) = order();
    spawn_app(
        AppOptions::offline()
            .data_dir(data)
            .tool(place_def, place)
            .tool(order_def, order),
    )
}

/// The body of the child process the kill tests start: a cadre on
/// `CADRE_SIDE_EFFECTS_DATA` that creates a session (`MARK SESSION <id>`),
/// then, by `CADRE_SIDE_EFFECTS_CHILD`:
/// - `intent`: calls `place`, which says `MARK RUNNING` and never ends;
/// - `approval`: calls `order`, checks no intent is committed while it
///   waits, approves it, checks the intent is, says `MARK APPROVED` and
///   waits to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the body of a child process the kill tests start"]
async fn child_process() {
    let Ok(mode) = std::env::var(CHILD_MODE) else {
        return;
    };
    let data = std::path::PathBuf::from(std::env::var(CHILD_DATA).expect("a data dir"));
    let app = app_on(&data);
    let session = app.session("assistant").await;
    println!("MARK SESSION {session}");
    match mode.as_str() {
        "intent" => {
            run(&app, turn_call("place", json!({}), &session, "call_place")).await;
            panic!("place never ends");
        }
        "approval" => {
            let result = run(&app, turn_call("order", json!({}), &session, "call_order")).await;
            assert_eq!(result.error_type, Some(ErrorType::PendingConfirmation));
            let key = key_of(&session, "call_order");
            let store = store(&app);
            assert_eq!(call_intent(&store, &key).await.unwrap(), None);
            let id = result.metadata.confirmation_id.expect("a confirmation id");
            let decided = executor(&app)
                .decide_confirmation(&id, "default", true)
                .await
                .expect("approved");
            assert_eq!(decided.status, "executed", "{decided:?}");
            assert!(call_intent(&store, &key).await.unwrap().is_some());
            println!("MARK APPROVED");
            std::future::pending::<()>().await;
        }
        other => panic!("unknown mode {other}"),
    }
}

/// This test binary running [`child_process`] in `mode` on `data`; its
/// `MARK` lines arrive on the receiver.
fn start_child(mode: &str, data: &Path) -> (Child, mpsc::Receiver<String>) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", "child_process", "--ignored", "--nocapture"])
        .env(CHILD_MODE, mode)
        .env(CHILD_DATA, data)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped());
    support::store::share_with_child(&mut command, data);
    let mut child = command.spawn().expect("the child starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(mark) = line.strip_prefix("MARK ") {
                let _ = tx.send(mark.to_string());
            }
        }
    });
    (child, rx)
}

/// The next `MARK` line, which must start with `prefix`; its rest.
fn mark(marks: &mpsc::Receiver<String>, prefix: &str) -> String {
    let line = marks
        .recv_timeout(PATIENCE)
        .unwrap_or_else(|e| panic!("no MARK {prefix} from the child: {e}"));
    line.strip_prefix(prefix)
        .unwrap_or_else(|| panic!("MARK {prefix} expected, got MARK {line}"))
        .trim()
        .to_string()
}

fn kill_9(mut child: Child) {
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
}

/// Rows of the closed store in `data` that mention `id`.
fn rows_naming(data: &Path, id: &str) -> Vec<String> {
    support::store::rows_naming(data, &[id.to_string()])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_intent_is_on_disk_before_the_tool_runs_and_goes_with_its_session() {
    let data = tempfile::tempdir().unwrap();
    let (child, marks) = start_child("intent", data.path());
    let session = mark(&marks, "SESSION");
    mark(&marks, "RUNNING");
    kill_9(child);

    let mut app = app_on(data.path());
    let store = store(&app);
    let key = key_of(&session, "call_place");
    let intent = call_intent(&store, &key)
        .await
        .unwrap()
        .expect("the intent survived the kill");
    assert_eq!(intent.tool, "place");
    assert_eq!(intent.tool_call_id.as_deref(), Some("call_place"));
    assert_eq!(intent.turn_id.as_deref(), Some(TURN));
    assert_eq!(intent.conversation_id.as_deref(), Some(session.as_str()));
    assert!(
        store
            .calls_for_conversation(&session)
            .await
            .unwrap()
            .is_empty(),
        "the call never finished: an intent and no record"
    );
    // Owned by its tenant.
    let owned = store
        .docs_of(CALL_INTENTS, "default", None, 100, false)
        .await
        .unwrap();
    assert!(owned.items.iter().any(|(k, _)| *k == key), "{owned:?}");

    let (status, body) = app.client.delete(&format!("/v1/sessions/{session}")).await;
    assert!(status.is_success(), "{body}");
    assert_eq!(call_intent(&store, &key).await.unwrap(), None);
    drop(store);
    app.stop();
    assert_eq!(rows_naming(data.path(), &session), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_call_commits_its_intent_when_it_runs_and_its_record_survives_a_kill() {
    let data = tempfile::tempdir().unwrap();
    let (child, marks) = start_child("approval", data.path());
    let session = mark(&marks, "SESSION");
    mark(&marks, "APPROVED");
    kill_9(child);

    let app = app_on(data.path());
    let store = store(&app);
    let calls = store.calls_for_conversation(&session).await.unwrap();
    let approved = calls
        .iter()
        .find(|c| c.is_success)
        .unwrap_or_else(|| panic!("the approved call's record survived the kill: {calls:?}"));
    assert_eq!(approved.tool_name, "order");
    assert_eq!(approved.tool_call_id.as_deref(), Some("call_order"));
    assert_eq!(approved.output, Some(json!({"ordered": true})));
    let intent = call_intent(&store, &key_of(&session, "call_order"))
        .await
        .unwrap()
        .expect("the approved call's intent");
    assert_eq!(intent.tool, "order");
}
