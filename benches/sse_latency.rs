//! SSE delta latency: how long a model's streamed delta takes to reach a
//! client of cadre's streaming API (issue #18: "≤ 1 ms p99"), and the
//! floor under it (the same model streamed straight to the client).
//!
//! ```text
//! cadre path:  mock model ──SSE──▶ cadre (model client → conversation → paced → axum Sse) ──SSE──▶ bench client
//! floor path:  mock model ──SSE─────────────────────────────────────────────────────────────▶ bench client
//!              stamp = BASE.elapsed() ······ one process, one monotonic clock ······ now − stamp
//! ```
//!
//! Everything runs in this one process: the mock model (axum, its own
//! one-worker tokio runtime), cadre (`Runtime::builder()…listen(127.0.0.1:0)`,
//! its own runtime and actix arbiters, a redb data dir under `target/tmp`,
//! durable writes as shipped) and the client (reqwest, its own one-worker
//! runtime), as in `benches/load.rs`. So one [`Instant`] base serves both
//! ends and a delta's latency is `now − stamp` with no clock offset.
//!
//! What a delta is: the mock answers a `stream: true` chat completion with
//! a role chunk, then K content deltas, each `<NANOS>` (nanoseconds since
//! the shared base), spaced by a fixed gap, then a `stop` chunk, a usage
//! chunk and `[DONE]`. The client sends the user message with
//! `Accept: text/event-stream` to `POST /v1/sessions/{id}/messages` and,
//! for every `model_delta` event, takes `now − stamp` for every stamp its
//! text holds. The user message tells the mock K, the gap and a start
//! offset (`sse-bench deltas=K gap_us=G offset_us=O`), so both paths use
//! the same mock code; each turn checks that all K stamps came, in order.
//!
//! Decisions, and why the figure is honest:
//! - **The stamp is taken inside hyper's write path.** The mock's body is
//!   a hand-written stream whose `poll_next` waits for the gap's timer and
//!   then takes the stamp and formats the chunk. hyper's HTTP/1.1
//!   dispatcher (hyper 1.12 `proto/h1/dispatch.rs`, `poll_write` then
//!   `poll_flush` in `poll_loop`) polls the body only when it can write,
//!   buffers the chunk, polls again (`Pending`: the next timer is not due)
//!   and flushes: one `write` per delta, right after the stamp. No channel
//!   or task hop sits between stamp and socket; the socket has
//!   `TCP_NODELAY`.
//! - **The client reads events as they arrive**: reqwest's `bytes_stream`
//!   fed to `eventsource-stream`, parsed chunk by chunk; the time is taken
//!   as soon as an event is complete, before its JSON is parsed.
//! - **Merged deltas still count**: cadre merges consecutive deltas for a
//!   client that reads slowly (`src/http/streams.rs`, `paced`), so one
//!   `model_delta` event may carry several stamps; each stamp is one
//!   sample (the older ones waited longer) and the table shows events
//!   beside deltas, so merging is visible.
//! - **The gap keeps deltas apart**: 2 ms for one session, so deltas never
//!   coalesce on the way. tokio's timers tick in whole milliseconds, so
//!   with many sessions deltas due in the same millisecond are written in
//!   one burst; session `i` of `N` starts its deltas `gap × i / N` later
//!   to spread them over the gap's ticks. With 100 sessions a 20 ms gap
//!   (50 tokens/s per stream, a real model's pace; 5,000 deltas/s in all)
//!   is the realistic case and 2 ms (50,000 deltas/s, bursts of ~50 per
//!   tick) the stress case.
//! - **Warm-up**: every session (and, on the floor, every concurrent
//!   stream) does one short unmeasured turn first, which opens the
//!   connections both ways; measured turns then run back to back.
//! - **The agent has no tools** and `max_iterations = 1`: a turn is one
//!   streamed model call; its history (two messages a turn) stays inside
//!   the window, so no summary request runs beside the streams (the mock
//!   counts non-streamed requests, and the report shows them).
//! - **The machine may be shared**: each phase reports this process's CPU
//!   per delta and what other processes took of the machine (`others`, in
//!   cores), from `/proc`. On 2 cores the mock, cadre and the client share
//!   the cores with each other as well.
//!
//! Reading the figures: the floor row is what this machine gives any
//! process whose threads sleep between deltas (timer and wake-up
//! latency, loopback TCP, the client's parsing); when other processes
//! keep the cores busy, its p99 alone can pass 1 ms and the tails say more
//! about the scheduler than about cadre. `chrt -f 10 <bench binary>` runs
//! the bench's threads ahead of the other processes (SCHED_FIFO; the
//! header and the report name the policy the run had), which leaves what
//! cadre itself adds. `cadre adds` is the difference of the two rows'
//! percentiles, not a percentile of differences.
//!
//! `cargo bench --bench sse_latency` runs every phase for the floor and for
//! cadre, prints a table and writes `target/bench-sse.json`. Settings:
//! `CADRE_BENCH_SSE_PHASES=1@2,100@20,100@2` (sessions@gap in ms),
//! `CADRE_BENCH_SSE_DELTAS=50` (deltas per turn), `CADRE_BENCH_SSE_TURNS`
//! (measured turns per session; default `max(4, 40 / sessions)`),
//! `CADRE_BENCH_DIR` (data dir root; default `target/tmp`).

