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
//! newer cadre.

use deadpool_postgres::Pool;

/// (version, name, SQL), in order.
const MIGRATIONS: &[(i32, &str, &str)] = &[(1, "init", include_str!("migrations/001_init.sql"))];

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
        return Err(super::super::StoreError::SchemaMismatch {
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
