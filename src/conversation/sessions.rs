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
//! running turn. Every turn, whoever starts it, and every other model call
//! made for a tenant (operator suggestions, rewording) first passes
//! [`Sessions::admit`], the token budget gate ([`super::budget`]); the
//! calls made outside turns record their usage here, the turns' own in the
//! conversation actor.
//!
//! Every entry that names a session takes a [`Scope`] (issue #30): a
//! caller's tenant ([`crate::identity::Principal::scope`]), under which
//! another tenant's session is "not found", or the runtime's own (the
//! sweep, a tenant erase, the local CLI, an embedder). There are no
//! unscoped twins, so no handler has to remember a tenant check before the
//! call that acts. Three names send a message: [`Sessions::start_turn`]
//! (accepted, with the outcome to await), [`Sessions::send_message`] (its
//! outcome) and [`Sessions::record_message`] (stored, no turn); the
//! visitor protocol ([`super::visitor`]) builds on them.
//!
//! One way into a turn: [`Sessions::start_turn`] is where every transport
//! starts one (HTTP JSON and SSE, the visitor WebSocket, MCP's `agent_*`
//! tools, workflow agent nodes, `cadre chat`): the content is checked (not
//! empty, at most [`MAX_CONTENT_BYTES`]), a keyed message rejoins the turn
//! its key started (completed: its outcome; paused: its paused outcome;
//! running: its end; failed or cut: it runs again), the budget admits it,
//! and the conversation queues or refuses it; the turn's id is known at
//! once. Turns cut by a crash are taken up at start
//! ([`Sessions::resume_cut_turns`]: each such session's conversation is
//! loaded with its open turn, resumed within `[sessions] resume_window_s`,
//! closed as interrupted past it; a workflow node's session is always
//! closed, its run reruns the node). [`Sessions::decide_confirmation`] is
//! the one path of approvals (HTTP and MCP): the executor decides, then the
//! turn paused on it resumes.
//!
//! Deleting: [`Sessions::delete`] is the one path of `DELETE
//! /v1/sessions/{id}`, the tenant erase and the retention sweep. It marks
//! the id as being deleted (no actor is started for it from then on), asks
//! the live actor, if any, to retire ([`super::actor::Retire`]), and erases
//! the rows in one store transaction ([`crate::store::erase`]). Decision: a
//! session with a turn (or a queued message, or the summary after a turn)
//! running is not deleted: the delete is refused with 409
//! `CONVERSATION_BUSY` and the caller retries once the turn is over. The
//! actor decides, in its mailbox order, so a turn is either refused
//! (the session is gone) or finishes before the delete may start; the
//! actor answers only once it is gone with everything it spawned, so none
//! of its writes can land after the erase. Writers outside the actor (a
//! tool call approved just before the delete, an operator assigned
//! meanwhile) are stopped by the store: its writer drops writes under an
//! id it erased ([`crate::store::erase`]).
//!
//! Retention (`[sessions] retain_days`, off by default; a tenant's config
//! `retain_days` overrides it for its sessions, 0 keeping them forever):
//! a sweep reads every session, [`SWEEP_PAGE`] at a time, and deletes
//! those idle (no message, else created) longer than their tenant's
//! retention; each sweep that deleted something logs how many. It runs
//! every quarter of the shortest retention in force (server's or any
//! tenant's; between 50 ms and an hour), at once when a tenant config
//! changes ([`Sessions::retention_changed`]), and every
//! [`RETENTION_RECHECK`] reads the tenant configs again when no retention
//! is set anywhere. [`Sessions::delete_idle`] is the one path of the sweep
//! and of `DELETE /v1/sessions?before=` (an admin's cut-off).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;

use super::actor::{Conversation, ConversationHandle, CutTurn, TurnError, TurnSink};
use super::budget::{BudgetExceeded, Month, Reservation, Reservations};
use super::context::{self, PromptLayers};
use super::machine::{ConversationMachine, RollingSummary, TurnOutcome, TurnRecord, TurnSettings};
use super::storage::{
    StorageGate, StorageQuotaExceeded, StorageRefusal, WriteShareExceeded, escaped_len,
};
use super::summary::ToolUsageSummary;
use crate::agents::{Agent, Agents};
use crate::error_code::{ErrorCode, PublicError};
use crate::executor::ExecutorHandle;
use crate::guardrails::{GuardrailConfig, Guardrails, Stage, Subject};
use crate::identity::Scope;
use crate::metrics::Metrics;
use crate::model::ChatMessage;
use crate::store::usage::day_of;
use crate::store::{
    Erased, Page, Session, SessionFilter, Store, StoreError, StoredMessage, TokenUsage, UsageDelta,
    WriteOp,
};
use crate::tenants::TenantConfig;
use crate::tenants::config::TenantConfigError;
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
    #[error(transparent)]
    BudgetExceeded(#[from] BudgetExceeded),
    #[error(transparent)]
    WriteShare(#[from] WriteShareExceeded),
    #[error(transparent)]
    StorageQuota(#[from] StorageQuotaExceeded),
    #[error("a turn is running in session '{id}'; delete it once the turn has finished")]
    Busy { id: String },
    #[error("content must not be empty")]
    EmptyContent,
    #[error("content is longer than {max} bytes")]
    ContentTooLarge { max: usize },
    #[error("no turn '{turn}' in session '{session}'")]
    TurnNotFound { session: String, turn: String },
    #[error("{}", match turn {
        Some(t) => format!("turn '{t}' of session '{session}' has not finished (it runs or waits for an approval): only a finished turn can be forked"),
        None => format!("session '{session}' has no finished turn to fork from"),
    })]
    TurnNotFinished {
        session: String,
        turn: Option<String>,
    },
    #[error(
        "the stored config of tenant '{tenant}' cannot be read ({message}); nothing that depends on it \
         runs until an admin replaces it (POST /v1/tenants/{tenant}/config)"
    )]
    TenantConfigUnreadable { tenant: String, message: String },
}

impl PublicError for SessionError {
    fn code(&self) -> ErrorCode {
        match self {
            SessionError::NotFound { .. } => ErrorCode::SessionNotFound,
            SessionError::AgentNotFound { .. } => ErrorCode::AgentNotFound,
            SessionError::Turn(t) => t.code(),
            SessionError::Store(s) => s.code(),
            SessionError::BudgetExceeded(_) => ErrorCode::BudgetExceeded,
            SessionError::WriteShare(_) => ErrorCode::RateLimited,
            SessionError::StorageQuota(_) => ErrorCode::StorageQuotaExceeded,
            SessionError::Busy { .. } => ErrorCode::ConversationBusy,
            SessionError::EmptyContent => ErrorCode::ValidationError,
            SessionError::ContentTooLarge { .. } => ErrorCode::PayloadTooLarge,
            SessionError::TurnNotFound { .. } => ErrorCode::TurnNotFound,
            SessionError::TurnNotFinished { .. } => ErrorCode::TurnNotFinished,
            SessionError::TenantConfigUnreadable { .. } => ErrorCode::StorageUnavailable,
        }
    }

    fn details(&self) -> Option<Value> {
        match self {
            SessionError::BudgetExceeded(b) => Some(serde_json::json!({
                "monthly_token_budget": b.budget,
                "used_tokens": b.used,
                "reserved_tokens": b.reserved,
                "resets_at": b.resets_at,
            })),
            SessionError::WriteShare(s) => Some(serde_json::json!({
                "write_kib_per_s": s.kib_per_s,
            })),
            SessionError::StorageQuota(q) => Some(serde_json::json!({
                "stored_bytes": q.used_bytes,
                "max_storage_mb": q.limit_mb,
            })),
            SessionError::Turn(t) => t.details(),
            _ => None,
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            SessionError::BudgetExceeded(b) => Some(b.retry_after),
            SessionError::WriteShare(s) => Some(s.retry_after),
            _ => None,
        }
    }

    fn public_message(&self) -> String {
        match self {
            SessionError::Turn(t) => t.public_message(),
            SessionError::Store(s) => s.public_message(),
            other => other.to_string(),
        }
    }
}

