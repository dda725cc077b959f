//! Storage per turn (issue #34, "Lean storage"): what one turn costs on
//! disk, against the bytes of message JSON it carries, on redb and on
//! PostgreSQL, broken down by table; and what a retention pass over many
//! old sessions costs (issue #34, "Retention").
//!
//! bench ──HTTP──▶ cadre (tests/support spawn_app: real runtime, real store)
//!                   │ model calls
//!                   ▼
//!                 mock model (tests/support/mock_model.rs)
//!
//! 1. Turns, per store (redb: the data dir's `cadre.redb`; PostgreSQL: a
//!    real server started as `tests/support/postgres.rs` does, the app on a
//!    one-node cluster): one session, [`TURNS`] turns, each the user's
//!    question, one `echo` call with a [`PAYLOAD`]-byte argument (so a
//!    ~2 KB output), and the model's short answer. Printed: message JSON
//!    per turn (every stored `ChatMessage` serialized), growth of the store
//!    per turn (redb: the file; PostgreSQL: `pg_total_relation_size` summed
//!    over the public tables), the ratio, and per table: rows, bytes per
//!    turn. redb's figures come from its own table stats (`stored_bytes`:
//!    keys and values; `leaf`: the leaf pages' bytes) read after the app
//!    stopped, plus the free pages (`compact()` then shows what a
//!    compaction gives back). PostgreSQL's are measured as the server left
//!    them (dead row versions included, autovacuum permitting), then after
//!    `VACUUM FULL` (live rows only).
//! 2. Retention (redb): [`OLD_SESSIONS`] sessions seeded straight into the
//!    store, each with one turn's messages, all idle for a year; then
//!    `DELETE /v1/sessions?before=<now − 1 day>` as an admin: the time it
//!    takes, sessions per second, and the file's size before, after, and
//!    after `compact()` on the stopped store.
//!
//! `cargo bench --bench storage`. `CADRE_BENCH_TURNS` (default 300),
//! `CADRE_BENCH_PAYLOAD` (2048), `CADRE_BENCH_OLD_SESSIONS` (100,000) and
//! `CADRE_BENCH_STORES` (`redb,postgres`; `none` skips phase 1) change the
//! defaults; `CADRE_BENCH_RETENTION=0` skips phase 2.

#[allow(unused_imports)]
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use cadre::identity::Plan;
use cadre::model::ChatMessage;
use cadre::server_config::ServerConfig;
use cadre::store::{Session, Store, StoredMessage, WriteOp};
use jiff::Timestamp;
use redb::{ReadableDatabase, ReadableTableMetadata, TableHandle};
use serde_json::{Value, json};
use support::{AppOptions, MockModel, Reply, agents_dir, spawn_app};

const TURNS: usize = 300;
const PAYLOAD: usize = 2048;
const OLD_SESSIONS: usize = 100_000;

const AGENT: &str = "name = \"store\"\nsystem_prompt = \"You repeat what you are given with the echo tool.\"\ntools = [\"echo\"]\nmax_iterations = 3\n";

fn env_or<T: std::str::FromStr>(var: &str, default: T) -> T {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn kb(bytes: f64) -> String {
    format!("{:.1} KB", bytes / 1000.0)
}

/// A text of `n` ASCII bytes with nothing JSON escapes: pseudo-random
/// letters and digits, so neither store can compress it away (PostgreSQL
/// compresses values over ~2 KB; redb does not compress).
fn payload(n: usize, turn: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ";
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ turn as u64;
    let mut s = format!("turn {turn}: ");
    while s.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push(ALPHABET[(x % ALPHABET.len() as u64) as usize] as char);
    }
    s
}

/// One echo call per turn, then a short answer; a summary request (no
/// tools offered) gets a short summary.
fn reply(request: &Value, number: usize, size: usize) -> Reply {
    let messages = request["messages"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let summary = request["tools"].as_array().is_none_or(Vec::is_empty);
    if summary {
        return Reply::text("The user had the assistant echo texts.");
    }
    if messages.last().is_some_and(|m| m["role"] == "tool") {
        return Reply::text("Done: the text came back unchanged.");
    }
    let arguments = json!({ "message": payload(size, number) }).to_string();
    Reply::tool_call(&format!("call_{number}"), "echo", &arguments)
}

fn dir_size(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() {
            dir_size(&entry.path())
        } else {
            meta.len()
        };
    }
    total
}

/// Bytes of every stored message's JSON (`ChatMessage` as serialized).
async fn message_bytes(store: &Store, session: &str) -> (usize, usize) {
    let messages = store.messages(session).await.expect("messages");
    let bytes = messages
        .iter()
        .map(|m| serde_json::to_vec(&m.message).unwrap().len())
        .sum();
    (messages.len(), bytes)
}

