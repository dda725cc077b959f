//! Ownership of sessions across nodes: heartbeats, claims, releases.
//!
//! runtime ──heartbeat (every few s)──▶ nodes(id, addr, heartbeat_at = now())
//! conversation ──claim_session──▶ sessions.owner = me, epoch + 1 ──epoch──▶ WriteOp::Fence in every turn commit
//! conversation (idle) ──release_session──▶ sessions.owner = NULL
//!
//! A claim is one `UPDATE … RETURNING` that succeeds when the session has
//! no owner, is this node's, or its owner's heartbeat is older than the
//! stale time by the database's clock (`now()`; nodes' clocks are never
//! compared). Taking a session from another owner, or after a release,
//! bumps the epoch: every write the old owner still sends carries the old
//! epoch and is refused ([`crate::store::StoreError::Fenced`]). No advisory
//! locks: they belong to one pooled connection and run out of lock table
//! space near 13k sessions on default settings.
//! A claim of a session that does not exist (yet) returns epoch 0 and
//! changes nothing. The `PutSession` that creates a session leaves it
//! without an owner (epoch 1): the first node to run its conversation
//! claims it, the one the balancer hashes its path to. Decision found by
//! the scaling benchmark (`benches/cluster.sh`): every `POST /v1/sessions`
//! hashes to one node, and when the creator owned what it created, that
//! node ran every conversation and the others only forwarded to it (three
//! nodes served what one does).
//!
//! Workflow runs follow the same rule keyed by run id (`workflow_runs`'
//! `owner`, `epoch`; `cadre_fence_run`), with one more case a claim wins:
//! a run that is not `running` (finished, failed, interrupted) belongs to
//! whoever resumes or cancels it. The takeover sweep reads the running
//! runs of dead owners ([`PgStore::cut_runs`], a partial index).

use crate::store::backend::Ownership;
use jiff::Timestamp;

use super::PgStore;
use crate::store::{Claim, NodeRow, RunOwner, StoreError};

fn stale_secs(store: &PgStore) -> f64 {
    store.shared.node.stale_after.as_secs_f64()
}

#[async_trait::async_trait]
impl Ownership for PgStore {
    /// This node's id.
    fn node_id(&self) -> Option<&str> {
        Some(&self.shared.node.id)
    }

    /// Upserts this node's row with `heartbeat_at = now()`.
    async fn heartbeat(&self) -> Result<(), StoreError> {
        self.run(|c, shared| async move {
            let stmt = c
                .prepare_cached(
                    "INSERT INTO nodes (id, addr, heartbeat_at) VALUES ($1, $2, now())
                     ON CONFLICT (id) DO UPDATE SET addr = EXCLUDED.addr, heartbeat_at = now()",
                )
                .await?;
            c.execute(&stmt, &[&shared.node.id, &shared.node.addr])
                .await?;
            Ok(())
        })
        .await
    }

