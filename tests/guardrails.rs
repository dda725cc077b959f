//! Guardrails (issue #39) through the real HTTP API, the model faked at
//! the wire: an input regex that blocks before any model request, an input
//! redaction the model and the store never see the number of, an output
//! redaction that never reaches the data dir nor the SSE stream (its
//! deltas held), an output block, a tool-output guardrail that hides a
//! field from the model and the call record, a tool-input block that keeps
//! the tool from running, a tool-backed and an agent-backed guardrail,
//! and a tenant's guardrails running before the agent's.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cadre::tools::{FnHandler, ToolDefinition, ToolError, ToolHandler};
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::mock_model::{MockModel, Reply};
use support::{AppOptions, TestApp, spawn_app};

const CARD: &str = "4111 1111 1111 1111";
const CARD_PATTERN: &str = r"\b\d(?:[ -]?\d){12,15}\b";

fn agent(name: &str, tools: &[&str], guardrails: &str) -> String {
    let tools: Vec<String> = tools.iter().map(|t| format!("{t:?}")).collect();
    format!(
        "name = {name:?}\nsystem_prompt = \"You are {name}.\"\ntools = [{}]\nmax_iterations = 2\n{guardrails}",
        tools.join(", ")
    )
}

fn app_with(
    model: &MockModel,
    files: &[(&str, String)],
    tools: Vec<(ToolDefinition, Arc<dyn ToolHandler>)>,
) -> (TestApp, tempfile::TempDir) {
    app_with_config(model, files, tools, "")
}

fn app_with_config(
    model: &MockModel,
    files: &[(&str, String)],
    tools: Vec<(ToolDefinition, Arc<dyn ToolHandler>)>,
    config: &str,
) -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, text) in files {
        std::fs::write(dir.path().join(format!("{name}.toml")), text).unwrap();
    }
    let mut options = AppOptions::with_model(model)
        .agents(dir.path())
        .config_toml(config);
    options.max_retries = 0;
    for (def, handler) in tools {
        options = options.tool(def, handler);
    }
    (spawn_app(options), dir)
}

/// Whether any file under `dir` holds `needle` (the redb file included),
/// as raw bytes or inside a row the store keeps compressed.
fn data_dir_holds(dir: &std::path::Path, needle: &str) -> bool {
    let holds = |bytes: &[u8]| bytes.windows(needle.len()).any(|w| w == needle.as_bytes());
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path)
                && (holds(&bytes)
                    || cadre::store::codec::frames_in(&bytes)
                        .iter()
                        .any(|f| holds(f)))
            {
                return true;
            }
        }
    }
    false
}

async fn metrics(app: &TestApp) -> String {
    let (status, body) = app.get("/metrics").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body.as_str().unwrap().to_string()
}

fn record_tool(
    name: &str,
    output: Value,
) -> (ToolDefinition, Arc<dyn ToolHandler>, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let handler = FnHandler(move |_params: Value| {
        counter.fetch_add(1, Ordering::SeqCst);
        let output = output.clone();
        async move { Ok::<Value, ToolError>(output) }
    });
    let def = ToolDefinition::new(
        name,
        "Looks a customer up.",
        json!({"type": "object", "properties": {"note": {"type": "string"}}}),
    )
    .with_cache_ttl(0);
    (def, Arc::new(handler), runs)
}

