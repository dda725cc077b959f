//! Idempotent requests: `Idempotency-Key` on the six POSTs that do
//! something ([`ROUTES`]), with Stripe's rules.
//!
//! auth (tenant) ──▶ [`idempotent`] ──key + sha256(method, path?query, body)──▶ (tenant, key)
//!     ├─ a record in the store, same fingerprint ──▶ its status, content type and body + `Idempotent-Replayed: true`
//!     ├─ a record or a running request, other fingerprint ──▶ 422 `IDEMPOTENCY_KEY_REUSED`
//!     ├─ a request with the key running here ──▶ wait for its outcome (or 202 + turn id, see below)
//!     └─ none ──▶ handler (extensions: [`IdempotencyKey`], [`TurnSlot`]) ──▶ store the outcome (fsync) ──▶ client
//!
//! Decisions:
//! - Keys are per tenant (the caller's key's tenant; open mode: `default`):
//!   two tenants may use the same key. A stored answer replays only to
//!   the API key that made it: the key's id is part of the fingerprint, so
//!   another key of the tenant (a free one replaying a premium key's
//!   answer) sending the same `Idempotency-Key` gets 422
//!   `IDEMPOTENCY_KEY_REUSED`; a client whose key was rotated uses a new
//!   `Idempotency-Key`. A key is 1 to [`MAX_KEY_LEN`]
//!   printable ASCII characters (space inside only), sent once; anything
//!   else is 400 `IDEMPOTENCY_KEY_INVALID`. Without the header nothing
//!   changes.
//! - The fingerprint covers the method, the path with its query and the
//!   body's bytes, not the headers: the same JSON written differently is a
//!   different request (422), as with Stripe.
//! - A message's 202 (paused for an approval, queued, accepted) is shared
//!   with the retries waiting then but not stored: the conversation finds
//!   the turn by its key, so a later retry gets where the turn stands then
//!   (its answer once an approval let it finish, issue #31).
//! - Stored: every answer below 500 but 409 and 429 (those say nothing
//!   happened: busy, rate limited, already decided), with an fsync before
//!   the answer leaves, so a client that got it and retries after a crash
//!   gets it again. 5xx, 409 and 429 are not stored: a retry runs again.
//!   A body over [`MAX_STORED_BODY`] (or not UTF-8) is not stored either:
//!   retries waiting at the time get it, later ones run again. If the
//!   store refuses the write, the answer still goes out (logged), unstored.
//! - A retry that arrives while the first request with its key runs on
//!   this node waits for its outcome, at most [`MAX_WAITERS`] per key: the
//!   next is 429 `RATE_LIMITED` (`Retry-After: 1`). If the first ends
//!   without an outcome to share (a 5xx, 409, 429, the client hung up and
//!   the handler was dropped, or its SSE stream ended), the waiters are
//!   woken and one runs in its place (a message's turn is found again by
//!   its key, so it is not run twice). A retry waits at most [`MAX_WAIT`]
//!   (30 s): then it answers 409 `IDEMPOTENCY_KEY_IN_USE` with
//!   `Retry-After: 1`, not stored, so no request waits without a bound
//!   and retries cannot pin every connection slot of an address. After a
//!   crash nothing runs any more: a retry runs again, and a message's
//!   turn is recognised by its key in the conversation (the handler hands
//!   [`IdempotencyKey`] down).
//! - Cluster mode: the running request's key is also marked in the
//!   shared store before it runs ([`crate::store::idempotency`]), so a
//!   retry that reaches another node while it runs is answered 409
//!   `IDEMPOTENCY_KEY_IN_USE` with `Retry-After: 1` (not stored; waiting
//!   across nodes would need the other node's answer pushed here), and
//!   never runs it a second time. A retry of a message usually never
//!   gets here: it is forwarded to the session's owner
//!   ([`super::owner`]), where it waits as above. A node that dies
//!   while it runs a keyed request leaves its mark until its heartbeat is
//!   stale; then a retry anywhere runs again, as after a crash.
//! - `POST /v1/sessions/{id}/messages` with `Prefer: respond-async`: a
//!   waiting retry answers 202 `{session_id, turn_id, status: "accepted"}` as soon as the
//!   running request's handler fills its [`TurnSlot`] (the turn was
//!   accepted); until it does, the retry waits like any other.
//! - Server-Sent Events (`Accept: text/event-stream`) cannot be replayed:
//!   a keyed request whose answer is a stream is not stored, and the key
//!   stays held (retries wait) until the stream ends; its error answers
//!   before a stream (404, 409 ...) are JSON and follow the rules above.
//! - Records are kept at least `[server] idempotency_keep_h` (24 h, the
//!   minimum): [`spawn_sweep`] deletes older ones every hour.
//!   Erasing a tenant's sessions does not drop its keys.
//!
//! Owns: the six routes' key handling. Does not: dedup inside a turn
//! (the conversation does, with the key it is given).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use utoipa::openapi::path::{Operation, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{OpenApi as OpenApiDoc, RefOr};

