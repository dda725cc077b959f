//! The WorkflowRunner actor: one per running run; performs what its
//! [`Scheduler`] decides.
//!
//! started ──▶ scheduler.start ──▶ Step ──┬─▶ tasks: tokio tasks ──executor / sessions──▶ TaskDone ──▶ scheduler.on_outcome ──▶ Step ...
//!                                        └─▶ persist (put_doc) ─▶ watch (live state) ─▶ events
//!
//! - Tool tasks go through the executor as `caller_type = workflow_node`
//!   with the run id as `workflow_id` and the node (`node` or `node[i]` for
//!   a map element) as `node_id`: they bypass the concurrency pool, still
//!   pass plan, rate limit and validation, and leave their call record.
//!   The node's `timeout_s` and `retries` become the call's timeout and
//!   retry budget, so the executor retries what may pass on a second try
//!   (timeouts, transient failures) and not what will not (validation).
//! - A tool task's call carries the idempotency key
//!   `workflow:<run>:<node or node[k]>:<attempts before>`: a task the stop
//!   cut runs again after a restart with the key it had (a cut task's
//!   attempts are not counted), so a tool that honours the key does not
//!   repeat its side effect; a task resumed after a failure gets a new one,
//!   and runs again.
//! - Tool and agent tasks carry the run's tenant: its calls are the
//!   tenant's records (and follow the tenant's cache policy), its sessions
//!   the tenant's sessions.
//! - Agent tasks run one turn through [`Sessions`]: a new session of the
//!   agent (tagged with the run and node in its metadata), or the session
//!   of the node named by `session`. `timeout_s` bounds each turn (a turn
//!   past it keeps running in its conversation, but the node no longer
//!   waits); `retries` re-sends after an unreachable or timed-out model,
//!   in a fresh session when the node's session is new.
//! - Tasks run as tokio tasks, not on the actor: a slow tool never delays
//!   the runner's bookkeeping, and outcomes come back as [`TaskDone`].
//! - Every step that changed something is written to the store before its
//!   events go out, before the live state moves on and before its tasks
//!   start (`ctx.wait` keeps writes in order): started nodes non-durably,
//!   finished nodes, elements and the run itself durably. So what the store
//!   says happened always precedes what happens, and a node's output is on
//!   disk before a node reading it starts. A failed write is logged and the
//!   run goes on; a restart then finds the last state that was written.
//!   Every write carries the run's fence ([`record::fenced`], the epoch
//!   this node claimed the run at): one refused because another node took
//!   the run over stops the runner at once, its tasks aborted and the
//!   step's tasks never started ([`crate::store::owners`]).
//! - A step that only moved map elements writes their rows and patches
//!   them into the live state; the run document is written (and the live
//!   state replaced) only when a node or the run changed
//!   ([`super::record`]), so an element costs the same at the 10th as at
//!   the 100,000th.
//! - Cancel (the run's [`CancellationToken`], fired by
//!   [`super::Workflows::cancel`]): the scheduler ends the run `cancelled`,
//!   the running tasks are aborted (a call already inside the executor or a
//!   conversation turn may still finish there; its outcome is ignored), and
//!   the final state is written like any other.
//! - At shutdown (the `stopping` flag) the runner stops without writing, so
//!   a run cut off by a stopping server is found `running` at the next
//!   start and resumed or marked interrupted there, never recorded as a
//!   failure it was not.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use jiff::Timestamp;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

use super::record;
use super::run::{WorkflowEvent, WorkflowEventKind, WorkflowRun};
use super::scheduler::{Outcome, Scheduler, Step, Task, Work};
use crate::conversation::{NewSession, Sessions};
use crate::error_code::PublicError;
use crate::executor::{Arguments, ExecuteTool, ExecutorHandle};
use crate::identity::Scope;
use crate::retry::Backoff;
use crate::store::{Store, StoreError};
use crate::tools::{CallerType, ErrorType, ExecutionContext, Plan};

/// Live runs: id -> the latest state (for readers and waiters) and the
/// token that cancels the run.
pub(super) type Live = Arc<Mutex<HashMap<String, LiveRun>>>;

#[derive(Clone)]
pub(super) struct LiveRun {
    pub state: watch::Receiver<WorkflowRun>,
    pub cancel: CancellationToken,
}

