//! The storage layout in one screen: every redb table, its key and value.
//!
//! Values are serde_json bytes: readable with any redb tool, and measured
//! cheap enough next to an fsync (see benches). Bump [`SCHEMA_VERSION`] when a
//! key or value shape changes.
//!
//! Documents: [`DOCS`] holds the tools' small per-user documents (a tool
//! family's per-user records in its own namespace, call intents), keyed by
//! (namespace, key). The store's own kinds of documents (confirmations,
//! tenant configs, API keys, workflow runs and their map elements) each
//! have a table of their own ([`OWN_TABLES`]), keyed by the document's key
//! alone, and a PostgreSQL table of the same name.
//!
//! Decision: the store's API stays the documents API (`get_doc`,
//! `put_doc_of`, `list_docs`, `docs_of`, `move_doc`, `index_docs`...): a
//! namespace names its table ([`own_table`]) and the backends route every
//! document operation to it, so no caller changed and every rule of
//! documents (the tenant index, the erase link to a session, the read
//! cache) holds for the own tables unchanged. [`DOCS_BY_TENANT`],
//! [`DOC_TENANTS`], [`DOCS_BY_SESSION`] and [`DOC_SESSIONS`] index every
//! namespace, own table or not. Typed methods would have meant one set per
//! table on both backends for the same four operations.

use redb::{TableDefinition, TableHandle};

/// 2 added the tenant-first indexes below; a version 1 file is migrated
/// at open ([`super::listing::migrate_v1`]). 3 moved the namespaces of
/// [`OWN_TABLES`] out of [`DOCS`] into their tables, at open, in the
/// opening transaction ([`super::docs::migrate_v2`]). 4 counts the bytes
/// of every stored message per session and tenant ([`SESSION_BYTES`],
/// [`TENANT_BYTES`]), counted at open for the messages already there
/// ([`super::storage::migrate_v3`]). 5 counts the call records made
/// outside a session in [`TENANT_BYTES`] too, counted at open for the
/// records already there ([`super::storage::migrate_v4`]).
pub const SCHEMA_VERSION: u64 = 5;

/// "schema_version" -> u64; "docs_indexed:<namespace>" -> 1 once that
/// namespace's documents written before [`DOCS_BY_TENANT`] are indexed.
pub const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// session_id -> `Session` (json).
pub const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("sessions");

/// (session_id, seq) -> `StoredMessage` (json). seq starts at 1 per session.
pub const MESSAGES: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("messages");

/// session_id -> `StoredSummary` (json): the rolling summary of older messages.
pub const SUMMARIES: TableDefinition<&str, &[u8]> = TableDefinition::new("summaries");

/// record_id (uuid v7, time-ordered) -> `ToolCallRecord` (json).
pub const TOOL_CALLS: TableDefinition<&str, &[u8]> = TableDefinition::new("tool_calls");

/// (conversation_id, record_id) -> (): one session's calls in time order.
pub const TOOL_CALLS_BY_CONVERSATION: TableDefinition<(&str, &str), ()> =
    TableDefinition::new("tool_calls_by_conversation");

/// (tool_name, record_id) -> (): one tool's calls in time order.
pub const TOOL_CALLS_BY_TOOL: TableDefinition<(&str, &str), ()> =
    TableDefinition::new("tool_calls_by_tool");

/// (workflow_id, record_id) -> (): one workflow run's calls in time order.
pub const TOOL_CALLS_BY_WORKFLOW: TableDefinition<(&str, &str), ()> =
    TableDefinition::new("tool_calls_by_workflow");

/// tool_name -> `ToolStats` (json), updated in the transaction that adds the
/// record: calls ever made, not decremented when a session is erased.
pub const TOOL_STATS: TableDefinition<&str, &[u8]> = TableDefinition::new("tool_stats");

/// (namespace, key) -> json document: small per-user state of tools
/// (a tool family's records, call intents), written by the tools
/// and the executor. Not the namespaces of [`OWN_TABLES`].
pub const DOCS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("docs");

