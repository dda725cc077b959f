//! API keys over HTTP (admin keys), while the server runs.
//!
//! - `POST /v1/keys` `{tenant, admin?, plan?, metrics?, expires_at?}`: 201
//!   with the key itself, shown this once (only its hash is stored).
//! - `GET /v1/keys`: every key ever created, revoked and expired ones
//!   included, with its status; never a secret or a hash.
//! - `DELETE /v1/keys/{id}`: revoke; 204 (again for a key already revoked),
//!   404 `KEY_NOT_FOUND` for an unknown id.
//!
//! POST /v1/keys ──▶ KeyRing::create ──durable write──▶ redb ──then──▶ ring ──▶ 201
//! DELETE /v1/keys/{id} ──▶ KeyRing::revoke ──durable write──▶ redb ──then──▶ ring ──▶ 204
//!
//! The ring changes after the write is durable and before the reply, so
//! the next request already sees it: a new key works, a revoked one is 401.
//! When the server runs open (loopback, no key yet), the local operator is
//! admin and may create the first key here, which ends open mode at once.
//! Revoked keys are kept (listed as `revoked`): a key id never comes back
//! to life, and a server that had keys never runs open again. A created
//! key carries a `notice` when tenant `default` holds sessions made in open
//! mode that this key will not read (see [`crate::tenants::open_mode_notice`]).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::require_admin;
use super::error::ApiError;
use super::extract::ApiJson;
use super::openapi::{error_responses, view_of};
use super::tools::PlanName;
use crate::tenants::{KeyInfo, KeyStatus, NewKey, Plan, Principal};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(revoke))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateKey {
    /// The tenant the key calls as (letters, digits, '_' or '-', at most 64).
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    tenant: String,
    /// May manage tenant configs and keys, and read runtime-wide data and `/metrics`.
    #[serde(default)]
    admin: bool,
    /// The highest plan the key may use: `free`, `pro` or `premium` (default: every plan).
    #[schema(example = "pro")]
    plan: Option<Plan>,
    /// A scrape key: `/metrics` and nothing else (not with `admin`).
    #[serde(default)]
    metrics: bool,
    /// RFC 3339; the key is refused from then on. Must be in the future.
    #[schema(value_type = Option<String>, format = DateTime)]
    expires_at: Option<Timestamp>,
}

/// A key as the API lists it: never the secret, never its hash.
#[derive(Serialize, ToSchema)]
struct KeyView {
    key_id: String,
    tenant: String,
    admin: bool,
    /// The highest plan the key may use.
    #[schema(value_type = PlanName)]
    plan: Plan,
    /// A scrape key (`/metrics` only).
    metrics: bool,
    status: KeyState,
    created_at: Timestamp,
    expires_at: Option<Timestamp>,
    revoked_at: Option<Timestamp>,
}

/// Where a key stands now.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum KeyState {
    Active,
    Expired,
    Revoked,
}

view_of!(KeyInfo => KeyView {
    key_id,
    tenant,
    admin,
    plan,
    metrics,
    status,
    created_at,
    expires_at,
    revoked_at,
});

impl From<KeyStatus> for KeyState {
    fn from(status: KeyStatus) -> Self {
        match status {
            KeyStatus::Active => KeyState::Active,
            KeyStatus::Expired => KeyState::Expired,
            KeyStatus::Revoked => KeyState::Revoked,
        }
    }
}

/// A new key: the key itself (shown once) and how it is listed.
#[derive(Serialize, ToSchema)]
struct CreatedKey {
    /// `cadre_<key_id>_<secret>`: send it as `Authorization: Bearer <key>`.
    /// It is not stored and cannot be shown again.
    key: String,
    #[serde(flatten)]
    view: KeyView,
    /// Present when sessions made in open mode (tenant `default`) exist and
    /// tenant `default` has no key yet: this key does not read them, a key
    /// of tenant `default` does.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    notice: Option<String>,
}

#[derive(Serialize, ToSchema)]
struct KeyList {
    keys: Vec<KeyView>,
}

error_responses!(
    CreateErrors:
    AdminRequired,
    ValidationError = "bad tenant id, unknown plan, admin with metrics, or expires_at not in the future",
    StorageUnavailable
);

#[utoipa::path(
    post,
    path = "/v1/keys",
    operation_id = "create_key",
    summary = "Create an API key (admin); the key is shown once",
    tag = "keys",
    request_body = CreateKey,
    responses(
        (status = 201, description = "The key, shown this once, and its record", body = CreatedKey),
        CreateErrors,
    )
)]
async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(body): ApiJson<CreateKey>,
) -> Result<(StatusCode, Json<CreatedKey>), ApiError> {
    require_admin(&caller)?;
    let mut new = NewKey::tenant(body.tenant);
    new.admin = body.admin;
    new.metrics = body.metrics;
    new.expires_at = body.expires_at;
    if let Some(plan) = body.plan {
        new.plan = plan;
    }
    let (key, record, notice) = state.keys.create(&state.store, &new).await?;
    if let Some(notice) = &notice {
        tracing::warn!(key_id = %record.key_id, "{notice}");
    }
    let created = CreatedKey {
        key,
        view: record.info(Timestamp::now()).into(),
        notice,
    };
    Ok((StatusCode::CREATED, Json(created)))
}

error_responses!(
    ListErrors:
    AdminRequired,
    StorageUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/keys",
    operation_id = "list_keys",
    summary = "Every API key and its status (admin); no secrets",
    tag = "keys",
    responses(
        (status = 200, description = "Every key ever created, by id", body = KeyList),
        ListErrors,
    )
)]
async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
) -> Result<Json<KeyList>, ApiError> {
    require_admin(&caller)?;
    let now = Timestamp::now();
    let keys = crate::tenants::list_keys(&state.store)
        .await?
        .iter()
        .map(|k| k.info(now).into())
        .collect();
    Ok(Json(KeyList { keys }))
}

error_responses!(
    RevokeErrors:
    AdminRequired,
    KeyNotFound,
    StorageUnavailable
);

#[utoipa::path(
    delete,
    path = "/v1/keys/{id}",
    operation_id = "revoke_key",
    summary = "Revoke an API key (admin); refused from the next request on",
    tag = "keys",
    params(("id" = String, Path, description = "Key id (the part after `cadre_`)")),
    responses(
        (status = 204, description = "Revoked (or already revoked)"),
        RevokeErrors,
    )
)]
async fn revoke(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    require_admin(&caller)?;
    let record = state.keys.revoke(&state.store, &id).await?;
    tracing::info!(key_id = %record.key_id, tenant = %record.tenant, "API key revoked");
    Ok(StatusCode::NO_CONTENT)
}
