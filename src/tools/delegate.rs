//! Agent tools: `ask_<agent>`, a turn of another agent as a tool call, and
//! `transfer_to_<agent>`, a handoff of the conversation to another agent.
//!
//! agent files (`agents = [...]`, `handoffs = [...]`) ──▶ [`ask_tool`], [`transfer_tool`] per listed agent
//!     ──ToolRegistry::set_agent_tools──▶ the registry's agent layer (not the catalog)
//! executor ──AskAgent::call──▶ [`Delegate::ask`] (the conversation layer's Sessions,
//!     plugged in at start through [`DelegateSlot`]) ──▶ a child conversation's turn
//!
//! An agent file's `[[remote_agents]]` are asked with the same tool shape
//! ([`ask_definition`]), by another handler: [`super::remote_agent`].
//!
//! The tool layer owns the seam and the tool's shape; what asking means
//! (the child session, its link to the parent, the depth cap, approvals
//! crossing the boundary) lives in `conversation::delegation`, above it.
//!
//! Decisions:
//! - An `ask_` tool is offered only to the agents that list the asked one,
//!   and is reachable only from their turns: it is not in the tool catalog
//!   (`GET /v1/tools`, MCP `tools/list`), and direct calls, MCP
//!   `tools/call` and workflow tool nodes cannot name it (the executor
//!   looks it up only for a turn's offered calls).
//! - Its parameters are `{"request": string}` (required, at most
//!   [`MAX_REQUEST_BYTES`]); its description is the asked agent's.
//! - Waiting for the child must not hold a tool-pool slot the child's own
//!   calls need: the executor admits `Entry::Agent` calls without one
//!   (as it does workflow nodes), while rate limits, plans and validation
//!   apply as to any tool.
//! - It is `idempotent` and never cached: asking again with the same key
//!   (a resumed turn, a retried batch) rejoins the same child turn.
//! - Its own timeout is long ([`ASK_TIMEOUT`]); the deadline that binds is
//!   the asking turn's tool batch (`tool_batch_timeout_s`).
//! - `transfer_to_<agent>` takes an optional `{"reason": string}`; what a
//!   handoff does is `conversation::handoff`'s. Offered, reached and
//!   admitted like an `ask_` tool.

use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use serde_json::{Value, json};

use super::definition::{CacheSpec, Entry, SideEffects, ToolDefinition};
use super::{ExecutionContext, ToolError, ToolHandler};

/// The prefix of a delegation tool's name.
pub const ASK_PREFIX: &str = "ask_";

/// Longest `request` an `ask_` call may carry (the child's message).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// An `ask_` tool's own timeout: an hour. The asking batch's deadline is
/// shorter and ends the wait first (the child's turn goes on and keeps
/// its answer).
pub const ASK_TIMEOUT: Duration = Duration::from_secs(3600);

/// The name of the tool that asks `agent`.
pub fn ask_name(agent: &str) -> String {
    format!("{ASK_PREFIX}{agent}")
}

/// The prefix of a handoff tool's name.
pub const TRANSFER_PREFIX: &str = "transfer_to_";

/// The name of the tool that hands the conversation to `agent`.
pub fn transfer_name(agent: &str) -> String {
    format!("{TRANSFER_PREFIX}{agent}")
}

/// Longest `reason` a `transfer_to_` call may give.
pub const MAX_REASON_BYTES: usize = 4 * 1024;

/// What an `ask_` call asks of the layer that runs conversations.
#[async_trait::async_trait]
pub trait Delegate: Send + Sync + 'static {
    /// Runs `request` as a turn of `agent` in the child conversation of
    /// the calling one (`ctx.conversation_id`), and answers with the
    /// child's final answer; a child turn held for a person's approval is
    /// [`ToolError::Held`].
    async fn ask(
        &self,
        agent: &str,
        request: String,
        ctx: &ExecutionContext,
    ) -> Result<Value, ToolError>;

    /// Makes `agent` the calling conversation's active agent from now on:
    /// the rest of its turn and the following turns.
    async fn transfer(
        &self,
        agent: &str,
        reason: Option<String>,
        ctx: &ExecutionContext,
    ) -> Result<Value, ToolError>;
}

/// One event of a child turn, for the asking turn's stream: the child's
/// session and agent, and the event as the child's own stream sends it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ChildEvent {
    pub session_id: String,
    pub agent: String,
    pub event: Value,
}

/// Where an `ask_` call's child turn streams its progress: the asking
/// turn's own stream (set by a conversation whose caller streams).
#[derive(Clone)]
pub struct ChildEvents(pub Arc<dyn Fn(ChildEvent) + Send + Sync>);

impl ChildEvents {
    pub fn send(&self, event: ChildEvent) {
        (self.0)(event)
    }
}

impl std::fmt::Debug for ChildEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ChildEvents")
    }
}

