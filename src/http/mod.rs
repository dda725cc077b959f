//! HTTP API (axum): the way users reach sessions, tools and the executor.
//!
//! listener ──▶ [`connections`] (timeouts, caps per address and in total)
//! client ──HTTP──▶ [`host`] (open mode: loopback names only) ──▶ auth (key ring; failed keys per address) ──▶ rate limit (per API key) ──▶ router ──▶ one file per resource
//!                                                          ──▶ Sessions, ToolRegistry, ExecutorHandle
//! MCP client ──▶ the same layers ──▶ `/mcp` (streamable HTTP, [`crate::mcp::server`])
//! browser ──▶ `/console/` (static files compiled in, public; [`console`]) ──fetch with the key──▶ the same API
//! keyed POSTs (`Idempotency-Key`, five routes) ──▶ [`idempotency`] (replay, wait, or run and store) ──▶ their handler
//! a message, a direct tool call ──▶ [`storage_room`] (the tenant's share and quota, on `Content-Length`, before the body) ──▶ their handler
//!
//! Bodies are capped at [`MAX_BODY_BYTES`] (413); every error, including
//! unknown routes, is JSON (see [`error`]). Handlers take their bodies and
//! queries through [`extract`], which holds them to the published document
//! (a body that breaks its schema, or a query that does not deserialize, is
//! a 422). Rejections that axum's own extractors write as plain text (a
//! path segment that is not UTF-8) are rewritten into the same shape by
//! [`json_errors`], so no error leaves the API as text. The document served
//! is the server's own: without API keys it asks for none (see [`openapi`]).
//! A request whose declared body is over the cap is answered 413 after its
//! body is read and dropped (up to [`MAX_DRAIN_BYTES`]), with `Connection:
//! close`: closing a socket that still holds unread data makes the kernel
//! reset it, and the client would lose the 413.