    /// Every node that ever heartbeat, by id.
    async fn nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
        let stale = stale_secs(self);
        self.run(move |c, _| async move {
            let rows = c
                .query(
                    "SELECT id, addr, (extract(epoch FROM heartbeat_at) * 1000000)::bigint,
                            heartbeat_at > now() - make_interval(secs => $1)
                     FROM nodes ORDER BY id",
                    &[&stale],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| NodeRow {
                    id: r.get(0),
                    addr: r.get(1),
                    heartbeat_at: Timestamp::from_microsecond(r.get(2))
                        .unwrap_or(Timestamp::UNIX_EPOCH),
                    alive: r.get(3),
                })
                .collect())
        })
        .await
    }

    /// Makes this node the session's owner (see the module doc), or says
    /// who owns it ([`StoreError::OwnedElsewhere`]).
    async fn claim_session(&self, id: &str) -> Result<Claim, StoreError> {
        let id = id.to_string();
        let stale = stale_secs(self);
        self.run(move |c, shared| async move {
            let me = &shared.node.id;
            let claim = c
                .prepare_cached(
                    "WITH old AS (SELECT id, owner FROM sessions WHERE id = $1 FOR UPDATE)
                     UPDATE sessions s
                     SET owner = $2,
                         epoch = CASE WHEN old.owner = $2 THEN s.epoch ELSE s.epoch + 1 END
                     FROM old
                     WHERE s.id = old.id
                       AND (old.owner IS NULL OR old.owner = $2 OR NOT EXISTS (
                             SELECT 1 FROM nodes n WHERE n.id = old.owner
                             AND n.heartbeat_at > now() - make_interval(secs => $3)))
                     RETURNING s.epoch, old.owner",
                )
                .await?;
            let who = c
                .prepare_cached(
                    "SELECT s.owner, n.addr FROM sessions s
                     LEFT JOIN nodes n ON n.id = s.owner WHERE s.id = $1",
                )
                .await?;
            // The owner may release or die between the two statements: look again.
            for _ in 0..3 {
                if let Some(row) = c.query_opt(&claim, &[&id, me, &stale]).await? {
                    let epoch: i64 = row.get(0);
                    let old: Option<String> = row.get(1);
                    return Ok(Claim {
                        epoch: epoch as u64,
                        took_over_from: old.filter(|o| o != me),
                    });
                }
                match c.query_opt(&who, &[&id]).await? {
                    None => {
                        return Ok(Claim {
                            epoch: 0,
                            took_over_from: None,
                        });
                    }
                    Some(row) => {
                        let owner: Option<String> = row.get(0);
                        if let Some(owner) = owner.filter(|o| o != me) {
                            return Err(StoreError::OwnedElsewhere {
                                session_id: id,
                                owner,
                                addr: row.get(1),
                            });
                        }
                    }
                }
            }
            Err(StoreError::Fenced {
                session_id: id,
                epoch: 0,
            })
        })
        .await
    }

    /// Makes this node the run's owner (see [`crate::store::owners`]): when
    /// it has none, is this node's, is not running, or its owner's
    /// heartbeat is stale; else [`StoreError::RunOwnedElsewhere`]. A run
    /// not stored (yet) is [`StoreError::RunFenced`] at epoch 0: the
    /// `PutDoc` that creates a run makes its writer the owner.
    async fn claim_run(&self, id: &str) -> Result<Claim, StoreError> {
        let id = id.to_string();
        let stale = stale_secs(self);
        self.run(move |c, shared| async move {
            let me = &shared.node.id;
            let claim = c
                .prepare_cached(
                    "WITH old AS (SELECT key, owner FROM workflow_runs WHERE key = $1 FOR UPDATE)
                     UPDATE workflow_runs r
                     SET owner = $2,
                         epoch = CASE WHEN old.owner = $2 THEN r.epoch ELSE r.epoch + 1 END
                     FROM old
                     WHERE r.key = old.key
                       AND (old.owner IS NULL OR old.owner = $2
                            OR (r.body->>'status') IS DISTINCT FROM 'running'
                            OR NOT EXISTS (
                             SELECT 1 FROM nodes n WHERE n.id = old.owner
                             AND n.heartbeat_at > now() - make_interval(secs => $3)))
                     RETURNING r.epoch, old.owner",
                )
                .await?;
            if let Some(row) = c.query_opt(&claim, &[&id, me, &stale]).await? {
                let epoch: i64 = row.get(0);
                let old: Option<String> = row.get(1);
                return Ok(Claim {
                    epoch: epoch as u64,
                    took_over_from: old.filter(|o| o != me),
                });
            }
            let owner = c
                .query_opt("SELECT owner FROM workflow_runs WHERE key = $1", &[&id])
                .await?
                .and_then(|r| r.get::<_, Option<String>>(0));
            match owner {
                Some(owner) => Err(StoreError::RunOwnedElsewhere { run_id: id, owner }),
                None => Err(StoreError::RunFenced {
                    run_id: id,
                    epoch: 0,
                }),
            }
        })
        .await
    }

    async fn run_owner(&self, id: &str) -> Result<Option<RunOwner>, StoreError> {
        let id = id.to_string();
        let stale = stale_secs(self);
        self.run(move |c, _| async move {
            let stmt = c
                .prepare_cached(
                    "SELECT coalesce(r.body->>'tenant', ''), r.owner, n.addr,
                            coalesce((r.body->>'status') = 'running'
                                     AND n.heartbeat_at > now() - make_interval(secs => $2), false)
                     FROM workflow_runs r LEFT JOIN nodes n ON n.id = r.owner
                     WHERE r.key = $1 AND r.owner IS NOT NULL",
                )
                .await?;
            Ok(c.query_opt(&stmt, &[&id, &stale]).await?.map(|r| RunOwner {
                tenant: r.get(0),
                owner: r.get(1),
                addr: r.get(2),
                running_there: r.get(3),
            }))
        })
        .await
    }

    /// The runs still `running` that this node may take up: its own, and
    /// those with no owner or a dead one (by the database's clock).
    async fn cut_runs(&self) -> Result<Vec<String>, StoreError> {
        let stale = stale_secs(self);
        self.run(move |c, shared| async move {
            let rows = c
                .query(
                    "SELECT r.key FROM workflow_runs r
                     WHERE (r.body->>'status') = 'running'
                       AND (r.owner IS NULL OR r.owner = $1 OR NOT EXISTS (
                             SELECT 1 FROM nodes n WHERE n.id = r.owner
                             AND n.heartbeat_at > now() - make_interval(secs => $2)))
                     ORDER BY r.key",
                    &[&shared.node.id, &stale],
                )
                .await?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
        .await
    }

    /// Gives the session up (its actor went idle) if this node still owns
    /// it at `epoch`; the next claim, by any node, bumps the epoch.
    async fn release_session(&self, id: &str, epoch: u64) -> Result<(), StoreError> {
        let id = id.to_string();
        self.run(move |c, shared| async move {
            let stmt = c
                .prepare_cached(
                    "UPDATE sessions SET owner = NULL WHERE id = $1 AND epoch = $2 AND owner = $3",
                )
                .await?;
            c.execute(&stmt, &[&id, &(epoch as i64), &shared.node.id])
                .await?;
            Ok(())
        })
        .await
    }
    /// The takeover sweep's question: which sessions have a cut turn this
    /// node may take up?
    ///
    /// runtime (every `[cluster] owner_stale_s`) ──▶ Sessions::resume_cut_turns ──▶ orphaned_turn_sessions
    ///
    /// A session whose turn is open and whose owner is alive is in a turn
    /// right now, on its owner: trying to claim it would only fail (and take
    /// the row's lock against the owner's fenced commits). So the database
    /// answers with the sessions whose open turns have no live owner: no
    /// owner, this node (an earlier process of it died mid-turn), or an owner
    /// whose heartbeat is stale by the database's clock.
    async fn orphaned_turn_sessions(&self) -> Result<Vec<String>, StoreError> {
        let stale = self.shared.node.stale_after.as_secs_f64();
        self.run(move |c, shared| async move {
            let stmt = c
                .prepare_cached(
                    "SELECT DISTINCT t.session_id FROM turns t
                     JOIN sessions s ON s.id = t.session_id
                     WHERE t.open
                       AND (s.owner IS NULL OR s.owner = $1 OR NOT EXISTS (
                             SELECT 1 FROM nodes n WHERE n.id = s.owner
                             AND n.heartbeat_at > now() - make_interval(secs => $2)))
                     ORDER BY t.session_id",
                )
                .await?;
            let rows = c.query(&stmt, &[&shared.node.id, &stale]).await?;
            rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
        })
        .await
    }
}
