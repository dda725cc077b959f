//! The PostgreSQL layout: embedded, versioned migrations applied at open.
//!
//! PgStore::open ──migrate──▶ one transaction: advisory xact lock · schema_migrations · migrations/NNN_*.sql
//!
//! Each file of `migrations/` runs once, in order, recorded in
//! `schema_migrations`. The whole run is one transaction holding
//! `pg_advisory_xact_lock`, so two nodes starting at once apply each file
//! once (the second waits, then finds them applied). That lock lives for
//! the migration only; it is not how sessions are owned (see
//! [`super::ownership`]). A database with a migration this build does not
//! know is refused ([`StoreError::SchemaMismatch`]): it was written by a
//! newer cadre. Migration 002 also moves rows (the documents of the
//! store's own kinds out of `docs`, [`super::docs::move_own_docs`]) in the
//! same transaction: that move is Rust, not SQL, so the list of tables is
//! written once ([`crate::store::tables::OWN_TABLES`]).

use deadpool_postgres::Pool;

/// (version, name, SQL), in order.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "init", include_str!("migrations/001_init.sql")),
    (
        2,
        "own_tables",
        include_str!("migrations/002_own_tables.sql"),
    ),
    (3, "run_fence", include_str!("migrations/003_run_fence.sql")),
    (
        4,
        "stored_bytes",
        include_str!("migrations/004_stored_bytes.sql"),
    ),
    (
        5,
        "call_bytes",
        include_str!("migrations/005_call_bytes.sql"),
    ),
];

/// Any constant: the advisory lock's key for migrations ("cadre" in ASCII).
const MIGRATION_LOCK: i64 = 0x0063_6164_7265;

/// Applies the migrations not applied yet; the error as text for the
/// open error (it names the setting and URL).
pub(super) async fn migrate(pool: &Pool) -> Result<(), String> {
    let mut client = pool.get().await.map_err(|e| super::error_chain(&e))?;
    let txn = client.transaction().await.map_err(|e| e.to_string())?;
    txn.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(|e| e.to_string())?;
    txn.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version integer PRIMARY KEY,
             name text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .await
    .map_err(|e| e.to_string())?;
    let applied: Vec<i32> = txn
        .query(
            "SELECT version FROM schema_migrations ORDER BY version",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let known = MIGRATIONS.last().map_or(0, |m| m.0);
    if let Some(&found) = applied.iter().find(|v| **v > known) {
        return Err(crate::store::StoreError::SchemaMismatch {
            found: found as u64,
            expected: known as u64,
        }
        .to_string());
    }
    for (version, name, sql) in MIGRATIONS {
        if applied.contains(version) {
            continue;
        }
        txn.batch_execute(sql)
            .await
            .map_err(|e| format!("migration {version:03}_{name}: {e}"))?;
        if *version == 2 {
            let moved = super::docs::move_own_docs(&txn)
                .await
                .map_err(|e| format!("migration {version:03}_{name}: {e}"))?;
            tracing::info!(documents = moved, "documents moved to their own tables");
        }
        txn.execute(
            "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
            &[version, name],
        )
        .await
        .map_err(|e| e.to_string())?;
        tracing::info!(version, name, "PostgreSQL migration applied");
    }
    txn.commit().await.map_err(|e| e.to_string())
}
