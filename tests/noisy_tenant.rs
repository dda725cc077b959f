//! A measurement, not a check (ignored; run it by hand): how much one
//! tenant's large messages slow another tenant's turns, and where the time
//! goes (issue #29 item 8: 256 KiB messages from one tenant took other
//! tenants' turns from 2-6 ms to a p50 of 0.6-1.5 s).
//!
//! cargo build --release && cargo test --release --test noisy_tenant -- --ignored --nocapture
//!
//! The server inherits the environment: `CADRE_TENANTS_WRITE_KIB_PER_S=0`
//! turns the tenants' write share off, for the figure without it
//! (`src/conversation/storage.rs`).
//!
//! The quiet tenant runs turns one after another, alone and then while the
//! noisy tenant's sessions send 256 KiB messages without pause. Printed:
//! the quiet turns' latency (p50, p95, max), and per phase the mean of the
//! server's own histograms (turn, model call, store commit) and the
//! commits' count, from `/metrics`.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::header::AUTHORIZATION;
use serde_json::json;
use support::{MockModel, Reply, agent_toml, agents_dir};

const QUIET_TURNS: usize = 60;
const NOISY_SESSIONS: usize = 8;
const BIG: usize = 256 * 1024;

struct Caller {
    base: String,
    client: reqwest::Client,
    key: String,
}

impl Caller {
    async fn session(&self) -> String {
        let r: serde_json::Value = self
            .client
            .post(format!("{}/v1/sessions", self.base))
            .header(AUTHORIZATION, format!("Bearer {}", self.key))
            .json(&json!({"agent": "plain"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        r["id"].as_str().unwrap().to_string()
    }

    /// The answer's status; `None` when the connection ended without one
    /// (a refusal sent before the whole body was read closes it).
    async fn say(&self, session: &str, content: &str) -> Option<reqwest::StatusCode> {
        self.client
            .post(format!("{}/v1/sessions/{session}/messages", self.base))
            .header(AUTHORIZATION, format!("Bearer {}", self.key))
            .json(&json!({"content": content}))
            .send()
            .await
            .ok()
            .map(|r| r.status())
    }
}

/// `(sum, count)` of a histogram in the `/metrics` text.
fn histogram(metrics: &str, name: &str) -> (f64, f64) {
    let value = |suffix: &str| {
        metrics
            .lines()
            .filter(|l| l.starts_with(&format!("{name}_{suffix}")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    (value("sum"), value("count"))
}

async fn metrics(c: &Caller) -> String {
    c.client
        .get(format!("{}/metrics", c.base))
        .header(AUTHORIZATION, format!("Bearer {}", c.key))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn quiet_phase(quiet: &Caller, admin: &Caller, label: &str) {
    let before = metrics(admin).await;
    let session = quiet.session().await;
    let mut took = Vec::new();
    for i in 0..QUIET_TURNS {
        let t = Instant::now();
        let status = quiet.say(&session, &format!("question {i}")).await;
        assert!(status.is_some_and(|s| s.is_success()), "{status:?}");
        took.push(t.elapsed());
    }
    let after = metrics(admin).await;
    took.sort();
    print!(
        "{label}: quiet turns p50 {:?} p95 {:?} max {:?};",
        percentile(&took, 0.5),
        percentile(&took, 0.95),
        took.last().unwrap()
    );
    for name in [
        "cadre_turn_duration_seconds",
        "cadre_model_call_duration_seconds",
        "cadre_store_commit_duration_seconds",
    ] {
        let (s0, c0) = histogram(&before, name);
        let (s1, c1) = histogram(&after, name);
        let n = c1 - c0;
        print!(
            " {name}: n {n}, mean {:.2} ms;",
            if n > 0.0 { (s1 - s0) / n * 1000.0 } else { 0.0 }
        );
    }
    println!();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn one_tenants_large_messages_and_another_tenants_turns() {
    let model = MockModel::start().await;
    model.set_keep_bodies(false);
    model.set_default(Some(Reply::text("ok")));
    let data = tempfile::tempdir().unwrap();
    let store = support::store::open_store(data.path());
    let mut keys = Vec::new();
    for (tenant, admin) in [("quiet", false), ("noisy", false), ("ops", true)] {
        let (key, _) = cadre::tenants::create_key(&store, tenant, admin)
            .await
            .unwrap();
        keys.push(key);
    }
    drop(store);
    let agents = agents_dir(&[("plain.toml", &agent_toml("plain", &[], 1))]);
    // The real binary in its own process: the test's own work (the mock
    // reading the noisy prompts) is not cadre's.
    let (dir, agents_path, url) = (
        data.path().to_path_buf(),
        agents.path().to_path_buf(),
        model.base_url(),
    );
    let server = tokio::task::spawn_blocking(move || {
        support::server::Server::start(&dir, &agents_path, &url, &[])
    })
    .await
    .unwrap();
    let caller = |key: &str| Caller {
        base: server.base.clone(),
        client: reqwest::Client::new(),
        key: key.to_string(),
    };
    let (quiet, noisy, admin) = (caller(&keys[0]), caller(&keys[1]), caller(&keys[2]));

    quiet_phase(&quiet, &admin, "alone").await;

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let noisy = Arc::new(noisy);
    let big = "x".repeat(BIG);
    let mut tasks = Vec::new();
    for _ in 0..NOISY_SESSIONS {
        let (noisy, stop, sent, refused, big) = (
            noisy.clone(),
            stop.clone(),
            sent.clone(),
            refused.clone(),
            big.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let session = noisy.session().await;
            while !stop.load(Ordering::Relaxed) {
                match noisy.say(&session, &big).await {
                    Some(s) if s.is_success() => sent.fetch_add(1, Ordering::Relaxed),
                    _ => refused.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let started = Instant::now();
    let at_start = sent.load(Ordering::Relaxed);
    let refused_at_start = refused.load(Ordering::Relaxed);
    quiet_phase(&quiet, &admin, "with noise").await;
    let noisy_turns = sent.load(Ordering::Relaxed) - at_start;
    let noisy_refused = refused.load(Ordering::Relaxed) - refused_at_start;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    println!(
        "noisy tenant: {NOISY_SESSIONS} sessions, {noisy_turns} turns of {} KiB in {:?} \
         ({noisy_refused} refused or cut)",
        BIG / 1024,
        started.elapsed()
    );
    let size: u64 = std::fs::read_dir(data.path())
        .unwrap()
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    println!("data dir: {} MiB", size / (1024 * 1024));
}
