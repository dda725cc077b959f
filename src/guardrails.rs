//! Guardrails: checks on what goes into and comes out of the model and the
//! tools, each of which may pass, rewrite or block what it is shown.
//!
//! user message ──input──▶ store, model ──▶ final answer ──output──▶ store, stream
//! model's tool call ──executor: validation ──tool_input──▶ handler ──tool_output──▶ record, model
//!
//! Owns: the config of a guardrail list (agent files' `[[guardrails]]`, a
//! tenant config's `guardrails`), its compiled form and the checks. Does
//! not: know where a stage sits in a turn, count metrics, publish events
//! or call tools and agents. The caller runs a stage at its place, records
//! the [`Decision`]s and a [`Tripped`] (metrics, event, log, stored
//! records) and asks tools and agents through an [`ExternalCheck`].
//!
//! Decisions:
//! - A list is compiled once ([`Guardrails::compile`]): each entry has
//!   exactly one decider (a built-in `kind`, a `tool` or an `agent`) and
//!   only the fields its decider reads; patterns and schemas are compiled
//!   there, so a check never compiles. A pattern is compiled with a size
//!   limit ([`REGEX_SIZE_LIMIT`]) and a nesting limit: a huge or hostile
//!   pattern is a load error, not a memory blow-up.
//! - A stage's guardrails run in list order (a tenant's list, then the
//!   agent's: [`Guardrails::then`]); a rewrite feeds the next one and the
//!   first block stops the rest. Only what did something is a
//!   [`Decision`] (`block`, `redact`, `rewrite`); an allow is not listed.
//! - Input and output stages check text ([`Subject::Text`]); tool stages
//!   check JSON ([`Subject::Json`]: the arguments, the output), and on them
//!   a guardrail's `tools` list (empty: every tool) says which calls it
//!   sees.
//! - Built-ins:
//!   `regex` searches the text, or every string leaf of the JSON (object
//!   values and array items at any depth; not keys); `block` blocks on
//!   any match, `redact` replaces each match by `replacement` (literal,
//!   default `[redacted]`) and is a decision only when something was
//!   replaced.
//!   `max_length` blocks text of more than `max` characters, or JSON whose
//!   compact serialization has more than `max` characters.
//!   `deny_topics` blocks on any topic found case-insensitively as a whole
//!   word or phrase (a topic's inner spaces match any run of whitespace;
//!   `loan` is not found in `sloane`), in the text or any string leaf.
//!   `schema` validates with the tools' parameter validator
//!   ([`ParamValidator`], not strict): text must parse as JSON, and the
//!   value must be an object that validates; nothing is rewritten
//!   (defaults are not filled in). A miss blocks; the failing fields and
//!   keywords go into [`Tripped::reason`], never into the public message.
//!   `drop_fields` (tool stages only) removes each dotted path
//!   (`account.ssn`); a path through an array applies to each element
//!   (`accounts.ssn`); a decision `redact` when anything was removed.
//! - A `tool` or `agent` guardrail is sent [`check_request`] and answers
//!   `{"decision": "allow" | "deny" | "rewrite", "message"?, "text"?,
//!   "value"?}`; an agent may answer that object as JSON text, or plain
//!   text starting with `allow` or `deny`. `rewrite` replaces the subject
//!   with `text` (text) or `value` (JSON); a rewrite of the wrong shape is
//!   an error. `deny` blocks with the reply's `message` (cut to
//!   [`MAX_MESSAGE_CHARS`]) or else the guardrail's. An error (the check
//!   could not be made, or its reply is unreadable) counts as the
//!   guardrail's `on_error`: `block` by default (fail closed), or `allow`
//!   (passes, no decision); it is logged at WARN with the guardrail's name.
//!   [`Guardrails::run_builtin`], for callers with no checker at hand,
//!   counts every tool or agent guardrail as its `on_error`.
//! - A block's public message is the guardrail's `message`, else
//!   `blocked by guardrail <name> (<stage>)`.
//! - The subject's text is never logged nor put into an error or a reason
//!   (it may be the very card number being redacted); [`Subject`]'s
//!   `Debug` shows only its size.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use regex::{Regex, RegexBuilder};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::tools::validate::{ParamValidator, json_type_name};

/// Guardrails in one list (an agent's, a tenant's).
pub const MAX_GUARDRAILS: usize = 64;
/// Characters of a guardrail's name.
pub const MAX_NAME_CHARS: usize = 64;
/// Bytes of a `pattern` as written.
pub const MAX_PATTERN_BYTES: usize = 64 * 1024;
/// Bytes a compiled pattern (and each of its lazy DFA caches) may take.
pub const REGEX_SIZE_LIMIT: usize = 1024 * 1024;
/// Nesting depth of a pattern's groups and repetitions.
pub const REGEX_NEST_LIMIT: u32 = 64;
/// Topics of one `deny_topics` guardrail, and characters of each: the
/// largest list compiles within [`REGEX_SIZE_LIMIT`] (about 200 bytes per
/// case-insensitive character); a longer list is better split in two.
pub const MAX_TOPICS: usize = 50;
pub const MAX_TOPIC_CHARS: usize = 100;
/// Paths of one `drop_fields` guardrail, and bytes of each.
pub const MAX_FIELDS: usize = 64;
pub const MAX_FIELD_PATH_BYTES: usize = 256;
/// Names in a tool-stage guardrail's `tools` filter.
pub const MAX_TOOL_FILTER: usize = 256;
/// Characters of a public message (the guardrail's, or a deny reply's),
/// and of a redaction's replacement.
pub const MAX_MESSAGE_CHARS: usize = 512;
/// Default replacement of a regex redaction.
pub const DEFAULT_REPLACEMENT: &str = "[redacted]";

/// Where in a turn a guardrail runs.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
#[schema(as = GuardrailStage)]
pub enum Stage {
    /// The user's message, before it is stored or sent to a model.
    Input,
    /// The final answer, before it is stored or streamed.
    Output,
    /// A tool call's validated arguments, before the call.
    ToolInput,
    /// A tool call's output, before the model or the call record sees it.
    ToolOutput,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Input => "input",
            Stage::Output => "output",
            Stage::ToolInput => "tool_input",
            Stage::ToolOutput => "tool_output",
        }
    }

    /// A stage of a tool call (its subject is JSON, `tools` filters).
    pub fn is_tool(self) -> bool {
        matches!(self, Stage::ToolInput | Stage::ToolOutput)
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The checks cadre makes itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = GuardrailBuiltinKind)]
pub enum BuiltinKind {
    Regex,
    MaxLength,
    DenyTopics,
    Schema,
    DropFields,
}

impl BuiltinKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BuiltinKind::Regex => "regex",
            BuiltinKind::MaxLength => "max_length",
            BuiltinKind::DenyTopics => "deny_topics",
            BuiltinKind::Schema => "schema",
            BuiltinKind::DropFields => "drop_fields",
        }
    }
}

/// What a `regex` guardrail does with a match.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = GuardrailAction)]
pub enum Action {
    #[default]
    Block,
    Redact,
}

/// What a `tool` or `agent` guardrail that could not decide counts as.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = GuardrailOnError)]
pub enum OnError {
    /// Fail closed: the subject is blocked.
    #[default]
    Block,
    /// Fail open: the subject passes unchanged.
    Allow,
}

