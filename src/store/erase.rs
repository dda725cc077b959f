//! Erasing a session: every row stored under its id, in one transaction
//! of the one writer.
//!
//! Sessions::delete ──WriteOp::DeleteSession──▶ writer ──delete_session──▶ the tables below
//! Confirmations::create ──WriteOp::LinkDoc──▶ DOCS_BY_SESSION · DOC_SESSIONS
//!
//! What goes: the session row and its tenant index row, its messages, its
//! rolling summary, its usage row, every call record it made (with the
//! record's conversation, tool, workflow and tenant index rows), and the
//! documents linked to it ([`WriteOp::LinkDoc`]: its confirmations, pending
//! and decided, with their tenant index rows), and its turn records with
//! their open and idempotency-key rows ([`super::turns`]). A document keeps its link
//! when it is moved (a pending confirmation decided) and loses it when it
//! is deleted.
//!
//! Decisions:
//! - What stays: the per-tool counters ([`TOOL_STATS`]) count calls ever
//!   made and are not decremented, and the tenant's usage rows
//!   ([`TENANT_USAGE`], per tenant, day and agent) stay for billing. Neither
//!   holds a session id or anything the session said.
//! - One session is one transaction: its rows are ranges of keys that begin
//!   with its id, so the work is proportional to what the session holds.
//!   Erasing many sessions is many such operations ([`super::SessionReads::erase_session`]
//!   per session), never one transaction.
//! - A document linked before the link existed (confirmations created by an
//!   older version) is not found here; pending ones expire.
//! - Late writes: the writer remembers the ids it erased ([`ErasedIds`],
//!   in memory, the last [`REMEMBER_ERASED`]) and drops what a later write
//!   would store under one of them (a session row, messages, a summary,
//!   the session's usage row, a call record of the conversation, a
//!   document link), also later in the batch of the erase. So a tool call
//!   approved just before its session was deleted, or an operator assigned
//!   meanwhile, cannot bring any of it back; the ids are not written
//!   anywhere.
//! - [`dump_file`] reads every table of a closed file as text, so tests can
//!   show that an erased id is nowhere in the store.

use std::collections::{HashSet, VecDeque};
use std::path::Path;

use redb::{ReadableDatabase, ReadableTable, Table, TableHandle};

use super::tables::*;
use super::{Session, StoreError, ToolCallRecord, listing};

/// What erasing one session removed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Erased {
    pub tenant: String,
    pub messages: u64,
    pub calls: u64,
    pub documents: u64,
}

/// Erased session ids the writer remembers, oldest forgotten first.
pub const REMEMBER_ERASED: usize = 65_536;

/// The session ids erased lately (see the module doc): writes under them
/// are dropped. Every backend's writer keeps one.
#[derive(Default)]
pub struct ErasedIds {
    ids: HashSet<String>,
    order: VecDeque<String>,
}

impl ErasedIds {
    pub fn contains(&self, id: &str) -> bool {
        self.ids.contains(id)
    }

    /// Whether `op` would store something under an erased session.
    pub fn drops(&self, op: &super::WriteOp) -> bool {
        use super::WriteOp;
        if self.ids.is_empty() {
            return false;
        }
        match op {
            WriteOp::PutSession(s) => self.contains(&s.id),
            WriteOp::AppendMessages { session_id, .. }
            | WriteOp::PutSummary { session_id, .. }
            | WriteOp::MarkRolledBack { session_id, .. }
            | WriteOp::LinkDoc { session_id, .. } => self.contains(session_id),
            WriteOp::PutTurn(w) => self.contains(&w.session_id),
            WriteOp::PutDocsOnce {
                session_id: Some(id),
                ..
            } => self.contains(id),
            WriteOp::RecordToolCall(rec) => rec
                .conversation_id
                .as_deref()
                .is_some_and(|c| self.contains(c)),
            _ => false,
        }
    }

    pub fn remember(&mut self, id: String) {
        if self.ids.insert(id.clone()) {
            self.order.push_back(id);
        }
        while self.order.len() > REMEMBER_ERASED {
            if let Some(old) = self.order.pop_front() {
                self.ids.remove(&old);
            }
        }
    }
}

