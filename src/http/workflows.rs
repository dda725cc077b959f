//! Workflows over HTTP: definitions, runs, resume, node events.
//!
//! - `GET /v1/workflows`: the live definitions and the files that did not
//!   load (`errors`, with file and reason; admins only, and only an admin
//!   sees a definition's `file` as a server path, others its name);
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
//!   running, succeeded or cancelled;
//! - `POST /v1/workflows/runs/{id}/cancel`: stops a running or interrupted
//!   run and answers it as it ended (`cancelled`; running nodes and map
//!   elements `cancelled`, their late results discarded; `run_finished`
//!   with status `cancelled` on the events). Decision: a run already over
//!   is answered 200 as it is (succeeded, failed or cancelled), so the
//!   call is idempotent and a client reads from `status` whether its
//!   cancel stopped anything;
//! - `GET /v1/workflows/runs/{id}/events`: SSE. First a `snapshot` event
//!   (the run as it is), then one event per change (`node_started`,
//!   `node_succeeded`, `node_failed`, `node_skipped`, `item_*`,
//!   `run_finished`); the stream ends after `run_finished` (at once if the
//!   run was already over). The calls of a run: `GET /v1/calls?workflow_id=`.
//!   Reconnecting (issue #32): every event has an `id:` (`0` the snapshot,
//!   then `1`, `2`, ...; the last one `n.end`) and the stream opens with
//!   `retry: 2000`. Decision: a reconnect is answered by state, not by
//!   replaying events: it starts again with a fresh `snapshot` (the run
//!   as it is, which says everything the missed events said), and a
//!   reconnect (`Last-Event-ID` sent) to a run that is over is `204 No
//!   Content`, which stops an EventSource (before, a finished run's
//!   stream made it reconnect for ever).
//!
//! A start request carrying `x-cadre-parent-run` (HTTP tools send it when
//! a workflow run makes the call) starts a child of that run, one deeper;
//! past `[workflows] max_depth` it is refused 409 `WORKFLOW_DEPTH_EXCEEDED`.
//!
//! Definitions are shared; runs belong to the caller's tenant: a run is
//! started as the caller's tenant (its calls and agent sessions are that
//! tenant's), and another tenant's run is answered 404 like a missing one.

use std::time::Duration;

use axum::Extension;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiQuery};
use super::openapi::{Lagged, error_responses};
use super::tools::PlanName;
use crate::identity::{PARENT_RUN_HEADER, Plan, UserId};
use crate::tenants::Principal;
use crate::workflow::definition::OnError;
use crate::workflow::engine::LoadIssue;
use crate::workflow::{
    RunFilter, StartRun, WorkflowError, WorkflowEvent, WorkflowEventKind, WorkflowRun,
};

pub const DEFAULT_LIMIT: usize = 50;
pub const MAX_LIMIT: usize = 1_000;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_definitions))
        .routes(routes!(list_runs))
        .routes(routes!(show_run))
        .routes(routes!(resume))
        .routes(routes!(cancel))
        .routes(routes!(events))
        .routes(routes!(show_definition))
        .routes(routes!(start))
}

/// A workflow definition as the API shows it. Built as JSON by
/// [`crate::workflow::definition::Workflow::to_json`] (`cadre workflows`
/// prints the same); this type states its shape, and the contract tests
/// hold the body to it.
#[derive(ToSchema)]
#[allow(dead_code)]
struct Definition {
    name: String,
    description: String,
    /// The JSON Schema a run's `input` is checked against.
    input: std::collections::BTreeMap<String, Value>,
    on_error: OnError,
    #[schema(value_type = PlanName)]
    plan: Plan,
    /// In file order.
    nodes: Vec<DefinitionNode>,
    /// The definition's file: its path for an admin key, its name for others.
    file: String,
}

/// A node of a [`Definition`].
#[derive(ToSchema)]
#[allow(dead_code)]
struct DefinitionNode {
    id: String,
    /// `tool`, `agent` or `map`.
    #[schema(pattern = "^(tool|agent|map)$")]
    kind: String,
    /// The nodes it waits for.
    depends_on: Vec<String>,
    /// Tool (and map) nodes: the tool called.
    tool: Option<String>,
    /// Agent nodes: the agent asked.
    agent: Option<String>,
    /// Agent nodes that continue another node's session: that node.
    session: Option<String>,
    /// Map nodes: the template of the list fanned out over.
    map: Option<String>,
    /// Map nodes: how many elements run at once.
    max_parallel: Option<usize>,
    /// The condition the node runs under.
    when: Option<String>,
}

