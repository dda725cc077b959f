//! Workflow runs in cluster mode follow the owner/epoch rule keyed by run
//! id: two real `cadre serve` nodes on one real PostgreSQL (fast
//! heartbeats: a node silent for 1 s is dead to the other), a workflow whose
//! command tools write what they did in files outside cadre.
//!
//! node0 ──runs the workflow── ✗ (kill -9, or SIGSTOP)
//! node1 ──takeover sweep (every 1 s)──▶ claim_run (epoch + 1) ──▶ resume: what finished is not run again
//!
//! The workflow: `first` (a command), then `each`, a map over
//! `["alpha", "beta"]` one element at a time. Each command counts its runs
//! in `<name>.runs` and, as it finishes, appends its call's idempotency key
//! to `ledger.log`: a key written twice is a tool that ran twice. On
//! `beta`'s first run the command says `held` through a fifo and blocks on
//! another, so the test knows node0 is inside it, with `first` and `alpha`
//! stored. The map node's `timeout_s` is 2 s, its `retries` 0.
//!
//! - kill -9 of node0: node1 takes the run over and finishes it; `first`
//!   and `alpha` ran once, `beta` (cut mid-command, never finished) twice,
//!   and every key is in the ledger once.
//! - SIGSTOP of node0: node1 takes the run over and finishes it; node0,
//!   woken past `beta`'s timeout, has a step to write (the element failed):
//!   the write is refused by the run's fence, node0's runner stops, and the
//!   run's rows are what node1 left.
//! - Through node1 while node0 runs it: the run's cancel and its event
//!   stream are forwarded to node0 (`cluster::forward`).

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::cluster::{Cluster, ClusterOptions};
use support::postgres::Postgres;
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
timeout_s = 2
retries = 0
"#;

const FIRST: &str = r#"
import json, os, sys
p = json.load(sys.stdin)
work = sys.argv[1]
open(os.path.join(work, 'first.runs'), 'a').write('run\n')
open(os.path.join(work, 'ledger.log'), 'a').write(p['idempotency_key'] + '\n')
json.dump({'n': 1}, sys.stdout)
"#;

const HOLD: &str = r#"
import json, os, sys
p = json.load(sys.stdin)
work = sys.argv[1]
item = p['item']
runs = os.path.join(work, item + '.runs')
open(runs, 'a').write('run\n')
if item == 'beta' and len(open(runs).read().splitlines()) == 1:
    open(os.path.join(work, 'held.fifo'), 'w').write('held')
    open(os.path.join(work, 'release.fifo')).read()
open(os.path.join(work, 'ledger.log'), 'a').write(p['idempotency_key'] + '\n')
json.dump({'item': item}, sys.stdout)
"#;

