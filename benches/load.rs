//! Load benchmark: what cadre adds to a tool-calling turn, at scale, over its
//! real HTTP API, with every piece in this one process.
//!
//! bench client (reqwest; N session loops) ──HTTP──▶ cadre (Runtime::builder, redb, actors)
//!        ▲                                              │ model calls (async-openai)
//!        │ mock time per session (shared memory)        ▼
//!        └──────────────────────────────────── mock model (axum; 0 or 50 ms per call)
//!
//! The client and the mock model are the tests' (`tests/support/client.rs`,
//! `tests/support/mock_model.rs`), included by path.
//!
//! Every turn is the same: the user asks, the model asks for one
//! `calculator` call, the executor runs it, the model answers (plus, once a
//! session's history outgrows its window, cadre's rolling-summary request
//! after the turn). Each user message names its session (`[s:ID]`); the mock
//! times every request it serves (parse, the fixed delay, reply built) and
//! charges it to that session, and the client takes the session's total when
//! the turn returns. So `overhead = wall time seen by the client − mock
//! time`: HTTP both ways, actors, executor, JSON and the redb commits (one
//! of them durable).
//!
//! Phases, in order, on one cadre runtime with durable writes as shipped:
//! 1. admission: the executor's admission path (governor check, schema
//!    validation, a pool slot) on the components, timed in a loop; and the
//!    loopback floor: a turn-sized model request posted straight to the
//!    mock, one at a time (what one model call costs before cadre adds
//!    anything).
//! 2. idle: 10,000 sessions created and given one turn each (256 at a
//!    time), the client dropped, then VmRSS read: RSS per idle session is
//!    `(RSS after − RSS before) / sessions`.
//! 3. disk probe in the data dir: 200 × (append 512 B, `sync_all`), 200 ×
//!    (overwrite 4 KiB, `sync_data`), 200 one-message durable `Store::write`s
//!    to a redb file of their own.
//! 4. load: for the zero-latency mock, then the 50 ms mock, and for N in
//!    1, 100, 1,000, 10,000: N fresh sessions, one warm-up turn each (not
//!    measured; it opens the connections), then all N loop K turns back to
//!    back (a closed loop; with the 50 ms mock the session starts are spread
//!    over one turn's model time, 100 ms, so they do not run in lock-step).
//!    Turns/s and tool calls/s are successful turns and calls over the
//!    phase's wall time. Beside them: cadre's CPU per turn, its context
//!    switches, what other processes took, the data disk's counters and
//!    cadre's own `/metrics` (commits per turn, model call time).
//! 5. the disk probe again, then cadre is stopped and the redb file's size
//!    divided by the messages it holds (counted by reopening the store).
//!
//! `cargo bench --bench load` runs it all and writes
//! `target/bench-report.json` (every figure as `{value, unit, n}`) and
//! tables on stdout. `CADRE_BENCH_QUICK=1` is a smoke run (N = 1, 10, 100,
//! 500 idle sessions, fewer turns); `CADRE_BENCH_SESSIONS=1,100`,
//! `CADRE_BENCH_IDLE=2000` and `CADRE_BENCH_DELAYS_MS=0` choose what runs;
//! `CADRE_BENCH_GUARDRAILS=1` gives the agent a typical guardrail set (four
//! checks at three stages, none tripping), `CADRE_BENCH_DIR` the data dir (default: under `target/tmp`),
//! `CADRE_BENCH_CACHE_MB` redb's page cache (`[store] cache_mb`). Only
//! loopback is used; the run stops by itself.
//!
//! Decisions:
//! - **HTTP/1.1 with a connection per in-flight request**, as independent
//!   clients would be: 10,000 in-flight turns hold about 40,000 sockets in
//!   this process (both ends of client↔cadre and cadre↔mock), so the
//!   benchmark raises `RLIMIT_NOFILE`; where it cannot, it caps the requests
//!   in flight and says so in the report (`in_flight_cap`).
//! - **Server settings for load**: the HTTP API's per-caller rate limit is
//!   lifted (every request comes from 127.0.0.1) and the executor's queue
//!   is deep enough for every session, so no turn is refused by admission
//!   control; everything else is `cadre serve`'s default (2 workers here).
//! - **A closed loop saturates**: with a zero-latency model every session
//!   always has a turn in flight, so latency is N / throughput (Little's
//!   law) once N exceeds what the cores overlap. The 50 ms mock shows the
//!   overlap a real model leaves.
//! - **The machine may be shared**: every phase reports the CPU that other
//!   processes took (`others`); figures taken beside a busy machine are not
//!   cadre's.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cadre::Runtime;
use cadre::executor::concurrency::{AdmissionRequest, ConcurrencyConfig, ConcurrencyController};
use cadre::executor::limits::RateLimiter;
use cadre::model::ChatMessage;
use cadre::model::ModelEndpoint;
use cadre::model::openai::ClientOptions;
use cadre::server_config::ServerConfig;
use cadre::store::{Store, StoredMessage, WriteOp};
use cadre::tools::RateLimit;
use cadre::tools::validate::ParamValidator;
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

// The tests' HTTP client and mock model, shared with the bench.
#[path = "../tests/support/client.rs"]
mod client;
#[path = "../tests/support/mock_model.rs"]
mod mock_model;

use client::Client;
use mock_model::{MockModel, Reply};

const AGENT_FILE: &str = r#"
name = "bench"
description = "The load benchmark's agent: one calculator call per turn."
system_prompt = """
You are a helpful assistant. Use the calculator for any arithmetic instead of
computing in your head, and report its result. Keep answers short."""
tools = ["echo", "calculator"]
max_iterations = 3
history_window = 20
"#;
/// `CADRE_BENCH_GUARDRAILS=1` adds these to the agent (issue #39: the CPU
/// a typical set adds per turn): the message and the answer checked for
/// card numbers (redacted) and denied topics, the tool's output for a
/// field to hide. None of them trips on the bench's turns: the cost
/// measured is the checks'.
const GUARDRAILS: &str = r#"
[[guardrails]]
name = "cards-in"
stage = "input"
kind = "regex"
pattern = '\b\d(?:[ -]?\d){12,15}\b'
action = "redact"

[[guardrails]]
name = "topics"
stage = "input"
kind = "deny_topics"
topics = ["payday loan", "crypto", "medical advice", "lawsuit"]

[[guardrails]]
name = "cards-out"
stage = "output"
kind = "regex"
pattern = '\b\d(?:[ -]?\d){12,15}\b'
action = "redact"

[[guardrails]]
name = "hide"
stage = "tool_output"
kind = "drop_fields"
fields = ["internal.trace"]
"#;
const QUESTION: &str = "what is (2+3)*4?";
const EXPRESSION: &str = "(2+3)*4";
const ANSWER: &str = "(2+3)*4 = 20";
const SUMMARY: &str = "The user asks arithmetic questions; the calculator answers them.";
const FSYNC_SAMPLES: usize = 200;
/// Sockets one in-flight turn holds in this process.
const FDS_PER_SESSION: u64 = 4;
/// Sessions created, or given their idle-phase turn, at once.
const SETUP_CONCURRENCY: usize = 256;

// ---------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------

struct Settings {
    quick: bool,
    sessions: Vec<usize>,
    idle_sessions: usize,
    delays: Vec<Duration>,
    data_root: PathBuf,
    report: PathBuf,
}

