//! ConversationMachine: the decisions of a turn, with no IO.
//!
//! user text ─▶ start_turn ─▶ CallModel ─▶ on_model_reply ─▶ RunTools ─▶ on_tool_results ─▶ CallModel ...
//!                                            └─▶ Finish (answer) ─▶ summary_request? ─▶ on_summary
//!
//! Every step returns the messages to persist (with their sequence numbers:
//! the machine owns the session's numbering) and the next action; the
//! Conversation actor performs them. Rules:
//! - the context is built in five layers ([`super::context`]): system
//!   prompt, brevity, visitor info, tool-use instructions, then the rolling
//!   summary, the messages it does not cover (at most
//!   [`SUMMARY_AFTER_WINDOWS`] × `history_window`) and the current turn;
//! - at most `max_iterations` rounds of tool calls; after the last round one
//!   final call with `tool_choice = none` and an instruction to answer with
//!   what it has (`fallback_used`). Tool calls in that final reply are ignored;
//! - `iterations` in the outcome counts the model calls of the turn;
//! - after a turn, when more than [`SUMMARY_AFTER_WINDOWS`] ×
//!   `history_window` messages are not yet covered by the summary, all but
//!   the last `history_window` are summarised (a separate model call without
//!   tools) and leave the machine's memory; the window never starts on a
//!   tool result cut from its assistant message. Decision: the slack between
//!   one and two windows means a summary call every `history_window / 2`
//!   turns or so instead of after every turn once the window is full (the
//!   summary call cost a whole model round trip per turn, and the next turn
//!   waited for it); the price is a prompt of one to two windows of verbatim
//!   messages instead of exactly one, and nothing the summary does not cover
//!   is ever left out of the prompt;
//! - citations: the `source_id`s the turn's tools returned; ids the answer
//!   mentions (`tool:<domain>:v<n>`) that no tool of this conversation
//!   returned are `ungrounded_citations`. "This conversation" spans restarts
//!   and evictions: the loader seeds the known sources from the session's
//!   stored call records ([`ConversationMachine::with_known_sources`]).
//!
//! Typed answers (issue #39): a turn with an answer schema (the agent's
//! `output_schema`, or its message's `response_format`) sends it with
//! every model call; the answer is checked with
//! [`crate::tools::output_schema`]. A match goes into the outcome's
//! `output`; the first miss asks the model once more with the miss and the
//! field errors (in that request only, never in the history, with no
//! tools offered); the second fails the turn ([`Action::Reject`],
//! `OUTPUT_SCHEMA_VIOLATION` with the errors). Neither miss is persisted.
//!
//! A turn is data: every step returns the turn's [`TurnRecord`] (id,
//! phase, calls so far, outcome) to be stored with the step's messages.
//! A batch with a call held for a person's confirmation pauses the turn
//! (`awaiting_approval`, [`Action::Pause`]; off for workflow nodes'
//! sessions, [`TurnSettings::pause_for_approval`]); nothing of the batch is
//! persisted until every call has an outcome, then the results follow the
//! calls' order as always. [`ConversationMachine::resume`] takes a stored,
//! open record up on a fresh machine; [`ConversationMachine::interrupt_turn`]
//! closes a turn early (outcomes for unanswered calls, so the history stays
//! valid; with rollback the turn's messages leave the history);
//! [`ConversationMachine::abort_turn`] closes a failed one. The session's
//! queue and multitask rule are the machine's too ([`super::queue`]).
//!
//! Where a turn stands is data, [`Phase`]: `idle`, `awaiting_model`,
//! `awaiting_tools` (with the batch the last reply asked for) or
//! `summarising` (between turns, the summary call in flight). It
//! serialises, so it can be stored with the step that reaches it. A step
//! that does not fit the phase (a model reply with no turn, tool results
//! for calls the turn did not ask for) is a [`MachineError`], never a
//! panic: the caller fails that turn and the conversation goes on.
//!
//! Memory: the running turn is boxed (an idle machine carries a pointer,
//! not the turn), and [`ConversationMachine::shed`] gives back the
//! history's and the queue's slack once the session is quiet (the actor
//! calls it; see "Memory of an idle conversation" in [`super::actor`]).

use std::collections::BTreeSet;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error_code::ErrorCode;
use crate::model::ResponseFormat;
use crate::model::{
    ChatMessage, ChatRequest, ChatResponse, FinishReason, Purpose, Role, ToolCall, ToolChoice,
};
use crate::tools::outcome::ParsedArguments;
use crate::tools::output_schema::{self, OutputSchema};
use crate::tools::{ErrorType, ToolExecutionResult};
use std::sync::Arc;

use super::context::{self, FALLBACK_INSTRUCTION, PromptLayers};
use super::queue::{Activity, Admission, Queued, Refusal, TurnQueue};
pub use super::settings::TurnSettings;

/// `[model] max_tool_calls` unless configured: tool calls of one reply
/// that are kept and run.
pub const DEFAULT_MAX_TOOL_CALLS: usize = 16;
use super::summary::ToolUsageSummary;

pub const SUMMARY_INSTRUCTIONS: &str = "This is a summary request, not a message from the user. \
     You keep the running summary of a conversation for the assistant that continues it. Merge \
     the current summary with the new messages into one updated summary: keep names, numbers, \
     facts learned from tools, decisions and open questions; drop greetings and repetition. \
     Write at most 200 words of plain text.";

/// The uncovered history may grow to this many windows before it is
/// summarised back down to one window.
pub const SUMMARY_AFTER_WINDOWS: usize = 2;

/// The stored summary of a session's older messages.
#[derive(Debug, Clone, PartialEq)]
pub struct RollingSummary {
    pub text: String,
    /// The last message seq the summary covers.
    pub covers_until_seq: u64,
}

/// One tool call of a turn as the caller sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = ToolCallReport)]
pub struct CallReport {
    pub id: String,
    pub name: String,
    /// Parsed arguments, or the raw string when they were not JSON.
    /// (`default`: a stored turn read without its calls' records, as
    /// `fork` reads phases, has none: see `turn_rows.rs`.)
    #[schema(value_type = Value, required = true)]
    #[serde(default)]
    pub arguments: Value,
    pub is_success: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_type: Option<ErrorType>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_id: Option<String>,
    /// The call's record (`record_id` in `GET /v1/calls`), when the
    /// executor wrote one: its arguments and output are read from there
    /// (a stored turn names it instead of repeating them: see
    /// `turn_rows.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_id: Option<String>,
    /// That record's `params` are these `arguments` as the model gave
    /// them (no validation coerced them, no guardrail redacted them).
    /// In memory only.
    #[serde(skip)]
    pub arguments_recorded: bool,
}

impl CallReport {
    /// Where the call stands: a held one is `pending_approval`, not failed.
    pub fn status(&self) -> crate::store::CallStatus {
        crate::store::CallStatus::of(self.is_success, self.error_type.map(ErrorType::as_str))
    }
}

/// The result of a finished turn (or of one paused for a confirmation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = TurnReply)]
pub struct TurnOutcome {
    /// The turn's id: `GET /v1/sessions/{id}/turns/{turn_id}` reads it.
    pub turn_id: String,
    /// `completed`, or `awaiting_approval` (then `answer` is empty and
    /// `confirmations` lists what waits for a decision).
    pub status: TurnStatus,
    /// A paused turn's held calls: each waits for a decision
    /// (`POST /v1/confirmations/{id}`), which resumes the turn.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub confirmations: Vec<Approval>,
    pub answer: String,
    /// Each tool call of the turn.
    #[serde(default)]
    #[schema(required = true)]
    pub tool_calls: Vec<CallReport>,
    /// A call held for confirmation is pending (not failed), a declined
    /// one declined.
    pub tool_usage_summary: ToolUsageSummary,
    /// Source ids of the data this turn's tools returned.
    pub citations: Vec<String>,
    /// Source ids the answer mentions that no tool returned.
    pub ungrounded_citations: Vec<String>,
    /// Model calls of the turn.
    pub iterations: u32,
    /// Whether the turn ended with a forced answer (`tool_choice = none`).
    pub fallback_used: bool,
    /// Why the model stopped writing the answer: `stop`; `length` (cut at
    /// `max_tokens`: the answer is truncated); `content_filter` (the
    /// provider withheld it: the answer may be empty); `tool_calls`; or
    /// another value the endpoint sent. Null when it sent none.
    #[schema(value_type = Option<String>)]
    pub finish_reason: Option<FinishReason>,
    /// The answer parsed as JSON, when the turn had an answer schema (the
    /// agent's `output_schema` or the message's `response_format`): it
    /// matched the schema. Absent otherwise; never an unvalidated value.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<std::collections::BTreeMap<String, Value>>)]
    pub output: Option<Value>,
}

