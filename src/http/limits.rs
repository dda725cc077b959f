//! Limits and metrics over HTTP.
//!
//! - `GET /v1/limits`: the concurrency pool and its buckets.
//! - `GET /v1/limits/quota?user_id=&tool=`: what is left of a user's rate
//!   limit for a tool, per window (`{remaining, reset_at}`); reading it
//!   spends nothing.
//! - `GET /metrics`: Prometheus text format, for admin and metrics keys
//!   (anyone when the server runs open). Rendered by hand from the
//!   runtime's own snapshots: each runtime has its own numbers (tests run
//!   several in one process), which a process-global recorder would mix.

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::require_scraper;
use super::error::ApiError;
use super::extract::ApiQuery;
use super::openapi::{error_responses, view_of};
use crate::error_code::ErrorCode;
use crate::executor::concurrency::{BucketMetrics, ConcurrencyMetrics};
use crate::executor::limit_key;
use crate::executor::limits::{Window, WindowQuota};
use crate::identity::UserId;
use crate::tenants::Principal;
use crate::tools::{CallerType, ExecutionContext};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(limits))
        .routes(routes!(quota))
        .routes(routes!(metrics))
}

#[derive(Serialize, ToSchema)]
struct Limits {
    concurrency: Pool,
}

/// The concurrency pool. An admin key (or a server running open) sees it
/// whole. Any other key sees the limits that apply to its tenant and none
/// of the runtime-wide live counters (they are every tenant's load): the
/// fields marked "admin" are absent.
#[derive(Serialize, ToSchema)]
struct Pool {
    /// Pool slots one tenant may hold.
    max_per_tenant: usize,
    /// Callers of one tenant that may wait.
    max_queued_per_tenant: usize,
    /// One entry per configured bucket.
    buckets: BTreeMap<String, Bucket>,
    /// Admin: pool slots held now (bypass permits excluded).
    #[serde(skip_serializing_if = "Option::is_none")]
    current_concurrent: Option<usize>,
    /// Admin: callers waiting for a slot.
    #[serde(skip_serializing_if = "Option::is_none")]
    queue_length: Option<usize>,
    /// Admin: permits handed out to counted calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    total_acquired: Option<u64>,
    /// Admin: calls refused with `TOOL_QUEUE_FULL`.
    #[serde(skip_serializing_if = "Option::is_none")]
    total_rejected: Option<u64>,
    /// Admin: waiters that gave up at their timeout.
    #[serde(skip_serializing_if = "Option::is_none")]
    total_timeout: Option<u64>,
    /// Admin: permits handed out to bypassing calls (workflow nodes).
    #[serde(skip_serializing_if = "Option::is_none")]
    total_bypassed: Option<u64>,
    /// Admin: mean time counted permits were held, over those released so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    avg_execution_time_ms: Option<f64>,
    /// Admin: tenants holding at least one slot now.
    #[serde(skip_serializing_if = "Option::is_none")]
    tenants_running: Option<usize>,
    /// Admin: tenants with at least one caller waiting.
    #[serde(skip_serializing_if = "Option::is_none")]
    tenants_waiting: Option<usize>,
}

/// One bucket of the pool.
#[derive(Serialize, ToSchema)]
struct Bucket {
    limit: usize,
    /// Admin: slots of this bucket held now.
    #[serde(skip_serializing_if = "Option::is_none")]
    current: Option<usize>,
    /// Admin: callers of this category waiting.
    #[serde(skip_serializing_if = "Option::is_none")]
    queue: Option<usize>,
}

impl Pool {
    /// The pool as `admin` (or not) may see it.
    fn seen(metrics: ConcurrencyMetrics, admin: bool) -> Self {
        // Every field named: a counter the pool adds is a decision here.
        let ConcurrencyMetrics {
            current_concurrent,
            queue_length,
            total_acquired,
            total_rejected,
            total_timeout,
            total_bypassed,
            avg_execution_time_ms,
            buckets,
            max_per_tenant,
            max_queued_per_tenant,
            tenants_running,
            tenants_waiting,
        } = metrics;
        let live = |v| admin.then_some(v);
        Pool {
            max_per_tenant,
            max_queued_per_tenant,
            buckets: buckets
                .into_iter()
                .map(|(name, b)| {
                    let BucketMetrics {
                        current,
                        limit,
                        queue,
                    } = b;
                    let bucket = Bucket {
                        limit,
                        current: live(current),
                        queue: live(queue),
                    };
                    (name, bucket)
                })
                .collect(),
            current_concurrent: live(current_concurrent),
            queue_length: live(queue_length),
            total_acquired: admin.then_some(total_acquired),
            total_rejected: admin.then_some(total_rejected),
            total_timeout: admin.then_some(total_timeout),
            total_bypassed: admin.then_some(total_bypassed),
            avg_execution_time_ms: admin.then_some(avg_execution_time_ms),
            tenants_running: live(tenants_running),
            tenants_waiting: live(tenants_waiting),
        }
    }
}

