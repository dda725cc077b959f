//! Caller identity: who a call is for, on the ground floor.
//!
//! tenants (keys) ──▶ [`Principal`] ──▶ http / mcp handlers
//! store, tools, executor, workflow ──▶ [`Plan`], [`DEFAULT_TENANT`]
//!
//! The tenant, plan ceiling and rights (admin, scrape-only) of a caller
//! come from its key ([`crate::tenants`]). They are plain data that the
//! store (sessions carry a tenant and a plan), the tool definitions
//! (`required_plan`) and the key ring all name. They live here, below all
//! of them, so none of those modules has to import another for them.

use serde::{Deserialize, Serialize};

/// The tenant of a server that runs open (no API key created yet), and of
/// records written before tenants existed.
pub const DEFAULT_TENANT: &str = "default";

/// Subscription plans, ordered: free < pro < premium.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Plan {
    #[default]
    Free,
    Pro,
    Premium,
}

impl Plan {
    pub fn as_str(self) -> &'static str {
        match self {
            Plan::Free => "free",
            Plan::Pro => "pro",
            Plan::Premium => "premium",
        }
    }

    pub fn parse(s: &str) -> Option<Plan> {
        match s.trim().to_ascii_lowercase().as_str() {
            "free" => Some(Plan::Free),
            "pro" => Some(Plan::Pro),
            "premium" => Some(Plan::Premium),
            _ => None,
        }
    }
}

/// The caller of a request, once authenticated: what its key allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub tenant: String,
    pub admin: bool,
    /// The highest plan the key may use: a ceiling, not the plan a call
    /// runs with (that is the lowest of tenant, key and request).
    pub plan: Plan,
    /// A scrape key: it may read `/metrics` and nothing else.
    pub metrics_only: bool,
    /// The verified key's id (`None` when the server runs open).
    pub key_id: Option<String>,
}

impl Principal {
    /// The local operator of a server that runs open (loopback only):
    /// tenant `default`, admin, every plan.
    pub fn open() -> Self {
        Principal {
            tenant: DEFAULT_TENANT.into(),
            admin: true,
            plan: Plan::Premium,
            metrics_only: false,
            key_id: None,
        }
    }

    /// May read `/metrics`: an admin key or a scrape key.
    pub fn may_scrape(&self) -> bool {
        self.admin || self.metrics_only
    }
}
