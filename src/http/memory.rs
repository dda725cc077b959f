//! Memory over HTTP ([`crate::memory`] has the rules), LangGraph-Store
//! shaped:
//!
//! - `PUT /v1/memory/items` `{namespace, key, value, ttl_s?}`: creates or
//!   replaces; 200 with the item;
//! - `GET /v1/memory/items?namespace=users.u1&key=prefs`: the item; 404
//!   `MEMORY_ITEM_NOT_FOUND` when absent or expired;
//! - `DELETE /v1/memory/items?namespace=...&key=...`: 204 (404 the same);
//! - `POST /v1/memory/items/search` `{namespace_prefix, query?, filter?,
//!   limit?, offset?}`: `{items: [...]}`, best first by BM25 when `query`
//!   is given, else newest first;
//! - `GET /v1/memory/namespaces?prefix=users&max_depth=2`: the namespaces
//!   in use.
//!
//! Everything is the caller's tenant's: another tenant's item is 404 like
//! a missing one and never found. Decided: `PUT` answers the item (not
//! LangGraph's empty 204) so a client learns `created_at`/`expires_at`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiQuery};
use super::openapi::error_responses;
use crate::memory::{Found, SearchQuery, StoredItem, parse_dotted};
use crate::tenants::Principal;

/// A namespace segment: 1 to 128 characters, no `.`, no control characters.
struct MemorySegment;

impl utoipa::PartialSchema for MemorySegment {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some(
                "A namespace segment: 1 to 128 characters, no `.`, no control characters.",
            ))
            .min_length(Some(1))
            .max_length(Some(crate::memory::MAX_NAME_CHARS))
            .pattern(Some(SEGMENT))
            .into()
    }
}

impl ToSchema for MemorySegment {}

/// [`MemorySegment`] as a pattern.
const SEGMENT: &str = "^[^.\\u0000-\\u001f\\u007f-\\u009f]{1,128}$";

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(put_item, get_item, delete_item))
        .routes(routes!(search))
        .routes(routes!(namespaces))
}

/// An item to store.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct PutBody {
    /// 1 to 8 segments, each 1 to 128 characters, no `.`, no control characters.
    #[schema(value_type = Vec<MemorySegment>, example = json!(["users", "u1"]), min_items = 1, max_items = 8)]
    namespace: Vec<String>,
    /// 1 to 128 characters, no control characters.
    #[schema(
        example = "prefs",
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]{1,128}$"
    )]
    key: String,
    /// A JSON object of at most 64 KiB; its strings are what search reads.
    #[schema(value_type = std::collections::BTreeMap<String, Value>)]
    value: Value,
    /// Forgotten this many seconds from now (1 to ten years); none: kept.
    #[schema(minimum = 1, maximum = 316_224_000)]
    ttl_s: Option<u64>,
}

/// A memory item.
#[derive(Serialize, ToSchema)]
#[schema(as = MemoryItem)]
struct ItemOut {
    namespace: Vec<String>,
    key: String,
    #[schema(value_type = std::collections::BTreeMap<String, Value>)]
    value: Value,
    created_at: Timestamp,
    updated_at: Timestamp,
    /// When its TTL ends; `null`: kept until deleted.
    expires_at: Option<Timestamp>,
}

impl From<StoredItem> for ItemOut {
    fn from(i: StoredItem) -> Self {
        ItemOut {
            namespace: i.namespace,
            key: i.key,
            value: i.value,
            created_at: i.created_at,
            updated_at: i.updated_at,
            expires_at: i.expires_at,
        }
    }
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct ItemQuery {
    /// The namespace, segments joined with `.` (`users.u1`): 1 to 8
    /// segments of 1 to 128 characters, no control characters.
    #[param(
        example = "users.u1",
        pattern = "^[^.\\u0000-\\u001f\\u007f-\\u009f]{1,128}(\\.[^.\\u0000-\\u001f\\u007f-\\u009f]{1,128}){0,7}$"
    )]
    namespace: String,
    /// 1 to 128 characters, no control characters.
    #[param(
        example = "prefs",
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]{1,128}$"
    )]
    key: String,
}

error_responses!(
    PutErrors:
    ValidationError = "a namespace, key, value or ttl_s out of bounds (the message says which)",
    StorageQuotaExceeded = "the tenant has `[memory] max_items` items, or they take `max_mb`",
    StorageUnavailable
);

#[utoipa::path(
    put,
    path = "/v1/memory/items",
    operation_id = "put_memory_item",
    summary = "Store a memory item",
    tag = "memory",
    request_body = PutBody,
    responses(
        (status = 200, description = "The item as stored (created or replaced)", body = ItemOut),
        PutErrors,
    )
)]
async fn put_item(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(body): ApiJson<PutBody>,
) -> Result<Json<ItemOut>, ApiError> {
    let item = state
        .memory
        .put(
            &caller.tenant,
            body.namespace,
            body.key,
            body.value,
            body.ttl_s,
        )
        .await?;
    Ok(Json(item.into()))
}

error_responses!(
    GetErrors:
    MemoryItemNotFound,
    ValidationError = "a namespace or key out of bounds",
    StorageUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/memory/items",
    operation_id = "get_memory_item",
    summary = "A memory item",
    tag = "memory",
    params(ItemQuery),
    responses(
        (status = 200, description = "The item", body = ItemOut),
        GetErrors,
    )
)]
async fn get_item(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiQuery(q): ApiQuery<ItemQuery>,
) -> Result<Json<ItemOut>, ApiError> {
    let item = state
        .memory
        .get(&caller.tenant, &parse_dotted(&q.namespace), &q.key)
        .await?;
    Ok(Json(item.into()))
}