#[tokio::test]
async fn an_input_regex_blocks_before_any_model_request_and_nothing_of_it_is_stored() {
    let model = MockModel::start().await;
    let rails = format!(
        "[[guardrails]]\nname = \"no-cards\"\nstage = \"input\"\nkind = \"regex\"\npattern = '{CARD_PATTERN}'\nmessage = \"Please do not send card numbers.\"\n"
    );
    let (app, _dir) = app_with(&model, &[("clerk", agent("clerk", &[], &rails))], vec![]);
    let session = app.session("clerk").await;
    let (status, body) = app
        .say(&session, &format!("my card is {CARD}, charge it"))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "GUARDRAIL_TRIPPED");
    assert_eq!(body["error"]["message"], "Please do not send card numbers.");
    assert_eq!(body["error"]["details"]["guardrail"], "no-cards");
    assert_eq!(body["error"]["details"]["stage"], "input");
    assert_eq!(model.request_count(), 0, "no model request was made");

    // The turn's record says so; no message was stored.
    let (_, turns) = app.get(&format!("/v1/sessions/{session}/turns")).await;
    let turn = &turns["turns"][0];
    assert_eq!(turn["phase"], "failed", "{turns}");
    assert_eq!(turn["error"]["code"], "GUARDRAIL_TRIPPED");
    assert_eq!(turn["error"]["details"]["guardrail"], "no-cards");
    let (_, messages) = app.get(&format!("/v1/sessions/{session}/messages")).await;
    assert_eq!(messages["messages"], json!([]), "{messages}");
    assert!(
        !data_dir_holds(&app.data_dir, CARD),
        "the card reached the data dir"
    );
    assert!(
        metrics(&app)
            .await
            .contains("cadre_guardrail_trips_total{guardrail=\"no-cards\",stage=\"input\"} 1"),
        "the trip is counted"
    );

    // A clean message goes through.
    model.push(Reply::text("done"));
    let (status, body) = app.say(&session, "charge the card on file").await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn an_input_redaction_reaches_neither_the_model_nor_the_store() {
    let model = MockModel::start().await;
    model.push(Reply::text("noted"));
    let rails = format!(
        "[[guardrails]]\nname = \"cards\"\nstage = \"input\"\nkind = \"regex\"\npattern = '{CARD_PATTERN}'\naction = \"redact\"\nreplacement = \"[card]\"\n"
    );
    let (app, _dir) = app_with(&model, &[("clerk", agent("clerk", &[], &rails))], vec![]);
    let session = app.session("clerk").await;
    let (status, body) = app.say(&session, &format!("card {CARD} please")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let sent = model.requests()[0].to_string();
    assert!(sent.contains("card [card] please"), "{sent}");
    assert!(!sent.contains(CARD), "{sent}");
    let (_, messages) = app.get(&format!("/v1/sessions/{session}/messages")).await;
    assert_eq!(messages["messages"][0]["content"], "card [card] please");
    assert!(!data_dir_holds(&app.data_dir, CARD));
}

#[tokio::test]
async fn an_output_redaction_never_reaches_the_store_or_the_stream() {
    let model = MockModel::start().await;
    model.push(Reply::deltas(&format!("Your card {CARD} is on file. "), 3));
    let rails = format!(
        "[[guardrails]]\nname = \"cards-out\"\nstage = \"output\"\nkind = \"regex\"\npattern = '{CARD_PATTERN}'\naction = \"redact\"\n"
    );
    let (app, _dir) = app_with(&model, &[("clerk", agent("clerk", &[], &rails))], vec![]);
    let session = app.session("clerk").await;
    let stream = reqwest::Client::new()
        .post(format!(
            "{}/v1/sessions/{session}/messages/stream",
            app.base
        ))
        .json(&json!({"content": "what card do I have?"}))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    let mut text = stream.text().await.unwrap();
    assert!(!text.contains(CARD), "the stream carried the card: {text}");
    let frames = support::sse::parse(&mut text);
    let deltas: Vec<&support::sse::Frame> =
        frames.iter().filter(|f| f.name == "model_delta").collect();
    assert_eq!(
        deltas.len(),
        1,
        "deltas are held, then sent whole: {frames:?}"
    );
    let whole = "Your card [redacted] is on file. ".repeat(3);
    assert_eq!(deltas[0].data["text"], whole, "{:?}", deltas[0]);
    let end = frames.last().unwrap();
    assert_eq!(end.name, "turn_completed", "{frames:?}");
    assert_eq!(end.data["answer"], whole, "{:?}", end.data);
    assert!(
        !data_dir_holds(&app.data_dir, CARD),
        "the card reached the data dir"
    );
    assert!(
        metrics(&app)
            .await
            .contains("cadre_guardrail_rewrites_total{guardrail=\"cards-out\",stage=\"output\"} 1")
    );
}

#[tokio::test]
async fn an_output_block_fails_the_turn_and_stores_no_answer() {
    let model = MockModel::start().await;
    model.push(Reply::text("You should buy crypto with your savings."));
    let rails = "[[guardrails]]\nname = \"no-advice\"\nstage = \"output\"\nkind = \"deny_topics\"\ntopics = [\"crypto\", \"stock tips\"]\n";
    let (app, _dir) = app_with(&model, &[("clerk", agent("clerk", &[], rails))], vec![]);
    let session = app.session("clerk").await;
    let (status, body) = app.say(&session, "what should I do?").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["details"]["stage"], "output");
    assert_eq!(
        body["error"]["message"],
        "blocked by guardrail no-advice (output)"
    );
    let (_, messages) = app.get(&format!("/v1/sessions/{session}/messages")).await;
    assert!(!messages.to_string().contains("crypto"), "{messages}");
}

