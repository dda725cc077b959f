//! `cadre schedules list|create|delete|runs` (issue #33): the real binary
//! against a real server on loopback (offline model). A schedule created
//! with the CLI is listed with the next fire the API gives it, and with
//! its last run once it fired; deleting it empties the list; an API
//! refusal prints its code and message and exits non-zero; without
//! `--url` the command asks the server holding `--data-dir`, or says that
//! none does.

mod support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;
use support::{AppOptions, Client, spawn_app};

/// Runs the binary with `args` (no `CADRE_*` from this environment).
async fn cadre(args: &[&str]) -> Output {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_cadre"))
            .args(&args)
            .env_remove("CADRE_URL")
            .env_remove("CADRE_API_KEY")
            .env_remove("CADRE_DATA_DIR")
            .env("RUST_LOG", "warn")
            .env("RUST_BACKTRACE", "0")
            .env("RUST_LIB_BACKTRACE", "0")
            .output()
            .expect("the cadre binary runs")
    })
    .await
    .unwrap()
}

/// `cadre ARGS --url … --api-key …`, which must succeed: its stdout.
async fn remote(base: &str, key: &str, args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["--url", base, "--api-key", key]);
    let out = cadre(&all).await;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "cadre {args:?} failed: {}\nstdout: {stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `cadre ARGS --url … --api-key …`, which must fail: its stderr.
async fn refused(base: &str, key: &str, args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["--url", base, "--api-key", key]);
    let out = cadre(&all).await;
    assert!(!out.status.success(), "cadre {args:?} succeeded");
    assert!(out.stdout.is_empty(), "cadre {args:?} printed on stdout");
    String::from_utf8_lossy(&out.stderr).to_string()
}

async fn tenant_key(dir: &Path) -> String {
    let store = support::store::open_store(dir);
    let (key, _) = cadre::tenants::create_key(&store, "acme", false)
        .await
        .expect("key created");
    key
}

/// The line of `list` that starts with `id`.
fn line_of<'a>(list: &'a str, id: &str) -> &'a str {
    list.lines()
        .find(|l| l.starts_with(id))
        .unwrap_or_else(|| panic!("{id} is not listed:\n{list}"))
}