use super::MAX_BODY_BYTES;
use super::error::ApiError;
use crate::error_code::ErrorCode;
use crate::identity::Principal;
use crate::store::Store;
use crate::store::idempotency::{IdempotencyClaim, IdempotencyRecord};

/// The request header.
pub const HEADER: &str = "idempotency-key";
/// Set on every answer that did not run the request.
pub const REPLAYED: &str = "idempotent-replayed";
/// Longest key, in characters.
pub const MAX_KEY_LEN: usize = 255;
/// Largest response body stored for replay.
pub const MAX_STORED_BODY: usize = 1 << 20;
/// Retries one key's running request may have waiting for it.
pub const MAX_WAITERS: usize = 8;
/// The longest a retry waits for the running request before it answers
/// 409 `IDEMPOTENCY_KEY_IN_USE` (`Retry-After: 1`): no request waits
/// without a bound, so retries cannot pin connection slots.
pub const MAX_WAIT: Duration = Duration::from_secs(30);
/// How often [`spawn_sweep`] deletes expired records.
pub const SWEEP_EVERY: Duration = Duration::from_secs(3600);
/// The shortest `[server] idempotency_keep_h`, and its default.
pub const MIN_KEEP_H: u64 = 24;

/// The route that runs a turn: the one with a [`TurnSlot`].
pub const MESSAGES_ROUTE: &str = "/v1/sessions/{id}/messages";

/// The routes that take `Idempotency-Key` (all `POST`), as axum matches them.
pub const ROUTES: [&str; 6] = [
    "/v1/sessions",
    "/v1/sessions/{id}/fork",
    MESSAGES_ROUTE,
    "/v1/tools/{name}/invoke",
    "/v1/workflows/{name}/runs",
    "/v1/confirmations/{id}",
];

/// The OpenAI door's routes that take `Idempotency-Key` too (outside the
/// OpenAPI document, like the door: `super::openai`).
pub const OPENAI_ROUTES: [&str; 2] = ["/v1/chat/completions", "/v1/responses"];

/// The request's key, in its extensions while the first request with it
/// runs: a handler hands it down (a turn remembers it, so a retry after a
/// crash finds the turn).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(pub String);

/// Where the messages handler puts the id of the turn it started
/// ([`TurnSlot::fill`]), in the extensions of a keyed
/// `POST /v1/sessions/{id}/messages`: a retry sent with
/// `Prefer: respond-async` while the turn runs answers 202 with it.
#[derive(Debug, Clone)]
pub struct TurnSlot(Arc<watch::Sender<Option<String>>>);

impl Default for TurnSlot {
    fn default() -> Self {
        TurnSlot(Arc::new(watch::Sender::new(None)))
    }
}

impl TurnSlot {
    /// Records the turn's id; the first fill wins.
    pub fn fill(&self, turn_id: impl Into<String>) {
        let turn_id = turn_id.into();
        self.0.send_if_modified(|slot| {
            if slot.is_some() {
                return false;
            }
            *slot = Some(turn_id);
            true
        });
    }

    /// The turn's id, once filled.
    pub fn get(&self) -> Option<String> {
        self.0.borrow().clone()
    }

    /// Waits until the slot is filled.
    async fn filled(&self) -> String {
        let mut rx = self.0.subscribe();
        let filled = rx
            .wait_for(Option::is_some)
            .await
            .map(|id| id.clone().unwrap_or_default());
        match filled {
            Ok(id) => id,
            // The sender lives in `self`: never closed while we wait.
            Err(_) => std::future::pending().await,
        }
    }
}

/// An answer to share with the retries that waited for it.
#[derive(Clone)]
struct Outcome {
    status: StatusCode,
    content_type: Option<HeaderValue>,
    body: Bytes,
}

