//! `cadre migrate`: copies a redb data dir into PostgreSQL, so a
//! single-node user can move to cluster mode.
//!
//! <data dir>/cadre.redb ──reader thread (read transaction, chunks)──▶ channel
//!     ──▶ store runtime: one PostgreSQL transaction per chunk ──▶ the tables of [`super::schema`]
//!
//! Decisions:
//! - Every row is an upsert that *sets* values: running it again (after a
//!   failure half-way, or to pick up what a last run of the old server
//!   wrote) leaves the same rows, never doubled counters. Per-node counters
//!   (tool stats, tenant usage) land in the rows of node [`IMPORT_NODE`].
//! - Sessions come in without an owner, at epoch 1: the first node to
//!   claim one takes it at epoch 2.
//! - The file is opened the way redb opens it, which takes its lock: a
//!   server still running on the data dir makes the migration fail, saying
//!   to stop it.
//! - What is read is what is written: bodies are copied as their JSON text.
//!   The tenant index and erase links of documents come from the redb
//!   index tables (`DOC_TENANTS`, `DOC_SESSIONS`). The documents of
//!   [`OWN_TABLES`] go to their tables: from those tables for a file of
//!   schema 3, else through `docs` and then moved, as migration 002 does.
//! - Chunks of [`CHUNK`] rows: memory stays flat for any file size, and a
//!   transaction never holds more than one chunk.

use std::borrow::Cow;
use std::path::Path;

use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::mpsc;
use tokio_postgres::types::ToSql;

use super::PgStore;
use crate::store::StoreError;
use crate::store::tables::*;

/// The node the per-node counters of an imported file are written under.
pub const IMPORT_NODE: &str = "redb-import";
/// Rows per PostgreSQL transaction.
pub const CHUNK: usize = 1_000;

/// How many rows of each table were copied.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Imported {
    pub tables: Vec<(&'static str, u64)>,
}

/// One row as text: its key parts, and its value (JSON text, or `None`).
struct Row {
    key: Vec<String>,
    value: Option<String>,
    n: Option<i64>,
    extra: Option<String>,
}

struct Chunk {
    table: &'static str,
    rows: Vec<Row>,
}

fn text(bytes: &[u8]) -> Result<String, StoreError> {
    // A packed row (`store::codec`) goes to PostgreSQL as its JSON.
    String::from_utf8(crate::store::codec::unpack(bytes)?.into_owned())
        .map_err(|e| StoreError::Corrupt(serde::de::Error::custom(e.to_string())))
}

