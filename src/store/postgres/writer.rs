//! The PostgreSQL writer: one task per node, group commit, a SAVEPOINT per
//! request.
//!
//! PgStore::write / write_behind ──Request──▶ Writer::run ──batch──▶ BEGIN
//!     for each request: SAVEPOINT · its ops (Fence first refuses a stale epoch) · RELEASE or ROLLBACK TO
//! COMMIT (synchronous_commit off unless a request is durable) ──▶ each request's own answer
//!
//! The redb writer's contract ([`crate::store::Store::write`]), on
//! PostgreSQL: what is queued goes into one transaction; write-behind
//! requests are held up to [`HOLD_BEHIND`] and ride the next commit, in the
//! order sent. A request fails alone: a stale epoch or a seq written
//! already is [`StoreError::Fenced`], another error of its statements is
//! its own; the rest of the batch commits. A batch of one request needs no
//! savepoint (its failure is the transaction's). A commit that fails, or a
//! connection that cannot be had, fails every request of the batch.

use std::sync::Arc;
use std::time::Instant;

use deadpool_postgres::Transaction;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{Json, ToSql};

use super::{Shared, column};
use crate::store::erase::ErasedIds;
use crate::store::usage::UsageDelta;
use crate::store::{
    Erased, HOLD_BEHIND, Session, StoreError, StoredMessage, ToolCallRecord, WriteOp,
};

/// Requests the writer drains into one transaction at most.
const MAX_BATCH: usize = 1024;

pub(super) struct Request {
    pub ops: Vec<WriteOp>,
    pub durable: bool,
    /// Refuse unless it is 0 (the store's generation never changes).
    pub generation: Option<u64>,
    /// Sent behind: nobody waits for it, so it may wait for the next commit.
    pub behind: bool,
    pub done: oneshot::Sender<Result<(), StoreError>>,
}

pub(super) struct Writer {
    shared: Arc<Shared>,
    /// Sessions erased by committed batches: later writes under them are dropped.
    erased: ErasedIds,
    /// A commit since the last durable one returned before its WAL flush.
    unsynced: bool,
}

/// How a failure of the whole batch reaches each request.
fn copy(e: &Arc<StoreError>) -> StoreError {
    match &**e {
        StoreError::Unavailable { since, reason } => StoreError::Unavailable {
            since: *since,
            reason: reason.clone(),
        },
        _ => StoreError::CommitFailed(e.clone()),
    }
}

