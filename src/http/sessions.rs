//! Sessions over HTTP: create, list, read, send a message (one turn),
//! history, summary, export (`cadre sessions … --url` reads these), and
//! delete (everything stored under the session's id; 409 while a turn
//! runs: see [`crate::conversation::Sessions::delete`]); an admin deletes
//! every session idle since a time (`DELETE /v1/sessions?before=`, the
//! retention sweep's path: [`crate::conversation::Sessions::delete_idle`]).

use axum::Extension;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::PageQuery;
use super::extract::{ApiJson, ApiQuery};
use super::idempotency::{IdempotencyKey, TurnSlot};
use super::openapi::{error_responses, view_of};
use super::streams::StreamQuota;
use super::tools::{PlanName, parse_plan};
use super::turn_log::Unread;
use super::turn_stream::{MessageBody, SendErrors};
use super::usage::TokenUsageView;
use crate::conversation::machine::{TurnOutcome, TurnRecord, TurnStatus};
use crate::conversation::summary::ToolUsageSummary;
use crate::conversation::{MAX_METADATA_BYTES, NewSession, SessionSummary};
use crate::error_code::ErrorCode;
use crate::identity::{Plan, UserId};
use crate::store::{ForkedFrom, Session, SessionFilter, ShownCall, StoredMessage, StoredSummary};
use crate::tenants::Principal;
use crate::tenants::config::entitled_plan;

/// Longest message content accepted, in bytes (the body cap is larger to
/// leave room for JSON escapes).
pub use crate::conversation::sessions::MAX_CONTENT_BYTES;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create, list, delete_idle))
        .routes(routes!(show, delete_session))
        .routes(routes!(export))
        .routes(routes!(send, history))
        .routes(routes!(show_turn))
        .routes(routes!(list_turns))
        .routes(routes!(summary))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    /// The agent that answers (a file in the agents folder).
    #[schema(
        min_length = 1,
        pattern = "[^\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
    )]
    agent: String,
    user_id: Option<UserId>,
    /// `free` (default), `pro` or `premium`: which tools the session may call.
    #[schema(value_type = Option<PlanName>)]
    plan: Option<String>,
    /// Free-form object kept with the session, at most 16 KiB as JSON;
    /// `workflow_id` and `node_id` are reserved for sessions a workflow run opens, `delegated_by` for the child sessions of agents asking agents.
    #[serde(default)]
    #[schema(value_type = Option<std::collections::BTreeMap<String, Value>>)]
    metadata: Value,
}

/// A session as the API shows it.
#[derive(Serialize, ToSchema)]
pub(super) struct SessionView {
    id: String,
    tenant: String,
    agent: String,
    user_id: Option<String>,
    #[schema(value_type = PlanName)]
    plan: Plan,
    /// The object given at creation; `null` when none was.
    #[schema(value_type = Option<std::collections::BTreeMap<String, Value>>, required = true)]
    metadata: Value,
    created_at: Timestamp,
    /// The session and turn this one was forked from
    /// (`POST /v1/sessions/{id}/fork`); absent for a session that was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    forked_from: Option<Box<ForkedFrom>>,
}

view_of!(Session => SessionView {
    id,
    tenant,
    agent,
    user_id,
    plan,
    metadata,
    created_at,
    forked_from,
});

