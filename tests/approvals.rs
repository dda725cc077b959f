//! Approvals run exactly once: racing approvals and denials of one
//! confirmation, against the real server, counted by their side effect
//! (paper order fills in the user's trade history). A call waiting for
//! approval is its own state: listed as `pending_approval`, counted as
//! neither succeeded nor failed; approved, it counts once, as succeeded;
//! declined, as declined (the model is the mock at the wire).
//!
//! client ×8 ──POST /v1/confirmations/{id}──▶ decide (one atomic store step) ──▶ one run
//!                                                   └──▶ the others: 409 CONFIRMATION_ALREADY_DECIDED

mod support;

use std::time::{Duration, Instant};

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{AppOptions, MockModel, Reply, TestApp, agent_toml, agents_dir, spawn_app};

const TRIALS: usize = 20;
const APPROVERS: usize = 8;

/// A market order for `user` held for confirmation; its id.
async fn held_order(app: &TestApp, user: &str) -> String {
    let (status, order) = app
        .post(
            "/v1/tools/create_paper_order/invoke",
            &json!({
                "user_id": user,
                "plan": "pro",
                "params": {"symbol": "AAPL", "side": "buy", "quantity": 1, "order_type": "market"}
            }),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{order}");
    order["metadata"]["confirmation_id"]
        .as_str()
        .expect("a confirmation id")
        .to_owned()
}

/// How many orders of `user` filled.
async fn fills(app: &TestApp, user: &str) -> usize {
    let (status, history) = app
        .post(
            "/v1/tools/get_trade_history/invoke",
            &json!({"user_id": user, "plan": "pro", "params": {}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{history}");
    history["output"]["data"]["trades"]
        .as_array()
        .expect("trades")
        .len()
}

/// The API's own request rate is not what these tests are about.
fn app() -> TestApp {
    spawn_app(
        AppOptions::offline().config_toml("[api_limit]\nper_second = 100000\nburst = 100000\n"),
    )
}

async fn decide(app: &TestApp, id: &str, approve: bool) -> (StatusCode, Value) {
    app.post(
        &format!("/v1/confirmations/{id}"),
        &json!({ "approve": approve }),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_concurrent_approvals_fill_the_order_once() {
    let app = app();
    for trial in 0..TRIALS {
        let user = format!("racer-{trial}");
        let id = held_order(&app, &user).await;
        let answers = join_all((0..APPROVERS).map(|_| decide(&app, &id, true))).await;
        let executed = answers
            .iter()
            .filter(|(s, b)| *s == StatusCode::OK && b["status"] == "executed")
            .count();
        let refused = answers
            .iter()
            .filter(|(s, b)| {
                *s == StatusCode::CONFLICT && b["error"]["code"] == "CONFIRMATION_ALREADY_DECIDED"
            })
            .count();
        assert_eq!(
            (executed, refused),
            (1, APPROVERS - 1),
            "trial {trial}: {answers:?}"
        );
        assert_eq!(fills(&app, &user).await, 1, "trial {trial}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn approve_and_deny_sent_together_one_wins_and_the_fill_follows_it() {
    let app = app();
    for trial in 0..TRIALS {
        let user = format!("split-{trial}");
        let id = held_order(&app, &user).await;
        let (approve, deny) = tokio::join!(decide(&app, &id, true), decide(&app, &id, false));
        let statuses = [approve.0, deny.0];
        assert!(
            statuses.contains(&StatusCode::OK) && statuses.contains(&StatusCode::CONFLICT),
            "trial {trial}: {approve:?} {deny:?}"
        );
        let approved = approve.0 == StatusCode::OK;
        if approved {
            assert_eq!(approve.1["status"], "executed", "{approve:?}");
            assert_eq!(deny.1["error"]["code"], "CONFIRMATION_ALREADY_DECIDED");
        } else {
            assert_eq!(deny.1["status"], "denied", "{deny:?}");
            assert_eq!(approve.1["error"]["code"], "CONFIRMATION_ALREADY_DECIDED");
        }
        assert_eq!(
            fills(&app, &user).await,
            usize::from(approved),
            "trial {trial}"
        );
        // A late decision learns the outcome and runs nothing.
        let (status, late) = decide(&app, &id, true).await;
        assert_eq!(status, StatusCode::CONFLICT, "{late}");
        assert_eq!(fills(&app, &user).await, usize::from(approved));
    }
}

const ORDER: &str = r#"{"symbol":"AAPL","side":"buy","quantity":1,"order_type":"market"}"#;

/// A turn that asks for an order: paused; its confirmation id.
async fn paused_order_turn(app: &TestApp, model: &MockModel, session: &str, call: &str) -> String {
    model.push(Reply::tool_call(call, "create_paper_order", ORDER));
    let (status, reply) = app.say(session, "buy one AAPL").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    assert_eq!(reply["status"], "awaiting_approval", "{reply}");
    let usage = &reply["tool_usage_summary"];
    assert_eq!(
        (&usage["failed_calls"], &usage["pending_calls"]),
        (&json!(0), &json!(1)),
        "{reply}"
    );
    reply["confirmations"][0]["confirmation_id"]
        .as_str()
        .expect("a confirmation")
        .to_owned()
}

/// The session's call records of the order tool, oldest first.
async fn order_calls(app: &TestApp, session: &str) -> Vec<Value> {
    let (status, page) = app
        .get(&format!(
            "/v1/calls?conversation_id={session}&tool=create_paper_order"
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let mut calls = page["calls"].as_array().expect("calls").clone();
    calls.reverse();
    calls
}

/// `(successful, failed, pending, declined)` of the session's summary.
async fn session_counts(app: &TestApp, session: &str) -> (u64, u64, u64, u64) {
    let (status, s) = app.get(&format!("/v1/sessions/{session}/summary")).await;
    assert_eq!(status, StatusCode::OK, "{s}");
    let u = &s["tool_usage_summary"];
    let n = |k: &str| u[k].as_u64().unwrap_or_else(|| panic!("{k} in {s}"));
    (
        n("successful_calls"),
        n("failed_calls"),
        n("pending_calls"),
        n("declined_calls"),
    )
}

/// `(successful, failed)` of `/v1/stats`, over every tool and of the order tool.
async fn stats_counts(app: &TestApp) -> ((u64, u64), (u64, u64)) {
    let (status, s) = app.get("/v1/stats").await;
    assert_eq!(status, StatusCode::OK, "{s}");
    let order = &s["tools"]["create_paper_order"];
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    (
        (n(&s["successful_calls"]), n(&s["failed_calls"])),
        (n(&order["successful_calls"]), n(&order["failed_calls"])),
    )
}

async fn wait_for_phase(app: &TestApp, session: &str, turn: &str, phase: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = app
            .get(&format!("/v1/sessions/{session}/turns/{turn}"))
            .await;
        if status == StatusCode::OK && body["phase"] == phase {
            return;
        }
        assert!(Instant::now() < deadline, "never {phase}: {status} {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_held_order_is_pending_not_failed_and_counts_once_as_approved_or_declined() {
    let model = MockModel::start().await;
    let agents = agents_dir(&[(
        "trader.toml",
        &agent_toml("trader", &["calculator", "create_paper_order"], 3),
    )]);
    // The paper order fills at the sample data's prices.
    std::fs::create_dir_all(agents.path().join("data")).unwrap();
    std::fs::copy(
        support::repo_agents().join("data/trading.json"),
        agents.path().join("data/trading.json"),
    )
    .unwrap();
    let app = spawn_app(AppOptions::with_model(&model).agents(agents.path()));
    let (status, body) = app
        .post(
            "/v1/sessions",
            &json!({"agent": "trader", "plan": "pro", "user_id": "alice"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let session = body["id"].as_str().expect("session id").to_owned();

    // Held: listed as pending, counted as neither succeeded nor failed.
    let id = paused_order_turn(&app, &model, &session, "o1").await;
    let calls = order_calls(&app, &session).await;
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["status"], "pending_approval", "{calls:?}");
    assert_eq!(session_counts(&app, &session).await, (0, 0, 1, 0));
    assert_eq!(stats_counts(&app).await, ((0, 0), (0, 0)));

    // Approved: the same record, now succeeded; counted once.
    model.push(Reply::text("Your order filled."));
    let (status, decided) = decide(&app, &id, true).await;
    assert_eq!(status, StatusCode::OK, "{decided}");
    assert_eq!(decided["status"], "executed", "{decided}");
    let calls = order_calls(&app, &session).await;
    assert_eq!(calls.len(), 1, "one record per call: {calls:?}");
    assert_eq!(calls[0]["status"], "succeeded", "{calls:?}");
    assert_eq!(session_counts(&app, &session).await, (1, 0, 0, 0));
    assert_eq!(stats_counts(&app).await, ((1, 0), (1, 0)));
    let (_, turns) = app.get(&format!("/v1/sessions/{session}/turns")).await;
    let first = turns["turns"][0]["turn_id"]
        .as_str()
        .expect("a turn")
        .to_owned();
    wait_for_phase(&app, &session, &first, "completed").await;

    // Declined: declined, not failed, and not counted per tool.
    let id = paused_order_turn(&app, &model, &session, "o2").await;
    model.push(Reply::text("Nothing was ordered."));
    let (status, decided) = decide(&app, &id, false).await;
    assert_eq!(status, StatusCode::OK, "{decided}");
    assert_eq!(decided["status"], "denied", "{decided}");
    let calls = order_calls(&app, &session).await;
    let states: Vec<&Value> = calls.iter().map(|c| &c["status"]).collect();
    assert_eq!(
        states,
        [&json!("succeeded"), &json!("declined")],
        "{calls:?}"
    );
    assert_eq!(session_counts(&app, &session).await, (1, 0, 0, 1));
    assert_eq!(stats_counts(&app).await, ((1, 0), (1, 0)));
}
