//! The Conversation actor: one per live session; performs the IO its
//! [`ConversationMachine`] asks for.
//!
//! UserTurn ─▶ machine.offer ─▶ machine.next_queued ─▶ machine.start_turn ─▶ [persist] ─▶ model ─▶ machine ─▶ ToolSubAgent
//!                                                                 ◀── ToolBatchReport ──┘
//!            ◀── reply (after one durable commit) ◀── Finish ◀── machine ◀──┘
//!                                              └─▶ summary (model, no tools) ─▶ store
//!
//! The machine decides; this actor only does IO. Which message runs next,
//! and whether one is refused (`Busy` under `multitask = "reject"`,
//! `QueueFull` past `max_queued_turns`) or cuts the running turn
//! (`interrupt`, `rollback`), is the machine's queue ([`super::queue`]);
//! the actor keeps only the channels each queued caller waits on, under
//! the entry's ticket. A queued turn whose caller is gone (the receiver
//! of its outcome is dropped, or its event sink closed: the HTTP client
//! disconnected) was never acknowledged: it is dropped before it starts
//! and when the queue is counted, and nothing of it is stored or sent to
//! the model. Messages recorded without a turn (an operator's reply) take
//! their place in the same queue. The actor never
//! blocks on IO: the model call, store writes and the tool batch run as
//! spawned futures or actors, so the mailbox stays free for reports.
//!
//! A turn is data ([`TurnRecord`]): each step the machine takes returns the
//! turn's record with the messages to persist, and both go to the store's
//! writer in one write ([`WriteOp::PutTurn`]), non-durably and without
//! waiting (so readers see a running turn, and the turn never waits on a
//! write); the answer is written durably, which makes every step before it
//! durable too (the writer applies one sender's writes in order), and only
//! then is the turn acknowledged: one awaited, durable commit per turn. A
//! paused turn's record is committed durably before the 202 goes out. A
//! crash mid-turn loses only what was never acknowledged, and the next
//! start takes the turn up from its last stored phase ([`CutTurn`],
//! [`super::resume`]): `awaiting_model` asks the model again;
//! `awaiting_tools` and `awaiting_approval` look up each call of the batch
//! (a finished record is used, never run again; an at-most-once intent
//! without a record is `TOOL_OUTCOME_UNKNOWN`; a call that never ran runs),
//! then the model answers. Past `[sessions] resume_window_s` the turn is
//! closed as `interrupted` instead ([`INTERRUPTED_NOTE`]).
//!
//! Approvals: a call held for a person's confirmation pauses the turn
//! (`awaiting_approval`): the caller gets the paused outcome (202), the
//! session stays held (queued messages wait, `reject` refuses), and the
//! conversation stays in memory until the turn goes on (its expiry timer
//! lives here; after a restart its record brings it back). A decision
//! ([`CheckApprovals`], sent by `Sessions::decide_confirmation` with the
//! approved call's outcome) or an expiry timer resolves the held calls;
//! once every call has an outcome the turn goes on, with nobody waiting
//! here ([`WatchTurn`] callers and the record learn the end).
//!
//! Interrupt: a message that cuts the running turn drops its model call,
//! ignores its batch's report (calls already running finish and are
//! recorded, their outcomes unused: cadre does not kill a call midway
//! through a side effect), declines its held confirmations, gives every
//! call without an outcome an `TOOL_OUTCOME_UNKNOWN` tool message (so the
//! history stays valid for the model), closes it as `interrupted` and
//! replies `TURN_INTERRUPTED`; with `rollback` its messages are marked
//! rolled back (kept, left out of every later prompt).
//!
//! A turn that fails (model down) flushes what it has and reports the
//! error; its messages stay in the history and its record says `failed`.
//! After a turn, the rolling summary is updated when
//! the history outgrew the window; a failed summary is tried again after
//! the next turn. A store error ends the actor once it has answered (its
//! memory may hold steps the store lost; queued messages get `Unavailable`),
//! and its writes, the ones behind the turn included, carry the store
//! generation it was loaded at, so after the store reopened from a failure
//! a step refused then also refuses the turn's final commit, and the
//! conversation reloads instead of writing on top of lost steps. A turn
//! given an event sink streams its progress
//! ([`TurnEvent`]): model deltas, tool calls started and completed, the
//! outcome (or `turn_paused`, `turn_interrupted`).
//!
//! Model time: a turn's model calls share one budget, `[model]
//! turn_timeout_s` (default 120 s), every attempt and backoff of the
//! client included; the call that finds it spent is cut and the turn fails
//! with `MODEL_TIMEOUT`, streamed or not. Tool time does not count. The
//! summary call after a turn gets the same budget of its own, so a hanging
//! endpoint cannot hold a session's queue longer than that either.
//!
//! Too large: when the endpoint refuses a turn's request for its size
//! ([`ModelError::is_request_too_large`]: 413, or a 400 about the context
//! length), the history before the turn is folded into the rolling summary
//! at once (none of it kept verbatim) and the request is sent once more;
//! if there is nothing to fold, the summary fails, or the endpoint refuses
//! again, the turn fails with `MODEL_REJECTED`, its messages join the
//! history, and the next turn folds them. So a session never stays stuck
//! on a history the model does not take. A summary is kept to
//! [`MAX_SUMMARY_BYTES`], since every later request carries it.
//!
//! Token usage: each model reply's usage (a call that failed reported
//! none) is counted into the next write the turn makes anyway, beside its
//! messages: a tool round's with its step, the last call's with the turn's
//! durable commit, a summary call's with the summary. No model call pays a
//! commit of its own, and a turn's usage is durable when its reply is sent.
//!
//! Memory of an idle conversation (issue #18: a resident idle conversation
//! ≤ 4 KB). Most resident conversations are idle, so what a turn needs only
//! while it runs is kept out of the idle footprint. Measured with a
//! counting allocator in `cargo bench --bench load` (100,000 sessions after
//! one turn each; resident minus evicted): 5.0 KB of heap per idle
//! conversation before, 3.2 KB after. Decisions:
//! - the actor lives inline in its arbiter task (one allocation, 2.4 KB
//!   before), so rarely used, large fields are boxed: a cut turn's record
//!   ([`Conversation::with_cut_turn`], a few hundred bytes) here, the
//!   running turn in the machine; the task is 1.8 KB now;
//! - when the session goes quiet (nothing runs or waits), the buffers a turn
//!   grew are given back (`Conversation::shed`): the callers' map, the
//!   batch, the unsaved steps, the history's slack and the queue's buffer
//!   (four queued entries, 1 KB, kept after the first turn). The price is
//!   one small allocation per turn to grow them again;
//! - what stays: the task (the actor, its context, mailbox and idle timer),
//!   the history window (its messages are the conversation's data) and the
//!   session row. Not done yet: the system prompt and the model name are
//!   still copied into each conversation's settings (a shared `Arc<str>`
//!   per agent would save their length per session), and the idle timer is
//!   one `run_interval` per actor (a boxed interval and a timer entry; one
//!   sweeper in [`super::sessions`] could replace it).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use actix::prelude::*;
use jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use super::batch::{ToolBatchReport, ToolSubAgent};
use super::budget::Reservation;
use super::machine::{
    Action, Approval, CallReport, Closed, ConversationMachine, Phase, Resume, Step, TurnFailure,
    TurnOutcome, TurnRecord, TurnSettings,
};
use super::queue::{Activity, Admission, Queued, Refusal};
use super::resume::{self, Resolution};
use crate::agents::Agent;
use crate::error_code::{ErrorCode, PublicError};
use crate::executor::ExecutorHandle;
use crate::executor::guarded::GuardrailChecks;
use crate::guardrails::{Guardrails, Stage, Subject, Tripped};
use crate::metrics::{Metrics, TurnEnd};
use crate::model::{ChatMessage, ModelError};
use crate::store::turns::TurnWrite;
use crate::store::usage::day_of;
use crate::store::{
    Session, SessionWriter, Store, StoreError, StoredMessage, StoredSummary, TokenUsage,
    UsageDelta, WriteOp,
};
use crate::tools::{CallerType, ExecutionContext, ToolExecutionResult};