/// Reads every table of the file and sends it in chunks.
fn read_file(path: &Path, tx: mpsc::Sender<Result<Chunk, StoreError>>) -> Result<(), StoreError> {
    let db = redb::Database::open(path).map_err(|source| StoreError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let txn = db.begin_read().map_err(redb::Error::from)?;
    let version = match txn.open_table(META) {
        Ok(meta) => meta
            .get("schema_version")
            .map_err(redb::Error::from)?
            .map(|v| v.value()),
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(e) => return Err(redb::Error::from(e).into()),
    };
    if version.is_some_and(|v| v > SCHEMA_VERSION) {
        return Err(StoreError::SchemaMismatch {
            found: version.unwrap_or(0),
            expected: SCHEMA_VERSION,
        });
    }
    let send = |table: &'static str, rows: &mut Vec<Row>| -> bool {
        if rows.is_empty() {
            return true;
        }
        let chunk = Chunk {
            table,
            rows: std::mem::take(rows),
        };
        tx.blocking_send(Ok(chunk)).is_ok()
    };
    macro_rules! copy {
        ($def:expr, $name:literal, |$k:ident, $v:ident| $row:expr) => {{
            let mut rows = Vec::new();
            if let Some(table) = open_opt(&txn, $def)? {
                for entry in table.iter().map_err(redb::Error::from)? {
                    let (k, v) = entry.map_err(redb::Error::from)?;
                    let ($k, $v) = (k.value(), v.value());
                    rows.push($row);
                    if rows.len() == CHUNK && !send($name, &mut rows) {
                        return Ok(());
                    }
                }
            }
            if !send($name, &mut rows) {
                return Ok(());
            }
        }};
    }
    let key = |parts: &[&str]| parts.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    copy!(SESSIONS, "sessions", |k, v| Row {
        key: key(&[k]),
        value: Some(text(v)?),
        n: None,
        extra: None,
    });
    copy!(MESSAGES, "messages", |k, v| Row {
        key: key(&[k.0]),
        value: Some(text(v)?),
        n: Some(k.1 as i64),
        extra: None,
    });
    copy!(SUMMARIES, "summaries", |k, v| Row {
        key: key(&[k]),
        value: Some(text(v)?),
        n: None,
        extra: None,
    });
    copy!(TOOL_CALLS, "tool_calls", |k, v| Row {
        key: key(&[k]),
        value: Some(text(v)?),
        n: None,
        extra: None,
    });
    copy!(TOOL_STATS, "tool_stats", |k, v| Row {
        key: key(&[k]),
        value: Some(text(v)?),
        n: None,
        extra: None,
    });
    let doc_tenants = open_opt(&txn, DOC_TENANTS)?;
    let doc_sessions = open_opt(&txn, DOC_SESSIONS)?;
    type Index = redb::ReadOnlyTable<(&'static str, &'static str), &'static str>;
    let lookup = |t: &Option<Index>, k: (&str, &str)| -> Result<Option<String>, StoreError> {
        match t {
            Some(t) => Ok(t
                .get(k)
                .map_err(redb::Error::from)?
                .map(|v| v.value().to_string())),
            None => Ok(None),
        }
    };
    copy!(DOCS, "docs", |k, v| Row {
        key: key(&[k.0, k.1, &lookup(&doc_tenants, k)?.unwrap_or_default()]),
        value: Some(text(v)?),
        n: lookup(&doc_tenants, k)?.map(|_| 1),
        extra: lookup(&doc_sessions, k)?,
    });
    // A file of schema 2 or older holds these in DOCS (copied above, and
    // moved to their tables at the end of the import).
    for t in &OWN_TABLES {
        let table = t.name();
        let mut rows = Vec::new();
        if let Some(own) = open_opt(&txn, t.table)? {
            for entry in own.iter().map_err(redb::Error::from)? {
                let (k, v) = entry.map_err(redb::Error::from)?;
                let (k, v) = (k.value(), v.value());
                let tenant = lookup(&doc_tenants, (t.namespace, k))?;
                rows.push(Row {
                    key: key(&[k, &tenant.clone().unwrap_or_default()]),
                    value: Some(text(v)?),
                    n: tenant.map(|_| 1),
                    extra: lookup(&doc_sessions, (t.namespace, k))?,
                });
                if rows.len() == CHUNK && !send(table, &mut rows) {
                    return Ok(());
                }
            }
        }
        if !send(table, &mut rows) {
            return Ok(());
        }
    }
    copy!(SESSION_USAGE, "session_usage", |k, v| Row {
        key: key(&[k]),
        value: Some(text(v)?),
        n: None,
        extra: None,
    });
    copy!(TENANT_USAGE, "tenant_usage", |k, v| Row {
        key: key(&[k.0, k.1, k.2]),
        value: Some(text(v)?),
        n: None,
        extra: None,
    });
    let open_turns = open_opt(&txn, OPEN_TURNS)?;
    copy!(TURNS, "turns", |k, v| Row {
        key: key(&[k.0, k.1]),
        value: Some(text(v)?),
        n: match &open_turns {
            Some(t) => Some(i64::from(t.get(k).map_err(redb::Error::from)?.is_some())),
            None => Some(0),
        },
        extra: None,
    });
    copy!(TURN_KEYS, "turn_keys", |k, v| Row {
        key: key(&[k.0, k.1]),
        value: None,
        n: None,
        extra: Some(v.to_string()),
    });
    copy!(IDEMPOTENCY, "idempotency", |k, v| Row {
        key: key(&[k.0, k.1]),
        value: Some(text(v.1)?),
        n: Some(v.0 as i64),
        extra: None,
    });
    copy!(META, "meta", |k, v| Row {
        key: key(&[k]),
        value: None,
        n: Some(v as i64),
        extra: None,
    });
    Ok(())
}

fn open_opt<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &redb::ReadTransaction,
    def: TableDefinition<K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, StoreError> {
    match txn.open_table(def) {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(redb::Error::from(e).into()),
    }
}

