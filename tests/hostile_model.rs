//! A hostile or broken model endpoint cannot take a session or cadre down:
//! replies are read through a byte cap and a tool-call cap, error text is
//! capped, a cut stream is a `MODEL_BAD_RESPONSE` like a cut body, odd
//! `usage` numbers and unknown `finish_reason`s do not spoil a good reply,
//! `length` and `content_filter` reach the reply, invalid UTF-8 is refused
//! the same way streamed or not, a turn's model time has one budget
//! (`MODEL_TIMEOUT`), a history the endpoint refuses as too large is
//! summarised instead of failing every later turn, and a streaming client
//! that does not read is cut off while the turn completes.
//!
//! The mock's hostile modes are in `support::mock_model` ("Hostile modes").

mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::server::Server;
use support::{AppOptions, MockModel, Reply, TestApp, agent_toml, agents_dir, spawn_app};

/// An app on the mock with `[model]` settings from `model_toml`; agent
/// `echoer` has the `echo` tool.
async fn app_with(model_toml: &str) -> (MockModel, TestApp, tempfile::TempDir) {
    let model = MockModel::start().await;
    let agents = agents_dir(&[("echoer.toml", &agent_toml("echoer", &["echo"], 3))]);
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .config_toml(&format!("[model]\n{model_toml}\n")),
    );
    (model, app, agents)
}

/// A streamed turn read to its end: its events as `(name, data)`.
async fn stream_turn(app: &TestApp, session: &str, content: &str) -> Vec<(String, Value)> {
    let response = app.post_streaming(session, content).await;
    assert_eq!(response.status(), StatusCode::OK);
    let text = tokio::time::timeout(Duration::from_secs(30), response.text())
        .await
        .expect("the stream ended in time")
        .expect("a stream body");
    sse_events(&text)
}

fn sse_events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter_map(|block| {
            let mut name = None;
            let mut data = None;
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).ok();
                }
            }
            Some((name?, data.unwrap_or(Value::Null)))
        })
        .collect()
}

fn last_event(events: &[(String, Value)]) -> (&str, &Value) {
    let (name, data) = events.last().expect("at least one event");
    (name.as_str(), data)
}

async fn history(app: &TestApp, session: &str) -> Vec<Value> {
    let (status, page) = app.get(&format!("/v1/sessions/{session}/messages")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page["messages"].as_array().expect("messages").clone()
}

#[tokio::test]
async fn a_reply_over_max_reply_bytes_is_refused_and_never_stored_by_the_real_binary() {
    let model = MockModel::start().await;
    let data = tempfile::tempdir().unwrap();
    let agents = agents_dir(&[("echoer.toml", &agent_toml("echoer", &["echo"], 3))]);
    let server = Server::start(
        &data.path().join("data"),
        agents.path(),
        &model.base_url(),
        &[("CADRE_MODEL_MAX_REPLY_BYTES", "65536")],
    );
    let client = server.client();
    let session = client.session("echoer").await;
    let huge = "x".repeat(100_000);
    // Not retried: one scripted reply per path.
    model.push(Reply::text(&huge));
    let (status, body) = client.say(&session, "hi").await;
    let shown: String = body.to_string().chars().take(300).collect();
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{shown}");
    assert_eq!(body["error"]["code"], "MODEL_BAD_RESPONSE", "{shown}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_reply_bytes"),
        "{body}"
    );

    model.push(Reply::text(&huge));
    let response = client.post_streaming(&session, "again").await;
    let events = sse_events(&response.text().await.unwrap());
    let (name, data) = last_event(&events);
    assert_eq!(name, "turn_failed", "{events:?}");
    assert_eq!(data["error"]["code"], "MODEL_BAD_RESPONSE", "{data}");
    assert_eq!(model.request_count(), 2);

    let (_, page) = client
        .get(&format!("/v1/sessions/{session}/messages"))
        .await;
    let stored = page.to_string();
    assert!(!stored.contains(&"x".repeat(1000)), "the reply was stored");
}

