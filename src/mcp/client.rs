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
//! fail with `tool_unavailable`, which the model sees like any tool error.
//! A transport failure during a call also counts as the server dying.
//!
//! Decisions: cadre asks for protocol 2025-11-25, whose servers send
//! `tools/list_changed` unscoped (2026-07-28 would need a listen stream).
//! An `isError` result is an `execution_error` with the server's text; an
//! `invalid params` JSON-RPC error is a `validation_error`. The output is
//! made of the result's content as [`super::content`] says (structured,
//! text, or the blocks themselves when any is not text). The tool's
//! `outputSchema` is kept as the definition's `output`, which cadre's own
//! MCP server offers again.
//!
//! Caching: a server tool's results are cached only when its server sets
//! `cache_ttl_s` in mcp.toml. The executor's per-category TTLs (30 s for an
//! unknown category such as `mcp`) never apply: cadre cannot tell a
//! server's side-effecting tool from a pure one, and a call answered from
//! the cache would report an action that did not run. So every MCP
//! definition carries an explicit cache spec, 0 (never) by default.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, ClientConfig, ErrorCode, Implementation, ProtocolVersion, Tool,
};
use rmcp::service::{NotificationContext, Peer, RoleClient, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, ServiceExt};
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use super::config::{McpServerConfig, McpTransport};
use super::content;
use crate::events::EventKind;
use crate::model::wire_name;
use crate::tools::definition::{CacheSpec, Entry};
use crate::tools::{ExecutionContext, ToolDefinition, ToolError, ToolHandler, ToolRegistry};

const FIRST_DELAY: Duration = Duration::from_millis(200);
const MAX_DELAY: Duration = Duration::from_secs(30);
const HEALTHY_AFTER: Duration = Duration::from_secs(60);

/// The connection to one server, shared by its supervisor and its tools.
struct Link {
    config: McpServerConfig,
    peer: RwLock<Option<Peer<RoleClient>>>,
    /// Asks the supervisor to drop the connection and reconnect.
    broken: mpsc::UnboundedSender<Event>,
}

enum Event {
    ListChanged,
    Broken,
}

impl Link {
    fn peer(&self) -> Option<Peer<RoleClient>> {
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
}

impl McpClients {
    /// Declares every server in `registry` and starts its supervisor on the
    /// current tokio runtime.
    pub fn start(configs: Vec<McpServerConfig>, registry: &ToolRegistry) -> McpClients {
        let (stop, stopped) = watch::channel(false);
        let servers = configs.iter().map(|c| c.name.clone()).collect();
        for config in configs {
            registry.declare_mcp_server(&config.name);
            let (tx, rx) = mpsc::unbounded_channel();
            let link = Arc::new(Link {
                config,
                peer: RwLock::new(None),
                broken: tx,
            });
            tokio::spawn(supervise(link, rx, registry.clone(), stopped.clone()));
        }
        McpClients { stop, servers }
    }

    pub fn servers(&self) -> &[String] {
        &self.servers
    }
}

impl Drop for McpClients {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Delivers `tools/list_changed` to the supervisor.
struct Notifier {
    events: mpsc::UnboundedSender<Event>,
}

impl ClientHandler for Notifier {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.events.send(Event::ListChanged);
    }

