//! Forks over HTTP: `POST /v1/sessions/{id}/fork` (a new session from the
//! parent's history up to the end of a finished turn) and
//! `GET /v1/sessions/{id}/history` (the turns, each with the state the
//! conversation had after it, to pick where to fork).
//!
//! client ──▶ [`fork`] ──▶ `Sessions::fork` ──▶ store (one write) ──▶ 201 the new session
//! client ──▶ [`history`] ──▶ `Sessions::turn_states` ──▶ store reads ──▶ a page of turns
//!
//! What a fork holds and what was decided where the issue is silent is
//! in [`crate::conversation::fork`]. Here: the body is optional (none, or
//! `{}`, forks after the last finished turn); a fork takes
//! `Idempotency-Key` like the other POSTs that make something
//! ([`super::idempotency::ROUTES`]), so a retried fork makes one session.
//! The history pages like the turn listing (`limit`, `cursor`: the turn
//! id the previous page ended on).

use axum::Extension;
use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiQuery, PageQuery};
use super::openapi::error_responses;
use super::sessions::SessionView;
use crate::conversation::fork::{ForkRequest, TurnState};
use crate::error_code::ErrorCode;
use crate::tenants::Principal;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(fork))
        .routes(routes!(history))
}

/// Where to fork, and who continues.
#[derive(Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
struct ForkBody {
    /// Fork after this turn (it must have finished); default: after the
    /// last finished turn.
    #[schema(min_length = 1, max_length = 128)]
    turn_id: Option<String>,
    /// The agent that answers in the fork; default: the parent's.
    #[schema(
        min_length = 1,
        pattern = "[^\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
    )]
    agent: Option<String>,
}

/// The optional body: none (only whitespace, or `null`) is `{}`; anything else is
/// held to [`ForkBody`]'s schema as every JSON body is.
struct OptionalForkBody(ForkBody);

impl FromRequest<AppState> for OptionalForkBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        let bytes = Bytes::from_request(Request::from_parts(parts.clone(), body), state)
            .await
            .map_err(|e| {
                let code = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ErrorCode::PayloadTooLarge
                } else {
                    ErrorCode::BadRequest
                };
                ApiError::new(code, e.body_text())
            })?;
        if bytes.iter().all(u8::is_ascii_whitespace) || bytes.trim_ascii() == b"null" {
            return Ok(OptionalForkBody(ForkBody::default()));
        }
        let req = Request::from_parts(parts, Body::from(bytes));
        let ApiJson(body) = ApiJson::<ForkBody>::from_request(req, state).await?;
        Ok(OptionalForkBody(body))
    }
}

error_responses!(
    ForkErrors:
    SessionNotFound,
    TurnNotFound,
    AgentNotFound,
    TurnNotFinished,
    ValidationError = "a field of the body is not what the schema says",
    StorageQuotaExceeded,
    RateLimited = "the tenant's write share is spent (the copied messages count as written)",
    StorageUnavailable
);

/// A new session whose history is this one's up to the end of a finished
/// turn: its messages (copied, seqs kept) and its summary when that covers
/// nothing past the fork point. No tool runs; the parent is not changed.
/// The fork's `forked_from` names the parent and the turn; its call
/// records are the parent's (`GET /v1/calls?conversation_id=<parent>`,
/// those of turns up to `forked_from.turn_id`). With `Idempotency-Key`, a
/// retry gets the first fork.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/fork",
    operation_id = "fork_session",
    summary = "Fork a session after one of its finished turns",
    tag = "sessions",
    params(("id" = String, Path, description = "Session id")),
    request_body(content = Option<ForkBody>, description = "Optional: where to fork and which agent continues"),
    responses(
        (status = 201, description = "The new session (`forked_from` set)", body = SessionView),
        ForkErrors,
    )
)]
async fn fork(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
    OptionalForkBody(body): OptionalForkBody,
) -> Result<(StatusCode, Json<SessionView>), ApiError> {
    let session = state
        .sessions
        .fork(
            &caller.scope(),
            &id,
            ForkRequest {
                turn_id: body.turn_id,
                agent: body.agent,
            },
        )
        .await?;
    Ok((StatusCode::CREATED, Json(session.into())))
}

/// A page of a session's turns with the state after each
/// (`GET /v1/sessions/{id}/history`).
#[derive(Serialize, ToSchema)]
struct TurnHistory {
    session_id: String,
    /// Oldest first.
    turns: Vec<TurnState>,
    /// How many turns this page holds.
    count: usize,
    /// The `cursor` of the next page; `null` on the last.
    next: Option<String>,
}

error_responses!(
    HistoryErrors:
    SessionNotFound,
    ValidationError = "limit out of range, or a cursor too long or not printable ASCII",
    StorageUnavailable
);

/// The session's turns, oldest first, each with the state the
/// conversation had after it: the summary and the window of messages the
/// next model call would see (what a fork at that turn starts with). A
/// turn not finished has no state yet (`until_seq: null`).
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/history",
    operation_id = "session_history",
    summary = "A session's turns with the state after each, to pick a fork point",
    tag = "sessions",
    params(("id" = String, Path, description = "Session id"), PageQuery),
    responses(
        (status = 200, description = "A page of the session's turns with their states", body = TurnHistory),
        HistoryErrors,
    )
)]
async fn history(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> Result<Json<TurnHistory>, ApiError> {
    let (limit, cursor) =
        super::calls::page_params(q.limit, q.cursor, super::calls::DEFAULT_LIMIT)?;
    let page = state
        .sessions
        .turn_states(&caller.scope(), &id, cursor, limit)
        .await?;
    Ok(Json(TurnHistory {
        session_id: id,
        count: page.items.len(),
        turns: page.items,
        next: page.next,
    }))
}
