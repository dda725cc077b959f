//! ToolSubAgent: one short-lived actor per batch of tool calls.
//!
//! conversation ──start(calls, deadline)──▶ ToolSubAgent ──ExecuteTool × n (concurrently)──▶ executor
//!      ▲                                        │
//!      └──────────── ToolBatchReport ───────────┘ then it stops
//!
//! Isolation: the batch runs in its own mailbox, so a conversation never
//! awaits a tool itself. The report holds one outcome per call, in the order
//! the model asked for them; calls still open at the deadline are reported
//! as `TOOL_TIMEOUT` (the executor still finishes and records them). A batch
//! holds at most `[model] max_tool_calls` calls: the conversation machine
//! keeps no more of a reply (a model stuck in a loop cannot flood the
//! executor).
//!
//! Every call carries the names the turn offered the model: the executor
//! refuses any other (`TOOL_NOT_OFFERED`), so a reply naming another agent's
//! tool, or any tool for an agent with none, runs nothing.

use crate::guardrails::Guardrails;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use crate::executor::{Arguments, ExecuteTool, ExecutorHandle};
use crate::model::ToolCall;
use crate::tools::outcome::ParsedArguments;
use crate::tools::{ErrorType, ExecutionContext, ToolExecutionResult};

/// The outcomes of one batch, sent to the conversation that started it.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct ToolBatchReport {
    /// Which batch of the conversation this answers.
    pub batch_id: u64,
    pub outcomes: Vec<(ToolCall, ToolExecutionResult)>,
    /// One line for logs: "2 calls: 1 succeeded, 1 failed (echo: VALIDATION_ERROR)".
    pub summary: String,
}

pub struct ToolSubAgent {
    batch_id: u64,
    calls: Vec<ToolCall>,
    /// The calls' arguments, parsed once by the conversation machine.
    arguments: Vec<ParsedArguments>,
    /// The registry names the turn offered; no other call runs.
    offered: Arc<[String]>,
    results: Vec<Option<ToolExecutionResult>>,
    context: ExecutionContext,
    executor: ExecutorHandle,
    reply_to: Recipient<ToolBatchReport>,
    deadline: Duration,
    reported: bool,
    /// Each call's span is a child of this one (the turn's tool batch).
    span: tracing::Span,
    /// The turn's guardrails: the executor runs their tool stages.
    guardrails: Guardrails,
}

impl ToolSubAgent {
    /// Starts a sub-agent on the current arbiter.
    #[allow(clippy::too_many_arguments)]
    pub fn spawn(
        batch_id: u64,
        calls: Vec<ToolCall>,
        arguments: Vec<ParsedArguments>,
        offered: Arc<[String]>,
        context: ExecutionContext,
        executor: ExecutorHandle,
        reply_to: Recipient<ToolBatchReport>,
        deadline: Duration,
        span: tracing::Span,
        guardrails: Guardrails,
    ) {
        let results = vec![None; calls.len()];
        ToolSubAgent {
            batch_id,
            calls,
            arguments,
            offered,
            results,
            context,
            executor,
            reply_to,
            deadline,
            reported: false,
            span,
            guardrails,
        }
        .start();
    }

    fn report(&mut self, ctx: &mut Context<Self>) {
        if self.reported {
            return;
        }
        self.reported = true;
        let deadline_ms = self.deadline.as_millis();
        let outcomes: Vec<(ToolCall, ToolExecutionResult)> = self
            .calls
            .drain(..)
            .zip(self.results.drain(..))
            .map(|(call, result)| {
                let result = result.unwrap_or_else(|| {
                    ToolExecutionResult::failure(
                        &call.name,
                        ErrorType::Timeout,
                        format!(
                            "the tool batch deadline of {deadline_ms} ms passed before {} finished",
                            call.name
                        ),
                    )
                });
                (call, result)
            })
            .collect();
        let summary = summarize(&outcomes);
        tracing::debug!(batch = self.batch_id, %summary, "tool batch done");
        self.reply_to.do_send(ToolBatchReport {
            batch_id: self.batch_id,
            outcomes,
            summary,
        });
        ctx.stop();
    }
}

fn summarize(outcomes: &[(ToolCall, ToolExecutionResult)]) -> String {
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|(_, r)| !r.is_success)
        .map(|(c, r)| {
            format!(
                "{}: {}",
                c.name,
                r.error_type.map_or("error", |t| t.as_str())
            )
        })
        .collect();
    let mut s = format!(
        "{} call(s): {} succeeded, {} failed",
        outcomes.len(),
        outcomes.len() - failed.len(),
        failed.len()
    );
    if !failed.is_empty() {
        s.push_str(&format!(" ({})", failed.join(", ")));
    }
    s
}

impl Actor for ToolSubAgent {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if self.calls.is_empty() {
            self.report(ctx);
            return;
        }
        for (i, call) in self.calls.iter().enumerate() {
            let executor = self.executor.clone();
            let mut request = ExecuteTool::new(
                &call.name,
                Arguments::Parsed(self.arguments[i].clone()),
                self.context.clone(),
            );
            request.tool_call_id = Some(call.id.clone());
            // Stable across attempts and resumes: (session, turn, call).
            if let (Some(session), Some(turn)) =
                (&request.ctx.conversation_id, &request.ctx.turn_id)
            {
                request.ctx.idempotency_key = Some(format!("{session}:{turn}:{}", call.id));
            }
            request.offered = Some(self.offered.clone());
            request.guardrails = self.guardrails.clone();
            request.span = tracing::info_span!(
                parent: &self.span,
                "tool_call",
                gen_ai.tool.name = %call.name,
                gen_ai.tool.call.id = %call.id,
            );
            ctx.spawn(
                async move { executor.execute(request).await }
                    .into_actor(self)
                    .map(move |result, act, ctx| {
                        act.results[i] = Some(result);
                        if act.results.iter().all(Option::is_some) {
                            act.report(ctx);
                        }
                    }),
            );
        }
        ctx.run_later(self.deadline, |act, ctx| act.report(ctx));
    }
}
