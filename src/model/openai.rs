//! The OpenAI-compatible model client (OpenAI, Groq, vLLM, llama.cpp, Ollama...).
//!
//! conversation ──ChatRequest──▶ OpenAiModel ──async-openai──▶ StatusService ──reqwest──▶ endpoint
//!
//! async-openai builds the request and parses the reply; its own retry layer
//! is replaced (`with_http_service`) so cadre's policy is the only one.
//! [`StatusService`] sits under async-openai and turns every non-2xx reply
//! into an [`EndpointStatus`] carrying the status, the `Retry-After` header
//! and the body, which async-openai would otherwise drop.
//!
//! Retry policy: 429, 5xx, connection failures and timeouts are retried up
//! to `max_retries` times with exponential backoff and jitter, waiting at
//! least `Retry-After` when the endpoint sends one (capped at
//! `max_retry_after`). Other 4xx are not retried. A reply that is not a chat
//! completion is `InvalidResponse`, not retried: an endpoint that answers
//! garbage once usually answers it again.
//!
//! Usage: the reply's `usage` becomes [`ChatResponse::usage`]; streamed
//! requests ask for it with `stream_options.include_usage` (the last chunk
//! carries it). An endpoint that sends none leaves `usage` empty, and the
//! call counts with zero tokens (see [`super`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_openai::Client;
use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::{HttpRequestFactory, ReqwestService};
use async_openai::types::chat as oa;
use futures::StreamExt;

use super::{
    ChatMessage, ChatModel, ChatRequest, ChatResponse, DeltaSink, ModelEndpoint, ModelError, Role,
    ToolCall, ToolChoice, Usage,
};
use crate::retry::Backoff;

/// Model used when neither the environment nor the agent names one.
pub const DEFAULT_MODEL: &str = "gpt-4o-mini";

#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Whole-request timeout, per attempt.
    pub request_timeout: Duration,
    pub max_retries: u32,
    pub retry_base_delay: Duration,
    /// Longest `Retry-After` cadre will honour; longer asks fail at once.
    pub max_retry_after: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            request_timeout: Duration::from_secs(60),
            max_retries: 3,
            retry_base_delay: Duration::from_millis(250),
            max_retry_after: Duration::from_secs(30),
        }
    }
}

pub struct OpenAiModel {
    client: Client<OpenAIConfig>,
    model: String,
    base_url: String,
    options: ClientOptions,
}

impl OpenAiModel {
    pub fn new(endpoint: &ModelEndpoint, options: ClientOptions) -> Self {
        let base_url = endpoint
            .base_url
            .clone()
            .unwrap_or_else(|| "https://api.openai.com/v1".into());
        let http = reqwest::Client::builder()
            .timeout(options.request_timeout)
            .build()
            .expect("build the HTTP client");
        let mut config = OpenAIConfig::new().with_api_base(base_url.trim_end_matches('/'));
        // An empty key still sends `Authorization: Bearer `, which local
        // servers ignore; a real endpoint answers 401 with a clear message.
        config = config.with_api_key(endpoint.api_key.clone().unwrap_or_default());
        let client = Client::build(http.clone(), config).with_http_service(StatusService {
            inner: ReqwestService::new(http),
        });
        OpenAiModel {
            client,
            model: endpoint
                .model
                .clone()
                .unwrap_or_else(|| DEFAULT_MODEL.into()),
            base_url,
            options,
        }
    }

    async fn attempt(
        &self,
        request: oa::CreateChatCompletionRequest,
    ) -> Result<ChatResponse, Failure> {
        let response = self.client.chat().create(request).await.map_err(classify)?;
        let choice = response.choices.into_iter().next().ok_or_else(|| {
            Failure::Fatal(ModelError::InvalidResponse {
                detail: "the reply has no choices".into(),
            })
        })?;
        let tool_calls = choice
            .message
            .tool_calls
            .unwrap_or_default()
            .into_iter()
            .map(|call| match call {
                oa::ChatCompletionMessageToolCalls::Function(f) => ToolCall {
                    id: f.id,
                    name: f.function.name,
                    arguments: f.function.arguments,
                },
                oa::ChatCompletionMessageToolCalls::Custom(c) => ToolCall {
                    id: c.id,
                    name: c.custom_tool.name,
                    arguments: c.custom_tool.input,
                },
            })
            .collect();
        Ok(ChatResponse {
            content: choice.message.content,
            tool_calls,
            usage: response.usage.map(|u| Usage {
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
            }),
        })
    }
}