impl Writer {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Writer {
            shared,
            erased: ErasedIds::default(),
            unsynced: false,
        }
    }

    pub(super) async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Request>) {
        let mut held: Vec<Request> = Vec::new();
        let mut held_since: Option<Instant> = None;
        let mut closing = false;
        while !closing {
            let hold_left = held_since.map(|t| HOLD_BEHIND.saturating_sub(t.elapsed()));
            let first = match hold_left {
                Some(left) => match tokio::time::timeout(left, rx.recv()).await {
                    Ok(Some(req)) => Some(req),
                    Ok(None) => {
                        closing = true;
                        None
                    }
                    Err(_) => None,
                },
                None => match rx.recv().await {
                    Some(req) => Some(req),
                    None => {
                        closing = true;
                        None
                    }
                },
            };
            let mut batch = std::mem::take(&mut held);
            batch.extend(first);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(req) => batch.push(req),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                continue;
            }
            let may_hold = !closing
                && batch.len() < MAX_BATCH
                && batch.iter().all(|r| r.behind)
                && held_since.is_none_or(|t| t.elapsed() < HOLD_BEHIND);
            if may_hold {
                held = batch;
                held_since.get_or_insert_with(Instant::now);
                continue;
            }
            held_since = None;
            let closed = self
                .shared
                .closed
                .load(std::sync::atomic::Ordering::Acquire);
            let mut kept = Vec::with_capacity(batch.len());
            for req in batch {
                if closed && !req.ops.is_empty() {
                    let _ = req.done.send(Err(StoreError::Closed));
                } else if let Some(loaded) = req.generation.filter(|g| *g != 0) {
                    let _ = req.done.send(Err(StoreError::Reopened { loaded, now: 0 }));
                } else {
                    kept.push(req);
                }
            }
            if !kept.is_empty() {
                self.commit(kept).await;
            }
        }
    }

    async fn commit(&mut self, batch: Vec<Request>) {
        let durable = batch.iter().any(|r| r.durable);
        let started = Instant::now();
        let (outcomes, erased) = match self.apply_batch(&batch, durable).await {
            Ok(done) => done,
            Err(e) => {
                tracing::error!(error = %e, requests = batch.len(), "store commit failed");
                let e = Arc::new(e);
                for req in batch {
                    let _ = req.done.send(Err(copy(&e)));
                }
                return;
            }
        };
        self.shared.commit_latency.observe(started.elapsed());
        self.unsynced = !durable;
        for id in erased {
            self.erased.remember(id);
        }
        for (req, outcome) in batch.into_iter().zip(outcomes) {
            let _ = req.done.send(outcome);
        }
    }

    /// One transaction for the batch: each request's outcome, and the
    /// sessions it erased.
    async fn apply_batch(
        &mut self,
        batch: &[Request],
        durable: bool,
    ) -> Result<(Vec<Result<(), StoreError>>, Vec<String>), StoreError> {
        let mut client = self.shared.client().await?;
        let mut txn = client.transaction().await.map_err(|e| self.lost(e))?;
        if !durable {
            txn.batch_execute("SET LOCAL synchronous_commit = off")
                .await
                .map_err(|e| self.lost(e))?;
        } else if self.unsynced {
            // A durable commit must write to flush the WAL of the
            // asynchronous ones before it; this node's own row, no hot row.
            exec(
                &txn,
                "INSERT INTO meta (key, value) VALUES ('flush:' || $1, 1)
                 ON CONFLICT (key) DO UPDATE SET value = meta.value + 1",
                &[&self.shared.node.id],
            )
            .await
            .map_err(|e| self.lost(e))?;
        }
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut erased_now = ErasedIds::default();
        let mut erased_ids = Vec::new();
        if let [req] = batch {
            match apply(
                &txn,
                &req.ops,
                &self.erased,
                &erased_now,
                &self.shared.node.id,
            )
            .await
            {
                Ok(ids) => {
                    erased_ids = ids;
                    outcomes.push(Ok(()));
                }
                Err(e) if is_request_error(&e) => {
                    txn.rollback().await.map_err(|e| self.lost(e))?;
                    return Ok((vec![Err(e)], Vec::new()));
                }
                Err(e) => return Err(self.fail(e)),
            }
        } else {
            for req in batch {
                let sp = txn.savepoint("request").await.map_err(|e| self.lost(e))?;
                match apply(
                    &sp,
                    &req.ops,
                    &self.erased,
                    &erased_now,
                    &self.shared.node.id,
                )
                .await
                {
                    Ok(ids) => {
                        sp.commit().await.map_err(|e| self.lost(e))?;
                        for id in ids {
                            erased_now.remember(id.clone());
                            erased_ids.push(id);
                        }
                        outcomes.push(Ok(()));
                    }
                    Err(e) if is_request_error(&e) => {
                        sp.rollback().await.map_err(|e| self.lost(e))?;
                        outcomes.push(Err(e));
                    }
                    Err(e) => return Err(self.fail(e)),
                }
            }
        }
        txn.commit().await.map_err(|e| self.lost(e))?;
        Ok((outcomes, erased_ids))
    }

    /// A statement or commit failed: a lost connection is an outage.
    fn lost(&self, e: tokio_postgres::Error) -> StoreError {
        self.fail(StoreError::Postgres(e))
    }

    fn fail(&self, e: StoreError) -> StoreError {
        match &e {
            StoreError::Postgres(pg) if pg.is_closed() || pg.as_db_error().is_none() => {
                self.shared.unavailable(&pg.to_string())
            }
            _ => e,
        }
    }
}

/// A failure that is the request's own (the rest of the batch goes on).
fn is_request_error(e: &StoreError) -> bool {
    match e {
        StoreError::Fenced { .. } | StoreError::Corrupt(_) => true,
        StoreError::Postgres(pg) => pg.as_db_error().is_some(),
        _ => false,
    }
}

async fn exec(
    txn: &Transaction<'_>,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64, tokio_postgres::Error> {
    let stmt = txn.prepare_cached(sql).await?;
    txn.execute(&stmt, params).await
}

async fn query(
    txn: &Transaction<'_>,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    let stmt = txn.prepare_cached(sql).await?;
    txn.query(&stmt, params).await
}

