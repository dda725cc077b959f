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
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Extension, Json, Router};
use serde_json::{Value, json};

use super::AppState;
use super::auth::require_admin;
use super::error::{ApiError, ApiJson};
use crate::tenants::config::TenantConfigError;
use crate::tenants::{Principal, TenantConfig, valid_tenant_id};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/tenants/{id}/config",
            get(show).post(replace).patch(patch),
        )
        .route("/v1/providers", get(providers))
}

impl From<TenantConfigError> for ApiError {
    fn from(e: TenantConfigError) -> Self {
        match e {
            TenantConfigError::Invalid { message } => ApiError::validation(message),
            TenantConfigError::Store(s) => s.into(),
        }
    }
}

fn check(caller: &Principal, tenant: &str) -> Result<(), ApiError> {
    require_admin(caller)?;
    if !valid_tenant_id(tenant) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "TENANT_NOT_FOUND",
            "no such tenant id (letters, digits, '_' or '-', at most 64)",
        ));
    }
    Ok(())
}

async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(tenant): Path<String>,
) -> Result<Json<Value>, ApiError> {
    check(&caller, &tenant)?;
    let config = TenantConfig::load(&state.store, &tenant).await?;
    Ok(Json(json!({"tenant": tenant, "config": config})))
}

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

async fn providers(State(state): State<AppState>) -> Json<Value> {
    Json(json!({ "providers": state.sessions.agents().providers() }))
}