/// confirmation id -> `PendingConfirmation` (json): a call held for a
/// user's approval (namespace `confirmations`). Written by the executor's
/// confirmations when a tool asks for one; moved to
/// [`CONFIRMATIONS_DECIDED`] when decided, deleted when found expired.
pub const CONFIRMATIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("confirmations");

/// confirmation id -> `DecidedRecord` (json: decision, tenant, time;
/// namespace `confirmations_decided`). Written by the move out of
/// [`CONFIRMATIONS`]; kept so a late decision learns what happened.
pub const CONFIRMATIONS_DECIDED: TableDefinition<&str, &[u8]> =
    TableDefinition::new("confirmations_decided");

/// tenant -> `TenantConfig` (json; namespace `tenant_config`). Written by
/// the admin API (`PUT /v1/tenants/{tenant}/config`).
pub const TENANT_CONFIGS: TableDefinition<&str, &[u8]> = TableDefinition::new("tenant_configs");

/// key id -> `ApiKeyRecord` (json: tenant, plan, the secret's SHA-256;
/// namespace `api_keys`). Written by `cadre keys` and the admin API.
pub const API_KEYS: TableDefinition<&str, &[u8]> = TableDefinition::new("api_keys");

/// run id (uuid v7) -> the run document (json, without its map elements;
/// namespace `workflow_runs`). Written by the workflow engine and the
/// run's runner; in cluster mode only by the run's owner ([`super::owners`]).
pub const WORKFLOW_RUNS: TableDefinition<&str, &[u8]> = TableDefinition::new("workflow_runs");

/// `<run id>/<node>/<index, 10 digits>` -> one map element of a run (json;
/// namespace `workflow_items`): one row per element, so an element costs
/// one small write. Written by the run's runner, with the run's fence.
pub const WORKFLOW_ITEMS: TableDefinition<&str, &[u8]> = TableDefinition::new("workflow_items");

/// A namespace of documents with a table of its own.
#[derive(Clone, Copy)]
pub struct OwnTable {
    /// What callers name it (`put_doc(namespace, ..)`).
    pub namespace: &'static str,
    /// Its redb table; PostgreSQL's table has the same name.
    pub table: TableDefinition<'static, &'static str, &'static [u8]>,
}

/// Every namespace with a table of its own (the rest live in [`DOCS`]).
pub static OWN_TABLES: [OwnTable; 6] = [
    OwnTable {
        namespace: "confirmations",
        table: CONFIRMATIONS,
    },
    OwnTable {
        namespace: "confirmations_decided",
        table: CONFIRMATIONS_DECIDED,
    },
    OwnTable {
        namespace: "tenant_config",
        table: TENANT_CONFIGS,
    },
    OwnTable {
        namespace: "api_keys",
        table: API_KEYS,
    },
    OwnTable {
        namespace: "workflow_runs",
        table: WORKFLOW_RUNS,
    },
    OwnTable {
        namespace: "workflow_items",
        table: WORKFLOW_ITEMS,
    },
];

/// The table of `namespace`'s documents when it has one of its own
/// (`None`: they live in [`DOCS`]).
pub fn own_table(namespace: &str) -> Option<&'static OwnTable> {
    OWN_TABLES.iter().find(|t| t.namespace == namespace)
}

