//! HTTP API (axum): the way users reach sessions, tools and the executor.
//!
//! client ──HTTP──▶ rate limit (per API key) ──▶ router ──▶ one file per resource
//!                                                          ──▶ Sessions, ToolRegistry, ExecutorHandle
//!
//! Bodies are capped at [`MAX_BODY_BYTES`] (413); every error, including
//! unknown routes, is JSON (see [`error`]). A request whose declared body is
//! over the cap is answered 413 after its body is read and dropped (up to
//! [`MAX_DRAIN_BYTES`]), with `Connection: close`: closing a socket that
//! still holds unread data makes the kernel reset it, and the client would
//! lose the 413.

pub mod calls;
pub mod confirmations;
pub mod error;
pub mod events;
pub mod limits;
pub mod rate_limit;
pub mod sessions;
pub mod tools;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{Next, from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http_body_util::BodyExt;
use serde_json::json;

use crate::conversation::Sessions;
use crate::events::EventBus;
use crate::executor::ExecutorHandle;
use crate::store::Store;
use crate::tools::ToolRegistry;
use error::ApiError;
use rate_limit::ApiRateLimit;

pub const MAX_BODY_BYTES: usize = 1 << 20;
/// Largest over-limit body read (and dropped) before answering 413.
pub const MAX_DRAIN_BYTES: usize = 16 << 20;

#[derive(Clone)]
pub struct AppState {
    pub sessions: Sessions,
    pub registry: ToolRegistry,
    pub store: Store,
    pub executor: ExecutorHandle,
    pub events: EventBus,
}

pub fn router(state: AppState, api_limit: ApiRateLimit) -> Router {
    Router::new()
        .route(
            "/healthz",
            get(|| async { axum::Json(json!({"status": "ok"})) }),
        )
        .merge(sessions::routes())
        .merge(tools::routes())
        .merge(calls::routes())
        .merge(confirmations::routes())
        .merge(events::routes())
        .merge(limits::routes())
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "METHOD_NOT_ALLOWED",
                "method not allowed on this route",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(from_fn(refuse_oversized))
        .layer(from_fn_with_state(api_limit, rate_limit::limit))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

async fn refuse_oversized(request: Request, next: Next) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let mut response = match declared {
        Some(n) if n > MAX_BODY_BYTES => {
            drain(request.into_body()).await;
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "PAYLOAD_TOO_LARGE",
                format!("the body is {n} bytes; the limit is {MAX_BODY_BYTES}"),
            )
            .into_response()
        }
        _ => next.run(request).await,
    };
    if response.status() == StatusCode::PAYLOAD_TOO_LARGE {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

async fn drain(body: Body) {
    let mut body = body;
    let mut read = 0usize;
    let reading = async {
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(data) = frame.data_ref() {
                read += data.len();
                if read > MAX_DRAIN_BYTES {
                    break;
                }
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), reading).await;
}
