//! Listings by tenant: the tenant-first index rows, their pages, and the
//! migration that indexes rows written before the indexes existed.
//!
//! writer (commit_batch) ──index_*──▶ SESSIONS_BY_TENANT · TOOL_CALLS_BY_TENANT · DOCS_BY_TENANT
//! GET /v1/sessions, /v1/calls, /v1/confirmations, /v1/workflows/runs
//!     ──▶ *_page(tenant, cursor, limit) ──range of the tenant's rows──▶ Page { items, next }
//!
//! Every listing is one range of index keys that begin with the caller's
//! tenant, read from the cursor on, and stops after `limit + 1` matches: it
//! reads the caller's page (plus one key to know whether there is more),
//! never another tenant's rows. The index rows are written in the same
//! transaction as the row they index, by the one writer.
//!
//! Decisions:
//! - The cursor is the last key of the page (a session id, a record id, a
//!   document key). Clients treat it as opaque; keys only grow (UUID v7), so
//!   a cursor stays valid while rows are added, and a walk sees each row
//!   that existed when it started exactly once.
//! - Range bounds are exact: every key of tenant `t` sorts before
//!   `(t + "\0", ..)`, so no sentinel character can cut a listing short.
//! - Documents carry no schema the store knows: the writer of a namespace
//!   names the tenant ([`super::DocReads::put_doc_of`]) and, for documents
//!   written before the index, gives a function that reads it
//!   ([`super::DocReads::index_docs`]), run once per namespace at startup.
//!   [`DOC_TENANTS`] remembers each indexed document's tenant so a delete
//!   or a move drops its index row without parsing the document.

use std::ops::Bound;

use redb::{ReadableTable, Table, WriteTransaction};
use serde_json::Value;

use super::rows::listed;
use super::tables::*;
use super::{CallFilter, Session, SessionFilter, StoreError, ToolCallRecord};

/// One page of a listing and the cursor of the next (`None`: it was the last).
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

