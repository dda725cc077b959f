//! Tools over HTTP: list (OpenAI function format, by plan; `?view=definitions`
//! for the full definitions `cadre tools list` prints), validate, invoke.
//!
//! Tools of MCP servers carry `source: "mcp:<server>"` and `status:
//! "available" | "unavailable"` next to their function definition; the
//! list also names every MCP server with its state and, when it is down,
//! why (`mcp_servers`), and the tools withheld because another tool holds
//! their wire name (`withheld`), so what the log says is visible here.
//!
//! `POST /v1/tools/{name}/invoke` runs the call through the executor like
//! any other caller (`caller_type = direct`). The body is always the full
//! `ToolExecutionResult`; the status is its `error_type`'s, from the one
//! table of codes (`crate::error_code`): 200 success, 202 pending
//! confirmation (`CONFIRMATION_REQUIRED`), 403 plan (`TOOL_PLAN_REQUIRED`),
//! 404 unknown tool, 422 validation, 429 rate limited or queue full (with
//! `Retry-After`), 502 the tool failed, 503 its MCP server is down
//! (`TOOL_UNAVAILABLE`), 504 it timed out.
//! A request that does not fit the document (a body that is not an
//! object, `params` that is not one, an unknown plan) is refused before any
//! call, with the 422 error body.
//!
//! Plans are spelled exactly as [`PlanName`] lists them (`free`, `pro`,
//! `premium`), in bodies and queries alike: the document's enum is the
//! whole truth (the CLI's `--plan` stays case-insensitive).

use axum::Extension;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::ApiError;
use super::error::ErrorBody;
use super::extract::{ApiJson, ApiQuery};
use super::openapi::error_responses;
use crate::error_code::ErrorCode;
use crate::executor::{Arguments, ExecuteTool};
use crate::identity::UserId;
use crate::model::ToolSpec;
use crate::tenants::Principal;
use crate::tenants::config::entitled_plan;
use crate::tools::definition::ToolDefinition;
use crate::tools::registry::McpServerStatus;
use crate::tools::{CallerType, ExecutionContext, FieldError, Plan, ToolExecutionResult};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(show))
        .routes(routes!(invoke))
        .routes(routes!(validate))
}

#[derive(Serialize, ToSchema)]
struct ToolList {
    /// OpenAI function definitions, with `source` and `status` for MCP
    /// tools; with `view=definitions`, the full definitions (among their
    /// fields `side_effects`: `none`, `idempotent` or `at_most_once`,
    /// whether a call may run again when a cut turn resumes).
    tools: Vec<ListedTool>,
    /// Every MCP server of `mcp.toml`; `reason` says why a server is down
    /// (unreachable, or refused over one of its limits), so a server that
    /// never listed a tool still shows.
    mcp_servers: Vec<McpServerStatus>,
    /// Tools not served because another tool has their wire name.
    withheld: Vec<WithheldView>,
}

/// One tool of the list: its OpenAI function definition (the default
/// view) or its full definition (`view=definitions`).
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
enum ListedTool {
    Function(FunctionTool),
    Definition(Box<ToolDefinition>),
}

/// A tool as OpenAI's `tools` take it, as it can be handed to a model.
#[derive(Serialize, ToSchema)]
struct FunctionTool {
    r#type: FunctionType,
    function: ToolSpec,
    /// MCP tools: `mcp:<server>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<String>,
    /// MCP tools: whether their server is up; a down server's tools stay listed.
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<McpToolStatus>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum FunctionType {
    Function,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
enum McpToolStatus {
    Available,
    Unavailable,
}

/// A tool not served: another tool holds its wire name.
#[derive(Serialize, ToSchema)]
struct WithheldView {
    name: String,
    /// Where it came from (`builtin`, a file, `mcp:<server>`).
    source: String,
    /// Why it is withheld.
    reason: String,
}

#[derive(Serialize, ToSchema)]
struct ToolView {
    /// The tool's definition as loaded.
    definition: ToolDefinition,
    /// Where it came from (`builtin`, a file, ...).
    source: String,
}

/// A tool's outcome, or an error of the request itself.
#[derive(serde::Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum ToolResultOrError {
    Tool(Box<ToolExecutionResult>),
    Error(ErrorBody),
}

#[derive(Serialize, ToSchema)]
struct Validation {
    is_valid: bool,
    /// One per failure.
    errors: Vec<FieldError>,
    /// The parameters with schema defaults filled in, when valid.
    #[schema(value_type = Option<std::collections::BTreeMap<String, Value>>)]
    validated_params: Option<Value>,
}

/// A plan as the API spells it: exactly one of these names.
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)]
pub enum PlanName {
    Free,
    Pro,
    Premium,
}

/// The plans [`PlanName`] lists, in its order.
pub const PLANS: [Plan; 3] = [Plan::Free, Plan::Pro, Plan::Premium];

/// A plan named as [`PlanName`] says (`free` when absent); any other
/// spelling is a 422, as the document's enum says.
pub fn parse_plan(plan: Option<&str>) -> Result<Plan, ApiError> {
    match plan {
        None => Ok(Plan::Free),
        Some(p) => PLANS
            .into_iter()
            .find(|known| known.as_str() == p)
            .ok_or_else(|| {
                ApiError::validation(format!("unknown plan '{p}' (free, pro or premium)"))
            }),
    }
}

