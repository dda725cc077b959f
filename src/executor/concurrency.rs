//! Concurrency controller: how many tool calls run at once, and who waits.
//!
//! ExecuteTool ──▶ lookup · validation · cache ──▶ acquire ──▶ handler ──▶ Permit dropped
//!                                                  │ pool slot + bucket slot: run now
//!                                                  │ none free: wait in the queue, or refusal
//!                                                  └ workflow node: bypass, permit at once
//!
//! The executor asks for a [`Permit`] after a call passed validation and
//! missed the cache (a cached or refused call needs no slot), and holds it
//! while the handler runs, retries included; dropping the permit frees its
//! slots and admits the next waiter(s).
//!
//! Slots. A counted call needs one slot of the global pool (`max_concurrent`)
//! and, when its category has a `bucket_limits` entry, one slot of that
//! bucket. Categories without an entry need only the pool slot.
//!
//! Tenants. The pool is shared, admission is fair: a tenant (the call's
//! `ctx.tenant`, `default` when none) holds at most `max_per_tenant` slots
//! (default half the pool, at least 1), whether or not anyone else is
//! waiting, so a tenant flooding with long calls leaves the rest of the pool
//! to the others. Each tenant has its own queue inside the pool, of at most
//! its share of `queue_size` (`queue_size × max_per_tenant / max_concurrent`,
//! at least 1); past it the call is refused with
//! [`Refusal::TenantQueueFull`] (`TOOL_QUEUE_FULL`). Freed slots go round-robin
//! between the tenants with a waiter that can run: the tenant served goes to
//! the back of the turns, a tenant skipped (at its cap, or its waiters'
//! buckets full) keeps its place. Plain round-robin, not weighted by plan:
//! the plan belongs to each call (`ctx.plan`, chosen per request), not to
//! the tenant, so a weight would be whatever the last caller asked for.
//! Setting `max_per_tenant = max_concurrent` turns the cap off (one tenant,
//! or tenants that trust each other) and leaves the round-robin.
//!
//! Strategies, inside each tenant's queue. `fifo` admits a tenant's waiters
//! in arrival order (their priority is ignored); `priority` admits its
//! highest `priority` first and keeps arrival order among equals (priority
//! never lets one tenant overtake another's turn); `reject` has no queue: a
//! call that finds no slot is refused at once with [`Refusal::QueueFull`].
//! Under `fifo` and `priority` at most `queue_size` callers wait in all; one
//! more is refused with `QueueFull` (no eviction: a high-priority newcomer
//! does not push out a waiter).
//!
//! Buckets never block other categories. When slots free up, the turns are
//! walked and each tenant's queue scanned in strategy order; every waiter
//! that can run now is admitted, one per tenant per round; a waiter whose
//! bucket is full, or whose tenant is at its cap, is skipped, not a
//! head-of-line blocker. The invariant after every change is "no queued
//! waiter could run now", which is why a newcomer that fits may start at
//! once without overtaking anyone who could have started.
//!
//! Per-call timeouts. What a caller may ask a call to hold its slot for is
//! capped by each tool (`sleep` 60 s, `http_request` 300 s + 5 s grace;
//! operator-written tools at most 3600 s); `ExecutionContext.timeout` is
//! not settable over the API and is set only by workflow nodes, which
//! bypass the pool. With `max_per_tenant` below `max_concurrent` these caps
//! no longer decide who gets a slot: a tenant holding its share with long
//! calls delays only its own queue, and another tenant's call waits at most
//! for one of the slots its own share leaves free, i.e. one slot's turn of
//! the calls that hold it. They stay as they are.
//!
//! Timeouts. A waiter waits at most its request's timeout (else
//! `default_timeout_s`), then leaves with [`Refusal::Timeout`]. The queue
//! itself decides who holds what: a waiter leaves the queue in exactly one of
//! two ways, both under the lock: the release scan removes it and hands it
//! its slots, or the waiter removes itself (deadline or cancellation). So
//! when the deadline and a grant land together, the waiter looks once under
//! the lock: still queued means timeout; gone means the slots are already
//! its and it keeps them (a grant is never thrown away, nor leaked). A
//! dropped `acquire` future does the same from a drop guard: still queued, it
//! just leaves; already granted, it returns the slots, which admits the next
//! waiter.
//!
//! Bypass. Workflow nodes (`caller_type = workflow_node`) run outside the
//! limits: their permit is handed out at once and counted only in
//! `total_bypassed`, not in the pool, the buckets, `total_acquired` or the
//! average hold time.
//!
//! The decisions live in `State`, a plain struct with no IO and no awaits
//! (`admit`, `release`, `leave`); `acquire` only waits between them. One
//! `std::sync::Mutex` guards it: every critical section is a few map
//! operations and never spans an `.await`, so a tokio mutex would add cost
//! and nothing else. A poisoned lock is used as is: `State` has no
//! multi-step update that a panic could leave half done.
//!
//! Shared caps: one seam, [`PermitPool`]. After its local permit, a
//! counted call asks the controller's pool for a slot of the global pool
//! and of its bucket. On one node the local slots are all there are:
//! [`NodePool`] always has room and holds nothing. In cluster mode the
//! runtime gives the controller a pool whose slots are leased permits in
//! Redis (`cluster::permits`: the global pool and the bucket in one atomic
//! script), so the pool cap and the bucket caps hold across every node;
//! queueing, strategies, tenant fairness and bypass stay local and
//! unchanged. When the pool is full, the controller retries with a
//! bounded, jittered backoff (2 ms doubling to 50 ms) until the call's wait
//! timeout ([`Refusal::Timeout`]); under `reject` it is refused at once.
//! Polling, not keyspace notifications: they need a server setting
//! (`notify-keyspace-events`) operators may not control, are lost across a
//! reconnect, and a 50 ms poll costs one round trip per waiter. Waiters of
//! different nodes are therefore not served in arrival order across the
//! cluster, only within a node. When the pool cannot be asked, its own
//! failure policy (`[cluster] redis_failure`) answers: `closed` is an error,
//! refused here with [`Refusal::Unavailable`] (`LIMITS_UNAVAILABLE`,
//! retryable); `local` is room with nothing held, so the call runs on its
//! local permit alone (caps then hold per node). The local metrics count
//! this node's calls; the Redis leases are counted by Redis.
//!
//! Async at the seam: [`PermitPool::acquire`] is async (`async-trait`)
//! because a shared pool asks over the network; [`NodePool`] answers at
//! once. A held slot is a [`PoolLease`] kept in the [`Permit`] and dropped
//! (given back) with it.
//!
//! Owns: slots, the per-tenant wait queues, admission metrics. Does not: time out the
//! handler (the executor does), rate-limit per plan (the governor does).

use std::cmp::Reverse;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::limits::LimitsUnavailable;
use crate::identity::DEFAULT_TENANT;
use crate::tools::{CallerType, ErrorType};

/// How many tool calls may run at once, and what happens to the rest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConcurrencyConfig {
    /// Slots of the global pool; every counted call holds one while it runs.
    pub max_concurrent: usize,
    /// Most callers that may wait for a slot; the next one is refused.
    pub queue_size: usize,
    /// How long a caller waits for a slot when its request sets no timeout.
    pub default_timeout_s: f64,
    pub strategy: Strategy,
    /// Slot limits per tool category (`{"http": 5, "ai": 2}`), on top of the
    /// pool. Categories not named here need only a pool slot.
    pub bucket_limits: BTreeMap<String, usize>,
    /// Most pool slots one tenant holds at once; its share of the queue is
    /// the same fraction of `queue_size`. Unset: half of `max_concurrent`,
    /// at least 1 ([`tenant_slots`](Self::tenant_slots)).
    pub max_per_tenant: Option<usize>,
}

impl Default for ConcurrencyConfig {
    fn default() -> Self {
        ConcurrencyConfig {
            max_concurrent: 10,
            queue_size: 100,
            default_timeout_s: 30.0,
            strategy: Strategy::Fifo,
            bucket_limits: BTreeMap::new(),
            max_per_tenant: None,
        }
    }
}

