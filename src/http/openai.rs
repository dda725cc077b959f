//! The OpenAI door (issue #32): cadre's agents behind the OpenAI API, so
//! `openai.OpenAI(base_url="http://host:8080/v1", api_key=<cadre key>)`
//! works unchanged.
//!
//! ```text
//! GET  /v1/models, /v1/models/{id}        the agents, as models (id = agent name)
//! POST /v1/chat/completions              model = agent; messages ─▶ a session ─▶ one turn ─▶ chat.completion (or chunks + [DONE])
//! POST /v1/responses, GET /v1/responses/{id}   input ─▶ a turn; previous_response_id continues its session
//! ```
//!
//! Decisions (docs/openai.md has the whole mapping):
//! - **Sessions.** A chat completion is stateless for the client: cadre
//!   opens a new session of the agent (visible in listings and the
//!   console), records the earlier `messages` (user and assistant; system
//!   and developer messages are left out: the agent's own prompt is the
//!   system prompt; at most [`MAX_EARLIER_MESSAGES`] = 256 earlier
//!   messages, else 400) and runs the last user message as one turn; tools run
//!   inside cadre. The answer names the session in its id
//!   (`chatcmpl-<session>__<turn>`) and in the `x-cadre-session` header (a
//!   replay of an `Idempotency-Key` answer has the id only: replays keep
//!   the body); a request with `x-cadre-session: <id>` continues that
//!   session instead (only its last user message is sent).
//!   `user` is the session's `user_id`; the session's plan is the highest
//!   the key and its tenant allow (as through A2A); `Idempotency-Key` is
//!   honoured (the idempotency layer, as on every keyed POST).
//! - **Responses.** A response is a turn: its id is `resp_<session>__<turn>`,
//!   so `previous_response_id` names the session to continue and `GET
//!   /v1/responses/{id}` reads the turn's record. `instructions` are not
//!   applied (the agent's prompt is); `output_text` is set.
//! - **Approvals.** A turn paused for a person's decision ends the
//!   completion with `finish_reason: "stop"` and a text that names each
//!   confirmation and how to decide it (`POST /v1/confirmations/{id}`);
//!   a response ends `status: "incomplete"` with `incomplete_details.reason
//!   = "awaiting_approval"` and the same text.
//! - **Ignored** request fields (accepted, not applied): `temperature`,
//!   `top_p`, `max_tokens`, `tools`, `tool_choice`, `response_format`,
//!   `seed`, `stop`, `metadata`, `store`, ... (the agent's settings
//!   decide). `n` other than 1 is a 400.
//! - **Errors** on these routes have OpenAI's shape, `{"error": {"message",
//!   "type", "param", "code"}}` ([`openai_errors`]): an unknown model is 404
//!   `model_not_found` (the SDK's `NotFoundError`), a bad key 401
//!   `invalid_api_key` (`AuthenticationError`).
//! - Not in the OpenAPI document: like `/mcp` and `/a2a`, these routes
//!   follow another API's contract (OpenAI's).

use std::convert::Infallible;

use axum::Extension;
use axum::Json;
use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use super::idempotency::IdempotencyKey;
use super::streams::{StreamQuota, StreamSlot};
use super::turn_log::{Read, Reader, TurnLog, Unread};
use super::turn_stream::ResponseFormatBody;
use crate::conversation::machine::{TurnOutcome, TurnStatus};
use crate::conversation::sessions::TurnInput;
use crate::conversation::{NewSession, TurnEnd};
use crate::identity::Scope;
use crate::model::ChatMessage;
use crate::tenants::Principal;
use crate::tenants::config::plan_ceiling;

/// The header that names (in an answer) and continues (in a request) the
/// session of a chat completion.
pub const SESSION_HEADER: &str = "x-cadre-session";
/// Most messages a chat completion may carry before its last one (each is
/// recorded in the new session: one write each).
pub const MAX_EARLIER_MESSAGES: usize = 256;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/responses", post(create_response))
        .route("/v1/responses/{id}", get(get_response))
}

/// Whether `path` is one of this door's.
pub fn is_openai_path(path: &str) -> bool {
    path == "/v1/models"
        || path.starts_with("/v1/models/")
        || path == "/v1/chat/completions"
        || path == "/v1/responses"
        || path.starts_with("/v1/responses/")
}

