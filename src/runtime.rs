//! Runtime: wires store, tools, executor, agents, sessions and HTTP on one
//! tokio runtime shared with actix.
//!
//! server thread: tokio multi-thread runtime (Arc) ─┬─ actix System (this thread)
//!                                                  ├─ arbiter × cores: conversations, workflow runners
//!                                                  ├─ arbiter: the supervised executor
//!                                                  └─ axum on the tokio workers (accept loop: [`crate::http::connections`])
//!
//! [`RuntimeBuilder::start`] runs all of it on a thread of its own and
//! returns once the store is open and the listener is bound, so the same
//! code serves `cadre serve`, `cadre chat` (no listener), `cadre mcp`
//! ([`Runtime::serve_mcp_stdio`]: MCP on stdio) and the tests
//! (several independent runtimes in one process). Dropping the [`Runtime`]
//! (or SIGTERM / SIGINT with `handle_signals`) stops accepting, ends the
//! event subscriptions (`/v1/events`, workflow run events: they would
//! otherwise hold the shutdown for the whole grace), lets running requests
//! finish for up to `[server] shutdown_grace_s`, then closes the store to
//! writes (a turn cut off by the deadline can no longer store its answer:
//! it was never acknowledged and must not look complete after a restart),
//! flushes it, stops the actors and closes the database file before it
//! returns.
//!
//! While it listens, a server records where in `<data dir>/server.json`
//! ([`ServerFile`]: its loopback URL and pid), removed when it stops. A
//! command that needs the data dir while a server holds it (redb allows one
//! process per file) reads it and talks to that server over HTTP instead;
//! it believes only a loopback URL of a live pid (it sends the API key
//! there).
//!
//! With `handle_signals`, the first SIGINT / SIGTERM logs what the shutdown
//! waits for (open connections, up to the grace) and a second SIGINT exits
//! at once: the store is closed to writes first, so a turn cut there was
//! never acknowledged and its answer is never stored.
//!
//! Cluster mode (`[cluster] redis`): [`connect_cluster`] connects before
//! anything else starts (no Redis, no node: the error names the setting),
//! `limits` hands the executor Redis-backed limiters and concurrency gate,
//! the event fan-out (`cluster::fanout`) runs for as long as the server, and
//! so do the node's duties (`cluster::node`: heartbeat, takeover).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use actix::Arbiter;
use tokio::sync::oneshot;

use crate::agents::{Agent, AgentFile, AgentFiles, Agents, ConfigError};
use crate::conversation::Sessions;
use crate::events::EventBus;
use crate::executor::cache::ResultCache;
use crate::executor::concurrency::ConcurrencyController;
use crate::executor::confirmations::Confirmations;
use crate::executor::limits::{RateLimiter, WindowStore};
use crate::executor::{ExecutorHandle, ExecutorShared};
use crate::http::connections::{Connections, raise_open_files_limit};
use crate::http::rate_limit::ApiRateLimit;
use crate::http::{AppShared, AppState, router};
use crate::mcp::McpServerDeps;
use crate::mcp::server::{Caller, McpServeError};
use crate::model::openai::ClientOptions;
use crate::model::{ModelEndpoint, SharedModel};
use crate::server_config::ServerConfig;
use crate::store::{Store, StoreError};
use crate::tools::{Plan, ToolDefinition, ToolHandler, ToolRegistry, builtin, watch};
use crate::workflow::{Workflows, WorkflowsDeps};

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Mcp(#[from] crate::mcp::config::McpConfigError),
    #[error("tool {name}: {message}")]
    Tool { name: String, message: String },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no API keys are configured: refusing to serve open on {addr}; create one with \
         `cadre keys create --tenant ID` or listen on a loopback address"
    )]
    Open { addr: SocketAddr },
    #[error("cannot start the runtime: {0}")]
    Start(#[from] std::io::Error),
    #[error("the runtime thread stopped during startup")]
    Died,
    #[error("cannot create the data dir {path}: {source}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    #[error("[webhooks]: {0}")]
    Webhooks(String),
}

/// What [`RuntimeBuilder::tool_family`] takes.
type ToolFamily = Box<dyn FnOnce(&builtin::BuiltinContext) -> Vec<builtin::ToolEntry> + Send>;

pub struct RuntimeBuilder {
    data_dir: PathBuf,
    agents_dir: PathBuf,
    listen: Option<SocketAddr>,
    endpoint: ModelEndpoint,
    model: Option<SharedModel>,
    tools: Vec<(ToolDefinition, Arc<dyn ToolHandler>)>,
    handlers: Vec<(String, Arc<dyn ToolHandler>)>,
    families: Vec<ToolFamily>,
    client_options: ClientOptions,
    config: ServerConfig,
    workers: usize,
    handle_signals: bool,
    /// Cluster mode: connected at start from `[cluster] redis`.
    cluster: Option<crate::cluster::Redis>,
}

impl Default for RuntimeBuilder {
    fn default() -> Self {
        RuntimeBuilder {
            data_dir: PathBuf::from("./data"),
            agents_dir: PathBuf::from("./agents"),
            listen: None,
            endpoint: ModelEndpoint::from_env(),
            model: None,
            tools: Vec::new(),
            handlers: Vec::new(),
            families: Vec::new(),
            client_options: ClientOptions::default(),
            config: ServerConfig::default(),
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            handle_signals: false,
            cluster: None,
        }
    }
}