/// Why a turn did not produce an answer.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("the turn could not be stored: {0}")]
    Store(#[from] StoreError),
    /// A turn is running and the agent refuses concurrent messages.
    #[error("a turn is already running in this session")]
    Busy,
    /// The conversation actor could not be reached (it stopped).
    #[error("the conversation is unavailable")]
    Unavailable,
    /// `max` turns already wait behind the running one.
    #[error("{max} turns are already waiting in this session")]
    QueueFull { max: usize },
    /// The machine was asked for a step its phase does not allow (a bug,
    /// reported instead of a panic; the conversation goes on).
    #[error("the turn went out of step: {0}")]
    OutOfStep(#[from] super::machine::MachineError),
    /// A newer message cut the turn (`multitask = "interrupt"` or
    /// `"rollback"`).
    #[error("the turn was interrupted by a newer message")]
    Interrupted,
    /// The turn ended without an answer by its own rules: the answer
    /// missed its schema twice, or a guardrail refused.
    #[error("{}", .0.message)]
    Rejected(Box<super::machine::Rejection>),
}

impl PublicError for TurnError {
    fn code(&self) -> ErrorCode {
        match self {
            TurnError::Model(m) => m.code(),
            TurnError::Store(s) => s.code(),
            TurnError::Busy => ErrorCode::ConversationBusy,
            TurnError::Unavailable => ErrorCode::ConversationUnavailable,
            TurnError::QueueFull { .. } => ErrorCode::ConversationQueueFull,
            TurnError::OutOfStep(_) => ErrorCode::InternalError,
            TurnError::Interrupted => ErrorCode::TurnInterrupted,
            TurnError::Rejected(r) => r.code,
        }
    }

    fn details(&self) -> Option<Value> {
        match self {
            TurnError::Rejected(r) => Some(r.details.clone()),
            _ => None,
        }
    }

    fn public_message(&self) -> String {
        match self {
            TurnError::Model(m) => m.public_message(),
            TurnError::Store(s) => s.public_message(),
            TurnError::Busy => {
                "a turn is already running in this session; send the message when it has finished"
                    .into()
            }
            TurnError::Unavailable => {
                "the conversation could not be reached; retry the request".into()
            }
            TurnError::QueueFull { max } => format!(
                "{max} messages already wait for their turn in this session, the most allowed; send this one when one of them has run"
            ),
            TurnError::OutOfStep(_) => {
                "the turn failed inside cadre; what it stored so far is kept".into()
            }
            TurnError::Interrupted => "a newer message in this session interrupted this turn (the agent's multitask is interrupt or rollback); what it stored so far is kept".into(),
            TurnError::Rejected(r) => r.message.clone(),
        }
    }
}

/// How a guardrail's block ends a turn: `GUARDRAIL_TRIPPED` (422) with
/// the guardrail's public message, naming it and its stage.
pub fn tripped_rejection(tripped: &Tripped) -> super::machine::Rejection {
    super::machine::Rejection {
        code: ErrorCode::GuardrailTripped,
        message: tripped.message.clone(),
        details: serde_json::json!({
            "guardrail": tripped.guardrail,
            "stage": tripped.stage.as_str(),
        }),
    }
}

/// Progress of a turn, for streaming callers. (Read back from a turn's
/// log by the doors that map it: `crate::http::turn_log::Frame::decode`.)
#[derive(Debug, Clone, Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TurnEvent {
    /// The turn was accepted.
    TurnStarted { session_id: String, turn_id: String },
    /// A piece of the answer's text as the model writes it.
    ModelDelta { text: String },
    /// The model asked for a tool call.
    ToolCallStarted {
        id: String,
        name: String,
        /// Parsed arguments, or the raw string when they were not JSON.
        #[schema(value_type = Value)]
        arguments: Value,
    },
    /// A tool call's report.
    ToolCallCompleted {
        #[serde(flatten)]
        call: CallReport,
    },
    /// The same body as the JSON reply.
    TurnCompleted(Box<TurnOutcome>),
    /// The turn waits for a person's decision on `confirmations` (the same
    /// body as the 202 reply); deciding resumes it.
    TurnPaused(Box<TurnOutcome>),
    /// A newer message cut the turn (`multitask` `interrupt` or
    /// `rollback`); the stream ends.
    TurnInterrupted { turn_id: String },
    /// The turn was queued behind turn `waiting_for`, paused for a
    /// person's decision: it starts once that turn ends (sent at once, so
    /// a stream shows it is waiting rather than nothing).
    TurnQueued {
        turn_id: String,
        waiting_for: String,
    },
    /// An event of a child turn this turn's `ask_<agent>` call runs
    /// ([`super::delegation`]): the child's session and agent, and the
    /// event as the child's own stream would send it.
    ChildEvent {
        session_id: String,
        agent: String,
        /// The child's own event (its `type` says which).
        #[schema(value_type = std::collections::BTreeMap<String, Value>)]
        event: Value,
    },
}

impl TurnEvent {
    pub fn name(&self) -> &'static str {
        match self {
            TurnEvent::TurnStarted { .. } => "turn_started",
            TurnEvent::ModelDelta { .. } => "model_delta",
            TurnEvent::ToolCallStarted { .. } => "tool_call_started",
            TurnEvent::ToolCallCompleted { .. } => "tool_call_completed",
            TurnEvent::TurnCompleted(_) => "turn_completed",
            TurnEvent::TurnPaused(_) => "turn_paused",
            TurnEvent::TurnInterrupted { .. } => "turn_interrupted",
            TurnEvent::TurnQueued { .. } => "turn_queued",
            TurnEvent::ChildEvent { .. } => "child_event",
        }
    }
}

pub type TurnSink = mpsc::UnboundedSender<TurnEvent>;

/// Runs its closure when dropped: the end of a model call, however it ends.
struct ObserveOnDrop<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> Drop for ObserveOnDrop<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// Run one turn with this user message. The reply comes at once: the turn
/// is queued (its outcome arrives on the receiver) or refused (`Busy`).
#[derive(Message)]
#[rtype(result = "Result<AcceptedTurn, TurnError>")]
pub struct UserTurn {
    pub content: String,
    /// Settings for this turn (agent + tenant overrides + session metadata).
    pub settings: Option<TurnSettings>,
    pub events: Option<TurnSink>,
    /// The request's `Idempotency-Key`: kept in the turn's record, so a
    /// retry finds the turn instead of starting another.
    pub idempotency_key: Option<String>,
    /// Tokens set aside for the turn under its tenant's budget, given back
    /// when it ends or pauses ([`super::budget`]).
    pub reservation: Option<Reservation>,
}

/// Look at a turn after a person decided one of its held calls (or
/// nothing in particular): a paused turn whose calls all have outcomes
/// goes on. Harmless when nothing waits.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CheckApprovals {
    /// The outcome of an approved call that just ran, by its tool call id.
    pub ran: Option<(String, ToolExecutionResult)>,
}

/// Cuts turn `turn_id` if it is the one running (its parent was cut,
/// [`super::delegation`]), as a newer message under `interrupt` would.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CutRunning {
    pub turn_id: String,
}

/// Another agent answers from now on ([`super::handoff`]): its prompt,
/// tools and model, for the rest of the running turn and the next ones.
#[derive(Message)]
#[rtype(result = "()")]
pub struct HandOff {
    pub agent: Arc<Agent>,
    pub settings: TurnSettings,
}

/// Waits for turn `turn_id` of this conversation to end (or pause).
#[derive(Message)]
#[rtype(result = "Option<AcceptedTurn>")]
pub struct WatchTurn {
    pub turn_id: String,
}

/// Store a message without a model turn (an operator's reply); answers its seq.
#[derive(Message)]
#[rtype(result = "Result<u64, TurnError>")]
pub struct RecordMessage {
    pub message: ChatMessage,
}

/// Stop for good, the session being deleted: refused with `Busy` while a
/// turn or a message runs or waits (or a summary is being made); else the
/// actor stops, and the answer comes once it is gone, with everything it
/// had spawned, so nothing it started writes after the answer.
#[derive(Message)]
#[rtype(result = "Result<(), TurnError>")]
pub struct Retire;

type TurnReply = oneshot::Sender<Result<TurnOutcome, TurnError>>;

pub use super::queue::DEFAULT_MAX_QUEUED_TURNS;

/// Model time a turn may use, unless configured (`[model] turn_timeout_s`).
pub const DEFAULT_MODEL_TURN_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a paused turn being interrupted waits for the outcome of a call
/// a person approved just before (it runs under its own timeout and
/// retries); past it the call is `TOOL_OUTCOME_UNKNOWN`, as before.
pub const INTERRUPT_WAIT: Duration = Duration::from_secs(60);

/// A turn the conversation took on; its outcome follows.
pub struct AcceptedTurn {
    turn_id: String,
    /// The paused turn it was queued behind, if it was.
    waiting_for: Option<String>,
    rx: oneshot::Receiver<Result<TurnOutcome, TurnError>>,
}

impl AcceptedTurn {
    /// The turn's id (known as soon as it is accepted).
    pub fn turn_id(&self) -> &str {
        &self.turn_id
    }

    /// The turn paused for an approval that this one was queued behind
    /// (it starts when that one ends), if it was.
    pub fn waiting_for(&self) -> Option<&str> {
        self.waiting_for.as_deref()
    }

    /// Waits for the turn to end (or pause for an approval).
    pub async fn outcome(self) -> Result<TurnOutcome, TurnError> {
        self.rx.await.unwrap_or(Err(TurnError::Unavailable))
    }
}

/// The channels the caller of a queued entry waits on (the entry itself,
/// data, is in the machine's queue under the same ticket).
enum Waiter {
    Turn {
        events: Option<TurnSink>,
        reply: TurnReply,
        reservation: Option<Reservation>,
    },
    Record {
        reply: oneshot::Sender<Result<u64, TurnError>>,
    },
}

impl Waiter {
    /// A turn nobody waits for any more: its outcome's receiver was
    /// dropped, or its event sink closed (the streaming client left).
    fn abandoned(&self) -> bool {
        match self {
            Waiter::Turn { reply, events, .. } => {
                reply.is_closed() || events.as_ref().is_some_and(|e| e.is_closed())
            }
            Waiter::Record { .. } => false,
        }
    }

    fn unavailable(self) {
        match self {
            Waiter::Turn { reply, .. } => {
                let _ = reply.send(Err(TurnError::Unavailable));
            }
            Waiter::Record { reply } => {
                let _ = reply.send(Err(TurnError::Unavailable));
            }
        }
    }
}

struct Current {
    started: Instant,
    /// `None` for a turn resumed after a restart or an approval: nobody
    /// waits on it here (its record and watchers learn the outcome).
    reply: Option<TurnReply>,
    events: Option<TurnSink>,
    /// The turn's span: model calls and the tool batch are its children.
    span: tracing::Span,
    /// Model time the turn used so far.
    model_spent: Duration,
    /// The history was folded into the summary after a too-large refusal.
    compacted: bool,
    /// Fired when the turn is cut: its `ask_` calls cut their children.
    cut: crate::tools::delegate::TurnCut,
    /// The turn's tokens set aside under its tenant's budget; given back
    /// with this (the turn ended or paused: its usage is stored).
    _reservation: Option<Reservation>,
}

impl Current {
    fn emit(&self, event: TurnEvent) {
        if let Some(tx) = &self.events {
            let _ = tx.send(event);
        }
    }
}

