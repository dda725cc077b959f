//! The OpenAI door (issue #32), driven by the official `openai` Python
//! package (pinned in `tests/clients/requirements.txt`) and the Node one
//! (`tests/clients/package.json`), unchanged, against a keyed cadre with
//! the model faked at the wire: models, chat completions with and without
//! streaming, responses with `previous_response_id`, a paused turn, and
//! the SDK's own error classes for an unknown model and a bad key.

mod support;

use serde_json::Value;
use support::mock_model::{MockModel, Reply};
use support::{AppOptions, agent_toml, agents_dir, spawn_app};

async fn create_keys(dir: &std::path::Path, tenants: &[&str]) -> Vec<String> {
    let store = support::store::open_store(dir);
    let mut keys = Vec::new();
    for t in tenants {
        let (key, _) = cadre::tenants::create_key(&store, t, false).await.unwrap();
        keys.push(key);
    }
    keys
}

const SCRIPT: &str = r#"
import json, sys, openai
base, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
out = {}
out["models"] = [m.id for m in client.models.list()]
try:
    client.models.retrieve("nobody")
except openai.NotFoundError as e:
    out["unknown_model"] = [e.status_code, e.code]
try:
    client.chat.completions.create(model="nobody", messages=[{"role": "user", "content": "hi"}])
except openai.NotFoundError as e:
    out["unknown_chat_model"] = [e.status_code, e.code]
try:
    openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list()
except openai.AuthenticationError as e:
    out["bad_key"] = [e.status_code, e.code]

raw = client.chat.completions.with_raw_response.create(
    model="helper", user="u-7",
    messages=[{"role": "system", "content": "ignored"},
              {"role": "user", "content": "earlier question"},
              {"role": "assistant", "content": "earlier answer"},
              {"role": "user", "content": [{"type": "text", "text": "hello"}]}])
completion = raw.parse()
out["chat"] = {"content": completion.choices[0].message.content,
               "finish": completion.choices[0].finish_reason,
               "usage": completion.usage.model_dump(),
               "object": completion.object,
               "session": raw.headers.get("x-cadre-session")}

stream = client.chat.completions.create(model="helper", stream=True,
    stream_options={"include_usage": True},
    messages=[{"role": "user", "content": "stream please"}])
pieces, finish, usage = [], None, None
for chunk in stream:
    if chunk.usage:
        usage = chunk.usage.model_dump()
    for choice in chunk.choices:
        if choice.delta.content:
            pieces.append(choice.delta.content)
        if choice.finish_reason:
            finish = choice.finish_reason
out["chat_stream"] = {"text": "".join(pieces), "finish": finish, "usage": usage}

first = client.responses.create(model="helper", input="first response")
second = client.responses.create(model="helper", input=[{"role": "user", "content": "second response"}],
                                 previous_response_id=first.id)
again = client.responses.retrieve(second.id)
out["responses"] = {"first": first.output_text, "second": second.output_text,
                    "first_id": first.id, "second_id": second.id, "status": second.status,
                    "retrieved": again.output_text, "usage": second.usage.model_dump()}
with client.responses.stream(model="helper", input="stream a response") as s:
    deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
    final = s.get_final_response()
