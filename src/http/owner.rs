//! Cluster mode's seam in the API: a request that belongs to another node.
//!
//! request ──▶ [`maybe_to_owner`] ──(no owner seam: one node)──────────────▶ handler
//!                   └──▶ dyn [`ToOwner`] ──(owned here, or by nobody live)──▶ handler
//!                                 └──(owned by another live node)──▶ the owner's response
//!
//! The API knows that a session or a workflow run may be owned by another
//! node and that its requests may have to be answered from there; it does
//! not know how nodes find or reach each other. That is the adapter's
//! (`cluster::forward`, which the runtime installs when the node is one of
//! a cluster). It runs after authentication, so the adapter sees the
//! caller's [`Principal`](crate::identity::Principal), and before
//! idempotency, so a forwarded request is made idempotent on the node that
//! serves it.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;

/// Serves a request here or answers it from the node that owns what it
/// acts on.
#[async_trait::async_trait]
pub trait ToOwner: Send + Sync {
    /// `next.run(request)` when this node serves it; the owner's response
    /// (or a refusal saying the owner moved) otherwise.
    async fn route(&self, request: Request, next: Next) -> Response;
}

/// The layer as installed: a single node passes everything through.
pub async fn maybe_to_owner(
    State(owner): State<Option<std::sync::Arc<dyn ToOwner>>>,
    request: Request,
    next: Next,
) -> Response {
    match owner {
        Some(owner) => owner.route(request, next).await,
        None => next.run(request).await,
    }
}
