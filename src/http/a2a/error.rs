//! A2A's errors, in both bindings' shapes: a JSON-RPC `error` object
//! (`code`, `message`, `data: [ErrorInfo]`) and the HTTP+JSON binding's
//! `google.rpc.Status` body (`{"error": {code, status, message, details}}`),
//! with the codes and statuses of the specification's §5.4 table.
//!
//! cadre's own errors (budget exceeded, rate limited, a busy session, the
//! store down…) have no A2A type: over JSON-RPC they are code `-32000`
//! (JSON-RPC's implementation-defined server error; A2A v1.0 uses
//! -32001…-32009) with an `ErrorInfo` whose `domain` is `cadre` and whose
//! `reason` is cadre's error code (`BUDGET_EXCEEDED`); over HTTP+JSON
//! they keep cadre's status with the same `ErrorInfo`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::conversation::SessionError;
use crate::http::error::ApiError;

/// The domain of A2A's own `ErrorInfo` reasons.
const A2A_DOMAIN: &str = "a2a-protocol.org";

#[derive(Debug)]
pub enum A2aError {
    /// -32700: the body is not JSON.
    Parse(String),
    /// -32600: not a JSON-RPC request object.
    InvalidRequest(String),
    /// -32601.
    MethodNotFound(String),
    /// -32602: parameters that do not fit the method.
    InvalidParams(String),
    TaskNotFound(String),
    TaskNotCancelable(String),
    PushNotificationNotSupported,
    UnsupportedOperation(String),
    ContentTypeNotSupported(String),
    ExtendedAgentCardNotConfigured,
    VersionNotSupported(String),
    /// One of cadre's own errors.
    Cadre(ApiError),
}

impl From<ApiError> for A2aError {
    fn from(e: ApiError) -> Self {
        A2aError::Cadre(e)
    }
}

impl From<SessionError> for A2aError {
    fn from(e: SessionError) -> Self {
        A2aError::Cadre(ApiError::from(e))
    }
}

impl A2aError {
    /// The JSON-RPC code.
    pub fn code(&self) -> i64 {
        match self {
            A2aError::Parse(_) => -32700,
            A2aError::InvalidRequest(_) => -32600,
            A2aError::MethodNotFound(_) => -32601,
            A2aError::InvalidParams(_) => -32602,
            A2aError::TaskNotFound(_) => -32001,
            A2aError::TaskNotCancelable(_) => -32002,
            A2aError::PushNotificationNotSupported => -32003,
            A2aError::UnsupportedOperation(_) => -32004,
            A2aError::ContentTypeNotSupported(_) => -32005,
            A2aError::ExtendedAgentCardNotConfigured => -32007,
            A2aError::VersionNotSupported(_) => -32009,
            A2aError::Cadre(_) => -32000,
        }
    }

    /// `ErrorInfo.reason` and its domain.
    fn reason(&self) -> (String, &'static str) {
        let a2a = |r: &str| (r.to_string(), A2A_DOMAIN);
        match self {
            A2aError::Parse(_) => a2a("PARSE_ERROR"),
            A2aError::InvalidRequest(_) => a2a("INVALID_REQUEST"),
            A2aError::MethodNotFound(_) => a2a("METHOD_NOT_FOUND"),
            A2aError::InvalidParams(_) => a2a("INVALID_PARAMS"),
            A2aError::TaskNotFound(_) => a2a("TASK_NOT_FOUND"),
            A2aError::TaskNotCancelable(_) => a2a("TASK_NOT_CANCELABLE"),
            A2aError::PushNotificationNotSupported => a2a("PUSH_NOTIFICATION_NOT_SUPPORTED"),
            A2aError::UnsupportedOperation(_) => a2a("UNSUPPORTED_OPERATION"),
            A2aError::ContentTypeNotSupported(_) => a2a("CONTENT_TYPE_NOT_SUPPORTED"),
            A2aError::ExtendedAgentCardNotConfigured => a2a("EXTENDED_AGENT_CARD_NOT_CONFIGURED"),
            A2aError::VersionNotSupported(_) => a2a("VERSION_NOT_SUPPORTED"),
            A2aError::Cadre(e) => (e.code.as_str().to_string(), "cadre"),
        }
    }

    pub fn message(&self) -> String {
        match self {
            A2aError::Parse(m)
            | A2aError::InvalidRequest(m)
            | A2aError::InvalidParams(m)
            | A2aError::UnsupportedOperation(m)
            | A2aError::ContentTypeNotSupported(m)
            | A2aError::VersionNotSupported(m) => m.clone(),
            A2aError::MethodNotFound(m) => format!("no method '{m}'"),
            A2aError::TaskNotFound(id) => format!("no task '{id}'"),
            A2aError::TaskNotCancelable(m) => m.clone(),
            A2aError::PushNotificationNotSupported => {
                "push notifications are not supported: stream the task (SendStreamingMessage, SubscribeToTask) or poll it (GetTask)".into()
            }
            A2aError::ExtendedAgentCardNotConfigured => {
                "this agent has no extended card: its public card says everything".into()
            }
            A2aError::Cadre(e) => e.message.clone(),
        }
    }

    /// The HTTP status of the HTTP+JSON binding.
    pub fn status(&self) -> StatusCode {
        match self {
            A2aError::TaskNotFound(_) | A2aError::MethodNotFound(_) => StatusCode::NOT_FOUND,
            A2aError::Cadre(e) => e.status,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    fn error_info(&self) -> Value {
        let (reason, domain) = self.reason();
        let mut info = json!({
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": reason,
            "domain": domain,
        });
        if let A2aError::Cadre(e) = self
            && let Some(details) = &e.details
        {
            // ErrorInfo's metadata is a map of strings.
            let metadata: serde_json::Map<String, Value> = details
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| {
                    let text = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                    (k.clone(), Value::String(text))
                })
                .collect();
            info["metadata"] = Value::Object(metadata);
        }
        info
    }

    /// The `error` member of a JSON-RPC response.
    pub fn jsonrpc(&self) -> Value {
        json!({
            "code": self.code(),
            "message": self.message(),
            "data": [self.error_info()],
        })
    }

    /// The HTTP+JSON binding's `google.rpc.Status` body.
    pub fn status_body(&self) -> Value {
        let status = self.status();
        json!({"error": {
            "code": status.as_u16(),
            "status": self.grpc_status(),
            "message": self.message(),
            "details": [self.error_info()],
        }})
    }

    /// The canonical gRPC status name (§5.4; cadre's errors: from their
    /// HTTP status).
    fn grpc_status(&self) -> &'static str {
        match self {
            A2aError::TaskNotFound(_) | A2aError::MethodNotFound(_) => "NOT_FOUND",
            A2aError::Parse(_)
            | A2aError::InvalidRequest(_)
            | A2aError::InvalidParams(_)
            | A2aError::ContentTypeNotSupported(_) => "INVALID_ARGUMENT",
            A2aError::Cadre(e) => grpc_status(e.status),
            _ => "FAILED_PRECONDITION",
        }
    }

    /// `Retry-After` of a cadre error, in seconds.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            A2aError::Cadre(e) => e.retry_after_secs,
            _ => None,
        }
    }
}

/// The HTTP+JSON binding's error reply.
impl IntoResponse for A2aError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), Json(self.status_body())).into_response();
        if let Some(secs) = self.retry_after() {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// The canonical gRPC status name of an HTTP status (`google.rpc.Code`).
fn grpc_status(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 413 | 415 | 422 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        501 => "UNIMPLEMENTED",
        503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        s if s >= 500 => "INTERNAL",
        _ => "FAILED_PRECONDITION",
    }
}
