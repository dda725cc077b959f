//! A2A v1.0 server: every agent is an A2A agent at `/a2a/{agent}`, its
//! turns are A2A tasks (issue #32, part 2).
//!
//! A2A client ──GET /a2a/{agent}/.well-known/agent-card.json (public)──▶ [`card`]
//!            ──POST /a2a/{agent} (JSON-RPC 2.0)──────────────────────▶ [`jsonrpc`] ─┐
//!            ──/a2a/{agent}/message:send, /tasks… (HTTP+JSON)───────▶ [`rest`] ────┴▶ [`tasks`] ──▶ Sessions (create, start_turn, turn, turns, list)
//!
//! It sits behind the same layers as the rest of the API (keys, rate
//! limit, body cap, host check), mounted in [`super::router`] beside
//! `/mcp` and, like it, outside the OpenAPI document: its contract is the
//! A2A specification (`specification/a2a.proto`, `docs/specification.md`
//! of `a2aproject/A2A`, v1.0). Only the card is public. See `docs/a2a.md`.
//!
//! Decisions:
//! - A task is a cadre turn and its `contextId` is the turn's session. The
//!   task id is `{session}~{turn}`: turn records are kept under (session,
//!   turn) and nothing maps a turn id alone to its session, so the id
//!   carries both; no index is written, every turn (whichever door
//!   started it) is a task, and a task survives a restart with its record.
//!   A message without `contextId` opens a new session of the agent for
//!   the caller's tenant (`metadata.userId` as its user, the highest plan
//!   the key and tenant allow).
//! - States from the turn's phase: awaiting the model or tools →
//!   `WORKING`; awaiting approval → `INPUT_REQUIRED` (the status message
//!   names each confirmation and `POST /v1/confirmations/{id}`, and its
//!   metadata lists them); completed → `COMPLETED` (the answer is the
//!   artifact `answer`, one text part); failed → `FAILED` (the status
//!   message says why); interrupted (cut) → `CANCELED`; queued behind a
//!   paused turn (`multitask = "enqueue"`) → `SUBMITTED`.
//! - Blocking by default: `SendMessage` answers when the turn completes,
//!   fails, is cut or pauses for approval; `returnImmediately` answers at
//!   once (a message queued behind a paused turn too: it may wait for
//!   hours). A task id is handed out only once its record reads back (the
//!   conversation writes a turn's first record without waiting; up to 2 s,
//!   [`tasks`]), so `GetTask` right after finds it. `SendStreamingMessage` sends the Task, then `model_delta`s as
//!   artifact updates (append), tool calls as `WORKING` status updates,
//!   and at the end the whole answer again (`append: false`,
//!   `lastChunk: true`: the deltas of the model calls that led to tool
//!   calls are not the answer) and the last status; it closes at a
//!   terminal or input-required state.
//! - `SendStreamingMessage` and `returnImmediately` put the turn's events
//!   in its log ([`crate::http::turn_log`], issue #32's resumable
//!   streams). `SubscribeToTask` reads that log when this node has it:
//!   the task first, then every event from the turn's start (the answer
//!   so far as appended artifact pieces) and the live ones. A turn with no
//!   log here (started by a blocking send or another door, or resumed
//!   after an approval or a restart) is followed by reading its record
//!   (first after 100 ms, doubling to 1 s, back to 100 ms after each
//!   change: see [`tasks::SUBSCRIBE_POLL_FIRST`]): state changes and the
//!   final answer, not the deltas.
//! - Not supported: `CancelTask` (cadre cannot stop a running turn from
//!   outside: TaskNotCancelable), push notifications (-32003), the
//!   extended card (-32007), continuing a task by `taskId` (a paused one
//!   goes on through its confirmations: UnsupportedOperation), file parts
//!   (ContentTypeNotSupported; text and data parts are read).
//! - `ListTasks` order: without `contextId` the agent's sessions newest
//!   first, each session's turns oldest first (the store's orders, so a
//!   page is read, not sorted); `totalSize` is exact on the last page and
//!   a lower bound (what was listed, plus one) before it.
//! - `A2A-Version` (header or query): `1.0` or none; another is
//!   VersionNotSupported.
//! - Types by hand ([`types`]): `a2a-lf` (the a2aproject's Rust types) is
//!   at 0.x and changed its API across three minor versions within months,
//!   `a2a-protocol-types` is one person's; this server needs fifteen small
//!   structs, and keeping them here keeps their serde (what is left out,
//!   what is refused) under the tests of this module.
//! - Cluster mode: requests are served by the node they reach; a message
//!   to a session owned by another node is refused as the conversation
//!   refuses it (owner forwarding knows `/v1/sessions/{id}` paths only).

pub mod card;
pub mod error;
pub mod jsonrpc;
pub mod rest;
pub mod tasks;
pub mod types;

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::Stream;
use serde::Serialize;
use tokio::sync::mpsc;

use super::AppState;
use super::streams::StreamSlot;
use crate::agents::Agent;
use error::A2aError;

/// Where an agent's card is, under `/a2a/{agent}`.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";
/// The protocol version served.
pub const PROTOCOL_VERSION: &str = "1.0";

/// The A2A routes (not in the OpenAPI document).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(&format!("/a2a/{{agent}}{CARD_PATH}"), get(card::card))
        .route("/a2a/{agent}", post(jsonrpc::handle))
        .route("/a2a/{agent}/message:send", post(rest::send))
        .route("/a2a/{agent}/message:stream", post(rest::stream))
        .route("/a2a/{agent}/tasks", get(rest::list))
        .route(
            "/a2a/{agent}/tasks/{task}",
            get(rest::task_get).post(rest::task_post),
        )
}

