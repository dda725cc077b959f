//! How many bytes each tenant stores: the count a storage quota is held
//! against (`[tenants] max_storage_mb`, a tenant config's `max_storage_mb`).
//!
//! writer: WriteOp::AppendMessages ──▶ MESSAGES rows ──(their bytes)──▶ SESSION_BYTES[session] += n
//!                                                                   └─▶ TENANT_BYTES[tenant]  += n
//! writer: WriteOp::RecordToolCall, no conversation ──▶ TOOL_CALLS row ──▶ TENANT_BYTES[tenant] += new - old row
//! writer: WriteOp::DeleteSession  ──▶ TENANT_BYTES[tenant] -= SESSION_BYTES[session]; the row goes
//! writer: WriteOp::EraseCallsOutsideSessions ──▶ TENANT_BYTES[tenant] -= each erased row
//! conversation::storage (admission) ──UsageReads::stored_bytes(tenant)──▶ TENANT_BYTES[tenant]
//!
//! What counts: the JSON of every stored message (user, assistant, tool
//! results, operator and visitor messages), the bulk of what a tenant
//! makes the store hold and the only part that grows with what callers
//! send in a session; and the JSON of every call record made outside a
//! session (a direct tool call: HTTP invoke, MCP `tools/call`; a workflow's
//! tool node), which nothing else bounds: a tenant could otherwise store
//! records as fast as its write share lets it, unseen by its quota. A
//! record written twice (held for a confirmation, then its outcome) counts
//! what it holds now: the rewrite adds the difference. The records of a
//! conversation, turn records and documents are bounded by the messages
//! that caused them and are not counted. A rolled-back message stays
//! stored and counted until its session is erased; a record outside a
//! session until its tenant's are erased
//! ([`super::CallReads::erase_calls_outside_sessions`], `DELETE
//! /v1/tenants/{id}/sessions`). Records without a tenant count for nobody.
//!
//! The counters are kept by the writer in the transaction that appends,
//! records or erases, so they are exact after a crash. PostgreSQL keeps
//! the session's count on its row (`sessions.stored_bytes`, updated in the
//! statement that inserts the messages, under the session's fence) and the
//! records' in `tenant_call_bytes`, one row per tenant and node (written by
//! that node only, in the statement that writes the record), and sums a
//! tenant's rows when asked: no hot per-tenant row that every node's
//! commits would queue on.

use redb::{ReadableTable, Table, WriteTransaction};

use super::tables::{MESSAGES, SESSION_BYTES, SESSIONS, TENANT_BYTES, TOOL_CALLS};
use super::{Session, StoreError, ToolCallRecord};

/// Adds `bytes` appended to `session`'s messages to its count and its
/// tenant's (nothing when the session row is gone: its writes are dropped).
pub(super) fn add(
    sessions: &Table<&str, &[u8]>,
    session_bytes: &mut Table<&str, u64>,
    tenant_bytes: &mut Table<&str, u64>,
    session: &str,
    bytes: u64,
) -> Result<(), StoreError> {
    let Some(row) = sessions.get(session)? else {
        return Ok(());
    };
    let tenant = crate::store::codec::json::<Session>(row.value())?.tenant;
    bump(session_bytes, session, bytes as i128)?;
    bump(tenant_bytes, &tenant, bytes as i128)?;
    Ok(())
}

/// Takes an erased session's count off its tenant's.
pub(super) fn erase(
    session_bytes: &mut Table<&str, u64>,
    tenant_bytes: &mut Table<&str, u64>,
    session: &str,
    tenant: &str,
) -> Result<(), StoreError> {
    let Some(n) = session_bytes.remove(session)?.map(|v| v.value()) else {
        return Ok(());
    };
    bump(tenant_bytes, tenant, -(n as i128))
}

/// Whether `rec`'s bytes count in its tenant's stored bytes: a record
/// made outside a session, with a tenant. Its tenant when it does.
pub fn counted_call(rec: &ToolCallRecord) -> Option<&str> {
    match rec.conversation_id {
        None => rec.tenant.as_deref(),
        Some(_) => None,
    }
}

/// Counts a call record written as `new` bytes over a row of `old` bytes
/// (0: a new record) when it counts ([`counted_call`]).
pub(super) fn record_call(
    tenant_bytes: &mut Table<&str, u64>,
    rec: &ToolCallRecord,
    new: u64,
    old: u64,
) -> Result<(), StoreError> {
    match counted_call(rec) {
        Some(tenant) if new != old => bump(tenant_bytes, tenant, new as i128 - old as i128),
        _ => Ok(()),
    }
}

/// Takes an erased record's `bytes` off its tenant's count.
pub(super) fn erase_call(
    tenant_bytes: &mut Table<&str, u64>,
    tenant: &str,
    bytes: u64,
) -> Result<(), StoreError> {
    bump(tenant_bytes, tenant, -(bytes as i128))
}

fn bump(table: &mut Table<&str, u64>, key: &str, by: i128) -> Result<(), StoreError> {
    let now = table.get(key)?.map(|v| v.value()).unwrap_or(0) as i128;
    let next = (now + by).clamp(0, u64::MAX as i128) as u64;
    if next == 0 {
        table.remove(key)?;
    } else {
        table.insert(key, next)?;
    }
    Ok(())
}

/// Schema 3 -> 4: counts the messages already stored, per session and
/// tenant. Returns the bytes counted.
pub(super) fn migrate_v3(txn: &WriteTransaction) -> Result<u64, StoreError> {
    let sessions = txn.open_table(SESSIONS)?;
    let messages = txn.open_table(MESSAGES)?;
    let mut session_bytes = txn.open_table(SESSION_BYTES)?;
    let mut tenant_bytes = txn.open_table(TENANT_BYTES)?;
    let mut total = 0u64;
    let mut current: Option<(String, u64)> = None;
    let mut flush = |current: Option<(String, u64)>| -> Result<(), StoreError> {
        if let Some((id, n)) = current {
            add(&sessions, &mut session_bytes, &mut tenant_bytes, &id, n)?;
        }
        Ok(())
    };
    for row in messages.iter()? {
        let (k, v) = row?;
        let (id, _) = k.value();
        let n = super::codec::plain_len(v.value());
        total += n;
        match &mut current {
            Some((cur, sum)) if cur == id => *sum += n,
            _ => flush(current.replace((id.to_string(), n)))?,
        }
    }
    flush(current)?;
    Ok(total)
}

/// Schema 4 -> 5: counts the call records already stored outside a
/// session into their tenant's bytes. Returns the bytes counted.
pub(super) fn migrate_v4(txn: &WriteTransaction) -> Result<u64, StoreError> {
    let calls = txn.open_table(TOOL_CALLS)?;
    let mut tenant_bytes = txn.open_table(TENANT_BYTES)?;
    let mut total = 0u64;
    for row in calls.iter()? {
        let (_, v) = row?;
        // A record that does not decode counts for nobody (listings leave
        // it out too).
        let Ok(rec) = crate::store::codec::json::<ToolCallRecord>(v.value()) else {
            continue;
        };
        let n = super::codec::plain_len(v.value());
        if counted_call(&rec).is_some() {
            record_call(&mut tenant_bytes, &rec, n, 0)?;
            total += n;
        }
    }
    Ok(total)
}
