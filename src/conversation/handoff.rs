//! Handoff: an agent hands the conversation to another (issue #31).
//!
//! turn ──transfer_to_<agent> (executor)──▶ tools::delegate::TransferTo
//!     ──Delegate::transfer──▶ Sessions::transfer ──PutSession (agent = X, durable)──▶ store
//!                                               └──HandOff (X, its settings)──▶ the conversation actor
//!     ◀── {"transferred_to", "from", "reason"} (the tool result, in the history)
//!
//! From the handoff on, the session's active agent is the new one: the
//! rest of the turn (its next model call) and the following turns are
//! answered with its prompt layers, tools and model, over the same
//! history. `GET /v1/sessions/{id}` shows it as `agent`; the
//! `transfer_to_` call and its result stay in the history, so the new
//! agent (and a reader) sees that it was handed over and why. The new
//! agent can hand back when its own file lists the old one.
//!
//! Decisions:
//! - The session row is written durably before the actor switches, so a
//!   crash after the call leaves the session with the new agent, and a
//!   resumed turn goes on with it.
//! - Tenant config overrides (prompt, model) apply to the new agent as to
//!   any (the settings are built as for a turn).
//! - A message already queued behind the running turn keeps the settings
//!   it was queued with; messages sent after the handoff get the new
//!   agent's. When one reply hands over twice, the last call wins.
//! - Handing over to the agent already active is a no-op that says so.

use serde_json::{Value, json};

use super::sessions::{SessionError, Sessions};
use crate::identity::Scope;
use crate::store::WriteOp;
use crate::tools::{ExecutionContext, ToolError};

impl Sessions {
    /// Makes `agent` the active agent of the calling conversation (see the
    /// module doc).
    pub(super) async fn transfer(
        &self,
        agent: &str,
        reason: Option<String>,
        ctx: &ExecutionContext,
    ) -> Result<Value, ToolError> {
        let failed = |e: SessionError| ToolError::failed(e.to_string());
        let Some(id) = ctx.conversation_id.as_deref() else {
            return Err(ToolError::failed(
                "a conversation can be handed over only from its own turn",
            ));
        };
        let mut session = self.get(&Scope::runtime(), id).await.map_err(failed)?;
        let from = session.agent.clone();
        if from == agent {
            return Ok(
                json!({"transferred_to": agent, "from": from, "reason": reason, "note": "already the active agent"}),
            );
        }
        let Some(next) = self.agents().get(agent) else {
            return Err(ToolError::failed(format!(
                "agent {agent} is not defined (any more): the conversation stays with {from}"
            )));
        };
        session.agent = agent.to_string();
        let config = self.tenant_config(&session.tenant).await.map_err(failed)?;
        let settings = self.settings_under(&session, &config).map_err(failed)?;
        self.store()
            .write(vec![WriteOp::PutSession(session.clone())], true)
            .await
            .map_err(|e| failed(e.into()))?;
        let handle = self.handle_of(id).await.map_err(failed)?;
        handle.hand_off(next, settings).await;
        tracing::info!(session = %id, %from, to = %agent, "handoff");
        Ok(json!({"transferred_to": agent, "from": from, "reason": reason}))
    }
}
