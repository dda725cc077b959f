//! The HTTP API's own rate limit: requests per second per caller, checked
//! before any handler runs.
//!
//! client ──HTTP──▶ rate_limit ──▶ router ──▶ sessions.rs / tools.rs ...
//!                      │ no cell left
//!                      └──▶ 429 RATE_LIMITED + Retry-After
//!
//! This guards the server, not tools: per-tool, per-user limits are the
//! executor's (`executor::limits`). One GCRA limiter (governor), keyed by
//! caller, `per_second` cells a second with a burst of `burst`
//! ([`ApiLimitConfig`], default 50/s, burst 100).
//!
//! Decisions:
//! - **Who the caller is** ([`Caller`]): a verified key by its id (the
//!   authentication layer runs first); any other request, on any route,
//!   public ones (`/console`, `/openapi.json`, `/docs`) included, by the
//!   client's IP from `ConnectInfo<SocketAddr>` (serve with
//!   `into_make_service_with_connect_info::<SocketAddr>()`); else one shared
//!   "anonymous" bucket. A made-up bearer token is never a bucket of its
//!   own, so it neither buys a fresh bucket nor costs memory.
//! - **The key stays secret.** It is kept in memory as the limiter's map key
//!   but its `Debug` is redacted, and neither logs nor the 429 body mention
//!   it; logs name only the kind of caller.
//! - **Retry-After** is the wait in whole seconds, rounded up, at least 1, so a
//!   client that honours it is not refused again for being early.
//! - **WebSocket frames are requests.** The middleware hands the handler a
//!   [`RequestBudget`] of the same caller; the visitor WebSocket takes a
//!   cell per frame from it, so one upgraded socket cannot act faster than
//!   the requests it replaces (over it: an `error` frame, `RATE_LIMITED`).
//! - **Health probes are never limited.** `/healthz` and `/readyz` pass
//!   without taking a cell: behind a load balancer every probe shares one
//!   address, and a probe answered 429 takes a healthy server out of
//!   rotation. They read no data and cost next to nothing.
//! - **Per node, in cluster mode too.** Each node keeps its own buckets:
//!   the limit protects the node that does the work, like a connection
//!   cap, and checking it costs no round trip to Redis on every request.
//!   A caller spread over N nodes may send up to N times the rate in all;
//!   what must hold cluster-wide is shared (the tools' per-user limits and
//!   concurrency in Redis, tenants' quotas and budgets in the store), and
//!   HAProxy can cap a client address in front of every node.
//! - **Bounded state.** One entry per caller seen; [`ApiRateLimit::retain_recent`]
//!   drops callers whose bucket is full again and should run periodically.

use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::http::header::RETRY_AFTER;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::Quota;
use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use serde::Deserialize;

use super::caller::Caller;
use super::error::ApiError;
use crate::error_code::ErrorCode;

/// `[http.rate_limit]`-style settings: the sustained rate and the burst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiLimitConfig {
    /// Requests per second a caller may sustain.
    pub per_second: u32,
    /// Requests a caller may send at once after being idle.
    pub burst: u32,
    /// Streams (SSE and WebSockets) a caller may hold open at once
    /// ([`super::streams`]).
    pub max_streams: u32,
    /// Wrong keys an address may present at once before it is answered
    /// 429 ([`super::auth_limit`]).
    pub failed_auth_burst: u32,
    /// Wrong keys forgiven per minute once that budget is spent.
    pub failed_auth_per_minute: u32,
}

