//! Executor: the one gate every tool call passes.
//!
//! sub-agent / workflow / HTTP ──ExecuteTool──▶ executor ──▶ handler (spawned task, panics caught)
//!            ▲                                   │
//!            └──────── ToolExecutionResult ──────┘
//!
//! The pipeline, in order (each refusal is a typed outcome, never a crash):
//! 0. the agent's boundary: a call from a conversation turn names a tool the
//!    turn offered the model, or it is refused (`TOOL_NOT_OFFERED`) before
//!    anything else, unknown names included (a model, or a prompt injection
//!    it obeys, can only call what its agent was offered; an agent with no
//!    tools runs none). Callers with the key's own rights (direct invoke,
//!    workflow tool nodes, MCP `tools/call`) leave `offered` unset.
//! 1. lookup (`TOOL_NOT_FOUND`)
//! 2. plan (`TOOL_PLAN_REQUIRED`, naming the plan needed)
//! 3. rate limit per user and tool: minute, hour, day ([`limits`]; `RATE_LIMITED`
//!    with `retry_after_ms`)
//! 4. validation against the tool's schema, defaults filled (`VALIDATION_ERROR`)
//! 5. cache ([`cache`]; a hit has `metadata.cached = true`)
//! 6. confirmation ([`confirmations`]): a `require_confirmation` tool does not
//!    run; the call is stored and `CONFIRMATION_REQUIRED` returned
//! 7. concurrency admission ([`concurrency`]; `TOOL_QUEUE_FULL`, `TOOL_TIMEOUT`), fair
//!    between tenants (a share of the pool and queue each, round-robin);
//!    workflow-node callers bypass it and are not counted
//! 8. intent, then run: a call of an `at_most_once` tool ([`SideEffects`])
//!    that has an idempotency key first commits a [`CallIntent`] under that
//!    key, durably (approved confirmations included); if it cannot be
//!    written the call fails (`TOOL_EXECUTION_ERROR`) and the tool does not run
//!    (a resumed turn that finds an intent and no record knows the call may
//!    have acted: [`call_intent`]). Then the tool runs with timeout and
//!    retries (exponential backoff with jitter, only for retryable
//!    failures: timeouts, transient errors; the same idempotency key on
//!    every attempt, and no second intent); a handler's
//!    `InvalidInput` is reported as `VALIDATION_ERROR` (the caller's input
//!    is wrong), its other failures and panics as `TOOL_EXECUTION_ERROR`
//! 9. cache store, one `ToolCallRecord`, and an execution event. An output
//!    nested deeper than [`MAX_OUTPUT_DEPTH`] fails the call instead (it
//!    could be stored but never read back), and so does an upstream's
//!    (tool file command or URL, MCP server) over
//!    [`MAX_UPSTREAM_OUTPUT_BYTES`]; error texts are cut to
//!    [`MAX_ERROR_CHARS`].
//!
//! Steps 0-2 and validation's check are cheap and run inside the actor;
//! the rest runs in the reply future: the rate limits (step 3) through the
//! [`limits::WindowStore`] seam, async because cluster mode's windows are
//! asked over the network (never from inside the actor), then validation's
//! verdict, so a call with bad arguments spends its cells as any other, on
//! one node and on many. The tool body runs in a spawned tokio task, so a
//! slow tool never stalls admission and a panicking one fails only its own
//! call (`TOOL_EXECUTION_ERROR`); a built-in that only computes and is
//! bounded by its schema (`calculator`, `echo`:
//! [`crate::tools::ToolHandler::runs_inline`]) runs in place, its panic
//! caught the same way. There is one executor actor per arbiter: a call
//! made on a conversation's arbiter is admitted by the executor of that
//! thread, everyone else's by the executor's own arbiter
//! ([`ExecutorHandle::start`]); they share every handle, so which one
//! admits a call is not observable. The actor runs under an actix `Supervisor`: if
//! admission itself panics, the caller gets an `TOOL_EXECUTION_ERROR` and the
//! actor stops so the supervisor restarts it; limits, pool and cache live in
//! shared handles and survive the restart. Callers reach it through
//! [`ExecutorHandle`], which turns an unreachable executor into an
//! `TOOL_EXECUTION_ERROR` outcome, never a hang.
//!
//! Records: calls from conversations are written non-durably and made
//! durable by the turn's single fsync before the turn is acknowledged; every
//! other caller's record is durable before the reply, and so is an approved
//! call's (its turn resumes from the record, after a restart too).
//!
//! Intents ([`CALL_INTENTS`]) are keyed by the call's idempotency key, owned
//! by its tenant and linked to its session, so erasing the session erases
//! them. Retries within the call write nothing more: the intent says the
//! call started, not how often.
//! Owns: admission, retries, call records. Does not: talk to the model.

pub mod cache;
pub mod concurrency;
pub mod confirmations;
pub mod guarded;
pub mod limits;

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::FutureExt;
use serde_json::{Value, json};
use tracing::Instrument;

use crate::error_code::PublicError;
use crate::events::{EventBus, EventKind};
use crate::guardrails::Stage;
use crate::retry::Backoff;
use crate::store::{Store, StoreError, ToolCallRecord, WriteOp};
use crate::tenants::TenantConfig;
use crate::tools::outcome::{
    ArgumentsProblem, MAX_ARGUMENT_DEPTH, MAX_ERROR_CHARS, MAX_OUTPUT_DEPTH,
    MAX_UPSTREAM_OUTPUT_BYTES, ParsedArguments, cut_chars, json_depth, kept_arguments,
};
use crate::tools::{
    CallerType, ErrorType, ExecutionContext, RateLimit, RegisteredTool, SideEffects, ToolError,
    ToolExecutionResult, ToolRegistry,
};
use cache::ResultCache;
use concurrency::{AdmissionRequest, ConcurrencyController};
use confirmations::Confirmations;
use limits::{LimitRefusal, WindowStore};

/// The store namespace of [`CallIntent`]s, keyed by idempotency key.
pub const CALL_INTENTS: &str = "call_intents";

