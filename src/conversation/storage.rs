//! A tenant's share of the store: how fast it may send message content,
//! and how much it may keep.
//!
//! Sessions::start_turn / record_message ──StorageGate::admit(tenant, bytes, quota)──▶ ok
//!     ├─ over its write share  ──▶ 429 RATE_LIMITED, Retry-After (no store read)
//!     └─ over its storage quota ──▶ 413 STORAGE_QUOTA_EXCEEDED (one read of the tenant's count)
//!
//! Why: one store writer commits every tenant's messages, and every
//! stored byte is read back into later model requests, serialised and
//! parsed again; a tenant sending 256 KiB messages as fast as it could
//! made other tenants' turns wait on its commits and its CPU (issue #29
//! item 8: their p50 went from a few ms to over a second). So each tenant
//! gets:
//! - **a write share**: message content bytes per second, a GCRA bucket
//!   per tenant (`[tenants] write_kib_per_s`, default 1024 KiB/s, a burst
//!   of four seconds' worth and never less than one largest message).
//!   Checked first, in memory, before anything is read: a refused flood
//!   costs the store nothing. Per node, like the API's request rate: in
//!   cluster mode a tenant's share is this times the nodes its sessions
//!   land on.
//! - **a storage quota**: bytes of stored messages (`[tenants]
//!   max_storage_mb`, default 1024 MiB; a tenant config's `max_storage_mb`
//!   overrides it for that tenant; 0 means unlimited). A tenant at or over
//!   it gets no new message stored until it erases sessions (or the
//!   retention sweep does, or an admin raises its quota); what is already
//!   stored stays readable. The count is the store's (`store::storage`),
//!   exact across crashes and shared by every node. The check is before
//!   the message is stored, so a tenant may go over by what its turns in
//!   flight store (their replies and tool results): bounded by its write
//!   share and its turns, not by anything it sends.
//!
//! Decided: 413 for a full quota (the request is refused for its size
//! against what is left, and waiting does not help), 429 with
//! `Retry-After` for the write share (waiting does).

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota};

use super::sessions::MAX_CONTENT_BYTES;
use crate::store::Store;

/// Default `[tenants] write_kib_per_s`.
pub const DEFAULT_WRITE_KIB_PER_S: u32 = 1024;
/// Default `[tenants] max_storage_mb`.
pub const DEFAULT_MAX_STORAGE_MB: u64 = 1024;

/// What `[tenants]` sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StorageLimits {
    /// Message content a tenant may send per second, in KiB (`None`: no limit).
    pub write_kib_per_s: Option<NonZeroU32>,
    /// Bytes of stored messages a tenant may keep unless its config says
    /// otherwise (`None`: no limit).
    pub max_storage_mb: Option<u64>,
}

impl Default for StorageLimits {
    fn default() -> Self {
        StorageLimits {
            write_kib_per_s: NonZeroU32::new(DEFAULT_WRITE_KIB_PER_S),
            max_storage_mb: Some(DEFAULT_MAX_STORAGE_MB),
        }
    }
}

/// A tenant sent content faster than its write share.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "tenant '{tenant}' sends message content faster than its share of the store \
     ({kib_per_s} KiB/s, `[tenants] write_kib_per_s`); retry after {} s",
    self.retry_after.as_secs_f64().ceil()
)]
pub struct WriteShareExceeded {
    pub tenant: String,
    pub kib_per_s: u32,
    pub retry_after: Duration,
}

/// A tenant stores as much as its quota allows.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "tenant '{tenant}' stores {} MiB of messages and its quota is {limit_mb} MiB: erase sessions \
     (DELETE /v1/sessions/{{id}}) or have an admin raise `max_storage_mb` \
     (POST /v1/tenants/{tenant}/config)",
    self.used_bytes / (1024 * 1024)
)]
pub struct StorageQuotaExceeded {
    pub tenant: String,
    pub used_bytes: u64,
    pub limit_mb: u64,
}

