//! Pending confirmations: the `require_confirmation` post-processor.
//!
//! executor ──(tool requires confirmation)──▶ PendingConfirmation (durable) ──▶ `pending_confirmation`
//! POST /v1/confirmations/{id} {approve} ──▶ take() ──▶ approve: the executor runs it; deny: discarded
//!
//! A tool that needs confirmation does not run when called: the call is
//! stored (redb, durable, so it survives a restart) with a summary of what
//! would happen, and the caller gets its `confirmation_id`. Unconfirmed
//! calls expire after a TTL (default 10 min); an expired one can no longer
//! be approved. `take` removes the confirmation, so it runs at most once.

use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error_code::{ErrorCode, PublicError};
use crate::store::{Store, StoreError};
use crate::tools::ExecutionContext;

const NAMESPACE: &str = "confirmations";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingConfirmation {
    pub confirmation_id: String,
    pub tool_name: String,
    pub params: Value,
    pub tool_call_id: Option<String>,
    pub context: ExecutionContext,
    /// What would happen, for the person asked to confirm.
    pub summary: String,
    pub created_at: Timestamp,
    pub expires_at: Timestamp,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfirmationError {
    #[error("no pending confirmation with id '{id}'")]
    NotFound { id: String },
    #[error("confirmation '{id}' expired at {expired_at}")]
    Expired { id: String, expired_at: Timestamp },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl PublicError for ConfirmationError {
    fn code(&self) -> ErrorCode {
        match self {
            ConfirmationError::NotFound { .. } => ErrorCode::ConfirmationNotFound,
            ConfirmationError::Expired { .. } => ErrorCode::ConfirmationExpired,
            ConfirmationError::Store(s) => s.code(),
        }
    }

    fn public_message(&self) -> String {
        match self {
            ConfirmationError::Store(s) => s.public_message(),
            other => other.to_string(),
        }
    }
}

#[derive(Clone)]
pub struct Confirmations {
    store: Store,
    ttl: Duration,
}

impl Confirmations {
    pub fn new(store: Store, ttl: Duration) -> Self {
        Confirmations { store, ttl }
    }

    /// Stores a pending call durably and returns it.
    pub async fn create(
        &self,
        tool_name: &str,
        params: Value,
        tool_call_id: Option<String>,
        context: ExecutionContext,
    ) -> Result<PendingConfirmation, StoreError> {
        let now = Timestamp::now();
        let ttl = jiff::SignedDuration::try_from(self.ttl).unwrap_or(jiff::SignedDuration::MAX);
        let pending = PendingConfirmation {
            confirmation_id: format!("conf_{}", uuid::Uuid::now_v7().simple()),
            summary: format!("{tool_name} will run with {params} once confirmed"),
            tool_name: tool_name.to_string(),
            params,
            tool_call_id,
            context,
            created_at: now,
            expires_at: now.checked_add(ttl).unwrap_or(Timestamp::MAX),
        };
        let value = serde_json::to_value(&pending).expect("confirmations serialize");
        self.store
            .put_doc(NAMESPACE, &pending.confirmation_id, value, true)
            .await?;
        Ok(pending)
    }

    pub async fn get(&self, id: &str) -> Result<PendingConfirmation, ConfirmationError> {
        let value = self
            .store
            .get_doc(NAMESPACE, id)
            .await?
            .ok_or_else(|| ConfirmationError::NotFound { id: id.into() })?;
        serde_json::from_value(value).map_err(|e| ConfirmationError::Store(e.into()))
    }

    /// Removes the confirmation (durably) and returns it if it has not expired.
    pub async fn take(&self, id: &str) -> Result<PendingConfirmation, ConfirmationError> {
        let pending = self.get(id).await?;
        self.store.delete_doc(NAMESPACE, id, true).await?;
        if Timestamp::now() >= pending.expires_at {
            return Err(ConfirmationError::Expired {
                id: id.into(),
                expired_at: pending.expires_at,
            });
        }
        Ok(pending)
    }

    /// Confirmations not yet decided (expired ones included, marked by their time).
    pub async fn list(&self) -> Result<Vec<PendingConfirmation>, StoreError> {
        let docs = self.store.list_docs(NAMESPACE, "").await?;
        Ok(docs
            .into_iter()
            .filter_map(|(_, v)| serde_json::from_value(v).ok())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::CallerType;
    use serde_json::json;

    #[tokio::test]
    async fn a_confirmation_survives_reopen_and_is_taken_once() {
        let dir = tempfile::tempdir().unwrap();
        let id = {
            let c = Confirmations::new(Store::open(dir.path()).unwrap(), Duration::from_secs(600));
            let ctx = ExecutionContext::new(CallerType::Direct, "u");
            let p = c.create("order", json!({"q": 1}), None, ctx).await.unwrap();
            assert!(p.summary.contains("order"));
            p.confirmation_id
        };
        let c = Confirmations::new(Store::open(dir.path()).unwrap(), Duration::from_secs(600));
        assert_eq!(c.list().await.unwrap().len(), 1);
        let p = c.take(&id).await.unwrap();
        assert_eq!(p.params, json!({"q": 1}));
        assert!(matches!(
            c.take(&id).await,
            Err(ConfirmationError::NotFound { .. })
        ));
    }

    #[tokio::test]
    async fn an_expired_confirmation_cannot_be_taken() {
        let dir = tempfile::tempdir().unwrap();
        let c = Confirmations::new(Store::open(dir.path()).unwrap(), Duration::ZERO);
        let ctx = ExecutionContext::new(CallerType::Direct, "u");
        let p = c.create("order", json!({}), None, ctx).await.unwrap();
        assert!(matches!(
            c.take(&p.confirmation_id).await,
            Err(ConfirmationError::Expired { .. })
        ));
    }
}
