//! The tool registry: name -> definition, compiled validator and handler.
//!
//! builtins + custom (code) ─┐
//! agents/tools/* (files)  ──┼─▶ ToolRegistry ──▶ executor (lookup), conversations (offer), HTTP (list)
//!                            └── reload_dir(): diff ──▶ events (tool_added / updated / removed ...)
//!
//! Tools from code form the base; tools from files are laid over it (a file
//! may redeclare a builtin, e.g. to give `http_request` a rate limit; remove
//! the file and the builtin's own definition comes back). Reload rules:
//! - a file whose text did not change is not parsed again;
//! - a bad file is reported (`load_error`, with file and line) and, if an
//!   earlier version of it loaded, that last good version stays live;
//! - two files declaring one tool name: the first by path keeps it, the other
//!   is reported naming both files;
//! - a removed file's tool goes away (or falls back to the builtin);
//! - a file over `[tools] max_file_bytes`, or a symlink out of the agents
//!   folder, is refused like a bad file ([`super::loader::read_tool_file`]);
//! - files are read and parsed outside the state lock (one reload at a time,
//!   under `reloading`), so tool calls never wait on a big file's parse.
//!
//! Wire names: a model sees `server.tool` as `server__tool`
//! ([`crate::model::wire_name`]), so two live names must never share a wire
//! name (MCP `names.echo` and a file's `names__echo`), or a call would go to
//! whichever the reply mapping finds first. The name already served keeps
//! it; the later one is withheld: not served, not offered, logged and
//! published as a `load_error`, and listed by [`ToolRegistry::withheld`].
//! On a fresh start builtins come first, then files, then MCP servers as
//! they answer.
//!
//! MCP servers (`agents/mcp.toml`, [`crate::mcp`]) form a third layer,
//! between code and files: each server's tools are replaced as a whole
//! whenever the server is listed again ([`ToolRegistry::set_mcp_tools`]),
//! and stay listed while the server is down, marked unavailable
//! ([`ToolRegistry::set_mcp_available`]). An agent may name `server.*`
//! (all of a server's tools) or `server.tool` before the server answered.
//!
//! Reads take a snapshot `Arc`, so a running call keeps the version it
//! started with.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use super::definition::Plan;
use super::loader::{
    FileSettings, HandlerCatalog, LoadError, is_tool_file, parse_file, read_tool_file, resolve,
};
use super::validate::{ParamValidator, SchemaError};
use super::{ToolDefinition, ToolHandler};
use crate::events::{EventBus, EventKind};
use crate::model::{ToolSpec, wire_name};

#[derive(Debug, Clone, PartialEq)]
pub enum ToolSource {
    Builtin,
    Custom,
    File(PathBuf),
    /// Listed from the MCP server of this name.
    Mcp(String),
}

impl ToolSource {
    pub fn describe(&self) -> String {
        match self {
            ToolSource::Builtin => "builtin".into(),
            ToolSource::Custom => "custom".into(),
            ToolSource::File(p) => p.display().to_string(),
            ToolSource::Mcp(server) => format!("mcp:{server}"),
        }
    }

    /// The citable id of data `tool` of this source returned. Builtin and
    /// custom code (cadre's and the embedding program's, also when a tool
    /// file names a builtin handler) owns the `tool:<domain>:v<n>`
    /// namespace and keeps its ids; an upstream's (`upstream`: an external
    /// command or URL, an MCP server, see `ToolDefinition::is_upstream`) is
    /// namespaced by its source (`file:<tool>:<id>`, `mcp:<server>:<id>`),
    /// so it can never make an answer look grounded in data no tool of
    /// that domain returned.
    pub fn citable_source_id(&self, tool: &str, upstream: bool, id: &str) -> String {
        match self {
            _ if !upstream => id.to_string(),
            ToolSource::Mcp(server) => format!("mcp:{server}:{id}"),
            _ => format!("file:{tool}:{id}"),
        }
    }
}

pub struct RegisteredTool {
    pub definition: ToolDefinition,
    pub validator: ParamValidator,
    pub handler: Arc<dyn ToolHandler>,
    pub source: ToolSource,
}

