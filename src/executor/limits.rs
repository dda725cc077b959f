//! Tool rate limits: calls per user and tool in a minute, an hour and a day.
//!
//! ExecuteTool ──▶ lookup · plan ──▶ limits ──▶ validation · cache · handler
//!                                     │ no cell left
//!                                     └──▶ RateLimited (window, retry_after) → `RATE_LIMITED` outcome
//!
//! The limits come from the tool's definition ([`RateLimit`]); a user is
//! whoever the execution context names. GCRA (governor) has one rate and one
//! burst, so each window that is set is its own keyed limiter with `n` cells
//! refilling one every `window / n`, burst `n`: a user may spend a whole
//! window's allowance at once and then gets one call back per `window / n`.
//!
//! Decisions:
//! - **Look before taking.** governor cannot give a cell back, so a call
//!   refused by the day window after taking a minute cell would be charged for
//!   a call that never ran. The limiters here share one user-keyed state store
//!   type (`UserCells`) that can answer "would this pass?" without writing,
//!   so [`RateLimiter::check`] first looks at every window and takes cells only
//!   when all of them have one. A refused call costs nothing, and the refusal
//!   names the window with the longest wait: the call cannot pass before then.
//! - **Shortest window first.** Cells are then taken minute, hour, day. Only a
//!   concurrent `check` for the same user and tool, taking the last cell of a
//!   longer window between the look and the take, can still refuse a call
//!   that spent a cell; that cell is then the one that refills soonest. The
//!   executor takes cells in its reply futures, which run on the actor's one
//!   arbiter thread, and the in-process take has no await inside, so one
//!   call's look and take never interleave with another's: in cadre this
//!   does not happen.
//! - **Lazy limiters, rebuilt on change.** A limiter is made for a (tool,
//!   window) on its first call and rebuilt when the definition's value for that
//!   window changes (hot reload); a rebuilt window starts full for every user.
//! - **A limit of 0 refuses every call** with `retry_after` = the window's
//!   length; loading a definition should reject it before it gets here.
//! - **Bounded state.** Each limiter keeps one entry per user who called it;
//!   [`RateLimiter::retain_recent`] drops the entries of users whose windows
//!   are full again, which loses nothing; the executor is to call it
//!   periodically. A check costs a read lock, up to three atomic updates and
//!   one `String` for the user key; limiters are made only on change.
//! - [`RateLimiter::quota`] only looks, so the API can show what is left
//!   without spending it.
//! - **One seam: [`WindowStore`].** The executor asks a `WindowStore` to
//!   take a call's cells and the API asks it what is left; it does not know
//!   where the windows live. [`RateLimiter`] is the in-process store, the
//!   only one a single node needs; cluster mode gives the executor one that
//!   keeps the windows in Redis for every node (`cluster::gcra`: the
//!   same GCRA, one Lua script that looks at every window and takes a cell
//!   in all only when all have one, atomically, on Redis' clock) and that
//!   applies the `[cluster] redis_failure` policy itself: `closed` refuses
//!   ([`LimitRefusal::Unavailable`]), `local` falls back to a `RateLimiter`
//!   of its own.
//! - **Async at the seam, sync inside.** The trait's `take` and `look` are
//!   async (`async-trait`) because a shared store asks over the network;
//!   the in-process store answers at once from its sync
//!   [`RateLimiter::check`] and [`RateLimiter::quota`], with no await
//!   between its look and its take, so a call's look-then-take stays one
//!   step on the executor's thread. `retain_recent` is sync: it only
//!   trims memory.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::keyed::ShrinkableKeyedStateStore;
use governor::state::{InMemoryState, NotKeyed, StateStore};
use governor::{NotUntil, Quota};
use serde::Serialize;

use crate::tools::definition::RateLimit;

pub use governor::clock::DefaultClock;

/// One of the three windows a [`RateLimit`] can set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Window {
    Minute,
    Hour,
    Day,
}

impl Window {
    /// Shortest first: the order cells are taken in.
    pub const ALL: [Window; 3] = [Window::Minute, Window::Hour, Window::Day];

