//! Event streams per caller are capped (`[api_limit] max_streams`): over the
//! cap an SSE request is a 429 `TOO_MANY_STREAMS` JSON error before anything
//! starts (no turn runs), the count spans every SSE endpoint and the visitor
//! WebSocket (whose upgrade is refused with the same 429), and a stream that
//! ends or whose client goes away frees its slot, a WebSocket when it closes.

mod support;

use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::gate::gate_tool;
use support::ws::{Ws, connect_ws};
use support::{AppOptions, MockModel, Reply, TestApp, agent_toml, agents_dir, spawn_app};
use tokio_tungstenite::tungstenite::{self, Message};

const PATIENCE: Duration = Duration::from_secs(10);

/// Opens `GET /v1/events` and waits for its headers.
async fn open_events(app: &TestApp) -> reqwest::Response {
    app.client
        .request(Method::GET, "/v1/events")
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

/// Retries `open` while it answers `None`, refused for too many streams
/// (the server frees a slot when it drops the stream or the socket, just
/// after the client saw it end).
async fn when_free<T, F, Fut>(open: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(opened) = open().await {
            return opened;
        }
        assert!(Instant::now() < deadline, "the slot was never freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An SSE request, retried while it is refused for too many streams.
async fn open_when_free<F, Fut>(open: F) -> reqwest::Response
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = reqwest::Response>,
{
    when_free(|| {
        let response = open();
        async move {
            let response = response.await;
            (response.status() != StatusCode::TOO_MANY_REQUESTS).then_some(response)
        }
    })
    .await
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
        let store = support::store::open_store(data.path());
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
    let get = |key: &str, path: &str| app.with_key(key).request(Method::GET, path).send();
    let (acme, globex) = (&keys[0], &keys[1]);
    let run = app
        .with_key(acme)
        .request(Method::POST, "/v1/workflows/sum/runs")
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

/// [`connect_ws`], retried while the upgrade is refused for too many
/// streams.
async fn connect_when_free(app: &TestApp, session: &str) -> Ws {
    when_free(|| async move {
        match connect_ws(app, session, None).await {
            Ok(ws) => Some(ws),
            Err(tungstenite::Error::Http(r)) if r.status() == StatusCode::TOO_MANY_REQUESTS => None,
            Err(e) => panic!("the socket is not upgraded: {e}"),
        }
    })
    .await
}

/// A well-formed WebSocket upgrade request sent as plain HTTP, so a refusal
/// comes back whole: status and JSON body.
async fn upgrade_request(app: &TestApp, session: &str) -> reqwest::Response {
    app.client
        .request(Method::GET, &format!("/v1/sessions/{session}/ws"))
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .send()
        .await
        .expect("request sent")
}

/// One frame round trip: the socket is served, not only counted.
async fn round_trip(ws: &mut Ws) {
    ws.send(Message::text(
        json!({"type": "unassign_operator"}).to_string(),
    ))
    .await
    .expect("frame sent");
    let reply = tokio::time::timeout(PATIENCE, ws.next())
        .await
        .expect("a frame in time")
        .expect("the socket is open")
        .expect("a readable frame");
    let reply: Value = serde_json::from_str(reply.to_text().expect("a text frame")).unwrap();
    assert_eq!(reply["type"], "operator_unassigned", "{reply}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_holds_a_slot_until_it_closes_and_over_the_cap_is_refused_before_upgrading() {
    let model = MockModel::start().await;
    let agents = agents_dir(&[("bot.toml", &agent_toml("bot", &[], 3))]);
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .config_toml("[api_limit]\nmax_streams = 1\n"),
    );
    let session = app.session("bot").await;

    let mut socket = connect_ws(&app, &session, None)
        .await
        .expect("the socket is upgraded");
    round_trip(&mut socket).await;
    // The socket holds the caller's only slot: another upgrade and an SSE
    // stream are refused.
    assert_too_many(upgrade_request(&app, &session).await).await;
    assert_too_many(open_events(&app).await).await;
    round_trip(&mut socket).await;

    // Closed, it frees its slot.
    socket.close(None).await.expect("close sent");
    drop(socket);
    let events = open_when_free(|| open_events(&app)).await;
    assert_eq!(events.status(), StatusCode::OK);
    // An SSE stream holds the slot against a socket as well.
    assert_too_many(upgrade_request(&app, &session).await).await;
    drop(events);
    let mut socket = connect_when_free(&app, &session).await;
    round_trip(&mut socket).await;
    assert_eq!(model.request_count(), 0);
}
