//! Workflows over HTTP: definitions, runs, resume, node events.
//!
//! - `GET /v1/workflows`: the live definitions and the files that did not
//!   load (`errors`, with file and reason);
//! - `GET /v1/workflows/{name}`: one definition;
//! - `POST /v1/workflows/{name}/runs` `{input, wait?, user_id?}`: 201 with
//!   the run; with `wait: true` the answer comes when the run is over (its
//!   status then says how it went: a failed run is still a 201, the run
//!   was created). Input that fails the workflow's schema is a 422 whose
//!   `details.validation_errors` lists `{field, code, message}`;
//! - `GET /v1/workflows/runs` (`?workflow=&limit=`, newest first) and
//!   `GET /v1/workflows/runs/{id}`: runs with per-node status, output,
//!   error, attempts and times;
//! - `POST /v1/workflows/runs/{id}/resume` (`?wait=true`): re-runs what did
//!   not succeed of a failed or interrupted run; 409 for a run that is
//!   running or succeeded;
//! - `GET /v1/workflows/runs/{id}/events`: SSE. First a `snapshot` event
//!   (the run as it is), then one event per change (`node_started`,
//!   `node_succeeded`, `node_failed`, `node_skipped`, `item_*`,
//!   `run_finished`); the stream ends after `run_finished` (at once if the
//!   run was already over). The calls of a run: `GET /v1/calls?workflow_id=`.
//!
//! Definitions are shared; runs belong to the caller's tenant: a run is
//! started as the caller's tenant (its calls and agent sessions are that
//! tenant's), and another tenant's run is answered 404 like a missing one.

use std::convert::Infallible;
use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use super::AppState;
use super::error::{ApiError, ApiJson};
use crate::tenants::Principal;
use crate::workflow::{RunFilter, StartRun, WorkflowError, WorkflowEventKind, WorkflowRun};

pub const DEFAULT_LIMIT: usize = 50;
pub const MAX_LIMIT: usize = 1_000;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/workflows", get(list_definitions))
        .route("/v1/workflows/runs", get(list_runs))
        .route("/v1/workflows/runs/{id}", get(show_run))
        .route("/v1/workflows/runs/{id}/resume", post(resume))
        .route("/v1/workflows/runs/{id}/events", get(events))
        .route("/v1/workflows/{name}", get(show_definition))
        .route("/v1/workflows/{name}/runs", post(start))
}

impl From<WorkflowError> for ApiError {
    fn from(e: WorkflowError) -> Self {
        match e {
            WorkflowError::NotFound { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "WORKFLOW_NOT_FOUND", e.to_string())
            }
            WorkflowError::RunNotFound { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "RUN_NOT_FOUND", e.to_string())
            }
            WorkflowError::InvalidInput { ref errors, .. } => {
                let details = json!({ "validation_errors": errors });
                ApiError::validation(e.to_string()).with_details(details)
            }
            WorkflowError::NotResumable { .. } => {
                ApiError::new(StatusCode::CONFLICT, "RUN_NOT_RESUMABLE", e.to_string())
            }
            WorkflowError::ShuttingDown => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "SHUTTING_DOWN",
                e.to_string(),
            ),
            WorkflowError::Store(s) => s.into(),
        }
    }
}

async fn list_definitions(State(state): State<AppState>) -> Json<Value> {
    let workflows: Vec<Value> = state
        .workflows
        .definitions()
        .iter()
        .map(|w| w.to_json())
        .collect();
    Json(json!({
        "workflows": workflows,
        "errors": state.workflows.load_errors(),
    }))
}

async fn show_definition(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let w = state
        .workflows
        .definition(&name)
        .ok_or(WorkflowError::NotFound { name })?;
    Ok(Json(w.to_json()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StartBody {
    #[serde(default)]
    input: Value,
    #[serde(default)]
    wait: bool,
    user_id: Option<String>,
}

/// The run, if the caller's tenant owns it; else "not found".
async fn owned(state: &AppState, caller: &Principal, id: &str) -> Result<WorkflowRun, ApiError> {
    let run = state.workflows.get(id).await?;
    if run.tenant != caller.tenant {
        return Err(WorkflowError::RunNotFound { id: id.into() }.into());
    }
    Ok(run)
}

async fn start(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<StartBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let run = state
        .workflows
        .start(
            &name,
            StartRun {
                input: body.input,
                tenant: caller.tenant,
                user_id: body.user_id,
            },
        )
        .await?;
    let run = if body.wait {
        state.workflows.wait(&run.id).await?
    } else {
        run
    };
    Ok((StatusCode::CREATED, Json(json!(run))))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    workflow: Option<String>,
    limit: Option<usize>,
}

async fn list_runs(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(ApiError::validation(format!(
            "limit must be between 1 and {MAX_LIMIT}"
        )));
    }
    let runs = state
        .workflows
        .list(RunFilter {
            workflow: q.workflow,
            tenant: Some(caller.tenant),
            limit,
        })
        .await?;
    Ok(Json(json!({ "runs": runs, "count": runs.len() })))
}

async fn show_run(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(owned(&state, &caller, &id).await?)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResumeQuery {
    #[serde(default)]
    wait: bool,
}

async fn resume(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
    Query(q): Query<ResumeQuery>,
) -> Result<Json<Value>, ApiError> {
    owned(&state, &caller, &id).await?;
    let run = state.workflows.resume(&id).await?;
    let run = if q.wait {
        state.workflows.wait(&run.id).await?
    } else {
        run
    };
    Ok(Json(json!(run)))
}

async fn events(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Extension(quota): Extension<super::streams::StreamQuota>,
    Path(id): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    // Subscribe before reading the snapshot, so nothing falls between them.
    let rx = state.workflows.subscribe();
    let run = owned(&state, &caller, &id).await?;
    let slot = quota.acquire()?;
    let over = run.status.is_terminal();
    let snapshot = SseEvent::default()
        .event("snapshot")
        .json_data(&run)
        .unwrap_or_else(|_| SseEvent::default().event("error"));
    let live = futures::stream::unfold((rx, id, over), |(mut rx, id, over)| async move {
        if over {
            return None;
        }
        loop {
            match rx.recv().await {
                Ok(event) if event.run_id == id => {
                    let last = matches!(event.kind, WorkflowEventKind::RunFinished { .. });
                    let sse = SseEvent::default()
                        .event(event.kind.name())
                        .json_data(&event)
                        .unwrap_or_else(|_| SseEvent::default().event("error"));
                    return Some((Ok(sse), (rx, id, last)));
                }
                Ok(_) => continue,
                Err(RecvError::Lagged(n)) => {
                    let sse = SseEvent::default()
                        .event("lagged")
                        .data(format!("{{\"missed\":{n}}}"));
                    return Some((Ok(sse), (rx, id, false)));
                }
                Err(RecvError::Closed) => return None,
            }
        }
    });
    let stream = futures::stream::once(async move { Ok(snapshot) }).chain(live);
    Ok(Sse::new(slot.hold_until_shutdown(stream))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}
