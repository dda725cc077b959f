//! Typed answers (issue #39): an agent's `output_schema` and a message's
//! `response_format`, through the real HTTP API with the model faked at
//! the wire: the answer parsed into `output`, a miss asked again once and
//! then failed with `OUTPUT_SCHEMA_VIOLATION`, the schema in the prompt
//! when `[model] structured_output = "prompt"`, a workflow node reading a
//! field of a typed answer, the offline model's typed answer for the
//! shipped `quote` agent, and the official `openai` SDK's `parse()`.

mod support;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::mock_model::{MockModel, Reply};
use support::{AppOptions, agents_dir, spawn_app};

const SIGNAL: &str = r#"
name = "signal"
system_prompt = "You give trading signals."
tools = []
max_iterations = 1

[output_schema]
type = "object"
required = ["symbol", "action", "confidence"]
additionalProperties = false
[output_schema.properties.symbol]
type = "string"
[output_schema.properties.action]
enum = ["buy", "sell", "hold"]
[output_schema.properties.confidence]
type = "number"
minimum = 0
maximum = 1
"#;

const PLAIN: &str =
    "name = \"plain\"\nsystem_prompt = \"You answer.\"\ntools = []\nmax_iterations = 1\n";

fn app_with(model: &MockModel, config: &str) -> (support::TestApp, tempfile::TempDir) {
    let dir = agents_dir(&[("signal.toml", SIGNAL), ("plain.toml", PLAIN)]);
    let mut options = AppOptions::with_model(model)
        .agents(dir.path())
        .config_toml(config);
    options.max_retries = 0;
    (spawn_app(options), dir)
}

#[tokio::test]
async fn a_valid_answer_is_parsed_into_output_and_stored_with_the_turn() {
    let model = MockModel::start().await;
    model.push(Reply::text(
        r#"{"symbol": "AAPL", "action": "hold", "confidence": 0.62}"#,
    ));
    let (app, _dir) = app_with(&model, "");
    let session = app.session("signal").await;
    let (status, reply) = app.say(&session, "Signal for AAPL?").await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(
        reply["output"],
        json!({"symbol": "AAPL", "action": "hold", "confidence": 0.62})
    );
    assert_eq!(reply["iterations"], 1);
    // The request asked for the schema the way OpenAI takes it.
    let sent = &model.requests()[0]["response_format"];
    assert_eq!(sent["type"], "json_schema", "{sent}");
    assert_eq!(sent["json_schema"]["name"], "signal");
    assert_eq!(
        sent["json_schema"]["schema"]["required"],
        json!(["symbol", "action", "confidence"])
    );
    // Stored with the turn.
    let turn = reply["turn_id"].as_str().unwrap();
    let (_, record) = app
        .get(&format!("/v1/sessions/{session}/turns/{turn}"))
        .await;
    assert_eq!(record["outcome"]["output"]["action"], "hold", "{record}");
}

