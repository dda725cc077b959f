//! Tenant configuration over HTTP (admin keys) and the model providers.
//!
//! - `GET /v1/tenants/{id}/config`: the stored config, or the defaults.
//! - `POST /v1/tenants/{id}/config`: replace it (a full config; missing keys
//!   take their defaults).
//! - `PATCH /v1/tenants/{id}/config`: a JSON merge patch.
//! - `GET /v1/providers`: which model serves each agent.
//! - `DELETE /v1/tenants/{id}/sessions`: erase every session of the tenant
//!   (each as `DELETE /v1/sessions/{id}` does, one store transaction per
//!   session, read [`crate::conversation::sessions::ERASE_BATCH`] at a
//!   time). Sessions with a running turn are left and counted as `busy`:
//!   the answer is 200 with the counts, and the caller erases again. The
//!   tenant's call records made outside sessions and its memory items
//!   ([`crate::memory::Memory::erase_tenant`]) go with them.
//!
//! Every change is checked like a full config (unknown keys and bad values
//! are 422) and stored durably before the reply; the next turn of the
//! tenant's sessions uses it.
//!
//! The bodies' schemas ([`TenantConfig`]'s own, and `TenantConfigPatch`
//! for a merge patch: the same keys, each nullable) state what
//! `TenantConfig` refuses (ranges, lengths, unknown keys, anything but an
//! object), so the document says it; the extractor holds bodies to them
//! before `TenantConfig` checks its values again (the tests below keep the
//! patch's schema in step with the config's).

use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::require_admin;
use super::error::ApiError;
use super::extract::ApiJsonValue;
use super::openapi::error_responses;
use crate::error_code::ErrorCode;
use crate::identity::Scope;
use crate::tenants::{Principal, TenantConfig, valid_tenant_id};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(show, replace, patch))
        .routes(routes!(providers))
        .routes(routes!(erase_sessions))
}

#[derive(Serialize, ToSchema)]
struct TenantConfigView {
    tenant: String,
    config: TenantConfig,
}

#[derive(ToSchema)]
#[allow(dead_code)]
struct Provider {
    agent: String,
    /// The endpoint, or the offline intent router.
    provider: String,
    model: Option<String>,
}

#[derive(ToSchema)]
#[allow(dead_code)]
struct Providers {
    providers: Vec<Provider>,
}

/// A JSON merge patch (RFC 7396) of a tenant's config: a key set to `null`
/// goes back to its default, a key left out stays as it is.
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct TenantConfigPatch {
    auto_respond_enabled: Option<bool>,
    respond_with_operator: Option<bool>,
    suggestions_enabled: Option<bool>,
    preferred_model: Option<String>,
    #[schema(max_length = 20000)]
    custom_system_prompt: Option<String>,
    #[schema(format = "uint32", minimum = 1, maximum = 4294967295_u32)]
    max_response_tokens: Option<u32>,
    #[schema(minimum = 0, maximum = 2)]
    temperature: Option<f32>,
    #[schema(minimum = 0, maximum = 60000)]
    response_delay_ms: Option<u64>,
    tool_config: Option<ToolConfigPatch>,
    plan: Option<crate::identity::Plan>,
    #[schema(schema_with = crate::tenants::config::tool_quotas_schema, nullable)]
    tool_quotas: Option<std::collections::BTreeMap<String, crate::tools::RateLimit>>,
    #[schema(format = "uint64", minimum = 0, maximum = 18446744073709551615_u64)]
    max_storage_mb: Option<u64>,
    #[schema(format = "uint64", minimum = 0, maximum = 18446744073709551615_u64)]
    monthly_token_budget: Option<u64>,
    /// Replaces the whole list (a merge patch replaces arrays).
    #[schema(max_items = 64)]
    guardrails: Option<Vec<crate::guardrails::GuardrailConfig>>,
    #[schema(
        nullable,
        pattern = "^whsec_(?:[A-Za-z0-9+/]{4}){8,42}(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
    )]
    webhook_secret: Option<String>,
    #[schema(minimum = 0, maximum = 36500)]
    retain_days: Option<f64>,
}

#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct ToolConfigPatch {
    fetch_page_enabled: Option<bool>,
    #[schema(inline, value_type = Option<Vec<crate::tenants::config::AbsolutePath>>)]
    allowed_paths: Option<Vec<String>>,
    #[schema(minimum = 1, maximum = 10)]
    max_iterations: Option<u32>,
    cache_enabled: Option<bool>,
    #[schema(format = "uint64", minimum = 0, maximum = 18446744073709551615_u64)]
    cache_ttl_seconds: Option<u64>,
}

fn check(caller: &Principal, tenant: &str) -> Result<(), ApiError> {
    require_admin(caller)?;
    if !valid_tenant_id(tenant) {
        return Err(ApiError::new(
            ErrorCode::TenantNotFound,
            "no such tenant id (letters, digits, '_' or '-', at most 64)",
        ));
    }
    Ok(())
}

