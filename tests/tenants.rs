//! Tenants end to end: API keys in front of every route, one tenant never
//! seeing another's sessions, calls or confirmations (404, never 403),
//! tenant config reaching the model request, the visitor WebSocket with
//! auto-response, operator help (suggestions, improve), and keys that never
//! reach a log.
//!
//! Keys are loaded once, when the server starts, from the store: each test
//! creates its keys in the data dir's store first ([`with_keys`],
//! `support::store::open_store`), then starts cadre over that dir. A server started over a dir that never held a key
//! runs open, as tenant `default` with admin rights.

mod support;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use reqwest::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::ws::{Ws, connect_ws};
use support::{AppOptions, Client, MockModel, Reply, TestApp, send, spawn_app};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_tungstenite::tungstenite::{self, Message};

/// Upper bound for anything a test waits for (a frame, a process exit).
const PATIENCE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------
// Keys and callers
// ---------------------------------------------------------------------------

/// Creates one key per `(tenant, admin)` in `dir`'s store and closes it
/// again, so a server can then open it. Returns the keys in order.
async fn create_keys(dir: &Path, specs: &[(&str, bool)]) -> Vec<String> {
    let store = support::store::open_store(dir);
    let mut keys = Vec::new();
    for (tenant, admin) in specs {
        let (key, _) = cadre::tenants::create_key(&store, tenant, *admin)
            .await
            .expect("key created");
        keys.push(key);
    }
    drop(store);
    keys
}

/// A cadre whose database holds keys for acme, globex (neither admin) and
/// an admin of tenant `ops`.
struct KeyedApp {
    app: TestApp,
    acme: String,
    globex: String,
    admin: String,
    _dir: tempfile::TempDir,
}

async fn with_keys(options: AppOptions) -> KeyedApp {
    let dir = tempfile::tempdir().expect("temp dir");
    let keys = create_keys(
        dir.path(),
        &[("acme", false), ("globex", false), ("ops", true)],
    )
    .await;
    let app = spawn_app(options.data_dir(dir.path()));
    let [acme, globex, admin] = <[String; 3]>::try_from(keys).expect("three keys");
    KeyedApp {
        app,
        acme,
        globex,
        admin,
        _dir: dir,
    }
}

fn bearer(app: &TestApp, key: &str) -> Client {
    app.with_key(key)
}

fn anonymous(app: &TestApp) -> Client {
    app.client.clone()
}

