//! A turn as Server-Sent Events, resumable (issue #32).
//!
//! ```text
//! POST /v1/sessions/{id}/messages/stream ─┐  (or POST .../messages with Accept: text/event-stream)
//!                                         ├─▶ start_turn(sink) ─▶ turn_log::TurnLogs::follow ─▶ reader ─▶ SSE
//! GET  /v1/sessions/{id}/turns/{turn_id}/events  (Last-Event-ID / ?after=) ─▶ the log, or the turn's record ─▶ SSE
//! ```
//!
//! Every frame has an `id:` ([`turn_log`] says which and how long a turn's
//! events are kept); a stream starts with `retry: 2000` and ends after
//! the turn's last event; a reconnect that already saw it gets `204 No
//! Content`, so an EventSource stops. The stream is its own operation in
//! the OpenAPI document (`stream_message`), so a generated client never
//! sees one response mix JSON and events; `POST .../messages` with
//! `Accept: text/event-stream` stays for the clients written before.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use tokio::sync::mpsc;
use utoipa::IntoParams;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::error::TurnFailed;
use super::extract::{ApiJson, ApiQuery};
use super::idempotency::{IdempotencyKey, TurnSlot};
use super::openapi::{Lagged, error_responses};
use super::streams::StreamQuota;
use super::turn_log::{self, Frame, Position, Read, Reader, TurnLog, Unread};
use crate::conversation::TurnEnd;
use crate::conversation::actor::TurnEvent;
use crate::conversation::machine::TurnOutcome;
use crate::conversation::sessions::TurnInput;
use crate::identity::Scope;
use crate::model::ResponseFormat;
use crate::tenants::Principal;
use crate::tools::output_schema::OutputSchema;

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct MessageBody {
    /// The user's message, at most 256 KiB.
    #[schema(
        min_length = 1,
        pattern = "[^\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]"
    )]
    pub(super) content: String,
    /// The JSON shape this turn's answer must have, in OpenAI's shape:
    /// `{"type": "json_schema", "json_schema": {"name", "schema", "strict"?,
    /// "description"?}}` (the schema's root an object), `{"type":
    /// "json_object"}` (any object) or `{"type": "text"}` (none, the
    /// default). It replaces the agent's `output_schema` for this turn; the
    /// reply's `output` holds the parsed answer, or the turn fails with
    /// `OUTPUT_SCHEMA_VIOLATION`.
    #[serde(default)]
    pub(super) response_format: Option<ResponseFormatBody>,
    /// Where to POST the turn's end (completed, failed, interrupted, or
    /// paused for an approval) as a signed Standard Webhooks event, at
    /// least once from a durable outbox (docs/webhooks.md). Meant for
    /// `Prefer: respond-async`; any turn may have one. A URL cadre may not
    /// reach is 422 `WEBHOOK_REFUSED`.
    #[serde(default)]
    #[schema(max_length = 2048)]
    pub(super) webhook: Option<String>,
}

impl MessageBody {
    /// The turn's input: the text, the schema asked for and the webhook
    /// target, checked.
    pub(super) async fn into_input(
        self,
        state: &AppState,
        scope: &Scope,
    ) -> Result<TurnInput, ApiError> {
        let output_schema = output_schema(self.response_format)?;
        let webhook = match self.webhook {
            Some(url) => Some(state.webhooks.check(scope.name(), &url).await?),
            None => None,
        };
        Ok(TurnInput {
            content: self.content,
            output_schema,
            webhook,
        })
    }
}

/// A message's `response_format` (OpenAI's shape).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum ResponseFormatBody {
    /// No schema: the answer is text.
    Text,
    /// Any JSON object.
    JsonObject,
    /// A JSON object matching `json_schema.schema`.
    JsonSchema { json_schema: ResponseFormat },
}

