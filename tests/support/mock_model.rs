//! A scripted, in-process fake of an OpenAI-compatible chat-completions server.
//!
//! # Where this sits
//!
//! cadre's integration tests run everything for real (actors, storage, the
//! HTTP API, the async-openai client, cadre's retry and timeout handling)
//! except one part: the model. The model is faked here, and it is faked at the
//! wire. `MockModel` is a real HTTP server on `127.0.0.1:<random port>` that
//! answers `POST /v1/chat/completions` with OpenAI-shaped JSON, SSE streams
//! and error bodies. So every byte still goes through async-openai's
//! serialisation, its retry middleware and its response parsing, and through
//! cadre's own HTTP layer, just as in production. Point cadre's model
//! `base_url` at [`MockModel::base_url`] and nothing else changes.
//!
//! # How to script it
//!
//! The mock answers from a FIFO script, one [`Reply`] per request:
//!
//! ```ignore
//! mod support;
//! use support::mock_model::*;
//!
//! let model = MockModel::start().await;
//! model.push(Reply::tool_call("call_1", "read_file", r#"{"path":"a.txt"}"#));
//! model.push(Reply::text("done"));
//! // ... configure cadre with model.base_url() and run the scenario ...
//! assert_eq!(model.request_count(), 2);
//! assert_eq!(model.remaining(), 0);
//! assert_eq!(model.overruns(), 0);
//! let second = &model.requests()[1];          // the parsed JSON body
//! assert_eq!(second["messages"].as_array().unwrap().last().unwrap()["role"], "tool");
//! ```
//!
//! * Reply kinds: [`Reply::text`], [`Reply::tool_call`], [`Reply::tool_calls`],
//!   [`Reply::fail`] / [`Reply::error`] (an OpenAI error body with a status),
//!   [`Reply::refusal`] (a 400 for a request the model finds malformed,
//!   kept in [`MockModel::refusals`]), [`Reply::rate_limited`] (429 with
//!   `Retry-After`), [`Reply::garbage`] (200 but not JSON) and
//!   [`Reply::slow`] (sleeps, then answers).
//! * Every request body is recorded, in arrival order, overruns included:
//!   [`MockModel::requests`], [`MockModel::request_count`].
//!   [`MockModel::wait_for_requests`] waits without polling.
//! * When the script runs out, the request is an *overrun*: it is counted
//!   ([`MockModel::overruns`]), a loud line goes to stderr, and the answer is
//!   HTTP 500 with the message `mock model script exhausted`. So a test that
//!   forgot a reply fails clearly. For load tests,
//!   [`MockModel::set_default`] gives a reply to use instead whenever the
//!   script is empty, and [`MockModel::set_responder`] a function that
//!   builds one from the request, so the mock answers forever without a
//!   script (a tool call when the last message is the user's, text once it
//!   is a tool result, say).
//! * `POST /v1/embeddings` answers too, unscripted: deterministic vectors
//!   ([`embedding_of`]: words of one of [`GROUPS`] share a dimension, so
//!   `puppy` and `canine` are close), for memory's semantic ranking.
//! * Other modes, all off by default: [`MockModel::set_latency`] (every
//!   answer waits this long first), [`MockModel::set_strict`] (requests
//!   are checked against OpenAI's rules first, see [`openai_message_rules`];
//!   one that breaks them is refused with a 400, as OpenAI refuses it, and
//!   kept in [`MockModel::refusals`]), [`MockModel::set_keep_bodies`]
//!   (`false`: requests are counted but their bodies not kept, so a long
//!   load run does not grow the mock's memory) and
//!   [`MockModel::set_observer`] (called with each request and the time the
//!   mock spent on it, parsing, latency and answer included, for a load
//!   test that subtracts the model's time from what its client saw).
//! * Requests with `"stream": true` get a `text/event-stream` answer: a role
//!   delta, content in pieces of a few characters (or tool-call deltas with
//!   the arguments split across several chunks), a chunk with
//!   `finish_reason`, an optional usage chunk when
//!   `stream_options.include_usage` is set, then `data: [DONE]`. Error replies
//!   (`fail`, `error`, `rate_limited`) answer with their plain status even for
//!   streaming requests. `garbage` sends an SSE event whose data is not JSON.
//!
//! # Hostile modes
//!
//! For `tests/hostile_model.rs`, an endpoint that misbehaves the way a
//! hostile or broken server does:
//! [`Reply::many_tool_calls`] (n calls in one reply), [`Reply::cut`] (a
//! stream that ends before `finish_reason` and `[DONE]`; a body that stops
//! mid-JSON without a streamed request), [`Reply::with_raw_usage`] (usage
//! numbers as any JSON: negative, 2^63, a float, a string),
//! [`Reply::with_finish_reason`] (any `finish_reason`), [`Reply::invalid_utf8`]
//! (content bytes that are not UTF-8, streamed or not), [`Reply::trickle`]
//! (one delta every so often, for ever: a hang that keeps sending), and
//! [`Reply::deltas`] (a piece repeated as n deltas, one text without a
//! stream). [`MockModel::set_max_request_bytes`] makes it refuse requests
//! over a size with OpenAI's 400 `context_length_exceeded`, before the
//! script (kept in [`MockModel::refusals`]). A huge reply is
//! `Reply::text(&"x".repeat(n))`.
//!
//! # Watch out: retries
//!
//! cadre turns async-openai's own retry layer off and retries 429 and 5xx
//! itself (`ClientOptions::max_retries`, honouring `Retry-After`). **Each
//! retry is a new request and takes the next scripted reply.** A single
//! `Reply::fail(500)` followed by `Reply::text("ok")` therefore reads as
//! success to the caller; to make a call fail for good, script one failure
//! per attempt (`max_retries + 1`). The same goes for an overrun: each retry
//! is another overrun.
//!
//! Token usage is made up but deterministic: `prompt_tokens` is
//! `len(serialized messages) / 4` and `completion_tokens` is
//! `len(content or arguments) / 4`, each at least 1. [`Reply::with_usage`]
//! reports chosen numbers instead (in the body, or the stream's usage chunk).

