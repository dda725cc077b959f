//! The visitor WebSocket paces a turn's events as a streamed (SSE) reply
//! does: a socket that does not read while the model streams gets one
//! `STREAM_LAGGED` error frame instead of the rest of the turn's events,
//! the turn completes and is stored whole, and the socket is still served.
//! (The SSE twin is `hostile_model`'s
//! `a_client_that_does_not_read_is_cut_off_and_the_turn_completes`.)

mod support;

use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::ws::{Ws, connect_ws};
use support::{AppOptions, MockModel, Reply, TestApp, agent_toml, agents_dir, spawn_app};
use tokio_tungstenite::tungstenite::{self, Message};

const PATIENCE: Duration = Duration::from_secs(30);

async fn history(app: &TestApp, session: &str) -> Vec<Value> {
    let (status, page) = app.get(&format!("/v1/sessions/{session}/messages")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page["messages"].as_array().expect("messages").clone()
}

/// The next text frame, as JSON, and its length.
async fn next_frame(ws: &mut Ws) -> (Value, usize) {
    let frame = tokio::time::timeout(PATIENCE, ws.next())
        .await
        .expect("a frame in time")
        .expect("the socket is open")
        .unwrap_or_else(|e| match e {
            // The whole 24 MB `turn_completed` came, over the client's
            // 16 MiB frame cap: the socket was not paced.
            tungstenite::Error::Capacity(_) => panic!("a lagging socket got the whole turn: {e}"),
            e => panic!("an unreadable frame: {e}"),
        });
    let text = frame.to_text().expect("a text frame");
    (
        serde_json::from_str(text).expect("a JSON frame"),
        text.len(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_that_does_not_read_gets_a_lag_error_and_the_turn_is_stored() {
    let model = MockModel::start().await;
    let agents = agents_dir(&[("bot.toml", &agent_toml("bot", &[], 3))]);
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .config_toml("[model]\nmax_reply_bytes = 67108864\n"),
    );
    let session = app.session("bot").await;
    // 24 MB of text in 4 KiB deltas: more than loopback's socket buffers,
    // the pacing buffer and its lag limit together.
    let (piece, count) = ("z".repeat(4096), 6000);
    model.push(Reply::deltas(&piece, count));
    let mut ws = connect_ws(&app, &session, None)
        .await
        .expect("the socket is upgraded");
    ws.send(Message::text(
        json!({"type": "visitor_message", "content": "talk"}).to_string(),
    ))
    .await
    .expect("frame sent");

    // The client reads nothing until the turn is stored.
    let deadline = Instant::now() + Duration::from_secs(60);
    let answer = loop {
        let messages = history(&app, &session).await;
        if let Some(answer) = messages.iter().find(|m| m["role"] == "assistant") {
            break answer["content"].as_str().expect("text").len();
        }
        assert!(Instant::now() < deadline, "the turn did not complete");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(answer, piece.len() * count, "the turn is stored whole");

    // Then it reads up to the turn's last frame.
    let mut kinds = Vec::new();
    let mut received = 0usize;
    let last = loop {
        let (frame, len) = next_frame(&mut ws).await;
        received += len;
        let kind = frame["type"].as_str().expect("a type").to_string();
        kinds.push(kind.clone());
        if kind == "error" || kind == "turn_completed" {
            break frame;
        }
    };
    assert_eq!(kinds[0], "auto_respond", "{kinds:?}");
    assert_eq!(
        last["error"]["code"],
        "STREAM_LAGGED",
        "a lagging socket got the whole turn: {} frames",
        kinds.len()
    );
    assert!(
        last["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("/turns/")),
        "{last}"
    );
    assert!(received < piece.len() * count, "{received} bytes");

    // The socket is still served.
    ws.send(Message::text(
        json!({"type": "unassign_operator"}).to_string(),
    ))
    .await
    .expect("frame sent");
    let (reply, _) = next_frame(&mut ws).await;
    assert_eq!(reply["type"], "operator_unassigned", "{reply}");
}