impl ConcurrencyConfig {
    /// Checks the values serde cannot: every limit admits at least one call
    /// and the timeout is a usable duration. `queue_size = 0` is allowed (no
    /// waiting: a call that finds no slot is refused, like `reject`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_concurrent == 0 {
            return Err(ConfigError::MaxConcurrentZero);
        }
        if let Some((bucket, _)) = self.bucket_limits.iter().find(|(_, limit)| **limit == 0) {
            return Err(ConfigError::BucketLimitZero {
                bucket: bucket.clone(),
            });
        }
        if let Some(value) = self.max_per_tenant
            && !(1..=self.max_concurrent).contains(&value)
        {
            return Err(ConfigError::MaxPerTenant {
                value,
                max_concurrent: self.max_concurrent,
            });
        }
        match Duration::try_from_secs_f64(self.default_timeout_s) {
            Ok(timeout) if !timeout.is_zero() => Ok(()),
            _ => Err(ConfigError::DefaultTimeout {
                value: self.default_timeout_s,
            }),
        }
    }

    /// Pool slots one tenant may hold: `max_per_tenant`, else half the pool;
    /// always between 1 and `max_concurrent`.
    pub fn tenant_slots(&self) -> usize {
        let pool = self.max_concurrent.max(1);
        self.max_per_tenant.unwrap_or(pool / 2).clamp(1, pool)
    }

    /// Callers of one tenant that may wait: the tenant's share of the pool
    /// applied to `queue_size`, at least 1 (0 only when `queue_size` is 0).
    pub fn tenant_queue(&self) -> usize {
        if self.queue_size == 0 {
            return 0;
        }
        let pool = self.max_concurrent.max(1);
        let share = (self.queue_size as u128 * self.tenant_slots() as u128 / pool as u128) as usize;
        share.max(1)
    }

    /// `default_timeout_s` as a duration; 30 s if it is not a valid one
    /// (which [`validate`](Self::validate) reports).
    pub fn default_timeout(&self) -> Duration {
        match Duration::try_from_secs_f64(self.default_timeout_s) {
            Ok(timeout) if !timeout.is_zero() => timeout,
            _ => Duration::from_secs(30),
        }
    }
}

/// The order in which waiting calls get free slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Arrival order.
    #[default]
    Fifo,
    /// Highest `priority` first, arrival order among equals.
    Priority,
    /// No queue: refused at once when no slot is free.
    Reject,
}

/// A [`ConcurrencyConfig`] value that cannot work; names the key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("max_concurrent must be at least 1, got 0")]
    MaxConcurrentZero,
    #[error("bucket_limits.{bucket} must be at least 1, got 0")]
    BucketLimitZero { bucket: String },
    #[error("default_timeout_s must be a positive, finite number of seconds, got {value}")]
    DefaultTimeout { value: f64 },
    #[error("max_per_tenant must be between 1 and max_concurrent ({max_concurrent}), got {value}")]
    MaxPerTenant { value: usize, max_concurrent: usize },
}

impl ConfigError {
    /// The offending key, dotted (`bucket_limits.http`).
    pub fn key(&self) -> String {
        match self {
            ConfigError::MaxConcurrentZero => "max_concurrent".into(),
            ConfigError::BucketLimitZero { bucket } => format!("bucket_limits.{bucket}"),
            ConfigError::DefaultTimeout { .. } => "default_timeout_s".into(),
            ConfigError::MaxPerTenant { .. } => "max_per_tenant".into(),
        }
    }
}

/// One call asking to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionRequest {
    /// Whose share of the pool and whose queue the call uses.
    pub tenant: String,
    /// The tool's category; picks the bucket, if one is configured.
    pub category: String,
    /// Higher runs first under [`Strategy::Priority`]; ignored otherwise.
    pub priority: i32,
    /// Skip the limits entirely (workflow nodes).
    pub bypass: bool,
    /// Longest wait for a slot; `None` means the config's default.
    pub timeout: Option<Duration>,
}

impl AdmissionRequest {
    /// A counted call of `category` for the default tenant: priority 0,
    /// default timeout.
    pub fn new(category: impl Into<String>) -> Self {
        AdmissionRequest {
            tenant: DEFAULT_TENANT.to_owned(),
            category: category.into(),
            priority: 0,
            bypass: false,
            timeout: None,
        }
    }

    /// A call made by `caller`: workflow nodes bypass the limits.
    pub fn for_caller(category: impl Into<String>, caller: CallerType) -> Self {
        AdmissionRequest {
            bypass: caller == CallerType::WorkflowNode,
            ..AdmissionRequest::new(category)
        }
    }

    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = tenant.into();
        self
    }

    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// Why a call was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No free slot and no place to wait (`queue_size` is 0 under `reject`).
    #[error("no free execution slot and the wait queue is full ({queue_size} places)")]
    QueueFull { queue_size: usize },
    /// The caller's tenant already has its share of the queue waiting.
    #[error(
        "no free execution slot for this tenant and its share of the wait queue is full ({places} places)"
    )]
    TenantQueueFull { places: usize },
    /// Waited for a slot until the timeout.
    #[error("no execution slot became free within {} ms", waited.as_millis())]
    Timeout { waited: Duration },
    /// The shared pool cannot be asked and its failure policy refuses
    /// (cluster mode, `closed`: Redis cannot be reached).
    #[error(
        "concurrency limits cannot be checked now: the cluster's Redis is unreachable; retry shortly"
    )]
    Unavailable { reason: String },
}

impl Refusal {
    /// The tool failure this refusal is reported as.
    pub fn error_type(&self) -> ErrorType {
        match self {
            Refusal::QueueFull { .. } | Refusal::TenantQueueFull { .. } => ErrorType::QueueFull,
            Refusal::Timeout { .. } => ErrorType::Timeout,
            Refusal::Unavailable { .. } => ErrorType::LimitsUnavailable,
        }
    }
}

/// The right to run one call. Dropping it frees its slots and admits the
/// next waiter(s) that fit.
#[must_use = "dropping a permit frees its slot at once"]
pub struct Permit {
    tenant: String,
    category: String,
    /// The controller's state, to give the slots back; `None` for a bypass
    /// permit, which holds no slot.
    owner: Option<Arc<Mutex<State>>>,
    since: Instant,
    /// The shared pool's slots held beside the local one (cluster mode);
    /// dropped (given back) with it.
    lease: Option<Box<dyn PoolLease>>,
}

impl Permit {
    pub fn category(&self) -> &str {
        &self.category
    }

    /// Whether this permit skipped the limits (workflow node).
    pub fn is_bypass(&self) -> bool {
        self.owner.is_none()
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("category", &self.category)
            .field("bypass", &self.is_bypass())
            .field("held", &self.since.elapsed())
            .finish()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(state) = self.owner.take() {
            lock(&state).release(&self.tenant, &self.category, Some(self.since.elapsed()));
        }
    }
}

/// A snapshot of the controller.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConcurrencyMetrics {
    /// Pool slots held now (bypass permits excluded).
    pub current_concurrent: usize,
    /// Callers waiting for a slot.
    pub queue_length: usize,
    /// Permits handed out to counted calls.
    pub total_acquired: u64,
    /// Calls refused with `TOOL_QUEUE_FULL`.
    pub total_rejected: u64,
    /// Waiters that gave up at their timeout.
    pub total_timeout: u64,
    /// Permits handed out to bypassing calls (workflow nodes).
    pub total_bypassed: u64,
    /// Mean time counted permits were held, over those released so far.
    pub avg_execution_time_ms: f64,
    /// One entry per configured bucket.
    pub buckets: BTreeMap<String, BucketMetrics>,
    /// Pool slots one tenant may hold ([`ConcurrencyConfig::tenant_slots`]).
    pub max_per_tenant: usize,
    /// Callers of one tenant that may wait ([`ConcurrencyConfig::tenant_queue`]).
    pub max_queued_per_tenant: usize,
    /// Tenants holding at least one slot now.
    pub tenants_running: usize,
    /// Tenants with at least one caller waiting.
    pub tenants_waiting: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BucketMetrics {
    /// Slots of this bucket held now.
    pub current: usize,
    pub limit: usize,
    /// Callers of this category waiting.
    pub queue: usize,
}

