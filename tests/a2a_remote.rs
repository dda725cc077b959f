//! Remote agents as delegates (#32 part 3): an agent file's
//! `[[remote_agents]]` is offered as `ask_<name>`, and its calls go to a
//! real A2A v1.0 agent, served by the official `a2a-sdk` 1.3.0 (its
//! request handler, an `AgentExecutor` that answers `far got: <text>`,
//! uvicorn on a loopback port), with the model mocked at the wire.
//!
//! The remote logs every message it receives (`{"message_id", "text",
//! "task_id", "context_id"}` per line) and every `GetTask`, so a test
//! counts what reached it.

mod support;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{AppOptions, MockModel, Reply, TestApp, spawn_app};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// The remote A2A agent (a2a-sdk 1.3.0). Arguments: the log file and a
/// mode: `echo` answers at once; `wait` answers once `<log>.release`
/// exists; `big` answers 4 MiB; `input` asks "which account?"
/// (input-required), then answers the reply.
const REMOTE: &str = r#"
import asyncio, json, os, socket, sys
import uvicorn
from starlette.applications import Starlette
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandlerV2
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.helpers.proto_helpers import new_task_from_user_message, new_text_part
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill

LOG, MODE = sys.argv[1], sys.argv[2]

def log(entry):
    with open(LOG, "a") as f:
        f.write(json.dumps(entry) + "\n")

