//! Token budgets: the gate a tenant's model work passes before its first
//! model call.
//!
//! Sessions (every turn: HTTP, streamed, WebSocket, workflow agent node,
//! MCP, CLI; operator suggestions)
//!     ──▶ tenant config `monthly_token_budget` + the month's usage (store)
//!     ──▶ [`check`] ──▶ go on | 429 `BUDGET_EXCEEDED` with `Retry-After`
//!
//! Decisions:
//! - The window is the calendar month in UTC: usage of days `1..=last` of
//!   the month, and the budget resets at 00:00 UTC on the 1st of the next
//!   month. The refusal says when (`resets_at`) and `Retry-After` counts
//!   the seconds to it.
//! - Admission, not preemption: a turn is refused when the tokens already
//!   recorded this month, plus the tokens set aside for the tenant's turns
//!   running now, are at or past the budget. A turn admitted under it runs
//!   to its end (its tool rounds, its final call and the summary after it),
//!   and so does a turn already waiting in its session's queue.
//! - Reservations ([`Reservations`]): each admitted turn sets aside an
//!   estimate of its cost ([`estimate`]: twice the tenant's average tokens
//!   per model call this month, [`FIRST_ESTIMATE`] before its first call)
//!   until it ends (its usage is then in the store: a turn's usage is
//!   written with its final commit). Without them 40 concurrent turns all
//!   saw the same "under budget" and spent 40 times a 1,000-token budget;
//!   with them, concurrent turns are admitted only while the budget is not
//!   all set aside, so the overshoot is at most what the admitted turns
//!   spend beyond their estimates. A refusal for reservations alone
//!   (recorded usage under the budget) says so and asks to retry in a
//!   second, not at the month's end. A turn that pauses for an approval
//!   gives its reservation back (it may wait for hours); its model calls
//!   after the decision are counted, not reserved.
//! - Reservations are this node's: in cluster mode each node sets aside for
//!   the turns it runs, so a tenant whose turns run on N nodes at once can
//!   overshoot by up to N turns' worth. Recorded usage is shared (the
//!   store).
//! - A turn's usage is written with the turn's own final commit, before its
//!   reply is sent, so the turn after a crossing sees it. A summary call's
//!   usage follows the turn by one write.
//! - The decision is pure (it takes `now`); reading the config and the
//!   month's usage is the caller's IO.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use jiff::civil::Date;
use jiff::tz::TimeZone;

use crate::store::TokenUsage;
use crate::store::usage::day_of;

/// The budget window `now` falls in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Month {
    pub first: Date,
    pub last: Date,
    /// 00:00 UTC on the day after `last`.
    pub resets_at: Timestamp,
}

impl Month {
    pub fn of(now: Timestamp) -> Month {
        let today = day_of(now);
        let (first, last) = (today.first_of_month(), today.last_of_month());
        let resets_at = last
            .tomorrow()
            .and_then(|d| d.to_zoned(TimeZone::UTC))
            .map_or(Timestamp::MAX, |z| z.timestamp());
        Month {
            first,
            last,
            resets_at,
        }
    }
}

/// A tenant past its monthly token budget (or with all of it set aside for
/// turns running now).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct BudgetExceeded {
    pub budget: u64,
    pub used: u64,
    /// Set aside for the tenant's turns running now (this node).
    pub reserved: u64,
    pub resets_at: Timestamp,
    /// From the refusal to `resets_at`; one second when the budget is only
    /// set aside (those turns end soon).
    pub retry_after: Duration,
}

impl BudgetExceeded {
    fn describe(&self) -> String {
        let BudgetExceeded {
            budget,
            used,
            reserved,
            resets_at,
            ..
        } = self;
        if used >= budget {
            format!(
                "the tenant's monthly token budget of {budget} tokens is used up ({used} used this month); \
                 it resets at {resets_at}"
            )
        } else {
            format!(
                "the tenant's monthly token budget of {budget} tokens is taken: {used} used this month \
                 and {reserved} set aside for its turns running now; retry when they end"
            )
        }
    }
}

/// What a turn sets aside before its tenant's first model call of the month.
pub const FIRST_ESTIMATE: u64 = 1_024;

/// What a turn is expected to cost: twice the tenant's average tokens per
/// model call this month (a tool round and the answer), at least 1;
/// [`FIRST_ESTIMATE`] before any call.
pub fn estimate(used: &TokenUsage) -> u64 {
    if used.model_calls == 0 {
        return FIRST_ESTIMATE;
    }
    used.total_tokens
        .div_ceil(used.model_calls)
        .saturating_mul(2)
        .max(1)
}

/// The tokens set aside per tenant for its turns running on this node.
#[derive(Debug, Clone, Default)]
pub struct Reservations {
    by_tenant: Arc<Mutex<HashMap<String, u64>>>,
}

/// Tokens set aside for one turn; given back when dropped (the turn ended,
/// paused, or never started).
#[derive(Debug)]
pub struct Reservation {
    ledger: Reservations,
    tenant: String,
    tokens: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut map = self.ledger.by_tenant.lock().expect("reservations lock");
        if let Some(held) = map.get_mut(&self.tenant) {
            *held = held.saturating_sub(self.tokens);
            if *held == 0 {
                map.remove(&self.tenant);
            }
        }
    }
}