    pub fn as_str(self) -> &'static str {
        match self {
            Window::Minute => "minute",
            Window::Hour => "hour",
            Window::Day => "day",
        }
    }

    pub fn length(self) -> Duration {
        match self {
            Window::Minute => Duration::from_secs(60),
            Window::Hour => Duration::from_secs(3_600),
            Window::Day => Duration::from_secs(86_400),
        }
    }

    /// The calls `limit` allows in this window; `None` is unlimited.
    pub fn limit_in(self, limit: &RateLimit) -> Option<u32> {
        match self {
            Window::Minute => limit.per_minute,
            Window::Hour => limit.per_hour,
            Window::Day => limit.per_day,
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// `n` cells per window, one back every `window / n`, all `n` at once.
    fn quota(self, n: NonZeroU32) -> Quota {
        Quota::with_period(self.length() / n.get())
            .expect("a window of at least 60 s over a u32 is at least 13 ns")
            .allow_burst(n)
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A call refused because `window` has no cell left for this user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct RateLimited {
    pub tool: String,
    pub window: Window,
    /// The window's allowance, from the definition.
    pub limit: u32,
    /// When the call would pass; every window has a cell by then.
    pub retry_after: Duration,
}

impl RateLimited {
    /// `retry_after` in whole milliseconds, rounded up so that waiting this
    /// long is enough.
    pub fn retry_after_ms(&self) -> u64 {
        u64::try_from(self.retry_after.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
    }
}

impl fmt::Display for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let calls = if self.limit == 1 { "call" } else { "calls" };
        write!(
            f,
            "rate limit of {} {calls} per {} for {} reached; retry in {:.1} s",
            self.limit,
            self.window,
            self.tool,
            self.retry_after.as_secs_f64()
        )
    }
}

/// Why a call may not run now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitRefusal {
    #[error(transparent)]
    Limited(#[from] RateLimited),
    /// The store of shared windows could not be asked and its failure
    /// policy refuses.
    #[error("rate limits cannot be checked now: the cluster's Redis is unreachable; retry shortly")]
    Unavailable(LimitsUnavailable),
}

/// A store of shared limits (windows, permits) could not be asked: the
/// caller refuses the call, retryably (`LIMITS_UNAVAILABLE`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct LimitsUnavailable {
    pub reason: String,
}

/// Where rate-limit windows live; the executor takes a call's cells and
/// the API reads what is left through it (module doc).
#[async_trait::async_trait]
pub trait WindowStore: Send + Sync + fmt::Debug {
    /// Takes one cell of each window `limit` sets for `user` on `tool`, or
    /// none when any window has none left (the refusal names the window
    /// with the longest wait).
    async fn take(&self, tool: &str, limit: &RateLimit, user: &str) -> Result<(), LimitRefusal>;

    /// What is left of each window `limit` sets for `user` on `tool`,
    /// shortest window first. Takes no cell.
    async fn look(
        &self,
        tool: &str,
        limit: &RateLimit,
        user: &str,
    ) -> Result<Vec<WindowQuota>, LimitsUnavailable>;

    /// Forgets state that says nothing any more (users whose windows are
    /// full again). The executor calls it periodically.
    fn retain_recent(&self);
}

/// What is left of one window for one user and tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WindowQuota {
    pub window: Window,
    pub limit: u32,
    /// Calls that would pass now.
    pub remaining: u32,
    /// When all `limit` calls are available again (now if they are).
    pub reset_at: jiff::Timestamp,
}

/// Per-tool, per-user call limits. Cheap to share behind an `Arc`; every
/// method takes `&self`.
pub struct RateLimiter<C: Clock = DefaultClock> {
    clock: C,
    /// Tool name → its window limiters. Read-locked on every check; write-
    /// locked only to create or rebuild a tool's limiters.
    tools: RwLock<HashMap<String, [Option<Gate<C>>; 3]>>,
}

impl RateLimiter<DefaultClock> {
    pub fn new() -> Self {
        Self::with_clock(DefaultClock::default())
    }
}

impl Default for RateLimiter<DefaultClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock + Clone> RateLimiter<C> {
    /// A limiter on `clock`; tests pass governor's `FakeRelativeClock`.
    pub fn with_clock(clock: C) -> Self {
        RateLimiter {
            clock,
            tools: RwLock::new(HashMap::new()),
        }
    }

