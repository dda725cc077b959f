//! Memory tools: `remember` and `recall`, offered to the agents whose file
//! says `memory = ...`.
//!
//! agent files (`memory = true` or `{namespace = [...]}`) ──agents::publish_agent_tools──▶ [`memory_tools`] (agent layer)
//! executor ──Remember/Recall::call──▶ [`MemoryTools`] (the `memory` layer's store, plugged
//!     in at start through [`MemorySlot`]) ──▶ the namespace of the call's user or tenant
//!
//! The tool layer owns the seam and the tools' shape; what remembering
//! means (the namespace template, the item, BM25 recall) lives in
//! `memory`, above it. Like the `ask_` tools, they are in the registry's
//! agent layer: not in the catalog, reachable only from a turn that
//! offered them, so a direct call or a workflow tool node cannot name
//! them. They are builtin-entry calls otherwise: validated, rate-limited,
//! recorded, visible as any call. `remember` is `idempotent` (a replay
//! with the call's idempotency key writes the same item), never cached;
//! `recall` has no side effects, never cached (memory changes between turns).

use std::sync::{Arc, OnceLock, Weak};

use serde_json::{Value, json};

use super::definition::{CacheSpec, SideEffects, ToolDefinition};
use super::{ExecutionContext, ToolError, ToolHandler};

pub const REMEMBER: &str = "remember";
pub const RECALL: &str = "recall";
/// Longest `text` `remember` takes (an item's value is at most 64 KiB).
pub const MAX_TEXT_BYTES: usize = 16 * 1024;
/// Most items `recall` returns.
pub const MAX_RECALL: u64 = 20;

/// What the memory tools ask of the layer that keeps memory.
#[async_trait::async_trait]
pub trait MemoryTools: Send + Sync + 'static {
    /// Stores `text` (under `key`, else a key derived from the call's
    /// idempotency key) in the calling turn's memory namespace.
    async fn remember(
        &self,
        text: String,
        key: Option<String>,
        ctx: &ExecutionContext,
    ) -> Result<Value, ToolError>;

    /// The `limit` items of the calling turn's namespace that match
    /// `query` best.
    async fn recall(
        &self,
        query: String,
        limit: usize,
        ctx: &ExecutionContext,
    ) -> Result<Value, ToolError>;
}

/// Where the runtime plugs the memory in (the registry is built before
/// it). Held weakly: the registry must not keep the memory alive.
#[derive(Clone, Default)]
pub struct MemorySlot(Arc<OnceLock<Weak<dyn MemoryTools>>>);

impl MemorySlot {
    /// Plugs `memory` in; a second call is ignored.
    pub fn set(&self, memory: Weak<dyn MemoryTools>) {
        let _ = self.0.set(memory);
    }

    fn get(&self) -> Result<Arc<dyn MemoryTools>, ToolError> {
        self.0
            .get()
            .and_then(Weak::upgrade)
            .ok_or_else(|| ToolError::Unavailable {
                message: "memory is not available: the runtime is stopping".into(),
            })
    }
}

struct Remember(MemorySlot);

#[async_trait::async_trait]
impl ToolHandler for Remember {
    async fn call(&self, params: Value, ctx: &ExecutionContext) -> Result<Value, ToolError> {
        let text = params["text"]
            .as_str()
            .unwrap_or_default()
            .trim()
            .to_string();
        if text.is_empty() {
            return Err(ToolError::invalid("`text` must say what to remember"));
        }
        let key = params["key"].as_str().map(str::to_string);
        self.0.get()?.remember(text, key, ctx).await
    }
}

struct Recall(MemorySlot);

#[async_trait::async_trait]
impl ToolHandler for Recall {
    async fn call(&self, params: Value, ctx: &ExecutionContext) -> Result<Value, ToolError> {
        let query = params["query"].as_str().unwrap_or_default().to_string();
        let limit = params["limit"].as_u64().unwrap_or(5).clamp(1, MAX_RECALL) as usize;
        self.0.get()?.recall(query, limit, ctx).await
    }
}

fn definition(
    name: &str,
    description: &str,
    parameters: Value,
    effects: SideEffects,
) -> ToolDefinition {
    let mut def = ToolDefinition::new(name, description, parameters).with_category("memory");
    def.side_effects = effects;
    def.cache = Some(CacheSpec { ttl_seconds: 0 });
    def
}

/// `remember` and `recall`, bound to `slot`.
pub fn memory_tools(slot: &MemorySlot) -> Vec<(ToolDefinition, Arc<dyn ToolHandler>)> {
    vec![
        (
            definition(
                REMEMBER,
                "Remember a fact about the user (or the team) for later conversations: one short, self-contained statement. Giving a `key` replaces what was remembered under it.",
                json!({
                    "type": "object",
                    "properties": {
                        "text": {
                            "type": "string",
                            "description": "What to remember, in full (it is read without this conversation).",
                            "maxLength": MAX_TEXT_BYTES,
                        },
                        "key": {
                            "type": "string",
                            "description": "A name for it (e.g. `dog_name`), to replace it later.",
                            "maxLength": 128,
                        }
                    },
                    "required": ["text"],
                    "additionalProperties": false,
                }),
                SideEffects::Idempotent,
            ),
            Arc::new(Remember(slot.clone())) as Arc<dyn ToolHandler>,
        ),
        (
            definition(
                RECALL,
                "Search what was remembered about the user (or the team) in earlier conversations; the best matches first.",
                json!({
                    "type": "object",
                    "properties": {
                        "query": {
                            "type": "string",
                            "description": "What to look for, in words.",
                            "maxLength": 4096,
                        },
                        "limit": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_RECALL,
                            "description": "How many items at most (default 5).",
                        }
                    },
                    "required": ["query"],
                    "additionalProperties": false,
                }),
                SideEffects::None,
            ),
            Arc::new(Recall(slot.clone())) as Arc<dyn ToolHandler>,
        ),
    ]
}
