//! Per-tenant configuration: what a company changes about its agents.
//!
//! admin ──GET/POST/PATCH /v1/tenants/{id}/config──▶ TenantConfig (store table `tenant_configs`, durable)
//! turn  ──▶ TenantConfig ──▶ conversation's TurnSettings::apply_tenant ──▶ the settings of that turn
//!
//! Overrides: `custom_system_prompt` replaces layer 1; `preferred_model`,
//! `temperature`, `max_response_tokens` go into the model request;
//! `tool_config.max_iterations` bounds tool rounds; `fetch_page_enabled =
//! false` withdraws `fetch_page`; `allowed_paths` replaces the site's
//! paths; `cache_enabled = false` or `cache_ttl_seconds` set the result
//! cache for the tenant's calls. `auto_respond_enabled`,
//! `respond_with_operator` and `response_delay_ms` drive auto-response on
//! the visitor WebSocket; `suggestions_enabled` gates operator suggestions.
//! `plan` caps the plan of every caller of the tenant (the effective plan
//! is the lowest of tenant, key and request); `tool_quotas` set per-tool
//! ceilings for the whole tenant, enforced by the executor beside each
//! tool's per-user limits, so rotating `user_id` cannot exceed them.
//! `monthly_token_budget` caps the model tokens (prompt + completion) of
//! the tenant's calendar month, UTC: once used up, turns are refused with
//! 429 `BUDGET_EXCEEDED` until the month ends (see `conversation::budget`).
//! `retain_days` sets how long the tenant's idle sessions are kept, instead
//! of `[sessions] retain_days` (the retention sweep of
//! `conversation::sessions`).
//! PATCH is a JSON merge patch (RFC 7396) checked like a full config.
//!
//! The types derive their OpenAPI schema (`POST /v1/tenants/{id}/config`'s
//! body): its bounds are written next to the fields and mirror
//! `TenantConfig::check`, so the API's document states what it refuses.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error_code::{ErrorCode, PublicError};
use crate::identity::{Plan, Principal};
use crate::store::{Store, StoreError};
use crate::tools::RateLimit;

/// The store namespace of tenant configs: the `tenant_configs` table
/// ([`crate::store::tables::TENANT_CONFIGS`]).
pub(crate) const NAMESPACE: &str = "tenant_config";
/// Tools a tenant config may set quotas for.
const MAX_TOOL_QUOTAS: usize = 256;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TenantConfig {
    /// Visitor messages get a model turn.
    pub auto_respond_enabled: bool,
    /// The model answers even while an operator is assigned.
    pub respond_with_operator: bool,
    /// Operators may ask for reply suggestions.
    pub suggestions_enabled: bool,
    /// The model of the tenant's turns, instead of the agent's.
    pub preferred_model: Option<String>,
    /// Replaces the agent's system prompt.
    #[schema(max_length = 20000)]
    pub custom_system_prompt: Option<String>,
    #[schema(format = "uint32", minimum = 1, maximum = 4294967295_u32)]
    pub max_response_tokens: Option<u32>,
    #[schema(minimum = 0, maximum = 2)]
    pub temperature: Option<f32>,
    /// Wait before an automatic answer.
    #[schema(minimum = 0, maximum = 60000)]
    pub response_delay_ms: u64,
    pub tool_config: ToolConfig,
    /// The highest plan the tenant's callers may use (default `premium`:
    /// unrestricted until the operator sets one). A key or a request can
    /// only narrow it.
    pub plan: Plan,
    /// Per tool, calls per minute / hour / day for the whole tenant,
    /// whatever `user_id` the calls carry (the per-user limits of the tool
    /// still hold within it). A window of 0 refuses the tool outright.
    #[schema(schema_with = tool_quotas_schema)]
    pub tool_quotas: BTreeMap<String, RateLimit>,
    /// Bytes of stored messages the tenant may keep, in MiB, instead of
    /// `[tenants] max_storage_mb`; 0: unlimited.
    #[schema(format = "uint64", minimum = 0, maximum = 18446744073709551615_u64)]
    pub max_storage_mb: Option<u64>,
    /// Tokens per calendar month (UTC); `None`: unlimited.
    #[schema(format = "uint64", minimum = 0, maximum = 18446744073709551615_u64)]
    pub monthly_token_budget: Option<u64>,
    /// Checks of every turn of the tenant, before its agents' own (the
    /// same objects as an agent file's `[[guardrails]]`; docs/guardrails.md).
    #[schema(max_items = 64)]
    pub guardrails: Vec<crate::guardrails::GuardrailConfig>,
    /// The secret the tenant's webhooks are signed with (`whsec_` and the
    /// base64 of 24 to 128 bytes), instead of `[webhooks] secret`
    /// (docs/webhooks.md).
    #[schema(
        pattern = "^whsec_(?:[A-Za-z0-9+/]{4}){8,42}(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
    )]
    pub webhook_secret: Option<String>,
    /// Days a session of the tenant is kept after its last message (else
    /// its creation) before the retention sweep deletes it, instead of
    /// `[sessions] retain_days`; 0 keeps them forever; `None`: the
    /// server's. Fractions of a day are allowed.
    #[schema(minimum = 0, maximum = 36500)]
    pub retain_days: Option<f64>,
}

