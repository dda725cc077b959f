//! Turn records: where each conversation turn stands, as data.
//!
//! Conversation actor ──WriteOp::PutTurn (in the batch of the step)──▶ TURNS · OPEN_TURNS · TURN_KEYS
//! start ──open_turns──▶ resume · GET /v1/sessions/{id}/turns/{turn} ──turn──▶ the record
//!
//! The store does not read the record: it is the conversation's JSON
//! ([`crate::conversation`] owns its shape). It keeps the three indexes a
//! record needs: the record under `(session, turn)`, the open ones (phase
//! not final) for the scan at start, and the idempotency key a message
//! came with. A record is written in the same write as the step that
//! reached its phase, so the phase and the messages never disagree; it
//! costs no commit of its own. Erased with its session ([`super::erase`]).

use super::backend::TurnReads;
use redb::{ReadableDatabase, ReadableTable, Table};
use serde_json::Value;

use super::tables::*;
use super::{RedbStore, StoreError};

/// One turn's record to store.
#[derive(Debug, Clone)]
pub struct TurnWrite {
    pub session_id: String,
    pub turn_id: String,
    /// Not final yet: listed by [`crate::store::TurnReads::open_turns`].
    pub open: bool,
    /// The message's `Idempotency-Key`, indexed for [`crate::store::TurnReads::turn_by_key`].
    pub idempotency_key: Option<String>,
    pub record: Value,
}

/// The tables a turn write touches.
pub(super) struct TurnTables<'a, 't> {
    pub turns: &'a mut Table<'t, (&'static str, &'static str), &'static [u8]>,
    pub open: &'a mut Table<'t, (&'static str, &'static str), ()>,
    pub keys: &'a mut Table<'t, (&'static str, &'static str), &'static str>,
}

pub(super) fn put(t: &mut TurnTables<'_, '_>, w: &TurnWrite) -> Result<(), StoreError> {
    let k = (w.session_id.as_str(), w.turn_id.as_str());
    t.turns.insert(
        k,
        super::codec::pack(serde_json::to_vec(&w.record)?).as_slice(),
    )?;
    if w.open {
        t.open.insert(k, ())?;
    } else {
        t.open.remove(k)?;
    }
    put_key(t.keys, w)
}

/// The turn writes of one commit that a later write of the same turn in
/// it overwrites, by their place in `ops` (the batch's ops in order).
///
/// A turn sends its steps behind and its end durably, so one commit often
/// holds two or three records of the same turn (at one session: the
/// start, the tool calls and the answer). The commit leaves only the last
/// one's row, and the last one's open/closed state, so the others need not
/// be serialised, packed and inserted (issue #37). Their idempotency key
/// is still indexed ([`put_key`]), so the result is the same as applying
/// every write.
pub fn superseded<'a>(
    ops: impl Iterator<Item = &'a super::WriteOp>,
) -> std::collections::HashSet<usize> {
    let writes: Vec<(usize, &TurnWrite)> = ops
        .enumerate()
        .filter_map(|(i, op)| match op {
            super::WriteOp::PutTurn(w) => Some((i, &**w)),
            _ => None,
        })
        .collect();
    if writes.len() < 2 {
        return Default::default();
    }
    let last: std::collections::HashMap<(&str, &str), usize> = writes
        .iter()
        .map(|(i, w)| ((w.session_id.as_str(), w.turn_id.as_str()), *i))
        .collect();
    writes
        .into_iter()
        .filter(|(i, w)| last[&(w.session_id.as_str(), w.turn_id.as_str())] != *i)
        .map(|(i, _)| i)
        .collect()
}

/// The idempotency-key index of a write whose row a later write of the
/// same commit replaces ([`superseded`]).
pub(super) fn put_key(
    keys: &mut Table<'_, (&'static str, &'static str), &'static str>,
    w: &TurnWrite,
) -> Result<(), StoreError> {
    if let Some(key) = &w.idempotency_key {
        keys.insert((w.session_id.as_str(), key.as_str()), w.turn_id.as_str())?;
    }
    Ok(())
}

