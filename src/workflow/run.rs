//! A workflow run as stored and served: its status, its input, and per
//! node the status, output, error, attempts and times; plus the events a
//! run publishes as its nodes move.
//!
//! scheduler (changes) ──▶ runner ──put_doc("workflow_runs", id)──▶ store
//!                                 └─▶ WorkflowEvent ──▶ SSE, CLI progress
//!
//! A run is one JSON document in the store's `workflow_runs` table
//! (namespace [`RUNS_NAMESPACE`]), keyed by its id (a UUID v7, so keys
//! sort by start time). Node records are keyed by node id.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::template::Outputs;

/// The store namespace of run documents.
pub const RUNS_NAMESPACE: &str = "workflow_runs";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Running,
    Succeeded,
    Failed,
    /// The server stopped while the run was in flight; `resume` continues it.
    Interrupted,
    /// `POST /v1/workflows/runs/{id}/cancel` stopped it; final, not resumable.
    Cancelled,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Interrupted => "interrupted",
            RunStatus::Cancelled => "cancelled",
        }
    }

    pub fn is_terminal(self) -> bool {
        self != RunStatus::Running
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    Pending,
    Running,
    Succeeded,
    Failed,
    Skipped,
    /// It was running when the run was cancelled; its result is discarded.
    Cancelled,
}

impl NodeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeStatus::Pending => "pending",
            NodeStatus::Running => "running",
            NodeStatus::Succeeded => "succeeded",
            NodeStatus::Failed => "failed",
            NodeStatus::Skipped => "skipped",
            NodeStatus::Cancelled => "cancelled",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            NodeStatus::Succeeded
                | NodeStatus::Failed
                | NodeStatus::Skipped
                | NodeStatus::Cancelled
        )
    }
}

/// One element of a map node's fan-out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ItemRun {
    pub status: NodeStatus,
    pub output: Option<Value>,
    pub error: Option<String>,
    pub attempts: u32,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

impl ItemRun {
    pub fn pending() -> Self {
        ItemRun {
            status: NodeStatus::Pending,
            output: None,
            error: None,
            attempts: 0,
            started_at: None,
            finished_at: None,
            session_id: None,
        }
    }
}

/// One node of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NodeRun {
    pub status: NodeStatus,
    /// Tool nodes: the tool's output; agent nodes: the reply text; map
    /// nodes: one entry per element (`null` where an element failed).
    pub output: Option<Value>,
    pub error: Option<String>,
    /// Why the node was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Tries over the run's life, resumes included (map nodes: all items').
    pub attempts: u32,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    /// Agent nodes: the session the reply came from (another agent node
    /// may continue it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Map nodes: the fan-out, once the node started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<ItemRun>>,
}

impl NodeRun {
    pub fn pending() -> Self {
        NodeRun {
            status: NodeStatus::Pending,
            output: None,
            error: None,
            reason: None,
            attempts: 0,
            started_at: None,
            finished_at: None,
            session_id: None,
            items: None,
        }
    }
}

/// A run of a workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = Run)]
pub struct WorkflowRun {
    pub id: String,
    pub workflow: String,
    pub status: RunStatus,
    /// The input after validation (schema defaults filled in).
    pub input: Value,
    /// The tenant that started the run: its calls and sessions are the
    /// tenant's, and other tenants do not see the run.
    #[serde(default = "default_tenant")]
    pub tenant: String,
    #[serde(default)]
    pub user_id: Option<String>,
    pub nodes: BTreeMap<String, NodeRun>,
    /// The workflow's `output` template rendered once the run succeeded.
    pub output: Option<Value>,
    /// Why the run failed (the first failed node) or was interrupted.
    pub error: Option<String>,
    pub created_at: Timestamp,
    pub finished_at: Option<Timestamp>,
    /// How many times the run was resumed (by a client or at start).
    #[serde(default)]
    pub resumes: u32,
    /// Of `resumes`, how many the server made by itself at start, for a
    /// run a restart cut within `[sessions] resume_window_s`.
    #[serde(default)]
    pub automatic_resumes: u32,
    /// When the run was last resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_at: Option<Timestamp>,
    /// The run whose tool call started this one (the `x-cadre-parent-run`
    /// header of the start request), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run: Option<String>,
    /// How many runs started each other down to this one: 0 for a run a
    /// client started, the parent's depth + 1 otherwise.
    #[serde(default)]
    pub depth: u32,
    /// Cluster mode: the node that last started or resumed it (`[cluster]
    /// node_id`), for people reading the run. Who may write it is the
    /// store's owner and epoch of the run ([`crate::store::owners`]), not
    /// this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The plan the run's calls and agent sessions run with: the lower of
    /// the workflow's `plan` and the starting caller's entitlement (a free
    /// key never runs a premium workflow's calls as premium). `None`: a run
    /// stored before this field, or started with no ceiling (the local
    /// CLI), which runs with the workflow's plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<crate::identity::Plan>,
    /// Where the run's end is POSTed (the start request's `webhook`): an
    /// event when it succeeds, fails, is interrupted or cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
}

