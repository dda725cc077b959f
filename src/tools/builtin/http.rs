//! Network tools: `http_request` (any public URL) and `fetch_page` (a page of
//! the site the agent serves). Each sends through a [`GuardedClient`], so the
//! SSRF policy of [`super::net_guard`] applies to every hop of both:
//! `http_request`'s client follows redirects through the checked redirect
//! policy; `fetch_page` follows them itself, so it can also hold each hop to
//! the site's allowed paths before requesting it.
//!
//! model ──http_request {url, method, headers, body, timeout}──▶ GuardedClient ──▶ {status_code, headers, body}
//! model ──fetch_page {path}──▶ site policy (ctx.variables.site) ──▶ GuardedClient ──▶ HTML → text
//!
//! Decisions:
//! - Refusals by the network policy or the site's path policy are
//!   `InvalidInput` and start with `refused:`; the model should not retry.
//! - `http_request`: 2xx, 3xx and 4xx are successful results carrying the
//!   status (a 404 or 422 is information the model can act on); 5xx, time-outs
//!   and transport errors are `Transient` (retryable), the 5xx message quoting
//!   the start of the body. The body is parsed as JSON when the content type
//!   says JSON, else returned as text; binary content is replaced by a note.
//!   Bodies are read up to [`MAX_RESPONSE_BYTES`]; beyond that the text is cut
//!   there, `truncated` is `true` and no JSON parse is attempted.
//! - A string `body` is sent verbatim (`text/plain` unless a content type is
//!   given); any other JSON value is sent as JSON. `Host`, `Content-Length`
//!   and hop-by-hop headers may not be set by the model.
//! - A call with an idempotency key (`ctx.idempotency_key`, set for the
//!   calls of a conversation turn) sends it as `Idempotency-Key` with every
//!   method but GET, unless the model set that header itself; the same key
//!   on every attempt, so a server that honours it acts once.
//! - `fetch_page`: the site is `ctx.variables.site = {base_url, allowed_paths}`.
//!   `base_url` gives the origin (scheme, host, port); `path` and the
//!   `allowed_paths` prefixes are absolute paths on it. A prefix matches whole
//!   segments (`/docs` allows `/docs` and `/docs/x`, not `/docsx`); one ending
//!   in `/` matches as a plain prefix. Paths with `.`/`..` segments, encoded
//!   `/`, `\`, `.` or `%`, a scheme or host, backslashes or control characters
//!   are refused before any request; a redirect that leaves the origin or the
//!   allowed paths is refused without being followed (at most
//!   [`MAX_REDIRECTS`] hops, all within one 10 s deadline). 4xx answers are
//!   `Failed`, 5xx `Transient`. The executor caches results for an hour,
//!   keyed on the parameters. Pages are read up to [`MAX_PAGE_BYTES`], reduced to text by
//!   the small reducer below (no HTML crate: we need text, not a DOM) and cut
//!   at [`MAX_PAGE_TEXT_CHARS`] characters (`truncated`).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, LOCATION};
use reqwest::{Method, Response};
use serde_json::{Map, Value, json};
use url::Url;

use super::net_guard::{self, GuardedClient, MAX_REDIRECTS, Redirects, Refused};
use super::{BuiltinContext, ToolEntry};
use crate::tools::{ExecutionContext, SideEffects, ToolDefinition, ToolError, ToolHandler};

/// Largest `http_request` response body read.
pub const MAX_RESPONSE_BYTES: usize = 1 << 20;
/// Largest HTML document `fetch_page` reads.
pub const MAX_PAGE_BYTES: usize = 2 << 20;
/// Longest text `fetch_page` returns.
pub const MAX_PAGE_TEXT_CHARS: usize = 50_000;
/// `fetch_page` results are fresh for an hour (cached by the executor).
pub const PAGE_CACHE_TTL_S: u64 = 3600;
pub const SITE_SOURCE_ID: &str = "tool:site:v1";
/// The header that carries a call's idempotency key to an HTTP upstream
/// (Stripe's name, and the IETF draft's).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

const DEFAULT_TIMEOUT_S: f64 = 30.0;
const MAX_TIMEOUT_S: u64 = 300;
const PAGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Headroom between a handler's own deadline and the executor's.
const GRACE: Duration = Duration::from_secs(5);
/// How much of a 5xx body the error message quotes.
const ERROR_SNIPPET_CHARS: usize = 300;

/// Headers whose value reqwest/hyper computes, or that would let the model
/// address another virtual host than the URL names.
const FORBIDDEN_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
    "proxy-authorization",
];

/// A tool's client; `Err` when the TLS backend could not start, reported on
/// each call rather than panicking at registration.
type Client = Result<GuardedClient, reqwest::Error>;

pub fn tools(ctx: &BuiltinContext) -> Vec<ToolEntry> {
    let build = |redirects| {
        GuardedClient::new(&ctx.http_allowlist, redirects)
            .inspect_err(|e| tracing::error!(error = %e, "cannot build the network tools' client"))
    };
    vec![
        (
            http_request_definition(),
            Arc::new(HttpRequest {
                client: build(Redirects::Checked),
            }),
        ),
        (
            fetch_page_definition(),
            Arc::new(FetchPage {
                client: build(Redirects::Manual),
            }),
        ),
    ]
}

fn usable(client: &Client) -> Result<&GuardedClient, ToolError> {
    client
        .as_ref()
        .map_err(|e| ToolError::failed(format!("the HTTP client is unavailable: {e}")))
}

fn transient(message: impl Into<String>) -> ToolError {
    ToolError::Transient {
        message: message.into(),
    }
}

// ---------------------------------------------------------------- http_request

