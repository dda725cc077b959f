//! Documents on PostgreSQL: which table a namespace's rows live in, as
//! the SQL that reads and writes them, and the move of the store's own
//! kinds of documents out of `docs` (migration 002, and `cadre migrate`).
//!
//! writer / reads ──DocHome::of(namespace)──▶ docs (namespace, key) | confirmations, workflow_runs ... (key)
//!
//! The own tables ([`crate::store::tables::OWN_TABLES`]) have the columns
//! of `docs` but the namespace (`key, body, tenant, session_id`), so one
//! statement serves every table: its table name and the namespace
//! condition are filled in, the namespace being the *last* parameter of a
//! statement on `docs` and absent otherwise. Table names come from that
//! fixed list only, never from a caller's text.

use tokio_postgres::Transaction;
use tokio_postgres::types::ToSql;

use crate::store::tables::{OWN_TABLES, own_table};

/// Where the documents of one namespace live.
#[derive(Debug, Clone, Copy)]
pub(super) struct DocHome<'a> {
    pub table: &'static str,
    /// `Some` for the shared `docs` table: the namespace its rows carry.
    namespace: Option<&'a str>,
}

impl<'a> DocHome<'a> {
    pub fn of(namespace: &'a str) -> Self {
        match own_table(namespace) {
            Some(t) => DocHome {
                table: t.name(),
                namespace: None,
            },
            None => DocHome {
                table: "docs",
                namespace: Some(namespace),
            },
        }
    }

    /// `namespace = $n AND ` on `docs` (parameter `n`: the namespace,
    /// last), nothing on an own table.
    pub fn and_ns(&self, n: usize) -> String {
        match self.namespace {
            Some(_) => format!("namespace = ${n} AND "),
            None => String::new(),
        }
    }

    /// The namespace column and its value of an insert (`, namespace` and
    /// `, $n`), or nothing.
    pub fn ns_column(&self, n: usize) -> (&'static str, String) {
        match self.namespace {
            Some(_) => (", namespace", format!(", ${n}")),
            None => ("", String::new()),
        }
    }

    /// The conflict target of an upsert.
    pub fn conflict(&self) -> &'static str {
        match self.namespace {
            Some(_) => "(namespace, key)",
            None => "(key)",
        }
    }

    /// The parameter to append last, on `docs`.
    pub fn namespace(&self) -> Option<&'a str> {
        self.namespace
    }

    /// [`Self::namespace`] as a statement parameter.
    pub fn ns_param(&self) -> Option<&(dyn ToSql + Sync)> {
        self.namespace.as_ref().map(|n| n as &(dyn ToSql + Sync))
    }
}

/// Moves the rows of every namespace of [`OWN_TABLES`] out of `docs` into
/// its table (an upsert: a row already there takes the moved body);
/// how many. Nothing left to move, nothing done.
pub(super) async fn move_own_docs(txn: &Transaction<'_>) -> Result<u64, tokio_postgres::Error> {
    let mut moved = 0;
    for t in &OWN_TABLES {
        let table = t.name();
        let sql = format!(
            "WITH moved AS (DELETE FROM docs WHERE namespace = $1
                            RETURNING key, body, tenant, session_id)
             INSERT INTO {table} (key, body, tenant, session_id)
             SELECT key, body, tenant, session_id FROM moved
             ON CONFLICT (key) DO UPDATE SET body = EXCLUDED.body,
                 tenant = COALESCE(EXCLUDED.tenant, {table}.tenant),
                 session_id = COALESCE(EXCLUDED.session_id, {table}.session_id)"
        );
        moved += txn.execute(&sql, &[&t.namespace]).await?;
    }
    Ok(moved)
}