pub struct Conversation {
    session: Session,
    agent: Arc<Agent>,
    store: Store,
    executor: ExecutorHandle,
    machine: ConversationMachine,
    /// The turn being performed.
    current: Option<Current>,
    /// The callers of the machine's queued entries, by ticket.
    waiters: HashMap<u64, Waiter>,
    /// Id of the tool batch the current turn waits for; reports of other
    /// batches (from a turn that already failed) are ignored.
    batch_id: u64,
    /// The messages of the running step, not yet handed to the writer.
    unsaved: Vec<StoredMessage>,
    /// Tokens of the model calls not yet handed to the writer.
    unsaved_usage: TokenUsage,
    /// The tenants' write shares: what this conversation stores beyond
    /// the user's messages (paid at admission) is charged here.
    share: Option<Arc<super::storage::StorageGate>>,
    idle_timeout: Duration,
    last_active: Instant,
    metrics: Arc<Metrics>,
    /// The store generation the history was loaded at.
    generation: u64,
    /// What the store gave this actor to write the session through: every
    /// request is fenced by it (in a cluster, the epoch of this node's
    /// claim: [`WriteOp::Fence`]), and a write refused for it (another node
    /// took the session over) ends the actor like any store error.
    writer: SessionWriter,
    /// The model call in flight: cancelled when the turn is interrupted.
    model_call: Option<SpawnHandle>,
    /// Bumped when a turn is cut, so callbacks of the cut turn do nothing.
    turn_gen: u64,
    /// A paused turn being cut (`rollback`): its confirmations are being
    /// settled before it closes ([`Conversation::interrupt_paused`]).
    interrupting: Option<bool>,
    /// The batch being assembled: each call of the last reply, with its
    /// outcome once known (from the store on a resume, from the sub-agent,
    /// or from a person's decision).
    held: Vec<(crate::model::ToolCall, Option<ToolExecutionResult>)>,
    /// Callers waiting on turns by id ([`WatchTurn`]).
    watchers: Vec<(String, TurnReply)>,
    /// The turn whose last commit (final or paused) is in flight: the
    /// machine is done with it but the store does not have its end yet,
    /// so a watcher must wait here rather than read the store. A
    /// `Box<str>`: 8 bytes less than a `String` in every resident
    /// conversation (the session row's `forked_from` took them).
    closing: Option<Box<str>>,
    /// A turn cut by a restart, to take up once started. Boxed: a record
    /// is a few hundred bytes every resident conversation would carry.
    cut: Option<Box<(TurnRecord, CutTurn)>>,
    /// Model time one turn may use.
    model_turn_timeout: Duration,
    /// Dropped with the actor: how [`Retire`] learns it is gone.
    retired: Option<oneshot::Sender<()>>,
}

/// What to do with a turn found open when the conversation loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CutTurn {
    /// Take it up where it stood.
    Resume,
    /// Too old: close it as interrupted, with a note in the history.
    Close,
}

impl Actor for Conversation {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Idle conversations leave memory when the sessions' sweeper asks
        // ([`IdleCheck`]); no timer of their own.
        if let Some(cut) = self.cut.take() {
            let (record, what) = *cut;
            self.take_up(record, what, ctx);
        }
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.machine.drain_queue();
        for (_, waiter) in self.waiters.drain() {
            waiter.unavailable();
        }
        for (_, reply) in self.watchers.drain(..) {
            let _ = reply.send(Err(TurnError::Unavailable));
        }
    }
}

impl Conversation {
    pub fn new(
        session: Session,
        agent: Arc<Agent>,
        store: Store,
        executor: ExecutorHandle,
        machine: ConversationMachine,
        idle_timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        let machine = machine.with_queue_rules(agent.multitask, DEFAULT_MAX_QUEUED_TURNS);
        let writer = SessionWriter::sole(&session.id);
        Conversation {
            session,
            agent,
            store,
            executor,
            machine,
            current: None,
            waiters: HashMap::new(),
            batch_id: 0,
            unsaved: Vec::new(),
            unsaved_usage: TokenUsage::default(),
            share: None,
            idle_timeout,
            last_active: Instant::now(),
            metrics,
            generation: 0,
            writer,
            model_turn_timeout: DEFAULT_MODEL_TURN_TIMEOUT,
            retired: None,
            model_call: None,
            turn_gen: 0,
            interrupting: None,
            held: Vec::new(),
            watchers: Vec::new(),
            closing: None,
            cut: None,
        }
    }

    /// A turn the store holds open (not final): taken up, or closed, once
    /// the actor starts.
    pub fn with_cut_turn(mut self, record: TurnRecord, what: CutTurn) -> Self {
        self.cut = Some(Box::new((record, what)));
        self
    }

    /// What this conversation stores is charged to its tenant's write
    /// share ([`super::storage`]).
    pub fn storage_share(mut self, share: Arc<super::storage::StorageGate>) -> Self {
        self.share = Some(share);
        self
    }

    /// A turn's model calls together take at most `budget`.
    pub fn model_turn_timeout(mut self, budget: Duration) -> Self {
        self.model_turn_timeout = budget;
        self
    }

    /// The model time the running turn has left.
    fn model_budget(&self) -> Duration {
        let spent = self
            .current
            .as_ref()
            .map_or(Duration::ZERO, |c| c.model_spent);
        self.model_turn_timeout.saturating_sub(spent)
    }

    /// The store generation the history was read at (before reading it).
    pub fn loaded_at(mut self, generation: u64) -> Self {
        self.generation = generation;
        self
    }

    /// Writes the session through `writer`
    /// ([`crate::store::Ownership::session_writer`]);
    /// without it, as the sole writer of a single node.
    pub fn written_through(mut self, writer: SessionWriter) -> Self {
        self.writer = writer;
        self
    }

    /// At most `max` turns wait behind the running one.
    pub fn max_queued_turns(mut self, max: usize) -> Self {
        let multitask = self.agent.multitask;
        self.machine = self.machine.with_queue_rules(multitask, max);
        self
    }

    /// The session went quiet: gives back the buffers a turn grew (the
    /// callers' map, the batch, the unsaved steps, the history's slack), so
    /// an idle conversation holds its data and not its last turn's
    /// high-water marks.
    fn shed(&mut self) {
        self.waiters.shrink_to_fit();
        self.watchers.shrink_to_fit();
        self.held.shrink_to_fit();
        self.unsaved.shrink_to_fit();
        self.machine.shed();
    }

    /// Forgets the queued turns nobody waits for.
    fn drop_abandoned(&mut self) {
        let gone: HashSet<u64> = self
            .waiters
            .iter()
            .filter(|(_, w)| w.abandoned())
            .map(|(t, _)| *t)
            .collect();
        if gone.is_empty() {
            return;
        }
        let dropped = self.machine.forget_queued(|t| gone.contains(&t));
        for t in &gone {
            self.waiters.remove(t);
        }
        tracing::info!(session = %self.session.id, dropped, "queued turns dropped: their callers left");
    }

    /// Starts what the machine's queue says is next, if the session is free.
    fn start_next(&mut self, ctx: &mut Context<Self>) {
        self.drop_abandoned();
        let Some(entry) = self.machine.next_queued() else {
            if self.machine.is_quiet() {
                self.last_active = Instant::now();
                self.shed();
            }
            return;
        };
        let waiter = self.waiters.remove(&entry.ticket());
        match (entry, waiter) {
            (
                Queued::Turn {
                    content,
                    settings,
                    turn_id,
                    key,
                    ..
                },
                Some(Waiter::Turn {
                    events,
                    reply,
                    reservation,
                }),
            ) => {
                if let Some(s) = settings {
                    self.machine.set_settings(s);
                }
                let span = self.new_turn_span(false);
                let current = Current {
                    started: Instant::now(),
                    reply: Some(reply),
                    events,
                    span,
                    model_spent: Duration::ZERO,
                    compacted: false,
                    cut: Default::default(),
                    _reservation: reservation,
                };
                current.emit(TurnEvent::TurnStarted {
                    session_id: self.session.id.clone(),
                    turn_id: turn_id.clone(),
                });
                self.current = Some(current);
                match self.machine.start_turn(content, turn_id, key) {
                    Ok(step) => self.perform(step, ctx),
                    Err(e) => self.out_of_step(e, ctx),
                }
            }
            (Queued::Record { message, .. }, Some(Waiter::Record { reply })) => {
                let (seq, message) = self.machine.record(message);
                self.stage(vec![(seq, message)]);
                self.commit_turn(Vec::new(), ctx, move |act, result, ctx| {
                    let failed = result.is_err();
                    let _ = reply.send(result.map(|()| seq).map_err(TurnError::from));
                    if failed {
                        ctx.stop();
                        return;
                    }
                    act.machine.set_activity(Activity::Idle);
                    act.start_next(ctx);
                });
            }
            (entry, _) => {
                // Its waiter is gone (or of another kind: a bug): skipped.
                tracing::error!(session = %self.session.id, ticket = entry.ticket(), "a queued entry without its caller was skipped");
                self.machine.set_activity(Activity::Idle);
                self.start_next(ctx);
            }
        }
    }

    /// Keeps a step's messages for the next write.
    fn stage(&mut self, messages: Vec<(u64, ChatMessage)>) {
        let now = Timestamp::now();
        self.unsaved
            .extend(messages.into_iter().map(|(seq, message)| StoredMessage {
                seq,
                message,
                created_at: now,
                rolled_back: false,
            }));
    }

    /// The writes of everything staged, usage included (nothing when nothing is).
    fn take_unsaved(&mut self) -> Vec<WriteOp> {
        let mut ops = Vec::new();
        if let Some(share) = &self.share {
            // The user's messages were paid when they were sent.
            let bytes: usize = self
                .unsaved
                .iter()
                .filter(|m| m.message.role != crate::model::Role::User)
                .map(stored_len)
                .sum();
            share.charge(&self.session.tenant, bytes);
        }
        if !self.unsaved.is_empty() {
            ops.push(WriteOp::AppendMessages {
                session_id: self.session.id.clone(),
                messages: std::mem::take(&mut self.unsaved),
            });
        }
        let usage = std::mem::take(&mut self.unsaved_usage);
        ops.extend(self.usage_op(usage));
        ops
    }

    /// The write that adds `usage` to this session's and its tenant's
    /// counters; `/metrics`' per-agent token counters count it here too.
    fn usage_op(&self, usage: TokenUsage) -> Option<WriteOp> {
        (!usage.is_empty()).then(|| {
            self.metrics.tokens(
                &self.session.tenant,
                &self.agent.name,
                usage.prompt_tokens,
                usage.completion_tokens,
            );
            WriteOp::RecordUsage(UsageDelta {
                session_id: Some(self.session.id.clone()),
                tenant: self.session.tenant.clone(),
                agent: self.agent.name.clone(),
                day: day_of(Timestamp::now()),
                usage,
            })
        })
    }

    /// The writes of a turn's record: its row, and whether it is still
    /// open; with the webhook event of an end or a pause when the turn has
    /// a `webhook` (in the same write: [`crate::webhooks`]).
    fn record_ops(&self, record: &TurnRecord) -> Vec<WriteOp> {
        let mut ops = vec![WriteOp::PutTurn(Box::new(TurnWrite {
            session_id: self.session.id.clone(),
            turn_id: record.turn_id.clone(),
            open: !record.is_final(),
            idempotency_key: record.idempotency_key.clone(),
            record: super::turn_rows::row(record),
        }))];
        ops.extend(self.webhook_op(record));
        ops
    }