/// Session ids are UUIDs (36 bytes); a longer one a caller names (in a
/// path, a WebSocket URL, an MCP agent tool's `session_id`) is unknown.
pub const MAX_SESSION_ID_BYTES: usize = crate::identity::MAX_ID_BYTES;

pub use super::storage::MAX_CONTENT_BYTES;

/// The rule of every message's content: not blank, at most
/// [`MAX_CONTENT_BYTES`].
pub fn check_content(content: &str) -> Result<(), SessionError> {
    if content.trim().is_empty() {
        return Err(SessionError::EmptyContent);
    }
    if content.len() > MAX_CONTENT_BYTES {
        return Err(SessionError::ContentTooLarge {
            max: MAX_CONTENT_BYTES,
        });
    }
    Ok(())
}

/// What a turn is asked: the user's text, and optionally the JSON shape
/// its answer must have (a message's `response_format`), which replaces
/// the agent's `output_schema` for this turn. A `String` is a message
/// with no schema of its own.
#[derive(Debug, Clone)]
pub struct TurnInput {
    pub content: String,
    pub output_schema: Option<Arc<crate::tools::output_schema::OutputSchema>>,
    /// Where the turn's end is POSTed, already checked
    /// ([`crate::webhooks::Webhooks::check`]).
    pub webhook: Option<String>,
}

impl From<String> for TurnInput {
    fn from(content: String) -> Self {
        TurnInput {
            content,
            output_schema: None,
            webhook: None,
        }
    }
}

/// A turn handed to a session: its id at once, its outcome later.
pub struct StartedTurn {
    pub turn_id: String,
    /// The turn paused for an approval that this one was queued behind
    /// (it starts when that one ends; `enqueue` only), if it was.
    pub waiting_for: Option<String>,
    /// Resolves when the turn ends (or pauses for an approval).
    pub outcome:
        std::pin::Pin<Box<dyn Future<Output = Result<TurnOutcome, SessionError>> + Send + 'static>>,
}

/// How a turn ended, or that it paused ([`Sessions::turn_end`]).
#[derive(Debug, Clone)]
pub enum TurnEnd {
    Completed(TurnOutcome),
    /// Waiting for a person's decision (the outcome names the confirmations).
    Paused(TurnOutcome),
    Failed(super::machine::TurnFailure),
    /// A newer message cut it.
    Interrupted,
}

/// The outcome a turn paused for an approval answered, rebuilt from its
/// record; `None` when it is not paused.
fn paused_outcome(record: &TurnRecord) -> Option<TurnOutcome> {
    let super::machine::Phase::AwaitingApproval { confirmations, .. } = &record.phase else {
        return None;
    };
    Some(TurnOutcome {
        turn_id: record.turn_id.clone(),
        status: super::machine::TurnStatus::AwaitingApproval,
        confirmations: confirmations.clone(),
        answer: String::new(),
        tool_usage_summary: ToolUsageSummary::from_calls(
            record
                .tool_calls
                .iter()
                .map(|c| (c.name.as_str(), c.status())),
        ),
        tool_calls: record.tool_calls.clone(),
        citations: Vec::new(),
        ungrounded_citations: Vec::new(),
        iterations: record.model_calls,
        fallback_used: record.fallback,
        finish_reason: None,
        output: None,
    })
}

/// Most bytes a session's `metadata` may take, as JSON: it is stored with
/// the session and read with each of its turns and listings.
pub const MAX_METADATA_BYTES: usize = 16 * 1024;

/// What a new session starts with.
#[derive(Debug, Clone, Default)]
pub struct NewSession {
    /// The owner; empty means the default tenant.
    pub tenant: String,
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
    /// Every model call of the session: its turns' calls, their summaries,
    /// operator suggestions.
    pub token_usage: TokenUsage,
    /// Every model call of the sessions it asked (its child sessions and
    /// theirs, [`super::delegation`]): they count toward it too.
    pub delegated_token_usage: TokenUsage,
}

pub const SUGGESTIONS_INSTRUCTIONS: &str = "You help a human operator answer a website visitor. \
     Write exactly three different short replies the operator could send next, one per line, \
     with no numbering and no quotes. IMPORTANT: keep each reply brief and concise.";

pub const IMPROVE_INSTRUCTIONS: &str = "Improve the wording of the user's text: fix spelling and \
     grammar, make it clear, polite and concise, keep its meaning and language. Answer with the \
     improved text only.";

/// The first three non-empty lines, stripped of list markers; padded with
/// generic replies when the model gave fewer.
fn three_lines(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text
        .lines()
        .map(|l| {
            l.trim()
                .trim_start_matches(|c: char| c.is_ascii_digit() || "-*.)• ".contains(c))
                .trim_matches('"')
                .trim()
                .to_string()
        })
        .filter(|l| !l.is_empty())
        .take(3)
        .collect();
    let fallbacks = [
        "Thanks for reaching out! How can I help?",
        "Could you tell me a little more?",
        "Let me check that for you.",
    ];
    for f in fallbacks {
        if lines.len() == 3 {
            break;
        }
        if !lines.iter().any(|l| l == f) {
            lines.push(f.to_string());
        }
    }
    lines
}

/// A session's summary, read from the store alone (also used by the CLI).
pub async fn summarize(store: &Store, id: &str) -> Result<SessionSummary, SessionError> {
    if store.get_session(id).await?.is_none() {
        return Err(SessionError::NotFound { id: id.into() });
    }
    let calls = store.calls_for_conversation(id).await?;
    let stats = store.message_stats(id).await?;
    let summary = store.get_summary(id).await?;
    Ok(SessionSummary {
        session_id: id.to_string(),
        conversation_summary: summary.as_ref().map(|s| s.text.clone()),
        covers_until_seq: summary.map_or(0, |s| s.covers_until_seq),
        tool_usage_summary: ToolUsageSummary::from_calls(
            calls.iter().map(|c| (c.tool_name.as_str(), c.status())),
        ),
        message_count: stats.count,
        turns: stats.user_messages,
        last_activity_at: stats.last_at,
        token_usage: store.session_usage(id).await?,
        delegated_token_usage: super::lineage::children_usage(store, id).await?,
    })
}

/// A session, its messages, stored summary and call records as one JSON
/// document: what `GET /v1/sessions/{id}/export` returns and what
/// `cadre sessions export` prints, from the store alone.
pub async fn export(store: &Store, id: &str) -> Result<Value, SessionError> {
    let session = store
        .get_session(id)
        .await?
        .ok_or_else(|| SessionError::NotFound { id: id.into() })?;
    Ok(serde_json::json!({
        "session": session,
        "messages": store.messages(id).await?,
        "summary": store.get_summary(id).await?,
        "calls": store
            .calls_for_conversation(id)
            .await?
            .iter()
            .map(|c| c.shown())
            .collect::<Vec<_>>(),
    }))
}

/// The settings of one turn: the agent's, for this session.
pub fn turn_settings(
    agent: &Agent,
    session: &Session,
    registry: &ToolRegistry,
    limits: &SessionLimits,
) -> TurnSettings {
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
        history_window: u32::try_from(agent.history_window).unwrap_or(u32::MAX),
        temperature: agent.temperature,
        max_tokens: agent.max_tokens,
        tool_variables: agent.variables.clone(),
        cache_ttl: None,
        max_tool_calls: u32::try_from(limits.max_tool_calls).unwrap_or(u32::MAX),
        // A workflow's agent node has no person to wait for.
        pause_for_approval: !session.metadata["workflow_id"].is_string(),
        rules: super::settings::TurnRules::of(
            agent.output_schema.clone(),
            agent.guardrails.clone(),
        ),
    }
}

