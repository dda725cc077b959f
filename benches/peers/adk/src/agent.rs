//! The agent both ADK-Rust programs run (rows `adk`, `adk-sqlite`,
//! `adk-pg`): an `LlmAgent` named `assistant` on ADK-Rust's `OpenAIClient`
//! (chat completions at the mock's base URL) with one `FunctionTool`
//! named `calculator` (argument `expression`), the same system prompt as
//! every row.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use adk_rust::prelude::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub const SYSTEM: &str =
    "You are a helpful assistant. Use the calculator for any arithmetic and report its result.";

/// Calls of the calculator in this process.
pub static TOOL_CALLS: AtomicU64 = AtomicU64::new(0);

#[derive(Serialize, Deserialize, JsonSchema)]
pub struct CalculatorArgs {
    /// The arithmetic expression, e.g. '(2+3)*4'
    expression: String,
}

/// `+ - * /`, parentheses, unary minus: enough for the workload's `2+3`.
pub fn evaluate(s: &str) -> Option<f64> {
    fn expr(b: &[u8], i: &mut usize) -> Option<f64> {
        let mut v = term(b, i)?;
        while let Some(&c) = b.get(*i) {
            if c != b'+' && c != b'-' {
                break;
            }
            *i += 1;
            let r = term(b, i)?;
            v = if c == b'+' { v + r } else { v - r };
        }
        Some(v)
    }
    fn term(b: &[u8], i: &mut usize) -> Option<f64> {
        let mut v = atom(b, i)?;
        while let Some(&c) = b.get(*i) {
            if c != b'*' && c != b'/' {
                break;
            }
            *i += 1;
            let r = atom(b, i)?;
            v = if c == b'*' { v * r } else { v / r };
        }
        Some(v)
    }
    fn atom(b: &[u8], i: &mut usize) -> Option<f64> {
        match b.get(*i)? {
            b'(' => {
                *i += 1;
                let v = expr(b, i)?;
                (b.get(*i) == Some(&b')')).then(|| *i += 1)?;
                Some(v)
            }
            b'-' => {
                *i += 1;
                Some(-atom(b, i)?)
            }
            _ => {
                let start = *i;
                while b.get(*i).is_some_and(|c| c.is_ascii_digit() || *c == b'.') {
                    *i += 1;
                }
                std::str::from_utf8(&b[start..*i]).ok()?.parse().ok()
            }
        }
    }
    let b: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    let mut i = 0;
    let v = expr(&b, &mut i)?;
    (i == b.len()).then_some(v)
}

/// The agent, built once per process.
pub fn build(base_url: &str) -> LlmAgent {
    let model = OpenAIClient::new(OpenAIConfig::compatible("peers", base_url, "mock-model"))
        .expect("OpenAI-compatible client");
    let calculator = FunctionTool::new(
        "calculator",
        "Evaluate an arithmetic expression: + - * / % ^ and parentheses.",
        |_ctx, args: Value| async move {
            TOOL_CALLS.fetch_add(1, Ordering::Relaxed);
            let expression = args["expression"].as_str().unwrap_or_default().to_string();
            match evaluate(&expression) {
                Some(v) => Ok(json!({"expression": expression, "result": v})),
                None => Ok(json!({"error": format!("cannot evaluate {expression:?}")})),
            }
        },
    )
    .with_parameters_schema::<CalculatorArgs>();
    LlmAgentBuilder::new("assistant")
        .description("The peers benchmark's agent: one calculator call per session.")
        .instruction(SYSTEM)
        .model(Arc::new(model))
        .tool(Arc::new(calculator))
        .build()
        .expect("agent")
}
