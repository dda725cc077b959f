//! Who a request counts against: the key that sent it, or its address.
//!
//! request ──▶ [`Caller::of`] ──▶ rate_limit (a GCRA bucket per caller)
//!                          └──▶ streams (open SSE / WebSocket streams per caller)
//!
//! Both limits key on the same [`Caller`], so it lives here, below both.
//! A verified key counts by its id; everything else by the client's IP,
//! else one anonymous bucket. An unverified `Authorization` value is never
//! a bucket (issue #29): public routes (`/console`, `/openapi.json`,
//! `/docs`) accept any bearer, and keying by the raw token let a caller
//! mint a fresh bucket per request and grow memory with 256 KiB tokens
//! (4,000 requests: 39 -> 1,046 MiB) while skipping the limit. Key ids and
//! addresses are bounded and cannot be minted. So in open mode (loopback
//! only) every local client shares its address's bucket.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, Request};

/// Who a request counts against.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) enum Caller {
    /// A verified key, by its id.
    ApiKey(String),
    Ip(IpAddr),
    Anonymous,
}

impl Caller {
    pub(crate) fn of(request: &Request) -> Caller {
        // Authentication runs first: a verified key is counted by its id,
        // so made-up keys cannot buy fresh buckets (they were refused).
        if let Some(key_id) = request
            .extensions()
            .get::<crate::tenants::Principal>()
            .and_then(|p| p.key_id.clone())
        {
            return Caller::ApiKey(key_id);
        }
        // No verified key (open mode, or a public route): the address.
        match request.extensions().get::<ConnectInfo<SocketAddr>>() {
            Some(ConnectInfo(addr)) => Caller::Ip(addr.ip()),
            None => Caller::Anonymous,
        }
    }

    /// What logs may say about the caller.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Caller::ApiKey(_) => "api_key",
            Caller::Ip(_) => "ip",
            Caller::Anonymous => "anonymous",
        }
    }
}

impl fmt::Debug for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Caller::ApiKey(_) => f.write_str("ApiKey(<redacted>)"),
            Caller::Ip(ip) => write!(f, "Ip({ip})"),
            Caller::Anonymous => f.write_str("Anonymous"),
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::header::AUTHORIZATION;

    use super::*;

    #[test]
    fn an_unverified_bearer_token_is_not_a_bucket_and_never_shown() {
        let request = Request::builder()
            .uri("/console/")
            .header(AUTHORIZATION, "Bearer sk-made-up-1")
            .body(Body::empty())
            .unwrap();
        let caller = Caller::of(&request);
        assert_eq!(caller, Caller::Anonymous);
        let caller = Caller::ApiKey("key-id".into());
        assert_eq!(format!("{caller:?}"), "ApiKey(<redacted>)");
        assert_eq!(caller.kind(), "api_key");
    }
}