/// What cadre committed before running an `at_most_once` call: that it
/// was about to run. Found with no call record, it means the call may have
/// acted and must not run again.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CallIntent {
    pub tool: String,
    pub tool_call_id: Option<String>,
    pub turn_id: Option<String>,
    pub conversation_id: Option<String>,
    pub created_at: jiff::Timestamp,
}

/// The intent committed under idempotency key `key`, if any.
pub async fn call_intent(store: &Store, key: &str) -> Result<Option<CallIntent>, StoreError> {
    match store.get_doc(CALL_INTENTS, key).await? {
        Some(doc) => Ok(Some(serde_json::from_value(doc)?)),
        None => Ok(None),
    }
}

/// Commits `msg`'s intent under `key`, durably: owned by its tenant, and
/// linked to its session (erased with it) when it has one.
async fn commit_intent(store: &Store, msg: &ExecuteTool, key: &str) -> Result<(), StoreError> {
    let intent = CallIntent {
        tool: msg.tool_name.clone(),
        tool_call_id: msg.tool_call_id.clone(),
        turn_id: msg.ctx.turn_id.clone(),
        conversation_id: msg.ctx.conversation_id.clone(),
        created_at: jiff::Timestamp::now(),
    };
    let value = serde_json::to_value(&intent)?;
    let tenant = msg
        .ctx
        .tenant
        .as_deref()
        .unwrap_or(crate::identity::DEFAULT_TENANT);
    match msg.ctx.conversation_id.as_deref() {
        // Written through the conversation's session writer: in a cluster
        // the intent is written only while the conversation still holds
        // its session, so of two nodes that both believe they run a turn
        // (one about to learn it lost it), one commits the intent and runs
        // the call; the other is refused and runs nothing, and a resume
        // that looks after the takeover sees the intent.
        Some(session) => {
            let ops = vec![
                WriteOp::PutDoc {
                    namespace: CALL_INTENTS.into(),
                    key: key.into(),
                    value,
                    tenant: Some(tenant.into()),
                },
                WriteOp::LinkDoc {
                    namespace: CALL_INTENTS.into(),
                    key: key.into(),
                    session_id: session.into(),
                },
            ];
            let ops = match &msg.ctx.writer {
                Some(writer) => writer.fenced(ops),
                None => ops,
            };
            store.write(ops, true).await
        }
        None => {
            store
                .put_doc_of(CALL_INTENTS, tenant, key, value, true)
                .await
        }
    }
}

/// Executor-wide settings.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// Timeout when neither the context nor the tool sets one.
    pub default_timeout: Duration,
    /// First retry delay; doubles per attempt, with ±50 % jitter.
    pub retry_base_delay: Duration,
    /// How long a pending confirmation stays approvable.
    pub confirmation_ttl: Duration,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            default_timeout: Duration::from_secs(30),
            retry_base_delay: Duration::from_millis(100),
            confirmation_ttl: Duration::from_secs(600),
        }
    }
}

/// The arguments of a call: the model's, parsed once by the conversation
/// machine, or JSON from an API caller.
#[derive(Debug, Clone)]
pub enum Arguments {
    Parsed(ParsedArguments),
    Json(Value),
}

/// Run one tool call.
#[derive(Message)]
#[rtype(result = "ToolExecutionResult")]
pub struct ExecuteTool {
    pub tool_name: String,
    pub arguments: Arguments,
    /// The model's id for this call, kept in the record.
    pub tool_call_id: Option<String>,
    pub ctx: ExecutionContext,
    /// Set when a person approved this call: plan, rate limit and the
    /// confirmation step were passed when it was first made.
    pub confirmed: bool,
    /// The tools the caller's turn offered the model (registry names);
    /// `Some`: any other name is refused as `TOOL_NOT_OFFERED`.
    pub offered: Option<Arc<[String]>>,
    /// The caller's span for this call (a turn's tool batch, a workflow
    /// node); the executor's `execute_tool` span is its child.
    pub span: tracing::Span,
    /// The tenant's ceiling for this tool, read from its config by
    /// [`ExecutorHandle::execute`] before admission (admission itself
    /// stays synchronous in the actor).
    tenant_quota: Option<RateLimit>,
    /// The id its call record is written under, when it is not new: the
    /// held call's for an approved one (its outcome rewrites the
    /// `CONFIRMATION_REQUIRED` record, so the call is one record, counted
    /// once). `None`: a new time-ordered id when the record is written.
    record_id: Option<String>,
    /// The calling turn's guardrails: its `tool_input` and `tool_output`
    /// stages run here ([`guarded`]). Empty for other callers.
    pub guardrails: crate::guardrails::Guardrails,
}

impl ExecuteTool {
    pub fn new(tool_name: &str, arguments: Arguments, ctx: ExecutionContext) -> Self {
        ExecuteTool {
            tool_name: tool_name.into(),
            arguments,
            tool_call_id: None,
            ctx,
            confirmed: false,
            offered: None,
            span: tracing::Span::current(),
            tenant_quota: None,
            record_id: None,
            guardrails: Default::default(),
        }
    }
}

/// What deciding a confirmation did ([`ExecutorHandle::decide_confirmation`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct DecisionOutcome {
    pub confirmation_id: String,
    /// `denied`, `executed` or `failed`.
    pub status: &'static str,
    /// On deny: the tool that was not run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    /// On approve: the held call's result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<ToolExecutionResult>,
}

/// The parts of the executor that outlive an actor restart and that the
/// HTTP layer reads (limits, metrics).
#[derive(Clone)]
pub struct ExecutorShared {
    pub registry: ToolRegistry,
    pub store: Store,
    /// Per user and tool ([`limits::RateLimiter`] on one node, windows
    /// every node shares in cluster mode).
    pub limiter: Arc<dyn WindowStore>,
    /// Tenant-wide ceilings (`tool_quotas` of a tenant's config), keyed by
    /// tenant and tool.
    pub tenant_limiter: Arc<dyn WindowStore>,
    pub concurrency: Arc<ConcurrencyController>,
    pub cache: ResultCache,
    pub confirmations: Confirmations,
    pub events: EventBus,
    pub config: ExecutorConfig,
    /// How often the supervisor restarted the actor.
    pub restarts: Arc<AtomicU64>,
    pub metrics: Arc<crate::metrics::Metrics>,
}

