//! The public error codes: one table, one row per code.
//!
//! domain error (SessionError, TurnError, ModelError, StoreError, ...)
//!     ──PublicError::code()──▶ [`ErrorCode`] ──▶ http::error::ApiError ──▶ `{"error": {"code", "message"}}`
//!                                   └──▶ `/openapi.json` (the `ErrorCode` schema, every response's codes)
//! tool failure (tools::ErrorType)
//!     ──ErrorType::code()──▶ [`ErrorCode`] ──▶ a tool result's `error_type` (and a direct invoke's status)
//!
//! Every code cadre answers is a row of [`error_codes!`] below: its wire
//! name, its HTTP status, whether cadre itself retries an operation that
//! failed with it, and one line of meaning. Nothing else writes a code as
//! a string: handlers name the variant, the document is built from the
//! rows, and each domain error says its own code through [`PublicError`],
//! so one `From` at the HTTP edge turns any of them into a response.
//!
//! It sits on the ground floor (beside `identity`, `events`, `metrics`)
//! rather than in `http` because the domain errors below the HTTP edge
//! (the model's, the store's) must be able to name their code.
//!
//! Decision: `retryable` means "cadre retries by itself" (a workflow's
//! agent node whose turn failed with it, with backoff). Storage refusals
//! are not retried inside cadre: a turn the store refused was not
//! acknowledged, and the client retries once `/readyz` says ready. For a
//! tool outcome it is what the model reads as `retryable`: the same call
//! may succeed if tried again later.
//!
//! Tool outcomes are rows of the same table (issue #30: one table, one
//! vocabulary). The tools layer keeps its own enum, `tools::ErrorType`,
//! but no table: each of its kinds names its [`ErrorCode`], whose row
//! gives the `error_type` a tool result carries (in a direct invoke's
//! answer, a call record, the tool message a model reads, a
//! `tool_call_completed` event, an MCP result, a workflow node's error),
//! the HTTP status a direct caller gets and the `retryable` flag. Kinds
//! whose meaning an API code already has reuse its row (`RATE_LIMITED`,
//! `VALIDATION_ERROR`, `TOOL_NOT_FOUND`, `LIMITS_UNAVAILABLE`); the others
//! have rows of their own, prefixed `TOOL_` where a bare name would be
//! ambiguous (`TOOL_TIMEOUT` beside `MODEL_TIMEOUT`). A tool's plan
//! refusal is `TOOL_PLAN_REQUIRED`, not `PLAN_NOT_ENTITLED`: the latter
//! says a request asked for more than its key allows (ask for less), the
//! former that the tool needs more than the call has (upgrade), and a
//! direct invoke can answer either.
//!
//! A call held for a person's confirmation is not an error and has no
//! row (every row is a 4xx or 5xx, the `{"error": ...}` bodies carry only
//! rows): its `error_type` is [`CONFIRMATION_REQUIRED`], with status 202
//! and not retryable. Tool outcomes used to have lower-case names of
//! their own (`rate_limited`, `pending_confirmation`); [`tool_outcome_name`]
//! reads records written with them as the codes of today.

use axum::http::StatusCode;

/// Declares [`ErrorCode`] and its table from one list of rows.
macro_rules! error_codes {
    ($( $variant:ident = $code:literal, $status:ident, $retryable:literal, $meaning:literal; )*) => {
        /// A stable, machine-readable error code of the HTTP API.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum ErrorCode {
            $(
                #[doc = $meaning]
                $variant,
            )*
        }

        impl ErrorCode {
            /// Every code, in table order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),*];

            /// The code as it goes on the wire (`SESSION_NOT_FOUND`).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $code,)*
                }
            }

            /// The HTTP status that answers it.
            pub const fn status(self) -> StatusCode {
                match self {
                    $(ErrorCode::$variant => StatusCode::$status,)*
                }
            }

            /// Whether cadre retries, by itself, an operation that failed with it.
            pub const fn is_retryable(self) -> bool {
                match self {
                    $(ErrorCode::$variant => $retryable,)*
                }
            }

            /// One line: what the code means.
            pub const fn meaning(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $meaning,)*
                }
            }
        }
    };
}

