//! The one table from errors to HTTP: every failure leaves the API as
//! `{"error": {"code", "message"}}` with a fitting status. Internal detail
//! (storage errors) is logged, not sent.

use axum::Json;
use axum::extract::FromRequest;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::conversation::{SessionError, TurnError};
use crate::model::ModelError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            details: None,
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "NOT_FOUND", what)
    }

    pub fn validation(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "VALIDATION_ERROR",
            message,
        )
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
        (self.status, Json(body)).into_response()
    }
}

impl From<SessionError> for ApiError {
    fn from(e: SessionError) -> Self {
        match e {
            SessionError::NotFound { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "SESSION_NOT_FOUND", e.to_string())
            }
            SessionError::AgentNotFound { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "AGENT_NOT_FOUND", e.to_string())
            }
            SessionError::Turn(t) => t.into(),
            SessionError::Store(s) => storage_error(&s),
        }
    }
}

impl From<TurnError> for ApiError {
    fn from(e: TurnError) -> Self {
        match e {
            TurnError::Model(m) => {
                let code = match m {
                    ModelError::Unavailable { .. } => "MODEL_UNAVAILABLE",
                    ModelError::Timeout { .. } => "MODEL_TIMEOUT",
                    ModelError::InvalidResponse { .. } => "MODEL_BAD_RESPONSE",
                    ModelError::Rejected { .. } => "MODEL_REJECTED",
                };
                let status = match m {
                    ModelError::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
                    _ => StatusCode::BAD_GATEWAY,
                };
                ApiError::new(status, code, m.to_string())
            }
            TurnError::Store(s) => storage_error(&s),
            TurnError::Busy => ApiError::new(
                StatusCode::CONFLICT,
                "CONVERSATION_BUSY",
                "a turn is already running in this session; send the message when it has finished",
            ),
            TurnError::Unavailable => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "CONVERSATION_UNAVAILABLE",
                "the conversation could not be reached; retry the request",
            ),
        }
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> Self {
        storage_error(&e)
    }
}

fn storage_error(e: &crate::store::StoreError) -> ApiError {
    tracing::error!(error = %e, "storage error");
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "STORAGE_UNAVAILABLE",
        "storage is unavailable; nothing was acknowledged, retry later",
    )
}

/// `Json<T>` whose rejections come out in our error shape: 400 for
/// malformed JSON, 413 over the body limit, 415 without a JSON content
/// type, 422 for a well-formed body with missing or mistyped fields.
#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        let code = match r.status() {
            StatusCode::PAYLOAD_TOO_LARGE => "PAYLOAD_TOO_LARGE",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "UNSUPPORTED_MEDIA_TYPE",
            StatusCode::UNPROCESSABLE_ENTITY => "VALIDATION_ERROR",
            _ => "MALFORMED_JSON",
        };
        let status = match r {
            JsonRejection::JsonDataError(_) => StatusCode::UNPROCESSABLE_ENTITY,
            JsonRejection::JsonSyntaxError(_) => StatusCode::BAD_REQUEST,
            _ => r.status(),
        };
        ApiError::new(status, code, r.body_text())
    }
}