pub fn http_request_definition() -> ToolDefinition {
    let mut def = ToolDefinition::new(
        "http_request",
        "Send an HTTP request to a public http(s) URL and return the status code, \
         response headers and body (parsed when JSON). Private and local addresses are refused.",
        json!({
            "type": "object",
            "properties": {
                "url": {
                    "type": "string",
                    "description": "Request URL",
                    "pattern": "^https?://",
                    "maxLength": 8192
                },
                "method": {
                    "type": "string",
                    "description": "HTTP method",
                    "enum": ["GET", "POST", "PUT", "DELETE", "PATCH"],
                    "default": "GET"
                },
                "headers": {
                    "type": "object",
                    "description": "Request headers",
                    "additionalProperties": {"type": "string"}
                },
                "body": {
                    "description": "Request body (POST/PUT/PATCH): JSON is sent as JSON, a string as-is"
                },
                "timeout": {
                    "type": "number",
                    "description": "Timeout in seconds",
                    "minimum": 1,
                    "maximum": MAX_TIMEOUT_S,
                    "default": DEFAULT_TIMEOUT_S
                }
            },
            "required": ["url"],
            "additionalProperties": false
        }),
    )
    .with_category("http")
    .with_tags(&["network", "api", "request", "http", "fetch", "url"])
    .with_timeout(Duration::from_secs(MAX_TIMEOUT_S) + GRACE)
    // A POST may act: never repeated on its own.
    .with_side_effects(SideEffects::AtMostOnce);
    def.output = Some(json!({
        "type": "object",
        "properties": {
            "status_code": {"type": "integer"},
            "headers": {"type": "object"},
            "body": {},
            "truncated": {"type": "boolean"}
        }
    }));
    def
}

pub struct HttpRequest {
    /// Follows redirects itself, each hop checked by the network policy.
    client: Client,
}

#[async_trait::async_trait]
impl ToolHandler for HttpRequest {
    async fn call(&self, params: Value, ctx: &ExecutionContext) -> Result<Value, ToolError> {
        let client = usable(&self.client)?;
        let raw_url = params["url"].as_str().unwrap_or_default();
        let url = Url::parse(raw_url)
            .map_err(|e| ToolError::invalid(format!("{raw_url:?} is not a valid URL: {e}")))?;
        let method = parse_method(&params["method"])?;
        let timeout = parse_timeout(&params["timeout"])?;
        let mut headers = parse_headers(&params["headers"])?;
        // The workflow depth guard: a run this request starts is the
        // calling run's child, whatever the caller's params say.
        headers.remove(crate::identity::PARENT_RUN_HEADER);
        if let Some(run) = ctx.workflow_id.as_deref().and_then(|r| r.parse().ok()) {
            headers.insert(crate::identity::PARENT_RUN_HEADER, run);
        }
        // The call's stable key on what may act (not GET), unless the
        // model set one: a server that honours it acts once however often
        // the call is retried or resumed.
        if method != Method::GET
            && !headers.contains_key(IDEMPOTENCY_KEY)
            && let Some(key) = ctx.idempotency_key.as_deref().and_then(|k| k.parse().ok())
        {
            headers.insert(IDEMPOTENCY_KEY, key);
        }

        let mut request = client
            .request(method, url.clone())
            .map_err(|refused| ToolError::invalid(refused.to_string()))?
            .timeout(timeout);
        let has_content_type = headers.contains_key(CONTENT_TYPE);
        request = request.headers(headers);
        match &params["body"] {
            Value::Null => {}
            Value::String(text) => {
                if !has_content_type {
                    request = request.header(CONTENT_TYPE, "text/plain; charset=utf-8");
                }
                request = request.body(text.clone());
            }
            other => {
                if !has_content_type {
                    request = request.header(CONTENT_TYPE, "application/json");
                }
                request = request.body(other.to_string());
            }
        }

        let response = request
            .send()
            .await
            .map_err(|e| transport_error(&e, &url, timeout))?;
        let status = response.status();
        let content_type = content_type_of(&response);
        let headers = headers_json(response.headers());
        let (bytes, truncated) = read_capped(response, MAX_RESPONSE_BYTES)
            .await
            .map_err(|e| transport_error(&e, &url, timeout))?;
        let body = body_value(content_type.as_deref(), &bytes, truncated);

        if status.is_server_error() {
            let snippet: String = match &body {
                Value::String(s) => s.chars().take(ERROR_SNIPPET_CHARS).collect(),
                other => other
                    .to_string()
                    .chars()
                    .take(ERROR_SNIPPET_CHARS)
                    .collect(),
            };
            return Err(transient(format!(
                "HTTP {status} from {}: {snippet}",
                url_for_message(&url)
            )));
        }
        Ok(json!({
            "status_code": status.as_u16(),
            "headers": headers,
            "body": body,
            "truncated": truncated,
        }))
    }
}

fn parse_method(value: &Value) -> Result<Method, ToolError> {
    match value.as_str().unwrap_or("GET") {
        "GET" => Ok(Method::GET),
        "POST" => Ok(Method::POST),
        "PUT" => Ok(Method::PUT),
        "DELETE" => Ok(Method::DELETE),
        "PATCH" => Ok(Method::PATCH),
        other => Err(ToolError::invalid(format!(
            "method {other:?} is not one of GET, POST, PUT, DELETE, PATCH"
        ))),
    }
}

fn parse_timeout(value: &Value) -> Result<Duration, ToolError> {
    let seconds = match value {
        Value::Null => DEFAULT_TIMEOUT_S,
        v => v
            .as_f64()
            .ok_or_else(|| ToolError::invalid("timeout must be a number of seconds"))?,
    };
    if !(1.0..=MAX_TIMEOUT_S as f64).contains(&seconds) {
        return Err(ToolError::invalid(format!(
            "timeout must be between 1 and {MAX_TIMEOUT_S} seconds, not {seconds}"
        )));
    }
    Ok(Duration::from_secs_f64(seconds))
}

fn parse_headers(value: &Value) -> Result<HeaderMap, ToolError> {
    let mut headers = HeaderMap::new();
    let entries = match value {
        Value::Null => return Ok(headers),
        Value::Object(map) => map,
        _ => return Err(ToolError::invalid("headers must be an object of strings")),
    };
    for (name, value) in entries {
        let lower = name.to_ascii_lowercase();
        if FORBIDDEN_HEADERS.contains(&lower.as_str()) {
            return Err(ToolError::invalid(format!(
                "header {name:?} may not be set; it is derived from the URL and body"
            )));
        }
        let value = value
            .as_str()
            .ok_or_else(|| ToolError::invalid(format!("header {name:?} must be a string")))?;
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| ToolError::invalid(format!("{name:?} is not a valid header name")))?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| ToolError::invalid(format!("the value of header {name} is not valid")))?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// Headers as a JSON object; repeated headers are joined with `, `.
fn headers_json(headers: &HeaderMap) -> Value {
    let mut out = Map::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        match out.get_mut(name.as_str()) {
            Some(Value::String(existing)) => {
                existing.push_str(", ");
                existing.push_str(&value);
            }
            _ => {
                out.insert(name.as_str().to_string(), Value::String(value));
            }
        }
    }
    Value::Object(out)
}