pub mod a2a;
pub mod access_log;
pub mod agents;
pub mod assist;
pub mod auth;
pub mod auth_limit;
pub mod caller;
pub mod calls;
pub mod client_addr;
pub mod client_shapes;
pub mod confirmations;
pub mod connections;
pub mod console;
pub mod error;
pub mod events;
pub mod extract;
pub mod fork;
pub mod health;
pub mod host;
pub mod idempotency;
pub mod keys;
pub mod limits;
pub mod memory;
pub mod openai;
pub mod openapi;
pub mod owner;
pub mod rate_limit;
pub mod schedules;
pub mod sessions;
pub mod storage_room;
pub mod streams;
pub mod tenants;
pub mod tools;
pub mod turn_log;
pub mod turn_stream;
pub mod usage;
pub mod webhooks;
pub mod workflows;
pub mod ws;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{Next, from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;

use crate::conversation::Sessions;
use crate::error_code::ErrorCode;
use crate::events::EventBus;
use crate::executor::ExecutorHandle;
use crate::store::Store;
use crate::tenants::KeyRing;
use crate::tools::ToolRegistry;
use crate::workflow::Workflows;
use error::ApiError;
use rate_limit::ApiRateLimit;

pub const MAX_BODY_BYTES: usize = 1 << 20;
/// Largest over-limit body read (and dropped) before answering 413.
pub const MAX_DRAIN_BYTES: usize = 16 << 20;

/// What every handler reads: one `Arc`, so the clone axum makes per
/// extractor and per middleware layer is one reference count, not one per
/// field (the load benchmark's profile showed the field-wise clones and
/// drops at about 2 % of a turn's CPU).
#[derive(Clone)]
pub struct AppState(std::sync::Arc<AppShared>);

impl AppState {
    pub fn new(shared: AppShared) -> Self {
        AppState(std::sync::Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = AppShared;

    fn deref(&self) -> &AppShared {
        &self.0
    }
}

pub struct AppShared {
    pub sessions: Sessions,
    pub registry: ToolRegistry,
    pub store: Store,
    pub executor: ExecutorHandle,
    pub events: EventBus,
    pub workflows: Workflows,
    /// The live key ring: read by authentication on every request, changed
    /// by `/v1/keys`.
    pub keys: KeyRing,
    /// Cancelled at shutdown: ends the open `/mcp` sessions.
    pub mcp_shutdown: tokio_util::sync::CancellationToken,
    /// The events of the turns streamed (or run in the background) here,
    /// kept for clients that reconnect ([`turn_log`]).
    pub turn_logs: turn_log::TurnLogs,
    /// Cluster mode: sends a session's requests to its owner ([`owner`]).
    pub forward: Option<std::sync::Arc<dyn owner::ToOwner>>,
    /// What `/readyz` reports beside the store (cluster mode: Redis).
    pub dependencies: Vec<std::sync::Arc<dyn Dependency>>,
    /// `/v1/schedules` ([`crate::schedules`]).
    pub schedules: crate::schedules::Schedules,
    /// `webhook` targets' checks, `/v1/webhooks/deliveries` ([`crate::webhooks`]).
    pub webhooks: crate::webhooks::Webhooks,
    /// `/v1/memory` ([`crate::memory`]).
    pub memory: crate::memory::Memory,
}

/// A dependency `/readyz` reports beside the store (cluster mode: Redis).
/// It never decides readiness ([`health`] says why).
#[async_trait::async_trait]
pub trait Dependency: Send + Sync {
    /// Its key under `dependencies`.
    fn name(&self) -> &'static str;
    /// Whether it answers now; the error is logged, never sent.
    async fn ping(&self) -> Result<(), Box<dyn std::error::Error + Send + Sync>>;
}

/// Every route the server serves, and the OpenAPI document that describes
/// them all but `/openapi.json` and `/docs` themselves. Both come from the
/// handlers' `#[utoipa::path]` annotations (see [`openapi`]). The document
/// is a keyed server's; [`router`] serves an open server's its own.
pub fn routes() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let (routes, doc) = api_routes();
    (routes.merge(openapi::routes(doc.clone())), doc)
}

/// The API's routes (without `/openapi.json` and `/docs`) and their document.
fn api_routes() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let (routes, mut doc) = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(health::routes())
        .merge(sessions::routes())
        .merge(fork::routes())
        .merge(turn_stream::routes())
        .merge(agents::routes())
        .merge(tools::routes())
        .merge(calls::routes())
        .merge(confirmations::routes())
        .merge(events::routes())
        .merge(limits::routes())
        .merge(tenants::routes())
        .merge(keys::routes())
        .merge(usage::routes())
        .merge(assist::routes())
        .merge(ws::routes())
        .merge(workflows::routes())
        .merge(schedules::routes())
        .merge(webhooks::routes())
        .merge(memory::routes())
        .split_for_parts();
    idempotency::document(&mut doc);
    openapi::CommonErrors.modify(&mut doc);
    (routes, doc)
}

/// The whole HTTP API: [`routes`] plus `/mcp`, MCP's streamable HTTP
/// transport. `/mcp` speaks MCP's own JSON-RPC protocol (its contract is the
/// MCP specification), so the OpenAPI document does not describe it; it sits
/// behind the same key and rate-limit layers as everything else.
/// `failed_auths`: the failure budget of client addresses ([`auth_limit`]);
/// `request_log`: one INFO line per request ([`access_log`]).
pub fn router(
    state: AppState,
    api_limit: ApiRateLimit,
    failed_auths: auth_limit::FailedAuths,
    request_log: bool,
) -> Router {
    let keys = state.keys.clone();
    let mcp = crate::mcp::server::http_service(
        crate::mcp::McpServerDeps {
            registry: state.registry.clone(),
            executor: state.executor.clone(),
            sessions: state.sessions.clone(),
            // Over HTTP a person decides through `/v1/confirmations`.
            confirmation_tools: false,
        },
        // The loopback-only Host check of an open server is [`host`]'s,
        // against the live key ring, for `/mcp` as for every route.
        true,
        MAX_BODY_BYTES,
        // A key holds at most as many MCP sessions as streams: at the cap,
        // its least recently used session ends for the new one.
        api_limit.streams().max(),
        state.mcp_shutdown.clone(),
    );
    api_limit.streams().end_with_keys(keys.clone());
    let (routes, mut doc) = api_routes();
    if keys.is_open() {
        openapi::open_mode(&mut doc);
    }
    let app = routes
        .merge(openapi::routes(doc))
        .merge(console::routes())
        .merge(openai::routes())
        .route_service("/mcp", streams::count_get_streams(mcp))
        // A2A v1.0 (JSON-RPC and HTTP+JSON): its own specification, like `/mcp`.
        .merge(a2a::routes())
        .route_layer(from_fn(access_log::tag))
        .route_layer(from_fn_with_state(
            idempotency::Idempotency::new(state.store.clone()),
            idempotency::idempotent,
        ))
        .route_layer(from_fn_with_state(
            state.forward.clone(),
            owner::maybe_to_owner,
        ))
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                ErrorCode::MethodNotAllowed,
                "method not allowed on this route",
            )
        })
        .layer(from_fn(json_errors))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(from_fn(refuse_oversized))
        .layer(from_fn_with_state(api_limit, rate_limit::limit))
        .layer(from_fn_with_state(
            auth::Auth {
                keys: keys.clone(),
                failures: failed_auths,
            },
            auth::authenticate,
        ))
        .layer(from_fn_with_state(keys, host::loopback_only))
        .layer(from_fn(openai::openai_errors))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state);
    if request_log {
        app.layer(from_fn(access_log::log))
    } else {
        app
    }
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
                ErrorCode::PayloadTooLarge,
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

