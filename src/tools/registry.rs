//! The tool registry: name -> definition, compiled validator and handler.
//!
//! Shared by the executor (lookup), the conversations (what to offer the
//! model) and `GET /v1/tools`. Reads take a snapshot `Arc` so a call keeps
//! the version of the tool it started with even if the tool is replaced
//! meanwhile.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use super::validate::{ParamValidator, SchemaError};
use super::{ToolDefinition, ToolHandler};
use crate::model::ToolSpec;

pub struct RegisteredTool {
    pub definition: ToolDefinition,
    pub validator: ParamValidator,
    pub handler: Arc<dyn ToolHandler>,
}

#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: Arc<RwLock<BTreeMap<String, Arc<RegisteredTool>>>>,
}

impl ToolRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a tool; refuses a parameter schema that does not compile.
    pub fn register(
        &self,
        definition: ToolDefinition,
        handler: Arc<dyn ToolHandler>,
    ) -> Result<(), SchemaError> {
        let validator = ParamValidator::new(&definition.parameters)?;
        let name = definition.name.clone();
        let tool = Arc::new(RegisteredTool {
            definition,
            validator,
            handler,
        });
        self.tools
            .write()
            .expect("tool registry lock poisoned")
            .insert(name, tool);
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<Arc<RegisteredTool>> {
        self.tools
            .read()
            .expect("tool registry lock poisoned")
            .get(name)
            .cloned()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// All definitions, sorted by name.
    pub fn definitions(&self) -> Vec<ToolDefinition> {
        self.tools
            .read()
            .expect("tool registry lock poisoned")
            .values()
            .map(|t| t.definition.clone())
            .collect()
    }

    /// The specs of the named tools that exist, in the order given.
    pub fn specs_for(&self, names: &[String]) -> Vec<ToolSpec> {
        let tools = self.tools.read().expect("tool registry lock poisoned");
        names
            .iter()
            .filter_map(|n| tools.get(n))
            .map(|t| t.definition.spec())
            .collect()
    }
}
