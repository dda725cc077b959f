//! The embedded backend: sessions, messages and tool-call records in one
//! redb file, read on blocking threads, written by one writer thread
//! ([`super::writer`]). The default, and the only backend of a single node.
//!
//! Store (facade) ──▶ RedbStore ──read──▶ spawn_blocking read transaction
//!                              ──write──▶ writer thread ──▶ redb

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use jiff::Timestamp;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata};

use serde_json::Value;
use tokio::sync::oneshot;

use super::rows::listed;
use super::tables::*;
use super::write_queue::{self, WriteRequest};
use super::writer::{Slot, Writer};
use super::*;

/// Cheap to clone; every clone talks to the same file and writer thread.
/// When the last clone drops, the writer finishes what is queued and the
/// file is closed before the drop returns, so the same process can reopen it.
#[derive(Clone)]
pub struct RedbStore {
    pub(super) db: Arc<Slot>,
    inner: Arc<Inner>,
}

struct Inner {
    cache: Arc<cache::ReadCache>,
    commit_latency: Arc<crate::metrics::Histogram>,
    writer: Option<write_queue::Sender>,
    thread: Option<std::thread::JoinHandle<()>>,
    path: PathBuf,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.writer.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl RedbStore {
    /// Opens (or creates) `<data_dir>/cadre.redb` with a page cache of
    /// `cache_bytes` and starts its writer thread.
    pub fn open(data_dir: &Path, cache_bytes: usize) -> Result<RedbStore, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|source| StoreError::DataDir {
            path: data_dir.to_path_buf(),
            source,
        })?;
        let path = data_dir.join("cadre.redb");
        let db = Database::builder()
            .set_cache_size(cache_bytes)
            .create(&path)
            .map_err(|source| StoreError::Open {
                path: path.clone(),
                source,
            })?;
        Self::start(db, path, Some(cache_bytes))
    }

    /// Compacts `<data_dir>/cadre.redb` of a stopped server: the pages
    /// deletes freed (a retention sweep, `DELETE /v1/sessions?before=`)
    /// go back to the file system. The file's size before and after;
    /// `None` when the dir holds no store. Refused (`Open`) while a
    /// server holds the file.
    pub fn compact(data_dir: &Path) -> Result<Option<(u64, u64)>, StoreError> {
        let path = data_dir.join("cadre.redb");
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        if !path.exists() {
            return Ok(None);
        }
        let before = size(&path);
        let mut db = Database::open(&path).map_err(|source| StoreError::Open {
            path: path.clone(),
            source,
        })?;
        while db.compact().map_err(redb::Error::from)? {}
        drop(db);
        Ok(Some((before, size(&path))))
    }

    /// A store in memory, gone when dropped: for listings and tests where a
    /// file adds nothing.
    pub fn open_in_memory() -> Result<RedbStore, StoreError> {
        let db = Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .map_err(|source| StoreError::Open {
                path: PathBuf::from(":memory:"),
                source,
            })?;
        Self::start(db, PathBuf::from(":memory:"), None)
    }

    /// `file_cache`: the page cache of a store on a file (its writer
    /// reopens the file with it after an outage); `None` in memory.
    fn start(
        db: Database,
        path: PathBuf,
        file_cache: Option<usize>,
    ) -> Result<RedbStore, StoreError> {
        init_schema(&db)?;
        let db = Arc::new(Slot {
            db: RwLock::new(Arc::new(db)),
            outage: Mutex::new(None),
            generation: AtomicU64::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
        });
        let (tx, rx) = write_queue::channel();
        let cache = Arc::new(cache::ReadCache::new());
        let writer = Writer {
            slot: db.clone(),
            path: file_cache.map(|bytes| (path.clone(), bytes)),
            last_attempt: None,
            cache: cache.clone(),
            erased: erase::ErasedIds::default(),
        };
        let commit_latency = Arc::new(crate::metrics::Histogram::default());
        let latency = commit_latency.clone();
        let thread = std::thread::Builder::new()
            .name("cadre-store-writer".into())
            .spawn(move || writer.run(rx, &latency))
            .expect("spawn the store writer thread");
        Ok(RedbStore {
            db,
            inner: Arc::new(Inner {
                cache,
                commit_latency,
                writer: Some(tx),
                thread: Some(thread),
                path,
            }),
        })
    }

    async fn send(
        &self,
        ops: Vec<WriteOp>,
        durable: bool,
        generation: Option<u64>,
    ) -> Result<(), StoreError> {
        let (done, rx) = oneshot::channel();
        let writer = self.inner.writer.as_ref().ok_or(StoreError::WriterGone)?;
        writer
            .send(WriteRequest {
                ops,
                durable,
                generation,
                behind: false,
                done,
            })
            .map_err(|_| StoreError::WriterGone)?;
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(match &*e {
                StoreError::Unavailable { since, reason } => StoreError::Unavailable {
                    since: *since,
                    reason: reason.clone(),
                },
                StoreError::Reopened { loaded, now } => StoreError::Reopened {
                    loaded: *loaded,
                    now: *now,
                },
                StoreError::Closed => StoreError::Closed,
                _ => StoreError::CommitFailed(e),
            }),
            Err(_) => Err(StoreError::WriterGone),
        }
    }

    fn send_behind(&self, ops: Vec<WriteOp>, generation: Option<u64>) {
        if ops.is_empty() {
            return;
        }
        let (done, _) = oneshot::channel();
        if let Some(writer) = self.inner.writer.as_ref() {
            let _ = writer.send(WriteRequest {
                ops,
                durable: false,
                generation,
                behind: true,
                done,
            });
        }
    }

    pub(super) async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Database) -> Result<T, StoreError> + Send + 'static,
    {
        let db = self.db.current();
        tokio::task::spawn_blocking(move || f(&db))
            .await
            .map_err(|_| StoreError::WriterGone)?
    }
}