/// How far a turn got, as its callers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TurnStatus {
    Completed,
    AwaitingApproval,
}

/// A call of a paused turn held for a person's decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Approval {
    pub tool_call_id: String,
    pub tool_name: String,
    pub confirmation_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
    /// The child session whose call this is, when the held call is an
    /// `ask_` of another agent ([`super::delegation`]): once the
    /// confirmation is decided, the ask runs again to learn the child's end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegated_to: Option<String>,
}

/// Why a turn failed, as stored in its record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TurnFailure {
    pub code: String,
    pub message: String,
    /// What the code's row says it carries (`OUTPUT_SCHEMA_VIOLATION`: the
    /// field errors; `GUARDRAIL_TRIPPED`: the guardrail and its stage).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<std::collections::BTreeMap<String, Value>>)]
    pub details: Option<Value>,
}

/// A turn the machine itself ends without an answer: the answer missed
/// its schema twice ([`ErrorCode::OutputSchemaViolation`]), or a check
/// refused it.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    pub code: ErrorCode,
    pub message: String,
    pub details: Value,
}

/// A turn as data: what the store keeps under `(session, turn id)`, written
/// with each step, and what `GET /v1/sessions/{id}/turns/{turn_id}` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = TurnView)]
pub struct TurnRecord {
    pub turn_id: String,
    #[serde(flatten)]
    pub phase: Phase,
    /// The seq of the turn's user message; its other messages follow it.
    pub first_seq: u64,
    /// Rounds of tool calls so far.
    pub rounds: u32,
    /// Model calls made so far.
    pub model_calls: u32,
    pub fallback: bool,
    /// The calls that finished, in order.
    pub tool_calls: Vec<CallReport>,
    /// Once `completed`: the body the message's POST answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<TurnOutcome>,
    /// Once `failed`: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<TurnFailure>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Interrupted by a new message under `multitask = "rollback"`: its
    /// messages are left out of every later prompt.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rolled_back: bool,
    /// How often a restart cut the turn and it was taken up again.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resumes: u32,
    /// The answer schema the turn's message asked for (kept so a resumed
    /// turn asks for it again; an agent's own schema is not repeated here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// The answer missed its schema once and the model was asked again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_retried: bool,
    /// Where the turn's end is POSTed (the message's `webhook`): an event
    /// when it completes, fails, is interrupted or pauses for an approval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
    /// The memory notes the turn's model calls see (`memory = { inject =
    /// true }`), chosen once for the user's message when the turn started
    /// and kept here, so a turn resumed after a restart or continued by
    /// another agent after a handoff sends the same notes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_notes: Option<String>,
    /// Tokens of the turn's model calls so far.
    #[serde(default, skip_serializing_if = "TurnTokens::is_zero")]
    pub usage: TurnTokens,
    pub started_at: Timestamp,
    pub updated_at: Timestamp,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A turn's tokens, as its record and its webhook event show them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TurnTokens {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
}

impl TurnTokens {
    fn is_zero(&self) -> bool {
        self.total_tokens == 0 && self.prompt_tokens == 0 && self.completion_tokens == 0
    }

    fn add(&mut self, u: &crate::model::Usage) {
        self.prompt_tokens += u64::from(u.prompt_tokens);
        self.completion_tokens += u64::from(u.completion_tokens);
        self.total_tokens = self.prompt_tokens + self.completion_tokens;
    }
}

impl TurnRecord {
    /// Its phase is final: it will not move again.
    pub fn is_final(&self) -> bool {
        self.phase.is_final()
    }
}

#[derive(Debug, Clone)]
pub enum Action {
    CallModel(ChatRequest),
    RunTools(Vec<ToolCall>),
    Finish(Box<TurnOutcome>),
    /// Calls wait for a person's decision: the turn is paused, answered
    /// with this outcome (`awaiting_approval`).
    Pause(Box<TurnOutcome>),
    /// The turn fails without an answer ([`Rejection`]): the actor closes it
    /// as failed ([`ConversationMachine::abort_turn`]).
    Reject(Box<Rejection>),
}

/// What the actor must do: persist these messages (in order) and the
/// turn's record, in one write, then act.
#[derive(Debug, Clone)]
pub struct Step {
    pub persist: Vec<(u64, ChatMessage)>,
    pub record: Option<TurnRecord>,
    pub action: Action,
}

/// A turn ended without an answer (failed or interrupted): the messages
/// that keep the history well formed, the record, and the messages to mark
/// rolled back.
#[derive(Debug, Clone)]
pub struct Closed {
    pub persist: Vec<(u64, ChatMessage)>,
    pub record: TurnRecord,
    pub rolled_back: Vec<u64>,
}

/// How to go on with a turn taken up from its record ([`ConversationMachine::resume`]).
#[derive(Debug, Clone)]
pub enum Resume {
    /// Ask the model again.
    CallModel(ChatRequest),
    /// Find the outcomes of these calls (stored ones are not run again).
    Tools(Vec<ToolCall>),
    /// These calls wait for decisions; the others of the batch finished.
    Approval {
        calls: Vec<ToolCall>,
        confirmations: Vec<Approval>,
    },
}

/// Where a conversation stands: what it waits for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    /// No turn runs.
    Idle,
    /// A turn waits for the model's reply.
    AwaitingModel,
    /// A turn waits for the outcomes of these calls (the last reply's, in
    /// its order).
    AwaitingTools { calls: Vec<ToolCall> },
    /// Between turns: the summary call covering messages up to this seq is
    /// in flight.
    Summarising { covers_until_seq: u64 },
    /// A turn paused: some of the batch's calls wait for a person's
    /// decision (`confirmations`), the others finished.
    AwaitingApproval {
        calls: Vec<ToolCall>,
        confirmations: Vec<Approval>,
    },
    /// Final phases, of a turn's record: answered,
    Completed,
    /// failed (the model or the store),
    Failed,
    /// or cut (a new message under `interrupt`/`rollback`, or a crash
    /// older than the resume window).
    Interrupted,
}

impl Phase {
    pub fn as_str(&self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::AwaitingModel => "awaiting_model",
            Phase::AwaitingTools { .. } => "awaiting_tools",
            Phase::Summarising { .. } => "summarising",
            Phase::AwaitingApproval { .. } => "awaiting_approval",
            Phase::Completed => "completed",
            Phase::Failed => "failed",
            Phase::Interrupted => "interrupted",
        }
    }

    /// A turn in this phase will not move again.
    pub fn is_final(&self) -> bool {
        matches!(self, Phase::Completed | Phase::Failed | Phase::Interrupted)
    }
}

/// A step the machine was asked to take that does not fit its phase.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MachineError {
    #[error("{step} while {}", phase.as_str())]
    OutOfPhase { step: &'static str, phase: Phase },
    #[error("tool results for calls {got:?}, but the turn waits for {expected:?}")]
    UnexpectedResults {
        expected: Vec<String>,
        got: Vec<String>,
    },
}

#[derive(Debug)]
struct Turn {
    id: String,
    key: Option<String>,
    started_at: Timestamp,
    first_seq: u64,
    resumes: u32,
    /// What the turn waits for: `AwaitingModel`, `AwaitingTools` or
    /// `AwaitingApproval`.
    phase: Phase,
    messages: Vec<(u64, ChatMessage)>,
    rounds: u32,
    model_calls: u32,
    calls: Vec<CallReport>,
    fallback: bool,
    /// The arguments of the calls the turn waits for, parsed once (by call
    /// id; in memory only: a resumed turn parses its calls again).
    arguments: Vec<(String, ParsedArguments)>,
    /// The JSON shape the answer must have.
    output: Option<Arc<OutputSchema>>,
    /// The answer missed it once; the next miss fails the turn.
    output_retried: bool,
    webhook: Option<String>,
    /// The memory notes of every model call of the turn.
    memory: Option<String>,
    usage: TurnTokens,
}

impl Turn {
    /// The parsed arguments of `call` (parsed now if they were not yet).
    fn arguments_of(&self, call: &ToolCall) -> ParsedArguments {
        self.arguments
            .iter()
            .find(|(id, _)| *id == call.id)
            .map(|(_, a)| a.clone())
            .unwrap_or_else(|| ParsedArguments::parse(&call.arguments))
    }

    fn parse_arguments(&mut self, calls: &[ToolCall]) {
        self.arguments = calls
            .iter()
            .map(|c| (c.id.clone(), ParsedArguments::parse(&c.arguments)))
            .collect();
    }
}

