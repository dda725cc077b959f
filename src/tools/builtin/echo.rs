//! `echo {message}`: returns its input. Useful to check the tool loop end to end.

use serde_json::{Value, json};

use crate::tools::{ExecutionContext, SideEffects, ToolDefinition, ToolError, ToolHandler};

pub fn definition() -> ToolDefinition {
    ToolDefinition::new(
        "echo",
        "Repeat a message back verbatim.",
        json!({
            "type": "object",
            "properties": {
                "message": {"type": "string", "description": "The text to repeat", "maxLength": 100000}
            },
            "required": ["message"],
            "additionalProperties": false
        }),
    )
    .with_tags(&["echo", "repeat", "say"])
    .with_side_effects(SideEffects::None)
}

pub struct Echo;

#[async_trait::async_trait]
impl ToolHandler for Echo {
    async fn call(&self, params: Value, _ctx: &ExecutionContext) -> Result<Value, ToolError> {
        Ok(json!({"message": params["message"]}))
    }

    /// Bounded by its schema's `maxLength`, pure: run where admitted.
    fn runs_inline(&self) -> bool {
        true
    }
}
