//! Agent definitions (`agents/*.toml`) in two stages.
//!
//! file ──parse (deny unknown keys)──▶ [`AgentFile`] ──resolve (tools exist, model built)──▶ [`Agent`]
//!
//! An agent names its tools from the registry, its limits and optionally its
//! own model endpoint. Secrets stay out of agent files: an override names
//! the environment variable holding the key (`api_key_env`), never the key.
//!
//! agents/*.toml ──watcher / rescan──▶ [`AgentFiles::reload`] ──swap──▶ [`Agents`] (shared, live)
//!                                                  └──▶ runtime: log + `agent_*` / `load_error` events
//!
//! Reload decisions (the tool registry's rules, applied to agents):
//! - at startup every file must load; after that a file that no longer
//!   loads keeps its last good version live and is reported once per
//!   version of its text;
//! - a removed file's agent goes away: no new sessions, and the turns of
//!   its sessions answer `AGENT_NOT_FOUND` (their data stays readable);
//! - turns read the agent when they start ([`Agents::get`] is a snapshot),
//!   so an edit applies to running conversations from their next turn; the
//!   parts a conversation actor holds (model client, tool batch deadline,
//!   `multitask`) change when it is next loaded into memory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use serde::Deserialize;

use crate::model::openai::ClientOptions;
use crate::model::{ModelEndpoint, SharedModel, ToolSpec, model_for};
use crate::tools::output_schema::OutputSchema;
use crate::tools::remote_agent::{RemoteAgent, RemoteAgents};
use crate::tools::{Plan, ToolRegistry};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("agent {agent} names tool '{tool}', which is not registered")]
    UnknownTool { agent: String, tool: String },
    #[error("agent '{name}' is defined twice: {first} and {second}")]
    DuplicateAgent {
        name: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("agent {agent}: {message}")]
    Invalid { agent: String, message: String },
    #[error("agent {agent} lists agent '{asked}' in `agents` or `handoffs`, which is not defined")]
    UnknownAgent { agent: String, asked: String },
    #[error("agent {agent}: remote agent '{remote}' {why}")]
    RemoteClash {
        agent: String,
        remote: String,
        why: String,
    },
}

/// The MCP server list in the agents directory: not an agent file; read
/// by `mcp::config`, named here (below `mcp`) so both agree on it.
pub const MCP_FILE_NAME: &str = "mcp.toml";

/// The name an agent's answer schema goes by on the wire: the agent's
/// name cut to OpenAI's rule (`^[A-Za-z0-9_-]{1,64}$`).
fn output_name(agent: &str) -> String {
    let name: String = agent
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if name.is_empty() {
        "answer".into()
    } else {
        name
    }
}

/// An agent file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentFile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub system_prompt: String,
    #[serde(default)]
    pub tools: Vec<String>,
    /// Agents this one may ask (delegation): its model is offered
    /// `ask_<agent>` for each ([`crate::tools::delegate`]).
    #[serde(default)]
    pub agents: Vec<String>,
    /// Agents this one may hand the conversation to: its model is offered
    /// `transfer_to_<agent>` for each (`conversation::handoff`).
    #[serde(default)]
    pub handoffs: Vec<String>,
    /// Agents of other services (A2A) this one may ask: its model is
    /// offered `ask_<name>` for each ([`crate::tools::remote_agent`]).
    #[serde(default)]
    pub remote_agents: Vec<RemoteAgentEntry>,
    #[serde(default = "default_max_iterations")]
    pub max_iterations: u32,
    #[serde(default = "default_history_window")]
    pub history_window: usize,
    /// Deadline of one tool batch (the sub-agent), in seconds.
    #[serde(default = "default_tool_batch_timeout_s")]
    pub tool_batch_timeout_s: u64,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub model: Option<ModelOverride>,
    /// The site `fetch_page` reads for this agent.
    #[serde(default)]
    pub site: Option<SiteConfig>,
    /// Layer 2: tell the model to answer briefly (default on).
    #[serde(default = "yes")]
    pub brevity: bool,
    /// Layer 3: pass the visitor fields of the session metadata to the model.
    #[serde(default)]
    pub include_visitor_info: bool,
    /// Layer 4: tell the model to use a tool at most once per question.
    #[serde(default)]
    pub single_tool_use: bool,
    /// A message arriving while a turn runs: `enqueue` (run in order) or
    /// `reject` (409).
    #[serde(default)]
    pub multitask: Multitask,
    /// The JSON shape of every answer ([`crate::tools::output_schema`]): a
    /// JSON Schema written inline, or the path of a JSON file holding one
    /// (relative to the agents directory).
    #[serde(default)]
    pub output_schema: Option<OutputSchemaEntry>,
    /// Checks of the message, the answer and the tool calls
    /// ([`crate::guardrails`]; a tenant's run before them).
    #[serde(default)]
    pub guardrails: Vec<crate::guardrails::GuardrailConfig>,
    /// Memory across sessions: `true` offers the model `remember` and
    /// `recall` on the namespace `["users", "{user_id}"]`; a table names
    /// another namespace ([`MemoryEntry`]).
    #[serde(default)]
    pub memory: Option<MemoryEntry>,
}

