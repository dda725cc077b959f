//! Webhooks: signed JSON events POSTed when a background turn or a
//! workflow run ends, delivered at least once from a durable outbox
//! (issue #33, part 2).
//!
//! http (message / run / schedule with `webhook`) ──Webhooks::check──▶ 422 when the target is refused
//! conversation actor / workflow runner ──final durable write + outbox_op──▶ webhook_deliveries + webhook_due (one write, at most once)
//! delivery loop (one task per node) ──claim (move_doc due → sending)──▶ POST, signed ──▶ record the attempt ──▶ due again | done
//! http `GET /v1/webhooks/deliveries` ──▶ the tenant's delivery records, newest first
//!
//! # The outbox
//! A turn's end (or pause) and its event are one store write: the
//! conversation puts the event's documents in the same durable commit as
//! the turn record that reaches `completed`, `failed`, `interrupted` or
//! `awaiting_approval` ([`outbox_op`], a [`WriteOp::PutDocsOnce`]). So an
//! acknowledged end always has its event, and a crash before that commit
//! has neither. A workflow run's end does the same in the run's final
//! write. The event's id is derived from what it reports (tenant, session,
//! turn, kind, model calls so far; or the run), so writing the same end
//! twice (a record rewritten after a restart) finds the event there and
//! adds nothing.
//!
//! Documents, on redb and PostgreSQL alike:
//! - `webhook_deliveries/<id>`: the delivery record ([`Delivery`]):
//!   target, event, state (`pending`, `delivered`, `failed`), every
//!   attempt (the last [`KEEP_ATTEMPTS`]). Listed under its tenant;
//!   linked to the session, so erasing the session erases its events.
//! - `webhook_due/<id>` `{next}` while the event waits for an attempt;
//!   `webhook_sending/<id>` `{node, since}` while a node sends it. Moving
//!   the document from the first to the second is the claim (one node
//!   gets it, as schedules claim a slot); a node that dies while sending
//!   leaves it there, and after [`LEASE`] any node moves it back.
//!
//! # Delivery
//! Standard Webhooks (<https://www.standardwebhooks.com>): `POST` of the
//! event's JSON `{type, timestamp, data}` with `webhook-id` (the event id,
//! the same on every attempt), `webhook-timestamp` (the attempt's Unix
//! seconds) and `webhook-signature: v1,<base64 HMAC-SHA256 of
//! "<id>.<timestamp>.<body>">` under the tenant's `webhook_secret` (tenant
//! config) or else `[webhooks] secret` (`whsec_<base64>`, 24 to 128 bytes).
//! The body's bytes are fixed when the event is written, so every attempt
//! sends the same body. A 2xx is delivered; anything else (another
//! status, a redirect, a timeout of [`WebhookConfig::timeout_s`], a
//! refused connection) is retried with doubling backoff from
//! `first_retry_ms` (capped at one hour, ±50 % jitter) until
//! `retry_for_s` (default 24 h) after the event was written; then the
//! record says `failed`. Restarts keep the schedule: the next attempt time
//! is stored.
//!
//! # Targets
//! A target is checked when the message, run or schedule that names it
//! is accepted, and refused with 422 `WEBHOOK_REFUSED`: not http(s),
//! longer than [`MAX_URL_BYTES`], or an address `http_request` may not
//! reach (loopback, private, link-local and metadata addresses, the whole
//! table of [`crate::tools::builtin::net_guard`]), by IP literal or by
//! what the name resolves to then. A name that does not resolve then is
//! accepted (DNS may come back; the delivery is checked again). Every
//! attempt goes through the same guard (after DNS, no redirects
//! followed), so a name that later resolves to a private address is
//! refused at delivery (recorded as the attempt's error). `[webhooks]
//! allow_private = true` lifts the address rule (a receiver on the same
//! machine or network); `[webhooks] allowlist` exempts hosts (`host` or
//! `host:port`) like `[tools] http_allowlist`. Without any secret,
//! webhooks are refused (422): an event nobody can verify is not sent.
//!
//! Owns: event ids, the outbox documents, signatures, the delivery loop.
//! Does not: decide when a turn ended (conversation) or a run (workflow).

mod delivery;
pub mod signing;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::store::{NewDoc, Page, Store, StoreError, WriteOp};
use crate::tools::builtin::net_guard::{GuardedClient, NetPolicy, Redirects};
pub use signing::Secret;