/// What a reload changed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ReloadReport {
    pub added: Vec<String>,
    pub updated: Vec<String>,
    pub removed: Vec<String>,
    pub errors: Vec<LoadError>,
}

impl ReloadReport {
    /// Adds what changed from `old` to `new` (a new definition or source is an update).
    fn diff(&mut self, old: &Tools, new: &Tools) {
        for (name, tool) in new {
            match old.get(name) {
                None => self.added.push(name.clone()),
                Some(o) if o.definition != tool.definition || o.source != tool.source => {
                    self.updated.push(name.clone())
                }
                Some(_) => {}
            }
        }
        self.removed
            .extend(old.keys().filter(|n| !new.contains_key(*n)).cloned());
    }

    pub fn changed(&self) -> bool {
        !(self.added.is_empty() && self.updated.is_empty() && self.removed.is_empty())
    }
}

struct FileState {
    /// The text read, or why it was not read (too big, a symlink out).
    text: Result<String, String>,
    /// The last version of this file that loaded.
    tool: Option<Arc<RegisteredTool>>,
}

/// One MCP server's layer.
#[derive(Default)]
struct McpLayer {
    available: bool,
    tools: BTreeMap<String, Arc<RegisteredTool>>,
    /// Why the server is down (unreachable, or refused over a bound), until
    /// it lists again.
    down_reason: Option<String>,
}

/// One declared MCP server, as `GET /v1/tools` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct McpServerStatus {
    pub server: String,
    pub available: bool,
    /// Tools of its last good listing.
    pub tools: usize,
    /// Why it is down, when it is and cadre knows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Default)]
struct State {
    /// Bumped whenever the state is taken for writing.
    version: u64,
    base: BTreeMap<String, Arc<RegisteredTool>>,
    mcp: BTreeMap<String, McpLayer>,
    files: BTreeMap<PathBuf, FileState>,
    merged: BTreeMap<String, Arc<RegisteredTool>>,
    /// Left out of `merged` because their wire name is taken, by name.
    withheld: BTreeMap<String, Withheld>,
    catalog: HandlerCatalog,
    settings: FileSettings,
    /// The `ask_<agent>` tools of the agents that delegate: reachable only
    /// from the turns offered them, never merged into the catalog
    /// ([`super::delegate`]).
    agent_tools: BTreeMap<String, Arc<RegisteredTool>>,
}

/// A tool that is not served because another live tool has its wire name.
#[derive(Debug, Clone, PartialEq)]
pub struct Withheld {
    pub name: String,
    pub source: ToolSource,
    pub message: String,
}

/// (tool names, plan) → (state version, specs).
type SpecsMemo = HashMap<(Vec<String>, Plan), (u64, Arc<[ToolSpec]>)>;

/// Distinct (tool names, plan) lists [`ToolRegistry::specs_for`] keeps.
const MAX_MEMO_SPECS: usize = 1024;

#[derive(Clone)]
pub struct ToolRegistry {
    state: Arc<RwLock<State>>,
    /// [`Self::specs_for`]'s answers, each tagged with the state version it
    /// was built from: every conversation of an agent shares one copy of
    /// its tool schemas instead of holding its own.
    specs: Arc<Mutex<SpecsMemo>>,
    events: EventBus,
    strict: bool,
    /// Held through a whole [`ToolRegistry::reload_dir`]: the watcher, the
    /// rescan and startup never interleave, so the files read and parsed
    /// outside the state lock are still the latest when installed.
    reloading: Arc<Mutex<()>>,
    /// Where the conversation layer plugs in what `ask_` tools do.
    delegate: super::delegate::DelegateSlot,
    /// Where the runtime plugs in what `remember` and `recall` do.
    memory: super::memory::MemorySlot,
}

impl Default for ToolRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl ToolRegistry {
    pub fn new() -> Self {
        Self::with_events(EventBus::new(), false)
    }

    /// `strict`: validation refuses parameters a tool does not declare.
    pub fn with_events(events: EventBus, strict: bool) -> Self {
        ToolRegistry {
            state: Arc::default(),
            specs: Arc::default(),
            events,
            strict,
            reloading: Arc::default(),
            delegate: Default::default(),
            memory: Default::default(),
        }
    }