impl Settings {
    fn from_env() -> Settings {
        let quick = env_flag("CADRE_BENCH_QUICK");
        let list = |var: &str| -> Option<Vec<usize>> {
            let raw = std::env::var(var).ok()?;
            let parsed: Vec<usize> = raw
                .split(',')
                .filter_map(|s| s.trim().replace('_', "").parse().ok())
                .collect();
            (!parsed.is_empty()).then_some(parsed)
        };
        let positive = |v: Vec<usize>| -> Option<Vec<usize>> {
            let v: Vec<usize> = v.into_iter().filter(|n| *n > 0).collect();
            (!v.is_empty()).then_some(v)
        };
        let sessions = list("CADRE_BENCH_SESSIONS")
            .and_then(positive)
            .unwrap_or_else(|| {
                if quick {
                    vec![1, 10, 100]
                } else {
                    vec![1, 100, 1_000, 10_000]
                }
            });
        let idle_sessions = list("CADRE_BENCH_IDLE")
            .and_then(positive)
            .map(|v| v[0])
            .unwrap_or(if quick { 500 } else { 10_000 });
        let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("target"));
        let data_root = std::env::var_os("CADRE_BENCH_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
        Settings {
            quick,
            sessions,
            idle_sessions,
            delays: list("CADRE_BENCH_DELAYS_MS")
                .map(|v| {
                    v.into_iter()
                        .map(|ms| Duration::from_millis(ms as u64))
                        .collect()
                })
                .unwrap_or_else(|| vec![Duration::ZERO, Duration::from_millis(50)]),
            data_root,
            report: target.join("bench-report.json"),
        }
    }

    /// Turns each session runs in a measured phase: about a fixed number of
    /// turns per phase, at least 2 per session, fewer with the slow mock.
    fn turns_per_session(&self, n: usize, delay: Duration) -> usize {
        let (budget, most) = match (self.quick, delay.is_zero()) {
            (false, true) => (6_000, 400),
            (false, false) => (2_000, 40),
            (true, true) => (300, 50),
            (true, false) => (30, 5),
        };
        (budget / n).clamp(2, most)
    }
}

fn env_flag(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false" | "no"))
}

// ---------------------------------------------------------------------------
// The mock model
// ---------------------------------------------------------------------------

/// A turn's user message: it names its session, so the mock can charge its
/// time (and that of the summary requests quoting it) to the session.
fn tagged(session: &str, turn: &str) -> String {
    format!("[s:{session}] {turn}: {QUESTION}")
}

/// The session a request is about: the first `[s:ID]` in its user messages.
fn session_of(messages: &[Value]) -> String {
    messages
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str())
        .find_map(|text| {
            let start = text.find("[s:")? + 3;
            let len = text[start..].find(']')?;
            Some(text[start..start + len].to_owned())
        })
        .unwrap_or_default()
}

fn messages_of(request: &Value) -> &[Value] {
    request["messages"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
}

/// A request for a rolling summary: no tools offered.
fn is_summary(request: &Value) -> bool {
    request["tools"].as_array().is_none_or(Vec::is_empty)
}

/// Every turn's model calls: one calculator call, then the answer once the
/// tool result is in (or tools are refused); a summary request gets a
/// one-line summary.
fn turn_reply(request: &Value, number: usize) -> Reply {
    let summary = is_summary(request);
    let answer_now = summary
        || messages_of(request)
            .last()
            .is_some_and(|m| m["role"] == "tool")
        || request["tool_choice"] == "none";
    if answer_now {
        Reply::text(if summary { SUMMARY } else { ANSWER })
    } else {
        let arguments = json!({ "expression": EXPRESSION }).to_string();
        Reply::tool_call(&format!("call_{number}"), "calculator", &arguments)
    }
}

/// What the bench counts beside the mock's own request count.
#[derive(Default)]
struct MockAccounts {
    /// Requests for a rolling summary (no tools offered).
    summaries: AtomicU64,
    /// Nanoseconds spent serving all requests.
    spent_total_ns: AtomicU64,
    /// Nanoseconds the mock spent per session since the client last took
    /// them, keyed by the session id the messages carry (see [`tagged`]).
    spent: Mutex<HashMap<String, u64>>,
}

/// The mock model of `tests/support` answering every request with
/// [`turn_reply`], with no script, after the latency the phase sets. It
/// times every request it serves (parse, the fixed delay, reply built) and
/// the bench charges that to the session the request names.
#[derive(Clone)]
struct Mock {
    model: MockModel,
    accounts: Arc<MockAccounts>,
}

impl Mock {
    fn start(rt: &tokio::runtime::Runtime) -> Mock {
        let model = rt.block_on(MockModel::start());
        // Counted, not kept: the load sends millions of requests.
        model.set_keep_bodies(false);
        let accounts = Arc::new(MockAccounts::default());
        let counted = accounts.clone();
        model.set_responder(move |request, number| {
            if is_summary(request) {
                counted.summaries.fetch_add(1, Ordering::Relaxed);
            }
            turn_reply(request, number)
        });
        let charged = accounts.clone();
        model.set_observer(move |request, spent| {
            let spent = spent.as_nanos() as u64;
            charged.spent_total_ns.fetch_add(spent, Ordering::Relaxed);
            *charged
                .spent
                .lock()
                .expect("mock lock")
                .entry(session_of(messages_of(request)))
                .or_default() += spent;
        });
        Mock { model, accounts }
    }

    fn base_url(&self) -> String {
        self.model.base_url()
    }

    fn set_delay(&self, delay: Duration) {
        self.model.set_latency(delay);
    }

    /// The mock's time for this session since the last call.
    fn take(&self, session: &str) -> Duration {
        let ns = self
            .accounts
            .spent
            .lock()
            .expect("mock lock")
            .remove(session)
            .unwrap_or(0);
        Duration::from_nanos(ns)
    }

    /// (requests, summary requests, ns spent) so far.
    fn counts(&self) -> (u64, u64, u64) {
        (
            self.model.request_count() as u64,
            self.accounts.summaries.load(Ordering::Relaxed),
            self.accounts.spent_total_ns.load(Ordering::Relaxed),
        )
    }
}

// ---------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------

/// The bench's calls to cadre, through the tests' client; every failure is
/// counted, not fatal.
#[derive(Clone)]
struct Api {
    client: Client,
}

impl Api {
    fn new(addr: SocketAddr) -> Api {
        Api {
            client: Client::new(&format!("http://{addr}")).with_timeout(Duration::from_secs(300)),
        }
    }

    async fn create_session(&self) -> Result<String, String> {
        let (status, body) = self
            .client
            .try_post("/v1/sessions", &json!({"agent": "bench"}))
            .await
            .map_err(|e| format!("create session: {e}"))?;
        match body["id"].as_str() {
            Some(id) if status == StatusCode::CREATED => Ok(id.to_owned()),
            _ => Err(format!("create session: HTTP {status}: {body}")),
        }
    }

    /// cadre's own series from `GET /metrics` (unlabelled ones), by name.
    async fn metrics(&self) -> HashMap<String, f64> {
        let Ok((_, body)) = self.client.try_get("/metrics").await else {
            return HashMap::new();
        };
        body.as_str()
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.starts_with('#') && !l.contains('{'))
            .filter_map(|l| {
                let (name, value) = l.split_once(' ')?;
                Some((name.to_owned(), value.trim().parse().ok()?))
            })
            .collect()
    }

    /// One turn; Ok(true) when the tool call succeeded and the answer came.
    async fn turn(&self, id: &str, content: &str) -> Result<bool, String> {
        let (status, body) = self
            .client
            .try_post(
                &format!("/v1/sessions/{id}/messages"),
                &json!({ "content": content }),
            )
            .await
            .map_err(|e| format!("turn: {e}"))?;
        if status != StatusCode::OK {
            return Err(format!("turn: HTTP {status}: {body}"));
        }
        if body["answer"] != ANSWER {
            return Err(format!("turn: unexpected answer: {body}"));
        }
        Ok(body["tool_calls"][0]["is_success"] == true)
    }
}