#[derive(Serialize, ToSchema)]
struct Definitions {
    #[schema(value_type = Vec<Definition>)]
    workflows: Vec<Value>,
    /// Files that did not load (admin keys only; empty for others).
    errors: Vec<LoadIssue>,
}

#[derive(Serialize, ToSchema)]
struct RunList {
    /// Newest first.
    runs: Vec<WorkflowRun>,
    /// How many runs this page holds.
    count: usize,
    /// The `cursor` of the next page; `null` on the last.
    next: Option<String>,
}

super::openapi::event_stream! {
    /// A run's events: `snapshot` (the run as it is) first, then one event
    /// per change; the stream ends after `run_finished` (at once if the run
    /// was already over).
    RunEvents {
        "snapshot" => WorkflowRun,
        "run_started" => WorkflowEvent,
        "node_started" => WorkflowEvent,
        "node_succeeded" => WorkflowEvent,
        "node_failed" => WorkflowEvent,
        "node_skipped" => WorkflowEvent,
        "item_started" => WorkflowEvent,
        "item_succeeded" => WorkflowEvent,
        "item_failed" => WorkflowEvent,
        "run_finished" => WorkflowEvent,
        "lagged" => Lagged,
    }
}

#[utoipa::path(
    get,
    path = "/v1/workflows",
    operation_id = "list_workflows",
    summary = "Workflow definitions and load errors",
    tag = "workflows",
    responses((status = 200, description = "The live definitions and the files that did not load", body = Definitions))
)]
async fn list_definitions(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
) -> Json<Definitions> {
    let workflows: Vec<Value> = state
        .workflows
        .definitions()
        .iter()
        .map(|w| shown(w.to_json(), &caller))
        .collect();
    // Load errors name server paths and say what is wrong with the
    // operator's files: an admin's business only.
    let errors = if caller.admin {
        state.workflows.load_errors()
    } else {
        Vec::new()
    };
    Json(Definitions { workflows, errors })
}

/// A definition as `caller` may see it: a non-admin key sees its file's
/// name, not where it lives on the server (issue #29).
fn shown(mut definition: Value, caller: &Principal) -> Value {
    if !caller.admin
        && let Some(file) = definition["file"].as_str()
    {
        let name = std::path::Path::new(file)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        definition["file"] = json!(name);
    }
    definition
}

error_responses!(
    ShowDefinitionErrors:
    WorkflowNotFound
);

