//! Callers are who their key says: the plan a request runs with is what it
//! names, only up to what its key and its tenant allow; `user_id` is
//! bounded; a tenant's `tool_quotas` hold whatever `user_id`s its calls
//! carry. Against the real server, with keys made through `/v1/keys`.
//!
//! key (plan) ─┐
//! tenant config (plan, tool_quotas) ─┼─▶ entitled plan ─▶ executor (TOOL_PLAN_REQUIRED, tenant ceiling, per-user limit)
//! request (plan, user_id) ─┘

mod support;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::client::Client;
use support::{AppOptions, TestApp, spawn_app};

struct Keys {
    app: TestApp,
    admin: Client,
    /// acme, a key capped at free.
    acme_free: Client,
    /// acme, a key with every plan.
    acme: Client,
    /// globex, every plan on the key, but the tenant is capped at pro.
    globex: Client,
}

async fn key(admin: &Client, body: Value) -> String {
    let (status, made) = admin.post("/v1/keys", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    made["key"].as_str().expect("the secret, once").to_string()
}

async fn keys() -> Keys {
    let app = spawn_app(AppOptions::offline());
    // The first key, from loopback while the server runs open, ends open mode.
    let admin_key = key(&app.client, json!({"tenant": "ops", "admin": true})).await;
    let admin = app.client.with_key(&admin_key);
    let acme_free = app
        .client
        .with_key(&key(&admin, json!({"tenant": "acme", "plan": "free"})).await);
    let acme = app
        .client
        .with_key(&key(&admin, json!({"tenant": "acme"})).await);
    let globex = app
        .client
        .with_key(&key(&admin, json!({"tenant": "globex"})).await);
    let (status, body) = admin
        .post("/v1/tenants/globex/config", &json!({"plan": "pro"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    Keys {
        app,
        admin,
        acme_free,
        acme,
        globex,
    }
}

fn sentiment(plan: Option<&str>) -> Value {
    let mut body = json!({"user_id": "trader-1", "params": {"symbol": "NVDA"}});
    if let Some(plan) = plan {
        body["plan"] = json!(plan);
    }
    body
}

const SENTIMENT: &str = "/v1/tools/get_sentiment/invoke";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cannot_ask_for_more_than_its_key_and_tenant_allow() {
    let k = keys().await;

    // A free key: asking for pro is refused outright, not quietly lowered.
    let (status, body) = k.acme_free.post(SENTIMENT, &sentiment(Some("pro"))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "PLAN_NOT_ENTITLED", "{body}");
    let (status, body) = k
        .acme_free
        .post(
            "/v1/sessions",
            &json!({"agent": "assistant", "plan": "premium"}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "PLAN_NOT_ENTITLED");
    // Naming no plan is free: the pro tool is the executor's `TOOL_PLAN_REQUIRED`.
    let (status, body) = k.acme_free.post(SENTIMENT, &sentiment(None)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error_type"], "TOOL_PLAN_REQUIRED", "{body}");

    // The same tenant's key with every plan gets pro when it asks.
    let (status, body) = k.acme.post(SENTIMENT, &sentiment(Some("pro"))).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // A tenant capped at pro: premium is refused, pro runs, a session keeps it.
    let (status, body) = k
        .globex
        .post(
            "/v1/tools/get_ml_features/invoke",
            &json!({"plan": "premium", "params": {"symbol": "NVDA"}}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "PLAN_NOT_ENTITLED");
    let (status, body) = k.globex.post(SENTIMENT, &sentiment(Some("pro"))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, session) = k
        .globex
        .post(
            "/v1/sessions",
            &json!({"agent": "assistant", "plan": "pro"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{session}");
    assert_eq!(session["plan"], "pro");

    // The operator narrows the tenant further: the next request sees it.
    let (status, _) = k
        .admin
        .patch("/v1/tenants/globex/config", &json!({"plan": "free"}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = k.globex.post(SENTIMENT, &sentiment(Some("pro"))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "PLAN_NOT_ENTITLED");
    drop(k.app);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_id_is_bounded_wherever_it_enters() {
    let app = spawn_app(AppOptions::offline());
    let long = "u".repeat(129);
    for bad in [long.as_str(), "", "a b", "ünïcode", "a/b", "x\u{0}y"] {
        let (status, body) = app
            .post(
                "/v1/tools/echo/invoke",
                &json!({"user_id": bad, "params": {"message": "hi"}}),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad:?}: {body}");
        assert_eq!(body["error"]["code"], "VALIDATION_ERROR");
        let (status, body) = app
            .post(
                "/v1/sessions",
                &json!({"agent": "assistant", "user_id": bad}),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad:?}: {body}");
        let (status, body) = app
            .get(&format!(
                "/v1/limits/quota?tool=echo&user_id={}",
                urlencode(bad)
            ))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad:?}: {body}");
    }
    let ok = "u".repeat(128);
    for good in [ok.as_str(), "alice@example.com", "slack:U123"] {
        let (status, body) = app
            .post(
                "/v1/tools/echo/invoke",
                &json!({"user_id": good, "params": {"message": "hi"}}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{good:?}: {body}");
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_quota_holds_whatever_user_ids_the_calls_carry() {
    let k = keys().await;
    let (status, body) = k
        .admin
        .patch(
            "/v1/tenants/acme/config",
            &json!({"tool_quotas": {"get_news": {"per_minute": 3}}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let news = |user: String| json!({"user_id": user, "params": {"symbol": "AAPL"}});
    let path = "/v1/tools/get_news/invoke";
    // `get_news` allows 10 a minute per user: three users, one call each
    // after three calls by others, would pass the per-user limit; the
    // tenant's ceiling of 3 stops the fourth whoever it names.
    for i in 0..3 {
        let (status, body) = k.acme.post(path, &news(format!("rotating-{i}"))).await;
        assert_eq!(status, StatusCode::OK, "call {i}: {body}");
    }
    let (status, body) = k.acme.post(path, &news("rotating-3".into())).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error_type"], "RATE_LIMITED", "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("tenant acme"),
        "{body}"
    );
    // Another tenant is not charged for acme's calls.
    let (status, body) = k.globex.post(path, &news("rotating-3".into())).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // A quota of 0 withdraws the tool from the tenant.
    let (status, _) = k
        .admin
        .patch(
            "/v1/tenants/globex/config",
            &json!({"tool_quotas": {"get_news": {"per_day": 0}}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = k.globex.post(path, &news("someone".into())).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
}

/// Issue #29 (7): a workflow does not lift its caller's plan. A run's plan
/// is the lower of the workflow's `plan` and the caller's entitlement: a
/// free key runs a premium workflow, but its premium-only call is refused
/// as it would be called directly; a key entitled to premium gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_runs_at_the_lower_of_its_plan_and_the_callers() {
    let agents = support::workflow::agents_with(
        &[("plain.toml", &support::agent_toml("plain", &[], 1))],
        &[(
            "ml.toml",
            "name = \"ml\"\ndescription = \"Premium features.\"\nplan = \"premium\"\n\
             [[nodes]]\nid = \"features\"\ntool = \"get_ml_features\"\n\
             params = { symbol = \"NVDA\" }\n",
        )],
    );
    std::fs::create_dir(agents.path().join("data")).unwrap();
    std::fs::copy(
        support::repo_agents().join("data/trading.json"),
        agents.path().join("data/trading.json"),
    )
    .unwrap();
    let app = spawn_app(AppOptions::offline().agents(agents.path()));
    let admin_key = key(&app.client, json!({"tenant": "ops", "admin": true})).await;
    let admin = app.client.with_key(&admin_key);
    let free = app
        .client
        .with_key(&key(&admin, json!({"tenant": "acme", "plan": "free"})).await);
    let premium = app
        .client
        .with_key(&key(&admin, json!({"tenant": "acme"})).await);

    // Called directly, the free key is refused.
    let (status, body) = free
        .post(
            "/v1/tools/get_ml_features/invoke",
            &json!({"params": {"symbol": "NVDA"}, "plan": "premium"}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");

    let run = |client: Client| async move {
        let (status, run) = client
            .post("/v1/workflows/ml/runs", &json!({"input": {}, "wait": true}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{run}");
        run
    };
    let lifted = run(free).await;
    assert_eq!(lifted["status"], "failed", "{lifted}");
    assert_eq!(lifted["plan"], "free", "{lifted}");
    assert!(
        lifted["nodes"]["features"]["output"].is_null(),
        "a free key got premium output through a workflow: {lifted}"
    );
    assert!(
        lifted["error"]
            .as_str()
            .is_some_and(|e| e.contains("premium")),
        "refused for its plan: {lifted}"
    );
    let entitled = run(premium).await;
    assert_eq!(entitled["status"], "succeeded", "{entitled}");
    assert_eq!(entitled["plan"], "premium", "{entitled}");
}

/// Issue #29 (low): a workflow listing shows a non-admin key its files'
/// names, not where they live on the server, and no load errors (they
/// name server paths); an admin sees both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflow_listings_show_server_paths_to_admins_only() {
    let k = keys().await;
    let dir = support::repo_agents();
    let dir = dir.to_str().unwrap();
    for (client, admin) in [(&k.acme, false), (&k.admin, true)] {
        let (status, body) = client.get("/v1/workflows").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let files: Vec<&str> = body["workflows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["file"].as_str().unwrap())
            .collect();
        assert!(!files.is_empty(), "{body}");
        assert_eq!(
            files.iter().all(|f| f.contains(dir)),
            admin,
            "admin {admin}: {files:?}"
        );
        let (status, one) = client.get("/v1/workflows/market-brief").await;
        assert_eq!(status, StatusCode::OK, "{one}");
        assert_eq!(one["file"].as_str().unwrap().contains(dir), admin, "{one}");
        if !admin {
            assert_eq!(one["file"], "market-brief.toml");
        }
    }
}