/// The agents folder (the workflow, its two command tools) and the work
/// folder the commands write in.
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
        let agents = setup.agents();
        // `serve` refuses an agents folder with no agent in it.
        std::fs::write(agents.join("plain.toml"), agent_toml("plain", &[], 1)).expect("agent");
        std::fs::write(agents.join("workflows/cut.toml"), WORKFLOW).expect("workflow");
        std::fs::write(agents.join("tools/first.py"), FIRST).expect("script");
        std::fs::write(agents.join("tools/hold.py"), HOLD).expect("script");
        let work = setup.work();
        std::fs::write(
            agents.join("tools/first.toml"),
            tool("first", &agents.join("tools/first.py"), &work, ""),
        )
        .expect("tool");
        let item = "[[parameters]]\nname = \"item\"\ntype = \"string\"\nrequired = true\n";
        std::fs::write(
            agents.join("tools/hold.toml"),
            tool("hold", &agents.join("tools/hold.py"), &work, item),
        )
        .expect("tool");
        for fifo in ["held.fifo", "release.fifo"] {
            mkfifo(&work.join(fifo));
        }
        setup
    }

    fn agents(&self) -> PathBuf {
        self.dir.path().join("agents")
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// How many times `name`'s command started (`first`, `alpha`, `beta`).
    fn runs(&self, name: &str) -> usize {
        std::fs::read_to_string(self.work().join(format!("{name}.runs")))
            .map_or(0, |t| t.lines().count())
    }

    /// The idempotency keys of the commands that finished, in order.
    fn ledger(&self) -> Vec<String> {
        std::fs::read_to_string(self.work().join("ledger.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Two nodes on `database`; a node silent for 1 s is dead to the other.
    async fn cluster(&self, database: &str) -> Cluster {
        let database = database.to_string();
        let mut options = ClusterOptions::plain(2)
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
            .env("CADRE_CLUSTER_OWNER_STALE_S", "1")
            .env("CADRE_SESSIONS_RESUME_WINDOW_S", "600")
            .env("NO_COLOR", "1");
        options.agents = self.agents();
        Cluster::start(options).await
    }

    /// Starts the run on `client`'s node and returns its id once `beta`'s
    /// command holds there (`first` and `alpha` are stored by then).
    async fn start_and_hold(&self, client: &Client) -> String {
        let held = self.work().join("held.fifo");
        let heard = tokio::task::spawn_blocking(move || std::fs::read_to_string(held));
        let (status, run) = client
            .post(
                "/v1/workflows/cut/runs",
                &json!({"input": {"items": ["alpha", "beta"]}}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{run}");
        let said = tokio::time::timeout(PATIENCE, heard)
            .await
            .expect("beta's command held in time")
            .expect("no panic")
            .expect("read the fifo");
        assert_eq!(said.trim(), "held");
        run["id"].as_str().expect("run id").to_string()
    }
}

impl Drop for Setup {
    /// Frees the command left waiting on `release` (its node was killed),
    /// and the test's reader of `held` if a failure left it waiting.
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

fn tool(name: &str, script: &Path, work: &Path, parameters: &str) -> String {
    format!(
        "name = \"{name}\"\ndescription = \"Counts its runs.\"\ntimeout_s = 60\n{parameters}[entry]\ntype = \"external\"\ncommand = [\"python3\", {:?}, {:?}]\n",
        script.display().to_string(),
        work.display().to_string()
    )
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a plain syscall on a valid C string.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo: {}", std::io::Error::last_os_error());
}

/// The run as `client`'s node reads it once its status is `status`.
async fn run_when(client: &Client, id: &str, status: &str, cluster: &Cluster) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (code, run) = client.get(&format!("/v1/workflows/runs/{id}")).await;
        if code == StatusCode::OK && run["status"] == status {
            return run;
        }
        assert!(
            Instant::now() < deadline,
            "the run never became {status}: {code} {run}\nnode1:\n{}",
            cluster.node(1).log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The run's rows in PostgreSQL: its document, owner and epoch, and its
/// map elements.
fn rows(pg: &Postgres, url: &str, id: &str) -> (String, String) {
    let run = pg.sql(
        url,
        &format!("SELECT owner, epoch, body::text FROM workflow_runs WHERE key = '{id}'"),
    );
    let items = pg.sql(
        url,
        &format!("SELECT key, body::text FROM workflow_items WHERE key LIKE '{id}/%' ORDER BY key"),
    );
    (run, items)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_a_killed_node_is_finished_by_another_and_no_tool_runs_twice() {
    let setup = Setup::new();
    let pg = Postgres::shared();
    let url = pg.database("workflow_kill");
    let mut cluster = setup.cluster(&url).await;
    let id = setup.start_and_hold(&cluster.node_client(0)).await;
    cluster.kill9(0);

    let node1 = cluster.node_client(1);
    let run = run_when(&node1, &id, "succeeded", &cluster).await;
    assert_eq!(
        run["nodes"]["each"]["output"],
        json!([{"item": "alpha"}, {"item": "beta"}]),
        "{run}"
    );
    assert_eq!(run["automatic_resumes"], 1, "{run}");
    assert_eq!(run["node"], "n1", "{run}");
    assert_eq!(setup.runs("first"), 1, "a finished node is not run again");
    assert_eq!(
        setup.runs("alpha"),
        1,
        "a finished element is not run again"
    );
    assert_eq!(setup.runs("beta"), 2, "the cut element ran again on node1");
    let ledger = setup.ledger();
    let mut keys = ledger.clone();
    keys.sort();
    keys.dedup();
    assert_eq!(
        (keys.len(), ledger.len()),
        (3, 3),
        "every tool finished once: {ledger:?}"
    );
    let (owner, _) = rows(&pg, &url, &id);
    assert!(owner.starts_with("n1|2|"), "taken over at epoch 2: {owner}");
    assert!(
        cluster
            .node(1)
            .log_text()
            .contains("workflow run of a dead node taken over"),
        "{}",
        cluster.node(1).log_tail()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_whose_run_was_taken_over_cannot_write_it_when_woken() {
    let setup = Setup::new();
    let pg = Postgres::shared();
    let url = pg.database("workflow_pause");
    let cluster = setup.cluster(&url).await;
    let id = setup.start_and_hold(&cluster.node_client(0)).await;
    cluster.sigstop(0);
    let paused = tokio::time::Instant::now();

    let node1 = cluster.node_client(1);
    run_when(&node1, &id, "succeeded", &cluster).await;
    assert_eq!(setup.runs("beta"), 2, "node1 ran the cut element");
    let before = rows(&pg, &url, &id);
    assert!(before.0.starts_with("n1|2|"), "{before:?}");
    // Woken past beta's 2 s timeout, node0's executor ends the held call
    // as timed out and its runner has a step to write (the element
    // failed). Time passing while node0 is stopped is the point here, so
    // this waits for it: nothing else would say when it has.
    tokio::time::sleep_until(paused + Duration::from_secs(3)).await;
    cluster.sigcont(0);
    // Until node0 says it stopped, or its write changed the rows.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let stopped = cluster
            .node(0)
            .log_text()
            .contains("workflow run taken over by another node: its runner here stops");
        assert_eq!(rows(&pg, &url, &id), before, "node0 wrote the run");
        if stopped {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node0 never learned it lost the run:\n{}",
            cluster.node(0).log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let run = run_when(&node1, &id, "succeeded", &cluster).await;
    assert_eq!(
        run["nodes"]["each"]["output"],
        json!([{"item": "alpha"}, {"item": "beta"}]),
        "{run}"
    );
    assert_eq!(
        setup.ledger().len(),
        3,
        "node0's cut call never finished: {:?}",
        setup.ledger()
    );
}

/// A run's cancel and event stream reach the node running it from any
/// node: the balancer hashes a run's paths elsewhere than the
/// `POST /v1/workflows/{name}/runs` that started it, so without
/// forwarding a cancel through it was 503 `SESSION_MOVED` and its event
/// stream never saw the run end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_cancelled_and_followed_through_a_node_that_does_not_run_it() {
    use futures::StreamExt;
    let setup = Setup::new();
    let pg = Postgres::shared();
    let url = pg.database("workflow_forward");
    let cluster = setup.cluster(&url).await;
    let id = setup.start_and_hold(&cluster.node_client(0)).await;
    let node1 = cluster.node_client(1);
    let events = node1
        .request(
            reqwest::Method::GET,
            &format!("/v1/workflows/runs/{id}/events"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), StatusCode::OK);
    assert_eq!(
        events.headers()["x-cadre-node"],
        "n0",
        "served by the runner"
    );
    let (status, run) = node1
        .post(&format!("/v1/workflows/runs/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(run["status"], "cancelled", "{run}");
    let mut text = String::new();
    let mut stream = events.bytes_stream();
    let ended = tokio::time::timeout(PATIENCE, async {
        while let Some(chunk) = stream.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            if text.contains("run_finished") {
                return;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the stream never saw the run end: {text}");
}
