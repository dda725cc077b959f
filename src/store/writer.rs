//! The redb writer thread: group commit, write-behind, and the swap to a
//! read-only view on a storage fault (the module doc of [`super`] says
//! what each means for callers).
//!
//! RedbStore::write ──WriteRequest──▶ Writer::run ──commit_batch──▶ redb

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use jiff::Timestamp;
use redb::{Database, Durability, ReadableTable};
use serde_json::Value;

use super::tables::*;
use super::write_queue::{self, WriteRequest};
use super::*;

/// The database readers and the writer use now, swapped on a failure and
/// on recovery.
pub(super) struct Slot {
    pub(super) db: RwLock<Arc<Database>>,
    /// `Some` while writes are refused.
    pub(super) outage: Mutex<Option<(Timestamp, Arc<str>)>>,
    pub(super) generation: AtomicU64,
    /// Set at shutdown: only flushes pass.
    pub(super) closed: std::sync::atomic::AtomicBool,
}

impl Slot {
    pub(super) fn current(&self) -> Arc<Database> {
        self.db.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(super) fn replace(&self, db: Database) -> Arc<Database> {
        let mut slot = self.db.write().unwrap_or_else(|e| e.into_inner());
        std::mem::replace(&mut *slot, Arc::new(db))
    }

    pub(super) fn outage(&self) -> Option<(Timestamp, Arc<str>)> {
        self.outage
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(super) fn set_outage(&self, outage: Option<(Timestamp, Arc<str>)>) {
        *self.outage.lock().unwrap_or_else(|e| e.into_inner()) = outage;
    }
}

/// The writer thread's state: the slot it swaps and the file it reopens.
pub(super) struct Writer {
    pub(super) slot: Arc<Slot>,
    /// The file and its page cache size; `None` for an in-memory store
    /// (nothing to reopen).
    pub(super) path: Option<(PathBuf, usize)>,
    pub(super) last_attempt: Option<Instant>,
    /// Told what every batch wrote, and emptied when the file is reopened.
    pub(super) cache: Arc<cache::ReadCache>,
    /// Sessions erased by committed batches: later writes under them are dropped.
    pub(super) erased: erase::ErasedIds,
}

impl Writer {
    /// Writes sent behind are held (up to [`HOLD_BEHIND`]) until a write
    /// someone waits for comes, and go into its commit: a turn's steps and
    /// call records then share the turn's one commit instead of paying one
    /// each. Order is kept: held writes come first in the batch.
    pub(super) fn run(mut self, rx: write_queue::Receiver, latency: &crate::metrics::Histogram) {
        let mut held: Vec<WriteRequest> = Vec::new();
        let mut held_since: Option<Instant> = None;
        let mut closing = false;
        while !closing {
            let outage = self.slot.outage().is_some();
            let hold_left = held_since.map(|t| HOLD_BEHIND.saturating_sub(t.elapsed()));
            let wait = match (outage, hold_left) {
                (true, Some(left)) => Some(left.min(REOPEN_EVERY)),
                (true, None) => Some(REOPEN_EVERY),
                (false, left) => left,
            };
            let first = match rx.recv(wait) {
                Ok(req) => Some(req),
                Err(write_queue::RecvError::Timeout) => None,
                Err(write_queue::RecvError::Closed) => {
                    closing = true;
                    None
                }
            };
            if self.slot.outage().is_some() {
                self.try_reopen();
            }
            let mut batch = std::mem::take(&mut held);
            batch.extend(first);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Some(req) => batch.push(req),
                    None => break,
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
            if let Some((since, reason)) = self.slot.outage() {
                let refusal = Arc::new(StoreError::Unavailable { since, reason });
                for req in batch {
                    let _ = req.done.send(Err(refusal.clone()));
                }
                continue;
            }
            let (batch, refused): (Vec<_>, Vec<_>) = batch
                .into_iter()
                .partition(|r| r.ops.is_empty() || !self.slot.closed.load(Ordering::Acquire));
            for req in refused {
                let _ = req.done.send(Err(Arc::new(StoreError::Closed)));
            }
            let now = self.slot.generation.load(Ordering::Acquire);
            let (batch, stale): (Vec<_>, Vec<_>) = batch
                .into_iter()
                .partition(|r| r.generation.is_none_or(|g| g == now));
            for req in stale {
                let loaded = req.generation.unwrap_or(now);
                let _ = req
                    .done
                    .send(Err(Arc::new(StoreError::Reopened { loaded, now })));
            }
            if batch.is_empty() {
                continue;
            }
            let durable = batch.iter().any(|r| r.durable);
            let started = Instant::now();
            let db = self.slot.current();
            let result = commit_batch(&db, &batch, durable, &self.erased).map_err(|e| {
                tracing::error!(error = %e, requests = batch.len(), "store commit failed");
                Arc::new(e)
            });
            drop(db);
            latency.observe(started.elapsed());
            let result = match result {
                Err(e) if is_io(&e) => Err(self.enter_outage(&e)),
                other => other,
            };
            if result.is_ok() {
                for op in batch.iter().flat_map(|r| r.ops.iter()) {
                    if let WriteOp::DeleteSession { session_id, erased } = op
                        && erased.lock().expect("erase slot").is_some()
                    {
                        self.erased.remember(session_id.clone());
                    }
                }
            }
            self.cache
                .invalidate(batch.iter().flat_map(|r| r.ops.iter()));
            for req in batch {
                let _ = req.done.send(result.clone());
            }
        }
    }

    /// Swaps the failed database for a read view; the refusal to send.
    fn enter_outage(&mut self, cause: &StoreError) -> Arc<StoreError> {
        let since = Timestamp::now();
        let reason: Arc<str> = cause.to_string().into();
        let refusal = Arc::new(StoreError::Unavailable {
            since,
            reason: reason.clone(),
        });
        let Some((path, _)) = &self.path else {
            return refusal;
        };
        tracing::error!(error = %cause, "storage is not writable; serving reads only until it is");
        // Unsynced non-durable commits die with the failed database, and
        // with them whatever the read cache learned of them.
        self.slot.generation.fetch_add(1, Ordering::AcqRel);
        self.cache.clear();
        self.slot.set_outage(Some((since, reason)));
        self.last_attempt = Some(Instant::now());
        let view = read_view::ReadView::open(path)
            .map_err(|e| e.to_string())
            .and_then(|v| {
                Database::builder()
                    .create_with_backend(v)
                    .map_err(|e| e.to_string())
            });
        let view = view.or_else(|e| {
            tracing::error!(error = %e, "cannot open a read view; reads fail too");
            // Something must replace the failed database: it holds the
            // file's lock until dropped, and the reopen needs it.
            Database::builder().create_with_backend(redb::backends::InMemoryBackend::new())
        });
        if let Ok(view) = view {
            drop(self.slot.replace(view));
        }
        refusal
    }

    /// Reopens the file for writing, at most every [`REOPEN_EVERY`].
    fn try_reopen(&mut self) {
        let Some((path, cache_bytes)) = &self.path else {
            return;
        };
        if self
            .last_attempt
            .is_some_and(|t| t.elapsed() < REOPEN_EVERY)
        {
            return;
        }
        self.last_attempt = Some(Instant::now());
        match Database::builder()
            .set_cache_size(*cache_bytes)
            .create(path)
        {
            Ok(db) => {
                drop(self.slot.replace(db));
                self.slot.set_outage(None);
                tracing::info!("storage is writable again");
            }
            Err(e) => tracing::debug!(error = %e, "storage still not writable"),
        }
    }
}

/// An error after which redb refuses everything until reopened.
fn is_io(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Redb(redb::Error::Io(_) | redb::Error::PreviousIo)
    )
}

/// A table of a batch's transaction, opened when an op of the batch first
/// touches it. A turn's commit touches about 8 of the writer's 28 tables;
/// opening all of them for every commit was a table-tree lookup each, and
/// a handle each to close again.
struct Lazy<'t, K: redb::Key + 'static, V: redb::Value + 'static> {
    txn: &'t redb::WriteTransaction,
    def: redb::TableDefinition<'static, K, V>,
    table: Option<redb::Table<'t, K, V>>,
}