struct Executor {
    shared: ExecutorShared,
    /// Set for an executor beside conversations: the thread of its
    /// arbiter, learnt when it starts, so [`ExecutorHandle::execute`] can
    /// send a call to the executor of the thread it is made on.
    thread: Option<Arc<OnceLock<ThreadId>>>,
}

impl Actor for Executor {
    type Context = Context<Self>;

    fn started(&mut self, _ctx: &mut Context<Self>) {
        if let Some(slot) = &self.thread {
            // Set once: a supervisor's restart starts it on the same arbiter.
            let _ = slot.set(std::thread::current().id());
        }
    }
}

impl Supervised for Executor {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        let n = self.shared.restarts.fetch_add(1, Ordering::Relaxed) + 1;
        tracing::warn!(restarts = n, "executor restarting");
    }
}

/// Fault injection: makes admission panic, as a bug in it would, to prove
/// the supervisor's restart. Used by tests; harmless anywhere else.
#[doc(hidden)]
#[derive(Message)]
#[rtype(result = "Result<(), String>")]
pub struct InjectFault;

impl Handler<InjectFault> for Executor {
    type Result = Result<(), String>;

    fn handle(&mut self, _: InjectFault, ctx: &mut Context<Self>) -> Self::Result {
        let outcome: Option<()> = self.guarded(ctx, || panic!("injected executor fault"));
        outcome.ok_or_else(|| "the executor panicked and is restarting".into())
    }
}

/// What the actor's part of admission decided.
enum Admission {
    Refused(Box<ToolExecutionResult>, Value),
    /// Found and on the caller's plan: the rate limits decide next (in the
    /// reply future: a shared store is asked over the network), then what
    /// validation found here, reported only after the limits let the call
    /// through. A call the limits refuse is refused for its limit whatever
    /// its arguments, and has spent no cell when its arguments are bad only
    /// if a limit refused it first.
    Limits {
        tool: Arc<RegisteredTool>,
        raw_params: Value,
        validated: Result<Value, Invalid>,
    },
}

/// Arguments validation refused: the refusal, and the event it publishes
/// once reported.
struct Invalid {
    result: Box<ToolExecutionResult>,
    event: Option<EventKind>,
}

impl Executor {
    /// Runs `f`; on a panic, stops the actor so its supervisor restarts it.
    fn guarded<T>(&mut self, ctx: &mut Context<Self>, f: impl FnOnce() -> T) -> Option<T> {
        match std::panic::catch_unwind(AssertUnwindSafe(f)) {
            Ok(v) => Some(v),
            Err(_) => {
                tracing::error!("executor panicked; stopping for a supervisor restart");
                ctx.stop();
                None
            }
        }
    }

    fn admit(&self, msg: &ExecuteTool) -> Admission {
        let s = &self.shared;
        // Too-deep arguments are kept as text (`ParsedArguments`): the
        // record of the refusal below must read back.
        let (raw_params, too_deep) = match &msg.arguments {
            Arguments::Json(v) => kept_arguments(v),
            Arguments::Parsed(p) => (
                p.value.clone(),
                p.problem == Some(ArgumentsProblem::TooDeep),
            ),
        };
        let name = msg.tool_name.as_str();
        if !msg.confirmed
            && let Some(offered) = &msg.offered
            && !offered.iter().any(|o| o == name)
        {
            let result = ToolExecutionResult::failure(
                name,
                ErrorType::ToolNotOffered,
                if offered.is_empty() {
                    format!("'{name}' was not offered: this agent has no tools")
                } else {
                    format!(
                        "'{name}' was not offered in this turn; the tools offered are: {}",
                        offered.join(", ")
                    )
                },
            );
            return Admission::Refused(Box::new(result), raw_params);
        }
        // A turn's offered calls may name its agent's `ask_` tools, which
        // nothing else reaches (not in the catalog: `tools::delegate`).
        let tool = match msg.offered {
            Some(_) => s.registry.agent_tool(name).or_else(|| s.registry.get(name)),
            None => s.registry.get(name),
        };
        let Some(tool) = tool else {
            let result = ToolExecutionResult::failure(
                name,
                ErrorType::ToolNotFound,
                format!("no tool named '{name}'"),
            );
            return Admission::Refused(Box::new(result), raw_params);
        };
        let def = &tool.definition;
        if !msg.confirmed && def.required_plan > msg.ctx.plan {
            let needed = def.required_plan.as_str();
            let result = ToolExecutionResult::failure(
                name,
                ErrorType::PlanRequired,
                format!(
                    "{name} requires the {needed} plan; the caller is on the {} plan. Upgrade to {needed} to use it.",
                    msg.ctx.plan.as_str()
                ),
            );
            return Admission::Refused(Box::new(result), raw_params);
        }
        let refused = |result: ToolExecutionResult, event| Invalid {
            result: Box::new(result),
            event,
        };
        let validated = if too_deep {
            Err(refused(
                ToolExecutionResult::failure(
                    name,
                    ErrorType::ValidationError,
                    format!(
                        "invalid arguments for {name}: nested more than {MAX_ARGUMENT_DEPTH} levels deep"
                    ),
                ),
                None,
            ))
        } else {
            match &msg.arguments {
                Arguments::Parsed(p) => tool.validator.validate_parsed(p),
                Arguments::Json(v) => tool.validator.validate(v.clone()),
            }
            .map_err(|errors| {
                let summary = crate::tools::validate::describe_errors(&errors, "; ");
                let event = EventKind::ValidationError {
                    tool: name.into(),
                    fields: errors.iter().map(|e| e.field.clone()).collect(),
                };
                let mut result = ToolExecutionResult::failure(
                    name,
                    ErrorType::ValidationError,
                    format!("invalid arguments for {name}: {summary}"),
                );
                result.validation_errors = errors;
                refused(result, Some(event))
            })
        };
        Admission::Limits {
            tool,
            raw_params,
            validated,
        }
    }
}

impl Handler<ExecuteTool> for Executor {
    type Result = ResponseFuture<ToolExecutionResult>;

