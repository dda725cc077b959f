//! Workflow limits against a real server: the map element cap, map
//! elements stored as rows (not by rewriting the run), cancel, and the
//! depth guard that stops a workflow starting itself.
//!
//! In-flight elements are held by a gate tool (they report when they start
//! and finish when the test opens the gate); runs are awaited through the
//! library's `Workflows::wait`, and late tool results through the event
//! bus, never by sleeping. The linear cost of map elements is measured by
//! `benches/workflow_map.sh`, not here.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cadre::events::EventKind;
use cadre::tools::{FnHandler, ToolDefinition, ToolError, ToolHandler};
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::gate::gate_tool;
use support::workflow::{agents_with, finished, get_run, run_to_end, workflows};
use support::{AppOptions, MockModel, Reply, TestApp, agent_toml, spawn_app};

/// How long anything the test waits for may take before it fails loudly.
const PATIENCE: Duration = Duration::from_secs(20);

/// `emit {value}`: answers `value`.
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

fn app_with(
    agents: &Path,
    config: &str,
    tools: Vec<(ToolDefinition, Arc<dyn ToolHandler>)>,
) -> AppOptions {
    let mut options = AppOptions::offline().agents(agents).config_toml(config);
    for (def, handler) in tools {
        options = options.tool(def, handler);
    }
    options
}

/// A zero resume window: a run a restart cuts stays `interrupted`.
const NO_RESUME: &str = "[sessions]\nresume_window_s = 0\n";

