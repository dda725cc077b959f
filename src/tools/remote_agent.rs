//! Remote agents: `ask_<name>` of an agent that another service runs,
//! reached over A2A v1.0 (issue #32 part 3).
//!
//! agent file `[[remote_agents]]` ──agents::publish_agent_tools──▶ [`RemoteAgents::ask_tool`] (agent layer)
//! executor ──AskRemote::call──▶ card (`<url>/.well-known/agent-card.json`, cached)
//!     ──SendMessage (returnImmediately)──▶ remote ──task id──▶ store ([`REMOTE_TASKS`], durable)
//!     ──GetTask (polled)──▶ terminal or input-required ──▶ the tool's outcome
//!
//! Offered, reached and admitted like a local `ask_` tool
//! ([`super::delegate`]): same name, parameters and description builder;
//! an `Entry::Agent`, so only the turns of the agents listing it can call
//! it, through the executor (rate limits, plans, validation, the call's
//! timeout and retries, its record), and its wait holds no tool-pool slot
//! (the remote may be a cadre, this one even, whose turn needs them).
//!
//! Decisions:
//! - **The card** is fetched in the background when the agent files load
//!   or reload (startup never waits for a remote), and again at the first
//!   call while it is not known. Once known it is kept for the process;
//!   the tools are then published again, so a remote whose file entry has
//!   no `description` is described by its card. Until then (a remote down
//!   at startup) the tool is offered with the lead sentence only, and a
//!   call fails with a clear error while the remote stays down.
//! - **Binding**: JSON-RPC only, the card's first `JSONRPC` interface of
//!   protocol version 1.x; a card offering none is a clear failure (the
//!   HTTP+JSON binding is not spoken). Every request carries
//!   `A2A-Version: 1.0`, and the key (`api_key_env`) as
//!   `Authorization: Bearer`, card fetch included.
//! - **Origins**: the URL is the operator's, like a model endpoint, so
//!   loopback and private addresses are allowed (no SSRF guard); but what
//!   answers it is not: a redirect to another origin is refused, and so is
//!   a card whose JSON-RPC interface is on another origin than the
//!   configured URL.
//! - **Bounded**: every reply (card, SendMessage, GetTask) is read up to
//!   [`MAX_REPLY_BYTES`] and refused past it, never buffered whole; no
//!   stream is read (the task is polled), so there is no SSE event to cap.
//!   Each request has [`REQUEST_TIMEOUT`]. The remote's text is data: it
//!   comes back as the tool's outcome, as a local child's answer does.
//! - **Not blocking, polled**: `SendMessage` with `returnImmediately`, so
//!   the task id is known (and recorded) before the wait; then `GetTask`
//!   every [`POLL_FIRST`] doubling to [`POLL_MAX`] until the task is
//!   terminal or interrupted. The wait ends with the asking turn's tool
//!   batch deadline at the latest (the tool's own timeout is
//!   [`super::delegate::ASK_TIMEOUT`]).
//! - **Exactly once, durably**: the remote task id is written to the store
//!   (namespace [`REMOTE_TASKS`], key the call's idempotency key, linked to
//!   the asking session and fenced by its writer) before waiting. A call
//!   run again with that key (a turn resumed after a crash, a retried
//!   batch, the executor's retry) polls that task and sends nothing. The
//!   `messageId` is derived from the key too, so a remote that dedupes by
//!   message id sees a resend as the same message: the one window left is
//!   a crash between the remote's reply to `SendMessage` and the write.
//! - **Retries**: failures before anything was sent (connection refused,
//!   the card) and failures while polling are transient, so the executor
//!   retries them when its caller asks for retries (a retry polls, never
//!   resends; a conversation's calls get none, so a remote that is down
//!   fails the call at once, and the model reads why). Polling itself
//!   rides out [`MAX_POLL_BLIPS`] transient failures in a row. A
//!   `SendMessage` whose reply was lost is not retried (the remote may
//!   have the message).
//! - **Outcome**: `{"agent", "answer", "state", "task_id"}` (no `task_id`
//!   when the remote answers with a direct message instead of a task).
//!   `answer` is the text of the task's artifacts (data parts as JSON),
//!   else of its status message. A task
//!   that is `input-required` is an outcome, not a failure: `state:
//!   "input_required"` with the remote's question as `answer`; the next
//!   ask of that remote from the same session continues that task (its
//!   `taskId` and `contextId` sent), so the model answers the question by
//!   asking again. `failed`, `rejected`, `canceled` and `auth-required`
//!   are tool failures carrying the remote's status message.
//! - **Cut together**: when the asking turn is cut (`multitask =
//!   "interrupt"` or `"rollback"`), the wait ends and the remote is sent
//!   `CancelTask` for the task (best effort: a remote that cannot cancel
//!   finishes it, unread).
//! - **One remote conversation per session**: the asking session keeps
//!   the remote's `contextId` (namespace [`REMOTE_CONTEXTS`], key
//!   `<session>/<agent>`), so asking the same remote again continues the
//!   same remote context, as a local child session does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use serde_json::{Value, json};
use sha2::Digest;
use url::Url;