    fn handle(&mut self, msg: ExecuteTool, ctx: &mut Context<Self>) -> Self::Result {
        let started = Instant::now();
        let admitted = {
            let this = &*self;
            let msg = &msg;
            std::panic::catch_unwind(AssertUnwindSafe(|| this.admit(msg)))
        };
        let admission = match admitted {
            Ok(a) => a,
            Err(_) => {
                tracing::error!(tool = %msg.tool_name, "executor admission panicked; restarting");
                ctx.stop();
                let result = ToolExecutionResult::failure(
                    &msg.tool_name,
                    ErrorType::ExecutionError,
                    "the executor failed while admitting this call and was restarted",
                );
                return Box::pin(std::future::ready(result));
            }
        };
        let shared = self.shared.clone();
        let span = tracing::info_span!(
            parent: &msg.span,
            "execute_tool",
            otel.name = %format_args!("execute_tool {}", msg.tool_name),
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = %msg.tool_name,
            gen_ai.tool.type = "function",
            gen_ai.tool.call.id = msg.tool_call_id.as_deref().unwrap_or(""),
            cadre.caller_type = msg.ctx.caller_type.as_str(),
            cadre.session = msg.ctx.conversation_id.as_deref().unwrap_or(""),
            cadre.workflow = msg.ctx.workflow_id.as_deref().unwrap_or(""),
            cadre.tenant = msg.ctx.tenant.as_deref().unwrap_or(""),
            cadre.source_id = tracing::field::Empty,
            cadre.cached = tracing::field::Empty,
            error.type = tracing::field::Empty,
            latency_ms = tracing::field::Empty,
        );
        let record_to = span.clone();
        Box::pin(
            async move {
                shared.events.publish(EventKind::ExecutionStarted {
                    tool: msg.tool_name.clone(),
                    caller_type: msg.ctx.caller_type.as_str().into(),
                    conversation_id: msg.ctx.conversation_id.clone(),
                    workflow_id: msg.ctx.workflow_id.clone(),
                });
                let (result, params, intended, marks) = match admission {
                    Admission::Refused(result, params) => (*result, params, false, Vec::new()),
                    Admission::Limits {
                        tool,
                        raw_params,
                        validated,
                    } => match (rate_limits(&shared, &tool, &msg).await, validated) {
                        (Some(refused), _) => (refused, raw_params, false, Vec::new()),
                        (None, Err(invalid)) => {
                            if let Some(event) = invalid.event {
                                shared.events.publish(event);
                            }
                            (*invalid.result, raw_params, false, Vec::new())
                        }
                        (None, Ok(params)) => {
                            // An intent was committed for it: its outcome is
                            // made durable too, so a resume uses it instead of
                            // answering `TOOL_OUTCOME_UNKNOWN`.
                            let intended = tool.definition.side_effects == SideEffects::AtMostOnce
                                && msg.ctx.idempotency_key.is_some();
                            let mut marks = Vec::new();
                            let mut params = params;
                            let mut refused = None;
                            if msg.guardrails.has_stage(Stage::ToolInput) {
                                let checked =
                                    guarded::run(Stage::ToolInput, &msg, params, &shared).await;
                                marks.extend(guarded::marks(&checked.decisions));
                                if checked.tripped.is_some() {
                                    refused = Some(guarded::blocked(&msg.tool_name, &checked));
                                    params = Value::Null;
                                } else {
                                    params = checked.subject.into_json().unwrap_or(Value::Null);
                                }
                            }
                            let ran = refused.is_none();
                            let mut result = match refused {
                                Some(blocked) => blocked,
                                None => execute(&shared, &tool, &params, &msg).await,
                            };
                            if let Some(refusal) = unkept_output(&tool, &result) {
                                result = ToolExecutionResult::failure(
                                    &msg.tool_name,
                                    ErrorType::ExecutionError,
                                    format!(
                                        "{} answered {refusal}; it was not kept",
                                        msg.tool_name
                                    ),
                                );
                            }
                            if let Some(error) = &result.error
                                && error.chars().nth(MAX_ERROR_CHARS).is_some()
                            {
                                result.error = Some(cut_chars(error, MAX_ERROR_CHARS));
                            }
                            if let Some(id) = &result.metadata.source_id {
                                result.metadata.source_id = Some(tool.source.citable_source_id(
                                    &msg.tool_name,
                                    tool.definition.is_upstream(),
                                    id,
                                ));
                            }
                            if ran
                                && result.is_success
                                && msg.guardrails.has_stage(Stage::ToolOutput)
                                && let Some(output) = result.output.take()
                            {
                                let checked =
                                    guarded::run(Stage::ToolOutput, &msg, output, &shared).await;
                                marks.extend(guarded::marks(&checked.decisions));
                                if checked.tripped.is_some() {
                                    let mut blocked = guarded::blocked(&msg.tool_name, &checked);
                                    blocked.metadata.attempts = result.metadata.attempts;
                                    blocked.metadata.started_at = result.metadata.started_at;
                                    result = blocked;
                                } else {
                                    result.output = checked.subject.into_json();
                                }
                            }
                            (result, params, intended, marks)
                        }
                    },
                };
                let attempts = result.metadata.attempts;
                let mut result = result.with_elapsed(started.elapsed(), attempts);
                // The id the record is written under goes back with the
                // outcome (a held call's, or an approved one's, is the
                // held record's; else a new time-ordered one), and whether
                // the record's params are the caller's arguments as given:
                // a turn record then names the record instead of repeating
                // them (`conversation::turn_rows`).
                result.metadata.record_id = Some(
                    msg.record_id
                        .clone()
                        .or_else(|| result.metadata.record_id.take())
                        .unwrap_or_else(|| uuid::Uuid::now_v7().to_string()),
                );
                result.metadata.params_recorded = match &msg.arguments {
                    Arguments::Parsed(p) => p.value == params,
                    Arguments::Json(v) => *v == params,
                };
                record_to.record("latency_ms", result.execution_time_ms);
                record_to.record("cadre.cached", result.metadata.cached);
                if let Some(s) = &result.metadata.source_id {
                    record_to.record("cadre.source_id", s.as_str());
                }
                if let Some(t) = result.error_type {
                    record_to.record("error.type", t.as_str());
                }
                // Only registered tools get a label value of their own: a
                // model (or a caller) can invent a new name per call.
                let registered = shared.registry.contains(&msg.tool_name)
                    || shared.registry.agent_tool(&msg.tool_name).is_some();
                shared.metrics.tool_latency.observe(started.elapsed());
                shared.metrics.tool_call(
                    if registered {
                        &msg.tool_name
                    } else {
                        crate::metrics::UNREGISTERED
                    },
                    result.error_type.map_or("ok", ErrorType::as_str),
                );
                record(
                    &shared.store,
                    &msg,
                    params,
                    &result,
                    intended,
                    registered,
                    marks,
                )
                .await;
                shared
                    .events
                    .publish(match (result.is_success, result.error_type) {
                        (true, _) => EventKind::ExecutionCompleted {
                            tool: msg.tool_name.clone(),
                            execution_time_ms: result.execution_time_ms,
                            cached: result.metadata.cached,
                        },
                        (false, t) => EventKind::ExecutionFailed {
                            tool: msg.tool_name.clone(),
                            error_type: t
                                .map_or(ErrorType::ExecutionError.as_str(), ErrorType::as_str)
                                .into(),
                            error: result.error.clone().unwrap_or_default(),
                        },
                    });
                result
            }
            .instrument(span),
        )
    }
}