impl RuntimeBuilder {
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = dir.into();
        self
    }
    pub fn agents_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.agents_dir = dir.into();
        self
    }
    /// Serve HTTP on this address (port 0 picks a free one).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = Some(addr);
        self
    }
    /// The model endpoint (default: from `CADRE_MODEL_*` / `OPENAI_API_KEY`).
    pub fn model_endpoint(mut self, endpoint: ModelEndpoint) -> Self {
        self.endpoint = endpoint;
        self
    }
    /// Use this model for every agent without its own endpoint override.
    pub fn model(mut self, model: SharedModel) -> Self {
        self.model = Some(model);
        self
    }
    pub fn client_options(mut self, options: ClientOptions) -> Self {
        self.client_options = options;
        self
    }

    /// Cluster mode: shared limits, permits and events in this Redis
    /// (`[cluster] redis`).
    pub fn redis(mut self, url: impl Into<String>) -> Self {
        self.config.cluster.redis = Some(url.into());
        self
    }

    /// Server settings: concurrency, API limit, executor, tools.
    pub fn config(mut self, config: ServerConfig) -> Self {
        self.config = config;
        self
    }
    /// Registers a tool of the embedding program.
    pub fn tool(mut self, definition: ToolDefinition, handler: Arc<dyn ToolHandler>) -> Self {
        self.tools.push((definition, handler));
        self
    }
    /// Registers a family of tools built into the program (the `cadre`
    /// binary's sample domain, `cadre_sample::tools`): called once at
    /// start with what the runtime's own builtins get (the store for
    /// per-user state, the agents folder's `data/`, the HTTP allowlist).
    /// They register as builtins do: tool files name them with
    /// `entry.type = builtin`, and their definitions are taken as declared
    /// (`side_effects`, `cache`), where [`RuntimeBuilder::tool`] treats an
    /// undeclared tool as one that acts.
    pub fn tool_family(
        mut self,
        family: impl FnOnce(&builtin::BuiltinContext) -> Vec<builtin::ToolEntry> + Send + 'static,
    ) -> Self {
        self.families.push(Box::new(family));
        self
    }
    /// Registers a handler that tool files name with `entry: {type: custom, handler: NAME}`.
    pub fn handler(mut self, name: &str, handler: Arc<dyn ToolHandler>) -> Self {
        self.handlers.push((name.into(), handler));
        self
    }
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }
    /// Stop on SIGINT / SIGTERM (for `cadre serve`).
    pub fn handle_signals(mut self, yes: bool) -> Self {
        self.handle_signals = yes;
        self
    }

    /// Starts the runtime on its own thread; returns when it is ready.
    pub fn start(self) -> Result<Runtime, RuntimeError> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("cadre-runtime".into())
            .spawn(move || run(self, ready_tx, stop_rx))?;
        match ready_rx.recv() {
            Ok(Ok(ready)) => Ok(Runtime {
                addr: ready.addr,
                sessions: Some(ready.sessions),
                registry: ready.registry,
                executor: Some(ready.executor),
                workflows: Some(ready.workflows),
                providers: ready.providers,
                stop: Some(stop_tx),
                thread: Some(thread),
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(RuntimeError::Died)
            }
        }
    }
}

struct Ready {
    addr: Option<SocketAddr>,
    sessions: Sessions,
    registry: ToolRegistry,
    executor: ExecutorHandle,
    workflows: Workflows,
    providers: Vec<String>,
}

/// A running cadre. Dropping it shuts it down cleanly.
pub struct Runtime {
    addr: Option<SocketAddr>,
    sessions: Option<Sessions>,
    registry: ToolRegistry,
    executor: Option<ExecutorHandle>,
    workflows: Option<Workflows>,
    providers: Vec<String>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Runtime {
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    /// The bound HTTP address, when listening.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    pub fn sessions(&self) -> &Sessions {
        self.sessions.as_ref().expect("sessions live until drop")
    }

    pub fn registry(&self) -> &ToolRegistry {
        &self.registry
    }

    /// The runtime's event bus (`subscribe()` for tool and execution events).
    pub fn events(&self) -> &EventBus {
        self.registry.events()
    }

    pub fn executor(&self) -> &ExecutorHandle {
        self.executor.as_ref().expect("executor lives until drop")
    }

    /// Workflow definitions and runs.
    pub fn workflows(&self) -> &Workflows {
        self.workflows.as_ref().expect("workflows live until drop")
    }

    /// One line per agent: which model serves it.
    pub fn providers(&self) -> &[String] {
        &self.providers
    }

    /// `cadre mcp`: serves this runtime's tools and agents over MCP on
    /// stdin/stdout as the local operator on `plan` (tenant `default`),
    /// until the client closes stdin. Blocks, on a tokio runtime of its own
    /// (the handles reach the actors from any runtime).
    /// `confirmation_tools`: offer `confirmations_list` and
    /// `confirmation_decide` (see `mcp::server`).
    pub fn serve_mcp_stdio(
        &self,
        plan: Plan,
        confirmation_tools: bool,
    ) -> Result<(), McpServeError> {
        let deps = McpServerDeps {
            registry: self.registry.clone(),
            executor: self.executor().clone(),
            sessions: self.sessions().clone(),
            confirmation_tools,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| McpServeError::Start {
                message: e.to_string(),
            })?;
        rt.block_on(crate::mcp::server::serve_stdio(deps, Caller::local(plan)))
    }

