//! Deleting data: `DELETE /v1/sessions/{id}`, the tenant erase and the
//! retention sweep remove a session and everything stored under its id,
//! from the store itself: after each, the server is stopped and every
//! table of the store is read (`support::store::rows_naming`: the redb
//! file, or every table of the PostgreSQL database) for the session's id,
//! its call records' and its confirmations' ids.
//!
//! DELETE ──▶ Sessions::delete ──retire actor (409 while a turn runs)──▶ WriteOp::DeleteSession ──▶ redb

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::gate::gate_tool;
use support::server::Server;
use support::{AppOptions, Client, MockModel, Reply, agent_toml, agents_dir, spawn_app};

/// Longest a test waits for something the server does on its own.
const PATIENCE: Duration = Duration::from_secs(20);

/// An agent that calls the calculator and places paper orders (held for
/// confirmation), and summarises after every turn (window of 1).
fn trader() -> String {
    format!(
        "{}history_window = 1\n",
        agent_toml("trader", &["calculator", "create_paper_order"], 3)
    )
}

const ORDER: &str = r#"{"symbol":"AAPL","side":"buy","quantity":1,"order_type":"market"}"#;

async fn pro_session(client: &Client, agent: &str) -> String {
    let (status, body) = client
        .post(
            "/v1/sessions",
            &json!({"agent": agent, "plan": "pro", "user_id": "alice"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["id"].as_str().expect("session id").to_string()
}

/// Waits until the session's rolling summary is stored (the summary call
/// runs after the turn's answer; the session is busy until then).
async fn summarised(client: &Client, session: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (status, body) = client.get(&format!("/v1/sessions/{session}/summary")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        if !body["conversation_summary"].is_null() {
            return;
        }
        assert!(Instant::now() < deadline, "no summary stored: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `DELETE /v1/sessions/{id}`, retried while the session's summary call
/// still runs after its last turn (409 `CONVERSATION_BUSY`).
async fn delete_when_idle(client: &Client, session: &str) -> (StatusCode, Value) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (status, body) = client.delete(&format!("/v1/sessions/{session}")).await;
        if status != StatusCode::CONFLICT || Instant::now() > deadline {
            return (status, body);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every row of the stopped server's store that mentions one of `ids`.
fn rows_naming(data: &Path, ids: &[String]) -> Vec<String> {
    support::store::rows_naming(data, ids)
}

fn cadre(args: &[&str], data: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cadre"))
        .args(args)
        .arg("--data-dir")
        .arg(data)
        .env("RUST_LOG", "warn")
        .output()
        .expect("cadre runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test]
async fn a_deleted_session_is_gone_from_every_endpoint_command_and_table() {
    let model = MockModel::start().await;
    model.set_default(Some(Reply::text("A short summary of the talk.")));
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let agents = agents_dir(&[("trader.toml", &trader())]);
    let mut server = Server::start(&data, agents.path(), &model.base_url(), &[]);
    let client = server.client();

    // The session to delete: a calculator call, two orders held for
    // confirmation (one approved below, one left pending), a summary.
    let gone = pro_session(&client, "trader").await;
    model.push(Reply::tool_call(
        "c1",
        "calculator",
        r#"{"expression":"6*7"}"#,
    ));
    model.push(Reply::text("42."));
    let (status, turn) = client.say(&gone, "6*7?").await;
    assert_eq!(status, StatusCode::OK, "{turn}");
    summarised(&client, &gone).await;
    // The orders pause the next turn (202): a paused session may be deleted.
    model.push(Reply::tool_calls(&[
        ("c2", "create_paper_order", ORDER),
        ("c3", "create_paper_order", ORDER),
    ]));
    let (status, turn) = client.say(&gone, "buy twice").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{turn}");
    assert_eq!(turn["status"], "awaiting_approval", "{turn}");

    // The session that stays, of the same tenant and agent.
    let kept = pro_session(&client, "trader").await;
    model.push(Reply::tool_call(
        "k1",
        "calculator",
        r#"{"expression":"1+1"}"#,
    ));
    model.push(Reply::text("2"));
    let (status, turn) = client.say(&kept, "1+1?").await;
    assert_eq!(status, StatusCode::OK, "{turn}");
    summarised(&client, &kept).await;

    let (_, pending) = client.get("/v1/confirmations").await;
    let confirmations: Vec<String> = pending["confirmations"]
        .as_array()
        .expect("confirmations")
        .iter()
        .filter(|c| c["context"]["conversation_id"] == gone.as_str())
        .map(|c| c["confirmation_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(confirmations.len(), 2, "{pending}");
    let (status, body) = client
        .post(
            &format!("/v1/confirmations/{}", confirmations[0]),
            &json!({"approve": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // The approved call's record is written behind its answer.
    let deadline = Instant::now() + PATIENCE;
    let records: Vec<String> = loop {
        let (_, calls) = client
            .get(&format!("/v1/calls?conversation_id={gone}"))
            .await;
        let listed = calls["calls"].as_array().expect("calls");
        let records: Vec<String> = listed
            .iter()
            .map(|c| c["record_id"].as_str().unwrap().to_string())
            .collect();
        // Three calls of the turns; the approved order's outcome rewrites
        // its held record (one record per call), the other stays held.
        let held = listed
            .iter()
            .filter(|c| c["status"] == "pending_approval")
            .count();
        if records.len() == 3 && held == 1 {
            break records;
        }
        assert!(Instant::now() < deadline, "{calls}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (_, stats_before) = client.get("/v1/stats").await;

    let (status, body) = delete_when_idle(&client, &gone).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");

    // Nothing reads it back over HTTP.
    for path in ["", "/messages", "/summary", "/export"] {
        let (status, body) = client.get(&format!("/v1/sessions/{gone}{path}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        assert_eq!(body["error"]["code"], "SESSION_NOT_FOUND", "{path}: {body}");
    }
    let (status, body) = client.delete(&format!("/v1/sessions/{gone}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "a second delete: {body}");
    let (_, listed) = client.get("/v1/sessions").await;
    let listed = listed.to_string();
    assert!(
        !listed.contains(&gone) && listed.contains(&kept),
        "{listed}"
    );
    let (_, calls) = client.get("/v1/calls?limit=100").await;
    let calls = calls.to_string();
    assert!(!calls.contains(&gone), "{calls}");
    let (_, calls) = client
        .get(&format!("/v1/calls?conversation_id={gone}"))
        .await;
    assert_eq!(calls["calls"], json!([]), "{calls}");
    let (_, pending) = client.get("/v1/confirmations").await;
    assert!(!pending.to_string().contains(&gone), "{pending}");
    for id in &confirmations {
        let (status, body) = client
            .post(
                &format!("/v1/confirmations/{id}"),
                &json!({"approve": true}),
            )
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "pending or decided: {body}");
    }
    // The per-tool counters count calls ever made: not decremented.
    let (_, stats_after) = client.get("/v1/stats").await;
    assert_eq!(stats_after["tools"], stats_before["tools"]);
    assert_eq!(stats_after["tools"]["calculator"]["total_calls"], 2);

    server.sigterm();
    assert!(
        server.wait_exit(PATIENCE).success(),
        "{}",
        server.log_tail()
    );

    // Nor any command.
    for args in [
        ["sessions", "show", gone.as_str()].as_slice(),
        &["sessions", "export", &gone],
        &["sessions", "summary", &gone],
    ] {
        let (ok, out) = cadre(args, &data);
        assert!(!ok, "{args:?}: {out}");
        assert!(out.contains("no session"), "{args:?}: {out}");
    }
    for args in [
        ["sessions", "list"].as_slice(),
        &["calls", "--limit", "1000"],
        &["calls", "--session", &gone],
    ] {
        let (ok, out) = cadre(args, &data);
        assert!(ok, "{args:?}: {out}");
        assert!(!out.contains(&gone), "{args:?}: {out}");
    }

    // And no table of the file holds any of its ids; the other session stays.
    let mut ids = vec![gone.clone()];
    ids.extend(records);
    ids.extend(confirmations);
    let left = rows_naming(&data, &ids);
    assert!(left.is_empty(), "rows left behind:\n{}", left.join("\n"));
    assert!(!rows_naming(&data, std::slice::from_ref(&kept)).is_empty());
}

#[tokio::test]
async fn a_delete_during_a_turn_is_refused_and_the_turn_cannot_bring_the_session_back() {
    let model = MockModel::start().await;
    let (def, handler, mut gate) = gate_tool("gate", "test");
    let agents = agents_dir(&[("gated.toml", &agent_toml("gated", &["gate"], 3))]);
    let data = tempfile::tempdir().unwrap();
    let mut app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .data_dir(data.path())
            .tool(def, handler),
    );
    let session = app.session("gated").await;
    model.push(Reply::tool_call("g1", "gate", r#"{"label":"held"}"#));
    model.push(Reply::text("released"));
    let turn = app.client.spawn_post(
        &format!("/v1/sessions/{session}/messages"),
        json!({"content": "go"}),
    );
    assert_eq!(gate.started().await, "held");

    let (status, body) = app.client.delete(&format!("/v1/sessions/{session}")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "CONVERSATION_BUSY", "{body}");

    gate.open_one();
    let (status, outcome) = turn.await.expect("the turn's request");
    assert_eq!(status, StatusCode::OK, "{outcome}");
    assert_eq!(outcome["answer"], "released");

    let (status, body) = app.client.delete(&format!("/v1/sessions/{session}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    // A message after the delete does not start it again.
    let (status, body) = app.say(&session, "still there?").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    app.stop();
    let left = rows_naming(data.path(), std::slice::from_ref(&session));
    assert!(left.is_empty(), "rows left behind:\n{}", left.join("\n"));
}

#[tokio::test]
async fn another_tenants_session_is_not_found_and_stays() {
    let data = tempfile::tempdir().unwrap();
    let keys = {
        let store = support::store::open_store(data.path());
        let mut keys = Vec::new();
        for (tenant, admin) in [("acme", false), ("globex", false), ("ops", true)] {
            let (key, _) = cadre::tenants::create_key(&store, tenant, admin)
                .await
                .expect("key created");
            keys.push(key);
        }
        keys
    };
    let mut app = spawn_app(AppOptions::offline().data_dir(data.path()));
    let (acme, globex, admin) = (
        app.with_key(&keys[0]),
        app.with_key(&keys[1]),
        app.with_key(&keys[2]),
    );
    let session = acme.session("assistant").await;
    for who in [&globex, &admin] {
        let (status, body) = who.delete(&format!("/v1/sessions/{session}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        assert_eq!(body["error"]["code"], "SESSION_NOT_FOUND");
    }
    let (status, body) = acme.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // The tenant erase is for admins only.
    let (status, body) = acme.delete("/v1/tenants/acme/sessions").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "ADMIN_REQUIRED");
    let (status, _) = acme.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(status, StatusCode::OK);
    app.stop();
    assert!(!rows_naming(data.path(), std::slice::from_ref(&session)).is_empty());
}

#[tokio::test]
async fn a_tenant_erase_deletes_all_its_sessions_in_batches_and_no_other_tenants() {
    let data = tempfile::tempdir().unwrap();
    let keys = {
        let store = support::store::open_store(data.path());
        let mut keys = Vec::new();
        for (tenant, admin) in [("acme", false), ("globex", false), ("ops", true)] {
            let (key, _) = cadre::tenants::create_key(&store, tenant, admin)
                .await
                .expect("key created");
            keys.push(key);
        }
        keys
    };
    let mut app = spawn_app(
        AppOptions::offline()
            .data_dir(data.path())
            .config_toml("[api_limit]\nper_second = 100000\nburst = 100000\n"),
    );
    let (acme, globex, admin) = (
        app.with_key(&keys[0]),
        app.with_key(&keys[1]),
        app.with_key(&keys[2]),
    );
    // More than one batch of the erase.
    let n = cadre::conversation::sessions::ERASE_BATCH + 20;
    let mut erased = Vec::new();
    for _ in 0..n {
        erased.push(acme.session("assistant").await);
    }
    let (status, turn) = acme.say(&erased[0], "What is 6*7?").await;
    assert_eq!(status, StatusCode::OK, "{turn}");
    let kept = globex.session("assistant").await;

    let (status, body) = admin.delete("/v1/tenants/acme/sessions").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"tenant": "acme", "deleted": n, "busy": 0, "calls": 0, "memory_items": 0})
    );
    let (_, listed) = acme.get("/v1/sessions").await;
    assert_eq!(listed["sessions"], json!([]), "{listed}");
    let (_, calls) = acme.get("/v1/calls").await;
    assert_eq!(calls["calls"], json!([]), "{calls}");
    let (status, _) = globex.get(&format!("/v1/sessions/{kept}")).await;
    assert_eq!(status, StatusCode::OK);

    app.stop();
    let left = rows_naming(data.path(), &erased);
    assert!(left.is_empty(), "rows left behind:\n{}", left.join("\n"));
    assert!(!rows_naming(data.path(), std::slice::from_ref(&kept)).is_empty());
}

#[tokio::test]
async fn sessions_idle_past_retain_days_are_swept_and_fresh_ones_stay() {
    let data = tempfile::tempdir().unwrap();
    // 0.00003 days: 2.6 s idle; the sweep runs every 0.65 s.
    let mut app = spawn_app(
        AppOptions::offline()
            .data_dir(data.path())
            .config_toml("[sessions]\nretain_days = 0.00003\n"),
    );
    let old = app.session("assistant").await;
    let (status, turn) = app.say(&old, "What is 6*7?").await;
    assert_eq!(status, StatusCode::OK, "{turn}");
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (status, _) = app.get(&format!("/v1/sessions/{old}")).await;
        if status == StatusCode::NOT_FOUND {
            break;
        }
        assert!(Instant::now() < deadline, "never swept");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Made after the sweep that took `old`: not idle long enough yet.
    let fresh = app.session("assistant").await;
    let (status, _) = app.get(&format!("/v1/sessions/{fresh}")).await;
    assert_eq!(status, StatusCode::OK);
    app.stop();
    let left = rows_naming(data.path(), std::slice::from_ref(&old));
    assert!(left.is_empty(), "rows left behind:\n{}", left.join("\n"));
}

#[test]
fn retain_days_is_checked_and_off_by_default() {
    use cadre::server_config::ServerConfig;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cadre.toml");
    std::fs::write(&path, "").unwrap();
    let config = ServerConfig::load(Some(&path), Vec::new()).expect("empty config");
    assert_eq!(config.session_limits().retain, None);
    for bad in ["-1", "nan", "40000"] {
        std::fs::write(&path, format!("[sessions]\nretain_days = {bad}\n")).unwrap();
        let err = ServerConfig::load(Some(&path), Vec::new()).expect_err(bad);
        assert!(err.to_string().contains("retain_days"), "{bad}: {err}");
    }
    std::fs::write(&path, "[sessions]\nretain_days = 30\n").unwrap();
    let config = ServerConfig::load(Some(&path), Vec::new()).expect("30 days");
    assert_eq!(
        config.session_limits().retain,
        Some(Duration::from_secs(30 * 86_400))
    );
}
