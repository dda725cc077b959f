//! Schedules: agent turns and workflow runs that start on their own, on a
//! cron expression or an interval, exactly once per slot (issue #33,
//! part 1).
//!
//! http (`/v1/schedules`) ──▶ Schedules (checks, store docs) ──notify──▶ firing loop (one task per node)
//! firing loop ──sleep_until(next slot)──▶ claim (move_doc) ──▶ fire record + cursor (one write) ──▶ Sessions::start_turn(key) / Workflows::start
//!
//! # What is stored (documents, on redb and on PostgreSQL alike)
//! - `schedules/<id>`: the definition (listed under its tenant).
//! - `schedule_cursor/<id>`: `{next}`, the next slot not yet fired, while
//!   no node fires the schedule; `schedule_firing/<id>` while one does
//!   (`{next, node, since}`). The document is in exactly one of the two:
//!   moving it from the first to the second ([`crate::store::DocReads::move_doc`],
//!   atomic on both backends: of any number of nodes that try, one gets
//!   it) is the claim, a lease held for the few milliseconds of writing the
//!   fire record.
//! - `schedule_runs/<id>/<slot ms>`: one fire record per slot fired
//!   ([`Fire`]): the slot, when it fired, the session and turn (or the
//!   workflow run), its state. The last [`KEEP_RUNS`] per schedule are kept.
//! - `schedule_pending/<id>/<slot ms>`: the fire records whose turn is not
//!   started yet (normally none for more than a few milliseconds).
//!
//! # Exactly one fire per slot
//! 1. The node holding the claim reads the cursor it took, decides what is
//!    due ([`slots::Timing::due`]) and writes, in **one** durable store
//!    transaction, the fire records (`schedule_runs` and `schedule_pending`)
//!    and the cursor moved back with the next slot. So the fire is recorded
//!    before its turn starts, and a slot is recorded at most once however
//!    the writes race: a later claim reads the advanced cursor.
//! 2. Then the turn starts with idempotency key `schedule:<id>:<slot ms>`
//!    ([`Sessions::start_turn`]): a second start with that key rejoins the
//!    turn instead of starting another. A schedule whose `session` is
//!    `"new"` gets a session id derived from the schedule and the slot (a
//!    UUID v7 of the slot's time, its random bits a SHA-256 of id and
//!    slot), so a second start finds the same session and the same key.
//! 3. The record moves to `started` (with the turn id) and leaves
//!    `schedule_pending`.
//!
//! A crash between 1 and 3 leaves the record pending: at the next start
//! (one node), or once the firing node's heartbeat is stale or the record
//! older than [`TAKEOVER_AFTER`] (cluster), a node starts it with the same
//! session and key, which rejoins a turn that did start. A crash while
//! holding the claim (between the move and the write of step 1) leaves
//! the cursor in `schedule_firing`: it is moved back under the same rule,
//! and the slot, never recorded, is fired by the next claim (as a missed
//! slot, under the schedule's catch-up policy). A node whose lease was
//! taken over while it was only paused can at worst record a slot again:
//! the record is the same (same session, same key), so the turn still
//! starts once.
//!
//! A turn starts on the node that owns its session: in cluster mode a fire
//! into a fixed session that another live node holds is refused by the
//! store's ownership rule and stays pending (tried again after
//! [`TAKEOVER_AFTER`]) until that node lets the session go; the HTTP layer
//! forwards to the owner instead, which this layer, below it, cannot (a
//! `Sessions` entry that does would be the hook).
//!
//! A workflow run's id is derived from the schedule and the slot the
//! same way ([`crate::workflow::StartRun::id`]): a start taken up after a
//! crash finds the run a first start made and starts nothing, so a
//! scheduled run starts exactly once too.
//!
//! # Catch-up, time, limits
//! After downtime ([`CatchUp`]): `one` (the default) fires once, the
//! latest missed slot; `none` fires nothing until the next slot to come;
//! `all` fires each missed slot, at most [`slots::MAX_CATCH_UP`] (the
//! latest). A slot at most [`slots::ON_TIME_GRACE`] late is on time under
//! every policy. Never a burst: catch-up is decided once per claim, from
//! the stored cursor.
//!
//! Cron: `croner` 4 with its `jiff` backend (cadre's time crate: the time
//! zone rules are jiff's, and no chrono in the tree for this), 5 fields or
//! 6 with seconds first, no year field; a wall-clock time that a
//! daylight-saving change skips fires just after the gap, one repeated
//! fires once (croner's rules). The `cron` crate was the other candidate:
//! chrono only, and always six or seven fields. Intervals count from the
//! schedule's creation (or its last change of timing), whole seconds, at
//! least 1 s.
//!
//! Bounds: [`MAX_PER_TENANT`] schedules per tenant, a message like any
//! message ([`crate::conversation::sessions::MAX_CONTENT_BYTES`]), a
//! workflow input of at most [`MAX_INPUT_BYTES`], a webhook URL checked
//! like a message's ([`crate::webhooks::Webhooks::check`]: 422
//! `WEBHOOK_REFUSED`); each fire's turn or run POSTs its end there.
//!
//! # Rights
//! A schedule runs with the rights of the key that made it: its tenant and
//! its plan ceiling (a new session's plan is the key's and tenant's
//! ceiling). A key revoked or expired stops its schedules (each slot is
//! skipped, not fired; `GET` shows `active: false`); one made while the
//! server ran open runs only while it still runs open.
//!
//! # The firing loop
//! One task per serving node ([`Schedules::spawn_loop`]), stopped with the
//! runtime: it keeps every schedule's next slot in memory and sleeps until
//! the earliest (`tokio::time::sleep_until`), or until a schedule changes
//! on this node, or [`RESCAN`] (to see other nodes' changes and take over
//! what dead nodes left). An idle schedule costs one map entry and one
//! document read per rescan.
//!
//! Owns: schedule definitions, cursors and fire records. Does not: run
//! turns (conversation), run workflows (workflow), deliver webhooks.

