//! What the store keeps, as Rust values: the rows both backends read and
//! write, and the write operations ([`WriteOp`]) callers send.
//!
//! conversation / executor / http ──WriteOp──▶ Store ──▶ backend; backend ──rows──▶ readers

use std::sync::{Arc, Mutex};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Erased, turns, usage::UsageDelta};
use crate::error_code::ErrorCode;
use crate::identity::Plan;
use crate::model::ChatMessage;

/// A chat session: who it belongs to and which agent serves it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    pub id: String,
    /// The tenant that owns the session; others see a 404.
    #[serde(default = "default_tenant")]
    pub tenant: String,
    pub agent: String,
    #[serde(default)]
    pub user_id: Option<String>,
    #[serde(default)]
    pub plan: Plan,
    #[serde(default)]
    pub metadata: Value,
    pub created_at: Timestamp,
    /// The session and turn it was forked from (`POST
    /// /v1/sessions/{id}/fork`); rows from before forks read `None`.
    /// Boxed: every resident conversation holds its session row, and most
    /// sessions are not forks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<Box<ForkedFrom>>,
}

/// Where a forked session came from: its history is the parent's up to
/// the end of this turn ([`crate::conversation::fork`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ForkedFrom {
    pub session_id: String,
    pub turn_id: String,
}

fn default_tenant() -> String {
    crate::identity::DEFAULT_TENANT.to_string()
}

/// A message as stored: its place in the session and when it was written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = Message)]
pub struct StoredMessage {
    pub seq: u64,
    #[serde(flatten)]
    pub message: ChatMessage,
    pub created_at: Timestamp,
    /// Part of a turn rolled back (`multitask = "rollback"`): kept here and
    /// in exports, left out of every later prompt.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rolled_back: bool,
}

/// One tool call from any caller, with its outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ToolCallRecord {
    pub record_id: String,
    pub tool_name: String,
    /// The model's tool_call_id, when a conversation made the call.
    pub tool_call_id: Option<String>,
    pub params: Value,
    pub output: Option<Value>,
    pub is_success: bool,
    pub error: Option<String>,
    /// The tool outcome's code (`RATE_LIMITED`, `CONFIRMATION_REQUIRED`);
    /// records stored with the old lower-case names (`rate_limited`) read
    /// as the codes.
    #[serde(default, deserialize_with = "read_error_type")]
    pub error_type: Option<String>,
    pub execution_time_ms: u64,
    pub attempts: u32,
    pub caller_id: String,
    pub caller_type: String,
    pub conversation_id: Option<String>,
    pub workflow_id: Option<String>,
    pub user_id: Option<String>,
    #[serde(default)]
    pub tenant: Option<String>,
    pub created_at: Timestamp,
    /// When the tool began to run, its concurrency slot held (`created_at`
    /// is when it ended; `execution_time_ms` also counts the wait for the
    /// slot): from the two, the span it held its slot. `None` for a call
    /// refused before it ran, a cached answer, and records older than it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// The citable id of what the call returned, as the executor namespaced
    /// it by the tool's source (`ToolSource::citable_source_id`); what
    /// grounds a citation after a reload. Records from before it existed
    /// have none and ground nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_id: Option<String>,
    /// Guardrails that did something to the call (`{guardrail, stage,
    /// action}`: a redaction of its arguments or output, a block).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub guardrails: Vec<Value>,
    /// The conversation turn that made the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// Answered from the tool's result cache (the tool did not run).
    /// Records from before it existed read `false`.
    #[serde(default)]
    pub cached: bool,
}

/// Where a call stands, from its record's `is_success` and `error_type`:
/// what listings show as `status` and what every count derives from.
///
/// A call held for a person's confirmation (`CONFIRMATION_REQUIRED`) is
/// `PendingApproval`, not failed; one the person declined (or that
/// expired undecided: `TOOL_DECLINED`) is `Declined`. Neither counts as failed,
/// nor in the per-tool counters ([`ToolStats`], `/v1/stats`): they did not
/// run. The decision rewrites the held call's record under its
/// `record_id` (the executor writes the outcome under the id it held), so
/// an approved call is one record, counted once, as what its run gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    Succeeded,
    Failed,
    PendingApproval,
    Declined,
}

