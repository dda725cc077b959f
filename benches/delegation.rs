//! What asking another agent adds to a turn (issue #31): the same work
//! done by a plain tool call, and by an `ask_<agent>` call whose child
//! turn makes that tool call.
//!
//! bench client (reqwest, one turn at a time) ──HTTP──▶ cadre (Runtime::builder, redb, actors)
//!                                                         │ model calls
//!                                                         ▼
//!                                              mock model (0 ms; answers by the agent asking)
//!
//! - plain: agent `solo` (tool `noop`): the model asks for `noop`, then
//!   answers. 2 model calls, 1 tool call, 1 durable turn.
//! - delegated: agent `lead` asks `worker` (tool `noop`): the lead's model
//!   asks for `ask_worker`; the worker's turn (in its child session) calls
//!   `noop` and answers; the lead answers. 4 model calls, 2 tool calls (the
//!   ask and `noop`), 2 durable turns.
//!
//! Both run in this one process with the mock (its CPU is in the figures,
//! as the client's is); the modes alternate in blocks of [`BLOCK`] turns so
//! drift hits both. Reported: wall time per turn (p50, p99) and the
//! process's CPU per turn (getrusage), for each mode, and their difference:
//! what a delegation adds over a plain tool call. The second pair of model
//! calls is part of that difference, as it is of any delegation.
//!
//! Each session takes [`SESSION_TURNS`] turns, then the mode starts a
//! fresh one (made outside the timing), so the history stays short; the
//! lead's first ask in each opens its child session (in the figures).
//!
//! `cargo bench --bench delegation` (release); `CADRE_BENCH_TURNS=N` turns
//! per mode (default 600).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cadre::Runtime;
use cadre::model::ModelEndpoint;
use cadre::model::openai::ClientOptions;
use cadre::server_config::ServerConfig;
use cadre::tools::{FnHandler, ToolDefinition, ToolError};
use serde_json::{Value, json};

#[path = "../tests/support/mock_model.rs"]
mod mock_model;

use mock_model::{MockModel, Reply};

/// Turns of one mode before switching to the other.
const BLOCK: usize = 50;

/// Turns of one session before the mode starts a fresh one (sessions are
/// made outside the timed turns): the history a turn sends stays short
/// and the same for both modes. The lead's first ask in a session opens
/// its child session, so one turn in this many pays for that.
const SESSION_TURNS: usize = 10;