use super::builtin::http::read_capped;
use super::definition::ToolDefinition;
use super::delegate::{ASK_TIMEOUT, ask_definition};
use super::{ExecutionContext, ToolError, ToolHandler};
use crate::store::{Store, WriteOp};

/// Where a remote's card is, under its URL.
pub const CARD_PATH: &str = "/.well-known/agent-card.json";
/// The protocol version cadre speaks (sent as `A2A-Version`).
pub const A2A_VERSION: &str = "1.0";
/// Largest reply read from a remote (card, `SendMessage`, `GetTask`).
pub const MAX_REPLY_BYTES: usize = 1 << 20;
/// Time allowed for one HTTP request to a remote.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// First pause between two `GetTask`; doubles up to [`POLL_MAX`].
pub const POLL_FIRST: Duration = Duration::from_millis(100);
pub const POLL_MAX: Duration = Duration::from_secs(2);
/// Transient `GetTask` failures in a row a wait rides out.
pub const MAX_POLL_BLIPS: u32 = 5;
/// Store namespace of the remote task of each call, keyed by idempotency key.
pub const REMOTE_TASKS: &str = "remote_tasks";
/// Store namespace of each session's remote context per remote agent.
pub const REMOTE_CONTEXTS: &str = "remote_contexts";

/// A remote agent as an agent file declares it, checked.
#[derive(Clone, PartialEq, Eq)]
pub struct RemoteAgent {
    pub name: String,
    /// Its base URL: the card is at `<url>/.well-known/agent-card.json`.
    pub url: Url,
    /// The variable holding its key, if any.
    pub api_key_env: Option<String>,
    /// The key itself (read when the file loads; never logged).
    api_key: Option<String>,
    /// The file's description; `None`: the card's.
    pub description: Option<String>,
}

impl std::fmt::Debug for RemoteAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteAgent")
            .field("name", &self.name)
            .field("url", &self.url.as_str())
            .field("api_key_env", &self.api_key_env)
            .field("description", &self.description)
            .finish_non_exhaustive()
    }
}

/// Why a `[[remote_agents]]` entry does not load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteAgentError {
    #[error(
        "remote agent name '{0}' is not valid: use 1-60 letters, digits, '_' or '-' (the model calls it as ask_<name>)"
    )]
    Name(String),
    #[error("remote agent '{name}': url '{url}' is not an http(s) URL")]
    Url { name: String, url: String },
}

impl RemoteAgent {
    /// Checks an entry: the name is a tool-name suffix, the URL http(s)
    /// without credentials; the key is read from `api_key_env` (a variable
    /// that is not set is warned about, and calls fail saying so).
    pub fn new(
        name: &str,
        url: &str,
        api_key_env: Option<&str>,
        description: Option<&str>,
    ) -> Result<RemoteAgent, RemoteAgentError> {
        let valid_name = !name.is_empty()
            && name.len() <= 60
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid_name {
            return Err(RemoteAgentError::Name(name.into()));
        }
        let bad_url = || RemoteAgentError::Url {
            name: name.into(),
            url: url.into(),
        };
        let mut parsed = Url::parse(url).map_err(|_| bad_url())?;
        if !matches!(parsed.scheme(), "http" | "https")
            || parsed.host().is_none()
            || !parsed.username().is_empty()
            || parsed.password().is_some()
        {
            return Err(bad_url());
        }
        parsed.set_fragment(None);
        let api_key = api_key_env.and_then(|v| std::env::var(v).ok().filter(|k| !k.is_empty()));
        if let (Some(variable), None) = (api_key_env, &api_key) {
            tracing::warn!(remote_agent = %name, variable, "remote agent {name}: api_key_env names {variable}, which is not set (or empty): its calls fail until it is set and cadre restarted");
        }
        Ok(RemoteAgent {
            name: name.into(),
            url: parsed,
            api_key_env: api_key_env.map(str::to_string),
            api_key,
            description: description
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(str::to_string),
        })
    }

