//! What goes into a tool call (the execution context) and what comes out (the
//! result), for every caller alike: conversation, workflow node, direct HTTP.
//!
//! [`ErrorType`] is the one table of tool failures: its code, whether a retry
//! may help, and the HTTP status a direct caller sees. The model sees
//! [`ToolExecutionResult::model_content`], built from the same fields.

use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

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
        }
    }
}

/// Why a call did not succeed; the stable codes of architecture §4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
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
}

/// One row of the tool-failure table.
struct ErrorTypeRow {
    kind: ErrorType,
    code: &'static str,
    /// Whether the same call may succeed if tried again later.
    retryable: bool,
    /// The HTTP status a direct caller (`POST /v1/tools/{name}/invoke`) gets.
    http_status: u16,
}

/// Every tool failure kind, one row each, in the enum's order.
const ERROR_TYPES: [ErrorTypeRow; 13] = {
    const fn row(
        kind: ErrorType,
        code: &'static str,
        retryable: bool,
        http_status: u16,
    ) -> ErrorTypeRow {
        ErrorTypeRow {
            kind,
            code,
            retryable,
            http_status,
        }
    }
    [
        row(ErrorType::ToolNotFound, "tool_not_found", false, 404),
        row(ErrorType::PlanRequired, "plan_required", false, 403),
        row(ErrorType::RateLimited, "rate_limited", true, 429),
        row(ErrorType::ValidationError, "validation_error", false, 422),
        row(ErrorType::QueueFull, "queue_full", true, 429),
        row(ErrorType::Timeout, "timeout", true, 504),
        row(ErrorType::ExecutionError, "execution_error", false, 502),
        row(
            ErrorType::PendingConfirmation,
            "pending_confirmation",
            false,
            202,
        ),
        row(ErrorType::ToolUnavailable, "tool_unavailable", true, 503),
        row(ErrorType::ToolNotOffered, "tool_not_offered", false, 403),
        row(ErrorType::Declined, "declined", false, 403),
        row(ErrorType::OutcomeUnknown, "outcome_unknown", false, 409),
        row(
            ErrorType::LimitsUnavailable,
            "limits_unavailable",
            true,
            503,
        ),
    ]
};

impl ErrorType {
    /// Every kind, in table order.
    pub const ALL: [ErrorType; 13] = {
        let mut all = [ErrorType::ToolNotFound; 13];
        let mut i = 0;
        while i < 13 {
            all[i] = ERROR_TYPES[i].kind;
            i += 1;
        }
        all
    };

    fn row(self) -> &'static ErrorTypeRow {
        &ERROR_TYPES[self as usize]
    }

    /// The wire code (`rate_limited`), as serde writes it.
    pub fn as_str(self) -> &'static str {
        self.row().code
    }

    /// Whether the same call may succeed if tried again later.
    pub fn is_retryable(self) -> bool {
        self.row().retryable
    }

    /// The HTTP status a direct caller gets.
    pub fn http_status(self) -> u16 {
        self.row().http_status
    }
}

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
    /// For `rate_limited`: when a retry may pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// For `pending_confirmation`: what to approve or deny.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirmation_id: Option<String>,
    /// When the tool began to run (its concurrency slot held): the call
    /// record's `started_at`. Not part of the answer.
    #[serde(skip)]
    pub started_at: Option<jiff::Timestamp>,
    /// For `pending_confirmation`: the id the held call's record is
    /// written under (its decision rewrites that record). Not part of the
    /// answer.
    #[serde(skip)]
    pub record_id: Option<String>,
}

/// The deepest nesting of a tool's output that is kept. Every output is
/// stored inside its call record (two more levels) and read back with
/// serde_json, which refuses documents nested over 128 levels: a deeper
/// output would be written fine and then make every listing that reads it
/// fail. A tool (or the upstream behind it) answering deeper fails the call
/// instead (`execution_error`).
pub const MAX_OUTPUT_DEPTH: usize = 64;

/// The deepest nesting of a tool call's arguments that is accepted, the
/// same as an output's: deeper arguments fail the call as a
/// `validation_error`, and are kept (in records, turn replies and
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
    fn the_error_type_table_has_one_row_per_kind_in_order() {
        for (i, kind) in ErrorType::ALL.iter().enumerate() {
            assert_eq!(*kind as usize, i, "row {i} is out of order");
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                kind.as_str(),
                "serde and the table disagree"
            );
        }
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
