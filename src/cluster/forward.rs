//! Cluster mode: a session's requests go to the node that owns it.
//!
//! client ──▶ any node ──http::owner::ToOwner──▶ [`Forward`] ──(not live here, owned by a live node)──▶ owner node
//!        ◀────────────── the owner's response, streamed back ◀──────────────────────────────────┘
//!
//! The API owns the seam ([`ToOwner`]: serve here or answer from the
//! owner); this adapter decides who owns what, from the store's ownership
//! rows, and reaches the owner over HTTP. The runtime installs it when the
//! store names this node (cluster mode).
//!
//! HAProxy hashes the session id, so a session's requests usually reach
//! the node whose conversation actor is warm; routing is only for speed.
//! When the node set changes (a node dies, comes back, a balancer flaps),
//! a request can reach a node that does not own its session. Decision:
//! that node takes the session over when it may ([`crate::store::owners`]:
//! no owner, or the owner's heartbeat is stale), and otherwise *forwards*
//! the request to the owner, at the address the owner advertised, and
//! streams the answer back (SSE included). Answering "retry elsewhere"
//! instead would need the balancer to know the owner, which it does not.
//!
//! - Only requests that reach a conversation are forwarded: `POST`,
//!   `PUT`, `PATCH` and `DELETE` under `/v1/sessions/{id}`. Reads (history,
//!   turns, summary) come from the shared store on any node, and so does
//!   a fork (`POST …/fork`: it reads finished turns and writes a new
//!   session; claiming the parent would gain nothing).
//! - A forwarded request carries `X-Cadre-Forwarded-By`; one that already
//!   has it is never forwarded again (no loops): it gets 503
//!   `SESSION_MOVED` with `Retry-After`, and the client retries with its
//!   `Idempotency-Key`. The header only stops forwarding, so a client that
//!   sets it gains nothing.
//! - The body is read whole first (at most the server's body limit, as
//!   for any request) so it can be sent on; the client's headers go as
//!   they came, but hop-by-hop ones, so the owner authenticates the same key.
//! - The owner unreachable (it died after its last heartbeat): 503
//!   `SESSION_MOVED`; once its heartbeat is stale the next request takes
//!   the session over here.
//! - Only the session's own tenant moves it: the caller's key must name
//!   the session's tenant before anything is claimed or forwarded.
//!   Another tenant's request (a guess, a probe) goes to the handler here,
//!   which answers 404 as for a session that does not exist, so it
//!   neither takes the session over (an epoch bump) nor reaches the owner.
//! - Workflow runs follow the same rule by run id: `POST
//!   …/runs/{id}/resume`, `…/cancel` and `GET …/runs/{id}/events` go to
//!   the node running the run (its events happen there) when that is
//!   another live node and the caller's tenant owns the run; a run whose
//!   owner died is served here (the handler takes it over). Reads of a
//!   run come from the shared store on any node.
//! - WebSocket upgrades are not forwarded (the owner's balancer hash is
//!   where a visitor's socket should be opened); they are served here.
//!   Nor is `POST …/ws-token`: tokens live in the memory of the node that
//!   issued them, and the socket is opened where the token was asked for
//!   (the same session path, so the same balancer hash); a token issued
//!   by the owner would be unknown to the node the socket reaches. While
//!   another live node holds the session, the socket's messages are
//!   answered `SESSION_MOVED` until the owner lets it go (idle), then
//!   this node takes it over.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::TryStreamExt;

use crate::conversation::Sessions;
use crate::error_code::ErrorCode;
use crate::http::error::ApiError;
use crate::http::owner::ToOwner;
use crate::identity::Principal;
use crate::store::{RunOwner, Store, StoreError};

/// Set on a request one node sends on to another.
pub const FORWARDED_BY: &str = "x-cadre-forwarded-by";
/// Set on every response of a cluster node: which node answered.
pub const NODE_HEADER: &str = "x-cadre-node";

/// What the forwarding layer needs.
#[derive(Clone)]
pub struct Forward {
    pub sessions: Sessions,
    pub store: Store,
    pub node_id: String,
    pub client: reqwest::Client,
    pub max_body: usize,
}

impl Forward {
    pub fn new(sessions: Sessions, store: Store, node_id: String, max_body: usize) -> Self {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(std::time::Duration::from_secs(2))
            .pool_idle_timeout(std::time::Duration::from_secs(30))
            .build()
            .expect("the forwarding HTTP client");
        Forward {
            sessions,
            store,
            node_id,
            client,
            max_body,
        }
    }
}

/// The session id of a request that reaches a conversation, if any.
fn session_of(method: &Method, path: &str) -> Option<String> {
    let rest = path.strip_prefix("/v1/sessions/")?;
    // A turn's event stream is read where the turn runs: its log is
    // there (`crate::http::turn_log`).
    let follows_a_turn = *method == Method::GET && rest.ends_with("/events");
    if !follows_a_turn
        && !matches!(
            *method,
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE
        )
    {
        return None;
    }
    // A fork reads the shared store (exact for the finished turn it
    // forks) and writes a new session: served where it arrives, with no
    // claim on the parent (`conversation::fork`).
    if rest.ends_with("/ws-token") || rest.ends_with("/fork") {
        return None;
    }
    let id = rest.split('/').next()?;
    (!id.is_empty() && id.len() <= 128).then(|| id.to_string())
}

/// Sets [`NODE_HEADER`] on every response: which node answered.
#[async_trait::async_trait]
impl ToOwner for Forward {
    async fn route(&self, request: Request, next: Next) -> Response {
        let node = HeaderValue::from_str(&self.node_id).ok();
        let mut response = route(self, request, next).await;
        if let Some(node) = node {
            response
                .headers_mut()
                .entry(HeaderName::from_static(NODE_HEADER))
                .or_insert(node);
        }
        response
    }
}

