//! Builtin tools, one file per family. [`register_all`] puts them in a
//! registry; agents choose which of them to offer by name.

pub mod calc_eval;
pub mod calculator;
pub mod echo;

use std::sync::Arc;

use super::ToolRegistry;

pub fn register_all(registry: &ToolRegistry) {
    let builtins: [(super::ToolDefinition, Arc<dyn super::ToolHandler>); 2] = [
        (echo::definition(), Arc::new(echo::Echo)),
        (calculator::definition(), Arc::new(calculator::Calculator)),
    ];
    for (def, handler) in builtins {
        let name = def.name.clone();
        registry
            .register(def, handler)
            .unwrap_or_else(|e| panic!("builtin tool {name} has a bad schema: {e}"));
    }
}
