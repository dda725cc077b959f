//! Approvals run exactly once: racing approvals and denials of one
//! confirmation, against the real server, counted by their side effect
//! (paper order fills in the user's trade history).
//!
//! client ×8 ──POST /v1/confirmations/{id}──▶ decide (one atomic store step) ──▶ one run
//!                                                   └──▶ the others: 409 CONFIRMATION_ALREADY_DECIDED

mod support;

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{AppOptions, TestApp, spawn_app};

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