/// Waits between attempts of an agent node whose turn failed with a
/// retryable code: 0.2 s doubling, at most 64×.
const AGENT_RETRY: Backoff = Backoff::exact(Duration::from_millis(200), 6);

/// What a runner works with; shared by every run.
#[derive(Clone)]
pub(super) struct RunnerDeps {
    pub executor: ExecutorHandle,
    pub sessions: Sessions,
    pub store: Store,
    pub events: broadcast::Sender<WorkflowEvent>,
    pub live: Live,
    pub stopping: Arc<AtomicBool>,
}

pub(super) struct WorkflowRunner {
    scheduler: Scheduler,
    deps: RunnerDeps,
    state: watch::Sender<WorkflowRun>,
    plan: Plan,
    /// The tenant's result-cache policy for the run's tool calls.
    cache_ttl: Option<u64>,
    /// Fired to cancel the run.
    cancel: CancellationToken,
    /// The epoch this node claimed the run at: every write carries it
    /// ([`record::fenced`]), and a refused one stops the runner.
    epoch: u64,
    /// The running tasks, to abort on cancel.
    tasks: HashMap<(String, Option<usize>), AbortHandle>,
}

/// A task ended (after its retries).
#[derive(Message)]
#[rtype(result = "()")]
struct TaskDone {
    node: String,
    item: Option<usize>,
    outcome: Outcome,
}

impl WorkflowRunner {
    /// Starts the runner of `scheduler`'s run on `arbiter`; it publishes
    /// each state it persists into `state`.
    pub(super) fn launch(
        arbiter: &actix::dev::ArbiterHandle,
        scheduler: Scheduler,
        deps: RunnerDeps,
        state: watch::Sender<WorkflowRun>,
        cancel: CancellationToken,
        cache_ttl: Option<u64>,
        epoch: u64,
    ) {
        // The run's own plan (the lower of the workflow's and its
        // starter's entitlement), never above the workflow's.
        let plan = scheduler.run().plan.map_or(scheduler.workflow().plan, |p| {
            p.min(scheduler.workflow().plan)
        });
        WorkflowRunner::start_in_arbiter(arbiter, move |_| WorkflowRunner {
            scheduler,
            deps,
            state,
            plan,
            cache_ttl,
            cancel,
            epoch,
            tasks: HashMap::new(),
        });
    }

    fn shutting_down(&self) -> bool {
        self.deps.stopping.load(Ordering::SeqCst)
    }

    /// Persists what the step changed, then makes it visible (live state,
    /// events), then starts its tasks: a node is `running` in the store
    /// before its tool runs, and an output is stored (durably) before a
    /// node that reads it starts.
    fn apply(&mut self, step: Step, ctx: &mut Context<Self>) {
        if step.events.is_empty() && !step.finished {
            for task in step.tasks {
                self.spawn_task(task, ctx);
            }
            return;
        }
        let run = self.scheduler.run();
        let whole = step.changes_run();
        let ops = record::fenced(&run.id, self.epoch, record::ops(run, whole, &step.items));
        let store = self.deps.store.clone();
        let id = run.id.clone();
        let durable = step.durable;
        let Step {
            events,
            tasks,
            finished,
            items,
            ..
        } = step;
        let wakes = ops
            .iter()
            .any(|op| matches!(op, crate::store::WriteOp::PutDocsOnce { .. }));
        let write = async move {
            let written = store.write(ops, durable).await;
            if wakes && written.is_ok() {
                // The run's end carries its webhook event.
                crate::webhooks::wake();
            }
            written
        };
        ctx.wait(write.into_actor(self).map(move |written, act, ctx| {
            if act.shutting_down() {
                ctx.stop();
                return;
            }
            match written {
                // Another node took the run over (this one was paused or
                // cut off past its heartbeat): it has the truth. Nothing
                // more is written, published or started here.
                Err(e @ StoreError::RunFenced { .. }) => {
                    tracing::warn!(run = %id, error = %e, "workflow run taken over by another node: its runner here stops");
                    act.deps.live.lock().expect("live runs lock").remove(&id);
                    for (_, task) in act.tasks.drain() {
                        task.abort();
                    }
                    ctx.stop();
                    return;
                }
                Err(e) => tracing::error!(run = %id, error = %e, "workflow run state not stored"),
                Ok(()) => {}
            }
            // A finished run leaves the live runs before its final state
            // wakes its waiters: one that resumes it at once finds it over.
            if finished {
                act.deps.live.lock().expect("live runs lock").remove(&id);
            }
            let run = act.scheduler.run();
            if whole {
                act.state.send_replace(run.clone());
            } else {
                act.state
                    .send_if_modified(|live| patch_items(live, run, &items));
            }
            for kind in events {
                let _ = act.deps.events.send(WorkflowEvent {
                    run_id: id.clone(),
                    at: Timestamp::now(),
                    kind,
                });
            }
            for task in tasks {
                act.spawn_task(task, ctx);
            }
            if finished {
                for (_, task) in act.tasks.drain() {
                    task.abort();
                }
                ctx.stop();
            }
        }));
    }