#[async_trait::async_trait]
impl Writes for RedbStore {
    fn backend_name(&self) -> &'static str {
        "redb"
    }

    fn path(&self) -> &Path {
        &self.inner.path
    }

    /// How long the writer's commits take (each may carry many callers' writes).
    fn commit_latency(&self) -> &crate::metrics::Histogram {
        &self.inner.commit_latency
    }

    /// Whether writes are accepted now.
    fn health(&self) -> StoreHealth {
        match self.db.outage() {
            None => StoreHealth::Ok,
            Some((since, reason)) => StoreHealth::Degraded {
                since,
                reason: reason.to_string(),
            },
        }
    }

    /// Refuses every later write with [`StoreError::Closed`]; flushes still
    /// pass. For shutdown: work cut off by the deadline stores nothing more.
    fn close_writes(&self) {
        self.db.closed.store(true, Ordering::Release);
    }

    /// How many times the file was reopened after a failure.
    fn generation(&self) -> u64 {
        self.db.generation.load(Ordering::Acquire)
    }

    /// Applies `ops` in one transaction (possibly shared with other callers').
    /// With `durable`, returns only after the data is on disk.
    async fn write(&self, ops: Vec<WriteOp>, durable: bool) -> Result<(), StoreError> {
        self.send(ops, durable, None).await
    }

    /// [`Self::write`], refused with [`StoreError::Reopened`] unless the
    /// store is still at `generation` (what the caller's state was loaded at).
    async fn write_at(
        &self,
        generation: u64,
        ops: Vec<WriteOp>,
        durable: bool,
    ) -> Result<(), StoreError> {
        self.send(ops, durable, Some(generation)).await
    }

    /// Queues `ops` for the next commit, not durable, without waiting for
    /// it: writes are applied in the order they were sent, so a later
    /// [`Self::write`] that succeeds has them in the store too (short of a
    /// failure, which the writer logs; an I/O failure makes the later write
    /// fail as well).
    fn write_behind(&self, ops: Vec<WriteOp>) {
        self.send_behind(ops, None);
    }

    /// [`Self::write_behind`], refused unless the store is still at
    /// `generation` (see [`Self::write_at`]); so is the caller's later
    /// `write_at`, which is how it learns.
    fn write_behind_at(&self, generation: u64, ops: Vec<WriteOp>) {
        self.send_behind(ops, Some(generation));
    }
}

#[async_trait::async_trait]
impl SessionReads for RedbStore {
    /// Every session (ids are time-ordered, so oldest first).
    async fn list_sessions(&self) -> Result<Vec<Session>, StoreError> {
        self.read(|db| {
            let txn = db.begin_read()?;
            let table = txn.open_table(SESSIONS)?;
            let mut out = Vec::new();
            for row in table.iter()? {
                let (k, v) = row?;
                out.extend(listed(v.value(), "sessions", k.value()));
            }
            Ok(out)
        })
        .await
    }

    /// A page of `tenant`'s sessions `filter` keeps, past the session id
    /// `cursor` in its order: reads only that tenant's index range.
    async fn sessions_matching(
        &self,
        tenant: &str,
        filter: SessionFilter,
        cursor: Option<String>,
        limit: usize,
    ) -> Result<Page<Session>, StoreError> {
        let tenant = tenant.to_string();
        self.read(move |db| listing::sessions_page(db, &tenant, &filter, cursor.as_deref(), limit))
            .await
    }

