//! A tenant's share of the store: how fast it may make cadre store bytes,
//! and how much it may keep.
//!
//! Sessions::start_turn / record_message, POST /v1/tools/{name}/invoke, MCP tools/call
//!     ──StorageGate::admit(tenant, bytes, quota)──▶ ok
//!         ├─ its write share is spent ──▶ 429 RATE_LIMITED, Retry-After (no store read)
//!         └─ at its storage quota     ──▶ 413 STORAGE_QUOTA_EXCEEDED (one read of its count)
//! Conversation (each commit) ──StorageGate::charge(tenant, bytes of the replies and tool results it stores)
//! http::storage_room (before the body is read) ──StorageGate::precheck(tenant, Content-Length, quota)──▶ 429 / 413 unread
//!
//! Why: one store writer commits every tenant's messages, and every
//! stored byte is read back into later model requests, serialised and
//! parsed again; a tenant sending 256 KiB messages as fast as it could
//! made other tenants' turns wait on its commits and its CPU (issue #29
//! item 8: their p50 went from a few ms to over a second). So each tenant
//! gets:
//! - **a write share**: bytes per second it may make the store write, per
//!   node (`[tenants] write_kib_per_s`, default 1024 KiB/s; a burst of four
//!   seconds' worth, never less than one largest message). A bucket per
//!   tenant that may go into debt: a request is admitted while the bucket
//!   is not empty and pays, up front, what it will certainly store (a
//!   message's content as the store writes it, JSON-escaped: a control
//!   character is six bytes there; a tool call's arguments); what a turn
//!   stores beyond that (the model's replies, tool results) is charged when
//!   it is committed, and the debt is waited off (`Retry-After`) before the
//!   next request. So the share holds for what is written, whatever the
//!   content makes the model or the tools write back. Checked in memory,
//!   before anything is read: a refused flood costs the store nothing.
//!   Per node, like the API's request rate.
//! - **a storage quota**: bytes of stored messages and of call records
//!   made outside a session (`store::storage` says what counts; `[tenants]
//!   max_storage_mb`, default 1024 MiB; a tenant config's `max_storage_mb`
//!   overrides it for that tenant; 0 means unlimited). A tenant at or over
//!   it gets nothing new stored (no message, no direct tool call) until it
//!   erases sessions (or the retention sweep does, or an admin raises its
//!   quota); what is already stored stays readable. The count is the
//!   store's (`store::storage`), exact across crashes and shared by every
//!   node. It is checked before a request runs, so requests admitted at
//!   once can together go over it by what they store: at most the write
//!   share's burst plus what their turns write back.
//!
//! Decided: 413 for a full quota (the request is refused for its size
//! against what is left, and waiting does not help; it is not stored as an
//! `Idempotency-Key`'s answer, so a retry after the quota is raised runs),
//! 429 with `Retry-After` for the write share (waiting does). A bucket of
//! our own rather than governor's GCRA: governor has no debt, and the
//! share must charge what is known only after the model answered.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::store::Store;

/// Most bytes one message's content may take, whichever transport brings
/// it (HTTP, SSE, the visitor WebSocket, MCP's `agent_*` tools): checked
/// where every turn starts (`Sessions::start_turn`). Defined here, below
/// the sessions, because the write share's burst is sized to admit one
/// such message.
pub const MAX_CONTENT_BYTES: usize = 256 * 1024;

/// Declared bodies (`Content-Length`) from this size on are checked
/// against what the tenant's quota has left before they are read
/// ([`StorageGate::precheck`]); smaller ones cost less to read than the
/// store read the check takes.
pub const PRECHECK_FROM_BYTES: u64 = 64 * 1024;

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
    "tenant '{tenant}' stores {} MiB of messages and call records and its quota is {limit_mb} MiB: \
     erase sessions (DELETE /v1/sessions/{{id}}; an admin's DELETE /v1/tenants/{tenant}/sessions \
     also erases the records of direct tool calls) or have an admin raise `max_storage_mb` \
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

/// Bytes `text` takes as a JSON string's body, as serde_json writes it
/// (`"` and `\\` and the short escapes take two bytes, other control
/// characters six).
pub fn escaped_len(text: &str) -> usize {
    text.len()
        + text
            .bytes()
            .map(|b| match b {
                b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 1,
                0..=0x1f => 5,
                _ => 0,
            })
            .sum::<usize>()
}

