//! Crash consistency under load: the real `cadre serve` binary, many
//! concurrent sessions in tool-calling turns, `kill -9` at a random moment,
//! a restart on the same data dir, and a check of everything that was
//! acknowledged.
//!
//! One trial: the server runs over the data dir; every session sends turns
//! back to back (one at a time per session, all sessions at once) while a
//! side task creates sessions and pending confirmations
//! (`create_paper_order` on the pro plan) and a workflow task starts runs of
//! `crash-flow` (a calculator node, then a turn of the crash agent that
//! calls tools), every other one with `wait`; once a random number of turns has
//! been acknowledged and the first run started with `wait` was answered
//! (plus a random few milliseconds) the process is killed with SIGKILL. The next server starts on the same file (the database must
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
//!   confirmation is still listed by `GET /v1/confirmations`;
//! - every acknowledged workflow run (201) is found by
//!   `GET /v1/workflows/runs/{id}`, either succeeded with the node outputs
//!   and run output the strict model makes, or `interrupted` (no node left
//!   running, the cut nodes failed as interrupted, finished nodes with
//!   their outputs) — never `running` once the runs the restart resumed
//!   (`[sessions] resume_window_s`) are over, never missing; a run acknowledged
//!   finished (`wait`) or once seen finished never changes again; no run of
//!   the workflow, acknowledged or not, is left `running`; the sessions the
//!   agent nodes opened pass the session checks above (a turn its node saw
//!   succeed is complete with the node's answer), and the records of the
//!   runs' tool nodes and agent sessions count in the `GET /v1/stats` check.
//!
//! The server is the real binary started by `tests/support/server.rs`. The
//! model is `tests/support`'s mock, strict and without a script: it answers
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
//! Runs: `RUNS_PER_TRIAL` per trial, whatever the size, so the large run
//! stays under what `GET /v1/workflows/runs` lists (a check says so if not).

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::server::Server;
use support::{Client, MockModel, Reply};
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
/// Workflow runs the workflow task starts per trial.
const RUNS_PER_TRIAL: usize = 4;
/// `GET /v1/workflows/runs` returns at most this many runs.
const RUNS_LIMIT: usize = 1_000;

/// The workflow run beside the turns: a tool node, then a turn of the crash
/// agent (which the strict model answers with its two tool calls) whose
/// prompt reads the tool node's output. Every result follows from `n`.
const WORKFLOW: &str = "crash-flow";
const WORKFLOW_TOML: &str = r#"
name = "crash-flow"
description = "A calculator node, then an agent turn that calls tools."
output = { answer = "{{nodes.ask.output}}" }

[input]
type = "object"
required = ["n"]
additionalProperties = false

[input.properties.n]
type = "integer"
minimum = 1

[[nodes]]
id = "triple"
tool = "calculator"
params = { expression = "{{input.n}}*3" }

[[nodes]]
id = "ask"
agent = "crash"
prompt = "flow {{input.n}}: {{nodes.triple.output.formatted}}-1"
"#;

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

/// The mock model of `tests/support`, strict (see the module doc) and
/// answering every request from [`answer`].
async fn strict_model() -> MockModel {
    let model = MockModel::start().await;
    model.set_strict(true);
    // Counted, not kept: the large run sends millions of requests.
    model.set_keep_bodies(false);
    model.set_responder(answer);
    model
}