    async fn get_session(&self, id: &str) -> Result<Option<Session>, StoreError> {
        let cache = &self.inner.cache;
        let seen = cache.generation();
        if let Some(s) = cache.session(id) {
            return Ok(Some(s));
        }
        let id = id.to_string();
        let found: Option<Session> = self
            .read(move |db| {
                let txn = db.begin_read()?;
                let table = txn.open_table(SESSIONS)?;
                match table.get(id.as_str())? {
                    Some(v) => Ok(Some(crate::store::codec::json(v.value())?)),
                    None => Ok(None),
                }
            })
            .await?;
        if let Some(s) = &found {
            cache.put_session(seen, s);
        }
        Ok(found)
    }

    async fn get_summary(&self, session_id: &str) -> Result<Option<StoredSummary>, StoreError> {
        let id = session_id.to_string();
        self.read(move |db| {
            let txn = db.begin_read()?;
            let table = txn.open_table(SUMMARIES)?;
            match table.get(id.as_str())? {
                Some(v) => Ok(Some(crate::store::codec::json(v.value())?)),
                None => Ok(None),
            }
        })
        .await
    }

    /// The messages a conversation needs in memory: those after `after`
    /// (what the summary covers), at most the last `max`, oldest first;
    /// and the session's last seq.
    async fn unsummarised_messages(
        &self,
        session_id: &str,
        after: u64,
        max: usize,
    ) -> Result<(Vec<StoredMessage>, u64), StoreError> {
        let id = session_id.to_string();
        self.read(move |db| {
            let txn = db.begin_read()?;
            let table = txn.open_table(MESSAGES)?;
            let last_seq = table
                .range((id.as_str(), 1)..=(id.as_str(), u64::MAX))?
                .next_back()
                .transpose()?
                .map_or(0, |(k, _)| k.value().1);
            let mut out = Vec::new();
            for row in table
                .range((id.as_str(), after + 1)..=(id.as_str(), u64::MAX))?
                .rev()
                .take(max)
            {
                let (_, v) = row?;
                out.push(crate::store::codec::json::<StoredMessage>(v.value())?);
            }
            out.reverse();
            Ok((out, last_seq))
        })
        .await
    }

    /// At most `limit` messages with seq > `after`, oldest first.
    async fn messages_page(
        &self,
        session_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        let id = session_id.to_string();
        self.read(move |db| {
            let txn = db.begin_read()?;
            let table = txn.open_table(MESSAGES)?;
            let mut out = Vec::new();
            for row in table
                .range((id.as_str(), after.saturating_add(1))..=(id.as_str(), u64::MAX))?
                .take(limit)
            {
                let (_, v) = row?;
                out.push(crate::store::codec::json(v.value())?);
            }
            Ok(out)
        })
        .await
    }

    /// Messages with seq > `after`, oldest first.
    async fn messages_after(
        &self,
        session_id: &str,
        after: u64,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        let id = session_id.to_string();
        self.read(move |db| {
            let txn = db.begin_read()?;
            let table = txn.open_table(MESSAGES)?;
            let mut out = Vec::new();
            for row in table.range((id.as_str(), after + 1)..=(id.as_str(), u64::MAX))? {
                let (_, v) = row?;
                out.push(crate::store::codec::json(v.value())?);
            }
            Ok(out)
        })
        .await
    }

    /// The last `n` messages of a session (oldest first) and the session's last seq.
    async fn recent_messages(
        &self,
        session_id: &str,
        n: usize,
    ) -> Result<(Vec<StoredMessage>, u64), StoreError> {
        let id = session_id.to_string();
        self.read(move |db| {
            let txn = db.begin_read()?;
            let table = txn.open_table(MESSAGES)?;
            let mut out = Vec::new();
            let mut last_seq = 0;
            for row in table
                .range((id.as_str(), 1)..=(id.as_str(), u64::MAX))?
                .rev()
            {
                let (k, v) = row?;
                last_seq = last_seq.max(k.value().1);
                if out.len() == n {
                    break;
                }
                out.push(crate::store::codec::json::<StoredMessage>(v.value())?);
            }
            out.reverse();
            Ok((out, last_seq))
        })
        .await
    }

    /// How many messages a session has, how many from the user, and when the last was written.
    async fn message_stats(&self, session_id: &str) -> Result<MessageStats, StoreError> {
        let id = session_id.to_string();
        self.read(move |db| {
            let txn = db.begin_read()?;
            let table = txn.open_table(MESSAGES)?;
            let mut stats = MessageStats::default();
            for row in table.range((id.as_str(), 1)..=(id.as_str(), u64::MAX))? {
                let (_, v) = row?;
                let m: StoredMessage = crate::store::codec::json(v.value())?;
                stats.count += 1;
                if m.message.role == crate::model::Role::User {
                    stats.user_messages += 1;
                }
                stats.last_at = Some(m.created_at);
            }
            Ok(stats)
        })
        .await
    }

