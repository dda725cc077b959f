//! `Idempotency-Key` on the POSTs that do something (`src/http/idempotency.rs`):
//! a retry with the same key and body gets the first answer and runs
//! nothing; another body is 422; keys are per tenant; a retry racing the
//! first waits for it; answers that say nothing happened (5xx, 409) are
//! not stored; the stored answer outlives a restart.

mod support;

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::gate::gate_tool;
use support::{AppOptions, Client, MockModel, Reply, agent_toml, agents_dir, spawn_app};

const PATIENCE: Duration = Duration::from_secs(10);

/// A keyed POST: status, body, and whether it was a replay.
async fn keyed(client: &Client, path: &str, key: &str, body: &Value) -> (StatusCode, Value, bool) {
    let response = client
        .request(Method::POST, path)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .expect("request sent");
    answer(response).await
}

async fn answer(response: reqwest::Response) -> (StatusCode, Value, bool) {
    let status = response.status();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let body = response.json().await.expect("a JSON body");
    (status, body, replayed)
}

fn spawn_keyed(
    client: &Client,
    path: &str,
    key: &str,
    body: Value,
) -> tokio::task::JoinHandle<(StatusCode, Value, bool)> {
    let (client, path, key) = (client.clone(), path.to_string(), key.to_string());
    tokio::spawn(async move { keyed(&client, &path, &key, &body).await })
}

async fn joined<T>(task: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(PATIENCE, task)
        .await
        .expect("the request finished in time")
        .expect("the request task did not panic")
}

