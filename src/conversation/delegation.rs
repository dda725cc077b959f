//! Delegation: an agent asks another, whose turn runs in a child
//! conversation (issue #31).
//!
//! parent turn ──ask_<agent> (executor, no pool slot)──▶ tools::delegate::AskAgent
//!     ──Delegate::ask──▶ Sessions::ask ──child_of (find or open, linked)──▶ child session
//!     ──start_turn (key = the call's idempotency key)──▶ the child's conversation actor
//!     ◀── the child's answer (the tool result) | held for approval (ToolError::Held)
//!
//! The child is a conversation like any other: its own session, prompt
//! layers, tools, limits and model endpoint; its phase is data. The
//! parent's model never sees the child's tools, and the child runs only
//! its own: the executor refuses any call its turn did not offer.
//!
//! Decisions:
//! - **One child per parent session and asked agent.** Asking the same
//!   agent again from the same session continues the same child session,
//!   so the asked agent remembers the earlier questions. The pointers are
//!   one document of the parent (namespace [`DELEGATIONS`], key the
//!   parent's id, `{"children": {agent: child id}}`, erased with it).
//!   A fresh child: delete the child session (`DELETE
//!   /v1/sessions/{child}`); the next ask opens a new one.
//! - **The link** is in the child's metadata under the reserved key
//!   [`DELEGATED_BY`]: the parent session, the turn and tool call that
//!   opened it, the parent's agent, and the child's depth. A client cannot
//!   set it (`POST /v1/sessions` refuses the key).
//! - **Who the child acts for**: the parent's tenant, user and plan; its
//!   turns pass the same budget gate, its calls the same entitlements,
//!   limits and quotas, and its tokens count toward the tenant (as the
//!   child session's) and toward the parent session: its summary's
//!   `delegated_token_usage` sums its children's and theirs, read from the
//!   pointers (at most [`MAX_SUMMED_CHILDREN`] sessions). A
//!   workflow's session passes its `workflow_id`/`node_id` on, so a
//!   child of an agent node does not pause for approvals either.
//! - **Depth.** A top-level session is depth 0, its child 1; asking from
//!   a session at `[agents] max_delegation_depth` (default 3) is refused
//!   with a tool error the model reads. A cycle (A asks B asks A) opens a
//!   new child per level, so it ends there, never hangs.
//! - **Exactly once.** The child's turn is keyed by the parent call's
//!   idempotency key (`<session>:<turn>:<tool_call_id>`): a resumed
//!   parent, or a batch retried, rejoins the same child turn (finished:
//!   its answer; running: its end) instead of asking again, and the child
//!   resumes its own calls without running a finished one twice.
//! - **Approvals cross the boundary.** A child turn paused on a call held
//!   for a person makes the ask answer `pending_confirmation` with the
//!   child's confirmation id, so the parent turn pauses on it and its
//!   caller's 202 names it. Deciding it ([`Sessions::decide_confirmation`])
//!   takes up the child, then tells each ancestor to look again: the
//!   parent asks once more (the same key), which waits for the child's
//!   next end or pause. When the child holds several confirmations the
//!   parent names the first still pending, then the next.
//! - **Streams.** When the asking turn's caller streams (SSE, the visitor
//!   WebSocket), every event of the child's turn reaches it as a
//!   `child_event` `{session_id, agent, event}`, the child's own event
//!   inside; a grandchild's arrive wrapped twice.
//! - **Cut together.** When the asking turn is cut (a newer message under
//!   `multitask = "interrupt"` or `"rollback"`), its running `ask_` calls
//!   cut their children's turns the same way (closed as `interrupted`; a
//!   child's calls already running finish and are recorded). A paused
//!   parent's cut declines the child's held call, which ends the child's
//!   turn.
//! - **Deadline.** The wait is bounded by the asking turn's tool batch
//!   deadline (`tool_batch_timeout_s`); past it the parent gets `timeout`
//!   and the child's turn goes on, its answer kept in the child session.

use jiff::Timestamp;
use serde_json::{Value, json};

use super::actor::TurnEvent;
use super::lineage::{DELEGATED_BY, DELEGATIONS, depth_of};
use super::machine::{TurnOutcome, TurnStatus};
use super::sessions::{NewSession, SessionError, Sessions};
use crate::executor::confirmations::ConfirmationState;
use crate::identity::Scope;
use crate::store::{Session, WriteOp};
use crate::tools::delegate::ChildEvent;
use crate::tools::{ExecutionContext, ToolError};

