//! Webhooks (issue #33, part 2): a background turn's end is POSTed to its
//! `webhook`, signed the Standard Webhooks way (checked here with the
//! reference library, `standardwebhooks`); a 500 is retried with the same
//! `webhook-id`; a delivery that waits for a retry survives `kill -9`;
//! scheduled turns and workflow runs post their ends too; targets cadre
//! may not reach, and webhooks with no secret to sign them, are refused
//! with 422 when the message, run or schedule is made.
//!
//! The receiver is an axum server on a loopback port (so the apps here set
//! `allow_private`, except the one that checks the refusals); it answers
//! each request with the next status of its script (then 200).

mod support;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode as AxumStatus};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::server::Server;
use support::{AppOptions, Client, repo_agents, spawn_app};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// Another tenant's own secret (32 bytes).
const TENANT_SECRET: &str = "whsec_dGhpcyBpcyB0aGUgdGVuYW50J3Mgb3duIHNlY3JldCE=";

#[derive(Clone, Debug)]
struct Received {
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Received {
    fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON event")
    }

    /// Verifies with the Standard Webhooks reference library.
    fn verify(&self, secret: &str) -> Result<(), String> {
        let wh = standardwebhooks::Webhook::new(secret).map_err(|e| e.to_string())?;
        wh.verify(&self.body, &self.headers)
            .map_err(|e| e.to_string())
    }
}

#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<Received>>>,
    script: Arc<Mutex<VecDeque<u16>>>,
}