out["responses_stream"] = {"deltas": "".join(deltas), "final": final.output_text, "status": final.status}
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_client_talks_to_cadres_agents_unchanged() {
    let data = tempfile::tempdir().unwrap();
    let keys = create_keys(data.path(), &["acme"]).await;
    let model = MockModel::start().await;
    let agents = agents_dir(&[("helper.toml", &agent_toml("helper", &[], 3))]);
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .data_dir(data.path()),
    );
    // Each user message is answered "you said: <it>" (as deltas when the
    // call streams), with 10 prompt and 4 completion tokens.
    model.set_responder(|request: &Value, _| {
        let said = request["messages"]
            .as_array()
            .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_string();
        Reply::with_usage(10, 4, Reply::text(&format!("you said: {said}")))
    });
    let out = support::clients::python_ok(SCRIPT, &[&app.base, &keys[0]], &[]).await;
    let out: Value = serde_json::from_str(out.trim()).expect("the script's JSON");

    assert_eq!(out["models"], serde_json::json!(["helper"]), "{out}");
    assert_eq!(
        out["unknown_model"],
        serde_json::json!([404, "model_not_found"])
    );
    assert_eq!(
        out["unknown_chat_model"],
        serde_json::json!([404, "model_not_found"])
    );
    assert_eq!(out["bad_key"], serde_json::json!([401, "invalid_api_key"]));

    let chat = &out["chat"];
    assert_eq!(chat["content"], "you said: hello", "{out}");
    assert_eq!(chat["finish"], "stop");
    assert_eq!(chat["object"], "chat.completion");
    assert_eq!(chat["usage"]["prompt_tokens"], 10, "{out}");
    assert_eq!(chat["usage"]["completion_tokens"], 4);
    assert_eq!(chat["usage"]["total_tokens"], 14);
    // The completion is a stored session of the caller's tenant, with the
    // earlier messages and the user id.
    let session = chat["session"].as_str().expect("x-cadre-session");
    let client = app.with_key(&keys[0]);
    let (status, stored) = client.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(status, 200, "{stored}");
    assert_eq!(stored["user_id"], "u-7", "{stored}");
    let (_, history) = client
        .get(&format!("/v1/sessions/{session}/messages"))
        .await;
    let contents: Vec<&str> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(
        contents,
        vec![
            "earlier question",
            "earlier answer",
            "hello",
            "you said: hello"
        ],
        "{history}"
    );
    // The model saw the earlier turn.
    let asked = model.requests();
    assert!(
        asked
            .iter()
            .any(|r| r.to_string().contains("earlier answer")),
        "the earlier messages did not reach the model"
    );

    let streamed = &out["chat_stream"];
    assert_eq!(streamed["text"], "you said: stream please", "{out}");
    assert_eq!(streamed["finish"], "stop");
    assert_eq!(streamed["usage"]["total_tokens"], 14, "{out}");

    let responses = &out["responses"];
    assert_eq!(responses["first"], "you said: first response", "{out}");
    assert_eq!(responses["second"], "you said: second response");
    assert_eq!(responses["retrieved"], "you said: second response");
    assert_eq!(responses["status"], "completed");
    assert_eq!(responses["usage"]["total_tokens"], 14);
    // previous_response_id continued the same session.
    let session_of = |id: &str| {
        id.trim_start_matches("resp_")
            .rsplit_once("__")
            .unwrap()
            .0
            .to_string()
    };
    assert_eq!(
        session_of(responses["first_id"].as_str().unwrap()),
        session_of(responses["second_id"].as_str().unwrap())
    );
    let streamed = &out["responses_stream"];
    assert_eq!(streamed["deltas"], "you said: stream a response", "{out}");
    assert_eq!(streamed["final"], "you said: stream a response");
    assert_eq!(streamed["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_openai_client_makes_one_round_trip() {
    let model = MockModel::start().await;
    let agents = agents_dir(&[("helper.toml", &agent_toml("helper", &[], 3))]);
    let app = spawn_app(AppOptions::with_model(&model).agents(agents.path()));
    model.push(Reply::text("hello from node"));
    let script = r#"
import OpenAI from "openai";
const client = new OpenAI({ baseURL: process.argv[2] + "/v1", apiKey: "unused-open-server", maxRetries: 0 });
const completion = await client.chat.completions.create({ model: "helper", messages: [{ role: "user", content: "hi" }] });
console.log(JSON.stringify({ content: completion.choices[0].message.content }));
"#;
    let out = support::clients::node_ok(script, &[&app.base], &[]).await;
    let out: Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(out["content"], "hello from node");
}

/// A turn paused for approval ends the completion with a text naming the
/// confirmation; the response is `incomplete` (`awaiting_approval`) until
/// it is decided, then `completed`. A retry with the same
/// `Idempotency-Key` gets the first answer (replayed), not a second turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_and_idempotency_keys_through_the_openai_client() {
    let app = spawn_app(AppOptions::offline());
    let script = r#"
import json, sys, time, httpx, openai
base = sys.argv[1]
client = openai.OpenAI(base_url=base + "/v1", api_key="open-server", max_retries=0)
out = {}
chat = client.chat.completions.create(model="trading-copilot",
    messages=[{"role": "user", "content": "Buy 10 shares of AAPL"}])
out["chat"] = chat.choices[0].message.content
response = client.responses.create(model="trading-copilot", input="Buy 10 shares of AAPL")
out["paused"] = [response.status, response.incomplete_details.reason, response.output_text]
held = [w for w in response.output_text.replace(",", " ").split() if w.startswith("conf_")][0].rstrip(":")
decided = httpx.post(f"{base}/v1/confirmations/{held}", json={"approve": True})
out["decided"] = decided.json()["status"]
deadline = time.time() + 20
while True:
    again = client.responses.retrieve(response.id)
    # incomplete while it waits, in_progress once resumed, then its end.
    if again.status in ("completed", "failed", "cancelled") or time.time() > deadline:
        break
    time.sleep(0.05)
out["after"] = [again.status, again.output_text]
first = client.chat.completions.with_raw_response.create(model="trading-copilot",
    messages=[{"role": "user", "content": "What is the price of AAPL?"}],
    extra_headers={"Idempotency-Key": "retry-1"})
second = client.chat.completions.with_raw_response.create(model="trading-copilot",
    messages=[{"role": "user", "content": "What is the price of AAPL?"}],
    extra_headers={"Idempotency-Key": "retry-1"})
out["keyed"] = [first.parse().id, second.parse().id, second.headers.get("idempotent-replayed"),
                first.headers.get("x-cadre-session"), second.headers.get("x-cadre-session")]
print(json.dumps(out))
"#;
    let out = support::clients::python_ok(script, &[&app.base], &[]).await;
    let out: Value = serde_json::from_str(out.trim()).expect("JSON");
    let chat = out["chat"].as_str().unwrap();
    assert!(chat.starts_with("[awaiting approval]"), "{chat}");
    assert!(
        chat.contains("conf_") && chat.contains("POST /v1/confirmations/"),
        "{chat}"
    );
    assert_eq!(out["paused"][0], "incomplete", "{out}");
    assert_eq!(out["paused"][1], "awaiting_approval");
    assert_eq!(out["decided"], "executed", "{out}");
    assert_eq!(out["after"][0], "completed", "{out}");
    assert!(!out["after"][1].as_str().unwrap().is_empty(), "{out}");
    let keyed = &out["keyed"];
    assert_eq!(keyed[0], keyed[1], "the retry ran a second turn: {out}");
    assert_eq!(keyed[2], "true", "{out}");
    // The completion's id names its session (a replay has no header).
    let session = keyed[3].as_str().unwrap();
    assert!(
        keyed[1]
            .as_str()
            .unwrap()
            .starts_with(&format!("chatcmpl-{session}__")),
        "{out}"
    );
}

/// Each earlier message of a chat completion is recorded (one write): a
/// body of hundreds of tiny messages is refused with a 400 in OpenAI's
/// shape, and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_earlier_messages_are_refused_before_any_write() {
    let model = MockModel::start().await;
    let agents = agents_dir(&[("helper.toml", &agent_toml("helper", &[], 3))]);
    let app = spawn_app(AppOptions::with_model(&model).agents(agents.path()));
    let mut messages: Vec<Value> = (0..300)
        .map(|i| serde_json::json!({"role": "user", "content": format!("m{i}")}))
        .collect();
    messages.push(serde_json::json!({"role": "user", "content": "last"}));
    let (status, body) = app
        .post(
            "/v1/chat/completions",
            &serde_json::json!({"model": "helper", "messages": messages}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "messages", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let (_, sessions) = app.get("/v1/sessions").await;
    assert_eq!(sessions["sessions"], serde_json::json!([]), "{sessions}");
    assert_eq!(model.request_count(), 0);
}