/// Why a successful output cannot be kept, if it cannot: nested deeper than
/// [`MAX_OUTPUT_DEPTH`] (it could be stored but never read back), or, from
/// an upstream, larger than [`MAX_UPSTREAM_OUTPUT_BYTES`] as JSON.
fn unkept_output(tool: &RegisteredTool, result: &ToolExecutionResult) -> Option<String> {
    let out = result.output.as_ref().filter(|_| result.is_success)?;
    if json_depth(out, MAX_OUTPUT_DEPTH) > MAX_OUTPUT_DEPTH {
        return Some(format!(
            "JSON nested more than {MAX_OUTPUT_DEPTH} levels deep"
        ));
    }
    if tool.definition.is_upstream() {
        let bytes = serde_json::to_vec(out).map_or(0, |v| v.len());
        if bytes > MAX_UPSTREAM_OUTPUT_BYTES {
            return Some(format!(
                "{bytes} bytes of JSON, more than the {MAX_UPSTREAM_OUTPUT_BYTES} an upstream tool may"
            ));
        }
    }
    None
}

/// The rate limits of a call (step 3): the tenant's ceiling first, so a
/// call it refuses spends no user cell (a call the user's limit then
/// refuses has spent a tenant cell: the ceiling errs on the strict side,
/// never the loose one), then the user's. `None` when the call may run; a
/// refusal otherwise. An approved confirmation passed them when it was
/// held.
async fn rate_limits(
    s: &ExecutorShared,
    tool: &RegisteredTool,
    msg: &ExecuteTool,
) -> Option<ToolExecutionResult> {
    if msg.confirmed {
        return None;
    }
    let name = msg.tool_name.as_str();
    if let Some(quota) = &msg.tenant_quota {
        let tenant = msg
            .ctx
            .tenant
            .as_deref()
            .unwrap_or(crate::identity::DEFAULT_TENANT);
        let gate = format!("{name} (tenant {tenant})");
        if let Err(refusal) = s.tenant_limiter.take(&gate, quota, tenant).await {
            return Some(limit_refused(s, name, refusal));
        }
    }
    let def = &tool.definition;
    if !def.rate_limit.is_unlimited() {
        let user = limit_key(&msg.ctx);
        if let Err(refusal) = s.limiter.take(name, &def.rate_limit, &user).await {
            return Some(limit_refused(s, name, refusal));
        }
    }
    None
}

fn limit_refused(s: &ExecutorShared, name: &str, refusal: LimitRefusal) -> ToolExecutionResult {
    match refusal {
        LimitRefusal::Limited(limited) => {
            s.metrics.rate_limited.fetch_add(1, Ordering::Relaxed);
            let mut result =
                ToolExecutionResult::failure(name, ErrorType::RateLimited, limited.to_string());
            result.metadata.retry_after_ms = Some(limited.retry_after_ms());
            result
        }
        unavailable @ LimitRefusal::Unavailable(_) => {
            tracing::warn!(tool = name, error = ?unavailable, "limits unavailable: call refused");
            ToolExecutionResult::failure(
                name,
                ErrorType::LimitsUnavailable,
                unavailable.to_string(),
            )
        }
    }
}

/// Whose allowance a call spends: the user within the caller's tenant, so
/// tenants never share a user's limits.
pub fn limit_key(ctx: &ExecutionContext) -> String {
    format!(
        "{}/{}",
        ctx.tenant
            .as_deref()
            .unwrap_or(crate::identity::DEFAULT_TENANT),
        ctx.user_id.as_deref().unwrap_or("anonymous")
    )
}