use std::convert::Infallible;
use std::future::Future as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::serve::ListenerExt;
use axum::{Json, Router};
use cadre::Runtime;
use cadre::model::ModelEndpoint;
use cadre::model::openai::ClientOptions;
use cadre::server_config::ServerConfig;
use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};
use serde_json::{Value, json};

const AGENT_FILE: &str = r#"
name = "sse"
description = "The SSE latency benchmark's agent: one streamed model call per turn."
system_prompt = "You are a helpful assistant. Keep answers short."
tools = []
max_iterations = 1
history_window = 200
"#;
/// Deltas of a warm-up turn.
const WARM_DELTAS: usize = 2;
/// The target of issue #18.
const TARGET_P99_NS: u64 = 1_000_000;

// ---------------------------------------------------------------------------
// The clock both ends share
// ---------------------------------------------------------------------------

static BASE: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds since the process's base instant.
fn now_ns() -> u64 {
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Every `<NANOS>` stamp in a delta's text, in order.
fn stamps(text: &str) -> impl Iterator<Item = Option<u64>> + '_ {
    text.split('<')
        .skip(1)
        .map(|part| part.split_once('>').and_then(|(n, _)| n.parse().ok()))
}

// ---------------------------------------------------------------------------
// The mock model
// ---------------------------------------------------------------------------

/// What the user message asks the mock for.
#[derive(Clone, Copy, Debug)]
struct Ask {
    deltas: usize,
    gap: Duration,
    /// Added before the first delta (spreads concurrent streams).
    offset: Duration,
}

impl Ask {
    fn text(&self) -> String {
        format!(
            "sse-bench deltas={} gap_us={} offset_us={}",
            self.deltas,
            self.gap.as_micros(),
            self.offset.as_micros()
        )
    }

    fn parse(text: &str) -> Option<Ask> {
        let rest = text.strip_prefix("sse-bench ")?;
        let mut ask = Ask {
            deltas: 0,
            gap: Duration::ZERO,
            offset: Duration::ZERO,
        };
        for pair in rest.split_whitespace() {
            let (key, value) = pair.split_once('=')?;
            let value: u64 = value.parse().ok()?;
            match key {
                "deltas" => ask.deltas = value as usize,
                "gap_us" => ask.gap = Duration::from_micros(value),
                "offset_us" => ask.offset = Duration::from_micros(value),
                _ => return None,
            }
        }
        Some(ask)
    }
}

#[derive(Default)]
struct MockCounts {
    streams: AtomicU64,
    /// Requests without `stream: true` (cadre's summaries would be these).
    plain: AtomicU64,
    deltas: AtomicU64,
}