/// A user message gets a calculator call (on the expression after its last
/// `": "`) and an echo call; tool results get [`answer_for`] the user
/// message; anything else is refused.
fn answer(request: &Value, number: usize) -> Reply {
    let messages = request["messages"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let last = messages.last().unwrap_or(&Value::Null);
    match last["role"].as_str() {
        Some("user") => {
            let content = last["content"].as_str().unwrap_or_default();
            let expression = content
                .rsplit_once(": ")
                .map_or("1+1", |(_, expression)| expression);
            let (calculator, echo) = (format!("call_{number}_0"), format!("call_{number}_1"));
            Reply::tool_calls(&[
                (
                    &calculator,
                    "calculator",
                    &json!({"expression": expression}).to_string(),
                ),
                (&echo, "echo", &json!({"message": content}).to_string()),
            ])
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
            Reply::text(&answer_for(user, results))
        }
        other => Reply::refusal(&format!("unexpected last message role {other:?}")),
    }
}

fn answer_for(user: &str, results: usize) -> String {
    format!("answered '{user}' from {results} tool results")
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
            // The large run holds a connection per session from one address.
            ("CADRE_SERVER_MAX_CONNECTIONS", "16384"),
            ("CADRE_SERVER_MAX_CONNECTIONS_PER_ADDRESS", "16384"),
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
    /// The tool call ids of the reply; `None` where no reply carried them
    /// (the turn of a workflow's agent node).
    call_ids: Option<Vec<String>>,
}

impl AckedTurn {
    /// The turn a 200 reply to `content` acknowledged.
    fn of_reply(content: String, body: &Value) -> AckedTurn {
        let call_ids = body["tool_calls"]
            .as_array()
            .map(|calls| {
                calls
                    .iter()
                    .map(|c| c["id"].as_str().unwrap_or_default().to_owned())
                    .collect()
            })
            .unwrap_or_default();
        AckedTurn {
            content,
            answer: body["answer"].as_str().unwrap_or_default().to_owned(),
            call_ids: Some(call_ids),
        }
    }
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
    /// Its `Idempotency-Key`: after the restart the client retries it
    /// with the same key, and must get one turn and one answer.
    in_flight_key: Option<String>,
    /// Turns sent so far, over all trials (makes every content unique).
    turns_sent: u64,
    failures: Vec<String>,
}

/// Shared by the load tasks of one trial.
struct Load {
    client: Client,
    acked: AtomicUsize,
    progress: Notify,
    /// Set when the first run started with `wait` was answered, or when the
    /// workflow task stopped without one: the kill waits for it, so every
    /// trial has a run that finished before the kill (and mostly one that
    /// did not).
    first_run_over: AtomicBool,
    /// Set just before the kill: a request error after it is the kill's.
    killed: AtomicBool,
}

impl Load {
    fn failure_or_in_flight(&self, what: String) -> Option<String> {
        (!self.killed.load(Ordering::SeqCst)).then_some(what)
    }

    fn first_run_over(&self) {
        self.first_run_over.store(true, Ordering::SeqCst);
        self.progress.notify_waiters();
    }
}

/// Sends turns to one session until the server dies (or the bound).
async fn drive(load: Arc<Load>, mut book: Book) -> Book {
    for _ in 0..MAX_TURNS_PER_SESSION {
        book.turns_sent += 1;
        let n = book.turns_sent;
        let content = format!("s{} t{n}: {}+{n}", book.index, book.index);
        let key = format!("k-{}-{n}", book.id);
        let path = format!("/v1/sessions/{}/messages", book.id);
        let reply = support::client::try_send(
            load.client
                .request(reqwest::Method::POST, &path)
                .header("idempotency-key", &key)
                .json(&json!({ "content": content })),
        )
        .await;
        match reply {
            Ok((StatusCode::OK, body)) => {
                book.acked.push(AckedTurn::of_reply(content, &body));
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
                book.in_flight_key = Some(key);
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
                book.in_flight_key = Some(key);
                break;
            }
        }
    }
    book
}

/// What retrying the turns in flight at the kill found.
#[derive(Debug, Default)]
struct Retries {
    /// Retried with their key.
    sent: usize,
    /// The retry got the turn the restart had taken up (its record counts
    /// a resume).
    resumed: usize,
    /// The retry got a turn the restart had already finished or closed.
    found: usize,
    /// Nothing of the turn was stored: the retry ran it.
    fresh: usize,
}

/// Retries the turn in flight at the kill, with its key, as a client that
/// never got its answer would: the answer must come (from the turn the
/// restart resumed, or a fresh run if nothing of it was stored), and it
/// joins the acknowledged turns, so the checks then want it exactly once.
async fn retry_in_flight(
    client: &Client,
    mut book: Book,
    restarted_at: jiff::Timestamp,
) -> (Book, Retries) {
    let mut r = Retries::default();
    let (Some(content), Some(key)) = (book.in_flight.clone(), book.in_flight_key.take()) else {
        return (book, r);
    };
    r.sent = 1;
    let path = format!("/v1/sessions/{}/messages", book.id);
    let reply = support::client::try_send(
        client
            .request(reqwest::Method::POST, &path)
            .header("idempotency-key", &key)
            .json(&json!({ "content": content })),
    )
    .await;
    let body = match reply {
        Ok((StatusCode::OK, body)) => body,
        other => {
            book.failures.push(format!(
                "session {}: the retry of {content:?} with its key failed: {other:?}",
                book.id
            ));
            return (book, r);
        }
    };
    let turn_id = body["turn_id"].as_str().unwrap_or_default();
    match get(client, format!("/v1/sessions/{}/turns/{turn_id}", book.id)).await {
        Ok(record) if record["resumes"].as_u64().unwrap_or(0) > 0 => r.resumed = 1,
        Ok(record) if body["answer"].is_string() => {
            // Finished before the kill (its reply lost with it), or run now.
            let started: Option<jiff::Timestamp> =
                record["started_at"].as_str().and_then(|t| t.parse().ok());
            if started.is_some_and(|t| t < restarted_at) {
                r.found = 1
            } else {
                r.fresh = 1
            }
        }
        Ok(record) => book
            .failures
            .push(format!("session {}: turn record {record}", book.id)),
        Err(e) => book.failures.push(format!("session {}: {e}", book.id)),
    }
    book.acked.push(AckedTurn::of_reply(content, &body));
    book.in_flight = None;
    (book, r)
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
        let session = json!({"agent": "crash", "user_id": format!("side-{trial}-{k}")});
        let reply = load.client.try_post("/v1/sessions", &session).await;
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
        let order = json!({
            "plan": "pro",
            "user_id": format!("crash-{trial}-{k}"),
            "params": {"symbol": "AAPL", "side": "buy", "quantity": 1, "order_type": "market"},
        });
        let reply = load
            .client
            .try_post("/v1/tools/create_paper_order/invoke", &order)
            .await;
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

/// A workflow run the server acknowledged (201).
#[derive(Debug, Clone)]
struct AckedRun {
    id: String,
    n: u64,
    /// The run's results (see [`run_results`]) once it was seen finished:
    /// in the 201 of a run started with `wait`, or at a check after a
    /// restart. A finished run never changes again.
    finished: Option<Value>,
}

/// What the workflow task got acknowledged in one trial.
#[derive(Default)]
struct RunAcks {
    runs: Vec<AckedRun>,
    failures: Vec<String>,
}

/// Starts runs of [`WORKFLOW`] while the turns run, every other one with
/// `wait` (acknowledged finished) and the rest without (acknowledged
/// running).
async fn workflow_task(load: Arc<Load>, trial: usize, gaps_ms: Vec<u64>) -> RunAcks {
    let mut acks = RunAcks::default();
    for (k, gap) in gaps_ms.into_iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(gap)).await;
        let n = (trial * RUNS_PER_TRIAL + k + 1) as u64;
        let wait = k % 2 == 1;
        let path = format!("/v1/workflows/{WORKFLOW}/runs");
        let reply = load
            .client
            .try_post(&path, &json!({"input": {"n": n}, "wait": wait}))
            .await;
        match reply {
            Ok((StatusCode::CREATED, run)) => {
                let Some(id) = run["id"].as_str() else {
                    acks.failures.push(format!("no run id in {run}"));
                    break;
                };
                let finished = if wait {
                    load.first_run_over();
                    if let Err(e) = check_finished_run(&run, n) {
                        acks.failures
                            .push(format!("run {id} as its 201 answered: {e}"));
                    }
                    Some(run_results(&run))
                } else if run["status"] != "running" {
                    acks.failures
                        .push(format!("run {id} started as {}", run["status"]));
                    None
                } else {
                    None
                };
                acks.runs.push(AckedRun {
                    id: id.to_owned(),
                    n,
                    finished,
                });
            }
            Ok((status, body)) => {
                acks.failures
                    .extend(load.failure_or_in_flight(format!("start run {n}: {status} {body}")));
                break;
            }
            Err(e) => {
                acks.failures
                    .extend(load.failure_or_in_flight(format!("start run {n}: {e}")));
                break;
            }
        }
    }
    load.first_run_over();
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
    /// (turn, tool call id) pairs with more than one finished record.
    repeated_calls: usize,
    /// Turns whose record is not final after the retries.
    open_turns: usize,
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
        self.repeated_calls += other.repeated_calls;
        self.open_turns += other.open_turns;
    }
}

