//! Workflow definitions: `agents/workflows/*.toml`, in two stages.
//!
//! file ──parse (TOML, deny unknown keys)──▶ [`WorkflowFile`]
//!      ──compile (names, references, templates, `when`, cycles, tools and agents exist)──▶ [`Workflow`]
//!
//! ```toml
//! name = "market-brief"
//! description = "..."
//! on_error = "fail_fast"            # or "continue"
//! plan = "free"                     # the plan the run's tool calls are made under
//! output = { brief = "{{nodes.brief.output}}" }
//! [input]                           # a JSON Schema for the run's input
//! type = "object"
//! required = ["sku"]
//! properties.sku = { type = "string" }
//!
//! [[nodes]]                         # a tool node
//! id = "stock"
//! tool = "lookup_stock"
//! params = { sku = "{{input.sku}}" }
//!
//! [[nodes]]                         # an agent node: one turn of a named agent
//! id = "brief"
//! agent = "analyst"
//! prompt = "Write a brief from {{nodes.stock.output}}"
//! session = "new"                   # or the id of another agent node to continue its session
//!
//! [[nodes]]                         # a map node: the body once per element
//! id = "bins"
//! map = "nodes.list.output.data.items"
//! max_parallel = 2
//! tool = "lookup_bin"
//! params = { sku = "{{item.sku}}" }
//! ```
//! Every node may also set `depends_on`, `when`, `timeout_s` (per attempt)
//! and `retries`.
//!
//! Decisions:
//! - the kind follows from the fields: `tool` or `agent` (exactly one) is
//!   the body, and `map` makes the node a fan-out of that body;
//! - dependencies are `depends_on` plus every node the node reads: in its
//!   params or prompt templates, its `when`, its `map` source, its `session`.
//!   So a template can never read a node that has not finished, and
//!   `depends_on` is needed only for ordering without data;
//! - refused at load, with the file, the workflow and the node named: a
//!   cycle (the nodes of the cycle listed), a reference to an unknown node,
//!   an unknown tool or agent, a bad template or `when`, `item`/`index`
//!   outside a map node, a `session` naming something other than a plain
//!   agent node, and fields that do not fit the node's kind;
//! - workflow names and node ids are `[A-Za-z0-9_-]+` (they appear in URLs
//!   and template paths); `runs` is reserved by the HTTP routes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::condition::{Condition, ConditionError};
use super::template::{PathExpr, Template, TemplateError, TemplateValue};
use crate::tools::Plan;
use crate::tools::validate::ParamValidator;

/// Default `max_parallel` of a map node.
pub const DEFAULT_MAX_PARALLEL: usize = 4;

/// What the compiler checks names against.
pub trait Catalog {
    fn has_tool(&self, name: &str) -> bool;
    fn has_agent(&self, name: &str) -> bool;
}

/// What happens to the rest of a run when a node fails.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Start nothing new; nodes already running finish; the run fails.
    #[default]
    FailFast,
    /// Nodes that do not depend on the failed one still run; the run fails
    /// at the end.
    Continue,
}

/// A workflow file as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowFile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub input: Option<Value>,
    #[serde(default)]
    pub on_error: OnError,
    #[serde(default)]
    pub plan: Plan,
    #[serde(default)]
    pub output: Option<Value>,
    #[serde(default)]
    pub nodes: Vec<NodeFile>,
}

/// A node as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeFile {
    pub id: String,
    pub tool: Option<String>,
    pub params: Option<Value>,
    pub agent: Option<String>,
    pub prompt: Option<String>,
    pub session: Option<String>,
    pub map: Option<String>,
    pub max_parallel: Option<usize>,
    #[serde(default)]
    pub depends_on: Vec<String>,
    pub timeout_s: Option<f64>,
    #[serde(default)]
    pub retries: u32,
    pub when: Option<String>,
}

/// Why a definition was refused.
#[derive(Debug, thiserror::Error)]
pub enum DefinitionError {
    #[error("{}: {message}", file.display())]
    Parse { file: PathBuf, message: String },
    #[error("{}: workflow '{workflow}': {problem}", file.display())]
    Workflow {
        file: PathBuf,
        workflow: String,
        problem: WorkflowProblem,
    },
    #[error("{}: workflow '{workflow}', node '{node}': {problem}", file.display())]
    Node {
        file: PathBuf,
        workflow: String,
        node: String,
        problem: Box<NodeProblem>,
    },
}