/// The statement that upserts one row of `table`, and its parameters.
fn upsert(table: &str) -> Cow<'static, str> {
    if let Some(t) = OWN_TABLES.iter().find(|t| t.name() == table) {
        let t = t.name();
        return format!(
            "INSERT INTO {t} (key, body, tenant, session_id)
             VALUES ($1::text, $3::text::json, CASE WHEN $4::bigint IS NULL THEN NULL ELSE $2::text END, $5::text)
             ON CONFLICT (key) DO UPDATE SET body = EXCLUDED.body,
                 tenant = EXCLUDED.tenant, session_id = EXCLUDED.session_id"
        )
        .into();
    }
    Cow::Borrowed(match table {
        "sessions" => {
            "INSERT INTO sessions (id, tenant, owner, epoch, body)
             VALUES ($1, ($2::text::json)->>'tenant', NULL, 1, $2::text::json)
             ON CONFLICT (id) DO UPDATE SET tenant = EXCLUDED.tenant, body = EXCLUDED.body"
        }
        "messages" => {
            "INSERT INTO messages (session_id, seq, is_user, body)
             VALUES ($1, $3::bigint, coalesce(($2::text::json)->>'role' = 'user', false), $2::text::json)
             ON CONFLICT (session_id, seq) DO UPDATE SET is_user = EXCLUDED.is_user, body = EXCLUDED.body"
        }
        "summaries" => {
            "INSERT INTO summaries (session_id, body) VALUES ($1, $2::text::json)
             ON CONFLICT (session_id) DO UPDATE SET body = EXCLUDED.body"
        }
        "tool_calls" => {
            "INSERT INTO tool_calls (record_id, tenant, tool_name, conversation_id, workflow_id, body)
             SELECT $1::text, j->>'tenant', j->>'tool_name', j->>'conversation_id', j->>'workflow_id', j
             FROM (SELECT $2::text::json AS j) AS r
             ON CONFLICT (record_id) DO UPDATE SET tenant = EXCLUDED.tenant,
                 tool_name = EXCLUDED.tool_name, conversation_id = EXCLUDED.conversation_id,
                 workflow_id = EXCLUDED.workflow_id, body = EXCLUDED.body"
        }
        "tool_stats" => {
            "INSERT INTO tool_stats (tool, node, total_calls, successful_calls, failed_calls,
                                     total_execution_time_ms)
             SELECT $1::text, $3::text, (j->>'total_calls')::bigint, (j->>'successful_calls')::bigint,
                    (j->>'failed_calls')::bigint, (j->>'total_execution_time_ms')::bigint
             FROM (SELECT $2::text::json AS j) AS r
             ON CONFLICT (tool, node) DO UPDATE SET total_calls = EXCLUDED.total_calls,
                 successful_calls = EXCLUDED.successful_calls, failed_calls = EXCLUDED.failed_calls,
                 total_execution_time_ms = EXCLUDED.total_execution_time_ms"
        }
        "docs" => {
            "INSERT INTO docs (namespace, key, body, tenant, session_id)
             VALUES ($1::text, $2::text, $4::text::json, CASE WHEN $5::bigint IS NULL THEN NULL ELSE $3::text END, $6::text)
             ON CONFLICT (namespace, key) DO UPDATE SET body = EXCLUDED.body,
                 tenant = EXCLUDED.tenant, session_id = EXCLUDED.session_id"
        }
        "session_usage" => {
            "INSERT INTO session_usage
             SELECT $1::text, (j->>'prompt_tokens')::bigint, (j->>'completion_tokens')::bigint,
                    (j->>'total_tokens')::bigint, (j->>'model_calls')::bigint
             FROM (SELECT $2::text::json AS j) AS r
             ON CONFLICT (session_id) DO UPDATE SET prompt_tokens = EXCLUDED.prompt_tokens,
                 completion_tokens = EXCLUDED.completion_tokens,
                 total_tokens = EXCLUDED.total_tokens, model_calls = EXCLUDED.model_calls"
        }
        "tenant_usage" => {
            "INSERT INTO tenant_usage
             SELECT $1::text, $2::text, $3::text, $5::text, (j->>'prompt_tokens')::bigint,
                    (j->>'completion_tokens')::bigint, (j->>'total_tokens')::bigint,
                    (j->>'model_calls')::bigint
             FROM (SELECT $4::text::json AS j) AS r
             ON CONFLICT (tenant, day, agent, node) DO UPDATE SET
                 prompt_tokens = EXCLUDED.prompt_tokens,
                 completion_tokens = EXCLUDED.completion_tokens,
                 total_tokens = EXCLUDED.total_tokens, model_calls = EXCLUDED.model_calls"
        }
        "turns" => {
            "INSERT INTO turns (session_id, turn_id, open, body)
             VALUES ($1, $2, $4::bigint = 1, $3::text::json)
             ON CONFLICT (session_id, turn_id) DO UPDATE SET open = EXCLUDED.open,
                 body = EXCLUDED.body"
        }
        "turn_keys" => {
            "INSERT INTO turn_keys (session_id, key, turn_id) VALUES ($1, $2, $3)
             ON CONFLICT (session_id, key) DO UPDATE SET turn_id = EXCLUDED.turn_id"
        }
        "idempotency" => {
            "INSERT INTO idempotency (tenant, key, stored_at_ms, record)
             VALUES ($1, $2, $4::bigint, convert_to($3::text, 'UTF8'))
             ON CONFLICT (tenant, key) DO UPDATE SET stored_at_ms = EXCLUDED.stored_at_ms,
                 record = EXCLUDED.record"
        }
        // Only the per-namespace "indexed" flags mean anything here.
        _ => {
            "INSERT INTO meta (key, value) SELECT $1::text, $2::bigint
             WHERE $1::text LIKE 'docs_indexed:%'
             ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
        }
    })
}

