//! Agents asking agents (#31): `agents = ["analyst"]` offers the model
//! `ask_analyst`, whose call runs a turn of the analyst in a child
//! conversation, against the real server with the wire mock.
//!
//! The mock answers by who is asking: each agent's system prompt names it,
//! and a turn answers once it got a tool result back, so the parent and the
//! child each follow their own script whatever the order of their calls.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cadre::tools::{FnHandler, ToolDefinition, ToolError, ToolHandler};
use reqwest::StatusCode;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use support::{AppOptions, MockModel, Reply, TestApp, spawn_app};

/// An agent file: `name`, its prompt naming it, its tools and the agents it asks.
fn agent(name: &str, tools: &[&str], asks: &[&str]) -> String {
    agent_file(name, tools, asks, &[])
}

/// An agent file with handoffs.
fn agent_with_handoffs(name: &str, tools: &[&str], handoffs: &[&str]) -> String {
    agent_file(name, tools, &[], handoffs)
}

fn agent_file(name: &str, tools: &[&str], asks: &[&str], handoffs: &[&str]) -> String {
    let list = |xs: &[&str]| {
        xs.iter()
            .map(|x| format!("{x:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "name = {name:?}\ndescription = \"The {name} agent.\"\nsystem_prompt = \"You are {name}.\"\ntools = [{}]\nagents = [{}]\nhandoffs = [{}]\nmax_iterations = 4\n",
        list(tools),
        list(asks),
        list(handoffs)
    )
}

/// Which agent a request is for (its system prompt says `You are <name>.`).
fn asker(request: &Value) -> String {
    let system = request["messages"][0]["content"].as_str().unwrap_or("");
    system
        .split("You are ")
        .nth(1)
        .and_then(|s| s.split('.').next())
        .unwrap_or("")
        .to_string()
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

/// The tool names a request offers.
fn offered(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .filter_map(|t| t["function"]["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The content of the last tool result of this turn, if any.
fn last_tool_result(request: &Value) -> Option<String> {
    this_turn(request)
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str().map(str::to_string))
}

/// The last user message of the request.
fn question(request: &Value) -> String {
    this_turn(request)[0]["content"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

fn counting_tool(name: &str) -> (ToolDefinition, Arc<dyn ToolHandler>, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let handler = FnHandler(move |params: Value| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move { Ok::<Value, ToolError>(json!({"ran": params})) }
    });
    let def = ToolDefinition::new(
        name,
        "Counts its runs.",
        json!({"type": "object", "properties": {"what": {"type": "string"}}}),
    )
    .with_cache_ttl(0);
    (def, Arc::new(handler), runs)
}

fn app_with(
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
        .config_toml(&format!(
            "[api_limit]\nper_second = 100000\nburst = 100000\n{config}"
        ));
    options.max_retries = 0;
    for (def, handler) in tools {
        options = options.tool(def, handler);
    }
    (spawn_app(options), dir)
}

/// lead asks analyst (whose tool is `lookup`) what the user asked; each
/// answers with what its last tool gave it.
fn lead_and_analyst(model: &MockModel) {
    model.set_responder(|request, _| {
        let who = asker(request);
        match (who.as_str(), last_tool_result(request)) {
            ("lead", None) => Reply::tool_call(
                "ask1",
                "ask_analyst",
                &json!({"request": format!("please look into: {}", question(request))}).to_string(),
            ),
            ("lead", Some(result)) => Reply::text(&format!("lead relays: {result}")),
            ("analyst", None) => Reply::tool_call(
                "look1",
                "lookup",
                &json!({"what": question(request)}).to_string(),
            ),
            ("analyst", Some(_)) => {
                Reply::text(&format!("analyst found it ({})", question(request)))
            }
            (other, _) => Reply::text(&format!("unexpected agent {other:?}")),
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_asks_another_which_answers_with_its_own_prompt_and_tools() {
    let model = MockModel::start().await;
    lead_and_analyst(&model);
    let (lookup, handler, runs) = counting_tool("lookup");
    let (app, _dir) = app_with(
        &model,
        &[
            ("lead", agent("lead", &[], &["analyst"])),
            ("analyst", agent("analyst", &["lookup"], &[])),
        ],
        vec![(lookup, handler)],
        "",
    );
    let session = app.session("lead").await;
    let (status, body) = app.say(&session, "the weather").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let answer = body["answer"].as_str().unwrap();
    assert!(
        answer.contains("analyst found it (please look into: the weather)"),
        "the child's answer is the tool result: {answer}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // The boundary: the lead is offered ask_analyst, never the analyst's
    // tool; the analyst its tool, never ask_.
    let requests = model.requests();
    for r in &requests {
        match asker(r).as_str() {
            "lead" => assert_eq!(offered(r), vec!["ask_analyst"], "{r}"),
            "analyst" => assert_eq!(offered(r), vec!["lookup"], "{r}"),
            other => panic!("a request for {other:?}"),
        }
    }
    let ask = requests
        .iter()
        .find(|r| asker(r) == "lead")
        .and_then(|r| {
            r["tools"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["function"]["name"] == "ask_analyst")
                .cloned()
        })
        .expect("ask_analyst offered");
    assert!(
        ask["function"]["description"]
            .as_str()
            .unwrap()
            .contains("The analyst agent."),
        "described by the asked agent: {ask}"
    );
    assert_eq!(
        ask["function"]["parameters"]["required"],
        json!(["request"])
    );

    // The child session: the analyst's, linked to the parent's turn and call.
    let (_, list) = app.get("/v1/sessions?agent=analyst").await;
    let children = list["sessions"].as_array().expect("sessions").clone();
    assert_eq!(children.len(), 1, "{list}");
    let child = children[0]["id"].as_str().unwrap().to_string();
    let (status, shown) = app.get(&format!("/v1/sessions/{child}")).await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    let link = &shown["metadata"]["delegated_by"];
    assert_eq!(link["session_id"], session.as_str(), "{shown}");
    assert_eq!(link["turn_id"], body["turn_id"], "{shown}");
    assert_eq!(link["tool_call_id"], "ask1", "{shown}");
    assert_eq!(link["depth"], 1, "{shown}");

    // The child's model calls count toward the parent session too.
    let (_, summary) = app.get(&format!("/v1/sessions/{session}/summary")).await;
    assert_eq!(summary["token_usage"]["model_calls"], 2, "{summary}");
    assert_eq!(
        summary["delegated_token_usage"]["model_calls"], 2,
        "{summary}"
    );
    let (_, child_summary) = app.get(&format!("/v1/sessions/{child}/summary")).await;
    assert_eq!(
        child_summary["token_usage"]["model_calls"], 2,
        "{child_summary}"
    );
    assert_eq!(child_summary["delegated_token_usage"]["model_calls"], 0);

    // /v1/calls records the ask like any tool call.
    let (_, calls) = app
        .get(&format!("/v1/calls?conversation_id={session}"))
        .await;
    let names: Vec<&str> = calls["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .filter_map(|c| c["tool_name"].as_str())
        .collect();
    assert_eq!(names, vec!["ask_analyst"], "{calls}");

    // Asking again continues the same child: it remembers.
    let (status, _) = app.say(&session, "the tides").await;
    assert_eq!(status, StatusCode::OK);
    let (_, list) = app.get("/v1/sessions?agent=analyst").await;
    assert_eq!(list["sessions"].as_array().unwrap().len(), 1, "{list}");
    let (_, history) = app.get(&format!("/v1/sessions/{child}/messages")).await;
    let said: Vec<&str> = history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(
        said,
        vec![
            "please look into: the weather",
            "please look into: the tides"
        ]
    );
    // A client cannot make a session look like a child.
    let (status, body) = app
        .post(
            "/v1/sessions",
            &json!({"agent": "analyst", "metadata": {"delegated_by": {"session_id": session}}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_of_agents_ends_at_the_depth_cap_with_an_error_the_model_reads() {
    let model = MockModel::start().await;
    // ping asks pong, pong asks ping, ... each relays what it got back.
    model.set_responder(|request, _| {
        let who = asker(request);
        let other = if who == "ping" { "pong" } else { "ping" };
        match last_tool_result(request) {
            None => Reply::tool_call(
                "c",
                &format!("ask_{other}"),
                &json!({"request": "and you?"}).to_string(),
            ),
            Some(result) => Reply::text(&format!("{who} got: {result}")),
        }
    });
    let (app, _dir) = app_with(
        &model,
        &[
            ("ping", agent("ping", &[], &["pong"])),
            ("pong", agent("pong", &[], &["ping"])),
        ],
        Vec::new(),
        "[agents]\nmax_delegation_depth = 2\n",
    );
    let session = app.session("ping").await;
    let (status, body) = tokio::time::timeout(Duration::from_secs(30), app.say(&session, "go"))
        .await
        .expect("a cycle never hangs");
    assert_eq!(status, StatusCode::OK, "{body}");
    let answer = body["answer"].as_str().unwrap();
    assert!(
        answer.contains("max_delegation_depth is 2"),
        "the deepest agent read why it could not ask: {answer}"
    );
    // Depth 0 (the session), 1 and 2: three model turns that asked, the
    // third refused; each answered once.
    let asked = model
        .requests()
        .iter()
        .filter(|r| last_tool_result(r).is_none())
        .count();
    assert_eq!(asked, 3, "one turn per level");
    let (_, list) = app.get("/v1/sessions").await;
    assert_eq!(list["sessions"].as_array().unwrap().len(), 3, "{list}");
}

/// The lead asks the trader, whose `order` needs a person's approval.
fn lead_and_trader(model: &MockModel) {
    model.set_responder(|request, _| {
        let who = asker(request);
        match (who.as_str(), last_tool_result(request)) {
            ("lead", None) => Reply::tool_call(
                "ask1",
                "ask_trader",
                &json!({"request": "buy one"}).to_string(),
            ),
            ("lead", Some(result)) => Reply::text(&format!("lead relays: {result}")),
            ("trader", None) => {
                Reply::tool_call("o1", "order", &json!({"what": "one share"}).to_string())
            }
            ("trader", Some(result)) => Reply::text(&format!("trader: {result}")),
            (other, _) => Reply::text(&format!("unexpected agent {other:?}")),
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_held_call_pauses_the_parent_and_approving_it_finishes_both() {
    let model = MockModel::start().await;
    lead_and_trader(&model);
    let (order, handler, runs) = counting_tool("order");
    let order = order.with_post_processor("require_confirmation");
    let (app, _dir) = app_with(
        &model,
        &[
            ("lead", agent("lead", &[], &["trader"])),
            ("trader", agent("trader", &["order"], &[])),
        ],
        vec![(order, handler)],
        "",
    );
    let session = app.session("lead").await;
    let (status, paused) = keyed(&app, &session, "buy me one", "buy-1").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{paused}");
    assert_eq!(paused["status"], "awaiting_approval", "{paused}");
    let held = &paused["confirmations"][0];
    assert_eq!(held["tool_name"], "ask_trader", "{paused}");
    let confirmation = held["confirmation_id"].as_str().expect("an id").to_string();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "nothing runs before approval"
    );
    // The confirmation is the child's own.
    let (status, pending) = app.get(&format!("/v1/confirmations/{confirmation}")).await;
    assert_eq!(status, StatusCode::OK, "{pending}");
    assert_eq!(pending["tool_name"], "order", "{pending}");

    let (status, decided) = app
        .post(
            &format!("/v1/confirmations/{confirmation}"),
            &json!({"approve": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{decided}");
    let turn = paused["turn_id"].as_str().unwrap();
    let finished = wait_for_turn(&app, &session, turn).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the order ran once");
    let answer = finished["outcome"]["answer"].as_str().unwrap_or_default();
    assert!(
        answer.starts_with("lead relays:") && answer.contains("trader:"),
        "the parent finished with the child's answer: {finished}"
    );
    // The keyed retry gets that one answer, and asks nobody again.
    let asked = model.request_count();
    let (status, again) = keyed(&app, &session, "buy me one", "buy-1").await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["answer"], answer, "{again}");
    assert_eq!(model.request_count(), asked);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A message sent with an `Idempotency-Key`.
async fn keyed(app: &TestApp, session: &str, content: &str, key: &str) -> (StatusCode, Value) {
    support::client::send(
        app.client
            .request(
                reqwest::Method::POST,
                &format!("/v1/sessions/{session}/messages"),
            )
            .header("Idempotency-Key", key)
            .json(&json!({"content": content})),
    )
    .await
}

/// The stored record of `turn` once it is final.
async fn wait_for_turn(app: &TestApp, session: &str, turn: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, record) = app
            .get(&format!("/v1/sessions/{session}/turns/{turn}"))
            .await;
        assert_eq!(status, StatusCode::OK, "{record}");
        if record["phase"] == "completed" {
            return record;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the turn did not finish: {record}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A tool-file command that appends `<name> <idempotency key>` to
/// `runs.log` in its folder; the `slow` one then waits for `release` there.
fn counting_tools(agents: &std::path::Path) {
    let tools = agents.join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    std::fs::write(
        tools.join("run.sh"),
        "#!/bin/sh\ninput=$(cat)\nkey=$(printf '%s' \"$input\" | sed -n 's/.*\"idempotency_key\": *\"\\([^\"]*\\)\".*/\\1/p')\n\
         echo \"$1 $key\" >> runs.log\n\
         if [ \"$1\" = slow ]; then while [ ! -e release ]; do sleep 0.02; done; fi\n\
         echo '{\"done\": \"'$1'\"}'\n",
    )
    .unwrap();
    for (name, effects) in [("quick", "at_most_once"), ("slow", "idempotent")] {
        std::fs::write(
            tools.join(format!("{name}.yaml")),
            format!(
                "name: {name}\ndescription: counts its runs\ncategory: custom\nparameters: []\n\
                 side_effects: {effects}\nentry: {{ type: external, command: [\"sh\", \"run.sh\", \"{name}\"] }}\n"
            ),
        )
        .unwrap();
    }
}

fn runs(agents: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(agents.join("tools/runs.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Polls `what` until it holds (at most 30 s).
async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_inside_a_childs_batch_runs_no_finished_call_twice_and_the_keyed_retry_gets_the_answer()
 {
    let model = MockModel::start().await;
    model.set_responder(|request, _| {
        let who = asker(request);
        match (who.as_str(), last_tool_result(request)) {
            ("lead", None) => Reply::tool_call(
                "ask1",
                "ask_worker",
                &json!({"request": "do both"}).to_string(),
            ),
            ("lead", Some(result)) => Reply::text(&format!("lead relays: {result}")),
            ("worker", None) => Reply::tool_calls(&[("q1", "quick", "{}"), ("s1", "slow", "{}")]),
            ("worker", Some(_)) => Reply::text("worker: both done"),
            (other, _) => Reply::text(&format!("unexpected agent {other:?}")),
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agents = support::agents_dir(&[
        ("lead.toml", &agent("lead", &[], &["worker"])),
        ("worker.toml", &agent("worker", &["quick", "slow"], &[])),
    ]);
    counting_tools(agents.path());
    // The tools note runs beside themselves, in a folder the sandbox makes
    // read-only; the sandbox is tests/sandbox.rs's subject.
    let start = || {
        support::server::Server::start(
            &data,
            agents.path(),
            &model.base_url(),
            &[("CADRE_TOOLS_SANDBOX", "off")],
        )
    };
    let mut server = start();
    let client = server.client();
    let session = client.session("lead").await;
    let request = client
        .request(
            reqwest::Method::POST,
            &format!("/v1/sessions/{session}/messages"),
        )
        .header("Idempotency-Key", "both-1")
        .json(&json!({"content": "get both done"}));
    // A client waiting for its answer when the server dies.
    let pending = tokio::spawn(request.send());
    until("slow runs", async || {
        runs(agents.path()).iter().any(|l| l.starts_with("slow"))
    })
    .await;
    // quick's outcome is durable once its record is (at_most_once).
    until("quick's record", async || {
        let (_, calls) = client.get("/v1/calls").await;
        calls["calls"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["tool_name"] == "quick"))
    })
    .await;
    server.kill_9();
    drop(pending);
    assert_eq!(runs(agents.path()).len(), 2, "{:?}", runs(agents.path()));

    std::fs::write(agents.path().join("tools/release"), "").unwrap();
    let server = start();
    let client = server.client();
    let (_, turns) = client.get(&format!("/v1/sessions/{session}/turns")).await;
    let turn_id = turns["turns"][0]["turn_id"]
        .as_str()
        .expect("the parent's turn")
        .to_string();
    let mut done = Value::Null;
    until("the parent's turn completes", async || {
        let (_, record) = client
            .get(&format!("/v1/sessions/{session}/turns/{turn_id}"))
            .await;
        done = record;
        done["phase"] == "completed"
    })
    .await;
    let answer = done["outcome"]["answer"].as_str().unwrap().to_string();
    assert!(
        answer.contains("worker: both done"),
        "the parent got the child's answer: {done}"
    );
    let log = runs(agents.path());
    let quick: Vec<_> = log.iter().filter(|l| l.starts_with("quick")).collect();
    let slow: Vec<_> = log.iter().filter(|l| l.starts_with("slow")).collect();
    assert_eq!(
        quick.len(),
        1,
        "the finished call did not run again: {log:?}"
    );
    assert_eq!(
        slow.len(),
        2,
        "the cut (idempotent) call ran again: {log:?}"
    );
    assert_eq!(slow[0], slow[1], "with the same idempotency key: {log:?}");
    // One child, one child turn: the resumed parent rejoined it.
    let (_, children) = client.get("/v1/sessions?agent=worker").await;
    let children = children["sessions"].as_array().unwrap().clone();
    assert_eq!(children.len(), 1, "{children:?}");
    let child = children[0]["id"].as_str().unwrap();
    let (_, child_turns) = client.get(&format!("/v1/sessions/{child}/turns")).await;
    assert_eq!(
        child_turns["turns"].as_array().unwrap().len(),
        1,
        "{child_turns}"
    );

    // The client's retry with its key gets that one answer.
    let asked = model.request_count();
    let (status, again) = support::client::send(
        client
            .request(
                reqwest::Method::POST,
                &format!("/v1/sessions/{session}/messages"),
            )
            .header("Idempotency-Key", "both-1")
            .json(&json!({"content": "get both done"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["answer"], answer.as_str(), "{again}");
    assert_eq!(model.request_count(), asked, "nobody was asked again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_makes_the_other_agent_answer_this_turn_and_the_next_and_it_can_hand_back() {
    let model = MockModel::start().await;
    model.set_responder(|request, _| {
        let who = asker(request);
        let last = last_tool_result(request);
        let handed_over = last
            .as_deref()
            .is_some_and(|r| r.contains("transferred_to"));
        match (who.as_str(), last) {
            ("triage", None) => Reply::tool_call(
                "t1",
                "transfer_to_billing",
                &json!({"reason": "a billing question"}).to_string(),
            ),
            ("triage", Some(_)) => Reply::text("triage here again"),
            ("billing", None) if question(request).contains("back") => Reply::tool_call(
                "t2",
                "transfer_to_triage",
                &json!({"reason": "not billing"}).to_string(),
            ),
            ("billing", None) => Reply::tool_call("l1", "lookup", r#"{"what":"invoice"}"#),
            ("billing", Some(_)) if handed_over => {
                Reply::tool_call("l1", "lookup", r#"{"what":"invoice"}"#)
            }
            ("billing", Some(_)) => Reply::text(&format!("billing answers: {}", question(request))),
            (other, _) => Reply::text(&format!("unexpected agent {other:?}")),
        }
    });
    let (lookup, handler, runs) = counting_tool("lookup");
    let (app, _dir) = app_with(
        &model,
        &[
            ("triage", agent_with_handoffs("triage", &[], &["billing"])),
            (
                "billing",
                agent_with_handoffs("billing", &["lookup"], &["triage"]),
            ),
        ],
        vec![(lookup, handler)],
        "",
    );
    let session = app.session("triage").await;
    let (status, body) = app.say(&session, "my invoice is wrong").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["answer"], "billing answers: my invoice is wrong",
        "{body}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "billing used its own tool");
    let requests = model.requests();
    assert_eq!(asker(&requests[0]), "triage");
    assert_eq!(offered(&requests[0]), vec!["transfer_to_billing"]);
    assert_eq!(
        asker(&requests[1]),
        "billing",
        "the rest of the turn is billing's"
    );
    assert_eq!(offered(&requests[1]), vec!["lookup", "transfer_to_triage"]);
    // The history carries over, the handoff in it.
    let history = requests[1]["messages"].to_string();
    assert!(history.contains("my invoice is wrong") && history.contains("transfer_to_billing"));
    // The session shows its active agent.
    let (_, shown) = app.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(shown["agent"], "billing", "{shown}");

    // The next turn is billing's from its first model call.
    let before = model.request_count();
    let (status, body) = app.say(&session, "and the refund?").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(asker(&model.requests()[before]), "billing");

    // Billing hands back; triage answers the rest of that turn.
    let (status, body) = app.say(&session, "take me back").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answer"], "triage here again", "{body}");
    let (_, shown) = app.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(shown["agent"], "triage", "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_parents_stream_carries_the_childs_events_tagged_with_the_child() {
    let model = MockModel::start().await;
    lead_and_analyst(&model);
    let (lookup, handler, _runs) = counting_tool("lookup");
    let (app, _dir) = app_with(
        &model,
        &[
            ("lead", agent("lead", &[], &["analyst"])),
            ("analyst", agent("analyst", &["lookup"], &[])),
        ],
        vec![(lookup, handler)],
        "",
    );
    let session = app.session("lead").await;
    let response = app.post_streaming(&session, "the weather").await;
    assert_eq!(response.status(), StatusCode::OK);
    let text = tokio::time::timeout(Duration::from_secs(20), response.text())
        .await
        .expect("the stream ends")
        .expect("a body");
    let (_, list) = app.get("/v1/sessions?agent=analyst").await;
    let child = list["sessions"][0]["id"]
        .as_str()
        .expect("a child")
        .to_string();
    // Every child event names the child; among them its tool call and its end.
    let child_events: Vec<Value> = text
        .split("\n\n")
        .filter(|frame| frame.contains("event: child_event"))
        .filter_map(|frame| frame.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|data| serde_json::from_str(data).expect("JSON data"))
        .collect();
    assert!(!child_events.is_empty(), "{text}");
    for e in &child_events {
        assert_eq!(e["session_id"], child.as_str(), "{e}");
        assert_eq!(e["agent"], "analyst", "{e}");
    }
    let kinds: Vec<&str> = child_events
        .iter()
        .filter_map(|e| e["event"]["type"].as_str())
        .collect();
    assert!(
        kinds.contains(&"tool_call_started") && kinds.contains(&"turn_completed"),
        "{kinds:?}"
    );
    // The parent's own events are there too, its end last.
    assert!(text.contains("event: tool_call_started") && text.contains("event: turn_completed"));
    let last_parent = text.rfind("event: turn_completed").unwrap();
    assert!(text.rfind("event: child_event").unwrap() < last_parent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cutting_the_asking_turn_cuts_the_childs_turn() {
    let model = MockModel::start().await;
    model.set_responder(|request, _| {
        let who = asker(request);
        match (who.as_str(), last_tool_result(request)) {
            ("lead", None) if question(request) == "never mind" => Reply::text("ok, dropped"),
            ("lead", None) => Reply::tool_call(
                "ask1",
                "ask_analyst",
                &json!({"request": "take your time"}).to_string(),
            ),
            ("analyst", None) => Reply::tool_call("w1", "wait", "{}"),
            (_, Some(result)) => Reply::text(&format!("got {result}")),
            (other, _) => Reply::text(&format!("unexpected agent {other:?}")),
        }
    });
    // `wait` runs until the test ends.
    let started = Arc::new(tokio::sync::Notify::new());
    let signal = started.clone();
    let wait: Arc<dyn ToolHandler> = Arc::new(FnHandler(move |_params: Value| {
        let signal = signal.clone();
        async move {
            signal.notify_one();
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<Value, ToolError>(json!({}))
        }
    }));
    let def = ToolDefinition::new(
        "wait",
        "Waits.",
        json!({"type": "object", "properties": {}}),
    )
    .with_cache_ttl(0);
    let lead = format!(
        "{}multitask = \"interrupt\"\n",
        agent("lead", &[], &["analyst"])
    );
    let (app, _dir) = app_with(
        &model,
        &[
            ("lead", lead),
            ("analyst", agent("analyst", &["wait"], &[])),
        ],
        vec![(def, wait)],
        "",
    );
    let session = app.session("lead").await;
    let first = app.client.spawn_post(
        &format!("/v1/sessions/{session}/messages"),
        json!({"content": "look into it"}),
    );
    tokio::time::timeout(Duration::from_secs(20), started.notified())
        .await
        .expect("the child's tool started");
    let (status, body) = app.say(&session, "never mind").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answer"], "ok, dropped");
    let (status, cut) = first.await.unwrap();
    assert_eq!(status, StatusCode::CONFLICT, "{cut}");
    assert_eq!(cut["error"]["code"], "TURN_INTERRUPTED", "{cut}");
    // The child's turn was cut with it.
    let (_, list) = app.get("/v1/sessions?agent=analyst").await;
    let child = list["sessions"][0]["id"]
        .as_str()
        .expect("a child")
        .to_string();
    let (_, turns) = app.get(&format!("/v1/sessions/{child}/turns")).await;
    let turn = turns["turns"][0]["turn_id"].as_str().unwrap().to_string();
    until("the child's turn is cut", async || {
        let (_, record) = app.get(&format!("/v1/sessions/{child}/turns/{turn}")).await;
        record["phase"] == "interrupted"
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_asks_others_works_as_a_workflow_node_and_as_an_mcp_agent_tool() {
    let model = MockModel::start().await;
    lead_and_analyst(&model);
    let (lookup, handler, runs) = counting_tool("lookup");
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("lead.toml"),
        agent("lead", &[], &["analyst"]),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("analyst.toml"),
        agent("analyst", &["lookup"], &[]),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("workflows")).unwrap();
    std::fs::write(
        dir.path().join("workflows/brief.toml"),
        "name = 'brief'\n[[nodes]]\nid = 'ask'\nagent = 'lead'\nprompt = 'the tides'\n",
    )
    .unwrap();
    let mut options = AppOptions::with_model(&model)
        .agents(dir.path())
        .config_toml("[api_limit]\nper_second = 100000\nburst = 100000\n")
        .tool(lookup, handler);
    options.max_retries = 0;
    let app = spawn_app(options);

    // A workflow's agent node.
    let (status, run) = app
        .post(
            "/v1/workflows/brief/runs",
            &json!({"input": {}, "wait": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    assert_eq!(run["status"], "succeeded", "{run}");
    assert!(
        run.to_string()
            .contains("analyst found it (please look into: the tides)"),
        "the node's answer relays the child's: {run}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Its child, like its session, carries the run (no person to wait for).
    let (_, list) = app.get("/v1/sessions?agent=analyst").await;
    let child = &list["sessions"][0];
    assert!(child["metadata"]["workflow_id"].is_string(), "{list}");

    // MCP's agent_lead tool.
    let config = StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", app.base));
    let client =
        ().serve(StreamableHttpClientTransport::from_config(config))
            .await
            .expect("MCP session over HTTP");
    let mut args = serde_json::Map::new();
    args.insert("message".into(), json!("the stars"));
    let result = client
        .call_tool(CallToolRequestParams::new("agent_lead".to_string()).with_arguments(args))
        .await
        .expect("the call is answered");
    assert_ne!(result.is_error, Some(true), "{result:?}");
    assert!(
        format!("{result:?}").contains("analyst found it (please look into: the stars)"),
        "{result:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_a_child_holds_no_pool_slot_its_own_calls_need() {
    let model = MockModel::start().await;
    lead_and_analyst(&model);
    let (lookup, handler, runs) = counting_tool("lookup");
    // One slot in the whole tool pool, and a short wait for it: had the
    // lead's ask taken the slot, the analyst's lookup would wait for it
    // until refused.
    let (app, _dir) = app_with(
        &model,
        &[
            ("lead", agent("lead", &[], &["analyst"])),
            ("analyst", agent("analyst", &["lookup"], &[])),
        ],
        vec![(lookup, handler)],
        "[concurrency]\nmax_concurrent = 1\nqueue_size = 4\ndefault_timeout_s = 2\n",
    );
    let session = app.session("lead").await;
    let (status, body) = app.say(&session, "the weather").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the child's call ran: {body}"
    );
    assert!(
        body["answer"]
            .as_str()
            .unwrap()
            .contains("analyst found it"),
        "{body}"
    );
}