/// One guardrail as written: an entry of an agent file's `[[guardrails]]`
/// or of a tenant config's `guardrails`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GuardrailConfig {
    /// Unique in its list: 1 to 64 characters of `A-Z a-z 0-9 _ . -`.
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9_.-]+$")]
    pub name: String,
    pub stage: Stage,
    /// A built-in check (exactly one of `kind`, `tool`, `agent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<BuiltinKind>,
    /// A registered tool that decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// An agent that decides (asked through delegation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// `regex`: the pattern (Rust `regex` syntax).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 65536)]
    pub pattern: Option<String>,
    /// Built-ins: `block` (default); `redact` with `regex` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    /// `regex` with `action = "redact"`: what replaces each match (literal;
    /// default `[redacted]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 512)]
    pub replacement: Option<String>,
    /// `max_length`: the most characters that pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<usize>,
    /// `deny_topics`: words or phrases, matched case-insensitively.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 50)]
    pub topics: Vec<String>,
    /// `schema`: a JSON Schema the subject must validate against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<std::collections::BTreeMap<String, Value>>)]
    pub schema: Option<Value>,
    /// `drop_fields`: dotted paths removed from the JSON.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 64)]
    pub fields: Vec<String>,
    /// Tool stages only: the tools whose calls it sees (empty: all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 256)]
    pub tools: Vec<String>,
    /// The public message when it blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 512)]
    pub message: Option<String>,
    /// `tool` and `agent` guardrails: what an error counts as (`block`,
    /// the default, or `allow`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_error: Option<OnError>,
}

/// What a config entry gets wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("it names no check: set one of `kind`, `tool`, `agent`")]
    NoDecider,
    #[error("it names more than one check: set only one of `kind`, `tool`, `agent`")]
    TwoDeciders,
    #[error("`{field}` is required with {decider}")]
    Missing {
        field: &'static str,
        decider: &'static str,
    },
    #[error("`{field}` does not apply to {decider}")]
    NotApplicable {
        field: &'static str,
        decider: &'static str,
    },
    #[error("`{field}` applies to tool stages only (`tool_input`, `tool_output`), not `{stage}`")]
    ToolStagesOnly { field: &'static str, stage: Stage },
    #[error(
        "`kind = \"drop_fields\"` applies to tool stages only (`tool_input`, `tool_output`), not `{stage}`"
    )]
    DropFieldsStage { stage: Stage },
    #[error("`action = \"redact\"` applies to `kind = \"regex\"` only")]
    RedactNeedsRegex,
    #[error("`replacement` applies to `action = \"redact\"` only")]
    ReplacementWithoutRedact,
    #[error("`{field}` is longer than {max}")]
    TooLong { field: &'static str, max: usize },
    #[error("`{field}` has more than {max} entries")]
    TooMany { field: &'static str, max: usize },
    #[error("`{field}` has a blank value")]
    Blank { field: &'static str },
    #[error("`{field}` is empty")]
    Empty { field: &'static str },
    #[error("`fields` entry {path:?} is not a dotted path of non-empty names")]
    BadPath { path: String },
    #[error("`pattern` does not compile: {error}")]
    BadPattern { error: String },
    #[error("`topics` make a pattern too large: {error}")]
    TopicsTooLarge { error: String },
    #[error("`schema` does not compile: {error}")]
    BadSchema { error: String },
}

/// Why a guardrail list does not load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuardrailError {
    #[error("{count} guardrails in one list; at most {max}")]
    TooMany { count: usize, max: usize },
    #[error(
        "guardrail #{index} is named {name:?}: a name is 1 to 64 characters of A-Z a-z 0-9 _ . -"
    )]
    BadName { index: usize, name: String },
    #[error("guardrail {name:?} is listed twice; names are unique in a list")]
    Duplicate { name: String },
    #[error("guardrail {name:?} ({stage}): {problem}")]
    Invalid {
        name: String,
        stage: Stage,
        problem: Problem,
    },
}

/// What a guardrail is shown.
#[derive(Clone, PartialEq)]
pub enum Subject {
    /// Input and output stages: a message's text.
    Text(String),
    /// Tool stages: the call's arguments, or its output.
    Json(Value),
}

impl Subject {
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Subject::Text(t) => Some(t),
            Subject::Json(_) => None,
        }
    }

    pub fn as_json(&self) -> Option<&Value> {
        match self {
            Subject::Json(v) => Some(v),
            Subject::Text(_) => None,
        }
    }

    pub fn into_text(self) -> Option<String> {
        match self {
            Subject::Text(t) => Some(t),
            Subject::Json(_) => None,
        }
    }

    pub fn into_json(self) -> Option<Value> {
        match self {
            Subject::Json(v) => Some(v),
            Subject::Text(_) => None,
        }
    }
}

/// Only the size: a subject may hold what its guardrails are there to hide,
/// and `Debug` ends up in logs.
impl fmt::Debug for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Text(t) => write!(f, "Text(<{} chars>)", t.chars().count()),
            Subject::Json(v) => write!(f, "Json(<{}>)", json_type_name(v)),
        }
    }
}

/// What a guardrail did to a subject (an allow is not a decision).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = GuardrailDecisionAction)]
pub enum DecisionAction {
    /// It stopped the subject.
    Block,
    /// It cut parts out (regex redaction, dropped fields).
    Redact,
    /// A tool or agent replaced the subject.
    Rewrite,
}

impl DecisionAction {
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionAction::Block => "block",
            DecisionAction::Redact => "redact",
            DecisionAction::Rewrite => "rewrite",
        }
    }
}

/// A guardrail that did something; kept with tool call and turn records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = GuardrailDecision)]
pub struct Decision {
    pub guardrail: String,
    pub stage: Stage,
    pub action: DecisionAction,
}

/// The guardrail that blocked, and what the caller may be told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = GuardrailTripped)]
pub struct Tripped {
    pub guardrail: String,
    pub stage: Stage,
    /// The public message.
    pub message: String,
    /// For logs only, never sent nor stored: why it blocked (e.g. the
    /// failing schema fields and keywords, or the checker's error). Never
    /// the subject's text.
    #[serde(skip)]
    #[schema(ignore)]
    pub reason: Option<String>,
}

/// A stage's result: the subject as the guardrails left it, what they did,
/// and the block if one stopped it.
#[derive(Debug, Clone)]
pub struct Checked {
    pub subject: Subject,
    pub decisions: Vec<Decision>,
    pub tripped: Option<Tripped>,
}

impl Checked {
    pub fn passed(&self) -> bool {
        self.tripped.is_none()
    }
}

/// Who a `tool` or `agent` guardrail asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum External<'a> {
    Tool(&'a str),
    Agent(&'a str),
}

/// Asks tools and agents on a guardrail's behalf (the caller's executor
/// and delegation; a deadline is the caller's too).
#[async_trait::async_trait]
pub trait ExternalCheck: Send + Sync {
    /// Asks a tool or an agent about `subject` (send it
    /// [`check_request`]); the JSON it answered (an agent's text answer as
    /// a JSON string), or why it could not be asked. The error is logged:
    /// it must not quote the subject.
    async fn check(
        &self,
        target: External<'_>,
        stage: Stage,
        tool: Option<&str>,
        subject: &Subject,
    ) -> Result<Value, String>;
}

/// What a `tool` or `agent` guardrail is sent: `{"stage", "text"}` for
/// text, `{"stage", "value"}` for JSON, and `"tool"` on tool stages.
pub fn check_request(stage: Stage, tool: Option<&str>, subject: &Subject) -> Value {
    let mut request = serde_json::Map::new();
    request.insert("stage".into(), stage.as_str().into());
    if stage.is_tool()
        && let Some(tool) = tool
    {
        request.insert("tool".into(), tool.into());
    }
    match subject {
        Subject::Text(t) => request.insert("text".into(), t.clone().into()),
        Subject::Json(v) => request.insert("value".into(), v.clone()),
    };
    Value::Object(request)
}

/// A compiled guardrail list; `Default` is the empty one. Cloning shares it.
#[derive(Clone, Default)]
pub struct Guardrails {
    list: Arc<[Arc<Guardrail>]>,
}

impl fmt::Debug for Guardrails {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.list.iter().map(|g| (&g.name, g.stage)))
            .finish()
    }
}

struct Guardrail {
    name: String,
    stage: Stage,
    /// Tool stages: the tools it sees (empty: all).
    tools: Vec<String>,
    message: Option<String>,
    check: Check,
}