/// Removes every turn row of session `id`; how many turns went.
pub(super) fn erase(t: &mut TurnTables<'_, '_>, id: &str) -> Result<u64, StoreError> {
    let mut n = 0;
    t.turns.retain_in((id, "")..(id, "\u{10FFFF}"), |_, _| {
        n += 1;
        false
    })?;
    t.open
        .retain_in((id, "")..(id, "\u{10FFFF}"), |_, _| false)?;
    t.keys
        .retain_in((id, "")..(id, "\u{10FFFF}"), |_, _| false)?;
    Ok(n)
}

#[async_trait::async_trait]
impl TurnReads for RedbStore {
    /// The record of turn `turn_id` of session `session_id`.
    async fn turn(&self, session_id: &str, turn_id: &str) -> Result<Option<Value>, StoreError> {
        let (s, t) = (session_id.to_string(), turn_id.to_string());
        self.read(move |db| {
            let txn = db.begin_read()?;
            let table = txn.open_table(TURNS)?;
            match table.get((s.as_str(), t.as_str()))? {
                Some(v) => Ok(Some(crate::store::codec::json(v.value())?)),
                None => Ok(None),
            }
        })
        .await
    }

    /// The turn a message with `key` started in the session, if any.
    async fn turn_by_key(&self, session_id: &str, key: &str) -> Result<Option<String>, StoreError> {
        let (s, k) = (session_id.to_string(), key.to_string());
        self.read(move |db| {
            let txn = db.begin_read()?;
            let table = txn.open_table(TURN_KEYS)?;
            Ok(table
                .get((s.as_str(), k.as_str()))?
                .map(|v| v.value().to_string()))
        })
        .await
    }

    /// The last turn of a session that is not final (at most one runs).
    async fn open_turn_of(&self, session_id: &str) -> Result<Option<Value>, StoreError> {
        let s = session_id.to_string();
        self.read(move |db| {
            let txn = db.begin_read()?;
            let open = txn.open_table(OPEN_TURNS)?;
            let last = open
                .range((s.as_str(), "")..(s.as_str(), "\u{10FFFF}"))?
                .next_back()
                .transpose()?
                .map(|(k, _)| k.value().1.to_string());
            let Some(turn) = last else { return Ok(None) };
            let turns = txn.open_table(TURNS)?;
            match turns.get((s.as_str(), turn.as_str()))? {
                Some(v) => Ok(Some(crate::store::codec::json(v.value())?)),
                None => Ok(None),
            }
        })
        .await
    }

    /// A page of a session's turn records after turn id `after`, oldest
    /// first; `next` is the last id of a full page.
    async fn turns_of(
        &self,
        session_id: &str,
        after: Option<String>,
        limit: usize,
    ) -> Result<super::Page<Value>, StoreError> {
        let s = session_id.to_string();
        self.read(move |db| {
            let txn = db.begin_read()?;
            let table = txn.open_table(TURNS)?;
            let from = after.unwrap_or_default();
            let mut items = Vec::new();
            let mut last = None;
            for row in table.range((s.as_str(), from.as_str())..(s.as_str(), "\u{10FFFF}"))? {
                let (k, v) = row?;
                let id = k.value().1;
                if id == from {
                    continue;
                }
                if items.len() == limit {
                    return Ok(super::Page { items, next: last });
                }
                last = Some(id.to_string());
                items.push(crate::store::codec::json(v.value())?);
            }
            Ok(super::Page { items, next: None })
        })
        .await
    }

    /// Every `(session, turn)` whose record is not final, oldest session
    /// first: the turns a crash cut.
    async fn open_turns(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.read(move |db| {
            let txn = db.begin_read()?;
            let open = txn.open_table(OPEN_TURNS)?;
            let mut out = Vec::new();
            for row in open.iter()? {
                let (k, _) = row?;
                let (s, t) = k.value();
                out.push((s.to_string(), t.to_string()));
            }
            Ok(out)
        })
        .await
    }
}
