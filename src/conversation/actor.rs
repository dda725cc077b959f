//! The Conversation actor: one per live session; performs the IO its
//! [`ConversationMachine`] asks for.
//!
//! UserTurn ─▶ queue ─▶ machine.start_turn ─▶ [persist] ─▶ model ─▶ machine ─▶ ToolSubAgent
//!                                                                 ◀── ToolBatchReport ──┘
//!            ◀── reply (after one durable commit) ◀── Finish ◀── machine ◀──┘
//!                                              └─▶ summary (model, no tools) ─▶ store
//!
//! Turns are serialised: a `UserTurn` arriving during a turn waits in the
//! actor's queue (in arrival order), or is refused with `Busy` when the
//! agent's `multitask` is `reject`. The queue holds at most
//! `max_queued_turns` turns (`[sessions] max_queued_turns`, default 8; the
//! running one is not counted): one more is refused with `QueueFull`
//! before it is queued, so a caller cannot make a session hold unbounded
//! messages in memory. A queued turn whose caller is gone (the receiver
//! of its outcome is dropped, or its event sink closed: the HTTP client
//! disconnected) was never acknowledged: it is dropped before it starts
//! and when the queue is counted, and nothing of it is stored or sent to
//! the model. Messages recorded without a turn (an operator's reply) take
//! their place in the same queue; they are not turns and are not counted
//! (the WebSocket that sends them is rate-limited, and waits for each). The actor never
//! blocks on IO: the model call, store writes and the tool batch run as
//! spawned futures or actors, so the mailbox stays free for reports. A
//! turn's steps (the user's message, tool calls, tool results) are handed
//! to the store's writer as they happen, non-durably and without waiting
//! for them (so readers see a running turn, and the turn never waits on a
//! write); the answer is written durably, which makes every step before it
//! durable too (the writer applies one sender's writes in order), and only
//! then is the turn acknowledged: one awaited, durable commit per turn. A
//! crash mid-turn loses only what was never acknowledged. A turn that fails
//! (model down) flushes what it has and reports the error; its messages
//! stay in the history. After a turn, the rolling summary is updated when
//! the history outgrew the window; a failed summary is tried again after
//! the next turn. A store error ends the actor once it has answered (its
//! memory may hold steps the store lost; queued messages get `Unavailable`),
//! and its writes, the ones behind the turn included, carry the store
//! generation it was loaded at, so after the store reopened from a failure
//! a step refused then also refuses the turn's final commit, and the
//! conversation reloads instead of writing on top of lost steps. A turn
//! given an event sink streams its progress
//! ([`TurnEvent`]): model deltas, tool calls started and completed, the
//! outcome.
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

use std::collections::VecDeque;
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
use super::machine::{Action, CallReport, ConversationMachine, Step, TurnOutcome, TurnSettings};
use crate::config::{Agent, Multitask};
use crate::error_code::{ErrorCode, PublicError};
use crate::executor::ExecutorHandle;
use crate::metrics::Metrics;
use crate::model::{ChatMessage, ModelError};
use crate::store::usage::day_of;
use crate::store::{
    Session, Store, StoreError, StoredMessage, StoredSummary, TokenUsage, UsageDelta, WriteOp,
};
use crate::tools::{CallerType, ExecutionContext};

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
        }
    }
}

/// Progress of a turn, for streaming callers.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TurnEvent {
    TurnStarted {
        session_id: String,
    },
    ModelDelta {
        text: String,
    },
    ToolCallStarted {
        id: String,
        name: String,
        arguments: Value,
    },
    ToolCallCompleted {
        #[serde(flatten)]
        call: CallReport,
    },
    /// The same body as the JSON reply.
    TurnCompleted(Box<TurnOutcome>),
}

