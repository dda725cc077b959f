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

use super::actor::{Conversation, ConversationHandle, TurnError};
use super::machine::{ConversationMachine, TurnOutcome, TurnSettings};
use super::summary::ToolUsageSummary;
use crate::config::Agents;
use crate::executor::ExecutorHandle;
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
    pub tool_usage_summary: ToolUsageSummary,
    pub message_count: u64,
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
        let handle = self.handle(id).await?;
        match handle.turn(content.clone()).await {
            // The actor died between lookup and send: start a fresh one once.
            Err(TurnError::Unavailable) if !handle.is_alive() => {
                self.inner.live.lock().expect("sessions lock").remove(id);
                let handle = self.handle(id).await?;
                Ok(handle.turn(content).await?)
            }
            other => Ok(other?),
        }
    }

    /// Every message of the session, oldest first.
    pub async fn history(&self, id: &str) -> Result<Vec<StoredMessage>, SessionError> {
        self.get(id).await?;
        Ok(self.inner.store.messages(id).await?)
    }

    pub async fn summary(&self, id: &str) -> Result<SessionSummary, SessionError> {
        self.get(id).await?;
        let calls = self.inner.store.calls_for_conversation(id).await?;
        let message_count = self.inner.store.message_count(id).await?;
        Ok(SessionSummary {
            session_id: id.to_string(),
            tool_usage_summary: ToolUsageSummary::from_calls(
                calls.iter().map(|c| (c.tool_name.as_str(), c.is_success)),
            ),
            message_count,
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
        let agent =
            self.inner
                .agents
                .get(&session.agent)
                .ok_or_else(|| SessionError::AgentNotFound {
                    name: session.agent.clone(),
                })?;
        let (recent, last_seq) = self
            .inner
            .store
            .recent_messages(id, agent.history_window)
            .await?;
        let settings = TurnSettings {
            system_prompt: agent.system_prompt.clone(),
            model: agent.model_name.clone(),
            tools: agent.tool_specs(&self.inner.registry, session.plan),
            max_iterations: agent.max_iterations,
            history_window: agent.history_window,
            temperature: agent.temperature,
            max_tokens: agent.max_tokens,
        };
        let machine =
            ConversationMachine::new(settings, recent.into_iter().map(|m| m.message).collect());
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
            last_seq,
        );
        let handle = ConversationHandle::start_in(arbiter, conversation);
        live.insert(id.to_string(), handle.clone());
        Ok(handle)
    }
}
