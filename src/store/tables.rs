//! The storage layout in one screen: every redb table, its key and value.
//!
//! Values are serde_json bytes: readable with any redb tool, and measured
//! cheap enough next to an fsync (see benches). Bump [`SCHEMA_VERSION`] when a
//! key or value shape changes.

use redb::TableDefinition;

pub const SCHEMA_VERSION: u64 = 1;

/// "schema_version" -> u64.
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

/// tool_name -> `ToolStats` (json), updated in the transaction that adds the record.
pub const TOOL_STATS: TableDefinition<&str, &[u8]> = TableDefinition::new("tool_stats");

/// (namespace, key) -> json document: small per-user state of tools
/// (paper orders, alerts, watchlists...) and pending confirmations.
pub const DOCS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("docs");

/// session_id -> `TokenUsage` (json): every model call the session made.
pub const SESSION_USAGE: TableDefinition<&str, &[u8]> = TableDefinition::new("session_usage");

/// (tenant, day `YYYY-MM-DD` UTC, agent) -> `TokenUsage` (json). One row per
/// tenant, day and agent, so no row is shared by every tenant's turns; a
/// tenant's month is a range of at most 31 days of rows.
pub const TENANT_USAGE: TableDefinition<(&str, &str, &str), &[u8]> =
    TableDefinition::new("tenant_usage");
