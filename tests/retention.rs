//! Retention (issue #34): a tenant's `retain_days` (its config) instead of
//! the server's `[sessions] retain_days`, and an admin's `DELETE
//! /v1/sessions?before=<RFC 3339>[&tenant=]`. Sessions made idle long ago
//! are seeded straight into the store (their messages dated a year back);
//! after a delete the server is stopped and every table of the store is
//! read for the deleted ids (`support::store::rows_naming`).
//!
//! sweep / DELETE ?before= ──▶ Sessions::delete_idle ──▶ Sessions::delete (each) ──▶ store

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use cadre::identity::Plan;
use cadre::model::ChatMessage;
use cadre::store::{Session, StoredMessage, WriteOp};
use jiff::{SignedDuration, Timestamp};
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::store::rows_naming;
use support::{AppOptions, Client, MockModel, Reply, TestApp, agent_toml, agents_dir, spawn_app};

/// Longest a test waits for something the server does on its own.
const PATIENCE: Duration = Duration::from_secs(20);

/// A session of `tenant` whose one exchange was `days_ago` days back.
fn old_session(id: &str, tenant: &str, days_ago: i64) -> Vec<WriteOp> {
    let at = Timestamp::now() - SignedDuration::from_hours(24 * days_ago);
    let msg = |seq: u64, m: ChatMessage| StoredMessage {
        seq,
        message: m,
        created_at: at,
        rolled_back: false,
    };
    vec![
        WriteOp::PutSession(Session {
            id: id.into(),
            tenant: tenant.into(),
            agent: "assistant".into(),
            user_id: None,
            plan: Plan::Free,
            metadata: json!({}),
            created_at: at,
            forked_from: None,
        }),
        WriteOp::AppendMessages {
            session_id: id.into(),
            messages: vec![
                msg(1, ChatMessage::user("what is 6*7?")),
                msg(2, ChatMessage::assistant("42")),
            ],
        },
    ]
}

/// Keys for acme, globex (tenants) and ops (admin), and the given old
/// sessions, written before the app starts.
async fn seed(data: &Path, old: &[(&str, &str, i64)]) -> [String; 3] {
    let store = support::store::open_store(data);
    let mut keys = Vec::new();
    for (tenant, admin) in [("acme", false), ("globex", false), ("ops", true)] {
        let (key, _) = cadre::tenants::create_key(&store, tenant, admin)
            .await
            .expect("key created");
        keys.push(key);
    }
    let ops = old
        .iter()
        .flat_map(|(id, tenant, days)| old_session(id, tenant, *days))
        .collect();
    store.write(ops, true).await.expect("seeded");
    keys.try_into().unwrap()
}

async fn exists(client: &Client, id: &str) -> bool {
    let (status, body) = client.get(&format!("/v1/sessions/{id}")).await;
    match status {
        StatusCode::OK => true,
        StatusCode::NOT_FOUND => false,
        other => panic!("{other}: {body}"),
    }
}

