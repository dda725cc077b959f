//! Who a request counts against: the key that sent it, or its address.
//!
//! request ──▶ [`Caller::of`] ──▶ rate_limit (a GCRA bucket per caller)
//!                          └──▶ streams (open SSE / WebSocket streams per caller)
//!
//! Both limits key on the same [`Caller`], so it lives here, below both.
//! A verified key counts by its id; with the server open, a bearer token is
//! still a bucket; otherwise the client's IP, else one anonymous bucket. The
//! key is never shown: `Debug` redacts it and logs name only its kind.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, Request};
use axum::http::header::AUTHORIZATION;

/// Who a request counts against.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) enum Caller {
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
        // No verified key: the server runs open (loopback only), where a
        // bearer token is still a useful bucket; with keys configured,
        // requests without a valid one were refused before this layer.
        if let Some(key) = request
            .headers()
            .get(AUTHORIZATION)
            .and_then(|value| bearer_token(value.as_bytes()))
        {
            return Caller::ApiKey(key.to_owned());
        }
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

/// The token of `Bearer <token>` (scheme case-insensitive), if non-empty.
fn bearer_token(value: &[u8]) -> Option<&str> {
    let value = std::str::from_utf8(value).ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use axum::body::Body;

    use super::*;

    const SECRET: &str = "sk-live-very-secret";

    fn with_key(key: &str) -> Request {
        Request::builder()
            .uri("/ping")
            .header(AUTHORIZATION, format!("Bearer {key}"))
            .body(Body::empty())
            .unwrap()
    }

    #[test]
    fn the_bearer_token_is_read_case_insensitively_and_never_shown() {
        assert_eq!(bearer_token(b"Bearer abc"), Some("abc"));
        assert_eq!(bearer_token(b"bearer  abc "), Some("abc"));
        assert_eq!(bearer_token(b"Bearer "), None);
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"abc"), None);
        let caller = Caller::of(&with_key(SECRET));
        assert_eq!(caller, Caller::ApiKey(SECRET.into()));
        assert_eq!(format!("{caller:?}"), "ApiKey(<redacted>)");
        assert_eq!(caller.kind(), "api_key");
    }
}