/// `tool_quotas` as the document states it: at most 256 tool names of 1 to
/// 128 bytes, each with its windows.
pub fn tool_quotas_schema() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property_names(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(128)),
        ))
        .max_properties(Some(MAX_TOOL_QUOTAS))
        .additional_properties(Some(<RateLimit as utoipa::PartialSchema>::schema()))
        .build()
}

impl Default for TenantConfig {
    fn default() -> Self {
        TenantConfig {
            auto_respond_enabled: true,
            respond_with_operator: false,
            suggestions_enabled: true,
            preferred_model: None,
            custom_system_prompt: None,
            max_response_tokens: None,
            temperature: None,
            response_delay_ms: 0,
            tool_config: ToolConfig::default(),
            plan: Plan::Premium,
            tool_quotas: BTreeMap::new(),
            max_storage_mb: None,
            monthly_token_budget: None,
            guardrails: Vec::new(),
            webhook_secret: None,
            retain_days: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ToolConfig {
    /// `fetch_page` stays available.
    pub fetch_page_enabled: bool,
    /// The site paths `fetch_page` may read, each starting with `/`.
    #[schema(inline, value_type = Option<Vec<AbsolutePath>>)]
    pub allowed_paths: Option<Vec<String>>,
    /// Tool rounds per turn.
    #[schema(minimum = 1, maximum = 10)]
    pub max_iterations: Option<u32>,
    /// Tool results are cached.
    pub cache_enabled: bool,
    #[schema(format = "uint64", minimum = 0, maximum = 18446744073709551615_u64)]
    pub cache_ttl_seconds: Option<u64>,
}

/// A path on the site, starting with `/`.
#[derive(utoipa::ToSchema)]
#[schema(value_type = String, pattern = "^/")]
#[allow(dead_code)]
pub struct AbsolutePath(String);

impl Default for ToolConfig {
    fn default() -> Self {
        ToolConfig {
            fetch_page_enabled: true,
            allowed_paths: None,
            max_iterations: None,
            cache_enabled: true,
            cache_ttl_seconds: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TenantConfigError {
    #[error("invalid tenant config: {message}")]
    Invalid { message: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl PublicError for TenantConfigError {
    fn code(&self) -> ErrorCode {
        match self {
            TenantConfigError::Invalid { .. } => ErrorCode::ValidationError,
            TenantConfigError::Store(s) => s.code(),
        }
    }

    fn public_message(&self) -> String {
        match self {
            TenantConfigError::Invalid { message } => message.clone(),
            TenantConfigError::Store(s) => s.public_message(),
        }
    }
}

impl TenantConfig {
    fn check(&self) -> Result<(), TenantConfigError> {
        let bad = |m: &str| {
            Err(TenantConfigError::Invalid {
                message: m.to_string(),
            })
        };
        if let Some(t) = self.temperature
            && !(0.0..=2.0).contains(&t)
        {
            return bad("temperature must be between 0 and 2");
        }
        if self.max_response_tokens == Some(0) {
            return bad("max_response_tokens must be at least 1");
        }
        if let Err(e) = crate::guardrails::Guardrails::compile(&self.guardrails) {
            return bad(&format!("guardrails: {e}"));
        }
        if let Some(secret) = &self.webhook_secret
            && let Err(e) = crate::webhooks::Secret::parse(secret)
        {
            return bad(&format!("webhook_secret: {e}"));
        }
        if let Some(days) = self.retain_days
            && !(0.0..=36_500.0).contains(&days)
        {
            return bad("retain_days must be between 0 (keep forever) and 36500");
        }
        if self.response_delay_ms > 60_000 {
            return bad("response_delay_ms must be at most 60000");
        }
        if let Some(n) = self.tool_config.max_iterations
            && !(1..=10).contains(&n)
        {
            return bad("tool_config.max_iterations must be between 1 and 10");
        }
        // Characters, not bytes: a JSON Schema `maxLength` (the API's
        // document) can state the one and not the other.
        if let Some(p) = &self.custom_system_prompt
            && p.chars().count() > 20_000
        {
            return bad("custom_system_prompt is longer than 20000 characters");
        }
        if let Some(paths) = &self.tool_config.allowed_paths
            && paths.iter().any(|p| !p.starts_with('/'))
        {
            return bad("tool_config.allowed_paths must be absolute paths starting with '/'");
        }
        if self.tool_quotas.len() > MAX_TOOL_QUOTAS {
            return bad("tool_quotas may name at most 256 tools");
        }
        if self
            .tool_quotas
            .keys()
            .any(|t| t.is_empty() || t.chars().count() > 128)
        {
            return bad("tool_quotas keys must be tool names of 1 to 128 characters");
        }
        Ok(())
    }

    /// A config from JSON, checked.
    pub fn from_json(value: Value) -> Result<TenantConfig, TenantConfigError> {
        // serde's own words name Rust types (`expected u32`): keep what
        // comes before them.
        let config: TenantConfig =
            serde_json::from_value(value).map_err(|e| TenantConfigError::Invalid {
                message: e
                    .to_string()
                    .split(", expected")
                    .next()
                    .unwrap_or_default()
                    .to_string(),
            })?;
        config.check()?;
        Ok(config)
    }

    /// This config with a JSON merge patch applied, checked.
    pub fn patched(&self, patch: &Value) -> Result<TenantConfig, TenantConfigError> {
        let mut doc = serde_json::to_value(self).expect("tenant configs serialize");
        merge_patch(&mut doc, patch);
        Self::from_json(doc)
    }

    /// The stored config of a tenant, or the defaults.
    pub async fn load(store: &Store, tenant: &str) -> Result<TenantConfig, TenantConfigError> {
        match store.get_doc(NAMESPACE, tenant).await? {
            Some(v) => Self::from_json(v),
            None => Ok(TenantConfig::default()),
        }
    }

    pub async fn save(&self, store: &Store, tenant: &str) -> Result<(), TenantConfigError> {
        let value = serde_json::to_value(self).expect("tenant configs serialize");
        store.put_doc(NAMESPACE, tenant, value, true).await?;
        Ok(())
    }
}

/// A request that asks for more than its tenant and key allow.
#[derive(Debug, thiserror::Error)]
pub enum EntitlementError {
    #[error(
        "the {} plan was asked for; this key and tenant allow up to the {} plan",
        asked.as_str(),
        allowed.as_str()
    )]
    NotEntitled { asked: Plan, allowed: Plan },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl PublicError for EntitlementError {
    fn code(&self) -> ErrorCode {
        match self {
            EntitlementError::NotEntitled { .. } => ErrorCode::PlanNotEntitled,
            EntitlementError::Store(s) => s.code(),
        }
    }

    fn public_message(&self) -> String {
        match self {
            EntitlementError::Store(s) => s.public_message(),
            other => other.to_string(),
        }
    }
}

/// The plan a request runs with: the plan it names (free when it names
/// none), if both its tenant's plan and its key's plan allow it. A request
/// can only narrow what its key and tenant give, never widen it: asking
/// for more is refused, not quietly lowered, so a caller never gets less
/// than it believes it has.
/// The highest plan `caller` may use: the lower of its tenant's plan and
/// its key's (a tenant config that no longer reads allows only free).
pub async fn plan_ceiling(store: &Store, caller: &Principal) -> Result<Plan, EntitlementError> {
    match TenantConfig::load(store, &caller.tenant).await {
        Ok(tenant) => Ok(tenant.plan.min(caller.plan)),
        Err(TenantConfigError::Store(s)) => Err(EntitlementError::Store(s)),
        Err(TenantConfigError::Invalid { .. }) => Ok(Plan::Free),
    }
}

pub async fn entitled_plan(
    store: &Store,
    caller: &Principal,
    asked: Option<Plan>,
) -> Result<Plan, EntitlementError> {
    let asked = asked.unwrap_or(Plan::Free);
    if asked == Plan::Free {
        return Ok(asked);
    }
    let tenant = TenantConfig::load(store, &caller.tenant)
        .await
        .map_err(|e| match e {
            TenantConfigError::Store(s) => EntitlementError::Store(s),
            // A stored config is checked when written; one that no longer
            // reads allows nothing above free.
            TenantConfigError::Invalid { .. } => EntitlementError::NotEntitled {
                asked,
                allowed: Plan::Free,
            },
        })?;
    let allowed = tenant.plan.min(caller.plan);
    if asked > allowed {
        return Err(EntitlementError::NotEntitled { asked, allowed });
    }
    Ok(asked)
}

/// RFC 7396: objects merge key by key, `null` removes, anything else replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Default::default());
            }
            let t = target.as_object_mut().expect("made an object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn patches_merge_and_bad_values_are_refused() {
        let c = TenantConfig::default()
            .patched(&json!({"temperature": 0.5, "tool_config": {"max_iterations": 2}}))
            .unwrap();
        assert_eq!(c.temperature, Some(0.5));
        assert_eq!(c.tool_config.max_iterations, Some(2));
        assert!(c.tool_config.fetch_page_enabled);
        let c = c.patched(&json!({"temperature": null})).unwrap();
        assert_eq!(c.temperature, None);
        assert!(
            TenantConfig::default()
                .patched(&json!({"temperature": 9}))
                .is_err()
        );
        assert!(
            TenantConfig::default()
                .patched(&json!({"colour": "red"}))
                .is_err()
        );
    }
}
