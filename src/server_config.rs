//! Server configuration: `cadre serve --config PATH` (or `CADRE_CONFIG`),
//! TOML, every key overridable from the environment.
//!
//! file (TOML) ──▶ table ──CADRE_<SECTION>_<KEY> overrides──▶ [`ServerConfig`] (deny unknown keys) ──validate──▶ runtime
//!
//! Sections: `[concurrency]` (the executor's pool and each tenant's share
//! of it, `max_per_tenant`), `[api_limit]` (HTTP
//! requests and open event streams per API key, failed authentications per
//! address), `[executor]`, `[tools]`,
//! `[sessions]`, `[server]` (shutdown grace, connection timeouts and caps),
//! `[model]` (what one model reply may hold, a turn's model time; the
//! endpoint itself comes from `CADRE_MODEL_BASE_URL` / `CADRE_MODEL_API_KEY`
//! / `CADRE_MODEL`, which are not overrides of this section),
//! `[workflows]` (map elements, run depth), `[store]` (the redb page
//! cache), `[tenants]` (each tenant's share of the store: message bytes
//! per second, stored bytes), `[cluster]` (cluster mode:
//! `redis`, `redis_failure`, `permit_lease_s`). An override's value is
//! read as a TOML value when it parses as one (`10`, `true`, `["a"]`,
//! `{http = 5}`) and as a string otherwise, so
//! `CADRE_CONCURRENCY_MAX_CONCURRENT=1` and
//! `CADRE_CONCURRENCY_BUCKET_LIMITS='{http = 5}'` both work. A file or
//! override with an unknown key or a bad value is refused with the key named.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::conversation::SessionLimits;
use crate::executor::ExecutorConfig;
use crate::executor::concurrency::ConcurrencyConfig;
use crate::http::client_addr::TrustedProxies;
use crate::http::connections::ConnectionLimits;
use crate::http::rate_limit::ApiLimitConfig;
use crate::workflow::WorkflowLimits;

/// The sections an environment override may address.
const SECTIONS: [&str; 14] = [
    "memory",
    "webhooks",
    "agents",
    "tenants",
    "workflows",
    "store",
    "cluster",
    "concurrency",
    "api_limit",
    "executor",
    "tools",
    "sessions",
    "server",
    "model",
];

/// `CADRE_MODEL_*` variables that name the endpoint (read by
/// [`crate::model::ModelEndpoint::from_env`]), not `[model]` keys.
const ENDPOINT_VARS: [&str; 2] = ["CADRE_MODEL_BASE_URL", "CADRE_MODEL_API_KEY"];

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub concurrency: ConcurrencyConfig,
    pub api_limit: ApiLimitConfig,
    pub executor: ExecutorSection,
    pub tools: ToolsSection,
    pub sessions: SessionsSection,
    pub server: ServerSection,
    pub model: ModelSection,
    pub workflows: WorkflowLimits,
    pub store: StoreSection,
    pub tenants: TenantsSection,
    pub cluster: ClusterSection,
    pub agents: AgentsSection,
    /// `[webhooks]`: the signing secret and where events may go
    /// ([`crate::webhooks`]).
    pub webhooks: crate::webhooks::WebhookConfig,
    /// `[memory]`: each tenant's memory quota and the TTL sweep
    /// ([`crate::memory`]).
    pub memory: crate::memory::MemoryConfig,
    /// The file this was read from, if any: hidden from sandboxed tools.
    #[serde(skip)]
    pub file: Option<std::path::PathBuf>,
}

/// How agents work together (`[agents]`; [`crate::conversation::delegation`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentsSection {
    /// How deep a chain of agents asking agents may go: a top-level
    /// session's child is 1 deep; asking from a session this deep is
    /// refused with a tool error the model reads.
    pub max_delegation_depth: u32,
}

impl Default for AgentsSection {
    fn default() -> Self {
        AgentsSection {
            max_delegation_depth: crate::conversation::lineage::DEFAULT_MAX_DELEGATION_DEPTH,
        }
    }
}