#[utoipa::path(
    delete,
    path = "/v1/memory/items",
    operation_id = "delete_memory_item",
    summary = "Delete a memory item",
    tag = "memory",
    params(ItemQuery),
    responses(
        (status = 204, description = "Deleted"),
        GetErrors,
    )
)]
async fn delete_item(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiQuery(q): ApiQuery<ItemQuery>,
) -> Result<StatusCode, ApiError> {
    state
        .memory
        .delete(&caller.tenant, &parse_dotted(&q.namespace), &q.key)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A search of the tenant's memory.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct SearchBody {
    /// Only items whose namespace starts with these segments (default:
    /// all the tenant's).
    #[serde(default)]
    #[schema(value_type = Vec<MemorySegment>, example = json!(["users"]), max_items = 8)]
    namespace_prefix: Vec<String>,
    /// Words to rank by (BM25 over the values' text, fused with semantic
    /// ranking when `[memory] embeddings_url` is set); none or empty: newest first.
    #[schema(example = "what is the dog's name", max_length = 4096)]
    query: Option<String>,
    /// Only items whose value has each of these fields equal to the value given.
    #[schema(value_type = Option<std::collections::BTreeMap<String, Value>>)]
    filter: Option<serde_json::Map<String, Value>>,
    /// 1 to 100 (default 10).
    #[schema(minimum = 1, maximum = 100)]
    limit: Option<usize>,
    /// Results skipped first (default 0).
    #[schema(minimum = 0, maximum = 10_000)]
    offset: Option<usize>,
}

/// One search result.
#[derive(Serialize, ToSchema)]
#[schema(as = MemorySearchItem)]
struct FoundOut {
    namespace: Vec<String>,
    key: String,
    #[schema(value_type = std::collections::BTreeMap<String, Value>)]
    value: Value,
    /// Relevance to the query: BM25, or with semantic ranking on the
    /// fused score (docs/memory.md); 0 without a query.
    score: f64,
    created_at: Timestamp,
    updated_at: Timestamp,
    expires_at: Option<Timestamp>,
}

impl From<Found> for FoundOut {
    fn from(f: Found) -> Self {
        FoundOut {
            namespace: f.item.namespace,
            key: f.item.key,
            value: f.item.value,
            score: f.score,
            created_at: f.item.created_at,
            updated_at: f.item.updated_at,
            expires_at: f.item.expires_at,
        }
    }
}

#[derive(Serialize, ToSchema)]
struct SearchResults {
    /// Best first (newest first without a query).
    items: Vec<FoundOut>,
}

error_responses!(
    SearchErrors:
    ValidationError = "a namespace prefix, limit or offset out of bounds",
    StorageUnavailable
);

#[utoipa::path(
    post,
    path = "/v1/memory/items/search",
    operation_id = "search_memory",
    summary = "Search the tenant's memory",
    tag = "memory",
    request_body = SearchBody,
    responses(
        (status = 200, description = "The items found, best first", body = SearchResults),
        SearchErrors,
    )
)]
async fn search(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(body): ApiJson<SearchBody>,
) -> Result<Json<SearchResults>, ApiError> {
    let offset = body.offset.unwrap_or(0);
    if offset > 10_000 {
        return Err(ApiError::validation("offset is 0 to 10000"));
    }
    let found = state
        .memory
        .search(
            &caller.tenant,
            SearchQuery {
                namespace_prefix: body.namespace_prefix,
                query: body.query,
                filter: body.filter,
                limit: body.limit.unwrap_or(10),
                offset,
            },
        )
        .await?;
    Ok(Json(SearchResults {
        items: found.into_iter().map(FoundOut::from).collect(),
    }))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct NamespacesQuery {
    /// Only namespaces under this one, segments joined with `.` (default: all).
    #[param(
        example = "users",
        pattern = "^([^.\\u0000-\\u001f\\u007f-\\u009f]{1,128}(\\.[^.\\u0000-\\u001f\\u007f-\\u009f]{1,128}){0,7})?$"
    )]
    prefix: Option<String>,
    /// Cut each namespace to this many segments (1 to 8).
    #[param(minimum = 1, maximum = 8)]
    max_depth: Option<usize>,
}

#[derive(Serialize, ToSchema)]
struct NamespaceList {
    /// Sorted, each once.
    namespaces: Vec<Vec<String>>,
}

error_responses!(
    NamespacesErrors:
    ValidationError = "a prefix or max_depth out of bounds",
    StorageUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/memory/namespaces",
    operation_id = "list_memory_namespaces",
    summary = "The namespaces of the tenant's memory",
    tag = "memory",
    params(NamespacesQuery),
    responses(
        (status = 200, description = "The namespaces holding live items", body = NamespaceList),
        NamespacesErrors,
    )
)]
async fn namespaces(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiQuery(q): ApiQuery<NamespacesQuery>,
) -> Result<Json<NamespaceList>, ApiError> {
    if q.max_depth.is_some_and(|d| !(1..=8).contains(&d)) {
        return Err(ApiError::validation("max_depth is 1 to 8"));
    }
    let prefix = parse_dotted(q.prefix.as_deref().unwrap_or_default());
    let namespaces = state
        .memory
        .namespaces(&caller.tenant, &prefix, q.max_depth)
        .await?;
    Ok(Json(NamespaceList { namespaces }))
}
