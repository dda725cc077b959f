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
//! - a removed file's tool goes away (or falls back to the builtin).
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
use super::loader::{HandlerCatalog, LoadError, is_tool_file, parse_file, resolve};
use super::validate::{ParamValidator, SchemaError};
use super::{ToolDefinition, ToolHandler};
use crate::events::{EventBus, EventKind};
use crate::model::ToolSpec;

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

    /// The citable id of data a tool of this source returned. Builtin and
    /// custom tools (cadre's and the embedding program's code) own the
    /// `tool:<domain>:v<n>` namespace and keep their ids; a tool file's or an
    /// MCP server's id is namespaced by its source (`file:<tool>:<id>`,
    /// `mcp:<server>:<id>`), so an upstream can never make an answer look
    /// grounded in data no brokerage tool returned.
    pub fn citable_source_id(&self, tool: &str, id: &str) -> String {
        match self {
            ToolSource::Builtin | ToolSource::Custom => id.to_string(),
            ToolSource::File(_) => format!("file:{tool}:{id}"),
            ToolSource::Mcp(server) => format!("mcp:{server}:{id}"),
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
    text: String,
    /// The last version of this file that loaded.
    tool: Option<Arc<RegisteredTool>>,
}

/// One MCP server's layer.
#[derive(Default)]
struct McpLayer {
    available: bool,
    tools: BTreeMap<String, Arc<RegisteredTool>>,
}

#[derive(Default)]
struct State {
    /// Bumped whenever the state is taken for writing.
    version: u64,
    base: BTreeMap<String, Arc<RegisteredTool>>,
    mcp: BTreeMap<String, McpLayer>,
    files: BTreeMap<PathBuf, FileState>,
    merged: BTreeMap<String, Arc<RegisteredTool>>,
    catalog: HandlerCatalog,
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
        }
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
        let (merged, _) = merge(&state.layered(), &state.files);
        state.merged = merged;
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
            .filter_map(|n| state.merged.get(&n))
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
        let mut layer = BTreeMap::new();
        for (definition, handler) in tools {
            match ParamValidator::new(&definition.parameters, self.strict) {
                Ok(validator) => {
                    let tool = RegisteredTool {
                        definition,
                        validator,
                        handler,
                        source: ToolSource::Mcp(server.into()),
                    };
                    layer.insert(tool.definition.name.clone(), Arc::new(tool));
                }
                Err(e) => tracing::warn!(
                    %server, tool = %definition.name,
                    "MCP tool left out: its inputSchema does not compile: {e}"
                ),
            }
        }
        let mut state = self.write();
        let entry = state.mcp.entry(server.into()).or_default();
        entry.tools = layer;
        entry.available = true;
        let (merged, _) = merge(&state.layered(), &state.files);
        let mut report = ReloadReport::default();
        report.diff(&state.merged, &merged);
        state.merged = merged;
        drop(state);
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
        let mut paths: Vec<PathBuf> = match std::fs::read_dir(dir) {
            Ok(entries) => entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && is_tool_file(p))
                .collect(),
            Err(_) => Vec::new(),
        };
        paths.sort();
        let texts: Vec<(PathBuf, Option<String>)> = paths
            .into_iter()
            .map(|p| {
                let text = std::fs::read_to_string(&p).ok();
                (p, text)
            })
            .collect();

        let mut report = ReloadReport::default();
        let mut state = self.write();
        let unchanged = texts.len() == state.files.len()
            && texts.iter().all(|(p, t)| {
                state
                    .files
                    .get(p)
                    .is_some_and(|f| Some(&f.text) == t.as_ref())
            });
        if unchanged {
            return report;
        }
        self.events.publish(EventKind::ReloadStarted);
        let mut files = BTreeMap::new();
        let mut reparsed = Vec::new();
        for (path, text) in texts {
            let Some(text) = text else {
                report.errors.push(LoadError {
                    file: path.clone(),
                    line: None,
                    message: "cannot read the file".into(),
                });
                continue;
            };
            let previous = state.files.remove(&path);
            let last_good = match previous {
                Some(prev) if prev.text == text => {
                    files.insert(path, prev);
                    continue;
                }
                Some(prev) => prev.tool,
                None => None,
            };
            reparsed.push(path.clone());
            let loaded = parse_file(&path, &text)
                .and_then(|f| resolve(&path, f, &state.catalog))
                .and_then(|(definition, handler)| {
                    let validator = ParamValidator::new(&definition.parameters, self.strict)
                        .map_err(|e| LoadError {
                            file: path.clone(),
                            line: None,
                            message: e.to_string(),
                        })?;
                    Ok(Arc::new(RegisteredTool {
                        definition,
                        validator,
                        handler,
                        source: ToolSource::File(path.clone()),
                    }))
                });
            let tool = match loaded {
                Ok(t) => Some(t),
                Err(e) => {
                    report.errors.push(e);
                    last_good
                }
            };
            files.insert(path, FileState { text, tool });
        }
        let (merged, duplicates) = merge(&state.layered(), &files);
        for (error, first) in duplicates {
            if reparsed.contains(&error.file) || reparsed.contains(&first) {
                report.errors.push(error);
            }
        }
        report.diff(&state.merged, &merged);
        state.files = files;
        state.merged = merged;
        drop(state);
        self.publish_report(&report);
        report
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

/// Base tools, then file tools in path order; a name declared by two files
/// stays with the first, and the second is reported (with the path of the
/// first, so a clash is reported whichever of the two files changed).
fn merge(
    base: &BTreeMap<String, Arc<RegisteredTool>>,
    files: &BTreeMap<PathBuf, FileState>,
) -> (Tools, Vec<Clash>) {
    let mut merged = base.clone();
    let mut owner: BTreeMap<String, &Path> = BTreeMap::new();
    let mut errors = Vec::new();
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
            errors.push((error, first.to_path_buf()));
            continue;
        }
        owner.insert(name.clone(), path);
        merged.insert(name.clone(), tool.clone());
    }
    (merged, errors)
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