/// `memory` as written: `true`/`false`, or `{ namespace = [...] }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MemoryEntry {
    On(bool),
    Table(MemoryTable),
}

/// `memory = { namespace = ["teams", "{tenant}"] }`: the namespace the
/// agent's `remember` and `recall` use, each segment a template where
/// `{tenant}`, `{user_id}` and `{agent}` are replaced by the calling
/// session's (a call whose session has no user is refused when the
/// template names `{user_id}`). `inject = true`: the items that match the
/// user's message best go into the turn's prompt too
/// ([`crate::memory::inject`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryTable {
    #[serde(default = "default_memory_namespace")]
    pub namespace: Vec<String>,
    #[serde(default)]
    pub inject: bool,
}

/// The namespace of `memory = true`: the session's user's.
pub fn default_memory_namespace() -> Vec<String> {
    vec!["users".into(), "{user_id}".into()]
}

/// The template variables a memory namespace segment may name.
pub const MEMORY_VARIABLES: [&str; 3] = ["{tenant}", "{user_id}", "{agent}"];

/// `output_schema` as written: an inline JSON Schema, or a file's path.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OutputSchemaEntry {
    Path(String),
    Inline(serde_json::Map<String, serde_json::Value>),
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Multitask {
    /// A message sent during a turn waits for it (the default).
    #[default]
    Enqueue,
    /// A message sent during a turn is refused (409 `CONVERSATION_BUSY`).
    Reject,
    /// A message sent during a turn cuts it: closed as `interrupted`, the
    /// new turn starts with the history so far.
    Interrupt,
    /// As `interrupt`, and the cut turn's messages are marked rolled back:
    /// kept in the store and exports, left out of every later prompt.
    Rollback,
}

impl Multitask {
    pub fn as_str(self) -> &'static str {
        match self {
            Multitask::Enqueue => "enqueue",
            Multitask::Reject => "reject",
            Multitask::Interrupt => "interrupt",
            Multitask::Rollback => "rollback",
        }
    }
}

fn yes() -> bool {
    true
}

/// A site assistant's site: `fetch_page` may read `allowed_paths` under `base_url`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SiteConfig {
    pub base_url: String,
    pub allowed_paths: Vec<String>,
}

/// A `[[remote_agents]]` entry as written: an A2A agent at `url` (its
/// card at `<url>/.well-known/agent-card.json`), its key in the variable
/// `api_key_env` (sent as `Authorization: Bearer`), described by
/// `description` or else by its card.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteAgentEntry {
    pub name: String,
    pub url: String,
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
}

/// Per-agent model endpoint; unset fields fall back to the server's.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelOverride {
    pub base_url: Option<String>,
    /// Name of the environment variable holding the API key.
    pub api_key_env: Option<String>,
    pub model: Option<String>,
    /// How the answer's schema is asked for: `native` (`response_format`,
    /// the default) or `prompt` (in the prompt, for endpoints that refuse
    /// the field).
    pub structured_output: Option<crate::model::StructuredOutput>,
}

fn default_max_iterations() -> u32 {
    3
}
fn default_history_window() -> usize {
    20
}
fn default_tool_batch_timeout_s() -> u64 {
    120
}