/// The tables an erase touches, opened once per batch by the writer.
pub(super) struct EraseTables<'a, 't> {
    pub sessions: &'a mut Table<'t, &'static str, &'static [u8]>,
    pub sessions_by_tenant: &'a mut Table<'t, (&'static str, &'static str), ()>,
    pub messages: &'a mut Table<'t, (&'static str, u64), &'static [u8]>,
    pub summaries: &'a mut Table<'t, &'static str, &'static [u8]>,
    pub session_usage: &'a mut Table<'t, &'static str, &'static [u8]>,
    pub calls: &'a mut Table<'t, &'static str, &'static [u8]>,
    pub by_conv: &'a mut Table<'t, (&'static str, &'static str), ()>,
    pub by_tool: &'a mut Table<'t, (&'static str, &'static str), ()>,
    pub by_workflow: &'a mut Table<'t, (&'static str, &'static str), ()>,
    pub calls_by_tenant: &'a mut Table<'t, (&'static str, &'static str, &'static str), ()>,
    pub docs: &'a mut super::docs::DocTables<'t>,
    pub docs_by_tenant: &'a mut Table<'t, (&'static str, &'static str, &'static str), ()>,
    pub doc_tenants: &'a mut Table<'t, (&'static str, &'static str), &'static str>,
    pub docs_by_session: &'a mut Table<'t, (&'static str, &'static str, &'static str), ()>,
    pub doc_sessions: &'a mut Table<'t, (&'static str, &'static str), &'static str>,
    pub turns: super::turns::TurnTables<'a, 't>,
}

/// Removes the session `id` and everything stored under it; `None` (and
/// nothing removed) when there is no such session.
pub(super) fn delete_session(
    t: &mut EraseTables<'_, '_>,
    id: &str,
) -> Result<Option<Erased>, StoreError> {
    let session: Session = match t.sessions.remove(id)? {
        Some(v) => crate::store::codec::json(v.value())?,
        None => return Ok(None),
    };
    t.sessions_by_tenant.remove((session.tenant.as_str(), id))?;
    let mut erased = Erased {
        tenant: session.tenant.clone(),
        ..Erased::default()
    };
    let mut n = 0;
    t.messages.retain_in((id, 0)..=(id, u64::MAX), |_, _| {
        n += 1;
        false
    })?;
    erased.messages = n;
    t.summaries.remove(id)?;
    t.session_usage.remove(id)?;
    super::turns::erase(&mut t.turns, id)?;

    let mut records = Vec::new();
    for row in t.by_conv.range((id, "")..)? {
        let (k, _) = row?;
        let (conv, record) = k.value();
        if conv != id {
            break;
        }
        records.push(record.to_string());
    }
    for record in &records {
        t.by_conv.remove((id, record.as_str()))?;
        let rec: ToolCallRecord = match t.calls.remove(record.as_str())? {
            Some(v) => crate::store::codec::json(v.value())?,
            None => continue,
        };
        t.by_tool
            .remove((rec.tool_name.as_str(), record.as_str()))?;
        if let Some(wf) = &rec.workflow_id {
            t.by_workflow.remove((wf.as_str(), record.as_str()))?;
        }
        listing::unindex_call(t.calls_by_tenant, &rec)?;
        erased.calls += 1;
    }

    let mut linked = Vec::new();
    for row in t.docs_by_session.range((id, "", "")..)? {
        let (k, _) = row?;
        let (session, namespace, key) = k.value();
        if session != id {
            break;
        }
        linked.push((namespace.to_string(), key.to_string()));
    }
    for (namespace, key) in &linked {
        t.docs_by_session
            .remove((id, namespace.as_str(), key.as_str()))?;
        t.doc_sessions.remove((namespace.as_str(), key.as_str()))?;
        if t.docs.remove(namespace, key)?.is_some() {
            erased.documents += 1;
        }
        listing::unindex_doc(t.docs_by_tenant, t.doc_tenants, namespace, key)?;
    }
    Ok(Some(erased))
}

/// The tables [`erase_calls_outside_sessions`] touches.
pub(super) struct CallTables<'a, 't> {
    pub calls: &'a mut Table<'t, &'static str, &'static [u8]>,
    pub by_tool: &'a mut Table<'t, (&'static str, &'static str), ()>,
    pub by_workflow: &'a mut Table<'t, (&'static str, &'static str), ()>,
    pub calls_by_tenant: &'a mut Table<'t, (&'static str, &'static str, &'static str), ()>,
    pub tenant_bytes: &'a mut Table<'t, &'static str, u64>,
}

/// Erases `tenant`'s call records without a conversation among the
/// [`super::ERASE_CALLS_BATCH`] of its records after `after` (its
/// every-call index facet, in id order), and takes their bytes off its
/// count ([`super::storage`]).
pub(super) fn erase_calls_outside_sessions(
    t: &mut CallTables<'_, '_>,
    tenant: &str,
    after: Option<&str>,
) -> Result<super::CallsErased, StoreError> {
    use std::ops::Bound;
    let start = match after {
        Some(a) => Bound::Excluded((tenant, "", a)),
        None => Bound::Included((tenant, "", "")),
    };
    // Facet "" (every call of the tenant) sorts before every other facet.
    let end = Bound::Excluded((tenant, "\0", ""));
    let mut seen = Vec::new();
    for row in t
        .calls_by_tenant
        .range::<(&str, &str, &str)>((start, end))?
        .take(super::ERASE_CALLS_BATCH)
    {
        let (k, _) = row?;
        seen.push(k.value().2.to_string());
    }
    let next = (seen.len() == super::ERASE_CALLS_BATCH)
        .then(|| seen.last().cloned())
        .flatten();
    let mut erased = super::CallsErased { calls: 0, next };
    for id in &seen {
        let (rec, bytes) = match t.calls.get(id.as_str())? {
            Some(v) => match crate::store::codec::json::<ToolCallRecord>(v.value()) {
                Ok(rec) => (rec, super::codec::plain_len(v.value())),
                // Not decodable: not known to be outside a session.
                Err(_) => continue,
            },
            None => continue,
        };
        if rec.conversation_id.is_some() {
            continue;
        }
        t.calls.remove(id.as_str())?;
        t.by_tool.remove((rec.tool_name.as_str(), id.as_str()))?;
        if let Some(wf) = &rec.workflow_id {
            t.by_workflow.remove((wf.as_str(), id.as_str()))?;
        }
        listing::unindex_call(t.calls_by_tenant, &rec)?;
        if super::storage::counted_call(&rec).is_some() {
            super::storage::erase_call(t.tenant_bytes, tenant, bytes)?;
        }
        erased.calls += 1;
    }
    Ok(erased)
}

/// Links `(namespace, key)` to `session`: erased with it.
pub(super) fn link_doc(
    by_session: &mut Table<(&str, &str, &str), ()>,
    sessions: &mut Table<(&str, &str), &str>,
    namespace: &str,
    key: &str,
    session: &str,
) -> Result<(), StoreError> {
    unlink_doc(by_session, sessions, namespace, key)?;
    sessions.insert((namespace, key), session)?;
    by_session.insert((session, namespace, key), ())?;
    Ok(())
}

/// Drops the link of `(namespace, key)`; the session it was linked to.
pub(super) fn unlink_doc(
    by_session: &mut Table<(&str, &str, &str), ()>,
    sessions: &mut Table<(&str, &str), &str>,
    namespace: &str,
    key: &str,
) -> Result<Option<String>, StoreError> {
    let old = sessions
        .remove((namespace, key))?
        .map(|v| v.value().to_string());
    if let Some(old) = &old {
        by_session.remove((old.as_str(), namespace, key))?;
    }
    Ok(old)
}

/// One row of [`dump_file`]: the table, and its key and value as text.
#[derive(Debug, Clone)]
pub struct DumpedRow {
    pub table: String,
    pub key: String,
    pub value: String,
}

/// Every row of every table of the closed store file `path`, as text
/// (keys debug-printed, values as their JSON text). Panics when the file
/// holds a table this reader does not dump, so no table escapes a test.
#[doc(hidden)]
pub fn dump_file(path: &Path) -> Result<Vec<DumpedRow>, StoreError> {
    let db = redb::Database::open(path).map_err(|source| StoreError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let txn = db.begin_read()?;
    let mut out = Vec::new();
    macro_rules! dump {
        ($($def:expr),* $(,)?) => {{
            let known = [$($def.name()),*];
            for handle in txn.list_tables()? {
                assert!(
                    known.contains(&handle.name()),
                    "table {} is not dumped", handle.name()
                );
            }
            $(
                let table = txn.open_table($def)?;
                for row in table.iter()? {
                    let (k, v) = row?;
                    out.push(DumpedRow {
                        table: $def.name().to_string(),
                        key: format!("{:?}", k.value()),
                        value: v.value().as_text(),
                    });
                }
            )*
        }};
    }
    dump!(
        META,
        SESSIONS,
        MESSAGES,
        SUMMARIES,
        TOOL_CALLS,
        TOOL_CALLS_BY_CONVERSATION,
        TOOL_CALLS_BY_TOOL,
        TOOL_CALLS_BY_WORKFLOW,
        TOOL_STATS,
        DOCS,
        CONFIRMATIONS,
        CONFIRMATIONS_DECIDED,
        TENANT_CONFIGS,
        API_KEYS,
        WORKFLOW_RUNS,
        WORKFLOW_ITEMS,
        SESSION_USAGE,
        TENANT_USAGE,
        SESSIONS_BY_TENANT,
        TOOL_CALLS_BY_TENANT,
        DOCS_BY_TENANT,
        DOC_TENANTS,
        DOCS_BY_SESSION,
        DOC_SESSIONS,
        TURNS,
        OPEN_TURNS,
        TURN_KEYS,
        IDEMPOTENCY,
        SESSION_BYTES,
        TENANT_BYTES,
    );
    Ok(out)
}

/// A stored value as text: JSON bytes as the text they are.
trait AsText {
    fn as_text(&self) -> String;
}

impl AsText for &[u8] {
    fn as_text(&self) -> String {
        match super::codec::unpack(self) {
            Ok(json) => String::from_utf8_lossy(&json).into_owned(),
            Err(_) => String::from_utf8_lossy(self).into_owned(),
        }
    }
}

impl AsText for &str {
    fn as_text(&self) -> String {
        self.to_string()
    }
}

impl AsText for u64 {
    fn as_text(&self) -> String {
        self.to_string()
    }
}

impl AsText for (u64, &[u8]) {
    fn as_text(&self) -> String {
        format!("{} {}", self.0, self.1.as_text())
    }
}

impl AsText for () {
    fn as_text(&self) -> String {
        String::new()
    }
}
