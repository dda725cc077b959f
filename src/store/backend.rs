//! The store's seam: what a backend must do, as a few traits by concern,
//! each written once and implemented once per backend.
//!
//! conversation / executor / http ──▶ Store ──deref──▶ dyn StoreBackend
//!                                                      ├─ RedbStore  (embedded, default)
//!                                                      └─ PgStore    (cluster mode: `cluster::postgres`)
//!
//! - [`Writes`]: the writer (group commit, generations, write-behind,
//!   health). Every write, whatever it changes, is a [`WriteOp`] through it.
//! - [`SessionReads`], [`CallReads`], [`DocReads`], [`TurnReads`],
//!   [`UsageReads`], [`IdempotencyRecords`]: reads by concern, and the
//!   few writes that are one [`WriteOp`] with an answer (erase, move,
//!   put) as provided methods on top of [`Writes`].
//! - [`Ownership`]: who writes a session or a workflow run ([`super::owners`]
//!   has the rule). The embedded backend is one node and says so in its
//!   own impl (every claim at epoch 0, no other nodes); nothing here
//!   defaults to a no-op, so a new backend decides each point.
//!
//! [`StoreBackend`] is all of them; [`super::Store`] holds one as a trait
//! object and derefs to it. A caller brings the methods into scope with
//! `use crate::store::prelude::*;`. A new table is written once: a
//! [`WriteOp`] applied by each backend's writer, a read on the trait of its
//! concern, and a check in `tests/store_conformance.rs`, which runs every
//! check against `dyn StoreBackend` on both backends. The embedded backend
//! lives here; cluster mode's PostgreSQL one is an adapter in
//! `cluster::postgres` (the store names no PostgreSQL type: a driver's
//! error arrives as [`StoreError::Backend`](super::StoreError::Backend)),
//! and the runtime picks which one a `Store` holds.
//!
//! Decided: trait objects (`async_trait`, one boxed future per call), not
//! generics threaded through every handle: a store call is a channel send
//! or a blocking read plus a commit, and `benches/load` shows no
//! difference (the note of issue #30 has the A/B).

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use jiff::Timestamp;
use jiff::civil::Date;
use serde_json::Value;

use super::{
    CallFilter, Claim, Erased, IdempotencyClaim, IdempotencyRecord, MessageStats, NodeRow, Page,
    RunOwner, Session, SessionFilter, SessionWriter, StoreError, StoreHealth, StoredMessage,
    StoredSummary, TokenUsage, ToolCallRecord, ToolStats, UsageRow, WriteOp,
};

/// How [`DocReads::index_docs`] reads a document's tenant (an alias:
/// `async_trait` would otherwise give the `&Value` a lifetime of the call).
pub type TenantOf = fn(&Value) -> Option<String>;

/// The writer of a backend: every write goes through it.
#[async_trait]
pub trait Writes: Send + Sync + 'static {
    /// `redb` or `postgres`: what `/readyz` reports.
    fn backend_name(&self) -> &'static str;

    /// Where the data lives (the redb file; PostgreSQL: a placeholder path).
    fn path(&self) -> &Path;

    /// How long the writer's commits take (each may carry many callers' writes).
    fn commit_latency(&self) -> &crate::metrics::Histogram;

    /// Whether writes are accepted now.
    fn health(&self) -> StoreHealth;

    /// Refuses every later write with [`StoreError::Closed`]; flushes still
    /// pass. For shutdown: work cut off by the deadline stores nothing more.
    fn close_writes(&self);

    /// How many times the store was reopened after a failure.
    fn generation(&self) -> u64;

    /// Applies `ops` in one transaction (possibly shared with other callers').
    /// With `durable`, returns only after the data is on disk.
    async fn write(&self, ops: Vec<WriteOp>, durable: bool) -> Result<(), StoreError>;

    /// [`Self::write`], refused with [`StoreError::Reopened`] unless the
    /// store is still at `generation` (what the caller's state was loaded at).
    async fn write_at(
        &self,
        generation: u64,
        ops: Vec<WriteOp>,
        durable: bool,
    ) -> Result<(), StoreError>;

    /// Queues `ops` for the next commit, not durable, without waiting for
    /// it: writes are applied in the order they were sent, so a later
    /// [`Self::write`] that succeeds has them in the store too (short of a
    /// failure, which the writer logs; an I/O failure makes the later write
    /// fail as well).
    fn write_behind(&self, ops: Vec<WriteOp>);

    /// [`Self::write_behind`], refused unless the store is still at
    /// `generation` (see [`Self::write_at`]); so is the caller's later
    /// `write_at`, which is how it learns.
    fn write_behind_at(&self, generation: u64, ops: Vec<WriteOp>);

    /// Makes everything written so far durable.
    async fn flush(&self) -> Result<(), StoreError> {
        self.write(Vec::new(), true).await
    }
}