fn default_tenant() -> String {
    crate::identity::DEFAULT_TENANT.to_string()
}

impl WorkflowRun {
    /// When the run last moved, as far as the store knows: the latest of
    /// its creation, its last resume and every start and end of its nodes
    /// and map elements. A run found `running` at startup stopped after
    /// this (the restart's resume window counts from here).
    pub fn last_progress(&self) -> Timestamp {
        let nodes = self.nodes.values().flat_map(|n| {
            let items = n
                .items
                .iter()
                .flatten()
                .flat_map(|i| [i.started_at, i.finished_at]);
            [n.started_at, n.finished_at].into_iter().chain(items)
        });
        nodes
            .chain([self.resumed_at])
            .flatten()
            .fold(self.created_at, Timestamp::max)
    }

    /// The nodes and map elements that are running, as the executor names
    /// them in a call's `node_id` (`node`, `node[k]`), with their start.
    pub fn running_tasks(&self) -> Vec<(String, Timestamp)> {
        let mut out = Vec::new();
        for (id, node) in &self.nodes {
            if node.status != NodeStatus::Running {
                continue;
            }
            match &node.items {
                None => out.extend(node.started_at.map(|t| (id.clone(), t))),
                Some(items) => out.extend(items.iter().enumerate().filter_map(|(k, i)| {
                    (i.status == NodeStatus::Running)
                        .then_some(i.started_at)
                        .flatten()
                        .map(|t| (format!("{id}[{k}]"), t))
                })),
            }
        }
        out
    }

    /// Records, for the running node or map element `task` (named as in
    /// [`Self::running_tasks`]), the outcome of a tool call that succeeded
    /// at `at` but whose result was not stored: it succeeded with `output`.
    /// False (nothing changes) when `task` is not running or started after
    /// `at`.
    pub fn adopt_call(&mut self, task: &str, output: Value, attempts: u32, at: Timestamp) -> bool {
        let (id, k) = match task.strip_suffix(']').and_then(|t| t.rsplit_once('[')) {
            Some((id, k)) => match k.parse::<usize>() {
                Ok(k) => (id, Some(k)),
                Err(_) => (task, None),
            },
            None => (task, None),
        };
        let Some(node) = self.nodes.get_mut(id) else {
            return false;
        };
        if node.status != NodeStatus::Running {
            return false;
        }
        match (k, node.items.as_mut()) {
            (None, None) if node.started_at.is_some_and(|s| s <= at) => {
                node.status = NodeStatus::Succeeded;
                node.output = Some(output);
                node.error = None;
                node.attempts += attempts;
                node.finished_at = Some(at);
                true
            }
            (Some(k), Some(items)) => {
                let Some(item) = items.get_mut(k) else {
                    return false;
                };
                if item.status != NodeStatus::Running || item.started_at.is_none_or(|s| s > at) {
                    return false;
                }
                item.status = NodeStatus::Succeeded;
                item.output = Some(output);
                item.error = None;
                item.attempts += attempts;
                item.finished_at = Some(at);
                node.attempts += attempts;
                true
            }
            _ => false,
        }
    }

    /// Marks a run found `running` at startup as interrupted, `why` being
    /// the run's error: its running nodes (and map items) become failed,
    /// so a resume runs them again.
    pub fn interrupt(&mut self, now: Timestamp, why: String) {
        const WHY: &str = "interrupted: the server stopped while this was running";
        self.status = RunStatus::Interrupted;
        self.error = Some(why);
        self.finished_at = Some(now);
        for node in self.nodes.values_mut() {
            for item in node.items.iter_mut().flatten() {
                if item.status == NodeStatus::Running {
                    item.status = NodeStatus::Failed;
                    item.error = Some(WHY.into());
                    item.finished_at = Some(now);
                }
            }
            if node.status == NodeStatus::Running {
                node.status = NodeStatus::Failed;
                node.error = Some(WHY.into());
                node.finished_at = Some(now);
            }
        }
    }

