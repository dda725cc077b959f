//! API keys while the server runs, against the real `cadre serve` binary:
//! keys created through `/v1/keys` work on the next request and revoked or
//! expired ones are refused; a key carries its plan and its role (admin,
//! metrics); `/metrics` is for admin and metrics keys; wrong keys are
//! rate limited per client address; the first key created in open mode
//! ends it; `cadre keys … --url` manages keys on a running server and the
//! same commands work on the data dir once it stopped.
//!
//! A test seeds the keys it starts with into the data dir ([`seed`]),
//! then starts the server over it, as an operator would.

mod support;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cadre::tenants::NewKey;
use jiff::{SignedDuration, Timestamp};
use reqwest::header::RETRY_AFTER;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::repo_agents;
use support::server::Server;

/// A data dir (`<tmp>/data`; the server's log goes next to it).
fn data_dir() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let data = tmp.path().join("data");
    (tmp, data)
}

/// Creates the keys in the data dir, as of `now`, and closes the database
/// so the server can open it. Returns the keys in order.
async fn seed(dir: &Path, keys: &[(NewKey, Timestamp)]) -> Vec<String> {
    let store = cadre::store::Store::open(dir).expect("open the data dir");
    let mut out = Vec::new();
    for (new, now) in keys {
        let (key, _) = cadre::tenants::issue_key(&store, new, *now)
            .await
            .expect("key created");
        out.push(key);
    }
    out
}

fn admin_of(tenant: &str) -> NewKey {
    NewKey {
        admin: true,
        ..NewKey::tenant(tenant)
    }
}

/// One client of the server, from one local address.
struct Client {
    base: String,
    http: reqwest::Client,
}

struct Answer {
    status: StatusCode,
    body: Value,
    retry_after: Option<u64>,
}

impl Client {
    fn new(server: &Server) -> Client {
        Client {
            base: server.base.clone(),
            http: reqwest::Client::new(),
        }
    }

    /// A client whose connections come from `addr` (any of 127.0.0.0/8).
    fn from(server: &Server, addr: &str) -> Client {
        let addr: IpAddr = addr.parse().unwrap();
        Client {
            base: server.base.clone(),
            http: reqwest::Client::builder()
                .local_address(addr)
                .build()
                .unwrap(),
        }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
    ) -> Answer {
        self.send_full(method, path, key, body, &[]).await
    }