/// Each tenant's share of the store (`[tenants]`;
/// [`crate::conversation::storage`] has the rules).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenantsSection {
    /// KiB of message content a tenant may send per second, per node
    /// (a burst of four seconds' worth); over it: 429 `RATE_LIMITED`. 0: no limit.
    pub write_kib_per_s: u32,
    /// MiB of stored messages a tenant may keep (a tenant config's
    /// `max_storage_mb` overrides it); at it: 413 `STORAGE_QUOTA_EXCEEDED`. 0: no limit.
    pub max_storage_mb: u64,
}

impl Default for TenantsSection {
    fn default() -> Self {
        TenantsSection {
            write_kib_per_s: crate::conversation::storage::DEFAULT_WRITE_KIB_PER_S,
            max_storage_mb: crate::conversation::storage::DEFAULT_MAX_STORAGE_MB,
        }
    }
}

/// The embedded store (`[store]`; the redb file of a single node).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSection {
    /// MiB of redb's page cache (reads and the write buffer). redb's own
    /// default is 1 GiB, which a store of 100,000 sessions fills with pages
    /// no turn reads again (4.4 KB of RSS per session); pages it no longer
    /// holds come from the kernel's page cache.
    pub cache_mb: u64,
}

impl Default for StoreSection {
    fn default() -> Self {
        StoreSection {
            cache_mb: crate::store::DEFAULT_CACHE_MB,
        }
    }
}

/// Cluster mode (`[cluster]`; `cadre serve --store postgres://… --redis
/// redis://… --node-id … --advertise …`): several nodes on one PostgreSQL
/// and one Redis. Unset `store` and `redis` keep the default, one node on
/// its redb file with every limit in process.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSection {
    /// `postgres://user:pass@host:port/db`: the shared store.
    pub store: Option<String>,
    /// This node's id, unique in the cluster (required with `store`).
    pub node_id: Option<String>,
    /// `http://host:port` where the other nodes reach this one (default:
    /// `http://` + the listen address, refused when that is unspecified).
    pub advertise: Option<String>,
    /// Seconds between this node's heartbeats.
    pub heartbeat_s: f64,
    /// Seconds without a heartbeat after which a node is dead to the others
    /// and its sessions may be taken over (a failover takes at most this
    /// plus one request).
    pub owner_stale_s: f64,
    /// `redis://[user:password@]host:port[/db]`; unset: single node, every
    /// limit in process.
    pub redis: Option<String>,
    /// What limits do while Redis is unreachable: `closed` (refuse,
    /// retryable) or `local` (this node's own caps).
    pub redis_failure: crate::cluster::FailurePolicy,
    /// How long a node's concurrency permit lasts without renewal: a dead
    /// node's permits come back after it.
    pub permit_lease_s: f64,
}

impl ClusterSection {
    fn validate(&self) -> Result<(), String> {
        let beat = self.heartbeat_s;
        if beat.is_nan() || !(0.05..=60.0).contains(&beat) {
            return Err("cluster.heartbeat_s must be between 0.05 and 60".into());
        }
        let stale = self.owner_stale_s;
        if stale.is_nan() || stale < 2.0 * beat || stale > 3600.0 {
            return Err(
                "cluster.owner_stale_s must be at least twice cluster.heartbeat_s (and at most 3600)"
                    .into(),
            );
        }
        if let Some(url) = &self.store {
            if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                return Err(
                    "cluster.store (--store) must be a postgres:// URL; leave it unset for the embedded redb store"
                        .into(),
                );
            }
            match &self.node_id {
                None => {
                    return Err(
                        "cluster.node_id (--node-id) is required with cluster.store: each node of a cluster needs its own id"
                            .into(),
                    );
                }
                Some(id)
                    if id.is_empty()
                        || id.len() > 64
                        || !id
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) =>
                {
                    return Err("cluster.node_id must be 1 to 64 of A-Z a-z 0-9 - _ .".into());
                }
                Some(_) => {}
            }
        }
        if let Some(a) = &self.advertise
            && url::Url::parse(a).map_or(true, |u| !matches!(u.scheme(), "http" | "https"))
        {
            return Err(
                "cluster.advertise (--advertise) must be an http:// or https:// URL".into(),
            );
        }
        Ok(())
    }
}