    /// The webhook event of a turn that ended or paused, if it has a
    /// `webhook`.
    fn webhook_op(&self, record: &TurnRecord) -> Option<WriteOp> {
        let url = record.webhook.clone()?;
        let status = record.phase.as_str();
        let mut data = serde_json::json!({
            "session_id": self.session.id,
            "turn_id": record.turn_id,
            "agent": self.agent.name,
            "status": status,
            "usage": record.usage,
        });
        match &record.phase {
            Phase::Completed => {
                if let Some(o) = &record.outcome {
                    data["answer"] = o.answer.clone().into();
                    if let Some(output) = &o.output {
                        data["output"] = output.clone();
                    }
                }
            }
            Phase::Failed | Phase::Interrupted => {
                data["error"] = serde_json::to_value(&record.error).unwrap_or_default();
            }
            Phase::AwaitingApproval { confirmations, .. } => {
                data["confirmations"] = serde_json::to_value(confirmations).unwrap_or_default();
            }
            _ => return None,
        }
        if let Some(user) = &self.session.user_id {
            data["user_id"] = user.clone().into();
        }
        Some(crate::webhooks::outbox_op(crate::webhooks::Event {
            tenant: self.session.tenant.clone(),
            url,
            event_type: format!("turn.{status}"),
            session_id: Some(self.session.id.clone()),
            turn_id: Some(record.turn_id.clone()),
            run_id: None,
            distinct: record.model_calls.to_string(),
            anchor: record.started_at,
            data,
        }))
    }

    /// The final, durable write of a turn (or a record), with `extra` ops
    /// after what is staged, refused when the store reopened since this
    /// conversation loaded; `then` learns how it went.
    fn commit_turn(
        &mut self,
        extra: Vec<WriteOp>,
        ctx: &mut Context<Self>,
        then: impl FnOnce(&mut Self, Result<(), StoreError>, &mut Context<Self>) + 'static,
    ) {
        let mut ops = self.take_unsaved();
        ops.extend(extra);
        let ops = self.writer.fenced(ops);
        let wakes = has_event(&ops);
        let store = self.store.clone();
        let generation = self.generation;
        ctx.spawn(
            async move { woken(wakes, store.write_at(generation, ops, true).await) }
                .into_actor(self)
                .map(move |result, act, ctx| {
                    if let Err(e) = &result {
                        tracing::warn!(session = %act.session.id, error = %e, "turn not stored");
                    }
                    then(act, result, ctx)
                }),
        );
    }

    fn emit(&self, event: TurnEvent) {
        if let Some(c) = &self.current {
            c.emit(event);
        }
    }

    fn perform(&mut self, step: Step, ctx: &mut Context<Self>) {
        self.stage(step.persist);
        let record = step.record.map(|r| self.record_ops(&r));
        let record = if matches!(step.action, Action::Finish(_) | Action::Pause(_)) {
            record
        } else {
            let mut ops = self.take_unsaved();
            ops.extend(record.into_iter().flatten());
            let ops = self.writer.fenced(ops);
            if let Action::RunTools(calls) = &step.action
                && self.writer.may_be_taken_over()
            {
                // Cluster mode: tools act on the world, so they run only
                // once this node's claim is confirmed by a commit of the
                // step that asks for them; a node that lost the session
                // (paused past its heartbeat, partitioned) is fenced here
                // and runs nothing.
                let calls = calls.clone();
                self.held = calls.iter().map(|c| (c.clone(), None)).collect();
                let store = self.store.clone();
                let generation = self.generation;
                let turn_gen = self.turn_gen;
                ctx.spawn(
                    async move { store.write_at(generation, ops, false).await }
                        .into_actor(self)
                        .map(move |result, act, ctx| {
                            if act.turn_gen != turn_gen {
                                return;
                            }
                            match result {
                                Ok(()) => act.run_tools(calls, ctx),
                                Err(e) => act.fail(TurnError::Store(e), ctx),
                            }
                        }),
                );
                return;
            }
            self.store.write_behind_at(self.generation, ops);
            None
        };
        match step.action {
            Action::CallModel(request) => {
                let model = self.agent.model.clone();
                // A checked answer is streamed whole once it passed
                // ([`Self::finish`]), never in deltas before.
                let sink = self
                    .current
                    .as_ref()
                    .and_then(|c| c.events.clone())
                    .filter(|_| !self.machine.settings().holds_answer());
                let span = tracing::info_span!(
                    parent: self.turn_span(),
                    "gen_ai.chat",
                    otel.name = %format_args!("chat {}", request.model),
                    otel.kind = "client",
                    gen_ai.operation.name = "chat",
                    gen_ai.provider.name = %model.describe(),
                    gen_ai.system = %model.describe(),
                    gen_ai.request.model = %request.model,
                    gen_ai.conversation.id = %self.session.id,
                    cadre.session = %self.session.id,
                    cadre.tenant = %self.session.tenant,
                    latency_ms = tracing::field::Empty,
                    gen_ai.request.temperature = ?request.temperature,
                    gen_ai.usage.input_tokens = tracing::field::Empty,
                    gen_ai.usage.output_tokens = tracing::field::Empty,
                    gen_ai.response.tool_calls = tracing::field::Empty,
                    error.type = tracing::field::Empty,
                );
                let record_to = span.clone();
                let metrics = self.metrics.clone();
                let timing = metrics.clone();
                let io = async move {
                    let called = Instant::now();
                    let latency_to = tracing::Span::current();
                    let _observe = ObserveOnDrop(Some(move || {
                        let took = called.elapsed();
                        timing.model_latency.observe(took);
                        latency_to.record("latency_ms", took.as_millis() as u64);
                    }));
                    let reply = match sink {
                        Some(tx) => {
                            let on_delta = move |text: &str| {
                                let _ = tx.send(TurnEvent::ModelDelta { text: text.into() });
                            };
                            model.complete_streaming(request, &on_delta).await?
                        }
                        None => model.complete(request).await?,
                    };
                    Ok::<_, TurnError>(reply)
                }
                .instrument(span);
                // The HTTP exchange runs as a task on the runtime's workers,
                // where its socket's events are: polled from this arbiter,
                // every one of them would be a hop between threads. Only the
                // reply crosses back. Dropped with the actor, it is aborted.
                let call = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(io));
                let io = within(self.model_budget(), self.model_turn_timeout, async move {
                    call.await.unwrap_or_else(|e| {
                        Err(TurnError::Model(ModelError::InvalidResponse {
                            detail: format!("the model call ended abnormally: {e}"),
                        }))
                    })
                });
                let handle = ctx.spawn(io.into_actor(self).map(move |(result, took), act, ctx| {
                    act.model_call = None;
                    if let Some(c) = act.current.as_mut() {
                        c.model_spent += took;
                    }
                    metrics.model_calls.fetch_add(1, Ordering::Relaxed);
                    if result.is_err() {
                        metrics.model_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    act.on_model_result(result, &record_to, ctx)
                }));
                self.model_call = Some(handle);
            }
            Action::RunTools(calls) => {
                self.held = calls.iter().map(|c| (c.clone(), None)).collect();
                self.run_tools(calls, ctx);
            }
            Action::Finish(outcome) => {
                self.finish(*outcome, record.unwrap_or_default(), ctx);
            }
            Action::Pause(outcome) => {
                self.pause(*outcome, record.unwrap_or_default(), ctx);
            }
            Action::Reject(rejection) => self.fail(TurnError::Rejected(rejection), ctx),
        }
    }

    fn on_model_result(
        &mut self,
        result: Result<crate::model::ChatResponse, TurnError>,
        record_to: &tracing::Span,
        ctx: &mut Context<Self>,
    ) {
        match result {
            Ok(reply) => {
                if let Some(u) = &reply.usage {
                    record_to.record("gen_ai.usage.input_tokens", u.prompt_tokens);
                    record_to.record("gen_ai.usage.output_tokens", u.completion_tokens);
                }
                record_to.record("gen_ai.response.tool_calls", reply.tool_calls.len());
                self.unsaved_usage
                    .add(&TokenUsage::of_reply(reply.usage.as_ref()));
                if let Some(guardrails) = self.machine.settings().guardrails()
                    && guardrails.has_stage(Stage::Output)
                    && self.machine.is_answer(&reply)
                {
                    let guardrails = guardrails.clone();
                    self.check_answer(guardrails, reply, ctx);
                    return;
                }
                match self.machine.on_model_reply(reply) {
                    Ok(step) => self.perform(step, ctx),
                    Err(e) => self.out_of_step(e, ctx),
                }
            }
            Err(e) => {
                record_to.record("error.type", e.code().as_str());
                if let TurnError::Model(m) = &e
                    && m.is_request_too_large()
                    && self.current.as_ref().is_some_and(|c| !c.compacted)
                    && let Some(request) = self.machine.compact_request()
                {
                    self.compact_then_retry(request, e, ctx);
                    return;
                }
                self.fail(e, ctx)
            }
        }
    }

    /// The `output` guardrails on the final answer, before the machine
    /// stores it (see [`crate::guardrails`]): a block fails the turn with
    /// `GUARDRAIL_TRIPPED` and nothing of the answer is stored or sent; a
    /// redaction or rewrite is what the machine gets. The check can be
    /// cut like the model call it follows.
    fn check_answer(
        &mut self,
        guardrails: Guardrails,
        mut reply: crate::model::ChatResponse,
        ctx: &mut Context<Self>,
    ) {
        let text = reply.content.take().unwrap_or_default();
        let mut checked_ctx = self.execution_context();
        checked_ctx.cut = self.current.as_ref().map(|c| c.cut.clone());
        let shared = self.executor.shared().clone();
        let (session, turn) = (
            self.session.id.clone(),
            self.machine.turn_id().map(str::to_string),
        );
        let check = async move {
            let checks = GuardrailChecks {
                registry: &shared.registry,
                config: &shared.config,
                ctx: &checked_ctx,
            };
            let checked = guardrails
                .run(Stage::Output, None, Subject::Text(text), &checks)
                .await;
            crate::executor::guarded::note(
                &shared.metrics,
                &shared.events,
                &checked,
                Some(&session),
                turn.as_deref(),
                None,
            );
            checked
        };
        let turn_gen = self.turn_gen;
        let handle = ctx.spawn(check.into_actor(self).map(move |checked, act, ctx| {
            act.model_call = None;
            if act.turn_gen != turn_gen {
                return;
            }
            if let Some(tripped) = checked.tripped {
                act.fail(
                    TurnError::Rejected(Box::new(tripped_rejection(&tripped))),
                    ctx,
                );
                return;
            }
            reply.content = checked.subject.into_text();
            match act.machine.on_model_reply(reply) {
                Ok(step) => act.perform(step, ctx),
                Err(e) => act.out_of_step(e, ctx),
            }
        }));
        self.model_call = Some(handle);
    }

