//! Token usage over HTTP: `GET /v1/usage?from=&to=&tenant=`.
//!
//! client ──▶ usage ──▶ Store::usage_rows (tenant, day, agent) ──▶ rows, totals, the tenant's budget
//!
//! A key sees its own tenant's usage, by UTC day and agent; an admin key
//! sees every tenant's, or one tenant's with `?tenant=`. `from` and `to`
//! are inclusive days (`YYYY-MM-DD`, UTC) and default to the current month
//! up to today. A range is at most [`MAX_DAYS`] days (422 beyond), so one
//! request reads a bounded number of rows per tenant and agent. For one
//! tenant the answer also carries its monthly budget, if it has one: what
//! is used and left this month and when it resets. A session's own usage
//! is on its summary (`GET /v1/sessions/{id}/summary`).

use axum::extract::State;
use axum::{Extension, Json};
use jiff::Timestamp;
use jiff::civil::Date;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::require_admin;
use super::error::ApiError;
use super::extract::ApiQuery;
use super::openapi::{error_responses, view_of};
use crate::conversation::budget::Month;
use crate::store::usage::day_of;
use crate::store::{TokenUsage, UsageRow};
use crate::tenants::{Principal, valid_tenant_id};

/// Longest range one request may ask for, in days.
pub const MAX_DAYS: i32 = 366;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(usage))
}

/// Token counters of model calls.
#[derive(Serialize, ToSchema)]
pub(super) struct TokenUsageView {
    prompt_tokens: u64,
    completion_tokens: u64,
    /// prompt + completion.
    total_tokens: u64,
    /// Model calls that returned a reply (a provider that reports no usage counts zero tokens).
    model_calls: u64,
}

view_of!(TokenUsage => TokenUsageView {
    prompt_tokens,
    completion_tokens,
    total_tokens,
    model_calls,
});

/// One tenant's usage of one agent on one day.
#[derive(Serialize, ToSchema)]
struct UsageRowView {
    tenant: String,
    /// `YYYY-MM-DD`, UTC.
    day: Date,
    agent: String,
    #[serde(flatten)]
    usage: TokenUsageView,
}

view_of!(UsageRow => UsageRowView {
    tenant,
    day,
    agent,
    usage,
});

/// The tenant's monthly token budget and where it stands.
#[derive(Serialize, ToSchema)]
struct BudgetView {
    monthly_token_budget: u64,
    /// Tokens of the current month (UTC).
    used_tokens: u64,
    remaining_tokens: u64,
    /// When the budget starts again: 00:00 UTC on the 1st of next month.
    resets_at: Timestamp,
}

#[derive(Serialize, ToSchema)]
struct UsageReport {
    /// First day, `YYYY-MM-DD` (UTC).
    from: Date,
    /// Last day, inclusive.
    to: Date,
    /// The tenant reported on; `null` when an admin asked for every tenant.
    tenant: Option<String>,
    /// By tenant, day and agent; days without model calls are left out.
    usage: Vec<UsageRowView>,
    totals: TokenUsageView,
    /// For one tenant with a budget; otherwise `null`.
    budget: Option<BudgetView>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct UsageQuery {
    /// First day, `YYYY-MM-DD` (UTC); default: the 1st of the current month.
    #[param(format = Date)]
    from: Option<String>,
    /// Last day, inclusive; default: today (UTC). At most 366 days after `from`.
    #[param(format = Date)]
    to: Option<String>,
    /// Admin keys: only this tenant (default: every tenant). Other keys may
    /// name only their own.
    #[param(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    tenant: Option<String>,
}

error_responses!(
    UsageErrors:
    AdminRequired = "`tenant` names another tenant and the key is not an admin's",
    ValidationError = "a day that is not `YYYY-MM-DD`, `to` before `from`, more than 366 days, or a bad tenant id",
    StorageUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/usage",
    operation_id = "show_usage",
    summary = "Token usage by day and agent (the caller's tenant; admin: any)",
    tag = "tenants",
    params(UsageQuery),
    responses(
        (status = 200, description = "Usage by tenant, day and agent, its totals, and the tenant's budget", body = UsageReport),
        UsageErrors,
    )
)]
async fn usage(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiQuery(q): ApiQuery<UsageQuery>,
) -> Result<Json<UsageReport>, ApiError> {
    let now = Timestamp::now();
    let today = day_of(now);
    let to = q.to.as_deref().map(day).transpose()?.unwrap_or(today);
    let from = q
        .from
        .as_deref()
        .map(day)
        .transpose()?
        .unwrap_or_else(|| to.first_of_month());
    if to < from {
        return Err(ApiError::validation("`to` is before `from`"));
    }
    if (to - from).get_days() >= MAX_DAYS {
        return Err(ApiError::validation(format!(
            "the range is longer than {MAX_DAYS} days"
        )));
    }
    let tenant = match q.tenant {
        Some(t) if t == caller.tenant => Some(t),
        Some(t) => {
            require_admin(&caller)?;
            if !valid_tenant_id(&t) {
                return Err(ApiError::validation(
                    "`tenant` is not a tenant id (letters, digits, '_' or '-', at most 64)",
                ));
            }
            Some(t)
        }
        None if caller.admin => None,
        None => Some(caller.tenant.clone()),
    };
    let rows = state.store.usage_rows(tenant.as_deref(), from, to).await?;
    let mut totals = TokenUsage::default();
    for row in &rows {
        totals.add(&row.usage);
    }
    let budget = match &tenant {
        Some(t) => budget_view(&state, t, now).await?,
        None => None,
    };
    Ok(Json(UsageReport {
        from,
        to,
        tenant,
        usage: rows.into_iter().map(UsageRowView::from).collect(),
        totals: totals.into(),
        budget,
    }))
}

/// A day as the query gives it: exactly `YYYY-MM-DD`.
fn day(text: &str) -> Result<Date, ApiError> {
    let bad = || ApiError::validation(format!("'{text}' is not a day (YYYY-MM-DD)"));
    if text.len() != 10 {
        return Err(bad());
    }
    text.parse().map_err(|_| bad())
}

/// The tenant's budget this month, or `None` without one.
async fn budget_view(
    state: &AppState,
    tenant: &str,
    now: Timestamp,
) -> Result<Option<BudgetView>, ApiError> {
    let config = state.sessions.tenant_config(tenant).await?;
    let Some(limit) = config.monthly_token_budget else {
        return Ok(None);
    };
    let month = Month::of(now);
    let used = state
        .store
        .tenant_usage(tenant, month.first, month.last)
        .await?
        .total_tokens;
    Ok(Some(BudgetView {
        monthly_token_budget: limit,
        used_tokens: used,
        remaining_tokens: limit.saturating_sub(used),
        resets_at: month.resets_at,
    }))
}
