//! Workflow runs a restart cut resume by themselves: the real `cadre serve`
//! binary runs a workflow whose tool-file commands count their runs in
//! files, is killed with SIGKILL while a map element is inside its command,
//! and starts again on the same data dir.
//!
//! The workflow: `first` (a command that counts its runs), then `each`, a
//! map over `["alpha", "beta"]` one element at a time, whose command counts
//! its runs per element and, on `beta`'s first run, says so through a fifo
//! (`held`) and then blocks on another (`release`) until the process dies.
//! With one element at a time, `alpha`'s row is stored (durably) before
//! `beta` starts, so when the test hears `held`, `first` and `alpha` are on
//! disk and `beta` is cut mid-command.
//!
//! - within `[sessions] resume_window_s`, the run finishes by itself after
//!   the restart: `first` and `alpha` ran once, `beta` twice; a CLI command
//!   run on the data dir before the server (`cadre workflow list`) leaves
//!   the cut run alone;
//! - with a zero window, it is closed as `interrupted` (its error names the
//!   window) and nothing runs until a client resumes it;
//! - a cut element whose call had finished (its record written, as the
//!   executor does before it answers, the element not yet stored) takes the
//!   recorded output and does not run again.
//!
//! The cost of taking cut runs up at start (not a CI test; N runs cut
//! mid-node are written into a fresh data dir, then the server starts):
//!
//! ```sh
//! CADRE_RESUME_RUNS=1000 cargo test --test workflow_resume -- --ignored --nocapture
//! ```

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use cadre::store::{Store, ToolCallRecord, WriteOp};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::server::Server;
use support::{Client, agent_toml};

/// How long a step may take before the test gives up.
const PATIENCE: Duration = Duration::from_secs(30);

const WORKFLOW: &str = r#"
name = "cut"
[[nodes]]
id = "first"
tool = "first"
[[nodes]]
id = "each"
depends_on = ["first"]
map = "input.items"
max_parallel = 1
tool = "hold"
params = { item = "{{item}}" }
"#;

/// An agents folder with the workflow and its two command tools, and a
/// work folder with the fifos and the run counters.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().expect("temp dir");
        let setup = Setup { dir };
        for sub in ["agents/tools", "agents/workflows", "work"] {
            std::fs::create_dir_all(setup.dir.path().join(sub)).expect("mkdir");
        }
        // `serve` refuses an agents folder with no agent in it.
        std::fs::write(
            setup.agents().join("plain.toml"),
            agent_toml("plain", &[], 1),
        )
        .expect("agent");
        std::fs::write(setup.agents().join("workflows/cut.toml"), WORKFLOW).expect("workflow");
        let w = setup.work();
        let w = w.display();
        let first = format!(r#"echo run >> {w}/first.runs; echo '{{"n": 1}}'"#);
        let hold = format!(
            r#"input=$(cat)
case "$input" in *beta*) item=beta;; *) item=alpha;; esac
echo run >> {w}/$item.runs
if [ "$item" = beta ] && [ "$(wc -l < {w}/beta.runs)" -eq 1 ]; then
  echo held > {w}/held.fifo
  read line < {w}/release.fifo