impl Default for ApiLimitConfig {
    fn default() -> Self {
        ApiLimitConfig {
            per_second: 50,
            burst: 100,
            max_streams: 32,
            failed_auth_burst: 10,
            failed_auth_per_minute: 10,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiLimitConfigError {
    #[error("the API rate limit's per_second must be at least 1")]
    ZeroRate,
    #[error("the API rate limit's burst must be at least 1")]
    ZeroBurst,
    #[error("api_limit.failed_auth_burst and failed_auth_per_minute must be at least 1")]
    ZeroFailedAuth,
}

impl ApiLimitConfig {
    /// The governor quota; a zero rate or burst is a configuration error.
    pub fn quota(&self) -> Result<Quota, ApiLimitConfigError> {
        let rate = NonZeroU32::new(self.per_second).ok_or(ApiLimitConfigError::ZeroRate)?;
        let burst = NonZeroU32::new(self.burst).ok_or(ApiLimitConfigError::ZeroBurst)?;
        Ok(Quota::per_second(rate).allow_burst(burst))
    }

    /// The failed-authentication budget per address.
    pub fn failed_auths(&self) -> Result<super::auth_limit::FailedAuths, ApiLimitConfigError> {
        let burst =
            NonZeroU32::new(self.failed_auth_burst).ok_or(ApiLimitConfigError::ZeroFailedAuth)?;
        let per_minute = NonZeroU32::new(self.failed_auth_per_minute)
            .ok_or(ApiLimitConfigError::ZeroFailedAuth)?;
        Ok(super::auth_limit::FailedAuths::new(burst, per_minute))
    }
}

type Keyed<C> = governor::RateLimiter<
    Caller,
    DefaultKeyedStateStore<Caller>,
    C,
    NoOpMiddleware<<C as Clock>::Instant>,
>;

/// The API's limiter, shared by every request: the state of
/// [`axum::middleware::from_fn_with_state`] for [`limit`].
pub struct ApiRateLimit<C: Clock = DefaultClock> {
    callers: Arc<Keyed<C>>,
    /// Open event streams per caller.
    streams: super::streams::StreamLimit,
}

impl<C: Clock> Clone for ApiRateLimit<C> {
    fn clone(&self) -> Self {
        ApiRateLimit {
            callers: Arc::clone(&self.callers),
            streams: self.streams.clone(),
        }
    }
}

impl ApiRateLimit<DefaultClock> {
    pub fn new(config: &ApiLimitConfig) -> Result<Self, ApiLimitConfigError> {
        Self::with_clock(config, DefaultClock::default())
    }
}

impl<C: Clock> ApiRateLimit<C> {
    /// A limiter on `clock`; tests pass governor's `FakeRelativeClock`.
    pub fn with_clock(config: &ApiLimitConfig, clock: C) -> Result<Self, ApiLimitConfigError> {
        Ok(ApiRateLimit {
            callers: Arc::new(governor::RateLimiter::dashmap_with_clock(
                config.quota()?,
                clock,
            )),
            streams: super::streams::StreamLimit::new(config.max_streams as usize),
        })
    }

    /// Forgets callers whose burst is whole again. Call periodically: state
    /// otherwise grows with every key and address seen.
    pub fn retain_recent(&self) {
        self.callers.retain_recent();
        self.callers.shrink_to_fit();
    }

    /// The open event streams of every caller.
    pub fn streams(&self) -> &super::streams::StreamLimit {
        &self.streams
    }

    /// Callers with state.
    pub fn tracked_callers(&self) -> usize {
        self.callers.len()
    }

    /// Takes a cell for `caller`, or says how long until one is free.
    fn check(&self, caller: &Caller) -> Result<(), Duration> {
        self.callers
            .check_key(caller)
            .map_err(|not_until| not_until.wait_time_from(self.callers.clock().now()))
    }
}

impl<C: Clock> fmt::Debug for ApiRateLimit<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiRateLimit")
            .field("callers", &self.callers.len())
            .finish()
    }
}

/// The request's caller's cells, for a handler that acts on more than one
/// message per request (the WebSocket's frames): a request extension.
#[derive(Clone)]
pub struct RequestBudget(Arc<dyn Fn() -> Result<(), Duration> + Send + Sync>);

impl RequestBudget {
    /// Takes a cell, or 429 `RATE_LIMITED` saying when one is free.
    pub fn take(&self) -> Result<(), ApiError> {
        (self.0)().map_err(|wait| {
            ApiError::new(
                ErrorCode::RateLimited,
                format!("too many requests; retry in {} s", retry_after_secs(wait)),
            )
        })
    }
}

/// Middleware: passes the request on if its caller has a cell, else answers
/// 429 `RATE_LIMITED` with `Retry-After`. The request carries its caller's
/// [`super::streams::StreamQuota`] for SSE and WebSocket handlers, and its
/// [`RequestBudget`].
pub async fn limit<C>(
    State(limits): State<ApiRateLimit<C>>,
    mut request: Request,
    next: Next,
) -> Response
where
    C: Clock + Send + Sync + 'static,
{
    if is_health_probe(request.uri().path()) {
        return next.run(request).await;
    }
    let caller = Caller::of(&request);
    match limits.check(&caller) {
        Ok(()) => {
            let quota = limits.streams.quota(caller.clone());
            request.extensions_mut().insert(quota);
            let budget = limits.clone();
            request
                .extensions_mut()
                .insert(RequestBudget(Arc::new(move || budget.check(&caller))));
            next.run(request).await
        }
        Err(wait) => {
            tracing::debug!(
                caller = caller.kind(),
                retry_after_s = retry_after_secs(wait),
                "API rate limit reached"
            );
            too_many_requests("too many requests", wait)
        }
    }
}

fn is_health_probe(path: &str) -> bool {
    path == "/healthz" || path == "/readyz"
}

/// 429 `RATE_LIMITED`: `{what}; retry in N s`, with `Retry-After: N`.
pub(super) fn too_many_requests(what: &str, wait: Duration) -> Response {
    let seconds = retry_after_secs(wait);
    let mut response = ApiError::new(
        ErrorCode::RateLimited,
        format!("{what}; retry in {seconds} s"),
    )
    .into_response();
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(seconds));
    response
}