/// The `error_type` of a call held for confirmation.
pub const PENDING_CONFIRMATION: &str = crate::error_code::CONFIRMATION_REQUIRED;
/// The `error_type` of a held call a person declined (or that expired).
pub const DECLINED: &str = ErrorCode::ToolDeclined.as_str();

const TOOL_NOT_FOUND: &str = ErrorCode::ToolNotFound.as_str();
const TOOL_NOT_OFFERED: &str = ErrorCode::ToolNotOffered.as_str();

/// A record's `error_type` as it reads today (an old lower-case name is
/// its code).
fn read_error_type<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let name = Option::<String>::deserialize(d)?;
    Ok(name.map(|n| crate::error_code::tool_outcome_name(&n).to_string()))
}

impl CallStatus {
    pub fn of(is_success: bool, error_type: Option<&str>) -> Self {
        match (is_success, error_type) {
            (true, _) => CallStatus::Succeeded,
            (false, Some(PENDING_CONFIRMATION)) => CallStatus::PendingApproval,
            (false, Some(DECLINED)) => CallStatus::Declined,
            (false, _) => CallStatus::Failed,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CallStatus::Succeeded => "succeeded",
            CallStatus::Failed => "failed",
            CallStatus::PendingApproval => "pending_approval",
            CallStatus::Declined => "declined",
        }
    }

    /// Whether the per-tool counters count it: only calls that were run
    /// or refused by the gate (succeeded or failed).
    pub fn is_counted(self) -> bool {
        matches!(self, CallStatus::Succeeded | CallStatus::Failed)
    }
}

impl ToolCallRecord {
    pub fn status(&self) -> CallStatus {
        CallStatus::of(self.is_success, self.error_type.as_deref())
    }

    /// Whether the per-tool counters (`/v1/stats`) count this call: a call
    /// that ran or that the gate refused after finding its tool. Not held
    /// or declined calls (they did not run), nor calls refused by name
    /// (`TOOL_NOT_FOUND`, `TOOL_NOT_OFFERED`): their names are anyone's
    /// text (a model can invent a new one per call), and the counters are
    /// keyed by name.
    pub fn counted_per_tool(&self) -> bool {
        self.status().is_counted()
            && !matches!(
                self.error_type.as_deref(),
                Some(TOOL_NOT_FOUND | TOOL_NOT_OFFERED)
            )
    }

    /// The record as listings show it: its fields and its `status`.
    pub fn shown(&self) -> ShownCall<'_> {
        ShownCall {
            record: self,
            status: self.status(),
        }
    }
}

/// A call record with its [`CallStatus`], as the API lists it
/// (`GET /v1/calls`, a session's export).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = CallRecord)]
pub struct ShownCall<'a> {
    #[serde(flatten)]
    pub record: &'a ToolCallRecord,
    pub status: CallStatus,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct MessageStats {
    pub count: u64,
    pub user_messages: u64,
    pub last_at: Option<Timestamp>,
}

/// Which of a tenant's sessions to list, and in which order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionFilter {
    /// Only sessions of this agent.
    pub agent: Option<String>,
    /// Only sessions of this user.
    pub user_id: Option<String>,
    /// Newest first (session ids are time-ordered): the cursor then pages
    /// towards older sessions. Default: oldest first.
    pub newest_first: bool,
}

impl SessionFilter {
    pub fn keeps(&self, s: &Session) -> bool {
        self.agent.as_ref().is_none_or(|a| &s.agent == a)
            && self
                .user_id
                .as_ref()
                .is_none_or(|u| s.user_id.as_ref() == Some(u))
    }
}

/// Which call records to list.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallFilter {
    pub conversation_id: Option<String>,
    pub workflow_id: Option<String>,
    pub tool: Option<String>,
    /// Only this tenant's records.
    pub tenant: Option<String>,
    /// At most this many (0: all).
    pub limit: usize,
}

/// Per-tool counters, kept in the transaction that adds each record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolStats {
    pub total_calls: u64,
    pub successful_calls: u64,
    pub failed_calls: u64,
    pub total_execution_time_ms: u64,
}

/// A document to write with [`WriteOp::PutDocsOnce`].
#[derive(Debug, Clone)]
pub struct NewDoc {
    pub namespace: String,
    pub key: String,
    pub value: Value,
    /// Listed under this tenant ([`crate::store::DocReads::docs_of`]).
    pub tenant: Option<String>,
}