enum Check {
    Regex {
        regex: Regex,
        /// `Some` when it redacts (the replacement), `None` when it blocks.
        redact: Option<String>,
    },
    MaxLength(usize),
    DenyTopics(Regex),
    Schema(ParamValidator),
    /// Each path split at its dots.
    DropFields(Vec<Vec<String>>),
    External {
        target: Target,
        name: String,
        on_error: OnError,
    },
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    Tool,
    Agent,
}

/// One guardrail's verdict on a subject.
enum Verdict {
    Allow,
    /// The subject was changed in place.
    Changed(DecisionAction),
    Block {
        /// The public message instead of the guardrail's (a deny reply's).
        message: Option<String>,
        reason: Option<String>,
    },
}

impl Guardrails {
    /// Checks and compiles a list (see the module doc for the rules).
    pub fn compile(configs: &[GuardrailConfig]) -> Result<Guardrails, GuardrailError> {
        if configs.len() > MAX_GUARDRAILS {
            return Err(GuardrailError::TooMany {
                count: configs.len(),
                max: MAX_GUARDRAILS,
            });
        }
        let mut names = BTreeSet::new();
        let mut list = Vec::with_capacity(configs.len());
        for (index, config) in configs.iter().enumerate() {
            if !valid_name(&config.name) {
                return Err(GuardrailError::BadName {
                    index,
                    name: cut(&config.name, MAX_NAME_CHARS + 8),
                });
            }
            if !names.insert(config.name.as_str()) {
                return Err(GuardrailError::Duplicate {
                    name: config.name.clone(),
                });
            }
            let guardrail =
                Guardrail::compile(config).map_err(|problem| GuardrailError::Invalid {
                    name: config.name.clone(),
                    stage: config.stage,
                    problem,
                })?;
            list.push(Arc::new(guardrail));
        }
        Ok(Guardrails { list: list.into() })
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn has_stage(&self, stage: Stage) -> bool {
        self.list.iter().any(|g| g.stage == stage)
    }

    /// `self`'s guardrails, then `other`'s (a tenant's list, then the
    /// agent's). A name may be in both.
    pub fn then(&self, other: &Guardrails) -> Guardrails {
        if other.is_empty() {
            return self.clone();
        }
        if self.is_empty() {
            return other.clone();
        }
        Guardrails {
            list: self.list.iter().chain(other.list.iter()).cloned().collect(),
        }
    }

    /// The tools `tool = ...` guardrails call (each once, in list order),
    /// for the caller's load-time checks.
    pub fn tools_called(&self) -> Vec<&str> {
        self.called(Target::Tool)
    }

    /// The agents `agent = ...` guardrails ask (each once, in list order).
    pub fn agents_called(&self) -> Vec<&str> {
        self.called(Target::Agent)
    }

    fn called(&self, target: Target) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for g in self.list.iter() {
            if let Check::External {
                target: t, name, ..
            } = &g.check
                && *t == target
                && !out.contains(&name.as_str())
            {
                out.push(name);
            }
        }
        out
    }

    /// The guardrails of `stage` that see a call of `tool` (on tool stages
    /// a `tools` filter must admit it; no tool: only unfiltered ones).
    fn at<'a>(
        &'a self,
        stage: Stage,
        tool: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Guardrail> {
        self.list
            .iter()
            .map(|g| &**g)
            .filter(move |g| g.stage == stage && g.admits(tool))
    }

    /// Runs the stage's guardrails in order: a rewrite feeds the next, the
    /// first block stops. Built-ins run inline; `tool` and `agent` ones
    /// through `external`.
    pub async fn run(
        &self,
        stage: Stage,
        tool: Option<&str>,
        subject: Subject,
        external: &dyn ExternalCheck,
    ) -> Checked {
        let mut checked = Checked {
            subject,
            decisions: Vec::new(),
            tripped: None,
        };
        for g in self.at(stage, tool) {
            let verdict = match &g.check {
                Check::External {
                    target,
                    name,
                    on_error,
                } => {
                    let asked = match target {
                        Target::Tool => External::Tool(name),
                        Target::Agent => External::Agent(name),
                    };
                    let reply = external.check(asked, stage, tool, &checked.subject).await;
                    match reply.and_then(|r| apply_reply(r, &mut checked.subject)) {
                        Ok(verdict) => verdict,
                        Err(error) => {
                            tracing::warn!(
                                guardrail = %g.name,
                                stage = stage.as_str(),
                                error = %cut(&error, 300),
                                "guardrail check failed; counted as its on_error"
                            );
                            on_error_verdict(*on_error, error)
                        }
                    }
                }
                builtin => builtin.run(&mut checked.subject),
            };
            if checked.record(g, verdict) {
                break;
            }
        }
        checked
    }

    /// [`Guardrails::run`] for callers with no [`ExternalCheck`] at hand:
    /// built-ins only. A `tool` or `agent` guardrail met here counts as
    /// its `on_error` (blocks by default, passes with `on_error = "allow"`)
    /// and is logged at WARN.
    pub fn run_builtin(&self, stage: Stage, tool: Option<&str>, subject: Subject) -> Checked {
        let mut checked = Checked {
            subject,
            decisions: Vec::new(),
            tripped: None,
        };
        for g in self.at(stage, tool) {
            let verdict = match &g.check {
                Check::External { on_error, .. } => {
                    tracing::warn!(
                        guardrail = %g.name,
                        stage = stage.as_str(),
                        "guardrail needs a tool or agent check and none can be asked here; counted as its on_error"
                    );
                    on_error_verdict(*on_error, "no external checker here".into())
                }
                builtin => builtin.run(&mut checked.subject),
            };
            if checked.record(g, verdict) {
                break;
            }
        }
        checked
    }
}

impl Checked {
    /// Notes `verdict`; true when it blocked (the stage stops).
    fn record(&mut self, g: &Guardrail, verdict: Verdict) -> bool {
        let action = match verdict {
            Verdict::Allow => return false,
            Verdict::Changed(action) => action,
            Verdict::Block { message, reason } => {
                self.tripped = Some(Tripped {
                    guardrail: g.name.clone(),
                    stage: g.stage,
                    message: message.unwrap_or_else(|| g.public_message()),
                    reason,
                });
                DecisionAction::Block
            }
        };
        self.decisions.push(Decision {
            guardrail: g.name.clone(),
            stage: g.stage,
            action,
        });
        action == DecisionAction::Block
    }
}

fn on_error_verdict(on_error: OnError, error: String) -> Verdict {
    match on_error {
        OnError::Allow => Verdict::Allow,
        OnError::Block => Verdict::Block {
            message: None,
            reason: Some(format!("the check failed: {}", cut(&error, 300))),
        },
    }
}