/// Whole seconds, rounded up, at least 1.
fn retry_after_secs(wait: Duration) -> u64 {
    let seconds = wait.as_nanos().div_ceil(1_000_000_000).max(1);
    u64::try_from(seconds).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use axum::Router;
    use axum::body::Body;
    use axum::extract::ConnectInfo;
    use axum::http::StatusCode;
    use axum::http::header::AUTHORIZATION;
    use axum::routing::get;
    use governor::clock::FakeRelativeClock;
    use serde_json::Value;
    use tower::ServiceExt;

    use super::*;

    const SECRET: &str = "sk-live-very-secret";

    fn app(
        per_second: u32,
        burst: u32,
    ) -> (Router, FakeRelativeClock, ApiRateLimit<FakeRelativeClock>) {
        let clock = FakeRelativeClock::default();
        let config = ApiLimitConfig {
            per_second,
            burst,
            ..ApiLimitConfig::default()
        };
        let limits = ApiRateLimit::with_clock(&config, clock.clone()).unwrap();
        let router = Router::new()
            .route("/ping", get(|| async { "pong" }))
            .layer(axum::middleware::from_fn_with_state(limits.clone(), limit));
        (router, clock, limits)
    }

    /// A request whose key the authentication layer verified (its id is
    /// `key`), as the limiter sees it behind that layer.
    fn with_key(key: &str) -> Request {
        let mut request = Request::builder()
            .uri("/ping")
            .header(AUTHORIZATION, format!("Bearer {key}"))
            .body(Body::empty())
            .unwrap();
        request.extensions_mut().insert(crate::identity::Principal {
            key_id: Some(key.to_string()),
            ..crate::identity::Principal::open()
        });
        request
    }

    #[tokio::test]
    async fn made_up_bearer_tokens_are_not_buckets() {
        let (router, _clock, limits) = app(1, 1);
        for i in 0..3 {
            let mut request = from_ip([10, 0, 0, 9]);
            request.headers_mut().insert(
                AUTHORIZATION,
                format!("Bearer made-up-{i}").parse().unwrap(),
            );
            let expected = if i == 0 {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            assert_eq!(send(&router, request).await.0, expected);
        }
        assert_eq!(limits.tracked_callers(), 1);
    }

    fn from_ip(ip: [u8; 4]) -> Request {
        let mut request = Request::builder().uri("/ping").body(Body::empty()).unwrap();
        request
            .extensions_mut()
            .insert(ConnectInfo(SocketAddr::from((ip, 40_000))));
        request
    }

    fn anonymous() -> Request {
        Request::builder().uri("/ping").body(Body::empty()).unwrap()
    }

    async fn send(router: &Router, request: Request) -> (StatusCode, Option<String>, Value) {
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_owned());
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, retry_after, body)
    }

    #[tokio::test]
    async fn a_burst_passes_then_429_with_retry_after_and_no_key_in_the_body() {
        let (router, _clock, _limits) = app(1, 3);
        for _ in 0..3 {
            let (status, retry_after, _) = send(&router, with_key(SECRET)).await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(retry_after, None);
        }
        let (status, retry_after, body) = send(&router, with_key(SECRET)).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(retry_after.as_deref(), Some("1"));
        assert_eq!(body["error"]["code"], "RATE_LIMITED");
        assert_eq!(body["error"]["message"], "too many requests; retry in 1 s");
        assert!(!body.to_string().contains(SECRET));
    }

    #[tokio::test]
    async fn keys_are_limited_apart() {
        let (router, _clock, _limits) = app(1, 1);
        assert_eq!(send(&router, with_key("key-a")).await.0, StatusCode::OK);
        assert_eq!(
            send(&router, with_key("key-a")).await.0,
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(send(&router, with_key("key-b")).await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn a_refused_caller_passes_again_once_a_cell_is_back() {
        let (router, clock, _limits) = app(2, 2);
        for _ in 0..2 {
            assert_eq!(send(&router, with_key(SECRET)).await.0, StatusCode::OK);
        }
        clock.advance(Duration::from_millis(200));
        let (status, retry_after, _) = send(&router, with_key(SECRET)).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        // 300 ms to go, rounded up to a whole second.
        assert_eq!(retry_after.as_deref(), Some("1"));
        clock.advance(Duration::from_millis(300));
        assert_eq!(send(&router, with_key(SECRET)).await.0, StatusCode::OK);
    }

    #[tokio::test]
    async fn callers_without_a_key_are_limited_by_address_or_together() {
        let (router, _clock, limits) = app(1, 1);
        assert_eq!(
            send(&router, from_ip([10, 0, 0, 1])).await.0,
            StatusCode::OK
        );
        assert_eq!(
            send(&router, from_ip([10, 0, 0, 1])).await.0,
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            send(&router, from_ip([10, 0, 0, 2])).await.0,
            StatusCode::OK
        );

        assert_eq!(send(&router, anonymous()).await.0, StatusCode::OK);
        assert_eq!(
            send(&router, anonymous()).await.0,
            StatusCode::TOO_MANY_REQUESTS
        );
        // A key counts apart from the address it comes from.
        let mut keyed = with_key("key-a");
        keyed
            .extensions_mut()
            .insert(ConnectInfo(SocketAddr::from(([10, 0, 0, 1], 40_000))));
        assert_eq!(send(&router, keyed).await.0, StatusCode::OK);
        assert_eq!(limits.tracked_callers(), 4);
    }

    #[tokio::test]
    async fn retain_recent_forgets_callers_whose_burst_is_whole() {
        let (router, clock, limits) = app(10, 5);
        send(&router, with_key("key-a")).await;
        send(&router, with_key("key-b")).await;
        assert_eq!(limits.tracked_callers(), 2);
        clock.advance(Duration::from_secs(1));
        limits.retain_recent();
        assert_eq!(limits.tracked_callers(), 0);
    }

    #[tokio::test]
    async fn the_default_limiter_plugs_into_a_router_as_is() {
        let limits = ApiRateLimit::new(&ApiLimitConfig::default()).unwrap();
        let router: Router = Router::new()
            .route("/ping", get(|| async { "pong" }))
            .layer(axum::middleware::from_fn_with_state(limits, limit));
        assert_eq!(send(&router, with_key(SECRET)).await.0, StatusCode::OK);

        fn shared<T: Send + Sync + 'static>() {}
        shared::<ApiRateLimit>();
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1_001)), 2);
    }

    #[test]
    fn config_defaults_to_50_per_second_burst_100_and_rejects_zero_and_unknown_fields() {
        let config: ApiLimitConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(
            config,
            ApiLimitConfig {
                per_second: 50,
                burst: 100,
                max_streams: 32,
                failed_auth_burst: 10,
                failed_auth_per_minute: 10,
            }
        );
        let config: ApiLimitConfig = serde_json::from_str(r#"{"burst": 10}"#).unwrap();
        assert_eq!((config.per_second, config.burst), (50, 10));
        assert!(serde_json::from_str::<ApiLimitConfig>(r#"{"per_minute": 1}"#).is_err());
        let zero = ApiLimitConfig {
            per_second: 0,
            burst: 1,
            ..ApiLimitConfig::default()
        };
        assert_eq!(
            ApiRateLimit::new(&zero).unwrap_err(),
            ApiLimitConfigError::ZeroRate
        );
        let zero = ApiLimitConfig {
            per_second: 1,
            burst: 0,
            ..ApiLimitConfig::default()
        };
        assert_eq!(
            ApiRateLimit::new(&zero).unwrap_err(),
            ApiLimitConfigError::ZeroBurst
        );
        assert!(ApiRateLimit::new(&ApiLimitConfig::default()).is_ok());
    }
}
