//! The DAG scheduler: the decisions of a run, with no IO.
//!
//! runner ──start / on_outcome(node, item, outcome)──▶ Scheduler ──▶ Step { tasks, events, finished }
//!   ▲                                                                  │
//!   └────────────── performs the tasks (executor, sessions) ◀──────────┘
//!
//! Given the run's node states it decides what starts, what is skipped and
//! when the run is over; the [`super::runner`] actor performs the tasks it
//! returns and feeds their outcomes back. Time comes in as an argument, so
//! every decision is a plain function of its inputs and is unit-tested
//! without a runtime. Rules:
//! - a pending node starts as soon as every node it needs has succeeded;
//!   all such nodes start in the same step, so independent nodes run in
//!   parallel;
//! - a node whose dependency failed or was skipped is skipped (skips
//!   propagate); a node whose `when` is false is skipped;
//! - the task's params or prompt are rendered here; a template that reads
//!   a missing value fails the node, naming the path;
//! - `fail_fast`: after the first failure (of a node or of a map element)
//!   nothing new starts, running tasks finish, and nodes that never started
//!   stay `pending`; `continue`: everything that does not depend on a
//!   failure still runs. Either way a run with a failed node fails, and its
//!   `error` names the first failed node (in file order);
//! - a map node resolves its array when it starts (an array longer than
//!   `[workflows] max_map_elements` fails the node, naming the cap) and
//!   keeps at most `max_parallel` elements running; it succeeds when every element did
//!   (its output: the element outputs in order) and fails otherwise (its
//!   output: `null` where an element failed). An empty array succeeds with
//!   `[]`; a value that is not an array fails the node;
//! - each step says which map elements it changed ([`Step::items`]), so
//!   the runner writes those rows and not the whole run; the bookkeeping of
//!   a map (next pending element, running and failed counts) is kept
//!   apart, so an element's outcome costs the same whatever the map's size;
//! - `cancel` ends a running run `cancelled`: running nodes and elements
//!   become `cancelled` and their later outcomes are ignored;
//! - retries and timeouts are per task and belong to the runner: an
//!   outcome here is final;
//! - on resume ([`super::run::WorkflowRun::reset_for_resume`]) succeeded
//!   nodes and map elements keep their outputs and are not run again; nodes
//!   the current definition has and the run has not are added as pending.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::Value;

use super::definition::{Body, OnError, SessionRef, Workflow};
use super::run::{ItemRun, NodeRun, NodeStatus, RunStatus, WorkflowEventKind, WorkflowRun};
use super::template::{Missing, Scope};

/// Something the runner must do: one call of a node (or of one element
/// of a map node).
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub node: String,
    pub item: Option<usize>,
    pub work: Work,
    /// Per attempt.
    pub timeout: Option<Duration>,
    pub retries: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Work {
    Tool {
        tool: String,
        params: Value,
    },
    Agent {
        agent: String,
        prompt: String,
        /// The session to continue; `None` for a new one.
        session: Option<String>,
    },
}

/// How a task ended, after the runner's retries.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Succeeded {
        output: Value,
        attempts: u32,
        session_id: Option<String>,
    },
    Failed {
        error: String,
        attempts: u32,
        session_id: Option<String>,
    },
}

/// What one decision round asks of the runner.
#[derive(Debug, Default)]
pub struct Step {
    pub tasks: Vec<Task>,
    pub events: Vec<WorkflowEventKind>,
    /// The run reached its final status in this step.
    pub finished: bool,
    /// A node, an element or the run finished: worth a durable write.
    pub durable: bool,
    /// The map elements this step changed, as `(node, index)`.
    pub items: Vec<(String, usize)>,
}

impl Step {
    /// Whether the run itself (a node or its status) changed, not only
    /// map elements.
    pub fn changes_run(&self) -> bool {
        self.events.iter().any(|e| {
            !matches!(
                e,
                WorkflowEventKind::ItemStarted { .. }
                    | WorkflowEventKind::ItemSucceeded { .. }
                    | WorkflowEventKind::ItemFailed { .. }
            )
        })
    }
}

/// A started map node's bookkeeping.
struct MapState {
    /// Its array, resolved when it started.
    elements: Vec<Value>,
    /// No element before this one is pending (elements only move from
    /// pending to running to done).
    next: usize,
    pending: usize,
    running: usize,
    failed: usize,
}

pub struct Scheduler {
    workflow: Arc<Workflow>,
    run: WorkflowRun,
    /// Started map nodes, by node index.
    maps: HashMap<usize, MapState>,
    /// `[workflows] max_map_elements`.
    max_elements: usize,
    /// A node or an element failed (what `fail_fast` halts on).
    failed: bool,
}

/// Who a run is for: its tenant and user.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Owner {
    pub tenant: String,
    pub user_id: Option<String>,
}