impl Guardrail {
    fn compile(c: &GuardrailConfig) -> Result<Guardrail, Problem> {
        let decider = match (c.kind, &c.tool, &c.agent) {
            (Some(kind), None, None) => kind.as_str(),
            (None, Some(_), None) => "`tool`",
            (None, None, Some(_)) => "`agent`",
            (None, None, None) => return Err(Problem::NoDecider),
            _ => return Err(Problem::TwoDeciders),
        };
        let decider_name = match c.kind {
            Some(BuiltinKind::Regex) => "`kind = \"regex\"`",
            Some(BuiltinKind::MaxLength) => "`kind = \"max_length\"`",
            Some(BuiltinKind::DenyTopics) => "`kind = \"deny_topics\"`",
            Some(BuiltinKind::Schema) => "`kind = \"schema\"`",
            Some(BuiltinKind::DropFields) => "`kind = \"drop_fields\"`",
            None => decider,
        };
        // Fields each decider reads; any other set field is a mistake.
        let reads: &[&str] = match c.kind {
            Some(BuiltinKind::Regex) => &["pattern", "action", "replacement", "message"],
            Some(BuiltinKind::MaxLength) => &["max", "action", "message"],
            Some(BuiltinKind::DenyTopics) => &["topics", "action", "message"],
            Some(BuiltinKind::Schema) => &["schema", "action", "message"],
            Some(BuiltinKind::DropFields) => &["fields"],
            None => &["message", "on_error"],
        };
        let set = [
            ("pattern", c.pattern.is_some()),
            ("action", c.action.is_some()),
            ("replacement", c.replacement.is_some()),
            ("max", c.max.is_some()),
            ("topics", !c.topics.is_empty()),
            ("schema", c.schema.is_some()),
            ("fields", !c.fields.is_empty()),
            ("message", c.message.is_some()),
            ("on_error", c.on_error.is_some()),
        ];
        for (field, is_set) in set {
            if is_set && !reads.contains(&field) {
                return Err(Problem::NotApplicable {
                    field,
                    decider: decider_name,
                });
            }
        }
        if !c.tools.is_empty() && !c.stage.is_tool() {
            return Err(Problem::ToolStagesOnly {
                field: "tools",
                stage: c.stage,
            });
        }
        if c.tools.len() > MAX_TOOL_FILTER {
            return Err(Problem::TooMany {
                field: "tools",
                max: MAX_TOOL_FILTER,
            });
        }
        if c.tools.iter().any(|t| t.trim().is_empty()) {
            return Err(Problem::Blank { field: "tools" });
        }
        if c.action == Some(Action::Redact) && c.kind != Some(BuiltinKind::Regex) {
            return Err(Problem::RedactNeedsRegex);
        }
        if let Some(message) = &c.message {
            check_text("message", message, MAX_MESSAGE_CHARS)?;
        }
        let check = match c.kind {
            Some(BuiltinKind::Regex) => {
                let pattern = c.pattern.as_deref().ok_or(Problem::Missing {
                    field: "pattern",
                    decider: decider_name,
                })?;
                if pattern.is_empty() {
                    return Err(Problem::Empty { field: "pattern" });
                }
                if pattern.len() > MAX_PATTERN_BYTES {
                    return Err(Problem::TooLong {
                        field: "pattern",
                        max: MAX_PATTERN_BYTES,
                    });
                }
                let regex = build_regex(pattern).map_err(|error| Problem::BadPattern { error })?;
                let redact = match c.action.unwrap_or_default() {
                    Action::Block => {
                        if c.replacement.is_some() {
                            return Err(Problem::ReplacementWithoutRedact);
                        }
                        None
                    }
                    Action::Redact => {
                        let replacement = c
                            .replacement
                            .clone()
                            .unwrap_or_else(|| DEFAULT_REPLACEMENT.into());
                        if replacement.chars().count() > MAX_MESSAGE_CHARS {
                            return Err(Problem::TooLong {
                                field: "replacement",
                                max: MAX_MESSAGE_CHARS,
                            });
                        }
                        Some(replacement)
                    }
                };
                Check::Regex { regex, redact }
            }
            Some(BuiltinKind::MaxLength) => Check::MaxLength(c.max.ok_or(Problem::Missing {
                field: "max",
                decider: decider_name,
            })?),
            Some(BuiltinKind::DenyTopics) => {
                if c.topics.is_empty() {
                    return Err(Problem::Missing {
                        field: "topics",
                        decider: decider_name,
                    });
                }
                if c.topics.len() > MAX_TOPICS {
                    return Err(Problem::TooMany {
                        field: "topics",
                        max: MAX_TOPICS,
                    });
                }
                for topic in &c.topics {
                    check_text("topics", topic, MAX_TOPIC_CHARS)?;
                }
                let regex = build_regex(&topics_pattern(&c.topics))
                    .map_err(|error| Problem::TopicsTooLarge { error })?;
                Check::DenyTopics(regex)
            }
            Some(BuiltinKind::Schema) => {
                let schema = c.schema.as_ref().ok_or(Problem::Missing {
                    field: "schema",
                    decider: decider_name,
                })?;
                let validator =
                    ParamValidator::new(schema, false).map_err(|e| Problem::BadSchema {
                        error: cut(&e.0, 300),
                    })?;
                Check::Schema(validator)
            }
            Some(BuiltinKind::DropFields) => {
                if !c.stage.is_tool() {
                    return Err(Problem::DropFieldsStage { stage: c.stage });
                }
                if c.fields.is_empty() {
                    return Err(Problem::Missing {
                        field: "fields",
                        decider: decider_name,
                    });
                }
                if c.fields.len() > MAX_FIELDS {
                    return Err(Problem::TooMany {
                        field: "fields",
                        max: MAX_FIELDS,
                    });
                }
                let mut paths = Vec::with_capacity(c.fields.len());
                for path in &c.fields {
                    let parts: Vec<String> = path.split('.').map(str::to_string).collect();
                    if path.len() > MAX_FIELD_PATH_BYTES || parts.iter().any(String::is_empty) {
                        return Err(Problem::BadPath {
                            path: cut(path, 80),
                        });
                    }
                    paths.push(parts);
                }
                Check::DropFields(paths)
            }
            None => {
                let (target, name) = match (&c.tool, &c.agent) {
                    (Some(tool), _) => (Target::Tool, tool),
                    (_, Some(agent)) => (Target::Agent, agent),
                    _ => unreachable!("one decider, checked above"),
                };
                let field = if target == Target::Tool {
                    "tool"
                } else {
                    "agent"
                };
                check_text(field, name, 128)?;
                Check::External {
                    target,
                    name: name.clone(),
                    on_error: c.on_error.unwrap_or_default(),
                }
            }
        };
        Ok(Guardrail {
            name: c.name.clone(),
            stage: c.stage,
            tools: c.tools.clone(),
            message: c.message.clone(),
            check,
        })
    }

    fn admits(&self, tool: Option<&str>) -> bool {
        if !self.stage.is_tool() || self.tools.is_empty() {
            return true;
        }
        tool.is_some_and(|t| self.tools.iter().any(|n| n == t))
    }

    fn public_message(&self) -> String {
        self.message
            .clone()
            .unwrap_or_else(|| format!("blocked by guardrail {} ({})", self.name, self.stage))
    }
}

impl Check {
    /// A built-in's verdict; the subject is changed in place.
    fn run(&self, subject: &mut Subject) -> Verdict {
        let block = |reason: &str| Verdict::Block {
            message: None,
            reason: Some(reason.to_string()),
        };
        match self {
            Check::Regex {
                regex,
                redact: None,
            } => {
                if any_text(subject, &mut |s| regex.is_match(s)) {
                    block("the pattern matched")
                } else {
                    Verdict::Allow
                }
            }
            Check::Regex {
                regex,
                redact: Some(replacement),
            } => {
                let mut replaced = false;
                each_text_mut(subject, &mut |s| {
                    if let std::borrow::Cow::Owned(new) =
                        regex.replace_all(s, regex::NoExpand(replacement))
                    {
                        *s = new;
                        replaced = true;
                    }
                });
                if replaced {
                    Verdict::Changed(DecisionAction::Redact)
                } else {
                    Verdict::Allow
                }
            }
            Check::MaxLength(max) => {
                let chars = match subject {
                    Subject::Text(t) => t.chars().count(),
                    Subject::Json(v) => serde_json::to_string(v)
                        .map(|s| s.chars().count())
                        .unwrap_or(usize::MAX),
                };
                if chars > *max {
                    block(&format!("{chars} characters, more than {max}"))
                } else {
                    Verdict::Allow
                }
            }
            Check::DenyTopics(regex) => {
                if any_text(subject, &mut |s| regex.is_match(s)) {
                    block("a denied topic was found")
                } else {
                    Verdict::Allow
                }
            }
            Check::Schema(validator) => {
                let value = match subject {
                    Subject::Text(t) => match serde_json::from_str::<Value>(t) {
                        Ok(v) => v,
                        Err(e) => {
                            // serde_json's message names the place, not the text.
                            return block(&format!("not JSON: {e}"));
                        }
                    },
                    Subject::Json(v) => v.clone(),
                };
                match validator.validate(value) {
                    Ok(_) => Verdict::Allow,
                    Err(errors) => {
                        // Fields and keywords only: the messages quote values.
                        let fields: Vec<String> = errors
                            .iter()
                            .map(|e| {
                                let field = if e.field.is_empty() {
                                    "(root)"
                                } else {
                                    &e.field
                                };
                                format!("{} ({})", cut(field, 80), e.code)
                            })
                            .collect();
                        block(&format!("schema: {}", fields.join(", ")))
                    }
                }
            }
            Check::DropFields(paths) => {
                let Subject::Json(value) = subject else {
                    return Verdict::Allow;
                };
                let mut dropped = false;
                for path in paths {
                    dropped |= drop_path(value, path);
                }
                if dropped {
                    Verdict::Changed(DecisionAction::Redact)
                } else {
                    Verdict::Allow
                }
            }
            Check::External { .. } => unreachable!("external checks are not run inline"),
        }
    }
}

