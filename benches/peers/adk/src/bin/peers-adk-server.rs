//! benches/peers rows `adk-sqlite` and `adk-pg`: ADK-Rust's own HTTP server
//! (`adk-server`'s `create_app`, axum) with durable sessions (`adk-session`'s
//! sqlx backends), serving the same agent as the in-process row `adk`.
//!
//! The harness (peers.py) is the HTTP client: per session
//! `POST /api/sessions {appName, userId, sessionId}`, then
//! `POST /api/run {appName, userId, sessionId, newMessage}` (adk-server's
//! plain-JSON run: it runs the agent to the end with `StreamingMode::None`
//! and answers with every event of the turn).
//!
//! ```text
//! peers-adk-server --base-url http://127.0.0.1:P/v1 --addr 127.0.0.1:Q \
//!     --sessions sqlite:///path/sessions.db?mode=rwc | postgres://... \
//!     [--sqlite-journal-mode wal] --info-out info.json
//! ```
//!
//! Everything is as the crates ship it: `SqliteSessionService::new(url)` /
//! `PostgresSessionService::new(url)` (sqlx's default pool and connect
//! options) then `migrate()`, `ServerConfig::new(loader, sessions)` with the
//! default `SecurityConfig`, `create_app`, `axum::serve`, `#[tokio::main]`'s
//! runtime. One exception, only when asked: `--sqlite-journal-mode wal`
//! and/or `--sqlite-max-connections N` open the pool `new` opens (sqlx's
//! default pool and connect options, foreign keys on as `new` sets them)
//! but with SQLite's journal in WAL mode and/or at most N connections,
//! handed to `SqliteSessionService::from_pool`; `synchronous` stays
//! SQLite's default, FULL. (As shipped, sessions created at once fail with
//! "database is locked": adk-session's transactions read, then write, and
//! SQLite refuses the second connection's upgrade to a writer at once,
//! without waiting; one connection serialises them, as SQLite serialises
//! writers anyway.) The tracing subscriber logs
//! errors only, to stderr (the row's log): adk-server's `info!` per request
//! is filtered out at its call site, its `error!` on a failed request (a
//! session store error, say) is written. `--info-out` gets the versions and,
//! for SQLite, the `journal_mode` and `synchronous` a pooled connection
//! reports.

#[path = "../agent.rs"]
mod agent;

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use adk_core::SingleAgentLoader;
use adk_server::{ServerConfig, create_app};
use adk_session::{PostgresSessionService, SessionService, SqliteSessionService};
use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

#[tokio::main]
async fn main() {
    let mut m: HashMap<String, String> = HashMap::new();
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        m.insert(k.trim_start_matches("--").to_string(), v);
    }
    let arg = |k: &str| {
        m.get(k)
            .cloned()
            .unwrap_or_else(|| panic!("--{k} is required"))
    };
    let (base_url, addr, url) = (arg("base-url"), arg("addr"), arg("sessions"));
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::ERROR)
        .with_writer(std::io::stderr)
        .init();

    let mut info = json!({"versions": {"adk-rust": env!("ADK_RUST_VERSION")}});
    let sessions: Arc<dyn SessionService> = if url.starts_with("sqlite:") {
        let journal = m.get("sqlite-journal-mode").map(String::as_str);
        let pool_size = m.get("sqlite-max-connections");
        let s = if journal.is_none() && pool_size.is_none() {
            SqliteSessionService::new(&url)
                .await
                .expect("sqlite sessions")
        } else {
            // What `new` does (sqlx's default connect options, foreign
            // keys on), but for the journal and the pool's size.
            let mut options = SqliteConnectOptions::from_str(&url)
                .expect("sqlite URL")
                .foreign_keys(true);
            match journal {
                None => {}
                Some("wal") => options = options.journal_mode(SqliteJournalMode::Wal),
                Some(other) => panic!("--sqlite-journal-mode {other}: only `wal` is offered"),
            }
            let mut pool = SqlitePoolOptions::new();
            if let Some(n) = pool_size {
                pool = pool.max_connections(n.parse().expect("--sqlite-max-connections N"));
            }
            let pool = pool.connect_with(options).await.expect("sqlite pool");
            SqliteSessionService::from_pool(pool)
        };
        s.migrate().await.expect("sqlite migrate");
        let pragma = |name: &'static str| {
            let pool = s.pool().clone();
            async move {
                let v: (String,) =
                    sqlx::query_as(&format!("SELECT CAST({name} AS TEXT) FROM pragma_{name}"))
                        .fetch_one(&pool)
                        .await
                        .expect("pragma");
                v.0
            }
        };
        // synchronous: 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA
        info["sqlite"] = json!({
            "journal_mode": pragma("journal_mode").await,
            "synchronous": pragma("synchronous").await,
            "sqlite_version": sqlx::query_as::<_, (String,)>("SELECT sqlite_version()")
                .fetch_one(s.pool()).await.expect("version").0,
        });
        Arc::new(s)
    } else {
        let s = PostgresSessionService::new(&url)
            .await
            .expect("postgres sessions");
        s.migrate().await.expect("postgres migrate");
        Arc::new(s)
    };
    if let Some(path) = m.get("info-out") {
        std::fs::write(path, serde_json::to_vec(&info).expect("json")).expect("write --info-out");
    }

    let loader = Arc::new(SingleAgentLoader::new(Arc::new(agent::build(&base_url))));
    let app = create_app(ServerConfig::new(loader, sessions));
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .expect("bind --addr");
    axum::serve(listener, app).await.expect("serve");
}