/// redb: per table (rows, stored bytes, leaf page bytes), and the file's
/// page figures, read from the closed file.
fn redb_tables(path: &Path) -> (BTreeMap<String, (u64, u64, u64)>, String) {
    let db = redb::Database::open(path).expect("open the redb file");
    let txn = db.begin_read().unwrap();
    let mut out = BTreeMap::new();
    for handle in txn.list_tables().unwrap() {
        let table = txn.open_untyped_table(handle.clone()).unwrap();
        let stats = table.stats().unwrap();
        out.insert(
            handle.name().to_string(),
            (
                table.len().unwrap(),
                stats.stored_bytes(),
                stats.leaf_pages() * 4096,
            ),
        );
    }
    drop(txn);
    let w = db.begin_write().unwrap();
    let s = w.stats().unwrap();
    let pages = format!(
        "allocated pages {} ({}), leaf {} branch {}, stored {} metadata {} fragmented {}, page {} B",
        s.allocated_pages(),
        kb((s.allocated_pages() * s.page_size() as u64) as f64),
        s.leaf_pages(),
        s.branch_pages(),
        kb(s.stored_bytes() as f64),
        kb(s.metadata_bytes() as f64),
        kb(s.fragmented_bytes() as f64),
        s.page_size()
    );
    w.abort().unwrap();
    (out, pages)
}

/// Compacts the closed redb file; its size after.
fn compact(path: &Path) -> u64 {
    let mut db = redb::Database::create(path).expect("open the redb file");
    while db.compact().expect("compact") {}
    drop(db);
    std::fs::metadata(path).unwrap().len()
}

/// PostgreSQL: per public table (rows, total relation bytes, of which
/// indexes).
fn pg_tables(url: &str) -> BTreeMap<String, (u64, u64, u64)> {
    let pg = support::store::server();
    let out = pg.sql(
        url,
        "SELECT c.relname || ' ' || pg_total_relation_size(c.oid) || ' ' || pg_indexes_size(c.oid) \
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = 'public' AND c.relkind = 'r' ORDER BY 1",
    );
    out.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let name = it.next()?.to_string();
            let total = it.next()?.parse().ok()?;
            let indexes = it.next()?.parse().ok()?;
            let rows = pg
                .sql(url, &format!("SELECT count(*) FROM {name}"))
                .trim()
                .parse()
                .unwrap_or(0);
            Some((name, (rows, total, indexes)))
        })
        .collect()
}

/// Per table: rows, bytes grown from `before` to `after`, of which indexes.
fn pg_growth(
    after: &BTreeMap<String, (u64, u64, u64)>,
    before: &BTreeMap<String, (u64, u64, u64)>,
) -> Vec<(String, u64, f64, f64)> {
    after
        .iter()
        .map(|(k, (rows, total, idx))| {
            let (t0, i0) = before.get(k).map_or((0, 0), |v| (v.1, v.2));
            (
                k.clone(),
                *rows,
                total.saturating_sub(t0) as f64,
                idx.saturating_sub(i0) as f64,
            )
        })
        .collect()
}

fn print_pg(rows: &[(String, u64, f64, f64)], turns: usize) {
    let mut rows = rows.to_vec();
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    for (name, count, bytes, idx) in rows.iter().filter(|r| r.2 > 0.0) {
        println!(
            "    {name:<28} rows {count:>6}  {:>10}/turn (indexes {})",
            kb(*bytes / turns as f64),
            kb(*idx / turns as f64)
        );
    }
}

/// Bytes of each top-level field of a JSON row (and of its first
/// `tool_calls` element's), largest first: what a row is made of.
fn anatomy(value: &str) -> String {
    let Ok(Value::Object(map)) = serde_json::from_str::<Value>(value) else {
        return format!("{} B (not a JSON object)", value.len());
    };
    let mut fields: Vec<(String, usize)> = map
        .iter()
        .map(|(k, v)| (k.clone(), v.to_string().len()))
        .collect();
    for (field, inner) in [
        (
            "tool_calls[0]",
            map.get("tool_calls").and_then(|c| c.get(0)),
        ),
        ("outcome", map.get("outcome")),
        (
            "outcome.tool_calls[0]",
            map.get("outcome")
                .and_then(|o| o.get("tool_calls"))
                .and_then(|c| c.get(0)),
        ),
    ] {
        if let Some(Value::Object(inner)) = inner {
            for (k, v) in inner {
                fields.push((format!("{field}.{k}"), v.to_string().len()));
            }
        }
    }
    fields.sort_by_key(|f| std::cmp::Reverse(f.1));
    let top: Vec<String> = fields
        .iter()
        .filter(|f| f.1 >= 64)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    format!("{} B: {}", value.len(), top.join(", "))
}