    /// The `[tools]` settings tool files load with (size cap, allowlist);
    /// applies to files read from now on.
    pub fn set_file_settings(&self, settings: FileSettings) {
        self.write().settings = settings;
    }

    /// Tools not served because another live tool has their wire name.
    pub fn withheld(&self) -> Vec<Withheld> {
        self.read().withheld.values().cloned().collect()
    }

    pub fn events(&self) -> &EventBus {
        &self.events
    }

    /// Adds or replaces a builtin tool; its handler becomes nameable by
    /// tool files as `entry: {type: builtin, handler: <name>}`.
    pub fn register(
        &self,
        definition: ToolDefinition,
        handler: Arc<dyn ToolHandler>,
    ) -> Result<(), SchemaError> {
        self.register_from(definition, handler, ToolSource::Builtin)
    }

    /// Adds or replaces a tool of the embedding program (`entry.type = custom`).
    pub fn register_custom(
        &self,
        definition: ToolDefinition,
        handler: Arc<dyn ToolHandler>,
    ) -> Result<(), SchemaError> {
        self.register_from(definition, handler, ToolSource::Custom)
    }

    fn register_from(
        &self,
        definition: ToolDefinition,
        handler: Arc<dyn ToolHandler>,
        source: ToolSource,
    ) -> Result<(), SchemaError> {
        let validator = ParamValidator::new(&definition.parameters, self.strict)?;
        let name = definition.name.clone();
        let mut state = self.write();
        if source != ToolSource::Custom {
            state
                .catalog
                .builtin_side_effects
                .insert(name.clone(), definition.side_effects);
        }
        let catalog = match source {
            ToolSource::Custom => &mut state.catalog.custom,
            _ => &mut state.catalog.builtin,
        };
        catalog.insert(name.clone(), handler.clone());
        let tool = Arc::new(RegisteredTool {
            definition,
            validator,
            handler,
            source,
        });
        state.base.insert(name, tool);
        let merged = merge(&state.layered(), &state.files, &state.merged);
        let withheld = state.install(merged);
        drop(state);
        self.report_withheld(&withheld);
        Ok(())
    }

    /// A handler tool files may name as `entry: {type: custom, handler: NAME}`.
    pub fn add_custom_handler(&self, name: &str, handler: Arc<dyn ToolHandler>) {
        self.state
            .write()
            .expect("tool registry lock poisoned")
            .catalog
            .custom
            .insert(name.into(), handler);
    }

    pub fn get(&self, name: &str) -> Option<Arc<RegisteredTool>> {
        self.read().merged.get(name).cloned()
    }

    /// An `ask_<agent>` tool by name ([`super::delegate`]).
    pub fn agent_tool(&self, name: &str) -> Option<Arc<RegisteredTool>> {
        self.read().agent_tools.get(name).cloned()
    }

    /// The slot the `ask_` tools' handlers call through.
    pub fn delegate_slot(&self) -> &super::delegate::DelegateSlot {
        &self.delegate
    }

    /// The slot the `remember` and `recall` tools' handlers call through.
    pub fn memory_slot(&self) -> &super::memory::MemorySlot {
        &self.memory
    }

    /// Replaces the `ask_` and `transfer_to_` tools (the agents reload
    /// them with their files).
    pub fn set_agent_tools(&self, tools: Vec<(ToolDefinition, Arc<dyn ToolHandler>)>) {
        let layer = self.layer_of(
            tools,
            || ToolSource::Builtin,
            |name, e| tracing::error!(tool = %name, "an agent tool's schema does not compile: {e}"),
        );
        self.write().agent_tools = layer;
    }

    /// `tools` with their validators, by name; a tool whose schema does not
    /// compile is left out and reported through `left_out`.
    fn layer_of(
        &self,
        tools: Vec<(ToolDefinition, Arc<dyn ToolHandler>)>,
        source: impl Fn() -> ToolSource,
        left_out: impl Fn(&str, &dyn std::fmt::Display),
    ) -> BTreeMap<String, Arc<RegisteredTool>> {
        let mut layer = BTreeMap::new();
        for (definition, handler) in tools {
            match ParamValidator::new(&definition.parameters, self.strict) {
                Ok(validator) => {
                    let tool = RegisteredTool {
                        definition,
                        validator,
                        handler,
                        source: source(),
                    };
                    layer.insert(tool.definition.name.clone(), Arc::new(tool));
                }
                Err(e) => left_out(&definition.name, &e),
            }
        }
        layer
    }

    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// All live tools, sorted by name.
    pub fn tools(&self) -> Vec<Arc<RegisteredTool>> {
        self.read().merged.values().cloned().collect()
    }

