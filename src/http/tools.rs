//! `GET /v1/tools`: the registered tools as OpenAI function definitions.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

use super::AppState;

pub fn routes() -> Router<AppState> {
    Router::new().route("/v1/tools", get(list))
}

async fn list(State(state): State<AppState>) -> Json<Value> {
    let tools: Vec<Value> = state
        .registry
        .definitions()
        .iter()
        .map(|d| d.spec().to_openai_json())
        .collect();
    Json(json!({ "tools": tools }))
}
