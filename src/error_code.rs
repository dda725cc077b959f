//! The public error codes: one table, one row per code.
//!
//! domain error (SessionError, TurnError, ModelError, StoreError, ...)
//!     ──PublicError::code()──▶ [`ErrorCode`] ──▶ http::error::ApiError ──▶ `{"error": {"code", "message"}}`
//!                                   └──▶ `/openapi.json` (the `ErrorCode` schema, every response's codes)
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
//! acknowledged, and the client retries once `/readyz` says ready.

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
    NotFound = "NOT_FOUND", NOT_FOUND, false,
        "no such route";
    SessionNotFound = "SESSION_NOT_FOUND", NOT_FOUND, false,
        "no such session (another tenant's session is answered the same)";
    AgentNotFound = "AGENT_NOT_FOUND", NOT_FOUND, false,
        "no agent with that name";
    ToolNotFound = "TOOL_NOT_FOUND", NOT_FOUND, false,
        "no tool with that name";
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
    MethodNotAllowed = "METHOD_NOT_ALLOWED", METHOD_NOT_ALLOWED, false,
        "the route does not take this method (see `Allow`)";
    ConversationBusy = "CONVERSATION_BUSY", CONFLICT, false,
        "a turn is running in this session and the agent refuses concurrent messages";
    TurnInterrupted = "TURN_INTERRUPTED", CONFLICT, false,
        "a newer message in the session cut this turn (the agent's `multitask` is `interrupt` or `rollback`)";
    TurnNotFound = "TURN_NOT_FOUND", NOT_FOUND, false,
        "no turn with that id in this session";
    RunNotResumable = "RUN_NOT_RESUMABLE", CONFLICT, false,
        "only failed or interrupted workflow runs can be resumed";
    WorkflowDepthExceeded = "WORKFLOW_DEPTH_EXCEEDED", CONFLICT, false,
        "the run starting this one (`x-cadre-parent-run`) is at `[workflows] max_depth`: runs starting runs stop there";
    ConfirmationAlreadyDecided = "CONFIRMATION_ALREADY_DECIDED", CONFLICT, false,
        "the confirmation was already approved or denied (by this request's race or an earlier one)";
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
        "a field or parameter is missing, unknown, of the wrong type or out of range";
    IdempotencyKeyInUse = "IDEMPOTENCY_KEY_IN_USE", CONFLICT, true,
        "cluster mode: a request with this `Idempotency-Key` is running on another node; retry after `Retry-After` (it then gets that request's answer)";
    IdempotencyKeyReused = "IDEMPOTENCY_KEY_REUSED", UNPROCESSABLE_ENTITY, false,
        "the `Idempotency-Key` was used (within `[server] idempotency_keep_h`) for a request with another method, path, body or API key";
    RateLimited = "RATE_LIMITED", TOO_MANY_REQUESTS, true,
        "over the API's per-caller request rate, or too many failed authentications from this address; see `Retry-After`";
    TooManyStreams = "TOO_MANY_STREAMS", TOO_MANY_REQUESTS, true,
        "the caller has as many event streams and WebSockets open as allowed";
    TooManyWsTokens = "TOO_MANY_WS_TOKENS", TOO_MANY_REQUESTS, true,
        "as many WebSocket tokens wait to be used as one process keeps (10,000, of them 1,000 per tenant); retry once some are used or expire";
    StreamLagged = "STREAM_LAGGED", TOO_MANY_REQUESTS, false,
        "(a WebSocket `error` frame, never a response) the socket fell more than 1 MiB behind a turn's events: the rest of them are not sent; the turn goes on and is stored (`GET /v1/sessions/{id}/turns/{turn_id}`)";
    ConversationQueueFull = "CONVERSATION_QUEUE_FULL", TOO_MANY_REQUESTS, true,
        "the session already has as many turns waiting as allowed (`[sessions] max_queued_turns`); send once one has run";
    BudgetExceeded = "BUDGET_EXCEEDED", TOO_MANY_REQUESTS, false,
        "the tenant's monthly token budget is spent: no model call until it resets (`Retry-After`, `details.resets_at`)";
    InternalError = "INTERNAL_ERROR", INTERNAL_SERVER_ERROR, false,
        "an unexpected failure inside cadre";
    ModelUnavailable = "MODEL_UNAVAILABLE", BAD_GATEWAY, true,
        "the model endpoint could not be reached or kept answering 429/5xx";
    ModelBadResponse = "MODEL_BAD_RESPONSE", BAD_GATEWAY, false,
        "the model endpoint answered something that is not a chat completion";
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
    LimitsUnavailable = "LIMITS_UNAVAILABLE", SERVICE_UNAVAILABLE, true,
        "cluster mode: Redis, which holds the shared rate limits and concurrency permits, cannot be reached and `[cluster] redis_failure` is `closed`; retry shortly";
    ShuttingDown = "SHUTTING_DOWN", SERVICE_UNAVAILABLE, false,
        "the server is shutting down";
    ModelTimeout = "MODEL_TIMEOUT", GATEWAY_TIMEOUT, true,
        "the model endpoint did not answer in time";
}

impl ErrorCode {
    /// The code of a wire name, if it is one.
    pub fn parse(code: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.as_str() == code)
    }
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
}
