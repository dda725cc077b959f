//! `Workflows`: the handle the HTTP layer, the CLI and embedders use —
//! the definitions (hot-reloaded from `agents/workflows/*.toml`) and the
//! runs (start, wait, read, list, resume, cancel; node events).
//!
//! http / CLI ──▶ Workflows ──start / resume──▶ WorkflowRunner (one actor per run, on the arbiters)
//!                    │◀── live state (watch) ◀───────┘
//!                    └── store: workflow_runs + workflow_items tables (read when the run is not live)
//!
//! Definitions follow the tool registry's reload rules: when no file
//! changed and every file loaded, nothing is re-checked; a bad file is
//! reported (`errors` in `GET /v1/workflows`, logged once) and the last
//! version of it that loaded stays live; two files naming one workflow: the
//! first by path keeps it. Definitions are checked against the tools and
//! agents of the moment they load, and files that did not load are checked
//! again at every rescan (a tool file added with them may load later); a
//! tool removed later makes the node fail at run time with
//! `TOOL_NOT_FOUND`.
//!
//! A run is durable (`running`, every node pending) before `start` returns.
//! It is stored as a document plus one row per map element
//! ([`super::record`]); every read here puts the two back together.
//! [`Workflows::resume`] re-runs an interrupted or failed run against the
//! workflow's current definition, keeping what succeeded.
//!
//! Restart ([`Workflows::recover`], once at start): a run still `running`
//! in the store that this node may take up ([`crate::store::Ownership::cut_runs`]: every one
//! on redb; in cluster mode its own and those of dead nodes) was cut by the
//! stop (a crash, or a shutdown: runners stop without writing). It is
//! claimed ([`crate::store::Ownership::claim_run`]: from then on its old owner cannot write
//! it), its running nodes and elements become failed as interrupted, then:
//! - when its last progress ([`WorkflowRun::last_progress`]: the latest
//!   start or end of a node or element, its last resume, its creation) is
//!   younger than `[sessions] resume_window_s`, it is resumed there and
//!   then through the same path as a client's resume: what succeeded (a
//!   node, a map element) keeps its output and is not run again, the rest
//!   runs; it counts in `resumes` and `automatic_resumes`. Start does not
//!   wait for it to finish.
//! - otherwise (or when it cannot be resumed: its workflow is gone) it is
//!   closed as `interrupted`, its error saying why, for a client to resume
//!   or cancel.
//!
//! Cluster mode: a run follows the owner/epoch rule of sessions keyed by
//! run id ([`crate::store::owners`]). The node that starts a run owns it;
//! every write of the run (its document, its elements) carries the epoch
//! it was claimed at. The runtime's takeover sweep calls
//! [`Workflows::take_up_cut_runs`] every `[cluster] owner_stale_s`: the
//! running runs of nodes whose heartbeat is stale are claimed (epoch + 1)
//! and taken up by the path above, so a dead node's run finishes on
//! another node, its finished tasks not run again. A runner fenced by such
//! a takeover (its node was paused, not dead) stops at its next write.
//! Decision: cancelling a run that another live node runs is refused
//! (`SESSION_MOVED`, 503: retry through that node), as is a resume of it
//! (`RUN_NOT_RESUMABLE`): this node cannot reach the other's runner.
//!
//! Only a runtime that serves the API takes cut runs up (the runtime
//! decides): `cadre workflow list`, `tools invoke`, `chat` or `mcp` on the
//! data dir of a crashed server leave them `running` in the store for the
//! next `cadre serve`, instead of resuming them in a process about to exit
//! (which would cut them again) or closing them before the server could
//! resume them.
//!
//! Decision: the window counts from the last progress the store holds, not
//! from the crash (which left no trace): a run whose one node ran for
//! longer than the window before the crash is closed, not resumed. That
//! errs on the side of not repeating old work unasked. A zero window
//! resumes nothing (the behaviour before automatic resume).
//!
//! A tool node (or map element) runs again on resume only if its call did
//! not finish: the node's or element's row is written (durably) as it
//! succeeds, before anything reads it; and for the instant between the
//! call's end and that write, the executor's call record (durable before
//! it answers a workflow call) is the outcome: a cut task whose call
//! succeeded takes the recorded output at start
//! ([`Workflows::recover`], by the run's calls newest first down to the
//! earliest cut start). An agent node's turn is not looked up that way: a
//! cut agent node runs its turn again in a new session.
//!
//! Cancel ([`Workflows::cancel`]): a live run's runner is told through its
//! cancellation token and the call returns the run as it ended; an
//! interrupted run (or one left `running` by a stopped runner) is marked
//! `cancelled` here. Decision: cancelling a run that is already over
//! (succeeded, failed, cancelled) changes nothing and returns it as it is,
//! so a repeated cancel answers the same; a cancelled run is final
//! (`resume` refuses it).
//!
//! Depth: a run started by a tool call of another run names that run
//! (`StartRun::parent_run`, from the `x-cadre-parent-run` header the HTTP
//! tools send) and is one deeper; a start past `[workflows] max_depth` is
//! refused (`WORKFLOW_DEPTH_EXCEEDED`), so a workflow that starts itself,
//! directly or through agents and tools, stops at the cap rather than at
//! the API's rate limit. The parent is looked up whatever its tenant (only
//! its depth is read), and an unknown parent counts as none.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::definition::{Catalog, DefinitionError, Workflow, load};
use super::limits::WorkflowLimits;
use super::record;
use super::run::{RUNS_NAMESPACE, RunStatus, WorkflowEvent, WorkflowEventKind, WorkflowRun};
use super::runner::{Live, LiveRun, RunnerDeps, WorkflowRunner, run_started};
use super::scheduler::{Owner, Scheduler, new_run};
use crate::agents::Agents;
use crate::conversation::Sessions;
use crate::error_code::{ErrorCode, PublicError};
use crate::executor::ExecutorHandle;
use crate::store::{CallFilter, Page, Store, StoreError, ToolCallRecord};
use crate::tenants::DEFAULT_TENANT;
use crate::tools::{CallerType, FieldError, ToolRegistry};

