//! MCP both ways, with real processes and real clients.
//!
//! - cadre as an MCP client: an outer cadre whose `agents/mcp.toml` runs the
//!   real `cadre mcp` binary as a stdio server (or points at another
//!   cadre's `/mcp`), lists its tools as `inner.<tool>`, calls them through
//!   its executor (from a conversation driven by the wire-level mock model,
//!   and directly), refreshes on `tools/list_changed`, and survives the
//!   server being killed.
//! - cadre as an MCP server: an rmcp client lists and calls cadre's tools and
//!   agents over stdio (`cadre mcp`) and over `/mcp` with API keys.

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use cadre::events::EventKind;
use reqwest::StatusCode;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::{Value, json};
use support::{AppOptions, MockModel, Reply, TestApp, agent_toml, spawn_app};

/// Upper bound for anything a test waits for.
const PATIENCE: Duration = Duration::from_secs(30);

const CADRE: &str = env!("CARGO_BIN_EXE_cadre");

/// A tool only the premium plan may call (the echo builtin under another name).
const VAULT_YAML: &str = "name: vault\ndescription: Premium echo\nrequired_plan: premium\nentry: {type: builtin, handler: echo}\nparameters:\n  - {name: message, type: string, required: true}\n";

/// An agents folder for a cadre that serves MCP: agent `helper` and the
/// premium `vault` tool.
fn served_agents() -> tempfile::TempDir {
    let dir = support::agents_dir(&[("helper.toml", &agent_toml("helper", &["echo"], 2))]);
    std::fs::create_dir(dir.path().join("tools")).unwrap();
    std::fs::write(dir.path().join("tools/vault.yaml"), VAULT_YAML).unwrap();
    dir
}

/// The entry of `name` in GET /v1/tools, if listed.
async fn listed(app: &TestApp, name: &str) -> Option<Value> {
    let (status, body) = app.get("/v1/tools").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == name)
        .cloned()
}

/// Polls GET /v1/tools until `name` is listed with `status`.
async fn until_status(app: &TestApp, name: &str, status: &str) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(t) = listed(app, name).await
            && t["status"] == status
        {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never became {status}: {:?}",
            listed(app, name).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn text_of(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn args(v: Value) -> serde_json::Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("arguments must be an object"),
    }
}

async fn call(
    client: &RunningService<RoleClient, ()>,
    name: &str,
    arguments: Value,
) -> CallToolResult {
    client
        .call_tool(CallToolRequestParams::new(name.to_string()).with_arguments(args(arguments)))
        .await
        .expect("the call is answered")
}

