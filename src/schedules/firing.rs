//! The firing loop: one task per serving node (see the module doc of
//! [`super`] for the rules it keeps).
//!
//! wake (earliest slot · a change here · RESCAN) ──▶ take over what dead nodes left
//!     ──▶ per due schedule: read cursor ──▶ claim (move_doc cursor → firing)
//!     ──▶ one durable write: fire records + cursor back with the next slot
//!     ──▶ start each fire (turn with its key, or workflow run) ──▶ record started

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::{
    CURSORS, FIRING, Fire, FireState, KEEP_RUNS, PENDING, RESCAN, RUNS, SCHEDULES, Schedule,
    ScheduleError, Schedules, TAKEOVER_AFTER,
};
use crate::identity::Scope;
use crate::store::WriteOp;

/// Schedules claimed and recorded at once, at most.
const PARALLEL: usize = 16;

/// A schedule's next slot not yet fired: the document in [`CURSORS`]
/// (free) or [`FIRING`] (claimed, with who and since when).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Cursor {
    pub next: Timestamp,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Claimed {
    next: Timestamp,
    node: Option<String>,
    since: Timestamp,
}

/// What the loop keeps of a schedule between wake-ups.
struct Entry {
    schedule: Schedule,
    /// The next slot as last read (another node may have fired it since).
    next: Timestamp,
}

pub(super) async fn run(schedules: Schedules, stop: CancellationToken) {
    let mut entries: HashMap<String, Entry> = HashMap::new();
    let mut first = true;
    let mut rescan_at = tokio::time::Instant::now();
    loop {
        if stop.is_cancelled() {
            return;
        }
        let now = tokio::time::Instant::now();
        if now >= rescan_at {
            if let Err(e) = schedules.take_over(first).await {
                tracing::warn!(error = %e, "schedules: cannot look for fires left by a crash");
            }
            first = false;
            match schedules.load().await {
                Ok(loaded) => entries = loaded,
                Err(e) => tracing::warn!(error = %e, "schedules: cannot read the schedules"),
            }
            rescan_at = now + RESCAN;
        }
        let t = Timestamp::now();
        let due: Vec<String> = entries
            .iter()
            .filter(|(_, e)| e.next <= t)
            .map(|(id, _)| id.clone())
            .collect();
        if !due.is_empty() {
            let results: Vec<(String, Option<Timestamp>)> = futures::stream::iter(due)
                .map(|id| {
                    let schedules = schedules.clone();
                    let schedule = entries[&id].schedule.clone();
                    async move {
                        let next = match schedules.fire_due(&schedule).await {
                            Ok(next) => next,
                            Err(e) => {
                                tracing::warn!(schedule = %id, error = %e, "schedules: fire failed; retried at the next rescan");
                                Some(Timestamp::now() + signed(RESCAN))
                            }
                        };
                        (id, next)
                    }
                })
                .buffer_unordered(PARALLEL)
                .collect()
                .await;
            for (id, next) in results {
                match next {
                    Some(next) => {
                        if let Some(e) = entries.get_mut(&id) {
                            e.next = next;
                        }
                    }
                    None => {
                        entries.remove(&id);
                    }
                }
            }
            continue;
        }
        let earliest = entries.values().map(|e| e.next).min();
        let wake = match earliest {
            Some(at) => rescan_at.min(instant_of(at)),
            None => rescan_at,
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(wake) => {}
            () = schedules.inner.changed.notified() => rescan_at = tokio::time::Instant::now(),
        }
    }
}

/// The tokio instant of a wall-clock time (now when it is past).
fn instant_of(at: Timestamp) -> tokio::time::Instant {
    let wait = Duration::try_from(at.duration_since(Timestamp::now())).unwrap_or(Duration::ZERO);
    tokio::time::Instant::now() + wait
}

impl Schedules {
    fn node(&self) -> Option<String> {
        self.inner.store.node_id().map(str::to_string)
    }

    /// Every schedule with its next slot.
    async fn load(&self) -> Result<HashMap<String, Entry>, ScheduleError> {
        let store = &self.inner.store;
        let mut next: HashMap<String, Timestamp> = HashMap::new();
        for (id, v) in store.list_docs(CURSORS, "").await? {
            if let Ok(c) = serde_json::from_value::<Cursor>(v) {
                next.insert(id, c.next);
            }
        }
        for (id, v) in store.list_docs(FIRING, "").await? {
            if let Ok(c) = serde_json::from_value::<Claimed>(v) {
                next.entry(id).or_insert(c.next);
            }
        }
        let mut out = HashMap::new();
        for (id, v) in store.list_docs(SCHEDULES, "").await? {
            let Ok(schedule) = serde_json::from_value::<Schedule>(v) else {
                continue;
            };
            let next = match next.get(&id) {
                Some(n) => *n,
                // Written with its schedule, so missing only if a write
                // was lost: start again from now.
                None => {
                    let Some(n) = schedule
                        .timing()
                        .ok()
                        .and_then(|t| t.next_after(Timestamp::now()))
                    else {
                        continue;
                    };
                    let cursor = serde_json::to_value(Cursor { next: n })?;
                    store.put_doc(CURSORS, &id, cursor, true).await?;
                    n
                }
            };
            out.insert(id, Entry { schedule, next });
        }
        Ok(out)
    }

