//! Visitor chat over a WebSocket: `GET /v1/sessions/{id}/ws`.
//!
//! client ──{"type": "visitor_message" | "operator_message" | "assign_operator" | "unassign_operator"}──▶ server
//! server ──{"type": "message_stored" | "auto_respond" | turn events... | "error"}──▶ client
//!
//! frame ──rate limit · parse · operator_id length──▶ conversation::visitor
//!     (Sessions::visitor_message → decision → deliver: stored | start_turn;
//!      Sessions::operator_message; Sessions::set_operator) ──▶ frames back
//!
//! This file is the transport only: it parses frames, checks the
//! frame-level limits and writes frames. The protocol's decisions live in
//! [`crate::conversation::visitor`]: whether a visitor message gets a
//! model turn (auto-response, and the tenant's `response_delay_ms` before
//! it), storing it without one, operator messages (assistant messages
//! named `operator:<id>`); every turn starts through
//! [`crate::conversation::Sessions::start_turn`]. A visitor message's
//! decision and its reason are sent as an `auto_respond` frame before the
//! delay; then either `message_stored` or the turn's events (`turn_started`,
//! `model_delta`, `tool_call_started`, `tool_call_completed`,
//! `turn_completed`). Frames are handled one at a time, in order; a bad
//! frame gets an `error` frame and the socket stays open. Frames over
//! [`MAX_FRAME_BYTES`] close it; an `operator_id` over
//! [`MAX_OPERATOR_ID_BYTES`] gets an `error` frame (`VALIDATION_ERROR`).
//!
//! A turn's events are paced as an SSE reply's are ([`super::streams`]'s
//! `paced`): while the client reads slowly, consecutive `model_delta`s are
//! merged into one frame; once more than `MAX_TURN_STREAM_LAG_BYTES`
//! (1 MiB) wait for it, the socket gets one `error` frame
//! `STREAM_LAGGED` (naming the turn) instead of the rest of the turn's
//! events. The turn goes on and is stored (its record and the history
//! have it); the socket stays open and reads its next frame once the turn
//! ended. So a socket that does not read holds at most the pacing buffer,
//! the lag limit and the kernel's socket buffers, whatever the model sends.
//!
//! Browsers cannot set `Authorization` on a WebSocket: they first ask
//! `POST /v1/sessions/{id}/ws-token` (with the key, for a session of the
//! key's tenant) for a single-use token of 60 s and open the socket with
//! `?token=` (authentication redeems it, [`super::auth`]; the tokens live
//! in [`crate::tenants::tokens`], in the memory of the node that issued
//! them; in cluster mode that is the node the token request reached).
//! The socket then has the key's rights, as with the header.
//!
//! A socket holds one of its caller's stream slots ([`super::streams`],
//! `[api_limit] max_streams`, shared with the SSE endpoints) from the
//! upgrade until it closes: the slot is taken before the upgrade, so over
//! the cap the request is answered with the 429 `TOO_MANY_STREAMS` JSON
//! error and never switches protocols. A socket is not ended at shutdown
//! the way SSE subscriptions are; it lasts as long as its connection.
//!
//! Every text frame is a request to the API's rate limit: it takes a cell
//! of the caller's bucket ([`super::rate_limit::RequestBudget`], the same
//! bucket as the caller's REST requests) before it is parsed. Over the
//! limit the frame gets an `error` frame with `RATE_LIMITED` and is not
//! acted on (nothing stored, no turn); the socket stays open. A turn a
//! visitor message started is queued like any other
//! (`[sessions] max_queued_turns`); frames are handled one at a time, so
//! one socket waits for its own turn before the next frame is read.

use std::sync::atomic::Ordering;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::{Extension, Json};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::openapi::error_responses;
use super::rate_limit::RequestBudget;
use super::streams::{MAX_TURN_STREAM_LAG_BYTES, StreamQuota, StreamSlot, paced};
use crate::conversation::actor::TurnEvent;
use crate::conversation::sessions::StartedTurn;
use crate::conversation::visitor::{Content, Delivered};
use crate::error_code::ErrorCode;
use crate::tenants::Principal;
use crate::tenants::tokens::WS_TOKEN_TTL;