#[utoipa::path(
    get,
    path = "/v1/workflows/{name}",
    operation_id = "show_workflow",
    summary = "A workflow definition",
    tag = "workflows",
    params(("name" = String, Path, description = "Workflow name")),
    responses(
        (status = 200, description = "The definition", body = Definition),
        ShowDefinitionErrors,
    )
)]
async fn show_definition(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let w = state
        .workflows
        .definition(&name)
        .ok_or(WorkflowError::NotFound { name })?;
    Ok(Json(shown(w.to_json(), &caller)))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct StartBody {
    /// Checked against the workflow's input schema.
    #[serde(default)]
    #[schema(value_type = Option<std::collections::BTreeMap<String, Value>>)]
    input: Value,
    /// Answer when the run is over instead of at once.
    #[serde(default)]
    wait: bool,
    user_id: Option<UserId>,
    /// Where to POST the run's end (succeeded, failed, interrupted,
    /// cancelled) as a signed Standard Webhooks event (docs/webhooks.md);
    /// a URL cadre may not reach is 422 `WEBHOOK_REFUSED`.
    #[serde(default)]
    #[schema(max_length = 2048)]
    webhook: Option<String>,
}

/// The run, if the caller's tenant owns it; else "not found".
async fn owned(state: &AppState, caller: &Principal, id: &str) -> Result<WorkflowRun, ApiError> {
    let run = state.workflows.get(id).await?;
    if run.tenant != caller.tenant {
        return Err(WorkflowError::RunNotFound { id: id.into() }.into());
    }
    Ok(run)
}

error_responses!(
    StartErrors:
    WorkflowNotFound,
    WebhookRefused,
    ValidationError = "the input fails the workflow's schema (`details.validation_errors`: `{field, code, message}`), or an unknown field",
    WorkflowDepthExceeded,
    StorageUnavailable,
    ShuttingDown
);

#[utoipa::path(
    post,
    path = "/v1/workflows/{name}/runs",
    operation_id = "start_run",
    summary = "Start a workflow run",
    tag = "workflows",
    params(
        ("name" = String, Path, description = "Workflow name"),
        ("x-cadre-parent-run" = Option<String>, Header, description = "The run whose tool call starts this one (HTTP tools send it): the new run is one deeper, and refused past `[workflows] max_depth`"),
    ),
    request_body = StartBody,
    responses(
        (status = 201, description = "The run (with `wait`, as it ended: a failed run is still a 201)", body = WorkflowRun),
        StartErrors,
    )
)]
async fn start(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(name): Path<String>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<StartBody>,
) -> Result<(StatusCode, Json<WorkflowRun>), ApiError> {
    let parent_run = headers
        .get(PARENT_RUN_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    // A run's plan is the lower of the workflow's and the caller's
    // entitlement: a free key runs a premium workflow's calls as free.
    let ceiling = crate::tenants::config::plan_ceiling(&state.store, &caller).await?;
    let webhook = match body.webhook {
        Some(url) => Some(state.webhooks.check(&caller.tenant, &url).await?),
        None => None,
    };
    let run = state
        .workflows
        .start(
            &name,
            StartRun {
                input: body.input,
                tenant: caller.tenant,
                user_id: body.user_id.map(UserId::into_string),
                parent_run,
                plan_ceiling: Some(ceiling),
                webhook,
                id: None,
            },
        )
        .await?;
    let run = if body.wait {
        state.workflows.wait(&run.id).await?
    } else {
        run
    };
    Ok((StatusCode::CREATED, Json(run)))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    /// Only runs of this workflow.
    workflow: Option<String>,
    /// 1 to 1,000 (default 50).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
    /// The `next` of the previous page (opaque; printable ASCII, as run
    /// ids are, so its length in bytes is its length in characters).
    #[param(max_length = 128, pattern = "^[!-~]*$")]
    cursor: Option<String>,
}

error_responses!(
    ListRunsErrors:
    ValidationError = "limit out of range, or a cursor too long or not printable ASCII",
    StorageUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/workflows/runs",
    operation_id = "list_runs",
    summary = "Workflow runs, newest first",
    tag = "workflows",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of the caller's tenant's runs, newest first", body = RunList),
        ListRunsErrors,
    )
)]
async fn list_runs(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<RunList>, ApiError> {
    let (limit, cursor) = super::calls::page_params(q.limit, q.cursor, DEFAULT_LIMIT)?;
    let page = state
        .workflows
        .list(RunFilter {
            workflow: q.workflow,
            tenant: caller.tenant,
            limit,
            cursor,
        })
        .await?;
    Ok(Json(RunList {
        count: page.items.len(),
        runs: page.items,
        next: page.next,
    }))
}

error_responses!(
    ShowRunErrors:
    RunNotFound,
    StorageUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/workflows/runs/{id}",
    operation_id = "show_run",
    summary = "A workflow run with per-node status",
    tag = "workflows",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 200, description = "The run with per-node status", body = WorkflowRun),
        ShowRunErrors,
    )
)]
async fn show_run(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<WorkflowRun>, ApiError> {
    Ok(Json(owned(&state, &caller, &id).await?))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct ResumeQuery {
    /// Answer when the run is over instead of at once.
    #[serde(default)]
    wait: bool,
}

error_responses!(
    ResumeErrors:
    RunNotFound,
    RunNotResumable = "running or succeeded",
    StorageUnavailable,
    ShuttingDown
);

#[utoipa::path(
    post,
    path = "/v1/workflows/runs/{id}/resume",
    operation_id = "resume_run",
    summary = "Resume a failed or interrupted run",
    tag = "workflows",
    params(("id" = String, Path, description = "Run id"), ResumeQuery),
    responses(
        (status = 200, description = "The run, resumed (with `wait`, as it ended)", body = WorkflowRun),
        ResumeErrors,
    )
)]
async fn resume(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<ResumeQuery>,
) -> Result<Json<WorkflowRun>, ApiError> {
    owned(&state, &caller, &id).await?;
    let run = state.workflows.resume(&id).await?;
    let run = if q.wait {
        state.workflows.wait(&run.id).await?
    } else {
        run
    };
    Ok(Json(run))
}