/// Steps 5-9 for an admitted call.
async fn execute(
    s: &ExecutorShared,
    tool: &Arc<RegisteredTool>,
    params: &Value,
    msg: &ExecuteTool,
) -> ToolExecutionResult {
    let def = &tool.definition;
    let ttl = match msg.ctx.cache_ttl {
        // The caller's policy (a tenant's) narrows the tool's, never widens
        // it past "never cached" (confirmation tools and ttl 0 stay uncached).
        Some(0) => None,
        Some(secs) => ResultCache::ttl(def).map(|_| Duration::from_secs(secs)),
        None => ResultCache::ttl(def),
    };
    let key = ttl.map(|_| {
        ResultCache::key(
            &def.name,
            msg.ctx
                .tenant
                .as_deref()
                .unwrap_or(crate::identity::DEFAULT_TENANT),
            msg.ctx.user_id.as_deref(),
            params,
            &msg.ctx.variables,
        )
    });
    if let Some(k) = &key
        && let Some(hit) = s.cache.get(k).await
    {
        return hit;
    }
    if def.requires_confirmation() && !msg.confirmed {
        // The held call's record is written under this id, and so is its
        // outcome once a person decides.
        let record_id = uuid::Uuid::now_v7().to_string();
        return match s
            .confirmations
            .create(
                &def.name,
                params.clone(),
                msg.tool_call_id.clone(),
                msg.ctx.clone(),
                &record_id,
            )
            .await
        {
            Ok(p) => {
                let mut r = ToolExecutionResult::failure(
                    &def.name,
                    ErrorType::PendingConfirmation,
                    format!(
                        "{} needs confirmation before it runs; confirmation id {}",
                        def.name, p.confirmation_id
                    ),
                );
                r.output = Some(json!({
                    "confirmation_id": p.confirmation_id,
                    "summary": p.summary,
                    "expires_at": p.expires_at,
                }));
                r.metadata.confirmation_id = Some(p.confirmation_id);
                r.metadata.record_id = Some(record_id);
                r
            }
            Err(e) => ToolExecutionResult::failure(
                &def.name,
                ErrorType::ExecutionError,
                format!("the confirmation could not be stored: {e}"),
            ),
        };
    }
    let tenant = msg
        .ctx
        .tenant
        .as_deref()
        .unwrap_or(crate::identity::DEFAULT_TENANT);
    let mut request = AdmissionRequest::for_caller(def.category.clone(), msg.ctx.caller_type)
        .with_tenant(tenant)
        .with_priority(msg.ctx.priority);
    // Asking another agent waits for that agent's turn, whose own calls
    // need pool slots: the wait holds none (issue #31), as workflow nodes.
    request.bypass |= matches!(def.entry, crate::tools::definition::Entry::Agent { .. });
    let permit = match s.concurrency.acquire(request).await {
        Ok(p) => p,
        Err(refusal) => {
            return ToolExecutionResult::failure(
                &def.name,
                refusal.error_type(),
                refusal.to_string(),
            );
        }
    };
    if def.side_effects == SideEffects::AtMostOnce
        && let Some(key) = msg.ctx.idempotency_key.as_deref()
        && let Err(e) = commit_intent(&s.store, msg, key).await
    {
        tracing::error!(error = %e, tool = %def.name, "call intent not written; the call does not run");
        return ToolExecutionResult::failure(
            &def.name,
            ErrorType::ExecutionError,
            format!(
                "{} did not run: its intent could not be stored ({})",
                def.name,
                e.public_message()
            ),
        );
    }
    let began = jiff::Timestamp::now();
    let mut result = run_with_retries(tool, params.clone(), &msg.ctx, &s.config).await;
    result.metadata.started_at = Some(began);
    drop(permit);
    if let (Some(k), Some(ttl)) = (key, ttl) {
        s.cache.put(k, &result, ttl).await;
    }
    result
}

async fn run_with_retries(
    tool: &Arc<RegisteredTool>,
    params: Value,
    ctx: &ExecutionContext,
    config: &ExecutorConfig,
) -> ToolExecutionResult {
    let timeout = ctx
        .timeout
        .or(tool.definition.timeout)
        .unwrap_or(config.default_timeout);
    let name = tool.definition.name.as_str();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let started = Instant::now();
        let outcome = run_once(tool, params.clone(), ctx, timeout).await;
        let (result, retryable) = match outcome {
            Ok(output) => {
                return ToolExecutionResult::success(name, output, started.elapsed(), attempt);
            }
            Err(RunFailure::Tool(ToolError::Held {
                message,
                confirmation_id,
                output,
            })) => {
                // Held for a person elsewhere (a delegated agent's call):
                // the turn pauses on it like on one of its own.
                let mut r =
                    ToolExecutionResult::failure(name, ErrorType::PendingConfirmation, message);
                r.output = Some(output);
                r.metadata.confirmation_id = Some(confirmation_id);
                return r.with_elapsed(started.elapsed(), attempt);
            }
            Err(RunFailure::Tool(e)) => {
                // Input the tool cannot use (an unknown symbol, a division
                // by zero) is the caller's to fix, like a schema violation.
                let error_type = match e {
                    ToolError::InvalidInput { .. } => ErrorType::ValidationError,
                    ToolError::Unavailable { .. } => ErrorType::ToolUnavailable,
                    _ => ErrorType::ExecutionError,
                };
                let retryable = e.is_retryable();
                (
                    ToolExecutionResult::failure(name, error_type, e.to_string()),
                    retryable,
                )
            }
            Err(RunFailure::Panicked(detail)) => (
                ToolExecutionResult::failure(
                    name,
                    ErrorType::ExecutionError,
                    format!("tool {name} panicked: {detail}"),
                ),
                false,
            ),
            Err(RunFailure::TimedOut) => (
                ToolExecutionResult::failure(
                    name,
                    ErrorType::Timeout,
                    format!(
                        "tool {name} did not finish within {} ms",
                        timeout.as_millis()
                    ),
                ),
                true,
            ),
        };
        if !retryable || attempt > ctx.max_retries {
            return result.with_elapsed(started.elapsed(), attempt);
        }
        tokio::time::sleep(Backoff::jittered(config.retry_base_delay, 10).delay(attempt)).await;
    }
}

enum RunFailure {
    Tool(ToolError),
    Panicked(String),
    TimedOut,
}

async fn run_once(
    tool: &Arc<RegisteredTool>,
    params: Value,
    ctx: &ExecutionContext,
    timeout: Duration,
) -> Result<Value, RunFailure> {
    let handler = tool.handler.clone();
    if handler.runs_inline() {
        // Pure and bounded (`ToolHandler::runs_inline`): no task, no timer.
        return match AssertUnwindSafe(handler.call(params, ctx))
            .catch_unwind()
            .await
        {
            Err(panic) => Err(RunFailure::Panicked(panic_message(&panic))),
            Ok(result) => result.map_err(RunFailure::Tool),
        };
    }
    let ctx = ctx.clone();
    let task = tokio::spawn(async move {
        AssertUnwindSafe(handler.call(params, &ctx))
            .catch_unwind()
            .await
    });
    let abort = task.abort_handle();
    match tokio::time::timeout(timeout, task).await {
        Err(_) => {
            abort.abort();
            Err(RunFailure::TimedOut)
        }
        Ok(Err(join_error)) => Err(RunFailure::Panicked(join_error.to_string())),
        Ok(Ok(Err(panic))) => Err(RunFailure::Panicked(panic_message(&panic))),
        Ok(Ok(Ok(result))) => result.map_err(RunFailure::Tool),
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".into()
    }
}