/// The 202 of a message whose turn runs on without the caller: accepted
/// (`Prefer: respond-async`), or queued behind a turn paused for a
/// confirmation (with `waiting_for`). Read the turn at
/// `GET /v1/sessions/{id}/turns/{turn_id}`.
#[derive(Serialize, ToSchema)]
struct TurnWaiting {
    session_id: String,
    turn_id: String,
    status: WaitingStatus,
    /// Queued: the paused turn this one waits behind.
    #[serde(skip_serializing_if = "Option::is_none")]
    waiting_for: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum WaitingStatus {
    Accepted,
    Queued,
}

/// A message's 202: its turn paused for a confirmation (`status:
/// awaiting_approval`, the turn's reply with its `confirmations`), or it
/// runs on without the caller.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
enum TurnAccepted {
    Paused(Box<TurnOutcome>),
    Waiting(TurnWaiting),
}

#[derive(Serialize, ToSchema)]
struct HistoryPage {
    session_id: String,
    /// Oldest first.
    messages: Vec<StoredMessage>,
    /// Set when more messages follow: pass it as `after` for the next page.
    next_after: Option<u64>,
}

#[derive(Serialize, ToSchema)]
struct SummaryView {
    session_id: String,
    /// The rolling summary of older messages, once there is one.
    conversation_summary: Option<String>,
    covers_until_seq: u64,
    tool_usage_summary: ToolUsageSummary,
    message_count: u64,
    /// User messages.
    turns: u64,
    last_activity_at: Option<Timestamp>,
    /// Every model call of the session: turns, their summaries, suggestions.
    token_usage: TokenUsageView,
    /// What the agents it asked spent for it: its child sessions' calls
    /// and theirs (`ask_<agent>`); the whole conversation cost this plus
    /// `token_usage`.
    delegated_token_usage: TokenUsageView,
}

view_of!(SessionSummary => SummaryView {
    session_id,
    conversation_summary,
    covers_until_seq,
    tool_usage_summary,
    message_count,
    turns,
    last_activity_at,
    token_usage,
    delegated_token_usage,
});

error_responses!(
    CreateErrors:
    PlanNotEntitled = "`plan` is above what the key and the tenant allow",
    AgentNotFound,
    ValidationError = "empty agent, metadata not an object or holding a reserved key (`workflow_id`, `node_id`, `delegated_by`), unknown plan or field",
    PayloadTooLarge = "the body is over 1 MiB or metadata over 16 KiB (as JSON)",
    StorageUnavailable
);

/// Session metadata keys only cadre sets (workflow runs, delegations).
const RESERVED_METADATA_KEYS: [&str; 3] = ["workflow_id", "node_id", "delegated_by"];

#[utoipa::path(
    post,
    path = "/v1/sessions",
    operation_id = "create_session",
    summary = "Create a session",
    tag = "sessions",
    request_body = CreateBody,
    responses(
        (status = 201, description = "The session", body = SessionView),
        CreateErrors,
    )
)]
async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(body): ApiJson<CreateBody>,
) -> Result<(StatusCode, Json<SessionView>), ApiError> {
    if body.agent.trim().is_empty() {
        return Err(ApiError::validation("agent must not be empty"));
    }
    if !(body.metadata.is_null() || body.metadata.is_object()) {
        return Err(ApiError::validation("metadata must be an object"));
    }
    // A session whose metadata names a run and node is a workflow agent
    // node's: its tool calls skip the concurrency pool and speak for that
    // run. Only the workflow engine opens those.
    if let Some(key) = RESERVED_METADATA_KEYS
        .iter()
        .find(|k| body.metadata.get(**k).is_some())
    {
        return Err(ApiError::validation(format!(
            "metadata.{key} is reserved for sessions cadre opens (workflow runs, agents asking agents)"
        )));
    }
    let metadata_bytes = serde_json::to_vec(&body.metadata).map_or(0, |v| v.len());
    if metadata_bytes > MAX_METADATA_BYTES {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "metadata is {metadata_bytes} bytes as JSON; the limit is {MAX_METADATA_BYTES}"
            ),
        ));
    }
    let asked = parse_plan(body.plan.as_deref())?;
    let plan = entitled_plan(&state.store, &caller, Some(asked)).await?;
    let session = state
        .sessions
        .create(NewSession {
            tenant: caller.tenant,
            agent: body.agent,
            user_id: body.user_id.map(UserId::into_string),
            plan,
            metadata: body.metadata,
        })
        .await?;
    Ok((StatusCode::CREATED, Json(session.into())))
}

error_responses!(
    ShowErrors:
    SessionNotFound,
    StorageUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/sessions/{id}",
    operation_id = "show_session",
    summary = "A session",
    tag = "sessions",
    params(("id" = String, Path, description = "Session id")),
    responses(
        (status = 200, description = "The session", body = SessionView),
        ShowErrors,
    )
)]
async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<SessionView>, ApiError> {
    Ok(Json(state.sessions.get(&caller.scope(), &id).await?.into()))
}

error_responses!(
    DeleteErrors:
    SessionNotFound,
    ConversationBusy = "a turn is running in the session: delete it once the turn has finished",
    StorageUnavailable
);

