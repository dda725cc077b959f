//! Model: how a conversation talks to a language model.
//!
//! conversation ──ChatRequest──▶ ChatModel ──▶ OpenAI-compatible endpoint (reqwest)
//!      ▲                          │           or the offline intent router
//!      └──── ChatResponse ────────┘
//!
//! The types here are cadre's own, and they are what goes on the wire
//! (`request_body` borrows them; async-openai's types are only the
//! reference its tests compare with). A [`ChatMessage`] is both what the model sees and what the
//! store keeps, so history needs no translation on its way back to the model.
//! Each reply carries the call's token [`Usage`] as the provider reported
//! it; the conversation records it (see `store::usage`).
//! Owns: the wire protocol, retries against the endpoint. Does not: run tools.

pub mod offline;
pub mod openai;
mod request_body;

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error_code::{ErrorCode, PublicError};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// One tool call as the model asked for it. `arguments` is the raw string the
/// model sent: it may not be valid JSON, and the executor says so.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// One message of a conversation, in the shape the model and the store share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChatMessage {
    pub role: Role,
    pub content: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// For `role = tool`: the tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn system(text: impl Into<String>) -> Self {
        Self::plain(Role::System, text)
    }
    pub fn user(text: impl Into<String>) -> Self {
        Self::plain(Role::User, text)
    }
    pub fn assistant(text: impl Into<String>) -> Self {
        Self::plain(Role::Assistant, text)
    }
    pub fn assistant_tool_calls(content: Option<String>, calls: Vec<ToolCall>) -> Self {
        ChatMessage {
            role: Role::Assistant,
            content,
            tool_calls: calls,
            tool_call_id: None,
            name: None,
        }
    }
    pub fn tool_result(call: &ToolCall, content: impl Into<String>) -> Self {
        ChatMessage {
            role: Role::Tool,
            content: Some(content.into()),
            tool_calls: Vec::new(),
            tool_call_id: Some(call.id.clone()),
            name: Some(call.name.clone()),
        }
    }
    fn plain(role: Role, text: impl Into<String>) -> Self {
        ChatMessage {
            role,
            content: Some(text.into()),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
}

/// A tool as offered to the model (OpenAI function format on the wire).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// A JSON Schema object.
    #[schema(value_type = std::collections::BTreeMap<String, Value>)]
    pub parameters: Value,
}

/// A tool's name as OpenAI-compatible endpoints accept it
/// (`^[a-zA-Z0-9_-]{1,64}$`): registry names may hold dots (`server.tool`
/// for MCP tools), sent as `server__tool`. Replies are mapped back against
/// the tools offered, so a name is never guessed.
pub fn wire_name(name: &str) -> String {
    name.replace('.', "__")
}

impl ToolSpec {
    /// The OpenAI function definition: `{"type":"function","function":{...}}`.
    pub fn to_openai_json(&self) -> Value {
        serde_json::json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            }
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model may call tools.
    Auto,
    /// The model must answer in text.
    None,
}

/// Why cadre asks the model; not sent on the wire, but the offline
/// provider answers each kind its own way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Purpose {
    /// A step of a conversation turn.
    #[default]
    Turn,
    /// Folding older messages into the rolling summary.
    Summary,
    /// Reply suggestions for a human operator.
    Suggestions,
    /// Rewording a text.
    Improve,
}

#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    /// Shared: an agent's specs are built once per plan and registry change.
    pub tools: std::sync::Arc<[ToolSpec]>,
    pub tool_choice: ToolChoice,
    pub temperature: Option<f32>,
    pub max_tokens: Option<u32>,
    pub purpose: Purpose,
    /// The JSON shape the answer must have (a turn of an agent with an
    /// `output_schema`, or a message that asked for one): sent as
    /// `response_format` or written into the prompt, as the client's
    /// [`StructuredOutput`] says.
    pub response_format: Option<Arc<ResponseFormat>>,
}

/// The JSON shape a turn's answer must have, in the OpenAI API's
/// `response_format.json_schema` shape (`{name, description?, schema,
/// strict?}`): what an agent file's `output_schema` and a message's
/// `response_format` become, and what goes on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResponseFormat {
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$", min_length = 1, max_length = 64)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON Schema (at most 64 KiB) for a JSON object: its `type`, when
    /// given, is `object`.
    #[schema(value_type = AnswerJsonSchema)]
    pub schema: Value,
    /// Sent as the endpoint's `strict` flag (OpenAI: only a subset of JSON
    /// Schema is accepted then). cadre validates the answer either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