    async fn message_count(&self, session_id: &str) -> Result<u64, StoreError> {
        let id = session_id.to_string();
        self.read(move |db| {
            let txn = db.begin_read()?;
            let table = txn.open_table(MESSAGES)?;
            let mut n = 0;
            for row in table.range((id.as_str(), 1)..=(id.as_str(), u64::MAX))? {
                row?;
                n += 1;
            }
            Ok(n)
        })
        .await
    }

    /// Up to `limit` sessions of every tenant after the id `after` (by id:
    /// oldest first for UUID v7 ids), each with when it was last active
    /// (its last message, else its creation): what the retention sweep
    /// reads, one bounded page per sweep.
    async fn sessions_with_activity(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<(Session, Timestamp)>, StoreError> {
        self.read(move |db| {
            let txn = db.begin_read()?;
            let sessions = txn.open_table(SESSIONS)?;
            let messages = txn.open_table(MESSAGES)?;
            let lower = match &after {
                Some(a) => std::ops::Bound::Excluded(a.as_str()),
                None => std::ops::Bound::Unbounded,
            };
            let mut out = Vec::new();
            for row in sessions
                .range::<&str>((lower, std::ops::Bound::Unbounded))?
                .take(limit)
            {
                let (_, v) = row?;
                let s: Session = crate::store::codec::json(v.value())?;
                let last = messages
                    .range((s.id.as_str(), 0)..=(s.id.as_str(), u64::MAX))?
                    .next_back()
                    .transpose()?;
                let at = match last {
                    Some((_, m)) => {
                        crate::store::codec::json::<StoredMessage>(m.value())?.created_at
                    }
                    None => s.created_at,
                };
                out.push((s, at));
            }
            Ok(out)
        })
        .await
    }
}

#[async_trait::async_trait]
impl CallReads for RedbStore {
    /// A page of `tenant`'s call records matching `filter` (its `tenant`
    /// and `limit` are ignored) before the record id `before`, newest first:
    /// reads only that tenant's index range.
    async fn calls_of(
        &self,
        tenant: &str,
        filter: CallFilter,
        before: Option<String>,
        limit: usize,
    ) -> Result<Page<ToolCallRecord>, StoreError> {
        let tenant = tenant.to_string();
        self.read(move |db| listing::calls_page(db, &tenant, &filter, before.as_deref(), limit))
            .await
    }

    /// The records with these ids that exist: one read transaction.
    async fn calls_by_id(&self, ids: Vec<String>) -> Result<Vec<ToolCallRecord>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.read(move |db| {
            let txn = db.begin_read()?;
            let records = txn.open_table(TOOL_CALLS)?;
            let mut out = Vec::with_capacity(ids.len());
            for id in &ids {
                if let Some(v) = records.get(id.as_str())?
                    && let Some(r) = listed::<ToolCallRecord>(v.value(), "tool_calls", id)
                {
                    out.push(r);
                }
            }
            Ok(out)
        })
        .await
    }

    /// Call records matching the filter, newest first, at most `limit`
    /// (all when 0). With several fields set, a record must match them all;
    /// the most selective index is scanned (workflow, conversation, tool).
    async fn calls(&self, filter: CallFilter) -> Result<Vec<ToolCallRecord>, StoreError> {
        self.read(move |db| {
            let txn = db.begin_read()?;
            let records = txn.open_table(TOOL_CALLS)?;
            let limit = if filter.limit == 0 {
                usize::MAX
            } else {
                filter.limit
            };
            let keep = |r: &ToolCallRecord| {
                filter
                    .tenant
                    .as_ref()
                    .is_none_or(|t| r.tenant.as_ref() == Some(t))
                    && filter.tool.as_ref().is_none_or(|t| &r.tool_name == t)
                    && filter
                        .conversation_id
                        .as_ref()
                        .is_none_or(|c| r.conversation_id.as_ref() == Some(c))
                    && filter
                        .workflow_id
                        .as_ref()
                        .is_none_or(|w| r.workflow_id.as_ref() == Some(w))
            };
            let mut out = Vec::new();
            let index = match (&filter.workflow_id, &filter.conversation_id, &filter.tool) {
                (Some(w), _, _) => Some((txn.open_table(TOOL_CALLS_BY_WORKFLOW)?, w.clone())),
                (None, Some(c), _) => {
                    Some((txn.open_table(TOOL_CALLS_BY_CONVERSATION)?, c.clone()))
                }
                (None, None, Some(t)) => Some((txn.open_table(TOOL_CALLS_BY_TOOL)?, t.clone())),
                _ => None,
            };
            match index {
                Some((index, key)) => {
                    for row in index
                        .range((key.as_str(), "")..(key.as_str(), "\u{10FFFF}"))?
                        .rev()
                    {
                        let (k, _) = row?;
                        if let Some(v) = records.get(k.value().1)?
                            && let Some(r) =
                                listed::<ToolCallRecord>(v.value(), "tool_calls", k.value().1)
                            && keep(&r)
                        {
                            out.push(r);
                            if out.len() >= limit {
                                break;
                            }
                        }
                    }
                }
                None => {
                    for row in records.iter()?.rev() {
                        let (k, v) = row?;
                        let Some(r) = listed::<ToolCallRecord>(v.value(), "tool_calls", k.value())
                        else {
                            continue;
                        };
                        if keep(&r) {
                            out.push(r);
                            if out.len() >= limit {
                                break;
                            }
                        }
                    }
                }
            }
            Ok(out)
        })
        .await
    }

