//! Tool files and their upstreams, tried as an attacker would, against the
//! real `cadre serve` binary ([`support::server::Server`]).
//!
//! The upstreams are axum servers on 127.0.0.1 in the test's process: one
//! that redirects (to another loopback service holding a secret, to
//! cadre's own API, to itself), answers a body that never ends, and counts
//! the tickets its POST endpoint creates. An HTTP entry reaches only what
//! the network guard lets it (its `allowlist`, or `[tools] http_allowlist`),
//! follows redirects only on its own origin unless it says
//! `redirects: any`, reads no more than its output cap, and is not cached
//! unless its file says so. Tool names that meet on the wire are served
//! once. Each test was checked to fail with its fix taken out.
//!
//! The watcher and the loader are checked through the server's log, over a
//! fixed sequence of file events: each reload the watcher starts logs the
//! paths that started it (debug, `cadre::tools::watch`), so "a reload's own
//! reads start no reload" is a fact about the lines between two of the
//! test's own writes, not about time.

mod support;

#[path = "fixtures/mcp_server.rs"]
mod mcp_server;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{StatusCode as AxumStatus, header};
use axum::response::IntoResponse;
use axum::routing::{any, post};
use mcp_server::McpFixture;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::server::Server;
use support::{MockModel, Reply, agent_toml};
use tokio_stream::StreamExt;

/// Upper bound for anything a test waits for; not an expected duration.
const PATIENCE: Duration = Duration::from_secs(20);

/// Bytes the endless body sends before it stalls, well over the caps used.
const BIG_PREFIX: usize = 64 * 1024;

// ---------------------------------------------------------------- upstreams

/// A loopback service that counts its requests and answers a secret.
struct Secret {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
}

impl Secret {
    async fn start() -> Secret {
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        let router = Router::new().fallback(any(move || {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                axum::Json(json!({"secret": "s3cr3t"}))
            }
        }));
        Secret {
            addr: serve(router).await,
            hits,
        }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// The hostile upstream tool files point at.
struct Upstream {
    addr: SocketAddr,
    tickets: Arc<AtomicUsize>,
    /// cadre's base URL, known once the server started; `/to-cadre`
    /// redirects there.
    cadre: Arc<OnceLock<String>>,
}

impl Upstream {
    async fn start(secret: &Secret) -> Upstream {
        let tickets = Arc::new(AtomicUsize::new(0));
        let cadre: Arc<OnceLock<String>> = Arc::default();
        let secret_url = format!("http://{}/secret", secret.addr);
        let counter = tickets.clone();
        let to_cadre = cadre.clone();
        let router = Router::new()
            .route(
                "/tickets",
                post(move || {
                    let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                    async move { axum::Json(json!({"id": format!("T-{n}")})) }
                }),
            )
            .route(
                "/to-secret",
                post(move || async move { redirect(AxumStatus::TEMPORARY_REDIRECT, &secret_url) }),
            )
            .route(
                "/to-cadre",
                post(move || async move {
                    let base = to_cadre.get().expect("cadre started");
                    redirect(AxumStatus::SEE_OTHER, &format!("{base}/v1/sessions"))
                }),
            )
            .route(
                "/to-tickets",
                post(|| async { redirect(AxumStatus::TEMPORARY_REDIRECT, "/tickets") }),
            )
            .route(
                "/endless",
                post(|| async {
                    let prefix = tokio_stream::iter(
                        (0..BIG_PREFIX / 1024)
                            .map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b'a'; 1024]))),
                    );
                    Body::from_stream(prefix.chain(tokio_stream::pending()))
                }),
            );
        Upstream {
            addr: serve(router).await,
            tickets,
            cadre,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn host_port(&self) -> String {
        self.addr.to_string()
    }

    fn tickets(&self) -> usize {
        self.tickets.load(Ordering::SeqCst)
    }
}

fn redirect(status: AxumStatus, to: &str) -> axum::response::Response {
    (status, [(header::LOCATION, to.to_string())]).into_response()
}

