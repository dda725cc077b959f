//! Conversations in depth, seen from outside: the five prompt layers as the
//! model receives them, the rolling summary and the history window (also
//! across a restart), summary reads during a running turn, grounded and
//! ungrounded citations, `multitask` enqueue and reject, and turns streamed
//! as Server-Sent Events.
//!
//! A turn is held where the test needs it by a "gate" tool: its handler
//! tells the test it started, then waits until the test opens the gate. What
//! cadre sent is read from the mock model's recorded requests; background
//! work (a summary call after a turn) is waited for with
//! `MockModel::wait_for_requests`, never with sleeps.

mod support;

use std::sync::Arc;
use std::time::Duration;

use cadre::conversation::context::{
    BREVITY_INSTRUCTION, SINGLE_TOOL_USE_INSTRUCTIONS, SUMMARY_PREFIX, TOOL_USE_INSTRUCTIONS,
};
use cadre::tools::{FnHandler, ToolDefinition, ToolError, ToolHandler};
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::gate::gate_tool;
use support::{AppOptions, MockModel, Reply, TestApp, agent_toml, agents_dir, spawn_app};
use tokio::task::JoinHandle;

/// How long anything the test waits for may take before it fails loudly.
const PATIENCE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// Test tools
// ---------------------------------------------------------------------------

/// A positions tool answering with a source id, like the brokerage tools.
fn positions_tool() -> (ToolDefinition, Arc<dyn ToolHandler>) {
    let handler = FnHandler(|_params: Value| async {
        Ok::<Value, ToolError>(json!({
            "source_id": "tool:positions:v1",
            "as_of": "2024-05-01",
            "data": {"positions": [{"symbol": "AAPL", "quantity": 42}]}
        }))
    });
    let def = ToolDefinition::new(
        "positions_lookup",
        "The account's positions.",
        json!({"type": "object", "properties": {}}),
    )
    .with_cache_ttl(0);
    (def, Arc::new(handler))
}

// ---------------------------------------------------------------------------
// Requests and what the model saw
// ---------------------------------------------------------------------------

fn messages(request: &Value) -> &Vec<Value> {
    request["messages"].as_array().expect("messages array")
}

fn system_text(request: &Value) -> &str {
    let first = &messages(request)[0];
    assert_eq!(first["role"], "system", "{request}");
    first["content"].as_str().expect("system content")
}

/// Every message's content after the system message, in order.
fn contents_after_system(request: &Value) -> Vec<&str> {
    messages(request)[1..]
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default())
        .collect()
}

/// A rolling-summary request: no tools, and a system message saying so.
fn is_summary_request(request: &Value) -> bool {
    request.get("tools").is_none() && system_text(request).contains("This is a summary request")
}

/// The first model request whose last message is the user's `question`.
fn turn_request<'a>(requests: &'a [Value], question: &str) -> &'a Value {
    requests
        .iter()
        .find(|r| {
            let last = messages(r).last().expect("a message");
            last["role"] == "user" && last["content"] == question
        })
        .unwrap_or_else(|| panic!("no model request ends with {question:?}"))
}

async fn create_session(app: &TestApp, agent: &str, metadata: Value) -> String {
    let (status, body) = app
        .post(
            "/v1/sessions",
            &json!({"agent": agent, "metadata": metadata}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["id"].as_str().expect("session id").to_owned()
}

/// A message sent on its own task, so the test can go on while it waits.
fn spawn_say(app: &TestApp, session: &str, content: &str) -> JoinHandle<(StatusCode, Value)> {
    app.client.spawn_post(
        &format!("/v1/sessions/{session}/messages"),
        json!({ "content": content }),
    )
}

async fn joined<T>(task: JoinHandle<T>) -> T {
    tokio::time::timeout(PATIENCE, task)
        .await
        .expect("the request finished in time")
        .expect("the request task did not panic")
}

async fn wait_for_requests(model: &MockModel, n: usize) {
    tokio::time::timeout(PATIENCE, model.wait_for_requests(n))
        .await
        .unwrap_or_else(|_| panic!("the model got {n} requests in time"));
}

// ---------------------------------------------------------------------------
// Server-Sent Events
// ---------------------------------------------------------------------------

/// One event of a streamed turn.
#[derive(Debug)]
struct Event {
    name: String,
    data: Value,
}

/// Reads the stream to its end, chunk by chunk, and parses its events
/// (keep-alive comments are skipped).
async fn read_events(response: reqwest::Response) -> Vec<Event> {
    let read = async {
        let mut stream = response.bytes_stream();
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.next().await {
            bytes.extend_from_slice(&chunk.expect("stream chunk"));
        }
        bytes
    };
    let bytes = tokio::time::timeout(PATIENCE, read)
        .await
        .expect("the stream ended in time");
    let text = String::from_utf8(bytes).expect("UTF-8 stream");
    let mut events = Vec::new();
    for block in text.replace("\r\n", "\n").split("\n\n") {
        let mut name = None;
        let mut data: Vec<&str> = Vec::new();
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                name = Some(v.trim().to_owned());
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v));
            }
        }
        if let Some(name) = name {
            let data = serde_json::from_str(&data.join("\n"))
                .unwrap_or_else(|e| panic!("event {name} has JSON data: {e}; {block:?}"));
            events.push(Event { name, data });
        }
    }
    events
}