/// One change the writer applies.
#[derive(Debug)]
pub enum WriteOp {
    /// The request this op is in is applied only while the session's epoch
    /// is still `epoch`; else it is refused whole with
    /// [`super::StoreError::Fenced`] ([`super::owners`]). A no-op for the
    /// embedded backend.
    Fence {
        session_id: String,
        epoch: u64,
    },
    /// [`WriteOp::Fence`] for a workflow run: the request is applied
    /// only while the run's epoch is still `epoch`, else refused whole
    /// with [`super::StoreError::RunFenced`]. A no-op for the embedded
    /// backend.
    FenceRun {
        run_id: String,
        epoch: u64,
    },
    PutSession(Session),
    AppendMessages {
        session_id: String,
        messages: Vec<StoredMessage>,
    },
    RecordToolCall(Box<ToolCallRecord>),
    /// With `tenant`, the document is listed under it ([`crate::store::DocReads::docs_of`]);
    /// without, its index row (if any) stays as it is.
    PutDoc {
        namespace: String,
        key: String,
        value: Value,
        tenant: Option<String>,
    },
    DeleteDoc {
        namespace: String,
        key: String,
    },
    /// Moves a document atomically: if `(namespace, key)` exists it is
    /// removed, `to_value` is written at `(to_namespace, key)` and the old
    /// value lands in `moved`; if it does not exist nothing is written and
    /// `moved` is `None`. All writes go through the one writer, so of two
    /// moves of one key exactly one finds it ([`crate::store::DocReads::move_doc`]).
    MoveDoc {
        namespace: String,
        key: String,
        to_namespace: String,
        to_value: Value,
        moved: Arc<Mutex<Option<Value>>>,
    },
    PutSummary {
        session_id: String,
        summary: StoredSummary,
    },
    /// Adds a model call's tokens to its session's and tenant's counters.
    RecordUsage(UsageDelta),
    /// Removes the session and everything stored under its id
    /// ([`erase`]); `erased` gets what went (`None`: no such session).
    DeleteSession {
        session_id: String,
        erased: Arc<Mutex<Option<Erased>>>,
    },
    /// Erases `tenant`'s call records made outside any session (direct
    /// tool calls, workflow tool nodes), taking their bytes off its stored
    /// bytes: the records after `after` (a record id) in id order, looking
    /// at most [`ERASE_CALLS_BATCH`] of the tenant's records. `erased`
    /// gets what went and where to go on ([`CallsErased`]).
    EraseCallsOutsideSessions {
        tenant: String,
        after: Option<String>,
        erased: Arc<Mutex<Option<CallsErased>>>,
    },
    /// Links a document to a session: erased with it, also after a
    /// [`WriteOp::MoveDoc`]; a [`WriteOp::DeleteDoc`] drops the link.
    LinkDoc {
        namespace: String,
        key: String,
        session_id: String,
    },
    /// Writes `docs` (each listed under its tenant) only if the first is
    /// not there yet, and links them to `session_id` when given (erased
    /// with it): an outbox entry is written at most once however often the
    /// write that carries it is repeated ([`crate::store::DocReads::move_doc`]
    /// then moves it along, so "not there" is also "delivered").
    PutDocsOnce {
        docs: Vec<NewDoc>,
        session_id: Option<String>,
    },
    /// A turn's record ([`turns`]), in the batch of the step it records.
    PutTurn(Box<turns::TurnWrite>),
    /// Marks these messages of a session rolled back ([`StoredMessage::rolled_back`]).
    MarkRolledBack {
        session_id: String,
        seqs: Vec<u64>,
    },
    /// Indexes by tenant, once, the documents of `namespace` written before
    /// the index existed; `indexed` gets how many (`None`: done already).
    IndexDocs {
        namespace: String,
        tenant_of: fn(&Value) -> Option<String>,
        indexed: Arc<Mutex<Option<u64>>>,
    },
    /// Stores a keyed request's outcome ([`idempotency`]).
    PutIdempotency {
        tenant: String,
        key: String,
        stored_at_ms: u64,
        record: Vec<u8>,
    },
    /// Deletes these (tenant, key) records if stored before `before_ms`.
    DeleteIdempotency {
        keys: Vec<(String, String)>,
        before_ms: u64,
    },
}

/// Records a [`WriteOp::EraseCallsOutsideSessions`] looks at, at most,
/// in one transaction.
pub const ERASE_CALLS_BATCH: usize = 1000;