/// How `/openapi.json` states [`ResponseFormat::schema`]: a JSON Schema
/// object whose `type`, if any, is `object` (any other keyword is the
/// schema's own).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // a document's shape only
pub struct AnswerJsonSchema {
    #[schema(pattern = "^object$")]
    r#type: Option<String>,
}

/// How a client asks an endpoint for a [`ResponseFormat`] (`[model]
/// structured_output`, and an agent's `[model] structured_output`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StructuredOutput {
    /// `response_format: {"type": "json_schema", ...}` (OpenAI, vLLM,
    /// llama.cpp's grammar-backed json_schema).
    #[default]
    Native,
    /// No `response_format`: the schema goes into the prompt as a last
    /// system message, for endpoints that refuse the field.
    Prompt,
}

/// The system message [`StructuredOutput::Prompt`] adds.
pub fn schema_instruction(format: &ResponseFormat) -> String {
    format!(
        "Answer with one JSON value only (no prose, no code fence) that matches this JSON \
         Schema named {}: {}",
        format.name, format.schema
    )
}

/// The tokens one model call used, as the provider reported them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
}

#[derive(Debug, Clone)]
pub struct ChatResponse {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    /// `None` when the endpoint reported no usage: the call is counted
    /// with zero tokens (an estimate would be billed as if it were real).
    pub usage: Option<Usage>,
    /// Why the model stopped, as the endpoint said (`None`: it did not).
    pub finish_reason: Option<FinishReason>,
}

/// Why the model stopped writing. `Length` (cut at `max_tokens`) and
/// `ContentFilter` (the provider withheld it) reach the turn's reply, so a
/// truncated or filtered answer says so; a value cadre does not know is
/// kept as sent (at most 64 bytes), never an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
    ContentFilter,
    Other(String),
}

impl FinishReason {
    pub fn parse(s: &str) -> FinishReason {
        match s {
            "stop" => FinishReason::Stop,
            "length" => FinishReason::Length,
            "tool_calls" | "function_call" => FinishReason::ToolCalls,
            "content_filter" => FinishReason::ContentFilter,
            other => {
                let mut end = other.len().min(64);
                while !other.is_char_boundary(end) {
                    end -= 1;
                }
                FinishReason::Other(other[..end].to_string())
            }
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::Other(s) => s,
        }
    }
}

impl Serialize for FinishReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for FinishReason {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(FinishReason::parse(&s))
    }
}

/// Why a model call failed, after cadre's own retries.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ModelError {
    /// The endpoint could not be reached or kept answering 429/5xx.
    #[error("model endpoint unavailable after {attempts} attempt(s): {last}")]
    Unavailable { attempts: u32, last: String },
    /// No answer within the request timeout.
    #[error("model endpoint did not answer within {after:?}")]
    Timeout { after: Duration },
    /// The endpoint answered with something that is not a chat completion.
    #[error("model endpoint returned an invalid response: {detail}")]
    InvalidResponse { detail: String },
    /// The endpoint refused the request (4xx other than 429): retrying will not help.
    #[error("model endpoint refused the request (HTTP {status}): {message}")]
    Rejected { status: u16, message: String },
    /// The agent's `[model] api_key_env` names a variable that is unset
    /// (or empty) in cadre's environment: no request was sent.
    #[error(
        "agent {agent}: [model] api_key_env names {variable}, which is not set (or empty) in \
         cadre's environment; no request was sent. Set it and restart cadre"
    )]
    KeyNotSet { agent: String, variable: String },
}

impl ModelError {
    /// The endpoint refused the request for its size: 413, or a 400 whose
    /// message speaks of the context length (OpenAI's
    /// `context_length_exceeded`, vLLM's and llama.cpp's wordings). The
    /// conversation answers it by summarising its history and trying once
    /// more; any other refusal is final.
    pub fn is_request_too_large(&self) -> bool {
        let ModelError::Rejected { status, message } = self else {
            return false;
        };
        let m = message.to_ascii_lowercase();
        *status == 413
            || (*status == 400
                && [
                    "context length",
                    "context_length",
                    "context window",
                    "maximum context",
                    "too many tokens",
                    "reduce the length",
                    "too long",
                    "too large",
                ]
                .iter()
                .any(|w| m.contains(w)))
    }
}

/// The one place a model failure is classified: its code, and through the
/// code whether cadre retries it (`Unavailable`, `Timeout`) and its status.
impl PublicError for ModelError {
    fn code(&self) -> ErrorCode {
        match self {
            ModelError::Unavailable { .. } => ErrorCode::ModelUnavailable,
            ModelError::Timeout { .. } => ErrorCode::ModelTimeout,
            ModelError::InvalidResponse { .. } => ErrorCode::ModelBadResponse,
            ModelError::Rejected { .. } => ErrorCode::ModelRejected,
            ModelError::KeyNotSet { .. } => ErrorCode::ModelKeyNotSet,
        }
    }
}

