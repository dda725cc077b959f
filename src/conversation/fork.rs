//! Forks: a new session whose history is another's up to the end of one
//! of its turns (issue #34), and the per-turn states one browses before
//! forking.
//!
//! http (`POST /v1/sessions/{id}/fork`) ──▶ [`Sessions::fork`]
//!     ──read (store)──▶ the parent's messages, turn records, summary
//!     ──admit (storage gate: write share, quota)──▶ one write: PutSession + AppendMessages + PutSummary?
//! http (`GET /v1/sessions/{id}/history`) ──▶ [`Sessions::turn_states`] ──read (store)──▶ a page of [`TurnState`]
//!
//! What a fork holds, and what the issue left open, decided here:
//! - **The fork point.** "After turn *k*" is everything stored before the
//!   next turn's first message (its user message): turn *k*'s messages
//!   and any message recorded between the two turns (an operator's, a
//!   visitor's without a turn), which the next model call would have
//!   seen. After the last turn it is every message stored when the fork
//!   reads. Without `turn_id` the fork is after the last finished turn.
//!   Only a finished turn (completed, failed or interrupted: its record's
//!   phase is final) can be forked: an open one (running, paused for an
//!   approval) is 409 `TURN_NOT_FINISHED`, and so is a session with no
//!   finished turn when no `turn_id` is given.
//! - **Messages** are copied with their seqs, timestamps and
//!   rolled-back marks, byte for byte: the fork's next message is seq
//!   `until + 1`, its prompts leave out what the parent's left out.
//! - **The summary.** A session keeps one rolling summary, not its past
//!   versions. The fork gets it when it covers no message past the fork
//!   point (what it says comes from the prefix only); otherwise none, and
//!   the fork's conversation starts from the prefix's last messages (as a
//!   reload after a long-failing summary does) and summarises again as it
//!   grows. A summary never carries what came after the fork point.
//!   [`TurnState`] shows exactly this, so the history endpoint shows
//!   what a fork at each turn would start with.
//! - **No tool runs and nothing is re-run**: a fork is one store write;
//!   the fork has no turn records (its turns start with its first
//!   message). Its **call records are the parent's**: not copied,
//!   `forked_from` points at them (the parent's calls with a `turn_id` up
//!   to the fork's, ids are time-ordered). The tool messages in the
//!   copied history carry the outputs the model needs; the records serve
//!   citations: a fork's conversation knows the sources its ancestors'
//!   calls up to the fork point returned ([`super::lineage::inherited_sources`]). A
//!   fork's export lists its own calls only.
//! - **Storage.** The copied messages are stored again, under the new
//!   session, and count toward the tenant's quota and write share like
//!   messages sent (admitted before the write, [`super::storage`]).
//! - **Reads, not the parent's actor.** Everything is read from the
//!   store, which is exact for a finished turn: its messages and final
//!   record were committed together. The seqs are read before the turn
//!   records, so a turn that starts meanwhile bounds the fork point
//!   rather than leaking into it. The parent's conversation is not
//!   touched, and in cluster mode the request is served by whichever
//!   node gets it (`cluster::forward` does not send it to the parent's
//!   owner: that would claim the parent for nothing).

use serde::{Deserialize, Serialize};

use super::machine::{Phase, SUMMARY_AFTER_WINDOWS, TurnRecord};
use super::sessions::{NewSession, SessionError, Sessions};
use crate::identity::Scope;
use crate::model::ChatMessage;
use crate::store::{ForkedFrom, Page, Session, Store, StoredMessage, StoredSummary, WriteOp};

/// What a fork asks for.
#[derive(Debug, Clone, Default)]
pub struct ForkRequest {
    /// After this turn; `None`: after the last finished turn.
    pub turn_id: Option<String>,
    /// Continue the fork with this agent instead of the parent's.
    pub agent: Option<String>,
}

/// The state a conversation had after one of its turns: what its next
/// model call would have seen, and what a fork at the turn starts with.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct TurnState {
    pub turn_id: String,
    /// The turn's phase (`completed`, `failed`, `interrupted`; or an open
    /// one's: `awaiting_model`, `awaiting_approval` ...).
    pub status: String,
    /// Its phase is final: it can be forked.
    pub finished: bool,
    /// The seq of the turn's user message.
    pub first_seq: u64,
    /// The last seq of the state after the turn (a fork there holds
    /// messages `1..=until_seq`); `null` for a turn not finished.
    pub until_seq: Option<u64>,
    /// The summary a fork at the turn carries (`null`: none).
    pub summary: Option<StoredSummary>,
    /// The messages after the summary that the next model call would
    /// see, oldest first (the agent's window; rolled-back messages left
    /// out); empty for a turn not finished.
    pub window: Vec<ChatMessage>,
}