    /// The card's URL: `<url>/.well-known/agent-card.json`.
    pub fn card_url(&self) -> Url {
        let mut url = self.url.clone();
        url.set_query(None);
        let path = format!("{}{CARD_PATH}", url.path().trim_end_matches('/'));
        url.set_path(&path);
        url
    }
}

/// What cadre uses of a remote's card.
#[derive(Debug, Clone, PartialEq)]
pub struct Card {
    pub description: String,
    /// Its JSON-RPC interface.
    pub rpc_url: Url,
}

enum CardState {
    Fetching,
    Known(Arc<Card>),
    Failed,
}

/// The remote agents' shared parts: the HTTP client, the store the task
/// ids go to, and the cards read so far (by card URL). Clones share them.
#[derive(Clone)]
pub struct RemoteAgents {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    client: reqwest::Client,
    cards: Mutex<HashMap<Url, CardState>>,
    /// Told when a card becomes known (the runtime publishes the agent
    /// tools again, with the card's description).
    cards_changed: tokio::sync::Notify,
}

/// The origin of `url` (scheme, host, port).
fn origin(url: &Url) -> url::Origin {
    url.origin()
}

impl RemoteAgents {
    pub fn new(store: Store) -> RemoteAgents {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(REQUEST_TIMEOUT)
            .redirect(reqwest::redirect::Policy::custom(|attempt| {
                let first = attempt
                    .previous()
                    .first()
                    .map(origin)
                    .unwrap_or_else(|| origin(attempt.url()));
                if origin(attempt.url()) != first {
                    let to = attempt.url().to_string();
                    attempt.error(format!("redirected to {to}, another origin: refused"))
                } else if attempt.previous().len() > 5 {
                    attempt.error("more than 5 redirects")
                } else {
                    attempt.follow()
                }
            }))
            .build()
            .expect("the remote agents' HTTP client builds");
        RemoteAgents {
            inner: Arc::new(Inner {
                store,
                client,
                cards: Mutex::default(),
                cards_changed: tokio::sync::Notify::new(),
            }),
        }
    }

    /// Resolves once a card became known since the last call (the runtime
    /// then publishes the agent tools again).
    pub async fn cards_changed(&self) {
        self.inner.cards_changed.notified().await
    }

    fn cards(&self) -> std::sync::MutexGuard<'_, HashMap<Url, CardState>> {
        self.inner
            .cards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The card of `remote`, if read already.
    pub fn known_card(&self, remote: &RemoteAgent) -> Option<Arc<Card>> {
        match self.cards().get(&remote.card_url()) {
            Some(CardState::Known(card)) => Some(card.clone()),
            _ => None,
        }
    }

    /// Starts reading `remote`'s card in the background unless it is known
    /// or being read; never waits for it.
    pub fn prefetch(&self, remote: &RemoteAgent) {
        let url = remote.card_url();
        {
            let mut cards = self.cards();
            if matches!(
                cards.get(&url),
                Some(CardState::Known(_) | CardState::Fetching)
            ) {
                return;
            }
            if tokio::runtime::Handle::try_current().is_err() {
                return;
            }
            cards.insert(url, CardState::Fetching);
        }
        let (this, remote) = (self.clone(), remote.clone());
        tokio::spawn(async move {
            if let Err(e) = this.card(&remote).await {
                tracing::warn!(remote_agent = %remote.name, "the card of remote agent {} could not be read (read again at its first call): {e}", remote.name);
            }
        });
    }

    /// `remote`'s card: the one read before, else read now.
    async fn card(&self, remote: &RemoteAgent) -> Result<Arc<Card>, ToolError> {
        if let Some(card) = self.known_card(remote) {
            return Ok(card);
        }
        let url = remote.card_url();
        let read = self.read_card(remote, &url).await;
        let mut cards = self.cards();
        match read {
            Ok(card) => {
                let card = Arc::new(card);
                cards.insert(url, CardState::Known(card.clone()));
                drop(cards);
                self.inner.cards_changed.notify_one();
                Ok(card)
            }
            Err(e) => {
                cards.insert(url, CardState::Failed);
                Err(e)
            }
        }
    }