    fn get_info(&self) -> ClientConfig {
        let mut info = ClientConfig::default();
        info.protocol_version = ProtocolVersion::V_2025_11_25;
        info.client_info = Implementation::new("cadre", env!("CARGO_PKG_VERSION"));
        info
    }
}

type Running = rmcp::service::RunningService<RoleClient, Notifier>;

async fn connect(link: &Link) -> Result<Running, String> {
    let notifier = Notifier {
        events: link.broken.clone(),
    };
    match &link.config.transport {
        McpTransport::Stdio { command, args, env } => {
            let mut cmd = tokio::process::Command::new(command);
            cmd.args(args).envs(env);
            let transport = TokioChildProcess::new(cmd)
                .map_err(|e| format!("cannot start '{command}': {e}"))?;
            notifier.serve(transport).await.map_err(|e| e.to_string())
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
            let config =
                StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(custom);
            let transport = StreamableHttpClientTransport::from_config(config);
            notifier.serve(transport).await.map_err(|e| e.to_string())
        }
    }
}

/// Connects, lists, waits for the end or a change, and starts over.
async fn supervise(
    link: Arc<Link>,
    mut events: mpsc::UnboundedReceiver<Event>,
    registry: ToolRegistry,
    mut stop: watch::Receiver<bool>,
) {
    let server = link.config.name.clone();
    let mut delay = FIRST_DELAY;
    loop {
        let attempt = tokio::select! {
            r = connect(&link) => r,
            _ = stop.changed() => return,
        };
        match attempt {
            Ok(running) => {
                let since = Instant::now();
                let peer = running.peer().clone();
                *link.peer.write().expect("mcp link lock") = Some(peer.clone());
                tracing::info!(%server, "MCP server connected");
                let ok = list(&link, &peer, &registry).await;
                let ended = if ok {
                    let token = running.cancellation_token();
                    let waiting = running.waiting();
                    tokio::pin!(waiting);
                    loop {
                        tokio::select! {
                            _ = &mut waiting => break false,
                            _ = stop.changed() => {
                                token.cancel();
                                let _ = waiting.await;
                                break true;
                            }
                            event = events.recv() => match event {
                                Some(Event::ListChanged) => {
                                    if !list(&link, &peer, &registry).await {
                                        token.cancel();
                                        let _ = waiting.await;
                                        break false;
                                    }
                                }
                                Some(Event::Broken) | None => {
                                    token.cancel();
                                    let _ = waiting.await;
                                    break false;
                                }
                            },
                        }
                    }
                } else {
                    let _ = running.cancel().await;
                    false
                };
                *link.peer.write().expect("mcp link lock") = None;
                registry.set_mcp_available(&server, false);
                if ended || *stop.borrow() {
                    return;
                }
                registry.events().publish(EventKind::McpServerDown {
                    server: server.clone(),
                    reason: "the connection ended".into(),
                });
                tracing::warn!(%server, "MCP server connection ended; reconnecting");
                if since.elapsed() > HEALTHY_AFTER {
                    delay = FIRST_DELAY;
                }
            }
            Err(e) => {
                tracing::warn!(%server, retry_in_ms = delay.as_millis() as u64, "MCP server not reachable: {e}");
                registry.events().publish(EventKind::McpServerDown {
                    server: server.clone(),
                    reason: e,
                });
            }
        }
        // Drain stale events of the connection that is gone.
        while events.try_recv().is_ok() {}
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return,
        }
        delay = (delay * 2).min(MAX_DELAY);
    }
}

/// Lists the server's tools into the registry; false when the listing failed.
async fn list(link: &Arc<Link>, peer: &Peer<RoleClient>, registry: &ToolRegistry) -> bool {
    let server = &link.config.name;
    match peer.list_all_tools().await {
        Ok(tools) => {
            let tools = tools
                .into_iter()
                .filter_map(|t| definition(link, t))
                .collect::<Vec<_>>();
            let count = tools.len();
            let report = registry.set_mcp_tools(server, tools);
            registry.events().publish(EventKind::McpServerUp {
                server: server.clone(),
                tools: count,
            });
            tracing::info!(%server, added = report.added.len(), updated = report.updated.len(), removed = report.removed.len(), "MCP tools listed");
            true
        }
        Err(e) => {
            tracing::warn!(%server, "tools/list failed: {e}");
            false
        }
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
    };
    let handler = Arc::new(McpToolHandler {
        link: link.clone(),
        tool: tool.name.to_string(),
    });
    Some((definition, handler))
}

/// Runs one call on the server's live connection.
pub struct McpToolHandler {
    link: Arc<Link>,
    tool: String,
}

#[async_trait::async_trait]
impl ToolHandler for McpToolHandler {
    async fn call(&self, params: Value, _ctx: &ExecutionContext) -> Result<Value, ToolError> {
        let peer = self.link.peer().ok_or_else(|| self.link.unavailable())?;
        let arguments = match params {
            Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        let request = CallToolRequestParams::new(self.tool.clone()).with_arguments(arguments);
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
                let _ = self.link.broken.send(Event::Broken);
                Err(self.link.unavailable())
            }
        }
    }
}