#[derive(Serialize, ToSchema)]
struct QuotaView {
    tool: String,
    user_id: String,
    /// Per window of the tool's rate limit.
    windows: Vec<WindowView>,
}

/// What is left of one window.
#[derive(Serialize, ToSchema)]
struct WindowView {
    window: WindowName,
    limit: u32,
    /// Calls that would pass now.
    remaining: u32,
    /// When all `limit` calls are available again (now if they are).
    reset_at: Timestamp,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum WindowName {
    Minute,
    Hour,
    Day,
}

view_of!(WindowQuota => WindowView {
    window,
    limit,
    remaining,
    reset_at,
});

impl From<Window> for WindowName {
    fn from(window: Window) -> Self {
        match window {
            Window::Minute => WindowName::Minute,
            Window::Hour => WindowName::Hour,
            Window::Day => WindowName::Day,
        }
    }
}

#[utoipa::path(
    get,
    path = "/v1/limits",
    operation_id = "show_limits",
    summary = "The concurrency pool and its buckets",
    tag = "limits",
    responses((status = 200, description = "The concurrency pool and its buckets", body = Limits))
)]
async fn limits(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
) -> Json<Limits> {
    let metrics = state.executor.shared().concurrency.metrics();
    Json(Limits {
        concurrency: Pool::seen(metrics, caller.admin),
    })
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct QuotaQuery {
    /// Whose quota (default `anonymous`).
    #[param(value_type = Option<String>, max_length = 128, pattern = "^[A-Za-z0-9_.@:+-]+$")]
    user_id: Option<UserId>,
    /// The tool's name.
    tool: String,
}

error_responses!(
    QuotaErrors:
    ValidationError = "`tool` missing, or a parameter that does not parse",
    ToolNotFound,
    LimitsUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/limits/quota",
    operation_id = "show_quota",
    summary = "What is left of a user's rate limit for a tool",
    tag = "limits",
    params(QuotaQuery),
    responses(
        (status = 200, description = "What is left per window; reading it spends nothing", body = QuotaView),
        QuotaErrors,
    )
)]
async fn quota(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiQuery(q): ApiQuery<QuotaQuery>,
) -> Result<Json<QuotaView>, ApiError> {
    let tool = state.registry.get(&q.tool).ok_or_else(|| {
        ApiError::new(
            ErrorCode::ToolNotFound,
            format!("no tool named '{}'", q.tool),
        )
    })?;
    let user = q.user_id.as_ref().map_or("anonymous", UserId::as_str);
    let mut ctx = ExecutionContext::new(CallerType::Direct, user);
    ctx.user_id = Some(user.to_string());
    ctx.tenant = Some(caller.tenant);
    let key = limit_key(&ctx);
    let windows = state
        .executor
        .shared()
        .limiter
        .look(&q.tool, &tool.definition.rate_limit, &key)
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "quota not read: the shared windows are unavailable");
            ApiError::new(
                ErrorCode::LimitsUnavailable,
                "the rate limits cannot be read now: the cluster's Redis is unreachable; retry shortly",
            )
        })?;
    Ok(Json(QuotaView {
        tool: q.tool,
        user_id: user.to_string(),
        windows: windows.into_iter().map(WindowView::from).collect(),
    }))
}

error_responses!(
    MetricsErrors:
    MetricsKeyRequired = "the key is neither an admin nor a metrics key"
);

/// With keys configured, an admin key or a metrics (scrape) key reads it,
/// as Prometheus' `authorization` scrape config sends one.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    summary = "Prometheus metrics (admin or metrics key)",
    tag = "limits",
    responses(
        (status = 200, description = "Prometheus text format (0.0.4)",
            content_type = "text/plain; version=0.0.4; charset=utf-8", body = String),
        MetricsErrors,
    )
)]
async fn metrics(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
) -> Result<impl IntoResponse, ApiError> {
    require_scraper(&caller)?;
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
    crate::metrics::render_process(&mut out);
    state.store.commit_latency().render(
        &mut out,
        "cadre_store_commit_duration_seconds",
        "Duration of redb commits (one commit may carry many writes).",
    );
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    ))
}
