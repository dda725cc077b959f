//! The PostgreSQL writer: one task per node, group commit, a SAVEPOINT per
//! request.
//!
//! PgStore::write / write_behind ──Request──▶ Writer::run ──batch──▶ BEGIN
//!     for each request: SAVEPOINT · its ops (Fence first refuses a stale epoch) · RELEASE or ROLLBACK TO
//! COMMIT (synchronous_commit off unless a request is durable) ──▶ each request's own answer
//!
//! The redb writer's contract ([`crate::store::Writes::write`]), on
//! PostgreSQL: what is queued goes into one transaction; write-behind
//! requests are held up to [`HOLD_BEHIND`] and ride the next commit, in the
//! order sent. A request fails alone: a stale epoch or a seq written
//! already is [`StoreError::Fenced`], another error of its statements is
//! its own; the rest of the batch commits. A batch of one request needs no
//! savepoint (its failure is the transaction's). A commit that fails, or a
//! connection that cannot be had, fails every request of the batch.
//!
//! Fast path: when no op of the batch reads a result back (all but moves,
//! erases, rollback marks and indexing; see [`plan`]), every statement of
//! the batch is sent at once, pipelined on the connection in order, and
//! the batch costs about one round trip plus its commit. If any statement
//! fails (a stale fence raises `CF001` in `cadre_fence`), that transaction
//! is rolled back and the batch runs again request by request, each in its
//! savepoint, so each request gets its own answer.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use deadpool_postgres::Transaction;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{Json, ToSql};

use super::docs::DocHome;
use super::{Shared, column, driver_error};
use crate::store::erase::ErasedIds;
use crate::store::usage::UsageDelta;
use crate::store::{Erased, HOLD_BEHIND, StoreError, StoredMessage, WriteOp};

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
        if batch.iter().all(|r| r.ops.iter().all(is_planned)) {
            let txn = client.transaction().await.map_err(|e| self.lost(e))?;
            self.begin(&txn, durable).await?;
            match self.pipelined(&txn, batch).await {
                Ok(()) => {
                    txn.commit().await.map_err(|e| self.lost(e))?;
                    return Ok((batch.iter().map(|_| Ok(())).collect(), Vec::new()));
                }
                // A request failed (a fence, a statement): again, one by one.
                Err(e) if e.as_db_error().is_some() => {
                    txn.rollback().await.map_err(|e| self.lost(e))?;
                }
                Err(e) => return Err(self.lost(e)),
            }
        }
        let mut txn = client.transaction().await.map_err(|e| self.lost(e))?;
        self.begin(&txn, durable).await?;
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

    /// What every batch's transaction starts with: asynchronous commit
    /// unless a request is durable; a durable one after asynchronous ones
    /// writes, so that its WAL flush covers theirs (this node's own row,
    /// no hot row).
    async fn begin(&self, txn: &Transaction<'_>, durable: bool) -> Result<(), StoreError> {
        let started = if !durable {
            exec(txn, "SET LOCAL synchronous_commit = off", &[]).await
        } else if self.unsynced {
            exec(
                txn,
                "INSERT INTO meta (key, value) VALUES ('flush:' || $1, 1)
                 ON CONFLICT (key) DO UPDATE SET value = meta.value + 1",
                &[&self.shared.node.id],
            )
            .await
        } else {
            return Ok(());
        };
        started.map(drop).map_err(|e| self.lost(e))
    }

    /// The fast path: every statement of the batch sent at once
    /// (pipelined on the connection, in order), when no op reads a result
    /// back. Any failure sends the batch again one request at a time.
    async fn pipelined(
        &self,
        txn: &Transaction<'_>,
        batch: &[Request],
    ) -> Result<(), tokio_postgres::Error> {
        let node = self.shared.node.id.as_str();
        let mut stmts = Vec::new();
        // All or nothing here, so a turn's record that a later write of
        // the same turn in this batch replaces need not be sent: only its
        // idempotency key's statement is (`store::turns::superseded`). The
        // one-by-one path below sends every write: a request of it may be
        // refused while another commits.
        let superseded = crate::store::turns::superseded(batch.iter().flat_map(|r| r.ops.iter()));
        for (i, op) in batch.iter().flat_map(|r| r.ops.iter()).enumerate() {
            if self.erased.drops(op) {
                continue;
            }
            let with_session = !matches!(op, WriteOp::RecordUsage(d)
                if d.session_id.as_deref().is_some_and(|id| self.erased.contains(id)));
            let planned = plan(op, node, with_session).unwrap_or_default();
            if superseded.contains(&i) {
                // The turn's row is the first statement, its key the second.
                stmts.extend(planned.into_iter().skip(1));
            } else {
                stmts.extend(planned);
            }
        }
        let mut prepared = Vec::with_capacity(stmts.len());
        for st in &stmts {
            prepared.push(txn.prepare_cached(&st.sql).await?);
        }
        let params: Vec<Vec<&(dyn ToSql + Sync)>> = stmts.iter().map(Stmt::params).collect();
        let sent = prepared
            .iter()
            .zip(&params)
            .map(|(st, p)| txn.execute(st, p));
        futures::future::try_join_all(sent).await?;
        Ok(())
    }

    /// A statement or commit failed: a lost connection is an outage.
    fn lost(&self, e: tokio_postgres::Error) -> StoreError {
        self.fail(e.into())
    }

    fn fail(&self, e: StoreError) -> StoreError {
        match driver_error(&e) {
            Some(pg) if pg.is_closed() || pg.as_db_error().is_none() => {
                self.shared.unavailable(&pg.to_string())
            }
            _ => e,
        }
    }
}