/// One tenant's bucket: bytes it may still write now (below zero: its
/// debt), as of `at`.
struct Bucket {
    balance: f64,
    at: Instant,
}

/// The write shares of every tenant seen, and the quota rule.
pub struct StorageGate {
    limits: StorageLimits,
    /// Bytes per second and the bucket's size, when there is a share.
    rate: Option<(f64, f64)>,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl StorageGate {
    pub fn new(limits: StorageLimits) -> Self {
        let rate = limits.write_kib_per_s.map(|kib| {
            let per_s = f64::from(kib.get()) * 1024.0;
            (per_s, (per_s * 4.0).max(MAX_CONTENT_BYTES as f64))
        });
        StorageGate {
            limits,
            rate,
            buckets: Mutex::new(HashMap::new()),
        }
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

    /// Before a request's body is read: the refusal [`Self::admit`] would
    /// give a body of `declared` bytes (its `Content-Length`), when that
    /// length alone decides it. Takes nothing from the share. Refused:
    /// - the share's bucket is empty now (any body would be refused: the
    ///   same 429);
    /// - the tenant has a quota and `declared` is more than it has left
    ///   (413, the quota's refusal), for bodies of at least
    ///   [`PRECHECK_FROM_BYTES`] (smaller ones are read and checked as
    ///   before: one store read fewer per request).
    ///
    /// A body larger than the share's burst is not refused here: the share
    /// admits one request of any size while its bucket is not empty (the
    /// debt is waited off after), so a 429 for its size would never pass.
    pub async fn precheck(
        &self,
        store: &Store,
        tenant: &str,
        declared: u64,
        quota_mb: Option<u64>,
    ) -> Result<(), StorageRefusal> {
        self.share_left(tenant)?;
        if declared < PRECHECK_FROM_BYTES {
            return Ok(());
        }
        let limit_mb = match quota_mb.or(self.limits.max_storage_mb) {
            None | Some(0) => return Ok(()),
            Some(mb) => mb,
        };
        let used_bytes = store.stored_bytes(tenant).await?;
        if used_bytes.saturating_add(declared) > limit_mb.saturating_mul(1024 * 1024) {
            return Err(StorageQuotaExceeded {
                tenant: tenant.to_string(),
                used_bytes,
                limit_mb,
            }
            .into());
        }
        Ok(())
    }

    /// Charges `bytes` the store wrote for `tenant` beyond what was paid
    /// at admission: its bucket may go into debt, which its next request
    /// waits off.
    pub fn charge(&self, tenant: &str, bytes: usize) {
        if bytes == 0 {
            return;
        }
        if let Some((per_s, burst)) = self.rate {
            let mut buckets = self.buckets.lock().expect("storage buckets");
            let bucket = refilled(&mut buckets, tenant, per_s, burst);
            bucket.balance -= bytes as f64;
        }
    }

    fn take_share(&self, tenant: &str, bytes: usize) -> Result<(), WriteShareExceeded> {
        self.with_share(tenant, bytes as f64)
    }

    /// Whether `tenant`'s bucket is not empty, taking nothing.
    fn share_left(&self, tenant: &str) -> Result<(), WriteShareExceeded> {
        self.with_share(tenant, 0.0)
    }

    /// Takes `bytes` of `tenant`'s share while its bucket is not empty.
    fn with_share(&self, tenant: &str, bytes: f64) -> Result<(), WriteShareExceeded> {
        let (Some((per_s, burst)), Some(kib)) = (self.rate, self.limits.write_kib_per_s) else {
            return Ok(());
        };
        let mut buckets = self.buckets.lock().expect("storage buckets");
        let bucket = refilled(&mut buckets, tenant, per_s, burst);
        if bucket.balance <= 0.0 {
            // The debt, and a first byte, at the share's rate.
            let wait = Duration::from_secs_f64((1.0 - bucket.balance) / per_s);
            return Err(WriteShareExceeded {
                tenant: tenant.to_string(),
                kib_per_s: kib.get(),
                retry_after: wait,
            });
        }
        bucket.balance -= bytes;
        Ok(())
    }

    /// Forgets tenants whose bucket is full again (call periodically):
    /// the map holds only tenants that wrote lately.
    pub fn retain_recent(&self) {
        if let Some((per_s, burst)) = self.rate {
            let now = Instant::now();
            let mut buckets = self.buckets.lock().expect("storage buckets");
            buckets
                .retain(|_, b| b.balance + now.duration_since(b.at).as_secs_f64() * per_s < burst);
            buckets.shrink_to_fit();
        }
    }
}

/// `tenant`'s bucket, refilled up to now (a new one is full).
fn refilled<'a>(
    buckets: &'a mut HashMap<String, Bucket>,
    tenant: &str,
    per_s: f64,
    burst: f64,
) -> &'a mut Bucket {
    let now = Instant::now();
    let bucket = buckets.entry(tenant.to_string()).or_insert(Bucket {
        balance: burst,
        at: now,
    });
    bucket.balance =
        (bucket.balance + now.duration_since(bucket.at).as_secs_f64() * per_s).min(burst);
    bucket.at = now;
    bucket
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_admits_while_not_empty_then_refuses_until_its_debt_is_waited_off() {
        let gate = StorageGate::new(StorageLimits {
            write_kib_per_s: NonZeroU32::new(256),
            max_storage_mb: None,
        });
        // The bucket: four seconds' worth, 1024 KiB, four largest messages.
        for _ in 0..4 {
            gate.take_share("loud", MAX_CONTENT_BYTES).unwrap();
        }
        // Bytes a turn wrote back go on the bill: two seconds of debt.
        gate.charge("loud", 512 * 1024);
        let refused = gate.take_share("loud", 1).unwrap_err();
        assert!(
            refused.retry_after > Duration::from_millis(1900),
            "{refused:?}"
        );
        assert!(refused.retry_after <= Duration::from_secs(2), "{refused:?}");
        // Other tenants have buckets of their own.
        gate.take_share("quiet", MAX_CONTENT_BYTES).unwrap();
    }

