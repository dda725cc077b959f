//! `GET /v1/events`: runtime events as Server-Sent Events, one `event:` per
//! kind (`tool_added`, `execution_completed`, ...) with the event as JSON
//! data. A subscriber that falls behind gets a `lagged` event saying how
//! many it missed, then continues.
//!
//! Reconnecting (issue #32): every event has an `id:`, `<process>-<n>`
//! (`n` counts the events of this process, `<process>` is fresh at each
//! start). A client reconnecting with `Last-Event-ID` gets the events after
//! it that this node still keeps (the last 1,024), exactly once, then the
//! live ones. Decision: an id from another node or an earlier process, or
//! older than what is kept, starts the stream with the live events (the
//! stream never ends by itself, so there is no 204 here). In a cluster,
//! each node numbers every event it publishes, its own and the ones other
//! nodes sent it, so a client reconnects to the same node to resume.
//! `Last-Event-ID` is read but not declared as a parameter of the
//! operation: an EventSource sends it by itself, and declared, a contract
//! tester would open a hundred never-ending streams to try values.

use std::convert::Infallible;
use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::require_admin;
use super::error::ApiError;
use super::openapi::{Lagged, error_responses};
use super::streams::StreamQuota;
use crate::tenants::Principal;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(events))
}

error_responses!(
    EventsErrors:
    AdminRequired
);

/// What happened in the runtime: `{at, type, ...}`, `type` being the
/// event's name; the other fields depend on it (`tool` for the `tool_*`,
/// `validation_error` and `execution_*` events; `version` and `source` for
/// `tool_loaded`, `tool_added` and `tool_updated`; `tools` and `errors`
/// for `reload_completed`; `file`, `line` and `message` for `load_error`
/// (a tool or agent file); `agent` for the `agent_*` events, with `source`
/// (the file) when added or updated;
/// `fields` for `validation_error`; `caller_type`, `conversation_id` and
/// `workflow_id` for `execution_started`; `execution_time_ms` and `cached`
/// for `execution_completed`; `error_type` and `error` for
/// `execution_failed`; `server` for `mcp_server_*`, with `tools` when up
/// and `reason` when down).
#[derive(ToSchema)]
#[allow(dead_code)]
struct RuntimeEvent {
    /// RFC 3339 timestamp.
    at: String,
    r#type: String,
    tool: Option<String>,
    version: Option<String>,
    source: Option<String>,
    #[schema(minimum = 0)]
    tools: Option<u64>,
    #[schema(minimum = 0)]
    errors: Option<u64>,
    file: Option<String>,
    #[schema(minimum = 0)]
    line: Option<u64>,
    message: Option<String>,
    fields: Option<Vec<String>>,
    caller_type: Option<String>,
    conversation_id: Option<String>,
    workflow_id: Option<String>,
    #[schema(minimum = 0)]
    execution_time_ms: Option<u64>,
    cached: Option<bool>,
    error_type: Option<String>,
    error: Option<String>,
    server: Option<String>,
    reason: Option<String>,
    agent: Option<String>,
    guardrail: Option<String>,
    stage: Option<String>,
    action: Option<String>,
    session_id: Option<String>,
    turn_id: Option<String>,
}

super::openapi::event_stream! {
    /// Runtime events, one `event:` per kind, as they happen.
    RuntimeEvents {
        "tool_loaded" => RuntimeEvent,
        "tool_added" => RuntimeEvent,
        "tool_updated" => RuntimeEvent,
        "tool_removed" => RuntimeEvent,
        "reload_started" => RuntimeEvent,
        "reload_completed" => RuntimeEvent,
        "load_error" => RuntimeEvent,
        "agent_added" => RuntimeEvent,
        "agent_updated" => RuntimeEvent,
        "agent_removed" => RuntimeEvent,
        "validation_error" => RuntimeEvent,
        "execution_started" => RuntimeEvent,
        "execution_completed" => RuntimeEvent,
        "execution_failed" => RuntimeEvent,
        "mcp_server_up" => RuntimeEvent,
        "mcp_server_down" => RuntimeEvent,
        "guardrail_tripped" => RuntimeEvent,
        "lagged" => Lagged,
    }
}

/// Runtime-wide events: admin only (they span tenants).
#[utoipa::path(
    get,
    path = "/v1/events",
    operation_id = "runtime_events",
    summary = "Runtime events as Server-Sent Events (admin)",
    tag = "events",
    responses(
        (status = 200, description = "Server-Sent Events, one `event:` per kind (`tool_added`, `execution_completed`, ...) with the event as JSON data and an `id:` (`<process>-<n>`; a reconnect sending it as `Last-Event-ID` first gets the events after it this node still keeps, once); `lagged` (`{missed}`) when the subscriber fell behind", content_type = "text/event-stream", body = RuntimeEvents),
        EventsErrors,
    )
)]
async fn events(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Extension(quota): Extension<StreamQuota>,
    headers: axum::http::HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    require_admin(&caller)?;
    let slot = quota.acquire()?;
    // Subscribe before reading the kept events: nothing falls between.
    let live = state.events.subscribe();
    let boot: std::sync::Arc<str> = state.events.boot().into();
    let replay = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|id| id.rsplit_once('-'))
        .filter(|(b, _)| *b == &*boot)
        .and_then(|(_, n)| n.parse::<u64>().ok())
        .and_then(|n| state.events.since(n))
        .unwrap_or_default();
    let mut last = replay.last().map(|e| e.seq);
    let id_boot = boot.clone();
    let sse = move |event: &crate::events::Event| {
        SseEvent::default()
            .id(format!("{id_boot}-{}", event.seq))
            .event(event.kind.name())
            .json_data(event)
            .unwrap_or_else(|_| SseEvent::default().event("error"))
    };
    let replayed: Vec<SseEvent> = replay.iter().map(&sse).collect();
    let live = BroadcastStream::new(live).filter_map(move |item| match item {
        // Sent again live after it was replayed: once is enough.
        Ok(event) if last.is_some_and(|l| event.seq <= l) => None,
        Ok(event) => {
            last = None;
            Some(Ok(sse(&event)))
        }
        Err(BroadcastStreamRecvError::Lagged(n)) => Some(Ok(Lagged::event(n))),
    });
    let stream = tokio_stream::iter(replayed.into_iter().map(Ok)).chain(live);
    Ok(Sse::new(slot.hold_until_shutdown(stream))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}
