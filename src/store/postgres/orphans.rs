//! The takeover sweep's question: which sessions have a cut turn this
//! node may take up?
//!
//! runtime (every `[cluster] owner_stale_s`) ──▶ Sessions::resume_cut_turns ──▶ orphaned_turn_sessions
//!
//! A session whose turn is open and whose owner is alive is in a turn
//! right now, on its owner: trying to claim it would only fail (and take
//! the row's lock against the owner's fenced commits). So the database
//! answers with the sessions whose open turns have no live owner: no
//! owner, this node (an earlier process of it died mid-turn), or an owner
//! whose heartbeat is stale by the database's clock.

use super::PgStore;
use crate::store::StoreError;

impl PgStore {
    /// See [`crate::store::Store::orphaned_turn_sessions`].
    pub async fn orphaned_turn_sessions(&self) -> Result<Vec<String>, StoreError> {
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