/// Reads a tool's or agent's reply and applies it to `subject`.
fn apply_reply(reply: Value, subject: &mut Subject) -> Result<Verdict, String> {
    let object = match reply {
        Value::Object(o) => o,
        Value::String(s) => {
            let trimmed = s.trim();
            if let Ok(Value::Object(o)) = serde_json::from_str::<Value>(trimmed) {
                o
            } else {
                let head: String = trimmed.chars().take(5).collect::<String>().to_lowercase();
                if head.starts_with("allow") {
                    return Ok(Verdict::Allow);
                }
                if head.starts_with("deny") {
                    return Ok(Verdict::Block {
                        message: None,
                        reason: Some("denied (a text answer)".into()),
                    });
                }
                return Err(
                    "the answer is neither a JSON object nor text starting with allow or deny"
                        .into(),
                );
            }
        }
        other => {
            return Err(format!(
                "the answer is {}, not a JSON object",
                json_type_name(&other)
            ));
        }
    };
    let decision = object
        .get("decision")
        .and_then(Value::as_str)
        .ok_or("the answer has no string `decision`")?;
    match decision.to_ascii_lowercase().as_str() {
        "allow" => Ok(Verdict::Allow),
        "deny" => {
            let message = match object.get("message") {
                None | Some(Value::Null) => None,
                Some(Value::String(m)) if !m.trim().is_empty() => Some(cut(m, MAX_MESSAGE_CHARS)),
                Some(Value::String(_)) => None,
                Some(_) => return Err("the answer's `message` is not a string".into()),
            };
            Ok(Verdict::Block {
                message,
                reason: Some("denied".into()),
            })
        }
        "rewrite" => {
            match subject {
                Subject::Text(t) => match object.get("text") {
                    Some(Value::String(new)) => *t = new.clone(),
                    _ => return Err("a rewrite of text has no string `text`".into()),
                },
                Subject::Json(v) => match object.get("value") {
                    Some(new) => *v = new.clone(),
                    None => return Err("a rewrite of JSON has no `value`".into()),
                },
            }
            Ok(Verdict::Changed(DecisionAction::Rewrite))
        }
        _ => Err("the answer's `decision` is not allow, deny or rewrite".into()),
    }
}

fn build_regex(pattern: &str) -> Result<Regex, String> {
    RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .nest_limit(REGEX_NEST_LIMIT)
        .build()
        .map_err(|e| cut(&e.to_string(), 300))
}

/// `(?i)(?:\bloan\b|\bcredit\s+card\b|c\+\+)`: each topic escaped, its
/// inner whitespace any run of whitespace, bounded by `\b` on each side
/// that is a word character (a `\b` after `c++` would need a word next).
fn topics_pattern(topics: &[String]) -> String {
    let alternatives: Vec<String> = topics
        .iter()
        .map(|topic| {
            let topic = topic.trim();
            let words: Vec<String> = topic.split_whitespace().map(regex::escape).collect();
            let word_char = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
            format!(
                "{}{}{}",
                if word_char(topic.chars().next()) {
                    r"\b"
                } else {
                    ""
                },
                words.join(r"\s+"),
                if word_char(topic.chars().last()) {
                    r"\b"
                } else {
                    ""
                },
            )
        })
        .collect();
    format!("(?i)(?:{})", alternatives.join("|"))
}

/// True when `f` holds for the text, or for any string leaf of the JSON.
fn any_text(subject: &Subject, f: &mut dyn FnMut(&str) -> bool) -> bool {
    fn walk(v: &Value, f: &mut dyn FnMut(&str) -> bool) -> bool {
        match v {
            Value::String(s) => f(s),
            Value::Array(items) => items.iter().any(|i| walk(i, f)),
            Value::Object(o) => o.values().any(|i| walk(i, f)),
            _ => false,
        }
    }
    match subject {
        Subject::Text(t) => f(t),
        Subject::Json(v) => walk(v, f),
    }
}

/// Calls `f` on the text, or on every string leaf of the JSON.
fn each_text_mut(subject: &mut Subject, f: &mut dyn FnMut(&mut String)) {
    fn walk(v: &mut Value, f: &mut dyn FnMut(&mut String)) {
        match v {
            Value::String(s) => f(s),
            Value::Array(items) => items.iter_mut().for_each(|i| walk(i, f)),
            Value::Object(o) => o.values_mut().for_each(|i| walk(i, f)),
            _ => {}
        }
    }
    match subject {
        Subject::Text(t) => f(t),
        Subject::Json(v) => walk(v, f),
    }
}

