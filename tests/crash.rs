//! Crash consistency under load: the real `cadre serve` binary, many
//! concurrent sessions in tool-calling turns, `kill -9` at a random moment,
//! a restart on the same data dir, and a check of everything that was
//! acknowledged.
//!
//! One trial: the server runs over the data dir; every session sends turns
//! back to back (one at a time per session, all sessions at once) while a
//! side task creates sessions and pending confirmations
//! (`create_paper_order` on the pro plan); once a random number of turns has
//! been acknowledged (plus a random few milliseconds) the process is killed
//! with SIGKILL. The next server starts on the same file (the database must
//! open every time) and the checks run against it; it then serves the next
//! trial, so sessions carry a crash-cut history into their next turns.
//!
//! Checked after every restart:
//! - every turn that got a 200 reply is in the history, in order, with all
//!   its messages (user, assistant tool_calls, one tool message per call,
//!   assistant answer), the same answer and the same tool call ids;
//! - what was verified after the previous restart is unchanged (a prefix);
//! - beyond the acknowledged turns there is at most the turn that was in
//!   flight at the kill, and only as a prefix of a turn: a trailing user
//!   message without an answer is allowed, an answer without its user
//!   message, its tool calls or its tool results is not;
//! - every tool message has its call record, every call record belongs to a
//!   tool call in the history; `GET /v1/sessions/{id}/summary` counts match
//!   the records; `GET /v1/stats` counters match the records of every caller;
//! - every acknowledged session exists; every acknowledged pending
//!   confirmation is still listed by `GET /v1/confirmations`.
//!
//! The server is the real binary started by `tests/support/server.rs`. The
//! model is a strict mock written here (not `tests/support`): it answers
//! a user message with two tool calls (calculator and echo) and tool
//! results with text, which is deterministic under any interleaving, and it
//! refuses, as OpenAI does, a history where an assistant message with
//! `tool_calls` is not followed by a tool message for each call.
//!
//! Size: `CADRE_CRASH_TRIALS` (default 2) × `CADRE_CRASH_SESSIONS` (default
//! 20) in CI; `CADRE_CRASH_SEED` replays the kill moments of a run (the
//! interleaving itself is up to the scheduler). The large run:
//!
//! ```sh
//! CADRE_CRASH_TRIALS=100 CADRE_CRASH_SESSIONS=1000 cargo test --release --test crash -- --nocapture
//! ```
//!
//! TODO(workflow runs): workflow runs are being built in parallel with this
//! test. Once `POST /v1/workflows/{name}/runs` exists, start runs during the
//! load and check after each restart that every acknowledged run is found by
//! `GET /v1/workflows/runs/{id}`, finished or marked interrupted, never left
//! "running".

mod support;

use std::collections::{BTreeMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode as AxumStatus;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::server::Server;
use tokio::sync::Notify;

/// Parallel requests of the checking phase.
const CHECK_PARALLELISM: usize = 64;
/// Session creations and confirmations the side task makes per trial.
const SIDE_OPS_PER_TRIAL: usize = 5;
/// A bound on the turns one session sends in one trial (the kill comes first).
const MAX_TURNS_PER_SESSION: u64 = 10_000;
/// How long the load may take to reach its kill point before the test
/// calls it stalled (a hang guard, not a timing assertion).
const STALL_GUARD: Duration = Duration::from_secs(300);
/// Per-request bound: a request that takes longer is a hang.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// `GET /v1/calls` returns at most this many records.
const CALLS_LIMIT: usize = 1_000;

struct Settings {
    trials: usize,
    sessions: usize,
    seed: u64,
}

impl Settings {
    fn from_env() -> Settings {
        let number = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .unwrap_or_else(|_| panic!("{name} must be a number, got {v:?}"))
                })
                .unwrap_or(default)
        };
        let clock_seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Settings {
            trials: number("CADRE_CRASH_TRIALS", 2).max(1) as usize,
            sessions: number("CADRE_CRASH_SESSIONS", 20).max(1) as usize,
            seed: number("CADRE_CRASH_SEED", clock_seed),
        }
    }
}

