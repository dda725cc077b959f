//! Event streams per caller are capped (`[api_limit] max_streams`): over the
//! cap an SSE request is a 429 `TOO_MANY_STREAMS` JSON error before anything
//! starts (no turn runs), the count spans every SSE endpoint, and a stream
//! that ends or whose client goes away frees its slot.

mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::gate::gate_tool;
use support::{AppOptions, MockModel, Reply, TestApp, agent_toml, agents_dir, spawn_app};

const PATIENCE: Duration = Duration::from_secs(10);

/// Opens `GET /v1/events` and waits for its headers.
async fn open_events(app: &TestApp) -> reqwest::Response {
    app.client
        .get(format!("{}/v1/events", app.base))
        .send()
        .await
        .expect("request sent")
}

async fn assert_too_many(response: reqwest::Response) {
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: Value = response.json().await.expect("a JSON error body");
    assert_eq!(body["error"]["code"], "TOO_MANY_STREAMS", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
}

/// Reads a stream to its end; returns its text.
async fn read_to_end(response: reqwest::Response) -> String {
    let read = async {
        let mut body = response.bytes_stream();
        let mut bytes = Vec::new();
        while let Some(chunk) = body.next().await {
            bytes.extend_from_slice(&chunk.expect("stream chunk"));
        }
        String::from_utf8(bytes).expect("UTF-8")
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .expect("the stream ended in time")
}

/// Retries `open` while it is refused for too many streams (the server
/// frees a slot when it drops the stream, just after the client saw it end).
async fn open_when_free<F, Fut>(open: F) -> reqwest::Response
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = reqwest::Response>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        let response = open().await;
        if response.status() != StatusCode::TOO_MANY_REQUESTS {
            return response;
        }
        assert!(Instant::now() < deadline, "the slot was never freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_cap_an_sse_request_is_429_and_no_turn_runs() {
    let model = MockModel::start().await;
    let agents = agents_dir(&[("bot.toml", &agent_toml("bot", &[], 3))]);
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .config_toml("[api_limit]\nmax_streams = 2\n"),
    );
    let session = app.session("bot").await;

    let first = open_events(&app).await;
    assert_eq!(first.status(), StatusCode::OK);
    let second = open_events(&app).await;
    assert_eq!(second.status(), StatusCode::OK);

    assert_too_many(open_events(&app).await).await;
    // The cap spans endpoints: a streamed turn is refused before it runs.
    assert_too_many(app.post_streaming(&session, "hello").await).await;
    assert_eq!(model.request_count(), 0);
    let (_, history) = app.get(&format!("/v1/sessions/{session}/messages")).await;
    assert_eq!(history["messages"], json!([]));
    // Requests that do not stream are not counted.
    model.push(Reply::text("plain"));
    let (status, body) = app.say(&session, "not streamed").await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // A client that goes away frees its slot.
    drop(first);
    let third = open_when_free(|| open_events(&app)).await;
    assert_eq!(third.status(), StatusCode::OK);
    assert_too_many(open_events(&app).await).await;
    drop((second, third));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_turn_holds_a_slot_until_it_ends() {
    let (def, handler, mut gate) = gate_tool("gate", "custom");
    let model = MockModel::start().await;
    model.push_all([
        Reply::tool_call("call_1", "gate", r#"{"label":"held"}"#),
        Reply::text("first answer"),
        Reply::text("second answer"),
    ]);
    let agents = agents_dir(&[("bot.toml", &agent_toml("bot", &["gate"], 3))]);
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .tool(def, handler)
            .config_toml("[api_limit]\nmax_streams = 1\n"),
    );
    let session = app.session("bot").await;

    let turn = app.post_streaming(&session, "first").await;
    assert_eq!(turn.status(), StatusCode::OK);
    assert_eq!(gate.started().await, "held");
    // While the turn streams, the caller has no slot left, on any endpoint.
    assert_too_many(open_events(&app).await).await;
    gate.open_one();
    let text = read_to_end(turn).await;
    assert!(text.contains("event: turn_completed"), "{text}");
    assert!(text.contains("first answer"), "{text}");

    // It ended: the slot is free for the next stream.
    let next = open_when_free(|| app.post_streaming(&session, "second")).await;
    assert_eq!(next.status(), StatusCode::OK);
    let text = read_to_end(next).await;
    assert!(text.contains("second answer"), "{text}");
    assert_eq!(model.overruns(), 0);
}

/// With API keys the cap is per key, and a workflow run's event stream
/// counts like the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_is_per_api_key_and_counts_workflow_run_events() {
    let data = tempfile::tempdir().unwrap();
    let keys = {
        let store = cadre::store::Store::open(data.path()).expect("open the data dir");
        let mut keys = Vec::new();
        for tenant in ["acme", "globex"] {
            let (key, _) = cadre::tenants::create_key(&store, tenant, true)
                .await
                .expect("key created");
            keys.push(key);
        }
        keys
    };
    let agents = agents_dir(&[("bot.toml", &agent_toml("bot", &[], 3))]);
    std::fs::create_dir(agents.path().join("workflows")).unwrap();
    std::fs::write(
        agents.path().join("workflows/sum.toml"),
        "name = \"sum\"\n[[nodes]]\nid = \"add\"\ntool = \"calculator\"\nparams = { expression = \"1+1\" }\n",
    )
    .unwrap();
    let app = spawn_app(
        AppOptions::offline()
            .agents(agents.path())
            .data_dir(data.path())
            .config_toml("[api_limit]\nmax_streams = 1\n"),
    );
    let get = |key: &str, path: &str| {
        app.client
            .get(format!("{}{path}", app.base))
            .bearer_auth(key)
            .send()
    };
    let (acme, globex) = (&keys[0], &keys[1]);
    let run = app
        .client
        .post(format!("{}/v1/workflows/sum/runs", app.base))
        .bearer_auth(acme)
        .json(&json!({"input": {}, "wait": true}))
        .send()
        .await
        .expect("run started");
    assert_eq!(run.status(), StatusCode::CREATED);
    let run: Value = run.json().await.unwrap();
    let run_events = format!("/v1/workflows/runs/{}/events", run["id"].as_str().unwrap());

    let held = get(acme, "/v1/events").await.expect("request sent");
    assert_eq!(held.status(), StatusCode::OK);
    assert_too_many(get(acme, &run_events).await.expect("request sent")).await;
    // Another key has slots of its own.
    let other = get(globex, "/v1/events").await.expect("request sent");
    assert_eq!(other.status(), StatusCode::OK);

    drop(held);
    let events =
        open_when_free(|| async { get(acme, &run_events).await.expect("request sent") }).await;
    assert_eq!(events.status(), StatusCode::OK);
    let text = read_to_end(events).await;
    assert!(text.starts_with("event: snapshot"), "{text}");
    drop(other);
}