/// Removes `path` from `value` (through arrays, element by element); true
/// when something was removed.
fn drop_path(value: &mut Value, path: &[String]) -> bool {
    match value {
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |dropped, item| drop_path(item, path) | dropped),
        Value::Object(o) => match path {
            [] => false,
            [last] => o.remove(last).is_some(),
            [first, rest @ ..] => o.get_mut(first).is_some_and(|inner| drop_path(inner, rest)),
        },
        _ => false,
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().count() <= MAX_NAME_CHARS
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn check_text(field: &'static str, text: &str, max: usize) -> Result<(), Problem> {
    if text.trim().is_empty() {
        return Err(Problem::Blank { field });
    }
    if text.chars().count() > max {
        return Err(Problem::TooLong { field, max });
    }
    Ok(())
}

/// At most `max` characters of `s`, with `…` when cut.
fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_string(),
        Some((end, _)) => format!("{}…", &s[..end]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Mutex;

    const CARD: &str = r"\b(?:\d[ -]?){12,15}\d\b";

    fn one(value: Value) -> GuardrailConfig {
        serde_json::from_value(value).expect("a well-formed config")
    }

    fn compile(values: &[Value]) -> Guardrails {
        let configs: Vec<_> = values.iter().cloned().map(one).collect();
        Guardrails::compile(&configs).expect("a valid list")
    }

    fn problem(values: &[Value]) -> GuardrailError {
        let configs: Vec<_> = values.iter().cloned().map(one).collect();
        Guardrails::compile(&configs).expect_err("an invalid list")
    }

    fn text(set: &Guardrails, stage: Stage, t: &str) -> Checked {
        set.run_builtin(stage, None, Subject::Text(t.into()))
    }

    fn json_at(set: &Guardrails, stage: Stage, tool: &str, v: Value) -> Checked {
        set.run_builtin(stage, Some(tool), Subject::Json(v))
    }

    fn actions(c: &Checked) -> Vec<(&str, DecisionAction)> {
        c.decisions
            .iter()
            .map(|d| (d.guardrail.as_str(), d.action))
            .collect()
    }

    #[test]
    fn a_regex_blocks_on_a_match_in_text_or_any_string_leaf() {
        let set = compile(
            &[json!({"name": "no-card", "stage": "input", "kind": "regex",
            "pattern": CARD, "message": "No card numbers, please."})],
        );
        let c = text(&set, Stage::Input, "pay with 4111 1111 1111 1111 now");
        let tripped = c.tripped.as_ref().expect("blocked");
        assert_eq!(tripped.guardrail, "no-card");
        assert_eq!(tripped.stage, Stage::Input);
        assert_eq!(tripped.message, "No card numbers, please.");
        assert_eq!(actions(&c), [("no-card", DecisionAction::Block)]);
        assert!(text(&set, Stage::Input, "my order 1234 is late").passed());
        // Another stage's guardrails do not run.
        assert!(text(&set, Stage::Output, "4111 1111 1111 1111").passed());

        let set = compile(&[
            json!({"name": "no-card", "stage": "tool_input", "kind": "regex",
            "pattern": CARD}),
        ]);
        let deep = json!({"a": [{"b": "x"}, {"c": ["card 4111-1111-1111-1111"]}]});
        assert!(!json_at(&set, Stage::ToolInput, "t", deep).passed());
        // Keys are not searched, nor numbers.
        let keys = json!({"4111 1111 1111 1111": 4111111111111111_u64});
        assert!(json_at(&set, Stage::ToolInput, "t", keys).passed());
    }

    #[test]
    fn a_regex_redacts_a_card_number_in_text_and_in_nested_json() {
        let set = compile(&[json!({"name": "pii", "stage": "output", "kind": "regex",
            "pattern": CARD, "action": "redact"})]);
        let c = text(&set, Stage::Output, "card 4111 1111 1111 1111, thanks");
        assert!(c.passed());
        assert_eq!(c.subject.as_text(), Some("card [redacted], thanks"));
        assert_eq!(actions(&c), [("pii", DecisionAction::Redact)]);
        // Nothing replaced: no decision.
        let c = text(&set, Stage::Output, "nothing to hide");
        assert!(c.decisions.is_empty());
        assert_eq!(c.subject.as_text(), Some("nothing to hide"));

        let set = compile(&[
            json!({"name": "pii", "stage": "tool_output", "kind": "regex",
            "pattern": CARD, "action": "redact", "replacement": "$0 [card]"}),
        ]);
        let c = json_at(
            &set,
            Stage::ToolOutput,
            "cards",
            json!({"cards": [{"number": "4111 1111 1111 1111", "n": 1}], "note": "ok"}),
        );
        assert_eq!(
            c.subject.into_json().unwrap(),
            // The replacement is literal: `$0` is not the match.
            json!({"cards": [{"number": "$0 [card]", "n": 1}], "note": "ok"})
        );
    }

    #[test]
    fn max_length_counts_characters_of_text_and_of_compact_json() {
        let set = compile(&[
            json!({"name": "short", "stage": "input", "kind": "max_length",
            "max": 5}),
        ]);
        assert!(
            text(&set, Stage::Input, "ééééé").passed(),
            "5 characters, 10 bytes"
        );
        let c = text(&set, Stage::Input, "éééééé");
        assert_eq!(
            c.tripped.unwrap().message,
            "blocked by guardrail short (input)"
        );
        let set = compile(&[
            json!({"name": "short", "stage": "tool_input", "kind": "max_length",
            "max": 7}),
        ]);
        // `{"a":1}` is 7 characters compact.
        assert!(json_at(&set, Stage::ToolInput, "t", json!({"a": 1})).passed());
        assert!(!json_at(&set, Stage::ToolInput, "t", json!({"a": 10})).passed());
    }

    #[test]
    fn deny_topics_match_whole_words_and_phrases_in_any_case() {
        let set = compile(&[
            json!({"name": "topics", "stage": "input", "kind": "deny_topics",
            "topics": ["loan", "credit card", "C++"]}),
        ]);
        for blocked in [
            "I want a LOAN",
            "loan?",
            "my Credit\n   Card is lost",
            "do you write c++ code",
        ] {
            assert!(!text(&set, Stage::Input, blocked).passed(), "{blocked}");
        }
        for passed in ["Ask Sloane", "loans are fine", "creditcard", "cards", "c+"] {
            assert!(text(&set, Stage::Input, passed).passed(), "{passed}");
        }
        let set = compile(&[json!({"name": "topics", "stage": "tool_output",
            "kind": "deny_topics", "topics": ["loan"]})]);
        let leaf = json!({"items": [{"title": "Payday Loan offers"}]});
        assert!(!json_at(&set, Stage::ToolOutput, "t", leaf).passed());
    }

    #[test]
    fn a_schema_guardrail_validates_text_as_json_and_json_as_is() {
        let schema = json!({"type": "object",
            "properties": {"answer": {"type": "string"}, "score": {"type": "integer", "minimum": 0}},
            "required": ["answer"]});
        let set = compile(
            &[json!({"name": "typed", "stage": "output", "kind": "schema",
            "schema": schema})],
        );
        assert!(text(&set, Stage::Output, r#"{"answer": "yes", "score": 3}"#).passed());
        let c = text(&set, Stage::Output, r#"{"score": -12345}"#);
        let tripped = c.tripped.expect("a miss blocks");
        assert_eq!(tripped.message, "blocked by guardrail typed (output)");
        let reason = tripped.reason.unwrap();
        assert!(reason.contains("answer (required)"), "{reason}");
        assert!(reason.contains("score (minimum)"), "{reason}");
        assert!(!reason.contains("12345"), "the value stays out: {reason}");
        assert!(!text(&set, Stage::Output, "yes").passed(), "not JSON");
        assert!(!text(&set, Stage::Output, "[1]").passed(), "not an object");

        let set = compile(&[
            json!({"name": "typed", "stage": "tool_output", "kind": "schema",
            "schema": {"type": "object", "required": ["id"]}}),
        ]);
        assert!(json_at(&set, Stage::ToolOutput, "t", json!({"id": 1})).passed());
        assert!(!json_at(&set, Stage::ToolOutput, "t", json!({"di": 1})).passed());
    }

    #[test]
    fn drop_fields_removes_paths_through_objects_and_arrays() {
        let set = compile(&[
            json!({"name": "hide", "stage": "tool_output", "kind": "drop_fields",
            "fields": ["account.ssn", "accounts.ssn", "top"]}),
        ]);
        let c = json_at(
            &set,
            Stage::ToolOutput,
            "accounts",
            json!({
                "top": 1,
                "account": {"ssn": "078-05-1120", "name": "A"},
                "accounts": [{"ssn": "1", "id": 1}, {"id": 2}, {"ssn": "3", "id": 3}],
            }),
        );
        assert!(c.passed());
        assert_eq!(actions(&c), [("hide", DecisionAction::Redact)]);
        assert_eq!(
            c.subject.into_json().unwrap(),
            json!({"account": {"name": "A"}, "accounts": [{"id": 1}, {"id": 2}, {"id": 3}]})
        );
        // A top-level array, and nothing to drop: no decision.
        let c = json_at(
            &set,
            Stage::ToolOutput,
            "t",
            json!([{"account": {"ssn": "x"}}, {"other": 1}]),
        );
        assert_eq!(
            c.subject.as_json().unwrap(),
            &json!([{"account": {}}, {"other": 1}])
        );
        let c = json_at(&set, Stage::ToolOutput, "t", json!({"accounts": "ssn"}));
        assert!(c.decisions.is_empty());
    }

    #[test]
    fn guardrails_run_in_order_a_redaction_feeds_the_next_and_a_block_stops() {
        let redact = json!({"name": "redact", "stage": "input", "kind": "regex",
            "pattern": CARD, "action": "redact"});
        let block = json!({"name": "block", "stage": "input", "kind": "regex", "pattern": CARD});
        let after = json!({"name": "after", "stage": "input", "kind": "regex",
            "pattern": "card", "action": "redact", "replacement": "c"});
        let msg = "my card 4111 1111 1111 1111";
        let c = text(
            &compile(&[redact.clone(), block.clone()]),
            Stage::Input,
            msg,
        );
        assert!(c.passed(), "the block sees the redacted text");
        assert_eq!(c.subject.as_text(), Some("my card [redacted]"));
        let c = text(&compile(&[block, redact, after]), Stage::Input, msg);
        assert_eq!(c.tripped.as_ref().unwrap().guardrail, "block");
        assert_eq!(
            actions(&c),
            [("block", DecisionAction::Block)],
            "nothing ran after"
        );
        assert_eq!(c.subject.as_text(), Some(msg));
    }

    #[test]
    fn then_runs_the_first_list_before_the_second() {
        let tenant = compile(&[json!({"name": "x", "stage": "input", "kind": "regex",
            "pattern": "a", "action": "redact", "replacement": "b"})]);
        let agent = compile(&[
            json!({"name": "x", "stage": "input", "kind": "regex", "pattern": "b"}),
            json!({"name": "judge", "stage": "output", "agent": "reviewer"}),
            json!({"name": "scan", "stage": "tool_input", "tool": "scanner"}),
            json!({"name": "scan2", "stage": "tool_output", "tool": "scanner"}),
        ]);
        let both = tenant.then(&agent);
        assert_eq!(both.len(), 5);
        let c = text(&both, Stage::Input, "a");
        assert_eq!(
            actions(&c),
            [("x", DecisionAction::Redact), ("x", DecisionAction::Block)]
        );
        assert!(text(&agent.then(&tenant), Stage::Input, "a").passed());
        assert_eq!(both.tools_called(), ["scanner"]);
        assert_eq!(both.agents_called(), ["reviewer"]);
        assert!(both.has_stage(Stage::Output) && !tenant.has_stage(Stage::Output));
        assert!(Guardrails::default().is_empty() && !both.is_empty());
    }

    #[test]
    fn on_tool_stages_the_tools_filter_says_which_calls_are_checked() {
        let set = compile(&[
            json!({"name": "limit", "stage": "tool_input", "kind": "max_length",
            "max": 2, "tools": ["transfer"]}),
        ]);
        let big = json!({"amount": 1});
        assert!(!json_at(&set, Stage::ToolInput, "transfer", big.clone()).passed());
        assert!(json_at(&set, Stage::ToolInput, "quote", big.clone()).passed());
        assert!(
            set.run_builtin(Stage::ToolInput, None, Subject::Json(big))
                .passed()
        );
    }

    fn config_error(values: &[Value], expected: &str) {
        let e = problem(values).to_string();
        assert!(e.contains(expected), "{e:?} does not say {expected:?}");
    }

    #[test]
    fn config_mistakes_are_load_errors_that_name_the_guardrail() {
        config_error(
            &[json!({"name": "g", "stage": "input", "kind": "regex", "tool": "t", "pattern": "x"})],
            "guardrail \"g\" (input): it names more than one check",
        );
        config_error(
            &[json!({"name": "g", "stage": "input"})],
            "guardrail \"g\" (input): it names no check",
        );
        config_error(
            &[json!({"name": "g", "stage": "input", "kind": "regex"})],
            "`pattern` is required",
        );
        config_error(
            &[json!({"name": "g", "stage": "input", "kind": "drop_fields", "fields": ["a"]})],
            "drop_fields\"` applies to tool stages only",
        );
        config_error(
            &[
                json!({"name": "g", "stage": "input", "kind": "max_length", "max": 1, "pattern": "x"}),
            ],
            "`pattern` does not apply to `kind = \"max_length\"`",
        );
        config_error(
            &[
                json!({"name": "g", "stage": "input", "kind": "max_length", "max": 1, "action": "redact"}),
            ],
            "`action = \"redact\"` applies to `kind = \"regex\"` only",
        );
        config_error(
            &[
                json!({"name": "g", "stage": "output", "kind": "max_length", "max": 1, "tools": ["t"]}),
            ],
            "`tools` applies to tool stages only",
        );
        config_error(
            &[json!({"name": "g", "stage": "input", "kind": "deny_topics", "topics": []})],
            "`topics` is required",
        );
        config_error(
            &[
                json!({"name": "g", "stage": "tool_input", "kind": "drop_fields", "fields": ["a..b"]}),
            ],
            "not a dotted path",
        );
        config_error(
            &[json!({"name": "g", "stage": "input", "kind": "schema", "schema": {"type": 12}})],
            "`schema` does not compile",
        );
        config_error(
            &[json!({"name": "g", "stage": "input", "tool": "t", "max": 3})],
            "`max` does not apply to `tool`",
        );
        let g = json!({"name": "same", "stage": "input", "kind": "max_length", "max": 1});
        config_error(&[g.clone(), g], "guardrail \"same\" is listed twice");
        config_error(
            &[json!({"name": "has space", "stage": "input", "kind": "max_length", "max": 1})],
            "guardrail #0 is named \"has space\"",
        );
        let many: Vec<Value> = (0..=MAX_GUARDRAILS)
            .map(|i| json!({"name": format!("g{i}"), "stage": "input", "kind": "max_length", "max": 1}))
            .collect();
        config_error(&many, "65 guardrails in one list; at most 64");
    }

    #[test]
    fn a_bad_or_huge_pattern_is_refused_at_load() {
        config_error(
            &[json!({"name": "g", "stage": "input", "kind": "regex", "pattern": "(unclosed"})],
            "guardrail \"g\" (input): `pattern` does not compile",
        );
        // Small to write, far over the compiled size limit.
        config_error(
            &[
                json!({"name": "g", "stage": "input", "kind": "regex", "pattern": r"\w{1000}{1000}"}),
            ],
            "`pattern` does not compile",
        );
        let deep = format!("{}a{}", "(".repeat(200), ")".repeat(200));
        config_error(
            &[json!({"name": "g", "stage": "input", "kind": "regex", "pattern": deep})],
            "`pattern` does not compile",
        );
        config_error(
            &[json!({"name": "g", "stage": "input", "kind": "regex",
                "pattern": "a".repeat(MAX_PATTERN_BYTES + 1)})],
            "`pattern` is longer than 65536",
        );
    }

    #[test]
    fn the_largest_topic_list_allowed_compiles() {
        let topics: Vec<String> = (0..MAX_TOPICS)
            .map(|i| format!("{i:03} {}", "abcd ".repeat(20)))
            .map(|t| t.chars().take(MAX_TOPIC_CHARS).collect())
            .collect();
        assert!(topics.iter().all(|t| t.chars().count() == MAX_TOPIC_CHARS));
        let set = compile(
            &[json!({"name": "g", "stage": "input", "kind": "deny_topics",
            "topics": topics})],
        );
        assert!(
            !text(
                &set,
                Stage::Input,
                &format!("x {} y", topics[MAX_TOPICS - 1])
            )
            .passed()
        );
    }

    #[test]
    fn agent_files_hold_guardrails_as_toml_and_unknown_keys_are_refused() {
        #[derive(Deserialize)]
        struct File {
            guardrails: Vec<GuardrailConfig>,
        }
        let file: File = toml::from_str(
            r#"
            [[guardrails]]
            name = "pii"
            stage = "output"
            kind = "regex"
            pattern = '\d{4}'
            action = "redact"

            [[guardrails]]
            name = "judge"
            stage = "tool_input"
            tool = "policy_check"
            tools = ["transfer"]
            on_error = "allow"
            "#,
        )
        .unwrap();
        assert_eq!(file.guardrails[1].on_error, Some(OnError::Allow));
        assert!(Guardrails::compile(&file.guardrails).is_ok());
        let e = toml::from_str::<File>(
            "[[guardrails]]\nname = \"x\"\nstage = \"input\"\nkind = \"regex\"\npatern = \"a\"\n",
        )
        .err()
        .expect("an unknown key");
        assert!(e.to_string().contains("patern"), "{e}");
        // Echoed back (tenant configs): unset fields stay out.
        let back = serde_json::to_value(&file.guardrails[1]).unwrap();
        assert_eq!(
            back,
            json!({"name": "judge", "stage": "tool_input", "tool": "policy_check",
                "tools": ["transfer"], "on_error": "allow"})
        );
    }

    /// Answers every check with its reply; keeps what it was asked.
    struct Fake {
        reply: Result<Value, String>,
        asked: Mutex<Vec<(String, Value)>>,
    }

    impl Fake {
        fn new(reply: Result<Value, String>) -> Fake {
            Fake {
                reply,
                asked: Mutex::default(),
            }
        }
    }

    #[async_trait::async_trait]
    impl ExternalCheck for Fake {
        async fn check(
            &self,
            target: External<'_>,
            stage: Stage,
            tool: Option<&str>,
            subject: &Subject,
        ) -> Result<Value, String> {
            let who = match target {
                External::Tool(t) => format!("tool {t}"),
                External::Agent(a) => format!("agent {a}"),
            };
            let request = check_request(stage, tool, subject);
            self.asked.lock().unwrap().push((who, request));
            self.reply.clone()
        }
    }

    async fn ask(
        reply: Result<Value, String>,
        on_error: Option<&str>,
        subject: Subject,
    ) -> Checked {
        let stage = if subject.as_text().is_some() {
            "output"
        } else {
            "tool_output"
        };
        let mut config = json!({"name": "judge", "stage": stage, "agent": "reviewer",
            "message": "Not allowed here."});
        if let Some(on_error) = on_error {
            config["on_error"] = on_error.into();
        }
        let set = compile(&[config]);
        let fake = Fake::new(reply);
        let stage = if stage == "output" {
            Stage::Output
        } else {
            Stage::ToolOutput
        };
        set.run(stage, Some("lookup"), subject, &fake).await
    }

    fn t(s: &str) -> Subject {
        Subject::Text(s.into())
    }

    #[tokio::test]
    async fn a_tool_or_agent_decides_allow_deny_or_rewrite() {
        let c = ask(Ok(json!({"decision": "allow"})), None, t("hi")).await;
        assert!(c.passed() && c.decisions.is_empty());
        assert_eq!(c.subject.as_text(), Some("hi"));

        let long = "x".repeat(2000);
        let c = ask(
            Ok(json!({"decision": "deny", "message": long})),
            None,
            t("hi"),
        )
        .await;
        let tripped = c.tripped.unwrap();
        assert_eq!(
            tripped.message.chars().count(),
            MAX_MESSAGE_CHARS + 1,
            "cut, with …"
        );
        let c = ask(Ok(json!({"decision": "deny"})), None, t("hi")).await;
        assert_eq!(c.tripped.unwrap().message, "Not allowed here.");

        let c = ask(
            Ok(json!({"decision": "rewrite", "text": "hello"})),
            None,
            t("hi"),
        )
        .await;
        assert!(c.passed());
        assert_eq!(c.subject.as_text(), Some("hello"));
        assert_eq!(actions(&c), [("judge", DecisionAction::Rewrite)]);
        let c = ask(
            Ok(json!({"decision": "rewrite", "value": {"a": 2}})),
            None,
            Subject::Json(json!({"a": 1})),
        )
        .await;
        assert_eq!(c.subject.as_json(), Some(&json!({"a": 2})));

        // An agent's text answers.
        let c = ask(Ok(json!(r#" {"decision": "DENY"} "#)), None, t("hi")).await;
        assert!(!c.passed());
        let c = ask(Ok(json!("Allow: it is harmless")), None, t("hi")).await;
        assert!(c.passed());
        let c = ask(Ok(json!("deny, it asks for a password")), None, t("hi")).await;
        assert_eq!(c.tripped.unwrap().message, "Not allowed here.");
    }

    #[tokio::test]
    async fn an_error_or_an_unreadable_answer_counts_as_on_error() {
        let bad = [
            Err("the tool timed out".to_string()),
            Ok(json!({"decision": "rewrite", "value": {"a": 1}})), // text needs `text`
            Ok(json!({"decision": "maybe"})),
            Ok(json!("I am not sure")),
            Ok(json!(42)),
            Ok(json!({"decision": "deny", "message": 5})),
        ];
        for reply in bad {
            let c = ask(reply.clone(), None, t("hi")).await;
            let tripped = c
                .tripped
                .as_ref()
                .unwrap_or_else(|| panic!("{reply:?} passed"));
            assert_eq!(tripped.message, "Not allowed here.");
            assert_eq!(actions(&c), [("judge", DecisionAction::Block)]);
            let c = ask(reply.clone(), Some("allow"), t("hi")).await;
            assert!(c.passed() && c.decisions.is_empty(), "{reply:?}");
            assert_eq!(c.subject.as_text(), Some("hi"));
        }
        // A JSON subject rewritten as text is the wrong shape too.
        let c = ask(
            Ok(json!({"decision": "rewrite", "text": "x"})),
            None,
            Subject::Json(json!({"a": 1})),
        )
        .await;
        assert!(!c.passed());
    }

    #[tokio::test]
    async fn the_checker_is_sent_the_stage_the_tool_and_the_subject() {
        let set = compile(&[
            json!({"name": "redact", "stage": "tool_input", "kind": "regex", "pattern": "\\d",
                "action": "redact", "replacement": "#"}),
            json!({"name": "policy", "stage": "tool_input", "tool": "policy_check",
                "tools": ["transfer"]}),
        ]);
        let fake = Fake::new(Ok(json!({"decision": "allow"})));
        let args = json!({"to": "acc 12"});
        let c = set
            .run(
                Stage::ToolInput,
                Some("transfer"),
                Subject::Json(args.clone()),
                &fake,
            )
            .await;
        assert!(c.passed());
        let c2 = set
            .run(Stage::ToolInput, Some("quote"), Subject::Json(args), &fake)
            .await;
        assert!(c2.passed());
        let asked = fake.asked.lock().unwrap().clone();
        assert_eq!(
            asked,
            [(
                "tool policy_check".to_string(),
                // After the redaction before it; the `quote` call was not sent.
                json!({"stage": "tool_input", "tool": "transfer", "value": {"to": "acc ##"}})
            )]
        );
        assert_eq!(
            check_request(Stage::Input, Some("ignored"), &t("hi")),
            json!({"stage": "input", "text": "hi"})
        );
    }

    #[test]
    fn without_a_checker_tool_and_agent_guardrails_count_as_on_error() {
        let closed = compile(&[json!({"name": "judge", "stage": "input", "agent": "reviewer"})]);
        let c = text(&closed, Stage::Input, "hi");
        assert_eq!(
            c.tripped.unwrap().message,
            "blocked by guardrail judge (input)"
        );
        let open = compile(&[
            json!({"name": "judge", "stage": "input", "agent": "reviewer",
            "on_error": "allow"}),
        ]);
        assert!(text(&open, Stage::Input, "hi").passed());
    }

    #[test]
    fn a_subject_never_shows_its_text_in_debug_output() {
        let s = format!("{:?}", t("4111 1111 1111 1111"));
        assert!(!s.contains("4111"), "{s}");
        let s = format!("{:?}", Subject::Json(json!({"ssn": "078-05-1120"})));
        assert!(!s.contains("078"), "{s}");
    }

    #[test]
    fn running_a_stage_is_a_send_future() {
        fn send<T: Send>(_: T) {}
        let set = Guardrails::default();
        let fake = Fake::new(Ok(json!({"decision": "allow"})));
        send(set.run(Stage::Input, None, t("x"), &fake));
    }

    #[test]
    fn decisions_and_trips_serialize_in_snake_case() {
        let d = Decision {
            guardrail: "pii".into(),
            stage: Stage::ToolOutput,
            action: DecisionAction::Redact,
        };
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            json!({"guardrail": "pii", "stage": "tool_output", "action": "redact"})
        );
        let tripped = Tripped {
            guardrail: "g".into(),
            stage: Stage::Input,
            message: "no".into(),
            reason: Some("internal".into()),
        };
        let v = serde_json::to_value(&tripped).unwrap();
        assert_eq!(
            v,
            json!({"guardrail": "g", "stage": "input", "message": "no"})
        );
    }
}
