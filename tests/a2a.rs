//! cadre's A2A v1.0 server (issue #32, part 2), driven by the official
//! clients: `a2a-sdk` 1.3.0 from Python (JSON-RPC and HTTP+JSON bindings)
//! and `@a2a-js/sdk` 1.3.0 from Node, installed by the suite
//! ([`support::clients`]), and raw HTTP where the SDKs would hide what is
//! checked (error codes, a body that is not an object). The model is the
//! mock at the wire.
//!
//! SDK client ──card (public)──▶ /a2a/{agent}/.well-known/agent-card.json
//!            ──JSON-RPC / HTTP+JSON──▶ /a2a/{agent} ──▶ a cadre turn (task) in a session (context)

mod support;

use std::path::Path;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{AppOptions, Client, MockModel, Reply, TestApp, agent_toml, agents_dir, spawn_app};

/// Upper bound for anything a test waits for.
const PATIENCE: Duration = Duration::from_secs(30);

/// Creates one non-admin key per tenant in `dir`'s store (closed again).
async fn create_keys(dir: &Path, tenants: &[&str]) -> Vec<String> {
    let store = support::store::open_store(dir);
    let mut keys = Vec::new();
    for tenant in tenants {
        let (key, _) = cadre::tenants::create_key(&store, tenant, false)
            .await
            .expect("key created");
        keys.push(key);
    }
    drop(store);
    keys
}

/// `helper` (no tools) and `trader` (a paper order waits for a person).
fn agents() -> tempfile::TempDir {
    agents_dir(&[
        ("helper.toml", &helper_toml()),
        (
            "trader.toml",
            &agent_toml("trader", &["create_paper_order"], 4),
        ),
    ])
}

fn helper_toml() -> String {
    format!(
        "{}description = \"Answers questions, briefly.\"\n",
        agent_toml("helper", &[], 4)
    )
}

/// A keyed app (tenants acme and globex) with the mock model.
struct Keyed {
    app: TestApp,
    acme: String,
    globex: String,
    _data: tempfile::TempDir,
    _agents: tempfile::TempDir,
}

async fn keyed(model: &MockModel) -> Keyed {
    let data = tempfile::tempdir().expect("temp dir");
    let keys = create_keys(data.path(), &["acme", "globex"]).await;
    let agents = agents();
    let app = spawn_app(
        AppOptions::with_model(model)
            .agents(agents.path())
            .data_dir(data.path()),
    );
    let [acme, globex] = <[String; 2]>::try_from(keys).expect("two keys");
    Keyed {
        app,
        acme,
        globex,
        _data: data,
        _agents: agents,
    }
}

/// A JSON-RPC call; the HTTP status and the body.
async fn rpc(client: &Client, agent: &str, method: &str, params: Value) -> (StatusCode, Value) {
    client
        .post(
            &format!("/a2a/{agent}"),
            &json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}),
        )
        .await
}

fn user_message(text: &str, context: Option<&str>) -> Value {
    let mut m = json!({
        "messageId": uuid_like(text),
        "role": "ROLE_USER",
        "parts": [{"text": text}],
    });
    if let Some(c) = context {
        m["contextId"] = json!(c);
    }
    m
}

/// A message id: unique within the test process.
fn uuid_like(seed: &str) -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("m-{n}-{}", seed.len())
}

