//! cadre as an MCP client: the servers of `agents/mcp.toml` as tool sources.
//!
//! mcp.toml ──▶ one supervisor task per server ──connect (stdio child | streamable HTTP)──▶ rmcp peer
//!                 │ tools/list (again on notifications/tools/list_changed)
//!                 ▼
//!          ToolRegistry::set_mcp_tools("server", [server.tool ...])   (Entry::Mcp, McpToolHandler)
//! executor ──McpToolHandler::call──▶ peer.call_tool ──▶ output | ToolError
//!
//! Every call goes through the executor like any other tool's (plan, rate
//! limits, validation against the server's `inputSchema`, cache, the
//! concurrency bucket of the server's category, default `mcp`, records and
//! events); this module only carries the call. A server that dies (its
//! process exits, its connection drops) keeps its tools listed, marked
//! unavailable, and is reconnected with exponential backoff (0.2 s doubling
//! to 30 s, reset after a connection that lived a minute); meanwhile calls
//! fail with `TOOL_UNAVAILABLE`, which the model sees like any tool error.
//! A transport failure during a call also counts as the server dying (for
//! the connection it ran on: connections are numbered, so a late report
//! about an earlier one does not end the next).
//!
//! Decisions: cadre asks for protocol 2025-11-25, whose servers send
//! `tools/list_changed` unscoped (2026-07-28 would need a listen stream).
//! An `isError` result is an `TOOL_EXECUTION_ERROR` with the server's text; an
//! `invalid params` JSON-RPC error is a `VALIDATION_ERROR`. The output is
//! made of the result's content as [`super::content`] says (structured,
//! text, or the blocks themselves when any is not text). The tool's
//! `outputSchema` is kept as the definition's `output`, which cadre's own
//! MCP server offers again.
//!
//! Bounds (`[limits]` of mcp.toml, per server overrides; [`McpLimits`]):
//! `initialize` and each whole `tools/list` have a deadline; a listing
//! stops at `max_pages` pages, at a cursor it already followed, above
//! `max_tools` tools or above `max_message_mb` of tools in all (so memory
//! is bounded by one message's cap, not pages times that). A server past
//! one of these is **refused**: one WARN line and an `mcp_server_down`
//! event carry the reason (`refused: ...`),
//! its tools (if an earlier listing had any) stay listed, unavailable, and
//! it is not asked again until cadre restarts: a listing that broke a
//! count once will again. A missed deadline is refused the same way but
//! retried with the backoff above (a server may be slow to start). A tool
//! whose name is empty or holds `.` or `__` is left out and reported in one
//! WARN line (`server__a__b` could not be mapped back to one tool); a
//! listing above `warn_tools` tools or `warn_schema_kb` of schemas is
//! served with a WARN, since every tool an agent names is offered on every
//! model call. `notifications/tools/list_changed` is coalesced: the first
//! one schedules a listing [`DEBOUNCE`] later (and at least
//! `relist_interval_s` after the previous one), those that arrive before it
//! add nothing; a listing that changed nothing is logged at debug.
//! Stdio servers run in their own process group, watched and killed with
//! it; their answers are bounded by `max_message_mb` ([`super::stdio`]).
//!
//! Caching: a server tool's results are cached only when its server sets
//! `cache_ttl_s` in mcp.toml. The executor's per-category TTLs (30 s for an
//! unknown category such as `mcp`) never apply: cadre cannot tell a
//! server's side-effecting tool from a pure one, and a call answered from
//! the cache would report an action that did not run. So every MCP
//! definition carries an explicit cache spec, 0 (never) by default.
//!
//! Side effects: what mcp.toml declares for a tool wins
//! ([`McpServerConfig::declared_side_effects`]); else its annotations
//! (`readOnlyHint: true`: `none`; `idempotentHint: true`: `idempotent`);
//! else `at_most_once`, as the spec's defaults for an unannotated tool
//! (not read-only, destructive, not idempotent) say. Annotations are the
//! server's word, so an operator who does not trust it says so in the file.
//!
//! A call with an idempotency key (`ctx.idempotency_key`) carries it in
//! `params._meta` as [`IDEMPOTENCY_META_KEY`] (`cadre/idempotency-key`):
//! MCP has no idempotency field of its own, and `_meta` keys outside its
//! reserved prefixes are free to implementations; the one-label prefix
//! `cadre/` (cadre owns no domain for a reverse-DNS one) keeps it apart
//! from any other extension's key. The same key on every attempt.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, ClientConfig, ErrorCode, Implementation, PaginatedRequestParams,
    ProtocolVersion, RequestMetaObject, Tool,
};
use rmcp::service::{NotificationContext, Peer, RoleClient, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;

use super::bounded::{Bounded, Why};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ServiceExt};
use serde_json::Value;
use tokio::sync::{Notify, mpsc, watch};