    /// All definitions, sorted by name.
    pub fn definitions(&self) -> Vec<ToolDefinition> {
        self.tools().iter().map(|t| t.definition.clone()).collect()
    }

    /// Definitions a plan may call.
    pub fn definitions_for_plan(&self, plan: Plan) -> Vec<ToolDefinition> {
        self.tools()
            .iter()
            .filter(|t| t.definition.required_plan <= plan)
            .map(|t| t.definition.clone())
            .collect()
    }

    /// The specs of the named tools that exist and `plan` may call, in the
    /// order given; `server.*` stands for every tool of that MCP server.
    /// Built once per names, plan and registry change, then shared.
    pub fn specs_for(&self, names: &[String], plan: Plan) -> Arc<[ToolSpec]> {
        let state = self.read();
        let key = (names.to_vec(), plan);
        let mut memo = self.specs.lock().expect("tool specs lock");
        if let Some((version, specs)) = memo.get(&key)
            && *version == state.version
        {
            return specs.clone();
        }
        if memo.len() >= MAX_MEMO_SPECS {
            memo.clear();
        }
        let specs: Arc<[ToolSpec]> = Self::build_specs(&state, names, plan).into();
        memo.insert(key, (state.version, specs.clone()));
        specs
    }

    fn build_specs(state: &State, names: &[String], plan: Plan) -> Vec<ToolSpec> {
        names
            .iter()
            .flat_map(|n| match n.strip_suffix(".*") {
                Some(server) if state.mcp.contains_key(server) => {
                    state.mcp[server].tools.keys().cloned().collect::<Vec<_>>()
                }
                _ => vec![n.clone()],
            })
            .filter_map(|n| state.agent_tools.get(&n).or_else(|| state.merged.get(&n)))
            .filter(|t| t.definition.required_plan <= plan)
            .map(|t| t.definition.spec())
            .collect()
    }

    /// Whether an agent may name this tool: it is live, or it is `server.*`
    /// or `server.tool` of a declared MCP server (listed once it answers).
    pub fn knows(&self, name: &str) -> bool {
        let state = self.read();
        state.merged.contains_key(name)
            || name
                .split_once('.')
                .is_some_and(|(server, _)| state.mcp.contains_key(server))
    }

    /// Declares an MCP server: its tools come and go with
    /// [`Self::set_mcp_tools`]; until then it has none and is unavailable.
    pub fn declare_mcp_server(&self, server: &str) {
        let mut state = self.write();
        state.mcp.entry(server.into()).or_default();
    }

    /// Replaces the tools of MCP server `server` (named `server.tool`) and
    /// marks it available. A tool whose schema does not compile is left out
    /// and logged. Publishes the changes like a reload.
    pub fn set_mcp_tools(
        &self,
        server: &str,
        tools: Vec<(ToolDefinition, Arc<dyn ToolHandler>)>,
    ) -> ReloadReport {
        let layer = self.layer_of(tools, || ToolSource::Mcp(server.into()), |name, e| {
            tracing::warn!(%server, tool = %name, "MCP tool left out: its inputSchema does not compile: {e}")
        });
        let mut state = self.write();
        let entry = state.mcp.entry(server.into()).or_default();
        entry.tools = layer;
        entry.available = true;
        entry.down_reason = None;
        let merged = merge(&state.layered(), &state.files, &state.merged);
        let mut report = ReloadReport::default();
        report.diff(&state.merged, &merged.tools);
        let withheld = state.install(merged);
        drop(state);
        self.report_withheld(&withheld);
        if report.changed() {
            self.publish_report(&report);
        }
        report
    }

