//! What goes into a tool call (the execution context) and what comes out (the
//! result), for every caller alike: conversation, workflow node, direct HTTP.
//!
//! [`ErrorType`] says why a call failed. It has no table of its own: each
//! kind is a row of the one table of public codes
//! ([`crate::error_code`]), whose row gives its wire name (`error_type`,
//! upper-case: `RATE_LIMITED`), whether a retry may help and the HTTP status
//! a direct caller sees. A call held for a person's confirmation is the
//! one kind that is not an error and has no row:
//! `CONFIRMATION_REQUIRED`, 202. Results and records stored with the old
//! lower-case names (`rate_limited`) read back as the same kinds. The
//! model sees [`ToolExecutionResult::model_content`], built from the same
//! fields.

use std::time::Duration;

use axum::http::StatusCode;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error_code::{CONFIRMATION_REQUIRED, ErrorCode, tool_outcome_name};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CallerType {
    ConversationAgent,
    WorkflowNode,
    Direct,
}

impl CallerType {
    pub fn as_str(self) -> &'static str {
        match self {
            CallerType::ConversationAgent => "conversation_agent",
            CallerType::WorkflowNode => "workflow_node",
            CallerType::Direct => "direct",
        }
    }
}

/// Who calls, on whose behalf, and with which limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExecutionContext {
    pub caller_id: String,
    pub caller_type: CallerType,
    pub conversation_id: Option<String>,
    pub workflow_id: Option<String>,
    pub user_id: Option<String>,
    #[serde(default)]
    pub plan: super::Plan,
    /// Overrides the tool's and the executor's default timeout.
    #[serde(skip)]
    pub timeout: Option<Duration>,
    pub max_retries: u32,
    /// Queue order under the `priority` strategy: higher first.
    #[serde(default)]
    pub priority: i32,
    /// The workflow node making the call, for workflow callers.
    #[serde(default)]
    pub node_id: Option<String>,
    /// The tenant the call is made for.
    #[serde(default)]
    pub tenant: Option<String>,
    /// Result-cache TTL in seconds for this call (`Some(0)`: never cached);
    /// `None`: the tool's own.
    #[serde(default)]
    pub cache_ttl: Option<u64>,
    #[serde(default)]
    pub variables: Value,
    /// The conversation turn making the call (durable turns: its finished
    /// calls are found by turn and `tool_call_id` when it resumes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// Stable key of this call, `<session>:<turn>:<tool_call_id>`: the same
    /// on every attempt and after a resume, handed to the tool (HTTP
    /// `Idempotency-Key`, command input, MCP `_meta`) so a tool that
    /// honours it never repeats a side effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The handle the calling conversation writes its session through. The
    /// call's intent is committed fenced by it, so a node that lost the
    /// session meanwhile runs nothing ([`crate::store::owners`]).
    #[serde(skip)]
    pub writer: Option<crate::store::SessionWriter>,
    /// Where an `ask_` call streams its child's events: the calling
    /// turn's stream, when its caller streams ([`super::delegate`]).
    #[serde(skip)]
    pub child_events: Option<super::delegate::ChildEvents>,
    /// Fired when the calling turn is cut: an `ask_` call then cuts its
    /// child's turn ([`super::delegate`]).
    #[serde(skip)]
    pub cut: Option<super::delegate::TurnCut>,
}

impl ExecutionContext {
    pub fn new(caller_type: CallerType, caller_id: impl Into<String>) -> Self {
        ExecutionContext {
            caller_id: caller_id.into(),
            caller_type,
            conversation_id: None,
            workflow_id: None,
            user_id: None,
            plan: super::Plan::Free,
            timeout: None,
            max_retries: 0,
            priority: 0,
            node_id: None,
            tenant: None,
            cache_ttl: None,
            variables: Value::Null,
            turn_id: None,
            idempotency_key: None,
            writer: None,
            child_events: None,
            cut: None,
        }
    }
}

