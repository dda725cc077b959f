//! `cadre … --url URL --api-key KEY`: the real binary against a real server
//! on loopback (mock model at the wire). Each read command's output with
//! `--url` must equal the same command's output on the data dir once the
//! server has stopped; server errors must print clearly and exit non-zero.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{AppOptions, MockModel, Reply, repo_agents, spawn_app};

fn cadre(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cadre"))
        .args(args)
        .env_remove("CADRE_URL")
        .env_remove("CADRE_API_KEY")
        .env("RUST_LOG", "warn")
        .output()
        .expect("the cadre binary runs")
}

/// Runs `cadre ARGS --url … --api-key …`; its stdout, after checking it succeeded.
fn remote(base: &str, key: &str, args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["--url", base, "--api-key", key]);
    ok(cadre(&all), args)
}

fn ok(out: Output, args: &[&str]) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "cadre {args:?} failed: {}\nstdout: {stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn local(data_dir: &Path, args: &[&str]) -> String {
    let dir = data_dir.to_str().unwrap();
    let mut all = args.to_vec();
    all.extend(["--data-dir", dir]);
    ok(cadre(&all), args)
}

async fn admin_key(dir: &Path) -> String {
    let store = support::store::open_store(dir);
    let (key, _) = cadre::tenants::create_key(&store, "acme", true)
        .await
        .expect("key created");
    key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_commands_print_what_the_local_ones_print() {
    let model = MockModel::start().await;
    model.push_all([
        Reply::tool_call("call_1", "calculator", r#"{"expression":"6*7"}"#),
        Reply::text("It is 42."),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let key = admin_key(dir.path()).await;
    let mut app = spawn_app(AppOptions::with_model(&model).data_dir(dir.path()));
    let base = app.base.clone();

    // chat: a new session, one streamed turn with a tool call.
    let chat = tokio::task::spawn_blocking({
        let (base, key) = (base.clone(), key.clone());
        move || {
            remote(
                &base,
                &key,
                &["chat", "--agent", "assistant", "What is 6*7?"],
            )
        }
    })
    .await
    .unwrap();
    assert!(chat.contains("[tool] calculator("), "{chat}");
    assert!(chat.contains("[tool] calculator -> ok: "), "{chat}");
    assert!(chat.trim_end().ends_with("It is 42."), "{chat}");

    let run = |args: &'static [&'static str]| {
        let (base, key) = (base.clone(), key.clone());
        tokio::task::spawn_blocking(move || remote(&base, &key, args))
    };
    let list = run(&["sessions", "list"]).await.unwrap();
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 1, "{list}");
    let id = lines[0].split_whitespace().next().unwrap().to_string();
    assert!(lines[0].contains("acme") && lines[0].contains("assistant"));

    let with_id = |cmd: &'static str| {
        let (base, key, id) = (base.clone(), key.clone(), id.clone());
        tokio::task::spawn_blocking(move || remote(&base, &key, &["sessions", cmd, &id]))
    };
    let show = with_id("show").await.unwrap();
    assert!(show.contains("→ calculator("), "{show}");
    assert!(show.contains("assistant: It is 42."), "{show}");
    let export = with_id("export").await.unwrap();
    let doc: Value = serde_json::from_str(&export).expect("export is JSON");
    assert_eq!(doc["session"]["id"], json!(id));
    assert_eq!(doc["calls"][0]["tool_name"], "calculator");
    // The HTTP API's export is the document the CLI prints.
    let (_, api) = app
        .with_key(&key)
        .get(&format!("/v1/sessions/{id}/export"))
        .await;
    assert_eq!(api, doc);
    let summary = with_id("summary").await.unwrap();
    let s: Value = serde_json::from_str(&summary).unwrap();
    assert_eq!(s["session_id"], json!(id));

    let calls_args: &'static [&'static str] = &["calls", "--tool", "calculator"];
    let calls = run(calls_args).await.unwrap();
    assert!(
        calls.contains("calculator") && calls.contains(" ok "),
        "{calls}"
    );
    let stats = run(&["stats"]).await.unwrap();
    assert!(
        stats.lines().any(|l| l.starts_with("calculator ")),
        "{stats}"
    );
    let tools = run(&["tools", "list"]).await.unwrap();
    assert!(
        tools.lines().any(|l| l.starts_with("calculator ")),
        "{tools}"
    );
    let workflows = run(&["workflow", "list"]).await.unwrap();
    assert!(workflows.contains("market-brief"), "{workflows}");

    let invoked = run(&[
        "tools",
        "invoke",
        "calculator",
        "--params",
        r#"{"expression":"2+3"}"#,
    ])
    .await
    .unwrap();
    let result: Value = serde_json::from_str(&invoked).expect("invoke prints the result");
    assert_eq!(result["is_success"], true, "{result}");
    assert_eq!(result["output"]["result"].as_f64(), Some(5.0), "{result}");

    // The same commands on the data dir, once the server let go of it.
    app.stop();
    if support::redb_only(
        "the local commands (--data-dir) read a redb data dir; a cluster's store is read through the remote ones, checked above",
    ) {
        return;
    }
    let data = dir.path();
    assert_eq!(local(data, &["sessions", "list"]), list);
    assert_eq!(local(data, &["sessions", "show", &id]), show);
    assert_eq!(local(data, &["sessions", "export", &id]), export);
    assert_eq!(local(data, &["sessions", "summary", &id]), summary);
    // The direct invoke added a second calculator call.
    assert_eq!(
        local(data, &["calls", "--tool", "calculator"])
            .lines()
            .nth(1),
        calls.lines().next()
    );
    let agents = repo_agents();
    let agents = agents.to_str().unwrap();
    assert_eq!(
        ok(cadre(&["tools", "list", "--agents", agents]), &["tools"]),
        tools
    );
    let stats_after = local(data, &["stats"]);
    assert_eq!(stats_after.lines().next(), stats.lines().next());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_print_clearly_and_exit_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let key = admin_key(dir.path()).await;
    let app = spawn_app(AppOptions::offline().data_dir(dir.path()));
    let base = app.base.clone();
    let (status, _) = app.get("/v1/sessions").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "the server needs keys");

    let out = tokio::task::spawn_blocking({
        let (base, key) = (base.clone(), key.clone());
        move || {
            cadre(&[
                "sessions",
                "show",
                "no-such-id",
                "--url",
                &base,
                "--api-key",
                &key,
            ])
        }
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    assert!(stderr.contains("(HTTP 404)"), "{stderr}");
    assert!(stderr.contains("no-such-id"), "{stderr}");

    let out = tokio::task::spawn_blocking({
        let base = base.clone();
        move || cadre(&["sessions", "list", "--url", &base, "--api-key", "wrong"])
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("UNAUTHORIZED (HTTP 401): the API key is not valid"),
        "{stderr}"
    );

    // A tool call that fails prints its result and exits non-zero.
    let out = tokio::task::spawn_blocking({
        let (base, key) = (base.clone(), key.clone());
        move || {
            cadre(&[
                "tools",
                "invoke",
                "no_such_tool",
                "--url",
                &base,
                "--api-key",
                &key,
            ])
        }
    })
    .await
    .unwrap();
    assert!(!out.status.success());
    let result: Value = serde_json::from_slice(&out.stdout).expect("the result is printed");
    assert_eq!(result["is_success"], false);

    // Nothing listens here: the URL is named.
    drop(app);
    let out =
        tokio::task::spawn_blocking(move || cadre(&["stats", "--url", &base, "--api-key", &key]))
            .await
            .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("cannot reach cadre at"), "{stderr}");
}