/// Longest plain-text error body kept as the message of its JSON rewrite.
const MAX_PLAIN_ERROR_BYTES: usize = 16 << 10;

/// Rewrites an error response that is not JSON into `{"error": {"code",
/// "message"}}`, keeping its status, its text as the message and its other
/// headers (`Allow`, `Retry-After`, `Connection`).
async fn json_errors(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, MAX_PLAIN_ERROR_BYTES)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    let code = match status {
        StatusCode::NOT_FOUND => ErrorCode::NotFound,
        StatusCode::METHOD_NOT_ALLOWED => ErrorCode::MethodNotAllowed,
        StatusCode::UPGRADE_REQUIRED => ErrorCode::UpgradeRequired,
        StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::PayloadTooLarge,
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ErrorCode::UnsupportedMediaType,
        StatusCode::UNPROCESSABLE_ENTITY => ErrorCode::ValidationError,
        StatusCode::TOO_MANY_REQUESTS => ErrorCode::RateLimited,
        s if s.is_server_error() => ErrorCode::InternalError,
        _ => ErrorCode::BadRequest,
    };
    // The status stays what was answered (e.g. 408, 503 from a layer).
    let mut rewritten = ApiError::new(code, message)
        .with_status(status)
        .into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            rewritten.headers_mut().insert(name, value.clone());
        }
    }
    rewritten
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::{Path, Query};
    use axum::routing::get;
    use tower::ServiceExt;

    async fn call(app: Router, uri: &str) -> (StatusCode, serde_json::Value) {
        let request = Request::builder().uri(uri).body(Body::empty()).unwrap();
        let response = app.oneshot(request).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, serde_json::from_slice(&body).expect("a JSON body"))
    }

    #[tokio::test]
    async fn query_and_path_rejections_come_out_as_json_errors() {
        #[derive(serde::Deserialize)]
        struct Limit {
            #[allow(dead_code)]
            limit: usize,
        }
        let app = Router::new()
            .route("/q", get(|Query(_): Query<Limit>| async { "ok" }))
            .route("/p/{name}", get(|Path(_): Path<String>| async { "ok" }))
            .layer(from_fn(json_errors));

        let (status, body) = call(app.clone(), "/q?limit=abc").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body["error"]["code"], "BAD_REQUEST");
        assert!(body["error"]["message"].as_str().unwrap().contains("limit"));

        let (status, body) = call(app, "/p/%FF").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body["error"]["code"], "BAD_REQUEST");
        assert!(body["error"]["message"].as_str().unwrap().contains("UTF-8"));
    }
}