/// The events of an SSE response, each `data:` as JSON, until it closes.
async fn sse_events(response: reqwest::Response) -> Vec<Value> {
    let text = tokio::time::timeout(PATIENCE, response.text())
        .await
        .expect("the stream closes")
        .expect("the stream reads");
    text.split("\n\n")
        .filter_map(|frame| {
            let data: Vec<&str> = frame
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim_start)
                .collect();
            (!data.is_empty()).then(|| serde_json::from_str(&data.join("\n")).expect("JSON data"))
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The Python SDK, JSON-RPC and HTTP+JSON
// ---------------------------------------------------------------------------

/// Card through `create_client`, a blocking send, a streamed send in the
/// same context, ListTasks by that context, GetTask: one line of JSON per
/// step. argv: agent URL, key, binding (`JSONRPC` or `HTTP+JSON`).
const SDK_ROUND_TRIP: &str = r#"
import asyncio, json, sys, uuid
import httpx
from a2a.client import create_client, ClientConfig
from a2a.types import (CancelTaskRequest, GetTaskRequest, ListTasksRequest, Message, Part, Role,
                       SendMessageRequest)
from a2a.utils.errors import TaskNotCancelableError
from google.protobuf.json_format import MessageToDict

url, key, binding = sys.argv[1], sys.argv[2], sys.argv[3]

def out(step, value):
    print(json.dumps({"step": step, "value": value}), flush=True)

def message(text, context=None):
    m = Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()), parts=[Part(text=text)])
    if context:
        m.context_id = context
    return m

async def main():
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30)
    config = lambda streaming: ClientConfig(httpx_client=http, streaming=streaming,
                                            supported_protocol_bindings=[binding])
    blocking = await create_client(url, client_config=config(False))
    out("card", MessageToDict(blocking._card))
    first = [MessageToDict(e) async for e in blocking.send_message(SendMessageRequest(message=message("hello")))]
    out("send", first)
    context = first[0]["task"]["contextId"]
    streaming = await create_client(url, client_config=config(True))
    events = [MessageToDict(e) async for e in
              streaming.send_message(SendMessageRequest(message=message("and again", context)))]
    out("stream", events)
    listed = await blocking.list_tasks(ListTasksRequest(context_id=context, include_artifacts=True))
    out("list", MessageToDict(listed, always_print_fields_with_no_presence=True))
    task = await blocking.get_task(GetTaskRequest(id=first[0]["task"]["id"]))
    out("get", MessageToDict(task))
    try:
        await blocking.cancel_task(CancelTaskRequest(id=task.id))
        out("cancel", "canceled")
    except TaskNotCancelableError as e:
        out("cancel", type(e).__name__)
    await blocking.close()
    await streaming.close()

asyncio.run(main())
"#;

fn steps(output: &str) -> std::collections::HashMap<String, Value> {
    output
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON line");
            (v["step"].as_str().unwrap().to_string(), v["value"].clone())
        })
        .collect()
}

fn texts(parts: &Value) -> String {
    parts
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["text"].as_str())
        .collect()
}

