//! Reads of the PostgreSQL store: the redb store's read methods, one query
//! each (two where redb returns two things), on a pooled connection.
//!
//! http / conversation / executor ──read──▶ PgStore::run ──▶ SELECT … ORDER BY key ──▶ rows
//!
//! Pages read `limit + 1` rows to know whether there is a next page; the
//! cursor is the last key of the page, as in [`crate::store::listing`].
//! Tool stats and tenant usage are summed over the nodes' rows on read.
//! No read cache: another node may write any row, so every read asks the
//! database (the redb store's cache is valid only with one writer).
//! Keys a client names (a session, document or turn id in a path, a call
//! filter) pass through [`column`] as written keys do: one with NUL names
//! no row (redb's "not found"), instead of a query PostgreSQL refuses.

use crate::store::backend::{
    CallReads, DocReads, SessionReads, TenantOf, TurnReads, UsageReads, Writes,
};
use std::sync::{Arc, Mutex};

use jiff::Timestamp;
use jiff::civil::Date;
use serde_json::Value;
use tokio_postgres::Row;
use tokio_postgres::types::{Json, ToSql};

use super::docs::DocHome;
use super::{PgStore, column};
use crate::store::usage::{TokenUsage, UsageRow};
use crate::store::{
    CallFilter, MessageStats, Page, Session, SessionFilter, StoreError, StoredMessage,
    StoredSummary, ToolCallRecord, ToolStats, WriteOp,
};

pub(super) fn n(v: usize) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

pub(super) fn seq(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn body<T: serde::de::DeserializeOwned>(row: &Row, i: usize) -> Result<T, StoreError> {
    let Json(v): Json<T> = row.try_get(i)?;
    Ok(v)
}

/// The rows' bodies; one that does not decode is left out (logged), as the
/// embedded store's listings do (`rows::listed`).
fn bodies<T: serde::de::DeserializeOwned>(rows: &[Row]) -> Result<Vec<T>, StoreError> {
    Ok(rows
        .iter()
        .filter_map(|r| match body(r, 0) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(error = %e, "a stored row does not decode; listed without it");
                None
            }
        })
        .collect())
}

/// Keeps `limit` items; the cursor of the next page when there was one more.
fn into_page<T>(mut items: Vec<T>, limit: usize, key: impl Fn(&T) -> String) -> Page<T> {
    if items.len() > limit {
        items.truncate(limit);
        let next = items.last().map(&key);
        Page { items, next }
    } else {
        Page { items, next: None }
    }
}