fn names(events: &[Event]) -> Vec<&str> {
    events.iter().map(|e| e.name.as_str()).collect()
}

// ---------------------------------------------------------------------------
// 1. Prompt layers
// ---------------------------------------------------------------------------

const VISITOR: &str =
    "Visitor information:\n- Current page: /pricing\n- Funnel stage: consideration\n- Visits: 3";

fn visitor_metadata() -> Value {
    json!({"visitor": {"current_page": "/pricing", "funnel_stage": "consideration", "visit_count": 3}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_system_message_holds_prompt_brevity_visitor_info_and_single_tool_use_in_order() {
    let agents = agents_dir(&[(
        "desk.toml",
        "name = \"desk\"\n\
         system_prompt = \"You are the shop's assistant.\"\n\
         tools = [\"echo\"]\n\
         include_visitor_info = true\n\
         single_tool_use = true\n",
    )]);
    let model = MockModel::start().await;
    model.push(Reply::text("Our plans start at $10."));
    let app = spawn_app(AppOptions::with_model(&model).agents(agents.path()));
    let session = create_session(&app, "desk", visitor_metadata()).await;

    let (status, body) = app.say(&session, "How much is it?").await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let requests = model.requests();
    let system = system_text(&requests[0]);
    assert_eq!(
        system,
        format!(
            "You are the shop's assistant.\n\n{BREVITY_INSTRUCTION}\n\n{VISITOR}\n\n{SINGLE_TOOL_USE_INSTRUCTIONS}"
        )
    );
    let at = |needle: &str| {
        system
            .find(needle)
            .unwrap_or_else(|| panic!("{needle:?} in {system:?}"))
    };
    assert!(at("You are the shop's assistant.") < at("answer briefly"));
    assert!(at("answer briefly") < at("Current page: /pricing"));
    assert!(at("Current page: /pricing") < at("Funnel stage: consideration"));
    assert!(at("Visits: 3") < at("AT MOST ONCE"));
    assert!(!system.contains(TOOL_USE_INSTRUCTIONS));
    assert_eq!(
        contents_after_system(&requests[0]),
        ["How much is it?"],
        "no history yet, no summary"
    );
    assert_eq!(model.overruns(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brevity_off_and_an_agent_without_tools_leave_their_layers_out() {
    let agents = agents_dir(&[
        (
            "chatty.toml",
            "name = \"chatty\"\nsystem_prompt = \"You are chatty.\"\ntools = [\"echo\"]\nbrevity = false\n",
        ),
        (
            "toolless.toml",
            "name = \"toolless\"\nsystem_prompt = \"You have no tools.\"\n",
        ),
    ]);
    let model = MockModel::start().await;
    model.push_all([Reply::text("Well, let me tell you..."), Reply::text("Hi.")]);
    let app = spawn_app(AppOptions::with_model(&model).agents(agents.path()));
    // Visitor metadata is ignored without `include_visitor_info`.
    let chatty = create_session(&app, "chatty", visitor_metadata()).await;
    let toolless = create_session(&app, "toolless", visitor_metadata()).await;

    assert_eq!(app.say(&chatty, "hello").await.0, StatusCode::OK);
    assert_eq!(app.say(&toolless, "hello").await.0, StatusCode::OK);

    let requests = model.requests();
    assert_eq!(
        system_text(&requests[0]),
        format!("You are chatty.\n\n{TOOL_USE_INSTRUCTIONS}")
    );
    assert!(!system_text(&requests[0]).contains("briefly"));
    assert_eq!(
        system_text(&requests[1]),
        format!("You have no tools.\n\n{BREVITY_INSTRUCTION}")
    );
    assert!(requests[1].get("tools").is_none(), "{}", requests[1]);
    assert!(!system_text(&requests[1]).contains("Current page"));
    assert_eq!(model.overruns(), 0);
}

// ---------------------------------------------------------------------------
// 2. History window and rolling summary
// ---------------------------------------------------------------------------

fn question(i: usize) -> String {
    format!("question {i}")
}

fn answer(i: usize) -> String {
    format!("answer {i}")
}

/// The summary as the model gets it: data in a labelled, fenced user
/// message, never a system message.
fn summary_as_data(text: &str) -> Value {
    json!({
        "role": "user",
        "content": format!("{SUMMARY_PREFIX}\n<summary>\n{text}\n</summary>"),
    })
}

fn summary_through(i: usize) -> String {
    format!("Summary through turn {i}: the user asked numbered questions.")
}

/// The contents the model is sent for `first..=last` earlier exchanges.
fn exchanges(first: usize, last: usize) -> Vec<String> {
    (first..=last)
        .flat_map(|i| [question(i), answer(i)])
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_two_windows_the_model_gets_the_summary_and_every_message_after_it_even_after_a_restart()
 {
    let agents = agents_dir(&[(
        "window.toml",
        &format!(
            "{}history_window = 20\n",
            agent_toml("window", &["echo"], 3)
        ),
    )]);
    let model = MockModel::start().await;
    // Turns 1-20 leave 40 messages: two windows, sent verbatim. Turn 21
    // makes 42, so a summary folds all but the last window (turns 1-11).
    for i in 1..=21 {
        model.push(Reply::text(&answer(i)));
    }
    model.push(Reply::text(&summary_through(21)));
    // Turns 22-32 grow the uncovered part from 20 back past 40; the summary
    // call after turn 32 is refused, which keeps the stored summary.
    for i in 22..=32 {
        model.push(Reply::text(&answer(i)));
    }
    model.push(Reply::fail(400));
    let mut app = spawn_app(AppOptions::with_model(&model).agents(agents.path()));
    let session = app.session("window").await;
    for i in 1..=32 {
        let (status, body) = app.say(&session, &question(i)).await;
        assert_eq!(status, StatusCode::OK, "turn {i}: {body}");
        assert_eq!(body["answer"], answer(i));
    }
    wait_for_requests(&model, 34).await;

    let requests = model.requests();
    let summaries: Vec<&Value> = requests.iter().filter(|r| is_summary_request(r)).collect();
    assert_eq!(summaries.len(), 2, "after turns 21 and 32 only");
    let first_ask = messages(summaries[0])[1]["content"].as_str().unwrap();
    assert!(
        first_ask.contains("Current summary:\n(none yet)"),
        "{first_ask}"
    );
    assert!(first_ask.contains("user: question 1\nassistant: answer 1\n"));
    assert!(first_ask.contains("user: question 11\nassistant: answer 11\n"));
    assert!(
        !first_ask.contains("question 12"),
        "the last window stays verbatim"
    );
    let second_ask = messages(summaries[1])[1]["content"].as_str().unwrap();
    assert!(
        second_ask.contains(&summary_through(21)),
        "the summary rolls"
    );
    for r in requests.iter().filter(|r| !is_summary_request(r)) {
        assert!(r["tools"].is_array(), "turn requests offer tools");
        assert!(
            messages(r).len() <= 43,
            "system + summary + 40 + the question"
        );
    }

    let mut expected = exchanges(1, 20);
    expected.push(question(21));
    assert_eq!(
        contents_after_system(turn_request(&requests, &question(21))),
        expected,
        "no summary yet: every earlier message"
    );
    for (turn, first) in [(22, 12), (32, 12)] {
        let request = turn_request(&requests, &question(turn));
        assert_eq!(messages(request)[1], summary_as_data(&summary_through(21)));
        let mut expected = exchanges(first, turn - 1);
        expected.push(question(turn));
        assert_eq!(contents_after_system(request)[1..], expected, "turn {turn}");
    }

    let (status, summary) = app.get(&format!("/v1/sessions/{session}/summary")).await;
    assert_eq!(status, StatusCode::OK, "{summary}");
    assert_eq!(summary["conversation_summary"], summary_through(21));
    assert_eq!(
        summary["covers_until_seq"], 22,
        "questions and answers 1-11"
    );
    assert_eq!(summary["message_count"], 64);
    assert_eq!(summary["turns"], 32);
    assert!(summary["last_activity_at"].is_string(), "{summary}");

    // A new process on the same data dir loads the summary and the 42
    // messages after it from redb; the prompt holds the last 40 of them.
    app.stop();
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .data_dir(&app.data_dir),
    );
    model.push_all([
        Reply::text(&answer(33)),
        Reply::text("Summary after the restart."),
    ]);
    let (status, body) = app.say(&session, &question(33)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    wait_for_requests(&model, 36).await;

    let requests = model.requests();
    let thirty_third = turn_request(&requests, &question(33));
    assert_eq!(
        messages(thirty_third)[1],
        summary_as_data(&summary_through(21))
    );
    let mut expected = exchanges(13, 32);
    expected.push(question(33));
    assert_eq!(contents_after_system(thirty_third)[1..], expected);
    assert!(is_summary_request(requests.last().unwrap()));
    assert_eq!(model.remaining(), 0);
    assert_eq!(model.overruns(), 0);
}

// ---------------------------------------------------------------------------
// 3. Reads during a running turn
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summary_and_history_answer_while_a_turn_holds_a_tool() {
    let (def, handler, mut gate) = gate_tool("gate", "custom");
    let agents = agents_dir(&[("g.toml", &agent_toml("gated", &["gate"], 3))]);
    let model = MockModel::start().await;
    model.push_all([
        Reply::tool_call("call_1", "gate", r#"{"label":"held"}"#),
        Reply::text("released"),
    ]);
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .tool(def, handler),
    );
    let session = app.session("gated").await;

    let turn = spawn_say(&app, &session, "hold on");
    assert_eq!(gate.started().await, "held");

    // A running turn's steps reach the store without the turn waiting for
    // them, so they show up shortly after the tool started.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let summary = loop {
        let (status, summary) = app.get(&format!("/v1/sessions/{session}/summary")).await;
        assert_eq!(status, StatusCode::OK, "{summary}");
        if summary["message_count"] == 2 || tokio::time::Instant::now() > deadline {
            break summary;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(
        summary["message_count"], 2,
        "the question and the tool call"
    );
    assert_eq!(summary["turns"], 1);
    assert!(summary["conversation_summary"].is_null());
    let (status, history) = app.get(&format!("/v1/sessions/{session}/messages")).await;
    assert_eq!(status, StatusCode::OK, "{history}");
    let roles: Vec<&str> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant"]);

    gate.open_one();
    let (status, body) = joined(turn).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answer"], "released");
    let (_, summary) = app.get(&format!("/v1/sessions/{session}/summary")).await;
    assert_eq!(summary["message_count"], 4);
    assert_eq!(summary["tool_usage_summary"]["tool_usage"]["gate"], 1);
    assert_eq!(model.overruns(), 0);
}

// ---------------------------------------------------------------------------
// 4. Citations
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_cites_the_tools_source_and_an_invented_source_is_flagged_ungrounded() {
    let (def, handler) = positions_tool();
    let agents = agents_dir(&[("b.toml", &agent_toml("broker", &["positions_lookup"], 3))]);
    let model = MockModel::start().await;
    model.push_all([
        Reply::tool_call("call_1", "positions_lookup", "{}"),
        Reply::text("You hold 42 shares [tool:positions:v1] (see also [tool:made_up:v1])"),
        Reply::text("Still 42 shares [tool:positions:v1]."),
    ]);
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .tool(def, handler),
    );
    let session = app.session("broker").await;

    let (status, body) = app.say(&session, "How many AAPL do I hold?").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["citations"], json!(["tool:positions:v1"]));
    assert_eq!(body["ungrounded_citations"], json!(["tool:made_up:v1"]));
    assert_eq!(body["tool_calls"][0]["source_id"], "tool:positions:v1");
    assert_eq!(body["tool_calls"][0]["is_success"], true);
    let tool_message = messages(&model.requests()[1]).last().unwrap().clone();
    assert_eq!(tool_message["role"], "tool");
    assert!(
        tool_message["content"]
            .as_str()
            .unwrap()
            .contains("tool:positions:v1")
    );

    // A source a tool of this conversation returned earlier stays grounded;
    // this turn's own citations list only this turn's tool sources.
    let (status, body) = app.say(&session, "And now?").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["citations"], json!([]));
    assert_eq!(body["ungrounded_citations"], json!([]));
    assert_eq!(model.overruns(), 0);
}

/// Known sources are not memory-only: after a restart (the same holds for
/// an idle eviction, which reloads the same way) a source a tool returned
/// before is still grounded, and an invented one is still flagged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_returned_before_a_restart_stays_grounded_after_it() {
    let (def, handler) = positions_tool();
    let agents = agents_dir(&[("b.toml", &agent_toml("broker", &["positions_lookup"], 3))]);
    let model = MockModel::start().await;
    model.push_all([
        Reply::tool_call("call_1", "positions_lookup", "{}"),
        Reply::text("You hold 42 shares [tool:positions:v1]."),
        Reply::text("Still 42 shares [tool:positions:v1], not [tool:made_up:v1]."),
    ]);
    let data = tempfile::tempdir().unwrap();
    let options = || {
        let (def, handler) = (def.clone(), handler.clone());
        AppOptions::with_model(&model)
            .agents(agents.path())
            .data_dir(data.path())
            .tool(def, handler)
    };
    let mut app = spawn_app(options());
    let session = app.session("broker").await;
    let (status, body) = app.say(&session, "How many AAPL do I hold?").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["ungrounded_citations"], json!([]));
    app.stop();

    let app = spawn_app(options());
    let (status, body) = app.say(&session, "And now?").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["citations"], json!([]));
    assert_eq!(body["ungrounded_citations"], json!(["tool:made_up:v1"]));
    assert_eq!(model.overruns(), 0);
}

// ---------------------------------------------------------------------------
// 5. Multitask
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_multitask_reject_a_second_message_during_a_turn_is_409_conversation_busy() {
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
        Reply::text("third answer"),
    ]);
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .tool(def, handler),
    );
    let session = app.session("strict").await;

    let first = spawn_say(&app, &session, "first");
    assert_eq!(gate.started().await, "first");
    let (status, body) = app.say(&session, "second").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "CONVERSATION_BUSY");
    // Streamed, the refusal is the same 409 JSON error, before any event.
    let response = app.post_streaming(&session, "second, streamed").await;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert!(
        response.headers()[reqwest::header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    let body: Value = response.json().await.expect("a JSON error body");
    assert_eq!(body["error"]["code"], "CONVERSATION_BUSY", "{body}");

    gate.open_one();
    let (status, body) = joined(first).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answer"], "first answer");

    // Once the turn is over, the session takes messages again; the refused
    // one left nothing behind.
    let (status, body) = app.say(&session, "third").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answer"], "third answer");
    let (_, history) = app.get(&format!("/v1/sessions/{session}/messages")).await;
    let users: Vec<&str> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(users, ["first", "third"]);
    assert_eq!(model.overruns(), 0);
}

/// A client that waits for each answer before sending the next must not be
/// refused: the summary call cadre makes after a turn is not a turn. The
/// mock holds the summary reply (`Reply::slow`; the mock has no gate), so
/// the third message arrives while the summary is still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_multitask_reject_a_message_after_the_answer_is_taken_while_the_summary_runs() {
    let agents = agents_dir(&[(
        "r.toml",
        "name = \"strict\"\nsystem_prompt = \"s\"\nhistory_window = 2\nmultitask = \"reject\"\n",
    )]);
    let model = MockModel::start().await;
    model.push_all([
        Reply::text("a1"),
        Reply::text("a2"),
        Reply::text("a3"),
        // Held by the mock, so the summary is still running when the next
        // message arrives.
        Reply::slow(Duration::from_secs(2), Reply::text("they talked")),
        Reply::text("a4"),
    ]);
    let app = spawn_app(AppOptions::with_model(&model).agents(agents.path()));
    let session = app.session("strict").await;
    for q in ["q1", "q2", "q3"] {
        assert_eq!(app.say(&session, q).await.0, StatusCode::OK);
    }
    wait_for_requests(&model, 4).await;
    assert!(
        is_summary_request(&model.requests()[3]),
        "6 messages outgrow two windows of 2"
    );

    let (status, body) = app.say(&session, "q4").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answer"], "a4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_message_sent_during_a_turn_waits_and_is_answered_after_it() {
    let (def, handler, mut gate) = gate_tool("gate", "custom");
    let agents = agents_dir(&[("q.toml", &agent_toml("queued", &["gate"], 3))]);
    let model = MockModel::start().await;
    model.push_all([
        Reply::tool_call("call_1", "gate", r#"{"label":"first"}"#),
        Reply::text("answer one"),
        Reply::text("answer two"),
    ]);
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .tool(def, handler),
    );
    let session = app.session("queued").await;

    let first = spawn_say(&app, &session, "first");
    assert_eq!(gate.started().await, "first");
    let second = spawn_say(&app, &session, "second");
    gate.open_one();
    let (status_one, one) = joined(first).await;
    let (status_two, two) = joined(second).await;
    assert_eq!(status_one, StatusCode::OK, "{one}");
    assert_eq!(status_two, StatusCode::OK, "{two}");
    assert_eq!(one["answer"], "answer one");
    assert_eq!(two["answer"], "answer two");

    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    let second_turn = turn_request(&requests, "second");
    let contents = contents_after_system(second_turn);
    assert_eq!(contents[0], "first");
    assert_eq!(contents[contents.len() - 2], "answer one");
    assert_eq!(contents.last().copied(), Some("second"));
    assert_eq!(model.overruns(), 0);
}

// ---------------------------------------------------------------------------
// 6. Streaming
// ---------------------------------------------------------------------------

const STREAMED_ANSWER: &str = "The echo said: hello from a streamed turn.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_turn_shows_tool_events_then_model_deltas_then_the_outcome() {
    let agents = agents_dir(&[("e.toml", &agent_toml("echoer", &["echo"], 3))]);
    let model = MockModel::start().await;
    let arguments = r#"{"message":"hello from a streamed turn"}"#;
    model.push_all([
        Reply::tool_call("call_1", "echo", arguments),
        Reply::text(STREAMED_ANSWER),
        Reply::text("A plain answer."),
    ]);
    let app = spawn_app(AppOptions::with_model(&model).agents(agents.path()));
    let session = app.session("echoer").await;

    let response = app.post_streaming(&session, "Say hello").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = read_events(response).await;

    let names = names(&events);
    let n = names.len();
    assert!(n >= 5, "{names:?}");
    assert_eq!(
        names[..3],
        ["turn_started", "tool_call_started", "tool_call_completed"]
    );
    assert!(
        names[3..n - 1].iter().all(|e| *e == "model_delta"),
        "{names:?}"
    );
    assert_eq!(names[n - 1], "turn_completed");

    assert_eq!(events[0].data["session_id"], session);
    let started = &events[1].data;
    assert_eq!(started["id"], "call_1");
    assert_eq!(started["name"], "echo");
    assert_eq!(
        started["arguments"],
        json!({"message": "hello from a streamed turn"}),
        "the argument pieces were put back together"
    );
    let completed = &events[2].data;
    assert_eq!(completed["id"], "call_1");
    assert_eq!(completed["is_success"], true);
    assert_eq!(completed["output"]["message"], "hello from a streamed turn");
    let text: String = events[3..n - 1]
        .iter()
        .map(|e| e.data["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, STREAMED_ANSWER);

    let outcome = &events[n - 1].data;
    assert_eq!(outcome["answer"], STREAMED_ANSWER);
    assert_eq!(outcome["tool_calls"][0]["id"], "call_1");
    assert_eq!(outcome["tool_usage_summary"]["total_calls"], 1);
    assert_eq!(outcome["citations"], json!([]));

    let requests = model.requests();
    assert_eq!(requests[0]["stream"], true);
    assert_eq!(requests[1]["stream"], true);

    // The streamed outcome has the same shape as a JSON reply.
    let (status, plain) = app.say(&session, "And plainly?").await;
    assert_eq!(status, StatusCode::OK, "{plain}");
    let keys = |v: &Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(outcome), keys(&plain));
    assert_ne!(model.requests()[2]["stream"], true);
    assert_eq!(model.overruns(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_failure_while_streaming_ends_with_turn_failed_and_the_session_goes_on() {
    let agents = agents_dir(&[("e.toml", &agent_toml("echoer", &["echo"], 3))]);
    let model = MockModel::start().await;
    // The harness retries twice: three failures make the call fail for good.
    model.push_all([Reply::fail(500), Reply::fail(500), Reply::fail(500)]);
    let app = spawn_app(AppOptions::with_model(&model).agents(agents.path()));
    let session = app.session("echoer").await;

    let response = app.post_streaming(&session, "Are you there?").await;
    assert_eq!(response.status(), StatusCode::OK);
    let events = read_events(response).await;
    assert_eq!(names(&events), ["turn_started", "turn_failed"]);
    let failed = &events[1].data;
    assert_eq!(failed["error"]["code"], "MODEL_UNAVAILABLE", "{failed}");
    assert!(failed["error"]["message"].is_string());
    assert_eq!(model.request_count(), 3);
    assert!(model.requests().iter().all(|r| r["stream"] == true));

    model.push(Reply::text("I am back."));
    let (status, body) = app.say(&session, "Now?").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answer"], "I am back.");
    assert_eq!(model.overruns(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_to_an_unknown_session_is_a_plain_404() {
    let model = MockModel::start().await;
    let app = spawn_app(AppOptions::with_model(&model));

    let response = app.post_streaming("no-such-session", "hello").await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    let body: Value = response.json().await.expect("JSON body");
    assert_eq!(body["error"]["code"], "SESSION_NOT_FOUND");
    assert_eq!(model.request_count(), 0);
}

// ---------------------------------------------------------------------------
// 7. Offline provider
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_provider_answers_a_toolless_agent_with_layers_and_summarises() {
    let agents = agents_dir(&[(
        "o.toml",
        "name = \"offline-desk\"\nsystem_prompt = \"You are the shop's assistant.\"\n\
         include_visitor_info = true\nsingle_tool_use = true\nhistory_window = 2\n",
    )]);
    let app = spawn_app(AppOptions::offline().agents(agents.path()));
    let session = create_session(&app, "offline-desk", visitor_metadata()).await;

    for q in ["hello", "what do you sell?", "thanks", "bye"] {
        let (status, body) = app.say(&session, q).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(
            body["answer"].as_str().unwrap().contains("offline model"),
            "{body}"
        );
        assert_eq!(body["tool_calls"], json!([]));
    }

    // Six messages outgrow two windows of 2: the summary made after the
    // third turn is stored before the fourth turn's answer (one writer, in
    // order).
    let (status, summary) = app.get(&format!("/v1/sessions/{session}/summary")).await;
    assert_eq!(status, StatusCode::OK, "{summary}");
    assert!(
        !summary["conversation_summary"]
            .as_str()
            .expect("a stored summary")
            .trim()
            .is_empty()
    );
    assert_eq!(summary["covers_until_seq"], 4, "all but the last window");
    assert_eq!(summary["message_count"], 8);
    assert_eq!(summary["turns"], 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_conversation_leaves_memory_and_comes_back_with_its_history() {
    let model = MockModel::start().await;
    model.push_all([Reply::text("Hello, Ada."), Reply::text("You are Ada.")]);
    let app = spawn_app(
        AppOptions::with_model(&model).config_toml("[sessions]\nidle_timeout_s = 0.05\n"),
    );
    let session = app.session("assistant").await;
    let (status, _) = app.say(&session, "I am Ada").await;
    assert_eq!(status, StatusCode::OK);

    // Bounded wait for the eviction (a timer inside the runtime; no signal to await).
    let sessions = app.runtime.as_ref().unwrap().sessions().clone();
    let mut evicted = false;
    for _ in 0..500 {
        if sessions.resident() == 0 {
            evicted = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(evicted, "the idle conversation is still in memory");

    let (status, body) = app.say(&session, "Who am I?").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answer"], "You are Ada.");
    let requests = model.requests();
    let contents: Vec<&str> = requests[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .skip(1)
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(contents, ["I am Ada", "Hello, Ada.", "Who am I?"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_comes_in_pages_with_a_cursor() {
    let model = MockModel::start().await;
    model.push_all((0..3).map(|i| Reply::text(&format!("a{i}"))));
    let app = spawn_app(AppOptions::with_model(&model));
    let session = app.session("assistant").await;
    for i in 0..3 {
        app.say(&session, &format!("q{i}")).await;
    }
    let (status, page) = app
        .get(&format!("/v1/sessions/{session}/messages?limit=4"))
        .await;
    assert_eq!(status, StatusCode::OK);
    let seqs: Vec<u64> = page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4]);
    assert_eq!(page["next_after"], 4);
    let (_, rest) = app
        .get(&format!("/v1/sessions/{session}/messages?limit=4&after=4"))
        .await;
    assert_eq!(rest["messages"].as_array().unwrap().len(), 2);
    assert!(rest["next_after"].is_null());
    let (status, body) = app
        .get(&format!("/v1/sessions/{session}/messages?limit=100000"))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}
