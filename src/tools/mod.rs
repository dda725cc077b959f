//! Tools: what a model can ask cadre to do.
//!
//! registry (definitions + handlers) ──▶ executor looks up, validates, runs
//! executor ◀── ToolSubAgent (one per batch, in `conversation::batch`) ◀── conversation
//!
//! A tool is a [`ToolDefinition`] (name, description, JSON Schema of its
//! parameters, limits) plus a [`ToolHandler`]. Handlers are plain async
//! functions of validated parameters; everything around them (validation,
//! timeouts, panics, records) is the executor's job.

pub mod builtin;
pub mod definition;
pub mod delegate;
pub mod external;
pub mod loader;
pub mod memory;
pub mod outcome;
pub mod output_schema;
pub mod process;
pub mod registry;
pub mod remote_agent;
pub mod sandbox;
pub mod schema;
pub mod validate;
pub mod watch;

pub use definition::{Plan, RateLimit, SideEffects, ToolDefinition};
pub use outcome::{
    CallerType, ErrorType, ExecutionContext, FieldError, ResultMetadata, ToolExecutionResult,
};
pub use registry::{RegisteredTool, ReloadReport, ToolRegistry, ToolSource};

use serde_json::Value;

/// Why a handler failed. `retryable` failures (timeouts, transport errors,
/// 5xx of remote services) may be retried by the executor; the others not.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ToolError {
    /// The parameters passed validation but make no sense to the tool
    /// (e.g. an expression that divides by zero).
    #[error("{message}")]
    InvalidInput { message: String },
    /// The tool ran and failed.
    #[error("{message}")]
    Failed { message: String },
    /// A failure that may pass on a second try.
    #[error("{message}")]
    Transient { message: String },
    /// What serves the tool is down (an MCP server that died and is being
    /// restarted): `TOOL_UNAVAILABLE`, not retried within the call.
    #[error("{message}")]
    Unavailable { message: String },
    /// The call waits for a person's decision elsewhere (a delegated
    /// agent's call held for approval): `pending_confirmation`, with what
    /// to decide in `output` and the confirmation to decide by id.
    #[error("{message}")]
    Held {
        message: String,
        confirmation_id: String,
        output: Value,
    },
}

impl ToolError {
    pub fn invalid(message: impl Into<String>) -> Self {
        ToolError::InvalidInput {
            message: message.into(),
        }
    }
    pub fn failed(message: impl Into<String>) -> Self {
        ToolError::Failed {
            message: message.into(),
        }
    }
    pub fn is_retryable(&self) -> bool {
        matches!(self, ToolError::Transient { .. })
    }
}

/// The body of a tool: gets parameters that passed the definition's schema.
#[async_trait::async_trait]
pub trait ToolHandler: Send + Sync + 'static {
    async fn call(&self, params: Value, ctx: &ExecutionContext) -> Result<Value, ToolError>;

    /// True for a body that only computes, never waits, and is bounded by
    /// its schema (`calculator`, `echo`): the executor then runs it where
    /// the call was admitted instead of in a task of its own, which saves
    /// two thread wake-ups per call. Its panic is still caught; a timeout
    /// cannot cut it (it never yields), which is why only built-ins whose
    /// input the schema bounds say so.
    fn runs_inline(&self) -> bool {
        false
    }
}

/// Any `Fn(Value) -> Future<Output = Result<Value, ToolError>>` is a handler,
/// so embedders and tests register closures.
pub struct FnHandler<F>(pub F);

#[async_trait::async_trait]
impl<F, Fut> ToolHandler for FnHandler<F>
where
    F: Fn(Value) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Value, ToolError>> + Send + 'static,
{
    async fn call(&self, params: Value, _ctx: &ExecutionContext) -> Result<Value, ToolError> {
        (self.0)(params).await
    }
}