/// The smallest string above every string that starts with `prefix` (byte
/// order, as `COLLATE "C"` sorts UTF-8); `None` when there is none.
fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let mut next = last as u32 + 1;
        if (0xD800..0xE000).contains(&next) {
            next = 0xE000;
        }
        if let Some(c) = char::from_u32(next) {
            chars.push(c);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

fn to_stats(row: &Row) -> Result<ToolStats, StoreError> {
    let get = |i| -> Result<u64, StoreError> { Ok(row.try_get::<_, i64>(i)? as u64) };
    Ok(ToolStats {
        total_calls: get(1)?,
        successful_calls: get(2)?,
        failed_calls: get(3)?,
        total_execution_time_ms: get(4)?,
    })
}

macro_rules! sql {
    ($c:expr, $q:expr, $($p:expr),* $(,)?) => {{
        let stmt = $c.prepare_cached($q).await?;
        $c.query(&stmt, &[$($p),*]).await?
    }};
}
pub(super) use sql;

impl PgStore {
    async fn calls_before(
        &self,
        filter: CallFilter,
        before: Option<String>,
    ) -> Result<Vec<ToolCallRecord>, StoreError> {
        self.run(move |c, _| async move {
            let mut sql = String::from("SELECT body FROM tool_calls WHERE true");
            let mut params: Vec<Box<dyn ToSql + Sync + Send>> = Vec::new();
            let mut add = |col: &str, op: &str, v: &Option<String>| {
                if let Some(v) = v {
                    params.push(Box::new(column(v)));
                    sql.push_str(&format!(" AND {col} {op} ${}", params.len()));
                }
            };
            add("tenant", "=", &filter.tenant);
            add("conversation_id", "=", &filter.conversation_id);
            add("workflow_id", "=", &filter.workflow_id);
            add("tool_name", "=", &filter.tool);
            add("record_id", "<", &before);
            sql.push_str(" ORDER BY record_id DESC");
            if filter.limit > 0 {
                sql.push_str(&format!(" LIMIT {}", filter.limit));
            }
            let refs: Vec<&(dyn ToSql + Sync)> =
                params.iter().map(|p| &**p as &(dyn ToSql + Sync)).collect();
            let stmt = c.prepare_cached(&sql).await?;
            let rows = c.query(&stmt, &refs).await?;
            bodies(&rows)
        })
        .await
    }
}

#[async_trait::async_trait]
impl SessionReads for PgStore {
    /// Every session, by id.
    async fn list_sessions(&self) -> Result<Vec<Session>, StoreError> {
        self.run(|c, _| async move {
            let rows = sql!(c, "SELECT body FROM sessions ORDER BY id",);
            bodies(&rows)
        })
        .await
    }

    /// A page of `tenant`'s sessions `filter` keeps, past the id `cursor`
    /// in its order (oldest first unless `newest_first`).
    async fn sessions_matching(
        &self,
        tenant: &str,
        filter: SessionFilter,
        cursor: Option<String>,
        limit: usize,
    ) -> Result<Page<Session>, StoreError> {
        let tenant = tenant.to_string();
        self.run(move |c, _| async move {
            let query = if filter.newest_first {
                "SELECT body FROM sessions WHERE tenant = $1 AND ($2::text IS NULL OR id < $2)
                 AND ($3::text IS NULL OR body->>'agent' = $3)
                 AND ($4::text IS NULL OR body->>'user_id' = $4)
                 ORDER BY id DESC LIMIT $5"
            } else {
                "SELECT body FROM sessions WHERE tenant = $1 AND ($2::text IS NULL OR id > $2)
                 AND ($3::text IS NULL OR body->>'agent' = $3)
                 AND ($4::text IS NULL OR body->>'user_id' = $4)
                 ORDER BY id LIMIT $5"
            };
            let rows = sql!(
                c,
                query,
                &tenant,
                &cursor,
                &filter.agent,
                &filter.user_id,
                &n(limit.saturating_add(1))
            );
            Ok(into_page(bodies(&rows)?, limit, |s: &Session| s.id.clone()))
        })
        .await
    }

    async fn get_session(&self, id: &str) -> Result<Option<Session>, StoreError> {
        let id = column(id);
        self.run(move |c, _| async move {
            let rows = sql!(c, "SELECT body FROM sessions WHERE id = $1", &id);
            rows.first().map(|r| body(r, 0)).transpose()
        })
        .await
    }

    async fn get_summary(&self, session_id: &str) -> Result<Option<StoredSummary>, StoreError> {
        let id = session_id.to_string();
        self.run(move |c, _| async move {
            let rows = sql!(c, "SELECT body FROM summaries WHERE session_id = $1", &id);
            rows.first().map(|r| body(r, 0)).transpose()
        })
        .await
    }

    /// The messages after `after`, at most the last `max`, oldest first;
    /// and the session's last seq.
    async fn unsummarised_messages(
        &self,
        session_id: &str,
        after: u64,
        max: usize,
    ) -> Result<(Vec<StoredMessage>, u64), StoreError> {
        let id = session_id.to_string();
        self.run(move |c, _| async move {
            let rows = sql!(
                c,
                "SELECT body FROM messages WHERE session_id = $1 AND seq > $2
                 ORDER BY seq DESC LIMIT $3",
                &id,
                &seq(after),
                &n(max)
            );
            let mut out: Vec<StoredMessage> = bodies(&rows)?;
            out.reverse();
            let last = sql!(
                c,
                "SELECT coalesce(max(seq), 0) FROM messages WHERE session_id = $1",
                &id
            );
            Ok((out, last[0].try_get::<_, i64>(0)? as u64))
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
        self.run(move |c, _| async move {
            let rows = sql!(
                c,
                "SELECT body FROM messages WHERE session_id = $1 AND seq > $2
                 ORDER BY seq LIMIT $3",
                &id,
                &seq(after),
                &n(limit)
            );
            bodies(&rows)
        })
        .await
    }

    /// Messages with seq > `after`, oldest first.
    async fn messages_after(
        &self,
        session_id: &str,
        after: u64,
    ) -> Result<Vec<StoredMessage>, StoreError> {
        self.messages_page(session_id, after, usize::MAX).await
    }

    /// The last `n` messages (oldest first) and the session's last seq.
    async fn recent_messages(
        &self,
        session_id: &str,
        count: usize,
    ) -> Result<(Vec<StoredMessage>, u64), StoreError> {
        self.unsummarised_messages(session_id, 0, count).await
    }

    /// How many messages, how many from the user, when the last was written.
    async fn message_stats(&self, session_id: &str) -> Result<MessageStats, StoreError> {
        let id = session_id.to_string();
        self.run(move |c, _| async move {
            let rows = sql!(
                c,
                "SELECT count(*), count(*) FILTER (WHERE is_user),
                        (SELECT body FROM messages WHERE session_id = $1 ORDER BY seq DESC LIMIT 1)
                 FROM messages WHERE session_id = $1",
                &id
            );
            let row = &rows[0];
            let last: Option<Json<StoredMessage>> = row.try_get(2)?;
            Ok(MessageStats {
                count: row.try_get::<_, i64>(0)? as u64,
                user_messages: row.try_get::<_, i64>(1)? as u64,
                last_at: last.map(|m| m.0.created_at),
            })
        })
        .await
    }

    async fn message_count(&self, session_id: &str) -> Result<u64, StoreError> {
        let id = session_id.to_string();
        self.run(move |c, _| async move {
            let rows = sql!(
                c,
                "SELECT count(*) FROM messages WHERE session_id = $1",
                &id
            );
            Ok(rows[0].try_get::<_, i64>(0)? as u64)
        })
        .await
    }

    /// Up to `limit` sessions after the id `after`, each with when it was
    /// last active (its last message, else its creation).
    async fn sessions_with_activity(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> Result<Vec<(Session, Timestamp)>, StoreError> {
        self.run(move |c, _| async move {
            let rows = sql!(
                c,
                "SELECT s.body, (SELECT m.body FROM messages m WHERE m.session_id = s.id
                                 ORDER BY m.seq DESC LIMIT 1)
                 FROM sessions s WHERE ($1::text IS NULL OR s.id > $1) ORDER BY s.id LIMIT $2",
                &after,
                &n(limit)
            );
            rows.iter()
                .map(|r| {
                    let s: Session = body(r, 0)?;
                    let last: Option<Json<StoredMessage>> = r.try_get(1)?;
                    let at = last.map_or(s.created_at, |m| m.0.created_at);
                    Ok((s, at))
                })
                .collect()
        })
        .await
    }
}

#[async_trait::async_trait]
impl CallReads for PgStore {
    /// A page of `tenant`'s call records matching `filter` (its `tenant`
    /// and `limit` ignored) before the record id `before`, newest first.
    async fn calls_of(
        &self,
        tenant: &str,
        filter: CallFilter,
        before: Option<String>,
        limit: usize,
    ) -> Result<Page<ToolCallRecord>, StoreError> {
        let filter = CallFilter {
            tenant: Some(tenant.to_string()),
            limit: limit.saturating_add(1),
            ..filter
        };
        let items = self.calls_before(filter, before).await?;
        Ok(into_page(items, limit, |r: &ToolCallRecord| {
            r.record_id.clone()
        }))
    }

    /// Call records matching the filter, newest first, at most `limit`
    /// (all when 0).
    async fn calls(&self, filter: CallFilter) -> Result<Vec<ToolCallRecord>, StoreError> {
        self.calls_before(filter, None).await
    }

    /// The records with these ids that exist: one query.
    async fn calls_by_id(&self, ids: Vec<String>) -> Result<Vec<ToolCallRecord>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = ids.iter().map(|i| column(i)).collect();
        self.run(move |c, _| async move {
            let rows = sql!(
                c,
                "SELECT body FROM tool_calls WHERE record_id = ANY($1)",
                &ids
            );
            bodies(&rows)
        })
        .await
    }

    async fn record_count(&self) -> Result<u64, StoreError> {
        self.run(|c, _| async move {
            let rows = sql!(c, "SELECT count(*) FROM tool_calls",);
            Ok(rows[0].try_get::<_, i64>(0)? as u64)
        })
        .await
    }

    /// Counters of every tool, by name, summed over the nodes.
    async fn all_tool_stats(&self) -> Result<Vec<(String, ToolStats)>, StoreError> {
        self.run(|c, _| async move {
            let rows = sql!(
                c,
                "SELECT tool, sum(total_calls)::bigint, sum(successful_calls)::bigint,
                        sum(failed_calls)::bigint, sum(total_execution_time_ms)::bigint
                 FROM tool_stats GROUP BY tool ORDER BY tool",
            );
            rows.iter()
                .map(|r| Ok((r.try_get(0)?, to_stats(r)?)))
                .collect()
        })
        .await
    }

    async fn tool_stats(&self, tool: &str) -> Result<ToolStats, StoreError> {
        let tool = column(tool);
        self.run(move |c, _| async move {
            let rows = sql!(
                c,
                "SELECT tool, sum(total_calls)::bigint, sum(successful_calls)::bigint,
                        sum(failed_calls)::bigint, sum(total_execution_time_ms)::bigint
                 FROM tool_stats WHERE tool = $1 GROUP BY tool",
                &tool
            );
            rows.first()
                .map(to_stats)
                .transpose()
                .map(Option::unwrap_or_default)
        })
        .await
    }
}

#[async_trait::async_trait]
impl DocReads for PgStore {
    /// A document of a namespace, if present.
    async fn get_doc(&self, namespace: &str, key: &str) -> Result<Option<Value>, StoreError> {
        let (ns, k) = (namespace.to_string(), column(key));
        self.run(move |c, _| async move {
            let home = DocHome::of(&ns);
            let q = format!(
                "SELECT body FROM {} WHERE {}key = $1",
                home.table,
                home.and_ns(2)
            );
            let mut params: Vec<&(dyn ToSql + Sync)> = vec![&k];
            params.extend(home.ns_param());
            let stmt = c.prepare_cached(&q).await?;
            let rows = c.query(&stmt, &params).await?;
            rows.first().map(|r| body(r, 0)).transpose()
        })
        .await
    }

    /// Every document of a namespace whose key starts with `prefix`, by key.
    async fn list_docs(
        &self,
        namespace: &str,
        prefix: &str,
    ) -> Result<Vec<(String, Value)>, StoreError> {
        let (ns, prefix) = (namespace.to_string(), prefix.to_string());
        self.run(move |c, _| async move {
            let end = prefix_end(&prefix);
            let home = DocHome::of(&ns);
            let q = format!(
                "SELECT key, body FROM {} WHERE {}key >= $1
                 AND ($2::text IS NULL OR key < $2) ORDER BY key",
                home.table,
                home.and_ns(3)
            );
            let mut params: Vec<&(dyn ToSql + Sync)> = vec![&prefix, &end];
            params.extend(home.ns_param());
            let stmt = c.prepare_cached(&q).await?;
            let rows = c.query(&stmt, &params).await?;
            rows.iter()
                .map(|r| Ok((r.try_get(0)?, body(r, 1)?)))
                .collect()
        })
        .await
    }

    /// A page of `tenant`'s documents of `namespace` past `cursor`, by key
    /// (`newest_first`: descending).
    async fn docs_of(
        &self,
        namespace: &str,
        tenant: &str,
        cursor: Option<String>,
        limit: usize,
        newest_first: bool,
    ) -> Result<Page<(String, Value)>, StoreError> {
        let (ns, tenant) = (namespace.to_string(), tenant.to_string());
        self.run(move |c, _| async move {
            let lim = n(limit.saturating_add(1));
            let home = DocHome::of(&ns);
            let (cmp, order) = if newest_first {
                ("<", "DESC")
            } else {
                (">", "")
            };
            let q = format!(
                "SELECT key, body FROM {} WHERE {}tenant = $1
                 AND ($2::text IS NULL OR key {cmp} $2) ORDER BY key {order} LIMIT $3",
                home.table,
                home.and_ns(4)
            );
            let mut params: Vec<&(dyn ToSql + Sync)> = vec![&tenant, &cursor, &lim];
            params.extend(home.ns_param());
            let stmt = c.prepare_cached(&q).await?;
            let rows = c.query(&stmt, &params).await?;
            let items = rows
                .iter()
                .map(|r| Ok((r.try_get(0)?, body(r, 1)?)))
                .collect::<Result<Vec<(String, Value)>, StoreError>>()?;
            Ok(into_page(items, limit, |(k, _)| k.clone()))
        })
        .await
    }

    /// Indexes by tenant the documents of `namespace` written without one,
    /// once per namespace (later calls return `None`).
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
        self.write(vec![op], true).await?;
        let found = indexed.lock().expect("index slot").take();
        Ok(found)
    }
}

#[async_trait::async_trait]
impl TurnReads for PgStore {
    /// The record of turn `turn_id` of session `session_id`.
    async fn turn(&self, session_id: &str, turn_id: &str) -> Result<Option<Value>, StoreError> {
        let (s, t) = (column(session_id), column(turn_id));
        self.run(move |c, _| async move {
            let rows = sql!(
                c,
                "SELECT body FROM turns WHERE session_id = $1 AND turn_id = $2",
                &s,
                &t
            );
            rows.first().map(|r| body(r, 0)).transpose()
        })
        .await
    }

    /// The turn a message with `key` started in the session, if any.
    async fn turn_by_key(&self, session_id: &str, key: &str) -> Result<Option<String>, StoreError> {
        let (s, k) = (session_id.to_string(), key.to_string());
        self.run(move |c, _| async move {
            let rows = sql!(
                c,
                "SELECT turn_id FROM turn_keys WHERE session_id = $1 AND key = $2",
                &s,
                &k
            );
            Ok(rows.first().map(|r| r.try_get(0)).transpose()?)
        })
        .await
    }

    /// The last turn of a session that is not final.
    async fn open_turn_of(&self, session_id: &str) -> Result<Option<Value>, StoreError> {
        let s = session_id.to_string();
        self.run(move |c, _| async move {
            let rows = sql!(
                c,
                "SELECT body FROM turns WHERE session_id = $1 AND open
                 ORDER BY turn_id DESC LIMIT 1",
                &s
            );
            rows.first().map(|r| body(r, 0)).transpose()
        })
        .await
    }

    /// A page of a session's turn records after turn id `after`, oldest first.
    async fn turns_of(
        &self,
        session_id: &str,
        after: Option<String>,
        limit: usize,
    ) -> Result<Page<Value>, StoreError> {
        let s = session_id.to_string();
        self.run(move |c, _| async move {
            let rows = sql!(
                c,
                "SELECT turn_id, body FROM turns WHERE session_id = $1
                 AND ($2::text IS NULL OR turn_id > $2) ORDER BY turn_id LIMIT $3",
                &s,
                &after,
                &n(limit.saturating_add(1))
            );
            let items = rows
                .iter()
                .map(|r| Ok((r.try_get::<_, String>(0)?, body::<Value>(r, 1)?)))
                .collect::<Result<Vec<_>, StoreError>>()?;
            let page = into_page(items, limit, |(id, _)| id.clone());
            Ok(Page {
                items: page.items.into_iter().map(|(_, v)| v).collect(),
                next: page.next,
            })
        })
        .await
    }

    /// Every `(session, turn)` whose record is not final, by session.
    async fn open_turns(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.run(|c, _| async move {
            let rows = sql!(
                c,
                "SELECT session_id, turn_id FROM turns WHERE open ORDER BY session_id, turn_id",
            );
            rows.iter()
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                .collect()
        })
        .await
    }
}

#[async_trait::async_trait]
impl UsageReads for PgStore {
    /// Every model call of a session, added up.
    async fn session_usage(&self, session_id: &str) -> Result<TokenUsage, StoreError> {
        let id = session_id.to_string();
        self.run(move |c, _| async move {
            let rows = sql!(
                c,
                "SELECT prompt_tokens, completion_tokens, total_tokens, model_calls
                 FROM session_usage WHERE session_id = $1",
                &id
            );
            rows.first()
                .map(|r| usage(r, 0))
                .transpose()
                .map(Option::unwrap_or_default)
        })
        .await
    }

    /// The rows of days `from..=to`, of one tenant or of every tenant, by
    /// tenant, day and agent (the nodes' rows summed).
    async fn usage_rows(
        &self,
        tenant: Option<&str>,
        from: Date,
        to: Date,
    ) -> Result<Vec<UsageRow>, StoreError> {
        let only = tenant.map(str::to_string);
        let (from, to) = (from.to_string(), to.to_string());
        self.run(move |c, _| async move {
            let rows = sql!(
                c,
                "SELECT tenant, day, agent, sum(prompt_tokens)::bigint,
                        sum(completion_tokens)::bigint, sum(total_tokens)::bigint,
                        sum(model_calls)::bigint
                 FROM tenant_usage WHERE ($1::text IS NULL OR tenant = $1)
                 AND day >= $2 AND day <= $3
                 GROUP BY tenant, day, agent ORDER BY tenant, day, agent",
                &only,
                &from,
                &to
            );
            rows.iter()
                .map(|r| {
                    let day: String = r.try_get(1)?;
                    Ok(UsageRow {
                        tenant: r.try_get(0)?,
                        day: day.parse().map_err(|_| {
                            StoreError::Corrupt(serde::de::Error::custom(format!(
                                "usage row with day {day:?}"
                            )))
                        })?,
                        agent: r.try_get(2)?,
                        usage: usage(r, 3)?,
                    })
                })
                .collect()
        })
        .await
    }

    /// One tenant's usage over days `from..=to`, added up.
    async fn tenant_usage(
        &self,
        tenant: &str,
        from: Date,
        to: Date,
    ) -> Result<TokenUsage, StoreError> {
        let mut total = TokenUsage::default();
        for row in self.usage_rows(Some(tenant), from, to).await? {
            total.add(&row.usage);
        }
        Ok(total)
    }

    async fn stored_bytes(&self, tenant: &str) -> Result<u64, StoreError> {
        let tenant = tenant.to_string();
        self.run(move |c, _| async move {
            let rows = sql!(
                c,
                "SELECT ((SELECT coalesce(sum(stored_bytes), 0) FROM sessions WHERE tenant = $1)
                       + (SELECT coalesce(sum(bytes), 0) FROM tenant_call_bytes WHERE tenant = $1)
                      )::bigint",
                &tenant
            );
            let n: i64 = rows.first().map(|r| r.try_get(0)).transpose()?.unwrap_or(0);
            Ok(n.max(0) as u64)
        })
        .await
    }
}

fn usage(row: &Row, at: usize) -> Result<TokenUsage, StoreError> {
    let get = |i: usize| -> Result<u64, StoreError> { Ok(row.try_get::<_, i64>(at + i)? as u64) };
    Ok(TokenUsage {
        prompt_tokens: get(0)?,
        completion_tokens: get(1)?,
        total_tokens: get(2)?,
        model_calls: get(3)?,
    })
}
