//! Limits and metrics over HTTP.
//!
//! - `GET /v1/limits`: the concurrency pool and its buckets.
//! - `GET /v1/limits/quota?user_id=&tool=`: what is left of a user's rate
//!   limit for a tool, per window (`{remaining, reset_at}`); reading it
//!   spends nothing.
//! - `GET /metrics`: Prometheus text format. Rendered by hand from the
//!   runtime's own snapshots: each runtime has its own numbers (tests run
//!   several in one process), which a process-global recorder would mix.

use axum::Extension;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use crate::executor::limit_key;
use crate::tenants::Principal;
use crate::tools::{CallerType, ExecutionContext};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/limits", get(limits))
        .route("/v1/limits/quota", get(quota))
        .route("/metrics", get(metrics))
}

async fn limits(State(state): State<AppState>) -> Json<Value> {
    let m = state.executor.shared().concurrency.metrics();
    Json(json!({ "concurrency": m }))
}

#[derive(Deserialize)]
struct QuotaQuery {
    user_id: Option<String>,
    tool: String,
}

async fn quota(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Query(q): Query<QuotaQuery>,
) -> Result<Json<Value>, ApiError> {
    let tool = state.registry.get(&q.tool).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "TOOL_NOT_FOUND",
            format!("no tool named '{}'", q.tool),
        )
    })?;
    let user = q.user_id.as_deref().unwrap_or("anonymous");
    let mut ctx = ExecutionContext::new(CallerType::Direct, user);
    ctx.user_id = Some(user.to_string());
    ctx.tenant = Some(caller.tenant);
    let key = limit_key(&ctx);
    let windows = state
        .executor
        .shared()
        .limiter
        .quota(&q.tool, &tool.definition.rate_limit, &key);
    Ok(Json(json!({
        "tool": q.tool,
        "user_id": user,
        "windows": windows,
    })))
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let m = state.executor.shared().concurrency.metrics();
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, kind: &str, value: String| {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
        ));
    };
    gauge(
        "cadre_tool_concurrent",
        "Tool calls holding a slot of the pool.",
        "gauge",
        m.current_concurrent.to_string(),
    );
    gauge(
        "cadre_tool_queue_length",
        "Tool calls waiting for a slot.",
        "gauge",
        m.queue_length.to_string(),
    );
    gauge(
        "cadre_tool_acquired_total",
        "Tool calls admitted to the pool.",
        "counter",
        m.total_acquired.to_string(),
    );
    gauge(
        "cadre_tool_rejected_total",
        "Tool calls refused because the queue was full.",
        "counter",
        m.total_rejected.to_string(),
    );
    gauge(
        "cadre_tool_queue_timeout_total",
        "Tool calls that timed out waiting for a slot.",
        "counter",
        m.total_timeout.to_string(),
    );
    gauge(
        "cadre_tool_execution_avg_ms",
        "Average time a call held its slot.",
        "gauge",
        format!("{}", m.avg_execution_time_ms),
    );
    gauge(
        "cadre_sessions_resident",
        "Conversations in memory.",
        "gauge",
        state.sessions.resident().to_string(),
    );
    gauge(
        "cadre_storage_degraded",
        "1 while storage refuses writes (disk full, I/O errors), else 0.",
        "gauge",
        u8::from(state.store.health() != crate::store::StoreHealth::Ok).to_string(),
    );
    gauge(
        "cadre_storage_reopens_total",
        "Times the database was reopened after a storage failure.",
        "counter",
        state.store.generation().to_string(),
    );
    out.push_str("# HELP cadre_bucket_concurrent Tool calls holding a slot of a category bucket.\n# TYPE cadre_bucket_concurrent gauge\n");
    for (name, b) in &m.buckets {
        out.push_str(&format!(
            "cadre_bucket_concurrent{{bucket=\"{name}\"}} {}\n",
            b.current
        ));
    }
    out.push_str("# HELP cadre_bucket_queue Tool calls waiting on a category bucket.\n# TYPE cadre_bucket_queue gauge\n");
    for (name, b) in &m.buckets {
        out.push_str(&format!(
            "cadre_bucket_queue{{bucket=\"{name}\"}} {}\n",
            b.queue
        ));
    }
    state.executor.shared().metrics.render(&mut out);
    state.store.commit_latency().render(
        &mut out,
        "cadre_store_commit_duration_seconds",
        "Duration of redb commits (one commit may carry many writes).",
    );
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
}