/// A turn as the fork reads it from its record.
struct TurnMark {
    turn_id: String,
    phase: Phase,
    first_seq: u64,
}

fn mark_of(record: &serde_json::Value) -> Result<TurnMark, SessionError> {
    let r = TurnRecord::deserialize(record).map_err(|e| SessionError::Store(e.into()))?;
    Ok(TurnMark {
        turn_id: r.turn_id,
        phase: r.phase,
        first_seq: r.first_seq,
    })
}

/// The last seq of the state after `turn`: before the first message of
/// the next turn to start, else `last_seq` (read before the records).
fn until_of(turn: &TurnMark, next: Option<&TurnMark>, last_seq: u64) -> u64 {
    let next_first = next
        .filter(|n| n.first_seq > turn.first_seq)
        .map_or(u64::MAX, |n| n.first_seq - 1);
    next_first.min(last_seq)
}

/// The summary a fork after `until` may carry: the stored one, when it
/// covers nothing past the fork point.
fn summary_at(summary: Option<&StoredSummary>, until: u64) -> Option<StoredSummary> {
    summary.filter(|s| s.covers_until_seq <= until).cloned()
}

/// The session's last seq, read before its turn records (see the module doc).
async fn last_seq(store: &Store, id: &str) -> Result<u64, SessionError> {
    Ok(store.recent_messages(id, 0).await?.1)
}

/// Every turn record of a session, oldest first, as marks.
async fn all_turns(store: &Store, id: &str) -> Result<Vec<TurnMark>, SessionError> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let page = store.turns_of(id, after, 1000).await?;
        for r in &page.items {
            out.push(mark_of(r)?);
        }
        match page.next {
            Some(n) => after = Some(n),
            None => return Ok(out),
        }
    }
}

/// Where the fork is: the index of the turn named (404 unknown, 409 not
/// finished), or of the last finished turn.
fn fork_point(id: &str, turns: &[TurnMark], named: Option<&str>) -> Result<usize, SessionError> {
    let at =
        match named {
            Some(t) => turns.iter().position(|m| m.turn_id == t).ok_or_else(|| {
                SessionError::TurnNotFound {
                    session: id.into(),
                    turn: t.to_string(),
                }
            })?,
            None => turns
                .iter()
                .rposition(|m| m.phase.is_final())
                .ok_or_else(|| SessionError::TurnNotFinished {
                    session: id.into(),
                    turn: None,
                })?,
        };
    if !turns[at].phase.is_final() {
        return Err(SessionError::TurnNotFinished {
            session: id.into(),
            turn: Some(turns[at].turn_id.clone()),
        });
    }
    Ok(at)
}

/// The session's messages with seq up to `until`, oldest first.
async fn prefix(store: &Store, id: &str, until: u64) -> Result<Vec<StoredMessage>, SessionError> {
    let mut out: Vec<StoredMessage> = Vec::new();
    loop {
        let after = out.last().map_or(0, |m| m.seq);
        let page = store.messages_page(id, after, 1000).await?;
        let full = page.len() == 1000;
        let before = out.len();
        let mut past = false;
        for m in page {
            if m.seq > until {
                past = true;
                break;
            }
            out.push(m);
        }
        if !full || past || out.len() == before {
            return Ok(out);
        }
    }
}

