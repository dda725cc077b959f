//! Open streams per caller (Server-Sent Events and WebSockets), capped.
//!
//! rate_limit (knows the caller) ──StreamQuota (request extension)──▶ SSE / WebSocket handler
//!     handler: quota.acquire()? ──▶ StreamSlot, owned by the response stream or the socket task
//!                                   └─ dropped when the stream ends, the client goes, the socket closes
//!
//! A stream holds a connection and a task for as long as the client keeps
//! it, so the per-second rate limit alone does not bound them. Every SSE
//! endpoint (a streamed turn, `/v1/events`, a workflow run's events) and
//! the visitor WebSocket (`/v1/sessions/{id}/ws`) take one slot of their
//! caller (API key; the IP or "anonymous" on an open server, as for the
//! rate limit) before anything starts; over `[api_limit] max_streams`
//! (default 32) the request is a 429 `TOO_MANY_STREAMS` JSON error, no turn
//! runs and no socket is upgraded. The slot is freed when the response
//! stream is dropped (the stream finished, or the client disconnected and
//! hyper dropped the body) or when the socket's task ends (it closed).
//!
//! `GET /mcp` (an MCP session's standalone SSE stream) is a stream like
//! any other: [`count_get_streams`] wraps the MCP service so a `GET` takes
//! a slot of the same caller before rmcp sees it (over the cap: the same
//! 429 `TOO_MANY_STREAMS`) and its response body holds it. A `POST /mcp`
//! answered with an event stream carries one reply and ends: not counted.
//!
//! Revocation: a stream a key opened ends within a second of the key's
//! revocation or expiry (issue #29: an admin's `/v1/events` kept
//! streaming every tenant's events after a revoke). A slot of a verified
//! key holds its stream only until [`KeyRing::until_key_ends`]
//! ([`StreamLimit::end_with_keys`] gives it the ring; SSE turns, event
//! subscriptions and `GET /mcp`), and the visitor WebSocket closes on the
//! same signal ([`StreamSlot::key_ended`]).
//!
//! Shutdown: subscriptions (`/v1/events`, a workflow run's events) never
//! end by themselves, so they are held with [`StreamSlot::hold_until_shutdown`]
//! and end when the server starts shutting down
//! ([`StreamLimit::close_subscriptions`]); a streamed turn is running work
//! and gets the shutdown grace like any request.
//!
//! Pace: a streamed turn's events (an SSE reply, or a visitor turn on the
//! WebSocket, [`super::ws`]) pass through [`paced`], a task that
//! drains the turn's events as the model writes them and hands them to the
//! response through a channel of [`TURN_STREAM_BUFFER`] events. While the
//! client reads slower than that, the model text waiting for it is
//! coalesced (consecutive deltas become one); once more than
//! [`MAX_TURN_STREAM_LAG_BYTES`] wait (delta text, and the JSON of the
//! other events: a tool call's arguments or outcome), the stream is closed (the
//! turn goes on and is stored; its history has the answer): an SSE reply
//! ends there, a socket gets one `STREAM_LAGGED` error frame. A client that
//! leaves ends the task and drops what waited. So a stream holds at most
//! the buffer and the lag limit, whatever the model sends.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::Request;
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::Stream;
use futures::StreamExt;
use tower::{Layer, Service};

use super::caller::Caller;
use super::error::ApiError;
use crate::conversation::actor::TurnEvent;
use crate::error_code::ErrorCode;
use crate::tenants::KeyRing;

/// Events of a streamed turn held for a client that reads slowly.
pub const TURN_STREAM_BUFFER: usize = 64;
/// Bytes a client may fall behind (model text, and the JSON of the other
/// events) before its stream closes.
pub const MAX_TURN_STREAM_LAG_BYTES: usize = 1024 * 1024;

