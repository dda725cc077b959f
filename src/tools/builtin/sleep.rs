//! `sleep {ms}`: waits, then answers. For load and limit testing: a call that
//! holds its concurrency slot for a known time. Never cached.

use std::time::Duration;

use serde_json::{Value, json};

use crate::tools::{ExecutionContext, SideEffects, ToolDefinition, ToolError, ToolHandler};

pub const MAX_MS: u64 = 60_000;

pub fn definition() -> ToolDefinition {
    ToolDefinition::new(
        "sleep",
        "Wait for the given number of milliseconds, then answer. For testing.",
        json!({
            "type": "object",
            "properties": {
                "ms": {"type": "integer", "minimum": 0, "maximum": MAX_MS, "description": "How long to wait"}
            },
            "required": ["ms"],
            "additionalProperties": false
        }),
    )
    .with_category("custom")
    .with_cache_ttl(0)
    .with_timeout(Duration::from_millis(MAX_MS + 5_000))
    .with_side_effects(SideEffects::None)
}

pub struct Sleep;

#[async_trait::async_trait]
impl ToolHandler for Sleep {
    async fn call(&self, params: Value, _ctx: &ExecutionContext) -> Result<Value, ToolError> {
        let ms = params["ms"].as_u64().unwrap_or(0).min(MAX_MS);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(json!({"slept_ms": ms}))
    }
}