    /// Fires what is due of `schedule`: claims it, records the fires with
    /// the next slot, starts them. The next slot to wait for (`None`: the
    /// schedule is gone).
    async fn fire_due(&self, schedule: &Schedule) -> Result<Option<Timestamp>, ScheduleError> {
        let store = &self.inner.store;
        let id = &schedule.id;
        let Some(cursor) = store.get_doc(CURSORS, id).await? else {
            // Deleted, or claimed by a node firing it now.
            return Ok(store
                .get_doc(FIRING, id)
                .await?
                .map(|_| Timestamp::now() + SignedDuration::from_secs(1)));
        };
        let cursor: Cursor = serde_json::from_value(cursor)?;
        let now = Timestamp::now();
        if cursor.next > now {
            return Ok(Some(cursor.next));
        }
        // The schedule as stored now (a change on another node).
        let Some(current) = store.get_doc(SCHEDULES, id).await? else {
            return Ok(None);
        };
        let schedule: Schedule = serde_json::from_value(current)?;
        let claim = Claimed {
            next: cursor.next,
            node: self.node(),
            since: now,
        };
        let Some(taken) = store
            .move_doc(CURSORS, id, FIRING, serde_json::to_value(&claim)?, false)
            .await?
        else {
            // Another node claimed it first.
            return Ok(Some(Timestamp::now() + SignedDuration::from_secs(1)));
        };
        // What was taken is what counts, not what was read before.
        let taken: Cursor = serde_json::from_value(taken)?;
        let now = Timestamp::now();
        let timing = schedule.timing()?;
        let Some(due) = timing.due(taken.next, now, schedule.catch_up) else {
            self.release(id, taken.next, Vec::new()).await?;
            return Ok(Some(taken.next));
        };
        let principal = self.principal_of(&schedule);
        let fires: Vec<Fire> = due
            .fire
            .iter()
            .map(|slot| {
                let mut fire = Fire {
                    schedule_id: id.clone(),
                    tenant: schedule.tenant.clone(),
                    slot: *slot,
                    fired_at: now,
                    node: self.node(),
                    state: FireState::Claimed,
                    session_id: None,
                    turn_id: None,
                    run_id: None,
                    error: None,
                };
                if principal.is_none() {
                    fire.state = FireState::Skipped;
                    fire.error =
                        Some("the key that made the schedule is revoked or expired".into());
                } else if schedule.agent.is_some() {
                    fire.session_id = Some(match schedule.session.as_deref() {
                        Some(s) if s != "new" => s.to_string(),
                        _ => session_for(id, *slot),
                    });
                }
                fire
            })
            .collect();
        self.release(id, due.next, fires.clone()).await?;
        for fire in fires.into_iter().filter(|f| f.state == FireState::Claimed) {
            // One after the other: the turns of one session queue in order.
            self.start(&schedule, fire).await;
        }
        self.prune(id).await;
        Ok(Some(due.next))
    }

    /// One durable write: the fire records (and their pending marks) and
    /// the cursor back, free, at `next`.
    async fn release(
        &self,
        id: &str,
        next: Timestamp,
        fires: Vec<Fire>,
    ) -> Result<(), ScheduleError> {
        let mut ops = Vec::with_capacity(fires.len() * 2 + 1);
        for fire in &fires {
            let value = serde_json::to_value(fire)?;
            ops.push(put(RUNS, &fire.key(), value.clone()));
            if fire.state == FireState::Claimed {
                ops.push(put(PENDING, &fire.key(), value));
            }
        }
        let moved = std::sync::Arc::new(std::sync::Mutex::new(None));
        ops.push(WriteOp::MoveDoc {
            namespace: FIRING.into(),
            key: id.into(),
            to_namespace: CURSORS.into(),
            to_value: serde_json::to_value(Cursor { next })?,
            moved: moved.clone(),
        });
        self.inner.store.write(ops, true).await?;
        if moved.lock().expect("move slot").is_none() {
            tracing::warn!(
                schedule = id,
                "schedules: the claim was taken over meanwhile"
            );
        }
        Ok(())
    }

