//! The browser console: static files compiled into the binary, served
//! under `/console/`.
//!
//! browser ──GET /console/…──▶ host ──▶ auth (public: no data) ──▶ rate limit ──▶ here (bytes from the binary)
//! browser (console JS) ──fetch, `Authorization: Bearer` from session storage──▶ the public v1 API
//!
//! The console is plain ES modules, HTML and CSS under `console/` at the
//! repository root, taken in with `include_bytes!`: no build step, no CDN,
//! nothing fetched at run time. Everything it shows comes from the v1 API
//! with the key the user typed, so what a key cannot read through the API
//! the console cannot show either; this module serves files and nothing
//! else (no route only the console uses).
//!
//! Decisions:
//! - **Public like `/docs`** ([`super::openapi::is_public`]): the files hold
//!   no data, and the page must load before it has a key to ask for one.
//!   They stay behind the open mode's loopback `Host` check and the API's
//!   rate limit.
//! - **`/console` redirects to `/console/`** (308): the modules import each
//!   other by relative path, which resolves against the directory.
//! - **Caching: `ETag` + `Cache-Control: no-cache`**, not hash-versioned
//!   paths. The modules import each other by fixed names (`./api.js`), so
//!   versioned names would mean rewriting imports at build time, which is
//!   the build step we do without. The tag is the SHA-256 of the file's
//!   bytes, computed once; the browser revalidates every load and gets a
//!   bodiless 304 while the binary is unchanged, and the new files the
//!   moment it is replaced.
//! - **Content-Security-Policy restricted to self**: scripts, styles,
//!   images and connections from this origin only, no inline script or
//!   style, no framing (`frame-ancestors 'none'`), no `<base>` or plugins.
//!   With `X-Content-Type-Options: nosniff` and `Referrer-Policy:
//!   no-referrer`: a key typed into the page never leaves it in a URL.

use std::sync::LazyLock;

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

use super::error::ApiError;
use crate::error_code::ErrorCode;

/// Where the console is served (and everything under it).
pub const CONSOLE_PATH: &str = "/console";

/// What the console's pages may load and connect to: this origin only.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
    style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
    base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// One file of the console: its name under `/console/`, type and bytes.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

macro_rules! asset {
    ($name:literal, $type:expr) => {
        Asset {
            name: $name,
            content_type: $type,
            bytes: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../console/", $name)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

/// Every file the console has; `index.html` is also `/console/`.
const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("console.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("dom.js", JS),
    asset!("sessions.js", JS),
    asset!("conversation.js", JS),
    asset!("workflows.js", JS),
    asset!("schedules.js", JS),
    asset!("memory.js", JS),
    asset!("tools.js", JS),
    asset!("live.js", JS),
    asset!("schema_form.js", JS),
];

/// Each asset's `ETag` (quoted SHA-256 prefix of its bytes), by index.
static ETAGS: LazyLock<Vec<HeaderValue>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|a| {
            let digest = Sha256::digest(a.bytes);
            let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
            HeaderValue::from_str(&format!("\"{hex}\"")).expect("hex is a header value")
        })
        .collect()
});

/// Whether `path` is one of the console's (public: they hold no data).
pub fn is_console(path: &str) -> bool {
    path == CONSOLE_PATH || path.starts_with("/console/")
}

/// `/console` (redirect), `/console/` (the page) and `/console/{file}`.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            CONSOLE_PATH,
            get(|| async { Redirect::permanent("/console/") }),
        )
        .route(
            "/console/",
            get(|headers: HeaderMap| async move { serve("index.html", &headers) }),
        )
        .route(
            "/console/{file}",
            get(|Path(file): Path<String>, headers: HeaderMap| async move {
                serve(&file, &headers)
            }),
        )
}

fn serve(name: &str, headers: &HeaderMap) -> Response {
    let Some(index) = ASSETS.iter().position(|a| a.name == name) else {
        return ApiError::new(ErrorCode::NotFound, "no such console file").into_response();
    };
    let asset = &ASSETS[index];
    let etag = &ETAGS[index];
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim() == "*" || t.trim().trim_start_matches("W/") == etag)
        });
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(asset.content_type),
            )],
            asset.bytes,
        )
            .into_response()
    };
    let h = response.headers_mut();
    h.insert(header::ETAG, etag.clone());
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_has_a_distinct_name_and_a_body() {
        for (i, a) in ASSETS.iter().enumerate() {
            assert!(!a.bytes.is_empty(), "{} is empty", a.name);
            assert!(
                ASSETS[i + 1..].iter().all(|b| b.name != a.name),
                "{} twice",
                a.name
            );
        }
    }

    #[test]
    fn a_matching_if_none_match_is_answered_304_without_a_body() {
        let mut headers = HeaderMap::new();
        let etag = ETAGS[0].clone();
        headers.insert(header::IF_NONE_MATCH, etag.clone());
        let response = serve("index.html", &headers);
        assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(response.headers()[header::ETAG], etag);
        let response = serve("index.html", &HeaderMap::new());
        assert_eq!(response.status(), StatusCode::OK);
    }
}
