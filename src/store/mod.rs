//! Store: sessions, messages, tool-call records, turns and documents,
//! behind one handle with two backends.
//!
//! conversation / executor / http ──▶ Store (this facade) ──▶ RedbStore   (embedded, default)
//!                                                         └─▶ PgStore     (cluster mode)
//!
//! Every caller holds a [`Store`] and never knows which backend serves it:
//! the facade forwards each method to the backend, one line each
//! ([`on_backend!`]). The rows both read and write are in [`rows`], the
//! errors in [`error`], the redb layout in [`tables`].
//!
//! **Ownership (cluster mode).** With several nodes on one database, a
//! session has one writer: the node that [`Store::claim_session`]ed it,
//! at an *epoch* the claim returns. A writer puts [`WriteOp::Fence`] in
//! each request; a request whose epoch is no longer the session's is
//! refused whole with [`StoreError::Fenced`] (the fencing-token rule), so a
//! node that lost a session — paused, partitioned, misrouted — cannot
//! write, and drops its state. Workflow runs follow the same rule keyed by
//! run id ([`Store::claim_run`], [`WriteOp::FenceRun`]). The embedded
//! backend has one node: a claim always succeeds at epoch 0 and a fence
//! always passes ([`owners`]).
//!
//! What follows is the embedded backend's contract, which the PostgreSQL
//! backend keeps (its own doc says how):
//!
//! conversation / executor ──write(ops, durable)──▶ writer thread ──▶ redb
//!                          ◀──────── Ok once committed ──────────┘
//! http / conversation ──read──▶ spawn_blocking read transaction
//!
//! One writer thread owns every write transaction and batches whatever is
//! queued into one commit (group commit). A batch commits with
//! `Durability::Immediate` (an fsync) when any request in it asked for
//! durability, else with `Durability::None`; an immediate commit also makes the
//! earlier non-durable ones durable. Writes sent behind
//! ([`Store::write_behind`]: nobody waits for them) are held up to
//! [`HOLD_BEHIND`] and go into the next commit someone waits for, in the
//! order sent. A turn therefore sends its steps and call records behind and
//! pays one commit, with one fsync, before it is acknowledged.
//! Readers use their own read transactions on blocking threads and never wait
//! for the writer. Sessions and documents, read on every turn, are served
//! from a read cache the writer invalidates ([`cache`]). Token usage is
//! counted by increments the writer applies in the same batches ([`usage`]).
//! Listings read a tenant-first index written in the same transaction as
//! the rows it lists, one page at a time ([`listing`]). Erasing a session
//! removes every row under its id in one transaction ([`erase`]).
//! Owns: the file layout ([`tables`]). Does not: decide what to write.
//!
//! Storage faults (disk full, EIO, a file size limit): a commit that fails
//! with an I/O error leaves redb refusing every later operation until the
//! file is reopened. The writer then swaps the failed `Database` for a
//! read-only view of the file ([`read_view`]): reads keep working, every
//! write is refused at once with [`StoreError::Unavailable`] (HTTP 503), and
//! [`Store::health`] reports the outage. It tries to reopen the file for
//! writing every [`REOPEN_EVERY`] (and on the next write after that); once
//! that works, writes are accepted again, with no restart. What a failed
//! commit carried was never acknowledged, and neither is anything a
//! non-durable commit had left unsynced: reopening goes back to the last
//! durable commit. The store's *generation* counts these reopens; a writer
//! that holds state derived from earlier writes (a conversation) passes the
//! generation it loaded at ([`Store::write_at`]) and is refused after a
//! reopen, so it reloads instead of writing on top of steps that were lost.

mod cache;
mod docs;
pub mod embedded;
pub mod erase;
pub mod error;
pub mod idempotency;
pub mod listing;
pub mod owners;
pub mod postgres;
mod read_view;
pub mod rows;
pub mod tables;
pub mod turns;
pub mod usage;
mod write_queue;
mod writer;