impl OwnTable {
    /// The table's name, in redb and in PostgreSQL.
    pub fn name(&'static self) -> &'static str {
        self.table.name()
    }
}

/// session_id -> `TokenUsage` (json): every model call the session made.
pub const SESSION_USAGE: TableDefinition<&str, &[u8]> = TableDefinition::new("session_usage");

/// (tenant, day `YYYY-MM-DD` UTC, agent) -> `TokenUsage` (json). One row per
/// tenant, day and agent, so no row is shared by every tenant's turns; a
/// tenant's month is a range of at most 31 days of rows. Kept (for billing)
/// when a session is erased; [`SESSION_USAGE`] goes with it.
pub const TENANT_USAGE: TableDefinition<(&str, &str, &str), &[u8]> =
    TableDefinition::new("tenant_usage");

/// (tenant, session_id) -> (): a tenant's sessions, oldest first (ids are
/// time-ordered). Written with the session; a session never changes tenant.
pub const SESSIONS_BY_TENANT: TableDefinition<(&str, &str), ()> =
    TableDefinition::new("sessions_by_tenant");

/// (tenant, facet, record_id) -> (): a tenant's calls in time order. Facet
/// `""` holds every call of the tenant, `c:<conversation>`, `w:<workflow run>`
/// and `t:<tool>` the filtered listings, so each listing is one range of its
/// tenant. Records without a tenant are not indexed (no tenant lists them).
pub const TOOL_CALLS_BY_TENANT: TableDefinition<(&str, &str, &str), ()> =
    TableDefinition::new("tool_calls_by_tenant");

/// (namespace, tenant, key) -> (): a tenant's documents of a namespace, for
/// the namespaces whose writers name a tenant (confirmations, workflow runs).
pub const DOCS_BY_TENANT: TableDefinition<(&str, &str, &str), ()> =
    TableDefinition::new("docs_by_tenant");

/// (namespace, key) -> tenant: the reverse of [`DOCS_BY_TENANT`], so deleting
/// or moving a document drops its index row without parsing the document.
pub const DOC_TENANTS: TableDefinition<(&str, &str), &str> = TableDefinition::new("doc_tenants");

/// (session_id, namespace, key) -> (): the documents erased with a session
/// (its confirmations, pending and decided; [`super::erase`]). Added
/// without a schema bump: an older file gets the table empty.
pub const DOCS_BY_SESSION: TableDefinition<(&str, &str, &str), ()> =
    TableDefinition::new("docs_by_session");

/// (namespace, key) -> session_id: the reverse of [`DOCS_BY_SESSION`], so a
/// moved or deleted document carries or drops its link without parsing it.
pub const DOC_SESSIONS: TableDefinition<(&str, &str), &str> = TableDefinition::new("doc_sessions");

/// (session_id, turn_id) -> turn record (json, written by the conversation:
/// its phase, calls so far and, once final, its outcome). Turn ids are
/// uuid v7, so a session's turns range in start order. Added without a
/// schema bump: an older file gets the table empty.
pub const TURNS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("turns");

/// (session_id, turn_id) -> (): the turns whose phase is not final; what
/// a start scans to resume cut turns ([`crate::store::TurnReads::open_turns`]).
pub const OPEN_TURNS: TableDefinition<(&str, &str), ()> = TableDefinition::new("open_turns");

/// (session_id, idempotency key) -> turn_id: the turn a keyed message
/// started, so a retry finds it instead of starting another.
pub const TURN_KEYS: TableDefinition<(&str, &str), &str> = TableDefinition::new("turn_keys");
/// (tenant, Idempotency-Key) -> (stored at, unix ms; `IdempotencyRecord`
/// json): the outcome of a keyed request ([`super::idempotency`]). The
/// time leads the value so the sweep reads it without parsing the record.
/// Added without a schema bump: an older file gets the table empty.
pub const IDEMPOTENCY: TableDefinition<(&str, &str), (u64, &[u8])> =
    TableDefinition::new("idempotency");

/// session_id -> bytes of its stored messages (their JSON rows in
/// [`MESSAGES`]), added in the transaction that appends them; erased with
/// the session ([`super::storage`]).
pub const SESSION_BYTES: TableDefinition<&str, u64> = TableDefinition::new("session_bytes");

/// tenant -> the sum of its sessions' [`SESSION_BYTES`] and of its call
/// records made outside a session (their JSON rows in [`TOOL_CALLS`]),
/// kept in the same transactions: what a tenant's storage quota is
/// checked against ([`super::storage`]).
pub const TENANT_BYTES: TableDefinition<&str, u64> = TableDefinition::new("tenant_bytes");