    async fn read_card(&self, remote: &RemoteAgent, url: &Url) -> Result<Card, ToolError> {
        let request = self.inner.client.get(url.clone());
        let body = self.exchange(remote, request, url, true).await?;
        let card: Value = serde_json::from_slice(&body).map_err(|e| {
            ToolError::failed(format!(
                "the card of remote agent {} ({url}) is not JSON: {e}",
                remote.name
            ))
        })?;
        let interfaces = card["supportedInterfaces"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let jsonrpc = interfaces.iter().find(|i| {
            i["protocolBinding"] == "JSONRPC"
                && i["protocolVersion"]
                    .as_str()
                    .is_none_or(|v| v == "1" || v.starts_with("1."))
        });
        let Some(interface) = jsonrpc else {
            let offered: Vec<String> = interfaces
                .iter()
                .map(|i| {
                    format!(
                        "{} {}",
                        i["protocolBinding"].as_str().unwrap_or("?"),
                        i["protocolVersion"].as_str().unwrap_or("?")
                    )
                })
                .collect();
            return Err(ToolError::failed(format!(
                "remote agent {} offers no A2A 1.0 JSON-RPC interface (its card lists: {}); cadre speaks only that binding",
                remote.name,
                if offered.is_empty() {
                    "none".to_string()
                } else {
                    offered.join(", ")
                }
            )));
        };
        let rpc_url = interface["url"]
            .as_str()
            .and_then(|u| Url::parse(u).ok())
            .ok_or_else(|| {
                ToolError::failed(format!(
                    "the card of remote agent {} has a JSON-RPC interface without a valid url",
                    remote.name
                ))
            })?;
        if origin(&rpc_url) != origin(&remote.url) {
            return Err(ToolError::failed(format!(
                "the card of remote agent {} puts its JSON-RPC interface at {rpc_url}, another origin than {}: refused",
                remote.name, remote.url
            )));
        }
        Ok(Card {
            description: card["description"].as_str().unwrap_or_default().to_string(),
            rpc_url,
        })
    }

    /// Sends `request` (with the version header and the key), reads the
    /// reply up to [`MAX_REPLY_BYTES`]; `safe`: a transport failure may
    /// be retried (nothing was sent, or resending changes nothing).
    async fn exchange(
        &self,
        remote: &RemoteAgent,
        mut request: reqwest::RequestBuilder,
        url: &Url,
        safe: bool,
    ) -> Result<Vec<u8>, ToolError> {
        let name = &remote.name;
        if let Some(variable) = &remote.api_key_env {
            let Some(key) = &remote.api_key else {
                return Err(ToolError::Unavailable {
                    message: format!(
                        "remote agent {name} cannot be asked: its key variable {variable} is not set"
                    ),
                });
            };
            request = request.header(AUTHORIZATION, format!("Bearer {key}"));
        }
        let response = request
            .header("A2A-Version", A2A_VERSION)
            .send()
            .await
            .map_err(|e| {
                if e.is_redirect() {
                    ToolError::failed(format!(
                        "remote agent {name} ({url}) redirected to another origin: refused ({})",
                        std::error::Error::source(&e)
                            .map(ToString::to_string)
                            .unwrap_or_default()
                    ))
                } else if safe || e.is_connect() {
                    ToolError::Transient {
                        message: format!("cannot reach remote agent {name} at {url}: {e}"),
                    }
                } else {
                    ToolError::failed(format!(
                        "remote agent {name} did not answer ({e}); the message may have reached it, so it is not sent again"
                    ))
                }
            })?;
        let status = response.status();
        let (body, cut) =
            read_capped(response, MAX_REPLY_BYTES)
                .await
                .map_err(|e| ToolError::Transient {
                    message: format!("reading the reply of remote agent {name}: {e}"),
                })?;
        if cut {
            return Err(ToolError::failed(format!(
                "remote agent {name} answered more than {MAX_REPLY_BYTES} bytes: refused"
            )));
        }
        if status.is_server_error() && (safe || status.as_u16() == 503) {
            return Err(ToolError::Transient {
                message: format!("remote agent {name} answered HTTP {status}"),
            });
        }
        if !status.is_success() {
            let head: String = String::from_utf8_lossy(&body).chars().take(200).collect();
            return Err(ToolError::failed(format!(
                "remote agent {name} answered HTTP {status}: {head}"
            )));
        }
        Ok(body)
    }

    /// One JSON-RPC call; its `result`.
    async fn rpc(
        &self,
        remote: &RemoteAgent,
        card: &Card,
        method: &str,
        params: Value,
        safe: bool,
    ) -> Result<Value, ToolError> {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let request = self
            .inner
            .client
            .post(card.rpc_url.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(body.to_string());
        let reply = self.exchange(remote, request, &card.rpc_url, safe).await?;
        let mut reply: Value = serde_json::from_slice(&reply).map_err(|e| {
            ToolError::failed(format!(
                "remote agent {} did not answer JSON to {method}: {e}",
                remote.name
            ))
        })?;
        if let Some(error) = reply.get("error").filter(|e| !e.is_null()) {
            let code = error["code"].as_i64().unwrap_or(0);
            let message: String = error["message"]
                .as_str()
                .unwrap_or("")
                .chars()
                .take(200)
                .collect();
            return Err(RpcError { code, message }.into_tool_error(&remote.name, method));
        }
        match reply.get_mut("result") {
            Some(result) => Ok(result.take()),
            None => Err(ToolError::failed(format!(
                "remote agent {} answered {method} without a result",
                remote.name
            ))),
        }
    }

    /// The tool that asks `remote`, described by its file entry or its card.
    pub fn ask_tool(&self, remote: &RemoteAgent) -> (ToolDefinition, Arc<dyn ToolHandler>) {
        let description = remote
            .description
            .clone()
            .or_else(|| self.known_card(remote).map(|c| c.description.clone()))
            .unwrap_or_default();
        let mut def = ask_definition(
            &remote.name,
            &format!(
                "Ask the {} agent (a remote agent); its answer comes back as the result",
                remote.name
            ),
            &description,
        );
        def.timeout = Some(ASK_TIMEOUT);
        let handler = Arc::new(AskRemote {
            remote: remote.clone(),
            agents: self.clone(),
        });
        (def, handler)
    }
}

/// A JSON-RPC error of a remote.
struct RpcError {
    code: i64,
    message: String,
}

impl RpcError {
    fn into_tool_error(self, name: &str, method: &str) -> ToolError {
        let what = match self.code {
            -32001 => "the task is not found (the remote may have lost it)",
            -32009 => "it does not support A2A version 1.0",
            -32004 => "the operation is not supported",
            _ => "an error",
        };
        ToolError::failed(format!(
            "remote agent {name} answered {method} with {what} (code {}): {}",
            self.code, self.message
        ))
    }
}

/// What a call keeps of the remote task it started ([`REMOTE_TASKS`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct RemoteTask {
    agent: String,
    rpc_url: String,
    task_id: String,
    #[serde(default)]
    context_id: Option<String>,
}

/// What a session keeps of its conversation with a remote
/// ([`REMOTE_CONTEXTS`]).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct RemoteContext {
    context_id: Option<String>,
    /// The task waiting for input, continued by the next ask.
    #[serde(default)]
    input_task_id: Option<String>,
}