    /// Cancels a running or interrupted run: running nodes and map
    /// elements become `cancelled` (whatever they return later is
    /// discarded), pending ones stay pending. Returns the elements it
    /// changed, as `(node, index)`.
    pub fn cancel(&mut self, now: Timestamp) -> Vec<(String, usize)> {
        const WHY: &str = "cancelled: the run was cancelled while this was running";
        let mut changed = Vec::new();
        self.status = RunStatus::Cancelled;
        self.error = Some("the run was cancelled".into());
        self.output = None;
        self.finished_at = Some(now);
        for (id, node) in &mut self.nodes {
            for (k, item) in node.items.iter_mut().flatten().enumerate() {
                if item.status == NodeStatus::Running {
                    item.status = NodeStatus::Cancelled;
                    item.error = Some(WHY.into());
                    item.finished_at = Some(now);
                    changed.push((id.clone(), k));
                }
            }
            if node.status == NodeStatus::Running {
                node.status = NodeStatus::Cancelled;
                node.error = Some(WHY.into());
                node.finished_at = Some(now);
            }
        }
        changed
    }

    /// Prepares a finished (failed or interrupted) run to go again: every
    /// node not yet succeeded is pending again (a map node keeps the items
    /// that succeeded); outputs of succeeded nodes stay and are not re-run.
    /// `automatic`: the server resumes it at start, not a client.
    pub fn reset_for_resume(&mut self, now: Timestamp, automatic: bool) {
        self.status = RunStatus::Running;
        self.error = None;
        self.output = None;
        self.finished_at = None;
        self.resumes += 1;
        if automatic {
            self.automatic_resumes += 1;
        }
        self.resumed_at = Some(now);
        for node in self.nodes.values_mut() {
            if node.status == NodeStatus::Succeeded {
                continue;
            }
            let attempts = node.attempts;
            let items = node.items.take().map(|items| {
                items
                    .into_iter()
                    .map(|i| {
                        if i.status == NodeStatus::Succeeded {
                            i
                        } else {
                            ItemRun {
                                attempts: i.attempts,
                                ..ItemRun::pending()
                            }
                        }
                    })
                    .collect()
            });
            *node = NodeRun {
                attempts,
                items,
                ..NodeRun::pending()
            };
        }
    }
}

impl Outputs for BTreeMap<String, NodeRun> {
    fn output(&self, node: &str) -> Option<&Value> {
        self.get(node)
            .filter(|n| n.status == NodeStatus::Succeeded)
            .and_then(|n| n.output.as_ref())
    }
}

/// What happened in a run, for SSE subscribers and the CLI.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkflowEventKind {
    RunStarted {
        workflow: String,
    },
    NodeStarted {
        node: String,
    },
    NodeSucceeded {
        node: String,
        attempts: u32,
    },
    NodeFailed {
        node: String,
        error: String,
        attempts: u32,
    },
    NodeSkipped {
        node: String,
        reason: String,
    },
    ItemStarted {
        node: String,
        item: usize,
    },
    ItemSucceeded {
        node: String,
        item: usize,
    },
    ItemFailed {
        node: String,
        item: usize,
        error: String,
    },
    RunFinished {
        status: RunStatus,
        error: Option<String>,
    },
}

impl WorkflowEventKind {
    /// The SSE event name: the `type` tag.
    pub fn name(&self) -> &'static str {
        match self {
            WorkflowEventKind::RunStarted { .. } => "run_started",
            WorkflowEventKind::NodeStarted { .. } => "node_started",
            WorkflowEventKind::NodeSucceeded { .. } => "node_succeeded",
            WorkflowEventKind::NodeFailed { .. } => "node_failed",
            WorkflowEventKind::NodeSkipped { .. } => "node_skipped",
            WorkflowEventKind::ItemStarted { .. } => "item_started",
            WorkflowEventKind::ItemSucceeded { .. } => "item_succeeded",
            WorkflowEventKind::ItemFailed { .. } => "item_failed",
            WorkflowEventKind::RunFinished { .. } => "run_finished",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[schema(as = RunEvent)]
pub struct WorkflowEvent {
    pub run_id: String,
    pub at: Timestamp,
    #[serde(flatten)]
    pub kind: WorkflowEventKind,
}