#[tokio::test]
async fn a_miss_is_asked_again_once_with_the_errors_then_the_turn_fails() {
    let model = MockModel::start().await;
    // First turn: a miss, then a valid answer.
    model.push(Reply::text("Hold AAPL, fairly confident."));
    model.push(Reply::text(
        r#"{"symbol": "AAPL", "action": "hold", "confidence": 0.5}"#,
    ));
    // Second turn: two misses.
    model.push(Reply::text(r#"{"symbol": "MSFT", "action": "panic"}"#));
    model.push(Reply::text(
        r#"{"symbol": "MSFT", "action": "sell", "confidence": 7}"#,
    ));
    let (app, _dir) = app_with(&model, "");
    let session = app.session("signal").await;

    let (status, reply) = app.say(&session, "Signal for AAPL?").await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["output"]["symbol"], "AAPL");
    assert_eq!(reply["iterations"], 2, "the retry is a model call");
    let retry = &model.requests()[1];
    let messages = retry["messages"].as_array().unwrap();
    let last = messages.last().unwrap()["content"].as_str().unwrap();
    assert!(last.contains("does not match"), "{last}");
    assert!(
        last.contains("not a JSON value"),
        "the errors go back: {last}"
    );
    assert_eq!(
        messages[messages.len() - 2]["content"],
        "Hold AAPL, fairly confident."
    );

    let (status, failed) = app.say(&session, "Signal for MSFT?").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{failed}");
    assert_eq!(
        failed["error"]["code"], "OUTPUT_SCHEMA_VIOLATION",
        "{failed}"
    );
    let errors = failed["error"]["details"]["errors"].as_array().unwrap();
    assert!(
        errors.iter().any(|e| e["code"] == "maximum"),
        "the second answer's errors: {failed}"
    );
    assert_eq!(model.request_count(), 4);

    // Neither miss is in the history; the valid answer is, once.
    let (_, history) = app.get(&format!("/v1/sessions/{session}/messages")).await;
    let text = history.to_string();
    assert!(!text.contains("fairly confident"), "{history}");
    assert!(!text.contains("panic"), "{history}");
    assert!(!text.contains("\\\"confidence\\\": 7"), "{history}");
    // The failed turn's record says why, with the errors.
    let (_, turns) = app.get(&format!("/v1/sessions/{session}/turns")).await;
    let failed_turn = turns["turns"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["phase"] == "failed")
        .unwrap_or_else(|| panic!("a failed turn: {turns}"))
        .clone();
    assert_eq!(failed_turn["error"]["code"], "OUTPUT_SCHEMA_VIOLATION");
    assert!(
        failed_turn["error"]["details"]["errors"].is_array(),
        "{failed_turn}"
    );
}

#[tokio::test]
async fn response_format_asks_per_message_and_a_bad_one_is_refused() {
    let model = MockModel::start().await;
    model.push(Reply::text(r#"{"city": "Lyon"}"#));
    model.push(Reply::text("just text"));
    let (app, _dir) = app_with(&model, "");
    let session = app.session("plain").await;
    let format = json!({"type": "json_schema", "json_schema": {
        "name": "place", "strict": true,
        "schema": {"type": "object", "required": ["city"], "additionalProperties": false,
                   "properties": {"city": {"type": "string"}}}}});
    let (status, reply) = app
        .post(
            &format!("/v1/sessions/{session}/messages"),
            &json!({"content": "Where?", "response_format": format}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["output"], json!({"city": "Lyon"}));
    assert_eq!(
        model.requests()[0]["response_format"]["json_schema"]["strict"],
        true
    );
    // The next message without one is text, as the agent is.
    let (status, reply) = app.say(&session, "And then?").await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert!(reply.get("output").is_none(), "{reply}");
    assert!(model.requests()[1].get("response_format").is_none());

    for bad in [
        json!({"type": "json_schema", "json_schema": {"name": "a b", "schema": {"type": "object"}}}),
        json!({"type": "json_schema", "json_schema": {"name": "list", "schema": {"type": "array"}}}),
        json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": 5}}}}}),
        json!({"type": "yaml"}),
        // Over 64 KiB of schema: refused, not stored with every step.
        json!({"type": "json_schema", "json_schema": {"name": "huge", "schema": {
            "type": "object", "description": "x".repeat(70 * 1024)}}}),
    ] {
        let (status, body) = app
            .post(
                &format!("/v1/sessions/{session}/messages"),
                &json!({"content": "x", "response_format": bad}),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    }
    assert_eq!(
        model.request_count(),
        2,
        "no refused message reached the model"
    );
}

#[tokio::test]
async fn structured_output_prompt_writes_the_schema_into_the_prompt() {
    let model = MockModel::start().await;
    model.push(Reply::text(
        "```json\n{\"symbol\": \"AAPL\", \"action\": \"buy\", \"confidence\": 1}\n```",
    ));
    let (app, _dir) = app_with(&model, "[model]\nstructured_output = \"prompt\"\n");
    let session = app.session("signal").await;
    let (status, reply) = app.say(&session, "Signal?").await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["output"]["action"], "buy");
    let sent = &model.requests()[0];
    assert!(sent.get("response_format").is_none(), "{sent}");
    let last = sent["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "system");
    assert!(
        last["content"].as_str().unwrap().contains("\"confidence\""),
        "{last}"
    );
}

#[tokio::test]
async fn a_workflow_node_reads_a_field_of_a_typed_answer() {
    let model = MockModel::start().await;
    model.set_responder(|request, _| {
        let last = request["messages"].as_array().unwrap().last().unwrap()["content"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if request.get("response_format").is_some() {
            Reply::text(r#"{"symbol": "NVDA", "action": "buy", "confidence": 0.9}"#)
        } else {
            Reply::text(&format!("noted: {last}"))
        }
    });
    let dir = agents_dir(&[("signal.toml", SIGNAL), ("plain.toml", PLAIN)]);
    std::fs::create_dir(dir.path().join("workflows")).unwrap();
    std::fs::write(
        dir.path().join("workflows/act.toml"),
        r#"
name = "act"
output = { symbol = "{{nodes.sig.output.symbol}}", said = "{{nodes.note.output}}" }
[[nodes]]
id = "sig"
agent = "signal"
prompt = "signal please"
[[nodes]]
id = "note"
agent = "plain"
prompt = "Act on {{nodes.sig.output.action}} for {{nodes.sig.output.symbol}}"
"#,
    )
    .unwrap();
    let mut options = AppOptions::with_model(&model).agents(dir.path());
    options.max_retries = 0;
    let app = spawn_app(options);
    let (status, run) = app
        .post(
            "/v1/workflows/act/runs",
            &json!({"input": {}, "wait": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(run["output"]["symbol"], "NVDA", "{run}");
    assert_eq!(run["output"]["said"], "noted: Act on buy for NVDA", "{run}");
}

#[tokio::test]
async fn the_offline_model_fills_the_shipped_quote_agents_schema() {
    let app = spawn_app(AppOptions::offline());
    let session = app.session("quote").await;
    let (status, reply) = app.say(&session, "What is the price of AAPL?").await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    let output = &reply["output"];
    assert_eq!(output["symbol"], "AAPL", "{reply}");
    assert!(output["price"].as_f64().unwrap() > 0.0, "{reply}");
    assert!(output["change_percent"].is_number(), "{reply}");
    assert!(
        ["up", "down", "flat"].contains(&output["trend"].as_str().unwrap()),
        "{reply}"
    );
    assert_eq!(output["sources"], json!(["tool:price:v1"]), "{reply}");
    assert_eq!(reply["tool_calls"][0]["name"], "get_price");
}

const SDK_PARSE: &str = r#"
import json, sys, openai
from typing import Literal
from pydantic import BaseModel
class Signal(BaseModel):
    symbol: str
    action: Literal["buy", "sell", "hold"]
    confidence: float
base = sys.argv[1]
client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
done = client.chat.completions.parse(model="plain", response_format=Signal,
    messages=[{"role": "user", "content": "Signal for TSLA?"}])
parsed = done.choices[0].message.parsed
print(json.dumps({"symbol": parsed.symbol, "action": parsed.action, "confidence": parsed.confidence}))
"#;

#[tokio::test]
async fn the_openai_sdk_parses_a_typed_answer_through_the_openai_door() {
    let model = MockModel::start().await;
    model.push(Reply::text(
        r#"{"symbol": "TSLA", "action": "sell", "confidence": 0.3}"#,
    ));
    let (app, _dir) = app_with(&model, "");
    let out = support::clients::python_ok(SDK_PARSE, &[&app.base], &[]).await;
    let parsed: Value = serde_json::from_str(out.trim()).expect("the script prints JSON");
    assert_eq!(
        parsed,
        json!({"symbol": "TSLA", "action": "sell", "confidence": 0.3})
    );
    let sent = &model.requests()[0]["response_format"];
    assert_eq!(sent["type"], "json_schema", "{sent}");
    assert_eq!(sent["json_schema"]["name"], "Signal", "{sent}");
}
