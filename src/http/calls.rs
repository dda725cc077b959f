//! Call records over HTTP: `GET /v1/calls` (filter by conversation, tool or
//! workflow run; newest first; `limit` default 100, at most 1,000) and
//! `GET /v1/stats` (per-tool counters kept with the records).

use axum::Extension;
use axum::extract::{Query, State};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::auth::require_admin;
use super::error::ApiError;
use crate::store::{CallFilter, Store, StoreError};
use crate::tenants::Principal;

pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1_000;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/calls", get(calls))
        .route("/v1/stats", get(stats))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CallsQuery {
    conversation_id: Option<String>,
    workflow_id: Option<String>,
    tool: Option<String>,
    limit: Option<usize>,
}

async fn calls(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Query(q): Query<CallsQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(ApiError::validation(format!(
            "limit must be between 1 and {MAX_LIMIT}"
        )));
    }
    let calls = state
        .store
        .calls(CallFilter {
            conversation_id: q.conversation_id,
            workflow_id: q.workflow_id,
            tool: q.tool,
            tenant: Some(caller.tenant),
            limit,
        })
        .await?;
    Ok(Json(json!({ "calls": calls, "count": calls.len() })))
}

/// Runtime-wide counters: admin only (they span tenants).
async fn stats(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
) -> Result<Json<Value>, ApiError> {
    require_admin(&caller)?;
    Ok(Json(stats_document(&state.store).await?))
}

/// The `/v1/stats` body from the store: totals and per-tool counters
/// (`cadre stats` prints it as a table, from the store or from a server).
pub async fn stats_document(store: &Store) -> Result<Value, StoreError> {
    let per_tool = store.all_tool_stats().await?;
    let (mut total, mut ok, mut failed) = (0u64, 0u64, 0u64);
    let mut tools = serde_json::Map::new();
    for (name, s) in per_tool {
        total += s.total_calls;
        ok += s.successful_calls;
        failed += s.failed_calls;
        let avg = if s.total_calls > 0 {
            s.total_execution_time_ms as f64 / s.total_calls as f64
        } else {
            0.0
        };
        tools.insert(
            name,
            json!({
                "total_calls": s.total_calls,
                "successful_calls": s.successful_calls,
                "failed_calls": s.failed_calls,
                "avg_execution_time_ms": avg,
            }),
        );
    }
    Ok(json!({
        "total_calls": total,
        "successful_calls": ok,
        "failed_calls": failed,
        "success_rate": if total > 0 { ok as f64 / total as f64 } else { 0.0 },
        "tools": tools,
    }))
}