impl Default for ClusterSection {
    fn default() -> Self {
        ClusterSection {
            store: None,
            node_id: None,
            advertise: None,
            heartbeat_s: 1.0,
            owner_stale_s: 5.0,
            redis: None,
            redis_failure: crate::cluster::FailurePolicy::default(),
            permit_lease_s: crate::cluster::permits::DEFAULT_LEASE.as_secs_f64(),
        }
    }
}

impl ClusterSection {
    pub fn permit_lease(&self) -> Duration {
        Duration::try_from_secs_f64(self.permit_lease_s)
            .unwrap_or(crate::cluster::permits::DEFAULT_LEASE)
    }
}

/// What cadre accepts from a model endpoint (see `model::openai`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// Bytes read per model reply, streamed or not; a longer reply is
    /// refused (`MODEL_BAD_RESPONSE`) and nothing of it is stored.
    pub max_reply_bytes: usize,
    /// Tool calls kept per reply; the others are neither run nor stored.
    pub max_tool_calls: usize,
    /// Seconds of model time one turn may use, every attempt, backoff and
    /// tool round's model call included; past it the turn is `MODEL_TIMEOUT`.
    pub turn_timeout_s: f64,
    /// How a turn's answer schema (an agent's `output_schema`, a message's
    /// `response_format`) is asked for: `native` sends `response_format`
    /// (OpenAI, vLLM, llama.cpp); `prompt` writes the schema into the
    /// prompt instead. cadre validates the answer either way.
    pub structured_output: crate::model::StructuredOutput,
}

impl Default for ModelSection {
    fn default() -> Self {
        ModelSection {
            max_reply_bytes: crate::model::openai::DEFAULT_MAX_REPLY_BYTES,
            max_tool_calls: crate::conversation::machine::DEFAULT_MAX_TOOL_CALLS,
            turn_timeout_s: SessionLimits::default().model_turn_timeout.as_secs_f64(),
            structured_output: crate::model::StructuredOutput::Native,
        }
    }
}