impl AgentFile {
    /// Parses an agent file; an `output_schema` given as a path is read
    /// here (relative to the file's folder), so a resolved agent's schema
    /// is always inline.
    pub fn parse(path: &Path, text: &str) -> Result<AgentFile, ConfigError> {
        let parse_error = |message: String| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        };
        let mut file: AgentFile = toml::from_str(text).map_err(|e| parse_error(e.to_string()))?;
        if let Some(OutputSchemaEntry::Path(p)) = &file.output_schema {
            let at = path.parent().unwrap_or(Path::new(".")).join(p);
            let text = std::fs::read_to_string(&at).map_err(|e| {
                parse_error(format!("output_schema: cannot read {}: {e}", at.display()))
            })?;
            let schema: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&text)
                .map_err(|e| {
                    parse_error(format!(
                        "output_schema: {} is not a JSON object: {e}",
                        at.display()
                    ))
                })?;
            file.output_schema = Some(OutputSchemaEntry::Inline(schema));
        }
        Ok(file)
    }
}

/// A resolved agent, ready to serve turns.
pub struct Agent {
    pub name: String,
    pub description: String,
    /// Shared by the agent's conversations (each holds it in its turn
    /// settings; a copy each was the prompt's length per resident one).
    pub system_prompt: std::sync::Arc<str>,
    pub tools: Vec<String>,
    /// The agents it may ask (`agents = [...]`), each offered as `ask_<name>`.
    pub agents: Vec<String>,
    /// The agents it may hand the conversation to (`handoffs = [...]`),
    /// each offered as `transfer_to_<name>`.
    pub handoffs: Vec<String>,
    /// The remote agents it may ask (`[[remote_agents]]`), each offered
    /// as `ask_<name>`.
    pub remote_agents: Vec<RemoteAgent>,
    /// What its model is offered: its tools, its `ask_` tools (local, then
    /// remote), then its `transfer_to_` tools.
    offered: Vec<String>,
    pub max_iterations: u32,
    pub history_window: usize,
    pub tool_batch_timeout: Duration,
    pub temperature: Option<f32>,
    pub max_tokens: Option<u32>,
    /// Model name sent in requests (empty: the client's default).
    pub model_name: String,
    pub model: SharedModel,
    /// Handed to every tool call of this agent (`ExecutionContext.variables`):
    /// `{"site": {...}}` when the agent has a site.
    pub variables: serde_json::Value,
    pub brevity: bool,
    pub include_visitor_info: bool,
    pub single_tool_use: bool,
    pub multitask: Multitask,
    /// The JSON shape of every answer, when the file declares one.
    pub output_schema: Option<Arc<OutputSchema>>,
    /// Its guardrails, compiled (a tenant's run before them).
    pub guardrails: crate::guardrails::Guardrails,
    /// The namespace template of its `remember` and `recall` tools; `None`:
    /// no memory tools.
    pub memory: Option<Vec<String>>,
    /// `memory = { inject = true }`: the best items for the user's message
    /// go into each turn's prompt.
    pub memory_inject: bool,
}