impl<'t, K: redb::Key + 'static, V: redb::Value + 'static> Lazy<'t, K, V> {
    fn new(txn: &'t redb::WriteTransaction, def: redb::TableDefinition<'static, K, V>) -> Self {
        Lazy {
            txn,
            def,
            table: None,
        }
    }

    fn open(&mut self) -> Result<&mut redb::Table<'t, K, V>, StoreError> {
        if self.table.is_none() {
            self.table = Some(self.txn.open_table(self.def)?);
        }
        Ok(self.table.as_mut().expect("opened above"))
    }
}

fn commit_batch(
    db: &Database,
    batch: &[WriteRequest],
    durable: bool,
    erased_ids: &erase::ErasedIds,
) -> Result<(), StoreError> {
    let mut txn = db.begin_write()?;
    txn.set_durability(if durable {
        Durability::Immediate
    } else {
        Durability::None
    })?;
    {
        let mut sessions = Lazy::new(&txn, SESSIONS);
        let mut messages = Lazy::new(&txn, MESSAGES);
        let mut calls = Lazy::new(&txn, TOOL_CALLS);
        let mut by_conv = Lazy::new(&txn, TOOL_CALLS_BY_CONVERSATION);
        let mut by_tool = Lazy::new(&txn, TOOL_CALLS_BY_TOOL);
        let mut by_workflow = Lazy::new(&txn, TOOL_CALLS_BY_WORKFLOW);
        let mut stats = Lazy::new(&txn, TOOL_STATS);
        let mut docs = docs::DocTables::new(&txn);
        let mut summaries = Lazy::new(&txn, SUMMARIES);
        let mut session_usage = Lazy::new(&txn, SESSION_USAGE);
        let mut tenant_usage = Lazy::new(&txn, TENANT_USAGE);
        let mut sessions_by_tenant = Lazy::new(&txn, SESSIONS_BY_TENANT);
        let mut calls_by_tenant = Lazy::new(&txn, TOOL_CALLS_BY_TENANT);
        let mut docs_by_tenant = Lazy::new(&txn, DOCS_BY_TENANT);
        let mut doc_tenants = Lazy::new(&txn, DOC_TENANTS);
        let mut docs_by_session = Lazy::new(&txn, DOCS_BY_SESSION);
        let mut doc_sessions = Lazy::new(&txn, DOC_SESSIONS);
        let mut turn_rows = Lazy::new(&txn, TURNS);
        let mut open_turns = Lazy::new(&txn, OPEN_TURNS);
        let mut turn_keys = Lazy::new(&txn, TURN_KEYS);
        let mut meta = Lazy::new(&txn, META);
        let mut idempotency = Lazy::new(&txn, IDEMPOTENCY);
        let mut session_bytes = Lazy::new(&txn, SESSION_BYTES);
        let mut tenant_bytes = Lazy::new(&txn, TENANT_BYTES);
        // Erased by this batch: a later op of the batch is late too.
        let mut erased_now = erase::ErasedIds::default();
        // Turn records a later write of the same turn in this batch replaces.
        let superseded = turns::superseded(batch.iter().flat_map(|r| r.ops.iter()));
        for (i, op) in batch.iter().flat_map(|r| r.ops.iter()).enumerate() {
            if erased_ids.drops(op) || erased_now.drops(op) {
                tracing::debug!("a write under an erased session was dropped");
                continue;
            }
            match op {
                // One node owns every session of a redb file.
                WriteOp::Fence { .. } | WriteOp::FenceRun { .. } => {}
                WriteOp::PutSession(s) => {
                    sessions
                        .open()?
                        .insert(s.id.as_str(), serde_json::to_vec(s)?.as_slice())?;
                    listing::index_session(sessions_by_tenant.open()?, s)?;
                }
                WriteOp::AppendMessages {
                    session_id,
                    messages: msgs,
                } => {
                    let mut bytes = 0u64;
                    for m in msgs {
                        let row = serde_json::to_vec(m)?;
                        bytes += row.len() as u64;
                        messages
                            .open()?
                            .insert((session_id.as_str(), m.seq), codec::pack(row).as_slice())?;
                    }
                    storage::add(
                        sessions.open()?,
                        session_bytes.open()?,
                        tenant_bytes.open()?,
                        session_id,
                        bytes,
                    )?;
                }
                WriteOp::RecordToolCall(rec) => {
                    let id = rec.record_id.as_str();
                    let row = serde_json::to_vec(rec)?;
                    let plain = row.len() as u64;
                    let old = calls
                        .open()?
                        .insert(id, codec::pack(row).as_slice())?
                        .map_or(0, |v| codec::plain_len(v.value()));
                    storage::record_call(tenant_bytes.open()?, rec, plain, old)?;
                    listing::index_call(calls_by_tenant.open()?, rec)?;
                    if let Some(conv) = &rec.conversation_id {
                        by_conv.open()?.insert((conv.as_str(), id), ())?;
                    }
                    by_tool.open()?.insert((rec.tool_name.as_str(), id), ())?;
                    if let Some(wf) = &rec.workflow_id {
                        by_workflow.open()?.insert((wf.as_str(), id), ())?;
                    }
                    // Calls refused by name are recorded but not counted
                    // per tool (their names are anyone's text), nor are held
                    // and declined ones (an approved one counts when its
                    // outcome rewrites its record): `counted_per_tool`.
                    if !rec.counted_per_tool() {
                        continue;
                    }
                    let mut s: ToolStats = match stats.open()?.get(rec.tool_name.as_str())? {
                        Some(v) => crate::store::codec::json(v.value())?,
                        None => ToolStats::default(),
                    };
                    s.total_calls += 1;
                    if rec.is_success {
                        s.successful_calls += 1;
                    } else {
                        s.failed_calls += 1;
                    }
                    s.total_execution_time_ms += rec.execution_time_ms;
                    stats
                        .open()?
                        .insert(rec.tool_name.as_str(), serde_json::to_vec(&s)?.as_slice())?;
                }
                WriteOp::PutDoc {
                    namespace,
                    key,
                    value,
                    tenant,
                } => {
                    docs.insert(namespace, key, serde_json::to_vec(value)?.as_slice())?;
                    if let Some(tenant) = tenant {
                        listing::index_doc(
                            docs_by_tenant.open()?,
                            doc_tenants.open()?,
                            namespace,
                            key,
                            tenant,
                        )?;
                    }
                }
                WriteOp::DeleteDoc { namespace, key } => {
                    docs.remove(namespace, key)?;
                    listing::unindex_doc(
                        docs_by_tenant.open()?,
                        doc_tenants.open()?,
                        namespace,
                        key,
                    )?;
                    erase::unlink_doc(
                        docs_by_session.open()?,
                        doc_sessions.open()?,
                        namespace,
                        key,
                    )?;
                }
                WriteOp::MoveDoc {
                    namespace,
                    key,
                    to_namespace,
                    to_value,
                    moved,
                } => {
                    let old = match docs.remove(namespace, key)? {
                        Some(v) => Some(crate::store::codec::json::<Value>(&v)?),
                        None => None,
                    };
                    if old.is_some() {
                        listing::unindex_doc(
                            docs_by_tenant.open()?,
                            doc_tenants.open()?,
                            namespace,
                            key,
                        )?;
                        docs.insert(to_namespace, key, serde_json::to_vec(to_value)?.as_slice())?;
                        let linked = erase::unlink_doc(
                            docs_by_session.open()?,
                            doc_sessions.open()?,
                            namespace,
                            key,
                        )?;
                        if let Some(session) = linked {
                            erase::link_doc(
                                docs_by_session.open()?,
                                doc_sessions.open()?,
                                to_namespace,
                                key,
                                &session,
                            )?;
                        }
                    }
                    // Assigned, not set once: a batch retried after a failed
                    // commit reports what its own transaction found.
                    *moved.lock().expect("move slot") = old;
                }
                WriteOp::PutSummary {
                    session_id,
                    summary,
                } => {
                    summaries
                        .open()?
                        .insert(session_id.as_str(), serde_json::to_vec(summary)?.as_slice())?;
                }
                WriteOp::RecordUsage(delta) => {
                    match &delta.session_id {
                        // The tenant's totals count it; the session is gone.
                        Some(id) if erased_ids.contains(id) || erased_now.contains(id) => {
                            let tenant_only = UsageDelta {
                                session_id: None,
                                tenant: delta.tenant.clone(),
                                agent: delta.agent.clone(),
                                day: delta.day,
                                usage: delta.usage,
                            };
                            usage::apply(
                                session_usage.open()?,
                                tenant_usage.open()?,
                                &tenant_only,
                            )?;
                        }
                        _ => usage::apply(session_usage.open()?, tenant_usage.open()?, delta)?,
                    }
                }
                WriteOp::DeleteSession { session_id, erased } => {
                    let mut tables = erase::EraseTables {
                        sessions: sessions.open()?,
                        sessions_by_tenant: sessions_by_tenant.open()?,
                        messages: messages.open()?,
                        summaries: summaries.open()?,
                        session_usage: session_usage.open()?,
                        calls: calls.open()?,
                        by_conv: by_conv.open()?,
                        by_tool: by_tool.open()?,
                        by_workflow: by_workflow.open()?,
                        calls_by_tenant: calls_by_tenant.open()?,
                        docs: &mut docs,
                        docs_by_tenant: docs_by_tenant.open()?,
                        doc_tenants: doc_tenants.open()?,
                        docs_by_session: docs_by_session.open()?,
                        doc_sessions: doc_sessions.open()?,
                        turns: turns::TurnTables {
                            turns: turn_rows.open()?,
                            open: open_turns.open()?,
                            keys: turn_keys.open()?,
                        },
                    };
                    let found = erase::delete_session(&mut tables, session_id)?;
                    if let Some(found) = &found {
                        storage::erase(
                            session_bytes.open()?,
                            tenant_bytes.open()?,
                            session_id,
                            &found.tenant,
                        )?;
                        erased_now.remember(session_id.clone());
                    }
                    // Assigned, not set once (see MoveDoc).
                    *erased.lock().expect("erase slot") = found;
                }
                WriteOp::EraseCallsOutsideSessions {
                    tenant,
                    after,
                    erased,
                } => {
                    let mut tables = erase::CallTables {
                        calls: calls.open()?,
                        by_tool: by_tool.open()?,
                        by_workflow: by_workflow.open()?,
                        calls_by_tenant: calls_by_tenant.open()?,
                        tenant_bytes: tenant_bytes.open()?,
                    };
                    let done =
                        erase::erase_calls_outside_sessions(&mut tables, tenant, after.as_deref())?;
                    // Assigned, not set once (see MoveDoc).
                    *erased.lock().expect("erase slot") = Some(done);
                }
                WriteOp::PutTurn(w) if superseded.contains(&i) => {
                    if w.idempotency_key.is_some() {
                        turns::put_key(turn_keys.open()?, w)?;
                    }
                }
                WriteOp::PutTurn(w) => {
                    let mut t = turns::TurnTables {
                        turns: turn_rows.open()?,
                        open: open_turns.open()?,
                        keys: turn_keys.open()?,
                    };
                    turns::put(&mut t, w)?;
                }
                WriteOp::MarkRolledBack { session_id, seqs } => {
                    for seq in seqs {
                        let key = (session_id.as_str(), *seq);
                        let found = messages
                            .open()?
                            .get(key)?
                            .map(|v| crate::store::codec::json::<StoredMessage>(v.value()))
                            .transpose()?;
                        if let Some(mut m) = found {
                            m.rolled_back = true;
                            messages
                                .open()?
                                .insert(key, codec::pack(serde_json::to_vec(&m)?).as_slice())?;
                        }
                    }
                }
                WriteOp::PutDocsOnce {
                    docs: new_docs,
                    session_id,
                } => {
                    let fresh = match new_docs.first() {
                        Some(d) => !docs.contains(&d.namespace, &d.key)?,
                        None => false,
                    };
                    if fresh {
                        for d in new_docs {
                            docs.insert(
                                &d.namespace,
                                &d.key,
                                serde_json::to_vec(&d.value)?.as_slice(),
                            )?;
                            if let Some(tenant) = &d.tenant {
                                listing::index_doc(
                                    docs_by_tenant.open()?,
                                    doc_tenants.open()?,
                                    &d.namespace,
                                    &d.key,
                                    tenant,
                                )?;
                            }
                            if let Some(session_id) = session_id {
                                erase::link_doc(
                                    docs_by_session.open()?,
                                    doc_sessions.open()?,
                                    &d.namespace,
                                    &d.key,
                                    session_id,
                                )?;
                            }
                        }
                    }
                }
                WriteOp::LinkDoc {
                    namespace,
                    key,
                    session_id,
                } => {
                    erase::link_doc(
                        docs_by_session.open()?,
                        doc_sessions.open()?,
                        namespace,
                        key,
                        session_id,
                    )?;
                }
                WriteOp::IndexDocs {
                    namespace,
                    tenant_of,
                    indexed,
                } => {
                    let n = listing::index_namespace(
                        &mut docs,
                        docs_by_tenant.open()?,
                        doc_tenants.open()?,
                        meta.open()?,
                        namespace,
                        *tenant_of,
                    )?;
                    *indexed.lock().expect("index slot") = n;
                }
                WriteOp::PutIdempotency { .. } | WriteOp::DeleteIdempotency { .. } => {
                    idempotency::apply(idempotency.open()?, op)?;
                }
            }
        }
    }
    txn.commit()?;
    Ok(())
}
