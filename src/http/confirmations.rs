//! Confirmations over HTTP: list the pending ones, approve or deny one.
//!
//! `POST /v1/confirmations/{id}` `{approve: true}` runs the stored call
//! through the executor (it already passed plan and rate limit when it was
//! made) and answers with its result; `{approve: false}` discards it.
//! Unknown ids are 404, expired ones 410.

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::error::{ApiError, ApiJson};
use crate::executor::confirmations::{ConfirmationError, PendingConfirmation};
use crate::executor::{Arguments, ExecuteTool};
use crate::tenants::{DEFAULT_TENANT, Principal};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/confirmations", get(list))
        .route("/v1/confirmations/{id}", post(decide).get(show))
}

impl From<ConfirmationError> for ApiError {
    fn from(e: ConfirmationError) -> Self {
        match e {
            ConfirmationError::NotFound { .. } => ApiError::new(
                StatusCode::NOT_FOUND,
                "CONFIRMATION_NOT_FOUND",
                e.to_string(),
            ),
            ConfirmationError::Expired { .. } => {
                ApiError::new(StatusCode::GONE, "CONFIRMATION_EXPIRED", e.to_string())
            }
            ConfirmationError::Store(s) => s.into(),
        }
    }
}

fn owned_by(p: &PendingConfirmation, caller: &Principal) -> bool {
    p.context.tenant.as_deref().unwrap_or(DEFAULT_TENANT) == caller.tenant
}

async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
) -> Result<Json<Value>, ApiError> {
    let pending: Vec<_> = state
        .executor
        .shared()
        .confirmations
        .list()
        .await?
        .into_iter()
        .filter(|p| owned_by(p, &caller))
        .collect();
    Ok(Json(json!({ "confirmations": pending })))
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

async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(owned(&state, &caller, &id).await?)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Decision {
    approve: bool,
}

async fn decide(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<Decision>,
) -> Result<Json<Value>, ApiError> {
    owned(&state, &caller, &id).await?;
    let pending = state.executor.shared().confirmations.take(&id).await?;
    if !body.approve {
        return Ok(Json(json!({
            "confirmation_id": id,
            "status": "denied",
            "tool_name": pending.tool_name,
        })));
    }
    let mut call = ExecuteTool::new(
        &pending.tool_name,
        Arguments::Json(pending.params),
        pending.context,
    );
    call.tool_call_id = pending.tool_call_id;
    call.confirmed = true;
    let result = state.executor.execute(call).await;
    Ok(Json(json!({
        "confirmation_id": id,
        "status": if result.is_success { "executed" } else { "failed" },
        "result": result,
    })))
}