/// Starts a run without waiting; returns its id.
async fn start(app: &TestApp, workflow: &str, input: Value) -> String {
    let (status, body) = app
        .post(
            &format!("/v1/workflows/{workflow}/runs"),
            &json!({ "input": input }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["id"].as_str().expect("run id").to_string()
}

async fn cancel(app: &TestApp, id: &str) -> (StatusCode, Value) {
    app.post(&format!("/v1/workflows/runs/{id}/cancel"), &json!({}))
        .await
}

// ---------------------------------------------------------------------------
// Map nodes
// ---------------------------------------------------------------------------

const EACH: &str = r#"
name = "each"
[input]
type = "object"
[input.properties.items]
type = "array"
[[nodes]]
id = "each"
map = "input.items"
max_parallel = 2
tool = "emit"
params = { value = "element {{item}}" }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_over_more_elements_than_the_cap_fails_naming_it_and_runs_none() {
    let agents = agents_with(&[], &[("each.toml", EACH)]);
    let app = spawn_app(app_with(
        agents.path(),
        "[workflows]\nmax_map_elements = 3\n",
        vec![emit_tool()],
    ));

    let run = run_to_end(&app, "each", json!({"items": [1, 2, 3, 4]})).await;
    assert_eq!(run["status"], "failed", "{run}");
    let error = run["nodes"]["each"]["error"].as_str().expect("node error");
    assert!(
        error.contains("4 elements")
            && error.contains("cap of 3")
            && error.contains("max_map_elements"),
        "{error}"
    );
    assert!(
        run["nodes"]["each"]["items"].is_null(),
        "no element started: {run}"
    );
    let (_, calls) = app
        .get(&format!(
            "/v1/calls?workflow_id={}",
            run["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(calls["calls"], json!([]), "no call was made");

    let run = run_to_end(&app, "each", json!({"items": [1, 2, 3]})).await;
    assert_eq!(run["status"], "succeeded", "at the cap: {run}");
    assert_eq!(
        run["nodes"]["each"]["output"],
        json!(["element 1", "element 2", "element 3"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_elements_are_rows_of_their_own_and_the_run_document_holds_none() {
    let agents = agents_with(&[], &[("each.toml", EACH)]);
    let data = tempfile::tempdir().expect("data dir");
    let items: Vec<u32> = (0..20).collect();
    let mut app = spawn_app(app_with(agents.path(), "", vec![emit_tool()]).data_dir(data.path()));
    let run = run_to_end(&app, "each", json!({ "items": items })).await;
    assert_eq!(run["status"], "succeeded", "{run}");
    let id = run["id"].as_str().expect("run id").to_string();
    let served = get_run(&app, &id).await;
    assert_eq!(
        served["nodes"]["each"]["items"].as_array().map(Vec::len),
        Some(20)
    );
    app.stop();

    let store = support::store::open_store(data.path());
    let doc = store
        .get_doc("workflow_runs", &id)
        .await
        .expect("readable")
        .expect("the run is stored");
    assert!(
        doc["nodes"]["each"].get("items").is_none(),
        "the run document holds no elements: {doc}"
    );
    let rows = store
        .list_docs("workflow_items", &format!("{id}/"))
        .await
        .expect("readable");
    assert_eq!(rows.len(), 20, "one row per element");
    assert_eq!(rows[7].1["output"], json!("element 7"));
    drop(store);

    // Read back from the store (not the live state): the same run.
    let app = spawn_app(app_with(agents.path(), "", vec![emit_tool()]).data_dir(data.path()));
    assert_eq!(get_run(&app, &id).await, served);
}

// ---------------------------------------------------------------------------
// Cancel
// ---------------------------------------------------------------------------

const HELD: &str = r#"
name = "held"
[input]
type = "object"
[input.properties.items]
type = "array"
[[nodes]]
id = "each"
map = "input.items"
max_parallel = 2
tool = "gate"
params = { label = "{{item}}" }
[[nodes]]
id = "after"
tool = "emit"
depends_on = ["each"]
params = { value = "{{nodes.each.output}}" }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_running_run_ends_it_cancelled_and_discards_what_comes_back_late() {
    let agents = agents_with(&[], &[("held.toml", HELD)]);
    let (gdef, ghandler, mut gate) = gate_tool("gate", "custom");
    let app = spawn_app(app_with(
        agents.path(),
        "",
        vec![(gdef, ghandler), emit_tool()],
    ));
    let mut run_events = workflows(&app).subscribe();
    let mut bus = app.runtime.as_ref().unwrap().events().subscribe();

    let id = start(&app, "held", json!({"items": ["a", "b", "c"]})).await;
    gate.started().await;
    gate.started().await;

    let (status, run) = cancel(&app, &id).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(run["status"], "cancelled", "{run}");
    assert_eq!(run["nodes"]["each"]["status"], "cancelled");
    let items = &run["nodes"]["each"]["items"];
    assert_eq!(
        [
            &items[0]["status"],
            &items[1]["status"],
            &items[2]["status"]
        ],
        ["cancelled", "cancelled", "pending"],
        "{run}"
    );
    assert_eq!(run["nodes"]["after"]["status"], "pending");

    // The events say so.
    let finished_event = tokio::time::timeout(PATIENCE, async {
        loop {
            let event = run_events.recv().await.expect("run events");
            if event.run_id == id && event.kind.name() == "run_finished" {
                return serde_json::to_value(&event).expect("event json");
            }
        }
    })
    .await
    .expect("run_finished in time");
    assert_eq!(finished_event["status"], "cancelled", "{finished_event}");

    // The two calls in flight finish inside the executor; their results
    // change nothing, and the third element never starts.
    gate.open(3);
    let mut gate_calls_done = 0;
    tokio::time::timeout(PATIENCE, async {
        while gate_calls_done < 2 {
            let event = bus.recv().await.expect("bus events");
            if matches!(&event.kind, EventKind::ExecutionCompleted { tool, .. } if tool == "gate") {
                gate_calls_done += 1;
            }
        }
    })
    .await
    .expect("the held calls finished");
    let after = get_run(&app, &id).await;
    assert_eq!(after, run, "nothing moved after the cancel");
    assert!(gate.none_started(), "no element started after the cancel");

    // Idempotent, and final.
    let (status, again) = cancel(&app, &id).await;
    assert_eq!((status, &again), (StatusCode::OK, &run));
    let (status, body) = app
        .post(&format!("/v1/workflows/runs/{id}/resume"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "RUN_NOT_RESUMABLE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_ends_an_interrupted_run_and_leaves_a_finished_one_as_it_was() {
    let agents = agents_with(&[], &[("held.toml", HELD)]);
    let data = tempfile::tempdir().expect("data dir");
    let (gdef, ghandler, mut gate) = gate_tool("gate", "custom");
    let mut app = spawn_app(
        app_with(
            agents.path(),
            NO_RESUME,
            vec![(gdef, ghandler), emit_tool()],
        )
        .data_dir(data.path()),
    );
    let id = start(&app, "held", json!({"items": ["a"]})).await;
    gate.started().await;
    app.stop();

    let (gdef, ghandler, gate) = gate_tool("gate", "custom");
    let app = spawn_app(
        app_with(
            agents.path(),
            NO_RESUME,
            vec![(gdef, ghandler), emit_tool()],
        )
        .data_dir(data.path()),
    );
    assert_eq!(get_run(&app, &id).await["status"], "interrupted");
    let (status, run) = cancel(&app, &id).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(run["status"], "cancelled", "{run}");
    assert_eq!(get_run(&app, &id).await, run, "stored as cancelled");
    let (status, _) = app
        .post(&format!("/v1/workflows/runs/{id}/resume"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);

    gate.open(1);
    let done = start(&app, "held", json!({"items": ["b"]})).await;
    assert_eq!(finished(&app, &done).await.status.as_str(), "succeeded");
    let (status, run) = cancel(&app, &done).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(run["status"], "succeeded", "a finished run stays as it was");

    let (status, body) = cancel(&app, "no-such-run").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "RUN_NOT_FOUND");
}

// ---------------------------------------------------------------------------
// Runs that start runs
// ---------------------------------------------------------------------------

/// Loopback is allowed to `http_request` so a run can call its own server.
const LOOPBACK: &str = "[tools]\nhttp_allowlist = [\"127.0.0.1\"]\n[workflows]\nmax_depth = 2\n";

const AGAIN: &str = r#"
name = "again"
[input]
type = "object"
[input.properties.base]
type = "string"
[[nodes]]
id = "spawn"
tool = "http_request"
params = { method = "POST", url = "{{input.base}}/v1/workflows/again/runs", body = { input = { base = "{{input.base}}" }, wait = true }, timeout = 60 }
"#;

/// The runs of `workflow`, oldest first.
async fn runs_of(app: &TestApp, workflow: &str) -> Vec<Value> {
    let (status, body) = app
        .get(&format!("/v1/workflows/runs?workflow={workflow}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut runs = body["runs"].as_array().expect("runs").clone();
    runs.reverse();
    runs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_that_starts_itself_stops_at_max_depth_not_at_the_rate_limit() {
    let agents = agents_with(&[], &[("again.toml", AGAIN)]);
    let app = spawn_app(app_with(agents.path(), LOOPBACK, vec![]));

    let top = run_to_end(&app, "again", json!({ "base": app.base })).await;
    assert_eq!(top["status"], "succeeded", "{top}");

    let runs = runs_of(&app, "again").await;
    let depths: Vec<&Value> = runs.iter().map(|r| &r["depth"]).collect();
    assert_eq!(depths, [0, 1, 2], "the top run and two below it");
    assert_eq!(runs[1]["parent_run"], runs[0]["id"]);
    assert_eq!(runs[2]["parent_run"], runs[1]["id"]);
    let refused = &runs[2]["nodes"]["spawn"]["output"];
    assert_eq!(refused["status_code"], 409, "{refused}");
    assert_eq!(
        refused["body"]["error"]["code"], "WORKFLOW_DEPTH_EXCEEDED",
        "{refused}"
    );
    assert!(
        refused["body"]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_depth")),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_node_that_starts_its_own_workflow_stops_at_max_depth() {
    let workflow = r#"
        name = "agent-again"
        [input]
        type = "object"
        [input.properties.base]
        type = "string"
        [[nodes]]
        id = "ask"
        agent = "starter"
        prompt = "Start agent-again at {{input.base}}"
    "#;
    let agents = agents_with(
        &[("starter.toml", &agent_toml("starter", &["http_request"], 3))],
        &[("agent-again.toml", workflow)],
    );
    let model = MockModel::start().await;
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .config_toml(LOOPBACK),
    );
    let call = json!({
        "method": "POST",
        "url": format!("{}/v1/workflows/agent-again/runs", app.base),
        "body": { "input": { "base": app.base }, "wait": true },
        "timeout": 60,
    })
    .to_string();
    // Each level's turn asks for the tool; the deepest gets the refusal.
    for n in 0..3 {
        model.push(Reply::tool_call(&format!("c{n}"), "http_request", &call));
    }
    model.set_default(Some(Reply::text("done")));

    let top = run_to_end(&app, "agent-again", json!({ "base": app.base })).await;
    assert_eq!(top["status"], "succeeded", "{top}");
    let runs = runs_of(&app, "agent-again").await;
    let depths: Vec<&Value> = runs.iter().map(|r| &r["depth"]).collect();
    assert_eq!(depths, [0, 1, 2]);
    let session = runs[2]["nodes"]["ask"]["session_id"]
        .as_str()
        .expect("the deepest agent node's session");
    let (_, calls) = app
        .get(&format!("/v1/calls?conversation_id={session}"))
        .await;
    let output = &calls["calls"][0]["output"];
    assert_eq!(output["status_code"], 409, "{calls}");
    assert_eq!(output["body"]["error"]["code"], "WORKFLOW_DEPTH_EXCEEDED");
}

/// A tool file's HTTP entry that starts a run of its own workflow sends the
/// calling run as its parent, like `http_request`: the chain stops at
/// `max_depth`, not at the rate limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_file_entry_that_starts_its_own_workflow_stops_at_max_depth() {
    let agents = agents_with(&[], &[]);
    std::fs::create_dir(agents.path().join("tools")).unwrap();
    let app = spawn_app(app_with(agents.path(), LOOPBACK, vec![]));
    let runtime = app.runtime.as_ref().expect("running");
    // The entry's URL names the server, known only now: write it, then
    // the workflow that uses it, and load both.
    std::fs::write(
        agents.path().join("tools/spawn_chain.toml"),
        format!(
            "name = \"spawn_chain\"\ndescription = \"Starts a chain run.\"\ncategory = \"http\"\n[parameters]\ntype = \"object\"\nproperties = {{ input = {{ type = \"object\" }}, wait = {{ type = \"boolean\" }} }}\n[entry]\ntype = \"external\"\nurl = \"{}/v1/workflows/chain/runs\"\n",
            app.base
        ),
    )
    .unwrap();
    let report = runtime.registry().reload_dir(&agents.path().join("tools"));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    std::fs::write(
        agents.path().join("workflows/chain.toml"),
        "name = \"chain\"\n[[nodes]]\nid = \"spawn\"\ntool = \"spawn_chain\"\nparams = { input = {}, wait = true }\n",
    )
    .unwrap();
    workflows(&app).reload();

    let top = run_to_end(&app, "chain", json!({})).await;
    let runs = runs_of(&app, "chain").await;
    let depths: Vec<&Value> = runs.iter().map(|r| &r["depth"]).collect();
    assert_eq!(depths, [0, 1, 2], "{top}");
    assert_eq!(runs[1]["parent_run"], runs[0]["id"]);
    // The deepest run's call was refused by the guard (a 409, which the
    // entry reports as a failed call).
    let deepest = &runs[2]["nodes"]["spawn"];
    assert!(deepest.to_string().contains("max_depth"), "{deepest}");
}
