//! Concurrency permits shared by every node: leases in a ZSET per pool.
//!
//! executor::concurrency (local slot granted) ──PermitPool::acquire──▶ [`SharedPool`]
//!        ──[pool, bucket]──▶ acquire.lua ──▶ Redis
//!        ◀── Lease (renewed every lease/3 while held) · Full · Unavailable
//! Lease dropped ──▶ release.lua (spawned)      dead node ──▶ its leases expire
//!
//! Each pool (the global one, each category bucket) is a ZSET: member = a
//! permit id, score = its lease's expiry in Redis' milliseconds. One script
//! drops the expired members of every pool the call needs and adds the
//! permit to all of them only when all have room (`ZCARD < cap`): like the
//! rate limit, a call never holds half its slots.
//!
//! [`SharedPool`] is the concurrency controller's [`PermitPool`] in
//! cluster mode: it names the pools a call's category needs, asks
//! [`Permits`], and applies the `[cluster] redis_failure` policy when Redis
//! cannot be reached (`closed`: an error, refused as `LIMITS_UNAVAILABLE`;
//! `local`: room with nothing held, so the call runs on this node's slot).
//!
//! Decisions:
//! - **Leases, renewed.** A node that dies (kill -9, partition) cannot give
//!   its permits back; its leases run out instead. A held permit is renewed
//!   every `lease / 3` by a task, so a call longer than the lease keeps its
//!   permit, and two renewals can fail before it is lost. The default lease
//!   is 30 s (`[cluster] permit_lease_s`): long enough that a loaded node or
//!   a slow Redis round trip never lets a live call's lease lapse, short
//!   enough that a dead node's slots come back within half a minute.
//! - **Redis' clock** for the scores, so nodes' clocks never matter.
//! - **Bounded memory.** Each ZSET expires two leases after its last
//!   acquire or renewal; members are dropped as they expire.
//! - A renewal that finds its permit gone (expired while Redis was away, or
//!   Redis restarted empty) logs it and stops renewing: the call already
//!   runs and is not cut; the cap may be exceeded by it until it ends.

use std::sync::Arc;
use std::time::Duration;

use redis::Script;
use tokio::task::JoinHandle;

use super::{ClusterError, FailurePolicy, Redis};
use crate::executor::concurrency::{ConcurrencyConfig, PermitPool, PoolLease, Pooled};
use crate::executor::limits::LimitsUnavailable;

/// The default lease of a permit.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

const ACQUIRE: &str = r#"
-- KEYS: the pools; ARGV[1]: permit id, ARGV[2]: lease (ms), ARGV[2+i]: cap of KEYS[i].
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local lease = tonumber(ARGV[2])
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now))
  if redis.call('ZCARD', key) >= tonumber(ARGV[2 + i]) then return i end
end
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, string.format('%.0f', now + lease), ARGV[1])
  redis.call('PEXPIRE', key, 2 * lease)
end
return 0
"#;

const RENEW: &str = r#"
-- KEYS: the pools; ARGV[1]: permit id, ARGV[2]: lease (ms). Returns how many still held it.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local lease = tonumber(ARGV[2])
local held = 0
for _, key in ipairs(KEYS) do
  local score = redis.call('ZSCORE', key, ARGV[1])
  if score and tonumber(score) > now then
    redis.call('ZADD', key, 'XX', string.format('%.0f', now + lease), ARGV[1])
    redis.call('PEXPIRE', key, 2 * lease)
    held = held + 1
  end
end
return held
"#;

/// One pool a call needs a slot of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub key: String,
    pub cap: usize,
}

impl Pool {
    /// The global pool.
    pub fn global(cap: usize) -> Self {
        Pool {
            key: "cadre:permits:pool".into(),
            cap,
        }
    }

    /// A category's bucket.
    pub fn bucket(category: &str, cap: usize) -> Self {
        Pool {
            key: format!("cadre:permits:bucket:{category}"),
            cap,
        }
    }
}

/// What an acquire decided.
#[derive(Debug)]
pub enum Acquired {
    Held(Lease),
    /// `pools[index]` is at its cap; nothing was taken.
    Full {
        index: usize,
    },
}

/// The permits of every node, in Redis. Cheap to clone.
#[derive(Clone)]
pub struct Permits {
    redis: Redis,
    lease: Duration,
    acquire: Arc<Script>,
    renew: Arc<Script>,
}

impl Permits {
    pub fn new(redis: Redis, lease: Duration) -> Self {
        Permits {
            redis,
            lease: lease.max(Duration::from_millis(30)),
            acquire: Arc::new(Script::new(ACQUIRE)),
            renew: Arc::new(Script::new(RENEW)),
        }
    }

    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// A slot of every pool, or none when one is full.
    pub async fn acquire(&self, pools: &[Pool]) -> Result<Acquired, ClusterError> {
        let id = uuid::Uuid::now_v7().to_string();
        let mut invocation = self.acquire.prepare_invoke();
        for pool in pools {
            invocation.key(&pool.key);
        }
        invocation.arg(&id).arg(self.lease_ms());
        for pool in pools {
            invocation.arg(pool.cap);
        }
        let mut conn = self.redis.conn();
        let full: usize = invocation.invoke_async(&mut conn).await?;
        if full > 0 {
            return Ok(Acquired::Full { index: full - 1 });
        }
        let keys: Arc<[String]> = pools.iter().map(|p| p.key.clone()).collect();
        let renewing = tokio::spawn(renew_while_held(self.clone(), keys.clone(), id.clone()));
        Ok(Acquired::Held(Lease {
            permits: self.clone(),
            keys,
            id,
            renewing,
        }))
    }