/// `GET path`: the body of a 200; anything else is an error that says so.
async fn get(client: &Client, path: String) -> Result<Value, String> {
    match client.try_get(&path).await {
        Ok((StatusCode::OK, body)) => Ok(body),
        Ok((status, body)) => Err(format!("GET {path}: HTTP {status}: {body}")),
        Err(e) => Err(format!("GET {path}: {e}")),
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
    // A turn the restart closed as interrupted (a workflow node's: its run
    // reruns the node) ends with the note, after an outcome for every call:
    // well formed, and not an answer.
    if let Some((last, before)) = turn.split_last()
        && role(last) == "assistant"
        && last["content"] == cadre::conversation::actor::INTERRUPTED_NOTE
    {
        return match turn_shape(before) {
            Ok(false) if before.len() == 1 || role(&before[before.len() - 1]) == "tool" => {
                Ok(false)
            }
            Ok(_) => fail("an interrupted turn's note follows an answer or an open call"),
            Err(e) => Err(e),
        };
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
async fn check_session(client: &Client, mut book: Book) -> (Book, Tally) {
    let mut tally = Tally::default();
    let result = check_session_inner(client, &book, &mut tally).await;
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
    client: &Client,
    book: &Book,
    tally: &mut Tally,
) -> Result<Vec<Value>, String> {
    let id = &book.id;
    // Every page of the history, oldest first.
    let mut history: Vec<Value> = Vec::new();
    let mut after = 0u64;
    loop {
        let body = get(client, format!("/v1/sessions/{id}/messages?after={after}")).await?;
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
        if let Some(ids) = &acked.call_ids
            && call_ids(&turn[1]) != *ids
        {
            return Err(format!(
                "turn {:?}: tool call ids {:?} differ from the reply's {ids:?}",
                acked.content,
                call_ids(&turn[1]),
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
        format!("/v1/calls?conversation_id={id}&limit={CALLS_LIMIT}"),
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
        // A turn closed at a restart (a workflow node's) gives each open
        // call a `TOOL_OUTCOME_UNKNOWN` result: the call may never have run,
        // so it has no record of its own.
        let stand_in = m["content"]
            .as_str()
            .is_some_and(|c| c.contains("\"error_type\":\"TOOL_OUTCOME_UNKNOWN\""));
        if !recorded.contains(call) && !stand_in {
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
    // A call whose record says it finished is never run again by a resume.
    let mut finished: HashMap<(String, String), usize> = HashMap::new();
    for r in &records {
        if r["error_type"] == "CONFIRMATION_REQUIRED" {
            continue;
        }
        if let (Some(turn), Some(call)) = (r["turn_id"].as_str(), r["tool_call_id"].as_str()) {
            *finished.entry((turn.into(), call.into())).or_default() += 1;
        }
    }
    let repeated: Vec<_> = finished.iter().filter(|(_, n)| **n > 1).collect();
    if !repeated.is_empty() {
        tally.repeated_calls += repeated.len();
        return Err(format!("finished calls ran again: {repeated:?}"));
    }
    // Every turn, the cut ones included, is final by now.
    let turns = get(client, format!("/v1/sessions/{id}/turns?limit=1000")).await?;
    let open: Vec<&Value> = turns["turns"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter(|t| {
                    !matches!(
                        t["phase"].as_str(),
                        Some("completed" | "failed" | "interrupted")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    if !open.is_empty() {
        tally.open_turns += open.len();
        return Err(format!("turns left open: {open:?}"));
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
    let summary = get(client, format!("/v1/sessions/{id}/summary")).await?;
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
    client: &Client,
    mut tally: BTreeMap<String, (u64, u64)>,
) -> Result<(), String> {
    // Direct calls (the confirmations) have no conversation.
    let body = get(
        client,
        format!("/v1/calls?tool=create_paper_order&limit={CALLS_LIMIT}"),
    )
    .await?;
    let direct = body["calls"].as_array().cloned().unwrap_or_default();
    if direct.len() >= CALLS_LIMIT {
        return Err("too many direct records to list".into());
    }
    // A held call (`pending_approval`) or a declined one did not run: the
    // counters leave it out until its decision rewrites its record.
    let ran = |r: &&Value| r["status"] == "succeeded" || r["status"] == "failed";
    let e = tally.entry("create_paper_order".into()).or_default();
    e.0 += direct.iter().filter(ran).count() as u64;
    e.1 += direct.iter().filter(|r| r["is_success"] == true).count() as u64;
    let stats = get(client, "/v1/stats".to_owned()).await?;
    let total: u64 = tally.values().map(|(t, _)| t).sum();
    let ok: u64 = tally.values().map(|(_, s)| s).sum();
    if stats["total_calls"] != total || stats["successful_calls"] != ok {
        return Err(format!(
            "stats {} total / {} successful, records {total} / {ok}",
            stats["total_calls"], stats["successful_calls"]
        ));
    }
    for (tool, (t, s)) in &tally {
        // A tool never called before the kill has no counters at all.
        let counters = &stats["tools"][tool];
        let count = |field: &str| counters[field].as_u64().unwrap_or(0);
        if count("total_calls") != *t || count("successful_calls") != *s {
            return Err(format!(
                "stats for {tool}: {counters}, records {t} total / {s} successful"
            ));
        }
    }
    Ok(())
}

/// The prompt of run `n`'s agent node, as the workflow renders it.
fn agent_prompt(n: u64) -> String {
    format!("flow {n}: {}-1", 3 * n)
}

/// Whether a succeeded node's output is the one the strict model makes.
fn node_output_ok(node: &str, output: &Value, n: u64) -> bool {
    match node {
        "triple" => output["result"].as_f64() == Some((3 * n) as f64),
        "ask" => *output == answer_for(&agent_prompt(n), 2).as_str(),
        _ => false,
    }
}

/// What a finished run is judged by: its status, output and error, and
/// each node's status, output and error.
fn run_results(run: &Value) -> Value {
    let nodes: serde_json::Map<String, Value> = run["nodes"]
        .as_object()
        .map(|nodes| {
            nodes
                .iter()
                .map(|(id, n)| {
                    let node =
                        json!({"status": n["status"], "output": n["output"], "error": n["error"]});
                    (id.clone(), node)
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "status": run["status"],
        "output": run["output"],
        "error": run["error"],
        "nodes": nodes,
    })
}

/// A finished run: succeeded (nothing in this workflow fails), every node
/// with the output the strict model makes, the run's output rendered.
fn check_finished_run(run: &Value, n: u64) -> Result<(), String> {
    if run["status"] != "succeeded" {
        return Err(format!(
            "{}, nothing in this workflow fails: {}",
            run["status"],
            run_results(run)
        ));
    }
    for id in ["triple", "ask"] {
        let node = &run["nodes"][id];
        if node["status"] != "succeeded" || !node_output_ok(id, &node["output"], n) {
            return Err(format!("node {id} of a succeeded run: {node}"));
        }
    }
    let answer = answer_for(&agent_prompt(n), 2);
    if run["output"] != json!({ "answer": answer }) {
        return Err(format!("output {} is not the answer's", run["output"]));
    }
    Ok(())
}

/// An interrupted run: no node left running, the nodes the kill cut are
/// failed as interrupted, the ones that finished kept their outputs.
fn check_interrupted_run(run: &Value, n: u64) -> Result<(), String> {
    let nodes = run["nodes"]
        .as_object()
        .ok_or_else(|| format!("no nodes: {run}"))?;
    for (id, node) in nodes {
        let interrupted = node["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("interrupted"));
        let ok = match node["status"].as_str().unwrap_or_default() {
            "pending" => true,
            "succeeded" => node_output_ok(id, &node["output"], n),
            "failed" => interrupted,
            _ => false,
        };
        if !ok {
            return Err(format!("node {id} of an interrupted run: {node}"));
        }
    }
    Ok(())
}

/// One acknowledged run after a restart: found, finished (succeeded) or
/// interrupted, and unchanged since it was first seen finished. Returns
/// its status.
async fn check_run(client: &Client, run: &mut AckedRun) -> Result<String, String> {
    let body = get(client, format!("/v1/workflows/runs/{}", run.id))
        .await
        .map_err(|e| format!("acknowledged run lost: {e}"))?;
    let status = body["status"].as_str().unwrap_or_default().to_owned();
    match status.as_str() {
        "succeeded" => check_finished_run(&body, run.n)?,
        "interrupted" => check_interrupted_run(&body, run.n)?,
        "running" => return Err("left running after the restart".into()),
        _ => return Err(format!("{status}: {}", run_results(&body))),
    }
    let results = run_results(&body);
    match &run.finished {
        Some(seen) if *seen != results => {
            return Err(format!(
                "changed after it was seen finished: was {seen}, now {results}"
            ));
        }
        Some(_) => {}
        None => run.finished = Some(results),
    }
    Ok(status)
}

/// Waits until no run of the workflow is `running`: the runs the kill cut
/// are resumed at start (within `[sessions] resume_window_s`) and finish by
/// themselves; the checks read them once they are over.
async fn runs_resumed_at_start_end(client: &Client) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let body = get(
            client,
            format!("/v1/workflows/runs?workflow={WORKFLOW}&limit={RUNS_LIMIT}"),
        )
        .await?;
        let running = body["runs"].as_array().map_or(0, |runs| {
            runs.iter().filter(|r| r["status"] == "running").count()
        });
        if running == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{running} runs still running 60 s after the restart"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How the acknowledged runs stood at one check.
#[derive(Debug, Default)]
struct RunTally {
    succeeded: usize,
    interrupted: usize,
    /// Runs of the workflow (acknowledged or not) a restart resumed.
    resumed: usize,
}

/// After a restart: every acknowledged run ([`check_run`]); every run of
/// the workflow, acknowledged or not, is over (none left `running`) and
/// its call records (`?workflow_id=`: its tool node's and its agent
/// sessions') count in `tally`; the sessions its agent nodes opened are
/// checked like the load's (a turn the node saw succeed is complete, with
/// the node's answer; any other is at most a prefix of a turn), and a
/// record of a run that names a session names one of those.
async fn check_workflows(
    client: &Client,
    acked: &mut [AckedRun],
    flow_books: &mut HashMap<String, Book>,
    tally: &mut Tally,
) -> (RunTally, Vec<String>) {
    let mut failures = Vec::new();
    let mut runs = RunTally::default();
    let checked: Vec<(usize, Result<String, String>)> =
        futures::stream::iter(acked.iter_mut().enumerate())
            .map(|(i, run)| async move { (i, check_run(client, run).await) })
            .buffered(CHECK_PARALLELISM)
            .collect()
            .await;
    for (i, result) in checked {
        match result {
            Ok(status) if status == "succeeded" => runs.succeeded += 1,
            Ok(_) => runs.interrupted += 1,
            Err(e) => failures.push(format!("run {} (n = {}): {e}", acked[i].id, acked[i].n)),
        }
    }

    let listed = match get(
        client,
        format!("/v1/workflows/runs?workflow={WORKFLOW}&limit={RUNS_LIMIT}"),
    )
    .await
    {
        Ok(body) => body["runs"].as_array().cloned().unwrap_or_default(),
        Err(e) => {
            failures.push(e);
            return (runs, failures);
        }
    };
    if listed.len() >= RUNS_LIMIT {
        failures.push(format!(
            "{} runs: more than GET /v1/workflows/runs can list; use fewer trials",
            listed.len()
        ));
        return (runs, failures);
    }
    let by_id: HashMap<&str, &Value> = listed
        .iter()
        .filter_map(|r| Some((r["id"].as_str()?, r)))
        .collect();
    runs.resumed = listed
        .iter()
        .filter(|r| r["automatic_resumes"].as_u64().is_some_and(|n| n > 0))
        .count();
    for run in &listed {
        if run["status"] == "running" {
            failures.push(format!("run {} left running after the restart", run["id"]));
        }
    }
    let listed_records: Vec<Result<Vec<Value>, String>> = futures::stream::iter(by_id.keys())
        .map(|id| async move {
            let body = get(
                client,
                format!("/v1/calls?workflow_id={id}&limit={CALLS_LIMIT}"),
            )
            .await?;
            let records = body["calls"].as_array().cloned().unwrap_or_default();
            if records.len() >= CALLS_LIMIT {
                return Err(format!("run {id}: more records than GET /v1/calls lists"));
            }
            Ok::<_, String>(records)
        })
        .buffered(CHECK_PARALLELISM)
        .collect()
        .await;
    let mut records = Vec::new();
    for result in listed_records {
        match result {
            Ok(mut listed) => records.append(&mut listed),
            Err(e) => failures.push(e),
        }
    }
    for r in &records {
        let e = tally
            .per_tool
            .entry(r["tool_name"].as_str().unwrap_or_default().to_owned())
            .or_default();
        e.0 += 1;
        e.1 += u64::from(r["is_success"] == true);
    }

    // The agent nodes' sessions, known by their metadata (every page: the
    // large run holds thousands of sessions).
    let mut sessions = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/sessions?limit=1000&cursor={c}"),
            None => "/v1/sessions?limit=1000".to_owned(),
        };
        match get(client, path).await {
            Ok(body) => {
                sessions.extend(body["sessions"].as_array().cloned().unwrap_or_default());
                match body["next"].as_str() {
                    Some(next) => cursor = Some(next.to_owned()),
                    None => break,
                }
            }
            Err(e) => {
                failures.push(e);
                return (runs, failures);
            }
        }
    }
    for session in &sessions {
        let (Some(id), Some(run_id)) = (
            session["id"].as_str(),
            session["metadata"]["workflow_id"].as_str(),
        ) else {
            continue;
        };
        if flow_books.contains_key(id) {
            continue;
        }
        let Some(run) = by_id.get(run_id) else {
            failures.push(format!("session {id} belongs to an unknown run {run_id}"));
            continue;
        };
        let Some(n) = run["input"]["n"].as_u64() else {
            failures.push(format!("run {run_id} has no input n: {}", run["input"]));
            continue;
        };
        let ask = &run["nodes"]["ask"];
        let mut book = Book {
            id: id.to_owned(),
            verified_digest: digest(&[]),
            ..Book::default()
        };
        if ask["status"] == "succeeded" && ask["session_id"] == id {
            book.acked.push(AckedTurn {
                content: agent_prompt(n),
                answer: ask["output"].as_str().unwrap_or_default().to_owned(),
                call_ids: None,
            });
        } else {
            book.in_flight = Some(agent_prompt(n));
        }
        flow_books.insert(id.to_owned(), book);
    }
    let checked: Vec<(Book, Tally)> = futures::stream::iter(flow_books.drain().map(|(_, b)| b))
        .map(|book| check_session(client, book))
        .buffered(CHECK_PARALLELISM)
        .collect()
        .await;
    for (mut book, t) in checked {
        failures.append(&mut book.failures);
        // The records counted above already; the in-flight figures are the
        // load's.
        tally.lost += t.lost;
        flow_books.insert(book.id.clone(), book);
    }
    for r in &records {
        if let Some(session) = r["conversation_id"].as_str()
            && !flow_books.contains_key(session)
        {
            failures.push(format!(
                "record {} of run {} names session {session}, which no agent node opened",
                r["record_id"], r["workflow_id"]
            ));
        }
    }
    (runs, failures)
}

// ---------------------------------------------------------------------------
// The test
// ---------------------------------------------------------------------------

#[derive(Debug, Default)]
struct Figures {
    acked: usize,
    retried: usize,
    resumed: usize,
    found: usize,
    fresh: usize,
    repeated_calls: usize,
    open_turns: usize,
    in_flight_absent: usize,
    in_flight_partial: usize,
    in_flight_complete: usize,
    lost: usize,
    sessions_created: usize,
    confirmations: usize,
    runs_acked: usize,
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
    let model = strict_model().await;
    let data = tempfile::tempdir().expect("data dir");
    let agents = tempfile::tempdir().expect("agents dir");
    std::fs::write(
        agents.path().join("crash.toml"),
        "name = \"crash\"\nsystem_prompt = \"You are a test agent.\"\n\
         tools = [\"calculator\", \"echo\"]\nmax_iterations = 3\n",
    )
    .expect("agent file");
    std::fs::create_dir(agents.path().join("workflows")).expect("workflows dir");
    std::fs::write(
        agents.path().join("workflows").join("crash-flow.toml"),
        WORKFLOW_TOML,
    )
    .expect("workflow file");
    let launch = Launch {
        // The server's log goes next to the data dir, inside the temp dir.
        data_dir: data.path().join("data"),
        agents_dir: agents.path().to_path_buf(),
        model_url: model.base_url(),
    };
    let mut server = start_server(&launch).await;
    let mut client = server.client().with_timeout(REQUEST_TIMEOUT);
    let mut books: Vec<Book> = futures::stream::iter(0..settings.sessions)
        .map(|index| {
            let client = client.clone();
            async move {
                let (status, body) = client
                    .try_post("/v1/sessions", &json!({"agent": "crash"}))
                    .await
                    .expect("create a session");
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
    let mut runs_acked: Vec<AckedRun> = Vec::new();
    let mut flow_books: HashMap<String, Book> = HashMap::new();
    for trial in 0..settings.trials {
        let target = rng.random_range(1..=settings.sessions * 3);
        let extra = Duration::from_millis(rng.random_range(0..=15));
        let gaps: Vec<u64> = (0..SIDE_OPS_PER_TRIAL)
            .map(|_| rng.random_range(0..=20))
            .collect();
        let run_gaps: Vec<u64> = (0..RUNS_PER_TRIAL)
            .map(|_| rng.random_range(0..=10))
            .collect();
        let load = Arc::new(Load {
            client: client.clone(),
            acked: AtomicUsize::new(0),
            progress: Notify::new(),
            first_run_over: AtomicBool::new(false),
            killed: AtomicBool::new(false),
        });
        let side = tokio::spawn(side_task(load.clone(), trial, gaps));
        let flows = tokio::spawn(workflow_task(load.clone(), trial, run_gaps));
        let drivers: Vec<_> = books
            .drain(..)
            .map(|book| tokio::spawn(drive(load.clone(), book)))
            .collect();
        let reached = tokio::time::timeout(STALL_GUARD, async {
            loop {
                let notified = load.progress.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if load.acked.load(Ordering::SeqCst) >= target
                    && load.first_run_over.load(Ordering::SeqCst)
                {
                    return;
                }
                notified.await;
            }
        })
        .await;
        if reached.is_err() {
            panic!(
                "trial {trial}: the load stalled at {} of {target} acknowledged turns (a \
                 waited run answered: {}); server log:\n{}",
                load.acked.load(Ordering::SeqCst),
                load.first_run_over.load(Ordering::SeqCst),
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
        let flows = flows.await.expect("the workflow task panicked");
        let acked_now: usize = books.iter().map(|b| b.acked.len()).sum();
        figures.acked += acked_now;
        figures.sessions_created += side.sessions.len();
        figures.confirmations += side.confirmations.len();
        sessions_acked.extend(side.sessions);
        confirmations_acked.extend(side.confirmations);
        let runs_acked_now = flows.runs.len();
        figures.runs_acked += runs_acked_now;
        runs_acked.extend(flows.runs);

        // Restart on the same data dir, retry what was in flight with its
        // key, and check everything acknowledged.
        let restarted_at = jiff::Timestamp::now();
        server = start_server(&launch).await;
        client = server.client().with_timeout(REQUEST_TIMEOUT);
        let mut failures: Vec<String> = side.failures;
        failures.extend(flows.failures);
        let retried: Vec<(Book, Retries)> = futures::stream::iter(books.drain(..))
            .map(|book| retry_in_flight(&client, book, restarted_at))
            .buffered(CHECK_PARALLELISM)
            .collect()
            .await;
        let mut retries = Retries::default();
        for (book, r) in retried {
            retries.sent += r.sent;
            retries.resumed += r.resumed;
            retries.found += r.found;
            retries.fresh += r.fresh;
            books.push(book);
        }
        figures.retried += retries.sent;
        figures.resumed += retries.resumed;
        figures.found += retries.found;
        figures.fresh += retries.fresh;
        if let Err(e) = runs_resumed_at_start_end(&client).await {
            failures.push(e);
        }
        let checked: Vec<(Book, Tally)> = futures::stream::iter(books.drain(..))
            .map(|book| check_session(&client, book))
            .buffered(CHECK_PARALLELISM)
            .collect()
            .await;
        let mut tally = Tally::default();
        for (mut book, t) in checked {
            failures.append(&mut book.failures);
            tally.add(t);
            books.push(book);
        }
        let (runs, mut run_failures) =
            check_workflows(&client, &mut runs_acked, &mut flow_books, &mut tally).await;
        failures.append(&mut run_failures);
        figures.in_flight_absent += tally.in_flight_absent;
        figures.in_flight_partial += tally.in_flight_partial;
        figures.in_flight_complete += tally.in_flight_complete;
        figures.lost += tally.lost;
        figures.repeated_calls += tally.repeated_calls;
        figures.open_turns += tally.open_turns;
        if let Err(e) = check_stats(&client, tally.per_tool).await {
            failures.push(format!("counters: {e}"));
        }
        // Every page: the large run acknowledges hundreds.
        let mut pending: HashSet<String> = HashSet::new();
        let mut cursor: Option<String> = None;
        loop {
            let path = match &cursor {
                Some(c) => format!("/v1/confirmations?limit=1000&cursor={c}"),
                None => "/v1/confirmations?limit=1000".to_owned(),
            };
            match get(&client, path).await {
                Ok(body) => {
                    pending.extend(
                        body["confirmations"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|c| c["confirmation_id"].as_str())
                            .map(str::to_owned),
                    );
                    match body["next"].as_str() {
                        Some(next) => cursor = Some(next.to_owned()),
                        None => break,
                    }
                }
                Err(e) => {
                    failures.push(e);
                    break;
                }
            }
        }
        for id in &confirmations_acked {
            if !pending.contains(id) {
                failures.push(format!("pending confirmation {id} lost"));
            }
        }
        for id in &sessions_acked {
            if let Err(e) = get(&client, format!("/v1/sessions/{id}")).await {
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
             {} in flight retried with their keys: {} resumed by the restart, {} found \
             finished, {} run fresh; turns left open {}, finished calls run twice {}; lost {}; \
             {runs_acked_now} runs acknowledged, of all {}: {} succeeded, {} interrupted; \
             {} runs resumed by the restarts so far",
            retries.sent,
            retries.resumed,
            retries.found,
            retries.fresh,
            tally.open_turns,
            tally.repeated_calls,
            tally.lost,
            runs_acked.len(),
            runs.succeeded,
            runs.interrupted,
            runs.resumed
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
         turns in flight at a kill retried with their keys: {} ({} resumed by the restart, {} \
         found finished, {} run fresh); turns left open: {}; finished calls run twice: {}; {} sessions, {} \
         confirmations and {} workflow runs acknowledged under load, none lost; {} model \
         requests; {:.1} s",
        settings.trials,
        settings.sessions,
        settings.seed,
        figures.acked,
        figures.lost,
        figures.retried,
        figures.resumed,
        figures.found,
        figures.fresh,
        figures.open_turns,
        figures.repeated_calls,
        figures.sessions_created,
        figures.confirmations,
        figures.runs_acked,
        model.request_count(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(figures.lost, 0);
    assert_eq!(figures.repeated_calls, 0);
    assert_eq!(figures.open_turns, 0);
}
