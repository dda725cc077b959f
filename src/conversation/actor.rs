//! The Conversation actor: one per live session; performs the IO its
//! [`ConversationMachine`] asks for.
//!
//! UserTurn ─▶ queue ─▶ machine.start_turn ─▶ [persist] ─▶ model ─▶ machine ─▶ ToolSubAgent
//!                                                                 ◀── ToolBatchReport ──┘
//!            ◀── reply (after one durable commit) ◀── Finish ◀── machine ◀──┘
//!
//! Turns are serialised: a `UserTurn` arriving during a turn waits in the
//! actor's queue (in arrival order). The actor never blocks on IO: the model
//! call, store writes and the tool batch run as spawned futures or actors, so
//! the mailbox stays free for reports. Each step's messages are written
//! non-durably as the turn goes; the final answer is written durably, which
//! also makes the steps before it durable, and only then is the turn
//! acknowledged. A turn that fails (model down, store error) flushes what it
//! wrote and reports the error; its messages stay in the history.

use std::collections::VecDeque;
use std::sync::Arc;

use actix::prelude::*;
use jiff::Timestamp;
use tokio::sync::oneshot;

use super::machine::{Action, ConversationMachine, Step, TurnOutcome};
use crate::config::Agent;
use crate::executor::ExecutorHandle;
use crate::model::ModelError;
use crate::store::{Session, Store, StoreError, StoredMessage, WriteOp};
use crate::tools::subagent::{ToolBatchReport, ToolSubAgent};
use crate::tools::{CallerType, ExecutionContext};

/// Why a turn did not produce an answer.
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("the turn could not be stored: {0}")]
    Store(#[from] StoreError),
    /// The conversation actor could not be reached (it stopped).
    #[error("the conversation is unavailable")]
    Unavailable,
}

/// Run one turn with this user message.
#[derive(Message)]
#[rtype(result = "Result<TurnOutcome, TurnError>")]
pub struct UserTurn {
    pub content: String,
}

type Reply = oneshot::Sender<Result<TurnOutcome, TurnError>>;

pub struct Conversation {
    session: Session,
    agent: Arc<Agent>,
    store: Store,
    executor: ExecutorHandle,
    machine: ConversationMachine,
    next_seq: u64,
    current: Option<Reply>,
    queue: VecDeque<(String, Reply)>,
    /// Id of the tool batch the current turn waits for; reports of other
    /// batches (from a turn that already failed) are ignored.
    batch_id: u64,
}

impl Actor for Conversation {
    type Context = Context<Self>;

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        for (_, reply) in self.queue.drain(..) {
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
        last_seq: u64,
    ) -> Self {
        Conversation {
            session,
            agent,
            store,
            executor,
            machine,
            next_seq: last_seq + 1,
            current: None,
            queue: VecDeque::new(),
            batch_id: 0,
        }
    }

    fn start_next(&mut self, ctx: &mut Context<Self>) {
        if self.current.is_some() {
            return;
        }
        let Some((content, reply)) = self.queue.pop_front() else {
            return;
        };
        self.current = Some(reply);
        let step = self.machine.start_turn(content);
        self.perform(step, ctx);
    }

    fn persist_ops(&mut self, messages: Vec<crate::model::ChatMessage>) -> Vec<WriteOp> {
        if messages.is_empty() {
            return Vec::new();
        }
        let now = Timestamp::now();
        let stored = messages
            .into_iter()
            .map(|message| {
                let seq = self.next_seq;
                self.next_seq += 1;
                StoredMessage {
                    seq,
                    message,
                    created_at: now,
                }
            })
            .collect();
        vec![WriteOp::AppendMessages {
            session_id: self.session.id.clone(),
            messages: stored,
        }]
    }

    fn perform(&mut self, step: Step, ctx: &mut Context<Self>) {
        let ops = self.persist_ops(step.persist);
        let store = self.store.clone();
        match step.action {
            Action::CallModel(request) => {
                let model = self.agent.model.clone();
                let io = async move {
                    if !ops.is_empty() {
                        store.write(ops, false).await?;
                    }
                    Ok::<_, TurnError>(model.complete(request).await?)
                };
                ctx.spawn(io.into_actor(self).map(|result, act, ctx| match result {
                    Ok(reply) => {
                        let step = act.machine.on_model_reply(reply);
                        act.perform(step, ctx);
                    }
                    Err(e) => act.fail(e, ctx),
                }));
            }
            Action::RunTools(calls) => {
                self.batch_id += 1;
                let batch_id = self.batch_id;
                let context = self.execution_context();
                let executor = self.executor.clone();
                let deadline = self.agent.tool_batch_timeout;
                let io = async move { store.write(ops, false).await };
                ctx.spawn(
                    io.into_actor(self)
                        .map(move |result, act, ctx| match result {
                            Ok(()) => ToolSubAgent::spawn(
                                batch_id,
                                calls,
                                context,
                                executor,
                                ctx.address().recipient(),
                                deadline,
                            ),
                            Err(e) => act.fail(e.into(), ctx),
                        }),
                );
            }
            Action::Finish(outcome) => {
                let io = async move { store.write(ops, true).await };
                ctx.spawn(io.into_actor(self).map(move |result, act, ctx| {
                    if let Some(reply) = act.current.take() {
                        let _ = reply.send(result.map(|()| outcome).map_err(TurnError::from));
                    }
                    act.start_next(ctx);
                }));
            }
        }
    }

    fn fail(&mut self, error: TurnError, ctx: &mut Context<Self>) {
        tracing::warn!(session = %self.session.id, error = %error, "turn failed");
        self.machine.abort_turn();
        self.batch_id += 1;
        let store = self.store.clone();
        ctx.spawn(
            async move { store.flush().await }
                .into_actor(self)
                .map(move |_, act, ctx| {
                    if let Some(reply) = act.current.take() {
                        let _ = reply.send(Err(error));
                    }
                    act.start_next(ctx);
                }),
        );
    }

    fn execution_context(&self) -> ExecutionContext {
        let mut c = ExecutionContext::new(CallerType::ConversationAgent, self.session.id.clone());
        c.conversation_id = Some(self.session.id.clone());
        c.user_id = self.session.user_id.clone();
        c.plan = self.session.plan;
        c.variables = self.agent.variables.clone();
        c
    }
}

impl Handler<UserTurn> for Conversation {
    type Result = ResponseFuture<Result<TurnOutcome, TurnError>>;

    fn handle(&mut self, msg: UserTurn, ctx: &mut Context<Self>) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.queue.push_back((msg.content, tx));
        self.start_next(ctx);
        Box::pin(async move { rx.await.unwrap_or(Err(TurnError::Unavailable)) })
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
        let step = self.machine.on_tool_results(report.outcomes);
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

    pub async fn turn(&self, content: String) -> Result<TurnOutcome, TurnError> {
        self.addr
            .send(UserTurn { content })
            .await
            .unwrap_or(Err(TurnError::Unavailable))
    }

    pub fn is_alive(&self) -> bool {
        self.addr.connected()
    }
}