// This file is compiled into every integration-test crate that says
// `mod support;`, and most crates use only part of it.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::serve::ListenerExt;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::Notify;

/// The path async-openai posts to when `base_url` is `http://HOST:PORT/v1`.
const CHAT_PATH: &str = "/v1/chat/completions";
/// Where the mock answers `/embeddings` ([`embedding_of`]).
const EMBEDDINGS_PATH: &str = "/v1/embeddings";
/// The error message of an overrun (a request that found the script empty).
pub const SCRIPT_EXHAUSTED: &str = "mock model script exhausted";
/// Characters per streamed content delta.
const CONTENT_PIECE: usize = 4;
/// Characters per streamed tool-call `arguments` delta.
const ARGUMENTS_PIECE: usize = 5;

/// One tool call in a scripted [`Reply::ToolCalls`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// Sent as-is as the `arguments` string. It may be invalid JSON on purpose.
    pub arguments: String,
}

/// One scripted answer. Each request takes one from the front of the script.
#[derive(Clone, Debug)]
pub enum Reply {
    /// 200, `finish_reason: "stop"`, assistant message with this content.
    Text(String),
    /// 200, `finish_reason: "tool_calls"`, `content: null`, these calls.
    ToolCalls(Vec<ToolCall>),
    /// This HTTP status with an OpenAI error body of this `type` and `message`.
    Error {
        status: u16,
        error_type: String,
        message: String,
    },
    /// 400 `invalid_request_error` on `messages` with this message: the
    /// model refusing a request it finds malformed. Kept in
    /// [`MockModel::refusals`].
    Refusal(String),
    /// 429 with a `Retry-After: <secs>` header and a `rate_limit_error` body.
    RateLimited { retry_after_secs: u64 },
    /// 200 with a body that is not JSON (for streams, an event that is not JSON).
    Garbage,
    /// Sleeps (tokio time) for the delay, then answers with the inner reply.
    Slow(Duration, Box<Reply>),
    /// Answers with the inner reply, reporting this usage.
    Usage {
        prompt_tokens: u64,
        completion_tokens: u64,
        then: Box<Reply>,
    },
    /// The inner reply with `usage` numbers as these raw JSON values.
    RawUsage {
        prompt_tokens: Value,
        completion_tokens: Value,
        then: Box<Reply>,
    },
    /// The inner reply with this `finish_reason`.
    FinishReason(String, Box<Reply>),
    /// The inner reply without its end: a stream stops before
    /// `finish_reason` and `[DONE]`; a plain body stops half way (the
    /// connection is reset).
    Cut(Box<Reply>),
    /// A text reply whose content holds bytes that are not UTF-8.
    InvalidUtf8,
    /// Streamed: one `piece` delta every `every`, for ever. Not streamed:
    /// the same wait, for ever.
    Trickle { piece: String, every: Duration },
    /// `piece` as `count` deltas (streamed), or `piece × count` (not).
    Deltas { piece: String, count: usize },
}

impl Reply {
    /// A plain assistant text answer.
    pub fn text(content: &str) -> Reply {
        Reply::Text(content.to_owned())
    }

    /// One tool call. `arguments` is the raw string sent and may be invalid JSON.
    pub fn tool_call(id: &str, name: &str, arguments: &str) -> Reply {
        Reply::tool_calls(&[(id, name, arguments)])
    }

    /// Several tool calls in one answer, as `(id, name, arguments)`.
    pub fn tool_calls(calls: &[(&str, &str, &str)]) -> Reply {
        Reply::ToolCalls(
            calls
                .iter()
                .map(|(id, name, arguments)| ToolCall {
                    id: (*id).to_owned(),
                    name: (*name).to_owned(),
                    arguments: (*arguments).to_owned(),
                })
                .collect(),
        )
    }

    /// An OpenAI-shaped error with this HTTP status. The `type` follows the
    /// status: `invalid_request_error`, `authentication_error`,
    /// `permission_error`, `not_found_error`, `rate_limit_error` or
    /// `server_error`.
    pub fn fail(status: u16) -> Reply {
        let error_type = match status {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        };
        Reply::error(
            status,
            error_type,
            &format!("mock model failure: HTTP {status}"),
        )
    }

    /// An OpenAI-shaped error with a chosen status, `type` and message, e.g.
    /// `Reply::error(429, "insufficient_quota", "quota")`, which async-openai
    /// does not retry.
    pub fn error(status: u16, error_type: &str, message: &str) -> Reply {
        assert!(
            StatusCode::from_u16(status).is_ok_and(|s| !s.is_success()),
            "Reply::error/fail needs a valid non-2xx HTTP status, got {status}"
        );
        Reply::Error {
            status,
            error_type: error_type.to_owned(),
            message: message.to_owned(),
        }
    }

    /// A 400 refusal of the request, saying why (see [`Reply::Refusal`]).
    pub fn refusal(why: &str) -> Reply {
        Reply::Refusal(why.to_owned())
    }

    /// 429 with `Retry-After: <retry_after_secs>`.
    pub fn rate_limited(retry_after_secs: u64) -> Reply {
        Reply::RateLimited { retry_after_secs }
    }

    /// 200 with a body that is not JSON.
    pub fn garbage() -> Reply {
        Reply::Garbage
    }

    /// Waits `delay` (tokio::time::sleep), then answers with `then`.
    pub fn slow(delay: Duration, then: Reply) -> Reply {
        Reply::Slow(delay, Box::new(then))
    }

    /// `count` calls of tool `name` with `arguments`, ids `call_0`...
    pub fn many_tool_calls(count: usize, name: &str, arguments: &str) -> Reply {
        Reply::ToolCalls(
            (0..count)
                .map(|i| ToolCall {
                    id: format!("call_{i}"),
                    name: name.to_owned(),
                    arguments: arguments.to_owned(),
                })
                .collect(),
        )
    }

    /// `then` without its end (see [`Reply::Cut`]).
    pub fn cut(then: Reply) -> Reply {
        Reply::Cut(Box::new(then))
    }