    /// Takes one cell of each window `limit` sets for `user` on `tool`, or
    /// none if any window has none left.
    pub fn check(&self, tool: &str, limit: &RateLimit, user: &str) -> Result<(), RateLimited> {
        if limit.is_unlimited() {
            return Ok(());
        }
        let gates = self.gates(tool, limit);
        let mut probe = Probe {
            user: user.to_owned(),
            take: false,
        };
        let mut refusal: Option<(&Gate<C>, Duration)> = None;
        for gate in gates.iter().flatten() {
            if let Some(wait) = gate.wait(&probe)
                && refusal.is_none_or(|(_, longest)| wait > longest)
            {
                refusal = Some((gate, wait));
            }
        }
        if let Some((gate, wait)) = refusal {
            return Err(gate.refusal(tool, wait));
        }
        probe.take = true;
        for gate in gates.iter().flatten() {
            if let Some(wait) = gate.wait(&probe) {
                return Err(gate.refusal(tool, wait));
            }
        }
        Ok(())
    }

    /// What is left of each window `limit` sets for `user` on `tool`,
    /// shortest window first. Takes no cell.
    pub fn quota(&self, tool: &str, limit: &RateLimit, user: &str) -> Vec<WindowQuota> {
        if limit.is_unlimited() {
            return Vec::new();
        }
        let now = jiff::Timestamp::now();
        self.gates(tool, limit)
            .iter()
            .flatten()
            .map(|gate| {
                let (remaining, full_in) = gate.remaining(user);
                WindowQuota {
                    window: gate.window,
                    limit: gate.limit,
                    remaining,
                    reset_at: now.saturating_add(full_in).unwrap_or(now),
                }
            })
            .collect()
    }

    /// Forgets users whose windows are full again; what they could do is
    /// unchanged. Call periodically: state otherwise grows with users.
    pub fn retain_recent(&self) {
        for cells in self.all_cells() {
            cells.retain_recent();
            cells.shrink_to_fit();
        }
    }

    /// Users with state, summed over all limiters.
    pub fn tracked_users(&self) -> usize {
        self.all_cells().iter().map(|cells| cells.len()).sum()
    }

    fn all_cells(&self) -> Vec<Arc<Cells<C>>> {
        let tools = self.tools.read().unwrap_or_else(PoisonError::into_inner);
        tools
            .values()
            .flatten()
            .flatten()
            .filter_map(|gate| gate.cells.clone())
            .collect()
    }

    /// The gates of the windows `limit` sets, indexed by [`Window::index`],
    /// made or rebuilt where the tool's limiter for a window is missing or
    /// was made for another value.
    fn gates(&self, tool: &str, limit: &RateLimit) -> [Option<Gate<C>>; 3] {
        let current = |gates: &[Option<Gate<C>>; 3]| {
            let mut out: [Option<Gate<C>>; 3] = [None, None, None];
            for window in Window::ALL {
                if let Some(n) = window.limit_in(limit) {
                    match &gates[window.index()] {
                        Some(gate) if gate.limit == n => out[window.index()] = Some(gate.clone()),
                        _ => return None,
                    }
                }
            }
            Some(out)
        };
        {
            let tools = self.tools.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(found) = tools.get(tool).and_then(current) {
                return found;
            }
        }
        let mut tools = self.tools.write().unwrap_or_else(PoisonError::into_inner);
        let gates = tools
            .entry(tool.to_owned())
            .or_insert_with(|| [None, None, None]);
        for window in Window::ALL {
            let slot = &mut gates[window.index()];
            match window.limit_in(limit) {
                None => *slot = None,
                Some(n) if slot.as_ref().is_some_and(|g| g.limit == n) => {}
                Some(n) => *slot = Some(Gate::new(window, n, self.clock.clone())),
            }
        }
        gates.clone()
    }
}

#[async_trait::async_trait]
impl<C> WindowStore for RateLimiter<C>
where
    C: Clock + Clone + Send + Sync,
    C::Instant: Send + Sync,
{
    async fn take(&self, tool: &str, limit: &RateLimit, user: &str) -> Result<(), LimitRefusal> {
        Ok(self.check(tool, limit, user)?)
    }

    async fn look(
        &self,
        tool: &str,
        limit: &RateLimit,
        user: &str,
    ) -> Result<Vec<WindowQuota>, LimitsUnavailable> {
        Ok(self.quota(tool, limit, user))
    }

    fn retain_recent(&self) {
        RateLimiter::retain_recent(self);
    }
}