impl Agent {
    pub fn resolve(
        file: AgentFile,
        registry: &ToolRegistry,
        server_endpoint: &ModelEndpoint,
        shared_model: Option<&SharedModel>,
        options: &ClientOptions,
    ) -> Result<Agent, ConfigError> {
        for tool in &file.tools {
            if !registry.knows(tool) {
                return Err(ConfigError::UnknownTool {
                    agent: file.name.clone(),
                    tool: tool.clone(),
                });
            }
        }
        if file.agents.contains(&file.name) || file.handoffs.contains(&file.name) {
            return Err(ConfigError::Invalid {
                agent: file.name,
                message: "an agent cannot list itself in `agents` or `handoffs`".into(),
            });
        }
        let mut remote_agents: Vec<RemoteAgent> = Vec::new();
        for entry in &file.remote_agents {
            let invalid = |message: String| ConfigError::Invalid {
                agent: file.name.clone(),
                message,
            };
            let remote = RemoteAgent::new(
                &entry.name,
                &entry.url,
                entry.api_key_env.as_deref(),
                entry.description.as_deref(),
            )
            .map_err(|e| invalid(e.to_string()))?;
            if file.agents.contains(&remote.name) || file.handoffs.contains(&remote.name) {
                return Err(invalid(format!(
                    "remote agent '{}' has the name of an agent in `agents` or `handoffs`: ask_{} would mean both",
                    remote.name, remote.name
                )));
            }
            if remote_agents.iter().any(|r| r.name == remote.name) {
                return Err(invalid(format!(
                    "remote agent '{}' is declared twice",
                    remote.name
                )));
            }
            remote_agents.push(remote);
        }
        if file.history_window == 0 {
            return Err(ConfigError::Invalid {
                agent: file.name,
                message: "history_window must be at least 1".into(),
            });
        }
        let over = file.model.clone().unwrap_or_default();
        let endpoint = server_endpoint.overridden_by(&ModelEndpoint {
            base_url: over.base_url.clone(),
            api_key: over
                .api_key_env
                .as_deref()
                .and_then(|k| std::env::var(k).ok()),
            model: over.model.clone(),
        });
        let has_override = over.base_url.is_some()
            || over.api_key_env.is_some()
            || over.structured_output.is_some();
        let options = &crate::model::openai::ClientOptions {
            structured_output: over.structured_output.unwrap_or(options.structured_output),
            ..options.clone()
        };
        let guardrails = crate::guardrails::Guardrails::compile(&file.guardrails).map_err(|e| {
            ConfigError::Invalid {
                agent: file.name.clone(),
                message: format!("guardrails: {e}"),
            }
        })?;
        for tool in guardrails.tools_called() {
            if !registry.knows(tool) {
                return Err(ConfigError::Invalid {
                    agent: file.name.clone(),
                    message: format!("a guardrail names tool '{tool}', which is not registered"),
                });
            }
        }
        let output_schema = match &file.output_schema {
            None => None,
            Some(OutputSchemaEntry::Path(_)) => {
                return Err(ConfigError::Invalid {
                    agent: file.name,
                    message: "output_schema: a path is read when the file is parsed".into(),
                });
            }
            Some(OutputSchemaEntry::Inline(schema)) => {
                let format = crate::model::ResponseFormat {
                    name: output_name(&file.name),
                    description: None,
                    schema: serde_json::Value::Object(schema.clone()),
                    strict: None,
                };
                Some(Arc::new(OutputSchema::new(format, false).map_err(
                    |message| ConfigError::Invalid {
                        agent: file.name.clone(),
                        message: format!("output_schema: {message}"),
                    },
                )?))
            }
        };
        let memory_inject = matches!(&file.memory, Some(MemoryEntry::Table(t)) if t.inject);
        let memory = match &file.memory {
            None | Some(MemoryEntry::On(false)) => None,
            Some(MemoryEntry::On(true)) => Some(default_memory_namespace()),
            Some(MemoryEntry::Table(t)) => Some(t.namespace.clone()),
        };
        if let Some(template) = &memory
            && let Err(message) = check_memory_template(template)
        {
            return Err(ConfigError::Invalid {
                agent: file.name,
                message: format!("memory.namespace: {message}"),
            });
        }
        let mut variables = serde_json::Map::new();
        if let Some(site) = &file.site {
            variables.insert("site".into(), serde_json::json!(site));
        }
        if let Some(template) = &memory {
            variables.insert(
                "memory".into(),
                serde_json::json!({ "namespace": template, "agent": file.name }),
            );
        }
        let variables = if variables.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::Value::Object(variables)
        };
        // A key variable that is not set: warned at every load and reload
        // (the variable named, never a value), and every turn refused.
        let key_not_set = over
            .api_key_env
            .as_deref()
            .filter(|k| std::env::var(k).ok().is_none_or(|v| v.trim().is_empty()));
        let model: SharedModel = match (key_not_set, shared_model) {
            (Some(variable), _) => {
                tracing::warn!(agent = %file.name, variable, "[model] api_key_env names {variable}, which is not set (or empty): this agent's turns fail with MODEL_KEY_NOT_SET until it is set and cadre restarted");
                Arc::new(crate::model::KeyNotSet {
                    agent: file.name.clone(),
                    variable: variable.to_string(),
                })
            }
            (None, Some(m)) if !has_override => m.clone(),
            (None, _) => model_for(&endpoint, options),
        };
        let dedup = |names: Vec<String>| {
            let mut out: Vec<String> = Vec::new();
            for n in names {
                if !out.contains(&n) {
                    out.push(n);
                }
            }
            out
        };
        let asked = dedup(file.agents);
        let handoffs = dedup(file.handoffs);
        let offered = file
            .tools
            .iter()
            .cloned()
            .chain(asked.iter().map(|a| crate::tools::delegate::ask_name(a)))
            .chain(
                remote_agents
                    .iter()
                    .map(|r| crate::tools::delegate::ask_name(&r.name)),
            )
            .chain(
                handoffs
                    .iter()
                    .map(|a| crate::tools::delegate::transfer_name(a)),
            )
            .chain(memory.iter().flat_map(|_| {
                [
                    crate::tools::memory::REMEMBER.to_string(),
                    crate::tools::memory::RECALL.to_string(),
                ]
            }))
            .collect();
        Ok(Agent {
            name: file.name,
            description: file.description,
            system_prompt: file.system_prompt.into(),
            tools: file.tools,
            agents: asked,
            handoffs,
            remote_agents,
            offered,
            max_iterations: file.max_iterations,
            history_window: file.history_window,
            tool_batch_timeout: Duration::from_secs(file.tool_batch_timeout_s.max(1)),
            temperature: file.temperature,
            max_tokens: file.max_tokens,
            model_name: endpoint.model.unwrap_or_default(),
            model,
            variables,
            brevity: file.brevity,
            include_visitor_info: file.include_visitor_info,
            single_tool_use: file.single_tool_use,
            multitask: file.multitask,
            output_schema,
            guardrails,
            memory,
            memory_inject,
        })
    }

    /// The agent's tools that `plan` may call, then the agents it may ask
    /// (`ask_<name>`), as offered to the model.
    pub fn tool_specs(&self, registry: &ToolRegistry, plan: Plan) -> std::sync::Arc<[ToolSpec]> {
        registry.specs_for(&self.offered, plan)
    }
}

