//! Tenants: who is calling (API keys) and how their turns are configured.
//!
//! request ──Authorization: Bearer──▶ KeyRing::verify ──▶ Principal {tenant, admin, plan, metrics_only} ──▶ handlers
//! `/v1/keys`, `cadre keys` ──▶ KeyRing::create / revoke ──durable write──▶ redb ──then──▶ the ring in memory
//! turn ──▶ TenantConfig (redb docs) ──overrides──▶ the agent's settings for that turn
//!
//! Keys look like `cadre_<id>_<secret>`; only the SHA-256 of the secret is
//! stored, compared in constant time (`subtle`), and neither keys nor
//! Authorization headers are ever logged. A key carries its rights:
//! its tenant, `admin` (tenant configs, keys, runtime-wide data), the
//! highest [`Plan`] it may use and `metrics` (a scrape key: `/metrics` and
//! nothing else), and may expire (`expires_at`).
//!
//! Decisions:
//! - **The ring is live.** [`KeyRing`] is shared state (a std `RwLock` over
//!   a map: reads are a lookup, writes are rare and short, so no extra
//!   crate), loaded at startup and changed by the keys API *after* the
//!   durable write, before the reply: a revoked key is refused by the very
//!   next request, and nothing caches a verification. `cadre keys` on the
//!   data dir (the server stopped: one process owns the file) writes the
//!   same records, read at the next start.
//! - **Open mode.** With no key ever created the server runs open (tenant
//!   `default`, admin, every plan, loopback only). The first key created,
//!   also through the API, ends it at once; revoking every key never
//!   reopens the server.
//! - **Sessions from open mode** belong to tenant `default` and stay
//!   there: a key of tenant `default` (`cadre keys create --tenant default
//!   --admin`) reads them, a key of any other tenant (admin or not) gets
//!   404 like for any other tenant's data. Nothing moves or widens on its
//!   own; instead a key created while `default` has sessions and no key of
//!   its own comes with a notice saying so ([`open_mode_notice`]; printed
//!   by `cadre keys create`, `notice` in `POST /v1/keys`, logged).
//! - **Plans.** A new key may use every plan unless `plan` narrows it: the
//!   tenant's plan and the request narrow further. Records written before
//!   keys had plans read as `premium`, so existing keys keep what they had.
//! - **Refusals** say why (unknown, revoked, expired) only once the secret
//!   matched, so only the key's holder learns that its id exists.
//! - A scrape key is not an admin key (asking for both is refused): admin
//!   keys already read `/metrics`.
//!
//! A tenant sees only its own sessions, calls, confirmations and summaries:
//! another tenant's resource is answered 404, never 403, so ids cannot be
//! probed. Admin keys may also manage tenant configs
//! (`/v1/tenants/{id}/config`), keys (`/v1/keys`) and read runtime-wide
//! data (`/v1/stats`, `/v1/events`).

pub mod config;
pub mod tokens;

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use jiff::Timestamp;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error_code::{ErrorCode, PublicError};
use crate::store::{Store, StoreError};

pub use config::TenantConfig;

pub use crate::identity::{DEFAULT_TENANT, Plan, Principal};
/// The store namespace of API key records: the `api_keys` table
/// ([`crate::store::tables::API_KEYS`]).
const KEYS: &str = "api_keys";

/// A stored key: never the key itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiKeyRecord {
    pub key_id: String,
    pub tenant: String,
    pub admin: bool,
    /// The highest plan the key may use (records from before keys had
    /// plans: `premium`, what they could use then).
    #[serde(default = "every_plan")]
    pub plan: Plan,
    /// A scrape key: it may read `/metrics` and nothing else.
    #[serde(default)]
    pub metrics: bool,
    /// Hex SHA-256 of the secret part.
    pub secret_sha256: String,
    pub created_at: Timestamp,
    /// Refused from this instant on.
    #[serde(default)]
    pub expires_at: Option<Timestamp>,
    pub revoked_at: Option<Timestamp>,
}

fn every_plan() -> Plan {
    Plan::Premium
}