impl OpenAiModel {
    fn wire(&self, request: &ChatRequest) -> oa::CreateChatCompletionRequest {
        let model = if request.model.is_empty() {
            self.model.clone()
        } else {
            request.model.clone()
        };
        to_wire(request, model)
    }

    /// Runs `attempt` until it succeeds, fails for good, or the retries
    /// are spent, waiting between tries as the module doc says.
    async fn retrying<F, Fut>(&self, mut attempt: F) -> Result<ChatResponse, ModelError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<ChatResponse, Failure>>,
    {
        let mut tries = 0;
        loop {
            tries += 1;
            let failure = match attempt().await {
                Ok(r) => return Ok(r),
                Err(f) => f,
            };
            let (wait, last) = match failure {
                Failure::Fatal(e) => return Err(e),
                Failure::Retryable {
                    retry_after,
                    detail,
                } => (retry_after, detail),
            };
            if tries > self.options.max_retries {
                return Err(if last.timed_out {
                    ModelError::Timeout {
                        after: self.options.request_timeout,
                    }
                } else {
                    ModelError::Unavailable {
                        attempts: tries,
                        last: last.message,
                    }
                });
            }
            let backoff = Backoff::jittered(self.options.retry_base_delay, 8).delay(tries);
            let delay = match wait {
                Some(w) if w > self.options.max_retry_after => {
                    return Err(ModelError::Unavailable {
                        attempts: tries,
                        last: format!("{} (asked to retry after {w:?})", last.message),
                    });
                }
                Some(w) => w.max(backoff),
                None => backoff,
            };
            tracing::warn!(attempt = tries, ?delay, error = %last.message, "model call failed; retrying");
            tokio::time::sleep(delay).await;
        }
    }

    /// One streamed attempt: text deltas go to `on_delta` as they come;
    /// tool calls are assembled by their `index` from their pieces.
    async fn attempt_stream(
        &self,
        request: oa::CreateChatCompletionRequest,
        on_delta: DeltaSink<'_>,
        emitted: &AtomicBool,
    ) -> Result<ChatResponse, Failure> {
        let mut stream = self
            .client
            .chat()
            .create_stream(request)
            .await
            .map_err(classify)?;
        let mut content = String::new();
        let mut calls: BTreeMap<u32, ToolCall> = BTreeMap::new();
        let mut usage = None;
        while let Some(item) = stream.next().await {
            let chunk = item.map_err(classify)?;
            if let Some(u) = chunk.usage {
                usage = Some(Usage {
                    prompt_tokens: u.prompt_tokens,
                    completion_tokens: u.completion_tokens,
                });
            }
            for choice in chunk.choices {
                if let Some(text) = choice.delta.content.filter(|t| !t.is_empty()) {
                    emitted.store(true, Ordering::Relaxed);
                    on_delta(&text);
                    content.push_str(&text);
                }
                for piece in choice.delta.tool_calls.unwrap_or_default() {
                    let call = calls.entry(piece.index).or_insert_with(|| ToolCall {
                        id: String::new(),
                        name: String::new(),
                        arguments: String::new(),
                    });
                    if let Some(id) = piece.id {
                        call.id = id;
                    }
                    if let Some(f) = piece.function {
                        if let Some(name) = f.name {
                            call.name.push_str(&name);
                        }
                        if let Some(args) = f.arguments {
                            call.arguments.push_str(&args);
                        }
                    }
                }
            }
        }
        let tool_calls: Vec<ToolCall> = calls.into_values().collect();
        if tool_calls
            .iter()
            .any(|c| c.id.is_empty() || c.name.is_empty())
        {
            return Err(Failure::Fatal(ModelError::InvalidResponse {
                detail: "a streamed tool call came without its id or name".into(),
            }));
        }
        Ok(ChatResponse {
            content: (!content.is_empty()).then_some(content),
            tool_calls,
            usage,
        })
    }
}

