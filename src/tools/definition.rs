//! A tool's definition: what the model is told and what the executor enforces.
//!
//! tool file (YAML | TOML) ──parse──▶ [`ToolFile`] ──resolve──▶ [`ToolDefinition`] (+ handler)
//! Rust code (builtins, embedders) ─────────────────────────────▶ [`ToolDefinition`]
//!
//! One struct, two formats: the ToolEngine's YAML layout (`name, version,
//! description, category, tags, parameters, entry, output`) plus cadre's
//! `required_plan`, `rate_limit`, `cache`, `post_processor`, `timeout_s` and
//! `side_effects`.
//! `parameters` is either the list form or a JSON Schema object; both become
//! one JSON Schema ([`super::schema`]) used for validation and for the
//! OpenAI export.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use crate::identity::Plan;
use crate::model::ToolSpec;

/// Calls allowed per user and tool in each window; unset windows are unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    #[schema(format = "uint32", minimum = 0, maximum = 4294967295_u32)]
    pub per_minute: Option<u32>,
    #[schema(format = "uint32", minimum = 0, maximum = 4294967295_u32)]
    pub per_hour: Option<u32>,
    #[schema(format = "uint32", minimum = 0, maximum = 4294967295_u32)]
    pub per_day: Option<u32>,
}

impl RateLimit {
    pub fn is_unlimited(&self) -> bool {
        self.per_minute.is_none() && self.per_hour.is_none() && self.per_day.is_none()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CacheSpec {
    /// 0 disables caching for this tool.
    pub ttl_seconds: u64,
}

/// What running a tool does to the world outside its answer, which says
/// whether a call that may have run can run again (a turn resumed after a
/// crash, a retried request).
///
/// Decided where the tool is declared: a builtin in its code, a tool file
/// by `side_effects`, an MCP server in `mcp.toml` or, when that says
/// nothing, by the server's own tool annotations. Undeclared is
/// [`SideEffects::AtMostOnce`], the side that never repeats an action.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum SideEffects {
    /// Reads only: run it again freely.
    None,
    /// Acts, but running it twice leaves the world as running it once (set
    /// a value, delete by id, add to a set).
    Idempotent,
    /// Acts, and a second run acts again (places an order, sends a
    /// message): cadre commits the call's intent before it runs and never
    /// runs it twice on its own.
    #[default]
    AtMostOnce,
}

impl SideEffects {
    pub fn as_str(self) -> &'static str {
        match self {
            SideEffects::None => "none",
            SideEffects::Idempotent => "idempotent",
            SideEffects::AtMostOnce => "at_most_once",
        }
    }

    /// Whether a call that may have run can simply run again.
    pub fn is_repeatable(self) -> bool {
        self != SideEffects::AtMostOnce
    }
}

/// What runs when the tool is called.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum Entry {
    /// A handler compiled into cadre, by name (defaults to the tool's name).
    Builtin {
        #[serde(default)]
        handler: Option<String>,
    },
    /// A command run with the parameters as JSON on stdin, JSON expected on
    /// stdout; or an HTTP endpoint that receives them as a JSON POST.
    External {
        #[serde(default)]
        command: Option<Vec<String>>,
        #[serde(default)]
        url: Option<String>,
        /// Largest output read, in bytes (default 1 MiB).
        #[serde(default)]
        max_output_bytes: Option<usize>,
        /// `url` entries: hosts (`host` or `host:port`, as `[tools]
        /// http_allowlist`) reachable even on loopback or private addresses,
        /// on top of the server's `http_allowlist`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        allowlist: Vec<String>,
        /// `url` entries: which redirects are followed.
        #[serde(default, skip_serializing_if = "Redirects::is_default")]
        redirects: Redirects,
        /// `command` entries: variables of cadre's environment the command
        /// gets by name (beside `PATH`, `HOME`, `LANG`; nothing else of
        /// cadre's reaches it, [`super::process::clean_env`]).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        env: Vec<String>,
        /// `command` entries: variables set to these values.
        #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
        env_set: std::collections::BTreeMap<String, String>,
        /// `command` entries: the network is open to the command (the
        /// sandbox gives it none otherwise, [`super::sandbox`]).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        network: bool,
        /// `command` entries: paths beside the sandbox's own view, read-only
        /// or (`write: true`) read-write.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        paths: Vec<super::sandbox::PathGrant>,
        /// `command` entries: some of `[tools] sandbox_limits`, for this tool.
        #[serde(
            default,
            skip_serializing_if = "super::sandbox::LimitsOverride::is_empty"
        )]
        sandbox_limits: super::sandbox::LimitsOverride,
    },
    /// A Rust handler registered through the library API, by name.
    Custom {
        #[serde(default)]
        handler: Option<String>,
    },
    /// A tool of an MCP server declared in `agents/mcp.toml`, listed from
    /// the server (never written in a tool file): `server` is the prefix of
    /// the registry name, `tool` the server's own name for it.
    Mcp { server: String, tool: String },
    /// A turn of another agent in a child conversation (`ask_<agent>`),
    /// made from an agent file's `agents = [...]`, never written in a tool
    /// file ([`super::delegate`]).
    Agent { agent: String },
}