/// The run id of a request that acts on, or follows, a running workflow
/// run: resume, cancel, and its event stream.
fn run_of(method: &Method, path: &str) -> Option<String> {
    let (id, action) = path.strip_prefix("/v1/workflows/runs/")?.split_once('/')?;
    let acts = matches!(
        (method, action),
        (&Method::POST, "resume" | "cancel") | (&Method::GET, "events")
    );
    (acts && !id.is_empty() && id.len() <= 128).then(|| id.to_string())
}

/// A run's request goes to the node running it, when that is another live
/// node and the caller's tenant owns the run; else it is served here (the
/// handler claims a run whose owner died, or says it is not found).
async fn route_run(fwd: &Forward, id: &str, request: Request, next: Next) -> Response {
    let caller = request.extensions().get::<Principal>().map(|p| &p.tenant);
    let addr = match fwd.store.run_owner(id).await {
        Ok(Some(RunOwner {
            tenant,
            owner,
            addr: Some(addr),
            running_there: true,
        })) if owner != fwd.node_id && Some(&tenant) == caller => addr,
        _ => return next.run(request).await,
    };
    to(fwd, &addr, "workflow run", id, request).await
}

async fn route(fwd: &Forward, request: Request, next: Next) -> Response {
    if let Some(run) = run_of(request.method(), request.uri().path()) {
        return route_run(fwd, &run, request, next).await;
    }
    let Some(id) = session_of(request.method(), request.uri().path()) else {
        return next.run(request).await;
    };
    let upgrade = request.headers().contains_key(header::UPGRADE);
    if upgrade || fwd.sessions.is_live(&id) {
        return next.run(request).await;
    }
    let Some(scope) = request
        .extensions()
        .get::<Principal>()
        .map(Principal::scope)
    else {
        return next.run(request).await;
    };
    match fwd.sessions.get(&scope, &id).await {
        Ok(_) => {}
        // Not the caller's, not there, or the store failed: the handler
        // says which.
        _ => return next.run(request).await,
    }
    let addr = match fwd.store.claim_session(&id).await {
        Ok(_) => return next.run(request).await,
        Err(StoreError::OwnedElsewhere { addr: Some(a), .. }) => a,
        // No address to send it to, or the store failed: the handler
        // reports what it finds.
        Err(_) => return next.run(request).await,
    };
    to(fwd, &addr, "session", &id, request).await
}

/// Sends `request` on to the owner of `what` `id` at `addr`, once: a
/// request already forwarded is not sent again (no loops).
async fn to(fwd: &Forward, addr: &str, what: &str, id: &str, request: Request) -> Response {
    if request.headers().contains_key(FORWARDED_BY) {
        return moved(&format!(
            "the {what}'s owner changed while this request was forwarded"
        ));
    }
    match send(fwd, addr, request).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(what, id, owner = %addr, error = %e, "forwarding to the owner failed");
            moved(&format!("the node that owns this {what} did not answer"))
        }
    }
}

fn moved(why: &str) -> Response {
    let mut r =
        ApiError::new(ErrorCode::SessionMoved, format!("{why}; retry the request")).into_response();
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// Headers that belong to one connection, not to the request.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

async fn send(fwd: &Forward, addr: &str, request: Request) -> Result<Response, String> {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, fwd.max_body)
        .await
        .map_err(|e| format!("reading the body: {e}"))?;
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let url = format!("{}{}", addr.trim_end_matches('/'), path);
    let mut out = fwd.client.request(parts.method.clone(), &url).body(body);
    for (name, value) in parts.headers.iter() {
        if !hop_by_hop(name) {
            out = out.header(name, value);
        }
    }
    out = out.header(FORWARDED_BY, fwd.node_id.as_str());
    let reply = out.send().await.map_err(|e| e.to_string())?;
    let mut response = Response::builder().status(reply.status());
    for (name, value) in reply.headers() {
        if !hop_by_hop(name) {
            response = response.header(name, value);
        }
    }
    let stream = reply.bytes_stream().map_err(std::io::Error::other);
    response
        .body(Body::from_stream(stream))
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_writes_under_a_session_are_forwarded() {
        assert_eq!(
            session_of(&Method::POST, "/v1/sessions/abc/messages").as_deref(),
            Some("abc")
        );
        assert_eq!(
            session_of(&Method::DELETE, "/v1/sessions/abc").as_deref(),
            Some("abc")
        );
        assert_eq!(session_of(&Method::GET, "/v1/sessions/abc/messages"), None);
        assert_eq!(session_of(&Method::POST, "/v1/sessions"), None);
        assert_eq!(session_of(&Method::POST, "/v1/sessions/"), None);
        assert_eq!(session_of(&Method::POST, "/v1/tools/x/invoke"), None);
        assert_eq!(session_of(&Method::POST, "/v1/sessions/abc/ws-token"), None);
        assert_eq!(session_of(&Method::POST, "/v1/sessions/abc/fork"), None);
        assert_eq!(
            run_of(&Method::POST, "/v1/workflows/runs/r1/cancel").as_deref(),
            Some("r1")
        );
        assert_eq!(
            run_of(&Method::GET, "/v1/workflows/runs/r1/events").as_deref(),
            Some("r1")
        );
        assert_eq!(run_of(&Method::GET, "/v1/workflows/runs/r1"), None);
        assert_eq!(run_of(&Method::POST, "/v1/workflows/runs/r1/events"), None);
    }
}