pub struct ConversationMachine {
    settings: TurnSettings,
    /// Messages not covered by the summary, oldest first.
    history: Vec<(u64, ChatMessage)>,
    summary: Option<RollingSummary>,
    next_seq: u64,
    /// Source ids any tool of this conversation returned (since loaded).
    known_sources: BTreeSet<String>,
    /// What a summary request in flight will cover.
    summarising_until: Option<u64>,
    /// Boxed: an idle conversation (most resident ones) pays a pointer,
    /// not the turn's full size.
    turn: Option<Box<Turn>>,
    /// What waits, and the multitask rule ([`super::queue`]).
    queue: TurnQueue,
}

impl ConversationMachine {
    /// `history`: the messages after `summary` (all of them, or at least the
    /// last window), oldest first; `last_seq`: the session's last seq.
    pub fn new(
        settings: TurnSettings,
        history: Vec<(u64, ChatMessage)>,
        summary: Option<RollingSummary>,
        last_seq: u64,
    ) -> Self {
        ConversationMachine {
            settings,
            history,
            summary,
            next_seq: last_seq + 1,
            known_sources: BTreeSet::new(),
            summarising_until: None,
            turn: None,
            queue: TurnQueue::new(
                crate::agents::Multitask::default(),
                super::queue::DEFAULT_MAX_QUEUED_TURNS,
            ),
        }
    }

    /// The agent's multitask rule and how many turns may wait.
    pub fn with_queue_rules(mut self, multitask: crate::agents::Multitask, max: usize) -> Self {
        self.queue = TurnQueue::new(multitask, max);
        self
    }

    /// A ticket for a queue entry (the actor keeps its caller's channels
    /// under it).
    pub fn ticket(&mut self) -> u64 {
        self.queue.ticket()
    }

    /// Takes a message or a record into the queue, by the multitask rule.
    pub fn offer(&mut self, entry: Queued) -> Result<Admission, Refusal> {
        self.queue.offer(entry, self.turn.is_some())
    }

    /// The next entry to perform, if the session is free (no turn running
    /// or paused, no record or summary in progress).
    pub fn next_queued(&mut self) -> Option<Queued> {
        self.queue.next(self.turn.is_some())
    }

    /// What occupies the session now (a paused turn aside).
    pub fn activity(&self) -> Activity {
        self.queue.activity()
    }

    /// The actor reports where a step it performed left the session: the
    /// turn's final commit is done (`Other`: its summary follows; `Idle`),
    /// a paused or resumed turn (`Idle`, `Turn`), a record stored (`Idle`).
    pub fn set_activity(&mut self, activity: Activity) {
        self.queue.set_activity(activity);
    }

    /// Forgets queued entries nobody waits for; how many.
    pub fn forget_queued(&mut self, gone: impl Fn(u64) -> bool) -> usize {
        self.queue.forget(gone)
    }

    /// Every queued entry, emptied.
    pub fn drain_queue(&mut self) -> Vec<Queued> {
        self.queue.drain()
    }

    /// Nothing runs or waits (a paused turn may: it waits for a person).
    pub fn is_quiet(&self) -> bool {
        self.queue.activity() == Activity::Idle && self.queue.is_empty()
    }

    /// Turn `turn_id` runs, is paused, or waits in the queue.
    pub fn knows_turn(&self, turn_id: &str) -> bool {
        self.turn_id() == Some(turn_id) || self.queue.holds_turn(turn_id)
    }

    /// Source ids tools of this conversation returned before it was loaded.
    pub fn with_known_sources(mut self, sources: impl IntoIterator<Item = String>) -> Self {
        self.known_sources.extend(sources);
        self
    }

    pub fn in_turn(&self) -> bool {
        self.turn.is_some()
    }

    /// Where the conversation stands.
    pub fn phase(&self) -> Phase {
        match (&self.turn, self.summarising_until) {
            (Some(turn), _) => turn.phase.clone(),
            (None, Some(until)) => Phase::Summarising {
                covers_until_seq: until,
            },
            (None, None) => Phase::Idle,
        }
    }

    fn out_of_phase(&self, step: &'static str) -> MachineError {
        MachineError::OutOfPhase {
            step,
            phase: self.phase(),
        }
    }

    /// The parsed arguments of the calls the turn waits for, in their
    /// order (each parsed once, when the reply or the resume brought it).
    pub fn arguments_of(&self, calls: &[ToolCall]) -> Vec<ParsedArguments> {
        calls
            .iter()
            .map(|c| match &self.turn {
                Some(turn) => turn.arguments_of(c),
                None => ParsedArguments::parse(&c.arguments),
            })
            .collect()
    }

    pub fn settings(&self) -> &TurnSettings {
        &self.settings
    }

    /// The tool calls of the running turn so far.
    pub fn turn_calls(&self) -> &[CallReport] {
        self.turn.as_ref().map_or(&[], |t| t.calls.as_slice())
    }

    /// Settings for the next turn (the tenant's config or the session's
    /// metadata may have changed). Ignored during a turn.
    pub fn set_settings(&mut self, settings: TurnSettings) {
        if self.turn.is_none() {
            self.settings = settings;
        }
    }

    /// A handoff ([`super::handoff`]): another agent's settings from now
    /// on, for the rest of the running turn too (its next model call).
    pub fn hand_off(&mut self, settings: TurnSettings) {
        self.settings = settings;
    }

    /// Gives back what a quiet conversation does not use: the slack of
    /// the history and the queue's buffer (the actor calls it when the
    /// session goes quiet; see the module doc).
    pub fn shed(&mut self) {
        self.history.shrink_to_fit();
        self.queue.shed();
    }

    /// Numbers a message that is not part of a turn (an operator's reply).
    pub fn record(&mut self, message: ChatMessage) -> (u64, ChatMessage) {
        let entry = (self.take_seq(), message);
        self.history.push(entry.clone());
        entry
    }

    /// Starts turn `id` with the user's `text`; only when no turn runs.
    /// `key`: the message's `Idempotency-Key`, kept in the turn's record.
    pub fn start_turn(
        &mut self,
        text: String,
        id: String,
        key: Option<String>,
    ) -> Result<Step, MachineError> {
        if self.turn.is_some() {
            return Err(self.out_of_phase("start_turn"));
        }
        let user = (self.take_seq(), ChatMessage::user(text));
        self.turn = Some(Box::new(Turn {
            id,
            key,
            started_at: Timestamp::now(),
            first_seq: user.0,
            resumes: 0,
            phase: Phase::AwaitingModel,
            messages: vec![user.clone()],
            rounds: 0,
            model_calls: 0,
            calls: Vec::new(),
            fallback: false,
            arguments: Vec::new(),
            output: self.settings.output_schema().cloned(),
            output_retried: false,
            webhook: self.settings.webhook().map(str::to_string),
            memory: self.settings.memory_notes().map(str::to_string),
            usage: TurnTokens::default(),
        }));
        let request = self.request();
        Ok(Step {
            persist: vec![user],
            record: self.turn_record(),
            action: Action::CallModel(request),
        })
    }

    /// The record of a turn refused before it started (an `input`
    /// guardrail): failed at once, with no message of its own; numbered
    /// where its message would have been.
    pub fn refused_record(
        &self,
        id: String,
        key: Option<String>,
        error: TurnFailure,
    ) -> TurnRecord {
        let now = Timestamp::now();
        TurnRecord {
            turn_id: id,
            phase: Phase::Failed,
            first_seq: self.next_seq,
            rounds: 0,
            model_calls: 0,
            fallback: false,
            tool_calls: Vec::new(),
            outcome: None,
            error: Some(error),
            idempotency_key: key,
            rolled_back: false,
            resumes: 0,
            response_format: None,
            output_retried: false,
            webhook: None,
            memory_notes: None,
            usage: TurnTokens::default(),
            started_at: now,
            updated_at: now,
        }
    }

    /// The running turn's id.
    pub fn turn_id(&self) -> Option<&str> {
        self.turn.as_ref().map(|t| t.id.as_str())
    }

    /// The running turn as data, as it stands.
    pub fn turn_record(&self) -> Option<TurnRecord> {
        self.turn
            .as_ref()
            .map(|t| snapshot(t, t.phase.clone(), Timestamp::now()))
    }

    /// `reply` is the turn's answer (no tool calls, or the final call
    /// after the last round): what `output` guardrails check.
    pub fn is_answer(&self, reply: &ChatResponse) -> bool {
        reply.tool_calls.is_empty() || self.turn.as_ref().is_some_and(|t| t.fallback)
    }

