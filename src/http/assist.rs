//! Help for human operators: reply suggestions and rewording.
//!
//! - `POST /v1/sessions/{id}/suggestions` -> `{suggestions: [three replies]}`
//!   (403 `SUGGESTIONS_DISABLED` when the tenant turned them off);
//! - `POST /v1/improve` `{text, agent?}` -> `{text}`: the text reworded.
//!
//! Each is one model call without tools, outside the conversation's turns:
//! nothing is stored in the session but the call's token usage (the
//! session's and the tenant's; rewording only the tenant's), and each is
//! refused with 429 `BUDGET_EXCEEDED` once the tenant's monthly token
//! budget is spent, like a turn.

use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::ApiJson;
use super::openapi::error_responses;
use crate::error_code::ErrorCode;
use crate::tenants::Principal;

/// Longest text `/v1/improve` takes, in bytes.
pub const MAX_IMPROVE_BYTES: usize = 16 * 1024;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(suggestions))
        .routes(routes!(improve))
}

#[derive(Serialize, ToSchema)]
struct Suggestions {
    session_id: String,
    /// Three replies an operator could send next.
    suggestions: Vec<String>,
}

#[derive(Serialize, ToSchema)]
struct Improved {
    /// The text reworded.
    text: String,
}

error_responses!(
    SuggestionsErrors:
    SuggestionsDisabled,
    SessionNotFound,
    BudgetExceeded,
    ModelUnavailable,
    ModelBadResponse,
    ModelRejected,
    ModelKeyNotSet,
    StorageUnavailable,
    ModelTimeout
);

#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/suggestions",
    operation_id = "suggest_replies",
    summary = "Three replies an operator could send",
    tag = "assist",
    params(("id" = String, Path, description = "Session id")),
    responses(
        (status = 200, description = "Three suggested replies", body = Suggestions),
        SuggestionsErrors,
    )
)]
async fn suggestions(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<Suggestions>, ApiError> {
    let scope = caller.scope();
    state.sessions.get(&scope, &id).await?;
    if !state
        .sessions
        .tenant_config(&caller.tenant)
        .await?
        .suggestions_enabled
    {
        return Err(ApiError::new(
            ErrorCode::SuggestionsDisabled,
            "reply suggestions are turned off for this tenant",
        ));
    }
    let suggestions = state.sessions.suggestions(&scope, &id).await?;
    Ok(Json(Suggestions {
        session_id: id,
        suggestions,
    }))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ImproveBody {
    /// At most 16 KiB.
    #[schema(
        min_length = 1,
        pattern = "[^\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
    )]
    text: String,
    /// Whose model rewords it (default: the first agent).
    agent: Option<String>,
}

error_responses!(
    ImproveErrors:
    AgentNotFound,
    PayloadTooLarge = "the body is over 1 MiB or the text over 16 KiB",
    ValidationError = "empty text or unknown field",
    BudgetExceeded,
    ModelUnavailable,
    ModelBadResponse,
    ModelRejected,
    ModelKeyNotSet,
    StorageUnavailable,
    ModelTimeout
);

#[utoipa::path(
    post,
    path = "/v1/improve",
    operation_id = "improve_text",
    summary = "Reword a text",
    tag = "assist",
    request_body = ImproveBody,
    responses(
        (status = 200, description = "The text reworded", body = Improved),
        ImproveErrors,
    )
)]
async fn improve(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(body): ApiJson<ImproveBody>,
) -> Result<Json<Improved>, ApiError> {
    if body.text.trim().is_empty() {
        return Err(ApiError::validation("text must not be empty"));
    }
    if body.text.len() > MAX_IMPROVE_BYTES {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("text is longer than {MAX_IMPROVE_BYTES} bytes"),
        ));
    }
    let text = state
        .sessions
        .improve(&caller.scope(), &body.text, body.agent.as_deref())
        .await?;
    Ok(Json(Improved { text }))
}