error_codes! {
    MalformedJson = "MALFORMED_JSON", BAD_REQUEST, false,
        "the body is not valid JSON";
    BadRequest = "BAD_REQUEST", BAD_REQUEST, false,
        "the request is malformed (e.g. a query string that does not parse)";
    IdempotencyKeyInvalid = "IDEMPOTENCY_KEY_INVALID", BAD_REQUEST, false,
        "the `Idempotency-Key` header is empty, sent twice, over 255 characters or not printable ASCII";
    Unauthorized = "UNAUTHORIZED", UNAUTHORIZED, false,
        "no valid API key (`Authorization: Bearer <key>`)";
    AdminRequired = "ADMIN_REQUIRED", FORBIDDEN, false,
        "the operation needs an admin API key";
    MetricsKeyRequired = "METRICS_KEY_REQUIRED", FORBIDDEN, false,
        "`/metrics` needs an admin key or a metrics (scrape) key";
    ScrapeOnlyKey = "SCRAPE_ONLY_KEY", FORBIDDEN, false,
        "a metrics (scrape) key may read `/metrics` and nothing else";
    PlanNotEntitled = "PLAN_NOT_ENTITLED", FORBIDDEN, false,
        "the request asks for a plan above what its key and tenant allow";
    ForbiddenHost = "FORBIDDEN_HOST", FORBIDDEN, false,
        "a server without API keys answers only loopback `Host` names (`localhost`, `127.0.0.1`, `[::1]`) and WebSockets only from loopback pages (DNS rebinding)";
    SuggestionsDisabled = "SUGGESTIONS_DISABLED", FORBIDDEN, false,
        "reply suggestions are turned off for this tenant";
    ToolPlanRequired = "TOOL_PLAN_REQUIRED", FORBIDDEN, false,
        "(a tool outcome) the tool needs a higher plan than the call runs with; the error names the plan";
    ToolNotOffered = "TOOL_NOT_OFFERED", FORBIDDEN, false,
        "(a tool outcome) the model named a tool its turn did not offer (another agent's tool, or any tool for an agent with none): refused before admission";
    ToolDeclined = "TOOL_DECLINED", FORBIDDEN, false,
        "(a tool outcome) a person declined the call held for confirmation, or it expired undecided: it did not run";
    NotFound = "NOT_FOUND", NOT_FOUND, false,
        "no such route";
    SessionNotFound = "SESSION_NOT_FOUND", NOT_FOUND, false,
        "no such session (another tenant's session is answered the same)";
    AgentNotFound = "AGENT_NOT_FOUND", NOT_FOUND, false,
        "no agent with that name";
    ToolNotFound = "TOOL_NOT_FOUND", NOT_FOUND, false,
        "no tool with that name (also a tool outcome: the model named a tool that does not exist)";
    TenantNotFound = "TENANT_NOT_FOUND", NOT_FOUND, false,
        "not a tenant id (letters, digits, '_' or '-', at most 64)";
    WorkflowNotFound = "WORKFLOW_NOT_FOUND", NOT_FOUND, false,
        "no workflow with that name";
    RunNotFound = "RUN_NOT_FOUND", NOT_FOUND, false,
        "no workflow run with that id (another tenant's run is answered the same)";
    ConfirmationNotFound = "CONFIRMATION_NOT_FOUND", NOT_FOUND, false,
        "no pending confirmation with that id";
    KeyNotFound = "KEY_NOT_FOUND", NOT_FOUND, false,
        "no API key with that id";
    ScheduleNotFound = "SCHEDULE_NOT_FOUND", NOT_FOUND, false,
        "no schedule with that id (another tenant's schedule is answered the same)";
    MemoryItemNotFound = "MEMORY_ITEM_NOT_FOUND", NOT_FOUND, false,
        "no memory item with that namespace and key, or it expired (another tenant's is answered the same)";
    DeliveryNotFound = "DELIVERY_NOT_FOUND", NOT_FOUND, false,
        "no webhook event with that id for this tenant";
    MethodNotAllowed = "METHOD_NOT_ALLOWED", METHOD_NOT_ALLOWED, false,
        "the route does not take this method (see `Allow`)";
    ConversationBusy = "CONVERSATION_BUSY", CONFLICT, false,
        "a turn is running in this session and the agent refuses concurrent messages";
    TurnInterrupted = "TURN_INTERRUPTED", CONFLICT, false,
        "a newer message in the session cut this turn (the agent's `multitask` is `interrupt` or `rollback`)";
    TurnNotFound = "TURN_NOT_FOUND", NOT_FOUND, false,
        "no turn with that id in this session";
    TurnNotFinished = "TURN_NOT_FINISHED", CONFLICT, false,
        "a fork names a turn that has not finished (it runs, or waits for an approval), or the session has no finished turn: only a finished turn can be forked";
    RunNotResumable = "RUN_NOT_RESUMABLE", CONFLICT, false,
        "only failed or interrupted workflow runs can be resumed";
    WorkflowDepthExceeded = "WORKFLOW_DEPTH_EXCEEDED", CONFLICT, false,
        "the run starting this one (`x-cadre-parent-run`) is at `[workflows] max_depth`: runs starting runs stop there";
    ConfirmationAlreadyDecided = "CONFIRMATION_ALREADY_DECIDED", CONFLICT, false,
        "the confirmation was already approved or denied (by this request's race or an earlier one)";
    ToolOutcomeUnknown = "TOOL_OUTCOME_UNKNOWN", CONFLICT, false,
        "(a tool outcome) a turn resumed after a crash (or cut by a newer message) found the call's intent but no outcome: the tool (`side_effects: at_most_once`) may or may not have run, and is not run again";
    ConfirmationExpired = "CONFIRMATION_EXPIRED", GONE, false,
        "the confirmation expired before it was decided";
    UpgradeRequired = "UPGRADE_REQUIRED", UPGRADE_REQUIRED, false,
        "the connection cannot be upgraded to a WebSocket";
    PayloadTooLarge = "PAYLOAD_TOO_LARGE", PAYLOAD_TOO_LARGE, false,
        "the body or one of its fields is over its limit";
    StorageQuotaExceeded = "STORAGE_QUOTA_EXCEEDED", PAYLOAD_TOO_LARGE, false,
        "the tenant stores as many bytes of messages as its quota allows (`[tenants] max_storage_mb`, or its config's `max_storage_mb`): no new message is stored until it erases sessions or the quota is raised (`details.stored_bytes`, `details.max_storage_mb`)";
    UnsupportedMediaType = "UNSUPPORTED_MEDIA_TYPE", UNSUPPORTED_MEDIA_TYPE, false,
        "the body is not `application/json`";
    ValidationError = "VALIDATION_ERROR", UNPROCESSABLE_ENTITY, false,
        "a field or parameter is missing, unknown, of the wrong type or out of range (also a tool outcome: the call's arguments do not match the tool's schema, `validation_errors` says where)";
    GuardrailTripped = "GUARDRAIL_TRIPPED", UNPROCESSABLE_ENTITY, false,
        "a guardrail refused the message, the answer, or a tool call's input or output (`details.guardrail`, `details.stage`); nothing it refused was stored, sent to the model or run (also a tool outcome)";
    WebhookRefused = "WEBHOOK_REFUSED", UNPROCESSABLE_ENTITY, false,
        "the `webhook` URL cannot be used: not http(s), longer than 2048 bytes, an address cadre may not reach (loopback, private, link-local, metadata, by IP or by what the name resolves to; unless `[webhooks] allow_private` or `[webhooks] allowlist`), or no signing secret is configured (`[webhooks] secret` or the tenant config's `webhook_secret`)";
    IdempotencyKeyInUse = "IDEMPOTENCY_KEY_IN_USE", CONFLICT, true,
        "cluster mode: a request with this `Idempotency-Key` is running on another node; retry after `Retry-After` (it then gets that request's answer)";
    IdempotencyKeyReused = "IDEMPOTENCY_KEY_REUSED", UNPROCESSABLE_ENTITY, false,
        "the `Idempotency-Key` was used (within `[server] idempotency_keep_h`) for a request with another method, path, body or API key";
    RateLimited = "RATE_LIMITED", TOO_MANY_REQUESTS, true,
        "over the API's per-caller request rate, or too many failed authentications from this address; see `Retry-After` (also a tool outcome: over the tool's per-user or per-tenant rate window, `metadata.retry_after_ms`)";
    TooManyStreams = "TOO_MANY_STREAMS", TOO_MANY_REQUESTS, true,
        "the caller has as many event streams and WebSockets open as allowed";
    TooManyWsTokens = "TOO_MANY_WS_TOKENS", TOO_MANY_REQUESTS, true,
        "as many WebSocket tokens wait to be used as one process keeps (10,000, of them 1,000 per tenant); retry once some are used or expire";
    StreamLagged = "STREAM_LAGGED", TOO_MANY_REQUESTS, false,
        "(a WebSocket `error` frame, never a response) the socket fell more than 1 MiB behind a turn's events: the rest of them are not sent; the turn goes on and is stored (`GET /v1/sessions/{id}/turns/{turn_id}`)";
    ConversationQueueFull = "CONVERSATION_QUEUE_FULL", TOO_MANY_REQUESTS, true,
        "the session already has as many turns waiting as allowed (`[sessions] max_queued_turns`); send once one has run";
    ToolQueueFull = "TOOL_QUEUE_FULL", TOO_MANY_REQUESTS, true,
        "(a tool outcome) the tool's (or the tenant's share of its) concurrency queue is full; retry once calls finish";
    BudgetExceeded = "BUDGET_EXCEEDED", TOO_MANY_REQUESTS, false,
        "the tenant's monthly token budget is spent: no model call until it resets (`Retry-After`, `details.resets_at`)";
    InternalError = "INTERNAL_ERROR", INTERNAL_SERVER_ERROR, false,
        "an unexpected failure inside cadre";
    ModelUnavailable = "MODEL_UNAVAILABLE", BAD_GATEWAY, true,
        "the model endpoint could not be reached or kept answering 429/5xx";
    ToolExecutionError = "TOOL_EXECUTION_ERROR", BAD_GATEWAY, false,
        "(a tool outcome) the tool ran and failed, panicked or answered an output over its limits";
    ModelBadResponse = "MODEL_BAD_RESPONSE", BAD_GATEWAY, false,
        "the model endpoint answered something that is not a chat completion";
    OutputSchemaViolation = "OUTPUT_SCHEMA_VIOLATION", BAD_GATEWAY, false,
        "the model's answer did not match the turn's answer schema (the agent's `output_schema` or the message's `response_format`), asked twice; `details.errors` lists the field errors of the second answer, which was not stored";
    ModelRejected = "MODEL_REJECTED", BAD_GATEWAY, false,
        "the model endpoint refused the request (4xx other than 429)";
    ModelKeyNotSet = "MODEL_KEY_NOT_SET", SERVICE_UNAVAILABLE, false,
        "the agent's `[model] api_key_env` names an environment variable that is not set (or empty) on the server; no model request was sent: set it and restart";
    StorageUnavailable = "STORAGE_UNAVAILABLE", SERVICE_UNAVAILABLE, false,
        "storage refuses writes; nothing was acknowledged, retry when `/readyz` is ready";
    SessionMoved = "SESSION_MOVED", SERVICE_UNAVAILABLE, true,
        "another node of the cluster took the session over; retry the request (with its Idempotency-Key)";
    ConversationUnavailable = "CONVERSATION_UNAVAILABLE", SERVICE_UNAVAILABLE, true,
        "the conversation could not be reached; retry the request";
    ToolUnavailable = "TOOL_UNAVAILABLE", SERVICE_UNAVAILABLE, true,
        "(a tool outcome) the tool exists but what serves it is down (an MCP server being restarted); it may come back";
    LimitsUnavailable = "LIMITS_UNAVAILABLE", SERVICE_UNAVAILABLE, true,
        "cluster mode: Redis, which holds the shared rate limits and concurrency permits, cannot be reached and `[cluster] redis_failure` is `closed`; retry shortly (also a tool outcome: the call did not run)";
    ShuttingDown = "SHUTTING_DOWN", SERVICE_UNAVAILABLE, false,
        "the server is shutting down";
    ModelTimeout = "MODEL_TIMEOUT", GATEWAY_TIMEOUT, true,
        "the model endpoint did not answer in time";
    ToolTimeout = "TOOL_TIMEOUT", GATEWAY_TIMEOUT, true,
        "(a tool outcome) the call did not finish (or get a concurrency slot) within its timeout";
}