/// A key to create: its tenant and rights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewKey {
    pub tenant: String,
    pub admin: bool,
    pub plan: Plan,
    pub metrics: bool,
    pub expires_at: Option<Timestamp>,
}

impl NewKey {
    /// A key of `tenant` with every plan, not admin, no expiry.
    pub fn tenant(tenant: impl Into<String>) -> NewKey {
        NewKey {
            tenant: tenant.into(),
            admin: false,
            plan: every_plan(),
            metrics: false,
            expires_at: None,
        }
    }

    fn check(&self, now: Timestamp) -> Result<(), KeyError> {
        if !valid_tenant_id(&self.tenant) {
            return Err(KeyError::BadTenant {
                tenant: self.tenant.clone(),
            });
        }
        if self.admin && self.metrics {
            return Err(KeyError::AdminScrapeKey);
        }
        match self.expires_at {
            Some(at) if at <= now => Err(KeyError::ExpiresInThePast { at }),
            _ => Ok(()),
        }
    }
}

/// Where a key stands at an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyStatus {
    Active,
    Expired,
    Revoked,
}

impl ApiKeyRecord {
    pub fn status(&self, now: Timestamp) -> KeyStatus {
        if self.revoked_at.is_some() {
            KeyStatus::Revoked
        } else if self.expires_at.is_some_and(|at| at <= now) {
            KeyStatus::Expired
        } else {
            KeyStatus::Active
        }
    }

    /// What operators may see of it: no secret, no hash.
    pub fn info(&self, now: Timestamp) -> KeyInfo {
        KeyInfo {
            key_id: self.key_id.clone(),
            tenant: self.tenant.clone(),
            admin: self.admin,
            plan: self.plan,
            metrics: self.metrics,
            status: self.status(now),
            created_at: self.created_at,
            expires_at: self.expires_at,
            revoked_at: self.revoked_at,
        }
    }
}

/// A key as `GET /v1/keys` and `cadre keys list` show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyInfo {
    pub key_id: String,
    pub tenant: String,
    pub admin: bool,
    pub plan: Plan,
    pub metrics: bool,
    pub status: KeyStatus,
    pub created_at: Timestamp,
    pub expires_at: Option<Timestamp>,
    pub revoked_at: Option<Timestamp>,
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("no API key with id '{id}'")]
    NotFound { id: String },
    #[error("invalid tenant id '{tenant}': use 1-64 letters, digits, '_' or '-'")]
    BadTenant { tenant: String },
    #[error(
        "a key is either admin or a metrics (scrape-only) key: admin keys already read /metrics"
    )]
    AdminScrapeKey,
    #[error("expires_at {at} is not in the future")]
    ExpiresInThePast { at: Timestamp },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl PublicError for KeyError {
    fn code(&self) -> ErrorCode {
        match self {
            KeyError::NotFound { .. } => ErrorCode::KeyNotFound,
            KeyError::BadTenant { .. }
            | KeyError::AdminScrapeKey
            | KeyError::ExpiresInThePast { .. } => ErrorCode::ValidationError,
            KeyError::Store(s) => s.code(),
        }
    }

    fn public_message(&self) -> String {
        match self {
            KeyError::Store(s) => s.public_message(),
            other => other.to_string(),
        }
    }
}

/// Why a presented key was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyRefusal {
    /// Not a key of this server (or not a key at all).
    #[error("the API key is not valid")]
    Invalid,
    #[error("the API key was revoked")]
    Revoked,
    #[error("the API key has expired")]
    Expired,
}

