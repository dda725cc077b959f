//! Memory across sessions: a tenant's items, each a JSON object under a
//! namespace and a key, found by BM25 full-text search, forgotten after a
//! TTL (issue #35). LangGraph's Store, in shape.
//!
//! http (`/v1/memory/...`) ──▶ [`Memory`] (checks, quota) ──▶ store documents (redb, or PostgreSQL in cluster mode)
//!                                     └──▶ [`index::TenantIndex`] (in RAM, per tenant: BM25 postings, sizes, expiry)
//! agent turn ──remember / recall (executor)──▶ tools::memory ──MemorySlot──▶ [`Memory`] ([`tools`]: the namespace template)
//! sweep loop (every `[memory] sweep_s`) ──▶ expired items deleted
//! turn start (`memory = { inject = true }`) ──▶ [`inject`]: the best items for the message, as the prompt's notes
//! tenant erase (http) ──▶ [`Memory::erase_tenant`]: every item of the tenant, its index dropped
//!
//! # What is stored (documents, written once for both backends)
//! - `memory_items/<tenant>\x1f<a.b.c>\x1f<key>`: the item ([`StoredItem`]:
//!   namespace, key, value, created, updated, expires), listed under its
//!   tenant (so a tenant's items are read back page by page).
//! - `memory_ttl/<same key>`: `{tenant, expires_at}` for items with a TTL,
//!   what the sweep reads (items without a TTL cost it nothing).
//! - `memory_vectors/<same key>`: the item's vector, with semantic
//!   ranking on ([`embed`]), listed under its tenant.
//! - `memory_stamp/<tenant>`: `{stamp}`, changed by every write of the
//!   tenant's memory, in the same transaction (see "Cluster mode").
//!
//! # Search: why an index of our own, in RAM
//! `tantivy` is the well-kept choice for BM25, but it keeps its own
//! segment files beside cadre's store: on PostgreSQL (cluster mode) the
//! items would then not be "in cadre's store", every node would need its
//! own copy of the files kept in step, and the binary grows by a search
//! engine for a few fields of short text. So the items are ordinary
//! store documents (one write path, both backends, erased and backed up
//! with the rest) and the ranking is ~150 lines of BM25 over an inverted
//! index per tenant ([`index`]), built from the store the first time a
//! tenant's memory is used on a node (one pass over its documents) and
//! updated by every write through this node. It holds terms and sizes,
//! not values: the page of results is read from the store.
//!
//! # Cluster mode
//! Several nodes each hold an index of the tenants they served. Every
//! write moves the tenant's stamp document to a new value
//! ([`crate::store::DocReads::move_doc`] semantics inside the write's own
//! transaction), which hands back the stamp it replaced: when that is the
//! stamp this node's index last saw, no other node wrote in between and the
//! index is current; else the index is dropped and built again on next
//! use. Every read compares the stored stamp with the index's (one
//! document read) and rebuilds on a difference. So a node never serves
//! an index that misses another node's write for longer than that write's
//! commit. The embedded backend runs the same code (one node: the stamps
//! always agree).
//!
//! # Bounds and decisions
//! - A value is a JSON object of at most [`MAX_VALUE_BYTES`]; a namespace
//!   1 to [`MAX_DEPTH`] segments, each segment and each key 1 to
//!   [`MAX_NAME_CHARS`] characters (the issue says bytes; characters are
//!   what the document's `maxLength` counts, so the published schema and
//!   the check agree: at most 512 bytes), no control characters, and no
//!   `.` in a segment (the query string writes a namespace `users.u1`).
//! - Per tenant, `[memory] max_items` items and `max_mb` MiB (the stored
//!   documents' bytes); a put past either is 413 `STORAGE_QUOTA_EXCEEDED`.
//!   Replacing an item counts its new size only.
//! - TTL: `ttl_s` from 1 s to [`MAX_TTL_S`]; an expired item is absent to
//!   every read at once, and deleted by the next sweep. A put without
//!   `ttl_s` keeps no TTL (it replaces the item whole, TTL included).
//! - What is searched: every string in the value (keys of the object
//!   excluded), and numbers and booleans as written.
//! - `filter` keeps items whose value has each given top-level field
//!   equal to the given JSON value; it is applied while reading the
//!   ranked items, so a very selective filter reads many.
//! - `score` is the BM25 score (0 without a query, the items then newest
//!   first); with semantic ranking on, the fused score ([`embed`]).
//! - Semantic ranking through an OpenAI-compatible `/embeddings`
//!   endpoint is optional and off by default ([`embed`]: vectors beside
//!   the items, fused with BM25 by reciprocal rank).
//!
//! Owns: memory items, their index, the sweep. Does not: decide which
//! namespace a tool call uses (the agent file's template, [`tools`]), or
//! check who may call (the HTTP layer's key ring).