mod firing;
pub mod slots;

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::conversation::Sessions;
use crate::conversation::sessions::check_content;
use crate::error_code::{ErrorCode, PublicError};
use crate::identity::{Principal, UserId};
use crate::store::{Store, StoreError};
use crate::tenants::KeyRing;
use crate::workflow::Workflows;
pub use slots::{CatchUp, Timing, TimingError};

/// Most schedules a tenant may have.
pub const MAX_PER_TENANT: usize = 1_000;
/// Largest workflow `input`, as JSON.
pub const MAX_INPUT_BYTES: usize = 64 * 1024;
/// Fire records kept per schedule (the newest).
pub const KEEP_RUNS: usize = 100;
/// How often the loop reads every schedule again and looks for work a
/// dead node left.
pub const RESCAN: Duration = Duration::from_secs(15);
/// Age past which a claim or a pending fire is taken over whatever its
/// node's heartbeat says.
pub const TAKEOVER_AFTER: Duration = Duration::from_secs(120);

/// The store's document namespaces (the module doc says what each holds).
pub const SCHEDULES: &str = "schedules";
pub const CURSORS: &str = "schedule_cursor";
pub const FIRING: &str = "schedule_firing";
pub const RUNS: &str = "schedule_runs";
pub const PENDING: &str = "schedule_pending";

#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error("no schedule with id '{id}'")]
    NotFound { id: String },
    #[error("{message}")]
    Invalid { message: String },
    #[error("the tenant has {max} schedules, the most allowed; delete one first")]
    TooMany { max: usize },
    #[error(transparent)]
    Webhook(#[from] crate::webhooks::WebhookRefused),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ScheduleError {
    fn invalid(message: impl Into<String>) -> Self {
        ScheduleError::Invalid {
            message: message.into(),
        }
    }
}

impl From<serde_json::Error> for ScheduleError {
    fn from(e: serde_json::Error) -> Self {
        ScheduleError::Store(e.into())
    }
}

impl From<TimingError> for ScheduleError {
    fn from(e: TimingError) -> Self {
        ScheduleError::invalid(e.to_string())
    }
}