    /// Blocks until the server stops by itself (a signal, with
    /// `handle_signals`), then finishes the shutdown.
    pub fn wait(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // Our own clones of the store must go before the writer can close.
        self.sessions.take();
        self.executor.take();
        self.workflows.take();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(
    builder: RuntimeBuilder,
    ready: std::sync::mpsc::Sender<Result<Ready, RuntimeError>>,
    stop: oneshot::Receiver<()>,
) {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(builder.workers)
        .thread_name("cadre-worker")
        .enable_all()
        .build()
    {
        Ok(rt) => Arc::new(rt),
        Err(e) => {
            let _ = ready.send(Err(e.into()));
            return;
        }
    };
    let system = actix::System::with_tokio_rt({
        let rt = rt.clone();
        move || rt
    });
    let arbiters: Vec<Arbiter> = (0..builder.workers + 1)
        .map(|_| {
            let rt = rt.clone();
            Arbiter::with_tokio_rt(move || rt)
        })
        .collect();
    let handles: Vec<_> = arbiters.iter().map(Arbiter::handle).collect();
    system.block_on(serve(builder, handles, ready, stop));
    for arbiter in arbiters {
        arbiter.stop();
        let _ = arbiter.join();
    }
    actix::System::current().stop();
    drop(system);
    if let Ok(rt) = Arc::try_unwrap(rt) {
        rt.shutdown_timeout(Duration::from_secs(5));
    }
}

/// Cluster mode: connects to `[cluster] redis` (none configured: `None`,
/// a single node); the error names the setting and the URL.
pub async fn connect_cluster(
    config: &crate::server_config::ClusterSection,
) -> Result<Option<crate::cluster::Redis>, RuntimeError> {
    match &config.redis {
        Some(url) => Ok(Some(crate::cluster::Redis::connect(url).await?)),
        None => Ok(None),
    }
}

/// The executor's limiters and concurrency gate: in process, or (with
/// Redis) shared by every node under the `[cluster]` failure policy.
fn limits(
    config: &ServerConfig,
    redis: Option<&crate::cluster::Redis>,
) -> (
    Arc<dyn WindowStore>,
    Arc<dyn WindowStore>,
    Arc<ConcurrencyController>,
) {
    let Some(redis) = redis else {
        return (
            Arc::new(RateLimiter::new()),
            Arc::new(RateLimiter::new()),
            Arc::new(ConcurrencyController::new(config.concurrency.clone())),
        );
    };
    let shared = crate::cluster::LimitStores::new(
        redis,
        &config.concurrency,
        config.cluster.redis_failure,
        config.cluster.permit_lease(),
    );
    (
        shared.user_windows,
        shared.tenant_windows,
        Arc::new(ConcurrencyController::with_pool(
            config.concurrency.clone(),
            shared.pool,
        )),
    )
}

/// This node's name in the event fan-out when `[cluster] node_id` is not
/// set: host, pid and a random part, so two processes never share one.
fn node_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "node".into());
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}-{}", std::process::id(), &random[..8])
}

struct Parts {
    store: Store,
    sessions: Sessions,
    registry: ToolRegistry,
    executor: ExecutorHandle,
    workflows: Workflows,
    providers: Vec<String>,
    mcp: crate::mcp::McpClients,
    /// Plugged into the registry's memory slot and the sessions before any
    /// turn runs: a turn a restart resumes may call `remember`.
    memory: crate::memory::Memory,
    /// Reads the agent files again (the watcher's reload).
    reload_agents: Arc<dyn Fn() + Send + Sync>,
}