use std::path::Path;
use std::sync::{Arc, Mutex};

use jiff::Timestamp;
use jiff::civil::Date;
use serde_json::Value;

pub use embedded::RedbStore;
pub use erase::Erased;
pub use error::{StoreError, StoreHealth};
use idempotency::IdempotencyRecord;
pub use listing::Page;
pub use owners::{Claim, NodeIdentity, NodeRow, RunOwner};
pub use postgres::PgStore;
pub use rows::*;
pub use usage::{TokenUsage, UsageDelta, UsageRow};

/// Requests the writer drains into one transaction at most.
const MAX_BATCH: usize = 1024;

/// How often the writer tries to reopen the file while writes fail.
pub const REOPEN_EVERY: std::time::Duration = std::time::Duration::from_millis(500);
/// Longest a write sent behind ([`Store::write_behind`]) waits for company
/// before the writer commits it alone.
pub const HOLD_BEHIND: std::time::Duration = std::time::Duration::from_millis(5);

/// Cheap to clone; every clone talks to the same backend (for redb: the
/// same file and writer thread; when the last clone drops, the writer
/// finishes what is queued and the file is closed before the drop returns,
/// so the same process can reopen it).
#[derive(Clone)]
pub struct Store {
    backend: Backend,
}

#[derive(Clone)]
enum Backend {
    Redb(RedbStore),
    Postgres(PgStore),
}

/// `on_backend!(self, s => s.method(args))`: the one place that knows the
/// backends; each facade method is one call through it.
macro_rules! on_backend {
    ($self:ident, $s:ident => $e:expr) => {
        match &$self.backend {
            Backend::Redb($s) => $e,
            Backend::Postgres($s) => $e,
        }
    };
}

/// MiB of redb's page cache unless `[store] cache_mb` says otherwise.
pub const DEFAULT_CACHE_MB: u64 = 64;

impl Store {
    /// Opens (or creates) `<data_dir>/cadre.redb` and starts its writer
    /// thread, with the default page cache ([`DEFAULT_CACHE_MB`]).
    pub fn open(data_dir: &Path) -> Result<Store, StoreError> {
        Self::open_with_cache(data_dir, DEFAULT_CACHE_MB as usize * 1024 * 1024)
    }

    /// [`Self::open`] with a page cache of `cache_bytes` (`[store] cache_mb`).
    pub fn open_with_cache(data_dir: &Path, cache_bytes: usize) -> Result<Store, StoreError> {
        Ok(Store {
            backend: Backend::Redb(RedbStore::open(data_dir, cache_bytes)?),
        })
    }

    /// A store in memory, gone when dropped: for listings and tests where a
    /// file adds nothing.
    pub fn open_in_memory() -> Result<Store, StoreError> {
        Ok(Store {
            backend: Backend::Redb(RedbStore::open_in_memory()?),
        })
    }

    /// Connects to the PostgreSQL database at `url` as `node`, applies its
    /// migrations and starts its writer ([`postgres`]): cluster mode. An
    /// unreachable database is an error naming `--store` / `[cluster] store`
    /// and the URL without its password.
    pub fn open_postgres(url: &str, node: NodeIdentity) -> Result<Store, StoreError> {
        Ok(Store {
            backend: Backend::Postgres(PgStore::open(url, node)?),
        })
    }

    pub fn path(&self) -> &Path {
        on_backend!(self, s => s.path())
    }

    /// How long the writer's commits take (each may carry many callers' writes).
    pub fn commit_latency(&self) -> &crate::metrics::Histogram {
        on_backend!(self, s => s.commit_latency())
    }

    /// Whether writes are accepted now.
    pub fn health(&self) -> StoreHealth {
        on_backend!(self, s => s.health())
    }

    /// Refuses every later write with [`StoreError::Closed`]; flushes still
    /// pass. For shutdown: work cut off by the deadline stores nothing more.
    pub fn close_writes(&self) {
        on_backend!(self, s => s.close_writes())
    }