    async fn send_with(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Answer {
        self.send_full(method, path, key, None, headers).await
    }

    async fn send_full(
        &self,
        method: Method,
        path: &str,
        key: Option<&str>,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> Answer {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("request sent");
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .map(|v| v.to_str().unwrap().parse().expect("whole seconds"));
        let text = response.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Answer {
            status,
            body,
            retry_after,
        }
    }

    async fn get(&self, path: &str, key: Option<&str>) -> Answer {
        self.send(Method::GET, path, key, None).await
    }

    async fn post(&self, path: &str, key: Option<&str>, body: Value) -> Answer {
        self.send(Method::POST, path, key, Some(body)).await
    }

    async fn delete(&self, path: &str, key: Option<&str>) -> Answer {
        self.send(Method::DELETE, path, key, None).await
    }

    /// Creates a key through the API; returns `(key, key_id)`.
    async fn create_key(&self, admin: Option<&str>, body: Value) -> (String, String) {
        let a = self.post("/v1/keys", admin, body).await;
        assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
        (
            a.body["key"].as_str().unwrap().to_string(),
            a.body["key_id"].as_str().unwrap().to_string(),
        )
    }

    /// `GET /v1/keys`, by key id.
    async fn keys(&self, admin: &str) -> serde_json::Map<String, Value> {
        let a = self.get("/v1/keys", Some(admin)).await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
        a.body["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| (k["key_id"].as_str().unwrap().to_string(), k.clone()))
            .collect()
    }
}

fn code(a: &Answer) -> &str {
    a.body["error"]["code"].as_str().unwrap_or("")
}

#[tokio::test]
async fn a_key_created_through_the_api_works_at_once_and_is_refused_once_revoked() {
    let (_tmp, data) = data_dir();
    let [admin, tenant] = <[String; 2]>::try_from(
        seed(
            &data,
            &[
                (admin_of("ops"), Timestamp::now()),
                (NewKey::tenant("globex"), Timestamp::now()),
            ],
        )
        .await,
    )
    .unwrap();
    let server = Server::start_offline(&data, &repo_agents());
    let c = Client::new(&server);

    let (key, id) = c.create_key(Some(&admin), json!({"tenant": "acme"})).await;
    assert!(key.starts_with(&format!("cadre_{id}_")));
    assert_eq!(
        c.get("/v1/sessions", Some(&key)).await.status,
        StatusCode::OK
    );
    let listed = c.keys(&admin).await;
    assert_eq!(listed[&id]["tenant"], "acme");
    assert_eq!(listed[&id]["status"], "active");
    let text = serde_json::to_string(&listed).unwrap();
    assert!(!text.contains(key.rsplit('_').next().unwrap()), "no secret");
    assert!(!text.contains("sha256"), "no hash");

    let revoked = c.delete(&format!("/v1/keys/{id}"), Some(&admin)).await;
    assert_eq!(revoked.status, StatusCode::NO_CONTENT, "{}", revoked.body);
    let refused = c.get("/v1/sessions", Some(&key)).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(refused.body["error"]["message"], "the API key was revoked");
    assert_eq!(c.keys(&admin).await[&id]["status"], "revoked");
    // Revoking again is the same answer; an unknown id is 404.
    let again = c.delete(&format!("/v1/keys/{id}"), Some(&admin)).await;
    assert_eq!(again.status, StatusCode::NO_CONTENT);
    let unknown = c.delete("/v1/keys/no-such-key", Some(&admin)).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(code(&unknown), "KEY_NOT_FOUND");

    // Only admin keys manage keys.
    for a in [
        c.post(
            "/v1/keys",
            Some(&tenant),
            json!({"tenant": "globex", "admin": true}),
        )
        .await,
        c.get("/v1/keys", Some(&tenant)).await,
        c.delete(&format!("/v1/keys/{id}"), Some(&tenant)).await,
    ] {
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{}", a.body);
        assert_eq!(code(&a), "ADMIN_REQUIRED");
    }
}

#[tokio::test]
async fn an_expired_key_is_refused() {
    let (_tmp, data) = data_dir();
    let now = Timestamp::now();
    let expired = NewKey {
        expires_at: Some(now - SignedDuration::from_hours(24)),
        ..NewKey::tenant("acme")
    };
    let later = NewKey {
        expires_at: Some(now + SignedDuration::from_hours(24)),
        ..NewKey::tenant("acme")
    };
    let [admin, expired, later] = <[String; 3]>::try_from(
        seed(
            &data,
            &[
                (admin_of("ops"), now),
                (expired, now - SignedDuration::from_hours(48)),
                (later, now),
            ],
        )
        .await,
    )
    .unwrap();
    let server = Server::start_offline(&data, &repo_agents());
    let c = Client::new(&server);

    let refused = c.get("/v1/sessions", Some(&expired)).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(refused.body["error"]["message"], "the API key has expired");
    assert_eq!(
        c.get("/v1/sessions", Some(&later)).await.status,
        StatusCode::OK
    );
    let statuses: Vec<Value> = c
        .keys(&admin)
        .await
        .values()
        .map(|k| k["status"].clone())
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| *s == "expired").count(),
        1,
        "{statuses:?}"
    );

    // A key cannot be created already expired.
    let past = (now - SignedDuration::from_secs(1)).to_string();
    let a = c
        .post(
            "/v1/keys",
            Some(&admin),
            json!({"tenant": "acme", "expires_at": past}),
        )
        .await;
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", a.body);
    assert_eq!(code(&a), "VALIDATION_ERROR");
}

#[tokio::test]
async fn a_key_carries_its_plan_and_keys_without_one_keep_every_plan() {
    let (_tmp, data) = data_dir();
    let [admin] =
        <[String; 1]>::try_from(seed(&data, &[(admin_of("ops"), Timestamp::now())]).await).unwrap();
    let server = Server::start_offline(&data, &repo_agents());
    let c = Client::new(&server);

    let (free, free_id) = c
        .create_key(Some(&admin), json!({"tenant": "acme", "plan": "free"}))
        .await;
    let (_, pro_id) = c
        .create_key(Some(&admin), json!({"tenant": "acme", "plan": "pro"}))
        .await;
    let (_, any_id) = c.create_key(Some(&admin), json!({"tenant": "acme"})).await;
    let keys = c.keys(&admin).await;
    assert_eq!(keys[&free_id]["plan"], "free");
    assert_eq!(keys[&pro_id]["plan"], "pro");
    assert_eq!(keys[&any_id]["plan"], "premium");
    assert_eq!(
        c.get("/v1/sessions", Some(&free)).await.status,
        StatusCode::OK
    );

    let a = c
        .post(
            "/v1/keys",
            Some(&admin),
            json!({"tenant": "acme", "plan": "gold"}),
        )
        .await;
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", a.body);
}

#[tokio::test]
async fn metrics_needs_an_admin_or_a_metrics_key_and_a_metrics_key_reads_nothing_else() {
    let (_tmp, data) = data_dir();
    let [admin, tenant] = <[String; 2]>::try_from(
        seed(
            &data,
            &[
                (admin_of("ops"), Timestamp::now()),
                (NewKey::tenant("acme"), Timestamp::now()),
            ],
        )
        .await,
    )
    .unwrap();
    let server = Server::start_offline(&data, &repo_agents());
    let c = Client::new(&server);
    let (scrape, _) = c
        .create_key(Some(&admin), json!({"tenant": "ops", "metrics": true}))
        .await;

    let a = c.get("/metrics", Some(&tenant)).await;
    assert_eq!(a.status, StatusCode::FORBIDDEN, "{}", a.body);
    assert_eq!(code(&a), "METRICS_KEY_REQUIRED");
    assert_eq!(
        c.get("/metrics", None).await.status,
        StatusCode::UNAUTHORIZED
    );
    for key in [&admin, &scrape] {
        let a = c.get("/metrics", Some(key)).await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
        assert!(a.body.as_str().unwrap().contains("cadre_tool_concurrent"));
    }

    for path in ["/v1/sessions", "/v1/stats", "/v1/keys", "/v1/tools"] {
        let a = c.get(path, Some(&scrape)).await;
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{path}: {}", a.body);
        assert_eq!(code(&a), "SCRAPE_ONLY_KEY");
    }
    let a = c
        .post("/v1/sessions", Some(&scrape), json!({"agent": "assistant"}))
        .await;
    assert_eq!(code(&a), "SCRAPE_ONLY_KEY");

    let a = c
        .post(
            "/v1/keys",
            Some(&admin),
            json!({"tenant": "ops", "admin": true, "metrics": true}),
        )
        .await;
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", a.body);
}

#[tokio::test]
async fn wrong_keys_from_one_address_get_429_past_the_budget_and_other_addresses_do_not() {
    let (_tmp, data) = data_dir();
    let [key] =
        <[String; 1]>::try_from(seed(&data, &[(NewKey::tenant("acme"), Timestamp::now())]).await)
            .unwrap();
    let server = Server::start_offline(&data, &repo_agents());
    let attacker = Client::from(&server, "127.0.0.2");
    let (id, _) = key.strip_prefix("cadre_").unwrap().split_once('_').unwrap();

    let mut answers = Vec::new();
    for n in 0..50 {
        // Right id, wrong secret: the most a guesser can know.
        let guess = format!("cadre_{id}_{n:048x}");
        answers.push(attacker.get("/v1/sessions", Some(&guess)).await);
    }
    let statuses: Vec<u16> = answers.iter().map(|a| a.status.as_u16()).collect();
    // The default budget: 10 wrong keys, then 429 until one is forgiven (6 s).
    assert_eq!(statuses[..10], [401; 10], "{statuses:?}");
    assert_eq!(statuses[10..], [429; 40], "{statuses:?}");
    for a in &answers[10..] {
        assert_eq!(code(a), "RATE_LIMITED");
        assert!(matches!(a.retry_after, Some(1..=6)), "{:?}", a.retry_after);
    }
    // While blocked, the address's keys are not even checked.
    assert_eq!(
        attacker.get("/v1/sessions", Some(&key)).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );

    // Other addresses are not affected, valid key or not.
    let user = Client::from(&server, "127.0.0.1");
    assert_eq!(
        user.get("/v1/sessions", Some(&key)).await.status,
        StatusCode::OK
    );
    let typo = Client::from(&server, "127.0.0.3");
    assert_eq!(
        typo.get("/v1/sessions", Some("cadre_x_y")).await.status,
        StatusCode::UNAUTHORIZED
    );
    // Requests without a key guess nothing and spend nothing.
    let keyless = Client::from(&server, "127.0.0.4");
    for _ in 0..20 {
        assert_eq!(
            keyless.get("/v1/sessions", None).await.status,
            StatusCode::UNAUTHORIZED
        );
    }
}

/// Issue #29 (fresh attack F7): behind a balancer every client shares
/// the balancer's address, so one client's wrong keys locked every other
/// client out. With `[server] trusted_proxies` a request from the proxy
/// counts as the client its `X-Forwarded-For` names; a client that is not
/// a trusted proxy cannot choose its address by sending the header.
#[tokio::test]
async fn behind_a_trusted_proxy_wrong_keys_block_the_forwarded_client_only() {
    let (_tmp, data) = data_dir();
    let [key] =
        <[String; 1]>::try_from(seed(&data, &[(NewKey::tenant("acme"), Timestamp::now())]).await)
            .unwrap();
    let server = Server::start_offline_with(
        &data,
        &repo_agents(),
        &[("CADRE_SERVER_TRUSTED_PROXIES", r#"["127.0.0.5"]"#)],
    );
    let proxy = Client::from(&server, "127.0.0.5");
    let (id, _) = key.strip_prefix("cadre_").unwrap().split_once('_').unwrap();
    let via = |client: &'static str| {
        let proxy = &proxy;
        move |key: String| async move {
            proxy
                .send_with(
                    Method::GET,
                    "/v1/sessions",
                    Some(&key),
                    &[("x-forwarded-for", client)],
                )
                .await
                .status
        }
    };
    let attacker = via("198.51.100.1, 203.0.113.66");
    let mut statuses = Vec::new();
    for n in 0..12 {
        statuses.push(attacker(format!("cadre_{id}_{n:048x}")).await.as_u16());
    }
    assert_eq!(statuses[..10], [401; 10], "{statuses:?}");
    assert_eq!(statuses[10..], [429; 2], "{statuses:?}");
    // The attacker's forwarded address is blocked, the key not even checked.
    assert_eq!(attacker(key.clone()).await, StatusCode::TOO_MANY_REQUESTS);
    // Another client behind the same proxy is not.
    assert_eq!(via("203.0.113.77")(key.clone()).await, StatusCode::OK);

    // A client that is not a trusted proxy is counted by its own address,
    // whatever it writes in the header.
    let direct = Client::from(&server, "127.0.0.6");
    let mut statuses = Vec::new();
    for n in 0..12 {
        let forged = format!("203.0.113.{n}");
        let a = direct
            .send_with(
                Method::GET,
                "/v1/sessions",
                Some(&format!("cadre_{id}_{n:048x}")),
                &[("x-forwarded-for", forged.as_str())],
            )
            .await;
        statuses.push(a.status.as_u16());
    }
    assert_eq!(statuses[10..], [429; 2], "{statuses:?}");
}

#[tokio::test]
async fn open_mode_ends_when_the_first_key_is_created_through_the_api() {
    let (_tmp, data) = data_dir();
    let server = Server::start_offline(&data, &repo_agents());
    let c = Client::new(&server);

    assert_eq!(c.get("/v1/sessions", None).await.status, StatusCode::OK);
    assert_eq!(c.get("/metrics", None).await.status, StatusCode::OK);
    let (key, _) = c
        .create_key(None, json!({"tenant": "ops", "admin": true}))
        .await;

    let a = c.get("/v1/sessions", None).await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{}", a.body);
    assert_eq!(
        c.get("/metrics", None).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        c.get("/v1/sessions", Some(&key)).await.status,
        StatusCode::OK
    );
    assert_eq!(c.keys(&key).await.len(), 1);
}

#[tokio::test]
async fn the_keys_endpoints_are_in_the_openapi_document() {
    let (_tmp, data) = data_dir();
    let server = Server::start_offline(&data, &repo_agents());
    let doc = Client::new(&server).get("/openapi.json", None).await.body;
    let paths = &doc["paths"];
    assert!(paths["/v1/keys"]["post"]["responses"]["201"].is_object());
    assert!(paths["/v1/keys"]["get"]["responses"]["200"].is_object());
    let delete = &paths["/v1/keys/{id}"]["delete"]["responses"];
    assert!(delete["204"].is_object());
    assert!(delete["404"]["content"]["application/json"]["examples"]["KEY_NOT_FOUND"].is_object());
    let metrics = &paths["/metrics"]["get"]["responses"]["403"];
    assert!(metrics["content"]["application/json"]["examples"]["METRICS_KEY_REQUIRED"].is_object());
}

// ---------------------------------------------------------------------------
// The CLI
// ---------------------------------------------------------------------------

fn cadre(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cadre"))
        .args(args)
        .env_remove("CADRE_URL")
        .env_remove("CADRE_API_KEY")
        .env("RUST_LOG", "warn")
        .output()
        .expect("the cadre binary runs")
}

/// `cadre ARGS`; its stdout, after checking it succeeded.
fn ok(args: &[&str]) -> String {
    let out = cadre(args);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "cadre {args:?} failed: {}\nstdout: {stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test]
async fn the_cli_manages_keys_on_a_running_server_and_on_the_data_dir() {
    let (_tmp, data) = data_dir();
    let [admin, tenant] = <[String; 2]>::try_from(
        seed(
            &data,
            &[
                (admin_of("ops"), Timestamp::now()),
                (NewKey::tenant("globex"), Timestamp::now()),
            ],
        )
        .await,
    )
    .unwrap();
    let mut server = Some(Server::start_offline(&data, &repo_agents()));
    let base = server.as_ref().unwrap().base.clone();
    let c = Client::new(server.as_ref().unwrap());
    let remote = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--url", &base, "--api-key", &admin]);
        ok(&all)
    };

    let key = remote(&["keys", "create", "--tenant", "acme", "--plan", "free"]);
    let key = key.trim().to_string();
    assert!(key.starts_with("cadre_"), "{key}");
    assert_eq!(
        c.get("/v1/sessions", Some(&key)).await.status,
        StatusCode::OK
    );
    let id = key
        .strip_prefix("cadre_")
        .unwrap()
        .split_once('_')
        .unwrap()
        .0;

    let list = remote(&["keys", "list"]);
    let line = list.lines().find(|l| l.starts_with(id)).expect("listed");
    assert!(
        line.contains("acme") && line.contains("free") && line.contains("active"),
        "{line}"
    );

    assert_eq!(
        remote(&["keys", "revoke", id]).trim(),
        format!("revoked {id}")
    );
    assert_eq!(
        c.get("/v1/sessions", Some(&key)).await.status,
        StatusCode::UNAUTHORIZED
    );
    let listed_remotely = remote(&["keys", "list"]);

    // A tenant key may not manage keys: a clear error, non-zero exit.
    let out = cadre(&["keys", "list", "--url", &base, "--api-key", &tenant]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ADMIN_REQUIRED (HTTP 403)"), "{stderr}");

    // Server stopped: the same commands on the data dir.
    server.take();
    let dir = data.to_str().unwrap();
    assert_eq!(ok(&["keys", "list", "--data-dir", dir]), listed_remotely);
    let scrape = ok(&[
        "keys",
        "create",
        "--tenant",
        "ops",
        "--metrics",
        "--data-dir",
        dir,
    ]);
    let scrape_id = scrape
        .trim()
        .strip_prefix("cadre_")
        .unwrap()
        .split_once('_')
        .unwrap()
        .0
        .to_string();
    let list = ok(&["keys", "list", "--data-dir", dir]);
    let line = list
        .lines()
        .find(|l| l.starts_with(&scrape_id))
        .expect("listed");
    assert!(
        line.contains("metrics") && line.contains("premium"),
        "{line}"
    );

    let server = Server::start_offline(&data, &repo_agents());
    let c = Client::new(&server);
    assert_eq!(
        c.get("/metrics", Some(scrape.trim())).await.status,
        StatusCode::OK
    );
    assert_eq!(
        c.get("/v1/sessions", Some(&key)).await.status,
        StatusCode::UNAUTHORIZED
    );
}
