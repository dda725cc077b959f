//! The OpenAI-compatible model client (OpenAI, Groq, vLLM, llama.cpp, Ollama...).
//!
//! conversation ──ChatRequest──▶ OpenAiModel ──reqwest──▶ endpoint
//!                                   │ request: serialised from cadre's own types ([`super::request_body`])
//!                                   │ reply:   read capped, parsed leniently here
//!
//! The request body borrows cadre's request (async-openai's types are the
//! reference it is tested against); the reply is read and parsed here,
//! because an endpoint is not trusted to answer what OpenAI would: every
//! reply is read through a byte cap and parsed into cadre's own lenient
//! shapes ([`wire`]). Decisions:
//!
//! - **Size**: at most `max_reply_bytes` (`[model] max_reply_bytes`,
//!   default 4 MiB) are read per reply, streamed or not; a `Content-Length`
//!   over it is refused before reading, a body that grows past it is
//!   dropped at once. Such a reply is `InvalidResponse` (`MODEL_BAD_RESPONSE`),
//!   not retried, and nothing of it is stored.
//! - **Count**: not capped here. The one cap on tool calls per reply
//!   (`[model] max_tool_calls`) is the conversation machine's, so it holds
//!   for every model (this client, the offline one, an embedder's); what a
//!   reply can make this client hold meanwhile is bounded by its size.
//! - **Tool call ids**: at most [`MAX_TOOL_CALL_ID`] (256) bytes and
//!   unique within a reply, or the reply is `InvalidResponse`
//!   (`MODEL_BAD_RESPONSE`), not retried and nothing of it stored: an id is
//!   stored with every message and call record of the call (six replies
//!   with a 3 MB id grew a store by 546 MB), and two calls under one id
//!   would share one approval and one result.
//! - **Redirects**: never followed. A 3xx is `Rejected` with its status and
//!   `Location`: a followed 303 made cadre GET whatever the endpoint named
//!   (a loopback service), and a 307 re-sent the whole prompt, key
//!   included, to another origin. Set `base_url` to the address that
//!   answers.
//! - **Error text**: an endpoint's error body is read up to 64 KiB and at
//!   most [`MAX_ERROR_TEXT`] bytes of its message are passed on (logs, API
//!   errors).
//! - **Leniency**: odd `usage` numbers (negative, over `u32`, fractional,
//!   strings) count as 0 with a warning, and an unknown `finish_reason` is
//!   kept as it came ([`FinishReason::Other`]): neither spoils a good reply.
//! - **Ends**: a stream that ends without a `finish_reason` or `[DONE]`,
//!   or a body cut by the connection, was cut: retried like a 5xx while no
//!   text went out, and `InvalidResponse` once the retries are spent (or
//!   text already reached the client). A reply that is not UTF-8 is
//!   `InvalidResponse` on both paths, not retried.
//!
//! Retry policy: 429, 5xx, connection failures, cut replies and timeouts are
//! retried up to `max_retries` times with exponential backoff and jitter,
//! waiting at least `Retry-After` when the endpoint sends one (capped at
//! `max_retry_after`). Other 4xx are not retried. A reply that is not a chat
//! completion is `InvalidResponse`, not retried: an endpoint that answers
//! garbage once usually answers it again. `request_timeout` bounds each
//! attempt; the conversation bounds a turn's model calls as a whole
//! (`[model] turn_timeout_s`).
//!
//! Usage: the reply's `usage` becomes [`ChatResponse::usage`]; streamed
//! requests ask for it with `stream_options.include_usage` (the last chunk
//! carries it). An endpoint that sends none leaves `usage` empty, and the
//! call counts with zero tokens (see [`super`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[cfg(test)]
use async_openai::types::chat as oa;
use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};

use super::request_body::RequestBody;
#[cfg(test)]
use super::{ChatMessage, Role, ToolChoice};
use super::{
    ChatModel, ChatRequest, ChatResponse, DeltaSink, FinishReason, ModelEndpoint, ModelError,
    StructuredOutput, ToolCall, Usage,
};
use crate::retry::Backoff;

/// Model used when neither the environment nor the agent names one.
pub const DEFAULT_MODEL: &str = "gpt-4o-mini";