/// Which redirects an HTTP entry follows; every hop passes the network
/// guard whatever this says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Redirects {
    /// Hops that keep the URL's scheme, host and port.
    #[default]
    SameOrigin,
    /// Hops to any origin the guard allows.
    Any,
    /// None: a 3xx answer is a failure.
    None,
}

impl Redirects {
    fn is_default(&self) -> bool {
        *self == Redirects::default()
    }
}

impl Default for Entry {
    fn default() -> Self {
        Entry::Builtin { handler: None }
    }
}

/// The resolved definition the executor and the model see.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ToolDefinition {
    pub name: String,
    pub version: String,
    pub description: String,
    pub category: String,
    pub tags: Vec<String>,
    /// JSON Schema of the parameters (an object schema).
    #[schema(value_type = std::collections::BTreeMap<String, Value>)]
    pub parameters: Value,
    #[serde(default)]
    pub entry: Entry,
    #[serde(default)]
    #[schema(value_type = Option<Value>)]
    pub output: Option<Value>,
    #[serde(default)]
    pub required_plan: Plan,
    #[serde(default)]
    pub rate_limit: RateLimit,
    #[serde(default)]
    pub cache: Option<CacheSpec>,
    #[serde(default)]
    pub post_processor: Option<String>,
    /// Per-call timeout; the execution context or the executor default otherwise.
    #[serde(default, with = "opt_millis")]
    #[schema(value_type = Option<u64>)]
    pub timeout: Option<Duration>,
    /// Whether a call may run again ([`SideEffects`]); `at_most_once` when
    /// nothing declares it.
    #[serde(default)]
    pub side_effects: SideEffects,
}

pub const REQUIRE_CONFIRMATION: &str = "require_confirmation";

impl ToolDefinition {
    pub fn new(name: &str, description: &str, parameters: Value) -> Self {
        ToolDefinition {
            name: name.into(),
            version: "1.0.0".into(),
            description: description.into(),
            category: "custom".into(),
            tags: Vec::new(),
            parameters,
            entry: Entry::default(),
            output: None,
            required_plan: Plan::Free,
            rate_limit: RateLimit::default(),
            cache: None,
            post_processor: None,
            timeout: None,
            side_effects: SideEffects::default(),
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

    pub fn with_plan(mut self, plan: Plan) -> Self {
        self.required_plan = plan;
        self
    }

    pub fn with_rate_limit(mut self, limit: RateLimit) -> Self {
        self.rate_limit = limit;
        self
    }

    /// Shorthand for a per-minute limit only.
    pub fn per_minute(self, n: u32) -> Self {
        self.with_rate_limit(RateLimit {
            per_minute: Some(n),
            ..RateLimit::default()
        })
    }

    pub fn with_cache_ttl(mut self, seconds: u64) -> Self {
        self.cache = Some(CacheSpec {
            ttl_seconds: seconds,
        });
        self
    }

    pub fn with_post_processor(mut self, name: &str) -> Self {
        self.post_processor = Some(name.into());
        self
    }

    pub fn with_side_effects(mut self, side_effects: SideEffects) -> Self {
        self.side_effects = side_effects;
        self
    }

    pub fn with_entry(mut self, entry: Entry) -> Self {
        self.entry = entry;
        self
    }

    pub fn requires_confirmation(&self) -> bool {
        self.post_processor.as_deref() == Some(REQUIRE_CONFIRMATION)
    }

    /// Whether what this tool answers comes from outside cadre's own code:
    /// an external command or URL of a tool file, or an MCP server. The one
    /// place that decides it, by the entry (a tool file naming a builtin
    /// handler runs cadre's code and is not an upstream): such tools are
    /// not cached unless they ask, their source ids are namespaced, and
    /// their outputs are capped ([`crate::tools::outcome`]).
    pub fn is_upstream(&self) -> bool {
        matches!(self.entry, Entry::External { .. } | Entry::Mcp { .. })
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
