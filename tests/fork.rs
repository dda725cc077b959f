//! Forks (issue #34): `POST /v1/sessions/{id}/fork` and
//! `GET /v1/sessions/{id}/history`, on a real cadre with the model mocked
//! at the wire. A fork at turn k holds exactly the parent's prefix, leaves
//! the parent byte-identical, runs no tool, feeds the fork's next model
//! call the prefix and nothing after it (no later summary either),
//! survives a restart, stays within its tenant, refuses a turn that has
//! not finished, continues with another agent when asked, and works on
//! PostgreSQL as on redb.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::{AppOptions, Client, MockModel, Reply, TestApp, agent_toml, agents_dir, spawn_app};

const PATIENCE: Duration = Duration::from_secs(20);

/// Two agents: `calc` (calculator) and `other`, told apart by their prompt.
fn agents() -> tempfile::TempDir {
    agents_dir(&[
        ("calc.toml", &agent_toml("calc", &["calculator"], 3)),
        (
            "other.toml",
            "name = \"other\"\nsystem_prompt = \"You are the OTHER agent.\"\ntools = []\n",
        ),
        (
            "small.toml",
            &format!(
                "{}history_window = 2\n",
                agent_toml("small", &["calculator"], 3)
            ),
        ),
    ])
}

/// The export's exact bytes.
async fn export_bytes(client: &Client, session: &str) -> String {
    let response = client
        .request(Method::GET, &format!("/v1/sessions/{session}/export"))
        .send()
        .await
        .expect("export");
    assert_eq!(response.status(), StatusCode::OK);
    response.text().await.expect("export body")
}

async fn export(client: &Client, session: &str) -> Value {
    serde_json::from_str(&export_bytes(client, session).await).expect("export JSON")
}

async fn turn_ids(client: &Client, session: &str) -> Vec<String> {
    let (status, body) = client.get(&format!("/v1/sessions/{session}/turns")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["turn_id"].as_str().unwrap().to_string())
        .collect()
}

async fn fork(client: &Client, session: &str, body: Value) -> (StatusCode, Value) {
    client
        .post(&format!("/v1/sessions/{session}/fork"), &body)
        .await
}

async fn total_calls(client: &Client) -> u64 {
    let (status, stats) = client.get("/v1/stats").await;
    assert_eq!(status, StatusCode::OK, "{stats}");
    stats["total_calls"].as_u64().unwrap_or(0)
}