fn content_type_of(response: &Response) -> Option<String> {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_ascii_lowercase()
        })
}

fn is_json(content_type: &str) -> bool {
    content_type == "application/json"
        || content_type == "text/json"
        || content_type.ends_with("+json")
}

fn is_textual(content_type: &str) -> bool {
    content_type.starts_with("text/")
        || is_json(content_type)
        || content_type.ends_with("+xml")
        || matches!(
            content_type,
            "application/xml"
                | "application/javascript"
                | "application/x-www-form-urlencoded"
                | "application/x-ndjson"
        )
}

/// The body as the model sees it.
fn body_value(content_type: Option<&str>, bytes: &[u8], truncated: bool) -> Value {
    if let Some(ct) = content_type
        && is_json(ct)
        && !truncated
        && let Ok(value) = serde_json::from_slice(bytes)
    {
        return value;
    }
    match utf8_prefix(bytes, truncated) {
        Some(text) => Value::String(text),
        None if content_type.is_some_and(is_textual) => {
            Value::String(String::from_utf8_lossy(bytes).into_owned())
        }
        None => Value::String(format!(
            "<{} bytes of binary content ({}) omitted>",
            bytes.len(),
            content_type.unwrap_or("no content type")
        )),
    }
}

/// `bytes` as UTF-8; when the read was cut, a character split by the cut is
/// dropped rather than failing the whole body.
fn utf8_prefix(bytes: &[u8], truncated: bool) -> Option<String> {
    match std::str::from_utf8(bytes) {
        Ok(s) => Some(s.to_string()),
        Err(e) if truncated && e.error_len().is_none() => {
            Some(String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned())
        }
        Err(_) => None,
    }
}

/// Reads at most `cap` bytes; `true` when the body was longer.
pub(crate) async fn read_capped(
    mut response: Response,
    cap: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut buf = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = cap - buf.len();
        if chunk.len() > room {
            buf.extend_from_slice(&chunk[..room]);
            return Ok((buf, true));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok((buf, false))
}

/// The URL without query or credentials, for messages.
fn url_for_message(url: &Url) -> String {
    let mut shown = url.clone();
    shown.set_query(None);
    shown.set_fragment(None);
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.to_string()
}

fn transport_error(err: &reqwest::Error, url: &Url, timeout: Duration) -> ToolError {
    if let Some(refused) = net_guard::refusal(err) {
        tracing::warn!(url = %url_for_message(url), %refused, "network tool refused");
        return ToolError::invalid(refused.to_string());
    }
    let target = url_for_message(url);
    if err.is_timeout() {
        return transient(format!(
            "request to {target} timed out after {}s",
            timeout.as_secs_f64()
        ));
    }
    if err.is_builder() {
        return ToolError::invalid(format!(
            "cannot build a request to {target}: {}",
            causes(err)
        ));
    }
    if err.is_redirect() {
        return ToolError::failed(format!("redirect from {target} failed: {}", causes(err)));
    }
    transient(format!("request to {target} failed: {}", causes(err)))
}

/// The error's innermost causes, which say more than reqwest's own message.
fn causes(err: &dyn std::error::Error) -> String {
    let mut parts = vec![err.to_string()];
    let mut next = err.source();
    while let Some(e) = next {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

// ------------------------------------------------------------------ fetch_page

pub fn fetch_page_definition() -> ToolDefinition {
    let mut def = ToolDefinition::new(
        "fetch_page",
        "Read a page of this assistant's website as plain text, by its path \
         (e.g. /docs/getting-started). Only the site's allowed sections can be read.",
        json!({
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "Path of the page on the site, starting with /",
                    "pattern": "^/",
                    "minLength": 1,
                    "maxLength": 2048
                }
            },
            "required": ["path"],
            "additionalProperties": false
        }),
    )
    .with_category("http")
    .with_tags(&["site", "page", "docs", "help", "website", "read"])
    .with_timeout(PAGE_TIMEOUT + GRACE)
    .with_cache_ttl(PAGE_CACHE_TTL_S)
    .with_side_effects(SideEffects::None);
    def.output = Some(json!({
        "type": "object",
        "properties": {
            "url": {"type": "string"},
            "title": {"type": ["string", "null"]},
            "text": {"type": "string"},
            "source_id": {"type": "string"},
            "as_of": {"type": "string"},
            "truncated": {"type": "boolean"}
        }
    }));
    def
}

pub struct FetchPage {
    /// Returns redirects to the handler, which follows only those that stay
    /// within the site's allowed paths.
    client: Client,
}

#[async_trait::async_trait]
impl ToolHandler for FetchPage {
    async fn call(&self, params: Value, ctx: &ExecutionContext) -> Result<Value, ToolError> {
        let client = usable(&self.client)?;
        let site =
            Site::from_variables(&ctx.variables).map_err(|e| ToolError::failed(e.to_string()))?;
        let path = params["path"].as_str().unwrap_or_default();
        let mut url = site
            .url_for(path)
            .map_err(|e| ToolError::invalid(e.to_string()))?;

        let deadline = tokio::time::Instant::now() + PAGE_TIMEOUT;
        let mut hops = 0;
        let response = loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(transient(format!(
                    "fetching {path} timed out after {}s",
                    PAGE_TIMEOUT.as_secs()
                )));
            }
            let response = client
                .request(Method::GET, url.clone())
                .map_err(|refused| ToolError::invalid(refused.to_string()))?
                .timeout(left)
                .header(ACCEPT, "text/html, application/xhtml+xml, text/plain;q=0.8")
                .send()
                .await
                .map_err(|e| transport_error(&e, &url, PAGE_TIMEOUT))?;
            let location = response
                .headers()
                .get(LOCATION)
                .and_then(|v| v.to_str().ok());
            let next = match location {
                Some(location) if response.status().is_redirection() => url
                    .join(location)
                    .map_err(|_| ToolError::failed(format!("{path} redirects to a bad URL")))?,
                _ => break response,
            };
            hops += 1;
            if hops > MAX_REDIRECTS {
                return Err(ToolError::invalid(
                    Refused::TooManyRedirects { max: MAX_REDIRECTS }.to_string(),
                ));
            }
            if !site.allows(&next) {
                return Err(ToolError::invalid(
                    PathRefused::RedirectedOutside {
                        url: url_for_message(&next),
                    }
                    .to_string(),
                ));
            }
            url = next;
        };

        let status = response.status();
        if status.is_server_error() {
            return Err(transient(format!("the site answered {status} for {path}")));
        }
        if !status.is_success() {
            return Err(ToolError::failed(format!(
                "the site answered {status} for {path}"
            )));
        }
        let content_type = content_type_of(&response);
        let (bytes, cut) = read_capped(response, MAX_PAGE_BYTES)
            .await
            .map_err(|e| transport_error(&e, &url, PAGE_TIMEOUT))?;
        let body = utf8_prefix(&bytes, cut)
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
        let page = match content_type.as_deref() {
            None | Some("text/html" | "application/xhtml+xml") => html_text::reduce(&body),
            Some(ct) if ct.starts_with("text/") => html_text::Page {
                title: None,
                text: html_text::tidy(&body),
            },
            Some(ct) => {
                return Err(ToolError::failed(format!(
                    "{path} is {ct}, not a page fetch_page can read"
                )));
            }
        };
        let (text, text_cut) = cut_chars(page.text, MAX_PAGE_TEXT_CHARS);
        Ok(json!({
            "url": url.to_string(),
            "title": page.title,
            "text": text,
            "source_id": SITE_SOURCE_ID,
            "as_of": jiff::Timestamp::now().to_string(),
            "truncated": cut || text_cut,
        }))
    }
}