/// Creates `n` sessions, `SETUP_CONCURRENCY` at a time.
async fn create_sessions(api: &Api, n: usize) -> Vec<String> {
    futures::stream::iter(0..n)
        .map(|_| {
            let api = api.clone();
            async move { api.create_session().await }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
        .collect()
        .await
}

#[derive(Default)]
struct LoopOutcome {
    /// (wall, mock) per successful turn.
    samples: Vec<(Duration, Duration)>,
    tool_ok: u64,
    errors: u64,
    first_error: Option<String>,
}

impl LoopOutcome {
    fn merge(&mut self, other: LoopOutcome) {
        self.samples.extend(other.samples);
        self.tool_ok += other.tool_ok;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// One session's turns, back to back.
async fn session_loop(
    api: Api,
    mock: Mock,
    id: String,
    tag: String,
    turns: usize,
    start_after: Duration,
    cap: Option<Arc<Semaphore>>,
) -> LoopOutcome {
    let mut out = LoopOutcome {
        samples: Vec::with_capacity(turns),
        ..LoopOutcome::default()
    };
    tokio::time::sleep(start_after).await;
    for t in 0..turns {
        let content = tagged(&id, &format!("{tag}/{t}"));
        let _permit = match &cap {
            Some(s) => Some(s.acquire().await.expect("semaphore open")),
            None => None,
        };
        let started = Instant::now();
        let result = api.turn(&id, &content).await;
        let wall = started.elapsed();
        let model = mock.take(&id);
        match result {
            Ok(tool_ok) => {
                out.samples.push((wall, model));
                out.tool_ok += u64::from(tool_ok);
            }
            Err(e) => {
                out.errors += 1;
                out.first_error.get_or_insert(e);
            }
        }
    }
    out
}

/// Every session runs `turns` turns concurrently; returns what they saw and
/// the wall time of the whole run. Session `i` of `n` starts `spread × i / n`
/// after the first, so that sessions facing a fixed model delay do not move
/// in lock-step (all their model calls returning in the same instant).
async fn run_sessions(
    api: &Api,
    mock: &Mock,
    ids: &[String],
    tag: &str,
    turns: usize,
    spread: Duration,
    cap: Option<Arc<Semaphore>>,
) -> (LoopOutcome, Duration) {
    let started = Instant::now();
    let n = ids.len().max(1) as u32;
    let tasks: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            tokio::spawn(session_loop(
                api.clone(),
                mock.clone(),
                id.clone(),
                tag.to_owned(),
                turns,
                spread * i as u32 / n,
                cap.clone(),
            ))
        })
        .collect();
    let mut all = LoopOutcome::default();
    for task in tasks {
        all.merge(task.await.expect("session loop"));
    }
    (all, started.elapsed())
}

// ---------------------------------------------------------------------------
// Process measurements
// ---------------------------------------------------------------------------

/// A `Vm*` line of /proc/self/status, in bytes.
fn proc_status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn rss() -> u64 {
    proc_status_bytes("VmRSS")
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// utime + stime of a /proc stat line, in ticks.
fn stat_ticks(stat: &str) -> u64 {
    // The command name may hold spaces: fields are counted after its ')'.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime and stime are fields 14 and 15.
    let get = |i: usize| fields.get(i - 3).and_then(|f| f.parse::<u64>().ok());
    get(14).unwrap_or(0) + get(15).unwrap_or(0)
}

/// CPU time used so far, in seconds: by this process, by each of its
/// threads, and by the whole machine (to see what other processes took).
struct CpuSnapshot {
    process: f64,
    /// tid → (name, seconds, context switches)
    threads: HashMap<u32, (String, f64, u64)>,
    /// All CPUs: user, nice, system, irq, softirq.
    machine_busy: f64,
    machine_steal: f64,
}

impl CpuSnapshot {
    fn take() -> CpuSnapshot {
        let ticks = clock_ticks();
        let process = std::fs::read_to_string("/proc/self/stat")
            .map(|s| stat_ticks(&s))
            .unwrap_or(0) as f64
            / ticks;
        let mut threads = HashMap::new();
        let pid = std::process::id().to_string();
        if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
            for task in tasks.flatten() {
                let name = task.file_name().to_string_lossy().into_owned();
                let Ok(tid) = name.parse::<u32>() else {
                    continue;
                };
                let dir = task.path();
                let comm = if name == pid {
                    "bench-main".to_owned()
                } else {
                    std::fs::read_to_string(dir.join("comm"))
                        .unwrap_or_default()
                        .trim()
                        .to_owned()
                };
                let secs = std::fs::read_to_string(dir.join("stat"))
                    .map(|s| stat_ticks(&s))
                    .unwrap_or(0) as f64
                    / ticks;
                // Voluntary + involuntary: each is a sleep or a preemption.
                let switches: u64 = std::fs::read_to_string(dir.join("status"))
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.contains("ctxt_switches:"))
                    .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                    .sum();
                threads.insert(tid, (comm, secs, switches));
            }
        }
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let cpu: Vec<f64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .filter_map(|f| f.parse::<f64>().ok())
            .collect();
        let field = |i: usize| cpu.get(i).copied().unwrap_or(0.0) / ticks;
        CpuSnapshot {
            process,
            threads,
            machine_busy: field(0) + field(1) + field(2) + field(5) + field(6),
            machine_steal: field(7),
        }
    }
}

/// CPU seconds spent between two snapshots.
struct CpuUse {
    cadre: f64,
    harness: f64,
    /// Other processes on the machine (busy CPU time not ours).
    others: f64,
    steal: f64,
    /// Context switches of cadre's threads (each a thread going to sleep
    /// or being preempted: the hand-offs a turn costs).
    cadre_switches: u64,
    /// Per thread of this process, busiest first: (label, seconds). cadre's
    /// threads: `tokio worker k`, `blocking pool` (summed), `arbiter 0
    /// (executor)`, `arbiter k (conversations)`, `store writer`, `actix
    /// system`; the harness's are `bench-*`.
    threads: Vec<(String, f64)>,
}

fn cpu_use(before: &CpuSnapshot, after: &CpuSnapshot, workers: usize) -> CpuUse {
    let mut deltas: Vec<(u32, &str, f64, u64)> = after
        .threads
        .iter()
        .map(|(tid, (comm, secs, switches))| {
            let (was, was_switches) = before.threads.get(tid).map_or((0.0, 0), |t| (t.1, t.2));
            (
                *tid,
                comm.as_str(),
                secs - was,
                switches.saturating_sub(was_switches),
            )
        })
        .collect();
    deltas.sort_by_key(|d| d.0);
    let mut labelled: HashMap<String, f64> = HashMap::new();
    let (mut arbiters, mut tokio_workers) = (0, 0);
    let mut harness = 0.0;
    let mut cadre_switches = 0;
    for (_, comm, secs, switches) in deltas {
        let label = match comm {
            "actix-rt|system" => {
                arbiters += 1;
                match arbiters {
                    1 => "arbiter 0 (executor)".to_owned(),
                    k => format!("arbiter {} (conversations)", k - 1),
                }
            }
            "cadre-worker" => {
                tokio_workers += 1;
                if tokio_workers <= workers {
                    format!("tokio worker {}", tokio_workers - 1)
                } else {
                    "blocking pool".to_owned()
                }
            }
            "cadre-store-wri" => "store writer".to_owned(),
            "cadre-runtime" => "actix system".to_owned(),
            other => other.to_owned(),
        };
        if label.starts_with("bench-") {
            harness += secs;
        } else {
            cadre_switches += switches;
        }
        *labelled.entry(label).or_default() += secs;
    }
    let mut threads: Vec<(String, f64)> = labelled.into_iter().collect();
    threads.sort_by(|a, b| b.1.total_cmp(&a.1));
    let process = after.process - before.process;
    CpuUse {
        cadre: (process - harness).max(0.0),
        harness,
        others: ((after.machine_busy - before.machine_busy) - process).max(0.0),
        steal: after.machine_steal - before.machine_steal,
        cadre_switches,
        threads,
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Raises the open-file limit towards `want`; returns the limit in force.
fn raise_fd_limit(want: u64) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write to and read from a valid rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 1024;
        }
        if limit.rlim_cur >= want {
            return limit.rlim_cur;
        }
        let raised = libc::rlimit {
            rlim_cur: want,
            rlim_max: limit.rlim_max.max(want),
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
            return want;
        }
        let to_hard = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &to_hard) == 0 {
            return limit.rlim_max;
        }
        limit.rlim_cur
    }
}

