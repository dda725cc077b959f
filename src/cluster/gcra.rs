//! Rate-limit windows shared by every node: GCRA in one Lua script.
//!
//! executor ──WindowStore::take / look──▶ [`SharedWindows`] ── windows ──▶ EVALSHA gcra.lua ──▶ Redis
//!          ◀── ok · RateLimited · Unavailable ◀── allowed · (window i, wait) · per-window TATs
//!
//! [`SharedWindows`] is the executor's [`WindowStore`] in cluster mode: it
//! turns a tool's [`RateLimit`] into the call's Redis windows, asks
//! [`Gcra`], and applies the `[cluster] redis_failure` policy when Redis
//! cannot be reached (`closed`: [`LimitRefusal::Unavailable`]; `local`: a
//! [`RateLimiter`] of this node's own).
//!
//! The algorithm is governor's, so a window behaves the same on one node
//! and on N: per key a theoretical arrival time (TAT), one cell back every
//! `t = window / n`, burst `n` (`tau = t × (n - 1)`); a call passes when
//! `now ≥ TAT - tau` and then moves the TAT to `max(TAT, now) + t`.
//!
//! Decisions:
//! - **Redis' clock** (`TIME`), not the nodes': their clocks may disagree,
//!   Redis' is one. Times are whole microseconds (a Lua number holds them
//!   exactly; `t` is rounded down to the microsecond, which no caller sees).
//! - **Look before taking, atomically.** One script reads every window of
//!   the call and writes a cell in all of them only when all have one: a
//!   refused call costs nothing, and two nodes cannot both take the last
//!   cell (a script runs alone). The refusal names the window with the
//!   longest wait, as the in-process limiter does.
//! - **Bounded memory.** Each TAT key expires at its TAT (`SET … PXAT`):
//!   past it the window is full again and the key says nothing a missing
//!   key would not. Keys name the window's `n`, so a changed limit starts a
//!   fresh window (as the in-process limiter rebuilds one).
//! - `EVALSHA` through `redis::Script`, which loads the script again after
//!   a Redis restart (`NOSCRIPT`).
//! - A window of 0 calls is refused by the caller without asking Redis.

use std::time::Duration;

use redis::Script;

use super::{ClusterError, FailurePolicy, Redis};
use crate::executor::limits::{
    self, LimitRefusal, LimitsUnavailable, RateLimited, RateLimiter, WindowQuota, WindowStore,
};
use crate::tools::definition::RateLimit;

const SCRIPT: &str = r#"
-- KEYS[i]: one window's TAT key; ARGV[2i-1]: t (µs), ARGV[2i]: n.
-- ARGV[#ARGV]: "take" or "look".
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local take = ARGV[#ARGV] == 'take'
local tats = {}
local worst, worst_at = 0, 0
for i, key in ipairs(KEYS) do
  local t = tonumber(ARGV[2 * i - 1])
  local n = tonumber(ARGV[2 * i])
  local tat = tonumber(redis.call('GET', key) or now)
  if tat < now then tat = now end
  tats[i] = tat
  local wait = tat - t * (n - 1) - now
  if wait > worst then worst, worst_at = wait, i end
end
if not take then
  local out = {now}
  for i = 1, #KEYS do out[i + 1] = tats[i] end
  return out
end
if worst_at > 0 then return {worst_at, worst} end
for i, key in ipairs(KEYS) do
  local tat = tats[i] + tonumber(ARGV[2 * i - 1])
  redis.call('SET', key, string.format('%.0f', tat), 'PXAT', string.format('%.0f', math.ceil(tat / 1000)))
end
return {0, 0}
"#;

/// One window of a call: its key, its length and its allowance (at least 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub key: String,
    pub length: Duration,
    pub n: u32,
}

impl Window {
    /// One cell back every `t`, in whole microseconds (at least 1).
    fn t_us(&self) -> u64 {
        let us = u64::try_from(self.length.as_micros()).unwrap_or(u64::MAX);
        (us / u64::from(self.n.max(1))).max(1)
    }
}

/// What a take decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// A cell was taken in every window.
    Allowed,
    /// Nothing taken: `windows[index]` has the longest wait.
    Limited { index: usize, wait: Duration },
}

/// What is left of one window now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Left {
    pub remaining: u32,
    /// When all `n` cells are back.
    pub full_in: Duration,
}

/// The windows of every node, in Redis. Cheap to clone.
#[derive(Clone)]
pub struct Gcra {
    redis: Redis,
    script: std::sync::Arc<Script>,
}

impl Gcra {
    pub fn new(redis: Redis) -> Self {
        Gcra {
            redis,
            script: std::sync::Arc::new(Script::new(SCRIPT)),
        }
    }

    /// Takes one cell of each window, or none when any has none left.
    pub async fn take(&self, windows: &[Window]) -> Result<Taken, ClusterError> {
        if windows.is_empty() {
            return Ok(Taken::Allowed);
        }
        let reply: Vec<i64> = self.run(windows, "take").await?;
        match reply.as_slice() {
            [0, _] => Ok(Taken::Allowed),
            [index, wait] => Ok(Taken::Limited {
                index: usize::try_from(*index - 1).unwrap_or(0),
                wait: Duration::from_micros(u64::try_from(*wait).unwrap_or(0)),
            }),
            other => Err(ClusterError::Unavailable {
                reason: format!("the GCRA script answered {other:?}"),
            }),
        }
    }