/// A new run of `workflow`: every node pending.
pub fn new_run(
    workflow: &Workflow,
    id: String,
    input: Value,
    owner: Owner,
    now: Timestamp,
) -> WorkflowRun {
    WorkflowRun {
        id,
        workflow: workflow.name.clone(),
        status: RunStatus::Running,
        input,
        tenant: owner.tenant,
        user_id: owner.user_id,
        nodes: workflow
            .nodes
            .iter()
            .map(|n| (n.id.clone(), NodeRun::pending()))
            .collect(),
        output: None,
        error: None,
        created_at: now,
        finished_at: None,
        resumes: 0,
        automatic_resumes: 0,
        resumed_at: None,
        parent_run: None,
        depth: 0,
        node: None,
        plan: None,
        webhook: None,
    }
}

impl Scheduler {
    /// The scheduler of `run`; map nodes fan out over at most
    /// `max_elements` elements.
    pub fn new(workflow: Arc<Workflow>, mut run: WorkflowRun, max_elements: usize) -> Self {
        for n in &workflow.nodes {
            run.nodes
                .entry(n.id.clone())
                .or_insert_with(NodeRun::pending);
        }
        let failed = run.nodes.values().any(|n| {
            n.status == NodeStatus::Failed
                || n.items
                    .iter()
                    .flatten()
                    .any(|i| i.status == NodeStatus::Failed)
        });
        Scheduler {
            workflow,
            run,
            maps: HashMap::new(),
            max_elements,
            failed,
        }
    }

    /// Cancels the run if it is running: running nodes and elements become
    /// `cancelled`, nothing new starts, later outcomes are ignored.
    pub fn cancel(&mut self, now: Timestamp) -> Step {
        let mut step = Step::default();
        if self.run.status != RunStatus::Running {
            return step;
        }
        step.items = self.run.cancel(now);
        step.events.push(WorkflowEventKind::RunFinished {
            status: self.run.status,
            error: self.run.error.clone(),
        });
        step.finished = true;
        step.durable = true;
        step
    }

    pub fn run(&self) -> &WorkflowRun {
        &self.run
    }

    pub fn workflow(&self) -> &Arc<Workflow> {
        &self.workflow
    }

    /// The first decisions of a (new or resumed) run.
    pub fn start(&mut self, now: Timestamp) -> Step {
        let mut step = Step::default();
        self.advance(now, &mut step);
        step
    }

    /// Records how a task ended, then decides what follows. Outcomes for
    /// tasks that are not running (a stale report) are ignored.
    pub fn on_outcome(
        &mut self,
        node: &str,
        item: Option<usize>,
        outcome: Outcome,
        now: Timestamp,
    ) -> Step {
        let mut step = Step::default();
        let Some(n) = self.run.nodes.get_mut(node) else {
            return step;
        };
        if n.status != NodeStatus::Running {
            return step;
        }
        let (ok, output, error, attempts, session_id) = match outcome {
            Outcome::Succeeded {
                output,
                attempts,
                session_id,
            } => (true, Some(output), None, attempts, session_id),
            Outcome::Failed {
                error,
                attempts,
                session_id,
            } => (false, None, Some(error), attempts, session_id),
        };
        let status = if ok {
            NodeStatus::Succeeded
        } else {
            NodeStatus::Failed
        };
        match item {
            None => {
                if n.items.is_some() {
                    return step;
                }
                n.status = status;
                n.output = output;
                n.error = error.clone();
                n.attempts += attempts;
                n.session_id = session_id.or(n.session_id.take());
                n.finished_at = Some(now);
                step.events.push(match error {
                    None => WorkflowEventKind::NodeSucceeded {
                        node: node.into(),
                        attempts: n.attempts,
                    },
                    Some(error) => WorkflowEventKind::NodeFailed {
                        node: node.into(),
                        error,
                        attempts: n.attempts,
                    },
                });
            }
            Some(k) => {
                let Some(it) = n.items.as_mut().and_then(|items| items.get_mut(k)) else {
                    return step;
                };
                if it.status != NodeStatus::Running {
                    return step;
                }
                it.status = status;
                it.output = output;
                it.error = error.clone();
                it.attempts += attempts;
                it.session_id = session_id;
                it.finished_at = Some(now);
                n.attempts += attempts;
                step.items.push((node.to_string(), k));
                if let Some(map) = self
                    .workflow
                    .nodes
                    .iter()
                    .position(|d| d.id == node)
                    .and_then(|i| self.maps.get_mut(&i))
                {
                    map.running = map.running.saturating_sub(1);
                    map.failed += usize::from(!ok);
                }
                step.events.push(match error {
                    None => WorkflowEventKind::ItemSucceeded {
                        node: node.into(),
                        item: k,
                    },
                    Some(error) => WorkflowEventKind::ItemFailed {
                        node: node.into(),
                        item: k,
                        error,
                    },
                });
            }
        }
        self.failed |= !ok;
        step.durable = true;
        self.advance(now, &mut step);
        step
    }

    /// Whether nothing new may start: fail_fast after a failure.
    fn halted(&self) -> bool {
        self.workflow.on_error == OnError::FailFast && self.failed
    }