fn malloc_trim() {
    // SAFETY: malloc_trim only returns free heap memory to the OS.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// What a durable write costs on the data dir's disk, measured in the run.
struct DiskProbe {
    /// Append 512 B, then `File::sync_all` (the file grows: a journal commit).
    fsync: Dist,
    /// Overwrite 4 KiB in place, then `File::sync_data` (what redb mostly does).
    sync_data: Dist,
    /// One message appended to a redb file of its own through `Store::write`
    /// with `durable = true` (a `Durability::Immediate` commit).
    redb_commit: Dist,
}

impl DiskProbe {
    fn run(dir: &Path, rt: &tokio::runtime::Runtime) -> DiskProbe {
        let path = dir.join("fsync-probe");
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(true)
            .open(&path)
            .expect("fsync probe file");
        let block = [0xA5u8; 512];
        let mut fsync = Vec::with_capacity(FSYNC_SAMPLES);
        for _ in 0..FSYNC_SAMPLES {
            file.write_all(&block).expect("fsync probe write");
            let started = Instant::now();
            file.sync_all().expect("fsync");
            fsync.push(started.elapsed());
        }
        file.set_len(1 << 20).expect("preallocate");
        file.sync_all().expect("fsync");
        let page = [0x5Au8; 4096];
        let mut sync_data = Vec::with_capacity(FSYNC_SAMPLES);
        for i in 0..FSYNC_SAMPLES as u64 {
            file.seek(SeekFrom::Start((i % 256) * 4096)).expect("seek");
            file.write_all(&page).expect("fsync probe write");
            let started = Instant::now();
            file.sync_data().expect("fdatasync");
            sync_data.push(started.elapsed());
        }
        drop(file);
        let _ = std::fs::remove_file(path);

        let probe_dir = dir.join("redb-probe");
        let redb_commit = rt.block_on(async {
            let store = Store::open(&probe_dir).expect("probe store");
            let mut samples = Vec::with_capacity(FSYNC_SAMPLES);
            for seq in 1..=FSYNC_SAMPLES as u64 {
                let op = WriteOp::AppendMessages {
                    session_id: "probe".into(),
                    messages: vec![StoredMessage {
                        seq,
                        message: ChatMessage::user(QUESTION),
                        created_at: jiff::Timestamp::now(),
                        rolled_back: false,
                    }],
                };
                let started = Instant::now();
                store.write(vec![op], true).await.expect("probe write");
                samples.push(started.elapsed());
            }
            samples
        });
        let _ = std::fs::remove_dir_all(probe_dir);
        DiskProbe {
            fsync: Dist::new(fsync),
            sync_data: Dist::new(sync_data),
            redb_commit: Dist::new(redb_commit),
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "fsync_append_512b": dist_json(&self.fsync),
            "fdatasync_overwrite_4k": dist_json(&self.sync_data),
            "redb_durable_commit_1_message": dist_json(&self.redb_commit),
        })
    }

    fn line(&self) -> String {
        format!(
            "fsync (append 512 B + sync_all) p50 {:.2} ms p99 {:.2} ms; fdatasync (overwrite 4 KiB) p50 {:.2} ms p99 {:.2} ms; redb durable commit p50 {:.2} ms p99 {:.2} ms",
            self.fsync.pct(50.0),
            self.fsync.pct(99.0),
            self.sync_data.pct(50.0),
            self.sync_data.pct(99.0),
            self.redb_commit.pct(50.0),
            self.redb_commit.pct(99.0)
        )
    }
}

/// The floor under every model call cadre makes here: the bench client
/// posts a request shaped like a turn's second model call (layered system
/// prompt, a 20-message window, the current turn, two tools) straight to
/// the mock, one at a time; wall time minus the mock's own time is what
/// loopback HTTP/1.1 (reqwest and axum/hyper in this process) costs.
fn loopback_probe(rt: &tokio::runtime::Runtime, mock: &Mock) -> (Dist, usize) {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a helpful assistant. Use the calculator for any arithmetic instead of computing in your head, and report its result. Keep answers short.\n\nIMPORTANT: answer briefly and concisely. Keep your answers short and direct.\n\nWhen a tool can answer part of the question, call it instead of guessing, then answer from its result. If a tool reports an error, correct the arguments or explain the problem."}),
    ];
    for i in 0..6 {
        let id = format!("call_{i}");
        messages.push(json!({"role": "user", "content": tagged("probe", &format!("p/{i}"))}));
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "calculator", "arguments": "{\"expression\":\"(2+3)*4\"}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": "{\"expression\":\"(2+3)*4\",\"formatted\":\"20\",\"result\":20.0}"}));
        if i < 5 {
            messages.push(json!({"role": "assistant", "content": ANSWER}));
        }
    }
    let body = json!({
        "model": "mock-model",
        "messages": messages,
        "tools": [
            {"type": "function", "function": {"name": "echo", "description": "Return the message unchanged.", "parameters": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}}},
            {"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic expression: + - * / % ^, parentheses, unary minus, decimals, sqrt, abs, min, max, round.", "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "The arithmetic expression, e.g. '(2+3)*4'", "minLength": 1, "maxLength": 1000}}, "required": ["expression"], "additionalProperties": false}}}
        ],
        "tool_choice": "auto",
    })
    .to_string();
    let size = body.len();
    let url = format!("{}/chat/completions", mock.base_url());
    let http = reqwest::Client::new();
    let samples = rt.block_on(async {
        let mut samples = Vec::with_capacity(FSYNC_SAMPLES);
        for i in 0..FSYNC_SAMPLES + 20 {
            let started = Instant::now();
            let reply = http
                .post(&url)
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await
                .expect("mock reachable");
            let _: Value = reply.json().await.expect("mock reply");
            let wall = started.elapsed();
            let model = mock.take("probe");
            if i >= 20 {
                samples.push(wall.saturating_sub(model));
            }
        }
        samples
    });
    (Dist::new(samples), size)
}

/// The executor's admission path on its components, as in
/// `benches/executor.rs`: mean and p99 per call, in ns.
fn admission_probe(rt: &tokio::runtime::Runtime) -> (f64, f64, usize) {
    let limiter = RateLimiter::new();
    let limit = RateLimit {
        per_minute: Some(u32::MAX / 2),
        per_hour: Some(u32::MAX / 2),
        per_day: Some(u32::MAX / 2),
    };
    let schema = json!({
        "type": "object",
        "properties": {
            "symbol": {"type": "string", "pattern": "^[A-Z]{1,5}$"},
            "timeframe": {"type": "string", "enum": ["1d", "1w"], "default": "1d"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 500, "default": 100}
        },
        "required": ["symbol"],
        "additionalProperties": false
    });
    let validator = ParamValidator::new(&schema, false).expect("schema");
    let pool = ConcurrencyController::new(ConcurrencyConfig::default());
    let raw = r#"{"symbol": "AAPL", "limit": 5}"#;
    const BATCHES: usize = 200;
    const PER_BATCH: usize = 500;
    rt.block_on(async {
        let mut per_call = Vec::with_capacity(BATCHES);
        for batch in 0..BATCHES + 20 {
            let started = Instant::now();
            for _ in 0..PER_BATCH {
                limiter.check("get_ohlcv", &limit, "user-1").expect("limit");
                let params = validator.validate_raw(raw).expect("valid");
                let permit = pool
                    .acquire(AdmissionRequest::new("market"))
                    .await
                    .expect("slot");
                drop(permit);
                std::hint::black_box(params);
            }
            // The first batches warm caches up and are not kept.
            if batch >= 20 {
                per_call.push(started.elapsed().as_nanos() as f64 / PER_BATCH as f64);
            }
        }
        let mean = per_call.iter().sum::<f64>() / per_call.len() as f64;
        per_call.sort_by(f64::total_cmp);
        let p99 = per_call[(per_call.len() * 99).div_ceil(100) - 1];
        (mean, p99, BATCHES * PER_BATCH)
    })
}