/// Delivery records, one per event.
pub const DELIVERIES: &str = "webhook_deliveries";
/// Events waiting for their next attempt: `{next}`.
pub const DUE: &str = "webhook_due";
/// Events a node is sending: `{node, since}`.
pub const SENDING: &str = "webhook_sending";

/// Longest target URL.
pub const MAX_URL_BYTES: usize = 2048;
/// Attempts kept in a delivery record (the count goes on).
pub const KEEP_ATTEMPTS: usize = 20;
/// A claim older than this is taken back from the node that made it.
pub const LEASE: Duration = Duration::from_secs(60);
/// How long to wait for a name's addresses when checking a target.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(3);
/// The longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// `[webhooks]` in the server's config.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookConfig {
    /// `whsec_<base64>`: the signing secret of tenants without their own.
    pub secret: Option<String>,
    /// Deliver to loopback, private and link-local addresses too.
    pub allow_private: bool,
    /// Hosts (`host` or `host:port`) exempt from the address rule.
    pub allowlist: Vec<String>,
    /// Time allowed to one attempt (connect, send, response head).
    pub timeout_s: u64,
    /// Wait after the first failed attempt; it doubles each time.
    pub first_retry_ms: u64,
    /// Attempts stop this long after the event was written (`failed`).
    pub retry_for_s: u64,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig {
            secret: None,
            allow_private: false,
            allowlist: Vec::new(),
            timeout_s: 10,
            first_retry_ms: 5_000,
            retry_for_s: 86_400,
        }
    }
}

impl WebhookConfig {
    /// The config's problems, for the server's config check.
    pub fn check(&self) -> Result<(), String> {
        if let Some(s) = &self.secret {
            Secret::parse(s).map_err(|e| format!("secret: {e}"))?;
        }
        if self.timeout_s == 0 || self.timeout_s > 300 {
            return Err("timeout_s must be 1 to 300".into());
        }
        if self.first_retry_ms == 0 {
            return Err("first_retry_ms must be at least 1".into());
        }
        Ok(())
    }
}

/// Why a webhook target is refused (422 `WEBHOOK_REFUSED`).
#[derive(Debug, Clone, thiserror::Error)]
#[error("webhook refused: {0}")]
pub struct WebhookRefused(pub String);

impl crate::error_code::PublicError for WebhookRefused {
    fn code(&self) -> crate::error_code::ErrorCode {
        crate::error_code::ErrorCode::WebhookRefused
    }
}

/// Where an event stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Waiting for an attempt (the first, or a retry).
    Pending,
    /// A 2xx answered.
    Delivered,
    /// No 2xx within `retry_for_s`.
    Failed,
}

/// One attempt to deliver an event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Attempt {
    #[schema(value_type = String, format = DateTime)]
    pub at: Timestamp,
    /// The receiver's status, when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Why there was no status (timeout, refused connection, refused
    /// address), or what a non-2xx was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub duration_ms: u64,
}

/// A delivery record: `GET /v1/webhooks/deliveries` lists these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Delivery {
    /// The event's id: the `webhook-id` header of every attempt.
    pub id: String,
    #[serde(skip_serializing)]
    #[schema(ignore)]
    pub tenant: String,
    pub url: String,
    /// The event's `type` (`turn.completed`, `run.failed` ...).
    pub event_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    pub state: DeliveryState,
    /// Attempts made so far.
    pub attempt_count: u32,
    /// The last [`KEEP_ATTEMPTS`] attempts, oldest first.
    pub attempts: Vec<Attempt>,
    /// When the next attempt is due, while `pending`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub next_attempt_at: Option<Timestamp>,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    /// The event as sent (the body of every attempt): `{type, timestamp,
    /// data}`.
    #[schema(value_type = std::collections::BTreeMap<String, Value>)]
    pub event: Value,
}

/// An event to write with the step that ends what it reports.
#[derive(Debug, Clone)]
pub struct Event {
    pub tenant: String,
    pub url: String,
    /// `turn.completed`, `turn.failed`, `turn.interrupted`,
    /// `turn.awaiting_approval`, `run.completed`, `run.failed` ...
    pub event_type: String,
    pub session_id: Option<String>,
    pub turn_id: Option<String>,
    pub run_id: Option<String>,
    /// What makes this event distinct from the others of the same turn or
    /// run (e.g. the turn's model calls when it paused), for its id.
    pub distinct: String,
    /// A time the event's id is ordered by, the same each time the event
    /// is written again (the turn's or the run's start).
    pub anchor: Timestamp,
    /// The event's `data`.
    pub data: Value,
}