/// Bytes of an endpoint's error message passed on (logs and API errors).
pub const MAX_ERROR_TEXT: usize = 1024;

/// Bytes of an error body read to find its message.
const MAX_ERROR_BODY: usize = 64 * 1024;

#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Whole-request timeout, per attempt.
    pub request_timeout: Duration,
    pub max_retries: u32,
    pub retry_base_delay: Duration,
    /// Longest `Retry-After` cadre will honour; longer asks fail at once.
    pub max_retry_after: Duration,
    /// Bytes read per reply, streamed or not; more is `InvalidResponse`.
    pub max_reply_bytes: usize,
    /// How a turn's answer schema is asked for (`[model] structured_output`).
    pub structured_output: StructuredOutput,
}

/// `[model] max_reply_bytes` unless configured.
pub const DEFAULT_MAX_REPLY_BYTES: usize = 4 * 1024 * 1024;

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            request_timeout: Duration::from_secs(60),
            max_retries: 3,
            retry_base_delay: Duration::from_millis(250),
            max_retry_after: Duration::from_secs(30),
            max_reply_bytes: DEFAULT_MAX_REPLY_BYTES,
            structured_output: StructuredOutput::Native,
        }
    }
}

/// The longest tool call id a reply may carry, in bytes (OpenAI's are
/// about 30; the Bedrock and Gemini proxies' under 100).
pub const MAX_TOOL_CALL_ID: usize = 256;

pub struct OpenAiModel {
    http: reqwest::Client,
    /// `{base_url}/chat/completions`.
    url: String,
    api_key: String,
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
            // A model endpoint's redirect is never followed (module doc).
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("build the HTTP client");
        OpenAiModel {
            http,
            url: format!("{}/chat/completions", base_url.trim_end_matches('/')),
            // An empty key still sends `Authorization: Bearer `, which local
            // servers ignore; a real endpoint answers 401 with a clear message.
            api_key: endpoint.api_key.clone().unwrap_or_default(),
            model: endpoint
                .model
                .clone()
                .unwrap_or_else(|| DEFAULT_MODEL.into()),
            base_url,
            options,
        }
    }

    /// Sends the request; a non-2xx answer is classified here.
    async fn send(&self, request: &RequestBody<'_>) -> Result<reqwest::Response, Failure> {
        let response = self
            .http
            .post(&self.url)
            .bearer_auth(&self.api_key)
            .json(request)
            .send()
            .await
            .map_err(|e| retryable(transport_message(&e), e.is_timeout(), false, None))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        if status.is_redirection() {
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(|l| truncated(l, 200))
                .unwrap_or_default();
            return Err(Failure::Fatal(ModelError::Rejected {
                status: status.as_u16(),
                message: format!(
                    "the endpoint redirected (to {location:?}); cadre follows no redirect from a model endpoint: set [model] base_url to the address that answers"
                ),
            }));
        }
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            // `1e20` is finite but no Duration: never a panic.
            .and_then(|s| Duration::try_from_secs_f64(s).ok());
        let body = read_at_most(response, MAX_ERROR_BODY)
            .await
            .map(|(bytes, _)| bytes)
            .unwrap_or_default();
        Err(EndpointStatus {
            status: status.as_u16(),
            retry_after,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
        .into_failure())
    }

    async fn attempt(&self, request: &RequestBody<'_>) -> Result<ChatResponse, Failure> {
        let response = self.send(request).await?;
        let cap = self.options.max_reply_bytes;
        if response.content_length().is_some_and(|n| n > cap as u64) {
            return Err(Failure::Fatal(too_large(cap)));
        }
        let (body, over) = read_at_most(response, cap).await.map_err(body_failure)?;
        if over {
            return Err(Failure::Fatal(too_large(cap)));
        }
        let text = std::str::from_utf8(&body).map_err(|_| Failure::Fatal(not_utf8()))?;
        let reply: wire::Reply = serde_json::from_str(text).map_err(|e| {
            Failure::Fatal(ModelError::InvalidResponse {
                detail: format!("{e}; body starts with {:?}", snippet(text)),
            })
        })?;
        let usage = wire::usage(&reply.usage);
        let choice = reply
            .choices
            .unwrap_or_default()
            .into_iter()
            .next()
            .ok_or_else(|| {
                Failure::Fatal(ModelError::InvalidResponse {
                    detail: "the reply has no choices".into(),
                })
            })?;
        let message = choice.message.unwrap_or_default();
        let mut tool_calls = Vec::new();
        for call in message.tool_calls.unwrap_or_default() {
            let function = call.function.unwrap_or_default();
            tool_calls.push(ToolCall {
                id: call.id.unwrap_or_default(),
                name: function.name.unwrap_or_default(),
                arguments: wire::arguments(function.arguments),
            });
        }
        check_calls(&tool_calls)?;
        Ok(ChatResponse {
            content: message.content,
            tool_calls,
            usage,
            finish_reason: wire::finish_reason(&choice.finish_reason),
        })
    }
}

