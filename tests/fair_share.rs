//! Fair shares of the tool pool between tenants, against the real binary.
//!
//! Tenant B floods the pool with long `sleep` calls, far past the slots and
//! the queue; tenant A's `calculator` calls keep being admitted, because B
//! holds at most its share of the slots (`max_per_tenant`, half the pool by
//! default) and of the queue, and is refused with `TOOL_QUEUE_FULL` past it.
//! The pool wait is bounded (`default_timeout_s = 5`) far below B's sleeps,
//! so an A call that had to wait for one of B's slots would fail with
//! `TOOL_TIMEOUT`, not just be slow: "no longer than one slot's turn" is checked
//! as an outcome, never as a timing. The flood is bounded in count (13 of
//! B's calls) and in time (the server is killed at the end of the test,
//! B's sleeps with it); everything is on loopback.
//!
//! A's p99 wait under the flood is measured outside the suite, by the
//! ignored [`a_p99_under_b_flood`]:
//! `cargo test --locked --test fair_share -- --ignored --nocapture`
//! (prints the percentiles; it asserts only that A's calls succeed).

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::server::Server;
use support::{Client, repo_agents};

/// Upper bound for anything the test waits for.
const PATIENCE: Duration = Duration::from_secs(20);

/// 4 slots, so 2 per tenant; 8 places, so 4 per tenant.
const ENV: [(&str, &str); 5] = [
    ("CADRE_CONCURRENCY_MAX_CONCURRENT", "4"),
    ("CADRE_CONCURRENCY_QUEUE_SIZE", "8"),
    ("CADRE_CONCURRENCY_DEFAULT_TIMEOUT_S", "5"),
    ("CADRE_API_LIMIT_PER_SECOND", "10000"),
    ("CADRE_API_LIMIT_BURST", "10000"),
];

/// Creates one key per tenant in `dir`'s database, before the server opens it.
/// The last key is an admin's of tenant `ops`: it reads the pool's live
/// counters (`GET /v1/limits` shows a tenant's key its limits only).
async fn create_keys(dir: &Path, tenants: &[&str]) -> Vec<String> {
    let store = cadre::store::Store::open(dir).expect("open the data dir");
    let mut keys = Vec::new();
    for tenant in tenants {
        let (key, _) = cadre::tenants::create_key(&store, tenant, false)
            .await
            .expect("key created");
        keys.push(key);
    }
    let (admin, _) = cadre::tenants::create_key(&store, "ops", true)
        .await
        .expect("admin key created");
    keys.push(admin);
    drop(store);
    keys
}