impl Sessions {
    /// Forks session `id` (within reach of `scope`) after a finished turn:
    /// a new session, stored durably before this returns, with the
    /// parent's messages up to the fork point (see the module doc). The
    /// parent is not written to.
    pub async fn fork(
        &self,
        scope: &Scope,
        id: &str,
        request: ForkRequest,
    ) -> Result<Session, SessionError> {
        let parent = self.get(scope, id).await?;
        let store = self.store();
        // Twice at most: a turn named that finished after the seqs were
        // read is read again with its messages.
        let (turns, at, until) = {
            let mut tries = 0;
            loop {
                tries += 1;
                let last = last_seq(store, id).await?;
                let turns = all_turns(store, id).await?;
                let at = fork_point(id, &turns, request.turn_id.as_deref())?;
                let until = until_of(&turns[at], turns.get(at + 1), last);
                if until >= turns[at].first_seq || tries == 2 {
                    break (turns, at, until);
                }
            }
        };
        let turn = &turns[at];
        let messages = prefix(store, id, until).await?;
        let summary = summary_at(store.get_summary(id).await?.as_ref(), until);

        let tenant_config = self.tenant_config(&parent.tenant).await?;
        let bytes = messages
            .iter()
            .map(|m| serde_json::to_vec(m).map_or(0, |v| v.len()))
            .sum::<usize>();
        self.admit_content(&parent.tenant, &tenant_config, bytes)
            .await?;
        let mut session = self.new_session(NewSession {
            tenant: parent.tenant.clone(),
            agent: request.agent.unwrap_or_else(|| parent.agent.clone()),
            user_id: parent.user_id.clone(),
            plan: parent.plan,
            metadata: parent.metadata.clone(),
        })?;
        session.forked_from = Some(Box::new(ForkedFrom {
            session_id: parent.id.clone(),
            turn_id: turn.turn_id.clone(),
        }));
        let mut ops = vec![WriteOp::PutSession(session.clone())];
        if !messages.is_empty() {
            ops.push(WriteOp::AppendMessages {
                session_id: session.id.clone(),
                messages,
            });
        }
        if let Some(summary) = summary {
            ops.push(WriteOp::PutSummary {
                session_id: session.id.clone(),
                summary,
            });
        }
        store.write(ops, true).await?;
        Ok(session)
    }

    /// A page of the turns of session `id` (within reach), oldest first,
    /// each with the state the conversation had after it ([`TurnState`]).
    pub async fn turn_states(
        &self,
        scope: &Scope,
        id: &str,
        after: Option<String>,
        limit: usize,
    ) -> Result<Page<TurnState>, SessionError> {
        let session = self.get(scope, id).await?;
        let store = self.store();
        let last = last_seq(store, id).await?;
        let page = store.turns_of(id, after, limit).await?;
        let mut marks = page
            .items
            .iter()
            .map(mark_of)
            .collect::<Result<Vec<_>, _>>()?;
        // The turn after the page bounds its last one.
        let following = match marks.last() {
            Some(m) => store
                .turns_of(id, Some(m.turn_id.clone()), 1)
                .await?
                .items
                .first()
                .map(mark_of)
                .transpose()?,
            None => None,
        };
        let summary = store.get_summary(id).await?;
        let window = self
            .agents()
            .get(&session.agent)
            .map_or(20, |a| a.history_window.max(1))
            * SUMMARY_AFTER_WINDOWS;
        let ends: Vec<Option<u64>> = (0..marks.len())
            .map(|i| {
                let next = marks.get(i + 1).or(following.as_ref());
                marks[i]
                    .phase
                    .is_final()
                    .then(|| until_of(&marks[i], next, last))
            })
            .collect();
        // One read covers every window of the page: from the earliest
        // start a window may need (rolled-back messages taken out leave
        // it shorter, as in the conversation's own bounded load).
        let starts = ends.iter().flatten().map(|&u| {
            let covered = summary_at(summary.as_ref(), u).map_or(0, |s| s.covers_until_seq);
            covered.max(u.saturating_sub(2 * window as u64))
        });
        let from = starts.min();
        let to = ends.iter().flatten().max().copied();
        let messages = match (from, to) {
            (Some(from), Some(to)) if to > from => {
                store.messages_page(id, from, (to - from) as usize).await?
            }
            _ => Vec::new(),
        };
        let items = marks
            .drain(..)
            .zip(ends)
            .map(|(m, until)| {
                let summary = until.and_then(|u| summary_at(summary.as_ref(), u));
                let window = until.map_or_else(Vec::new, |u| {
                    let covered = summary.as_ref().map_or(0, |s| s.covers_until_seq);
                    let history: Vec<&StoredMessage> = messages
                        .iter()
                        .filter(|s| s.seq > covered && s.seq <= u && !s.rolled_back)
                        .collect();
                    super::context::window_of(&history, window, |s| &s.message)
                });
                TurnState {
                    turn_id: m.turn_id,
                    status: m.phase.as_str().to_string(),
                    finished: m.phase.is_final(),
                    first_seq: m.first_seq,
                    until_seq: until,
                    summary,
                    window,
                }
            })
            .collect();
        Ok(Page {
            items,
            next: page.next,
        })
    }
}