    /// Marks an MCP server's tools available or not (they stay listed).
    pub fn set_mcp_available(&self, server: &str, available: bool) {
        let mut state = self.write();
        if let Some(layer) = state.mcp.get_mut(server) {
            layer.available = available;
        }
    }

    /// Marks an MCP server down with the reason (unreachable, refused over
    /// a bound); its tools stay listed as unavailable.
    pub fn set_mcp_down(&self, server: &str, reason: &str) {
        let mut state = self.write();
        if let Some(layer) = state.mcp.get_mut(server) {
            layer.available = false;
            layer.down_reason = Some(reason.to_string());
        }
    }

    /// Every declared MCP server, by name.
    pub fn mcp_servers(&self) -> Vec<McpServerStatus> {
        self.read()
            .mcp
            .iter()
            .map(|(server, layer)| McpServerStatus {
                server: server.clone(),
                available: layer.available,
                tools: layer.tools.len(),
                reason: (!layer.available)
                    .then(|| layer.down_reason.clone())
                    .flatten(),
            })
            .collect()
    }

    /// `Some(available)` for a tool listed from an MCP server, `None` otherwise.
    pub fn mcp_status(&self, name: &str) -> Option<bool> {
        let state = self.read();
        match &state.merged.get(name)?.source {
            ToolSource::Mcp(server) => state.mcp.get(server).map(|l| l.available),
            _ => None,
        }
    }

    /// Announces every live tool (`tool_loaded`), once at startup.
    pub fn announce(&self) {
        for t in self.tools() {
            self.events.publish(EventKind::ToolLoaded {
                tool: t.definition.name.clone(),
                version: t.definition.version.clone(),
                source: t.source.describe(),
            });
        }
    }

    /// Brings the file-defined tools in line with `dir` (not recursive).
    /// Blocking (file IO): call it from a blocking thread.
    pub fn reload_dir(&self, dir: &Path) -> ReloadReport {
        let _one = self.reloading.lock().expect("tool reload lock");
        let settings = self.read().settings.clone();
        let agents_dir = match dir.parent() {
            Some(p) if p.as_os_str().is_empty() => Path::new("."),
            Some(p) => p,
            None => dir,
        };
        let mut paths: Vec<PathBuf> = match std::fs::read_dir(dir) {
            Ok(entries) => entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && is_tool_file(p))
                .collect(),
            Err(_) => Vec::new(),
        };
        paths.sort();
        let texts: Vec<(PathBuf, Result<String, String>)> = paths
            .into_iter()
            .map(|p| {
                let text = read_tool_file(&p, agents_dir, settings.max_file_bytes);
                (p, text)
            })
            .collect();

        // What changed, and the last good version of each changed file.
        let (catalog, last_good) = {
            let state = self.read();
            let unchanged = texts.len() == state.files.len()
                && texts
                    .iter()
                    .all(|(p, t)| state.files.get(p).is_some_and(|f| &f.text == t));
            if unchanged {
                return ReloadReport::default();
            }
            let last_good: BTreeMap<PathBuf, Option<Arc<RegisteredTool>>> = texts
                .iter()
                .filter_map(|(p, t)| match state.files.get(p) {
                    Some(f) if &f.text == t => None,
                    Some(f) => Some((p.clone(), f.tool.clone())),
                    None => Some((p.clone(), None)),
                })
                .collect();
            (state.catalog.clone(), last_good)
        };
        self.events.publish(EventKind::ReloadStarted);

        // Parsing happens here, with no lock held.
        let mut report = ReloadReport::default();
        let mut parsed = BTreeMap::new();
        for (path, text) in &texts {
            let Some(previous) = last_good.get(path) else {
                continue;
            };
            let loaded = match text {
                Ok(text) => self.load(path, text, &catalog, &settings),
                Err(message) => Err(LoadError {
                    file: path.clone(),
                    line: None,
                    message: message.clone(),
                }),
            };
            let tool = match loaded {
                Ok(t) => Some(t),
                Err(e) => {
                    report.errors.push(e);
                    previous.clone()
                }
            };
            parsed.insert(path.clone(), tool);
        }

