//! Hostile MCP servers against the real `cadre serve` binary.
//!
//! Each server is `tests/support/hostile_mcp/server.py MODE` (raw JSON-RPC
//! on stdio, Python stdlib only) named in the agents dir's `mcp.toml`, next
//! to a well-behaved one. What is checked: the bound holds (pages, tools,
//! deadlines, line size, listings per flood, processes left behind), the
//! refusal is said once with its reason in the log (and as an
//! `mcp_server_down` event, checked in process), and the builtin tools and
//! the other servers keep being served throughout.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cadre::events::EventKind;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::server::Server;
use support::{AppOptions, spawn_app};

/// Upper bound for anything a test waits for.
const PATIENCE: Duration = Duration::from_secs(30);

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/support/hostile_mcp/server.py"
);

/// A `[servers.NAME]` table running the script in `mode` with `args`, plus
/// `keys`. The folders of the absolute paths among `args` (its `--pids`
/// and `--log` files) are declared writable in its sandbox.
fn server(name: &str, mode: &str, args: &[&str], keys: &str) -> String {
    let mut all = vec![SCRIPT.to_string(), mode.to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    let paths: Vec<String> = args
        .iter()
        .map(Path::new)
        .filter(|p| p.is_absolute())
        .filter_map(|p| p.parent())
        .map(|dir| format!("{{ path = {:?}, write = true }}", dir.display().to_string()))
        .collect();
    format!(
        "[servers.{name}]\ncommand = \"python3\"\nargs = {all:?}\npaths = [{}]\n{keys}\n",
        paths.join(", ")
    )
}

struct Cadre {
    server: Server,
    log: PathBuf,
    /// Set once the test stopped cadre itself.
    stopped: bool,
    _dir: tempfile::TempDir,
}

impl Drop for Cadre {
    /// SIGTERM rather than `Server`'s SIGKILL, so that cadre kills its MCP
    /// servers' groups even when a test fails half way.
    fn drop(&mut self) {
        if !self.stopped {
            self.server.sigterm();
            self.server.wait_exit(PATIENCE);
        }
    }
}

impl Cadre {
    fn start(mcp_toml: &str) -> Cadre {
        Self::start_with_env(mcp_toml, &[])
    }

    /// [`Cadre::start`] with these variables in cadre's environment.
    fn start_with_env(mcp_toml: &str, env: &[(&str, &str)]) -> Cadre {
        let dir = tempfile::tempdir().unwrap();
        let agents = dir.path().join("agents");
        std::fs::create_dir(&agents).unwrap();
        std::fs::write(agents.join("mcp.toml"), mcp_toml).unwrap();
        // `serve` refuses an agents folder with no agent in it.
        std::fs::write(
            agents.join("plain.toml"),
            support::agent_toml("plain", &[], 1),
        )
        .unwrap();
        let data = dir.path().join("data");
        let server = Server::start_offline_with(&data, &agents, env);
        Cadre {
            server,
            log: data.with_extension("log"),
            stopped: false,
            _dir: dir,
        }
    }

    /// The log's lines holding every one of `needles`.
    fn log_lines(&self, needles: &[&str]) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        strip_ansi(&text)
            .lines()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .map(str::to_string)
            .collect()
    }

    /// Waits for a log line holding every one of `needles`.
    async fn until_logged(&self, needles: &[&str]) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(line) = self.log_lines(needles).pop() {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "never logged {needles:?}; log:\n{}",
                self.server.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn invoke(&self, tool: &str, params: Value) -> (StatusCode, Value) {
        self.server
            .client()
            .post(
                &format!("/v1/tools/{tool}/invoke"),
                &json!({ "params": params }),
            )
            .await
    }

    /// Invokes `tool` until it answers 200.
    async fn until_served(&self, tool: &str) -> Value {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (status, body) = self.invoke(tool, json!({"text": "hi"})).await;
            if status == StatusCode::OK {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "{tool} never served: {status} {body}; log:\n{}",
                self.server.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The names of the tools listed by GET /v1/tools.
    async fn tool_names(&self) -> Vec<String> {
        let (status, body) = self.server.client().get("/v1/tools").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap().to_string())
            .collect()
    }

    /// The builtin echo still answers.
    async fn builtins_served(&self) {
        let (status, body) = self.invoke("echo", json!({"message": "still here"})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
}

fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn lines(path: &str) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// The pids of `kind` ("server" or "child") recorded in `path`, in order.
fn pids(path: &str, kind: &str) -> Vec<i32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix(kind)?.trim().parse().ok())
        .collect()
}

/// Whether `pid` runs (a zombie does not: only its parent's reaping is left,
/// and an orphan's parent is init).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

/// Waits until none of `pids` runs.
async fn until_dead(pids: &[i32], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|p| alive(*p)) {
        assert!(
            Instant::now() < deadline,
            "{what} still running: {:?}",
            pids.iter().filter(|p| alive(**p)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_listings_are_refused_with_their_reason_and_the_rest_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let endless_log = dir.path().join("endless.log").display().to_string();
    let toml = [
        server("endless", "endless", &["--log", &endless_log], ""),
        server("repeat", "repeat", &[], ""),
        server("deep", "deep", &[], ""),
        server("silent", "silent", &[], "init_timeout_s = 0.5"),
        server("mute", "silent_list", &[], "list_timeout_s = 0.5"),
        server("capped", "many", &["--count", "20"], "max_tools = 10"),
        server("fat", "fat", &["--count", "300000"], "max_message_mb = 1"),
        server("good", "good", &[], ""),
    ]
    .concat();
    let cadre = Cadre::start(&toml);

    // Pagination stops at max_pages (default 100): exactly that many pages
    // were asked for, and the reason is logged.
    cadre
        .until_logged(&[
            "MCP server refused",
            "server=endless",
            "more than 100 pages",
        ])
        .await;
    assert_eq!(lines(&endless_log), 100, "pages asked for");
    cadre
        .until_logged(&["MCP server refused", "server=repeat", "repeated the cursor"])
        .await;
    cadre
        .until_logged(&["MCP server refused", "server=capped", "more than 10 tools"])
        .await;
    // Pages of 300 KB each: the listing as a whole is held to one message's cap.
    cadre
        .until_logged(&[
            "MCP server refused",
            "server=fat",
            "tools/list is over 1048576 bytes in all",
        ])
        .await;
    // A listing rmcp cannot parse (a schema 70 objects deep is past
    // serde_json's recursion limit) is answered at once as unreadable.
    cadre
        .until_logged(&[
            "MCP server refused",
            "server=deep",
            "cannot be read: recursion limit",
        ])
        .await;
    // No answer at all: the deadlines say so, and are retried.
    cadre
        .until_logged(&[
            "MCP server refused",
            "server=silent",
            "no answer to initialize within 500ms",
        ])
        .await;
    cadre
        .until_logged(&[
            "MCP server refused",
            "server=mute",
            "tools/list did not complete within 500ms",
        ])
        .await;
    let retried = Instant::now() + PATIENCE;
    while cadre
        .log_lines(&["MCP server refused", "server=silent"])
        .len()
        < 2
    {
        assert!(Instant::now() < retried, "{}", cadre.server.log_tail());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // None of their tools is offered, the others are served.
    let names = cadre.tool_names().await;
    for server in [
        "endless", "repeat", "deep", "silent", "mute", "capped", "fat",
    ] {
        let prefix = format!("{server}.");
        assert!(
            !names.iter().any(|n| n.starts_with(&prefix)),
            "{server}: {names:?}"
        );
    }
    let body = cadre.until_served("good.ok").await;
    assert_eq!(body["output"], json!({"text": "hi"}), "{body}");
    cadre.builtins_served().await;

    // A broken bound is said once: the server is not asked again.
    for server in ["endless", "repeat", "capped", "deep", "fat"] {
        let refused = cadre.log_lines(&["MCP server refused", &format!("server={server}")]);
        assert_eq!(refused.len(), 1, "{refused:?}");
    }
    assert_eq!(lines(&endless_log), 100, "pages asked for");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tool_names_are_refused_and_many_tools_are_warned_about() {
    let toml = [
        server("names", "names", &[], ""),
        server("many", "many", &["--count", "200"], ""),
    ]
    .concat();
    let cadre = Cadre::start(&toml);
    cadre.until_served("names.ok").await;
    cadre.until_served("many.t199").await;

    let names = cadre.tool_names().await;
    let from_names: Vec<&String> = names.iter().filter(|n| n.starts_with("names.")).collect();
    assert_eq!(from_names, ["names.ok"], "{names:?}");
    let refused = cadre
        .until_logged(&["MCP tools refused, not served", "server=names"])
        .await;
    for reported in [
        r#""" (empty)"#,
        r#""a.b" (contains '.')"#,
        r#""a__b" (contains '__')"#,
    ] {
        assert!(refused.contains(reported), "{refused}");
    }
    assert_eq!(names.iter().filter(|n| n.starts_with("many.")).count(), 200);
    cadre
        .until_logged(&["lists many tools", "server=many", "tools=200"])
        .await;
    assert!(
        cadre
            .log_lines(&["lists many tools", "server=names"])
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_over_max_message_mb_is_a_tool_error_at_once() {
    let cadre_dir = tempfile::tempdir().unwrap();
    let pidfile = cadre_dir.path().join("pids").display().to_string();
    // 1.2 MB of text against a 1 MiB cap; the call's own timeout is 20 s.
    let toml = server(
        "huge",
        "huge",
        &["--count", "1200000", "--pids", &pidfile],
        "max_message_mb = 1\ntimeout_s = 20",
    );
    let cadre = Cadre::start(&toml);
    cadre.until_served("huge.ok").await;
    for tool in ["huge.big", "huge.big_tail"] {
        let started = Instant::now();
        let (status, body) = cadre.invoke(tool, json!({})).await;
        assert_ne!(status, StatusCode::OK, "{body}");
        assert!(
            body["error"]
                .as_str()
                .unwrap_or_default()
                .contains("result too large"),
            "{tool}: {body}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{tool} took {:?}",
            started.elapsed()
        );
    }
    // The connection lives on: same process, still serving.
    let (status, body) = cadre.invoke("huge.ok", json!({"text": "after"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(pids(&pidfile, "server").len(), 1);
    cadre.builtins_served().await;
}

/// Under the message cap, a result is still bounded: an upstream tool's
/// output over 1 MiB (as JSON) fails its call, so it is neither stored nor
/// sent to the model on every later turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_under_the_message_cap_but_over_the_output_cap_is_not_kept() {
    let toml = server("huge", "huge", &["--count", "1200000"], "timeout_s = 20");
    let cadre = Cadre::start(&toml);
    cadre.until_served("huge.ok").await;
    let (status, body) = cadre.invoke("huge.big", json!({})).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(error.contains("it was not kept"), "{body}");
    assert!(body["output"].is_null(), "{body}");
    let (status, body) = cadre.invoke("huge.ok", json!({"text": "after"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_server_whose_child_holds_stdout_is_restarted_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pids").display().to_string();
    let toml = server("crash", "crash", &["--pids", &pidfile], "timeout_s = 20");
    let cadre = Cadre::start(&toml);
    cadre.until_served("crash.ok").await;

    // The server forks a child holding its stdout and dies mid-call: the
    // call fails at once instead of at its 20 s timeout.
    let started = Instant::now();
    let (status, body) = cadre.invoke("crash.crash", json!({})).await;
    assert_ne!(status, StatusCode::OK, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered after {:?}: {body}",
        started.elapsed()
    );
    // The child went with its server's group; a new server serves.
    until_dead(&pids(&pidfile, "child"), "the crashed server's child").await;
    cadre.until_served("crash.ok").await;
    assert_eq!(pids(&pidfile, "server").len(), 2);
    cadre.builtins_served().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_looping_server_leaves_no_orphans_and_shutdown_kills_every_group() {
    let dir = tempfile::tempdir().unwrap();
    let looping = dir.path().join("loop-pids").display().to_string();
    let forking = dir.path().join("fork-pids").display().to_string();
    let toml = [
        server(
            "looping",
            "crashloop",
            &["--count", "50", "--pids", &looping],
            "",
        ),
        server("forking", "fork", &["--pids", &forking], ""),
    ]
    .concat();
    let mut cadre = Cadre::start(&toml);
    cadre.until_served("forking.ok").await;

    // Each start forks a child that keeps stdout open, then the server
    // exits: after three starts, the children of the first two are gone.
    let deadline = Instant::now() + PATIENCE;
    while pids(&looping, "server").len() < 3 {
        assert!(Instant::now() < deadline, "{}", cadre.server.log_tail());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let children = pids(&looping, "child");
    until_dead(&children[..2], "children of earlier starts").await;
    cadre.builtins_served().await;

    // Shutdown kills every group: servers and what they forked.
    cadre.server.sigterm();
    cadre.stopped = true;
    assert!(cadre.server.wait_exit(PATIENCE).success());
    let mut all = pids(&looping, "server");
    all.extend(pids(&looping, "child"));
    all.extend(pids(&forking, "server"));
    all.extend(pids(&forking, "child"));
    until_dead(&all, "MCP server processes after shutdown").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_changed_flood_costs_a_listing_per_interval() {
    let dir = tempfile::tempdir().unwrap();
    let lists = dir.path().join("lists").display().to_string();
    // 5,000 notifications right after `initialized`.
    let toml = server(
        "flood",
        "flood",
        &["--count", "5000", "--log", &lists],
        "relist_interval_s = 0.5",
    );
    let cadre = Cadre::start(&toml);
    cadre.until_served("flood.ok").await;
    // The call's answer comes after every notification on the server's
    // stdout, so all of them have been read; what they scheduled is due
    // within one interval (0.5 s) and the debounce.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let listed = lines(&lists);
    assert!((1..=3).contains(&listed), "{listed} listings");
    // Unchanged listings are logged at debug: one INFO line, and rmcp's
    // line per notification is filtered out.
    assert_eq!(
        cadre.log_lines(&["MCP tools listed", "server=flood"]).len(),
        1
    );
    assert!(cadre.log_lines(&["received notification"]).is_empty());
    cadre.builtins_served().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_server_is_an_mcp_server_down_event_with_its_reason() {
    // A server that never answers `initialize` is refused at each attempt
    // (a missed deadline is retried), so the event comes again after
    // subscribing.
    let agents = support::agents_dir(&[(
        "mcp.toml",
        &server("silent", "silent", &[], "init_timeout_s = 0.3"),
    )]);
    let app = spawn_app(AppOptions::offline().agents(agents.path()));
    let mut events = app.runtime.as_ref().unwrap().events().subscribe();
    let reason = loop {
        let e = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .expect("an mcp_server_down event")
            .expect("the event bus is open");
        if let EventKind::McpServerDown { server, reason } = e.kind {
            assert_eq!(server, "silent");
            break reason;
        }
    };
    assert_eq!(
        reason,
        "refused: no answer to initialize within 300ms (init_timeout_s)"
    );
    // A server that never listed a tool still shows, with why it is down.
    let (status, list) = app.get("/v1/tools").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let silent = list["mcp_servers"]
        .as_array()
        .expect("mcp_servers")
        .iter()
        .find(|s| s["server"] == "silent")
        .unwrap_or_else(|| panic!("{list}"))
        .clone();
    assert_eq!(silent["available"], false, "{silent}");
    assert_eq!(silent["tools"], 0, "{silent}");
    assert!(
        silent["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("refused: no answer to initialize")),
        "{silent}"
    );
    let (status, body) = app
        .post(
            "/v1/tools/echo/invoke",
            &json!({"params": {"message": "hi"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// A server whose first `tools/list` fails with its own error (still
/// starting) is asked again with the backoff, not refused until cadre
/// restarts; only answers that break a bound refuse it for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_first_listing_fails_is_asked_again() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("lists").display().to_string();
    let toml = server("starting", "starting", &["--log", &log], "");
    let cadre = Cadre::start(&toml);
    cadre.until_served("starting.ok").await;
    let lists = std::fs::read_to_string(&log).unwrap();
    assert!(lists.lines().count() >= 2, "{lists}");
    let (status, body) = cadre.invoke("starting.ok", json!({"text": "hi"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// Issue #29 (5): a stdio MCP server starts with a clean environment:
/// `PATH`, `HOME`, `LANG` and its `env` table in `mcp.toml` (`K =
/// "${K}"` passes one of cadre's through), nothing else of cadre's: a
/// reference server's `get-env` tool returned the model's API key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_mcp_server_sees_only_the_environment_mcp_toml_gives_it() {
    let toml = server(
        "envy",
        "env",
        &[],
        "env = { GIVEN = \"set-by-mcp-toml\", PASSED = \"${CADRE_TEST_PASSED}\" }",
    );
    let cadre = Cadre::start_with_env(
        &toml,
        &[
            ("CADRE_MODEL_API_KEY", "sk-must-not-leak"),
            ("CADRE_TEST_PASSED", "passed-through"),
            ("CADRE_TEST_SECRET", "hidden"),
        ],
    );
    cadre.until_served("envy.ok").await;
    let (status, body) = cadre.invoke("envy.env", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let env = body["output"].as_object().expect("an object").clone();
    let names: Vec<&str> = env.keys().map(String::as_str).collect();
    assert_eq!(env["GIVEN"], "set-by-mcp-toml", "{names:?}");
    assert_eq!(env["PASSED"], "passed-through", "{names:?}");
    for name in &names {
        assert!(
            ["PATH", "HOME", "TMPDIR", "LANG", "GIVEN", "PASSED"].contains(name)
                || set_by_the_interpreter(name),
            "the server saw {name} of cadre's environment: {names:?}"
        );
    }
    let text = body.to_string();
    assert!(!text.contains("sk-must-not-leak") && !text.contains("hidden"));
}

/// Variables a child's interpreter or its launcher sets itself (a pyenv
/// shim is a shell script that sets `PYENV_*`; shells set `PWD`, `SHLVL`,
/// `_`): not inherited from cadre.
fn set_by_the_interpreter(name: &str) -> bool {
    name.starts_with("PYENV")
        || name.starts_with("_PYENV")
        || name.starts_with("LC_")
        || ["PWD", "OLDPWD", "SHLVL", "_"].contains(&name)
}

/// Issue #29 (4): a stdio server that floods cadre with its own requests
/// (`ping`s) and never reads the answers cannot grow cadre: past
/// `MAX_SERVER_REQUESTS` waiting answers the connection ends, the server's
/// process group is killed, and the log says why (it then restarts with
/// backoff like any server that went down). Before, cadre queued every
/// answer (147 -> 943 MB for 1,000,000 pings) and the server stayed up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_flooding_cadre_with_requests_is_cut_off_and_its_group_killed() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pids").display().to_string();
    let toml = server(
        "pingflood",
        "pingflood",
        &["--count", "100000", "--pids", &pidfile],
        "",
    ) + &server("good", "good", &[], "");
    let cadre = Cadre::start(&toml);
    cadre
        .until_logged(&["server=pingflood", "more requests than cadre may answer"])
        .await;
    let first = pids(&pidfile, "server")[0];
    let deadline = Instant::now() + PATIENCE;
    while alive(first) {
        assert!(
            Instant::now() < deadline,
            "the flooding server {first} still runs"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Other servers are unharmed.
    let body = cadre.until_served("good.ok").await;
    assert_eq!(body["output"], json!({"text": "hi"}), "{body}");
}

/// The streamable HTTP hostile server (`http_server.py`): started on a free
/// loopback port, killed when dropped.
struct HttpServer {
    child: std::process::Child,
    url: String,
}

impl HttpServer {
    async fn start(dir: &std::path::Path, count: usize) -> HttpServer {
        let portfile = dir.join("port");
        let child = std::process::Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/support/hostile_mcp/http_server.py"
            ))
            .arg(&portfile)
            .args(["--count", &count.to_string()])
            .spawn()
            .expect("python3 runs the hostile HTTP server");
        let deadline = Instant::now() + PATIENCE;
        let port = loop {
            if let Ok(port) = std::fs::read_to_string(&portfile) {
                break port;
            }
            assert!(Instant::now() < deadline, "the HTTP server never listened");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        HttpServer {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Issue #29 (4) over streamable HTTP: a server whose tool call answers with
/// a stream of 100,000 `ping` requests and which never takes cadre's
/// answers cannot grow cadre (before: 200,000 pings took it from 105 to
/// 911 MB in 8 s while the server stayed "available"). Past
/// `MAX_SERVER_REQUESTS` waiting answers the connection ends, the call
/// fails instead of hanging, the server is marked down with the reason
/// (logged, and the `mcp_server_down` event), and other servers are
/// unharmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_flooding_cadre_with_requests_over_http_is_cut_off_and_marked_down() {
    let dir = tempfile::tempdir().unwrap();
    let hostile = HttpServer::start(dir.path(), 100_000).await;
    let toml = format!("[servers.httpflood]\nurl = \"{}\"\n", hostile.url)
        + &server("good", "good", &[], "");
    let cadre = Cadre::start(&toml);
    cadre.until_served("httpflood.ok").await;
    let (status, body) = tokio::time::timeout(PATIENCE, cadre.invoke("httpflood.flood", json!({})))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the flooding call is answered, not left hanging; log:\n{}",
                cadre.server.log_tail()
            )
        });
    assert_ne!(status, StatusCode::OK, "{body}");
    let line = cadre
        .until_logged(&["server=httpflood", "connection ended", "did not take"])
        .await;
    assert!(line.contains("more than 64 requests"), "{line}");
    assert_eq!(
        cadre
            .log_lines(&["server=httpflood", "more requests than cadre may answer"])
            .len(),
        1,
        "said once"
    );
    let body = cadre.until_served("good.ok").await;
    assert_eq!(body["output"], json!({"text": "hi"}), "{body}");
    // It reconnects like any server whose connection ended.
    cadre.until_served("httpflood.ok").await;
}

/// Issue #29 (low): a server that sends request after request of a method
/// cadre does not serve (reading each answer, so it stays under the cap of
/// waiting requests) made rmcp log one WARN line per request, with its
/// 2 KiB id: 20,000 requests, 20,001 lines, 63 MB. rmcp's lines are now
/// rate limited (a burst of 50, then 10 a second) and every log line is cut
/// at 8 KiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_flooding_rmcps_log_gets_a_bounded_number_of_short_lines() {
    let dir = tempfile::tempdir().unwrap();
    let done = dir.path().join("done").display().to_string();
    let toml = server(
        "chatty",
        "reqflood",
        &["--count", "5000", "--log", &done],
        "",
    );
    let started = Instant::now();
    let cadre = Cadre::start(&toml);
    let deadline = Instant::now() + PATIENCE * 3;
    while !std::fs::read_to_string(&done).is_ok_and(|t| t.contains("answered 5000")) {
        assert!(
            Instant::now() < deadline,
            "the server's requests were never all answered; log:\n{}",
            cadre.server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A burst of 50, then 10 a second, over the time the flood took.
    let allowed = 60 + 10 * started.elapsed().as_secs() as usize;
    let rmcp = cadre.log_lines(&["rmcp"]);
    assert!(
        rmcp.len() <= allowed && allowed < 5000,
        "{} rmcp lines for 5,000 requests (allowed {allowed})",
        rmcp.len()
    );
    let text = std::fs::read_to_string(&cadre.log).unwrap();
    let longest = text.lines().map(str::len).max().unwrap_or(0);
    assert!(longest <= 8 * 1024 + 64, "a log line of {longest} bytes");
}