#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}",
    operation_id = "delete_session",
    summary = "Delete a session: its messages, summary, tool calls and confirmations",
    description = "Removes the session and everything stored under its id from the store \
        (not only from listings). Per-tool counters and the tenant's usage totals stay.",
    tag = "sessions",
    params(("id" = String, Path, description = "Session id")),
    responses(
        (status = 204, description = "Deleted"),
        DeleteErrors,
    )
)]
async fn delete_session(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.sessions.delete(&caller.scope(), &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

error_responses!(
    DeleteIdleErrors:
    AdminRequired,
    TenantNotFound = "not a valid tenant id",
    ValidationError = "`before` missing or not an RFC 3339 time, or an unknown parameter",
    StorageUnavailable
);

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct DeleteIdleQuery {
    /// Sessions whose last message (else their creation) is before this
    /// time go (RFC 3339).
    #[param(value_type = String, format = DateTime)]
    before: Timestamp,
    /// Only this tenant's sessions (default: every tenant's).
    #[param(max_length = 64, pattern = "^[A-Za-z0-9_-]+$")]
    tenant: Option<String>,
}

/// What `DELETE /v1/sessions?before=` did.
#[derive(Serialize, ToSchema)]
struct DeletedSessions {
    /// Sessions deleted.
    deleted: u64,
    /// Sessions left because a turn was running in them: delete again.
    busy: u64,
}

#[utoipa::path(
    delete,
    path = "/v1/sessions",
    operation_id = "delete_idle_sessions",
    summary = "Delete every session idle since a time (admin)",
    description = "Every session (of every tenant, or of `tenant`) whose last message, else its \
        creation, is before `before` goes as with `DELETE /v1/sessions/{id}`, one at a time: \
        what the retention sweep does with a cut-off of its own. Sessions with a running turn \
        are left and counted in `busy`. The file does not shrink: see docs/operations.md.",
    tag = "sessions",
    params(DeleteIdleQuery),
    responses(
        (status = 200, description = "What was deleted", body = DeletedSessions),
        DeleteIdleErrors,
    )
)]
async fn delete_idle(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiQuery(q): ApiQuery<DeleteIdleQuery>,
) -> Result<Json<DeletedSessions>, ApiError> {
    super::auth::require_admin(&caller)?;
    if let Some(tenant) = &q.tenant
        && !crate::tenants::valid_tenant_id(tenant)
    {
        return Err(ApiError::new(
            ErrorCode::TenantNotFound,
            "no such tenant id (letters, digits, '_' or '-', at most 64)",
        ));
    }
    let before = q.before;
    let done = state
        .sessions
        .delete_idle(q.tenant.as_deref(), |_| Some(before))
        .await?;
    tracing::info!(
        before = %before,
        tenant = q.tenant.as_deref().unwrap_or("*"),
        deleted = done.deleted,
        busy = done.busy,
        "idle sessions deleted"
    );
    Ok(Json(DeletedSessions {
        deleted: done.deleted,
        busy: done.busy,
    }))
}

/// The caller's sessions (`GET /v1/sessions`).
#[derive(Serialize, ToSchema)]
struct SessionList {
    sessions: Vec<SessionView>,
    /// How many sessions this page holds.
    count: usize,
    /// The `cursor` of the next page; `null` on the last.
    next: Option<String>,
}

error_responses!(
    ListErrors:
    ValidationError = "limit out of range, a cursor too long or not printable ASCII, an unknown order, a bad user id or an agent over 128 bytes",
    StorageUnavailable
);

/// The order of a session listing (session ids are time-ordered).
#[derive(Deserialize, ToSchema, Clone, Copy, PartialEq)]
#[serde(rename_all = "lowercase")]
enum SessionOrder {
    Oldest,
    Newest,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    /// 1 to 1,000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
    /// The `next` of the previous page (opaque), with the same filters and order.
    #[param(max_length = 128, pattern = "^[!-~]*$")]
    cursor: Option<String>,
    /// Only sessions of this agent.
    #[param(max_length = 128)]
    agent: Option<String>,
    /// Only sessions of this user.
    #[param(value_type = Option<String>, max_length = 128, pattern = "^[A-Za-z0-9_.@:+-]+$")]
    user_id: Option<UserId>,
    /// `oldest` (default) or `newest` first.
    #[param(inline)]
    order: Option<SessionOrder>,
}