        let mut state = self.write();
        let mut files = BTreeMap::new();
        for (path, text) in texts {
            let tool = match parsed.remove(&path) {
                Some(tool) => tool,
                None => state.files.remove(&path).and_then(|f| f.tool),
            };
            files.insert(path, FileState { text, tool });
        }
        let merged = merge(&state.layered(), &files, &state.merged);
        let reparsed = |p: &Path| last_good.contains_key(p);
        for (error, first) in &merged.duplicates {
            if reparsed(&error.file) || reparsed(first) {
                report.errors.push(error.clone());
            }
        }
        report.diff(&state.merged, &merged.tools);
        state.files = files;
        let mut withheld = state.install(merged);
        // A withheld file is reported with the file's other errors when it
        // is new or the file was edited; other sources only when new.
        for w in state.withheld.values() {
            if let ToolSource::File(path) = &w.source
                && reparsed(path)
                && !withheld.contains(w)
            {
                withheld.push(w.clone());
            }
        }
        drop(state);
        withheld.retain(|w| match &w.source {
            ToolSource::File(path) => {
                report.errors.push(LoadError {
                    file: path.clone(),
                    line: None,
                    message: w.message.clone(),
                });
                false
            }
            _ => true,
        });
        self.report_withheld(&withheld);
        self.publish_report(&report);
        report
    }

    /// Stage one and two of a file's text, and its validator.
    fn load(
        &self,
        path: &Path,
        text: &str,
        catalog: &HandlerCatalog,
        settings: &FileSettings,
    ) -> Result<Arc<RegisteredTool>, LoadError> {
        let file = parse_file(path, text)?;
        let (definition, handler) = resolve(path, file, catalog, settings)?;
        let validator =
            ParamValidator::new(&definition.parameters, self.strict).map_err(|e| LoadError {
                file: path.to_path_buf(),
                line: None,
                message: e.to_string(),
            })?;
        Ok(Arc::new(RegisteredTool {
            definition,
            validator,
            handler,
            source: ToolSource::File(path.to_path_buf()),
        }))
    }

    /// Logs and publishes tools newly withheld for their wire name.
    fn report_withheld(&self, withheld: &[Withheld]) {
        for w in withheld {
            tracing::warn!(tool = %w.name, source = %w.source.describe(), "tool not served: {}", w.message);
            self.events.publish(EventKind::LoadError {
                file: w.source.describe(),
                line: None,
                message: w.message.clone(),
            });
        }
    }

    fn publish_report(&self, report: &ReloadReport) {
        for e in &report.errors {
            tracing::warn!(file = %e.file.display(), line = ?e.line, "tool file not loaded: {}", e.message);
            self.events.publish(EventKind::LoadError {
                file: e.file.display().to_string(),
                line: e.line,
                message: e.message.clone(),
            });
        }
        for (names, added) in [(&report.added, true), (&report.updated, false)] {
            for name in names {
                if let Some(t) = self.get(name) {
                    let (tool, version, source) = (
                        name.clone(),
                        t.definition.version.clone(),
                        t.source.describe(),
                    );
                    tracing::info!(%tool, %version, %source, added, "tool live");
                    self.events.publish(if added {
                        EventKind::ToolAdded {
                            tool,
                            version,
                            source,
                        }
                    } else {
                        EventKind::ToolUpdated {
                            tool,
                            version,
                            source,
                        }
                    });
                }
            }
        }
        for name in &report.removed {
            tracing::info!(tool = %name, "tool removed");
            self.events
                .publish(EventKind::ToolRemoved { tool: name.clone() });
        }
        self.events.publish(EventKind::ReloadCompleted {
            tools: self.read().merged.len(),
            errors: report.errors.len(),
        });
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().expect("tool registry lock poisoned")
    }

    /// The state for a change; what [`Self::specs_for`] built before is stale.
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        let mut state = self.state.write().expect("tool registry lock poisoned");
        state.version += 1;
        state
    }
}

impl State {
    /// Makes `merged` live; returns the tools it withholds that were not
    /// withheld (for the same reason) before.
    fn install(&mut self, merged: Merged) -> Vec<Withheld> {
        let fresh = merged
            .withheld
            .values()
            .filter(|w| self.withheld.get(&w.name) != Some(w))
            .cloned()
            .collect();
        self.merged = merged.tools;
        self.withheld = merged.withheld;
        fresh
    }