/// What the waiters of a running request see.
#[derive(Clone)]
enum RunState {
    Running,
    /// It answered something to share.
    Shared(Outcome),
    /// It ended with nothing to share (its client hung up, or it answered
    /// 409, 429 or 5xx, or its stream ended): a waiter runs in its place.
    /// Set by the [`RunGuard`]'s drop: the waiters hold the [`Running`]
    /// (and so the sender), so the channel's closing cannot say it.
    Ended,
}

/// The first request with a key, while it runs on this node.
struct Running {
    fingerprint: String,
    outcome: watch::Sender<RunState>,
    waiters: AtomicUsize,
    slot: TurnSlot,
}

type RunningMap = Arc<Mutex<HashMap<(String, String), Arc<Running>>>>;

/// The state of [`idempotent`]: the store and the requests running here.
#[derive(Clone)]
pub struct Idempotency {
    store: Store,
    running: RunningMap,
}

impl Idempotency {
    pub fn new(store: Store) -> Self {
        Idempotency {
            store,
            running: Arc::default(),
        }
    }
}

/// Removes its key from the running map when the run ends, however it ends.
struct RunGuard {
    map: RunningMap,
    id: (String, String),
    running: Arc<Running>,
    /// Set while this request holds the key's running mark in the store
    /// (cluster mode): given up when the guard goes without an answer
    /// stored.
    marked: Option<Store>,
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        // Wake the waiters: one of them runs in this one's place.
        self.running.outcome.send_if_modified(|state| {
            if matches!(state, RunState::Running) {
                *state = RunState::Ended;
                true
            } else {
                false
            }
        });
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map
            .get(&self.id)
            .is_some_and(|r| Arc::ptr_eq(r, &self.running))
        {
            map.remove(&self.id);
        }
        drop(map);
        if let (Some(store), Ok(rt)) = (self.marked.take(), tokio::runtime::Handle::try_current()) {
            let (tenant, key) = self.id.clone();
            rt.spawn(async move {
                if let Err(e) = store.release_idempotency(&tenant, &key).await {
                    tracing::warn!(error = %e, "a keyed request's running mark was not released: other nodes wait for its lease");
                }
            });
        }
    }
}

/// Counts a waiter while it waits.
struct Waiting(Arc<Running>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiters.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The middleware (a route layer of [`super::router`]): passes every
/// request but a keyed `POST` to one of [`ROUTES`] through untouched.
pub async fn idempotent(
    State(state): State<Idempotency>,
    request: Request,
    next: Next,
) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string());
    let keyed = request.method() == Method::POST
        && route
            .as_deref()
            .is_some_and(|r| ROUTES.contains(&r) || OPENAI_ROUTES.contains(&r))
        && request.headers().contains_key(HEADER);
    if !keyed {
        return next.run(request).await;
    }
    let key = match parse_key(&request) {
        Ok(key) => key,
        Err(e) => return e.into_response(),
    };
    let (tenant, api_key) = request.extensions().get::<Principal>().map_or_else(
        || (Principal::open().tenant, None),
        |p| (p.tenant.clone(), p.key_id.clone()),
    );
    let is_messages = route.as_deref() == Some(MESSAGES_ROUTE);
    let respond_async = is_messages && prefers_async(&request);
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!("the body is over {MAX_BODY_BYTES} bytes"),
            )
            .into_response();
        }
    };
    let fingerprint = fingerprint(&parts.method, &parts.uri, &body, api_key.as_deref());
    let id = (tenant, key);
    loop {
        let (running, guard) = {
            let mut map = state.running.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(&id) {
                Some(r) => (r.clone(), None),
                None => {
                    let r = Arc::new(Running {
                        fingerprint: fingerprint.clone(),
                        outcome: watch::Sender::new(RunState::Running),
                        waiters: AtomicUsize::new(0),
                        slot: TurnSlot::default(),
                    });
                    map.insert(id.clone(), r.clone());
                    let guard = RunGuard {
                        map: state.running.clone(),
                        id: id.clone(),
                        running: r.clone(),
                        marked: None,
                    };
                    (r, Some(guard))
                }
            }
        };
        let Some(mut guard) = guard else {
            if running.fingerprint != fingerprint {
                return reused();
            }
            match wait(running, respond_async, &parts.uri).await {
                Some(response) => return response,
                // The first ended without an outcome: try again.
                None => continue,
            }
        };
        // This request holds the key here: answer from the store, or
        // claim it there (another node may run it) and run.
        match state
            .store
            .claim_idempotency(&id.0, &id.1, &fingerprint)
            .await
        {
            Ok(IdempotencyClaim::Done(record)) if record.fingerprint != fingerprint => {
                return reused();
            }
            Ok(IdempotencyClaim::Running { fingerprint: other }) if other != fingerprint => {
                return reused();
            }
            Ok(IdempotencyClaim::Running { .. }) => {
                let mut e = ApiError::new(
                    ErrorCode::IdempotencyKeyInUse,
                    "a request with this Idempotency-Key is running on another node; retry once it has answered",
                );
                e.retry_after_secs = Some(1);
                return e.into_response();
            }
            Ok(IdempotencyClaim::Done(record)) => {
                let outcome = Outcome {
                    status: StatusCode::from_u16(record.status)
                        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                    content_type: record
                        .content_type
                        .as_deref()
                        .and_then(|c| HeaderValue::from_str(c).ok()),
                    body: Bytes::from(record.body),
                };
                guard
                    .running
                    .outcome
                    .send_replace(RunState::Shared(outcome.clone()));
                return replay(&outcome);
            }
            Ok(IdempotencyClaim::Mine) => {
                if state.store.backend_name() != "redb" {
                    guard.marked = Some(state.store.clone());
                }
            }
            Err(e) => return ApiError::from(e).into_response(),
        }
        let mut request = Request::from_parts(parts, Body::from(body));
        request
            .extensions_mut()
            .insert(IdempotencyKey(id.1.clone()));
        if is_messages {
            request.extensions_mut().insert(guard.running.slot.clone());
        }
        let response = next.run(request).await;
        let turn_found_by_key = route.as_deref() == Some(MESSAGES_ROUTE);
        return finish(
            &state.store,
            guard,
            &fingerprint,
            response,
            turn_found_by_key,
        )
        .await;
    }
}

