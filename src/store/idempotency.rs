//! Idempotency records: the stored outcome of each request sent with an
//! `Idempotency-Key`, per tenant.
//!
//! http::idempotency ──first run ends──▶ put_idempotency (durable) ──▶ writer ──▶ IDEMPOTENCY
//! http::idempotency ──a retry──▶ idempotency_record (read transaction) ──▶ replay or 422
//! sweep (hourly) ──expired_idempotency (read)──▶ WriteOp::DeleteIdempotency (batches) ──▶ writer
//!
//! A record is written once, when the request that ran first has its
//! answer, with an fsync: a client that got the answer and retries after a
//! crash is answered from the file. The sweep finds expired rows in a read
//! transaction (never holding the writer while it scans) and deletes them
//! in batches of [`SWEEP_BATCH`]; the writer deletes a row only if it is
//! still older than the cutoff. Rows are not erased with a tenant's
//! sessions: they are small and expire.
//!
//! Cluster mode ([`IdempotencyClaim`]): a request running on one node is
//! invisible to the others' in-memory maps, so the first request with a
//! key *claims* it in the shared store before it runs: a row marked
//! running (`running_node`) that its answer replaces, or that is deleted
//! when the answer is not stored. Another node's claim of the same key
//! finds it running (the HTTP layer answers 409 `IDEMPOTENCY_KEY_IN_USE`);
//! the mark is taken over when its node is this one (a crash before the
//! answer, then a restart), its node's heartbeat is stale (it died), or
//! it is older than [`RUNNING_LEASE`] (a release that never happened).
//! On redb there is one process and its in-memory map suffices: a claim
//! only reads.
//! Owns: the record's shape. Does not: decide what is stored (the HTTP
//! layer does).

use jiff::Timestamp;
use redb::{ReadableDatabase, ReadableTable, Table};

use super::backend::{IdempotencyRecords, Writes};
pub use super::rows::{IdempotencyClaim, IdempotencyRecord};
use super::tables::IDEMPOTENCY;
use super::{RedbStore, StoreError, WriteOp};

/// Rows one sweep transaction deletes at most.
pub const SWEEP_BATCH: usize = 1_000;

/// Age past which another node takes over a key still marked running.
pub const RUNNING_LEASE: std::time::Duration = std::time::Duration::from_secs(15 * 60);

fn millis(at: Timestamp) -> u64 {
    u64::try_from(at.as_millisecond()).unwrap_or(0)
}

#[async_trait::async_trait]
impl IdempotencyRecords for RedbStore {
    /// The stored outcome of `key` of `tenant`, if any.
    async fn idempotency_record(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let (tenant, key) = (tenant.to_string(), key.to_string());
        self.read(move |db| {
            let table = db.begin_read()?.open_table(IDEMPOTENCY)?;
            let Some(row) = table.get((tenant.as_str(), key.as_str()))? else {
                return Ok(None);
            };
            let (at, json) = row.value();
            let mut record: IdempotencyRecord = crate::store::codec::json(json)?;
            record.stored_at = Timestamp::from_millisecond(i64::try_from(at).unwrap_or(i64::MAX))
                .unwrap_or(Timestamp::UNIX_EPOCH);
            Ok(Some(record))
        })
        .await
    }

    /// One process: its in-memory map already holds the running requests,
    /// so this only reads what is stored.
    async fn claim_idempotency(
        &self,
        tenant: &str,
        key: &str,
        _fingerprint: &str,
    ) -> Result<IdempotencyClaim, StoreError> {
        Ok(match self.idempotency_record(tenant, key).await? {
            Some(record) => IdempotencyClaim::Done(record),
            None => IdempotencyClaim::Mine,
        })
    }

    /// Nothing to give up: the claim marked nothing in the file.
    async fn release_idempotency(&self, _tenant: &str, _key: &str) -> Result<(), StoreError> {
        Ok(())
    }