impl Receiver {
    /// Listens on a loopback port; its URL.
    async fn start(script: &[u16]) -> (Receiver, String) {
        let receiver = Receiver::default();
        receiver.script.lock().unwrap().extend(script);
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, url)
    }

    fn got(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }

    /// Waits until `n` requests came.
    async fn wait_for(&self, n: usize, within: Duration) -> Vec<Received> {
        let deadline = Instant::now() + within;
        loop {
            let got = self.got();
            if got.len() >= n {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {n} webhook requests (got {})",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn receive(
    State(r): State<Receiver>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> AxumStatus {
    r.got.lock().unwrap().push(Received {
        headers,
        body: body.to_vec(),
    });
    let status = r.script.lock().unwrap().pop_front().unwrap_or(200);
    AxumStatus::from_u16(status).unwrap()
}

fn config(extra: &str) -> String {
    format!("[webhooks]\nsecret = \"{SECRET}\"\nallow_private = true\nfirst_retry_ms = 50\n{extra}")
}

/// Sends a message with `Prefer: respond-async` and `webhook`; the turn id.
async fn background_turn(client: &Client, session: &str, content: &str, webhook: &str) -> String {
    let (status, body) = support::client::send(
        client
            .request(Method::POST, &format!("/v1/sessions/{session}/messages"))
            .header("prefer", "respond-async")
            .json(&json!({"content": content, "webhook": webhook})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    body["turn_id"].as_str().unwrap().to_string()
}

async fn deliveries(client: &Client) -> Vec<Value> {
    let (status, body) = client.get("/v1/webhooks/deliveries").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["deliveries"].as_array().unwrap().clone()
}

/// Waits until the delivery of event `id` is in `state`.
async fn delivery_in(client: &Client, id: &str, state: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = client.get(&format!("/v1/webhooks/deliveries/{id}")).await;
        if status == StatusCode::OK && body["state"] == state {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "delivery {id} never became {state}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_turns_end_is_posted_signed_and_a_500_is_retried_with_the_same_id() {
    let (receiver, url) = Receiver::start(&[500]).await;
    let app = spawn_app(AppOptions::offline().config_toml(&config("")));
    let client = &app.client;
    let session = client.session("assistant").await;
    let turn = background_turn(client, &session, "what is 2 + 3?", &url).await;

    let got = receiver.wait_for(2, Duration::from_secs(20)).await;
    let (first, second) = (&got[0], &got[1]);
    // One event: the same id and body on both attempts.
    assert_eq!(first.header("webhook-id"), second.header("webhook-id"));
    assert!(first.header("webhook-id").starts_with("msg_"));
    assert_eq!(first.body, second.body);
    assert_eq!(first.header("content-type"), "application/json");
    for attempt in [first, second] {
        attempt
            .verify(SECRET)
            .unwrap_or_else(|e| panic!("the signature does not verify: {e}"));
        // Not with another secret.
        assert!(attempt.verify(TENANT_SECRET).is_err());
    }
    // A body changed on the way does not verify.
    let mut tampered = second.clone();
    tampered.body = second.body.replace_first(b"completed", b"failed");
    assert!(tampered.verify(SECRET).is_err());

    let event = first.json();
    assert_eq!(event["type"], "turn.completed", "{event}");
    assert!(event["timestamp"].is_string());
    let data = &event["data"];
    assert_eq!(data["session_id"], session.as_str());
    assert_eq!(data["turn_id"], turn.as_str());
    assert_eq!(data["status"], "completed");
    assert_eq!(data["agent"], "assistant");
    assert!(
        data["answer"].as_str().is_some_and(|a| !a.is_empty()),
        "{data}"
    );
    assert!(data["usage"].is_object(), "{data}");

    // The record: delivered on the second attempt, the first's 500 kept.
    let id = first.header("webhook-id");
    let record = delivery_in(client, &id, "delivered").await;
    assert_eq!(record["attempt_count"], 2, "{record}");
    assert_eq!(record["attempts"][0]["status"], 500);
    assert_eq!(record["attempts"][1]["status"], 200);
    assert_eq!(record["url"], url.as_str());
    assert_eq!(record["event_type"], "turn.completed");
    assert_eq!(record["turn_id"], turn.as_str());
    assert_eq!(record["event"], event);
    assert!(record.get("next_attempt_at").is_none());
    // Listed, and nothing is sent again.
    let listed = deliveries(client).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["id"], id.as_str());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(receiver.got().len(), 2);

    // The turn's record names the target and counts the tokens.
    let (_, record) = client
        .get(&format!("/v1/sessions/{session}/turns/{turn}"))
        .await;
    assert_eq!(record["webhook"], url.as_str());

    // Erasing the session erases its events.
    let (status, body) = client.delete(&format!("/v1/sessions/{session}")).await;
    assert!(status.is_success(), "{status} {body}");
    assert!(deliveries(client).await.is_empty());
    let (status, _) = client.get(&format!("/v1/webhooks/deliveries/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

trait ReplaceFirst {
    fn replace_first(&self, from: &[u8], to: &[u8]) -> Vec<u8>;
}

impl ReplaceFirst for Vec<u8> {
    fn replace_first(&self, from: &[u8], to: &[u8]) -> Vec<u8> {
        let at = self
            .windows(from.len())
            .position(|w| w == from)
            .expect("the pattern is in the body");
        [&self[..at], to, &self[at + from.len()..]].concat()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_cadre_may_not_reach_and_unsigned_webhooks_are_refused_at_creation() {
    // No allow_private: the address rule holds.
    let app = spawn_app(
        AppOptions::offline().config_toml(&format!("[webhooks]\nsecret = \"{SECRET}\"\n")),
    );
    let client = &app.client;
    let session = client.session("assistant").await;
    for target in [
        "http://127.0.0.1:9/hook",
        "http://localhost:9/hook",
        "http://10.1.2.3/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "ftp://example.com/hook",
        "not a url",
    ] {
        let (status, body) = client
            .post(
                &format!("/v1/sessions/{session}/messages"),
                &json!({"content": "hi", "webhook": target}),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{target}: {body}");
        assert_eq!(body["error"]["code"], "WEBHOOK_REFUSED", "{target}: {body}");
        // A schedule and a workflow run are refused alike.
        let (status, body) = client
            .post(
                "/v1/schedules",
                &json!({"agent": "assistant", "message": "hi", "interval_s": 60, "webhook": target}),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{target}: {body}");
        assert_eq!(body["error"]["code"], "WEBHOOK_REFUSED", "{target}: {body}");
        let (status, body) = client
            .post(
                "/v1/workflows/account-review/runs",
                &json!({"input": {"timeframe": "1M"}, "webhook": target}),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{target}: {body}");
        assert_eq!(body["error"]["code"], "WEBHOOK_REFUSED", "{target}: {body}");
    }
    // Nothing was stored or run for them.
    let (_, turns) = client.get(&format!("/v1/sessions/{session}/turns")).await;
    assert_eq!(turns["turns"].as_array().unwrap().len(), 0, "{turns}");
    let (_, schedules) = client.get("/v1/schedules").await;
    assert_eq!(schedules["schedules"].as_array().unwrap().len(), 0);

    // A public address passes the address rule.
    let (status, body) = client
        .post(
            "/v1/schedules",
            &json!({"agent": "assistant", "message": "hi", "interval_s": 3600, "webhook": "https://93.184.215.14/hook"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // With no secret, no webhook at all: nobody could verify it.
    let unsigned = spawn_app(AppOptions::offline());
    let session = unsigned.client.session("assistant").await;
    let (status, body) = unsigned
        .client
        .post(
            &format!("/v1/sessions/{session}/messages"),
            &json!({"content": "hi", "webhook": "https://93.184.215.14/hook"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "WEBHOOK_REFUSED");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no signing secret"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_own_secret_signs_its_events_and_a_scheduled_turn_and_a_run_post_their_ends() {
    let (receiver, url) = Receiver::start(&[]).await;
    // No server secret: the tenant's own signs its events.
    let app = spawn_app(
        AppOptions::offline()
            .config_toml("[webhooks]\nallow_private = true\nfirst_retry_ms = 50\n"),
    );
    let open = &app.client;
    let (status, admin) = open
        .post("/v1/keys", &json!({"tenant": "ops", "admin": true}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{admin}");
    let admin = open.with_key(admin["key"].as_str().unwrap());
    let (status, body) = admin
        .patch(
            "/v1/tenants/acme/config",
            &json!({"webhook_secret": "whsec_short"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (status, body) = admin
        .patch(
            "/v1/tenants/acme/config",
            &json!({"webhook_secret": TENANT_SECRET}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut clients = Vec::new();
    for tenant in ["acme", "other"] {
        let (status, key) = admin.post("/v1/keys", &json!({"tenant": tenant})).await;
        assert_eq!(status, StatusCode::CREATED, "{key}");
        clients.push(open.with_key(key["key"].as_str().unwrap()));
    }
    let (acme, other) = (&clients[0], &clients[1]);

    // A tenant with no secret of its own (and none on the server) cannot.
    let (status, body) = other
        .post(
            "/v1/workflows/account-review/runs",
            &json!({"input": {"timeframe": "1M"}, "webhook": url}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");

    let (status, schedule) = acme
        .post(
            "/v1/schedules",
            &json!({"agent": "assistant", "message": "what is 6 * 7?", "interval_s": 1, "webhook": url}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{schedule}");
    let (status, run) = acme
        .post(
            "/v1/workflows/account-review/runs",
            &json!({"input": {"timeframe": "1M"}, "webhook": url}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    let run_id = run["id"].as_str().unwrap().to_string();

    let deadline = Instant::now() + Duration::from_secs(30);
    let (turn_event, run_event) = loop {
        let got = receiver.got();
        let find = |t: &str| {
            got.iter()
                .find(|r| r.json()["type"].as_str().is_some_and(|x| x.starts_with(t)))
                .cloned()
        };
        if let (Some(a), Some(b)) = (find("turn."), find("run.")) {
            break (a, b);
        }
        assert!(Instant::now() < deadline, "no turn and run events: {got:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (status, _) = acme
        .delete(&format!(
            "/v1/schedules/{}",
            schedule["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    for event in [&turn_event, &run_event] {
        event
            .verify(TENANT_SECRET)
            .unwrap_or_else(|e| panic!("the tenant's secret does not verify: {e}"));
        assert!(event.verify(SECRET).is_err());
    }
    let turn = turn_event.json();
    assert_eq!(turn["type"], "turn.completed", "{turn}");
    let run = run_event.json();
    assert_eq!(run["data"]["run_id"], run_id.as_str(), "{run}");
    assert!(
        matches!(run["type"].as_str(), Some("run.succeeded" | "run.failed")),
        "{run}"
    );

    // Each tenant lists its own deliveries only.
    let mine = deliveries(acme).await;
    assert!(mine.len() >= 2, "{mine:?}");
    assert!(deliveries(other).await.is_empty());
    let id = mine[0]["id"].as_str().unwrap();
    let (status, _) = other.get(&format!("/v1/webhooks/deliveries/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[test]
fn a_delivery_waiting_for_a_retry_survives_kill_9_and_keeps_its_id() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The receiver fails every attempt until the restart.
    let (receiver, url) = rt.block_on(Receiver::start(&[500; 1000]));
    let data = tempfile::tempdir().unwrap();
    let env = [
        ("CADRE_WEBHOOKS_SECRET", SECRET),
        ("CADRE_WEBHOOKS_ALLOW_PRIVATE", "true"),
        ("CADRE_WEBHOOKS_FIRST_RETRY_MS", "200"),
    ];
    let mut server = Server::start_offline_with(data.path(), &repo_agents(), &env);
    let client = server.client();
    let first = rt.block_on(async {
        let session = client.session("assistant").await;
        background_turn(&client, &session, "what is 2 + 3?", &url).await;
        receiver.wait_for(2, Duration::from_secs(20)).await[0].clone()
    });
    server.kill_9();
    let attempts_before = receiver.got().len();
    receiver.script.lock().unwrap().clear();

    let server = Server::start_offline_with(data.path(), &repo_agents(), &env);
    let client = server.client();
    rt.block_on(async {
        let got = receiver
            .wait_for(attempts_before + 1, Duration::from_secs(20))
            .await;
        let last = got.last().unwrap();
        assert_eq!(last.header("webhook-id"), first.header("webhook-id"));
        assert_eq!(last.body, first.body);
        last.verify(SECRET).unwrap();
        let record = delivery_in(&client, &first.header("webhook-id"), "delivered").await;
        // The attempts before the kill whose record was written (a kill
        // between an attempt and its record loses the record, not the
        // event), then the 200.
        let attempts = record["attempts"].as_array().unwrap();
        assert!(attempts.len() >= 2, "{record}");
        assert_eq!(attempts[0]["status"], 500, "{record}");
        assert_eq!(attempts.last().unwrap()["status"], 200, "{record}");
        // Delivered once after the restart: no second event, no repeat.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(receiver.got().len(), attempts_before + 1);
        assert_eq!(deliveries(&client).await.len(), 1);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_on_one_postgresql_deliver_each_event_once() {
    use support::cluster::{Cluster, ClusterOptions};
    use support::postgres::Postgres;

    let (receiver, url) = Receiver::start(&[]).await;
    let pg = Postgres::shared();
    let database = pg.database("webhooks_cluster");
    let options = ClusterOptions::plain(3)
        .node_args(move |i, addr| {
            vec![
                "--store".into(),
                database.clone(),
                "--node-id".into(),
                format!("n{i}"),
                "--advertise".into(),
                format!("http://{addr}"),
            ]
        })
        .env("CADRE_WEBHOOKS_SECRET", SECRET)
        .env("CADRE_WEBHOOKS_ALLOW_PRIVATE", "true");
    let cluster = Cluster::start(options).await;
    let client = cluster.node_client(0);
    // A turn a second, each in a new session, on whichever node fires it;
    // every node's delivery loop races for every event.
    let (status, schedule) = client
        .post(
            "/v1/schedules",
            &json!({"agent": "assistant", "message": "what is 1 + 1?", "interval_s": 1, "webhook": url}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{schedule}");
    receiver.wait_for(4, Duration::from_secs(30)).await;
    let (status, _) = client
        .delete(&format!(
            "/v1/schedules/{}",
            schedule["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    // Every event written is delivered, each once: as many requests as
    // events, as many distinct ids as requests.
    // (A fire in flight when the schedule went may add one: wait until
    // the records and the requests agree and stay so.)
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = usize::MAX;
    let records = loop {
        let records = deliveries(&cluster.node_client(1)).await;
        let settled = !records.is_empty()
            && records.iter().all(|r| r["state"] == "delivered")
            && receiver.got().len() == records.len();
        if settled && records.len() == last {
            break records;
        }
        last = if settled { records.len() } else { usize::MAX };
        assert!(Instant::now() < deadline, "not all delivered: {records:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let got = receiver.got();
    let ids: std::collections::BTreeSet<String> =
        got.iter().map(|r| r.header("webhook-id")).collect();
    assert_eq!(ids.len(), got.len(), "an event was sent twice");
    assert_eq!(got.len(), records.len(), "{records:?}");
    for r in &records {
        assert_eq!(r["attempt_count"], 1, "{r}");
    }
    for r in &got {
        r.verify(SECRET).unwrap();
    }
}
