//! Workflows seen from outside: definitions refused at load, nodes started
//! in dependency order and in parallel, outputs templated into params and
//! prompts, map fan-out bounded by `max_parallel`, `when` skips, fail_fast
//! and continue, the concurrency bypass of workflow tool calls, runs
//! interrupted by a restart and resumed (by hand past the resume window,
//! by themselves within it, with their calls' idempotency keys), node
//! events over SSE, and the
//! shipped market-brief and account-review workflows.
//!
//! Nodes that must be "in flight" use a gate tool: it reports its label
//! when it starts and finishes only when the test opens the gate, so
//! "both started before either finished" is a state the test sets up, not
//! a timing it hopes for. Runs are awaited through the library's
//! `Workflows::wait` (a watch on the run), never by sleeping.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cadre::tools::{FnHandler, ToolDefinition, ToolError, ToolHandler};
use cadre::workflow::{WorkflowEventKind, WorkflowRun};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::gate::gate_tool;
use support::workflow::{agents_with, finished, get_run, run_to_end, workflows};
use support::{AppOptions, MockModel, Reply, TestApp, agent_toml, repo_agents, send, spawn_app};

/// How long anything the test waits for may take before it fails loudly.
const PATIENCE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// Test tools
// ---------------------------------------------------------------------------

/// `emit {value}`: answers `value`, whatever it is.
fn emit_tool() -> (ToolDefinition, Arc<dyn ToolHandler>) {
    let handler = FnHandler(|params: Value| async move {
        Ok::<Value, ToolError>(params.get("value").cloned().unwrap_or(Value::Null))
    });
    let def = ToolDefinition::new(
        "emit",
        "Answers the value it is given.",
        json!({"type": "object", "properties": {"value": {}}}),
    )
    .with_cache_ttl(0);
    (def, Arc::new(handler))
}

/// `count {}`: answers `{calls}`, how often it ran.
fn count_tool() -> (ToolDefinition, Arc<dyn ToolHandler>, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let handler = FnHandler(move |_params: Value| {
        let call = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move { Ok::<Value, ToolError>(json!({ "calls": call })) }
    });
    let def = ToolDefinition::new(
        "count",
        "Counts its calls.",
        json!({"type": "object", "properties": {}}),
    )
    .with_cache_ttl(0);
    (def, Arc::new(handler), calls)
}

/// `fail {}`: always fails; `flaky {}`: fails transiently on its first call.
fn failing_tools() -> Vec<(ToolDefinition, Arc<dyn ToolHandler>)> {
    let fail =
        FnHandler(
            |_params: Value| async move { Err::<Value, ToolError>(ToolError::failed("boom")) },
        );
    let calls = Arc::new(AtomicUsize::new(0));
    let flaky = FnHandler(move |_params: Value| {
        let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            if call == 1 {
                Err(ToolError::Transient {
                    message: "try again".into(),
                })
            } else {
                Ok(json!({ "call": call }))
            }
        }
    });
    let schema = json!({"type": "object", "properties": {}});
    vec![
        (
            ToolDefinition::new("fail", "Always fails.", schema.clone()).with_cache_ttl(0),
            Arc::new(fail),
        ),
        (
            ToolDefinition::new("flaky", "Fails once, then works.", schema).with_cache_ttl(0),
            Arc::new(flaky),
        ),
    ]
}

// ---------------------------------------------------------------------------
// Setup and requests
// ---------------------------------------------------------------------------

/// The repository's agents folder, copied, plus these agent files.
fn repo_agents_plus(extra: &[(&str, &str)]) -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).expect("create dir");
        for entry in std::fs::read_dir(from).expect("read dir") {
            let path = entry.expect("dir entry").path();
            let target = to.join(path.file_name().expect("file name"));
            if path.is_dir() {
                copy(&path, &target);
            } else {
                std::fs::copy(&path, &target).expect("copy file");
            }
        }
    }
    let dir = tempfile::tempdir().expect("temp dir");
    copy(&repo_agents(), dir.path());
    for (name, text) in extra {
        std::fs::write(dir.path().join(name), text).expect("write agent");
    }
    dir
}

