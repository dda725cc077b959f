//! The agent's boundary (#21): a model, or a prompt injection it obeys, can
//! only call the tools its agent was offered in that turn. A reply naming
//! another agent's tool, or any tool for an agent with none, runs nothing:
//! each such call is answered `TOOL_NOT_OFFERED`, which the model sees as a
//! tool error. The same holds on every way into a turn: the session API, a
//! workflow's agent node and MCP's `agent_*` tools.
//!
//! The tool the hostile model reaches for, `secret`, is registered and
//! callable by the key's own rights (direct invoke): it counts its runs, so
//! "refused" means it never ran, not only that the reply said so.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cadre::tools::{FnHandler, ToolDefinition, ToolError, ToolHandler};
use reqwest::StatusCode;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use support::{AppOptions, MockModel, Reply, TestApp, agent_toml, spawn_app};

/// `secret {}`: counts its runs (a stand-in for another agent's account
/// summary or paper order).
fn secret_tool() -> (ToolDefinition, Arc<dyn ToolHandler>, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let handler = FnHandler(move |_params: Value| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<Value, ToolError>(json!({"balance": 1_000_000})) }
    });
    let def = ToolDefinition::new(
        "secret",
        "Another agent's tool.",
        json!({"type": "object", "properties": {}}),
    )
    .with_cache_ttl(0);
    (def, Arc::new(handler), runs)
}

/// `mini` offers only echo; `mute` offers nothing; a workflow whose agent
/// node is `mute`.
fn app(model: &MockModel) -> (TestApp, tempfile::TempDir, Arc<AtomicUsize>) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("mini.toml"),
        agent_toml("mini", &["echo"], 3),
    )
    .unwrap();
    std::fs::write(dir.path().join("mute.toml"), agent_toml("mute", &[], 3)).unwrap();
    std::fs::create_dir(dir.path().join("workflows")).unwrap();
    std::fs::write(
        dir.path().join("workflows/ask.toml"),
        "name = 'ask'\n[[nodes]]\nid = 'talk'\nagent = 'mute'\nprompt = 'hello'\n",
    )
    .unwrap();
    let (def, handler, runs) = secret_tool();
    let mut options = AppOptions::with_model(model)
        .agents(dir.path())
        .tool(def, handler);
    options.max_retries = 0;
    (spawn_app(options), dir, runs)
}