impl TurnEvent {
    pub fn name(&self) -> &'static str {
        match self {
            TurnEvent::TurnStarted { .. } => "turn_started",
            TurnEvent::ModelDelta { .. } => "model_delta",
            TurnEvent::ToolCallStarted { .. } => "tool_call_started",
            TurnEvent::ToolCallCompleted { .. } => "tool_call_completed",
            TurnEvent::TurnCompleted(_) => "turn_completed",
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

/// Turns a session's queue holds besides the running one, unless configured.
pub const DEFAULT_MAX_QUEUED_TURNS: usize = 8;

/// Model time a turn may use, unless configured (`[model] turn_timeout_s`).
pub const DEFAULT_MODEL_TURN_TIMEOUT: Duration = Duration::from_secs(120);

/// A turn the conversation took on; its outcome follows.
pub struct AcceptedTurn(oneshot::Receiver<Result<TurnOutcome, TurnError>>);

impl AcceptedTurn {
    /// Waits for the turn to end.
    pub async fn outcome(self) -> Result<TurnOutcome, TurnError> {
        self.0.await.unwrap_or(Err(TurnError::Unavailable))
    }
}

enum Pending {
    Turn {
        content: String,
        settings: Option<TurnSettings>,
        events: Option<TurnSink>,
        reply: TurnReply,
    },
    Record {
        message: ChatMessage,
        reply: oneshot::Sender<Result<u64, TurnError>>,
    },
}

impl Pending {
    /// A turn nobody waits for any more: its outcome's receiver was
    /// dropped, or its event sink closed (the streaming client left).
    fn abandoned(&self) -> bool {
        match self {
            Pending::Turn { reply, events, .. } => {
                reply.is_closed() || events.as_ref().is_some_and(|e| e.is_closed())
            }
            Pending::Record { .. } => false,
        }
    }
}

struct Current {
    started: Instant,
    reply: TurnReply,
    events: Option<TurnSink>,
    /// The turn's span: model calls and the tool batch are its children.
    span: tracing::Span,
    /// Model time the turn used so far.
    model_spent: Duration,
    /// The history was folded into the summary after a too-large refusal.
    compacted: bool,
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
    /// The turn or record being performed.
    current: Option<Current>,
    busy: bool,
    queue: VecDeque<Pending>,
    /// Turns the queue may hold besides the running one.
    max_queued_turns: usize,
    /// Id of the tool batch the current turn waits for; reports of other
    /// batches (from a turn that already failed) are ignored.
    batch_id: u64,
    /// The messages of the running step, not yet handed to the writer.
    unsaved: Vec<StoredMessage>,
    /// Tokens of the model calls not yet handed to the writer.
    unsaved_usage: TokenUsage,
    idle_timeout: Duration,
    last_active: Instant,
    metrics: Arc<Metrics>,
    /// The store generation the history was loaded at.
    generation: u64,
    /// Model time one turn may use.
    model_turn_timeout: Duration,
    /// Dropped with the actor: how [`Retire`] learns it is gone.
    retired: Option<oneshot::Sender<()>>,
}

impl Actor for Conversation {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Idle conversations leave memory; the store has everything.
        let every = (self.idle_timeout / 4).max(Duration::from_millis(10));
        ctx.run_interval(every, |act, ctx| {
            if !act.busy && act.queue.is_empty() && act.last_active.elapsed() >= act.idle_timeout {
                ctx.stop();
            }
        });
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        for pending in self.queue.drain(..) {
            match pending {
                Pending::Turn { reply, .. } => {
                    let _ = reply.send(Err(TurnError::Unavailable));
                }
                Pending::Record { reply, .. } => {
                    let _ = reply.send(Err(TurnError::Unavailable));
                }
            }
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
        Conversation {
            session,
            agent,
            store,
            executor,
            machine,
            current: None,
            busy: false,
            queue: VecDeque::new(),
            max_queued_turns: DEFAULT_MAX_QUEUED_TURNS,
            batch_id: 0,
            unsaved: Vec::new(),
            unsaved_usage: TokenUsage::default(),
            idle_timeout,
            last_active: Instant::now(),
            metrics,
            generation: 0,
            model_turn_timeout: DEFAULT_MODEL_TURN_TIMEOUT,
            retired: None,
        }
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

    /// At most `max` turns wait behind the running one.
    pub fn max_queued_turns(mut self, max: usize) -> Self {
        self.max_queued_turns = max;
        self
    }

    /// Forgets the queued turns nobody waits for.
    fn drop_abandoned(&mut self) {
        let before = self.queue.len();
        self.queue.retain(|p| !p.abandoned());
        let dropped = before - self.queue.len();
        if dropped > 0 {
            tracing::info!(session = %self.session.id, dropped, "queued turns dropped: their callers left");
        }
    }

    fn start_next(&mut self, ctx: &mut Context<Self>) {
        if self.busy {
            return;
        }
        self.drop_abandoned();
        let Some(pending) = self.queue.pop_front() else {
            self.last_active = Instant::now();
            return;
        };
        self.busy = true;
        match pending {
            Pending::Turn {
                content,
                settings,
                events,
                reply,
            } => {
                if let Some(s) = settings {
                    self.machine.set_settings(s);
                }
                // Who the turn's tool calls are made as: the conversation, or
                // the workflow node that opened this session.
                let caller_type = self.execution_context().caller_type.as_str();
                let span = tracing::info_span!(
                    "turn",
                    otel.name = %format_args!("invoke_agent {}", self.agent.name),
                    gen_ai.operation.name = "invoke_agent",
                    gen_ai.agent.name = %self.agent.name,
                    gen_ai.conversation.id = %self.session.id,
                    cadre.session = %self.session.id,
                    cadre.tenant = %self.session.tenant,
                    cadre.caller_type = caller_type,
                    iterations = tracing::field::Empty,
                    tool_calls = tracing::field::Empty,
                    latency_ms = tracing::field::Empty,
                    error.type = tracing::field::Empty,
                );
                let current = Current {
                    started: Instant::now(),
                    reply,
                    events,
                    span,
                    model_spent: Duration::ZERO,
                    compacted: false,
                };
                current.emit(TurnEvent::TurnStarted {
                    session_id: self.session.id.clone(),
                });
                self.current = Some(current);
                match self.machine.start_turn(content) {
                    Ok(step) => self.perform(step, ctx),
                    Err(e) => self.out_of_step(e, ctx),
                }
            }
            Pending::Record { message, reply } => {
                let (seq, message) = self.machine.record(message);
                self.stage(vec![(seq, message)]);
                self.commit_turn(ctx, move |act, result, ctx| {
                    let failed = result.is_err();
                    let _ = reply.send(result.map(|()| seq).map_err(TurnError::from));
                    if failed {
                        ctx.stop();
                        return;
                    }
                    act.busy = false;
                    act.start_next(ctx);
                });
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
            }));
    }

    /// The writes of everything staged, usage included (nothing when nothing is).
    fn take_unsaved(&mut self) -> Vec<WriteOp> {
        let mut ops = Vec::new();
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

    /// The write that adds `usage` to this session's and its tenant's counters.
    fn usage_op(&self, usage: TokenUsage) -> Option<WriteOp> {
        (!usage.is_empty()).then(|| {
            WriteOp::RecordUsage(UsageDelta {
                session_id: Some(self.session.id.clone()),
                tenant: self.session.tenant.clone(),
                agent: self.agent.name.clone(),
                day: day_of(Timestamp::now()),
                usage,
            })
        })
    }

    /// The final, durable write of a turn (or a record), refused when the
    /// store reopened since this conversation loaded; `then` learns how it went.
    fn commit_turn(
        &mut self,
        ctx: &mut Context<Self>,
        then: impl FnOnce(&mut Self, Result<(), StoreError>, &mut Context<Self>) + 'static,
    ) {
        let ops = self.take_unsaved();
        let store = self.store.clone();
        let generation = self.generation;
        ctx.spawn(
            async move { store.write_at(generation, ops, true).await }
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
        if !matches!(step.action, Action::Finish(_)) {
            let ops = self.take_unsaved();
            self.store.write_behind_at(self.generation, ops);
        }
        match step.action {
            Action::CallModel(request) => {
                let model = self.agent.model.clone();
                let sink = self.current.as_ref().and_then(|c| c.events.clone());
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
                ctx.spawn(io.into_actor(self).map(move |(result, took), act, ctx| {
                    if let Some(c) = act.current.as_mut() {
                        c.model_spent += took;
                    }
                    metrics.model_calls.fetch_add(1, Ordering::Relaxed);
                    if result.is_err() {
                        metrics.model_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    act.on_model_result(result, &record_to, ctx)
                }));
            }
            Action::RunTools(calls) => {
                self.run_tools(calls, ctx);
            }
            Action::Finish(outcome) => {
                self.finish(*outcome, ctx);
            }
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
        ctx.spawn(call.into_actor(self).map(move |(result, took), act, ctx| {
            if let Some(c) = act.current.as_mut() {
                c.model_spent += took;
            }
            if act.store_summary(result, ctx) {
                match act.machine.turn_request() {
                    Ok(request) => act.perform(
                        Step {
                            persist: Vec::new(),
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

    fn run_tools(&mut self, calls: Vec<crate::model::ToolCall>, ctx: &mut Context<Self>) {
        for c in &calls {
            self.emit(TurnEvent::ToolCallStarted {
                id: c.id.clone(),
                name: c.name.clone(),
                arguments: serde_json::from_str(&c.arguments)
                    .unwrap_or(Value::String(c.arguments.clone())),
            });
        }
        self.batch_id += 1;
        let batch_id = self.batch_id;
        let context = self.execution_context();
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
            offered,
            context,
            executor,
            ctx.address().recipient(),
            deadline,
            span,
        );
    }

    fn finish(&mut self, outcome: TurnOutcome, ctx: &mut Context<Self>) {
        self.commit_turn(ctx, move |act, result, ctx| {
            let failed = result.is_err();
            if let Some(current) = act.current.take() {
                current.span.record("iterations", outcome.iterations);
                current.span.record("tool_calls", outcome.tool_calls.len());
                current
                    .span
                    .record("latency_ms", current.started.elapsed().as_millis() as u64);
                if result.is_ok() {
                    act.metrics.turns_completed.fetch_add(1, Ordering::Relaxed);
                    act.metrics.turn_latency.observe(current.started.elapsed());
                    current.emit(TurnEvent::TurnCompleted(Box::new(outcome.clone())));
                } else {
                    act.metrics.turns_failed.fetch_add(1, Ordering::Relaxed);
                }
                let _ = current
                    .reply
                    .send(result.map(|()| outcome).map_err(TurnError::from));
            }
            if failed {
                ctx.stop();
                return;
            }
            act.summarise_then_next(ctx);
        });
    }

    /// Updates the rolling summary if needed, then starts what is queued.
    fn summarise_then_next(&mut self, ctx: &mut Context<Self>) {
        let Some(request) = self.machine.summary_request() else {
            self.busy = false;
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
            act.busy = false;
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
        self.machine.abort_turn();
        self.batch_id += 1;
        let store_failed = matches!(error, TurnError::Store(_));
        self.commit_turn(ctx, move |act, result, ctx| {
            if let Some(current) = act.current.take() {
                act.metrics.turns_failed.fetch_add(1, Ordering::Relaxed);
                current.span.record("error.type", error.code().as_str());
                current
                    .span
                    .record("latency_ms", current.started.elapsed().as_millis() as u64);
                let _ = current.reply.send(Err(error));
            }
            if store_failed || result.is_err() {
                ctx.stop();
                return;
            }
            act.busy = false;
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
        // Only a turn running or waiting makes the session busy: after the
        // answer went out, the summary call or an operator's message does not.
        let turn_pending =
            self.current.is_some() || self.queue.iter().any(|p| matches!(p, Pending::Turn { .. }));
        if turn_pending && self.agent.multitask == Multitask::Reject {
            return Err(TurnError::Busy);
        }
        let queued = self
            .queue
            .iter()
            .filter(|p| matches!(p, Pending::Turn { .. }))
            .count();
        if self.busy && queued >= self.max_queued_turns {
            return Err(TurnError::QueueFull {
                max: self.max_queued_turns,
            });
        }
        let (tx, rx) = oneshot::channel();
        self.queue.push_back(Pending::Turn {
            content: msg.content,
            settings: msg.settings,
            events: msg.events,
            reply: tx,
        });
        self.start_next(ctx);
        Ok(AcceptedTurn(rx))
    }
}

impl Handler<RecordMessage> for Conversation {
    type Result = ResponseFuture<Result<u64, TurnError>>;

    fn handle(&mut self, msg: RecordMessage, ctx: &mut Context<Self>) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.queue.push_back(Pending::Record {
            message: msg.message,
            reply: tx,
        });
        self.start_next(ctx);
        Box::pin(async move { rx.await.unwrap_or(Err(TurnError::Unavailable)) })
    }
}

impl Handler<Retire> for Conversation {
    type Result = ResponseFuture<Result<(), TurnError>>;

    fn handle(&mut self, _: Retire, ctx: &mut Context<Self>) -> Self::Result {
        self.drop_abandoned();
        if self.busy || self.current.is_some() || !self.queue.is_empty() {
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
        let n = report.outcomes.len();
        let step = match self.machine.on_tool_results(report.outcomes) {
            Ok(step) => step,
            Err(e) => return self.out_of_step(e, ctx),
        };
        let calls = self.machine.turn_calls();
        for call in &calls[calls.len().saturating_sub(n)..] {
            self.emit(TurnEvent::ToolCallCompleted { call: call.clone() });
        }
        self.perform(step, ctx);
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
        self.addr
            .send(UserTurn {
                content,
                settings,
                events,
            })
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
}

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