    /// Deletes every record stored before `before`; returns how many went.
    async fn sweep_idempotency(&self, before: Timestamp) -> Result<u64, StoreError> {
        let before_ms = millis(before);
        let mut removed = 0u64;
        loop {
            let keys = self
                .read(move |db| {
                    let table = db.begin_read()?.open_table(IDEMPOTENCY)?;
                    let mut keys = Vec::new();
                    for row in table.iter()? {
                        let (k, v) = row?;
                        if v.value().0 < before_ms {
                            let (tenant, key) = k.value();
                            keys.push((tenant.to_string(), key.to_string()));
                            if keys.len() == SWEEP_BATCH {
                                break;
                            }
                        }
                    }
                    Ok(keys)
                })
                .await?;
            let full = keys.len() == SWEEP_BATCH;
            removed += keys.len() as u64;
            if !keys.is_empty() {
                let op = WriteOp::DeleteIdempotency { keys, before_ms };
                self.write(vec![op], false).await?;
            }
            if !full {
                return Ok(removed);
            }
        }
    }
}

/// The writer's part: applies an idempotency op inside its transaction.
pub(super) fn apply(
    table: &mut Table<'_, (&'static str, &'static str), (u64, &'static [u8])>,
    op: &WriteOp,
) -> Result<(), StoreError> {
    match op {
        WriteOp::PutIdempotency {
            tenant,
            key,
            stored_at_ms,
            record,
        } => {
            table.insert(
                (tenant.as_str(), key.as_str()),
                (*stored_at_ms, record.as_slice()),
            )?;
        }
        WriteOp::DeleteIdempotency { keys, before_ms } => {
            for (tenant, key) in keys {
                let expired = table
                    .get((tenant.as_str(), key.as_str()))?
                    .is_some_and(|row| row.value().0 < *before_ms);
                if expired {
                    table.remove((tenant.as_str(), key.as_str()))?;
                }
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    fn record(at: Timestamp, body: &str) -> IdempotencyRecord {
        IdempotencyRecord {
            fingerprint: "f".into(),
            status: 201,
            content_type: Some("application/json".into()),
            body: body.into(),
            stored_at: at,
            running_node: None,
        }
    }

    #[tokio::test]
    async fn records_are_per_tenant_and_the_sweep_takes_only_the_old_ones() {
        let store = Store::open_in_memory().unwrap();
        let now = Timestamp::now();
        let old = now - jiff::SignedDuration::from_hours(25);
        store
            .put_idempotency("acme", "k", &record(now, "new"))
            .await
            .unwrap();
        store
            .put_idempotency("globex", "k", &record(old, "old"))
            .await
            .unwrap();
        let got = store
            .idempotency_record("acme", "k")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got.body, "new");
        assert_eq!(got.stored_at.as_millisecond(), now.as_millisecond());
        assert!(
            store
                .idempotency_record("other", "k")
                .await
                .unwrap()
                .is_none()
        );

        let cutoff = now - jiff::SignedDuration::from_hours(24);
        assert_eq!(store.sweep_idempotency(cutoff).await.unwrap(), 1);
        assert!(
            store
                .idempotency_record("globex", "k")
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            store
                .idempotency_record("acme", "k")
                .await
                .unwrap()
                .is_some()
        );
    }

    #[tokio::test]
    async fn the_sweep_goes_through_more_than_one_batch() {
        let store = Store::open_in_memory().unwrap();
        let old = Timestamp::now() - jiff::SignedDuration::from_hours(48);
        let n = SWEEP_BATCH + 5;
        let ops = (0..n)
            .map(|i| WriteOp::PutIdempotency {
                tenant: "t".into(),
                key: format!("k{i}"),
                stored_at_ms: millis(old),
                record: serde_json::to_vec(&record(old, "x")).unwrap(),
            })
            .collect();
        store.write(ops, false).await.unwrap();
        let removed = store.sweep_idempotency(Timestamp::now()).await.unwrap();
        assert_eq!(removed, n as u64);
        assert!(store.idempotency_record("t", "k0").await.unwrap().is_none());
    }
}