/// How often a wait for a child that is being taken up looks again, when
/// its conversation does not know the turn yet (a race at load only).
const LOOK_AGAIN: std::time::Duration = std::time::Duration::from_millis(50);

fn refused(e: SessionError) -> ToolError {
    match e {
        SessionError::Turn(super::actor::TurnError::Unavailable) => ToolError::Unavailable {
            message: e.to_string(),
        },
        other => ToolError::failed(other.to_string()),
    }
}

impl Sessions {
    /// Runs `request` as a turn of `agent` in the child session of the
    /// calling conversation (see the module doc).
    pub(super) async fn ask(
        &self,
        agent: &str,
        request: String,
        ctx: &ExecutionContext,
    ) -> Result<Value, ToolError> {
        let Some(parent_id) = ctx.conversation_id.as_deref() else {
            return Err(ToolError::failed(
                "another agent can be asked only from a conversation's turn",
            ));
        };
        let parent = self
            .get(&Scope::runtime(), parent_id)
            .await
            .map_err(refused)?;
        let depth = depth_of(&parent) + 1;
        let max = self.limits().max_delegation_depth;
        if depth > max {
            return Err(ToolError::failed(format!(
                "{agent} was not asked: this conversation is already {} deep in a chain of agents asking agents, and [agents] max_delegation_depth is {max}; answer with what you have",
                depth - 1
            )));
        }
        let child = self.child_of(&parent, agent, ctx, depth).await?;
        let scope = Scope::tenant(parent.tenant.clone());
        // The asking turn's stream gets the child's events, tagged.
        let events = ctx.child_events.clone().map(|relay| {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<TurnEvent>();
            let (session_id, agent) = (child.id.clone(), agent.to_string());
            tokio::spawn(async move {
                while let Some(event) = rx.recv().await {
                    relay.send(ChildEvent {
                        session_id: session_id.clone(),
                        agent: agent.clone(),
                        event: serde_json::to_value(&event).unwrap_or(Value::Null),
                    });
                }
            });
            tx
        });
        let started = self
            .start_turn(
                &scope,
                &child.id,
                request,
                events,
                ctx.idempotency_key.clone(),
            )
            .await
            .map_err(refused)?;
        let child_turn = started.turn_id.clone();
        let cut = ctx.cut.clone().unwrap_or_default();
        let mut outcome = tokio::select! {
            outcome = started.outcome => outcome.map_err(refused)?,
            () = cut.0.cancelled() => return Err(self.cut_child(&child.id, &child_turn).await),
        };
        loop {
            if outcome.status == TurnStatus::Completed {
                return Ok(json!({
                    "answer": outcome.answer,
                    "agent": agent,
                    "session_id": child.id,
                    "turn_id": outcome.turn_id,
                }));
            }
            if let Some(held) = self.first_pending(&child, &outcome).await {
                return Err(held);
            }
            // Every confirmation it waits on is decided (or expired): the
            // child is being taken up; wait for its next end or pause.
            outcome = tokio::select! {
                next = self.next_of(&scope, &child.id, &outcome.turn_id) => next?,
                () = cut.0.cancelled() => return Err(self.cut_child(&child.id, &child_turn).await),
            };
        }
    }

    /// The asking turn was cut: so is the child's turn (closed as
    /// interrupted, as a newer message would cut it).
    async fn cut_child(&self, child: &str, turn_id: &str) -> ToolError {
        if let Ok(handle) = self.handle_of(child).await {
            handle.cut(turn_id);
        }
        ToolError::failed("the asking turn was cut: so was the asked agent's turn")
    }