    /// `then` with usage numbers as raw JSON (`json!(-5)`, `json!("12")`...).
    pub fn with_raw_usage(prompt_tokens: Value, completion_tokens: Value, then: Reply) -> Reply {
        Reply::RawUsage {
            prompt_tokens,
            completion_tokens,
            then: Box::new(then),
        }
    }

    /// `then` with this `finish_reason`.
    pub fn with_finish_reason(finish_reason: &str, then: Reply) -> Reply {
        Reply::FinishReason(finish_reason.to_owned(), Box::new(then))
    }

    /// A text reply that is not UTF-8.
    pub fn invalid_utf8() -> Reply {
        Reply::InvalidUtf8
    }

    /// One `piece` delta every `every`, for ever.
    pub fn trickle(piece: &str, every: Duration) -> Reply {
        Reply::Trickle {
            piece: piece.to_owned(),
            every,
        }
    }

    /// `piece` as `count` deltas.
    pub fn deltas(piece: &str, count: usize) -> Reply {
        Reply::Deltas {
            piece: piece.to_owned(),
            count,
        }
    }

    /// `then`, reporting `prompt_tokens` and `completion_tokens` as its usage.
    pub fn with_usage(prompt_tokens: u64, completion_tokens: u64, then: Reply) -> Reply {
        Reply::Usage {
            prompt_tokens,
            completion_tokens,
            then: Box::new(then),
        }
    }
}

/// Builds the answer to a request that found the script empty, from its
/// body and its number (1 for the first request the mock received).
pub type Responder = dyn Fn(&Value, usize) -> Reply + Send + Sync;

/// Told of each request once it is answered: its body and the time the mock
/// spent on it.
pub type Observer = dyn Fn(&Value, Duration) + Send + Sync;

/// What answers a request that finds the script empty.
#[derive(Clone)]
enum Fallback {
    /// Nothing: the request is an overrun.
    Overrun,
    Reply(Reply),
    Responder(Arc<Responder>),
}

struct Script {
    replies: VecDeque<Reply>,
    fallback: Fallback,
    /// Requests received, overruns and refusals included.
    count: usize,
    /// Their bodies, while `keep_bodies` is on.
    requests: Vec<Value>,
    /// Their `Authorization` headers ("" when absent), in arrival order.
    authorizations: Vec<String>,
    keep_bodies: bool,
    overruns: usize,
    refusals: Vec<String>,
    strict: bool,
    /// Requests over this many bytes are refused as over the context length.
    max_request_bytes: Option<usize>,
    latency: Duration,
    observer: Option<Arc<Observer>>,
}

impl Default for Script {
    fn default() -> Script {
        Script {
            replies: VecDeque::new(),
            fallback: Fallback::Overrun,
            count: 0,
            requests: Vec::new(),
            authorizations: Vec::new(),
            keep_bodies: true,
            overruns: 0,
            refusals: Vec::new(),
            strict: false,
            max_request_bytes: None,
            latency: Duration::ZERO,
            observer: None,
        }
    }
}

struct Shared {
    script: Mutex<Script>,
    /// Woken (notify_waiters) after each recorded request.
    arrived: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Script> {
        // A test that panicked while holding the lock must not hide the
        // recorded requests from the next assertion.
        self.script.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Aborts the server task when the last clone of a [`MockModel`] goes.
struct ServerTask(tokio::task::JoinHandle<()>);

impl Drop for ServerTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A fake OpenAI-compatible model server. Clones share the same script and
/// records; the server stops when the last clone is dropped.
#[derive(Clone)]
pub struct MockModel {
    shared: Arc<Shared>,
    addr: SocketAddr,
    _server: Arc<ServerTask>,
}

impl std::fmt::Debug for MockModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.shared.lock();
        f.debug_struct("MockModel")
            .field("addr", &self.addr)
            .field("remaining", &s.replies.len())
            .field("requests", &s.count)
            .field("overruns", &s.overruns)
            .finish()
    }
}

