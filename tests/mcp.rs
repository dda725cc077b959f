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
//! - Fidelity to what real servers and clients expect, against an rmcp server
//!   of the tests' own ([`mcp_server`]): server tools are not cached unless
//!   configured; cadre's `/mcp` passes their `outputSchema` and content blocks
//!   on; `DELETE /mcp` answers 204; `cadre mcp` exits 0 when a client leaves
//!   after `server/discover` alone.

mod support;

#[path = "fixtures/mcp_server.rs"]
mod mcp_server;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderName, HeaderValue};
use cadre::events::EventKind;
use mcp_server::McpFixture;
use reqwest::StatusCode;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult, ClientJsonRpcMessage, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RoleClient, RunningService};
use rmcp::transport::common::client_side_sse::BoxedSseResponse;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
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
    // Its sandbox: the work folder writable, the inner agents and the
    // binary's folder readable, room for a tokio runtime's threads.
    let bin_dir = Path::new(CADRE).parent().unwrap();
    let mcp_toml = format!(
        "[servers.inner]\ncommand = \"sh\"\nargs = [\"-c\", {script:?}]\nenv = {{ CADRE_TOOLS_RELOAD_INTERVAL_S = \"0.2\", RUST_LOG = \"warn\" }}\n\
         paths = [{{ path = {work:?}, write = true }}, {{ path = {inner:?} }}, {{ path = {bin:?} }}]\n\
         sandbox_limits = {{ processes = 1024, memory_mb = 0 }}\n",
        work = work.path().display().to_string(),
        inner = inner_agents.path().display().to_string(),
        bin = bin_dir.display().to_string(),
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
    assert_eq!(body["error_type"], "VALIDATION_ERROR");
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
    assert_eq!(body["error_type"], "TOOL_UNAVAILABLE");
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
    assert_eq!(body["error_type"], "TOOL_PLAN_REQUIRED");
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
        text_of(&refused).contains("VALIDATION_ERROR"),
        "{refused:?}"
    );

    let refused = call(&client, "vault", json!({"message": "x"})).await;
    assert_eq!(refused.is_error, Some(true));
    assert!(
        text_of(&refused).contains("TOOL_PLAN_REQUIRED"),
        "{refused:?}"
    );

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
    let store = support::store::open_store(dir);
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

    // An unknown plan is refused at `initialize`, not on every request after.
    let mut headers = HashMap::new();
    headers.insert(
        axum::http::HeaderName::from_static("x-cadre-plan"),
        axum::http::HeaderValue::from_static("platinum"),
    );
    let config = StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", app.base))
        .auth_header(keys[0].clone())
        .custom_headers(headers);
    let refused = ().serve(StreamableHttpClientTransport::from_config(config)).await;
    let Err(why) = refused else {
        panic!("initialize accepted an unknown plan");
    };
    let why = format!("{why:?}");
    assert!(why.contains("unknown plan 'platinum'"), "{why}");

    let acme = http_client(&app, &keys[0], None).await;
    let names = tool_names(&acme).await;
    assert!(names.contains(&"calculator".to_string()), "{names:?}");
    assert!(!names.contains(&"vault".to_string()), "{names:?}");
    let result = call(&acme, "calculator", json!({"expression": "2+3"})).await;
    assert_ne!(result.is_error, Some(true), "{result:?}");
    let refused = call(&acme, "vault", json!({"message": "secret"})).await;
    assert_eq!(refused.is_error, Some(true));
    assert!(
        text_of(&refused).contains("TOOL_PLAN_REQUIRED"),
        "{refused:?}"
    );

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

/// Waits until `tool` (`server.tool`) is listed and its server connected:
/// the registry says so now, or an `mcp_server_up` event of its server says
/// so later (subscribed before looking, so none is missed).
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
            assert_eq!(runtime.registry().mcp_status(tool), Some(true), "{tool}");
            return;
        }
    }
}

/// An outer cadre (offline, open) whose mcp.toml is `mcp_toml`.
fn app_with_servers(mcp_toml: &str) -> (TestApp, tempfile::TempDir) {
    let agents = support::agents_dir(&[("mcp.toml", mcp_toml)]);
    (
        spawn_app(AppOptions::offline().agents(agents.path())),
        agents,
    )
}

