//! Guardrails at the executor's gate (issue #39): the `tool_input` stage
//! after validation and before the call, the `tool_output` stage after the
//! call and before the record and the model; and how a `tool` or `agent`
//! guardrail is asked, wherever its stage runs.
//!
//! validated params ──tool_input──▶ (cache, confirmation, admission, run) ──tool_output──▶ record ──▶ model
//!                      │ block: GUARDRAIL_TRIPPED, nothing runs            │ block: GUARDRAIL_TRIPPED, no output
//!                      └ redact / rewrite: what the tool gets and the      └ redact / rewrite: what the record
//!                        record keeps                                        keeps and the model reads
//!
//! Decisions:
//! - The guardrails are the calling turn's (its tenant's, then its
//!   agent's), carried by [`super::ExecuteTool::guardrails`]; calls of
//!   other callers (direct invoke, workflow tool nodes, MCP) carry none.
//! - A blocked call's record keeps no arguments (`params` is null): what
//!   was refused may be the very data the guardrail keeps out of storage.
//! - The output stage sees what the tool answered, cached or not (the
//!   result cache keeps the tool's own output; each hit is checked again).
//! - A `tool` guardrail runs the registered tool's handler directly (its
//!   timeout and retries) with the call's context: a check, not a call of
//!   the turn, so it is neither rate-limited nor recorded. An `agent`
//!   guardrail asks the agent as `ask_<agent>` would, in the calling
//!   conversation's child session of that agent (so it needs a session:
//!   in a call without one, it counts as its `on_error`); its typed answer
//!   (`output`) is read if it has one, else its text.
//! - Every decision counts in `cadre_guardrail_trips_total` (blocks) or
//!   `cadre_guardrail_rewrites_total`, and is a `guardrail_tripped` event.
//! - Not checked: the output of a call a person approved later (it runs
//!   from its stored confirmation, which does not carry the turn's
//!   guardrails). The tool_output stage of the calls that run at once is.

use serde_json::Value;

use super::{ExecuteTool, ExecutorConfig, ExecutorShared, run_with_retries};
use crate::events::{EventBus, EventKind};
use crate::guardrails::{
    Checked, Decision, External, ExternalCheck, Stage, Subject, check_request,
};
use crate::metrics::Metrics;
use crate::tools::{ErrorType, ExecutionContext, ToolExecutionResult, ToolRegistry};

/// Asks `tool` and `agent` guardrails for the call context `ctx`.
pub struct GuardrailChecks<'a> {
    pub registry: &'a ToolRegistry,
    pub config: &'a ExecutorConfig,
    pub ctx: &'a ExecutionContext,
}

#[async_trait::async_trait]
impl ExternalCheck for GuardrailChecks<'_> {
    async fn check(
        &self,
        target: External<'_>,
        stage: Stage,
        tool: Option<&str>,
        subject: &Subject,
    ) -> Result<Value, String> {
        let request = check_request(stage, tool, subject);
        match target {
            External::Tool(name) => {
                let Some(checker) = self.registry.get(name) else {
                    return Err(format!("tool {name} is not registered"));
                };
                let result = run_with_retries(&checker, request, self.ctx, self.config).await;
                match (result.is_success, result.output) {
                    (true, Some(output)) => Ok(output),
                    (true, None) => Err(format!("tool {name} answered nothing")),
                    (false, _) => Err(format!(
                        "tool {name} failed: {}",
                        result.error.unwrap_or_default()
                    )),
                }
            }
            External::Agent(name) => {
                let Some(delegate) = self.registry.delegate_slot().get() else {
                    return Err("agents cannot be asked: the runtime is stopping".into());
                };
                if self.ctx.conversation_id.is_none() {
                    return Err(format!("agent {name} can check only a conversation's turn"));
                }
                // Each check is a turn of its own in the child session.
                let mut ctx = self.ctx.clone();
                ctx.idempotency_key = Some(format!("guardrail:{}", uuid::Uuid::now_v7()));
                ctx.child_events = None;
                let answer = delegate
                    .ask(name, request.to_string(), &ctx)
                    .await
                    .map_err(|e| format!("agent {name} was not asked: {e}"))?;
                Ok(match answer.get("output") {
                    Some(output) if !output.is_null() => output.clone(),
                    _ => answer.get("answer").cloned().unwrap_or(Value::Null),
                })
            }
        }
    }
}

/// Counts `checked`'s decisions and publishes them as events.
pub fn note(
    metrics: &Metrics,
    events: &EventBus,
    checked: &Checked,
    session: Option<&str>,
    turn: Option<&str>,
    tool: Option<&str>,
) {
    for d in &checked.decisions {
        let blocked = d.action == crate::guardrails::DecisionAction::Block;
        metrics.guardrail(&d.guardrail, d.stage.as_str(), blocked);
        events.publish(EventKind::GuardrailTripped {
            guardrail: d.guardrail.clone(),
            stage: d.stage.as_str().into(),
            action: d.action.as_str().into(),
            session_id: session.map(str::to_string),
            turn_id: turn.map(str::to_string),
            tool: tool.map(str::to_string),
        });
    }
    if let Some(t) = &checked.tripped {
        tracing::info!(
            guardrail = %t.guardrail,
            stage = t.stage.as_str(),
            reason = t.reason.as_deref().unwrap_or(""),
            session = session.unwrap_or(""),
            tool = tool.unwrap_or(""),
            "guardrail blocked"
        );
    }
}

/// The decisions as a call record keeps them.
pub fn marks(decisions: &[Decision]) -> Vec<Value> {
    decisions
        .iter()
        .filter_map(|d| serde_json::to_value(d).ok())
        .collect()
}

/// A call's outcome when a guardrail blocked it.
pub fn blocked(tool: &str, checked: &Checked) -> ToolExecutionResult {
    let message = checked
        .tripped
        .as_ref()
        .map_or_else(String::new, |t| t.message.clone());
    let mut result = ToolExecutionResult::failure(tool, ErrorType::GuardrailTripped, message);
    result.output = checked
        .tripped
        .as_ref()
        .map(|t| serde_json::json!({"guardrail": t.guardrail, "stage": t.stage.as_str()}));
    result
}

/// Runs `stage` of the call's guardrails on `value`, noted.
pub async fn run(
    stage: Stage,
    msg: &ExecuteTool,
    value: Value,
    shared: &ExecutorShared,
) -> Checked {
    let checks = GuardrailChecks {
        registry: &shared.registry,
        config: &shared.config,
        ctx: &msg.ctx,
    };
    let checked = msg
        .guardrails
        .run(stage, Some(&msg.tool_name), Subject::Json(value), &checks)
        .await;
    note(
        &shared.metrics,
        &shared.events,
        &checked,
        msg.ctx.conversation_id.as_deref(),
        msg.ctx.turn_id.as_deref(),
        Some(&msg.tool_name),
    );
    checked
}