/// Where the caps of the global pool and the buckets are held beside
/// this node's own slots (module doc).
#[async_trait::async_trait]
pub trait PermitPool: Send + Sync + fmt::Debug {
    /// A slot of the global pool and of `category`'s bucket (if it has
    /// one), or [`Pooled::Full`] when one of them is at its cap; then
    /// nothing was taken.
    async fn acquire(&self, category: &str) -> Result<Pooled, LimitsUnavailable>;
}

/// What a [`PermitPool`] answered.
#[derive(Debug)]
pub enum Pooled {
    /// Room: the slots held, given back when the lease is dropped; `None`
    /// when the pool holds nothing for the call (this node's slots are all
    /// there are, or the failure policy let the call run on them alone).
    Room(Option<Box<dyn PoolLease>>),
    /// A pool the call needs is at its cap.
    Full,
}

/// Slots held in a shared pool; dropping it gives them back.
pub trait PoolLease: Send + Sync + fmt::Debug {}

/// The pool of a single node: the local slots are the caps, so it always
/// has room and holds nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodePool;

#[async_trait::async_trait]
impl PermitPool for NodePool {
    async fn acquire(&self, _category: &str) -> Result<Pooled, LimitsUnavailable> {
        Ok(Pooled::Room(None))
    }
}

/// Admission for every counted tool call; cheap to clone (one shared state).
#[derive(Clone)]
pub struct ConcurrencyController {
    state: Arc<Mutex<State>>,
    default_timeout: Duration,
    /// Under `reject` a full shared pool refuses at once.
    strategy: Strategy,
    /// The caps every node shares ([`NodePool`] on one node).
    pool: Arc<dyn PermitPool>,
}

impl fmt::Debug for ConcurrencyController {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyController")
            .field("state", &self.state)
            .field("default_timeout", &self.default_timeout)
            .field("pool", &self.pool)
            .finish()
    }
}

/// First and longest pause between two asks of a full shared pool.
const FIRST_BACKOFF: Duration = Duration::from_millis(2);
const MAX_BACKOFF: Duration = Duration::from_millis(50);

impl ConcurrencyController {
    /// Expects a config that passed [`ConcurrencyConfig::validate`]; with
    /// `max_concurrent = 0` every counted call would wait until its timeout.
    pub fn new(config: ConcurrencyConfig) -> Self {
        Self::with_pool(config, Arc::new(NodePool))
    }

    /// A controller whose pool and bucket caps are also held in `pool`
    /// (cluster mode: every node's; queueing stays local, see the module
    /// doc).
    pub fn with_pool(config: ConcurrencyConfig, pool: Arc<dyn PermitPool>) -> Self {
        ConcurrencyController {
            default_timeout: config.default_timeout(),
            strategy: config.strategy,
            state: Arc::new(Mutex::new(State::new(&config))),
            pool,
        }
    }

    /// A permit to run one call: at once when its slots are free (or it
    /// bypasses), else after waiting in the queue, or a refusal. A counted
    /// call then also needs room in the shared pool (module doc).
    ///
    /// Cancel-safe: dropping the future gives up its place in the queue, and
    /// any slot granted to it meanwhile goes to the next waiter.
    pub async fn acquire(&self, req: AdmissionRequest) -> Result<Permit, Refusal> {
        if req.bypass {
            return self.acquire_local(req).await;
        }
        let started = Instant::now();
        let deadline = started.checked_add(req.timeout.unwrap_or(self.default_timeout));
        let category = req.category.clone();
        let mut permit = self.acquire_local(req).await?;
        let mut backoff = FIRST_BACKOFF;
        loop {
            match self.pool.acquire(&category).await {
                Ok(Pooled::Room(lease)) => {
                    permit.lease = lease;
                    return Ok(permit);
                }
                Ok(Pooled::Full) if self.strategy == Strategy::Reject => {
                    lock(&self.state).total_rejected += 1;
                    return Err(Refusal::QueueFull { queue_size: 0 });
                }
                Ok(Pooled::Full) => {
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        lock(&self.state).total_timeout += 1;
                        return Err(Refusal::Timeout {
                            waited: started.elapsed(),
                        });
                    }
                    let half = backoff / 2;
                    let pause = half + half.mul_f64(rand::random::<f64>());
                    let until = deadline.map_or(now + pause, |d| (now + pause).min(d));
                    tokio::time::sleep_until(until).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "no concurrency permit: the shared pool is unavailable");
                    return Err(Refusal::Unavailable { reason: e.reason });
                }
            }
        }
    }

    /// This node's permit alone (all of `acquire` but the shared pool).
    async fn acquire_local(&self, req: AdmissionRequest) -> Result<Permit, Refusal> {
        let AdmissionRequest {
            tenant,
            category,
            priority,
            bypass,
            timeout,
        } = req;
        if bypass {
            lock(&self.state).total_bypassed += 1;
            return Ok(Permit {
                tenant,
                category,
                owner: None,
                since: Instant::now(),
                lease: None,
            });
        }
        let admitted = lock(&self.state).admit(&tenant, &category, priority);
        let (key, mut granted) = match admitted {
            Admit::Now => return Ok(self.permit(tenant, category)),
            Admit::Refused(refusal) => return Err(refusal),
            Admit::Queued(key, granted) => (key, granted),
        };
        // Declared after `granted`, so dropped before it: the guard leaves
        // the queue before the receiver goes, and the scan never sends to a
        // waiter nobody will answer for.
        let waiter = QueuedWaiter {
            state: &self.state,
            key,
            tenant,
            category,
            armed: true,
        };
        let started = Instant::now();
        // Whether woken by the grant or the deadline, the queue decides below.
        match started.checked_add(timeout.unwrap_or(self.default_timeout)) {
            Some(deadline) => {
                let _ = tokio::time::timeout_at(deadline, &mut granted).await;
            }
            None => {
                let _ = (&mut granted).await;
            }
        }
        let mut state = lock(&self.state);
        let left = state.leave(&waiter.tenant, &key);
        let (tenant, category) = waiter.disarm();
        match left {
            Left::Queued => {
                state.total_timeout += 1;
                Err(Refusal::Timeout {
                    waited: started.elapsed(),
                })
            }
            Left::Granted => {
                state.total_acquired += 1;
                drop(state);
                Ok(self.permit(tenant, category))
            }
        }
    }

    pub fn metrics(&self) -> ConcurrencyMetrics {
        lock(&self.state).metrics()
    }

    /// A permit for slots already taken in the state.
    fn permit(&self, tenant: String, category: String) -> Permit {
        Permit {
            tenant,
            category,
            owner: Some(Arc::clone(&self.state)),
            since: Instant::now(),
            lease: None,
        }
    }
}

/// A waiter's place in the queue while its `acquire` future waits; if the
/// future is dropped, takes the waiter out (or returns its granted slots).
struct QueuedWaiter<'a> {
    state: &'a Mutex<State>,
    key: WaitKey,
    tenant: String,
    category: String,
    armed: bool,
}

impl QueuedWaiter<'_> {
    /// The waiter left the queue by itself; nothing to undo. Takes no lock.
    fn disarm(mut self) -> (String, String) {
        self.armed = false;
        (
            std::mem::take(&mut self.tenant),
            std::mem::take(&mut self.category),
        )
    }
}

impl Drop for QueuedWaiter<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut state = lock(self.state);
        if let Left::Granted = state.leave(&self.tenant, &self.key) {
            state.release(&self.tenant, &self.category, None);
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Order inside a tenant's queue: `rank` first (the negated priority, or 0
/// under fifo), then arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct WaitKey {
    rank: Reverse<i32>,
    seq: u64,
}