fn print_rows(rows: &[(String, u64, f64)], turns: usize) {
    let mut rows = rows.to_vec();
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    for (name, count, bytes) in rows.iter().filter(|r| r.2 > 0.0) {
        println!(
            "    {name:<28} rows {count:>6}  {:>10}/turn",
            kb(*bytes / turns as f64)
        );
    }
}

/// Phase 1 on one store: `postgres` is the database URL, or `None` for redb.
async fn turns(postgres: Option<String>, turns: usize, size: usize) {
    let store_name = if postgres.is_some() {
        "postgres"
    } else {
        "redb"
    };
    let model = MockModel::start().await;
    model.set_responder(move |req, n| reply(req, n, size));
    let agents = agents_dir(&[("store.toml", AGENT)]);
    let data = tempfile::tempdir().expect("temp dir");
    let mut config = ServerConfig::default();
    config.api_limit.per_second = 1_000_000;
    if let Some(url) = &postgres {
        config.cluster.node_id = Some("bench-storage".into());
        config.cluster.store = Some(url.clone());
    }
    let mut options = AppOptions::with_model(&model)
        .agents(agents.path())
        .data_dir(data.path());
    options.config = config;
    options.request_timeout = Duration::from_secs(60);
    let mut app = spawn_app(options);
    let id = app.session("store").await;
    let (status, body) = app.say(&id, "warm-up: say hi").await;
    assert!(status.is_success(), "{status} {body}");

    let before_dir = dir_size(data.path());
    let before_pg = postgres.as_deref().map(pg_tables);
    let started = Instant::now();
    for t in 0..turns {
        let (status, body) = app.say(&id, &format!("turn {t}: echo the text")).await;
        assert!(status.is_success(), "turn {t}: {status} {body}");
    }
    let elapsed = started.elapsed();
    let after_pg = postgres.as_deref().map(pg_tables);
    app.stop();
    let after_dir = dir_size(data.path());

    let store = match &postgres {
        None => Store::open(data.path()).expect("open the store"),
        Some(url) => cadre::cluster::postgres::open_store(
            url,
            cadre::store::NodeIdentity {
                id: "bench-storage".into(),
                addr: None,
                stale_after: cadre::cluster::postgres::NODE_STALE_AFTER,
            },
        )
        .expect("open the database"),
    };
    let (count, all_bytes) = message_bytes(&store, &id).await;
    drop(store);
    // The warm-up turn's two messages are left out of the per-turn figure.
    let per_turn_messages = all_bytes as f64 / (turns + 1) as f64;
    println!(
        "\n== {store_name}: {turns} turns (one echo call, {size} B argument), {count} messages, {:.1} s",
        elapsed.as_secs_f64()
    );
    println!("  message JSON per turn: {}", kb(per_turn_messages));
    match (before_pg, after_pg) {
        (Some(before), Some(after)) => {
            let rows = pg_growth(&after, &before);
            let total: f64 = rows.iter().map(|r| r.2).sum();
            println!(
                "  relations grew per turn: {} = {:.1}x the message JSON (as left: dead row versions included)",
                kb(total / turns as f64),
                total / turns as f64 / per_turn_messages
            );
            print_pg(&rows, turns);
            let url = postgres.as_deref().unwrap();
            let pg = support::store::server();
            pg.sql(url, "VACUUM FULL");
            let vacuumed = pg_tables(url);
            let rows = pg_growth(&vacuumed, &before);
            let total: f64 = rows.iter().map(|r| r.2).sum();
            println!(
                "  after VACUUM FULL (live rows only), over the sizes before the turns: {}/turn = {:.1}x",
                kb(total / turns as f64),
                total / turns as f64 / per_turn_messages
            );
            print_pg(&rows, turns);
            for table in ["turns", "tool_calls", "messages"] {
                let row = pg.sql(
                    url,
                    &format!("SELECT t::text FROM {table} t ORDER BY length(t::text) DESC LIMIT 1"),
                );
                println!("  largest {table} row (as text): {}", row.trim().len());
            }
        }
        _ => {
            let growth = after_dir.saturating_sub(before_dir) as f64 / turns as f64;
            println!(
                "  data dir grew per turn: {} = {:.1}x the message JSON ({} -> {})",
                kb(growth),
                growth / per_turn_messages,
                kb(before_dir as f64),
                kb(after_dir as f64)
            );
            let file = data.path().join("cadre.redb");
            let (tables, pages) = redb_tables(&file);
            println!("  {pages}");
            let stored: Vec<(String, u64, f64)> = tables
                .iter()
                .map(|(k, v)| (k.clone(), v.0, v.1 as f64))
                .collect();
            let leaf: f64 = tables.values().map(|v| v.2 as f64).sum();
            let total: f64 = stored.iter().map(|r| r.2).sum();
            println!(
                "  tables' stored bytes (keys + values) per turn: {} = {:.1}x; leaf pages {}/turn",
                kb(total / turns as f64),
                total / turns as f64 / per_turn_messages,
                kb(leaf / turns as f64)
            );
            print_rows(&stored, turns);
            let dump = cadre::store::erase::dump_file(&file).expect("dump");
            for table in ["turns", "tool_calls", "messages"] {
                if let Some(row) = dump
                    .iter()
                    .filter(|r| r.table == table)
                    .max_by_key(|r| r.value.len())
                {
                    println!("  largest {table} row: {}", anatomy(&row.value));
                }
            }
            let size = std::fs::metadata(&file).unwrap().len();
            let compacted = compact(&file);
            println!(
                "  compact(): file {} -> {} = {}/turn, {:.1}x",
                kb(size as f64),
                kb(compacted as f64),
                kb(compacted as f64 / turns as f64),
                compacted as f64 / turns as f64 / per_turn_messages
            );
        }
    }
}