use super::config::{McpLimits, McpServerConfig, McpTransport};
use super::content;
use super::stdio::{ChildTransport, Groups};
use crate::events::EventKind;
use crate::model::wire_name;
use crate::tools::definition::{CacheSpec, Entry};
use crate::tools::sandbox::{Policy, Sandbox};
use crate::tools::{
    ExecutionContext, SideEffects, ToolDefinition, ToolError, ToolHandler, ToolRegistry,
};

const FIRST_DELAY: Duration = Duration::from_millis(200);
const MAX_DELAY: Duration = Duration::from_secs(30);
const HEALTHY_AFTER: Duration = Duration::from_secs(60);
/// How long after a `tools/list_changed` the listing starts, so that a
/// burst of them costs one listing.
pub const DEBOUNCE: Duration = Duration::from_millis(200);
/// The `_meta` key of `tools/call` that carries the call's idempotency key.
pub const IDEMPOTENCY_META_KEY: &str = "cadre/idempotency-key";

/// The connection to one server, shared by its supervisor and its tools.
struct Link {
    config: McpServerConfig,
    /// The live connection and its number (one per connection made).
    peer: RwLock<Option<(u64, Peer<RoleClient>)>>,
    /// Asks the supervisor to drop the connection and reconnect.
    broken: mpsc::UnboundedSender<Broken>,
    /// `tools/list_changed` arrived; a `Notify` holds one permit however
    /// many arrive, which is the coalescing.
    list_changed: Notify,
    groups: Groups,
    /// The sandbox a stdio server runs in (`None`: an HTTP server, or
    /// `[tools] sandbox = "off"`).
    sandbox: Option<Arc<Policy>>,
}

/// The connection of this number broke (a later one may be live already).
struct Broken(u64);

impl Link {
    fn peer(&self) -> Option<(u64, Peer<RoleClient>)> {
        self.peer.read().expect("mcp link lock").clone()
    }

    fn unavailable(&self) -> ToolError {
        ToolError::Unavailable {
            message: format!(
                "MCP server '{}' is unavailable (it is being restarted); try again later",
                self.config.name
            ),
        }
    }
}

/// The running MCP clients; dropping it stops them (and their child processes).
pub struct McpClients {
    stop: watch::Sender<bool>,
    servers: Vec<String>,
    /// The stdio servers' process groups, killed when this is dropped.
    groups: Groups,
}