/// A page of the caller's sessions, oldest first unless `order=newest`,
/// optionally only one agent's or one user's. The filters are read within
/// the tenant's own index range: a page may take longer to fill when few
/// sessions match.
#[utoipa::path(
    get,
    path = "/v1/sessions",
    operation_id = "list_sessions",
    summary = "The caller's sessions",
    tag = "sessions",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of the caller's tenant's sessions that match, oldest first (`order=newest`: newest first)", body = SessionList),
        ListErrors,
    )
)]
async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<SessionList>, ApiError> {
    let (limit, cursor) =
        super::calls::page_params(q.limit, q.cursor, super::calls::DEFAULT_LIMIT)?;
    if q.agent.as_ref().is_some_and(|a| a.len() > 128) {
        return Err(ApiError::validation("agent is longer than 128 bytes"));
    }
    let filter = SessionFilter {
        agent: q.agent,
        user_id: q.user_id.map(UserId::into_string),
        newest_first: q.order == Some(SessionOrder::Newest),
    };
    let page = state
        .sessions
        .list(&caller.scope(), filter, cursor, limit)
        .await?;
    Ok(Json(SessionList {
        count: page.items.len(),
        sessions: page.items.into_iter().map(SessionView::from).collect(),
        next: page.next,
    }))
}

error_responses!(
    ExportErrors:
    SessionNotFound,
    StorageUnavailable
);

/// `GET /v1/sessions/{id}/export`: the document `cadre sessions export`
/// prints. Built as JSON by [`crate::conversation::sessions::export`]
/// (the CLI reads a store with no server); this type states its shape,
/// and the contract tests hold the body to it.
#[derive(ToSchema)]
#[allow(dead_code)]
struct SessionExport {
    #[schema(value_type = SessionView)]
    session: Session,
    /// Every message of the session.
    messages: Vec<StoredMessage>,
    /// The rolling summary, once there is one.
    summary: Option<StoredSummary>,
    /// Every tool call the session made.
    calls: Vec<ShownCall<'static>>,
}

/// The session, its messages, summary and calls: the document
/// `cadre sessions export` prints.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/export",
    operation_id = "export_session",
    summary = "A session with its messages, summary and tool calls",
    tag = "sessions",
    params(("id" = String, Path, description = "Session id")),
    responses(
        (status = 200, description = "`{session, messages, summary, calls}`: the document `cadre sessions export` prints", body = SessionExport),
        ExportErrors,
    )
)]
async fn export(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(state.sessions.export(&caller.scope(), &id).await?))
}

