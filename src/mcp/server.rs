//! cadre as an MCP server: its tools and agents for any MCP client.
//!
//! MCP client ──stdio (`cadre mcp`) | streamable HTTP (`/mcp`)──▶ CadreMcp
//!     tools/list ──▶ ToolRegistry (the caller's plan) + one `agent_<name>` per agent
//!     tools/call ──▶ ExecuteTool (caller_type direct) ──▶ executor ──▶ result
//!                └─▶ agent_<name>: one conversation turn through Sessions
//!     ◀── notifications/tools/list_changed when the registry changes
//!
//! Who calls: over HTTP the request passed the API's own layers, so the
//! tenant is the bearer key's ([`crate::tenants::Principal`], as for every
//! other route); the plan is the `X-Cadre-Plan` header (default free), held
//! to what the key and the tenant allow like the `plan` field of
//! `POST /v1/tools/{name}/invoke` (asking above it refuses the request), and
//! the user the `X-Cadre-User` header (rate limits count per user; bounded
//! like every `user_id`). Over stdio
//! the caller is the local operator: tenant `default`, the plan of
//! `cadre mcp --plan` (default free). tools/list shows what that plan may
//! call; a call above it still reaches the executor, which refuses it
//! (`TOOL_PLAN_REQUIRED`), so no call bypasses the pipeline.
//!
//! A failed call is a tool result with `isError: true` whose text is the
//! same JSON the model sees (`error`, `error_type`, `validation_errors`,
//! `retryable`); a successful one carries the output as JSON text, and as
//! `structuredContent` when it is an object. A tool of an MCP server,
//! offered again here, keeps the `outputSchema` its server gave (when its
//! root is `type: object`, MCP's rule and the only outputs sent as
//! `structuredContent`), and its results keep their content blocks: an
//! image stays an image block ([`super::content`]), not JSON in a text
//! block. cadre's own tools offer no `outputSchema`, though some declare an
//! `output`: the executor does not hold their outputs to it, and a client
//! that validates `structuredContent` (the Python SDK does) would turn a
//! mismatch into a failed call; a server's schema is that server's promise.
//! Agent tools take `message` and an optional `session_id` (a session of
//! the same tenant) and answer `{session_id, answer}`, so a client
//! continues a conversation by passing the id back.
//!
//! A call that needs a person's confirmation answers `CONFIRMATION_REQUIRED`
//! with its id; over stdio there is no other way in, so two more tools,
//! offered only with `cadre mcp --confirmation-tools` (an MCP host whose
//! model could approve its own held calls would defeat the confirmation:
//! turn them on for a host that asks its human before each tool call; over
//! HTTP a person uses `POST /v1/confirmations/{id}`), decide them: `confirmations_list` (`limit`, `cursor`: the caller's
//! tenant's pending calls, oldest first) and `confirmation_decide`
//! (`confirmation_id`, `approve`), the same decision as `POST
//! /v1/confirmations/{id}` ([`ExecutorHandle::decide_confirmation`]: once,
//! the tenant's own only). A registry tool of the same name (unlikely, but
//! tool files are the operator's) is served instead, as for agent tools.
//!
//! Transports: over stdio the session ends when the client closes stdin,
//! which is a normal end whether or not it started a session (a client may
//! only `server/discover`); over HTTP a client ends its session with
//! `DELETE /mcp`, answered 204 ([`McpHttpService`]). Everything this module
//! needs of a running cadre is handed to it ([`McpServerDeps`], the body
//! limit, the stop token): it sits below the HTTP API and the runtime.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::{Method, StatusCode};
use futures::future::BoxFuture;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    InitializeRequestParams, InitializeResult, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{NotificationContext, RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{Map, Value, json};

use crate::conversation::{NewSession, Sessions};
use crate::error_code::PublicError;
use crate::events::EventKind;
use crate::executor::{Arguments, ExecuteTool, ExecutorHandle};
use crate::identity::{Scope, UserId};
use crate::tenants::config::entitled_plan;
use crate::tenants::{DEFAULT_TENANT, Principal};
use crate::tools::definition::Entry;
use crate::tools::{CallerType, ErrorType, ExecutionContext, Plan, ToolRegistry};

use super::content;

/// Agent tools are named `agent_<agent name>`.
pub const AGENT_PREFIX: &str = "agent_";
/// The tools that list and decide pending confirmations.
pub const CONFIRMATIONS_LIST: &str = "confirmations_list";
pub const CONFIRMATION_DECIDE: &str = "confirmation_decide";
pub const PLAN_HEADER: &str = "x-cadre-plan";
pub const USER_HEADER: &str = "x-cadre-user";

/// Whose call it is.
#[derive(Debug, Clone, PartialEq)]
pub struct Caller {
    pub tenant: String,
    pub plan: Plan,
    pub user_id: Option<String>,
}

impl Caller {
    /// The local operator of `cadre mcp`.
    pub fn local(plan: Plan) -> Self {
        Caller {
            tenant: DEFAULT_TENANT.into(),
            plan,
            user_id: None,
        }
    }

    /// The sessions it may reach: its tenant's.
    pub fn scope(&self) -> Scope {
        Scope::tenant(self.tenant.clone())
    }
}

/// What the server needs of a running cadre.
#[derive(Clone)]
pub struct McpServerDeps {
    pub registry: ToolRegistry,
    pub executor: ExecutorHandle,
    pub sessions: Sessions,
    /// Offer `confirmations_list` and `confirmation_decide` (off unless
    /// asked: an MCP host's model that can approve its own held calls
    /// defeats the confirmation; turn it on for a host that asks its human
    /// before each tool call).
    pub confirmation_tools: bool,
}

/// One MCP session's handler.
#[derive(Clone)]
pub struct CadreMcp {
    deps: McpServerDeps,
    /// `None`: read the caller from each HTTP request.
    fixed: Option<Caller>,
}

impl CadreMcp {
    /// For stdio: every request is `caller`'s.
    pub fn local(deps: McpServerDeps, caller: Caller) -> Self {
        CadreMcp {
            deps,
            fixed: Some(caller),
        }
    }

    /// For `/mcp`: the caller comes from each request's key and headers.
    pub fn http(deps: McpServerDeps) -> Self {
        CadreMcp { deps, fixed: None }
    }

    async fn caller(&self, context: &RequestContext<RoleServer>) -> Result<Caller, ErrorData> {
        if let Some(c) = &self.fixed {
            return Ok(c.clone());
        }
        let parts = context
            .extensions
            .get::<axum::http::request::Parts>()
            .ok_or_else(|| ErrorData::internal_error("no HTTP request for this call", None))?;
        let principal = parts
            .extensions
            .get::<Principal>()
            .cloned()
            .ok_or_else(|| ErrorData::internal_error("the request was not authenticated", None))?;
        let header = |name: &str| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let asked = match header(PLAN_HEADER) {
            None => Plan::Free,
            Some(p) => Plan::parse(&p).ok_or_else(|| {
                ErrorData::invalid_request(
                    format!(
                        "unknown plan '{}' in {PLAN_HEADER} (free, pro or premium)",
                        p.chars().take(32).collect::<String>()
                    ),
                    None,
                )
            })?,
        };
        // The header can only narrow what the key and the tenant allow.
        let plan = entitled_plan(&self.deps.executor.shared().store, &principal, Some(asked))
            .await
            .map_err(|e| ErrorData::invalid_request(e.public_message(), None))?;
        let user_id = match header(USER_HEADER) {
            None => None,
            Some(u) => Some(
                UserId::parse(&u)
                    .map_err(|e| ErrorData::invalid_request(format!("{USER_HEADER}: {e}"), None))?
                    .into_string(),
            ),
        };
        Ok(Caller {
            tenant: principal.tenant,
            plan,
            user_id,
        })
    }

    fn tools_for(&self, plan: Plan) -> Vec<Tool> {
        let mut tools: Vec<Tool> = self
            .deps
            .registry
            .definitions_for_plan(plan)
            .into_iter()
            .map(|d| {
                let schema = match d.parameters {
                    Value::Object(m) => m,
                    _ => Map::new(),
                };
                let from_mcp = matches!(d.entry, Entry::Mcp { .. });
                let tool = Tool::new(d.name, d.description, schema);
                match d.output {
                    Some(Value::Object(out))
                        if from_mcp && out.get("type") == Some(&json!("object")) =>
                    {
                        tool.with_raw_output_schema(Arc::new(out))
                    }
                    _ => tool,
                }
            })
            .collect();
        for (name, description, schema) in [
            (
                CONFIRMATIONS_LIST,
                "The caller's pending confirmations (tool calls held for a person's decision), oldest first",
                json!({
                    "type": "object",
                    "properties": {
                        "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "At most this many (default 50)"},
                        "cursor": {"type": "string", "description": "The `next` of the previous page"}
                    },
                    "additionalProperties": false
                }),
            ),
            (
                CONFIRMATION_DECIDE,
                "Approve (run now) or deny (discard) a pending confirmation",
                json!({
                    "type": "object",
                    "properties": {
                        "confirmation_id": {"type": "string", "minLength": 1},
                        "approve": {"type": "boolean"}
                    },
                    "required": ["confirmation_id", "approve"],
                    "additionalProperties": false
                }),
            ),
        ] {
            if !self.deps.confirmation_tools || self.deps.registry.contains(name) {
                continue;
            }
            let Value::Object(schema) = schema else {
                unreachable!("a JSON object")
            };
            tools.push(Tool::new(name, description, schema));
        }
        for name in self.deps.sessions.agents().names() {
            let description = self
                .deps
                .sessions
                .agents()
                .get(&name)
                .map(|a| a.description.clone())
                .filter(|d| !d.is_empty())
                .unwrap_or_else(|| format!("Ask the {name} agent"));
            let schema = json!({
                "type": "object",
                "properties": {
                    "message": {"type": "string", "minLength": 1, "description": "What to ask the agent"},
                    "session_id": {"type": "string", "description": "Continue this conversation (from an earlier answer)"}
                },
                "required": ["message"],
                "additionalProperties": false
            });
            let Value::Object(schema) = schema else {
                unreachable!("a JSON object")
            };
            tools.push(Tool::new(
                format!("{AGENT_PREFIX}{name}"),
                format!(
                    "{description} (one conversation turn; returns the reply and the session id)"
                ),
                schema,
            ));
        }
        tools
    }

    async fn call_agent(
        &self,
        agent: &str,
        caller: &Caller,
        args: &Map<String, Value>,
    ) -> CallToolResult {
        let Some(message) = args
            .get("message")
            .and_then(Value::as_str)
            .filter(|m| !m.trim().is_empty())
        else {
            return failure(
                json!({"error": "`message` (a non-empty string) is required", "error_type": ErrorType::ValidationError.as_str()}),
            );
        };
        let sessions = &self.deps.sessions;
        let id = match args.get("session_id") {
            None | Some(Value::Null) => {
                let created = sessions
                    .create(NewSession {
                        tenant: caller.tenant.clone(),
                        agent: agent.into(),
                        user_id: caller.user_id.clone(),
                        plan: caller.plan,
                        metadata: Value::Null,
                    })
                    .await;
                match created {
                    Ok(s) => s.id,
                    Err(e) => {
                        return failure(
                            json!({"error": e.to_string(), "error_type": ErrorType::ExecutionError.as_str()}),
                        );
                    }
                }
            }
            Some(Value::String(id)) => match sessions.get(&caller.scope(), id).await {
                Ok(s) if s.agent == agent => s.id,
                Ok(_) => {
                    return failure(
                        json!({"error": format!("session {id} belongs to another agent"), "error_type": ErrorType::ValidationError.as_str()}),
                    );
                }
                Err(e) => {
                    return failure(json!({"error": e.public_message(), "error_type": e.code()}));
                }
            },
            Some(_) => {
                return failure(
                    json!({"error": "`session_id` must be a string", "error_type": ErrorType::ValidationError.as_str()}),
                );
            }
        };
        match sessions
            .send_message(&caller.scope(), &id, message.to_string(), None)
            .await
        {
            Ok(outcome) => {
                let body = json!({"session_id": id, "answer": outcome.answer});
                let mut r = CallToolResult::success(vec![ContentBlock::text(outcome.answer)]);
                r.structured_content = Some(body);
                r
            }
            Err(e) => failure(
                json!({"error": e.to_string(), "error_type": ErrorType::ExecutionError.as_str(), "session_id": id}),
            ),
        }
    }
}

impl CadreMcp {
    async fn call_confirmations(
        &self,
        name: &str,
        caller: &Caller,
        args: &Map<String, Value>,
    ) -> CallToolResult {
        let confirmations = &self.deps.executor.shared().confirmations;
        let body = if name == CONFIRMATIONS_LIST {
            let limit = match args.get("limit") {
                None | Some(Value::Null) => 50,
                Some(v) => match v.as_u64().filter(|n| (1..=1000).contains(n)) {
                    Some(n) => n as usize,
                    None => {
                        return failure(
                            json!({"error": "`limit` must be an integer from 1 to 1000", "error_type": ErrorType::ValidationError.as_str()}),
                        );
                    }
                },
            };
            let cursor = match args.get("cursor") {
                None | Some(Value::Null) => None,
                Some(Value::String(c)) => Some(c.clone()),
                Some(_) => {
                    return failure(
                        json!({"error": "`cursor` must be a string", "error_type": ErrorType::ValidationError.as_str()}),
                    );
                }
            };
            confirmations
                .list_of(&caller.tenant, cursor, limit)
                .await
                .map(|page| json!({"confirmations": page.items, "next": page.next}))
                .map_err(|e| json!({"error": e.public_message(), "error_code": e.code().as_str()}))
        } else {
            let (Some(id), Some(approve)) = (
                args.get("confirmation_id").and_then(Value::as_str),
                args.get("approve").and_then(Value::as_bool),
            ) else {
                return failure(
                    json!({"error": "`confirmation_id` (a string) and `approve` (a boolean) are required", "error_type": ErrorType::ValidationError.as_str()}),
                );
            };
            self.deps
                .sessions
                .decide_confirmation(&caller.scope(), id, approve)
                .await
                .map(|outcome| json!(outcome))
                .map_err(|e| json!({"error": e.public_message(), "error_code": e.code().as_str()}))
        };
        match body {
            Ok(body) => {
                let mut r = CallToolResult::success(vec![ContentBlock::text(body.to_string())]);
                r.structured_content = Some(body);
                r
            }
            Err(body) => failure(body),
        }
    }
}

fn failure(body: Value) -> CallToolResult {
    let mut r = CallToolResult::error(vec![ContentBlock::text(body.to_string())]);
    r.structured_content = Some(body);
    r
}

impl ServerHandler for CadreMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("cadre", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "cadre's tools (each call runs through cadre's executor: plans, limits, validation, records) \
             and its agents as agent_<name> tools taking `message` and an optional `session_id`.",
        )
    }

    /// Over HTTP the caller's headers are checked at `initialize` too: an
    /// unknown `X-Cadre-Plan` (or a bad `X-Cadre-User`) is refused there,
    /// not accepted and then refused on every later request.
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        self.caller(&context).await?;
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let caller = self.caller(&context).await?;
        Ok(ListToolsResult::with_all_items(self.tools_for(caller.plan)))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let caller = self.caller(&context).await?;
        let args = request.arguments.unwrap_or_default();
        let name = request.name.to_string();
        if let Some(agent) = name.strip_prefix(AGENT_PREFIX)
            && self.deps.sessions.agents().get(agent).is_some()
            && !self.deps.registry.contains(&name)
        {
            return Ok(self.call_agent(agent, &caller, &args).await.into());
        }
        if (name == CONFIRMATIONS_LIST || name == CONFIRMATION_DECIDE)
            && self.deps.confirmation_tools
            && !self.deps.registry.contains(&name)
        {
            return Ok(self.call_confirmations(&name, &caller, &args).await.into());
        }
        // The call's record keeps its arguments: the tenant's share of the
        // store pays for them, and a tenant at its quota stores no more.
        let bytes = serde_json::to_vec(&args).map_or(0, |v| v.len());
        if let Err(e) = self.deps.sessions.admit_bytes(&caller.scope(), bytes).await {
            let error_type = match e.code() {
                crate::error_code::ErrorCode::RateLimited => ErrorType::RateLimited,
                _ => ErrorType::ExecutionError,
            };
            return Ok(failure(json!({
                "error": e.public_message(),
                "error_type": error_type,
                "code": e.code(),
            }))
            .into());
        }
        let mut ctx = ExecutionContext::new(
            CallerType::Direct,
            caller.user_id.clone().unwrap_or_else(|| "mcp".into()),
        );
        ctx.user_id = caller.user_id;
        ctx.plan = caller.plan;
        ctx.tenant = Some(caller.tenant);
        let result = self
            .deps
            .executor
            .execute(ExecuteTool::new(
                &name,
                Arguments::Json(Value::Object(args)),
                ctx,
            ))
            .await;
        let from_mcp = self
            .deps
            .registry
            .get(&name)
            .is_some_and(|t| matches!(t.definition.entry, Entry::Mcp { .. }));
        let blocks = match &result.output {
            Some(out) if result.is_success && from_mcp => content::blocks(out),
            _ => None,
        };
        let text = result.model_content();
        Ok(if let Some(blocks) = blocks {
            CallToolResult::success(blocks)
        } else if result.is_success {
            let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
            if let Some(out @ Value::Object(_)) = &result.output {
                r.structured_content = Some(out.clone());
            }
            r
        } else {
            let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
            failure(body)
        }
        .into())
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        // Tell this client when the tool list changes (hot reload, MCP
        // servers of our own coming and going), until it is gone.
        let mut events = self.deps.registry.events().subscribe();
        let peer = context.peer;
        tokio::spawn(async move {
            // A quiet registry must not keep a closed session's task alive.
            let mut check = tokio::time::interval(Duration::from_secs(30));
            loop {
                let event = tokio::select! {
                    e = events.recv() => e,
                    _ = check.tick() => {
                        if peer.is_transport_closed() {
                            return;
                        }
                        continue;
                    }
                };
                match event {
                    Ok(e) if is_tool_change(&e.kind) => {}
                    Ok(_) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
                // One notice for a burst of changes.
                while let Ok(e) = events.try_recv() {
                    let _ = e;
                }
                if peer.notify_tool_list_changed().await.is_err() {
                    return;
                }
            }
        });
    }
}

