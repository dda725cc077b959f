//! Confirmations over HTTP: list the pending ones, approve or deny one.
//!
//! `POST /v1/confirmations/{id}` `{approve: true}` runs the stored call
//! through the executor (it already passed plan and rate limit when it was
//! made) and answers with its result; `{approve: false}` discards it.
//! Unknown ids are 404, expired ones 410.

use axum::Extension;
use axum::Json;
use axum::extract::{Path, State};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::PageQuery;
use super::extract::{ApiJson, ApiQuery};
use super::openapi::{error_responses, view_of};
use crate::executor::DecisionOutcome;
use crate::executor::confirmations::{ConfirmationError, PendingConfirmation};
use crate::tenants::Principal;
use crate::tools::{ExecutionContext, ToolExecutionResult};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(decide, show))
}

/// A tool call held for a human decision.
#[derive(Serialize, ToSchema)]
struct Pending {
    confirmation_id: String,
    tool_name: String,
    /// The call's arguments.
    #[schema(value_type = Value)]
    params: Value,
    /// The model's id of the call, when a conversation made it.
    tool_call_id: Option<String>,
    /// Who made the call, for whom, with which limits.
    context: ExecutionContext,
    /// What would happen, for the person asked to confirm.
    summary: String,
    created_at: Timestamp,
    /// Undecided by then, it is declined.
    expires_at: Timestamp,
    /// The call record the held call wrote; the decision rewrites it.
    #[serde(skip_serializing_if = "Option::is_none")]
    record_id: Option<String>,
}

view_of!(PendingConfirmation => Pending {
    confirmation_id,
    tool_name,
    params,
    tool_call_id,
    context,
    summary,
    created_at,
    expires_at,
    record_id,
});

#[derive(Serialize, ToSchema)]
struct PendingList {
    /// Oldest first.
    confirmations: Vec<Pending>,
    /// The `cursor` of the next page; `null` on the last.
    next: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[schema(as = DecisionOutcome)]
struct Decided {
    confirmation_id: String,
    #[schema(value_type = String, pattern = "^(denied|executed|failed)$")]
    status: &'static str,
    /// On deny: the tool that was not run.
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_name: Option<String>,
    /// On approve: the held call's result.
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<ToolExecutionResult>,
}

view_of!(DecisionOutcome => Decided {
    confirmation_id,
    status,
    tool_name,
    result,
});

fn owned_by(p: &PendingConfirmation, caller: &Principal) -> bool {
    p.tenant() == caller.tenant
}

error_responses!(
    ListErrors:
    ValidationError = "limit out of range, or a cursor too long or not printable ASCII",
    StorageUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/confirmations",
    operation_id = "list_confirmations",
    summary = "Pending confirmations",
    tag = "confirmations",
    params(PageQuery),
    responses(
        (status = 200, description = "A page of the caller's tenant's pending confirmations, oldest first", body = PendingList),
        ListErrors,
    )
)]
async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> Result<Json<PendingList>, ApiError> {
    let (limit, cursor) =
        super::calls::page_params(q.limit, q.cursor, super::calls::DEFAULT_LIMIT)?;
    let page = state
        .executor
        .shared()
        .confirmations
        .list_of(&caller.tenant, cursor, limit)
        .await?;
    Ok(Json(PendingList {
        confirmations: page.items.into_iter().map(Pending::from).collect(),
        next: page.next,
    }))
}

/// Another tenant's confirmation is "not found", like a missing one.
async fn owned(
    state: &AppState,
    caller: &Principal,
    id: &str,
) -> Result<PendingConfirmation, ApiError> {
    let p = state.executor.shared().confirmations.get(id).await?;
    if !owned_by(&p, caller) {
        return Err(ConfirmationError::NotFound { id: id.into() }.into());
    }
    Ok(p)
}

error_responses!(
    ShowErrors:
    ConfirmationNotFound,
    ConfirmationExpired,
    StorageUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/confirmations/{id}",
    operation_id = "show_confirmation",
    summary = "A pending confirmation",
    tag = "confirmations",
    params(("id" = String, Path, description = "Confirmation id")),
    responses(
        (status = 200, description = "The pending confirmation", body = Pending),
        ShowErrors,
    )
)]
async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<Pending>, ApiError> {
    Ok(Json(owned(&state, &caller, &id).await?.into()))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct Decision {
    /// `true` runs the held call, `false` discards it.
    approve: bool,
}

error_responses!(
    DecideErrors:
    ConfirmationNotFound,
    ConfirmationAlreadyDecided = "another request approved or denied it first; nothing ran for this one",
    ConfirmationExpired,
    StorageUnavailable
);

#[utoipa::path(
    post,
    path = "/v1/confirmations/{id}",
    operation_id = "decide_confirmation",
    summary = "Approve or deny a pending confirmation",
    tag = "confirmations",
    params(("id" = String, Path, description = "Confirmation id")),
    request_body = Decision,
    responses(
        (status = 200, description = "Denied, or run through the executor with its result", body = Decided),
        DecideErrors,
    )
)]
async fn decide(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<Decision>,
) -> Result<Json<Decided>, ApiError> {
    // One atomic step: of racing requests exactly one gets the call.
    // The conversation turn waiting on it, if any, resumes.
    let outcome = state
        .sessions
        .decide_confirmation(&caller.scope(), &id, body.approve)
        .await?;
    Ok(Json(outcome.into()))
}