    /// Starts a recorded fire: the turn (with its key) or the run, then
    /// records how that went. Safe to call again for the same fire.
    async fn start(&self, schedule: &Schedule, mut fire: Fire) {
        match self.start_inner(schedule, &mut fire).await {
            Ok(()) => fire.state = FireState::Started,
            Err(Failure::Retry(e)) => {
                tracing::warn!(schedule = %fire.schedule_id, slot = %fire.slot, error = %e, "schedules: cannot start a fire now; taken up again later");
                return;
            }
            Err(Failure::Final(e)) => {
                tracing::warn!(schedule = %fire.schedule_id, slot = %fire.slot, error = %e, "schedules: fire failed");
                fire.state = FireState::Failed;
                fire.error = Some(e);
            }
        }
        let key = fire.key();
        let ops = match serde_json::to_value(&fire) {
            Ok(value) => vec![
                put(RUNS, &key, value),
                WriteOp::DeleteDoc {
                    namespace: PENDING.into(),
                    key: key.clone(),
                },
            ],
            Err(_) => return,
        };
        // A record lost here is pending still: taken up again, the key
        // rejoins the turn.
        if let Err(e) = self.inner.store.write(ops, false).await {
            tracing::warn!(schedule = %fire.schedule_id, error = %e, "schedules: cannot record a fire's start");
        }
    }

    async fn start_inner(&self, schedule: &Schedule, fire: &mut Fire) -> Result<(), Failure> {
        let Some(principal) = self.principal_of(schedule) else {
            return Err(Failure::Final(
                "the key that made the schedule is revoked or expired".into(),
            ));
        };
        let store = &self.inner.store;
        if let Some(workflow) = &schedule.workflow {
            let ceiling = crate::tenants::config::plan_ceiling(store, &principal)
                .await
                .map_err(|e| Failure::Retry(e.to_string()))?;
            let run = self
                .inner
                .workflows
                .start(
                    workflow,
                    crate::workflow::StartRun {
                        input: schedule.input.clone().unwrap_or_default(),
                        tenant: schedule.tenant.clone(),
                        user_id: schedule.user_id.clone(),
                        parent_run: None,
                        plan_ceiling: Some(ceiling),
                        webhook: schedule.webhook.clone(),
                        // The same run for the same slot: a start taken
                        // up after a crash finds the run it may have
                        // started.
                        id: Some(run_for(&schedule.id, fire.slot)),
                    },
                )
                .await
                .map_err(|e| Failure::Final(e.to_string()))?;
            fire.run_id = Some(run.id);
            return Ok(());
        }
        let (Some(agent), Some(message), Some(session_id)) =
            (&schedule.agent, &schedule.message, &fire.session_id)
        else {
            return Err(Failure::Final("the schedule names no agent turn".into()));
        };
        let scope = Scope::tenant(schedule.tenant.clone());
        if store
            .get_session(session_id)
            .await
            .map_err(|e| Failure::Retry(e.to_string()))?
            .is_none()
        {
            if schedule.session.as_deref().is_some_and(|s| s != "new") {
                return Err(Failure::Final(format!(
                    "session '{session_id}' no longer exists"
                )));
            }
            if self.inner.sessions.agents().get(agent).is_none() {
                return Err(Failure::Final(format!("no agent named '{agent}'")));
            }
            let plan = crate::tenants::config::plan_ceiling(store, &principal)
                .await
                .map_err(|e| Failure::Retry(e.to_string()))?;
            let session = crate::store::Session {
                id: session_id.clone(),
                tenant: schedule.tenant.clone(),
                agent: agent.clone(),
                user_id: schedule.user_id.clone(),
                plan,
                metadata: serde_json::json!({"schedule_id": schedule.id, "slot": fire.slot}),
                created_at: Timestamp::now(),
                forked_from: None,
            };
            store
                .write(vec![WriteOp::PutSession(session)], true)
                .await
                .map_err(|e| Failure::Retry(e.to_string()))?;
        }
        let started = self
            .inner
            .sessions
            .start_turn(
                &scope,
                session_id,
                crate::conversation::sessions::TurnInput {
                    content: message.clone(),
                    output_schema: None,
                    webhook: schedule.webhook.clone(),
                },
                None,
                Some(fire.turn_key()),
            )
            .await
            .map_err(|e| match e {
                crate::conversation::SessionError::Store(s) => Failure::Retry(s.to_string()),
                other => Failure::Final(other.to_string()),
            })?;
        fire.turn_id = Some(started.turn_id.clone());
        // The turn runs on; its outcome is stored with its record.
        tokio::spawn(started.outcome);
        Ok(())
    }

    /// Keeps the newest [`KEEP_RUNS`] fire records of a schedule.
    async fn prune(&self, id: &str) {
        let store = &self.inner.store;
        let Ok(keys) = store.list_docs(RUNS, &format!("{id}/")).await else {
            return;
        };
        if keys.len() <= KEEP_RUNS {
            return;
        }
        let ops = keys[..keys.len() - KEEP_RUNS]
            .iter()
            .map(|(key, _)| WriteOp::DeleteDoc {
                namespace: RUNS.into(),
                key: key.clone(),
            })
            .collect();
        if let Err(e) = store.write(ops, false).await {
            tracing::warn!(schedule = id, error = %e, "schedules: cannot prune fire records");
        }
    }