    /// Folds the history into the summary, then asks the turn's request
    /// again; fails the turn with `refused` when no summary came.
    fn compact_then_retry(
        &mut self,
        request: crate::model::ChatRequest,
        refused: TurnError,
        ctx: &mut Context<Self>,
    ) {
        tracing::warn!(session = %self.session.id, error = %refused, "the model refused the request as too large; summarising the history and asking once more");
        if let Some(c) = self.current.as_mut() {
            c.compacted = true;
        }
        let model = self.agent.model.clone();
        let call = within(self.model_budget(), self.model_turn_timeout, async move {
            model.complete(request).await
        });
        let turn_gen = self.turn_gen;
        ctx.spawn(call.into_actor(self).map(move |(result, took), act, ctx| {
            if act.turn_gen != turn_gen {
                // The turn was cut meanwhile; its summary is still good.
                act.store_summary(result, ctx);
                return;
            }
            if let Some(c) = act.current.as_mut() {
                c.model_spent += took;
            }
            if act.store_summary(result, ctx) {
                match act.machine.turn_request() {
                    Ok(request) => act.perform(
                        Step {
                            persist: Vec::new(),
                            record: None,
                            action: Action::CallModel(request),
                        },
                        ctx,
                    ),
                    Err(e) => act.out_of_step(e, ctx),
                }
            } else {
                act.fail(refused, ctx);
            }
        }));
    }

    /// Runs `calls` (all or part of the batch in [`Self::held`]) in a
    /// tool sub-agent; its report fills the batch.
    fn run_tools(&mut self, calls: Vec<crate::model::ToolCall>, ctx: &mut Context<Self>) {
        let arguments = self.machine.arguments_of(&calls);
        for (c, a) in calls.iter().zip(&arguments) {
            self.emit(TurnEvent::ToolCallStarted {
                id: c.id.clone(),
                name: c.name.clone(),
                arguments: a.value.clone(),
            });
        }
        self.batch_id += 1;
        let batch_id = self.batch_id;
        let mut context = self.execution_context();
        context.cut = self.current.as_ref().map(|c| c.cut.clone());
        // A streaming caller sees the steps of the children its `ask_`
        // calls run, tagged with the child.
        if let Some(sink) = self.current.as_ref().and_then(|c| c.events.clone()) {
            context.child_events = Some(crate::tools::delegate::ChildEvents(Arc::new(
                move |e: crate::tools::delegate::ChildEvent| {
                    let _ = sink.send(TurnEvent::ChildEvent {
                        session_id: e.session_id,
                        agent: e.agent,
                        event: e.event,
                    });
                },
            )));
        }
        let executor = self.executor.clone();
        let deadline = self.agent.tool_batch_timeout;
        let offered: std::sync::Arc<[String]> = self
            .machine
            .settings()
            .tools
            .iter()
            .map(|t| t.name.clone())
            .collect();
        let span = tracing::info_span!(
            parent: self.turn_span(),
            "tool_batch",
            batch = batch_id,
            calls = calls.len(),
            cadre.session = %self.session.id,
            cadre.tenant = %self.session.tenant,
        );
        ToolSubAgent::spawn(
            batch_id,
            calls,
            arguments,
            offered,
            context,
            executor,
            ctx.address().recipient(),
            deadline,
            span,
            self.machine
                .settings()
                .guardrails()
                .cloned()
                .unwrap_or_default(),
        );
    }

    fn finish(&mut self, outcome: TurnOutcome, record: Vec<WriteOp>, ctx: &mut Context<Self>) {
        self.closing = Some(outcome.turn_id.as_str().into());
        self.commit_turn(record, ctx, move |act, result, ctx| {
            let failed = result.is_err();
            act.closing = None;
            act.notify_watchers(&outcome.turn_id, result.as_ref().map(|_| &outcome));
            if let Some(current) = act.current.take() {
                current.span.record("iterations", outcome.iterations);
                current.span.record("tool_calls", outcome.tool_calls.len());
                current
                    .span
                    .record("latency_ms", current.started.elapsed().as_millis() as u64);
                if result.is_ok() {
                    act.metrics.turn_ended(
                        &act.session.tenant,
                        &act.agent.name,
                        TurnEnd::Completed,
                    );
                    act.metrics.turn_latency.observe(current.started.elapsed());
                    if act.machine.settings().holds_answer() && !outcome.answer.is_empty() {
                        current.emit(TurnEvent::ModelDelta {
                            text: outcome.answer.clone(),
                        });
                    }
                    current.emit(TurnEvent::TurnCompleted(Box::new(outcome.clone())));
                } else {
                    act.metrics
                        .turn_ended(&act.session.tenant, &act.agent.name, TurnEnd::Failed);
                }
                if let Some(reply) = current.reply {
                    let _ = reply.send(result.map(|()| outcome).map_err(TurnError::from));
                }
            }
            if failed {
                ctx.stop();
                return;
            }
            act.machine.set_activity(Activity::Other);
            act.summarise_then_next(ctx);
        });
    }

    /// The turn waits for decisions: its phase is made durable, then the
    /// caller gets the paused outcome and the session stays held (see
    /// [`Self::start_next`]) until every held call has an outcome.
    fn pause(&mut self, outcome: TurnOutcome, record: Vec<WriteOp>, ctx: &mut Context<Self>) {
        self.closing = Some(outcome.turn_id.as_str().into());
        self.commit_turn(record, ctx, move |act, result, ctx| {
            act.closing = None;
            act.notify_watchers(&outcome.turn_id, result.as_ref().map(|_| &outcome));
            let failed = result.is_err();
            if let Some(current) = act.current.take() {
                current
                    .span
                    .record("latency_ms", current.started.elapsed().as_millis() as u64);
                if !failed {
                    current.emit(TurnEvent::TurnPaused(Box::new(outcome.clone())));
                }
                if let Some(reply) = current.reply {
                    let _ = reply.send(result.map(|()| outcome.clone()).map_err(TurnError::from));
                }
            }
            if failed {
                ctx.stop();
                return;
            }
            act.machine.set_activity(Activity::Idle);
            act.last_active = Instant::now();
            act.expire_later(&outcome.confirmations, ctx);
        });
    }

    /// Looks at the held calls again when the first of them expires.
    fn expire_later(&mut self, approvals: &[Approval], ctx: &mut Context<Self>) {
        let now = Timestamp::now();
        if let Some(first) = approvals.iter().filter_map(|a| a.expires_at).min() {
            let wait = now
                .duration_until(first)
                .try_into()
                .unwrap_or(Duration::ZERO)
                + Duration::from_millis(50);
            ctx.run_later(wait, |act, ctx| act.check_approvals(false, ctx));
        }
    }

    /// A paused turn: finds each held call's outcome (a decision, an
    /// expiry, a record) and goes on once all have one.
    fn check_approvals(&mut self, after_restart: bool, ctx: &mut Context<Self>) {
        let Phase::AwaitingApproval {
            calls,
            confirmations,
        } = self.machine.phase()
        else {
            return;
        };
        self.resolve_batch(calls, confirmations, after_restart, ctx);
    }

    /// Finds what is known of each call of a batch ([`resume::resolve`]),
    /// then: waits (decisions pending), runs the calls that never ran, or
    /// hands every outcome to the machine.
    fn resolve_batch(
        &mut self,
        calls: Vec<crate::model::ToolCall>,
        approvals: Vec<Approval>,
        after_restart: bool,
        ctx: &mut Context<Self>,
    ) {
        let known: Vec<Option<ToolExecutionResult>> = calls
            .iter()
            .map(|c| {
                self.held
                    .iter()
                    .find(|(h, _)| h.id == c.id)
                    .and_then(|(_, r)| r.clone())
                    .filter(|r| r.error_type != Some(crate::tools::ErrorType::PendingConfirmation))
            })
            .collect();
        let lookup = resume::Lookup {
            store: self.store.clone(),
            confirmations: self.executor.shared().confirmations.clone(),
            session: self.session.id.clone(),
            tenant: self.session.tenant.clone(),
            turn_id: self.machine.turn_id().unwrap_or_default().to_string(),
            after_restart,
        };
        let turn_gen = self.turn_gen;
        let batch = calls.clone();
        ctx.spawn(
            async move { lookup.resolve(&batch, &approvals, known).await }
                .into_actor(self)
                .map(move |found, act, ctx| {
                    if act.turn_gen != turn_gen {
                        return;
                    }
                    let found = match found {
                        Ok(found) => found,
                        Err(e) => {
                            tracing::warn!(session = %act.session.id, error = %e, "the outcomes of a resumed batch could not be read; trying again later");
                            ctx.run_later(Duration::from_secs(1), move |act, ctx| {
                                act.check_approvals(after_restart, ctx)
                            });
                            return;
                        }
                    };
                    act.held = calls
                        .iter()
                        .cloned()
                        .zip(found.iter().map(|r| match r {
                            Resolution::Done(r) => Some((**r).clone()),
                            _ => None,
                        }))
                        .collect();
                    if let Some(rollback) = act.interrupting {
                        // Cut while paused: every outcome there is, then closed
                        // (an approved call still running brings its own).
                        if found.iter().any(|r| matches!(r, Resolution::Waiting)) {
                            return;
                        }
                        let known = act.known_outcomes();
                        act.close_interrupted(rollback, known, ctx);
                        act.start_next(ctx);
                        return;
                    }
                    if found.iter().any(|r| matches!(r, Resolution::Waiting)) {
                        // Still paused; a decision or an expiry looks again.
                        act.machine.set_activity(Activity::Idle);
                        if let Phase::AwaitingApproval { confirmations, .. } = act.machine.phase() {
                            act.expire_later(&confirmations, ctx);
                        }
                        return;
                    }
                    act.ensure_current();
                    let to_run: Vec<_> = calls
                        .iter()
                        .zip(&found)
                        .filter(|(_, r)| matches!(r, Resolution::Run))
                        .map(|(c, _)| c.clone())
                        .collect();
                    if to_run.is_empty() {
                        act.batch_done(ctx);
                    } else {
                        act.run_tools(to_run, ctx);
                    }
                }),
        );
    }