/// Why a call did not succeed. Each kind is a row of the one table of
/// public codes ([`ErrorType::code`]), but one: a call held for a person's
/// confirmation, which is not an error ([`CONFIRMATION_REQUIRED`]).
///
/// On the wire it is the code (`RATE_LIMITED`); the lower-case names of
/// records stored before (`rate_limited`) read as the same kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    ToolNotFound,
    PlanRequired,
    RateLimited,
    ValidationError,
    QueueFull,
    Timeout,
    ExecutionError,
    PendingConfirmation,
    /// The tool exists but what serves it is down (an MCP server being
    /// restarted); it may come back.
    ToolUnavailable,
    /// The model named a tool its turn did not offer (another agent's tool,
    /// or any tool for an agent with none): refused before admission.
    ToolNotOffered,
    /// A person declined the call held for confirmation (or it expired
    /// undecided): it did not run.
    Declined,
    /// A durable turn resumed after a crash found the call's intent but no
    /// outcome: the tool (`side_effects: at_most_once`) may or may not have
    /// run, and is not run again.
    OutcomeUnknown,
    /// Cluster mode: the shared limits (rate windows, concurrency permits)
    /// could not be checked because Redis is unreachable and
    /// `[cluster] redis_failure` is `closed`; the call did not run.
    LimitsUnavailable,
    /// A guardrail refused the call's arguments (before it ran) or its
    /// output (before the model saw it).
    GuardrailTripped,
}

impl ErrorType {
    /// Every kind.
    pub const ALL: [ErrorType; 14] = [
        ErrorType::ToolNotFound,
        ErrorType::PlanRequired,
        ErrorType::RateLimited,
        ErrorType::ValidationError,
        ErrorType::QueueFull,
        ErrorType::Timeout,
        ErrorType::ExecutionError,
        ErrorType::PendingConfirmation,
        ErrorType::ToolUnavailable,
        ErrorType::ToolNotOffered,
        ErrorType::Declined,
        ErrorType::OutcomeUnknown,
        ErrorType::LimitsUnavailable,
        ErrorType::GuardrailTripped,
    ];

    /// The row of the public table the kind is; `None` for
    /// [`ErrorType::PendingConfirmation`], which is not an error.
    pub const fn code(self) -> Option<ErrorCode> {
        Some(match self {
            ErrorType::ToolNotFound => ErrorCode::ToolNotFound,
            ErrorType::PlanRequired => ErrorCode::ToolPlanRequired,
            ErrorType::RateLimited => ErrorCode::RateLimited,
            ErrorType::ValidationError => ErrorCode::ValidationError,
            ErrorType::QueueFull => ErrorCode::ToolQueueFull,
            ErrorType::Timeout => ErrorCode::ToolTimeout,
            ErrorType::ExecutionError => ErrorCode::ToolExecutionError,
            ErrorType::PendingConfirmation => return None,
            ErrorType::ToolUnavailable => ErrorCode::ToolUnavailable,
            ErrorType::ToolNotOffered => ErrorCode::ToolNotOffered,
            ErrorType::Declined => ErrorCode::ToolDeclined,
            ErrorType::OutcomeUnknown => ErrorCode::ToolOutcomeUnknown,
            ErrorType::LimitsUnavailable => ErrorCode::LimitsUnavailable,
            ErrorType::GuardrailTripped => ErrorCode::GuardrailTripped,
        })
    }

    /// The wire name (`RATE_LIMITED`): its code's.
    pub const fn as_str(self) -> &'static str {
        match self.code() {
            Some(code) => code.as_str(),
            None => CONFIRMATION_REQUIRED,
        }
    }

    /// The kind of a wire name: a code, or a lower-case name of before.
    pub fn parse(name: &str) -> Option<ErrorType> {
        let name = tool_outcome_name(name);
        ErrorType::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// Whether the same call may succeed if tried again later: its code's
    /// `retryable`.
    pub fn is_retryable(self) -> bool {
        self.code().is_some_and(ErrorCode::is_retryable)
    }

    /// The HTTP status a direct caller gets: its code's (202 for a held
    /// call).
    pub fn http_status(self) -> StatusCode {
        self.code().map_or(StatusCode::ACCEPTED, ErrorCode::status)
    }
}

impl std::fmt::Display for ErrorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(d)?;
        ErrorType::parse(&name).ok_or_else(|| {
            serde::de::Error::custom(format_args!("unknown tool error type `{name}`"))
        })
    }
}

impl utoipa::PartialSchema for ErrorType {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        let mut description = String::from(
            "Why a tool call did not succeed: a code of the `ErrorCode` table, or \
             `CONFIRMATION_REQUIRED` (held for a person's decision, not an error). \
             Each, with the HTTP status a direct call gets and whether retrying may help:\n\n\
             | error_type | status | retryable |\n|---|---|---|\n",
        );
        for kind in ErrorType::ALL {
            description.push_str(&format!(
                "| `{}` | {} | {} |\n",
                kind.as_str(),
                kind.http_status().as_u16(),
                kind.is_retryable()
            ));
        }
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(ErrorType::ALL.iter().map(|k| k.as_str())))
            .description(Some(description))
            .into()
    }
}

