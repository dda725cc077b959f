//! Cluster mode proven on one machine: real PostgreSQL, real HAProxy, three
//! real `cadre serve` nodes and the mock model.
//!
//! clients ──▶ HAProxy ──▶ node0 | node1 | node2 ──▶ PostgreSQL (one database per test)
//!                          every node ──▶ MockModel; tool `ledger` ──▶ one file all nodes append to
//!
//! The agent `clerk` has one tool, `ledger` (a command, `side_effects:
//! at_most_once`), which appends its call's idempotency key to a file the
//! nodes share: the world outside cadre, where a call that ran twice shows
//! as a key written twice. Every user message gets one `ledger` call, then
//! an answer naming the message.
//!
//! 1. **Kill under load** ([`acknowledged_turns_survive_kill_9_of_random_nodes`]):
//!    sessions in tool-calling turns through HAProxy while a random node
//!    is killed -9 (0.3 s into the load, then every 1.5 s while it runs, at
//!    most `CADRE_KILL_KILLS`, 3) and restarted 0.5 s later; clients retry with
//!    their `Idempotency-Key`. Every acknowledged turn is stored exactly
//!    once, `seq` is dense, no user message is duplicated, no ledger key is
//!    written twice, and every acknowledged turn's call is in the ledger.
//!    CI runs one small trial; the long run (2026-11-26 at dc1e26c, 2 vCPU,
//!    release, 13 min: 100 trials, 12,000 turns acknowledged, 0 lost, 0
//!    duplicated, 0 side effects twice, 2,890 turns retried, acknowledged
//!    after p50 2.0 s, p99 3.6 s; 1,467 calls cut between intent and record
//!    reported `TOOL_OUTCOME_UNKNOWN`, never run again) is
//!    `CADRE_KILL_TRIALS=100 CADRE_KILL_SESSIONS=30 cargo test --release --test cluster acknowledged -- --nocapture`.
//! 2. **Split brain** ([`a_paused_owner_is_fenced_when_it_wakes`],
//!    [`two_nodes_driving_one_session_commit_one_history`]).
//! 3. **Tenants** ([`another_tenants_request_neither_moves_a_session_nor_reaches_its_owner`]):
//!    forwarding and takeover happen only for the session's own tenant.
//!    A new session has no owner until a node runs it
//!    ([`a_new_session_is_run_by_the_node_its_first_message_reaches`]).
//! 4. **Keys across nodes** ([`a_keyed_request_running_on_one_node_is_not_run_again_by_another`],
//!    [`a_keyed_request_cut_by_its_nodes_death_runs_again_elsewhere_once_it_is_stale`],
//!    [`a_keyed_request_cut_by_a_quick_restart_runs_again_elsewhere`]):
//!    an `Idempotency-Key` is marked running in the database.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::cluster::{Cluster, ClusterOptions};
use support::postgres::Postgres;
use support::{Client, Reply};

/// The agents folder: `clerk` and its `ledger` tool.
fn clerk_agents(dir: &Path) -> PathBuf {
    let agents = dir.join("agents");
    std::fs::create_dir_all(agents.join("tools")).unwrap();
    std::fs::write(
        agents.join("clerk.toml"),
        "name = \"clerk\"\ndescription = \"Writes each request in the ledger.\"\n\
         system_prompt = \"Record every request with the ledger tool.\"\n\
         tools = [\"ledger\"]\nmax_iterations = 3\nhistory_window = 20\n",
    )
    .unwrap();
    std::fs::write(
        agents.join("tools/ledger.yaml"),
        "name: ledger\ndescription: Append a note to the ledger\ncategory: custom\n\
         parameters:\n  - name: note\n    type: string\n    required: true\n\
         entry: { type: external, command: [\"python3\", \"ledger.py\"] }\n\
         required_plan: free\nside_effects: at_most_once\n",
    )
    .unwrap();
    std::fs::write(
        agents.join("tools/ledger.py"),
        "import json, os, sys\n\
         p = json.load(sys.stdin)\n\
         line = (p.get('idempotency_key') or '-') + '\\n'\n\
         fd = os.open('ledger.log', os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)\n\
         os.write(fd, line.encode())\n\
         os.close(fd)\n\
         json.dump({'written': p['note']}, sys.stdout)\n",
    )
    .unwrap();
    agents
}

