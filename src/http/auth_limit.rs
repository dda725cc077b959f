//! Failed authentications, counted per client address.
//!
//! request ──▶ auth ──[`FailedAuths::blocked`]? ──yes──▶ 429 RATE_LIMITED + Retry-After (the key is not even checked)
//!                      │ no
//!                      └──▶ verify key ──refused──▶ [`FailedAuths::record`] ──▶ 401
//!
//! Without this, wrong keys are answered 401 as fast as they arrive, so a
//! key can be guessed at full speed. Each address has a budget of
//! `failed_auth_burst` failures that refills at `failed_auth_per_minute`
//! ([`super::rate_limit::ApiLimitConfig`], `[api_limit]`; default 10 and 10
//! a minute: ten typos are free, then one guess every 6 s). An address over
//! its budget is answered 429 before its key is checked, so a right guess
//! made while blocked is refused too.
//!
//! Decisions:
//! - **Per address, not per key.** The presented keys are the attacker's
//!   choice; the peer address (`ConnectInfo<SocketAddr>`) is not. IPv6 counts
//!   by /64 (one host usually holds one), IPv4-mapped addresses as IPv4.
//!   Behind a reverse proxy every client shares the proxy's address, unless
//!   the proxy is listed in `[server] trusted_proxies`: then the address its
//!   `X-Forwarded-For` names ([`super::client_addr`]).
//! - **Only presented keys count.** A request with no key is 401 but spends
//!   nothing: it guesses nothing. Requests with a valid key spend nothing
//!   either, so a busy, correctly configured client is never slowed; while
//!   its address is blocked (it also sent bad keys), it waits like the rest.
//! - **Not governor.** governor's GCRA spends a cell on every check and
//!   cannot say "is this address over budget?" without spending; refusing
//!   *before* verification needs that question. So the same GCRA, one
//!   instant per address ("theoretical arrival time"), in a map here.
//!   Requests already past the check when the budget runs out still get
//!   their answer: the overshoot is at most the requests in flight.
//! - **Bounded memory.** An address whose budget is whole again is dropped
//!   (swept on write once per full refill, or once per period while the map
//!   is full); at [`MAX_TRACKED`] addresses, failures from new ones share one
//!   bucket rather than grow the map.
//! - **Time is a parameter** (`now`), so tests drive it by hand.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Addresses tracked at most; past it, new ones share one bucket.
pub const MAX_TRACKED: usize = 65_536;

/// Who failed: an address (IPv6 by /64), or the shared bucket (no address
/// known, or too many tracked).
pub type Client = Option<IpAddr>;

/// The client of a peer address.
pub fn client_of(addr: IpAddr) -> Client {
    Some(match addr.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    })
}

/// The failure budget of every address; clones share the counts.
#[derive(Clone)]
pub struct FailedAuths {
    inner: Arc<Mutex<Counts>>,
    /// One failure is forgiven every `period`.
    period: Duration,
    /// Failures an address may make at once.
    burst: u32,
}

struct Counts {
    /// Per client: when its budget is whole again.
    whole_at: HashMap<Client, Instant>,
    last_sweep: Option<Instant>,
}

impl Counts {
    /// Where `client`'s failures count: its own entry, or the shared one
    /// when it has none and the map is full.
    fn slot(&self, client: Client) -> Client {
        if self.whole_at.len() >= MAX_TRACKED && !self.whole_at.contains_key(&client) {
            None
        } else {
            client
        }
    }
}