impl utoipa::ToSchema for ErrorType {}

/// One field's validation failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FieldError {
    /// Dotted path of the parameter (`""` for the arguments as a whole).
    pub field: String,
    /// The JSON Schema keyword that failed (`required`, `type`, `pattern`...),
    /// or `invalid_json` when the arguments did not parse.
    pub code: String,
    pub message: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResultMetadata {
    pub cached: bool,
    pub attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub as_of: Option<String>,
    /// For `RATE_LIMITED`: when a retry may pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// For `CONFIRMATION_REQUIRED`: what to approve or deny.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirmation_id: Option<String>,
    /// When the tool began to run (its concurrency slot held): the call
    /// record's `started_at`. Not part of the answer.
    #[serde(skip)]
    pub started_at: Option<jiff::Timestamp>,
    /// For `CONFIRMATION_REQUIRED`: the id the held call's record is
    /// written under (its decision rewrites that record). Not part of the
    /// answer.
    #[serde(skip)]
    pub record_id: Option<String>,
    /// The call's record holds exactly the arguments the caller passed
    /// (no validation coerced them, no guardrail redacted them): a turn
    /// record may name the record instead of repeating them
    /// (`conversation::turn_rows`). Set by the executor with
    /// `record_id`. Not part of the answer.
    #[serde(skip)]
    pub params_recorded: bool,
}

/// The deepest nesting of a tool's output that is kept. Every output is
/// stored inside its call record (two more levels) and read back with
/// serde_json, which refuses documents nested over 128 levels: a deeper
/// output would be written fine and then make every listing that reads it
/// fail. A tool (or the upstream behind it) answering deeper fails the call
/// instead (`TOOL_EXECUTION_ERROR`).
pub const MAX_OUTPUT_DEPTH: usize = 64;

/// The deepest nesting of a tool call's arguments that is accepted, the
/// same as an output's: deeper arguments fail the call as a
/// `VALIDATION_ERROR`, and are kept (in records, turn replies and
/// histories) as their raw text, a JSON string, which reads back.
pub const MAX_ARGUMENT_DEPTH: usize = MAX_OUTPUT_DEPTH;

/// The longest raw text of refused too-deep arguments that is kept.
const MAX_KEPT_ARGUMENT_CHARS: usize = 4096;

/// A model's tool call arguments, parsed once where its reply arrives (the
/// conversation machine) and handed along: to the turn's reply, the
/// `tool_call_started` event, the executor's record and its validation.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedArguments {
    /// The JSON (`{}` for empty arguments); the raw text as a string when
    /// it is not JSON, or nests deeper than [`MAX_ARGUMENT_DEPTH`] (then
    /// cut to 4,096 characters), so every record of it reads back.
    pub value: Value,
    pub problem: Option<ArgumentsProblem>,
}

/// Why arguments are kept as text.
#[derive(Debug, Clone, PartialEq)]
pub enum ArgumentsProblem {
    /// Not JSON: the parser's message.
    NotJson(String),
    /// Nested deeper than [`MAX_ARGUMENT_DEPTH`].
    TooDeep,
}

impl ParsedArguments {
    /// The one parse of a call's raw arguments.
    pub fn parse(raw: &str) -> ParsedArguments {
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            return ParsedArguments {
                value: Value::Object(Default::default()),
                problem: None,
            };
        }
        match serde_json::from_str::<Value>(trimmed) {
            Ok(v) if json_depth(&v, MAX_ARGUMENT_DEPTH) <= MAX_ARGUMENT_DEPTH => ParsedArguments {
                value: v,
                problem: None,
            },
            Ok(_) => ParsedArguments {
                value: Value::String(cut_chars(raw, MAX_KEPT_ARGUMENT_CHARS)),
                problem: Some(ArgumentsProblem::TooDeep),
            },
            Err(e) => ParsedArguments {
                value: Value::String(raw.to_string()),
                problem: Some(ArgumentsProblem::NotJson(e.to_string())),
            },
        }
    }
}