fn cut_chars(text: String, max: usize) -> (String, bool) {
    match text.char_indices().nth(max) {
        Some((at, _)) => (text[..at].to_string(), true),
        None => (text, false),
    }
}

/// Why a site configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SiteConfigError {
    #[error(
        "fetch_page: no site is configured for this agent (variables.site.base_url is missing)"
    )]
    Missing,
    #[error("fetch_page: the site's base_url {base_url:?} is not an http(s) URL")]
    BadBaseUrl { base_url: String },
    #[error("fetch_page: the site has no allowed_paths (a list of path prefixes starting with /)")]
    NoAllowedPaths,
    #[error("fetch_page: allowed path {prefix:?} does not start with /")]
    BadPrefix { prefix: String },
}

/// Why a requested path is not fetched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathRefused {
    #[error("refused: {path:?} must be a path on the site starting with a single /")]
    NotAPath { path: String },
    #[error("refused: {path:?} names a scheme or host; give a path on the site")]
    SchemeOrHost { path: String },
    #[error("refused: {path:?} contains a control character, whitespace or a backslash")]
    BadCharacter { path: String },
    #[error("refused: {path:?} contains a '.' or '..' segment")]
    Traversal { path: String },
    #[error("refused: {path:?} contains an encoded '/', '\\', '.', '%' or control character")]
    EncodedSeparator { path: String },
    #[error("refused: {path:?} has malformed percent-encoding")]
    BadEncoding { path: String },
    #[error("refused: {path} is outside the site's allowed paths ({allowed})")]
    NotAllowed { path: String, allowed: String },
    #[error("refused: the site redirected to {url}, outside its allowed paths")]
    RedirectedOutside { url: String },
}

/// The site an agent may read: an origin and the path prefixes open on it.
#[derive(Debug, Clone)]
struct Site {
    base: Url,
    /// Normalised through the URL parser, like the paths they are matched to.
    allowed: Vec<String>,
}

impl Site {
    fn from_variables(variables: &Value) -> Result<Site, SiteConfigError> {
        let site = &variables["site"];
        let raw_base = site["base_url"].as_str().ok_or(SiteConfigError::Missing)?;
        let base = Url::parse(raw_base)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
            .ok_or_else(|| SiteConfigError::BadBaseUrl {
                base_url: raw_base.to_string(),
            })?;
        let prefixes = site["allowed_paths"]
            .as_array()
            .filter(|a| !a.is_empty())
            .ok_or(SiteConfigError::NoAllowedPaths)?;
        let mut allowed = Vec::with_capacity(prefixes.len());
        for prefix in prefixes {
            let prefix = prefix.as_str().unwrap_or_default();
            let normalised = prefix
                .starts_with('/')
                .then(|| base.join(prefix).ok())
                .flatten()
                .ok_or_else(|| SiteConfigError::BadPrefix {
                    prefix: prefix.to_string(),
                })?;
            allowed.push(normalised.path().to_string());
        }
        Ok(Site { base, allowed })
    }

    /// The URL of `path` on the site, or why it is refused.
    fn url_for(&self, path: &str) -> Result<Url, PathRefused> {
        let owned = || path.to_string();
        if path
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || c == '\\')
        {
            return Err(PathRefused::BadCharacter { path: owned() });
        }
        let path_part = path.split(['?', '#']).next().unwrap_or_default();
        if !path_part.starts_with('/') || path_part.starts_with("//") {
            return Err(PathRefused::NotAPath { path: owned() });
        }
        if path_part.contains("://") {
            return Err(PathRefused::SchemeOrHost { path: owned() });
        }
        check_escapes(path_part, path)?;
        let traversal = path_part
            .split('/')
            .map(|segment| segment.split(';').next().unwrap_or_default())
            .any(|segment| segment == "." || segment == "..");
        if traversal {
            return Err(PathRefused::Traversal { path: owned() });
        }
        let url = self
            .base
            .join(path)
            .map_err(|_| PathRefused::NotAPath { path: owned() })?;
        if !self.allows(&url) {
            return Err(PathRefused::NotAllowed {
                path: url.path().to_string(),
                allowed: self.allowed.join(", "),
            });
        }
        Ok(url)
    }

    /// Same origin as the base URL, and a path under an allowed prefix.
    fn allows(&self, url: &Url) -> bool {
        url.origin() == self.base.origin()
            && self.allowed.iter().any(|prefix| {
                let path = url.path();
                if prefix.ends_with('/') {
                    path.starts_with(prefix.as_str())
                } else {
                    path == prefix
                        || path
                            .strip_prefix(prefix.as_str())
                            .is_some_and(|rest| rest.starts_with('/'))
                }
            })
    }
}