#[async_trait::async_trait]
impl ChatModel for OpenAiModel {
    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        // The first attempt takes the wire request; only a retry builds another.
        let mut first = Some(self.wire(&request));
        self.retrying(|| {
            let wire = first.take().unwrap_or_else(|| self.wire(&request));
            self.attempt(wire)
        })
        .await
        .map(|r| from_wire_names(r, &request))
    }

    async fn complete_streaming(
        &self,
        request: ChatRequest,
        on_delta: DeltaSink<'_>,
    ) -> Result<ChatResponse, ModelError> {
        let mut wire = self.wire(&request);
        // Without it, a stream carries no usage and the call would count no tokens.
        wire.stream_options = Some(oa::ChatCompletionStreamOptions {
            include_usage: Some(true),
            include_obfuscation: None,
        });
        let emitted = AtomicBool::new(false);
        self.retrying(|| async {
            match self.attempt_stream(wire.clone(), on_delta, &emitted).await {
                // Text already went out: a second try would repeat it.
                Err(Failure::Retryable { detail, .. }) if emitted.load(Ordering::Relaxed) => {
                    Err(Failure::Fatal(ModelError::InvalidResponse {
                        detail: format!("the streamed reply was cut: {}", detail.message),
                    }))
                }
                other => other,
            }
        })
        .await
        .map(|r| from_wire_names(r, &request))
    }

    fn describe(&self) -> String {
        format!("openai-compatible ({}) model {}", self.base_url, self.model)
    }
}

struct RetryDetail {
    message: String,
    timed_out: bool,
}

enum Failure {
    Retryable {
        retry_after: Option<Duration>,
        detail: RetryDetail,
    },
    Fatal(ModelError),
}

fn retryable(message: String, timed_out: bool, retry_after: Option<Duration>) -> Failure {
    Failure::Retryable {
        retry_after,
        detail: RetryDetail { message, timed_out },
    }
}

fn classify(error: OpenAIError) -> Failure {
    match error {
        OpenAIError::Boxed(boxed) => match boxed.downcast::<EndpointStatus>() {
            Ok(status) => status.into_failure(),
            Err(other) => retryable(other.to_string(), false, None),
        },
        OpenAIError::Reqwest(e) => retryable(transport_message(&e), e.is_timeout(), None),
        OpenAIError::ApiError(api) => {
            let status = api.status_code.as_u16();
            EndpointStatus {
                status,
                retry_after: None,
                body: api.api_error.message,
            }
            .into_failure()
        }
        OpenAIError::JSONDeserialize(e, body) => Failure::Fatal(ModelError::InvalidResponse {
            detail: format!("{e}; body starts with {:?}", snippet(&body)),
        }),
        OpenAIError::StreamError(e) => retryable(e.to_string(), false, None),
        other => Failure::Fatal(ModelError::InvalidResponse {
            detail: other.to_string(),
        }),
    }
}

fn transport_message(e: &reqwest::Error) -> String {
    if e.is_connect() {
        format!("cannot connect: {e}")
    } else if e.is_timeout() {
        "request timed out".into()
    } else {
        e.to_string()
    }
}

fn snippet(s: &str) -> String {
    s.chars().take(200).collect()
}

/// A non-2xx reply from the endpoint, read before async-openai sees it.
#[derive(Debug, thiserror::Error)]
#[error("HTTP {status}: {body}")]
pub struct EndpointStatus {
    pub status: u16,
    pub retry_after: Option<Duration>,
    pub body: String,
}

impl EndpointStatus {
    fn into_failure(self) -> Failure {
        let message = match serde_json::from_str::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        {
            Some(m) => format!("HTTP {}: {m}", self.status),
            None => format!("HTTP {}: {}", self.status, snippet(&self.body)),
        };
        if self.status == 429 || self.status >= 500 {
            retryable(message, false, self.retry_after)
        } else {
            Failure::Fatal(ModelError::Rejected {
                status: self.status,
                message,
            })
        }
    }
}

/// A tower service under async-openai that reports non-2xx replies with
/// their status, `Retry-After` and body.
#[derive(Clone)]
struct StatusService {
    inner: ReqwestService,
}

impl tower::Service<HttpRequestFactory> for StatusService {
    type Response = reqwest::Response;
    type Error = OpenAIError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<reqwest::Response, OpenAIError>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), OpenAIError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: HttpRequestFactory) -> Self::Future {
        let fut = self.inner.call(request);
        Box::pin(async move {
            let response = fut.await?;
            let status = response.status();
            if status.is_success() {
                return Ok(response);
            }
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Duration::from_secs_f64);
            let body = response.text().await.unwrap_or_default();
            Err(OpenAIError::Boxed(Box::new(EndpointStatus {
                status: status.as_u16(),
                retry_after,
                body,
            })))
        })
    }
}