impl DefinitionError {
    pub fn file(&self) -> &Path {
        match self {
            DefinitionError::Parse { file, .. }
            | DefinitionError::Workflow { file, .. }
            | DefinitionError::Node { file, .. } => file,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WorkflowProblem {
    #[error("invalid name: {reason}")]
    BadName { reason: &'static str },
    #[error("it has no nodes")]
    NoNodes,
    #[error("node id '{id}' is used by two nodes")]
    DuplicateNode { id: String },
    #[error("the nodes depend on each other in a cycle: {}", cycle.join(" -> "))]
    Cycle { cycle: Vec<String> },
    #[error("invalid input schema: {message}")]
    InputSchema { message: String },
    #[error("output: {source}")]
    OutputTemplate {
        #[source]
        source: TemplateError,
    },
    #[error("output reads node '{node}', which does not exist")]
    OutputUnknownNode { node: String },
    #[error("output cannot read item or index (only map nodes have them)")]
    OutputItem,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeProblem {
    #[error("invalid id: {reason}")]
    BadId { reason: &'static str },
    #[error("a node needs `tool` or `agent`")]
    NoBody,
    #[error("a node has either `tool` or `agent`, not both")]
    TwoBodies,
    #[error("unknown tool '{tool}'")]
    UnknownTool { tool: String },
    #[error("unknown agent '{agent}'")]
    UnknownAgent { agent: String },
    #[error("{field} names node '{reference}', which does not exist")]
    UnknownNode {
        field: &'static str,
        reference: String,
    },
    #[error("`{field}` does not apply here: {reason}")]
    Misplaced {
        field: &'static str,
        reason: &'static str,
    },
    #[error("an agent node needs a `prompt`")]
    MissingPrompt,
    #[error("{field}: {source}")]
    Template {
        field: &'static str,
        #[source]
        source: TemplateError,
    },
    #[error("{field} reads item or index, which only map nodes have")]
    ItemOutsideMap { field: &'static str },
    #[error("when `{when}`: {source}")]
    Condition {
        when: String,
        #[source]
        source: ConditionError,
    },
    #[error("session '{session}': {reason}")]
    BadSession {
        session: String,
        reason: &'static str,
    },
    #[error("timeout_s must be a positive number of seconds, got {value}")]
    BadTimeout { value: f64 },
    #[error("max_parallel must be at least 1")]
    BadMaxParallel,
}

/// Which session an agent node's turn runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionRef {
    /// A fresh session of the node's agent.
    New,
    /// The session of this (agent) node, continued.
    Continue(String),
}

/// What a node does (once, or per element for a map node).
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    Tool {
        tool: String,
        params: TemplateValue,
    },
    Agent {
        agent: String,
        prompt: Template,
        session: SessionRef,
    },
}

/// A map node's fan-out.
#[derive(Debug, Clone, PartialEq)]
pub struct MapSpec {
    pub over: PathExpr,
    pub max_parallel: usize,
}

/// A checked node.
#[derive(Debug, Clone)]
pub struct Node {
    pub id: String,
    pub body: Body,
    pub map: Option<MapSpec>,
    /// `depends_on` as written.
    pub depends_on: Vec<String>,
    /// Every dependency, explicit and implied, as indices into
    /// [`Workflow::nodes`], sorted.
    pub needs: Vec<usize>,
    pub timeout: Option<Duration>,
    pub retries: u32,
    pub when: Option<Condition>,
}

impl Node {
    pub fn kind(&self) -> &'static str {
        match (&self.map, &self.body) {
            (Some(_), _) => "map",
            (None, Body::Tool { .. }) => "tool",
            (None, Body::Agent { .. }) => "agent",
        }
    }
}

/// A checked workflow, ready to run.
pub struct Workflow {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub input: ParamValidator,
    pub on_error: OnError,
    pub plan: Plan,
    pub output: Option<TemplateValue>,
    /// In file order.
    pub nodes: Vec<Node>,
    pub file: PathBuf,
}

impl std::fmt::Debug for Workflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workflow")
            .field("name", &self.name)
            .field("file", &self.file)
            .field("nodes", &self.nodes.len())
            .finish()
    }
}

impl Workflow {
    pub fn node(&self, id: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The definition as the API lists it.
    pub fn to_json(&self) -> Value {
        let nodes: Vec<Value> = self
            .nodes
            .iter()
            .map(|n| {
                let mut v = json!({
                    "id": n.id,
                    "kind": n.kind(),
                    "depends_on": n.needs.iter().map(|&i| &self.nodes[i].id).collect::<Vec<_>>(),
                });
                match &n.body {
                    Body::Tool { tool, .. } => v["tool"] = json!(tool),
                    Body::Agent { agent, session, .. } => {
                        v["agent"] = json!(agent);
                        if let SessionRef::Continue(s) = session {
                            v["session"] = json!(s);
                        }
                    }
                }
                if let Some(m) = &n.map {
                    v["map"] = json!(m.over.text);
                    v["max_parallel"] = json!(m.max_parallel);
                }
                if let Some(w) = &n.when {
                    v["when"] = json!(w.source());
                }
                v
            })
            .collect();
        json!({
            "name": self.name,
            "description": self.description,
            "input": self.input_schema,
            "on_error": self.on_error,
            "plan": self.plan,
            "nodes": nodes,
            "file": self.file.display().to_string(),
        })
    }
}

impl WorkflowFile {
    pub fn parse(path: &Path, text: &str) -> Result<WorkflowFile, DefinitionError> {
        toml::from_str(text).map_err(|e| DefinitionError::Parse {
            file: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })
    }
}

fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("it is empty");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err("use only letters, digits, '_' and '-'");
    }
    Ok(())
}

/// Reads and checks one workflow file.
pub fn load(
    path: &Path,
    text: &str,
    catalog: &dyn Catalog,
) -> Result<Arc<Workflow>, DefinitionError> {
    let file = WorkflowFile::parse(path, text)?;
    compile(path, file, catalog).map(Arc::new)
}

/// Checks a parsed file against itself and the catalog.
pub fn compile(
    path: &Path,
    file: WorkflowFile,
    catalog: &dyn Catalog,
) -> Result<Workflow, DefinitionError> {
    let wf_err = |problem| DefinitionError::Workflow {
        file: path.to_path_buf(),
        workflow: file.name.clone(),
        problem,
    };
    let node_err = |node: &str, problem| DefinitionError::Node {
        file: path.to_path_buf(),
        workflow: file.name.clone(),
        node: node.to_string(),
        problem: Box::new(problem),
    };
    check_name(&file.name).map_err(|reason| wf_err(WorkflowProblem::BadName { reason }))?;
    if file.name == "runs" {
        return Err(wf_err(WorkflowProblem::BadName {
            reason: "'runs' is reserved",
        }));
    }
    if file.nodes.is_empty() {
        return Err(wf_err(WorkflowProblem::NoNodes));
    }
    let ids: Vec<&str> = file.nodes.iter().map(|n| n.id.as_str()).collect();
    for (i, id) in ids.iter().enumerate() {
        check_name(id).map_err(|reason| node_err(id, NodeProblem::BadId { reason }))?;
        if ids[..i].contains(id) {
            return Err(wf_err(WorkflowProblem::DuplicateNode {
                id: id.to_string(),
            }));
        }
    }
    let index_of = |id: &str| ids.iter().position(|x| *x == id);

    let input_schema = file
        .input
        .clone()
        .unwrap_or_else(|| json!({"type": "object"}));
    if !input_schema.is_object() {
        return Err(wf_err(WorkflowProblem::InputSchema {
            message: "it must be a table (a JSON Schema object)".into(),
        }));
    }
    let input = ParamValidator::new(&input_schema, false).map_err(|e| {
        wf_err(WorkflowProblem::InputSchema {
            message: e.0.clone(),
        })
    })?;

    let mut nodes = Vec::with_capacity(file.nodes.len());
    for raw in &file.nodes {
        let id = raw.id.as_str();
        let err = |problem| node_err(id, problem);
        let mut reads: Vec<(&'static str, String)> = Vec::new();
        let is_map = raw.map.is_some();
        let body = match (&raw.tool, &raw.agent) {
            (None, None) => return Err(err(NodeProblem::NoBody)),
            (Some(_), Some(_)) => return Err(err(NodeProblem::TwoBodies)),
            (Some(tool), None) => {
                for (field, set) in [
                    ("prompt", raw.prompt.is_some()),
                    ("session", raw.session.is_some()),
                ] {
                    if set {
                        return Err(err(NodeProblem::Misplaced {
                            field,
                            reason: "only agent nodes have it",
                        }));
                    }
                }
                if !catalog.has_tool(tool) {
                    return Err(err(NodeProblem::UnknownTool { tool: tool.clone() }));
                }
                let params = raw.params.clone().unwrap_or_else(|| json!({}));
                if !params.is_object() {
                    return Err(err(NodeProblem::Misplaced {
                        field: "params",
                        reason: "params must be a table",
                    }));
                }
                let params = TemplateValue::parse(&params).map_err(|source| {
                    err(NodeProblem::Template {
                        field: "params",
                        source,
                    })
                })?;
                check_paths(&params.paths(), "params", is_map, &mut reads).map_err(err)?;
                Body::Tool {
                    tool: tool.clone(),
                    params,
                }
            }
            (None, Some(agent)) => {
                if raw.params.is_some() {
                    return Err(err(NodeProblem::Misplaced {
                        field: "params",
                        reason: "only tool nodes have it; an agent node has a prompt",
                    }));
                }
                if !catalog.has_agent(agent) {
                    return Err(err(NodeProblem::UnknownAgent {
                        agent: agent.clone(),
                    }));
                }
                let prompt = raw
                    .prompt
                    .as_deref()
                    .ok_or_else(|| err(NodeProblem::MissingPrompt))?;
                let prompt = Template::parse(prompt).map_err(|source| {
                    err(NodeProblem::Template {
                        field: "prompt",
                        source,
                    })
                })?;
                let paths: Vec<&PathExpr> = prompt.paths().collect();
                check_paths(&paths, "prompt", is_map, &mut reads).map_err(err)?;
                let session = match raw.session.as_deref() {
                    None | Some("new") => SessionRef::New,
                    Some(other) => {
                        let bad = |reason| {
                            err(NodeProblem::BadSession {
                                session: other.to_string(),
                                reason,
                            })
                        };
                        if other == id {
                            return Err(bad("a node cannot continue its own session"));
                        }
                        let Some(target) = file.nodes.iter().find(|n| n.id == other) else {
                            return Err(bad("use \"new\" or the id of another agent node"));
                        };
                        if target.agent.is_none() {
                            return Err(bad("it is not an agent node"));
                        }
                        if target.map.is_some() {
                            return Err(bad("a map node has one session per element"));
                        }
                        reads.push(("session", other.to_string()));
                        SessionRef::Continue(other.to_string())
                    }
                };
                Body::Agent {
                    agent: agent.clone(),
                    prompt,
                    session,
                }
            }
        };
        let map = match &raw.map {
            None => {
                if raw.max_parallel.is_some() {
                    return Err(err(NodeProblem::Misplaced {
                        field: "max_parallel",
                        reason: "only map nodes have it",
                    }));
                }
                None
            }
            Some(source) => {
                let over = PathExpr::parse(source).map_err(|source| {
                    err(NodeProblem::Template {
                        field: "map",
                        source,
                    })
                })?;
                if over.needs_item() {
                    return Err(err(NodeProblem::ItemOutsideMap { field: "map" }));
                }
                if let Some(n) = over.node() {
                    reads.push(("map", n.to_string()));
                }
                let max_parallel = raw.max_parallel.unwrap_or(DEFAULT_MAX_PARALLEL);
                if max_parallel == 0 {
                    return Err(err(NodeProblem::BadMaxParallel));
                }
                Some(MapSpec { over, max_parallel })
            }
        };
        let when = match &raw.when {
            None => None,
            Some(text) => {
                let c = Condition::parse(text).map_err(|source| {
                    err(NodeProblem::Condition {
                        when: text.clone(),
                        source,
                    })
                })?;
                // A `when` is decided before any element exists.
                check_paths(&c.paths(), "when", false, &mut reads).map_err(err)?;
                Some(c)
            }
        };
        let timeout = match raw.timeout_s {
            None => None,
            Some(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
            Some(value) => return Err(err(NodeProblem::BadTimeout { value })),
        };
        for dep in &raw.depends_on {
            reads.push(("depends_on", dep.clone()));
        }
        let mut needs = Vec::new();
        for (field, reference) in reads {
            let Some(i) = index_of(&reference) else {
                return Err(err(NodeProblem::UnknownNode { field, reference }));
            };
            needs.push(i);
        }
        needs.sort_unstable();
        needs.dedup();
        nodes.push(Node {
            id: raw.id.clone(),
            body,
            map,
            depends_on: raw.depends_on.clone(),
            needs,
            timeout,
            retries: raw.retries,
            when,
        });
    }
    if let Some(cycle) = find_cycle(&nodes) {
        return Err(wf_err(WorkflowProblem::Cycle { cycle }));
    }
    let output = match &file.output {
        None => None,
        Some(v) => {
            let t = TemplateValue::parse(v)
                .map_err(|source| wf_err(WorkflowProblem::OutputTemplate { source }))?;
            for p in t.paths() {
                if p.needs_item() {
                    return Err(wf_err(WorkflowProblem::OutputItem));
                }
                if let Some(n) = p.node()
                    && index_of(n).is_none()
                {
                    return Err(wf_err(WorkflowProblem::OutputUnknownNode {
                        node: n.into(),
                    }));
                }
            }
            Some(t)
        }
    };
    Ok(Workflow {
        name: file.name,
        description: file.description,
        input_schema,
        input,
        on_error: file.on_error,
        plan: file.plan,
        output,
        nodes,
        file: path.to_path_buf(),
    })
}

/// Records the nodes `paths` read; refuses `item`/`index` outside a map node.
fn check_paths(
    paths: &[&PathExpr],
    field: &'static str,
    in_map: bool,
    reads: &mut Vec<(&'static str, String)>,
) -> Result<(), NodeProblem> {
    for p in paths {
        if p.needs_item() && !in_map {
            return Err(NodeProblem::ItemOutsideMap { field });
        }
        if let Some(n) = p.node() {
            reads.push((field, n.to_string()));
        }
    }
    Ok(())
}

/// A cycle among `needs` edges, as node ids from a node back to itself.
fn find_cycle(nodes: &[Node]) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(
        i: usize,
        nodes: &[Node],
        marks: &mut [Mark],
        stack: &mut Vec<usize>,
    ) -> Option<Vec<String>> {
        marks[i] = Mark::Open;
        stack.push(i);
        for &d in &nodes[i].needs {
            match marks[d] {
                Mark::Open => {
                    let start = stack.iter().position(|&s| s == d).unwrap_or(0);
                    let mut cycle: Vec<String> = stack[start..]
                        .iter()
                        .map(|&s| nodes[s].id.clone())
                        .collect();
                    cycle.push(nodes[d].id.clone());
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(c) = visit(d, nodes, marks, stack) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        stack.pop();
        marks[i] = Mark::Done;
        None
    }
    let mut marks = vec![Mark::New; nodes.len()];
    for i in 0..nodes.len() {
        if marks[i] == Mark::New
            && let Some(c) = visit(i, nodes, &mut marks, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) struct Known;

    impl Catalog for Known {
        fn has_tool(&self, name: &str) -> bool {
            ["echo", "calculator", "emit", "gate", "fail"].contains(&name)
        }
        fn has_agent(&self, name: &str) -> bool {
            ["analyst", "writer"].contains(&name)
        }
    }

    pub(crate) fn wf(text: &str) -> Result<Arc<Workflow>, DefinitionError> {
        load(Path::new("agents/workflows/t.toml"), text, &Known)
    }

    fn refused(text: &str) -> String {
        wf(text).unwrap_err().to_string()
    }

    #[test]
    fn implied_dependencies_come_from_templates_when_map_and_session() {
        let w = wf(r#"
            name = "t"
            [[nodes]]
            id = "a"
            tool = "emit"
            [[nodes]]
            id = "b"
            agent = "writer"
            prompt = "about {{nodes.a.output.x}}"
            [[nodes]]
            id = "c"
            agent = "writer"
            prompt = "more"
            session = "b"
            [[nodes]]
            id = "d"
            tool = "echo"
            map = "nodes.a.output.items"
            params = { message = "{{item.name}} #{{index}}" }
            when = "input.go"
            depends_on = ["c"]
        "#)
        .unwrap();
        let needs: Vec<Vec<usize>> = w.nodes.iter().map(|n| n.needs.clone()).collect();
        assert_eq!(needs, [vec![], vec![0], vec![1], vec![0, 2]]);
        assert_eq!(w.nodes[3].kind(), "map");
        assert_eq!(
            w.nodes[3].map.as_ref().unwrap().max_parallel,
            DEFAULT_MAX_PARALLEL
        );
        assert_eq!(w.on_error, OnError::FailFast);
    }

    #[test]
    fn a_cycle_is_refused_naming_its_nodes() {
        let e = refused(
            r#"
            name = "t"
            [[nodes]]
            id = "a"
            tool = "echo"
            depends_on = ["c"]
            [[nodes]]
            id = "b"
            tool = "echo"
            params = { message = "{{nodes.a.output}}" }
            [[nodes]]
            id = "c"
            tool = "echo"
            depends_on = ["b"]
        "#,
        );
        assert!(e.contains("agents/workflows/t.toml"), "{e}");
        assert!(e.contains("cycle: a -> c -> b -> a"), "{e}");
        let e = refused("name = 't'\n[[nodes]]\nid = 'a'\ntool = 'echo'\ndepends_on = ['a']\n");
        assert!(e.contains("cycle: a -> a"), "{e}");
    }

    #[test]
    fn unknown_references_tools_and_agents_are_refused_naming_the_node() {
        let e = refused("name = 't'\n[[nodes]]\nid = 'a'\ntool = 'echo'\ndepends_on = ['ghost']\n");
        assert!(e.contains("node 'a': depends_on names node 'ghost'"), "{e}");
        let e = refused(
            "name = 't'\n[[nodes]]\nid = 'a'\ntool = 'echo'\nparams = { m = '{{nodes.ghost.output}}' }\n",
        );
        assert!(e.contains("node 'a': params names node 'ghost'"), "{e}");
        let e = refused("name = 't'\n[[nodes]]\nid = 'a'\ntool = 'nope'\n");
        assert!(e.contains("node 'a': unknown tool 'nope'"), "{e}");
        let e = refused("name = 't'\n[[nodes]]\nid = 'a'\nagent = 'nobody'\nprompt = 'hi'\n");
        assert!(e.contains("node 'a': unknown agent 'nobody'"), "{e}");
        let e = refused(
            "name = 't'\n[[nodes]]\nid = 'a'\ntool = 'echo'\nwhen = 'nodes.x.output > 1'\n",
        );
        assert!(e.contains("when names node 'x'"), "{e}");
    }

    #[test]
    fn malformed_nodes_are_refused_with_the_reason() {
        let cases = [
            ("[[nodes]]\nid = 'a'\n", "needs `tool` or `agent`"),
            (
                "[[nodes]]\nid = 'a'\ntool = 'echo'\nagent = 'writer'\n",
                "not both",
            ),
            (
                "[[nodes]]\nid = 'a'\nagent = 'writer'\n",
                "needs a `prompt`",
            ),
            (
                "[[nodes]]\nid = 'a'\ntool = 'echo'\nprompt = 'x'\n",
                "`prompt` does not apply",
            ),
            (
                "[[nodes]]\nid = 'a'\ntool = 'echo'\nmax_parallel = 2\n",
                "`max_parallel` does not apply",
            ),
            (
                "[[nodes]]\nid = 'a'\ntool = 'echo'\nparams = { m = '{{item}}' }\n",
                "only map nodes",
            ),
            (
                "[[nodes]]\nid = 'a'\ntool = 'echo'\nparams = { m = '{{input.x' }\n",
                "never closed",
            ),
            (
                "[[nodes]]\nid = 'a'\ntool = 'echo'\nwhen = 'input.x >'\n",
                "when `input.x >`",
            ),
            (
                "[[nodes]]\nid = 'a'\ntool = 'echo'\ntimeout_s = 0\n",
                "timeout_s",
            ),
            ("[[nodes]]\nid = 'a b'\ntool = 'echo'\n", "invalid id"),
            (
                "[[nodes]]\nid = 'a'\ntool = 'echo'\n[[nodes]]\nid = 'a'\ntool = 'echo'\n",
                "used by two nodes",
            ),
            (
                "[[nodes]]\nid = 'a'\ntool = 'echo'\n[[nodes]]\nid = 'b'\nagent = 'writer'\nprompt = 'p'\nsession = 'a'\n",
                "not an agent node",
            ),
            (
                "[[nodes]]\nid = 'a'\ntool = 'echo'\nmap = 'nodes.a.output'\nmax_parallel = 0\n",
                "max_parallel must be",
            ),
            (
                "[[nodes]]\nid = 'a'\ntool = 'echo'\nretry = 2\n",
                "unknown field `retry`",
            ),
            (
                "input = 3\n[[nodes]]\nid = 'a'\ntool = 'echo'\n",
                "input schema",
            ),
            ("", "no nodes"),
        ];
        for (body, expected) in cases {
            let e = refused(&format!("name = 't'\n{body}"));
            assert!(e.contains(expected), "{body:?}: {e}");
        }
        assert!(
            refused("name = 'runs'\n[[nodes]]\nid = 'a'\ntool = 'echo'\n").contains("reserved")
        );
    }
}