/// Node events buffered per subscriber.
pub const EVENT_CAPACITY: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    #[error("no workflow named '{name}'")]
    NotFound { name: String },
    #[error("no workflow run with id '{id}'")]
    RunNotFound { id: String },
    #[error("invalid input for workflow '{workflow}': {}", summary(errors))]
    InvalidInput {
        workflow: String,
        errors: Vec<FieldError>,
    },
    #[error("run '{id}' is {} and cannot be resumed (only failed or interrupted runs can)", status.as_str())]
    NotResumable { id: String, status: RunStatus },
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error(
        "run '{parent}' is at depth {parent_depth}: a run it starts would be deeper than `[workflows] max_depth` ({max})"
    )]
    TooDeep {
        parent: String,
        parent_depth: u32,
        max: u32,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl PublicError for WorkflowError {
    fn code(&self) -> ErrorCode {
        match self {
            WorkflowError::NotFound { .. } => ErrorCode::WorkflowNotFound,
            WorkflowError::RunNotFound { .. } => ErrorCode::RunNotFound,
            WorkflowError::InvalidInput { .. } => ErrorCode::ValidationError,
            WorkflowError::NotResumable { .. } => ErrorCode::RunNotResumable,
            WorkflowError::ShuttingDown => ErrorCode::ShuttingDown,
            WorkflowError::TooDeep { .. } => ErrorCode::WorkflowDepthExceeded,
            WorkflowError::Store(s) => s.code(),
        }
    }

    fn public_message(&self) -> String {
        match self {
            WorkflowError::Store(s) => s.public_message(),
            other => other.to_string(),
        }
    }

    fn details(&self) -> Option<Value> {
        match self {
            WorkflowError::InvalidInput { errors, .. } => {
                Some(serde_json::json!({ "validation_errors": errors }))
            }
            _ => None,
        }
    }
}

fn summary(errors: &[FieldError]) -> String {
    crate::tools::validate::describe_errors(errors, "; ")
}

/// A definition file that did not load.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct LoadIssue {
    pub file: String,
    pub message: String,
}

impl From<&DefinitionError> for LoadIssue {
    fn from(e: &DefinitionError) -> Self {
        LoadIssue {
            file: e.file().display().to_string(),
            message: e.to_string(),
        }
    }
}

/// What a reload changed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct WorkflowReload {
    pub added: Vec<String>,
    pub updated: Vec<String>,
    pub removed: Vec<String>,
    pub errors: Vec<LoadIssue>,
}

/// What a run is started with.
#[derive(Debug, Clone, Default)]
pub struct StartRun {
    /// Checked against the workflow's input schema (`null` counts as `{}`).
    pub input: Value,
    /// The owner; empty means the default tenant.
    pub tenant: String,
    /// The user the run's tool calls are made for (rate limits).
    pub user_id: Option<String>,
    /// The run whose tool call starts this one (see the module doc).
    pub parent_run: Option<String>,
    /// The starting caller's entitlement (the lower of its tenant's and
    /// its key's plan): the run's plan is the lower of it and the
    /// workflow's. `None`: no ceiling (the local operator's CLI).
    pub plan_ceiling: Option<crate::identity::Plan>,
    /// Where the run's end is POSTed, already checked
    /// ([`crate::webhooks::Webhooks::check`]).
    pub webhook: Option<String>,
    /// The run's id, chosen by the caller (a schedule's fire derives it
    /// from its slot): a start with the id of a run that exists returns
    /// that run and starts nothing, so starting again after a crash cannot
    /// run it twice. `None`: a new UUID v7.
    pub id: Option<String>,
}