impl McpClients {
    /// Declares every server in `registry` and starts its supervisor on the
    /// current tokio runtime.
    /// A stdio server the kernel cannot sandbox (and `[tools] sandbox`
    /// is not `"off"`) is refused: logged at ERROR, not started.
    pub fn start(
        configs: Vec<McpServerConfig>,
        registry: &ToolRegistry,
        sandbox: &Sandbox,
    ) -> McpClients {
        let (stop, stopped) = watch::channel(false);
        let mut servers = Vec::new();
        let groups = Groups::default();
        for config in configs {
            let policy = match &config.transport {
                McpTransport::Stdio {
                    command,
                    args,
                    network,
                    paths,
                    sandbox_limits,
                    ..
                } => sandbox.policy(
                    &server_folders(command, args),
                    paths,
                    *network,
                    sandbox_limits,
                ),
                McpTransport::Http { .. } => Ok(None),
            };
            let policy = match policy {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(server = %config.name, "MCP server refused: {e}");
                    continue;
                }
            };
            servers.push(config.name.clone());
            registry.declare_mcp_server(&config.name);
            let (tx, rx) = mpsc::unbounded_channel();
            let link = Arc::new(Link {
                config,
                peer: RwLock::new(None),
                broken: tx,
                list_changed: Notify::new(),
                groups: groups.clone(),
                sandbox: policy,
            });
            tokio::spawn(supervise(link, rx, registry.clone(), stopped.clone()));
        }
        McpClients {
            stop,
            servers,
            groups,
        }
    }

    pub fn servers(&self) -> &[String] {
        &self.servers
    }
}

impl Drop for McpClients {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        // The supervisors close their servers when they next run; this
        // holds even if they never do (the runtime is going away).
        self.groups.kill_all();
    }
}

/// Delivers `tools/list_changed` to the supervisor.
struct Notifier {
    link: Arc<Link>,
}

impl ClientHandler for Notifier {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.link.list_changed.notify_one();
    }

    fn get_info(&self) -> ClientConfig {
        let mut info = ClientConfig::default();
        info.protocol_version = ProtocolVersion::V_2025_11_25;
        info.client_info = Implementation::new("cadre", env!("CARGO_PKG_VERSION"));
        info
    }
}

type Running = rmcp::service::RunningService<RoleClient, Notifier>;

/// Why a server is not served: unreachable, or refused (late or over a bound).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
enum Failure {
    /// It could not be started or reached: retried with the backoff.
    #[error("{0}")]
    Unreachable(String),
    /// A deadline passed: retried with the backoff.
    #[error("{0}")]
    Late(String),
    /// A bound was broken: not asked again.
    #[error("{0}")]
    Over(String),
}

/// A stdio server's own folders, readable in its sandbox: the folder of
/// its command when that is a path, and of each argument that is an
/// absolute path to a file (`python3 /srv/mcp/server.py`).
fn server_folders(command: &str, args: &[String]) -> Vec<std::path::PathBuf> {
    let mut folders = Vec::new();
    let command = std::path::Path::new(command);
    if command.components().count() > 1
        && let Some(dir) = command.parent()
    {
        folders.push(std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf()));
    }
    for arg in args {
        let path = std::path::Path::new(arg);
        if path.is_absolute()
            && path.is_file()
            && let Some(dir) = path.parent()
        {
            folders.push(dir.to_path_buf());
        }
    }
    folders
}

/// Connects and initializes within `init_timeout`.
async fn connect(link: &Arc<Link>) -> Result<(Running, Why), Failure> {
    let deadline = link.config.limits.init_timeout;
    match tokio::time::timeout(deadline, connect_now(link)).await {
        Ok(r) => r.map_err(Failure::Unreachable),
        Err(_) => Err(Failure::Late(format!(
            "no answer to initialize within {deadline:?} (init_timeout_s)"
        ))),
    }
}