fn seq(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Applies one request's ops; the sessions it erased.
async fn apply(
    txn: &Transaction<'_>,
    ops: &[WriteOp],
    erased_ids: &ErasedIds,
    erased_before: &ErasedIds,
    node: &str,
) -> Result<Vec<String>, StoreError> {
    let fence_epoch = ops.iter().find_map(|op| match op {
        WriteOp::Fence { epoch, .. } => Some(*epoch),
        _ => None,
    });
    let mut erased_now = ErasedIds::default();
    let mut erased = Vec::new();
    for op in ops {
        if erased_ids.drops(op) || erased_before.drops(op) || erased_now.drops(op) {
            tracing::debug!("a write under an erased session was dropped");
            continue;
        }
        match op {
            WriteOp::Fence { session_id, epoch } => {
                let held = query(
                    txn,
                    "SELECT 1 FROM sessions WHERE id = $1 AND epoch = $2 FOR SHARE",
                    &[session_id, &seq(*epoch)],
                )
                .await?;
                if held.is_empty() {
                    return Err(StoreError::Fenced {
                        session_id: session_id.clone(),
                        epoch: *epoch,
                    });
                }
            }
            WriteOp::PutSession(s) => put_session(txn, s, node).await?,
            WriteOp::AppendMessages {
                session_id,
                messages,
            } => {
                append(txn, session_id, messages)
                    .await
                    .map_err(|e| match e.code() {
                        Some(c) if *c == SqlState::UNIQUE_VIOLATION => StoreError::Fenced {
                            session_id: session_id.clone(),
                            epoch: fence_epoch.unwrap_or(0),
                        },
                        _ => StoreError::Postgres(e),
                    })?;
            }
            WriteOp::RecordToolCall(rec) => record_call(txn, rec, node).await?,
            WriteOp::PutDoc {
                namespace,
                key,
                value,
                tenant,
            } => {
                exec(
                    txn,
                    "INSERT INTO docs (namespace, key, body, tenant) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (namespace, key) DO UPDATE
                     SET body = EXCLUDED.body, tenant = COALESCE(EXCLUDED.tenant, docs.tenant)",
                    &[namespace, key, &Json(value), tenant],
                )
                .await?;
            }
            WriteOp::DeleteDoc { namespace, key } => {
                exec(
                    txn,
                    "DELETE FROM docs WHERE namespace = $1 AND key = $2",
                    &[namespace, key],
                )
                .await?;
            }
            WriteOp::MoveDoc {
                namespace,
                key,
                to_namespace,
                to_value,
                moved,
            } => {
                let rows = query(
                    txn,
                    "DELETE FROM docs WHERE namespace = $1 AND key = $2 RETURNING body, session_id",
                    &[namespace, key],
                )
                .await?;
                let old = match rows.first() {
                    Some(row) => {
                        let body: Json<Value> = row.try_get(0)?;
                        let session: Option<String> = row.try_get(1)?;
                        // The tenant index stays behind (as in redb); the
                        // erase link moves with the document.
                        exec(
                            txn,
                            "INSERT INTO docs (namespace, key, body, session_id) VALUES ($1, $2, $3, $4)
                             ON CONFLICT (namespace, key) DO UPDATE SET body = EXCLUDED.body,
                                 session_id = COALESCE(EXCLUDED.session_id, docs.session_id)",
                            &[to_namespace, key, &Json(to_value), &session],
                        )
                        .await?;
                        Some(body.0)
                    }
                    None => None,
                };
                *moved.lock().expect("move slot") = old;
            }
            WriteOp::PutSummary {
                session_id,
                summary,
            } => {
                exec(
                    txn,
                    "INSERT INTO summaries (session_id, body) VALUES ($1, $2)
                     ON CONFLICT (session_id) DO UPDATE SET body = EXCLUDED.body",
                    &[session_id, &Json(summary)],
                )
                .await?;
            }
            WriteOp::RecordUsage(delta) => {
                let gone = delta.session_id.as_deref().is_some_and(|id| {
                    erased_ids.contains(id) || erased_before.contains(id) || erased_now.contains(id)
                });
                record_usage(txn, delta, !gone, node).await?;
            }
            WriteOp::DeleteSession {
                session_id,
                erased: slot,
            } => {
                let found = erase(txn, session_id).await?;
                if found.is_some() {
                    erased_now.remember(session_id.clone());
                    erased.push(session_id.clone());
                }
                *slot.lock().expect("erase slot") = found;
            }
            WriteOp::LinkDoc {
                namespace,
                key,
                session_id,
            } => {
                exec(
                    txn,
                    "UPDATE docs SET session_id = $3 WHERE namespace = $1 AND key = $2",
                    &[namespace, key, session_id],
                )
                .await?;
            }
            WriteOp::PutTurn(w) => {
                exec(
                    txn,
                    "INSERT INTO turns (session_id, turn_id, open, body) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (session_id, turn_id) DO UPDATE
                     SET open = EXCLUDED.open, body = EXCLUDED.body",
                    &[&w.session_id, &w.turn_id, &w.open, &Json(&w.record)],
                )
                .await?;
                if let Some(key) = &w.idempotency_key {
                    exec(
                        txn,
                        "INSERT INTO turn_keys (session_id, key, turn_id) VALUES ($1, $2, $3)
                         ON CONFLICT (session_id, key) DO UPDATE SET turn_id = EXCLUDED.turn_id",
                        &[&w.session_id, key, &w.turn_id],
                    )
                    .await?;
                }
            }
            WriteOp::MarkRolledBack { session_id, seqs } => {
                let seqs: Vec<i64> = seqs.iter().map(|s| seq(*s)).collect();
                let rows = query(
                    txn,
                    "SELECT seq, body FROM messages WHERE session_id = $1 AND seq = ANY($2)
                     FOR UPDATE",
                    &[session_id, &seqs],
                )
                .await?;
                for row in rows {
                    let n: i64 = row.try_get(0)?;
                    let Json(mut m): Json<StoredMessage> = row.try_get(1)?;
                    m.rolled_back = true;
                    exec(
                        txn,
                        "UPDATE messages SET body = $3 WHERE session_id = $1 AND seq = $2",
                        &[session_id, &n, &Json(&m)],
                    )
                    .await?;
                }
            }
            WriteOp::IndexDocs {
                namespace,
                tenant_of,
                indexed,
            } => {
                let flag = format!("docs_indexed:{namespace}");
                let done = query(txn, "SELECT 1 FROM meta WHERE key = $1", &[&flag]).await?;
                let n = if done.is_empty() {
                    let rows = query(
                        txn,
                        "SELECT key, body FROM docs WHERE namespace = $1",
                        &[namespace],
                    )
                    .await?;
                    let mut n = 0u64;
                    for row in rows {
                        let key: String = row.try_get(0)?;
                        let Json(body): Json<Value> = row.try_get(1)?;
                        if let Some(tenant) = tenant_of(&body) {
                            exec(
                                txn,
                                "UPDATE docs SET tenant = $3 WHERE namespace = $1 AND key = $2",
                                &[namespace, &key, &tenant],
                            )
                            .await?;
                            n += 1;
                        }
                    }
                    exec(
                        txn,
                        "INSERT INTO meta (key, value) VALUES ($1, 1)",
                        &[&flag],
                    )
                    .await?;
                    Some(n)
                } else {
                    None
                };
                *indexed.lock().expect("index slot") = n;
            }
            WriteOp::PutIdempotency {
                tenant,
                key,
                stored_at_ms,
                record,
            } => {
                exec(
                    txn,
                    "INSERT INTO idempotency (tenant, key, stored_at_ms, record) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (tenant, key) DO UPDATE
                     SET stored_at_ms = EXCLUDED.stored_at_ms, record = EXCLUDED.record",
                    &[tenant, key, &seq(*stored_at_ms), record],
                )
                .await?;
            }
            WriteOp::DeleteIdempotency { keys, before_ms } => {
                let (tenants, keys): (Vec<&str>, Vec<&str>) =
                    keys.iter().map(|(t, k)| (t.as_str(), k.as_str())).unzip();
                exec(
                    txn,
                    "DELETE FROM idempotency i USING unnest($1::text[], $2::text[]) AS d(tenant, key)
                     WHERE i.tenant = d.tenant AND i.key = d.key AND i.stored_at_ms < $3",
                    &[&tenants, &keys, &seq(*before_ms)],
                )
                .await?;
            }
        }
    }
    Ok(erased)
}

async fn put_session(txn: &Transaction<'_>, s: &Session, node: &str) -> Result<(), StoreError> {
    exec(
        txn,
        "INSERT INTO sessions (id, tenant, owner, epoch, body) VALUES ($1, $2, $3, 1, $4)
         ON CONFLICT (id) DO UPDATE SET tenant = EXCLUDED.tenant, body = EXCLUDED.body",
        &[&s.id, &s.tenant, &node, &Json(s)],
    )
    .await?;
    Ok(())
}

async fn append(
    txn: &Transaction<'_>,
    session_id: &str,
    messages: &[StoredMessage],
) -> Result<(), tokio_postgres::Error> {
    if messages.is_empty() {
        return Ok(());
    }
    let seqs: Vec<i64> = messages.iter().map(|m| seq(m.seq)).collect();
    let users: Vec<bool> = messages
        .iter()
        .map(|m| m.message.role == crate::model::Role::User)
        .collect();
    let bodies: Vec<Json<&StoredMessage>> = messages.iter().map(Json).collect();
    exec(
        txn,
        "INSERT INTO messages (session_id, seq, is_user, body)
         SELECT $1, * FROM unnest($2::bigint[], $3::boolean[], $4::json[])",
        &[&session_id, &seqs, &users, &bodies],
    )
    .await?;
    Ok(())
}

async fn record_call(
    txn: &Transaction<'_>,
    rec: &ToolCallRecord,
    node: &str,
) -> Result<(), StoreError> {
    exec(
        txn,
        "INSERT INTO tool_calls (record_id, tenant, tool_name, conversation_id, workflow_id, body)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (record_id) DO UPDATE SET tenant = EXCLUDED.tenant,
             tool_name = EXCLUDED.tool_name, conversation_id = EXCLUDED.conversation_id,
             workflow_id = EXCLUDED.workflow_id, body = EXCLUDED.body",
        &[
            &column(&rec.record_id),
            &rec.tenant.as_deref().map(column),
            &column(&rec.tool_name),
            &rec.conversation_id.as_deref().map(column),
            &rec.workflow_id.as_deref().map(column),
            &Json(rec),
        ],
    )
    .await?;
    // Calls to tools that do not exist are recorded but not counted per
    // tool: their names are anyone's text.
    if rec.error_type.as_deref() == Some("tool_not_found") {
        return Ok(());
    }
    let ok = i64::from(rec.is_success);
    exec(
        txn,
        "INSERT INTO tool_stats (tool, node, total_calls, successful_calls, failed_calls,
                                 total_execution_time_ms)
         VALUES ($1, $2, 1, $3::bigint, 1 - $3::bigint, $4::bigint)
         ON CONFLICT (tool, node) DO UPDATE SET
             total_calls = tool_stats.total_calls + 1,
             successful_calls = tool_stats.successful_calls + $3::bigint,
             failed_calls = tool_stats.failed_calls + 1 - $3::bigint,
             total_execution_time_ms = tool_stats.total_execution_time_ms + $4::bigint",
        &[
            &column(&rec.tool_name),
            &node,
            &ok,
            &seq(rec.execution_time_ms),
        ],
    )
    .await?;
    Ok(())
}

