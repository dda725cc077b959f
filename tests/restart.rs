//! The real `cadre serve` binary, run as a child process with no model
//! endpoint configured: the built-in offline provider answers through the
//! calculator, and a session's history, tool usage summary and ability to
//! take further turns survive `kill -9` and a restart on the same data dir.

mod support;

use std::path::Path;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::Client;

/// A `cadre serve` child process (see [`support::server`]) with the offline
/// provider, and the checked calls these tests make to it.
struct Server {
    process: support::server::Server,
    client: Client,
}

impl Server {
    async fn start(data_dir: &Path) -> Server {
        let data_dir = data_dir.join("data");
        let process = tokio::task::spawn_blocking(move || {
            support::server::Server::start_offline(&data_dir, &support::repo_agents())
        })
        .await
        .expect("the start thread finished");
        let client = process.client();
        Server { process, client }
    }

    fn kill_9(mut self) {
        self.process.kill_9();
    }

    async fn session(&self, agent: &str) -> String {
        self.client.session(agent).await
    }

    /// One turn; asserts it succeeded and returns the outcome.
    async fn say(&self, session: &str, content: &str) -> Value {
        let (status, body) = self.client.say(session, content).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    async fn messages(&self, session: &str) -> Vec<Value> {
        let (status, body) = self
            .client
            .get(&format!("/v1/sessions/{session}/messages"))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["session_id"], session);
        body["messages"].as_array().expect("messages array").clone()
    }

    async fn summary(&self, session: &str) -> Value {
        let (status, body) = self
            .client
            .get(&format!("/v1/sessions/{session}/summary"))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }
}

fn roles(messages: &[Value]) -> Vec<&str> {
    messages
        .iter()
        .map(|m| m["role"].as_str().expect("role"))
        .collect()
}

#[tokio::test]
async fn offline_provider_answers_6_times_7_with_42_via_the_calculator() {
    let data = tempfile::tempdir().expect("data dir");
    let server = Server::start(data.path()).await;
    let session = server.session("assistant").await;

    let outcome = server.say(&session, "What is 6*7?").await;

    let answer = outcome["answer"].as_str().expect("answer");
    assert!(answer.contains("42"), "answer: {answer}");
    let calls = outcome["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 1, "{outcome}");
    assert_eq!(calls[0]["name"], "calculator");
    assert_eq!(calls[0]["is_success"], true);
    assert_eq!(calls[0]["arguments"], json!({"expression": "6*7"}));
}

#[tokio::test]
async fn history_survives_kill_9_and_restart() {
    let data = tempfile::tempdir().expect("data dir");
    let first = Server::start(data.path()).await;
    let session = first.session("assistant").await;

    let arithmetic = first.say(&session, "What is (2+3)*4?").await;
    let answer = arithmetic["answer"].as_str().expect("answer");
    assert!(answer.contains("20"), "answer: {answer}");
    assert_eq!(arithmetic["tool_calls"][0]["name"], "calculator");
    let echoed = first.say(&session, "echo hello there").await;
    assert_eq!(echoed["tool_calls"][0]["name"], "echo");
    assert_eq!(echoed["tool_calls"][0]["is_success"], true);
    assert!(
        echoed["answer"]
            .as_str()
            .expect("answer")
            .contains("hello there"),
        "{echoed}"
    );

    let before = first.messages(&session).await;
    // Each turn: user, assistant (tool call), tool result, assistant answer.
    let turn = ["user", "assistant", "tool", "assistant"];
    assert_eq!(roles(&before), [turn, turn].concat());
    let seqs: Vec<u64> = before.iter().map(|m| m["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=8).collect::<Vec<u64>>());
    let summary_before = first.summary(&session).await;
    let usage = &summary_before["tool_usage_summary"];
    assert_eq!(usage["tool_usage"]["calculator"], 1, "{summary_before}");
    assert_eq!(usage["tool_usage"]["echo"], 1, "{summary_before}");
    assert_eq!(usage["total_calls"], 2, "{summary_before}");
    assert_eq!(usage["successful_calls"], 2, "{summary_before}");
    assert_eq!(summary_before["message_count"], 8, "{summary_before}");

    first.kill_9();
    let second = Server::start(data.path()).await;

    let after = second.messages(&session).await;
    assert_eq!(after, before, "history changed across kill -9 and restart");
    let summary_after = second.summary(&session).await;
    assert_eq!(summary_after, summary_before);

    let third = second.say(&session, "What is 10-3?").await;
    let answer = third["answer"].as_str().expect("answer");
    assert!(answer.contains('7'), "answer: {answer}");
    assert_eq!(third["tool_calls"][0]["name"], "calculator");
    assert_eq!(third["tool_calls"][0]["is_success"], true);

    let latest = second.messages(&session).await;
    assert_eq!(latest.len(), before.len() + 4);
    assert_eq!(latest[..before.len()], before[..]);
    assert_eq!(roles(&latest[before.len()..]), turn);
    let new_seqs: Vec<u64> = latest[before.len()..]
        .iter()
        .map(|m| m["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(new_seqs, [9, 10, 11, 12]);
    let tool_call_id = latest[9]["tool_calls"][0]["id"].clone();
    assert_eq!(latest[10]["tool_call_id"], tool_call_id);
    let summary = second.summary(&session).await;
    assert_eq!(summary["tool_usage_summary"]["tool_usage"]["calculator"], 2);
    assert_eq!(summary["tool_usage_summary"]["total_calls"], 3);
    assert_eq!(summary["message_count"], 12);
}