    #[test]
    fn a_share_smaller_than_the_largest_message_still_admits_one() {
        let gate = StorageGate::new(StorageLimits {
            write_kib_per_s: NonZeroU32::new(16),
            max_storage_mb: None,
        });
        gate.take_share("t", MAX_CONTENT_BYTES).unwrap();
        gate.charge("t", 1024);
        assert!(gate.take_share("t", 1).is_err());
    }

    #[tokio::test]
    async fn a_precheck_refuses_on_the_declared_length_and_takes_nothing() {
        let store = Store::open_in_memory().unwrap();
        let gate = StorageGate::new(StorageLimits {
            write_kib_per_s: NonZeroU32::new(64),
            max_storage_mb: Some(1),
        });
        let mib = 1024 * 1024;
        // Over what the quota has left: refused; a small body is read first.
        let Err(StorageRefusal::Quota(_)) = gate.precheck(&store, "t", mib + 1, None).await else {
            panic!("a body over the quota is refused unread");
        };
        gate.precheck(&store, "t", mib, None).await.unwrap();
        gate.precheck(&store, "t", mib + 1, Some(2)).await.unwrap();
        gate.precheck(&store, "t", mib + 1, Some(0)).await.unwrap();
        // Over the burst (256 KiB) is no refusal: the share admits one
        // request of any size while its bucket is not empty.
        gate.precheck(&store, "t", 900 * 1024, None).await.unwrap();
        // Nothing was taken: all but 16 KiB of the burst spent, the
        // bucket is not empty yet; then in debt, it refuses any body.
        gate.take_share("t", MAX_CONTENT_BYTES - 16 * 1024).unwrap();
        gate.precheck(&store, "t", 1, None).await.unwrap();
        gate.take_share("t", 64 * 1024).unwrap();
        let Err(StorageRefusal::Share(_)) = gate.precheck(&store, "t", 1, None).await else {
            panic!("an empty bucket refuses any body");
        };
    }

    #[test]
    fn the_escaped_length_is_what_serde_json_writes() {
        for text in [
            "plain",
            "\"quoted\" \\ back",
            "tab\tline\nfeed\u{1}\u{1f}\u{8}\u{c}",
            "é ü 世界",
        ] {
            let written = serde_json::to_string(text).unwrap().len() - 2;
            assert_eq!(escaped_len(text), written, "{text:?}");
        }
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
            forked_from: None,
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
