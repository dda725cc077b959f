//! Workflows: DAGs of tool and agent nodes, run in parallel where the
//! graph allows, recorded node by node.
//!
//! agents/workflows/*.toml ──[`definition`] (checked at load, hot-reloaded)──▶ [`Workflows`]
//! POST /v1/workflows/{name}/runs ──▶ Workflows::start ──▶ [`runner`] actor (one per run)
//!        [`scheduler`] (pure: what starts, what is skipped, when it is over)
//!              │ tool node ──ExecuteTool (caller_type = workflow_node)──▶ executor (bypasses the pool)
//!              │ agent node ──Sessions::send_message──▶ Conversation actor ──▶ model
//!              ▼
//!        store ("workflow_runs" docs, "workflow_items" rows) · node events (SSE, CLI)
//!
//! - [`definition`]: the file format and its checks (cycles, references,
//!   tools and agents);
//! - [`template`]: `{{input.x}}` / `{{nodes.<id>.output.<path>}}` in params
//!   and prompts;
//! - [`condition`]: the `when` language;
//! - [`scheduler`]: the DAG decisions, no IO;
//! - [`runner`]: the actor that performs them;
//! - [`run`]: the stored run and its events;
//! - [`engine`]: the [`Workflows`] handle (definitions, runs, recovery,
//!   cancel, the depth guard);
//! - [`record`]: the stored form of a run (a document and a row per map
//!   element);
//! - [`limits`]: `[workflows]` in the server config (map elements, depth).
//!
//! Decisions that cross the modules:
//! - every tool call of a tool or map node is a `workflow_node` call with
//!   the run id as `workflow_id`, so `GET /v1/calls?workflow_id=<run id>`
//!   lists them. Agent nodes run conversation turns in a session whose
//!   metadata names the run and node: the tools such a turn calls are
//!   `workflow_node` calls too (outside the pool, recorded with the run id
//!   and with the session id as `conversation_id`);
//! - a run is one document, rewritten on every node transition (durably
//!   when something finished), plus one row per map element, written as
//!   the element moves; reading a run never needs the actor;
//! - runs that were in flight when the server stopped are resumed at the
//!   next start when their last progress is within `[sessions]
//!   resume_window_s` (what finished is not run again), and `interrupted`
//!   otherwise; never silently lost and never marked failed for what the
//!   shutdown did; `resume` continues an interrupted run by hand.

pub mod condition;
pub mod definition;
pub mod engine;
pub mod limits;
pub mod record;
pub mod run;
pub mod runner;
pub mod scheduler;
pub mod template;

pub use definition::{DefinitionError, OnError, Workflow};
pub use engine::{
    LoadIssue, Recovery, RunFilter, StartRun, WorkflowError, WorkflowReload, Workflows,
    WorkflowsDeps,
};
pub use limits::WorkflowLimits;
pub use run::{
    ItemRun, NodeRun, NodeStatus, RunStatus, WorkflowEvent, WorkflowEventKind, WorkflowRun,
};