/// Why a message was not stored.
#[derive(Debug, thiserror::Error)]
pub enum StorageRefusal {
    #[error(transparent)]
    Share(#[from] WriteShareExceeded),
    #[error(transparent)]
    Quota(#[from] StorageQuotaExceeded),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// The write shares of every tenant seen, and the quota rule.
pub struct StorageGate {
    limits: StorageLimits,
    shares: Option<DefaultKeyedRateLimiter<String>>,
}

impl StorageGate {
    pub fn new(limits: StorageLimits) -> Self {
        let shares = limits.write_kib_per_s.map(|rate| {
            let largest = (MAX_CONTENT_BYTES / 1024) as u32;
            let burst = rate.saturating_mul(NonZeroU32::new(4).expect("4 > 0"));
            let burst = burst.max(NonZeroU32::new(largest).expect("256 > 0"));
            governor::RateLimiter::dashmap(Quota::per_second(rate).allow_burst(burst))
        });
        StorageGate { limits, shares }
    }

    /// Takes `bytes` of `tenant`'s write share, then checks its stored
    /// bytes against `quota_mb` (the tenant config's, else `[tenants]`'s).
    pub async fn admit(
        &self,
        store: &Store,
        tenant: &str,
        bytes: usize,
        quota_mb: Option<u64>,
    ) -> Result<(), StorageRefusal> {
        self.take_share(tenant, bytes)?;
        let limit_mb = match quota_mb.or(self.limits.max_storage_mb) {
            None | Some(0) => return Ok(()),
            Some(mb) => mb,
        };
        let used_bytes = store.stored_bytes(tenant).await?;
        if used_bytes >= limit_mb.saturating_mul(1024 * 1024) {
            return Err(StorageQuotaExceeded {
                tenant: tenant.to_string(),
                used_bytes,
                limit_mb,
            }
            .into());
        }
        Ok(())
    }

    fn take_share(&self, tenant: &str, bytes: usize) -> Result<(), WriteShareExceeded> {
        let (Some(shares), Some(rate)) = (&self.shares, self.limits.write_kib_per_s) else {
            return Ok(());
        };
        let kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX);
        let Some(kib) = NonZeroU32::new(kib) else {
            return Ok(());
        };
        let refused = |retry_after| WriteShareExceeded {
            tenant: tenant.to_string(),
            kib_per_s: rate.get(),
            retry_after,
        };
        match shares.check_key_n(&tenant.to_string(), kib) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => Err(refused(not_until.wait_time_from(shares.clock().now()))),
            // More than the burst: never the case for one message (the
            // burst holds the largest), kept for a caller that asks more.
            Err(_) => Err(refused(Duration::from_secs(1))),
        }
    }

    /// Forgets tenants whose share is whole again (call periodically).
    pub fn retain_recent(&self) {
        if let Some(shares) = &self.shares {
            shares.retain_recent();
            shares.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_admits_its_burst_then_refuses_with_a_wait_and_other_tenants_are_untouched() {
        let gate = StorageGate::new(StorageLimits {
            write_kib_per_s: NonZeroU32::new(256),
            max_storage_mb: None,
        });
        // Burst: four seconds' worth, 1024 KiB: four largest messages.
        for _ in 0..4 {
            gate.take_share("loud", MAX_CONTENT_BYTES).unwrap();
        }
        let refused = gate.take_share("loud", MAX_CONTENT_BYTES).unwrap_err();
        assert!(
            refused.retry_after > Duration::from_millis(500),
            "{refused:?}"
        );
        assert!(refused.retry_after <= Duration::from_secs(1), "{refused:?}");
        gate.take_share("quiet", MAX_CONTENT_BYTES).unwrap();
        gate.take_share("loud", 0).unwrap();
    }

    #[test]
    fn a_share_smaller_than_the_largest_message_still_admits_one() {
        let gate = StorageGate::new(StorageLimits {
            write_kib_per_s: NonZeroU32::new(16),
            max_storage_mb: None,
        });
        gate.take_share("t", MAX_CONTENT_BYTES).unwrap();
        assert!(gate.take_share("t", 1).is_err());
    }

    #[tokio::test]
    async fn the_quota_counts_what_the_store_holds_and_a_tenant_config_overrides_it() {
        use crate::model::ChatMessage;
        use crate::store::{StoredMessage, WriteOp};
        let store = Store::open_in_memory().unwrap();
        let gate = StorageGate::new(StorageLimits {
            write_kib_per_s: None,
            max_storage_mb: Some(1),
        });
        let session = crate::store::Session {
            id: "s1".into(),
            tenant: "t".into(),
            agent: "a".into(),
            user_id: None,
            plan: Default::default(),
            metadata: serde_json::Value::Null,
            created_at: jiff::Timestamp::now(),
        };
        store
            .write(vec![WriteOp::PutSession(session)], false)
            .await
            .unwrap();
        gate.admit(&store, "t", 10, None).await.unwrap();
        let big = StoredMessage {
            seq: 1,
            message: ChatMessage::user("x".repeat(1024 * 1024)),
            created_at: jiff::Timestamp::now(),
            rolled_back: false,
        };
        store
            .write(
                vec![WriteOp::AppendMessages {
                    session_id: "s1".into(),
                    messages: vec![big],
                }],
                false,
            )
            .await
            .unwrap();
        let Err(StorageRefusal::Quota(q)) = gate.admit(&store, "t", 10, None).await else {
            panic!("a tenant over 1 MiB is refused");
        };
        assert!(q.used_bytes > 1024 * 1024, "{q:?}");
        assert!(q.to_string().contains("max_storage_mb"), "{q}");
        gate.admit(&store, "t", 10, Some(2)).await.unwrap();
        gate.admit(&store, "t", 10, Some(0)).await.unwrap();
        gate.admit(&store, "other", 10, None).await.unwrap();
        store.erase_session("s1").await.unwrap();
        gate.admit(&store, "t", 10, None).await.unwrap();
    }
}