fn old_session(i: usize, at: Timestamp) -> Vec<WriteOp> {
    let id = format!("old-{i:06}");
    let msg = |seq: u64, m: ChatMessage| StoredMessage {
        seq,
        message: m,
        created_at: at,
        rolled_back: false,
    };
    vec![
        WriteOp::PutSession(Session {
            id: id.clone(),
            tenant: if i.is_multiple_of(2) {
                "acme"
            } else {
                "globex"
            }
            .into(),
            agent: "store".into(),
            user_id: None,
            plan: Plan::Free,
            metadata: json!({}),
            created_at: at,
            forked_from: None,
        }),
        WriteOp::AppendMessages {
            session_id: id,
            messages: vec![
                msg(1, ChatMessage::user("what is the weather like?")),
                msg(
                    2,
                    ChatMessage::assistant("I cannot know that; ask a forecast."),
                ),
            ],
        },
    ]
}

/// Phase 2: `DELETE /v1/sessions?before=` over `n` year-old sessions.
async fn retention(n: usize) {
    let data = tempfile::tempdir().expect("temp dir");
    let year_ago = Timestamp::now() - jiff::SignedDuration::from_hours(24 * 365);
    let started = Instant::now();
    let key = {
        let store = Store::open(data.path()).expect("open the store");
        let (key, _) = cadre::tenants::create_key(&store, "ops", true)
            .await
            .expect("admin key");
        for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
            let ops = chunk
                .iter()
                .flat_map(|&i| old_session(i, year_ago))
                .collect();
            store.write(ops, false).await.expect("seed");
        }
        store.write(Vec::new(), true).await.expect("flush");
        key
    };
    let file = data.path().join("cadre.redb");
    let seeded = std::fs::metadata(&file).unwrap().len();
    println!(
        "\n== retention (redb): {n} sessions a year old seeded in {:.1} s, file {}",
        started.elapsed().as_secs_f64(),
        kb(seeded as f64)
    );
    let agents = agents_dir(&[("store.toml", AGENT)]);
    let mut config = ServerConfig::default();
    config.api_limit.per_second = 1_000_000;
    let mut options = AppOptions::offline()
        .agents(agents.path())
        .data_dir(data.path());
    options.config = config;
    options.request_timeout = Duration::from_secs(3600);
    let mut app = spawn_app(options);
    let before = (Timestamp::now() - jiff::SignedDuration::from_hours(24)).to_string();
    let started = Instant::now();
    let (status, body) = app
        .with_key(&key)
        .delete(&format!("/v1/sessions?before={before}"))
        .await;
    let took = started.elapsed();
    assert!(status.is_success(), "{status} {body}");
    println!(
        "  DELETE /v1/sessions?before=: {body} in {:.1} s = {:.0} sessions/s",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64()
    );
    app.stop();
    let after = std::fs::metadata(&file).unwrap().len();
    let compacted = compact(&file);
    println!(
        "  file: {} seeded, {} after the delete, {} after compact()",
        kb(seeded as f64),
        kb(after as f64),
        kb(compacted as f64)
    );
}

#[tokio::main]
async fn main() {
    let n: usize = env_or("CADRE_BENCH_TURNS", TURNS);
    let size: usize = env_or("CADRE_BENCH_PAYLOAD", PAYLOAD);
    let stores = std::env::var("CADRE_BENCH_STORES").unwrap_or_else(|_| "redb,postgres".into());
    for store in stores.split(',') {
        match store.trim() {
            "redb" => turns(None, n, size).await,
            "postgres" => {
                let url = support::store::server().database("storage");
                turns(Some(url), n, size).await;
            }
            _ => {}
        }
    }
    if std::env::var("CADRE_BENCH_RETENTION").map_or(true, |v| v != "0") {
        retention(env_or("CADRE_BENCH_OLD_SESSIONS", OLD_SESSIONS)).await;
    }
}