impl PublicError for ScheduleError {
    fn code(&self) -> ErrorCode {
        match self {
            ScheduleError::NotFound { .. } => ErrorCode::ScheduleNotFound,
            ScheduleError::Invalid { .. } | ScheduleError::TooMany { .. } => {
                ErrorCode::ValidationError
            }
            ScheduleError::Webhook(w) => w.code(),
            ScheduleError::Store(s) => s.code(),
        }
    }
}

/// A schedule as asked for (`POST`), or its fields after a `PATCH`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ScheduleSpec {
    pub agent: Option<String>,
    pub message: Option<String>,
    pub workflow: Option<String>,
    pub input: Option<Value>,
    pub cron: Option<String>,
    pub interval_s: Option<u64>,
    pub timezone: Option<String>,
    pub session: Option<String>,
    pub user_id: Option<String>,
    pub webhook: Option<String>,
    pub catch_up: Option<CatchUp>,
}

/// A stored schedule.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Schedule {
    pub id: String,
    pub tenant: String,
    /// The key whose rights it runs with (`None`: made while the server
    /// ran open).
    pub key_id: Option<String>,
    /// An agent turn: the agent, the message, and `"new"` (a session per
    /// fire) or the session the turns go to.
    pub agent: Option<String>,
    pub message: Option<String>,
    pub session: Option<String>,
    /// A workflow run: the workflow and its input.
    pub workflow: Option<String>,
    pub input: Option<Value>,
    pub cron: Option<String>,
    pub interval_s: Option<u64>,
    pub timezone: String,
    pub user_id: Option<String>,
    pub webhook: Option<String>,
    pub catch_up: CatchUp,
    /// Where an interval counts from: the creation, or the last change of
    /// timing.
    pub anchor: Timestamp,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

impl Schedule {
    /// Its timing, parsed (a stored schedule was checked when written).
    pub fn timing(&self) -> Result<Timing, TimingError> {
        match (&self.cron, self.interval_s) {
            (Some(cron), _) => Timing::cron(cron, &self.timezone),
            (None, Some(every)) => Timing::interval(every, self.anchor),
            (None, None) => Err(TimingError::Interval {
                max: slots::MAX_INTERVAL_S,
            }),
        }
    }

    fn same_timing(&self, other: &Schedule) -> bool {
        self.cron == other.cron
            && self.interval_s == other.interval_s
            && self.timezone == other.timezone
    }
}

/// How a fire stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FireState {
    /// Recorded; its turn (or run) is being started.
    Claimed,
    /// Its turn (or run) started.
    Started,
    /// It could not start (`error` says why).
    Failed,
    /// Not fired: the key that made the schedule is no longer active.
    Skipped,
    /// A workflow run recorded but maybe not started before a crash, by a
    /// version that did not derive run ids (fires are taken up by
    /// rejoining their run now); kept so such records still read.
    Unknown,
}

/// One fire of a schedule: a slot.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Fire {
    pub schedule_id: String,
    pub tenant: String,
    /// The slot's time.
    pub slot: Timestamp,
    /// When it was recorded.
    pub fired_at: Timestamp,
    /// The node that recorded it (cluster mode).
    pub node: Option<String>,
    pub state: FireState,
    /// Agent schedules: the session and turn.
    pub session_id: Option<String>,
    pub turn_id: Option<String>,
    /// Workflow schedules: the run.
    pub run_id: Option<String>,
    pub error: Option<String>,
}

impl Fire {
    /// Its key under [`RUNS`] and [`PENDING`]: by slot within the schedule.
    pub fn key(&self) -> String {
        run_key(&self.schedule_id, self.slot)
    }

    /// The idempotency key its turn starts with.
    pub fn turn_key(&self) -> String {
        format!(
            "schedule:{}:{}",
            self.schedule_id,
            self.slot.as_millisecond()
        )
    }
}

/// The key of a schedule's fire of `slot` under [`RUNS`] and [`PENDING`].
pub fn run_key(id: &str, slot: Timestamp) -> String {
    format!("{id}/{:020}", slot.as_millisecond().max(0))
}