/// The handler of a remote agent's `ask_<name>`.
struct AskRemote {
    remote: RemoteAgent,
    agents: RemoteAgents,
}

/// A task's state as A2A names it, and what it means here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    Completed,
    InputRequired,
    Ended(&'static str),
}

fn phase_of(state: &str) -> Phase {
    match state {
        "TASK_STATE_COMPLETED" => Phase::Completed,
        "TASK_STATE_INPUT_REQUIRED" => Phase::InputRequired,
        "TASK_STATE_FAILED" => Phase::Ended("failed"),
        "TASK_STATE_CANCELED" => Phase::Ended("canceled"),
        "TASK_STATE_REJECTED" => Phase::Ended("rejected"),
        "TASK_STATE_AUTH_REQUIRED" => Phase::Ended("waiting for authentication"),
        _ => Phase::Running,
    }
}

/// The text of `parts` (text parts as they are, data parts as JSON).
fn parts_text(parts: &Value) -> Vec<String> {
    parts
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter_map(|p| match (p.get("text"), p.get("data")) {
                    (Some(Value::String(t)), _) => Some(t.clone()),
                    (_, Some(data)) => Some(data.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The answer of a task: its artifacts' text, else its status message's.
fn answer_of(task: &Value) -> String {
    let from_artifacts: Vec<String> = task["artifacts"]
        .as_array()
        .map(|a| a.iter().flat_map(|a| parts_text(&a["parts"])).collect())
        .unwrap_or_default();
    if !from_artifacts.is_empty() {
        return from_artifacts.join("\n");
    }
    parts_text(&task["status"]["message"]["parts"]).join("\n")
}

/// The `messageId` of the call keyed `key`: the same on every attempt and
/// after a resume, without the session's ids in it.
fn message_id(key: &str) -> String {
    let digest = sha2::Sha256::digest(key.as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("cadre-{hex}")
}

impl AskRemote {
    fn store(&self) -> &Store {
        &self.agents.inner.store
    }

    /// Writes `value` under (`namespace`, `key`) durably: owned by the
    /// caller's tenant, linked to its session (erased with it), fenced by
    /// its writer.
    async fn put(
        &self,
        ctx: &ExecutionContext,
        namespace: &str,
        key: &str,
        value: Value,
    ) -> Result<(), ToolError> {
        let tenant = ctx
            .tenant
            .as_deref()
            .unwrap_or(crate::identity::DEFAULT_TENANT);
        let mut ops = vec![WriteOp::PutDoc {
            namespace: namespace.into(),
            key: key.into(),
            value,
            tenant: Some(tenant.into()),
        }];
        if let Some(session) = ctx.conversation_id.as_deref() {
            ops.push(WriteOp::LinkDoc {
                namespace: namespace.into(),
                key: key.into(),
                session_id: session.into(),
            });
        }
        let ops = match &ctx.writer {
            Some(writer) => writer.fenced(ops),
            None => ops,
        };
        self.store().write(ops, true).await.map_err(|e| {
            ToolError::failed(format!(
                "remote agent {}: the store could not keep its task: {}",
                self.remote.name,
                crate::error_code::PublicError::public_message(&e)
            ))
        })
    }

    /// The document under (`namespace`, `key`); a store that cannot be
    /// read is a transient failure (never taken for "not there": that
    /// would send the message again).
    async fn get<T: serde::de::DeserializeOwned>(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<Option<T>, ToolError> {
        match self.store().get_doc(namespace, key).await {
            Ok(Some(doc)) => Ok(serde_json::from_value(doc).ok()),
            Ok(None) => Ok(None),
            Err(e) => Err(ToolError::Transient {
                message: format!(
                    "remote agent {}: the store could not be read: {}",
                    self.remote.name,
                    crate::error_code::PublicError::public_message(&e)
                ),
            }),
        }
    }

    fn context_key(&self, ctx: &ExecutionContext) -> Option<String> {
        ctx.conversation_id
            .as_deref()
            .map(|s| format!("{s}/{}", self.remote.name))
    }

    /// Polls `task_id` until it is terminal or waits for input.
    async fn wait(&self, card: &Card, task: Value, task_id: &str) -> Result<Value, ToolError> {
        let mut task = task;
        let mut pause = POLL_FIRST;
        let mut blips = 0;
        loop {
            let state = task["status"]["state"].as_str().unwrap_or("");
            match phase_of(state) {
                Phase::Running => {}
                _ => return Ok(task),
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(POLL_MAX);
            let polled = self
                .agents
                .rpc(
                    &self.remote,
                    card,
                    "GetTask",
                    json!({"id": task_id, "historyLength": 0}),
                    true,
                )
                .await;
            task = match polled {
                Ok(task) => {
                    blips = 0;
                    task
                }
                // Polling is safe to repeat: a blip does not end a long
                // remote task's wait.
                Err(e) if e.is_retryable() && blips < MAX_POLL_BLIPS => {
                    blips += 1;
                    tracing::debug!(remote_agent = %self.remote.name, "GetTask failed ({e}); polling on");
                    continue;
                }
                Err(e) => return Err(e),
            };
            if task["id"].as_str() != Some(task_id) {
                return Err(ToolError::failed(format!(
                    "remote agent {} answered GetTask {task_id} with another task",
                    self.remote.name
                )));
            }
        }
    }

    /// [`Self::wait`], unless the asking turn is cut first: then the
    /// remote is asked to cancel the task (best effort) and the call fails.
    async fn wait_uncut(
        &self,
        ctx: &ExecutionContext,
        card: &Card,
        task: Value,
        task_id: &str,
    ) -> Result<Value, ToolError> {
        let cut = ctx.cut.clone().unwrap_or_default();
        tokio::select! {
            task = self.wait(card, task, task_id) => task,
            () = cut.0.cancelled() => {
                let canceled = self
                    .agents
                    .rpc(&self.remote, card, "CancelTask", json!({"id": task_id}), true)
                    .await;
                if let Err(e) = &canceled {
                    tracing::warn!(remote_agent = %self.remote.name, "canceling task {task_id}: {e}");
                }
                Err(ToolError::failed(format!(
                    "the asking turn was cut: remote agent {}'s task was asked to cancel",
                    self.remote.name
                )))
            }
        }
    }

    /// The outcome of a finished or interrupted task; keeps the session's
    /// remote context.
    async fn outcome(
        &self,
        ctx: &ExecutionContext,
        task: &Value,
        task_id: &str,
    ) -> Result<Value, ToolError> {
        let name = &self.remote.name;
        let state = task["status"]["state"].as_str().unwrap_or("");
        let answer = answer_of(task);
        let phase = phase_of(state);
        if let Some(key) = self.context_key(ctx) {
            let context = RemoteContext {
                context_id: task["contextId"].as_str().map(str::to_string),
                input_task_id: (phase == Phase::InputRequired).then(|| task_id.to_string()),
            };
            // Best effort: without it the next ask starts a new context.
            let _ = self
                .put(ctx, REMOTE_CONTEXTS, &key, json!(context))
                .await
                .inspect_err(|e| tracing::warn!(remote_agent = %name, "{e}"));
        }
        match phase {
            Phase::Completed => Ok(json!({
                "agent": name, "state": "completed", "answer": answer, "task_id": task_id,
            })),
            Phase::InputRequired => Ok(json!({
                "agent": name,
                "state": "input_required",
                "answer": answer,
                "task_id": task_id,
                "note": format!("{name} needs more input to finish: ask {name} again with it (the same task continues)"),
            })),
            Phase::Ended(how) => Err(ToolError::failed(if answer.is_empty() {
                format!("remote agent {name}'s task {how}")
            } else {
                format!("remote agent {name}'s task {how}: {answer}")
            })),
            Phase::Running => unreachable!("wait returns no running task"),
        }
    }
}

#[async_trait::async_trait]
impl ToolHandler for AskRemote {
    async fn call(&self, params: Value, ctx: &ExecutionContext) -> Result<Value, ToolError> {
        let request = params["request"].as_str().unwrap_or_default().to_string();
        if request.trim().is_empty() {
            return Err(ToolError::invalid("`request` must say what to ask"));
        }
        let key = ctx.idempotency_key.clone();
        // Asked before under this key: that task, never a second message.
        if let Some(key) = &key
            && let Some(known) = self.get::<RemoteTask>(REMOTE_TASKS, key).await?
        {
            let card = Card {
                description: String::new(),
                rpc_url: Url::parse(&known.rpc_url)
                    .map_err(|e| ToolError::failed(format!("a stored task url: {e}")))?,
            };
            let started = Instant::now();
            let task = self
                .wait_uncut(ctx, &card, json!({"status": {}}), &known.task_id)
                .await?;
            tracing::debug!(remote_agent = %self.remote.name, waited = ?started.elapsed(), "rejoined a remote task");
            return self.outcome(ctx, &task, &known.task_id).await;
        }
        let card = self.agents.card(&self.remote).await?;
        let context = match self.context_key(ctx) {
            Some(k) => self
                .get::<RemoteContext>(REMOTE_CONTEXTS, &k)
                .await?
                .unwrap_or_default(),
            None => RemoteContext::default(),
        };
        let mut message = json!({
            "messageId": key.as_deref().map(message_id).unwrap_or_else(|| format!("cadre-{}", uuid::Uuid::now_v7())),
            "role": "ROLE_USER",
            "parts": [{"text": request}],
        });
        if let Some(c) = &context.context_id {
            message["contextId"] = json!(c);
        }
        if let Some(t) = &context.input_task_id {
            message["taskId"] = json!(t);
        }
        let sent = self
            .agents
            .rpc(
                &self.remote,
                &card,
                "SendMessage",
                json!({
                    "message": message,
                    "configuration": {"returnImmediately": true, "historyLength": 0},
                }),
                false,
            )
            .await;
        let reply = match sent {
            Ok(reply) => reply,
            // The task waiting for input is gone or closed on the remote's
            // side: the next ask starts a new one instead of failing again.
            Err(e) if context.input_task_id.is_some() && !e.is_retryable() => {
                if let Some(k) = self.context_key(ctx) {
                    let fresh = RemoteContext {
                        context_id: context.context_id.clone(),
                        input_task_id: None,
                    };
                    let _ = self.put(ctx, REMOTE_CONTEXTS, &k, json!(fresh)).await;
                }
                return Err(ToolError::failed(format!(
                    "{e}; the task that waited for input is dropped: the next ask starts a new one"
                )));
            }
            Err(e) => return Err(e),
        };
        if let Some(direct) = reply.get("message") {
            // A direct answer: no task to follow.
            return Ok(json!({
                "agent": self.remote.name,
                "state": "completed",
                "answer": parts_text(&direct["parts"]).join("\n"),
            }));
        }
        let task = reply.get("task").cloned().unwrap_or(Value::Null);
        let Some(task_id) = task["id"].as_str().map(str::to_string) else {
            return Err(ToolError::failed(format!(
                "remote agent {} answered SendMessage with neither a task nor a message",
                self.remote.name
            )));
        };
        if let Some(key) = &key {
            let record = RemoteTask {
                agent: self.remote.name.clone(),
                rpc_url: card.rpc_url.to_string(),
                task_id: task_id.clone(),
                context_id: task["contextId"].as_str().map(str::to_string),
            };
            self.put(ctx, REMOTE_TASKS, key, json!(record)).await?;
        }
        let task = self.wait_uncut(ctx, &card, task, &task_id).await?;
        self.outcome(ctx, &task, &task_id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_urls_are_checked() {
        assert!(RemoteAgent::new("far", "https://x.example/a2a/a", None, None).is_ok());
        assert!(matches!(
            RemoteAgent::new("far away", "https://x.example", None, None),
            Err(RemoteAgentError::Name(_))
        ));
        assert!(matches!(
            RemoteAgent::new(&"a".repeat(61), "https://x.example", None, None),
            Err(RemoteAgentError::Name(_))
        ));
        for url in [
            "ftp://x.example",
            "not a url",
            "http://user:pw@x.example",
            "file:///etc",
        ] {
            assert!(
                matches!(
                    RemoteAgent::new("far", url, None, None),
                    Err(RemoteAgentError::Url { .. })
                ),
                "{url}"
            );
        }
    }

    #[test]
    fn the_card_is_under_the_url() {
        let r = RemoteAgent::new("far", "http://127.0.0.1:9/a2a/x/", None, None).unwrap();
        assert_eq!(
            r.card_url().as_str(),
            "http://127.0.0.1:9/a2a/x/.well-known/agent-card.json"
        );
        let r = RemoteAgent::new("far", "http://127.0.0.1:9", None, None).unwrap();
        assert_eq!(
            r.card_url().as_str(),
            "http://127.0.0.1:9/.well-known/agent-card.json"
        );
    }

    #[test]
    fn the_message_id_follows_the_key() {
        assert_eq!(message_id("s:t:c"), message_id("s:t:c"));
        assert_ne!(message_id("s:t:c"), message_id("s:t:d"));
        assert!(!message_id("s:t:c").contains("s:t"));
    }

    #[test]
    fn the_answer_is_the_artifacts_else_the_status_message() {
        let task = json!({"artifacts": [{"parts": [{"text": "a"}, {"data": {"n": 1}}]}],
                          "status": {"message": {"parts": [{"text": "m"}]}}});
        assert_eq!(answer_of(&task), "a\n{\"n\":1}");
        let task = json!({"status": {"message": {"parts": [{"text": "which?"}]}}});
        assert_eq!(answer_of(&task), "which?");
        assert_eq!(phase_of("TASK_STATE_WORKING"), Phase::Running);
        assert_eq!(phase_of("TASK_STATE_REJECTED"), Phase::Ended("rejected"));
    }

    #[test]
    fn the_key_is_not_in_debug_output() {
        // SAFETY: a test-only variable no other test reads.
        unsafe { std::env::set_var("CADRE_TEST_REMOTE_KEY_X", "sekrit") };
        let r = RemoteAgent::new(
            "far",
            "http://127.0.0.1:9",
            Some("CADRE_TEST_REMOTE_KEY_X"),
            None,
        )
        .unwrap();
        assert!(!format!("{r:?}").contains("sekrit"));
    }
}