async fn record_usage(
    txn: &Transaction<'_>,
    d: &UsageDelta,
    with_session: bool,
    node: &str,
) -> Result<(), StoreError> {
    let u = &d.usage;
    let (p, c, t, n) = (
        seq(u.prompt_tokens),
        seq(u.completion_tokens),
        seq(u.total_tokens),
        seq(u.model_calls),
    );
    if let Some(id) = d.session_id.as_ref().filter(|_| with_session) {
        exec(
            txn,
            "INSERT INTO session_usage VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (session_id) DO UPDATE SET
                 prompt_tokens = session_usage.prompt_tokens + $2,
                 completion_tokens = session_usage.completion_tokens + $3,
                 total_tokens = session_usage.total_tokens + $4,
                 model_calls = session_usage.model_calls + $5",
            &[id, &p, &c, &t, &n],
        )
        .await?;
    }
    exec(
        txn,
        "INSERT INTO tenant_usage VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (tenant, day, agent, node) DO UPDATE SET
             prompt_tokens = tenant_usage.prompt_tokens + $5,
             completion_tokens = tenant_usage.completion_tokens + $6,
             total_tokens = tenant_usage.total_tokens + $7,
             model_calls = tenant_usage.model_calls + $8",
        &[
            &d.tenant,
            &d.day.to_string(),
            &d.agent,
            &node,
            &p,
            &c,
            &t,
            &n,
        ],
    )
    .await?;
    Ok(())
}