#[derive(Debug)]
struct Waiter {
    category: String,
    /// Fired when the scan has taken this waiter's slots for it.
    granted: oneshot::Sender<()>,
}

#[derive(Debug)]
struct Bucket {
    limit: usize,
    current: usize,
}

/// What [`State::admit`] decided.
#[derive(Debug)]
enum Admit {
    /// Slots taken: run now.
    Now,
    /// Waiting; the receiver fires when the slots are taken for it.
    Queued(WaitKey, oneshot::Receiver<()>),
    Refused(Refusal),
}

/// How a waiter left the queue when it looked.
#[derive(Debug, PartialEq, Eq)]
enum Left {
    /// It was still waiting and is now removed: it holds nothing.
    Queued,
    /// The scan had already granted it: its slots are taken and are its own.
    Granted,
}

/// One tenant's part of the pool: present while it holds or awaits a slot.
#[derive(Debug, Default)]
struct TenantSlots {
    /// Pool slots its calls hold now (at most `tenant_slots`).
    running: usize,
    /// Its own queue, in strategy order.
    waiters: BTreeMap<WaitKey, Waiter>,
}

impl TenantSlots {
    fn is_idle(&self) -> bool {
        self.running == 0 && self.waiters.is_empty()
    }
}

/// Slots, queues and counters; every decision, no IO.
#[derive(Debug)]
struct State {
    strategy: Strategy,
    max_concurrent: usize,
    queue_size: usize,
    /// Slots one tenant may hold, and callers of one tenant that may wait.
    tenant_slots: usize,
    tenant_queue: usize,
    current: usize,
    buckets: BTreeMap<String, Bucket>,
    /// Tenants holding or awaiting slots; an idle tenant is dropped, so the
    /// map is bounded by the slots and the queue, not by every tenant ever.
    tenants: BTreeMap<String, TenantSlots>,
    /// Tenants with waiters, in turn order: the front is served first, and
    /// a tenant served goes to the back.
    turns: VecDeque<String>,
    /// Waiters of all tenants.
    queued: usize,
    next_seq: u64,
    total_acquired: u64,
    total_rejected: u64,
    total_timeout: u64,
    total_bypassed: u64,
    /// Counted permits dropped so far, and how long they were held in all.
    released: u64,
    held: Duration,
}

impl State {
    fn new(config: &ConcurrencyConfig) -> Self {
        State {
            strategy: config.strategy,
            max_concurrent: config.max_concurrent,
            queue_size: config.queue_size,
            tenant_slots: config.tenant_slots(),
            tenant_queue: config.tenant_queue(),
            current: 0,
            buckets: config
                .bucket_limits
                .iter()
                .map(|(name, &limit)| (name.clone(), Bucket { limit, current: 0 }))
                .collect(),
            tenants: BTreeMap::new(),
            turns: VecDeque::new(),
            queued: 0,
            next_seq: 0,
            total_acquired: 0,
            total_rejected: 0,
            total_timeout: 0,
            total_bypassed: 0,
            released: 0,
            held: Duration::ZERO,
        }
    }

    fn bucket_has_room(&self, category: &str) -> bool {
        self.buckets
            .get(category)
            .is_none_or(|bucket| bucket.current < bucket.limit)
    }

    fn running(&self, tenant: &str) -> usize {
        self.tenants.get(tenant).map_or(0, |t| t.running)
    }

    fn fits(&self, tenant: &str, category: &str) -> bool {
        self.current < self.max_concurrent
            && self.running(tenant) < self.tenant_slots
            && self.bucket_has_room(category)
    }

    fn take(&mut self, tenant: &str, category: &str) {
        self.current += 1;
        self.tenants.entry(tenant.to_owned()).or_default().running += 1;
        if let Some(bucket) = self.buckets.get_mut(category) {
            bucket.current += 1;
        }
    }

    /// A counted call asks to run: slots now, a place in its tenant's
    /// queue, or a refusal. A newcomer that fits overtakes nobody: by the
    /// invariant, no queued waiter could run now.
    fn admit(&mut self, tenant: &str, category: &str, priority: i32) -> Admit {
        if self.fits(tenant, category) {
            self.take(tenant, category);
            self.total_acquired += 1;
            return Admit::Now;
        }
        let waiting = self.tenants.get(tenant).map_or(0, |t| t.waiters.len());
        let refusal = match self.strategy {
            Strategy::Reject => Some(Refusal::QueueFull { queue_size: 0 }),
            Strategy::Fifo | Strategy::Priority if self.queued >= self.queue_size => {
                Some(Refusal::QueueFull {
                    queue_size: self.queue_size,
                })
            }
            Strategy::Fifo | Strategy::Priority if waiting >= self.tenant_queue => {
                Some(Refusal::TenantQueueFull {
                    places: self.tenant_queue,
                })
            }
            Strategy::Fifo | Strategy::Priority => None,
        };
        if let Some(refusal) = refusal {
            self.total_rejected += 1;
            return Admit::Refused(refusal);
        }
        let rank = match self.strategy {
            Strategy::Priority => Reverse(priority),
            Strategy::Fifo | Strategy::Reject => Reverse(0),
        };
        let key = WaitKey {
            rank,
            seq: self.next_seq,
        };
        self.next_seq += 1;
        let (granted, receiver) = oneshot::channel();
        let slots = self.tenants.entry(tenant.to_owned()).or_default();
        slots.waiters.insert(
            key,
            Waiter {
                category: category.to_owned(),
                granted,
            },
        );
        if slots.waiters.len() == 1 {
            self.turns.push_back(tenant.to_owned());
        }
        self.queued += 1;
        Admit::Queued(key, receiver)
    }

    /// A counted permit gives its slots back (`held` is `None` when the
    /// permit never reached its caller); frees slots for the queues.
    fn release(&mut self, tenant: &str, category: &str, held: Option<Duration>) {
        debug_assert!(self.current > 0, "released a pool slot nobody held");
        self.current = self.current.saturating_sub(1);
        if let Some(slots) = self.tenants.get_mut(tenant) {
            debug_assert!(slots.running > 0, "released a slot {tenant} did not hold");
            slots.running = slots.running.saturating_sub(1);
            if slots.is_idle() {
                self.tenants.remove(tenant);
            }
        }
        if let Some(bucket) = self.buckets.get_mut(category) {
            debug_assert!(bucket.current > 0, "released a {category} slot nobody held");
            bucket.current = bucket.current.saturating_sub(1);
        }
        if let Some(held) = held {
            self.released += 1;
            self.held = self.held.saturating_add(held);
        }
        self.grant_waiters();
    }

    /// The first waiter of `tenant`, in strategy order, that could run now.
    fn runnable(&self, tenant: &str) -> Option<WaitKey> {
        let slots = self.tenants.get(tenant)?;
        if slots.running >= self.tenant_slots {
            return None;
        }
        slots
            .waiters
            .iter()
            .find(|(_, waiter)| self.bucket_has_room(&waiter.category))
            .map(|(key, _)| *key)
    }

    /// Admits waiters that fit, one per tenant in turn order, round after
    /// round until the pool is full or nobody left could run; skips
    /// waiters whose bucket is full or whose tenant is at its cap. Restores
    /// "no queued waiter could run now".
    fn grant_waiters(&mut self) {
        let mut granted = Vec::new();
        while self.current < self.max_concurrent {
            let next = (0..self.turns.len())
                .find_map(|turn| self.runnable(&self.turns[turn]).map(|key| (turn, key)));
            let Some((turn, key)) = next else {
                break;
            };
            let Some(tenant) = self.turns.remove(turn) else {
                break;
            };
            let Some(slots) = self.tenants.get_mut(&tenant) else {
                break;
            };
            let Some(waiter) = slots.waiters.remove(&key) else {
                break;
            };
            slots.running += 1;
            if !slots.waiters.is_empty() {
                self.turns.push_back(tenant);
            }
            self.current += 1;
            self.queued -= 1;
            if let Some(bucket) = self.buckets.get_mut(&waiter.category) {
                bucket.current += 1;
            }
            granted.push(waiter);
        }
        for waiter in granted {
            // A send fails only if the waiting future is being dropped;
            // its guard then finds itself granted and returns the slots.
            let _ = waiter.granted.send(());
        }
    }