/// A turn's events, paced for the client (see the module doc), and a flag
/// that is set when the stream was closed for falling behind.
pub fn paced(
    mut events: tokio::sync::mpsc::UnboundedReceiver<TurnEvent>,
) -> (
    tokio_stream::wrappers::ReceiverStream<TurnEvent>,
    Arc<AtomicBool>,
) {
    let (tx, out) = tokio::sync::mpsc::channel(TURN_STREAM_BUFFER);
    let lagged = Arc::new(AtomicBool::new(false));
    let flag = lagged.clone();
    tokio::spawn(async move {
        let mut waiting: VecDeque<TurnEvent> = VecDeque::new();
        // Bytes in `waiting` (see `waiting_len`).
        let mut behind = 0usize;
        let mut open = true;
        while open || !waiting.is_empty() {
            tokio::select! {
                biased;
                _ = tx.closed() => return,
                permit = tx.reserve(), if !waiting.is_empty() => {
                    let Ok(permit) = permit else { return };
                    let event = waiting.pop_front().expect("an event waits");
                    behind -= waiting_len(&event);
                    permit.send(event);
                }
                event = events.recv(), if open => match event {
                    None => open = false,
                    Some(event) => {
                        behind += waiting_len(&event);
                        match (waiting.back_mut(), event) {
                            (
                                Some(TurnEvent::ModelDelta { text }),
                                TurnEvent::ModelDelta { text: more },
                            ) => text.push_str(&more),
                            (_, event) => waiting.push_back(event),
                        }
                        if behind > MAX_TURN_STREAM_LAG_BYTES {
                            tracing::warn!(
                                behind,
                                "a streaming client fell too far behind; the turn's events to it stop"
                            );
                            flag.store(true, Ordering::Relaxed);
                            return;
                        }
                    }
                },
            }
        }
    });
    (tokio_stream::wrappers::ReceiverStream::new(out), lagged)
}

/// What an event holds while it waits: a delta's text, or any other
/// event's JSON (a tool call's arguments or outcome can be megabytes).
/// The same event always measures the same, so `behind` adds up.
fn waiting_len(event: &TurnEvent) -> usize {
    match event {
        TurnEvent::ModelDelta { text } => text.len(),
        other => serde_json::to_vec(other).map_or(0, |v| v.len()),
    }
}

/// The open-stream counts of every caller, shared by all requests.
#[derive(Clone, Debug)]
pub struct StreamLimit {
    max: usize,
    open: Arc<Mutex<HashMap<Caller, usize>>>,
    /// Becomes true when the server starts shutting down.
    closing: Arc<tokio::sync::watch::Sender<bool>>,
    /// The key ring a key's streams end with (set once by the router).
    keys: EndingKeys,
}

/// [`StreamLimit`]'s key ring, once the router gave it one.
#[derive(Clone, Default)]
struct EndingKeys(Arc<std::sync::OnceLock<KeyRing>>);

impl std::fmt::Debug for EndingKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "EndingKeys(set)"
        } else {
            "EndingKeys(unset)"
        })
    }
}

impl StreamLimit {
    pub fn new(max: usize) -> Self {
        StreamLimit {
            max,
            open: Arc::default(),
            closing: Arc::new(tokio::sync::watch::Sender::new(false)),
            keys: EndingKeys::default(),
        }
    }

    /// From now on a verified key's streams end when `keys` says the key
    /// ended (revoked or expired).
    pub fn end_with_keys(&self, keys: KeyRing) {
        let _ = self.keys.0.set(keys);
    }

    /// Streams one caller may hold at once (`[api_limit] max_streams`).
    pub fn max(&self) -> usize {
        self.max
    }

    /// Ends every subscription stream, now and from now on.
    pub fn close_subscriptions(&self) {
        self.closing.send_replace(true);
    }

