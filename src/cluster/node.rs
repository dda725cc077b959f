//! A cluster node's own duties, beside serving requests: its heartbeat
//! (other nodes read it to tell it alive), a fresh read of the API keys
//! another node may have created or revoked, and the takeover of dead
//! nodes' cut turns and workflow runs.
//!
//! runtime (cluster mode) ──spawn_duties──▶ every heartbeat_s: Ownership::heartbeat, KeyRing::refresh
//!                                         every owner_stale_s: Sessions::resume_cut_turns, Workflows::take_up_cut_runs
//!
//! The runtime only starts it: how a node keeps its place in the cluster
//! is the cluster wing's, not the wiring's.

use std::time::Duration;

use crate::conversation::Sessions;
use crate::store::Store;
use crate::tenants::KeyRing;
use crate::workflow::Workflows;

/// Cluster mode: this node's heartbeat and a fresh read of the API keys
/// (every `[cluster] heartbeat_s`),
/// and the sweep that takes over the cut turns of dead nodes' sessions
/// and their cut workflow runs (every `[cluster] owner_stale_s`: a session
/// or run whose owner stopped heartbeating is claimable then,
/// [`crate::store::owners`]). `beat` and `sweep` are `[cluster]
/// heartbeat_s` and `owner_stale_s`.
pub fn spawn_duties(
    store: Store,
    sessions: Sessions,
    workflows: Workflows,
    keys: KeyRing,
    beat: Duration,
    sweep: Duration,
) {
    tokio::spawn(async move {
        let mut heartbeat = tokio::time::interval(beat);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut takeover = tokio::time::interval(sweep);
        takeover.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = heartbeat.tick() => {
                    if let Err(e) = store.heartbeat().await {
                        tracing::warn!(error = %e, "heartbeat not stored: other nodes may take this node's sessions over");
                    }
                    // Keys created or revoked through another node.
                    if let Err(e) = keys.refresh(&store).await {
                        tracing::warn!(error = %e, "API keys not read again");
                    }
                }
                _ = takeover.tick() => {
                    if let Err(e) = sessions.resume_cut_turns().await {
                        tracing::warn!(error = %e, "looking for cut turns of dead nodes failed");
                    }
                    // Workflow runs of dead nodes: claimed, then resumed
                    // (or closed) by the path a restart takes them up by.
                    if let Err(e) = workflows.take_up_cut_runs().await {
                        tracing::warn!(error = %e, "looking for cut workflow runs of dead nodes failed");
                    }
                }
            }
        }
    });
}