/// How long conversations stay in memory and how many turns they queue.
#[derive(Debug, Clone, Copy)]
pub struct SessionLimits {
    /// Without a message for this long, a conversation leaves memory.
    pub idle_timeout: Duration,
    /// Turns a session holds waiting behind its running one; one more is
    /// refused with 429 `CONVERSATION_QUEUE_FULL`.
    pub max_queued_turns: usize,
    /// Model time one turn may use, all its calls and retries together
    /// (`[model] turn_timeout_s`).
    pub model_turn_timeout: Duration,
    /// Sessions idle longer than this are deleted (`[sessions]
    /// retain_days`); `None`: kept forever.
    pub retain: Option<Duration>,
    /// Turns (and workflow runs) cut by a crash are resumed at start when
    /// younger than this; older ones are closed as `interrupted`
    /// (`[sessions] resume_window_s`, default 600 s).
    pub resume_window: Duration,
    /// Each tenant's write share and storage quota (`[tenants]`).
    pub storage: super::storage::StorageLimits,
    /// Tool calls of one model reply that are kept (`[model]
    /// max_tool_calls`).
    pub max_tool_calls: usize,
    /// How deep a chain of agents asking agents may go (`[agents]
    /// max_delegation_depth`, [`super::delegation`]).
    pub max_delegation_depth: u32,
}

impl SessionLimits {
    /// How often the retention sweep runs: a quarter of the retention,
    /// between 50 ms and an hour.
    pub fn sweep_every(&self) -> Option<Duration> {
        self.retain.map(sweep_every)
    }
}

/// Sessions the retention sweep (and `DELETE /v1/sessions?before=`) reads
/// per store read.
pub const SWEEP_PAGE: usize = 256;

/// How often the retention sweep reads the tenant configs again while no
/// retention is set anywhere (a change through this node's API wakes it at
/// once; another node's within this).
pub const RETENTION_RECHECK: Duration = Duration::from_secs(60);

/// Sessions a tenant erase deletes per store read ([`Sessions::erase_tenant`]).
pub const ERASE_BATCH: usize = 100;

/// What a tenant erase did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TenantErase {
    /// Sessions deleted.
    pub deleted: u64,
    /// Sessions left because a turn was running in them: erase again.
    pub busy: u64,
}

/// How often a sweep for `retain` runs: a quarter of it, between 50 ms
/// and an hour.
fn sweep_every(retain: Duration) -> Duration {
    (retain / 4).clamp(Duration::from_millis(50), Duration::from_secs(3600))
}

/// A retention in days as a duration: `None` for 0 (kept forever).
pub fn retention_of_days(days: f64) -> Option<Duration> {
    (days > 0.0).then(|| Duration::from_secs_f64(days * 86_400.0))
}

/// Whether a session last active at `last` is past the retention at `now`.
pub fn expired(last: Timestamp, now: Timestamp, retain: Duration) -> bool {
    let retain = jiff::SignedDuration::try_from(retain).unwrap_or(jiff::SignedDuration::MAX);
    now.duration_since(last) > retain
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            idle_timeout: Duration::from_secs(300),
            max_queued_turns: super::actor::DEFAULT_MAX_QUEUED_TURNS,
            model_turn_timeout: super::actor::DEFAULT_MODEL_TURN_TIMEOUT,
            retain: None,
            resume_window: Duration::from_secs(600),
            storage: super::storage::StorageLimits::default(),
            max_tool_calls: super::machine::DEFAULT_MAX_TOOL_CALLS,
            max_delegation_depth: super::lineage::DEFAULT_MAX_DELEGATION_DEPTH,
        }
    }
}

#[derive(Clone)]
pub struct Sessions {
    inner: Arc<Inner>,
}

struct Inner {
    live: Mutex<HashMap<String, ConversationHandle>>,
    /// Ids being deleted: no actor starts for them. Locked after `live`.
    deleting: Mutex<HashSet<String>>,
    store: Store,
    /// Wakes the retention sweep when a tenant config changed.
    retention_changed: Arc<tokio::sync::Notify>,
    agents: Agents,
    registry: ToolRegistry,
    executor: ExecutorHandle,
    arbiters: Vec<actix::dev::ArbiterHandle>,
    next_arbiter: AtomicUsize,
    limits: SessionLimits,
    metrics: Arc<Metrics>,
    /// Tokens set aside for the turns running here ([`super::budget`]).
    reservations: Reservations,
    /// Each tenant's share of the store ([`super::storage`]).
    storage: Arc<StorageGate>,
    /// What `ask_` tools call ([`super::delegation`]); the registry holds
    /// it weakly.
    delegation: Arc<dyn crate::tools::delegate::Delegate>,
    /// Held while a child session is found or opened, so two asks of one
    /// agent from one session open one child.
    opening_children: tokio::sync::Mutex<()>,
    /// Each tenant's guardrails as compiled from its config, with the
    /// list they were compiled from (compiled again when it changes).
    tenant_guardrails: Mutex<HashMap<String, (Vec<GuardrailConfig>, Guardrails)>>,
    /// Memory across sessions, for the notes of agents with `memory = {
    /// inject = true }` (plugged in at start: the runtime makes it after
    /// the sessions).
    memory: std::sync::OnceLock<crate::memory::Memory>,
}

/// The conversation layer behind the `ask_` tools' seam.
struct AskThrough(std::sync::Weak<Inner>);

#[async_trait::async_trait]
impl crate::tools::delegate::Delegate for AskThrough {
    async fn ask(
        &self,
        agent: &str,
        request: String,
        ctx: &crate::tools::ExecutionContext,
    ) -> Result<Value, crate::tools::ToolError> {
        let Some(inner) = self.0.upgrade() else {
            return Err(crate::tools::ToolError::Unavailable {
                message: "the runtime is stopping".into(),
            });
        };
        Sessions { inner }.ask(agent, request, ctx).await
    }

    async fn transfer(
        &self,
        agent: &str,
        reason: Option<String>,
        ctx: &crate::tools::ExecutionContext,
    ) -> Result<Value, crate::tools::ToolError> {
        let Some(inner) = self.0.upgrade() else {
            return Err(crate::tools::ToolError::Unavailable {
                message: "the runtime is stopping".into(),
            });
        };
        Sessions { inner }.transfer(agent, reason, ctx).await
    }
}