/// Keys in the ledger and how often each was written.
fn ledger(agents: &Path) -> HashMap<String, usize> {
    let mut out = HashMap::new();
    let text = std::fs::read_to_string(agents.join("tools/ledger.log")).unwrap_or_default();
    for line in text.lines() {
        *out.entry(line.to_string()).or_insert(0) += 1;
    }
    out
}

/// A user message gets a `ledger` call; its result gets the answer.
fn answer(request: &Value, number: usize) -> Reply {
    let messages = request["messages"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let last = messages.last().unwrap_or(&Value::Null);
    let user = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default();
    match last["role"].as_str() {
        Some("user") => Reply::tool_call(
            &format!("call_{number}"),
            "ledger",
            &json!({ "note": user }).to_string(),
        ),
        Some("tool") => Reply::text(&format!("recorded: {user}")),
        other => Reply::refusal(&format!("unexpected last role {other:?}")),
    }
}

/// Options of a cluster of `n` nodes on `database`, with fast heartbeats
/// (a dead owner's sessions are taken over after 1 s).
fn options(n: usize, database: String, agents: PathBuf) -> ClusterOptions {
    let mut options = ClusterOptions::plain(n)
        .with_model()
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
        .env("CADRE_CONCURRENCY_QUEUE_SIZE", "100000")
        .env("RUST_LOG", "warn");
    options.agents = agents;
    options
}

async fn start(options: ClusterOptions) -> Cluster {
    let cluster = Cluster::start(options).await;
    cluster.model().set_responder(answer);
    cluster
}

/// Every message of a session, oldest first (all pages).
async fn history(client: &Client, session: &str) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    let mut after = 0u64;
    loop {
        let (status, body) = client
            .try_get(&format!(
                "/v1/sessions/{session}/messages?after={after}&limit=500"
            ))
            .await
            .map_err(|e| e.to_string())?;
        if status != StatusCode::OK {
            return Err(format!("{status}: {body}"));
        }
        let page = body["messages"].as_array().cloned().unwrap_or_default();
        out.extend(page);
        match body["next_after"].as_u64() {
            Some(next) => after = next,
            None => return Ok(out),
        }
    }
}

