//! The result cache: executor step after validation, before admission to
//! the concurrency pool. A hit skips the pool and the handler.
//!
//! Key: (tool, tenant, user, canonical parameters, the context's
//! variables), written as one JSON array so no field's text can run into
//! the next (a `user_id` is caller-asserted text). serde_json objects
//! serialize with sorted keys, so equal parameters give equal keys. The
//! tenant keeps one tenant's answers from another (they may come from
//! per-tenant data, and carry the first caller's `executed_at`); the user
//! keeps per-user data (a user's own records) per user; the variables
//! carry per-agent settings (e.g. `fetch_page`'s site), so two agents never
//! share an answer meant for the other.
//!
//! TTL, from the tool's own declaration only (never from its category,
//! which is a label for humans and listings): the definition's
//! `cache.ttl_seconds` when set (0 = never cache); else
//! [`DEFAULT_TTL_S`] for a tool that declares `side_effects = none`; else
//! never (a tool that acts runs on every call unless its definition sets
//! a TTL: an answer from the cache would report an action that never
//! ran). An embedder's tool that declares nothing is `at_most_once`, so it
//! is not cached. An `external` entry (command or URL) or an MCP tool is
//! cached only when its definition sets `cache.ttl_seconds`, since cadre
//! cannot tell a `create_ticket` POST from a lookup whatever it declares.
//! Tools that need confirmation are never cached. Only successes are
//! cached.
//!
//! Expiry is decided on tokio's clock (so tests can pause and advance
//! time); moka's own TTL only bounds memory.

use std::time::Duration;

use moka::Expiry;
use serde_json::Value;
use tokio::time::Instant;

use crate::tools::{SideEffects, ToolDefinition, ToolExecutionResult};

/// Seconds a read-only tool's answers are kept when its definition does
/// not say.
pub const DEFAULT_TTL_S: u64 = 30;

/// Entries kept at most.
const CAPACITY: u64 = 100_000;

#[derive(Clone)]
struct Entry {
    result: ToolExecutionResult,
    expires_at: Instant,
    ttl: Duration,
}

struct ByEntry;

impl Expiry<String, Entry> for ByEntry {
    fn expire_after_create(
        &self,
        _key: &String,
        value: &Entry,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(value.ttl)
    }
}

#[derive(Clone)]
pub struct ResultCache {
    entries: moka::future::Cache<String, Entry>,
}

impl Default for ResultCache {
    fn default() -> Self {
        Self::new()
    }
}

impl ResultCache {
    pub fn new() -> Self {
        ResultCache {
            entries: moka::future::Cache::builder()
                .max_capacity(CAPACITY)
                .expire_after(ByEntry)
                .build(),
        }
    }

    /// How long results of this tool are kept; `None`: not cached.
    pub fn ttl(def: &ToolDefinition) -> Option<Duration> {
        if def.requires_confirmation() {
            // Each approved call must run: an answer from the cache would
            // report an action that never happened.
            return None;
        }
        let seconds = match def.cache {
            Some(c) => c.ttl_seconds,
            None if def.is_upstream() => 0,
            // A tool that acts (`idempotent`, `at_most_once`: an embedder's
            // handler unless it says otherwise) must run on every call: an
            // answer from the cache would report an action that never ran.
            None if def.side_effects != SideEffects::None => 0,
            None => DEFAULT_TTL_S,
        };
        (seconds > 0).then(|| Duration::from_secs(seconds))
    }

    pub fn key(
        tool: &str,
        tenant: &str,
        user: Option<&str>,
        params: &Value,
        variables: &Value,
    ) -> String {
        serde_json::to_string(&(tool, tenant, user, params, variables))
            .expect("JSON values serialize")
    }

    pub async fn get(&self, key: &str) -> Option<ToolExecutionResult> {
        let entry = self.entries.get(key).await?;
        if Instant::now() >= entry.expires_at {
            self.entries.invalidate(key).await;
            return None;
        }
        let mut result = entry.result;
        result.metadata.cached = true;
        // A cached answer ran nothing now.
        result.metadata.started_at = None;
        Some(result)
    }