fn setup(
    builder: &mut RuntimeBuilder,
    arbiters: &[actix::dev::ArbiterHandle],
) -> Result<Parts, RuntimeError> {
    // Created with its parents when missing, in every mode: a cluster
    // node's store is PostgreSQL, yet it records `server.json` here.
    std::fs::create_dir_all(&builder.data_dir).map_err(|source| RuntimeError::DataDir {
        path: builder.data_dir.clone(),
        source,
    })?;
    let config = &builder.config;
    let store = match &config.cluster.store {
        // Cluster mode: the shared PostgreSQL store, as this node.
        Some(url) => crate::cluster::postgres::open_store(
            url,
            crate::store::NodeIdentity {
                id: config.cluster.node_id.clone().unwrap_or_default(),
                // Unset: the listen address, when it is one others can
                // reach (not 0.0.0.0, not port 0); else none, and requests
                // for this node's sessions that reach other nodes get
                // SESSION_MOVED instead of being forwarded.
                addr: config.cluster.advertise.clone().or_else(|| {
                    builder
                        .listen
                        .filter(|a| !a.ip().is_unspecified() && a.port() != 0)
                        .map(|a| format!("http://{a}"))
                }),
                stale_after: Duration::from_secs_f64(config.cluster.owner_stale_s),
            },
        )?,
        None => Store::open_with_cache(
            &builder.data_dir,
            // Saturating: a config built in code skips `validate`'s bound.
            usize::try_from(config.store.cache_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX),
        )?,
    };
    let events = EventBus::new();
    let registry = ToolRegistry::with_events(events.clone(), config.tools.strict_validation);
    let builtin_ctx = builtin::BuiltinContext {
        store: store.clone(),
        data_dir: builder.agents_dir.join("data"),
        http_allowlist: config.tools.http_allowlist.clone(),
    };
    let tool_error = |name: String| {
        move |e: crate::tools::validate::SchemaError| RuntimeError::Tool {
            name,
            message: e.to_string(),
        }
    };
    builtin::register_all(&registry, &builtin_ctx).map_err(tool_error("builtin".into()))?;
    for family in builder.families.drain(..) {
        for (definition, handler) in family(&builtin_ctx) {
            let name = definition.name.clone();
            registry
                .register(definition, handler)
                .map_err(tool_error(name))?;
        }
    }
    for (definition, handler) in builder.tools.drain(..) {
        let name = definition.name.clone();
        registry
            .register_custom(definition, handler)
            .map_err(tool_error(name))?;
    }
    for (name, handler) in builder.handlers.drain(..) {
        registry.add_custom_handler(&name, handler);
    }
    // What command tools and stdio MCP servers run in; none of them sees
    // the data dir, the agents dir (but its own folder) or the config file.
    let sandbox = crate::tools::sandbox::Sandbox {
        mode: config.tools.sandbox,
        limits: config.tools.sandbox_limits,
        protected: [&builder.data_dir, &builder.agents_dir]
            .into_iter()
            .cloned()
            .chain(config.file.clone())
            .collect(),
    };
    sandbox.warn_if_off();
    registry.set_file_settings(crate::tools::loader::FileSettings {
        max_file_bytes: config.tools.max_file_bytes,
        http_allowlist: config.tools.http_allowlist.clone(),
        sandbox: sandbox.clone(),
    });
    let report = registry.reload_dir(&builder.agents_dir.join("tools"));
    for e in &report.errors {
        tracing::error!("{e}");
    }
    registry.announce();
    // MCP servers are declared before the agents resolve, so an agent may
    // name their tools before they are listed.
    let mcp = crate::mcp::McpClients::start(
        crate::mcp::config::load(&builder.agents_dir)?,
        &registry,
        &sandbox,
    );
    let agents = Agents::default();
    let agent_files = Arc::new(AgentFiles::new(&builder.agents_dir));
    let resolve = {
        let registry = registry.clone();
        let endpoint = builder.endpoint.clone();
        let model = builder.model.clone();
        let options = config.model.client_options(&builder.client_options);
        let env_endpoint = builder.endpoint == ModelEndpoint::from_env();
        move |file: AgentFile| -> Result<Agent, ConfigError> {
            let chosen_by = endpoint_chosen_by(&file, model.is_some(), env_endpoint);
            let agent = Agent::resolve(file, &registry, &endpoint, model.as_ref(), &options)?;
            tracing::info!(
                "agent {}: {} (chosen by {chosen_by})",
                agent.name,
                agent.model.describe()
            );
            Ok(agent)
        }
    };
    agent_files.load(&agents, &resolve)?;
    let remote_agents = crate::tools::remote_agent::RemoteAgents::new(store.clone());
    crate::agents::publish_agent_tools(&agents, &registry, &remote_agents);
    {
        // A remote agent's card read after the tools were published
        // describes its `ask_` tool from then on.
        let (agents, registry, remote) = (agents.clone(), registry.clone(), remote_agents.clone());
        tokio::spawn(async move {
            loop {
                remote.cards_changed().await;
                crate::agents::publish_agent_tools(&agents, &registry, &remote);
            }
        });
    }
    let providers: Vec<String> = agents
        .iter()
        .map(|a| format!("agent {}: {}", a.name, a.model.describe()))
        .collect();
    if providers.is_empty() {
        tracing::warn!(dir = %builder.agents_dir.display(), "no agents defined");
    }
    let reload_agents: Arc<dyn Fn() + Send + Sync> = {
        let agents = agents.clone();
        let events = events.clone();
        let registry = registry.clone();
        Arc::new(move || {
            reload_agent_files(&agent_files, &agents, &resolve, &events);
            crate::agents::publish_agent_tools(&agents, &registry, &remote_agents);
        })
    };
    let (limiter, tenant_limiter, concurrency) = limits(config, builder.cluster.as_ref());
    let executor_config = config.executor_config();
    let metrics = Arc::new(crate::metrics::Metrics::default());
    let shared = ExecutorShared {
        registry: registry.clone(),
        store: store.clone(),
        limiter,
        tenant_limiter,
        concurrency,
        cache: ResultCache::new(),
        confirmations: Confirmations::new(store.clone(), executor_config.confirmation_ttl),
        events,
        config: executor_config,
        restarts: Arc::default(),
        metrics: metrics.clone(),
    };
    let (executor_arbiter, conversation_arbiters) = arbiters.split_first().expect("arbiters");
    let executor = ExecutorHandle::start(executor_arbiter, conversation_arbiters, shared);
    let sessions = Sessions::new(
        store.clone(),
        agents,
        registry.clone(),
        executor.clone(),
        conversation_arbiters.to_vec(),
        config.session_limits(),
        metrics,
    );
    let memory = crate::memory::Memory::new(store.clone(), config.memory.clone());
    registry.memory_slot().set(memory.tools());
    sessions.use_memory(memory.clone());
    let workflows = Workflows::new(WorkflowsDeps {
        dir: builder.agents_dir.join("workflows"),
        store: store.clone(),
        sessions: sessions.clone(),
        executor: executor.clone(),
        registry: registry.clone(),
        arbiters: conversation_arbiters.to_vec(),
        limits: config.workflows.clone(),
        resume_window: config.session_limits().resume_window,
    });
    Ok(Parts {
        store,
        sessions,
        registry,
        executor,
        workflows,
        providers,
        mcp,
        memory,
        reload_agents,
    })
}