impl Reservations {
    /// Sets aside [`estimate`]`(used)` tokens for a turn of `tenant`, unless
    /// its usage plus what is set aside already reaches `budget`.
    pub fn reserve(
        &self,
        tenant: &str,
        budget: u64,
        used: &TokenUsage,
        month: &Month,
        now: Timestamp,
    ) -> Result<Reservation, BudgetExceeded> {
        let mut map = self.by_tenant.lock().expect("reservations lock");
        let reserved = map.get(tenant).copied().unwrap_or(0);
        check_with(Some(budget), used, reserved, month, now)?;
        let tokens = estimate(used);
        *map.entry(tenant.to_string()).or_insert(0) += tokens;
        Ok(Reservation {
            ledger: self.clone(),
            tenant: tenant.to_string(),
            tokens,
        })
    }

    /// What is set aside for `tenant` now.
    pub fn held(&self, tenant: &str) -> u64 {
        self.by_tenant
            .lock()
            .expect("reservations lock")
            .get(tenant)
            .copied()
            .unwrap_or(0)
    }
}

/// Whether the tenant may start model work now, `used` being its usage of
/// `month` so far.
pub fn check(
    budget: Option<u64>,
    used: &TokenUsage,
    month: &Month,
    now: Timestamp,
) -> Result<(), BudgetExceeded> {
    check_with(budget, used, 0, month, now)
}

fn check_with(
    budget: Option<u64>,
    used: &TokenUsage,
    reserved: u64,
    month: &Month,
    now: Timestamp,
) -> Result<(), BudgetExceeded> {
    match budget {
        Some(budget) if used.total_tokens.saturating_add(reserved) >= budget => {
            let retry_after = if used.total_tokens >= budget {
                month
                    .resets_at
                    .duration_since(now)
                    .try_into()
                    .unwrap_or(Duration::ZERO)
                    .max(Duration::from_secs(1))
            } else {
                Duration::from_secs(1)
            };
            Err(BudgetExceeded {
                budget,
                used: used.total_tokens,
                reserved,
                resets_at: month.resets_at,
                retry_after,
            })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::civil::date;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn the_month_is_utc_and_resets_on_the_first() {
        let m = Month::of(at("2024-02-29T23:59:59Z"));
        assert_eq!((m.first, m.last), (date(2024, 2, 1), date(2024, 2, 29)));
        assert_eq!(m.resets_at, at("2024-03-01T00:00:00Z"));
        // 23:30 in New York on Jan 31 is already February in UTC.
        let m = Month::of(at("2025-01-31T23:30:00-05:00"));
        assert_eq!(m.first, date(2025, 2, 1));
        let m = Month::of(at("2025-12-15T12:00:00Z"));
        assert_eq!(m.resets_at, at("2026-01-01T00:00:00Z"));
    }

    #[test]
    fn refused_at_or_past_the_budget_with_the_wait_until_the_reset() {
        let now = at("2025-06-30T23:00:00Z");
        let month = Month::of(now);
        let used = |n| TokenUsage::call(n, 0);
        assert!(check(None, &used(u64::MAX), &month, now).is_ok());
        assert!(check(Some(100), &used(99), &month, now).is_ok());
        let refused = check(Some(100), &used(100), &month, now).unwrap_err();
        assert_eq!(refused.resets_at, at("2025-07-01T00:00:00Z"));
        assert_eq!(refused.retry_after, Duration::from_secs(3600));
        assert!(refused.to_string().contains("2025-07-01T00:00:00Z"));
        assert!(
            check(Some(0), &used(0), &month, now).is_err(),
            "0 stops all"
        );
    }

    #[test]
    fn concurrent_turns_are_admitted_while_the_budget_is_not_all_set_aside() {
        let now = at("2025-06-10T12:00:00Z");
        let month = Month::of(now);
        let ledger = Reservations::default();
        // 10 calls of 100 tokens so far: a turn is expected to cost 200.
        let used = TokenUsage {
            total_tokens: 1_000,
            model_calls: 10,
            ..TokenUsage::default()
        };
        assert_eq!(estimate(&used), 200);
        let a = ledger.reserve("t", 1_400, &used, &month, now).unwrap();
        let b = ledger.reserve("t", 1_400, &used, &month, now).unwrap();
        assert_eq!(ledger.held("t"), 400);
        let refused = ledger.reserve("t", 1_400, &used, &month, now).unwrap_err();
        assert_eq!(refused.reserved, 400);
        assert_eq!(refused.retry_after, Duration::from_secs(1));
        assert!(refused.to_string().contains("set aside"), "{refused}");
        // Other tenants are not touched.
        assert!(ledger.reserve("u", 1_400, &used, &month, now).is_ok());
        drop(a);
        let c = ledger.reserve("t", 1_400, &used, &month, now).unwrap();
        drop((b, c));
        assert_eq!(ledger.held("t"), 0);
        assert_eq!(estimate(&TokenUsage::default()), FIRST_ESTIMATE);
    }
}
