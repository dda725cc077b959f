//! Executor benchmarks: the cost cadre adds to one tool call.
//!
//! - `admission/limits_validation_concurrency`: the checks every call passes
//!   before its handler runs (governor rate limit with three windows, JSON
//!   Schema validation with defaults, a slot of the concurrency pool taken
//!   and given back), on the components themselves.
//! - `executor/noop_calls_10k`: 10,000 concurrent no-op calls through the
//!   whole executor actor (lookup, plan, limits, validation, cache miss,
//!   pool, spawned handler, record written to redb, events). Throughput is
//!   reported by criterion as elements (calls) per second.
//!
//! Run: `cargo bench --bench executor`.

use std::sync::Arc;
use std::time::Duration;

use cadre::Runtime;
use cadre::executor::concurrency::{AdmissionRequest, ConcurrencyConfig, ConcurrencyController};
use cadre::executor::limits::RateLimiter;
use cadre::executor::{Arguments, ExecuteTool};
use cadre::server_config::ServerConfig;
use cadre::tools::validate::ParamValidator;
use cadre::tools::{CallerType, ExecutionContext, FnHandler, RateLimit, ToolDefinition, ToolError};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};

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

fn admission(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let limiter = RateLimiter::new();
    let limit = RateLimit {
        per_minute: Some(u32::MAX / 2),
        per_hour: Some(u32::MAX / 2),
        per_day: Some(u32::MAX / 2),
    };
    let validator = ParamValidator::new(&schema(), false).unwrap();
    let pool = ConcurrencyController::new(ConcurrencyConfig::default());
    let params = json!({"symbol": "AAPL", "limit": 5});
    let mut group = c.benchmark_group("admission");
    group.throughput(Throughput::Elements(1));
    group.bench_function("limits_validation_concurrency", |b| {
        b.to_async(&rt).iter(|| async {
            limiter.check("get_ohlcv", &limit, "user-1").unwrap();
            let validated = validator.validate(params.clone()).unwrap();
            let permit = pool.acquire(AdmissionRequest::new("market")).await.unwrap();
            drop(permit);
            validated
        })
    });
    group.finish();
}

fn noop_calls(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let agents = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::default();
    config.concurrency.max_concurrent = 10_000;
    config.concurrency.queue_size = 10_000;
    let noop =
        ToolDefinition::new("noop", "does nothing", json!({"type": "object"})).with_cache_ttl(0);
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .agents_dir(agents.path())
        .config(config)
        .tool(
            noop,
            Arc::new(FnHandler(|_p: Value| async {
                Ok::<_, ToolError>(json!({}))
            })),
        )
        .start()
        .unwrap();
    let executor = runtime.executor().clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    const N: usize = 10_000;
    let mut group = c.benchmark_group("executor");
    group.throughput(Throughput::Elements(N as u64));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(20));
    group.bench_function("noop_calls_10k", |b| {
        b.to_async(&rt).iter(|| {
            let executor = executor.clone();
            async move {
                let calls = (0..N).map(|i| {
                    let mut ctx = ExecutionContext::new(CallerType::ConversationAgent, "bench");
                    ctx.conversation_id = Some(format!("bench-{}", i % 100));
                    executor.execute(ExecuteTool::new("noop", Arguments::Json(json!({})), ctx))
                });
                let results = futures::future::join_all(calls).await;
                assert!(results.iter().all(|r| r.is_success));
            }
        })
    });
    group.finish();
    drop(runtime);
}

criterion_group!(benches, admission, noop_calls);
criterion_main!(benches);
