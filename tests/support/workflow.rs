//! Workflow test helpers shared by `tests/workflows.rs` and
//! `tests/workflow_limits.rs`: an agents folder with workflow files, and
//! runs started, awaited and read over the real HTTP API.

use std::time::Duration;

use cadre::workflow::{WorkflowRun, Workflows};
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::TestApp;

/// How long a run may take before a test gives up on it.
pub const RUN_PATIENCE: Duration = Duration::from_secs(20);

/// An agents folder with these agent files and `workflows/` files.
pub fn agents_with(agents: &[(&str, &str)], workflows: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir(dir.path().join("workflows")).expect("workflows dir");
    for (name, text) in agents {
        std::fs::write(dir.path().join(name), text).expect("write agent");
    }
    for (name, text) in workflows {
        std::fs::write(dir.path().join("workflows").join(name), text).expect("write workflow");
    }
    dir
}

/// The app's workflow engine (for `wait` and `subscribe`).
pub fn workflows(app: &TestApp) -> Workflows {
    app.runtime
        .as_ref()
        .expect("the app is running")
        .workflows()
        .clone()
}

/// Starts a run over HTTP with `wait: true`; returns the finished run.
pub async fn run_to_end(app: &TestApp, workflow: &str, input: Value) -> Value {
    let (status, body) = tokio::time::timeout(
        RUN_PATIENCE,
        app.post(
            &format!("/v1/workflows/{workflow}/runs"),
            &json!({ "input": input, "wait": true }),
        ),
    )
    .await
    .expect("the run finished in time");
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body
}

/// The run once it is over (through the library's watch, no polling).
pub async fn finished(app: &TestApp, id: &str) -> WorkflowRun {
    tokio::time::timeout(RUN_PATIENCE, workflows(app).wait(id))
        .await
        .expect("the run finished in time")
        .expect("the run exists")
}

/// `GET /v1/workflows/runs/{id}`, which must answer 200.
pub async fn get_run(app: &TestApp, id: &str) -> Value {
    let (status, body) = app.get(&format!("/v1/workflows/runs/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}