/// A failure that is the request's own (the rest of the batch goes on).
fn is_request_error(e: &StoreError) -> bool {
    match e {
        StoreError::Fenced { .. } | StoreError::RunFenced { .. } | StoreError::Corrupt(_) => true,
        other => driver_error(other).is_some_and(|pg| pg.as_db_error().is_some()),
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

/// A statement's parameters, owned or borrowed from the request.
type Param<'a> = Box<dyn ToSql + Sync + Send + 'a>;

/// One statement of an op: its SQL and parameters.
struct Stmt<'a> {
    sql: Cow<'static, str>,
    params: Vec<Param<'a>>,
}

impl Stmt<'_> {
    fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params
            .iter()
            .map(|p| &**p as &(dyn ToSql + Sync))
            .collect()
    }
}

fn stmt<'a>(sql: impl Into<Cow<'static, str>>, params: Vec<Param<'a>>) -> Stmt<'a> {
    Stmt {
        sql: sql.into(),
        params,
    }
}

/// Whether [`plan`] writes `op` (no result is read back).
fn is_planned(op: &WriteOp) -> bool {
    !matches!(
        op,
        WriteOp::MoveDoc { .. }
            | WriteOp::PutDocsOnce { .. }
            | WriteOp::DeleteSession { .. }
            | WriteOp::EraseCallsOutsideSessions { .. }
            | WriteOp::MarkRolledBack { .. }
            | WriteOp::IndexDocs { .. }
    )
}