/// One SSE event carrying a chat completion chunk.
fn chunk(delta: Value, finish_reason: Option<&str>, include_usage: bool) -> String {
    let mut chunk = json!({
        "id": "chatcmpl-sse-bench",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "mock-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    });
    if include_usage {
        chunk["usage"] = Value::Null;
    }
    format!("data: {chunk}\n\n")
}

/// A content delta: built by hand, so that formatting it costs next to
/// nothing between the stamp and the write.
fn content_chunk(stamp: u64, include_usage: bool) -> String {
    let usage = if include_usage {
        r#","usage":null"#
    } else {
        ""
    };
    format!(
        r#"data: {{"id":"chatcmpl-sse-bench","object":"chat.completion.chunk","created":0,"model":"mock-model","choices":[{{"index":0,"delta":{{"content":"<{stamp}>"}},"finish_reason":null}}]{usage}}}"#
    ) + "\n\n"
}

enum Stage {
    Head,
    Deltas,
    Tail,
    Done,
}

/// The streamed reply: the stamp is taken in `poll_next`, which hyper
/// calls when it is ready to write (see the module doc).
struct DeltaStream {
    stage: Stage,
    timer: Pin<Box<tokio::time::Sleep>>,
    gap: Duration,
    left: usize,
    deltas: usize,
    include_usage: bool,
    counts: Arc<MockCounts>,
}

impl Stream for DeltaStream {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let text = match this.stage {
            Stage::Head => {
                this.stage = Stage::Deltas;
                chunk(
                    json!({"role": "assistant", "content": ""}),
                    None,
                    this.include_usage,
                )
            }
            Stage::Deltas if this.left > 0 => {
                if this.timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let stamp = now_ns();
                let text = content_chunk(stamp, this.include_usage);
                this.left -= 1;
                this.counts.deltas.fetch_add(1, Ordering::Relaxed);
                let next = tokio::time::Instant::now() + this.gap;
                this.timer.as_mut().reset(next);
                text
            }
            Stage::Deltas => {
                this.stage = Stage::Tail;
                let mut text = chunk(json!({}), Some("stop"), this.include_usage);
                if this.include_usage {
                    let usage = json!({
                        "id": "chatcmpl-sse-bench",
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": "mock-model",
                        "choices": [],
                        "usage": {"prompt_tokens": 20, "completion_tokens": this.deltas, "total_tokens": 20 + this.deltas},
                    });
                    text.push_str(&format!("data: {usage}\n\n"));
                }
                text
            }
            Stage::Tail => {
                this.stage = Stage::Done;
                "data: [DONE]\n\n".to_owned()
            }
            Stage::Done => return Poll::Ready(None),
        };
        Poll::Ready(Some(Ok(Bytes::from(text))))
    }
}

async fn chat_completions(
    State(counts): State<Arc<MockCounts>>,
    Json(request): Json<Value>,
) -> Response {
    let ask = request["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .and_then(Ask::parse);
    let streaming = request["stream"] == true;
    let (Some(ask), true) = (ask, streaming) else {
        counts.plain.fetch_add(1, Ordering::Relaxed);
        return Json(json!({
            "id": "chatcmpl-sse-bench",
            "object": "chat.completion",
            "created": 0,
            "model": "mock-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "summary"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21},
        }))
        .into_response();
    };
    counts.streams.fetch_add(1, Ordering::Relaxed);
    let body = DeltaStream {
        stage: Stage::Head,
        timer: Box::pin(tokio::time::sleep(ask.gap + ask.offset)),
        gap: ask.gap,
        left: ask.deltas,
        deltas: ask.deltas,
        include_usage: request.pointer("/stream_options/include_usage") == Some(&json!(true)),
        counts: counts.clone(),
    };
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

struct Mock {
    addr: SocketAddr,
    counts: Arc<MockCounts>,
}

impl Mock {
    fn start(rt: &tokio::runtime::Runtime) -> Mock {
        let counts = Arc::new(MockCounts::default());
        let app = Router::new()
            .route("/v1/chat/completions", post(chat_completions))
            .with_state(counts.clone());
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("mock: bind");
        let addr = listener.local_addr().expect("mock: addr");
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        rt.spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("mock model stopped: {e}");
            }
        });
        Mock { addr, counts }
    }

    fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }
}