/// An OpenAI error body.
fn error(
    status: StatusCode,
    message: &str,
    kind: &str,
    param: Option<&str>,
    code: &str,
) -> Response {
    (
        status,
        Json(json!({"error": {"message": message, "type": kind, "param": param, "code": code}})),
    )
        .into_response()
}

fn model_not_found(model: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        &format!("The model `{model}` does not exist or you do not have access to it."),
        "invalid_request_error",
        Some("model"),
        "model_not_found",
    )
}

/// Rewrites every error of this door's routes (the auth layer's 401, a
/// 429, a cadre error from a handler) into OpenAI's shape, keeping its
/// status, headers and message; cadre's code, lower-cased, is `code`.
pub async fn openai_errors(request: Request, next: Next) -> Response {
    if !is_openai_path(request.uri().path()) {
        return next.run(request).await;
    }
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 64 << 10)
        .await
        .unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if body["error"]["type"].is_string() {
        // Already OpenAI's shape.
        parts.headers.remove(header::CONTENT_LENGTH);
        return Response::from_parts(parts, axum::body::Body::from(bytes));
    }
    let message = body["error"]["message"]
        .as_str()
        .unwrap_or("error")
        .to_string();
    let cadre_code = body["error"]["code"].as_str().unwrap_or("error");
    let (kind, code) = match status {
        StatusCode::UNAUTHORIZED => ("invalid_request_error", "invalid_api_key".to_string()),
        StatusCode::TOO_MANY_REQUESTS => ("rate_limit_error", cadre_code.to_lowercase()),
        s if s.is_server_error() => ("server_error", cadre_code.to_lowercase()),
        _ => ("invalid_request_error", cadre_code.to_lowercase()),
    };
    let mut out = error(status, &message, kind, None, &code);
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name, value.clone());
        }
    }
    out
}

fn model_object(name: &str) -> Value {
    json!({"id": name, "object": "model", "created": 0, "owned_by": "cadre"})
}

async fn models(State(state): State<AppState>) -> Json<Value> {
    let data: Vec<Value> = state
        .sessions
        .agents()
        .iter()
        .map(|a| model_object(&a.name))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

async fn model(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    match state.sessions.agents().get(&id) {
        Some(agent) => Json(model_object(&agent.name)).into_response(),
        None => model_not_found(&id),
    }
}

fn bad_request(message: &str, param: Option<&str>) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        message,
        "invalid_request_error",
        param,
        "invalid_request",
    )
}

/// A message's text: a string, or the text of its parts.
fn text_of(content: &Value) -> Option<String> {
    match content {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join(""),
        ),
        _ => None,
    }
}

