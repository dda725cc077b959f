//! The delivery loop: one task per serving node (the rules are in the
//! module doc of [`super`]).
//!
//! wake (an event written here · POLL · the earliest next attempt) ──▶ take back stale claims
//!     ──▶ per due event: claim (move_doc due → sending) ──▶ POST, signed ──▶ one write: record + due again | done

use std::time::{Duration, Instant};

use futures::StreamExt;
use jiff::{SignedDuration, Timestamp};
use serde_json::json;

use super::{
    Attempt, DELIVERIES, DUE, Delivery, DeliveryState, KEEP_ATTEMPTS, LEASE, MAX_BACKOFF, SENDING,
    WAKE, Webhooks, loaded, stored,
};
use crate::retry::Backoff;
use crate::store::{StoreError, WriteOp};
use tokio_util::sync::CancellationToken;

/// How often the loop looks for events other nodes wrote.
pub(super) const POLL: Duration = Duration::from_secs(1);
/// Events sent at once, at most.
const PARALLEL: usize = 8;
/// How often claims are checked for staleness.
const TAKE_BACK_EVERY: Duration = Duration::from_secs(10);
/// A response body read to the end at most (then the connection is dropped).
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

pub(super) async fn run(webhooks: Webhooks, stop: CancellationToken) {
    let mut first = true;
    let mut take_back_at = Instant::now();
    loop {
        if stop.is_cancelled() {
            return;
        }
        if Instant::now() >= take_back_at {
            if let Err(e) = webhooks.take_back(first).await {
                tracing::warn!(error = %e, "webhooks: cannot look for deliveries a crash left");
            }
            first = false;
            take_back_at = Instant::now() + TAKE_BACK_EVERY;
        }
        let wait = match webhooks.due().await {
            Ok((due, later)) => {
                if !due.is_empty() {
                    futures::stream::iter(due)
                        .for_each_concurrent(PARALLEL, |id| {
                            let webhooks = webhooks.clone();
                            async move {
                                if let Err(e) = webhooks.deliver(&id).await {
                                    tracing::warn!(event = %id, error = %e, "webhooks: delivery not recorded; tried again");
                                }
                            }
                        })
                        .await;
                    continue;
                }
                later.map_or(POLL, |d| d.min(POLL))
            }
            Err(e) => {
                tracing::warn!(error = %e, "webhooks: cannot read the outbox");
                POLL
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
            () = WAKE.notified() => {}
        }
    }
}

impl Webhooks {
    /// The events due now, and how long until the next one that is not.
    async fn due(&self) -> Result<(Vec<String>, Option<Duration>), StoreError> {
        let now = Timestamp::now();
        let mut due = Vec::new();
        let mut later: Option<Duration> = None;
        for (id, v) in self.inner.store.list_docs(DUE, "").await? {
            let next = v
                .get("next")
                .and_then(|n| serde_json::from_value::<Timestamp>(n.clone()).ok())
                .unwrap_or(now);
            if next <= now {
                due.push(id);
            } else {
                let wait = Duration::try_from(next.duration_since(now)).unwrap_or(POLL);
                later = Some(later.map_or(wait, |l| l.min(wait)));
            }
        }
        Ok((due, later))
    }

    /// Moves claims back to `due` whose node died: all of them at the
    /// first look of a node with a store of its own (it is the only node),
    /// else those older than [`LEASE`].
    async fn take_back(&self, first: bool) -> Result<(), StoreError> {
        let store = &self.inner.store;
        let only_node = store.node_id().is_none();
        let now = Timestamp::now();
        for (id, v) in store.list_docs(SENDING, "").await? {
            let since = v
                .get("since")
                .and_then(|s| serde_json::from_value::<Timestamp>(s.clone()).ok())
                .unwrap_or(now);
            let stale =
                now.duration_since(since) > SignedDuration::try_from(LEASE).unwrap_or_default();
            if (first && only_node) || stale {
                store
                    .move_doc(SENDING, &id, DUE, json!({ "next": now }), true)
                    .await?;
            }
        }
        Ok(())
    }

    /// One attempt at event `id`, if this node gets the claim.
    async fn deliver(&self, id: &str) -> Result<(), StoreError> {
        let store = &self.inner.store;
        let claim = json!({ "node": store.node_id(), "since": Timestamp::now() });
        if store
            .move_doc(DUE, id, SENDING, claim, false)
            .await?
            .is_none()
        {
            return Ok(()); // another node has it
        }
        let Some(mut record) = store.get_doc(DELIVERIES, id).await?.and_then(loaded) else {
            // Erased with its session meanwhile.
            store.delete_doc(SENDING, id, false).await?;
            return Ok(());
        };
        let attempt = self.attempt(&record).await;
        let delivered = attempt.status.is_some_and(|s| (200..300).contains(&s));
        let at = attempt.at;
        record.attempt_count += 1;
        record.attempts.push(attempt);
        if record.attempts.len() > KEEP_ATTEMPTS {
            let extra = record.attempts.len() - KEEP_ATTEMPTS;
            record.attempts.drain(..extra);
        }
        let retry_for = SignedDuration::from_secs(
            i64::try_from(self.inner.config.retry_for_s).unwrap_or(i64::MAX),
        );
        let backoff =
            Backoff::jittered(Duration::from_millis(self.inner.config.first_retry_ms), 30);
        let wait = backoff.delay(record.attempt_count).min(MAX_BACKOFF);
        let next = at + SignedDuration::try_from(wait).unwrap_or(SignedDuration::MAX);
        record.state = if delivered {
            DeliveryState::Delivered
        } else if next.duration_since(record.created_at) > retry_for {
            DeliveryState::Failed
        } else {
            DeliveryState::Pending
        };
        record.next_attempt_at = (record.state == DeliveryState::Pending).then_some(next);
        if store.get_doc(SENDING, id).await?.is_none() {
            return Ok(()); // erased with its session while it was sent
        }
        let mut ops = vec![
            WriteOp::PutDoc {
                namespace: DELIVERIES.into(),
                key: id.into(),
                value: stored(&record),
                tenant: Some(record.tenant.clone()),
            },
            WriteOp::DeleteDoc {
                namespace: SENDING.into(),
                key: id.into(),
            },
        ];
        if record.state == DeliveryState::Pending {
            ops.push(WriteOp::PutDoc {
                namespace: DUE.into(),
                key: id.into(),
                value: json!({ "next": next }),
                tenant: None,
            });
        }
        if let Some(session_id) = &record.session_id {
            for namespace in [DELIVERIES, DUE] {
                ops.push(WriteOp::LinkDoc {
                    namespace: namespace.into(),
                    key: id.into(),
                    session_id: session_id.clone(),
                });
            }
        }
        store.write(ops, true).await?;
        let outcome = match record.state {
            DeliveryState::Delivered => "delivered",
            DeliveryState::Failed => "failed",
            DeliveryState::Pending => "retried",
        };
        tracing::info!(event = %id, url = %record.url, status = ?record.attempts.last().and_then(|a| a.status), outcome, "webhook attempt");
        Ok(())
    }

    /// Sends the event once.
    async fn attempt(&self, record: &Delivery) -> Attempt {
        let started = Instant::now();
        let at = Timestamp::now();
        let body = serde_json::to_vec(&record.event).expect("events serialize");
        let timestamp = at.as_second();
        let result = match self.secret_of(&record.tenant).await {
            None => Err(
                "no signing secret (the tenant's webhook_secret or [webhooks] secret)".to_string(),
            ),
            Some(secret) => {
                let signature = secret.sign(&record.id, timestamp, &body);
                self.post(record, body, timestamp, signature).await
            }
        };
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        match result {
            Ok(status) => Attempt {
                at,
                status: Some(status),
                error: (!(200..300).contains(&status))
                    .then(|| format!("the receiver answered {status}")),
                duration_ms,
            },
            Err(error) => Attempt {
                at,
                status: None,
                error: Some(error),
                duration_ms,
            },
        }
    }

    async fn post(
        &self,
        record: &Delivery,
        body: Vec<u8>,
        timestamp: i64,
        signature: String,
    ) -> Result<u16, String> {
        let url = url::Url::parse(&record.url).map_err(|e| e.to_string())?;
        let request = match &self.inner.guarded {
            Some(guarded) => guarded
                .request(reqwest::Method::POST, url)
                .map_err(|e| e.to_string())?
                .timeout(Duration::from_secs(self.inner.config.timeout_s)),
            None => self.inner.client.post(url),
        };
        let response = request
            .header("content-type", "application/json")
            .header("webhook-id", &record.id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await
            .map_err(|e| describe(&e))?;
        let status = response.status().as_u16();
        // Read a little of the body so the connection can be reused; a
        // receiver that streams more is cut.
        let mut stream = response.bytes_stream();
        let mut read = 0;
        while let Some(Ok(chunk)) = stream.next().await {
            read += chunk.len();
            if read > MAX_RESPONSE_BYTES {
                break;
            }
        }
        Ok(status)
    }
}

fn describe(e: &reqwest::Error) -> String {
    if let Some(refused) = crate::tools::builtin::net_guard::refusal(e) {
        return refused.to_string();
    }
    if e.is_timeout() {
        return "timed out".into();
    }
    if e.is_connect() {
        return "could not connect".into();
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    text
}
