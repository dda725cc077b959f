//! benches/peers row `adk`: one tool-calling session through ADK-Rust, in
//! process, against the mock model (benches/peers/mock_model.py).
//!
//! An `LlmAgent` on ADK-Rust's `OpenAIClient` (chat completions at the
//! mock's base URL), one `FunctionTool` named `calculator` with the
//! argument `expression`, an `InMemorySessionService` and one `Runner`,
//! built once; a session = create the session in the service, `run_str`
//! the question, drain the event stream to the final text. Streaming mode
//! `None` (plain JSON replies), as every other row. Nothing on disk, no
//! HTTP in front.
//!
//! Phases and the JSON written to `--out` are those of
//! `benches/peers/rows/driver.py` (warm-up; up to N sessions one at a
//! time; up to T sessions with C in flight; VmHWM at the end). CPU is
//! `getrusage(RUSAGE_SELF)`: every thread of this process. The runtime is
//! `#[tokio::main]`'s default (one worker per core), as an ADK-Rust app
//! would start it.

mod agent;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use adk_rust::StreamingMode;
use adk_rust::prelude::*;
use adk_rust::session::{CreateRequest, SessionService};
use futures::StreamExt;
use serde_json::json;

const QUESTION: &str = "What is 2+3? Use the calculator.";
const APP: &str = "peers";

fn cpu_s() -> f64 {
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(r.ru_utime) + t(r.ru_stime)
}

fn vm_hwm_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

struct Args {
    base_url: String,
    row: String,
    warmup: usize,
    seq: usize,
    seq_cap: Duration,
    conc: usize,
    total: usize,
    conc_cap: Duration,
    out: String,
}

fn args() -> Args {
    let mut m: HashMap<String, String> = HashMap::new();
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        m.insert(k.trim_start_matches("--").to_string(), v);
    }
    let get = |k: &str, d: &str| m.get(k).cloned().unwrap_or_else(|| d.to_string());
    let num = |k: &str, d: &str| get(k, d).parse::<f64>().unwrap_or_else(|_| panic!("--{k}"));
    Args {
        base_url: get("base-url", ""),
        row: get("row", "adk"),
        warmup: num("warmup", "20") as usize,
        seq: num("seq", "200") as usize,
        seq_cap: Duration::from_secs_f64(num("seq-cap-s", "60")),
        conc: num("conc", "200") as usize,
        total: num("total", "2000") as usize,
        conc_cap: Duration::from_secs_f64(num("conc-cap-s", "120")),
        out: get("out", "adk.json"),
    }
}

struct Bench {
    runner: Runner,
    sessions: Arc<dyn SessionService>,
}

impl Bench {
    async fn session(&self, sid: &str) -> std::result::Result<String, String> {
        self.sessions
            .create(CreateRequest {
                app_name: APP.to_string(),
                user_id: "user".to_string(),
                session_id: Some(sid.to_string()),
                state: HashMap::new(),
            })
            .await
            .map_err(|e| e.to_string())?;
        let question = format!("[s:{sid}] {QUESTION}");
        let mut stream = self
            .runner
            .run_str("user", sid, Content::new("user").with_text(question))
            .await
            .map_err(|e| e.to_string())?;
        let mut text = String::new();
        while let Some(event) = stream.next().await {
            let event = event.map_err(|e| e.to_string())?;
            if let Some(content) = event.llm_response.content {
                for part in content.parts {
                    if let Some(t) = part.text() {
                        text.push_str(t);
                    }
                }
            }
        }
        Ok(text)
    }
}

#[derive(Default)]
struct Outcome {
    errors: Vec<String>,
    error_count: usize,
}

async fn one(bench: &Bench, sid: String, outcome: &std::sync::Mutex<Outcome>) -> Option<f64> {
    let t0 = Instant::now();
    let r = bench.session(&sid).await;
    let wall = t0.elapsed().as_secs_f64();
    let err = match r {
        Ok(text) if text.contains('5') => return Some(wall),
        Ok(text) => format!("{sid}: final text {text:?} lacks \"5\""),
        Err(e) => format!("{sid}: {e}"),
    };
    let mut o = outcome.lock().unwrap();
    o.error_count += 1;
    if o.errors.len() < 20 {
        o.errors.push(err.chars().take(300).collect());
    }
    None
}

#[tokio::main]
async fn main() {
    let a = args();
    let assistant = agent::build(&a.base_url);
    let sessions: Arc<dyn SessionService> = Arc::new(InMemorySessionService::new());
    let runner = Runner::builder()
        .app_name(APP)
        .agent(Arc::new(assistant))
        .session_service(sessions.clone())
        .run_config(
            RunConfig::builder()
                .streaming_mode(StreamingMode::None)
                .build(),
        )
        .build()
        .expect("runner");
    let bench = Arc::new(Bench { runner, sessions });
    let outcome = Arc::new(std::sync::Mutex::new(Outcome::default()));

    for i in 0..a.warmup {
        one(&bench, format!("{}-w-{i}", a.row), &outcome).await;
    }

    let mut seq = BTreeMap::new();
    let (c0, t0) = (cpu_s(), Instant::now());
    let mut seq_n = 0;
    for i in 0..a.seq {
        let sid = format!("{}-s-{i}", a.row);
        seq_n += 1;
        if let Some(w) = one(&bench, sid.clone(), &outcome).await {
            seq.insert(sid, w);
        }
        if t0.elapsed() > a.seq_cap {
            break;
        }
    }
    let (seq_cpu, seq_elapsed) = (cpu_s() - c0, t0.elapsed().as_secs_f64());

    let started = Arc::new(AtomicU64::new(0));
    let conc = Arc::new(std::sync::Mutex::new(BTreeMap::new()));
    let (c1, t1) = (cpu_s(), Instant::now());
    let mut workers = Vec::new();
    for _ in 0..a.conc {
        let (bench, outcome, started, conc, row) = (
            bench.clone(),
            outcome.clone(),
            started.clone(),
            conc.clone(),
            a.row.clone(),
        );
        let (total, cap) = (a.total as u64, a.conc_cap);
        workers.push(tokio::spawn(async move {
            while t1.elapsed() <= cap {
                let i = started.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let sid = format!("{row}-c-{i}");
                if let Some(w) = one(&bench, sid.clone(), &outcome).await {
                    conc.lock().unwrap().insert(sid, w);
                }
            }
        }));
    }
    for w in workers {
        w.await.expect("worker");
    }
    let (conc_cpu, conc_elapsed) = (cpu_s() - c1, t1.elapsed().as_secs_f64());
    let conc_n = started.load(Ordering::Relaxed).min(a.total as u64);
    let conc = conc.lock().unwrap().clone();
    let outcome = outcome.lock().unwrap();

    let result = json!({
        "row": a.row,
        "pid": std::process::id(),
        "versions": {"adk-rust": env!("ADK_RUST_VERSION")},
        "warmup": a.warmup,
        "seq": {"n": seq_n, "ok": seq.len(), "cpu_s": seq_cpu, "elapsed_s": seq_elapsed, "wall_s": seq},
        "conc": {"n": conc_n, "ok": conc.len(), "concurrency": a.conc, "cpu_s": conc_cpu,
                 "elapsed_s": conc_elapsed, "wall_s": conc},
        "errors": outcome.errors,
        "error_count": outcome.error_count,
        "tool_calls": agent::TOOL_CALLS.load(Ordering::Relaxed),
        "vm_hwm_kb": vm_hwm_kb(),
        "measured": "process (in-process framework + this loop)",
    });
    std::fs::write(&a.out, serde_json::to_vec(&result).expect("json")).expect("write --out");
}