async fn record(
    store: &Store,
    msg: &ExecuteTool,
    params: Value,
    result: &ToolExecutionResult,
    intended: bool,
    registered: bool,
    guardrails: Vec<Value>,
) {
    // The name of a tool that does not exist is the caller's text: kept
    // short in the record, and never a key of the per-tool counters
    // (`ToolCallRecord::counted_per_tool`).
    let tool_name = if !registered || result.error_type == Some(ErrorType::ToolNotFound) {
        msg.tool_name.chars().take(64).collect()
    } else {
        msg.tool_name.clone()
    };
    let rec = ToolCallRecord {
        guardrails,
        // Chosen by the caller above (`ResultMetadata::record_id`).
        record_id: result
            .metadata
            .record_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string()),
        tool_name,
        tool_call_id: msg.tool_call_id.clone(),
        params,
        output: result.output.clone(),
        is_success: result.is_success,
        error: result.error.clone(),
        error_type: result.error_type.map(|t| t.as_str().to_string()),
        execution_time_ms: result.execution_time_ms,
        attempts: result.metadata.attempts,
        caller_id: msg.ctx.caller_id.clone(),
        caller_type: msg.ctx.caller_type.as_str().to_string(),
        conversation_id: msg.ctx.conversation_id.clone(),
        workflow_id: msg.ctx.workflow_id.clone(),
        user_id: msg.ctx.user_id.clone(),
        tenant: msg.ctx.tenant.clone(),
        created_at: result.executed_at,
        started_at: result.metadata.started_at,
        source_id: result.metadata.source_id.clone(),
        turn_id: msg.ctx.turn_id.clone(),
        cached: result.metadata.cached,
    };
    let op = WriteOp::RecordToolCall(Box::new(rec));
    // A conversation's call is recorded behind its turn: the turn's own
    // durable commit comes later through the same writer, so an
    // acknowledged turn has its records; nobody waits for this one. Other
    // callers get their answer once the record is durable, and so does an
    // approved call: no turn commit follows it, and the turn waiting for
    // the approval resumes from this record.
    // An at-most-once call (its intent committed) too: after a crash its
    // turn finds the outcome instead of `TOOL_OUTCOME_UNKNOWN`.
    if msg.ctx.caller_type == CallerType::ConversationAgent && !msg.confirmed && !intended {
        store.write_behind(vec![op]);
    } else if let Err(e) = store.write(vec![op], true).await {
        tracing::error!(error = %e, tool = %msg.tool_name, "tool call record not written");
    }
}

/// How the rest of cadre reaches the executor. Every resident conversation
/// holds one: everything sits behind one `Arc` (inline the shared parts
/// were 368 bytes per conversation).
#[derive(Clone)]
pub struct ExecutorHandle {
    inner: Arc<HandleInner>,
}

struct HandleInner {
    /// On the executor's own arbiter: callers on no arbiter of cadre's
    /// (HTTP handlers, MCP, schedules) and fault injection.
    home: Addr<Executor>,
    /// One beside each conversation arbiter, with the thread it runs on
    /// (set once it started).
    beside: Vec<(Arc<OnceLock<ThreadId>>, Addr<Executor>)>,
    shared: ExecutorShared,
}