/// Starts a run over HTTP without waiting; returns its id.
async fn start(app: &TestApp, workflow: &str, input: Value) -> String {
    let (status, body) = app
        .post(
            &format!("/v1/workflows/{workflow}/runs"),
            &json!({ "input": input }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["status"], "running", "{body}");
    body["id"].as_str().expect("run id").to_string()
}

async fn calls_of(app: &TestApp, run: &str) -> Vec<Value> {
    let (status, body) = app.get(&format!("/v1/calls?workflow_id={run}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["calls"].as_array().expect("calls").clone()
}

fn app_with(agents: &Path, tools: Vec<(ToolDefinition, Arc<dyn ToolHandler>)>) -> AppOptions {
    let mut options = AppOptions::offline().agents(agents);
    for (def, handler) in tools {
        options = options.tool(def, handler);
    }
    options
}

// ---------------------------------------------------------------------------
// Order, parallelism, templating
// ---------------------------------------------------------------------------

const DIAMOND: &str = r#"
name = "diamond"
[[nodes]]
id = "left"
tool = "gate"
params = { label = "left" }
[[nodes]]
id = "right"
tool = "gate"
params = { label = "right" }
[[nodes]]
id = "join"
tool = "emit"
params = { value = { left = "{{nodes.left.output.label}}", right = "{{nodes.right.output.label}}" } }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn independent_nodes_run_at_the_same_time_and_a_dependent_waits_for_both() {
    let agents = agents_with(&[], &[("diamond.toml", DIAMOND)]);
    let (gdef, ghandler, mut gate) = gate_tool("gate", "custom");
    let (edef, ehandler) = emit_tool();
    let app = spawn_app(app_with(
        agents.path(),
        vec![(gdef, ghandler), (edef, ehandler)],
    ));

    let id = start(&app, "diamond", json!({})).await;
    // Both gate nodes start before either is released.
    let mut labels = vec![gate.started().await, gate.started().await];
    labels.sort();
    assert_eq!(labels, ["left", "right"]);
    assert_eq!(gate.peak.load(Ordering::SeqCst), 2);
    let run = get_run(&app, &id).await;
    assert_eq!(run["nodes"]["left"]["status"], "running", "{run}");
    assert_eq!(run["nodes"]["join"]["status"], "pending", "{run}");

    gate.open(2);
    let run = finished(&app, &id).await;
    assert_eq!(run.status.as_str(), "succeeded", "{run:?}");
    let join = &run.nodes["join"];
    assert_eq!(join.output, Some(json!({"left": "left", "right": "right"})));
    let (left, right) = (&run.nodes["left"], &run.nodes["right"]);
    let started = join.started_at.expect("join started");
    assert!(started >= left.finished_at.expect("left finished"));
    assert!(started >= right.finished_at.expect("right finished"));
    assert_eq!(gate.running.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_are_templated_into_params_with_their_types_and_into_prompts() {
    let workflow = r#"
        name = "templating"
        [input]
        type = "object"
        required = ["symbol"]
        properties.symbol = { type = "string" }
        properties.n = { type = "integer", default = 2 }
        [[nodes]]
        id = "source"
        tool = "emit"
        params = { value = { count = 3, name = "Apple", tags = ["x", "y"] } }
        [[nodes]]
        id = "use"
        tool = "emit"
        params = { value = { count = "{{nodes.source.output.count}}", whole = "{{nodes.source.output}}", text = "{{input.symbol}} x{{nodes.source.output.count}}", n = "{{input.n}}", first = "{{nodes.source.output.tags.0}}" } }
        [[nodes]]
        id = "ask"
        agent = "writer"
        prompt = "Summarise {{nodes.source.output.name}} ({{input.symbol}}): {{nodes.source.output.tags}}"
        [[nodes]]
        id = "follow"
        agent = "writer"
        session = "ask"
        prompt = "Shorter than: {{nodes.ask.output}}"
    "#;
    let writer = agent_toml("writer", &[], 1);
    let agents = agents_with(&[("writer.toml", &writer)], &[("t.toml", workflow)]);
    let model = MockModel::start().await;
    model.push_all([Reply::text("Apple is fine."), Reply::text("Fine.")]);
    let (edef, ehandler) = emit_tool();
    let mut options = AppOptions::with_model(&model)
        .agents(agents.path())
        .tool(edef, ehandler);
    options.max_retries = 0;
    let app = spawn_app(options);

    let run = run_to_end(&app, "templating", json!({"symbol": "AAPL"})).await;
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(
        run["input"],
        json!({"symbol": "AAPL", "n": 2}),
        "defaults filled"
    );
    assert_eq!(
        run["nodes"]["use"]["output"],
        json!({
            "count": 3,
            "whole": {"count": 3, "name": "Apple", "tags": ["x", "y"]},
            "text": "AAPL x3",
            "n": 2,
            "first": "x"
        })
    );
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let last_user = |r: &Value| {
        r["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .expect("a user message")["content"]
            .clone()
    };
    assert_eq!(
        last_user(&requests[0]),
        r#"Summarise Apple (AAPL): ["x","y"]"#
    );
    assert_eq!(last_user(&requests[1]), "Shorter than: Apple is fine.");
    // The second turn continued the first one's session: it saw its history.
    let history: Vec<&Value> = requests[1]["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] != "system")
        .collect();
    assert_eq!(history.len(), 3, "{history:?}");
    assert_eq!(history[1]["content"], "Apple is fine.");
    assert_eq!(run["nodes"]["ask"]["output"], "Apple is fine.");
    assert_eq!(run["nodes"]["follow"]["output"], "Fine.");
    assert_eq!(
        run["nodes"]["follow"]["session_id"],
        run["nodes"]["ask"]["session_id"]
    );
    assert_eq!(model.overruns(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_node_never_runs_more_elements_at_once_than_max_parallel() {
    let workflow = r#"
        name = "fanout"
        [[nodes]]
        id = "list"
        tool = "emit"
        params = { value = ["a", "b", "c", "d", "e"] }
        [[nodes]]
        id = "each"
        map = "nodes.list.output"
        max_parallel = 2
        tool = "gate"
        params = { label = "{{item}}#{{index}}" }
    "#;
    let agents = agents_with(&[], &[("fanout.toml", workflow)]);
    let (gdef, ghandler, mut gate) = gate_tool("gate", "custom");
    let (edef, ehandler) = emit_tool();
    let app = spawn_app(app_with(
        agents.path(),
        vec![(gdef, ghandler), (edef, ehandler)],
    ));

    let id = start(&app, "fanout", json!({})).await;
    let mut first = vec![gate.started().await, gate.started().await];
    first.sort();
    assert_eq!(first, ["a#0", "b#1"]);
    // Each release lets exactly the next element in.
    for next in ["c#2", "d#3", "e#4"] {
        gate.open(1);
        assert_eq!(gate.started().await, next);
    }
    gate.open(2);
    let run = finished(&app, &id).await;
    assert_eq!(run.status.as_str(), "succeeded", "{run:?}");
    assert_eq!(gate.peak.load(Ordering::SeqCst), 2, "max_parallel = 2 held");
    assert!(gate.none_started());
    let labels: Vec<Value> = ["a#0", "b#1", "c#2", "d#3", "e#4"]
        .iter()
        .map(|l| json!({ "label": l }))
        .collect();
    assert_eq!(run.nodes["each"].output, Some(Value::Array(labels)));
    assert_eq!(run.nodes["each"].attempts, 5);
    let calls = calls_of(&app, &id).await;
    let mut nodes: Vec<&str> = calls
        .iter()
        .filter(|c| c["tool_name"] == "gate")
        .map(|c| c["caller_id"].as_str().expect("caller id"))
        .collect();
    nodes.sort();
    assert_eq!(nodes.len(), 5);
    assert_eq!(nodes[0], "workflow:fanout/each[0]");
}

// ---------------------------------------------------------------------------
// when, errors, refusals
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_false_when_skips_the_node_and_what_depends_on_it() {
    let workflow = r#"
        name = "conditional"
        [[nodes]]
        id = "scan"
        tool = "emit"
        params = { value = { count = 0 } }
        [[nodes]]
        id = "fix"
        tool = "emit"
        params = { value = "fixing" }
        when = "nodes.scan.output.count > 0"
        [[nodes]]
        id = "report"
        tool = "emit"
        params = { value = "{{nodes.fix.output}}" }
        [[nodes]]
        id = "all_clear"
        tool = "emit"
        params = { value = "clear" }
        when = "nodes.scan.output.count == 0 && !nodes.scan.output.missing"
    "#;
    let agents = agents_with(&[], &[("c.toml", workflow)]);
    let app = spawn_app(app_with(agents.path(), vec![emit_tool()]));

    let run = run_to_end(&app, "conditional", json!({})).await;
    assert_eq!(run["status"], "succeeded", "{run}");
    let nodes = &run["nodes"];
    assert_eq!(nodes["fix"]["status"], "skipped");
    assert_eq!(
        nodes["fix"]["reason"],
        "when `nodes.scan.output.count > 0` is false"
    );
    assert_eq!(nodes["report"]["status"], "skipped");
    assert_eq!(nodes["report"]["reason"], "dependency 'fix' was skipped");
    assert_eq!(nodes["all_clear"]["status"], "succeeded");
    assert_eq!(nodes["all_clear"]["output"], "clear");
    let id = run["id"].as_str().expect("id");
    assert_eq!(
        calls_of(&app, id).await.len(),
        2,
        "skipped nodes call nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cycles_unknown_references_tools_and_agents_are_refused_at_load() {
    let files = [
        (
            "cycle.toml",
            "name = 'cycle'\n[[nodes]]\nid = 'a'\ntool = 'emit'\ndepends_on = ['b']\n[[nodes]]\nid = 'b'\ntool = 'emit'\nparams = { value = '{{nodes.a.output}}' }\n",
        ),
        (
            "ghost.toml",
            "name = 'ghost'\n[[nodes]]\nid = 'a'\ntool = 'emit'\ndepends_on = ['nowhere']\n",
        ),
        (
            "template.toml",
            "name = 'template'\n[[nodes]]\nid = 'a'\ntool = 'emit'\nparams = { value = '{{nodes.zz.output.x}}' }\n",
        ),
        (
            "tool.toml",
            "name = 'tool'\n[[nodes]]\nid = 'a'\ntool = 'no_such_tool'\n",
        ),
        (
            "agent.toml",
            "name = 'agent'\n[[nodes]]\nid = 'a'\nagent = 'nobody'\nprompt = 'hi'\n",
        ),
        (
            "good.toml",
            "name = 'good'\n[[nodes]]\nid = 'a'\ntool = 'emit'\n",
        ),
    ];
    let agents = agents_with(&[], &files);
    let app = spawn_app(app_with(agents.path(), vec![emit_tool()]));

    let (status, body) = app.get("/v1/workflows").await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> = body["workflows"]
        .as_array()
        .expect("workflows")
        .iter()
        .map(|w| w["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["good"]);
    let errors = body["errors"].as_array().expect("errors");
    let message = |file: &str| -> String {
        errors
            .iter()
            .find(|e| e["file"].as_str().is_some_and(|f| f.ends_with(file)))
            .unwrap_or_else(|| panic!("an error for {file}: {body}"))["message"]
            .as_str()
            .expect("message")
            .to_string()
    };
    let expected = [
        ("cycle.toml", "cycle: a -> b -> a"),
        ("ghost.toml", "node 'a': depends_on names node 'nowhere'"),
        ("template.toml", "node 'a': params names node 'zz'"),
        ("tool.toml", "node 'a': unknown tool 'no_such_tool'"),
        ("agent.toml", "node 'a': unknown agent 'nobody'"),
    ];
    for (file, text) in expected {
        let m = message(file);
        assert!(m.contains(text), "{file}: {m}");
        assert!(m.contains(file), "the message names the file: {m}");
    }
    assert_eq!(errors.len(), 5, "{body}");
    let (status, body) = app
        .post("/v1/workflows/cycle/runs", &json!({"input": {}}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "WORKFLOW_NOT_FOUND");
}

const FAILING: &str = r#"
name = "failing"
on_error = "ON_ERROR"
[[nodes]]
id = "bad"
tool = "fail"
[[nodes]]
id = "slow"
tool = "gate"
params = { label = "slow" }
[[nodes]]
id = "after_slow"
tool = "emit"
params = { value = "after slow" }
depends_on = ["slow"]
[[nodes]]
id = "after_bad"
tool = "emit"
params = { value = "after bad" }
depends_on = ["bad"]
"#;

/// Runs FAILING with `on_error`: `bad` fails while `slow` is running; then
/// the gate opens. Returns the finished run.
async fn run_failing(on_error: &str) -> WorkflowRun {
    let text = FAILING.replace("ON_ERROR", on_error);
    let agents = agents_with(&[], &[("f.toml", &text)]);
    let (gdef, ghandler, mut gate) = gate_tool("gate", "custom");
    let mut tools = failing_tools();
    tools.push((gdef, ghandler));
    tools.push(emit_tool());
    let app = spawn_app(app_with(agents.path(), tools));
    let mut events = workflows(&app).subscribe();

    let id = start(&app, "failing", json!({})).await;
    assert_eq!(gate.started().await, "slow");
    let bad_failed = async {
        loop {
            let event = events.recv().await.expect("events flow");
            if event.run_id == id
                && matches!(&event.kind, WorkflowEventKind::NodeFailed { node, .. } if node == "bad")
            {
                return;
            }
        }
    };
    tokio::time::timeout(PATIENCE, bad_failed)
        .await
        .expect("bad failed in time");
    gate.open(1);
    finished(&app, &id).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_fast_lets_running_nodes_finish_and_starts_nothing_new() {
    let run = run_failing("fail_fast").await;
    assert_eq!(run.status.as_str(), "failed");
    assert!(
        run.error
            .as_deref()
            .is_some_and(|e| e.contains("node 'bad' failed") && e.contains("boom")),
        "{:?}",
        run.error
    );
    assert_eq!(run.nodes["bad"].status.as_str(), "failed");
    assert_eq!(run.nodes["slow"].status.as_str(), "succeeded");
    assert_eq!(run.nodes["after_slow"].status.as_str(), "pending");
    assert_eq!(run.nodes["after_bad"].status.as_str(), "pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_runs_every_branch_that_does_not_need_the_failed_node() {
    let run = run_failing("continue").await;
    assert_eq!(run.status.as_str(), "failed");
    assert_eq!(run.nodes["after_slow"].status.as_str(), "succeeded");
    assert_eq!(run.nodes["after_slow"].output, Some(json!("after slow")));
    assert_eq!(run.nodes["after_bad"].status.as_str(), "skipped");
    assert_eq!(
        run.nodes["after_bad"].reason.as_deref(),
        Some("dependency 'bad' failed")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_and_timeouts_apply_per_node() {
    let workflow = r#"
        name = "patience"
        on_error = "continue"
        [[nodes]]
        id = "flaky"
        tool = "flaky"
        retries = 1
        [[nodes]]
        id = "stuck"
        tool = "gate"
        params = { label = "never opened" }
        timeout_s = 0.2
    "#;
    let agents = agents_with(&[], &[("p.toml", workflow)]);
    let (gdef, ghandler, _gate) = gate_tool("gate", "custom");
    let mut tools = failing_tools();
    tools.push((gdef, ghandler));
    let app = spawn_app(
        app_with(agents.path(), tools).config_toml("[executor]\nretry_base_delay_ms = 1\n"),
    );

    let run = run_to_end(&app, "patience", json!({})).await;
    let nodes = &run["nodes"];
    assert_eq!(nodes["flaky"]["status"], "succeeded", "{run}");
    assert_eq!(nodes["flaky"]["attempts"], 2);
    assert_eq!(nodes["stuck"]["status"], "failed");
    let error = nodes["stuck"]["error"].as_str().expect("error");
    assert!(error.starts_with("TOOL_TIMEOUT:"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_422_naming_the_field_and_unknown_names_are_404() {
    let app = spawn_app(AppOptions::offline());
    let (status, body) = app
        .post("/v1/workflows/market-brief/runs", &json!({"input": {}}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "VALIDATION_ERROR");
    let fields = &body["error"]["details"]["validation_errors"];
    assert_eq!(fields[0]["field"], "symbol", "{body}");
    assert_eq!(fields[0]["code"], "required");

    let (status, body) = app
        .post(
            "/v1/workflows/market-brief/runs",
            &json!({"input": {"symbol": 42, "extra": true}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let codes: Vec<&str> = body["error"]["details"]["validation_errors"]
        .as_array()
        .expect("errors")
        .iter()
        .map(|e| e["code"].as_str().expect("code"))
        .collect();
    assert!(
        codes.contains(&"type") && codes.contains(&"additionalProperties"),
        "{body}"
    );

    let (status, body) = app
        .post("/v1/workflows/nope/runs", &json!({"input": {}}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = app.get("/v1/workflows/runs/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "RUN_NOT_FOUND");
    let (status, _) = app
        .post("/v1/workflows/market-brief/runs", &json!({"inputs": {}}))
        .await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "unknown body field"
    );
}

// ---------------------------------------------------------------------------
// The concurrency bypass
// ---------------------------------------------------------------------------

/// With the only slot of the pool held by a conversation's tool call, the
/// shipped market-brief workflow still runs to the end, and `/v1/limits`
/// never counts its calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_pool_held_by_a_conversation_a_workflow_still_runs_and_is_not_counted() {
    let worker = agent_toml("worker", &["gate"], 3);
    let agents = repo_agents_plus(&[("worker.toml", &worker)]);
    let model = MockModel::start().await;
    model.push(Reply::tool_call("g1", "gate", r#"{"label":"held"}"#));
    let (gdef, ghandler, mut gate) = gate_tool("gate", "custom");
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .tool(gdef, ghandler)
            .config_toml("[concurrency]\nmax_concurrent = 1\n"),
    );
    let session = app.session("worker").await;
    let turn = {
        let (client, session) = (app.client.clone(), session.clone());
        tokio::spawn(async move { client.say(&session, "hold the slot").await.0 })
    };
    assert_eq!(gate.started().await, "held");
    let (_, limits) = app.get("/v1/limits").await;
    assert_eq!(limits["concurrency"]["current_concurrent"], 1, "{limits}");

    model.push(Reply::text("AAPL brief from the mock analyst."));
    let run = run_to_end(&app, "market-brief", json!({"symbol": "AAPL"})).await;
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(
        run["nodes"]["brief"]["output"],
        "AAPL brief from the mock analyst."
    );

    let (_, limits) = app.get("/v1/limits").await;
    let pool = &limits["concurrency"];
    assert_eq!(pool["current_concurrent"], 1, "{pool}");
    assert_eq!(
        pool["total_acquired"], 1,
        "only the conversation's call: {pool}"
    );
    assert_eq!(pool["total_bypassed"], 3, "{pool}");
    assert_eq!(pool["queue_length"], 0, "{pool}");

    model.push(Reply::text("done"));
    gate.open(1);
    let status = tokio::time::timeout(PATIENCE, turn)
        .await
        .expect("the turn finished")
        .expect("no panic");
    assert_eq!(status, StatusCode::OK);
}

// ---------------------------------------------------------------------------
// Restart and resume
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cut_off_by_a_restart_past_the_resume_window_is_interrupted_and_resume_finishes_it() {
    let workflow = r#"
        name = "long"
        [[nodes]]
        id = "first"
        tool = "count"
        [[nodes]]
        id = "hold"
        tool = "gate"
        params = { label = "after call {{nodes.first.output.calls}}" }
        [[nodes]]
        id = "last"
        tool = "emit"
        params = { value = "{{nodes.hold.output.label}}" }
    "#;
    let agents = agents_with(&[], &[("long.toml", workflow)]);
    let data = tempfile::tempdir().expect("data dir");
    // A zero window: the restart resumes nothing (tests/workflow_resume.rs
    // covers the automatic resume).
    let options = |gate: (ToolDefinition, Arc<dyn ToolHandler>), count| {
        app_with(agents.path(), vec![gate, count, emit_tool()])
            .data_dir(data.path())
            .config_toml("[sessions]\nresume_window_s = 0\n")
    };

    let (gdef, ghandler, mut gate) = gate_tool("gate", "custom");
    let (cdef, chandler, counted) = count_tool();
    let mut app = spawn_app(options((gdef, ghandler), (cdef, chandler)));
    let id = start(&app, "long", json!({})).await;
    assert_eq!(gate.started().await, "after call 1");
    app.stop();

    let (gdef, ghandler, mut gate) = gate_tool("gate", "custom");
    let (cdef, chandler, counted_again) = count_tool();
    let app = spawn_app(options((gdef, ghandler), (cdef, chandler)));
    let run = get_run(&app, &id).await;
    assert_eq!(run["status"], "interrupted", "{run}");
    assert_eq!(run["nodes"]["first"]["status"], "succeeded");
    assert_eq!(run["nodes"]["hold"]["status"], "failed");
    assert!(
        run["nodes"]["hold"]["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("interrupted")),
        "{run}"
    );
    assert_eq!(run["nodes"]["last"]["status"], "pending");

    let (status, body) = app
        .post(&format!("/v1/workflows/runs/{id}/resume"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "running");
    assert_eq!(
        gate.started().await,
        "after call 1",
        "first is not run again"
    );
    gate.open(1);
    let run = finished(&app, &id).await;
    assert_eq!(run.status.as_str(), "succeeded", "{run:?}");
    assert_eq!(run.resumes, 1);
    assert_eq!(run.nodes["last"].output, Some(json!("after call 1")));
    assert_eq!(counted.load(Ordering::SeqCst), 1);
    assert_eq!(counted_again.load(Ordering::SeqCst), 0);

    let (status, body) = app
        .post(&format!("/v1/workflows/runs/{id}/resume"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "a succeeded run: {body}");
    let tools: Vec<String> = calls_of(&app, &id)
        .await
        .iter()
        .map(|c| c["tool_name"].as_str().expect("tool").to_string())
        .collect();
    // The call cut off by the restart left no record; the rest did.
    assert_eq!(tools, ["emit", "gate", "count"], "newest first");
}

/// `keyed {}`: records the idempotency key of every call (across apps:
/// the record is shared); its first call fails or never answers, as built,
/// later ones answer `{calls}`.
struct Keyed {
    keys: Arc<std::sync::Mutex<Vec<Option<String>>>>,
    first_fails: bool,
    started: tokio::sync::mpsc::UnboundedSender<()>,
}

#[async_trait::async_trait]
impl ToolHandler for Keyed {
    async fn call(
        &self,
        _params: Value,
        ctx: &cadre::tools::ExecutionContext,
    ) -> Result<Value, ToolError> {
        let calls = {
            let mut keys = self.keys.lock().expect("keys");
            keys.push(ctx.idempotency_key.clone());
            keys.len()
        };
        let _ = self.started.send(());
        match calls {
            1 if self.first_fails => Err(ToolError::failed("first call fails")),
            1 => std::future::pending().await,
            _ => Ok(json!({ "calls": calls })),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_a_restart_cut_runs_again_by_itself_with_its_idempotency_key() {
    let workflow = "name = \"keyed\"\n[[nodes]]\nid = \"hold\"\ntool = \"keyed\"\n";
    let agents = agents_with(&[], &[("keyed.toml", workflow)]);
    let data = tempfile::tempdir().expect("data dir");
    let keys = Arc::default();
    let (tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let options = |first_fails| {
        let keyed = Keyed {
            keys: Arc::clone(&keys),
            first_fails,
            started: tx.clone(),
        };
        let def = ToolDefinition::new(
            "keyed",
            "Records its idempotency keys.",
            json!({"type": "object", "properties": {}}),
        )
        .with_cache_ttl(0);
        app_with(
            agents.path(),
            vec![(def, Arc::new(keyed) as Arc<dyn ToolHandler>)],
        )
        .data_dir(data.path())
    };

    // Cut by a restart (a shutdown): resumed at start (the default window),
    // its call made again with the key it had.
    let mut app = spawn_app(options(false));
    let id = start(&app, "keyed", json!({})).await;
    started.recv().await.expect("the call started");
    app.stop();
    let app = spawn_app(options(false));
    let run = finished(&app, &id).await;
    assert_eq!(run.status.as_str(), "succeeded", "{run:?}");
    assert_eq!((run.resumes, run.automatic_resumes), (1, 1));
    let key = format!("workflow:{id}:hold:0");
    assert_eq!(
        *keys.lock().expect("keys"),
        [Some(key.clone()), Some(key)],
        "the same key after the restart"
    );

    // Failed, then resumed by hand: a new key.
    keys.lock().expect("keys").clear();
    drop(app);
    let app = spawn_app(options(true));
    let id = start(&app, "keyed", json!({})).await;
    assert_eq!(finished(&app, &id).await.status.as_str(), "failed");
    let (status, body) = app
        .post(&format!("/v1/workflows/runs/{id}/resume"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let run = finished(&app, &id).await;
    assert_eq!(run.status.as_str(), "succeeded", "{run:?}");
    assert_eq!((run.resumes, run.automatic_resumes), (1, 0));
    assert_eq!(
        *keys.lock().expect("keys"),
        [
            Some(format!("workflow:{id}:hold:0")),
            Some(format!("workflow:{id}:hold:1"))
        ],
        "a new key after a failure"
    );
}

// ---------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_events_stream_over_sse_until_the_run_is_over() {
    let agents = agents_with(&[], &[("diamond.toml", DIAMOND)]);
    let (gdef, ghandler, mut gate) = gate_tool("gate", "custom");
    let app = spawn_app(app_with(agents.path(), vec![(gdef, ghandler), emit_tool()]));
    let id = start(&app, "diamond", json!({})).await;
    gate.started().await;
    gate.started().await;
    let response = app
        .client
        .request(Method::GET, &format!("/v1/workflows/runs/{id}/events"))
        .send()
        .await
        .expect("events request");
    assert_eq!(response.status(), StatusCode::OK);
    let reading = tokio::spawn(response.text());
    gate.open(2);
    let text = tokio::time::timeout(PATIENCE, reading)
        .await
        .expect("the stream ended after the run")
        .expect("no panic")
        .expect("body read");
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(names.first(), Some(&"snapshot"), "{text}");
    assert_eq!(names.last(), Some(&"run_finished"), "{text}");
    assert_eq!(
        names.iter().filter(|n| **n == "node_succeeded").count(),
        3,
        "{text}"
    );
    assert!(names.contains(&"node_started"), "join started: {text}");

    // A finished run: its snapshot, then the stream ends.
    let response = app
        .client
        .request(Method::GET, &format!("/v1/workflows/runs/{id}/events"))
        .send()
        .await
        .expect("events request");
    let text = tokio::time::timeout(PATIENCE, response.text())
        .await
        .expect("ended at once")
        .expect("body read");
    assert!(text.starts_with("event: snapshot"), "{text}");
    assert!(text.contains("\"status\":\"succeeded\""), "{text}");
}

// ---------------------------------------------------------------------------
// Hot reload
// ---------------------------------------------------------------------------

/// Polls `GET /v1/workflows` until `check` holds; there is no reload
/// signal to wait for.
async fn definitions_when(app: &TestApp, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (_, body) = app.get("/v1/workflows").await;
        if check(&body) {
            return body;
        }
        assert!(Instant::now() < deadline, "never saw {what}; last: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflow_files_are_hot_reloaded_and_one_waiting_for_a_tool_loads_when_it_comes() {
    let agents = agents_with(&[], &[]);
    std::fs::create_dir(agents.path().join("tools")).expect("tools dir");
    let app = spawn_app(
        app_with(agents.path(), vec![emit_tool()])
            .config_toml("[tools]\nreload_interval_s = 0.2\n"),
    );
    let (_, body) = app.get("/v1/workflows").await;
    assert_eq!(body["workflows"], json!([]));

    std::fs::write(
        agents.path().join("workflows/late.toml"),
        "name = 'late'\n[[nodes]]\nid = 'a'\ntool = 'emit'\nparams = { value = 7 }\n",
    )
    .expect("write workflow");
    definitions_when(&app, "the new workflow", |b| {
        b["workflows"][0]["name"] == "late"
    })
    .await;
    let run = run_to_end(&app, "late", json!({})).await;
    assert_eq!(run["nodes"]["a"]["output"], 7);

    // A workflow naming a tool that is not there yet is refused...
    std::fs::write(
        agents.path().join("workflows/shouty.toml"),
        "name = 'shouty'\n[[nodes]]\nid = 'a'\ntool = 'shout'\nparams = { message = 'hi' }\n",
    )
    .expect("write workflow");
    definitions_when(&app, "the refusal", |b| {
        b["errors"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("unknown tool 'shout'"))
    })
    .await;
    // ...until the tool's file arrives, with no change to the workflow file.
    std::fs::write(
        agents.path().join("tools/shout.yaml"),
        "name: shout\ndescription: Echo under another name\nentry: {type: builtin, handler: echo}\nparameters:\n  - name: message\n    type: string\n    required: true\n",
    )
    .expect("write tool");
    let body = definitions_when(&app, "shouty loaded", |b| {
        b["workflows"].as_array().is_some_and(|w| w.len() == 2)
    })
    .await;
    assert_eq!(body["errors"], json!([]), "{body}");
    let run = run_to_end(&app, "shouty", json!({})).await;
    assert_eq!(run["status"], "succeeded", "{run}");
}

// ---------------------------------------------------------------------------
// The shipped workflows
// ---------------------------------------------------------------------------

/// The issue's "done when", offline: market-brief returns per-node outputs
/// and the brief, and its calls are listed by workflow id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn market_brief_returns_each_node_output_and_the_brief_and_lists_its_calls() {
    let app = spawn_app(AppOptions::offline());
    let run = run_to_end(&app, "market-brief", json!({"symbol": "AAPL"})).await;
    assert_eq!(run["status"], "succeeded", "{run}");
    for (node, source) in [
        ("price", "tool:price:v1"),
        ("indicators", "tool:indicators:v1"),
        ("news", "tool:news:v1"),
    ] {
        let n = &run["nodes"][node];
        assert_eq!(n["status"], "succeeded", "{node}: {run}");
        assert_eq!(n["output"]["source_id"], source, "{node}: {run}");
    }
    assert_eq!(run["nodes"]["price"]["output"]["data"]["symbol"], "AAPL");
    let brief = run["nodes"]["brief"]["output"].as_str().expect("a brief");
    assert!(brief.contains("AAPL"), "{brief}");
    for source in ["tool:price:v1", "tool:indicators:v1", "tool:news:v1"] {
        assert!(brief.contains(source), "the brief cites {source}: {brief}");
    }
    assert_eq!(run["output"]["brief"], brief);
    assert_eq!(run["output"]["symbol"], "AAPL");

    let id = run["id"].as_str().expect("id");
    let calls = calls_of(&app, id).await;
    let mut tools: Vec<&str> = calls
        .iter()
        .map(|c| c["tool_name"].as_str().expect("tool"))
        .collect();
    tools.sort();
    assert_eq!(tools, ["get_indicators", "get_news", "get_price"]);
    for c in &calls {
        assert_eq!(c["caller_type"], "workflow_node", "{c}");
        assert_eq!(c["workflow_id"], id, "{c}");
        assert_eq!(c["is_success"], true, "{c}");
    }
    let (status, listed) = app.get("/v1/workflows/runs?workflow=market-brief").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["runs"][0]["id"], id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn account_review_fans_out_over_the_positions_and_reviews_them() {
    let app = spawn_app(AppOptions::offline());
    let (status, body) = app.get("/v1/workflows").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["errors"], json!([]), "the shipped workflows load");

    let run = run_to_end(&app, "account-review", json!({})).await;
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(run["input"]["timeframe"], "YTD", "the schema default");
    let positions = run["nodes"]["positions"]["output"]["data"]["count"]
        .as_u64()
        .expect("a count");
    let quotes = run["nodes"]["quotes"]["output"].as_array().expect("quotes");
    assert_eq!(quotes.len() as u64, positions);
    assert!(
        quotes.iter().all(|q| q["source_id"] == "tool:quotes:v1"),
        "{run}"
    );
    let review = run["output"]["review"].as_str().expect("a review");
    assert!(review.contains("tool:account_summary:v1"), "{review}");
}

// ---------------------------------------------------------------------------
// Tenants
// ---------------------------------------------------------------------------

/// A request with `Authorization: Bearer <key>`.
async fn as_tenant(
    app: &TestApp,
    key: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = app.with_key(key).request(method, path);
    if let Some(body) = body {
        request = request.json(&body);
    }
    send(request).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_belongs_to_the_tenant_that_started_it_with_its_calls_and_sessions() {
    let data = tempfile::tempdir().expect("data dir");
    let (acme, globex) = {
        let store = support::store::open_store(data.path());
        let (acme, _) = cadre::tenants::create_key(&store, "acme", false)
            .await
            .expect("key");
        let (globex, _) = cadre::tenants::create_key(&store, "globex", false)
            .await
            .expect("key");
        (acme, globex)
    };
    let app = spawn_app(AppOptions::offline().data_dir(data.path()));

    let (status, run) = as_tenant(
        &app,
        &acme,
        Method::POST,
        "/v1/workflows/market-brief/runs",
        Some(json!({"input": {"symbol": "MSFT"}, "wait": true})),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(run["tenant"], "acme");
    let id = run["id"].as_str().expect("id");
    let session = run["nodes"]["brief"]["session_id"]
        .as_str()
        .expect("session");

    let calls = format!("/v1/calls?workflow_id={id}");
    let (_, body) = as_tenant(&app, &acme, Method::GET, &calls, None).await;
    assert_eq!(body["count"], 3, "{body}");
    let (_, body) = as_tenant(&app, &globex, Method::GET, &calls, None).await;
    assert_eq!(body["count"], 0, "{body}");
    let (status, _) = as_tenant(
        &app,
        &acme,
        Method::GET,
        &format!("/v1/sessions/{session}"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "the agent node's session is acme's");

    for (method, path) in [
        (Method::GET, format!("/v1/workflows/runs/{id}")),
        (Method::GET, format!("/v1/workflows/runs/{id}/events")),
        (Method::POST, format!("/v1/workflows/runs/{id}/resume")),
        (Method::GET, format!("/v1/sessions/{session}")),
    ] {
        let (status, body) = as_tenant(&app, &globex, method, &path, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
    }
    let (_, listed) = as_tenant(&app, &globex, Method::GET, "/v1/workflows/runs", None).await;
    assert_eq!(listed["count"], 0, "{listed}");
    let (_, listed) = as_tenant(&app, &acme, Method::GET, "/v1/workflows/runs", None).await;
    assert_eq!(listed["runs"][0]["id"], id, "{listed}");
}
