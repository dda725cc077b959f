//! Per-tenant configuration: what a company changes about its agents.
//!
//! admin ──GET/POST/PATCH /v1/tenants/{id}/config──▶ TenantConfig (redb docs, durable)
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
//! `monthly_token_budget` caps the model tokens (prompt + completion) of
//! the tenant's calendar month, UTC: once used up, turns are refused with
//! 429 `BUDGET_EXCEEDED` until the month ends (see `conversation::budget`).
//! PATCH is a JSON merge patch (RFC 7396) checked like a full config.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error_code::{ErrorCode, PublicError};
use crate::store::{Store, StoreError};

const NAMESPACE: &str = "tenant_config";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TenantConfig {
    pub auto_respond_enabled: bool,
    pub respond_with_operator: bool,
    pub suggestions_enabled: bool,
    pub preferred_model: Option<String>,
    pub custom_system_prompt: Option<String>,
    pub max_response_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub response_delay_ms: u64,
    pub tool_config: ToolConfig,
    /// Tokens per calendar month (UTC); `None`: unlimited.
    pub monthly_token_budget: Option<u64>,
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
            monthly_token_budget: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolConfig {
    pub fetch_page_enabled: bool,
    pub allowed_paths: Option<Vec<String>>,
    pub max_iterations: Option<u32>,
    pub cache_enabled: bool,
    pub cache_ttl_seconds: Option<u64>,
}

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
        if self.response_delay_ms > 60_000 {
            return bad("response_delay_ms must be at most 60000");
        }
        if let Some(n) = self.tool_config.max_iterations
            && !(1..=10).contains(&n)
        {
            return bad("tool_config.max_iterations must be between 1 and 10");
        }
        if let Some(p) = &self.custom_system_prompt
            && p.len() > 20_000
        {
            return bad("custom_system_prompt is longer than 20000 bytes");
        }
        if let Some(paths) = &self.tool_config.allowed_paths
            && paths.iter().any(|p| !p.starts_with('/'))
        {
            return bad("tool_config.allowed_paths must be absolute paths starting with '/'");
        }
        Ok(())
    }

    /// A config from JSON, checked.
    pub fn from_json(value: Value) -> Result<TenantConfig, TenantConfigError> {
        let config: TenantConfig =
            serde_json::from_value(value).map_err(|e| TenantConfigError::Invalid {
                message: e.to_string(),
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