/// Whether `path` is an agent card (public, like `/healthz`).
pub fn is_card(path: &str) -> bool {
    path.strip_prefix("/a2a/")
        .and_then(|rest| rest.strip_suffix(CARD_PATH))
        .is_some_and(|agent| !agent.is_empty() && !agent.contains('/'))
}

/// The request's `A2A-Version` (header, else `?A2A-Version=`) is one served.
pub fn check_version(headers: &HeaderMap, query: Option<&str>) -> Result<(), A2aError> {
    let from_query = || {
        query?.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            k.eq_ignore_ascii_case("A2A-Version").then(|| v.to_string())
        })
    };
    let asked = headers
        .get("a2a-version")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(from_query)
        .unwrap_or_default();
    let asked = asked.trim();
    let major_minor: Vec<&str> = asked.split('.').take(2).collect();
    if asked.is_empty() || major_minor == ["1", "0"] || asked == "1" {
        return Ok(());
    }
    Err(A2aError::VersionNotSupported(format!(
        "A2A-Version '{}' is not served; this server speaks {PROTOCOL_VERSION}",
        asked.chars().take(32).collect::<String>()
    )))
}

/// The agent named in the path, or 404 (on every route, card included).
pub fn agent_named(state: &AppState, agent: &str) -> Result<Arc<Agent>, A2aError> {
    state.sessions.agents().get(agent).ok_or_else(|| {
        A2aError::Cadre(super::error::ApiError::new(
            crate::error_code::ErrorCode::AgentNotFound,
            format!("no agent named '{}'", crate::identity::quoted_id(agent)),
        ))
    })
}

/// A stream of A2A events as Server-Sent Events, each event's data made by
/// `frame` (the JSON-RPC envelope, or the bare StreamResponse), holding
/// `slot` while it runs.
pub fn sse<T: Serialize + Send + 'static>(
    events: mpsc::Receiver<types::StreamResponse>,
    slot: StreamSlot,
    until_shutdown: bool,
    frame: impl Fn(types::StreamResponse) -> T + Send + 'static,
) -> Response {
    let stream = futures::stream::unfold((events, frame), |(mut events, frame)| async move {
        let next = events.recv().await?;
        let event = SseEvent::default()
            .json_data(frame(next))
            .unwrap_or_else(|_| SseEvent::default());
        Some((Ok::<_, Infallible>(event), (events, frame)))
    });
    fn keep<S: Stream<Item = Result<SseEvent, Infallible>> + Send + 'static>(s: S) -> Response {
        Sse::new(s).keep_alive(KeepAlive::default()).into_response()
    }
    if until_shutdown {
        keep(slot.hold_until_shutdown(stream))
    } else {
        keep(slot.hold(stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn only_an_agents_card_is_public() {
        assert!(is_card("/a2a/helper/.well-known/agent-card.json"));
        assert!(!is_card("/a2a/.well-known/agent-card.json"));
        assert!(!is_card("/a2a/a/b/.well-known/agent-card.json"));
        assert!(!is_card("/a2a/helper"));
        assert!(!is_card("/a2a/helper/tasks/x"));
        assert!(!is_card("/v1/a2a/helper/.well-known/agent-card.json"));
    }

    #[test]
    fn version_1_0_or_none_is_served() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert("a2a-version", HeaderValue::from_str(v).unwrap());
            h
        };
        assert!(check_version(&HeaderMap::new(), None).is_ok());
        assert!(check_version(&with("1.0"), None).is_ok());
        assert!(check_version(&with("1.0.1"), None).is_ok());
        assert!(check_version(&HeaderMap::new(), Some("x=1&A2A-Version=1.0")).is_ok());
        for refused in ["0.3", "2.0", "1.1", "banana"] {
            let e = check_version(&with(refused), None).unwrap_err();
            assert_eq!(e.code(), -32009, "{refused}");
        }
        let e = check_version(&HeaderMap::new(), Some("A2A-Version=0.3")).unwrap_err();
        assert_eq!(e.code(), -32009);
    }

    #[test]
    fn task_ids_carry_session_and_turn() {
        let id = tasks::task_id("s-1", "t-2");
        assert_eq!(tasks::split_task_id(&id), Some(("s-1", "t-2")));
        assert_eq!(tasks::split_task_id("no-separator"), None);
        assert_eq!(tasks::split_task_id("~t"), None);
        assert_eq!(tasks::split_task_id("s~"), None);
    }

    #[test]
    fn errors_have_the_specifications_codes_and_statuses() {
        let not_found = A2aError::TaskNotFound("x".into());
        assert_eq!(not_found.code(), -32001);
        assert_eq!(not_found.status_body()["error"]["code"], 404);
        assert_eq!(not_found.status_body()["error"]["status"], "NOT_FOUND");
        let cancel = A2aError::TaskNotCancelable("no".into());
        assert_eq!(
            cancel.status_body()["error"]["status"],
            "FAILED_PRECONDITION"
        );
        assert_eq!(cancel.jsonrpc()["data"][0]["reason"], "TASK_NOT_CANCELABLE");
        let busy = A2aError::Cadre(crate::http::error::ApiError::new(
            crate::error_code::ErrorCode::ConversationBusy,
            "busy",
        ));
        assert_eq!(busy.code(), -32000);
        assert_eq!(busy.jsonrpc()["data"][0]["domain"], "cadre");
        assert_eq!(busy.status_body()["error"]["code"], 409);
    }
}
