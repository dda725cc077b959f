//! Pending confirmations: the `require_confirmation` post-processor.
//!
//! executor ──(tool requires confirmation)──▶ PendingConfirmation (durable) ──▶ `CONFIRMATION_REQUIRED`
//! POST /v1/confirmations/{id} {approve} ──▶ decide() ──▶ approve: the executor runs it; deny: discarded
//!
//! A tool that needs confirmation does not run when called: the call is
//! stored (redb, durable, so it survives a restart) with a summary of what
//! would happen, and the caller gets its `confirmation_id`. Unconfirmed
//! calls expire after a TTL (default 10 min); an expired one can no longer
//! be approved.
//!
//! Exactly once: [`Confirmations::decide`] moves the pending record to
//! `confirmations_decided` (with the decision, the tenant and the time) in
//! one store operation ([`crate::store::DocReads::move_doc`]). Of any number of approvals
//! and denials racing for one confirmation exactly one finds it pending
//! and wins; every other gets `CONFIRMATION_ALREADY_DECIDED` (409) with the
//! winning decision, and nothing runs for it. The decided records stay
//! (small; one per confirmation ever decided) so a late request learns
//! what happened instead of a bare 404. A confirmation made in a session
//! is linked to it and erased with it, pending or decided.
//!
//! Call records: the held call writes one record, `CONFIRMATION_REQUIRED`
//! (status `pending_approval`), under an id kept here
//! ([`PendingConfirmation::record_id`]). The decision rewrites that same
//! record rather than adding one: an approved call's run is recorded under
//! it (so the call is one record, counted once, as what the run gave), a
//! denied one becomes `TOOL_DECLINED`. Held and declined records count neither
//! as succeeded nor as failed, nor in the per-tool counters (`/v1/stats`):
//! they did not run ([`crate::store::CallStatus`]). A confirmation that
//! expires without anyone deciding (nor a turn resuming over it) keeps its
//! pending record.

use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error_code::{ErrorCode, PublicError};
use crate::identity::DEFAULT_TENANT;
use crate::store::{Page, Store, StoreError, ToolCallRecord, WriteOp};
use crate::tools::ExecutionContext;

/// Pending confirmations: the `confirmations` table
/// ([`crate::store::tables::CONFIRMATIONS`]).
const NAMESPACE: &str = "confirmations";
/// Decided confirmations: [`DecidedRecord`]s under the same id, in the
/// `confirmations_decided` table.
const DECIDED: &str = "confirmations_decided";

/// What was decided about a confirmation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Approved,
    Denied,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Approved => "approved",
            Decision::Denied => "denied",
        }
    }
}

/// The trace a decided confirmation leaves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct DecidedRecord {
    decision: Decision,
    tenant: String,
    decided_at: Timestamp,
}

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
    /// The id of the call record the held call wrote (`CONFIRMATION_REQUIRED`);
    /// the decision rewrites it. `None` for confirmations stored before it
    /// existed: their approved run gets a record of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_id: Option<String>,
}

