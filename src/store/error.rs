//! The store's errors and health, shared by both backends.
//!
//! conversation / http ◀── StoreError (a public error: 503 for an outage,
//! 409 for a fenced writer) ◀── the redb backend, or an adapter's
//! (cluster mode's PostgreSQL), whose own errors arrive as
//! [`StoreError::Backend`]

use std::path::PathBuf;
use std::sync::Arc;

use jiff::Timestamp;
use serde::Serialize;

use crate::error_code::{ErrorCode, PublicError};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the database at {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: redb::DatabaseError,
    },
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("storage error: {0}")]
    Redb(#[from] redb::Error),
    #[error("a stored value could not be decoded: {0}")]
    Corrupt(#[from] serde_json::Error),
    #[error("the store writer has stopped")]
    WriterGone,
    #[error("commit failed: {0}")]
    CommitFailed(Arc<StoreError>),
    #[error("the data was written by schema version {found}, this build reads {expected}")]
    SchemaMismatch { found: u64, expected: u64 },
    /// Writes fail (disk full, I/O errors) since `since`; reads still work.
    #[error("storage is not writable since {since}: {reason}")]
    Unavailable { since: Timestamp, reason: Arc<str> },
    /// The server is shutting down: what still runs was not acknowledged.
    #[error("the store takes no more writes: the server is shutting down")]
    Closed,
    /// The file was reopened after a failure since the writer loaded its state.
    #[error("the store was reopened after a failure (generation {loaded} -> {now})")]
    Reopened { loaded: u64, now: u64 },
    /// Another node took the session over: this writer's epoch is old.
    #[error("session {session_id} is no longer written at epoch {epoch}: another node owns it")]
    Fenced { session_id: String, epoch: u64 },
    /// Another live node owns the session; requests go there.
    #[error("session {session_id} is owned by node {owner}")]
    OwnedElsewhere {
        session_id: String,
        owner: String,
        addr: Option<String>,
    },
    /// Another node took the workflow run over: this runner's epoch is old.
    #[error("workflow run {run_id} is no longer written at epoch {epoch}: another node owns it")]
    RunFenced { run_id: String, epoch: u64 },
    /// Another live node runs the workflow run.
    #[error("workflow run {run_id} is run by node {owner}")]
    RunOwnedElsewhere { run_id: String, owner: String },
    /// A backend's database could not be reached or migrated at open;
    /// `url` has no password.
    #[error("cannot reach {backend} at {url} (set with {setting}): {reason}")]
    Unreachable {
        backend: &'static str,
        url: String,
        setting: &'static str,
        reason: String,
    },
    /// A backend's own failure, kept whole as the source (its adapter
    /// converts its driver's errors into this, and reads them back).
    #[error("{backend}: {source}")]
    Backend {
        backend: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Every storage failure is `STORAGE_UNAVAILABLE` to a caller (a lost
/// session is `SESSION_MOVED`); its detail (paths, redb's error) is
/// logged, never sent.
impl PublicError for StoreError {
    fn code(&self) -> ErrorCode {
        match self {
            StoreError::Fenced { .. }
            | StoreError::OwnedElsewhere { .. }
            | StoreError::RunFenced { .. }
            | StoreError::RunOwnedElsewhere { .. } => ErrorCode::SessionMoved,
            _ => ErrorCode::StorageUnavailable,
        }
    }

    fn public_message(&self) -> String {
        match self {
            StoreError::Fenced { .. } | StoreError::OwnedElsewhere { .. } => {
                "the session moved to another node; what was acknowledged is kept, \
                 retry (with the same Idempotency-Key)"
                    .into()
            }
            StoreError::RunFenced { .. } | StoreError::RunOwnedElsewhere { .. } => {
                "the workflow run is run by another node; retry (through it)".into()
            }
            _ => "storage is unavailable; nothing was acknowledged, retry later".into(),
        }
    }
}

/// Whether the store accepts writes.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum StoreHealth {
    Ok,
    /// Writes are refused; reads are served from what was committed.
    Degraded {
        since: Timestamp,
        /// The error that started it: for logs, not sent to clients.
        #[serde(skip)]
        reason: String,
    },
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self { StoreError::Redb(e.into()) }
        }
    )*};
}
from_redb!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);
