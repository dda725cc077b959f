//! Tasks: cadre's turns as A2A tasks, and the six operations on them,
//! binding-free (the JSON-RPC and HTTP+JSON bindings call these).
//!
//! task id `{session}~{turn}` ──▶ Sessions::get (scope, agent) ──▶ Sessions::turn ──▶ TurnRecord ──▶ Task
//! SendMessage ──▶ Sessions::create (no contextId) ──▶ Sessions::start_turn ──▶ outcome / TurnEvents ──▶ Task, events

use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::error::A2aError;
use super::types::{
    Artifact, ListTasksRequest, ListTasksResponse, Message, Part, Role, SendMessageRequest,
    StreamResponse, Task, TaskArtifactUpdateEvent, TaskState, TaskStatus, TaskStatusUpdateEvent,
};
use crate::conversation::actor::TurnEvent;
use crate::conversation::machine::{Approval, Phase, TurnOutcome, TurnRecord, TurnStatus};
use crate::conversation::sessions::StartedTurn;
use crate::conversation::{NewSession, SessionError};
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::http::turn_log::{Logged, Read, Reader, Unread};
use crate::identity::{Principal, Scope, UserId};
use crate::store::{Session, SessionFilter};
use crate::tenants::config::plan_ceiling;

/// Between a task's session id and its turn id.
pub const ID_SEPARATOR: char = '~';
/// The artifact that holds a turn's answer.
pub const ANSWER_ARTIFACT: &str = "answer";
/// `pageSize` of a listing when none is given, and the most allowed.
pub const DEFAULT_PAGE_SIZE: i32 = 50;
pub const MAX_PAGE_SIZE: i32 = 100;
/// Most turn records one listing page reads while filtering (by status or
/// time): past it the page is returned short, with a token to go on.
const MAX_SCANNED: usize = 1_000;
/// How a subscription follows a turn until the per-turn event log lands:
/// it reads the turn's record first after this long, then twice as long
/// each time, up to [`SUBSCRIBE_POLL_MAX`].
pub const SUBSCRIBE_POLL_FIRST: Duration = Duration::from_millis(100);
pub const SUBSCRIBE_POLL_MAX: Duration = Duration::from_secs(1);
/// Longest a `returnImmediately` send or a stream's first event waits for
/// the turn's first record to be readable ([`Caller::stored`]).
const RECORD_WAIT: Duration = Duration::from_secs(2);
/// Events of a streamed task waiting for a slow client (the turn's own
/// events are paced before: [`paced`]).
const STREAM_BUFFER: usize = 64;

/// The task id of turn `turn` of session `session`.
pub fn task_id(session: &str, turn: &str) -> String {
    format!("{session}{ID_SEPARATOR}{turn}")
}

/// `(session, turn)` of a task id; `None` when it is not one.
pub fn split_task_id(id: &str) -> Option<(&str, &str)> {
    id.split_once(ID_SEPARATOR)
        .filter(|(s, t)| !s.is_empty() && !t.is_empty())
}

/// Who asks, and which agent's door they came through.
#[derive(Clone)]
pub struct Caller {
    pub state: AppState,
    pub principal: Principal,
    pub agent: String,
}

impl Caller {
    fn scope(&self) -> Scope {
        self.principal.scope()
    }