/// The session a request continues (its header), or a new one of `agent`.
async fn session_for(
    state: &AppState,
    caller: &Principal,
    headers: &HeaderMap,
    agent: &str,
    user: Option<String>,
    continues: Option<String>,
) -> Result<(String, bool), Response> {
    let named = continues.or_else(|| {
        headers
            .get(SESSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    });
    if let Some(id) = named {
        state
            .sessions
            .get(&caller.scope(), &id)
            .await
            .map_err(|e| ApiError::from(e).into_response())?;
        return Ok((id, false));
    }
    if state.sessions.agents().get(agent).is_none() {
        return Err(model_not_found(agent));
    }
    // The highest plan the key and its tenant allow (as the A2A door
    // does): the agent's tools are what the key may use.
    let plan = plan_ceiling(&state.store, caller)
        .await
        .map_err(|e| ApiError::from(e).into_response())?;
    let session = state
        .sessions
        .create(NewSession {
            tenant: caller.tenant.clone(),
            agent: agent.to_string(),
            user_id: user,
            plan,
            metadata: json!({}),
        })
        .await
        .map_err(|e| ApiError::from(e).into_response())?;
    Ok((session.id, true))
}

/// The text a turn paused for approvals answers with.
fn approval_text(session: &str, outcome: &TurnOutcome) -> String {
    let ids: Vec<String> = outcome
        .confirmations
        .iter()
        .map(|c| {
            serde_json::to_value(c)
                .ok()
                .and_then(|v| v["confirmation_id"].as_str().map(str::to_string))
                .unwrap_or_default()
        })
        .collect();
    format!(
        "[awaiting approval] This turn is paused until a person decides confirmation(s) {}: \
         POST /v1/confirmations/{{id}} with {{\"approve\": true}} or {{\"approve\": false}}. \
         The turn then resumes in session {session}; read it at GET /v1/sessions/{session}/turns/{}.",
        ids.join(", "),
        outcome.turn_id
    )
}

/// What a turn answered, as text.
fn answer_of(session: &str, outcome: &TurnOutcome) -> String {
    if outcome.status == TurnStatus::AwaitingApproval {
        approval_text(session, outcome)
    } else {
        outcome.answer.clone()
    }
}

/// A streamed turn: the caller's stream slot, a reader of the turn's log
/// from its first event, and the log.
async fn streamed(
    state: &AppState,
    quota: &StreamQuota,
    scope: &Scope,
    session: &str,
    input: TurnInput,
    key: Option<String>,
) -> Result<(StreamSlot, Reader, std::sync::Arc<TurnLog>), ApiError> {
    let slot = quota.acquire()?;
    let (reader, log) =
        super::turn_stream::start_logged(state, scope, session, input, key, Unread::Abandon)
            .await?;
    Ok((slot, reader, log))
}

/// The session's token usage now (prompt, completion).
async fn usage_now(state: &AppState, scope: &Scope, session: &str) -> (u64, u64) {
    state
        .sessions
        .summary(scope, session)
        .await
        .map(|s| (s.token_usage.prompt_tokens, s.token_usage.completion_tokens))
        .unwrap_or_default()
}

fn now_secs() -> i64 {
    jiff::Timestamp::now().as_second()
}

#[derive(Deserialize)]
struct ChatRequest {
    model: String,
    messages: Vec<Value>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<Value>,
    user: Option<String>,
    n: Option<u64>,
    /// `{"type": "json_schema", "json_schema": {...}}` and the others of
    /// [`ResponseFormatBody`]: the answer's shape for this turn.
    #[serde(default)]
    response_format: Option<Value>,
}

/// The turn's input with the answer schema a request asked for (a
/// `response_format` of chat completions, or the Responses API's
/// `text.format`, already in the former's shape); a schema cadre cannot
/// use is a 400 naming `param`.
fn turn_input(
    content: String,
    format: Option<Value>,
    param: &str,
) -> Result<TurnInput, Box<Response>> {
    let format = match format {
        None | Some(Value::Null) => None,
        Some(v) => match serde_json::from_value::<ResponseFormatBody>(v) {
            Ok(f) => Some(f),
            Err(e) => return Err(Box::new(bad_request(&format!("{param}: {e}"), Some(param)))),
        },
    };
    match super::turn_stream::output_schema(format) {
        Ok(output_schema) => Ok(TurnInput {
            webhook: None,
            content,
            output_schema,
        }),
        Err(e) => Err(Box::new(bad_request(&e.detail().message, Some(param)))),
    }
}

async fn chat_completions(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Extension(quota): Extension<StreamQuota>,
    key: Option<Extension<IdempotencyKey>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let request: ChatRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return bad_request(
                &format!("the body is not a chat completion request: {e}"),
                None,
            );
        }
    };
    if request.n.is_some_and(|n| n != 1) {
        return bad_request("only n = 1 is supported", Some("n"));
    }
    // The last message is the turn; it must be the user's.
    let Some((last, earlier)) = request.messages.split_last() else {
        return bad_request("messages must not be empty", Some("messages"));
    };
    // Each earlier message is one write: a body of tiny messages must not
    // become thousands of them.
    if earlier.len() > MAX_EARLIER_MESSAGES {
        return bad_request(
            &format!(
                "{} earlier messages; at most {MAX_EARLIER_MESSAGES} (continue a stored session with {SESSION_HEADER} instead)",
                earlier.len()
            ),
            Some("messages"),
        );
    }
    let Some(content) = (last["role"] == "user")
        .then(|| text_of(&last["content"]))
        .flatten()
    else {
        return bad_request(
            "the last message must be a user message with text",
            Some("messages"),
        );
    };
    let input = match turn_input(content, request.response_format.clone(), "response_format") {
        Ok(i) => i,
        Err(r) => return *r,
    };
    let scope = caller.scope();
    let (session, new) = match session_for(
        &state,
        &caller,
        &headers,
        &request.model,
        request.user.clone(),
        None,
    )
    .await
    {
        Ok(s) => s,
        Err(r) => return r,
    };
    if new {
        for message in earlier {
            let Some(text) = text_of(&message["content"]) else {
                continue;
            };
            let message = match message["role"].as_str() {
                Some("user") => ChatMessage::user(text),
                Some("assistant") => ChatMessage::assistant(text),
                _ => continue,
            };
            if let Err(e) = state
                .sessions
                .record_message(&scope, &session, message)
                .await
            {
                return ApiError::from(e).into_response();
            }
        }
    }
    let key = key.map(|Extension(IdempotencyKey(k))| k);
    let before = usage_now(&state, &scope, &session).await;
    let created = now_secs();
    let model = request.model.clone();
    let mut response = if request.stream {
        let include_usage = request
            .stream_options
            .as_ref()
            .is_some_and(|o| o["include_usage"] == true);
        let (slot, reader, log) = match streamed(&state, &quota, &scope, &session, input, key).await
        {
            Ok(started) => started,
            Err(e) => return e.into_response(),
        };
        let id = completion_id(&session, log.turn_id());
        let id_for_usage = id.clone();
        let chunk = move |delta: Value, finish: Option<&str>| {
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]})
        };
        let first = futures::stream::once({
            let c = chunk(json!({"role": "assistant", "content": ""}), None);
            async move { Ok::<_, Infallible>(SseEvent::default().data(c.to_string())) }
        });
        let (st, sc, sid) = (state.clone(), scope.clone(), session.clone());
        let paused_session = session.clone();
        let body = reader.into_stream().flat_map(move |read| {
            let mut out: Vec<Value> = Vec::new();
            if let Read::Frame(frame) = read {
                let data: Value = serde_json::from_str(&frame.data).unwrap_or(Value::Null);
                match frame.name {
                    "model_delta" => out.push(chunk(json!({"content": data["text"]}), None)),
                    "turn_completed" => out.push(chunk(json!({}), Some("stop"))),
                    "turn_paused" => {
                        let outcome: Option<TurnOutcome> = serde_json::from_value(data).ok();
                        let text = outcome
                            .map(|o| approval_text(&paused_session, &o))
                            .unwrap_or_default();
                        out.push(chunk(json!({"content": text}), None));
                        out.push(chunk(json!({}), Some("stop")));
                    }
                    "turn_interrupted" => out.push(json!({"error": {
                        "message": "a newer message cut this turn", "type": "server_error",
                        "param": null, "code": "turn_interrupted"}})),
                    "turn_failed" => out.push(json!({"error": {
                        "message": data["error"]["message"], "type": "server_error",
                        "param": null, "code": data["error"]["code"].as_str().map(str::to_lowercase)}})),
                    _ => {}
                }
            }
            futures::stream::iter(out)
        });
        let (uid, umodel) = (id_for_usage, request.model.clone());
        let tail = futures::stream::once(async move {
            let mut out = Vec::new();
            if include_usage {
                let after = usage_now(&st, &sc, &sid).await;
                let (p, c) = (after.0.saturating_sub(before.0), after.1.saturating_sub(before.1));
                out.push(json!({"id": uid, "object": "chat.completion.chunk", "created": created, "model": umodel,
                    "choices": [], "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}}));
            }
            futures::stream::iter(out)
        })
        .flatten();
        let done = futures::stream::once(async {
            Ok::<_, Infallible>(SseEvent::default().data("[DONE]"))
        });
        let events = body
            .chain(tail)
            .map(|v| Ok::<_, Infallible>(SseEvent::default().data(v.to_string())));
        Sse::new(slot.hold(first.chain(events).chain(done)))
            .keep_alive(KeepAlive::default())
            .into_response()
    } else {
        let started = match state
            .sessions
            .start_turn(&scope, &session, input, None, key)
            .await
        {
            Ok(s) => s,
            Err(e) => return ApiError::from(e).into_response(),
        };
        let outcome = match started.outcome.await {
            Ok(o) => o,
            Err(e) => return ApiError::from(e).into_response(),
        };
        let id = completion_id(&session, &outcome.turn_id);
        let after = usage_now(&state, &scope, &session).await;
        let (p, c) = (
            after.0.saturating_sub(before.0),
            after.1.saturating_sub(before.1),
        );
        Json(json!({
            "id": id, "object": "chat.completion", "created": created, "model": request.model,
            "choices": [{"index": 0, "finish_reason": "stop", "logprobs": null,
                "message": {"role": "assistant", "content": answer_of(&session, &outcome), "refusal": null}}],
            "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
        }))
        .into_response()
    };
    if let Ok(value) = HeaderValue::from_str(&session) {
        response.headers_mut().insert(SESSION_HEADER, value);
    }
    response
}

#[derive(Deserialize)]
struct ResponseRequest {
    model: String,
    input: Value,
    #[serde(default)]
    stream: bool,
    previous_response_id: Option<String>,
    user: Option<String>,
    instructions: Option<String>,
    /// `{"format": {"type": "json_schema", "name", "schema", "strict"?}}`
    /// (or `{"type": "text"}`, `{"type": "json_object"}`).
    #[serde(default)]
    text: Option<Value>,
}

/// `chatcmpl-<session>__<turn>`: a completion names its session (a
/// replayed answer, `Idempotency-Key`, carries only its body).
fn completion_id(session: &str, turn: &str) -> String {
    format!("chatcmpl-{session}__{turn}")
}

/// `resp_<session>__<turn>`.
fn response_id(session: &str, turn: &str) -> String {
    format!("resp_{session}__{turn}")
}

fn parse_response_id(id: &str) -> Option<(String, String)> {
    let rest = id.strip_prefix("resp_")?;
    let (session, turn) = rest.rsplit_once("__")?;
    (!session.is_empty() && !turn.is_empty()).then(|| (session.to_string(), turn.to_string()))
}

/// The user's text of `input`: a string, or the last user item's text.
fn input_text(input: &Value) -> Option<String> {
    match input {
        Value::String(s) => Some(s.clone()),
        Value::Array(items) => items
            .iter()
            .rev()
            .find(|i| i["role"] == "user")
            .and_then(|i| text_of(&i["content"])),
        _ => None,
    }
}

/// A Responses API object.
#[allow(clippy::too_many_arguments)]
fn response_object(
    id: &str,
    model: &str,
    status: &str,
    text: Option<&str>,
    usage: Option<(u64, u64)>,
    previous: Option<&str>,
    instructions: Option<&str>,
    incomplete: Option<&str>,
) -> Value {
    let output: Vec<Value> = text
        .map(|t| {
            vec![
                json!({"id": format!("msg_{}", id.trim_start_matches("resp_")), "type": "message",
                "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": t, "annotations": []}]}),
            ]
        })
        .unwrap_or_default();
    json!({
        "id": id, "object": "response", "created_at": now_secs(), "status": status, "model": model,
        "output": output, "output_text": text.unwrap_or(""),
        "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
        "previous_response_id": previous, "instructions": instructions, "error": null,
        "incomplete_details": incomplete.map(|r| json!({"reason": r})),
        "usage": usage.map(|(p, c)| json!({"input_tokens": p,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": c, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": p + c})),
    })
}

