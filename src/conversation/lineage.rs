//! Lineage: how sessions of agents asking agents are linked, read by
//! both sides of a delegation (issue #31).
//!
//! child session ──metadata.delegated_by──▶ its parent (session, turn, call, agent, depth)
//! parent session ──doc `delegations`/<parent id>──▶ {"children": {agent: child id}}
//!
//! [`super::delegation`] writes the links when it opens a child;
//! [`super::sessions`] reads them (an approval walks up to the parents, a
//! summary sums the children's tokens). The link lives here, below both,
//! so neither imports the other.

use serde_json::Value;

use crate::store::{Session, Store, StoreError, TokenUsage};

/// The document namespace of the parent → child pointers.
pub const DELEGATIONS: &str = "delegations";

/// The reserved metadata key of a child session's link to its parent.
pub const DELEGATED_BY: &str = "delegated_by";

/// Depth of a top-level session's delegations allowed by default.
pub const DEFAULT_MAX_DELEGATION_DEPTH: u32 = 3;

/// Most child sessions a summary sums ([`children_usage`]).
pub const MAX_SUMMED_CHILDREN: usize = 256;

/// What the sessions `id` asked (its children, theirs, ...) spent, from
/// their stored usage; a child deleted meanwhile counts for nothing.
pub async fn children_usage(store: &Store, id: &str) -> Result<TokenUsage, StoreError> {
    let mut total = TokenUsage::default();
    let mut seen = std::collections::HashSet::from([id.to_string()]);
    let mut next = vec![id.to_string()];
    while let Some(parent) = next.pop() {
        let Some(doc) = store.get_doc(DELEGATIONS, &parent).await? else {
            continue;
        };
        let Some(children) = doc["children"].as_object() else {
            continue;
        };
        for child in children.values().filter_map(Value::as_str) {
            if seen.len() > MAX_SUMMED_CHILDREN || !seen.insert(child.to_string()) {
                continue;
            }
            total.add(&store.session_usage(child).await?);
            next.push(child.to_string());
        }
    }
    Ok(total)
}

/// The depth of `session` in a delegation chain (0: not a child).
pub fn depth_of(session: &Session) -> u32 {
    session.metadata[DELEGATED_BY]["depth"]
        .as_u64()
        .map_or(0, |d| d.min(u64::from(u32::MAX)) as u32)
}

/// The parent session of `session`, if it is a child.
pub fn parent_of(session: &Session) -> Option<&str> {
    session.metadata[DELEGATED_BY]["session_id"].as_str()
}

/// The `source_id`s a forked session's conversation inherits: those of
/// its ancestors' successful calls made up to each fork point.
pub async fn inherited_sources(
    store: &Store,
    session: &Session,
) -> Result<Vec<String>, StoreError> {
    let mut out = Vec::new();
    let mut link = session.forked_from.clone();
    // A chain of forks is short; the bound keeps a cycle (a hand-edited
    // row) from looping.
    for _ in 0..64 {
        let Some(from) = link.take() else { break };
        let calls = store.calls_for_conversation(&from.session_id).await?;
        out.extend(
            calls
                .into_iter()
                .filter(|c| c.is_success)
                .filter(|c| {
                    c.turn_id
                        .as_deref()
                        .is_some_and(|t| t <= from.turn_id.as_str())
                })
                .filter_map(|c| c.source_id),
        );
        link = store
            .get_session(&from.session_id)
            .await?
            .and_then(|s| s.forked_from);
    }
    Ok(out)
}