/// The key just above every key that starts with `s` in a tuple.
fn after_all(s: &str) -> String {
    format!("{s}\0")
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

/// The facets a call is listed under (see [`TOOL_CALLS_BY_TENANT`]).
fn call_facets(rec: &ToolCallRecord) -> Vec<String> {
    let mut facets = vec![String::new(), format!("t:{}", rec.tool_name)];
    if let Some(c) = &rec.conversation_id {
        facets.push(format!("c:{c}"));
    }
    if let Some(w) = &rec.workflow_id {
        facets.push(format!("w:{w}"));
    }
    facets
}

pub(super) fn index_session(
    table: &mut Table<(&str, &str), ()>,
    s: &Session,
) -> Result<(), StoreError> {
    table.insert((s.tenant.as_str(), s.id.as_str()), ())?;
    Ok(())
}

pub(super) fn index_call(
    table: &mut Table<(&str, &str, &str), ()>,
    rec: &ToolCallRecord,
) -> Result<(), StoreError> {
    let Some(tenant) = &rec.tenant else {
        return Ok(());
    };
    for facet in call_facets(rec) {
        table.insert(
            (tenant.as_str(), facet.as_str(), rec.record_id.as_str()),
            (),
        )?;
    }
    Ok(())
}

/// Drops the index rows [`index_call`] wrote for `rec`.
pub(super) fn unindex_call(
    table: &mut Table<(&str, &str, &str), ()>,
    rec: &ToolCallRecord,
) -> Result<(), StoreError> {
    let Some(tenant) = &rec.tenant else {
        return Ok(());
    };
    for facet in call_facets(rec) {
        table.remove((tenant.as_str(), facet.as_str(), rec.record_id.as_str()))?;
    }
    Ok(())
}

/// Lists `(namespace, key)` under `tenant`, moving it from another tenant.
pub(super) fn index_doc(
    by_tenant: &mut Table<(&str, &str, &str), ()>,
    tenants: &mut Table<(&str, &str), &str>,
    namespace: &str,
    key: &str,
    tenant: &str,
) -> Result<(), StoreError> {
    let old = tenants
        .insert((namespace, key), tenant)?
        .map(|v| v.value().to_string());
    if let Some(old) = old.filter(|o| o != tenant) {
        by_tenant.remove((namespace, old.as_str(), key))?;
    }
    by_tenant.insert((namespace, tenant, key), ())?;
    Ok(())
}

/// Drops the index row of `(namespace, key)`, if it has one.
pub(super) fn unindex_doc(
    by_tenant: &mut Table<(&str, &str, &str), ()>,
    tenants: &mut Table<(&str, &str), &str>,
    namespace: &str,
    key: &str,
) -> Result<(), StoreError> {
    let old = tenants
        .remove((namespace, key))?
        .map(|v| v.value().to_string());
    if let Some(old) = old {
        by_tenant.remove((namespace, old.as_str(), key))?;
    }
    Ok(())
}

/// Schema 1 -> 2: indexes every session and call record by tenant. One
/// pass over each table in the opening transaction; documents are indexed
/// per namespace by [`index_namespace`].
pub(super) fn migrate_v1(txn: &WriteTransaction) -> Result<(u64, u64), StoreError> {
    let (mut n_sessions, mut n_calls) = (0, 0);
    {
        let sessions = txn.open_table(SESSIONS)?;
        let mut index = txn.open_table(SESSIONS_BY_TENANT)?;
        for row in sessions.iter()? {
            let (_, v) = row?;
            let s: Session = crate::store::codec::json(v.value())?;
            index_session(&mut index, &s)?;
            n_sessions += 1;
        }
    }
    {
        let calls = txn.open_table(TOOL_CALLS)?;
        let mut index = txn.open_table(TOOL_CALLS_BY_TENANT)?;
        for row in calls.iter()? {
            let (_, v) = row?;
            let rec: ToolCallRecord = crate::store::codec::json(v.value())?;
            index_call(&mut index, &rec)?;
            n_calls += 1;
        }
    }
    Ok((n_sessions, n_calls))
}

/// Indexes every document of `namespace` by the tenant `tenant_of` reads
/// from it, once: `None` when the namespace was indexed already, else how
/// many documents were.
pub(super) fn index_namespace(
    docs: &mut super::docs::DocTables<'_>,
    by_tenant: &mut Table<(&str, &str, &str), ()>,
    tenants: &mut Table<(&str, &str), &str>,
    meta: &mut Table<&str, u64>,
    namespace: &str,
    tenant_of: fn(&Value) -> Option<String>,
) -> Result<Option<u64>, StoreError> {
    let flag = format!("docs_indexed:{namespace}");
    if meta.get(flag.as_str())?.is_some() {
        return Ok(None);
    }
    let mut found = Vec::new();
    for (key, v) in docs.with_prefix(namespace, "")? {
        let value: Value = crate::store::codec::json(&v)?;
        if let Some(tenant) = tenant_of(&value) {
            found.push((key, tenant));
        }
    }
    for (key, tenant) in &found {
        index_doc(by_tenant, tenants, namespace, key, tenant)?;
    }
    meta.insert(flag.as_str(), 1)?;
    Ok(Some(found.len() as u64))
}

/// A page of `tenant`'s sessions `filter` keeps, past `cursor` in the
/// filter's order (oldest first unless `newest_first`).
pub(super) fn sessions_page(
    db: &redb::Database,
    tenant: &str,
    filter: &SessionFilter,
    cursor: Option<&str>,
    limit: usize,
) -> Result<Page<Session>, StoreError> {
    use redb::ReadableDatabase;
    let txn = db.begin_read()?;
    let index = txn.open_table(SESSIONS_BY_TENANT)?;
    let sessions = txn.open_table(SESSIONS)?;
    let end = after_all(tenant);
    let first = Bound::Included((tenant, ""));
    let last = Bound::Excluded((end.as_str(), ""));
    let range = match (cursor, filter.newest_first) {
        (None, _) => index.range::<(&str, &str)>((first, last))?,
        (Some(c), false) => index.range::<(&str, &str)>((Bound::Excluded((tenant, c)), last))?,
        (Some(c), true) => index.range::<(&str, &str)>((first, Bound::Excluded((tenant, c))))?,
    };
    let rows: Box<dyn Iterator<Item = _>> = if filter.newest_first {
        Box::new(range.rev())
    } else {
        Box::new(range)
    };
    let mut items = Vec::new();
    for row in rows {
        let (k, _) = row?;
        if let Some(v) = sessions.get(k.value().1)?
            && let Some(session) = listed::<Session>(v.value(), "sessions", k.value().1)
            && filter.keeps(&session)
        {
            items.push(session);
            if items.len() > limit {
                break;
            }
        }
    }
    Ok(into_page(items, limit, |s| s.id.clone()))
}

/// A page of `filter.tenant`'s calls before `before`, newest first. The
/// range read is the most selective facet (workflow run, conversation,
/// tool, else all of the tenant's); other fields filter within it.
pub(super) fn calls_page(
    db: &redb::Database,
    tenant: &str,
    filter: &CallFilter,
    before: Option<&str>,
    limit: usize,
) -> Result<Page<ToolCallRecord>, StoreError> {
    use redb::ReadableDatabase;
    let txn = db.begin_read()?;
    let index = txn.open_table(TOOL_CALLS_BY_TENANT)?;
    let records = txn.open_table(TOOL_CALLS)?;
    let facet = match (&filter.workflow_id, &filter.conversation_id, &filter.tool) {
        (Some(w), _, _) => format!("w:{w}"),
        (None, Some(c), _) => format!("c:{c}"),
        (None, None, Some(t)) => format!("t:{t}"),
        _ => String::new(),
    };
    let keep = |r: &ToolCallRecord| {
        filter.tool.as_ref().is_none_or(|t| &r.tool_name == t)
            && filter
                .conversation_id
                .as_ref()
                .is_none_or(|c| r.conversation_id.as_ref() == Some(c))
            && filter
                .workflow_id
                .as_ref()
                .is_none_or(|w| r.workflow_id.as_ref() == Some(w))
    };
    let facet_end = after_all(&facet);
    let upper = match before {
        Some(b) => Bound::Excluded((tenant, facet.as_str(), b)),
        None => Bound::Excluded((tenant, facet_end.as_str(), "")),
    };
    let lower = Bound::Included((tenant, facet.as_str(), ""));
    let mut items = Vec::new();
    for row in index.range::<(&str, &str, &str)>((lower, upper))?.rev() {
        let (k, _) = row?;
        if let Some(v) = records.get(k.value().2)?
            && let Some(r) = listed::<ToolCallRecord>(v.value(), "tool_calls", k.value().2)
            && keep(&r)
        {
            items.push(r);
            if items.len() > limit {
                break;
            }
        }
    }
    Ok(into_page(items, limit, |r| r.record_id.clone()))
}

/// A page of `tenant`'s documents of `namespace` past `cursor`, by key
/// (`newest_first`: descending).
pub(super) fn docs_page(
    db: &redb::Database,
    namespace: &str,
    tenant: &str,
    cursor: Option<&str>,
    limit: usize,
    newest_first: bool,
) -> Result<Page<(String, Value)>, StoreError> {
    use redb::ReadableDatabase;
    let txn = db.begin_read()?;
    let index = txn.open_table(DOCS_BY_TENANT)?;
    let docs = super::docs::DocsRead::open(&txn, namespace)?;
    let end = after_all(tenant);
    let all = (
        Bound::Included((namespace, tenant, "")),
        Bound::Excluded((namespace, end.as_str(), "")),
    );
    let range = match (cursor, newest_first) {
        (None, _) => all,
        (Some(c), false) => (Bound::Excluded((namespace, tenant, c)), all.1),
        (Some(c), true) => (all.0, Bound::Excluded((namespace, tenant, c))),
    };
    let rows = index.range::<(&str, &str, &str)>(range)?;
    let rows: Box<dyn Iterator<Item = _>> = if newest_first {
        Box::new(rows.rev())
    } else {
        Box::new(rows)
    };
    let mut items = Vec::new();
    for row in rows {
        let (k, _) = row?;
        let key = k.value().2;
        if let Some(v) = docs.get(namespace, key)?
            && let Some(value) = listed(&v, namespace, key)
        {
            items.push((key.to_string(), value));
            if items.len() > limit {
                break;
            }
        }
    }
    Ok(into_page(items, limit, |(k, _)| k.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::prelude::*;
    use crate::store::{RedbStore as Store, WriteOp};
    use serde_json::json;

    fn session(tenant: &str) -> Session {
        Session {
            id: format!("s_{}", uuid::Uuid::now_v7().simple()),
            tenant: tenant.into(),
            agent: "helper".into(),
            user_id: None,
            plan: Default::default(),
            metadata: Value::Null,
            created_at: jiff::Timestamp::now(),
            forked_from: None,
        }
    }

    fn call(tenant: &str) -> ToolCallRecord {
        ToolCallRecord {
            guardrails: Vec::new(),
            cached: false,
            record_id: uuid::Uuid::now_v7().to_string(),
            tool_name: "echo".into(),
            tool_call_id: None,
            params: json!({}),
            output: None,
            is_success: true,
            error: None,
            error_type: None,
            execution_time_ms: 0,
            attempts: 1,
            caller_id: "t".into(),
            caller_type: "direct".into(),
            source_id: None,
            turn_id: None,
            conversation_id: None,
            workflow_id: None,
            user_id: None,
            tenant: Some(tenant.into()),
            created_at: jiff::Timestamp::now(),
            started_at: None,
        }
    }

    /// Rows of the tenants that sort next to `acme` are interleaved with
    /// acme's: a listing of acme that read any of them would list it. The
    /// same listing of such a tenant lists exactly its own rows, so the rows
    /// are there to be found (one per round: four).
    #[tokio::test]
    async fn a_tenants_listing_reads_only_its_index_range() {
        let store = Store::open_in_memory().unwrap();
        let neighbours = ["acm", "acmea", "acme0", "b"];
        let (mut sessions, mut calls, mut docs) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..4 {
            let (s, c) = (session("acme"), call("acme"));
            let key = format!("k{}", uuid::Uuid::now_v7().simple());
            sessions.push(s.id.clone());
            calls.push(c.record_id.clone());
            docs.push(key.clone());
            store
                .write(
                    vec![WriteOp::PutSession(s), WriteOp::RecordToolCall(Box::new(c))],
                    false,
                )
                .await
                .unwrap();
            let put = WriteOp::PutDoc {
                namespace: "ns".into(),
                key: key.clone(),
                value: json!({ "i": i }),
                tenant: Some("acme".into()),
            };
            store.write(vec![put], false).await.unwrap();
            let db = store.db.current();
            let txn = db.begin_write().unwrap();
            {
                let mut s = txn.open_table(SESSIONS).unwrap();
                let mut si = txn.open_table(SESSIONS_BY_TENANT).unwrap();
                let mut c = txn.open_table(TOOL_CALLS).unwrap();
                let mut ci = txn.open_table(TOOL_CALLS_BY_TENANT).unwrap();
                let mut d = txn.open_table(DOCS).unwrap();
                let mut di = txn.open_table(DOCS_BY_TENANT).unwrap();
                for t in neighbours {
                    let id = uuid::Uuid::now_v7().to_string();
                    let theirs = Session {
                        id: id.clone(),
                        ..session(t)
                    };
                    let session_row = serde_json::to_vec(&theirs).unwrap();
                    s.insert(id.as_str(), session_row.as_slice()).unwrap();
                    si.insert((t, id.as_str()), ()).unwrap();
                    let record = ToolCallRecord {
                        guardrails: Vec::new(),
                        record_id: id.clone(),
                        ..call(t)
                    };
                    let call_row = serde_json::to_vec(&record).unwrap();
                    c.insert(id.as_str(), call_row.as_slice()).unwrap();
                    ci.insert((t, "", id.as_str()), ()).unwrap();
                    d.insert(("ns", id.as_str()), br#"{"i":-1}"#.as_slice())
                        .unwrap();
                    di.insert(("ns", t, id.as_str()), ()).unwrap();
                }
            }
            txn.commit().unwrap();
        }
        let db = store.db.current();
        let ids = |p: Page<Session>| p.items.into_iter().map(|s| s.id).collect::<Vec<_>>();
        assert_eq!(
            ids(sessions_page(&db, "acme", &SessionFilter::default(), None, 10).unwrap()),
            sessions
        );
        let first = sessions_page(&db, "acme", &SessionFilter::default(), None, 3).unwrap();
        assert_eq!(first.next.as_deref(), Some(sessions[2].as_str()));
        let rest = sessions_page(
            &db,
            "acme",
            &SessionFilter::default(),
            first.next.as_deref(),
            3,
        )
        .unwrap();
        assert_eq!(
            (ids(rest.clone()), rest.next),
            (sessions[3..].to_vec(), None)
        );

        let filter = CallFilter::default();
        let page = calls_page(&db, "acme", &filter, None, 10).unwrap();
        let mut newest_first = calls.clone();
        newest_first.reverse();
        let got: Vec<_> = page.items.iter().map(|c| c.record_id.clone()).collect();
        assert_eq!(got, newest_first);

        for newest in [false, true] {
            let page = docs_page(&db, "ns", "acme", None, 10, newest).unwrap();
            let mut want = docs.clone();
            if newest {
                want.reverse();
            }
            let got: Vec<_> = page.items.into_iter().map(|(k, _)| k).collect();
            assert_eq!(got, want);
        }

        for t in neighbours {
            let theirs = sessions_page(&db, t, &SessionFilter::default(), None, 10).unwrap();
            assert_eq!(theirs.items.len(), 4, "{t}");
            assert!(theirs.items.iter().all(|s| s.tenant == t));
            let theirs = calls_page(&db, t, &filter, None, 10).unwrap();
            assert_eq!(theirs.items.len(), 4, "{t}");
            assert!(theirs.items.iter().all(|c| c.tenant.as_deref() == Some(t)));
            assert_eq!(
                docs_page(&db, "ns", t, None, 10, false)
                    .unwrap()
                    .items
                    .len(),
                4
            );
        }
    }
}