/// The connection, under [`Bounded`], and where the reason a bound ended
/// it will be.
async fn connect_now(link: &Arc<Link>) -> Result<(Running, Why), String> {
    let notifier = Notifier { link: link.clone() };
    let server = link.config.name.as_str();
    match &link.config.transport {
        McpTransport::Stdio {
            command, args, env, ..
        } => {
            let mut cmd = tokio::process::Command::new(command);
            // A clean environment: PATH, HOME, LANG and its `env` table
            // (`K = "${K}"` passes one of cadre's), nothing else of cadre's;
            // sandboxed, HOME and the working directory are the server's
            // scratch dir, which lives as long as the process.
            let jail = match &link.sandbox {
                Some(policy) => {
                    let jail = policy
                        .prepare()
                        .map_err(|e| format!("cannot prepare the sandbox of '{command}': {e}"))?;
                    jail.command_in(&mut cmd, &[], env, true);
                    Some(jail)
                }
                None => {
                    crate::tools::process::clean_env(&mut cmd, &[], env);
                    None
                }
            };
            cmd.args(args);
            let transport = ChildTransport::spawn(
                &link.config.name,
                cmd,
                link.config.limits.max_message_bytes,
                &link.groups,
                jail,
            )
            .map_err(|e| format!("cannot start '{command}': {e}"))?;
            let transport = Bounded::new(server, transport);
            let why = transport.why();
            let running = notifier.serve(transport).await.map_err(|e| e.to_string())?;
            Ok((running, why))
        }
        McpTransport::Http { url, headers } => {
            let mut custom = HashMap::new();
            for (k, v) in headers {
                let name = axum::http::HeaderName::from_bytes(k.as_bytes())
                    .map_err(|e| format!("header name {k:?}: {e}"))?;
                let value = axum::http::HeaderValue::from_str(v)
                    .map_err(|_| format!("the value of header {k} is not valid"))?;
                custom.insert(name, value);
            }
            // The same cap as on stdio; rmcp enforces it before decoding.
            let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                .custom_headers(custom)
                .max_json_response_size(link.config.limits.max_message_bytes)
                .max_sse_event_size(link.config.limits.max_message_bytes);
            let transport =
                Bounded::new(server, StreamableHttpClientTransport::from_config(config));
            let why = transport.why();
            let running = notifier.serve(transport).await.map_err(|e| e.to_string())?;
            Ok((running, why))
        }
    }
}

/// Connects, lists, waits for the end or a change, and starts over.
async fn supervise(
    link: Arc<Link>,
    mut broken: mpsc::UnboundedReceiver<Broken>,
    registry: ToolRegistry,
    mut stop: watch::Receiver<bool>,
) {
    let server = link.config.name.clone();
    let interval = link.config.limits.relist_interval;
    let mut delay = FIRST_DELAY;
    let mut connection = 0u64;
    loop {
        connection += 1;
        let attempt = tokio::select! {
            r = connect(&link) => r,
            _ = stop.changed() => return,
        };
        match attempt {
            Ok((running, why)) => {
                let since = Instant::now();
                let peer = running.peer().clone();
                *link.peer.write().expect("mcp link lock") = Some((connection, peer.clone()));
                tracing::info!(%server, "MCP server connected");
                let mut listed = list(&link, &peer, &registry, true).await;
                let mut last_list = tokio::time::Instant::now();
                let token = running.cancellation_token();
                let waiting = running.waiting();
                tokio::pin!(waiting);
                // A listing asked for by `tools/list_changed`, not started yet.
                let mut pending: Option<tokio::time::Instant> = None;
                let mut coalesced = 0u64;
                let ended = loop {
                    if let Err(refusal) = &listed {
                        token.cancel();
                        let _ = waiting.await;
                        break Err(refusal.clone());
                    }
                    let due = async {
                        match pending {
                            Some(at) => tokio::time::sleep_until(at).await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        _ = &mut waiting => break Ok(false),
                        _ = stop.changed() => {
                            token.cancel();
                            let _ = waiting.await;
                            break Ok(true);
                        }
                        _ = link.list_changed.notified() => {
                            coalesced += 1;
                            pending.get_or_insert_with(|| {
                                (tokio::time::Instant::now() + DEBOUNCE).max(last_list + interval)
                            });
                        }
                        _ = due => {
                            tracing::debug!(%server, notifications = coalesced, "tools/list_changed: listing again");
                            pending = None;
                            coalesced = 0;
                            listed = list(&link, &peer, &registry, false).await;
                            last_list = tokio::time::Instant::now();
                        }
                        Some(Broken(n)) = broken.recv() => {
                            if n != connection {
                                // A call on an earlier connection saw it end.
                                continue;
                            }
                            token.cancel();
                            let _ = waiting.await;
                            break Ok(false);
                        }
                    }
                };
                *link.peer.write().expect("mcp link lock") = None;
                registry.set_mcp_available(&server, false);
                match ended {
                    Ok(true) => return,
                    _ if *stop.borrow() => return,
                    Ok(false) => {
                        let reason = why
                            .lock()
                            .expect("mcp why lock")
                            .take()
                            .unwrap_or_else(|| "the connection ended".into());
                        tracing::warn!(%server, %reason, "MCP server connection ended; reconnecting");
                        down(&registry, &server, reason);
                    }
                    Err(Failure::Unreachable(e)) => {
                        down(&registry, &server, e.clone());
                        tracing::warn!(%server, "MCP server connection ended while listing ({e}); reconnecting");
                    }
                    Err(refusal) => {
                        refuse(&registry, &server, &refusal);
                        if let Failure::Over(_) = refusal {
                            // Not asked again: wait for shutdown.
                            let _ = stop.changed().await;
                            return;
                        }
                    }
                }
                if since.elapsed() > HEALTHY_AFTER {
                    delay = FIRST_DELAY;
                }
            }
            Err(Failure::Unreachable(e)) => {
                tracing::warn!(%server, retry_in_ms = delay.as_millis() as u64, "MCP server not reachable: {e}");
                down(&registry, &server, e);
            }
            Err(refusal) => refuse(&registry, &server, &refusal),
        }
        // Drain stale events of the connection that is gone.
        while broken.try_recv().is_ok() {}
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return,
        }
        delay = (delay * 2).min(MAX_DELAY);
    }
}

