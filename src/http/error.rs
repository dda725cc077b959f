//! From errors to HTTP: every failure leaves the API as
//! `{"error": {"code", "message"}}` with its code's status.
//!
//! domain error ──PublicError──▶ From<E> for ApiError ──▶ response
//! handler ──ApiError::new(ErrorCode::…, message)──────▶ response
//!
//! The codes, their statuses and meanings are one table
//! ([`crate::error_code`]); this file only builds the body (and
//! `Retry-After`, when the error says how long to wait). Internal detail
//! (storage errors) is logged, not sent.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::error_code::{ErrorCode, PublicError};

/// Every error leaves the API in this shape.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    /// Human-readable text; may change between versions.
    pub message: String,
    /// Structured detail for some codes, e.g. `validation_errors` of a workflow input.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<std::collections::BTreeMap<String, Value>>)]
    pub details: Option<Value>,
}

/// `turn_failed`: the turn ended with this error (the stream ends).
#[derive(Debug, Serialize, ToSchema)]
pub struct TurnFailed {
    pub error: ErrorDetail,
    /// The status a JSON reply would have had.
    pub status: u16,
}

/// An error on its way out of the API: a code from the table, the status
/// that answers it, a message for the caller and optional details.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: ErrorCode,
    pub message: String,
    pub details: Option<Value>,
    /// Sent as `Retry-After`, in whole seconds.
    pub retry_after_secs: Option<u64>,
}

impl ApiError {
    /// An error answered with its code's status.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            status: code.status(),
            code,
            message: message.into(),
            details: None,
            retry_after_secs: None,
        }
    }

    /// Keeps a status other than the code's own: only for rewriting an
    /// error response that something else (axum, tower) already answered.
    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub fn validation(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::ValidationError, message)
    }
}

impl ApiError {
    /// `{"code", "message", "details"?}`: the inside of the error body.
    pub fn detail(&self) -> ErrorDetail {
        ErrorDetail {
            code: self.code,
            message: self.message.clone(),
            details: self.details.clone(),
        }
    }

    /// The error as the last event of a stream.
    pub fn sse_event(&self) -> axum::response::sse::Event {
        let failed = TurnFailed {
            error: self.detail(),
            status: self.status.as_u16(),
        };
        axum::response::sse::Event::default()
            .event("turn_failed")
            .data(serde_json::to_string(&failed).unwrap_or_default())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.detail(),
        };
        let mut response = (self.status, Json(body)).into_response();
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// The one way from a domain error to the API: its own code, its public
/// message and details. Failures on cadre's side (5xx) are logged with the
/// full error, which the caller does not see.
impl<E: PublicError> From<E> for ApiError {
    fn from(e: E) -> Self {
        let code = e.code();
        if code.status().is_server_error() {
            tracing::error!(code = code.as_str(), error = %e, "request failed");
        }
        ApiError {
            status: code.status(),
            code,
            message: e.public_message(),
            details: e.details(),
            // Whole seconds, rounded up: never earlier than the wait.
            retry_after_secs: e
                .retry_after()
                .map(|d| d.as_secs() + u64::from(d.subsec_nanos() > 0)),
        }
    }
}