async fn schedule(api: &Client, id: &str) -> Value {
    let (status, body) = api.get(&format!("/v1/schedules/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_are_created_listed_with_their_next_fire_and_last_run_and_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let key = tenant_key(dir.path()).await;
    let app = spawn_app(AppOptions::offline().data_dir(dir.path()));
    let base = app.base.clone();
    let api = app.with_key(&key);

    assert_eq!(remote(&base, &key, &["schedules", "list"]).await, "");

    // A weekday-morning agent turn (it does not fire during the test) and
    // a workflow run every hour.
    let cron = remote(
        &base,
        &key,
        &[
            "schedules",
            "create",
            "--agent",
            "assistant",
            "--message",
            "Give me the morning brief.",
            "--cron",
            "0 9 * * 1-5",
            "--timezone",
            "Europe/Paris",
            "--catch-up",
            "none",
        ],
    )
    .await;
    let cron_id = cron.trim().to_string();
    assert_eq!(
        cron.lines().count(),
        1,
        "create prints the id alone: {cron}"
    );
    let made = schedule(&api, &cron_id).await;
    assert_eq!(made["agent"], "assistant");
    assert_eq!(made["timezone"], "Europe/Paris");
    assert_eq!(made["catch_up"], "none");
    assert_eq!(made["session"], "new");
    let flow = remote(
        &base,
        &key,
        &[
            "schedules",
            "create",
            "--workflow",
            "market-brief",
            "--input",
            r#"{"symbol":"AAPL"}"#,
            "--interval-s",
            "3600",
        ],
    )
    .await;
    let flow_id = flow.trim().to_string();
    assert_eq!(schedule(&api, &flow_id).await["input"]["symbol"], "AAPL");

    let list = remote(&base, &key, &["schedules", "list"]).await;
    assert_eq!(list.lines().count(), 2, "{list}");
    let line = line_of(&list, &cron_id);
    let next = made["next_fire_at"].as_str().expect("a next fire");
    for part in [
        "agent:assistant",
        r#"cron "0 9 * * 1-5" Europe/Paris"#,
        &format!("next {next}"),
        "last never",
    ] {
        assert!(line.contains(part), "`{part}` missing from: {line}");
    }
    let line = line_of(&list, &flow_id);
    let next = schedule(&api, &flow_id).await["next_fire_at"]
        .as_str()
        .unwrap()
        .to_string();
    for part in [
        "workflow:market-brief",
        "every 3600s",
        &format!("next {next}"),
    ] {
        assert!(line.contains(part), "`{part}` missing from: {line}");
    }

    // One that fires every second: its runs, and the list's last run.
    let tick = remote(
        &base,
        &key,
        &[
            "schedules",
            "create",
            "--agent",
            "assistant",
            "--message",
            "tick",
            "--interval-s",
            "1",
        ],
    )
    .await;
    let tick_id = tick.trim().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    let runs = loop {
        let runs = remote(&base, &key, &["schedules", "runs", &tick_id]).await;
        // A fire is listed `claimed` for the moment before its turn starts.
        if runs.lines().next().is_some_and(|l| l.contains(" started ")) {
            break runs;
        }
        assert!(Instant::now() < deadline, "the 1 s schedule never fired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let newest = runs.lines().next().unwrap();
    assert!(
        newest.contains(" fired ") && newest.contains("session ") && newest.contains(" turn "),
        "{runs}"
    );
    let list = remote(&base, &key, &["schedules", "list"]).await;
    let line = line_of(&list, &tick_id).to_string();
    let (_, last) = line.split_once("  last ").expect("a last run");
    let fired_at = last.split_whitespace().next().unwrap();
    let (_, known) = api
        .get(&format!("/v1/schedules/{tick_id}/runs?limit=100"))
        .await;
    assert!(
        known["runs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["fired_at"] == fired_at && line.contains(r["state"].as_str().unwrap())),
        "the last run `{last}` is not one of the schedule's: {known}"
    );

    for id in [&cron_id, &flow_id, &tick_id] {
        let out = remote(&base, &key, &["schedules", "delete", id]).await;
        assert_eq!(out.trim(), format!("deleted {id}"));
    }
    assert_eq!(remote(&base, &key, &["schedules", "list"]).await, "");
    let (status, _) = api.get(&format!("/v1/schedules/{cron_id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_refusals_print_their_code_and_message() {
    let dir = tempfile::tempdir().unwrap();
    let key = tenant_key(dir.path()).await;
    let app = spawn_app(AppOptions::offline().data_dir(dir.path()));
    let base = app.base.clone();

    let stderr = refused(
        &base,
        &key,
        &[
            "schedules",
            "create",
            "--agent",
            "assistant",
            "--message",
            "hi",
            "--cron",
            "every monday",
        ],
    )
    .await;
    assert!(
        stderr.contains("VALIDATION_ERROR (HTTP 422): 'cron' is not a cron expression"),
        "{stderr}"
    );
    let stderr = refused(
        &base,
        &key,
        &[
            "schedules",
            "create",
            "--agent",
            "nobody",
            "--message",
            "hi",
            "--interval-s",
            "60",
        ],
    )
    .await;
    assert!(stderr.contains("VALIDATION_ERROR (HTTP 422)"), "{stderr}");
    assert!(stderr.contains("nobody"), "{stderr}");
    let stderr = refused(&base, &key, &["schedules", "delete", "no-such-schedule"]).await;
    assert!(
        stderr.contains("SCHEDULE_NOT_FOUND (HTTP 404)") && stderr.contains("no-such-schedule"),
        "{stderr}"
    );
    let stderr = refused(&base, "wrong", &["schedules", "list"]).await;
    assert!(
        stderr.contains("UNAUTHORIZED (HTTP 401): the API key is not valid"),
        "{stderr}"
    );
    // Neither a cron nor an interval: refused before anything is sent.
    let stderr = refused(
        &base,
        &key,
        &[
            "schedules",
            "create",
            "--agent",
            "assistant",
            "--message",
            "hi",
        ],
    )
    .await;
    assert!(stderr.contains("--cron"), "{stderr}");
    let (_, listed) = app.with_key(&key).get("/v1/schedules").await;
    assert_eq!(listed["schedules"], serde_json::json!([]), "{listed}");

    // No --url: the server that holds --data-dir answers, saying so.
    let data = dir.path().to_str().unwrap();
    let out = cadre(&["schedules", "list", "--data-dir", data, "--api-key", &key]).await;
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("using it over HTTP"), "{stderr}");
    // ... and with none, what to do instead.
    let empty = tempfile::tempdir().unwrap();
    let out = cadre(&[
        "schedules",
        "list",
        "--data-dir",
        empty.path().to_str().unwrap(),
    ])
    .await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no cadre server holds") && stderr.contains("--url"),
        "{stderr}"
    );
}
