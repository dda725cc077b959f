//! The tool loop end to end, against a model faked at the wire: the model asks
//! for tools, a sub-agent runs them through the executor, the results go back
//! to the model with their call ids, and the answer comes back over HTTP.

mod support;

use std::sync::Arc;
use std::time::Duration;

use cadre::tools::{FnHandler, ToolDefinition};
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{AppOptions, MockModel, Reply, agent_toml, agents_dir, spawn_app};

fn messages(request: &Value) -> &Vec<Value> {
    request["messages"].as_array().expect("messages array")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_result_reaches_the_second_model_request_with_its_call_id() {
    let model = MockModel::start().await;
    model.push(Reply::tool_call(
        "call_1",
        "calculator",
        r#"{"expression":"(2+3)*4"}"#,
    ));
    model.push(Reply::text("The answer is 20."));
    let app = spawn_app(AppOptions::with_model(&model));
    let session = app.session("assistant").await;

    let (status, body) = app.say(&session, "What is (2+3)*4?").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answer"], "The answer is 20.");
    assert_eq!(body["iterations"], 2);
    assert_eq!(body["fallback_used"], false);
    let call = &body["tool_calls"][0];
    assert_eq!(call["id"], "call_1");
    assert_eq!(call["name"], "calculator");
    assert_eq!(call["is_success"], true);
    assert_eq!(call["output"]["result"], 20.0);
    assert_eq!(body["tool_usage_summary"]["total_calls"], 1);

    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let first = &requests[0];
    assert_eq!(first["tool_choice"], "auto");
    assert_eq!(first["model"], "mock-model");
    let offered: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(offered, ["echo", "calculator", "http_request"]);
    assert_eq!(messages(first)[0]["role"], "system");
    assert_eq!(
        messages(first).last().unwrap()["content"],
        "What is (2+3)*4?"
    );

    let second = messages(&requests[1]);
    let n = second.len();
    assert_eq!(second[n - 2]["role"], "assistant");
    assert_eq!(second[n - 2]["tool_calls"][0]["id"], "call_1");
    assert_eq!(
        second[n - 2]["tool_calls"][0]["function"]["name"],
        "calculator"
    );
    assert_eq!(second[n - 1]["role"], "tool");
    assert_eq!(second[n - 1]["tool_call_id"], "call_1");
    let result: Value = serde_json::from_str(second[n - 1]["content"].as_str().unwrap()).unwrap();
    assert_eq!(result["result"], 20.0);

    let (_, summary) = app.get(&format!("/v1/sessions/{session}/summary")).await;
    assert_eq!(summary["tool_usage_summary"]["tool_usage"]["calculator"], 1);
    assert_eq!(summary["message_count"], 4);
    assert_eq!(model.overruns(), 0);
}

/// Two calls in one reply meet at a barrier of two: they can only finish if
/// they run at the same time (run one after the other, the first would wait
/// for its 5 s timeout and fail).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tool_calls_in_one_reply_run_concurrently_and_return_in_order() {
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let handler = FnHandler(move |params: Value| {
        let barrier = barrier.clone();
        async move {
            barrier.wait().await;
            Ok(json!({"tag": params["tag"]}))
        }
    });
    let rendezvous = ToolDefinition::new(
        "rendezvous",
        "Waits for its twin.",
        json!({"type": "object", "properties": {"tag": {"type": "string"}}, "required": ["tag"]}),
    )
    .with_timeout(Duration::from_secs(5));
    let agents = agents_dir(&[("a.toml", &agent_toml("pair", &["rendezvous"], 3))]);
    let model = MockModel::start().await;
    model.push(Reply::tool_calls(&[
        ("call_a", "rendezvous", r#"{"tag":"a"}"#),
        ("call_b", "rendezvous", r#"{"tag":"b"}"#),
    ]));
    model.push(Reply::text("both done"));
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .tool(rendezvous, Arc::new(handler)),
    );
    let session = app.session("pair").await;

    let (status, body) = app.say(&session, "go").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let calls = body["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2);
    assert!(calls.iter().all(|c| c["is_success"] == true), "{body}");
    assert_eq!(calls[0]["output"]["tag"], "a");
    assert_eq!(calls[1]["output"]["tag"], "b");

    let second = &model.requests()[1];
    let tool_ids: Vec<&str> = messages(second)
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(tool_ids, ["call_a", "call_b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_max_iterations_the_last_request_forbids_tools_and_the_answer_still_comes() {
    let agents = agents_dir(&[("a.toml", &agent_toml("looper", &["echo"], 2))]);
    let model = MockModel::start().await;
    model.push_all([
        Reply::tool_call("c1", "echo", r#"{"message":"one"}"#),
        Reply::tool_call("c2", "echo", r#"{"message":"two"}"#),
        Reply::text("Here is what I found."),
    ]);
    let app = spawn_app(AppOptions::with_model(&model).agents(agents.path()));
    let session = app.session("looper").await;

    let (status, body) = app.say(&session, "loop please").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answer"], "Here is what I found.");
    assert_eq!(body["fallback_used"], true);
    assert_eq!(body["iterations"], 3);
    assert_eq!(body["tool_calls"].as_array().unwrap().len(), 2);

    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0]["tool_choice"], "auto");
    assert_eq!(requests[1]["tool_choice"], "auto");
    assert_eq!(requests[2]["tool_choice"], "none");
    let last = messages(&requests[2]).last().unwrap();
    assert_eq!(last["role"], "system");
    assert!(last["content"].as_str().unwrap().contains("answer now"));
    assert_eq!(model.overruns(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_arguments_and_unknown_tools_become_errors_the_model_sees() {
    let model = MockModel::start().await;
    model.push(Reply::tool_calls(&[
        ("bad_json", "calculator", "{not json"),
        ("not_object", "calculator", "[1, 2]"),
        ("missing", "calculator", "{}"),
        ("unknown", "no_such_tool", "{}"),
    ]));
    model.push(Reply::text("Sorry, those failed."));
    let app = spawn_app(AppOptions::with_model(&model));
    let session = app.session("assistant").await;

    let (status, body) = app.say(&session, "break things").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let types: Vec<&str> = body["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["error_type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "VALIDATION_ERROR",
            "VALIDATION_ERROR",
            "VALIDATION_ERROR",
            // A name the turn did not offer is refused before lookup (#21):
            // the model learns what it may call, not what the registry holds.
            "TOOL_NOT_OFFERED"
        ]
    );
    assert_eq!(body["tool_usage_summary"]["failed_calls"], 4);
    assert_eq!(body["tool_usage_summary"]["has_errors"], true);

    let second = &model.requests()[1];
    let results: Vec<Value> = messages(second)
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| serde_json::from_str(m["content"].as_str().unwrap()).unwrap())
        .collect();
    assert!(
        results[0]["error"]
            .as_str()
            .unwrap()
            .contains("not valid JSON")
    );
    assert!(
        results[1]["error"]
            .as_str()
            .unwrap()
            .contains("JSON object")
    );
    assert_eq!(results[2]["validation_errors"][0]["field"], "expression");
    assert_eq!(results[2]["validation_errors"][0]["code"], "required");
    assert_eq!(results[3]["error_type"], "TOOL_NOT_OFFERED");

    // Every call left a record, failures included.
    let (_, summary) = app.get(&format!("/v1/sessions/{session}/summary")).await;
    assert_eq!(summary["tool_usage_summary"]["total_calls"], 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_turn_sees_the_previous_turns_history() {
    let model = MockModel::start().await;
    model.push_all([Reply::text("Hello, Ada."), Reply::text("You are Ada.")]);
    let app = spawn_app(AppOptions::with_model(&model));
    let session = app.session("assistant").await;
    app.say(&session, "I am Ada").await;
    let (status, body) = app.say(&session, "Who am I?").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["answer"], "You are Ada.");
    let requests = model.requests();
    let contents: Vec<&str> = messages(&requests[1])
        .iter()
        .skip(1)
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(contents, ["I am Ada", "Hello, Ada.", "Who am I?"]);
}
