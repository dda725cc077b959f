//! Storage faults, for real: the `cadre serve` binary on a temp data dir
//! whose file size limit (`RLIMIT_FSIZE`, set from outside with `prlimit`)
//! drops to zero, so every write to the database fails with EFBIG the way a
//! full disk fails with ENOSPC. Writes must come back as a 503
//! `STORAGE_UNAVAILABLE` JSON error, the history stored before must stay
//! readable, health must say so, and once the limit is lifted the server
//! must take writes again by itself, losing nothing (also after a restart).
//! A turn that spans the outage and the recovery is refused rather than
//! stored on top of steps the failed database lost.

mod support;

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::server::Server;
use support::{Client, MockModel, Reply, agent_toml, agents_dir};

/// `(role, content)` of every message in `session`'s history.
async fn contents(api: &Client, session: &str) -> Vec<(String, String)> {
    let (status, body) = api.get(&format!("/v1/sessions/{session}/messages")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default().to_string(),
                m["content"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn assert_storage_error(status: StatusCode, body: &Value) {
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "STORAGE_UNAVAILABLE", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_a_503_history_stays_readable_and_writes_resume_without_a_restart() {
    let model = MockModel::start().await;
    model.set_default(Some(Reply::text("noted")));
    let agents = agents_dir(&[("bot.toml", &agent_toml("bot", &[], 4))]);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(&data, agents.path(), &model.base_url(), &[]);
    let api = server.client();

    let (status, body) = api.post("/v1/sessions", &json!({"agent": "bot"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let session = body["id"].as_str().unwrap().to_string();
    for text in ["first", "second"] {
        let (status, body) = api.say(&session, text).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let before = contents(&api, &session).await;
    assert_eq!(before.len(), 4, "{before:?}");

    // The disk is full.
    server.limit_file_size(Some(0));

    let (status, body) = api.say(&session, "lost in the outage").await;
    assert_storage_error(status, &body);
    let (status, body) = api.post("/v1/sessions", &json!({"agent": "bot"})).await;
    assert_storage_error(status, &body);
    let (status, body) = api.say(&session, "also refused").await;
    assert_storage_error(status, &body);

    // What was stored is intact and readable meanwhile.
    assert_eq!(contents(&api, &session).await, before);
    let (status, body) = api.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // Health says so: alive but degraded; not ready.
    let (status, body) = api.get("/healthz").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "degraded", "{body}");
    assert_eq!(body["storage"]["status"], "degraded", "{body}");
    let (status, body) = api.get("/readyz").await;
    assert_storage_error(status, &body);
    let (_, metrics) = api.get("/metrics").await;
    let metrics = metrics.as_str().expect("metrics text").to_string();
    assert!(
        metrics.contains("\ncadre_storage_degraded 1\n"),
        "{metrics}"
    );

    // Space returns: the server notices by itself.
    server.limit_file_size(None);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = api.get("/readyz").await;
        if status == StatusCode::OK {
            assert_eq!(body["status"], "ready", "{body}");
            assert_eq!(
                body["dependencies"]["store"],
                json!({"backend": "redb", "health": {"status": "ok"}})
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "storage did not recover: {body}\n{}",
            server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, body) = api.get("/healthz").await;
    assert_eq!(
        body,
        json!({"status": "ok", "storage": {"status": "ok"}}),
        "{status}"
    );
    let (_, metrics) = api.get("/metrics").await;
    let metrics = metrics.as_str().expect("metrics text").to_string();
    assert!(
        metrics.contains("\ncadre_storage_degraded 0\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("\ncadre_storage_reopens_total 1\n"),
        "{metrics}"
    );

    let (status, body) = api.say(&session, "third").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = api.post("/v1/sessions", &json!({"agent": "bot"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let other = body["id"].as_str().unwrap().to_string();

    let after = contents(&api, &session).await;
    check_history(&before, &after);

    // A clean stop and a restart on the same file: all of it is still there.
    server.sigterm();
    let status = server.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "exit {status:?}\n{}", server.log_tail());
    drop(server);
    let server = Server::start(&data, agents.path(), &model.base_url(), &[]);
    let api = server.client();
    assert_eq!(contents(&api, &session).await, after);
    let (status, body) = api.get(&format!("/v1/sessions/{other}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = api.say(&session, "fourth").await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// The history after recovery: what was there before, unchanged; then at
/// most the user message of a refused turn (never an answer to one); then
/// the turn sent after recovery, complete.
fn check_history(before: &[(String, String)], after: &[(String, String)]) {
    assert_eq!(&after[..before.len()], before, "{after:?}");
    let rest = &after[before.len()..];
    let n = rest.len();
    assert!(n >= 2, "{after:?}");
    assert_eq!(
        &rest[n - 2..],
        [
            ("user".to_string(), "third".to_string()),
            ("assistant".to_string(), "noted".to_string())
        ],
        "{after:?}"
    );
    for (role, content) in &rest[..n - 2] {
        assert_eq!(
            role, "user",
            "an answer to a refused turn was stored: {after:?}"
        );
        assert!(
            content == "lost in the outage" || content == "also refused",
            "{after:?}"
        );
    }
}

/// A turn that started before the outage and ends after the recovery may
/// have lost its first steps with the failed database: it is refused (503),
/// leaves no answer behind, and the session's next turn works on a history
/// reloaded from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_spanning_an_outage_is_refused_and_the_session_reloads() {
    let model = MockModel::start().await;
    model.push(Reply::slow(
        Duration::from_secs(3),
        Reply::text("late answer"),
    ));
    model.set_default(Some(Reply::text("noted")));
    let agents = agents_dir(&[("bot.toml", &agent_toml("bot", &[], 4))]);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, agents.path(), &model.base_url(), &[]);
    let api = server.client();
    let (status, body) = api.post("/v1/sessions", &json!({"agent": "bot"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let session = body["id"].as_str().unwrap().to_string();

    let spanning = api.spawn_post(
        &format!("/v1/sessions/{session}/messages"),
        json!({"content": "spanning"}),
    );
    tokio::time::timeout(Duration::from_secs(10), model.wait_for_requests(1))
        .await
        .expect("the turn reached the model");

    // An outage and its recovery while the model is still thinking.
    server.limit_file_size(Some(0));
    let (status, body) = api.post("/v1/sessions", &json!({"agent": "bot"})).await;
    assert_storage_error(status, &body);
    server.limit_file_size(None);
    let deadline = Instant::now() + Duration::from_secs(10);
    while api.get("/readyz").await.0 != StatusCode::OK {
        assert!(
            Instant::now() < deadline,
            "no recovery\n{}",
            server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !spanning.is_finished(),
        "the turn ended before the recovery; the test proves nothing"
    );

    let (status, body) = tokio::time::timeout(Duration::from_secs(10), spanning)
        .await
        .expect("the turn ended")
        .unwrap();
    assert_storage_error(status, &body);

    let (status, body) = api.say(&session, "after").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let history = contents(&api, &session).await;
    assert!(
        !history.iter().any(|(_, c)| c == "late answer"),
        "the refused turn's answer was stored: {history:?}"
    );
    let n = history.len();
    assert_eq!(
        &history[n - 2..],
        [
            ("user".to_string(), "after".to_string()),
            ("assistant".to_string(), "noted".to_string())
        ],
        "{history:?}"
    );
    assert!(n <= 3, "{history:?}");
}
