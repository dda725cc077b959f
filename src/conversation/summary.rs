//! Tool usage summaries: per turn (in the turn reply) and per session
//! (`GET /v1/sessions/{id}/summary`), built from the same counting code.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolUsageSummary {
    pub total_calls: u64,
    pub successful_calls: u64,
    pub failed_calls: u64,
    /// successful / total, 0.0 when there were no calls.
    pub success_rate: f64,
    pub tool_usage: BTreeMap<String, u64>,
    pub has_errors: bool,
}

impl ToolUsageSummary {
    /// From `(tool name, succeeded)` pairs.
    pub fn from_calls<'a>(calls: impl IntoIterator<Item = (&'a str, bool)>) -> Self {
        let mut s = ToolUsageSummary::default();
        for (name, ok) in calls {
            s.total_calls += 1;
            if ok {
                s.successful_calls += 1;
            } else {
                s.failed_calls += 1;
            }
            *s.tool_usage.entry(name.to_string()).or_default() += 1;
        }
        if s.total_calls > 0 {
            s.success_rate = s.successful_calls as f64 / s.total_calls as f64;
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
        let s = ToolUsageSummary::from_calls([("calc", true), ("calc", false), ("echo", true)]);
        assert_eq!(
            (s.total_calls, s.successful_calls, s.failed_calls),
            (3, 2, 1)
        );
        assert_eq!(s.tool_usage["calc"], 2);
        assert!(s.has_errors);
        assert!((s.success_rate - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(ToolUsageSummary::from_calls([]).success_rate, 0.0);
    }
}