pub mod embed;
pub mod index;
pub mod inject;
pub mod tools;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio::sync::RwLock;

use crate::error_code::{ErrorCode, PublicError};
use crate::store::{NewDoc, Store, StoreError, WriteOp};
use index::{Entry, TenantIndex};

/// The store's document namespaces (the module doc says what each holds).
pub const ITEMS: &str = "memory_items";
pub const TTLS: &str = "memory_ttl";
pub const STAMPS: &str = "memory_stamp";

/// Largest value, as JSON.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;
/// Most segments of a namespace.
pub const MAX_DEPTH: usize = 8;
/// Longest namespace segment or key, in characters (what the document's
/// `maxLength` counts; at most 512 bytes of UTF-8).
pub const MAX_NAME_CHARS: usize = 128;
/// Longest TTL: ten years.
pub const MAX_TTL_S: u64 = 10 * 366 * 86_400;
/// Most items a search returns at once.
pub const MAX_LIMIT: usize = 100;
/// Separates tenant, namespace and key in a document key (refused in all three).
const SEP: char = '\u{1f}';
/// Documents read per page when an index is built.
const LOAD_PAGE: usize = 1_000;

/// `[memory]` in the server's config.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// Most items a tenant may keep.
    pub max_items: u64,
    /// MiB a tenant's items may take (the stored documents).
    pub max_mb: u64,
    /// Seconds between sweeps of expired items.
    pub sweep_s: u64,
    /// An OpenAI-compatible API (`https://api.openai.com/v1`): its
    /// `/embeddings` gives the vectors of semantic ranking ([`embed`]);
    /// unset (the default): BM25 alone, offline.
    pub embeddings_url: Option<String>,
    /// The embedding model asked for.
    pub embeddings_model: String,
    /// The environment variable holding the endpoint's key (sent as
    /// `Authorization: Bearer`); unset: no key is sent.
    pub embeddings_api_key_env: Option<String>,
    /// The least cosine between an item and the query for the vectors to
    /// rank it (-1 to 1).
    pub embeddings_min_similarity: f32,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig {
            max_items: 100_000,
            max_mb: 256,
            sweep_s: 60,
            embeddings_url: None,
            embeddings_model: "text-embedding-3-small".into(),
            embeddings_api_key_env: None,
            embeddings_min_similarity: 0.3,
        }
    }
}