/// A schedule with what the loop knows of it, for the API.
#[derive(Debug, Clone)]
pub struct ScheduleView {
    pub schedule: Schedule,
    /// The next slot not yet fired (`None`: being fired now).
    pub next_fire_at: Option<Timestamp>,
    /// Whether its key still lets it fire.
    pub active: bool,
}

/// The handle: the API's entry to schedules, and the firing loop's owner.
#[derive(Clone)]
pub struct Schedules {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    sessions: Sessions,
    workflows: Workflows,
    keys: KeyRing,
    webhooks: crate::webhooks::Webhooks,
    /// Wakes the loop: a schedule changed on this node.
    changed: tokio::sync::Notify,
}

impl Schedules {
    pub fn new(
        store: Store,
        sessions: Sessions,
        workflows: Workflows,
        keys: KeyRing,
        webhooks: crate::webhooks::Webhooks,
    ) -> Self {
        Schedules {
            inner: Arc::new(Inner {
                store,
                sessions,
                workflows,
                keys,
                webhooks,
                changed: tokio::sync::Notify::new(),
            }),
        }
    }

    /// Creates a schedule for `caller`; durable before this returns. Its
    /// first slot is the first after now.
    pub async fn create(
        &self,
        caller: &Principal,
        spec: ScheduleSpec,
    ) -> Result<ScheduleView, ScheduleError> {
        let now = Timestamp::now();
        // Intervals count from a whole second: slots read `09:00:05`,
        // not `09:00:05.402`.
        let anchor = Timestamp::from_second(now.as_second()).unwrap_or(now);
        let schedule = Schedule {
            id: uuid::Uuid::now_v7().to_string(),
            tenant: caller.tenant.clone(),
            key_id: caller.key_id.clone(),
            agent: None,
            message: None,
            session: None,
            workflow: None,
            input: None,
            cron: None,
            interval_s: None,
            timezone: "UTC".into(),
            user_id: None,
            webhook: None,
            catch_up: CatchUp::default(),
            anchor,
            created_at: now,
            updated_at: now,
        };
        let schedule = self.merged(schedule, spec, true).await?;
        let count = self
            .inner
            .store
            .docs_of(SCHEDULES, &caller.tenant, None, MAX_PER_TENANT, false)
            .await?
            .items
            .len();
        if count >= MAX_PER_TENANT {
            return Err(ScheduleError::TooMany {
                max: MAX_PER_TENANT,
            });
        }
        let next = first_slot(&schedule, now)?;
        self.write_schedule(&schedule, Some(next)).await?;
        self.inner.changed.notify_one();
        Ok(ScheduleView {
            active: self.is_active(&schedule),
            schedule,
            next_fire_at: Some(next),
        })
    }

    /// A page of the caller's tenant's schedules, oldest first.
    pub async fn list(
        &self,
        caller: &Principal,
        cursor: Option<String>,
        limit: usize,
    ) -> Result<(Vec<ScheduleView>, Option<String>), ScheduleError> {
        let page = self
            .inner
            .store
            .docs_of(SCHEDULES, &caller.tenant, cursor, limit, false)
            .await?;
        let mut out = Vec::with_capacity(page.items.len());
        for (key, value) in page.items {
            match serde_json::from_value::<Schedule>(value) {
                Ok(s) => out.push(self.view(s).await?),
                Err(e) => {
                    tracing::warn!(schedule = %key, error = %e, "unreadable schedule skipped")
                }
            }
        }
        Ok((out, page.next))
    }

    /// A schedule of the caller's tenant; another tenant's is not found.
    pub async fn get(&self, caller: &Principal, id: &str) -> Result<ScheduleView, ScheduleError> {
        let schedule = self.owned(caller, id).await?;
        self.view(schedule).await
    }