/// Marks `server` refused: one WARN line and an `mcp_server_down` event with the reason.
fn refuse(registry: &ToolRegistry, server: &str, refusal: &Failure) {
    let retried = !matches!(refusal, Failure::Over(_));
    tracing::warn!(%server, retried, "MCP server refused: {refusal}");
    down(registry, server, format!("refused: {refusal}"));
}

/// `server` is down: the registry keeps the reason (`GET /v1/tools` shows
/// it) and an `mcp_server_down` event says it.
fn down(registry: &ToolRegistry, server: &str, reason: String) {
    registry.set_mcp_down(server, &reason);
    registry.events().publish(EventKind::McpServerDown {
        server: server.to_string(),
        reason,
    });
}

/// Every page of `tools/list`, within the server's bounds.
async fn list_bounded(peer: &Peer<RoleClient>, limits: &McpLimits) -> Result<Vec<Tool>, Failure> {
    let deadline = limits.list_timeout;
    let pages = async {
        let mut tools = Vec::new();
        // The listing as a whole fits in what one message may hold.
        let mut bytes = 0usize;
        let mut seen = HashSet::new();
        let mut cursor = None;
        for _ in 0..limits.max_pages {
            let params = PaginatedRequestParams::default().with_cursor(cursor.clone());
            let page = peer.list_tools(Some(params)).await.map_err(|e| match e {
                // Its answer broke a bound ([`super::stdio::UNREADABLE`],
                // [`super::stdio::RESULT_TOO_LARGE`]): not asked again.
                ServiceError::McpError(e)
                    if e.code.0 == super::stdio::UNREADABLE
                        || e.code.0 == super::stdio::RESULT_TOO_LARGE =>
                {
                    Failure::Over(format!("tools/list failed: {}", e.message))
                }
                // Its own error (an internal error while it starts, say):
                // asked again with the backoff, like a missed deadline.
                ServiceError::McpError(e) => {
                    Failure::Late(format!("tools/list failed: {}", e.message))
                }
                // The connection ended: reconnected like any other end.
                e => Failure::Unreachable(format!("tools/list: {e}")),
            })?;
            bytes += page
                .tools
                .iter()
                .map(|t| serde_json::to_vec(t).map_or(0, |v| v.len()))
                .sum::<usize>();
            tools.extend(page.tools);
            if bytes > limits.max_message_bytes {
                return Err(Failure::Over(format!(
                    "tools/list is over {} bytes in all (max_message_mb)",
                    limits.max_message_bytes
                )));
            }
            if tools.len() > limits.max_tools {
                return Err(Failure::Over(format!(
                    "tools/list has more than {} tools (max_tools)",
                    limits.max_tools
                )));
            }
            match page.next_cursor {
                None => return Ok(tools),
                Some(next) if !seen.insert(next.clone()) => {
                    return Err(Failure::Over(format!(
                        "tools/list repeated the cursor {:?}",
                        truncated(&next)
                    )));
                }
                Some(next) => cursor = Some(next),
            }
        }
        Err(Failure::Over(format!(
            "tools/list has more than {} pages (max_pages)",
            limits.max_pages
        )))
    };
    match tokio::time::timeout(deadline, pages).await {
        Ok(r) => r,
        Err(_) => Err(Failure::Late(format!(
            "tools/list did not complete within {deadline:?} (list_timeout_s)"
        ))),
    }
}