/// Receives the text of a streamed reply as it arrives.
pub type DeltaSink<'a> = &'a (dyn Fn(&str) + Send + Sync);

/// A language model cadre can ask for the next message.
#[async_trait::async_trait]
pub trait ChatModel: Send + Sync + 'static {
    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError>;

    /// Like `complete`, passing the reply's text to `on_delta` as it is
    /// generated. Models that cannot stream pass it whole, once.
    async fn complete_streaming(
        &self,
        request: ChatRequest,
        on_delta: DeltaSink<'_>,
    ) -> Result<ChatResponse, ModelError> {
        let response = self.complete(request).await?;
        if let Some(text) = response.content.as_deref().filter(|t| !t.is_empty()) {
            on_delta(text);
        }
        Ok(response)
    }

    /// One line for logs and `GET /v1/providers`: provider and model.
    fn describe(&self) -> String;
}

pub type SharedModel = Arc<dyn ChatModel>;

/// The model of an agent whose `[model] api_key_env` names a variable that
/// is not set: every request fails at once with [`ModelError::KeyNotSet`],
/// before anything is sent (an empty bearer would only earn a 401 from the
/// endpoint, or worse, an answer from an endpoint that needs no key).
#[derive(Debug)]
pub struct KeyNotSet {
    pub agent: String,
    pub variable: String,
}

#[async_trait::async_trait]
impl ChatModel for KeyNotSet {
    async fn complete(&self, _request: ChatRequest) -> Result<ChatResponse, ModelError> {
        Err(ModelError::KeyNotSet {
            agent: self.agent.clone(),
            variable: self.variable.clone(),
        })
    }

    fn describe(&self) -> String {
        format!("none: api_key_env {} is not set", self.variable)
    }
}

/// Where the model lives; resolved from `CADRE_MODEL_*` (or `OPENAI_API_KEY`)
/// and optionally overridden per agent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelEndpoint {
    pub base_url: Option<String>,
    pub api_key: Option<String>,
    pub model: Option<String>,
}

impl ModelEndpoint {
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        ModelEndpoint {
            base_url: var("CADRE_MODEL_BASE_URL"),
            api_key: var("CADRE_MODEL_API_KEY").or_else(|| var("OPENAI_API_KEY")),
            model: var("CADRE_MODEL"),
        }
    }

    /// Fields set in `over` replace ours.
    pub fn overridden_by(&self, over: &ModelEndpoint) -> ModelEndpoint {
        ModelEndpoint {
            base_url: over.base_url.clone().or_else(|| self.base_url.clone()),
            api_key: over.api_key.clone().or_else(|| self.api_key.clone()),
            model: over.model.clone().or_else(|| self.model.clone()),
        }
    }

    /// An endpoint is configured when a base URL or an API key is set; with
    /// neither, the offline provider serves.
    pub fn is_configured(&self) -> bool {
        self.base_url.is_some() || self.api_key.is_some()
    }
}

/// Builds the model for an endpoint: OpenAI-compatible when configured,
/// the offline intent router otherwise.
pub fn model_for(endpoint: &ModelEndpoint, options: &openai::ClientOptions) -> SharedModel {
    if endpoint.is_configured() {
        Arc::new(openai::OpenAiModel::new(endpoint, options.clone()))
    } else {
        Arc::new(offline::OfflineModel::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_refusals_are_told_apart_from_other_refusals() {
        let rejected = |status: u16, message: &str| ModelError::Rejected {
            status,
            message: message.into(),
        };
        assert!(rejected(413, "Payload Too Large").is_request_too_large());
        assert!(
            rejected(
                400,
                "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens."
            )
            .is_request_too_large()
        );
        assert!(rejected(400, "context_length_exceeded").is_request_too_large());
        assert!(!rejected(400, "Invalid 'messages[2].role'").is_request_too_large());
        assert!(!rejected(401, "Incorrect API key").is_request_too_large());
        let down = ModelError::Unavailable {
            attempts: 4,
            last: "request too large".into(),
        };
        assert!(!down.is_request_too_large());
    }

    #[test]
    fn finish_reasons_are_read_leniently() {
        assert_eq!(FinishReason::parse("length"), FinishReason::Length);
        assert_eq!(
            FinishReason::parse("content_filter"),
            FinishReason::ContentFilter
        );
        let odd = FinishReason::parse(&"é".repeat(100));
        assert_eq!(odd.as_str().len(), 64);
        assert_eq!(serde_json::to_value(odd.clone()).unwrap(), odd.as_str());
    }
}