error_responses!(
    CancelErrors:
    RunNotFound,
    StorageUnavailable
);

#[utoipa::path(
    post,
    path = "/v1/workflows/runs/{id}/cancel",
    operation_id = "cancel_run",
    summary = "Cancel a running or interrupted run",
    tag = "workflows",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 200, description = "The run as it ended: `cancelled`, or as it was if it was already over (cancelling again changes nothing)", body = WorkflowRun),
        CancelErrors,
    )
)]
async fn cancel(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<WorkflowRun>, ApiError> {
    owned(&state, &caller, &id).await?;
    Ok(Json(state.workflows.cancel(&id).await?))
}

error_responses!(
    EventsErrors:
    RunNotFound,
    StorageUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/workflows/runs/{id}/events",
    operation_id = "run_events",
    summary = "A run's node events as Server-Sent Events",
    tag = "workflows",
    params(
        ("id" = String, Path, description = "Run id"),
        ("Last-Event-ID" = Option<String>, Header, description = "Sent by a reconnecting EventSource: the stream starts again from a fresh `snapshot` (which holds everything the missed events said), or is 204 when the run is over"),
    ),
    responses(
        (status = 200, description = "Server-Sent Events: `snapshot` (the run), then `node_started`, `node_succeeded`, `node_failed`, `node_skipped`, `item_*`, `run_finished` (the stream ends after it); `lagged` (`{missed}`) when the subscriber fell behind. Each has an `id:`, the last one's ending in `.end`",
            content_type = "text/event-stream", body = RunEvents),
        (status = 204, description = "A reconnect (`Last-Event-ID` sent) to a run that is over: nothing follows, an EventSource stops"),
        EventsErrors,
    )
)]
async fn events(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Extension(quota): Extension<super::streams::StreamQuota>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<axum::response::Response, ApiError> {
    // Subscribe before reading the snapshot, so nothing falls between them.
    let rx = state.workflows.subscribe();
    let run = owned(&state, &caller, &id).await?;
    let over = run.status.is_terminal();
    // A reconnect (an EventSource sends `Last-Event-ID`) to a run that is
    // over: 204, so it stops reconnecting.
    if over && headers.contains_key("last-event-id") {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let slot = quota.acquire()?;
    let snapshot = SseEvent::default()
        .event("snapshot")
        .id(if over { "0.end" } else { "0" })
        .retry(Duration::from_secs(2))
        .json_data(&run)
        .unwrap_or_else(|_| SseEvent::default().event("error"));
    let live = futures::stream::unfold((rx, id, over, 0u64), |(mut rx, id, over, n)| async move {
        if over {
            return None;
        }
        loop {
            match rx.recv().await {
                Ok(event) if event.run_id == id => {
                    let last = matches!(event.kind, WorkflowEventKind::RunFinished { .. });
                    let n = n + 1;
                    let sse = SseEvent::default()
                        .event(event.kind.name())
                        .id(if last {
                            format!("{n}.end")
                        } else {
                            n.to_string()
                        })
                        .json_data(&event)
                        .unwrap_or_else(|_| SseEvent::default().event("error"));
                    return Some((Ok::<_, std::convert::Infallible>(sse), (rx, id, last, n)));
                }
                Ok(_) => continue,
                Err(RecvError::Lagged(missed)) => {
                    return Some((Ok(Lagged::event(missed)), (rx, id, false, n)));
                }
                Err(RecvError::Closed) => return None,
            }
        }
    });
    let stream = futures::stream::once(async move { Ok(snapshot) }).chain(live);
    Ok(Sse::new(slot.hold_until_shutdown(stream))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}
