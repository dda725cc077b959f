//! Who writes a session: the owner/epoch rule of cluster mode.
//!
//! Sessions::conversation ──session_writer──▶ SessionWriter (a claim's epoch) ──▶ the actor
//! writes every request through it: WriteOp::Fence { session_id, epoch } first
//!
//! - A node *claims* a session before its conversation writes: it becomes
//!   the owner when the session has none, is already its own, or its
//!   owner's heartbeat is stale (the owner is dead, or paused past the
//!   stale time); the epoch goes up by one on every change of owner.
//!   Otherwise the claim fails with [`super::StoreError::OwnedElsewhere`],
//!   naming the owner and where it answers, and the request goes there.
//! - Every request a conversation writes starts with
//!   [`super::WriteOp::Fence`]: the backend applies it only if the
//!   session's epoch is still the writer's, in the same transaction
//!   (PostgreSQL: `UPDATE sessions … WHERE id = $1 AND epoch = $2`, and
//!   messages' `(session_id, seq)` is unique), else refuses it whole with
//!   [`super::StoreError::Fenced`]. A fenced conversation drops its state
//!   and stops; the node that owns the session now has the truth.
//! - Staleness is judged by the database's clock, never a node's.
//! - Not advisory locks: they belong to one pooled connection and run out
//!   of lock table space near 13k sessions on default settings.
//! - The embedded backend (one node, one file) owns every session at epoch 0.
//! - The conversation never sees an epoch: it gets a [`SessionWriter`] from
//!   [`Ownership::session_writer`] (a claim in a cluster, nothing to claim
//!   on one node), fences every request with it, passes it to the
//!   executor with its calls (their intents are fenced too) and gives the
//!   session back through it when it goes idle.
//!
//! Workflow runs follow the same rule, keyed by run id:
//! runner ──claim_run──▶ Claim { epoch } ──▶ every write of the run (its
//! document, its map elements) starts with [`super::WriteOp::FenceRun`].
//! - A run is created owned by the node that starts it (epoch 1 on
//!   PostgreSQL); a resume, an automatic resume after a restart and the
//!   takeover of a dead owner's run claim it first (epoch + 1 on a change
//!   of owner). A run that is not `running` may be claimed by any node:
//!   nobody runs it.
//! - Runs still `running` whose owner's heartbeat is stale are found by
//!   the runtime's periodic sweep ([`super::Ownership::cut_runs`]) and taken
//!   up through the engine's recover path (resumed within the resume
//!   window, what finished not run again). A runner whose write is refused
//!   ([`super::StoreError::RunFenced`]) stops without writing or starting
//!   anything more: the node that took the run over has the truth.
//! - The store reads a run document's `status` field for these two
//!   rules (PostgreSQL: `body->>'status'`); it knows nothing else of runs.

use jiff::Timestamp;
use serde::Serialize;

use super::backend::{DocReads, Ownership, TurnReads};
use super::{RedbStore, StoreError, WriteOp};

/// The namespace of workflow run documents ([`super::tables::WORKFLOW_RUNS`]).
const RUNS: &str = "workflow_runs";

/// Who this node is to the others: the id it claims sessions under, where
/// it answers, and when another node's heartbeat counts as stale.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeIdentity {
    pub id: String,
    /// `http://host:port` the other nodes forward a session's requests to.
    pub addr: Option<String>,
    /// A node whose heartbeat is older than this is dead to the others:
    /// its sessions may be taken over.
    pub stale_after: std::time::Duration,
}

/// What a successful claim returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// What this node's writes to the session carry from now on.
    pub epoch: u64,
    /// The node that owned it before, when this claim took it over.
    pub took_over_from: Option<String>,
}

/// The handle a session's one writer writes through, from
/// [`Ownership::session_writer`]: the claim it holds, put in front of
/// every request it fences, so once another node has taken the session
/// over its requests are refused whole ([`StoreError::Fenced`]).
///
/// Behind one `Arc`: a resident conversation holds one inline, and every
/// call it makes carries a clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionWriter(std::sync::Arc<Writer>);

#[derive(Debug, PartialEq, Eq)]
struct Writer {
    session_id: String,
    /// The claim's epoch; `None` on a backend of one node, where no other
    /// writer can exist and nothing is fenced.
    epoch: Option<u64>,
}