/// The compiled schema a `response_format` asks for; a schema that is
/// not usable is a 422 naming what is wrong.
pub(super) fn output_schema(
    format: Option<ResponseFormatBody>,
) -> Result<Option<Arc<OutputSchema>>, ApiError> {
    let format = match format {
        None | Some(ResponseFormatBody::Text) => return Ok(None),
        Some(ResponseFormatBody::JsonObject) => ResponseFormat {
            name: "json_object".into(),
            description: None,
            schema: serde_json::json!({"type": "object"}),
            strict: None,
        },
        Some(ResponseFormatBody::JsonSchema { json_schema }) => json_schema,
    };
    OutputSchema::new(format, true)
        .map(|s| Some(Arc::new(s)))
        .map_err(|why| {
            ApiError::new(
                crate::error_code::ErrorCode::ValidationError,
                format!("response_format: {why}"),
            )
        })
}

error_responses!(
    SendErrors:
    SessionNotFound,
    WebhookRefused,
    ConversationBusy = "a turn is running and the agent rejects concurrent messages",
    ConversationQueueFull = "`[sessions] max_queued_turns` turns already wait in the session",
    TurnInterrupted = "a newer message cut this turn (`multitask` `interrupt` or `rollback`)",
    BudgetExceeded,
    RateLimited = "over the API's request rate, or the tenant's share of the store (`[tenants] write_kib_per_s`)",
    StorageQuotaExceeded,
    PayloadTooLarge = "the body is over 1 MiB or content over 256 KiB",
    ValidationError = "empty content, unknown field, or a `response_format` cadre cannot use",
    GuardrailTripped = "a guardrail refused the message (before anything was stored or sent) or the answer",
    ModelUnavailable,
    ModelBadResponse,
    ModelRejected,
    OutputSchemaViolation,
    ModelKeyNotSet,
    StorageUnavailable,
    ConversationUnavailable,
    ModelTimeout
);

super::openapi::event_stream! {
    /// The events of a streamed turn, in this order: `turn_queued` when it
    /// waits behind a paused turn, `turn_started`, then `model_delta` and
    /// tool calls as they happen, then `turn_completed` (the JSON reply),
    /// `turn_paused`, `turn_interrupted` or `turn_failed`.
    TurnStream {
        "turn_queued" => TurnEvent,
        "turn_started" => TurnEvent,
        "model_delta" => TurnEvent,
        "tool_call_started" => TurnEvent,
        "tool_call_completed" => TurnEvent,
        "turn_completed" => TurnOutcome,
        "turn_paused" => TurnOutcome,
        "turn_interrupted" => TurnEvent,
        "turn_failed" => TurnFailed,
        "lagged" => Lagged,
    }
}

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(stream_message))
        .routes(routes!(turn_events))
}

/// One turn, streamed: the events of `POST /v1/sessions/{id}/messages`
/// with `Accept: text/event-stream`, as their own operation. Each event
/// has an `id:`; a client that loses the stream reconnects to
/// `GET /v1/sessions/{id}/turns/{turn_id}/events` (the turn id is in
/// `turn_started`) with `Last-Event-ID` and misses nothing. Comments (`:`)
/// keep an idle stream alive every 15 s. A client that reads slower than
/// the model writes reads the turn's log at its pace; past 1 MiB of
/// events it missed, it gets `lagged` (`{missed}`) and goes on from the
/// oldest kept (the last event carries the whole answer).
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/messages/stream",
    operation_id = "stream_message",
    summary = "Send a message: one turn, as Server-Sent Events",
    tag = "sessions",
    params(("id" = String, Path, description = "Session id")),
    request_body = MessageBody,
    responses(
        (status = 200, description = "Server-Sent Events: `turn_queued` when it waits behind a paused turn, `turn_started`, `model_delta`, `tool_call_started`, `tool_call_completed`, then `turn_completed` (data: the JSON reply), `turn_paused`, `turn_interrupted` or `turn_failed` (data: the JSON error body); `lagged` (`{missed}`) when the turn's log dropped events the client had not read",
            content_type = "text/event-stream", body = TurnStream),
        SendErrors,
    )
)]
#[allow(clippy::too_many_arguments)] // axum extractors, one per part of the request
async fn stream_message(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Extension(quota): Extension<StreamQuota>,
    Path(id): Path<String>,
    key: Option<Extension<IdempotencyKey>>,
    turn_slot: Option<Extension<TurnSlot>>,
    _room: super::storage_room::StorageRoom,
    ApiJson(body): ApiJson<MessageBody>,
) -> Result<Response, ApiError> {
    let scope = caller.scope();
    state.sessions.get(&scope, &id).await?;
    let key = key.map(|Extension(IdempotencyKey(k))| k);
    let input = body.into_input(&state, &scope).await?;
    stream_turn(&state, &scope, &quota, &id, input, key, turn_slot).await
}