    /// Permits held now in `pool` (expired ones not counted).
    pub async fn held(&self, pool: &str) -> Result<usize, ClusterError> {
        let mut conn = self.redis.conn();
        let now: (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await?;
        let now_ms = now.0 * 1000 + now.1 / 1000;
        Ok(redis::cmd("ZCOUNT")
            .arg(pool)
            .arg(format!("({now_ms}"))
            .arg("+inf")
            .query_async(&mut conn)
            .await?)
    }

    fn lease_ms(&self) -> u64 {
        u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX)
    }

    async fn release(&self, keys: &[String], id: &str) -> Result<(), ClusterError> {
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.zrem(key.as_str(), id).ignore();
        }
        let mut conn = self.redis.conn();
        pipe.query_async::<()>(&mut conn).await?;
        Ok(())
    }
}

/// Renews a lease every `lease / 3` until the task is aborted (the lease
/// dropped) or the permit is found gone.
async fn renew_while_held(permits: Permits, keys: Arc<[String]>, id: String) {
    let mut tick = tokio::time::interval(permits.lease / 3);
    tick.tick().await;
    loop {
        tick.tick().await;
        let mut invocation = permits.renew.prepare_invoke();
        for key in keys.iter() {
            invocation.key(key);
        }
        invocation.arg(&id).arg(permits.lease_ms());
        let mut conn = permits.redis.conn();
        match invocation.invoke_async::<usize>(&mut conn).await {
            Ok(held) if held == keys.len() => {}
            Ok(_) => {
                tracing::warn!(permit = %id, "a concurrency permit expired while its call ran");
                return;
            }
            Err(e) => tracing::warn!(error = %e, "cannot renew a concurrency permit; retrying"),
        }
    }
}

/// A held permit. Dropping it stops its renewal and gives it back (in a
/// spawned task; if that fails, the lease runs out).
#[must_use = "dropping a lease gives the permit back"]
pub struct Lease {
    permits: Permits,
    keys: Arc<[String]>,
    id: String,
    renewing: JoinHandle<()>,
}

impl Lease {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Gives the permit back now and waits for Redis to have it.
    pub async fn release(mut self) -> Result<(), ClusterError> {
        self.renewing.abort();
        let id = std::mem::take(&mut self.id);
        self.permits.release(&self.keys, &id).await
    }

    /// Stops renewing and gives nothing back, as a node that died would.
    #[doc(hidden)]
    pub fn abandon(mut self) {
        self.id.clear();
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("id", &self.id)
            .field("pools", &self.keys)
            .finish()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renewing.abort();
        // Empty once given back (or abandoned).
        if self.id.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (permits, keys, id) = (
            self.permits.clone(),
            self.keys.clone(),
            std::mem::take(&mut self.id),
        );
        runtime.spawn(async move {
            if let Err(e) = permits.release(&keys, &id).await {
                tracing::warn!(error = %e, "cannot give a concurrency permit back; its lease will run out");
            }
        });
    }
}

impl PoolLease for Lease {}

/// The global pool and the category buckets of every node, in Redis: the
/// concurrency controller's [`PermitPool`] in cluster mode (module doc).
#[derive(Clone)]
pub struct SharedPool {
    permits: Permits,
    policy: FailurePolicy,
    max_concurrent: usize,
    bucket_limits: std::collections::BTreeMap<String, usize>,
}

impl std::fmt::Debug for SharedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPool")
            .field("redis", &self.permits.redis)
            .field("lease", &self.permits.lease)
            .field("policy", &self.policy)
            .field("max_concurrent", &self.max_concurrent)
            .field("bucket_limits", &self.bucket_limits)
            .finish()
    }
}

impl SharedPool {
    /// The caps of `config`'s pool and buckets, held in `permits`.
    pub fn new(permits: Permits, config: &ConcurrencyConfig, policy: FailurePolicy) -> Self {
        SharedPool {
            permits,
            policy,
            max_concurrent: config.max_concurrent,
            bucket_limits: config.bucket_limits.clone(),
        }
    }

    /// The pools a call of `category` needs a slot of.
    fn pools(&self, category: &str) -> Vec<Pool> {
        let mut pools = vec![Pool::global(self.max_concurrent)];
        if let Some(&cap) = self.bucket_limits.get(category) {
            pools.push(Pool::bucket(category, cap));
        }
        pools
    }
}

#[async_trait::async_trait]
impl PermitPool for SharedPool {
    async fn acquire(&self, category: &str) -> Result<Pooled, LimitsUnavailable> {
        match self.permits.acquire(&self.pools(category)).await {
            Ok(Acquired::Held(lease)) => Ok(Pooled::Room(Some(Box::new(lease)))),
            Ok(Acquired::Full { .. }) => Ok(Pooled::Full),
            Err(_) if self.policy == FailurePolicy::Local => Ok(Pooled::Room(None)),
            Err(e) => Err(LimitsUnavailable {
                reason: e.to_string(),
            }),
        }
    }
}
