//! The HTTP+JSON binding: `POST /a2a/{agent}/message:send` and
//! `:stream`, `GET /a2a/{agent}/tasks`, `GET /a2a/{agent}/tasks/{id}`,
//! `POST /a2a/{agent}/tasks/{id}:cancel`, `/tasks/{id}:subscribe` (POST,
//! as the specification's text and the SDKs say, and GET, as its proto
//! says). Errors are `google.rpc.Status` bodies ([`super::error`]);
//! streams' events are bare StreamResponses. Bodies are read as JSON
//! whatever their `Content-Type` (`application/json` or
//! `application/a2a+json`).
//!
//! axum cannot route a parameter with a static suffix (`{id}:cancel`), so
//! `/tasks/{task}` takes the whole segment and splits it on its last `:`.

use axum::Extension;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::json;

use super::error::A2aError;
use super::tasks::Caller;
use super::types::{ListTasksRequest, SendMessageRequest};
use super::{agent_named, check_version, sse};
use crate::http::AppState;
use crate::http::streams::StreamQuota;
use crate::identity::Principal;

/// The caller, once the agent exists and the version is served.
fn caller(
    state: AppState,
    principal: Principal,
    agent: String,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Caller, A2aError> {
    agent_named(&state, &agent)?;
    check_version(headers, query)?;
    Ok(Caller {
        state,
        principal,
        agent,
    })
}

fn body<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, A2aError> {
    serde_json::from_slice(bytes).map_err(|e| A2aError::InvalidParams(format!("the body: {e}")))
}

fn query<T: DeserializeOwned + Default>(query: Option<&str>) -> Result<T, A2aError> {
    // The version travels in the query too; it is not a field.
    let kept: Vec<&str> = query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty() && !p.to_ascii_lowercase().starts_with("a2a-version="))
        .collect();
    if kept.is_empty() {
        return Ok(T::default());
    }
    let uri: axum::http::Uri = format!("/?{}", kept.join("&"))
        .parse()
        .map_err(|_| A2aError::InvalidParams("the query is not valid".into()))?;
    axum::extract::Query::<T>::try_from_uri(&uri)
        .map(|axum::extract::Query(t)| t)
        .map_err(|e| A2aError::InvalidParams(format!("the query: {}", e.body_text())))
}

fn answer<T: serde::Serialize>(result: Result<T, A2aError>) -> Response {
    match result {
        Ok(value) => Json(value).into_response(),
        Err(e) => e.into_response(),
    }
}

pub async fn send(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(agent): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    answer(
        async {
            let caller = caller(state, principal, agent, &headers, q.as_deref())?;
            let request: SendMessageRequest = body(&bytes)?;
            Ok(json!({"task": caller.send_message(request).await?}))
        }
        .await,
    )
}

pub async fn stream(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(quota): Extension<StreamQuota>,
    Path(agent): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let started = async {
        let caller = caller(state, principal, agent, &headers, q.as_deref())?;
        let request: SendMessageRequest = body(&bytes)?;
        let slot = quota.acquire()?;
        Ok::<_, A2aError>((slot, caller.send_streaming(request).await?))
    }
    .await;
    match started {
        Ok((slot, events)) => sse(events, slot, false, |event| event),
        Err(e) => e.into_response(),
    }
}

pub async fn list(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(agent): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    answer(
        async {
            let caller = caller(state, principal, agent, &headers, q.as_deref())?;
            let request: ListTasksRequest = query(q.as_deref())?;
            caller.list_tasks(request).await
        }
        .await,
    )
}

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct GetQuery {
    history_length: Option<i32>,
}

/// `{id}`, `{id}:cancel` or `{id}:subscribe`: the id and the verb.
fn split_verb(segment: &str) -> (&str, Option<&str>) {
    match segment.rsplit_once(':') {
        Some((id, verb)) => (id, Some(verb)),
        None => (segment, None),
    }
}

fn no_route(verb: &str) -> A2aError {
    A2aError::MethodNotFound(format!(":{}", verb.chars().take(32).collect::<String>()))
}

#[allow(clippy::too_many_arguments)] // axum extractors, one per part of the request
async fn task_route(
    state: AppState,
    principal: Principal,
    quota: StreamQuota,
    agent: String,
    segment: String,
    q: Option<String>,
    headers: HeaderMap,
    post: bool,
) -> Response {
    let caller = match caller(state, principal, agent, &headers, q.as_deref()) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let (id, verb) = split_verb(&segment);
    match (verb, post) {
        (None, false) => answer(
            async {
                let GetQuery { history_length } = query(q.as_deref())?;
                caller.get_task(id, history_length).await
            }
            .await,
        ),
        (Some("cancel"), true) => answer(caller.cancel_task(id).await),
        (Some("subscribe"), _) => {
            let started = async {
                let slot = quota.acquire()?;
                Ok::<_, A2aError>((slot, caller.subscribe(id).await?))
            }
            .await;
            match started {
                Ok((slot, events)) => sse(events, slot, true, |event| event),
                Err(e) => e.into_response(),
            }
        }
        (None, true) => no_route("").into_response(),
        (Some(verb), _) => no_route(verb).into_response(),
    }
}

pub async fn task_get(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(quota): Extension<StreamQuota>,
    Path((agent, segment)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    task_route(state, principal, quota, agent, segment, q, headers, false).await
}

pub async fn task_post(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(quota): Extension<StreamQuota>,
    Path((agent, segment)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    task_route(state, principal, quota, agent, segment, q, headers, true).await
}
