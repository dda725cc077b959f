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
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
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

    /// The sessions it may reach: its tenant's, whatever its rights (an
    /// admin reaches other tenants' sessions only through the admin
    /// routes, which name the tenant).
    pub fn scope(&self) -> Scope {
        Scope::tenant(self.tenant.clone())
    }

    /// May read `/metrics`: an admin key or a scrape key.
    pub fn may_scrape(&self) -> bool {
        self.admin || self.metrics_only
    }
}

/// Whose sessions a call may reach: every entry of the session API that
/// names a session takes one ([`crate::conversation::Sessions`]), so no
/// handler has to remember a tenant check before an unscoped call.
///
/// Decision: two kinds. A tenant's scope ([`Scope::tenant`], what a key's
/// [`Principal::scope`] gives) reaches only that tenant's sessions;
/// another tenant's session is "not found", exactly like one that does not
/// exist. The runtime's own scope ([`Scope::runtime`]: the retention
/// sweep, a tenant erase, resumes after a crash, the local CLI and an
/// embedder, which own the data dir) reaches every session; what it lists
/// or bills on its own account is the default tenant's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    tenant: String,
    every_tenant: bool,
}

impl Scope {
    /// A caller of `tenant`: its sessions only.
    pub fn tenant(tenant: impl Into<String>) -> Scope {
        Scope {
            tenant: tenant.into(),
            every_tenant: false,
        }
    }

    /// The runtime itself: every session.
    pub fn runtime() -> Scope {
        Scope {
            tenant: DEFAULT_TENANT.into(),
            every_tenant: true,
        }
    }

    /// The tenant it acts for: what it lists, and bills on its own account.
    pub fn name(&self) -> &str {
        &self.tenant
    }

    /// Whether a session of `owner` is within reach.
    pub fn reaches(&self, owner: &str) -> bool {
        self.every_tenant || self.tenant == owner
    }
}

/// Longest id (session, workflow run, confirmation) a caller may name: a
/// longer one is unknown (404) without a read, and never stored.
pub const MAX_ID_BYTES: usize = 128;

/// An id as an error message may quote it: long ones cut to 32 characters,
/// so a refusal never echoes a caller's megabyte back.
pub fn quoted_id(id: &str) -> String {
    if id.chars().count() <= 32 {
        id.to_string()
    } else {
        format!("{}...", id.chars().take(32).collect::<String>())
    }
}

/// Longest `user_id` a caller may assert.
pub const MAX_USER_ID_BYTES: usize = 128;

/// The end user a call is for, as the tenant's backend asserts it (the key
/// speaks for its users, as in the seeds). Bounded, since it keys per-user
/// limits, caches and documents: 1 to 128 bytes of ASCII letters, digits
/// and `-_.@:+` (room for emails and prefixed ids such as `slack:U123`).
/// Anything else is refused where it enters (422), never truncated.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct UserId(String);

/// Why a `user_id` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("user_id must be 1 to 128 bytes of ASCII letters, digits and - _ . @ : +")]
pub struct BadUserId;

impl UserId {
    pub fn parse(raw: &str) -> Result<UserId, BadUserId> {
        let ok = !raw.is_empty()
            && raw.len() <= MAX_USER_ID_BYTES
            && raw
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.@:+".contains(&b));
        if ok {
            Ok(UserId(raw.to_string()))
        } else {
            Err(BadUserId)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl<'de> Deserialize<'de> for UserId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        UserId::parse(&raw).map_err(serde::de::Error::custom)
    }
}

impl utoipa::PartialSchema for UserId {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::schema::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .min_length(Some(1))
            .max_length(Some(MAX_USER_ID_BYTES))
            .pattern(Some(r"^[A-Za-z0-9_.@:+-]+$"))
            .description(Some(
                "The end user the call is for, as the tenant's backend asserts it",
            ))
            .into()
    }
}

impl utoipa::ToSchema for UserId {}

/// The header an HTTP tool's request carries when a workflow run makes the
/// call: the run's id. A run that request starts through cadre's API is
/// that run's child, one deeper (`[workflows] max_depth`).
pub const PARENT_RUN_HEADER: &str = "x-cadre-parent-run";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_ids_are_bounded_and_of_a_plain_charset() {
        for ok in [
            "u1",
            "alice@example.com",
            "slack:U123",
            "a+b-c_d.e",
            &"x".repeat(128),
        ] {
            assert!(UserId::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", " ", "a b", "ü", "a/b", "a\u{1}b", &"x".repeat(129)] {
            assert_eq!(UserId::parse(bad), Err(BadUserId), "{bad:?}");
        }
        let parsed: Result<UserId, _> = serde_json::from_value(serde_json::json!("x".repeat(200)));
        assert!(parsed.is_err());
    }

    #[test]
    fn a_tenants_scope_reaches_its_sessions_only_and_the_runtimes_all() {
        let acme = Principal {
            tenant: "acme".into(),
            admin: true,
            plan: Plan::Premium,
            metrics_only: false,
            key_id: Some("k".into()),
        }
        .scope();
        assert!(acme.reaches("acme"));
        assert!(
            !acme.reaches("globex"),
            "an admin key too reaches only its own"
        );
        assert_eq!(acme.name(), "acme");
        let runtime = Scope::runtime();
        assert!(runtime.reaches("acme") && runtime.reaches("globex"));
        assert_eq!(runtime.name(), DEFAULT_TENANT);
    }
}