/// Stores and shares the first request's answer, as the rules say.
async fn finish(
    store: &Store,
    mut guard: RunGuard,
    fingerprint: &str,
    response: Response,
    turn_found_by_key: bool,
) -> Response {
    let (parts, body) = response.into_parts();
    let content_type = parts.headers.get(header::CONTENT_TYPE).cloned();
    let is_stream = content_type
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if is_stream {
        // Held until the stream ends: the guard goes with the body.
        let stream = body.into_data_stream().map(move |frame| {
            let _held = &guard;
            frame
        });
        return Response::from_parts(parts, Body::from_stream(stream));
    }
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            tracing::warn!(error = %e, "a keyed request's answer could not be read");
            return ApiError::new(ErrorCode::InternalError, "the answer could not be read")
                .into_response();
        }
    };
    let status = parts.status;
    // A refusal that waiting or an admin can lift is not the key's answer:
    // a retry runs (a full storage quota is 413, see conversation::storage).
    let shared = !(status.is_server_error()
        || status == StatusCode::CONFLICT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::PAYLOAD_TOO_LARGE);
    // A message's 202 (its turn paused for an approval, queued, or
    // accepted to run on) is not its final answer: a later retry finds the
    // turn by its key instead, and gets where it stands then (its answer
    // once the approval let it finish).
    let stored = shared && !(turn_found_by_key && status == StatusCode::ACCEPTED);
    if shared {
        let text = std::str::from_utf8(&bytes).ok().filter(|_| stored);
        match text.filter(|_| bytes.len() <= MAX_STORED_BODY) {
            Some(text) => {
                let record = IdempotencyRecord {
                    fingerprint: fingerprint.to_string(),
                    status: status.as_u16(),
                    content_type: content_type
                        .as_ref()
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string),
                    body: text.to_string(),
                    stored_at: jiff::Timestamp::now(),
                    running_node: None,
                };
                let (tenant, key) = &guard.id;
                match store.put_idempotency(tenant, key, &record).await {
                    // The answer replaced the running mark.
                    Ok(()) => guard.marked = None,
                    Err(e) => {
                        tracing::warn!(error = %e, "a keyed request's answer was not stored: a retry runs again");
                    }
                }
            }
            None if !stored => {}
            None => tracing::debug!(
                bytes = bytes.len(),
                "a keyed request's answer is too large (or not UTF-8) to store"
            ),
        }
        guard
            .running
            .outcome
            .send_replace(RunState::Shared(Outcome {
                status,
                content_type,
                body: bytes.clone(),
            }));
    }
    drop(guard);
    Response::from_parts(parts, Body::from(bytes))
}