/// One rescan of the agents folder, whichever watcher (or the periodic
/// rescan) started it: the tool files first, then the agent files (which
/// name tools), then the workflows (which name both), so an agent file and
/// the tool file it names, dropped in together, load in one pass without a
/// `load_error`. `agents/mcp.toml` is read at startup only: a pass that
/// finds it changed logs that a restart applies it (once per change).
fn reload_pass(
    registry: ToolRegistry,
    agents_dir: PathBuf,
    reload_agents: Arc<dyn Fn() + Send + Sync>,
    workflows: Workflows,
) -> impl Fn() + Send + Sync + 'static {
    let mcp_file = agents_dir.join(crate::agents::MCP_FILE_NAME);
    let mcp_seen = std::sync::Mutex::new(std::fs::read(&mcp_file).ok());
    move || {
        registry.reload_dir(&agents_dir.join("tools"));
        reload_agents();
        workflows.reload();
        let now = std::fs::read(&mcp_file).ok();
        let mut seen = mcp_seen.lock().unwrap_or_else(|e| e.into_inner());
        if *seen != now {
            tracing::info!(file = %mcp_file.display(), "MCP server list changed: it is read at startup only; restart cadre to apply it");
            *seen = now;
        }
    }
}

/// One reload of the agent files: what changed is logged, and a file that
/// no longer loads is logged and published as a `load_error` event (as a
/// tool file's is), its last good version staying live.
fn reload_agent_files(
    files: &AgentFiles,
    agents: &Agents,
    resolve: &dyn Fn(AgentFile) -> Result<Agent, ConfigError>,
    events: &EventBus,
) {
    let report = files.reload(agents, resolve);
    for (path, e) in &report.errors {
        tracing::warn!(file = %path.display(), "agent file not loaded (its last good version, if any, stays live): {e}");
        events.publish(crate::events::EventKind::LoadError {
            file: path.display().to_string(),
            line: None,
            message: e.to_string(),
        });
    }
    for (agent, path) in &report.added {
        tracing::info!(%agent, file = %path.display(), "agent added");
        events.publish(crate::events::EventKind::AgentAdded {
            agent: agent.clone(),
            source: path.display().to_string(),
        });
    }
    for (agent, path) in &report.updated {
        tracing::info!(%agent, file = %path.display(), "agent updated: its sessions use it from their next turn");
        events.publish(crate::events::EventKind::AgentUpdated {
            agent: agent.clone(),
            source: path.display().to_string(),
        });
    }
    for agent in &report.removed {
        tracing::info!(%agent, "agent removed: no new sessions; its sessions' turns answer AGENT_NOT_FOUND");
        events.publish(crate::events::EventKind::AgentRemoved {
            agent: agent.clone(),
        });
    }
}