    /// Tools from code, then the MCP servers' (which may not shadow them).
    fn layered(&self) -> Tools {
        let mut all = self.base.clone();
        for layer in self.mcp.values() {
            for (name, tool) in &layer.tools {
                all.entry(name.clone()).or_insert_with(|| tool.clone());
            }
        }
        all
    }
}

type Tools = BTreeMap<String, Arc<RegisteredTool>>;
/// A duplicate name: the error for the skipped file, and the path of the file that kept it.
type Clash = (LoadError, PathBuf);

struct Merged {
    tools: Tools,
    duplicates: Vec<Clash>,
    withheld: BTreeMap<String, Withheld>,
}

/// Base tools, then file tools in path order; a name declared by two files
/// stays with the first, and the second is reported (with the path of the
/// first, so a clash is reported whichever of the two files changed).
/// Then one tool per wire name: the one `previous` served keeps it, else
/// code before MCP before files; the others are withheld.
fn merge(base: &Tools, files: &BTreeMap<PathBuf, FileState>, previous: &Tools) -> Merged {
    let mut merged = base.clone();
    let mut owner: BTreeMap<String, &Path> = BTreeMap::new();
    let mut duplicates = Vec::new();
    for (path, f) in files {
        let Some(tool) = &f.tool else { continue };
        let name = &tool.definition.name;
        if let Some(first) = owner.get(name) {
            let error = LoadError {
                file: path.clone(),
                line: None,
                message: format!(
                    "tool '{name}' is defined in both {} and {}; {} is skipped",
                    first.display(),
                    path.display(),
                    path.display()
                ),
            };
            duplicates.push((error, first.to_path_buf()));
            continue;
        }
        owner.insert(name.clone(), path);
        merged.insert(name.clone(), tool.clone());
    }
    let withheld = withhold_wire_clashes(&mut merged, previous);
    Merged {
        tools: merged,
        duplicates,
        withheld,
    }
}