impl MockModel {
    /// Binds `127.0.0.1:0` and serves on the current tokio runtime.
    pub async fn start() -> MockModel {
        let shared = Arc::new(Shared {
            script: Mutex::new(Script::default()),
            arrived: Notify::new(),
        });
        let app = Router::new()
            .route(CHAT_PATH, post(chat_completions))
            .route(EMBEDDINGS_PATH, post(embeddings))
            .fallback(unknown_route)
            .layer(DefaultBodyLimit::disable())
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("mock model: bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("mock model: local_addr");
        // As a model server would: no Nagle delay on small answers.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let server = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("mock model: server on {addr} stopped: {e}");
            }
        });
        MockModel {
            shared,
            addr,
            _server: Arc::new(ServerTask(server)),
        }
    }

    /// `http://127.0.0.1:PORT/v1`, the `base_url` for async-openai.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Appends one reply to the script.
    pub fn push(&self, reply: Reply) {
        self.shared.lock().replies.push_back(reply);
    }

    /// Appends several replies, in order.
    pub fn push_all(&self, replies: impl IntoIterator<Item = Reply>) {
        self.shared.lock().replies.extend(replies);
    }

    /// Every request body received, in arrival order, overruns included.
    /// A body that was not JSON is recorded as a JSON string. Empty of
    /// what arrived while [`Self::set_keep_bodies`] was off.
    pub fn requests(&self) -> Vec<Value> {
        self.shared.lock().requests.clone()
    }

    /// The `Authorization` header of every request ("" when it had none),
    /// in arrival order.
    #[allow(dead_code)]
    pub fn authorizations(&self) -> Vec<String> {
        self.shared.lock().authorizations.clone()
    }

    /// How many requests have arrived so far.
    pub fn request_count(&self) -> usize {
        self.shared.lock().count
    }

    /// Scripted replies not yet taken.
    pub fn remaining(&self) -> usize {
        self.shared.lock().replies.len()
    }

    /// Requests that found the script empty with no default set.
    pub fn overruns(&self) -> usize {
        self.shared.lock().overruns
    }

    /// Why each refused request was refused ([`Self::set_strict`],
    /// [`Reply::refusal`]), in arrival order.
    pub fn refusals(&self) -> Vec<String> {
        self.shared.lock().refusals.clone()
    }

    /// A reply for when the script is empty, used instead of an overrun.
    /// `None` restores overrun behaviour.
    pub fn set_default(&self, reply: Option<Reply>) {
        self.shared.lock().fallback = reply.map_or(Fallback::Overrun, Fallback::Reply);
    }

    /// Answers every request that finds the script empty with what
    /// `responder` builds from it, instead of an overrun.
    /// `set_default(None)` restores overrun behaviour.
    pub fn set_responder(
        &self,
        responder: impl Fn(&Value, usize) -> Reply + Send + Sync + 'static,
    ) {
        self.shared.lock().fallback = Fallback::Responder(Arc::new(responder));
    }

    /// Every answer waits `latency` (tokio time) before it goes out.
    pub fn set_latency(&self, latency: Duration) {
        self.shared.lock().latency = latency;
    }

    /// On: a request that breaks [`openai_message_rules`] (or is not JSON)
    /// is refused with a 400 before it takes a reply, as OpenAI refuses it,
    /// and kept in [`Self::refusals`].
    /// Requests over `max` bytes get OpenAI's 400 `context_length_exceeded`
    /// before the script is read (kept in [`MockModel::refusals`]).
    pub fn set_max_request_bytes(&self, max: Option<usize>) {
        self.shared.lock().max_request_bytes = max;
    }

    pub fn set_strict(&self, strict: bool) {
        self.shared.lock().strict = strict;
    }

    /// Off: requests are counted, and their bodies dropped.
    pub fn set_keep_bodies(&self, keep: bool) {
        self.shared.lock().keep_bodies = keep;
    }

    /// Calls `observer` with each request once its answer is built, and the
    /// time the mock spent on it (parsing, latency, answer).
    pub fn set_observer(&self, observer: impl Fn(&Value, Duration) + Send + Sync + 'static) {
        self.shared.lock().observer = Some(Arc::new(observer));
    }

    /// Resolves once at least `n` requests have arrived. It has no timeout of
    /// its own: wrap it in `tokio::time::timeout` if the test might stall.
    pub async fn wait_for_requests(&self, n: usize) {
        loop {
            let notified = self.shared.arrived.notified();
            tokio::pin!(notified);
            // Register before checking, so a request that lands between the
            // check and the await still wakes us.
            notified.as_mut().enable();
            if self.request_count() >= n {
                return;
            }
            notified.await;
        }
    }
}

// ---------------------------------------------------------------------------
// Server side
// ---------------------------------------------------------------------------

