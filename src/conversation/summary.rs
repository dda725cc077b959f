//! Tool usage summaries: per turn (in the turn reply) and per session
//! (`GET /v1/sessions/{id}/summary`), built from the same counting code.
//!
//! A call held for confirmation counts as `pending_calls`, a declined one
//! as `declined_calls`: neither is a failure ([`CallStatus`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::store::CallStatus;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ToolUsageSummary {
    /// Every call, held and declined ones included.
    pub total_calls: u64,
    pub successful_calls: u64,
    pub failed_calls: u64,
    /// Held for a person's confirmation, undecided: neither succeeded nor
    /// failed (an approved call then counts once, as what its run gave).
    #[serde(default)]
    pub pending_calls: u64,
    /// Declined by a person (or expired undecided): they did not run, and
    /// are not failures.
    #[serde(default)]
    pub declined_calls: u64,
    /// successful / (successful + failed): of the calls that ran or were
    /// refused; 0.0 when there were none.
    pub success_rate: f64,
    pub tool_usage: BTreeMap<String, u64>,
    pub has_errors: bool,
}

impl ToolUsageSummary {
    /// From `(tool name, status)` pairs ([`CallStatus::of`] a call's
    /// `is_success` and `error_type`).
    pub fn from_calls<'a>(calls: impl IntoIterator<Item = (&'a str, CallStatus)>) -> Self {
        let mut s = ToolUsageSummary::default();
        for (name, status) in calls {
            s.total_calls += 1;
            match status {
                CallStatus::Succeeded => s.successful_calls += 1,
                CallStatus::Failed => s.failed_calls += 1,
                CallStatus::PendingApproval => s.pending_calls += 1,
                CallStatus::Declined => s.declined_calls += 1,
            }
            *s.tool_usage.entry(name.to_string()).or_default() += 1;
        }
        let decided = s.successful_calls + s.failed_calls;
        if decided > 0 {
            s.success_rate = s.successful_calls as f64 / decided as f64;
        }
        s.has_errors = s.failed_calls > 0;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_tool_and_outcome() {
        let s = ToolUsageSummary::from_calls([
            ("calc", CallStatus::Succeeded),
            ("calc", CallStatus::Failed),
            ("echo", CallStatus::Succeeded),
        ]);
        assert_eq!(
            (s.total_calls, s.successful_calls, s.failed_calls),
            (3, 2, 1)
        );
        assert_eq!(s.tool_usage["calc"], 2);
        assert!(s.has_errors);
        assert!((s.success_rate - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(ToolUsageSummary::from_calls([]).success_rate, 0.0);
    }

    #[test]
    fn a_held_call_is_pending_and_a_declined_one_is_not_a_failure() {
        let s = ToolUsageSummary::from_calls([
            ("order", CallStatus::PendingApproval),
            ("order", CallStatus::Declined),
            ("calc", CallStatus::Succeeded),
        ]);
        assert_eq!(
            (
                s.total_calls,
                s.successful_calls,
                s.failed_calls,
                s.pending_calls,
                s.declined_calls
            ),
            (3, 1, 0, 1, 1)
        );
        assert!(!s.has_errors);
        assert_eq!(s.success_rate, 1.0);
    }
}