/// Starts a turn and answers its events (see the module doc); a turn
/// refused outright (too many streams 429, busy 409, storage 503) is a
/// plain error reply, before any stream starts.
pub(super) async fn stream_turn(
    state: &AppState,
    scope: &Scope,
    quota: &StreamQuota,
    id: &str,
    input: impl Into<TurnInput>,
    key: Option<String>,
    turn_slot: Option<Extension<TurnSlot>>,
) -> Result<Response, ApiError> {
    let slot = quota.acquire()?;
    let (reader, _log) = start_logged(state, scope, id, input, key, Unread::Abandon).await?;
    if let Some(Extension(turn_slot)) = &turn_slot {
        turn_slot.fill(_log.turn_id().to_string());
    }
    let events = sse_frames(reader.into_stream());
    Ok(Sse::new(slot.hold(with_retry(events)))
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// Starts a turn whose events go to a log of [`AppState::turn_logs`]: a
/// reader from its first frame, and the log.
pub(super) async fn start_logged(
    state: &AppState,
    scope: &Scope,
    id: &str,
    input: impl Into<TurnInput>,
    key: Option<String>,
    unread: Unread,
) -> Result<(Reader, Arc<TurnLog>), ApiError> {
    let (tx, rx) = mpsc::unbounded_channel();
    let started = state
        .sessions
        .start_turn(scope, id, input, Some(tx), key)
        .await?;
    let (log, reader) = state.turn_logs.follow(id, started, rx, unread);
    Ok((reader, log))
}

/// `events`, the first one carrying the `retry:` every turn stream opens
/// with (on a frame of its own, some clients would see an empty event).
fn with_retry(
    events: impl Stream<Item = Result<SseEvent, Infallible>> + Send,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send {
    events.enumerate().map(|(i, event)| match (i, event) {
        (0, Ok(event)) => Ok(event.retry(turn_log::RETRY)),
        (_, event) => event,
    })
}

/// A log's reads as SSE events.
fn sse_frames(
    reads: impl Stream<Item = Read> + Send,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send {
    reads.map(|read| {
        Ok(match read {
            Read::Frame(frame) => frame.sse(),
            Read::Lagged(missed) => Lagged::event(missed),
        })
    })
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct AfterQuery {
    /// The id of the last event seen (`n` or `n.end`), for clients that
    /// cannot set `Last-Event-ID`; the header wins when both are sent.
    after: Option<String>,
}

error_responses!(
    TurnEventsErrors:
    SessionNotFound,
    TurnNotFound,
    TooManyStreams,
    StorageUnavailable
);

/// A turn's events, from the start or after `Last-Event-ID`: every later
/// event exactly once, then the live ones, then the stream ends after the
/// turn's last event (`turn_completed`, `turn_paused`, `turn_interrupted`
/// or `turn_failed`, whose id ends in `.end`). A reconnect after that last
/// event is answered `204 No Content` (an EventSource stops there). The
/// events are kept while the turn runs and 5 minutes after; after that,
/// or after the node that ran the turn died, the stream is the turn's end
/// only, read from its stored record (waited for while it runs).
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/turns/{turn_id}/events",
    operation_id = "turn_events",
    summary = "A turn's events as Server-Sent Events, resumable with Last-Event-ID",
    tag = "sessions",
    params(
        ("id" = String, Path, description = "Session id"),
        ("turn_id" = String, Path, description = "Turn id (from `turn_started` or the message's reply)"),
        ("Last-Event-ID" = Option<String>, Header, description = "The id of the last event seen (`n` or `n.end`)"),
        AfterQuery,
    ),
    responses(
        (status = 200, description = "Server-Sent Events: the turn's events after the one named, as `POST .../messages/stream` sends them", content_type = "text/event-stream", body = TurnStream),
        (status = 204, description = "The client already saw the turn's last event: nothing follows"),
        TurnEventsErrors,
    )
)]
async fn turn_events(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Extension(quota): Extension<StreamQuota>,
    Path((id, turn_id)): Path<(String, String)>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<AfterQuery>,
) -> Result<Response, ApiError> {
    let scope = caller.scope();
    // 404 for another tenant's session, or (below) an unknown turn.
    state.sessions.get(&scope, &id).await?;
    let position = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or(query.after)
        .and_then(|p| Position::parse(&p));
    let log = state.turn_logs.get(&id, &turn_id);
    if log.is_none() {
        // Its record may lag its log by a write; without a log, it is
        // what says the turn exists.
        state.sessions.turn(&scope, &id, &turn_id).await?;
    }
    let after = position.map(|p| p.seq);
    let body: futures::stream::BoxStream<'static, Result<SseEvent, Infallible>> = match log {
        Some(log) => {
            let paused = log
                .last_frame()
                .filter(|f| f.name == "turn_paused" && log.is_done_after(f.seq));
            let (sessions, sid, tid) = (state.sessions.clone(), id.clone(), turn_id.clone());
            // After a `turn_paused` that ended the log, the turn's end
            // once it moved on (an approval was decided).
            let tail = futures::stream::once(async move {
                let paused = paused?;
                match sessions.turn_end(&scope, &sid, &tid).await {
                    Ok(TurnEnd::Paused(o)) if same_pause(&o, &paused) => None,
                    Ok(end) => Some(Ok(
                        turn_log::end_frame(&end, paused.seq.saturating_add(1)).sse()
                    )),
                    Err(e) => Some(Ok(ApiError::from(e).sse_event())),
                }
            })
            .filter_map(|e| async move { e });
            let seen_all = after.is_some_and(|a| log.is_done_after(a));
            if seen_all {
                // Nothing of the log is left to read: only a pause's
                // sequel, if there is one.
                let seq_paused = log.last_frame().filter(|f| f.name == "turn_paused");
                if seq_paused.is_none() || !moved_on(&state, &caller.scope(), &id, &turn_id).await?
                {
                    return Ok(StatusCode::NO_CONTENT.into_response());
                }
                tail.boxed()
            } else {
                sse_frames(log.reader(after).into_stream())
                    .chain(tail)
                    .boxed()
            }
        }
        None if position.is_some_and(|p| p.ended) => {
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        None => {
            // No log here (expired, or the node that ran it died): the
            // turn's end from its record.
            let seq = after.map_or(0, |n| n.saturating_add(1));
            let sessions = state.sessions.clone();
            futures::stream::once(async move {
                match sessions.turn_end(&scope, &id, &turn_id).await {
                    Ok(end) => Ok(turn_log::end_frame(&end, seq).sse()),
                    Err(e) => Ok(ApiError::from(e).sse_event()),
                }
            })
            .boxed()
        }
    };
    let slot = quota.acquire()?;
    Ok(Sse::new(slot.hold(with_retry(body)))
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// The turn is no longer paused (an approval was decided since).
async fn moved_on(
    state: &AppState,
    scope: &Scope,
    id: &str,
    turn_id: &str,
) -> Result<bool, ApiError> {
    let record = state.sessions.turn(scope, id, turn_id).await?;
    Ok(!matches!(
        record.phase,
        crate::conversation::machine::Phase::AwaitingApproval { .. }
    ))
}

/// `outcome` is the pause `frame` said (the same confirmations).
fn same_pause(outcome: &crate::conversation::TurnOutcome, frame: &Frame) -> bool {
    serde_json::from_str::<serde_json::Value>(&frame.data).is_ok_and(|v| {
        v["confirmations"] == serde_json::to_value(&outcome.confirmations).unwrap_or_default()
    })
}
