//! `calculator {expression}`: arithmetic through the sandboxed evaluator in
//! [`super::calc_eval`]; never code execution. Errors (division by zero, deep
//! nesting, garbage) come back as `InvalidInput` with a sentence the model
//! can act on.

use serde_json::{Value, json};

use super::calc_eval;
use crate::tools::{ExecutionContext, SideEffects, ToolDefinition, ToolError, ToolHandler};

pub fn definition() -> ToolDefinition {
    ToolDefinition::new(
        "calculator",
        "Evaluate an arithmetic expression: + - * / % ^, parentheses, unary minus, \
         decimals, sqrt, abs, min, max, round.",
        json!({
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "description": "The arithmetic expression, e.g. '(2+3)*4'",
                    "minLength": 1,
                    "maxLength": calc_eval::MAX_INPUT_LEN
                }
            },
            "required": ["expression"],
            "additionalProperties": false
        }),
    )
    .with_category("calculate")
    // Cheaper to compute than to look up; a cached answer would only add
    // `cached: true` to a result that costs nothing.
    .with_cache_ttl(0)
    .with_tags(&[
        "math",
        "calculate",
        "compute",
        "arithmetic",
        "sum",
        "plus",
        "times",
    ])
    .with_side_effects(SideEffects::None)
}

pub struct Calculator;

#[async_trait::async_trait]
impl ToolHandler for Calculator {
    async fn call(&self, params: Value, _ctx: &ExecutionContext) -> Result<Value, ToolError> {
        let expression = params["expression"].as_str().unwrap_or_default();
        let value =
            calc_eval::evaluate(expression).map_err(|e| ToolError::invalid(e.to_string()))?;
        Ok(json!({
            "expression": expression,
            "result": value,
            "formatted": calc_eval::format_number(value),
        }))
    }

    /// Bounded by its schema's `maxLength`, pure: run where admitted.
    fn runs_inline(&self) -> bool {
        true
    }
}