async fn serve(
    mut builder: RuntimeBuilder,
    arbiters: Vec<actix::dev::ArbiterHandle>,
    ready: std::sync::mpsc::Sender<Result<Ready, RuntimeError>>,
    stop: oneshot::Receiver<()>,
) {
    let cluster = match connect_cluster(&builder.config.cluster).await {
        Ok(cluster) => cluster,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    builder.cluster = cluster.clone();
    let Parts {
        store,
        sessions,
        registry,
        executor,
        workflows,
        providers,
        mcp,
        memory,
        reload_agents,
    } = match setup(&mut builder, &arbiters) {
        Ok(parts) => parts,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    // Held for as long as the server runs: dropping it stops the fan-out.
    let _fanout = match &cluster {
        Some(redis) => Some(
            crate::cluster::fanout::Fanout::start(
                redis,
                &executor.shared().events,
                &builder
                    .config
                    .cluster
                    .node_id
                    .clone()
                    .unwrap_or_else(node_id),
            )
            .await,
        ),
        None => None,
    };
    // Only a server takes up the workflow runs a stop cut; a CLI
    // command's runtime (no listener) leaves them for the next server.
    let take_up = builder.listen.is_some();
    if let Err(e) = workflows.recover(take_up).await {
        tracing::error!(error = %e, "cannot check for interrupted workflow runs");
    }
    if let Err(e) = executor.shared().confirmations.index_existing().await {
        tracing::error!(error = %e, "cannot index pending confirmations by tenant");
    }
    // Turns a crash cut: taken up (or closed past the resume window) by
    // their conversations, which start now and run beside the server.
    if let Err(e) = sessions.resume_cut_turns().await {
        tracing::error!(error = %e, "cannot look for turns cut by a restart");
    }
    let keys = match crate::tenants::KeyRing::load(&store).await {
        Ok(k) => k,
        Err(e) => {
            let _ = ready.send(Err(RuntimeError::Tool {
                name: "api_keys".into(),
                message: e.to_string(),
            }));
            return;
        }
    };
    if let Some(addr) = builder.listen
        && keys.is_open()
    {
        if !addr.ip().is_loopback() {
            let _ = ready.send(Err(RuntimeError::Open { addr }));
            return;
        }
        tracing::warn!(%addr, "no API keys configured: serving open on loopback as tenant 'default'; create keys with `cadre keys create --tenant ID` or POST /v1/keys (the first ends open mode)");
    }
    let limits = ApiRateLimit::new(&builder.config.api_limit)
        .and_then(|l| Ok((l, builder.config.api_limit.failed_auths()?)));
    let (api_limit, failed_auths) = match limits {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(RuntimeError::Tool {
                name: "api_limit".into(),
                message: e.to_string(),
            }));
            return;
        }
    };
    // The API limiter keeps one entry per caller seen, the store's gate
    // one per tenant: forget those whose bucket is whole again, so made-up
    // keys and addresses cannot grow them without bound.
    {
        let api_limit = api_limit.clone();
        let sessions = sessions.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(60));
            loop {
                tick.tick().await;
                api_limit.retain_recent();
                sessions.retain_recent_shares();
            }
        });
    }
    crate::http::idempotency::spawn_sweep(store.clone(), builder.config.idempotency_keep());
    if store.node_id().is_some() {
        let cluster = &builder.config.cluster;
        crate::cluster::node::spawn_duties(
            store.clone(),
            sessions.clone(),
            workflows.clone(),
            keys.clone(),
            Duration::from_secs_f64(cluster.heartbeat_s),
            Duration::from_secs_f64(cluster.owner_stale_s),
        );
    }
    watch::spawn_over(
        vec![
            builder.agents_dir.join("tools"),
            builder.agents_dir.clone(),
            workflows.dir().to_path_buf(),
        ],
        builder.config.reload_interval(),
        "tool, agent and workflow",
        reload_pass(
            registry.clone(),
            builder.agents_dir.clone(),
            reload_agents,
            workflows.clone(),
        ),
    );
    let connection_limits = builder.config.connection_limits();
    let connection_limits = match builder.listen {
        // Every connection is a file: the cap stays below the limit.
        Some(_) => {
            let open_files = raise_open_files_limit();
            let limits = connection_limits.within_open_files(open_files);
            tracing::info!(
                open_files = open_files
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "unlimited".into()),
                max_connections = limits.max_connections,
                max_connections_per_address = limits.max_per_address,
                "connection limits"
            );
            limits
        }
        None => connection_limits,
    };
    let listener = match builder.listen {
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => Some(l),
            Err(source) => {
                let _ = ready.send(Err(RuntimeError::Bind { addr, source }));
                return;
            }
        },
        None => None,
    };
    let addr = listener.as_ref().and_then(|l| l.local_addr().ok());
    // The lock of `server.lock` is held as long as `server_file` lives.
    let server_file = addr.and_then(|addr| {
        let file = ServerFile {
            url: ServerFile::local_url(addr),
            pid: std::process::id(),
        };
        match file.write(&builder.data_dir) {
            Ok(lock) => Some((ServerFile::path(&builder.data_dir), lock)),
            Err(e) => {
                tracing::warn!(error = %e, "could not record the server in the data dir");
                None
            }
        }
    });
    // One firing loop per serving node; a CLI command's runtime (no
    // listener) fires nothing.
    // Webhook events leave from the outbox on every serving node; the
    // tenant's own signing secret is read from its config.
    let tenant_secrets: crate::webhooks::TenantSecrets = {
        let store = store.clone();
        Arc::new(move |tenant: String| {
            let store = store.clone();
            Box::pin(async move {
                crate::tenants::config::TenantConfig::load(&store, &tenant)
                    .await
                    .ok()
                    .and_then(|c| c.webhook_secret)
            })
        })
    };
    let webhooks = match crate::webhooks::Webhooks::new(
        store.clone(),
        builder.config.webhooks.clone(),
        tenant_secrets,
    ) {
        Ok(w) => w,
        Err(e) => {
            let _ = ready.send(Err(RuntimeError::Webhooks(e)));
            return;
        }
    };
    let schedules = crate::schedules::Schedules::new(
        store.clone(),
        sessions.clone(),
        workflows.clone(),
        keys.clone(),
        webhooks.clone(),
    );
    let stop_schedules = tokio_util::sync::CancellationToken::new();
    if take_up {
        schedules.spawn_loop(stop_schedules.clone());
        webhooks.spawn_loop(stop_schedules.clone());
        memory.spawn_sweep(stop_schedules.clone());
    }
    let _ = ready.send(Ok(Ready {
        addr,
        sessions: sessions.clone(),
        registry: registry.clone(),
        executor: executor.clone(),
        workflows: workflows.clone(),
        providers,
    }));
    let shutdown = shutdown_signal(stop, builder.handle_signals);
    match listener {
        Some(listener) => {
            let events = registry.events().clone();
            let mcp_shutdown = tokio_util::sync::CancellationToken::new();
            let streams = api_limit.streams().clone();
            let forward = store.node_id().map(|node| {
                Arc::new(crate::cluster::forward::Forward::new(
                    sessions.clone(),
                    store.clone(),
                    node.to_string(),
                    crate::http::MAX_BODY_BYTES,
                )) as Arc<dyn crate::http::owner::ToOwner>
            });
            let app = router(
                AppState::new(AppShared {
                    sessions,
                    registry,
                    store: store.clone(),
                    executor,
                    events,
                    workflows: workflows.clone(),
                    keys,
                    mcp_shutdown: mcp_shutdown.clone(),
                    turn_logs: crate::http::turn_log::TurnLogs::new(),
                    forward,
                    dependencies: builder
                        .cluster
                        .iter()
                        .map(|redis| Arc::new(redis.clone()) as Arc<dyn crate::http::Dependency>)
                        .collect(),
                    schedules,
                    webhooks,
                    memory,
                }),
                api_limit,
                failed_auths,
                builder.config.server.request_log,
            );
            let stopping = tokio_util::sync::CancellationToken::new();
            let connections =
                Connections::new(connection_limits).trusting(builder.config.trusted_proxies());
            let open = connections.clone();
            let grace = builder.config.shutdown_grace();
            let signals = builder.handle_signals;
            // The listener for a second interrupt is made once the first
            // was taken and before the line that invites it: one made later
            // missed an interrupt sent right after that line.
            let (armed, second) = tokio::sync::oneshot::channel();
            let server = crate::http::connections::serve(listener, app, connections, {
                let stopping = stopping.clone();
                let stop_schedules = stop_schedules.clone();
                async move {
                    shutdown.await;
                    // No fire starts once the shutdown has begun.
                    stop_schedules.cancel();
                    if signals
                        && let Ok(listener) = tokio::signal::unix::signal(
                            tokio::signal::unix::SignalKind::interrupt(),
                        )
                    {
                        let _ = armed.send(listener);
                    }
                    // Open MCP sessions hold SSE streams: end them, or the
                    // graceful shutdown would wait out its grace period.
                    mcp_shutdown.cancel();
                    streams.close_subscriptions();
                    let waiting = open.open();
                    if waiting > 0 {
                        tracing::info!(
                            open_connections = waiting,
                            grace_s = grace.as_secs_f64(),
                            "waiting up to the grace for {waiting} open connection(s) (requests and turns in progress) to finish{}",
                            if signals {
                                "; interrupt again to exit now"
                            } else {
                                ""
                            }
                        );
                    }
                    stopping.cancel();
                }
            });
            let bounded = {
                let stopping = stopping.clone();
                async move {
                    stopping.cancelled().await;
                    tokio::time::sleep(grace).await;
                }
            };
            let again = async move {
                match second.await {
                    Ok(mut listener) => {
                        listener.recv().await;
                    }
                    Err(_) => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                _ = server => {}
                _ = bounded => tracing::warn!("shutdown grace period over; closing open requests"),
                _ = again => {
                    // Nothing in flight may store its answer now: it was never
                    // acknowledged. redb's commits are atomic, so the file is
                    // consistent whenever the process ends.
                    store.close_writes();
                    if let Some((path, _)) = &server_file {
                        let _ = std::fs::remove_file(path);
                    }
                    tracing::warn!("second interrupt: exiting now; turns in progress are not acknowledged");
                    std::process::exit(130);
                }
            }
        }
        None => {
            drop((
                sessions,
                registry,
                executor,
                api_limit,
                failed_auths,
                keys,
                schedules,
                webhooks,
                memory,
            ));
            shutdown.await;
        }
    }
    stop_schedules.cancel();
    // Whatever is still running was not acknowledged: it may not write now.
    store.close_writes();
    // Runs cut off from here on stay `running` and are found interrupted
    // at the next start.
    workflows.shutdown();
    drop(workflows);
    drop(mcp);
    if let Err(e) = store.flush().await {
        tracing::error!(error = %e, "final flush failed");
    }
    if let Some((path, _)) = &server_file {
        let _ = std::fs::remove_file(path);
    }
}