/// `value`, or its JSON text (cut to 4,096 characters) as a string when it
/// nests deeper than [`MAX_ARGUMENT_DEPTH`]. `true` with it: too deep.
pub fn kept_arguments(value: &Value) -> (Value, bool) {
    if json_depth(value, MAX_ARGUMENT_DEPTH) <= MAX_ARGUMENT_DEPTH {
        (value.clone(), false)
    } else {
        let text = cut_chars(&value.to_string(), MAX_KEPT_ARGUMENT_CHARS);
        (Value::String(text), true)
    }
}

/// The largest output (as JSON) an upstream tool (a tool file's command or
/// URL, an MCP server) may answer: every later model call of the
/// conversation carries it. Tool files' own `max_output_bytes` is read
/// before parsing and is 1 MiB by default; this bounds MCP results, which
/// rmcp only caps at its message size.
pub const MAX_UPSTREAM_OUTPUT_BYTES: usize = 1 << 20;

/// The longest error text a call reports (the model sees it; an upstream
/// writes it).
pub const MAX_ERROR_CHARS: usize = 2048;

/// `text` cut to `max` characters, marked when cut.
pub fn cut_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}… (cut at {max} characters)", &text[..at]),
        None => text.to_string(),
    }
}

/// How deeply `value` nests (a scalar is 0, `[]` and `{}` are 1), counted
/// without recursion, and at most `limit + 1` (it stops looking there).
pub fn json_depth(value: &Value, limit: usize) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((v, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(a) => Box::new(a.iter()),
            Value::Object(o) => Box::new(o.values()),
            _ => continue,
        };
        let depth = depth + 1;
        deepest = deepest.max(depth);
        if deepest > limit {
            return deepest;
        }
        stack.extend(children.map(|c| (c, depth)));
    }
    deepest
}

/// The outcome of one tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = ToolResult)]
pub struct ToolExecutionResult {
    pub is_success: bool,
    pub tool_name: String,
    pub output: Option<Value>,
    pub error: Option<String>,
    pub error_type: Option<ErrorType>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validation_errors: Vec<FieldError>,
    pub execution_time_ms: u64,
    pub executed_at: Timestamp,
    pub metadata: ResultMetadata,
}

impl ToolExecutionResult {
    pub fn success(tool_name: &str, output: Value, elapsed: Duration, attempts: u32) -> Self {
        let source_id = output
            .get("source_id")
            .and_then(Value::as_str)
            .map(str::to_string);
        let as_of = output
            .get("as_of")
            .and_then(Value::as_str)
            .map(str::to_string);
        ToolExecutionResult {
            is_success: true,
            tool_name: tool_name.into(),
            output: Some(output),
            error: None,
            error_type: None,
            validation_errors: Vec::new(),
            execution_time_ms: elapsed.as_millis() as u64,
            executed_at: Timestamp::now(),
            metadata: ResultMetadata {
                cached: false,
                attempts,
                source_id,
                as_of,
                ..ResultMetadata::default()
            },
        }
    }

    pub fn failure(tool_name: &str, error_type: ErrorType, error: impl Into<String>) -> Self {
        ToolExecutionResult {
            is_success: false,
            tool_name: tool_name.into(),
            output: None,
            error: Some(error.into()),
            error_type: Some(error_type),
            validation_errors: Vec::new(),
            execution_time_ms: 0,
            executed_at: Timestamp::now(),
            metadata: ResultMetadata::default(),
        }
    }

    pub fn with_elapsed(mut self, elapsed: Duration, attempts: u32) -> Self {
        self.execution_time_ms = elapsed.as_millis() as u64;
        self.metadata.attempts = attempts;
        self
    }