/// Sessions, their messages and summaries.
#[async_trait]
pub trait SessionReads: Writes {
    /// Every session (ids are time-ordered, so oldest first).
    async fn list_sessions(&self) -> Result<Vec<Session>, StoreError>;

    /// A page of `tenant`'s sessions that `filter` keeps, past the session
    /// id `cursor` in the filter's order: reads only that tenant's index
    /// range (the agent and user are checked within it).
    async fn sessions_matching(
        &self,
        tenant: &str,
        filter: SessionFilter,
        cursor: Option<String>,
        limit: usize,
    ) -> Result<Page<Session>, StoreError>;

    /// A page of `tenant`'s sessions after the session id `after`, oldest
    /// first: reads only that tenant's index range.
    async fn sessions_of(
        &self,
        tenant: &str,
        after: Option<String>,
        limit: usize,
    ) -> Result<Page<Session>, StoreError> {
        self.sessions_matching(tenant, SessionFilter::default(), after, limit)
            .await
    }

    async fn get_session(&self, id: &str) -> Result<Option<Session>, StoreError>;

    async fn get_summary(&self, session_id: &str) -> Result<Option<StoredSummary>, StoreError>;

    /// The messages a conversation needs in memory: those after `after`
    /// (what the summary covers), at most the last `max`, oldest first;
    /// and the session's last seq.
    async fn unsummarised_messages(
        &self,
        session_id: &str,
        after: u64,
        max: usize,
    ) -> Result<(Vec<StoredMessage>, u64), StoreError>;

    /// Every message of a session, oldest first.
    async fn messages(&self, session_id: &str) -> Result<Vec<StoredMessage>, StoreError> {
        self.messages_after(session_id, 0).await
    }