impl ExecutorHandle {
    /// Starts the executor under a supervisor on the given arbiter, and
    /// one more beside each of `beside` (the conversations' arbiters).
    ///
    /// Every instance is the same gate: the limits, the pool, the cache
    /// and the confirmations are shared handles (`ExecutorShared`), and
    /// the actor keeps no state of its own, so which instance admits a
    /// call changes nothing but the thread it runs on. A call made on a
    /// conversation's arbiter (its tool sub-agent's) goes to the executor
    /// of that arbiter: admission, the rate limits, the record and the
    /// reply then stay on the thread, where the old single executor cost
    /// two thread wake-ups per call (issue #37). Each instance has its own
    /// mailbox and supervisor; a panic in admission restarts only it.
    pub fn start(
        arbiter: &actix::dev::ArbiterHandle,
        beside: &[actix::dev::ArbiterHandle],
        shared: ExecutorShared,
    ) -> Self {
        let for_actor = shared.clone();
        let home = Supervisor::start_in_arbiter(arbiter, move |_| Executor {
            shared: for_actor,
            thread: None,
        });
        let beside = beside
            .iter()
            .map(|arbiter| {
                let slot: Arc<OnceLock<ThreadId>> = Arc::default();
                let (for_actor, thread) = (shared.clone(), slot.clone());
                let addr = Supervisor::start_in_arbiter(arbiter, move |_| Executor {
                    shared: for_actor,
                    thread: Some(thread),
                });
                (slot, addr)
            })
            .collect();
        let (limiter, tenant_limiter) = (shared.limiter.clone(), shared.tenant_limiter.clone());
        // Keyed limiter state grows with users: trim it now and then.
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(60));
            loop {
                tick.tick().await;
                limiter.retain_recent();
                tenant_limiter.retain_recent();
            }
        });
        ExecutorHandle {
            inner: Arc::new(HandleInner {
                home,
                beside,
                shared,
            }),
        }
    }

    pub fn shared(&self) -> &ExecutorShared {
        &self.inner.shared
    }

    /// The executor of the thread this runs on, else the home one.
    fn here(&self) -> &Addr<Executor> {
        let here = std::thread::current().id();
        self.inner
            .beside
            .iter()
            .find(|(thread, _)| thread.get() == Some(&here))
            .map_or(&self.inner.home, |(_, addr)| addr)
    }

    /// How often the supervisors have restarted an executor.
    pub fn restarts(&self) -> u64 {
        self.inner.shared.restarts.load(Ordering::Relaxed)
    }

    #[doc(hidden)]
    pub async fn inject_fault(&self) -> Result<(), String> {
        self.inner
            .home
            .send(InjectFault)
            .await
            .map_err(|e| format!("the executor is unavailable: {e}"))?
    }

    /// Decides a pending confirmation of `tenant` (another tenant's is not
    /// found), once: of racing decisions exactly one gets the call. On
    /// approval the held call runs now, as it was made (plan and rate limit
    /// were passed then). The one path for every transport (HTTP, MCP).
    pub async fn decide_confirmation(
        &self,
        id: &str,
        tenant: &str,
        approve: bool,
    ) -> Result<DecisionOutcome, confirmations::ConfirmationError> {
        let decision = if approve {
            confirmations::Decision::Approved
        } else {
            confirmations::Decision::Denied
        };
        let pending = self
            .inner
            .shared
            .confirmations
            .decide(id, tenant, decision)
            .await?;
        if !approve {
            return Ok(DecisionOutcome {
                confirmation_id: id.to_string(),
                status: "denied",
                tool_name: Some(pending.tool_name),
                result: None,
            });
        }
        let mut call = ExecuteTool::new(
            &pending.tool_name,
            Arguments::Json(pending.params),
            pending.context,
        );
        call.tool_call_id = pending.tool_call_id;
        call.confirmed = true;
        call.record_id = pending.record_id;
        let result = self.execute(call).await;
        Ok(DecisionOutcome {
            confirmation_id: id.to_string(),
            status: if result.is_success {
                "executed"
            } else {
                "failed"
            },
            tool_name: None,
            result: Some(result),
        })
    }

    /// Runs one call. Never fails: an unreachable executor is an
    /// `TOOL_EXECUTION_ERROR` outcome.
    pub async fn execute(&self, mut call: ExecuteTool) -> ToolExecutionResult {
        let name = call.tool_name.clone();
        if !call.confirmed {
            let tenant = call
                .ctx
                .tenant
                .as_deref()
                .unwrap_or(crate::identity::DEFAULT_TENANT);
            // The store's read cache answers this without IO on every call
            // but the first after a config change.
            match TenantConfig::load(&self.inner.shared.store, tenant).await {
                Ok(config) => call.tenant_quota = config.tool_quotas.get(&name).copied(),
                Err(e) => {
                    // Fail closed: a ceiling that cannot be read is not
                    // skipped.
                    return ToolExecutionResult::failure(
                        &name,
                        ErrorType::ExecutionError,
                        format!(
                            "the tenant's limits could not be read: {}",
                            e.public_message()
                        ),
                    );
                }
            }
        }
        match self.here().send(call).await {
            Ok(result) => result,
            Err(e) => ToolExecutionResult::failure(
                &name,
                ErrorType::ExecutionError,
                format!("the executor is unavailable: {e}"),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{ToolDefinition, ToolHandler};
    use std::sync::Mutex;
    use std::thread::ThreadId;

    /// Notes the thread it ran on. It runs in place (`runs_inline`), so
    /// that is the thread of the executor that admitted the call.
    struct WhereRan(Arc<Mutex<Vec<ThreadId>>>);

    #[async_trait::async_trait]
    impl ToolHandler for WhereRan {
        async fn call(&self, _: Value, _: &ExecutionContext) -> Result<Value, ToolError> {
            self.0.lock().unwrap().push(std::thread::current().id());
            Ok(json!({}))
        }

        fn runs_inline(&self) -> bool {
            true
        }
    }

    fn call() -> ExecuteTool {
        ExecuteTool::new(
            "where",
            Arguments::Json(json!({})),
            ExecutionContext::new(CallerType::ConversationAgent, "u"),
        )
    }

    /// What runs a future on `arbiter` and hands back its output.
    async fn on<T: Send + 'static>(
        arbiter: &actix::dev::ArbiterHandle,
        f: impl std::future::Future<Output = T> + Send + 'static,
    ) -> T {
        let (tx, rx) = tokio::sync::oneshot::channel();
        assert!(arbiter.spawn(async move {
            let _ = tx.send(f.await);
        }));
        rx.await.expect("the arbiter ran it")
    }

    /// A call made on a conversation's arbiter is admitted (and an inline
    /// tool run) on that thread, by the executor beside it; a call from
    /// anywhere else goes to the executor's own arbiter. Without the
    /// executors beside the conversations, both would run on the home
    /// arbiter's thread (two thread hops per call, issue #37).
    #[test]
    fn a_call_is_admitted_on_the_arbiter_it_is_made_on() {
        let dir = tempfile::tempdir().unwrap();
        actix::System::new().block_on(async move {
            let (home, beside) = (Arbiter::new(), Arbiter::new());
            let store = Store::open(dir.path()).unwrap();
            let registry = ToolRegistry::new();
            let ran = Arc::new(Mutex::new(Vec::new()));
            registry
                .register(
                    ToolDefinition::new("where", "where it ran", json!({"type": "object"}))
                        .with_side_effects(SideEffects::None)
                        .with_cache_ttl(0),
                    Arc::new(WhereRan(ran.clone())),
                )
                .unwrap();
            let shared = ExecutorShared {
                registry,
                store: store.clone(),
                limiter: Arc::new(limits::RateLimiter::new()),
                tenant_limiter: Arc::new(limits::RateLimiter::new()),
                concurrency: Arc::new(ConcurrencyController::new(Default::default())),
                cache: ResultCache::new(),
                confirmations: Confirmations::new(store, Duration::from_secs(60)),
                events: EventBus::new(),
                config: ExecutorConfig::default(),
                restarts: Arc::default(),
                metrics: Arc::default(),
            };
            let handle = ExecutorHandle::start(&home.handle(), &[beside.handle()], shared);
            let home_thread = on(&home.handle(), async { std::thread::current().id() }).await;
            let beside_thread = on(&beside.handle(), async { std::thread::current().id() }).await;
            assert_ne!(home_thread, beside_thread);
            // The executor beside has started (it learns its thread then).
            for _ in 0..1000 {
                if handle.inner.beside[0].0.get().is_some() {
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert_eq!(handle.inner.beside[0].0.get(), Some(&beside_thread));

            let h = handle.clone();
            let result = on(&beside.handle(), async move { h.execute(call()).await }).await;
            assert!(result.is_success, "{result:?}");
            let result = handle.execute(call()).await;
            assert!(result.is_success, "{result:?}");
            assert_eq!(*ran.lock().unwrap(), [beside_thread, home_thread]);
            home.stop();
            beside.stop();
        });
    }
}