// ---------------------------------------------------------------------------
// The strict mock model
// ---------------------------------------------------------------------------

#[derive(Default)]
struct ModelState {
    next_call: AtomicU64,
    requests: AtomicU64,
    /// Why each refused request was refused.
    refusals: Mutex<Vec<String>>,
}

struct StrictModel {
    base_url: String,
    state: Arc<ModelState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StrictModel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StrictModel {
    async fn start() -> StrictModel {
        let state = Arc::new(ModelState::default());
        let app = Router::new()
            .route("/v1/chat/completions", post(completions))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the mock model");
        let addr = listener.local_addr().expect("mock model address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        StrictModel {
            base_url: format!("http://{addr}/v1"),
            state,
            task,
        }
    }

    fn refusals(&self) -> Vec<String> {
        self.state
            .refusals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

async fn completions(State(state): State<Arc<ModelState>>, body: Bytes) -> Response {
    state.requests.fetch_add(1, Ordering::Relaxed);
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return refuse(&state, format!("the body is not JSON: {e}")),
    };
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    if let Err(why) = openai_message_rules(&messages) {
        return refuse(&state, why);
    }
    let last = messages.last().cloned().unwrap_or(Value::Null);
    match last["role"].as_str() {
        Some("user") => {
            let content = last["content"].as_str().unwrap_or_default();
            let expression = content
                .rsplit_once(": ")
                .map_or("1+1", |(_, expression)| expression);
            let n = state.next_call.fetch_add(2, Ordering::Relaxed);
            completion(json!({
                "role": "assistant",
                "content": null,
                "tool_calls": [
                    {"id": format!("call_{n}"), "type": "function", "function": {
                        "name": "calculator",
                        "arguments": json!({"expression": expression}).to_string()}},
                    {"id": format!("call_{}", n + 1), "type": "function", "function": {
                        "name": "echo",
                        "arguments": json!({"message": content}).to_string()}},
                ],
            }))
        }
        Some("tool") => {
            let user = messages
                .iter()
                .rev()
                .find(|m| m["role"] == "user")
                .and_then(|m| m["content"].as_str())
                .unwrap_or_default();
            let results = messages
                .iter()
                .rev()
                .take_while(|m| m["role"] == "tool")
                .count();
            completion(json!({
                "role": "assistant",
                "content": answer_for(user, results),
            }))
        }
        other => refuse(&state, format!("unexpected last message role {other:?}")),
    }
}

fn answer_for(user: &str, results: usize) -> String {
    format!("answered '{user}' from {results} tool results")
}

/// OpenAI's rule for tool messages: an assistant message with `tool_calls`
/// is followed at once by one tool message per call id, and a tool message
/// answers a call of the assistant message just before it.
fn openai_message_rules(messages: &[Value]) -> Result<(), String> {
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

fn completion(message: Value) -> Response {
    let finish = if message["tool_calls"].is_array() {
        "tool_calls"
    } else {
        "stop"
    };
    axum::Json(json!({
        "id": "chatcmpl-crash",
        "object": "chat.completion",
        "created": 1_700_000_000u64,
        "model": "mock-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": null}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }))
    .into_response()
}

fn refuse(state: &ModelState, why: String) -> Response {
    state
        .refusals
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(why.clone());
    (
        AxumStatus::BAD_REQUEST,
        axum::Json(json!({"error": {
            "message": why, "type": "invalid_request_error", "param": "messages", "code": null
        }})),
    )
        .into_response()
}

// ---------------------------------------------------------------------------
// The server process
// ---------------------------------------------------------------------------

struct Launch {
    data_dir: PathBuf,
    agents_dir: PathBuf,
    model_url: String,
}

/// Starts `cadre serve` (tests/support/server.rs) off the runtime's worker
/// threads: the start blocks until the server printed its address.
async fn start_server(launch: &Launch) -> Server {
    let (data, agents, model) = (
        launch.data_dir.clone(),
        launch.agents_dir.clone(),
        launch.model_url.clone(),
    );
    tokio::task::spawn_blocking(move || {
        // Every session comes from one loopback address: lift the per-caller
        // API limit and the executor's queue bound, so the load is all turns
        // and no refusals.
        let env = [
            ("CADRE_API_LIMIT_PER_SECOND", "1000000"),
            ("CADRE_API_LIMIT_BURST", "1000000"),
            ("CADRE_CONCURRENCY_QUEUE_SIZE", "1000000"),
            ("RUST_LOG", "warn"),
        ];
        Server::start(&data, &agents, &model, &env)
    })
    .await
    .expect("the start thread finished")
}

// ---------------------------------------------------------------------------
// What the clients were told
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct AckedTurn {
    content: String,
    answer: String,
    call_ids: Vec<String>,
}

/// One session as its client saw it.
#[derive(Debug, Clone, Default)]
struct Book {
    index: usize,
    id: String,
    /// How many messages were checked after the last restart, and a digest
    /// of them: they must never change (a digest keeps memory flat in the
    /// large run).
    verified: usize,
    verified_digest: u64,
    /// Turns acknowledged (200) since the last restart, in order.
    acked: Vec<AckedTurn>,
    /// The turn that was sent when the server died; it may be absent,
    /// partly written or complete.
    in_flight: Option<String>,
    /// Turns sent so far, over all trials (makes every content unique).
    turns_sent: u64,
    failures: Vec<String>,
}

/// Shared by the load tasks of one trial.
struct Load {
    client: reqwest::Client,
    base: String,
    acked: AtomicUsize,
    progress: Notify,
    /// Set just before the kill: a request error after it is the kill's.
    killed: AtomicBool,
}

impl Load {
    fn failure_or_in_flight(&self, what: String) -> Option<String> {
        (!self.killed.load(Ordering::SeqCst)).then_some(what)
    }
}

async fn read_json(r: reqwest::Response) -> Result<(StatusCode, Value), reqwest::Error> {
    let status = r.status();
    let text = r.text().await?;
    Ok((
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

/// Sends turns to one session until the server dies (or the bound).
async fn drive(load: Arc<Load>, mut book: Book) -> Book {
    for _ in 0..MAX_TURNS_PER_SESSION {
        book.turns_sent += 1;
        let n = book.turns_sent;
        let content = format!("s{} t{n}: {}+{n}", book.index, book.index);
        let sent = load
            .client
            .post(format!("{}/v1/sessions/{}/messages", load.base, book.id))
            .json(&json!({ "content": content }))
            .send()
            .await;
        let reply = match sent {
            Ok(r) => read_json(r).await,
            Err(e) => Err(e),
        };
        match reply {
            Ok((StatusCode::OK, body)) => {
                let call_ids = body["tool_calls"]
                    .as_array()
                    .map(|calls| {
                        calls
                            .iter()
                            .map(|c| c["id"].as_str().unwrap_or_default().to_owned())
                            .collect()
                    })
                    .unwrap_or_default();
                book.acked.push(AckedTurn {
                    content,
                    answer: body["answer"].as_str().unwrap_or_default().to_owned(),
                    call_ids,
                });
                load.acked.fetch_add(1, Ordering::SeqCst);
                load.progress.notify_waiters();
            }
            Ok((status, body)) => {
                // A reply that is not 200 is an error the load should never
                // see, unless the server is already dying.
                if let Some(f) = load.failure_or_in_flight(format!(
                    "session {} turn {content:?}: HTTP {status}: {body}",
                    book.id
                )) {
                    book.failures.push(f);
                }
                book.in_flight = Some(content);
                break;
            }
            Err(e) => {
                if let Some(f) = load.failure_or_in_flight(format!(
                    "session {} turn {content:?} failed before the kill: {e}",
                    book.id
                )) {
                    book.failures.push(f);
                }
                book.in_flight = Some(content);
                break;
            }
        }
    }
    book
}

/// What the side task got acknowledged in one trial.
#[derive(Default)]
struct SideAcks {
    sessions: Vec<String>,
    confirmations: Vec<String>,
    failures: Vec<String>,
}

/// Creates sessions and pending confirmations while the turns run.
async fn side_task(load: Arc<Load>, trial: usize, gaps_ms: Vec<u64>) -> SideAcks {
    let mut acks = SideAcks::default();
    for (k, gap) in gaps_ms.into_iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(gap)).await;
        let created = load
            .client
            .post(format!("{}/v1/sessions", load.base))
            .json(&json!({"agent": "crash", "user_id": format!("side-{trial}-{k}")}))
            .send()
            .await;
        let reply = match created {
            Ok(r) => read_json(r).await,
            Err(e) => Err(e),
        };
        match reply {
            Ok((StatusCode::CREATED, body)) => {
                acks.sessions
                    .push(body["id"].as_str().unwrap_or_default().to_owned());
            }
            Ok((status, body)) => {
                acks.failures
                    .extend(load.failure_or_in_flight(format!("create session: {status} {body}")));
                break;
            }
            Err(e) => {
                acks.failures
                    .extend(load.failure_or_in_flight(format!("create session: {e}")));
                break;
            }
        }
        // One user per order: the tool allows 10 a minute per user.
        let invoked = load
            .client
            .post(format!("{}/v1/tools/create_paper_order/invoke", load.base))
            .json(&json!({
                "plan": "pro",
                "user_id": format!("crash-{trial}-{k}"),
                "params": {"symbol": "AAPL", "side": "buy", "quantity": 1, "order_type": "market"},
            }))
            .send()
            .await;
        let reply = match invoked {
            Ok(r) => read_json(r).await,
            Err(e) => Err(e),
        };
        match reply {
            Ok((StatusCode::ACCEPTED, body)) => {
                match body["metadata"]["confirmation_id"].as_str() {
                    Some(id) => acks.confirmations.push(id.to_owned()),
                    None => acks.failures.push(format!("no confirmation id in {body}")),
                }
            }
            Ok((status, body)) => {
                acks.failures.extend(
                    load.failure_or_in_flight(format!("create_paper_order: {status} {body}")),
                );
                break;
            }
            Err(e) => {
                acks.failures
                    .extend(load.failure_or_in_flight(format!("create_paper_order: {e}")));
                break;
            }
        }
    }
    acks
}

// ---------------------------------------------------------------------------
// Checks after a restart
// ---------------------------------------------------------------------------

/// Counters one session's records add to the global ones.
#[derive(Debug, Default)]
struct Tally {
    /// tool -> (total, successful)
    per_tool: BTreeMap<String, (u64, u64)>,
    in_flight_absent: usize,
    in_flight_partial: usize,
    in_flight_complete: usize,
    lost: usize,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        for (tool, (t, s)) in other.per_tool {
            let e = self.per_tool.entry(tool).or_default();
            e.0 += t;
            e.1 += s;
        }
        self.in_flight_absent += other.in_flight_absent;
        self.in_flight_partial += other.in_flight_partial;
        self.in_flight_complete += other.in_flight_complete;
        self.lost += other.lost;
    }
}

async fn get(client: &reqwest::Client, url: String) -> Result<Value, String> {
    let r = client
        .get(&url)
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    match read_json(r).await {
        Ok((StatusCode::OK, body)) => Ok(body),
        Ok((status, body)) => Err(format!("GET {url}: HTTP {status}: {body}")),
        Err(e) => Err(format!("GET {url}: {e}")),
    }
}

fn role(m: &Value) -> &str {
    m["role"].as_str().unwrap_or_default()
}

fn call_ids(m: &Value) -> Vec<String> {
    m["tool_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .map(|c| c["id"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A digest of messages, as the API serialises them.
fn digest(messages: &[Value]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for m in messages {
        m.to_string().hash(&mut h);
    }
    h.finish()
}

/// Checks that `turn` (starting with its user message) is a prefix of a
/// well-formed turn; returns whether it is complete.
fn turn_shape(turn: &[Value]) -> Result<bool, String> {
    let fail = |why: &str| Err(format!("{why}: {}", Value::from(turn.to_vec())));
    if turn.is_empty() || role(&turn[0]) != "user" {
        return fail("a turn does not start with its user message");
    }
    let Some(asked) = turn.get(1) else {
        return Ok(false);
    };
    if role(asked) != "assistant" || call_ids(asked).is_empty() {
        return fail("the model's first reply in a turn must be its tool calls");
    }
    let expected = call_ids(asked);
    let results: Vec<&Value> = turn[2..].iter().take_while(|m| role(m) == "tool").collect();
    if results.is_empty() {
        return if turn.len() == 2 {
            Ok(false)
        } else {
            fail("an answer without its tool results")
        };
    }
    let answered: Vec<String> = results
        .iter()
        .map(|m| m["tool_call_id"].as_str().unwrap_or_default().to_owned())
        .collect();
    if answered != expected {
        return fail("the tool results do not answer the tool calls one to one");
    }
    let rest = &turn[2 + results.len()..];
    match rest {
        [] => Ok(false),
        [answer] if role(answer) == "assistant" && call_ids(answer).is_empty() => Ok(true),
        _ => fail("a turn goes on after its answer"),
    }
}

/// Checks one session against what its client was told; on success the
/// book moves on (verified = today's history).
async fn check_session(client: &reqwest::Client, base: &str, mut book: Book) -> (Book, Tally) {
    let mut tally = Tally::default();
    let result = check_session_inner(client, base, &book, &mut tally).await;
    match result {
        Ok(history) => {
            book.verified = history.len();
            book.verified_digest = digest(&history);
            book.acked.clear();
            book.in_flight = None;
        }
        Err(e) => book.failures.push(format!("session {}: {e}", book.id)),
    }
    (book, tally)
}

async fn check_session_inner(
    client: &reqwest::Client,
    base: &str,
    book: &Book,
    tally: &mut Tally,
) -> Result<Vec<Value>, String> {
    let id = &book.id;
    // Every page of the history, oldest first.
    let mut history: Vec<Value> = Vec::new();
    let mut after = 0u64;
    loop {
        let body = get(
            client,
            format!("{base}/v1/sessions/{id}/messages?after={after}"),
        )
        .await?;
        let page = body["messages"]
            .as_array()
            .ok_or_else(|| format!("no messages array: {body}"))?;
        history.extend(page.iter().cloned());
        match body["next_after"].as_u64() {
            Some(next) if next > after && !page.is_empty() => after = next,
            _ => break,
        }
    }
    for (i, m) in history.iter().enumerate() {
        if m["seq"].as_u64() != Some(i as u64 + 1) {
            return Err(format!("message {i} has seq {} (gap or reorder)", m["seq"]));
        }
    }
    if history.len() < book.verified || digest(&history[..book.verified]) != book.verified_digest {
        return Err("history verified after the previous restart changed".into());
    }
    // Split what is new into turns, each starting at a user message.
    let new = &history[book.verified..];
    if let Some(first) = new.first()
        && role(first) != "user"
    {
        return Err(format!(
            "new messages start without a user message: {first}"
        ));
    }
    let mut turns: Vec<&[Value]> = Vec::new();
    let mut start = 0;
    for i in 1..=new.len() {
        if i == new.len() || role(&new[i]) == "user" {
            if i > start {
                turns.push(&new[start..i]);
            }
            start = i;
        }
    }
    // Acknowledged turns, in order, complete and as replied.
    for (k, acked) in book.acked.iter().enumerate() {
        let Some(turn) = turns.get(k) else {
            tally.lost += book.acked.len() - k;
            return Err(format!(
                "{} acknowledged turn(s) lost, first {:?}",
                book.acked.len() - k,
                acked.content
            ));
        };
        if turn[0]["content"] != acked.content.as_str() {
            tally.lost += 1;
            return Err(format!(
                "acknowledged turn {:?} missing; found {}",
                acked.content, turn[0]
            ));
        }
        if !turn_shape(turn)? {
            tally.lost += 1;
            return Err(format!(
                "acknowledged turn {:?} is incomplete",
                acked.content
            ));
        }
        if call_ids(&turn[1]) != acked.call_ids {
            return Err(format!(
                "turn {:?}: tool call ids {:?} differ from the reply's {:?}",
                acked.content,
                call_ids(&turn[1]),
                acked.call_ids
            ));
        }
        let answer = &turn[turn.len() - 1]["content"];
        if answer != acked.answer.as_str() {
            return Err(format!(
                "turn {:?}: stored answer {answer} differs from the reply's {:?}",
                acked.content, acked.answer
            ));
        }
    }
    // At most the turn in flight at the kill, as a prefix of a turn.
    let extra = &turns[book.acked.len().min(turns.len())..];
    match (extra, &book.in_flight) {
        ([], None) => {}
        ([], Some(_)) => tally.in_flight_absent += 1,
        ([turn], Some(content)) if turn[0]["content"] == content.as_str() => {
            if turn_shape(turn)? {
                tally.in_flight_complete += 1;
            } else {
                tally.in_flight_partial += 1;
            }
        }
        _ => {
            return Err(format!(
                "unexpected turns after the acknowledged ones (in flight: {:?}): {}",
                book.in_flight,
                Value::from(
                    extra
                        .iter()
                        .map(|t| Value::from(t.to_vec()))
                        .collect::<Vec<_>>()
                )
            ));
        }
    }
    // Call records against the whole history.
    let body = get(
        client,
        format!("{base}/v1/calls?conversation_id={id}&limit={CALLS_LIMIT}"),
    )
    .await?;
    let records = body["calls"]
        .as_array()
        .cloned()
        .ok_or_else(|| format!("no calls array: {body}"))?;
    if records.len() >= CALLS_LIMIT {
        return Err(format!(
            "{} records: more than GET /v1/calls can list; use fewer trials",
            records.len()
        ));
    }
    let recorded: HashSet<&str> = records
        .iter()
        .filter_map(|r| r["tool_call_id"].as_str())
        .collect();
    let asked: HashSet<String> = history.iter().flat_map(call_ids).collect();
    for m in history.iter().filter(|m| role(m) == "tool") {
        let call = m["tool_call_id"].as_str().unwrap_or_default();
        if !recorded.contains(call) {
            return Err(format!("tool result {call} has no call record"));
        }
    }
    for r in &records {
        let call = r["tool_call_id"].as_str().unwrap_or_default();
        if !asked.contains(call) {
            return Err(format!(
                "call record {} for {call:?} matches no tool call in the history",
                r["record_id"]
            ));
        }
    }
    let mut successful = 0;
    for r in &records {
        let ok = r["is_success"] == true;
        successful += u64::from(ok);
        let e = tally
            .per_tool
            .entry(r["tool_name"].as_str().unwrap_or_default().to_owned())
            .or_default();
        e.0 += 1;
        e.1 += u64::from(ok);
    }
    let summary = get(client, format!("{base}/v1/sessions/{id}/summary")).await?;
    if summary["message_count"] != history.len() {
        return Err(format!(
            "summary counts {} messages, the history has {}",
            summary["message_count"],
            history.len()
        ));
    }
    let usage = &summary["tool_usage_summary"];
    if usage["total_calls"] != records.len() || usage["successful_calls"] != successful {
        return Err(format!(
            "summary {usage} does not match {} records ({successful} successful)",
            records.len()
        ));
    }
    Ok(history)
}

/// Every caller's records against `GET /v1/stats`.
async fn check_stats(
    client: &reqwest::Client,
    base: &str,
    mut tally: BTreeMap<String, (u64, u64)>,
) -> Result<(), String> {
    // Direct calls (the confirmations) have no conversation.
    let body = get(
        client,
        format!("{base}/v1/calls?tool=create_paper_order&limit={CALLS_LIMIT}"),
    )
    .await?;
    let direct = body["calls"].as_array().cloned().unwrap_or_default();
    if direct.len() >= CALLS_LIMIT {
        return Err("too many direct records to list".into());
    }
    let e = tally.entry("create_paper_order".into()).or_default();
    e.0 += direct.len() as u64;
    e.1 += direct.iter().filter(|r| r["is_success"] == true).count() as u64;
    let stats = get(client, format!("{base}/v1/stats")).await?;
    let total: u64 = tally.values().map(|(t, _)| t).sum();
    let ok: u64 = tally.values().map(|(_, s)| s).sum();
    if stats["total_calls"] != total || stats["successful_calls"] != ok {
        return Err(format!(
            "stats {} total / {} successful, records {total} / {ok}",
            stats["total_calls"], stats["successful_calls"]
        ));
    }
    for (tool, (t, s)) in &tally {
        let counters = &stats["tools"][tool];
        if counters["total_calls"] != *t || counters["successful_calls"] != *s {
            return Err(format!(
                "stats for {tool}: {counters}, records {t} total / {s} successful"
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------

#[derive(Debug, Default)]
struct Figures {
    acked: usize,
    in_flight_absent: usize,
    in_flight_partial: usize,
    in_flight_complete: usize,
    lost: usize,
    sessions_created: usize,
    confirmations: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_acknowledged_turn_is_lost_across_kill_9_under_load() {
    let settings = Settings::from_env();
    eprintln!(
        "crash test: {} trial(s) x {} session(s), seed {} (CADRE_CRASH_SEED to replay)",
        settings.trials, settings.sessions, settings.seed
    );
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(settings.seed);
    let model = StrictModel::start().await;
    let data = tempfile::tempdir().expect("data dir");
    let agents = tempfile::tempdir().expect("agents dir");
    std::fs::write(
        agents.path().join("crash.toml"),
        "name = \"crash\"\nsystem_prompt = \"You are a test agent.\"\n\
         tools = [\"calculator\", \"echo\"]\nmax_iterations = 3\n",
    )
    .expect("agent file");
    let launch = Launch {
        // The server's log goes next to the data dir, inside the temp dir.
        data_dir: data.path().join("data"),
        agents_dir: agents.path().to_path_buf(),
        model_url: model.base_url.clone(),
    };
    let client = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .expect("client");

    let mut server = start_server(&launch).await;
    let mut books: Vec<Book> = futures::stream::iter(0..settings.sessions)
        .map(|index| {
            let (client, base) = (client.clone(), server.base.clone());
            async move {
                let body = client
                    .post(format!("{base}/v1/sessions"))
                    .json(&json!({"agent": "crash"}))
                    .send()
                    .await
                    .expect("create a session");
                let (status, body) = read_json(body).await.expect("session body");
                assert_eq!(status, StatusCode::CREATED, "{body}");
                Book {
                    index,
                    id: body["id"].as_str().expect("id").to_owned(),
                    verified_digest: digest(&[]),
                    ..Book::default()
                }
            }
        })
        .buffered(CHECK_PARALLELISM)
        .collect()
        .await;

    let mut figures = Figures::default();
    let mut sessions_acked: Vec<String> = Vec::new();
    let mut confirmations_acked: Vec<String> = Vec::new();
    for trial in 0..settings.trials {
        let target = rng.random_range(1..=settings.sessions * 3);
        let extra = Duration::from_millis(rng.random_range(0..=15));
        let gaps: Vec<u64> = (0..SIDE_OPS_PER_TRIAL)
            .map(|_| rng.random_range(0..=20))
            .collect();
        let load = Arc::new(Load {
            client: client.clone(),
            base: server.base.clone(),
            acked: AtomicUsize::new(0),
            progress: Notify::new(),
            killed: AtomicBool::new(false),
        });
        let side = tokio::spawn(side_task(load.clone(), trial, gaps));
        let drivers: Vec<_> = books
            .drain(..)
            .map(|book| tokio::spawn(drive(load.clone(), book)))
            .collect();
        let reached = tokio::time::timeout(STALL_GUARD, async {
            loop {
                let notified = load.progress.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if load.acked.load(Ordering::SeqCst) >= target {
                    return;
                }
                notified.await;
            }
        })
        .await;
        if reached.is_err() {
            panic!(
                "trial {trial}: the load stalled at {} of {target} acknowledged turns; server \
                 log:\n{}",
                load.acked.load(Ordering::SeqCst),
                server.log_tail()
            );
        }
        tokio::time::sleep(extra).await;
        load.killed.store(true, Ordering::SeqCst);
        server.kill_9();
        for d in drivers {
            books.push(d.await.expect("a load task panicked"));
        }
        let side = side.await.expect("the side task panicked");
        let acked_now: usize = books.iter().map(|b| b.acked.len()).sum();
        figures.acked += acked_now;
        figures.sessions_created += side.sessions.len();
        figures.confirmations += side.confirmations.len();
        sessions_acked.extend(side.sessions);
        confirmations_acked.extend(side.confirmations);

        // Restart on the same data dir and check everything acknowledged.
        server = start_server(&launch).await;
        let mut failures: Vec<String> = side.failures;
        let checked: Vec<(Book, Tally)> = futures::stream::iter(books.drain(..))
            .map(|book| check_session(&client, &server.base, book))
            .buffered(CHECK_PARALLELISM)
            .collect()
            .await;
        let mut tally = Tally::default();
        for (mut book, t) in checked {
            failures.append(&mut book.failures);
            tally.add(t);
            books.push(book);
        }
        figures.in_flight_absent += tally.in_flight_absent;
        figures.in_flight_partial += tally.in_flight_partial;
        figures.in_flight_complete += tally.in_flight_complete;
        figures.lost += tally.lost;
        if let Err(e) = check_stats(&client, &server.base, tally.per_tool).await {
            failures.push(format!("counters: {e}"));
        }
        let listed = get(&client, format!("{}/v1/confirmations", server.base)).await;
        match listed {
            Ok(body) => {
                let ids: HashSet<&str> = body["confirmations"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|c| c["confirmation_id"].as_str())
                            .collect()
                    })
                    .unwrap_or_default();
                for id in &confirmations_acked {
                    if !ids.contains(id.as_str()) {
                        failures.push(format!("pending confirmation {id} lost"));
                    }
                }
            }
            Err(e) => failures.push(e),
        }
        for id in &sessions_acked {
            if let Err(e) = get(&client, format!("{}/v1/sessions/{id}", server.base)).await {
                failures.push(format!("acknowledged session lost: {e}"));
            }
        }
        let refusals = model.refusals();
        if !refusals.is_empty() {
            failures.push(format!(
                "the model refused {} request(s) cadre built, first: {}",
                refusals.len(),
                refusals[0]
            ));
        }
        eprintln!(
            "trial {trial}: killed after {acked_now} acknowledged turns (target {target}); \
             in flight at the kill: {} absent, {} partial, {} complete; lost {}",
            tally.in_flight_absent, tally.in_flight_partial, tally.in_flight_complete, tally.lost
        );
        if !failures.is_empty() {
            let shown: Vec<&String> = failures.iter().take(10).collect();
            panic!(
                "trial {trial} (seed {}): {} failure(s):\n{}\nserver log (after restart):\n{}",
                settings.seed,
                failures.len(),
                shown
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join("\n"),
                server.log_tail()
            );
        }
    }
    eprintln!(
        "crash test done: {} trials x {} sessions, seed {}: {} turns acknowledged, {} lost; \
         turns in flight at a kill: {} absent, {} partial, {} complete; {} sessions and {} \
         confirmations created under load, none lost; {} model requests; {:.1} s",
        settings.trials,
        settings.sessions,
        settings.seed,
        figures.acked,
        figures.lost,
        figures.in_flight_absent,
        figures.in_flight_partial,
        figures.in_flight_complete,
        figures.sessions_created,
        figures.confirmations,
        model.state.requests.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(figures.lost, 0);
}
