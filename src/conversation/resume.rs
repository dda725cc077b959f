//! What is known of a batch's calls when a turn is taken up again.
//!
//! Conversation actor ──resolve(batch, held approvals)──▶ store (call records, intents) · confirmations
//!                    ◀── per call: Done(outcome) | Run | Waiting ──┘
//!
//! A turn is taken up from its record after a restart (`awaiting_tools`,
//! `awaiting_approval`) and after a person decides a held call. For each
//! call of the batch, in order:
//! - an outcome already in memory, or a finished call record of this turn
//!   and call id (the latest, a `CONFIRMATION_REQUIRED` record aside): done,
//!   never run again;
//! - an `ask_` call paused on another agent's held call: waiting while
//!   that confirmation is pending, else run (asking again rejoins the
//!   child's turn, [`super::delegation`]);
//! - a call held for confirmation: still pending → waiting (expired →
//!   declined, and the confirmation is closed so it cannot be approved
//!   later); denied → declined; approved → its record, or — when none
//!   exists after a restart — `TOOL_OUTCOME_UNKNOWN` (in a live process the
//!   approving request is still running it: waiting);
//! - otherwise, an intent committed before an `at_most_once` tool ran
//!   ([`crate::executor::CALL_INTENTS`]) but no record: `TOOL_OUTCOME_UNKNOWN`,
//!   never run twice;
//! - otherwise the call never ran, or ran without leaving anything (a
//!   tool declared safe to repeat): run.

use std::collections::HashMap;

use jiff::Timestamp;

use super::machine::Approval;
use crate::executor::confirmations::{ConfirmationState, Confirmations, Decision};
use crate::model::ToolCall;
use crate::store::{Store, StoreError, ToolCallRecord};
use crate::tools::{ErrorType, ResultMetadata, ToolExecutionResult};

/// Where one call of a resumed batch stands.
#[derive(Debug, Clone)]
pub enum Resolution {
    Done(Box<ToolExecutionResult>),
    Run,
    Waiting,
}

/// What a resolution reads.
pub struct Lookup {
    pub store: Store,
    pub confirmations: Confirmations,
    pub session: String,
    pub tenant: String,
    pub turn_id: String,
    /// Taken up after a restart: nothing of this process runs the calls.
    pub after_restart: bool,
}

/// The namespace of at-most-once intents (the executor writes them).
const CALL_INTENTS: &str = "call_intents";

impl Lookup {
    /// One resolution per call of `calls`, in order; `known[i]`: the
    /// outcome already in memory for `calls[i]`.
    pub async fn resolve(
        &self,
        calls: &[ToolCall],
        approvals: &[Approval],
        known: Vec<Option<ToolExecutionResult>>,
    ) -> Result<Vec<Resolution>, StoreError> {
        let need_records = known.iter().any(Option::is_none);
        let records: HashMap<String, ToolCallRecord> = if need_records {
            let mut by_call = HashMap::new();
            for r in self.store.calls_for_conversation(&self.session).await? {
                if r.turn_id.as_deref() != Some(self.turn_id.as_str())
                    || r.error_type.as_deref() == Some(ErrorType::PendingConfirmation.as_str())
                {
                    continue;
                }
                if let Some(id) = r.tool_call_id.clone() {
                    // Time-ordered: the latest wins.
                    by_call.insert(id, r);
                }
            }
            by_call
        } else {
            HashMap::new()
        };
        let mut out = Vec::with_capacity(calls.len());
        for (call, known) in calls.iter().zip(known) {
            if let Some(r) = known {
                out.push(Resolution::Done(Box::new(r)));
                continue;
            }
            if let Some(rec) = records.get(&call.id) {
                out.push(Resolution::Done(Box::new(from_record(rec))));
                continue;
            }
            if let Some(a) = approvals.iter().find(|a| a.tool_call_id == call.id) {
                out.push(self.decided(call, a).await?);
                continue;
            }
            let key = format!("{}:{}:{}", self.session, self.turn_id, call.id);
            if self.store.get_doc(CALL_INTENTS, &key).await?.is_some() {
                out.push(Resolution::Done(Box::new(unknown(call))));
            } else {
                out.push(Resolution::Run);
            }
        }
        Ok(out)
    }

    async fn decided(&self, call: &ToolCall, a: &Approval) -> Result<Resolution, StoreError> {
        if a.delegated_to.is_some() {
            // Another agent's held call: while it waits for a person, so
            // does this one; once decided (or expired), the ask runs again
            // and rejoins the child's turn ([`super::delegation`]).
            return Ok(
                match self
                    .confirmations
                    .state(&a.confirmation_id, &self.tenant)
                    .await?
                {
                    ConfirmationState::Pending(p) if Timestamp::now() < p.expires_at => {
                        Resolution::Waiting
                    }
                    _ => Resolution::Run,
                },
            );
        }
        let declined = |why: &str| {
            Resolution::Done(Box::new(ToolExecutionResult::failure(
                &call.name,
                ErrorType::Declined,
                format!("{} did not run: {why}", call.name),
            )))
        };
        Ok(
            match self
                .confirmations
                .state(&a.confirmation_id, &self.tenant)
                .await?
            {
                ConfirmationState::Pending(p) if Timestamp::now() < p.expires_at => {
                    Resolution::Waiting
                }
                ConfirmationState::Pending(_) => {
                    // Closes it for good: a late approval cannot run it.
                    let _ = self
                        .confirmations
                        .decide(&a.confirmation_id, &self.tenant, Decision::Denied)
                        .await;
                    declined("its confirmation expired undecided")
                }
                ConfirmationState::Unknown => declined("its confirmation expired undecided"),
                ConfirmationState::Decided {
                    decision: Decision::Denied,
                    ..
                } => declined("the user declined it"),
                ConfirmationState::Decided {
                    decision: Decision::Approved,
                    ..
                } => {
                    if self.after_restart {
                        Resolution::Done(Box::new(unknown(call)))
                    } else {
                        Resolution::Waiting
                    }
                }
            },
        )
    }
}

fn unknown(call: &ToolCall) -> ToolExecutionResult {
    ToolExecutionResult::failure(
        &call.name,
        ErrorType::OutcomeUnknown,
        format!(
            "{} was started before a restart and left no outcome; it is not run again (it may or may not have taken effect)",
            call.name
        ),
    )
}

/// A stored call record as the outcome the model gets.
pub fn from_record(r: &ToolCallRecord) -> ToolExecutionResult {
    ToolExecutionResult {
        is_success: r.is_success,
        tool_name: r.tool_name.clone(),
        output: r.output.clone(),
        error: r.error.clone(),
        error_type: r.error_type.as_deref().and_then(ErrorType::parse),
        validation_errors: Vec::new(),
        execution_time_ms: r.execution_time_ms,
        executed_at: r.created_at,
        metadata: ResultMetadata {
            attempts: r.attempts,
            source_id: r.source_id.clone(),
            // Its output is the record's: the turn names it.
            record_id: Some(r.record_id.clone()),
            ..ResultMetadata::default()
        },
    }
}