    /// Every call of the batch has its outcome: to the machine, in order.
    fn batch_done(&mut self, ctx: &mut Context<Self>) {
        let held = std::mem::take(&mut self.held);
        let results: Vec<_> = held
            .into_iter()
            .map(|(c, r)| {
                let r = r.unwrap_or_else(|| {
                    ToolExecutionResult::failure(
                        &c.name,
                        crate::tools::ErrorType::ExecutionError,
                        "the call had no outcome",
                    )
                });
                (c, r)
            })
            .collect();
        let before = self.machine.turn_calls().len();
        let step = match self.machine.on_tool_results(results) {
            Ok(step) => step,
            Err(e) => return self.out_of_step(e, ctx),
        };
        let calls = self.machine.turn_calls();
        for call in calls.get(before..).unwrap_or_default() {
            self.emit(TurnEvent::ToolCallCompleted { call: call.clone() });
        }
        self.perform(step, ctx);
    }

    /// The span of a turn (`resumed`: taken up again, after a restart or
    /// a decision); model calls and the tool batch are its children.
    fn new_turn_span(&self, resumed: bool) -> tracing::Span {
        // Who the turn's tool calls are made as: the conversation, or the
        // workflow node that opened this session.
        let caller_type = self.execution_context().caller_type.as_str();
        tracing::info_span!(
            "turn",
            otel.name = %format_args!("invoke_agent {}", self.agent.name),
            gen_ai.operation.name = "invoke_agent",
            gen_ai.agent.name = %self.agent.name,
            gen_ai.conversation.id = %self.session.id,
            cadre.session = %self.session.id,
            cadre.tenant = %self.session.tenant,
            cadre.caller_type = caller_type,
            cadre.resumed = resumed,
            iterations = tracing::field::Empty,
            tool_calls = tracing::field::Empty,
            latency_ms = tracing::field::Empty,
            error.type = tracing::field::Empty,
        )
    }

    /// A turn going on with nobody waiting here (resumed after a restart
    /// or a decision) gets its bookkeeping.
    fn ensure_current(&mut self) {
        self.machine.set_activity(Activity::Turn);
        if self.current.is_some() {
            return;
        }
        let span = self.new_turn_span(true);
        self.current = Some(Current {
            started: Instant::now(),
            reply: None,
            events: None,
            span,
            model_spent: Duration::ZERO,
            compacted: false,
            cut: Default::default(),
            _reservation: None,
        });
    }

    /// Tells the callers watching `turn_id` how it ended (or paused).
    fn notify_watchers(&mut self, turn_id: &str, result: Result<&TurnOutcome, &StoreError>) {
        if self.watchers.is_empty() {
            return;
        }
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.watchers)
            .into_iter()
            .partition(|(id, _)| id == turn_id);
        self.watchers = rest;
        for (_, reply) in mine {
            let _ = reply.send(match result {
                Ok(o) => Ok(o.clone()),
                Err(_) => Err(TurnError::Unavailable),
            });
        }
    }

    /// Takes up a turn found open at load: resumed from its phase, or
    /// (older than the resume window) closed as interrupted.
    fn take_up(&mut self, record: TurnRecord, what: CutTurn, ctx: &mut Context<Self>) {
        let turn_id = record.turn_id.clone();
        let resume = match self.machine.resume(record) {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(session = %self.session.id, turn = %turn_id, error = %e, "a cut turn could not be taken up");
                return;
            }
        };
        if what == CutTurn::Close {
            tracing::warn!(session = %self.session.id, turn = %turn_id, "a turn cut by a restart is closed as interrupted (older than the resume window, or a workflow node's: its run reruns the node)");
            self.metrics
                .turn_ended(&self.session.tenant, &self.agent.name, TurnEnd::Interrupted);
            if let Some(closed) = self.machine.interrupt_turn(false, Some(INTERRUPTED_NOTE)) {
                self.write_closed(closed, true, ctx);
            }
            return;
        }
        tracing::info!(session = %self.session.id, turn = %turn_id, "resuming a turn cut by a restart");
        self.metrics.turns_resumed.fetch_add(1, Ordering::Relaxed);
        match resume {
            Resume::CallModel(request) => {
                self.ensure_current();
                self.perform(
                    Step {
                        persist: Vec::new(),
                        record: None,
                        action: Action::CallModel(request),
                    },
                    ctx,
                );
            }
            Resume::Tools(calls) => {
                self.machine.set_activity(Activity::Turn);
                self.resolve_batch(calls, Vec::new(), true, ctx);
            }
            Resume::Approval {
                calls,
                confirmations,
            } => {
                self.machine.set_activity(Activity::Turn);
                self.resolve_batch(calls, confirmations, true, ctx);
            }
        }
    }

    /// Writes a closed turn (its messages, record and rollback marks):
    /// durably when `durable`, else behind (the next commit makes it so).
    fn write_closed(&mut self, closed: Closed, durable: bool, ctx: &mut Context<Self>) {
        self.stage(closed.persist);
        let mut ops = self.take_unsaved();
        ops.extend(self.record_ops(&closed.record));
        if !closed.rolled_back.is_empty() {
            ops.push(WriteOp::MarkRolledBack {
                session_id: self.session.id.clone(),
                seqs: closed.rolled_back,
            });
        }
        let ops = self.writer.fenced(ops);
        if durable {
            let store = self.store.clone();
            let generation = self.generation;
            let wakes = has_event(&ops);
            ctx.spawn(
                async move {
                    if let Err(e) = woken(wakes, store.write_at(generation, ops, true).await) {
                        tracing::warn!(error = %e, "closed turn not stored");
                    }
                }
                .into_actor(self),
            );
        } else {
            self.store.write_behind_at(self.generation, ops);
        }
    }

    /// Cuts the running (or paused) turn for a newer message: its model
    /// call is dropped, its batch's report will be ignored (calls already
    /// running finish and are recorded, their outcomes unused), and the
    /// turn is closed as `interrupted` (with `rollback`, its messages leave
    /// every later prompt). A paused turn's confirmations are declined
    /// first ([`Self::interrupt_paused`]).
    fn interrupt(&mut self, rollback: bool, ctx: &mut Context<Self>) {
        if !self.machine.in_turn() || self.interrupting.is_some() {
            return;
        }
        // Its running children are cut with it ([`super::delegation`]).
        if let Some(c) = &self.current {
            c.cut.0.cancel();
        }
        if let Some(h) = self.model_call.take() {
            ctx.cancel_future(h);
        }
        if let Phase::AwaitingApproval { confirmations, .. } = self.machine.phase()
            && !confirmations.is_empty()
        {
            return self.interrupt_paused(rollback, confirmations, ctx);
        }
        self.close_interrupted(rollback, Vec::new(), ctx);
    }

    /// Cuts a turn paused for approvals. A person's decision can win the
    /// race with the interrupting message: the call it approved runs (or
    /// ran), and the model must get its real outcome, not
    /// `TOOL_OUTCOME_UNKNOWN`. So every confirmation still pending is declined
    /// first (exactly once: a decision already made stays), then the batch
    /// is resolved as after a decision: declined calls say so, an approved
    /// one's outcome is awaited (its [`CheckApprovals`] brings it) for at
    /// most [`INTERRUPT_WAIT`], and only then is the turn closed. The
    /// interrupting message waits in the queue meanwhile (the turn is still
    /// open).
    fn interrupt_paused(&mut self, rollback: bool, held: Vec<Approval>, ctx: &mut Context<Self>) {
        self.interrupting = Some(rollback);
        // Not idle: a decision's `CheckApprovals` must not take the turn on.
        self.machine.set_activity(Activity::Turn);
        let confirmations = self.executor.shared().confirmations.clone();
        let tenant = self.session.tenant.clone();
        let turn_gen = self.turn_gen;
        ctx.spawn(
            async move {
                for a in held {
                    let _ = confirmations
                        .decide(
                            &a.confirmation_id,
                            &tenant,
                            crate::executor::confirmations::Decision::Denied,
                        )
                        .await;
                }
            }
            .into_actor(self)
            .map(move |(), act, ctx| {
                if act.turn_gen == turn_gen {
                    act.check_approvals(false, ctx);
                }
            }),
        );
        ctx.run_later(INTERRUPT_WAIT, move |act, ctx| {
            if act.turn_gen == turn_gen
                && let Some(rollback) = act.interrupting
            {
                tracing::warn!(session = %act.session.id, "an approved call had no outcome when its turn was interrupted; closed as TOOL_OUTCOME_UNKNOWN");
                let known = act.known_outcomes();
                act.close_interrupted(rollback, known, ctx);
                act.start_next(ctx);
            }
        });
    }

    /// The outcomes held for the paused batch so far.
    fn known_outcomes(&mut self) -> Vec<(crate::model::ToolCall, ToolExecutionResult)> {
        std::mem::take(&mut self.held)
            .into_iter()
            .filter_map(|(c, r)| r.map(|r| (c, r)))
            .filter(|(_, r)| r.error_type != Some(crate::tools::ErrorType::PendingConfirmation))
            .collect()
    }

    /// Closes the open turn as interrupted, `known` giving the outcomes of
    /// calls of its batch that have one.
    fn close_interrupted(
        &mut self,
        rollback: bool,
        known: Vec<(crate::model::ToolCall, ToolExecutionResult)>,
        ctx: &mut Context<Self>,
    ) {
        self.interrupting = None;
        self.batch_id += 1;
        self.turn_gen += 1;
        self.held.clear();
        let Some(closed) = self.machine.interrupt_turn_with(rollback, known) else {
            return;
        };
        let turn_id = closed.record.turn_id.clone();
        tracing::info!(session = %self.session.id, turn = %turn_id, rollback, "turn interrupted by a newer message");
        self.write_closed(closed, false, ctx);
        self.metrics
            .turn_ended(&self.session.tenant, &self.agent.name, TurnEnd::Interrupted);
        let interrupted: Result<TurnOutcome, TurnError> = Err(TurnError::Interrupted);
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.watchers)
            .into_iter()
            .partition(|(id, _)| *id == turn_id);
        self.watchers = rest;
        for (_, w) in mine {
            let _ = w.send(Err(TurnError::Interrupted));
        }
        if let Some(current) = self.current.take() {
            current.span.record("error.type", "TURN_INTERRUPTED");
            current.emit(TurnEvent::TurnInterrupted {
                turn_id: turn_id.clone(),
            });
            if let Some(reply) = current.reply {
                let _ = reply.send(interrupted);
            }
        }
        self.machine.set_activity(Activity::Idle);
    }

    /// Updates the rolling summary if needed, then starts what is queued.
    fn summarise_then_next(&mut self, ctx: &mut Context<Self>) {
        let Some(request) = self.machine.summary_request() else {
            self.machine.set_activity(Activity::Idle);
            self.start_next(ctx);
            return;
        };
        let model = self.agent.model.clone();
        let call = within(
            self.model_turn_timeout,
            self.model_turn_timeout,
            async move { model.complete(request).await },
        );
        ctx.spawn(call.into_actor(self).map(|(result, _), act, ctx| {
            act.store_summary(result, ctx);
            act.machine.set_activity(Activity::Idle);
            act.start_next(ctx);
        }));
    }

    /// Keeps and stores the summary a summary call answered, with its
    /// usage; `true` when there was one.
    fn store_summary(
        &mut self,
        result: Result<crate::model::ChatResponse, ModelError>,
        ctx: &mut Context<Self>,
    ) -> bool {
        let act = self;
        let (text, usage) = match result {
            Ok(r) => (
                r.content.map(|t| capped_summary(t, &act.session.id)),
                TokenUsage::of_reply(r.usage.as_ref()),
            ),
            Err(e) => {
                tracing::warn!(session = %act.session.id, error = %e, "summary not updated");
                (None, TokenUsage::default())
            }
        };
        let mut ops: Vec<WriteOp> = act.usage_op(usage).into_iter().collect();
        let made = act.machine.on_summary(text);
        let stored = made.is_some();
        if let Some(summary) = made {
            ops.push(WriteOp::PutSummary {
                session_id: act.session.id.clone(),
                summary: StoredSummary {
                    text: summary.text,
                    covers_until_seq: summary.covers_until_seq,
                    updated_at: Timestamp::now(),
                },
            });
        }
        if !ops.is_empty() {
            let ops = act.writer.fenced(ops);
            let store = act.store.clone();
            let generation = act.generation;
            // Derived data and its cost: made durable by the next durable commit.
            ctx.spawn(
                async move {
                    if let Err(e) = store.write_at(generation, ops, false).await {
                        tracing::warn!(error = %e, "summary not stored");
                    }
                }
                .into_actor(act),
            );
        }
        stored
    }

    /// The machine refused a step (a bug): logged loudly, and the turn
    /// fails like any other, keeping what it stored.
    fn out_of_step(&mut self, error: super::machine::MachineError, ctx: &mut Context<Self>) {
        tracing::error!(session = %self.session.id, %error, "conversation out of step; failing the turn");
        self.fail(TurnError::OutOfStep(error), ctx);
    }

    fn fail(&mut self, error: TurnError, ctx: &mut Context<Self>) {
        tracing::warn!(session = %self.session.id, error = %error, "turn failed");
        let closed = self.machine.abort_turn(TurnFailure {
            code: error.code().as_str().to_string(),
            message: error.public_message(),
            details: error.details(),
        });
        self.batch_id += 1;
        self.held.clear();
        let mut extra = Vec::new();
        if let Some(closed) = closed {
            self.stage(closed.persist);
            extra.extend(self.record_ops(&closed.record));
            let turn_id = closed.record.turn_id;
            let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.watchers)
                .into_iter()
                .partition(|(id, _)| *id == turn_id);
            self.watchers = rest;
            for (_, w) in mine {
                let _ = w.send(Err(TurnError::Unavailable));
            }
        }
        let store_failed = matches!(error, TurnError::Store(_));
        self.commit_turn(extra, ctx, move |act, result, ctx| {
            if let Some(current) = act.current.take() {
                act.metrics
                    .turn_ended(&act.session.tenant, &act.agent.name, TurnEnd::Failed);
                current.span.record("error.type", error.code().as_str());
                current
                    .span
                    .record("latency_ms", current.started.elapsed().as_millis() as u64);
                if let Some(reply) = current.reply {
                    let _ = reply.send(Err(error));
                }
            }
            if store_failed || result.is_err() {
                ctx.stop();
                return;
            }
            act.machine.set_activity(Activity::Idle);
            act.start_next(ctx);
        });
    }

    fn turn_span(&self) -> tracing::Span {
        self.current
            .as_ref()
            .map_or_else(tracing::Span::none, |c| c.span.clone())
    }

    /// The context of this session's tool calls. A session a workflow's
    /// agent node opened (its metadata names the run and node) calls tools
    /// as that workflow node: outside the concurrency pool, recorded with
    /// the run's id, like the workflow's own tool nodes.
    fn execution_context(&self) -> ExecutionContext {
        let meta = &self.session.metadata;
        let workflow = meta["workflow_id"].as_str().zip(meta["node_id"].as_str());
        let caller = match workflow {
            Some(_) => CallerType::WorkflowNode,
            None => CallerType::ConversationAgent,
        };
        let mut c = ExecutionContext::new(caller, self.session.id.clone());
        if let Some((run, node)) = workflow {
            c.workflow_id = Some(run.to_string());
            c.node_id = Some(node.to_string());
        }
        c.conversation_id = Some(self.session.id.clone());
        c.turn_id = self.machine.turn_id().map(str::to_string);
        c.writer = Some(self.writer.clone());
        c.user_id = self.session.user_id.clone();
        c.plan = self.session.plan;
        c.tenant = Some(self.session.tenant.clone());
        let settings = self.machine.settings();
        c.variables = settings.tool_variables.clone();
        c.cache_ttl = settings.cache_ttl;
        c
    }
}