/// A retry's wait for the running request: its answer, a 202 with the
/// turn id (`respond_async`), a 429 past [`MAX_WAITERS`]; `None` when it
/// ended with nothing to share.
async fn wait(
    running: Arc<Running>,
    respond_async: bool,
    uri: &axum::http::Uri,
) -> Option<Response> {
    if running.waiters.fetch_add(1, Ordering::AcqRel) >= MAX_WAITERS {
        running.waiters.fetch_sub(1, Ordering::AcqRel);
        let mut e = ApiError::new(
            ErrorCode::RateLimited,
            format!(
                "{MAX_WAITERS} retries with this Idempotency-Key already wait for the first; retry later"
            ),
        );
        e.retry_after_secs = Some(1);
        return Some(e.into_response());
    }
    let waiting = Waiting(running);
    let mut outcome = waiting.0.outcome.subscribe();
    let slot = waiting.0.slot.clone();
    let turn = async {
        if respond_async {
            slot.filled().await
        } else {
            std::future::pending().await
        }
    };
    tokio::select! {
        shared = outcome.wait_for(|s| !matches!(s, RunState::Running)) => match shared {
            Ok(state) => match &*state {
                RunState::Shared(o) => Some(replay(o)),
                RunState::Running | RunState::Ended => None,
            },
            Err(_) => None,
        },
        () = tokio::time::sleep(MAX_WAIT) => {
            let mut e = ApiError::new(
                ErrorCode::IdempotencyKeyInUse,
                format!(
                    "the first request with this Idempotency-Key still runs after {} s; retry later to get its answer",
                    MAX_WAIT.as_secs()
                ),
            );
            e.retry_after_secs = Some(1);
            Some(e.into_response())
        }
        turn_id = turn => {
            let session = uri
                .path()
                .strip_prefix("/v1/sessions/")
                .and_then(|p| p.strip_suffix("/messages"))
                .unwrap_or_default();
            let mut response = (
                StatusCode::ACCEPTED,
                axum::Json(json!({"session_id": session, "turn_id": turn_id, "status": "accepted"})),
            )
                .into_response();
            response
                .headers_mut()
                .insert(REPLAYED, HeaderValue::from_static("true"));
            Some(response)
        }
    }
}

fn replay(outcome: &Outcome) -> Response {
    let mut response = Response::new(Body::from(outcome.body.clone()));
    *response.status_mut() = outcome.status;
    if let Some(ct) = &outcome.content_type {
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, ct.clone());
    }
    response
        .headers_mut()
        .insert(REPLAYED, HeaderValue::from_static("true"));
    response
}

fn reused() -> Response {
    ApiError::new(
        ErrorCode::IdempotencyKeyReused,
        "this Idempotency-Key was already used for a request with another method, path, body or API key; use a new key for a new request",
    )
    .into_response()
}

/// The key, if it is one: sent once, 1 to [`MAX_KEY_LEN`] printable ASCII
/// characters (HTTP drops spaces around a header value; inner ones stay).
fn parse_key(request: &Request) -> Result<String, ApiError> {
    let invalid = |why: &str| {
        ApiError::new(
            ErrorCode::IdempotencyKeyInvalid,
            format!(
                "Idempotency-Key {why}: send 1 to {MAX_KEY_LEN} printable ASCII characters (a UUID is a good key), once"
            ),
        )
    };
    let mut values = request.headers().get_all(HEADER).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Err(invalid("is sent more than once"));
    };
    let bytes = value.as_bytes();
    if bytes.is_empty() {
        return Err(invalid("is empty"));
    }
    if bytes.len() > MAX_KEY_LEN {
        return Err(invalid(&format!("is {} characters long", bytes.len())));
    }
    if !bytes.iter().all(|b| (0x20..=0x7e).contains(b)) {
        return Err(invalid("holds characters other than printable ASCII"));
    }
    Ok(String::from_utf8_lossy(bytes).into_owned())
}

fn prefers_async(request: &Request) -> bool {
    request
        .headers()
        .get_all("prefer")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim().eq_ignore_ascii_case("respond-async"))
}