/// The `concurrency` object of `GET /v1/limits` once `check` holds on it;
/// fails after [`PATIENCE`]. For states with no signal (a call queued).
async fn pool_when(client: &Client, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (status, body) = client.get("/v1/limits").await;
        if status == StatusCode::OK && check(&body["concurrency"]) {
            return body["concurrency"].clone();
        }
        assert!(
            Instant::now() < deadline,
            "/v1/limits never showed {what}; last: {body}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// The binary over a data dir holding one key for each of two tenants;
/// a client for A (bounded by [`PATIENCE`]) and one for B.
struct TwoTenants {
    server: Server,
    a: Client,
    b: Client,
    admin: Client,
    _dir: tempfile::TempDir,
}

async fn two_tenants() -> TwoTenants {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let [a_key, b_key, admin_key] =
        <[String; 3]>::try_from(create_keys(&data, &["tenant-a", "tenant-b"]).await)
            .expect("three keys");
    let server = tokio::task::spawn_blocking(move || {
        Server::start_offline_with(&data, &repo_agents(), &ENV)
    })
    .await
    .expect("server started");
    let a = server.client().with_key(&a_key).with_timeout(PATIENCE);
    let b = server.client().with_key(&b_key);
    let admin = server.client().with_key(&admin_key);
    TwoTenants {
        server,
        a,
        b,
        admin,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_flooding_the_pool_with_sleeps_leaves_the_other_tenant_its_share() {
    let TwoTenants {
        server,
        a,
        b,
        admin,
        _dir,
    } = two_tenants().await;

    // B's flood: 12 sleeps of a minute at once, three times the pool.
    let flood = json!({"params": {"ms": 60_000}});
    let sleeping: Vec<_> = (0..12)
        .map(|_| b.spawn_post("/v1/tools/sleep/invoke", flood.clone()))
        .collect();
    let pool = pool_when(&admin, "all of B's 12 calls placed or refused", |c| {
        n(&c["current_concurrent"]) + n(&c["queue_length"]) + n(&c["total_rejected"]) == 12
    })
    .await;
    assert_eq!(
        pool["current_concurrent"], 2,
        "B holds only its share: {pool}"
    );
    assert_eq!(pool["queue_length"], 4, "B queues only its share: {pool}");
    assert_eq!(pool["total_rejected"], 6, "{pool}");
    assert_eq!(pool["max_per_tenant"], 2, "{pool}");
    assert_eq!(pool["max_queued_per_tenant"], 4, "{pool}");
    assert_eq!(pool["tenants_running"], 1, "{pool}");
    assert_eq!(pool["tenants_waiting"], 1, "{pool}");

    // Past its share, B is refused at once, with the reason.
    let (status, body) = b.post("/v1/tools/sleep/invoke", &flood).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error_type"], "TOOL_QUEUE_FULL", "{body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(error.contains("share of the wait queue"), "{body}");

    // A's calls keep being admitted, four at a time (twice A's share, so
    // half of them wait for a turn of A's own calculator calls, never for
    // one of B's sleeps: that wait would end in `TOOL_TIMEOUT` after 5 s).
    let mut latencies = Vec::new();
    for round in 0..5 {
        let calls: Vec<_> = (0..4)
            .map(|i| {
                let expression = format!("{round} * 10 + {i}");
                let body = json!({"params": {"expression": expression}});
                let a = a.clone();
                tokio::spawn(async move {
                    let started = Instant::now();
                    let answer = a.post("/v1/tools/calculator/invoke", &body).await;
                    (answer, started.elapsed())
                })
            })
            .collect();
        for (i, call) in calls.into_iter().enumerate() {
            let ((status, body), took) = call.await.expect("A's call finished");
            assert_eq!(status, StatusCode::OK, "A's call under B's flood: {body}");
            assert_eq!(body["output"]["result"], json!((round * 10 + i) as f64));
            latencies.push(took);
        }
    }
    latencies.sort_unstable();
    eprintln!(
        "A's calculator calls under B's flood: {} calls, max {:?} (not asserted)",
        latencies.len(),
        latencies.last().expect("calls made")
    );

    // A's chat turns too: the offline model asks for the calculator, whose
    // call goes through the same pool during B's flood.
    let session = a.session("assistant").await;
    for question in ["What is 6*7?", "What is (2+3)*4?"] {
        let (status, turn) = a
            .post(
                &format!("/v1/sessions/{session}/messages"),
                &json!({ "content": question }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "A's turn under B's flood: {turn}");
        assert_eq!(turn["tool_calls"][0]["name"], "calculator", "{turn}");
        assert_eq!(turn["tool_calls"][0]["is_success"], true, "{turn}");
    }

    // B's flood is untouched by A's calls: same share, same queue.
    let pool = pool_when(&admin, "A's calls all released", |c| {
        c["current_concurrent"] == 2
    })
    .await;
    assert_eq!(pool["queue_length"], 4, "{pool}");
    assert_eq!(pool["total_rejected"], 7, "A was never refused: {pool}");
    assert_eq!(pool["total_timeout"], 0, "nobody waited past 5 s: {pool}");

    for call in sleeping {
        call.abort();
    }
    drop(server);
}

/// A's `calls` calculator calls, 4 at a time (twice its share): each
/// one's round trip and its `execution_time_ms` (admission wait + run, an
/// upper bound of the wait), in ms.
async fn a_calls(a: &Client, calls: usize) -> (Vec<f64>, Vec<f64>) {
    let mut round_trips = Vec::new();
    let mut in_executor = Vec::new();
    for chunk in 0..calls / 4 {
        let batch: Vec<_> = (0..4)
            .map(|i| {
                let a = a.clone();
                let body = json!({"params": {"expression": format!("{chunk} + {i}")}});
                tokio::spawn(async move {
                    let started = Instant::now();
                    let (status, body) = a.post("/v1/tools/calculator/invoke", &body).await;
                    (status, body, started.elapsed())
                })
            })
            .collect();
        for call in batch {
            let (status, body, took) = call.await.expect("A's call finished");
            assert_eq!(status, StatusCode::OK, "{body}");
            round_trips.push(took.as_secs_f64() * 1000.0);
            in_executor.push(body["execution_time_ms"].as_f64().unwrap_or(f64::NAN));
        }
    }
    (round_trips, in_executor)
}

fn percentiles(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    let at = |p: f64| v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1];
    format!(
        "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        at(0.50),
        at(0.99),
        at(1.0)
    )
}

/// The measurement behind the figure in the note: A's 400
/// `calculator` calls, 4 at a time, first alone, then while B keeps the
/// pool flooded (12 one-minute sleeps, then 4 loops re-sending sleeps that
/// are refused). Prints p50 / p99 / max of both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run by hand: --ignored --nocapture"]
async fn a_p99_under_b_flood() {
    const CALLS: usize = 400;
    let TwoTenants {
        server,
        a,
        b,
        admin,
        _dir,
    } = two_tenants().await;
    let (alone, alone_in_executor) = a_calls(&a, CALLS).await;

    let flood = json!({"params": {"ms": 60_000}});
    let sleeping: Vec<_> = (0..12)
        .map(|_| b.spawn_post("/v1/tools/sleep/invoke", flood.clone()))
        .collect();
    pool_when(&admin, "B's flood in place", |c| c["queue_length"] == 4).await;
    let hammering: Vec<_> = (0..4)
        .map(|_| {
            let (b, flood) = (b.clone(), flood.clone());
            tokio::spawn(async move {
                loop {
                    let (status, _) = b.post("/v1/tools/sleep/invoke", &flood).await;
                    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
                }
            })
        })
        .collect();
    let (flooded, flooded_in_executor) = a_calls(&a, CALLS).await;
    let pool = pool_when(&admin, "the pool", |_| true).await;
    for task in hammering.iter().chain(&sleeping) {
        task.abort();
    }
    println!("A: {CALLS} calculator calls, 4 at a time");
    println!("  alone, round trip:                {}", percentiles(alone));
    println!(
        "  alone, execution_time_ms:         {}",
        percentiles(alone_in_executor)
    );
    println!(
        "  under B's flood, round trip:      {}",
        percentiles(flooded)
    );
    println!(
        "  under B's flood, execution_time_ms: {}",
        percentiles(flooded_in_executor)
    );
    println!("  pool at the end: {pool}");
    drop(server);
}