    /// What is left of each window, in order. Takes nothing.
    pub async fn look(&self, windows: &[Window]) -> Result<Vec<Left>, ClusterError> {
        if windows.is_empty() {
            return Ok(Vec::new());
        }
        let reply: Vec<i64> = self.run(windows, "look").await?;
        let Some((&now, tats)) = reply.split_first() else {
            return Err(ClusterError::Unavailable {
                reason: "the GCRA script answered nothing".into(),
            });
        };
        Ok(windows
            .iter()
            .zip(tats)
            .map(|(window, &tat)| {
                let full_in = u64::try_from(tat - now).unwrap_or(0);
                let missing = full_in.div_ceil(window.t_us());
                Left {
                    remaining: window
                        .n
                        .saturating_sub(u32::try_from(missing).unwrap_or(u32::MAX)),
                    full_in: Duration::from_micros(full_in),
                }
            })
            .collect())
    }

    async fn run(&self, windows: &[Window], mode: &str) -> Result<Vec<i64>, ClusterError> {
        let mut invocation = self.script.prepare_invoke();
        for window in windows {
            invocation
                .key(&window.key)
                .arg(window.t_us())
                .arg(window.n.max(1));
        }
        invocation.arg(mode);
        let mut conn = self.redis.conn();
        Ok(invocation.invoke_async(&mut conn).await?)
    }
}

/// Windows kept in Redis for every node: the executor's [`WindowStore`] in
/// cluster mode (module doc).
pub struct SharedWindows {
    gcra: Gcra,
    /// Tells this store's keys apart from another's (`user`, `tenant`).
    scope: &'static str,
    policy: FailurePolicy,
    /// This node's windows, used under the `local` policy while Redis
    /// cannot be reached.
    local: RateLimiter,
}

impl std::fmt::Debug for SharedWindows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedWindows")
            .field("redis", &self.gcra.redis)
            .field("scope", &self.scope)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl SharedWindows {
    /// `scope` keeps this store's keys apart from another's.
    pub fn new(gcra: Gcra, scope: &'static str, policy: FailurePolicy) -> Self {
        SharedWindows {
            gcra,
            scope,
            policy,
            local: RateLimiter::new(),
        }
    }

    /// The Redis windows `limit` sets (those of at least one call), and
    /// the longest window set to 0 calls, if any: that one refuses at once.
    #[allow(clippy::type_complexity)]
    fn windows(
        &self,
        tool: &str,
        limit: &RateLimit,
        user: &str,
    ) -> (Vec<(limits::Window, Window)>, Option<limits::Window>) {
        let mut windows = Vec::new();
        let mut zero = None;
        for window in limits::Window::ALL {
            match window.limit_in(limit) {
                None => {}
                Some(0) => zero = Some(window),
                Some(n) => windows.push((
                    window,
                    Window {
                        key: format!(
                            "cadre:gcra:{}:{}:{n}:{}:{tool}:{user}",
                            self.scope,
                            window.as_str(),
                            tool.len()
                        ),
                        length: window.length(),
                        n,
                    },
                )),
            }
        }
        (windows, zero)
    }
}

fn unavailable(e: ClusterError) -> LimitsUnavailable {
    LimitsUnavailable {
        reason: e.to_string(),
    }
}

#[async_trait::async_trait]
impl WindowStore for SharedWindows {
    async fn take(&self, tool: &str, limit: &RateLimit, user: &str) -> Result<(), LimitRefusal> {
        if limit.is_unlimited() {
            return Ok(());
        }
        let (windows, zero) = self.windows(tool, limit, user);
        if let Some(window) = zero {
            return Err(RateLimited {
                tool: tool.to_owned(),
                window,
                limit: 0,
                retry_after: window.length(),
            }
            .into());
        }
        let cells: Vec<Window> = windows.iter().map(|(_, w)| w.clone()).collect();
        match self.gcra.take(&cells).await {
            Ok(Taken::Allowed) => Ok(()),
            Ok(Taken::Limited { index, wait }) => {
                let (window, cell) = &windows[index];
                Err(RateLimited {
                    tool: tool.to_owned(),
                    window: *window,
                    limit: cell.n,
                    retry_after: wait,
                }
                .into())
            }
            Err(e) => match self.policy {
                FailurePolicy::Local => Ok(self.local.check(tool, limit, user)?),
                FailurePolicy::Closed => Err(LimitRefusal::Unavailable(unavailable(e))),
            },
        }
    }

    async fn look(
        &self,
        tool: &str,
        limit: &RateLimit,
        user: &str,
    ) -> Result<Vec<WindowQuota>, LimitsUnavailable> {
        if limit.is_unlimited() {
            return Ok(Vec::new());
        }
        let (windows, _) = self.windows(tool, limit, user);
        let cells: Vec<Window> = windows.into_iter().map(|(_, w)| w).collect();
        let left = match (self.gcra.look(&cells).await, self.policy) {
            (Ok(left), _) => left,
            (Err(_), FailurePolicy::Local) => return Ok(self.local.quota(tool, limit, user)),
            (Err(e), FailurePolicy::Closed) => return Err(unavailable(e)),
        };
        let now = jiff::Timestamp::now();
        let mut out = Vec::new();
        let mut left = left.into_iter();
        for window in limits::Window::ALL {
            let Some(n) = window.limit_in(limit) else {
                continue;
            };
            let (remaining, full_in) = if n == 0 {
                (0, window.length())
            } else {
                left.next()
                    .map_or((n, Duration::ZERO), |l| (l.remaining, l.full_in))
            };
            out.push(WindowQuota {
                window,
                limit: n,
                remaining,
                reset_at: now.saturating_add(full_in).unwrap_or(now),
            });
        }
        Ok(out)
    }

    fn retain_recent(&self) {
        self.local.retain_recent();
    }
}
