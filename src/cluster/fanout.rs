//! Event fan-out: every node's events on every node's bus.
//!
//! EventBus (node A) ──local events──▶ PUBLISH cadre:events {node: A, event}
//!                                                  │ Redis pub/sub
//! EventBus (node B) ◀──publish_remote── SUBSCRIBE ◀┘  (A's own messages skipped)
//!
//! So `GET /v1/events` on any node shows what happened on all of them;
//! events from another node carry its id in `node`.
//!
//! Decisions:
//! - **Best effort**, whatever `redis_failure` says: events are
//!   notifications, not records. While Redis is away, events stay local
//!   (a failed `PUBLISH` is dropped, with one warning per outage) and the
//!   subscriber reconnects every [`RECONNECT`] until Redis is back.
//! - **No echo, no loop.** Only events with no `node` (this node's) are
//!   sent; events received carry their origin and are never sent again; a
//!   node skips messages it sent itself.
//! - One subscriber connection per node (pub/sub needs its own), and
//!   `PUBLISH` goes through the shared connection.
//! - A forwarder that falls more than the bus' capacity behind skips what
//!   it missed, as any subscriber of the bus does.

use std::time::Duration;

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::Redis;
use crate::events::{Event, EventBus};

/// The channel every node publishes on and listens to.
pub const CHANNEL: &str = "cadre:events";
/// How long the subscriber waits before it tries Redis again.
pub const RECONNECT: Duration = Duration::from_millis(500);

#[derive(Serialize, Deserialize)]
struct Envelope {
    node: String,
    event: Event,
}

/// The two fan-out tasks of one node; dropping it stops them.
pub struct Fanout {
    tasks: [JoinHandle<()>; 2],
}

impl Drop for Fanout {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Fanout {
    /// Starts sending this node's events (`node` names it) and publishing
    /// the other nodes' events on `bus`; returns once subscribed (or after
    /// [`super::CONNECT_TIMEOUT`], the subscriber then retrying alone).
    pub async fn start(redis: &Redis, bus: &EventBus, node: &str) -> Self {
        let forward = tokio::spawn(forward(redis.clone(), bus.clone(), node.to_owned()));
        let (subscribed, ready) = oneshot::channel();
        let receive = tokio::spawn(receive(
            redis.clone(),
            bus.clone(),
            node.to_owned(),
            subscribed,
        ));
        let _ = tokio::time::timeout(super::CONNECT_TIMEOUT, ready).await;
        Fanout {
            tasks: [forward, receive],
        }
    }
}

async fn forward(redis: Redis, bus: EventBus, node: String) {
    let mut events = bus.subscribe();
    let mut failing = false;
    loop {
        let event = match events.recv().await {
            Ok(event) => event,
            Err(RecvError::Lagged(_)) => continue,
            Err(RecvError::Closed) => return,
        };
        if event.node.is_some() {
            continue;
        }
        let Ok(message) = serde_json::to_string(&Envelope {
            node: node.clone(),
            event,
        }) else {
            continue;
        };
        let mut conn = redis.conn();
        let sent = redis::cmd("PUBLISH")
            .arg(CHANNEL)
            .arg(message)
            .query_async::<i64>(&mut conn)
            .await;
        match sent {
            Ok(_) if failing => {
                failing = false;
                tracing::info!("events reach the other nodes again");
            }
            Ok(_) => {}
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "events stay on this node until Redis is back");
            }
            Err(_) => {}
        }
    }
}

async fn receive(redis: Redis, bus: EventBus, node: String, subscribed: oneshot::Sender<()>) {
    let mut subscribed = Some(subscribed);
    loop {
        match redis.client().get_async_pubsub().await {
            Ok(mut pubsub) => match pubsub.subscribe(CHANNEL).await {
                Ok(()) => {
                    if let Some(subscribed) = subscribed.take() {
                        let _ = subscribed.send(());
                    }
                    let mut messages = pubsub.on_message();
                    while let Some(message) = messages.next().await {
                        let Ok(envelope) =
                            serde_json::from_slice::<Envelope>(message.get_payload_bytes())
                        else {
                            continue;
                        };
                        if envelope.node == node {
                            continue;
                        }
                        let mut event = envelope.event;
                        event.node = Some(envelope.node);
                        bus.publish_remote(event);
                    }
                    tracing::warn!("lost the event subscription; reconnecting");
                }
                Err(e) => tracing::warn!(error = %e, "cannot subscribe to other nodes' events"),
            },
            Err(e) => tracing::debug!(error = %e, "cannot reach Redis for events"),
        }
        tokio::time::sleep(RECONNECT).await;
    }
}