impl ErrorCode {
    /// The code of a wire name, if it is one.
    pub fn parse(code: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.as_str() == code)
    }
}

/// The `error_type` of a tool call held for a person's confirmation
/// (`metadata.confirmation_id` says what to approve or deny). Not an
/// error, so not a row of the table: a direct caller gets it with 202.
pub const CONFIRMATION_REQUIRED: &str = "CONFIRMATION_REQUIRED";

/// The lower-case tool outcome names written before they became codes of
/// this table, each with the name of today.
const LEGACY_TOOL_OUTCOMES: [(&str, &str); 13] = [
    ("tool_not_found", ErrorCode::ToolNotFound.as_str()),
    ("plan_required", ErrorCode::ToolPlanRequired.as_str()),
    ("rate_limited", ErrorCode::RateLimited.as_str()),
    ("validation_error", ErrorCode::ValidationError.as_str()),
    ("queue_full", ErrorCode::ToolQueueFull.as_str()),
    ("timeout", ErrorCode::ToolTimeout.as_str()),
    ("execution_error", ErrorCode::ToolExecutionError.as_str()),
    ("pending_confirmation", CONFIRMATION_REQUIRED),
    ("tool_unavailable", ErrorCode::ToolUnavailable.as_str()),
    ("tool_not_offered", ErrorCode::ToolNotOffered.as_str()),
    ("declined", ErrorCode::ToolDeclined.as_str()),
    ("outcome_unknown", ErrorCode::ToolOutcomeUnknown.as_str()),
    ("limits_unavailable", ErrorCode::LimitsUnavailable.as_str()),
];