#[tokio::test]
async fn a_tool_output_guardrail_hides_a_field_from_the_model_and_the_record() {
    let model = MockModel::start().await;
    model.push(Reply::tool_call("c1", "lookup", "{}"));
    model.push(Reply::text("found Ada"));
    let (lookup, handler, runs) = record_tool(
        "lookup",
        json!({"name": "Ada", "ssn": "078-05-1120", "accounts": [{"id": 1, "ssn": "078-05-1120"}]}),
    );
    let rails = "[[guardrails]]\nname = \"no-ssn\"\nstage = \"tool_output\"\nkind = \"drop_fields\"\nfields = [\"ssn\", \"accounts.ssn\"]\ntools = [\"lookup\"]\n";
    let (app, _dir) = app_with(
        &model,
        &[("clerk", agent("clerk", &["lookup"], rails))],
        vec![(lookup, handler)],
    );
    let session = app.session("clerk").await;
    let (status, body) = app.say(&session, "who is customer 1?").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let second = model.requests()[1].to_string();
    assert!(second.contains("Ada"), "{second}");
    assert!(
        !second.contains("078-05-1120"),
        "the model saw the field: {second}"
    );
    assert_eq!(
        body["tool_calls"][0]["output"],
        json!({"name": "Ada", "accounts": [{"id": 1}]})
    );
    let (_, calls) = app
        .get(&format!("/v1/calls?conversation_id={session}"))
        .await;
    let call = &calls["calls"][0];
    assert_eq!(
        call["output"],
        json!({"name": "Ada", "accounts": [{"id": 1}]}),
        "{calls}"
    );
    assert_eq!(
        call["guardrails"],
        json!([{"guardrail": "no-ssn", "stage": "tool_output", "action": "redact"}]),
        "{calls}"
    );
    assert!(!data_dir_holds(&app.data_dir, "078-05-1120"));
}

#[tokio::test]
async fn a_tool_input_block_keeps_the_tool_from_running() {
    let model = MockModel::start().await;
    model.push(Reply::tool_call(
        "c1",
        "lookup",
        &json!({"note": format!("card {CARD}")}).to_string(),
    ));
    model.push(Reply::text("could not look it up"));
    let (lookup, handler, runs) = record_tool("lookup", json!({"ok": true}));
    let rails = format!(
        "[[guardrails]]\nname = \"args-no-cards\"\nstage = \"tool_input\"\nkind = \"regex\"\npattern = '{CARD_PATTERN}'\n"
    );
    let (app, _dir) = app_with(
        &model,
        &[("clerk", agent("clerk", &["lookup"], &rails))],
        vec![(lookup, handler)],
    );
    let session = app.session("clerk").await;
    let (status, body) = app.say(&session, "look up my card").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the tool must not run");
    assert_eq!(
        body["tool_calls"][0]["error_type"], "GUARDRAIL_TRIPPED",
        "{body}"
    );
    let tool_message = model.requests()[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .cloned()
        .unwrap();
    assert!(
        tool_message["content"]
            .as_str()
            .unwrap()
            .contains("GUARDRAIL_TRIPPED"),
        "{tool_message}"
    );
    let (_, calls) = app
        .get(&format!("/v1/calls?conversation_id={session}"))
        .await;
    assert!(
        calls["calls"][0]["params"].is_null(),
        "a blocked call keeps no arguments: {calls}"
    );
}

#[tokio::test]
async fn a_tool_backed_guardrail_decides_and_a_failing_one_fails_closed() {
    let model = MockModel::start().await;
    let asked = Arc::new(AtomicUsize::new(0));
    let count = asked.clone();
    let moderate = FnHandler(move |params: Value| {
        count.fetch_add(1, Ordering::SeqCst);
        let text = params["text"].as_str().unwrap_or_default().to_string();
        async move {
            if text.contains("explode") {
                return Err(ToolError::failed("moderation backend down"));
            }
            Ok::<Value, ToolError>(if text.contains("crypto") {
                json!({"decision": "deny", "message": "We do not discuss crypto."})
            } else if text.contains("darn") {
                json!({"decision": "rewrite", "text": text.replace("darn", "d**n")})
            } else {
                json!({"decision": "allow"})
            })
        }
    });
    let def = ToolDefinition::new(
        "moderate",
        "Moderates a text.",
        json!({"type": "object", "properties": {"text": {"type": "string"}, "stage": {"type": "string"}}}),
    )
    .with_cache_ttl(0);
    let rails = "[[guardrails]]\nname = \"moderation\"\nstage = \"input\"\ntool = \"moderate\"\n";
    let (app, _dir) = app_with(
        &model,
        &[("clerk", agent("clerk", &[], rails))],
        vec![(def, Arc::new(moderate))],
    );
    let session = app.session("clerk").await;
    let (status, body) = app.say(&session, "tell me about crypto").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["message"], "We do not discuss crypto.");
    model.push(Reply::text("ok"));
    let (status, body) = app.say(&session, "darn printer").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(model.requests()[0].to_string().contains("d**n printer"));
    let (status, body) = app.say(&session, "explode").await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "fails closed: {body}"
    );
    assert_eq!(asked.load(Ordering::SeqCst), 3);
    assert_eq!(model.request_count(), 1);
}