    /// Changes the fields `spec` names. A change of timing (cron,
    /// interval, time zone) starts it again from now: no slot before the
    /// change is fired.
    pub async fn update(
        &self,
        caller: &Principal,
        id: &str,
        spec: ScheduleSpec,
    ) -> Result<ScheduleView, ScheduleError> {
        let old = self.owned(caller, id).await?;
        let now = Timestamp::now();
        let mut schedule = self.merged(old.clone(), spec, false).await?;
        schedule.updated_at = now;
        let next = if schedule.same_timing(&old) {
            None
        } else {
            schedule.anchor = Timestamp::from_second(now.as_second()).unwrap_or(now);
            Some(first_slot(&schedule, now)?)
        };
        self.write_schedule(&schedule, next).await?;
        self.inner.changed.notify_one();
        self.view(schedule).await
    }

    /// Deletes a schedule and its fire records. A fire already recorded
    /// when the delete lands still starts its turn; none after.
    pub async fn delete(&self, caller: &Principal, id: &str) -> Result<(), ScheduleError> {
        self.owned(caller, id).await?;
        let store = &self.inner.store;
        let prefix = format!("{id}/");
        let mut ops = vec![
            delete_op(CURSORS, id),
            delete_op(FIRING, id),
            delete_op(SCHEDULES, id),
        ];
        for ns in [RUNS, PENDING] {
            for (key, _) in store.list_docs(ns, &prefix).await? {
                ops.push(delete_op(ns, &key));
            }
        }
        store.write(ops, true).await?;
        self.inner.changed.notify_one();
        Ok(())
    }

    /// The fire records of a schedule of the caller's tenant, newest
    /// first, at most `limit`.
    pub async fn runs(
        &self,
        caller: &Principal,
        id: &str,
        limit: usize,
    ) -> Result<Vec<(Fire, Option<String>)>, ScheduleError> {
        self.owned(caller, id).await?;
        let mut fires = self.fires(id).await?;
        fires.reverse();
        fires.truncate(limit);
        let mut out = Vec::with_capacity(fires.len());
        for fire in fires {
            let status = self.status_of(&fire).await?;
            out.push((fire, status));
        }
        Ok(out)
    }

    /// Every fire record of schedule `id`, oldest first.
    async fn fires(&self, id: &str) -> Result<Vec<Fire>, ScheduleError> {
        Ok(self
            .inner
            .store
            .list_docs(RUNS, &format!("{id}/"))
            .await?
            .into_iter()
            .filter_map(|(_, v)| serde_json::from_value(v).ok())
            .collect())
    }

    /// How the fire's turn (or run) stands, when it is known: the turn's
    /// phase, or the run's status.
    async fn status_of(&self, fire: &Fire) -> Result<Option<String>, ScheduleError> {
        let store = &self.inner.store;
        let record = match (&fire.session_id, &fire.turn_id, &fire.run_id) {
            (Some(session), Some(turn), _) => store.turn(session, turn).await?,
            (_, _, Some(run)) => {
                store
                    .get_doc(crate::workflow::run::RUNS_NAMESPACE, run)
                    .await?
            }
            _ => None,
        };
        Ok(record.and_then(|r| {
            r.get("phase")
                .or_else(|| r.get("status"))
                .and_then(|p| p.as_str().map(str::to_string).or_else(|| phase_name(p)))
        }))
    }

    async fn owned(&self, caller: &Principal, id: &str) -> Result<Schedule, ScheduleError> {
        let not_found = || ScheduleError::NotFound {
            id: crate::identity::quoted_id(id),
        };
        if id.len() > crate::identity::MAX_ID_BYTES || id.contains('/') {
            return Err(not_found());
        }
        let value = self
            .inner
            .store
            .get_doc(SCHEDULES, id)
            .await?
            .ok_or_else(not_found)?;
        let schedule: Schedule =
            serde_json::from_value(value).map_err(|e| ScheduleError::Store(e.into()))?;
        if schedule.tenant != caller.tenant {
            return Err(not_found());
        }
        Ok(schedule)
    }

    async fn view(&self, schedule: Schedule) -> Result<ScheduleView, ScheduleError> {
        let next_fire_at = self
            .inner
            .store
            .get_doc(CURSORS, &schedule.id)
            .await?
            .and_then(|v| serde_json::from_value::<firing::Cursor>(v).ok())
            .map(|c| c.next);
        Ok(ScheduleView {
            active: self.is_active(&schedule),
            next_fire_at,
            schedule,
        })
    }