impl Handler<UserTurn> for Conversation {
    type Result = Result<AcceptedTurn, TurnError>;

    fn handle(&mut self, msg: UserTurn, ctx: &mut Context<Self>) -> Self::Result {
        self.drop_abandoned();
        let (tx, rx) = oneshot::channel();
        let turn_id = uuid::Uuid::now_v7().to_string();
        let ticket = self.machine.ticket();
        let entry = Queued::Turn {
            ticket,
            content: msg.content,
            settings: msg.settings,
            turn_id: turn_id.clone(),
            key: msg.idempotency_key,
        };
        match self.machine.offer(entry) {
            Err(Refusal::Busy) => return Err(TurnError::Busy),
            Err(Refusal::QueueFull { max }) => return Err(TurnError::QueueFull { max }),
            Ok(Admission::InterruptFirst { rollback }) => self.interrupt(rollback, ctx),
            Ok(Admission::Queued) => {}
        }
        let events = msg.events.clone();
        self.waiters.insert(
            ticket,
            Waiter::Turn {
                events: msg.events,
                reply: tx,
                reservation: msg.reservation,
            },
        );
        self.start_next(ctx);
        // Still queued behind a turn that waits for a person: say so now
        // (the caller answers 202 `queued`, a stream gets `turn_queued`),
        // rather than nothing until someone decides.
        let waiting_for = match self.machine.phase() {
            Phase::AwaitingApproval { .. }
                if self.machine.turn_id() != Some(&turn_id) && self.interrupting.is_none() =>
            {
                self.machine.turn_id().map(str::to_string)
            }
            _ => None,
        };
        if let (Some(paused), Some(events)) = (&waiting_for, &events) {
            let _ = events.send(TurnEvent::TurnQueued {
                turn_id: turn_id.clone(),
                waiting_for: paused.clone(),
            });
        }
        Ok(AcceptedTurn {
            turn_id,
            waiting_for,
            rx,
        })
    }
}

/// The sessions' sweeper asks every resident conversation, a few times per
/// idle timeout, whether it has been idle long enough to leave memory.
/// Decision: one sweeper for all instead of a timer per conversation (each
/// was a boxed interval and a timer entry, about 250 bytes of every idle
/// resident conversation, and a wake-up each per period either way).
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct IdleCheck;

impl Handler<IdleCheck> for Conversation {
    type Result = ();

    fn handle(&mut self, _: IdleCheck, ctx: &mut Context<Self>) {
        // Idle conversations leave memory; the store has everything. A
        // paused turn stays resident (at most the confirmation's lifetime):
        // its expiry timer lives here.
        if !(self.machine.is_quiet()
            && !self.machine.in_turn()
            && self.watchers.is_empty()
            && self.last_active.elapsed() >= self.idle_timeout)
        {
            return;
        }
        // Cluster mode: give the session up once everything written is in,
        // so any node takes it without waiting for this node's heartbeat to
        // go stale.
        if self.writer.may_be_taken_over() {
            let (store, writer) = (self.store.clone(), self.writer.clone());
            tokio::spawn(async move {
                if let Err(e) = writer.release(&*store).await {
                    tracing::debug!(session = writer.session_id(), error = %e, "session not released");
                }
            });
        }
        ctx.stop();
    }
}

impl Handler<CheckApprovals> for Conversation {
    type Result = ();

    fn handle(&mut self, msg: CheckApprovals, ctx: &mut Context<Self>) {
        self.last_active = Instant::now();
        let Phase::AwaitingApproval { calls, .. } = self.machine.phase() else {
            return;
        };
        if let Some((id, result)) = msg.ran {
            if self.held.is_empty() {
                self.held = calls.iter().map(|c| (c.clone(), None)).collect();
            }
            if let Some(slot) = self.held.iter_mut().find(|(c, _)| c.id == id) {
                slot.1 = Some(result);
            }
        }
        if self.machine.activity() == Activity::Idle || self.interrupting.is_some() {
            self.check_approvals(false, ctx);
        }
    }
}

impl Handler<CutRunning> for Conversation {
    type Result = ();

    fn handle(&mut self, msg: CutRunning, ctx: &mut Context<Self>) {
        if self.machine.turn_id() == Some(msg.turn_id.as_str()) {
            tracing::info!(session = %self.session.id, turn = %msg.turn_id, "turn cut with the turn that asked for it");
            self.interrupt(false, ctx);
            self.start_next(ctx);
        }
    }
}

impl Handler<HandOff> for Conversation {
    type Result = ();

    fn handle(&mut self, msg: HandOff, _: &mut Context<Self>) {
        tracing::info!(session = %self.session.id, from = %self.agent.name, to = %msg.agent.name, "conversation handed off");
        self.session.agent = msg.agent.name.clone();
        self.agent = msg.agent;
        self.machine.hand_off(msg.settings);
    }
}

