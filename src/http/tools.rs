//! Tools over HTTP: list (OpenAI function format, by plan; `?view=definitions`
//! for the full definitions `cadre tools list` prints), validate, invoke.
//!
//! Tools of MCP servers carry `source: "mcp:<server>"` and `status:
//! "available" | "unavailable"` next to their function definition.
//!
//! `POST /v1/tools/{name}/invoke` runs the call through the executor like
//! any other caller (`caller_type = direct`). The body is always the full
//! `ToolExecutionResult`; the status says how it went: 200 success, 202
//! pending confirmation, 403 plan, 404 unknown tool, 422 validation, 429
//! rate limited or queue full (with `Retry-After`), 502 the tool failed, 503
//! its MCP server is down (`tool_unavailable`), 504 it timed out.

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::error::{ApiError, ApiJson};
use crate::executor::{Arguments, ExecuteTool};
use crate::tenants::Principal;
use crate::tools::{CallerType, ExecutionContext, Plan};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/tools", get(list))
        .route("/v1/tools/{name}", get(show))
        .route("/v1/tools/{name}/invoke", post(invoke))
        .route("/v1/tools/{name}/validate", post(validate))
}

pub fn parse_plan(plan: Option<&str>) -> Result<Plan, ApiError> {
    match plan {
        None => Ok(Plan::Free),
        Some(p) => Plan::parse(p).ok_or_else(|| {
            ApiError::validation(format!("unknown plan '{p}' (free, pro or premium)"))
        }),
    }
}

#[derive(Deserialize)]
struct ListQuery {
    plan: Option<String>,
    /// `openai` (default): function specs; `definitions`: the full definitions.
    view: Option<String>,
}

async fn list(
    State(state): State<AppState>,
    Query(q): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let defs = match q.plan.as_deref() {
        None => state.registry.definitions(),
        Some(p) => state.registry.definitions_for_plan(parse_plan(Some(p))?),
    };
    let tools: Vec<Value> = match q.view.as_deref() {
        None | Some("openai") => defs
            .iter()
            .map(|d| {
                let mut entry = d.spec().to_openai_json();
                // Tools of MCP servers say where they come from and whether
                // their server is up; a down server's tools stay listed.
                if let (Some(available), crate::tools::definition::Entry::Mcp { server, .. }) =
                    (state.registry.mcp_status(&d.name), &d.entry)
                {
                    entry["source"] = json!(format!("mcp:{server}"));
                    entry["status"] = json!(if available {
                        "available"
                    } else {
                        "unavailable"
                    });
                }
                entry
            })
            .collect(),
        Some("definitions") => defs.iter().map(|d| json!(d)).collect(),
        Some(v) => {
            return Err(ApiError::validation(format!(
                "unknown view '{v}' (openai or definitions)"
            )));
        }
    };
    Ok(Json(json!({ "tools": tools })))
}

async fn show(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let tool = state.registry.get(&name).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "TOOL_NOT_FOUND",
            format!("no tool named '{name}'"),
        )
    })?;
    Ok(Json(json!({
        "definition": tool.definition,
        "source": tool.source.describe(),
    })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InvokeBody {
    #[serde(default)]
    params: Value,
    user_id: Option<String>,
    plan: Option<String>,
    /// Queue order under the priority strategy.
    #[serde(default)]
    priority: i32,
}

async fn invoke(
    State(state): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<InvokeBody>,
) -> Result<Response, ApiError> {
    let mut ctx = ExecutionContext::new(
        CallerType::Direct,
        body.user_id.clone().unwrap_or_else(|| "http".into()),
    );
    ctx.user_id = body.user_id;
    ctx.plan = parse_plan(body.plan.as_deref())?;
    ctx.priority = body.priority;
    ctx.tenant = Some(caller.tenant);
    let params = if body.params.is_null() {
        json!({})
    } else {
        body.params
    };
    let result = state
        .executor
        .execute(ExecuteTool::new(&name, Arguments::Json(params), ctx))
        .await;
    let status = match result.error_type {
        None => StatusCode::OK,
        Some(t) => StatusCode::from_u16(t.http_status()).unwrap_or(StatusCode::BAD_GATEWAY),
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ValidateBody {
    #[serde(default)]
    params: Value,
}

/// `{is_valid, errors: [{field, code, message}], validated_params}`.
async fn validate(
    State(state): State<AppState>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<ValidateBody>,
) -> Result<Json<Value>, ApiError> {
    let tool = state.registry.get(&name).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "TOOL_NOT_FOUND",
            format!("no tool named '{name}'"),
        )
    })?;
    let params = if body.params.is_null() {
        json!({})
    } else {
        body.params
    };
    Ok(Json(match tool.validator.validate(params) {
        Ok(validated) => json!({"is_valid": true, "errors": [], "validated_params": validated}),
        Err(errors) => json!({"is_valid": false, "errors": errors, "validated_params": null}),
    }))
}
