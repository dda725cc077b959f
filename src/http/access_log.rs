//! The request log: one INFO line per answered request.
//!
//! client ──▶ access log (outermost, times the whole exchange) ──▶ host, auth, limits ──▶ router
//!                 ▲                                                                       │
//!                 └──── the route's template and the caller's tenant (response extensions)┘
//!
//! Each line has the method, the route's *template* (`/v1/sessions/{id}`,
//! never the concrete path: ids and query strings stay out of logs), the
//! status, the latency in milliseconds and the caller's tenant (`-` when the
//! request was refused before a key was checked). Never a key, a header or
//! a body. The line's target is `cadre::http::access_log`, so
//! `RUST_LOG=cadre::http::access_log=off` silences it like `[server]
//! request_log = false` does. Requests no route matched log `<unmatched>`.
//! Streams (SSE, WebSocket, MCP) log when their response head is sent.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;

/// What the router learnt about a request, carried out on its response.
#[derive(Clone)]
struct Tag {
    route: String,
    tenant: Option<String>,
}

/// Inside the router (a route layer): records the matched template and the
/// authenticated tenant on the response.
pub async fn tag(request: Request, next: Next) -> Response {
    let tag = Tag {
        route: request
            .extensions()
            .get::<MatchedPath>()
            .map_or_else(|| "<unmatched>".to_string(), |m| m.as_str().to_string()),
        tenant: request
            .extensions()
            .get::<crate::tenants::Principal>()
            .map(|p| p.tenant.clone()),
    };
    let mut response = next.run(request).await;
    response.extensions_mut().insert(tag);
    response
}

/// Outermost: logs the exchange once its response head is ready.
pub async fn log(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let response = next.run(request).await;
    let tag = response.extensions().get::<Tag>();
    tracing::info!(
        target: "cadre::http::access_log",
        method = %method,
        route = %tag.map_or("<unmatched>", |t| t.route.as_str()),
        status = response.status().as_u16(),
        latency_ms = format_args!("{:.1}", started.elapsed().as_secs_f64() * 1000.0),
        tenant = %tag.and_then(|t| t.tenant.as_deref()).unwrap_or("-"),
        "request"
    );
    response
}
