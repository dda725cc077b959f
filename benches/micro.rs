//! Micro-benchmarks: the pieces of a turn that cadre itself pays for, one at
//! a time (criterion).
//!
//! turn ─▶ context built (machine) ─▶ model ─▶ governor · validation (executor) ─▶ tool
//!      ─▶ messages appended (store writer; one durable commit per turn)
//!
//! - `validation/*`: `ParamValidator` on a typical tool call: the model's raw
//!   argument string (parsed, defaults filled, schema checked), and an
//!   already-parsed value.
//! - `governor/check_3_windows`: `RateLimiter::check` of a tool with minute,
//!   hour and day limits, for one user and for 10,000 users in turn.
//! - `store/*`: `Store::write` of `WriteOp::AppendMessages` on a real file:
//!   one message and a batch of 64, durable (`Durability::Immediate`: an
//!   fsync) and not; 64 concurrent one-message durable writers (what group
//!   commit turns into one transaction); and the disk's own
//!   `write 512 B + File::sync_all` beside them, the floor of every durable
//!   figure.
//! - `context/*`: `ConversationMachine::start_turn` on a machine holding a
//!   20-message window (the request the model gets: the layered system
//!   prompt, history, tools), and a whole tool-calling turn through the
//!   machine (three requests built, four messages, the rolling summary's
//!   request built and applied, as the actor does after every turn once the
//!   window is full).
//!
//! The executor's admission path (limits + validation + a pool slot) is in
//! `benches/executor.rs`. Run: `cargo bench --bench micro` (criterion
//! filters work: `cargo bench --bench micro -- store`).

use std::fs::OpenOptions;
use std::io::Write;
use std::time::{Duration, Instant};

use cadre::conversation::context::PromptLayers;
use cadre::conversation::machine::{ConversationMachine, TurnSettings};
use cadre::executor::limits::RateLimiter;
use cadre::model::{ChatMessage, ChatResponse, ToolCall, ToolSpec};
use cadre::store::{Store, StoredMessage, WriteOp};
use cadre::tools::validate::ParamValidator;
use cadre::tools::{RateLimit, ToolExecutionResult};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use jiff::Timestamp;
use serde_json::{Value, json};

/// A tool schema of the usual shape: a required string with a pattern, an
/// enum and an integer range with defaults, nothing else allowed.
fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "symbol": {"type": "string", "pattern": "^[A-Z]{1,5}$"},
            "timeframe": {"type": "string", "enum": ["1d", "1w"], "default": "1d"},
            "limit": {"type": "integer", "minimum": 1, "maximum": 500, "default": 100}
        },
        "required": ["symbol"],
        "additionalProperties": false
    })
}

fn validation(c: &mut Criterion) {
    let validator = ParamValidator::new(&schema(), false).unwrap();
    let raw = r#"{"symbol": "AAPL", "limit": 5}"#;
    let parsed = json!({"symbol": "AAPL", "limit": 5});
    let mut group = c.benchmark_group("validation");
    group.throughput(Throughput::Elements(1));
    group.bench_function("raw_arguments", |b| {
        b.iter(|| validator.validate_raw(std::hint::black_box(raw)).unwrap())
    });
    group.bench_function("parsed_value", |b| {
        b.iter_batched(
            || parsed.clone(),
            |v| validator.validate(v).unwrap(),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

fn governor(c: &mut Criterion) {
    let limiter = RateLimiter::new();
    let limit = RateLimit {
        per_minute: Some(u32::MAX / 2),
        per_hour: Some(u32::MAX / 2),
        per_day: Some(u32::MAX / 2),
    };
    let users: Vec<String> = (0..10_000).map(|i| format!("user-{i}")).collect();
    let mut group = c.benchmark_group("governor");
    group.throughput(Throughput::Elements(1));
    group.bench_function("check_3_windows", |b| {
        b.iter(|| limiter.check("get_ohlcv", &limit, "user-1").unwrap())
    });
    let mut next = 0;
    group.bench_function("check_3_windows_10k_users", |b| {
        b.iter(|| {
            next = (next + 1) % users.len();
            limiter.check("get_quote", &limit, &users[next]).unwrap()
        })
    });
    group.finish();
}

/// A message of a tool-calling turn's size (the tool result, the largest).
fn stored(seq: u64) -> StoredMessage {
    let call = ToolCall {
        id: format!("call_{seq}"),
        name: "calculator".into(),
        arguments: r#"{"expression":"(2+3)*4"}"#.into(),
    };
    StoredMessage {
        seq,
        message: ChatMessage::tool_result(
            &call,
            r#"{"expression":"(2+3)*4","formatted":"20","result":20.0}"#,
        ),
        created_at: Timestamp::now(),
        rolled_back: false,
    }
}

fn store(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut seq = 0u64;
    let mut append = |n: usize| {
        let messages = (0..n)
            .map(|_| {
                seq += 1;
                stored(seq)
            })
            .collect();
        vec![WriteOp::AppendMessages {
            session_id: "bench-session".into(),
            messages,
        }]
    };

    let mut group = c.benchmark_group("store");
    group.sample_size(50);
    group.measurement_time(Duration::from_secs(8));
    for (name, n, durable) in [
        ("append_1_durable", 1, true),
        ("append_1_non_durable", 1, false),
        ("append_64_durable", 64, true),
        ("append_64_non_durable", 64, false),
    ] {
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(name, |b| {
            b.to_async(&rt).iter_batched(
                || append(n),
                |ops| {
                    let store = store.clone();
                    async move { store.write(ops, durable).await.unwrap() }
                },
                BatchSize::SmallInput,
            )
        });
    }
    // Group commit: 64 turns finishing at once share one transaction.
    const WRITERS: usize = 64;
    group.throughput(Throughput::Elements(WRITERS as u64));
    group.bench_function("append_1_durable_x64_concurrent", |b| {
        b.to_async(&rt).iter_batched(
            || (0..WRITERS).map(|_| append(1)).collect::<Vec<_>>(),
            |batches| {
                let store = store.clone();
                async move {
                    let writes = batches.into_iter().map(|ops| {
                        let store = store.clone();
                        tokio::spawn(async move { store.write(ops, true).await })
                    });
                    for w in futures::future::join_all(writes).await {
                        w.unwrap().unwrap();
                    }
                }
            },
            BatchSize::SmallInput,
        )
    });
    // The floor: the same disk's fsync after a small write.
    let probe = dir.path().join("fsync-probe");
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&probe)
        .unwrap();
    group.throughput(Throughput::Elements(1));
    group.bench_function("fsync_512b_baseline", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                file.write_all(&[0xA5; 512]).unwrap();
                let started = Instant::now();
                file.sync_all().unwrap();
                total += started.elapsed();
            }
            total
        })
    });
    group.finish();
    drop(store);
}

