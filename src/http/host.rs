//! Open mode answers loopback names only: the guard against DNS rebinding.
//!
//! client ──HTTP──▶ host (open mode: `Host`, WebSocket `Origin`) ──▶ auth ──▶ rate limit ──▶ router
//!                    │ not loopback
//!                    └──▶ 403 FORBIDDEN_HOST
//!
//! A server without API keys binds loopback only and takes every caller as
//! the `default` tenant with admin rights. A web page whose DNS name is made
//! to resolve to 127.0.0.1 would reach it from the visitor's browser under
//! its own name: so while the server is open, every route (`/mcp`
//! included) accepts only `Host` values naming loopback (`localhost`,
//! `127.0.0.1`, `[::1]`, any port) and a WebSocket upgrade whose `Origin`
//! is a page on another host is refused. A browser cannot forge either.
//!
//! Decisions:
//! - **Checked per request** against the live key ring: creating the first
//!   key ends open mode, and from then on keys guard the server and names
//!   are not checked (a keyed server behind a proxy answers any `Host`).
//! - **A request without a `Host`** (HTTP/1.0) is refused in open mode:
//!   nothing says whom it was meant for. HTTP/2 carries it as `:authority`,
//!   read from the URI. Except the health probes: `GET`/`HEAD` `/healthz`
//!   and `/readyz` without any `Host` pass (issue #29): a balancer's plain
//!   `option httpchk GET /readyz` is HTTP/1.0 with no `Host`, and refusing
//!   it marked every node down. They carry no data, and a browser (the
//!   DNS-rebinding attacker) always sends a `Host`, which is still checked.
//! - **The refusal names the fix**: send a loopback `Host`, or create an
//!   API key (a keyed server answers any name).
//! - **Origin only on WebSocket upgrades**: other cross-site requests are
//!   already refused by the `Host` check (the browser sends the page's
//!   name), and a WebSocket is the one a browser opens to any host without
//!   CORS. A missing `Origin` (non-browser clients) passes; `null` does not.
//! - **The same code as `/mcp` had**: rmcp's own check answered 403 with
//!   `BAD_REQUEST`; this one runs first, so `/mcp` and the rest agree.

use axum::extract::{Request, State};
use axum::http::header::{HOST, ORIGIN, UPGRADE};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use crate::error_code::ErrorCode;
use crate::tenants::KeyRing;

/// Middleware: in open mode, 403 `FORBIDDEN_HOST` unless the request names
/// a loopback host (and a WebSocket upgrade comes from a loopback page).
pub async fn loopback_only(State(keys): State<KeyRing>, request: Request, next: Next) -> Response {
    if !keys.is_open() {
        return next.run(request).await;
    }
    let host = request
        .headers()
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    if host.is_none() && is_probe(&request) {
        return next.run(request).await;
    }
    if !host.is_some_and(is_loopback_authority) {
        return ApiError::new(
            ErrorCode::ForbiddenHost,
            "this server runs without API keys and answers only loopback host names (localhost, 127.0.0.1, [::1]): send `Host: localhost`, or create an API key (`cadre keys create`) so that keys guard it and any name is answered",
        )
        .into_response();
    }
    let upgrade = request.headers().contains_key(UPGRADE);
    if upgrade {
        let origin = request.headers().get(ORIGIN).map(|v| v.to_str().ok());
        if let Some(origin) = origin
            && !origin.is_some_and(is_loopback_origin)
        {
            return ApiError::new(
                ErrorCode::ForbiddenHost,
                "this server runs without API keys and takes WebSockets only from loopback pages",
            )
            .into_response();
        }
    }
    next.run(request).await
}

/// A health or readiness probe: `GET`/`HEAD` `/healthz` or `/readyz`.
fn is_probe(request: &Request) -> bool {
    use axum::http::Method;
    matches!(*request.method(), Method::GET | Method::HEAD)
        && matches!(request.uri().path(), "/healthz" | "/readyz")
}

/// `localhost`, `127.0.0.1` or `[::1]`, with or without a port.
pub fn is_loopback_authority(authority: &str) -> bool {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        match rest.split_once(']') {
            Some((inner, port)) => (inner, port),
            None => return false,
        }
    } else {
        authority.split_at(authority.find(':').unwrap_or(authority.len()))
    };
    let port_ok = port.is_empty()
        || port.strip_prefix(':').is_some_and(|p| {
            !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit())
        });
    let host_ok = if authority.starts_with('[') {
        host == "::1"
    } else {
        host.eq_ignore_ascii_case("localhost") || host == "127.0.0.1"
    };
    port_ok && host_ok
}

/// An `Origin` (`http://localhost:3000`) whose host is loopback.
fn is_loopback_origin(origin: &str) -> bool {
    let Some(authority) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    !authority.contains('/') && is_loopback_authority(authority)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_with_any_port_pass_and_others_do_not() {
        for ok in [
            "localhost",
            "LOCALHOST:8080",
            "127.0.0.1",
            "127.0.0.1:3000",
            "[::1]",
            "[::1]:1",
        ] {
            assert!(is_loopback_authority(ok), "{ok}");
        }
        for refused in [
            "evil.example",
            "evil.example:80",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "127.0.0.2",
            "localhost:",
            "localhost:80:80",
            "localhost:8o",
            "[::1",
            "[::2]:80",
            "::1",
            "",
        ] {
            assert!(!is_loopback_authority(refused), "{refused}");
        }
    }

    #[test]
    fn only_loopback_pages_are_loopback_origins() {
        assert!(is_loopback_origin("http://localhost:3000"));
        assert!(is_loopback_origin("https://127.0.0.1"));
        assert!(is_loopback_origin("http://[::1]:8080"));
        assert!(!is_loopback_origin("null"));
        assert!(!is_loopback_origin("http://evil.example"));
        assert!(!is_loopback_origin("http://localhost.evil.example"));
        assert!(!is_loopback_origin("file://localhost"));
    }
}
