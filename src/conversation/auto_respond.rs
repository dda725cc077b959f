//! Auto-response: whether a visitor's message gets a model turn.
//!
//! visitor message ──▶ should_auto_respond(tenant config, operator assigned?) ──▶ turn | stored only
//!
//! Auto-response off: never. On, with no operator on the session: always.
//! On, with an operator assigned: only when the tenant allows answering
//! alongside operators (`respond_with_operator`). The decision carries its
//! reason, which is logged and sent to the client.

use serde::Serialize;

use crate::tenants::TenantConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub respond: bool,
    pub reason: &'static str,
}

pub fn should_auto_respond(config: &TenantConfig, operator_assigned: bool) -> Decision {
    let (respond, reason) = match (
        config.auto_respond_enabled,
        operator_assigned,
        config.respond_with_operator,
    ) {
        (false, _, _) => (false, "auto-response is disabled for this tenant"),
        (true, false, _) => (true, "no operator is assigned"),
        (true, true, true) => (
            true,
            "an operator is assigned and the tenant answers alongside operators",
        ),
        (true, true, false) => (
            false,
            "an operator is assigned and handles the conversation",
        ),
    };
    Decision { respond, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_truth_table() {
        let cases = [
            // (enabled, operator, with_operator) -> respond
            ((false, false, false), false),
            ((false, false, true), false),
            ((false, true, false), false),
            ((false, true, true), false),
            ((true, false, false), true),
            ((true, false, true), true),
            ((true, true, false), false),
            ((true, true, true), true),
        ];
        for ((enabled, operator, with_operator), expected) in cases {
            let config = TenantConfig {
                auto_respond_enabled: enabled,
                respond_with_operator: with_operator,
                ..TenantConfig::default()
            };
            let d = should_auto_respond(&config, operator);
            assert_eq!(d.respond, expected, "{enabled} {operator} {with_operator}");
            assert!(!d.reason.is_empty());
        }
    }
}
