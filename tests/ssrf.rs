//! The network tools against local servers: what the SSRF guard refuses,
//! what an allowlist opens, and `fetch_page`'s path policy.
//!
//! Every server here listens on 127.0.0.1. Requests to other addresses
//! (10.x, 169.254.x ...) must be refused by the policy before any connection
//! is attempted; the tests assert the `refused:` text, and use a short
//! timeout so a regression fails fast instead of waiting on the network.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, Redirect};
use axum::routing::{any, get, post};
use cadre::store::Store;
use cadre::tools::builtin::{BuiltinContext, http};
use cadre::tools::{CallerType, ExecutionContext, ToolError, ToolHandler};
use serde_json::{Value, json};

/// A server on 127.0.0.1 that counts the requests it gets.
struct Local {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
}

impl Local {
    async fn spawn(router: Router) -> Local {
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        let router = router.layer(middleware::from_fn(move |req: Request, next: Next| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                next.run(req).await
            }
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        Local { addr, hits }
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// Any request is a hit; the answer does not matter.
async fn victim() -> Local {
    Local::spawn(Router::new().fallback(any(|| async { "reached" }))).await
}

const BIG: usize = 2 << 20;

const PAGE: &str = r#"<!doctype html><html><head><title>Intro &amp; setup</title>
<script>alert("not text")</script><style>p { margin: 0 }</style></head>
<body><nav><a href="/">Home</a> | <a href="/admin">Admin</a></nav>
<h1>Getting started</h1><p>Install   the <b>cadre</b>
binary.</p><h2>Next steps</h2><ul><li>Configure</li><li>Run</li></ul></body></html>"#;

/// The API and site under test; `redirect_to` is where `/redirect` points.
async fn app(redirect_to: String) -> Local {
    let router = Router::new()
        .route(
            "/json",
            get(|| async {
                (
                    [("x-served-by", "test")],
                    axum::Json(json!({"hello": "world"})),
                )
            }),
        )
        .route(
            "/echo",
            post(
                |method: Method, headers: HeaderMap, body: Bytes| async move {
                    let header = |name: &str| {
                        headers
                            .get(name)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_string()
                    };
                    axum::Json(json!({
                        "method": method.as_str(),
                        "content_type": header("content-type"),
                        "trace": header("x-trace"),
                        "body": serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null),
                    }))
                },
            ),
        )
        .route("/big", get(|| async { "a".repeat(BIG) }))
        .route(
            "/fail",
            get(|| async { (StatusCode::SERVICE_UNAVAILABLE, "upstream down") }),
        )
        .route(
            "/missing",
            get(|| async { (StatusCode::NOT_FOUND, axum::Json(json!({"error": "nope"}))) }),
        )
        .route(
            "/redirect",
            get(move || async move { Redirect::to(&redirect_to) }),
        )
        .route("/docs/intro", get(|| async { Html(PAGE) }))
        .route(
            "/docs/moved",
            get(|| async { Redirect::to("/admin/secret") }),
        )
        .route(
            "/docs/renamed",
            get(|| async { Redirect::to("/docs/intro") }),
        )
        .route(
            "/docs/image",
            get(|| async { ([(header::CONTENT_TYPE, "image/png")], vec![0x89u8, b'P']) }),
        )
        .route("/admin/secret", get(|| async { Html("<p>secret</p>") }));
    Local::spawn(router).await
}

struct Tools {
    http_request: Arc<dyn ToolHandler>,
    fetch_page: Arc<dyn ToolHandler>,
    _dir: tempfile::TempDir,
}

fn tools(allowlist: &[String]) -> Tools {
    let dir = tempfile::tempdir().unwrap();
    let ctx = BuiltinContext {
        store: Store::open(dir.path()).unwrap(),
        data_dir: dir.path().join("data"),
        http_allowlist: allowlist.to_vec(),
    };
    let mut entries = http::tools(&ctx);
    let mut take = |name: &str| {
        let at = entries.iter().position(|(d, _)| d.name == name).unwrap();
        entries.remove(at).1
    };
    Tools {
        http_request: take("http_request"),
        fetch_page: take("fetch_page"),
        _dir: dir,
    }
}

fn context(variables: Value) -> ExecutionContext {
    let mut ctx = ExecutionContext::new(CallerType::Direct, "ssrf-test");
    ctx.variables = variables;
    ctx
}

impl Tools {
    async fn request(&self, params: Value) -> Result<Value, ToolError> {
        self.http_request.call(params, &context(Value::Null)).await
    }

    async fn get(&self, url: &str) -> Result<Value, ToolError> {
        self.request(json!({"url": url, "timeout": 2})).await
    }

    async fn fetch(&self, site: &Local, path: &str) -> Result<Value, ToolError> {
        let site = json!({"site": {"base_url": site.url("/"), "allowed_paths": ["/docs"]}});
        self.fetch_page
            .call(json!({"path": path}), &context(site))
            .await
    }
}

/// The refusal message, failing the test on anything else.
fn refused(result: Result<Value, ToolError>) -> String {
    match result {
        Err(ToolError::InvalidInput { message }) if message.starts_with("refused: ") => message,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn local_private_and_metadata_addresses_are_refused_by_default() {
    let server = app(String::new()).await;
    let tools = tools(&[]);
    let port = server.port();
    let cases = [
        (
            format!("http://127.0.0.1:{port}/json"),
            "127.0.0.1 is a loopback address",
        ),
        (
            format!("http://[::1]:{port}/json"),
            "::1 is a loopback address",
        ),
        ("http://10.0.0.1/".into(), "10.0.0.1 is a private address"),
        (
            "http://172.16.0.1/".into(),
            "172.16.0.1 is a private address",
        ),
        (
            "http://192.168.1.1/".into(),
            "192.168.1.1 is a private address",
        ),
        (
            "http://169.254.169.254/latest/meta-data/".into(),
            "169.254.169.254 is a link-local address",
        ),
        (
            format!("http://0.0.0.0:{port}/json"),
            "0.0.0.0 is an unspecified address",
        ),
        (
            format!("http://[::ffff:127.0.0.1]:{port}/json"),
            "::ffff:127.0.0.1 is a loopback address (IPv4-mapped 127.0.0.1)",
        ),
        (
            format!("http://2130706433:{port}/json"),
            "127.0.0.1 is a loopback address",
        ),
        (
            format!("http://0177.0.0.1:{port}/json"),
            "127.0.0.1 is a loopback address",
        ),
        (
            "http://100.64.0.1/".into(),
            "100.64.0.1 is a shared (CGNAT) address",
        ),
        ("http://[fd00::1]/".into(), "fd00::1 is a private address"),
    ];
    for (url, says) in cases {
        let message = refused(tools.get(&url).await);
        assert_eq!(message, format!("refused: {says}"), "{url}");
    }
    assert_eq!(server.hits(), 0);
}

#[tokio::test]
async fn a_name_that_resolves_to_loopback_is_refused_after_resolution() {
    let server = app(String::new()).await;
    let tools = tools(&[]);
    let message = refused(
        tools
            .get(&format!("http://localhost:{}/json", server.port()))
            .await,
    );
    assert!(
        message.starts_with("refused: localhost resolves to ")
            && message.ends_with("which is a loopback address"),
        "{message}"
    );
    assert_eq!(server.hits(), 0);
}

#[tokio::test]
async fn an_allowlisted_host_port_gets_a_real_get_and_post() {
    let server = app(String::new()).await;
    let tools = tools(&[format!("127.0.0.1:{}", server.port())]);

    let got = tools.get(&server.url("/json")).await.unwrap();
    assert_eq!(got["status_code"], 200);
    assert_eq!(got["body"], json!({"hello": "world"}));
    assert_eq!(got["headers"]["x-served-by"], "test");
    assert_eq!(got["headers"]["content-type"], "application/json");
    assert_eq!(got["truncated"], false);

    let posted = tools
        .request(json!({
            "url": server.url("/echo"),
            "method": "POST",
            "headers": {"X-Trace": "t-1"},
            "body": {"n": 1, "tags": ["a"]},
        }))
        .await
        .unwrap();
    assert_eq!(posted["status_code"], 200);
    assert_eq!(
        posted["body"],
        json!({
            "method": "POST",
            "content_type": "application/json",
            "trace": "t-1",
            "body": {"n": 1, "tags": ["a"]},
        })
    );
    assert_eq!(server.hits(), 2);
}

#[tokio::test]
async fn an_allowlisted_name_passes_the_resolver() {
    let server = app(String::new()).await;
    let tools = tools(&[format!("localhost:{}", server.port())]);
    let got = tools
        .get(&format!("http://localhost:{}/json", server.port()))
        .await
        .unwrap();
    assert_eq!(got["body"], json!({"hello": "world"}));
}

#[tokio::test]
async fn allowlisting_one_port_does_not_open_another() {
    let server = app(String::new()).await;
    let other = victim().await;
    let tools = tools(&[
        format!("127.0.0.1:{}", server.port()),
        format!("localhost:{}", server.port()),
    ]);
    let message = refused(tools.get(&other.url("/")).await);
    assert_eq!(message, "refused: 127.0.0.1 is a loopback address");
    let message = refused(
        tools
            .get(&format!("http://localhost:{}/", other.port()))
            .await,
    );
    assert_eq!(
        message,
        format!(
            "refused: localhost is allowlisted only on other ports, not on port {}",
            other.port()
        )
    );
    assert_eq!(other.hits(), 0);
}

#[tokio::test]
async fn a_redirect_to_a_loopback_port_that_is_not_allowlisted_is_refused() {
    let target = victim().await;
    let server = app(target.url("/internal")).await;
    let tools = tools(&[format!("127.0.0.1:{}", server.port())]);
    let message = refused(tools.get(&server.url("/redirect")).await);
    assert_eq!(message, "refused: 127.0.0.1 is a loopback address");
    assert_eq!(server.hits(), 1);
    assert_eq!(target.hits(), 0);
}

#[tokio::test]
async fn a_redirect_to_the_metadata_address_is_refused() {
    let server = app("http://169.254.169.254/latest/meta-data/".into()).await;
    let tools = tools(&[format!("127.0.0.1:{}", server.port())]);
    let message = refused(tools.get(&server.url("/redirect")).await);
    assert_eq!(message, "refused: 169.254.169.254 is a link-local address");
}

#[tokio::test]
async fn an_oversized_response_is_cut_at_one_mebibyte_and_flagged() {
    let server = app(String::new()).await;
    let tools = tools(&[format!("127.0.0.1:{}", server.port())]);
    let got = tools.get(&server.url("/big")).await.unwrap();
    assert_eq!(got["status_code"], 200);
    assert_eq!(got["truncated"], true);
    assert_eq!(
        got["body"].as_str().unwrap().len(),
        http::MAX_RESPONSE_BYTES
    );
}

#[tokio::test]
async fn server_errors_are_transient_and_client_errors_are_results() {
    let server = app(String::new()).await;
    let tools = tools(&[format!("127.0.0.1:{}", server.port())]);

    let err = tools.get(&server.url("/fail")).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(err.to_string().contains("503") && err.to_string().contains("upstream down"));

    let got = tools.get(&server.url("/missing")).await.unwrap();
    assert_eq!(got["status_code"], 404);
    assert_eq!(got["body"], json!({"error": "nope"}));
}

#[tokio::test]
async fn the_model_cannot_set_the_host_header() {
    let server = app(String::new()).await;
    let tools = tools(&[format!("127.0.0.1:{}", server.port())]);
    let err = tools
        .request(json!({"url": server.url("/json"), "headers": {"Host": "metadata.internal"}}))
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::InvalidInput { .. }), "{err:?}");
    assert_eq!(server.hits(), 0);
}

#[tokio::test]
async fn fetch_page_reads_an_allowed_page_as_text() {
    let site = app(String::new()).await;
    let tools = tools(&[format!("127.0.0.1:{}", site.port())]);
    let page = tools.fetch(&site, "/docs/intro").await.unwrap();
    assert_eq!(page["url"], site.url("/docs/intro"));
    assert_eq!(page["title"], "Intro & setup");
    assert_eq!(
        page["text"],
        "# Getting started\n\nInstall the cadre binary.\n\n## Next steps\n\n- Configure\n- Run"
    );
    assert_eq!(page["source_id"], "tool:site:v1");
    assert!(
        page["as_of"]
            .as_str()
            .unwrap()
            .parse::<jiff::Timestamp>()
            .is_ok()
    );
    assert_eq!(page["truncated"], false);
}

#[tokio::test]
async fn fetch_page_follows_a_redirect_that_stays_in_the_allowed_paths() {
    let site = app(String::new()).await;
    let tools = tools(&[format!("127.0.0.1:{}", site.port())]);
    let page = tools.fetch(&site, "/docs/renamed").await.unwrap();
    assert_eq!(page["url"], site.url("/docs/intro"));
    assert_eq!(page["title"], "Intro & setup");
}

#[tokio::test]
async fn fetch_page_refuses_paths_outside_the_allowed_prefixes() {
    let site = app(String::new()).await;
    let tools = tools(&[format!("127.0.0.1:{}", site.port())]);
    for (path, says) in [
        ("/admin/secret", "outside the site's allowed paths"),
        ("/docsx", "outside the site's allowed paths"),
        ("/docs/../admin/secret", "'..' segment"),
        ("/docs/%2e%2e/admin/secret", "encoded"),
        ("/docs/..%2fadmin/secret", "encoded"),
        ("//evil.example/docs/intro", "starting with a single /"),
        ("http://evil.example/docs/intro", "starting with a single /"),
        ("/docs\\..\\admin", "backslash"),
    ] {
        let message = refused(tools.fetch(&site, path).await);
        assert!(message.contains(says), "{path}: {message}");
    }
    assert_eq!(site.hits(), 0, "refused paths are never requested");
}

#[tokio::test]
async fn fetch_page_does_not_follow_a_redirect_out_of_the_allowed_paths() {
    let site = app(String::new()).await;
    let tools = tools(&[format!("127.0.0.1:{}", site.port())]);
    let message = refused(tools.fetch(&site, "/docs/moved").await);
    assert_eq!(
        message,
        format!(
            "refused: the site redirected to {}, outside its allowed paths",
            site.url("/admin/secret")
        )
    );
    assert_eq!(site.hits(), 1, "only /docs/moved was requested");
}

#[tokio::test]
async fn fetch_page_applies_the_network_policy_to_the_site() {
    let site = app(String::new()).await;
    let tools = tools(&[]);
    let message = refused(tools.fetch(&site, "/docs/intro").await);
    assert_eq!(message, "refused: 127.0.0.1 is a loopback address");
    assert_eq!(site.hits(), 0);
}

#[tokio::test]
async fn fetch_page_without_a_site_says_so() {
    let tools = tools(&[]);
    let err = tools
        .fetch_page
        .call(json!({"path": "/docs"}), &context(Value::Null))
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::Failed { .. }), "{err:?}");
    assert!(err.to_string().contains("no site is configured"), "{err}");
}

#[tokio::test]
async fn fetch_page_refuses_content_that_is_not_a_page() {
    let site = app(String::new()).await;
    let tools = tools(&[format!("127.0.0.1:{}", site.port())]);
    let err = tools.fetch(&site, "/docs/image").await.unwrap_err();
    assert!(err.to_string().contains("image/png"), "{err}");
}
