//! Tenant configuration over HTTP (admin keys) and the model providers.
//!
//! - `GET /v1/tenants/{id}/config`: the stored config, or the defaults.
//! - `POST /v1/tenants/{id}/config`: replace it (a full config; missing keys
//!   take their defaults).
//! - `PATCH /v1/tenants/{id}/config`: a JSON merge patch.
//! - `GET /v1/providers`: which model serves each agent.
//!
//! Every change is checked like a full config (unknown keys and bad values
//! are 422) and stored durably before the reply; the next turn of the
//! tenant's sessions uses it.

use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde_json::{Value, json};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::require_admin;
use super::error::{ApiError, ApiJson};
use super::openapi::error_responses;
use crate::error_code::ErrorCode;
use crate::tenants::{Principal, TenantConfig, valid_tenant_id};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(show, replace, patch))
        .routes(routes!(providers))
}

#[derive(ToSchema)]
#[allow(dead_code)]
struct TenantConfigView {
    tenant: String,
    /// `{custom_system_prompt, preferred_model, temperature, max_response_tokens, auto_respond_enabled,
    /// respond_with_operator, suggestions_enabled, response_delay_ms, tool_config, monthly_token_budget}`.
    #[schema(value_type = Object)]
    config: Value,
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
) -> Result<Json<Value>, ApiError> {
    check(&caller, &tenant)?;
    let config = TenantConfig::load(&state.store, &tenant).await?;
    Ok(Json(json!({"tenant": tenant, "config": config})))
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
    request_body(content = Object, description = "A full config; missing keys take their defaults"),
    responses(
        (status = 200, description = "The config as stored", body = TenantConfigView),
        ReplaceErrors,
    )
)]
async fn replace(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(tenant): Path<String>,
    ApiJson(body): ApiJson<Value>,
) -> Result<Json<Value>, ApiError> {
    check(&caller, &tenant)?;
    let config = TenantConfig::from_json(body)?;
    config.save(&state.store, &tenant).await?;
    Ok(Json(json!({"tenant": tenant, "config": config})))
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
    request_body(content = Object, description = "A JSON merge patch (RFC 7396) of the config"),
    responses(
        (status = 200, description = "The config as stored", body = TenantConfigView),
        PatchErrors,
    )
)]
async fn patch(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(tenant): Path<String>,
    ApiJson(body): ApiJson<Value>,
) -> Result<Json<Value>, ApiError> {
    check(&caller, &tenant)?;
    let current = TenantConfig::load(&state.store, &tenant).await?;
    let config = current.patched(&body)?;
    config.save(&state.store, &tenant).await?;
    Ok(Json(json!({"tenant": tenant, "config": config})))
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
