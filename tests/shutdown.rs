//! Graceful shutdown of the real `cadre serve` binary: on SIGTERM it stops
//! accepting, lets running turns finish for up to `[server]
//! shutdown_grace_s`, cuts what is still running then (no 200 for it, and
//! after a restart its turn is not complete in the history), flushes and
//! exits 0. Event subscriptions, which never end by themselves, end at once
//! and do not hold the shutdown for the grace.

mod support;

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::server::Server;
use support::{AppOptions, Client, MockModel, Reply, agent_toml, agents_dir, spawn_app, try_send};

const PATIENCE: Duration = Duration::from_secs(10);

async fn history(client: &Client, session: &str) -> Vec<(String, String)> {
    let (status, body) = client
        .get(&format!("/v1/sessions/{session}/messages"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default().to_string(),
                m["content"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// A message sent on its own task; its answer, or the transport error.
fn say(
    client: &Client,
    session: &str,
    text: &str,
) -> tokio::task::JoinHandle<Result<(StatusCode, Value), reqwest::Error>> {
    let request = client
        .request(Method::POST, &format!("/v1/sessions/{session}/messages"))
        .json(&json!({"content": text}));
    tokio::spawn(try_send(request))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_turn_finish_within_the_grace_cuts_the_other_and_exits_0() {
    let model = MockModel::start().await;
    // The first request to arrive is the turn that outlives the grace.
    model.push_all([
        Reply::slow(Duration::from_secs(60), Reply::text("too late")),
        Reply::slow(Duration::from_millis(500), Reply::text("in time")),
    ]);
    let agents = agents_dir(&[("bot.toml", &agent_toml("bot", &[], 3))]);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let grace = Duration::from_secs(2);
    let mut server = Server::start(
        &data,
        agents.path(),
        &model.base_url(),
        &[("CADRE_SERVER_SHUTDOWN_GRACE_S", "2")],
    );
    let client = server.client();
    let slow_session = client.session("bot").await;
    let quick_session = client.session("bot").await;

    let slow = say(&client, &slow_session, "slow question");
    tokio::time::timeout(PATIENCE, model.wait_for_requests(1))
        .await
        .expect("the slow turn reached the model");
    let quick = say(&client, &quick_session, "quick question");
    tokio::time::timeout(PATIENCE, model.wait_for_requests(2))
        .await
        .expect("the quick turn reached the model");

    let signalled = Instant::now();
    server.sigterm();

    // It stops accepting: a new connection is refused well within the grace.
    let deadline = Instant::now() + grace;
    loop {
        // A client of its own each time: no connection kept from before.
        let fresh = Client::new(&client.base);
        if fresh.try_get("/healthz").await.is_err() {
            break;
        }
        assert!(Instant::now() < deadline, "still accepting after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The running turn inside the grace is answered.
    let (status, body) = tokio::time::timeout(PATIENCE, quick)
        .await
        .expect("the quick turn ended in time")
        .unwrap()
        .expect("the quick turn got a reply");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.to_string().contains("in time"), "{body}");

    // The one past the grace is cut: never a 200.
    let cut = tokio::time::timeout(PATIENCE, slow)
        .await
        .expect("the slow turn ended in time")
        .unwrap();
    if let Ok((status, body)) = &cut {
        assert_ne!(
            *status,
            StatusCode::OK,
            "a cut turn was acknowledged: {body}"
        );
    }

    let status = server.wait_exit(PATIENCE);
    assert!(status.success(), "exit {status:?}\n{}", server.log_tail());
    let took = signalled.elapsed();
    assert!(took >= grace, "exited before the grace ran out: {took:?}");
    drop(server);

    // After a restart: the finished turn is there, the cut one is not complete.
    let server = Server::start(&data, agents.path(), &model.base_url(), &[]);
    let client = server.client();
    assert_eq!(
        history(&client, &quick_session).await,
        [
            ("user".to_string(), "quick question".to_string()),
            ("assistant".to_string(), "in time".to_string())
        ]
    );
    let cut = history(&client, &slow_session).await;
    assert!(
        cut.iter().all(|(role, _)| role == "user"),
        "the cut turn looks complete: {cut:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_event_subscription_ends_at_shutdown_instead_of_holding_it() {
    let mut app = spawn_app(AppOptions::offline().config_toml("[server]\nshutdown_grace_s = 60\n"));
    let events = app
        .client
        .request(Method::GET, "/v1/events")
        .send()
        .await
        .expect("request sent");
    assert_eq!(events.status(), StatusCode::OK);
    let runtime = app.runtime.take().expect("running");
    let started = Instant::now();
    tokio::time::timeout(PATIENCE, tokio::task::spawn_blocking(move || drop(runtime)))
        .await
        .expect("the shutdown did not wait out the grace for a subscription")
        .unwrap();
    assert!(started.elapsed() < PATIENCE);
    // The stream was ended by the server, cleanly.
    let rest = tokio::time::timeout(PATIENCE, events.bytes())
        .await
        .expect("the stream ended");
    assert!(rest.is_ok(), "{rest:?}");
}

/// A first Ctrl-C says what the shutdown waits for; a second one exits at
/// once (130), long before the grace, without acknowledging the running
/// turn; the data dir opens again with the cut turn not complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_ctrl_c_exits_at_once_and_leaves_the_cut_turn_unacknowledged() {
    let model = MockModel::start().await;
    model.push(Reply::slow(
        Duration::from_secs(120),
        Reply::text("too late"),
    ));
    let agents = agents_dir(&[("bot.toml", &agent_toml("bot", &[], 3))]);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start(
        &data,
        agents.path(),
        &model.base_url(),
        &[("CADRE_SERVER_SHUTDOWN_GRACE_S", "60")],
    );
    assert!(
        data.join("server.json").exists(),
        "a listening server records itself in its data dir"
    );
    let client = server.client();
    let session = client.session("bot").await;
    let turn = say(&client, &session, "slow question");
    tokio::time::timeout(PATIENCE, model.wait_for_requests(1))
        .await
        .expect("the turn reached the model");

    server.signal(libc::SIGINT);
    let deadline = Instant::now() + PATIENCE;
    while !server.log_text().contains("interrupt again to exit now") {
        assert!(
            Instant::now() < deadline,
            "no line saying what the shutdown waits for:\n{}",
            server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = server.log_text();
    assert!(log.contains("open connection(s)"), "{log}");

    let again = Instant::now();
    server.signal(libc::SIGINT);
    let status = server.wait_exit(PATIENCE);
    assert_eq!(status.code(), Some(130), "{}", server.log_tail());
    assert!(
        again.elapsed() < Duration::from_secs(5),
        "{:?}",
        again.elapsed()
    );
    if let Ok(Ok((status, body))) = tokio::time::timeout(PATIENCE, turn).await.unwrap() {
        assert_ne!(
            status,
            StatusCode::OK,
            "a cut turn was acknowledged: {body}"
        );
    }
    assert!(
        !data.join("server.json").exists(),
        "the record goes with the server"
    );
    drop(server);

    let server = Server::start(&data, agents.path(), &model.base_url(), &[]);
    let cut = history(&server.client(), &session).await;
    assert!(
        cut.iter().all(|(role, _)| role == "user"),
        "the cut turn looks complete: {cut:?}"
    );
}