fn truncated(text: &str) -> String {
    text.chars().take(64).collect()
}

/// Lists the server's tools into the registry (`first`: the first listing
/// of this connection).
async fn list(
    link: &Arc<Link>,
    peer: &Peer<RoleClient>,
    registry: &ToolRegistry,
    first: bool,
) -> Result<(), Failure> {
    let server = &link.config.name;
    let limits = &link.config.limits;
    let tools = list_bounded(peer, limits).await?;
    let mut refused_names = Vec::new();
    let tools = tools
        .into_iter()
        .filter_map(|t| {
            if let Some(why) = bad_name(&t.name) {
                refused_names.push(format!("{:?} ({why})", truncated(&t.name)));
                return None;
            }
            definition(link, t)
        })
        .collect::<Vec<_>>();
    let count = tools.len();
    let schema_bytes: usize = tools
        .iter()
        .map(|(d, _)| d.parameters.to_string().len() + d.description.len())
        .sum();
    let report = registry.set_mcp_tools(server, tools);
    if !(first || report.changed()) {
        tracing::debug!(%server, tools = count, "MCP tools listed again, unchanged");
        return Ok(());
    }
    if !refused_names.is_empty() {
        tracing::warn!(%server, refused = refused_names.len(), "MCP tools refused, not served: {}", refused_names.join(", "));
    }
    if count > limits.warn_tools || schema_bytes > limits.warn_schema_bytes {
        tracing::warn!(%server, tools = count, schema_bytes,
            "MCP server lists many tools (warn_tools {}, warn_schema_kb {}): each one an agent names is sent on every model call, and providers cap tools per request; narrow the agent's `tools` or set max_tools",
            limits.warn_tools, limits.warn_schema_bytes / 1024);
    }
    registry.events().publish(EventKind::McpServerUp {
        server: server.clone(),
        tools: count,
    });
    tracing::info!(%server, added = report.added.len(), updated = report.updated.len(), removed = report.removed.len(), "MCP tools listed");
    Ok(())
}

/// Why an MCP tool name is refused: cadre names it `server.tool` and the
/// model `server__tool`, so a `.` or `__` inside would not map back to one
/// tool.
fn bad_name(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("empty")
    } else if name.contains('.') {
        Some("contains '.'")
    } else if name.contains("__") {
        Some("contains '__'")
    } else {
        None
    }
}

