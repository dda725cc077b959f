//! HTTP API (axum): the way users reach sessions and tools.
//!
//! client ──HTTP──▶ router ──▶ sessions.rs / tools.rs ──▶ Sessions, ToolRegistry
//!
//! One file per resource. Bodies are capped at [`MAX_BODY_BYTES`] (413);
//! every error, including unknown routes, is JSON (see [`error`]).

pub mod error;
pub mod sessions;
pub mod tools;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::get;
use serde_json::json;

use crate::conversation::Sessions;
use crate::store::Store;
use crate::tools::ToolRegistry;
use error::ApiError;

pub const MAX_BODY_BYTES: usize = 1 << 20;

#[derive(Clone)]
pub struct AppState {
    pub sessions: Sessions,
    pub registry: ToolRegistry,
    pub store: Store,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|| async { axum::Json(json!({"status": "ok"})) }),
        )
        .merge(sessions::routes())
        .merge(tools::routes())
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "METHOD_NOT_ALLOWED",
                "method not allowed on this route",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}