/// Refuses calls without an id or name, with an id over
/// [`MAX_TOOL_CALL_ID`] bytes or an id twice in the reply.
fn check_calls(calls: &[ToolCall]) -> Result<(), Failure> {
    if calls.iter().any(|c| c.id.is_empty() || c.name.is_empty()) {
        return Err(Failure::Fatal(ModelError::InvalidResponse {
            detail: "a tool call came without its id or name".into(),
        }));
    }
    if let Some(long) = calls.iter().find(|c| c.id.len() > MAX_TOOL_CALL_ID) {
        return Err(Failure::Fatal(ModelError::InvalidResponse {
            detail: format!(
                "a tool call id is {} bytes long (at most {MAX_TOOL_CALL_ID})",
                long.id.len()
            ),
        }));
    }
    let mut seen = std::collections::HashSet::with_capacity(calls.len());
    if let Some(twice) = calls.iter().find(|c| !seen.insert(c.id.as_str())) {
        return Err(Failure::Fatal(ModelError::InvalidResponse {
            detail: format!(
                "the tool call id {:?} came twice in one reply",
                truncated(&twice.id, 64)
            ),
        }));
    }
    Ok(())
}

impl OpenAiModel {
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
                } else if last.cut {
                    ModelError::InvalidResponse {
                        detail: format!("the reply was cut: {}", last.message),
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
        request: &RequestBody<'_>,
        on_delta: DeltaSink<'_>,
        emitted: &AtomicBool,
    ) -> Result<ChatResponse, Failure> {
        let response = self.send(request).await?;
        let cap = self.options.max_reply_bytes;
        let mut events = std::pin::pin!(capped(response.bytes_stream(), cap).eventsource());
        let mut content = String::new();
        let mut calls: BTreeMap<u64, ToolCall> = BTreeMap::new();
        let mut usage = None;
        let mut finish_reason = None;
        let mut done = false;
        while let Some(item) = events.next().await {
            let event = match item {
                Ok(event) => event,
                Err(EventStreamError::Utf8(_)) => return Err(Failure::Fatal(not_utf8())),
                Err(EventStreamError::Parser(e)) => {
                    return Err(Failure::Fatal(ModelError::InvalidResponse {
                        detail: format!("the stream is not Server-Sent Events: {e}"),
                    }));
                }
                Err(EventStreamError::Transport(StreamFault::TooLarge)) => {
                    return Err(Failure::Fatal(too_large(cap)));
                }
                Err(EventStreamError::Transport(StreamFault::Transport(e))) => {
                    return Err(body_failure(e));
                }
            };
            if event.data.trim() == "[DONE]" {
                done = true;
                break;
            }
            let chunk: wire::Reply = serde_json::from_str(&event.data).map_err(|e| {
                Failure::Fatal(ModelError::InvalidResponse {
                    detail: format!("{e}; event starts with {:?}", snippet(&event.data)),
                })
            })?;
            if !chunk.usage.is_null() {
                usage = wire::usage(&chunk.usage);
            }
            for choice in chunk.choices.unwrap_or_default() {
                if let Some(reason) = wire::finish_reason(&choice.finish_reason) {
                    finish_reason = Some(reason);
                }
                let delta = choice.delta.unwrap_or_default();
                if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                    emitted.store(true, Ordering::Relaxed);
                    on_delta(&text);
                    content.push_str(&text);
                }
                for piece in delta.tool_calls.unwrap_or_default() {
                    // Servers that omit `index` send each call whole or in
                    // order: a piece with an id opens the next call.
                    let last = calls.keys().next_back().copied();
                    let index = match (piece.index, &piece.id, last) {
                        (Some(i), _, _) => i,
                        (None, Some(_), Some(l)) => l.saturating_add(1),
                        (None, _, l) => l.unwrap_or(0),
                    };
                    let call = calls.entry(index).or_insert_with(|| ToolCall {
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
                        call.arguments.push_str(&wire::arguments(f.arguments));
                    }
                }
            }
        }
        if !done && finish_reason.is_none() {
            return Err(retryable(
                "the stream ended before its finish_reason or [DONE]".into(),
                false,
                true,
                None,
            ));
        }
        let tool_calls: Vec<ToolCall> = calls.into_values().collect();
        check_calls(&tool_calls)?;
        Ok(ChatResponse {
            content: (!content.is_empty()).then_some(content),
            tool_calls,
            usage,
            finish_reason,
        })
    }
}