    /// Whether the key that made `schedule` still lets it fire.
    fn is_active(&self, schedule: &Schedule) -> bool {
        self.principal_of(schedule).is_some()
    }

    /// The rights `schedule` fires with now: its key's, while the key is
    /// active; open mode's while the server runs open, for one made then.
    fn principal_of(&self, schedule: &Schedule) -> Option<Principal> {
        let keys = &self.inner.keys;
        let principal = match &schedule.key_id {
            Some(key) => keys.principal_of(key, Timestamp::now())?,
            None if keys.is_open() => Principal::open(),
            None => return None,
        };
        (principal.tenant == schedule.tenant).then_some(principal)
    }

    /// Writes the schedule (and, with `next`, its cursor) durably.
    async fn write_schedule(
        &self,
        schedule: &Schedule,
        next: Option<Timestamp>,
    ) -> Result<(), ScheduleError> {
        let mut ops = vec![crate::store::WriteOp::PutDoc {
            namespace: SCHEDULES.into(),
            key: schedule.id.clone(),
            value: serde_json::to_value(schedule).map_err(|e| ScheduleError::Store(e.into()))?,
            tenant: Some(schedule.tenant.clone()),
        }];
        if let Some(next) = next {
            ops.push(crate::store::WriteOp::PutDoc {
                namespace: CURSORS.into(),
                key: schedule.id.clone(),
                value: serde_json::to_value(firing::Cursor { next })
                    .map_err(|e| ScheduleError::Store(e.into()))?,
                tenant: None,
            });
        }
        self.inner.store.write(ops, true).await?;
        Ok(())
    }

    /// `schedule` with the fields `spec` names, checked as a whole. On
    /// create (`new`), `cron` or `interval_s` is required; on a change,
    /// naming one drops the other.
    async fn merged(
        &self,
        mut s: Schedule,
        spec: ScheduleSpec,
        new: bool,
    ) -> Result<Schedule, ScheduleError> {
        match (&spec.cron, spec.interval_s) {
            (Some(_), Some(_)) => {
                return Err(ScheduleError::invalid(
                    "give one of 'cron' and 'interval_s', not both",
                ));
            }
            (Some(cron), None) => {
                if cron.len() > 256 {
                    return Err(ScheduleError::invalid("'cron' is longer than 256 bytes"));
                }
                s.cron = Some(cron.clone());
                s.interval_s = None;
            }
            (None, Some(every)) => {
                s.interval_s = Some(every);
                s.cron = None;
            }
            (None, None) if new => {
                return Err(ScheduleError::invalid("give 'cron' or 'interval_s'"));
            }
            (None, None) => {}
        }
        if let Some(tz) = spec.timezone {
            s.timezone = tz;
        }
        slots::time_zone(&s.timezone)?;
        s.timing()?;
        if let Some(c) = spec.catch_up {
            s.catch_up = c;
        }
        if let Some(user) = spec.user_id {
            UserId::parse(&user).map_err(|e| ScheduleError::invalid(e.to_string()))?;
            s.user_id = Some(user);
        }
        if let Some(url) = spec.webhook {
            s.webhook = Some(self.inner.webhooks.check(&s.tenant, &url).await?);
        }
        let is_workflow = spec.workflow.is_some() || spec.input.is_some();
        let is_agent = spec.agent.is_some() || spec.message.is_some() || spec.session.is_some();
        if is_workflow && is_agent {
            return Err(ScheduleError::invalid(
                "a schedule starts an agent turn ('agent', 'message', 'session') or a workflow run ('workflow', 'input'), not both",
            ));
        }
        if is_workflow {
            if s.agent.is_some() {
                return Err(ScheduleError::invalid(
                    "this schedule starts agent turns: 'workflow' and 'input' do not apply",
                ));
            }
            if let Some(w) = spec.workflow {
                s.workflow = Some(w);
            }
            if let Some(input) = spec.input {
                s.input = Some(input);
            }
        }
        if is_agent {
            if s.workflow.is_some() {
                return Err(ScheduleError::invalid(
                    "this schedule starts workflow runs: 'agent', 'message' and 'session' do not apply",
                ));
            }
            if let Some(a) = spec.agent {
                s.agent = Some(a);
            }
            if let Some(m) = spec.message {
                s.message = Some(m);
            }
            if let Some(session) = spec.session {
                s.session = Some(session);
            }
        }
        match (&s.agent, &s.workflow) {
            (Some(agent), None) => self.check_turn(&s, agent).await?,
            (None, Some(workflow)) => self.check_run(&s, workflow)?,
            _ => {
                return Err(ScheduleError::invalid(
                    "give 'agent' and 'message' (an agent turn) or 'workflow' (a workflow run)",
                ));
            }
        }
        Ok(s)
    }