/// The statements that write `op`, for the ops nothing reads back from
/// (`None` for the others, see [`is_planned`]). A stale [`WriteOp::Fence`]
/// fails with SQLSTATE `CF001` (`cadre_fence`, in the schema).
fn plan<'a>(op: &'a WriteOp, node: &'a str, with_session: bool) -> Option<Vec<Stmt<'a>>> {
    Some(match op {
        WriteOp::Fence { session_id, epoch } => vec![stmt(
            "SELECT cadre_fence($1, $2)",
            vec![Box::new(session_id.as_str()), Box::new(seq(*epoch))],
        )],
        WriteOp::FenceRun { run_id, epoch } => vec![stmt(
            "SELECT cadre_fence_run($1, $2)",
            vec![Box::new(run_id.as_str()), Box::new(seq(*epoch))],
        )],
        // A new session has no owner: the node that first runs its
        // conversation claims it (the one its path hashes to), not the
        // node that created it — every `POST /v1/sessions` hashes to one
        // node, which would otherwise own every new session.
        WriteOp::PutSession(s) => vec![stmt(
            "INSERT INTO sessions (id, tenant, owner, epoch, body) VALUES ($1, $2, NULL, 1, $3)
             ON CONFLICT (id) DO UPDATE SET tenant = EXCLUDED.tenant, body = EXCLUDED.body",
            vec![
                Box::new(s.id.as_str()),
                Box::new(s.tenant.as_str()),
                Box::new(Json(s)),
            ],
        )],
        WriteOp::AppendMessages {
            session_id,
            messages,
        } if !messages.is_empty() => {
            let seqs: Vec<i64> = messages.iter().map(|m| seq(m.seq)).collect();
            let users: Vec<bool> = messages
                .iter()
                .map(|m| m.message.role == crate::model::Role::User)
                .collect();
            let bodies: Vec<Json<&StoredMessage>> = messages.iter().map(Json).collect();
            vec![stmt(
                "WITH added AS (
                     INSERT INTO messages (session_id, seq, is_user, body)
                     SELECT $1, * FROM unnest($2::bigint[], $3::boolean[], $4::json[])
                     RETURNING octet_length(body::text) AS bytes)
                 UPDATE sessions SET stored_bytes = stored_bytes + (SELECT sum(bytes) FROM added)
                 WHERE id = $1",
                vec![
                    Box::new(session_id.as_str()),
                    Box::new(seqs),
                    Box::new(users),
                    Box::new(bodies),
                ],
            )]
        }
        WriteOp::AppendMessages { .. } => Vec::new(),
        WriteOp::RecordToolCall(rec) => {
            let params: Vec<Param<'a>> = vec![
                Box::new(column(&rec.record_id)),
                Box::new(rec.tenant.as_deref().map(column)),
                Box::new(column(&rec.tool_name)),
                Box::new(rec.conversation_id.as_deref().map(column)),
                Box::new(rec.workflow_id.as_deref().map(column)),
                Box::new(Json(&**rec)),
            ];
            let mut out = vec![match crate::store::counted_call(rec) {
                // Outside a session: its bytes count in its tenant's
                // (`store::storage`), a rewrite by the difference, in the
                // statement that writes it (this node's row).
                Some(_) => {
                    let mut params = params;
                    params.push(Box::new(node));
                    stmt(
                        "WITH old AS (
                             SELECT octet_length(body::text) AS bytes FROM tool_calls
                             WHERE record_id = $1),
                         written AS (
                             INSERT INTO tool_calls (record_id, tenant, tool_name, conversation_id,
                                                     workflow_id, body)
                             VALUES ($1, $2, $3, $4, $5, $6)
                             ON CONFLICT (record_id) DO UPDATE SET tenant = EXCLUDED.tenant,
                                 tool_name = EXCLUDED.tool_name,
                                 conversation_id = EXCLUDED.conversation_id,
                                 workflow_id = EXCLUDED.workflow_id, body = EXCLUDED.body
                             RETURNING octet_length(body::text) AS bytes)
                         INSERT INTO tenant_call_bytes (tenant, node, bytes)
                         SELECT $2, $7, written.bytes - coalesce((SELECT bytes FROM old), 0) FROM written
                         ON CONFLICT (tenant, node) DO UPDATE
                             SET bytes = tenant_call_bytes.bytes + EXCLUDED.bytes",
                        params,
                    )
                }
                None => stmt(
                    "INSERT INTO tool_calls (record_id, tenant, tool_name, conversation_id, workflow_id, body)
                     VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (record_id) DO UPDATE SET tenant = EXCLUDED.tenant,
                         tool_name = EXCLUDED.tool_name, conversation_id = EXCLUDED.conversation_id,
                         workflow_id = EXCLUDED.workflow_id, body = EXCLUDED.body",
                    params,
                ),
            }];
            // Calls refused by name, held and declined calls are recorded
            // but not counted per tool (`counted_per_tool`).
            if rec.counted_per_tool() {
                out.push(stmt(
                    "INSERT INTO tool_stats (tool, node, total_calls, successful_calls, failed_calls,
                                             total_execution_time_ms)
                     VALUES ($1, $2, 1, $3::bigint, 1 - $3::bigint, $4::bigint)
                     ON CONFLICT (tool, node) DO UPDATE SET
                         total_calls = tool_stats.total_calls + 1,
                         successful_calls = tool_stats.successful_calls + $3::bigint,
                         failed_calls = tool_stats.failed_calls + 1 - $3::bigint,
                         total_execution_time_ms = tool_stats.total_execution_time_ms + $4::bigint",
                    vec![
                        Box::new(column(&rec.tool_name)),
                        Box::new(node),
                        Box::new(i64::from(rec.is_success)),
                        Box::new(seq(rec.execution_time_ms)),
                    ],
                ));
            }
            out
        }
        WriteOp::PutDoc {
            namespace,
            key,
            value,
            tenant,
        } => {
            let home = DocHome::of(namespace);
            let (t, (ns_col, ns_val)) = (home.table, home.ns_column(4));
            let mut params: Vec<Param<'a>> = vec![
                Box::new(key.as_str()),
                Box::new(Json(value)),
                Box::new(tenant.as_deref()),
            ];
            // A run is created owned by the node that writes it, at epoch
            // 1 ([`crate::store::owners`]); a rewrite keeps its owner.
            let (owner_col, owner_val) = if t == RUNS_TABLE {
                params.push(Box::new(node));
                (", owner", ", $4")
            } else {
                params.extend(home.namespace().map(|n| Box::new(n) as Param<'a>));
                ("", "")
            };
            vec![stmt(
                format!(
                    "INSERT INTO {t} (key, body, tenant{ns_col}{owner_col}) VALUES ($1, $2, $3{ns_val}{owner_val})
                     ON CONFLICT {} DO UPDATE
                     SET body = EXCLUDED.body, tenant = COALESCE(EXCLUDED.tenant, {t}.tenant)",
                    home.conflict()
                ),
                params,
            )]
        }
        WriteOp::DeleteDoc { namespace, key } => {
            let home = DocHome::of(namespace);
            let mut params: Vec<Param<'a>> = vec![Box::new(key.as_str())];
            params.extend(home.namespace().map(|n| Box::new(n) as Param<'a>));
            vec![stmt(
                format!(
                    "DELETE FROM {} WHERE {}key = $1",
                    home.table,
                    home.and_ns(2)
                ),
                params,
            )]
        }
        WriteOp::PutSummary {
            session_id,
            summary,
        } => vec![stmt(
            "INSERT INTO summaries (session_id, body) VALUES ($1, $2)
             ON CONFLICT (session_id) DO UPDATE SET body = EXCLUDED.body",
            vec![Box::new(session_id.as_str()), Box::new(Json(summary))],
        )],
        WriteOp::RecordUsage(d) => usage(d, with_session, node),
        WriteOp::LinkDoc {
            namespace,
            key,
            session_id,
        } => {
            let home = DocHome::of(namespace);
            let mut params: Vec<Param<'a>> =
                vec![Box::new(key.as_str()), Box::new(session_id.as_str())];
            params.extend(home.namespace().map(|n| Box::new(n) as Param<'a>));
            vec![stmt(
                format!(
                    "UPDATE {} SET session_id = $2 WHERE {}key = $1",
                    home.table,
                    home.and_ns(3)
                ),
                params,
            )]
        }
        WriteOp::PutTurn(w) => {
            let mut out = vec![stmt(
                "INSERT INTO turns (session_id, turn_id, open, body) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (session_id, turn_id) DO UPDATE
                 SET open = EXCLUDED.open, body = EXCLUDED.body",
                vec![
                    Box::new(w.session_id.as_str()),
                    Box::new(w.turn_id.as_str()),
                    Box::new(w.open),
                    Box::new(Json(&w.record)),
                ],
            )];
            if let Some(key) = &w.idempotency_key {
                out.push(stmt(
                    "INSERT INTO turn_keys (session_id, key, turn_id) VALUES ($1, $2, $3)
                     ON CONFLICT (session_id, key) DO UPDATE SET turn_id = EXCLUDED.turn_id",
                    vec![
                        Box::new(w.session_id.as_str()),
                        Box::new(key.as_str()),
                        Box::new(w.turn_id.as_str()),
                    ],
                ));
            }
            out
        }
        WriteOp::PutIdempotency {
            tenant,
            key,
            stored_at_ms,
            record,
        } => vec![stmt(
            "INSERT INTO idempotency (tenant, key, stored_at_ms, record) VALUES ($1, $2, $3, $4)
             ON CONFLICT (tenant, key) DO UPDATE
             SET stored_at_ms = EXCLUDED.stored_at_ms, record = EXCLUDED.record",
            vec![
                Box::new(tenant.as_str()),
                Box::new(key.as_str()),
                Box::new(seq(*stored_at_ms)),
                Box::new(record.as_slice()),
            ],
        )],
        WriteOp::DeleteIdempotency { keys, before_ms } => {
            let (tenants, keys): (Vec<&str>, Vec<&str>) =
                keys.iter().map(|(t, k)| (t.as_str(), k.as_str())).unzip();
            vec![stmt(
                "DELETE FROM idempotency i USING unnest($1::text[], $2::text[]) AS d(tenant, key)
                 WHERE i.tenant = d.tenant AND i.key = d.key AND i.stored_at_ms < $3",
                vec![Box::new(tenants), Box::new(keys), Box::new(seq(*before_ms))],
            )]
        }
        WriteOp::MoveDoc { .. }
        | WriteOp::PutDocsOnce { .. }
        | WriteOp::DeleteSession { .. }
        | WriteOp::EraseCallsOutsideSessions { .. }
        | WriteOp::MarkRolledBack { .. }
        | WriteOp::IndexDocs { .. } => return None,
    })
}

/// The statements adding a model call's tokens: to its session's row
/// (unless erased) and this node's row of its tenant, day and agent.
fn usage<'a>(d: &'a UsageDelta, with_session: bool, node: &'a str) -> Vec<Stmt<'a>> {
    let u = &d.usage;
    let counts = || -> [i64; 4] {
        [
            seq(u.prompt_tokens),
            seq(u.completion_tokens),
            seq(u.total_tokens),
            seq(u.model_calls),
        ]
    };
    let mut out = Vec::new();
    if let Some(id) = d.session_id.as_ref().filter(|_| with_session) {
        let [p, c, t, n] = counts();
        out.push(stmt(
            "INSERT INTO session_usage VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (session_id) DO UPDATE SET
                 prompt_tokens = session_usage.prompt_tokens + $2,
                 completion_tokens = session_usage.completion_tokens + $3,
                 total_tokens = session_usage.total_tokens + $4,
                 model_calls = session_usage.model_calls + $5",
            vec![
                Box::new(id.as_str()),
                Box::new(p),
                Box::new(c),
                Box::new(t),
                Box::new(n),
            ],
        ));
    }
    let [p, c, t, n] = counts();
    out.push(stmt(
        "INSERT INTO tenant_usage VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (tenant, day, agent, node) DO UPDATE SET
             prompt_tokens = tenant_usage.prompt_tokens + $5,
             completion_tokens = tenant_usage.completion_tokens + $6,
             total_tokens = tenant_usage.total_tokens + $7,
             model_calls = tenant_usage.model_calls + $8",
        vec![
            Box::new(d.tenant.as_str()),
            Box::new(d.day.to_string()),
            Box::new(d.agent.as_str()),
            Box::new(node),
            Box::new(p),
            Box::new(c),
            Box::new(t),
            Box::new(n),
        ],
    ));
    out
}

/// What a failed statement of `op` means to its request: a stale fence, or
/// a seq written already (another writer), is [`StoreError::Fenced`].
fn request_error(op: &WriteOp, fence_epoch: Option<u64>, e: tokio_postgres::Error) -> StoreError {
    let code = e.code().map(SqlState::code);
    match op {
        WriteOp::Fence { session_id, epoch } if code == Some(FENCED) => StoreError::Fenced {
            session_id: session_id.clone(),
            epoch: *epoch,
        },
        WriteOp::FenceRun { run_id, epoch } if code == Some(FENCED) => StoreError::RunFenced {
            run_id: run_id.clone(),
            epoch: *epoch,
        },
        WriteOp::AppendMessages { session_id, .. }
            if code == Some(SqlState::UNIQUE_VIOLATION.code()) =>
        {
            StoreError::Fenced {
                session_id: session_id.clone(),
                epoch: fence_epoch.unwrap_or(0),
            }
        }
        _ => e.into(),
    }
}

/// The table of workflow runs: its rows carry an owner.
const RUNS_TABLE: &str = "workflow_runs";

/// The SQLSTATE `cadre_fence` raises for a stale epoch.
const FENCED: &str = "CF001";

/// Applies one request's ops, one statement at a time; the sessions it erased.
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
        let with_session = !matches!(op, WriteOp::RecordUsage(d)
        if d.session_id.as_deref().is_some_and(|id| {
            erased_ids.contains(id) || erased_before.contains(id) || erased_now.contains(id)
        }));
        if let Some(stmts) = plan(op, node, with_session) {
            for st in &stmts {
                exec(txn, &st.sql, &st.params())
                    .await
                    .map_err(|e| request_error(op, fence_epoch, e))?;
            }
            continue;
        }
        match op {
            WriteOp::PutDocsOnce { docs, session_id } => {
                // The first document decides: when it is there, nothing is
                // written (the redb writer's rule).
                for (i, d) in docs.iter().enumerate() {
                    let home = DocHome::of(&d.namespace);
                    let (t, (ns_col, ns_val)) = (home.table, home.ns_column(5));
                    let value = Json(&d.value);
                    let mut params: Vec<&(dyn ToSql + Sync)> =
                        vec![&d.key, &value, &d.tenant, session_id];
                    params.extend(home.ns_param());
                    let rows = query(
                        txn,
                        &format!(
                            "INSERT INTO {t} (key, body, tenant, session_id{ns_col}) VALUES ($1, $2, $3, $4{ns_val})
                             ON CONFLICT {} DO NOTHING RETURNING key",
                            home.conflict()
                        ),
                        &params,
                    )
                    .await?;
                    if i == 0 && rows.is_empty() {
                        break;
                    }
                }
            }
            WriteOp::MoveDoc {
                namespace,
                key,
                to_namespace,
                to_value,
                moved,
            } => {
                let from = DocHome::of(namespace);
                let mut params: Vec<&(dyn ToSql + Sync)> = vec![key];
                params.extend(from.ns_param());
                let rows = query(
                    txn,
                    &format!(
                        "DELETE FROM {} WHERE {}key = $1 RETURNING body, session_id",
                        from.table,
                        from.and_ns(2)
                    ),
                    &params,
                )
                .await?;
                let old = match rows.first() {
                    Some(row) => {
                        let body: Json<Value> = row.try_get(0)?;
                        let session: Option<String> = row.try_get(1)?;
                        // The tenant index stays behind (as in redb); the
                        // erase link moves with the document.
                        let to = DocHome::of(to_namespace);
                        let (t, (ns_col, ns_val)) = (to.table, to.ns_column(4));
                        let to_value = Json(to_value);
                        let mut params: Vec<&(dyn ToSql + Sync)> = vec![key, &to_value, &session];
                        params.extend(to.ns_param());
                        exec(
                            txn,
                            &format!(
                                "INSERT INTO {t} (key, body, session_id{ns_col}) VALUES ($1, $2, $3{ns_val})
                                 ON CONFLICT {} DO UPDATE SET body = EXCLUDED.body,
                                     session_id = COALESCE(EXCLUDED.session_id, {t}.session_id)",
                                to.conflict()
                            ),
                            &params,
                        )
                        .await?;
                        Some(body.0)
                    }
                    None => None,
                };
                *moved.lock().expect("move slot") = old;
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
            WriteOp::EraseCallsOutsideSessions {
                tenant,
                after: _,
                erased: slot,
            } => {
                // One statement erases them all (no batch to resume); the
                // bytes go off this node's row of the tenant.
                let rows = query(
                    txn,
                    "WITH gone AS (
                         DELETE FROM tool_calls WHERE tenant = $1 AND conversation_id IS NULL
                         RETURNING octet_length(body::text) AS bytes),
                     counted AS (
                         INSERT INTO tenant_call_bytes (tenant, node, bytes)
                         SELECT $1, $2, -sum(bytes) FROM gone HAVING count(*) > 0
                         ON CONFLICT (tenant, node) DO UPDATE
                             SET bytes = tenant_call_bytes.bytes + EXCLUDED.bytes)
                     SELECT count(*) FROM gone",
                    &[tenant, &node],
                )
                .await?;
                let calls: i64 = rows.first().map(|r| r.try_get(0)).transpose()?.unwrap_or(0);
                *slot.lock().expect("erase slot") = Some(crate::store::CallsErased {
                    calls: calls.max(0) as u64,
                    next: None,
                });
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
                    let home = DocHome::of(namespace);
                    let mut params: Vec<&(dyn ToSql + Sync)> = Vec::new();
                    params.extend(home.ns_param());
                    let rows = query(
                        txn,
                        &format!(
                            "SELECT key, body FROM {} WHERE {}true",
                            home.table,
                            home.and_ns(1)
                        ),
                        &params,
                    )
                    .await?;
                    let update = format!(
                        "UPDATE {} SET tenant = $2 WHERE {}key = $1",
                        home.table,
                        home.and_ns(3)
                    );
                    let mut n = 0u64;
                    for row in rows {
                        let key: String = row.try_get(0)?;
                        let Json(body): Json<Value> = row.try_get(1)?;
                        if let Some(tenant) = tenant_of(&body) {
                            let mut params: Vec<&(dyn ToSql + Sync)> = vec![&key, &tenant];
                            params.extend(home.ns_param());
                            exec(txn, &update, &params).await?;
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
            _ => unreachable!("planned above"),
        }
    }
    Ok(erased)
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
    let mut documents = exec(txn, "DELETE FROM docs WHERE session_id = $1", &[&id]).await?;
    for t in &crate::store::tables::OWN_TABLES {
        let sql = format!("DELETE FROM {} WHERE session_id = $1", t.name());
        documents += exec(txn, &sql, &[&id]).await?;
    }
    Ok(Some(Erased {
        tenant,
        messages,
        calls,
        documents,
    }))
}