async fn chat_completions(
    State(shared): State<Arc<Shared>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let parsed = serde_json::from_slice::<Value>(&body);
    let not_json = parsed
        .as_ref()
        .err()
        .map(|e| format!("the body is not JSON: {e}"));
    let request =
        parsed.unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));

    let (number, taken, latency, observer) = {
        let mut script = shared.lock();
        script.count += 1;
        let authorization = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        script.authorizations.push(authorization.to_string());
        if script.keep_bodies {
            script.requests.push(request.clone());
        }
        let number = script.count;
        let refused = if script.strict {
            not_json.or_else(|| openai_message_rules(&request).err())
        } else {
            None
        };
        let too_long = script
            .max_request_bytes
            .filter(|max| body.len() > *max)
            .map(|max| {
                format!(
                    "This model's maximum context length is {max} bytes. However, your messages \
                     resulted in {} bytes. Please reduce the length of the messages.",
                    body.len()
                )
            });
        let taken = match too_long.or(refused) {
            Some(why) => Fallback::Reply(Reply::Refusal(why)),
            None => match script.replies.pop_front() {
                Some(reply) => Fallback::Reply(reply),
                None => {
                    if matches!(script.fallback, Fallback::Overrun) {
                        script.overruns += 1;
                    }
                    script.fallback.clone()
                }
            },
        };
        (number, taken, script.latency, script.observer.clone())
    };
    shared.arrived.notify_waiters();

    let mut reply = match taken {
        Fallback::Reply(reply) => reply,
        Fallback::Responder(responder) => responder(&request, number),
        Fallback::Overrun => {
            eprintln!(
                "\n!!!!! MOCK MODEL SCRIPT EXHAUSTED: request #{number} to {CHAT_PATH} found no \
                 scripted Reply left (push more replies or call set_default). Answering HTTP 500. \
                 Last message: {} !!!!!\n",
                last_message_excerpt(&request)
            );
            return error_response(500, "mock_script_exhausted", SCRIPT_EXHAUSTED, None);
        }
    };

    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let mut usage = None;
    let mut raw_usage = None;
    let mut finish_reason = None;
    let mut cut = false;
    loop {
        match reply {
            Reply::RawUsage {
                prompt_tokens,
                completion_tokens,
                then,
            } => {
                raw_usage = Some(json!({
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": 1,
                }));
                reply = *then;
            }
            Reply::FinishReason(reason, then) => {
                finish_reason = Some(reason);
                reply = *then;
            }
            Reply::Cut(then) => {
                cut = true;
                reply = *then;
            }
            Reply::Slow(delay, inner) => {
                tokio::time::sleep(delay).await;
                reply = *inner;
            }
            Reply::Usage {
                prompt_tokens,
                completion_tokens,
                then,
            } => {
                usage = Some((prompt_tokens, completion_tokens));
                reply = *then;
            }
            _ => break,
        }
    }

    let streaming = request.get("stream").and_then(Value::as_bool) == Some(true);
    let mut ctx = ReplyContext::new(&request, number);
    ctx.usage = usage;
    ctx.raw_usage = raw_usage;
    ctx.finish_reason = finish_reason;
    ctx.cut = cut;
    let response = match reply {
        Reply::Error {
            status,
            error_type,
            message,
        } => error_response(status, &error_type, &message, None),
        Reply::Refusal(why) => {
            let response = error_response(400, "invalid_request_error", &why, Some("messages"));
            shared.lock().refusals.push(why);
            response
        }
        Reply::RateLimited { retry_after_secs } => {
            let mut response = error_response(
                429,
                "rate_limit_error",
                &format!("Rate limit reached (mock). Retry after {retry_after_secs}s."),
                None,
            );
            response.headers_mut().insert(
                header::RETRY_AFTER,
                header::HeaderValue::from(retry_after_secs),
            );
            response
        }
        Reply::Garbage if streaming => sse_response(vec![
            "data: this is not json {{{\n\n".to_owned(),
            "data: [DONE]\n\n".to_owned(),
        ]),
        Reply::Garbage => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            "<html><body>502 Bad Gateway (mock garbage, not JSON)</body></html>",
        )
            .into_response(),
        Reply::Text(content) if streaming => sse_response(ctx.text_stream(&content)),
        Reply::Text(content) => ctx.json_response(ctx.text_completion(&content)),
        Reply::ToolCalls(calls) if streaming => sse_response(ctx.tool_call_stream(&calls)),
        Reply::ToolCalls(calls) => ctx.json_response(ctx.tool_call_completion(&calls)),
        Reply::InvalidUtf8 => {
            // The marker stands where the bad bytes go, in both shapes.
            let marker = "INVALID-UTF8-HERE";
            let text = if streaming {
                let mut events = vec![ctx.chunk(json!({"content": marker}), None)];
                ctx.finish(&mut events, "stop", marker.len());
                events.concat()
            } else {
                ctx.text_completion(marker).to_string()
            };
            let bytes = text.split(marker).collect::<Vec<_>>().join("\u{1}");
            let bytes: Vec<u8> = bytes
                .into_bytes()
                .into_iter()
                .flat_map(|b| if b == 1 { vec![0xff, 0xfe] } else { vec![b] })
                .collect();
            let kind = if streaming {
                "text/event-stream"
            } else {
                "application/json"
            };
            (StatusCode::OK, [(header::CONTENT_TYPE, kind)], bytes).into_response()
        }
        Reply::Trickle { piece, every } => {
            let first = ctx.chunk(json!({"role": "assistant", "content": ""}), None);
            let chunk = ctx.chunk(json!({"content": piece}), None);
            let body = futures::stream::once(async move { Ok::<_, Infallible>(first) }).chain(
                futures::stream::unfold(chunk, move |chunk| async move {
                    tokio::time::sleep(every).await;
                    Some((Ok::<_, Infallible>(chunk.clone()), chunk))
                }),
            );
            if streaming {
                (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "text/event-stream")],
                    Body::from_stream(body),
                )
                    .into_response()
            } else {
                std::future::pending::<()>().await;
                unreachable!("a trickle never answers a plain request")
            }
        }
        Reply::Deltas { piece, count } if streaming => {
            let mut events = vec![ctx.chunk(json!({"role": "assistant", "content": ""}), None)];
            let chunk = ctx.chunk(json!({"content": piece}), None);
            events.extend(std::iter::repeat_n(chunk, count));
            ctx.finish(&mut events, "stop", piece.len() * count);
            sse_response(events)
        }
        Reply::Deltas { piece, count } => {
            ctx.json_response(ctx.text_completion(&piece.repeat(count)))
        }
        Reply::Slow(..)
        | Reply::Usage { .. }
        | Reply::RawUsage { .. }
        | Reply::FinishReason(..)
        | Reply::Cut(..) => {
            unreachable!("wrapping replies are unwrapped above")
        }
    };
    if let Some(observer) = observer {
        observer(&request, started.elapsed());
    }
    response
}

/// OpenAI's rule for tool messages, which it enforces with a 400: an
/// assistant message with `tool_calls` is followed at once by one tool
/// message per call id, and a tool message answers a call of the assistant
/// message just before it.
pub fn openai_message_rules(request: &Value) -> Result<(), String> {
    let messages = request["messages"]
        .as_array()
        .ok_or("the request has no 'messages' array")?;
    let mut open: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or_default();
        if role == "tool" {
            let id = m["tool_call_id"].as_str().unwrap_or_default();
            let Some(at) = open.iter().position(|o| o == id) else {
                return Err(format!(
                    "messages[{i}]: messages with role 'tool' must be a response to a preceding \
                     message with 'tool_calls' (tool_call_id {id:?})"
                ));
            };
            open.remove(at);
            continue;
        }
        if !open.is_empty() {
            return Err(format!(
                "messages[{i}]: an assistant message with 'tool_calls' must be followed by tool \
                 messages responding to each 'tool_call_id'; missing {open:?}"
            ));
        }
        if role == "assistant"
            && let Some(calls) = m["tool_calls"].as_array()
        {
            open = calls
                .iter()
                .map(|c| c["id"].as_str().unwrap_or_default().to_owned())
                .collect();
        }
    }
    if open.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the request ends with unanswered tool calls {open:?}"
        ))
    }
}

/// Dimensions of the mock's embeddings.
pub const EMBEDDING_DIMENSIONS: usize = 64;

/// Words the mock's embeddings treat as meaning the same: each group is
/// one dimension, so `puppy` and `canine` are close while sharing no
/// letter; every other word is a dimension of its own from
/// [`GROUPS`]`.len()` on (by its FNV-1a hash), counted.
pub const GROUPS: [&[&str]; 4] = [
    &["dog", "dogs", "puppy", "puppies", "canine", "hound", "pet"],
    &["car", "cars", "vehicle", "automobile", "truck"],
    &["food", "meal", "dinner", "lunch", "eat"],
    &["money", "invoice", "bill", "payment", "price"],
];

/// The mock's deterministic embedding of `text` (not normalised): the
/// count of each word's dimension, words being lower-cased runs of
/// letters and digits of two characters or more.
pub fn embedding_of(text: &str) -> Vec<f32> {
    let mut v = vec![0.0f32; EMBEDDING_DIMENSIONS];
    let lower = text.to_lowercase();
    for word in lower
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() > 1)
    {
        let dim = match GROUPS.iter().position(|g| g.contains(&word)) {
            Some(g) => g,
            None => {
                let hash = word.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                    (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
                });
                GROUPS.len() + (hash % (EMBEDDING_DIMENSIONS - GROUPS.len()) as u64) as usize
            }
        };
        v[dim] += 1.0;
    }
    v
}