impl PendingConfirmation {
    /// The tenant whose call this is.
    pub fn tenant(&self) -> &str {
        self.context.tenant.as_deref().unwrap_or(DEFAULT_TENANT)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfirmationError {
    #[error("no pending confirmation with id '{id}'")]
    NotFound { id: String },
    #[error("confirmation '{id}' expired at {expired_at}")]
    Expired { id: String, expired_at: Timestamp },
    #[error("confirmation '{id}' was already {}", decision.as_str())]
    AlreadyDecided { id: String, decision: Decision },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl PublicError for ConfirmationError {
    fn code(&self) -> ErrorCode {
        match self {
            ConfirmationError::NotFound { .. } => ErrorCode::ConfirmationNotFound,
            ConfirmationError::Expired { .. } => ErrorCode::ConfirmationExpired,
            ConfirmationError::AlreadyDecided { .. } => ErrorCode::ConfirmationAlreadyDecided,
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

/// Where a confirmation stands ([`Confirmations::state`]).
#[derive(Debug, Clone)]
pub enum ConfirmationState {
    /// Waiting for a decision (possibly past its expiry).
    Pending(Box<PendingConfirmation>),
    Decided {
        decision: Decision,
        at: Timestamp,
    },
    /// Expired and dropped, or never known to this tenant.
    Unknown,
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
        record_id: &str,
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
            record_id: Some(record_id.to_string()),
        };
        let value = serde_json::to_value(&pending).expect("confirmations serialize");
        let (id, tenant) = (&pending.confirmation_id, pending.tenant());
        match &pending.context.conversation_id {
            // Erased with its session, pending or decided.
            Some(session) => {
                self.store
                    .put_doc_of_session(NAMESPACE, tenant, session, id, value, true)
                    .await?
            }
            None => {
                self.store
                    .put_doc_of(NAMESPACE, tenant, id, value, true)
                    .await?
            }
        }
        Ok(pending)
    }

    pub async fn get(&self, id: &str) -> Result<PendingConfirmation, ConfirmationError> {
        if id.len() > crate::identity::MAX_ID_BYTES {
            return Err(ConfirmationError::NotFound {
                id: crate::identity::quoted_id(id),
            });
        }
        let value = self
            .store
            .get_doc(NAMESPACE, id)
            .await?
            .ok_or_else(|| ConfirmationError::NotFound { id: id.into() })?;
        serde_json::from_value(value).map_err(|e| ConfirmationError::Store(e.into()))
    }

    /// Decides a pending confirmation of `tenant` once: the one caller that
    /// wins gets the pending call (to run it, or to drop it when denying);
    /// everyone else gets `AlreadyDecided`, `Expired` or `NotFound`.
    /// Another tenant's confirmation is `NotFound`, like a missing one.
    pub async fn decide(
        &self,
        id: &str,
        tenant: &str,
        decision: Decision,
    ) -> Result<PendingConfirmation, ConfirmationError> {
        if id.len() > crate::identity::MAX_ID_BYTES {
            return Err(ConfirmationError::NotFound {
                id: crate::identity::quoted_id(id),
            });
        }
        let pending = match self.get(id).await {
            Ok(p) => p,
            Err(ConfirmationError::NotFound { .. }) => {
                return Err(self.why_not_pending(id, tenant).await);
            }
            Err(e) => return Err(e),
        };
        if pending.tenant() != tenant {
            return Err(ConfirmationError::NotFound { id: id.into() });
        }
        if Timestamp::now() >= pending.expires_at {
            self.store.delete_doc(NAMESPACE, id, true).await?;
            return Err(ConfirmationError::Expired {
                id: id.into(),
                expired_at: pending.expires_at,
            });
        }
        let record = DecidedRecord {
            decision,
            tenant: tenant.to_string(),
            decided_at: Timestamp::now(),
        };
        let record = serde_json::to_value(&record).expect("decisions serialize");
        match self
            .store
            .move_doc(NAMESPACE, id, DECIDED, record, true)
            .await?
        {
            Some(_) => {
                if decision == Decision::Denied {
                    self.record_declined(&pending).await;
                }
                Ok(pending)
            }
            None => Err(self.why_not_pending(id, tenant).await),
        }
    }

    /// Rewrites a denied call's `CONFIRMATION_REQUIRED` record as `TOOL_DECLINED`
    /// (it did not run; counted neither as failed nor per tool). Every
    /// denial passes here: a person's, an interrupt's, an expiry found
    /// on resume. A record that cannot be written leaves the pending one
    /// (logged): the decision itself is already made.
    async fn record_declined(&self, p: &PendingConfirmation) {
        let Some(record_id) = p.record_id.clone() else {
            return;
        };
        let ctx = &p.context;
        let rec = ToolCallRecord {
            guardrails: Vec::new(),
            record_id,
            tool_name: p.tool_name.clone(),
            tool_call_id: p.tool_call_id.clone(),
            params: p.params.clone(),
            output: None,
            is_success: false,
            error: Some(format!("{} was declined; it did not run", p.tool_name)),
            error_type: Some(crate::store::DECLINED.to_string()),
            execution_time_ms: 0,
            attempts: 0,
            caller_id: ctx.caller_id.clone(),
            caller_type: ctx.caller_type.as_str().to_string(),
            conversation_id: ctx.conversation_id.clone(),
            workflow_id: ctx.workflow_id.clone(),
            user_id: ctx.user_id.clone(),
            tenant: ctx.tenant.clone(),
            created_at: Timestamp::now(),
            started_at: None,
            source_id: None,
            turn_id: ctx.turn_id.clone(),
            cached: false,
        };
        if let Err(e) = self
            .store
            .write(vec![WriteOp::RecordToolCall(Box::new(rec))], true)
            .await
        {
            tracing::error!(error = %e, tool = %p.tool_name, "declined call's record not written");
        }
    }

    /// Where confirmation `id` of `tenant` stands, read only (a paused turn
    /// asks this when it resumes).
    pub async fn state(&self, id: &str, tenant: &str) -> Result<ConfirmationState, StoreError> {
        match self.get(id).await {
            Ok(p) if p.tenant() == tenant => return Ok(ConfirmationState::Pending(Box::new(p))),
            Ok(_) => return Ok(ConfirmationState::Unknown),
            Err(ConfirmationError::Store(e)) => return Err(e),
            Err(_) => {}
        }
        let decided = self
            .store
            .get_doc(DECIDED, id)
            .await?
            .and_then(|v| serde_json::from_value::<DecidedRecord>(v).ok());
        Ok(match decided {
            Some(d) if d.tenant == tenant => ConfirmationState::Decided {
                decision: d.decision,
                at: d.decided_at,
            },
            // Expired ones are deleted when found expired.
            _ => ConfirmationState::Unknown,
        })
    }

    /// Why `id` is not pending for `tenant`: decided already, or unknown.
    async fn why_not_pending(&self, id: &str, tenant: &str) -> ConfirmationError {
        let decided = match self.store.get_doc(DECIDED, id).await {
            Ok(d) => d.and_then(|v| serde_json::from_value::<DecidedRecord>(v).ok()),
            Err(e) => return e.into(),
        };
        match decided {
            Some(d) if d.tenant == tenant => ConfirmationError::AlreadyDecided {
                id: id.into(),
                decision: d.decision,
            },
            _ => ConfirmationError::NotFound { id: id.into() },
        }
    }

    /// A page of `tenant`'s confirmations not yet decided (expired ones
    /// included, marked by their time), oldest first, after `cursor`. Reads
    /// only the tenant's index range.
    pub async fn list_of(
        &self,
        tenant: &str,
        cursor: Option<String>,
        limit: usize,
    ) -> Result<Page<PendingConfirmation>, StoreError> {
        let page = self
            .store
            .docs_of(NAMESPACE, tenant, cursor, limit, false)
            .await?;
        Ok(Page {
            items: page
                .items
                .into_iter()
                .filter_map(|(_, v)| serde_json::from_value(v).ok())
                .collect(),
            next: page.next,
        })
    }

    /// Indexes by tenant the pending confirmations stored before that index
    /// existed; once (at startup), later calls do nothing.
    pub async fn index_existing(&self) -> Result<Option<u64>, StoreError> {
        self.store.index_docs(NAMESPACE, pending_tenant).await
    }

    /// Every confirmation not yet decided, of every tenant (the CLI's view).
    pub async fn list(&self) -> Result<Vec<PendingConfirmation>, StoreError> {
        let docs = self.store.list_docs(NAMESPACE, "").await?;
        Ok(docs
            .into_iter()
            .filter_map(|(_, v)| serde_json::from_value(v).ok())
            .collect())
    }
}

/// The tenant of a stored pending confirmation (for [`crate::store::DocReads::index_docs`]).
fn pending_tenant(doc: &Value) -> Option<String> {
    serde_json::from_value::<PendingConfirmation>(doc.clone())
        .ok()
        .map(|p| p.tenant().to_string())
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
            let p = c
                .create("order", json!({"q": 1}), None, ctx, "rec_1")
                .await
                .unwrap();
            assert!(p.summary.contains("order"));
            p.confirmation_id
        };
        let c = Confirmations::new(Store::open(dir.path()).unwrap(), Duration::from_secs(600));
        assert_eq!(c.list().await.unwrap().len(), 1);
        let p = c
            .decide(&id, DEFAULT_TENANT, Decision::Approved)
            .await
            .unwrap();
        assert_eq!(p.params, json!({"q": 1}));
        assert!(matches!(
            c.decide(&id, DEFAULT_TENANT, Decision::Denied).await,
            Err(ConfirmationError::AlreadyDecided {
                decision: Decision::Approved,
                ..
            })
        ));
        assert!(c.list().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn an_expired_confirmation_cannot_be_taken() {
        let dir = tempfile::tempdir().unwrap();
        let c = Confirmations::new(Store::open(dir.path()).unwrap(), Duration::ZERO);
        let ctx = ExecutionContext::new(CallerType::Direct, "u");
        let p = c
            .create("order", json!({}), None, ctx, "rec_1")
            .await
            .unwrap();
        assert!(matches!(
            c.decide(&p.confirmation_id, DEFAULT_TENANT, Decision::Approved)
                .await,
            Err(ConfirmationError::Expired { .. })
        ));
    }

    #[tokio::test]
    async fn of_racing_decisions_exactly_one_wins() {
        let dir = tempfile::tempdir().unwrap();
        let c = Confirmations::new(Store::open(dir.path()).unwrap(), Duration::from_secs(600));
        for _ in 0..20 {
            let ctx = ExecutionContext::new(CallerType::Direct, "u");
            let p = c
                .create("order", json!({}), None, ctx, "rec_1")
                .await
                .unwrap();
            let racers = (0..8).map(|i| {
                let (c, id) = (c.clone(), p.confirmation_id.clone());
                let decision = if i % 2 == 0 {
                    Decision::Approved
                } else {
                    Decision::Denied
                };
                tokio::spawn(async move { c.decide(&id, DEFAULT_TENANT, decision).await })
            });
            let results = futures::future::join_all(racers).await;
            let won = results.iter().filter(|r| matches!(r, Ok(Ok(_)))).count();
            let lost = results
                .iter()
                .filter(|r| matches!(r, Ok(Err(ConfirmationError::AlreadyDecided { .. }))))
                .count();
            assert_eq!((won, lost), (1, 7), "{results:?}");
        }
    }

    #[tokio::test]
    async fn another_tenants_confirmation_is_not_found_pending_or_decided() {
        let dir = tempfile::tempdir().unwrap();
        let c = Confirmations::new(Store::open(dir.path()).unwrap(), Duration::from_secs(600));
        let mut ctx = ExecutionContext::new(CallerType::Direct, "u");
        ctx.tenant = Some("acme".into());
        let p = c
            .create("order", json!({}), None, ctx, "rec_1")
            .await
            .unwrap();
        let id = &p.confirmation_id;
        assert!(matches!(
            c.decide(id, "globex", Decision::Approved).await,
            Err(ConfirmationError::NotFound { .. })
        ));
        c.decide(id, "acme", Decision::Denied).await.unwrap();
        assert!(matches!(
            c.decide(id, "globex", Decision::Approved).await,
            Err(ConfirmationError::NotFound { .. })
        ));
    }
}
