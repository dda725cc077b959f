//! Access (#20): what a newcomer meets once keys exist, with the real
//! binary where keys and the CLI are involved. Sessions made in open mode
//! stay tenant `default`'s, and the first key of another tenant says so;
//! browsers reach the visitor WebSocket with a short-lived, single-use
//! token instead of a header; agent files reload like tools; the CLI
//! completes in bash, zsh and fish.

mod support;

use std::process::{Command, Output, Stdio};

use reqwest::StatusCode;
use serde_json::json;
use support::repo_agents;
use support::server::Server;

/// Runs the binary to its end (no `CADRE_*` from the test's environment).
fn cadre(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cadre"))
        .args(args)
        .env_remove("CADRE_URL")
        .env_remove("CADRE_API_KEY")
        .env_remove("CADRE_CONFIG")
        .env_remove("OPENAI_API_KEY")
        .env_remove("CADRE_MODEL_BASE_URL")
        .stdin(Stdio::null())
        .output()
        .expect("the cadre binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `cadre keys create` on a data dir a server holds (it goes over HTTP):
/// the key, and what the command said on stderr.
async fn create_key(data: &str, args: &[&str]) -> (String, String) {
    let mut all = vec!["keys", "create", "--data-dir", data];
    all.extend_from_slice(args);
    let all: Vec<String> = all.into_iter().map(String::from).collect();
    let out = tokio::task::spawn_blocking(move || {
        cadre(&all.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    (text(&out.stdout).trim().to_string(), err)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_mode_sessions_stay_tenant_default_and_the_first_other_key_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start_offline(&data, &repo_agents());
    let data = data.to_str().unwrap().to_string();
    let open = server.client();
    let session = open.session("assistant").await;
    let path = format!("/v1/sessions/{session}");

    // The operator's first key, for another tenant: it is told where the
    // open-mode sessions went, and it does not read them.
    let (acme, err) = create_key(&data, &["--tenant", "acme", "--admin"]).await;
    assert!(
        err.contains("tenant 'default'") && err.contains("--tenant default"),
        "{err}"
    );
    assert_eq!(open.get(&path).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(
        open.with_key(&acme).get(&path).await.0,
        StatusCode::NOT_FOUND
    );

    // The key the notice names reads them; once it exists, no more notice.
    let (default, err) = create_key(&data, &["--tenant", "default", "--api-key", &acme]).await;
    assert!(!err.contains("note:"), "{err}");
    let (status, body) = open.with_key(&default).get(&path).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["id"], json!(session));
    let (_, err) = create_key(&data, &["--tenant", "beta", "--api-key", &acme]).await;
    assert!(!err.contains("note:"), "{err}");
}

/// Opens `session`'s visitor WebSocket with `?token=` and no header; a
/// refused upgrade is its HTTP status.
async fn ws_with_token(base: &str, session: &str, token: &str) -> Result<support::ws::Ws, u16> {
    let url = format!(
        "{}/v1/sessions/{session}/ws?token={token}",
        base.replacen("http://", "ws://", 1)
    );
    match tokio_tungstenite::connect_async(url).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_opens_the_websocket_with_a_single_use_token_bound_to_its_session_and_key() {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;

    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_offline(&dir.path().join("data"), &repo_agents());
    let open = server.client();
    // A token asked for in open mode works only while the server is open.
    let early = open.session("assistant").await;
    let (_, body) = open
        .post(&format!("/v1/sessions/{early}/ws-token"), &json!({}))
        .await;
    let open_token = body["token"].as_str().unwrap().to_string();
    let (_, admin) = open
        .post("/v1/keys", &json!({"tenant": "ops", "admin": true}))
        .await;
    assert_eq!(
        ws_with_token(&server.base, &early, &open_token).await.err(),
        Some(401)
    );
    let admin = open.with_key(admin["key"].as_str().unwrap());
    let key_of = |tenant: &'static str| {
        let admin = admin.clone();
        async move {
            let (status, body) = admin.post("/v1/keys", &json!({"tenant": tenant})).await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
            (
                body["key"].as_str().unwrap().to_string(),
                body["key_id"].as_str().unwrap().to_string(),
            )
        }
    };
    let (acme_key, acme_id) = key_of("acme").await;
    let (beta_key, _) = key_of("beta").await;
    let acme = open.with_key(&acme_key);
    let beta = open.with_key(&beta_key);
    let session = acme.session("assistant").await;
    let other = acme.session("assistant").await;
    let token_path = format!("/v1/sessions/{session}/ws-token");

    // With the key, a token; with it, the socket, once.
    let (status, body) = acme.post(&token_path, &json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["expires_in"], 60);
    let token = body["token"].as_str().unwrap().to_string();
    let mut ws = ws_with_token(&server.base, &session, &token)
        .await
        .expect("the token opens the socket");
    ws.send(Message::text(
        json!({"type": "assign_operator", "operator_id": "op1"}).to_string(),
    ))
    .await
    .unwrap();
    let frame = ws.next().await.unwrap().unwrap();
    assert!(
        frame.to_text().unwrap().contains("operator_assigned"),
        "{frame}"
    );
    assert_eq!(
        ws_with_token(&server.base, &session, &token).await.err(),
        Some(401),
        "single use"
    );

    // Bound to its session; another tenant gets no token for it; the key
    // itself is no token.
    let (_, body) = acme.post(&token_path, &json!({})).await;
    let token = body["token"].as_str().unwrap();
    assert_eq!(
        ws_with_token(&server.base, &other, token).await.err(),
        Some(401)
    );
    let (status, _) = beta.post(&token_path, &json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        ws_with_token(&server.base, &session, &acme_key).await.err(),
        Some(401)
    );

    // A revoked key's tokens stop working with it.
    let (_, body) = acme.post(&token_path, &json!({})).await;
    let token = body["token"].as_str().unwrap();
    let (status, _) = admin.delete(&format!("/v1/keys/{acme_id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        ws_with_token(&server.base, &session, token).await.err(),
        Some(401)
    );
}

/// Writes `text` to `dir/name` whole (rename into place), as an editor
/// saves, so a reload never reads half a file.
fn put(dir: &std::path::Path, name: &str, text: &str) {
    let staging = dir.join(format!(".{name}.partial"));
    std::fs::write(&staging, text).unwrap();
    std::fs::rename(&staging, dir.join(name)).unwrap();
}

fn agent(name: &str, prompt: &str) -> String {
    format!("name = {name:?}\nsystem_prompt = {prompt:?}\n")
}

/// Receives runtime events until `pick` accepts one (bounded).
async fn wait_for(
    rx: &mut tokio::sync::broadcast::Receiver<cadre::events::Event>,
    what: &str,
    pick: impl Fn(&cadre::events::EventKind) -> bool,
) -> cadre::events::EventKind {
    let found = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        loop {
            match rx.recv().await {
                Ok(event) if pick(&event.kind) => return event.kind,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("{e}"),
            }
        }
    });
    found.await.unwrap_or_else(|_| panic!("no {what} event"))
}

/// The system prompts of the model requests from the `from`th on.
fn prompts_since(model: &support::mock_model::MockModel, from: usize) -> String {
    model.requests()[from..]
        .iter()
        .map(|r| {
            r["messages"][0]["content"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn agent_files_reload_like_tools_and_a_bad_edit_keeps_the_last_good_version() {
    use cadre::events::EventKind;
    use support::mock_model::{MockModel, Reply};
    use support::{AppOptions, spawn_app};

    let model = MockModel::start().await;
    model.set_default(Some(Reply::text("ok")));
    let agents = tempfile::tempdir().unwrap();
    let dir = agents.path();
    put(
        dir,
        "alpha.toml",
        &agent("alpha", "You are alpha, version one."),
    );
    let app = spawn_app(
        AppOptions::with_model(&model)
            .agents(dir)
            .config_toml("[tools]\nreload_interval_s = 0.2\n"),
    );
    let mut events = app.runtime.as_ref().unwrap().events().subscribe();
    let session = app.session("alpha").await;
    assert_eq!(app.say(&session, "hi").await.0, StatusCode::OK);
    assert!(prompts_since(&model, 0).contains("version one"));

    // An edit: the running conversation uses it from its next turn.
    put(
        dir,
        "alpha.toml",
        &agent("alpha", "You are alpha, version two."),
    );
    wait_for(
        &mut events,
        "agent_updated alpha",
        |k| matches!(k, EventKind::AgentUpdated { agent, .. } if agent == "alpha"),
    )
    .await;
    let seen = model.request_count();
    assert_eq!(app.say(&session, "again").await.0, StatusCode::OK);
    let prompts = prompts_since(&model, seen);
    assert!(
        prompts.contains("version two") && !prompts.contains("version one"),
        "{prompts}"
    );

    // A bad edit is reported and the last good version stays.
    put(dir, "alpha.toml", "name = \"alpha\"\nsystem_prompt = \n");
    let error = wait_for(
        &mut events,
        "load_error alpha.toml",
        |k| matches!(k, EventKind::LoadError { file, .. } if file.ends_with("alpha.toml")),
    )
    .await;
    assert!(format!("{error:?}").contains("alpha.toml"), "{error:?}");
    let seen = model.request_count();
    assert_eq!(app.say(&session, "still there?").await.0, StatusCode::OK);
    assert!(prompts_since(&model, seen).contains("version two"));
    let (status, _) = app.post("/v1/sessions", &json!({"agent": "alpha"})).await;
    assert_eq!(status, StatusCode::CREATED);

    // A new file is a new agent.
    put(dir, "beta.toml", &agent("beta", "You are beta."));
    wait_for(
        &mut events,
        "agent_added beta",
        |k| matches!(k, EventKind::AgentAdded { agent, .. } if agent == "beta"),
    )
    .await;
    let (_, listed) = app.get("/v1/agents").await;
    let names: Vec<&str> = listed["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alpha", "beta"]);

    // A removed file: no new sessions; its sessions stay readable and their
    // turns say the agent is gone.
    std::fs::remove_file(dir.join("alpha.toml")).unwrap();
    wait_for(
        &mut events,
        "agent_removed alpha",
        |k| matches!(k, EventKind::AgentRemoved { agent } if agent == "alpha"),
    )
    .await;
    let (status, body) = app.post("/v1/sessions", &json!({"agent": "alpha"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "AGENT_NOT_FOUND");
    assert_eq!(
        app.get(&format!("/v1/sessions/{session}")).await.0,
        StatusCode::OK
    );
    let (status, body) = app.say(&session, "hello?").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "AGENT_NOT_FOUND");
}

#[test]
fn completions_are_printed_for_bash_zsh_and_fish() {
    let bash = cadre(&["completions", "bash"]);
    assert!(bash.status.success(), "{}", text(&bash.stderr));
    let script = text(&bash.stdout);
    assert!(
        script.contains("_cadre()") && script.contains("complete -F _cadre"),
        "{script}"
    );
    for sub in ["serve", "keys", "completions", "--data-dir", "--tenant"] {
        assert!(script.contains(sub), "bash completes {sub}");
    }
    // The script is valid bash.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cadre.bash");
    std::fs::write(&file, &script).unwrap();
    let syntax = Command::new("bash").arg("-n").arg(&file).output().unwrap();
    assert!(syntax.status.success(), "{}", text(&syntax.stderr));

    let zsh = cadre(&["completions", "zsh"]);
    assert!(zsh.status.success());
    assert!(text(&zsh.stdout).starts_with("#compdef cadre"));
    let fish = cadre(&["completions", "fish"]);
    assert!(fish.status.success());
    let fish = text(&fish.stdout);
    assert!(
        fish.contains("complete -c cadre") && fish.contains("Where the redb database lives"),
        "{fish}"
    );

    let bad = cadre(&["completions", "tcsh"]);
    assert!(!bad.status.success());
}

/// Issue #29 (6): revoking a key ends what it already opened, within about
/// a second: its `/v1/events` stream (an admin's sees every tenant's
/// events), its visitor WebSocket, and its `GET /mcp` stream. Another
/// key's stream goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_a_key_ends_its_open_streams_and_sockets() {
    use futures::StreamExt;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_offline(&dir.path().join("data"), &repo_agents());
    let open = server.client();
    let (_, body) = open
        .post("/v1/keys", &json!({"tenant": "ops", "admin": true}))
        .await;
    let root = open.with_key(body["key"].as_str().unwrap());
    let (_, body) = root
        .post("/v1/keys", &json!({"tenant": "ops", "admin": true}))
        .await;
    let (doomed_key, doomed_id) = (
        body["key"].as_str().unwrap().to_string(),
        body["key_id"].as_str().unwrap().to_string(),
    );
    let doomed = open.with_key(&doomed_key);

    let events = |client: support::Client| async move {
        let response = client
            .request(reqwest::Method::GET, "/v1/events")
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.bytes_stream()
    };
    let mut doomed_events = events(doomed.clone()).await;
    let mut other_events = events(root.clone()).await;

    let session = doomed.session("assistant").await;
    let (_, token) = doomed
        .post(&format!("/v1/sessions/{session}/ws-token"), &json!({}))
        .await;
    let mut socket = ws_with_token(&server.base, &session, token["token"].as_str().unwrap())
        .await
        .expect("the socket opens");

    let (status, _) = root.delete(&format!("/v1/keys/{doomed_id}")).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let revoked = Instant::now();

    // The stream ends (it may still carry what was queued before).
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(chunk) = doomed_events.next().await {
            if chunk.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the revoked key's /v1/events stream went on");
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(message)) = socket.next().await {
            if message.is_close() {
                break;
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the revoked key's WebSocket stayed open");
    println!(
        "streams of a revoked key ended {:?} after the revoke",
        revoked.elapsed()
    );

    // Another key's stream is untouched: it has not ended (a tool call's
    // events may or may not have reached it yet).
    root.post(
        "/v1/tools/calculator/invoke",
        &json!({"params": {"expression": "1+1"}}),
    )
    .await;
    let more = tokio::time::timeout(Duration::from_secs(2), other_events.next()).await;
    assert!(
        matches!(more, Err(_) | Ok(Some(Ok(_)))),
        "the other key's stream ended: {more:?}"
    );
}