    pub fn on_model_reply(&mut self, mut reply: ChatResponse) -> Result<Step, MachineError> {
        if !matches!(
            self.turn.as_ref().map(|t| &t.phase),
            Some(Phase::AwaitingModel)
        ) {
            return Err(self.out_of_phase("on_model_reply"));
        }
        if let (Some(turn), Some(u)) = (self.turn.as_mut(), reply.usage.as_ref()) {
            turn.usage.add(u);
        }
        // The one cap on calls per reply, whichever model answered: the
        // others are neither stored nor run (nor answered: the stored
        // request carries only the kept ones, so no call id goes without
        // its result).
        let max = self.settings.max_tool_calls as usize;
        if reply.tool_calls.len() > max {
            tracing::warn!(
                kept = max,
                dropped = reply.tool_calls.len() - max,
                "the model asked for more tool calls than [model] max_tool_calls; the others are neither run nor stored"
            );
            reply.tool_calls.truncate(max);
        }
        let answering =
            reply.tool_calls.is_empty() || self.turn.as_ref().is_some_and(|t| t.fallback);
        let mut output = None;
        if answering && let Some(schema) = self.turn.as_ref().and_then(|t| t.output.clone()) {
            let answer = reply.content.as_deref().unwrap_or_default();
            match schema.check(answer) {
                Ok(value) => output = Some(value),
                Err(errors) => return Ok(self.schema_missed(&schema, answer, &errors)),
            }
        }
        let seq = self.take_seq();
        let turn = self.turn.as_mut().expect("checked above");
        if !reply.tool_calls.is_empty() && !turn.fallback {
            let msg = ChatMessage::assistant_tool_calls(reply.content, reply.tool_calls.clone());
            turn.messages.push((seq, msg.clone()));
            turn.parse_arguments(&reply.tool_calls);
            turn.phase = Phase::AwaitingTools {
                calls: reply.tool_calls.clone(),
            };
            return Ok(Step {
                persist: vec![(seq, msg)],
                record: self.turn_record(),
                action: Action::RunTools(reply.tool_calls),
            });
        }
        let answer = reply.content.unwrap_or_default();
        let msg = ChatMessage::assistant(answer.clone());
        turn.messages.push((seq, msg.clone()));
        let (mut outcome, mut record) = self.finish(answer);
        outcome.finish_reason = reply.finish_reason;
        outcome.output = output;
        record.outcome = Some(outcome.clone());
        Ok(Step {
            persist: vec![(seq, msg)],
            record: Some(record),
            action: Action::Finish(Box::new(outcome)),
        })
    }

    /// The answer missed the turn's schema: the first miss asks the model
    /// once more (the miss and the errors in that request only, never in
    /// the history, and no tools offered: it must answer); the second fails
    /// the turn with `OUTPUT_SCHEMA_VIOLATION` and the errors.
    fn schema_missed(
        &mut self,
        schema: &OutputSchema,
        answer: &str,
        errors: &[crate::tools::FieldError],
    ) -> Step {
        let turn = self.turn.as_mut().expect("callers check the phase");
        if turn.output_retried {
            let described = output_schema::describe(errors);
            return Step {
                persist: Vec::new(),
                record: None,
                action: Action::Reject(Box::new(Rejection {
                    code: ErrorCode::OutputSchemaViolation,
                    message: format!(
                        "the model's answer did not match the schema {} twice: {}",
                        schema.format.name,
                        crate::tools::outcome::cut_chars(&described, 2000)
                    ),
                    details: serde_json::json!({
                        "schema": schema.format.name,
                        "errors": errors,
                    }),
                })),
            };
        }
        turn.output_retried = true;
        let mut request = self.request();
        request
            .messages
            .push(ChatMessage::assistant(crate::tools::outcome::cut_chars(
                answer, 16_384,
            )));
        request.messages.push(ChatMessage::user(format!(
            "Your answer does not match the required JSON Schema {}:\n{}\nAnswer again with one \
             JSON value only that matches the schema.",
            schema.format.name,
            output_schema::describe(errors)
        )));
        request.tool_choice = ToolChoice::None;
        Step {
            persist: Vec::new(),
            record: self.turn_record(),
            action: Action::CallModel(request),
        }
    }

    /// `results` in the order of the calls of the last model reply: one per
    /// call, with its id, or nothing changes.
    pub fn on_tool_results(
        &mut self,
        results: Vec<(ToolCall, ToolExecutionResult)>,
    ) -> Result<Step, MachineError> {
        let calls = match self.turn.as_ref().map(|t| &t.phase) {
            Some(Phase::AwaitingTools { calls }) | Some(Phase::AwaitingApproval { calls, .. }) => {
                calls
            }
            _ => return Err(self.out_of_phase("on_tool_results")),
        };
        let expected: Vec<&str> = calls.iter().map(|c| c.id.as_str()).collect();
        let got: Vec<&str> = results.iter().map(|(c, _)| c.id.as_str()).collect();
        if expected != got {
            return Err(MachineError::UnexpectedResults {
                expected: expected.iter().map(|s| s.to_string()).collect(),
                got: got.iter().map(|s| s.to_string()).collect(),
            });
        }
        // Calls held for a person's decision pause the turn; nothing of
        // the batch is persisted as messages until every call has an
        // outcome (the results keep the calls' order).
        let held: Vec<Approval> = results
            .iter()
            .filter(|(_, r)| r.error_type == Some(ErrorType::PendingConfirmation))
            .filter_map(|(c, r)| {
                let id = r.metadata.confirmation_id.clone()?;
                let out = r.output.as_ref();
                Some(Approval {
                    tool_call_id: c.id.clone(),
                    tool_name: c.name.clone(),
                    confirmation_id: id,
                    summary: out
                        .and_then(|o| o.get("summary"))
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    expires_at: out
                        .and_then(|o| o.get("expires_at"))
                        .and_then(|v| serde_json::from_value(v.clone()).ok()),
                    delegated_to: out
                        .and_then(|o| o.get("delegated_to"))
                        .and_then(Value::as_str)
                        .map(str::to_string),
                })
            })
            .collect();
        if self.settings.pause_for_approval && !held.is_empty() {
            let turn = self.turn.as_mut().expect("checked above");
            turn.phase = Phase::AwaitingApproval {
                calls: results.iter().map(|(c, _)| c.clone()).collect(),
                confirmations: held.clone(),
            };
            let record = self.turn_record().expect("a turn");
            // The caller sees every call of the batch, the held ones as
            // `CONFIRMATION_REQUIRED` with what to decide (they join the
            // turn's own list once the batch is complete).
            let mut shown = record.tool_calls.clone();
            let turn = self.turn.as_ref().expect("checked above");
            shown.extend(
                results
                    .iter()
                    .map(|(c, r)| report(c, turn.arguments_of(c), r)),
            );
            let outcome = TurnOutcome {
                turn_id: record.turn_id.clone(),
                status: TurnStatus::AwaitingApproval,
                confirmations: held,
                answer: String::new(),
                tool_usage_summary: ToolUsageSummary::from_calls(
                    shown.iter().map(|c| (c.name.as_str(), c.status())),
                ),
                tool_calls: shown,
                citations: Vec::new(),
                ungrounded_citations: Vec::new(),
                iterations: record.model_calls,
                fallback_used: record.fallback,
                finish_reason: None,
                output: None,
            };
            return Ok(Step {
                persist: Vec::new(),
                record: Some(record),
                action: Action::Pause(Box::new(outcome)),
            });
        }
        let max = self.settings.max_iterations;
        let mut persist = Vec::with_capacity(results.len());
        for (call, result) in results {
            let seq = self.take_seq();
            let turn = self.turn.as_mut().expect("checked above");
            let msg = ChatMessage::tool_result(&call, result.model_content());
            turn.messages.push((seq, msg.clone()));
            persist.push((seq, msg));
            let source_id = result
                .is_success
                .then(|| result.metadata.source_id.clone())
                .flatten();
            if let Some(s) = &source_id {
                self.known_sources.insert(s.clone());
            }
            let turn = self.turn.as_mut().expect("checked above");
            let arguments = turn.arguments_of(&call);
            turn.calls.push(report(&call, arguments, &result));
        }
        let turn = self.turn.as_mut().expect("checked above");
        turn.rounds += 1;
        if turn.rounds >= max {
            turn.fallback = true;
        }
        turn.phase = Phase::AwaitingModel;
        let request = self.request();
        Ok(Step {
            persist,
            record: self.turn_record(),
            action: Action::CallModel(request),
        })
    }

