//! The tenant's share of the store, checked on a request's declared
//! length before its body is read.
//!
//! POST /v1/sessions/{id}/messages, POST /v1/tools/{name}/invoke
//!     ──[`StorageRoom`] (an extractor, before the body's)──▶ Content-Length, the caller's tenant
//!         ──StorageGate::precheck──▶ ok: the body is read, and admitted as before
//!                                  ├─ the share's bucket is empty ──▶ 429 RATE_LIMITED, Retry-After
//!                                  └─ the length is over what the quota has left ──▶ 413 STORAGE_QUOTA_EXCEEDED
//!
//! Without it a body the share or the quota would refuse was read whole
//! (up to the 1 MiB cap) before it was refused: a tenant at its quota
//! could keep sending megabytes that cadre read only to drop. The refusals
//! are the ones the later check gives (`conversation::storage` says when
//! each applies), in the same shape.
//!
//! Decided: a refusal here closes the connection (`Connection: close`).
//! The body is never read; hyper would read what already arrived and then
//! give up on the connection anyway (it cannot find the next request), and
//! saying so lets the client know not to send the body. A client that had
//! already sent part of its body may see the connection reset instead of
//! the answer (the kernel resets a socket closed with unread data); one
//! that sends `Expect: 100-continue` gets the answer before it sends
//! anything. What the refusal must not do is wait for a body that never
//! comes: a client declaring a body and sending none would hold its
//! connection slot until it gave up.
//!
//! Limits: a keyed request (`Idempotency-Key`) has its body read by the
//! idempotency layer, which runs first, and is checked after that; MCP's
//! `tools/call` (`/mcp`) is read by rmcp and checked when the call is
//! admitted; bodies declared under 64 KiB are read and checked after
//! ([`crate::conversation::storage::PRECHECK_FROM_BYTES`]).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;
use crate::conversation::SessionError;
use crate::conversation::storage::{PRECHECK_FROM_BYTES, StorageRefusal};
use crate::tenants::Principal;

/// Taken before a body that will be stored for the caller's tenant (a
/// message, a direct tool call's arguments): refuses the request, unread,
/// when its `Content-Length` alone decides that the tenant's write share
/// or storage quota would refuse it (see the module doc).
pub struct StorageRoom;

impl FromRequestParts<AppState> for StorageRoom {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        let Some(tenant) = parts
            .extensions
            .get::<Principal>()
            .map(|p| p.tenant.clone())
        else {
            return Ok(StorageRoom);
        };
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let refusal = match check(state, &tenant, declared).await {
            Ok(()) => return Ok(StorageRoom),
            Err(e) => e,
        };
        let mut response = refusal.into_response();
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        Err(response)
    }
}

async fn check(state: &AppState, tenant: &str, declared: u64) -> Result<(), ApiError> {
    // A smaller body is not held against the quota here: no config read.
    let quota = if declared >= PRECHECK_FROM_BYTES {
        state.sessions.tenant_config(tenant).await?.max_storage_mb
    } else {
        None
    };
    let gate = state.sessions.storage_gate();
    match gate.precheck(&state.store, tenant, declared, quota).await {
        Ok(()) => Ok(()),
        Err(StorageRefusal::Share(s)) => Err(SessionError::from(s).into()),
        Err(StorageRefusal::Quota(q)) => Err(SessionError::from(q).into()),
        Err(StorageRefusal::Store(e)) => Err(SessionError::from(e).into()),
    }
}
