//! Webhook deliveries over HTTP ([`crate::webhooks`] has the rules).
//!
//! - `GET /v1/webhooks/deliveries` (`?limit=&cursor=`, newest first): the
//!   caller's tenant's events, each with its target, state and attempts;
//! - `GET /v1/webhooks/deliveries/{id}`: one (another tenant's is 404 like
//!   a missing one).
//!
//! Targets are not registered here: a message, a workflow run or a
//! schedule names its `webhook`, checked when it is accepted.

use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::extract::{ApiQuery, PageQuery};
use super::openapi::error_responses;
use crate::error_code::ErrorCode;
use crate::tenants::Principal;
use crate::webhooks::Delivery;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(show))
}

#[derive(Serialize, ToSchema)]
struct DeliveryList {
    /// Newest first.
    deliveries: Vec<Delivery>,
    /// The `cursor` of the next page; `null` on the last.
    next: Option<String>,
}

error_responses!(
    ListErrors:
    ValidationError = "limit out of range, or a cursor too long or not printable ASCII",
    StorageUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/webhooks/deliveries",
    operation_id = "list_webhook_deliveries",
    summary = "The tenant's webhook events and their attempts",
    tag = "webhooks",
    params(PageQuery),
    responses(
        (status = 200, description = "A page of the caller's tenant's webhook events, newest first", body = DeliveryList),
        ListErrors,
    )
)]
async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> Result<Json<DeliveryList>, ApiError> {
    let (limit, cursor) =
        super::calls::page_params(q.limit, q.cursor, super::calls::DEFAULT_LIMIT)?;
    let page = state
        .webhooks
        .deliveries(caller.scope().name(), cursor, limit)
        .await?;
    Ok(Json(DeliveryList {
        deliveries: page.items,
        next: page.next,
    }))
}

error_responses!(
    ShowErrors:
    DeliveryNotFound,
    StorageUnavailable
);

#[utoipa::path(
    get,
    path = "/v1/webhooks/deliveries/{id}",
    operation_id = "get_webhook_delivery",
    summary = "One webhook event and its attempts",
    tag = "webhooks",
    params(("id" = String, Path, description = "The event id (its `webhook-id` header)")),
    responses(
        (status = 200, description = "The event, its target, state and attempts", body = Delivery),
        ShowErrors,
    )
)]
async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<Delivery>, ApiError> {
    if id.len() > crate::identity::MAX_ID_BYTES {
        return Err(not_found());
    }
    state
        .webhooks
        .delivery(caller.scope().name(), &id)
        .await?
        .map(Json)
        .ok_or_else(not_found)
}

fn not_found() -> ApiError {
    ApiError::new(ErrorCode::DeliveryNotFound, "no such webhook event")
}