class Far(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message = context.message
        text = "".join(p.text for p in message.parts if p.HasField("text"))
        task = context.current_task or new_task_from_user_message(message)
        log({"message_id": message.message_id, "text": text,
             "task_id": task.id, "context_id": task.context_id})
        if context.current_task is None:
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work()
        if MODE == "wait":
            while not os.path.exists(LOG + ".release"):
                await asyncio.sleep(0.02)
        if MODE == "input" and context.current_task is None:
            await updater.requires_input(updater.new_agent_message([new_text_part("which account?")]))
            return
        answer = "x" * (4 << 20) if MODE == "big" else "far got: " + text
        await updater.add_artifact([new_text_part(answer)], name="answer")
        await updater.complete()

    async def cancel(self, context, event_queue):
        task = context.current_task
        await TaskUpdater(event_queue, task.id, task.context_id).cancel()

class Handler(DefaultRequestHandlerV2):
    async def on_get_task(self, *args, **kwargs):
        log({"get_task": True})
        return await super().on_get_task(*args, **kwargs)

    async def on_cancel_task(self, params, *args, **kwargs):
        log({"cancel_task": params.id})
        return await super().on_cancel_task(params, *args, **kwargs)

sock = socket.socket()
sock.bind(("127.0.0.1", 0))
port = sock.getsockname()[1]
card = AgentCard(
    name="far",
    description="The far agent: it echoes what it is asked.",
    version="1.0.0",
    supported_interfaces=[AgentInterface(url=f"http://127.0.0.1:{port}/rpc",
                                         protocol_binding="JSONRPC", protocol_version="1.0")],
    capabilities=AgentCapabilities(streaming=True),
    default_input_modes=["text/plain"],
    default_output_modes=["text/plain"],
    skills=[AgentSkill(id="echo", name="Echo", description="Echoes.", tags=["echo"])],
)
handler = Handler(agent_executor=Far(), task_store=InMemoryTaskStore(), agent_card=card)
app = Starlette(routes=create_agent_card_routes(card) + create_jsonrpc_routes(handler, rpc_url="/rpc"))
print(f"port {port}", flush=True)
uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
"#;

/// A running remote agent; killed when dropped.
struct Remote {
    _child: tokio::process::Child,
    url: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Remote {
    async fn start(mode: &str) -> Remote {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("far.log");
        let python = tokio::task::spawn_blocking(support::clients::python)
            .await
            .unwrap();
        let mut child = tokio::process::Command::new(python)
            .arg("-c")
            .arg(REMOTE)
            .arg(&log)
            .arg(mode)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the remote agent starts");
        let stdout = child.stdout.take().unwrap();
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the remote agent prints its port within 60 s")
            .unwrap()
            .expect("the remote agent printed its port");
        let port: u16 = line.strip_prefix("port ").unwrap().parse().unwrap();
        let url = format!("http://127.0.0.1:{port}");
        // Listening once the card answers.
        let card = format!("{url}/.well-known/agent-card.json");
        until("the remote agent serves its card", async || {
            reqwest::get(&card)
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
        Remote {
            _child: child,
            url,
            log,
            _dir: dir,
        }
    }

    /// The messages it received.
    fn messages(&self) -> Vec<Value> {
        self.entries()
            .into_iter()
            .filter(|e| e.get("message_id").is_some())
            .collect()
    }

    fn get_tasks(&self) -> usize {
        self.entries()
            .iter()
            .filter(|e| e.get("get_task").is_some())
            .count()
    }

    fn entries(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn release(&self) {
        std::fs::write(self.log.with_extension("log.release"), "").unwrap();
    }
}

/// Polls `what` until it holds (at most 60 s).
async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The lead agent's file: it may ask the remote agent `far` at `url`.
fn lead(url: &str) -> String {
    lead_with(url, "")
}

/// [`lead`] with more top-level keys.
fn lead_with(url: &str, more: &str) -> String {
    format!(
        "name = \"lead\"\ndescription = \"The lead agent.\"\nsystem_prompt = \"You are lead.\"\nmax_iterations = 4\n{more}\n\
         [[remote_agents]]\nname = \"far\"\nurl = \"{url}\"\n"
    )
}

/// The messages of the request after its last user message.
fn this_turn(request: &Value) -> Vec<Value> {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let last_user = messages
        .iter()
        .rposition(|m| m["role"] == "user")
        .unwrap_or(0);
    messages[last_user..].to_vec()
}

/// The lead asks far what the user asked ("ping" it answers itself), then
/// relays the tool's result.
fn lead_asks_far(model: &MockModel) {
    model.set_responder(|request, _| {
        let turn = this_turn(request);
        let question = turn[0]["content"].as_str().unwrap_or("").to_string();
        let result = turn
            .iter()
            .rev()
            .find(|m| m["role"] == "tool")
            .and_then(|m| m["content"].as_str().map(str::to_string));
        match result {
            None if question == "ping" => Reply::text("pong"),
            None => Reply::tool_call(
                "ask1",
                "ask_far",
                &json!({ "request": question }).to_string(),
            ),
            Some(result) => Reply::text(&format!("lead relays: {result}")),
        }
    });
}

fn app(model: &MockModel, url: &str) -> (TestApp, tempfile::TempDir) {
    app_of(model, &lead(url))
}

fn app_of(model: &MockModel, lead: &str) -> (TestApp, tempfile::TempDir) {
    let dir = support::agents_dir(&[("lead.toml", lead)]);
    let options = AppOptions::with_model(model)
        .agents(dir.path())
        .config_toml("[api_limit]\nper_second = 100000\nburst = 100000\n");
    (spawn_app(options), dir)
}

/// The `ask_far` tool the last model request offered.
fn offered_ask_far(model: &MockModel) -> Value {
    let requests = model.requests();
    let last = requests.last().expect("a model request");
    last["tools"]
        .as_array()
        .and_then(|ts| {
            ts.iter()
                .find(|t| t["function"]["name"] == "ask_far")
                .cloned()
        })
        .unwrap_or(Value::Null)
}

async fn calls_of(app: &TestApp, tool: &str) -> Vec<Value> {
    let (status, calls) = app.get("/v1/calls").await;
    assert_eq!(status, StatusCode::OK, "{calls}");
    calls["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["tool_name"] == tool)
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_agent_is_asked_like_a_local_one_and_its_answer_is_the_outcome() {
    let remote = Remote::start("echo").await;
    let model = MockModel::start().await;
    lead_asks_far(&model);
    let (app, _dir) = app(&model, &remote.url);
    let session = app.session("lead").await;

    let (status, body) = app.say(&session, "the weather").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let answer = body["answer"].as_str().unwrap();
    assert!(
        answer.contains("far got: the weather"),
        "the remote's answer is the tool's outcome: {answer}"
    );
    let messages = remote.messages();
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert!(
        messages[0]["message_id"]
            .as_str()
            .unwrap()
            .starts_with("cadre-"),
        "{messages:?}"
    );
    // Offered with the local delegates' parameters.
    let tool = offered_ask_far(&model);
    assert_eq!(
        tool["function"]["parameters"]["required"],
        json!(["request"]),
        "{tool}"
    );
    // Through the executor: one record of the call, with its outcome.
    let calls = calls_of(&app, "ask_far").await;
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["is_success"], true, "{calls:?}");
    assert_eq!(calls[0]["output"]["answer"], "far got: the weather");
    assert_eq!(calls[0]["output"]["state"], "completed");

    // The card read, the tool is described by it (the file gives none).
    until("ask_far is described by the card", async || {
        let (status, body) = app.say(&session, "ping").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        offered_ask_far(&model)["function"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("The far agent: it echoes what it is asked."))
    })
    .await;

    // Asking again from the session continues the same remote context.
    let (status, body) = app.say(&session, "the tide").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body["answer"]
            .as_str()
            .unwrap()
            .contains("far got: the tide")
    );
    let messages = remote.messages();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[0]["context_id"], messages[1]["context_id"]);
    assert_ne!(messages[0]["message_id"], messages[1]["message_id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_that_needs_input_says_so_and_the_next_ask_continues_its_task() {
    let remote = Remote::start("input").await;
    let model = MockModel::start().await;
    lead_asks_far(&model);
    let (app, _dir) = app(&model, &remote.url);
    let session = app.session("lead").await;

    let (status, body) = app.say(&session, "move my money").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let calls = calls_of(&app, "ask_far").await;
    assert_eq!(calls[0]["is_success"], true, "{calls:?}");
    assert_eq!(calls[0]["output"]["state"], "input_required", "{calls:?}");
    assert_eq!(calls[0]["output"]["answer"], "which account?", "{calls:?}");

    let (status, body) = app.say(&session, "the savings one").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body["answer"]
            .as_str()
            .unwrap()
            .contains("far got: the savings one"),
        "{body}"
    );
    let messages = remote.messages();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(
        messages[0]["task_id"], messages[1]["task_id"],
        "the same task continued: {messages:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_that_is_down_is_a_clear_tool_failure_and_the_turn_completes() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let model = MockModel::start().await;
    lead_asks_far(&model);
    let (app, _dir) = app(&model, &url);
    let session = app.session("lead").await;

    let (status, body) = app.say(&session, "the weather").await;
    assert_eq!(status, StatusCode::OK, "the turn completes: {body}");
    let answer = body["answer"].as_str().unwrap();
    assert!(
        answer.contains("cannot reach remote agent far"),
        "the model reads why: {answer}"
    );
    let calls = calls_of(&app, "ask_far").await;
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["is_success"], false, "{calls:?}");
    // Down at startup: cadre started, and offers the tool without the card.
    assert_eq!(
        offered_ask_far(&model)["function"]["description"],
        "Ask the far agent (a remote agent); its answer comes back as the result.",
    );
}

/// A server that answers every request with a 307 to `to`.
async fn redirecting_to(to: String) -> String {
    raw_server(Default::default(), move |path| {
        format!(
            "HTTP/1.1 307 Temporary Redirect\r\nLocation: {to}{path}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
    })
    .await
}

/// A server that answers every request with what `reply` makes of its
/// path, keeping each request's head in `heads`.
async fn raw_server(
    heads: Arc<Mutex<Vec<String>>>,
    reply: impl Fn(&str) -> String + Clone + Send + Sync + 'static,
) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let (reply, heads) = (reply.clone(), heads.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    use tokio::io::AsyncReadExt;
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let path = head.split(' ').nth(1).unwrap_or("/").to_string();
                heads.lock().unwrap().push(head);
                let reply = reply(&path);
                let _ = socket.write_all(reply.as_bytes()).await;
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_another_origin_is_refused() {
    let remote = Remote::start("echo").await;
    let url = redirecting_to(remote.url.clone()).await;
    let model = MockModel::start().await;
    lead_asks_far(&model);
    let (app, _dir) = app(&model, &url);
    let session = app.session("lead").await;

    let (status, body) = app.say(&session, "the weather").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let answer = body["answer"].as_str().unwrap();
    assert!(
        answer.contains("redirected to another origin: refused"),
        "{answer}"
    );
    assert!(remote.messages().is_empty(), "{:?}", remote.messages());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_remote_answer_is_refused_bounded() {
    let remote = Remote::start("big").await;
    let model = MockModel::start().await;
    lead_asks_far(&model);
    let (app, _dir) = app(&model, &remote.url);
    let session = app.session("lead").await;

    let (status, body) = app.say(&session, "everything").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let answer = body["answer"].as_str().unwrap();
    assert!(
        answer.contains("far answered more than 1048576 bytes: refused"),
        "{answer}"
    );
    assert!(answer.len() < 64 * 1024, "none of it reached the model");
    let calls = calls_of(&app, "ask_far").await;
    assert_eq!(calls[0]["is_success"], false, "{calls:?}");
    assert_eq!(remote.messages().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_while_the_remote_works_sends_the_message_once_and_the_turn_completes() {
    let remote = Remote::start("wait").await;
    let model = MockModel::start().await;
    lead_asks_far(&model);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agents = support::agents_dir(&[("lead.toml", &lead(&remote.url))]);
    let start = || support::server::Server::start(&data, agents.path(), &model.base_url(), &[]);
    let mut server = start();
    let client = server.client();
    let session = client.session("lead").await;
    let request = client
        .request(
            reqwest::Method::POST,
            &format!("/v1/sessions/{session}/messages"),
        )
        .json(&json!({"content": "the long one"}));
    let pending = tokio::spawn(request.send());
    // cadre polls the task: its id is recorded (before the first poll).
    until("cadre polls the remote task", async || {
        remote.get_tasks() > 0
    })
    .await;
    server.kill_9();
    drop(pending);
    assert_eq!(remote.messages().len(), 1);

    remote.release();
    let server = start();
    let client = server.client();
    let (_, turns) = client.get(&format!("/v1/sessions/{session}/turns")).await;
    let turn_id = turns["turns"][0]["turn_id"]
        .as_str()
        .expect("the turn")
        .to_string();
    let mut done = Value::Null;
    until("the resumed turn completes", async || {
        let (_, record) = client
            .get(&format!("/v1/sessions/{session}/turns/{turn_id}"))
            .await;
        done = record;
        done["phase"] == "completed"
    })
    .await;
    let answer = done["outcome"]["answer"].as_str().unwrap_or_default();
    assert!(
        answer.contains("far got: the long one"),
        "the turn completes with the remote's answer: {done}"
    );
    assert_eq!(
        remote.messages().len(),
        1,
        "the remote received the message exactly once: {:?}",
        remote.messages()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cutting_the_asking_turn_cancels_the_remote_task() {
    let remote = Remote::start("wait").await;
    let model = MockModel::start().await;
    lead_asks_far(&model);
    let (app, _dir) = app_of(&model, &lead_with(&remote.url, "multitask = \"interrupt\""));
    let session = app.session("lead").await;
    let first = app.client.spawn_post(
        &format!("/v1/sessions/{session}/messages"),
        json!({"content": "take your time"}),
    );
    until("cadre polls the remote task", async || {
        remote.get_tasks() > 0
    })
    .await;
    let (status, body) = app.say(&session, "ping").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, cut) = first.await.unwrap();
    assert_eq!(status, StatusCode::CONFLICT, "{cut}");
    let task_id = remote.messages()[0]["task_id"].clone();
    until("the remote is asked to cancel the task", async || {
        remote.entries().iter().any(|e| e["cancel_task"] == task_id)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_and_the_protocol_version_go_with_every_request() {
    let heads: Arc<Mutex<Vec<String>>> = Arc::default();
    let url = raw_server(heads.clone(), |_| {
        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string()
    })
    .await;
    // SAFETY: a variable only this test reads, set before the app starts.
    unsafe { std::env::set_var("CADRE_TEST_FAR_KEY", "far-secret") };
    let model = MockModel::start().await;
    lead_asks_far(&model);
    let lead = lead(&url) + "api_key_env = \"CADRE_TEST_FAR_KEY\"\n";
    let (app, _dir) = app_of(&model, &lead);
    let session = app.session("lead").await;
    let (status, body) = app.say(&session, "the weather").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        body["answer"].as_str().unwrap().contains("HTTP 404"),
        "{body}"
    );
    let heads = heads.lock().unwrap().clone();
    assert!(!heads.is_empty());
    for head in &heads {
        let head = head.to_ascii_lowercase();
        assert!(
            head.starts_with("get /.well-known/agent-card.json "),
            "{head}"
        );
        assert!(
            head.contains("\r\nauthorization: bearer far-secret\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\na2a-version: 1.0\r\n"), "{head}");
    }
    assert!(
        !body.to_string().contains("far-secret"),
        "the key is not in what the model reads"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_card_whose_interface_is_on_another_origin_is_refused() {
    let remote = Remote::start("echo").await;
    // A card naming the real remote's interface, served from elsewhere.
    let card = json!({
        "name": "far", "description": "Elsewhere.", "version": "1",
        "supportedInterfaces": [{"url": format!("{}/rpc", remote.url),
                                 "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
    })
    .to_string();
    let url = raw_server(Default::default(), move |_| {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{card}",
            card.len()
        )
    })
    .await;
    let model = MockModel::start().await;
    lead_asks_far(&model);
    let (app, _dir) = app(&model, &url);
    let session = app.session("lead").await;
    let (status, body) = app.say(&session, "the weather").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let answer = body["answer"].as_str().unwrap();
    assert!(answer.contains("another origin"), "{answer}");
    assert!(remote.messages().is_empty(), "{:?}", remote.messages());
}
