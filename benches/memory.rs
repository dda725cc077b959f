//! Memory (issue #35): search latency at 100,000 items of one tenant, the
//! time to build a tenant's index from the store, and bytes per item.
//!
//! bench ──store.write (PutDoc batches)──▶ redb ◀──build on first use── Memory ──search──▶ p50 / p99
//!
//! The items are written straight to the store in batches of 1,000 (a put
//! through [`Memory::put`] is one durable commit each: what is measured
//! here is search, not 100,000 fsyncs), each `{"text": ...}` of
//! [`WORDS`] words drawn from a vocabulary of [`VOCABULARY`] with a
//! Zipf-like skew, in 100 namespaces `users.u<n>`. Then:
//! 1. the first search builds the index from the store (timed, with the
//!    RSS it adds: the index's bytes per item);
//! 2. [`QUERIES`] searches of three words over the whole tenant
//!    (`limit` 10, the values of the page read from the store) → p50, p99;
//!    and as many under one user's namespace;
//! 3. the redb file's size divided by the items: stored bytes per item.
//!
//! `cargo bench --bench memory` (release). `CADRE_BENCH_ITEMS` and
//! `CADRE_BENCH_QUERIES` change the defaults (100,000 and 1,000).

use std::time::{Duration, Instant};

use cadre::memory::{ITEMS, Memory, MemoryConfig, SearchQuery, StoredItem, store_key};
use cadre::store::{Store, WriteOp};
use jiff::Timestamp;
use serde_json::json;

const ITEMS_DEFAULT: usize = 100_000;
const QUERIES: usize = 1_000;
const WORDS: usize = 20;
const VOCABULARY: usize = 5_000;
const TENANT: &str = "bench";

fn env_or<T: std::str::FromStr>(var: &str, default: T) -> T {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A small deterministic generator (xorshift), so runs compare.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A word index skewed toward the small ones (the square of a uniform).
    fn word(&mut self) -> usize {
        let u = (self.next() % 1_000_000) as f64 / 1_000_000.0;
        ((u * u) * VOCABULARY as f64) as usize
    }
}

fn word(i: usize) -> String {
    // Distinct pronounceable words: w + base-26 letters.
    let mut s = String::from("w");
    let mut n = i;
    loop {
        s.push((b'a' + (n % 26) as u8) as char);
        n /= 26;
        if n == 0 {
            break;
        }
    }
    s
}

fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn main() {
    let items: usize = env_or("CADRE_BENCH_ITEMS", ITEMS_DEFAULT);
    let queries: usize = env_or("CADRE_BENCH_QUERIES", QUERIES);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let now = Timestamp::now();
        let started = Instant::now();
        let mut ops = Vec::with_capacity(1_000);
        for i in 0..items {
            let text: Vec<String> = (0..WORDS).map(|_| word(rng.word())).collect();
            let namespace = vec!["users".to_string(), format!("u{}", i % 100)];
            let key = format!("k{i}");
            let item = StoredItem {
                namespace: namespace.clone(),
                key: key.clone(),
                value: json!({ "text": text.join(" ") }),
                created_at: now,
                updated_at: now,
                expires_at: None,
            };
            ops.push(WriteOp::PutDoc {
                namespace: ITEMS.into(),
                key: store_key(TENANT, &namespace, &key),
                value: serde_json::to_value(&item).unwrap(),
                tenant: Some(TENANT.into()),
            });
            if ops.len() == 1_000 || i + 1 == items {
                store.write(std::mem::take(&mut ops), false).await.unwrap();
            }
        }
        store.flush().await.unwrap();
        println!("wrote {items} items in {:.1} s", started.elapsed().as_secs_f64());

        let memory = Memory::new(store.clone(), MemoryConfig::default());
        let query = |rng: &mut Rng, prefix: Vec<String>| SearchQuery {
            namespace_prefix: prefix,
            query: Some(format!(
                "{} {} {}",
                word(rng.word()),
                word(rng.word()),
                word(rng.word())
            )),
            filter: None,
            limit: 10,
            offset: 0,
        };
        let before = rss();
        let t = Instant::now();
        memory
            .search(TENANT, query(&mut rng, Vec::new()))
            .await
            .unwrap();
        let build = t.elapsed();
        let index_bytes = rss().saturating_sub(before);
        println!(
            "index built from the store on first use: {:.2} s; RSS +{:.1} MiB ({} bytes per item)",
            build.as_secs_f64(),
            index_bytes as f64 / (1 << 20) as f64,
            index_bytes / items as u64
        );
        for (what, prefix) in [
            ("whole tenant", Vec::new()),
            ("one user (users.u7)", vec!["users".to_string(), "u7".to_string()]),
        ] {
            let mut latencies = Vec::with_capacity(queries);
            let mut found = 0;
            for _ in 0..queries {
                let q = query(&mut rng, prefix.clone());
                let t = Instant::now();
                found += memory.search(TENANT, q).await.unwrap().len();
                latencies.push(t.elapsed());
            }
            latencies.sort();
            println!(
                "search, {what}, {items} items, {queries} queries of 3 words, limit 10: p50 {:.2} ms, p99 {:.2} ms ({:.1} results per query)",
                percentile(&latencies, 0.50).as_secs_f64() * 1e3,
                percentile(&latencies, 0.99).as_secs_f64() * 1e3,
                found as f64 / queries as f64
            );
        }
        let file = std::fs::metadata(dir.path().join("cadre.redb"))
            .map(|m| m.len())
            .unwrap_or(0);
        println!(
            "stored: {:.1} MiB redb file, {} bytes per item (value ~{} bytes of JSON)",
            file as f64 / (1 << 20) as f64,
            file / items as u64,
            WORDS * 6 + 120
        );
    });
}
