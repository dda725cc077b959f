//! Probes: `/healthz` (liveness, with the storage's state) and `/readyz`
//! (readiness: can the server take writes), public like the document.
//!
//! load balancer / orchestrator ──▶ healthz | readyz ──▶ Store::health (+ each [`super::Dependency`]'s ping: Redis in cluster mode)
//!
//! Decision: only the store decides readiness. Redis holds nothing that is
//! the record and every node shares it, so a Redis outage taking every
//! node out of the balancer would gain nothing: the limits themselves
//! refuse (`LIMITS_UNAVAILABLE`, `[cluster] redis_failure = "closed"`) or
//! fall back to each node's own (`"local"`).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use jiff::Timestamp;
use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::openapi::error_responses;
use crate::error_code::ErrorCode;
use crate::store::StoreHealth;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
}

/// Whether the store takes writes.
#[derive(Serialize, ToSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
enum StorageHealth {
    Ok,
    /// Writes are refused; reads are served from what was committed.
    Degraded {
        since: Timestamp,
    },
}

impl From<StoreHealth> for StorageHealth {
    fn from(health: StoreHealth) -> Self {
        match health {
            StoreHealth::Ok => StorageHealth::Ok,
            // The reason is for logs, not for clients.
            StoreHealth::Degraded { since, reason: _ } => StorageHealth::Degraded { since },
        }
    }
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum LiveStatus {
    Ok,
    Degraded,
}

/// The `/healthz` body.
#[derive(Serialize, ToSchema)]
struct Health {
    status: LiveStatus,
    storage: StorageHealth,
}

/// Liveness: 200 while the process serves HTTP. The body says whether
/// storage takes writes: `{"status": "ok"}` or `{"status": "degraded",
/// "storage": {"status": "degraded", "since"}}`; a full disk is not
/// a reason to restart the process (reads work, writes resume by themselves).
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    summary = "Liveness, with the storage's state",
    tag = "health",
    security(()),
    responses((status = 200, description = "The server is up; `degraded` while storage refuses writes", body = Health,
        example = json!({"status": "ok", "storage": {"status": "ok"}})))
)]
async fn healthz(State(state): State<AppState>) -> Json<Health> {
    let storage = StorageHealth::from(state.store.health());
    let status = match storage {
        StorageHealth::Ok => LiveStatus::Ok,
        StorageHealth::Degraded { .. } => LiveStatus::Degraded,
    };
    Json(Health { status, storage })
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum ReadyStatus {
    Ready,
}

/// The store: which backend, and whether it takes writes.
#[derive(Serialize, ToSchema)]
struct StoreDependency {
    /// `redb` or `postgres`.
    backend: &'static str,
    health: StorageHealth,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum PingStatus {
    Ok,
    Unreachable,
}

/// A dependency beside the store (cluster mode: `redis`): whether it
/// answers a ping.
#[derive(Serialize, ToSchema)]
struct Pinged {
    status: PingStatus,
}

/// What readiness depends on: the store, and each other dependency by
/// its name (cluster mode: `redis`).
#[derive(Serialize, ToSchema)]
struct Dependencies {
    store: StoreDependency,
    #[serde(flatten)]
    others: BTreeMap<&'static str, Pinged>,
}

/// The `/readyz` body.
#[derive(Serialize, ToSchema)]
struct Readiness {
    status: ReadyStatus,
    /// Cluster mode: this node's `[cluster] node_id`; `null` otherwise.
    node: Option<String>,
    dependencies: Dependencies,
}

error_responses!(
    ReadyzErrors:
    StorageUnavailable = "storage refuses writes (reads are served)"
);

/// Readiness: 503 `STORAGE_UNAVAILABLE` while writes are refused, so a load
/// balancer can send traffic elsewhere; else 200 `{"status": "ready"}`.
/// Each dependency is reported (`dependencies`: the store, and Redis in
/// cluster mode).
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    summary = "Readiness: can the server take writes",
    tag = "health",
    security(()),
    responses(
        (status = 200, description = "Ready: the store takes writes; each dependency reported", body = Readiness,
            example = json!({"status": "ready", "node": "n1", "dependencies": {"store": {"backend": "postgres", "health": {"status": "ok"}}, "redis": {"status": "ok"}}})),
        ReadyzErrors,
    )
)]
async fn readyz(State(state): State<AppState>) -> Response {
    let store = state.store.health();
    let mut others = BTreeMap::new();
    for dependency in &state.dependencies {
        let name = dependency.name();
        let status = match dependency.ping().await {
            Ok(()) => PingStatus::Ok,
            Err(e) => {
                tracing::warn!(error = %e, dependency = name, "readiness: a dependency does not answer");
                PingStatus::Unreachable
            }
        };
        others.insert(name, Pinged { status });
    }
    let dependencies = Dependencies {
        store: StoreDependency {
            backend: state.store.backend_name(),
            health: store.clone().into(),
        },
        others,
    };
    match store {
        StoreHealth::Ok => Json(Readiness {
            status: ReadyStatus::Ready,
            node: state.store.node_id().map(str::to_string),
            dependencies,
        })
        .into_response(),
        StoreHealth::Degraded { .. } => ApiError::new(
            ErrorCode::StorageUnavailable,
            "storage does not accept writes; reads are served",
        )
        .with_details(json!({
            "storage": StorageHealth::from(store),
            "dependencies": dependencies,
        }))
        .into_response(),
    }
}
