//! The first hour (#20): what a newcomer following the README runs, with the
//! real binary. The server started by the README's first command holds the
//! data dir; the commands after it use that server over HTTP (and say so)
//! instead of failing on redb's lock. `config check` loads exactly as
//! `serve` does. A server with no agents does not start. Every request gets
//! one log line, with no colour codes in a log file and never a key.

mod support;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use support::repo_agents;
use support::server::Server;

/// Runs the binary to its end; a command still running after 60 s (a
/// server that started when it should have refused to) is killed and fails
/// the test.
fn cadre(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cadre"));
    command
        .args(args)
        .env_remove("CADRE_URL")
        .env_remove("CADRE_API_KEY")
        .env_remove("CADRE_CONFIG")
        .env_remove("OPENAI_API_KEY")
        .env_remove("CADRE_MODEL_BASE_URL");
    for (k, v) in env {
        command.env(k, v);
    }
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the cadre binary runs");
    let pid = child.id();
    let (done, waited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if waited.recv_timeout(Duration::from_secs(60)).is_err() {
            // SAFETY: a signal to our own child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    });
    let out = child.wait_with_output().expect("the cadre binary ends");
    let _ = done.send(());
    assert!(
        out.status.code().is_some(),
        "`cadre {}` was still running after 60 s: {}",
        args.join(" "),
        text(&out.stderr)
    );
    out
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn config_check_loads_like_serve_and_a_missing_file_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml");
    let out = cadre(&["config", "check", missing.to_str().unwrap()], &[]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("not found"), "{err}");
    assert!(!err.contains("not a valid"), "{err}");

    let file = dir.path().join("cadre.toml");
    std::fs::write(&file, "[concurrency]\nmax_concurrent = 4\n").unwrap();
    let out = cadre(&["config", "check", file.to_str().unwrap()], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    // The override `serve` would refuse, `config check` refuses too.
    let out = cadre(
        &["config", "check", file.to_str().unwrap()],
        &[("CADRE_CONCURRENCY_MAX_CONCURRENT", "abc")],
    );
    assert!(!out.status.success(), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(err.contains("CADRE_CONCURRENCY_MAX_CONCURRENT"), "{err}");
}

#[test]
fn serve_with_no_agent_stops_naming_the_directory_it_looked_in() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("agents");
    std::fs::create_dir(&empty).unwrap();
    let out = cadre(
        &[
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--data-dir",
            dir.path().join("data").to_str().unwrap(),
            "--agents",
            empty.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("no agent found in"), "{err}");
    assert!(err.contains(empty.to_str().unwrap()), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_on_a_data_dir_held_by_a_server_use_that_server() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start_offline(&data, &repo_agents());
    let data_arg = data.to_str().unwrap().to_string();
    let agents = repo_agents();
    let agents_arg = agents.to_str().unwrap().to_string();

    // The README's next command: a turn with the assistant.
    let data_for_chat = data_arg.clone();
    let out = tokio::task::spawn_blocking(move || {
        cadre(
            &[
                "chat",
                "--data-dir",
                &data_for_chat,
                "--agents",
                &agents_arg,
                "What is 2+3?",
            ],
            &[],
        )
    })
    .await
    .unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("held by the server at {}", server.base)),
        "the command says which server it used: {err}"
    );
    assert!(!err.contains("Database already open"), "{err}");
    assert!(text(&out.stdout).contains('5'), "{}", text(&out.stdout));

    // A read: the session the chat made is listed.
    let data_for_list = data_arg.clone();
    let out = tokio::task::spawn_blocking(move || {
        cadre(&["sessions", "list", "--data-dir", &data_for_list], &[])
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("assistant"),
        "{}",
        text(&out.stdout)
    );

    // `cadre mcp` (stdio) cannot share the file: it says where the server's
    // MCP endpoint is instead.
    let data_for_mcp = data_arg.clone();
    let out =
        tokio::task::spawn_blocking(move || cadre(&["mcp", "--data-dir", &data_for_mcp], &[]))
            .await
            .unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains(&format!("{}/mcp", server.base)), "{err}");

    // A second server on the same data dir says who holds it.
    let data_for_serve = data_arg.clone();
    let out = tokio::task::spawn_blocking(move || {
        cadre(
            &[
                "serve",
                "--addr",
                "127.0.0.1:0",
                "--data-dir",
                &data_for_serve,
            ],
            &[],
        )
    })
    .await
    .unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("already serves"), "{err}");
    assert!(err.contains(&server.base), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_plain_log_line_per_request_with_route_status_and_tenant_never_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // A key, so the log has a tenant to name and a secret not to leak.
    let out = cadre(
        &[
            "keys",
            "create",
            "--tenant",
            "acme",
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let key = text(&out.stdout)
        .split_whitespace()
        .find(|w| w.starts_with("cadre_"))
        .expect("the key is printed")
        .to_string();

    let server = Server::start_offline(&data, &repo_agents());
    let client = server.client().with_key(&key);
    let session = client.session("assistant").await;
    let (status, _) = client.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = server.client().get("/v1/sessions").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let log = server.log_text();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("cadre::http::access_log"))
        .collect();
    let get = lines
        .iter()
        .find(|l| l.contains("route=/v1/sessions/{id}") && l.contains("method=GET"))
        .unwrap_or_else(|| panic!("no line for the GET: {lines:#?}"));
    assert!(get.contains("status=200"), "{get}");
    assert!(get.contains("tenant=acme"), "{get}");
    assert!(get.contains("latency_ms="), "{get}");
    assert!(!get.contains(&session), "the template, not the path: {get}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("status=401") && l.contains("tenant=-")),
        "{lines:#?}"
    );
    assert!(!log.contains(&key), "a key reached the log");
    assert!(!log.contains('\u{1b}'), "colour codes in a log file");
    drop(server);

    // Off with a setting.
    let quiet = Server::start_offline_with(
        &dir.path().join("quiet"),
        &repo_agents(),
        &[("CADRE_SERVER_REQUEST_LOG", "false")],
    );
    let (status, _) = quiet.client().get("/v1/tools").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !quiet.log_text().contains("cadre::http::access_log"),
        "{}",
        quiet.log_tail()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_agents_lists_each_agent_with_its_tools_and_the_plan_each_needs() {
    let app = support::spawn_app(support::AppOptions::offline());
    let (status, body) = app.get("/v1/agents").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let agents = body["agents"].as_array().expect("agents");
    let names: Vec<&str> = agents.iter().map(|a| a["name"].as_str().unwrap()).collect();
    for expected in ["analyst", "assistant", "brokerage", "trading-copilot"] {
        assert!(names.contains(&expected), "{names:?}");
    }
    let assistant = agents.iter().find(|a| a["name"] == "assistant").unwrap();
    let tools: Vec<&str> = assistant["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["echo", "calculator", "http_request"]);
    assert_eq!(assistant["tools"][0]["required_plan"], "free");
    let analyst = agents.iter().find(|a| a["name"] == "analyst").unwrap();
    assert_eq!(analyst["tools"], serde_json::json!([]));
    assert!(
        !body.to_string().contains("system_prompt"),
        "the operator's prompts stay private"
    );
    // Some trading tool needs more than the free plan, and says so.
    let copilot = agents
        .iter()
        .find(|a| a["name"] == "trading-copilot")
        .unwrap();
    assert!(
        copilot["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["required_plan"] != "free"),
        "{copilot}"
    );
}

#[test]
fn the_startup_log_says_which_variable_chose_each_agents_model() {
    let dir = tempfile::tempdir().unwrap();
    let offline = Server::start_offline(&dir.path().join("a"), &repo_agents());
    let log = offline.log_text();
    assert!(
        log.contains("agent assistant: offline") && log.contains("the built-in offline model"),
        "{log}"
    );
    drop(offline);
    // A key left in the shell turns the quick start into paid API calls:
    // the log says so before any call is made.
    let paid = Server::start_offline_with(
        &dir.path().join("b"),
        &repo_agents(),
        &[("OPENAI_API_KEY", "sk-test-not-a-key")],
    );
    let log = paid.log_text();
    assert!(log.contains("OPENAI_API_KEY in the environment"), "{log}");
    assert!(
        !log.contains("sk-test-not-a-key"),
        "the key itself is never logged"
    );
}

/// Over MCP stdio a call held for confirmation can be listed and decided
/// with the two confirmation tools, once, like `POST /v1/confirmations/{id}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_mcp_stdio_a_held_call_is_listed_and_confirmed_once() {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::TokioChildProcess;

    let agents = support::agents_dir(&[("bot.toml", &support::agent_toml("bot", &["ticket"], 2))]);
    std::fs::create_dir(agents.path().join("tools")).unwrap();
    std::fs::write(
        agents.path().join("tools/ticket.toml"),
        "name = \"ticket\"\ndescription = \"Opens a ticket.\"\npost_processor = \"require_confirmation\"\n[entry]\ntype = \"external\"\ncommand = [\"printf\", '{\"ticket\":42}']\n",
    )
    .unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_cadre"));
    cmd.args(["mcp", "--confirmation-tools", "--agents"])
        .arg(agents.path())
        .arg("--data-dir")
        .arg(data.path())
        .env_remove("OPENAI_API_KEY")
        .env_remove("CADRE_MODEL_BASE_URL")
        .env("RUST_LOG", "warn");
    let client = ().serve(TokioChildProcess::new(cmd).unwrap()).await.unwrap();
    let call = |name: &'static str, args: serde_json::Value| {
        let client = &client;
        async move {
            let serde_json::Value::Object(args) = args else {
                panic!("arguments are an object")
            };
            let result = client
                .call_tool(CallToolRequestParams::new(name.to_string()).with_arguments(args))
                .await
                .expect("the call is answered");
            (
                result.is_error == Some(true),
                result.structured_content.clone().unwrap_or_default(),
            )
        }
    };
    let (failed, held) = call("ticket", serde_json::json!({})).await;
    assert!(failed, "{held}");
    assert_eq!(held["error_type"], "CONFIRMATION_REQUIRED", "{held}");

    let (failed, listed) = call("confirmations_list", serde_json::json!({})).await;
    assert!(!failed, "{listed}");
    let pending = listed["confirmations"].as_array().expect("a list");
    assert_eq!(pending.len(), 1, "{listed}");
    assert_eq!(pending[0]["tool_name"], "ticket");
    let id = pending[0]["confirmation_id"].as_str().unwrap().to_string();

    let decide = serde_json::json!({"confirmation_id": id, "approve": true});
    let (failed, outcome) = call("confirmation_decide", decide.clone()).await;
    assert!(!failed, "{outcome}");
    assert_eq!(outcome["status"], "executed", "{outcome}");
    assert_eq!(outcome["result"]["output"]["ticket"], 42, "{outcome}");

    // Once: a second decision finds it decided, and nothing runs again.
    let (failed, again) = call("confirmation_decide", decide).await;
    assert!(failed, "{again}");
    assert_eq!(
        again["error_code"], "CONFIRMATION_ALREADY_DECIDED",
        "{again}"
    );
    let (_, listed) = call("confirmations_list", serde_json::json!({})).await;
    assert_eq!(listed["confirmations"], serde_json::json!([]), "{listed}");
    client.cancel().await.unwrap();

    // Off unless asked: a host's model must not approve its own calls.
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_cadre"));
    cmd.args(["mcp", "--agents"])
        .arg(agents.path())
        .arg("--data-dir")
        .arg(data.path())
        .env_remove("OPENAI_API_KEY")
        .env_remove("CADRE_MODEL_BASE_URL")
        .env("RUST_LOG", "warn");
    let client = ().serve(TokioChildProcess::new(cmd).unwrap()).await.unwrap();
    let names: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(names.contains(&"ticket".to_string()), "{names:?}");
    assert!(
        !names.iter().any(|n| n.starts_with("confirmation")),
        "{names:?}"
    );
    client.cancel().await.unwrap();
}

/// Issue #38: the suite loads a copy of the shipped agent files, never the
/// live `agents/` folder where a team adds its own (docs/agents.md): a
/// team's file in `agents/` is not in the copy, and every shipped file is.
#[test]
fn the_tests_load_a_copy_of_the_shipped_agents_not_the_live_folder() {
    let live = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("agents");
    let copy = repo_agents();
    assert_ne!(copy, live, "the tests read the live agents folder");
    let listed = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/shipped-agents.txt"),
    )
    .unwrap();
    let mut names: Vec<String> = listed
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    names.sort();
    let mut found = Vec::new();
    let mut stack = vec![copy.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                found.push(path.strip_prefix(&copy).unwrap().display().to_string());
            }
        }
    }
    found.sort();
    assert_eq!(found, names, "the copy holds exactly the shipped files");
    for name in &names {
        assert_eq!(
            std::fs::read(live.join(name)).unwrap(),
            std::fs::read(copy.join(name)).unwrap(),
            "{name} differs from the shipped file"
        );
    }
}

/// An agent file and the tool file it names, copied in together (the agent
/// file first, the tool file 40 ms later, inside the watchers' 150 ms quiet
/// period, as a copy of a folder writes them): one rescan pass registers
/// the tool before it reads the agent, so the agent loads at once and no
/// `load_error` is ever published for it. (Two watchers, before: the
/// agent's reload ran before the tool's and failed until the next rescan.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_and_its_tool_dropped_in_together_load_without_a_load_error() {
    use cadre::events::EventKind;
    use support::{AppOptions, spawn_app};
    let agents = support::agents_dir(&[("base.toml", &support::agent_toml("base", &[], 2))]);
    std::fs::create_dir(agents.path().join("tools")).unwrap();
    // Rescans an hour apart: the agent must arrive by the watchers' pass.
    let app = spawn_app(
        AppOptions::offline()
            .agents(agents.path())
            .config_toml("[tools]\nreload_interval_s = 3600\n"),
    );
    let mut events = app.runtime.as_ref().unwrap().events().subscribe();
    std::fs::write(
        agents.path().join("orders.toml"),
        support::agent_toml("orders", &["lookup_order"], 2),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(40));
    std::fs::write(
        agents.path().join("tools/lookup_order.yaml"),
        "name: lookup_order\ndescription: Look up an order\nparameters:\n  - {name: order_id, type: string, required: true}\nentry: {type: builtin, handler: echo}\n",
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    loop {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .unwrap_or_else(|_| panic!("the agent never loaded; events: {seen:?}"))
            .expect("event bus open");
        match event.kind {
            EventKind::LoadError { file, message, .. } => {
                panic!("load_error for {file}: {message}; events before: {seen:?}")
            }
            EventKind::AgentAdded { agent, .. } if agent == "orders" => break,
            other => seen.push(format!("{other:?}")),
        }
    }
    let (_, listed) = app.get("/v1/agents").await;
    let names: Vec<&str> = listed["agents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["name"].as_str())
        .collect();
    assert!(names.contains(&"orders"), "{listed}");
}

/// An agent whose `[model] api_key_env` names a variable that is not set:
/// the startup log names the agent and the variable, and its turns answer
/// 503 `MODEL_KEY_NOT_SET` without a request to the model (they used to
/// send an empty bearer). A server started with the variable set sends it
/// as the bearer, and never logs its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unset_api_key_env_is_named_at_startup_and_refuses_the_turn() {
    const VAR: &str = "CADRE_TEST_NO_SUCH_KEY_VAR";
    let model = support::MockModel::start().await;
    model.set_default(Some(support::Reply::text("hello from the model")));
    let agents = support::agents_dir(&[(
        "keyed.toml",
        &format!(
            "{}\n[model]\nbase_url = \"{}\"\napi_key_env = \"{VAR}\"\n",
            support::agent_toml("keyed", &[], 2),
            model.base_url()
        ),
    )]);
    let data = tempfile::tempdir().unwrap();
    let unset = Server::start(
        &data.path().join("a"),
        agents.path(),
        &model.base_url(),
        &[],
    );
    let log = unset.log_text();
    assert!(
        log.contains(VAR) && log.contains("keyed") && log.contains("api_key_env"),
        "{log}"
    );
    let client = unset.client();
    let session = client.session("keyed").await;
    let (status, body) = client.say(&session, "hello").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "MODEL_KEY_NOT_SET", "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains(VAR),
        "{body}"
    );
    assert_eq!(model.request_count(), 0, "{:?}", model.requests());
    drop(unset);

    let set = Server::start(
        &data.path().join("b"),
        agents.path(),
        &model.base_url(),
        &[(VAR, "sk-test-value-123")],
    );
    let client = set.client();
    let session = client.session("keyed").await;
    let (status, body) = client.say(&session, "hello").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(model.authorizations(), ["Bearer sk-test-value-123"]);
    let log = set.log_text();
    assert!(!log.contains(&format!("{VAR}, which is not set")), "{log}");
    assert!(!log.contains("sk-test-value-123"), "{log}");
}

/// A `server.json` left by a killed server whose pid the system has since
/// given to another process (here a `sleep`): commands and `serve` use the
/// data dir themselves, they do not believe the file (the live server's
/// lock on `server.lock` is what counts).
#[test]
fn a_leftover_server_json_naming_a_reused_pid_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut other = Command::new("sleep").arg("60").spawn().expect("sleep");
    std::fs::write(
        data.join("server.json"),
        format!(r#"{{"url":"http://127.0.0.1:9","pid":{}}}"#, other.id()),
    )
    .unwrap();
    let out = cadre(
        &["sessions", "list", "--data-dir", data.to_str().unwrap()],
        &[],
    );
    let _ = other.kill();
    let _ = other.wait();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("held by the server"), "{err}");
}