    fn advance(&mut self, now: Timestamp, step: &mut Step) {
        if self.run.status != RunStatus::Running {
            return;
        }
        loop {
            let mut changed = false;
            for i in 0..self.workflow.nodes.len() {
                let id = &self.workflow.nodes[i].id;
                changed |= match self.run.nodes[id].status {
                    NodeStatus::Pending => self.try_start(i, now, step),
                    NodeStatus::Running if self.workflow.nodes[i].map.is_some() => {
                        self.pump_map(i, now, step)
                    }
                    _ => false,
                };
            }
            if !changed {
                break;
            }
        }
        if self
            .run
            .nodes
            .values()
            .any(|n| n.status == NodeStatus::Running)
        {
            return;
        }
        let first_failed = self
            .workflow
            .nodes
            .iter()
            .find(|n| self.run.nodes[&n.id].status == NodeStatus::Failed);
        match first_failed {
            Some(n) => {
                let error = self.run.nodes[&n.id].error.clone().unwrap_or_default();
                self.run.status = RunStatus::Failed;
                self.run.error = Some(format!("node '{}' failed: {error}", n.id));
            }
            None => {
                self.run.status = RunStatus::Succeeded;
                self.run.output = self.workflow.output.as_ref().and_then(|t| {
                    let scope = Scope {
                        input: &self.run.input,
                        outputs: &self.run.nodes,
                        item: None,
                    };
                    t.render(&scope, Missing::Null).ok()
                });
            }
        }
        self.run.finished_at = Some(now);
        step.events.push(WorkflowEventKind::RunFinished {
            status: self.run.status,
            error: self.run.error.clone(),
        });
        step.finished = true;
        step.durable = true;
    }

    /// Decides a pending node: wait, skip, fail, or start. True on a change.
    fn try_start(&mut self, i: usize, now: Timestamp, step: &mut Step) -> bool {
        if self.halted() {
            return false;
        }
        let wf = self.workflow.clone();
        let node = &wf.nodes[i];
        let mut blocked = None;
        for &d in &node.needs {
            let dep = &wf.nodes[d].id;
            match self.run.nodes[dep].status {
                NodeStatus::Succeeded => {}
                NodeStatus::Pending | NodeStatus::Running => return false,
                NodeStatus::Failed => {
                    blocked = blocked.or_else(|| Some(format!("dependency '{dep}' failed")));
                }
                NodeStatus::Skipped => {
                    blocked = blocked.or_else(|| Some(format!("dependency '{dep}' was skipped")));
                }
                NodeStatus::Cancelled => {
                    blocked = blocked.or_else(|| Some(format!("dependency '{dep}' was cancelled")));
                }
            }
        }
        let when_false = node.when.as_ref().is_some_and(|c| {
            blocked.is_none()
                && !c.eval(&Scope {
                    input: &self.run.input,
                    outputs: &self.run.nodes,
                    item: None,
                })
        });
        if when_false {
            let source = node.when.as_ref().map(|c| c.source()).unwrap_or_default();
            blocked = Some(format!("when `{source}` is false"));
        }
        if let Some(reason) = blocked {
            let n = self.node_mut(&node.id);
            n.status = NodeStatus::Skipped;
            n.reason = Some(reason.clone());
            n.finished_at = Some(now);
            step.events.push(WorkflowEventKind::NodeSkipped {
                node: node.id.clone(),
                reason,
            });
            step.durable = true;
            return true;
        }
        if let Some(map) = &node.map {
            let scope = Scope {
                input: &self.run.input,
                outputs: &self.run.nodes,
                item: None,
            };
            let elements = match map.over.resolve(&scope) {
                Some(Value::Array(items)) if items.len() > self.max_elements => Err(format!(
                    "map: {} has {} elements, over the cap of {} (`[workflows] max_map_elements`)",
                    map.over.text,
                    items.len(),
                    self.max_elements
                )),
                Some(Value::Array(items)) => Ok(items),
                Some(other) => Err(format!(
                    "map: {} is {}, not an array",
                    map.over.text,
                    kind_of(&other)
                )),
                None => Err(format!("map: {} is not in this run", map.over.text)),
            };
            match elements {
                Err(error) => self.fail_at_start(&node.id, error, now, step),
                Ok(elements) => {
                    let n = self.node_mut(&node.id);
                    n.status = NodeStatus::Running;
                    n.started_at = Some(now);
                    let keep = n
                        .items
                        .as_ref()
                        .is_some_and(|it| it.len() == elements.len());
                    if !keep {
                        n.items = Some(vec![ItemRun::pending(); elements.len()]);
                    }
                    let items = n.items.as_deref().unwrap_or(&[]);
                    let count = |s: NodeStatus| items.iter().filter(|it| it.status == s).count();
                    let state = MapState {
                        next: 0,
                        pending: count(NodeStatus::Pending),
                        running: count(NodeStatus::Running),
                        failed: count(NodeStatus::Failed),
                        elements,
                    };
                    step.items
                        .extend((0..items.len()).map(|k| (node.id.clone(), k)));
                    step.events.push(WorkflowEventKind::NodeStarted {
                        node: node.id.clone(),
                    });
                    self.maps.insert(i, state);
                    self.pump_map(i, now, step);
                }
            }
            return true;
        }
        match self.render(i, None) {
            Err(error) => self.fail_at_start(&node.id, error, now, step),
            Ok(work) => {
                let n = self.node_mut(&node.id);
                n.status = NodeStatus::Running;
                n.started_at = Some(now);
                step.events.push(WorkflowEventKind::NodeStarted {
                    node: node.id.clone(),
                });
                step.tasks.push(Task {
                    node: node.id.clone(),
                    item: None,
                    work,
                    timeout: node.timeout,
                    retries: node.retries,
                });
            }
        }
        true
    }