    fn spawn_task(&mut self, task: Task, ctx: &mut Context<Self>) {
        let addr = ctx.address();
        let run = self.scheduler.run();
        let node = run.nodes.get(&task.node);
        let tries_before = match task.item {
            None => node.map(|n| n.attempts),
            Some(k) => node
                .and_then(|n| n.items.as_ref())
                .and_then(|items| items.get(k))
                .map(|i| i.attempts),
        }
        .unwrap_or(0);
        let performer = Performer {
            tries_before,
            executor: self.deps.executor.clone(),
            sessions: self.deps.sessions.clone(),
            run_id: run.id.clone(),
            workflow: run.workflow.clone(),
            tenant: run.tenant.clone(),
            user_id: run.user_id.clone(),
            plan: self.plan,
            cache_ttl: self.cache_ttl,
        };
        let key = (task.node.clone(), task.item);
        let handle = tokio::spawn(async move {
            let (node, item) = (task.node.clone(), task.item);
            let outcome = performer.perform(task).await;
            addr.do_send(TaskDone {
                node,
                item,
                outcome,
            });
        });
        self.tasks.insert(key, handle.abort_handle());
    }
}

impl Actor for WorkflowRunner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let cancel = self.cancel.clone();
        ctx.spawn(
            async move { cancel.cancelled().await }
                .into_actor(self)
                .map(|_, act, ctx| {
                    let step = act.scheduler.cancel(Timestamp::now());
                    act.apply(step, ctx);
                }),
        );
        let step = if self.cancel.is_cancelled() {
            self.scheduler.cancel(Timestamp::now())
        } else {
            self.scheduler.start(Timestamp::now())
        };
        self.apply(step, ctx);
    }
}

impl Handler<TaskDone> for WorkflowRunner {
    type Result = ();

    fn handle(&mut self, msg: TaskDone, ctx: &mut Context<Self>) {
        // At shutdown the executor and conversations go away under running
        // tasks: their failures say nothing about the run.
        if self.shutting_down() {
            ctx.stop();
            return;
        }
        self.tasks.remove(&(msg.node.clone(), msg.item));
        let step = self
            .scheduler
            .on_outcome(&msg.node, msg.item, msg.outcome, Timestamp::now());
        self.apply(step, ctx);
    }
}

/// Performs one task; lives in the task's tokio task.
struct Performer {
    /// The task's attempts recorded before this one (its idempotency key
    /// is the same for a retry of a cut task, new after a failure).
    tries_before: u32,
    executor: ExecutorHandle,
    sessions: Sessions,
    run_id: String,
    workflow: String,
    tenant: String,
    user_id: Option<String>,
    plan: Plan,
    cache_ttl: Option<u64>,
}

impl Performer {
    async fn perform(&self, task: Task) -> Outcome {
        let node = match task.item {
            Some(k) => format!("{}[{k}]", task.node),
            None => task.node.clone(),
        };
        match task.work {
            Work::Tool { tool, params } => {
                self.tool(&node, &tool, params, task.timeout, task.retries)
                    .await
            }
            Work::Agent {
                agent,
                prompt,
                session,
            } => {
                self.agent(&node, &agent, prompt, session, task.timeout, task.retries)
                    .await
            }
        }
    }