impl SessionWriter {
    /// The writer of a session on a backend of one node.
    pub fn sole(session_id: &str) -> Self {
        SessionWriter(std::sync::Arc::new(Writer {
            session_id: session_id.into(),
            epoch: None,
        }))
    }

    /// The writer holding a claim on the session at `epoch` (cluster mode).
    pub fn claimed(session_id: &str, epoch: u64) -> Self {
        SessionWriter(std::sync::Arc::new(Writer {
            session_id: session_id.into(),
            epoch: Some(epoch),
        }))
    }

    pub fn session_id(&self) -> &str {
        &self.0.session_id
    }

    /// `ops` with the claim's fence in front (with nothing to fence, or no
    /// ops, as they are).
    pub fn fenced(&self, mut ops: Vec<WriteOp>) -> Vec<WriteOp> {
        if let Some(epoch) = self.0.epoch
            && !ops.is_empty()
        {
            ops.insert(
                0,
                WriteOp::Fence {
                    session_id: self.0.session_id.clone(),
                    epoch,
                },
            );
        }
        ops
    }

    /// Whether another node may take the session over while this writer
    /// writes: then what acts on the world (a tool call) waits for a
    /// commit that confirms the claim.
    pub fn may_be_taken_over(&self) -> bool {
        self.0.epoch.is_some()
    }

    /// Gives the session up once everything written is in (its actor went
    /// idle), so any node takes it without waiting for this node's
    /// heartbeat to go stale. A writer of one node has nothing to give up.
    pub async fn release(&self, store: &(impl Ownership + ?Sized)) -> Result<(), StoreError> {
        let Some(epoch) = self.0.epoch else {
            return Ok(());
        };
        store.flush().await?;
        store.release_session(&self.0.session_id, epoch).await
    }
}

/// Who runs a workflow run, for a node that got a request about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOwner {
    /// The run's tenant (a caller of another tenant gets nothing of it).
    pub tenant: String,
    pub owner: String,
    /// Where the owner answers (`--advertise`), if it ever said.
    pub addr: Option<String>,
    /// Its heartbeat is fresh and the run is still `running`.
    pub running_there: bool,
}

/// A node of the cluster as the database sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeRow {
    pub id: String,
    /// Where the node answers HTTP (what requests for its sessions are sent to).
    pub addr: Option<String>,
    pub heartbeat_at: Timestamp,
    /// The heartbeat is recent enough (by the database's clock).
    pub alive: bool,
}

/// One node owns everything: claims succeed at epoch 0, fences pass, there
/// are no other nodes to ask or forward to.
#[async_trait::async_trait]
impl Ownership for RedbStore {
    async fn claim_session(&self, _id: &str) -> Result<Claim, StoreError> {
        Ok(Claim {
            epoch: 0,
            took_over_from: None,
        })
    }

    async fn release_session(&self, _id: &str, _epoch: u64) -> Result<(), StoreError> {
        Ok(())
    }

    async fn claim_run(&self, _id: &str) -> Result<Claim, StoreError> {
        Ok(Claim {
            epoch: 0,
            took_over_from: None,
        })
    }

    /// Every run still `running` (after a restart: the runs the stop cut).
    async fn cut_runs(&self) -> Result<Vec<String>, StoreError> {
        let runs = self.list_docs(RUNS, "").await?;
        Ok(runs
            .into_iter()
            .filter(|(_, doc)| doc.get("status").and_then(|s| s.as_str()) == Some("running"))
            .map(|(id, _)| id)
            .collect())
    }

    /// Nobody else runs anything.
    async fn run_owner(&self, _id: &str) -> Result<Option<RunOwner>, StoreError> {
        Ok(None)
    }

    /// Every session with an open turn: one process, so a turn still open
    /// when it starts was cut by the stop before.
    async fn orphaned_turn_sessions(&self) -> Result<Vec<String>, StoreError> {
        let mut ids: Vec<String> = self
            .open_turns()
            .await?
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        ids.dedup();
        Ok(ids)
    }

    async fn heartbeat(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
        Ok(Vec::new())
    }

    fn node_id(&self) -> Option<&str> {
        None
    }
}
