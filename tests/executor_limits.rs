//! The executor's limits seen from outside: per-user tool rate limits and
//! the API's own limit per key, the concurrency pool (queue, reject, queue
//! full, timeouts, buckets, priority, workflow bypass), the result cache,
//! retries, confirmations, the supervisor, call records and the server
//! config that sets all of it.
//!
//! Slots are held by a "gate" tool: its handler tells the test it started,
//! then waits until the test opens the gate, so a full pool is a state the
//! test sets up, not a race it hopes to win. Where there is no signal to
//! wait for (a call that sits in the queue), the test polls `/v1/limits`
//! for a bounded time.

mod support;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cadre::executor::{Arguments, ExecuteTool, ExecutorHandle};
use cadre::store::Store;
use cadre::tools::{
    CallerType, ErrorType, ExecutionContext, FnHandler, ToolDefinition, ToolError,
    ToolExecutionResult, ToolHandler,
};
use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::gate::gate_tool;
use support::{
    AppOptions, MockModel, Reply, TestApp, agent_toml, agents_dir, repo_agents, spawn_app,
};
use tokio::task::JoinHandle;

/// How long anything the test waits for may take before it fails loudly.
const PATIENCE: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------
// Test tools
// ---------------------------------------------------------------------------

/// A tool of `category` taking `{"n": integer}` that counts how often its
/// handler ran and answers `{"n", "call"}`.
fn counting_tool(
    name: &str,
    category: &str,
) -> (ToolDefinition, Arc<dyn ToolHandler>, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let handler = FnHandler(move |params: Value| {
        let call = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move { Ok::<Value, ToolError>(json!({"n": params["n"], "call": call})) }
    });
    let def = ToolDefinition::new(
        name,
        "Counts its calls.",
        json!({
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"]
        }),
    )
    .with_category(category);
    (def, Arc::new(handler), calls)
}

/// A tool whose handler fails with `failure(call number)` until it returns
/// `None`, then succeeds; counts its calls.
fn scripted_tool(
    name: &str,
    failure: fn(usize) -> Option<ToolError>,
) -> (ToolDefinition, Arc<dyn ToolHandler>, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let handler = FnHandler(move |_params: Value| {
        let call = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            match failure(call) {
                Some(e) => Err(e),
                None => Ok(json!({"succeeded_on_call": call})),
            }
        }
    });
    let def = ToolDefinition::new(
        name,
        "Fails as scripted, then succeeds.",
        json!({"type": "object", "properties": {}}),
    );
    (def, Arc::new(handler), calls)
}

fn transient(message: &str) -> ToolError {
    ToolError::Transient {
        message: message.into(),
    }
}

// ---------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------

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

async fn invoke(app: &TestApp, tool: &str, body: Value) -> (StatusCode, Value) {
    app.post(&format!("/v1/tools/{tool}/invoke"), &body).await
}

/// An invoke that also returns the response headers.
async fn invoke_with_headers(
    app: &TestApp,
    tool: &str,
    body: Value,
) -> (StatusCode, HeaderMap, Value) {
    let response = app
        .client
        .request(Method::POST, &format!("/v1/tools/{tool}/invoke"))
        .json(&body)
        .send()
        .await
        .expect("request sent");
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.json().await.expect("JSON body");
    (status, headers, body)
}

fn spawn_invoke(app: &TestApp, tool: &str, body: Value) -> JoinHandle<(StatusCode, Value)> {
    app.client
        .spawn_post(&format!("/v1/tools/{tool}/invoke"), body)
}

fn spawn_say(app: &TestApp, session: &str, content: &str) -> JoinHandle<(StatusCode, Value)> {
    app.client.spawn_post(
        &format!("/v1/sessions/{session}/messages"),
        json!({ "content": content }),
    )
}

/// The result of a spawned request, which must come within [`PATIENCE`].
async fn finished<T>(task: JoinHandle<T>) -> T {
    tokio::time::timeout(PATIENCE, task)
        .await
        .expect("the request finished within 5 s")
        .expect("the request task did not panic")
}

/// A call made the way a workflow node makes it: through the library, as
/// `caller_type = workflow_node`.
async fn workflow_call(app: &TestApp, tool: &str, params: Value) -> ToolExecutionResult {
    let mut ctx = ExecutionContext::new(CallerType::WorkflowNode, "node-1");
    ctx.workflow_id = Some("wf-1".into());
    ctx.node_id = Some("node-1".into());
    let call = ExecuteTool::new(tool, Arguments::Json(params), ctx);
    tokio::time::timeout(PATIENCE, executor(app).execute(call))
        .await
        .expect("the workflow-node call finished within 5 s")
}

