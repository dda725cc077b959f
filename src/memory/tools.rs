//! `remember` and `recall` as the memory layer answers them: the
//! namespace of a call, and the items.
//!
//! executor ──tools::memory (Remember / Recall)──▶ [`MemoryTools`] for [`super::Inner`] ──▶ put / search
//!
//! The namespace is the agent file's template (`memory = true`:
//! `["users", "{user_id}"]`), handed to every call of the agent in
//! `ExecutionContext.variables.memory`, with `{tenant}`, `{user_id}` and
//! `{agent}` replaced by the calling session's. The tenant is always the
//! session's, whatever the template says: a template names a namespace
//! *within* the tenant's memory, never another tenant's. A call whose
//! session has no user, under a template that names `{user_id}`, is
//! refused (the model reads why): there is nobody to remember for.
//!
//! Decided: `remember` stores `{"text": ...}` under the `key` given, else
//! under `m-` and the first 16 hex digits of the SHA-256 of the call's
//! idempotency key (`<session>:<turn>:<tool_call_id>`), so a resumed
//! turn or a retried batch writes the same item again, not a second one.
//! `recall` answers `{"items": [{key, text, score}]}`, best first.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{Inner, MemoryError, SearchQuery};
use crate::tools::memory::MemoryTools;
use crate::tools::{ExecutionContext, ToolError};

/// The namespace a call of an agent with memory uses.
pub fn namespace_of(ctx: &ExecutionContext) -> Result<(String, Vec<String>), ToolError> {
    let tenant = ctx
        .tenant
        .clone()
        .ok_or_else(|| ToolError::failed("memory needs a tenant; this call has none"))?;
    let template: Vec<String> = ctx.variables["memory"]["namespace"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_else(|| vec!["users".into(), "{user_id}".into()]);
    let agent = ctx.variables["memory"]["agent"]
        .as_str()
        .unwrap_or_default();
    let namespace =
        resolve(&template, &tenant, ctx.user_id.as_deref(), agent).map_err(ToolError::failed)?;
    Ok((tenant, namespace))
}

/// `template` with `{tenant}`, `{user_id}` and `{agent}` replaced; why
/// not when it names `{user_id}` and there is no user.
pub fn resolve(
    template: &[String],
    tenant: &str,
    user_id: Option<&str>,
    agent: &str,
) -> Result<Vec<String>, &'static str> {
    let mut out = Vec::with_capacity(template.len());
    for segment in template {
        let mut s = segment
            .replace("{tenant}", tenant)
            .replace("{agent}", agent);
        if s.contains("{user_id}") {
            let Some(user) = user_id.filter(|u| !u.is_empty()) else {
                return Err(
                    "memory is per user and this session has no user_id: nothing is remembered or recalled",
                );
            };
            // A user id is within a segment: a '.' in it would split it
            // in two, so it is written `%2E` (and `%` as `%25`: one id, one
            // segment, never another user's).
            let user = user.replace('%', "%25").replace('.', "%2E");
            s = s.replace("{user_id}", &user);
        }
        out.push(s);
    }
    Ok(out)
}

fn tool_error(e: MemoryError) -> ToolError {
    match e {
        MemoryError::Invalid { message } => ToolError::invalid(message),
        MemoryError::Quota { .. } | MemoryError::NotFound { .. } => {
            ToolError::failed(e.to_string())
        }
        MemoryError::Store(s) => ToolError::Transient {
            message: s.to_string(),
        },
    }
}

#[async_trait::async_trait]
impl MemoryTools for Inner {
    async fn remember(
        &self,
        text: String,
        key: Option<String>,
        ctx: &ExecutionContext,
    ) -> Result<Value, ToolError> {
        let (tenant, namespace) = namespace_of(ctx)?;
        let key = match key.filter(|k| !k.trim().is_empty()) {
            Some(k) => k,
            None => {
                let seed = ctx
                    .idempotency_key
                    .clone()
                    .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
                let digest = Sha256::digest(seed.as_bytes());
                let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
                format!("m-{hex}")
            }
        };
        let item = self
            .put(&tenant, namespace, key, json!({ "text": text }), None)
            .await
            .map_err(tool_error)?;
        Ok(json!({ "remembered": true, "key": item.key }))
    }

    async fn recall(
        &self,
        query: String,
        limit: usize,
        ctx: &ExecutionContext,
    ) -> Result<Value, ToolError> {
        let (tenant, namespace) = namespace_of(ctx)?;
        let found = self
            .search(
                &tenant,
                SearchQuery {
                    namespace_prefix: namespace,
                    query: Some(query),
                    filter: None,
                    limit,
                    offset: 0,
                },
            )
            .await
            .map_err(tool_error)?;
        let items: Vec<Value> = found
            .into_iter()
            .map(|f| {
                let text = match &f.item.value["text"] {
                    Value::String(s) => s.clone(),
                    _ => super::text_of(&f.item.value).trim().to_string(),
                };
                json!({ "key": f.item.key, "text": text, "score": f.score })
            })
            .collect();
        Ok(json!({ "items": items }))
    }
}
