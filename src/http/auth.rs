//! Authentication: every request's caller, from `Authorization: Bearer`.
//!
//! request ──▶ authenticate ──Principal (request extension)──▶ handlers
//!                 ├─ address over its failure budget ──▶ 429 RATE_LIMITED (key not checked)
//!                 ├─ no key, or a refused one (counted) ──▶ 401 UNAUTHORIZED
//!                 └─ a scrape key anywhere but `/metrics` ──▶ 403 SCRAPE_ONLY_KEY
//!
//! With keys configured, a request without a valid key is 401 (the body
//! never echoes the key; it says whether the key is unknown, revoked or
//! expired, the last two only once its secret matched); `/healthz` and
//! `/readyz` stay open for probes, and so do `/openapi.json` and `/docs`
//! (the API's description, no data). With no key ever created the server
//! runs open: every request is the `default` tenant with admin rights and
//! every plan. The key ring is read on every request, so a key created or
//! revoked through `/v1/keys` counts from the next request on, and the
//! first key ends open mode.
//!
//! The visitor WebSocket (`GET /v1/sessions/{id}/ws`) also takes
//! `?token=` instead of the header, for browsers: a single-use token from
//! `POST /v1/sessions/{id}/ws-token` ([`crate::tenants::tokens`]) stands
//! for the key that asked for it, for that session only, while that key
//! is active. The header wins when both are sent; a refused token counts
//! as a wrong key.
//!
//! Wrong keys are counted per client address ([`super::auth_limit`]); an
//! address past its budget is answered 429 with `Retry-After`.
//!
//! Handlers take the caller as `Extension<Principal>`; [`require_admin`]
//! guards admin-only routes and [`require_scraper`] `/metrics`. A metrics
//! (scrape) key is refused here everywhere but `/metrics` (403
//! `SCRAPE_ONLY_KEY`, not 401: the key is valid, its scope is not), so no
//! handler has to think of it.

use std::net::SocketAddr;
use std::time::Instant;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::auth_limit::{FailedAuths, client_of};
use super::error::ApiError;
use super::rate_limit::too_many_requests;
use crate::error_code::ErrorCode;
use crate::tenants::{KeyRing, Principal};

/// Where Prometheus scrapes; the one path a metrics key may read.
pub const METRICS_PATH: &str = "/metrics";

/// The state of [`authenticate`]: the live key ring and the failure
/// budget of every address.
#[derive(Clone)]
pub struct Auth {
    pub keys: KeyRing,
    pub failures: FailedAuths,
}

pub async fn authenticate(State(auth): State<Auth>, mut request: Request, next: Next) -> Response {
    if auth.keys.is_open() || super::openapi::is_public(request.uri().path()) {
        request.extensions_mut().insert(Principal::open());
        return next.run(request).await;
    }
    let client = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .and_then(|ConnectInfo(addr)| client_of(addr.ip()));
    let now = Instant::now();
    if let Some(wait) = auth.failures.blocked(client, now) {
        tracing::debug!("failed-authentication budget of an address spent");
        return too_many_requests("too many failed authentications from this address", wait);
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, key) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
        });
    let Some(presented) = presented else {
        if let Some((session, token)) = ws_token(&request) {
            return match auth.keys.redeem_ws_token(&token, session) {
                Ok(principal) => {
                    request.extensions_mut().insert(principal);
                    next.run(request).await
                }
                Err(refusal) => {
                    auth.failures.record(client, now);
                    tracing::debug!(reason = %refusal, "WebSocket token refused");
                    unauthorized(
                        "the WebSocket token is not valid (unknown, used, expired, for another session, or its key was revoked)",
                    )
                }
            };
        }
        return unauthorized("an API key is required: send `Authorization: Bearer <key>`");
    };
    match auth.keys.verify(presented) {
        Ok(principal) => {
            if principal.metrics_only && request.uri().path() != METRICS_PATH {
                return ApiError::new(
                    ErrorCode::ScrapeOnlyKey,
                    "this is a metrics key: it may read /metrics and nothing else",
                )
                .into_response();
            }
            request.extensions_mut().insert(principal);
            next.run(request).await
        }
        Err(refusal) => {
            auth.failures.record(client, now);
            tracing::debug!(reason = %refusal, "authentication failed");
            unauthorized(&refusal.to_string())
        }
    }
}

/// The session and `?token=` of a visitor WebSocket request
/// (`GET /v1/sessions/{id}/ws?token=…`); nothing for any other request, so
/// a token opens that socket and nothing else.
fn ws_token(request: &Request) -> Option<(&str, String)> {
    if request.method() != axum::http::Method::GET {
        return None;
    }
    let session = request
        .uri()
        .path()
        .strip_prefix("/v1/sessions/")?
        .strip_suffix("/ws")
        .filter(|id| !id.is_empty() && !id.contains('/'))?;
    let query = request.uri().query()?;
    url::form_urlencoded::parse(query.as_bytes())
        .find(|(name, _)| name == "token")
        .map(|(_, token)| (session, token.into_owned()))
}

fn unauthorized(message: &str) -> Response {
    let mut response = ApiError::new(ErrorCode::Unauthorized, message).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    response
}

/// Refuses callers without an admin key.
pub fn require_admin(principal: &Principal) -> Result<(), ApiError> {
    if principal.admin {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::AdminRequired,
            "this needs an admin API key",
        ))
    }
}

/// Refuses callers that may not read `/metrics`: neither admin nor metrics keys.
pub fn require_scraper(principal: &Principal) -> Result<(), ApiError> {
    if principal.may_scrape() {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::MetricsKeyRequired,
            "/metrics needs an admin key or a metrics key (`cadre keys create --metrics`)",
        ))
    }
}