/// Removes the session and every row under its id (see
/// [`crate::store::erase`]: tool stats and tenant usage stay).
async fn erase(txn: &Transaction<'_>, id: &str) -> Result<Option<Erased>, StoreError> {
    let rows = query(
        txn,
        "DELETE FROM sessions WHERE id = $1 RETURNING tenant",
        &[&id],
    )
    .await?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let tenant: String = row.try_get(0)?;
    let messages = exec(txn, "DELETE FROM messages WHERE session_id = $1", &[&id]).await?;
    exec(txn, "DELETE FROM summaries WHERE session_id = $1", &[&id]).await?;
    exec(
        txn,
        "DELETE FROM session_usage WHERE session_id = $1",
        &[&id],
    )
    .await?;
    exec(txn, "DELETE FROM turns WHERE session_id = $1", &[&id]).await?;
    exec(txn, "DELETE FROM turn_keys WHERE session_id = $1", &[&id]).await?;
    let calls = exec(
        txn,
        "DELETE FROM tool_calls WHERE conversation_id = $1",
        &[&id],
    )
    .await?;
    let documents = exec(txn, "DELETE FROM docs WHERE session_id = $1", &[&id]).await?;
    Ok(Some(Erased {
        tenant,
        messages,
        calls,
        documents,
    }))
}