impl FailedAuths {
    pub fn new(burst: NonZeroU32, per_minute: NonZeroU32) -> FailedAuths {
        FailedAuths {
            inner: Arc::new(Mutex::new(Counts {
                whole_at: HashMap::new(),
                last_sweep: None,
            })),
            period: Duration::from_secs(60) / per_minute.get(),
            burst: burst.get(),
        }
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        // Nothing panics while holding the lock; a poisoned map is intact.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What one more failure may still borrow: the budget minus one period.
    fn slack(&self) -> Duration {
        self.period * (self.burst - 1)
    }

    /// `Some(wait)` when `client` has no failure left: refuse it for `wait`.
    pub fn blocked(&self, client: Client, now: Instant) -> Option<Duration> {
        let counts = self.counts();
        let whole_at = *counts.whole_at.get(&counts.slot(client))?;
        let debt = whole_at.saturating_duration_since(now);
        debt.checked_sub(self.slack()).filter(|w| !w.is_zero())
    }

    /// Spends one failure of `client`'s budget.
    pub fn record(&self, client: Client, now: Instant) {
        let mut counts = self.counts();
        let since_sweep = counts
            .last_sweep
            .map_or(Duration::MAX, |t| now.saturating_duration_since(t));
        let full = counts.whole_at.len() >= MAX_TRACKED;
        if since_sweep >= self.period * self.burst || (full && since_sweep >= self.period) {
            counts.whole_at.retain(|_, whole_at| *whole_at > now);
            counts.last_sweep = Some(now);
        }
        let slot = counts.slot(client);
        let whole_at = counts.whole_at.entry(slot).or_insert(now);
        *whole_at = (*whole_at).max(now) + self.period;
    }

    /// Addresses with failures not yet forgiven (or not yet swept).
    pub fn tracked(&self) -> usize {
        self.counts().whole_at.len()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn limiter(burst: u32, per_minute: u32) -> FailedAuths {
        FailedAuths::new(
            NonZeroU32::new(burst).unwrap(),
            NonZeroU32::new(per_minute).unwrap(),
        )
    }

    fn ip(last: u8) -> Client {
        client_of(IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)))
    }

    #[test]
    fn the_budget_is_spent_then_one_failure_per_period_comes_back() {
        let auths = limiter(3, 6); // one every 10 s
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(auths.blocked(ip(1), t0), None);
            auths.record(ip(1), t0);
        }
        assert_eq!(auths.blocked(ip(1), t0), Some(Duration::from_secs(10)));
        let t = t0 + Duration::from_secs(4);
        assert_eq!(auths.blocked(ip(1), t), Some(Duration::from_secs(6)));
        let t = t0 + Duration::from_secs(10);
        assert_eq!(auths.blocked(ip(1), t), None, "one failure is back");
        auths.record(ip(1), t);
        assert_eq!(auths.blocked(ip(1), t), Some(Duration::from_secs(10)));
    }

    #[test]
    fn addresses_are_counted_apart() {
        let auths = limiter(1, 60);
        let t0 = Instant::now();
        auths.record(ip(1), t0);
        assert!(auths.blocked(ip(1), t0).is_some());
        assert_eq!(auths.blocked(ip(2), t0), None);
        assert_eq!(auths.blocked(None, t0), None);
    }

    #[test]
    fn ipv6_counts_by_64_and_mapped_ipv4_as_ipv4() {
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(client_of(a), client_of(b));
        assert_ne!(client_of(a), client_of(c));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(client_of(mapped), ip(1));
    }

    #[test]
    fn addresses_that_went_quiet_are_dropped() {
        let auths = limiter(2, 60); // one a second, whole after 2 s
        let t0 = Instant::now();
        auths.record(ip(1), t0);
        auths.record(ip(2), t0);
        assert_eq!(auths.tracked(), 2);
        let later = t0 + Duration::from_secs(3);
        auths.record(ip(3), later);
        assert_eq!(auths.tracked(), 1, "only the address that just failed");
        assert_eq!(auths.blocked(ip(1), later), None);
    }

    #[test]
    fn past_the_cap_new_addresses_share_one_bucket() {
        let auths = limiter(1, 1);
        let t0 = Instant::now();
        for n in 0..MAX_TRACKED as u32 {
            auths.record(client_of(IpAddr::V4(Ipv4Addr::from(n))), t0);
        }
        assert_eq!(auths.tracked(), MAX_TRACKED);
        let newcomer = client_of(IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7)));
        assert_eq!(auths.blocked(newcomer, t0), None);
        auths.record(newcomer, t0);
        assert!(auths.blocked(None, t0).is_some(), "the shared bucket paid");
        assert!(auths.blocked(newcomer, t0).is_some(), "and counts for it");
        let another = client_of(IpAddr::V4(Ipv4Addr::new(203, 0, 113, 8)));
        auths.record(another, t0);
        assert_eq!(auths.tracked(), MAX_TRACKED + 1, "the map stops growing");
    }
}