fn settings() -> TurnSettings {
    let calculator = ToolSpec {
        name: "calculator".into(),
        description: "Evaluate an arithmetic expression: + - * / % ^, parentheses, unary minus, \
                      decimals, sqrt, abs, min, max, round."
            .into(),
        parameters: json!({
            "type": "object",
            "properties": {"expression": {"type": "string", "minLength": 1, "maxLength": 1000,
                "description": "The arithmetic expression, e.g. '(2+3)*4'"}},
            "required": ["expression"],
            "additionalProperties": false
        }),
    };
    let echo = ToolSpec {
        name: "echo".into(),
        description: "Return the message unchanged.".into(),
        parameters: json!({
            "type": "object",
            "properties": {"message": {"type": "string"}},
            "required": ["message"]
        }),
    };
    TurnSettings {
        layers: PromptLayers {
            base_prompt: "You are a helpful assistant. Use the calculator for any arithmetic \
                          instead of computing in your head, and report its result."
                .into(),
            brevity: true,
            ..PromptLayers::default()
        },
        model: "gpt-4o-mini".into(),
        tools: vec![calculator, echo].into(),
        max_iterations: 3,
        history_window: 20,
        temperature: None,
        max_tokens: None,
        tool_variables: Value::Null,
        cache_ttl: None,
        max_tool_calls: cadre::conversation::machine::DEFAULT_MAX_TOOL_CALLS as u32,
        pause_for_approval: true,
        rules: None,
    }
}

/// Five tool-calling turns of four messages each: a full 20-message window,
/// numbered 1..=20.
fn history() -> Vec<(u64, ChatMessage)> {
    let mut h = Vec::new();
    for i in 0..5 {
        let call = ToolCall {
            id: format!("call_{i}"),
            name: "calculator".into(),
            arguments: format!(r#"{{"expression":"({i}+3)*4"}}"#),
        };
        h.push(ChatMessage::user(format!("what is ({i}+3)*4?")));
        h.push(ChatMessage::assistant_tool_calls(None, vec![call.clone()]));
        h.push(ChatMessage::tool_result(
            &call,
            format!(r#"{{"expression":"({i}+3)*4","result":{}}}"#, (i + 3) * 4),
        ));
        h.push(ChatMessage::assistant(format!(
            "({i}+3)*4 = {}",
            (i + 3) * 4
        )));
    }
    h.into_iter().zip(1..).map(|(m, seq)| (seq, m)).collect()
}

fn context(c: &mut Criterion) {
    let mut machine = ConversationMachine::new(settings(), history(), None, 20);
    let mut group = c.benchmark_group("context");
    group.throughput(Throughput::Elements(1));
    group.bench_function("start_turn_window_20", |b| {
        b.iter(|| machine.start_turn("what is (2+3)*4?".into(), "t".into(), None))
    });
    let mut machine = ConversationMachine::new(settings(), history(), None, 20);
    let call = ToolCall {
        id: "call_x".into(),
        name: "calculator".into(),
        arguments: r#"{"expression":"(2+3)*4"}"#.into(),
    };
    let result = ToolExecutionResult::success(
        "calculator",
        json!({"expression": "(2+3)*4", "formatted": "20", "result": 20.0}),
        Duration::from_micros(5),
        1,
    );
    group.bench_function("tool_calling_turn_window_20", |b| {
        b.iter(|| {
            machine
                .start_turn("what is (2+3)*4?".into(), "t".into(), None)
                .unwrap();
            machine
                .on_model_reply(ChatResponse {
                    content: None,
                    tool_calls: vec![call.clone()],
                    usage: None,
                    finish_reason: None,
                })
                .unwrap();
            machine
                .on_tool_results(vec![(call.clone(), result.clone())])
                .unwrap();
            let finish = machine
                .on_model_reply(ChatResponse {
                    content: Some("(2+3)*4 = 20".into()),
                    tool_calls: Vec::new(),
                    usage: None,
                    finish_reason: None,
                })
                .unwrap();
            // As the actor does after each turn: the four messages the
            // window no longer holds are summarised and leave memory.
            if machine.summary_request().is_some() {
                machine.on_summary(Some("The user asked for arithmetic.".into()));
            }
            finish
        })
    });
    group.finish();
}

criterion_group!(benches, validation, governor, store, context);
criterion_main!(benches);
