//! Hostile load on one session, one socket, one key: the queue of a
//! session is bounded (`[sessions] max_queued_turns`, 429
//! `CONVERSATION_QUEUE_FULL` past it), a queued turn whose client left
//! never runs, WebSocket frames count against the caller's rate limit, and
//! `GET /mcp` streams count against `[api_limit] max_streams`.
//!
//! A running turn is held by a gate tool (the model asks for it; the test
//! opens it), so every "queued" is known, never waited for with a sleep.
//! The RSS under the queue attack is measured by `benches/queue_rss.sh`
//! against the real binary, not asserted here.

mod support;

use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::gate::{Gate, gate_tool};
use support::ws::connect_ws;
use support::{AppOptions, MockModel, Reply, TestApp, agent_toml, agents_dir, spawn_app};
use tokio_tungstenite::tungstenite::Message;

const PATIENCE: Duration = Duration::from_secs(10);

/// An app whose agent `gated` may call the gate tool, with `config` (TOML).
async fn gated_app(config: &str) -> (TestApp, MockModel, Gate, tempfile::TempDir) {
    let model = MockModel::start().await;
    let agents = agents_dir(&[("gated.toml", &agent_toml("gated", &["gate"], 5))]);
    let (def, handler, gate) = gate_tool("gate", "test");
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .tool(def, handler)
            .config_toml(config),
    );
    (app, model, gate, agents)
}