/// What one [`WriteOp::EraseCallsOutsideSessions`] did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallsErased {
    /// Records erased.
    pub calls: u64,
    /// Where the next one starts (`None`: the tenant's records are done).
    pub next: Option<String>,
}

/// A session's rolling summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StoredSummary {
    pub text: String,
    /// The last message seq the summary covers.
    pub covers_until_seq: u64,
    pub updated_at: Timestamp,
}

/// A listed row, decoded; `None` (logged with its table and key) when it
/// cannot be. One row that does not decode (written by an older version,
/// or nested deeper than serde_json reads) never fails a listing: the
/// listing answers without it rather than 503 for every row. Single reads
/// (one session, one record) still fail with the row's error.
pub(crate) fn listed<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    table: &str,
    key: &str,
) -> Option<T> {
    match crate::store::codec::json(bytes) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::warn!(table, key = %key.chars().take(128).collect::<String>(), error = %e, "a stored row does not decode; listed without it");
            None
        }
    }
}

/// What [`crate::store::IdempotencyRecords::claim_idempotency`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum IdempotencyClaim {
    /// Nothing stored (or a mark this node may take over): run it here.
    Mine,
    /// The stored outcome of an earlier request with the key.
    Done(IdempotencyRecord),
    /// Another live node runs a request with the key (its fingerprint).
    Running { fingerprint: String },
}

/// The outcome of a keyed request, as it is replayed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdempotencyRecord {
    /// sha256 (hex) of method, path with query and body.
    pub fingerprint: String,
    pub status: u16,
    pub content_type: Option<String>,
    /// The response body (the API answers UTF-8 JSON).
    pub body: String,
    /// When it was stored (the key's age for the sweep).
    #[serde(skip, default = "epoch")]
    pub stored_at: Timestamp,
    /// Cluster mode: the node that runs the request (no answer yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_node: Option<String>,
}

fn epoch() -> Timestamp {
    Timestamp::UNIX_EPOCH
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call record as stores held it before tool outcomes became codes
    /// of the one table.
    fn old_record(error_type: &str) -> Value {
        serde_json::json!({
            "record_id": "r0001", "tool_name": "calculator", "tool_call_id": "c1",
            "params": {"expression": "6*"}, "output": null, "is_success": false,
            "error": "refused", "error_type": error_type, "execution_time_ms": 3,
            "attempts": 1, "caller_id": "s1", "caller_type": "conversation_agent",
            "conversation_id": "s1", "workflow_id": null, "user_id": null,
            "tenant": "acme", "created_at": "2026-01-01T00:00:00Z",
        })
    }

    #[test]
    fn records_stored_with_the_old_lower_case_names_read_back_as_codes() {
        let read =
            |name: &str| -> ToolCallRecord { serde_json::from_value(old_record(name)).unwrap() };
        let r = read("validation_error");
        assert_eq!(r.error_type.as_deref(), Some("VALIDATION_ERROR"));
        assert_eq!(r.status(), CallStatus::Failed);
        // Written again, it is the code.
        assert_eq!(
            serde_json::to_value(&r).unwrap()["error_type"],
            "VALIDATION_ERROR"
        );
        let held = read("pending_confirmation");
        assert_eq!(held.error_type.as_deref(), Some("CONFIRMATION_REQUIRED"));
        assert_eq!(held.status(), CallStatus::PendingApproval);
        let declined = read("declined");
        assert_eq!(declined.error_type.as_deref(), Some("TOOL_DECLINED"));
        assert_eq!(declined.status(), CallStatus::Declined);
        assert_eq!(read("timeout").error_type.as_deref(), Some("TOOL_TIMEOUT"));
        // Refused by name: still left out of the per-tool counters.
        assert!(!read("tool_not_found").counted_per_tool());
        assert!(!read("tool_not_offered").counted_per_tool());
        assert!(read("rate_limited").counted_per_tool());
        // Today's names read as themselves, a record without one as none.
        assert_eq!(
            read("TOOL_QUEUE_FULL").error_type.as_deref(),
            Some("TOOL_QUEUE_FULL")
        );
        let mut none = old_record("x");
        none["error_type"] = Value::Null;
        let none: ToolCallRecord = serde_json::from_value(none).unwrap();
        assert_eq!(none.error_type, None);
    }
}