/// What `GET /v1/tools` lists.
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)]
enum ToolListView {
    Openai,
    Definitions,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// `free`, `pro` or `premium`: only what that plan may call.
    #[param(inline, value_type = Option<PlanName>)]
    plan: Option<String>,
    /// `openai` (default): function specs; `definitions`: the full definitions.
    #[param(inline, value_type = Option<ToolListView>)]
    view: Option<String>,
}

error_responses!(
    ListErrors:
    ValidationError = "unknown plan"
);

#[utoipa::path(
    get,
    path = "/v1/tools",
    operation_id = "list_tools",
    summary = "The tool catalogue (OpenAI function format)",
    tag = "tools",
    params(ListQuery),
    responses(
        (status = 200, description = "The catalogue in OpenAI function format", body = ToolList),
        ListErrors,
    )
)]
async fn list(
    State(state): State<AppState>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<ToolList>, ApiError> {
    let defs = match q.plan.as_deref() {
        None => state.registry.definitions(),
        Some(p) => state.registry.definitions_for_plan(parse_plan(Some(p))?),
    };
    let tools: Vec<ListedTool> = match q.view.as_deref() {
        None | Some("openai") => defs
            .iter()
            .map(|d| {
                // Only the OpenAI format, so the list can be handed to a
                // model as is; `side_effects` is in `view=definitions`.
                let mut entry = FunctionTool {
                    r#type: FunctionType::Function,
                    function: d.spec(),
                    source: None,
                    status: None,
                };
                // Tools of MCP servers say where they come from and whether
                // their server is up; a down server's tools stay listed.
                if let (Some(available), crate::tools::definition::Entry::Mcp { server, .. }) =
                    (state.registry.mcp_status(&d.name), &d.entry)
                {
                    entry.source = Some(format!("mcp:{server}"));
                    entry.status = Some(if available {
                        McpToolStatus::Available
                    } else {
                        McpToolStatus::Unavailable
                    });
                }
                ListedTool::Function(entry)
            })
            .collect(),
        Some("definitions") => defs
            .into_iter()
            .map(|d| ListedTool::Definition(Box::new(d)))
            .collect(),
        Some(v) => {
            return Err(ApiError::validation(format!(
                "unknown view '{v}' (openai or definitions)"
            )));
        }
    };
    let withheld = state
        .registry
        .withheld()
        .into_iter()
        .map(|w| WithheldView {
            name: w.name,
            source: w.source.describe(),
            reason: w.message,
        })
        .collect();
    Ok(Json(ToolList {
        tools,
        mcp_servers: state.registry.mcp_servers(),
        withheld,
    }))
}

error_responses!(
    ShowErrors:
    ToolNotFound
);

#[utoipa::path(
    get,
    path = "/v1/tools/{name}",
    operation_id = "show_tool",
    summary = "A tool's definition and source",
    tag = "tools",
    params(("name" = String, Path, description = "Tool name")),
    responses(
        (status = 200, description = "The definition and where it came from", body = ToolView),
        ShowErrors,
    )
)]
async fn show(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<ToolView>, ApiError> {
    let tool = state
        .registry
        .get(&name)
        .ok_or_else(|| ApiError::new(ErrorCode::ToolNotFound, format!("no tool named '{name}'")))?;
    Ok(Json(ToolView {
        definition: tool.definition.clone(),
        source: tool.source.describe(),
    }))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct InvokeBody {
    /// The tool's arguments (default `{}`).
    #[serde(default)]
    #[schema(value_type = Option<std::collections::BTreeMap<String, Value>>)]
    params: Value,
    user_id: Option<UserId>,
    /// `free` (default), `pro` or `premium`.
    #[schema(value_type = Option<PlanName>)]
    plan: Option<String>,
    /// Queue order under the priority strategy.
    #[serde(default)]
    #[schema(minimum = -2147483648, maximum = 2147483647)]
    priority: i32,
}

/// Invoke's 403: the `TOOL_PLAN_REQUIRED` tool outcome, or the API's own
/// refusal of a plan the key and tenant do not allow.
struct InvokeForbidden;

impl utoipa::IntoResponses for InvokeForbidden {
    fn responses() -> std::collections::BTreeMap<
        String,
        utoipa::openapi::RefOr<utoipa::openapi::response::Response>,
    > {
        use utoipa::openapi::{Content, Ref, RefOr, Response};
        let mut forbidden = Response::new("`TOOL_PLAN_REQUIRED` (tool outcome)");
        forbidden.content.insert(
            "application/json".into(),
            RefOr::T(Content::new(Some(Ref::from_schema_name(
                "ToolResultOrError",
            )))),
        );
        super::openapi::add_code(
            &mut forbidden,
            ErrorCode::PlanNotEntitled,
            Some("the body's `plan` is above what the key and the tenant allow"),
        );
        [("403".to_string(), RefOr::T(forbidden))].into()
    }
}

#[utoipa::path(
    post,
    path = "/v1/tools/{name}/invoke",
    operation_id = "invoke_tool",
    summary = "Call a tool through the executor",
    tag = "tools",
    params(("name" = String, Path, description = "Tool name")),
    request_body = InvokeBody,
    responses(
        (status = 200, description = "The call succeeded", body = ToolExecutionResult),
        (status = 202, description = "`CONFIRMATION_REQUIRED`: approve or deny `metadata.confirmation_id`", body = ToolExecutionResult),
        (status = 404, description = "`TOOL_NOT_FOUND` (tool outcome)", body = ToolExecutionResult),
        InvokeForbidden,
        (status = 422, description = "`VALIDATION_ERROR` (tool outcome)", body = ToolResultOrError),
        (status = 413, description = "`STORAGE_QUOTA_EXCEEDED`: the tenant stores as much as its quota allows, and the call's record would add to it (`[tenants] max_storage_mb`); or `PAYLOAD_TOO_LARGE`: the body is over 1 MiB", body = ToolResultOrError),
        (status = 429, description = "`RATE_LIMITED` / `TOOL_QUEUE_FULL` (tool outcome), or `RATE_LIMITED` (error body): over the API's request rate or the tenant's share of the store (`[tenants] write_kib_per_s`); see `Retry-After`",
            body = ToolResultOrError, headers(("Retry-After" = u64, description = "Seconds to wait"))),
        (status = 502, description = "`TOOL_EXECUTION_ERROR` (tool outcome)", body = ToolExecutionResult),
        (status = 503, description = "`TOOL_UNAVAILABLE` (tool outcome): the tool's MCP server is down; its tools come back when it does. `LIMITS_UNAVAILABLE` (tool outcome, cluster mode): Redis is unreachable and `[cluster] redis_failure` is `closed`; retry shortly", body = ToolExecutionResult),
        (status = 504, description = "`TOOL_TIMEOUT` (tool outcome)", body = ToolExecutionResult),
    )
)]
async fn invoke(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(name): Path<String>,
    _room: super::storage_room::StorageRoom,
    ApiJson(body): ApiJson<InvokeBody>,
) -> Result<Response, ApiError> {
    let mut ctx = ExecutionContext::new(
        CallerType::Direct,
        body.user_id
            .as_ref()
            .map_or("http", UserId::as_str)
            .to_string(),
    );
    ctx.user_id = body.user_id.map(UserId::into_string);
    let asked = parse_plan(body.plan.as_deref())?;
    ctx.plan = entitled_plan(&state.store, &caller, Some(asked)).await?;
    ctx.priority = body.priority;
    let params = if body.params.is_null() {
        json!({})
    } else {
        body.params
    };
    // The call's record keeps its arguments: the tenant's share of the
    // store pays for them, and a tenant at its quota stores no more.
    let bytes = serde_json::to_vec(&params).map_or(0, |v| v.len());
    state.sessions.admit_bytes(&caller.scope(), bytes).await?;
    ctx.tenant = Some(caller.tenant);
    let result = state
        .executor
        .execute(ExecuteTool::new(&name, Arguments::Json(params), ctx))
        .await;
    let status = match result.error_type {
        None => StatusCode::OK,
        Some(t) => t.http_status(),
    };
    // A full queue frees up as calls finish: ask for a retry in a second.
    let retry_after = result
        .metadata
        .retry_after_ms
        .or((result.error_type == Some(crate::tools::ErrorType::QueueFull)).then_some(1000));
    let mut response = (status, Json(result)).into_response();
    if let Some(ms) = retry_after {
        let secs = ms.div_ceil(1000).max(1);
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    Ok(response)
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ValidateBody {
    /// The arguments to check (default `{}`): any JSON value; what is not
    /// an object fails the tool's schema and comes back `is_valid: false`.
    #[serde(default)]
    #[schema(value_type = Value)]
    params: Value,
}

error_responses!(
    ValidateErrors:
    ToolNotFound
);

/// `{is_valid, errors: [{field, code, message}], validated_params}`.
#[utoipa::path(
    post,
    path = "/v1/tools/{name}/validate",
    operation_id = "validate_tool_params",
    summary = "Check arguments against a tool's schema",
    tag = "tools",
    params(("name" = String, Path, description = "Tool name")),
    request_body = ValidateBody,
    responses(
        (status = 200, description = "Whether the arguments pass the tool's schema, and why not", body = Validation),
        ValidateErrors,
    )
)]
async fn validate(
    State(state): State<AppState>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<ValidateBody>,
) -> Result<Json<Validation>, ApiError> {
    let tool = state
        .registry
        .get(&name)
        .ok_or_else(|| ApiError::new(ErrorCode::ToolNotFound, format!("no tool named '{name}'")))?;
    let params = if body.params.is_null() {
        json!({})
    } else {
        body.params
    };
    Ok(Json(match tool.validator.validate(params) {
        Ok(validated) => Validation {
            is_valid: true,
            errors: Vec::new(),
            validated_params: Some(validated),
        },
        Err(errors) => Validation {
            is_valid: false,
            errors,
            validated_params: None,
        },
    }))
}