    /// How many times the file was reopened after a failure.
    pub fn generation(&self) -> u64 {
        on_backend!(self, s => s.generation())
    }

    /// Applies `ops` in one transaction (possibly shared with other callers').
    /// With `durable`, returns only after the data is on disk.
    pub async fn write(&self, ops: Vec<WriteOp>, durable: bool) -> Result<(), StoreError> {
        on_backend!(self, s => s.write(ops, durable).await)
    }

    /// [`Self::write`], refused with [`StoreError::Reopened`] unless the
    /// store is still at `generation` (what the caller's state was loaded at).
    pub async fn write_at(
        &self,
        generation: u64,
        ops: Vec<WriteOp>,
        durable: bool,
    ) -> Result<(), StoreError> {
        on_backend!(self, s => s.write_at(generation, ops, durable).await)
    }

    /// Queues `ops` for the next commit, not durable, without waiting for
    /// it: writes are applied in the order they were sent, so a later
    /// [`Self::write`] that succeeds has them in the store too (short of a
    /// failure, which the writer logs; an I/O failure makes the later write
    /// fail as well).
    pub fn write_behind(&self, ops: Vec<WriteOp>) {
        on_backend!(self, s => s.write_behind(ops))
    }

    /// [`Self::write_behind`], refused unless the store is still at
    /// `generation` (see [`Self::write_at`]); so is the caller's later
    /// `write_at`, which is how it learns.
    pub fn write_behind_at(&self, generation: u64, ops: Vec<WriteOp>) {
        on_backend!(self, s => s.write_behind_at(generation, ops))
    }