    /// Counters of every tool, by name.
    async fn all_tool_stats(&self) -> Result<Vec<(String, ToolStats)>, StoreError> {
        self.read(|db| {
            let txn = db.begin_read()?;
            let table = txn.open_table(TOOL_STATS)?;
            let mut out = Vec::new();
            for row in table.iter()? {
                let (k, v) = row?;
                out.push((k.value().to_string(), crate::store::codec::json(v.value())?));
            }
            Ok(out)
        })
        .await
    }

    async fn tool_stats(&self, tool: &str) -> Result<ToolStats, StoreError> {
        let tool = tool.to_string();
        self.read(move |db| {
            let txn = db.begin_read()?;
            let table = txn.open_table(TOOL_STATS)?;
            match table.get(tool.as_str())? {
                Some(v) => Ok(crate::store::codec::json(v.value())?),
                None => Ok(ToolStats::default()),
            }
        })
        .await
    }

    async fn record_count(&self) -> Result<u64, StoreError> {
        self.read(|db| Ok(db.begin_read()?.open_table(TOOL_CALLS)?.len()?))
            .await
    }
}

#[async_trait::async_trait]
impl DocReads for RedbStore {
    /// A document of a namespace, if present.
    async fn get_doc(&self, namespace: &str, key: &str) -> Result<Option<Value>, StoreError> {
        let cache = &self.inner.cache;
        let seen = cache.generation();
        if let Some(doc) = cache.doc(namespace, key) {
            return Ok(doc);
        }
        let (ns, k) = (namespace.to_string(), key.to_string());
        let found = self
            .read(move |db| {
                let txn = db.begin_read()?;
                let table = docs::DocsRead::open(&txn, &ns)?;
                match table.get(&ns, &k)? {
                    Some(v) => Ok(Some(crate::store::codec::json(&v)?)),
                    None => Ok(None),
                }
            })
            .await?;
        cache.put_doc(seen, namespace, key, &found);
        Ok(found)
    }

    /// Every document of a namespace whose key starts with `prefix`, by key.
    async fn list_docs(
        &self,
        namespace: &str,
        prefix: &str,
    ) -> Result<Vec<(String, Value)>, StoreError> {
        let (ns, prefix) = (namespace.to_string(), prefix.to_string());
        self.read(move |db| {
            let txn = db.begin_read()?;
            let table = docs::DocsRead::open(&txn, &ns)?;
            let mut out = Vec::new();
            for (key, v) in table.with_prefix(&ns, &prefix)? {
                if let Some(value) = listed(&v, &ns, &key) {
                    out.push((key, value));
                }
            }
            Ok(out)
        })
        .await
    }

    /// Indexes by tenant the documents of `namespace` written before
    /// [`tables::DOCS_BY_TENANT`] existed, reading each one's tenant with
    /// `tenant_of`. Once per namespace (later calls return `None`), durably;
    /// call it at startup, before serving listings of the namespace.
    async fn index_docs(
        &self,
        namespace: &str,
        tenant_of: TenantOf,
    ) -> Result<Option<u64>, StoreError> {
        let indexed = Arc::new(Mutex::new(None));
        let op = WriteOp::IndexDocs {
            namespace: namespace.into(),
            tenant_of,
            indexed: indexed.clone(),
        };
        let started = Instant::now();
        self.write(vec![op], true).await?;
        let n = indexed.lock().expect("index slot").take();
        if let Some(n) = n {
            tracing::info!(
                namespace,
                documents = n,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "indexed documents by tenant"
            );
        }
        Ok(n)
    }