    /// The waiter `key` of `tenant` stops waiting (woken, past its deadline
    /// or cancelled) and learns whether it still held only a place in the
    /// queue or had been granted its slots.
    fn leave(&mut self, tenant: &str, key: &WaitKey) -> Left {
        let Some(slots) = self.tenants.get_mut(tenant) else {
            return Left::Granted;
        };
        if slots.waiters.remove(key).is_none() {
            return Left::Granted;
        }
        self.queued -= 1;
        if slots.waiters.is_empty() {
            self.turns.retain(|t| t != tenant);
        }
        if slots.is_idle() {
            self.tenants.remove(tenant);
        }
        Left::Queued
    }

    fn metrics(&self) -> ConcurrencyMetrics {
        let mut buckets: BTreeMap<String, BucketMetrics> = self
            .buckets
            .iter()
            .map(|(name, bucket)| {
                let metrics = BucketMetrics {
                    current: bucket.current,
                    limit: bucket.limit,
                    queue: 0,
                };
                (name.clone(), metrics)
            })
            .collect();
        for waiter in self.tenants.values().flat_map(|t| t.waiters.values()) {
            if let Some(bucket) = buckets.get_mut(&waiter.category) {
                bucket.queue += 1;
            }
        }
        let avg_execution_time_ms = if self.released == 0 {
            0.0
        } else {
            self.held.as_secs_f64() * 1000.0 / self.released as f64
        };
        ConcurrencyMetrics {
            current_concurrent: self.current,
            queue_length: self.queued,
            total_acquired: self.total_acquired,
            total_rejected: self.total_rejected,
            total_timeout: self.total_timeout,
            total_bypassed: self.total_bypassed,
            avg_execution_time_ms,
            buckets,
            max_per_tenant: self.tenant_slots,
            max_queued_per_tenant: self.tenant_queue,
            tenants_running: self.tenants.values().filter(|t| t.running > 0).count(),
            tenants_waiting: self.turns.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use futures::FutureExt;
    use serde_json::json;
    use tokio::sync::mpsc;
    use tokio::task::JoinHandle;

    type Admitted = mpsc::UnboundedSender<(&'static str, Permit)>;

    fn controller(config: ConcurrencyConfig) -> ConcurrencyController {
        config.validate().expect("test config is valid");
        ConcurrencyController::new(config)
    }

    fn one_slot() -> ConcurrencyConfig {
        ConcurrencyConfig {
            max_concurrent: 1,
            ..ConcurrencyConfig::default()
        }
    }

    /// The tenant of calls that name none.
    const T: &str = DEFAULT_TENANT;

    /// `config` with the tenant cap off: one tenant may use the whole pool.
    fn whole_pool(config: ConcurrencyConfig) -> ConcurrencyConfig {
        ConcurrencyConfig {
            max_per_tenant: Some(config.max_concurrent),
            ..config
        }
    }

    fn buckets(limits: &[(&str, usize)]) -> BTreeMap<String, usize> {
        limits.iter().map(|&(k, v)| (k.to_owned(), v)).collect()
    }

    fn req(category: &str) -> AdmissionRequest {
        AdmissionRequest::new(category)
    }

    /// A caller that waits for its permit and hands it, with its name, to
    /// the test, which decides when to drop it.
    fn spawn_caller(
        controller: &ConcurrencyController,
        name: &'static str,
        req: AdmissionRequest,
        admitted: &Admitted,
    ) -> JoinHandle<()> {
        let controller = controller.clone();
        let admitted = admitted.clone();
        tokio::spawn(async move {
            let permit = controller.acquire(req).await.expect("admitted");
            let _ = admitted.send((name, permit));
        })
    }

    /// Lets spawned callers run until `check` holds on the metrics.
    async fn until(
        controller: &ConcurrencyController,
        check: impl Fn(&ConcurrencyMetrics) -> bool,
    ) {
        for _ in 0..100 {
            if check(&controller.metrics()) {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("never reached; metrics: {:?}", controller.metrics());
    }

    async fn queued(controller: &ConcurrencyController, n: usize) {
        until(controller, |m| m.queue_length == n).await;
    }

    /// The next caller to get in; fails instead of hanging if none does.
    async fn next_in(
        rx: &mut mpsc::UnboundedReceiver<(&'static str, Permit)>,
    ) -> (&'static str, Permit) {
        let next = tokio::time::timeout(Duration::from_secs(10), rx.recv());
        next.await
            .expect("a caller got in within 10 s")
            .expect("callers still running")
    }

    /// Receives the callers one by one, dropping each permit before the
    /// next, and returns the order in which they got in.
    async fn admission_order(
        rx: &mut mpsc::UnboundedReceiver<(&'static str, Permit)>,
        n: usize,
    ) -> Vec<&'static str> {
        let mut order = Vec::new();
        for _ in 0..n {
            let (name, permit) = next_in(rx).await;
            order.push(name);
            drop(permit);
        }
        order
    }

    fn assert_all_free(controller: &ConcurrencyController) {
        let m = controller.metrics();
        assert_eq!(m.current_concurrent, 0, "{m:?}");
        assert_eq!(m.queue_length, 0, "{m:?}");
        assert_eq!((m.tenants_running, m.tenants_waiting), (0, 0), "{m:?}");
        for (name, bucket) in &m.buckets {
            assert_eq!(
                (bucket.current, bucket.queue),
                (0, 0),
                "bucket {name}: {m:?}"
            );
        }
    }

    #[test]
    fn defaults_are_those_of_the_architecture() {
        let config = ConcurrencyConfig::default();
        assert_eq!(config.max_concurrent, 10);
        assert_eq!(config.queue_size, 100);
        assert_eq!(config.default_timeout(), Duration::from_secs(30));
        assert_eq!(config.strategy, Strategy::Fifo);
        assert!(config.bucket_limits.is_empty());
        assert_eq!(config.validate(), Ok(()));
    }

    #[test]
    fn config_parses_with_defaults_and_refuses_unknown_keys() {
        let config: ConcurrencyConfig = toml::from_str(
            "max_concurrent = 4\nstrategy = \"priority\"\ndefault_timeout_s = 5\n\
             [bucket_limits]\nhttp = 2\nai = 1\n",
        )
        .unwrap();
        assert_eq!(config.max_concurrent, 4);
        assert_eq!(config.queue_size, 100);
        assert_eq!(config.strategy, Strategy::Priority);
        assert_eq!(config.default_timeout(), Duration::from_secs(5));
        assert_eq!(config.bucket_limits, buckets(&[("ai", 1), ("http", 2)]));

        assert!(toml::from_str::<ConcurrencyConfig>("max_concurent = 4").is_err());
        assert!(toml::from_str::<ConcurrencyConfig>("strategy = \"lifo\"").is_err());
        assert!(toml::from_str::<ConcurrencyConfig>("strategy = \"FIFO\"").is_err());
        let reject: ConcurrencyConfig = toml::from_str("strategy = \"reject\"").unwrap();
        assert_eq!(reject.strategy, Strategy::Reject);
    }

    #[test]
    fn validate_names_the_bad_key() {
        let zero_pool = ConcurrencyConfig {
            max_concurrent: 0,
            ..ConcurrencyConfig::default()
        };
        let err = zero_pool.validate().unwrap_err();
        assert_eq!(err.key(), "max_concurrent");
        assert!(err.to_string().contains("max_concurrent"));

        let zero_bucket = ConcurrencyConfig {
            bucket_limits: buckets(&[("ai", 2), ("http", 0)]),
            ..ConcurrencyConfig::default()
        };
        let err = zero_bucket.validate().unwrap_err();
        assert_eq!(err.key(), "bucket_limits.http");
        assert!(err.to_string().contains("bucket_limits.http"));

        for value in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let bad_timeout = ConcurrencyConfig {
                default_timeout_s: value,
                ..ConcurrencyConfig::default()
            };
            let err = bad_timeout.validate().unwrap_err();
            assert_eq!(err.key(), "default_timeout_s", "{value}");
            assert!(err.to_string().contains("default_timeout_s"));
        }
    }

    #[test]
    fn a_tenant_share_defaults_to_half_the_pool_and_the_same_share_of_the_queue() {
        let share = |max_concurrent, queue_size, max_per_tenant| {
            let config = ConcurrencyConfig {
                max_concurrent,
                queue_size,
                max_per_tenant,
                ..ConcurrencyConfig::default()
            };
            (config.tenant_slots(), config.tenant_queue())
        };
        assert_eq!(share(10, 100, None), (5, 50));
        assert_eq!(share(1, 100, None), (1, 100), "at least one slot");
        assert_eq!(share(3, 10, None), (1, 3));
        assert_eq!(share(4, 1, None), (2, 1), "at least one place");
        assert_eq!(share(4, 0, None), (2, 0), "no queue stays no queue");
        assert_eq!(share(10, 100, Some(10)), (10, 100), "the cap off");
        assert_eq!(share(10, 100, Some(2)), (2, 20));

        let config: ConcurrencyConfig = toml::from_str("max_per_tenant = 3").unwrap();
        assert_eq!(config.max_per_tenant, Some(3));
        for bad in [0, 11] {
            let config = ConcurrencyConfig {
                max_per_tenant: Some(bad),
                ..ConcurrencyConfig::default()
            };
            let err = config.validate().unwrap_err();
            assert_eq!(err.key(), "max_per_tenant", "{bad}");
            assert!(err.to_string().contains("max_per_tenant"), "{err}");
        }
    }

    #[tokio::test]
    async fn a_tenant_holds_at_most_its_share_while_the_others_run() {
        let c = controller(ConcurrencyConfig {
            max_concurrent: 4,
            ..ConcurrencyConfig::default()
        });
        let b1 = c.acquire(req("x").with_tenant("b")).await.unwrap();
        let b2 = c.acquire(req("x").with_tenant("b")).await.unwrap();
        // Two slots are free, but not for b.
        let mut b3 = Box::pin(c.acquire(req("x").with_tenant("b")));
        assert!((&mut b3).now_or_never().is_none(), "b is at its share");
        let m = c.metrics();
        assert_eq!((m.current_concurrent, m.queue_length), (2, 1));
        assert_eq!((m.tenants_running, m.tenants_waiting), (1, 1));

        let a1 = c.acquire(req("x").with_tenant("a")).now_or_never();
        let a2 = c.acquire(req("x").with_tenant("a")).now_or_never();
        assert!(matches!(a1, Some(Ok(_))) && matches!(a2, Some(Ok(_))));
        assert_eq!(c.metrics().current_concurrent, 4);

        // b's own release lets its waiter in; a's would not.
        drop(a1);
        assert!((&mut b3).now_or_never().is_none(), "a's slot is not b's");
        drop(b1);
        let b3 = b3.await.expect("b's turn");
        drop((a2, b2, b3));
        assert_all_free(&c);
    }

    #[tokio::test]
    async fn past_its_share_of_the_queue_a_tenant_is_refused_and_the_others_still_wait() {
        let c = controller(ConcurrencyConfig {
            max_concurrent: 2,
            queue_size: 4,
            ..ConcurrencyConfig::default()
        });
        let (tx, mut rx) = mpsc::unbounded_channel();
        let b = c.acquire(req("x").with_tenant("b")).await.unwrap();
        spawn_caller(&c, "b1", req("x").with_tenant("b"), &tx);
        spawn_caller(&c, "b2", req("x").with_tenant("b"), &tx);
        queued(&c, 2).await;

        let refused = c.acquire(req("x").with_tenant("b")).now_or_never();
        let refusal = refused.expect("no waiting").unwrap_err();
        assert_eq!(refusal, Refusal::TenantQueueFull { places: 2 });
        assert_eq!(refusal.error_type(), ErrorType::QueueFull);
        assert!(refusal.to_string().contains("share of the wait queue"));

        // a holds the other slot and queues its own share.
        let a = c.acquire(req("x").with_tenant("a")).await.unwrap();
        spawn_caller(&c, "a1", req("x").with_tenant("a"), &tx);
        spawn_caller(&c, "a2", req("x").with_tenant("a"), &tx);
        queued(&c, 4).await;
        // The whole queue is full now: a third tenant finds no place.
        let full = c.acquire(req("x").with_tenant("c")).now_or_never();
        let full = full.expect("no waiting").unwrap_err();
        assert_eq!(full, Refusal::QueueFull { queue_size: 4 });
        assert_eq!(c.metrics().total_rejected, 2);

        drop((a, b));
        let mut names = admission_order(&mut rx, 4).await;
        names.sort_unstable();
        assert_eq!(names, ["a1", "a2", "b1", "b2"]);
        assert_all_free(&c);
    }

    #[tokio::test]
    async fn freed_slots_go_round_robin_between_tenants_with_waiters() {
        let c = controller(whole_pool(one_slot()));
        let holder = c.acquire(req("x").with_tenant("h")).await.unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let callers = [
            ("b1", "b"),
            ("b2", "b"),
            ("b3", "b"),
            ("a1", "a"),
            ("a2", "a"),
            ("c1", "c"),
        ];
        for (n, (name, tenant)) in callers.into_iter().enumerate() {
            spawn_caller(&c, name, req("x").with_tenant(tenant), &tx);
            queued(&c, n + 1).await;
        }
        drop(holder);
        assert_eq!(
            admission_order(&mut rx, 6).await,
            ["b1", "a1", "c1", "b2", "a2", "b3"]
        );
        assert_all_free(&c);
    }

    #[tokio::test]
    async fn priority_orders_a_tenant_own_queue_and_never_jumps_another_tenant_turn() {
        let c = controller(whole_pool(ConcurrencyConfig {
            strategy: Strategy::Priority,
            ..one_slot()
        }));
        let holder = c.acquire(req("x").with_tenant("h")).await.unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let callers = [
            ("b-low", "b", 1),
            ("a", "a", 0),
            ("b-high", "b", 9),
            ("b-mid", "b", 5),
        ];
        for (n, (name, tenant, priority)) in callers.into_iter().enumerate() {
            let request = req("x").with_tenant(tenant).with_priority(priority);
            spawn_caller(&c, name, request, &tx);
            queued(&c, n + 1).await;
        }
        drop(holder);
        assert_eq!(
            admission_order(&mut rx, 4).await,
            ["b-high", "a", "b-mid", "b-low"]
        );
        assert_all_free(&c);
    }

    #[tokio::test]
    async fn a_tenant_whose_waiters_cannot_run_keeps_its_turn() {
        let c = controller(whole_pool(ConcurrencyConfig {
            max_concurrent: 2,
            bucket_limits: buckets(&[("http", 1)]),
            ..ConcurrencyConfig::default()
        }));
        let http = c.acquire(req("http").with_tenant("h")).await.unwrap();
        let other = c.acquire(req("x").with_tenant("h")).await.unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        spawn_caller(&c, "b-http", req("http").with_tenant("b"), &tx);
        queued(&c, 1).await;
        spawn_caller(&c, "a-1", req("x").with_tenant("a"), &tx);
        queued(&c, 2).await;
        spawn_caller(&c, "a-2", req("x").with_tenant("a"), &tx);
        queued(&c, 3).await;

        // A pool slot frees while http is full: b is skipped, a runs.
        drop(other);
        let (name, a1) = next_in(&mut rx).await;
        assert_eq!(name, "a-1");
        // http frees: b, skipped last time, comes before a's second call.
        drop(http);
        let (name, b) = next_in(&mut rx).await;
        assert_eq!(name, "b-http");
        drop(a1);
        let (name, a2) = next_in(&mut rx).await;
        assert_eq!(name, "a-2");
        drop((b, a2));
        assert_all_free(&c);
    }

    #[tokio::test]
    async fn fifo_admits_waiters_in_arrival_order_whatever_their_priority() {
        let c = controller(one_slot());
        let holder = c.acquire(req("x")).await.unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        for (n, (name, priority)) in [("a", 1), ("b", 9), ("c", 5)].into_iter().enumerate() {
            spawn_caller(&c, name, req("x").with_priority(priority), &tx);
            queued(&c, n + 1).await;
        }
        drop(holder);
        assert_eq!(admission_order(&mut rx, 3).await, ["a", "b", "c"]);
        assert_all_free(&c);
    }

    #[tokio::test]
    async fn priority_admits_higher_first_and_arrival_order_among_equals() {
        let c = controller(ConcurrencyConfig {
            strategy: Strategy::Priority,
            ..one_slot()
        });
        let holder = c.acquire(req("x")).await.unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let callers = [
            ("low", 1),
            ("high-1", 5),
            ("high-2", 5),
            ("mid", 3),
            ("high-3", 5),
        ];
        for (n, (name, priority)) in callers.into_iter().enumerate() {
            spawn_caller(&c, name, req("x").with_priority(priority), &tx);
            queued(&c, n + 1).await;
        }
        drop(holder);
        assert_eq!(
            admission_order(&mut rx, 5).await,
            ["high-1", "high-2", "high-3", "mid", "low"]
        );
        assert_all_free(&c);
    }

    #[tokio::test]
    async fn reject_strategy_refuses_at_once_when_no_slot_is_free() {
        let c = controller(ConcurrencyConfig {
            strategy: Strategy::Reject,
            ..one_slot()
        });
        let holder = c.acquire(req("x")).await.unwrap();
        let refused = c.acquire(req("x")).now_or_never().expect("no waiting");
        assert_eq!(refused.unwrap_err(), Refusal::QueueFull { queue_size: 0 });
        let m = c.metrics();
        assert_eq!(
            (m.total_rejected, m.queue_length, m.total_acquired),
            (1, 0, 1)
        );

        drop(holder);
        let again = c.acquire(req("x")).now_or_never().expect("slot is free");
        assert!(again.is_ok());
    }

    #[tokio::test]
    async fn full_queue_refuses_with_queue_full() {
        let c = controller(ConcurrencyConfig {
            queue_size: 2,
            ..one_slot()
        });
        let holder = c.acquire(req("x")).await.unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        spawn_caller(&c, "a", req("x"), &tx);
        spawn_caller(&c, "b", req("x"), &tx);
        queued(&c, 2).await;

        let refused = c.acquire(req("x")).now_or_never().expect("no waiting");
        let refusal = refused.unwrap_err();
        assert_eq!(refusal, Refusal::QueueFull { queue_size: 2 });
        assert_eq!(refusal.error_type(), ErrorType::QueueFull);
        assert!(refusal.to_string().contains("queue is full (2 places)"));
        let m = c.metrics();
        assert_eq!((m.total_rejected, m.queue_length), (1, 2));

        drop(holder);
        assert_eq!(admission_order(&mut rx, 2).await, ["a", "b"]);
        assert_all_free(&c);
    }

    // Real time, but only the few milliseconds of the timeouts under test:
    // the crate's tokio has no `test-util`, so the clock cannot be paused.
    #[tokio::test]
    async fn waiter_past_its_timeout_leaves_the_queue_with_timeout() {
        let c = controller(ConcurrencyConfig {
            default_timeout_s: 0.02,
            ..one_slot()
        });
        let holder = c.acquire(req("x")).await.unwrap();

        let own = c
            .acquire(req("x").with_timeout(Duration::from_millis(5)))
            .await;
        let Err(Refusal::Timeout { waited }) = own else {
            panic!("expected a timeout, got {own:?}");
        };
        assert!(waited >= Duration::from_millis(5), "{waited:?}");

        let default = c.acquire(req("x")).await;
        let Err(refusal @ Refusal::Timeout { waited }) = default else {
            panic!("expected a timeout, got {default:?}");
        };
        assert!(waited >= Duration::from_millis(20), "{waited:?}");
        assert_eq!(refusal.error_type(), ErrorType::Timeout);

        let m = c.metrics();
        assert_eq!(
            (m.total_timeout, m.queue_length, m.current_concurrent),
            (2, 0, 1)
        );
        drop(holder);
        assert_all_free(&c);
    }

    #[tokio::test]
    async fn full_bucket_does_not_block_other_categories() {
        let c = controller(whole_pool(ConcurrencyConfig {
            max_concurrent: 3,
            bucket_limits: buckets(&[("http", 1)]),
            ..ConcurrencyConfig::default()
        }));
        let http = c.acquire(req("http")).await.unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        spawn_caller(&c, "http-waiter", req("http"), &tx);
        queued(&c, 1).await;

        let market = c.acquire(req("market")).now_or_never().expect("not queued");
        let market = market.unwrap();
        let m = c.metrics();
        assert_eq!(m.current_concurrent, 2);
        let http_bucket = BucketMetrics {
            current: 1,
            limit: 1,
            queue: 1,
        };
        assert_eq!(m.buckets["http"], http_bucket);

        drop(http);
        assert_eq!(admission_order(&mut rx, 1).await, ["http-waiter"]);
        drop(market);
        assert_all_free(&c);
    }

    #[tokio::test]
    async fn freed_slot_skips_a_waiter_whose_bucket_is_full() {
        let c = controller(whole_pool(ConcurrencyConfig {
            max_concurrent: 2,
            bucket_limits: buckets(&[("http", 1)]),
            ..ConcurrencyConfig::default()
        }));
        let http = c.acquire(req("http")).await.unwrap();
        let market = c.acquire(req("market")).await.unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        spawn_caller(&c, "http-waiter", req("http"), &tx);
        queued(&c, 1).await;
        spawn_caller(&c, "market-waiter", req("market"), &tx);
        queued(&c, 2).await;

        // A pool slot frees; the first waiter's bucket is still full.
        drop(market);
        let (name, market_permit) = next_in(&mut rx).await;
        assert_eq!(name, "market-waiter");
        assert_eq!(c.metrics().queue_length, 1);

        drop(http);
        let (name, http_permit) = next_in(&mut rx).await;
        assert_eq!(name, "http-waiter");
        drop((market_permit, http_permit));
        assert_all_free(&c);
    }

    #[tokio::test]
    async fn workflow_node_bypasses_a_full_pool_and_is_not_counted() {
        let c = controller(ConcurrencyConfig {
            bucket_limits: buckets(&[("http", 1)]),
            ..one_slot()
        });
        let holder = c.acquire(req("http")).await.unwrap();

        let node = AdmissionRequest::for_caller("http", CallerType::WorkflowNode);
        assert!(node.bypass);
        let bypass = c.acquire(node).now_or_never().expect("never waits");
        let bypass = bypass.unwrap();
        assert!(bypass.is_bypass());
        assert!(!holder.is_bypass());
        let m = c.metrics();
        assert_eq!(m.current_concurrent, 1);
        assert_eq!(m.buckets["http"].current, 1);
        assert_eq!(
            (m.total_acquired, m.total_bypassed, m.queue_length),
            (1, 1, 0)
        );

        drop(bypass);
        let m = c.metrics();
        assert_eq!(m.current_concurrent, 1);
        assert_eq!(
            m.avg_execution_time_ms, 0.0,
            "bypass hold times are not averaged"
        );

        for caller in [CallerType::ConversationAgent, CallerType::Direct] {
            assert!(!AdmissionRequest::for_caller("http", caller).bypass);
        }
        drop(holder);
        assert_all_free(&c);
    }

    #[tokio::test]
    async fn cancelled_acquire_frees_its_queue_place() {
        let c = controller(ConcurrencyConfig {
            queue_size: 1,
            ..one_slot()
        });
        let holder = c.acquire(req("x")).await.unwrap();
        let mut waiting = Box::pin(c.acquire(req("x")));
        assert!((&mut waiting).now_or_never().is_none());
        assert_eq!(c.metrics().queue_length, 1);
        let full = c.acquire(req("x")).now_or_never().expect("no waiting");
        assert_eq!(full.unwrap_err(), Refusal::QueueFull { queue_size: 1 });

        drop(waiting);
        assert_eq!(c.metrics().queue_length, 0);

        // The place is free again, and the next slot goes to a live caller.
        let (tx, mut rx) = mpsc::unbounded_channel();
        spawn_caller(&c, "next", req("x"), &tx);
        queued(&c, 1).await;
        drop(holder);
        assert_eq!(admission_order(&mut rx, 1).await, ["next"]);
        assert_all_free(&c);
        assert_eq!(c.metrics().total_timeout, 0);
    }

    #[tokio::test]
    async fn acquire_cancelled_after_its_grant_passes_the_slot_on() {
        let c = controller(one_slot());
        let holder = c.acquire(req("x")).await.unwrap();
        let mut granted_then_dropped = Box::pin(c.acquire(req("x")));
        assert!((&mut granted_then_dropped).now_or_never().is_none());
        let (tx, mut rx) = mpsc::unbounded_channel();
        spawn_caller(&c, "behind", req("x"), &tx);
        queued(&c, 2).await;

        // The slot goes to the first waiter, which is dropped unpolled.
        drop(holder);
        let m = c.metrics();
        assert_eq!((m.current_concurrent, m.queue_length), (1, 1));
        drop(granted_then_dropped);

        assert_eq!(admission_order(&mut rx, 1).await, ["behind"]);
        assert_all_free(&c);
        let m = c.metrics();
        assert_eq!(m.total_acquired, 2, "the dropped waiter never got a permit");
    }

    #[test]
    fn a_grant_that_lands_as_the_deadline_fires_is_kept_not_leaked() {
        let mut state = State::new(&one_slot());
        assert!(matches!(state.admit(T, "x", 0), Admit::Now));
        let Admit::Queued(key, mut granted) = state.admit(T, "x", 0) else {
            panic!("expected to wait");
        };
        // The holder leaves: the scan takes the slot for the waiter...
        state.release(T, "x", Some(Duration::from_millis(1)));
        assert!(granted.try_recv().is_ok());
        assert_eq!(state.current, 1);
        // ...which, woken by its deadline instead, finds the slot is its own.
        assert_eq!(state.leave(T, &key), Left::Granted);
        assert_eq!(state.current, 1);

        // A waiter that leaves before any grant holds nothing.
        let Admit::Queued(late, _granted) = state.admit(T, "x", 0) else {
            panic!("expected to wait");
        };
        assert_eq!(state.leave(T, &late), Left::Queued);
        assert_eq!((state.current, state.queued), (1, 0));
        state.release(T, "x", None);
        assert_eq!(state.current, 0);
    }

    #[test]
    fn average_hold_time_is_over_released_counted_permits() {
        let mut state = State::new(&ConcurrencyConfig::default());
        assert_eq!(state.metrics().avg_execution_time_ms, 0.0);
        assert!(matches!(state.admit(T, "x", 0), Admit::Now));
        assert!(matches!(state.admit(T, "x", 0), Admit::Now));
        assert!(matches!(state.admit(T, "x", 0), Admit::Now));
        state.release(T, "x", Some(Duration::from_millis(100)));
        state.release(T, "x", Some(Duration::from_millis(300)));
        // Returned by a cancelled waiter: never ran, not averaged.
        state.release(T, "x", None);
        assert_eq!(state.metrics().avg_execution_time_ms, 200.0);
    }

    #[tokio::test]
    async fn metrics_report_counts_and_buckets() {
        let c = controller(whole_pool(ConcurrencyConfig {
            max_concurrent: 2,
            queue_size: 10,
            bucket_limits: buckets(&[("ai", 2), ("http", 1)]),
            ..ConcurrencyConfig::default()
        }));
        let http = c.acquire(req("http")).await.unwrap();
        let market = c.acquire(req("market")).await.unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        spawn_caller(&c, "http", req("http"), &tx);
        spawn_caller(&c, "ai", req("ai"), &tx);
        queued(&c, 2).await;
        assert!(
            c.acquire(req("x").with_timeout(Duration::ZERO))
                .await
                .is_err()
        );

        let m = c.metrics();
        let json = serde_json::to_value(&m).unwrap();
        assert_eq!(json["current_concurrent"], 2);
        assert_eq!(json["queue_length"], 2);
        assert_eq!(json["total_acquired"], 2);
        assert_eq!(json["total_rejected"], 0);
        assert_eq!(json["total_timeout"], 1);
        assert_eq!(json["total_bypassed"], 0);
        assert_eq!(json["avg_execution_time_ms"], 0.0);
        assert_eq!(json["max_per_tenant"], 2);
        assert_eq!(json["max_queued_per_tenant"], 10);
        assert_eq!(json["tenants_running"], 1);
        assert_eq!(json["tenants_waiting"], 1);
        assert_eq!(
            json["buckets"],
            json!({
                "ai": {"current": 0, "limit": 2, "queue": 1},
                "http": {"current": 1, "limit": 1, "queue": 1},
            })
        );

        drop(market);
        drop(http);
        let mut admitted = Vec::new();
        for _ in 0..2 {
            admitted.push(next_in(&mut rx).await);
        }
        let mut names: Vec<_> = admitted.iter().map(|(name, _)| *name).collect();
        names.sort_unstable();
        assert_eq!(names, ["ai", "http"]);
        let m = c.metrics();
        assert_eq!((m.total_acquired, m.current_concurrent), (4, 2));
        assert_eq!(m.buckets["http"].current, 1);
        assert_eq!(m.buckets["ai"].current, 1);
        drop(admitted);
        assert_all_free(&c);
        assert!(c.metrics().avg_execution_time_ms >= 0.0);
    }

    /// Property: whatever mix of tenants, grants, timeouts, refusals and
    /// cancellations happens across threads, once everything is dropped no
    /// slot, no waiter and no tenant entry is left behind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn churn_of_grants_timeouts_and_cancels_leaks_no_slot() {
        let c = controller(ConcurrencyConfig {
            max_concurrent: 3,
            queue_size: 32,
            strategy: Strategy::Priority,
            bucket_limits: buckets(&[("ai", 2), ("http", 1)]),
            ..ConcurrencyConfig::default()
        });
        let mut tasks = Vec::new();
        for i in 0..48usize {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                for j in 0..40usize {
                    let category = ["http", "ai", "market"][(i + j) % 3];
                    let tenant = ["acme", "globex", T][(i + 2 * j) % 3];
                    let timeout = Duration::from_micros(((i * 7 + j * 13) % 400) as u64);
                    let request = req(category)
                        .with_tenant(tenant)
                        .with_priority((j % 4) as i32)
                        .with_timeout(timeout);
                    if j % 5 == 0 {
                        // Cancelled at a random point: before or after a grant.
                        tokio::select! {
                            permit = c.acquire(request) => drop(permit),
                            () = tokio::task::yield_now() => {}
                        }
                    } else if let Ok(permit) = c.acquire(request).await {
                        tokio::task::yield_now().await;
                        drop(permit);
                    }
                }
            }));
        }
        // Some callers are aborted mid-flight, permits and waits included.
        for task in tasks.iter().step_by(6) {
            tokio::task::yield_now().await;
            task.abort();
        }
        let all = futures::future::join_all(tasks);
        tokio::time::timeout(Duration::from_secs(30), all)
            .await
            .expect("callers finish");
        assert_all_free(&c);
        assert!(c.metrics().total_acquired > 0);
        let state = lock(&c.state);
        assert!(
            state.tenants.is_empty() && state.turns.is_empty(),
            "{state:?}"
        );
    }
}
