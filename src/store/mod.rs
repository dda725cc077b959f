//! Store: sessions, messages, tool-call records, turns and documents,
//! behind one handle with two backends.
//!
//! conversation / executor / http ──▶ Store ──deref──▶ dyn StoreBackend ──▶ RedbStore (embedded, default)
//!                                                                       └─▶ PgStore   (cluster mode, an adapter in `cluster::postgres`)
//!
//! Every caller holds a [`Store`] and never knows which backend serves it:
//! the store is a few traits by concern ([`backend`]), each implemented
//! once per backend, and a `Store` is one of them behind an `Arc`. The
//! rows both read and write are in [`rows`], the errors in [`error`], the
//! redb layout in [`tables`].
//!
//! **Ownership (cluster mode).** With several nodes on one database, a
//! session has one writer: the node that [`Ownership::claim_session`]ed it,
//! at an *epoch* the claim returns. A writer puts [`WriteOp::Fence`] in
//! each request; a request whose epoch is no longer the session's is
//! refused whole with [`StoreError::Fenced`] (the fencing-token rule), so a
//! node that lost a session — paused, partitioned, misrouted — cannot
//! write, and drops its state. Workflow runs follow the same rule keyed by
//! run id ([`Ownership::claim_run`], [`WriteOp::FenceRun`]). The embedded
//! backend has one node: a claim always succeeds at epoch 0 and a fence
//! always passes ([`owners`]).
//!
//! What follows is the embedded backend's contract, which the PostgreSQL
//! backend keeps (its own doc says how):
//!
//! conversation / executor ──write(ops, durable)──▶ writer thread ──▶ redb
//!                          ◀──────── Ok once committed ──────────┘
//! http / conversation ──read──▶ spawn_blocking read transaction
//!
//! One writer thread owns every write transaction and batches whatever is
//! queued into one commit (group commit). A batch commits with
//! `Durability::Immediate` (an fsync) when any request in it asked for
//! durability, else with `Durability::None`; an immediate commit also makes the
//! earlier non-durable ones durable. Writes sent behind
//! ([`crate::store::Writes::write_behind`]: nobody waits for them) are held up to
//! [`HOLD_BEHIND`] and go into the next commit someone waits for, in the
//! order sent. A turn therefore sends its steps and call records behind and
//! pays one commit, with one fsync, before it is acknowledged.
//! Readers use their own read transactions on blocking threads and never wait
//! for the writer. Sessions and documents, read on every turn, are served
//! from a read cache the writer invalidates ([`cache`]). Token usage is
//! counted by increments the writer applies in the same batches ([`usage`]).
//! Listings read a tenant-first index written in the same transaction as
//! the rows it lists, one page at a time ([`listing`]). Erasing a session
//! removes every row under its id in one transaction ([`erase`]).
//! Owns: the file layout ([`tables`]). Does not: decide what to write.
//!
//! Storage faults (disk full, EIO, a file size limit): a commit that fails
//! with an I/O error leaves redb refusing every later operation until the
//! file is reopened. The writer then swaps the failed `Database` for a
//! read-only view of the file ([`read_view`]): reads keep working, every
//! write is refused at once with [`StoreError::Unavailable`] (HTTP 503), and
//! [`Writes::health`] reports the outage. It tries to reopen the file for
//! writing every [`REOPEN_EVERY`] (and on the next write after that); once
//! that works, writes are accepted again, with no restart. What a failed
//! commit carried was never acknowledged, and neither is anything a
//! non-durable commit had left unsynced: reopening goes back to the last
//! durable commit. The store's *generation* counts these reopens; a writer
//! that holds state derived from earlier writes (a conversation) passes the
//! generation it loaded at ([`crate::store::Writes::write_at`]) and is refused after a
//! reopen, so it reloads instead of writing on top of steps that were lost.

pub mod backend;
mod cache;
pub mod codec;
mod docs;
pub mod embedded;
pub mod erase;
pub mod error;
pub mod idempotency;
pub mod listing;
pub mod owners;
mod read_view;
pub mod rows;
mod storage;
pub mod tables;
pub mod turns;
pub mod usage;
mod write_queue;
mod writer;

use std::path::Path;
use std::sync::Arc;

pub use backend::{
    CallReads, DocReads, IdempotencyRecords, Ownership, SessionReads, StoreBackend, TenantOf,
    TurnReads, UsageReads, Writes, prelude,
};
pub use embedded::RedbStore;
pub use erase::Erased;
pub use error::{StoreError, StoreHealth};
pub use listing::Page;
pub use owners::{Claim, NodeIdentity, NodeRow, RunOwner, SessionWriter};
pub use rows::*;
pub use storage::counted_call;
pub use usage::{TokenUsage, UsageDelta, UsageRow};

/// Requests the writer drains into one transaction at most.
const MAX_BATCH: usize = 1024;

/// How often the writer tries to reopen the file while writes fail.
pub const REOPEN_EVERY: std::time::Duration = std::time::Duration::from_millis(500);
/// Longest a write sent behind ([`crate::store::Writes::write_behind`]) waits for company
/// before the writer commits it alone.
pub const HOLD_BEHIND: std::time::Duration = std::time::Duration::from_millis(5);

/// Cheap to clone; every clone talks to the same backend (for redb: the
/// same file and writer thread; when the last clone drops, the writer
/// finishes what is queued and the file is closed before the drop returns,
/// so the same process can reopen it). Derefs to the backend: its methods
/// are the traits of [`backend`], in scope with `use crate::store::prelude::*;`.
#[derive(Clone)]
pub struct Store {
    backend: Arc<dyn StoreBackend>,
}

impl std::ops::Deref for Store {
    type Target = dyn StoreBackend;

    fn deref(&self) -> &Self::Target {
        &*self.backend
    }
}

/// MiB of redb's page cache unless `[store] cache_mb` says otherwise.
pub const DEFAULT_CACHE_MB: u64 = 64;

impl Store {
    /// A store served by `backend`: how an adapter (the PostgreSQL
    /// backend, a test's) plugs in.
    pub fn with_backend(backend: impl StoreBackend) -> Store {
        Store {
            backend: Arc::new(backend),
        }
    }

    /// Opens (or creates) `<data_dir>/cadre.redb` and starts its writer
    /// thread, with the default page cache ([`DEFAULT_CACHE_MB`]).
    pub fn open(data_dir: &Path) -> Result<Store, StoreError> {
        Self::open_with_cache(data_dir, DEFAULT_CACHE_MB as usize * 1024 * 1024)
    }

    /// [`Self::open`] with a page cache of `cache_bytes` (`[store] cache_mb`).
    pub fn open_with_cache(data_dir: &Path, cache_bytes: usize) -> Result<Store, StoreError> {
        Ok(Self::with_backend(RedbStore::open(data_dir, cache_bytes)?))
    }

    /// A store in memory, gone when dropped: for listings and tests where a
    /// file adds nothing.
    pub fn open_in_memory() -> Result<Store, StoreError> {
        Ok(Self::with_backend(RedbStore::open_in_memory()?))
    }
}
