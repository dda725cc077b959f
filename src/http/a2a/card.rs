//! An agent's Agent Card (`GET /a2a/{agent}/.well-known/agent-card.json`,
//! public): its name and description, one skill for the agent and one
//! per tool, both bindings' URLs, and the bearer scheme when the server
//! has keys.
//!
//! The URLs are absolute, built from the request's `Host` (and
//! `X-Forwarded-Proto`, for a server behind a TLS-terminating proxy), so
//! the card names the address its client reached. The card reads no
//! tenant data: the agent's system prompt is not shown (as in
//! `/v1/agents`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{PROTOCOL_VERSION, agent_named};
use crate::http::AppState;
use crate::tools::Plan;

/// `scheme://host` of the request, as its client addressed the server.
fn origin(headers: &HeaderMap) -> String {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(',').next().unwrap_or_default().trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let scheme = text("x-forwarded-proto")
        .filter(|p| p == "https" || p == "http")
        .unwrap_or_else(|| "http".into());
    let host = text(header::HOST.as_str()).unwrap_or_else(|| "localhost".into());
    format!("{scheme}://{host}")
}

pub async fn card(
    State(state): State<AppState>,
    Path(agent): Path<String>,
    headers: HeaderMap,
) -> Response {
    let found = match agent_named(&state, &agent) {
        Ok(found) => found,
        Err(e) => return e.into_response(),
    };
    let url = format!("{}/a2a/{agent}", origin(&headers));
    let description = if found.description.trim().is_empty() {
        format!("cadre agent {agent}")
    } else {
        found.description.clone()
    };
    let mut skills = vec![json!({
        "id": agent,
        "name": agent,
        "description": description,
        "tags": ["agent"],
    })];
    for spec in found.tool_specs(&state.registry, Plan::Premium).iter() {
        let plan = state
            .registry
            .get(&spec.name)
            .map_or(Plan::Free, |t| t.definition.required_plan);
        skills.push(json!({
            "id": format!("tool:{}", spec.name),
            "name": spec.name,
            "description": if spec.description.trim().is_empty() { spec.name.clone() } else { spec.description.clone() },
            "tags": ["tool", format!("plan:{}", plan.as_str())],
        }));
    }
    let mut card = json!({
        "name": agent,
        "description": description,
        "version": env!("CARGO_PKG_VERSION"),
        "supportedInterfaces": [
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": PROTOCOL_VERSION},
            {"url": url, "protocolBinding": "HTTP+JSON", "protocolVersion": PROTOCOL_VERSION},
        ],
        "provider": {"organization": "cadre", "url": origin(&headers)},
        "capabilities": {
            "streaming": true,
            "pushNotifications": false,
            "extendedAgentCard": false,
        },
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain"],
        "skills": skills,
    });
    if !state.keys.is_open() {
        card["securitySchemes"] = json!({
            "bearer": {"httpAuthSecurityScheme": {
                "scheme": "Bearer",
                "description": "a cadre API key (docs/tenants-and-keys.md)",
            }}
        });
        card["securityRequirements"] =
            json!([{"schemes": {"bearer": {"list": Value::Array(Vec::new())}}}]);
    }
    Json(card).into_response()
}
