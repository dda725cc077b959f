//! The start cost of the sandbox (issue #36: "≤ 5 ms added p50"): one
//! command tool call of a trivial command, sandboxed and not.
//!
//! ```text
//! bench ──ExternalHandler::call──▶ spawn (fork, [sandbox steps], exec echo) ──stdout──▶ JSON ──▶ wait
//!        ◀──────────────────────── wall time of the whole call ─────────────────────────────────┘
//! ```
//!
//! The handler is the one a tool file's `command: ["echo", "{}"]` gets
//! (`cadre::tools::external`), so the figure is what a call pays: a
//! sandboxed call adds its scratch dir (made and removed), its Landlock
//! ruleset (each allowed path opened and added as a rule: a few hundred
//! here, `/etc` being opened child by child), and in the child the uid
//! change (root), the user and mount namespaces, the mounts (the scratch
//! dir on `/tmp`, every other mount read-only), the rlimits, Landlock
//! and seccomp. Runs alternate by block (plain, then
//! sandboxed, `BLOCK` calls each) so drift hits both; the first block of
//! each is a warm-up and not counted.
//!
//! `cargo bench --bench sandbox` (N: `SANDBOX_BENCH_N`, default 1000 calls
//! of each kind).

use std::sync::Arc;
use std::time::{Duration, Instant};

use cadre::tools::external::ExternalHandler;
use cadre::tools::sandbox::{LimitsOverride, Sandbox};
use cadre::tools::{CallerType, ExecutionContext, ToolHandler};
use serde_json::json;

const BLOCK: usize = 50;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

async fn block(handler: &ExternalHandler, ctx: &ExecutionContext, out: &mut Vec<Duration>) {
    for _ in 0..BLOCK {
        let started = Instant::now();
        let answer = handler.call(json!({}), ctx).await.expect("echo answers");
        out.push(started.elapsed());
        assert_eq!(answer, json!({}));
    }
}

fn main() {
    let n: usize = std::env::var("SANDBOX_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let dir = std::env::temp_dir();
    let argv = || vec!["echo".to_string(), "{}".to_string()];
    let plain = ExternalHandler::command(argv(), dir.clone(), 1 << 20);
    let setup = Instant::now();
    let policy = Sandbox::default()
        .policy(
            std::slice::from_ref(&dir),
            &[],
            false,
            &LimitsOverride::default(),
        )
        .expect("this kernel can sandbox");
    let policy_build = setup.elapsed();
    let sandboxed =
        ExternalHandler::command(argv(), dir.clone(), 1 << 20).sandboxed(policy.clone());
    let ctx = ExecutionContext::new(CallerType::Direct, "bench");
    let (mut a, mut b) = (Vec::new(), Vec::new());
    runtime.block_on(async {
        // Warm-up: not counted.
        block(&plain, &ctx, &mut Vec::new()).await;
        block(&sandboxed, &ctx, &mut Vec::new()).await;
        while a.len() < n {
            block(&plain, &ctx, &mut a).await;
            block(&sandboxed, &ctx, &mut b).await;
        }
    });
    let prepare = {
        let policy = Arc::clone(policy.as_ref().expect("sandbox on"));
        let mut times: Vec<Duration> = (0..200)
            .map(|_| {
                let t = Instant::now();
                let jail = policy.prepare().expect("a jail");
                drop(jail);
                t.elapsed()
            })
            .collect();
        times.sort();
        percentile(&times, 0.5)
    };
    a.sort();
    b.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "sandbox start cost, {} calls of `echo {{}}` each, {} cores",
        a.len(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!("{:<12} {:>9} {:>9}", "mode", "p50 ms", "p99 ms");
    for (name, t) in [("plain", &a), ("sandboxed", &b)] {
        println!(
            "{name:<12} {:>9.3} {:>9.3}",
            ms(percentile(t, 0.5)),
            ms(percentile(t, 0.99))
        );
    }
    println!(
        "added p50 {:.3} ms, p99 {:.3} ms; policy built once per tool in {:.3} ms; prepare (scratch dir + ruleset) p50 {:.3} ms",
        ms(percentile(&b, 0.5)) - ms(percentile(&a, 0.5)),
        ms(percentile(&b, 0.99)) - ms(percentile(&a, 0.99)),
        ms(policy_build),
        ms(prepare)
    );
}