async fn tool_names(client: &RunningService<RoleClient, ()>) -> Vec<String> {
    client
        .list_all_tools()
        .await
        .expect("tools/list answered")
        .into_iter()
        .map(|t| t.name.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_mcp_server_is_listed_called_refreshed_and_restarted() {
    let work = tempfile::tempdir().unwrap();
    let inner_agents = served_agents();
    let pidfile = work.path().join("pids");
    let hold = work.path().join("hold");
    // The real `cadre mcp` as the server; its shell records each start's pid
    // and refuses to start while `hold` exists.
    let script = format!(
        "[ -e {hold} ] && exit 1; echo $$ >> {pids}; exec {CADRE} mcp --agents {agents} --data-dir {data}",
        hold = hold.display(),
        pids = pidfile.display(),
        agents = inner_agents.path().display(),
        data = work.path().join("inner-data").display(),
    );
    let mcp_toml = format!(
        "[servers.inner]\ncommand = \"sh\"\nargs = [\"-c\", {script:?}]\nenv = {{ CADRE_TOOLS_RELOAD_INTERVAL_S = \"0.2\", RUST_LOG = \"warn\" }}\n"
    );
    let outer_agents = support::agents_dir(&[
        ("user.toml", &agent_toml("user", &["inner.*"], 2)),
        ("mcp.toml", &mcp_toml),
    ]);
    let model = MockModel::start().await;
    let app = spawn_app(AppOptions::with_model(&model).agents(outer_agents.path()));

    // Listed under the prefix, from the server.
    let calc = until_status(&app, "inner.calculator", "available").await;
    assert_eq!(calc["source"], "mcp:inner");
    assert!(listed(&app, "inner.echo").await.is_some());
    assert!(
        listed(&app, "inner.vault").await.is_none(),
        "cadre mcp serves the free plan by default"
    );

    // A conversation calls it through the executor; the model sees
    // `inner__calculator` on the wire.
    model.push(Reply::tool_call(
        "call_1",
        "inner__calculator",
        r#"{"expression": "6*7"}"#,
    ));
    model.push(Reply::text("It is 42."));
    let session = app.session("user").await;
    let (status, body) = app.say(&session, "what is 6*7?").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answer"], "It is 42.");
    let offered: Vec<String> = model.requests()[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_string())
        .collect();
    assert!(
        offered.contains(&"inner__calculator".to_string()),
        "{offered:?}"
    );
    assert!(offered.iter().all(|n| !n.contains('.')), "{offered:?}");
    let tool_message = model.requests()[1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(tool_message["role"], "tool");
    assert!(
        tool_message["content"].as_str().unwrap().contains("42"),
        "{tool_message}"
    );
    let (_, calls) = app
        .get(&format!("/v1/calls?conversation_id={session}"))
        .await;
    let calls = calls["calls"].as_array().expect("calls").clone();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["tool_name"], "inner.calculator");
    assert_eq!(calls[0]["is_success"], true);

    // Arguments are checked against the server's inputSchema before the call.
    let (status, body) = app
        .post(
            "/v1/tools/inner.calculator/invoke",
            &json!({"params": {"expression": 5}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error_type"], "validation_error");
    assert_eq!(body["validation_errors"][0]["field"], "expression");

    // The server's tool list changes (a hot-reloaded tool file); it says so
    // and the listing follows.
    std::fs::write(
        inner_agents.path().join("tools/shout.yaml"),
        "name: shout\ndescription: Echo, louder\nentry: {type: builtin, handler: echo}\n",
    )
    .unwrap();
    until_status(&app, "inner.shout", "available").await;

    // The server dies and cannot start for a while: its tools stay listed,
    // unavailable, and a call says so.
    let mut events = app.runtime.as_ref().unwrap().events().subscribe();
    std::fs::write(&hold, "").unwrap();
    let first_pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(unsafe { libc::kill(first_pid, libc::SIGKILL) }, 0);
    until_status(&app, "inner.calculator", "unavailable").await;
    let (status, body) = app
        .post(
            "/v1/tools/inner.calculator/invoke",
            &json!({"params": {"expression": "1+1"}}),
        )
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error_type"], "tool_unavailable");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("'inner' is unavailable"),
        "{body}"
    );

    // It comes back after a restart.
    std::fs::remove_file(&hold).unwrap();
    until_status(&app, "inner.calculator", "available").await;
    let (status, body) = app
        .post(
            "/v1/tools/inner.calculator/invoke",
            &json!({"params": {"expression": "1+1"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["output"]["result"], 2.0);
    let pids = std::fs::read_to_string(&pidfile).unwrap();
    assert_eq!(pids.lines().count(), 2, "one restart: {pids}");
    // Both transitions were announced on the event bus.
    let mut seen = Vec::new();
    while seen.last().map(String::as_str) != Some("up inner") {
        let e = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .unwrap_or_else(|_| panic!("no mcp_server_up event: {seen:?}"))
            .expect("the event bus is open");
        match e.kind {
            EventKind::McpServerDown { server, .. } => seen.push(format!("down {server}")),
            EventKind::McpServerUp { server, .. } => seen.push(format!("up {server}")),
            _ => {}
        }
    }
    assert_eq!(
        seen.first().map(String::as_str),
        Some("down inner"),
        "{seen:?}"
    );
    assert_eq!(
        seen.last().map(String::as_str),
        Some("up inner"),
        "{seen:?}"
    );
    assert_eq!(model.overruns(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_cadres_mcp_endpoint_is_a_tool_source_over_http() {
    let inner_agents = served_agents();
    let inner = spawn_app(AppOptions::offline().agents(inner_agents.path()));
    let mcp_toml = format!(
        "[servers.peer]\nurl = \"{}/mcp\"\nheaders = {{ X-Cadre-Plan = \"premium\" }}\nrequired_plan = \"pro\"\n",
        inner.base
    );
    let outer_agents = support::agents_dir(&[("mcp.toml", &mcp_toml)]);
    let outer = spawn_app(AppOptions::offline().agents(outer_agents.path()));

    until_status(&outer, "peer.calculator", "available").await;
    // The header reached the inner server: it lists its premium tool.
    until_status(&outer, "peer.vault", "available").await;

    // The server's plan is the outer executor's to enforce.
    let (status, body) = outer
        .post(
            "/v1/tools/peer.vault/invoke",
            &json!({"params": {"message": "hi"}}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error_type"], "plan_required");
    let (status, body) = outer
        .post(
            "/v1/tools/peer.vault/invoke",
            &json!({"params": {"message": "hi"}, "plan": "pro", "user_id": "u1"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["output"]["message"], "hi");

    // One record on each side: the outer call and the inner one it made.
    let (_, outer_calls) = outer.get("/v1/calls?tool=peer.vault").await;
    assert_eq!(outer_calls["calls"].as_array().unwrap().len(), 2);
    let (_, inner_calls) = inner.get("/v1/calls?tool=vault").await;
    let inner_calls = inner_calls["calls"].as_array().unwrap().clone();
    assert_eq!(inner_calls.len(), 1, "{inner_calls:?}");
    assert_eq!(inner_calls[0]["caller_type"], "direct");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_uses_cadre_mcp_over_stdio() {
    let agents = served_agents();
    let data = tempfile::tempdir().unwrap();
    let model = MockModel::start().await;
    let mut cmd = tokio::process::Command::new(CADRE);
    cmd.args(["mcp", "--agents"])
        .arg(agents.path())
        .arg("--data-dir")
        .arg(data.path())
        .env("CADRE_MODEL_BASE_URL", model.base_url())
        .env("CADRE_MODEL_API_KEY", "test-key")
        .env("RUST_LOG", "warn");
    let client = ().serve(TokioChildProcess::new(cmd).unwrap()).await.unwrap();

    let names = tool_names(&client).await;
    for expected in ["calculator", "echo", "agent_helper"] {
        assert!(names.contains(&expected.to_string()), "{names:?}");
    }
    assert!(
        !names.contains(&"vault".to_string()),
        "free by default: {names:?}"
    );

    let result = call(&client, "calculator", json!({"expression": "6*7"})).await;
    assert_ne!(result.is_error, Some(true), "{result:?}");
    assert_eq!(result.structured_content.as_ref().unwrap()["result"], 42.0);

    let refused = call(&client, "calculator", json!({"expression": 7})).await;
    assert_eq!(refused.is_error, Some(true));
    assert!(
        text_of(&refused).contains("validation_error"),
        "{refused:?}"
    );

    let refused = call(&client, "vault", json!({"message": "x"})).await;
    assert_eq!(refused.is_error, Some(true));
    assert!(text_of(&refused).contains("plan_required"), "{refused:?}");

    // An agent is a tool: one turn, and the session continues by id.
    model.push(Reply::text("Hello from helper."));
    let first = call(&client, "agent_helper", json!({"message": "hi"})).await;
    assert_ne!(first.is_error, Some(true), "{first:?}");
    assert_eq!(text_of(&first), "Hello from helper.");
    let session = first.structured_content.as_ref().unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    model.push(Reply::text("Still here."));
    let second = call(
        &client,
        "agent_helper",
        json!({"message": "again", "session_id": session}),
    )
    .await;
    assert_eq!(text_of(&second), "Still here.");
    let history = model.requests()[1]["messages"].to_string();
    assert!(history.contains("Hello from helper."), "{history}");

    client.cancel().await.unwrap();
    assert_eq!(model.overruns(), 0);
}

async fn http_client(
    app: &TestApp,
    key: &str,
    plan: Option<&str>,
) -> RunningService<RoleClient, ()> {
    let mut headers = HashMap::new();
    if let Some(p) = plan {
        headers.insert(
            axum::http::HeaderName::from_static("x-cadre-plan"),
            axum::http::HeaderValue::from_str(p).unwrap(),
        );
    }
    let config = StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", app.base))
        .auth_header(key.to_string())
        .custom_headers(headers);
    ().serve(StreamableHttpClientTransport::from_config(config))
        .await
        .expect("MCP session over HTTP")
}

async fn create_keys(dir: &Path, tenants: &[&str]) -> Vec<String> {
    let store = cadre::store::Store::open(dir).expect("open the data dir");
    let mut keys = Vec::new();
    for t in tenants {
        let (key, _) = cadre::tenants::create_key(&store, t, false).await.unwrap();
        keys.push(key);
    }
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_http_uses_the_callers_key_tenant_and_plan() {
    let data = tempfile::tempdir().unwrap();
    let keys = create_keys(data.path(), &["acme", "globex"]).await;
    let agents = served_agents();
    let app = spawn_app(
        AppOptions::offline()
            .agents(agents.path())
            .data_dir(data.path()),
    );

    // No key, no MCP.
    let no_key = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", app.base)),
    );
    assert!(().serve(no_key).await.is_err());

    let acme = http_client(&app, &keys[0], None).await;
    let names = tool_names(&acme).await;
    assert!(names.contains(&"calculator".to_string()), "{names:?}");
    assert!(!names.contains(&"vault".to_string()), "{names:?}");
    let result = call(&acme, "calculator", json!({"expression": "2+3"})).await;
    assert_ne!(result.is_error, Some(true), "{result:?}");
    let refused = call(&acme, "vault", json!({"message": "secret"})).await;
    assert_eq!(refused.is_error, Some(true));
    assert!(text_of(&refused).contains("plan_required"), "{refused:?}");

    let premium = http_client(&app, &keys[0], Some("premium")).await;
    assert!(tool_names(&premium).await.contains(&"vault".to_string()));
    let ok = call(&premium, "vault", json!({"message": "secret"})).await;
    assert_ne!(ok.is_error, Some(true), "{ok:?}");
    assert_eq!(ok.structured_content.as_ref().unwrap()["message"], "secret");

    // The calls are acme's: acme sees them, globex does not.
    let (status, body) = app
        .with_key(&keys[0])
        .get("/v1/calls?tool=calculator")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let calls = body["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{body}");
    assert_eq!(calls[0]["caller_type"], "direct");
    let (_, body) = app
        .with_key(&keys[1])
        .get("/v1/calls?tool=calculator")
        .await;
    assert_eq!(body["calls"].as_array().unwrap().len(), 0, "{body}");
    let (_, body) = app.with_key(&keys[0]).get("/v1/calls?tool=vault").await;
    assert_eq!(body["calls"].as_array().unwrap().len(), 2, "{body}");

    // An agent over HTTP: a session of acme's, which globex cannot continue.
    let turn = call(&acme, "agent_helper", json!({"message": "echo hello"})).await;
    assert_ne!(turn.is_error, Some(true), "{turn:?}");
    let session = turn.structured_content.as_ref().unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let globex = http_client(&app, &keys[1], None).await;
    let refused = call(
        &globex,
        "agent_helper",
        json!({"message": "hi", "session_id": session}),
    )
    .await;
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    for c in [acme, premium, globex] {
        c.cancel().await.unwrap();
    }
}