    pub async fn put(&self, key: String, result: &ToolExecutionResult, ttl: Duration) {
        if !result.is_success {
            return;
        }
        let entry = Entry {
            result: result.clone(),
            expires_at: Instant::now() + ttl,
            ttl,
        };
        self.entries.insert(key, entry).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::definition::Entry as ToolEntry;
    use serde_json::json;

    /// A read-only tool of `category`.
    fn def(category: &str) -> ToolDefinition {
        ToolDefinition::new("t", "d", json!({"type": "object"}))
            .with_category(category)
            .with_side_effects(SideEffects::None)
    }

    /// Categories an embedder might use, including ones the sample domain
    /// once had defaults for: none of them changes the TTL.
    const CATEGORIES: [&str; 5] = ["custom", "market", "news", "calculate", "http"];

    #[test]
    fn a_tool_that_acts_is_cached_only_when_its_definition_asks() {
        for side in [SideEffects::AtMostOnce, SideEffects::Idempotent] {
            for category in CATEGORIES {
                let d = def(category).with_side_effects(side);
                assert_eq!(ResultCache::ttl(&d), None, "{category} {side:?}");
            }
            let d = def("custom").with_side_effects(side).with_cache_ttl(9);
            assert_eq!(ResultCache::ttl(&d), Some(Duration::from_secs(9)));
        }
        // An embedder's tool says nothing: at_most_once, never cached.
        let plain = ToolDefinition::new("t", "d", json!({"type": "object"}));
        assert_eq!(ResultCache::ttl(&plain), None);
    }

    #[test]
    fn ttl_follows_the_definition_never_the_category() {
        for category in CATEGORIES {
            assert_eq!(
                ResultCache::ttl(&def(category)),
                Some(Duration::from_secs(DEFAULT_TTL_S)),
                "{category}"
            );
            assert_eq!(
                ResultCache::ttl(&def(category).with_cache_ttl(7)),
                Some(Duration::from_secs(7))
            );
            assert_eq!(ResultCache::ttl(&def(category).with_cache_ttl(0)), None);
        }
        let confirmed = def("custom")
            .with_cache_ttl(60)
            .with_post_processor("require_confirmation");
        assert_eq!(ResultCache::ttl(&confirmed), None);
    }

    #[test]
    fn external_and_mcp_entries_are_cached_only_when_their_definition_asks() {
        let external = ToolEntry::External {
            command: None,
            url: Some("http://tickets.example/".into()),
            max_output_bytes: None,
            allowlist: Vec::new(),
            redirects: Default::default(),
            env: Vec::new(),
            env_set: Default::default(),
            network: false,
            paths: Vec::new(),
            sandbox_limits: Default::default(),
        };
        let mcp = ToolEntry::Mcp {
            server: "s".into(),
            tool: "t".into(),
        };
        for entry in [external, mcp] {
            for category in CATEGORIES {
                let d = def(category).with_entry(entry.clone());
                assert_eq!(ResultCache::ttl(&d), None, "{category} {entry:?}");
            }
            let d = def("custom").with_entry(entry).with_cache_ttl(9);
            assert_eq!(ResultCache::ttl(&d), Some(Duration::from_secs(9)));
        }
    }

    #[test]
    fn keys_ignore_parameter_order_and_separate_tenants_users_and_agents() {
        let none = Value::Null;
        let params = json!({"a": 1, "b": 2});
        let a = ResultCache::key("t", "acme", Some("u"), &params, &none);
        let b = ResultCache::key(
            "t",
            "acme",
            Some("u"),
            &serde_json::from_str(r#"{"b":2,"a":1}"#).unwrap(),
            &none,
        );
        assert_eq!(a, b);
        assert_ne!(
            a,
            ResultCache::key("t", "globex", Some("u"), &params, &none)
        );
        assert_ne!(a, ResultCache::key("t", "acme", Some("v"), &params, &none));
        assert_ne!(a, ResultCache::key("t", "acme", None, &params, &none));
        let site = json!({"site": {"base_url": "http://a"}});
        assert_ne!(a, ResultCache::key("t", "acme", Some("u"), &params, &site));
        // A user id cannot smuggle a separator into the next field.
        assert_ne!(
            ResultCache::key("t", "a", Some("u\u{1}x"), &json!(1), &none),
            ResultCache::key("t", "a", Some("u"), &json!("x\u{1}1"), &none)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn hits_until_the_ttl_passes_and_never_for_failures() {
        let cache = ResultCache::new();
        let ok = ToolExecutionResult::success("t", json!(1), Duration::ZERO, 1);
        cache.put("k".into(), &ok, Duration::from_secs(5)).await;
        let hit = cache.get("k").await.unwrap();
        assert!(hit.metadata.cached);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(cache.get("k").await.is_none());
        let failed =
            ToolExecutionResult::failure("t", crate::tools::ErrorType::ExecutionError, "x");
        cache.put("f".into(), &failed, Duration::from_secs(5)).await;
        assert!(cache.get("f").await.is_none());
    }
}