impl ModelSection {
    /// `base` (timeouts and retries) with this section's caps.
    pub fn client_options(
        &self,
        base: &crate::model::openai::ClientOptions,
    ) -> crate::model::openai::ClientOptions {
        crate::model::openai::ClientOptions {
            max_reply_bytes: self.max_reply_bytes,
            structured_output: self.structured_output,
            ..base.clone()
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// Seconds running requests get to finish after SIGTERM / SIGINT; what
    /// is still running then is cut off, unacknowledged.
    pub shutdown_grace_s: f64,
    /// Seconds a new connection has to send a complete request head.
    pub header_read_timeout_s: f64,
    /// Seconds a kept-alive connection may wait for its next request (at
    /// most `header_read_timeout_s`: hyper's head timer runs then too).
    pub idle_timeout_s: f64,
    /// Open connections in total; kept below the open-files limit.
    pub max_connections: usize,
    /// Open connections of one client address (IPv6: per /64).
    pub max_connections_per_address: usize,
    /// One INFO line per request (method, route template, status, latency,
    /// tenant; never a key): `crate::http::access_log`.
    pub request_log: bool,
    /// Hours an `Idempotency-Key`'s stored answer is kept (at least 24):
    /// `crate::http::idempotency`.
    pub idempotency_keep_h: u64,
    /// Reverse proxies (addresses or CIDR blocks) whose `X-Forwarded-For`
    /// names the client for per-address limits: `crate::http::client_addr`.
    pub trusted_proxies: Vec<String>,
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            shutdown_grace_s: 30.0,
            header_read_timeout_s: 10.0,
            idle_timeout_s: 5.0,
            max_connections: 4096,
            max_connections_per_address: 256,
            request_log: true,
            idempotency_keep_h: crate::http::idempotency::MIN_KEEP_H,
            trusted_proxies: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsSection {
    /// Seconds without a message after which a conversation leaves memory
    /// (it is reloaded from the store on its next message).
    pub idle_timeout_s: f64,
    /// Turns a session holds waiting behind its running one under
    /// `multitask = "enqueue"`; one more is answered 429
    /// `CONVERSATION_QUEUE_FULL`. 0: only the running turn.
    pub max_queued_turns: usize,
    /// Days a session may stay idle (no message) before the retention
    /// sweep deletes it, with its messages, calls and confirmations;
    /// fractions allowed. 0 (the default): sessions are kept forever.
    pub retain_days: f64,
    /// Seconds after which a turn cut by a crash is no longer resumed at
    /// start: it is closed as `interrupted` instead (also workflow runs).
    pub resume_window_s: f64,
}

impl Default for SessionsSection {
    fn default() -> Self {
        let limits = SessionLimits::default();
        SessionsSection {
            idle_timeout_s: limits.idle_timeout.as_secs_f64(),
            max_queued_turns: limits.max_queued_turns,
            retain_days: 0.0,
            resume_window_s: limits.resume_window.as_secs_f64(),
        }
    }
}

impl SessionsSection {
    /// What [`crate::conversation::Sessions`] runs with, but the model
    /// turn budget (see [`ServerConfig::session_limits`]).
    pub fn limits(&self) -> SessionLimits {
        SessionLimits {
            idle_timeout: Duration::from_secs_f64(self.idle_timeout_s),
            max_queued_turns: self.max_queued_turns,
            retain: (self.retain_days > 0.0)
                .then(|| Duration::from_secs_f64(self.retain_days * 86_400.0)),
            resume_window: Duration::from_secs_f64(self.resume_window_s),
            ..SessionLimits::default()
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExecutorSection {
    /// Per-call timeout when neither the call nor the tool sets one.
    pub default_timeout_s: f64,
    /// First retry delay of a retryable tool failure.
    pub retry_base_delay_ms: u64,
    /// How long a pending confirmation can be approved.
    pub confirmation_ttl_s: u64,
}

impl Default for ExecutorSection {
    fn default() -> Self {
        ExecutorSection {
            default_timeout_s: 30.0,
            retry_base_delay_ms: 100,
            confirmation_ttl_s: 600,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolsSection {
    /// Refuse parameters a tool does not declare.
    pub strict_validation: bool,
    /// Seconds between rescans of the tool folder (the watcher's fallback).
    pub reload_interval_s: f64,
    /// Hosts `http_request` / `fetch_page` and tool files' HTTP entries may
    /// reach on private addresses.
    pub http_allowlist: Vec<String>,
    /// Largest tool file loaded; a bigger one is refused, named in the log.
    pub max_file_bytes: u64,
    /// `"on"`: command tools and stdio MCP servers run sandboxed (refused
    /// when the kernel cannot); `"off"`: unsandboxed, a WARN at startup
    /// ([`crate::tools::sandbox`]).
    pub sandbox: crate::tools::sandbox::Mode,
    /// What each sandboxed process may use (0: no limit); a tool file's or
    /// server's `sandbox_limits` overrides keys of it.
    pub sandbox_limits: crate::tools::sandbox::Limits,
}

impl Default for ToolsSection {
    fn default() -> Self {
        ToolsSection {
            strict_validation: false,
            reload_interval_s: 5.0,
            http_allowlist: Vec::new(),
            max_file_bytes: crate::tools::loader::DEFAULT_MAX_FILE_BYTES,
            sandbox: Default::default(),
            sandbox_limits: Default::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerConfigError {
    #[error("cannot read the config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}: {message}")]
    Invalid { origin: String, message: String },
}

impl ServerConfig {
    /// Reads the file (if any), applies `CADRE_*` overrides from `env`, checks.
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<ServerConfig, ServerConfigError> {
        let (mut table, origin) = match path {
            Some(p) => {
                let text =
                    std::fs::read_to_string(p).map_err(|source| ServerConfigError::Read {
                        path: p.display().to_string(),
                        source,
                    })?;
                let table: toml::Table =
                    toml::from_str(&text).map_err(|e| ServerConfigError::Invalid {
                        origin: p.display().to_string(),
                        message: e.to_string(),
                    })?;
                (table, p.display().to_string())
            }
            None => (toml::Table::new(), "configuration".to_string()),
        };
        let mut overridden = Vec::new();
        for (var, raw) in env {
            let Some(rest) = var.strip_prefix("CADRE_") else {
                continue;
            };
            if ENDPOINT_VARS.contains(&var.as_str()) {
                continue;
            }
            let rest = rest.to_ascii_lowercase();
            let Some(section) = SECTIONS.iter().find(|s| {
                rest.strip_prefix(*s)
                    .is_some_and(|r| r.starts_with('_') && r.len() > 1)
            }) else {
                continue;
            };
            let key = rest[section.len() + 1..].to_string();
            let value = parse_value(&raw);
            let entry = table
                .entry(section.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            let toml::Value::Table(t) = entry else {
                return Err(ServerConfigError::Invalid {
                    origin: origin.clone(),
                    message: format!("[{section}] must be a table"),
                });
            };
            t.insert(key, value);
            overridden.push(var);
        }
        let origin = if overridden.is_empty() {
            origin
        } else {
            format!("{origin} with {}", overridden.join(", "))
        };
        let mut config: ServerConfig =
            toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| ServerConfigError::Invalid {
                    origin: origin.clone(),
                    message: e.to_string(),
                })?;
        config
            .validate()
            .map_err(|message| ServerConfigError::Invalid { origin, message })?;
        config.file = path.map(Path::to_path_buf);
        Ok(config)
    }

    /// Checks the config again after a caller changed it (`serve`'s
    /// cluster flags), as [`Self::load`] does.
    pub fn check(&self) -> Result<(), ServerConfigError> {
        self.validate()
            .map_err(|message| ServerConfigError::Invalid {
                origin: "command line".into(),
                message,
            })
    }

    fn validate(&self) -> Result<(), String> {
        if !(1..=1_048_576).contains(&self.store.cache_mb) {
            return Err("store.cache_mb must be between 1 and 1048576".into());
        }
        let lease = self.cluster.permit_lease_s;
        if lease.is_nan() || !(1.0..=3_600.0).contains(&lease) {
            return Err("cluster.permit_lease_s must be between 1 and 3600".into());
        }
        self.concurrency
            .validate()
            .map_err(|e| format!("concurrency: {e}"))?;
        if self.executor.default_timeout_s.is_nan() || self.executor.default_timeout_s <= 0.0 {
            return Err("executor.default_timeout_s must be greater than 0".into());
        }
        if self.sessions.idle_timeout_s.is_nan() || self.sessions.idle_timeout_s < 0.01 {
            return Err("sessions.idle_timeout_s must be at least 0.01".into());
        }
        let retain = self.sessions.retain_days;
        if retain.is_nan() || !(0.0..=36_500.0).contains(&retain) {
            return Err("sessions.retain_days must be between 0 (keep forever) and 36500".into());
        }
        let window = self.sessions.resume_window_s;
        if window.is_nan() || !(0.0..=604_800.0).contains(&window) {
            return Err(
                "sessions.resume_window_s must be between 0 (never resume) and 604800".into(),
            );
        }
        if self.tools.reload_interval_s.is_nan() || self.tools.reload_interval_s < 0.1 {
            return Err("tools.reload_interval_s must be at least 0.1".into());
        }
        if self.api_limit.per_second == 0 || self.api_limit.burst == 0 {
            return Err("api_limit.per_second and api_limit.burst must be at least 1".into());
        }
        self.cluster.validate()?;
        self.webhooks
            .check()
            .map_err(|e| format!("webhooks: {e}"))?;
        self.memory.check().map_err(|e| format!("memory.{e}"))?;
        let grace = self.server.shutdown_grace_s;
        if grace.is_nan() || !(0.0..=3600.0).contains(&grace) {
            return Err("server.shutdown_grace_s must be between 0 and 3600".into());
        }
        let server = &self.server;
        for (name, value) in [
            ("header_read_timeout_s", server.header_read_timeout_s),
            ("idle_timeout_s", server.idle_timeout_s),
        ] {
            if value.is_nan() || !(0.01..=3600.0).contains(&value) {
                return Err(format!("server.{name} must be between 0.01 and 3600"));
            }
        }
        if server.idle_timeout_s > server.header_read_timeout_s {
            return Err("server.idle_timeout_s may not exceed server.header_read_timeout_s".into());
        }
        if server.max_connections == 0 || server.max_connections_per_address == 0 {
            return Err(
                "server.max_connections and server.max_connections_per_address must be at least 1"
                    .into(),
            );
        }
        TrustedProxies::parse(&server.trusted_proxies)?;
        let keep = server.idempotency_keep_h;
        if !(crate::http::idempotency::MIN_KEEP_H..=87_600).contains(&keep) {
            return Err("server.idempotency_keep_h must be between 24 and 87600".into());
        }
        let turn = self.model.turn_timeout_s;
        if turn.is_nan() || !(0.01..=86_400.0).contains(&turn) {
            return Err("model.turn_timeout_s must be between 0.01 and 86400".into());
        }
        if self.model.max_reply_bytes < 1024 || self.model.max_tool_calls == 0 {
            return Err(
                "model.max_reply_bytes must be at least 1024 and model.max_tool_calls at least 1"
                    .into(),
            );
        }
        if self.api_limit.max_streams == 0 {
            return Err("api_limit.max_streams must be at least 1".into());
        }
        if self.api_limit.failed_auth_burst == 0 || self.api_limit.failed_auth_per_minute == 0 {
            return Err(
                "api_limit.failed_auth_burst and failed_auth_per_minute must be at least 1".into(),
            );
        }
        Ok(())
    }

    pub fn executor_config(&self) -> ExecutorConfig {
        ExecutorConfig {
            default_timeout: Duration::from_secs_f64(self.executor.default_timeout_s),
            retry_base_delay: Duration::from_millis(self.executor.retry_base_delay_ms),
            confirmation_ttl: Duration::from_secs(self.executor.confirmation_ttl_s),
        }
    }

    /// `[sessions]` with `[model] turn_timeout_s` and `[tenants]`.
    pub fn session_limits(&self) -> SessionLimits {
        SessionLimits {
            model_turn_timeout: Duration::from_secs_f64(self.model.turn_timeout_s),
            max_tool_calls: self.model.max_tool_calls,
            max_delegation_depth: self.agents.max_delegation_depth,
            storage: crate::conversation::storage::StorageLimits {
                write_kib_per_s: std::num::NonZeroU32::new(self.tenants.write_kib_per_s),
                max_storage_mb: (self.tenants.max_storage_mb > 0)
                    .then_some(self.tenants.max_storage_mb),
            },
            ..self.sessions.limits()
        }
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs_f64(self.server.shutdown_grace_s)
    }

    /// The connection limits of `[server]`, before the open-files limit
    /// narrows the total ([`ConnectionLimits::within_open_files`]).
    pub fn connection_limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs_f64(self.server.header_read_timeout_s),
            idle_timeout: Duration::from_secs_f64(self.server.idle_timeout_s),
            max_connections: self.server.max_connections,
            max_per_address: self.server.max_connections_per_address,
        }
    }

    /// `[server] trusted_proxies`, parsed (checked at load).
    pub fn trusted_proxies(&self) -> TrustedProxies {
        TrustedProxies::parse(&self.server.trusted_proxies).unwrap_or_default()
    }

    /// How long `Idempotency-Key` answers are kept.
    pub fn idempotency_keep(&self) -> Duration {
        Duration::from_secs(self.server.idempotency_keep_h * 3600)
    }

    pub fn reload_interval(&self) -> Duration {
        Duration::from_secs_f64(self.tools.reload_interval_s)
    }
}

fn parse_value(raw: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_file_sets_values_and_the_environment_overrides_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cadre.toml");
        std::fs::write(
            &path,
            "[concurrency]\nmax_concurrent = 4\nstrategy = \"priority\"\n[tools]\nstrict_validation = true\n",
        )
        .unwrap();
        let c = ServerConfig::load(
            Some(&path),
            env(&[
                ("CADRE_CONCURRENCY_MAX_CONCURRENT", "1"),
                ("CADRE_CONCURRENCY_BUCKET_LIMITS", "{http = 5}"),
                ("CADRE_API_LIMIT_MAX_STREAMS", "4"),
                ("CADRE_MODEL_BASE_URL", "http://ignored"),
            ]),
        )
        .unwrap();
        assert_eq!(c.api_limit.max_streams, 4);
        assert_eq!(c.concurrency.max_concurrent, 1);
        assert_eq!(c.concurrency.bucket_limits["http"], 5);
        assert!(c.tools.strict_validation);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused_with_the_key_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cadre.toml");
        std::fs::write(&path, "[concurrency]\nmax_concurent = 4\n").unwrap();
        let err = ServerConfig::load(Some(&path), env(&[])).unwrap_err();
        assert!(err.to_string().contains("max_concurent"), "{err}");

        let err =
            ServerConfig::load(None, env(&[("CADRE_CONCURRENCY_STRATEGY", "random")])).unwrap_err();
        assert!(
            err.to_string().contains("CADRE_CONCURRENCY_STRATEGY"),
            "{err}"
        );
        assert!(err.to_string().contains("random"), "{err}");

        let err = ServerConfig::load(None, env(&[("CADRE_TOOLS_COLOUR", "blue")])).unwrap_err();
        assert!(err.to_string().contains("colour"), "{err}");

        let err = ServerConfig::load(None, env(&[("CADRE_CONCURRENCY_MAX_CONCURRENT", "0")]))
            .unwrap_err();
        assert!(err.to_string().contains("max_concurrent"), "{err}");

        let err =
            ServerConfig::load(None, env(&[("CADRE_API_LIMIT_MAX_STREAMS", "0")])).unwrap_err();
        assert!(err.to_string().contains("max_streams"), "{err}");

        let err =
            ServerConfig::load(None, env(&[("CADRE_MODEL_TURN_TIMEOUT_S", "0")])).unwrap_err();
        assert!(err.to_string().contains("turn_timeout_s"), "{err}");
        let c = ServerConfig::load(
            None,
            env(&[
                ("CADRE_MODEL_MAX_REPLY_BYTES", "65536"),
                ("CADRE_MODEL_API_KEY", "sk-not-a-key-of-this-section"),
            ]),
        )
        .unwrap();
        assert_eq!(c.model.max_reply_bytes, 65536);

        let err =
            ServerConfig::load(None, env(&[("CADRE_SERVER_IDLE_TIMEOUT_S", "60")])).unwrap_err();
        assert!(err.to_string().contains("idle_timeout_s"), "{err}");
        let err =
            ServerConfig::load(None, env(&[("CADRE_SERVER_MAX_CONECTIONS", "9")])).unwrap_err();
        assert!(err.to_string().contains("max_conections"), "{err}");

        let err = ServerConfig::load(None, env(&[("CADRE_SERVER_IDEMPOTENCY_KEEP_H", "23")]))
            .unwrap_err();
        assert!(err.to_string().contains("idempotency_keep_h"), "{err}");
        let c =
            ServerConfig::load(None, env(&[("CADRE_SERVER_IDEMPOTENCY_KEEP_H", "48")])).unwrap();
        assert_eq!(c.idempotency_keep(), Duration::from_secs(48 * 3600));
        assert_eq!(
            ServerConfig::default().idempotency_keep(),
            Duration::from_secs(24 * 3600)
        );

        assert_eq!(ServerConfig::default().store.cache_mb, 64);
        let c = ServerConfig::load(None, env(&[("CADRE_STORE_CACHE_MB", "256")])).unwrap();
        assert_eq!(c.store.cache_mb, 256);
        let err = ServerConfig::load(None, env(&[("CADRE_STORE_CACHE_MB", "0")])).unwrap_err();
        assert!(err.to_string().contains("store.cache_mb"), "{err}");

        // `[memory]`: semantic ranking's endpoint, model and least similarity.
        for (var, value, key) in [
            (
                "CADRE_MEMORY_EMBEDDINGS_URL",
                "ftp://x",
                "memory.embeddings_url",
            ),
            (
                "CADRE_MEMORY_EMBEDDINGS_MODEL",
                " ",
                "memory.embeddings_model",
            ),
            (
                "CADRE_MEMORY_EMBEDDINGS_MIN_SIMILARITY",
                "1.5",
                "memory.embeddings_min_similarity",
            ),
            (
                "CADRE_MEMORY_SWEEP_S",
                "0",
                "memory.max_items, max_mb and sweep_s",
            ),
        ] {
            let err = ServerConfig::load(None, env(&[(var, value)])).unwrap_err();
            assert!(err.to_string().contains(key), "{var}: {err}");
        }
        let c = ServerConfig::load(
            None,
            env(&[("CADRE_MEMORY_EMBEDDINGS_URL", "http://127.0.0.1:9/v1")]),
        )
        .unwrap();
        assert_eq!(
            c.memory.embeddings_url.as_deref(),
            Some("http://127.0.0.1:9/v1")
        );
        assert_eq!(ServerConfig::default().memory.embeddings_url, None);
    }

    #[test]
    fn max_per_tenant_is_set_from_the_file_or_the_environment_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cadre.toml");
        std::fs::write(
            &path,
            "[concurrency]\nmax_concurrent = 8\nmax_per_tenant = 2\n",
        )
        .unwrap();
        let c = ServerConfig::load(Some(&path), env(&[])).unwrap();
        assert_eq!(c.concurrency.tenant_slots(), 2);
        let c = ServerConfig::load(
            Some(&path),
            env(&[("CADRE_CONCURRENCY_MAX_PER_TENANT", "6")]),
        )
        .unwrap();
        assert_eq!(c.concurrency.max_per_tenant, Some(6));

        for bad in ["0", "9", "half"] {
            let err = ServerConfig::load(
                Some(&path),
                env(&[("CADRE_CONCURRENCY_MAX_PER_TENANT", bad)]),
            )
            .unwrap_err();
            assert!(err.to_string().contains("max_per_tenant"), "{bad}: {err}");
        }
        let err = ServerConfig::load(None, env(&[("CADRE_CONCURRENCY_MAX_PER_TENNANT", "2")]))
            .unwrap_err();
        assert!(err.to_string().contains("max_per_tennant"), "{err}");
    }

    #[test]
    fn no_file_gives_the_defaults() {
        let c = ServerConfig::load(None, env(&[])).unwrap();
        assert_eq!(c.concurrency.max_concurrent, 10);
        assert_eq!(c.concurrency.queue_size, 100);
        assert_eq!(c.concurrency.max_per_tenant, None);
        assert_eq!(
            (c.concurrency.tenant_slots(), c.concurrency.tenant_queue()),
            (5, 50)
        );
        assert_eq!(c.tools.reload_interval_s, 5.0);
        assert_eq!(c.api_limit.max_streams, 32);
        assert_eq!(c.sessions.max_queued_turns, 8);
        assert_eq!(c.sessions.idle_timeout_s, 300.0);
        assert_eq!(c.model.max_reply_bytes, 4 * 1024 * 1024);
        assert_eq!(c.model.max_tool_calls, 16);
        assert_eq!(
            c.session_limits().model_turn_timeout,
            Duration::from_secs(120)
        );
        let conns = c.connection_limits();
        assert_eq!(conns.header_read_timeout, Duration::from_secs(10));
        assert_eq!(conns.idle_timeout, Duration::from_secs(5));
        assert_eq!((conns.max_connections, conns.max_per_address), (4096, 256));
    }
}
