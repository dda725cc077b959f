//! Schedules over HTTP ([`crate::schedules`] has the rules).
//!
//! - `POST /v1/schedules` `{agent, message, session?, cron | interval_s,
//!   timezone?, user_id?, webhook?, catch_up?}` or `{workflow, input?,
//!   ...}`: 201 with the schedule and its `next_fire_at`;
//! - `GET /v1/schedules` (`?limit=&cursor=`, oldest first) and
//!   `GET /v1/schedules/{id}`;
//! - `PATCH /v1/schedules/{id}`: the fields given change (a new `cron`
//!   drops `interval_s` and the other way round; a change of timing
//!   counts from now);
//! - `DELETE /v1/schedules/{id}`: 204; no fire after it;
//! - `GET /v1/schedules/{id}/runs` (`?limit=`, newest first): each fire's
//!   slot, when it fired, its session and turn (or workflow run), its
//!   state and, when known, its turn's phase or run's status.
//!
//! A schedule belongs to the caller's tenant and runs with the caller's
//! key; another tenant's is 404 like a missing one. A refused field is a
//! 422 `VALIDATION_ERROR` saying which and why.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiQuery, PageQuery};
use super::openapi::error_responses;
use crate::schedules::{CatchUp, Fire, FireState, ScheduleSpec, ScheduleView};
use crate::tenants::Principal;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(show, update, delete))
        .routes(routes!(runs))
}

/// A schedule as asked for: an agent turn (`agent`, `message`,
/// `session`) or a workflow run (`workflow`, `input`), on `cron` or
/// `interval_s`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ScheduleBody {
    /// The agent asked at each fire.
    agent: Option<String>,
    /// What it is asked (a message's limits apply).
    message: Option<String>,
    /// `new` (default: a new session per fire) or the id of one of the
    /// tenant's sessions, of the same agent.
    session: Option<String>,
    /// The workflow run at each fire.
    workflow: Option<String>,
    /// The run's input (checked against the workflow's schema).
    #[schema(value_type = Option<std::collections::BTreeMap<String, Value>>)]
    input: Option<Value>,
    /// 5 fields (`0 9 * * 1-5`), or 6 with seconds first.
    #[schema(max_length = 256, example = "0 9 * * 1-5")]
    cron: Option<String>,
    /// Every this many seconds (at least 1), from the schedule's creation.
    #[schema(minimum = 1, maximum = 31_622_400)]
    interval_s: Option<u64>,
    /// The IANA time zone of `cron` (default `UTC`).
    #[schema(example = "Europe/Paris")]
    timezone: Option<String>,
    /// The user the turns or runs are for.
    user_id: Option<String>,
    /// An http(s) URL; stored, not yet called (delivery is to come).
    webhook: Option<String>,
    /// Missed slots after downtime: `one` (default), `none` or `all`.
    catch_up: Option<CatchUp>,
}

impl From<ScheduleBody> for ScheduleSpec {
    fn from(b: ScheduleBody) -> Self {
        ScheduleSpec {
            agent: b.agent,
            message: b.message,
            workflow: b.workflow,
            input: b.input,
            cron: b.cron,
            interval_s: b.interval_s,
            timezone: b.timezone,
            session: b.session,
            user_id: b.user_id,
            webhook: b.webhook,
            catch_up: b.catch_up,
        }
    }
}

/// A schedule.
#[derive(Serialize, ToSchema)]
#[schema(as = Schedule)]
struct ScheduleOut {
    id: String,
    agent: Option<String>,
    message: Option<String>,
    /// `new` or a session id (agent turns).
    session: Option<String>,
    workflow: Option<String>,
    #[schema(value_type = Option<std::collections::BTreeMap<String, Value>>)]
    input: Option<Value>,
    cron: Option<String>,
    interval_s: Option<u64>,
    timezone: String,
    user_id: Option<String>,
    webhook: Option<String>,
    catch_up: CatchUp,
    /// The next slot not yet fired (`null` while a node fires it).
    next_fire_at: Option<Timestamp>,
    /// `false` once the key that made it is revoked or expired: its slots
    /// are skipped.
    active: bool,
    created_at: Timestamp,
    updated_at: Timestamp,
}

impl From<ScheduleView> for ScheduleOut {
    fn from(v: ScheduleView) -> Self {
        let s = v.schedule;
        ScheduleOut {
            session: s
                .agent
                .as_ref()
                .map(|_| s.session.unwrap_or_else(|| "new".into())),
            id: s.id,
            agent: s.agent,
            message: s.message,
            workflow: s.workflow,
            input: s.input,
            cron: s.cron,
            interval_s: s.interval_s,
            timezone: s.timezone,
            user_id: s.user_id,
            webhook: s.webhook,
            catch_up: s.catch_up,
            next_fire_at: v.next_fire_at,
            active: v.active,
            created_at: s.created_at,
            updated_at: s.updated_at,
        }
    }
}

#[derive(Serialize, ToSchema)]
struct ScheduleList {
    /// Oldest first.
    schedules: Vec<ScheduleOut>,
    /// The `cursor` of the next page; `null` on the last.
    next: Option<String>,
}

