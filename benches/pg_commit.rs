//! PostgreSQL store: what a fenced turn commit costs.
//!
//! One turn's commit as the conversation sends it: `Fence` (the session's
//! epoch), the session row updated, 3 messages and 1 call record, durable
//! (one WAL flush). Measured on a real PostgreSQL started from the
//! machine's binaries (as `tests/support/postgres.rs` does, defaults, fsync
//! on), through `Store::write` (the facade callers use): sequential commits by one client (p50,
//! p99), then 31 clients at once (commits/s, group commit sharing flushes).
//!
//! Run: `cargo bench --bench pg_commit` (N = 2,000 sequential, 32 × 200
//! concurrent; set `PG_COMMIT_N` for another N, `PG_COMMIT_DURABLE=0` to
//! commit without waiting for the WAL flush).

#[path = "../tests/support/ports.rs"]
mod ports;
#[allow(dead_code)]
#[path = "../tests/support/postgres.rs"]
mod postgres;

use std::time::{Duration, Instant};

use cadre::identity::Plan;
use cadre::model::ChatMessage;
use cadre::store::NodeIdentity;
use cadre::store::{Session, StoredMessage, ToolCallRecord, WriteOp};
use jiff::Timestamp;
use serde_json::json;

fn session(id: &str) -> Session {
    Session {
        id: id.into(),
        tenant: "acme".into(),
        agent: "assistant".into(),
        user_id: Some("alice".into()),
        plan: Plan::Free,
        metadata: json!({}),
        created_at: Timestamp::now(),
        forked_from: None,
    }
}

fn turn_ops(id: &str, epoch: u64, turn: u64) -> Vec<WriteOp> {
    let seq = turn * 3;
    let msg = |n: u64, m: ChatMessage| StoredMessage {
        seq: seq + n,
        message: m,
        created_at: Timestamp::now(),
        rolled_back: false,
    };
    let record = ToolCallRecord {
        guardrails: Vec::new(),
        cached: false,
        record_id: format!("{id}-{turn:08}"),
        tool_name: "calculator".into(),
        tool_call_id: Some(format!("call_{turn}")),
        params: json!({"expression": "(2+3)*4"}),
        output: Some(json!({"result": 20.0})),
        is_success: true,
        error: None,
        error_type: None,
        execution_time_ms: 1,
        attempts: 1,
        caller_id: id.into(),
        caller_type: "conversation_agent".into(),
        conversation_id: Some(id.into()),
        workflow_id: None,
        user_id: Some("alice".into()),
        tenant: Some("acme".into()),
        created_at: Timestamp::now(),
        started_at: None,
        source_id: None,
        turn_id: None,
    };
    let mut s = session(id);
    s.metadata = json!({"turns": turn});
    vec![
        WriteOp::Fence {
            session_id: id.into(),
            epoch,
        },
        WriteOp::PutSession(s),
        WriteOp::AppendMessages {
            session_id: id.into(),
            messages: vec![
                msg(1, ChatMessage::user("what is (2+3)*4?")),
                msg(2, ChatMessage::assistant("calling the calculator")),
                msg(3, ChatMessage::assistant("(2+3)*4 = 20")),
            ],
        },
        WriteOp::RecordToolCall(Box::new(record)),
    ]
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main]
async fn main() {
    let n: u64 = std::env::var("PG_COMMIT_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    // PG_COMMIT_DURABLE=0: commits without waiting for the WAL flush, to
    // tell the flush from the rest.
    let durable = std::env::var("PG_COMMIT_DURABLE").map_or(true, |v| v != "0");
    let pg = postgres::Postgres::start();
    let url = pg.database("bench");
    let node = NodeIdentity {
        id: "bench".into(),
        addr: None,
        stale_after: cadre::cluster::postgres::NODE_STALE_AFTER,
    };
    let store = cadre::cluster::postgres::open_store(&url, node).unwrap();
    let mut ops = Vec::new();
    for c in 0..32 {
        ops.push(WriteOp::PutSession(session(&format!("s{c}"))));
    }
    store.write(ops, true).await.unwrap();

    let mut times = Vec::with_capacity(n as usize);
    for turn in 0..n {
        let started = Instant::now();
        store.write(turn_ops("s0", 1, turn), durable).await.unwrap();
        times.push(started.elapsed());
    }
    times.sort();
    println!(
        "pg_commit sequential (durable={durable}): n={n} p50={:?} p99={:?} max={:?}",
        pct(&times, 0.5),
        pct(&times, 0.99),
        times[times.len() - 1]
    );

    let per = 200u64;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 1..32u64 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("s{c}");
            for turn in 0..per {
                store.write(turn_ops(&id, 1, turn), durable).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let total = 31 * per;
    let elapsed = started.elapsed();
    println!(
        "pg_commit 31 clients: {total} commits in {elapsed:?} = {:.0}/s",
        total as f64 / elapsed.as_secs_f64()
    );
}