    /// Takes up what a crash left: claims never released (the cursor back,
    /// its slot not fired) and fires recorded but not started (started
    /// now, with the same session and key). `at_start`: this node just
    /// started, so what it left itself is taken at once.
    async fn take_over(&self, at_start: bool) -> Result<(), ScheduleError> {
        let store = &self.inner.store;
        let me = self.node();
        let claims = store.list_docs(FIRING, "").await?;
        let pending = store.list_docs(PENDING, "").await?;
        if claims.is_empty() && pending.is_empty() {
            return Ok(());
        }
        let live: Vec<String> = match me {
            Some(_) => store
                .nodes()
                .await?
                .into_iter()
                .filter(|n| n.alive)
                .map(|n| n.id)
                .collect(),
            None => Vec::new(),
        };
        let now = Timestamp::now();
        let left = |node: &Option<String>, since: Timestamp| {
            let old = now.duration_since(since) > signed(TAKEOVER_AFTER);
            let mine = node == &me;
            // No node: written by a server of one node (this store since
            // became a cluster's), which is not running now.
            let dead = node.as_ref().is_none_or(|n| !live.contains(n));
            old || (at_start && mine) || (!mine && dead)
        };
        for (id, value) in claims {
            let Ok(claim) = serde_json::from_value::<Claimed>(value) else {
                continue;
            };
            if !left(&claim.node, claim.since) {
                continue;
            }
            let back = serde_json::to_value(Cursor { next: claim.next })?;
            if store
                .move_doc(FIRING, &id, CURSORS, back, true)
                .await?
                .is_some()
            {
                tracing::info!(schedule = %id, from = ?claim.node, "schedules: a claim left by a crash taken over");
            }
        }
        for (key, value) in pending {
            let Ok(mut fire) = serde_json::from_value::<Fire>(value) else {
                continue;
            };
            if !left(&fire.node, fire.fired_at) {
                continue;
            }
            let Some(schedule) = store.get_doc(SCHEDULES, &fire.schedule_id).await? else {
                store.delete_doc(PENDING, &key, false).await?;
                continue;
            };
            let schedule: Schedule = serde_json::from_value(schedule)?;
            tracing::info!(schedule = %fire.schedule_id, slot = %fire.slot, from = ?fire.node, "schedules: a fire left by a crash taken up");
            fire.node = me.clone();
            // A turn rejoins by its key, a run by its id: both derived
            // from the slot.
            self.start(&schedule, fire).await;
        }
        Ok(())
    }
}

/// Why a fire did not start: now (tried again later), or for good.
enum Failure {
    Retry(String),
    Final(String),
}

/// The session of a fire of a schedule whose `session` is `"new"`: the
/// same for every node and every try (a UUID v7 of the slot's time whose
/// random bits are a hash of schedule and slot).
fn session_for(schedule: &str, slot: Timestamp) -> String {
    derived_id(&format!("{schedule}:{}", slot.as_millisecond()), slot)
}

/// The workflow run a workflow schedule's fire of `slot` starts (see
/// [`session_for`]).
fn run_for(schedule: &str, slot: Timestamp) -> String {
    derived_id(&format!("run:{schedule}:{}", slot.as_millisecond()), slot)
}

/// A UUID v7 of `slot`'s time whose random bits are a SHA-256 of `seed`.
fn derived_id(seed: &str, slot: Timestamp) -> String {
    let digest = Sha256::digest(seed.as_bytes());
    let mut bytes = [0u8; 10];
    bytes.copy_from_slice(&digest[..10]);
    let ms = u64::try_from(slot.as_millisecond()).unwrap_or(0);
    uuid::Builder::from_unix_timestamp_millis(ms, &bytes)
        .into_uuid()
        .to_string()
}

fn signed(d: Duration) -> SignedDuration {
    SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX)
}

fn put(namespace: &str, key: &str, value: serde_json::Value) -> WriteOp {
    WriteOp::PutDoc {
        namespace: namespace.into(),
        key: key.into(),
        value,
        tenant: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_session_per_fire_is_the_same_on_every_try_and_differs_per_slot() {
        let slot: Timestamp = "2026-01-01T09:00:00Z".parse().unwrap();
        let a = session_for("s1", slot);
        assert_eq!(a, session_for("s1", slot));
        assert_ne!(a, session_for("s2", slot));
        assert_ne!(a, session_for("s1", slot + SignedDuration::from_secs(60)));
        let uuid = uuid::Uuid::parse_str(&a).unwrap();
        assert_eq!(uuid.get_version_num(), 7);
    }
}
