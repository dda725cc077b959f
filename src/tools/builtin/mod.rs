//! Builtin tools, one file (or folder) per family. [`register_all`] puts them
//! in a registry; agents choose which of them to offer by name, and tool
//! files (`entry.type = builtin`) refer to them by handler name.
//!
//! Every family exposes `tools(&BuiltinContext) -> Vec<(ToolDefinition,
//! Arc<dyn ToolHandler>)>`; what a handler needs (the store for per-user
//! state, the data folder, the network policy) comes in the context.

pub mod calc_eval;
pub mod calculator;
pub mod echo;
pub mod http;
pub mod net_guard;
pub mod sleep;

use std::path::PathBuf;
use std::sync::Arc;

use super::validate::SchemaError;
use super::{ToolDefinition, ToolHandler, ToolRegistry};
use crate::store::Store;

/// What builtin handlers may use.
#[derive(Clone)]
pub struct BuiltinContext {
    pub store: Store,
    /// `agents/data`: JSON master files of the data tools.
    pub data_dir: PathBuf,
    /// Hosts `http_request` / `fetch_page` may reach even when they resolve
    /// to loopback or private addresses (`host` or `host:port`).
    pub http_allowlist: Vec<String>,
}

pub type ToolEntry = (ToolDefinition, Arc<dyn ToolHandler>);

/// Every builtin tool.
pub fn all(ctx: &BuiltinContext) -> Vec<ToolEntry> {
    let mut tools: Vec<ToolEntry> = vec![
        (echo::definition(), Arc::new(echo::Echo)),
        (calculator::definition(), Arc::new(calculator::Calculator)),
        (sleep::definition(), Arc::new(sleep::Sleep)),
    ];
    tools.extend(http::tools(ctx));
    tools
}

pub fn register_all(registry: &ToolRegistry, ctx: &BuiltinContext) -> Result<(), SchemaError> {
    for (def, handler) in all(ctx) {
        registry.register(def, handler)?;
    }
    Ok(())
}