    /// The child session of `parent` for `agent`: the one it asked before,
    /// else a new one, linked, durable before its turn starts.
    async fn child_of(
        &self,
        parent: &Session,
        agent: &str,
        ctx: &ExecutionContext,
        depth: u32,
    ) -> Result<Session, ToolError> {
        let key = parent.id.clone();
        let _opening = self.delegations_lock().lock().await;
        let mut children = self
            .store()
            .get_doc(DELEGATIONS, &key)
            .await
            .map_err(|e| refused(e.into()))?
            .unwrap_or_else(|| json!({"children": {}}));
        if let Some(id) = children["children"][agent].as_str()
            && let Ok(child) = self.get(&Scope::tenant(parent.tenant.clone()), id).await
            && child.agent == agent
        {
            return Ok(child);
        }
        if self.agents().get(agent).is_none() {
            return Err(ToolError::failed(format!(
                "agent {agent} is not defined (any more)"
            )));
        }
        let (turn_id, tool_call_id) = match ctx.idempotency_key.as_deref() {
            Some(k) => {
                let mut parts = k.splitn(3, ':');
                let _session = parts.next();
                (
                    parts.next().map(str::to_string),
                    parts.next().map(str::to_string),
                )
            }
            None => (ctx.turn_id.clone(), None),
        };
        let mut metadata = serde_json::Map::new();
        metadata.insert(
            DELEGATED_BY.into(),
            json!({
                "session_id": parent.id,
                "turn_id": turn_id,
                "tool_call_id": tool_call_id,
                "agent": parent.agent,
                "depth": depth,
            }),
        );
        // A workflow's agent node has no person to wait for: nor its children.
        for k in ["workflow_id", "node_id"] {
            if let Some(v) = parent.metadata.get(k) {
                metadata.insert(k.into(), v.clone());
            }
        }
        let child = self
            .new_session(NewSession {
                agent: agent.to_string(),
                tenant: parent.tenant.clone(),
                user_id: parent.user_id.clone(),
                plan: parent.plan,
                metadata: Value::Object(metadata),
            })
            .map_err(refused)?;
        children["children"][agent] = json!(child.id);
        // The child and the parent's pointer to it in one durable write.
        self.store()
            .write(
                vec![
                    WriteOp::PutSession(child.clone()),
                    WriteOp::PutDoc {
                        namespace: DELEGATIONS.into(),
                        key: key.clone(),
                        value: children,
                        tenant: Some(parent.tenant.clone()),
                    },
                    WriteOp::LinkDoc {
                        namespace: DELEGATIONS.into(),
                        key,
                        session_id: parent.id.clone(),
                    },
                ],
                true,
            )
            .await
            .map_err(|e| refused(e.into()))?;
        tracing::info!(parent = %parent.id, child = %child.id, %agent, depth, "child conversation opened");
        Ok(child)
    }

    /// The paused child's first confirmation still waiting for a person,
    /// as the held call its parent pauses on.
    async fn first_pending(&self, child: &Session, outcome: &TurnOutcome) -> Option<ToolError> {
        let confirmations = self.executor().shared().confirmations.clone();
        for a in &outcome.confirmations {
            if let Ok(ConfirmationState::Pending(p)) =
                confirmations.state(&a.confirmation_id, &child.tenant).await
                && Timestamp::now() < p.expires_at
            {
                return Some(ToolError::Held {
                    message: format!(
                        "agent {} waits for a person to approve {}; confirmation id {}",
                        child.agent, a.tool_name, a.confirmation_id
                    ),
                    confirmation_id: a.confirmation_id.clone(),
                    output: json!({
                        "confirmation_id": a.confirmation_id,
                        "summary": format!(
                            "{} (asked of agent {}): {}",
                            a.tool_name,
                            child.agent,
                            a.summary.as_deref().unwrap_or("")
                        ),
                        "expires_at": a.expires_at,
                        "delegated_to": child.id,
                        "agent": child.agent,
                    }),
                });
            }
        }
        None
    }

    /// The next end or pause of the child's turn `turn_id`.
    async fn next_of(
        &self,
        scope: &Scope,
        child: &str,
        turn_id: &str,
    ) -> Result<TurnOutcome, ToolError> {
        loop {
            let handle = self.handle_of(child).await.map_err(refused)?;
            if let Some(watch) = handle.watch(turn_id).await {
                return watch.outcome().await.map_err(|e| refused(e.into()));
            }
            // Not known to its conversation: ended (its record says how),
            // or not taken up yet after a load.
            let record = self.turn(scope, child, turn_id).await.map_err(refused)?;
            if record.is_final() {
                return record.outcome.ok_or_else(|| {
                    ToolError::failed(format!("the {child} turn ended without an answer"))
                });
            }
            tokio::time::sleep(LOOK_AGAIN).await;
        }
    }
}