async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

// ---------------------------------------------------------------- harness

/// A temp dir holding `agents/` (with `tools/`) and the server's data dir.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new(agent_files: &[(&str, &str)]) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("agents/tools")).unwrap();
        // `serve` refuses an agents folder with no agent in it.
        std::fs::write(
            dir.path().join("agents/plain.toml"),
            agent_toml("plain", &[], 1),
        )
        .unwrap();
        for (name, text) in agent_files {
            std::fs::write(dir.path().join("agents").join(name), text).unwrap();
        }
        Setup { dir }
    }

    fn agents(&self) -> PathBuf {
        self.dir.path().join("agents")
    }

    fn tools(&self) -> PathBuf {
        self.agents().join("tools")
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Writes a tool file (under a name no loader reads, then renamed into
    /// place, so a reload never sees half a file).
    fn put(&self, name: &str, text: &str) -> PathBuf {
        let staging = self.tools().join(format!(".{name}.partial"));
        std::fs::write(&staging, text).unwrap();
        let path = self.tools().join(name);
        std::fs::rename(&staging, &path).unwrap();
        path
    }

    fn start(&self, env: &[(&str, &str)]) -> Server {
        let mut env = env.to_vec();
        env.push(("NO_COLOR", "1"));
        Server::start_offline_with(&self.data(), &self.agents(), &env)
    }

    /// The server's whole log (its stderr; [`Server`] keeps it next to the
    /// data dir).
    fn log(&self) -> String {
        std::fs::read_to_string(self.data().with_extension("log")).unwrap_or_default()
    }

    /// Waits until a log line passes `pick`; returns the log up to and
    /// including that line.
    async fn until_logged(&self, what: &str, pick: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let log = self.log();
            let mut upto = 0;
            for line in log.split_inclusive('\n') {
                upto += line.len();
                if pick(line) {
                    return log[..upto].to_string();
                }
            }
            assert!(
                Instant::now() < deadline,
                "no log line {what} within {PATIENCE:?}; log:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// An HTTP entry posting to `url`, with extra `entry` keys (YAML lines).
fn http_tool(name: &str, url: &str, entry_extra: &str, extra: &str) -> String {
    format!(
        "name: {name}\ndescription: HTTP entry {name}\nparameters:\n  - {{name: title, type: string, required: true}}\n{extra}entry:\n  type: external\n  url: \"{url}\"\n{entry_extra}"
    )
}

fn allow(host: &str) -> String {
    format!("  allowlist: [\"{host}\"]\n")
}

/// The error text of a failed call.
async fn failure(server: &Server, tool: &str) -> String {
    let (status, body) = server.invoke(tool, json!({"title": "t"})).await;
    assert_ne!(status, StatusCode::OK, "{tool} succeeded: {body}");
    assert_eq!(body["is_success"], false, "{body}");
    body["error"].as_str().unwrap_or_default().to_string()
}

async fn success(server: &Server, tool: &str) -> Value {
    let (status, body) = server.invoke(tool, json!({"title": "t"})).await;
    assert_eq!(status, StatusCode::OK, "{tool}: {body}");
    body
}

async fn listed(server: &Server) -> Vec<String> {
    let (status, body) = server.client().get("/v1/tools").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_string())
        .collect()
}

// ---------------------------------------------------------------- the guard

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_entry_is_not_redirected_to_another_loopback_service_or_to_cadre_itself() {
    let secret = Secret::start().await;
    let up = Upstream::start(&secret).await;
    let setup = Setup::new(&[]);
    let only_upstream = allow(&up.host_port());
    setup.put(
        "to_secret.yaml",
        &http_tool("to_secret", &up.url("/to-secret"), &only_upstream, ""),
    );
    setup.put(
        "to_cadre.yaml",
        &http_tool("to_cadre", &up.url("/to-cadre"), &only_upstream, ""),
    );
    setup.put(
        "unlisted.yaml",
        &http_tool("unlisted", &up.url("/tickets"), "", ""),
    );
    let server = setup.start(&[]);
    up.cadre.set(server.base.clone()).unwrap();

    // A 307 carries the POST body on to another loopback port: refused at
    // the hop, the secret service never sees a request.
    let error = failure(&server, "to_secret").await;
    assert!(error.starts_with("refused: "), "{error}");
    assert_eq!(secret.hits(), 0, "the redirect reached the secret service");

    // A 303 to cadre's own API (GET /v1/sessions) is refused the same way.
    let error = failure(&server, "to_cadre").await;
    assert!(error.starts_with("refused: "), "{error}");

    // Without an allowlist a loopback upstream is refused before any request.
    let error = failure(&server, "unlisted").await;
    assert_eq!(error, "refused: 127.0.0.1 is a loopback address");
    assert_eq!(up.tickets(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_stay_on_the_entrys_origin_unless_its_file_says_any() {
    let secret = Secret::start().await;
    let up = Upstream::start(&secret).await;
    let setup = Setup::new(&[]);
    // Every loopback port is allowlisted: only the redirect rule stands
    // between the upstream and the secret service.
    let all_loopback = allow("127.0.0.1");
    setup.put(
        "same.yaml",
        &http_tool("same", &up.url("/to-tickets"), &all_loopback, ""),
    );
    setup.put(
        "cross.yaml",
        &http_tool("cross", &up.url("/to-secret"), &all_loopback, ""),
    );
    setup.put(
        "anywhere.yaml",
        &http_tool(
            "anywhere",
            &up.url("/to-secret"),
            &format!("{all_loopback}  redirects: any\n"),
            "",
        ),
    );
    setup.put(
        "stay.yaml",
        &http_tool(
            "stay",
            &up.url("/to-tickets"),
            &format!("{all_loopback}  redirects: none\n"),
            "",
        ),
    );
    let server = setup.start(&[]);

    let body = success(&server, "same").await;
    assert_eq!(body["output"]["id"], "T-1", "{body}");

    let error = failure(&server, "cross").await;
    let to = format!("http://{}", secret.addr);
    assert_eq!(
        error,
        format!(
            "refused: a redirect from http://{} to another origin ({to})",
            up.host_port()
        )
    );
    assert_eq!(secret.hits(), 0);

    let body = success(&server, "anywhere").await;
    assert_eq!(body["output"]["secret"], "s3cr3t", "{body}");
    assert_eq!(secret.hits(), 1);

    let error = failure(&server, "stay").await;
    assert!(error.contains("redirects: none"), "{error}");
    assert_eq!(up.tickets(), 1, "a refused redirect is not followed");
}

// ---------------------------------------------------------------- the body cap

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_entry_stops_reading_at_its_cap_and_does_not_wait_for_the_rest() {
    let secret = Secret::start().await;
    let up = Upstream::start(&secret).await;
    let setup = Setup::new(&[]);
    // The body never ends: reading it whole would only stop at the
    // executor's timeout (10 s here), never with "more than 1024 bytes".
    setup.put(
        "endless.yaml",
        &http_tool(
            "endless",
            &up.url("/endless"),
            &format!("{}  max_output_bytes: 1024\n", allow(&up.host_port())),
            "timeout_s: 10\n",
        ),
    );
    let server = setup.start(&[]);

    let (status, body) = server.invoke("endless", json!({"title": "t"})).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["error_type"], "TOOL_EXECUTION_ERROR", "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(error.ends_with("answered more than 1024 bytes"), "{error}");
}

// ---------------------------------------------------------------- caching

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_entry_without_a_cache_section_runs_on_every_call() {
    let secret = Secret::start().await;
    let up = Upstream::start(&secret).await;
    let setup = Setup::new(&[]);
    // Category `custom` used to mean 30 s in the cache. No `allowlist`
    // here: the server's opens the upstream to every file.
    setup.put(
        "create_ticket.yaml",
        &http_tool("create_ticket", &up.url("/tickets"), "", ""),
    );
    setup.put(
        "cached_ticket.yaml",
        &http_tool(
            "cached_ticket",
            &up.url("/tickets"),
            "",
            "cache: {ttl_seconds: 60}\n",
        ),
    );
    let server_allowlist = format!("[\"{}\"]", up.host_port());
    let server = setup.start(&[("CADRE_TOOLS_HTTP_ALLOWLIST", &server_allowlist)]);

    let mut ids = Vec::new();
    for _ in 0..3 {
        let body = success(&server, "create_ticket").await;
        assert_eq!(body["metadata"]["cached"], false, "{body}");
        ids.push(body["output"]["id"].as_str().unwrap().to_string());
    }
    assert_eq!(ids, ["T-1", "T-2", "T-3"]);
    assert_eq!(up.tickets(), 3, "each call reached the upstream");

    // A file that asks for caching gets it.
    let first = success(&server, "cached_ticket").await;
    let second = success(&server, "cached_ticket").await;
    assert_eq!(first["output"]["id"], "T-4");
    assert_eq!(second["output"]["id"], "T-4");
    assert_eq!(second["metadata"]["cached"], true, "{second}");
    assert_eq!(up.tickets(), 4);
}

// ---------------------------------------------------------------- wire names

const NAMES_TWIN: &str = "name: names__count\ndescription: The file's tool\nparameters:\n  - {name: message, type: string, required: true}\nentry: {type: builtin, handler: echo}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_tool_whose_wire_name_a_tool_file_holds_is_not_served_and_calls_go_to_the_file() {
    let fixture = McpFixture::start().await;
    let model = MockModel::start().await;
    let setup = Setup::new(&[
        (
            "mcp.toml",
            &format!("[servers.names]\nurl = \"{}\"\n", fixture.url),
        ),
        (
            "user.toml",
            &agent_toml("user", &["names__count", "names.*"], 2),
        ),
    ]);
    setup.put("names__count.yaml", NAMES_TWIN);
    let server = Server::start(
        &setup.data(),
        &setup.agents(),
        &model.base_url(),
        &[("NO_COLOR", "1")],
    );

    // The file loaded first; `names.count`, listed later, is refused by name.
    let log = setup
        .until_logged("refusing names.count", |l| {
            l.contains("tool not served") && l.contains("names.count")
        })
        .await;
    assert!(log.contains("'names__count'"), "{log}");
    let names = listed(&server).await;
    assert!(names.contains(&"names__count".to_string()), "{names:?}");
    assert!(!names.contains(&"names.count".to_string()), "{names:?}");
    let (status, body) = server.invoke("names.count", json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    // The tool list says what was withheld and why, not only the log.
    let (status, list) = server.client().get("/v1/tools").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let withheld = list["withheld"].as_array().expect("withheld");
    assert!(
        withheld.iter().any(|w| w["name"] == "names.count"
            && w["source"] == "mcp:names"
            && w["reason"].as_str().unwrap().contains("names__count")),
        "{list}"
    );

    // The model is offered one function of that name, and its call runs
    // the file's tool: the MCP server sees nothing.
    model.push(Reply::tool_call(
        "c1",
        "names__count",
        r#"{"message": "to the file"}"#,
    ));
    model.push(Reply::text("done"));
    let client = server.client();
    let session = client.session("user").await;
    let (status, body) = client.say(&session, "count").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let offered: Vec<Value> = model.requests()[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].clone())
        .filter(|n| n == "names__count")
        .collect();
    assert_eq!(offered.len(), 1, "one function per wire name");
    let tool_message = model.requests()[1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(
        tool_message["content"]
            .as_str()
            .unwrap()
            .contains("to the file"),
        "{tool_message}"
    );
    assert_eq!(fixture.runs(), 0, "the call went to the MCP server");
}

// ---------------------------------------------------------------- the watcher

const STAMP_V1: &str = "name: stamp\ndescription: Version one.\nparameters:\n  - {name: message, type: string, required: true}\nentry: {type: builtin, handler: echo}\n";
const STAMP_V2: &str = "name: stamp\ndescription: Version two.\nparameters:\n  - {name: message, type: string, required: true}\nentry: {type: builtin, handler: echo}\n";

/// The watcher's `reloading tool, agent and workflow files` lines in `log`.
fn watcher_reloads(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("reloading tool, agent and workflow files") && l.contains("watcher"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_reading_the_tool_files_does_not_start_another_reload() {
    let setup = Setup::new(&[]);
    setup.put("stamp.yaml", STAMP_V1);
    std::fs::copy(
        support::repo_agents().join("tools/http_request.yaml"),
        setup.tools().join("http_request.yaml"),
    )
    .unwrap();
    // No rescans: every reload here is the watcher's.
    let server = setup.start(&[
        ("CADRE_TOOLS_RELOAD_INTERVAL_S", "3600"),
        ("RUST_LOG", "info,cadre::tools::watch=debug"),
    ]);

    // One edit: one reload, which reads every tool file.
    setup.put("stamp.yaml", STAMP_V2);
    let edited = setup
        .until_logged("stamp updated", |l| {
            l.contains("tool live") && l.contains("stamp") && l.contains("added=false")
        })
        .await;
    // Then a write of the test's own. Everything the reload's reads made
    // the kernel report was queued before it, so it is reported with the
    // fence or earlier: only the fence may start the next reload.
    std::fs::write(setup.tools().join("fence.txt"), "fence").unwrap();
    let fenced = setup
        .until_logged("fence reload", |l| {
            l.contains("reloading tool, agent and workflow files") && l.contains("fence.txt")
        })
        .await;
    let after_edit = watcher_reloads(&fenced[edited.len()..]);
    assert_eq!(after_edit.len(), 1, "{after_edit:#?}");
    assert!(
        !after_edit[0].contains("stamp.yaml\"") && !after_edit[0].contains("http_request.yaml"),
        "a reload's reads started a reload: {}",
        after_edit[0]
    );
    let body = success_echo(&server).await;
    assert_eq!(body["output"]["message"], "hi");
}

async fn success_echo(server: &Server) -> Value {
    let (status, body) = server.invoke("stamp", json!({"message": "hi"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

// ---------------------------------------------------------------- the loader

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_tool_file_and_a_symlink_out_of_the_agents_folder_are_refused_by_name() {
    let setup = Setup::new(&[]);
    setup.put("stamp.yaml", STAMP_V1);
    // Valid YAML, over the 4 KiB cap set below.
    let padding = "x".repeat(5000);
    let big = setup.put(
        "big.yaml",
        &format!(
            "name: big\ndescription: \"{padding}\"\nentry: {{type: builtin, handler: echo}}\n"
        ),
    );
    // A tool file elsewhere on disk, linked into tools/.
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("evil.yaml");
    std::fs::write(&target, STAMP_V1.replace("name: stamp", "name: evil")).unwrap();
    let evil = setup.tools().join("evil.yaml");
    std::os::unix::fs::symlink(&target, &evil).unwrap();
    // A link that stays inside the agents folder is followed.
    std::fs::create_dir(setup.agents().join("shared")).unwrap();
    let shared = setup.agents().join("shared/kept.yaml");
    std::fs::write(&shared, STAMP_V1.replace("name: stamp", "name: kept")).unwrap();
    std::os::unix::fs::symlink(&shared, setup.tools().join("kept.yaml")).unwrap();

    let server = setup.start(&[("CADRE_TOOLS_MAX_FILE_BYTES", "4096")]);

    let names = listed(&server).await;
    for name in ["stamp", "kept"] {
        assert!(names.contains(&name.to_string()), "{name}: {names:?}");
    }
    for name in ["big", "evil"] {
        assert!(!names.contains(&name.to_string()), "{name}: {names:?}");
    }
    let log = setup.log();
    let line_about = |path: &Path| {
        log.lines()
            .find(|l| l.contains("tool file not loaded") && l.contains(&*path.to_string_lossy()))
            .unwrap_or_else(|| panic!("no log line names {}:\n{log}", path.display()))
            .to_string()
    };
    let line = line_about(&big);
    assert!(line.contains("over the 4096-byte cap"), "{line}");
    let line = line_about(&evil);
    assert!(line.contains("outside the agents folder"), "{line}");

    // Later reloads do not read or report the refused file again: after an
    // edit of another file has been loaded, `big.yaml` was reported once.
    setup.put("stamp.yaml", STAMP_V2);
    let log = setup
        .until_logged("stamp updated", |l| {
            l.contains("tool live") && l.contains("stamp") && l.contains("added=false")
        })
        .await;
    let big = big.to_string_lossy();
    let reports = log
        .lines()
        .filter(|l| l.contains("tool file not loaded") && l.contains(&*big))
        .count();
    assert_eq!(reports, 1, "{log}");
}

/// An output nested deeper than cadre keeps fails its call: stored, it could
/// never be read back (serde_json's 128-level limit, with the record's own
/// levels around it), and every listing that read it would fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_answering_deeply_nested_json_fails_and_listings_keep_working() {
    let deep = format!("{}{}", "[".repeat(126), "]".repeat(126));
    let setup = Setup::new(&[]);
    setup.put(
        "deep.toml",
        &format!(
            "name = \"deep\"\ndescription = \"Answers deep JSON.\"\n[entry]\ntype = \"external\"\ncommand = [\"printf\", '{deep}']\n"
        ),
    );
    let server = setup.start(&[]);
    let client = server.client();
    let (status, body) = client
        .post("/v1/tools/deep/invoke", &json!({"params": {}}))
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["error_type"], "TOOL_EXECUTION_ERROR", "{body}");
    assert!(body["error"].as_str().unwrap().contains("nested"), "{body}");
    let (status, calls) = client.get("/v1/calls?tool=deep").await;
    assert_eq!(status, StatusCode::OK, "{calls}");
    assert_eq!(calls["calls"].as_array().unwrap().len(), 1, "{calls}");
}

// ----------------------------------------------------- external commands

/// A command tool file: `sh -c SCRIPT` (the script is the operator's; the
/// parameters only ever reach its stdin).
fn command_tool(name: &str, script: &str, timeout_s: u32) -> String {
    format!(
        "name = \"{name}\"\ndescription = \"Runs a script.\"\ntimeout_s = {timeout_s}\n[entry]\ntype = \"external\"\ncommand = [\"sh\", \"-c\", '''{script}''']\n"
    )
}

/// Whether `pid` runs: a zombie (killed, not yet reaped by whoever
/// inherited it) does not.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // `pid (comm) S ...`: the state follows the last ')'.
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// What a command forks dies with it: when it exits while a child holds
/// its stdout, the call answers at once instead of waiting for the child
/// (or the timeout); when the call times out, its background children are
/// killed too. A command flooding stderr before it answers does not stall.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_tool_leaves_no_process_behind_and_cannot_stall_on_its_pipes() {
    let setup = Setup::new(&[]);
    // The pid files' folder, declared writable in the tools' sandbox.
    let pids = setup.dir.path().join("pids");
    std::fs::create_dir_all(&pids).unwrap();
    let declared = format!(
        "paths = [{{ path = {:?}, write = true }}]\n",
        pids.display().to_string()
    );
    let forked = pids.join("forked.pid");
    let hung = pids.join("hung.pid");
    setup.put(
        "forks.toml",
        &(command_tool(
            "forks",
            &format!(
                "sleep 300 & echo $! > {}; echo '{{\"ok\": 1}}'",
                forked.display()
            ),
            20,
        ) + &declared),
    );
    setup.put(
        "hangs.toml",
        &(command_tool(
            "hangs",
            &format!("sleep 300 & echo $! > {}; wait", hung.display()),
            1,
        ) + &declared),
    );
    setup.put(
        "noisy.toml",
        &command_tool(
            "noisy",
            "head -c 300000 /dev/zero >&2; echo '{\"ok\": 2}'",
            20,
        ),
    );
    let server = setup.start(&[]);
    let client = server.client();

    let started = Instant::now();
    let (status, body) = client
        .post("/v1/tools/forks/invoke", &json!({"params": {}}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["output"]["ok"], 1, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let pid: i32 = std::fs::read_to_string(&forked)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    until(|| !alive(pid), "the forked child was killed").await;

    let (status, body) = client
        .post("/v1/tools/hangs/invoke", &json!({"params": {}}))
        .await;
    assert_eq!(body["error_type"], "TOOL_TIMEOUT", "{status} {body}");
    let pid: i32 = std::fs::read_to_string(&hung)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    until(|| !alive(pid), "the timed-out call's child was killed").await;

    let started = Instant::now();
    let (status, body) = client
        .post("/v1/tools/noisy/invoke", &json!({"params": {}}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["output"]["ok"], 2, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

/// Waits (polling a process table that has no event to wait on) until
/// `done`, at most 10 s.
async fn until(done: impl Fn() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "not within 10 s: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Issue #29 (5): a command tool starts with a clean environment: `PATH`,
/// `HOME`, `LANG`, the variables its tool file names (`env`) and sets
/// (`env_set`), and nothing else of cadre's, the model's key least of all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_tool_sees_only_the_environment_its_file_names() {
    let setup = Setup::new(&[]);
    setup.put(
        "envdump.yaml",
        "name: envdump\ndescription: Answers its environment\ncategory: custom\n\
         parameters: { type: object, properties: {} }\n\
         entry:\n  type: external\n  command: [\"python3\", \"-c\", \"import json, os; print(json.dumps(dict(os.environ)))\"]\n\
         \x20 env: [CADRE_TEST_PASSED]\n  env_set: { GIVEN: set-by-the-file }\n",
    );
    let server = setup.start(&[
        ("CADRE_MODEL_API_KEY", "sk-must-not-leak"),
        ("OPENAI_API_KEY", "sk-must-not-leak-either"),
        ("CADRE_TEST_PASSED", "passed-through"),
        ("CADRE_TEST_SECRET", "hidden"),
    ]);
    let (status, body) = server.invoke("envdump", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let env = body["output"].as_object().expect("an object").clone();
    let mut names: Vec<&str> = env.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(env["CADRE_TEST_PASSED"], "passed-through", "{names:?}");
    assert_eq!(env["GIVEN"], "set-by-the-file", "{names:?}");
    assert!(env.contains_key("PATH"), "{names:?}");
    for name in &names {
        assert!(
            ["PATH", "HOME", "TMPDIR", "LANG", "CADRE_TEST_PASSED", "GIVEN"].contains(name)
                // Set by the interpreter or its launcher (a pyenv shim is a
                // shell script), not inherited from cadre.
                || name.starts_with("PYENV")
                || name.starts_with("_PYENV")
                || name.starts_with("LC_")
                || ["PWD", "OLDPWD", "SHLVL", "_"].contains(name),
            "the command saw {name} of cadre's environment: {names:?}"
        );
    }
    let text = body.to_string();
    assert!(!text.contains("sk-must-not-leak") && !text.contains("hidden"));

    // A name that is no variable name is refused at load.
    setup.put(
        "badenv.yaml",
        "name: badenv\ndescription: d\nparameters: { type: object, properties: {} }\n\
         entry: { type: external, command: [\"true\"], env: [\"A=B\"] }\n",
    );
    let (status, body) = server.invoke("badenv", json!({})).await;
    assert_ne!(status, StatusCode::OK, "{body}");
}