/// Why a memory namespace template is refused: empty, deeper than 8
/// segments, or a segment that is empty, holds a `.` or names a variable
/// other than [`MEMORY_VARIABLES`].
fn check_memory_template(template: &[String]) -> Result<(), String> {
    if template.is_empty() || template.len() > 8 {
        return Err("1 to 8 segments".into());
    }
    for segment in template {
        let mut rest = segment.clone();
        for v in MEMORY_VARIABLES {
            rest = rest.replace(v, "x");
        }
        if rest.is_empty() || rest.contains(['.', '{', '}']) || rest.chars().any(char::is_control) {
            return Err(format!(
                "segment '{segment}': not empty, no '.', and only the variables {}",
                MEMORY_VARIABLES.join(", ")
            ));
        }
    }
    Ok(())
}

/// Why `agent` cannot serve beside the others of `known`: an agent it
/// lists in `agents` or `handoffs` that `known` lacks, or a remote agent
/// whose `ask_` tool would mean something else for another agent (one
/// asking a local agent of that name, or declaring that remote name at
/// another URL or key).
fn link_error(agent: &Agent, known: &AgentMap) -> Option<ConfigError> {
    if let Some(asked) = agent
        .agents
        .iter()
        .chain(&agent.handoffs)
        .find(|a| !known.contains_key(*a))
    {
        return Some(ConfigError::UnknownAgent {
            agent: agent.name.clone(),
            asked: asked.clone(),
        });
    }
    let others = || known.values().filter(|o| o.name != agent.name);
    for remote in &agent.remote_agents {
        let clash = |why: String| ConfigError::RemoteClash {
            agent: agent.name.clone(),
            remote: remote.name.clone(),
            why,
        };
        if let Some(other) = others().find(|o| o.agents.contains(&remote.name)) {
            return Some(clash(format!(
                "has the name of the local agent that {} asks: ask_{} would mean both",
                other.name, remote.name
            )));
        }
        if let Some(other) = others().find(|o| {
            o.remote_agents.iter().any(|r| {
                r.name == remote.name
                    && (r.url != remote.url || r.api_key_env != remote.api_key_env)
            })
        }) {
            return Some(clash(format!(
                "is declared by {} too, with another url or key: one name, one remote",
                other.name
            )));
        }
    }
    None
}

/// Makes the registry's agent tools those of `agents` now: an `ask_` tool
/// per agent some agent asks (local or remote), a `transfer_to_` tool per
/// agent some agent hands over to, each described by that agent's
/// description (a remote one's: its entry's, else its card's, read in the
/// background by `remote`).
pub fn publish_agent_tools(agents: &Agents, registry: &ToolRegistry, remote: &RemoteAgents) {
    use crate::tools::delegate::{ask_tool, transfer_tool};
    let map = agents.snapshot();
    let mut remotes: BTreeMap<&str, &RemoteAgent> = BTreeMap::new();
    for r in map.values().flat_map(|a| a.remote_agents.iter()) {
        remotes.entry(r.name.as_str()).or_insert(r);
    }
    let slot = registry.delegate_slot();
    let asked: std::collections::BTreeSet<&String> =
        map.values().flat_map(|a| a.agents.iter()).collect();
    let handed: std::collections::BTreeSet<&String> =
        map.values().flat_map(|a| a.handoffs.iter()).collect();
    let tools = asked
        .into_iter()
        .filter_map(|name| map.get(name))
        .map(|a| ask_tool(&a.name, &a.description, slot))
        .chain(
            handed
                .into_iter()
                .filter_map(|name| map.get(name))
                .map(|a| transfer_tool(&a.name, &a.description, slot)),
        )
        .chain(remotes.values().map(|r| {
            remote.prefetch(r);
            remote.ask_tool(r)
        }))
        .chain(
            map.values()
                .any(|a| a.memory.is_some())
                .then(|| crate::tools::memory::memory_tools(registry.memory_slot()))
                .into_iter()
                .flatten(),
        )
        .collect();
    registry.set_agent_tools(tools);
}

