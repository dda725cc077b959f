//! Resumable streams (issue #32): every frame of a turn's stream has an
//! `id:`; a client that lost the stream reconnects to `GET
//! /v1/sessions/{id}/turns/{turn_id}/events` with `Last-Event-ID` and gets
//! every later event exactly once, then the live ones; a reconnect after
//! the last event is 204 (an EventSource stops); a finished workflow
//! run's stream does the same. One client is `httpx-sse` (Python, from
//! `tests/clients/requirements.txt`), reconnecting mid-turn.

mod support;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::gate::gate_tool;
use support::mock_model::{MockModel, Reply};
use support::sse::{ids, read_until};
use support::{AppOptions, TestApp, agent_toml, agents_dir, spawn_app};

fn gated_app() -> (TestApp, MockModel, support::gate::Gate, tempfile::TempDir) {
    let model = futures::executor::block_on(MockModel::start());
    let agents = agents_dir(&[("gated.toml", &agent_toml("gated", &["gate"], 5))]);
    let (def, handler, gate) = gate_tool("gate", "test");
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .tool(def, handler),
    );
    (app, model, gate, agents)
}

async fn events_of(
    app: &TestApp,
    session: &str,
    turn: &str,
    last: Option<&str>,
) -> reqwest::Response {
    let mut request = app.client.request(
        reqwest::Method::GET,
        &format!("/v1/sessions/{session}/turns/{turn}/events"),
    );
    if let Some(last) = last {
        request = request.header("last-event-id", last);
    }
    request.send().await.expect("request sent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_lost_the_stream_mid_turn_resumes_with_last_event_id_and_misses_nothing() {
    let (app, model, mut gate, _agents) = gated_app();
    let session = app.session("gated").await;
    model.push(Reply::tool_call("c1", "gate", r#"{"label":"held"}"#));
    model.push(Reply::deltas("word ", 40));
    let response = app
        .client
        .request(
            reqwest::Method::POST,
            &format!("/v1/sessions/{session}/messages/stream"),
        )
        .json(&json!({"content": "go"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // Read up to the tool call, then lose the connection.
    let (first, _) = read_until(response, |f| f.name == "tool_call_started").await;
    assert_eq!(gate.started().await, "held");
    let turn = first
        .iter()
        .find(|f| f.name == "turn_started")
        .expect("turn_started")
        .data["turn_id"]
        .as_str()
        .unwrap()
        .to_string();
    let last = first
        .last()
        .unwrap()
        .id
        .clone()
        .expect("every frame has an id");
    assert_eq!(ids(&first), vec!["0", "1"], "{first:?}");

    // The turn goes on without the client.
    gate.open_one();
    let resumed = events_of(&app, &session, &turn, Some(&last)).await;
    assert_eq!(resumed.status(), StatusCode::OK);
    let (rest, _) = read_until(resumed, |_| false).await;
    let names: Vec<&str> = rest.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names.first(), Some(&"tool_call_completed"), "{names:?}");
    assert_eq!(names.last(), Some(&"turn_completed"), "{names:?}");
    // Exactly once: ids 2, 3, ... with none missing or repeated.
    let numbers: Vec<u64> = ids(&rest)
        .iter()
        .map(|id| id.trim_end_matches(".end").parse().unwrap())
        .collect();
    assert_eq!(numbers, (2..2 + rest.len() as u64).collect::<Vec<_>>());
    let text: String = rest
        .iter()
        .filter(|f| f.name == "model_delta")
        .map(|f| f.data["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "word ".repeat(40));
    let end = rest.last().unwrap().id.clone().unwrap();
    assert!(end.ends_with(".end"), "{end}");

    // A reconnect after the end is 204: an EventSource stops there.
    let after_end = events_of(&app, &session, &turn, Some(&end)).await;
    assert_eq!(after_end.status(), StatusCode::NO_CONTENT);
    // From the start, the whole turn again, in order.
    let (all, _) = read_until(events_of(&app, &session, &turn, None).await, |_| false).await;
    assert_eq!(all.len(), first.len() + rest.len());
    // `?after=` is the same position as the header.
    let (tail, _) = read_until(
        app.client
            .request(
                reqwest::Method::GET,
                &format!("/v1/sessions/{session}/turns/{turn}/events?after={last}"),
            )
            .send()
            .await
            .unwrap(),
        |_| false,
    )
    .await;
    assert_eq!(ids(&tail), ids(&rest));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_turn_is_followed_from_its_first_event() {
    let (app, model, mut gate, _agents) = gated_app();
    let session = app.session("gated").await;
    model.push(Reply::tool_call("c1", "gate", r#"{"label":"bg"}"#));
    model.push(Reply::text("done in the background"));
    let (status, body) = support::client::send(
        app.client
            .request(
                reqwest::Method::POST,
                &format!("/v1/sessions/{session}/messages"),
            )
            .header("prefer", "respond-async")
            .json(&json!({"content": "go"})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let turn = body["turn_id"].as_str().unwrap().to_string();
    assert_eq!(gate.started().await, "bg");
    let following = events_of(&app, &session, &turn, None).await;
    gate.open_one();
    let (frames, _) = read_until(following, |_| false).await;
    let names: Vec<&str> = frames.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names.first(), Some(&"turn_started"), "{names:?}");
    assert_eq!(names.last(), Some(&"turn_completed"), "{names:?}");
    assert_eq!(
        frames.last().unwrap().data["answer"],
        "done in the background"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_run_without_a_stream_is_answered_with_its_end_from_its_record() {
    let (app, model, _gate, _agents) = gated_app();
    let session = app.session("gated").await;
    model.push(Reply::text("plain answer"));
    let (status, body) = app.say(&session, "hello").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let turn = body["turn_id"].as_str().unwrap();
    let (frames, _) = read_until(events_of(&app, &session, turn, None).await, |_| false).await;
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(frames[0].name, "turn_completed");
    assert_eq!(frames[0].id.as_deref(), Some("0.end"));
    assert_eq!(frames[0].data["answer"], "plain answer");
    let again = events_of(&app, &session, turn, Some("0.end")).await;
    assert_eq!(again.status(), StatusCode::NO_CONTENT);
    // Another session's turn, or no such turn: 404.
    let other = app.session("gated").await;
    let (status, _) = support::client::send(app.client.request(
        reqwest::Method::GET,
        &format!("/v1/sessions/{other}/turns/{turn}/events"),
    ))
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn httpx_sse_reconnects_mid_turn_with_last_event_id_and_gets_the_rest_once() {
    let (app, model, _gate, _agents) = gated_app();
    let session = app.session("gated").await;
    model.push(Reply::deltas("piece ", 200));
    let script = r#"
import json, sys, httpx
from httpx_sse import connect_sse
base, session = sys.argv[1], sys.argv[2]
seen = []
with httpx.Client(base_url=base, timeout=20) as client:
    with connect_sse(client, "POST", f"/v1/sessions/{session}/messages/stream", json={"content": "go"}) as source:
        turn = None
        for event in source.iter_sse():
            seen.append([event.id, event.event, json.loads(event.data)])
            if event.event == "turn_started":
                turn = seen[-1][2]["turn_id"]
            if len(seen) == 5:
                break  # the connection is lost here
    last = seen[-1][0]
    with connect_sse(client, "GET", f"/v1/sessions/{session}/turns/{turn}/events",
                     headers={"Last-Event-ID": last}) as source:
        if "json" in source.response.headers.get("content-type", ""):
            source.response.read()
            sys.exit(f"the reconnect was answered {source.response.status_code}: {source.response.text}")
        for event in source.iter_sse():
            seen.append([event.id, event.event, json.loads(event.data)])
    end = seen[-1][0]
    again = client.get(f"/v1/sessions/{session}/turns/{turn}/events", headers={"Last-Event-ID": end})
print(json.dumps({"seen": seen, "after_end": again.status_code}))
"#;
    let out = support::clients::python_ok(script, &[&app.base, &session], &[]).await;
    let report: Value = serde_json::from_str(out.trim()).expect("the script's JSON");
    let seen = report["seen"].as_array().unwrap();
    let numbers: Vec<u64> = seen
        .iter()
        .map(|e| {
            e[0].as_str()
                .unwrap()
                .trim_end_matches(".end")
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(
        numbers,
        (0..seen.len() as u64).collect::<Vec<_>>(),
        "{seen:?}"
    );
    let text: String = seen
        .iter()
        .filter(|e| e[1] == "model_delta")
        .map(|e| e[2]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, "piece ".repeat(200));
    assert_eq!(seen.last().unwrap()[1], "turn_completed");
    assert_eq!(report["after_end"], 204);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_workflow_runs_stream_has_ids_and_a_reconnect_is_204() {
    let model = MockModel::start().await;
    let agents = support::workflow::agents_with(
        &[],
        &[(
            "one.toml",
            "name = \"one\"\n[[nodes]]\nid = \"a\"\ntool = \"gate\"\nparams = { label = \"wf\" }\n",
        )],
    );
    let (def, handler, gate) = gate_tool("gate", "custom");
    gate.open(1);
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .tool(def, handler),
    );
    let run = support::workflow::run_to_end(&app, "one", json!({})).await;
    let id = run["id"].as_str().unwrap();
    let path = format!("/v1/workflows/runs/{id}/events");
    let response = app
        .client
        .request(reqwest::Method::GET, &path)
        .send()
        .await
        .unwrap();
    let (frames, _) = read_until(response, |_| false).await;
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(frames[0].name, "snapshot");
    assert_eq!(frames[0].id.as_deref(), Some("0.end"));
    let again = app
        .client
        .request(reqwest::Method::GET, &path)
        .header("last-event-id", "0.end")
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::NO_CONTENT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_events_resume_after_last_event_id_once() {
    let (app, _model, gate, _agents) = gated_app();
    gate.open(100);
    let invoke = |label: &'static str| {
        let client = app.client.clone();
        async move {
            let (status, body) = client
                .post(
                    "/v1/tools/gate/invoke",
                    &json!({"params": {"label": label}}),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
    };
    let subscribe = |last: Option<String>| {
        let mut request = app.client.request(reqwest::Method::GET, "/v1/events");
        if let Some(last) = last {
            request = request.header("last-event-id", last);
        }
        request.send()
    };
    let first = subscribe(None).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    invoke("one").await;
    // Two events of the first call (started, completed), then the stream is lost.
    let mut seen = 0;
    let (frames, _) = read_until(first, |_| {
        seen += 1;
        seen == 2
    })
    .await;
    let last = frames.last().unwrap().id.clone().expect("an id");
    invoke("two").await;
    invoke("three").await;
    let resumed = subscribe(Some(last.clone())).await.unwrap();
    // The four events of the two calls made while away, then nothing more.
    let mut count = 0;
    let (rest, _) = read_until(resumed, |_| {
        count += 1;
        count == 4
    })
    .await;
    let (boot, n) = last.rsplit_once('-').unwrap();
    let n: u64 = n.parse().unwrap();
    let expected: Vec<String> = (n + 1..n + 5).map(|i| format!("{boot}-{i}")).collect();
    assert_eq!(ids(&rest), expected, "{rest:?}");
    assert!(
        rest.iter().all(|f| f.name.starts_with("execution_")),
        "{rest:?}"
    );
}

/// A `Last-Event-ID` at the top of the id space (an attacker's, or a
/// corrupted one) is answered, not a panic: the turn's end, numbered as
/// far as ids go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_event_id_at_the_end_of_the_id_space_is_answered() {
    let (app, model, _gate, _agents) = gated_app();
    let session = app.session("gated").await;
    model.push(Reply::text("plain answer"));
    let (status, body) = app.say(&session, "hello").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let turn = body["turn_id"].as_str().unwrap();
    let response = events_of(&app, &session, turn, Some(&u64::MAX.to_string())).await;
    assert_eq!(response.status(), StatusCode::OK);
    let (frames, _) = read_until(response, |_| false).await;
    assert_eq!(frames.len(), 1, "{frames:?}");
    assert_eq!(frames[0].name, "turn_completed");
    assert_eq!(frames[0].id.as_deref(), Some(&*format!("{}.end", u64::MAX)));
}