impl Handler<WatchTurn> for Conversation {
    type Result = Option<AcceptedTurn>;

    fn handle(&mut self, msg: WatchTurn, _: &mut Context<Self>) -> Self::Result {
        // A turn whose end is being committed is still known here: its
        // stored record does not say how it ended yet.
        if !self.machine.knows_turn(&msg.turn_id)
            && self.closing.as_deref() != Some(msg.turn_id.as_str())
        {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        self.watchers.push((msg.turn_id.clone(), tx));
        Some(AcceptedTurn {
            turn_id: msg.turn_id,
            waiting_for: None,
            rx,
        })
    }
}

impl Handler<RecordMessage> for Conversation {
    type Result = ResponseFuture<Result<u64, TurnError>>;

    fn handle(&mut self, msg: RecordMessage, ctx: &mut Context<Self>) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        let ticket = self.machine.ticket();
        let entry = Queued::Record {
            ticket,
            message: msg.message,
        };
        // Records are always taken; they wait their turn.
        let _ = self.machine.offer(entry);
        self.waiters.insert(ticket, Waiter::Record { reply: tx });
        self.start_next(ctx);
        Box::pin(async move { rx.await.unwrap_or(Err(TurnError::Unavailable)) })
    }
}

/// Records a message an `input` guardrail refused as a failed turn of its
/// own (nothing of the message is stored, and no running turn is cut):
/// answers its id once the record is durable.
#[derive(Message)]
#[rtype(result = "Result<String, TurnError>")]
pub struct Refuse {
    pub rejection: super::machine::Rejection,
    pub key: Option<String>,
}

/// The write carries a webhook event ([`crate::webhooks::outbox_op`]).
fn has_event(ops: &[WriteOp]) -> bool {
    ops.iter()
        .any(|op| matches!(op, WriteOp::PutDocsOnce { .. }))
}

/// Once a write that carries a webhook event is committed, wakes the
/// delivery loop (else it finds the event at its next poll).
fn woken(wakes: bool, result: Result<(), StoreError>) -> Result<(), StoreError> {
    if wakes && result.is_ok() {
        crate::webhooks::wake();
    }
    result
}

impl Handler<Refuse> for Conversation {
    type Result = ResponseFuture<Result<String, TurnError>>;

    fn handle(&mut self, msg: Refuse, _: &mut Context<Self>) -> Self::Result {
        let turn_id = uuid::Uuid::now_v7().to_string();
        let record = self.machine.refused_record(
            turn_id.clone(),
            msg.key,
            TurnFailure {
                code: msg.rejection.code.as_str().to_string(),
                message: msg.rejection.message,
                details: Some(msg.rejection.details),
            },
        );
        let ops = self.writer.fenced(self.record_ops(&record));
        let wakes = has_event(&ops);
        let store = self.store.clone();
        let generation = self.generation;
        Box::pin(async move {
            woken(wakes, store.write_at(generation, ops, true).await)?;
            Ok(turn_id)
        })
    }
}

impl Handler<Retire> for Conversation {
    type Result = ResponseFuture<Result<(), TurnError>>;

    fn handle(&mut self, _: Retire, ctx: &mut Context<Self>) -> Self::Result {
        self.drop_abandoned();
        if !self.machine.is_quiet() || self.current.is_some() {
            return Box::pin(async { Err(TurnError::Busy) });
        }
        let (tx, rx) = oneshot::channel();
        self.retired = Some(tx);
        ctx.stop();
        // The sender is never used: it is dropped with the actor.
        Box::pin(async move {
            let _ = rx.await;
            Ok(())
        })
    }
}

impl Handler<ToolBatchReport> for Conversation {
    type Result = ();

    fn handle(&mut self, report: ToolBatchReport, ctx: &mut Context<Self>) {
        if report.batch_id != self.batch_id || !self.machine.in_turn() {
            tracing::debug!(
                batch = report.batch_id,
                "ignoring a stale tool batch report"
            );
            return;
        }
        // The sub-agent ran all or part of the held batch (a resumed one
        // runs only what never ran): its outcomes fill the gaps.
        for (call, result) in report.outcomes {
            if let Some(slot) = self.held.iter_mut().find(|(c, _)| c.id == call.id) {
                slot.1 = Some(result);
            }
        }
        self.batch_done(ctx);
    }
}

/// How other modules reach a conversation.
#[derive(Clone)]
pub struct ConversationHandle {
    addr: Addr<Conversation>,
}

impl ConversationHandle {
    pub fn start_in(arbiter: &actix::dev::ArbiterHandle, conversation: Conversation) -> Self {
        let addr = Conversation::start_in_arbiter(arbiter, move |_| conversation);
        ConversationHandle { addr }
    }

    /// Runs a turn: [`Self::submit`], then its outcome.
    pub async fn turn(
        &self,
        content: String,
        settings: Option<TurnSettings>,
        events: Option<TurnSink>,
    ) -> Result<TurnOutcome, TurnError> {
        self.submit(content, settings, events)
            .await?
            .outcome()
            .await
    }

    /// Hands a turn to the conversation: accepted (queued) or refused.
    pub async fn submit(
        &self,
        content: String,
        settings: Option<TurnSettings>,
        events: Option<TurnSink>,
    ) -> Result<AcceptedTurn, TurnError> {
        self.submit_keyed(content, settings, events, None, None)
            .await
    }

    /// [`Self::submit`] with the request's `Idempotency-Key` and the
    /// tokens its budget set aside.
    pub async fn submit_keyed(
        &self,
        content: String,
        settings: Option<TurnSettings>,
        events: Option<TurnSink>,
        idempotency_key: Option<String>,
        reservation: Option<Reservation>,
    ) -> Result<AcceptedTurn, TurnError> {
        self.addr
            .send(UserTurn {
                content,
                settings,
                events,
                idempotency_key,
                reservation,
            })
            .await
            .unwrap_or(Err(TurnError::Unavailable))
    }

    /// Looks at a paused turn again (a decision was made; `ran`: the
    /// approved call's outcome, by its tool call id).
    pub fn check_approvals(&self, ran: Option<(String, ToolExecutionResult)>) {
        self.addr.do_send(CheckApprovals { ran });
    }

    /// Cuts turn `turn_id` if it runs ([`CutRunning`]).
    pub fn cut(&self, turn_id: &str) {
        self.addr.do_send(CutRunning {
            turn_id: turn_id.to_string(),
        });
    }

    /// Hands the conversation to `agent` ([`HandOff`]); `false` when the
    /// actor is gone (its next load reads the agent from the session).
    pub async fn hand_off(&self, agent: Arc<Agent>, settings: TurnSettings) -> bool {
        self.addr.send(HandOff { agent, settings }).await.is_ok()
    }

    /// Waits on turn `turn_id` if it runs, is paused or queued here.
    pub async fn watch(&self, turn_id: &str) -> Option<AcceptedTurn> {
        self.addr
            .send(WatchTurn {
                turn_id: turn_id.to_string(),
            })
            .await
            .ok()
            .flatten()
    }

    /// Records a refused message as a failed turn ([`Refuse`]); its id.
    pub async fn refuse(
        &self,
        rejection: super::machine::Rejection,
        key: Option<String>,
    ) -> Result<String, TurnError> {
        self.addr
            .send(Refuse { rejection, key })
            .await
            .unwrap_or(Err(TurnError::Unavailable))
    }

    pub async fn record(&self, message: ChatMessage) -> Result<u64, TurnError> {
        self.addr
            .send(RecordMessage { message })
            .await
            .unwrap_or(Err(TurnError::Unavailable))
    }

    /// Stops the conversation for good unless something runs or waits in
    /// it ([`Retire`]); `Ok` once it is gone (or was already).
    pub async fn retire(&self) -> Result<(), TurnError> {
        self.addr.send(Retire).await.unwrap_or(Ok(()))
    }

    pub fn is_alive(&self) -> bool {
        self.addr.connected()
    }

    /// Asks the conversation to leave memory if it has been idle long
    /// enough ([`IdleCheck`]); nothing waits for the answer.
    pub(super) fn check_idle(&self) {
        self.addr.do_send(IdleCheck);
    }
}

/// What the history says of a turn a restart cut and that was too old to
/// take up (`[sessions] resume_window_s`).
pub const INTERRUPTED_NOTE: &str = "(This turn was interrupted: the service restarted before it finished, and it was not resumed. The question above was not answered.)";

/// Longest summary kept, in bytes. The summary is sent with every later
/// request; the instructions ask for 200 words, and a model that answers
/// megabytes instead would make every request that large.
pub const MAX_SUMMARY_BYTES: usize = 16 * 1024;

fn capped_summary(mut text: String, session: &str) -> String {
    if text.len() > MAX_SUMMARY_BYTES {
        tracing::warn!(
            session,
            bytes = text.len(),
            "the summary is longer than {MAX_SUMMARY_BYTES} bytes; cut"
        );
        let mut end = MAX_SUMMARY_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// `call`, cut after `budget` with `MODEL_TIMEOUT` (reported as the turn's
/// whole budget, `of`); with the time it took.
async fn within<T, E: From<ModelError>>(
    budget: Duration,
    of: Duration,
    call: impl Future<Output = Result<T, E>>,
) -> (Result<T, E>, Duration) {
    let started = Instant::now();
    let result = match tokio::time::timeout(budget, call).await {
        Ok(result) => result,
        Err(_) => Err(ModelError::Timeout { after: of }.into()),
    };
    (result, started.elapsed())
}

/// Bytes a message's row takes in the store (its JSON), counted without
/// building it.
fn stored_len(m: &StoredMessage) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, m);
    count.0
}

#[cfg(test)]
mod size {
    /// Every resident conversation is one actor task holding this struct
    /// inline, so its size is paid 100,000 times by 100,000 idle sessions
    /// (issue #18's target: a resident idle conversation within 4 KB). The
    /// executor handle was 368 bytes of it before its shared parts went
    /// behind one `Arc`; this fails when something that large comes back.
    #[test]
    fn a_resident_conversation_stays_small() {
        let size = std::mem::size_of::<super::Conversation>();
        assert!(size <= 1024, "Conversation is {size} bytes");
        assert!(std::mem::size_of::<crate::executor::ExecutorHandle>() <= 64);
    }
}