// ---------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------

/// Which way the deltas go.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Route {
    /// Mock → client, no cadre.
    Floor,
    /// Mock → cadre → client.
    Cadre,
}

impl Route {
    fn name(self) -> &'static str {
        match self {
            Route::Floor => "floor",
            Route::Cadre => "cadre",
        }
    }
}

/// What one turn saw.
#[derive(Default)]
struct TurnSeen {
    /// now − stamp per delta, ns.
    latencies: Vec<u64>,
    /// SSE events that carried deltas.
    events: u64,
}

#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    mock_url: String,
    cadre_url: String,
}

impl Client {
    /// One turn on `path`: `session` is cadre's session id (unused on the floor).
    async fn turn(&self, path: Route, session: &str, ask: Ask) -> Result<TurnSeen, String> {
        let request = match path {
            Route::Cadre => self
                .http
                .post(format!("{}/v1/sessions/{session}/messages", self.cadre_url))
                .header(header::ACCEPT, "text/event-stream")
                .json(&json!({"content": ask.text()})),
            Route::Floor => self
                .http
                .post(format!("{}/chat/completions", self.mock_url))
                .json(&json!({
                    "model": "mock-model",
                    "messages": [{"role": "user", "content": ask.text()}],
                    "stream": true,
                    "stream_options": {"include_usage": true},
                })),
        };
        let response = request.send().await.map_err(|e| format!("send: {e}"))?;
        if response.status() != StatusCode::OK {
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            return Err(format!("HTTP {status}: {body}"));
        }
        let mut events = std::pin::pin!(response.bytes_stream().eventsource());
        let mut seen = TurnSeen {
            latencies: Vec::with_capacity(ask.deltas),
            events: 0,
        };
        let mut last = 0;
        let mut done = false;
        while let Some(event) = events.next().await {
            let at = now_ns();
            let event = event.map_err(|e| format!("stream: {e}"))?;
            let text = match (path, event.event.as_str()) {
                (Route::Cadre, "model_delta") => {
                    let data: Value = serde_json::from_str(&event.data)
                        .map_err(|e| format!("model_delta data: {e}"))?;
                    data["text"].as_str().unwrap_or_default().to_owned()
                }
                (Route::Cadre, "turn_completed") => {
                    done = true;
                    continue;
                }
                (Route::Cadre, "turn_failed" | "turn_interrupted" | "turn_paused") => {
                    return Err(format!("{}: {}", event.event, event.data));
                }
                (Route::Cadre, _) => continue,
                (Route::Floor, _) if event.data.trim() == "[DONE]" => {
                    done = true;
                    continue;
                }
                (Route::Floor, _) => {
                    let data: Value = serde_json::from_str(&event.data)
                        .map_err(|e| format!("chunk data: {e}"))?;
                    data.pointer("/choices/0/delta/content")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned()
                }
            };
            let before = seen.latencies.len();
            for stamp in stamps(&text) {
                let stamp = stamp.ok_or_else(|| format!("a delta without a stamp: {text:?}"))?;
                if stamp <= last {
                    return Err(format!("stamps out of order: {stamp} after {last}"));
                }
                last = stamp;
                seen.latencies.push(at.saturating_sub(stamp));
            }
            if seen.latencies.len() > before {
                seen.events += 1;
            }
        }
        if !done {
            return Err("the stream ended before its end event".into());
        }
        if seen.latencies.len() != ask.deltas {
            return Err(format!(
                "{} deltas arrived, {} were sent",
                seen.latencies.len(),
                ask.deltas
            ));
        }
        Ok(seen)
    }

    async fn create_session(&self) -> Result<String, String> {
        let response = self
            .http
            .post(format!("{}/v1/sessions", self.cadre_url))
            .json(&json!({"agent": "sse"}))
            .send()
            .await
            .map_err(|e| format!("create session: {e}"))?;
        let status = response.status();
        let body: Value = response
            .json()
            .await
            .map_err(|e| format!("create session: {e}"))?;
        match body["id"].as_str() {
            Some(id) if status == StatusCode::CREATED => Ok(id.to_owned()),
            _ => Err(format!("create session: HTTP {status}: {body}")),
        }
    }
}