async fn sdk_round_trip(binding: &str) {
    let model = MockModel::start().await;
    model.push_all([Reply::text("Hello back."), Reply::deltas("stream ", 3)]);
    let keyed = keyed(&model).await;
    let url = format!("{}/a2a/helper", keyed.app.base);
    let output =
        support::clients::python_ok(SDK_ROUND_TRIP, &[&url, &keyed.acme, binding], &[]).await;
    let steps = steps(&output);

    let card = &steps["card"];
    assert_eq!(card["name"], "helper", "{card}");
    assert_eq!(card["description"], "Answers questions, briefly.");
    assert_eq!(card["capabilities"]["streaming"], true);
    let bindings: Vec<&str> = card["supportedInterfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["protocolBinding"].as_str().unwrap())
        .collect();
    assert_eq!(bindings, ["JSONRPC", "HTTP+JSON"]);
    assert_eq!(
        card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"],
        "Bearer"
    );
    assert!(
        card["securityRequirements"][0]["schemes"]["bearer"].is_object(),
        "{card}"
    );

    let sent = &steps["send"][0]["task"];
    assert_eq!(sent["status"]["state"], "TASK_STATE_COMPLETED", "{sent}");
    assert_eq!(texts(&sent["artifacts"][0]["parts"]), "Hello back.");
    let context = sent["contextId"].as_str().unwrap();
    assert!(sent["id"].as_str().unwrap().starts_with(context), "{sent}");

    // Task first, then updates, the last one completed; the artifact
    // pieces add up to the answer the final chunk repeats whole.
    let events = steps["stream"].as_array().unwrap();
    assert!(events[0]["task"].is_object(), "{events:?}");
    assert_eq!(events[0]["task"]["contextId"], context);
    let last = events.last().unwrap();
    assert_eq!(
        last["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{events:?}"
    );
    let pieces: Vec<&Value> = events
        .iter()
        .filter_map(|e| e.get("artifactUpdate"))
        .collect();
    assert!(pieces.len() >= 2, "{events:?}");
    let appended: String = pieces[..pieces.len() - 1]
        .iter()
        .map(|p| texts(&p["artifact"]["parts"]))
        .collect();
    let whole = pieces.last().unwrap();
    assert_eq!(whole["lastChunk"], true);
    assert_eq!(texts(&whole["artifact"]["parts"]), "stream stream stream ");
    assert_eq!(appended, "stream stream stream ");

    let listed = &steps["list"];
    let tasks = listed["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2, "{listed}");
    assert_eq!(listed["nextPageToken"], "");
    assert!(tasks.iter().all(|t| t["contextId"] == context));
    assert_eq!(texts(&tasks[0]["artifacts"][0]["parts"]), "Hello back.");

    let got = &steps["get"];
    assert_eq!(got["id"], sent["id"]);
    assert_eq!(got["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(texts(&got["history"][0]["parts"]), "hello");
    assert_eq!(steps["cancel"], "TaskNotCancelableError");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_reads_the_card_sends_streams_lists_and_gets_over_json_rpc() {
    sdk_round_trip("JSONRPC").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_does_the_same_over_http_json() {
    sdk_round_trip("HTTP+JSON").await;
}

// ---------------------------------------------------------------------------
// Approvals, tenants, errors (raw HTTP)
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_paused_for_approval_is_input_required_and_a_subscriber_sees_it_end() {
    let model = MockModel::start().await;
    model.push_all([
        Reply::tool_call(
            "c1",
            "create_paper_order",
            r#"{"symbol": "AAPL", "side": "buy", "quantity": 1, "order_type": "market"}"#,
        ),
        Reply::text("Your order is placed."),
        Reply::tool_call(
            "c2",
            "create_paper_order",
            r#"{"symbol": "MSFT", "side": "buy", "quantity": 2, "order_type": "market"}"#,
        ),
    ]);
    let keyed = keyed(&model).await;
    let acme = keyed.app.with_key(&keyed.acme);
    // The new session's user (paper orders are a user's) from the metadata.
    let mut message = user_message("buy one AAPL", None);
    message["metadata"] = json!({"userId": "alice"});
    let (status, body) = rpc(&acme, "trader", "SendMessage", json!({"message": message})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let task = &body["result"]["task"];
    assert_eq!(
        task["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{body}"
    );
    let held = &task["status"]["message"]["metadata"]["confirmations"][0];
    let confirmation = held["confirmation_id"].as_str().expect("a confirmation id");
    let said = texts(&task["status"]["message"]["parts"]);
    assert!(said.contains(confirmation), "{said}");
    assert!(
        said.contains(&format!("POST /v1/confirmations/{confirmation}")),
        "{said}"
    );
    let id = task["id"].as_str().unwrap().to_string();

    // A subscriber gets the task as it stands, then sees it end once a
    // person approves.
    let subscribe = acme
        .request(reqwest::Method::POST, "/a2a/trader")
        .header("Accept", "text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": "s", "method": "SubscribeToTask", "params": {"id": id}}))
        .send()
        .await
        .unwrap();
    assert_eq!(subscribe.status(), StatusCode::OK);
    assert!(
        subscribe.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = tokio::spawn(sse_events(subscribe));
    let (status, decided) = acme
        .post(
            &format!("/v1/confirmations/{confirmation}"),
            &json!({"approve": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{decided}");
    let events = events.await.unwrap();
    assert_eq!(events[0]["id"], "s");
    assert_eq!(
        events[0]["result"]["task"]["status"]["state"],
        "TASK_STATE_INPUT_REQUIRED"
    );
    let last = &events.last().unwrap()["result"];
    assert_eq!(
        last["statusUpdate"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{events:?}"
    );
    let answer = events
        .iter()
        .find_map(|e| e["result"].get("artifactUpdate"))
        .expect("the answer");
    assert_eq!(texts(&answer["artifact"]["parts"]), "Your order is placed.");

    // Subscribing to a task that has ended is UnsupportedOperation.
    let (_, again) = rpc(&acme, "trader", "SubscribeToTask", json!({"id": id})).await;
    assert_eq!(again["error"]["code"], -32004, "{again}");

    // A streamed send that pauses closes at input-required, naming the
    // confirmation.
    let mut message = user_message("buy two MSFT", None);
    message["metadata"] = json!({"userId": "alice"});
    let stream = acme
        .request(reqwest::Method::POST, "/a2a/trader/message:stream")
        .header("Accept", "text/event-stream")
        .json(&json!({ "message": message }))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    let events = sse_events(stream).await;
    assert!(events[0]["task"].is_object(), "{events:?}");
    let last = &events.last().unwrap()["statusUpdate"]["status"];
    assert_eq!(last["state"], "TASK_STATE_INPUT_REQUIRED", "{events:?}");
    let held = &last["message"]["metadata"]["confirmations"][0];
    assert_eq!(held["tool_name"], "create_paper_order", "{last}");
    assert!(
        texts(&last["message"]["parts"]).contains(held["confirmation_id"].as_str().expect("an id")),
        "{last}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_task_is_not_found_and_bad_requests_get_their_codes() {
    let model = MockModel::start().await;
    model.push(Reply::text("Mine."));
    let keyed = keyed(&model).await;
    let acme = keyed.app.with_key(&keyed.acme);
    let globex = keyed.app.with_key(&keyed.globex);
    let (_, body) = rpc(
        &acme,
        "helper",
        "SendMessage",
        json!({"message": user_message("hi", None)}),
    )
    .await;
    let task = body["result"]["task"].clone();
    let id = task["id"].as_str().expect("a task id");
    let context = task["contextId"].as_str().unwrap();

    // Another tenant: not found, exactly as an unknown id; its listing of
    // that context is empty; its message into it is refused.
    let (_, theirs) = rpc(&globex, "helper", "GetTask", json!({"id": id})).await;
    assert_eq!(theirs["error"]["code"], -32001, "{theirs}");
    let (_, unknown) = rpc(&globex, "helper", "GetTask", json!({"id": "nope~nope"})).await;
    assert_eq!(unknown["error"]["code"], -32001);
    assert_eq!(
        theirs["error"]["message"]
            .as_str()
            .unwrap()
            .replace(id, "X"),
        unknown["error"]["message"]
            .as_str()
            .unwrap()
            .replace("nope~nope", "X")
    );
    let (_, listed) = rpc(
        &globex,
        "helper",
        "ListTasks",
        json!({"contextId": context}),
    )
    .await;
    assert_eq!(listed["result"]["tasks"], json!([]), "{listed}");
    let (_, into) = rpc(
        &globex,
        "helper",
        "SendMessage",
        json!({"message": user_message("hi", Some(context))}),
    )
    .await;
    assert_eq!(into["error"]["code"], -32602, "{into}");
    let (status, rest) = globex.get(&format!("/a2a/helper/tasks/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{rest}");
    assert_eq!(rest["error"]["status"], "NOT_FOUND");
    assert_eq!(rest["error"]["details"][0]["reason"], "TASK_NOT_FOUND");
    assert_eq!(rest["error"]["details"][0]["domain"], "a2a-protocol.org");
    // The owner reads it; through another agent's door it is not found.
    let (_, mine) = rpc(&acme, "helper", "GetTask", json!({"id": id})).await;
    assert_eq!(mine["result"]["status"]["state"], "TASK_STATE_COMPLETED");
    let (_, elsewhere) = rpc(&acme, "trader", "GetTask", json!({"id": id})).await;
    assert_eq!(elsewhere["error"]["code"], -32001);

    // No key or a wrong one: 401 before anything is read; the card is public.
    let (status, _) = keyed.app.client.post("/a2a/helper", &json!({})).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = rpc(
        &keyed.app.with_key("cadre_wrong"),
        "helper",
        "GetTask",
        json!({"id": id}),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, card) = keyed
        .app
        .client
        .get("/a2a/helper/.well-known/agent-card.json")
        .await;
    assert_eq!(status, StatusCode::OK, "{card}");
    assert_eq!(card["name"], "helper");
    let (status, _) = keyed
        .app
        .client
        .get("/a2a/nobody/.well-known/agent-card.json")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // JSON-RPC's own errors.
    let (_, body) = rpc(&acme, "helper", "NoSuchMethod", json!({})).await;
    assert_eq!(body["error"]["code"], -32601, "{body}");
    assert_eq!(body["id"], 7);
    let (status, body) = acme.post("/a2a/helper", &json!([1, 2])).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["error"]["code"], -32600, "{body}");
    assert_eq!(body["id"], Value::Null);
    let (_, body) = acme.post_raw("/a2a/helper", b"{not json".to_vec()).await;
    assert_eq!(body["error"]["code"], -32700, "{body}");
    let (_, body) = rpc(&acme, "helper", "GetTask", json!({"nope": 1})).await;
    assert_eq!(body["error"]["code"], -32602, "{body}");
    let (_, body) = rpc(&acme, "helper", "CancelTask", json!({"id": id})).await;
    assert_eq!(body["error"]["code"], -32002, "{body}");
    let (_, body) = rpc(
        &acme,
        "helper",
        "CreateTaskPushNotificationConfig",
        json!({"taskId": id}),
    )
    .await;
    assert_eq!(body["error"]["code"], -32003, "{body}");
    let (_, body) = support::send(
        acme.request(reqwest::Method::POST, "/a2a/helper")
            .header("A2A-Version", "2.0")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": id}})),
    )
    .await;
    assert_eq!(body["error"]["code"], -32009, "{body}");
}

// ---------------------------------------------------------------------------
// kill -9 and restart of the real binary
// ---------------------------------------------------------------------------

const SDK_GET: &str = r#"
import asyncio, json, sys
import httpx
from a2a.client import create_client, ClientConfig
from a2a.types import GetTaskRequest
from google.protobuf.json_format import MessageToDict

async def main():
    http = httpx.AsyncClient(timeout=30)
    client = await create_client(sys.argv[1], client_config=ClientConfig(httpx_client=http))
    print(json.dumps(MessageToDict(await client.get_task(GetTaskRequest(id=sys.argv[2])))))
    await client.close()

asyncio.run(main())
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_task_still_answers_after_kill_9_and_a_restart() {
    let model = MockModel::start().await;
    model.push(Reply::text("Durable answer."));
    let data = tempfile::tempdir().unwrap();
    let agents = agents();
    let data_dir = data.path().join("data");
    let mut server =
        support::server::Server::start(&data_dir, agents.path(), &model.base_url(), &[]);
    let (_, body) = rpc(
        &server.client(),
        "helper",
        "SendMessage",
        json!({"message": user_message("remember this", None)}),
    )
    .await;
    let task = body["result"]["task"].clone();
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{body}");
    server.kill_9();
    let server = support::server::Server::start(&data_dir, agents.path(), &model.base_url(), &[]);
    let url = format!("{}/a2a/helper", server.base);
    let output =
        support::clients::python_ok(SDK_GET, &[&url, task["id"].as_str().unwrap()], &[]).await;
    let got: Value = serde_json::from_str(output.trim()).expect("the task as JSON");
    assert_eq!(got["id"], task["id"]);
    assert_eq!(got["contextId"], task["contextId"]);
    assert_eq!(got["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(texts(&got["artifacts"][0]["parts"]), "Durable answer.");
    assert_eq!(texts(&got["history"][0]["parts"]), "remember this");
}

// ---------------------------------------------------------------------------
// Node
// ---------------------------------------------------------------------------

const NODE_SEND: &str = r#"
import { ClientFactory } from "@a2a-js/sdk/client";
import { Role, taskStateToJSON } from "@a2a-js/sdk";
const [url] = process.argv.slice(2);
const client = await new ClientFactory().createFromUrl(url);
const result = await client.sendMessage({
  message: {
    messageId: crypto.randomUUID(), contextId: "", taskId: "", role: Role.ROLE_USER,
    parts: [{ content: { $case: "text", value: "from node" } }],
    extensions: [], referenceTaskIds: [],
  },
});
const task = result.payload?.value ?? result;
console.log(JSON.stringify({
  raw: result,
  state: taskStateToJSON(task.status.state),
  answer: task.artifacts.flatMap((a) => a.parts).map((p) => p.content?.value ?? p.text).join(""),
}));
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_sdk_sends_a_message() {
    let model = MockModel::start().await;
    model.push(Reply::text("Hello, Node."));
    let agents = agents();
    let app = spawn_app(AppOptions::with_model(&model).agents(agents.path()));
    // The JS SDK resolves the card's path against the URL: with the
    // trailing slash it is /a2a/helper/.well-known/agent-card.json.
    let url = format!("{}/a2a/helper/", app.base);
    let output = support::clients::node_ok(NODE_SEND, &[&url], &[]).await;
    let line = output
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .expect("JSON");
    let result: Value = serde_json::from_str(line).unwrap();
    assert_eq!(result["state"], "TASK_STATE_COMPLETED", "{result}");
    assert_eq!(result["answer"], "Hello, Node.", "{result}");
}

// ---------------------------------------------------------------------------
// Listings, returnImmediately, a REST subscription (raw HTTP)
// ---------------------------------------------------------------------------

/// Polls GetTask until the task reaches `state`; the task.
async fn task_reaches(client: &Client, agent: &str, id: &str, state: &str) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (_, body) = rpc(client, agent, "GetTask", json!({"id": id})).await;
        if body["result"]["status"]["state"] == state {
            return body["result"].clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task {id} never reached {state}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_tasks_pages_through_every_context_once_and_only_the_callers() {
    let model = MockModel::start().await;
    model.push_all([
        Reply::text("one"),
        Reply::text("two"),
        Reply::text("three"),
        Reply::slow(Duration::from_millis(300), Reply::text("four")),
    ]);
    let keyed = keyed(&model).await;
    let acme = keyed.app.with_key(&keyed.acme);
    let send = async |text: &str, context: Option<&str>, immediately: bool| {
        let (_, body) = rpc(
            &acme,
            "helper",
            "SendMessage",
            json!({
                "message": user_message(text, context),
                "configuration": {"returnImmediately": immediately},
            }),
        )
        .await;
        body["result"]["task"].clone()
    };
    let first = send("a", None, false).await;
    let a = first["contextId"].as_str().unwrap().to_string();
    // History: the user's message and the answer; `historyLength` trims it.
    assert_eq!(first["history"].as_array().unwrap().len(), 2, "{first}");
    let (_, one) = rpc(
        &acme,
        "helper",
        "GetTask",
        json!({"id": first["id"], "historyLength": 1}),
    )
    .await;
    let history = one["result"]["history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "{one}");
    assert_eq!(history[0]["role"], "ROLE_AGENT");
    assert_eq!(texts(&history[0]["parts"]), "one");
    let (_, none) = rpc(
        &acme,
        "helper",
        "GetTask",
        json!({"id": first["id"], "historyLength": 0}),
    )
    .await;
    assert!(none["result"].get("history").is_none(), "{none}");
    send("b", Some(&a), false).await;
    let third = send("c", None, false).await;
    let b = third["contextId"].as_str().unwrap().to_string();
    assert_ne!(a, b);
    // Answered at once, before the (slow) model has.
    let fourth = send("d", Some(&b), true).await;
    let state = fourth["status"]["state"].as_str().unwrap();
    assert!(
        state == "TASK_STATE_SUBMITTED" || state == "TASK_STATE_WORKING",
        "{fourth}"
    );
    let id = fourth["id"].as_str().unwrap();
    let done = task_reaches(&acme, "helper", id, "TASK_STATE_COMPLETED").await;
    assert_eq!(texts(&done["artifacts"][0]["parts"]), "four");

    // Without a context, one, two or three at a time (page ends inside a
    // session and at its end): every task once, then "".
    for size in 1..=3usize {
        let mut seen = Vec::new();
        let mut token = String::new();
        for page in 0.. {
            assert!(page < 5, "more pages than tasks: {seen:?}");
            let (_, body) = rpc(
                &acme,
                "helper",
                "ListTasks",
                json!({"pageSize": size, "pageToken": token}),
            )
            .await;
            let listed = &body["result"];
            let tasks = listed["tasks"].as_array().expect("tasks");
            assert!(tasks.len() <= size, "{listed}");
            for t in tasks {
                assert!(t.get("artifacts").is_none(), "artifacts left out: {t}");
                seen.push(t["id"].as_str().unwrap().to_string());
            }
            token = listed["nextPageToken"]
                .as_str()
                .expect("always present")
                .to_string();
            if token.is_empty() {
                assert_eq!(listed["totalSize"], 4, "{listed}");
                break;
            }
        }
        let mut unique = seen.clone();
        unique.sort();
        unique.dedup();
        assert_eq!((seen.len(), unique.len()), (4, 4), "size {size}: {seen:?}");
    }

    // One context; by state; another tenant sees none; a bad page size.
    let (_, body) = rpc(&acme, "helper", "ListTasks", json!({"contextId": b})).await;
    assert_eq!(
        body["result"]["tasks"].as_array().unwrap().len(),
        2,
        "{body}"
    );
    let (_, body) = rpc(
        &acme,
        "helper",
        "ListTasks",
        json!({"status": "TASK_STATE_FAILED"}),
    )
    .await;
    assert_eq!(body["result"]["tasks"], json!([]), "{body}");
    let (status, body) = keyed
        .app
        .with_key(&keyed.acme)
        .get("/a2a/helper/tasks?status=TASK_STATE_COMPLETED&pageSize=10")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["tasks"].as_array().unwrap().len(), 4, "{body}");
    let globex = keyed.app.with_key(&keyed.globex);
    let (_, body) = rpc(&globex, "helper", "ListTasks", json!({})).await;
    assert_eq!(body["result"]["tasks"], json!([]), "{body}");
    assert_eq!(body["result"]["nextPageToken"], "");
    let (_, body) = rpc(&acme, "helper", "ListTasks", json!({"pageSize": 0})).await;
    assert_eq!(body["error"]["code"], -32602, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rest_subscription_by_get_follows_a_running_task_to_its_end() {
    let model = MockModel::start().await;
    model.push(Reply::slow(
        Duration::from_millis(700),
        Reply::text("Slowly."),
    ));
    let agents = agents();
    let app = spawn_app(AppOptions::with_model(&model).agents(agents.path()));
    let (status, body) = app
        .post(
            "/a2a/helper/message:send",
            &json!({
                "message": user_message("take your time", None),
                "configuration": {"returnImmediately": true},
            }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let id = body["task"]["id"].as_str().unwrap();
    let response = app
        .client
        .request(
            reqwest::Method::GET,
            &format!("/a2a/helper/tasks/{id}:subscribe"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "{:?}",
        response.text().await
    );
    let events = sse_events(response).await;
    let first = &events[0]["task"];
    assert_eq!(first["id"], id, "{events:?}");
    assert_eq!(first["status"]["state"], "TASK_STATE_WORKING", "{events:?}");
    // The whole answer comes last (pieces of it may come before).
    let answer = events
        .iter()
        .filter_map(|e| e.get("artifactUpdate"))
        .next_back()
        .expect("the answer");
    assert_eq!(answer["lastChunk"], true, "{events:?}");
    assert_eq!(texts(&answer["artifact"]["parts"]), "Slowly.");
    assert_eq!(
        events.last().unwrap()["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED",
        "{events:?}"
    );
    // Ended: a second subscription is refused, in the REST error shape.
    let (status, body) = app
        .post(&format!("/a2a/helper/tasks/{id}:subscribe"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        body["error"]["details"][0]["reason"],
        "UNSUPPORTED_OPERATION"
    );
    let (status, body) = app
        .post(&format!("/a2a/helper/tasks/{id}:cancel"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["details"][0]["reason"], "TASK_NOT_CANCELABLE");
    let (status, _) = app
        .post(&format!("/a2a/helper/tasks/{id}:explode"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_context_gets_the_highest_plan_the_key_and_tenant_allow() {
    let model = MockModel::start().await;
    model.push(Reply::text("On the pro plan."));
    let agents = agents();
    let app = spawn_app(AppOptions::with_model(&model).agents(agents.path()));
    // The first key ends open mode; its admin makes acme's key and caps
    // the tenant at pro (the key itself would allow premium).
    let (status, made) = app
        .post("/v1/keys", &json!({"tenant": "ops", "admin": true}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let admin = app.with_key(made["key"].as_str().unwrap());
    let (status, made) = admin.post("/v1/keys", &json!({"tenant": "acme"})).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let acme = app.with_key(made["key"].as_str().unwrap());
    let (status, body) = admin
        .post("/v1/tenants/acme/config", &json!({"plan": "pro"}))
        .await;
    assert!(status.is_success(), "{body}");
    let (_, body) = rpc(
        &acme,
        "helper",
        "SendMessage",
        json!({"message": user_message("which plan?", None)}),
    )
    .await;
    let task = &body["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{body}");
    let context = task["contextId"].as_str().unwrap();
    let (_, session) = acme.get(&format!("/v1/sessions/{context}")).await;
    assert_eq!(session["plan"], "pro", "{session}");
    assert_eq!(session["tenant"], "acme", "{session}");
}

/// A subscriber of a task started with `returnImmediately` follows the
/// turn's log (`http::turn_log`): it gets the answer as the model writes
/// it, piece by piece (appended artifact updates), then the whole answer
/// and the end. (Following the record instead gives the answer once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_gets_the_answer_as_the_model_writes_it() {
    let model = MockModel::start().await;
    model.push(Reply::slow(
        Duration::from_millis(500),
        Reply::deltas("word ", 6),
    ));
    let agents = agents();
    let app = spawn_app(AppOptions::with_model(&model).agents(agents.path()));
    let (status, body) = app
        .post(
            "/a2a/helper/message:send",
            &json!({
                "message": user_message("talk", None),
                "configuration": {"returnImmediately": true},
            }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let id = body["task"]["id"].as_str().unwrap();
    let response = app
        .client
        .request(
            reqwest::Method::GET,
            &format!("/a2a/helper/tasks/{id}:subscribe"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let events = sse_events(response).await;
    let pieces: Vec<&Value> = events
        .iter()
        .filter_map(|e| e.get("artifactUpdate"))
        .filter(|a| a["append"] == true)
        .collect();
    let streamed: String = pieces
        .iter()
        .map(|a| texts(&a["artifact"]["parts"]))
        .collect();
    assert!(
        pieces.len() >= 2,
        "the answer came in one piece: {events:?}"
    );
    assert!("word ".repeat(6).ends_with(&streamed), "{streamed:?}");
    assert_eq!(
        events.last().unwrap()["statusUpdate"]["status"]["state"],
        "TASK_STATE_COMPLETED",
        "{events:?}"
    );
}