    /// A page of `tenant`'s documents of `namespace` past `cursor` (a key
    /// of the previous page), by key, descending with `newest_first`.
    async fn docs_of(
        &self,
        namespace: &str,
        tenant: &str,
        cursor: Option<String>,
        limit: usize,
        newest_first: bool,
    ) -> Result<Page<(String, Value)>, StoreError> {
        let (ns, tenant) = (namespace.to_string(), tenant.to_string());
        self.read(move |db| {
            listing::docs_page(db, &ns, &tenant, cursor.as_deref(), limit, newest_first)
        })
        .await
    }
}

fn init_schema(db: &Database) -> Result<(), StoreError> {
    let txn = db.begin_write()?;
    {
        let mut meta = txn.open_table(META)?;
        let found = meta.get("schema_version")?.map(|v| v.value());
        match found {
            Some(v @ (1..=4)) => {
                let started = Instant::now();
                if v == 1 {
                    let (sessions, calls) = listing::migrate_v1(&txn)?;
                    tracing::info!(
                        sessions,
                        calls,
                        "store migrated to schema 2: sessions and calls indexed by tenant"
                    );
                }
                if v <= 2 {
                    let documents = docs::migrate_v2(&txn)?;
                    tracing::info!(
                        documents,
                        "store migrated to schema 3: confirmations, tenant configs, API keys and workflow runs in tables of their own"
                    );
                }
                if v <= 3 {
                    let bytes = storage::migrate_v3(&txn)?;
                    tracing::info!(
                        bytes,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "store migrated to schema 4: stored message bytes counted per session and tenant"
                    );
                }
                let bytes = storage::migrate_v4(&txn)?;
                meta.insert("schema_version", SCHEMA_VERSION)?;
                tracing::info!(
                    bytes,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "store migrated to schema 5: call records outside sessions counted in their tenant's stored bytes"
                );
            }
            Some(v) if v != SCHEMA_VERSION => {
                return Err(StoreError::SchemaMismatch {
                    found: v,
                    expected: SCHEMA_VERSION,
                });
            }
            Some(_) => {}
            None => {
                meta.insert("schema_version", SCHEMA_VERSION)?;
            }
        }
        // Create every table so read transactions never meet a missing one.
        txn.open_table(SESSIONS)?;
        txn.open_table(MESSAGES)?;
        txn.open_table(SUMMARIES)?;
        txn.open_table(TOOL_CALLS)?;
        txn.open_table(TOOL_CALLS_BY_CONVERSATION)?;
        txn.open_table(TOOL_CALLS_BY_TOOL)?;
        txn.open_table(TOOL_CALLS_BY_WORKFLOW)?;
        txn.open_table(TOOL_STATS)?;
        txn.open_table(DOCS)?;
        for t in &OWN_TABLES {
            txn.open_table(t.table)?;
        }
        txn.open_table(SESSION_USAGE)?;
        txn.open_table(TENANT_USAGE)?;
        txn.open_table(SESSION_BYTES)?;
        txn.open_table(TENANT_BYTES)?;
        txn.open_table(SESSIONS_BY_TENANT)?;
        txn.open_table(TOOL_CALLS_BY_TENANT)?;
        txn.open_table(DOCS_BY_TENANT)?;
        txn.open_table(DOC_TENANTS)?;
        txn.open_table(DOCS_BY_SESSION)?;
        txn.open_table(DOC_SESSIONS)?;
        txn.open_table(TURNS)?;
        txn.open_table(OPEN_TURNS)?;
        txn.open_table(TURN_KEYS)?;
        txn.open_table(IDEMPOTENCY)?;
    }
    txn.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Plan;
    use crate::model::ChatMessage;
    use crate::store::Store;
    use std::time::Duration;

    fn msg(seq: u64, text: &str) -> StoredMessage {
        StoredMessage {
            seq,
            message: ChatMessage::user(text),
            created_at: Timestamp::now(),
            rolled_back: false,
        }
    }

    /// A commit holding several records of one turn (its steps sent
    /// behind, then its end) leaves what applying each would: the last
    /// record, the last open/closed state, every idempotency key; and the
    /// turns of other sessions in the same commit untouched.
    #[tokio::test]
    async fn a_turn_written_three_times_in_one_commit_leaves_its_last_record() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let put = |session: &str, turn: &str, phase: &str, open: bool, key: Option<&str>| {
            WriteOp::PutTurn(Box::new(crate::store::turns::TurnWrite {
                session_id: session.into(),
                turn_id: turn.into(),
                open,
                idempotency_key: key.map(Into::into),
                record: serde_json::json!({"phase": phase}),
            }))
        };
        store
            .write(
                vec![
                    put("s", "t1", "awaiting_model", true, Some("k-start")),
                    put("other", "t9", "awaiting_model", true, None),
                    put("s", "t1", "awaiting_tools", true, Some("k-start")),
                    put("s", "t1", "completed", false, Some("k-end")),
                    put("s", "t2", "awaiting_model", true, None),
                    put("s", "t2", "awaiting_tools", true, None),
                ],
                true,
            )
            .await
            .unwrap();
        let phase = |v: Option<Value>| v.unwrap()["phase"].as_str().unwrap().to_string();
        assert_eq!(phase(store.turn("s", "t1").await.unwrap()), "completed");
        assert_eq!(
            phase(store.turn("s", "t2").await.unwrap()),
            "awaiting_tools"
        );
        assert_eq!(
            phase(store.turn("other", "t9").await.unwrap()),
            "awaiting_model"
        );
        let mut open = store.open_turns().await.unwrap();
        open.sort();
        assert_eq!(
            open,
            [
                ("other".to_string(), "t9".to_string()),
                ("s".to_string(), "t2".to_string())
            ]
        );
        for key in ["k-start", "k-end"] {
            assert_eq!(
                store.turn_by_key("s", key).await.unwrap().as_deref(),
                Some("t1")
            );
        }
    }

    #[tokio::test]
    async fn messages_come_back_in_order_per_session_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store
                .write(
                    vec![
                        WriteOp::AppendMessages {
                            session_id: "a".into(),
                            messages: vec![msg(1, "one"), msg(2, "two")],
                        },
                        WriteOp::AppendMessages {
                            session_id: "b".into(),
                            messages: vec![msg(1, "other")],
                        },
                    ],
                    false,
                )
                .await
                .unwrap();
            store.flush().await.unwrap();
            let (recent, last) = store.recent_messages("a", 1).await.unwrap();
            assert_eq!(last, 2);
            assert_eq!(recent[0].message.content.as_deref(), Some("two"));
        }
        // Dropping the last clone closed the file: it reopens at once.
        let store = Store::open(dir.path()).unwrap();
        let all = store.messages("a").await.unwrap();
        let texts: Vec<_> = all
            .iter()
            .map(|m| m.message.content.clone().unwrap())
            .collect();
        assert_eq!(texts, ["one", "two"]);
        assert_eq!(store.message_count("b").await.unwrap(), 1);
        assert_eq!(store.message_count("missing").await.unwrap(), 0);
    }

    #[tokio::test]
    async fn cached_reads_see_every_acknowledged_write() {
        let store = Store::open_in_memory().unwrap();
        let mut session = Session {
            id: "s".into(),
            tenant: "t".into(),
            agent: "a".into(),
            user_id: None,
            plan: Plan::Free,
            metadata: serde_json::json!({"v": 1}),
            created_at: Timestamp::now(),
            forked_from: None,
        };
        assert_eq!(store.get_session("s").await.unwrap(), None);
        store
            .write(vec![WriteOp::PutSession(session.clone())], false)
            .await
            .unwrap();
        assert_eq!(
            store.get_session("s").await.unwrap().unwrap().metadata["v"],
            1
        );
        session.metadata["v"] = 2.into();
        store
            .write(vec![WriteOp::PutSession(session.clone())], false)
            .await
            .unwrap();
        assert_eq!(
            store.get_session("s").await.unwrap().unwrap().metadata["v"],
            2
        );

        assert_eq!(
            store.get_doc("ns", "k").await.unwrap(),
            None,
            "absent, cached"
        );
        let put = WriteOp::PutDoc {
            namespace: "ns".into(),
            key: "k".into(),
            value: 1.into(),
            tenant: None,
        };
        store.write(vec![put], false).await.unwrap();
        assert_eq!(store.get_doc("ns", "k").await.unwrap(), Some(1.into()));
        store.delete_doc("ns", "k", false).await.unwrap();
        assert_eq!(store.get_doc("ns", "k").await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_read_that_raced_a_write_does_not_cache_the_old_value() {
        let store = RedbStore::open_in_memory().unwrap();
        let cache = &store.inner.cache;
        let put = WriteOp::PutDoc {
            namespace: "ns".into(),
            key: "k".into(),
            value: 1.into(),
            tenant: None,
        };
        store.write(vec![put], false).await.unwrap();
        // A reader took the generation and read 1; a write of 2 commits
        // before the reader puts what it read.
        let seen = cache.generation();
        let put = WriteOp::PutDoc {
            namespace: "ns".into(),
            key: "k".into(),
            value: 2.into(),
            tenant: None,
        };
        store.write(vec![put], false).await.unwrap();
        cache.put_doc(seen, "ns", "k", &Some(1.into()));
        assert_eq!(store.get_doc("ns", "k").await.unwrap(), Some(2.into()));
    }

    #[tokio::test]
    async fn writes_under_an_erased_session_are_dropped() {
        let store = Store::open_in_memory().unwrap();
        let session = Session {
            id: "s".into(),
            tenant: "t".into(),
            agent: "a".into(),
            user_id: None,
            plan: Plan::Free,
            metadata: Value::Null,
            created_at: Timestamp::now(),
            forked_from: None,
        };
        let append = |seq: u64| WriteOp::AppendMessages {
            session_id: "s".into(),
            messages: vec![msg(seq, "hi")],
        };
        let put = WriteOp::PutSession(session.clone());
        store.write(vec![put, append(1)], false).await.unwrap();
        assert_eq!(store.erase_session("s").await.unwrap().unwrap().messages, 1);
        assert_eq!(store.erase_session("s").await.unwrap(), None);

        // What a late writer sends (an approved call, an operator's
        // assignment, a turn's step) stores nothing under the id.
        let record = ToolCallRecord {
            guardrails: Vec::new(),
            cached: false,
            record_id: "r".into(),
            tool_name: "echo".into(),
            tool_call_id: None,
            params: Value::Null,
            output: None,
            is_success: true,
            error: None,
            error_type: None,
            execution_time_ms: 1,
            attempts: 1,
            caller_id: "s".into(),
            caller_type: "conversation_agent".into(),
            conversation_id: Some("s".into()),
            workflow_id: None,
            user_id: None,
            tenant: Some("t".into()),
            created_at: Timestamp::now(),
            started_at: None,
            source_id: None,
            turn_id: None,
        };
        let usage = WriteOp::RecordUsage(UsageDelta {
            session_id: Some("s".into()),
            tenant: "t".into(),
            agent: "a".into(),
            day: usage::day_of(Timestamp::now()),
            usage: TokenUsage::call(3, 4),
        });
        let ops = vec![
            WriteOp::PutSession(session),
            append(2),
            WriteOp::RecordToolCall(Box::new(record)),
            usage,
        ];
        store.write(ops, false).await.unwrap();
        assert_eq!(store.get_session("s").await.unwrap(), None);
        assert_eq!(store.message_count("s").await.unwrap(), 0);
        assert_eq!(store.record_count().await.unwrap(), 0);
        assert!(store.session_usage("s").await.unwrap().is_empty());
        // The tenant's totals still count the tokens.
        let day = usage::day_of(Timestamp::now());
        assert_eq!(
            store
                .tenant_usage("t", day, day)
                .await
                .unwrap()
                .total_tokens,
            7
        );

        // A late write in the very batch of the erase, after it.
        let other = Session {
            id: "u".into(),
            tenant: "t".into(),
            agent: "a".into(),
            user_id: None,
            plan: Plan::Free,
            metadata: Value::Null,
            created_at: Timestamp::now(),
            forked_from: None,
        };
        store
            .write(vec![WriteOp::PutSession(other)], false)
            .await
            .unwrap();
        let erased = Arc::new(Mutex::new(None));
        let ops = vec![
            WriteOp::DeleteSession {
                session_id: "u".into(),
                erased: erased.clone(),
            },
            WriteOp::AppendMessages {
                session_id: "u".into(),
                messages: vec![msg(1, "late")],
            },
        ];
        store.write(ops, false).await.unwrap();
        assert!(erased.lock().unwrap().is_some());
        assert_eq!(store.message_count("u").await.unwrap(), 0);
    }

    #[tokio::test]
    async fn writes_sent_behind_land_before_a_later_write_and_alone_within_the_hold() {
        let store = Store::open_in_memory().unwrap();
        let append = |seq: u64, text: &str| WriteOp::AppendMessages {
            session_id: "s".into(),
            messages: vec![msg(seq, text)],
        };
        store.write_behind(vec![append(1, "one")]);
        store.write_behind(vec![append(2, "two")]);
        store.write(vec![append(3, "three")], true).await.unwrap();
        assert_eq!(
            store.message_count("s").await.unwrap(),
            3,
            "in the same commit"
        );

        store.write_behind(vec![append(4, "four")]);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while store.message_count("s").await.unwrap() < 4 {
            assert!(
                std::time::Instant::now() < deadline,
                "never committed alone"
            );
            tokio::time::sleep(HOLD_BEHIND / 5).await;
        }
    }
}