/// Which runs to list.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub workflow: Option<String>,
    /// Whose runs: only this tenant's are read.
    pub tenant: String,
    /// At most this many, newest first (at least 1).
    pub limit: usize,
    /// The `next` of the previous page.
    pub cursor: Option<String>,
}

/// What the runtime hands the workflow engine.
pub struct WorkflowsDeps {
    /// The folder of workflow files (`<agents>/workflows`).
    pub dir: PathBuf,
    pub store: Store,
    pub sessions: Sessions,
    pub executor: ExecutorHandle,
    pub registry: ToolRegistry,
    /// Where runner actors live (spread round-robin).
    pub arbiters: Vec<actix::dev::ArbiterHandle>,
    pub limits: WorkflowLimits,
    /// Runs a restart cut are resumed at start when their last progress
    /// is younger than this (`[sessions] resume_window_s`; zero: never).
    pub resume_window: Duration,
}

/// What [`Workflows::recover`] did with the runs a restart cut.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
    /// Resumed at start (their runners are running).
    pub resumed: usize,
    /// Closed as `interrupted`: past the window, or not resumable (their
    /// workflow is gone, the store refused the write).
    pub interrupted: usize,
}

/// Runs taken up at once at start (their writes share group commits).
const TAKE_UP_PARALLELISM: usize = 64;

/// The run error of a run a restart cut.
const CUT: &str = "the server stopped while the run was in flight";

struct FileState {
    text: String,
    /// The last version of this file that loaded.
    workflow: Option<Arc<Workflow>>,
}

#[derive(Default)]
struct Defs {
    files: BTreeMap<PathBuf, FileState>,
    by_name: BTreeMap<String, Arc<Workflow>>,
    errors: Vec<LoadIssue>,
}

#[derive(Clone)]
pub struct Workflows {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    defs: RwLock<Defs>,
    registry: ToolRegistry,
    agents: Agents,
    deps: RunnerDeps,
    arbiters: Vec<actix::dev::ArbiterHandle>,
    next_arbiter: AtomicUsize,
    limits: WorkflowLimits,
    resume_window: Duration,
}

struct Known<'a> {
    registry: &'a ToolRegistry,
    agents: &'a Agents,
}

impl Catalog for Known<'_> {
    fn has_tool(&self, name: &str) -> bool {
        self.registry.contains(name)
    }
    fn has_agent(&self, name: &str) -> bool {
        self.agents.get(name).is_some()
    }
}

impl Workflows {
    /// Builds the engine and loads the definitions (blocking file IO).
    pub fn new(deps: WorkflowsDeps) -> Self {
        assert!(!deps.arbiters.is_empty(), "workflows need an arbiter");
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        let agents = deps.sessions.agents().clone();
        let workflows = Workflows {
            inner: Arc::new(Inner {
                dir: deps.dir,
                defs: RwLock::default(),
                registry: deps.registry,
                agents,
                deps: RunnerDeps {
                    executor: deps.executor,
                    sessions: deps.sessions,
                    store: deps.store,
                    events,
                    live: Live::default(),
                    stopping: Arc::default(),
                },
                arbiters: deps.arbiters,
                next_arbiter: AtomicUsize::new(0),
                limits: deps.limits,
                resume_window: deps.resume_window,
            }),
        };
        workflows.reload();
        workflows
    }

    /// The folder the definitions come from.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Live definitions, by name.
    pub fn definitions(&self) -> Vec<Arc<Workflow>> {
        self.read_defs().by_name.values().cloned().collect()
    }

    pub fn definition(&self, name: &str) -> Option<Arc<Workflow>> {
        self.read_defs().by_name.get(name).cloned()
    }

    /// Files that did not load at the last reload.
    pub fn load_errors(&self) -> Vec<LoadIssue> {
        self.read_defs().errors.clone()
    }