    /// The session `id` of this agent within the caller's reach; another
    /// tenant's or agent's is the same `None` as one that does not exist.
    async fn session(&self, id: &str) -> Result<Option<Session>, A2aError> {
        match self.state.sessions.get(&self.scope(), id).await {
            Ok(s) if s.agent == self.agent => Ok(Some(s)),
            Ok(_) | Err(SessionError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The turn behind task `id` (TaskNotFound for anything out of reach).
    async fn find(&self, id: &str) -> Result<(String, TurnRecord), A2aError> {
        let not_found = || A2aError::TaskNotFound(id.to_string());
        let (session, turn) = split_task_id(id).ok_or_else(not_found)?;
        if self.session(session).await?.is_none() {
            return Err(not_found());
        }
        match self.state.sessions.turn(&self.scope(), session, turn).await {
            Ok(record) => Ok((session.to_string(), record)),
            Err(SessionError::TurnNotFound { .. } | SessionError::NotFound { .. }) => {
                Err(not_found())
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// The A2A state of a turn's phase.
pub fn state_of(phase: &Phase) -> TaskState {
    match phase {
        Phase::Completed => TaskState::Completed,
        Phase::Failed => TaskState::Failed,
        Phase::Interrupted => TaskState::Canceled,
        Phase::AwaitingApproval { .. } => TaskState::InputRequired,
        Phase::Idle
        | Phase::AwaitingModel
        | Phase::AwaitingTools { .. }
        | Phase::Summarising { .. } => TaskState::Working,
    }
}

fn agent_message(task: &str, context: &str, text: String, metadata: Option<Value>) -> Message {
    Message {
        message_id: uuid::Uuid::now_v7().to_string(),
        context_id: Some(context.to_string()),
        task_id: Some(task.to_string()),
        role: Role::Agent,
        parts: vec![Part::text(text)],
        metadata,
    }
}

/// What a person must do for a paused turn: in words, and as metadata.
fn approval_message(task: &str, context: &str, held: &[Approval]) -> Message {
    let list = held
        .iter()
        .map(|a| {
            let about = a
                .summary
                .as_deref()
                .map(|s| format!(" ({s})"))
                .unwrap_or_default();
            format!(
                "- {}{about}: confirmation {}, decide with POST /v1/confirmations/{} and body {{\"approve\": true}} or {{\"approve\": false}}",
                a.tool_name, a.confirmation_id, a.confirmation_id
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    let text = format!(
        "Waiting for a person's decision on {} held tool call(s):\n{list}\nThe task goes on once every one is decided.",
        held.len()
    );
    let metadata = json!({ "confirmations": held });
    agent_message(task, context, text, Some(metadata))
}

/// The status message of a turn's state, where there is something to say.
fn status_message(task: &str, context: &str, record: &TurnRecord) -> Option<Message> {
    match &record.phase {
        Phase::AwaitingApproval { confirmations, .. } => {
            Some(approval_message(task, context, confirmations))
        }
        Phase::Failed => {
            let (code, message) = record
                .error
                .as_ref()
                .map_or(("FAILED", "the turn failed"), |e| {
                    (e.code.as_str(), e.message.as_str())
                });
            Some(agent_message(
                task,
                context,
                format!("The turn failed ({code}): {message}"),
                Some(json!({"error": {"code": code, "message": message}})),
            ))
        }
        Phase::Interrupted => Some(agent_message(
            task,
            context,
            "The turn was cut before it finished (a newer message under `multitask` interrupt or rollback, or a restart outside the resume window); it was not answered.".into(),
            None,
        )),
        _ => None,
    }
}

fn answer_artifact(answer: &str) -> Artifact {
    Artifact {
        artifact_id: ANSWER_ARTIFACT.into(),
        name: Some(ANSWER_ARTIFACT.into()),
        parts: vec![Part::text(answer)],
    }
}

/// How much of a task to show.
#[derive(Clone, Copy)]
struct Detail {
    artifacts: bool,
    /// `None`: no history; `Some(n)`: at most the last `n` messages.
    history: Option<usize>,
}

impl Detail {
    const FULL: Detail = Detail {
        artifacts: true,
        history: Some(usize::MAX),
    };
}

/// `historyLength` as a [`Detail::history`]: unset is everything, 0 none.
fn history_limit(length: Option<i32>, unset: Option<usize>) -> Result<Option<usize>, A2aError> {
    match length {
        None => Ok(unset),
        Some(n) if n < 0 => Err(A2aError::InvalidParams(
            "historyLength must not be negative".into(),
        )),
        Some(0) => Ok(None),
        Some(n) => Ok(Some(n as usize)),
    }
}

impl Caller {
    /// The task of a turn's record.
    async fn task(
        &self,
        session: &str,
        record: &TurnRecord,
        detail: Detail,
    ) -> Result<Task, A2aError> {
        let id = task_id(session, &record.turn_id);
        let state = state_of(&record.phase);
        let answer = record
            .outcome
            .as_ref()
            .filter(|o| o.status == TurnStatus::Completed)
            .map(|o| o.answer.as_str());
        let artifacts = detail
            .artifacts
            .then(|| answer.map(answer_artifact).into_iter().collect());
        let history = match detail.history {
            None => None,
            Some(n) => Some(self.history(session, record, &id, answer, n).await?),
        };
        Ok(Task {
            status: TaskStatus {
                state,
                message: status_message(&id, session, record),
                timestamp: Some(record.updated_at.to_string()),
            },
            context_id: session.to_string(),
            artifacts,
            history,
            metadata: Some(json!({
                "sessionId": session,
                "turnId": record.turn_id,
                "phase": record.phase.as_str(),
            })),
            id,
        })
    }

    /// The turn's messages as A2A sees them: the user's, then the answer.
    async fn history(
        &self,
        session: &str,
        record: &TurnRecord,
        task: &str,
        answer: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Message>, A2aError> {
        let mut messages = Vec::new();
        let asked = self
            .state
            .sessions
            .history(
                &self.scope(),
                session,
                record.first_seq.saturating_sub(1),
                1,
            )
            .await?;
        if let Some(text) = asked
            .into_iter()
            .find(|m| m.seq == record.first_seq)
            .and_then(|m| m.message.content)
        {
            messages.push(Message {
                message_id: format!("{task}-user"),
                context_id: Some(session.to_string()),
                task_id: Some(task.to_string()),
                role: Role::User,
                parts: vec![Part::text(text)],
                metadata: None,
            });
        }
        if let Some(answer) = answer {
            let mut m = agent_message(task, session, answer.to_string(), None);
            m.message_id = format!("{task}-answer");
            messages.push(m);
        }
        let skip = messages.len().saturating_sub(limit);
        Ok(messages.split_off(skip))
    }

    /// The task as it stands, in full (or as limited by `historyLength`).
    pub async fn get_task(&self, id: &str, history_length: Option<i32>) -> Result<Task, A2aError> {
        let history = history_limit(history_length, Some(usize::MAX))?;
        let (session, record) = self.find(id).await?;
        self.task(
            &session,
            &record,
            Detail {
                artifacts: true,
                history,
            },
        )
        .await
    }

    /// cadre cannot stop a running turn from outside (a turn is cut only by
    /// a newer message of the session under `multitask = "interrupt"`):
    /// every task is TaskNotCancelable, once it is known to exist.
    pub async fn cancel_task(&self, id: &str) -> Result<Task, A2aError> {
        let (_, record) = self.find(id).await?;
        let why = if state_of(&record.phase).is_terminal() {
            format!("task '{id}' has ended ({})", record.phase.as_str())
        } else {
            format!(
                "task '{id}' cannot be canceled: cadre has no way to stop a running turn from outside; a turn waiting for approval ends when its confirmations are declined (POST /v1/confirmations/{{id}})"
            )
        };
        Err(A2aError::TaskNotCancelable(why))
    }

    /// The text of a user message: its text parts, and its data parts as
    /// JSON, one per line.
    fn content_of(message: &Message) -> Result<String, A2aError> {
        if message.role != Role::User {
            return Err(A2aError::InvalidParams(
                "message.role must be ROLE_USER".into(),
            ));
        }
        let mut lines = Vec::new();
        for part in &message.parts {
            if let Some(text) = &part.text {
                lines.push(text.clone());
            } else if let Some(data) = &part.data {
                lines.push(data.to_string());
            } else if part.url.is_some() || part.raw.is_some() {
                return Err(A2aError::ContentTypeNotSupported(
                    "only text and data parts are read: cadre's agents take text".into(),
                ));
            }
        }
        let content = lines.join("\n");
        if content.trim().is_empty() {
            return Err(A2aError::InvalidParams(
                "message has no text: send at least one non-empty text part".into(),
            ));
        }
        Ok(content)
    }

    /// Starts the turn a message asks for: in its context's session, or a
    /// new session of the agent when it names none.
    async fn start(
        &self,
        request: &SendMessageRequest,
        events: Option<crate::conversation::actor::TurnSink>,
    ) -> Result<(String, StartedTurn), A2aError> {
        let message = &request.message;
        let config = request.configuration.clone().unwrap_or_default();
        if config
            .task_push_notification_config
            .as_ref()
            .is_some_and(|c| !c.is_null())
        {
            return Err(A2aError::PushNotificationNotSupported);
        }
        let content = Self::content_of(message)?;
        if let Some(task) = message.task_id.as_deref().filter(|t| !t.is_empty()) {
            let (_, record) = self.find(task).await?;
            let why = if state_of(&record.phase).is_terminal() {
                format!(
                    "task '{task}' has ended: send the message without taskId (same contextId) to start the next task"
                )
            } else {
                format!(
                    "task '{task}' goes on only through its confirmations (POST /v1/confirmations/{{id}}); send the message without taskId to start the next task"
                )
            };
            return Err(A2aError::UnsupportedOperation(why));
        }
        let session = match message.context_id.as_deref().filter(|c| !c.is_empty()) {
            Some(context) => {
                if self.session(context).await?.is_none() {
                    return Err(A2aError::InvalidParams(format!(
                        "no context '{}' of agent '{}'",
                        crate::identity::quoted_id(context),
                        self.agent
                    )));
                }
                context.to_string()
            }
            None => self.new_session(message).await?.id,
        };
        let started = self
            .state
            .sessions
            .start_turn(&self.scope(), &session, content, events, None)
            .await?;
        Ok((session, started))
    }

    /// A new session of the agent for a message without a context: the
    /// caller's tenant, the highest plan the key and tenant allow, the
    /// user from `metadata.userId` (or `user_id`) when it is a valid one.
    async fn new_session(&self, message: &Message) -> Result<Session, A2aError> {
        let user_id = message
            .metadata
            .as_ref()
            .and_then(|m| m.get("userId").or_else(|| m.get("user_id")))
            .and_then(Value::as_str)
            .map(|raw| {
                UserId::parse(raw)
                    .map(UserId::into_string)
                    .map_err(|e| A2aError::InvalidParams(format!("metadata.userId: {e}")))
            })
            .transpose()?;
        let plan = plan_ceiling(&self.state.store, &self.principal)
            .await
            .map_err(ApiError::from)?;
        Ok(self
            .state
            .sessions
            .create(NewSession {
                tenant: self.principal.tenant.clone(),
                agent: self.agent.clone(),
                user_id,
                plan,
                metadata: json!({"opened_by": "a2a"}),
            })
            .await?)
    }

    /// The task after its turn's outcome: the record, read again (it is
    /// written before the outcome is told); if the read is behind, the
    /// outcome's own state.
    async fn settled(
        &self,
        session: &str,
        turn: &str,
        outcome: Result<TurnOutcome, SessionError>,
        detail: Detail,
    ) -> Result<Task, A2aError> {
        let id = task_id(session, turn);
        let found = self.find(&id).await;
        let (outcome, mut record) = match (outcome, found) {
            (Ok(outcome), Ok((_, record))) => (outcome, record),
            (Err(e), Ok((_, record))) => {
                if !state_of(&record.phase).is_resting() {
                    return Err(e.into());
                }
                return self.task(session, &record, detail).await;
            }
            (Err(e), Err(_)) => return Err(e.into()),
            (Ok(_), Err(e)) => return Err(e),
        };
        if !state_of(&record.phase).is_resting() {
            record.phase = match outcome.status {
                TurnStatus::Completed => Phase::Completed,
                TurnStatus::AwaitingApproval => Phase::AwaitingApproval {
                    calls: Vec::new(),
                    confirmations: outcome.confirmations.clone(),
                },
            };
            record.outcome = Some(outcome);
        }
        self.task(session, &record, detail).await
    }

    /// The record of a turn just accepted, once the store shows it: the
    /// conversation writes a turn's first record without waiting, so a
    /// task id is handed out only when `GetTask` can find it. `None` after
    /// [`RECORD_WAIT`] (or a read error): the caller answers without it.
    async fn stored(&self, session: &str, turn: &str) -> Option<TurnRecord> {
        let deadline = tokio::time::Instant::now() + RECORD_WAIT;
        let mut wait = Duration::from_millis(2);
        loop {
            match self.state.sessions.turn(&self.scope(), session, turn).await {
                Ok(record) => return Some(record),
                Err(SessionError::TurnNotFound { .. }) => {}
                Err(_) => return None,
            }
            if tokio::time::Instant::now() + wait > deadline {
                return None;
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_millis(50));
        }
    }

    /// A task waiting behind a paused turn (`multitask = "enqueue"`): it
    /// has no record of its own until it starts.
    fn queued_task(&self, session: &str, turn: &str, waiting_for: &str) -> Task {
        let id = task_id(session, turn);
        let behind = task_id(session, waiting_for);
        Task {
            status: TaskStatus {
                state: TaskState::Submitted,
                message: Some(agent_message(
                    &id,
                    session,
                    format!(
                        "Queued behind task {behind}, which waits for a person's decision; it starts once that task ends."
                    ),
                    Some(json!({"waitingFor": behind})),
                )),
                timestamp: Some(jiff::Timestamp::now().to_string()),
            },
            context_id: session.to_string(),
            artifacts: Some(Vec::new()),
            history: None,
            metadata: Some(json!({"sessionId": session, "turnId": turn})),
            id,
        }
    }

    /// A task just accepted, before its first record.
    fn submitted_task(session: &str, turn: &str, state: TaskState) -> Task {
        Task {
            status: TaskStatus {
                state,
                message: None,
                timestamp: Some(jiff::Timestamp::now().to_string()),
            },
            context_id: session.to_string(),
            artifacts: Some(Vec::new()),
            history: None,
            metadata: Some(json!({"sessionId": session, "turnId": turn})),
            id: task_id(session, turn),
        }
    }

    /// `SendMessage`: blocks until the task is completed, failed, canceled
    /// or input-required, unless `returnImmediately`.
    pub async fn send_message(&self, request: SendMessageRequest) -> Result<Task, A2aError> {
        let immediately = request
            .configuration
            .as_ref()
            .is_some_and(|c| c.return_immediately);
        let detail = Detail {
            artifacts: true,
            history: history_limit(
                request
                    .configuration
                    .as_ref()
                    .and_then(|c| c.history_length),
                Some(usize::MAX),
            )?,
        };
        if immediately {
            // The turn runs on with its events logged, for subscribers.
            let (tx, rx) = mpsc::unbounded_channel();
            let (session, started) = self.start(&request, Some(tx)).await?;
            let (turn, waiting_for) = (started.turn_id.clone(), started.waiting_for.clone());
            if turn.is_empty() {
                // The conversation's actor had just stopped: the outcome
                // submits the turn again, and its id comes with it.
                let outcome = started.outcome.await;
                drop(rx);
                let turn = outcome
                    .as_ref()
                    .map(|o| o.turn_id.clone())
                    .unwrap_or_default();
                if turn.is_empty() {
                    return Err(outcome
                        .err()
                        .map_or_else(|| A2aError::TaskNotFound(String::new()), A2aError::from));
                }
                return self.settled(&session, &turn, outcome, detail).await;
            }
            self.state
                .turn_logs
                .follow(&session, started, rx, Unread::Keep);
            if let Some(waiting_for) = waiting_for {
                return Ok(self.queued_task(&session, &turn, &waiting_for));
            }
            return match self.stored(&session, &turn).await {
                Some(record) => self.task(&session, &record, detail).await,
                None => Ok(Self::submitted_task(&session, &turn, TaskState::Submitted)),
            };
        }
        let (session, started) = self.start(&request, None).await?;
        let turn = started.turn_id.clone();
        if let Some(waiting_for) = started.waiting_for.clone() {
            tokio::spawn(started.outcome);
            return Ok(self.queued_task(&session, &turn, &waiting_for));
        }
        // An empty id: the conversation's actor had just stopped and the
        // turn is submitted again by the outcome; its id comes with it.
        if immediately && !turn.is_empty() {
            tokio::spawn(started.outcome);
            return match self.stored(&session, &turn).await {
                Some(record) => self.task(&session, &record, detail).await,
                None => Ok(Self::submitted_task(&session, &turn, TaskState::Submitted)),
            };
        }
        let outcome = started.outcome.await;
        let turn = outcome.as_ref().map_or(turn, |o| o.turn_id.clone());
        if turn.is_empty() {
            return Err(outcome
                .err()
                .map_or_else(|| A2aError::TaskNotFound(String::new()), A2aError::from));
        }
        self.settled(&session, &turn, outcome, detail).await
    }

    /// `SendStreamingMessage`: the task, then its status and artifact
    /// updates, closed once it is completed, failed, canceled or
    /// input-required (module doc of [`super`]: how turn events map).
    pub async fn send_streaming(
        &self,
        request: SendMessageRequest,
    ) -> Result<mpsc::Receiver<StreamResponse>, A2aError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let (session, started) = self.start(&request, Some(tx)).await?;
        // The turn's events go to its log (so `SubscribeToTask`, and
        // `GET /v1/sessions/{id}/turns/{turn}/events`, can follow it too);
        // this stream reads the log at the client's pace.
        let (_log, reader) = self
            .state
            .turn_logs
            .follow(&session, started, rx, Unread::Abandon);
        let mapper = Mapper {
            session,
            task: None,
            answering: false,
            done: false,
        };
        Ok(self.relay(mapper, reader))
    }

    /// Maps what `reader` reads into A2A stream responses, until the task
    /// rests (completed, failed, canceled, input-required) or the log ends.
    fn relay(&self, mut mapper: Mapper, mut reader: Reader) -> mpsc::Receiver<StreamResponse> {
        let (out, out_rx) = mpsc::channel(STREAM_BUFFER);
        let caller = self.clone();
        tokio::spawn(async move {
            while let Some(read) = reader.next().await {
                // A reader that fell behind the log's bound missed deltas:
                // the whole answer comes again at the end.
                let Read::Frame(frame) = read else { continue };
                let responses = match frame.decode() {
                    Some(Logged::Event(event)) => {
                        // The Task goes out once GetTask can find it.
                        if let TurnEvent::TurnStarted { turn_id, .. } = &event
                            && mapper.task.is_none()
                        {
                            caller.stored(&mapper.session, turn_id).await;
                        }
                        mapper.map(&caller, event)
                    }
                    Some(Logged::Failed { code, message }) => vec![mapper.failed(&code, &message)],
                    None => Vec::new(),
                };
                for response in responses {
                    if out.send(response).await.is_err() {
                        return;
                    }
                }
                if mapper.done {
                    return;
                }
            }
        });
        out_rx
    }

    /// `SubscribeToTask`: the task as it stands, then its updates until it
    /// ends. The turn is followed by reading its record (see
    /// [`SUBSCRIBE_POLL_FIRST`]); a terminal task is UnsupportedOperation.
    pub async fn subscribe(&self, id: &str) -> Result<mpsc::Receiver<StreamResponse>, A2aError> {
        let (session, record) = self.find(id).await?;
        if state_of(&record.phase).is_terminal() {
            return Err(A2aError::UnsupportedOperation(format!(
                "task '{id}' has ended ({}): read it with GetTask",
                record.phase.as_str()
            )));
        }
        let first = self.task(&session, &record, Detail::FULL).await?;
        // Started here with a log (a streamed send): its events, from the
        // first (the answer so far comes as artifact pieces).
        if let Some(log) = self.state.turn_logs.get(&session, &record.turn_id) {
            let (out, out_rx) = mpsc::channel(STREAM_BUFFER);
            let _ = out.try_send(StreamResponse::Task(Box::new(first)));
            let mapper = Mapper {
                session,
                task: Some(id.to_string()),
                answering: false,
                done: false,
            };
            let mut events = self.relay(mapper, log.reader(None));
            tokio::spawn(async move {
                while let Some(response) = events.recv().await {
                    if out.send(response).await.is_err() {
                        return;
                    }
                }
            });
            return Ok(out_rx);
        }
        let (out, out_rx) = mpsc::channel(STREAM_BUFFER);
        let caller = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            if out
                .send(StreamResponse::Task(Box::new(first)))
                .await
                .is_err()
            {
                return;
            }
            let mut last = (record.phase.as_str(), record.tool_calls.len());
            let mut wait = SUBSCRIBE_POLL_FIRST;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = out.closed() => return,
                }
                wait = (wait * 2).min(SUBSCRIBE_POLL_MAX);
                let record = match caller.find(&id).await {
                    Ok((_, record)) => record,
                    // Deleted meanwhile: nothing more will come.
                    Err(A2aError::TaskNotFound(_)) => return,
                    // The store is away: try again at the next tick.
                    Err(_) => continue,
                };
                let now = (record.phase.as_str(), record.tool_calls.len());
                if now == last {
                    continue;
                }
                last = now;
                wait = SUBSCRIBE_POLL_FIRST;
                let state = state_of(&record.phase);
                let mut responses = Vec::new();
                if let Some(outcome) = record
                    .outcome
                    .as_ref()
                    .filter(|o| state == TaskState::Completed && o.status == TurnStatus::Completed)
                {
                    responses.push(StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
                        task_id: id.clone(),
                        context_id: session.clone(),
                        artifact: answer_artifact(&outcome.answer),
                        append: false,
                        last_chunk: true,
                    }));
                }
                responses.push(StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
                    task_id: id.clone(),
                    context_id: session.clone(),
                    status: TaskStatus {
                        state,
                        message: status_message(&id, &session, &record),
                        timestamp: Some(record.updated_at.to_string()),
                    },
                    metadata: Some(json!({"phase": record.phase.as_str()})),
                }));
                for response in responses {
                    if out.send(response).await.is_err() {
                        return;
                    }
                }
                if state.is_terminal() {
                    return;
                }
            }
        });
        Ok(out_rx)
    }

    /// `ListTasks`: the caller's tasks of this agent, one context's or
    /// all, cursor-paged (module doc of [`super`]: the order).
    pub async fn list_tasks(
        &self,
        request: ListTasksRequest,
    ) -> Result<ListTasksResponse, A2aError> {
        let page_size = request.page_size.unwrap_or(DEFAULT_PAGE_SIZE);
        if !(1..=MAX_PAGE_SIZE).contains(&page_size) {
            return Err(A2aError::InvalidParams(format!(
                "pageSize must be between 1 and {MAX_PAGE_SIZE}"
            )));
        }
        let history = history_limit(request.history_length, None)?;
        let detail = Detail {
            artifacts: request.include_artifacts.unwrap_or(false),
            history,
        };
        let after: Option<jiff::Timestamp> = request
            .status_timestamp_after
            .as_deref()
            .filter(|t| !t.is_empty())
            .map(|t| {
                t.parse()
                    .map_err(|e| A2aError::InvalidParams(format!("statusTimestampAfter: {e}")))
            })
            .transpose()?;
        let status = request.status.filter(|s| *s != TaskState::Unspecified);
        let keeps = |record: &TurnRecord| {
            status.is_none_or(|s| state_of(&record.phase) == s)
                && after.is_none_or(|t| record.updated_at > t)
        };
        // The token: how many tasks the earlier pages listed, and the last
        // task looked at (`{session}~` alone: that whole session was).
        let token = request.page_token.as_deref().filter(|t| !t.is_empty());
        let (done_before, resume) = match token {
            None => (0usize, None),
            Some(t) => {
                let bad =
                    || A2aError::InvalidParams("pageToken is not one this server gave".into());
                let (count, last) = t.split_once('/').ok_or_else(bad)?;
                let count: usize = count.parse().map_err(|_| bad())?;
                let (s, tid) = last.split_once(ID_SEPARATOR).ok_or_else(bad)?;
                if s.is_empty() {
                    return Err(bad());
                }
                let tid = (!tid.is_empty()).then(|| tid.to_string());
                (count, Some((s.to_string(), tid)))
            }
        };
        let context = request.context_id.as_deref().filter(|c| !c.is_empty());
        if let (Some(c), Some((s, _))) = (context, &resume)
            && c != s
        {
            return Err(A2aError::InvalidParams(
                "pageToken belongs to another contextId".into(),
            ));
        }
        let want = page_size as usize;
        let mut found: Vec<(String, TurnRecord)> = Vec::new();
        // Sessions and turns read for this page, bounded by MAX_SCANNED.
        let mut scanned = 0usize;
        // The last task (or whole session) looked at, and whether more may
        // follow it.
        let mut last: Option<(String, Option<String>)> = None;
        let mut more = false;
        // The sessions to read, in order: the context's, or the agent's,
        // newest first, from where the token left off; each with the turn
        // to go on after.
        let mut sessions: std::collections::VecDeque<(String, Option<String>)> =
            std::collections::VecDeque::new();
        let mut session_cursor: Option<String> = None;
        let mut sessions_done = false;
        match (context, resume) {
            (Some(c), resume) => {
                let after = resume.and_then(|(_, t)| t);
                sessions.push_back((c.to_string(), after));
                sessions_done = true;
            }
            (None, Some((s, after))) => {
                session_cursor = Some(s.clone());
                if after.is_some() {
                    sessions.push_back((s, after));
                }
            }
            (None, None) => {}
        }
        'outer: loop {
            let Some((session, mut turn_cursor)) = sessions.pop_front() else {
                if sessions_done {
                    break;
                }
                let page = self
                    .state
                    .sessions
                    .list(
                        &self.scope(),
                        SessionFilter {
                            agent: Some(self.agent.clone()),
                            user_id: None,
                            newest_first: true,
                        },
                        session_cursor.clone(),
                        100,
                    )
                    .await?;
                sessions_done = page.next.is_none();
                session_cursor = page.next.clone();
                sessions.extend(page.items.into_iter().map(|s| (s.id, None)));
                if sessions.is_empty() {
                    break;
                }
                continue;
            };
            if found.len() == want || scanned >= MAX_SCANNED {
                more = true;
                break;
            }
            scanned += 1;
            // Gone, or not this agent's (a token names it): nothing listed.
            if self.session(&session).await?.is_none() {
                last = Some((session, None));
                continue;
            }
            loop {
                let page = match self
                    .state
                    .sessions
                    .turns(&self.scope(), &session, turn_cursor.take(), 100)
                    .await
                {
                    Ok(page) => page,
                    // Deleted meanwhile.
                    Err(SessionError::NotFound { .. }) => break,
                    Err(e) => return Err(e.into()),
                };
                let next = page.next.clone();
                for value in page.items {
                    let Ok(record) = serde_json::from_value::<TurnRecord>(value) else {
                        continue;
                    };
                    if found.len() == want || scanned >= MAX_SCANNED {
                        more = true;
                        break 'outer;
                    }
                    scanned += 1;
                    last = Some((session.clone(), Some(record.turn_id.clone())));
                    if keeps(&record) {
                        found.push((session.clone(), record));
                    }
                }
                match next {
                    Some(n) => turn_cursor = Some(n),
                    None => break,
                }
            }
            last = Some((session, None));
        }
        let mut tasks = Vec::with_capacity(found.len());
        for (session, record) in &found {
            tasks.push(self.task(session, record, detail).await?);
        }
        let total = done_before + tasks.len();
        let next_page_token = match (more, last) {
            (true, Some((s, t))) => format!(
                "{total}/{s}{ID_SEPARATOR}{}",
                t.as_deref().unwrap_or_default()
            ),
            _ => String::new(),
        };
        Ok(ListTasksResponse {
            page_size: tasks.len() as i32,
            total_size: i32::try_from(total + usize::from(more)).unwrap_or(i32::MAX),
            tasks,
            next_page_token,
        })
    }
}

/// A streamed turn's events as A2A stream responses.
struct Mapper {
    session: String,
    /// The task's id, once the turn said its own.
    task: Option<String>,
    /// Some of the answer was sent: the next piece appends.
    answering: bool,
    /// A resting state was sent: the stream ends.
    done: bool,
}

impl Mapper {
    fn status(
        &self,
        state: TaskState,
        message: Option<Message>,
        metadata: Option<Value>,
    ) -> StreamResponse {
        StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
            task_id: self.task.clone().unwrap_or_default(),
            context_id: self.session.clone(),
            status: TaskStatus {
                state,
                message,
                timestamp: Some(jiff::Timestamp::now().to_string()),
            },
            metadata,
        })
    }

    fn artifact(&self, text: &str, append: bool, last_chunk: bool) -> StreamResponse {
        StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
            task_id: self.task.clone().unwrap_or_default(),
            context_id: self.session.clone(),
            artifact: answer_artifact(text),
            append,
            last_chunk,
        })
    }

    /// The task first, once its id is known.
    fn open(
        &mut self,
        caller: &Caller,
        turn: &str,
        waiting_for: Option<&str>,
    ) -> Vec<StreamResponse> {
        if self.task.is_some() {
            return vec![self.status(TaskState::Working, None, None)];
        }
        self.task = Some(task_id(&self.session, turn));
        let task = match waiting_for {
            Some(w) => caller.queued_task(&self.session, turn, w),
            None => Caller::submitted_task(&self.session, turn, TaskState::Working),
        };
        vec![StreamResponse::Task(Box::new(task))]
    }

    fn ended(&mut self, outcome: &TurnOutcome) -> Vec<StreamResponse> {
        self.done = true;
        let task = self.task.clone().unwrap_or_default();
        match outcome.status {
            TurnStatus::Completed => vec![
                self.artifact(&outcome.answer, false, true),
                self.status(TaskState::Completed, None, None),
            ],
            TurnStatus::AwaitingApproval => {
                let message = approval_message(&task, &self.session, &outcome.confirmations);
                vec![self.status(TaskState::InputRequired, Some(message), None)]
            }
        }
    }

    fn map(&mut self, caller: &Caller, event: TurnEvent) -> Vec<StreamResponse> {
        match event {
            TurnEvent::TurnQueued {
                turn_id,
                waiting_for,
            } => self.open(caller, &turn_id, Some(&waiting_for)),
            TurnEvent::TurnStarted { turn_id, .. } => self.open(caller, &turn_id, None),
            _ if self.task.is_none() => Vec::new(),
            TurnEvent::ModelDelta { text } => {
                let append = self.answering;
                self.answering = true;
                vec![self.artifact(&text, append, false)]
            }
            TurnEvent::ToolCallStarted { id, name, .. } => vec![self.status(
                TaskState::Working,
                Some(agent_message(
                    self.task.as_deref().unwrap_or_default(),
                    &self.session,
                    format!("Calling tool {name}."),
                    None,
                )),
                Some(json!({"toolCall": {"id": id, "name": name}})),
            )],
            TurnEvent::ToolCallCompleted { call } => {
                let report = serde_json::to_value(&call).unwrap_or(Value::Null);
                vec![self.status(
                    TaskState::Working,
                    Some(agent_message(
                        self.task.as_deref().unwrap_or_default(),
                        &self.session,
                        format!("Tool {} finished.", call.name),
                        None,
                    )),
                    Some(json!({ "toolCall": report })),
                )]
            }
            TurnEvent::TurnCompleted(outcome) | TurnEvent::TurnPaused(outcome) => {
                self.ended(&outcome)
            }
            TurnEvent::TurnInterrupted { turn_id } => {
                self.done = true;
                let task = task_id(&self.session, &turn_id);
                let message = agent_message(
                    &task,
                    &self.session,
                    "The turn was cut by a newer message of the session; it was not answered."
                        .into(),
                    None,
                );
                vec![self.status(TaskState::Canceled, Some(message), None)]
            }
            TurnEvent::ChildEvent { .. } => Vec::new(),
        }
    }

    /// The turn failed with `code`: the task's last status.
    fn failed(&mut self, code: &str, message: &str) -> StreamResponse {
        self.done = true;
        let task = self.task.clone().unwrap_or_default();
        let text = format!("The turn failed ({code}): {message}");
        let message = agent_message(
            &task,
            &self.session,
            text,
            Some(json!({"error": {"code": code, "message": message}})),
        );
        self.status(TaskState::Failed, Some(message), None)
    }
}