impl MemoryConfig {
    /// Why the config is refused, if it is.
    pub fn check(&self) -> Result<(), String> {
        if self.max_items == 0 || self.max_mb == 0 || self.sweep_s == 0 {
            return Err("max_items, max_mb and sweep_s must be at least 1".into());
        }
        if let Some(url) = &self.embeddings_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err("embeddings_url must be an http:// or https:// URL".into());
        }
        if self.embeddings_model.trim().is_empty() {
            return Err("embeddings_model must name a model".into());
        }
        if !(-1.0..=1.0).contains(&self.embeddings_min_similarity) {
            return Err("embeddings_min_similarity must be between -1 and 1".into());
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("no memory item '{key}' in namespace '{namespace}'")]
    NotFound { namespace: String, key: String },
    #[error("{message}")]
    Invalid { message: String },
    #[error("the tenant's memory is full: {message}")]
    Quota { message: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl MemoryError {
    fn invalid(message: impl Into<String>) -> Self {
        MemoryError::Invalid {
            message: message.into(),
        }
    }
}

impl From<serde_json::Error> for MemoryError {
    fn from(e: serde_json::Error) -> Self {
        MemoryError::Store(e.into())
    }
}

impl PublicError for MemoryError {
    fn code(&self) -> ErrorCode {
        match self {
            MemoryError::NotFound { .. } => ErrorCode::MemoryItemNotFound,
            MemoryError::Invalid { .. } => ErrorCode::ValidationError,
            MemoryError::Quota { .. } => ErrorCode::StorageQuotaExceeded,
            MemoryError::Store(s) => s.code(),
        }
    }
}

/// An item as stored (and as answered).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StoredItem {
    pub namespace: Vec<String>,
    pub key: String,
    pub value: Value,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    #[serde(default)]
    pub expires_at: Option<Timestamp>,
}

impl StoredItem {
    fn expired(&self, now: Timestamp) -> bool {
        self.expires_at.is_some_and(|e| e <= now)
    }
}

/// One search result.
#[derive(Debug, Clone)]
pub struct Found {
    pub item: StoredItem,
    pub score: f64,
}

/// What a search asks.
#[derive(Debug, Clone, Default)]
pub struct SearchQuery {
    pub namespace_prefix: Vec<String>,
    pub query: Option<String>,
    pub filter: Option<Map<String, Value>>,
    pub limit: usize,
    pub offset: usize,
}

/// Checks a namespace (`min_depth` 0 for a prefix).
pub fn check_namespace(namespace: &[String], min_depth: usize) -> Result<(), MemoryError> {
    if namespace.len() < min_depth || namespace.len() > MAX_DEPTH {
        return Err(MemoryError::invalid(format!(
            "a namespace has {min_depth} to {MAX_DEPTH} segments"
        )));
    }
    for s in namespace {
        check_name(s, "a namespace segment")?;
        if s.contains('.') {
            return Err(MemoryError::invalid(
                "a namespace segment holds no '.' (the query string joins segments with '.')",
            ));
        }
    }
    Ok(())
}

fn check_name(s: &str, what: &str) -> Result<(), MemoryError> {
    if s.is_empty() || s.chars().count() > MAX_NAME_CHARS || s.chars().any(char::is_control) {
        return Err(MemoryError::invalid(format!(
            "{what} is 1 to {MAX_NAME_CHARS} characters, without control characters"
        )));
    }
    Ok(())
}

/// A namespace written `a.b.c` (the query string's form); `""` is the empty prefix.
pub fn parse_dotted(s: &str) -> Vec<String> {
    if s.is_empty() {
        Vec::new()
    } else {
        s.split('.').map(str::to_string).collect()
    }
}

/// The document key of an item under [`ITEMS`] (and [`TTLS`]).
pub fn store_key(tenant: &str, namespace: &[String], key: &str) -> String {
    format!("{tenant}{SEP}{}{SEP}{key}", namespace.join("."))
}

/// The text of a value that search reads: its strings, numbers and booleans.
pub fn text_of(value: &Value) -> String {
    fn walk(v: &Value, out: &mut String) {
        match v {
            Value::String(s) => {
                out.push_str(s);
                out.push(' ');
            }
            Value::Number(n) => {
                out.push_str(&n.to_string());
                out.push(' ');
            }
            Value::Bool(b) => {
                out.push_str(if *b { "true " } else { "false " });
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            Value::Object(o) => o.values().for_each(|v| walk(v, out)),
            Value::Null => {}
        }
    }
    let mut out = String::new();
    walk(value, &mut out);
    out
}

fn entry_of(item: &StoredItem, bytes: u64) -> Entry {
    Entry::new(
        item.namespace.clone(),
        item.key.clone(),
        &text_of(&item.value),
        bytes,
        item.expires_at.map(|t| t.as_millisecond()),
        item.updated_at.as_millisecond(),
    )
}

fn stamp_of(doc: Option<&Value>) -> String {
    doc.and_then(|d| d["stamp"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// A tenant's index on this node: `None` until built (or after it was
/// found stale).
type Slot = Arc<RwLock<Option<TenantIndex>>>;

/// The handle: the API's entry to memory, the memory tools' target, and
/// the sweep's owner. Cheap to clone.
#[derive(Clone)]
pub struct Memory(Arc<Inner>);

impl std::ops::Deref for Memory {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        &self.0
    }
}

pub struct Inner {
    store: Store,
    config: MemoryConfig,
    /// Semantic ranking's client, when `embeddings_url` is set.
    embedder: Option<embed::Embedder>,
    tenants: Mutex<HashMap<String, Slot>>,
}

impl Memory {
    pub fn new(store: Store, config: MemoryConfig) -> Self {
        Memory(Arc::new(Inner {
            store,
            embedder: embed::Embedder::of(&config),
            config,
            tenants: Mutex::new(HashMap::new()),
        }))
    }

    /// What the `remember` and `recall` tools call (held weakly by the registry).
    pub fn tools(&self) -> std::sync::Weak<dyn crate::tools::memory::MemoryTools> {
        let weak: std::sync::Weak<Inner> = Arc::downgrade(&self.0);
        weak
    }

    /// Deletes expired items every `[memory] sweep_s` until `stop`.
    pub fn spawn_sweep(&self, stop: tokio_util::sync::CancellationToken) {
        let memory = self.clone();
        let every = Duration::from_secs(self.config.sweep_s.max(1));
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                if let Err(e) = memory.sweep().await {
                    tracing::warn!(error = %e, "memory sweep failed; tried again next time");
                }
            }
        });
    }
}

impl Inner {
    fn slot(&self, tenant: &str) -> Slot {
        self.tenants
            .lock()
            .expect("memory tenants lock")
            .entry(tenant.to_string())
            .or_default()
            .clone()
    }