// ---------------------------------------------------------------------------
// Figures
// ---------------------------------------------------------------------------

/// What cadre's own `/metrics` saw over a phase: store commits per turn and
/// their mean duration, and model calls as timed by cadre beside the mock's
/// own time per request (the difference is the HTTP client, loopback and
/// JSON on both sides). Null where this build does not export a series.
fn internals(
    before: &HashMap<String, f64>,
    after: &HashMap<String, f64>,
    turns: usize,
    mock_requests: u64,
    mock_ns: u64,
) -> Value {
    let delta = |name: &str| Some(after.get(name)? - before.get(name).copied().unwrap_or(0.0));
    let per_turn = |v: f64| v / turns.max(1) as f64;
    let mean_ms = |sum: f64, count: f64| 1e3 * sum / count.max(1.0);
    let commits = delta("cadre_store_commit_duration_seconds_count");
    let commit_s = delta("cadre_store_commit_duration_seconds_sum");
    let calls = delta("cadre_model_call_duration_seconds_count");
    let call_s = delta("cadre_model_call_duration_seconds_sum");
    let mock_ms = mock_ns as f64 / 1e6 / mock_requests.max(1) as f64;
    json!({
        "store_commits_per_turn": commits.map(|c| fig(per_turn(c), "commits/turn", turns)),
        "store_commit_mean": commits.zip(commit_s).map(|(c, s)| fig(mean_ms(s, c), "ms", c as usize)),
        "model_calls_per_turn": calls.map(|c| fig(per_turn(c), "calls/turn", turns)),
        "model_call_mean_seen_by_cadre": calls.zip(call_s).map(|(c, s)| fig(mean_ms(s, c), "ms", c as usize)),
        "mock_time_per_request": fig(mock_ms, "ms", mock_requests as usize),
    })
}

/// Sorted durations in ms, with percentiles.
struct Dist(Vec<f64>);