    /// Brings the definitions in line with the folder. Blocking (file IO):
    /// call it from a blocking thread once the runtime runs.
    pub fn reload(&self) -> WorkflowReload {
        let texts = read_dir_texts(&self.inner.dir);
        let mut defs = self.inner.defs.write().expect("workflow definitions lock");
        let unchanged = texts.len() == defs.files.len()
            && texts.iter().all(|(p, t)| {
                defs.files
                    .get(p)
                    .is_some_and(|f| Some(&f.text) == t.as_ref())
            });
        // Files that did not load are checked again even when unchanged: a
        // tool or a file they need may have arrived since.
        if unchanged && defs.errors.is_empty() {
            return WorkflowReload::default();
        }
        let known = Known {
            registry: &self.inner.registry,
            agents: &self.inner.agents,
        };
        let mut report = WorkflowReload::default();
        let mut files = BTreeMap::new();
        let mut changed_text = Vec::new();
        for (path, text) in texts {
            let Some(text) = text else {
                report.errors.push(LoadIssue {
                    file: path.display().to_string(),
                    message: format!("{}: cannot read the file", path.display()),
                });
                continue;
            };
            let previous = defs.files.remove(&path);
            if previous.as_ref().is_none_or(|p| p.text != text) {
                changed_text.push(path.clone());
            }
            let workflow = match load(&path, &text, &known) {
                Ok(w) => Some(w),
                Err(e) => {
                    report.errors.push(LoadIssue::from(&e));
                    previous.and_then(|p| p.workflow)
                }
            };
            files.insert(path, FileState { text, workflow });
        }
        let mut by_name: BTreeMap<String, Arc<Workflow>> = BTreeMap::new();
        for (path, f) in &files {
            let Some(w) = &f.workflow else { continue };
            if let Some(first) = by_name.get(&w.name) {
                report.errors.push(LoadIssue {
                    file: path.display().to_string(),
                    message: format!(
                        "{}: workflow '{}' is also defined in {}; this file is skipped",
                        path.display(),
                        w.name,
                        first.file.display()
                    ),
                });
                continue;
            }
            by_name.insert(w.name.clone(), w.clone());
        }
        for (name, w) in &by_name {
            match defs.by_name.get(name) {
                None => report.added.push(name.clone()),
                Some(_) if changed_text.contains(&w.file) => report.updated.push(name.clone()),
                Some(_) => {}
            }
        }
        for name in defs.by_name.keys() {
            if !by_name.contains_key(name) {
                report.removed.push(name.clone());
            }
        }
        defs.files = files;
        defs.by_name = by_name;
        let known_errors = std::mem::replace(&mut defs.errors, report.errors.clone());
        drop(defs);
        for e in report.errors.iter().filter(|e| !known_errors.contains(e)) {
            tracing::warn!(file = %e.file, "workflow not loaded: {}", e.message);
        }
        for (names, what) in [
            (&report.added, "added"),
            (&report.updated, "updated"),
            (&report.removed, "removed"),
        ] {
            for name in names {
                tracing::info!(workflow = %name, "workflow {what}");
            }
        }
        report
    }

    /// Takes up the runs a previous process left `running` (see the
    /// module doc): each one whose last progress is younger than the
    /// resume window is resumed now, the others are closed as
    /// `interrupted`. Also indexes by tenant the runs stored before that
    /// index existed. Call once at startup, before any run starts; it
    /// returns once the resumed runs are launched, not finished.
    /// `take_up: false` only indexes: the cut runs stay as stored, for a
    /// later process to take up (a CLI command's short-lived runtime).
    pub async fn recover(&self, take_up: bool) -> Result<Recovery, WorkflowError> {
        let store = &self.inner.deps.store;
        store.index_docs(RUNS_NAMESPACE, run_tenant).await?;
        if !take_up {
            return Ok(Recovery::default());
        }
        self.take_up_cut_runs().await
    }

