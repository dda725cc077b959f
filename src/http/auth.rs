//! Authentication: every request's caller, from `Authorization: Bearer`.
//!
//! request ──▶ authenticate ──Principal (request extension)──▶ handlers
//!
//! With keys configured, a request without a valid key is 401 (the body
//! never echoes the key); `/healthz` and `/readyz` stay open for probes, and
//! so do `/openapi.json` and `/docs` (the API's description, no data). With no key ever
//! created the server runs open: every request is the `default` tenant with
//! admin rights. Handlers take the caller as `Extension<Principal>` and
//! [`require_admin`] guards admin-only routes.

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use crate::error_code::ErrorCode;
use crate::tenants::{KeyRing, Principal};

pub async fn authenticate(
    State(keys): State<KeyRing>,
    mut request: Request,
    next: Next,
) -> Response {
    if keys.is_open() || super::openapi::is_public(request.uri().path()) {
        request.extensions_mut().insert(Principal::open());
        return next.run(request).await;
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
        return unauthorized("an API key is required: send `Authorization: Bearer <key>`");
    };
    match keys.verify(presented) {
        Some(principal) => {
            request.extensions_mut().insert(principal);
            next.run(request).await
        }
        None => unauthorized("the API key is not valid"),
    }
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
