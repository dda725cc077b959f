//! The one HTTP client the tests speak to cadre with: a base URL and the
//! key it presents (`Authorization: Bearer <key>`, or none).
//!
//! Request helpers return `(StatusCode, Value)`: the body as JSON, or as a
//! JSON string when it is not JSON (`/metrics`, a plain-text error). They
//! panic when the request cannot be sent; the `try_` forms return the
//! transport error instead, for tests where the server may be gone (a
//! `kill -9`, a load run). [`Client::request`] gives a request builder with
//! the URL and key set, for what the helpers do not cover (headers, event
//! streams); [`send`] reads its answer the same way.

// Compiled into every integration-test crate and into `benches/load.rs`;
// most use only part of it.
#![allow(dead_code)]

use std::time::Duration;

use reqwest::header::AUTHORIZATION;
use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// A cadre server's base URL and the credentials sent with every request.
/// Clones, and clients made with [`Client::with_key`], share connections.
#[derive(Clone, Debug)]
pub struct Client {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The `Authorization` header value: `Bearer <key>` as a rule; a test
    /// about refused credentials may set any other.
    authorization: Option<String>,
    http: reqwest::Client,
}

impl Client {
    /// A client of the server at `base` that presents no key.
    pub fn new(base: &str) -> Client {
        Client {
            base: base.to_owned(),
            authorization: None,
            http: reqwest::Client::new(),
        }
    }

    /// The same client, every request bounded by `timeout` (a hang guard).
    pub fn with_timeout(self, timeout: Duration) -> Client {
        Client {
            http: reqwest::Client::builder()
                .timeout(timeout)
                .build()
                .expect("HTTP client"),
            ..self
        }
    }

    /// The same client connecting from the local address `ip` (a loopback
    /// alias such as 127.0.0.2 is another client address to the server),
    /// every request bounded by `timeout`.
    pub fn with_local_address(self, ip: std::net::IpAddr, timeout: Duration) -> Client {
        Client {
            http: reqwest::Client::builder()
                .local_address(ip)
                .timeout(timeout)
                .build()
                .expect("HTTP client"),
            ..self
        }
    }

    /// This client presenting `key` as `Authorization: Bearer <key>`.
    pub fn with_key(&self, key: &str) -> Client {
        self.with_authorization(format!("Bearer {key}"))
    }

    /// This client sending `value` as its `Authorization` header verbatim.
    pub fn with_authorization(&self, value: String) -> Client {
        Client {
            authorization: Some(value),
            ..self.clone()
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// A request to `path` with this client's credentials, not yet sent.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let request = self.http.request(method, self.url(path));
        match &self.authorization {
            Some(value) => request.header(AUTHORIZATION, value),
            None => request,
        }
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        send(self.request(Method::GET, path)).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        send(self.request(Method::POST, path).json(body)).await
    }

    pub async fn patch(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        send(self.request(Method::PATCH, path).json(body)).await
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        send(self.request(Method::DELETE, path)).await
    }

    /// `body` as is, declared `application/json` (it need not be JSON).
    pub async fn send_raw(&self, method: Method, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
        send(
            self.request(method, path)
                .header("content-type", "application/json")
                .body(body),
        )
        .await
    }

    pub async fn post_raw(&self, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
        self.send_raw(Method::POST, path, body).await
    }

    pub async fn try_get(&self, path: &str) -> Result<(StatusCode, Value), reqwest::Error> {
        try_send(self.request(Method::GET, path)).await
    }

    pub async fn try_post(
        &self,
        path: &str,
        body: &Value,
    ) -> Result<(StatusCode, Value), reqwest::Error> {
        try_send(self.request(Method::POST, path).json(body)).await
    }

    /// A POST on its own task, so the test can go on while it waits. The
    /// answer must be JSON.
    pub fn spawn_post(&self, path: &str, body: Value) -> JoinHandle<(StatusCode, Value)> {
        let request = self.request(Method::POST, path).json(&body);
        tokio::spawn(async move {
            let response = request.send().await.expect("request sent");
            let status = response.status();
            (status, response.json().await.expect("JSON body"))
        })
    }

    /// POSTs a message with `Accept: text/event-stream`; the response as is.
    pub async fn post_streaming(&self, session: &str, content: &str) -> reqwest::Response {
        self.request(Method::POST, &format!("/v1/sessions/{session}/messages"))
            .header("accept", "text/event-stream")
            .json(&json!({ "content": content }))
            .send()
            .await
            .expect("request sent")
    }

    /// Creates a session of `agent`; returns its id.
    pub async fn session(&self, agent: &str) -> String {
        let (status, body) = self.post("/v1/sessions", &json!({"agent": agent})).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["id"].as_str().expect("session id").to_owned()
    }

    /// One message to `session`; the turn's answer as it came.
    pub async fn say(&self, session: &str, content: &str) -> (StatusCode, Value) {
        self.post(
            &format!("/v1/sessions/{session}/messages"),
            &json!({ "content": content }),
        )
        .await
    }
}

/// Sends `request`; its status and body (JSON, or the text as a JSON string).
pub async fn send(request: RequestBuilder) -> (StatusCode, Value) {
    try_send(request).await.expect("request sent, body read")
}

/// [`send`] that returns the transport error instead of panicking.
pub async fn try_send(request: RequestBuilder) -> Result<(StatusCode, Value), reqwest::Error> {
    let response = request.send().await?;
    let status = response.status();
    let text = response.text().await?;
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok((status, body))
}