    /// Ends a turn that failed (model down): what was persisted stays in the
    /// history, so memory matches the store (a batch without outcomes gets
    /// them, as in [`Self::interrupt_turn`]). The record says why.
    pub fn abort_turn(&mut self, error: TurnFailure) -> Option<Closed> {
        let mut closed = self.close_turn(Phase::Failed, false, None, Vec::new())?;
        closed.record.error = Some(error);
        Some(closed)
    }

    /// Cuts the running turn (a new message under `interrupt` or
    /// `rollback`, or a crash older than the resume window): calls of the
    /// batch that have no outcome get one saying so (a tool-call message
    /// without its results would make every later request invalid), `note`
    /// (if any) is added as an assistant message, and the turn is closed as
    /// `interrupted`. With `rollback` its messages are marked rolled back
    /// and leave every later prompt.
    pub fn interrupt_turn(&mut self, rollback: bool, note: Option<&str>) -> Option<Closed> {
        self.close_turn(Phase::Interrupted, rollback, note, Vec::new())
    }

    /// [`Self::interrupt_turn`] for a paused turn whose calls' outcomes are
    /// (partly) known once its confirmations were settled: a call approved
    /// just before the interrupt ran, and its real outcome (not
    /// `TOOL_OUTCOME_UNKNOWN`) goes into the history and the turn's calls.
    pub fn interrupt_turn_with(
        &mut self,
        rollback: bool,
        known: Vec<(ToolCall, ToolExecutionResult)>,
    ) -> Option<Closed> {
        self.close_turn(Phase::Interrupted, rollback, None, known)
    }

    fn close_turn(
        &mut self,
        phase: Phase,
        rollback: bool,
        note: Option<&str>,
        mut known: Vec<(ToolCall, ToolExecutionResult)>,
    ) -> Option<Closed> {
        let waiting: Vec<ToolCall> = match &self.turn.as_ref()?.phase {
            Phase::AwaitingTools { calls } | Phase::AwaitingApproval { calls, .. } => calls.clone(),
            _ => Vec::new(),
        };
        let mut persist = Vec::new();
        for call in waiting {
            let seq = self.take_seq();
            if let Some(at) = known.iter().position(|(c, _)| c.id == call.id) {
                let (_, result) = known.swap_remove(at);
                persist.push((seq, ChatMessage::tool_result(&call, result.model_content())));
                let turn = self.turn.as_mut().expect("checked above");
                let arguments = turn.arguments_of(&call);
                turn.calls.push(report(&call, arguments, &result));
                continue;
            }
            let content = format!(
                "{{\"error\":\"the turn ended before this call had an outcome ({}); it may or may not have run\",\"error_type\":\"{}\"}}",
                phase.as_str(),
                ErrorType::OutcomeUnknown.as_str()
            );
            persist.push((seq, ChatMessage::tool_result(&call, content)));
        }
        if let Some(note) = note {
            let seq = self.take_seq();
            persist.push((seq, ChatMessage::assistant(note.to_string())));
        }
        let turn = self.turn.as_mut().expect("checked above");
        turn.messages.extend(persist.iter().cloned());
        turn.phase = phase.clone();
        let mut record = snapshot(turn, phase, Timestamp::now());
        let turn = *self.turn.take().expect("checked above");
        let rolled_back = if rollback {
            record.rolled_back = true;
            turn.messages.iter().map(|(seq, _)| *seq).collect()
        } else {
            self.history.extend(turn.messages);
            Vec::new()
        };
        Some(Closed {
            persist,
            record,
            rolled_back,
        })
    }

    /// Takes up a turn a crash (or a restart during a pause) left open,
    /// from its record: the history's messages from the record's first seq
    /// on are the turn's. Only when no turn runs.
    pub fn resume(&mut self, record: TurnRecord) -> Result<Resume, MachineError> {
        if self.turn.is_some() || record.is_final() {
            return Err(self.out_of_phase("resume"));
        }
        let at = self
            .history
            .iter()
            .position(|(seq, _)| *seq >= record.first_seq)
            .unwrap_or(self.history.len());
        let messages = self.history.split_off(at);
        let mut turn = Turn {
            id: record.turn_id,
            key: record.idempotency_key,
            started_at: record.started_at,
            first_seq: record.first_seq,
            resumes: record.resumes + 1,
            phase: record.phase.clone(),
            messages,
            rounds: record.rounds,
            model_calls: record.model_calls,
            calls: record.tool_calls,
            fallback: record.fallback,
            arguments: Vec::new(),
            // The message's schema, from the record; else the agent's.
            output: match record.response_format {
                Some(format) => OutputSchema::new(format, true).ok().map(Arc::new),
                None => self.settings.output_schema().cloned(),
            },
            output_retried: record.output_retried,
            webhook: record.webhook,
            memory: record.memory_notes,
            usage: record.usage,
        };
        if let Phase::AwaitingTools { calls } | Phase::AwaitingApproval { calls, .. } =
            &record.phase
        {
            turn.parse_arguments(calls);
        }
        let resume = match record.phase {
            Phase::AwaitingModel => {
                // The call the crash cut is asked again, not counted twice.
                turn.model_calls = turn.model_calls.saturating_sub(1);
                self.turn = Some(Box::new(turn));
                Resume::CallModel(self.request())
            }
            Phase::AwaitingTools { calls } => {
                self.turn = Some(Box::new(turn));
                Resume::Tools(calls)
            }
            Phase::AwaitingApproval {
                calls,
                confirmations,
            } => {
                self.turn = Some(Box::new(turn));
                Resume::Approval {
                    calls,
                    confirmations,
                }
            }
            other => {
                return Err(MachineError::OutOfPhase {
                    step: "resume",
                    phase: other,
                });
            }
        };
        Ok(resume)
    }

    /// After a turn: the summary request to make, if the messages not yet
    /// covered by the summary outgrew the window.
    pub fn summary_request(&mut self) -> Option<ChatRequest> {
        if self.turn.is_some() {
            return None;
        }
        let window = self.settings.history_window as usize;
        self.summary_keeping(window, SUMMARY_AFTER_WINDOWS * window)
    }

    /// During a turn whose request the endpoint refused as too large: the
    /// summary request that folds every message before the turn into the
    /// summary (none kept verbatim), so the turn can be asked again with
    /// the summary and its own messages only. `None`: nothing to fold.
    pub fn compact_request(&mut self) -> Option<ChatRequest> {
        self.summary_keeping(0, 0)
    }

    /// The running turn's model request, built again (after a compaction).
    pub fn turn_request(&mut self) -> Result<ChatRequest, MachineError> {
        if !matches!(
            self.turn.as_ref().map(|t| &t.phase),
            Some(Phase::AwaitingModel)
        ) {
            return Err(self.out_of_phase("turn_request"));
        }
        Ok(self.request())
    }

    /// A summary of all but the last `keep` messages before the turn, once
    /// more than `after` of them are not covered.
    fn summary_keeping(&mut self, keep: usize, after: usize) -> Option<ChatRequest> {
        if self.summarising_until.is_some() || self.history.len() <= after {
            return None;
        }
        let mut cut = self.history.len() - keep;
        while cut < self.history.len() && self.history[cut].1.role == Role::Tool {
            cut += 1;
        }
        let older = &self.history[..cut];
        let covers_until = older.last()?.0;
        let mut rendered = String::new();
        for (_, m) in older {
            rendered.push_str(&render_for_summary(m));
            rendered.push('\n');
        }
        let current = self
            .summary
            .as_ref()
            .map_or("(none yet)", |s| s.text.as_str());
        self.summarising_until = Some(covers_until);
        Some(ChatRequest {
            model: self.settings.model.clone(),
            messages: vec![
                ChatMessage::system(SUMMARY_INSTRUCTIONS),
                ChatMessage::user(format!(
                    "Current summary:\n{current}\n\nNew messages to fold in:\n{rendered}"
                )),
            ],
            tools: Vec::new().into(),
            tool_choice: ToolChoice::None,
            temperature: Some(0.2),
            max_tokens: Some(400),
            purpose: Purpose::Summary,
            response_format: None,
        })
    }

    /// The summary came back: the summarised messages leave memory.
    pub fn on_summary(&mut self, text: Option<String>) -> Option<RollingSummary> {
        let until = self.summarising_until.take()?;
        let text = text.filter(|t| !t.trim().is_empty())?;
        self.history.retain(|(seq, _)| *seq > until);
        let summary = RollingSummary {
            text: text.trim().to_string(),
            covers_until_seq: until,
        };
        self.summary = Some(summary.clone());
        Some(summary)
    }

    fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    fn finish(&mut self, answer: String) -> (TurnOutcome, TurnRecord) {
        let turn = *self.turn.take().expect("a turn: callers check the phase");
        let record = snapshot(&turn, Phase::Completed, Timestamp::now());
        let summary =
            ToolUsageSummary::from_calls(turn.calls.iter().map(|c| (c.name.as_str(), c.status())));
        let mut citations: Vec<String> = Vec::new();
        for s in turn.calls.iter().filter_map(|c| c.source_id.clone()) {
            if !citations.contains(&s) {
                citations.push(s);
            }
        }
        let ungrounded = cited_source_ids(&answer)
            .into_iter()
            .filter(|s| !self.known_sources.contains(s))
            .collect();
        let outcome = TurnOutcome {
            turn_id: turn.id.clone(),
            status: TurnStatus::Completed,
            confirmations: Vec::new(),
            answer,
            tool_usage_summary: summary,
            citations,
            ungrounded_citations: ungrounded,
            iterations: turn.model_calls,
            fallback_used: turn.fallback,
            finish_reason: None,
            output: None,
            tool_calls: turn.calls,
        };
        self.history.extend(turn.messages);
        (outcome, record)
    }

    fn request(&mut self) -> ChatRequest {
        let s = &self.settings;
        let turn = self.turn.as_mut().expect("a turn: callers check the phase");
        turn.model_calls += 1;
        let layers = PromptLayers {
            tools_offered: !s.tools.is_empty(),
            ..s.layers.clone()
        };
        let window = context::window_of(
            &self.history,
            SUMMARY_AFTER_WINDOWS * s.history_window as usize,
            |(_, m)| m,
        );
        let mut messages = Vec::with_capacity(4 + window.len() + turn.messages.len());
        messages.push(ChatMessage::system(context::system_prompt(&layers)));
        if let Some(summary) = &self.summary {
            messages.push(context::summary_message(&summary.text));
        }
        if let Some(notes) = &turn.memory {
            messages.push(context::memory_message(notes));
        }
        messages.extend(window);
        messages.extend(turn.messages.iter().map(|(_, m)| m.clone()));
        if turn.fallback {
            messages.push(ChatMessage::system(FALLBACK_INSTRUCTION));
        }
        ChatRequest {
            model: s.model.clone(),
            messages,
            tools: s.tools.clone(),
            tool_choice: if turn.fallback {
                ToolChoice::None
            } else {
                ToolChoice::Auto
            },
            temperature: s.temperature,
            max_tokens: s.max_tokens,
            purpose: Purpose::Turn,
            response_format: turn.output.as_ref().map(|o| o.format.clone()),
        }
    }
}

/// A call and its outcome as the turn's reply shows it (a source id only
/// from a call that succeeded).
fn report(call: &ToolCall, arguments: ParsedArguments, result: &ToolExecutionResult) -> CallReport {
    CallReport {
        // Too-deep arguments are kept as their text (the call failed).
        arguments: arguments.value,
        id: call.id.clone(),
        name: call.name.clone(),
        is_success: result.is_success,
        output: result.output.clone(),
        error: result.error.clone(),
        error_type: result.error_type,
        source_id: result
            .is_success
            .then(|| result.metadata.source_id.clone())
            .flatten(),
        record_id: result.metadata.record_id.clone(),
        arguments_recorded: result.metadata.record_id.is_some() && result.metadata.params_recorded,
    }
}

fn snapshot(turn: &Turn, phase: Phase, now: Timestamp) -> TurnRecord {
    TurnRecord {
        turn_id: turn.id.clone(),
        phase,
        first_seq: turn.first_seq,
        rounds: turn.rounds,
        model_calls: turn.model_calls,
        fallback: turn.fallback,
        tool_calls: turn.calls.clone(),
        outcome: None,
        error: None,
        idempotency_key: turn.key.clone(),
        rolled_back: false,
        resumes: turn.resumes,
        response_format: turn
            .output
            .as_ref()
            .filter(|o| o.from_message)
            .map(|o| (*o.format).clone()),
        output_retried: turn.output_retried,
        webhook: turn.webhook.clone(),
        memory_notes: turn.memory.clone(),
        usage: turn.usage,
        started_at: turn.started_at,
        updated_at: now,
    }
}

fn render_for_summary(m: &ChatMessage) -> String {
    let text: String = m
        .content
        .clone()
        .unwrap_or_default()
        .chars()
        .take(600)
        .collect();
    match m.role {
        Role::User => format!("user: {text}"),
        Role::Assistant if !m.tool_calls.is_empty() => {
            // Arguments are the model's text: cut like message text, so
            // the summary request stays small whatever the history holds.
            let calls: Vec<String> = m
                .tool_calls
                .iter()
                .map(|c| {
                    let args: String = c.arguments.chars().take(600).collect();
                    format!("{}({args})", c.name)
                })
                .collect();
            format!("assistant called: {}", calls.join(", "))
        }
        Role::Assistant => match &m.name {
            Some(who) => format!("{who}: {text}"),
            None => format!("assistant: {text}"),
        },
        Role::Tool => format!(
            "tool {} returned: {text}",
            m.name.as_deref().unwrap_or("tool")
        ),
        Role::System => format!("system: {text}"),
    }
}

