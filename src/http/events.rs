//! `GET /v1/events`: runtime events as Server-Sent Events, one `event:` per
//! kind (`tool_added`, `execution_completed`, ...) with the event as JSON
//! data. A subscriber that falls behind gets a `lagged` event saying how
//! many it missed, then continues.

use std::convert::Infallible;
use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::require_admin;
use super::error::ApiError;
use super::openapi::error_responses;
use super::streams::StreamQuota;
use crate::tenants::Principal;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(events))
}

error_responses!(
    EventsErrors:
    AdminRequired
);

/// Runtime-wide events: admin only (they span tenants).
#[utoipa::path(
    get,
    path = "/v1/events",
    operation_id = "runtime_events",
    summary = "Runtime events as Server-Sent Events (admin)",
    tag = "events",
    responses(
        (status = 200, description = "Server-Sent Events, one `event:` per kind (`tool_added`, `execution_completed`, ...) with the event as JSON data; `lagged` (`{missed}`) when the subscriber fell behind", content_type = "text/event-stream", body = String),
        EventsErrors,
    )
)]
async fn events(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Extension(quota): Extension<StreamQuota>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    require_admin(&caller)?;
    let slot = quota.acquire()?;
    let stream = BroadcastStream::new(state.events.subscribe()).map(|item| {
        Ok(match item {
            Ok(event) => SseEvent::default()
                .event(event.kind.name())
                .json_data(&event)
                .unwrap_or_else(|_| SseEvent::default().event("error")),
            Err(BroadcastStreamRecvError::Lagged(n)) => SseEvent::default()
                .event("lagged")
                .data(format!("{{\"missed\":{n}}}")),
        })
    });
    Ok(Sse::new(slot.hold_until_shutdown(stream))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}