    /// Makes everything written so far durable.
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.write(Vec::new(), true).await
    }

    /// Every session (ids are time-ordered, so oldest first).
    pub async fn list_sessions(&self) -> Result<Vec<Session>, StoreError> {
        on_backend!(self, s => s.list_sessions().await)
    }

    /// A page of `tenant`'s sessions after the session id `after`, oldest
    /// first: reads only that tenant's index range.
    pub async fn sessions_of(
        &self,
        tenant: &str,
        after: Option<String>,
        limit: usize,
    ) -> Result<Page<Session>, StoreError> {
        self.sessions_matching(tenant, SessionFilter::default(), after, limit)
            .await
    }

    /// A page of `tenant`'s sessions that `filter` keeps, past the session
    /// id `cursor` in the filter's order: reads only that tenant's index
    /// range (the agent and user are checked within it).
    pub async fn sessions_matching(
        &self,
        tenant: &str,
        filter: SessionFilter,
        cursor: Option<String>,
        limit: usize,
    ) -> Result<Page<Session>, StoreError> {
        on_backend!(self, s => s.sessions_of(tenant, filter, cursor, limit).await)
    }

    /// A page of `tenant`'s call records matching `filter` (its `tenant`
    /// and `limit` are ignored) before the record id `before`, newest first:
    /// reads only that tenant's index range.
    pub async fn calls_of(
        &self,
        tenant: &str,
        filter: CallFilter,
        before: Option<String>,
        limit: usize,
    ) -> Result<Page<ToolCallRecord>, StoreError> {
        on_backend!(self, s => s.calls_of(tenant, filter, before, limit).await)
    }

    pub async fn get_session(&self, id: &str) -> Result<Option<Session>, StoreError> {
        on_backend!(self, s => s.get_session(id).await)
    }

    pub async fn get_summary(&self, session_id: &str) -> Result<Option<StoredSummary>, StoreError> {
        on_backend!(self, s => s.get_summary(session_id).await)
    }

    /// The messages a conversation needs in memory: those after `after`
    /// (what the summary covers), at most the last `max`, oldest first;
    /// and the session's last seq.
    pub async fn unsummarised_messages(
        &self,
        session_id: &str,
        after: u64,
        max: usize,
    ) -> Result<(Vec<StoredMessage>, u64), StoreError> {
        on_backend!(self, s => s.unsummarised_messages(session_id, after, max).await)
    }

    /// Every message of a session, oldest first.
    pub async fn messages(&self, session_id: &str) -> Result<Vec<StoredMessage>, StoreError> {
        self.messages_after(session_id, 0).await
    }

    /// At most `limit` messages with seq > `after`, oldest first.
    pub async fn messages_page(
        &self,
        session_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        on_backend!(self, s => s.messages_page(session_id, after, limit).await)
    }

    /// Messages with seq > `after`, oldest first.
    pub async fn messages_after(
        &self,
        session_id: &str,
        after: u64,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        on_backend!(self, s => s.messages_after(session_id, after).await)
    }

    /// The last `n` messages of a session (oldest first) and the session's last seq.
    pub async fn recent_messages(
        &self,
        session_id: &str,
        n: usize,
    ) -> Result<(Vec<StoredMessage>, u64), StoreError> {
        on_backend!(self, s => s.recent_messages(session_id, n).await)
    }

    /// How many messages a session has, how many from the user, and when the last was written.
    pub async fn message_stats(&self, session_id: &str) -> Result<MessageStats, StoreError> {
        on_backend!(self, s => s.message_stats(session_id).await)
    }

    pub async fn message_count(&self, session_id: &str) -> Result<u64, StoreError> {
        on_backend!(self, s => s.message_count(session_id).await)
    }

    /// Every tool call a conversation made, oldest first.
    pub async fn calls_for_conversation(
        &self,
        conversation_id: &str,
    ) -> Result<Vec<ToolCallRecord>, StoreError> {
        let mut calls = self
            .calls(CallFilter {
                conversation_id: Some(conversation_id.to_string()),
                ..CallFilter::default()
            })
            .await?;
        calls.reverse();
        Ok(calls)
    }

    /// Call records matching the filter, newest first, at most `limit`
    /// (all when 0). With several fields set, a record must match them all;
    /// the most selective index is scanned (workflow, conversation, tool).
    pub async fn calls(&self, filter: CallFilter) -> Result<Vec<ToolCallRecord>, StoreError> {
        on_backend!(self, s => s.calls(filter).await)
    }

    /// Counters of every tool, by name.
    pub async fn all_tool_stats(&self) -> Result<Vec<(String, ToolStats)>, StoreError> {
        on_backend!(self, s => s.all_tool_stats().await)
    }

    pub async fn tool_stats(&self, tool: &str) -> Result<ToolStats, StoreError> {
        on_backend!(self, s => s.tool_stats(tool).await)
    }

    /// A document of a namespace, if present.
    pub async fn get_doc(&self, namespace: &str, key: &str) -> Result<Option<Value>, StoreError> {
        on_backend!(self, s => s.get_doc(namespace, key).await)
    }

    /// Every document of a namespace whose key starts with `prefix`, by key.
    pub async fn list_docs(
        &self,
        namespace: &str,
        prefix: &str,
    ) -> Result<Vec<(String, Value)>, StoreError> {
        on_backend!(self, s => s.list_docs(namespace, prefix).await)
    }

    /// Writes a document; durable before returning when `durable`.
    pub async fn put_doc(
        &self,
        namespace: &str,
        key: &str,
        value: Value,
        durable: bool,
    ) -> Result<(), StoreError> {
        self.put_doc_for(namespace, None, key, value, durable).await
    }

    /// [`Self::put_doc`] of a document `tenant` owns: listed under it by
    /// [`Self::docs_of`].
    pub async fn put_doc_of(
        &self,
        namespace: &str,
        tenant: &str,
        key: &str,
        value: Value,
        durable: bool,
    ) -> Result<(), StoreError> {
        self.put_doc_for(namespace, Some(tenant), key, value, durable)
            .await
    }

    /// [`Self::put_doc_of`] of a document that belongs to `session`: it is
    /// erased with the session ([`Self::erase_session`]), wherever it was
    /// moved to by then.
    pub async fn put_doc_of_session(
        &self,
        namespace: &str,
        tenant: &str,
        session: &str,
        key: &str,
        value: Value,
        durable: bool,
    ) -> Result<(), StoreError> {
        let ops = vec![
            WriteOp::PutDoc {
                namespace: namespace.into(),
                key: key.into(),
                value,
                tenant: Some(tenant.into()),
            },
            WriteOp::LinkDoc {
                namespace: namespace.into(),
                key: key.into(),
                session_id: session.into(),
            },
        ];
        self.write(ops, durable).await
    }

    /// Removes the session `id` and every row stored under it, durably, in
    /// one transaction ([`erase`]); `None` when there was no such session.
    /// The caller makes sure nothing writes for the session any more.
    pub async fn erase_session(&self, id: &str) -> Result<Option<Erased>, StoreError> {
        let erased = Arc::new(Mutex::new(None));
        let op = WriteOp::DeleteSession {
            session_id: id.into(),
            erased: erased.clone(),
        };
        self.write(vec![op], true).await?;
        let found = erased.lock().expect("erase slot").take();
        Ok(found)
    }

    /// Up to `limit` sessions of every tenant after the id `after` (by id:
    /// oldest first for UUID v7 ids), each with when it was last active
    /// (its last message, else its creation): what the retention sweep
    /// reads, one bounded page per sweep.
    pub async fn sessions_with_activity(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<(Session, Timestamp)>, StoreError> {
        on_backend!(self, s => s.sessions_with_activity(after, limit).await)
    }

    /// Indexes by tenant the documents of `namespace` written before
    /// [`tables::DOCS_BY_TENANT`] existed, reading each one's tenant with
    /// `tenant_of`. Once per namespace (later calls return `None`), durably;
    /// call it at startup, before serving listings of the namespace.
    pub async fn index_docs(
        &self,
        namespace: &str,
        tenant_of: fn(&Value) -> Option<String>,
    ) -> Result<Option<u64>, StoreError> {
        on_backend!(self, s => s.index_docs(namespace, tenant_of).await)
    }

    /// A page of `tenant`'s documents of `namespace` past `cursor` (a key
    /// of the previous page), by key, descending with `newest_first`.
    pub async fn docs_of(
        &self,
        namespace: &str,
        tenant: &str,
        cursor: Option<String>,
        limit: usize,
        newest_first: bool,
    ) -> Result<Page<(String, Value)>, StoreError> {
        on_backend!(self, s => s.docs_of(namespace, tenant, cursor, limit, newest_first).await)
    }

    pub async fn delete_doc(
        &self,
        namespace: &str,
        key: &str,
        durable: bool,
    ) -> Result<(), StoreError> {
        let op = WriteOp::DeleteDoc {
            namespace: namespace.into(),
            key: key.into(),
        };
        self.write(vec![op], durable).await
    }

    /// Moves a document to another namespace with a new value, atomically
    /// (see [`WriteOp::MoveDoc`]); `None` when it was not there, which is
    /// what every caller but one sees when several move the same key.
    pub async fn move_doc(
        &self,
        namespace: &str,
        key: &str,
        to_namespace: &str,
        to_value: Value,
        durable: bool,
    ) -> Result<Option<Value>, StoreError> {
        let moved = Arc::new(Mutex::new(None));
        let op = WriteOp::MoveDoc {
            namespace: namespace.into(),
            key: key.into(),
            to_namespace: to_namespace.into(),
            to_value,
            moved: moved.clone(),
        };
        self.write(vec![op], durable).await?;
        let taken = moved.lock().expect("move slot").take();
        Ok(taken)
    }

    pub async fn record_count(&self) -> Result<u64, StoreError> {
        on_backend!(self, s => s.record_count().await)
    }

    /// The record of turn `turn_id` of session `session_id`.
    pub async fn turn(&self, session_id: &str, turn_id: &str) -> Result<Option<Value>, StoreError> {
        on_backend!(self, s => s.turn(session_id, turn_id).await)
    }

    /// The turn a message with `key` started in the session, if any.
    pub async fn turn_by_key(
        &self,
        session_id: &str,
        key: &str,
    ) -> Result<Option<String>, StoreError> {
        on_backend!(self, s => s.turn_by_key(session_id, key).await)
    }

    /// The last turn of a session that is not final (at most one runs).
    pub async fn open_turn_of(&self, session_id: &str) -> Result<Option<Value>, StoreError> {
        on_backend!(self, s => s.open_turn_of(session_id).await)
    }

    /// A page of a session's turn records after turn id `after`, oldest
    /// first; `next` is the last id of a full page.
    pub async fn turns_of(
        &self,
        session_id: &str,
        after: Option<String>,
        limit: usize,
    ) -> Result<Page<Value>, StoreError> {
        on_backend!(self, s => s.turns_of(session_id, after, limit).await)
    }

    /// Every `(session, turn)` whose record is not final, oldest session
    /// first: the turns a crash cut.
    pub async fn open_turns(&self) -> Result<Vec<(String, String)>, StoreError> {
        on_backend!(self, s => s.open_turns().await)
    }

    /// The sessions with a turn a crash cut that this node may take up:
    /// every session with an open turn on redb (one process); in cluster
    /// mode only those without a live owner (see `postgres::orphans`).
    pub async fn orphaned_turn_sessions(&self) -> Result<Vec<String>, StoreError> {
        match &self.backend {
            Backend::Redb(s) => {
                let mut ids: Vec<String> =
                    s.open_turns().await?.into_iter().map(|(s, _)| s).collect();
                ids.dedup();
                Ok(ids)
            }
            Backend::Postgres(s) => s.orphaned_turn_sessions().await,
        }
    }

    /// Every model call of a session, added up.
    pub async fn session_usage(&self, session_id: &str) -> Result<TokenUsage, StoreError> {
        on_backend!(self, s => s.session_usage(session_id).await)
    }

    /// The rows of days `from..=to`, of one tenant or (`None`) of every
    /// tenant, by tenant, day and agent. Every tenant's rows are read by
    /// seeking from one tenant's range to the next, so rows outside the
    /// days are never scanned.
    pub async fn usage_rows(
        &self,
        tenant: Option<&str>,
        from: Date,
        to: Date,
    ) -> Result<Vec<UsageRow>, StoreError> {
        on_backend!(self, s => s.usage_rows(tenant, from, to).await)
    }

    /// One tenant's usage over days `from..=to`, added up.
    pub async fn tenant_usage(
        &self,
        tenant: &str,
        from: Date,
        to: Date,
    ) -> Result<TokenUsage, StoreError> {
        on_backend!(self, s => s.tenant_usage(tenant, from, to).await)
    }

    /// The stored outcome of `key` of `tenant`, if any.
    pub async fn idempotency_record(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Option<IdempotencyRecord>, StoreError> {
        on_backend!(self, s => s.idempotency_record(tenant, key).await)
    }

    /// Stores `record` under `key` of `tenant` (replacing any), on disk
    /// before this returns.
    pub async fn put_idempotency(
        &self,
        tenant: &str,
        key: &str,
        record: &IdempotencyRecord,
    ) -> Result<(), StoreError> {
        let op = WriteOp::PutIdempotency {
            tenant: tenant.to_string(),
            key: key.to_string(),
            stored_at_ms: u64::try_from(record.stored_at.as_millisecond()).unwrap_or(0),
            record: serde_json::to_vec(record)?,
        };
        self.write(vec![op], true).await
    }

    /// Claims `key` of `tenant` for a request about to run (cluster mode:
    /// marks it running in the shared store; see [`idempotency`]).
    pub async fn claim_idempotency(
        &self,
        tenant: &str,
        key: &str,
        fingerprint: &str,
    ) -> Result<idempotency::IdempotencyClaim, StoreError> {
        on_backend!(self, s => s.claim_idempotency(tenant, key, fingerprint).await)
    }

    /// Gives up this node's running mark on `key` of `tenant` (the answer
    /// is not stored, or the request was dropped); a no-op on redb.
    pub async fn release_idempotency(&self, tenant: &str, key: &str) -> Result<(), StoreError> {
        match &self.backend {
            Backend::Redb(_) => Ok(()),
            Backend::Postgres(s) => s.release_idempotency(tenant, key).await,
        }
    }

    /// Deletes every record stored before `before`; returns how many went.
    pub async fn sweep_idempotency(&self, before: Timestamp) -> Result<u64, StoreError> {
        on_backend!(self, s => s.sweep_idempotency(before).await)
    }

    async fn put_doc_for(
        &self,
        namespace: &str,
        tenant: Option<&str>,
        key: &str,
        value: Value,
        durable: bool,
    ) -> Result<(), StoreError> {
        let op = WriteOp::PutDoc {
            namespace: namespace.into(),
            key: key.into(),
            value,
            tenant: tenant.map(Into::into),
        };
        self.write(vec![op], durable).await
    }

    /// Makes this node the session's writer and returns the epoch its
    /// writes must carry ([`WriteOp::Fence`]); [`StoreError::OwnedElsewhere`]
    /// while another live node owns it ([`owners`] has the rule).
    pub async fn claim_session(&self, id: &str) -> Result<Claim, StoreError> {
        on_backend!(self, s => s.claim_session(id).await)
    }

    /// Gives the session up (its actor went idle): the next claim, by any
    /// node, takes it without waiting for this node's heartbeat to go stale.
    pub async fn release_session(&self, id: &str, epoch: u64) -> Result<(), StoreError> {
        on_backend!(self, s => s.release_session(id, epoch).await)
    }

    /// Makes this node the writer of workflow run `id` and returns the
    /// epoch its writes carry ([`WriteOp::FenceRun`]);
    /// [`StoreError::RunOwnedElsewhere`] while another live node runs it
    /// ([`owners`] has the rule).
    pub async fn claim_run(&self, id: &str) -> Result<Claim, StoreError> {
        on_backend!(self, s => s.claim_run(id).await)
    }

    /// Who owns workflow run `id` (cluster mode; `None` on redb, for a
    /// run nobody owns, or one that does not exist).
    pub async fn run_owner(&self, id: &str) -> Result<Option<RunOwner>, StoreError> {
        match &self.backend {
            Backend::Redb(_) => Ok(None),
            Backend::Postgres(s) => s.run_owner(id).await,
        }
    }

    /// The ids of the workflow runs still `running` that this node may
    /// take up: its own and those of dead owners (the embedded backend:
    /// every one), by id.
    pub async fn cut_runs(&self) -> Result<Vec<String>, StoreError> {
        on_backend!(self, s => s.cut_runs().await)
    }

    /// Tells the other nodes this one is alive (and where it answers).
    pub async fn heartbeat(&self) -> Result<(), StoreError> {
        on_backend!(self, s => s.heartbeat().await)
    }

    /// The nodes that ever heartbeat, with whether each is alive now.
    pub async fn nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
        on_backend!(self, s => s.nodes().await)
    }

    /// `redb` or `postgres`: what `/readyz` reports.
    pub fn backend_name(&self) -> &'static str {
        match &self.backend {
            Backend::Redb(_) => "redb",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// This node's id in a cluster (`None` for the embedded backend).
    pub fn node_id(&self) -> Option<&str> {
        on_backend!(self, s => s.node_id())
    }
}