    /// At most `limit` messages with seq > `after`, oldest first.
    async fn messages_page(
        &self,
        session_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, StoreError>;

    /// Messages with seq > `after`, oldest first.
    async fn messages_after(
        &self,
        session_id: &str,
        after: u64,
    ) -> Result<Vec<StoredMessage>, StoreError>;

    /// The last `n` messages of a session (oldest first) and the session's last seq.
    async fn recent_messages(
        &self,
        session_id: &str,
        n: usize,
    ) -> Result<(Vec<StoredMessage>, u64), StoreError>;

    /// How many messages a session has, how many from the user, and when
    /// the last was written.
    async fn message_stats(&self, session_id: &str) -> Result<MessageStats, StoreError>;

    async fn message_count(&self, session_id: &str) -> Result<u64, StoreError>;

    /// Up to `limit` sessions of every tenant after the id `after` (by id:
    /// oldest first for UUID v7 ids), each with when it was last active
    /// (its last message, else its creation): what the retention sweep
    /// reads, one bounded page per sweep.
    async fn sessions_with_activity(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<(Session, Timestamp)>, StoreError>;

    /// Removes the session `id` and every row stored under it, durably, in
    /// one transaction ([`super::erase`]); `None` when there was no such
    /// session. The caller makes sure nothing writes for the session any more.
    async fn erase_session(&self, id: &str) -> Result<Option<Erased>, StoreError> {
        let erased = Arc::new(Mutex::new(None));
        let op = WriteOp::DeleteSession {
            session_id: id.into(),
            erased: erased.clone(),
        };
        self.write(vec![op], true).await?;
        let found = erased.lock().expect("erase slot").take();
        Ok(found)
    }
}

/// Tool-call records and the per-tool counters.
#[async_trait]
pub trait CallReads: Writes {
    /// A page of `tenant`'s call records matching `filter` (its `tenant`
    /// and `limit` are ignored) before the record id `before`, newest first:
    /// reads only that tenant's index range.
    async fn calls_of(
        &self,
        tenant: &str,
        filter: CallFilter,
        before: Option<String>,
        limit: usize,
    ) -> Result<Page<ToolCallRecord>, StoreError>;

    /// Call records matching the filter, newest first, at most `limit`
    /// (all when 0). With several fields set, a record must match them all;
    /// the most selective index is scanned (workflow, conversation, tool).
    async fn calls(&self, filter: CallFilter) -> Result<Vec<ToolCallRecord>, StoreError>;

    /// The records with these ids that exist (in no particular order): a
    /// stored turn's calls, which the turn names instead of repeating
    /// their arguments and outputs (`conversation::turn_rows`).
    async fn calls_by_id(&self, ids: Vec<String>) -> Result<Vec<ToolCallRecord>, StoreError>;

    /// Every tool call a conversation made, oldest first.
    async fn calls_for_conversation(
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

    /// Counters of every tool, by name.
    async fn all_tool_stats(&self) -> Result<Vec<(String, ToolStats)>, StoreError>;

    async fn tool_stats(&self, tool: &str) -> Result<ToolStats, StoreError>;

    /// How many call records there are.
    async fn record_count(&self) -> Result<u64, StoreError>;

    /// Erases every call record of `tenant` made outside a session (direct
    /// tool calls, workflow tool nodes), durably, a batch of records per
    /// transaction, and takes their bytes off its stored bytes
    /// ([`super::storage`]); how many went. Records with a conversation go
    /// with their session ([`SessionReads::erase_session`]).
    async fn erase_calls_outside_sessions(&self, tenant: &str) -> Result<u64, StoreError> {
        let mut after = None;
        let mut total = 0;
        loop {
            let erased = Arc::new(Mutex::new(None));
            let op = WriteOp::EraseCallsOutsideSessions {
                tenant: tenant.into(),
                after: after.take(),
                erased: erased.clone(),
            };
            self.write(vec![op], true).await?;
            let done = erased
                .lock()
                .expect("erase slot")
                .take()
                .unwrap_or_default();
            total += done.calls;
            match done.next {
                Some(next) => after = Some(next),
                None => return Ok(total),
            }
        }
    }
}

/// Documents: JSON values by namespace and key (agents, workflow runs,
/// tenant config, approvals ...).
#[async_trait]
pub trait DocReads: Writes {
    /// A document of a namespace, if present.
    async fn get_doc(&self, namespace: &str, key: &str) -> Result<Option<Value>, StoreError>;

    /// Every document of a namespace whose key starts with `prefix`, by key.
    async fn list_docs(
        &self,
        namespace: &str,
        prefix: &str,
    ) -> Result<Vec<(String, Value)>, StoreError>;

    /// Indexes by tenant the documents of `namespace` written before
    /// [`super::tables::DOCS_BY_TENANT`] existed, reading each one's tenant
    /// with `tenant_of`. Once per namespace (later calls return `None`),
    /// durably; call it at startup, before serving listings of the namespace.
    async fn index_docs(
        &self,
        namespace: &str,
        tenant_of: TenantOf,
    ) -> Result<Option<u64>, StoreError>;

    /// A page of `tenant`'s documents of `namespace` past `cursor` (a key
    /// of the previous page), by key, descending with `newest_first`.
    async fn docs_of(
        &self,
        namespace: &str,
        tenant: &str,
        cursor: Option<String>,
        limit: usize,
        newest_first: bool,
    ) -> Result<Page<(String, Value)>, StoreError>;

    /// Writes a document; durable before returning when `durable`.
    async fn put_doc(
        &self,
        namespace: &str,
        key: &str,
        value: Value,
        durable: bool,
    ) -> Result<(), StoreError> {
        let op = put_doc_op(namespace, None, key, value);
        self.write(vec![op], durable).await
    }

    /// [`Self::put_doc`] of a document `tenant` owns: listed under it by
    /// [`Self::docs_of`].
    async fn put_doc_of(
        &self,
        namespace: &str,
        tenant: &str,
        key: &str,
        value: Value,
        durable: bool,
    ) -> Result<(), StoreError> {
        let op = put_doc_op(namespace, Some(tenant), key, value);
        self.write(vec![op], durable).await
    }

    /// [`Self::put_doc_of`] of a document that belongs to `session`: it is
    /// erased with the session ([`SessionReads::erase_session`]), wherever
    /// it was moved to by then.
    async fn put_doc_of_session(
        &self,
        namespace: &str,
        tenant: &str,
        session: &str,
        key: &str,
        value: Value,
        durable: bool,
    ) -> Result<(), StoreError> {
        let ops = vec![
            put_doc_op(namespace, Some(tenant), key, value),
            WriteOp::LinkDoc {
                namespace: namespace.into(),
                key: key.into(),
                session_id: session.into(),
            },
        ];
        self.write(ops, durable).await
    }

    async fn delete_doc(
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
    async fn move_doc(
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
}

fn put_doc_op(namespace: &str, tenant: Option<&str>, key: &str, value: Value) -> WriteOp {
    WriteOp::PutDoc {
        namespace: namespace.into(),
        key: key.into(),
        value,
        tenant: tenant.map(Into::into),
    }
}

/// Turn records ([`super::turns`]).
#[async_trait]
pub trait TurnReads: Writes {
    /// The record of turn `turn_id` of session `session_id`.
    async fn turn(&self, session_id: &str, turn_id: &str) -> Result<Option<Value>, StoreError>;

    /// The turn a message with `key` started in the session, if any.
    async fn turn_by_key(&self, session_id: &str, key: &str) -> Result<Option<String>, StoreError>;

    /// The last turn of a session that is not final (at most one runs).
    async fn open_turn_of(&self, session_id: &str) -> Result<Option<Value>, StoreError>;

    /// A page of a session's turn records after turn id `after`, oldest
    /// first; `next` is the last id of a full page.
    async fn turns_of(
        &self,
        session_id: &str,
        after: Option<String>,
        limit: usize,
    ) -> Result<Page<Value>, StoreError>;

    /// Every `(session, turn)` whose record is not final, oldest session
    /// first: the turns a crash cut.
    async fn open_turns(&self) -> Result<Vec<(String, String)>, StoreError>;
}

/// Token usage ([`super::usage`]).
#[async_trait]
pub trait UsageReads: Writes {
    /// Every model call of a session, added up.
    async fn session_usage(&self, session_id: &str) -> Result<TokenUsage, StoreError>;

    /// The rows of days `from..=to`, of one tenant or (`None`) of every
    /// tenant, by tenant, day and agent.
    async fn usage_rows(
        &self,
        tenant: Option<&str>,
        from: Date,
        to: Date,
    ) -> Result<Vec<UsageRow>, StoreError>;

    /// One tenant's usage over days `from..=to`, added up.
    async fn tenant_usage(
        &self,
        tenant: &str,
        from: Date,
        to: Date,
    ) -> Result<TokenUsage, StoreError>;

    /// Bytes of the messages `tenant`'s sessions store now (erased
    /// sessions not counted; [`super::storage`] says what counts).
    async fn stored_bytes(&self, tenant: &str) -> Result<u64, StoreError>;
}

/// Stored outcomes of requests sent with an `Idempotency-Key`
/// ([`super::idempotency`]).
#[async_trait]
pub trait IdempotencyRecords: Writes {
    /// The stored outcome of `key` of `tenant`, if any.
    async fn idempotency_record(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Option<IdempotencyRecord>, StoreError>;

    /// Claims `key` of `tenant` for a request about to run (cluster mode:
    /// marks it running in the shared store).
    async fn claim_idempotency(
        &self,
        tenant: &str,
        key: &str,
        fingerprint: &str,
    ) -> Result<IdempotencyClaim, StoreError>;

    /// Gives up this node's claim on `key` of `tenant` (the answer is not
    /// stored, or the request was dropped).
    async fn release_idempotency(&self, tenant: &str, key: &str) -> Result<(), StoreError>;

    /// Deletes every record stored before `before`; returns how many went.
    async fn sweep_idempotency(&self, before: Timestamp) -> Result<u64, StoreError>;

    /// Stores `record` under `key` of `tenant` (replacing any), on disk
    /// before this returns.
    async fn put_idempotency(
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
}

/// Who writes a session or a workflow run ([`super::owners`] has the rule).
#[async_trait]
pub trait Ownership: Writes {
    /// This node's id in a cluster (`None` for a backend of one node).
    fn node_id(&self) -> Option<&str>;

    /// Makes this node the session's writer and returns the epoch its
    /// writes must carry ([`WriteOp::Fence`]); [`StoreError::OwnedElsewhere`]
    /// while another live node owns it.
    async fn claim_session(&self, id: &str) -> Result<Claim, StoreError>;

    /// Gives the session up (its actor went idle): the next claim, by any
    /// node, takes it without waiting for this node's heartbeat to go stale.
    async fn release_session(&self, id: &str, epoch: u64) -> Result<(), StoreError>;

    /// Makes this node the session's one writer and returns the handle
    /// its writes go through: at once on a backend of one node, by a claim
    /// ([`Self::claim_session`]) in a cluster.
    async fn session_writer(&self, id: &str) -> Result<SessionWriter, StoreError> {
        if self.node_id().is_none() {
            return Ok(SessionWriter::sole(id));
        }
        let claim = self.claim_session(id).await?;
        if let Some(from) = &claim.took_over_from {
            tracing::info!(session = id, from = %from, epoch = claim.epoch, "session taken over");
        }
        Ok(SessionWriter::claimed(id, claim.epoch))
    }

    /// Makes this node the writer of workflow run `id` and returns the
    /// epoch its writes carry ([`WriteOp::FenceRun`]);
    /// [`StoreError::RunOwnedElsewhere`] while another live node runs it.
    async fn claim_run(&self, id: &str) -> Result<Claim, StoreError>;

    /// Who owns workflow run `id` (`None` for a run nobody else owns, or
    /// one that does not exist).
    async fn run_owner(&self, id: &str) -> Result<Option<RunOwner>, StoreError>;

    /// The ids of the workflow runs still `running` that this node may
    /// take up: its own and those of dead owners, by id.
    async fn cut_runs(&self) -> Result<Vec<String>, StoreError>;

    /// The sessions with a turn a crash cut that this node may take up:
    /// those without a live owner.
    async fn orphaned_turn_sessions(&self) -> Result<Vec<String>, StoreError>;

    /// Tells the other nodes this one is alive (and where it answers).
    async fn heartbeat(&self) -> Result<(), StoreError>;

    /// The nodes that ever heartbeat, with whether each is alive now.
    async fn nodes(&self) -> Result<Vec<NodeRow>, StoreError>;
}

/// Everything a backend is; [`super::Store`] holds one.
pub trait StoreBackend:
    SessionReads + CallReads + DocReads + TurnReads + UsageReads + IdempotencyRecords + Ownership
{
}

impl<T> StoreBackend for T where
    T: SessionReads
        + CallReads
        + DocReads
        + TurnReads
        + UsageReads
        + IdempotencyRecords
        + Ownership
{
}

/// The traits' methods in scope, without their names:
/// `use crate::store::prelude::*;`.
pub mod prelude {
    pub use super::{
        CallReads as _, DocReads as _, IdempotencyRecords as _, Ownership as _, SessionReads as _,
        StoreBackend as _, TurnReads as _, UsageReads as _, Writes as _,
    };
}