impl Event {
    /// `msg_` and a UUID v7 of the anchor whose other bits are a SHA-256 of
    /// what the event reports: the same event, the same id.
    pub fn id(&self) -> String {
        let digest = Sha256::digest(
            format!(
                "{}\n{}\n{}\n{}\n{}\n{}",
                self.tenant,
                self.session_id.as_deref().unwrap_or(""),
                self.turn_id.as_deref().unwrap_or(""),
                self.run_id.as_deref().unwrap_or(""),
                self.event_type,
                self.distinct
            )
            .as_bytes(),
        );
        let mut bytes = [0u8; 10];
        bytes.copy_from_slice(&digest[..10]);
        let ms = u64::try_from(self.anchor.as_millisecond()).unwrap_or(0);
        let uuid = uuid::Builder::from_unix_timestamp_millis(ms, &bytes).into_uuid();
        format!("msg_{}", uuid.simple())
    }
}

/// The write that puts `event` in the outbox, once (see the module doc);
/// the caller puts it in the durable write of the step it reports.
pub fn outbox_op(event: Event) -> WriteOp {
    let id = event.id();
    let now = Timestamp::now();
    let body = json!({
        "type": event.event_type,
        "timestamp": now,
        "data": event.data,
    });
    let delivery = Delivery {
        id: id.clone(),
        tenant: event.tenant.clone(),
        url: event.url,
        event_type: event.event_type,
        session_id: event.session_id.clone(),
        turn_id: event.turn_id,
        run_id: event.run_id,
        state: DeliveryState::Pending,
        attempt_count: 0,
        attempts: Vec::new(),
        next_attempt_at: Some(now),
        created_at: now,
        event: body,
    };
    WriteOp::PutDocsOnce {
        docs: vec![
            NewDoc {
                namespace: DELIVERIES.into(),
                key: id.clone(),
                value: stored(&delivery),
                tenant: Some(event.tenant),
            },
            NewDoc {
                namespace: DUE.into(),
                key: id,
                value: json!({ "next": now }),
                tenant: None,
            },
        ],
        session_id: event.session_id,
    }
}

/// The stored form of a delivery record (its tenant kept).
fn stored(d: &Delivery) -> Value {
    let mut v = serde_json::to_value(d).expect("delivery records serialize");
    v["tenant"] = Value::String(d.tenant.clone());
    v
}

fn loaded(v: Value) -> Option<Delivery> {
    let tenant = v.get("tenant")?.as_str()?.to_string();
    let mut d: Delivery = serde_json::from_value(v).ok()?;
    d.tenant = tenant;
    Some(d)
}

static WAKE: LazyLock<Notify> = LazyLock::new(Notify::new);

/// Tells this process's delivery loop that an event was written (it also
/// looks every [`delivery::POLL`], for events other nodes wrote).
pub fn wake() {
    WAKE.notify_one();
}

/// The webhooks of one node: target checks, the delivery listing and the
/// delivery loop. Cheap to clone.
#[derive(Clone)]
pub struct Webhooks {
    inner: Arc<Inner>,
}

/// The signing secret a tenant set for itself (its tenant config's
/// `webhook_secret`), looked up by the layer that owns tenant configs.
pub type TenantSecrets =
    Arc<dyn Fn(String) -> futures::future::BoxFuture<'static, Option<String>> + Send + Sync>;

struct Inner {
    store: Store,
    tenant_secrets: TenantSecrets,
    config: WebhookConfig,
    secret: Option<Secret>,
    policy: NetPolicy,
    /// Guarded (no private addresses, no redirects), or plain with
    /// `allow_private` (still no redirects).
    client: reqwest::Client,
    guarded: Option<GuardedClient>,
}