#[tokio::test]
async fn an_agent_backed_guardrail_asks_its_agent_in_a_child_session() {
    let model = MockModel::start().await;
    // The checker agent answers by what it is shown; the clerk echoes.
    model.set_responder(|request, _| {
        let system = request["messages"][0]["content"]
            .as_str()
            .unwrap_or_default();
        let last = request["messages"].as_array().unwrap().last().unwrap()["content"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if system.contains("You are checker") {
            if last.contains("lawsuit") {
                Reply::text(r#"{"decision": "deny", "message": "Legal questions go to a person."}"#)
            } else {
                Reply::text("allow")
            }
        } else {
            Reply::text(&format!("clerk: {last}"))
        }
    });
    let rails = "[[guardrails]]\nname = \"legal\"\nstage = \"input\"\nagent = \"checker\"\n";
    let (app, _dir) = app_with(
        &model,
        &[
            ("clerk", agent("clerk", &[], rails)),
            ("checker", agent("checker", &[], "")),
        ],
        vec![],
    );
    let session = app.session("clerk").await;
    let (status, body) = app.say(&session, "can I file a lawsuit?").await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["message"], "Legal questions go to a person.");
    let (status, body) = app.say(&session, "opening hours?").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answer"], "clerk: opening hours?");
    // The checks ran in the clerk's child session of the checker.
    let (_, list) = app.get("/v1/sessions?agent=checker").await;
    assert_eq!(list["sessions"].as_array().unwrap().len(), 1, "{list}");
}

#[tokio::test]
async fn a_tenants_guardrails_run_before_the_agents_and_a_bad_one_is_refused() {
    let model = MockModel::start().await;
    model.push(Reply::text("fine"));
    let (app, _dir) = app_with(&model, &[("clerk", agent("clerk", &[], ""))], vec![]);
    let (status, body) = app
        .post(
            "/v1/tenants/default/config",
            &json!({"guardrails": [{"name": "bad", "stage": "input", "kind": "regex", "pattern": "(unclosed"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(body.to_string().contains("bad"), "{body}");
    let (status, body) = app
        .post(
            "/v1/tenants/default/config",
            &json!({"guardrails": [{"name": "short", "stage": "input", "kind": "max_length", "max": 20}]}),
        )
        .await;
    assert!(status.is_success(), "{body}");
    let session = app.session("clerk").await;
    let (status, body) = app
        .say(&session, "a message that is longer than twenty characters")
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["details"]["guardrail"], "short");
    let (status, body) = app.say(&session, "short one").await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn a_flood_of_refused_messages_is_throttled_by_the_write_share() {
    let model = MockModel::start().await;
    let rails = "[[guardrails]]\nname = \"no-x\"\nstage = \"input\"\nkind = \"regex\"\npattern = \"x{10}\"\n";
    // 64 KiB/s: a bucket of 256 KiB, as `tests/usage.rs` uses it.
    let (app, _dir) = app_with_config(
        &model,
        &[("clerk", agent("clerk", &[], rails))],
        vec![],
        "[tenants]\nwrite_kib_per_s = 64\n",
    );
    let session = app.session("clerk").await;
    let large = "x".repeat(200 * 1024);
    // Each refused message leaves a record: it pays as sent.
    for _ in 0..2 {
        let (status, body) = app.say(&session, &large).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    }
    let (status, body) = app.say(&session, &large).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "RATE_LIMITED", "{body}");
    assert_eq!(model.request_count(), 0);
}
