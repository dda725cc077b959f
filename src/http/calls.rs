//! Call records over HTTP: `GET /v1/calls` (filter by conversation, tool or
//! workflow run; newest first; `limit` default 100, at most 1,000; `cursor`
//! the `next` of the previous page) and `GET /v1/stats` (per-tool counters
//! kept with the records). Each listed record carries its `status`
//! ([`crate::store::CallStatus`]): a call held for confirmation is
//! `pending_approval`, never `failed`, and `/v1/stats` counts it nowhere
//! until its decision rewrites its record. Every listing of the API pages the same way
//! ([`page_params`]) and reads only the caller's tenant's rows
//! ([`crate::store::listing`]).

use axum::Extension;
use axum::Json;
use axum::extract::State;
use std::collections::BTreeMap;

use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::require_admin;
use super::error::ApiError;
use super::extract::ApiQuery;
use super::openapi::error_responses;
use crate::store::{CallFilter, ShownCall, Store, StoreError};
use crate::tenants::Principal;

pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1_000;
/// Longest `cursor` a listing takes (a cursor is a key of the listing: an
/// id of at most this length).
pub const MAX_CURSOR_LEN: usize = 128;

/// A listing's `limit` (default `default`, 1 to [`MAX_LIMIT`]) and
/// `cursor` (at most [`MAX_CURSOR_LEN`] printable ASCII characters, as the
/// document's `^[!-~]*$` says: cursors are ids cadre wrote), checked: 422
/// otherwise.
pub(super) fn page_params(
    limit: Option<usize>,
    cursor: Option<String>,
    default: usize,
) -> Result<(usize, Option<String>), ApiError> {
    let limit = limit.unwrap_or(default);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(ApiError::validation(format!(
            "limit must be between 1 and {MAX_LIMIT}"
        )));
    }
    if cursor.as_ref().is_some_and(|c| c.len() > MAX_CURSOR_LEN) {
        return Err(ApiError::validation(format!(
            "cursor is longer than {MAX_CURSOR_LEN} characters"
        )));
    }
    if cursor
        .as_ref()
        .is_some_and(|c| !c.bytes().all(|b| b.is_ascii_graphic()))
    {
        return Err(ApiError::validation(
            "cursor is not printable ASCII: pass the `next` of the previous page",
        ));
    }
    Ok((limit, cursor))
}

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(calls))
        .routes(routes!(stats))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct CallsQuery {
    /// Only this session's calls.
    conversation_id: Option<String>,
    /// Only this workflow run's calls.
    workflow_id: Option<String>,
    /// Only calls of this tool.
    tool: Option<String>,
    /// 1 to 1,000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
    /// The `next` of the previous page (opaque).
    #[param(max_length = 128, pattern = "^[!-~]*$")]
    cursor: Option<String>,
}

#[derive(Serialize, ToSchema)]
struct CallList<'a> {
    /// Newest first. `status`: `succeeded`, `failed`, `pending_approval`
    /// (held for a person's confirmation: not failed; its decision rewrites
    /// this record) or `declined` (a person declined it, or it expired: it
    /// did not run); `cached`: answered from the tool's result cache (the
    /// tool did not run).
    calls: Vec<ShownCall<'a>>,
    /// How many calls this page holds.
    count: usize,
    /// The `cursor` of the next page; `null` on the last.
    next: Option<String>,
}

/// Runtime-wide counters (`GET /v1/stats`, `cadre stats`).
#[derive(Debug, Serialize, ToSchema)]
pub struct Stats {
    pub total_calls: u64,
    pub successful_calls: u64,
    pub failed_calls: u64,
    pub success_rate: f64,
    /// Per tool. Calls held for confirmation or declined are not counted
    /// (they did not run); an approved one counts once.
    pub tools: BTreeMap<String, ToolCounters>,
}

/// One tool's counters in [`Stats`].
#[derive(Debug, Serialize, ToSchema)]
pub struct ToolCounters {
    pub total_calls: u64,
    pub successful_calls: u64,
    pub failed_calls: u64,
    pub avg_execution_time_ms: f64,
}

error_responses!(
    CallsErrors:
    ValidationError = "limit out of range, or a cursor too long or not printable ASCII",
    StorageUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/calls",
    operation_id = "list_calls",
    summary = "Call records, newest first",
    tag = "calls",
    params(CallsQuery),
    responses(
        (status = 200, description = "A page of the caller's tenant's call records, newest first", body = CallList),
        CallsErrors,
    )
)]
async fn calls(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiQuery(q): ApiQuery<CallsQuery>,
) -> Result<Response, ApiError> {
    let (limit, cursor) = page_params(q.limit, q.cursor, DEFAULT_LIMIT)?;
    let filter = CallFilter {
        conversation_id: q.conversation_id,
        workflow_id: q.workflow_id,
        tool: q.tool,
        ..CallFilter::default()
    };
    let page = state
        .store
        .calls_of(&caller.tenant, filter, cursor, limit)
        .await?;
    Ok(Json(CallList {
        calls: page.items.iter().map(|c| c.shown()).collect(),
        count: page.items.len(),
        next: page.next,
    })
    .into_response())
}

error_responses!(
    StatsErrors:
    AdminRequired,
    StorageUnavailable
);

/// Runtime-wide counters: admin only (they span tenants).
#[utoipa::path(
    get,
    path = "/v1/stats",
    operation_id = "show_stats",
    summary = "Per-tool counters (admin)",
    tag = "calls",
    responses(
        (status = 200, description = "Counters over every tenant's calls", body = Stats),
        StatsErrors,
    )
)]
async fn stats(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
) -> Result<Json<Stats>, ApiError> {
    require_admin(&caller)?;
    Ok(Json(stats_document(&state.store).await?))
}

/// The `/v1/stats` body from the store: totals and per-tool counters
/// (`cadre stats` prints it as a table, from the store or from a server).
pub async fn stats_document(store: &Store) -> Result<Stats, StoreError> {
    let per_tool = store.all_tool_stats().await?;
    let (mut total, mut ok, mut failed) = (0u64, 0u64, 0u64);
    let mut tools = BTreeMap::new();
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
            ToolCounters {
                total_calls: s.total_calls,
                successful_calls: s.successful_calls,
                failed_calls: s.failed_calls,
                avg_execution_time_ms: avg,
            },
        );
    }
    Ok(Stats {
        total_calls: total,
        successful_calls: ok,
        failed_calls: failed,
        success_rate: if total > 0 {
            ok as f64 / total as f64
        } else {
            0.0
        },
        tools,
    })
}