/// Creates a session of `agent` on the pro plan; returns its id.
async fn pro_session(caller: &Client, agent: &str) -> String {
    let (status, body) = caller
        .post("/v1/sessions", &json!({"agent": agent, "plan": "pro"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["id"].as_str().expect("session id").to_owned()
}

/// One turn; asserts it succeeded and returns the outcome.
async fn say_ok(caller: &Client, session: &str, content: &str) -> Value {
    let (status, body) = caller.say(session, content).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

async fn history(caller: &Client, session: &str) -> Vec<Value> {
    let (status, body) = caller
        .get(&format!("/v1/sessions/{session}/messages"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["messages"].as_array().expect("messages").clone()
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("(no error code)")
}

/// The secret part of a `cadre_<id>_<secret>` key.
fn secret_of(key: &str) -> &str {
    key.rsplit('_').next().expect("a key has a secret")
}

/// The id part of a `cadre_<id>_<secret>` key.
fn key_id_of(key: &str) -> &str {
    key.split('_').nth(1).expect("a key has an id")
}

/// A key with the same id as `key` and another secret.
fn forged(key: &str) -> String {
    format!("cadre_{}_{}", key_id_of(key), "0".repeat(48))
}

// ---------------------------------------------------------------------------
// Authentication
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keys_configured_a_missing_or_wrong_key_is_401_and_never_echoed() {
    let t = with_keys(AppOptions::offline()).await;
    let app = &t.app;

    let response = app
        .client
        .request(Method::GET, "/v1/calls")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers()[WWW_AUTHENTICATE], "Bearer");
    let body: Value = response.json().await.unwrap();
    assert_eq!(error_code(&body), "UNAUTHORIZED");

    let wrong = [
        format!("Bearer {}", forged(&t.acme)),
        format!("Bearer {}x", t.acme),
        "Bearer cadre_ffffffffffff_abcdef".to_owned(),
        "Bearer not-a-cadre-key".to_owned(),
        format!("Basic {}", t.acme),
        t.acme.clone(),
    ];
    for authorization in wrong {
        let response = app
            .client
            .request(Method::POST, "/v1/sessions")
            .header(AUTHORIZATION, &authorization)
            .json(&json!({"agent": "assistant"}))
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            StatusCode::UNAUTHORIZED,
            "{authorization}"
        );
        assert_eq!(response.headers()[WWW_AUTHENTICATE], "Bearer");
        let text = response.text().await.unwrap();
        let presented = authorization.rsplit(' ').next().unwrap();
        assert!(!text.contains(presented), "{text} echoes {presented}");
        assert!(!text.contains(secret_of(&t.acme)), "{text}");
        let body: Value = serde_json::from_str(&text).expect("a JSON error body");
        assert_eq!(error_code(&body), "UNAUTHORIZED");
    }

    let (status, body) = anonymous(app).get("/healthz").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "ok");

    // The right key, in any case of the scheme, gets through.
    let acme = bearer(app, &t.acme);
    let session = pro_session(&acme, "assistant").await;
    let acme = acme.with_authorization(format!("bearer {}", t.acme));
    let (status, body) = acme.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["tenant"], "acme");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_key_ever_created_the_server_runs_open_as_the_default_tenant() {
    let app = spawn_app(AppOptions::offline());
    let caller = anonymous(&app);
    let session = pro_session(&caller, "assistant").await;
    let (status, body) = caller.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["tenant"], "default");
    let answer = say_ok(&caller, &session, "What is 6*7?").await;
    assert!(
        answer["answer"].as_str().unwrap().contains("42"),
        "{answer}"
    );
    // Open means admin too.
    let (status, body) = caller.get("/v1/stats").await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_key_is_refused_and_revoking_every_key_does_not_open_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let key = {
        let store = support::store::open_store(dir.path());
        let (key, record) = cadre::tenants::create_key(&store, "acme", true)
            .await
            .unwrap();
        cadre::tenants::revoke_key(&store, &record.key_id)
            .await
            .unwrap();
        key
    };
    let app = spawn_app(AppOptions::offline().data_dir(dir.path()));

    let (status, body) = bearer(&app, &key)
        .post("/v1/sessions", &json!({"agent": "assistant"}))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(!body.to_string().contains(secret_of(&key)), "{body}");
    let (status, body) = anonymous(&app)
        .post("/v1/sessions", &json!({"agent": "assistant"}))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "not open: {body}");
    let (status, _) = anonymous(&app).get("/v1/stats").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

// ---------------------------------------------------------------------------
// Tenant isolation
// ---------------------------------------------------------------------------

/// Asserts a 404 whose body carries none of `secrets`.
fn assert_not_found(what: &str, (status, body): (StatusCode, Value), secrets: &[&str]) {
    assert_eq!(status, StatusCode::NOT_FOUND, "{what}: {body}");
    assert!(error_code(&body).ends_with("NOT_FOUND"), "{what}: {body}");
    let text = body.to_string();
    for s in secrets {
        assert!(!text.contains(s), "{what} leaks {s:?}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_session_calls_and_confirmations_are_not_found() {
    let t = with_keys(AppOptions::offline()).await;
    let app = &t.app;
    let acme = bearer(app, &t.acme);
    let globex = bearer(app, &t.globex);

    // Acme: a session with a calculator turn, and a paper order waiting.
    let session = pro_session(&acme, "assistant").await;
    let turn = say_ok(&acme, &session, "What is 6*7?").await;
    assert_eq!(turn["tool_calls"][0]["name"], "calculator", "{turn}");
    let (status, order) = acme
        .post(
            "/v1/tools/create_paper_order/invoke",
            &json!({
                "user_id": "acme-trader",
                "plan": "pro",
                "params": {"symbol": "AAPL", "side": "buy", "quantity": 1, "order_type": "market"}
            }),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{order}");
    let confirmation = order["metadata"]["confirmation_id"]
        .as_str()
        .expect("a confirmation id")
        .to_owned();
    let acme_history = history(&acme, &session).await;

    // Globex, walking every route that takes acme's ids.
    let secrets = ["6*7", "calculator", "AAPL", "acme-trader", "What is"];
    let s = format!("/v1/sessions/{session}");
    assert_not_found("GET session", globex.get(&s).await, &secrets);
    assert_not_found(
        "GET messages",
        globex.get(&format!("{s}/messages")).await,
        &secrets,
    );
    assert_not_found(
        "POST messages",
        globex
            .post(
                &format!("{s}/messages"),
                &json!({"content": "What is 1+1?"}),
            )
            .await,
        &secrets,
    );
    let streamed = globex
        .request(Method::POST, &format!("{s}/messages"))
        .header("accept", "text/event-stream")
        .json(&json!({"content": "What is 1+1?"}));
    assert_not_found("POST messages (SSE)", send(streamed).await, &secrets);
    assert_not_found(
        "GET summary",
        globex.get(&format!("{s}/summary")).await,
        &secrets,
    );
    assert_not_found(
        "POST suggestions",
        globex.post(&format!("{s}/suggestions"), &json!({})).await,
        &secrets,
    );
    // Answered exactly like an id that does not exist: ids cannot be probed.
    let unknown = "01a21511-0000-7000-8000-000000000000";
    for (route, id) in [
        ("/v1/sessions", &session),
        ("/v1/confirmations", &confirmation),
    ] {
        let (status, theirs) = globex.get(&format!("{route}/{id}")).await;
        let (missing_status, missing) = globex.get(&format!("{route}/{unknown}")).await;
        assert_eq!(status, missing_status, "{route}");
        assert_eq!(
            theirs.to_string().replace(id.as_str(), "ID"),
            missing.to_string().replace(unknown, "ID"),
            "{route}"
        );
    }
    let c = format!("/v1/confirmations/{confirmation}");
    assert_not_found("GET confirmation", globex.get(&c).await, &secrets);
    assert_not_found(
        "POST confirmation",
        globex.post(&c, &json!({"approve": true})).await,
        &secrets,
    );
    match connect_ws(app, &session, Some(&t.globex)).await {
        Err(tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), StatusCode::NOT_FOUND)
        }
        Err(e) => panic!("the upgrade failed otherwise: {e}"),
        Ok(_) => panic!("globex opened acme's WebSocket"),
    }

    let (status, calls) = globex
        .get(&format!("/v1/calls?conversation_id={session}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{calls}");
    assert_eq!(calls["count"], 0, "{calls}");
    let (status, all) = globex.get("/v1/calls").await;
    assert_eq!(status, StatusCode::OK, "{all}");
    assert_eq!(all["count"], 0, "{all}");
    let (status, pending) = globex.get("/v1/confirmations").await;
    assert_eq!(status, StatusCode::OK, "{pending}");
    assert_eq!(pending["confirmations"], json!([]), "{pending}");

    // Nothing globex tried changed acme's data; acme still sees all of it.
    assert_eq!(history(&acme, &session).await, acme_history);
    let (status, shown) = acme.get(&c).await;
    assert_eq!(status, StatusCode::OK, "still pending: {shown}");
    let (_, calls) = acme
        .get(&format!("/v1/calls?conversation_id={session}"))
        .await;
    assert_eq!(calls["count"], 1, "{calls}");
    let (_, pending) = acme.get("/v1/confirmations").await;
    assert_eq!(pending["confirmations"][0]["confirmation_id"], confirmation);
    let (_, summary) = acme.get(&format!("{s}/summary")).await;
    assert_eq!(summary["tool_usage_summary"]["total_calls"], 1, "{summary}");
    drop(
        connect_ws(app, &session, Some(&t.acme))
            .await
            .expect("acme opens its own WebSocket"),
    );

    // Globex's own session works as usual.
    let own = pro_session(&globex, "assistant").await;
    let turn = say_ok(&globex, &own, "What is 2+3?").await;
    assert!(turn["answer"].as_str().unwrap().contains('5'), "{turn}");
    let (_, calls) = globex.get("/v1/calls").await;
    assert_eq!(calls["count"], 1, "{calls}");
    assert_eq!(calls["calls"][0]["conversation_id"], own);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_wide_data_and_tenant_configs_need_an_admin_key() {
    let t = with_keys(AppOptions::offline()).await;
    let acme = bearer(&t.app, &t.acme);
    let admin = bearer(&t.app, &t.admin);

    for path in ["/v1/stats", "/v1/events", "/v1/tenants/acme/config"] {
        let (status, body) = acme.get(path).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        assert_eq!(error_code(&body), "ADMIN_REQUIRED", "{path}");
    }
    // Not even its own config: a tenant cannot raise its own limits.
    let (status, body) = acme
        .post("/v1/tenants/acme/config", &json!({"temperature": 1.0}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = acme
        .patch("/v1/tenants/acme/config", &json!({"temperature": 1.0}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");

    let (status, stats) = admin.get("/v1/stats").await;
    assert_eq!(status, StatusCode::OK, "{stats}");
    assert!(stats["total_calls"].is_u64(), "{stats}");
    let (status, config) = admin.get("/v1/tenants/acme/config").await;
    assert_eq!(status, StatusCode::OK, "{config}");
    assert_eq!(config["tenant"], "acme");
    assert_eq!(config["config"]["auto_respond_enabled"], true);
    let events = admin
        .request(Method::GET, "/v1/events")
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), StatusCode::OK);
    assert!(
        events.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
}

/// Acme's finished `market-brief` run; returns its id.
async fn acme_market_brief(acme: &Client) -> String {
    let (status, run) = acme
        .post(
            "/v1/workflows/market-brief/runs",
            &json!({"input": {"symbol": "AAPL"}, "wait": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    assert_eq!(run["status"], "succeeded", "{run}");
    run["id"].as_str().expect("run id").to_owned()
}

/// A workflow run belongs to the tenant that started it: another tenant
/// cannot list, read, follow or resume it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_workflow_run_is_not_found() {
    let t = with_keys(AppOptions::offline()).await;
    let acme = bearer(&t.app, &t.acme);
    let globex = bearer(&t.app, &t.globex);
    let id = acme_market_brief(&acme).await;

    let r = format!("/v1/workflows/runs/{id}");
    assert_not_found("GET run", globex.get(&r).await, &["AAPL"]);
    assert_not_found(
        "GET run events",
        globex.get(&format!("{r}/events")).await,
        &["AAPL"],
    );
    assert_not_found(
        "POST resume",
        globex.post(&format!("{r}/resume"), &json!({})).await,
        &["AAPL"],
    );
    let (_, runs) = globex.get("/v1/workflows/runs").await;
    assert_eq!(runs["count"], 0, "{runs}");
}

/// A run's tool calls are its tenant's: listed for it, not for another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_runs_calls_are_listed_for_the_tenant_that_started_it_only() {
    let t = with_keys(AppOptions::offline()).await;
    let acme = bearer(&t.app, &t.acme);
    let globex = bearer(&t.app, &t.globex);
    let id = acme_market_brief(&acme).await;

    let (_, calls) = acme.get(&format!("/v1/calls?workflow_id={id}")).await;
    assert_eq!(calls["count"], 3, "price, indicators and news: {calls}");
    let (_, calls) = globex.get(&format!("/v1/calls?workflow_id={id}")).await;
    assert_eq!(calls["count"], 0, "{calls}");
}

/// The trading tools keep a user's orders, portfolio and watchlist under
/// the bare `user_id`, which the caller chooses: another tenant naming the
/// same user id reads (and trades on) that account.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_user_account_is_not_reachable_by_naming_its_user_id() {
    let t = with_keys(AppOptions::offline()).await;
    let acme = bearer(&t.app, &t.acme);
    let globex = bearer(&t.app, &t.globex);
    let (status, order) = acme
        .post(
            "/v1/tools/create_paper_order/invoke",
            &json!({
                "user_id": "trader",
                "plan": "pro",
                "params": {"symbol": "AAPL", "side": "buy", "quantity": 1, "order_type": "market"}
            }),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{order}");
    let id = order["metadata"]["confirmation_id"].as_str().unwrap();
    let (status, done) = acme
        .post(
            &format!("/v1/confirmations/{id}"),
            &json!({"approve": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["status"], "executed", "{done}");

    let history = json!({"user_id": "trader", "plan": "pro", "params": {}});
    let (status, mine) = acme
        .post("/v1/tools/get_trade_history/invoke", &history)
        .await;
    assert_eq!(status, StatusCode::OK, "{mine}");
    assert_eq!(
        mine["output"]["data"]["trades"].as_array().unwrap().len(),
        1
    );
    let (status, theirs) = globex
        .post("/v1/tools/get_trade_history/invoke", &history)
        .await;
    assert_eq!(status, StatusCode::OK, "{theirs}");
    assert_eq!(
        theirs["output"]["data"]["trades"],
        json!([]),
        "globex reads acme's trader: {theirs}"
    );
}

// ---------------------------------------------------------------------------
// Tenant config reaches the model request
// ---------------------------------------------------------------------------

/// A stored tenant config that no longer reads (one another cadre version
/// wrote) fails closed, with one policy: the tenant's turns are refused
/// with the fix named (its budget and overrides are not silently
/// skipped: before, the turn ran with the defaults and no budget), other
/// tenants go on, and an admin's replacement lets it run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_tenant_config_refuses_its_turns_and_names_the_fix() {
    let model = MockModel::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let keys = create_keys(
        dir.path(),
        &[("acme", false), ("globex", false), ("ops", true)],
    )
    .await;
    {
        let store = support::store::open_store(dir.path());
        store
            .put_doc(
                "tenant_config",
                "acme",
                json!({"monthly_token_budget": 0, "temperature": "hot"}),
                true,
            )
            .await
            .expect("written");
    }
    let app = spawn_app(AppOptions::with_model(&model).data_dir(dir.path()));
    let acme = bearer(&app, &keys[0]);
    let globex = bearer(&app, &keys[1]);
    let admin = bearer(&app, &keys[2]);

    // Its plan allows only free meanwhile.
    let (status, body) = acme
        .post("/v1/sessions", &json!({"agent": "assistant"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let session = body["id"].as_str().unwrap().to_string();
    let (status, body) = acme.say(&session, "hello").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(error_code(&body), "STORAGE_UNAVAILABLE", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("tenant 'acme'") && message.contains("POST /v1/tenants/acme/config"),
        "{message}"
    );
    assert_eq!(model.request_count(), 0, "no model call for acme");

    model.push(Reply::text("Hi."));
    let other = pro_session(&globex, "assistant").await;
    say_ok(&globex, &other, "hello").await;

    let (status, body) = admin
        .post("/v1/tenants/acme/config", &json!({"temperature": 0.5}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    model.push(Reply::text("Hello again."));
    let answer = say_ok(&acme, &session, "hello").await;
    assert_eq!(answer["answer"], "Hello again.", "{answer}");
}

fn system_prompt(request: &Value) -> &str {
    let first = &request["messages"][0];
    assert_eq!(first["role"], "system", "{request}");
    first["content"].as_str().expect("system text")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_config_overrides_the_agent_in_its_model_requests_only() {
    let model = MockModel::start().await;
    let t = with_keys(AppOptions::with_model(&model)).await;
    let acme = bearer(&t.app, &t.acme);
    let globex = bearer(&t.app, &t.globex);
    let admin = bearer(&t.app, &t.admin);

    let (status, body) = admin
        .post(
            "/v1/tenants/acme/config",
            &json!({
                "custom_system_prompt": "You are Acme's bot.",
                "preferred_model": "acme-model",
                "temperature": 0.25,
                "max_response_tokens": 123,
                "tool_config": {"max_iterations": 1}
            }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["config"]["preferred_model"], "acme-model");
    assert_eq!(body["config"]["suggestions_enabled"], true, "defaults kept");

    // Acme's turn: one tool round allowed, so the second request forbids tools.
    model.push_all([
        Reply::tool_call("c1", "calculator", r#"{"expression":"6*7"}"#),
        Reply::text("It is 42."),
    ]);
    let session = pro_session(&acme, "assistant").await;
    let turn = say_ok(&acme, &session, "What is 6*7?").await;
    assert_eq!(turn["answer"], "It is 42.");
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    for r in &requests {
        assert_eq!(r["model"], "acme-model", "{r}");
        assert_eq!(r["temperature"], 0.25, "{r}");
        assert_eq!(r["max_completion_tokens"], 123, "{r}");
        assert!(
            system_prompt(r).starts_with("You are Acme's bot."),
            "{}",
            system_prompt(r)
        );
        assert!(!system_prompt(r).contains("helpful assistant"));
    }
    assert_eq!(requests[0]["tool_choice"], "auto");
    assert_eq!(requests[1]["tool_choice"], "none");

    // Globex's turn: the agent's own settings.
    model.push(Reply::text("Hello."));
    let other = pro_session(&globex, "assistant").await;
    say_ok(&globex, &other, "Hi").await;
    let r = &model.requests()[2];
    assert_eq!(r["model"], "mock-model", "{r}");
    assert!(r.get("temperature").is_none_or(Value::is_null), "{r}");
    assert!(
        r.get("max_completion_tokens").is_none_or(Value::is_null),
        "{r}"
    );
    assert!(
        system_prompt(r).starts_with("You are a helpful assistant."),
        "{}",
        system_prompt(r)
    );

    // A merge patch removes the temperature and keeps the rest.
    let (status, body) = admin
        .patch("/v1/tenants/acme/config", &json!({"temperature": null}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["config"]["temperature"].is_null(), "{body}");
    assert_eq!(body["config"]["preferred_model"], "acme-model");
    model.push(Reply::text("Again."));
    say_ok(&acme, &session, "And now?").await;
    let r = &model.requests()[3];
    assert!(r.get("temperature").is_none_or(Value::is_null), "{r}");
    assert_eq!(r["model"], "acme-model");
    assert_eq!(r["max_completion_tokens"], 123);

    // Bad changes are refused and change nothing.
    let refused = [
        ("PATCH", json!({"colour": "red"})),
        ("PATCH", json!({"temperature": 9})),
        ("POST", json!({"temperature": 9})),
        ("POST", json!({"tool_config": {"max_iterations": 0}})),
        ("PATCH", json!({"tool_config": {"nope": true}})),
    ];
    for (method, change) in refused {
        let (status, body) = if method == "POST" {
            admin.post("/v1/tenants/acme/config", &change).await
        } else {
            admin.patch("/v1/tenants/acme/config", &change).await
        };
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{method} {change}: {body}"
        );
        assert_eq!(error_code(&body), "VALIDATION_ERROR");
    }
    let (_, stored) = admin.get("/v1/tenants/acme/config").await;
    assert_eq!(stored["config"]["preferred_model"], "acme-model");
    assert_eq!(stored["config"]["max_response_tokens"], 123);
    assert!(stored["config"]["temperature"].is_null());

    let (status, body) = admin.get("/v1/tenants/not%20a%20tenant/config").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(model.overruns(), 0);
}

/// Suggestions are a model call of their own, made with the agent's prompt
/// and model: a tenant's `custom_system_prompt` and `preferred_model` do not
/// reach it, so an operator of Acme gets replies in the agent's voice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suggestions_use_the_tenants_prompt_and_model() {
    let model = MockModel::start().await;
    model.set_default(Some(Reply::text("One.\nTwo.\nThree.")));
    let t = with_keys(AppOptions::with_model(&model)).await;
    let acme = bearer(&t.app, &t.acme);
    let (status, body) = bearer(&t.app, &t.admin)
        .post(
            "/v1/tenants/acme/config",
            &json!({"custom_system_prompt": "You are Acme's bot.", "preferred_model": "acme-model"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let session = pro_session(&acme, "assistant").await;
    let (status, body) = acme
        .post(&format!("/v1/sessions/{session}/suggestions"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["suggestions"], json!(["One.", "Two.", "Three."]));
    let request = &model.requests()[0];
    assert_eq!(request["model"], "acme-model", "{request}");
    assert!(
        system_prompt(request).starts_with("You are Acme's bot."),
        "{}",
        system_prompt(request)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_lists_each_agent_with_its_model_and_no_api_key() {
    let model = MockModel::start().await;
    let t = with_keys(AppOptions::with_model(&model)).await;
    let (status, body) = bearer(&t.app, &t.acme).get("/v1/providers").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let providers = body["providers"].as_array().expect("providers");
    let agents: Vec<&str> = providers
        .iter()
        .map(|p| p["agent"].as_str().unwrap())
        .collect();
    for agent in [
        "assistant",
        "brokerage",
        "trading-copilot",
        "site-assistant",
    ] {
        assert!(agents.contains(&agent), "{agent} missing: {body}");
    }
    assert!(
        providers.iter().all(|p| p["model"] == "mock-model"),
        "{body}"
    );
    // `support::spawn_app` gives the mock endpoint the API key "test-key".
    assert!(!body.to_string().contains("test-key"), "{body}");
}

// ---------------------------------------------------------------------------
// The visitor WebSocket
// ---------------------------------------------------------------------------

async fn send_frame(ws: &mut Ws, frame: Value) {
    ws.send(Message::text(frame.to_string()))
        .await
        .expect("frame sent");
}

/// The next text frame, as JSON.
async fn next_frame(ws: &mut Ws) -> Value {
    loop {
        let message = tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("a frame in time")
            .expect("the socket is open")
            .expect("a readable frame");
        match message {
            Message::Text(text) => return serde_json::from_str(&text).expect("a JSON frame"),
            Message::Close(reason) => panic!("the server closed the socket: {reason:?}"),
            _ => continue,
        }
    }
}

/// Frames up to and including `turn_completed` (or an `error`).
async fn frames_of_turn(ws: &mut Ws) -> Vec<Value> {
    let mut frames = Vec::new();
    loop {
        let frame = next_frame(ws).await;
        let last = frame["type"] == "turn_completed" || frame["type"] == "error";
        frames.push(frame);
        if last {
            return frames;
        }
    }
}

fn types(frames: &[Value]) -> Vec<&str> {
    frames.iter().map(|f| f["type"].as_str().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_visitor_message_over_the_websocket_gets_an_answer_with_its_turn_events() {
    let app = spawn_app(AppOptions::offline());
    let session = pro_session(&anonymous(&app), "assistant").await;
    let mut ws = connect_ws(&app, &session, None).await.expect("connected");

    send_frame(
        &mut ws,
        json!({"type": "visitor_message", "content": "What is 6*7?"}),
    )
    .await;
    let decision = next_frame(&mut ws).await;
    assert_eq!(decision["type"], "auto_respond", "{decision}");
    assert_eq!(decision["respond"], true);
    assert_eq!(decision["reason"], "no operator is assigned");
    let frames = frames_of_turn(&mut ws).await;
    let kinds = types(&frames);
    assert_eq!(kinds.first(), Some(&"turn_started"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"turn_completed"), "{kinds:?}");
    let started = kinds.iter().position(|k| *k == "tool_call_started");
    let completed = kinds.iter().position(|k| *k == "tool_call_completed");
    assert!(
        started.is_some() && started < completed,
        "tool events in order: {kinds:?}"
    );
    let reply = &frames.last().unwrap()["reply"];
    assert!(reply["answer"].as_str().unwrap().contains("42"), "{reply}");
    assert_eq!(reply["tool_calls"][0]["name"], "calculator");

    let messages = history(&anonymous(&app), &session).await;
    assert_eq!(messages[0]["role"], "user");
    assert_eq!(messages[0]["content"], "What is 6*7?");
    assert_eq!(messages.last().unwrap()["content"], reply["answer"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assigned_operator_silences_auto_response_unless_the_tenant_answers_alongside() {
    let model = MockModel::start().await;
    model.set_default(Some(Reply::text("The bot answers.")));
    let app = spawn_app(AppOptions::with_model(&model));
    let caller = anonymous(&app);
    let session = pro_session(&caller, "assistant").await;
    let mut ws = connect_ws(&app, &session, None).await.expect("connected");

    send_frame(
        &mut ws,
        json!({"type": "assign_operator", "operator_id": "op1"}),
    )
    .await;
    let assigned = next_frame(&mut ws).await;
    assert_eq!(
        assigned,
        json!({"type": "operator_assigned", "operator_id": "op1"})
    );

    // With an operator on the session the visitor's message is only stored.
    send_frame(
        &mut ws,
        json!({"type": "visitor_message", "content": "Is anyone there?"}),
    )
    .await;
    let decision = next_frame(&mut ws).await;
    assert_eq!(decision["type"], "auto_respond", "{decision}");
    assert_eq!(decision["respond"], false, "{decision}");
    let stored = next_frame(&mut ws).await;
    assert_eq!(stored["type"], "message_stored", "{stored}");
    assert_eq!(stored["role"], "visitor");

    // The operator's reply is stored, under the operator's name, with no turn.
    send_frame(
        &mut ws,
        json!({"type": "operator_message", "content": "Hi, I am Olivia from support."}),
    )
    .await;
    let stored = next_frame(&mut ws).await;
    assert_eq!(stored["type"], "message_stored", "{stored}");
    assert_eq!(stored["role"], "operator");
    assert_eq!(model.request_count(), 0, "no model turn so far");
    let messages = history(&caller, &session).await;
    let operator = messages.last().unwrap();
    assert_eq!(operator["role"], "assistant", "{operator}");
    assert_eq!(operator["name"], "operator:op1", "{operator}");
    assert_eq!(operator["content"], "Hi, I am Olivia from support.");

    // The tenant answers alongside operators: the bot responds again, and
    // the model sees what the visitor and the operator said.
    let (status, body) = caller
        .patch(
            "/v1/tenants/default/config",
            &json!({"respond_with_operator": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    send_frame(
        &mut ws,
        json!({"type": "visitor_message", "content": "What are your hours?"}),
    )
    .await;
    let decision = next_frame(&mut ws).await;
    assert_eq!(decision["respond"], true, "{decision}");
    let frames = frames_of_turn(&mut ws).await;
    assert_eq!(
        frames.last().unwrap()["reply"]["answer"],
        "The bot answers.",
        "{frames:?}"
    );
    assert_eq!(model.request_count(), 1);
    let requests = model.requests();
    let sent: Vec<&str> = requests[0]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .skip(1)
        .map(|m| m["content"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        sent,
        [
            "Is anyone there?",
            "Hi, I am Olivia from support.",
            "What are your hours?"
        ]
    );

    // Auto-response off: never, operator or not.
    let (status, body) = caller
        .patch(
            "/v1/tenants/default/config",
            &json!({"auto_respond_enabled": false}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for assign in [true, false] {
        if !assign {
            send_frame(&mut ws, json!({"type": "unassign_operator"})).await;
            assert_eq!(next_frame(&mut ws).await["type"], "operator_unassigned");
        }
        send_frame(
            &mut ws,
            json!({"type": "visitor_message", "content": "Hello?"}),
        )
        .await;
        let decision = next_frame(&mut ws).await;
        assert_eq!(decision["respond"], false, "{decision}");
        assert!(
            decision["reason"].as_str().unwrap().contains("disabled"),
            "{decision}"
        );
        assert_eq!(next_frame(&mut ws).await["type"], "message_stored");
    }
    assert_eq!(model.request_count(), 1, "still no further model turn");
    assert_eq!(model.overruns(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_frame_gets_an_error_frame_and_the_socket_stays_usable() {
    let app = spawn_app(AppOptions::offline());
    let session = pro_session(&anonymous(&app), "assistant").await;
    let mut ws = connect_ws(&app, &session, None).await.expect("connected");

    let bad = [
        "not json".to_owned(),
        json!({"type": "dance"}).to_string(),
        json!({"type": "visitor_message"}).to_string(),
        json!({"type": "visitor_message", "content": "hi", "extra": 1}).to_string(),
        json!({"type": "visitor_message", "content": "   "}).to_string(),
        json!({"type": "operator_message", "content": ""}).to_string(),
    ];
    for frame in bad {
        ws.send(Message::text(frame.clone())).await.unwrap();
        let reply = next_frame(&mut ws).await;
        assert_eq!(reply["type"], "error", "{frame}: {reply}");
        assert_eq!(
            reply["error"]["code"], "VALIDATION_ERROR",
            "{frame}: {reply}"
        );
    }
    send_frame(
        &mut ws,
        json!({"type": "operator_message", "content": "Still here.", "operator_id": "op2"}),
    )
    .await;
    let stored = next_frame(&mut ws).await;
    assert_eq!(stored["type"], "message_stored", "{stored}");
    let messages = history(&anonymous(&app), &session).await;
    assert_eq!(
        messages.len(),
        1,
        "only the good frame stored: {messages:?}"
    );
    assert_eq!(messages[0]["name"], "operator:op2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_websocket_needs_a_key_when_keys_are_configured() {
    let t = with_keys(AppOptions::offline()).await;
    let session = pro_session(&bearer(&t.app, &t.acme), "assistant").await;
    match connect_ws(&t.app, &session, None).await {
        Err(tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), StatusCode::UNAUTHORIZED)
        }
        Err(e) => panic!("the upgrade failed otherwise: {e}"),
        Ok(_) => panic!("opened without a key"),
    }
    let mut ws = connect_ws(&t.app, &session, Some(&t.acme))
        .await
        .expect("connected with acme's key");
    send_frame(
        &mut ws,
        json!({"type": "visitor_message", "content": "What is 6*7?"}),
    )
    .await;
    assert_eq!(next_frame(&mut ws).await["respond"], true);
    let frames = frames_of_turn(&mut ws).await;
    let reply = &frames.last().unwrap()["reply"];
    assert!(
        reply["answer"].as_str().unwrap().contains("42"),
        "{frames:?}"
    );
}

// ---------------------------------------------------------------------------
// Suggestions and improve
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suggestions_are_three_replies_unless_the_tenant_turned_them_off() {
    let app = spawn_app(AppOptions::offline());
    let caller = anonymous(&app);
    let session = pro_session(&caller, "assistant").await;
    say_ok(&caller, &session, "What is 6*7?").await;
    let before = history(&caller, &session).await;

    let path = format!("/v1/sessions/{session}/suggestions");
    let (status, body) = caller.post(&path, &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["session_id"], session);
    let suggestions = body["suggestions"].as_array().expect("suggestions");
    assert_eq!(suggestions.len(), 3, "{body}");
    for s in suggestions {
        assert!(!s.as_str().expect("a string").trim().is_empty(), "{body}");
    }
    assert_eq!(history(&caller, &session).await, before, "nothing stored");

    let (status, body) = caller
        .patch(
            "/v1/tenants/default/config",
            &json!({"suggestions_enabled": false}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = caller.post(&path, &json!({})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(error_code(&body), "SUGGESTIONS_DISABLED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn improve_rewords_a_text_and_refuses_an_empty_one() {
    let app = spawn_app(AppOptions::offline());
    let caller = anonymous(&app);
    let (status, body) = caller
        .post("/v1/improve", &json!({"text": "hello  world how are you"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["text"], "Hello world how are you.");

    for text in ["", "   "] {
        let (status, body) = caller.post("/v1/improve", &json!({ "text": text })).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{text:?}: {body}");
        assert_eq!(error_code(&body), "VALIDATION_ERROR");
    }
    let (status, body) = caller
        .post("/v1/improve", &json!({"text": "hi", "agent": "nobody"}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(error_code(&body), "AGENT_NOT_FOUND");
}

// ---------------------------------------------------------------------------
// The real binary: keys from the CLI, and never in the logs
// ---------------------------------------------------------------------------

/// A `cadre` child process; dropping it kills the process.
struct Child(tokio::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.start_kill();
    }
}

fn cadre() -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_cadre"));
    for var in [
        "CADRE_MODEL_BASE_URL",
        "CADRE_MODEL_API_KEY",
        "OPENAI_API_KEY",
        "CADRE_MODEL",
        "CADRE_CONFIG",
        "CADRE_DATA_DIR",
        "CADRE_AGENTS_DIR",
        "CADRE_ADDR",
        "RUST_LOG",
    ] {
        command.env_remove(var);
    }
    command.stdin(Stdio::null()).kill_on_drop(true);
    command
}

/// Runs a one-off `cadre` command; asserts it succeeded, returns its stdout.
async fn run_cadre(args: &[&str]) -> String {
    let output = tokio::time::timeout(PATIENCE, cadre().args(args).output())
        .await
        .expect("the command finished in time")
        .expect("the command ran");
    assert!(
        output.status.success(),
        "cadre {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_authorization_headers_and_the_model_key_never_reach_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_arg = data.to_str().unwrap();
    let log_path = dir.path().join("cadre.log");

    let key = run_cadre(&["keys", "create", "--tenant", "acme", "--data-dir", data_arg]).await;
    let key = key.trim().to_owned();
    assert!(key.starts_with("cadre_"), "{key}");
    let listed = run_cadre(&["keys", "list", "--data-dir", data_arg]).await;
    assert!(listed.contains(key_id_of(&key)), "{listed}");
    assert!(listed.contains("acme"), "{listed}");
    assert!(!listed.contains(secret_of(&key)), "{listed}");

    let model = MockModel::start().await;
    model.push_all([
        Reply::tool_call("c1", "calculator", r#"{"expression":"6*7"}"#),
        Reply::text("6*7 = 42"),
    ]);
    let model_key = "sk-model-key-that-must-stay-secret-9f8e7d";
    let log = std::fs::File::create(&log_path).unwrap();
    let mut server = Child(
        cadre()
            .args(["serve", "--addr", "127.0.0.1:0", "--data-dir", data_arg])
            .arg("--agents")
            .arg(support::repo_agents())
            .env("RUST_LOG", "debug")
            .env("CADRE_MODEL_BASE_URL", model.base_url())
            .env("CADRE_MODEL_API_KEY", model_key)
            .env("CADRE_MODEL", "mock-model")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("cadre serve starts"),
    );
    let mut stdout = BufReader::new(server.0.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(PATIENCE, stdout.read_line(&mut line))
        .await
        .expect("the address line in time")
        .expect("stdout read");
    let addr = line
        .trim()
        .strip_prefix("cadre listening on http://")
        .unwrap_or_else(|| {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            panic!("no address line: {line:?}; log:\n{log}")
        })
        .to_owned();
    let base = format!("http://{addr}");

    let acme = Client::new(&base).with_key(&key);
    let session = pro_session(&acme, "assistant").await;
    let turn = say_ok(&acme, &session, "What is 6*7?").await;
    assert_eq!(turn["answer"], "6*7 = 42");
    let bad_key = forged(&key);
    let (status, body) = Client::new(&base)
        .with_key(&bad_key)
        .get(&format!("/v1/sessions/{session}"))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(!body.to_string().contains(&bad_key), "{body}");
    let (status, _) = Client::new(&base)
        .with_authorization(format!("Token {key}"))
        .get("/v1/calls")
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // A graceful stop (SIGTERM), so every log line is written.
    let pid = server.0.id().expect("a running server") as libc::pid_t;
    // SAFETY: signalling our own child process by its id.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(PATIENCE, server.0.wait())
        .await
        .expect("the server stopped in time")
        .expect("reaped");
    assert!(status.success(), "exit status {status}");

    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(log.contains("DEBUG"), "debug logging was on:\n{log}");
    for secret in [
        key.as_str(),
        secret_of(&key),
        bad_key.as_str(),
        secret_of(&bad_key),
        model_key,
    ] {
        assert!(!log.contains(secret), "the log holds {secret:?}:\n{log}");
    }
    assert!(
        !log.contains("Bearer "),
        "an Authorization value is logged:\n{log}"
    );

    // The session's summary, read from the data dir by the CLI.
    let printed = run_cadre(&["sessions", "summary", &session, "--data-dir", data_arg]).await;
    let summary: Value = serde_json::from_str(&printed).expect("summary JSON");
    assert_eq!(summary["session_id"], session);
    assert_eq!(summary["message_count"], 4, "{summary}");
    assert_eq!(summary["turns"], 1, "{summary}");
    assert_eq!(summary["tool_usage_summary"]["total_calls"], 1, "{summary}");
    assert_eq!(
        summary["tool_usage_summary"]["tool_usage"]["calculator"], 1,
        "{summary}"
    );
    assert_eq!(model.overruns(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_tool_answer_is_never_shared_between_tenants() {
    let t = with_keys(AppOptions::offline()).await;
    let acme = bearer(&t.app, &t.acme);
    let globex = bearer(&t.app, &t.globex);
    // `get_price` (category market) is cached for 5 s; same user, same params.
    let call = json!({"user_id": "u1", "params": {"symbol": "AAPL"}});
    let path = "/v1/tools/get_price/invoke";
    let (status, first) = acme.post(path, &call).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["metadata"]["cached"], false);
    let (_, again) = acme.post(path, &call).await;
    assert_eq!(
        again["metadata"]["cached"], true,
        "the cache works: {again}"
    );
    let (status, theirs) = globex.post(path, &call).await;
    assert_eq!(status, StatusCode::OK, "{theirs}");
    assert_eq!(
        theirs["metadata"]["cached"], false,
        "globex got acme's cached answer: {theirs}"
    );
    assert_ne!(theirs["executed_at"], first["executed_at"]);
}
