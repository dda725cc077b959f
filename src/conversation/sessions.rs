//! Sessions: the registry of live conversations, and the session API the
//! HTTP layer and the CLI call.
//!
//! http ──▶ Sessions ──(id → ConversationHandle; load from store on demand)──▶ Conversation actor
//!
//! A session's conversation actor is started on first use, on the next
//! arbiter in turn (so conversations spread over every core), with its
//! recent history loaded from the store. Exactly one actor exists per live
//! session: the map is checked again under its lock after the (async) load.
//! Reads (history, summary) go to the store directly and never wait behind a
//! running turn.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;

use super::actor::{Conversation, ConversationHandle, TurnError, TurnSink};
use super::context::{self, PromptLayers};
use super::machine::{ConversationMachine, RollingSummary, TurnOutcome, TurnSettings};
use super::summary::ToolUsageSummary;
use crate::config::{Agent, Agents};
use crate::executor::ExecutorHandle;
use crate::model::ChatMessage;
use crate::store::{Session, Store, StoreError, StoredMessage, WriteOp};
use crate::tools::{Plan, ToolRegistry};

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("no session with id '{id}'")]
    NotFound { id: String },
    #[error("no agent named '{name}'")]
    AgentNotFound { name: String },
    #[error(transparent)]
    Turn(#[from] TurnError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a new session starts with.
#[derive(Debug, Clone, Default)]
pub struct NewSession {
    pub agent: String,
    pub user_id: Option<String>,
    pub plan: Plan,
    pub metadata: Value,
}

#[derive(Debug, Clone, Serialize)]
pub struct SessionSummary {
    pub session_id: String,
    /// The rolling summary of older messages, once there is one.
    pub conversation_summary: Option<String>,
    pub covers_until_seq: u64,
    pub tool_usage_summary: ToolUsageSummary,
    pub message_count: u64,
    /// User messages.
    pub turns: u64,
    pub last_activity_at: Option<Timestamp>,
}

/// The settings of one turn: the agent's, for this session.
pub fn turn_settings(agent: &Agent, session: &Session, registry: &ToolRegistry) -> TurnSettings {
    TurnSettings {
        layers: PromptLayers {
            base_prompt: agent.system_prompt.clone(),
            brevity: agent.brevity,
            visitor_info: if agent.include_visitor_info {
                context::visitor_info(&session.metadata)
            } else {
                None
            },
            tools_offered: false,
            single_tool_use: agent.single_tool_use,
        },
        model: agent.model_name.clone(),
        tools: agent.tool_specs(registry, session.plan),
        max_iterations: agent.max_iterations,
        history_window: agent.history_window,
        temperature: agent.temperature,
        max_tokens: agent.max_tokens,
    }
}

#[derive(Clone)]
pub struct Sessions {
    inner: Arc<Inner>,
}

struct Inner {
    live: Mutex<HashMap<String, ConversationHandle>>,
    store: Store,
    agents: Agents,
    registry: ToolRegistry,
    executor: ExecutorHandle,
    arbiters: Vec<actix::dev::ArbiterHandle>,
    next_arbiter: AtomicUsize,
}

impl Sessions {
    pub fn new(
        store: Store,
        agents: Agents,
        registry: ToolRegistry,
        executor: ExecutorHandle,
        arbiters: Vec<actix::dev::ArbiterHandle>,
    ) -> Self {
        assert!(!arbiters.is_empty(), "sessions need at least one arbiter");
        Sessions {
            inner: Arc::new(Inner {
                live: Mutex::new(HashMap::new()),
                store,
                agents,
                registry,
                executor,
                arbiters,
                next_arbiter: AtomicUsize::new(0),
            }),
        }
    }

    pub fn agents(&self) -> &Agents {
        &self.inner.agents
    }

    /// Creates a session; it is durable before this returns.
    pub async fn create(&self, new: NewSession) -> Result<Session, SessionError> {
        if self.inner.agents.get(&new.agent).is_none() {
            return Err(SessionError::AgentNotFound { name: new.agent });
        }
        let session = Session {
            id: uuid::Uuid::now_v7().to_string(),
            agent: new.agent,
            user_id: new.user_id,
            plan: new.plan,
            metadata: new.metadata,
            created_at: Timestamp::now(),
        };
        self.inner
            .store
            .write(vec![WriteOp::PutSession(session.clone())], true)
            .await?;
        Ok(session)
    }

    pub async fn get(&self, id: &str) -> Result<Session, SessionError> {
        self.inner
            .store
            .get_session(id)
            .await?
            .ok_or_else(|| SessionError::NotFound { id: id.into() })
    }

    /// Runs one turn; the reply comes once the turn is durable.
    pub async fn send_message(
        &self,
        id: &str,
        content: String,
    ) -> Result<TurnOutcome, SessionError> {
        self.send_message_with(id, content, None).await
    }

    /// Runs one turn, streaming its progress to `events` when given.
    pub async fn send_message_with(
        &self,
        id: &str,
        content: String,
        events: Option<TurnSink>,
    ) -> Result<TurnOutcome, SessionError> {
        let session = self.get(id).await?;
        let agent = self.agent_of(&session)?;
        let settings = turn_settings(&agent, &session, &self.inner.registry);
        let handle = self.handle(id).await?;
        match handle
            .turn(content.clone(), Some(settings.clone()), events.clone())
            .await
        {
            // The actor died between lookup and send: start a fresh one once.
            Err(TurnError::Unavailable) if !handle.is_alive() => {
                self.inner.live.lock().expect("sessions lock").remove(id);
                let handle = self.handle(id).await?;
                Ok(handle.turn(content, Some(settings), events).await?)
            }
            other => Ok(other?),
        }
    }

    /// Stores a message that needs no model turn (an operator's reply), in
    /// order with the session's turns.
    pub async fn record_message(
        &self,
        id: &str,
        message: ChatMessage,
    ) -> Result<u64, SessionError> {
        let handle = self.handle(id).await?;
        Ok(handle.record(message).await?)
    }

    fn agent_of(&self, session: &Session) -> Result<Arc<Agent>, SessionError> {
        self.inner
            .agents
            .get(&session.agent)
            .ok_or_else(|| SessionError::AgentNotFound {
                name: session.agent.clone(),
            })
    }

    /// Every message of the session, oldest first.
    pub async fn history(&self, id: &str) -> Result<Vec<StoredMessage>, SessionError> {
        self.get(id).await?;
        Ok(self.inner.store.messages(id).await?)
    }

    /// The session's summary, from the store alone: it never waits behind
    /// a running turn.
    pub async fn summary(&self, id: &str) -> Result<SessionSummary, SessionError> {
        self.get(id).await?;
        let calls = self.inner.store.calls_for_conversation(id).await?;
        let stats = self.inner.store.message_stats(id).await?;
        let summary = self.inner.store.get_summary(id).await?;
        Ok(SessionSummary {
            session_id: id.to_string(),
            conversation_summary: summary.as_ref().map(|s| s.text.clone()),
            covers_until_seq: summary.map_or(0, |s| s.covers_until_seq),
            tool_usage_summary: ToolUsageSummary::from_calls(
                calls.iter().map(|c| (c.tool_name.as_str(), c.is_success)),
            ),
            message_count: stats.count,
            turns: stats.user_messages,
            last_activity_at: stats.last_at,
        })
    }

    /// Conversations currently in memory.
    pub fn resident(&self) -> usize {
        self.inner.live.lock().expect("sessions lock").len()
    }

    async fn handle(&self, id: &str) -> Result<ConversationHandle, SessionError> {
        if let Some(h) = self.inner.live.lock().expect("sessions lock").get(id)
            && h.is_alive()
        {
            return Ok(h.clone());
        }
        let session = self.get(id).await?;
        let agent = self.agent_of(&session)?;
        let summary = self.inner.store.get_summary(id).await?;
        let covered = summary.as_ref().map_or(0, |s| s.covers_until_seq);
        // Everything the summary does not cover, up to a bound: a summary
        // that failed for a while must not make a reload unbounded.
        let (unsummarised, last_seq) = self
            .inner
            .store
            .unsummarised_messages(id, covered, 4 * agent.history_window.max(10))
            .await?;
        let machine = ConversationMachine::new(
            turn_settings(&agent, &session, &self.inner.registry),
            unsummarised
                .into_iter()
                .map(|m| (m.seq, m.message))
                .collect(),
            summary.map(|s| RollingSummary {
                text: s.text,
                covers_until_seq: s.covers_until_seq,
            }),
            last_seq,
        );
        let mut live = self.inner.live.lock().expect("sessions lock");
        if let Some(h) = live.get(id)
            && h.is_alive()
        {
            return Ok(h.clone());
        }
        let n = self.inner.next_arbiter.fetch_add(1, Ordering::Relaxed);
        let arbiter = &self.inner.arbiters[n % self.inner.arbiters.len()];
        let conversation = Conversation::new(
            session,
            agent,
            self.inner.store.clone(),
            self.inner.executor.clone(),
            machine,
        );
        let handle = ConversationHandle::start_in(arbiter, conversation);
        live.insert(id.to_string(), handle.clone());
        Ok(handle)
    }
}
