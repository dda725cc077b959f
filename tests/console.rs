//! The browser console (`/console`): its files as served (types, ETags,
//! Content-Security-Policy, public on a keyed server while the API is not),
//! and the console itself driven in headless Chromium against the real
//! server and the mock model.
//!
//! cargo test ──▶ cadre (keys for acme, globex, ops-admin; two schedules; memory items) + mock model
//!            ──▶ node tests/console/drive.mjs ──playwright-core──▶ /usr/bin/chromium ──▶ /console
//!
//! The browser test installs what it needs when run as root (CI): Debian's
//! `chromium` ([`support::haproxy::ensure_installed`]) and `playwright-core`
//! with `npm ci` from the committed lock file into a dir under `target/`.
//! It saves a screenshot of each view under `target/console-screenshots/`.

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{CACHE_CONTROL, CONTENT_TYPE, ETAG, IF_NONE_MATCH, LOCATION};
use serde_json::json;
use support::{AppOptions, MockModel, Reply, spawn_app};

/// The browser scenarios, chromium's start included.
const BROWSER_PATIENCE: Duration = Duration::from_secs(240);

/// Creates one key per `(tenant, admin)` in `dir`'s store, then closes it.
async fn create_keys(dir: &Path, specs: &[(&str, bool)]) -> Vec<String> {
    let store = support::store::open_store(dir);
    let mut keys = Vec::new();
    for (tenant, admin) in specs {
        let (key, _) = cadre::tenants::create_key(&store, tenant, *admin)
            .await
            .expect("key created");
        keys.push(key);
    }
    drop(store);
    keys
}

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client")
}

