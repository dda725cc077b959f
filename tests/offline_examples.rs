//! The example questions of `docs/tools.md`, asked of the repository's own agents
//! with the offline provider (no key, no network), as a newcomer would.
//!
//! The questions come from `docs/tools.md`'s table (between its `offline
//! examples` markers), so the docs cannot show a question this test does
//! not ask. For each row the test checks that the turn called the tool the
//! row names and that the answer states the figure found at the row's JSON
//! pointer in that tool's output *of the same turn*: the figures are never
//! written here, so a change of the sample data does not break the test
//! and a wrong field in the answer does.

mod support;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{AppOptions, TestApp, spawn_app};

/// One row of `docs/tools.md`'s table.
#[derive(Debug)]
struct Example {
    agent: String,
    plan: String,
    question: String,
    tool: String,
    pointer: String,
}

/// The rows of `docs/tools.md`'s offline examples table.
fn readme_examples() -> Vec<Example> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/tools.md"))
        .expect("read docs/tools.md");
    let start = readme
        .find("<!-- offline examples")
        .expect("docs/tools.md has the offline examples table");
    let end = start
        + readme[start..]
            .find("<!-- end offline examples -->")
            .expect("the table's end marker");
    readme[start..end]
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|line| {
            let cells: Vec<&str> = line
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().trim_matches('`'))
                .collect();
            let [agent, plan, question, tool, pointer] = cells[..] else {
                panic!("a row of five cells: {line}");
            };
            Example {
                agent: agent.into(),
                plan: plan.into(),
                question: question.into(),
                tool: tool.into(),
                pointer: pointer.into(),
            }
        })
        .collect()
}

/// A figure as an answer writes it: a whole float without its `.0`.
fn as_written(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 => format!("{}", f as i64),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

async fn ask(app: &TestApp, agent: &str, plan: &str, question: &str) -> Value {
    let (status, body) = app
        .post("/v1/sessions", &json!({"agent": agent, "plan": plan}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let session = body["id"].as_str().expect("session id");
    let (status, body) = app.say(session, question).await;
    // 202: paused, a call waits for a person's confirmation.
    assert!(
        status == StatusCode::OK
            || (status == StatusCode::ACCEPTED && body["status"] == "awaiting_approval"),
        "{question}: {status} {body}"
    );
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_readme_example_question_is_answered_with_the_figure_it_asks_for() {
    let examples = readme_examples();
    assert!(
        examples.len() >= 9,
        "the table of docs/tools.md lost rows: {examples:?}"
    );
    let app = spawn_app(AppOptions::offline());
    let mut wrong = Vec::new();
    for ex in &examples {
        let body = ask(&app, &ex.agent, &ex.plan, &ex.question).await;
        let calls = body["tool_calls"].as_array().expect("tool_calls");
        let Some(call) = calls.iter().find(|c| c["name"] == ex.tool.as_str()) else {
            wrong.push(format!("{:?}: no {} call in {body}", ex.question, ex.tool));
            continue;
        };
        let Some(figure) = call["output"].pointer(&ex.pointer) else {
            wrong.push(format!(
                "{:?}: {} output has nothing at {}: {}",
                ex.question, ex.tool, ex.pointer, call["output"]
            ));
            continue;
        };
        let figure = as_written(figure);
        // A paused turn states what waits in `confirmations` instead.
        let answer = match body["status"].as_str() {
            Some("awaiting_approval") => body["confirmations"].to_string(),
            _ => body["answer"].as_str().unwrap_or_default().to_string(),
        };
        if figure.is_empty() || !answer.contains(&figure) {
            wrong.push(format!(
                "{:?}: the answer does not state {figure} ({}): {answer}",
                ex.question, ex.pointer
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The order is filled from the question (not called with no arguments and
/// refused by validation), and the turn pauses for a confirmation whose id
/// the reply gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_question_fills_symbol_side_and_quantity_and_waits_for_confirmation() {
    let app = spawn_app(AppOptions::offline());
    let body = ask(&app, "trading-copilot", "pro", "Buy 10 shares of AAPL").await;
    let call = &body["tool_calls"][0];
    assert_eq!(call["name"], "create_paper_order", "{body}");
    let args = &call["arguments"];
    assert_eq!(args["symbol"], "AAPL", "{body}");
    assert_eq!(args["side"], "buy", "{body}");
    assert_eq!(args["quantity"].as_f64(), Some(10.0), "{body}");
    let id = call["output"]["confirmation_id"]
        .as_str()
        .unwrap_or_else(|| panic!("a pending confirmation: {body}"));
    // The turn pauses until the order is decided.
    assert_eq!(body["status"], "awaiting_approval", "{body}");
    assert_eq!(body["confirmations"][0]["confirmation_id"], id, "{body}");

    let (status, pending) = app.get("/v1/confirmations").await;
    assert_eq!(status, StatusCode::OK, "{pending}");
    assert_eq!(
        pending["confirmations"][0]["confirmation_id"], id,
        "{pending}"
    );
}

/// An answer names the field asked for, not every field of the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_indicator_answer_is_the_indicator_not_a_dump_of_fields() {
    let app = spawn_app(AppOptions::offline());
    let body = ask(&app, "trading-copilot", "free", "Show the RSI for MSFT").await;
    let answer = body["answer"].as_str().unwrap();
    let output = &body["tool_calls"][0]["output"];
    let rsi = as_written(&output["data"]["indicators"]["RSI"]["value"]);
    assert!(answer.contains(&format!("RSI {rsi}")), "{answer}");
    assert!(answer.contains("MSFT"), "{answer}");
    assert!(answer.contains("[tool:indicators:v1]"), "{answer}");
    for other in ["bars used", "last close", "timeframe"] {
        assert!(!answer.contains(other), "{other} in {answer}");
    }
}