/// An MCP client of `app`'s `/mcp` without a key (an open server).
async fn open_http_client(app: &TestApp) -> RunningService<RoleClient, ()> {
    let config = StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", app.base));
    ().serve(StreamableHttpClientTransport::from_config(config))
        .await
        .expect("MCP session over HTTP")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_tool_results_are_cached_only_when_the_server_config_says_so() {
    let fixture = McpFixture::start().await;
    // The same server twice: once as declared by default, once with a TTL.
    let (app, _agents) = app_with_servers(&format!(
        "[servers.plain]\nurl = \"{url}\"\n\n[servers.cached]\nurl = \"{url}\"\ncache_ttl_s = 60\n",
        url = fixture.url
    ));
    until_up(&app, "plain.count").await;
    until_up(&app, "cached.count").await;

    let invoke = |tool: &'static str| {
        let app = &app;
        async move {
            let (status, body) = app
                .post(
                    &format!("/v1/tools/{tool}/invoke"),
                    &json!({"params": {}, "user_id": "u1"}),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
            body
        }
    };
    // Same arguments, same user: each call runs on the server.
    let first = invoke("plain.count").await;
    let second = invoke("plain.count").await;
    assert_eq!(first["output"]["count"], 1, "{first}");
    assert_eq!(second["output"]["count"], 2, "{second}");
    assert_eq!(second["metadata"]["cached"], false, "{second}");
    assert_eq!(fixture.runs(), 2);

    // With cache_ttl_s the second call is answered from the cache.
    let first = invoke("cached.count").await;
    let second = invoke("cached.count").await;
    assert_eq!(first["output"]["count"], 3, "{first}");
    assert_eq!(second["output"]["count"], 3, "{second}");
    assert_eq!(second["metadata"]["cached"], true, "{second}");
    assert_eq!(fixture.runs(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cadres_mcp_offers_a_server_tool_with_its_output_schema_and_content_blocks() {
    let fixture = McpFixture::start().await;
    let (app, _agents) = app_with_servers(&format!("[servers.fix]\nurl = \"{}\"\n", fixture.url));
    until_up(&app, "fix.picture").await;
    let client = open_http_client(&app).await;

    let tools = client.list_all_tools().await.expect("tools/list answered");
    let schema_of = |name: &str| {
        tools
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{name} listed"))
            .output_schema
            .as_deref()
            .cloned()
            .map(Value::Object)
    };
    assert_eq!(schema_of("fix.area"), Some(mcp_server::area_schema()));
    assert_eq!(schema_of("fix.picture"), None);
    // cadre's own tools promise no output shape (see mcp::server).
    for t in tools.iter().filter(|t| !t.name.starts_with("fix.")) {
        assert_eq!(t.output_schema, None, "{}", t.name);
    }

    let area = call(&client, "fix.area", json!({"w": 2, "h": 3})).await;
    assert_ne!(area.is_error, Some(true), "{area:?}");
    assert_eq!(area.structured_content, Some(json!({"area": 6.0})));

    // The image stays an image block, beside the caption's text block.
    let picture = call(&client, "fix.picture", json!({})).await;
    assert_ne!(picture.is_error, Some(true), "{picture:?}");
    assert_eq!(picture.content, mcp_server::picture_blocks());

    client.cancel().await.unwrap();
}

/// reqwest as rmcp's HTTP client, reporting the status of each session's
/// `DELETE` (rmcp's own client takes any 2xx).
#[derive(Clone)]
struct DeleteWatcher {
    http: reqwest::Client,
    deletes: tokio::sync::mpsc::UnboundedSender<(String, StatusCode)>,
}

impl StreamableHttpClient for DeleteWatcher {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>> {
        self.http
            .post_message(uri, message, session_id, auth_header, custom_headers)
            .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>> {
        self.http
            .post_message_with_response_limits(
                uri,
                message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<reqwest::Error>> {
        let mut request = self
            .http
            .delete(uri.as_ref())
            .header("mcp-session-id", session_id.as_ref());
        if let Some(key) = auth_header {
            request = request.bearer_auth(key);
        }
        for (name, value) in custom_headers {
            request = request.header(name, value);
        }
        let response = request.send().await?;
        let _ = self
            .deletes
            .send((session_id.to_string(), response.status()));
        response.error_for_status()?;
        Ok(())
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxedSseResponse, StreamableHttpError<reqwest::Error>> {
        self.http
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxedSseResponse, StreamableHttpError<reqwest::Error>> {
        self.http
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_ends_its_http_session_with_delete_and_gets_204() {
    let app = spawn_app(AppOptions::offline());
    let (deletes, mut deleted) = tokio::sync::mpsc::unbounded_channel();
    let watcher = DeleteWatcher {
        http: reqwest::Client::new(),
        deletes,
    };
    let config = StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", app.base));
    let client =
        ().serve(StreamableHttpClientTransport::with_client(watcher, config))
            .await
            .expect("MCP session over HTTP");
    assert!(
        tool_names(&client)
            .await
            .contains(&"calculator".to_string())
    );

    // Closing the client ends its session with DELETE /mcp.
    client.cancel().await.unwrap();
    let (session, status) = tokio::time::timeout(PATIENCE, deleted.recv())
        .await
        .expect("the client sent DELETE")
        .expect("a status");
    assert_eq!(status, StatusCode::NO_CONTENT);

    // And the session is gone.
    let r = app
        .client
        .request(reqwest::Method::POST, "/mcp")
        .header("mcp-session-id", &session)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
        .send()
        .await
        .expect("request sent");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cadre_mcp_exits_0_when_the_client_leaves_after_server_discover() {
    let agents = served_agents();
    let data = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(CADRE)
        .args(["mcp", "--agents"])
        .arg(agents.path())
        .arg("--data-dir")
        .arg(data.path())
        .env("RUST_LOG", "warn")
        .env_remove("CADRE_MODEL_BASE_URL")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("cadre mcp starts");
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();

    // A client of the 2026-07-28 lifecycle: server/discover, no session.
    let client = ()
        .serve_with_lifecycle(
            (stdout, stdin),
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .expect("server/discover answered");
    let server = client.peer_info().expect("discovered").server_info.clone();
    assert_eq!(server.expect("server info").name, "cadre");

    // It leaves: stdin closes.
    client.cancel().await.unwrap();
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("cadre mcp exits when stdin closes")
        .unwrap();
    assert_eq!(status.code(), Some(0), "{status}");
}

/// Sends one JSON-RPC message to `/mcp` as `key`, in session `session`.
async fn mcp_post(
    app: &TestApp,
    key: &str,
    session: Option<&str>,
    message: serde_json::Value,
) -> reqwest::Response {
    let mut request = app
        .with_key(key)
        .request(reqwest::Method::POST, "/mcp")
        .header("accept", "application/json, text/event-stream")
        .json(&message);
    if let Some(id) = session {
        request = request.header("mcp-session-id", id);
    }
    request.send().await.expect("request sent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_session_belongs_to_the_key_that_opened_it() {
    let data = tempfile::tempdir().unwrap();
    let keys = create_keys(data.path(), &["acme", "globex"]).await;
    let agents = served_agents();
    let app = spawn_app(
        AppOptions::offline()
            .agents(agents.path())
            .data_dir(data.path()),
    );
    let session = open_mcp_session(&app, &keys[0]).await;

    // Another tenant's key holding the id: as if the session did not exist.
    assert_eq!(
        ping_status(&app, &keys[1], &session).await,
        StatusCode::NOT_FOUND
    );
    let deleted = app
        .with_key(&keys[1])
        .request(reqwest::Method::DELETE, "/mcp")
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::NOT_FOUND);

    // The owner still has it, and may end it.
    assert_eq!(ping_status(&app, &keys[0], &session).await, StatusCode::OK);
    let ended = app
        .with_key(&keys[0])
        .request(reqwest::Method::DELETE, "/mcp")
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(ended.status(), StatusCode::NO_CONTENT);
}

/// Opens an MCP session over HTTP as `key` (initialize + initialized).
async fn open_mcp_session(app: &TestApp, key: &str) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"}}});
    let opened = mcp_post(app, key, None, init).await;
    assert_eq!(opened.status(), StatusCode::OK);
    let session = opened.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    drop(opened);
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let r = mcp_post(app, key, Some(&session), initialized).await;
    assert!(r.status().is_success(), "{}", r.status());
    session
}

async fn ping_status(app: &TestApp, key: &str, session: &str) -> StatusCode {
    let ping = json!({"jsonrpc": "2.0", "id": 2, "method": "ping"});
    mcp_post(app, key, Some(session), ping).await.status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_past_its_mcp_session_cap_loses_its_least_recently_used_session() {
    let data = tempfile::tempdir().unwrap();
    let keys = create_keys(data.path(), &["acme", "globex"]).await;
    let agents = served_agents();
    let app = spawn_app(
        AppOptions::offline()
            .agents(agents.path())
            .data_dir(data.path())
            .config_toml("[api_limit]\nmax_streams = 2\n"),
    );
    let theirs = open_mcp_session(&app, &keys[1]).await;
    let first = open_mcp_session(&app, &keys[0]).await;
    let second = open_mcp_session(&app, &keys[0]).await;
    // `first` is used again: `second` is now the least recently used.
    assert_eq!(ping_status(&app, &keys[0], &first).await, StatusCode::OK);
    let third = open_mcp_session(&app, &keys[0]).await;
    assert_eq!(
        ping_status(&app, &keys[0], &second).await,
        StatusCode::NOT_FOUND,
        "the least recently used session ended"
    );
    assert_eq!(ping_status(&app, &keys[0], &first).await, StatusCode::OK);
    assert_eq!(ping_status(&app, &keys[0], &third).await, StatusCode::OK);
    // Another key's sessions do not count against acme's cap.
    assert_eq!(ping_status(&app, &keys[1], &theirs).await, StatusCode::OK);
}