fn withhold_wire_clashes(merged: &mut Tools, previous: &Tools) -> BTreeMap<String, Withheld> {
    let mut by_wire: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for name in merged.keys() {
        by_wire
            .entry(wire_name(name))
            .or_default()
            .push(name.clone());
    }
    let mut withheld = BTreeMap::new();
    for (wire, names) in by_wire.into_iter().filter(|(_, n)| n.len() > 1) {
        let layer = |source: &ToolSource| match source {
            ToolSource::Builtin | ToolSource::Custom => 0,
            ToolSource::Mcp(_) => 1,
            ToolSource::File(_) => 2,
        };
        let rank = |name: &String| {
            let tool = &merged[name];
            let served = previous.get(name).is_some_and(|p| p.source == tool.source);
            (!served, layer(&tool.source), tool.source.describe())
        };
        let keeper = names
            .iter()
            .min_by_key(|n| rank(n))
            .expect("a clash has names")
            .clone();
        let kept_from = merged[&keeper].source.describe();
        for name in names.into_iter().filter(|n| *n != keeper) {
            let tool = merged.remove(&name).expect("a merged name");
            let message = format!(
                "tool '{name}' ({}) is not served: its function name on the wire, '{wire}', \
                 belongs to '{keeper}' ({kept_from})",
                tool.source.describe()
            );
            withheld.insert(
                name.clone(),
                Withheld {
                    name,
                    source: tool.source.clone(),
                    message,
                },
            );
        }
    }
    withheld
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::builtin::echo::Echo;

    fn mcp_tool(name: &str) -> (ToolDefinition, Arc<dyn ToolHandler>) {
        let def = ToolDefinition::new(name, "d", serde_json::json!({"type": "object"}));
        (def, Arc::new(Echo) as Arc<dyn ToolHandler>)
    }

    #[test]
    fn an_mcp_server_layer_is_replaced_whole_and_marked_down_without_leaving() {
        let registry = ToolRegistry::new();
        registry.declare_mcp_server("files");
        assert!(registry.knows("files.read"), "named before it is listed");
        assert!(!registry.knows("other.read"));

        let report = registry.set_mcp_tools(
            "files",
            vec![mcp_tool("files.read"), mcp_tool("files.list")],
        );
        assert_eq!(report.added, ["files.list", "files.read"]);
        assert_eq!(registry.mcp_status("files.read"), Some(true));
        let specs = registry.specs_for(&["files.*".into()], Plan::Free);
        assert_eq!(specs.len(), 2);

        registry.set_mcp_available("files", false);
        assert_eq!(registry.mcp_status("files.read"), Some(false));
        assert!(
            registry.contains("files.read"),
            "a down server's tools stay listed"
        );

        let report = registry.set_mcp_tools("files", vec![mcp_tool("files.read")]);
        assert_eq!(report.removed, ["files.list"]);
        assert!(report.added.is_empty() && report.updated.is_empty());
        assert_eq!(registry.mcp_status("files.read"), Some(true));
    }

    fn echo_registry() -> ToolRegistry {
        let registry = ToolRegistry::new();
        let def = crate::tools::builtin::echo::definition();
        registry.register(def, Arc::new(Echo)).unwrap();
        registry
    }

    const FILE_TWIN: &str =
        "name: names__echo\ndescription: d\nentry: {type: builtin, handler: echo}\n";

    #[test]
    fn an_mcp_tool_listed_after_a_file_with_its_wire_name_is_withheld() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("twin.yaml"), FILE_TWIN).unwrap();
        let registry = echo_registry();
        registry.reload_dir(dir.path());
        registry.declare_mcp_server("names");
        let report = registry.set_mcp_tools("names", vec![mcp_tool("names.echo")]);
        assert!(report.added.is_empty(), "{report:?}");
        assert!(!registry.contains("names.echo"));
        assert!(matches!(
            registry.get("names__echo").unwrap().source,
            ToolSource::File(_)
        ));
        let withheld = registry.withheld();
        assert_eq!(withheld.len(), 1, "{withheld:?}");
        assert_eq!(withheld[0].name, "names.echo");
        assert!(
            withheld[0].message.contains("'names__echo'"),
            "{}",
            withheld[0].message
        );
        let specs = registry.specs_for(&["names.*".into(), "names__echo".into()], Plan::Free);
        assert_eq!(specs.len(), 1, "one function per wire name is offered");
    }

    #[test]
    fn a_file_added_after_an_mcp_tool_with_its_wire_name_is_withheld_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let registry = echo_registry();
        registry.declare_mcp_server("names");
        registry.set_mcp_tools("names", vec![mcp_tool("names.echo")]);
        let path = dir.path().join("twin.yaml");
        std::fs::write(&path, FILE_TWIN).unwrap();
        let report = registry.reload_dir(dir.path());
        assert!(report.added.is_empty(), "{report:?}");
        assert_eq!(report.errors.len(), 1, "{report:?}");
        assert_eq!(report.errors[0].file, path);
        assert!(report.errors[0].message.contains("mcp:names"), "{report:?}");
        assert!(!registry.contains("names__echo"));
        assert!(matches!(
            registry.get("names.echo").unwrap().source,
            ToolSource::Mcp(_)
        ));
        // The server re-listing the same tools changes nothing.
        registry.set_mcp_tools("names", vec![mcp_tool("names.echo")]);
        assert!(registry.contains("names.echo") && !registry.contains("names__echo"));
    }

    #[test]
    fn specs_are_shared_until_the_registry_changes() {
        let registry = ToolRegistry::new();
        registry.declare_mcp_server("files");
        registry.set_mcp_tools("files", vec![mcp_tool("files.read")]);
        let names = vec!["files.*".to_string()];
        let first = registry.specs_for(&names, Plan::Free);
        assert!(Arc::ptr_eq(&first, &registry.specs_for(&names, Plan::Free)));
        assert!(!Arc::ptr_eq(&first, &registry.specs_for(&names, Plan::Pro)));

        registry.set_mcp_tools(
            "files",
            vec![mcp_tool("files.read"), mcp_tool("files.list")],
        );
        let after = registry.specs_for(&names, Plan::Free);
        assert_eq!(first.len(), 1);
        assert_eq!(after.len(), 2, "a change is seen at once");
    }
}