pub fn valid_tenant_id(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 64
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn sha256_hex(s: &str) -> String {
    let digest = Sha256::digest(s.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Creates a key as of `now` (durably); returns the key (shown once) and
/// its record.
pub async fn issue_key(
    store: &Store,
    new: &NewKey,
    now: Timestamp,
) -> Result<(String, ApiKeyRecord), KeyError> {
    new.check(now)?;
    let key_id = random_hex(6);
    let secret = random_hex(24);
    let record = ApiKeyRecord {
        key_id: key_id.clone(),
        tenant: new.tenant.clone(),
        admin: new.admin,
        plan: new.plan,
        metrics: new.metrics,
        secret_sha256: sha256_hex(&secret),
        created_at: now,
        expires_at: new.expires_at,
        revoked_at: None,
    };
    let value = serde_json::to_value(&record).expect("key records serialize");
    store.put_doc(KEYS, &key_id, value, true).await?;
    Ok((format!("cadre_{key_id}_{secret}"), record))
}

/// Creates a key of `tenant` (admin or not) with every plan, no expiry.
pub async fn create_key(
    store: &Store,
    tenant: &str,
    admin: bool,
) -> Result<(String, ApiKeyRecord), KeyError> {
    let new = NewKey {
        admin,
        ..NewKey::tenant(tenant)
    };
    issue_key(store, &new, Timestamp::now()).await
}

pub async fn list_keys(store: &Store) -> Result<Vec<ApiKeyRecord>, KeyError> {
    let mut keys = Vec::new();
    for (id, value) in store.list_docs(KEYS, "").await? {
        match serde_json::from_value(value) {
            Ok(record) => keys.push(record),
            Err(e) => tracing::warn!(key_id = %id, error = %e, "unreadable API key record skipped"),
        }
    }
    Ok(keys)
}

/// Marks a key revoked (durably); revoking it again keeps the first time.
pub async fn revoke_key(store: &Store, key_id: &str) -> Result<ApiKeyRecord, KeyError> {
    let value = store
        .get_doc(KEYS, key_id)
        .await?
        .ok_or_else(|| KeyError::NotFound { id: key_id.into() })?;
    let mut record: ApiKeyRecord =
        serde_json::from_value(value).map_err(|e| KeyError::Store(e.into()))?;
    record.revoked_at.get_or_insert_with(Timestamp::now);
    let value = serde_json::to_value(&record).expect("key records serialize");
    store.put_doc(KEYS, key_id, value, true).await?;
    Ok(record)
}

/// What the creator of `created` must know about the sessions made in
/// open mode: they belong to tenant `default`, and only a key of tenant
/// `default` reads them (a tenant sees only its own sessions; an admin key
/// of another tenant is no exception, so isolation has no hole for
/// "the first key"). `Some` while tenant `default` has sessions and no
/// active key of its own, for a key of any other tenant; `keys` are the
/// keys before `created`.
pub async fn open_mode_notice(
    store: &Store,
    keys: &[ApiKeyRecord],
    created: &ApiKeyRecord,
) -> Result<Option<String>, KeyError> {
    let now = Timestamp::now();
    let default_has_key = keys
        .iter()
        .any(|k| k.tenant == DEFAULT_TENANT && !k.metrics && k.status(now) == KeyStatus::Active);
    if created.tenant == DEFAULT_TENANT || created.metrics || default_has_key {
        return Ok(None);
    }
    if store
        .sessions_of(DEFAULT_TENANT, None, 1)
        .await?
        .items
        .is_empty()
    {
        return Ok(None);
    }
    Ok(Some(format!(
        "sessions made before the first key (open mode) belong to tenant '{DEFAULT_TENANT}': \
         this key (tenant '{}') answers 404 for them. To read them, create a key of tenant \
         '{DEFAULT_TENANT}': `cadre keys create --tenant {DEFAULT_TENANT} --admin` (with \
         `--api-key` of an admin key while the server runs)",
        created.tenant
    )))
}

/// The keys a server accepts: loaded at startup, changed while it runs.
/// Clones share one ring.
#[derive(Clone)]
pub struct KeyRing {
    inner: Arc<RwLock<Ring>>,
    /// Bumped whenever the ring changes (a key created, revoked, or read
    /// again from the store): [`KeyRing::until_key_ends`] waits on it.
    changed: Arc<tokio::sync::watch::Sender<u64>>,
    /// The WebSocket tokens its keys asked for ([`tokens`]).
    ws_tokens: Arc<tokens::SessionTokens>,
}

struct Ring {
    /// Every key ever created, revoked ones included (they are refused
    /// with a reason, and they keep the server out of open mode).
    by_id: HashMap<String, ApiKeyRecord>,
}

impl KeyRing {
    pub async fn load(store: &Store) -> Result<KeyRing, KeyError> {
        let by_id = list_keys(store)
            .await?
            .into_iter()
            .map(|k| (k.key_id.clone(), k))
            .collect();
        Ok(KeyRing {
            inner: Arc::new(RwLock::new(Ring { by_id })),
            changed: Arc::new(tokio::sync::watch::Sender::new(0)),
            ws_tokens: Arc::default(),
        })
    }

    /// Reads the keys again from the store (cluster mode: keys created or
    /// revoked on another node take effect here within one heartbeat;
    /// `crate::runtime` calls it on each). A store error keeps the ring.
    pub async fn refresh(&self, store: &Store) -> Result<(), KeyError> {
        let by_id = list_keys(store)
            .await?
            .into_iter()
            .map(|k| (k.key_id.clone(), k))
            .collect();
        self.inner
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .by_id = by_id;
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
        Ok(())
    }

    /// Resolves once key `key_id` is no longer active: revoked (here, or
    /// on another node and read at the next [`KeyRing::refresh`]), past
    /// its `expires_at`, or unknown. What a key opened (its event streams,
    /// WebSockets, `GET /mcp`) ends with it (issue #29).
    pub async fn until_key_ends(&self, key_id: String) {
        /// Looked at again at least this often, whatever happens.
        const RECHECK: std::time::Duration = std::time::Duration::from_secs(60);
        let mut changed = self.changed.subscribe();
        loop {
            let now = Timestamp::now();
            let expires_at = match self.read().by_id.get(&key_id) {
                Some(key) if key.status(now) == KeyStatus::Active => key.expires_at,
                _ => return,
            };
            let wait = expires_at
                .and_then(|at| std::time::Duration::try_from(at.duration_since(now)).ok())
                .map_or(RECHECK, |d| d.min(RECHECK));
            tokio::select! {
                _ = changed.changed() => {}
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Ring> {
        // No code panics while holding the lock; a poisoned one is intact.
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn remember(&self, record: ApiKeyRecord) {
        let mut ring = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        ring.by_id.insert(record.key_id.clone(), record);
        drop(ring);
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The rights key `key_id` gives at `now`, while it is active (not
    /// revoked, not expired): what work started on its behalf, without a
    /// request presenting it (schedules), runs with.
    pub fn principal_of(&self, key_id: &str, now: Timestamp) -> Option<Principal> {
        let ring = self.read();
        let record = ring.by_id.get(key_id)?;
        (record.status(now) == KeyStatus::Active).then(|| Principal {
            tenant: record.tenant.clone(),
            admin: record.admin,
            plan: record.plan,
            metrics_only: record.metrics,
            key_id: Some(record.key_id.clone()),
        })
    }

    /// No key was ever created: the server runs open.
    pub fn is_open(&self) -> bool {
        self.read().by_id.is_empty()
    }

    /// The principal of a presented key, now.
    pub fn verify(&self, presented: &str) -> Result<Principal, KeyRefusal> {
        self.verify_at(presented, Timestamp::now())
    }

    /// The principal of a presented key at `now`.
    pub fn verify_at(&self, presented: &str, now: Timestamp) -> Result<Principal, KeyRefusal> {
        let rest = presented
            .strip_prefix("cadre_")
            .ok_or(KeyRefusal::Invalid)?;
        let (id, secret) = rest.split_once('_').ok_or(KeyRefusal::Invalid)?;
        let ring = self.read();
        let record = ring.by_id.get(id).ok_or(KeyRefusal::Invalid)?;
        let presented_hash = sha256_hex(secret);
        let equal: bool = presented_hash
            .as_bytes()
            .ct_eq(record.secret_sha256.as_bytes())
            .into();
        if !equal {
            return Err(KeyRefusal::Invalid);
        }
        match record.status(now) {
            KeyStatus::Revoked => Err(KeyRefusal::Revoked),
            KeyStatus::Expired => Err(KeyRefusal::Expired),
            KeyStatus::Active => Ok(Principal {
                tenant: record.tenant.clone(),
                admin: record.admin,
                plan: record.plan,
                metrics_only: record.metrics,
                key_id: Some(record.key_id.clone()),
            }),
        }
    }

    /// A single-use token that opens `session`'s WebSocket as `principal`
    /// within [`tokens::WS_TOKEN_TTL`].
    pub fn issue_ws_token(
        &self,
        principal: &Principal,
        session: &str,
    ) -> Result<String, tokens::TokenError> {
        self.ws_tokens
            .issue_at(principal, session, std::time::Instant::now())
    }

    /// Spends a WebSocket token for `session`: the principal of the key
    /// that asked for it, if that key is still active now (or, for a token
    /// of open mode, the server still open).
    pub fn redeem_ws_token(&self, token: &str, session: &str) -> Result<Principal, KeyRefusal> {
        let grant = self
            .ws_tokens
            .redeem_at(token, session, std::time::Instant::now())
            .map_err(|refusal| {
                tracing::debug!(?refusal, "WebSocket token refused");
                KeyRefusal::Invalid
            })?;
        let ring = self.read();
        match &grant.principal.key_id {
            None if ring.by_id.is_empty() => Ok(grant.principal),
            None => Err(KeyRefusal::Invalid),
            Some(id) => match ring.by_id.get(id).map(|k| k.status(Timestamp::now())) {
                Some(KeyStatus::Active) => Ok(grant.principal),
                Some(KeyStatus::Revoked) => Err(KeyRefusal::Revoked),
                Some(KeyStatus::Expired) => Err(KeyRefusal::Expired),
                None => Err(KeyRefusal::Invalid),
            },
        }
    }

    /// Creates a key (durably), then accepts it; the first one ends open
    /// mode. The notice is [`open_mode_notice`]'s.
    pub async fn create(
        &self,
        store: &Store,
        new: &NewKey,
    ) -> Result<(String, ApiKeyRecord, Option<String>), KeyError> {
        let before: Vec<ApiKeyRecord> = self.read().by_id.values().cloned().collect();
        let (key, record) = issue_key(store, new, Timestamp::now()).await?;
        self.remember(record.clone());
        // The key exists from here on: a failed read only loses the notice.
        let notice = open_mode_notice(store, &before, &record)
            .await
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "could not check for open-mode sessions");
                None
            });
        Ok((key, record, notice))
    }

    /// Revokes a key (durably), then refuses it.
    pub async fn revoke(&self, store: &Store, key_id: &str) -> Result<ApiKeyRecord, KeyError> {
        let record = revoke_key(store, key_id).await?;
        self.remember(record.clone());
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(tenant: &str, key_id: &str) -> Principal {
        Principal {
            tenant: tenant.into(),
            admin: false,
            plan: Plan::Premium,
            metrics_only: false,
            key_id: Some(key_id.into()),
        }
    }

    #[tokio::test]
    async fn a_created_key_verifies_until_revoked_and_only_its_hash_is_stored() {
        let store = Store::open_in_memory().unwrap();
        let (key, record) = create_key(&store, "acme", false).await.unwrap();
        assert!(key.starts_with(&format!("cadre_{}_", record.key_id)));
        let stored = store.get_doc(KEYS, &record.key_id).await.unwrap().unwrap();
        let secret = key.rsplit('_').next().unwrap();
        assert!(!stored.to_string().contains(secret));

        let ring = KeyRing::load(&store).await.unwrap();
        assert!(!ring.is_open());
        assert_eq!(ring.verify(&key), Ok(principal("acme", &record.key_id)));
        assert_eq!(ring.verify(&format!("{key}x")), Err(KeyRefusal::Invalid));
        assert_eq!(ring.verify("cadre_nope_nope"), Err(KeyRefusal::Invalid));
        assert_eq!(ring.verify("garbage"), Err(KeyRefusal::Invalid));

        revoke_key(&store, &record.key_id).await.unwrap();
        let ring = KeyRing::load(&store).await.unwrap();
        assert_eq!(ring.verify(&key), Err(KeyRefusal::Revoked));
        assert!(
            !ring.is_open(),
            "revoking every key never reopens the server"
        );
        assert!(matches!(
            create_key(&store, "bad tenant", false).await,
            Err(KeyError::BadTenant { .. })
        ));
    }

    #[tokio::test]
    async fn the_live_ring_accepts_a_new_key_and_refuses_a_revoked_one_at_once() {
        let store = Store::open_in_memory().unwrap();
        let ring = KeyRing::load(&store).await.unwrap();
        assert!(ring.is_open());
        let serving = ring.clone();

        let new = NewKey {
            plan: Plan::Free,
            ..NewKey::tenant("acme")
        };
        let (key, record, _) = ring.create(&store, &new).await.unwrap();
        assert!(!serving.is_open(), "the first key ends open mode");
        let principal = serving.verify(&key).unwrap();
        assert_eq!(principal.plan, Plan::Free);
        assert_eq!(principal.tenant, "acme");

        ring.revoke(&store, &record.key_id).await.unwrap();
        assert_eq!(serving.verify(&key), Err(KeyRefusal::Revoked));
        assert!(matches!(
            ring.revoke(&store, "nope").await,
            Err(KeyError::NotFound { .. })
        ));
        // What the ring did is what a restart reads.
        let reloaded = KeyRing::load(&store).await.unwrap();
        assert_eq!(reloaded.verify(&key), Err(KeyRefusal::Revoked));
    }

    #[tokio::test]
    async fn a_key_is_refused_from_its_expiry_on() {
        let store = Store::open_in_memory().unwrap();
        let now: Timestamp = "2030-01-01T00:00:00Z".parse().unwrap();
        let expires: Timestamp = "2030-01-02T00:00:00Z".parse().unwrap();
        let new = NewKey {
            expires_at: Some(expires),
            ..NewKey::tenant("acme")
        };
        let (key, _) = issue_key(&store, &new, now).await.unwrap();
        let ring = KeyRing::load(&store).await.unwrap();
        assert!(ring.verify_at(&key, now).is_ok());
        let just_before = expires - jiff::SignedDuration::from_nanos(1);
        assert!(ring.verify_at(&key, just_before).is_ok());
        assert_eq!(ring.verify_at(&key, expires), Err(KeyRefusal::Expired));

        assert!(matches!(
            issue_key(&store, &new, expires).await,
            Err(KeyError::ExpiresInThePast { .. })
        ));
    }

    #[tokio::test]
    async fn rights_are_checked_and_carried_to_the_principal() {
        let store = Store::open_in_memory().unwrap();
        let ring = KeyRing::load(&store).await.unwrap();
        let both = NewKey {
            admin: true,
            metrics: true,
            ..NewKey::tenant("ops")
        };
        assert!(matches!(
            ring.create(&store, &both).await,
            Err(KeyError::AdminScrapeKey)
        ));
        assert!(ring.is_open(), "a refused key is not created");
        let scrape = NewKey {
            metrics: true,
            ..NewKey::tenant("ops")
        };
        let (key, _, _) = ring.create(&store, &scrape).await.unwrap();
        let p = ring.verify(&key).unwrap();
        assert!(p.metrics_only && !p.admin && p.may_scrape());
        assert!(Principal::open().may_scrape());
        assert_eq!(Principal::open().plan, Plan::Premium);
    }

    #[test]
    fn records_from_before_plans_read_as_premium_active_keys() {
        let old = serde_json::json!({
            "key_id": "abc", "tenant": "acme", "admin": false,
            "secret_sha256": "00", "created_at": "2024-01-01T00:00:00Z", "revoked_at": null
        });
        let record: ApiKeyRecord = serde_json::from_value(old).unwrap();
        assert_eq!(record.plan, Plan::Premium);
        assert!(!record.metrics);
        assert_eq!(record.expires_at, None);
        let info = record.info(Timestamp::now());
        assert_eq!(info.status, KeyStatus::Active);
        assert!(!serde_json::to_string(&info).unwrap().contains("secret"));
    }
}
