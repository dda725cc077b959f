//! OTLP export (feature `otlp`): the real `cadre serve` binary, with
//! `CADRE_OTLP_ENDPOINT` pointing at a tiny OTLP/HTTP collector on
//! loopback in this test, runs one tool-calling turn against the mock
//! model; once it stops on SIGTERM the collector must have received the
//! turn's spans (protobuf bodies on `POST /v1/traces`).
//!
//! Not part of the default `cargo test`: run it with
//! `cargo test --features otlp --test otlp`.
#![cfg(feature = "otlp")]

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::routing::post;
use support::{Client, MockModel, Reply, repo_agents};

type Bodies = Arc<Mutex<Vec<Bytes>>>;

/// A collector that keeps every export request's body and answers with an
/// empty `ExportTraceServiceResponse` (an empty protobuf message).
async fn collector() -> (String, Bodies) {
    let bodies: Bodies = Arc::default();
    let app = Router::new()
        .route(
            "/v1/traces",
            post(|State(b): State<Bodies>, body: Bytes| async move {
                b.lock().unwrap().push(body);
                (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }),
        )
        .with_state(bodies.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), bodies)
}

/// Whether the bytes hold `needle` (protobuf strings are stored as is).
fn holds(bodies: &[Bytes], needle: &str) -> bool {
    bodies
        .iter()
        .any(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_spans_reach_the_otlp_collector() {
    let (endpoint, bodies) = collector().await;
    let model = MockModel::start().await;
    model.push_all([
        Reply::tool_call("call_otlp_1", "calculator", r#"{"expression":"6*7"}"#),
        Reply::text("42"),
    ]);
    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cadre"))
        .args(["serve", "--addr", "127.0.0.1:0", "--agents"])
        .arg(repo_agents())
        .arg("--data-dir")
        .arg(data.path())
        .env("CADRE_OTLP_ENDPOINT", &endpoint)
        .env("CADRE_MODEL_BASE_URL", model.base_url())
        .env("CADRE_MODEL_API_KEY", "test-key")
        .env("CADRE_MODEL", "mock-model")
        .env("RUST_LOG", "info")
        .env_remove("OTEL_SERVICE_NAME")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("cadre serve starts");
    let stdout = child.stdout.take().unwrap();
    let base = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line.trim()
            .strip_prefix("cadre listening on ")
            .unwrap_or_else(|| panic!("the first line names the address: {line:?}"))
            .to_string()
    })
    .await
    .unwrap();

    let client = Client::new(&base);
    let id = client.session("assistant").await;
    let (status, reply) = client.say(&id, "What is 6*7?").await;
    assert_eq!(status, reqwest::StatusCode::OK, "{reply}");

    // SIGTERM: the server shuts down and the exporter flushes on the way out.
    let pid = child.id() as i32;
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("cadre did not stop on SIGTERM");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "cadre exited with {status}");

    let bodies = bodies.lock().unwrap().clone();
    assert!(!bodies.is_empty(), "the collector received no export");
    for needle in [
        "invoke_agent assistant",
        "chat mock-model",
        "tool_batch",
        "tool_call",
        "execute_tool calculator",
        "gen_ai.operation.name",
        "gen_ai.usage.input_tokens",
        "gen_ai.tool.call.id",
        "call_otlp_1",
        "cadre.session",
        id.as_str(),
        "service.name",
        "cadre",
    ] {
        assert!(holds(&bodies, needle), "{needle:?} in the exported spans");
    }
}
