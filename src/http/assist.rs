//! Help for human operators: reply suggestions and rewording.
//!
//! - `POST /v1/sessions/{id}/suggestions` -> `{suggestions: [three replies]}`
//!   (403 `SUGGESTIONS_DISABLED` when the tenant turned them off);
//! - `POST /v1/improve` `{text, agent?}` -> `{text}`: the text reworded.
//!
//! Each is one model call without tools, outside the conversation's turns:
//! nothing is stored in the session.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::error::{ApiError, ApiJson};
use crate::tenants::Principal;

/// Longest text `/v1/improve` takes, in bytes.
pub const MAX_IMPROVE_BYTES: usize = 16 * 1024;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/sessions/{id}/suggestions", post(suggestions))
        .route("/v1/improve", post(improve))
}

async fn suggestions(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    state.sessions.get_as(&caller.tenant, &id).await?;
    if !state
        .sessions
        .tenant_config(&caller.tenant)
        .await?
        .suggestions_enabled
    {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "SUGGESTIONS_DISABLED",
            "reply suggestions are turned off for this tenant",
        ));
    }
    let suggestions = state.sessions.suggestions(&caller.tenant, &id).await?;
    Ok(Json(
        json!({ "session_id": id, "suggestions": suggestions }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImproveBody {
    text: String,
    agent: Option<String>,
}

async fn improve(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<ImproveBody>,
) -> Result<Json<Value>, ApiError> {
    if body.text.trim().is_empty() {
        return Err(ApiError::validation("text must not be empty"));
    }
    if body.text.len() > MAX_IMPROVE_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "PAYLOAD_TOO_LARGE",
            format!("text is longer than {MAX_IMPROVE_BYTES} bytes"),
        ));
    }
    let text = state
        .sessions
        .improve(&body.text, body.agent.as_deref())
        .await?;
    Ok(Json(json!({ "text": text })))
}
