//! Sessions over HTTP: create, read, send a message (one turn), history, summary.

use std::convert::Infallible;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::AppState;
use super::error::{ApiError, ApiJson};
use super::streams::StreamQuota;
use crate::conversation::NewSession;
use crate::conversation::actor::TurnEvent;
use crate::store::Session;
use crate::tenants::Principal;
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
        "tenant": s.tenant,
        "agent": s.agent,
        "user_id": s.user_id,
        "plan": s.plan,
        "metadata": s.metadata,
        "created_at": s.created_at,
    })
}

async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
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
            tenant: caller.tenant,
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
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(session_json(
        &state.sessions.get_as(&caller.tenant, &id).await?,
    )))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageBody {
    content: String,
}

/// One turn. With `Accept: text/event-stream` the reply is a stream of
/// Server-Sent Events: `turn_started`, `model_delta`, `tool_call_started`,
/// `tool_call_completed`, then `turn_completed` (the same body as the JSON
/// reply) or `turn_failed` (the JSON error body).
async fn send(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Extension(quota): Extension<StreamQuota>,
    Path(id): Path<String>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<MessageBody>,
) -> Result<Response, ApiError> {
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
    let wants_stream = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    if !wants_stream {
        let outcome = state
            .sessions
            .send_message_as(&caller.tenant, &id, body.content, None)
            .await?;
        return Ok(Json(outcome).into_response());
    }
    // A turn refused outright (too many streams 429, unknown session 404,
    // busy 409, storage 503) is a plain error reply, before any stream starts.
    let slot = quota.acquire()?;
    let (tx, rx) = mpsc::unbounded_channel();
    let accepted = state
        .sessions
        .start_message_as(&caller.tenant, &id, body.content, Some(tx))
        .await?;
    let (done_tx, done_rx) = oneshot::channel();
    tokio::spawn(async move {
        let _ = done_tx.send(accepted.await);
    });
    let events = UnboundedReceiverStream::new(rx).map(|event: TurnEvent| {
        let sse = match &event {
            TurnEvent::TurnCompleted(outcome) => SseEvent::default().json_data(outcome),
            other => SseEvent::default().json_data(other),
        };
        Ok::<_, Infallible>(
            sse.unwrap_or_else(|_| SseEvent::default())
                .event(event.name()),
        )
    });
    let failure = futures::stream::once(async move {
        match done_rx.await {
            Ok(Err(e)) => Some(ApiError::from(e).sse_event()),
            _ => None,
        }
    })
    .filter_map(|e| async move { e.map(Ok::<_, Infallible>) });
    Ok(Sse::new(slot.hold(events.chain(failure)))
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// Most messages one history page holds.
pub const MAX_PAGE: usize = 1_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryQuery {
    /// Only messages after this seq (the previous page's `next_after`).
    after: Option<u64>,
    limit: Option<usize>,
}

/// Oldest first, at most `limit` (default and maximum [`MAX_PAGE`]);
/// `next_after` is set when more follow.
async fn history(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
    Query(q): Query<HistoryQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(MAX_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::validation(format!(
            "limit must be between 1 and {MAX_PAGE}"
        )));
    }
    let mut messages = state
        .sessions
        .history_as(&caller.tenant, &id, q.after.unwrap_or(0), limit + 1)
        .await?;
    let more = messages.len() > limit;
    messages.truncate(limit);
    let next_after = more.then(|| messages.last().map(|m| m.seq)).flatten();
    Ok(Json(
        json!({ "session_id": id, "messages": messages, "next_after": next_after }),
    ))
}

async fn summary(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!(
        state.sessions.summary_as(&caller.tenant, &id).await?
    )))
}
