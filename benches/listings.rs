//! Listings against another tenant's growth: what tenant A pays for a page
//! of its sessions, calls, confirmations (documents) as tenant B's data
//! grows 100x (criterion).
//!
//! listing ──range of A's index keys──▶ A's rows only ([`cadre::store::listing`])
//!
//! - `listing/{sessions,calls,docs}/<B rows>`: a 50-row page of A (A holds
//!   50 of each) on a real file where B holds 100, 1,000 and 10,000 of
//!   each; B's sessions carry 2 KB of metadata. Flat means independent of B.
//! - `listing/full_scan_sessions/<B rows>`: the read `GET /v1/sessions` did
//!   before the index (every session of every tenant, then filtered), for
//!   contrast.
//! - `migration`: printed once, not sampled: opening a schema 1 file of N
//!   sessions and N calls (the one-time index build at startup), and
//!   indexing N documents of a namespace (`Store::index_docs`).
//!
//! Run: `cargo bench --bench listings`.

use std::path::Path;
use std::time::{Duration, Instant};

use cadre::store::{Session, Store, ToolCallRecord, WriteOp, tables};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use jiff::Timestamp;
use redb::ReadableTable;
use serde_json::{Value, json};

const PAGE: usize = 50;
const A_ROWS: usize = 50;

fn session(tenant: &str, metadata: &Value) -> Session {
    Session {
        id: format!("s_{}", uuid::Uuid::now_v7().simple()),
        tenant: tenant.into(),
        agent: "helper".into(),
        user_id: None,
        plan: Default::default(),
        metadata: metadata.clone(),
        created_at: Timestamp::now(),
        forked_from: None,
    }
}

fn call(tenant: &str) -> ToolCallRecord {
    ToolCallRecord {
        guardrails: Vec::new(),
        cached: false,
        record_id: uuid::Uuid::now_v7().to_string(),
        tool_name: "calculator".into(),
        tool_call_id: None,
        params: json!({"expression": "1+1"}),
        output: Some(json!({"result": 2})),
        is_success: true,
        error: None,
        error_type: None,
        execution_time_ms: 1,
        attempts: 1,
        caller_id: "bench".into(),
        caller_type: "direct".into(),
        conversation_id: None,
        workflow_id: None,
        user_id: None,
        tenant: Some(tenant.into()),
        created_at: Timestamp::now(),
        started_at: None,
        source_id: None,
        turn_id: None,
    }
}

/// Adds `n` sessions, calls and documents of `tenant`, in batches.
async fn fill(store: &Store, tenant: &str, n: usize, metadata: &Value) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let mut ops = Vec::new();
        for _ in chunk {
            ops.push(WriteOp::PutSession(session(tenant, metadata)));
            ops.push(WriteOp::RecordToolCall(Box::new(call(tenant))));
            ops.push(WriteOp::PutDoc {
                namespace: "confirmations".into(),
                key: format!("conf_{}", uuid::Uuid::now_v7().simple()),
                value: json!({"tool_name": "order", "params": {}, "tenant": tenant}),
                tenant: Some(tenant.into()),
            });
        }
        store.write(ops, false).await.unwrap();
    }
    store.flush().await.unwrap();
}

fn listing(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let big = json!({ "notes": "x".repeat(2048) });
    rt.block_on(fill(&store, "a", A_ROWS, &Value::Null));
    let mut group = c.benchmark_group("listing");
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(3));
    group.warm_up_time(Duration::from_secs(1));
    let mut held = 0;
    for b_rows in [100, 1_000, 10_000] {
        rt.block_on(fill(&store, "b", b_rows - held, &big));
        held = b_rows;
        group.bench_with_input(BenchmarkId::new("sessions", b_rows), &b_rows, |b, _| {
            b.to_async(&rt).iter(|| async {
                let page = store.sessions_of("a", None, PAGE).await.unwrap();
                assert_eq!(page.items.len(), PAGE);
            })
        });
        group.bench_with_input(BenchmarkId::new("calls", b_rows), &b_rows, |b, _| {
            b.to_async(&rt).iter(|| async {
                let filter = Default::default();
                let page = store.calls_of("a", filter, None, PAGE).await.unwrap();
                assert_eq!(page.items.len(), PAGE);
            })
        });
        group.bench_with_input(BenchmarkId::new("docs", b_rows), &b_rows, |b, _| {
            b.to_async(&rt).iter(|| async {
                let page = store
                    .docs_of("confirmations", "a", None, PAGE, false)
                    .await
                    .unwrap();
                assert_eq!(page.items.len(), PAGE);
            })
        });
        group.bench_with_input(
            BenchmarkId::new("full_scan_sessions", b_rows),
            &b_rows,
            |b, _| {
                b.to_async(&rt).iter(|| async {
                    let mut all = store.list_sessions().await.unwrap();
                    all.retain(|s| s.tenant == "a");
                    assert_eq!(all.len(), A_ROWS);
                })
            },
        );
    }
    group.finish();
}

/// Back to schema 1: the tenant indexes dropped, as a version 1 build left
/// the file.
fn make_old_format(dir: &Path) {
    let db = redb::Database::open(dir.join("cadre.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    txn.delete_table(tables::SESSIONS_BY_TENANT).unwrap();
    txn.delete_table(tables::TOOL_CALLS_BY_TENANT).unwrap();
    txn.delete_table(tables::DOCS_BY_TENANT).unwrap();
    txn.delete_table(tables::DOC_TENANTS).unwrap();
    {
        let mut meta = txn.open_table(tables::META).unwrap();
        meta.insert("schema_version", 1).unwrap();
        let flags: Vec<String> = meta
            .iter()
            .unwrap()
            .map(|r| r.unwrap().0.value().to_string())
            .filter(|k| k.starts_with("docs_indexed:"))
            .collect();
        for f in flags {
            meta.remove(f.as_str()).unwrap();
        }
    }
    txn.commit().unwrap();
}

fn migration(_: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    for n in [10_000, 100_000] {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            let half = n / 2;
            rt.block_on(fill(&store, "a", half, &Value::Null));
            rt.block_on(fill(&store, "b", n - half, &Value::Null));
        }
        make_old_format(dir.path());
        let started = Instant::now();
        let store = Store::open(dir.path()).unwrap();
        let open = started.elapsed();
        let started = Instant::now();
        let indexed = rt
            .block_on(store.index_docs("confirmations", |v| {
                v["tenant"].as_str().map(str::to_string)
            }))
            .unwrap();
        let docs = started.elapsed();
        assert_eq!(indexed, Some(n as u64));
        eprintln!(
            "migration: {n} sessions + {n} calls indexed at open in {open:?}; {n} documents indexed in {docs:?}"
        );
    }
}

criterion_group!(benches, listing, migration);
criterion_main!(benches);
