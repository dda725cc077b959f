//! The settings of one turn: the agent's, with the tenant's overrides and
//! the session's metadata applied. Data the machine and its queue read.
//!
//! agent file + tenant config + session ──▶ TurnSettings ──▶ ConversationMachine (next turn)

use std::sync::Arc;

use serde_json::Value;

use super::context::PromptLayers;
use crate::guardrails::Guardrails;
use crate::model::ToolSpec;
use crate::tenants::TenantConfig;
use crate::tools::output_schema::OutputSchema;

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
    /// What the turn promises and checks beyond its prompt (a typed
    /// answer, guardrails): one pointer, absent for most agents (a
    /// resident conversation holds these settings inline).
    pub rules: Option<Arc<TurnRules>>,
}

/// A turn's answer schema and guardrails ([`TurnSettings::rules`]).
#[derive(Debug, Clone, Default)]
pub struct TurnRules {
    /// The JSON shape the answer must have: the agent's `output_schema`,
    /// or the message's `response_format` for its turn.
    pub output_schema: Option<Arc<OutputSchema>>,
    /// The tenant's guardrails, then the agent's.
    pub guardrails: Guardrails,
    /// Where the turn's end is POSTed (a message's `webhook`;
    /// [`crate::webhooks`]).
    pub webhook: Option<String>,
    /// The turn's memory notes (`memory = { inject = true }`), sent after
    /// the summary ([`super::context::memory_message`]).
    pub memory: Option<String>,
}

impl TurnRules {
    /// `None` when there is nothing to promise or check.
    pub fn of(
        output_schema: Option<Arc<OutputSchema>>,
        guardrails: Guardrails,
    ) -> Option<Arc<Self>> {
        (output_schema.is_some() || !guardrails.is_empty()).then(|| {
            Arc::new(TurnRules {
                output_schema,
                guardrails,
                webhook: None,
                memory: None,
            })
        })
    }
}

impl TurnSettings {
    /// The answer schema of the turn, if any.
    pub fn output_schema(&self) -> Option<&Arc<OutputSchema>> {
        self.rules.as_ref().and_then(|r| r.output_schema.as_ref())
    }

    /// The turn's guardrails (empty for most agents).
    pub fn guardrails(&self) -> Option<&Guardrails> {
        self.rules
            .as_ref()
            .map(|r| &r.guardrails)
            .filter(|g| !g.is_empty())
    }

    /// The answer is checked before anyone sees it (an answer schema, or
    /// `output` guardrails): its deltas are held, and it is streamed whole
    /// once it passed.
    pub fn holds_answer(&self) -> bool {
        self.rules.as_ref().is_some_and(|r| {
            r.output_schema.is_some() || r.guardrails.has_stage(crate::guardrails::Stage::Output)
        })
    }

    /// The same rules with `schema` as the answer schema (a message's
    /// `response_format`).
    pub fn with_output_schema(&mut self, schema: Arc<OutputSchema>) {
        let mut rules = self.rules.as_deref().cloned().unwrap_or_default();
        rules.output_schema = Some(schema);
        self.rules = Some(Arc::new(rules));
    }

    /// The same rules with the turn's end POSTed to `url`.
    pub fn with_webhook(&mut self, url: String) {
        let mut rules = self.rules.as_deref().cloned().unwrap_or_default();
        rules.webhook = Some(url);
        self.rules = Some(Arc::new(rules));
    }

    /// The same rules with `notes` as the turn's memory notes.
    pub fn with_memory(&mut self, notes: String) {
        let mut rules = self.rules.as_deref().cloned().unwrap_or_default();
        rules.memory = Some(notes);
        self.rules = Some(Arc::new(rules));
    }

    /// The turn's memory notes, if any.
    pub fn memory_notes(&self) -> Option<&str> {
        self.rules.as_ref().and_then(|r| r.memory.as_deref())
    }

    /// Where the turn's end is POSTed, if anywhere.
    pub fn webhook(&self) -> Option<&str> {
        self.rules.as_ref().and_then(|r| r.webhook.as_deref())
    }

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