    async fn tool(
        &self,
        node: &str,
        tool: &str,
        params: Value,
        timeout: Option<Duration>,
        retries: u32,
    ) -> Outcome {
        let mut ctx = ExecutionContext::new(
            CallerType::WorkflowNode,
            format!("workflow:{}/{node}", self.workflow),
        );
        ctx.workflow_id = Some(self.run_id.clone());
        ctx.node_id = Some(node.to_string());
        ctx.user_id = self.user_id.clone();
        ctx.tenant = Some(self.tenant.clone());
        ctx.cache_ttl = self.cache_ttl;
        ctx.plan = self.plan;
        ctx.timeout = timeout;
        ctx.max_retries = retries;
        ctx.idempotency_key = Some(format!(
            "workflow:{}:{node}:{}",
            self.run_id, self.tries_before
        ));
        let result = self
            .executor
            .execute(ExecuteTool::new(tool, Arguments::Json(params), ctx))
            .await;
        let attempts = result.metadata.attempts.max(1);
        if result.is_success {
            Outcome::Succeeded {
                output: result.output.unwrap_or(Value::Null),
                attempts,
                session_id: None,
            }
        } else {
            let kind = result
                .error_type
                .map_or(ErrorType::ExecutionError.as_str(), ErrorType::as_str);
            Outcome::Failed {
                error: format!("{kind}: {}", result.error.unwrap_or_default()),
                attempts,
                session_id: None,
            }
        }
    }

    async fn agent(
        &self,
        node: &str,
        agent: &str,
        prompt: String,
        session: Option<String>,
        timeout: Option<Duration>,
        retries: u32,
    ) -> Outcome {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let session_id = match &session {
                Some(id) => id.clone(),
                None => {
                    let created = self
                        .sessions
                        .create(NewSession {
                            tenant: self.tenant.clone(),
                            agent: agent.to_string(),
                            user_id: self.user_id.clone(),
                            plan: self.plan,
                            metadata: json!({"workflow_id": self.run_id, "node_id": node}),
                        })
                        .await;
                    match created {
                        Ok(s) => s.id,
                        Err(e) => {
                            return Outcome::Failed {
                                error: format!("cannot start a session of agent '{agent}': {e}"),
                                attempts,
                                session_id: None,
                            };
                        }
                    }
                }
            };
            let scope = Scope::tenant(self.tenant.clone());
            let turn = self
                .sessions
                .send_message(&scope, &session_id, prompt.clone(), None);
            let result = match timeout {
                Some(limit) => tokio::time::timeout(limit, turn).await.map_err(|_| limit),
                None => Ok(turn.await),
            };
            let (error, retryable) = match result {
                Ok(Ok(outcome)) => {
                    // A typed answer is the node's output as JSON, so
                    // later nodes read its fields (`{{nodes.x.output.symbol}}`).
                    return Outcome::Succeeded {
                        output: outcome.output.unwrap_or(Value::String(outcome.answer)),
                        attempts,
                        session_id: Some(session_id),
                    };
                }
                Ok(Err(e)) => (e.to_string(), e.code().is_retryable()),
                Err(limit) => (
                    format!("the turn did not finish within {} ms", limit.as_millis()),
                    true,
                ),
            };
            if !retryable || attempts > retries {
                return Outcome::Failed {
                    error,
                    attempts,
                    session_id: Some(session_id),
                };
            }
            let delay = AGENT_RETRY.delay(attempts);
            tokio::time::sleep(delay).await;
        }
    }
}

/// Copies the elements `items` of `run` into the live state `live`.
fn patch_items(live: &mut WorkflowRun, run: &WorkflowRun, items: &[(String, usize)]) -> bool {
    for (node, k) in items {
        let from = run
            .nodes
            .get(node)
            .and_then(|n| n.items.as_ref())
            .and_then(|i| i.get(*k));
        let to = live
            .nodes
            .get_mut(node)
            .and_then(|n| n.items.as_mut())
            .and_then(|i| i.get_mut(*k));
        if let (Some(from), Some(to)) = (from, to) {
            *to = from.clone();
        }
    }
    !items.is_empty()
}

/// The event a run publishes when it (re)starts.
pub(super) fn run_started(run: &WorkflowRun) -> WorkflowEvent {
    WorkflowEvent {
        run_id: run.id.clone(),
        at: Timestamp::now(),
        kind: WorkflowEventKind::RunStarted {
            workflow: run.workflow.clone(),
        },
    }
}