async fn create_response(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Extension(quota): Extension<StreamQuota>,
    key: Option<Extension<IdempotencyKey>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let request: ResponseRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(&format!("the body is not a response request: {e}"), None),
    };
    let Some(content) = input_text(&request.input) else {
        return bad_request(
            "input must be text or hold a user message with text",
            Some("input"),
        );
    };
    // The Responses API's `text.format` flattens `json_schema`'s fields.
    let format = request.text.as_ref().map(|t| t["format"].clone()).map(|f| {
        if f["type"] == "json_schema" {
            let mut inner = f.clone();
            if let Some(o) = inner.as_object_mut() {
                o.remove("type");
            }
            json!({"type": "json_schema", "json_schema": inner})
        } else {
            f
        }
    });
    let input = match turn_input(content, format, "text.format") {
        Ok(i) => i,
        Err(r) => return *r,
    };
    let continues = match &request.previous_response_id {
        Some(previous) => match parse_response_id(previous) {
            Some((session, _)) => Some(session),
            None => {
                return error(
                    StatusCode::NOT_FOUND,
                    &format!("Previous response with id '{previous}' not found."),
                    "invalid_request_error",
                    Some("previous_response_id"),
                    "previous_response_not_found",
                );
            }
        },
        None => None,
    };
    if continues.is_none() && state.sessions.agents().get(&request.model).is_none() {
        return model_not_found(&request.model);
    }
    let scope = caller.scope();
    let (session, _) = match session_for(
        &state,
        &caller,
        &headers,
        &request.model,
        request.user.clone(),
        continues,
    )
    .await
    {
        Ok(s) => s,
        Err(r) => return r,
    };
    let key = key.map(|Extension(IdempotencyKey(k))| k);
    let before = usage_now(&state, &scope, &session).await;
    let (model, previous, instructions) = (
        request.model.clone(),
        request.previous_response_id.clone(),
        request.instructions.clone(),
    );
    if !request.stream {
        let started = match state
            .sessions
            .start_turn(&scope, &session, input, None, key)
            .await
        {
            Ok(s) => s,
            Err(e) => return ApiError::from(e).into_response(),
        };
        let turn = started.turn_id.clone();
        let outcome = match started.outcome.await {
            Ok(o) => o,
            Err(e) => return ApiError::from(e).into_response(),
        };
        let after = usage_now(&state, &scope, &session).await;
        let usage = (
            after.0.saturating_sub(before.0),
            after.1.saturating_sub(before.1),
        );
        let paused = outcome.status == TurnStatus::AwaitingApproval;
        return Json(response_object(
            &response_id(&session, &turn),
            &model,
            if paused { "incomplete" } else { "completed" },
            Some(&answer_of(&session, &outcome)),
            Some(usage),
            previous.as_deref(),
            instructions.as_deref(),
            paused.then_some("awaiting_approval"),
        ))
        .into_response();
    }
    let (slot, reader, log) = match streamed(&state, &quota, &scope, &session, input, key).await {
        Ok(started) => started,
        Err(e) => return e.into_response(),
    };
    let id = response_id(&session, log.turn_id());
    let item_id = format!("msg_{}", id.trim_start_matches("resp_"));
    let base = response_object(
        &id,
        &model,
        "in_progress",
        None,
        None,
        previous.as_deref(),
        instructions.as_deref(),
        None,
    );
    let opening = vec![
        json!({"type": "response.created", "response": base}),
        json!({"type": "response.in_progress", "response": base}),
        json!({"type": "response.output_item.added", "output_index": 0,
            "item": {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []}}),
        json!({"type": "response.content_part.added", "item_id": item_id, "output_index": 0, "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": []}}),
    ];
    let (st, sc, sid) = (state.clone(), scope.clone(), session.clone());
    let body = futures::stream::iter(opening).chain(
        reader
            .into_stream()
            .then(move |read| {
                let (st, sc, sid, id, item_id, model, previous, instructions) = (
                    st.clone(), sc.clone(), sid.clone(), id.clone(), item_id.clone(),
                    model.clone(), previous.clone(), instructions.clone(),
                );
                async move {
                    let Read::Frame(frame) = read else { return Vec::new() };
                    let data: Value = serde_json::from_str(&frame.data).unwrap_or(Value::Null);
                    let end = match frame.name {
                        "model_delta" => {
                            return vec![json!({"type": "response.output_text.delta", "item_id": item_id,
                                "output_index": 0, "content_index": 0, "delta": data["text"], "logprobs": []})];
                        }
                        "turn_completed" | "turn_paused" => serde_json::from_value::<TurnOutcome>(data)
                            .map(|o| if o.status == TurnStatus::AwaitingApproval { TurnEnd::Paused(o) } else { TurnEnd::Completed(o) })
                            .ok(),
                        "turn_interrupted" => Some(TurnEnd::Interrupted),
                        "turn_failed" => Some(TurnEnd::Failed(crate::conversation::machine::TurnFailure {
                            code: data["error"]["code"].as_str().unwrap_or("INTERNAL_ERROR").to_string(),
                            message: data["error"]["message"].as_str().unwrap_or("the turn failed").to_string(),
                            details: data["error"].get("details").cloned(),
                        })),
                        _ => None,
                    };
                    let Some(end) = end else { return Vec::new() };
                    let after = usage_now(&st, &sc, &sid).await;
                    let usage = (after.0.saturating_sub(before.0), after.1.saturating_sub(before.1));
                    match end {
                        TurnEnd::Completed(o) | TurnEnd::Paused(o) => {
                            let paused = o.status == TurnStatus::AwaitingApproval;
                            let text = answer_of(&sid, &o);
                            let part = json!({"type": "output_text", "text": text, "annotations": []});
                            let done = response_object(&id, &model, if paused { "incomplete" } else { "completed" },
                                Some(&text), Some(usage), previous.as_deref(), instructions.as_deref(),
                                paused.then_some("awaiting_approval"));
                            let mut out = Vec::new();
                            if paused {
                                out.push(json!({"type": "response.output_text.delta", "item_id": item_id,
                                    "output_index": 0, "content_index": 0, "delta": text, "logprobs": []}));
                            }
                            out.extend([
                                json!({"type": "response.output_text.done", "item_id": item_id, "output_index": 0,
                                    "content_index": 0, "text": text, "logprobs": []}),
                                json!({"type": "response.content_part.done", "item_id": item_id, "output_index": 0,
                                    "content_index": 0, "part": part}),
                                json!({"type": "response.output_item.done", "output_index": 0,
                                    "item": done["output"][0]}),
                                json!({"type": if paused { "response.incomplete" } else { "response.completed" },
                                    "response": done}),
                            ]);
                            out
                        }
                        TurnEnd::Failed(f) => {
                            let mut failed = response_object(&id, &model, "failed", None, Some(usage),
                                previous.as_deref(), instructions.as_deref(), None);
                            failed["error"] = json!({"code": f.code.to_lowercase(), "message": f.message});
                            vec![json!({"type": "response.failed", "response": failed})]
                        }
                        TurnEnd::Interrupted => {
                            let mut failed = response_object(&id, &model, "cancelled", None, Some(usage),
                                previous.as_deref(), instructions.as_deref(), None);
                            failed["error"] = json!({"code": "turn_interrupted", "message": "a newer message cut this turn"});
                            vec![json!({"type": "response.failed", "response": failed})]
                        }
                    }
                }
            })
            .flat_map(futures::stream::iter),
    );
    let events = body.enumerate().map(|(seq, mut event)| {
        event["sequence_number"] = json!(seq);
        let name = event["type"].as_str().unwrap_or("message").to_string();
        Ok::<_, Infallible>(SseEvent::default().event(name).data(event.to_string()))
    });
    Sse::new(slot.hold(events))
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn get_response(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Response {
    let not_found = || {
        error(
            StatusCode::NOT_FOUND,
            &format!("Response with id '{id}' not found."),
            "invalid_request_error",
            None,
            "response_not_found",
        )
    };
    let Some((session, turn)) = parse_response_id(&id) else {
        return not_found();
    };
    let scope = caller.scope();
    let Ok(stored) = state.sessions.get(&scope, &session).await else {
        return not_found();
    };
    let record = match state.sessions.turn(&scope, &session, &turn).await {
        Ok(r) => r,
        Err(_) => return not_found(),
    };
    use crate::conversation::machine::Phase;
    let (status, text, incomplete) = match (&record.phase, &record.outcome) {
        (Phase::Completed, Some(o)) => ("completed", Some(o.answer.clone()), None),
        (Phase::Failed, _) => ("failed", None, None),
        (Phase::Interrupted, _) => ("cancelled", None, None),
        (Phase::AwaitingApproval { .. }, _) => ("incomplete", None, Some("awaiting_approval")),
        _ => ("in_progress", None, None),
    };
    let mut object = response_object(
        &id,
        &stored.agent,
        status,
        text.as_deref(),
        None,
        None,
        None,
        incomplete,
    );
    if let (Phase::Failed, Some(e)) = (&record.phase, &record.error) {
        object["error"] = json!({"code": e.code.to_lowercase(), "message": e.message});
    }
    Json(object).into_response()
}
