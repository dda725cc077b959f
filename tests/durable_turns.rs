//! Durable turns against the real binary: a turn is data (its id, its
//! record at `GET /v1/sessions/{id}/turns/{turn_id}`), an approval pauses
//! and resumes it (also across a restart), a newer message interrupts or
//! rolls it back, and a turn cut by `kill -9` is taken up at the next start
//! without running a finished call again.
//!
//! POST …/messages ──▶ Sessions::start_turn ──▶ Conversation (record per step) ──▶ store
//! restart ──▶ Sessions::resume_cut_turns ──▶ the record's phase ──▶ model / the calls that never ran

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::server::Server;
use support::{Client, MockModel, Reply, agent_toml, agents_dir};

/// Longest a test waits for something the server does on its own.
const PATIENCE: Duration = Duration::from_secs(20);

const ORDER: &str = r#"{"symbol":"AAPL","side":"buy","quantity":1,"order_type":"market"}"#;

fn trader(multitask: &str) -> String {
    format!(
        "{}multitask = {multitask:?}\n",
        agent_toml("trader", &["calculator", "create_paper_order", "echo"], 3)
    )
}

async fn pro_session(client: &Client) -> String {
    let (status, body) = client
        .post(
            "/v1/sessions",
            &json!({"agent": "trader", "plan": "pro", "user_id": "alice"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["id"].as_str().expect("session id").to_string()
}

async fn turn(client: &Client, session: &str, turn: &str) -> (StatusCode, Value) {
    client
        .get(&format!("/v1/sessions/{session}/turns/{turn}"))
        .await
}

/// Polls the turn until its phase is `phase`.
async fn turn_reaches(client: &Client, session: &str, turn_id: &str, phase: &str) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (status, body) = turn(client, session, turn_id).await;
        if status == StatusCode::OK && body["phase"] == phase {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "turn {turn_id} never reached {phase}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn history(client: &Client, session: &str) -> Vec<Value> {
    let (status, body) = client
        .get(&format!("/v1/sessions/{session}/messages"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["messages"].as_array().expect("messages").clone()
}

fn roles(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .map(|m| {
            let role = m["role"].as_str().unwrap_or("?");
            if m["tool_calls"].as_array().is_some_and(|c| !c.is_empty()) {
                format!("{role}+calls")
            } else {
                role.to_string()
            }
        })
        .collect()
}

/// The tool message the model was sent for call `id` in request `n`.
fn tool_message(request: &Value, id: &str) -> Value {
    request["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("no tool message for {id} in {request}"))
}

fn user_texts(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str().map(str::to_string))
        .collect()
}

struct Setup {
    model: MockModel,
    _dir: tempfile::TempDir,
    data: std::path::PathBuf,
    agents: tempfile::TempDir,
    /// `--store` of every start: `None` for the default redb file.
    store: Option<String>,
}

async fn setup(multitask: &str) -> Setup {
    let model = MockModel::start().await;
    model.set_strict(true);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agents = agents_dir(&[("trader.toml", &trader(multitask))]);
    // The paper orders fill at the sample data's prices.
    std::fs::create_dir_all(agents.path().join("data")).unwrap();
    std::fs::copy(
        support::repo_agents().join("data/trading.json"),
        agents.path().join("data/trading.json"),
    )
    .unwrap();
    Setup {
        model,
        _dir: dir,
        data,
        agents,
        store: None,
    }
}

fn start(s: &Setup, env: &[(&str, &str)]) -> Server {
    // Its tools note runs beside themselves, in a folder the sandbox makes
    // read-only; the sandbox is tests/sandbox.rs's subject.
    let mut env = env.to_vec();
    env.push(("CADRE_TOOLS_SANDBOX", "off"));
    let args: Vec<String> = match &s.store {
        Some(url) => vec![
            "--store".into(),
            url.clone(),
            "--node-id".into(),
            "n0".into(),
        ],
        None => Vec::new(),
    };
    Server::start_with_args(
        &s.data,
        s.agents.path(),
        Some(&s.model.base_url()),
        "127.0.0.1:0",
        &args,
        &env,
    )
}

#[tokio::test]
async fn a_turn_has_an_id_and_its_record_reads_back_as_the_reply() {
    let s = setup("enqueue").await;
    let server = start(&s, &[]);
    let client = server.client();
    let session = pro_session(&client).await;
    s.model.push(Reply::tool_call(
        "c1",
        "calculator",
        r#"{"expression":"6*7"}"#,
    ));
    s.model.push(Reply::text("42."));
    let (status, reply) = client.say(&session, "6*7?").await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["status"], "completed", "{reply}");
    let turn_id = reply["turn_id"].as_str().expect("a turn id").to_string();

    let (status, record) = turn(&client, &session, &turn_id).await;
    assert_eq!(status, StatusCode::OK, "{record}");
    assert_eq!(record["phase"], "completed", "{record}");
    assert_eq!(record["outcome"], reply, "the record holds the reply");
    assert_eq!(record["tool_calls"][0]["name"], "calculator", "{record}");
    assert_eq!(record["model_calls"], 2, "{record}");

    let (status, body) = turn(&client, &session, "01900000-0000-7000-8000-000000000000").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "TURN_NOT_FOUND", "{body}");

    // Streamed: `turn_started` names the turn `turn_completed` reports.
    s.model.push(Reply::text("Hello."));
    let response = client.post_streaming(&session, "hi").await;
    let text = tokio::time::timeout(PATIENCE, response.text())
        .await
        .expect("the stream ended")
        .expect("stream text");
    let started = text
        .split("\n\n")
        .find(|b| b.contains("event: turn_started"))
        .expect("turn_started");
    let data = started
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .expect("data");
    let started: Value = serde_json::from_str(data).expect("json");
    let id = started["turn_id"].as_str().expect("turn id");
    let (_, record) = turn(&client, &session, id).await;
    assert_eq!(record["outcome"]["answer"], "Hello.", "{record}");

    // `Prefer: respond-async`: 202 with the id at once; the record follows.
    s.model.push(Reply::slow(
        Duration::from_millis(300),
        Reply::text("Later."),
    ));
    let response = client
        .request(
            reqwest::Method::POST,
            &format!("/v1/sessions/{session}/messages"),
        )
        .header("prefer", "respond-async")
        .json(&json!({"content": "take your time"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], "accepted", "{body}");
    let id = body["turn_id"].as_str().expect("turn id");
    let done = turn_reaches(&client, &session, id, "completed").await;
    assert_eq!(done["outcome"]["answer"], "Later.", "{done}");

    // Listed, oldest first, a page at a time.
    let (status, page) = client
        .get(&format!("/v1/sessions/{session}/turns?limit=2"))
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["turns"][0]["turn_id"], turn_id.as_str(), "{page}");
    let next = page["next"].as_str().expect("a second page");
    let (_, rest) = client
        .get(&format!("/v1/sessions/{session}/turns?cursor={next}"))
        .await;
    assert_eq!(rest["count"], 1, "{rest}");
    assert_eq!(rest["turns"][0]["turn_id"], id, "{rest}");
    assert_eq!(rest["next"], Value::Null, "{rest}");
    // The listing shows the calls whole, as the record does.
    assert_eq!(page["turns"][0]["outcome"], reply, "{page}");

    // Stored lean (issue #34): the row names the call's record instead of
    // repeating its arguments and output, and keeps one list of calls; the
    // reads above put them back.
    drop(server);
    let store = cadre::store::Store::open(&s.data).expect("open the stopped store");
    let row = store
        .turn(&session, &turn_id)
        .await
        .expect("read")
        .expect("the row");
    let call = &row["tool_calls"][0];
    let record_id = call["record_id"]
        .as_str()
        .expect("the call names its record");
    assert!(call.get("arguments").is_none(), "{row}");
    assert!(call.get("output").is_none(), "{row}");
    assert!(row["outcome"].get("tool_calls").is_none(), "{row}");
    assert_eq!(call["is_success"], true, "{row}");
    let records = store
        .calls_by_id(vec![record_id.to_string()])
        .await
        .expect("read");
    assert_eq!(records[0].params, reply["tool_calls"][0]["arguments"]);
    assert_eq!(
        records[0].output.as_ref(),
        Some(&reply["tool_calls"][0]["output"])
    );
}

/// A held order pauses the turn: 202, `awaiting_approval`, and nothing
/// is handed to the model until a person decides.
async fn paused_turn(s: &Setup, client: &Client, session: &str) -> (String, String) {
    s.model
        .push(Reply::tool_call("o1", "create_paper_order", ORDER));
    let (status, reply) = client.say(session, "buy one AAPL").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    assert_eq!(reply["status"], "awaiting_approval", "{reply}");
    assert_eq!(reply["answer"], "", "{reply}");
    let confirmation = reply["confirmations"][0]["confirmation_id"]
        .as_str()
        .expect("a confirmation")
        .to_string();
    assert_eq!(reply["confirmations"][0]["tool_call_id"], "o1", "{reply}");
    let turn_id = reply["turn_id"].as_str().unwrap().to_string();
    let (_, record) = turn(client, session, &turn_id).await;
    assert_eq!(record["phase"], "awaiting_approval", "{record}");
    assert_eq!(
        s.model.request_count(),
        1,
        "the model waits for the decision"
    );
    (turn_id, confirmation)
}

#[tokio::test]
async fn an_approval_resumes_the_paused_turn_and_a_decline_resumes_it_declined() {
    let s = setup("enqueue").await;
    let server = start(&s, &[]);
    let client = server.client();
    let session = pro_session(&client).await;

    let (turn_id, confirmation) = paused_turn(&s, &client, &session).await;
    s.model.push(Reply::text("Your order is placed."));
    let (status, decided) = client
        .post(
            &format!("/v1/confirmations/{confirmation}"),
            &json!({"approve": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{decided}");
    let done = turn_reaches(&client, &session, &turn_id, "completed").await;
    assert_eq!(done["outcome"]["answer"], "Your order is placed.", "{done}");
    assert_eq!(
        done["outcome"]["tool_calls"][0]["is_success"], true,
        "{done}"
    );
    let requests = s.model.requests();
    let sent = tool_message(&requests[1], "o1");
    assert!(
        sent["content"].as_str().unwrap().contains("filled"),
        "the model saw the order's outcome: {sent}"
    );
    assert_eq!(
        roles(&history(&client, &session).await),
        ["user", "assistant+calls", "tool", "assistant"]
    );

    // Declined: the model hears so, and answers.
    let (turn_id, confirmation) = {
        s.model
            .push(Reply::tool_call("o2", "create_paper_order", ORDER));
        let (status, reply) = client.say(&session, "and one more").await;
        assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
        (
            reply["turn_id"].as_str().unwrap().to_string(),
            reply["confirmations"][0]["confirmation_id"]
                .as_str()
                .unwrap()
                .to_string(),
        )
    };
    s.model.push(Reply::text("Understood, no order."));
    let (status, body) = client
        .post(
            &format!("/v1/confirmations/{confirmation}"),
            &json!({"approve": false}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let done = turn_reaches(&client, &session, &turn_id, "completed").await;
    assert_eq!(done["outcome"]["answer"], "Understood, no order.", "{done}");
    assert_eq!(
        done["outcome"]["tool_calls"][0]["error_type"], "TOOL_DECLINED",
        "{done}"
    );
    let requests = s.model.requests();
    let sent = tool_message(requests.last().unwrap(), "o2");
    assert!(
        sent["content"].as_str().unwrap().contains("TOOL_DECLINED"),
        "{sent}"
    );
}

#[tokio::test]
async fn an_expired_confirmation_resumes_the_turn_as_declined() {
    let s = setup("enqueue").await;
    let server = start(&s, &[("CADRE_EXECUTOR_CONFIRMATION_TTL_S", "1")]);
    let client = server.client();
    let session = pro_session(&client).await;
    let (turn_id, confirmation) = paused_turn(&s, &client, &session).await;
    s.model.push(Reply::text("The order lapsed."));
    let done = turn_reaches(&client, &session, &turn_id, "completed").await;
    assert_eq!(done["outcome"]["answer"], "The order lapsed.", "{done}");
    assert_eq!(
        done["outcome"]["tool_calls"][0]["error_type"], "TOOL_DECLINED",
        "{done}"
    );
    // It can no longer be approved.
    let (status, body) = client
        .post(
            &format!("/v1/confirmations/{confirmation}"),
            &json!({"approve": true}),
        )
        .await;
    assert!(status.is_client_error(), "{status} {body}");
}

#[tokio::test]
async fn a_paused_turn_survives_a_restart_and_resumes_when_approved() {
    let s = setup("enqueue").await;
    let mut server = start(&s, &[]);
    let client = server.client();
    let session = pro_session(&client).await;
    let (turn_id, confirmation) = paused_turn(&s, &client, &session).await;
    server.kill_9();

    let server = start(&s, &[]);
    let client = server.client();
    let (_, record) = turn(&client, &session, &turn_id).await;
    assert_eq!(record["phase"], "awaiting_approval", "{record}");
    s.model.push(Reply::text("Placed after the restart."));
    let (status, body) = client
        .post(
            &format!("/v1/confirmations/{confirmation}"),
            &json!({"approve": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let done = turn_reaches(&client, &session, &turn_id, "completed").await;
    assert_eq!(
        done["outcome"]["answer"], "Placed after the restart.",
        "{done}"
    );
    assert_eq!(
        done["outcome"]["tool_calls"][0]["is_success"], true,
        "{done}"
    );
    assert_eq!(
        roles(&history(&client, &session).await),
        ["user", "assistant+calls", "tool", "assistant"]
    );
}

#[tokio::test]
async fn a_message_sent_during_a_pause_waits_for_it_under_enqueue_and_is_refused_under_reject() {
    let s = setup("enqueue").await;
    let server = start(&s, &[]);
    let client = server.client();
    let session = pro_session(&client).await;
    let (turn_id, confirmation) = paused_turn(&s, &client, &session).await;
    // Queued behind the pause: answered at once, 202 `queued`, not held
    // until someone decides.
    let (status, queued) = tokio::time::timeout(PATIENCE, client.say(&session, "anything else?"))
        .await
        .expect("answered at once");
    assert_eq!(status, StatusCode::ACCEPTED, "{queued}");
    assert_eq!(queued["status"], "queued", "{queued}");
    assert_eq!(queued["waiting_for"], turn_id.as_str(), "{queued}");
    let next = queued["turn_id"].as_str().expect("its turn id").to_owned();
    // A stream queued behind it says so first.
    let stream = client.post_streaming(&session, "and a third?").await;
    assert_eq!(stream.status(), StatusCode::OK);
    s.model.push(Reply::text("Placed."));
    s.model.push(Reply::text("Nothing else."));
    s.model.push(Reply::text("A third."));
    client
        .post(
            &format!("/v1/confirmations/{confirmation}"),
            &json!({"approve": true}),
        )
        .await;
    let events = stream_events(stream).await;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"turn_queued"), "{names:?}");
    assert_eq!(events[0].1["waiting_for"], turn_id.as_str(), "{events:?}");
    assert_eq!(names.last(), Some(&"turn_completed"), "{names:?}");
    let (_, record) = turn(&client, &session, &next).await;
    assert_eq!(record["outcome"]["answer"], "Nothing else.", "{record}");
    let (_, record) = turn(&client, &session, &turn_id).await;
    assert_eq!(record["outcome"]["answer"], "Placed.", "{record}");

    let s = setup("reject").await;
    let server = start(&s, &[]);
    let client = server.client();
    let session = pro_session(&client).await;
    paused_turn(&s, &client, &session).await;
    let (status, body) = client.say(&session, "hello?").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "CONVERSATION_BUSY", "{body}");
}

/// Starts a streamed turn whose model call hangs; returns the stream.
async fn hanging_stream(s: &Setup, client: &Client, session: &str) -> reqwest::Response {
    s.model.push(Reply::slow(
        Duration::from_secs(30),
        Reply::text("too late"),
    ));
    let response = client.post_streaming(session, "first question").await;
    assert_eq!(response.status(), StatusCode::OK);
    s.model.wait_for_requests(1).await;
    response
}

async fn stream_events(response: reqwest::Response) -> Vec<(String, Value)> {
    let read = async {
        let mut stream = response.bytes_stream();
        let mut bytes = Vec::new();
        while let Some(chunk) = stream.next().await {
            bytes.extend_from_slice(&chunk.expect("stream chunk"));
        }
        String::from_utf8(bytes).expect("UTF-8")
    };
    let text = tokio::time::timeout(PATIENCE, read)
        .await
        .expect("the stream ended in time");
    text.split("\n\n")
        .filter_map(|b| {
            let name = b.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = b.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((name.to_string(), serde_json::from_str(data).ok()?))
        })
        .collect()
}

#[tokio::test]
async fn interrupt_cuts_the_running_turn_and_the_next_one_keeps_its_messages() {
    let s = setup("interrupt").await;
    let server = start(&s, &[]);
    let client = server.client();
    let session = pro_session(&client).await;
    let first = hanging_stream(&s, &client, &session).await;

    s.model.push(Reply::text("Second answer."));
    let (status, body) = client.say(&session, "second question").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answer"], "Second answer.", "{body}");

    let events = stream_events(first).await;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["turn_started", "turn_interrupted"],
        "the cut turn's stream says so and ends: {events:?}"
    );
    let first_turn = events[0].1["turn_id"].as_str().unwrap();
    let (_, record) = turn(&client, &session, first_turn).await;
    assert_eq!(record["phase"], "interrupted", "{record}");
    assert!(record.get("rolled_back").is_none(), "{record}");

    // The new turn sees the cut turn's message.
    let requests = s.model.requests();
    assert_eq!(
        user_texts(requests.last().unwrap()),
        ["first question", "second question"]
    );
}

#[tokio::test]
async fn rollback_leaves_the_cut_turn_out_of_every_later_prompt_but_keeps_it_stored() {
    let s = setup("rollback").await;
    let server = start(&s, &[]);
    let client = server.client();
    let session = pro_session(&client).await;
    let first = hanging_stream(&s, &client, &session).await;

    s.model.push(Reply::text("Second answer."));
    let (status, body) = client.say(&session, "second question").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let events = stream_events(first).await;
    assert_eq!(events.last().unwrap().0, "turn_interrupted", "{events:?}");
    let first_turn = events[0].1["turn_id"].as_str().unwrap();
    let (_, record) = turn(&client, &session, first_turn).await;
    assert_eq!(record["phase"], "interrupted", "{record}");
    assert_eq!(record["rolled_back"], true, "{record}");

    let requests = s.model.requests();
    assert_eq!(
        user_texts(requests.last().unwrap()),
        ["second question"],
        "the rolled-back turn is not in the prompt"
    );
    // Stored and exported, marked.
    let messages = history(&client, &session).await;
    assert_eq!(messages[0]["content"], "first question", "{messages:?}");
    assert_eq!(messages[0]["rolled_back"], true, "{messages:?}");
    assert!(messages[1].get("rolled_back").is_none(), "{messages:?}");

    // And after a reload from the store (a restart), still out.
    drop(server);
    let server = start(&s, &[]);
    let client = server.client();
    s.model.push(Reply::text("Third answer."));
    let (status, body) = client.say(&session, "third question").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let requests = s.model.requests();
    assert_eq!(
        user_texts(requests.last().unwrap()),
        ["second question", "third question"]
    );
}

/// An approval that wins the race with an interrupting message: the call it
/// approved runs, so the cut turn and the next prompt carry its real
/// outcome, not `TOOL_OUTCOME_UNKNOWN` (the interrupt waits for it).
#[tokio::test]
async fn an_approval_that_beats_an_interrupt_gives_the_model_the_real_outcome() {
    let s = batch_setup().await;
    let tools = s.agents.path().join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    std::fs::write(
        tools.join("order.sh"),
        "#!/bin/sh
cat >/dev/null
echo started >> runs.log
         while [ ! -e release ]; do sleep 0.02; done
echo '{\"filled\": true}'
",
    )
    .unwrap();
    std::fs::write(
        tools.join("order.yaml"),
        "name: order\ndescription: places an order\ncategory: custom\nparameters: []\n\
         side_effects: at_most_once\npost_processor: require_confirmation\n\
         entry: { type: external, command: [\"sh\", \"order.sh\"] }\n",
    )
    .unwrap();
    std::fs::write(
        s.agents.path().join("worker.toml"),
        format!(
            "{}multitask = \"interrupt\"\n",
            agent_toml("worker", &["order"], 3)
        ),
    )
    .unwrap();
    let server = start(&s, &[]);
    let client = server.client();
    let session = client.session("worker").await;
    s.model.push(Reply::tool_call("o1", "order", "{}"));
    let (status, paused) = client.say(&session, "place it").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{paused}");
    let first = paused["turn_id"].as_str().unwrap().to_string();
    let confirmation = paused["confirmations"][0]["confirmation_id"]
        .as_str()
        .expect("held")
        .to_string();

    // Approved: the order runs (and waits for `release`).
    let approver = client.clone();
    let approve = tokio::spawn(async move {
        approver
            .post(
                &format!("/v1/confirmations/{confirmation}"),
                &json!({"approve": true}),
            )
            .await
    });
    wait_for_run(s.agents.path(), "started").await;
    // The interrupting message, while the approved call runs: accepted
    // (202 once the conversation took it, the interrupt begun).
    s.model.push(Reply::text("Second answer."));
    let response = client
        .request(
            reqwest::Method::POST,
            &format!("/v1/sessions/{session}/messages"),
        )
        .header("prefer", "respond-async")
        .json(&json!({"content": "never mind"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let second: Value = response.json().await.unwrap();
    let second = second["turn_id"].as_str().expect("turn id").to_string();
    // It waits for the approved call; let that end.
    std::fs::write(tools.join("release"), "").unwrap();
    let (status, decided) = approve.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{decided}");
    let done = turn_reaches(&client, &session, &second, "completed").await;
    assert_eq!(done["outcome"]["answer"], "Second answer.", "{done}");

    let (_, record) = turn(&client, &session, &first).await;
    assert_eq!(record["phase"], "interrupted", "{record}");
    assert_eq!(record["tool_calls"][0]["is_success"], true, "{record}");
    let last = s.model.requests().last().cloned().unwrap();
    let content = tool_message(&last, "o1")["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        content.contains("filled") && !content.contains("TOOL_OUTCOME_UNKNOWN"),
        "the model got the order's real outcome: {content}"
    );
    assert_eq!(runs(s.agents.path()), ["started"], "it ran once");
}

/// A tool-file command that appends `<name> <idempotency key>` to
/// `runs.log` in its folder, and (the `slow` one) waits for `release` there.
fn counting_tools(agents: &Path, side_effects_quick: &str) {
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
    for (name, effects) in [("quick", side_effects_quick), ("slow", "idempotent")] {
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

fn runs(agents: &Path) -> Vec<String> {
    std::fs::read_to_string(agents.join("tools/runs.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

async fn wait_for_run(agents: &Path, line_prefix: &str) {
    let deadline = Instant::now() + PATIENCE;
    while !runs(agents).iter().any(|l| l.starts_with(line_prefix)) {
        assert!(
            Instant::now() < deadline,
            "{line_prefix} never ran: {:?}",
            runs(agents)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn batch_setup() -> Setup {
    let model = MockModel::start().await;
    model.set_strict(true);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agents = agents_dir(&[("worker.toml", &agent_toml("worker", &["quick", "slow"], 3))]);
    Setup {
        model,
        _dir: dir,
        data,
        agents,
        store: None,
    }
}

/// Kills the server while a turn's batch has one finished call (`quick`)
/// and one running (`slow`); returns the session and the turn.
async fn cut_mid_batch(s: &Setup, key: Option<&str>) -> (String, String) {
    let mut server = start(s, &[]);
    let client = server.client();
    let session = client.session("worker").await;
    s.model.push(Reply::tool_calls(&[
        ("q1", "quick", "{}"),
        ("s1", "slow", "{}"),
    ]));
    let request = client
        .request(
            reqwest::Method::POST,
            &format!("/v1/sessions/{session}/messages"),
        )
        .json(&json!({"content": "do both"}));
    let turn_id = match key {
        // A client waiting for its answer when the server dies.
        Some(key) => {
            let pending = tokio::spawn(request.header("idempotency-key", key).send());
            wait_for_run(s.agents.path(), "slow").await;
            let (_, turns) = client.get(&format!("/v1/sessions/{session}/turns")).await;
            drop(pending);
            turns["turns"][0]["turn_id"]
                .as_str()
                .expect("a turn")
                .to_string()
        }
        None => {
            let response = request
                .header("prefer", "respond-async")
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::ACCEPTED);
            let body: Value = response.json().await.unwrap();
            body["turn_id"].as_str().unwrap().to_string()
        }
    };
    wait_for_run(s.agents.path(), "slow").await;
    // quick's outcome is durable once its record is (at_most_once).
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (_, calls) = client
            .get(&format!("/v1/calls?conversation_id={session}"))
            .await;
        if calls["calls"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["tool_name"] == "quick"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "{calls}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.kill_9();
    (session, turn_id)
}

#[tokio::test]
async fn a_turn_cut_mid_batch_resumes_without_running_its_finished_call_again() {
    let s = batch_setup().await;
    counting_tools(s.agents.path(), "at_most_once");
    let (session, turn_id) = cut_mid_batch(&s, None).await;
    assert_eq!(
        runs(s.agents.path()).len(),
        2,
        "{:?}",
        runs(s.agents.path())
    );

    std::fs::write(s.agents.path().join("tools/release"), "").unwrap();
    s.model.push(Reply::text("Both done."));
    let server = start(&s, &[]);
    let client = server.client();
    let done = turn_reaches(&client, &session, &turn_id, "completed").await;
    assert_eq!(done["outcome"]["answer"], "Both done.", "{done}");
    let log = runs(s.agents.path());
    let quick: Vec<_> = log.iter().filter(|l| l.starts_with("quick")).collect();
    let slow: Vec<_> = log.iter().filter(|l| l.starts_with("slow")).collect();
    assert_eq!(
        quick.len(),
        1,
        "the finished call did not run again: {log:?}"
    );
    assert_eq!(slow.len(), 2, "the cut call ran again: {log:?}");
    assert_eq!(slow[0], slow[1], "with the same idempotency key: {log:?}");
    assert!(
        slow[0].ends_with(&format!("{session}:{turn_id}:s1")),
        "the key is (session, turn, call): {log:?}"
    );
    // The model got both outcomes once, in the call order.
    let last = s.model.requests().last().cloned().unwrap();
    for (id, name) in [("q1", "quick"), ("s1", "slow")] {
        let content = tool_message(&last, id)["content"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            content.contains("done")
                && content.contains(name)
                && !content.contains("TOOL_OUTCOME_UNKNOWN"),
            "{id}: its real outcome, not a stand-in: {content}"
        );
    }
    assert_eq!(
        roles(&history(&client, &session).await),
        ["user", "assistant+calls", "tool", "tool", "assistant"]
    );
    let (_, metrics) = client.get("/metrics").await;
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("cadre_turns_resumed_total 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_at_most_once_call_cut_while_running_gets_outcome_unknown_not_a_second_run() {
    let s = batch_setup().await;
    // Here `slow` is the side-effecting one: it started, left no outcome.
    counting_tools(s.agents.path(), "at_most_once");
    let tools = s.agents.path().join("tools");
    let slow = std::fs::read_to_string(tools.join("slow.yaml")).unwrap();
    std::fs::write(
        tools.join("slow.yaml"),
        slow.replace("side_effects: idempotent", "side_effects: at_most_once"),
    )
    .unwrap();
    let (session, turn_id) = cut_mid_batch(&s, None).await;
    std::fs::write(tools.join("release"), "").unwrap();
    s.model.push(Reply::text("Not sure about the second."));
    let server = start(&s, &[]);
    let client = server.client();
    let done = turn_reaches(&client, &session, &turn_id, "completed").await;
    let log = runs(s.agents.path());
    assert_eq!(log.len(), 2, "nothing ran twice: {log:?}");
    let calls = done["outcome"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls[1]["error_type"], "TOOL_OUTCOME_UNKNOWN", "{done}");
    assert_eq!(calls[0]["is_success"], true, "{done}");
}

#[tokio::test]
async fn a_cut_turn_past_the_resume_window_is_closed_as_interrupted() {
    let s = batch_setup().await;
    counting_tools(s.agents.path(), "at_most_once");
    let (session, turn_id) = cut_mid_batch(&s, None).await;
    std::fs::write(s.agents.path().join("tools/release"), "").unwrap();
    let server = start(&s, &[("CADRE_SESSIONS_RESUME_WINDOW_S", "0")]);
    let client = server.client();
    let closed = turn_reaches(&client, &session, &turn_id, "interrupted").await;
    assert!(closed.get("outcome").is_none(), "{closed}");
    assert_eq!(runs(s.agents.path()).len(), 2, "nothing ran again");
    let messages = history(&client, &session).await;
    assert_eq!(
        roles(&messages),
        ["user", "assistant+calls", "tool", "tool", "assistant"],
        "every call has a result and a note closes the turn: {messages:?}"
    );
    assert!(
        messages[4]["content"]
            .as_str()
            .unwrap()
            .contains("interrupted"),
        "{messages:?}"
    );
    // The session goes on with a well-formed history (the model is strict).
    s.model.push(Reply::text("Fresh start."));
    let (status, body) = client.say(&session, "again?").await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn a_keyed_message_retried_after_a_crash_ends_in_one_user_message_and_one_answer() {
    let s = batch_setup().await;
    counting_tools(s.agents.path(), "at_most_once");
    let (session, turn_id) = cut_mid_batch(&s, Some("retry-me-1")).await;
    std::fs::write(s.agents.path().join("tools/release"), "").unwrap();
    s.model.push(Reply::text("Both done."));
    let server = start(&s, &[]);
    let client = server.client();
    // The client never got its answer: it retries with the same key.
    let response = client
        .request(
            reqwest::Method::POST,
            &format!("/v1/sessions/{session}/messages"),
        )
        .header("idempotency-key", "retry-me-1")
        .json(&json!({"content": "do both"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["turn_id"], turn_id.as_str(), "{body}");
    assert_eq!(body["answer"], "Both done.", "{body}");
    let messages = history(&client, &session).await;
    assert_eq!(
        roles(&messages),
        ["user", "assistant+calls", "tool", "tool", "assistant"],
        "{messages:?}"
    );
    assert_eq!(s.model.request_count(), 2, "one answer");
}

/// The keyed retry that arrives while the resumed turn's last commit is in
/// flight (the conversation is done with the turn, the store does not have
/// its end yet) waits for that commit: it used to read the stored record,
/// find no outcome and answer 503 `CONVERSATION_UNAVAILABLE` (seen once in
/// CI on redb, where the window is an fsync). PostgreSQL lets the test hold
/// the commit open: another transaction locks the session's row, which the
/// commit's epoch fence must share.
#[tokio::test]
async fn a_keyed_retry_during_the_resumed_turns_last_commit_gets_the_answer() {
    let pg = support::postgres::Postgres::shared();
    let url = pg.database("keyed_retry_commit");
    let mut s = batch_setup().await;
    s.store = Some(url.clone());
    counting_tools(s.agents.path(), "at_most_once");
    let (session, turn_id) = cut_mid_batch(&s, Some("retry-me-2")).await;
    std::fs::write(s.agents.path().join("tools/release"), "").unwrap();
    // The resumed turn's model call answers after a while: long enough
    // for the test to lock the row once the call started.
    s.model.push(Reply::slow(
        Duration::from_secs(2),
        Reply::text("Both done."),
    ));
    let server = start(&s, &[]);
    let client = server.client();
    s.model.wait_for_requests(2).await;
    // The tool step before the call is committed (phase awaiting_model):
    // from here the turn's only write is its end.
    turn_reaches(&client, &session, &turn_id, "awaiting_model").await;
    let (mut db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect to the test database");
    tokio::spawn(connection);
    let lock = db.transaction().await.unwrap();
    lock.execute(
        "SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE",
        &[&session],
    )
    .await
    .unwrap();
    // The answer came and its commit waits on the lock.
    let deadline = Instant::now() + PATIENCE;
    while pg.sql(
        &url,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
    ) == "0"
    {
        assert!(
            Instant::now() < deadline,
            "the turn's end was never committed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let retry = {
        let request = client
            .request(
                reqwest::Method::POST,
                &format!("/v1/sessions/{session}/messages"),
            )
            .header("idempotency-key", "retry-me-2")
            .json(&json!({"content": "do both"}));
        tokio::spawn(request.send())
    };
    // It waits for the commit instead of answering without it. (Without
    // the fix the 503 comes in milliseconds.)
    let mut retry = std::pin::pin!(retry);
    assert!(
        tokio::time::timeout(Duration::from_secs(1), &mut retry)
            .await
            .is_err(),
        "the retry answered while the turn's end was not committed"
    );
    lock.rollback().await.unwrap();
    let response = retry.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["turn_id"], turn_id.as_str(), "{body}");
    assert_eq!(body["answer"], "Both done.", "{body}");
    let messages = history(&client, &session).await;
    assert_eq!(
        roles(&messages),
        ["user", "assistant+calls", "tool", "tool", "assistant"],
        "{messages:?}"
    );
    assert_eq!(s.model.request_count(), 2, "one answer");
}