/// A tool outcome's `error_type` as it reads today: an old lower-case
/// name (a record, turn or run stored before the names became codes) is
/// its code; any other name is itself.
pub fn tool_outcome_name(name: &str) -> &str {
    LEGACY_TOOL_OUTCOMES
        .iter()
        .find(|(old, _)| *old == name)
        .map_or(name, |(_, new)| new)
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// An error that the API may show: it names its own code.
///
/// `public_message` is what the caller reads; by default the error's
/// `Display`. Errors whose text holds internal detail (paths, storage
/// errors) override it, and the detail is logged instead.
pub trait PublicError: std::error::Error {
    fn code(&self) -> ErrorCode;

    fn public_message(&self) -> String {
        self.to_string()
    }

    /// Structured detail for some codes (a workflow input's field errors).
    fn details(&self) -> Option<serde_json::Value> {
        None
    }

    /// How long until asking again can succeed: sent as `Retry-After`.
    fn retry_after(&self) -> Option<std::time::Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_one_row_with_a_distinct_wire_name() {
        let mut names: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "a wire name is used twice");
        for code in ErrorCode::ALL {
            assert!(
                code.as_str()
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_')
            );
            assert!(code.status().is_client_error() || code.status().is_server_error());
            assert_eq!(ErrorCode::parse(code.as_str()), Some(*code));
            assert!(!code.meaning().is_empty());
        }
        assert_eq!(
            serde_json::to_value(ErrorCode::SessionNotFound).unwrap(),
            "SESSION_NOT_FOUND"
        );
    }

    #[test]
    fn old_tool_outcome_names_read_as_codes() {
        assert_eq!(tool_outcome_name("rate_limited"), "RATE_LIMITED");
        assert_eq!(tool_outcome_name("timeout"), "TOOL_TIMEOUT");
        assert_eq!(
            tool_outcome_name("pending_confirmation"),
            CONFIRMATION_REQUIRED
        );
        // Today's names, and names that never were tool outcomes, stay.
        assert_eq!(tool_outcome_name("TOOL_TIMEOUT"), "TOOL_TIMEOUT");
        assert_eq!(tool_outcome_name("something_else"), "something_else");
        for (old, new) in LEGACY_TOOL_OUTCOMES {
            assert!(
                ErrorCode::parse(new).is_some() || new == CONFIRMATION_REQUIRED,
                "{old} maps to {new}, which is no code"
            );
        }
        // The held call's name is no row: no error body carries it.
        assert_eq!(ErrorCode::parse(CONFIRMATION_REQUIRED), None);
    }
}