fn agent(name: &str, tools: &[&str], asks: &[&str]) -> String {
    let list = |xs: &[&str]| {
        xs.iter()
            .map(|x| format!("{x:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "name = {name:?}\ndescription = \"The {name} agent.\"\nsystem_prompt = \"You are {name}.\"\ntools = [{}]\nagents = [{}]\nmax_iterations = 3\nhistory_window = 1000\n",
        list(tools),
        list(asks)
    )
}

/// Which agent a request is for, and whether its turn got a tool result.
fn asker(request: &Value) -> (String, bool) {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let system = messages
        .first()
        .and_then(|m| m["content"].as_str())
        .unwrap_or("");
    let who = system
        .split("You are ")
        .nth(1)
        .and_then(|s| s.split('.').next())
        .unwrap_or("")
        .to_string();
    let last_user = messages
        .iter()
        .rposition(|m| m["role"] == "user")
        .unwrap_or(0);
    let answered = messages[last_user..].iter().any(|m| m["role"] == "tool");
    (who, answered)
}

/// CPU time of this process so far.
fn cpu() -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

struct Mode {
    name: &'static str,
    agent: &'static str,
    session: String,
    walls: Vec<Duration>,
    cpu: Duration,
}

fn main() {
    let turns: usize = std::env::var("CADRE_BENCH_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    let mock_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("mock runtime");
    let mock = mock_rt.block_on(MockModel::start());
    mock.set_keep_bodies(false);
    mock.set_responder(|request, _| match asker(request) {
        (who, false) if who == "solo" || who == "worker" => {
            Reply::tool_call("n1", "noop", r#"{"x":1}"#)
        }
        (who, false) if who == "lead" => {
            Reply::tool_call("a1", "ask_worker", r#"{"request":"do it"}"#)
        }
        (who, _) => Reply::text(&format!("{who} done")),
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let agents = dir.path().join("agents");
    std::fs::create_dir_all(&agents).unwrap();
    for (name, text) in [
        ("solo", agent("solo", &["noop"], &[])),
        ("lead", agent("lead", &[], &["worker"])),
        ("worker", agent("worker", &["noop"], &[])),
    ] {
        std::fs::write(agents.join(format!("{name}.toml")), text).unwrap();
    }
    let noop = ToolDefinition::new(
        "noop",
        "Does nothing.",
        json!({"type": "object", "properties": {"x": {"type": "integer"}}}),
    )
    .with_cache_ttl(0);
    let mut config = ServerConfig::default();
    config.api_limit.per_second = 1_000_000;
    config.api_limit.burst = 1_000_000;
    let runtime = Runtime::builder()
        .data_dir(dir.path().join("data"))
        .agents_dir(&agents)
        .listen("127.0.0.1:0".parse().expect("addr"))
        .model_endpoint(ModelEndpoint {
            base_url: Some(mock.base_url()),
            api_key: Some("bench".into()),
            model: Some("mock-model".into()),
        })
        .client_options(ClientOptions {
            request_timeout: Duration::from_secs(60),
            ..ClientOptions::default()
        })
        .config(config)
        .tool(
            noop,
            Arc::new(FnHandler(|_params: Value| async move {
                Ok::<_, ToolError>(json!({"ok": true}))
            })),
        )
        .start()
        .expect("cadre starts");
    let base = format!("http://{}", runtime.addr().expect("listening"));
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let http = reqwest::Client::new();
    let session = |agent: &str| -> String {
        client_rt.block_on(async {
            let body: Value = http
                .post(format!("{base}/v1/sessions"))
                .json(&json!({"agent": agent}))
                .send()
                .await
                .expect("session")
                .json()
                .await
                .expect("JSON");
            body["id"].as_str().expect("an id").to_string()
        })
    };
    let turn = |session: &str| {
        client_rt.block_on(async {
            let response = http
                .post(format!("{base}/v1/sessions/{session}/messages"))
                .json(&json!({"content": "go"}))
                .send()
                .await
                .expect("turn");
            assert!(response.status().is_success(), "{}", response.status());
            let body: Value = response.json().await.expect("JSON");
            assert!(body["answer"].as_str().is_some_and(|a| a.ends_with("done")));
        })
    };
    let mut modes = [
        Mode {
            name: "plain tool call",
            agent: "solo",
            session: session("solo"),
            walls: Vec::new(),
            cpu: Duration::ZERO,
        },
        Mode {
            name: "ask_<agent> (child turn + the same tool call)",
            agent: "lead",
            session: session("lead"),
            walls: Vec::new(),
            cpu: Duration::ZERO,
        },
    ];
    // Warm-up: connections, the child session, the actors.
    for m in &modes {
        for _ in 0..20 {
            turn(&m.session);
        }
    }
    let mut done = 0;
    while done < turns {
        for m in modes.iter_mut() {
            let block = BLOCK.min(turns - done);
            for i in 0..block {
                if i % SESSION_TURNS == 0 {
                    m.session = session(m.agent);
                }
                let cpu_before = cpu();
                let started = Instant::now();
                turn(&m.session);
                m.walls.push(started.elapsed());
                m.cpu += cpu() - cpu_before;
            }
        }
        done += BLOCK.min(turns - done);
    }
    println!(
        "delegation bench: {turns} turns per mode, one at a time, {SESSION_TURNS} per session, 0 ms mock model, {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "{:<48} {:>10} {:>10} {:>14}",
        "mode", "wall p50", "wall p99", "cpu/turn"
    );
    let mut figures = Vec::new();
    for m in modes.iter_mut() {
        m.walls.sort();
        let p50 = percentile(&m.walls, 0.5);
        let p99 = percentile(&m.walls, 0.99);
        let per_turn = m.cpu / m.walls.len() as u32;
        println!(
            "{:<48} {:>8.2}ms {:>8.2}ms {:>12.0}us",
            m.name,
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3,
            per_turn.as_secs_f64() * 1e6
        );
        figures.push((p50, per_turn));
    }
    let (plain, asked) = (figures[0], figures[1]);
    println!(
        "a delegation adds: wall p50 {:+.2} ms, cpu/turn {:+.0} us (2 more model calls and a child turn included)",
        (asked.0.as_secs_f64() - plain.0.as_secs_f64()) * 1e3,
        (asked.1.as_secs_f64() - plain.1.as_secs_f64()) * 1e6
    );
    drop(runtime);
}