    /// The quota of one caller, for a request extension.
    pub(crate) fn quota(&self, caller: Caller) -> StreamQuota {
        StreamQuota {
            caller,
            limit: self.clone(),
        }
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, HashMap<Caller, usize>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What an SSE handler asks for a slot.
#[derive(Clone, Debug)]
pub struct StreamQuota {
    caller: Caller,
    limit: StreamLimit,
}

impl StreamQuota {
    /// A slot, or 429 `TOO_MANY_STREAMS` when the caller has all of them.
    pub fn acquire(&self) -> Result<StreamSlot, ApiError> {
        let mut counts = self.limit.counts();
        let open = counts.entry(self.caller.clone()).or_insert(0);
        if *open >= self.limit.max {
            tracing::debug!(
                caller = self.caller.kind(),
                open = *open,
                "stream limit reached"
            );
            return Err(ApiError::new(
                ErrorCode::TooManyStreams,
                format!(
                    "{} event streams are open for this caller, the most allowed; close one first",
                    self.limit.max
                ),
            ));
        }
        *open += 1;
        Ok(StreamSlot {
            caller: self.caller.clone(),
            limit: self.limit.clone(),
        })
    }
}

/// One open stream; frees its slot when dropped.
#[derive(Debug)]
pub struct StreamSlot {
    caller: Caller,
    limit: StreamLimit,
}

impl StreamSlot {
    /// `stream`, holding this slot until it is dropped; it ends when the
    /// key that opened it ends ([`Self::key_ended`]).
    pub fn hold<S: Stream>(self, stream: S) -> impl Stream<Item = S::Item> {
        let ended = self.key_ended();
        stream.take_until(ended).map(move |item| {
            let _held = &self;
            item
        })
    }

    /// Resolves when the verified key this slot counts against is revoked
    /// or expires; never for a caller without one (an address).
    pub fn key_ended(&self) -> impl std::future::Future<Output = ()> + Send + use<> {
        let watch = match (&self.caller, self.limit.keys.0.get()) {
            (Caller::ApiKey(id), Some(keys)) => Some((keys.clone(), id.clone())),
            _ => None,
        };
        async move {
            match watch {
                Some((keys, id)) => keys.until_key_ends(id).await,
                None => std::future::pending().await,
            }
        }
    }
}

impl StreamSlot {
    /// [`Self::hold`] for a subscription: it also ends when the server
    /// starts shutting down.
    pub fn hold_until_shutdown<S: Stream>(self, stream: S) -> impl Stream<Item = S::Item> {
        let mut closing = self.limit.closing.subscribe();
        let closed = async move {
            let _ = closing.wait_for(|c| *c).await;
        };
        self.hold(stream.take_until(closed))
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut counts = self.limit.counts();
        if let Some(open) = counts.get_mut(&self.caller) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                counts.remove(&self.caller);
            }
        }
    }
}

/// `inner` (the `/mcp` service), with every `GET` holding one of its
/// caller's stream slots for as long as its response body lives.
pub fn count_get_streams<I>(
    inner: I,
) -> impl Service<Request, Response = Response, Error = Infallible, Future: Send + 'static>
+ Clone
+ Send
+ Sync
+ 'static
where
    I: Service<Request, Response = Response, Error = Infallible> + Clone + Send + Sync + 'static,
    I::Future: Send + 'static,
{
    axum::middleware::from_fn(get_holds_a_slot).layer(inner)
}

async fn get_holds_a_slot(request: Request, next: Next) -> Response {
    let quota = request.extensions().get::<StreamQuota>().cloned();
    let slot = match quota {
        Some(quota) if request.method() == Method::GET => match quota.acquire() {
            Ok(slot) => Some(slot),
            Err(refused) => return refused.into_response(),
        },
        _ => None,
    };
    let response = next.run(request).await;
    match slot {
        Some(slot) if response.status().is_success() => {
            let (parts, body) = response.into_parts();
            Response::from_parts(parts, Body::from_stream(slot.hold(body.into_data_stream())))
        }
        _ => response,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tool-call events count toward the lag limit by their size: a
    /// client that reads nothing cannot make a stream hold megabytes of
    /// arguments in its waiting queue.
    #[tokio::test]
    async fn big_tool_events_count_toward_the_lag_limit() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (_unread, lagged) = paced(rx);
        // Fill the stream's buffer with small events nobody reads ...
        for _ in 0..TURN_STREAM_BUFFER {
            tx.send(TurnEvent::ModelDelta { text: "x".into() }).unwrap();
        }
        // ... then queue a little over the limit in tool-call arguments.
        let big = serde_json::json!({ "message": "a".repeat(MAX_TURN_STREAM_LAG_BYTES / 2) });
        for i in 0..3 {
            tx.send(TurnEvent::ToolCallStarted {
                id: format!("c{i}"),
                name: "echo".into(),
                arguments: big.clone(),
            })
            .unwrap();
        }
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while !lagged.load(Ordering::Relaxed) {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the stream was closed for falling behind");
    }

    #[test]
    fn slots_are_counted_per_caller_and_freed_on_drop() {
        let limit = StreamLimit::new(2);
        let a = limit.quota(Caller::Anonymous);
        let b = limit.quota(Caller::ApiKey("k".into()));
        let first = a.acquire().unwrap();
        let _second = a.acquire().unwrap();
        let err = a.acquire().unwrap_err();
        assert_eq!(err.status, axum::http::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(err.code, ErrorCode::TooManyStreams);
        let _other = b.acquire().unwrap();
        drop(first);
        let _again = a.acquire().unwrap();
        drop((_second, _again, _other));
        assert!(limit.counts().is_empty());
    }
}