/// Why an agent talks to the model it does, for the startup log: a
/// newcomer with `OPENAI_API_KEY` in the shell learns that the quick start
/// is calling a paid API, and which variable made it so.
fn endpoint_chosen_by(
    file: &crate::agents::AgentFile,
    shared_model: bool,
    from_env: bool,
) -> String {
    let var = |k: &str| std::env::var(k).ok().is_some_and(|v| !v.trim().is_empty());
    let over = file.model.as_ref();
    if over.is_some_and(|m| m.base_url.is_some() || m.api_key_env.is_some()) {
        return "the agent file's [model] section".into();
    }
    if shared_model {
        return "the embedding program (RuntimeBuilder::model)".into();
    }
    if !from_env {
        return "the embedding program (RuntimeBuilder::endpoint)".into();
    }
    if var("CADRE_MODEL_BASE_URL") {
        "CADRE_MODEL_BASE_URL".into()
    } else if var("CADRE_MODEL_API_KEY") {
        "CADRE_MODEL_API_KEY (the OpenAI API)".into()
    } else if var("OPENAI_API_KEY") {
        "OPENAI_API_KEY in the environment: calls go to the paid OpenAI API; unset it for the offline model".into()
    } else {
        "no CADRE_MODEL_BASE_URL, CADRE_MODEL_API_KEY or OPENAI_API_KEY: the built-in offline model"
            .into()
    }
}

/// Where a running server listens, recorded in its data dir
/// (`server.json`) so that commands needing the data dir can use it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ServerFile {
    pub url: String,
    pub pid: u32,
}

impl ServerFile {
    pub fn path(data_dir: &std::path::Path) -> PathBuf {
        data_dir.join("server.json")
    }