#[async_trait::async_trait]
impl ChatModel for OpenAiModel {
    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse, ModelError> {
        let wire = RequestBody::new(&request, &self.model, self.options.structured_output);
        self.retrying(|| self.attempt(&wire))
            .await
            .map(|r| from_wire_names(r, &request))
    }

    async fn complete_streaming(
        &self,
        request: ChatRequest,
        on_delta: DeltaSink<'_>,
    ) -> Result<ChatResponse, ModelError> {
        let wire =
            RequestBody::new(&request, &self.model, self.options.structured_output).streamed();
        let emitted = AtomicBool::new(false);
        let wire = &wire;
        let emitted = &emitted;
        self.retrying(|| async move {
            match self.attempt_stream(wire, on_delta, emitted).await {
                // Text already went out: a second try would repeat it.
                Err(Failure::Retryable { detail, .. }) if emitted.load(Ordering::Relaxed) => {
                    Err(Failure::Fatal(if detail.timed_out {
                        ModelError::Timeout {
                            after: self.options.request_timeout,
                        }
                    } else {
                        ModelError::InvalidResponse {
                            detail: format!("the streamed reply was cut: {}", detail.message),
                        }
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

/// The reply shapes cadre reads: every field optional, numbers and
/// `finish_reason` as raw JSON, read by the functions below.
mod wire {
    use serde::Deserialize;
    use serde_json::Value;

    use super::{FinishReason, Usage};

    #[derive(Deserialize)]
    pub struct Reply {
        #[serde(default)]
        pub choices: Option<Vec<Choice>>,
        #[serde(default)]
        pub usage: Value,
    }

    #[derive(Deserialize)]
    pub struct Choice {
        #[serde(default)]
        pub message: Option<Message>,
        /// Streamed chunks carry `delta` instead of `message`.
        #[serde(default)]
        pub delta: Option<Message>,
        #[serde(default)]
        pub finish_reason: Value,
    }

    #[derive(Deserialize, Default)]
    pub struct Message {
        #[serde(default)]
        pub content: Option<String>,
        #[serde(default)]
        pub tool_calls: Option<Vec<Call>>,
    }

    #[derive(Deserialize)]
    pub struct Call {
        #[serde(default)]
        pub index: Option<u64>,
        #[serde(default)]
        pub id: Option<String>,
        #[serde(default)]
        pub function: Option<Function>,
    }

    #[derive(Deserialize, Default)]
    pub struct Function {
        #[serde(default)]
        pub name: Option<String>,
        /// A string on OpenAI; some servers send the object itself.
        #[serde(default)]
        pub arguments: Value,
    }

    pub fn arguments(value: Value) -> String {
        match value {
            Value::Null => String::new(),
            Value::String(s) => s,
            other => other.to_string(),
        }
    }

    /// Usage as reported; a count that is not a whole number from 0 to
    /// `u32::MAX` counts as 0 (and says so in the log).
    pub fn usage(value: &Value) -> Option<Usage> {
        if !value.is_object() {
            return None;
        }
        let count = |field: &str| -> u32 {
            let v = &value[field];
            match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(n) => n,
                None if v.is_null() => 0,
                None => {
                    tracing::warn!(field, value = %super::snippet(&v.to_string()), "the model endpoint reported an unreadable token count; counted as 0");
                    0
                }
            }
        };
        Some(Usage {
            prompt_tokens: count("prompt_tokens"),
            completion_tokens: count("completion_tokens"),
        })
    }

    pub fn finish_reason(value: &Value) -> Option<FinishReason> {
        value.as_str().map(FinishReason::parse)
    }
}

/// What ended a capped body stream early.
#[derive(Debug)]
enum StreamFault {
    TooLarge,
    Transport(reqwest::Error),
}

/// `body`, failing with `TooLarge` once more than `cap` bytes came (the
/// chunk that crosses the cap is dropped, not kept).
fn capped<B: AsRef<[u8]>>(
    body: impl Stream<Item = Result<B, reqwest::Error>>,
    cap: usize,
) -> impl Stream<Item = Result<B, StreamFault>> {
    let mut read = 0usize;
    let mut over = false;
    body.map(move |chunk| {
        let chunk = chunk.map_err(StreamFault::Transport)?;
        read = read.saturating_add(chunk.as_ref().len());
        if over || read > cap {
            over = true;
            return Err(StreamFault::TooLarge);
        }
        Ok(chunk)
    })
}

/// At most `cap` bytes of the body; `true` when there was more.
async fn read_at_most(
    response: reqwest::Response,
    cap: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    let mut stream = std::pin::pin!(response.bytes_stream());
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if body.len() + chunk.len() > cap {
            let room = cap - body.len();
            body.extend_from_slice(&chunk[..room]);
            return Ok((body, true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}

fn too_large(cap: usize) -> ModelError {
    ModelError::InvalidResponse {
        detail: format!("the reply is larger than [model] max_reply_bytes ({cap} bytes)"),
    }
}

fn not_utf8() -> ModelError {
    ModelError::InvalidResponse {
        detail: "the reply is not valid UTF-8".into(),
    }
}

/// A body that stopped arriving: a timeout, or a cut connection.
fn body_failure(e: reqwest::Error) -> Failure {
    if e.is_timeout() {
        retryable("request timed out".into(), true, false, None)
    } else {
        retryable(
            format!("the connection ended mid-reply: {e}"),
            false,
            true,
            None,
        )
    }
}

struct RetryDetail {
    message: String,
    timed_out: bool,
    /// The reply started and did not finish.
    cut: bool,
}

enum Failure {
    Retryable {
        retry_after: Option<Duration>,
        detail: RetryDetail,
    },
    Fatal(ModelError),
}

fn retryable(
    message: String,
    timed_out: bool,
    cut: bool,
    retry_after: Option<Duration>,
) -> Failure {
    Failure::Retryable {
        retry_after,
        detail: RetryDetail {
            message,
            timed_out,
            cut,
        },
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

/// `s` cut to at most `max` bytes on a character boundary, marked when cut.
fn truncated(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

/// A non-2xx reply from the endpoint.
#[derive(Debug)]
struct EndpointStatus {
    status: u16,
    retry_after: Option<Duration>,
    body: String,
}

impl EndpointStatus {
    fn into_failure(self) -> Failure {
        let text = serde_json::from_str::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or(self.body);
        let text = truncated(&text, MAX_ERROR_TEXT);
        if self.status == 429 || self.status >= 500 {
            let message = format!("HTTP {}: {text}", self.status);
            retryable(message, false, false, self.retry_after)
        } else {
            // `Rejected` names the status itself.
            Failure::Fatal(ModelError::Rejected {
                status: self.status,
                message: text,
            })
        }
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

/// The request as async-openai's types would send it: the reference
/// [`RequestBody`] is tested against.
#[cfg(test)]
fn to_wire(
    request: &ChatRequest,
    model: String,
    structured: StructuredOutput,
) -> oa::CreateChatCompletionRequest {
    let mut messages: Vec<_> = request.messages.iter().map(message_to_wire).collect();
    let response_format = match (&request.response_format, structured) {
        (None, _) => None,
        (Some(f), StructuredOutput::Native) => Some(oa::ResponseFormat::JsonSchema {
            json_schema: oa::ResponseFormatJsonSchema {
                description: f.description.clone(),
                name: f.name.clone(),
                schema: f.schema.clone(),
                strict: f.strict,
            },
        }),
        (Some(f), StructuredOutput::Prompt) => {
            messages.push(
                oa::ChatCompletionRequestSystemMessage::from(super::schema_instruction(f)).into(),
            );
            None
        }
    };
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
        response_format,
        ..Default::default()
    }
}

#[cfg(test)]
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
mod request_body_tests {
    use super::*;
    use crate::model::{ResponseFormat, ToolSpec};
    use std::sync::Arc;

    /// Every kind of message, tool and option, both ways of asking for an
    /// answer schema, streamed and not: `RequestBody` writes the JSON
    /// async-openai's types would.
    #[test]
    fn the_body_is_what_async_openai_would_send() {
        let call = |id: &str, name: &str| ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: format!("{{\"x\":\"{id}\"}}"),
        };
        let messages = vec![
            ChatMessage::system("be brief"),
            ChatMessage::user("what is 2+3? \u{1F600} \"quoted\""),
            ChatMessage::assistant_tool_calls(
                None,
                vec![call("c1", "calculator"), call("c2", "files.read")],
            ),
            ChatMessage::assistant_tool_calls(Some("thinking".into()), vec![call("c3", "echo")]),
            ChatMessage::tool_result(&call("c1", "calculator"), "{\"result\":5}"),
            ChatMessage {
                role: Role::Tool,
                content: None,
                tool_calls: Vec::new(),
                tool_call_id: None,
                name: None,
            },
            ChatMessage {
                role: Role::User,
                content: None,
                tool_calls: Vec::new(),
                tool_call_id: None,
                name: None,
            },
            ChatMessage::assistant("2+3 = 5"),
            ChatMessage {
                role: Role::Assistant,
                content: None,
                tool_calls: Vec::new(),
                tool_call_id: None,
                name: None,
            },
        ];
        let tools: Arc<[ToolSpec]> = vec![
            ToolSpec {
                name: "calculator".into(),
                description: "Evaluate".into(),
                parameters: serde_json::json!({"type": "object", "properties": {"expression": {"type": "string"}}}),
            },
            ToolSpec {
                name: "files.read".into(),
                description: String::new(),
                parameters: serde_json::json!({"type": "object"}),
            },
        ]
        .into();
        let format = |description: Option<&str>, strict| {
            Some(Arc::new(ResponseFormat {
                name: "answer".into(),
                description: description.map(Into::into),
                schema: serde_json::json!({"type": "object", "required": ["a"]}),
                strict,
            }))
        };
        let base = ChatRequest {
            model: String::new(),
            messages,
            tools,
            tool_choice: ToolChoice::Auto,
            temperature: None,
            max_tokens: None,
            purpose: Default::default(),
            response_format: None,
        };
        let mut cases = vec![base.clone()];
        cases.push(ChatRequest {
            model: "named-model".into(),
            tools: Vec::new().into(),
            temperature: Some(0.25),
            max_tokens: Some(77),
            ..base.clone()
        });
        cases.push(ChatRequest {
            tool_choice: ToolChoice::None,
            response_format: format(Some("the answer"), Some(true)),
            ..base.clone()
        });
        cases.push(ChatRequest {
            response_format: format(None, None),
            ..base.clone()
        });
        for (n, request) in cases.iter().enumerate() {
            for structured in [StructuredOutput::Native, StructuredOutput::Prompt] {
                let model = if request.model.is_empty() {
                    "default-model"
                } else {
                    request.model.as_str()
                };
                let reference = to_wire(request, model.into(), structured);
                let body = RequestBody::new(request, "default-model", structured);
                assert_eq!(
                    serde_json::to_value(&body).unwrap(),
                    serde_json::to_value(&reference).unwrap(),
                    "case {n}, {structured:?}"
                );
                let mut reference = reference;
                reference.stream = Some(true);
                reference.stream_options = Some(oa::ChatCompletionStreamOptions {
                    include_usage: Some(true),
                    include_obfuscation: None,
                });
                assert_eq!(
                    serde_json::to_value(body.streamed()).unwrap(),
                    serde_json::to_value(&reference).unwrap(),
                    "case {n}, {structured:?}, streamed"
                );
            }
        }
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
            response_format: None,
        };
        let wire =
            serde_json::to_value(to_wire(&request, "m".into(), StructuredOutput::Native)).unwrap();
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
            finish_reason: None,
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