/// The agent files of `dir`: every `*.toml` directly in it but `mcp.toml`
/// (sub-folders hold tools and workflows), sorted. A missing folder is no
/// agents, not an error.
fn agent_paths(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(ConfigError::Read {
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "toml"))
        // The MCP server list lives beside the agents (read by `mcp::config`).
        .filter(|p| p.file_name().is_none_or(|n| n != MCP_FILE_NAME))
        .collect();
    paths.sort();
    Ok(paths)
}

type AgentMap = BTreeMap<String, Arc<Agent>>;

/// The agents a server runs, by name. Clones share one live set: a reload
/// ([`AgentFiles::reload`]) swaps it for every holder at once, and each
/// read takes a snapshot, so a turn keeps the version it started with.
#[derive(Clone, Default)]
pub struct Agents {
    // A std RwLock over a snapshot `Arc`: reads clone the `Arc` (no
    // allocation, never held across an await), writes are rare.
    by_name: Arc<RwLock<Arc<AgentMap>>>,
}

impl Agents {
    pub fn new(agents: Vec<Agent>) -> Self {
        let live = Agents::default();
        live.replace(
            agents
                .into_iter()
                .map(|a| (a.name.clone(), Arc::new(a)))
                .collect(),
        );
        live
    }

    fn snapshot(&self) -> Arc<AgentMap> {
        // No code panics while holding the lock; a poisoned one is intact.
        self.by_name
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn replace(&self, agents: AgentMap) {
        *self.by_name.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(agents);
    }

    pub fn get(&self, name: &str) -> Option<Arc<Agent>> {
        self.snapshot().get(name).cloned()
    }

    pub fn names(&self) -> Vec<String> {
        self.snapshot().keys().cloned().collect()
    }

    /// Which model serves each agent: `{agent, provider, model}`.
    pub fn providers(&self) -> Vec<serde_json::Value> {
        self.snapshot()
            .values()
            .map(|a| {
                serde_json::json!({
                    "agent": a.name,
                    "provider": a.model.describe(),
                    "model": if a.model_name.is_empty() { None } else { Some(a.model_name.clone()) },
                })
            })
            .collect()
    }

    /// Every agent now, by name.
    pub fn iter(&self) -> std::vec::IntoIter<Arc<Agent>> {
        self.snapshot()
            .values()
            .cloned()
            .collect::<Vec<_>>()
            .into_iter()
    }
}

/// What one reload of the agents folder changed, by agent name, and the
/// files it could not load (each reported once per version of its text).
#[derive(Debug, Default)]
pub struct AgentReload {
    /// Names and files of the agents added and updated.
    pub added: Vec<(String, PathBuf)>,
    pub updated: Vec<(String, PathBuf)>,
    pub removed: Vec<String>,
    pub errors: Vec<(PathBuf, ConfigError)>,
}

/// Hot reload of the agent files, the way tool files reload
/// ([`crate::tools::registry`]): a file whose text did not change is not
/// resolved again; a file that no longer loads (bad TOML, an unknown tool,
/// a name another file took first) is reported and its last good version
/// stays live; a removed file's agent goes away.
pub struct AgentFiles {
    dir: PathBuf,
    state: Mutex<FilesState>,
}

#[derive(Default)]
struct FilesState {
    /// The last version of each file that loaded: its text and agent.
    good: BTreeMap<PathBuf, (String, Arc<Agent>)>,
    /// The error last reported for each failing file, so a rescan does not
    /// report it again.
    reported: BTreeMap<PathBuf, String>,
}

impl AgentFiles {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        AgentFiles {
            dir: dir.into(),
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FilesState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The first load, at startup: every file must load (there is no last
    /// good version to keep), and `agents` serves what they define.
    pub fn load(
        &self,
        agents: &Agents,
        resolve: impl Fn(AgentFile) -> Result<Agent, ConfigError>,
    ) -> Result<(), ConfigError> {
        let mut good = BTreeMap::new();
        let mut map = AgentMap::new();
        let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
        for path in agent_paths(&self.dir)? {
            let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
            let file = AgentFile::parse(&path, &text)?;
            if let Some(first) = seen.insert(file.name.clone(), path.clone()) {
                return Err(ConfigError::DuplicateAgent {
                    name: file.name,
                    first,
                    second: path,
                });
            }
            let agent = Arc::new(resolve(file)?);
            map.insert(agent.name.clone(), agent.clone());
            good.insert(path, (text, agent));
        }
        for agent in map.values() {
            if let Some(e) = link_error(agent, &map) {
                return Err(e);
            }
        }
        agents.replace(map);
        self.state().good = good;
        Ok(())
    }

    /// Reads the folder again and swaps `agents` for what it defines now,
    /// keeping the last good version of each file that no longer loads.
    pub fn reload(
        &self,
        agents: &Agents,
        resolve: impl Fn(AgentFile) -> Result<Agent, ConfigError>,
    ) -> AgentReload {
        let mut report = AgentReload::default();
        let paths = match agent_paths(&self.dir) {
            Ok(p) => p,
            Err(e) => {
                // An unreadable folder is not an empty one: keep every agent.
                report.errors.push((self.dir.clone(), e));
                return report;
            }
        };
        let mut state = self.state();
        let mut next: BTreeMap<PathBuf, (String, Arc<Agent>)> = BTreeMap::new();
        let mut failed = Vec::new();
        for path in paths {
            let loaded = std::fs::read_to_string(&path)
                .map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })
                .and_then(|text| match state.good.get(&path) {
                    Some((old, agent)) if *old == text => Ok((text, agent.clone())),
                    _ => {
                        let agent = resolve(AgentFile::parse(&path, &text)?)?;
                        Ok((text, Arc::new(agent)))
                    }
                });
            match loaded {
                Ok(version) => {
                    next.insert(path, version);
                }
                Err(e) => {
                    if let Some(last_good) = state.good.get(&path) {
                        next.insert(path.clone(), last_good.clone());
                    }
                    failed.push((path, e));
                }
            }
        }
        // Two files naming one agent: the first by path keeps it.
        let mut map = AgentMap::new();
        let mut first_of: BTreeMap<String, PathBuf> = BTreeMap::new();
        next.retain(|path, (_, agent)| match first_of.get(&agent.name) {
            Some(first) => {
                failed.push((
                    path.clone(),
                    ConfigError::DuplicateAgent {
                        name: agent.name.clone(),
                        first: first.clone(),
                        second: path.clone(),
                    },
                ));
                false
            }
            None => {
                first_of.insert(agent.name.clone(), path.clone());
                map.insert(agent.name.clone(), agent.clone());
                true
            }
        });
        // An agent asking one that is not defined (now) does not load: its
        // last good version stays if that one's links hold, else it goes
        // (which may break another's links: again, until none is missing).
        while let Some((name, error)) = map
            .values()
            .find_map(|a| link_error(a, &map).map(|e| (a.name.clone(), e)))
        {
            let path = first_of[&name].clone();
            failed.push((path.clone(), error));
            let fallback = state
                .good
                .get(&path)
                .filter(|(_, a)| a.name == name && !Arc::ptr_eq(a, &map[&name]))
                .filter(|(_, a)| link_error(a, &map).is_none())
                .cloned();
            match fallback {
                Some(version) => {
                    map.insert(name, version.1.clone());
                    next.insert(path, version);
                }
                None => {
                    map.remove(&name);
                    next.remove(&path);
                }
            }
        }
        let mut reported = BTreeMap::new();
        for (path, e) in failed {
            let message = e.to_string();
            if state.reported.get(&path) != Some(&message) {
                report.errors.push((path.clone(), e));
            }
            reported.insert(path, message);
        }
        let old = agents.snapshot();
        for (name, agent) in &map {
            let source = || (name.clone(), first_of[name].clone());
            match old.get(name) {
                None => report.added.push(source()),
                Some(before) if !Arc::ptr_eq(before, agent) => report.updated.push(source()),
                Some(_) => {}
            }
        }
        report.removed = old
            .keys()
            .filter(|name| !map.contains_key(*name))
            .cloned()
            .collect();
        if !(report.added.is_empty() && report.updated.is_empty() && report.removed.is_empty()) {
            agents.replace(map);
        }
        state.good = next;
        state.reported = reported;
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_refused_with_the_key_named() {
        let err = AgentFile::parse(
            Path::new("a.toml"),
            "name = 'a'\nsystem_prompt = 's'\nmax_iteration = 2\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("max_iteration"), "{err}");
    }

    /// Loads `files` (name, text) as an agents folder.
    fn load(files: &[(&str, String)]) -> Result<Agents, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(format!("{name}.toml")), text).unwrap();
        }
        let registry = ToolRegistry::new();
        let resolve = |file: AgentFile| {
            Agent::resolve(
                file,
                &registry,
                &ModelEndpoint::default(),
                None,
                &ClientOptions::default(),
            )
        };
        let agents = Agents::default();
        AgentFiles::new(dir.path()).load(&agents, resolve)?;
        Ok(agents)
    }