    async fn stored_stamp(&self, tenant: &str) -> Result<String, StoreError> {
        Ok(stamp_of(self.store.get_doc(STAMPS, tenant).await?.as_ref()))
    }

    /// Builds `tenant`'s index from the store: the stamp first, then the
    /// items (a write in between leaves a newer stamp: the next use builds again).
    async fn build(&self, tenant: &str) -> Result<TenantIndex, StoreError> {
        let mut index = TenantIndex::default();
        index.stamp = Some(self.stored_stamp(tenant).await?);
        let mut cursor = None;
        loop {
            let page = self
                .store
                .docs_of(ITEMS, tenant, cursor, LOAD_PAGE, false)
                .await?;
            for (key, value) in page.items {
                let bytes = serde_json::to_vec(&value).map_or(0, |v| v.len() as u64);
                match serde_json::from_value::<StoredItem>(value) {
                    Ok(item) => index.upsert(&key, entry_of(&item, bytes)),
                    Err(e) => {
                        tracing::warn!(item = %key, error = %e, "unreadable memory item skipped")
                    }
                }
            }
            match page.next {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        if let Some(embedder) = &self.embedder {
            let mut cursor = None;
            loop {
                let page = self
                    .store
                    .docs_of(embed::VECTORS, tenant, cursor, LOAD_PAGE, false)
                    .await?;
                for (key, doc) in page.items {
                    if let Some(v) = embed::from_doc(&doc, embedder.model()) {
                        index.set_vector(&key, v);
                    }
                }
                match page.next {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
        }
        Ok(index)
    }

    /// The unit vector of `text` when semantic ranking is on; `None` when
    /// it is off or the call failed (logged: the caller goes on without).
    async fn vector_of(&self, text: &str) -> Option<Vec<f32>> {
        let embedder = self.embedder.as_ref()?;
        if text.trim().is_empty() {
            return None;
        }
        match embedder.embed(text).await {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(error = %e, "no embedding: BM25 alone for this item or search");
                None
            }
        }
    }

    /// `tenant`'s index, current, for reading.
    async fn read_index(
        &self,
        tenant: &str,
    ) -> Result<tokio::sync::OwnedRwLockReadGuard<Option<TenantIndex>>, StoreError> {
        let slot = self.slot(tenant);
        let stamp = self.stored_stamp(tenant).await?;
        {
            let read = slot.clone().read_owned().await;
            if read
                .as_ref()
                .is_some_and(|i| i.stamp.as_ref() == Some(&stamp))
            {
                return Ok(read);
            }
        }
        let write = self.write_index(tenant, slot).await?;
        Ok(write.downgrade())
    }

    /// `tenant`'s index, current, held for a write: writes of a tenant on
    /// one node go one at a time.
    async fn write_index(
        &self,
        tenant: &str,
        slot: Slot,
    ) -> Result<tokio::sync::OwnedRwLockWriteGuard<Option<TenantIndex>>, StoreError> {
        let mut write = slot.write_owned().await;
        let stamp = self.stored_stamp(tenant).await?;
        if write
            .as_ref()
            .is_none_or(|i| i.stamp.as_ref() != Some(&stamp))
        {
            *write = Some(self.build(tenant).await?);
        }
        Ok(write)
    }

    /// Writes `ops` for `tenant` with a new stamp (the module doc's
    /// "Cluster mode"); whether the index held is still current after it.
    async fn write_stamped(
        &self,
        tenant: &str,
        index: &TenantIndex,
        mut ops: Vec<WriteOp>,
    ) -> Result<(String, bool), StoreError> {
        let new = uuid::Uuid::now_v7().to_string();
        let moved = Arc::new(Mutex::new(None));
        let mut all = vec![
            WriteOp::PutDocsOnce {
                docs: vec![NewDoc {
                    namespace: STAMPS.into(),
                    key: tenant.into(),
                    value: json!({ "stamp": "" }),
                    tenant: None,
                }],
                session_id: None,
            },
            WriteOp::MoveDoc {
                namespace: STAMPS.into(),
                key: tenant.into(),
                to_namespace: STAMPS.into(),
                to_value: json!({ "stamp": new }),
                moved: moved.clone(),
            },
        ];
        all.append(&mut ops);
        self.store.write(all, true).await?;
        let old = moved.lock().expect("move slot").take();
        let current = old.is_some() && Some(stamp_of(old.as_ref())) == index.stamp;
        Ok((new, current))
    }

    /// Creates or replaces an item; durable before this returns.
    pub async fn put(
        &self,
        tenant: &str,
        namespace: Vec<String>,
        key: String,
        value: Value,
        ttl_s: Option<u64>,
    ) -> Result<StoredItem, MemoryError> {
        check_namespace(&namespace, 1)?;
        check_name(&key, "a key")?;
        if !value.is_object() {
            return Err(MemoryError::invalid("a value is a JSON object"));
        }
        if serde_json::to_vec(&value)?.len() > MAX_VALUE_BYTES {
            return Err(MemoryError::invalid(format!(
                "a value is at most {MAX_VALUE_BYTES} bytes of JSON"
            )));
        }
        if let Some(ttl) = ttl_s
            && !(1..=MAX_TTL_S).contains(&ttl)
        {
            return Err(MemoryError::invalid(format!(
                "ttl_s is 1 to {MAX_TTL_S} seconds"
            )));
        }
        let skey = store_key(tenant, &namespace, &key);
        // Asked before the tenant's lock: a slow endpoint holds no write.
        let vector = self.vector_of(&text_of(&value)).await;
        let mut guard = self.write_index(tenant, self.slot(tenant)).await?;
        let index = guard.as_mut().expect("built by write_index");
        let now = Timestamp::now();
        let old = index
            .get(&skey)
            .filter(|e| !e.expired(now.as_millisecond()));
        let created_at = match old {
            Some(_) => self
                .store
                .get_doc(ITEMS, &skey)
                .await?
                .and_then(|v| serde_json::from_value::<StoredItem>(v).ok())
                .map_or(now, |i| i.created_at),
            None => now,
        };
        let item = StoredItem {
            namespace,
            key,
            value,
            created_at,
            updated_at: now,
            expires_at: ttl_s.and_then(|t| now.checked_add(Duration::from_secs(t)).ok()),
        };
        let doc = serde_json::to_value(&item)?;
        let bytes = serde_json::to_vec(&doc)?.len() as u64;
        let (count, used) = index.usage();
        let (old_count, old_bytes) = index.get(&skey).map_or((0, 0), |e| (1, e.bytes));
        if (count - old_count) as u64 + 1 > self.config.max_items {
            return Err(MemoryError::Quota {
                message: format!("{} items, the most `[memory] max_items` allows", count),
            });
        }
        if used - old_bytes + bytes > self.config.max_mb.saturating_mul(1 << 20) {
            return Err(MemoryError::Quota {
                message: format!(
                    "its items take {used} bytes of the {} MiB `[memory] max_mb` allows",
                    self.config.max_mb
                ),
            });
        }
        let mut ops = vec![WriteOp::PutDoc {
            namespace: ITEMS.into(),
            key: skey.clone(),
            value: doc,
            tenant: Some(tenant.into()),
        }];
        ops.push(match item.expires_at {
            Some(at) => WriteOp::PutDoc {
                namespace: TTLS.into(),
                key: skey.clone(),
                value: json!({ "tenant": tenant, "expires_at": at }),
                tenant: None,
            },
            None => WriteOp::DeleteDoc {
                namespace: TTLS.into(),
                key: skey.clone(),
            },
        });
        // The vector beside the item, or none (a replaced item's old
        // vector is not its text's).
        ops.push(match (&vector, &self.embedder) {
            (Some(v), Some(embedder)) => WriteOp::PutDoc {
                namespace: embed::VECTORS.into(),
                key: skey.clone(),
                value: embed::to_doc(embedder.model(), v),
                tenant: Some(tenant.into()),
            },
            _ => WriteOp::DeleteDoc {
                namespace: embed::VECTORS.into(),
                key: skey.clone(),
            },
        });
        let (stamp, current) = self.write_stamped(tenant, index, ops).await?;
        if current {
            let mut entry = entry_of(&item, bytes);
            entry.vector = vector.map(Into::into);
            index.upsert(&skey, entry);
            index.stamp = Some(stamp);
        } else {
            *guard = None;
        }
        Ok(item)
    }

    /// An item; absent or expired is [`MemoryError::NotFound`].
    pub async fn get(
        &self,
        tenant: &str,
        namespace: &[String],
        key: &str,
    ) -> Result<StoredItem, MemoryError> {
        check_namespace(namespace, 1)?;
        check_name(key, "a key")?;
        let not_found = || MemoryError::NotFound {
            namespace: namespace.join("."),
            key: key.to_string(),
        };
        let doc = self
            .store
            .get_doc(ITEMS, &store_key(tenant, namespace, key))
            .await?
            .ok_or_else(not_found)?;
        let item: StoredItem = serde_json::from_value(doc)?;
        if item.expired(Timestamp::now()) {
            return Err(not_found());
        }
        Ok(item)
    }

    /// Deletes an item; absent or expired is [`MemoryError::NotFound`].
    pub async fn delete(
        &self,
        tenant: &str,
        namespace: &[String],
        key: &str,
    ) -> Result<(), MemoryError> {
        self.get(tenant, namespace, key).await?;
        let skey = store_key(tenant, namespace, key);
        let mut guard = self.write_index(tenant, self.slot(tenant)).await?;
        self.delete_keys(tenant, &mut guard, vec![skey]).await
    }

    async fn delete_keys(
        &self,
        tenant: &str,
        guard: &mut Option<TenantIndex>,
        keys: Vec<String>,
    ) -> Result<(), MemoryError> {
        let Some(index) = guard.as_mut() else {
            return Ok(());
        };
        let mut ops = Vec::new();
        for k in &keys {
            for ns in [ITEMS, TTLS, embed::VECTORS] {
                ops.push(WriteOp::DeleteDoc {
                    namespace: ns.into(),
                    key: k.clone(),
                });
            }
        }
        let (stamp, current) = self.write_stamped(tenant, index, ops).await?;
        if current {
            for k in &keys {
                index.remove(k);
            }
            index.stamp = Some(stamp);
        } else {
            *guard = None;
        }
        Ok(())
    }

    /// Deletes every item of `tenant` (the tenant erase), [`LOAD_PAGE`]
    /// at a time (one transaction each), and drops its index on this
    /// node; how many. Other nodes' indexes see the moved stamp and are
    /// built again (empty) on next use. A put racing the erase on another
    /// node may land after it, as a session created meanwhile does.
    pub async fn erase_tenant(&self, tenant: &str) -> Result<u64, MemoryError> {
        let slot = self.slot(tenant);
        let mut guard = slot.write_owned().await;
        let mut erased = 0;
        loop {
            let page = self
                .store
                .docs_of(ITEMS, tenant, None, LOAD_PAGE, false)
                .await?;
            if page.items.is_empty() {
                break;
            }
            let mut ops = Vec::with_capacity(page.items.len() * 3);
            for (key, _) in &page.items {
                for ns in [ITEMS, TTLS, embed::VECTORS] {
                    ops.push(WriteOp::DeleteDoc {
                        namespace: ns.into(),
                        key: key.clone(),
                    });
                }
            }
            self.write_stamped(tenant, &TenantIndex::default(), ops)
                .await?;
            erased += page.items.len() as u64;
        }
        *guard = None;
        drop(guard);
        self.tenants
            .lock()
            .expect("memory tenants lock")
            .remove(tenant);
        if erased > 0 {
            tracing::info!(tenant, items = erased, "tenant memory erased");
        }
        Ok(erased)
    }

    /// The items under a namespace prefix, best first for `query`, else
    /// newest first; `filter` keeps those whose value has each field equal.
    pub async fn search(&self, tenant: &str, q: SearchQuery) -> Result<Vec<Found>, MemoryError> {
        check_namespace(&q.namespace_prefix, 0)?;
        if !(1..=MAX_LIMIT).contains(&q.limit) {
            return Err(MemoryError::invalid(format!("limit is 1 to {MAX_LIMIT}")));
        }
        let query = q.query.as_deref().filter(|s| !s.trim().is_empty());
        let query_vector = match query {
            Some(text) => self.vector_of(text).await,
            None => None,
        };
        let semantic = query_vector
            .as_deref()
            .zip(self.embedder.as_ref())
            .map(|(vector, e)| index::Semantic {
                vector,
                min_similarity: e.min_similarity,
            });
        let now = Timestamp::now();
        let ranked = {
            let guard = self.read_index(tenant).await?;
            let index = guard.as_ref().expect("built by read_index");
            index.ranked(&q.namespace_prefix, query, semantic, now.as_millisecond())
        };
        let mut out = Vec::new();
        let mut skipped = 0;
        for (skey, score) in ranked {
            let Some(doc) = self.store.get_doc(ITEMS, &skey).await? else {
                continue;
            };
            let Ok(item) = serde_json::from_value::<StoredItem>(doc) else {
                continue;
            };
            if item.expired(now) {
                continue;
            }
            if let Some(filter) = &q.filter
                && !filter.iter().all(|(k, v)| item.value.get(k) == Some(v))
            {
                continue;
            }
            if skipped < q.offset {
                skipped += 1;
                continue;
            }
            out.push(Found { item, score });
            if out.len() >= q.limit {
                break;
            }
        }
        Ok(out)
    }

    /// The distinct namespaces under `prefix`, cut to `max_depth`, sorted.
    pub async fn namespaces(
        &self,
        tenant: &str,
        prefix: &[String],
        max_depth: Option<usize>,
    ) -> Result<Vec<Vec<String>>, MemoryError> {
        check_namespace(prefix, 0)?;
        let guard = self.read_index(tenant).await?;
        let index = guard.as_ref().expect("built by read_index");
        Ok(index.namespaces(prefix, max_depth, Timestamp::now().as_millisecond()))
    }

    /// Deletes the items whose TTL passed; how many.
    pub async fn sweep(&self) -> Result<usize, MemoryError> {
        let now = Timestamp::now();
        let mut due: HashMap<String, Vec<String>> = HashMap::new();
        for (key, v) in self.store.list_docs(TTLS, "").await? {
            let at = v["expires_at"]
                .as_str()
                .and_then(|s| s.parse::<Timestamp>().ok());
            if let (Some(tenant), Some(at)) = (v["tenant"].as_str(), at)
                && at <= now
            {
                due.entry(tenant.to_string()).or_default().push(key);
            }
        }
        let mut swept = 0;
        for (tenant, keys) in due {
            let mut guard = self.write_index(&tenant, self.slot(&tenant)).await?;
            // Under the tenant's lock: a put since the listing may have
            // moved the TTL on.
            let mut gone = Vec::new();
            for k in keys {
                let still = self.store.get_doc(TTLS, &k).await?.is_some_and(|v| {
                    v["expires_at"]
                        .as_str()
                        .and_then(|s| s.parse::<Timestamp>().ok())
                        .is_some_and(|at| at <= now)
                });
                if still {
                    gone.push(k);
                }
            }
            swept += gone.len();
            if !gone.is_empty() {
                self.delete_keys(&tenant, &mut guard, gone).await?;
            }
        }
        Ok(swept)
    }
}