fn is_tool_change(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::ToolAdded { .. } | EventKind::ToolUpdated { .. } | EventKind::ToolRemoved { .. }
    )
}

/// Serves MCP on stdin/stdout as `caller` until the client closes stdin.
/// A client that leaves before it starts a session (after nothing, a
/// `ping` or a `server/discover` only) ends it as cleanly as one that
/// leaves after: `Ok`.
pub async fn serve_stdio(deps: McpServerDeps, caller: Caller) -> Result<(), McpServeError> {
    use rmcp::ServiceExt;
    let running = match CadreMcp::local(deps, caller)
        .serve(rmcp::transport::stdio())
        .await
    {
        Ok(running) => running,
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
        Err(e) => {
            return Err(McpServeError::Start {
                message: e.to_string(),
            });
        }
    };
    running.waiting().await.map_err(|e| McpServeError::Start {
        message: e.to_string(),
    })?;
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum McpServeError {
    #[error("MCP over stdio: {message}")]
    Start { message: String },
}

/// The `/mcp` tower service (streamable HTTP). `authenticated`: an API key
/// guards it, or the HTTP layer checks `Host` itself, so rmcp's check
/// against DNS rebinding (meant for open local servers) is off; otherwise
/// rmcp's loopback-only Host check stays on.
/// `max_body_bytes`: the largest request body it reads (the API's own cap).
/// `stop` ends the open sessions.
pub fn http_service(
    deps: McpServerDeps,
    authenticated: bool,
    max_body_bytes: usize,
    max_sessions_per_key: usize,
    stop: tokio_util::sync::CancellationToken,
) -> McpHttpService {
    let mut config = StreamableHttpServerConfig::default();
    config.cancellation_token = stop;
    config.max_request_body_bytes = max_body_bytes;
    if authenticated {
        config = config.disable_allowed_hosts();
    }
    let sessions = Arc::new(LocalSessionManager::default());
    McpHttpService {
        inner: StreamableHttpService::new(
            move || Ok(CadreMcp::http(deps.clone())),
            sessions.clone(),
            config,
        ),
        sessions,
        owners: Arc::default(),
        max_sessions_per_key: max_sessions_per_key.max(1),
    }
}

/// The header that names an MCP session (streamable HTTP).
const SESSION_HEADER: &str = "mcp-session-id";
/// Owners kept before the ones of ended sessions are dropped.
const OWNERS_BEFORE_PRUNE: usize = 1024;

/// Who opened a session: the tenant and the key (`-` when the server runs
/// open). Only the same key may use or end it.
fn owner_of(request: &axum::extract::Request) -> String {
    match request.extensions().get::<Principal>() {
        Some(p) => format!("{}/{}", p.tenant, p.key_id.as_deref().unwrap_or("-")),
        None => "-".into(),
    }
}

/// rmcp's streamable HTTP service, with two changes:
/// - a session's `DELETE` is answered 204 No Content where rmcp answers 202
///   Accepted (not configurable in rmcp 3.11). The session is closed by the
///   time either is sent; MCP's Python SDK takes anything but 200 or 204 as
///   a failed termination, and rmcp's own client any 2xx.
/// - each session belongs to the key that opened it: a request naming a
///   session that another key (or tenant) opened is answered 404, as an
///   unknown session is, and never reaches it. The session id alone is not
///   a credential.
/// - a key holds at most `max_sessions_per_key` sessions (the server's
///   `max_streams`): opening one more ends the key's least recently used
///   session at once instead of after rmcp's idle keep-alive (5 minutes),
///   so a client that leaks sessions only ever costs its own oldest ones.
#[derive(Clone)]
pub struct McpHttpService {
    inner: StreamableHttpService<CadreMcp, LocalSessionManager>,
    sessions: Arc<LocalSessionManager>,
    /// Session id -> [`owner_of`] the request that opened it, and when a
    /// request last named it.
    owners: Arc<std::sync::Mutex<HashMap<String, (String, std::time::Instant)>>>,
    max_sessions_per_key: usize,
}

impl McpHttpService {
    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, std::time::Instant)>> {
        self.owners.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Drops the owners of sessions rmcp no longer holds (closed, expired).
    async fn prune(&self) {
        let live: std::collections::HashSet<String> = self
            .sessions
            .sessions
            .read()
            .await
            .keys()
            .map(|id| id.to_string())
            .collect();
        self.owners().retain(|id, _| live.contains(id));
    }
}

impl tower::Service<axum::extract::Request> for McpHttpService {
    type Response = axum::response::Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::extract::Request) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let delete = request.method() == Method::DELETE;
            let owner = owner_of(&request);
            let named = request
                .headers()
                .get(SESSION_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            if let Some(id) = &named {
                let theirs = match this.owners().get_mut(id) {
                    Some((o, _)) if *o != owner => true,
                    Some((_, used)) => {
                        *used = std::time::Instant::now();
                        false
                    }
                    None => false,
                };
                if theirs {
                    let mut refused = axum::response::Response::new(axum::body::Body::from(
                        "Not Found: Session not found",
                    ));
                    *refused.status_mut() = StatusCode::NOT_FOUND;
                    return Ok(refused);
                }
            }
            let mut response = this.inner.handle(request).await.map(axum::body::Body::new);
            if let Some(id) = response
                .headers()
                .get(SESSION_HEADER)
                .and_then(|v| v.to_str().ok())
                .filter(|_| named.is_none())
            {
                let (crowded, evicted) = {
                    let mut owners = this.owners();
                    owners.insert(id.to_string(), (owner.clone(), std::time::Instant::now()));
                    let mut mine: Vec<(&String, std::time::Instant)> = owners
                        .iter()
                        .filter(|(sid, (o, _))| *o == owner && sid.as_str() != id)
                        .map(|(sid, (_, used))| (sid, *used))
                        .collect();
                    let evicted = if mine.len() >= this.max_sessions_per_key {
                        mine.sort_by_key(|(_, used)| *used);
                        mine.first().map(|(sid, _)| (*sid).clone())
                    } else {
                        None
                    };
                    if let Some(old) = &evicted {
                        owners.remove(old);
                    }
                    (owners.len() > OWNERS_BEFORE_PRUNE, evicted)
                };
                if let Some(old) = evicted {
                    let old: rmcp::transport::streamable_http_server::session::SessionId =
                        old.into();
                    use rmcp::transport::streamable_http_server::SessionManager;
                    if let Err(e) = this.sessions.close_session(&old).await {
                        tracing::warn!(error = %e, "could not end an MCP session over its key's cap");
                    }
                }
                if crowded {
                    this.prune().await;
                }
            }
            if delete
                && response.status().is_success()
                && let Some(id) = &named
            {
                this.owners().remove(id);
            }
            if delete && response.status() == StatusCode::ACCEPTED {
                *response.status_mut() = StatusCode::NO_CONTENT;
            }
            Ok(response)
        })
    }
}