/// The tool message the model got back for `call_id` in its last request.
fn tool_result(model: &MockModel, call_id: &str) -> Value {
    let requests = model.requests();
    let messages = requests.last().expect("a request")["messages"]
        .as_array()
        .expect("messages")
        .clone();
    let msg = messages
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == call_id)
        .unwrap_or_else(|| panic!("no tool result for {call_id} in {messages:?}"));
    serde_json::from_str(msg["content"].as_str().expect("content")).expect("JSON tool result")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_naming_a_tool_the_turn_did_not_offer_runs_nothing() {
    let model = MockModel::start().await;
    let (app, _dir, runs) = app(&model);
    // Sanity: the tool exists and the key may call it directly.
    let (status, body) = app
        .post("/v1/tools/secret/invoke", &json!({"params": {}}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // An agent offered echo: the model asks for echo, secret and a name
    // nobody registered. Only echo runs.
    model.push(Reply::tool_calls(&[
        ("c1", "echo", r#"{"message":"hi"}"#),
        ("c2", "secret", "{}"),
        ("c3", "no_such_tool", "{}"),
    ]));
    model.push(Reply::text("done"));
    let session = app.session("mini").await;
    let (status, body) = app.say(&session, "hello").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "secret must not run");
    let calls = body["tool_calls"].as_array().expect("tool calls");
    assert_eq!(calls[0]["is_success"], true, "{body}");
    for call in &calls[1..] {
        assert_eq!(call["is_success"], false, "{body}");
        assert_eq!(call["error_type"], "TOOL_NOT_OFFERED", "{body}");
    }
    let seen = tool_result(&model, "c2");
    assert_eq!(seen["error_type"], "TOOL_NOT_OFFERED", "{seen}");
    assert!(
        seen["error"].as_str().unwrap().contains("echo"),
        "the model is told what it may call: {seen}"
    );
    // Unknown names are refused the same way: nothing about the registry leaks.
    assert_eq!(tool_result(&model, "c3")["error_type"], "TOOL_NOT_OFFERED");

    // The refusals are recorded like any other call.
    let (status, records) = app.get(&format!("/v1/sessions/{session}/export")).await;
    assert_eq!(status, StatusCode::OK, "{records}");
    let text = records.to_string();
    assert!(text.contains("TOOL_NOT_OFFERED"), "{records}");
    assert_eq!(model.overruns(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_with_no_tools_runs_none_on_any_way_into_a_turn() {
    let model = MockModel::start().await;
    let (app, _dir, runs) = app(&model);

    // 1. The session API.
    model.push(Reply::tool_call("s1", "echo", r#"{"message":"x"}"#));
    model.push(Reply::text("ok"));
    let session = app.session("mute").await;
    let (status, body) = app.say(&session, "hello").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["tool_calls"][0]["error_type"], "TOOL_NOT_OFFERED");
    let seen = tool_result(&model, "s1");
    assert!(
        seen["error"].as_str().unwrap().contains("no tools"),
        "{seen}"
    );

    // 2. A workflow's agent node.
    model.push(Reply::tool_call("w1", "secret", "{}"));
    model.push(Reply::text("reviewed"));
    let (status, run) = app
        .post(
            "/v1/workflows/ask/runs",
            &json!({"input": {}, "wait": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(tool_result(&model, "w1")["error_type"], "TOOL_NOT_OFFERED");

    // 3. MCP's agent_* tool.
    model.push(Reply::tool_call("m1", "secret", "{}"));
    model.push(Reply::text("answered"));
    let config = StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", app.base));
    let client =
        ().serve(StreamableHttpClientTransport::from_config(config))
            .await
            .expect("MCP session over HTTP");
    let mut args = serde_json::Map::new();
    args.insert("message".into(), json!("hello"));
    let result = client
        .call_tool(CallToolRequestParams::new("agent_mute".to_string()).with_arguments(args))
        .await
        .expect("the call is answered");
    assert_ne!(result.is_error, Some(true), "{result:?}");
    assert_eq!(tool_result(&model, "m1")["error_type"], "TOOL_NOT_OFFERED");
    client.cancel().await.unwrap();

    assert_eq!(runs.load(Ordering::SeqCst), 0, "secret never ran");
    assert_eq!(model.overruns(), 0);
}

/// A session whose metadata names a workflow run and node is a workflow
/// agent node's: its calls skip the concurrency pool and speak for that run
/// (`x-cadre-parent-run`). Only the workflow engine opens those; a client
/// asking for one is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_open_a_session_as_a_workflow_node() {
    let model = MockModel::start().await;
    let (app, _dir, _runs) = app(&model);
    for metadata in [
        json!({"workflow_id": "01a2", "node_id": "n"}),
        json!({"workflow_id": "01a2"}),
        json!({"node_id": "n", "page": "/"}),
    ] {
        let (status, body) = app
            .post(
                "/v1/sessions",
                &json!({"agent": "mini", "metadata": metadata}),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("reserved"),
            "{body}"
        );
    }
    let (status, body) = app
        .post(
            "/v1/sessions",
            &json!({"agent": "mini", "metadata": {"page": "/pricing"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// Invented tool names (a model can make a new one per call, up to 20,000
/// characters) never become a `/metrics` series or a `/v1/stats` key: they
/// count under `tool="_unregistered"`, and their records keep 64
/// characters of the name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invented_tool_names_make_no_series_and_no_stats_keys() {
    let model = MockModel::start().await;
    let (app, _dir, runs) = app(&model);
    let long = format!("invented_{}", "x".repeat(20_000));
    let names = [long.as_str(), "invented_a", "invented_b", "secret"];
    let calls: Vec<(String, &str, &str)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (format!("i{i}"), *n, "{}"))
        .collect();
    let calls: Vec<(&str, &str, &str)> = calls
        .iter()
        .map(|(id, n, a)| (id.as_str(), *n, *a))
        .collect();
    model.push(Reply::tool_calls(&calls));
    model.push(Reply::text("done"));
    let session = app.session("mini").await;
    let (status, body) = app.say(&session, "hello").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "secret must not run");

    let (status, metrics) = app.get("/metrics").await;
    assert_eq!(status, StatusCode::OK, "{metrics}");
    let metrics = metrics.as_str().expect("text");
    assert!(
        !metrics.contains("invented_"),
        "an invented name is a series"
    );
    assert!(
        metrics.contains(
            "cadre_tool_calls_total{tool=\"_unregistered\",outcome=\"TOOL_NOT_OFFERED\"} 3"
        ),
        "{metrics}"
    );
    // A registered tool the turn did not offer keeps its own label.
    assert!(
        metrics.contains("cadre_tool_calls_total{tool=\"secret\",outcome=\"TOOL_NOT_OFFERED\"} 1"),
        "{metrics}"
    );

    let (status, stats) = app.get("/v1/stats").await;
    assert_eq!(status, StatusCode::OK, "{stats}");
    let tools = stats["tools"].as_object().expect("per-tool stats");
    assert!(
        tools
            .keys()
            .all(|k| !k.starts_with("invented_") && k != "secret"),
        "refused-by-name calls are keys of the per-tool stats: {:?}",
        tools.keys().collect::<Vec<_>>()
    );

    let (status, page) = app
        .get(&format!("/v1/calls?conversation_id={session}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let recorded = page["calls"].as_array().expect("calls");
    assert_eq!(recorded.len(), names.len(), "{page}");
    for r in recorded {
        let name = r["tool_name"].as_str().expect("a name");
        assert!(
            name.chars().count() <= 64,
            "a record keeps {} characters",
            name.len()
        );
    }
}