// ---------------------------------------------------------------------------
// Phases
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct PhaseSpec {
    sessions: usize,
    gap: Duration,
}

struct Settings {
    phases: Vec<PhaseSpec>,
    deltas: usize,
    turns: Option<usize>,
    data_root: PathBuf,
    report: PathBuf,
}

impl Settings {
    fn from_env() -> Settings {
        let phases = std::env::var("CADRE_BENCH_SSE_PHASES")
            .ok()
            .map(|raw| {
                raw.split(',')
                    .map(|p| {
                        let (n, gap) = p.trim().split_once('@').unwrap_or_else(|| {
                            panic!("CADRE_BENCH_SSE_PHASES: {p:?} is not sessions@gap_ms")
                        });
                        PhaseSpec {
                            sessions: n.parse().expect("sessions: a number"),
                            gap: Duration::from_secs_f64(
                                gap.parse::<f64>().expect("gap: milliseconds") / 1e3,
                            ),
                        }
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_else(|| {
                vec![
                    PhaseSpec {
                        sessions: 1,
                        gap: Duration::from_millis(2),
                    },
                    PhaseSpec {
                        sessions: 100,
                        gap: Duration::from_millis(20),
                    },
                    PhaseSpec {
                        sessions: 100,
                        gap: Duration::from_millis(2),
                    },
                ]
            });
        let number = |var: &str| -> Option<usize> {
            std::env::var(var)
                .ok()?
                .trim()
                .parse()
                .ok()
                .filter(|n| *n > 0)
        };
        let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("target"));
        Settings {
            phases,
            deltas: number("CADRE_BENCH_SSE_DELTAS").unwrap_or(50),
            turns: number("CADRE_BENCH_SSE_TURNS"),
            data_root: std::env::var_os("CADRE_BENCH_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR"))),
            report: target.join("bench-sse.json"),
        }
    }

    fn turns(&self, sessions: usize) -> usize {
        self.turns.unwrap_or((40 / sessions.max(1)).max(4))
    }
}

/// Sorted latencies, ns.
struct Dist(Vec<u64>);

impl Dist {
    fn new(mut v: Vec<u64>) -> Dist {
        v.sort_unstable();
        Dist(v)
    }

    /// Nearest-rank percentile, ns.
    fn pct(&self, p: f64) -> u64 {
        if self.0.is_empty() {
            return 0;
        }
        let rank = ((p / 100.0) * self.0.len() as f64).ceil() as usize;
        self.0[rank.clamp(1, self.0.len()) - 1]
    }

    fn max(&self) -> u64 {
        self.0.last().copied().unwrap_or(0)
    }

    fn mean(&self) -> f64 {
        self.0.iter().sum::<u64>() as f64 / self.0.len().max(1) as f64
    }
}

/// CPU seconds: this process, and the whole machine (busy, all cores).
struct Cpu {
    process: f64,
    machine: f64,
}

impl Cpu {
    fn now() -> Cpu {
        // SAFETY: sysconf only reads a configuration value.
        let hz = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
            t if t > 0 => t as f64,
            _ => 100.0,
        };
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the command name's ')': state is field 3; utime 14, stime 15.
        let fields: Vec<u64> = stat
            .rfind(')')
            .map(|i| &stat[i + 2..])
            .unwrap_or_default()
            .split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        let process = (fields.get(11).unwrap_or(&0) + fields.get(12).unwrap_or(&0)) as f64 / hz;
        // cpu  user nice system idle iowait irq softirq steal
        let all = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let cpu: Vec<u64> = all
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        let busy = [0, 1, 2, 5, 6]
            .iter()
            .map(|&i| cpu.get(i).copied().unwrap_or(0))
            .sum::<u64>() as f64
            / hz;
        Cpu {
            process,
            machine: busy,
        }
    }
}