pub const MAX_FRAME_BYTES: usize = 256 * 1024;
/// The longest `operator_id` a frame may carry (as a `user_id`).
pub const MAX_OPERATOR_ID_BYTES: usize = 128;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(upgrade))
        .routes(routes!(issue_token))
}

/// A token for a browser's `new WebSocket(url)`.
#[derive(Serialize, ToSchema)]
struct WsToken {
    /// `cadt_<hex>`: open the socket with `?token=<token>` within
    /// `expires_in` seconds; it works once, for this session only.
    token: String,
    session_id: String,
    /// Seconds the token waits for its socket (60).
    expires_in: u64,
}

error_responses!(
    TokenErrors:
    SessionNotFound,
    TooManyWsTokens,
    StorageUnavailable
);

#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/ws-token",
    operation_id = "create_ws_token",
    summary = "A single-use, 60-second token to open this session's WebSocket from a browser",
    tag = "sessions",
    description = "Browsers cannot set `Authorization` on a WebSocket. With the key (as for any request), this returns a token that opens `GET /v1/sessions/{id}/ws?token=<token>` once, within 60 s, with this key's rights; the key itself never goes in a URL. A token stops working when its key is revoked or expires. Tokens are kept in the memory of the process that issued them.",
    params(("id" = String, Path, description = "Session id (the caller tenant's)")),
    responses(
        (status = 201, description = "The token", body = WsToken),
        TokenErrors,
    )
)]
async fn issue_token(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<WsToken>), ApiError> {
    state.sessions.get(&caller.scope(), &id).await?;
    let token = state.keys.issue_ws_token(&caller, &id)?;
    Ok((
        StatusCode::CREATED,
        Json(WsToken {
            token,
            session_id: id,
            expires_in: WS_TOKEN_TTL.as_secs(),
        }),
    ))
}

