//! The settings of one turn: the agent's, with the tenant's overrides and
//! the session's metadata applied. Data the machine and its queue read.
//!
//! agent file + tenant config + session ──▶ TurnSettings ──▶ ConversationMachine (next turn)

use serde_json::Value;

use super::context::PromptLayers;
use crate::model::ToolSpec;
use crate::tenants::TenantConfig;

/// Per-turn settings: the agent's, with the tenant's overrides applied.
#[derive(Debug, Clone)]
pub struct TurnSettings {
    /// Layers 1-3 and the single-tool-use option (whether tools are
    /// offered is decided from `tools`).
    pub layers: PromptLayers,
    pub model: String,
    /// The agent's specs, shared by its conversations (see
    /// [`crate::tools::ToolRegistry::specs_for`]).
    pub tools: std::sync::Arc<[ToolSpec]>,
    pub max_iterations: u32,
    /// (`u32`, as `max_tool_calls`: a resident conversation holds these
    /// settings inline, and the two pack beside `max_iterations`.)
    pub history_window: u32,
    pub temperature: Option<f32>,
    pub max_tokens: Option<u32>,
    /// Handed to every tool call (`ExecutionContext.variables`), e.g. the site.
    pub tool_variables: Value,
    /// Result-cache TTL for this turn's calls (`Some(0)`: no cache; `None`: the tools').
    pub cache_ttl: Option<u64>,
    /// Tool calls of one model reply that are kept (`[model]
    /// max_tool_calls`); the machine drops the others before anything is
    /// stored or run.
    pub max_tool_calls: u32,
    /// A call held for a person's confirmation pauses the turn
    /// (`awaiting_approval`) instead of handing the model the
    /// `CONFIRMATION_REQUIRED` error. Off for sessions a workflow's agent
    /// node runs: no person waits on those.
    pub pause_for_approval: bool,
    /// The JSON shape the turn's answer must have: the agent's
    /// `output_schema`, or the message's `response_format` for its turn.
    pub output_schema: Option<std::sync::Arc<crate::tools::output_schema::OutputSchema>>,
}

impl TurnSettings {
    /// Applies a tenant's overrides to the agent's settings for one turn
    /// (what each field does: [`crate::tenants::config`]).
    pub fn apply_tenant(&mut self, tenant: &TenantConfig) {
        if let Some(p) = tenant
            .custom_system_prompt
            .as_ref()
            .filter(|p| !p.trim().is_empty())
        {
            self.layers.base_prompt = p.as_str().into();
        }
        if let Some(m) = &tenant.preferred_model {
            self.model = m.clone();
        }
        if tenant.temperature.is_some() {
            self.temperature = tenant.temperature;
        }
        if tenant.max_response_tokens.is_some() {
            self.max_tokens = tenant.max_response_tokens;
        }
        let tc = &tenant.tool_config;
        if let Some(n) = tc.max_iterations {
            self.max_iterations = n;
        }
        if !tc.fetch_page_enabled {
            self.tools = self
                .tools
                .iter()
                .filter(|t| t.name != "fetch_page")
                .cloned()
                .collect();
        }
        if let Some(paths) = &tc.allowed_paths
            && let Some(site) = self.tool_variables.get_mut("site")
        {
            site["allowed_paths"] = serde_json::json!(paths);
        }
        self.cache_ttl = if !tc.cache_enabled {
            Some(0)
        } else {
            tc.cache_ttl_seconds
        };
    }
}