fi
printf '{{"item": "%s"}}' "$item""#
        );
        std::fs::write(
            setup.agents().join("tools/first.toml"),
            tool("first", &first, ""),
        )
        .expect("tool");
        let item = "[[parameters]]\nname = \"item\"\ntype = \"string\"\nrequired = true\n";
        std::fs::write(
            setup.agents().join("tools/hold.toml"),
            tool("hold", &hold, item),
        )
        .expect("tool");
        for fifo in ["held.fifo", "release.fifo"] {
            mkfifo(&setup.work().join(fifo));
        }
        setup
    }

    fn agents(&self) -> PathBuf {
        self.dir.path().join("agents")
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn start(&self, resume_window_s: &str) -> Server {
        Server::start_offline_with(
            &self.data(),
            &self.agents(),
            &[
                ("NO_COLOR", "1"),
                ("CADRE_SESSIONS_RESUME_WINDOW_S", resume_window_s),
                // Its tools use fifos and logs in a work folder; the
                // sandbox is tests/sandbox.rs's subject.
                ("CADRE_TOOLS_SANDBOX", "off"),
            ],
        )
    }

    /// Runs `cadre ARGS` on the data dir, as the server runs; it must exit 0.
    fn cli(&self, args: &[&str]) {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cadre"))
            .args(args)
            .arg("--data-dir")
            .arg(self.data())
            .arg("--agents")
            .arg(self.agents())
            .env_remove("CADRE_CONFIG")
            .env_remove("CADRE_MODEL_BASE_URL")
            .env("CADRE_SESSIONS_RESUME_WINDOW_S", "600")
            .env("NO_COLOR", "1")
            .output()
            .expect("the cadre binary runs");
        assert!(
            out.status.success(),
            "cadre {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// How many times `name`'s command ran (`first`, `alpha`, `beta`).
    fn runs(&self, name: &str) -> usize {
        std::fs::read_to_string(self.work().join(format!("{name}.runs")))
            .map_or(0, |t| t.lines().count())
    }

    /// Starts the run and returns its id once `beta`'s command holds (its
    /// first run), the server being killed next.
    async fn start_and_hold(&self, server: &Server) -> String {
        let held = self.work().join("held.fifo");
        let heard = tokio::task::spawn_blocking(move || std::fs::read_to_string(held));
        let (status, run) = server
            .client()
            .post(
                "/v1/workflows/cut/runs",
                &json!({"input": {"items": ["alpha", "beta"]}}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{run}");
        let said = tokio::time::timeout(PATIENCE, heard)
            .await
            .unwrap_or_else(|_| panic!("beta's command never held:\n{}", server.log_tail()))
            .expect("no panic")
            .expect("read the fifo");
        assert_eq!(said.trim(), "held");
        run["id"].as_str().expect("run id").to_string()
    }
}

impl Drop for Setup {
    /// Frees the command the kill orphaned (it waits on `release`), and
    /// the test's reader of `held` if a failure left it waiting.
    fn drop(&mut self) {
        use std::os::unix::fs::OpenOptionsExt;
        for fifo in ["release.fifo", "held.fifo"] {
            let _ = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(self.work().join(fifo));
        }
    }
}

fn tool(name: &str, script: &str, parameters: &str) -> String {
    format!(
        "name = \"{name}\"\ndescription = \"Counts its runs.\"\ntimeout_s = 60\n{parameters}[entry]\ntype = \"external\"\ncommand = [\"sh\", \"-c\", '''{script}''']\n"
    )
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a plain syscall on a valid C string.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo: {}", std::io::Error::last_os_error());
}

/// The run once it is over: its event stream ends with the run (or at
/// once, with its snapshot, when it is already over).
async fn finished(client: &Client, id: &str) -> Value {
    let events = async {
        client
            .request(Method::GET, &format!("/v1/workflows/runs/{id}/events"))
            .send()
            .await
            .expect("events request")
            .text()
            .await
            .expect("events")
    };
    tokio::time::timeout(PATIENCE, events)
        .await
        .expect("the run finished in time");
    get_run(client, id).await
}

async fn get_run(client: &Client, id: &str) -> Value {
    let (status, run) = client.get(&format!("/v1/workflows/runs/{id}")).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cut_by_kill_9_resumes_by_itself_and_runs_only_what_did_not_finish() {
    let setup = Setup::new();
    let mut server = setup.start("600");
    let id = setup.start_and_hold(&server).await;
    server.kill_9();

    // A CLI command on the data dir leaves the cut run for the server.
    setup.cli(&["workflow", "list"]);
    {
        let store = Store::open(&setup.data()).expect("open the data dir");
        let run = cadre::workflow::record::load(&store, &id)
            .await
            .expect("readable")
            .expect("stored");
        assert_eq!(
            (run.status.as_str(), run.automatic_resumes),
            ("running", 0),
            "{run:?}"
        );
    }
    assert_eq!(setup.runs("beta"), 1);

    let server = setup.start("600");
    let client = server.client();
    let run = finished(&client, &id).await;
    assert_eq!(run["status"], "succeeded", "{run}\n{}", server.log_tail());
    assert_eq!(run["resumes"], 1, "{run}");
    assert_eq!(run["automatic_resumes"], 1, "{run}");
    assert!(run["resumed_at"].is_string(), "{run}");
    assert_eq!(
        run["nodes"]["each"]["output"],
        json!([{"item": "alpha"}, {"item": "beta"}]),
        "{run}"
    );
    assert_eq!(run["nodes"]["first"]["attempts"], 1, "{run}");
    assert_eq!(setup.runs("first"), 1, "a finished node is not run again");
    assert_eq!(
        setup.runs("alpha"),
        1,
        "a finished element is not run again"
    );
    assert_eq!(setup.runs("beta"), 2, "the cut element ran again");
    let log = server.log_text();
    assert!(
        log.contains("workflow run cut by a restart: resumed") && log.contains("1 resumed"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cut_past_the_resume_window_is_closed_as_interrupted_and_nothing_runs() {
    let setup = Setup::new();
    let mut server = setup.start("0");
    let id = setup.start_and_hold(&server).await;
    server.kill_9();

    let server = setup.start("0");
    let client = server.client();
    let run = get_run(&client, &id).await;
    assert_eq!(run["status"], "interrupted", "{run}");
    assert!(
        run["error"]
            .as_str()
            .is_some_and(|e| e.contains("resume_window_s")),
        "{run}"
    );
    assert_eq!(run["resumes"], 0, "{run}");
    assert_eq!(run["nodes"]["first"]["status"], "succeeded", "{run}");
    let beta = &run["nodes"]["each"]["items"][1];
    assert_eq!(beta["status"], "failed", "{run}");
    assert!(
        beta["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("interrupted")),
        "{run}"
    );
    assert_eq!(
        (setup.runs("first"), setup.runs("alpha"), setup.runs("beta")),
        (1, 1, 1),
        "nothing ran after the restart"
    );
    assert!(
        server
            .log_text()
            .contains("0 resumed, 1 closed as interrupted"),
        "{}",
        server.log_tail()
    );

    // A client's resume still finishes it, and says it was not automatic.
    let (status, body) = client
        .post(&format!("/v1/workflows/runs/{id}/resume"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let run = finished(&client, &id).await;
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(
        (&run["resumes"], &run["automatic_resumes"]),
        (&json!(1), &json!(0))
    );
    assert_eq!(
        (setup.runs("first"), setup.runs("alpha"), setup.runs("beta")),
        (1, 1, 2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_element_whose_call_finished_keeps_the_recorded_output_and_does_not_run_again() {
    let setup = Setup::new();
    let mut server = setup.start("600");
    let id = setup.start_and_hold(&server).await;
    server.kill_9();

    // What the executor stores when beta's call answers, durably and before
    // the runner hears of it: the kill came in between.
    {
        let store = Store::open(&setup.data()).expect("open the data dir");
        let record: ToolCallRecord = serde_json::from_value(json!({
            "record_id": uuid::Uuid::now_v7().to_string(),
            "tool_name": "hold",
            "tool_call_id": null,
            "params": {"item": "beta"},
            "output": {"item": "beta", "recorded": true},
            "is_success": true,
            "error": null,
            "error_type": null,
            "execution_time_ms": 5,
            "attempts": 1,
            "caller_id": "workflow:cut/each[1]",
            "caller_type": "workflow_node",
            "conversation_id": null,
            "workflow_id": id,
            "user_id": null,
            "tenant": "default",
            "created_at": jiff::Timestamp::now(),
        }))
        .expect("a call record");
        store
            .write(vec![WriteOp::RecordToolCall(Box::new(record))], true)
            .await
            .expect("record written");
    }

    let server = setup.start("600");
    let run = finished(&server.client(), &id).await;
    assert_eq!(run["status"], "succeeded", "{run}\n{}", server.log_tail());
    assert_eq!(
        run["nodes"]["each"]["output"],
        json!([{"item": "alpha"}, {"item": "beta", "recorded": true}]),
        "{run}"
    );
    assert_eq!(
        (setup.runs("first"), setup.runs("alpha"), setup.runs("beta")),
        (1, 1, 1),
        "no command ran again"
    );
}

/// Prints how long `cadre serve` takes to listen, and then to finish every
/// run, with `CADRE_RESUME_RUNS` runs (default 1,000) cut mid-node, within
/// the window and past it. A measurement, not a check: `--ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: see the module doc"]
async fn taking_up_many_cut_runs_at_start() {
    let n: usize = std::env::var("CADRE_RESUME_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    for window in ["600", "0"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let agents = dir.path().join("agents");
        std::fs::create_dir_all(agents.join("workflows")).expect("mkdir");
        std::fs::write(agents.join("plain.toml"), agent_toml("plain", &[], 1)).expect("agent");
        std::fs::write(
            agents.join("workflows/w.toml"),
            "name = \"w\"\n[[nodes]]\nid = \"a\"\ntool = \"calculator\"\nparams = { expression = \"1+1\" }\n",
        )
        .expect("workflow");
        let data = dir.path().join("data");
        {
            let store = Store::open(&data).expect("open the data dir");
            let now = jiff::Timestamp::now();
            let mut ops = Vec::new();
            for _ in 0..n {
                let run: cadre::workflow::WorkflowRun = serde_json::from_value(json!({
                    "id": uuid::Uuid::now_v7().to_string(),
                    "workflow": "w",
                    "status": "running",
                    "input": {},
                    "nodes": {"a": {"status": "running", "output": null, "error": null,
                        "attempts": 0, "started_at": now, "finished_at": null}},
                    "output": null,
                    "error": null,
                    "created_at": now,
                    "finished_at": null,
                }))
                .expect("a run");
                ops.extend(cadre::workflow::record::ops(&run, true, &[]));
            }
            store.write(ops, true).await.expect("runs written");
        }
        let started = std::time::Instant::now();
        let server = Server::start_offline_with(
            &data,
            &agents,
            &[
                ("CADRE_SESSIONS_RESUME_WINDOW_S", window),
                ("CADRE_TOOLS_SANDBOX", "off"),
                ("RUST_LOG", "warn"),
            ],
        );
        let listening = started.elapsed();
        let client = server.client();
        loop {
            let (_, body) = client
                .get(&format!("/v1/workflows/runs?limit={}", n.clamp(1, 1_000)))
                .await;
            let runs = body["runs"].as_array().expect("runs");
            if runs.iter().all(|r| r["status"] != "running") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!(
            "{n} cut runs, resume_window_s = {window}: listening after {listening:.2?}, every run over after {:.2?}",
            started.elapsed()
        );
    }
}
