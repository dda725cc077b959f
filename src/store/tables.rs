//! The storage layout in one screen: every redb table, its key and value.
//!
//! Values are serde_json bytes: readable with any redb tool, and measured
//! cheap enough next to an fsync (see benches). Bump [`SCHEMA_VERSION`] when a
//! key or value shape changes.

use redb::TableDefinition;

/// 2 added the tenant-first indexes below; a version 1 file is migrated
/// at open ([`super::listing::migrate_v1`]).
pub const SCHEMA_VERSION: u64 = 2;

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
/// (paper orders, alerts, watchlists...), pending confirmations, workflow
/// runs (`workflow_runs`, by run id) and their map elements
/// (`workflow_items`, `<run id>/<node>/<index>`: one row per element).
pub const DOCS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("docs");

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
/// a start scans to resume cut turns ([`super::Store::open_turns`]).
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