    fn agent(name: &str, asks: &[&str], remotes: &[(&str, &str)]) -> String {
        let mut text =
            format!("name = '{name}'\nsystem_prompt = 'You are {name}.'\nagents = {asks:?}\n");
        for (remote, url) in remotes {
            text += &format!("[[remote_agents]]\nname = '{remote}'\nurl = '{url}'\n");
        }
        text
    }

    #[test]
    fn a_remote_agent_is_offered_as_an_ask_tool() {
        let agents =
            load(&[("lead", agent("lead", &[], &[("far", "http://127.0.0.1:9")]))]).unwrap();
        let lead = agents.get("lead").unwrap();
        assert_eq!(lead.offered, vec!["ask_far".to_string()]);
        assert_eq!(lead.remote_agents[0].url.as_str(), "http://127.0.0.1:9/");
    }

    #[test]
    fn a_bad_remote_agent_entry_does_not_load() {
        let cases = [
            (
                agent("lead", &[], &[("far away", "http://x.example")]),
                "not valid",
            ),
            (
                agent("lead", &[], &[("far", "ftp://x.example")]),
                "not an http(s) URL",
            ),
            (
                agent(
                    "lead",
                    &[],
                    &[("far", "http://a.example"), ("far", "http://b.example")],
                ),
                "declared twice",
            ),
            (
                agent("lead", &["far"], &[("far", "http://x.example")]),
                "ask_far would mean both",
            ),
        ];
        for (text, why) in cases {
            let err = match load(&[("lead", text.clone()), ("far", agent("far", &[], &[]))]) {
                Err(e) => e.to_string(),
                Ok(_) => panic!("loaded: {text}"),
            };
            assert!(err.contains(why), "{err} (wanted {why:?})");
        }
        let err = match load(&[(
            "lead",
            "name = 'lead'\nsystem_prompt = 's'\n[[remote_agents]]\nname = 'far'\nurl = 'http://x'\nkey = 'k'\n".into(),
        )]) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("an unknown key loaded"),
        };
        assert!(err.contains("key"), "{err}");
    }

    #[test]
    fn a_remote_name_means_one_thing_across_agent_files() {
        // Another agent asks a local agent of that name.
        let err = match load(&[
            ("lead", agent("lead", &[], &[("far", "http://x.example")])),
            ("other", agent("other", &["far"], &[])),
            ("far", agent("far", &[], &[])),
        ]) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("loaded"),
        };
        assert!(err.contains("the local agent that other asks"), "{err}");
        // Another agent declares it at another URL.
        let err = match load(&[
            ("lead", agent("lead", &[], &[("far", "http://x.example")])),
            ("other", agent("other", &[], &[("far", "http://y.example")])),
        ]) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("loaded"),
        };
        assert!(err.contains("with another url or key"), "{err}");
        // The same remote declared twice alike is one remote.
        load(&[
            ("lead", agent("lead", &[], &[("far", "http://x.example")])),
            ("other", agent("other", &[], &[("far", "http://x.example")])),
        ])
        .unwrap();
    }

    #[test]
    fn defaults_apply() {
        let f = AgentFile::parse(Path::new("a.toml"), "name = 'a'\nsystem_prompt = 's'\n").unwrap();
        assert_eq!((f.max_iterations, f.history_window), (3, 20));
    }
}