/// One fire of a schedule.
#[derive(Serialize, ToSchema)]
struct ScheduleRun {
    /// The slot's time.
    slot: Timestamp,
    /// When the fire was recorded.
    fired_at: Timestamp,
    state: FireState,
    /// Cluster mode: the node that recorded it.
    node: Option<String>,
    session_id: Option<String>,
    turn_id: Option<String>,
    /// Workflow schedules: the run.
    run_id: Option<String>,
    /// The turn's phase or the run's status, when known.
    status: Option<String>,
    error: Option<String>,
}

#[derive(Serialize, ToSchema)]
struct ScheduleRuns {
    /// Newest first (the last 100 are kept).
    runs: Vec<ScheduleRun>,
}

fn run_view((fire, status): (Fire, Option<String>)) -> ScheduleRun {
    ScheduleRun {
        slot: fire.slot,
        fired_at: fire.fired_at,
        state: fire.state,
        node: fire.node,
        session_id: fire.session_id,
        turn_id: fire.turn_id,
        run_id: fire.run_id,
        status,
        error: fire.error,
    }
}

error_responses!(
    CreateErrors:
    WebhookRefused,
    ValidationError = "a field is missing, of the wrong type or refused (the message says which and why), or the tenant has 1,000 schedules",
    StorageUnavailable
);

#[utoipa::path(
    post,
    path = "/v1/schedules",
    operation_id = "create_schedule",
    summary = "Create a schedule",
    tag = "schedules",
    request_body = ScheduleBody,
    responses(
        (status = 201, description = "The schedule", body = ScheduleOut),
        CreateErrors,
    )
)]
async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(body): ApiJson<ScheduleBody>,
) -> Result<(StatusCode, Json<ScheduleOut>), ApiError> {
    let view = state.schedules.create(&caller, body.into()).await?;
    Ok((StatusCode::CREATED, Json(view.into())))
}

error_responses!(
    ListErrors:
    ValidationError = "limit out of range, or a cursor too long or not printable ASCII",
    StorageUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/schedules",
    operation_id = "list_schedules",
    summary = "The tenant's schedules",
    tag = "schedules",
    params(PageQuery),
    responses(
        (status = 200, description = "A page of the caller's tenant's schedules, oldest first", body = ScheduleList),
        ListErrors,
    )
)]
async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> Result<Json<ScheduleList>, ApiError> {
    let (limit, cursor) =
        super::calls::page_params(q.limit, q.cursor, super::calls::DEFAULT_LIMIT)?;
    let (schedules, next) = state.schedules.list(&caller, cursor, limit).await?;
    Ok(Json(ScheduleList {
        schedules: schedules.into_iter().map(ScheduleOut::from).collect(),
        next,
    }))
}

error_responses!(
    ShowErrors:
    ScheduleNotFound,
    StorageUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/schedules/{id}",
    operation_id = "show_schedule",
    summary = "A schedule",
    tag = "schedules",
    params(("id" = String, Path, description = "Schedule id")),
    responses(
        (status = 200, description = "The schedule", body = ScheduleOut),
        ShowErrors,
    )
)]
async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<ScheduleOut>, ApiError> {
    Ok(Json(state.schedules.get(&caller, &id).await?.into()))
}

error_responses!(
    UpdateErrors:
    ScheduleNotFound,
    WebhookRefused,
    ValidationError = "a field is of the wrong type or refused (the message says which and why)",
    StorageUnavailable
);

#[utoipa::path(
    patch,
    path = "/v1/schedules/{id}",
    operation_id = "update_schedule",
    summary = "Change a schedule",
    tag = "schedules",
    params(("id" = String, Path, description = "Schedule id")),
    request_body = ScheduleBody,
    responses(
        (status = 200, description = "The schedule as changed", body = ScheduleOut),
        UpdateErrors,
    )
)]
async fn update(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<ScheduleBody>,
) -> Result<Json<ScheduleOut>, ApiError> {
    Ok(Json(
        state
            .schedules
            .update(&caller, &id, body.into())
            .await?
            .into(),
    ))
}

#[utoipa::path(
    delete,
    path = "/v1/schedules/{id}",
    operation_id = "delete_schedule",
    summary = "Delete a schedule",
    tag = "schedules",
    params(("id" = String, Path, description = "Schedule id")),
    responses(
        (status = 204, description = "Deleted: it fires no more"),
        ShowErrors,
    )
)]
async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.schedules.delete(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct RunsQuery {
    /// 1 to 100 (default 50).
    #[param(minimum = 1, maximum = 100)]
    limit: Option<usize>,
}

error_responses!(
    RunsErrors:
    ScheduleNotFound,
    ValidationError = "limit out of range",
    StorageUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/schedules/{id}/runs",
    operation_id = "list_schedule_runs",
    summary = "A schedule's fires",
    tag = "schedules",
    params(("id" = String, Path, description = "Schedule id"), RunsQuery),
    responses(
        (status = 200, description = "The schedule's fires, newest first", body = ScheduleRuns),
        RunsErrors,
    )
)]
async fn runs(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<RunsQuery>,
) -> Result<Json<ScheduleRuns>, ApiError> {
    let limit = q.limit.unwrap_or(50);
    if !(1..=crate::schedules::KEEP_RUNS).contains(&limit) {
        return Err(ApiError::validation("limit must be 1 to 100"));
    }
    let runs = state.schedules.runs(&caller, &id, limit).await?;
    Ok(Json(ScheduleRuns {
        runs: runs.into_iter().map(run_view).collect(),
    }))
}