impl Dist {
    fn new(samples: impl IntoIterator<Item = Duration>) -> Dist {
        let mut v: Vec<f64> = samples.into_iter().map(|d| d.as_secs_f64() * 1e3).collect();
        v.sort_by(f64::total_cmp);
        Dist(v)
    }
    fn pct(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let rank = ((q / 100.0) * self.0.len() as f64).ceil() as usize;
        self.0[rank.clamp(1, self.0.len()) - 1]
    }
    fn mean(&self) -> f64 {
        self.0.iter().sum::<f64>() / self.0.len().max(1) as f64
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// One figure of the report: value, unit and how many samples or sessions.
fn fig(value: f64, unit: &str, n: usize) -> Value {
    let value = if value.is_finite() {
        (value * 1000.0).round() / 1000.0
    } else {
        0.0
    };
    json!({ "value": value, "unit": unit, "n": n })
}

fn dist_json(d: &Dist) -> Value {
    json!({
        "p50": fig(d.pct(50.0), "ms", d.len()),
        "p90": fig(d.pct(90.0), "ms", d.len()),
        "p99": fig(d.pct(99.0), "ms", d.len()),
        "max": fig(d.pct(100.0), "ms", d.len()),
        "mean": fig(d.mean(), "ms", d.len()),
    })
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

struct Phase {
    delay: Duration,
    sessions: usize,
    turns_per_session: usize,
    in_flight_cap: Option<usize>,
    outcome: LoopOutcome,
    elapsed: Duration,
    cpu: CpuUse,
    /// The data disk's counters over the measured turns.
    disk: Value,
    /// cadre's /metrics over the measured turns (see [`internals`]).
    internals: Value,
    rss_after: u64,
    /// Requests the mock served during the measured turns, and how many of
    /// them were rolling-summary requests.
    model_requests: u64,
    summary_requests: u64,
    wall: Dist,
    overhead: Dist,
    model: Dist,
}

impl Phase {
    fn turns(&self) -> usize {
        self.outcome.samples.len()
    }
    fn turns_per_s(&self) -> f64 {
        self.turns() as f64 / self.elapsed.as_secs_f64()
    }
    fn tool_calls_per_s(&self) -> f64 {
        self.outcome.tool_ok as f64 / self.elapsed.as_secs_f64()
    }
    fn cadre_cpu_per_turn_us(&self) -> f64 {
        self.cpu.cadre * 1e6 / self.turns().max(1) as f64
    }
    /// Share of the machine's CPU (cores × wall time) taken by others.
    fn others_share(&self) -> f64 {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        self.cpu.others / (cores * self.elapsed.as_secs_f64())
    }
    fn mock_label(&self) -> String {
        format!("{} ms", self.delay.as_millis())
    }

    fn to_json(&self) -> Value {
        let n = self.sessions;
        let turns = self.turns();
        json!({
            "mock_delay_ms": self.delay.as_millis() as u64,
            "sessions": n,
            "turns_per_session": self.turns_per_session,
            "in_flight_cap": self.in_flight_cap,
            "turns": fig(turns as f64, "turns", n),
            "errors": fig(self.outcome.errors as f64, "turns", n),
            "first_error": self.outcome.first_error,
            "elapsed": fig(self.elapsed.as_secs_f64(), "s", n),
            "turns_per_s": fig(self.turns_per_s(), "turns/s", n),
            "tool_calls_per_s": fig(self.tool_calls_per_s(), "calls/s", n),
            "overhead_per_turn": dist_json(&self.overhead),
            "wall_per_turn": dist_json(&self.wall),
            "mock_time_per_turn": dist_json(&self.model),
            "cpu_cadre": fig(self.cpu.cadre, "s", turns),
            "cpu_harness": fig(self.cpu.harness, "s", turns),
            "cpu_other_processes": fig(self.cpu.others, "s", turns),
            "cpu_other_processes_share": fig(100.0 * self.others_share(), "%", turns),
            "cpu_steal": fig(self.cpu.steal, "s", turns),
            "cadre_context_switches_per_turn": fig(self.cpu.cadre_switches as f64 / turns.max(1) as f64, "switches/turn", turns),
            "cpu_by_thread": self.cpu.threads.iter()
                .map(|(label, secs)| (label.clone(), fig(*secs, "s", turns)))
                .collect::<serde_json::Map<String, Value>>(),
            "cadre_cpu_per_turn": fig(self.cadre_cpu_per_turn_us(), "us", turns),
            "rss_after": fig(mb(self.rss_after), "MiB", n),
            "data_disk": self.disk,
            "cadre_metrics": self.internals,
            "model_calls_per_turn": fig(self.model_requests as f64 / turns.max(1) as f64, "calls/turn", turns),
            "summary_calls_per_turn": fig(self.summary_requests as f64 / turns.max(1) as f64, "calls/turn", turns),
        })
    }
}

// ---------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------

struct Bench {
    settings: Settings,
    client_rt: tokio::runtime::Runtime,
    mock: Mock,
    runtime: Option<Runtime>,
    api: Api,
    data_dir: PathBuf,
    fd_limit: u64,
    /// cadre's tokio workers (its default: one per core).
    workers: usize,
    /// The data dir's block device, as /proc/diskstats names it.
    disk_name: String,
    /// Every session created, to count the messages at the end.
    all_sessions: Vec<String>,
    /// Turns that returned an answer, warm-ups and idle turns included.
    turns_done: u64,
}

impl Bench {
    fn phase(&mut self, delay: Duration, n: usize) -> Phase {
        let turns = self.settings.turns_per_session(n, delay);
        let need = n as u64 * FDS_PER_SESSION + 1_024;
        let in_flight_cap = (need > self.fd_limit)
            .then(|| (self.fd_limit.saturating_sub(1_024) / FDS_PER_SESSION).max(1) as usize);
        let cap = in_flight_cap.map(|c| Arc::new(Semaphore::new(c)));
        let tag = format!("d{}n{}", delay.as_millis(), n);
        let (api, mock) = (self.api.clone(), self.mock.clone());
        // Setup with the zero-latency mock: sessions, then a warm-up turn each
        // (all at once, so the connections the phase needs are open).
        mock.set_delay(Duration::ZERO);
        let ids = self.client_rt.block_on(create_sessions(&api, n));
        let (warm, _) = self.client_rt.block_on(run_sessions(
            &api,
            &mock,
            &ids,
            &format!("{tag}w"),
            1,
            Duration::ZERO,
            cap.clone(),
        ));
        if warm.errors > 0 {
            eprintln!(
                "  warm-up: {} turn(s) failed: {}",
                warm.errors,
                warm.first_error.as_deref().unwrap_or("")
            );
        }
        self.turns_done += warm.samples.len() as u64;
        mock.set_delay(delay);
        let cpu0 = CpuSnapshot::take();
        let disk0 = DiskStats::take(&self.disk_name);
        let (requests0, summaries0, mock_ns0) = mock.counts();
        let metrics0 = self.client_rt.block_on(api.metrics());
        let (outcome, elapsed) =
            self.client_rt
                .block_on(run_sessions(&api, &mock, &ids, &tag, turns, delay * 2, cap));
        let cpu1 = CpuSnapshot::take();
        let disk1 = DiskStats::take(&self.disk_name);
        let (requests1, summaries1, mock_ns1) = mock.counts();
        let metrics1 = self.client_rt.block_on(api.metrics());
        mock.set_delay(Duration::ZERO);
        self.turns_done += outcome.samples.len() as u64;
        self.all_sessions.extend(ids);
        let wall = Dist::new(outcome.samples.iter().map(|s| s.0));
        let overhead = Dist::new(outcome.samples.iter().map(|s| s.0.saturating_sub(s.1)));
        let model = Dist::new(outcome.samples.iter().map(|s| s.1));
        let disk = disk1.since(&disk0, outcome.samples.len());
        let internals = internals(
            &metrics0,
            &metrics1,
            outcome.samples.len(),
            requests1 - requests0,
            mock_ns1 - mock_ns0,
        );
        Phase {
            delay,
            sessions: n,
            turns_per_session: turns,
            in_flight_cap,
            outcome,
            elapsed,
            cpu: cpu_use(&cpu0, &cpu1, self.workers),
            disk,
            internals,
            rss_after: rss(),
            model_requests: requests1 - requests0,
            summary_requests: summaries1 - summaries0,
            wall,
            overhead,
            model,
        }
    }

    /// Sessions given one turn each and left idle: (RSS before, after, after malloc_trim).
    fn idle(&mut self, n: usize) -> (u64, u64, u64, usize) {
        self.mock.set_delay(Duration::ZERO);
        // One warm session first so pools and lazy statics are in the baseline.
        let api = Api::new(
            self.runtime
                .as_ref()
                .expect("runtime")
                .addr()
                .expect("addr"),
        );
        let mock = self.mock.clone();
        let warm = self.client_rt.block_on(async {
            let ids = create_sessions(&api, 1).await;
            api.turn(&ids[0], &tagged(&ids[0], "idle-warm"))
                .await
                .expect("warm-up turn");
            mock.take(&ids[0]);
            ids
        });
        self.all_sessions.extend(warm);
        self.turns_done += 1;
        drop(api);
        std::thread::sleep(Duration::from_millis(500));
        let before = rss();
        let api = Api::new(
            self.runtime
                .as_ref()
                .expect("runtime")
                .addr()
                .expect("addr"),
        );
        let ids = self.client_rt.block_on(async {
            let ids = create_sessions(&api, n).await;
            let failures: Vec<String> = futures::stream::iter(ids.iter().enumerate())
                .map(|(i, id)| {
                    let (api, mock) = (api.clone(), mock.clone());
                    async move {
                        let content = tagged(id, &format!("idle/{i}"));
                        let r = api.turn(id, &content).await;
                        mock.take(id);
                        r.err().map(|e| format!("session {id}: {e}"))
                    }
                })
                .buffer_unordered(SETUP_CONCURRENCY)
                .filter_map(|failure| async move { failure })
                .collect()
                .await;
            assert!(
                failures.is_empty(),
                "{} idle-phase turns failed; the first: {}",
                failures.len(),
                failures[0]
            );
            ids
        });
        self.turns_done += ids.len() as u64;
        self.all_sessions.extend(ids);
        // Close the client's connections; let cadre drop its side.
        drop(api);
        std::thread::sleep(Duration::from_secs(2));
        let after = rss();
        malloc_trim();
        let trimmed = rss();
        let resident = self
            .runtime
            .as_ref()
            .expect("runtime")
            .sessions()
            .resident();
        (before, after, trimmed, resident)
    }
}

/// `git describe --always --dirty` of the checkout, if git is there.
fn git_revision() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned();
    let mem = proc_meminfo_total();
    json!({
        "nproc": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "cpu": cpu,
        "kernel": kernel,
        "memory": fig(mb(mem), "MiB", 1),
    })
}

fn proc_meminfo_total() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|r| r.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Block-device counters from /proc/diskstats (device-wide: other
/// processes' IO on the same disk counts too).
#[derive(Default, Clone, Copy)]
struct DiskStats {
    writes: u64,
    write_ms: u64,
    flushes: u64,
    flush_ms: u64,
}

impl DiskStats {
    fn take(device: &str) -> DiskStats {
        let text = std::fs::read_to_string("/proc/diskstats").unwrap_or_default();
        let Some(f) = text
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.get(2) == Some(&device))
        else {
            return DiskStats::default();
        };
        let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        // After major, minor, name: writes completed is field 5 of the
        // counters, ms writing 8, flushes completed 16, ms flushing 17.
        DiskStats {
            writes: n(7),
            write_ms: n(10),
            flushes: n(19),
            flush_ms: n(20),
        }
    }

    fn since(&self, before: &DiskStats, turns: usize) -> Value {
        let writes = self.writes - before.writes;
        let flushes = self.flushes - before.flushes;
        let per = |ms: u64, n: u64| ms as f64 / n.max(1) as f64;
        json!({
            "writes": fig(writes as f64, "ops", turns),
            "avg_write_latency": fig(per(self.write_ms - before.write_ms, writes), "ms", writes as usize),
            "flushes": fig(flushes as f64, "ops", turns),
            "avg_flush_latency": fig(per(self.flush_ms - before.flush_ms, flushes), "ms", flushes as usize),
            "flushes_per_turn": fig(flushes as f64 / turns.max(1) as f64, "flushes/turn", turns),
        })
    }
}

/// The mount (device, mount point, fs type) holding `path`.
fn disk_of(path: &Path) -> Value {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let best = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && path.starts_with(f[1])).then(|| (f[0], f[1], f[2]))
        })
        .max_by_key(|(_, mount, _)| mount.len());
    match best {
        Some((dev, mount, fs)) => {
            let name = Path::new(dev)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let rotational = std::fs::read_to_string(format!("/sys/block/{name}/queue/rotational"))
                .map(|s| s.trim() == "1")
                .ok();
            json!({"device": dev, "name": name, "mount": mount, "fs": fs, "rotational": rotational})
        }
        None => json!({}),
    }
}

