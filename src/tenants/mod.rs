//! Tenants: who is calling (API keys) and how their turns are configured.
//!
//! request ──Authorization: Bearer──▶ KeyRing::verify ──▶ Principal {tenant, admin} ──▶ handlers
//! turn ──▶ TenantConfig (redb docs) ──overrides──▶ the agent's settings for that turn
//!
//! Keys look like `cadre_<id>_<secret>`; only the SHA-256 of the secret is
//! stored, compared in constant time (`subtle`), and neither keys nor
//! Authorization headers are ever logged. `cadre keys create|list|revoke`
//! work on the redb file (so with the server stopped: one process owns the
//! file); the server loads the keys at startup. With no keys at all the
//! server runs open, as tenant `default` with admin rights, and only on a
//! loopback address.
//!
//! A tenant sees only its own sessions, calls, confirmations and summaries:
//! another tenant's resource is answered 404, never 403, so ids cannot be
//! probed. Admin keys may also manage tenant configs
//! (`/v1/tenants/{id}/config`) and read runtime-wide data (`/v1/stats`,
//! `/v1/events`).

pub mod config;

use std::collections::HashMap;
use std::sync::Arc;

use jiff::Timestamp;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::store::{Store, StoreError};

pub use config::TenantConfig;

pub use crate::identity::{DEFAULT_TENANT, Principal};
const KEYS: &str = "api_keys";

/// A stored key: never the key itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiKeyRecord {
    pub key_id: String,
    pub tenant: String,
    pub admin: bool,
    /// Hex SHA-256 of the secret part.
    pub secret_sha256: String,
    pub created_at: Timestamp,
    pub revoked_at: Option<Timestamp>,
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("no API key with id '{id}'")]
    NotFound { id: String },
    #[error("invalid tenant id '{tenant}': use 1-64 letters, digits, '_' or '-'")]
    BadTenant { tenant: String },
    #[error(transparent)]
    Store(#[from] StoreError),
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

/// Creates a key for `tenant`; returns the key (shown once) and its record.
pub async fn create_key(
    store: &Store,
    tenant: &str,
    admin: bool,
) -> Result<(String, ApiKeyRecord), KeyError> {
    if !valid_tenant_id(tenant) {
        return Err(KeyError::BadTenant {
            tenant: tenant.into(),
        });
    }
    let key_id = random_hex(6);
    let secret = random_hex(24);
    let record = ApiKeyRecord {
        key_id: key_id.clone(),
        tenant: tenant.into(),
        admin,
        secret_sha256: sha256_hex(&secret),
        created_at: Timestamp::now(),
        revoked_at: None,
    };
    let value = serde_json::to_value(&record).expect("key records serialize");
    store.put_doc(KEYS, &key_id, value, true).await?;
    Ok((format!("cadre_{key_id}_{secret}"), record))
}

pub async fn list_keys(store: &Store) -> Result<Vec<ApiKeyRecord>, KeyError> {
    Ok(store
        .list_docs(KEYS, "")
        .await?
        .into_iter()
        .filter_map(|(_, v)| serde_json::from_value(v).ok())
        .collect())
}

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

/// The keys a server accepts, loaded at startup.
#[derive(Clone, Default)]
pub struct KeyRing {
    by_id: Arc<HashMap<String, ApiKeyRecord>>,
    open: bool,
}

impl KeyRing {
    pub async fn load(store: &Store) -> Result<KeyRing, KeyError> {
        let all = list_keys(store).await?;
        // Once a key was ever created the server never runs open again,
        // even with every key revoked.
        let open = all.is_empty();
        let by_id = all
            .into_iter()
            .filter(|k| k.revoked_at.is_none())
            .map(|k| (k.key_id.clone(), k))
            .collect();
        Ok(KeyRing {
            by_id: Arc::new(by_id),
            open,
        })
    }

    /// No key was ever created: the server runs open.
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// The principal of a presented key, or `None`.
    pub fn verify(&self, presented: &str) -> Option<Principal> {
        let rest = presented.strip_prefix("cadre_")?;
        let (id, secret) = rest.split_once('_')?;
        let record = self.by_id.get(id)?;
        let presented_hash = sha256_hex(secret);
        let equal: bool = presented_hash
            .as_bytes()
            .ct_eq(record.secret_sha256.as_bytes())
            .into();
        equal.then(|| Principal {
            tenant: record.tenant.clone(),
            admin: record.admin,
            key_id: Some(record.key_id.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            ring.verify(&key),
            Some(Principal {
                tenant: "acme".into(),
                admin: false,
                key_id: Some(record.key_id.clone()),
            })
        );
        assert_eq!(ring.verify(&format!("{key}x")), None);
        assert_eq!(ring.verify("cadre_nope_nope"), None);
        assert_eq!(ring.verify("garbage"), None);

        revoke_key(&store, &record.key_id).await.unwrap();
        let ring = KeyRing::load(&store).await.unwrap();
        assert_eq!(ring.verify(&key), None);
        assert!(
            !ring.is_open(),
            "revoking every key never reopens the server"
        );
        assert!(matches!(
            create_key(&store, "bad tenant", false).await,
            Err(KeyError::BadTenant { .. })
        ));
    }
}