/// One turn. A call that needs a confirmation pauses the turn: 202 with
/// `status: awaiting_approval`; deciding it resumes the turn. With
/// `Prefer: respond-async` the reply is 202 `{turn_id, status: accepted}`
/// as soon as the turn is accepted; read it at
/// `/v1/sessions/{id}/turns/{turn_id}` or follow its events at
/// `/v1/sessions/{id}/turns/{turn_id}/events`. A message queued behind a
/// turn paused for a confirmation (`multitask = "enqueue"`) is answered at
/// once: 202 `{session_id, turn_id, status: queued, waiting_for}`
/// (`waiting_for`: the paused turn). For the turn as Server-Sent Events,
/// use `POST /v1/sessions/{id}/messages/stream` (sending this operation
/// `Accept: text/event-stream` answers the same stream, for clients
/// written before that operation).
/// With `Idempotency-Key`, a retry gets the first request's turn.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/messages",
    operation_id = "send_message",
    summary = "Send a message: one turn",
    tag = "sessions",
    params(
        ("id" = String, Path, description = "Session id"),
        ("Prefer" = Option<String>, Header, description = "`respond-async`: answer 202 with the turn id once it is accepted", example = "respond-async"),
    ),
    request_body = MessageBody,
    responses(
        (status = 200, description = "The turn's outcome. (With `Accept: text/event-stream` the answer is the event stream of `POST /v1/sessions/{id}/messages/stream` instead; that operation documents it.)",
            body = TurnOutcome),
        (status = 202, description = "The turn paused for a confirmation (`status: awaiting_approval`), or with `Prefer: respond-async` was accepted (`{session_id, turn_id, status: accepted}`), or was queued behind a turn paused for a confirmation (`{session_id, turn_id, status: queued, waiting_for}`)", body = TurnAccepted),
        SendErrors,
    )
)]
#[allow(clippy::too_many_arguments)] // axum extractors, one per part of the request
async fn send(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Extension(quota): Extension<StreamQuota>,
    Path(id): Path<String>,
    headers: HeaderMap,
    key: Option<Extension<IdempotencyKey>>,
    turn_slot: Option<Extension<TurnSlot>>,
    _room: super::storage_room::StorageRoom,
    ApiJson(body): ApiJson<MessageBody>,
) -> Result<Response, ApiError> {
    let header_text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let wants_stream =
        header_text(header::ACCEPT.as_str()).is_some_and(|v| v.contains("text/event-stream"));
    let respond_async = header_text("prefer").is_some_and(|v| {
        v.split(',')
            .any(|p| p.trim().eq_ignore_ascii_case("respond-async"))
    });
    // The key (checked and made per tenant by the idempotency layer) goes
    // into the turn's record: a retry after a crash finds the turn.
    let key = key.map(|Extension(IdempotencyKey(k))| k);
    let scope = caller.scope();
    // An unknown session is 404 before anything else is checked.
    state.sessions.get(&scope, &id).await?;
    let input = body.into_input(&state, &scope).await?;
    if respond_async && !wants_stream {
        // The turn runs on, its events logged for whoever follows it
        // (`GET .../turns/{turn_id}/events`); its outcome is stored with
        // its record.
        let (_reader, log) =
            super::turn_stream::start_logged(&state, &scope, &id, input, key, Unread::Keep).await?;
        let turn_id = log.turn_id().to_string();
        if let Some(Extension(turn_slot)) = &turn_slot {
            turn_slot.fill(turn_id.clone());
        }
        let accepted = TurnAccepted::Waiting(TurnWaiting {
            session_id: id,
            turn_id,
            status: WaitingStatus::Accepted,
            waiting_for: None,
        });
        return Ok((StatusCode::ACCEPTED, Json(accepted)).into_response());
    }
    if !wants_stream {
        let started = state
            .sessions
            .start_turn(&scope, &id, input, None, key)
            .await?;
        if let Some(Extension(turn_slot)) = &turn_slot {
            turn_slot.fill(started.turn_id.clone());
        }
        if respond_async {
            let turn_id = started.turn_id.clone();
            tokio::spawn(started.outcome);
            let accepted = TurnAccepted::Waiting(TurnWaiting {
                session_id: id,
                turn_id,
                status: WaitingStatus::Accepted,
                waiting_for: None,
            });
            return Ok((StatusCode::ACCEPTED, Json(accepted)).into_response());
        }
        // Queued behind a turn that waits for a person: it may wait as
        // long as the confirmation lives, so the caller learns at once
        // that it is queued, and reads the turn (`GET .../turns/{turn_id}`)
        // or the session's stream for its outcome.
        if let Some(waiting_for) = started.waiting_for.clone() {
            let turn_id = started.turn_id.clone();
            tokio::spawn(started.outcome);
            let queued = TurnAccepted::Waiting(TurnWaiting {
                session_id: id,
                turn_id,
                status: WaitingStatus::Queued,
                waiting_for: Some(waiting_for),
            });
            return Ok((StatusCode::ACCEPTED, Json(queued)).into_response());
        }
        let outcome = started.outcome.await?;
        return Ok(match outcome.status {
            TurnStatus::Completed => (StatusCode::OK, Json(outcome)).into_response(),
            TurnStatus::AwaitingApproval => (
                StatusCode::ACCEPTED,
                Json(TurnAccepted::Paused(Box::new(outcome))),
            )
                .into_response(),
        });
    }
    super::turn_stream::stream_turn(&state, &scope, &quota, &id, input, key, turn_slot).await
}

error_responses!(
    TurnErrors:
    SessionNotFound,
    TurnNotFound,
    StorageUnavailable
);