/// Waits until the session is gone (the sweep's work).
async fn until_gone(client: &Client, id: &str) {
    let deadline = Instant::now() + PATIENCE;
    while exists(client, id).await {
        assert!(Instant::now() < deadline, "{id} never swept");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ago(hours: i64) -> String {
    (Timestamp::now() - SignedDuration::from_hours(hours)).to_string()
}

fn app_on(data: &Path, config: &str) -> TestApp {
    spawn_app(AppOptions::offline().data_dir(data).config_toml(&format!(
        "[api_limit]\nper_second = 100000\nburst = 100000\n{config}"
    )))
}

#[tokio::test]
async fn a_tenants_retain_days_is_checked_and_goes_back_to_the_servers() {
    let data = tempfile::tempdir().unwrap();
    let [_, _, ops] = seed(data.path(), &[]).await;
    let app = app_on(data.path(), "");
    let admin = app.with_key(&ops);
    for bad in [json!(-1), json!(36500.5), json!("30"), json!(true)] {
        let (status, body) = admin
            .patch("/v1/tenants/acme/config", &json!({"retain_days": bad}))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {body}");
        assert_eq!(body["error"]["code"], "VALIDATION_ERROR", "{body}");
    }
    for good in [json!(0), json!(0.5), json!(36500)] {
        let (status, body) = admin
            .patch("/v1/tenants/acme/config", &json!({"retain_days": good}))
            .await;
        assert_eq!(status, StatusCode::OK, "{good}: {body}");
        assert_eq!(body["config"]["retain_days"].as_f64(), good.as_f64());
    }
    let (status, body) = admin
        .patch("/v1/tenants/acme/config", &json!({"retain_days": null}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["config"]["retain_days"], Value::Null);
}

#[tokio::test]
async fn each_tenant_keeps_its_sessions_for_its_own_retain_days() {
    let data = tempfile::tempdir().unwrap();
    // A year-old session per tenant: the server keeps sessions 30 days,
    // globex forever (0), ops 36500 days; acme takes the server's.
    let [acme, globex, ops] = seed(
        data.path(),
        &[
            ("acme-old", "acme", 365),
            ("globex-old", "globex", 365),
            ("ops-old", "ops", 365),
            ("acme-recent", "acme", 2),
        ],
    )
    .await;
    {
        let store = support::store::open_store(data.path());
        for (tenant, days) in [("globex", 0.0), ("ops", 36_500.0)] {
            let config = cadre::tenants::TenantConfig {
                retain_days: Some(days),
                ..Default::default()
            };
            config.save(&store, tenant).await.unwrap();
        }
    }
    let mut app = app_on(data.path(), "[sessions]\nretain_days = 30\n");
    // A session is found only under its own tenant's key.
    let (acme, globex, admin) = (
        app.with_key(&acme),
        app.with_key(&globex),
        app.with_key(&ops),
    );
    // The first sweep runs at start.
    until_gone(&acme, "acme-old").await;
    assert!(exists(&globex, "globex-old").await, "globex keeps forever");
    assert!(exists(&admin, "ops-old").await, "ops keeps 36500 days");
    assert!(exists(&acme, "acme-recent").await, "younger than 30 days");

    // acme's own retention, set while the server runs (the sweep reads it
    // at once): one day takes the two-day-old session.
    let (status, body) = admin
        .patch("/v1/tenants/acme/config", &json!({"retain_days": 1}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    until_gone(&acme, "acme-recent").await;
    assert!(exists(&globex, "globex-old").await);
    app.stop();
    let ids = ["acme-old".to_string(), "acme-recent".to_string()];
    let left = rows_naming(data.path(), &ids);
    assert!(left.is_empty(), "rows left behind:\n{}", left.join("\n"));
}

#[tokio::test]
async fn a_tenants_retention_applies_when_the_server_keeps_everything() {
    let data = tempfile::tempdir().unwrap();
    let [acme, globex, ops] = seed(data.path(), &[]).await;
    // No `[sessions] retain_days`: the server keeps sessions forever.
    let app = app_on(data.path(), "");
    let (acme, globex, admin) = (
        app.with_key(&acme),
        app.with_key(&globex),
        app.with_key(&ops),
    );
    let (status, body) = admin
        .patch("/v1/tenants/acme/config", &json!({"retain_days": 0.00003}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let gone = acme.session("assistant").await;
    let (status, turn) = acme.say(&gone, "What is 6*7?").await;
    assert_eq!(status, StatusCode::OK, "{turn}");
    let kept = globex.session("assistant").await;
    // 0.00003 days: 2.6 s idle.
    until_gone(&acme, &gone).await;
    assert!(exists(&globex, &kept).await);
}

#[tokio::test]
async fn an_admin_deletes_the_sessions_idle_since_a_time_per_tenant_or_all() {
    let data = tempfile::tempdir().unwrap();
    let [acme, globex, ops] = seed(
        data.path(),
        &[
            ("acme-old-1", "acme", 400),
            ("acme-old-2", "acme", 100),
            ("globex-old", "globex", 400),
        ],
    )
    .await;
    let mut app = app_on(data.path(), "");
    let (acme, globex, admin) = (
        app.with_key(&acme),
        app.with_key(&globex),
        app.with_key(&ops),
    );
    let fresh = acme.session("assistant").await;
    let (status, turn) = acme.say(&fresh, "What is 6*7?").await;
    assert_eq!(status, StatusCode::OK, "{turn}");

    // Admins only; `before` is required and an RFC 3339 time.
    let (status, body) = acme
        .delete(&format!("/v1/sessions?before={}", ago(24)))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "ADMIN_REQUIRED");
    for bad in ["/v1/sessions", "/v1/sessions?before=yesterday"] {
        let (status, body) = admin.delete(bad).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {body}");
        assert_eq!(body["error"]["code"], "VALIDATION_ERROR");
    }
    let (status, body) = admin
        .delete(&format!("/v1/sessions?before={}&tenant=no%20such", ago(24)))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(exists(&acme, "acme-old-1").await);

    // One tenant's, older than 200 days.
    let (status, body) = admin
        .delete(&format!(
            "/v1/sessions?before={}&tenant=acme",
            ago(24 * 200)
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"deleted": 1, "busy": 0}));
    assert!(!exists(&acme, "acme-old-1").await);
    assert!(exists(&acme, "acme-old-2").await);
    assert!(exists(&globex, "globex-old").await);

    // Every tenant's, idle for a day.
    let (status, body) = admin
        .delete(&format!("/v1/sessions?before={}", ago(24)))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"deleted": 2, "busy": 0}));
    assert!(!exists(&acme, "acme-old-2").await);
    assert!(!exists(&globex, "globex-old").await);
    assert!(exists(&acme, &fresh).await);
    app.stop();
    let ids = ["acme-old-1", "acme-old-2", "globex-old"].map(String::from);
    let left = rows_naming(data.path(), &ids);
    assert!(left.is_empty(), "rows left behind:\n{}", left.join("\n"));
    assert!(!rows_naming(data.path(), std::slice::from_ref(&fresh)).is_empty());
}

#[tokio::test]
async fn a_session_with_a_running_turn_is_left_and_counted_busy() {
    let data = tempfile::tempdir().unwrap();
    let [acme, _, ops] = seed(data.path(), &[("acme-old", "acme", 400)]).await;
    let model = MockModel::start().await;
    model.push(Reply::slow(Duration::from_secs(3), Reply::text("done")));
    let agents = agents_dir(&[("slow.toml", &agent_toml("slow", &[], 1))]);
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(agents.path())
            .data_dir(data.path()),
    );
    let (acme, admin) = (app.with_key(&acme), app.with_key(&ops));
    let running = acme.session("slow").await;
    let turn = {
        let acme = acme.clone();
        let running = running.clone();
        tokio::spawn(async move { acme.say(&running, "take your time").await })
    };
    model.wait_for_requests(1).await;
    let soon = (Timestamp::now() + SignedDuration::from_hours(1)).to_string();
    let (status, body) = admin.delete(&format!("/v1/sessions?before={soon}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"deleted": 1, "busy": 1}));
    let (status, done) = turn.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{done}");
    assert!(exists(&acme, &running).await);
    assert!(!exists(&acme, "acme-old").await);
}

#[tokio::test]
async fn cadre_compact_gives_the_space_of_deleted_sessions_back() {
    if support::redb_only("compacts the redb file; PostgreSQL has VACUUM FULL") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let old: Vec<(String, &str, i64)> = (0..2000)
        .map(|i| (format!("old-{i:05}"), "acme", 400))
        .collect();
    let old: Vec<(&str, &str, i64)> = old.iter().map(|(id, t, d)| (id.as_str(), *t, *d)).collect();
    let [_, _, ops] = seed(data.path(), &old).await;
    let mut app = app_on(data.path(), "");
    let (status, body) = app
        .with_key(&ops)
        .delete(&format!("/v1/sessions?before={}", ago(24)))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["deleted"], 2000, "{body}");
    app.stop();
    let file = data.path().join("cadre.redb");
    let before = std::fs::metadata(&file).unwrap().len();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cadre"))
        .args(["compact", "--data-dir"])
        .arg(data.path())
        .output()
        .expect("run cadre compact");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = std::fs::metadata(&file).unwrap().len();
    assert!(after * 4 < before, "{before} -> {after} bytes");
    // The compacted store still serves: the keys are there.
    let app = app_on(data.path(), "");
    let (status, body) = app.with_key(&ops).get("/v1/sessions").await;
    assert_eq!(status, StatusCode::OK, "{body}");
}