    fn fail_at_start(&mut self, id: &str, error: String, now: Timestamp, step: &mut Step) {
        self.failed = true;
        let n = self.node_mut(id);
        n.status = NodeStatus::Failed;
        n.error = Some(error.clone());
        n.started_at = Some(now);
        n.finished_at = Some(now);
        step.events.push(WorkflowEventKind::NodeFailed {
            node: id.into(),
            error,
            attempts: n.attempts,
        });
        step.durable = true;
    }

    /// Starts elements up to `max_parallel`; finishes the node when its
    /// elements are done. True when the node finished. Costs O(elements
    /// started) plus, once, O(elements) when the node finishes.
    fn pump_map(&mut self, i: usize, now: Timestamp, step: &mut Step) -> bool {
        let wf = self.workflow.clone();
        let node = &wf.nodes[i];
        let Some(map) = &node.map else {
            return false;
        };
        if !self.maps.contains_key(&i) {
            // Only a map node started by this scheduler is running.
            return false;
        }
        while !self.halted() {
            let state = &self.maps[&i];
            if state.running >= map.max_parallel || state.pending == 0 {
                break;
            }
            let items = self.node_items(&node.id);
            let Some(k) =
                (state.next..items.len()).find(|&k| items[k].status == NodeStatus::Pending)
            else {
                break;
            };
            let rendered = self.render(i, Some(k));
            let state = self.maps.get_mut(&i).expect("a started map");
            state.next = k + 1;
            state.pending -= 1;
            match &rendered {
                Err(_) => state.failed += 1,
                Ok(_) => state.running += 1,
            }
            self.failed |= rendered.is_err();
            let item = &mut self.node_mut(&node.id).items.as_mut().expect("map items")[k];
            item.started_at = Some(now);
            step.items.push((node.id.clone(), k));
            match rendered {
                Err(error) => {
                    item.status = NodeStatus::Failed;
                    item.error = Some(error.clone());
                    item.finished_at = Some(now);
                    step.events.push(WorkflowEventKind::ItemFailed {
                        node: node.id.clone(),
                        item: k,
                        error,
                    });
                }
                Ok(work) => {
                    item.status = NodeStatus::Running;
                    step.events.push(WorkflowEventKind::ItemStarted {
                        node: node.id.clone(),
                        item: k,
                    });
                    step.tasks.push(Task {
                        node: node.id.clone(),
                        item: Some(k),
                        work,
                        timeout: node.timeout,
                        retries: node.retries,
                    });
                }
            }
        }
        let halted = self.halted();
        let state = &self.maps[&i];
        let (running, pending, failed) = (state.running, state.pending, state.failed);
        if running > 0 || (pending > 0 && !halted) {
            return false;
        }
        let items = self.node_items(&node.id);
        let output = Value::Array(
            items
                .iter()
                .map(|it| match it.status {
                    NodeStatus::Succeeded => it.output.clone().unwrap_or(Value::Null),
                    _ => Value::Null,
                })
                .collect(),
        );
        let error = if failed > 0 {
            let (k, first) = items
                .iter()
                .enumerate()
                .find(|(_, it)| it.status == NodeStatus::Failed)
                .expect("a failed element");
            Some(format!(
                "{failed} of {} elements failed; element {k}: {}",
                items.len(),
                first.error.clone().unwrap_or_default()
            ))
        } else if pending > 0 {
            Some(format!(
                "{pending} of {} elements never started: the run stopped after a failure",
                items.len()
            ))
        } else {
            None
        };
        self.maps.remove(&i);
        self.failed |= error.is_some();
        let n = self.node_mut(&node.id);
        n.output = Some(output);
        n.finished_at = Some(now);
        let attempts = n.attempts;
        match error {
            None => {
                n.status = NodeStatus::Succeeded;
                step.events.push(WorkflowEventKind::NodeSucceeded {
                    node: node.id.clone(),
                    attempts,
                });
            }
            Some(error) => {
                n.status = NodeStatus::Failed;
                n.error = Some(error.clone());
                step.events.push(WorkflowEventKind::NodeFailed {
                    node: node.id.clone(),
                    error,
                    attempts,
                });
            }
        }
        step.durable = true;
        true
    }

    /// The work of node `i` (element `item` of a map node), rendered.
    fn render(&self, i: usize, item: Option<usize>) -> Result<Work, String> {
        let node = &self.workflow.nodes[i];
        let element = item.and_then(|k| {
            self.maps
                .get(&i)
                .and_then(|m| m.elements.get(k))
                .map(|v| (v, k))
        });
        let scope = Scope {
            input: &self.run.input,
            outputs: &self.run.nodes,
            item: element,
        };
        match &node.body {
            Body::Tool { tool, params } => Ok(Work::Tool {
                tool: tool.clone(),
                params: params
                    .render(&scope, Missing::Error)
                    .map_err(|e| format!("params: {e}"))?,
            }),
            Body::Agent {
                agent,
                prompt,
                session,
            } => {
                let prompt = prompt
                    .render_string(&scope, Missing::Error)
                    .map_err(|e| format!("prompt: {e}"))?;
                let session = match session {
                    SessionRef::New => None,
                    SessionRef::Continue(other) => Some(
                        self.run
                            .nodes
                            .get(other)
                            .and_then(|n| n.session_id.clone())
                            .ok_or_else(|| format!("session: node '{other}' has no session"))?,
                    ),
                };
                Ok(Work::Agent {
                    agent: agent.clone(),
                    prompt,
                    session,
                })
            }
        }
    }