    /// `server.lock` beside it: a running server holds an exclusive
    /// `flock` on it for as long as it serves, and the kernel lets go when
    /// the process ends however it ends. So a `server.json` left by a
    /// killed server is told from a live one by the lock, not by its pid,
    /// which the system may have given to another process since.
    fn lock_path(data_dir: &std::path::Path) -> PathBuf {
        data_dir.join("server.lock")
    }

    /// Records this server; the returned file holds the lock (keep it for
    /// as long as the server serves).
    fn write(&self, data_dir: &std::path::Path) -> std::io::Result<std::fs::File> {
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(Self::lock_path(data_dir))?;
        lock.try_lock().map_err(|e| match e {
            std::fs::TryLockError::WouldBlock => {
                std::io::Error::other("another server holds this data dir's server.lock")
            }
            std::fs::TryLockError::Error(e) => e,
        })?;
        let path = Self::path(data_dir);
        let tmp = path.with_extension("json.tmp");
        std::fs::write(
            &tmp,
            serde_json::to_vec(self).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(tmp, path)?;
        Ok(lock)
    }

    /// Whether a live server holds `data_dir`'s `server.lock`.
    fn is_held(data_dir: &std::path::Path) -> bool {
        let Ok(lock) = std::fs::File::open(Self::lock_path(data_dir)) else {
            return false;
        };
        matches!(
            lock.try_lock_shared(),
            Err(std::fs::TryLockError::WouldBlock)
        )
    }

    /// The server recorded in `data_dir`, if it is alive: its process
    /// holds the data dir's `server.lock` (a file left by a killed server is
    /// ignored, even when its pid now names another process).
    ///
    /// Only a loopback URL is believed: the CLI sends `CADRE_API_KEY` to it,
    /// and a file naming another host is not one this server wrote.
    pub fn read_live(data_dir: &std::path::Path) -> Option<ServerFile> {
        let text = std::fs::read(Self::path(data_dir)).ok()?;
        let file: ServerFile = serde_json::from_slice(&text).ok()?;
        (file.is_loopback() && file.is_alive() && Self::is_held(data_dir)).then_some(file)
    }

    /// The URL this machine reaches a listener at: its own address, or
    /// loopback when it listens on every address (`0.0.0.0`, `[::]`).
    pub fn local_url(addr: SocketAddr) -> String {
        let ip = match addr.ip() {
            std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
                std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
            }
            std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
                std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)
            }
            ip => ip,
        };
        format!("http://{}", SocketAddr::new(ip, addr.port()))
    }

    fn is_loopback(&self) -> bool {
        url::Url::parse(&self.url).is_ok_and(|u| {
            u.scheme() == "http"
                && match u.host() {
                    Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                    Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                    Some(url::Host::Domain(d)) => d == "localhost",
                    None => false,
                }
        })
    }

    #[cfg(unix)]
    fn is_alive(&self) -> bool {
        let Ok(pid) = libc::pid_t::try_from(self.pid) else {
            return false;
        };
        // Signal 0 checks the process exists without touching it.
        // SAFETY: kill(2) with signal 0 sends nothing.
        pid > 0 && unsafe { libc::kill(pid, 0) } == 0
    }

    #[cfg(not(unix))]
    fn is_alive(&self) -> bool {
        true
    }
}

async fn shutdown_signal(stop: oneshot::Receiver<()>, signals: bool) {
    if !signals {
        let _ = stop.await;
        return;
    }
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = stop => {}
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupt received; shutting down"),
        _ = term => tracing::info!("SIGTERM received; shutting down"),
    }
}

#[cfg(test)]
mod server_file_tests {
    use super::*;

    #[test]
    fn the_recorded_url_is_loopback_and_only_loopback_is_believed() {
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert_eq!(ServerFile::local_url(any), "http://127.0.0.1:8080");
        let any6: SocketAddr = "[::]:8080".parse().unwrap();
        assert_eq!(ServerFile::local_url(any6), "http://[::1]:8080");
        let own: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(ServerFile::local_url(own), "http://127.0.0.1:9");

        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        for (url, believed) in [
            ("http://127.0.0.1:8080", true),
            ("http://localhost:8080", true),
            ("http://[::1]:8080", true),
            ("http://evil.example:8080", false),
            ("http://10.0.0.5:8080", false),
            ("https://127.0.0.1:8080", false),
        ] {
            let file = ServerFile {
                url: url.into(),
                pid: me,
            };
            let held = file.write(dir.path()).unwrap();
            assert_eq!(
                ServerFile::read_live(dir.path()).is_some(),
                believed,
                "{url}"
            );
            drop(held);
        }
    }

    #[test]
    fn a_file_whose_server_let_go_of_the_lock_is_stale_whatever_its_pid() {
        let dir = tempfile::tempdir().unwrap();
        // A pid that is alive (this process), as a reused one would be.
        let file = ServerFile {
            url: "http://127.0.0.1:8080".into(),
            pid: std::process::id(),
        };
        let held = file.write(dir.path()).unwrap();
        assert!(ServerFile::read_live(dir.path()).is_some());
        // A second server cannot take the lock while the first holds it.
        assert!(file.write(dir.path()).is_err());
        // The server is gone (killed: the kernel released its lock), its
        // file stays behind.
        drop(held);
        assert!(ServerFile::path(dir.path()).exists());
        assert_eq!(ServerFile::read_live(dir.path()), None);
    }
}