impl PartialEq for ChildEvents {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Fired when the asking turn is cut (a newer message interrupts it, or
/// rolls it back): its `ask_` calls cut their children's turns.
#[derive(Clone, Debug, Default)]
pub struct TurnCut(pub tokio_util::sync::CancellationToken);

/// A signal, not data: any two are equal (so a context compares by what
/// it says).
impl PartialEq for TurnCut {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Where the runtime plugs the [`Delegate`] in once the conversation layer
/// exists (the registry is built before it). Held weakly: the registry
/// must not keep the sessions alive.
#[derive(Clone, Default)]
pub struct DelegateSlot(Arc<OnceLock<Weak<dyn Delegate>>>);

impl DelegateSlot {
    /// Plugs `delegate` in; a second call is ignored.
    pub fn set(&self, delegate: Weak<dyn Delegate>) {
        let _ = self.0.set(delegate);
    }

    /// The delegate, while the runtime runs.
    pub fn get(&self) -> Option<Arc<dyn Delegate>> {
        self.0.get().and_then(Weak::upgrade)
    }
}

/// The handler of `ask_<agent>`.
struct AskAgent {
    agent: String,
    slot: DelegateSlot,
}

#[async_trait::async_trait]
impl ToolHandler for AskAgent {
    async fn call(&self, params: Value, ctx: &ExecutionContext) -> Result<Value, ToolError> {
        let request = params["request"].as_str().unwrap_or_default().to_string();
        if request.trim().is_empty() {
            return Err(ToolError::invalid("`request` must say what to ask"));
        }
        let Some(delegate) = self.slot.get() else {
            return Err(ToolError::Unavailable {
                message: "agents cannot be asked: the runtime is stopping".into(),
            });
        };
        delegate.ask(&self.agent, request, ctx).await
    }
}

/// The definition every agent tool shares: named `name`, described by
/// `lead` and the agent's own `description`, taking `parameters`; an
/// `Entry::Agent`, idempotent (keyed), never cached.
fn agent_tool_definition(
    name: &str,
    agent: &str,
    lead: &str,
    description: &str,
    parameters: Value,
) -> ToolDefinition {
    let description = if description.trim().is_empty() {
        format!("{lead}.")
    } else {
        format!("{lead}: {}", description.trim())
    };
    let mut def = ToolDefinition::new(name, &description, parameters).with_category("delegation");
    def.entry = Entry::Agent {
        agent: agent.to_string(),
    };
    def.side_effects = SideEffects::Idempotent;
    def.cache = Some(CacheSpec { ttl_seconds: 0 });
    def
}

/// The definition of `ask_<agent>`, described by `lead` and `description`:
/// a local agent's ([`ask_tool`]) or a remote one's
/// ([`super::remote_agent`]), the same parameters either way.
pub(crate) fn ask_definition(agent: &str, lead: &str, description: &str) -> ToolDefinition {
    agent_tool_definition(
        &ask_name(agent),
        agent,
        lead,
        description,
        json!({
            "type": "object",
            "properties": {
                "request": {
                    "type": "string",
                    "description": "What to ask, in full: the agent sees only this and its own earlier exchanges with you.",
                    "maxLength": MAX_REQUEST_BYTES,
                }
            },
            "required": ["request"],
            "additionalProperties": false,
        }),
    )
}

/// The tool that asks `agent` (described by `description`), bound to `slot`.
pub fn ask_tool(
    agent: &str,
    description: &str,
    slot: &DelegateSlot,
) -> (ToolDefinition, Arc<dyn ToolHandler>) {
    let mut def = ask_definition(
        agent,
        &format!("Ask the {agent} agent; its answer comes back as the result"),
        description,
    );
    def.timeout = Some(ASK_TIMEOUT);
    let handler = Arc::new(AskAgent {
        agent: agent.to_string(),
        slot: slot.clone(),
    });
    (def, handler)
}

/// The handler of `transfer_to_<agent>`.
struct TransferTo {
    agent: String,
    slot: DelegateSlot,
}

#[async_trait::async_trait]
impl ToolHandler for TransferTo {
    async fn call(&self, params: Value, ctx: &ExecutionContext) -> Result<Value, ToolError> {
        let reason = params["reason"]
            .as_str()
            .filter(|r| !r.trim().is_empty())
            .map(str::to_string);
        let Some(delegate) = self.slot.get() else {
            return Err(ToolError::Unavailable {
                message: "the conversation cannot be handed over: the runtime is stopping".into(),
            });
        };
        delegate.transfer(&self.agent, reason, ctx).await
    }
}

/// The tool that hands the conversation to `agent` (described by
/// `description`), bound to `slot`.
pub fn transfer_tool(
    agent: &str,
    description: &str,
    slot: &DelegateSlot,
) -> (ToolDefinition, Arc<dyn ToolHandler>) {
    let def = agent_tool_definition(
        &transfer_name(agent),
        agent,
        &format!("Hand the conversation over to the {agent} agent, which answers from now on"),
        description,
        json!({
            "type": "object",
            "properties": {
                "reason": {
                    "type": "string",
                    "description": "Why, in a sentence, for the history.",
                    "maxLength": MAX_REASON_BYTES,
                }
            },
            "additionalProperties": false,
        }),
    );
    let handler = Arc::new(TransferTo {
        agent: agent.to_string(),
        slot: slot.clone(),
    });
    (def, handler)
}
