//! Per-user trading state (paper orders, alerts, watchlists) as documents in
//! the store, and the per-user lock that serialises their read-modify-write.
//!
//! handler ──lock_user──▶ load docs ──▶ decide ──▶ put_doc (durable) ──▶ unlock
//!
//! Layout (namespace → key → value):
//! - `trading.orders` → `<user>/<order_id>` → one order (many per user, so
//!   a new order is one small write, never a rewrite of the history);
//! - `trading.alerts` → `<user>` → `{"alerts": [..]}` (capped per user);
//! - `trading.watchlist` → `<user>` → `{"symbols": [..]}` (capped per user).
//!
//! `<user>` is the caller's user id with `%` and `/` percent-encoded, so a
//! user's prefix `<user>/` never matches another user's keys. Calls without a
//! user id share the account `anonymous`.
//!
//! Every write is durable (`put_doc(.., durable = true)`): the tool tells the
//! model "done" only once it is on disk, and these writes are rare.
//!
//! The locks live in one process-wide table keyed by store file and user, not
//! in the handlers: the registry may build the trading tools more than once
//! (reloads), and two handler sets over one store must still exclude each
//! other. Idle entries are pruned as the table grows.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::OwnedMutexGuard;

use cadre::store::{Store, StoreError};
use cadre::tools::{ExecutionContext, ToolError};

pub const ORDERS: &str = "trading.orders";
pub const ALERTS: &str = "trading.alerts";
pub const WATCHLIST: &str = "trading.watchlist";

const ANONYMOUS: &str = "anonymous";
/// Above this many entries, idle locks are dropped from the table.
const PRUNE_ABOVE: usize = 256;

type LockTable = Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>;

static LOCKS: LazyLock<LockTable> = LazyLock::new(Default::default);

/// Whose account a call works on: the user within the caller's tenant
/// (`tenant/user`), so two tenants naming the same user id never share an
/// account.
pub fn user_of(ctx: &ExecutionContext) -> String {
    let user = ctx
        .user_id
        .as_deref()
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .unwrap_or(ANONYMOUS);
    let tenant = ctx
        .tenant
        .as_deref()
        .unwrap_or(cadre::identity::DEFAULT_TENANT);
    format!("{tenant}/{user}")
}

/// The user id as a key segment: `%` and `/` percent-encoded.
pub fn user_key(user: &str) -> String {
    user.replace('%', "%25").replace('/', "%2F")
}

/// Holds the user's lock until dropped; every read-modify-write of a user's
/// trading state runs under it.
pub async fn lock_user(store: &Store, user: &str) -> OwnedMutexGuard<()> {
    let key = format!("{}\u{0}{user}", store.path().display());
    let lock = {
        // std Mutex: held for a map lookup only, never across an await.
        let mut table = LOCKS.lock().unwrap_or_else(|e| e.into_inner());
        if table.len() > PRUNE_ABOVE {
            table.retain(|_, l| Arc::strong_count(l) > 1);
        }
        table.entry(key).or_default().clone()
    };
    lock.lock_owned().await
}

fn storage_error(what: &str, e: StoreError) -> ToolError {
    tracing::error!(error = %e, what, "trading state storage failed");
    ToolError::failed(format!("could not access your {what} (storage error)"))
}

fn decode<T: DeserializeOwned>(what: &str, key: &str, value: Value) -> Result<T, ToolError> {
    serde_json::from_value(value).map_err(|e| {
        tracing::error!(error = %e, what, key, "stored trading state does not decode");
        ToolError::failed(format!("your stored {what} could not be read ({key})"))
    })
}

/// One document, or `T::default()` when absent.
pub async fn load<T: DeserializeOwned + Default>(
    store: &Store,
    namespace: &str,
    key: &str,
    what: &str,
) -> Result<T, ToolError> {
    match store
        .get_doc(namespace, key)
        .await
        .map_err(|e| storage_error(what, e))?
    {
        Some(v) => decode(what, key, v),
        None => Ok(T::default()),
    }
}

/// One document, `None` when absent.
pub async fn load_one<T: DeserializeOwned>(
    store: &Store,
    namespace: &str,
    key: &str,
    what: &str,
) -> Result<Option<T>, ToolError> {
    store
        .get_doc(namespace, key)
        .await
        .map_err(|e| storage_error(what, e))?
        .map(|v| decode(what, key, v))
        .transpose()
}

/// Every document under `prefix`, in key order.
pub async fn load_all<T: DeserializeOwned>(
    store: &Store,
    namespace: &str,
    prefix: &str,
    what: &str,
) -> Result<Vec<T>, ToolError> {
    store
        .list_docs(namespace, prefix)
        .await
        .map_err(|e| storage_error(what, e))?
        .into_iter()
        .map(|(key, v)| decode(what, &key, v))
        .collect()
}

/// Writes a document durably.
pub async fn save<T: Serialize>(
    store: &Store,
    namespace: &str,
    key: &str,
    value: &T,
    what: &str,
) -> Result<(), ToolError> {
    let value = serde_json::to_value(value)
        .map_err(|e| ToolError::failed(format!("could not encode your {what}: {e}")))?;
    store
        .put_doc(namespace, key, value, true)
        .await
        .map_err(|e| storage_error(what, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cadre::tools::CallerType;

    #[test]
    fn user_keys_cannot_collide_through_slashes() {
        assert_eq!(user_key("a/b"), "a%2Fb");
        assert_eq!(user_key("a%2Fb"), "a%252Fb");
        assert_ne!(user_key("a/b"), user_key("a%2Fb"));
        let mut ctx = ExecutionContext::new(CallerType::Direct, "t");
        assert_eq!(user_of(&ctx), "default/anonymous");
        ctx.user_id = Some("  ".into());
        assert_eq!(user_of(&ctx), "default/anonymous");
        ctx.user_id = Some("u1".into());
        assert_eq!(user_of(&ctx), "default/u1");
        ctx.tenant = Some("acme".into());
        assert_eq!(user_of(&ctx), "acme/u1");
    }
}