/// Starts a turn that holds the session until the gate opens; returns once
/// it runs. Its model replies are scripted here: the gate call, then `done`.
async fn hold_the_session(
    app: &TestApp,
    model: &MockModel,
    gate: &mut Gate,
    session: &str,
) -> tokio::task::JoinHandle<(StatusCode, Value)> {
    model.push(Reply::tool_call("c1", "gate", r#"{"label":"held"}"#));
    model.push(Reply::text("held turn done"));
    let running = app.client.spawn_post(
        &format!("/v1/sessions/{session}/messages"),
        json!({"content": "hold the session"}),
    );
    assert_eq!(gate.started().await, "held");
    running
}

/// Reads an SSE turn to its end; returns its text.
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

/// Every message content of the session, in order.
async fn contents(app: &TestApp, session: &str) -> Vec<String> {
    let sessions = app.runtime.as_ref().expect("running").sessions();
    sessions
        .history(&cadre::identity::Scope::runtime(), session, 0, usize::MAX)
        .await
        .expect("history")
        .into_iter()
        .filter_map(|m| m.message.content)
        .collect()
}

/// Whether any request the model received mentions `text`.
fn model_saw(model: &MockModel, text: &str) -> bool {
    model
        .requests()
        .iter()
        .any(|r| r.to_string().contains(text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_queues_at_most_max_queued_turns_then_answers_429() {
    let (app, model, mut gate, _agents) = gated_app("").await;
    let session = app.session("gated").await;
    let running = hold_the_session(&app, &model, &mut gate, &session).await;

    // A streamed turn answers its headers once it is queued: eight are.
    let mut queued = Vec::new();
    for i in 0..8 {
        model.push(Reply::text(&format!("answer {i}")));
        let response = app
            .client
            .post_streaming(&session, &format!("queued {i}"))
            .await;
        assert_eq!(response.status(), StatusCode::OK, "turn {i} is queued");
        queued.push(response);
    }
    let (status, body) = tokio::time::timeout(PATIENCE, app.say(&session, "one too many"))
        .await
        .expect("the ninth is refused at once, not queued");
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "CONVERSATION_QUEUE_FULL", "{body}");

    // The queue drains in order; the refused message was never anywhere.
    gate.open_one();
    let (status, body) = running.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    for (i, response) in queued.into_iter().enumerate() {
        let text = read_to_end(response).await;
        assert!(text.contains("turn_completed"), "turn {i}: {text}");
        assert!(text.contains(&format!("answer {i}")), "turn {i}: {text}");
    }
    assert!(!model_saw(&model, "one too many"));
    assert!(
        !contents(&app, &session)
            .await
            .iter()
            .any(|c| c == "one too many")
    );
    assert_eq!(model.overruns(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_turn_whose_client_left_never_runs_nor_is_stored() {
    // One queued turn at most: the next is accepted only once the one whose
    // client left is gone, which is how the test knows the server saw it.
    let (app, model, mut gate, _agents) = gated_app(
        "[sessions]\nmax_queued_turns = 1\n[api_limit]\nper_second = 1000\nburst = 1000\n",
    )
    .await;
    let session = app.session("gated").await;
    let running = hold_the_session(&app, &model, &mut gate, &session).await;

    let left = app
        .client
        .post_streaming(&session, "left before its turn")
        .await;
    assert_eq!(left.status(), StatusCode::OK, "queued");
    drop(left);

    let deadline = Instant::now() + PATIENCE;
    let stayed = loop {
        let response = app.client.post_streaming(&session, "stayed").await;
        if response.status() == StatusCode::OK {
            break response;
        }
        let body: Value = response.json().await.expect("JSON error");
        assert_eq!(body["error"]["code"], "CONVERSATION_QUEUE_FULL", "{body}");
        assert!(
            Instant::now() < deadline,
            "the turn of the client that left still holds the queue"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    model.push(Reply::text("answer to stayed"));
    gate.open_one();
    let (status, body) = running.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    let text = read_to_end(stayed).await;
    assert!(text.contains("answer to stayed"), "{text}");

    // The held turn's two model calls and the one for "stayed": nothing else.
    assert_eq!(model.request_count(), 3);
    assert!(!model_saw(&model, "left before its turn"));
    let stored = contents(&app, &session).await;
    assert!(
        !stored.iter().any(|c| c == "left before its turn"),
        "{stored:?}"
    );
    assert!(stored.iter().any(|c| c == "stayed"), "{stored:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_frames_past_the_rate_limit_are_refused_and_not_acted_on() {
    let model = MockModel::start().await;
    model.set_default(Some(Reply::text("a visitor answer")));
    let app = spawn_app(
        AppOptions::with_model(&model).config_toml("[api_limit]\nper_second = 1\nburst = 3\n"),
    );
    // Creating the session and the upgrade take two of the three cells.
    let session = app.session("assistant").await;
    let mut ws = connect_ws(&app, &session, None).await.expect("upgraded");
    let frames = 12;
    for i in 0..frames / 2 {
        let visitor = json!({"type": "visitor_message", "content": format!("visitor {i}")});
        let operator = json!({"type": "operator_message", "content": format!("operator {i}")});
        ws.send(Message::text(visitor.to_string())).await.unwrap();
        ws.send(Message::text(operator.to_string())).await.unwrap();
    }

    // Each frame ends in exactly one of these.
    let (mut refused, mut turns, mut stored_operator, mut stored_visitor) = (0, 0, 0, 0);
    let read = async {
        while refused + turns + stored_operator + stored_visitor < frames {
            let Some(Ok(Message::Text(text))) = ws.next().await else {
                panic!("the socket stays open");
            };
            let frame: Value = serde_json::from_str(&text).unwrap();
            match frame["type"].as_str().unwrap() {
                "error" => {
                    assert_eq!(frame["error"]["code"], "RATE_LIMITED", "{frame}");
                    refused += 1;
                }
                "turn_completed" => turns += 1,
                "message_stored" if frame["role"] == "operator" => stored_operator += 1,
                "message_stored" => stored_visitor += 1,
                _ => {}
            }
        }
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .expect("every frame answered in time");

    // One cell left, and one a second: most of the twelve are refused.
    assert!(refused >= frames - 3, "only {refused} of {frames} refused");
    assert_eq!(model.request_count(), turns, "a refused frame ran no turn");
    let stored = contents(&app, &session).await;
    assert_eq!(
        stored.len(),
        2 * turns + stored_operator + stored_visitor,
        "a refused frame stored nothing: {stored:?}"
    );
}

/// Opens an MCP session (initialize, initialized); returns its id.
async fn mcp_session(app: &TestApp) -> String {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"}}});
    let opened = app
        .client
        .request(Method::POST, "/mcp")
        .header("accept", "application/json, text/event-stream")
        .json(&init)
        .send()
        .await
        .unwrap();
    assert_eq!(opened.status(), StatusCode::OK);
    let id = opened.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    drop(opened);
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let done = app
        .client
        .request(Method::POST, "/mcp")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &id)
        .json(&initialized)
        .send()
        .await
        .unwrap();
    assert!(done.status().is_success(), "{}", done.status());
    id
}

async fn mcp_stream(app: &TestApp, session: &str) -> reqwest::Response {
    app.client
        .request(Method::GET, "/mcp")
        .header("accept", "text/event-stream")
        .header("mcp-session-id", session)
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_streams_count_against_max_streams() {
    // With `max_streams = 3` a caller may hold three MCP sessions (sessions
    // count against the cap too: a fourth ends the least recently used)
    // and three streams, `GET /mcp` ones and others alike.
    let app = spawn_app(AppOptions::offline().config_toml("[api_limit]\nmax_streams = 3\n"));
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(mcp_session(&app).await);
    }
    let first = mcp_stream(&app, &sessions[0]).await;
    assert_eq!(first.status(), StatusCode::OK);
    let second = mcp_stream(&app, &sessions[1]).await;
    assert_eq!(second.status(), StatusCode::OK);
    // The same cap as every other stream of the caller.
    let events = app
        .client
        .request(Method::GET, "/v1/events")
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), StatusCode::OK);

    let third = mcp_stream(&app, &sessions[2]).await;
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: Value = third.json().await.unwrap();
    assert_eq!(body["error"]["code"], "TOO_MANY_STREAMS", "{body}");

    // A stream that ends frees its slot.
    drop(first);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let third = mcp_stream(&app, &sessions[2]).await;
        if third.status() == StatusCode::OK {
            break;
        }
        assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(Instant::now() < deadline, "the slot was never freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop((second, events));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_metadata_ids_and_operator_ids_are_bounded_before_any_work() {
    let app = spawn_app(AppOptions::offline());
    // Metadata over 16 KiB as JSON: 413, and no session was created.
    let big = json!({"agent": "assistant", "metadata": {"note": "x".repeat(16 * 1024)}});
    let (status, body) = app.post("/v1/sessions", &big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(body["error"]["code"], "PAYLOAD_TOO_LARGE", "{body}");
    let (_, listed) = app.get("/v1/sessions").await;
    assert_eq!(
        listed.to_string().matches("\"agent\"").count(),
        0,
        "{listed}"
    );

    // An id far longer than any session id: not found, and not echoed.
    let long_id = "a".repeat(4096);
    let (status, body) = app.get(&format!("/v1/sessions/{long_id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body.to_string().len() < 1024, "{body}");
    // The same for workflow runs and confirmations, read or decided.
    for path in [
        format!("/v1/workflows/runs/{long_id}"),
        format!("/v1/confirmations/{long_id}"),
    ] {
        let (status, body) = app.get(&path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        assert!(body.to_string().len() < 1024, "{path}: {body}");
    }
    let (status, body) = app
        .post(
            &format!("/v1/confirmations/{long_id}"),
            &json!({"approve": true}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body.to_string().len() < 1024, "{body}");

    // An operator id over 128 bytes is refused; the session keeps none.
    let session = app.session("assistant").await;
    let mut ws = connect_ws(&app, &session, None).await.expect("upgraded");
    let frame = json!({"type": "assign_operator", "operator_id": "o".repeat(129)});
    ws.send(Message::text(frame.to_string())).await.unwrap();
    let Some(Ok(Message::Text(text))) = ws.next().await else {
        panic!("an answer frame");
    };
    let frame: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(frame["error"]["code"], "VALIDATION_ERROR", "{frame}");
    let (_, shown) = app.get(&format!("/v1/sessions/{session}")).await;
    assert!(shown["metadata"].get("operator_id").is_none(), "{shown}");
}

/// Issue #29 (2): a made-up bearer token is not a rate-limit bucket of its
/// own. Public routes take any `Authorization`, and a bucket per raw token
/// let a caller skip the limit (and grow memory with huge tokens) by
/// sending a new one each time; now such a caller counts by its address,
/// on public routes as on the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_bearer_tokens_share_their_addresss_bucket_on_public_routes() {
    let app =
        spawn_app(AppOptions::offline().config_toml("[api_limit]\nper_second = 1\nburst = 5\n"));
    let mut statuses = Vec::new();
    for i in 0..12 {
        let token = format!("junk-{i}-{}", "x".repeat(16 * 1024));
        for path in ["/openapi.json", "/console/", "/docs"] {
            let response = app
                .client
                .request(Method::GET, path)
                .header("authorization", format!("Bearer {token}"))
                .send()
                .await
                .expect("answered");
            statuses.push(response.status());
        }
    }
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    // A burst of 5 and 1 a second: of 36 requests in well under the
    // seconds they would need, most are refused.
    assert!(
        refused >= 20,
        "made-up tokens bought fresh buckets: {refused} of 36 refused ({statuses:?})"
    );
    let ok = statuses.iter().filter(|s| s.is_success()).count();
    assert!(ok >= 3, "the address's burst passes: {statuses:?}");
}
