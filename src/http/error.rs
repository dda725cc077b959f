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
use serde_json::{Value, json};

use crate::error_code::{ErrorCode, PublicError};

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
    /// `{"error": {"code", "message", "details"?}}`.
    pub fn body(&self) -> Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some(d) = &self.details {
            error["details"] = d.clone();
        }
        json!({ "error": error, "status": self.status.as_u16() })
    }

    /// The error as the last event of a stream.
    pub fn sse_event(&self) -> axum::response::sse::Event {
        axum::response::sse::Event::default()
            .event("turn_failed")
            .data(self.body().to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = self.body();
        if let Some(obj) = body.as_object_mut() {
            obj.remove("status");
        }
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
