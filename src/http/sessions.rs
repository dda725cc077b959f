//! Sessions over HTTP: create, read, send a message (one turn), history, summary.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::error::{ApiError, ApiJson};
use crate::conversation::{NewSession, TurnOutcome};
use crate::store::Session;
use crate::tools::Plan;

/// Longest message content accepted, in bytes (the body cap is larger to
/// leave room for JSON escapes).
pub const MAX_CONTENT_BYTES: usize = 256 * 1024;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/sessions", post(create))
        .route("/v1/sessions/{id}", get(show))
        .route("/v1/sessions/{id}/messages", post(send).get(history))
        .route("/v1/sessions/{id}/summary", get(summary))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    agent: String,
    user_id: Option<String>,
    plan: Option<String>,
    #[serde(default)]
    metadata: Value,
}

fn session_json(s: &Session) -> Value {
    json!({
        "id": s.id,
        "agent": s.agent,
        "user_id": s.user_id,
        "plan": s.plan,
        "metadata": s.metadata,
        "created_at": s.created_at,
    })
}

async fn create(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    if body.agent.trim().is_empty() {
        return Err(ApiError::validation("agent must not be empty"));
    }
    if !(body.metadata.is_null() || body.metadata.is_object()) {
        return Err(ApiError::validation("metadata must be an object"));
    }
    let plan = match body.plan.as_deref() {
        None => Plan::Free,
        Some(p) => Plan::parse(p).ok_or_else(|| {
            ApiError::validation(format!("unknown plan '{p}' (free, pro or premium)"))
        })?,
    };
    let session = state
        .sessions
        .create(NewSession {
            agent: body.agent,
            user_id: body.user_id,
            plan,
            metadata: body.metadata,
        })
        .await?;
    Ok((StatusCode::CREATED, Json(session_json(&session))))
}

async fn show(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(session_json(&state.sessions.get(&id).await?)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageBody {
    content: String,
}

async fn send(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<MessageBody>,
) -> Result<Json<TurnOutcome>, ApiError> {
    if body.content.trim().is_empty() {
        return Err(ApiError::validation("content must not be empty"));
    }
    if body.content.len() > MAX_CONTENT_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "PAYLOAD_TOO_LARGE",
            format!("content is longer than {MAX_CONTENT_BYTES} bytes"),
        ));
    }
    Ok(Json(state.sessions.send_message(&id, body.content).await?))
}

async fn history(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let messages = state.sessions.history(&id).await?;
    Ok(Json(json!({ "session_id": id, "messages": messages })))
}

async fn summary(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(state.sessions.summary(&id).await?)))
}