/// A direct call through the library with a retry budget.
async fn call_with_retries(app: &TestApp, tool: &str, max_retries: u32) -> ToolExecutionResult {
    let mut ctx = ExecutionContext::new(CallerType::Direct, "library");
    ctx.max_retries = max_retries;
    let call = ExecuteTool::new(tool, Arguments::Json(json!({})), ctx);
    tokio::time::timeout(PATIENCE, executor(app).execute(call))
        .await
        .expect("the call finished within 5 s")
}

/// The `concurrency` object of `GET /v1/limits`.
async fn limits(app: &TestApp) -> Value {
    let (status, body) = app.get("/v1/limits").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["concurrency"].clone()
}

/// Polls `GET /v1/limits` until `check` holds on its `concurrency` object;
/// fails after [`PATIENCE`]. For states with no signal (a call in the queue).
async fn limits_when(app: &TestApp, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (status, body) = app.get("/v1/limits").await;
        // A 429 from the API's own limit while polling is just another try.
        if status == StatusCode::OK && check(&body["concurrency"]) {
            return body["concurrency"].clone();
        }
        assert!(
            Instant::now() < deadline,
            "/v1/limits never showed {what} within 5 s; last: {body}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn quota(app: &TestApp, user: &str, tool: &str) -> Value {
    let (status, body) = app
        .get(&format!("/v1/limits/quota?user_id={user}&tool={tool}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

/// The minute window of a quota answer.
fn minute(quota: &Value) -> &Value {
    quota["windows"]
        .as_array()
        .expect("windows")
        .iter()
        .find(|w| w["window"] == "minute")
        .expect("a minute window")
}

fn retry_after_secs(headers: &HeaderMap) -> u64 {
    headers
        .get(RETRY_AFTER)
        .expect("a Retry-After header")
        .to_str()
        .unwrap()
        .parse()
        .expect("Retry-After in whole seconds")
}

fn one_slot(extra: &str) -> String {
    format!("[concurrency]\nmax_concurrent = 1\n{extra}")
}

fn calc(expression: &str) -> Value {
    json!({ "params": { "expression": expression } })
}

fn gate_call(label: &str) -> Value {
    json!({ "params": { "label": label } })
}

// ---------------------------------------------------------------------------
// Rate limits
// ---------------------------------------------------------------------------

fn ohlcv(user: &str) -> Value {
    json!({
        "user_id": user,
        "params": {"symbol": "AAPL", "timeframe": "1d", "limit": 5}
    })
}

/// get_ohlcv allows 30 calls a minute per user. Its answers are cached for
/// 5 s, but the rate limit comes before the cache in the pipeline, so a
/// cache hit still spends a call of the user's allowance.
///
/// The limiter runs on the real clock (one call back every 2 s), so the 31
/// calls must fit in 2 s; on loopback they take a fraction of that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_31st_get_ohlcv_call_in_a_minute_is_rate_limited_while_another_user_passes() {
    let app = spawn_app(AppOptions::offline());

    for n in 1..=30 {
        let (status, body) = invoke(&app, "get_ohlcv", ohlcv("alice")).await;
        assert_eq!(status, StatusCode::OK, "call {n}: {body}");
        assert_eq!(body["metadata"]["cached"], n > 1, "call {n}: {body}");
    }
    let after_30 = quota(&app, "alice", "get_ohlcv").await;
    assert_eq!(minute(&after_30)["limit"], 30);
    assert_eq!(minute(&after_30)["remaining"], 0, "{after_30}");

    let (status, headers, body) = invoke_with_headers(&app, "get_ohlcv", ohlcv("alice")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error_type"], "RATE_LIMITED");
    assert_eq!(body["is_success"], false);
    let retry_after_ms = body["metadata"]["retry_after_ms"].as_u64().unwrap();
    assert!(retry_after_ms > 0, "{body}");
    assert!(retry_after_secs(&headers) >= 1);
    assert!(body["error"].as_str().unwrap().contains("30"), "{body}");

    let (status, body) = invoke(&app, "get_ohlcv", ohlcv("bob")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["metadata"]["cached"], false, "caches are per user");

    // A refused call spends nothing; reading the quota spends nothing.
    for _ in 0..2 {
        assert_eq!(
            minute(&quota(&app, "alice", "get_ohlcv").await)["remaining"],
            0
        );
        assert_eq!(
            minute(&quota(&app, "bob", "get_ohlcv").await)["remaining"],
            29
        );
        let fresh = quota(&app, "carol", "get_ohlcv").await;
        assert_eq!(fresh["user_id"], "carol");
        assert_eq!(minute(&fresh)["remaining"], 30, "{fresh}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_rate_limit_is_per_key_and_answers_429_with_retry_after() {
    let app =
        spawn_app(AppOptions::offline().config_toml("[api_limit]\nper_second = 1\nburst = 3\n"));
    // Real keys: a made-up token is no bucket of its own (it counts by its
    // address, issue #29). The first key is made in open mode, the others
    // with it, each request from its own bucket.
    let (status, admin) = app
        .post("/v1/keys", &json!({"tenant": "ops", "admin": true}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{admin}");
    let admin = app.with_key(admin["key"].as_str().unwrap());
    let mut keys = Vec::new();
    for _ in 0..2 {
        let (status, made) = admin.post("/v1/keys", &json!({"tenant": "acme"})).await;
        assert_eq!(status, StatusCode::CREATED, "{made}");
        keys.push(made["key"].as_str().unwrap().to_string());
    }
    let (k1, k2) = (keys[0].as_str(), keys[1].as_str());
    // Any route but the health probes, which are never limited.
    let health = |key: &str| app.with_key(key).request(Method::GET, "/v1/tools").send();

    for n in 1..=3 {
        let response = health(k1).await.expect("request sent");
        assert_eq!(response.status(), StatusCode::OK, "request {n}");
    }
    let refused = health(k1).await.expect("request sent");
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(retry_after_secs(refused.headers()) >= 1);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "RATE_LIMITED");
    assert!(
        !body.to_string().contains(k1),
        "the key is not echoed: {body}"
    );

    let other = health(k2).await.expect("request sent");
    assert_eq!(
        other.status(),
        StatusCode::OK,
        "another key has its own bucket"
    );
}

// ---------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_call_queues_behind_the_only_slot_while_a_workflow_node_call_bypasses_it() {
    let (def, handler, mut gate) = gate_tool("gate", "custom");
    let app = spawn_app(
        AppOptions::offline()
            .tool(def, handler)
            .config_toml(&one_slot("")),
    );

    let holder = spawn_invoke(&app, "gate", gate_call("holder"));
    assert_eq!(gate.started().await, "holder");
    let queued = spawn_invoke(&app, "calculator", calc("6*7"));
    let pool = limits_when(&app, "one call in the queue", |c| c["queue_length"] == 1).await;
    assert_eq!(pool["current_concurrent"], 1);
    assert_eq!(pool["total_acquired"], 1);

    let (status, metrics) = {
        let response = app
            .client
            .request(Method::GET, "/metrics")
            .send()
            .await
            .unwrap();
        (response.status(), response.text().await.unwrap())
    };
    assert_eq!(status, StatusCode::OK);
    assert!(metrics.contains("\ncadre_tool_concurrent 1\n"), "{metrics}");
    assert!(
        metrics.contains("\ncadre_tool_queue_length 1\n"),
        "{metrics}"
    );

    // The pool is full and someone is waiting: a workflow node still runs.
    let result = workflow_call(&app, "calculator", json!({"expression": "1+2"})).await;
    assert!(result.is_success, "{result:?}");
    assert_eq!(result.output.as_ref().unwrap()["result"], 3.0);
    let pool = limits(&app).await;
    assert_eq!(pool["current_concurrent"], 1, "{pool}");
    assert_eq!(pool["queue_length"], 1, "{pool}");
    assert_eq!(pool["total_acquired"], 1, "bypass is not counted: {pool}");
    assert_eq!(pool["total_bypassed"], 1, "{pool}");

    gate.open(1);
    let (status, body) = finished(holder).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["output"]["label"], "holder");
    let (status, body) = finished(queued).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["output"]["result"], 42.0);

    let pool = limits(&app).await;
    assert_eq!(pool["current_concurrent"], 0, "{pool}");
    assert_eq!(pool["queue_length"], 0, "{pool}");
    assert_eq!(pool["total_acquired"], 2, "{pool}");
    assert_eq!(pool["total_bypassed"], 1, "{pool}");
    // The bypassing call is still recorded, like the queued one.
    let stats = store(&app).tool_stats("calculator").await.unwrap();
    assert_eq!(stats.total_calls, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_reject_strategy_a_call_finding_no_slot_is_refused_at_once() {
    let (def, handler, mut gate) = gate_tool("gate", "custom");
    let app = spawn_app(
        AppOptions::offline()
            .tool(def, handler)
            .config_toml(&one_slot("strategy = \"reject\"\n")),
    );
    let holder = spawn_invoke(&app, "gate", gate_call("holder"));
    assert_eq!(gate.started().await, "holder");

    let (status, body) = invoke(&app, "calculator", calc("1+1")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error_type"], "TOOL_QUEUE_FULL");
    let pool = limits(&app).await;
    assert_eq!(pool["queue_length"], 0, "reject has no queue: {pool}");
    assert_eq!(pool["total_rejected"], 1, "{pool}");

    gate.open(1);
    assert_eq!(finished(holder).await.0, StatusCode::OK);
    let (status, body) = invoke(&app, "calculator", calc("1+1")).await;
    assert_eq!(status, StatusCode::OK, "a free slot admits again: {body}");
}

/// `src/http/tools.rs` documents "429 rate limited or queue full (with
/// `Retry-After`)".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_full_refusal_carries_retry_after_as_documented() {
    let (def, handler, mut gate) = gate_tool("gate", "custom");
    let app = spawn_app(
        AppOptions::offline()
            .tool(def, handler)
            .config_toml(&one_slot("strategy = \"reject\"\n")),
    );
    let holder = spawn_invoke(&app, "gate", gate_call("holder"));
    assert_eq!(gate.started().await, "holder");

    let (status, headers, body) = invoke_with_headers(&app, "calculator", calc("1+1")).await;
    gate.open(1);
    assert_eq!(finished(holder).await.0, StatusCode::OK);
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error_type"], "TOOL_QUEUE_FULL");
    assert!(retry_after_secs(&headers) >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_the_next_waiter_with_queue_full() {
    let (def, handler, mut gate) = gate_tool("gate", "custom");
    let app = spawn_app(
        AppOptions::offline()
            .tool(def, handler)
            .config_toml(&one_slot("queue_size = 1\n")),
    );
    let holder = spawn_invoke(&app, "gate", gate_call("holder"));
    assert_eq!(gate.started().await, "holder");
    let waiter = spawn_invoke(&app, "calculator", calc("2+2"));
    limits_when(&app, "one call in the queue", |c| c["queue_length"] == 1).await;

    let (status, body) = invoke(&app, "calculator", calc("3+3")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error_type"], "TOOL_QUEUE_FULL");
    assert_eq!(limits(&app).await["total_rejected"], 1);

    gate.open(1);
    assert_eq!(finished(holder).await.0, StatusCode::OK);
    let (status, body) = finished(waiter).await;
    assert_eq!(status, StatusCode::OK, "the waiter kept its place: {body}");
    assert_eq!(body["output"]["result"], 4.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_past_its_timeout_leaves_the_queue_with_timeout() {
    let (def, handler, mut gate) = gate_tool("gate", "custom");
    let app = spawn_app(
        AppOptions::offline()
            .tool(def, handler)
            .config_toml(&one_slot("default_timeout_s = 0.2\n")),
    );
    let holder = spawn_invoke(&app, "gate", gate_call("holder"));
    assert_eq!(gate.started().await, "holder");

    let (status, body) = invoke(&app, "calculator", calc("1+1")).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert_eq!(body["error_type"], "TOOL_TIMEOUT");
    let pool = limits(&app).await;
    assert_eq!(pool["total_timeout"], 1, "{pool}");
    assert_eq!(pool["queue_length"], 0, "{pool}");
    assert_eq!(pool["current_concurrent"], 1, "the holder keeps its slot");

    gate.open(1);
    assert_eq!(finished(holder).await.0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_bucket_does_not_block_calls_of_other_categories() {
    let (def, handler, mut gate) = gate_tool("gate", "custom");
    let app = spawn_app(
        AppOptions::offline()
            .tool(def, handler)
            .config_toml("[concurrency]\nbucket_limits = {custom = 1}\n"),
    );
    let first = spawn_invoke(&app, "gate", gate_call("first"));
    assert_eq!(gate.started().await, "first");

    let (status, body) = invoke(&app, "calculator", calc("5*5")).await;
    assert_eq!(status, StatusCode::OK, "another category runs: {body}");
    assert_eq!(body["output"]["result"], 25.0);

    let second = spawn_invoke(&app, "gate", gate_call("second"));
    let pool = limits_when(&app, "the second custom call waiting", |c| {
        c["buckets"]["custom"]["queue"] == 1
    })
    .await;
    assert_eq!(pool["queue_length"], 1, "{pool}");
    assert_eq!(pool["current_concurrent"], 1, "{pool}");
    assert_eq!(pool["buckets"]["custom"]["current"], 1, "{pool}");
    assert_eq!(pool["buckets"]["custom"]["limit"], 1, "{pool}");
    assert!(gate.none_started(), "the second custom call must wait");

    gate.open(2);
    assert_eq!(finished(first).await.0, StatusCode::OK);
    assert_eq!(gate.started().await, "second");
    let (status, body) = finished(second).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["output"]["label"], "second");
}

/// Holds the only slot, queues `first` then `second` (with these
/// priorities), opens the gate and returns the labels in start order.
async fn admission_order(strategy: &str, first: (&str, i32), second: (&str, i32)) -> Vec<String> {
    let (def, handler, mut gate) = gate_tool("gate", "custom");
    let app = spawn_app(
        AppOptions::offline()
            .tool(def, handler)
            .config_toml(&one_slot(&format!("strategy = \"{strategy}\"\n"))),
    );
    let holder = spawn_invoke(&app, "gate", gate_call("holder"));
    let mut order = vec![gate.started().await];
    let mut waiters = Vec::new();
    for (queued, (label, priority)) in [first, second].into_iter().enumerate() {
        let body = json!({"params": {"label": label}, "priority": priority});
        waiters.push(spawn_invoke(&app, "gate", body));
        limits_when(&app, "the waiter in the queue", |c| {
            c["queue_length"] == queued + 1
        })
        .await;
    }
    gate.open(3);
    order.push(gate.started().await);
    order.push(gate.started().await);
    assert_eq!(finished(holder).await.0, StatusCode::OK);
    for waiter in waiters {
        let (status, body) = finished(waiter).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    order
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_priority_strategy_admits_the_higher_priority_waiter_first() {
    let order = admission_order("priority", ("low", 1), ("high", 5)).await;
    assert_eq!(order, ["holder", "high", "low"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fifo_strategy_admits_waiters_in_arrival_order_whatever_their_priority() {
    let order = admission_order("fifo", ("early", 1), ("late", 5)).await;
    assert_eq!(order, ["holder", "early", "late"]);
}

/// The issue's "done when": with one slot, a conversation whose tool call
/// holds it makes another conversation's tool call queue (visible in
/// `/v1/limits`), while a workflow-node call runs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_holding_the_only_slot_queues_another_but_not_a_workflow_node() {
    let agents = agents_dir(&[("w.toml", &agent_toml("worker", &["gate", "calculator"], 3))]);
    let model = MockModel::start().await;
    model.push(Reply::tool_call("a1", "gate", r#"{"label":"A"}"#));
    let (def, handler, mut gate) = gate_tool("gate", "custom");
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .tool(def, handler)
            .config_toml(&one_slot("")),
    );
    let session_a = app.session("worker").await;
    let session_b = app.session("worker").await;

    let turn_a = spawn_say(&app, &session_a, "hold the slot");
    assert_eq!(gate.started().await, "A");
    model.push(Reply::tool_call(
        "b1",
        "calculator",
        r#"{"expression":"6*7"}"#,
    ));
    let turn_b = spawn_say(&app, &session_b, "what is 6*7?");
    let pool = limits_when(&app, "session B's call in the queue", |c| {
        c["queue_length"] == 1
    })
    .await;
    assert_eq!(pool["current_concurrent"], 1, "{pool}");

    let result = workflow_call(&app, "calculator", json!({"expression": "2*2"})).await;
    assert!(result.is_success, "{result:?}");
    let pool = limits(&app).await;
    assert_eq!(pool["current_concurrent"], 1, "{pool}");
    assert_eq!(pool["queue_length"], 1, "{pool}");
    assert_eq!(pool["total_acquired"], 1, "{pool}");

    // Both turns end with a text answer, in whichever order they get there.
    model.push_all([Reply::text("done"), Reply::text("done")]);
    gate.open(1);
    let (status, body) = finished(turn_a).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["tool_calls"][0]["output"]["label"], "A");
    let (status, body) = finished(turn_b).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["tool_calls"][0]["is_success"], true, "{body}");
    assert_eq!(body["tool_calls"][0]["output"]["result"], 42.0);
    assert_eq!(body["answer"], "done");
    assert_eq!(model.overruns(), 0);
    assert_eq!(model.remaining(), 0);
}

// ---------------------------------------------------------------------------
// Cache
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_call_is_answered_from_the_cache_for_the_same_user_only() {
    let (def, handler, calls) = counting_tool("quote", "market");
    // A read-only quote: cached by its category (a tool that acts is not).
    let def = def.with_side_effects(cadre::tools::SideEffects::None);
    let app = spawn_app(AppOptions::offline().tool(def, handler));
    let call = |user: &str| json!({"user_id": user, "params": {"n": 7}});

    let (status, first) = invoke(&app, "quote", call("u1")).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["metadata"]["cached"], false);
    let (status, second) = invoke(&app, "quote", call("u1")).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["metadata"]["cached"], true);
    assert_eq!(second["output"], first["output"]);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the handler ran once");

    let (status, other) = invoke(&app, "quote", call("u2")).await;
    assert_eq!(status, StatusCode::OK, "{other}");
    assert_eq!(other["metadata"]["cached"], false, "another user's answer");
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let (_, changed) = invoke(&app, "quote", json!({"user_id": "u1", "params": {"n": 8}})).await;
    assert_eq!(changed["metadata"]["cached"], false, "other parameters");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trading_and_calculate_tools_are_never_cached() {
    let (trade_def, trade_handler, trades) = counting_tool("place", "trading");
    let (calc_def, calc_handler, sums) = counting_tool("sum", "calculate");
    let app = spawn_app(
        AppOptions::offline()
            .tool(trade_def, trade_handler)
            .tool(calc_def, calc_handler),
    );
    for (tool, calls) in [("place", &trades), ("sum", &sums)] {
        for _ in 0..2 {
            let (status, body) =
                invoke(&app, tool, json!({"user_id": "u1", "params": {"n": 1}})).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            assert_eq!(body["metadata"]["cached"], false, "{tool}: {body}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2, "{tool} ran every time");
    }
    // The builtin calculator (category calculate) too.
    for _ in 0..2 {
        let (_, body) = invoke(&app, "calculator", calc("2+2")).await;
        assert_eq!(body["metadata"]["cached"], false, "{body}");
    }
}

// ---------------------------------------------------------------------------
// Retries
// ---------------------------------------------------------------------------

const FAST_RETRIES: &str = "[executor]\nretry_base_delay_ms = 1\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_failure_is_retried_until_it_succeeds() {
    let (def, handler, calls) = scripted_tool("flaky", |call| {
        (call <= 2).then(|| transient("upstream hiccup"))
    });
    let app = spawn_app(
        AppOptions::offline()
            .tool(def, handler)
            .config_toml(FAST_RETRIES),
    );

    let result = call_with_retries(&app, "flaky", 3).await;
    assert!(result.is_success, "{result:?}");
    assert_eq!(result.metadata.attempts, 3);
    assert_eq!(result.output.unwrap()["succeeded_on_call"], 3);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_failure_that_persists_is_tried_max_retries_plus_one_times() {
    let (def, handler, calls) = scripted_tool("down", |_| Some(transient("still down")));
    let app = spawn_app(
        AppOptions::offline()
            .tool(def, handler)
            .config_toml(FAST_RETRIES),
    );

    let result = call_with_retries(&app, "down", 3).await;
    assert!(!result.is_success);
    assert_eq!(result.error_type, Some(ErrorType::ExecutionError));
    assert_eq!(result.metadata.attempts, 4);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_input_failure_is_not_retried() {
    let (def, handler, calls) = scripted_tool("picky", |_| Some(ToolError::invalid("nonsense")));
    let app = spawn_app(
        AppOptions::offline()
            .tool(def, handler)
            .config_toml(FAST_RETRIES),
    );

    let result = call_with_retries(&app, "picky", 3).await;
    assert!(!result.is_success);
    // The tool's own input check reads as a validation error.
    assert_eq!(result.error_type, Some(ErrorType::ValidationError));
    assert_eq!(result.error.as_deref(), Some("nonsense"));
    assert_eq!(result.metadata.attempts, 1);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_times_out_is_retried() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let handler = FnHandler(move |_params: Value| {
        let call = counter.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            if call == 1 {
                std::future::pending::<()>().await;
            }
            Ok::<Value, ToolError>(json!({"call": call}))
        }
    });
    let def = ToolDefinition::new("stuck_once", "Hangs once.", json!({"type": "object"}))
        .with_timeout(Duration::from_millis(100));
    let app = spawn_app(
        AppOptions::offline()
            .tool(def, Arc::new(handler))
            .config_toml(FAST_RETRIES),
    );

    let result = call_with_retries(&app, "stuck_once", 1).await;
    assert!(result.is_success, "{result:?}");
    assert_eq!(result.metadata.attempts, 2);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_validation_failure_never_reaches_the_handler_and_is_not_retried() {
    let (def, handler, calls) = counting_tool("strict", "custom");
    let app = spawn_app(
        AppOptions::offline()
            .tool(def, handler)
            .config_toml(FAST_RETRIES),
    );
    let mut ctx = ExecutionContext::new(CallerType::Direct, "library");
    ctx.max_retries = 3;
    let call = ExecuteTool::new("strict", Arguments::Json(json!({"n": "seven"})), ctx);

    let result = executor(&app).execute(call).await;
    assert_eq!(result.error_type, Some(ErrorType::ValidationError));
    assert_eq!(result.validation_errors[0].field, "n", "{result:?}");
    assert_eq!(result.metadata.attempts, 0);
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    let (status, body) = invoke(&app, "strict", json!({"params": {}})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error_type"], "VALIDATION_ERROR");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

// ---------------------------------------------------------------------------
// Confirmations
// ---------------------------------------------------------------------------

fn paper_order() -> Value {
    json!({
        "user_id": "trader",
        "plan": "pro",
        "params": {"symbol": "AAPL", "side": "buy", "quantity": 1, "order_type": "market"}
    })
}

/// Invokes `create_paper_order`; checks it is pending and returns its id.
async fn pending_order(app: &TestApp) -> String {
    let (status, body) = invoke(app, "create_paper_order", paper_order()).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["error_type"], "CONFIRMATION_REQUIRED");
    let id = body["metadata"]["confirmation_id"]
        .as_str()
        .expect("a confirmation id")
        .to_owned();
    assert_eq!(body["output"]["confirmation_id"], id.as_str());
    assert!(
        body["output"]["summary"]
            .as_str()
            .unwrap()
            .contains("create_paper_order"),
        "{body}"
    );
    id
}

/// The trader's filled paper orders.
async fn fills(app: &TestApp) -> Vec<Value> {
    let body = json!({"user_id": "trader", "plan": "pro", "params": {}});
    let (status, body) = invoke(app, "get_trade_history", body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["output"]["data"]["trades"]
        .as_array()
        .expect("trades")
        .clone()
}

async fn decide(app: &TestApp, id: &str, approve: bool) -> (StatusCode, Value) {
    app.post(
        &format!("/v1/confirmations/{id}"),
        &json!({ "approve": approve }),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paper_order_waits_for_approval_and_then_runs() {
    let app = spawn_app(AppOptions::offline());
    let id = pending_order(&app).await;
    assert!(fills(&app).await.is_empty(), "no order before approval");
    let (status, shown) = app.get(&format!("/v1/confirmations/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    assert_eq!(shown["tool_name"], "create_paper_order");

    let (status, body) = decide(&app, &id, true).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "executed");
    let order = &body["result"]["output"]["data"]["order"];
    assert_eq!(order["status"], "filled", "{body}");
    assert_eq!(order["symbol"], "AAPL");

    let filled = fills(&app).await;
    assert_eq!(filled.len(), 1);
    assert_eq!(filled[0]["order_id"], order["id"]);
    let (status, again) = decide(&app, &id, true).await;
    assert_eq!(status, StatusCode::CONFLICT, "it runs once: {again}");
    assert_eq!(again["error"]["code"], "CONFIRMATION_ALREADY_DECIDED");
    assert_eq!(
        fills(&app).await.len(),
        1,
        "the second decision filled nothing more"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_confirmation_is_discarded_and_cannot_be_decided_again() {
    let app = spawn_app(AppOptions::offline());
    let id = pending_order(&app).await;

    let (status, body) = decide(&app, &id, false).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "denied");
    assert!(fills(&app).await.is_empty());

    let (status, body) = decide(&app, &id, true).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "CONFIRMATION_ALREADY_DECIDED");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("denied"),
        "{body}"
    );
    assert!(fills(&app).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_confirmation_cannot_be_approved() {
    let app = spawn_app(AppOptions::offline().config_toml("[executor]\nconfirmation_ttl_s = 0\n"));
    let id = pending_order(&app).await;

    let (status, body) = decide(&app, &id, true).await;
    assert_eq!(status, StatusCode::GONE, "{body}");
    assert_eq!(body["error"]["code"], "CONFIRMATION_EXPIRED");
    assert!(fills(&app).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_confirmation_survives_a_restart() {
    let mut app = spawn_app(AppOptions::offline());
    let id = pending_order(&app).await;
    app.stop();

    let again = spawn_app(AppOptions::offline().data_dir(&app.data_dir));
    let (status, listed) = again.get("/v1/confirmations").await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert_eq!(listed["confirmations"][0]["confirmation_id"], id.as_str());
    assert!(fills(&again).await.is_empty());

    let (status, body) = decide(&again, &id, true).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "executed", "{body}");
    assert_eq!(fills(&again).await.len(), 1);
}

/// A confirmed call is a decision to act once more, so its result must not
/// answer a later identical call, nor stand in for a later approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_needs_confirmation_is_never_answered_from_the_cache() {
    // Category `custom`: cached 30 s by default, like a tool file without a
    // `cache` entry.
    let (def, handler, calls) = counting_tool("transfer", "custom");
    let def = def.with_post_processor("require_confirmation");
    let app = spawn_app(AppOptions::offline().tool(def, handler));
    let transfer = json!({"user_id": "u1", "params": {"n": 100}});

    let mut ids = Vec::new();
    for _ in 0..2 {
        let (status, body) = invoke(&app, "transfer", transfer.clone()).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        ids.push(
            body["metadata"]["confirmation_id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    for id in &ids {
        let (status, body) = decide(&app, id, true).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["status"], "executed");
        assert_eq!(body["result"]["metadata"]["cached"], false, "{body}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2, "two approvals, two runs");

    let (status, body) = invoke(&app, "transfer", transfer).await;
    assert_eq!(status, StatusCode::ACCEPTED, "asks again: {body}");
    assert_eq!(body["error_type"], "CONFIRMATION_REQUIRED");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

// ---------------------------------------------------------------------------
// Supervisor
// ---------------------------------------------------------------------------

/// Waits until the supervisor has restarted the executor `n` times.
async fn restarts_reach(executor: &ExecutorHandle, n: u64) {
    let deadline = Instant::now() + PATIENCE;
    while executor.restarts() < n {
        assert!(
            Instant::now() < deadline,
            "the executor was restarted {} times, not {n}, within 5 s",
            executor.restarts()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_fault_is_an_error_not_a_hang_and_the_supervisor_restarts_it() {
    let app = spawn_app(AppOptions::offline());
    let executor = executor(&app);
    assert_eq!(executor.restarts(), 0);

    let outcome = tokio::time::timeout(PATIENCE, executor.inject_fault())
        .await
        .expect("the fault is answered, not a hang");
    assert!(outcome.is_err(), "{outcome:?}");
    restarts_reach(&executor, 1).await;

    let (status, body) = invoke(&app, "calculator", calc("2*21")).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the restarted executor serves: {body}"
    );
    assert_eq!(body["output"]["result"], 42.0);
    assert_eq!(executor.restarts(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_running_during_an_executor_restart_still_finishes_and_is_recorded() {
    let (def, handler, mut gate) = gate_tool("gate", "custom");
    let app = spawn_app(AppOptions::offline().tool(def, handler));
    let executor = executor(&app);
    let running = spawn_invoke(&app, "gate", gate_call("running"));
    assert_eq!(gate.started().await, "running");

    assert!(executor.inject_fault().await.is_err());
    restarts_reach(&executor, 1).await;
    gate.open(1);

    let (status, body) = finished(running).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["output"]["label"], "running");
    assert_eq!(limits(&app).await["current_concurrent"], 0);
    assert_eq!(store(&app).tool_stats("gate").await.unwrap().total_calls, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_tool_is_a_502_execution_error_and_does_not_restart_the_executor() {
    let handler = FnHandler(|_params: Value| async move {
        if true {
            panic!("the tool blew up");
        }
        Ok::<Value, ToolError>(Value::Null)
    });
    let def = ToolDefinition::new("boom", "Panics.", json!({"type": "object"}));
    let app = spawn_app(AppOptions::offline().tool(def, Arc::new(handler)));

    let (status, body) = invoke(&app, "boom", json!({})).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["error_type"], "TOOL_EXECUTION_ERROR");
    assert!(
        body["error"].as_str().unwrap().contains("the tool blew up"),
        "{body}"
    );
    assert_eq!(limits(&app).await["current_concurrent"], 0, "slot freed");

    let (status, body) = invoke(&app, "calculator", calc("1+1")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(executor(&app).restarts(), 0);
}

// ---------------------------------------------------------------------------
// Records
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_leaves_one_record_successes_and_refusals_alike() {
    let (def, handler, calls) = counting_tool("tally", "custom");
    // Read-only, so its answers are cached (the third call is a hit).
    let def = def.with_side_effects(cadre::tools::SideEffects::None);
    let app = spawn_app(AppOptions::offline().tool(def.per_minute(3), handler));
    let call = |user: &str, n: Value| json!({"user_id": user, "params": {"n": n}});

    let outcomes = [
        (call("u1", json!(1)), StatusCode::OK), // runs
        (call("u1", json!("one")), StatusCode::UNPROCESSABLE_ENTITY), // invalid
        (call("u1", json!(1)), StatusCode::OK), // cache hit
        (call("u1", json!(2)), StatusCode::TOO_MANY_REQUESTS), // 4th of 3
        (call("u2", json!(2)), StatusCode::OK), // runs
    ];
    for (n, (body, expected)) in outcomes.iter().enumerate() {
        let (status, answer) = invoke(&app, "tally", body.clone()).await;
        assert_eq!(status, *expected, "call {}: {answer}", n + 1);
    }

    let stats = store(&app).tool_stats("tally").await.unwrap();
    assert_eq!(stats.total_calls, outcomes.len() as u64);
    assert_eq!(stats.successful_calls, 3);
    assert_eq!(stats.failed_calls, 2);
    assert_eq!(
        store(&app).record_count().await.unwrap(),
        outcomes.len() as u64
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "refusals and the hit never ran"
    );
}

// ---------------------------------------------------------------------------
// Server config
// ---------------------------------------------------------------------------

/// Runs `cadre serve` with `args` and `env` (and no other `CADRE_*`
/// variable); it must exit by itself within 10 s. Returns (success, stderr).
fn serve(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let data = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_cadre"));
    command
        .arg("serve")
        .args(["--addr", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(data.path())
        .arg("--agents")
        .arg(repo_agents())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (var, _) in std::env::vars().filter(|(k, _)| k.starts_with("CADRE_")) {
        command.env_remove(var);
    }
    command.envs(env.iter().copied());
    let mut child = command.spawn().expect("cadre binary starts");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("cadre serve kept running with a bad config");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    (status.success(), stderr)
}

#[test]
fn serve_refuses_a_config_file_with_an_unknown_key_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cadre.toml");
    std::fs::write(&path, "[concurrency]\nmax_concurent = 1\n").unwrap();

    let (ok, stderr) = serve(&["--config", path.to_str().unwrap()], &[]);
    assert!(!ok, "exit status must be non-zero; stderr: {stderr}");
    assert!(stderr.contains("max_concurent"), "{stderr}");
}

#[test]
fn serve_refuses_a_bad_environment_override_and_names_the_key() {
    let (ok, stderr) = serve(&[], &[("CADRE_CONCURRENCY_STRATEGY", "random")]);
    assert!(!ok, "exit status must be non-zero; stderr: {stderr}");
    assert!(stderr.contains("CADRE_CONCURRENCY_STRATEGY"), "{stderr}");
    assert!(stderr.contains("random"), "{stderr}");
}