/// The scheduling policy the bench's threads run with (they inherit the
/// main thread's): `SCHED_OTHER nice N` or `SCHED_FIFO N`.
fn scheduling() -> String {
    // SAFETY: these calls only read the calling thread's settings.
    let (policy, nice) = unsafe {
        let mut param = libc::sched_param { sched_priority: 0 };
        let policy = libc::sched_getscheduler(0);
        libc::sched_getparam(0, &mut param);
        (
            (policy, param.sched_priority),
            libc::getpriority(libc::PRIO_PROCESS, 0),
        )
    };
    match policy {
        (libc::SCHED_FIFO, prio) => format!("SCHED_FIFO {prio}"),
        (libc::SCHED_RR, prio) => format!("SCHED_RR {prio}"),
        _ => format!("SCHED_OTHER nice {nice}"),
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

struct Phase {
    path: Route,
    spec: PhaseSpec,
    deltas_per_turn: usize,
    turns: usize,
    dist: Dist,
    events: u64,
    errors: u64,
    first_error: Option<String>,
    wall: Duration,
    cpu_s: f64,
    others_cores: f64,
}

impl Phase {
    fn n(&self) -> usize {
        self.dist.0.len()
    }

    fn cpu_us_per_delta(&self) -> f64 {
        self.cpu_s * 1e6 / self.n().max(1) as f64
    }

    fn to_json(&self) -> Value {
        let us = |ns: u64| ns as f64 / 1e3;
        json!({
            "path": self.path.name(),
            "sessions": self.spec.sessions,
            "gap_ms": self.spec.gap.as_secs_f64() * 1e3,
            "deltas_per_turn": self.deltas_per_turn,
            "turns_per_session": self.turns,
            "n": self.n(),
            "events": self.events,
            "latency_us": {
                "p50": us(self.dist.pct(50.0)),
                "p90": us(self.dist.pct(90.0)),
                "p99": us(self.dist.pct(99.0)),
                "p99_9": us(self.dist.pct(99.9)),
                "max": us(self.dist.max()),
                "mean": self.dist.mean() / 1e3,
            },
            "errors": self.errors,
            "first_error": self.first_error,
            "wall_s": self.wall.as_secs_f64(),
            "deltas_per_s": self.n() as f64 / self.wall.as_secs_f64().max(1e-9),
            "cpu_us_per_delta": self.cpu_us_per_delta(),
            "others_cores": self.others_cores,
        })
    }
}

/// Runs one phase on `path`: `spec.sessions` streams at once, each a
/// warm-up turn then `turns` measured turns back to back.
fn run_phase(
    rt: &tokio::runtime::Runtime,
    client: &Client,
    path: Route,
    spec: PhaseSpec,
    deltas: usize,
    turns: usize,
) -> Phase {
    let n = spec.sessions;
    let sessions: Vec<String> = rt.block_on(async {
        match path {
            Route::Floor => (0..n).map(|i| format!("floor-{i}")).collect(),
            Route::Cadre => {
                futures::stream::iter(0..n)
                    .map(|_| client.create_session())
                    .buffer_unordered(64)
                    .map(|r| r.unwrap_or_else(|e| panic!("{e}")))
                    .collect()
                    .await
            }
        }
    });
    // Warm-up: every stream at once, so that as many connections open as
    // the measured turns will use.
    rt.block_on(async {
        let warm: Vec<_> = sessions
            .iter()
            .map(|id| {
                let client = client.clone();
                let id = id.clone();
                tokio::spawn(async move {
                    let ask = Ask {
                        deltas: WARM_DELTAS,
                        gap: Duration::from_millis(1),
                        offset: Duration::ZERO,
                    };
                    client.turn(path, &id, ask).await
                })
            })
            .collect();
        for task in warm {
            if let Err(e) = task.await.expect("warm-up task") {
                panic!("warm-up turn on {}: {e}", path.name());
            }
        }
    });

    let cpu0 = Cpu::now();
    let started = Instant::now();
    let outcomes: Vec<Result<Vec<TurnSeen>, (usize, String)>> = rt.block_on(async {
        let tasks: Vec<_> = sessions
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let client = client.clone();
                let id = id.clone();
                let ask = Ask {
                    deltas,
                    gap: spec.gap,
                    offset: spec.gap * i as u32 / n as u32,
                };
                tokio::spawn(async move {
                    let mut seen = Vec::with_capacity(turns);
                    for _ in 0..turns {
                        match client.turn(path, &id, ask).await {
                            Ok(s) => seen.push(s),
                            Err(e) => return Err((seen.len(), e)),
                        }
                    }
                    Ok(seen)
                })
            })
            .collect();
        let mut all = Vec::with_capacity(n);
        for task in tasks {
            all.push(task.await.expect("session task"));
        }
        all
    });
    let wall = started.elapsed();
    let cpu1 = Cpu::now();

    let mut latencies = Vec::with_capacity(n * turns * deltas);
    let mut events = 0;
    let mut errors = 0;
    let mut first_error = None;
    for outcome in outcomes {
        let seen = match outcome {
            Ok(seen) => seen,
            Err((done, e)) => {
                errors += 1;
                first_error.get_or_insert(format!("after {done} turns: {e}"));
                Vec::new()
            }
        };
        for turn in seen {
            latencies.extend(turn.latencies);
            events += turn.events;
        }
    }
    let cpu_s = cpu1.process - cpu0.process;
    let others = ((cpu1.machine - cpu0.machine) - cpu_s).max(0.0);
    Phase {
        path,
        spec,
        deltas_per_turn: deltas,
        turns,
        dist: Dist::new(latencies),
        events,
        errors,
        first_error,
        wall,
        cpu_s,
        others_cores: others / wall.as_secs_f64().max(1e-9),
    }
}