/// A turn of the session: its phase, its tool calls so far and, once
/// completed, its outcome (the body the message's POST answered).
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/turns/{turn_id}",
    operation_id = "get_turn",
    summary = "Read a turn: its phase, tool calls so far and outcome",
    tag = "sessions",
    params(
        ("id" = String, Path, description = "Session id"),
        ("turn_id" = String, Path, description = "Turn id (from the message's reply or `turn_started`)"),
    ),
    responses(
        (status = 200, description = "The turn", body = TurnRecord),
        TurnErrors,
    )
)]
async fn show_turn(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path((id, turn_id)): Path<(String, String)>,
) -> Result<Json<TurnRecord>, ApiError> {
    let record = state.sessions.turn(&caller.scope(), &id, &turn_id).await?;
    Ok(Json(record))
}

/// A session's turns (`GET /v1/sessions/{id}/turns`).
#[derive(Serialize, ToSchema)]
struct TurnList {
    /// Oldest first; each as the store keeps it, a turn's record.
    #[schema(value_type = Vec<TurnRecord>)]
    turns: Vec<Value>,
    /// How many turns this page holds.
    count: usize,
    /// The `cursor` of the next page; `null` on the last.
    next: Option<String>,
}

error_responses!(
    TurnListErrors:
    SessionNotFound,
    ValidationError = "limit out of range, or a cursor too long or not printable ASCII",
    StorageUnavailable
);

/// The session's turns, oldest first: each one's phase, calls and outcome.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/turns",
    operation_id = "list_turns",
    summary = "A session's turns, oldest first",
    tag = "sessions",
    params(("id" = String, Path, description = "Session id"), PageQuery),
    responses(
        (status = 200, description = "A page of the session's turns", body = TurnList),
        TurnListErrors,
    )
)]
async fn list_turns(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> Result<Json<TurnList>, ApiError> {
    let (limit, cursor) =
        super::calls::page_params(q.limit, q.cursor, super::calls::DEFAULT_LIMIT)?;
    let page = state
        .sessions
        .turns(&caller.scope(), &id, cursor, limit)
        .await?;
    Ok(Json(TurnList {
        count: page.items.len(),
        turns: page.items,
        next: page.next,
    }))
}

/// Most messages one history page holds.
pub const MAX_PAGE: usize = 1_000;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct HistoryQuery {
    /// Only messages after this seq (the previous page's `next_after`).
    #[param(format = "uint64", minimum = 0, maximum = 18446744073709551615_u64)]
    after: Option<u64>,
    /// 1 to 1,000 (default 1,000).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
}

error_responses!(
    HistoryErrors:
    SessionNotFound,
    ValidationError = "limit out of range",
    StorageUnavailable
);

/// Oldest first, at most `limit` (default and maximum [`MAX_PAGE`]);
/// `next_after` is set when more follow.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/messages",
    operation_id = "list_messages",
    summary = "A session's messages, one page",
    tag = "sessions",
    params(("id" = String, Path, description = "Session id"), HistoryQuery),
    responses(
        (status = 200, description = "One page of messages, oldest first", body = HistoryPage),
        HistoryErrors,
    )
)]
async fn history(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<HistoryQuery>,
) -> Result<Json<HistoryPage>, ApiError> {
    let limit = q.limit.unwrap_or(MAX_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::validation(format!(
            "limit must be between 1 and {MAX_PAGE}"
        )));
    }
    let mut messages = state
        .sessions
        .history(&caller.scope(), &id, q.after.unwrap_or(0), limit + 1)
        .await?;
    let more = messages.len() > limit;
    messages.truncate(limit);
    let next_after = more.then(|| messages.last().map(|m| m.seq)).flatten();
    Ok(Json(HistoryPage {
        session_id: id,
        messages,
        next_after,
    }))
}

error_responses!(
    SummaryErrors:
    SessionNotFound,
    StorageUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/summary",
    operation_id = "show_session_summary",
    summary = "A session's summary",
    tag = "sessions",
    params(("id" = String, Path, description = "Session id")),
    responses(
        (status = 200, description = "The session's summary", body = SummaryView),
        SummaryErrors,
    )
)]
async fn summary(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<SummaryView>, ApiError> {
    Ok(Json(
        state.sessions.summary(&caller.scope(), &id).await?.into(),
    ))
}
