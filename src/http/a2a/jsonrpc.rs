//! The JSON-RPC 2.0 binding: `POST /a2a/{agent}`, one request object per
//! body (a batch, or anything not an object, is -32600), PascalCase
//! method names. Answers are HTTP 200 with a JSON-RPC response, or for
//! `SendStreamingMessage` and `SubscribeToTask` a stream of Server-Sent
//! Events whose data are JSON-RPC responses (`result`: a StreamResponse);
//! an error before the stream starts is a plain JSON-RPC error.

use axum::Extension;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::error::A2aError;
use super::tasks::Caller;
use super::types::{ListTasksRequest, SendMessageRequest, TaskIdRequest};
use super::{agent_named, check_version, sse};
use crate::http::AppState;
use crate::http::streams::StreamQuota;
use crate::identity::Principal;

fn reply(id: &Value, result: Result<Value, A2aError>) -> Response {
    let body = match result {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(e) => json!({"jsonrpc": "2.0", "id": id, "error": e.jsonrpc()}),
    };
    Json(body).into_response()
}

fn params<T: DeserializeOwned>(params: Value) -> Result<T, A2aError> {
    if !params.is_object() {
        return Err(A2aError::InvalidParams("params must be an object".into()));
    }
    serde_json::from_value(params).map_err(|e| A2aError::InvalidParams(e.to_string()))
}

fn to_value<T: serde::Serialize>(value: T) -> Result<Value, A2aError> {
    Ok(serde_json::to_value(value).unwrap_or(Value::Null))
}

pub async fn handle(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(quota): Extension<StreamQuota>,
    Path(agent): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(e) = agent_named(&state, &agent) {
        return e.into_response();
    }
    let null = Value::Null;
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return reply(
                &null,
                Err(A2aError::Parse(format!("the body is not JSON: {e}"))),
            );
        }
    };
    let Some(object) = request.as_object() else {
        return reply(
            &null,
            Err(A2aError::InvalidRequest(
                "a JSON-RPC request must be an object (batches are not served)".into(),
            )),
        );
    };
    let id = object.get("id").cloned().unwrap_or(Value::Null);
    if !(id.is_string() || id.is_number() || id.is_null()) {
        return reply(
            &null,
            Err(A2aError::InvalidRequest(
                "id must be a string, a number or null".into(),
            )),
        );
    }
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return reply(
            &id,
            Err(A2aError::InvalidRequest("jsonrpc must be \"2.0\"".into())),
        );
    }
    let Some(method) = object.get("method").and_then(Value::as_str) else {
        return reply(
            &id,
            Err(A2aError::InvalidRequest("method must be a string".into())),
        );
    };
    if let Err(e) = check_version(&headers, query.as_deref()) {
        return reply(&id, Err(e));
    }
    let p = object.get("params").cloned().unwrap_or(Value::Null);
    let caller = Caller {
        state,
        principal,
        agent,
    };
    match method {
        "SendMessage" => {
            let result = async {
                let request: SendMessageRequest = params(p)?;
                to_value(json!({"task": caller.send_message(request).await?}))
            }
            .await;
            reply(&id, result)
        }
        "SendStreamingMessage" | "SubscribeToTask" => {
            let started = async {
                let slot = quota.acquire()?;
                let events = if method == "SendStreamingMessage" {
                    caller.send_streaming(params(p)?).await?
                } else {
                    let request: TaskIdRequest = params(p)?;
                    caller.subscribe(&request.id).await?
                };
                Ok::<_, A2aError>((slot, events))
            }
            .await;
            match started {
                Ok((slot, events)) => {
                    let id = id.clone();
                    sse(
                        events,
                        slot,
                        method == "SubscribeToTask",
                        move |event| json!({"jsonrpc": "2.0", "id": id, "result": event}),
                    )
                }
                Err(e) => reply(&id, Err(e)),
            }
        }
        "GetTask" => {
            let result = async {
                let request: TaskIdRequest = params(p)?;
                to_value(caller.get_task(&request.id, request.history_length).await?)
            }
            .await;
            reply(&id, result)
        }
        "ListTasks" => {
            let result = async {
                let request: ListTasksRequest = if p.is_null() {
                    ListTasksRequest::default()
                } else {
                    params(p)?
                };
                to_value(caller.list_tasks(request).await?)
            }
            .await;
            reply(&id, result)
        }
        "CancelTask" => {
            let result = async {
                let request: TaskIdRequest = params(p)?;
                to_value(caller.cancel_task(&request.id).await?)
            }
            .await;
            reply(&id, result)
        }
        "CreateTaskPushNotificationConfig"
        | "GetTaskPushNotificationConfig"
        | "ListTaskPushNotificationConfigs"
        | "DeleteTaskPushNotificationConfig" => {
            reply(&id, Err(A2aError::PushNotificationNotSupported))
        }
        "GetExtendedAgentCard" => reply(&id, Err(A2aError::ExtendedAgentCardNotConfigured)),
        other => reply(
            &id,
            Err(A2aError::MethodNotFound(other.chars().take(64).collect())),
        ),
    }
}
