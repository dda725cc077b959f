//! Agents over HTTP: `GET /v1/agents`, what a caller may start a session
//! with, like `/v1/tools` is for tools.
//!
//! client ──GET /v1/agents──▶ Sessions' agents + ToolRegistry ──▶ {agents: [...]}
//!
//! Each agent lists its tools as they resolve now (an `mcp_server.*`
//! pattern expands to the server's listed tools) with the plan each needs,
//! so a client can tell what a free session of the agent can do before
//! creating one. Every key may read it: agents are shared by all tenants
//! (a tenant narrows them through its config, never widens them). The
//! system prompt is not shown: it is the operator's, and may hold what the
//! operator does not want a tenant to read.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use crate::tools::Plan;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list))
}

/// One tool of an agent.
#[derive(Serialize, ToSchema)]
struct AgentTool {
    name: String,
    /// The lowest plan that may call it: `free`, `pro` or `premium`.
    required_plan: String,
}

/// An agent a session can be started with.
#[derive(Serialize, ToSchema)]
struct AgentView {
    name: String,
    description: String,
    /// The agent's tools, as offered to a premium session; a session of a
    /// lower plan is offered those its plan allows.
    tools: Vec<AgentTool>,
    /// The most tool rounds of one turn.
    max_iterations: u32,
    /// A message sent while a turn runs: `enqueue` or `reject`.
    multitask: String,
}

#[derive(Serialize, ToSchema)]
struct AgentList {
    agents: Vec<AgentView>,
}

#[utoipa::path(
    get,
    path = "/v1/agents",
    operation_id = "list_agents",
    summary = "The agents a session can be started with",
    tag = "sessions",
    responses((status = 200, description = "Every agent, by name", body = AgentList))
)]
async fn list(State(state): State<AppState>) -> Json<AgentList> {
    let agents = state
        .sessions
        .agents()
        .iter()
        .map(|agent| AgentView {
            name: agent.name.clone(),
            description: agent.description.clone(),
            tools: agent
                .tool_specs(&state.registry, Plan::Premium)
                .iter()
                .map(|spec| AgentTool {
                    required_plan: state
                        .registry
                        .get(&spec.name)
                        .map_or(Plan::Free, |t| t.definition.required_plan)
                        .as_str()
                        .to_string(),
                    name: spec.name.clone(),
                })
                .collect(),
            max_iterations: agent.max_iterations,
            multitask: agent.multitask.as_str().to_string(),
        })
        .collect();
    Json(AgentList { agents })
}