impl Webhooks {
    pub fn new(
        store: Store,
        config: WebhookConfig,
        tenant_secrets: TenantSecrets,
    ) -> Result<Webhooks, String> {
        config.check()?;
        let secret = config.secret.as_deref().map(Secret::parse).transpose()?;
        let timeout = Duration::from_secs(config.timeout_s);
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(timeout)
            .connect_timeout(timeout)
            .user_agent(concat!("cadre/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| e.to_string())?;
        let guarded = if config.allow_private {
            None
        } else {
            Some(
                GuardedClient::new(&config.allowlist, Redirects::Manual)
                    .map_err(|e| e.to_string())?,
            )
        };
        Ok(Webhooks {
            inner: Arc::new(Inner {
                store,
                tenant_secrets,
                policy: NetPolicy::new(&config.allowlist),
                config,
                secret,
                client,
                guarded,
            }),
        })
    }

    pub fn config(&self) -> &WebhookConfig {
        &self.inner.config
    }

    /// Checks a target a caller of `tenant` names (see the module doc);
    /// the URL as it will be used.
    pub async fn check(&self, tenant: &str, url: &str) -> Result<String, WebhookRefused> {
        if url.len() > MAX_URL_BYTES {
            return Err(WebhookRefused(format!(
                "the URL is longer than {MAX_URL_BYTES} bytes"
            )));
        }
        let parsed =
            Url::parse(url).map_err(|e| WebhookRefused(format!("'{url}' is not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(WebhookRefused(format!(
                "'{}' is not http or https",
                parsed.scheme()
            )));
        }
        if !self.inner.config.allow_private {
            self.inner
                .policy
                .check_url(&parsed)
                .map_err(|e| WebhookRefused(e.to_string()))?;
            if let Some(url::Host::Domain(host)) = parsed.host() {
                let lookup = tokio::net::lookup_host((host, 0));
                if let Ok(Ok(found)) = tokio::time::timeout(RESOLVE_TIMEOUT, lookup).await {
                    let found: Vec<_> = found.collect();
                    if !found.is_empty() {
                        self.inner
                            .policy
                            .filter_resolved(host, found)
                            .map_err(|e| WebhookRefused(e.to_string()))?;
                    }
                }
            }
        }
        if self.secret_of(tenant).await.is_none() {
            return Err(WebhookRefused(
                "no signing secret: set [webhooks] secret (CADRE_WEBHOOKS_SECRET) or the tenant config's webhook_secret".into(),
            ));
        }
        Ok(parsed.to_string())
    }

    /// The tenant's own secret, else the server's.
    async fn secret_of(&self, tenant: &str) -> Option<Secret> {
        let own = (self.inner.tenant_secrets)(tenant.to_string())
            .await
            .and_then(|s| Secret::parse(&s).ok());
        own.or_else(|| self.inner.secret.clone())
    }

    /// A page of `tenant`'s delivery records, newest first.
    pub async fn deliveries(
        &self,
        tenant: &str,
        cursor: Option<String>,
        limit: usize,
    ) -> Result<Page<Delivery>, StoreError> {
        let page = self
            .inner
            .store
            .docs_of(DELIVERIES, tenant, cursor, limit, true)
            .await?;
        Ok(Page {
            items: page
                .items
                .into_iter()
                .filter_map(|(_, v)| loaded(v))
                .collect(),
            next: page.next,
        })
    }

    /// One delivery record of `tenant`.
    pub async fn delivery(&self, tenant: &str, id: &str) -> Result<Option<Delivery>, StoreError> {
        Ok(self
            .inner
            .store
            .get_doc(DELIVERIES, id)
            .await?
            .and_then(loaded)
            .filter(|d| d.tenant == tenant))
    }

    /// Starts the delivery loop; it stops with `stop`.
    pub fn spawn_loop(&self, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(delivery::run(self.clone(), stop))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str, distinct: &str) -> Event {
        Event {
            tenant: "t".into(),
            url: "https://example.com/hook".into(),
            event_type: kind.into(),
            session_id: Some("s".into()),
            turn_id: Some("u".into()),
            run_id: None,
            distinct: distinct.into(),
            anchor: Timestamp::from_millisecond(1_700_000_000_000).unwrap(),
            data: json!({}),
        }
    }

    #[test]
    fn an_event_has_one_id_and_another_event_another() {
        let a = event("turn.completed", "1");
        assert_eq!(a.id(), event("turn.completed", "1").id());
        assert_ne!(a.id(), event("turn.completed", "2").id());
        assert_ne!(a.id(), event("turn.failed", "1").id());
        assert!(a.id().starts_with("msg_"));
        assert_eq!(a.id().len(), 4 + 32);
    }

    #[test]
    fn a_bad_config_is_refused() {
        let mut c = WebhookConfig {
            secret: Some("nope".into()),
            ..Default::default()
        };
        assert!(c.check().is_err());
        c.secret = None;
        c.timeout_s = 0;
        assert!(c.check().is_err());
        assert!(WebhookConfig::default().check().is_ok());
    }
}