#[tokio::test]
async fn tool_calls_over_max_tool_calls_are_neither_run_nor_stored() {
    let (model, app, _agents) = app_with("max_tool_calls = 3").await;
    for streamed in [false, true] {
        let session = app.session("echoer").await;
        model.push(Reply::many_tool_calls(
            500,
            "echo",
            r#"{"message":"again"}"#,
        ));
        model.push(Reply::text("done"));
        let calls = if streamed {
            let events = stream_turn(&app, &session, "go").await;
            let (name, outcome) = last_event(&events);
            assert_eq!(name, "turn_completed", "{events:?}");
            outcome["tool_calls"].as_array().unwrap().len()
        } else {
            let (status, outcome) = app.say(&session, "go").await;
            assert_eq!(status, StatusCode::OK, "{outcome}");
            outcome["tool_calls"].as_array().unwrap().len()
        };
        assert_eq!(calls, 3, "streamed: {streamed}");
        // user, assistant with 3 calls, 3 results, the answer.
        let messages = history(&app, &session).await;
        assert_eq!(messages.len(), 6, "streamed: {streamed}: {messages:?}");
        let asked = model.requests().last().unwrap()["messages"].clone();
        let results = asked
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .count();
        assert_eq!(results, 3, "streamed: {streamed}");
    }
}

#[tokio::test]
async fn an_endpoint_error_text_is_passed_on_capped() {
    let (model, app, _agents) = app_with("").await;
    let session = app.session("echoer").await;
    model.push(Reply::error(
        400,
        "invalid_request_error",
        &"e".repeat(200_000),
    ));
    let (status, body) = app.say(&session, "hi").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["error"]["code"], "MODEL_REJECTED");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.len() < 1300, "{} bytes", message.len());
}

#[tokio::test]
async fn a_cut_reply_is_a_bad_response_retried_like_a_5xx_streamed_or_not() {
    let (model, app, _agents) = app_with("").await;
    let session = app.session("echoer").await;

    // Cut before any text: retried, and the retry answers.
    model.push(Reply::cut(Reply::tool_call(
        "c1",
        "echo",
        r#"{"message":"x"}"#,
    )));
    model.push(Reply::text("whole"));
    let events = stream_turn(&app, &session, "one").await;
    let (name, outcome) = last_event(&events);
    assert_eq!(name, "turn_completed", "{events:?}");
    assert_eq!(outcome["answer"], "whole");

    // Cut on every attempt (max_retries = 2): a bad response, both paths.
    for _ in 0..3 {
        model.push(Reply::cut(Reply::tool_call("c1", "echo", "{}")));
    }
    let events = stream_turn(&app, &session, "two").await;
    let (name, data) = last_event(&events);
    assert_eq!(name, "turn_failed", "{events:?}");
    assert_eq!(data["error"]["code"], "MODEL_BAD_RESPONSE", "{data}");

    for _ in 0..3 {
        model.push(Reply::cut(Reply::text("half of a reply")));
    }
    let (status, body) = app.say(&session, "three").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["error"]["code"], "MODEL_BAD_RESPONSE", "{body}");

    // Cut after text went out: not retried (it would repeat the text), and
    // the cut text is not stored as an answer.
    model.push(Reply::cut(Reply::text("a partial answer")));
    let events = stream_turn(&app, &session, "four").await;
    let (name, data) = last_event(&events);
    assert_eq!(name, "turn_failed", "{events:?}");
    assert_eq!(data["error"]["code"], "MODEL_BAD_RESPONSE", "{data}");
    let messages = history(&app, &session).await;
    assert!(
        !messages.iter().any(|m| m["content"] == "a partial answer"),
        "{messages:?}"
    );
    assert_eq!(model.remaining(), 0);
    assert_eq!(model.overruns(), 0);
}

#[tokio::test]
async fn length_and_content_filter_say_so_in_the_reply() {
    let (model, app, _agents) = app_with("").await;
    let session = app.session("echoer").await;
    model.push(Reply::with_finish_reason(
        "length",
        Reply::text("cut at max_to"),
    ));
    let (status, outcome) = app.say(&session, "long").await;
    assert_eq!(status, StatusCode::OK, "{outcome}");
    assert_eq!(outcome["finish_reason"], "length");

    model.push(Reply::with_finish_reason("content_filter", Reply::text("")));
    let events = stream_turn(&app, &session, "filtered").await;
    let (name, outcome) = last_event(&events);
    assert_eq!(name, "turn_completed", "{events:?}");
    assert_eq!(outcome["finish_reason"], "content_filter");

    model.push(Reply::text("plain"));
    let (_, outcome) = app.say(&session, "plain").await;
    assert_eq!(outcome["finish_reason"], "stop");
}