fn main() {
    let settings = Settings::from_env();
    let most = settings
        .sessions
        .iter()
        .copied()
        .chain([settings.idle_sessions])
        .max()
        .unwrap_or(1);
    let fd_limit = raise_fd_limit(most as u64 * FDS_PER_SESSION + 4_096);
    std::fs::create_dir_all(&settings.data_root).expect("data root");
    let data = tempfile::Builder::new()
        .prefix("cadre-load-")
        .tempdir_in(&settings.data_root)
        .expect("data dir");
    let agents = tempfile::tempdir().expect("agents dir");
    let agent_file = if env_flag("CADRE_BENCH_GUARDRAILS") {
        format!("{AGENT_FILE}{GUARDRAILS}")
    } else {
        AGENT_FILE.to_string()
    };
    std::fs::write(agents.path().join("bench.toml"), agent_file).expect("agent file");
    let data_dir = data.path().join("data");
    std::fs::create_dir_all(&data_dir).expect("data dir");
    let started = Instant::now();

    let machine = machine();
    let disk = disk_of(&data_dir);
    println!(
        "cadre load benchmark: {} cores ({}), data on {} ({}), quick={}, sessions {:?}, idle {}",
        machine["nproc"],
        machine["cpu"].as_str().unwrap_or(""),
        disk["device"].as_str().unwrap_or("?"),
        disk["fs"].as_str().unwrap_or("?"),
        settings.quick,
        settings.sessions,
        settings.idle_sessions
    );

    let mock_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("bench-mock")
        .enable_all()
        .build()
        .expect("mock runtime");
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("bench-client")
        .enable_all()
        .build()
        .expect("client runtime");
    let (admission_mean_ns, admission_p99_ns, admission_n) = admission_probe(&client_rt);
    println!(
        "admission (governor + validation + pool slot): {:.2} us/call mean, {:.2} us p99 of 500-call batches",
        admission_mean_ns / 1e3,
        admission_p99_ns / 1e3
    );

    let mock = Mock::start(&mock_rt);
    let (loopback, loopback_body) = loopback_probe(&client_rt, &mock);
    println!(
        "loopback model call without cadre (reqwest -> mock, {loopback_body} B body): p50 {:.3} ms, p99 {:.3} ms",
        loopback.pct(50.0),
        loopback.pct(99.0)
    );
    let mut config = ServerConfig::default();
    config.api_limit.per_second = 1_000_000_000;
    config.api_limit.burst = 1_000_000_000;
    config.concurrency.queue_size = most * 2;
    // `[store] cache_mb` as shipped unless `CADRE_BENCH_CACHE_MB` says (to
    // weigh redb's page cache against RSS and cold reads).
    if let Some(mb) = std::env::var("CADRE_BENCH_CACHE_MB")
        .ok()
        .and_then(|v| v.trim().parse().ok())
    {
        config.store.cache_mb = mb;
    }
    println!("redb page cache: {} MiB", config.store.cache_mb);
    // Every bench session is one client address: the per-address cap
    // (256, a guard against one hostile peer) would refuse its connections.
    config.server.max_connections = 1_000_000;
    config.server.max_connections_per_address = 1_000_000;
    let runtime = Runtime::builder()
        .data_dir(&data_dir)
        .agents_dir(agents.path())
        .listen("127.0.0.1:0".parse().expect("addr"))
        .model_endpoint(ModelEndpoint {
            base_url: Some(mock.base_url()),
            api_key: Some("bench".into()),
            model: Some("mock-model".into()),
        })
        .client_options(ClientOptions {
            request_timeout: Duration::from_secs(120),
            ..ClientOptions::default()
        })
        .config(config)
        .start()
        .expect("cadre starts");
    let api = Api::new(runtime.addr().expect("listening"));
    let mut bench = Bench {
        settings,
        client_rt,
        mock,
        runtime: Some(runtime),
        api,
        data_dir: data_dir.clone(),
        fd_limit,
        workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
        disk_name: disk["name"].as_str().unwrap_or_default().to_owned(),
        all_sessions: Vec::new(),
        turns_done: 0,
    };

    let rss_start = rss();
    let idle_n = bench.settings.idle_sessions;
    let (idle_before, idle_after, idle_trimmed, resident) = bench.idle(idle_n);
    let per_idle = idle_after.saturating_sub(idle_before) as f64 / idle_n as f64;
    let per_idle_trimmed = idle_trimmed.saturating_sub(idle_before) as f64 / idle_n as f64;
    // redb caches the pages it wrote (up to 1 GiB by default), so part of
    // the idle RSS follows the data written, not the sessions held.
    let redb_at_idle = std::fs::metadata(bench.data_dir.join("cadre.redb")).map_or(0, |m| m.len());
    println!(
        "idle: {idle_n} sessions, {resident} resident: RSS {:.1} MiB (before {:.1} MiB) -> {:.0} B/session; after malloc_trim {:.1} MiB -> {:.0} B/session",
        mb(idle_after),
        mb(idle_before),
        per_idle,
        mb(idle_trimmed),
        per_idle_trimmed
    );

    let disk_before = DiskProbe::run(&bench.data_dir, &bench.client_rt);
    println!("disk: {}", disk_before.line());
    let load_before = load_average();
    println!("load average before the load phases: {load_before}");

    let mut phases = Vec::new();
    for delay in bench.settings.delays.clone() {
        for n in bench.settings.sessions.clone() {
            let phase = bench.phase(delay, n);
            println!(
                "  mock {:>5}  N {:>6}: {:>6} turns in {:>6.2} s, {:>7.1} turns/s, overhead p50 {:>7.2} ms p99 {:>7.2} ms, errors {}",
                phase.mock_label(),
                n,
                phase.turns(),
                phase.elapsed.as_secs_f64(),
                phase.turns_per_s(),
                phase.overhead.pct(50.0),
                phase.overhead.pct(99.0),
                phase.outcome.errors
            );
            if let Some(e) = &phase.outcome.first_error {
                println!("    first error: {e}");
            }
            phases.push(phase);
        }
    }

    let disk_after = DiskProbe::run(&bench.data_dir, &bench.client_rt);
    let load_after = load_average();
    let peak_rss = proc_status_bytes("VmHWM");
    let rss_end = rss();

    // Stop cadre (flushes and closes the file), then count what it holds.
    bench.runtime.take();
    let file = data_dir.join("cadre.redb");
    let file_bytes = std::fs::metadata(&file).map_or(0, |m| m.len());
    let sessions = std::mem::take(&mut bench.all_sessions);
    let (messages, records) = bench.client_rt.block_on(async {
        let store = Store::open(&data_dir).expect("reopen the store");
        let mut messages = 0;
        for id in &sessions {
            messages += store.message_count(id).await.expect("count");
        }
        let records = store.record_count().await.expect("records");
        (messages, records)
    });
    let per_message = file_bytes as f64 / messages.max(1) as f64;
    let per_turn = file_bytes as f64 / bench.turns_done.max(1) as f64;

    let phase_json: Vec<Value> = phases.iter().map(Phase::to_json).collect();
    let find = |delay_ms: u128, n: usize| {
        phases
            .iter()
            .find(|p| p.delay.as_millis() == delay_ms && p.sessions == n)
    };
    let mut targets = Vec::new();
    let mut target =
        |name: &str, goal: String, measured: Option<(f64, &str)>, met: Option<bool>| {
            targets.push(json!({
                "target": name,
                "goal": goal,
                "measured": measured.map(|(v, u)| fig(v, u, 1)),
                "met": met,
            }));
        };
    let fsync_p50 = disk_before.fsync.pct(50.0);
    match find(0, 1) {
        Some(p) => target(
            "overhead p50 at 1 session (0 ms mock)",
            format!("<= one fsync + 1 ms = {:.2} ms", fsync_p50 + 1.0),
            Some((p.overhead.pct(50.0), "ms")),
            Some(p.overhead.pct(50.0) <= fsync_p50 + 1.0),
        ),
        None => target("overhead p50 at 1 session", "not run".into(), None, None),
    }
    for delay in [50, 0] {
        match find(delay, 100) {
            Some(p) => target(
                &format!("overhead p99 at 100 sessions ({delay} ms mock)"),
                "< 20 ms".into(),
                Some((p.overhead.pct(99.0), "ms")),
                Some(p.overhead.pct(99.0) < 20.0),
            ),
            None => target(
                &format!("overhead p99 at 100 sessions ({delay} ms mock)"),
                "not run".into(),
                None,
                None,
            ),
        }
    }
    match find(0, 1_000) {
        Some(p) => target(
            "turns/s at 1,000 sessions (0 ms mock)",
            ">= 2000 turns/s".into(),
            Some((p.turns_per_s(), "turns/s")),
            Some(p.turns_per_s() >= 2_000.0),
        ),
        None => target("turns/s at 1,000 sessions", "not run".into(), None, None),
    }
    target(
        &format!("RSS with {idle_n} idle sessions"),
        "< 200 MiB (10,000 sessions)".into(),
        Some((mb(idle_after), "MiB")),
        (idle_n == 10_000).then_some(mb(idle_after) < 200.0),
    );
    target(
        "admission path per call",
        "< 10 us".into(),
        Some((admission_mean_ns / 1e3, "us")),
        Some(admission_mean_ns < 10_000.0),
    );

    let report = json!({
        "command": "cargo bench --bench load",
        "revision": git_revision(),
        "quick": bench.settings.quick,
        "machine": machine,
        "disk": disk,
        "fd_limit": bench.fd_limit,
        "duration": fig(started.elapsed().as_secs_f64(), "s", 1),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "disk_before_load": disk_before.to_json(),
        "disk_after_load": disk_after.to_json(),
        "admission": {
            "mean": fig(admission_mean_ns / 1e3, "us", admission_n),
            "p99_of_batches": fig(admission_p99_ns / 1e3, "us", admission_n),
        },
        "loopback_model_call_without_cadre": {
            "request_body": fig(loopback_body as f64, "B", 1),
            "wall_minus_mock": dist_json(&loopback),
        },
        "idle": {
            "sessions": idle_n,
            "resident_sessions": fig(resident as f64, "sessions", idle_n),
            "rss_before": fig(mb(idle_before), "MiB", idle_n),
            "rss_after": fig(mb(idle_after), "MiB", idle_n),
            "rss_per_session": fig(per_idle / 1024.0, "KiB", idle_n),
            "rss_after_malloc_trim": fig(mb(idle_trimmed), "MiB", idle_n),
            "rss_per_session_after_malloc_trim": fig(per_idle_trimmed / 1024.0, "KiB", idle_n),
            "redb_file_size": fig(mb(redb_at_idle), "MiB", idle_n),
        },
        "phases": phase_json,
        "memory": {
            "rss_at_start": fig(mb(rss_start), "MiB", 1),
            "rss_at_end": fig(mb(rss_end), "MiB", 1),
            "peak_rss": fig(mb(peak_rss), "MiB", 1),
        },
        "redb": {
            "file_size": fig(mb(file_bytes), "MiB", 1),
            "messages": fig(messages as f64, "messages", sessions.len()),
            "tool_call_records": fig(records as f64, "records", sessions.len()),
            "turns": fig(bench.turns_done as f64, "turns", sessions.len()),
            "bytes_per_message": fig(per_message, "B", messages as usize),
            "bytes_per_turn": fig(per_turn, "B", bench.turns_done as usize),
        },
        "targets": targets,
    });
    let text = serde_json::to_string_pretty(&report).expect("report JSON");
    if let Some(dir) = bench.settings.report.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    std::fs::write(&bench.settings.report, text).expect("write the report");

    print_table(
        &phases,
        (&disk_before, &disk_after),
        &report,
        (peak_rss, file_bytes, messages, records, per_message),
    );
    println!(
        "\nreport: {}  ({:.0} s)",
        bench.settings.report.display(),
        started.elapsed().as_secs_f64()
    );
    drop(bench);
    drop(mock_rt);
}