    async fn check_turn(&self, s: &Schedule, agent: &str) -> Result<(), ScheduleError> {
        if self.inner.sessions.agents().get(agent).is_none() {
            return Err(ScheduleError::invalid(format!(
                "no agent named '{}'",
                crate::identity::quoted_id(agent)
            )));
        }
        let message = s.message.as_deref().ok_or_else(|| {
            ScheduleError::invalid("give 'message': what the agent is asked at each fire")
        })?;
        check_content(message).map_err(|e| ScheduleError::invalid(format!("'message': {e}")))?;
        match s.session.as_deref() {
            None | Some("new") => Ok(()),
            Some(id) => {
                let session = self
                    .inner
                    .sessions
                    .get(&crate::identity::Scope::tenant(s.tenant.clone()), id)
                    .await
                    .map_err(|_| {
                        ScheduleError::invalid(format!(
                            "'session' is \"new\" or the id of one of the tenant's sessions; there is no session '{}'",
                            crate::identity::quoted_id(id)
                        ))
                    })?;
                if session.agent != agent {
                    return Err(ScheduleError::invalid(format!(
                        "session '{id}' talks to agent '{}', not '{agent}'",
                        session.agent
                    )));
                }
                Ok(())
            }
        }
    }

    fn check_run(&self, s: &Schedule, workflow: &str) -> Result<(), ScheduleError> {
        let Some(definition) = self.inner.workflows.definition(workflow) else {
            return Err(ScheduleError::invalid(format!(
                "no workflow named '{}'",
                crate::identity::quoted_id(workflow)
            )));
        };
        let input = s.input.clone().unwrap_or(Value::Null);
        if serde_json::to_vec(&input).map_or(0, |b| b.len()) > MAX_INPUT_BYTES {
            return Err(ScheduleError::invalid(format!(
                "'input' is over {MAX_INPUT_BYTES} bytes as JSON"
            )));
        }
        let input = if input.is_null() {
            serde_json::json!({})
        } else {
            input
        };
        definition.input.validate(input).map_err(|errors| {
            let fields: Vec<String> = errors
                .iter()
                .map(|e| format!("{}: {}", e.field, e.message))
                .collect();
            ScheduleError::invalid(format!(
                "'input' does not match workflow '{workflow}': {}",
                fields.join("; ")
            ))
        })?;
        Ok(())
    }

    /// Starts the firing loop of this node; it ends when `stop` is
    /// cancelled.
    pub fn spawn_loop(&self, stop: tokio_util::sync::CancellationToken) {
        let this = self.clone();
        tokio::spawn(async move { firing::run(this, stop).await });
    }
}

/// The first slot after `now`.
fn first_slot(s: &Schedule, now: Timestamp) -> Result<Timestamp, ScheduleError> {
    s.timing()?.next_after(now).ok_or(ScheduleError::Invalid {
        message: "the schedule has no slot to come".into(),
    })
}

fn delete_op(namespace: &str, key: &str) -> crate::store::WriteOp {
    crate::store::WriteOp::DeleteDoc {
        namespace: namespace.into(),
        key: key.into(),
    }
}

/// A turn phase stored as an object (`{"awaiting_approval": {...}}`): its name.
fn phase_name(p: &Value) -> Option<String> {
    p.as_object()?.keys().next().cloned()
}