#[tokio::test]
async fn odd_usage_and_an_unknown_finish_reason_do_not_spoil_a_good_reply() {
    let (model, app, _agents) = app_with("").await;
    let session = app.session("echoer").await;
    let odd = [
        json!(-5),
        json!(9_223_372_036_854_775_808_u64),
        json!(1.5),
        json!("12"),
    ];
    for value in odd {
        for streamed in [false, true] {
            model.push(Reply::with_raw_usage(
                value.clone(),
                value.clone(),
                Reply::text("fine"),
            ));
            let outcome = if streamed {
                let events = stream_turn(&app, &session, "hi").await;
                let (name, outcome) = last_event(&events);
                assert_eq!(name, "turn_completed", "{value}: {events:?}");
                outcome.clone()
            } else {
                let (status, outcome) = app.say(&session, "hi").await;
                assert_eq!(status, StatusCode::OK, "{value}: {outcome}");
                outcome
            };
            assert_eq!(outcome["answer"], "fine", "{value}");
        }
    }
    model.push(Reply::with_finish_reason(
        "weird_new_reason",
        Reply::text("fine"),
    ));
    let (status, outcome) = app.say(&session, "hi").await;
    assert_eq!(status, StatusCode::OK, "{outcome}");
    assert_eq!(outcome["finish_reason"], "weird_new_reason");
}

#[tokio::test]
async fn invalid_utf8_is_a_bad_response_streamed_or_not() {
    let (model, app, _agents) = app_with("").await;
    let session = app.session("echoer").await;
    model.push(Reply::invalid_utf8());
    let (status, body) = app.say(&session, "hi").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["error"]["code"], "MODEL_BAD_RESPONSE", "{body}");
    let plain = body["error"]["message"].as_str().unwrap().to_string();

    model.push(Reply::invalid_utf8());
    let events = stream_turn(&app, &session, "hi").await;
    let (name, data) = last_event(&events);
    assert_eq!(name, "turn_failed", "{events:?}");
    assert_eq!(data["error"]["code"], "MODEL_BAD_RESPONSE", "{data}");
    assert_eq!(data["error"]["message"], plain.as_str());
    // Neither is retried.
    assert_eq!(model.request_count(), 2);
}