/// `POST /v1/embeddings`, OpenAI-shaped: `input` a string or a list of
/// them; the request is recorded with the chat requests' count untouched.
async fn embeddings(axum::Json(body): axum::Json<Value>) -> Response {
    let inputs: Vec<String> = match &body["input"] {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect(),
        _ => {
            return error_response(
                400,
                "invalid_request_error",
                "input is required",
                Some("input"),
            );
        }
    };
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(
            |(i, text)| json!({"object": "embedding", "index": i, "embedding": embedding_of(text)}),
        )
        .collect();
    axum::Json(json!({
        "object": "list",
        "data": data,
        "model": body["model"],
        "usage": {"prompt_tokens": 1, "total_tokens": 1},
    }))
    .into_response()
}

async fn unknown_route(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    eprintln!(
        "\n!!!!! MOCK MODEL: unexpected {method} {uri} (only POST {CHAT_PATH} is served; \
         is base_url missing /v1?) !!!!!\n"
    );
    error_response(
        404,
        "invalid_request_error",
        &format!("mock model: unknown route {method} {uri}"),
        None,
    )
}

fn error_response(status: u16, error_type: &str, message: &str, param: Option<&str>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = json!({
        "error": {
            "message": message,
            "type": error_type,
            "param": param,
            "code": null,
        }
    });
    (status, axum::Json(body)).into_response()
}

fn sse_response(events: Vec<String>) -> Response {
    let body = Body::from_stream(futures::stream::iter(
        events.into_iter().map(Ok::<_, Infallible>),
    ));
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

fn last_message_excerpt(request: &Value) -> String {
    let last = request
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|messages| messages.last());
    let Some(last) = last else {
        return "<no messages>".to_owned();
    };
    let text = last.to_string();
    if text.chars().count() > 200 {
        format!("{}...", text.chars().take(200).collect::<String>())
    } else {
        text
    }
}

/// Splits on character boundaries into pieces of at most `n` characters.
fn pieces(s: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    chars.chunks(n).map(|c| c.iter().collect()).collect()
}

/// The length of `value` as compact JSON, without building the string.
fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).expect("a Value serialises");
    count.0
}

fn tokens(len: usize) -> u64 {
    (len / 4).max(1) as u64
}

/// What every answer to one request shares.
struct ReplyContext {
    id: String,
    created: u64,
    model: String,
    prompt_tokens: u64,
    include_usage: bool,
    /// Scripted (prompt, completion) tokens, instead of the made-up ones.
    usage: Option<(u64, u64)>,
    /// A scripted `usage` object, sent as is.
    raw_usage: Option<Value>,
    /// A scripted `finish_reason`, instead of `stop` / `tool_calls`.
    finish_reason: Option<String>,
    /// Stop before the end (see [`Reply::Cut`]).
    cut: bool,
}

impl ReplyContext {
    fn new(request: &Value, number: usize) -> ReplyContext {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let model = request
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("mock-model")
            .to_owned();
        let prompt_len = request.get("messages").map(json_len).unwrap_or(0);
        let include_usage = request
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true);
        ReplyContext {
            id: format!("chatcmpl-mock-{number}"),
            created,
            model,
            prompt_tokens: tokens(prompt_len),
            include_usage,
            usage: None,
            raw_usage: None,
            finish_reason: None,
            cut: false,
        }
    }

    /// A plain JSON answer; cut half way (the connection reset) when `cut`.
    fn json_response(&self, body: Value) -> Response {
        if !self.cut {
            return axum::Json(body).into_response();
        }
        let mut text = body.to_string().into_bytes();
        let full = text.len();
        text.truncate(full / 2);
        // The error comes after the head and half the body went out.
        let body = futures::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from(text)) })
            .chain(futures::stream::once(async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                Err(std::io::Error::other("mock: connection cut"))
            }));
        (
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "application/json".to_owned()),
                (header::CONTENT_LENGTH, full.to_string()),
            ],
            Body::from_stream(body),
        )
            .into_response()
    }

    fn usage(&self, completion_len: usize) -> Value {
        if let Some(raw) = &self.raw_usage {
            return raw.clone();
        }
        let (prompt_tokens, completion_tokens) = self
            .usage
            .unwrap_or((self.prompt_tokens, tokens(completion_len)));
        json!({
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        })
    }

    fn completion(&self, message: Value, finish_reason: &str, completion_len: usize) -> Value {
        let finish_reason = self.finish_reason.as_deref().unwrap_or(finish_reason);
        json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": message,
                "finish_reason": finish_reason,
                "logprobs": null,
            }],
            "usage": self.usage(completion_len),
        })
    }

    fn text_completion(&self, content: &str) -> Value {
        let message = json!({"role": "assistant", "content": content, "refusal": null});
        self.completion(message, "stop", content.len())
    }

    fn tool_call_completion(&self, calls: &[ToolCall]) -> Value {
        let tool_calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                json!({
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                })
            })
            .collect();
        let message = json!({
            "role": "assistant",
            "content": null,
            "refusal": null,
            "tool_calls": tool_calls,
        });
        self.completion(message, "tool_calls", arguments_len(calls))
    }

    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> String {
        let mut chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "delta": delta,
                "finish_reason": finish_reason,
                "logprobs": null,
            }],
        });
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        sse_event(&chunk)
    }

    /// The closing events: finish chunk, optional usage chunk, `[DONE]`.
    fn finish(&self, events: &mut Vec<String>, finish_reason: &str, completion_len: usize) {
        if self.cut {
            return;
        }
        let finish_reason = self.finish_reason.as_deref().unwrap_or(finish_reason);
        events.push(self.chunk(json!({}), Some(finish_reason)));
        if self.include_usage {
            events.push(sse_event(&json!({
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": self.usage(completion_len),
            })));
        }
        events.push("data: [DONE]\n\n".to_owned());
    }

    fn text_stream(&self, content: &str) -> Vec<String> {
        let mut events = vec![self.chunk(json!({"role": "assistant", "content": ""}), None)];
        for piece in pieces(content, CONTENT_PIECE) {
            events.push(self.chunk(json!({"content": piece}), None));
        }
        self.finish(&mut events, "stop", content.len());
        events
    }

    fn tool_call_stream(&self, calls: &[ToolCall]) -> Vec<String> {
        let mut events = vec![self.chunk(json!({"role": "assistant", "content": null}), None)];
        for (index, call) in calls.iter().enumerate() {
            events.push(self.chunk(
                json!({"tool_calls": [{
                    "index": index,
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                }]}),
                None,
            ));
            for piece in pieces(&call.arguments, ARGUMENTS_PIECE) {
                events.push(self.chunk(
                    json!({"tool_calls": [{
                        "index": index,
                        "function": {"arguments": piece},
                    }]}),
                    None,
                ));
            }
        }
        self.finish(&mut events, "tool_calls", arguments_len(calls));
        events
    }
}