/// sha256 (hex) of the method, the path with its query and the body.
/// The request's fingerprint: method, path with query, body and the API
/// key that sent it (its id; none when the server runs open), so a stored
/// answer replays only to the key that made it.
fn fingerprint(
    method: &Method,
    uri: &axum::http::Uri,
    body: &[u8],
    api_key: Option<&str>,
) -> String {
    let mut hash = Sha256::new();
    if let Some(id) = api_key {
        hash.update(b"key:");
        hash.update(id.as_bytes());
        hash.update(b"\n");
    }
    hash.update(method.as_str().as_bytes());
    hash.update(b"\n");
    hash.update(
        uri.path_and_query()
            .map_or(uri.path(), |p| p.as_str())
            .as_bytes(),
    );
    hash.update(b"\n");
    hash.update(body);
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Deletes records older than `keep` now and every [`SWEEP_EVERY`].
pub fn spawn_sweep(store: Store, keep: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SWEEP_EVERY);
        loop {
            tick.tick().await;
            let Ok(keep) = jiff::SignedDuration::try_from(keep) else {
                return;
            };
            let before = jiff::Timestamp::now() - keep;
            match store.sweep_idempotency(before).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(removed = n, "expired Idempotency-Key records swept"),
                Err(e) => {
                    tracing::warn!(error = %e, "the Idempotency-Key sweep failed; next try in an hour")
                }
            }
        }
    });
}

/// Adds `Idempotency-Key` and its answers to the document's [`ROUTES`].
pub fn document(doc: &mut OpenApiDoc) {
    for route in ROUTES {
        let Some(op) = doc
            .paths
            .paths
            .get_mut(route)
            .and_then(|item| item.post.as_mut())
        else {
            continue;
        };
        document_operation(op);
    }
}