    fn node_mut(&mut self, id: &str) -> &mut NodeRun {
        self.run
            .nodes
            .get_mut(id)
            .expect("every workflow node has a record")
    }

    fn node_items(&self, id: &str) -> &[ItemRun] {
        self.run.nodes[id].items.as_deref().unwrap_or(&[])
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::workflow::definition::tests::wf;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    fn scheduler(text: &str, input: Value) -> Scheduler {
        let w = wf(text).unwrap();
        let run = new_run(&w, "run-1".into(), input, Owner::default(), t(0));
        Scheduler::new(w, run, 1_000)
    }

    fn ok(output: Value) -> Outcome {
        Outcome::Succeeded {
            output,
            attempts: 1,
            session_id: None,
        }
    }

    fn failed(error: &str) -> Outcome {
        Outcome::Failed {
            error: error.into(),
            attempts: 1,
            session_id: None,
        }
    }

    fn started(step: &Step) -> Vec<(String, Option<usize>)> {
        step.tasks
            .iter()
            .map(|t| (t.node.clone(), t.item))
            .collect()
    }

    fn ids(step: &Step) -> Vec<&str> {
        step.tasks.iter().map(|t| t.node.as_str()).collect()
    }

    fn status(s: &Scheduler, node: &str) -> NodeStatus {
        s.run().nodes[node].status
    }

    const DIAMOND: &str = r#"
        name = "t"
        [[nodes]]
        id = "a"
        tool = "emit"
        [[nodes]]
        id = "b"
        tool = "emit"
        [[nodes]]
        id = "c"
        tool = "echo"
        params = { message = "{{nodes.a.output.n}} and {{nodes.b.output.n}}", n = "{{nodes.a.output.n}}" }
    "#;

    #[test]
    fn independent_nodes_start_together_and_a_dependent_waits_for_all_of_them() {
        let mut s = scheduler(DIAMOND, json!({}));
        let step = s.start(t(0));
        assert_eq!(ids(&step), ["a", "b"]);
        assert!(!step.finished);
        let step = s.on_outcome("a", None, ok(json!({"n": 1})), t(1));
        assert!(step.tasks.is_empty(), "c still waits for b");
        assert_eq!(status(&s, "c"), NodeStatus::Pending);
        let step = s.on_outcome("b", None, ok(json!({"n": 2})), t(2));
        assert_eq!(ids(&step), ["c"]);
        assert_eq!(
            step.tasks[0].work,
            Work::Tool {
                tool: "echo".into(),
                params: json!({"message": "1 and 2", "n": 1})
            }
        );
        let step = s.on_outcome("c", None, ok(json!({"ok": true})), t(3));
        assert!(step.finished && step.durable);
        assert_eq!(s.run().status, RunStatus::Succeeded);
        let c = &s.run().nodes["c"];
        assert_eq!((c.started_at, c.finished_at), (Some(t(2)), Some(t(3))));
    }

    #[test]
    fn a_stale_or_unknown_outcome_changes_nothing() {
        let mut s = scheduler(DIAMOND, json!({}));
        s.start(t(0));
        assert!(
            s.on_outcome("c", None, ok(json!(1)), t(1))
                .events
                .is_empty()
        );
        assert!(
            s.on_outcome("zzz", None, ok(json!(1)), t(1))
                .events
                .is_empty()
        );
        s.on_outcome("a", None, ok(json!({"n": 1})), t(1));
        assert!(
            s.on_outcome("a", None, failed("late"), t(2))
                .events
                .is_empty()
        );
        assert_eq!(status(&s, "a"), NodeStatus::Succeeded);
    }

    const FAILING: &str = r#"
        name = "t"
        on_error = "ON_ERROR"
        [[nodes]]
        id = "bad"
        tool = "fail"
        [[nodes]]
        id = "slow"
        tool = "gate"
        [[nodes]]
        id = "after_slow"
        tool = "echo"
        depends_on = ["slow"]
        [[nodes]]
        id = "after_bad"
        tool = "echo"
        depends_on = ["bad"]
        [[nodes]]
        id = "after_after_bad"
        tool = "echo"
        depends_on = ["after_bad"]
    "#;

    #[test]
    fn fail_fast_lets_running_nodes_finish_but_starts_nothing_new() {
        let mut s = scheduler(&FAILING.replace("ON_ERROR", "fail_fast"), json!({}));
        assert_eq!(ids(&s.start(t(0))), ["bad", "slow"]);
        let step = s.on_outcome("bad", None, failed("boom"), t(1));
        assert!(step.tasks.is_empty() && !step.finished);
        let step = s.on_outcome("slow", None, ok(json!({})), t(2));
        assert!(step.tasks.is_empty(), "after_slow never starts");
        assert!(step.finished);
        assert_eq!(s.run().status, RunStatus::Failed);
        assert_eq!(s.run().error.as_deref(), Some("node 'bad' failed: boom"));
        for n in ["after_slow", "after_bad", "after_after_bad"] {
            assert_eq!(status(&s, n), NodeStatus::Pending, "{n}");
        }
    }

    #[test]
    fn continue_runs_what_does_not_depend_on_the_failure_and_skips_the_rest() {
        let mut s = scheduler(&FAILING.replace("ON_ERROR", "continue"), json!({}));
        s.start(t(0));
        let step = s.on_outcome("bad", None, failed("boom"), t(1));
        assert!(step.events.contains(&WorkflowEventKind::NodeSkipped {
            node: "after_bad".into(),
            reason: "dependency 'bad' failed".into()
        }));
        assert_eq!(status(&s, "after_after_bad"), NodeStatus::Skipped);
        assert_eq!(
            s.run().nodes["after_after_bad"].reason.as_deref(),
            Some("dependency 'after_bad' was skipped")
        );
        let step = s.on_outcome("slow", None, ok(json!({})), t(2));
        assert_eq!(ids(&step), ["after_slow"]);
        let step = s.on_outcome("after_slow", None, ok(json!({})), t(3));
        assert!(step.finished);
        assert_eq!(s.run().status, RunStatus::Failed);
    }

    #[test]
    fn a_false_when_skips_the_node_and_its_dependents_and_the_run_succeeds() {
        let mut s = scheduler(
            r#"
            name = "t"
            output = { count = "{{nodes.scan.output.count}}", fix = "{{nodes.fix.output}}" }
            [[nodes]]
            id = "scan"
            tool = "emit"
            [[nodes]]
            id = "fix"
            tool = "echo"
            when = "nodes.scan.output.count > 0"
            [[nodes]]
            id = "report"
            tool = "echo"
            depends_on = ["fix"]
            [[nodes]]
            id = "all_clear"
            tool = "echo"
            when = "nodes.scan.output.count == 0"
        "#,
            json!({}),
        );
        s.start(t(0));
        let step = s.on_outcome("scan", None, ok(json!({"count": 0})), t(1));
        assert_eq!(ids(&step), ["all_clear"]);
        assert_eq!(status(&s, "fix"), NodeStatus::Skipped);
        assert_eq!(
            s.run().nodes["fix"].reason.as_deref(),
            Some("when `nodes.scan.output.count > 0` is false")
        );
        assert_eq!(status(&s, "report"), NodeStatus::Skipped);
        s.on_outcome("all_clear", None, ok(json!("fine")), t(2));
        assert_eq!(s.run().status, RunStatus::Succeeded);
        assert_eq!(s.run().output, Some(json!({"count": 0, "fix": null})));
    }

    const MAP: &str = r#"
        name = "t"
        on_error = "continue"
        [[nodes]]
        id = "list"
        tool = "emit"
        [[nodes]]
        id = "each"
        tool = "echo"
        map = "nodes.list.output.items"
        max_parallel = 2
        params = { message = "{{item.name}}", i = "{{index}}" }
    "#;

    #[test]
    fn a_map_node_keeps_at_most_max_parallel_elements_running() {
        let mut s = scheduler(MAP, json!({}));
        s.start(t(0));
        let items = json!({"items": [{"name": "a"}, {"name": "b"}, {"name": "c"}, {"name": "d"}, {"name": "e"}]});
        let step = s.on_outcome("list", None, ok(items), t(1));
        assert_eq!(
            started(&step),
            [("each".into(), Some(0)), ("each".into(), Some(1))]
        );
        assert_eq!(
            step.tasks[1].work,
            Work::Tool {
                tool: "echo".into(),
                params: json!({"message": "b", "i": 1})
            }
        );
        let step = s.on_outcome("each", Some(1), ok(json!("B")), t(2));
        assert_eq!(started(&step), [("each".into(), Some(2))]);
        let step = s.on_outcome("each", Some(0), failed("nope"), t(3));
        assert_eq!(started(&step), [("each".into(), Some(3))]);
        let step = s.on_outcome("each", Some(2), ok(json!("C")), t(4));
        assert_eq!(started(&step), [("each".into(), Some(4))]);
        s.on_outcome("each", Some(3), ok(json!("D")), t(5));
        let step = s.on_outcome("each", Some(4), ok(json!("E")), t(6));
        assert!(step.finished);
        let each = &s.run().nodes["each"];
        assert_eq!(each.status, NodeStatus::Failed);
        assert_eq!(each.output, Some(json!([null, "B", "C", "D", "E"])));
        assert_eq!(each.attempts, 5);
        assert_eq!(
            each.error.as_deref(),
            Some("1 of 5 elements failed; element 0: nope")
        );
    }

    #[test]
    fn a_map_over_nothing_succeeds_and_over_a_non_array_fails() {
        let mut s = scheduler(MAP, json!({}));
        s.start(t(0));
        let step = s.on_outcome("list", None, ok(json!({"items": []})), t(1));
        assert!(step.finished);
        assert_eq!(s.run().nodes["each"].output, Some(json!([])));
        assert_eq!(s.run().status, RunStatus::Succeeded);

        let mut s = scheduler(MAP, json!({}));
        s.start(t(0));
        s.on_outcome("list", None, ok(json!({"items": "x"})), t(1));
        assert_eq!(
            s.run().nodes["each"].error.as_deref(),
            Some("map: nodes.list.output.items is a string, not an array")
        );
    }

    #[test]
    fn fail_fast_stops_a_map_from_starting_more_elements() {
        let mut s = scheduler(&MAP.replace("continue", "fail_fast"), json!({}));
        s.start(t(0));
        s.on_outcome(
            "list",
            None,
            ok(json!({"items": [{"name": "a"}, {"name": "b"}, {"name": "c"}]})),
            t(1),
        );
        let step = s.on_outcome("each", Some(0), failed("x"), t(2));
        assert!(step.tasks.is_empty());
        let step = s.on_outcome("each", Some(1), ok(json!(2)), t(3));
        assert!(step.finished);
        let each = &s.run().nodes["each"];
        assert_eq!(each.items.as_ref().unwrap()[2].status, NodeStatus::Pending);
        assert_eq!(each.status, NodeStatus::Failed);
    }

    #[test]
    fn a_map_longer_than_the_cap_fails_at_start_and_starts_nothing() {
        let w = wf(MAP).unwrap();
        let run = new_run(&w, "run-1".into(), json!({}), Owner::default(), t(0));
        let mut s = Scheduler::new(w, run, 2);
        s.start(t(0));
        let step = s.on_outcome("list", None, ok(json!({"items": [1, 2, 3]})), t(1));
        assert!(step.tasks.is_empty() && step.finished);
        let each = &s.run().nodes["each"];
        assert_eq!(each.status, NodeStatus::Failed);
        assert_eq!(
            each.error.as_deref(),
            Some(
                "map: nodes.list.output.items has 3 elements, over the cap of 2 (`[workflows] max_map_elements`)"
            )
        );
        assert!(each.items.is_none());
    }

    #[test]
    fn steps_name_the_elements_they_moved_and_only_node_changes_touch_the_run() {
        let mut s = scheduler(MAP, json!({}));
        s.start(t(0));
        let items = json!({"items": [{"name": "a"}, {"name": "b"}, {"name": "c"}]});
        let step = s.on_outcome("list", None, ok(items), t(1));
        assert!(step.changes_run(), "the map node started");
        let named = |step: &Step| step.items.iter().map(|(_, k)| *k).collect::<Vec<_>>();
        assert_eq!(
            named(&step),
            [0, 1, 2, 0, 1],
            "all rows once, then the two started"
        );
        let step = s.on_outcome("each", Some(0), ok(json!("A")), t(2));
        assert!(!step.changes_run(), "an element only: {:?}", step.events);
        assert_eq!(named(&step), [0, 2]);
        s.on_outcome("each", Some(1), ok(json!("B")), t(3));
        let step = s.on_outcome("each", Some(2), ok(json!("C")), t(4));
        assert!(step.changes_run() && step.finished);
    }

    #[test]
    fn cancel_ends_the_run_and_outcomes_arriving_after_it_change_nothing() {
        let mut s = scheduler(MAP, json!({}));
        s.start(t(0));
        s.on_outcome(
            "list",
            None,
            ok(json!({"items": [{"name": "a"}, {"name": "b"}, {"name": "c"}]})),
            t(1),
        );
        let step = s.cancel(t(2));
        assert!(step.finished && step.durable && step.tasks.is_empty());
        assert_eq!(
            step.events,
            [WorkflowEventKind::RunFinished {
                status: RunStatus::Cancelled,
                error: Some("the run was cancelled".into())
            }]
        );
        let before = s.run().clone();
        let items = before.nodes["each"].items.as_ref().unwrap();
        let statuses: Vec<_> = items.iter().map(|i| i.status).collect();
        assert_eq!(
            statuses,
            [
                NodeStatus::Cancelled,
                NodeStatus::Cancelled,
                NodeStatus::Pending
            ]
        );
        assert!(
            s.on_outcome("each", Some(0), ok(json!("late")), t(3))
                .events
                .is_empty()
        );
        assert!(
            s.cancel(t(4)).events.is_empty(),
            "cancelling again does nothing"
        );
        assert_eq!(s.run(), &before);
    }

    #[test]
    fn a_template_reading_a_missing_value_fails_the_node_naming_the_path() {
        let mut s = scheduler(DIAMOND, json!({}));
        s.start(t(0));
        s.on_outcome("a", None, ok(json!({"other": 1})), t(1));
        let step = s.on_outcome("b", None, ok(json!({"n": 2})), t(2));
        assert!(step.tasks.is_empty());
        assert!(step.finished);
        let err = s.run().nodes["c"].error.clone().unwrap();
        assert!(
            err.contains("params:") && err.contains("nodes.a.output.n"),
            "{err}"
        );
    }

    #[test]
    fn an_agent_node_continuing_a_session_gets_that_session() {
        let mut s = scheduler(
            r#"
            name = "t"
            [[nodes]]
            id = "first"
            agent = "writer"
            prompt = "Write about {{input.topic}}"
            [[nodes]]
            id = "second"
            agent = "writer"
            prompt = "Shorter."
            session = "first"
        "#,
            json!({"topic": "rust"}),
        );
        let step = s.start(t(0));
        assert_eq!(
            step.tasks[0].work,
            Work::Agent {
                agent: "writer".into(),
                prompt: "Write about rust".into(),
                session: None
            }
        );
        let step = s.on_outcome(
            "first",
            None,
            Outcome::Succeeded {
                output: json!("long text"),
                attempts: 1,
                session_id: Some("s-1".into()),
            },
            t(1),
        );
        assert_eq!(
            step.tasks[0].work,
            Work::Agent {
                agent: "writer".into(),
                prompt: "Shorter.".into(),
                session: Some("s-1".into())
            }
        );
    }

    #[test]
    fn a_cut_element_whose_call_finished_takes_its_output_and_does_not_run_again() {
        let mut s = scheduler(&MAP.replace("continue", "fail_fast"), json!({}));
        s.start(t(0));
        let mut cut = s.run().clone();
        assert_eq!(cut.running_tasks(), [("list".to_string(), t(0))]);
        assert!(!cut.adopt_call("list[0]", json!({}), 1, t(1)), "not a map");
        assert!(cut.adopt_call("list", json!({"items": []}), 2, t(1)));
        let list = &cut.nodes["list"];
        assert_eq!(
            (list.status, &list.output, list.attempts, list.finished_at),
            (
                NodeStatus::Succeeded,
                &Some(json!({"items": []})),
                2,
                Some(t(1))
            )
        );
        s.on_outcome(
            "list",
            None,
            ok(json!({"items": [{"name": "a"}, {"name": "b"}, {"name": "c"}]})),
            t(1),
        );
        s.on_outcome("each", Some(0), ok(json!("one")), t(2));
        let mut run = s.run().clone();
        assert_eq!(
            run.running_tasks(),
            [("each[1]".to_string(), t(1)), ("each[2]".to_string(), t(2))]
        );
        assert!(
            !run.adopt_call("each[1]", json!("old"), 1, t(0)),
            "a call before it started"
        );
        assert!(!run.adopt_call("list", json!("x"), 1, t(3)), "not running");
        assert!(
            !run.adopt_call("each[0]", json!("x"), 1, t(3)),
            "not running"
        );
        assert!(run.adopt_call("each[1]", json!("two"), 1, t(3)));
        assert!(!run.adopt_call("each[1]", json!("again"), 1, t(3)), "once");
        run.interrupt(t(4), "stopped".into());
        run.reset_for_resume(t(4), true);
        let mut s = Scheduler::new(
            wf(&MAP.replace("continue", "fail_fast")).unwrap(),
            run,
            1_000,
        );
        let step = s.start(t(5));
        assert_eq!(started(&step), [("each".into(), Some(2))]);
        let step = s.on_outcome("each", Some(2), ok(json!("three")), t(6));
        assert!(step.finished);
        assert_eq!(
            s.run().nodes["each"].output,
            Some(json!(["one", "two", "three"]))
        );
    }

    #[test]
    fn resume_runs_again_only_what_did_not_succeed() {
        let mut s = scheduler(&MAP.replace("continue", "fail_fast"), json!({}));
        s.start(t(0));
        s.on_outcome(
            "list",
            None,
            ok(json!({"items": [{"name": "a"}, {"name": "b"}, {"name": "c"}]})),
            t(1),
        );
        s.on_outcome("each", Some(0), ok(json!("one")), t(2));
        let mut run = s.run().clone();
        // The server stopped here, with elements 1 and 2 running.
        assert_eq!(run.last_progress(), t(2), "element 0 finished last");
        run.interrupt(t(3), "stopped".into());
        assert_eq!(run.status, RunStatus::Interrupted);
        assert_eq!(run.error.as_deref(), Some("stopped"));
        assert_eq!(run.nodes["each"].status, NodeStatus::Failed);
        run.reset_for_resume(t(3), true);
        assert_eq!((run.automatic_resumes, run.resumed_at), (1, Some(t(3))));
        let mut s = Scheduler::new(
            wf(&MAP.replace("continue", "fail_fast")).unwrap(),
            run,
            1_000,
        );
        let step = s.start(t(4));
        assert_eq!(
            started(&step),
            [("each".into(), Some(1)), ("each".into(), Some(2))]
        );
        s.on_outcome("each", Some(1), ok(json!("two")), t(5));
        let step = s.on_outcome("each", Some(2), ok(json!("three")), t(6));
        assert!(step.finished);
        assert_eq!(s.run().status, RunStatus::Succeeded);
        assert_eq!(
            s.run().nodes["each"].output,
            Some(json!(["one", "two", "three"]))
        );
        assert_eq!(s.run().nodes["list"].attempts, 1, "list was not run again");
        assert_eq!(s.run().resumes, 1);
    }
}