#[tokio::test]
async fn a_hanging_or_trickling_endpoint_is_cut_at_the_turn_budget() {
    // Each attempt may take 10 s and 2 retries follow: 30 s without the budget.
    let (model, app, _agents) = app_with("turn_timeout_s = 1").await;
    let session = app.session("echoer").await;
    model.push(Reply::slow(Duration::from_secs(60), Reply::text("late")));
    let started = Instant::now();
    let (status, body) = app.say(&session, "hi").await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert_eq!(body["error"]["code"], "MODEL_TIMEOUT", "{body}");
    assert!(started.elapsed() < Duration::from_secs(5));

    model.push(Reply::trickle("t", Duration::from_millis(50)));
    let started = Instant::now();
    let events = stream_turn(&app, &session, "hi").await;
    let (name, data) = last_event(&events);
    assert_eq!(name, "turn_failed", "{events:?}");
    assert_eq!(data["error"]["code"], "MODEL_TIMEOUT", "{data}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_history_the_endpoint_refuses_as_too_large_is_summarised_and_the_turn_answered() {
    let (model, app, _agents) = app_with("").await;
    model.set_max_request_bytes(Some(20_000));
    let session = app.session("echoer").await;
    model.push(Reply::text(&"a".repeat(12_000)));
    model.push(Reply::text(&"b".repeat(12_000)));
    // Turn 3 is refused (24 KB of history); the summary, then the retry.
    // The summary is 40 KB: kept to 16 KiB, it leaves the retry room.
    model.push(Reply::text(&format!(
        "the user asked twice; long answers were given {}",
        "s".repeat(40_000)
    )));
    model.push(Reply::text("answer three"));
    for content in ["one", "two"] {
        let (status, body) = app.say(&session, content).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let (status, body) = app.say(&session, "three").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answer"], "answer three");
    assert_eq!(model.refusals().len(), 1);
    let requests = model.requests();
    let retry = requests.last().unwrap().to_string();
    assert!(
        !retry.contains(&"a".repeat(600)),
        "the retry still sent the history"
    );
    assert!(retry.contains("long answers were given"));
    // The next turn starts from the summary too.
    model.push(Reply::text("answer four"));
    let (status, body) = app.say(&session, "four").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(model.refusals().len(), 1);
}

/// A client that reads nothing while the model writes 24 MB cannot make
/// cadre hold the stream for it: the turn's log keeps 1 MiB of events
/// (`http::turn_log`), so the client, once it reads, gets what the
/// sockets held, a `lagged` event saying how many it missed, then the
/// turn's end with the whole answer; the turn completed and is stored.
#[tokio::test]
async fn a_client_that_does_not_read_misses_deltas_is_told_and_gets_the_end() {
    let (model, app, _agents) = app_with("max_reply_bytes = 67108864").await;
    let session = app.session("echoer").await;
    // 24 MB of text in 4 KiB deltas: more than loopback's socket buffers
    // and the turn log's bound together.
    let (piece, count) = ("z".repeat(4096), 6000);
    model.push(Reply::deltas(&piece, count));
    let response = app.post_streaming(&session, "talk").await;
    assert_eq!(response.status(), StatusCode::OK);
    // The client reads nothing until the turn is stored.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let messages = history(&app, &session).await;
        if messages.iter().any(|m| m["role"] == "assistant") {
            break;
        }
        assert!(Instant::now() < deadline, "the turn did not complete");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut body = response.bytes_stream();
    let (mut received, mut lagged, mut deltas) = (0usize, false, 0usize);
    let (mut carry, mut tail) = (Vec::new(), Vec::new());
    let read = async {
        while let Some(chunk) = body.next().await {
            let Ok(chunk) = chunk else { break };
            received += chunk.len();
            carry.extend_from_slice(&chunk);
            let text = String::from_utf8_lossy(&carry);
            lagged |= text.contains("event: lagged");
            deltas += text.matches("event: model_delta").count();
            // Keep less than a marker: one split between two chunks is
            // found, none is counted twice.
            let keep = carry.len().saturating_sub(12);
            carry.drain(..keep);
            tail.extend_from_slice(&chunk);
            let keep = tail.len().saturating_sub(4096);
            tail.drain(..keep);
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("the stream ended");
    let tail = String::from_utf8_lossy(&tail);
    assert!(lagged, "the client was not told it missed events");
    assert!(
        deltas < count,
        "a lagging client got every delta ({deltas})"
    );
    assert!(
        tail.contains("\"finish_reason\":\"stop\""),
        "the stream did not end with the turn's end: {tail}"
    );
    // Every delta and the answer would be twice the text.
    assert!(received < 2 * piece.len() * count, "{received} bytes");
}

/// Issue #29 (11): a tool call id over 256 bytes, or one id twice in a
/// reply, makes the reply `MODEL_BAD_RESPONSE`: nothing of it runs or is
/// stored (a 3 MB id was stored with every message and record of the call;
/// two held orders under one id were both filled by one approval).
#[tokio::test]
async fn long_or_repeated_tool_call_ids_are_a_bad_response_and_nothing_runs() {
    let (model, app, _agents) = app_with("").await;
    let session = app.session("echoer").await;
    let long = "i".repeat(257);
    model.push(Reply::tool_call(&long, "echo", r#"{"message":"long"}"#));
    let (status, body) = app.say(&session, "one").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["error"]["code"], "MODEL_BAD_RESPONSE", "{body}");

    model.push(Reply::tool_calls(&[
        ("dup", "echo", r#"{"message":"first"}"#),
        ("dup", "echo", r#"{"message":"second"}"#),
    ]));
    let (status, body) = app.say(&session, "two").await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["error"]["code"], "MODEL_BAD_RESPONSE", "{body}");

    let (status, calls) = app
        .client
        .get(&format!("/v1/calls?conversation_id={session}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{calls}");
    assert_eq!(calls["calls"].as_array().map(Vec::len), Some(0), "{calls}");
    let stored = history(&app, &session).await.to_vec();
    let text = serde_json::to_string(&stored).unwrap();
    assert!(!text.contains(&long) && !text.contains("\"dup\""), "{text}");

    // An id of 256 bytes is fine.
    let fits = "f".repeat(256);
    model.push(Reply::tool_call(&fits, "echo", r#"{"message":"fits"}"#));
    model.push(Reply::text("done"));
    let (status, body) = app.say(&session, "three").await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// Issue #29 (10): a model endpoint's redirect is not followed: a 307 to
/// another origin would re-send the whole prompt there, a 303 would make
/// cadre GET what the endpoint names. The turn fails `MODEL_REJECTED`
/// naming the redirect, and the other origin gets nothing.
#[tokio::test]
async fn a_model_endpoints_redirect_is_not_followed() {
    let elsewhere = MockModel::start().await;
    elsewhere.set_default(Some(Reply::text("you were redirected")));
    for status in [307u16, 303, 301] {
        let target = format!("{}/chat/completions", elsewhere.base_url());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let redirector = tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let target = target.clone();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = vec![0u8; 1 << 16];
                    let _ = socket.read(&mut buf).await;
                    let answer = format!(
                        "HTTP/1.1 {status} Moved\r\nLocation: {target}\r\n\
                         Content-Length: 0\r\nConnection: close\r\n\r\n"
                    );
                    let _ = socket.write_all(answer.as_bytes()).await;
                });
            }
        });
        let agents = agents_dir(&[("echoer.toml", &agent_toml("echoer", &["echo"], 3))]);
        let app = spawn_app(AppOptions {
            model_url: Some(format!("http://{addr}/v1")),
            ..AppOptions::offline().agents(agents.path())
        });
        let session = app.session("echoer").await;
        let (code, body) = app.say(&session, "hi").await;
        assert_eq!(code, StatusCode::BAD_GATEWAY, "{status}: {body}");
        assert_eq!(body["error"]["code"], "MODEL_REJECTED", "{status}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("redirect")),
            "{body}"
        );
        redirector.abort();
    }
    assert_eq!(elsewhere.request_count(), 0, "a redirect was followed");
}

/// Tool-call arguments nested 126 deep (valid JSON under serde_json's
/// limit of 128): the call fails as a validation error, and nothing of it
/// poisons the session's or the tenant's reads, before and after a
/// restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_tool_arguments_fail_the_call_and_every_read_still_answers() {
    let model = MockModel::start().await;
    let data = tempfile::tempdir().unwrap();
    let agents = agents_dir(&[("echoer.toml", &agent_toml("echoer", &["echo"], 3))]);
    let deep = format!("{}1{}", "[".repeat(126), "]".repeat(126));
    let args = format!(r#"{{"message":"hi","x":{deep}}}"#);
    let server = Server::start(data.path(), agents.path(), &model.base_url(), &[]);
    let client = server.client();
    let (status, session) = client
        .post("/v1/sessions", &json!({"agent": "echoer"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{session}");
    let id = session["id"].as_str().unwrap().to_owned();
    model.push(Reply::tool_call("d1", "echo", &args));
    model.push(Reply::text("done"));
    let (status, turn) = client
        .post(
            &format!("/v1/sessions/{id}/messages"),
            &json!({"content": "go"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{turn}");
    assert_eq!(
        turn["tool_calls"][0]["error_type"], "VALIDATION_ERROR",
        "{turn}"
    );

    let reads = |client: support::Client, id: String| async move {
        for path in [
            format!("/v1/sessions/{id}/messages"),
            format!("/v1/sessions/{id}/turns"),
            format!("/v1/sessions/{id}/summary"),
            format!("/v1/sessions/{id}/export"),
            "/v1/calls".to_owned(),
            format!("/v1/calls?conversation_id={id}"),
        ] {
            let (status, body) = client.get(&path).await;
            assert_eq!(status, StatusCode::OK, "{path}: {body}");
        }
    };
    reads(client.clone(), id.clone()).await;
    drop(server);

    // After a restart the session still takes turns and answers its reads.
    let server = Server::start(data.path(), agents.path(), &model.base_url(), &[]);
    let client = server.client();
    reads(client.clone(), id.clone()).await;
    model.push(Reply::text("still here"));
    let (status, turn) = client
        .post(
            &format!("/v1/sessions/{id}/messages"),
            &json!({"content": "again"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{turn}");
    let (status, body) = client.delete(&format!("/v1/sessions/{id}")).await;
    assert!(status.is_success(), "{status} {body}");
}