impl Sessions {
    /// Conversations idle for `limits.idle_timeout` leave memory (their actor
    /// stops; the next message loads them again from the store). Call from
    /// inside the tokio runtime: a sweeper task drops the stopped handles.
    pub fn new(
        store: Store,
        agents: Agents,
        registry: ToolRegistry,
        executor: ExecutorHandle,
        arbiters: Vec<actix::dev::ArbiterHandle>,
        limits: SessionLimits,
        metrics: Arc<Metrics>,
    ) -> Self {
        let idle_timeout = limits.idle_timeout;
        assert!(!arbiters.is_empty(), "sessions need at least one arbiter");
        let inner = Arc::new_cyclic(|weak: &std::sync::Weak<Inner>| Inner {
            delegation: Arc::new(AskThrough(weak.clone())),
            opening_children: tokio::sync::Mutex::new(()),
            tenant_guardrails: Mutex::new(HashMap::new()),
            memory: std::sync::OnceLock::new(),
            live: Mutex::new(HashMap::new()),
            deleting: Mutex::new(HashSet::new()),
            retention_changed: Arc::new(tokio::sync::Notify::new()),
            store,
            agents,
            registry,
            executor,
            arbiters,
            next_arbiter: AtomicUsize::new(0),
            storage: Arc::new(StorageGate::new(limits.storage)),
            limits,
            metrics,
            reservations: Reservations::default(),
        });
        inner
            .registry
            .delegate_slot()
            .set(Arc::downgrade(&inner.delegation));
        tokio::spawn(retention_sweeps(Arc::downgrade(&inner)));
        // One sweeper for every resident conversation: it drops the handles
        // of stopped ones and asks the others whether they are idle (an idle
        // one stops itself), every quarter of the idle timeout, so an idle
        // conversation leaves memory between 1 and 1.25 idle timeouts after
        // its last message. The handles are copied out so the map is not
        // locked while 100,000 messages are sent.
        let weak = Arc::downgrade(&inner);
        tokio::spawn(async move {
            let every =
                (idle_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(75));
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { break };
                let resident: Vec<ConversationHandle> = {
                    let mut live = inner.live.lock().expect("sessions lock");
                    live.retain(|_, h| h.is_alive());
                    live.values().cloned().collect()
                };
                drop(inner);
                for handle in resident {
                    handle.check_idle();
                }
            }
        });
        Sessions { inner }
    }

    pub fn agents(&self) -> &Agents {
        &self.inner.agents
    }

    pub(super) fn limits(&self) -> &SessionLimits {
        &self.inner.limits
    }

    pub(super) fn store(&self) -> &Store {
        &self.inner.store
    }

    pub(super) fn executor(&self) -> &ExecutorHandle {
        &self.inner.executor
    }

    pub(super) fn delegations_lock(&self) -> &tokio::sync::Mutex<()> {
        &self.inner.opening_children
    }

    pub(super) async fn handle_of(&self, id: &str) -> Result<ConversationHandle, SessionError> {
        self.handle(id).await
    }

    /// The row of a new session (not stored yet).
    pub(super) fn new_session(&self, new: NewSession) -> Result<Session, SessionError> {
        if self.inner.agents.get(&new.agent).is_none() {
            return Err(SessionError::AgentNotFound { name: new.agent });
        }
        let tenant = if new.tenant.is_empty() {
            crate::tenants::DEFAULT_TENANT.to_string()
        } else {
            new.tenant
        };
        Ok(Session {
            id: uuid::Uuid::now_v7().to_string(),
            tenant,
            agent: new.agent,
            user_id: new.user_id,
            plan: new.plan,
            metadata: new.metadata,
            created_at: Timestamp::now(),
            forked_from: None,
        })
    }

    /// Creates a session; it is durable before this returns.
    pub async fn create(&self, new: NewSession) -> Result<Session, SessionError> {
        let session = self.new_session(new)?;
        self.inner
            .store
            .write(vec![WriteOp::PutSession(session.clone())], true)
            .await?;
        Ok(session)
    }

    /// The session, if `scope` reaches it; another tenant's session is
    /// "not found", exactly like one that does not exist. An id longer
    /// than [`MAX_SESSION_ID_BYTES`] is not found without a read.
    pub async fn get(&self, scope: &Scope, id: &str) -> Result<Session, SessionError> {
        if id.len() > MAX_SESSION_ID_BYTES {
            return Err(SessionError::NotFound {
                id: crate::identity::quoted_id(id),
            });
        }
        match self.inner.store.get_session(id).await? {
            Some(session) if scope.reaches(&session.tenant) => Ok(session),
            _ => Err(SessionError::NotFound { id: id.into() }),
        }
    }

    /// Up to `limit` messages after seq `after`, oldest first.
    pub async fn history(
        &self,
        scope: &Scope,
        id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<StoredMessage>, SessionError> {
        self.get(scope, id).await?;
        Ok(self.inner.store.messages_page(id, after, limit).await?)
    }

    /// [`export`] of a session within reach.
    pub async fn export(&self, scope: &Scope, id: &str) -> Result<Value, SessionError> {
        self.get(scope, id).await?;
        export(&self.inner.store, id).await
    }

    /// A page of the sessions of the scope's tenant that `filter` keeps,
    /// past the session id `cursor` in the filter's order; reads only that
    /// tenant's sessions.
    pub async fn list(
        &self,
        scope: &Scope,
        filter: SessionFilter,
        cursor: Option<String>,
        limit: usize,
    ) -> Result<Page<Session>, SessionError> {
        Ok(self
            .inner
            .store
            .sessions_matching(scope.name(), filter, cursor, limit)
            .await?)
    }

    /// The session's summary, from the store alone: it never waits behind
    /// a running turn.
    pub async fn summary(&self, scope: &Scope, id: &str) -> Result<SessionSummary, SessionError> {
        self.get(scope, id).await?;
        summarize(&self.inner.store, id).await
    }

    /// Assigns (or with `None` unassigns) a human operator to the session;
    /// kept in the session's metadata as `operator_id`, durably.
    pub async fn set_operator(
        &self,
        scope: &Scope,
        id: &str,
        operator: Option<String>,
    ) -> Result<Session, SessionError> {
        let mut session = self.get(scope, id).await?;
        if !session.metadata.is_object() {
            session.metadata = Value::Object(Default::default());
        }
        let meta = session.metadata.as_object_mut().expect("made an object");
        match operator {
            Some(op) => meta.insert("operator_id".into(), Value::String(op)),
            None => meta.remove("operator_id"),
        };
        self.inner
            .store
            .write(vec![WriteOp::PutSession(session.clone())], true)
            .await?;
        Ok(session)
    }

    /// The tenant's config (the defaults when none is stored).
    ///
    /// One policy for a stored config that no longer parses (one an older
    /// or newer cadre wrote; every write is checked): it fails closed.
    /// Nothing that depends on it runs, neither the tenant's turns (its
    /// budget, prompt and model overrides would be skipped), its
    /// suggestions and rewordings, nor its tool calls (the executor refuses
    /// them the same way), and the refusal (503 `STORAGE_UNAVAILABLE`)
    /// names the fix: an admin replaces the config. Its plan allows only
    /// free meanwhile ([`crate::tenants::config::plan_ceiling`]).
    pub async fn tenant_config(&self, tenant: &str) -> Result<TenantConfig, SessionError> {
        match TenantConfig::load(&self.inner.store, tenant).await {
            Ok(c) => Ok(c),
            Err(TenantConfigError::Store(s)) => Err(s.into()),
            Err(TenantConfigError::Invalid { message }) => {
                tracing::error!(%tenant, %message, "stored tenant config cannot be read; its turns and tool calls are refused until it is replaced");
                Err(SessionError::TenantConfigUnreadable {
                    tenant: tenant.to_string(),
                    message,
                })
            }
        }
    }

    /// Three replies an operator could send next, from the session's recent
    /// messages. A model call of its own, outside the conversation's turns.
    pub async fn suggestions(&self, scope: &Scope, id: &str) -> Result<Vec<String>, SessionError> {
        let session = self.get(scope, id).await?;
        let tenant = session.tenant.as_str();
        let _reserved = self.admit(tenant).await?;
        let agent = self.agent_of(&session)?;
        // The tenant's prompt and model, as in its turns.
        let mut settings =
            turn_settings(&agent, &session, &self.inner.registry, &self.inner.limits);
        settings.apply_tenant(&self.tenant_config(tenant).await?);
        let (recent, _) = self.inner.store.recent_messages(id, 10).await?;
        let transcript: Vec<String> = recent
            .iter()
            .filter(|m| {
                m.message.tool_calls.is_empty() && m.message.role != crate::model::Role::Tool
            })
            .filter_map(|m| {
                let who = match (&m.message.role, &m.message.name) {
                    (crate::model::Role::User, _) => "visitor",
                    (_, Some(_)) => "operator",
                    _ => "assistant",
                };
                m.message.content.as_ref().map(|c| format!("{who}: {c}"))
            })
            .collect();
        let request = crate::model::ChatRequest {
            model: settings.model.clone(),
            messages: vec![
                ChatMessage::system(format!(
                    "{}\n\n{SUGGESTIONS_INSTRUCTIONS}",
                    settings.layers.base_prompt.trim()
                )),
                ChatMessage::user(if transcript.is_empty() {
                    "(no messages yet)".to_string()
                } else {
                    transcript.join("\n")
                }),
            ],
            tools: Vec::new().into(),
            tool_choice: crate::model::ToolChoice::None,
            temperature: Some(0.7),
            max_tokens: Some(300),
            purpose: crate::model::Purpose::Suggestions,
            response_format: None,
        };
        let reply = agent
            .model
            .complete(request)
            .await
            .map_err(TurnError::from)?;
        self.record_usage(Some(id), tenant, &agent.name, reply.usage.as_ref());
        Ok(three_lines(reply.content.as_deref().unwrap_or_default()))
    }

    /// `text` reworded by the model of `agent` (default: the first agent),
    /// for and billed to the scope's tenant.
    pub async fn improve(
        &self,
        scope: &Scope,
        text: &str,
        agent: Option<&str>,
    ) -> Result<String, SessionError> {
        let tenant = scope.name();
        let _reserved = self.admit(tenant).await?;
        let agent = match agent {
            Some(name) => self
                .inner
                .agents
                .get(name)
                .ok_or_else(|| SessionError::AgentNotFound { name: name.into() })?,
            None => self
                .inner
                .agents
                .iter()
                .next()
                .ok_or_else(|| SessionError::AgentNotFound {
                    name: "(any)".into(),
                })?,
        };
        let request = crate::model::ChatRequest {
            model: agent.model_name.clone(),
            messages: vec![
                ChatMessage::system(IMPROVE_INSTRUCTIONS),
                ChatMessage::user(text),
            ],
            tools: Vec::new().into(),
            tool_choice: crate::model::ToolChoice::None,
            temperature: Some(0.3),
            max_tokens: Some(600),
            purpose: crate::model::Purpose::Improve,
            response_format: None,
        };
        let reply = agent
            .model
            .complete(request)
            .await
            .map_err(TurnError::from)?;
        self.record_usage(None, tenant, &agent.name, reply.usage.as_ref());
        Ok(reply.content.unwrap_or_default().trim().to_string())
    }

    /// The token budget gate: while `tenant` has tokens left this month
    /// and not all of them are set aside for its running turns, the tokens
    /// this piece of work sets aside (none without a budget); else
    /// [`SessionError::BudgetExceeded`].
    pub async fn admit(&self, tenant: &str) -> Result<Option<Reservation>, SessionError> {
        let config = self.tenant_config(tenant).await?;
        self.admit_under(tenant, &config).await
    }

    /// [`Self::admit`] with the tenant's config already read.
    async fn admit_under(
        &self,
        tenant: &str,
        config: &TenantConfig,
    ) -> Result<Option<Reservation>, SessionError> {
        let Some(limit) = config.monthly_token_budget else {
            return Ok(None);
        };
        let now = Timestamp::now();
        let month = Month::of(now);
        let used = self
            .inner
            .store
            .tenant_usage(tenant, month.first, month.last)
            .await?;
        Ok(Some(
            self.inner
                .reservations
                .reserve(tenant, limit, &used, &month, now)?,
        ))
    }

    /// The store's gate of `bytes` about to be stored for the scope's
    /// tenant outside a conversation (a direct tool call's arguments, which
    /// its record keeps): its write share, then its storage quota
    /// ([`super::storage`]).
    pub async fn admit_bytes(&self, scope: &Scope, bytes: usize) -> Result<(), SessionError> {
        let tenant = scope.name();
        let config = self.tenant_config(tenant).await?;
        self.admit_content(tenant, &config, bytes).await
    }

    /// The store's gate of a message of `bytes` (its content as stored)
    /// about to be stored for `tenant`: its write share, then its storage
    /// quota ([`super::storage`]).
    pub(super) async fn admit_content(
        &self,
        tenant: &str,
        config: &TenantConfig,
        bytes: usize,
    ) -> Result<(), SessionError> {
        let quota = config.max_storage_mb;
        match self
            .inner
            .storage
            .admit(&self.inner.store, tenant, bytes, quota)
            .await
        {
            Ok(()) => Ok(()),
            Err(StorageRefusal::Share(s)) => Err(s.into()),
            Err(StorageRefusal::Quota(q)) => Err(q.into()),
            Err(StorageRefusal::Store(e)) => Err(e.into()),
        }
    }

    /// Each tenant's share of the store ([`super::storage`]).
    pub fn storage_gate(&self) -> &StorageGate {
        &self.inner.storage
    }

    /// Forgets the write shares of tenants that sent nothing lately (the
    /// runtime calls it periodically).
    pub fn retain_recent_shares(&self) {
        self.inner.storage.retain_recent();
    }

    /// Counts a model call made outside a turn, with the next commit.
    fn record_usage(
        &self,
        session_id: Option<&str>,
        tenant: &str,
        agent: &str,
        usage: Option<&crate::model::Usage>,
    ) {
        self.inner
            .store
            .write_behind(vec![WriteOp::RecordUsage(UsageDelta {
                session_id: session_id.map(str::to_string),
                tenant: tenant.to_string(),
                agent: agent.to_string(),
                day: day_of(Timestamp::now()),
                usage: TokenUsage::of_reply(usage),
            })]);
    }

    /// The one way into a turn, for every transport (HTTP JSON and SSE,
    /// the visitor WebSocket, MCP's `agent_*` tools, workflow agent nodes):
    /// the content is checked (not empty, at most [`MAX_CONTENT_BYTES`]),
    /// the token budget admits it, and the conversation accepts (queues)
    /// or refuses it. With an idempotency key the session's turn started
    /// with that key, if any, is answered instead of a new one: its stored
    /// outcome once final, else its end, watched (a retry after a crash
    /// finds the turn the restart resumed).
    pub async fn start_turn(
        &self,
        scope: &Scope,
        id: &str,
        input: impl Into<TurnInput>,
        events: Option<TurnSink>,
        key: Option<String>,
    ) -> Result<StartedTurn, SessionError> {
        let TurnInput {
            content,
            output_schema,
            webhook,
        } = input.into();
        check_content(&content)?;
        let session = self.get(scope, id).await?;
        if let Some(key) = &key
            && let Some(turn_id) = self.inner.store.turn_by_key(id, key).await?
            && let Some(started) = self.rejoin(id, turn_id).await?
        {
            return Ok(started);
        }
        // The tenant's config, read once for the turn: its budget and its
        // overrides of the agent's settings.
        let config = self.tenant_config(&session.tenant).await?;
        let mut settings = self.settings_under(&session, &config)?;
        // The message pays the tenant's write share and storage gate as
        // sent, before its guardrails: a refused one leaves a turn record,
        // so a flood of refused messages is throttled like any other.
        self.admit_content(&session.tenant, &config, escaped_len(&content))
            .await?;
        // Nothing a guardrail refuses is stored or sent.
        let content = match settings.guardrails().filter(|g| g.has_stage(Stage::Input)) {
            Some(g) => {
                let g = g.clone();
                self.check_input(&session, &g, content, key.clone()).await?
            }
            None => content,
        };
        check_content(&content)?;
        let reservation = self.admit_under(&session.tenant, &config).await?;
        if let Some(schema) = output_schema {
            settings.with_output_schema(schema);
        }
        if let Some(url) = webhook {
            settings.with_webhook(url);
        }
        if let Some(notes) = self.memory_notes(&session, &content).await {
            settings.with_memory(notes);
        }
        let handle = self.handle(id).await?;
        let accepted = match handle
            .submit_keyed(
                content.clone(),
                Some(settings.clone()),
                events.clone(),
                key.clone(),
                reservation,
            )
            .await
        {
            Err(TurnError::Unavailable) if !handle.is_alive() => None,
            other => Some(other?),
        };
        let turn_id = accepted
            .as_ref()
            .map(|a| a.turn_id().to_string())
            .unwrap_or_default();
        let waiting_for = accepted
            .as_ref()
            .and_then(|a| a.waiting_for().map(str::to_string));
        let sessions = self.clone();
        let id = id.to_string();
        let outcome = async move {
            if let Some(accepted) = accepted {
                match accepted.outcome().await {
                    Err(TurnError::Unavailable) if !handle.is_alive() => {}
                    other => return Ok(other?),
                }
            }
            // The actor stopped between lookup and the turn's start (an idle
            // eviction): once more, on a fresh one.
            sessions
                .inner
                .live
                .lock()
                .expect("sessions lock")
                .remove(&id);
            let handle = sessions.handle(&id).await?;
            Ok(handle
                .submit_keyed(content, Some(settings), events, key, None)
                .await?
                .outcome()
                .await?)
        };
        Ok(StartedTurn {
            turn_id,
            waiting_for,
            outcome: Box::pin(outcome),
        })
    }

    /// A turn started before by a request with the same idempotency key:
    /// its stored outcome once completed, its paused outcome while it waits
    /// for an approval, else its end. `None` when it failed or was cut:
    /// nothing was answered, so the retry runs (as a 5xx is retried).
    async fn rejoin(&self, id: &str, turn_id: String) -> Result<Option<StartedTurn>, SessionError> {
        let record = self.turn_record(id, &turn_id).await?;
        if record.is_final() {
            return Ok(record.outcome.map(|outcome| StartedTurn {
                turn_id,
                waiting_for: None,
                outcome: Box::pin(async move { Ok(outcome) }),
            }));
        }
        if let Some(outcome) = paused_outcome(&record) {
            return Ok(Some(StartedTurn {
                turn_id,
                waiting_for: None,
                outcome: Box::pin(async move { Ok(outcome) }),
            }));
        }
        let handle = self.handle(id).await?;
        let watch = handle.watch(&turn_id).await;
        let sessions = self.clone();
        let (sid, tid) = (id.to_string(), turn_id.clone());
        Ok(Some(StartedTurn {
            turn_id,
            waiting_for: None,
            outcome: Box::pin(async move {
                if let Some(w) = watch {
                    return Ok(w.outcome().await?);
                }
                // It ended between the read and the watch.
                let record = sessions.turn_record(&sid, &tid).await?;
                record
                    .outcome
                    .ok_or(SessionError::Turn(TurnError::Unavailable))
            }),
        }))
    }

    /// Turn `turn_id` of session `id`, as stored (the caller checked the
    /// scope).
    async fn turn_record(&self, id: &str, turn_id: &str) -> Result<TurnRecord, SessionError> {
        let not_found = || SessionError::TurnNotFound {
            session: id.to_string(),
            turn: crate::identity::quoted_id(turn_id),
        };
        if turn_id.len() > crate::identity::MAX_ID_BYTES {
            return Err(not_found());
        }
        let row = self
            .inner
            .store
            .turn(id, turn_id)
            .await?
            .ok_or_else(not_found)?;
        Ok(super::turn_rows::read(&self.inner.store, row).await?)
    }

    /// A page of the turns of a session within reach, oldest first.
    pub async fn turns(
        &self,
        scope: &Scope,
        id: &str,
        after: Option<String>,
        limit: usize,
    ) -> Result<Page<Value>, SessionError> {
        self.get(scope, id).await?;
        let page = self.inner.store.turns_of(id, after, limit).await?;
        Ok(Page {
            items: super::turn_rows::read_all(&self.inner.store, page.items).await?,
            ..page
        })
    }

    /// Turn `turn_id` of a session within reach, as stored.
    /// Waits for a turn of the session to end or pause for an approval
    /// (at once when it already has): how. What a stream that lost the
    /// turn's events sends last ([`crate::http`]'s turn logs).
    pub async fn turn_end(
        &self,
        scope: &Scope,
        id: &str,
        turn_id: &str,
    ) -> Result<TurnEnd, SessionError> {
        use super::machine::{Phase, TurnStatus};
        self.get(scope, id).await?;
        // Twice at most: a turn that ends between the read and the watch
        // is read again.
        for _ in 0..2 {
            let record = self.turn_record(id, turn_id).await?;
            match &record.phase {
                Phase::Completed => {
                    return Ok(match record.outcome {
                        Some(outcome) => TurnEnd::Completed(outcome),
                        None => TurnEnd::Failed(super::machine::TurnFailure {
                            code: ErrorCode::InternalError.as_str().to_string(),
                            message: "the turn completed but its outcome was not stored".into(),
                            details: None,
                        }),
                    });
                }
                Phase::Failed => {
                    return Ok(TurnEnd::Failed(record.error.unwrap_or(
                        super::machine::TurnFailure {
                            code: ErrorCode::InternalError.as_str().to_string(),
                            message: "the turn failed".into(),
                            details: None,
                        },
                    )));
                }
                Phase::Interrupted => return Ok(TurnEnd::Interrupted),
                _ => {}
            }
            if let Some(outcome) = paused_outcome(&record) {
                return Ok(TurnEnd::Paused(outcome));
            }
            let handle = self.handle(id).await?;
            if let Some(watch) = handle.watch(turn_id).await {
                match watch.outcome().await {
                    Ok(o) if o.status == TurnStatus::AwaitingApproval => {
                        return Ok(TurnEnd::Paused(o));
                    }
                    Ok(o) => return Ok(TurnEnd::Completed(o)),
                    // How it ended is in its record, read again.
                    Err(_) => {}
                }
            }
        }
        Err(SessionError::Turn(TurnError::Unavailable))
    }

    pub async fn turn(
        &self,
        scope: &Scope,
        id: &str,
        turn_id: &str,
    ) -> Result<TurnRecord, SessionError> {
        self.get(scope, id).await?;
        self.turn_record(id, turn_id).await
    }

    /// At start: takes up every turn a crash cut (its conversation is
    /// loaded, which resumes or closes it: see [`Self::handle`]); how many.
    /// In cluster mode it also runs every `[cluster] owner_stale_s`: the
    /// open turns of sessions whose owner died are taken over here (their
    /// claim succeeds once the owner's heartbeat is stale); sessions live
    /// on this node or owned by a live node are left alone, and the
    /// database names only the others, so a sweep costs no claim attempt
    /// per turn running elsewhere.
    pub async fn resume_cut_turns(&self) -> Result<usize, SessionError> {
        let sessions = self.inner.store.orphaned_turn_sessions().await?;
        let mut n = 0;
        for id in sessions {
            if self.is_live(&id) {
                continue;
            }
            match self.handle(&id).await {
                Ok(_) => n += 1,
                Err(SessionError::Store(StoreError::OwnedElsewhere { .. })) => {}
                Err(e) => {
                    tracing::warn!(session = %id, error = %e, "a cut turn's session could not be loaded")
                }
            }
        }
        if n > 0 {
            tracing::info!(
                sessions = n,
                "sessions with turns cut by a restart taken up"
            );
        }
        Ok(n)
    }

    /// Decides a confirmation (the one path of HTTP and MCP): the
    /// executor runs or drops the held call, then the conversation turn
    /// that waits on it, if any, looks again and goes on.
    pub async fn decide_confirmation(
        &self,
        scope: &Scope,
        id: &str,
        approve: bool,
    ) -> Result<crate::executor::DecisionOutcome, crate::executor::confirmations::ConfirmationError>
    {
        let pending = self
            .inner
            .executor
            .shared()
            .confirmations
            .get(id)
            .await
            .ok();
        let decided = self
            .inner
            .executor
            .decide_confirmation(id, scope.name(), approve)
            .await?;
        if let Some(p) = pending
            && p.context.turn_id.is_some()
            && let Some(session) = &p.context.conversation_id
            && let Ok(handle) = self.handle(session).await
        {
            let ran = p.tool_call_id.clone().zip(decided.result.clone());
            handle.check_approvals(ran);
            // A child's call: every ancestor paused on it asks again
            // ([`super::delegation`]), nearest first.
            let mut child = session.clone();
            for _ in 0..=self.inner.limits.max_delegation_depth {
                let Ok(row) = self.get(&Scope::runtime(), &child).await else {
                    break;
                };
                let Some(parent) = super::lineage::parent_of(&row) else {
                    break;
                };
                if let Ok(handle) = self.handle(parent).await {
                    handle.check_approvals(None);
                }
                child = parent.to_string();
            }
        }
        Ok(decided)
    }

    /// The settings of the session's next turn (or, after a handoff, of
    /// the rest of this one): agent, tenant, session.
    pub(super) fn settings_under(
        &self,
        session: &Session,
        config: &TenantConfig,
    ) -> Result<TurnSettings, SessionError> {
        let agent = self.agent_of(session)?;
        let mut settings = turn_settings(&agent, session, &self.inner.registry, &self.inner.limits);
        settings.apply_tenant(config);
        let tenant = self.guardrails_of(&session.tenant, config);
        if !tenant.is_empty() {
            let schema = settings.output_schema().cloned();
            settings.rules = super::settings::TurnRules::of(schema, tenant.then(&agent.guardrails));
        }
        Ok(settings)
    }

    /// The tenant's guardrails, compiled once per version of its list.
    fn guardrails_of(&self, tenant: &str, config: &TenantConfig) -> Guardrails {
        if config.guardrails.is_empty() {
            return Guardrails::default();
        }
        let mut cache = self
            .inner
            .tenant_guardrails
            .lock()
            .expect("guardrails lock");
        if let Some((list, compiled)) = cache.get(tenant)
            && *list == config.guardrails
        {
            return compiled.clone();
        }
        // A stored config was checked when it was set; one that no longer
        // compiles (written by another version) checks nothing rather than
        // refusing every turn, and says so.
        let compiled = Guardrails::compile(&config.guardrails).unwrap_or_else(|e| {
            tracing::error!(%tenant, error = %e, "the tenant's guardrails do not compile; they are not applied");
            Guardrails::default()
        });
        if cache.len() >= 10_000 {
            cache.clear();
        }
        cache.insert(
            tenant.to_string(),
            (config.guardrails.clone(), compiled.clone()),
        );
        compiled
    }

    /// The `input` guardrails on a message, before anything of it is
    /// stored or sent: the text to use (redacted or rewritten), or the
    /// block, recorded as a failed turn of the session
    /// ([`ConversationHandle::refuse`]) and answered 422
    /// `GUARDRAIL_TRIPPED`.
    async fn check_input(
        &self,
        session: &Session,
        guardrails: &Guardrails,
        content: String,
        key: Option<String>,
    ) -> Result<String, SessionError> {
        let shared = self.inner.executor.shared();
        let mut ctx = crate::tools::ExecutionContext::new(
            crate::tools::CallerType::ConversationAgent,
            session.id.clone(),
        );
        ctx.conversation_id = Some(session.id.clone());
        ctx.user_id = session.user_id.clone();
        ctx.plan = session.plan;
        ctx.tenant = Some(session.tenant.clone());
        let checks = crate::executor::guarded::GuardrailChecks {
            registry: &shared.registry,
            config: &shared.config,
            ctx: &ctx,
        };
        let checked = guardrails
            .run(Stage::Input, None, Subject::Text(content), &checks)
            .await;
        crate::executor::guarded::note(
            &shared.metrics,
            &shared.events,
            &checked,
            Some(&session.id),
            None,
            None,
        );
        match checked.tripped {
            None => Ok(checked.subject.into_text().unwrap_or_default()),
            Some(tripped) => {
                let rejection = super::actor::tripped_rejection(&tripped);
                let handle = self.handle(&session.id).await?;
                handle.refuse(rejection.clone(), key).await?;
                Err(SessionError::Turn(TurnError::Rejected(Box::new(rejection))))
            }
        }
    }

    /// Runs one turn and waits for its outcome, streaming its progress to
    /// `events` when given: [`Self::start_turn`] without a key.
    pub async fn send_message(
        &self,
        scope: &Scope,
        id: &str,
        content: String,
        events: Option<TurnSink>,
    ) -> Result<TurnOutcome, SessionError> {
        self.start_turn(scope, id, content, events, None)
            .await?
            .outcome
            .await
    }

    /// Stores a message that needs no model turn (an operator's reply), in
    /// order with the session's turns.
    pub async fn record_message(
        &self,
        scope: &Scope,
        id: &str,
        message: ChatMessage,
    ) -> Result<u64, SessionError> {
        let session = self.get(scope, id).await?;
        let config = self.tenant_config(&session.tenant).await?;
        let bytes = message.content.as_deref().map_or(0, escaped_len);
        self.admit_content(&session.tenant, &config, bytes).await?;
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

    /// Plugs in the memory the notes of `memory = { inject = true }` come
    /// from; a second call is ignored.
    pub fn use_memory(&self, memory: crate::memory::Memory) {
        let _ = self.inner.memory.set(memory);
    }

    /// The memory notes for a turn of `session` on the user's `content`
    /// (its agent says `memory = { inject = true }`), else `None`.
    async fn memory_notes(&self, session: &Session, content: &str) -> Option<String> {
        let memory = self.inner.memory.get()?;
        let agent = self.agent_of(session).ok()?;
        let template = agent.memory.as_ref().filter(|_| agent.memory_inject)?;
        memory
            .notes_for(
                template,
                &session.tenant,
                session.user_id.as_deref(),
                &agent.name,
                content,
            )
            .await
    }

    /// Deletes the session and everything stored under its id (see the
    /// module doc); refused with [`SessionError::Busy`] while a turn runs.
    pub async fn delete(&self, scope: &Scope, id: &str) -> Result<Erased, SessionError> {
        self.get(scope, id).await?;
        let live = {
            let mut live = self.inner.live.lock().expect("sessions lock");
            let mut deleting = self.inner.deleting.lock().expect("deleting lock");
            if !deleting.insert(id.to_string()) {
                // Another delete of it is under way: gone for this caller.
                return Err(SessionError::NotFound { id: id.into() });
            }
            live.remove(id)
        };
        let _unmark = Unmark(&self.inner, id);
        if let Some(handle) = live {
            match handle.retire().await {
                Ok(()) => {}
                Err(TurnError::Busy) => {
                    self.inner
                        .live
                        .lock()
                        .expect("sessions lock")
                        .insert(id.to_string(), handle);
                    return Err(SessionError::Busy { id: id.into() });
                }
                Err(e) => return Err(e.into()),
            }
        }
        let erased = self.inner.store.erase_session(id).await?;
        let erased = erased.ok_or_else(|| SessionError::NotFound { id: id.into() })?;
        tracing::info!(
            session = id,
            tenant = %erased.tenant,
            messages = erased.messages,
            calls = erased.calls,
            documents = erased.documents,
            "session deleted"
        );
        Ok(erased)
    }

    /// Deletes every session of the scope's tenant, [`ERASE_BATCH`] at a
    /// time (one store transaction per session): sessions with a running
    /// turn are left and counted as `busy`.
    pub async fn erase_tenant(&self, scope: &Scope) -> Result<TenantErase, SessionError> {
        let tenant = scope.name();
        let mut done = TenantErase::default();
        let mut after = None;
        loop {
            let page = self
                .inner
                .store
                .sessions_of(tenant, after.clone(), ERASE_BATCH)
                .await?;
            for session in &page.items {
                match self.delete(scope, &session.id).await {
                    Ok(_) => done.deleted += 1,
                    Err(SessionError::Busy { .. }) => done.busy += 1,
                    Err(SessionError::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        tracing::info!(
            tenant,
            deleted = done.deleted,
            busy = done.busy,
            "tenant sessions erased"
        );
        Ok(done)
    }

    /// Deletes every session (of `tenant`, else of every tenant) whose
    /// last activity (its last message, else its creation) is before the
    /// cut-off `before` gives for it (`None`: kept), reading
    /// [`SWEEP_PAGE`] sessions at a time; sessions with a running turn are
    /// left and counted as `busy`. The retention sweep and `DELETE
    /// /v1/sessions?before=` call it.
    pub async fn delete_idle(
        &self,
        tenant: Option<&str>,
        before: impl Fn(&Session) -> Option<Timestamp>,
    ) -> Result<TenantErase, SessionError> {
        let mut done = TenantErase::default();
        let mut after: Option<String> = None;
        loop {
            let page = self
                .inner
                .store
                .sessions_with_activity(after.clone(), SWEEP_PAGE)
                .await?;
            let full = page.len() == SWEEP_PAGE;
            after = page.last().map(|(s, _)| s.id.clone());
            for (session, last) in page {
                if tenant.is_some_and(|t| t != session.tenant) {
                    continue;
                }
                if before(&session).is_none_or(|cut| last >= cut) {
                    continue;
                }
                match self.delete(&Scope::runtime(), &session.id).await {
                    Ok(_) => done.deleted += 1,
                    Err(SessionError::Busy { .. }) => done.busy += 1,
                    Err(SessionError::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            if !full {
                return Ok(done);
            }
        }
    }

    /// Tells the retention sweep that a tenant config changed (its
    /// `retain_days` may have): it reads them again at once.
    pub fn retention_changed(&self) {
        self.inner.retention_changed.notify_one();
    }

    /// The retention of each tenant whose config sets one (`None`: kept
    /// forever), read from the store; a config that cannot be read keeps
    /// the server's.
    async fn tenant_retentions(&self) -> Result<HashMap<String, Option<Duration>>, StoreError> {
        let docs = self
            .inner
            .store
            .list_docs(crate::tenants::config::NAMESPACE, "")
            .await?;
        Ok(docs
            .into_iter()
            .filter_map(|(tenant, v)| {
                let days = v.get("retain_days")?.as_f64()?;
                Some((tenant, retention_of_days(days)))
            })
            .collect())
    }

    /// Whether this session's conversation is in memory here.
    pub fn is_live(&self, id: &str) -> bool {
        self.inner
            .live
            .lock()
            .expect("sessions lock")
            .get(id)
            .is_some_and(|h| h.is_alive())
    }

    /// Conversations currently in memory.
    pub fn resident(&self) -> usize {
        self.inner
            .live
            .lock()
            .expect("sessions lock")
            .values()
            .filter(|h| h.is_alive())
            .count()
    }

    async fn handle(&self, id: &str) -> Result<ConversationHandle, SessionError> {
        if let Some(h) = self.inner.live.lock().expect("sessions lock").get(id)
            && h.is_alive()
        {
            return Ok(h.clone());
        }
        // Taken before loading: a reopen after this makes the actor reload.
        let generation = self.inner.store.generation();
        let session = self.get(&Scope::runtime(), id).await?;
        // This node becomes the session's one writer before it reads the
        // history its writes build on ([`crate::store::owners`]).
        let writer = self.inner.store.session_writer(id).await?;
        let agent = self.agent_of(&session)?;
        let summary = self.inner.store.get_summary(id).await?;
        let covered = summary.as_ref().map_or(0, |s| s.covers_until_seq);
        // Everything the summary does not cover, up to a bound: a summary
        // that failed for a while must not make a reload unbounded.
        let (mut unsummarised, last_seq) = self
            .inner
            .store
            .unsummarised_messages(id, covered, 4 * agent.history_window.max(10))
            .await?;
        // A turn left open (cut by a restart, or paused for an approval):
        // all its messages are loaded, whatever the bound.
        let cut: Option<TurnRecord> = match self.inner.store.open_turn_of(id).await? {
            Some(row) => match super::turn_rows::read(&self.inner.store, row).await {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::error!(session = id, error = %e, "an unreadable turn record is left as it is");
                    None
                }
            },
            None => None,
        };
        if let Some(r) = &cut
            && unsummarised.first().is_none_or(|m| m.seq > r.first_seq)
        {
            let from = r.first_seq.saturating_sub(1);
            let turn = self.inner.store.messages_page(id, from, usize::MAX).await?;
            unsummarised.retain(|m| m.seq <= from);
            unsummarised.extend(turn);
        }
        // Rolled-back messages stay stored, out of every prompt.
        unsummarised.retain(|m| !m.rolled_back);
        // Sources any earlier tool call returned stay citable (successful
        // calls only, as during a turn).
        let known_sources = self
            .inner
            .store
            .calls_for_conversation(id)
            .await?
            .into_iter()
            .filter(|c| c.is_success)
            .filter_map(|c| c.source_id)
            // A fork's citations may name what its parent's calls returned
            // before the fork point ([`super::fork`]).
            .chain(super::lineage::inherited_sources(&self.inner.store, &session).await?);
        // A turn taken up here runs under the tenant's settings as when
        // it started (its guardrails included); a config that cannot be
        // read leaves the agent's, and the next turn reads it again.
        let settings = match self.tenant_config(&session.tenant).await {
            Ok(config) => self.settings_under(&session, &config)?,
            Err(_) => turn_settings(&agent, &session, &self.inner.registry, &self.inner.limits),
        };
        let machine = ConversationMachine::new(
            settings,
            unsummarised
                .into_iter()
                .map(|m| (m.seq, m.message))
                .collect(),
            summary.map(|s| RollingSummary {
                text: s.text,
                covers_until_seq: s.covers_until_seq,
            }),
            last_seq,
        )
        .with_known_sources(known_sources);
        let mut live = self.inner.live.lock().expect("sessions lock");
        if let Some(h) = live.get(id)
            && h.is_alive()
        {
            return Ok(h.clone());
        }
        if self
            .inner
            .deleting
            .lock()
            .expect("deleting lock")
            .contains(id)
        {
            return Err(SessionError::NotFound { id: id.into() });
        }
        let n = self.inner.next_arbiter.fetch_add(1, Ordering::Relaxed);
        let arbiter = &self.inner.arbiters[n % self.inner.arbiters.len()];
        // A workflow's agent node owns its session's turn: a run cut by the
        // same crash runs the node again (in a new session), so the cut
        // turn here is closed, never resumed (its tools would run twice).
        let workflow_session = session.metadata["workflow_id"].is_string();
        let conversation = Conversation::new(
            session,
            agent,
            self.inner.store.clone(),
            self.inner.executor.clone(),
            machine,
            self.inner.limits.idle_timeout,
            self.inner.metrics.clone(),
        )
        .loaded_at(generation)
        .max_queued_turns(self.inner.limits.max_queued_turns)
        .model_turn_timeout(self.inner.limits.model_turn_timeout)
        .storage_share(self.inner.storage.clone())
        .written_through(writer);
        let conversation = match cut {
            Some(record) => {
                let age = Timestamp::now().duration_since(record.updated_at);
                let window = jiff::SignedDuration::try_from(self.inner.limits.resume_window)
                    .unwrap_or(jiff::SignedDuration::MAX);
                // A paused turn waits for its decision, whatever its age.
                let what = if !workflow_session
                    && (age <= window
                        || matches!(record.phase, super::machine::Phase::AwaitingApproval { .. }))
                {
                    CutTurn::Resume
                } else {
                    CutTurn::Close
                };
                conversation.with_cut_turn(record, what)
            }
            None => conversation,
        };
        let handle = ConversationHandle::start_in(arbiter, conversation);
        live.insert(id.to_string(), handle.clone());
        Ok(handle)
    }
}

/// Takes an id off the "being deleted" list when its delete ends.
struct Unmark<'a>(&'a Inner, &'a str);

impl Drop for Unmark<'_> {
    fn drop(&mut self) {
        self.0
            .deleting
            .lock()
            .expect("deleting lock")
            .remove(self.1);
    }
}

/// Deletes the sessions idle past their tenant's retention (the module
/// doc), one pass over every session per run.
async fn retention_sweeps(weak: std::sync::Weak<Inner>) {
    let Some(changed) = weak.upgrade().map(|i| i.retention_changed.clone()) else {
        return;
    };
    loop {
        let Some(inner) = weak.upgrade() else { break };
        let sessions = Sessions { inner };
        let server = sessions.inner.limits.retain;
        let wait = match sessions.tenant_retentions().await {
            Err(e) => {
                tracing::warn!(error = %e, "retention sweep could not read the tenant configs");
                server.map_or(RETENTION_RECHECK, sweep_every)
            }
            Ok(tenants) => {
                let shortest = tenants
                    .values()
                    .flatten()
                    .chain(server.iter())
                    .min()
                    .copied();
                if shortest.is_some() {
                    let now = Timestamp::now();
                    let cut = |retain: Duration| {
                        jiff::SignedDuration::try_from(retain)
                            .ok()
                            .and_then(|r| now.checked_sub(r).ok())
                    };
                    let before = |session: &Session| {
                        let retain = match tenants.get(&session.tenant) {
                            Some(tenant) => *tenant,
                            None => server,
                        };
                        retain.and_then(cut)
                    };
                    match sessions.delete_idle(None, before).await {
                        Ok(done) if done.deleted > 0 || done.busy > 0 => tracing::info!(
                            deleted = done.deleted,
                            busy = done.busy,
                            "retention sweep deleted idle sessions"
                        ),
                        Ok(_) => {}
                        Err(e) => tracing::warn!(error = %e, "retention sweep stopped"),
                    }
                }
                shortest.map_or(RETENTION_RECHECK, sweep_every)
            }
        };
        drop(sessions);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = changed.notified() => {}
        }
    }
}