/// Percent-escapes in `path_part` (of `path`) may not hide separators,
/// dots or a second round of encoding, which servers decode after our checks.
fn check_escapes(path_part: &str, path: &str) -> Result<(), PathRefused> {
    let bytes = path_part.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'%' {
            i += 1;
            continue;
        }
        let decoded = bytes
            .get(i + 1..i + 3)
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok())
            .ok_or_else(|| PathRefused::BadEncoding {
                path: path.to_string(),
            })?;
        if matches!(decoded, b'/' | b'\\' | b'.' | b'%') || decoded < 0x20 || decoded == 0x7f {
            return Err(PathRefused::EncodedSeparator {
                path: path.to_string(),
            });
        }
        i += 3;
    }
    Ok(())
}

/// HTML → readable text: drops scripts, styles, navigation and other
/// non-content elements, keeps headings (as `#` lines), list items (as `- `
/// lines) and paragraph breaks, collapses whitespace, decodes common
/// entities. A tokenizer, not a parser: malformed HTML degrades to text.
mod html_text {
    use super::Cow;

    pub struct Page {
        pub title: Option<String>,
        pub text: String,
    }

    /// Elements whose content is raw text up to their end tag.
    const RAW_TEXT: &[&str] = &["script", "style", "title", "textarea", "xmp"];
    /// Elements dropped with everything inside them.
    const DROPPED: &[&str] = &[
        "nav", "noscript", "template", "svg", "math", "iframe", "object", "canvas", "audio",
        "video", "head",
    ];
    /// Elements without content or end tag.
    const VOID: &[&str] = &[
        "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr",
    ];
    /// Elements set off by a blank line.
    const PARAGRAPH: &[&str] = &[
        "p",
        "ul",
        "ol",
        "dl",
        "table",
        "blockquote",
        "pre",
        "section",
        "article",
        "header",
        "footer",
        "main",
        "aside",
        "figure",
        "form",
        "fieldset",
        "address",
        "details",
        "hr",
    ];
    /// Elements that start a new line.
    const LINE: &[&str] = &[
        "br",
        "div",
        "li",
        "tr",
        "dt",
        "dd",
        "figcaption",
        "summary",
        "caption",
        "option",
        "legend",
    ];

    #[derive(Default)]
    struct Out {
        buf: String,
        /// Newlines owed before the next character.
        breaks: usize,
        space: bool,
        /// Table cell separator owed before the next character.
        cell: bool,
        /// Line prefix (heading marks, list bullet) owed at the next character.
        prefix: Option<String>,
    }

    impl Out {
        fn flush(&mut self) {
            if self.buf.is_empty() {
                // nothing to separate from
            } else if self.breaks > 0 {
                let have = self.buf.len() - self.buf.trim_end_matches('\n').len();
                for _ in have..self.breaks {
                    self.buf.push('\n');
                }
            } else if !self.buf.ends_with('\n') {
                if self.cell {
                    self.buf.push_str(" | ");
                } else if self.space && !self.buf.ends_with(' ') {
                    self.buf.push(' ');
                }
            }
            self.breaks = 0;
            self.space = false;
            self.cell = false;
            if let Some(prefix) = self.prefix.take() {
                self.buf.push_str(&prefix);
            }
        }

        fn text(&mut self, s: &str) {
            for c in s.chars() {
                if c.is_whitespace() {
                    self.space = true;
                } else {
                    self.flush();
                    self.buf.push(c);
                }
            }
        }

        fn preformatted(&mut self, s: &str) {
            if !s.is_empty() {
                self.flush();
                self.buf.push_str(&s.replace("\r\n", "\n"));
            }
        }

        fn block(&mut self, newlines: usize) {
            self.breaks = self.breaks.max(newlines);
        }
    }

    enum Tag {
        /// Comments, doctype, processing instructions, unterminated tags.
        Skip,
        Open {
            name: String,
            self_closing: bool,
        },
        Close {
            name: String,
        },
    }