/// One message, retried with its key until acknowledged or `deadline`.
async fn say_until_acked(
    client: &Client,
    session: &str,
    content: &str,
    key: &str,
    deadline: Instant,
) -> Result<(Value, usize), String> {
    let mut last = String::new();
    let mut attempts = 0;
    while Instant::now() < deadline {
        attempts += 1;
        let sent = client
            .request(
                reqwest::Method::POST,
                &format!("/v1/sessions/{session}/messages"),
            )
            .header("Idempotency-Key", key)
            .json(&json!({ "content": content }))
            .send()
            .await;
        match sent {
            Ok(r) => {
                let status = r.status();
                let body: Value = r.json().await.unwrap_or(Value::Null);
                if status == StatusCode::OK {
                    return Ok((body, attempts));
                }
                last = format!("{status}: {body}");
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("not acknowledged before the deadline: {last}"))
}

struct Trial {
    sessions: usize,
    turns: usize,
    kills: usize,
}

#[derive(Default, Debug)]
struct Figures {
    acked: usize,
    lost: usize,
    duplicated: usize,
    ledger_twice: usize,
    /// Acknowledged turns whose call ended `TOOL_OUTCOME_UNKNOWN` (its node died
    /// between the intent and the record): at most once, maybe not at all.
    unknown: usize,
    /// Time to acknowledgement of the turns that needed a retry.
    failovers_ms: Vec<u64>,
}

async fn kill_trial(pg: &Postgres, trial: usize, size: &Trial) -> Figures {
    let dir = tempfile::tempdir().unwrap();
    let agents = clerk_agents(dir.path());
    let database = pg.database(&format!("kill_{trial}"));
    let cluster = Arc::new(Mutex::new(
        start(options(3, database, agents.clone())).await,
    ));
    let client = cluster
        .lock()
        .unwrap()
        .client()
        .with_timeout(Duration::from_secs(30));
    let mut sessions = Vec::new();
    for _ in 0..size.sessions {
        sessions.push(client.session("clerk").await);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let failovers = Arc::new(Mutex::new(Vec::new()));
    let drivers: Vec<_> = sessions
        .iter()
        .cloned()
        .map(|id| {
            let client = client.clone();
            let failovers = failovers.clone();
            let turns = size.turns;
            tokio::spawn(async move {
                let mut acked = Vec::new();
                for t in 0..turns {
                    let content = format!("request {t} of {id}");
                    let started = Instant::now();
                    let key = format!("{id}-{t}");
                    let (body, attempts) =
                        say_until_acked(&client, &id, &content, &key, deadline).await?;
                    if attempts > 1 {
                        let took = started.elapsed().as_millis() as u64;
                        failovers.lock().unwrap().push(took);
                    }
                    acked.push((content, body));
                }
                Ok::<_, String>((id, acked))
            })
        })
        .collect();
    // The killer: the first kill soon after the load starts, then one
    // every 1.5 s while it runs (at most `kills`).
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let killer = {
        let cluster = cluster.clone();
        let kills = size.kills;
        let done = done.clone();
        tokio::spawn(async move {
            for k in 0..kills {
                let wait = if k == 0 { 300 } else { 1000 };
                tokio::time::sleep(Duration::from_millis(wait)).await;
                if done.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let victim = (rand::random::<u32>() as usize + k) % 3;
                let c = cluster.clone();
                tokio::task::spawn_blocking(move || c.lock().unwrap().kill9(victim))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(500)).await;
                let c = cluster.clone();
                tokio::task::spawn_blocking(move || c.lock().unwrap().restart(victim))
                    .await
                    .unwrap();
            }
        })
    };
    let mut acked: BTreeMap<String, Vec<(String, Value)>> = BTreeMap::new();
    for d in drivers {
        let (id, turns) = d.await.unwrap().expect("every turn acknowledged");
        acked.insert(id, turns);
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    killer.await.unwrap();
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.lock().unwrap().wait_all_up(Duration::from_secs(30)))
        .await
        .unwrap();
    let book = ledger(&agents);
    let mut figures = Figures {
        failovers_ms: failovers.lock().unwrap().clone(),
        ledger_twice: book.values().filter(|n| **n > 1).count(),
        ..Figures::default()
    };
    for (id, turns) in &acked {
        let messages = history(&client, id).await.expect("history");
        let seqs: Vec<u64> = messages.iter().filter_map(|m| m["seq"].as_u64()).collect();
        let dense: Vec<u64> = (1..=seqs.len() as u64).collect();
        assert_eq!(seqs, dense, "session {id}: seq is dense from 1");
        for (content, body) in turns {
            figures.acked += 1;
            let users = messages
                .iter()
                .filter(|m| m["role"] == "user" && m["content"] == content.as_str())
                .count();
            match users {
                0 => figures.lost += 1,
                1 => {}
                _ => figures.duplicated += 1,
            }
            let answer = body["answer"].as_str().unwrap_or_default();
            assert_eq!(answer, format!("recorded: {content}"), "{body}");
            let answers = messages
                .iter()
                .filter(|m| m["role"] == "assistant" && m["content"] == answer)
                .count();
            if answers == 0 {
                figures.lost += 1;
            }
            // The acknowledged turn's call ran (once: ledger_twice), unless
            // its outcome is unknown.
            if body["tool_calls"][0]["is_success"] != true {
                figures.unknown += 1;
                continue;
            }
            let turn = body["turn_id"].as_str().unwrap_or_default();
            let ran: usize = book
                .iter()
                .filter(|(k, _)| k.starts_with(&format!("{id}:{turn}:")))
                .map(|(_, n)| *n)
                .sum();
            assert!(
                ran >= 1,
                "session {id} turn {turn}: acknowledged but its call is not in the ledger: {body}"
            );
        }
    }
    figures
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_turns_survive_kill_9_of_random_nodes() {
    let trials: usize = std::env::var("CADRE_KILL_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let size = Trial {
        sessions: std::env::var("CADRE_KILL_SESSIONS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(12),
        turns: 4,
        kills: std::env::var("CADRE_KILL_KILLS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3),
    };
    let pg = Postgres::shared();
    let mut all = Figures::default();
    for trial in 0..trials {
        let f = kill_trial(&pg, trial, &size).await;
        assert_eq!(f.lost, 0, "trial {trial}: acknowledged turns lost: {f:?}");
        assert_eq!(
            f.duplicated, 0,
            "trial {trial}: user messages stored twice: {f:?}"
        );
        assert_eq!(
            f.ledger_twice, 0,
            "trial {trial}: a side effect ran twice: {f:?}"
        );
        eprintln!(
            "trial {trial}: {} turns acknowledged, lost 0, duplicated 0, side effects twice 0, {} needed a retry, {} call outcomes unknown",
            f.acked,
            f.failovers_ms.len(),
            f.unknown
        );
        all.acked += f.acked;
        all.unknown += f.unknown;
        all.failovers_ms.extend(f.failovers_ms);
    }
    all.failovers_ms.sort_unstable();
    println!(
        "cluster kill -9: {trials} trial(s), {} turns acknowledged, lost 0, duplicated 0, side effects twice 0; \
         call outcomes unknown {}; turns that needed a retry: {}, acknowledged after p50 {} ms, p99 {} ms",
        all.acked,
        all.unknown,
        all.failovers_ms.len(),
        percentile(&all.failovers_ms, 0.5),
        percentile(&all.failovers_ms, 0.99),
    );
}

/// Split brain by pause: node0 owns a session and is in a turn (its model
/// call is slow); it is SIGSTOPped past its heartbeat, node1 takes the
/// session over and finishes the turn; node0 wakes with the model's reply
/// and is fenced: it runs no tool and writes nothing, and its caller gets
/// the turn as node1 finished it (or `SESSION_MOVED`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_owner_is_fenced_when_it_wakes() {
    let dir = tempfile::tempdir().unwrap();
    let agents = clerk_agents(dir.path());
    let pg = Postgres::shared();
    let cluster = start(options(2, pg.database("paused_owner"), agents.clone())).await;
    let model = cluster.model();
    // The first model call (node0's) answers after 4 s; later ones at once.
    model.set_responder(|request, number| {
        let reply = answer(request, number);
        if number == 1 {
            Reply::slow(Duration::from_secs(4), reply)
        } else {
            reply
        }
    });
    let node0 = cluster.node_client(0).with_timeout(Duration::from_secs(30));
    let session = node0.session("clerk").await;
    let cut = node0.spawn_post(
        &format!("/v1/sessions/{session}/messages"),
        json!({ "content": "pay the invoice" }),
    );
    model.wait_for_requests(1).await;
    // The turn's first step (its user message, phase `awaiting_model`)
    // is committed a moment after the model call starts: pause node0 once
    // it is (a turn nothing of which was stored is not taken over, its
    // client retries it).
    let node1 = cluster.node_client(1);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = node1.get(&format!("/v1/sessions/{session}/turns")).await;
        if body["turns"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["phase"] == "awaiting_model"))
        {
            break;
        }
        assert!(Instant::now() < until, "the turn was not stored: {body}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cluster.sigstop(0);
    // node1's sweep finds the open turn once node0's heartbeat is stale
    // (1 s) and resumes it: the ledger gets node1's call.
    let until = Instant::now() + Duration::from_secs(20);
    while ledger(&agents).is_empty() {
        assert!(Instant::now() < until, "node1 did not take the turn over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let messages = history(&node1, &session).await.unwrap();
        if messages
            .iter()
            .any(|m| m["role"] == "assistant" && m["content"] == "recorded: pay the invoice")
        {
            break;
        }
        assert!(
            Instant::now() < until,
            "the taken-over turn did not finish: {messages:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = history(&node1, &session).await.unwrap();
    cluster.sigcont(0);
    // The woken owner's caller learns how the turn ended: the answer node1
    // gave it (node0's own step was refused; it finds the turn finished in
    // the store), or SESSION_MOVED to retry; never node0's own call.
    let (status, body) = cut.await.unwrap();
    match status {
        StatusCode::OK => {
            assert_eq!(body["answer"], "recorded: pay the invoice", "{body}");
            assert_ne!(
                body["tool_calls"][0]["id"], "call_1",
                "node0's own call: {body}"
            );
        }
        _ => assert_eq!(body["error"]["code"], "SESSION_MOVED", "{status} {body}"),
    }
    // node0 wrote nothing after it woke and ran no tool.
    let after = history(&node1, &session).await.unwrap();
    assert_eq!(before, after, "the fenced node wrote to the session");
    let book = ledger(&agents);
    assert_eq!(book.len(), 1, "only node1's call ran: {book:?}");
    assert!(book.values().all(|n| *n == 1), "{book:?}");
    // The session goes on, through either node.
    let (status, body) = node0.say(&session, "and file it").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let seqs: Vec<u64> = history(&node1, &session)
        .await
        .unwrap()
        .iter()
        .filter_map(|m| m["seq"].as_u64())
        .collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
}

/// Two nodes driven at once for one session, bypassing HAProxy: the node
/// that does not own it forwards to the owner, so one history is written
/// with every `seq` once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_driving_one_session_commit_one_history() {
    let dir = tempfile::tempdir().unwrap();
    let agents = clerk_agents(dir.path());
    let pg = Postgres::shared();
    let cluster = start(options(2, pg.database("two_drivers"), agents.clone())).await;
    let session = cluster.node_client(0).session("clerk").await;
    let mut sent = Vec::new();
    for i in 0..10 {
        let client = cluster.node_client(i % 2);
        sent.push(client.spawn_post(
            &format!("/v1/sessions/{session}/messages"),
            json!({ "content": format!("message {i}") }),
        ));
    }
    let mut served_by = Vec::new();
    for s in sent {
        let (status, body) = s.await.unwrap();
        // A message that found the conversation busy is refused, never lost.
        assert!(
            status == StatusCode::OK
                || status == StatusCode::CONFLICT
                || status == StatusCode::TOO_MANY_REQUESTS,
            "{status} {body}"
        );
        if status == StatusCode::OK {
            served_by.push(body["answer"].clone());
        }
    }
    assert!(!served_by.is_empty());
    let messages = history(&cluster.node_client(1), &session).await.unwrap();
    let seqs: Vec<u64> = messages.iter().filter_map(|m| m["seq"].as_u64()).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "one commit per seq"
    );
    for answer in &served_by {
        assert_eq!(
            messages.iter().filter(|m| m["content"] == *answer).count(),
            1,
            "{answer} stored once"
        );
    }
    let book = ledger(&agents);
    assert!(book.values().all(|n| *n == 1), "{book:?}");
}

/// A new session belongs to no node until one runs it: the node its first
/// message reaches claims it, whichever node created it. Every `POST
/// /v1/sessions` hashes to one node behind HAProxy; when the creator owned
/// what it created, that node ran every conversation of the cluster and
/// the others only forwarded to it (`benches/cluster.sh`: three nodes
/// served what one does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_is_run_by_the_node_its_first_message_reaches() {
    let dir = tempfile::tempdir().unwrap();
    let agents = clerk_agents(dir.path());
    let pg = Postgres::shared();
    let url = pg.database("first_claim");
    let cluster = start(options(2, url.clone(), agents)).await;
    let owner = |session: &str| {
        pg.sql(
            &url,
            &format!("SELECT coalesce(owner, '-') FROM sessions WHERE id = '{session}'"),
        )
    };
    for (creator, runner) in [(0, 1), (1, 0)] {
        let session = cluster.node_client(creator).session("clerk").await;
        assert_eq!(owner(&session).trim(), "-", "created without an owner");
        let (status, body) = cluster
            .node_client(runner)
            .say(&session, "pay the invoice")
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            owner(&session).trim(),
            format!("n{runner}"),
            "run where its message arrived, not forwarded to n{creator}"
        );
    }
}

/// Another tenant's request for a session (a guess, a probe) is answered
/// 404 by the node it reached: it neither takes the session over (no
/// epoch bump) nor is forwarded to the owner. The owner's own tenant still
/// reaches it from any node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_request_neither_moves_a_session_nor_reaches_its_owner() {
    let dir = tempfile::tempdir().unwrap();
    let agents = clerk_agents(dir.path());
    let pg = Postgres::shared();
    let url = pg.database("foreign_tenant");
    let cluster = start(options(2, url.clone(), agents)).await;
    // The first key ends open mode; the admin key makes the tenants' keys.
    let (status, body) = cluster
        .node_client(0)
        .post("/v1/keys", &json!({"tenant": "ops", "admin": true}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let admin = cluster
        .node_client(0)
        .with_key(body["key"].as_str().unwrap());
    let mut keys = Vec::new();
    for tenant in ["alice", "bob"] {
        let (status, body) = admin.post("/v1/keys", &json!({ "tenant": tenant })).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        keys.push(body["key"].as_str().unwrap().to_string());
    }
    let alice = |node: usize| cluster.node_client(node).with_key(&keys[0]);
    let bob = |node: usize| cluster.node_client(node).with_key(&keys[1]);
    // node1 learns the keys at its next key-ring refresh (each heartbeat).
    // Wait for the last one created, bob's: a refresh between the admin
    // key and bob's (node1 out of open mode, bob still unknown: 401) made
    // this test flaky.
    let deadline = Instant::now() + Duration::from_secs(10);
    while bob(1).get("/v1/sessions").await.0 != StatusCode::OK {
        assert!(Instant::now() < deadline, "node1 never read the keys");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let session = alice(0).session("clerk").await;
    let row = || {
        pg.sql(
            &url,
            &format!(
                "SELECT coalesce(owner, '-') || ' ' || epoch FROM sessions WHERE id = '{session}'"
            ),
        )
    };
    let before = row();
    // Bob tries alice's session on both nodes.
    for node in [1, 0] {
        let response = bob(node)
            .request(
                reqwest::Method::POST,
                &format!("/v1/sessions/{session}/messages"),
            )
            .json(&json!({"content": "let me in"}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            response.headers()["x-cadre-node"],
            format!("n{node}").as_str(),
            "answered by the node it reached, not forwarded"
        );
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "SESSION_NOT_FOUND", "{body}");
        assert_eq!(row(), before, "bob's request moved alice's session");
    }
    assert_eq!(cluster.model().request_count(), 0);
    // Alice reaches her session through either node.
    for node in [1, 0] {
        let (status, body) = alice(node).say(&session, "pay the invoice").await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
}

/// A browser's WebSocket token is issued by the node the request reached
/// (not forwarded to the owner), so the socket opened through the same
/// node redeems it: tokens live in the memory of the node that issued them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_token_works_on_the_node_that_issued_it_while_another_owns_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let agents = clerk_agents(dir.path());
    let pg = Postgres::shared();
    let cluster = start(options(2, pg.database("ws_token"), agents)).await;
    let session = cluster.node_client(0).session("clerk").await;
    // node0 holds the session live.
    let (status, body) = cluster
        .node_client(0)
        .say(&session, "pay the invoice")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let response = cluster
        .node_client(1)
        .request(
            reqwest::Method::POST,
            &format!("/v1/sessions/{session}/ws-token"),
        )
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(response.headers()["x-cadre-node"], "n1");
    let body: Value = response.json().await.unwrap();
    let token = body["token"].as_str().unwrap();
    let ws = support::ws::connect_with_token(&cluster.node_url(1), &session, token).await;
    assert!(
        ws.is_ok(),
        "the token did not open the socket: {:?}",
        ws.err()
    );
}

/// A keyed request runs once in the cluster: a retry that reaches another
/// node while the first still runs is answered 409 `IDEMPOTENCY_KEY_IN_USE`
/// (it used to run the tool a second time: each node knew only its own
/// running requests), and once the first answered, the retry on any node
/// gets its stored answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_request_running_on_one_node_is_not_run_again_by_another() {
    let dir = tempfile::tempdir().unwrap();
    let agents = clerk_agents(dir.path());
    let holds = hold_tool(&agents);
    let pg = Postgres::shared();
    let cluster = start(options(
        2,
        pg.database("keyed_across_nodes"),
        agents.clone(),
    ))
    .await;
    let invoke = |node: usize| invoke_hold(&cluster.node_client(node), "once-only");
    let first = tokio::spawn(invoke(0).send());
    wait_for_holds(&holds, 1).await;
    let retry = invoke(1).send().await.unwrap();
    assert_eq!(retry.status(), StatusCode::CONFLICT);
    assert_eq!(retry.headers()["retry-after"], "1");
    let body: Value = retry.json().await.unwrap();
    assert_eq!(body["error"]["code"], "IDEMPOTENCY_KEY_IN_USE", "{body}");
    std::fs::write(agents.join("tools/release"), "").unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let first: Value = first.json().await.unwrap();
    for node in [1, 0] {
        let again = invoke(node).send().await.unwrap();
        assert_eq!(again.status(), StatusCode::OK);
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        let again: Value = again.json().await.unwrap();
        assert_eq!(again, first);
    }
    assert_eq!(holds(), 1, "the tool ran once");
}

/// Adds the tool `hold` to `agents`: it notes each run in `holds.log`,
/// then waits for the file `release` (at most 10 s, so a run that should
/// not have happened answers too). Returns a counter of its runs.
fn hold_tool(agents: &Path) -> impl Fn() -> usize + use<> {
    std::fs::write(
        agents.join("tools/hold.yaml"),
        "name: hold\ndescription: Note a call, then wait for the release file\ncategory: custom\n\
         parameters:\n  - name: note\n    type: string\n    required: true\n\
         entry: { type: external, command: [\"sh\", \"hold.sh\"] }\n\
         required_plan: free\nside_effects: at_most_once\n",
    )
    .unwrap();
    std::fs::write(
        agents.join("tools/hold.sh"),
        "cat > /dev/null\necho run >> holds.log\ni=0\n\
         while [ ! -e release ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done\n\
         echo '{\"held\": true}'\n",
    )
    .unwrap();
    let log = agents.join("tools/holds.log");
    move || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .count()
    }
}

/// `POST /v1/tools/hold/invoke` with `Idempotency-Key: key`.
fn invoke_hold(client: &Client, key: &str) -> reqwest::RequestBuilder {
    client
        .clone()
        .with_timeout(Duration::from_secs(30))
        .request(reqwest::Method::POST, "/v1/tools/hold/invoke")
        .header("idempotency-key", key)
        .json(&json!({"params": {"note": "wire the money"}}))
}

async fn wait_for_holds(holds: &impl Fn() -> usize, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while holds() < n {
        assert!(
            Instant::now() < deadline,
            "the tool did not start {n} times"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The node running a keyed request dies: its mark holds the key until
/// its heartbeat is stale (409 meanwhile), then a retry on another node
/// runs the request again, as a retry after a crash does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_request_cut_by_its_nodes_death_runs_again_elsewhere_once_it_is_stale() {
    let dir = tempfile::tempdir().unwrap();
    let agents = clerk_agents(dir.path());
    let holds = hold_tool(&agents);
    let pg = Postgres::shared();
    let mut cluster = start(options(2, pg.database("keyed_dead_node"), agents.clone())).await;
    let invoke = |client: Client| invoke_hold(&client, "cut-short");
    let cut = tokio::spawn(invoke(cluster.node_client(0)).send());
    wait_for_holds(&holds, 1).await;
    cluster.kill9(0);
    assert!(
        cut.await.unwrap().is_err(),
        "the first request got no answer"
    );
    std::fs::write(agents.join("tools/release"), "").unwrap();
    // node0's heartbeat goes stale after 1 s: until then the key is held.
    let node1 = cluster.node_client(1);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut held = 0;
    let answer = loop {
        let response = invoke(node1.clone()).send().await.unwrap();
        if response.status() != StatusCode::CONFLICT {
            break response;
        }
        held += 1;
        assert!(
            Instant::now() < deadline,
            "the dead node's mark never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(answer.status(), StatusCode::OK);
    assert!(answer.headers().get("idempotent-replayed").is_none());
    assert_eq!(holds(), 2, "run again once, on node1");
    println!("keyed retries refused while the dead node's mark held: {held}");
}

/// The node running a keyed request dies and is back before its
/// heartbeat went stale: the restarted process forgets the marks of the
/// one that died (they would look alive, with its fresh heartbeat, for
/// the whole 15 min lease), so a retry on another node runs the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_request_cut_by_a_quick_restart_runs_again_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let agents = clerk_agents(dir.path());
    let holds = hold_tool(&agents);
    let pg = Postgres::shared();
    let mut cluster = start(
        options(2, pg.database("keyed_quick_restart"), agents.clone())
            // Nobody is stale within this test.
            .env("CADRE_CLUSTER_OWNER_STALE_S", "60"),
    )
    .await;
    let invoke = |client: Client| invoke_hold(&client, "cut-short");
    let cut = tokio::spawn(invoke(cluster.node_client(0)).send());
    wait_for_holds(&holds, 1).await;
    cluster.kill9(0);
    assert!(
        cut.await.unwrap().is_err(),
        "the first request got no answer"
    );
    std::fs::write(agents.join("tools/release"), "").unwrap();
    let refused = invoke(cluster.node_client(1)).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::CONFLICT, "node0's mark holds");
    cluster.restart(0);
    let answer = invoke(cluster.node_client(1)).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(holds(), 2, "run again once, on node1");
}

/// A node whose `--data-dir` does not exist creates it and records `server.json` there: its store is
/// PostgreSQL, so nothing else would create it, and it used to warn that it
/// could not record the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_creates_its_missing_data_dir() {
    let pg = Postgres::shared();
    let database = pg.database("missing_data_dir");
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("not/there/yet");
    // The test's server log goes beside the data dir (`yet.log`): its
    // folder only is made here.
    std::fs::create_dir_all(data_dir.parent().unwrap()).unwrap();
    let server = support::server::Server::start_with_args(
        &data_dir,
        &support::repo_agents(),
        None,
        "127.0.0.1:0",
        &["--store".into(), database, "--node-id".into(), "n0".into()],
        &[],
    );
    let (status, body) = server.client().get("/healthz").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(data_dir.is_dir(), "{}", server.log_text());
    assert!(
        data_dir.join("server.json").is_file(),
        "{}",
        server.log_text()
    );
    assert!(
        !server.log_text().contains("could not record the server"),
        "{}",
        server.log_text()
    );
}

/// Issue #32: a client that lost a turn's stream from the node running
/// the turn reconnects to another node with `Last-Event-ID`: that node
/// forwards it to the turn's node, where the turn's log is, and the client
/// gets every later event exactly once (without the forwarding, the other
/// node would answer the turn's end only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_stream_resumes_through_another_node_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let agents = clerk_agents(dir.path());
    let pg = Postgres::shared();
    let cluster = start(options(2, pg.database("resume_stream"), agents)).await;
    let session = cluster.node_client(0).session("clerk").await;
    let stream = cluster
        .node_client(0)
        .post_streaming(&session, "file the report")
        .await;
    assert_eq!(stream.status(), StatusCode::OK);
    let (first, _) = support::sse::read_until(stream, |f| f.name == "tool_call_started").await;
    let turn = first[0].data["turn_id"]
        .as_str()
        .expect("turn_started first")
        .to_string();
    let last = first.last().unwrap().id.clone().expect("an id");
    let resumed = cluster
        .node_client(1)
        .request(
            reqwest::Method::GET,
            &format!("/v1/sessions/{session}/turns/{turn}/events"),
        )
        .header("last-event-id", &last)
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), StatusCode::OK);
    assert_eq!(
        resumed.headers()[cadre::cluster::forward::NODE_HEADER],
        "n0",
        "answered by the turn's node"
    );
    let (rest, _) = support::sse::read_until(resumed, |_| false).await;
    let names: Vec<&str> = rest.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names.first(), Some(&"tool_call_completed"), "{names:?}");
    assert_eq!(names.last(), Some(&"turn_completed"), "{names:?}");
    let numbers: Vec<u64> = support::sse::ids(&rest)
        .iter()
        .map(|id| id.trim_end_matches(".end").parse().unwrap())
        .collect();
    let from = last.parse::<u64>().unwrap() + 1;
    assert_eq!(
        numbers,
        (from..from + rest.len() as u64).collect::<Vec<_>>()
    );
    assert_eq!(
        rest.last().unwrap().data["answer"],
        "recorded: file the report"
    );
}
