//! A tool's definition: what the model is told and what the executor enforces.
//!
//! For now definitions are built in Rust (builtins, embedders' custom tools);
//! the declarative YAML/TOML files of the tools issue will deserialize into
//! this same struct.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::ToolSpec;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    pub name: String,
    #[serde(default = "default_version")]
    pub version: String,
    pub description: String,
    #[serde(default = "default_category")]
    pub category: String,
    #[serde(default)]
    pub tags: Vec<String>,
    /// JSON Schema of the parameters (an object schema).
    pub parameters: Value,
    /// Per-call timeout; the execution context or the executor default otherwise.
    #[serde(default, with = "opt_millis")]
    pub timeout: Option<Duration>,
}

fn default_version() -> String {
    "1.0.0".into()
}

fn default_category() -> String {
    "custom".into()
}

impl ToolDefinition {
    pub fn new(name: &str, description: &str, parameters: Value) -> Self {
        ToolDefinition {
            name: name.into(),
            version: default_version(),
            description: description.into(),
            category: default_category(),
            tags: Vec::new(),
            parameters,
            timeout: None,
        }
    }

    pub fn with_category(mut self, category: &str) -> Self {
        self.category = category.into();
        self
    }

    pub fn with_tags(mut self, tags: &[&str]) -> Self {
        self.tags = tags.iter().map(|t| t.to_string()).collect();
        self
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// What the model is offered.
    pub fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.clone(),
            description: self.description.clone(),
            parameters: self.parameters.clone(),
        }
    }
}

mod opt_millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&(d.as_millis() as u64)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}