/// Source ids mentioned in a text: `tool:<domain>:v<digits>`, in order, once
/// each. A `tool:` inside a longer id (`mcp:peer:tool:positions:v1`, an
/// upstream's id namespaced by its source) is not a builtin's id and is not
/// read as one.
pub fn cited_source_ids(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("tool:") {
        let inside_an_id = rest[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c == ':' || c == '_' || c.is_ascii_alphanumeric());
        if inside_an_id {
            rest = &rest[i + 5..];
            continue;
        }
        let tail = &rest[i + 5..];
        let domain_len = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
            .unwrap_or(tail.len());
        let after = &tail[domain_len..];
        if domain_len > 0 && after.starts_with(":v") {
            let digits = after[2..]
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after.len() - 2);
            if digits > 0 {
                let id = format!("tool:{}:v{}", &tail[..domain_len], &after[2..2 + digits]);
                if !out.contains(&id) {
                    out.push(id);
                }
            }
        }
        rest = &rest[i + 5..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ToolSpec;
    use crate::tenants::TenantConfig;
    use serde_json::json;
    use std::time::Duration;

    fn tenant_settings() -> TurnSettings {
        TurnSettings {
            layers: PromptLayers {
                base_prompt: "agent prompt".into(),
                ..PromptLayers::default()
            },
            model: "agent-model".into(),
            tools: vec![
                ToolSpec {
                    name: "fetch_page".into(),
                    description: String::new(),
                    parameters: json!({}),
                },
                ToolSpec {
                    name: "echo".into(),
                    description: String::new(),
                    parameters: json!({}),
                },
            ]
            .into(),
            max_iterations: 3,
            history_window: 20,
            temperature: None,
            max_tokens: None,
            tool_variables: json!({"site": {"base_url": "https://x", "allowed_paths": ["/"]}}),
            cache_ttl: None,
            max_tool_calls: DEFAULT_MAX_TOOL_CALLS as u32,
            pause_for_approval: true,
            rules: None,
        }
    }

    #[test]
    fn tenant_overrides_reach_the_turn_settings() {
        let c = TenantConfig::from_json(json!({
            "custom_system_prompt": "You are Acme's assistant.",
            "preferred_model": "llama-3.3-70b",
            "temperature": 0.3,
            "max_response_tokens": 200,
            "tool_config": {"fetch_page_enabled": false, "max_iterations": 1, "allowed_paths": ["/docs"], "cache_enabled": false}
        }))
        .unwrap();
        let mut s = tenant_settings();
        s.apply_tenant(&c);
        assert_eq!(&*s.layers.base_prompt, "You are Acme's assistant.");
        assert_eq!(s.model, "llama-3.3-70b");
        assert_eq!(
            (s.temperature, s.max_tokens, s.max_iterations),
            (Some(0.3), Some(200), 1)
        );
        assert_eq!(s.tools.len(), 1);
        assert_eq!(s.tool_variables["site"]["allowed_paths"], json!(["/docs"]));
        assert_eq!(s.cache_ttl, Some(0));
        let mut s = tenant_settings();
        s.apply_tenant(&TenantConfig::default());
        assert_eq!(s.model, "agent-model");
        assert_eq!(s.tools.len(), 2);
    }

    fn settings(max_iterations: u32, window: usize) -> TurnSettings {
        TurnSettings {
            layers: PromptLayers {
                base_prompt: "sys".into(),
                ..PromptLayers::default()
            },
            model: "m".into(),
            tools: vec![ToolSpec {
                name: "echo".into(),
                description: "d".into(),
                parameters: json!({"type": "object"}),
            }]
            .into(),
            max_iterations,
            history_window: window as u32,
            temperature: None,
            max_tokens: None,
            tool_variables: Value::Null,
            cache_ttl: None,
            max_tool_calls: DEFAULT_MAX_TOOL_CALLS as u32,
            pause_for_approval: true,
            rules: None,
        }
    }

    fn machine(max_iterations: u32, window: usize) -> ConversationMachine {
        ConversationMachine::new(settings(max_iterations, window), vec![], None, 0)
    }

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "echo".into(),
            arguments: r#"{"message":"x"}"#.into(),
        }
    }

    fn tools_reply(ids: &[&str]) -> ChatResponse {
        ChatResponse {
            content: None,
            tool_calls: ids.iter().map(|i| call(i)).collect(),
            usage: None,
            finish_reason: None,
        }
    }

    fn text(t: &str) -> ChatResponse {
        ChatResponse {
            content: Some(t.into()),
            tool_calls: vec![],
            usage: None,
            finish_reason: None,
        }
    }

    fn ok(id: &str) -> (ToolCall, ToolExecutionResult) {
        (
            call(id),
            ToolExecutionResult::success("echo", json!({"message": "x"}), Duration::ZERO, 1),
        )
    }

    fn request_of(step: &Step) -> &ChatRequest {
        match &step.action {
            Action::CallModel(r) => r,
            other => panic!("expected a model call, got {other:?}"),
        }
    }

    #[test]
    fn the_phase_is_data_and_a_step_out_of_phase_is_an_error_not_a_panic() {
        let mut m = machine(3, 20);
        assert_eq!(m.phase(), Phase::Idle);
        // Nothing to answer yet.
        assert!(matches!(
            m.on_model_reply(text("stray")),
            Err(MachineError::OutOfPhase {
                step: "on_model_reply",
                phase: Phase::Idle
            })
        ));
        assert!(m.on_tool_results(vec![ok("a")]).is_err());
        assert!(m.turn_request().is_err());

        m.start_turn("hi".into(), "t".into(), None).unwrap();
        assert_eq!(m.phase(), Phase::AwaitingModel);
        assert!(
            m.start_turn("again".into(), "t".into(), None).is_err(),
            "one turn at a time"
        );
        m.on_model_reply(tools_reply(&["a", "b"])).unwrap();
        let phase = m.phase();
        assert_eq!(
            phase,
            Phase::AwaitingTools {
                calls: vec![call("a"), call("b")]
            }
        );
        // It serialises, as it will be stored with the step that reached it.
        let json = serde_json::to_value(&phase).unwrap();
        assert_eq!(json["phase"], "awaiting_tools");
        assert_eq!(json["calls"][1]["id"], "b");
        assert_eq!(serde_json::from_value::<Phase>(json).unwrap(), phase);

        // Results for other calls (or in another order) change nothing.
        assert!(matches!(
            m.on_tool_results(vec![ok("b"), ok("a")]),
            Err(MachineError::UnexpectedResults { .. })
        ));
        assert!(m.on_model_reply(text("early")).is_err());
        assert_eq!(m.phase(), phase);
        m.on_tool_results(vec![ok("a"), ok("b")]).unwrap();
        assert_eq!(m.phase(), Phase::AwaitingModel);
        m.on_model_reply(text("done")).unwrap();
        assert_eq!(m.phase(), Phase::Idle);
    }

    fn held(id: &str) -> (ToolCall, ToolExecutionResult) {
        let mut r =
            ToolExecutionResult::failure("echo", ErrorType::PendingConfirmation, "needs a yes");
        r.output = Some(json!({"confirmation_id": format!("conf_{id}"), "summary": "echo x"}));
        r.metadata.confirmation_id = Some(format!("conf_{id}"));
        (call(id), r)
    }

    #[test]
    fn a_held_call_pauses_the_turn_until_the_whole_batch_has_outcomes() {
        let mut m = machine(3, 20);
        m.start_turn("go".into(), "t1".into(), Some("key".into()))
            .unwrap();
        m.on_model_reply(tools_reply(&["a", "b"])).unwrap();
        let step = m.on_tool_results(vec![ok("a"), held("b")]).unwrap();
        let Action::Pause(outcome) = &step.action else {
            panic!("paused: {:?}", step.action)
        };
        assert!(
            step.persist.is_empty(),
            "no tool message before the batch is whole"
        );
        assert_eq!(outcome.status, TurnStatus::AwaitingApproval);
        assert_eq!(outcome.confirmations[0].confirmation_id, "conf_b");
        assert_eq!(outcome.tool_calls.len(), 2, "the batch is shown, b as held");
        assert_eq!(
            outcome.tool_calls[1].error_type,
            Some(ErrorType::PendingConfirmation)
        );
        let record = step.record.expect("a record");
        assert_eq!(record.idempotency_key.as_deref(), Some("key"));
        assert!(matches!(record.phase, Phase::AwaitingApproval { .. }));
        // b decided: the batch goes on, both results in the calls' order.
        let step = m.on_tool_results(vec![ok("a"), ok("b")]).unwrap();
        let request = request_of(&step);
        let ids: Vec<_> = request
            .messages
            .iter()
            .filter_map(|m| m.tool_call_id.clone())
            .collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(m.turn_calls().len(), 2);

        // Off (a workflow's agent node): the model gets the error instead.
        let mut settings = settings(3, 20);
        settings.pause_for_approval = false;
        let mut m = ConversationMachine::new(settings, vec![], None, 0);
        m.start_turn("go".into(), "t1".into(), None).unwrap();
        m.on_model_reply(tools_reply(&["b"])).unwrap();
        let step = m.on_tool_results(vec![held("b")]).unwrap();
        assert!(matches!(step.action, Action::CallModel(_)));
    }

    #[test]
    fn a_turn_resumes_from_its_record_on_a_fresh_machine() {
        let mut m = machine(3, 20);
        m.record(ChatMessage::user("earlier"));
        let mut stored: Vec<(u64, ChatMessage)> = vec![(1, ChatMessage::user("earlier"))];
        let step = m.start_turn("go".into(), "t1".into(), None).unwrap();
        stored.extend(step.persist);
        let step = m.on_model_reply(tools_reply(&["a", "b"])).unwrap();
        stored.extend(step.persist);
        let record = step.record.expect("a record");
        assert_eq!(record.first_seq, 2);
        assert_eq!(record.model_calls, 1);
        // The record went through the store as JSON.
        let record: TurnRecord =
            serde_json::from_value(serde_json::to_value(&record).unwrap()).unwrap();

        let last = stored.last().unwrap().0;
        let mut fresh = ConversationMachine::new(settings(3, 20), stored, None, last);
        let Resume::Tools(calls) = fresh.resume(record.clone()).unwrap() else {
            panic!("the batch is looked up")
        };
        assert_eq!(calls.len(), 2);
        assert!(fresh.resume(record).is_err(), "one turn at a time");
        let step = fresh.on_tool_results(vec![ok("a"), ok("b")]).unwrap();
        let request = request_of(&step);
        let roles: Vec<_> = request.messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                Role::System,
                Role::User,
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Tool
            ]
        );
        assert_eq!(
            step.persist[0].0, 4,
            "numbering goes on after the stored messages"
        );
        let step = fresh.on_model_reply(text("done")).unwrap();
        let record = step.record.expect("a record");
        assert_eq!(record.phase, Phase::Completed);
        assert_eq!(record.model_calls, 2);
        assert_eq!(record.outcome.expect("an outcome").answer, "done");

        // A final record is not taken up.
        let mut m = machine(3, 20);
        let mut done = record_of(&mut m);
        done.phase = Phase::Completed;
        assert!(m.resume(done).is_err());
    }

    fn record_of(m: &mut ConversationMachine) -> TurnRecord {
        m.start_turn("x".into(), "tx".into(), None)
            .unwrap()
            .record
            .unwrap()
    }

    #[test]
    fn interrupt_gives_open_calls_an_outcome_and_rollback_leaves_the_turn_out() {
        let mut m = machine(3, 20);
        m.start_turn("one".into(), "t1".into(), None).unwrap();
        m.on_model_reply(tools_reply(&["a"])).unwrap();
        let closed = m
            .interrupt_turn(false, Some("note"))
            .expect("a turn was cut");
        assert_eq!(closed.record.phase, Phase::Interrupted);
        assert_eq!(closed.persist.len(), 2, "a's outcome and the note");
        assert_eq!(closed.persist[0].1.tool_call_id.as_deref(), Some("a"));
        assert!(closed.rolled_back.is_empty());
        assert!(!m.in_turn());
        let step = m.start_turn("two".into(), "t2".into(), None).unwrap();
        let users: Vec<_> = request_of(&step)
            .messages
            .iter()
            .filter(|m| m.role == Role::User)
            .filter_map(|m| m.content.clone())
            .collect();
        assert_eq!(users, ["one", "two"], "interrupt keeps the cut turn");

        let mut m = machine(3, 20);
        m.start_turn("one".into(), "t1".into(), None).unwrap();
        let closed = m.interrupt_turn(true, None).expect("a turn was cut");
        assert!(closed.record.rolled_back);
        assert_eq!(closed.rolled_back, [1]);
        let step = m.start_turn("two".into(), "t2".into(), None).unwrap();
        let users: Vec<_> = request_of(&step)
            .messages
            .iter()
            .filter(|m| m.role == Role::User)
            .collect();
        assert_eq!(users.len(), 1, "rollback leaves it out");
        assert!(m.interrupt_turn(false, None).is_some());
        assert!(
            m.interrupt_turn(false, None).is_none(),
            "nothing left to cut"
        );
    }

    #[test]
    fn tool_results_follow_the_assistant_message_with_their_ids() {
        let mut m = machine(3, 20);
        let step = m.start_turn("hi".into(), "t".into(), None).unwrap();
        assert_eq!(step.persist[0].0, 1);
        let step = m.on_model_reply(tools_reply(&["a", "b"])).unwrap();
        assert_eq!(step.persist[0].0, 2);
        assert!(matches!(step.action, Action::RunTools(ref c) if c.len() == 2));
        let step = m.on_tool_results(vec![ok("a"), ok("b")]).unwrap();
        assert_eq!(step.persist.iter().map(|p| p.0).collect::<Vec<_>>(), [3, 4]);
        let req = request_of(&step);
        let roles: Vec<_> = req.messages.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                Role::System,
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Tool
            ]
        );
        assert_eq!(req.messages[3].tool_call_id.as_deref(), Some("a"));
        assert_eq!(req.messages[4].tool_call_id.as_deref(), Some("b"));
        assert_eq!(req.tool_choice, ToolChoice::Auto);
        assert!(
            req.messages[0]
                .content
                .as_ref()
                .unwrap()
                .contains(context::TOOL_USE_INSTRUCTIONS)
        );
    }

    #[test]
    fn after_max_iterations_the_last_call_forbids_tools_and_ignores_new_calls() {
        let mut m = machine(2, 20);
        m.start_turn("hi".into(), "t".into(), None).unwrap();
        m.on_model_reply(tools_reply(&["a"])).unwrap();
        let step = m.on_tool_results(vec![ok("a")]).unwrap();
        assert_eq!(request_of(&step).tool_choice, ToolChoice::Auto);
        m.on_model_reply(tools_reply(&["b"])).unwrap();
        let step = m.on_tool_results(vec![ok("b")]).unwrap();
        let req = request_of(&step);
        assert_eq!(req.tool_choice, ToolChoice::None);
        assert_eq!(
            req.messages.last().unwrap().content.as_deref(),
            Some(FALLBACK_INSTRUCTION)
        );
        let step = m
            .on_model_reply(ChatResponse {
                content: Some("done".into()),
                tool_calls: vec![call("c")],
                usage: None,
                finish_reason: None,
            })
            .unwrap();
        let Action::Finish(outcome) = step.action else {
            panic!("expected the turn to finish");
        };
        assert_eq!(outcome.answer, "done");
        assert!(outcome.fallback_used);
        assert_eq!(outcome.iterations, 3);
        assert_eq!(outcome.tool_calls.len(), 2);
        assert_eq!(outcome.tool_usage_summary.total_calls, 2);
    }

    #[test]
    fn the_window_keeps_recent_history_without_orphan_tool_results() {
        // A window of 1: up to two uncovered messages are sent verbatim.
        let mut m = machine(3, 1);
        m.start_turn("one".into(), "t".into(), None).unwrap();
        m.on_model_reply(tools_reply(&["a"])).unwrap();
        m.on_tool_results(vec![ok("a")]).unwrap();
        m.on_model_reply(text("answer")).unwrap();
        let step = m.start_turn("two".into(), "t".into(), None).unwrap();
        let req = request_of(&step);
        let contents: Vec<_> = req
            .messages
            .iter()
            .map(|m| (m.role, m.content.clone().unwrap_or_default()))
            .collect();
        assert_eq!(contents[1], (Role::Assistant, "answer".to_string()));
        assert_eq!(contents[2], (Role::User, "two".to_string()));
        assert_eq!(contents.len(), 3);
    }

    #[test]
    fn older_messages_are_summarised_then_sent_as_summary_plus_window() {
        let mut m = machine(3, 4);
        for i in 0..4 {
            m.start_turn(format!("q{i}"), "t".into(), None).unwrap();
            m.on_model_reply(text(&format!("a{i}"))).unwrap();
            assert!(
                m.summary_request().is_none(),
                "up to 8 uncovered messages wait for the next summary"
            );
        }
        let step = m.start_turn("q4".into(), "t".into(), None).unwrap();
        let sent: Vec<_> = request_of(&step).messages[1..]
            .iter()
            .map(|m| m.content.clone().unwrap())
            .collect();
        assert_eq!(
            sent,
            ["q0", "a0", "q1", "a1", "q2", "a2", "q3", "a3", "q4"],
            "everything the summary does not cover is sent"
        );
        m.on_model_reply(text("a4")).unwrap();
        let req = m
            .summary_request()
            .expect("10 messages outgrow two windows of 4");
        assert_eq!(req.purpose, Purpose::Summary);
        assert!(req.tools.is_empty());
        let asked = req.messages[1].content.clone().unwrap();
        assert!(asked.contains("user: q0") && asked.contains("assistant: a2"));
        assert!(!asked.contains("q3"), "the last window stays verbatim");
        assert!(m.summary_request().is_none(), "one request at a time");
        let s = m.on_summary(Some("They said q0 to a2.".into())).unwrap();
        assert_eq!(s.covers_until_seq, 6);

        let step = m.start_turn("q5".into(), "t".into(), None).unwrap();
        let req = request_of(&step);
        assert!(
            req.messages[1]
                .content
                .as_ref()
                .unwrap()
                .contains("They said q0")
        );
        let rest: Vec<_> = req.messages[2..]
            .iter()
            .map(|m| m.content.clone().unwrap())
            .collect();
        assert_eq!(rest, ["q3", "a3", "q4", "a4", "q5"]);
    }

    #[test]
    fn a_failed_summary_keeps_the_messages_for_the_next_try() {
        let mut m = machine(3, 2);
        for i in 0..3 {
            m.start_turn(format!("q{i}"), "t".into(), None).unwrap();
            m.on_model_reply(text(&format!("a{i}"))).unwrap();
        }
        assert!(m.summary_request().is_some());
        assert_eq!(m.on_summary(None), None);
        assert!(m.summary_request().is_some());
    }

    #[test]
    fn citations_list_tool_sources_and_flag_ungrounded_ones() {
        let mut m = machine(3, 20);
        m.start_turn("stock?".into(), "t".into(), None).unwrap();
        m.on_model_reply(tools_reply(&["a"])).unwrap();
        let result = ToolExecutionResult::success(
            "lookup_stock",
            json!({"source_id": "tool:stock:v1", "data": {}}),
            Duration::ZERO,
            1,
        );
        m.on_tool_results(vec![(call("a"), result)]).unwrap();
        let step = m
            .on_model_reply(text(
                "You hold 42 BOLT [tool:stock:v1] worth $8k [tool:prices:v1].",
            ))
            .unwrap();
        let Action::Finish(outcome) = step.action else {
            panic!("expected the turn to finish");
        };
        assert_eq!(outcome.citations, ["tool:stock:v1"]);
        assert_eq!(outcome.ungrounded_citations, ["tool:prices:v1"]);
        assert_eq!(
            outcome.tool_calls[0].source_id.as_deref(),
            Some("tool:stock:v1")
        );
    }

    #[test]
    fn source_ids_are_found_in_text() {
        assert_eq!(
            cited_source_ids("a tool:x:v1, b (tool:y_z:v12) tool:x:v1 tool:bad tool::v1 tool:q:v"),
            ["tool:x:v1", "tool:y_z:v12"]
        );
    }
}