/// Every message's content in a model request, in order.
fn contents(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// A session of `calc` with three turns: a calculator call, a plain
/// answer, another calculator call. Returns its id and turn ids.
async fn three_turns(app: &TestApp, model: &MockModel) -> (String, Vec<String>) {
    let session = app.session("calc").await;
    model.push(Reply::tool_call(
        "c1",
        "calculator",
        r#"{"expression":"2+2"}"#,
    ));
    model.push(Reply::text("first answer: 4"));
    model.push(Reply::text("second answer"));
    model.push(Reply::tool_call(
        "c3",
        "calculator",
        r#"{"expression":"3*3"}"#,
    ));
    model.push(Reply::text("third answer: 9"));
    for q in ["first question", "second question", "third question"] {
        let (status, body) = app.say(&session, q).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let turns = turn_ids(&app.client, &session).await;
    assert_eq!(turns.len(), 3);
    (session, turns)
}

/// How many messages of [`three_turns`]' session end with turn 2.
fn prefix_len(all: &[Value]) -> usize {
    all.iter()
        .position(|m| m["content"] == "second answer")
        .expect("turn 2's answer")
        + 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_at_turn_k_keeps_exactly_the_prefix_runs_no_tool_and_leaves_the_parent_as_it_was() {
    let model = MockModel::start().await;
    let agents = agents();
    let app = spawn_app(AppOptions::with_model(&model).agents(agents.path()));
    let (parent, turns) = three_turns(&app, &model).await;
    let before = export_bytes(&app.client, &parent).await;
    let calls = total_calls(&app.client).await;
    assert_eq!(calls, 2);
    let requests = model.request_count();

    let (status, forked) = fork(&app.client, &parent, json!({"turn_id": turns[1]})).await;
    assert_eq!(status, StatusCode::CREATED, "{forked}");
    let id = forked["id"].as_str().unwrap().to_string();
    assert_ne!(id, parent);
    assert_eq!(
        forked["forked_from"],
        json!({"session_id": parent, "turn_id": turns[1]})
    );
    assert_eq!(forked["agent"], "calc");

    // The parent: byte for byte what it was; no tool ran, no model call.
    assert_eq!(export_bytes(&app.client, &parent).await, before);
    assert_eq!(total_calls(&app.client).await, calls);
    assert_eq!(model.request_count(), requests);

    // The prefix, exactly: turns 1 and 2 (user, tool call, tool result,
    // answer; user, answer), the same rows.
    let parent_export: Value = serde_json::from_str(&before).unwrap();
    let fork_export = export(&app.client, &id).await;
    let all = parent_export["messages"].as_array().unwrap();
    let cut = prefix_len(all);
    assert_eq!((cut, all.len()), (6, 10), "{all:?}");
    assert_eq!(fork_export["messages"], json!(all[..cut]));
    // Its call records are the parent's, not copies.
    assert_eq!(fork_export["calls"], json!([]));
    assert_eq!(fork_export["session"]["forked_from"]["session_id"], parent);

    // Shown in the session and in listings.
    let (_, shown) = app.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(shown["forked_from"]["turn_id"], turns[1]);
    let (_, listed) = app.get("/v1/sessions").await;
    let listed = listed["sessions"].as_array().unwrap();
    let of = |sid: &str| listed.iter().find(|s| s["id"] == sid).unwrap().clone();
    assert_eq!(of(&id)["forked_from"]["session_id"], parent);
    assert_eq!(of(&parent)["forked_from"], Value::Null);

    // The fork's next model request holds the prefix and nothing after it.
    model.push(Reply::text("fork answer"));
    let (status, body) = app.say(&id, "fork question").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let seen = contents(model.requests().last().unwrap());
    for kept in [
        "first question",
        "first answer: 4",
        "second question",
        "second answer",
        "fork question",
    ] {
        assert!(seen.iter().any(|c| c == kept), "{kept} missing: {seen:?}");
    }
    for gone in ["third question", "third answer: 9"] {
        assert!(!seen.iter().any(|c| c == gone), "{gone} leaked: {seen:?}");
    }
    // The fork numbers on from the prefix; the parent still has not moved.
    let fork_export = export(&app.client, &id).await;
    assert_eq!(fork_export["messages"][cut]["seq"], cut + 1);
    assert_eq!(export_bytes(&app.client, &parent).await, before);

    // Without a turn: after the last finished turn, everything.
    let (status, whole) = fork(&app.client, &parent, json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{whole}");
    assert_eq!(whole["forked_from"]["turn_id"], turns[2]);
    let whole = export(&app.client, whole["id"].as_str().unwrap()).await;
    assert_eq!(whole["messages"], json!(all));
    // No body at all is the same.
    let (status, _) = app
        .client
        .post_raw(&format!("/v1/sessions/{parent}/fork"), Vec::new())
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(total_calls(&app.client).await, calls);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_shows_the_state_after_each_turn_and_a_later_summary_never_leaks_into_a_fork() {
    let model = MockModel::start().await;
    let agents = agents();
    let app = spawn_app(AppOptions::with_model(&model).agents(agents.path()));
    let session = app.session("small").await;
    // history_window 2: past four uncovered messages, all but the last two
    // are summarised after the turn.
    for i in 1..=3 {
        model.push(Reply::text(&format!("answer {i}")));
    }
    model.push(Reply::text("SUMMARY OF TURNS ONE AND TWO"));
    for i in 1..=3 {
        let (status, body) = app.say(&session, &format!("question {i}")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (_, s) = app.get(&format!("/v1/sessions/{session}/summary")).await;
        if s["covers_until_seq"].as_u64().unwrap_or(0) > 0 {
            assert_eq!(s["covers_until_seq"], 4, "{s}");
            break;
        }
        assert!(Instant::now() < deadline, "no summary: {s}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (status, page) = app
        .get(&format!("/v1/sessions/{session}/history?limit=2"))
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["count"], 2);
    let first = &page["turns"][0];
    assert_eq!(first["finished"], true);
    assert_eq!(first["until_seq"], 2);
    assert_eq!(first["summary"], Value::Null, "the summary covers seq 4");
    assert_eq!(
        first["window"],
        json!([{"role": "user", "content": "question 1", "tool_calls": [], "tool_call_id": null},
               {"role": "assistant", "content": "answer 1", "tool_calls": [], "tool_call_id": null}])
    );
    let next = page["next"].as_str().expect("a second page").to_string();
    let (_, rest) = app
        .get(&format!("/v1/sessions/{session}/history?cursor={next}"))
        .await;
    let last = &rest["turns"][0];
    assert_eq!(
        (rest["count"].clone(), rest["next"].clone()),
        (json!(1), Value::Null)
    );
    assert_eq!(last["until_seq"], 6);
    assert_eq!(last["summary"]["covers_until_seq"], 4);
    let window: Vec<&str> = last["window"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(window, ["question 3", "answer 3"]);

    // A fork after turn 1: no summary (it covers turns 1 and 2).
    let turn1 = first["turn_id"].as_str().unwrap();
    let (status, early) = fork(&app.client, &session, json!({"turn_id": turn1})).await;
    assert_eq!(status, StatusCode::CREATED, "{early}");
    let early = early["id"].as_str().unwrap().to_string();
    assert_eq!(export(&app.client, &early).await["summary"], Value::Null);
    model.push(Reply::text("early fork answer"));
    let (status, _) = app.say(&early, "after the early fork").await;
    assert_eq!(status, StatusCode::OK);
    let seen = contents(model.requests().last().unwrap()).join("\n");
    assert!(!seen.contains("SUMMARY OF TURNS"), "{seen}");
    assert!(!seen.contains("question 2"), "{seen}");
    assert!(
        seen.contains("question 1") && seen.contains("answer 1"),
        "{seen}"
    );

    // A fork after turn 3 carries it.
    let (status, late) = fork(&app.client, &session, json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{late}");
    let late = export(&app.client, late["id"].as_str().unwrap()).await;
    assert_eq!(late["summary"]["text"], "SUMMARY OF TURNS ONE AND TWO");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_turn_is_409_an_unknown_one_404_and_another_agent_may_continue() {
    let model = MockModel::start().await;
    let agents = agents();
    let app = spawn_app(AppOptions::with_model(&model).agents(agents.path()));
    let session = app.session("calc").await;
    // No finished turn yet.
    let (status, body) = fork(&app.client, &session, json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "TURN_NOT_FINISHED");

    model.push(Reply::text("done answer"));
    let (status, _) = app.say(&session, "done question").await;
    assert_eq!(status, StatusCode::OK);
    // A turn that waits for the model.
    model.push(Reply::slow(
        Duration::from_secs(3),
        Reply::text("slow answer"),
    ));
    let response = app
        .client
        .request(Method::POST, &format!("/v1/sessions/{session}/messages"))
        .header("prefer", "respond-async")
        .json(&json!({"content": "slow question"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let open: Value = response.json().await.unwrap();
    let open = open["turn_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + PATIENCE;
    while turn_ids(&app.client, &session).await.len() < 2 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, body) = fork(&app.client, &session, json!({"turn_id": open})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "TURN_NOT_FINISHED");
    let (status, body) = fork(&app.client, &session, json!({"turn_id": "no-such-turn"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "TURN_NOT_FOUND");
    let (status, body) = fork(&app.client, &session, json!({"agent": "nobody"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "AGENT_NOT_FOUND");
    let (_, history) = app.get(&format!("/v1/sessions/{session}/history")).await;
    assert_eq!(history["turns"][1]["finished"], false, "{history}");
    assert_eq!(history["turns"][1]["until_seq"], Value::Null);

    // Meanwhile the default fork point is the finished turn, without the
    // open turn's message; `agent` continues it with another agent.
    let (status, forked) = fork(&app.client, &session, json!({"agent": "other"})).await;
    assert_eq!(status, StatusCode::CREATED, "{forked}");
    assert_eq!(forked["agent"], "other");
    let id = forked["id"].as_str().unwrap().to_string();
    let messages = export(&app.client, &id).await["messages"].clone();
    assert_eq!(messages.as_array().unwrap().len(), 2, "{messages}");
    let before = model.request_count();
    model.push(Reply::text("other answer"));
    let (status, body) = app.say(&id, "to the other agent").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let requests = model.requests();
    let fork_request = requests[before..]
        .iter()
        .find(|r| contents(r).iter().any(|c| c == "to the other agent"))
        .expect("the fork's request");
    let seen = contents(fork_request);
    assert!(seen[0].contains("You are the OTHER agent."), "{seen:?}");
    assert!(seen.iter().any(|c| c == "done question"), "{seen:?}");
    assert!(!seen.iter().any(|c| c == "slow question"), "{seen:?}");
}

async fn keyed_app(model: &MockModel, agents: &Path, dir: &Path) -> (TestApp, Client, Client) {
    let store = support::store::open_store(dir);
    let (acme, _) = cadre::tenants::create_key(&store, "acme", false)
        .await
        .unwrap();
    let (globex, _) = cadre::tenants::create_key(&store, "globex", false)
        .await
        .unwrap();
    drop(store);
    let app = spawn_app(AppOptions::with_model(model).agents(agents).data_dir(dir));
    let (a, g) = (app.with_key(&acme), app.with_key(&globex));
    (app, a, g)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forks_stay_within_their_tenant() {
    let model = MockModel::start().await;
    let agents = agents();
    let dir = tempfile::tempdir().unwrap();
    let (_app, acme, globex) = keyed_app(&model, agents.path(), dir.path()).await;
    let session = acme.session("calc").await;
    model.push(Reply::text("acme answer"));
    let (status, _) = acme.say(&session, "acme question").await;
    assert_eq!(status, StatusCode::OK);
    let turn = turn_ids(&acme, &session).await.remove(0);

    // Another tenant: the parent does not exist for it.
    for body in [json!({}), json!({"turn_id": turn})] {
        let (status, refused) = fork(&globex, &session, body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{refused}");
        assert_eq!(refused["error"]["code"], "SESSION_NOT_FOUND");
    }
    let (status, _) = globex.get(&format!("/v1/sessions/{session}/history")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The owner's fork is its own: listed for acme, unknown to globex.
    let (status, forked) = fork(&acme, &session, json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{forked}");
    assert_eq!(forked["tenant"], "acme");
    let id = forked["id"].as_str().unwrap();
    let (status, _) = globex.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, theirs) = globex.get("/v1/sessions").await;
    assert_eq!(theirs["count"], 0, "{theirs}");
    let (status, _) = acme.get(&format!("/v1/sessions/{id}/export")).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_counts_toward_the_storage_quota_and_a_keyed_retry_makes_one() {
    let model = MockModel::start().await;
    let agents = agents();
    let app = spawn_app(AppOptions::with_model(&model).agents(agents.path()));
    let session = app.session("calc").await;
    model.push(Reply::text("a"));
    let (status, _) = app.say(&session, &"x".repeat(200 * 1024)).await;
    assert_eq!(status, StatusCode::OK);
    // Keyed: the retry replays the first fork.
    let keyed = |key: &'static str| {
        app.client
            .request(Method::POST, &format!("/v1/sessions/{session}/fork"))
            .header("idempotency-key", key)
            .json(&json!({}))
    };
    let (status, first) = support::send(keyed("k1")).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let (status, again) = support::send(keyed("k1")).await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    assert_eq!(first["id"], again["id"]);

    // Each fork stores the prefix again (about 200 KiB): at a quota of
    // 1 MiB, a few forks fill it and the next is refused.
    let (status, body) = app
        .post("/v1/tenants/default/config", &json!({"max_storage_mb": 1}))
        .await;
    assert!(status.is_success(), "{status} {body}");
    let mut refused = None;
    for _ in 0..8 {
        let (status, body) = fork(&app.client, &session, json!({})).await;
        if status != StatusCode::CREATED {
            refused = Some((status, body));
            break;
        }
    }
    let (status, body) = refused.expect("a fork over the quota is refused");
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(body["error"]["code"], "STORAGE_QUOTA_EXCEEDED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_survives_a_restart() {
    let model = MockModel::start().await;
    let agents = agents();
    let dir = tempfile::tempdir().unwrap();
    let mut app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .data_dir(dir.path()),
    );
    let (parent, turns) = three_turns(&app, &model).await;
    let (status, forked) = fork(&app.client, &parent, json!({"turn_id": turns[0]})).await;
    assert_eq!(status, StatusCode::CREATED, "{forked}");
    let id = forked["id"].as_str().unwrap().to_string();
    let before = export_bytes(&app.client, &id).await;
    app.stop();

    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .data_dir(dir.path()),
    );
    assert_eq!(export_bytes(&app.client, &id).await, before);
    let (_, shown) = app.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(shown["forked_from"]["turn_id"], turns[0]);
    model.push(Reply::text("after restart"));
    let (status, body) = app.say(&id, "question after restart").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let seen = contents(model.requests().last().unwrap());
    assert!(seen.iter().any(|c| c == "first answer: 4"), "{seen:?}");
    assert!(!seen.iter().any(|c| c == "second question"), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_on_postgresql_keeps_the_prefix_and_leaves_the_parent_as_it_was() {
    let model = MockModel::start().await;
    let agents = agents();
    let url = support::store::server().database("fork");
    let mut options = AppOptions::with_model(&model).agents(agents.path());
    options.config.cluster.node_id = Some("fork-pg".into());
    options.config.cluster.store = Some(url);
    let app = spawn_app(options);
    let (parent, turns) = three_turns(&app, &model).await;
    let before = export_bytes(&app.client, &parent).await;
    let calls = total_calls(&app.client).await;
    let (status, forked) = fork(&app.client, &parent, json!({"turn_id": turns[1]})).await;
    assert_eq!(status, StatusCode::CREATED, "{forked}");
    let id = forked["id"].as_str().unwrap().to_string();
    assert_eq!(export_bytes(&app.client, &parent).await, before);
    assert_eq!(total_calls(&app.client).await, calls);
    let parent_export: Value = serde_json::from_str(&before).unwrap();
    let fork_export = export(&app.client, &id).await;
    let all = parent_export["messages"].as_array().unwrap();
    assert_eq!(fork_export["messages"], json!(all[..prefix_len(all)]));
    assert_eq!(fork_export["session"]["forked_from"]["turn_id"], turns[1]);
    let (_, history) = app.get(&format!("/v1/sessions/{parent}/history")).await;
    assert_eq!(history["count"], 3, "{history}");
    assert_eq!(history["turns"][1]["until_seq"], prefix_len(all));
    model.push(Reply::text("pg fork answer"));
    let (status, _) = app.say(&id, "pg fork question").await;
    assert_eq!(status, StatusCode::OK);
    let seen = contents(model.requests().last().unwrap());
    assert!(seen.iter().any(|c| c == "second answer"), "{seen:?}");
    assert!(!seen.iter().any(|c| c == "third question"), "{seen:?}");
}