fn params<'a>(table: &str, row: &'a Row) -> Vec<&'a (dyn ToSql + Sync)> {
    let k = |i: usize| &row.key[i] as &(dyn ToSql + Sync);
    let node: &'static &'static str = &IMPORT_NODE;
    match table {
        "sessions" | "summaries" | "tool_calls" | "session_usage" => vec![k(0), &row.value],
        "messages" => vec![k(0), &row.value, &row.n],
        "tool_stats" => vec![k(0), &row.value, node],
        "docs" => vec![k(0), k(1), k(2), &row.value, &row.n, &row.extra],
        t if OWN_TABLES.iter().any(|o| o.name() == t) => {
            vec![k(0), k(1), &row.value, &row.n, &row.extra]
        }
        "tenant_usage" => vec![k(0), k(1), k(2), &row.value, node],
        "turns" => vec![k(0), k(1), &row.value, &row.n],
        "turn_keys" => vec![k(0), k(1), &row.extra],
        "idempotency" => vec![k(0), k(1), &row.value, &row.n],
        _ => vec![k(0), &row.n],
    }
}

impl PgStore {
    /// Copies every table of `<data_dir>/cadre.redb` into this database
    /// (see the module doc); how many rows of each.
    pub async fn import_redb(&self, data_dir: &Path) -> Result<Imported, StoreError> {
        let path = data_dir.join("cadre.redb");
        if !path.exists() {
            return Err(StoreError::DataDir {
                path,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no cadre.redb here"),
            });
        }
        let (tx, mut rx) = mpsc::channel(2);
        let reader = std::thread::Builder::new()
            .name("cadre-migrate-redb".into())
            .spawn(move || {
                if let Err(e) = read_file(&path, tx.clone()) {
                    let _ = tx.blocking_send(Err(e));
                }
            })
            .map_err(|_| StoreError::WriterGone)?;
        let result = self
            .run(move |mut c, _| async move {
                let mut counts: Vec<(&'static str, u64)> = Vec::new();
                while let Some(chunk) = rx.recv().await {
                    let chunk = chunk?;
                    let txn = c.transaction().await?;
                    let stmt = txn.prepare_cached(&upsert(chunk.table)).await?;
                    for row in &chunk.rows {
                        txn.execute(&stmt, &params(chunk.table, row)).await?;
                    }
                    txn.commit().await?;
                    match counts.iter_mut().find(|(t, _)| *t == chunk.table) {
                        Some((_, n)) => *n += chunk.rows.len() as u64,
                        None => counts.push((chunk.table, chunk.rows.len() as u64)),
                    }
                }
                // Rows of a file older than schema 3 came in through
                // `docs`: to their tables, as migration 002 moves them.
                let txn = c.transaction().await?;
                super::docs::move_own_docs(&txn).await?;
                // What the sessions and the records outside them store,
                // counted from the rows now here
                // (`store::storage`; the file's own counters are not copied).
                txn.batch_execute(
                    "UPDATE sessions s SET stored_bytes = coalesce(
                         (SELECT sum(octet_length(m.body::text)) FROM messages m
                          WHERE m.session_id = s.id), 0);
                     DELETE FROM tenant_call_bytes;
                     INSERT INTO tenant_call_bytes (tenant, node, bytes)
                     SELECT tenant, 'import', sum(octet_length(body::text))::bigint
                     FROM tool_calls WHERE conversation_id IS NULL AND tenant IS NOT NULL
                     GROUP BY tenant",
                )
                .await?;
                txn.commit().await?;
                Ok(Imported { tables: counts })
            })
            .await;
        let _ = reader.join();
        result
    }
}