/// Tool names the model answered with, back to the registry's: a name is
/// mapped only when it is the wire form of a tool offered in `request`.
fn from_wire_names(mut response: ChatResponse, request: &ChatRequest) -> ChatResponse {
    for call in &mut response.tool_calls {
        if let Some(t) = request
            .tools
            .iter()
            .find(|t| t.name != call.name && super::wire_name(&t.name) == call.name)
        {
            call.name = t.name.clone();
        }
    }
    response
}

fn to_wire(request: &ChatRequest, model: String) -> oa::CreateChatCompletionRequest {
    let messages = request.messages.iter().map(message_to_wire).collect();
    let tools = if request.tools.is_empty() {
        None
    } else {
        Some(
            request
                .tools
                .iter()
                .map(|t| {
                    oa::ChatCompletionTools::Function(oa::ChatCompletionTool {
                        function: async_openai::types::chat::FunctionObject {
                            name: super::wire_name(&t.name),
                            description: Some(t.description.clone()),
                            parameters: Some(t.parameters.clone()),
                            strict: None,
                        },
                    })
                })
                .collect(),
        )
    };
    let tool_choice = tools.as_ref().map(|_| {
        oa::ChatCompletionToolChoiceOption::Mode(match request.tool_choice {
            ToolChoice::Auto => oa::ToolChoiceOptions::Auto,
            ToolChoice::None => oa::ToolChoiceOptions::None,
        })
    });
    oa::CreateChatCompletionRequest {
        model,
        messages,
        tools,
        tool_choice,
        temperature: request.temperature,
        max_completion_tokens: request.max_tokens,
        ..Default::default()
    }
}

fn message_to_wire(m: &ChatMessage) -> oa::ChatCompletionRequestMessage {
    let text = m.content.clone().unwrap_or_default();
    match m.role {
        Role::System => oa::ChatCompletionRequestSystemMessage::from(text).into(),
        Role::User => oa::ChatCompletionRequestUserMessage::from(text).into(),
        Role::Assistant => {
            let tool_calls = (!m.tool_calls.is_empty()).then(|| {
                m.tool_calls
                    .iter()
                    .map(|c| {
                        oa::ChatCompletionMessageToolCalls::Function(
                            oa::ChatCompletionMessageToolCall {
                                id: c.id.clone(),
                                function: oa::FunctionCall {
                                    name: super::wire_name(&c.name),
                                    arguments: c.arguments.clone(),
                                },
                            },
                        )
                    })
                    .collect()
            });
            oa::ChatCompletionRequestAssistantMessage {
                content: m.content.clone().map(Into::into),
                tool_calls,
                ..Default::default()
            }
            .into()
        }
        Role::Tool => oa::ChatCompletionRequestToolMessage {
            content: text.into(),
            tool_call_id: m.tool_call_id.clone().unwrap_or_default(),
        }
        .into(),
    }
}

#[cfg(test)]
mod wire_name_tests {
    use super::*;
    use crate::model::{ToolCall, ToolSpec};

    #[test]
    fn dotted_names_go_out_with_underscores_and_come_back_as_offered() {
        let spec = |name: &str| ToolSpec {
            name: name.into(),
            description: String::new(),
            parameters: serde_json::json!({"type": "object"}),
        };
        let request = ChatRequest {
            model: "m".into(),
            messages: Vec::new(),
            tools: vec![spec("files.read"), spec("plain__name")].into(),
            tool_choice: ToolChoice::Auto,
            temperature: None,
            max_tokens: None,
            purpose: Default::default(),
        };
        let wire = serde_json::to_value(to_wire(&request, "m".into())).unwrap();
        let names: Vec<&str> = wire["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["files__read", "plain__name"]);
        let call = |name: &str| ToolCall {
            id: "c".into(),
            name: name.into(),
            arguments: "{}".into(),
        };
        let response = ChatResponse {
            content: None,
            tool_calls: vec![call("files__read"), call("plain__name"), call("other__x")],
            usage: None,
        };
        let back: Vec<String> = from_wire_names(response, &request)
            .tool_calls
            .into_iter()
            .map(|c| c.name)
            .collect();
        // Only names offered are mapped; a tool named with `__` stays itself.
        assert_eq!(back, ["files.read", "plain__name", "other__x"]);
    }
}