impl<C: Clock> fmt::Debug for RateLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tools = self.tools.read().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("RateLimiter")
            .field("tools", &tools.len())
            .finish_non_exhaustive()
    }
}

/// One window of one tool: its allowance and the limiter holding its cells.
struct Gate<C: Clock> {
    window: Window,
    limit: u32,
    /// `None` when `limit` is 0: nothing ever passes.
    cells: Option<Arc<Cells<C>>>,
}

impl<C: Clock> Clone for Gate<C> {
    fn clone(&self) -> Self {
        Gate {
            window: self.window,
            limit: self.limit,
            cells: self.cells.clone(),
        }
    }
}

type Cells<C> = governor::RateLimiter<Probe, UserCells, C, NoOpMiddleware<<C as Clock>::Instant>>;

impl<C: Clock> Gate<C> {
    fn new(window: Window, limit: u32, clock: C) -> Self {
        let cells = NonZeroU32::new(limit).map(|n| {
            Arc::new(governor::RateLimiter::new(
                window.quota(n),
                UserCells::default(),
                clock,
            ))
        });
        Gate {
            window,
            limit,
            cells,
        }
    }

    /// `None` when the probe's user has a cell (taken if `probe.take`);
    /// otherwise how long until one is free.
    fn wait(&self, probe: &Probe) -> Option<Duration> {
        let Some(cells) = &self.cells else {
            return Some(self.window.length());
        };
        cells
            .check_key(probe)
            .err()
            .map(|not_until| not_until.wait_time_from(cells.clock().now()))
    }

    /// Cells `user` could take now, and how long until all `limit` are back.
    fn remaining(&self, user: &str) -> (u32, Duration) {
        let (Some(cells), Some(n)) = (&self.cells, NonZeroU32::new(self.limit)) else {
            return (0, self.window.length());
        };
        let probe = Probe {
            user: user.to_owned(),
            take: false,
        };
        // Asking for the whole burst is refused until the user's theoretical
        // arrival time, which is exactly when the window is full again.
        match cells.check_key_n(&probe, n) {
            Ok(Ok(())) => (self.limit, Duration::ZERO),
            Ok(Err(not_until)) => {
                let full_in = not_until.wait_time_from(cells.clock().now());
                (cells_left(self.limit, full_in, &not_until), full_in)
            }
            Err(_) => unreachable!("the burst is `limit` cells"),
        }
    }

    fn refusal(&self, tool: &str, retry_after: Duration) -> RateLimited {
        RateLimited {
            tool: tool.to_owned(),
            window: self.window,
            limit: self.limit,
            retry_after,
        }
    }
}

/// A window of `limit` cells that is full again in `full_in` is missing
/// `ceil(full_in / interval)` of them.
fn cells_left<P: governor::clock::Reference>(
    limit: u32,
    full_in: Duration,
    not_until: &NotUntil<P>,
) -> u32 {
    let interval = not_until.quota().replenish_interval().as_nanos().max(1);
    let missing = full_in.as_nanos().div_ceil(interval);
    limit.saturating_sub(u32::try_from(missing).unwrap_or(u32::MAX))
}

/// A limiter key: the user, and whether the check may take a cell.
///
/// governor's `check_key` always writes when it allows; [`UserCells`] reads
/// `take` to turn that write into a look.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Probe {
    user: String,
    take: bool,
}

/// Per-user GCRA state (the theoretical arrival time, as governor stores it)
/// that can be looked at without being changed.
#[derive(Default)]
struct UserCells {
    tats: RwLock<HashMap<String, InMemoryState>>,
}

impl UserCells {
    /// A state's theoretical arrival time, left unchanged.
    fn read(state: &InMemoryState) -> Option<Nanos> {
        state
            .measure_and_replace(&NotKeyed::NonKey, Err::<((), Nanos), _>)
            .unwrap_err()
    }
}

impl StateStore for UserCells {
    type Key = Probe;

