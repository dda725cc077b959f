//! Schedules (issue #33, part 1): an interval schedule fires on time,
//! once per slot; after `kill -9` for several slots the restarted binary
//! fires once for all it missed, then on time again; deleting stops it; a
//! revoked key's schedules stop; another tenant cannot see one; refused
//! fields are 422s that say why.
//!
//! The fires go to a session made for the test (`"session": <id>`), so
//! counting its user messages counts its turns. Intervals are 1 s: every
//! wait is for a condition, with a deadline.

mod support;

use std::time::{Duration, Instant};

use cadre::identity::Scope;
use jiff::{SignedDuration, Timestamp};
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::server::Server;
use support::{AppOptions, Client, repo_agents, spawn_app};

/// Polls `check` until it gives `Some`, at most `within`.
async fn wait_for<T, F, Fut>(within: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(t) = check().await {
            return t;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn create(client: &Client, body: Value) -> Value {
    let (status, schedule) = client.post("/v1/schedules", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{schedule}");
    schedule
}

/// The schedule's fires, oldest first.
async fn runs(client: &Client, id: &str) -> Vec<Value> {
    let (status, body) = client
        .get(&format!("/v1/schedules/{id}/runs?limit=100"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut runs = body["runs"].as_array().unwrap().clone();
    runs.reverse();
    runs
}

fn slot(run: &Value) -> Timestamp {
    run["slot"].as_str().unwrap().parse().unwrap()
}

fn fired_at(run: &Value) -> Timestamp {
    run["fired_at"].as_str().unwrap().parse().unwrap()
}

/// The user messages of a session: one per turn.
async fn user_messages(client: &Client, session: &str) -> usize {
    let (status, body) = client
        .get(&format!("/v1/sessions/{session}/messages"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let messages = body
        .as_array()
        .or_else(|| body["messages"].as_array())
        .expect("a list of messages");
    messages.iter().filter(|m| m["role"] == "user").count()
}

/// Waits until the session has no turn running or queued.
async fn settled(client: &Client, session: &str) {
    wait_for(
        Duration::from_secs(20),
        "the session's turns to end",
        || async {
            let (_, body) = client
                .get(&format!("/v1/sessions/{session}/turns?limit=1000"))
                .await;
            let turns = body["turns"].as_array()?;
            turns
                .iter()
                .all(|t| {
                    matches!(
                        t["phase"].as_str(),
                        Some("completed" | "failed" | "interrupted")
                    )
                })
                .then_some(())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interval_schedule_fires_once_per_slot_and_deleting_it_stops_it() {
    let app = spawn_app(AppOptions::offline());
    let client = &app.client;
    let session = client.session("assistant").await;
    let schedule = create(
        client,
        json!({"agent": "assistant", "message": "what time is it?", "interval_s": 1, "session": session}),
    )
    .await;
    let id = schedule["id"].as_str().unwrap().to_string();
    assert_eq!(schedule["session"], session.as_str());
    assert_eq!(schedule["catch_up"], "one");
    assert_eq!(schedule["active"], true);
    let next: Timestamp = schedule["next_fire_at"].as_str().unwrap().parse().unwrap();
    assert!(next > Timestamp::now() - SignedDuration::from_secs(1));

    let fired = wait_for(Duration::from_secs(20), "three fires", || async {
        let runs = runs(client, &id).await;
        (runs.len() >= 3 && runs[..3].iter().all(|r| r["state"] == "started")).then_some(runs)
    })
    .await;
    // One slot each, a second apart, in the schedule's session, each its
    // own turn; never fired before its slot.
    for pair in fired.windows(2) {
        assert_eq!(
            slot(&pair[1]).duration_since(slot(&pair[0])),
            SignedDuration::from_secs(1),
            "{fired:?}"
        );
    }
    let started: Vec<&Value> = fired.iter().filter(|r| r["state"] == "started").collect();
    let mut turns: Vec<&str> = started
        .iter()
        .map(|r| r["turn_id"].as_str().unwrap())
        .collect();
    turns.sort_unstable();
    turns.dedup();
    assert_eq!(turns.len(), started.len());
    for run in &started {
        assert_eq!(run["session_id"], session.as_str());
        assert!(fired_at(run) >= slot(run), "{run}");
    }

    let fired = runs(client, &id).await;
    let (status, _) = client.delete(&format!("/v1/schedules/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = client.get(&format!("/v1/schedules/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "SCHEDULE_NOT_FOUND");
    settled(client, &session).await;
    let after_delete = user_messages(client, &session).await;
    // A fire recorded as the delete landed may still have started.
    assert!(
        after_delete >= fired.len() && after_delete <= fired.len() + 2,
        "{after_delete} turns for {} fires",
        fired.len()
    );
    // Three more slots pass: no turn.
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    assert_eq!(user_messages(client, &session).await, after_delete);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_per_fire_and_the_runs_say_how_each_turn_went() {
    let app = spawn_app(AppOptions::offline());
    let client = &app.client;
    let schedule = create(
        client,
        json!({"agent": "assistant", "message": "hello", "interval_s": 1, "user_id": "ops@example.com"}),
    )
    .await;
    assert_eq!(schedule["session"], "new");
    let id = schedule["id"].as_str().unwrap();
    let fired = wait_for(Duration::from_secs(20), "two completed fires", || async {
        let runs = runs(client, id).await;
        let done: Vec<Value> = runs
            .into_iter()
            .filter(|r| r["status"] == "completed")
            .collect();
        (done.len() >= 2).then_some(done)
    })
    .await;
    assert_ne!(fired[0]["session_id"], fired[1]["session_id"]);
    for run in &fired {
        let session = run["session_id"].as_str().unwrap();
        let (status, body) = client.get(&format!("/v1/sessions/{session}")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["agent"], "assistant");
        assert_eq!(body["user_id"], "ops@example.com");
        assert_eq!(user_messages(client, session).await, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_cannot_see_or_touch_a_schedule_and_a_revoked_key_stops_its_schedules() {
    let app = spawn_app(AppOptions::offline());
    let open = &app.client;
    let (status, admin) = open
        .post("/v1/keys", &json!({"tenant": "ops", "admin": true}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{admin}");
    let admin = open.with_key(admin["key"].as_str().unwrap());
    let mut keys = Vec::new();
    for tenant in ["acme", "globex"] {
        let (status, key) = admin.post("/v1/keys", &json!({"tenant": tenant})).await;
        assert_eq!(status, StatusCode::CREATED, "{key}");
        keys.push((
            open.with_key(key["key"].as_str().unwrap()),
            key["key_id"].as_str().unwrap().to_string(),
        ));
    }
    let (acme, acme_key) = &keys[0];
    let (globex, _) = &keys[1];
    let session = acme.session("assistant").await;
    let schedule = create(
        acme,
        json!({"agent": "assistant", "message": "status?", "interval_s": 1, "session": session}),
    )
    .await;
    let id = schedule["id"].as_str().unwrap();

    let path = format!("/v1/schedules/{id}");
    for (status, body) in [
        globex.get(&path).await,
        globex.get(&format!("{path}/runs")).await,
        globex.patch(&path, &json!({"interval_s": 5})).await,
        globex.delete(&path).await,
    ] {
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    }
    let (_, list) = globex.get("/v1/schedules").await;
    assert_eq!(list["schedules"], json!([]));
    let (_, list) = acme.get("/v1/schedules").await;
    assert_eq!(list["schedules"][0]["id"], id);
    // Nor can it aim a schedule at acme's session.
    let (status, body) = globex
        .post(
            "/v1/schedules",
            &json!({"agent": "assistant", "message": "x", "interval_s": 1, "session": session}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");

    wait_for(Duration::from_secs(20), "a fire", || async {
        (!runs(acme, id).await.is_empty()).then_some(())
    })
    .await;
    let (status, _) = admin.delete(&format!("/v1/keys/{acme_key}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    // The key is refused now, so its session is read from the runtime:
    // once the turns started before the revoke are over, no other starts.
    let sessions = app.runtime.as_ref().unwrap().sessions().clone();
    let count = || {
        let sessions = sessions.clone();
        let session = session.clone();
        async move {
            let history = sessions
                .history(&Scope::runtime(), &session, 0, 10_000)
                .await
                .unwrap();
            history
                .iter()
                .filter(|m| m.message.role == cadre::model::Role::User)
                .count()
        }
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = count().await;
    loop {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let n = count().await;
        if n == last {
            break;
        }
        last = n;
        assert!(Instant::now() < deadline, "the turns did not stop");
    }
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    assert_eq!(
        count().await,
        last,
        "a revoked key's schedule started a turn"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_fields_are_422s_that_say_why() {
    // A signing secret, so a schedule may name a webhook (docs/webhooks.md).
    let app = spawn_app(
        AppOptions::offline()
            .config_toml("[webhooks]\nsecret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n"),
    );
    let client = &app.client;
    let session = client.session("assistant").await;
    let ok = json!({"agent": "assistant", "message": "hi", "interval_s": 60});
    let with = |patch: Value| {
        let mut body = ok.clone();
        for (k, v) in patch.as_object().unwrap() {
            if v.is_null() {
                body.as_object_mut().unwrap().remove(k);
            } else {
                body[k] = v.clone();
            }
        }
        body
    };
    for (body, says) in [
        (with(json!({"cron": "* * * * *"})), "not both"),
        (with(json!({"interval_s": null})), "'cron' or 'interval_s'"),
        (
            with(json!({"interval_s": null, "cron": "every day"})),
            "cron",
        ),
        (
            with(json!({"interval_s": null, "cron": "0 0 30 2 *"})),
            "matches no time",
        ),
        (with(json!({"timezone": "Mars/Olympus"})), "time zone"),
        (with(json!({"interval_s": 0})), "interval_s"),
        (with(json!({"agent": "nobody"})), "no agent"),
        (with(json!({"message": "  "})), "message"),
        (with(json!({"message": "x".repeat(300_000)})), "message"),
        (with(json!({"session": "no-such-session"})), "session"),
        (
            with(json!({"webhook": "ftp://example.com/hook"})),
            "webhook",
        ),
        (with(json!({"workflow": "anything"})), "not both"),
        (with(json!({"catch_up": "some"})), "catch_up"),
        (with(json!({"user_id": "not a user id"})), "user_id"),
        (with(json!({"colour": "blue"})), "colour"),
    ] {
        let (status, error) = client.post("/v1/schedules", &body).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{body} -> {error}"
        );
        let code = if says == "webhook" {
            "WEBHOOK_REFUSED"
        } else {
            "VALIDATION_ERROR"
        };
        assert_eq!(error["error"]["code"], code, "{body} -> {error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{body}: {message}");
    }

    // A cron schedule in a time zone: its next fire is to come; a change
    // to an interval drops the cron expression.
    let schedule = create(
        client,
        json!({"agent": "assistant", "message": "brief", "cron": "0 9 * * 1-5",
               "timezone": "Europe/Paris", "session": session, "catch_up": "none",
               "webhook": "https://93.184.215.14/hook"}),
    )
    .await;
    let next: Timestamp = schedule["next_fire_at"].as_str().unwrap().parse().unwrap();
    assert!(next > Timestamp::now());
    let zoned = next.to_zoned(jiff::tz::TimeZone::get("Europe/Paris").unwrap());
    assert_eq!((zoned.hour(), zoned.minute()), (9, 0));
    assert_eq!(schedule["webhook"], "https://93.184.215.14/hook");
    let id = schedule["id"].as_str().unwrap();
    let (status, changed) = client
        .patch(&format!("/v1/schedules/{id}"), &json!({"interval_s": 3600}))
        .await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(changed["cron"], Value::Null);
    assert_eq!(changed["interval_s"], 3600);
    assert_eq!(changed["catch_up"], "none");
    let (status, error) = client
        .patch(&format!("/v1/schedules/{id}"), &json!({"workflow": "x"}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{error}");
    let (status, _) = client.get("/v1/schedules/no-such-schedule").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_for_several_slots_one_catch_up_fire_then_on_time_again() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start_offline(&data, &repo_agents());
    let client = server.client();
    let session = client.session("assistant").await;
    let schedule = create(
        &client,
        json!({"agent": "assistant", "message": "tick", "interval_s": 1, "session": session}),
    )
    .await;
    let id = schedule["id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(20), "two fires", || async {
        (runs(&client, &id).await.len() >= 2).then_some(())
    })
    .await;
    server.kill_9();
    let killed_at = Timestamp::now();
    // Down for several slots.
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    let restarted_at = Timestamp::now();
    let server = Server::start_offline(&data, &repo_agents());
    let client = server.client();

    let all = wait_for(
        Duration::from_secs(30),
        "three fires after the restart",
        || async {
            let runs = runs(&client, &id).await;
            let after = runs.iter().filter(|r| fired_at(r) >= restarted_at).count();
            (after >= 3).then_some(runs)
        },
    )
    .await;
    let before: Vec<&Value> = all.iter().filter(|r| fired_at(r) < killed_at).collect();
    let after: Vec<&Value> = all.iter().filter(|r| fired_at(r) >= restarted_at).collect();
    assert_eq!(before.len() + after.len(), all.len(), "{all:?}");
    let last_before = slot(before.last().unwrap());
    let catch_up = slot(after[0]);
    // The slots missed while down (five or so) fired once, as one: the
    // latest; then every slot on time, none twice.
    assert!(
        catch_up.duration_since(last_before) >= SignedDuration::from_secs(3),
        "the first fire after the restart is the latest missed slot: {all:?}"
    );
    for pair in after.windows(2) {
        assert_eq!(
            slot(pair[1]).duration_since(slot(pair[0])),
            SignedDuration::from_secs(1),
            "after the catch-up, each slot once: {all:?}"
        );
    }
    let (status, _) = client.delete(&format!("/v1/schedules/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    settled(&client, &session).await;
    let turns = user_messages(&client, &session).await;
    // One turn per fire recorded (a fire recorded as the delete landed may
    // have started one more), none doubled by the crash.
    assert!(
        turns >= all.len() && turns <= all.len() + 2,
        "{turns} turns for {} fires: {all:?}",
        all.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_each_slot_is_one_turn_and_a_killed_firing_node_is_taken_over() {
    use support::cluster::{Cluster, ClusterOptions};
    use support::postgres::Postgres;

    let pg = Postgres::shared();
    let database = pg.database("schedules_cluster");
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
        .env("CADRE_CLUSTER_HEARTBEAT_S", "0.2")
        .env("CADRE_CLUSTER_OWNER_STALE_S", "1");
    let mut cluster = Cluster::start(options).await;
    let client = cluster.node_client(0);
    // A session per fire: a slot fired twice would be two turns there, or
    // one, as its key and its session are the slot's.
    let schedule = create(
        &client,
        json!({"agent": "assistant", "message": "tick", "interval_s": 1}),
    )
    .await;
    let id = schedule["id"].as_str().unwrap().to_string();
    let fired = wait_for(Duration::from_secs(30), "three fires", || async {
        let runs = runs(&client, &id).await;
        (runs.iter().filter(|r| r["state"] == "started").count() >= 3).then_some(runs)
    })
    .await;
    let firing = fired.last().unwrap()["node"].as_str().unwrap().to_string();
    let index: usize = firing.trim_start_matches('n').parse().unwrap();
    cluster.kill9(index);
    let killed_at = Timestamp::now();
    let other = cluster.node_client((index + 1) % 3);

    let all = wait_for(
        Duration::from_secs(60),
        "three fires by another node after the kill",
        || async {
            let runs = runs(&other, &id).await;
            let taken = runs
                .iter()
                .filter(|r| fired_at(r) > killed_at && r["node"] != firing.as_str())
                .filter(|r| r["state"] == "started")
                .count();
            (taken >= 3).then_some(runs)
        },
    )
    .await;
    let (status, _) = other.delete(&format!("/v1/schedules/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    for pair in all.windows(2) {
        assert!(slot(&pair[1]) > slot(&pair[0]), "{all:?}");
    }
    let after: Vec<&Value> = all.iter().filter(|r| fired_at(r) > killed_at).collect();
    for pair in after.windows(2) {
        assert_eq!(
            slot(pair[1]).duration_since(slot(pair[0])),
            SignedDuration::from_secs(1),
            "after the takeover, each slot once: {all:?}"
        );
    }
    for run in all.iter().filter(|r| r["state"] == "started") {
        let session = run["session_id"].as_str().unwrap();
        wait_for(Duration::from_secs(30), "the fire's turn", || async {
            (user_messages(&other, session).await >= 1).then_some(())
        })
        .await;
        assert_eq!(
            user_messages(&other, session).await,
            1,
            "slot {} started one turn: {all:?}",
            run["slot"]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fire_recorded_but_not_marked_started_before_a_crash_rejoins_its_turn_at_restart() {
    use cadre::schedules::{CURSORS, FIRING, Fire, FireState, PENDING, RUNS, SCHEDULES, run_key};

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let schedule_id = "0190a000-0000-7000-8000-000000000001";
    let slot = Timestamp::from_second(Timestamp::now().as_second() - 60).unwrap();
    let key = format!("schedule:{schedule_id}:{}", slot.as_millisecond());

    // The crash's state, made for real: the fire's turn started (with the
    // fire's key) in the session ...
    let mut app = spawn_app(AppOptions::offline().data_dir(&data));
    let session = app.session("assistant").await;
    let request = app
        .client
        .request(
            reqwest::Method::POST,
            &format!("/v1/sessions/{session}/messages"),
        )
        .header("idempotency-key", &key)
        .json(&json!({"content": "tick"}));
    let (status, turn) = support::send(request).await;
    assert_eq!(status, StatusCode::OK, "{turn}");
    let turn_id = turn["turn_id"].as_str().unwrap().to_string();
    app.stop();
    drop(app);

    // ... and the store says what a node that died then left: the fire
    // recorded and pending, the schedule's cursor still claimed.
    let store = support::store::open_store(&data);
    let now = Timestamp::now();
    let schedule = json!({
        "id": schedule_id, "tenant": "default", "key_id": null,
        "agent": "assistant", "message": "tick", "session": session,
        "workflow": null, "input": null, "cron": null, "interval_s": 3600,
        "timezone": "UTC", "user_id": null, "webhook": null, "catch_up": "one",
        "anchor": slot, "created_at": slot, "updated_at": slot,
    });
    store
        .put_doc_of(SCHEDULES, "default", schedule_id, schedule, true)
        .await
        .unwrap();
    let next = slot + SignedDuration::from_secs(3600);
    store
        .put_doc(
            FIRING,
            schedule_id,
            json!({"next": next, "node": null, "since": now}),
            true,
        )
        .await
        .unwrap();
    let fire = Fire {
        schedule_id: schedule_id.into(),
        tenant: "default".into(),
        slot,
        fired_at: now,
        node: None,
        state: FireState::Claimed,
        session_id: Some(session.clone()),
        turn_id: None,
        run_id: None,
        error: None,
    };
    let fire = serde_json::to_value(&fire).unwrap();
    for ns in [RUNS, PENDING] {
        store
            .put_doc(ns, &run_key(schedule_id, slot), fire.clone(), true)
            .await
            .unwrap();
    }
    assert!(store.get_doc(CURSORS, schedule_id).await.unwrap().is_none());
    drop(store);

    // The restart takes both up: the fire rejoins its turn, the claim is
    // given back with the slot it held.
    let app = spawn_app(AppOptions::offline().data_dir(&data));
    let client = &app.client;
    let run = wait_for(Duration::from_secs(20), "the fire taken up", || async {
        let runs = runs(client, schedule_id).await;
        runs.into_iter().find(|r| r["state"] != "claimed")
    })
    .await;
    assert_eq!(run["state"], "started", "{run}");
    assert_eq!(run["turn_id"], turn_id.as_str(), "the turn its key started");
    assert_eq!(
        user_messages(client, &session).await,
        1,
        "not a second turn"
    );
    let (_, shown) = client.get(&format!("/v1/schedules/{schedule_id}")).await;
    let shown_next: Timestamp = shown["next_fire_at"].as_str().unwrap().parse().unwrap();
    assert_eq!(shown_next, next, "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_schedule_starts_a_run_per_slot_with_its_input() {
    let app = spawn_app(AppOptions::offline());
    let client = &app.client;
    let (status, error) = client
        .post(
            "/v1/schedules",
            &json!({"workflow": "account-review", "input": {"timeframe": "5Y"}, "interval_s": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("timeframe"),
        "{error}"
    );
    let schedule = create(
        client,
        json!({"workflow": "account-review", "input": {"timeframe": "1M"}, "interval_s": 1}),
    )
    .await;
    assert_eq!(schedule["session"], Value::Null);
    let id = schedule["id"].as_str().unwrap();
    let run = wait_for(Duration::from_secs(30), "a finished run", || async {
        runs(client, id)
            .await
            .into_iter()
            .find(|r| r["status"] == "succeeded")
    })
    .await;
    assert_eq!(run["state"], "started");
    let run_id = run["run_id"].as_str().unwrap();
    let (status, body) = client.get(&format!("/v1/workflows/runs/{run_id}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["input"]["timeframe"], "1M");
    let (status, _) = client.delete(&format!("/v1/schedules/{id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    // The run's id is derived from the slot (a UUID v7 of the slot's
    // time), so a start taken up after a crash rejoins it: starting that
    // id again returns the run and starts nothing.
    let uuid = uuid::Uuid::parse_str(run_id).unwrap();
    let (secs, nanos) = uuid.get_timestamp().unwrap().to_unix();
    assert_eq!(
        i64::try_from(secs).unwrap() * 1000 + i64::from(nanos / 1_000_000),
        slot(&run).as_millisecond(),
        "{run}"
    );
    let count = || async {
        let (_, body) = client
            .get("/v1/workflows/runs?workflow=account-review&limit=1000")
            .await;
        body["runs"].as_array().unwrap().len()
    };
    let before = count().await;
    let again = app
        .runtime
        .as_ref()
        .unwrap()
        .workflows()
        .start(
            "account-review",
            cadre::workflow::StartRun {
                input: json!({"timeframe": "1M"}),
                tenant: String::new(),
                user_id: None,
                parent_run: None,
                plan_ceiling: None,
                webhook: None,
                id: Some(run_id.to_string()),
            },
        )
        .await
        .unwrap();
    assert_eq!(again.id, run_id);
    assert_eq!(again.status.as_str(), "succeeded");
    assert_eq!(count().await, before);
}