/// The registry's definition of one server tool, or `None` (logged) when
/// its name cannot be offered to a model.
fn definition(link: &Arc<Link>, tool: Tool) -> Option<(ToolDefinition, Arc<dyn ToolHandler>)> {
    let c = &link.config;
    let name = format!("{}.{}", c.name, tool.name);
    let wire = wire_name(&name);
    let offerable = wire.len() <= 64
        && wire
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-');
    if !offerable {
        tracing::warn!(server = %c.name, tool = %tool.name, "MCP tool left out: its name is not a valid function name on the wire ({wire})");
        return None;
    }
    let side_effects = c
        .declared_side_effects(&tool.name)
        .unwrap_or_else(|| annotated_side_effects(&tool));
    let mut parameters = Value::Object((*tool.input_schema).clone());
    if parameters.get("type").is_none() {
        parameters["type"] = Value::String("object".into());
    }
    let definition = ToolDefinition {
        name,
        version: "mcp".into(),
        description: tool
            .description
            .map(|d| d.to_string())
            .or(tool.title.clone())
            .unwrap_or_else(|| format!("{} (MCP server {})", tool.name, c.name)),
        category: c.category.clone(),
        tags: vec!["mcp".into(), c.name.clone()],
        parameters,
        entry: Entry::Mcp {
            server: c.name.clone(),
            tool: tool.name.to_string(),
        },
        output: tool.output_schema.map(|s| Value::Object((*s).clone())),
        required_plan: c.required_plan,
        rate_limit: c.rate_limit,
        // Never the category's default TTL: see the module doc.
        cache: Some(CacheSpec {
            ttl_seconds: c.cache_ttl_s.unwrap_or(0),
        }),
        post_processor: None,
        timeout: c.timeout,
        side_effects,
    };
    let handler = Arc::new(McpToolHandler {
        link: link.clone(),
        tool: tool.name.to_string(),
    });
    Some((definition, handler))
}

/// What a tool's MCP annotations say of its side effects; none said:
/// `at_most_once`.
fn annotated_side_effects(tool: &Tool) -> SideEffects {
    let hints = tool.annotations.as_ref();
    if hints.and_then(|a| a.read_only_hint) == Some(true) {
        SideEffects::None
    } else if hints.and_then(|a| a.idempotent_hint) == Some(true) {
        SideEffects::Idempotent
    } else {
        SideEffects::AtMostOnce
    }
}

/// Runs one call on the server's live connection.
pub struct McpToolHandler {
    link: Arc<Link>,
    tool: String,
}

#[async_trait::async_trait]
impl ToolHandler for McpToolHandler {
    async fn call(&self, params: Value, ctx: &ExecutionContext) -> Result<Value, ToolError> {
        let (connection, peer) = self.link.peer().ok_or_else(|| self.link.unavailable())?;
        let arguments = match params {
            Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        let mut request = CallToolRequestParams::new(self.tool.clone()).with_arguments(arguments);
        if let Some(key) = &ctx.idempotency_key {
            let mut meta = RequestMetaObject::new();
            meta.insert(IDEMPOTENCY_META_KEY.into(), Value::String(key.clone()));
            request.meta = Some(meta);
        }
        match peer.call_tool(request).await {
            Ok(result) => {
                if result.is_error == Some(true) {
                    let text = content::texts(&result);
                    let message = if text.is_empty() {
                        format!("{} reported an error", self.tool)
                    } else {
                        text.join("\n")
                    };
                    return Err(ToolError::failed(message));
                }
                Ok(content::output(result))
            }
            Err(ServiceError::McpError(e)) if e.code == ErrorCode::INVALID_PARAMS => {
                Err(ToolError::invalid(e.message.to_string()))
            }
            Err(ServiceError::McpError(e)) => Err(ToolError::failed(e.message.to_string())),
            Err(ServiceError::Timeout { timeout }) => Err(ToolError::Transient {
                message: format!("the MCP server did not answer within {timeout:?}"),
            }),
            Err(e) => {
                // The connection is gone: the supervisor reconnects.
                tracing::warn!(server = %self.link.config.name, "MCP call failed in transport: {e}");
                let _ = self.link.broken.send(Broken(connection));
                Err(self.link.unavailable())
            }
        }
    }
}