fn document_operation(op: &mut Operation) {
    let schema = ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(MAX_KEY_LEN))
        .pattern(Some("^[!-~]([ -~]*[!-~])?$"));
    let parameter = ParameterBuilder::new()
        .name("Idempotency-Key")
        .parameter_in(ParameterIn::Header)
        .required(utoipa::openapi::Required::False)
        .description(Some(
            "Makes a retry safe: the first request with a key runs; a retry with the same key, method, path and body (within `[server] idempotency_keep_h`, at least 24 h) gets the stored answer with `Idempotent-Replayed: true`, or waits while the first still runs. Keys are per tenant, and a stored answer replays only to the API key that made it (another key of the tenant gets 422). Answers 5xx, 409 and 429 are not stored.",
        ))
        .schema(Some(schema))
        .example(Some(json!("5f0c8b8e-6d1e-4b8a-9c3e-2a7d1f4e9b10")))
        .build();
    op.parameters
        .get_or_insert_with(Vec::new)
        .push(RefOr::T(parameter));
    for (code, note) in [
        (
            ErrorCode::IdempotencyKeyInvalid,
            ErrorCode::IdempotencyKeyInvalid.meaning(),
        ),
        (
            ErrorCode::IdempotencyKeyReused,
            ErrorCode::IdempotencyKeyReused.meaning(),
        ),
        (
            ErrorCode::IdempotencyKeyInUse,
            ErrorCode::IdempotencyKeyInUse.meaning(),
        ),
        (
            ErrorCode::RateLimited,
            "over the API's request rate, or too many retries with this Idempotency-Key already wait for the first; see `Retry-After`",
        ),
        (
            ErrorCode::StorageUnavailable,
            ErrorCode::StorageUnavailable.meaning(),
        ),
    ] {
        let status = code.status().as_u16().to_string();
        let responses = super::openapi::responses_for_codes(&[(code, Some(note))]);
        let Some(RefOr::T(new)) = responses.into_values().next() else {
            continue;
        };
        match op.responses.responses.get_mut(&status) {
            Some(RefOr::T(existing)) => super::openapi::add_code(existing, code, Some(note)),
            Some(RefOr::Ref(_)) => {}
            None => {
                op.responses.responses.insert(status, RefOr::T(new));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::Router;
    use axum::extract::Extension;
    use axum::middleware::from_fn_with_state;
    use axum::routing::post;
    use tokio::sync::{Notify, mpsc};
    use tower::ServiceExt;

    use super::*;

    /// A messages route whose handler fills the slot (when `fill`), tells
    /// the test, then answers once the test releases it.
    fn app(
        state: Idempotency,
        release: Arc<Notify>,
        started: mpsc::UnboundedSender<()>,
        fill: bool,
    ) -> Router {
        let handler = move |slot: Option<Extension<TurnSlot>>,
                            key: Option<Extension<IdempotencyKey>>| {
            let (release, started) = (release.clone(), started.clone());
            async move {
                let Extension(slot) = slot.expect("a keyed messages request has a slot");
                let Extension(IdempotencyKey(key)) = key.expect("and its key");
                if fill {
                    slot.fill("turn-1");
                }
                let _ = started.send(());
                release.notified().await;
                axum::Json(json!({"answer": "done", "key": key}))
            }
        };
        Router::new()
            .route(MESSAGES_ROUTE, post(handler))
            .route_layer(from_fn_with_state(state, idempotent))
    }

    fn state() -> Idempotency {
        Idempotency::new(Store::open_in_memory().unwrap())
    }

    /// Retries waiting for the running request with key `k1`.
    fn waiters(state: &Idempotency) -> usize {
        let map = state.running.lock().unwrap();
        map.values()
            .map(|r| r.waiters.load(Ordering::Acquire))
            .sum()
    }

    fn request(prefer_async: bool) -> Request {
        let mut builder = Request::builder()
            .method(Method::POST)
            .uri("/v1/sessions/s1/messages")
            .header(HEADER, "k1")
            .header(header::CONTENT_TYPE, "application/json");
        if prefer_async {
            builder = builder.header("prefer", "respond-async");
        }
        builder.body(Body::from(r#"{"content":"hi"}"#)).unwrap()
    }

    async fn read(response: Response) -> (StatusCode, bool, serde_json::Value) {
        let status = response.status();
        let replayed = response.headers().contains_key(REPLAYED);
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, replayed, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn a_respond_async_retry_answers_202_with_the_turn_id_once_the_slot_is_filled() {
        let release = Arc::new(Notify::new());
        let (tx, mut started) = mpsc::unbounded_channel();
        let app = app(state(), release.clone(), tx, true);
        let first = tokio::spawn(app.clone().oneshot(request(false)));
        started.recv().await.unwrap();
        let retry = app.clone().oneshot(request(true));
        let retry = tokio::time::timeout(Duration::from_secs(10), retry)
            .await
            .expect("with the slot filled, the retry does not wait for the answer");
        let (status, replayed, body) = read(retry.unwrap()).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        assert!(replayed);
        assert_eq!(
            body,
            json!({"session_id": "s1", "turn_id": "turn-1", "status": "accepted"})
        );
        release.notify_one();
        let (status, replayed, body) = read(first.await.unwrap().unwrap()).await;
        assert_eq!((status, replayed), (StatusCode::OK, false));
        assert_eq!(body["key"], "k1");
        // Finished: the stored answer, not a 202.
        let (status, replayed, again) = read(app.oneshot(request(true)).await.unwrap()).await;
        assert_eq!((status, replayed), (StatusCode::OK, true));
        assert_eq!(again, body);
        assert!(started.try_recv().is_err(), "the handler ran once");
    }

    #[tokio::test]
    async fn a_respond_async_retry_waits_for_the_answer_while_the_slot_is_empty() {
        let release = Arc::new(Notify::new());
        let (tx, mut started) = mpsc::unbounded_channel();
        let state = state();
        let app = app(state.clone(), release.clone(), tx, false);
        let first = tokio::spawn(app.clone().oneshot(request(false)));
        started.recv().await.unwrap();
        let retry = tokio::spawn(app.clone().oneshot(request(true)));
        while waiters(&state) == 0 {
            tokio::task::yield_now().await;
        }
        assert!(!retry.is_finished(), "an empty slot is no answer");
        release.notify_one();
        let (status, _, body) = read(first.await.unwrap().unwrap()).await;
        assert_eq!(status, StatusCode::OK);
        let (status, replayed, again) = read(retry.await.unwrap().unwrap()).await;
        assert_eq!((status, replayed), (StatusCode::OK, true));
        assert_eq!(again, body);
        assert!(started.try_recv().is_err(), "the handler ran once");
    }

    /// `POST /v1/sessions` answering `body` with `content_type`, counting runs.
    fn counting(content_type: &'static str, body: Vec<u8>) -> (Router, Arc<AtomicUsize>) {
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let handler = move || {
            let (body, runs) = (body.clone(), counted.clone());
            async move {
                runs.fetch_add(1, Ordering::AcqRel);
                ([(header::CONTENT_TYPE, content_type)], body)
            }
        };
        let app = Router::new()
            .route(ROUTES[0], post(handler))
            .route_layer(from_fn_with_state(state(), idempotent));
        (app, runs)
    }

    fn create() -> Request {
        Request::builder()
            .method(Method::POST)
            .uri(ROUTES[0])
            .header(HEADER, "k")
            .body(Body::from("{}"))
            .unwrap()
    }

    #[tokio::test]
    async fn answers_over_the_bound_and_streams_are_not_stored() {
        let big = vec![b'x'; MAX_STORED_BODY + 1];
        let (app, runs) = counting("application/json", big);
        for _ in 0..2 {
            let response = app.clone().oneshot(create()).await.unwrap();
            assert!(!response.headers().contains_key(REPLAYED));
            let body = axum::body::to_bytes(response.into_body(), usize::MAX).await;
            assert_eq!(body.unwrap().len(), MAX_STORED_BODY + 1, "sent whole");
        }
        assert_eq!(runs.load(Ordering::Acquire), 2, "not stored: the retry ran");

        let (app, runs) = counting("application/json", vec![b'x'; MAX_STORED_BODY]);
        for _ in 0..2 {
            app.clone().oneshot(create()).await.unwrap();
        }
        assert_eq!(runs.load(Ordering::Acquire), 1, "at the bound: stored");

        let (app, runs) = counting("text/event-stream", b"data: 1\n\n".to_vec());
        for _ in 0..2 {
            let response = app.clone().oneshot(create()).await.unwrap();
            axum::body::to_bytes(response.into_body(), 1 << 16)
                .await
                .unwrap();
        }
        assert_eq!(runs.load(Ordering::Acquire), 2, "a stream is not replayed");
    }

    #[test]
    fn the_five_routes_are_posts_of_the_api_and_document_the_header() {
        let (_, doc) = super::super::routes();
        for route in ROUTES {
            let op = doc
                .paths
                .paths
                .get(route)
                .and_then(|item| item.post.as_ref())
                .unwrap_or_else(|| panic!("POST {route} is in the document"));
            let header = op
                .parameters
                .iter()
                .flatten()
                .filter(|p| matches!(p, RefOr::T(p) if p.name == "Idempotency-Key"))
                .count();
            assert_eq!(header, 1, "{route}");
            for status in ["400", "422"] {
                assert!(
                    op.responses.responses.contains_key(status),
                    "{route} {status}"
                );
            }
        }
        let keyed = doc
            .paths
            .paths
            .values()
            .flat_map(|item| [&item.get, &item.post, &item.put, &item.patch, &item.delete])
            .flatten()
            .filter(|op| {
                op.parameters
                    .iter()
                    .flatten()
                    .any(|p| matches!(p, RefOr::T(p) if p.name == "Idempotency-Key"))
            })
            .count();
        assert_eq!(keyed, ROUTES.len());
    }

    #[test]
    fn keys_are_checked_and_fingerprints_cover_method_path_and_body() {
        let with = |value: &[u8]| {
            Request::builder()
                .header(HEADER, HeaderValue::from_bytes(value).unwrap())
                .body(Body::empty())
                .unwrap()
        };
        assert_eq!(parse_key(&with(b"a b-1")).unwrap(), "a b-1");
        assert!(parse_key(&with(b"")).is_err());
        assert!(parse_key(&with(&[b'k'; 256])).is_err());
        assert!(parse_key(&with(&[b'k'; 255])).is_ok());
        assert!(parse_key(&with(b"\xc3\xa9")).is_err());
        let uri: axum::http::Uri = "/v1/sessions?x=1".parse().unwrap();
        let plain: axum::http::Uri = "/v1/sessions".parse().unwrap();
        let a = fingerprint(&Method::POST, &uri, b"{}", None);
        assert_eq!(a, fingerprint(&Method::POST, &uri, b"{}", None));
        assert_ne!(a, fingerprint(&Method::POST, &plain, b"{}", None));
        assert_ne!(a, fingerprint(&Method::POST, &uri, b"{ }", None));
        assert_ne!(a, fingerprint(&Method::PUT, &uri, b"{}", None));
        // Another API key of the tenant: another request.
        let k1 = fingerprint(&Method::POST, &uri, b"{}", Some("k1"));
        assert_ne!(a, k1);
        assert_ne!(k1, fingerprint(&Method::POST, &uri, b"{}", Some("k2")));
    }
}