fn arguments_len(calls: &[ToolCall]) -> usize {
    calls.iter().map(|c| c.arguments.len()).sum()
}

fn sse_event(value: &Value) -> String {
    format!("data: {value}\n\n")
}

// ---------------------------------------------------------------------------
// Self-check of the mock itself (runs in every test crate that includes it).
// ---------------------------------------------------------------------------

#[cfg(test)]
mod self_test {
    use super::*;

    fn client() -> reqwest::Client {
        reqwest::Client::new()
    }

    fn url(model: &MockModel) -> String {
        format!("{}/chat/completions", model.base_url())
    }

    fn body(stream: bool) -> Value {
        json!({
            "model": "gpt-test",
            "messages": [{"role": "user", "content": "hello"}],
            "stream": stream,
        })
    }

    async fn post(model: &MockModel, body: &Value) -> reqwest::Response {
        client()
            .post(url(model))
            .json(body)
            .send()
            .await
            .expect("mock model reachable")
    }

    /// Parses an SSE body into its `data:` payloads, checking the framing.
    fn sse_data(text: &str) -> Vec<String> {
        assert!(
            text.ends_with("data: [DONE]\n\n"),
            "stream must end with [DONE]: {text}"
        );
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                e.strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("not a data line: {e:?}"))
                    .to_owned()
            })
            .collect()
    }

    #[tokio::test]
    async fn text_reply_and_recorded_request() {
        let model = MockModel::start().await;
        assert!(model.base_url().starts_with("http://127.0.0.1:"));
        assert!(model.base_url().ends_with("/v1"));
        model.push(Reply::text("hi there"));
        assert_eq!(model.remaining(), 1);

        let response = post(&model, &body(false)).await;
        assert_eq!(response.status(), 200);
        let reply: Value = response.json().await.unwrap();

        assert_eq!(reply["object"], "chat.completion");
        assert!(reply["id"].as_str().unwrap().starts_with("chatcmpl-"));
        assert!(reply["created"].as_u64().unwrap() > 1_600_000_000);
        assert_eq!(reply["model"], "gpt-test");
        let choice = &reply["choices"][0];
        assert_eq!(choice["index"], 0);
        assert_eq!(choice["message"]["role"], "assistant");
        assert_eq!(choice["message"]["content"], "hi there");
        assert_eq!(choice["finish_reason"], "stop");
        assert!(choice["logprobs"].is_null());
        let usage = &reply["usage"];
        assert_eq!(
            usage["total_tokens"].as_u64().unwrap(),
            usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
        );

        assert_eq!(model.request_count(), 1);
        assert_eq!(model.requests(), vec![body(false)]);
        assert_eq!(model.remaining(), 0);
        assert_eq!(model.overruns(), 0);
    }

    #[tokio::test]
    async fn tool_calls_reply_shape() {
        let model = MockModel::start().await;
        model.push_all([
            Reply::tool_call("call_1", "echo", r#"{"x":1}"#),
            Reply::tool_calls(&[("a", "f", "{}"), ("b", "g", "not json{")]),
        ]);

        let reply: Value = post(&model, &body(false)).await.json().await.unwrap();
        let choice = &reply["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert!(choice["message"]["content"].is_null());
        let call = &choice["message"]["tool_calls"][0];
        assert_eq!(call["id"], "call_1");
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "echo");
        assert_eq!(call["function"]["arguments"], r#"{"x":1}"#);

        let reply: Value = post(&model, &body(false)).await.json().await.unwrap();
        let calls = reply["choices"][0]["message"]["tool_calls"]
            .as_array()
            .unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1]["function"]["arguments"], "not json{");
    }

    #[tokio::test]
    async fn overrun_then_default() {
        let model = MockModel::start().await;
        let response = post(&model, &body(false)).await;
        assert_eq!(response.status(), 500);
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["message"], SCRIPT_EXHAUSTED);
        assert!(error["error"]["param"].is_null());
        assert!(error["error"]["code"].is_null());
        assert_eq!(model.overruns(), 1);
        assert_eq!(model.request_count(), 1, "overruns are recorded too");

        model.set_default(Some(Reply::text("default")));
        let reply: Value = post(&model, &body(false)).await.json().await.unwrap();
        assert_eq!(reply["choices"][0]["message"]["content"], "default");
        assert_eq!(model.overruns(), 1);
        assert_eq!(model.request_count(), 2);

        model.set_default(None);
        assert_eq!(post(&model, &body(false)).await.status(), 500);
        assert_eq!(model.overruns(), 2);
    }

    #[tokio::test]
    async fn failures_rate_limit_garbage_and_slow() {
        let model = MockModel::start().await;
        model.push_all([
            Reply::fail(503),
            Reply::rate_limited(7),
            Reply::garbage(),
            Reply::slow(Duration::from_millis(50), Reply::text("late")),
            Reply::fail(400),
        ]);

        let response = post(&model, &body(false)).await;
        assert_eq!(response.status(), 503);
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["type"], "server_error");

        let response = post(&model, &body(false)).await;
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()["retry-after"], "7");
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["type"], "rate_limit_error");

        let response = post(&model, &body(false)).await;
        assert_eq!(response.status(), 200);
        let text = response.text().await.unwrap();
        assert!(serde_json::from_str::<Value>(&text).is_err());

        let started = std::time::Instant::now();
        let reply: Value = post(&model, &body(false)).await.json().await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert_eq!(reply["choices"][0]["message"]["content"], "late");

        // Fail-type replies keep their plain status for streaming requests.
        let response = post(&model, &body(true)).await;
        assert_eq!(response.status(), 400);
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["type"], "invalid_request_error");
        assert_eq!(model.remaining(), 0);
        assert_eq!(model.overruns(), 0);
    }

    #[tokio::test]
    async fn streaming_text_and_tool_calls() {
        let model = MockModel::start().await;
        model.push(Reply::text("streamed content here"));
        model.push(Reply::tool_calls(&[
            ("c1", "alpha", r#"{"path":"a/b.txt"}"#),
            ("c2", "beta", "{}"),
        ]));

        let mut request = body(true);
        request["stream_options"] = json!({"include_usage": true});
        let response = post(&model, &request).await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let data = sse_data(&response.text().await.unwrap());
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert!(
            chunks
                .iter()
                .all(|c| c["object"] == "chat.completion.chunk")
        );
        let content: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(content, "streamed content here");
        assert!(chunks.len() > 4, "content comes in several pieces");
        let finish = &chunks[chunks.len() - 2];
        assert_eq!(finish["choices"][0]["finish_reason"], "stop");
        let usage = chunks.last().unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert!(usage["usage"]["total_tokens"].as_u64().unwrap() > 0);

        let response = post(&model, &body(true)).await;
        let data = sse_data(&response.text().await.unwrap());
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let mut ids = Vec::new();
        let mut names = Vec::new();
        let mut arguments = vec![String::new(), String::new()];
        let mut argument_deltas = 0;
        for chunk in &chunks {
            for delta in chunk["choices"][0]["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let index = delta["index"].as_u64().unwrap() as usize;
                if let Some(id) = delta["id"].as_str() {
                    assert_eq!(delta["type"], "function");
                    ids.push(id.to_owned());
                    names.push(delta["function"]["name"].as_str().unwrap().to_owned());
                }
                if let Some(piece) = delta["function"]["arguments"].as_str() {
                    if !piece.is_empty() {
                        argument_deltas += 1;
                    }
                    arguments[index].push_str(piece);
                }
            }
        }
        assert_eq!(ids, ["c1", "c2"]);
        assert_eq!(names, ["alpha", "beta"]);
        assert_eq!(arguments, [r#"{"path":"a/b.txt"}"#, "{}"]);
        assert!(argument_deltas > 2, "arguments split across several deltas");
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["finish_reason"],
            "tool_calls"
        );
    }

    #[tokio::test]
    async fn a_responder_answers_from_the_request_with_latency_and_an_observer() {
        let model = MockModel::start().await;
        model.set_keep_bodies(false);
        model.set_latency(Duration::from_millis(30));
        model.set_responder(|request, number| {
            Reply::text(&format!("#{number}: {}", request["messages"][0]["content"]))
        });
        let observed = Arc::new(Mutex::new(Vec::new()));
        let seen = observed.clone();
        model.set_observer(move |request, spent| {
            seen.lock().unwrap().push((request["model"].clone(), spent));
        });
        for number in 1..=2 {
            let reply: Value = post(&model, &body(false)).await.json().await.unwrap();
            assert_eq!(
                reply["choices"][0]["message"]["content"],
                format!("#{number}: \"hello\"")
            );
        }
        assert_eq!(model.request_count(), 2);
        assert!(model.requests().is_empty(), "bodies are not kept");
        assert_eq!(model.overruns(), 0);
        let observed = observed.lock().unwrap().clone();
        assert_eq!(observed.len(), 2);
        assert!(
            observed
                .iter()
                .all(|(m, spent)| m == "gpt-test" && *spent >= Duration::from_millis(30))
        );
    }

    #[tokio::test]
    async fn strict_mode_refuses_unanswered_tool_calls_before_the_script() {
        let model = MockModel::start().await;
        model.set_strict(true);
        model.push(Reply::text("fine"));
        let mut broken = body(false);
        broken["messages"] = json!([
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ]},
            {"role": "user", "content": "again"},
        ]);
        let response = post(&model, &broken).await;
        assert_eq!(response.status(), 400);
        let error: Value = response.json().await.unwrap();
        assert_eq!(error["error"]["type"], "invalid_request_error");
        assert_eq!(error["error"]["param"], "messages");
        assert_eq!(model.refusals().len(), 1, "{:?}", model.refusals());
        assert_eq!(model.remaining(), 1, "a refused request takes no reply");

        let reply: Value = post(&model, &body(false)).await.json().await.unwrap();
        assert_eq!(reply["choices"][0]["message"]["content"], "fine");
        model.push(Reply::refusal("no"));
        assert_eq!(post(&model, &body(false)).await.status(), 400);
        assert_eq!(
            model.refusals(),
            [
                "messages[2]: an assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'; missing [\"c1\"]",
                "no"
            ]
        );
        assert_eq!(model.request_count(), 3);
    }

    #[tokio::test]
    async fn wait_for_requests_wakes_on_arrival() {
        let model = MockModel::start().await;
        model.set_default(Some(Reply::text("ok")));
        let waiter = {
            let model = model.clone();
            tokio::spawn(async move { model.wait_for_requests(3).await })
        };
        for _ in 0..3 {
            post(&model, &body(false)).await;
        }
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("wait_for_requests resolved")
            .unwrap();
        // Already satisfied: returns at once.
        model.wait_for_requests(2).await;
        assert_eq!(model.overruns(), 0);
    }
}
