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
//!   recorded this month are at or past the budget. A turn admitted under
//!   it runs to its end (its tool rounds, its final call and the summary
//!   after it), and so does a turn already waiting in its session's queue.
//!   The overshoot is therefore bounded by the turns admitted before the
//!   crossing was recorded: each at most `max_iterations + 1` model calls
//!   plus one summary call, each of at most its prompt plus `max_tokens`.
//! - A turn's usage is written with the turn's own final commit, before its
//!   reply is sent, so the turn after a crossing sees it. A summary call's
//!   usage follows the turn by one write.
//! - The decision is pure (it takes `now`); reading the config and the
//!   month's usage is the caller's IO.

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

/// A tenant past its monthly token budget.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the tenant's monthly token budget of {budget} tokens is used up ({used} used this month); \
     it resets at {resets_at}"
)]
pub struct BudgetExceeded {
    pub budget: u64,
    pub used: u64,
    pub resets_at: Timestamp,
    /// From the refusal to `resets_at`.
    pub retry_after: Duration,
}

/// Whether the tenant may start model work now, `used` being its usage of
/// `month` so far.
pub fn check(
    budget: Option<u64>,
    used: &TokenUsage,
    month: &Month,
    now: Timestamp,
) -> Result<(), BudgetExceeded> {
    match budget {
        Some(budget) if used.total_tokens >= budget => Err(BudgetExceeded {
            budget,
            used: used.total_tokens,
            resets_at: month.resets_at,
            retry_after: month
                .resets_at
                .duration_since(now)
                .try_into()
                .unwrap_or(Duration::ZERO)
                .max(Duration::from_secs(1)),
        }),
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
}