    /// Takes up the runs left `running` by a node that stopped: this
    /// node's own after a restart, and (cluster mode) those of nodes whose
    /// heartbeat is stale, each claimed first ([`crate::store::Ownership::claim_run`]) so
    /// its old owner can no longer write it. What [`Self::recover`] does at
    /// start, and the runtime's takeover sweep every so often.
    pub async fn take_up_cut_runs(&self) -> Result<Recovery, WorkflowError> {
        let store = &self.inner.deps.store;
        let now = Timestamp::now();
        let window = self.inner.resume_window;
        let mut cut = Vec::new();
        for id in store.cut_runs().await? {
            if self.is_live(&id) {
                continue;
            }
            let claim = match store.claim_run(&id).await {
                Ok(c) => c,
                // Taken by another node, or its owner came back.
                Err(StoreError::RunOwnedElsewhere { .. } | StoreError::RunFenced { .. }) => {
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let run = match record::load(store, &id).await {
                Ok(Some(run)) if run.status == RunStatus::Running => run,
                Ok(_) => continue,
                Err(e) => {
                    tracing::error!(run = %id, error = %e, "unreadable workflow run skipped");
                    continue;
                }
            };
            if let Some(from) = &claim.took_over_from {
                tracing::info!(run = %id, from = %from, epoch = claim.epoch, "workflow run of a dead node taken over");
            }
            cut.push((run, claim.epoch));
        }
        // Each run is taken up on its own; their durable writes share the
        // store's group commits.
        let taken: Vec<Result<bool, WorkflowError>> = futures::stream::iter(cut)
            .map(|(run, epoch)| self.take_up_run(run, epoch, now, window))
            .buffer_unordered(TAKE_UP_PARALLELISM)
            .collect()
            .await;
        let mut recovery = Recovery::default();
        let mut failed = None;
        for taken in taken {
            match taken {
                Ok(true) => recovery.resumed += 1,
                Ok(false) => recovery.interrupted += 1,
                Err(e) => failed = Some(e),
            }
        }
        if recovery.resumed + recovery.interrupted > 0 {
            tracing::info!(
                resumed = recovery.resumed,
                interrupted = recovery.interrupted,
                window_s = window.as_secs_f64(),
                "workflow runs cut by the last stop: {} resumed, {} closed as interrupted",
                recovery.resumed,
                recovery.interrupted
            );
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(recovery),
        }
    }

    /// Takes up one run a restart cut (see [`Self::recover`]): true when
    /// it was resumed, false when it was closed as interrupted.
    async fn take_up_run(
        &self,
        mut run: WorkflowRun,
        epoch: u64,
        now: Timestamp,
        window: Duration,
    ) -> Result<bool, WorkflowError> {
        let store = &self.inner.deps.store;
        let id = run.id.clone();
        let adopted = self.adopt_finished_calls(&mut run).await?;
        // A clock set back since counts as no time at all.
        let age = Duration::try_from(now.duration_since(run.last_progress())).unwrap_or_default();
        run.interrupt(now, CUT.into());
        let not_resumed = if age < window {
            match self.relaunch(run.clone(), true, Some(epoch)).await {
                Ok(resumed) => {
                    tracing::info!(
                        run = %id,
                        workflow = %resumed.workflow,
                        idle_s = age.as_secs(),
                        resumes = resumed.resumes,
                        adopted,
                        "workflow run cut by a restart: resumed (what finished is not run again)"
                    );
                    return Ok(true);
                }
                Err(e) => format!("{CUT}; it could not be resumed at start: {e}"),
            }
        } else {
            format!(
                "{CUT}; its last progress was {} s before the restart, past `[sessions] resume_window_s` ({} s), so it was not resumed",
                age.as_secs(),
                window.as_secs_f64()
            )
        };
        run.error = Some(not_resumed);
        record::save_fenced(store, &run, epoch, true).await?;
        tracing::warn!(
            run = %id,
            workflow = %run.workflow,
            idle_s = age.as_secs(),
            adopted,
            "workflow run cut by a restart: interrupted ({}); POST /v1/workflows/runs/{id}/resume finishes it",
            run.error.as_deref().unwrap_or_default()
        );
        Ok(false)
    }

    /// Gives the running tool nodes and map elements of a run the stop
    /// cut the outcome of their call when it succeeded but its result was
    /// not stored (the executor records a workflow call durably before it
    /// answers; the runner stores the result after): they are not run
    /// again. Reads the run's call records newest first, down to the
    /// earliest start among them. Returns how many it gave.
    async fn adopt_finished_calls(&self, run: &mut WorkflowRun) -> Result<usize, WorkflowError> {
        let running: BTreeMap<String, Timestamp> = run.running_tasks().into_iter().collect();
        let Some(earliest) = running.values().min().copied() else {
            return Ok(0);
        };
        let prefix = format!("workflow:{}/", run.workflow);
        let filter = CallFilter {
            workflow_id: Some(run.id.clone()),
            ..CallFilter::default()
        };
        let mut adopted = 0;
        let mut before = None;
        loop {
            let page = self
                .inner
                .deps
                .store
                .calls_of(&run.tenant, filter.clone(), before, 256)
                .await?;
            for call in page.items {
                // Records are listed by their id, a UUID v7 made when the
                // record was written: past one written before the earliest
                // start, none is of these tasks.
                if recorded_at(&call).is_some_and(|t| t < earliest) {
                    return Ok(adopted);
                }
                let Some(task) = call.caller_id.strip_prefix(&prefix) else {
                    continue;
                };
                // An agent node's turn makes `workflow_node` calls too,
                // as its session: never a node's own outcome.
                if call.is_success
                    && call.caller_type == CallerType::WorkflowNode.as_str()
                    && call.conversation_id.is_none()
                    && running.contains_key(task)
                    && run.adopt_call(
                        task,
                        call.output.unwrap_or(Value::Null),
                        call.attempts.max(1),
                        call.created_at,
                    )
                {
                    tracing::info!(run = %run.id, %task, "the cut task's call had finished: its recorded output is kept, not run again");
                    adopted += 1;
                }
            }
            match page.next {
                Some(next) => before = Some(next),
                None => return Ok(adopted),
            }
        }
    }

    /// Starts a run; returns it as stored (running, every node pending).
    pub async fn start(&self, name: &str, start: StartRun) -> Result<WorkflowRun, WorkflowError> {
        if self.stopping() {
            return Err(WorkflowError::ShuttingDown);
        }
        let workflow = self
            .definition(name)
            .ok_or_else(|| WorkflowError::NotFound { name: name.into() })?;
        let input = if start.input.is_null() {
            json!({})
        } else {
            start.input
        };
        let input =
            workflow
                .input
                .validate(input)
                .map_err(|errors| WorkflowError::InvalidInput {
                    workflow: name.into(),
                    errors,
                })?;
        if let Some(id) = &start.id
            && let Some(run) = self.existing(id).await?
        {
            return Ok(run);
        }
        let id = start
            .id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let tenant = if start.tenant.is_empty() {
            DEFAULT_TENANT.to_string()
        } else {
            start.tenant
        };
        let owner = Owner {
            tenant,
            user_id: start.user_id,
        };
        let depth = self.depth_under(start.parent_run.as_deref()).await?;
        let mut run = new_run(&workflow, id, input, owner, Timestamp::now());
        run.depth = depth;
        run.parent_run = start.parent_run.filter(|_| depth > 0);
        run.node = self.inner.deps.store.node_id().map(str::to_string);
        run.plan = start.plan_ceiling.map(|c| c.min(workflow.plan));
        run.webhook = start.webhook;
        let cache_ttl = self.cache_policy(&run.tenant).await;
        let live = self.claim(&run)?;
        // Stored, then claimed: the write that creates the run makes this
        // node its owner; the claim returns the epoch its runner writes at.
        let store = &self.inner.deps.store;
        let epoch = match record::save(store, &run, true).await {
            Ok(()) => store.claim_run(&run.id).await.map(|c| c.epoch),
            Err(e) => Err(e),
        };
        let epoch = match epoch {
            Ok(epoch) => epoch,
            Err(e) => {
                self.release(&run.id);
                return Err(e.into());
            }
        };
        self.launch(workflow, run.clone(), live, cache_ttl, epoch);
        Ok(run)
    }

    /// The depth of a run started by `parent`'s tool call; refused past
    /// `max_depth`.
    async fn depth_under(&self, parent: Option<&str>) -> Result<u32, WorkflowError> {
        let Some(parent) = parent.filter(|p| p.len() <= crate::identity::MAX_ID_BYTES) else {
            return Ok(0);
        };
        let parent_depth = match self.live_state(parent) {
            Some(run) => run.depth,
            None => match self
                .inner
                .deps
                .store
                .get_doc(RUNS_NAMESPACE, parent)
                .await?
            {
                Some(doc) => doc.get("depth").and_then(Value::as_u64).unwrap_or(0) as u32,
                None => return Ok(0),
            },
        };
        let max = self.inner.limits.max_depth;
        if parent_depth >= max {
            return Err(WorkflowError::TooDeep {
                parent: parent.to_string(),
                parent_depth,
                max,
            });
        }
        Ok(parent_depth + 1)
    }

    /// Resumes a failed or interrupted run: nodes not yet succeeded run
    /// again. Returns the run as it restarts.
    pub async fn resume(&self, id: &str) -> Result<WorkflowRun, WorkflowError> {
        if self.stopping() {
            return Err(WorkflowError::ShuttingDown);
        }
        if let Some(live) = self.live_state(id) {
            return Err(WorkflowError::NotResumable {
                id: id.into(),
                status: live.status,
            });
        }
        let run = self.stored(id).await?;
        if !matches!(run.status, RunStatus::Failed | RunStatus::Interrupted) {
            return Err(WorkflowError::NotResumable {
                id: id.into(),
                status: run.status,
            });
        }
        self.relaunch(run, false, None).await
    }

    /// The one way a failed or interrupted run goes again, for a client's
    /// resume and the server's at start (`automatic`): against the
    /// workflow's current definition, durable as running before its
    /// runner starts, keeping what succeeded.
    /// `epoch`: the claim the caller made already (a cut run taken up);
    /// `None`: claimed here.
    async fn relaunch(
        &self,
        mut run: WorkflowRun,
        automatic: bool,
        epoch: Option<u64>,
    ) -> Result<WorkflowRun, WorkflowError> {
        let workflow = self
            .definition(&run.workflow)
            .ok_or_else(|| WorkflowError::NotFound {
                name: run.workflow.clone(),
            })?;
        run.reset_for_resume(Timestamp::now(), automatic);
        run.node = self.inner.deps.store.node_id().map(str::to_string);
        let cache_ttl = self.cache_policy(&run.tenant).await;
        let live = self.claim(&run)?;
        let store = &self.inner.deps.store;
        let epoch = match epoch {
            Some(epoch) => Ok(epoch),
            None => store.claim_run(&run.id).await.map(|c| c.epoch),
        };
        let written = match epoch {
            Ok(epoch) => record::save_fenced(store, &run, epoch, true)
                .await
                .map(|()| epoch),
            Err(e) => Err(e),
        };
        let epoch = match written {
            Ok(epoch) => epoch,
            Err(e) => {
                self.release(&run.id);
                // Another live node runs it (it was resumed there).
                if let StoreError::RunOwnedElsewhere { .. } = e {
                    return Err(WorkflowError::NotResumable {
                        id: run.id.clone(),
                        status: RunStatus::Running,
                    });
                }
                return Err(e.into());
            }
        };
        self.launch(workflow, run.clone(), live, cache_ttl, epoch);
        Ok(run)
    }

    /// Cancels a run (see the module doc); returns it as it ended.
    pub async fn cancel(&self, id: &str) -> Result<WorkflowRun, WorkflowError> {
        let live = self
            .inner
            .deps
            .live
            .lock()
            .expect("live runs lock")
            .get(id)
            .cloned();
        if let Some(live) = live {
            live.cancel.cancel();
            return self.wait(id).await;
        }
        let mut run = self.stored(id).await?;
        if !matches!(run.status, RunStatus::Interrupted | RunStatus::Running) {
            return Ok(run);
        }
        // Held live while it is written, so a resume cannot start under it.
        let Ok(_claimed) = self.claim(&run) else {
            return Box::pin(self.cancel(id)).await;
        };
        // Cluster mode: a run another live node runs is not written here.
        let store = &self.inner.deps.store;
        let epoch = match store.claim_run(&run.id).await {
            Ok(c) => c.epoch,
            Err(e) => {
                self.release(&run.id);
                return Err(e.into());
            }
        };
        let items = run.cancel(Timestamp::now());
        let written = store
            .write(
                record::fenced(&run.id, epoch, record::ops(&run, true, &items)),
                true,
            )
            .await;
        self.release(&run.id);
        written?;
        let _ = self.inner.deps.events.send(WorkflowEvent {
            run_id: run.id.clone(),
            at: Timestamp::now(),
            kind: WorkflowEventKind::RunFinished {
                status: run.status,
                error: run.error.clone(),
            },
        });
        Ok(run)
    }

    /// The run's current state.
    pub async fn get(&self, id: &str) -> Result<WorkflowRun, WorkflowError> {
        match self.live_state(id) {
            Some(run) => Ok(run),
            None => self.stored(id).await,
        }
    }

    /// The run with this caller-chosen id, if it was started already
    /// (live on this node, or stored).
    async fn existing(&self, id: &str) -> Result<Option<WorkflowRun>, WorkflowError> {
        if let Some(run) = self.live_state(id) {
            return Ok(Some(run));
        }
        match self.stored(id).await {
            Ok(run) => Ok(Some(run)),
            Err(WorkflowError::RunNotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Waits until the run is no longer running; returns its final state.
    pub async fn wait(&self, id: &str) -> Result<WorkflowRun, WorkflowError> {
        let rx = self
            .inner
            .deps
            .live
            .lock()
            .expect("live runs lock")
            .get(id)
            .map(|l| l.state.clone());
        if let Some(mut rx) = rx
            && let Ok(run) = rx.wait_for(|r| r.status.is_terminal()).await
        {
            return Ok(run.clone());
        }
        // Not live (finished already), or its runner stopped (shutdown).
        self.stored(id).await
    }

    /// A page of the tenant's runs matching the filter, newest first. Reads
    /// only the tenant's runs (by its index), until the page is full.
    pub async fn list(&self, filter: RunFilter) -> Result<Page<WorkflowRun>, WorkflowError> {
        let limit = filter.limit.max(1);
        let store = &self.inner.deps.store;
        let mut out: Vec<WorkflowRun> = Vec::new();
        let mut cursor = filter.cursor;
        'pages: loop {
            let page = store
                .docs_of(RUNS_NAMESPACE, &filter.tenant, cursor, limit, true)
                .await?;
            for (id, doc) in page.items {
                let run = match self.live_state(&id) {
                    Some(run) => run,
                    None => match serde_json::from_value::<WorkflowRun>(doc) {
                        Ok(mut run) => {
                            record::attach_items(store, &mut run).await?;
                            run
                        }
                        Err(e) => {
                            tracing::error!(run = %id, error = %e, "unreadable workflow run skipped");
                            continue;
                        }
                    },
                };
                if filter.workflow.as_ref().is_some_and(|w| *w != run.workflow) {
                    continue;
                }
                out.push(run);
                if out.len() > limit {
                    break 'pages;
                }
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        let next = if out.len() > limit {
            out.truncate(limit);
            out.last().map(|r| r.id.clone())
        } else {
            None
        };
        Ok(Page { items: out, next })
    }

    /// Node events of every run (filter by `run_id`).
    pub fn subscribe(&self) -> broadcast::Receiver<WorkflowEvent> {
        self.inner.deps.events.subscribe()
    }

    /// Stops taking runs; runners stop without recording what the
    /// shutdown does to their tasks. Called by the runtime as it stops.
    pub fn shutdown(&self) {
        self.inner.deps.stopping.store(true, Ordering::SeqCst);
    }

    fn stopping(&self) -> bool {
        self.inner.deps.stopping.load(Ordering::SeqCst)
    }

    fn is_live(&self, id: &str) -> bool {
        self.inner
            .deps
            .live
            .lock()
            .expect("live runs lock")
            .contains_key(id)
    }

    fn live_state(&self, id: &str) -> Option<WorkflowRun> {
        self.inner
            .deps
            .live
            .lock()
            .expect("live runs lock")
            .get(id)
            .map(|l| l.state.borrow().clone())
    }

    /// Registers `run` as live; refuses a run that already is.
    fn claim(&self, run: &WorkflowRun) -> Result<Claim, WorkflowError> {
        let mut live = self.inner.deps.live.lock().expect("live runs lock");
        if let Some(l) = live.get(&run.id) {
            return Err(WorkflowError::NotResumable {
                id: run.id.clone(),
                status: l.state.borrow().status,
            });
        }
        let (tx, rx) = watch::channel(run.clone());
        let cancel = CancellationToken::new();
        live.insert(
            run.id.clone(),
            LiveRun {
                state: rx,
                cancel: cancel.clone(),
            },
        );
        Ok(Claim { state: tx, cancel })
    }

    fn release(&self, id: &str) {
        self.inner
            .deps
            .live
            .lock()
            .expect("live runs lock")
            .remove(id);
    }

    /// The result-cache TTL the tenant's config sets for its calls.
    async fn cache_policy(&self, tenant: &str) -> Option<u64> {
        match self.inner.deps.sessions.tenant_config(tenant).await {
            Ok(c) if !c.tool_config.cache_enabled => Some(0),
            Ok(c) => c.tool_config.cache_ttl_seconds,
            Err(e) => {
                tracing::warn!(%tenant, error = %e, "tenant config unreadable; tool defaults apply");
                None
            }
        }
    }

    fn launch(
        &self,
        workflow: Arc<Workflow>,
        run: WorkflowRun,
        claim: Claim,
        cache_ttl: Option<u64>,
        epoch: u64,
    ) {
        let _ = self.inner.deps.events.send(run_started(&run));
        let n = self.inner.next_arbiter.fetch_add(1, Ordering::Relaxed);
        let arbiter = &self.inner.arbiters[n % self.inner.arbiters.len()];
        WorkflowRunner::launch(
            arbiter,
            Scheduler::new(workflow, run, self.inner.limits.max_map_elements),
            self.inner.deps.clone(),
            claim.state,
            claim.cancel,
            cache_ttl,
            epoch,
        );
    }

    async fn stored(&self, id: &str) -> Result<WorkflowRun, WorkflowError> {
        if id.len() > crate::identity::MAX_ID_BYTES {
            return Err(WorkflowError::RunNotFound {
                id: crate::identity::quoted_id(id),
            });
        }
        record::load(&self.inner.deps.store, id)
            .await?
            .ok_or_else(|| WorkflowError::RunNotFound { id: id.into() })
    }

    fn read_defs(&self) -> std::sync::RwLockReadGuard<'_, Defs> {
        self.inner.defs.read().expect("workflow definitions lock")
    }
}

/// When a call record was written (its id's UUID v7 time, to the
/// millisecond, rounded up).
fn recorded_at(call: &ToolCallRecord) -> Option<Timestamp> {
    let (secs, nanos) = uuid::Uuid::parse_str(&call.record_id)
        .ok()?
        .get_timestamp()?
        .to_unix();
    let t = Timestamp::new(i64::try_from(secs).ok()?, i32::try_from(nanos).ok()?).ok()?;
    t.checked_add(jiff::SignedDuration::from_millis(1)).ok()
}

/// The tenant of a stored run (for [`crate::store::DocReads::index_docs`]).
fn run_tenant(doc: &Value) -> Option<String> {
    serde_json::from_value::<WorkflowRun>(doc.clone())
        .ok()
        .map(|r| r.tenant)
}

/// A run registered live: its state's sender and its cancel token, for
/// the runner.
struct Claim {
    state: watch::Sender<WorkflowRun>,
    cancel: CancellationToken,
}

/// `*.toml` directly in `dir`, sorted, with their text (`None`: unreadable).
fn read_dir_texts(dir: &Path) -> Vec<(PathBuf, Option<String>)> {
    let mut paths: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "toml"))
            .collect(),
        Err(_) => Vec::new(),
    };
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).ok();
            (p, text)
        })
        .collect()
}