#[tokio::test]
async fn console_files_are_public_typed_tagged_and_held_to_their_own_origin() {
    let dir = tempfile::tempdir().unwrap();
    let keys = create_keys(dir.path(), &[("acme", false)]).await;
    let app = spawn_app(AppOptions::offline().data_dir(dir.path()));
    let http = no_redirects();

    let r = http
        .get(format!("{}/console", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(r.headers()[LOCATION], "/console/");

    // Served without a key on a keyed server, where the API asks for one.
    let page = http
        .get(format!("{}/console/", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert_eq!(page.headers()[CONTENT_TYPE], "text/html; charset=utf-8");
    assert_eq!(page.headers()[CACHE_CONTROL], "no-cache");
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    for directive in [
        "default-src 'self'",
        "script-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(directive), "{directive} missing from {csp}");
    }
    assert_eq!(page.headers()["x-content-type-options"], "nosniff");
    let etag = page.headers()[ETAG].clone();
    let html = page.text().await.unwrap();
    assert!(
        html.contains(r#"<script type="module" src="app.js">"#),
        "{html}"
    );
    let (status, body) = app.get("/v1/sessions").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, _) = app.with_key(&keys[0]).get("/v1/sessions").await;
    assert_eq!(status, StatusCode::OK);

    // The same tag again: 304 without a body.
    let again = http
        .get(format!("{}/console/", app.base))
        .header(IF_NONE_MATCH, etag.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(again.headers()[ETAG], etag);
    assert!(again.bytes().await.unwrap().is_empty());

    // Every module the page imports is served as JavaScript, and no file
    // reaches outside the origin (no CDN, no absolute URL).
    let mut modules = vec!["app.js".to_string()];
    let mut seen = Vec::new();
    while let Some(name) = modules.pop() {
        if seen.contains(&name) {
            continue;
        }
        let r = http
            .get(format!("{}/console/{name}", app.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{name}");
        assert_eq!(
            r.headers()[CONTENT_TYPE],
            "text/javascript; charset=utf-8",
            "{name}"
        );
        assert!(r.headers().contains_key(ETAG), "{name}");
        let text = r.text().await.unwrap();
        // The SVG namespace is a name, not a place anything is fetched from.
        let outside = text.replace("\"http://www.w3.org/2000/svg\"", "");
        assert!(
            !outside.contains("http://") && !outside.contains("https://"),
            "{name} names another origin"
        );
        for line in text.lines().filter(|l| l.starts_with("import ")) {
            let from = line
                .rsplit_once("from \"./")
                .map(|(_, rest)| rest.trim_end_matches("\";").to_string())
                .unwrap_or_else(|| panic!("{name}: an import not by relative path: {line}"));
            modules.push(from);
        }
        seen.push(name);
    }
    assert!(seen.len() >= 8, "only {seen:?} reached from app.js");
    let css = http
        .get(format!("{}/console/console.css", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(css.headers()[CONTENT_TYPE], "text/css; charset=utf-8");

    let missing = http
        .get(format!("{}/console/nothing.js", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let body: serde_json::Value = missing.json().await.unwrap();
    assert_eq!(body["error"]["code"], "NOT_FOUND");
}

/// The repository's `target/` (where `npm ci` installs and screenshots go).
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target/tmp has a parent")
        .to_path_buf()
}

/// `playwright-core` installed from `tests/console/package-lock.json` into
/// `target/console-node/`; its `node_modules`.
async fn playwright_core() -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console");
    let dir = target_dir().join("console-node");
    std::fs::create_dir_all(&dir).unwrap();
    let lock = std::fs::read(source.join("package-lock.json")).unwrap();
    let installed = dir
        .join("node_modules/playwright-core/package.json")
        .exists()
        && std::fs::read(dir.join("package-lock.json")).ok().as_ref() == Some(&lock);
    if !installed {
        for file in ["package.json", "package-lock.json"] {
            std::fs::copy(source.join(file), dir.join(file)).unwrap();
        }
        let out = tokio::process::Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--ignore-scripts"])
            .current_dir(&dir)
            .output()
            .await
            .expect("npm runs (the console tests need Node.js 20 and npm)");
        assert!(
            out.status.success(),
            "npm ci failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    dir.join("node_modules")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_drives_a_conversation_an_approval_and_a_workflow_in_chromium() {
    support::haproxy::ensure_installed("chromium", "chromium");
    let node_modules = playwright_core().await;

    let model = MockModel::start().await;
    let dir = tempfile::tempdir().unwrap();
    let keys = create_keys(
        dir.path(),
        &[("acme", false), ("globex", false), ("ops", true)],
    )
    .await;
    let app = spawn_app(
        AppOptions::with_model(&model)
            .data_dir(dir.path())
            .config_toml("[api_limit]\nper_second = 100000\nburst = 100000\n"),
    );
    let acme = app.with_key(&keys[0]);
    let globex = app.with_key(&keys[1]);
    let (status, session) = acme
        .post(
            "/v1/sessions",
            &json!({"agent": "trading-copilot", "plan": "pro", "user_id": "alice"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{session}");
    let (status, other) = globex
        .post("/v1/sessions", &json!({"agent": "assistant"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{other}");

    // A lead that asked the brokerage agent (#31), before the browser runs.
    let (status, lead) = acme.post("/v1/sessions", &json!({"agent": "lead"})).await;
    assert_eq!(status, StatusCode::CREATED, "{lead}");
    model.push_all([
        Reply::tool_call("call_ask", "ask_brokerage", r#"{"request":"my cash?"}"#),
        Reply::text("You hold 12340.10 in cash."),
        Reply::text("The brokerage agent says you hold 12340.10 in cash."),
    ]);
    let (status, asked) = acme
        .post(
            &format!("/v1/sessions/{}/messages", lead["id"].as_str().unwrap()),
            &json!({"content": "how much cash do I have?"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{asked}");

    // A typed answer and a turn that missed its schema twice (#39).
    let (status, typed) = acme
        .post("/v1/sessions", &json!({"agent": "assistant"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{typed}");
    let typed_messages = format!("/v1/sessions/{}/messages", typed["id"].as_str().unwrap());
    let place = json!({"type": "json_schema", "json_schema": {"name": "place", "schema": {
        "type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}});
    model.push_all([
        Reply::text(r#"{"city": "Lyon"}"#),
        Reply::text("somewhere"),
        Reply::text("still prose"),
    ]);
    let (status, body) = acme
        .post(
            &typed_messages,
            &json!({"content": "where?", "response_format": place}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = acme
        .post(
            &typed_messages,
            &json!({"content": "and now?", "response_format": place}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");

    // Schedules (#33): one of acme's that fires next New Year's Day, and
    // one made with a key since revoked, firing every second: each fire is
    // recorded `skipped` and asks the model nothing.
    let (status, schedule) = acme
        .post(
            "/v1/schedules",
            &json!({"agent": "assistant", "message": "Happy new year?", "cron": "0 0 1 1 *"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{schedule}");
    assert!(schedule["next_fire_at"].is_string(), "{schedule}");
    let admin = app.with_key(&keys[2]);
    let (status, spare) = admin.post("/v1/keys", &json!({"tenant": "acme"})).await;
    assert_eq!(status, StatusCode::CREATED, "{spare}");
    let (status, skipped) = app
        .with_key(spare["key"].as_str().unwrap())
        .post(
            "/v1/schedules",
            &json!({"agent": "assistant", "message": "tick", "cron": "0 0 1 1 *"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{skipped}");
    let skipped_path = format!("/v1/schedules/{}", skipped["id"].as_str().unwrap());
    let (status, _) = admin
        .delete(&format!("/v1/keys/{}", spare["key_id"].as_str().unwrap()))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = acme.get(&skipped_path).await;
    assert_eq!(
        (status, &body["active"]),
        (StatusCode::OK, &json!(false)),
        "{body}"
    );
    let (status, body) = acme.patch(&skipped_path, &json!({"interval_s": 1})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, runs) = acme.get(&format!("{skipped_path}/runs")).await;
        if let Some(run) = runs["runs"].get(0) {
            assert_eq!(run["state"], "skipped", "{runs}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no fire recorded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Memory (#35): acme's items in two namespaces, and globex's under the
    // same namespace and key, which acme's view must not show.
    for (client, namespace, key, text) in [
        (&acme, "alice", "pet", "Alice's dog is called Rex."),
        (&acme, "alice", "tea", "Alice takes her tea without sugar."),
        (&globex, "alice", "pet", "Globex's dog is called Fido."),
    ] {
        let (status, body) = client
            .send_raw(
                reqwest::Method::PUT,
                "/v1/memory/items",
                json!({"namespace": ["users", namespace], "key": key, "value": {"text": text}})
                    .to_string()
                    .into_bytes(),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let (status, body) = acme
        .send_raw(
            reqwest::Method::PUT,
            "/v1/memory/items",
            json!({"namespace": ["teams", "acme"], "key": "deploys", "value": {"text": "Deploys happen on Tuesdays."}})
                .to_string()
                .into_bytes(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // The model's side of the scenarios, in the order the browser plays them.
    model.push_all([
        Reply::tool_call("call_price", "get_price", r#"{"symbol":"AAPL"}"#),
        Reply::text(
            "AAPL closed at 205.87 USD, up 1.09% on the day [tool:price:v1]. \
             The day's range was 203.71 to 208.41.",
        ),
        Reply::tool_call(
            "call_order",
            "create_paper_order",
            r#"{"symbol":"AAPL","side":"buy","quantity":1,"order_type":"market"}"#,
        ),
        Reply::text("Your order filled: one AAPL share, bought at market."),
        Reply::tool_call(
            "call_order_2",
            "create_paper_order",
            r#"{"symbol":"AAPL","side":"buy","quantity":2,"order_type":"market"}"#,
        ),
        Reply::text("The order was not placed: you declined it."),
        Reply::text("AAPL trades at 205.87 [tool:price:v1]; momentum is neutral."),
    ]);

    let screenshots = target_dir().join("console-screenshots");
    let profile = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.json");
    std::fs::write(
        &scenario,
        json!({
            "acme": keys[0], "globex": keys[1], "admin": keys[2],
            "acme_session": session["id"], "globex_session": other["id"],
            "lead_session": lead["id"], "typed_session": typed["id"],
            "schedule": schedule["id"], "schedule_next": schedule["next_fire_at"],
            "skipped_schedule": skipped["id"],
            "node_modules": node_modules, "screenshots": screenshots,
            "user_data_dir": profile.path(),
        })
        .to_string(),
    )
    .unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console/drive.mjs");
    let run = tokio::process::Command::new("node")
        .arg(&script)
        .arg(&app.base)
        .arg(&scenario)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(BROWSER_PATIENCE, run)
        .await
        .expect("the browser scenarios finish in time")
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the browser scenarios failed (screenshots in {}):\n{stdout}\n{stderr}",
        screenshots.display()
    );
    for step in [
        "ok sign in with acme's key; acme's session is listed, globex's is not",
        "ok send a message: the tool call and the streamed answer appear",
        "ok a paused turn shows its confirmation; Approve resumes it",
        "ok Decline refuses a held call; the turn goes on without it",
        "ok start a workflow run; every node reaches its final state",
        "ok schedules: listed with their next fire and last runs; one created with the form, then deleted",
        "ok memory: namespaces, items and a ranked search; an item deleted",
        "ok globex's key does not see acme's sessions",
        "ok a delegation links to the asked agent's session, which links back",
        "ok a typed answer and a failed turn show in the conversation",
        "ok no errors in the page",
    ] {
        assert!(
            stdout.contains(step),
            "missing `{step}`:\n{stdout}\n{stderr}"
        );
    }

    // What the browser did is what the server holds.
    assert_eq!(
        model.remaining(),
        0,
        "the model's script was not played out"
    );
    assert_eq!(model.overruns(), 0);
    let (_, calls) = acme
        .get(&format!(
            "/v1/sessions/{}/export",
            session["id"].as_str().unwrap()
        ))
        .await;
    let names: Vec<_> = calls["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["is_success"] == true)
        .map(|c| c["tool_name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["get_price", "create_paper_order"], "{calls}");
    let (_, runs) = acme.get("/v1/workflows/runs?workflow=market-brief").await;
    assert_eq!(runs["runs"][0]["status"], "succeeded", "{runs}");
    // The memory item deleted in the browser is gone; the others stay.
    let (status, _) = acme
        .get("/v1/memory/items?namespace=users.alice&key=tea")
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = acme
        .get("/v1/memory/items?namespace=users.alice&key=pet")
        .await;
    assert_eq!(status, StatusCode::OK);
    // The schedule made in the browser was deleted there.
    let (_, listed) = acme.get("/v1/schedules").await;
    assert_eq!(
        listed["schedules"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );
    for shot in [
        "02-sessions",
        "03-conversation",
        "04-paused-turn",
        "07-run",
        "08b-schedules",
        "08c-memory",
    ] {
        assert!(
            screenshots.join(format!("{shot}.png")).exists(),
            "no screenshot {shot}"
        );
    }
}