/// The messages of a session by role.
async fn roles(client: &Client, session: &str) -> Vec<String> {
    let (status, body) = client
        .get(&format!("/v1/sessions/{session}/messages"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_session_creations_with_one_key_make_one_session() {
    let app = spawn_app(AppOptions::offline());
    let body = json!({"agent": "assistant"});
    let (status, first, replayed) = keyed(&app.client, "/v1/sessions", "create-1", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert!(!replayed, "the first request runs");
    let (status, again, replayed) = keyed(&app.client, "/v1/sessions", "create-1", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    assert!(replayed, "the retry is answered from the store");
    assert_eq!(again, first);
    let (_, list) = app.get("/v1/sessions").await;
    assert_eq!(list["count"], 1, "{list}");
    // Without a key, each request runs.
    app.session("assistant").await;
    let (_, list) = app.get("/v1/sessions").await;
    assert_eq!(list["count"], 2, "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_message_makes_one_user_message_and_one_answer() {
    let model = MockModel::start().await;
    model.push(Reply::text("the one answer"));
    let app = spawn_app(AppOptions::with_model(&model));
    let session = app.session("assistant").await;
    let path = format!("/v1/sessions/{session}/messages");
    let body = json!({"content": "hello"});
    let (status, first, _) = keyed(&app.client, &path, "msg-1", &body).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, again, replayed) = keyed(&app.client, &path, "msg-1", &body).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert!(replayed);
    assert_eq!(again, first);
    assert_eq!(again["answer"], "the one answer");
    assert_eq!(model.request_count(), 1, "the model was called once");
    assert_eq!(roles(&app.client, &session).await, ["user", "assistant"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_used_again_for_another_request_is_422() {
    let app = spawn_app(AppOptions::offline());
    let (status, _, _) = keyed(
        &app.client,
        "/v1/sessions",
        "k",
        &json!({"agent": "assistant"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let other_body = json!({"agent": "assistant", "metadata": {"x": 1}});
    let (status, body, _) = keyed(&app.client, "/v1/sessions", "k", &other_body).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "IDEMPOTENCY_KEY_REUSED");
    // Another route with the same key is another request too.
    let (status, body, _) = keyed(
        &app.client,
        "/v1/tools/calculator/invoke",
        "k",
        &json!({"params": {"expression": "1+1"}}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "IDEMPOTENCY_KEY_REUSED");
    let (_, list) = app.get("/v1/sessions").await;
    assert_eq!(list["count"], 1, "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_per_tenant_and_an_answer_replays_to_its_own_api_key_only() {
    let app = spawn_app(AppOptions::offline());
    let (status, made) = app
        .post("/v1/keys", &json!({"tenant": "ops", "admin": true}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let admin = app.client.with_key(made["key"].as_str().unwrap());
    let mut tenants = Vec::new();
    for tenant in ["acme", "globex"] {
        let (status, made) = admin.post("/v1/keys", &json!({"tenant": tenant})).await;
        assert_eq!(status, StatusCode::CREATED, "{made}");
        tenants.push(app.client.with_key(made["key"].as_str().unwrap()));
    }
    let body = json!({"agent": "assistant"});
    let (status, acme, replayed) = keyed(&tenants[0], "/v1/sessions", "same", &body).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{acme}");
    let (status, globex, replayed) = keyed(&tenants[1], "/v1/sessions", "same", &body).await;
    assert_eq!((status, replayed), (StatusCode::CREATED, false), "{globex}");
    assert_eq!(acme["tenant"], "acme");
    assert_eq!(globex["tenant"], "globex");
    assert_ne!(acme["id"], globex["id"]);
    let (_, again, replayed) = keyed(&tenants[1], "/v1/sessions", "same", &body).await;
    assert!(replayed);
    assert_eq!(again, globex);

    // Another key of acme's (a free one) does not replay the first key's
    // answer: the stored answer is that key's.
    let (status, made) = admin
        .post("/v1/keys", &json!({"tenant": "acme", "plan": "free"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let free = app.client.with_key(made["key"].as_str().unwrap());
    let (status, body, replayed) = keyed(&free, "/v1/sessions", "same", &body).await;
    assert_eq!(
        (status, replayed),
        (StatusCode::UNPROCESSABLE_ENTITY, false),
        "{body}"
    );
    assert_eq!(body["error"]["code"], "IDEMPOTENCY_KEY_REUSED", "{body}");
}

/// The first request holds its turn in a gate tool; nine retries come in
/// while it runs: eight wait (the ninth is 429 at once, which is how the
/// test knows the eight are waiting), and get the first answer when the
/// gate opens. The turn ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_racing_the_first_request_wait_for_its_answer() {
    let (def, handler, mut gate) = gate_tool("gate", "custom");
    let agents = agents_dir(&[("g.toml", &agent_toml("gated", &["gate"], 3))]);
    let model = MockModel::start().await;
    model.push_all([
        Reply::tool_call("call_1", "gate", r#"{"label":"first"}"#),
        Reply::text("after the gate"),
    ]);
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .tool(def, handler),
    );
    let session = app.session("gated").await;
    let path = format!("/v1/sessions/{session}/messages");
    let body = json!({"content": "go"});
    let first = spawn_keyed(&app.client, &path, "race", body.clone());
    assert_eq!(gate.started().await, "first");

    let mut retries: Vec<_> = (0..9)
        .map(|_| spawn_keyed(&app.client, &path, "race", body.clone()))
        .collect();
    let (over, index, _) =
        tokio::time::timeout(PATIENCE, futures::future::select_all(&mut retries))
            .await
            .expect("the retry over the bound is answered at once");
    retries.remove(index);
    let (status, over_body, _) = over.expect("task");
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{over_body}");
    assert_eq!(over_body["error"]["code"], "RATE_LIMITED");

    gate.open_one();
    let (status, answer_body, replayed) = joined(first).await;
    assert_eq!(status, StatusCode::OK, "{answer_body}");
    assert!(!replayed);
    assert_eq!(answer_body["answer"], "after the gate");
    for retry in retries {
        let (status, body, replayed) = joined(retry).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(replayed);
        assert_eq!(body, answer_body);
    }
    assert_eq!(
        model.request_count(),
        2,
        "one turn: a tool round and the answer"
    );
    let roles = roles(&app.client, &session).await;
    assert_eq!(
        roles.iter().filter(|r| *r == "user").count(),
        1,
        "{roles:?}"
    );
    assert_eq!(roles.last().map(String::as_str), Some("assistant"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_key_is_400() {
    let app = spawn_app(AppOptions::offline());
    let body = json!({"agent": "assistant"});
    let long = "k".repeat(256);
    for key in [
        reqwest::header::HeaderValue::from_static(""),
        reqwest::header::HeaderValue::from_str(&long).unwrap(),
        reqwest::header::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        reqwest::header::HeaderValue::from_bytes(b"tab\there").unwrap(),
    ] {
        let response = app
            .client
            .request(Method::POST, "/v1/sessions")
            .header("Idempotency-Key", key.clone())
            .json(&body)
            .send()
            .await
            .unwrap();
        let (status, error, _) = answer(response).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{key:?}: {error}");
        assert_eq!(error["error"]["code"], "IDEMPOTENCY_KEY_INVALID");
    }
    let response = app
        .client
        .request(Method::POST, "/v1/sessions")
        .header("Idempotency-Key", "a")
        .header("Idempotency-Key", "b")
        .json(&body)
        .send()
        .await
        .unwrap();
    let (status, error, _) = answer(response).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    // 255 printable characters, a space inside, are a key.
    let longest = format!("a {}", "k".repeat(253));
    let (status, made, _) = keyed(&app.client, "/v1/sessions", &longest, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let (_, list) = app.get("/v1/sessions").await;
    assert_eq!(list["count"], 1, "nothing ran for a refused key: {list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_answer_is_not_stored_and_the_retry_runs() {
    let model = MockModel::start().await;
    model.push_all([
        Reply::error(400, "invalid_request_error", "no"),
        Reply::text("second try"),
    ]);
    let app = spawn_app(AppOptions::with_model(&model));
    let session = app.session("assistant").await;
    let path = format!("/v1/sessions/{session}/messages");
    let body = json!({"content": "hi"});
    let (status, failed, _) = keyed(&app.client, &path, "m", &body).await;
    assert!(status.is_server_error(), "{status} {failed}");
    let (status, ok, replayed) = keyed(&app.client, &path, "m", &body).await;
    assert_eq!(status, StatusCode::OK, "{ok}");
    assert!(!replayed, "a 5xx is not replayed: the retry ran");
    assert_eq!(ok["answer"], "second try");
    assert_eq!(model.request_count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_409_answer_is_not_stored_and_the_retry_runs() {
    let (def, handler, mut gate) = gate_tool("gate", "custom");
    let agents = agents_dir(&[(
        "r.toml",
        &format!(
            "{}multitask = \"reject\"\n",
            agent_toml("strict", &["gate"], 3)
        ),
    )]);
    let model = MockModel::start().await;
    model.push_all([
        Reply::tool_call("call_1", "gate", r#"{"label":"first"}"#),
        Reply::text("first answer"),
        Reply::text("second answer"),
    ]);
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .tool(def, handler),
    );
    let session = app.session("strict").await;
    let path = format!("/v1/sessions/{session}/messages");
    let first = app.client.spawn_post(&path, json!({"content": "first"}));
    assert_eq!(gate.started().await, "first");
    let body = json!({"content": "second"});
    let (status, busy, _) = keyed(&app.client, &path, "second", &body).await;
    assert_eq!(status, StatusCode::CONFLICT, "{busy}");
    gate.open_one();
    let (status, _) = joined(first).await;
    assert_eq!(status, StatusCode::OK);
    let (status, ok, replayed) = keyed(&app.client, &path, "second", &body).await;
    assert_eq!(status, StatusCode::OK, "{ok}");
    assert!(!replayed, "a 409 is not replayed: the retry ran");
    assert_eq!(ok["answer"], "second answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_answer_outlives_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let body = json!({"agent": "assistant"});
    let first = {
        let app = spawn_app(AppOptions::offline().data_dir(data.path()));
        let (status, first, _) = keyed(&app.client, "/v1/sessions", "durable", &body).await;
        assert_eq!(status, StatusCode::CREATED, "{first}");
        first
    };
    let app = spawn_app(AppOptions::offline().data_dir(data.path()));
    let (status, again, replayed) = keyed(&app.client, "/v1/sessions", "durable", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    assert!(replayed);
    assert_eq!(again, first);
    let (_, list) = app.get("/v1/sessions").await;
    assert_eq!(list["count"], 1, "{list}");
}

/// An app whose agent `gated` calls the gate tool once (the model asks
/// for it, then answers "after the gate"), with server settings `config`.
async fn gated(
    config: &str,
) -> (
    support::TestApp,
    MockModel,
    support::gate::Gate,
    tempfile::TempDir,
) {
    let (def, handler, gate) = gate_tool("gate", "custom");
    let agents = agents_dir(&[("g.toml", &agent_toml("gated", &["gate"], 3))]);
    let model = MockModel::start().await;
    model.push_all([
        Reply::tool_call("call_1", "gate", r#"{"label":"first"}"#),
        Reply::text("after the gate"),
    ]);
    let mut options = AppOptions::with_model(&model)
        .agents(agents.path())
        .tool(def, handler);
    if !config.is_empty() {
        options = options.config_toml(config);
    }
    (spawn_app(options), model, gate, agents)
}

/// Issue #29 (1): a retry waiting for the first request with its key is
/// woken when the first ends with nothing to share (here its client gave
/// up while the turn held a tool): it runs in the first one's place, finds
/// the turn by its key, and answers with the turn's answer; the turn ran
/// once. Before the fix the waiters held the channel's sender, so it never
/// closed and the retry waited forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_waiting_for_a_first_request_whose_client_gave_up_gets_the_answer() {
    let (app, model, mut gate, _agents) = gated("").await;
    let session = app.session("gated").await;
    let path = format!("/v1/sessions/{session}/messages");
    let body = json!({"content": "go"});
    let impatient = app.client.clone().with_timeout(Duration::from_millis(1500));
    let first = {
        let (path, body) = (path.clone(), body.clone());
        tokio::spawn(async move {
            impatient
                .request(Method::POST, &path)
                .header("Idempotency-Key", "gave-up")
                .json(&body)
                .send()
                .await
        })
    };
    assert_eq!(gate.started().await, "first");
    let retry = spawn_keyed(&app.client, &path, "gave-up", body.clone());
    let gave_up = joined(first).await;
    assert!(
        gave_up.as_ref().is_err_and(reqwest::Error::is_timeout),
        "the first client gives up while the gate holds: {gave_up:?}"
    );
    gate.open_one();
    let (status, answer, _) = joined(retry).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["answer"], "after the gate");
    assert_eq!(model.request_count(), 2, "the turn ran once");
    let roles = roles(&app.client, &session).await;
    assert_eq!(
        roles.iter().filter(|r| *r == "user").count(),
        1,
        "{roles:?}"
    );
}

/// Issue #29 (1): no retry waits without a bound. While the first request
/// runs (a tool holds its turn), a retry with its key answers 409
/// `IDEMPOTENCY_KEY_IN_USE` with `Retry-After` after `MAX_WAIT` (30 s)
/// instead of holding its connection for as long as the turn takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_waits_for_the_first_request_at_most_max_wait() {
    // The gate holds longer than the wait bound.
    let (app, _model, mut gate, _agents) = gated("[executor]\ndefault_timeout_s = 90.0\n").await;
    let session = app.session("gated").await;
    let path = format!("/v1/sessions/{session}/messages");
    let body = json!({"content": "go"});
    let first = spawn_keyed(&app.client, &path, "held", body.clone());
    assert_eq!(gate.started().await, "first");
    let started = std::time::Instant::now();
    let response = app
        .client
        .clone()
        .with_timeout(Duration::from_secs(120))
        .request(Method::POST, &path)
        .header("Idempotency-Key", "held")
        .json(&body)
        .send()
        .await
        .expect("the retry is answered");
    let waited = started.elapsed();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert_eq!(
        response.headers().get("retry-after").map(|v| v.as_bytes()),
        Some(&b"1"[..])
    );
    let (_, refused, _) = answer(response).await;
    assert_eq!(
        refused["error"]["code"], "IDEMPOTENCY_KEY_IN_USE",
        "{refused}"
    );
    assert!(
        waited >= Duration::from_secs(29) && waited < Duration::from_secs(100),
        "the retry waited {waited:?}"
    );
    gate.open_one();
    let (status, answered, _) = joined(first).await;
    assert_eq!(status, StatusCode::OK, "{answered}");
}
