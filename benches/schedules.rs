//! Schedules (issue #33): how late a slot fires with many schedules due at
//! once, and what an idle schedule costs.
//!
//! bench client (reqwest) ──HTTP──▶ cadre (Runtime::builder, redb, the offline model)
//!
//! 1. Fire time: [`SCHEDULES`] schedules of `interval_s` [`INTERVAL_S`],
//!    each a turn in a new session, created back to back (so their slots
//!    spread over the seconds creating them took); after [`ROUNDS`]
//!    intervals every schedule's runs are read, and `fired_at − slot` (the
//!    fire recorded durably, just before its turn starts) is reported as
//!    p50, p99 and max, with how many fires there were and how many turns
//!    started.
//! 2. Idle cost: the process's CPU (getrusage) over [`IDLE_S`] seconds
//!    with no schedule, then with [`SCHEDULES`] schedules that do not fire
//!    in the window (`cron = "0 0 1 1 *"`), and the RSS each adds.
//!
//! `cargo bench --bench schedules` (release). `CADRE_BENCH_SCHEDULES`,
//! `CADRE_BENCH_INTERVAL_S`, `CADRE_BENCH_ROUNDS` and `CADRE_BENCH_IDLE_S`
//! change the defaults (1,000 schedules, 10 s, 3 rounds, 30 s).

use std::time::{Duration, Instant};

use cadre::Runtime;
use cadre::server_config::ServerConfig;
use serde_json::{Value, json};

const SCHEDULES: usize = 1_000;
const INTERVAL_S: u64 = 10;
const ROUNDS: u64 = 3;
const IDLE_S: u64 = 30;

const AGENT: &str =
    "name = \"tick\"\nsystem_prompt = \"You note the time.\"\ntools = []\nmax_iterations = 1\n";

fn env_or<T: std::str::FromStr>(var: &str, default: T) -> T {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU time of this process so far.
fn cpu() -> Duration {
    // SAFETY: getrusage fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Resident set size of this process, in bytes.
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let count: usize = env_or("CADRE_BENCH_SCHEDULES", SCHEDULES);
    let interval: u64 = env_or("CADRE_BENCH_INTERVAL_S", INTERVAL_S);
    let rounds: u64 = env_or("CADRE_BENCH_ROUNDS", ROUNDS);
    let idle_s: u64 = env_or("CADRE_BENCH_IDLE_S", IDLE_S);

    let dir = tempfile::tempdir().expect("temp dir");
    let agents = dir.path().join("agents");
    std::fs::create_dir_all(&agents).unwrap();
    std::fs::write(agents.join("tick.toml"), AGENT).unwrap();
    let mut config = ServerConfig::default();
    config.api_limit.per_second = 1_000_000;
    config.api_limit.burst = 1_000_000;
    let runtime = Runtime::builder()
        .data_dir(dir.path().join("data"))
        .agents_dir(&agents)
        .listen("127.0.0.1:0".parse().expect("addr"))
        .config(config)
        .start()
        .expect("cadre starts");
    let base = format!("http://{}", runtime.addr().expect("listening"));
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    // A fresh connection per request: the bench sleeps longer than the
    // server keeps an idle connection open.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    let post = |body: Value| -> String {
        client.block_on(async {
            let response = http
                .post(format!("{base}/v1/schedules"))
                .json(&body)
                .send()
                .await
                .expect("create");
            let status = response.status();
            let body: Value = response.json().await.expect("JSON");
            assert!(status.is_success(), "{status}: {body}");
            body["id"].as_str().expect("an id").to_string()
        })
    };
    let get = |path: String| -> Value {
        client.block_on(async {
            http.get(format!("{base}{path}"))
                .send()
                .await
                .expect("get")
                .json()
                .await
                .expect("JSON")
        })
    };
    let delete = |id: &str| {
        client.block_on(async {
            http.delete(format!("{base}/v1/schedules/{id}"))
                .send()
                .await
                .expect("delete");
        })
    };

    // 1. Fire time.
    let created = Instant::now();
    let ids: Vec<String> = (0..count)
        .map(|i| {
            post(json!({"agent": "tick", "message": format!("tick {i}"), "interval_s": interval}))
        })
        .collect();
    let took = created.elapsed();
    std::thread::sleep(Duration::from_secs(interval * rounds) + Duration::from_secs(2));
    let mut late = Vec::new();
    let mut started = 0usize;
    for id in &ids {
        let runs = get(format!("/v1/schedules/{id}/runs?limit=100"));
        for run in runs["runs"].as_array().into_iter().flatten() {
            let at = |k: &str| -> Option<jiff::Timestamp> { run[k].as_str()?.parse().ok() };
            if let (Some(slot), Some(fired)) = (at("slot"), at("fired_at")) {
                let d = fired.duration_since(slot);
                late.push(Duration::try_from(d).unwrap_or(Duration::ZERO));
            }
            if run["state"] == "started" {
                started += 1;
            }
        }
    }
    late.sort();
    println!(
        "fire time: {count} schedules of interval_s = {interval} created in {:.1} s; {} fires over {rounds} intervals, {started} turns started",
        took.as_secs_f64(),
        late.len()
    );
    if !late.is_empty() {
        println!(
            "  fired_at - slot: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            percentile(&late, 0.5).as_secs_f64() * 1e3,
            percentile(&late, 0.99).as_secs_f64() * 1e3,
            late.last().unwrap().as_secs_f64() * 1e3
        );
    }
    for id in &ids {
        delete(id);
    }

    // 2. Idle cost.
    std::thread::sleep(Duration::from_secs(2));
    let (cpu0, rss0) = (cpu(), rss());
    std::thread::sleep(Duration::from_secs(idle_s));
    let without = cpu() - cpu0;
    let idle: Vec<String> = (0..count)
        .map(|i| {
            post(json!({"agent": "tick", "message": format!("yearly {i}"), "cron": "0 0 1 1 *"}))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let (cpu1, rss1) = (cpu(), rss());
    std::thread::sleep(Duration::from_secs(idle_s));
    let with = cpu() - cpu1;
    println!(
        "idle: CPU over {idle_s} s: {:.3} s with no schedule, {:.3} s with {} idle ones; RSS {:.1} MiB -> {:.1} MiB ({:.1} KiB per schedule)",
        without.as_secs_f64(),
        with.as_secs_f64(),
        idle.len(),
        rss0 as f64 / 1048576.0,
        rss1 as f64 / 1048576.0,
        rss1.saturating_sub(rss0) as f64 / 1024.0 / idle.len().max(1) as f64
    );
    drop(runtime);
}