    fn measure_and_replace<T, F, E>(&self, probe: &Probe, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        {
            let tats = self.tats.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(state) = tats.get(&probe.user) {
                return if probe.take {
                    state.measure_and_replace(&NotKeyed::NonKey, f)
                } else {
                    f(Self::read(state)).map(|(outcome, _)| outcome)
                };
            }
        }
        if !probe.take {
            return f(None).map(|(outcome, _)| outcome);
        }
        let mut tats = self.tats.write().unwrap_or_else(PoisonError::into_inner);
        tats.entry(probe.user.clone())
            .or_default()
            .measure_and_replace(&NotKeyed::NonKey, f)
    }
}

impl ShrinkableKeyedStateStore<Probe> for UserCells {
    fn retain_recent(&self, drop_below: Nanos) {
        let mut tats = self.tats.write().unwrap_or_else(PoisonError::into_inner);
        tats.retain(|_, state| Self::read(state).is_some_and(|tat| tat > drop_below));
    }

    fn shrink_to_fit(&self) {
        let mut tats = self.tats.write().unwrap_or_else(PoisonError::into_inner);
        tats.shrink_to_fit();
    }

    fn len(&self) -> usize {
        self.tats
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use governor::clock::FakeRelativeClock;

    use super::*;

    fn limiter() -> (RateLimiter<FakeRelativeClock>, FakeRelativeClock) {
        let clock = FakeRelativeClock::default();
        (RateLimiter::with_clock(clock.clone()), clock)
    }

    fn per_minute(n: u32) -> RateLimit {
        RateLimit {
            per_minute: Some(n),
            ..RateLimit::default()
        }
    }

    fn per_hour(n: u32) -> RateLimit {
        RateLimit {
            per_hour: Some(n),
            ..RateLimit::default()
        }
    }

    fn per_day(n: u32) -> RateLimit {
        RateLimit {
            per_day: Some(n),
            ..RateLimit::default()
        }
    }

    fn pass(l: &RateLimiter<FakeRelativeClock>, limit: &RateLimit, user: &str, times: u32) {
        for i in 0..times {
            l.check("lookup_stock", limit, user)
                .unwrap_or_else(|e| panic!("call {} of {times} refused: {e}", i + 1));
        }
    }

    fn remaining(l: &RateLimiter<FakeRelativeClock>, limit: &RateLimit, user: &str) -> Vec<u32> {
        l.quota("lookup_stock", limit, user)
            .iter()
            .map(|q| q.remaining)
            .collect()
    }

    #[test]
    fn the_31st_call_in_a_minute_waits_two_seconds_and_other_users_pass() {
        let (l, clock) = limiter();
        let limit = per_minute(30);
        pass(&l, &limit, "alice", 30);

        let refused = l.check("lookup_stock", &limit, "alice").unwrap_err();
        assert_eq!(refused.tool, "lookup_stock");
        assert_eq!(refused.window, Window::Minute);
        assert_eq!(refused.limit, 30);
        assert_eq!(refused.retry_after, Duration::from_secs(2));
        assert_eq!(refused.retry_after_ms(), 2_000);
        assert_eq!(
            refused.to_string(),
            "rate limit of 30 calls per minute for lookup_stock reached; retry in 2.0 s"
        );

        pass(&l, &limit, "bob", 1);

        clock.advance(Duration::from_millis(1_900));
        let refused = l.check("lookup_stock", &limit, "alice").unwrap_err();
        assert_eq!(refused.retry_after, Duration::from_millis(100));
        clock.advance(Duration::from_millis(100));
        pass(&l, &limit, "alice", 1);
        assert!(l.check("lookup_stock", &limit, "alice").is_err());
    }

    #[test]
    fn tools_are_limited_apart() {
        let (l, _clock) = limiter();
        let limit = per_minute(1);
        l.check("a", &limit, "alice").unwrap();
        l.check("b", &limit, "alice").unwrap();
        assert!(l.check("a", &limit, "alice").is_err());
    }

    #[test]
    fn the_hour_window_refills_one_call_per_hour_over_n() {
        let (l, clock) = limiter();
        let limit = per_hour(10);
        pass(&l, &limit, "alice", 10);
        let refused = l.check("lookup_stock", &limit, "alice").unwrap_err();
        assert_eq!(refused.window, Window::Hour);
        assert_eq!(refused.retry_after, Duration::from_secs(360));
        clock.advance(Duration::from_secs(360));
        pass(&l, &limit, "alice", 1);
        assert!(l.check("lookup_stock", &limit, "alice").is_err());
    }

    #[test]
    fn the_day_window_refills_one_call_per_day_over_n() {
        let (l, clock) = limiter();
        let limit = per_day(4);
        pass(&l, &limit, "alice", 4);
        let refused = l.check("lookup_stock", &limit, "alice").unwrap_err();
        assert_eq!(refused.window, Window::Day);
        assert_eq!(refused.retry_after, Duration::from_secs(6 * 3_600));
        assert_eq!(
            refused.to_string(),
            "rate limit of 4 calls per day for lookup_stock reached; retry in 21600.0 s"
        );
        clock.advance(Duration::from_secs(6 * 3_600));
        pass(&l, &limit, "alice", 1);
    }

    #[test]
    fn a_call_refused_by_the_hour_window_spends_no_minute_cell() {
        let (l, clock) = limiter();
        let limit = RateLimit {
            per_minute: Some(5),
            per_hour: Some(6),
            per_day: None,
        };
        pass(&l, &limit, "alice", 5);
        clock.advance(Duration::from_secs(60));
        pass(&l, &limit, "alice", 1);
        assert_eq!(remaining(&l, &limit, "alice"), vec![4, 0]);

        let refused = l.check("lookup_stock", &limit, "alice").unwrap_err();
        assert_eq!(refused.window, Window::Hour);
        assert_eq!(refused.limit, 6);
        // Hour cells come back one per 10 min; the first was taken at 0 s.
        assert_eq!(refused.retry_after, Duration::from_secs(540));
        assert_eq!(remaining(&l, &limit, "alice"), vec![4, 0]);
    }

    #[test]
    fn the_refusal_names_the_window_with_the_longest_wait() {
        let (l, _clock) = limiter();
        let limit = RateLimit {
            per_minute: Some(1),
            per_hour: None,
            per_day: Some(1),
        };
        pass(&l, &limit, "alice", 1);
        let refused = l.check("lookup_stock", &limit, "alice").unwrap_err();
        assert_eq!(refused.window, Window::Day);
        assert_eq!(refused.retry_after, Duration::from_secs(86_400));
        assert_eq!(
            refused.to_string(),
            "rate limit of 1 call per day for lookup_stock reached; retry in 86400.0 s"
        );
    }

    #[test]
    fn quota_counts_what_is_left_and_takes_nothing() {
        let (l, clock) = limiter();
        let limit = RateLimit {
            per_minute: Some(30),
            per_hour: Some(100),
            per_day: Some(1_000),
        };
        let fresh = l.quota("lookup_stock", &limit, "alice");
        assert_eq!(
            fresh
                .iter()
                .map(|q| (q.window, q.limit))
                .collect::<Vec<_>>(),
            vec![
                (Window::Minute, 30),
                (Window::Hour, 100),
                (Window::Day, 1_000)
            ]
        );
        assert_eq!(remaining(&l, &limit, "alice"), vec![30, 100, 1_000]);
        assert_eq!(l.tracked_users(), 0, "looking leaves no state");

        pass(&l, &limit, "alice", 10);
        for _ in 0..5 {
            assert_eq!(remaining(&l, &limit, "alice"), vec![20, 90, 990]);
        }
        assert_eq!(remaining(&l, &limit, "bob"), vec![30, 100, 1_000]);

        // Minute cells come back one per 2 s: after 3 s, one is back and the
        // window is full 17 s later.
        clock.advance(Duration::from_secs(3));
        assert_eq!(remaining(&l, &limit, "alice"), vec![21, 90, 990]);
        let gates = l.gates("lookup_stock", &limit);
        let minute = gates[Window::Minute.index()].as_ref().unwrap();
        assert_eq!(minute.remaining("alice"), (21, Duration::from_secs(17)));
        let day = gates[Window::Day.index()].as_ref().unwrap();
        assert_eq!(
            day.remaining("alice"),
            (990, Duration::from_secs(10 * 86_400 / 1_000 - 3))
        );

        pass(&l, &limit, "alice", 21);
        assert!(l.check("lookup_stock", &limit, "alice").is_err());
        assert_eq!(remaining(&l, &limit, "alice"), vec![0, 69, 969]);
    }

    #[test]
    fn quota_reset_at_is_when_the_window_is_full_again() {
        let (l, _clock) = limiter();
        let limit = per_minute(30);
        let before = jiff::Timestamp::now();
        let fresh = &l.quota("lookup_stock", &limit, "alice")[0];
        assert!(fresh.reset_at >= before && fresh.reset_at <= jiff::Timestamp::now());

        pass(&l, &limit, "alice", 30);
        let before = jiff::Timestamp::now();
        let spent = &l.quota("lookup_stock", &limit, "alice")[0];
        let after = jiff::Timestamp::now();
        assert_eq!(spent.remaining, 0);
        let minute = jiff::SignedDuration::from_secs(60);
        assert!(spent.reset_at >= before + minute && spent.reset_at <= after + minute);

        let json = serde_json::to_value(spent).unwrap();
        assert_eq!(json["window"], "minute");
        assert_eq!(json["limit"], 30);
        assert_eq!(json["remaining"], 0);
        assert!(json["reset_at"].is_string());
    }

    #[test]
    fn a_changed_limit_rebuilds_the_window() {
        let (l, _clock) = limiter();
        pass(&l, &per_minute(2), "alice", 2);
        assert!(l.check("lookup_stock", &per_minute(2), "alice").is_err());

        // Hot reload raised the limit: the window starts afresh.
        pass(&l, &per_minute(5), "alice", 5);
        let refused = l
            .check("lookup_stock", &per_minute(5), "alice")
            .unwrap_err();
        assert_eq!(refused.limit, 5);
        assert_eq!(refused.retry_after, Duration::from_secs(12));

        // The same value again keeps the state.
        assert!(l.check("lookup_stock", &per_minute(5), "alice").is_err());

        // Adding a window keeps the windows that did not change.
        let both = RateLimit {
            per_minute: Some(5),
            per_hour: Some(100),
            per_day: None,
        };
        assert_eq!(
            l.check("lookup_stock", &both, "alice").unwrap_err().window,
            Window::Minute
        );
        assert_eq!(remaining(&l, &both, "alice"), vec![0, 100]);
    }

    #[test]
    fn an_unlimited_tool_always_passes() {
        let (l, _clock) = limiter();
        pass(&l, &RateLimit::default(), "alice", 10_000);
        assert!(
            l.quota("lookup_stock", &RateLimit::default(), "alice")
                .is_empty()
        );
        assert_eq!(l.tracked_users(), 0);
    }

    #[test]
    fn a_zero_limit_refuses_every_call() {
        let (l, _clock) = limiter();
        let refused = l.check("lookup_stock", &per_hour(0), "alice").unwrap_err();
        assert_eq!(refused.window, Window::Hour);
        assert_eq!(refused.retry_after, Duration::from_secs(3_600));
        assert_eq!(remaining(&l, &per_hour(0), "alice"), vec![0]);
    }

    #[test]
    fn the_limiter_can_be_shared_across_threads() {
        fn shared<T: Send + Sync + 'static>() {}
        shared::<RateLimiter>();
        shared::<RateLimiter<FakeRelativeClock>>();
    }

    #[test]
    fn retain_recent_forgets_users_whose_windows_are_full() {
        let (l, clock) = limiter();
        let limit = RateLimit {
            per_minute: Some(30),
            per_hour: None,
            per_day: Some(100),
        };
        pass(&l, &limit, "alice", 3);
        pass(&l, &limit, "bob", 1);
        assert_eq!(l.tracked_users(), 4);

        clock.advance(Duration::from_secs(120));
        l.retain_recent();
        assert_eq!(l.tracked_users(), 2, "minute windows are full again");

        clock.advance(Duration::from_secs(86_400));
        l.retain_recent();
        assert_eq!(l.tracked_users(), 0);
        assert_eq!(remaining(&l, &limit, "alice"), vec![30, 100]);
    }
}
