//! Executor: the one gate every tool call passes.
//!
//! sub-agent / workflow / HTTP ──ExecuteTool──▶ executor ──▶ handler (spawned task, panics caught)
//!            ▲                                   │ lookup · validation · timeout · retries · record
//!            └──────── ToolExecutionResult ──────┘
//!
//! Admission (lookup, argument parsing and validation) is cheap and runs
//! inside the actor; the tool body runs in a spawned tokio task so a slow
//! tool never stalls admission, and a panicking one only fails its own call
//! (`execution_error`). The actor is started under an actix `Supervisor`: if
//! admission itself ever panics, the panic is caught, the caller gets an
//! `execution_error`, and the actor stops so the supervisor restarts it with
//! fresh state. Callers reach it through [`ExecutorHandle`], which turns an
//! unreachable executor into an `execution_error` outcome, never a hang.
//!
//! Retries: only failures that may pass on a second try (a handler's
//! `Transient` error, a timeout) are retried, up to `max_retries` of the
//! execution context, with exponential backoff and jitter.
//! Every call, refused or run, leaves one `ToolCallRecord`. Records from
//! conversations are written non-durably and made durable by the turn's
//! final commit; records of direct calls are durable before the reply.
//! Owns: admission, retries, call records. Does not: talk to the model.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::FutureExt;
use serde_json::Value;

use crate::store::{Store, ToolCallRecord, WriteOp};
use crate::tools::{
    CallerType, ErrorType, ExecutionContext, RegisteredTool, ToolError, ToolExecutionResult,
    ToolRegistry,
};

/// Executor-wide settings.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// Timeout when neither the context nor the tool sets one.
    pub default_timeout: Duration,
    /// First retry delay; doubles per attempt, with ±50 % jitter.
    pub retry_base_delay: Duration,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            default_timeout: Duration::from_secs(30),
            retry_base_delay: Duration::from_millis(100),
        }
    }
}

/// The arguments of a call: the model's raw string, or JSON from an API caller.
#[derive(Debug, Clone)]
pub enum Arguments {
    Raw(String),
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
}

struct Executor {
    registry: ToolRegistry,
    store: Store,
    config: ExecutorConfig,
}

impl Actor for Executor {
    type Context = Context<Self>;
}

impl Supervised for Executor {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        tracing::warn!("executor restarting");
    }
}

/// What admission decided.
enum Admission {
    Refused(ToolExecutionResult, Value),
    Run(Arc<RegisteredTool>, Value),
}

impl Executor {
    fn admit(&self, msg: &ExecuteTool) -> Admission {
        let raw_params = match &msg.arguments {
            Arguments::Json(v) => v.clone(),
            Arguments::Raw(s) => {
                serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
            }
        };
        let Some(tool) = self.registry.get(&msg.tool_name) else {
            let result = ToolExecutionResult::failure(
                &msg.tool_name,
                ErrorType::ToolNotFound,
                format!("no tool named '{}'", msg.tool_name),
            );
            return Admission::Refused(result, raw_params);
        };
        let validated = match &msg.arguments {
            Arguments::Raw(s) => tool.validator.validate_raw(s),
            Arguments::Json(v) => tool.validator.validate(v.clone()),
        };
        match validated {
            Ok(params) => Admission::Run(tool, params),
            Err(errors) => {
                let summary = errors
                    .iter()
                    .map(|e| {
                        if e.field.is_empty() {
                            e.message.clone()
                        } else {
                            format!("{}: {}", e.field, e.message)
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("; ");
                let mut result = ToolExecutionResult::failure(
                    &msg.tool_name,
                    ErrorType::ValidationError,
                    format!("invalid arguments for {}: {summary}", msg.tool_name),
                );
                result.validation_errors = errors;
                Admission::Refused(result, raw_params)
            }
        }
    }
}

impl Handler<ExecuteTool> for Executor {
    type Result = ResponseFuture<ToolExecutionResult>;

    fn handle(&mut self, msg: ExecuteTool, ctx: &mut Context<Self>) -> Self::Result {
        let started = Instant::now();
        let admission = match std::panic::catch_unwind(AssertUnwindSafe(|| self.admit(&msg))) {
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
        let store = self.store.clone();
        let config = self.config.clone();
        Box::pin(async move {
            let (result, params) = match admission {
                Admission::Refused(result, params) => (result, params),
                Admission::Run(tool, params) => {
                    let result = run_with_retries(&tool, params.clone(), &msg.ctx, &config).await;
                    (result, params)
                }
            };
            let attempts = result.metadata.attempts;
            let result = result.with_elapsed(started.elapsed(), attempts);
            record(&store, &msg, params, &result).await;
            result
        })
    }
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
            Err(RunFailure::Tool(e)) => {
                let error_type = ErrorType::ExecutionError;
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
        tokio::time::sleep(backoff(config.retry_base_delay, attempt)).await;
    }
}

fn backoff(base: Duration, attempt: u32) -> Duration {
    let exp = base.saturating_mul(1 << attempt.saturating_sub(1).min(10));
    let jitter: f64 = rand::random_range(0.5..1.5);
    exp.mul_f64(jitter)
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

async fn record(store: &Store, msg: &ExecuteTool, params: Value, result: &ToolExecutionResult) {
    let rec = ToolCallRecord {
        record_id: uuid::Uuid::now_v7().to_string(),
        tool_name: msg.tool_name.clone(),
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
        created_at: result.executed_at,
    };
    let durable = msg.ctx.caller_type != CallerType::ConversationAgent;
    if let Err(e) = store
        .write(vec![WriteOp::RecordToolCall(Box::new(rec))], durable)
        .await
    {
        tracing::error!(error = %e, tool = %msg.tool_name, "tool call record not written");
    }
}

/// How the rest of cadre reaches the executor.
#[derive(Clone)]
pub struct ExecutorHandle {
    addr: Addr<Executor>,
}

impl ExecutorHandle {
    /// Starts the executor under a supervisor on the given arbiter.
    pub fn start(
        arbiter: &actix::dev::ArbiterHandle,
        registry: ToolRegistry,
        store: Store,
        config: ExecutorConfig,
    ) -> Self {
        let addr = Supervisor::start_in_arbiter(arbiter, move |_| Executor {
            registry,
            store,
            config,
        });
        ExecutorHandle { addr }
    }

    /// Runs one call. Never fails: an unreachable executor is an
    /// `execution_error` outcome.
    pub async fn execute(&self, call: ExecuteTool) -> ToolExecutionResult {
        let name = call.tool_name.clone();
        match self.addr.send(call).await {
            Ok(result) => result,
            Err(e) => ToolExecutionResult::failure(
                &name,
                ErrorType::ExecutionError,
                format!("the executor is unavailable: {e}"),
            ),
        }
    }
}
