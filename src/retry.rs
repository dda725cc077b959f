//! Backoff between attempts: one policy type for every retry loop.
//!
//! executor (tool retries) ──┐
//! model client (429 / 5xx) ─┼──▶ [`Backoff::delay`] ──▶ tokio::time::sleep
//! workflow agent nodes ─────┘
//!
//! Each caller keeps its own numbers (base delay, how many doublings,
//! jitter); the arithmetic is here once. The delay of attempt `n`
//! (1-based: the wait after the first failure is attempt 1) is
//! `base × 2^(n-1)`, the doubling capped at `max_doublings`, times a
//! factor drawn uniformly from 0.5..1.5 when `jitter` is on, so callers
//! that failed together do not retry together.

use std::time::Duration;

/// An exponential backoff policy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub base: Duration,
    /// The delay stops growing after this many doublings.
    pub max_doublings: u32,
    /// Multiply by a random factor in 0.5..1.5.
    pub jitter: bool,
}

impl Backoff {
    /// Exponential with ±50 % jitter.
    pub const fn jittered(base: Duration, max_doublings: u32) -> Backoff {
        Backoff {
            base,
            max_doublings,
            jitter: true,
        }
    }

    /// Exponential, no jitter.
    pub const fn exact(base: Duration, max_doublings: u32) -> Backoff {
        Backoff {
            base,
            max_doublings,
            jitter: false,
        }
    }

    /// The wait after failed attempt `attempt` (1-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(self.max_doublings).min(31);
        let exp = self.base.saturating_mul(1u32 << doublings);
        if self.jitter {
            exp.mul_f64(rand::random_range(0.5..1.5))
        } else {
            exp
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap() {
        let b = Backoff::exact(Duration::from_millis(100), 3);
        let ms: Vec<u128> = (1..=6).map(|n| b.delay(n).as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 800, 800]);
        assert_eq!(b.delay(0), Duration::from_millis(100));
    }

    #[test]
    fn jitter_stays_within_half_to_one_and_a_half() {
        let b = Backoff::jittered(Duration::from_millis(100), 10);
        for _ in 0..200 {
            let d = b.delay(2);
            assert!(
                d >= Duration::from_millis(100) && d < Duration::from_millis(300),
                "{d:?}"
            );
        }
    }

    #[test]
    fn huge_attempts_and_caps_do_not_overflow() {
        let b = Backoff::exact(Duration::from_secs(1), u32::MAX);
        assert!(b.delay(u32::MAX) > Duration::from_secs(1));
    }
}