    /// The `role: tool` message content the model reads: the output on
    /// success, else the error with its type (and field errors), so the model
    /// can correct itself.
    pub fn model_content(&self) -> String {
        if self.is_success {
            match &self.output {
                Some(Value::String(s)) => s.clone(),
                Some(v) => v.to_string(),
                None => "null".into(),
            }
        } else {
            let mut body = json!({
                "error": self.error,
                "error_type": self.error_type.map(ErrorType::as_str),
            });
            if !self.validation_errors.is_empty() {
                body["validation_errors"] = json!(self.validation_errors);
            }
            if let Some(t) = self.error_type {
                body["retryable"] = json!(t.is_retryable());
            }
            body.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_containers_and_stops_past_the_limit() {
        assert_eq!(json_depth(&serde_json::json!(1), 10), 0);
        assert_eq!(json_depth(&serde_json::json!([]), 10), 1);
        assert_eq!(json_depth(&serde_json::json!({"a": [1, {"b": []}]}), 10), 4);
        let mut deep = serde_json::json!(0);
        for _ in 0..500 {
            deep = serde_json::json!([deep]);
        }
        assert_eq!(json_depth(&deep, 64), 65);
    }

    #[test]
    fn every_kind_is_a_row_of_the_one_table() {
        let mut names = Vec::new();
        for (i, kind) in ErrorType::ALL.iter().enumerate() {
            assert_eq!(*kind as usize, i, "ALL is out of order at {i}");
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                kind.as_str(),
                "serde and the table disagree"
            );
            assert_eq!(ErrorType::parse(kind.as_str()), Some(*kind));
            match kind.code() {
                Some(code) => {
                    assert_eq!(kind.as_str(), code.as_str());
                    assert_eq!(kind.http_status(), code.status());
                    assert_eq!(kind.is_retryable(), code.is_retryable());
                }
                None => {
                    assert_eq!(*kind, ErrorType::PendingConfirmation);
                    assert_eq!(kind.as_str(), "CONFIRMATION_REQUIRED");
                    assert_eq!(kind.http_status(), StatusCode::ACCEPTED);
                    assert!(!kind.is_retryable());
                }
            }
            names.push(kind.as_str());
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorType::ALL.len(), "two kinds share a code");
    }

    #[test]
    fn results_stored_with_the_old_lower_case_names_read_back_as_codes() {
        let old = [
            ("tool_not_found", ErrorType::ToolNotFound),
            ("plan_required", ErrorType::PlanRequired),
            ("rate_limited", ErrorType::RateLimited),
            ("validation_error", ErrorType::ValidationError),
            ("queue_full", ErrorType::QueueFull),
            ("timeout", ErrorType::Timeout),
            ("execution_error", ErrorType::ExecutionError),
            ("pending_confirmation", ErrorType::PendingConfirmation),
            ("tool_unavailable", ErrorType::ToolUnavailable),
            ("tool_not_offered", ErrorType::ToolNotOffered),
            ("declined", ErrorType::Declined),
            ("outcome_unknown", ErrorType::OutcomeUnknown),
            ("limits_unavailable", ErrorType::LimitsUnavailable),
        ];
        // Every kind of before had a lower-case name (the one added since
        // has its code only).
        assert_eq!(old.len() + 1, ErrorType::ALL.len());
        for (name, kind) in old {
            let read: ErrorType = serde_json::from_value(json!(name)).unwrap();
            assert_eq!(read, kind, "{name}");
            // Written again, it is the code.
            assert_eq!(serde_json::to_value(read).unwrap(), kind.as_str());
        }
        let result: ToolExecutionResult = serde_json::from_value(json!({
            "is_success": false, "tool_name": "t", "output": null,
            "error": "slow down", "error_type": "rate_limited",
            "execution_time_ms": 0, "executed_at": "2026-01-01T00:00:00Z",
            "metadata": {"cached": false, "attempts": 1},
        }))
        .unwrap();
        assert_eq!(result.error_type, Some(ErrorType::RateLimited));
        assert!(
            result
                .model_content()
                .contains(r#""error_type":"RATE_LIMITED""#)
        );
        assert!(serde_json::from_value::<ErrorType>(json!("no_such_kind")).is_err());
    }

    #[test]
    fn arguments_are_parsed_once_into_what_every_reader_keeps() {
        let ok = ParsedArguments::parse(r#" {"a": 1} "#);
        assert_eq!(ok.value, serde_json::json!({"a": 1}));
        assert_eq!(ok.problem, None);
        // Some models send nothing for no arguments.
        assert_eq!(ParsedArguments::parse("  ").value, serde_json::json!({}));
        let bad = ParsedArguments::parse("{not json");
        assert_eq!(bad.value, Value::String("{not json".into()));
        assert!(matches!(bad.problem, Some(ArgumentsProblem::NotJson(_))));
        let deep = format!(
            "{}1{}",
            "[".repeat(MAX_ARGUMENT_DEPTH + 1),
            "]".repeat(MAX_ARGUMENT_DEPTH + 1)
        );
        let kept = ParsedArguments::parse(&deep);
        assert_eq!(kept.problem, Some(ArgumentsProblem::TooDeep));
        assert!(kept.value.is_string());
    }
}