    /// The tag at the start of `rest` (which starts with `<`) and its length,
    /// or `None` when the `<` is just text.
    fn parse_tag(rest: &str) -> Option<(Tag, usize)> {
        let until = |from: usize, pat: &str| {
            rest[from..]
                .find(pat)
                .map_or(rest.len(), |p| from + p + pat.len())
        };
        if rest.starts_with("<!--") {
            return Some((Tag::Skip, until(4, "-->")));
        }
        if rest.starts_with("<!") || rest.starts_with("<?") {
            return Some((Tag::Skip, until(2, ">")));
        }
        let (closing, name_at) = if rest.starts_with("</") {
            (true, 2)
        } else {
            (false, 1)
        };
        let name_len = rest[name_at..]
            .find(|c: char| !c.is_ascii_alphanumeric() && c != '-')
            .unwrap_or(rest.len() - name_at);
        if name_len == 0 || !rest[name_at..].starts_with(|c: char| c.is_ascii_alphabetic()) {
            return None;
        }
        let name = rest[name_at..name_at + name_len].to_ascii_lowercase();
        // Find the closing '>' outside quoted attribute values.
        let mut quote = None;
        let mut end = None;
        for (i, c) in rest[name_at + name_len..].char_indices() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => quote = Some(c),
                (None, '>') => {
                    end = Some(name_at + name_len + i);
                    break;
                }
                _ => {}
            }
        }
        let Some(end) = end else {
            return Some((Tag::Skip, rest.len()));
        };
        let tag = if closing {
            Tag::Close { name }
        } else {
            let self_closing = rest[..end].trim_end().ends_with('/');
            Tag::Open { name, self_closing }
        };
        Some((tag, end + 1))
    }

    /// Where the raw text of `name` ends (the start of its end tag) and
    /// where the end tag ends.
    fn raw_text_end(rest: &str, name: &str) -> (usize, usize) {
        let end_tag = rest.match_indices("</").map(|(at, _)| at).find(|&at| {
            rest.as_bytes()
                .get(at + 2..at + 2 + name.len())
                .is_some_and(|n| n.eq_ignore_ascii_case(name.as_bytes()))
        });
        match end_tag {
            Some(at) => {
                let close = rest[at..].find('>').map_or(rest.len(), |p| at + p + 1);
                (at, close)
            }
            None => (rest.len(), rest.len()),
        }
    }

    pub fn reduce(html: &str) -> Page {
        let mut out = Out::default();
        let mut title: Option<String> = None;
        let mut first_h1: Option<String> = None;
        let mut h1_start: Option<usize> = None;
        let mut dropped: Vec<String> = Vec::new();
        let mut pre_depth = 0usize;
        let mut list_depth = 0usize;

        let mut i = 0;
        while i < html.len() {
            let rest = &html[i..];
            if rest.starts_with('<')
                && let Some((tag, len)) = parse_tag(rest)
            {
                i += len;
                match tag {
                    Tag::Skip => {}
                    Tag::Open { name, .. } if RAW_TEXT.contains(&name.as_str()) => {
                        let (text_end, close_end) = raw_text_end(&html[i..], &name);
                        if name == "title" && title.is_none() {
                            let text = collapse(&decode_entities(&html[i..i + text_end]));
                            if !text.is_empty() {
                                title = Some(text);
                            }
                        }
                        i += close_end;
                    }
                    Tag::Open { name, self_closing } if !dropped.is_empty() => {
                        if DROPPED.contains(&name.as_str()) && !self_closing {
                            dropped.push(name);
                        }
                    }
                    Tag::Close { name } if !dropped.is_empty() => {
                        if let Some(at) = dropped.iter().rposition(|n| *n == name) {
                            dropped.truncate(at);
                        }
                    }
                    Tag::Open { name, self_closing } => {
                        if DROPPED.contains(&name.as_str()) {
                            if !self_closing && !VOID.contains(&name.as_str()) {
                                dropped.push(name);
                            }
                            continue;
                        }
                        open(&mut out, &name, list_depth);
                        match name.as_str() {
                            "pre" => pre_depth += 1,
                            "ul" | "ol" => list_depth += 1,
                            "h1" if first_h1.is_none() && h1_start.is_none() => {
                                h1_start = Some(out.buf.len());
                            }
                            _ => {}
                        }
                    }
                    Tag::Close { name } => {
                        close(&mut out, &name, list_depth);
                        match name.as_str() {
                            "pre" => pre_depth = pre_depth.saturating_sub(1),
                            "ul" | "ol" => list_depth = list_depth.saturating_sub(1),
                            "h1" => {
                                if let Some(start) = h1_start.take() {
                                    let text = out.buf.get(start..).unwrap_or_default();
                                    let text = text.trim().trim_start_matches('#').trim();
                                    if !text.is_empty() {
                                        first_h1 = Some(text.to_string());
                                    }
                                }
                            }
                            _ => {}
                        }
                    }
                }
                continue;
            }
            let skip_lt = usize::from(rest.starts_with('<'));
            let end = rest[skip_lt..]
                .find('<')
                .map_or(rest.len(), |p| p + skip_lt);
            if dropped.is_empty() {
                let text = decode_entities(&rest[..end]);
                if pre_depth > 0 {
                    out.preformatted(&text);
                } else {
                    out.text(&text);
                }
            }
            i += end;
        }
        Page {
            title: title.or(first_h1),
            text: tidy(&out.buf),
        }
    }

    fn open(out: &mut Out, name: &str, list_depth: usize) {
        if let Some(level) = heading_level(name) {
            out.block(2);
            out.prefix = Some(format!("{} ", "#".repeat(level)));
        } else if name == "li" {
            out.block(1);
            out.prefix = Some(format!("{}- ", "  ".repeat(list_depth.saturating_sub(1))));
        } else if name == "td" || name == "th" {
            out.cell = true;
        } else if matches!(name, "ul" | "ol") && list_depth > 0 {
            // A nested list continues its parent item's list.
            out.block(1);
        } else if PARAGRAPH.contains(&name) {
            out.block(2);
        } else if LINE.contains(&name) {
            out.block(1);
        }
    }

    /// `list_depth` still counts the element being closed.
    fn close(out: &mut Out, name: &str, list_depth: usize) {
        if heading_level(name).is_some() {
            out.prefix = None;
            out.block(2);
        } else if name == "li" || (matches!(name, "ul" | "ol") && list_depth > 1) {
            out.prefix = None;
            out.block(1);
        } else if PARAGRAPH.contains(&name) {
            out.block(2);
        } else if LINE.contains(&name) {
            out.block(1);
        }
    }

    fn heading_level(name: &str) -> Option<usize> {
        match name {
            "h1" => Some(1),
            "h2" => Some(2),
            "h3" => Some(3),
            "h4" => Some(4),
            "h5" => Some(5),
            "h6" => Some(6),
            _ => None,
        }
    }

    fn collapse(s: &str) -> String {
        s.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// Trailing spaces off every line, at most one blank line in a row, no
    /// blank lines at either end.
    pub fn tidy(text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut blank_run = 0;
        for line in text.lines() {
            let line = line.trim_end();
            if line.is_empty() {
                blank_run += 1;
                continue;
            }
            if !out.is_empty() {
                out.push_str(if blank_run > 0 { "\n\n" } else { "\n" });
            }
            blank_run = 0;
            out.push_str(line);
        }
        out
    }

    const ENTITIES: &[(&str, &str)] = &[
        ("amp", "&"),
        ("lt", "<"),
        ("gt", ">"),
        ("quot", "\""),
        ("apos", "'"),
        ("nbsp", "\u{a0}"),
        ("ensp", " "),
        ("emsp", " "),
        ("thinsp", " "),
        ("shy", ""),
        ("ndash", "–"),
        ("mdash", "—"),
        ("hellip", "…"),
        ("lsquo", "‘"),
        ("rsquo", "’"),
        ("sbquo", "‚"),
        ("ldquo", "“"),
        ("rdquo", "”"),
        ("bdquo", "„"),
        ("laquo", "«"),
        ("raquo", "»"),
        ("bull", "•"),
        ("middot", "·"),
        ("copy", "©"),
        ("reg", "®"),
        ("trade", "™"),
        ("euro", "€"),
        ("pound", "£"),
        ("yen", "¥"),
        ("cent", "¢"),
        ("sect", "§"),
        ("para", "¶"),
        ("deg", "°"),
        ("plusmn", "±"),
        ("times", "×"),
        ("divide", "÷"),
        ("frac12", "½"),
        ("frac14", "¼"),
        ("frac34", "¾"),
        ("iexcl", "¡"),
        ("iquest", "¿"),
        ("larr", "←"),
        ("rarr", "→"),
        ("uarr", "↑"),
        ("darr", "↓"),
    ];

    /// Named entities of [`ENTITIES`] and numeric references; anything else
    /// stays as written.
    pub fn decode_entities(s: &str) -> Cow<'_, str> {
        if !s.contains('&') {
            return Cow::Borrowed(s);
        }
        let mut out = String::with_capacity(s.len());
        let mut rest = s;
        while let Some(amp) = rest.find('&') {
            out.push_str(&rest[..amp]);
            rest = &rest[amp..];
            let decoded = rest.as_bytes()[1..]
                .iter()
                .take(33)
                .position(|&b| b == b';')
                .filter(|&semi| semi > 0)
                .and_then(|semi| {
                    let name = &rest[1..1 + semi];
                    entity(name).map(|text| (text, semi + 2))
                });
            match decoded {
                Some((text, len)) => {
                    out.push_str(&text);
                    rest = &rest[len..];
                }
                None => {
                    out.push('&');
                    rest = &rest[1..];
                }
            }
        }
        out.push_str(rest);
        Cow::Owned(out)
    }

    fn entity(name: &str) -> Option<Cow<'static, str>> {
        if let Some(number) = name.strip_prefix('#') {
            let code = match number.strip_prefix(['x', 'X']) {
                Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                None => number.parse().ok()?,
            };
            let c = char::from_u32(code)
                .filter(|&c| c != '\0')
                .unwrap_or(char::REPLACEMENT_CHARACTER);
            return Some(Cow::Owned(c.to_string()));
        }
        ENTITIES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, text)| Cow::Borrowed(*text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site() -> Site {
        Site::from_variables(&json!({
            "site": {
                "base_url": "https://docs.example.com/",
                "allowed_paths": ["/docs", "/blog/", "/faq"]
            }
        }))
        .unwrap()
    }

    #[test]
    fn http_site_paths_under_allowed_prefixes_resolve_on_the_origin() {
        let site = site();
        for (path, url) in [
            ("/docs", "https://docs.example.com/docs"),
            ("/docs/", "https://docs.example.com/docs/"),
            (
                "/docs/intro?lang=en",
                "https://docs.example.com/docs/intro?lang=en",
            ),
            ("/blog/2024/post", "https://docs.example.com/blog/2024/post"),
            ("/faq#shipping", "https://docs.example.com/faq#shipping"),
            ("/docs/caf%C3%A9", "https://docs.example.com/docs/caf%C3%A9"),
            ("/docs/café", "https://docs.example.com/docs/caf%C3%A9"),
        ] {
            assert_eq!(site.url_for(path).unwrap().as_str(), url, "{path}");
        }
    }

    #[test]
    fn http_site_paths_that_escape_are_refused() {
        let site = site();
        for (path, says) in [
            ("/docsevil", "outside the site's allowed paths"),
            ("/blog", "outside the site's allowed paths"),
            ("/admin", "outside the site's allowed paths"),
            ("/", "outside the site's allowed paths"),
            ("/docs/../admin", "'..' segment"),
            ("/docs/..", "'..' segment"),
            ("/docs/./x", "'..' segment"),
            ("/docs/..;/admin", "'..' segment"),
            ("/docs/%2e%2e/admin", "encoded"),
            ("/docs/%2E%2E/admin", "encoded"),
            ("/docs/..%2fadmin", "encoded"),
            ("/docs%2f..%2fadmin", "encoded"),
            ("/docs/%252e%252e/admin", "encoded"),
            ("/docs/%5c..%5cadmin", "encoded"),
            ("/docs/%00", "encoded"),
            ("/docs/%zz", "malformed"),
            ("/docs/%2", "malformed"),
            ("/docs\\..\\admin", "backslash"),
            ("/docs/\n", "control"),
            ("/docs /x", "whitespace"),
            ("docs/intro", "starting with a single /"),
            ("//evil.example/docs", "starting with a single /"),
            ("https://evil.example/docs", "starting with a single /"),
            ("/docs/http://evil.example/", "scheme or host"),
            ("", "starting with a single /"),
        ] {
            let message = site.url_for(path).unwrap_err().to_string();
            assert!(
                message.starts_with("refused: ") && message.contains(says),
                "{path:?}: {message}"
            );
        }
    }

    #[test]
    fn http_site_config_errors_are_clear() {
        let err = |v: Value| Site::from_variables(&v).unwrap_err().to_string();
        assert!(err(Value::Null).contains("no site is configured"));
        assert!(err(json!({"site": {"allowed_paths": ["/"]}})).contains("no site is configured"));
        assert!(
            err(json!({"site": {"base_url": "ftp://x.example/", "allowed_paths": ["/"]}}))
                .contains("not an http(s) URL")
        );
        assert!(
            err(json!({"site": {"base_url": "https://x.example/"}})).contains("no allowed_paths")
        );
        assert!(
            err(json!({"site": {"base_url": "https://x.example/", "allowed_paths": []}}))
                .contains("no allowed_paths")
        );
        assert!(
            err(json!({"site": {"base_url": "https://x.example/", "allowed_paths": ["docs"]}}))
                .contains("does not start with /")
        );
    }

    #[test]
    fn http_redirect_targets_must_stay_on_the_site() {
        let site = site();
        let ok = |u: &str| site.allows(&Url::parse(u).unwrap());
        assert!(ok("https://docs.example.com/docs/moved"));
        assert!(!ok("https://docs.example.com/login"));
        assert!(!ok("http://docs.example.com/docs/x"));
        assert!(!ok("https://docs.example.com:8443/docs/x"));
        assert!(!ok("https://evil.example/docs/x"));
    }

    #[test]
    fn http_html_is_reduced_to_readable_text() {
        let html = r#"<!DOCTYPE html>
<html><head><title>Getting  started &amp; more</title>
<style>body { color: red }</style>
<script>var x = "</div><p>not text</p>"; if (a < b) {}</script></head>
<body>
<nav><ul><li><a href="/">Home</a></li><li>Menu</li></ul></nav>
<header><h1>Welcome to <em>Cadre</em></h1></header>
<main>
<!-- a comment <p>hidden</p> -->
<p>First   paragraph,
spread over   lines.</p>
<p>Second&nbsp;paragraph with &lt;tags&gt;, &quot;quotes&quot;, &#39;apos&#39;, &#x2014; and &mdash;.</p>
<h2>Install</h2>
<ul><li>Download</li><li>Run <code>cadre</code><ul><li>nested</li></ul></li></ul>
<table><tr><th>Plan</th><th>Price</th></tr><tr><td>Free</td><td>0</td></tr></table>
<pre>line one
  indented</pre>
<div>a<br>b</div>
<svg><title>icon</title><text>svg text</text></svg>
<noscript>Enable JavaScript</noscript>
<p>Unknown &bogus; entity and a lone & sign, 3 < 4.</p>
</main>
<footer>© 2025</footer>
</body></html>"#;
        let page = html_text::reduce(html);
        assert_eq!(page.title.as_deref(), Some("Getting started & more"));
        let expected = "\
# Welcome to Cadre

First paragraph, spread over lines.

Second paragraph with <tags>, \"quotes\", 'apos', — and —.

## Install

- Download
- Run cadre
  - nested

Plan | Price
Free | 0

line one
  indented

a
b

Unknown &bogus; entity and a lone & sign, 3 < 4.

© 2025";
        assert_eq!(page.text, expected);
    }

    #[test]
    fn http_title_falls_back_to_the_first_heading() {
        let page = html_text::reduce("<body><h1>Only &amp; heading</h1><p>x</p></body>");
        assert_eq!(page.title.as_deref(), Some("Only & heading"));
        assert_eq!(page.text, "# Only & heading\n\nx");
    }

    #[test]
    fn http_malformed_html_degrades_to_text() {
        assert_eq!(html_text::reduce("a <b c").text, "a");
        assert_eq!(html_text::reduce("<p>x</p><script>never closed").text, "x");
        assert_eq!(html_text::reduce("1 < 2 and <3").text, "1 < 2 and <3");
        assert_eq!(html_text::reduce("<p title='a>b'>ok</p>").text, "ok");
        assert_eq!(
            html_text::reduce("&#0; &#xD800; &#99999999;").text,
            "\u{fffd} \u{fffd} \u{fffd}"
        );
        assert_eq!(html_text::reduce("&#abc; &#;").text, "&#abc; &#;");
        assert_eq!(html_text::reduce("<SCRIPT>x</Script >y").text, "y");
        assert_eq!(html_text::reduce("a &amp b &amp;").text, "a &amp b &");
        assert_eq!(html_text::reduce("").text, "");
    }

    #[test]
    fn http_bodies_are_parsed_by_content_type() {
        assert_eq!(
            body_value(Some("application/json"), br#"{"a":1}"#, false),
            json!({"a": 1})
        );
        assert_eq!(
            body_value(Some("application/problem+json"), br#"[1]"#, false),
            json!([1])
        );
        assert_eq!(
            body_value(Some("application/json"), b"{oops", false),
            json!("{oops")
        );
        assert_eq!(
            body_value(Some("application/json"), br#"{"a":1}"#, true),
            json!(r#"{"a":1}"#)
        );
        assert_eq!(
            body_value(Some("text/plain"), br#"{"a":1}"#, false),
            json!(r#"{"a":1}"#)
        );
        assert_eq!(
            body_value(Some("image/png"), &[0x89, b'P', b'N', b'G', 0xff], false),
            json!("<5 bytes of binary content (image/png) omitted>")
        );
        // A character split by the size cap is dropped, not the whole body.
        assert_eq!(
            body_value(Some("text/plain"), "aé".as_bytes()[..2].as_ref(), true),
            json!("a")
        );
    }

    #[test]
    fn http_parameters_are_checked() {
        assert_eq!(parse_method(&Value::Null).unwrap(), Method::GET);
        assert!(parse_method(&json!("TRACE")).is_err());
        assert_eq!(
            parse_timeout(&Value::Null).unwrap(),
            Duration::from_secs(30)
        );
        assert_eq!(
            parse_timeout(&json!(1.5)).unwrap(),
            Duration::from_millis(1500)
        );
        assert!(parse_timeout(&json!(0.5)).is_err());
        assert!(parse_timeout(&json!(301)).is_err());
        assert!(parse_headers(&json!({"Host": "internal"})).is_err());
        assert!(parse_headers(&json!({"Transfer-Encoding": "chunked"})).is_err());
        assert!(parse_headers(&json!({"X-Num": 1})).is_err());
        assert!(parse_headers(&json!({"bad name": "x"})).is_err());
        assert!(parse_headers(&json!({"X-Bad": "a\nb"})).is_err());
        let ok =
            parse_headers(&json!({"Authorization": "Bearer t", "Accept": "text/csv"})).unwrap();
        assert_eq!(ok.len(), 2);
    }

    #[test]
    fn http_definitions_carry_their_limits() {
        let page = fetch_page_definition();
        assert_eq!(page.cache.unwrap().ttl_seconds, 3600);
        assert_eq!(page.category, "http");
        let request = http_request_definition();
        assert_eq!(request.category, "http");
        assert!(request.timeout.unwrap() > Duration::from_secs(300));
    }
}