error_responses!(
    UpgradeErrors:
    BadRequest = "not a WebSocket upgrade request",
    SessionNotFound,
    UpgradeRequired,
    TooManyStreams,
    RateLimited,
    StorageUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/ws",
    operation_id = "session_websocket",
    summary = "Visitor chat over a WebSocket",
    tag = "sessions",
    description = "Visitor chat over a WebSocket. Client frames (JSON text): `{type: visitor_message, content}`, `{type: operator_message, content, operator_id?}`, `{type: assign_operator, operator_id}`, `{type: unassign_operator}`. Server frames: `auto_respond` `{respond, reason}`, `message_stored` `{role, seq}`, `operator_assigned`, `operator_unassigned`, the turn events (`turn_started`, `model_delta`, `tool_call_started`, `tool_call_completed`, `turn_completed` `{reply}`, `turn_paused` `{reply}` when a call waits for a confirmation, `turn_interrupted`), and `error` `{error: {code, message}}` (the socket stays open). A turn's events are paced as a streamed reply's: consecutive `model_delta`s are merged for a slow reader, and a socket more than 1 MiB behind gets one `error` frame `STREAM_LAGGED` instead of the rest of the turn's events (the turn goes on and is stored: `GET /v1/sessions/{id}/turns/{turn_id}`). Each frame counts against the caller's API rate limit like a request: over it the frame gets an `error` frame `RATE_LIMITED` and is not acted on. Frames over 256 KiB close it; an `operator_id` is at most 128 bytes.",
    params(
        ("id" = String, Path, description = "Session id"),
        ("token" = Option<String>, Query, description = "A token from `POST /v1/sessions/{id}/ws-token`, for browsers (which cannot send `Authorization`): single use, 60 s, this session only. Ignored when `Authorization` is sent."),
        ("Connection" = String, Header, description = "A list holding `upgrade` (any case)",
            pattern = "(^|,)[ \\t]*[Uu][Pp][Gg][Rr][Aa][Dd][Ee][ \\t]*(,|$)", example = "upgrade"),
        ("Upgrade" = String, Header, description = "`websocket` (any case)",
            pattern = "^[Ww][Ee][Bb][Ss][Oo][Cc][Kk][Ee][Tt]$", example = "websocket"),
        ("Sec-WebSocket-Version" = String, Header, description = "`13`", pattern = "^13$", example = "13"),
        ("Sec-WebSocket-Key" = String, Header, description = "The client's nonce (RFC 6455)", example = "dGhlIHNhbXBsZSBub25jZQ=="),
    ),
    responses(
        (status = 101, description = "Switched to the WebSocket protocol"),
        UpgradeErrors,
    )
)]
async fn upgrade(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Extension(quota): Extension<StreamQuota>,
    Extension(budget): Extension<RequestBudget>,
    Path(id): Path<String>,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    state.sessions.get(&caller.scope(), &id).await?;
    let slot = quota.acquire()?;
    Ok(ws
        .max_message_size(MAX_FRAME_BYTES)
        .on_upgrade(move |socket| serve(socket, state, caller, id, slot, budget)))
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum Frame {
    VisitorMessage {
        content: String,
    },
    OperatorMessage {
        content: String,
        operator_id: Option<String>,
    },
    AssignOperator {
        operator_id: String,
    },
    UnassignOperator,
}

async fn send(socket: &mut WebSocket, value: Value) -> bool {
    socket
        .send(Message::Text(value.to_string().into()))
        .await
        .is_ok()
}

/// Serves frames until the socket closes, or the key that opened it is
/// revoked or expires (then within a second, even mid-turn: the turn goes
/// on and is stored, the socket gets one `UNAUTHORIZED` error frame and a
/// close); `_slot` is freed then.
async fn serve(
    mut socket: WebSocket,
    state: AppState,
    caller: Principal,
    id: String,
    _slot: StreamSlot,
    budget: RequestBudget,
) {
    let keys = state.keys.clone();
    let key = caller.key_id.clone();
    let ended = async move {
        match key {
            Some(key) => keys.until_key_ends(key).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(ended);
    loop {
        let step = serve_one(&mut socket, &state, &caller, &id, &budget);
        let go_on = tokio::select! {
            go_on = step => go_on,
            () = &mut ended => {
                let error = ApiError::new(
                    ErrorCode::Unauthorized,
                    "the key that opened this socket was revoked or expired",
                )
                .detail();
                send(&mut socket, json!({"type": "error", "error": error})).await;
                let _ = socket.send(Message::Close(None)).await;
                false
            }
        };
        if !go_on {
            break;
        }
    }
}

/// Reads and answers one frame; `false` once the socket closed.
async fn serve_one(
    socket: &mut WebSocket,
    state: &AppState,
    caller: &Principal,
    id: &str,
    budget: &RequestBudget,
) -> bool {
    let Some(Ok(message)) = socket.recv().await else {
        return false;
    };
    let text = match message {
        Message::Text(t) => t,
        Message::Close(_) => return false,
        _ => return true,
    };
    let result = match budget.take() {
        Ok(()) => match serde_json::from_str::<Frame>(&text) {
            Ok(frame) => handle(socket, state, caller, id, frame).await,
            Err(e) => Err(ApiError::validation(format!("bad frame: {e}"))),
        },
        Err(limited) => Err(limited),
    };
    if let Err(e) = result {
        return send(socket, json!({"type": "error", "error": e.detail()})).await;
    }
    true
}

async fn handle(
    socket: &mut WebSocket,
    state: &AppState,
    caller: &Principal,
    id: &str,
    frame: Frame,
) -> Result<(), ApiError> {
    let sessions = &state.sessions;
    match frame {
        Frame::AssignOperator { operator_id } => {
            check_operator(&operator_id)?;
            sessions
                .set_operator(&caller.scope(), id, Some(operator_id.clone()))
                .await?;
            send(
                socket,
                json!({"type": "operator_assigned", "operator_id": operator_id}),
            )
            .await;
        }
        Frame::UnassignOperator => {
            sessions.set_operator(&caller.scope(), id, None).await?;
            send(socket, json!({"type": "operator_unassigned"})).await;
        }
        Frame::OperatorMessage {
            content,
            operator_id,
        } => {
            let content = Content::new(content)?;
            if let Some(op) = &operator_id {
                check_operator(op)?;
            }
            let seq = sessions
                .operator_message(&caller.scope(), id, content, operator_id)
                .await?;
            send(
                socket,
                json!({"type": "message_stored", "role": "operator", "seq": seq}),
            )
            .await;
        }
        Frame::VisitorMessage { content } => {
            let message = sessions
                .visitor_message(&caller.scope(), id, Content::new(content)?)
                .await?;
            let decision = message.decision;
            send(
                socket,
                json!({"type": "auto_respond", "respond": decision.respond, "reason": decision.reason}),
            )
            .await;
            let (tx, rx) = mpsc::unbounded_channel::<TurnEvent>();
            match message.deliver(tx).await? {
                Delivered::Stored { seq } => {
                    send(
                        socket,
                        json!({"type": "message_stored", "role": "visitor", "seq": seq}),
                    )
                    .await;
                }
                Delivered::Turn(turn) => stream_turn(socket, id, turn, rx).await?,
            }
        }
    }
    Ok(())
}

/// Writes a turn's events, paced ([`paced`]), until the turn ends; then
/// its failure, if it failed, is the caller's `error` frame. A socket
/// that falls more than [`MAX_TURN_STREAM_LAG_BYTES`] behind gets one
/// `STREAM_LAGGED` error frame instead of the rest of the turn's events;
/// the turn goes on and is stored, and the next frame is read once it ended.
async fn stream_turn(
    socket: &mut WebSocket,
    session: &str,
    turn: StartedTurn,
    events: mpsc::UnboundedReceiver<TurnEvent>,
) -> Result<(), ApiError> {
    let (mut events, lagged) = paced(events);
    // Dropped once it resolves: it holds a sender of the turn's events,
    // and the paced stream ends only when every sender is gone.
    let mut outcome = Some(turn.outcome);
    let mut ended = None;
    loop {
        tokio::select! {
            result = async { outcome.as_mut().expect("guarded").await }, if outcome.is_some() => {
                outcome = None;
                ended = Some(result);
            }
            event = events.next() => match event {
                Some(event) => forward(socket, event).await,
                None => break,
            },
        }
    }
    if lagged.load(Ordering::Relaxed) {
        let turn_id = &turn.turn_id;
        let lag = ApiError::new(
            ErrorCode::StreamLagged,
            format!(
                "this socket fell more than {MAX_TURN_STREAM_LAG_BYTES} bytes behind turn {turn_id}'s events, so the rest of them are not sent; the turn goes on and is stored: read it with GET /v1/sessions/{session}/turns/{turn_id}"
            ),
        );
        send(socket, json!({"type": "error", "error": lag.detail()})).await;
        if let Some(outcome) = outcome {
            let _ = outcome.await;
        }
        return Ok(());
    }
    let result = match ended {
        Some(result) => result,
        None => outcome.expect("not resolved yet").await,
    };
    result?;
    Ok(())
}

async fn forward(socket: &mut WebSocket, event: TurnEvent) {
    let value = match &event {
        TurnEvent::TurnCompleted(outcome) => {
            json!({"type": "turn_completed", "reply": outcome})
        }
        TurnEvent::TurnPaused(outcome) => {
            json!({"type": "turn_paused", "reply": outcome})
        }
        other => serde_json::to_value(other).unwrap_or(Value::Null),
    };
    send(socket, value).await;
}

/// Operator ids are kept in the session's metadata and in message names:
/// at most [`MAX_OPERATOR_ID_BYTES`], checked before anything is stored.
fn check_operator(operator_id: &str) -> Result<(), ApiError> {
    if operator_id.len() > MAX_OPERATOR_ID_BYTES {
        return Err(ApiError::validation(format!(
            "operator_id is longer than {MAX_OPERATOR_ID_BYTES} bytes"
        )));
    }
    Ok(())
}
