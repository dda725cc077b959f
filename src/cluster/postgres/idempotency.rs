//! Idempotency keys across nodes: the running mark of a keyed request.
//!
//! http::idempotency ──claim_idempotency──▶ one upsert: the row is ours (marked running) or it is not
//!                                           └─ not ours ──▶ read it: an answer (replay) or another node's mark
//! answer stored ──put_idempotency (writer)──▶ replaces the mark
//! no answer to store / request dropped ──release_idempotency──▶ deletes our mark
//!
//! The mark is an [`IdempotencyRecord`] with `running_node` set, in the
//! same row the answer later takes, so the sweep and the primary key work
//! as for answers. A claim is one `INSERT … ON CONFLICT DO UPDATE … WHERE`:
//! it replaces only a mark (never an answer) that is this node's (an
//! earlier process of this node died before answering), whose node's
//! heartbeat is stale by the database's clock, or that is older than
//! [`RUNNING_LEASE`]. Marks are written on a pooled connection, not
//! through the writer: a claim must know at once whether it won, and it
//! does not belong to any session's fenced batch.

use jiff::Timestamp;

use super::PgStore;
use super::reads::{n, seq, sql};
use crate::store::StoreError;
use crate::store::WriteOp;
use crate::store::backend::{IdempotencyRecords, Writes};
use crate::store::idempotency::{IdempotencyClaim, IdempotencyRecord, RUNNING_LEASE, SWEEP_BATCH};

/// The mark's `running_node`, read from the stored JSON bytes.
const MARK: &str = "(convert_from(idempotency.record, 'UTF8')::json ->> 'running_node')";

#[async_trait::async_trait]
impl IdempotencyRecords for PgStore {
    async fn claim_idempotency(
        &self,
        tenant: &str,
        key: &str,
        fingerprint: &str,
    ) -> Result<IdempotencyClaim, StoreError> {
        let (tenant, key) = (tenant.to_string(), key.to_string());
        let fingerprint_owned = fingerprint.to_string();
        let now = Timestamp::now();
        let mark = IdempotencyRecord {
            fingerprint: fingerprint.to_string(),
            status: 0,
            content_type: None,
            body: String::new(),
            stored_at: now,
            running_node: Some(self.shared.node.id.clone()),
        };
        let bytes = serde_json::to_vec(&mark)?;
        let now_ms = now.as_millisecond();
        let lease_cutoff = now_ms - RUNNING_LEASE.as_millis() as i64;
        let stale = self.shared.node.stale_after.as_secs_f64();
        self.run(move |c, shared| async move {
            let me = &shared.node.id;
            let claim = c
                .prepare_cached(&format!(
                    "INSERT INTO idempotency (tenant, key, stored_at_ms, record)
                     VALUES ($1, $2, $3, $4)
                     ON CONFLICT (tenant, key) DO UPDATE
                     SET stored_at_ms = EXCLUDED.stored_at_ms, record = EXCLUDED.record
                     WHERE {MARK} IS NOT NULL
                       AND ({MARK} = $5
                            OR idempotency.stored_at_ms < $6
                            OR NOT EXISTS (SELECT 1 FROM nodes n WHERE n.id = {MARK}
                                           AND n.heartbeat_at > now() - make_interval(secs => $7)))
                     RETURNING 1"
                ))
                .await?;
            let read = c
                .prepare_cached(
                    "SELECT stored_at_ms, record FROM idempotency WHERE tenant = $1 AND key = $2",
                )
                .await?;
            // The row may go (a release, the sweep) between the two
            // statements: look again.
            for _ in 0..3 {
                let won = c
                    .query_opt(
                        &claim,
                        &[&tenant, &key, &now_ms, &bytes, me, &lease_cutoff, &stale],
                    )
                    .await?;
                if won.is_some() {
                    return Ok(IdempotencyClaim::Mine);
                }
                let Some(row) = c.query_opt(&read, &[&tenant, &key]).await? else {
                    continue;
                };
                let at: i64 = row.try_get(0)?;
                let json: Vec<u8> = row.try_get(1)?;
                let mut record: IdempotencyRecord = serde_json::from_slice(&json)?;
                if record.running_node.is_some() {
                    return Ok(IdempotencyClaim::Running {
                        fingerprint: record.fingerprint,
                    });
                }
                record.stored_at = Timestamp::from_millisecond(at).unwrap_or(Timestamp::UNIX_EPOCH);
                return Ok(IdempotencyClaim::Done(record));
            }
            // Claimed and released by others three times over: busy.
            Ok(IdempotencyClaim::Running {
                fingerprint: fingerprint_owned,
            })
        })
        .await
    }

    async fn release_idempotency(&self, tenant: &str, key: &str) -> Result<(), StoreError> {
        let (tenant, key) = (tenant.to_string(), key.to_string());
        self.run(move |c, shared| async move {
            let stmt = c
                .prepare_cached(&format!(
                    "DELETE FROM idempotency WHERE tenant = $1 AND key = $2 AND {MARK} = $3"
                ))
                .await?;
            c.execute(&stmt, &[&tenant, &key, &shared.node.id]).await?;
            Ok(())
        })
        .await
    }
    /// The stored outcome of `key` of `tenant`, if any.
    async fn idempotency_record(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        let (tenant, key) = (tenant.to_string(), key.to_string());
        self.run(move |c, _| async move {
            let rows = sql!(
                c,
                "SELECT stored_at_ms, record FROM idempotency WHERE tenant = $1 AND key = $2",
                &tenant,
                &key
            );
            let Some(row) = rows.first() else {
                return Ok(None);
            };
            let at: i64 = row.try_get(0)?;
            let json: Vec<u8> = row.try_get(1)?;
            let mut record: IdempotencyRecord = serde_json::from_slice(&json)?;
            record.stored_at = Timestamp::from_millisecond(at).unwrap_or(Timestamp::UNIX_EPOCH);
            Ok(Some(record))
        })
        .await
    }

    /// Deletes every record stored before `before`; how many went.
    async fn sweep_idempotency(&self, before: Timestamp) -> Result<u64, StoreError> {
        let before_ms = u64::try_from(before.as_millisecond()).unwrap_or(0);
        let mut removed = 0u64;
        loop {
            let keys: Vec<(String, String)> = self
                .run(move |c, _| async move {
                    let rows = sql!(
                        c,
                        "SELECT tenant, key FROM idempotency WHERE stored_at_ms < $1 LIMIT $2",
                        &seq(before_ms),
                        &n(SWEEP_BATCH)
                    );
                    rows.iter()
                        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                        .collect::<Result<Vec<_>, StoreError>>()
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

/// At open, before this process heartbeats: the marks this node id left
/// are an earlier process's (it died before answering; node ids are one
/// process each), and the new heartbeat would make them look alive to
/// the other nodes until [`RUNNING_LEASE`]. Only marks younger than the
/// lease can matter, so only those rows are read (by `stored_at_ms`).
pub(super) async fn forget_marks(
    pool: &deadpool_postgres::Pool,
    node: &str,
) -> Result<u64, String> {
    let client = pool.get().await.map_err(|e| e.to_string())?;
    let since = Timestamp::now().as_millisecond() - RUNNING_LEASE.as_millis() as i64;
    client
        .execute(
            &format!("DELETE FROM idempotency WHERE stored_at_ms >= $1 AND {MARK} = $2"),
            &[&since, &node],
        )
        .await
        .map_err(|e| e.to_string())
}