fn print_table(
    phases: &[Phase],
    (disk_before, disk_after): (&DiskProbe, &DiskProbe),
    report: &Value,
    (peak_rss, file_bytes, messages, records, per_message): (u64, u64, u64, u64, f64),
) {
    println!();
    println!(
        "{:>6} {:>6} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6}",
        "mock",
        "N",
        "turns",
        "turns/s",
        "calls/s",
        "ovh p50",
        "ovh p99",
        "wall p50",
        "wall p99",
        "errors"
    );
    println!(
        "{:>6} {:>6} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6}",
        "", "", "", "", "", "ms", "ms", "ms", "ms", ""
    );
    for p in phases {
        println!(
            "{:>6} {:>6} {:>7} {:>9.1} {:>9.1} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>6}",
            p.mock_label(),
            p.sessions,
            p.turns(),
            p.turns_per_s(),
            p.tool_calls_per_s(),
            p.overhead.pct(50.0),
            p.overhead.pct(99.0),
            p.wall.pct(50.0),
            p.wall.pct(99.0),
            p.outcome.errors
        );
    }
    println!("\nwhere a turn's cost goes (same phases):");
    println!(
        "{:>6} {:>6} {:>9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "mock",
        "N",
        "cpu/turn",
        "harness",
        "others",
        "switches",
        "commits",
        "commit",
        "model",
        "mock",
        "requests"
    );
    println!(
        "{:>6} {:>6} {:>9} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "", "", "us", "cpu %", "cpu %", "/turn", "/turn", "ms", "ms/call", "ms/call", "/turn"
    );
    for p in phases {
        let harness_share = 100.0 * p.cpu.harness / (p.cpu.harness + p.cpu.cadre).max(f64::EPSILON);
        let m = &p.internals;
        let value = |k: &str| {
            m[k]["value"]
                .as_f64()
                .map_or("-".to_owned(), |v| format!("{v:.2}"))
        };
        println!(
            "{:>6} {:>6} {:>9.0} {:>8.0} {:>8.0} {:>9.1} {:>9} {:>9} {:>9} {:>9} {:>9.2}",
            p.mock_label(),
            p.sessions,
            p.cadre_cpu_per_turn_us(),
            harness_share,
            100.0 * p.others_share(),
            p.cpu.cadre_switches as f64 / p.turns().max(1) as f64,
            value("store_commits_per_turn"),
            value("store_commit_mean"),
            value("model_call_mean_seen_by_cadre"),
            value("mock_time_per_request"),
            p.model_requests as f64 / p.turns().max(1) as f64,
        );
    }
    println!(
        "\ncpu/turn: cadre's CPU time per turn; harness: the client's and the mock's share of this process's CPU;\n\
         others: CPU other processes took, as a share of the machine; switches: context switches of cadre's\n\
         threads per turn; commits: redb commits per turn and their mean time (cadre's /metrics); model: a\n\
         model call as cadre times it vs the mock's own time; requests: model requests per turn (3 with a\n\
         rolling summary)"
    );
    let floor = &report["loopback_model_call_without_cadre"];
    println!(
        "\nloopback model call without cadre ({} B body): p50 {} ms, p99 {} ms",
        floor["request_body"]["value"],
        floor["wall_minus_mock"]["p50"]["value"],
        floor["wall_minus_mock"]["p99"]["value"]
    );
    println!("disk before the load: {}", disk_before.line());
    println!("disk after the load:  {}", disk_after.line());
    let idle = &report["idle"];
    println!(
        "idle: {} sessions resident, RSS {} MiB ({} KiB/session; {} KiB after malloc_trim; redb file then {} MiB)",
        idle["resident_sessions"]["value"],
        idle["rss_after"]["value"],
        idle["rss_per_session"]["value"],
        idle["rss_per_session_after_malloc_trim"]["value"],
        idle["redb_file_size"]["value"]
    );
    println!("peak RSS (VmHWM): {:.1} MiB", mb(peak_rss));
    println!(
        "redb: {:.1} MiB for {messages} messages and {records} call records -> {per_message:.0} B/message",
        mb(file_bytes)
    );
    println!("\ntargets:");
    for t in report["targets"].as_array().into_iter().flatten() {
        let verdict = match t["met"].as_bool() {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "n/a",
        };
        println!(
            "  {:<48} {:>10} {:<8} goal {}  [{verdict}]",
            t["target"].as_str().unwrap_or(""),
            t["measured"]["value"],
            t["measured"]["unit"].as_str().unwrap_or(""),
            t["goal"].as_str().unwrap_or("")
        );
    }
}