fn main() {
    now_ns(); // fixes the base
    let settings = Settings::from_env();
    let most = settings
        .phases
        .iter()
        .map(|p| p.sessions)
        .max()
        .unwrap_or(1);
    std::fs::create_dir_all(&settings.data_root).expect("data root");
    let data = tempfile::Builder::new()
        .prefix("cadre-sse-")
        .tempdir_in(&settings.data_root)
        .expect("data dir");
    let agents = tempfile::tempdir().expect("agents dir");
    std::fs::write(agents.path().join("sse.toml"), AGENT_FILE).expect("agent file");
    let data_dir = data.path().join("data");
    std::fs::create_dir_all(&data_dir).expect("data dir");
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load_before = load_average();
    let policy = scheduling();
    println!(
        "cadre SSE delta latency: {cores} cores, load average {load_before}, {policy}, data dir {}, {} deltas per turn",
        data_dir.display(),
        settings.deltas
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
    let mock = Mock::start(&mock_rt);

    let mut config = ServerConfig::default();
    // Every stream comes from 127.0.0.1: one caller for the rate limit,
    // the stream cap and the per-address connection cap.
    config.api_limit.per_second = 1_000_000_000;
    config.api_limit.burst = 1_000_000_000;
    config.api_limit.max_streams = (most as u32).saturating_mul(2).max(32);
    config.server.max_connections_per_address = most.saturating_mul(4).max(256);
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
    let client = Client {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(300))
            .pool_max_idle_per_host(most * 2)
            .build()
            .expect("client"),
        mock_url: mock.base_url(),
        cadre_url: format!("http://{}", runtime.addr().expect("listening")),
    };

    let mut phases = Vec::new();
    for spec in settings.phases.clone() {
        let turns = settings.turns(spec.sessions);
        for path in [Route::Floor, Route::Cadre] {
            let phase = run_phase(&client_rt, &client, path, spec, settings.deltas, turns);
            if let Some(e) = &phase.first_error {
                println!(
                    "  {} N {}: {} sessions failed; first: {e}",
                    path.name(),
                    spec.sessions,
                    phase.errors
                );
            }
            phases.push(phase);
        }
    }
    let load_after = load_average();
    let plain = mock.counts.plain.load(Ordering::Relaxed);
    let streams = mock.counts.streams.load(Ordering::Relaxed);
    let written = mock.counts.deltas.load(Ordering::Relaxed);
    drop(runtime);

    println!();
    println!(
        "{:<6} {:>8} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} {:>10} {:>9} {:>7}",
        "path",
        "sessions",
        "gap ms",
        "deltas",
        "events",
        "p50 us",
        "p90 us",
        "p99 us",
        "p99.9 us",
        "max us",
        "deltas/s",
        "cpu us/Δ",
        "others"
    );
    for p in &phases {
        println!(
            "{:<6} {:>8} {:>7.1} {:>8} {:>8} {:>8.0} {:>8.0} {:>8.0} {:>9.0} {:>8.0} {:>10.0} {:>9.1} {:>7.2}",
            p.path.name(),
            p.spec.sessions,
            p.spec.gap.as_secs_f64() * 1e3,
            p.n(),
            p.events,
            p.dist.pct(50.0) as f64 / 1e3,
            p.dist.pct(90.0) as f64 / 1e3,
            p.dist.pct(99.0) as f64 / 1e3,
            p.dist.pct(99.9) as f64 / 1e3,
            p.dist.max() as f64 / 1e3,
            p.n() as f64 / p.wall.as_secs_f64().max(1e-9),
            p.cpu_us_per_delta(),
            p.others_cores
        );
    }
    println!();
    let mut targets = Vec::new();
    for pair in phases.chunks(2) {
        let [floor, cadre] = pair else { continue };
        let added = |p: f64| (cadre.dist.pct(p) as f64 - floor.dist.pct(p) as f64) / 1e3;
        let met = cadre.errors == 0 && cadre.n() > 0 && cadre.dist.pct(99.0) <= TARGET_P99_NS;
        println!(
            "N {:>3} @ {:>4.1} ms: cadre adds p50 {:+.0} us, p99 {:+.0} us; CPU {:+.1} us/delta; p99 ≤ 1 ms: {}",
            cadre.spec.sessions,
            cadre.spec.gap.as_secs_f64() * 1e3,
            added(50.0),
            added(99.0),
            cadre.cpu_us_per_delta() - floor.cpu_us_per_delta(),
            if met { "met" } else { "MISSED" }
        );
        if floor.dist.pct(99.0) > TARGET_P99_NS {
            println!(
                "  the floor's own p99 is {:.0} us: this machine's wake-ups, not cadre, set the tail (see the module doc)",
                floor.dist.pct(99.0) as f64 / 1e3
            );
        }
        targets.push(json!({
            "sessions": cadre.spec.sessions,
            "gap_ms": cadre.spec.gap.as_secs_f64() * 1e3,
            "goal": "cadre p99 ≤ 1 ms",
            "cadre_p99_us": cadre.dist.pct(99.0) as f64 / 1e3,
            "floor_p99_us": floor.dist.pct(99.0) as f64 / 1e3,
            "added_p50_us": added(50.0),
            "added_p99_us": added(99.0),
            "added_cpu_us_per_delta": cadre.cpu_us_per_delta() - floor.cpu_us_per_delta(),
            "met": met,
        }));
    }
    println!(
        "mock: {streams} streams, {written} deltas written, {plain} non-streamed requests; load average before {load_before}, after {load_after}"
    );
    let report = json!({
        "bench": "sse_latency",
        "machine": {"cores": cores, "load_before": load_before, "load_after": load_after, "scheduling": policy},
        "deltas_per_turn": settings.deltas,
        "mock": {"streams": streams, "deltas_written": written, "non_streamed_requests": plain},
        "phases": phases.iter().map(Phase::to_json).collect::<Vec<_>>(),
        "targets": targets,
    });
    std::fs::write(
        &settings.report,
        serde_json::to_string_pretty(&report).expect("json"),
    )
    .expect("write the report");
    println!("report: {}", settings.report.display());
    let failed: u64 = phases.iter().map(|p| p.errors).sum();
    if failed > 0 {
        eprintln!("{failed} sessions failed");
        std::process::exit(1);
    }
}