error_responses!(
    ShowErrors:
    AdminRequired,
    TenantNotFound = "not a valid tenant id",
    StorageUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/tenants/{id}/config",
    operation_id = "show_tenant_config",
    summary = "A tenant's config (admin)",
    tag = "tenants",
    params(("id" = String, Path, description = "Tenant id")),
    responses(
        (status = 200, description = "The stored config, or the defaults", body = TenantConfigView),
        ShowErrors,
    )
)]
async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(tenant): Path<String>,
) -> Result<Json<TenantConfigView>, ApiError> {
    check(&caller, &tenant)?;
    let config = TenantConfig::load(&state.store, &tenant).await?;
    Ok(Json(TenantConfigView { tenant, config }))
}

error_responses!(
    ReplaceErrors:
    AdminRequired,
    TenantNotFound = "not a valid tenant id",
    ValidationError = "unknown key or bad value",
    StorageUnavailable
);

#[utoipa::path(
    post,
    path = "/v1/tenants/{id}/config",
    operation_id = "replace_tenant_config",
    summary = "Replace a tenant's config (admin)",
    tag = "tenants",
    params(("id" = String, Path, description = "Tenant id")),
    request_body(content = TenantConfig, description = "A full config; missing keys take their defaults"),
    responses(
        (status = 200, description = "The config as stored", body = TenantConfigView),
        ReplaceErrors,
    )
)]
async fn replace(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(tenant): Path<String>,
    ApiJsonValue(body, _): ApiJsonValue<TenantConfig>,
) -> Result<Json<TenantConfigView>, ApiError> {
    check(&caller, &tenant)?;
    let config = TenantConfig::from_json(body)?;
    config.save(&state.store, &tenant).await?;
    state.sessions.retention_changed();
    Ok(Json(TenantConfigView { tenant, config }))
}

error_responses!(
    PatchErrors:
    AdminRequired,
    TenantNotFound = "not a valid tenant id",
    ValidationError = "unknown key or bad value",
    StorageUnavailable
);

#[utoipa::path(
    patch,
    path = "/v1/tenants/{id}/config",
    operation_id = "patch_tenant_config",
    summary = "Merge-patch a tenant's config (admin)",
    tag = "tenants",
    params(("id" = String, Path, description = "Tenant id")),
    request_body(content = TenantConfigPatch, description = "A JSON merge patch (RFC 7396) of the config"),
    responses(
        (status = 200, description = "The config as stored", body = TenantConfigView),
        PatchErrors,
    )
)]
async fn patch(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(tenant): Path<String>,
    ApiJsonValue(body, _): ApiJsonValue<TenantConfigPatch>,
) -> Result<Json<TenantConfigView>, ApiError> {
    check(&caller, &tenant)?;
    let current = TenantConfig::load(&state.store, &tenant).await?;
    let config = current.patched(&body)?;
    config.save(&state.store, &tenant).await?;
    state.sessions.retention_changed();
    Ok(Json(TenantConfigView { tenant, config }))
}

/// What a tenant erase did.
#[derive(Serialize, ToSchema)]
struct ErasedSessions {
    tenant: String,
    /// Sessions deleted.
    deleted: u64,
    /// Sessions left because a turn was running in them: erase again.
    busy: u64,
    /// Call records made outside any session (direct tool calls, workflow
    /// tool nodes) erased with them: they count in the tenant's storage.
    calls: u64,
    /// The tenant's memory items erased with them (`/v1/memory`).
    memory_items: u64,
}

error_responses!(
    EraseErrors:
    AdminRequired,
    TenantNotFound = "not a valid tenant id",
    StorageUnavailable
);

#[utoipa::path(
    delete,
    path = "/v1/tenants/{id}/sessions",
    operation_id = "erase_tenant_sessions",
    summary = "Delete every session of a tenant (admin)",
    description = "Each session goes as with `DELETE /v1/sessions/{id}`, one at a time: \
        its messages, summary, tool calls and confirmations. Sessions with a running turn \
        are left and counted in `busy`. The tenant's call records made outside any session \
        (direct tool calls, workflow tool nodes) go too, counted in `calls`, and so do \
        the tenant's memory items (`/v1/memory`), counted in `memory_items`.",
    tag = "tenants",
    params(("id" = String, Path, description = "Tenant id")),
    responses(
        (status = 200, description = "What was erased", body = ErasedSessions),
        EraseErrors,
    )
)]
async fn erase_sessions(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(tenant): Path<String>,
) -> Result<Json<ErasedSessions>, ApiError> {
    check(&caller, &tenant)?;
    let done = state
        .sessions
        .erase_tenant(&Scope::tenant(tenant.clone()))
        .await?;
    let calls = state.store.erase_calls_outside_sessions(&tenant).await?;
    let memory_items = state.memory.erase_tenant(&tenant).await?;
    Ok(Json(ErasedSessions {
        tenant,
        deleted: done.deleted,
        busy: done.busy,
        calls,
        memory_items,
    }))
}

#[utoipa::path(
    get,
    path = "/v1/providers",
    operation_id = "list_providers",
    summary = "Which model serves each agent",
    tag = "tenants",
    responses((status = 200, description = "Which model serves each agent", body = Providers))
)]
async fn providers(State(state): State<AppState>) -> Json<Value> {
    Json(json!({ "providers": state.sessions.agents().providers() }))
}
