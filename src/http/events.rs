//! `GET /v1/events`: runtime events as Server-Sent Events, one `event:` per
//! kind (`tool_added`, `execution_completed`, ...) with the event as JSON
//! data. A subscriber that falls behind gets a `lagged` event saying how
//! many it missed, then continues.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::routing::get;
use axum::{Extension, Router};
use futures::Stream;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;

use super::AppState;
use super::auth::require_admin;
use super::error::ApiError;
use super::streams::StreamQuota;
use crate::tenants::Principal;

pub fn routes() -> Router<AppState> {
    Router::new().route("/v1/events", get(events))
}

/// Runtime-wide events: admin only (they span tenants).
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
