//! The cluster harness's own checks, on real processes: three `cadre serve`
//! binaries behind a real HAProxy (`tests/support/cluster.rs`), and the
//! configs shipped in `deploy/`.
//!
//! The nodes are plain redb nodes, each with its own data: a session lives
//! on the node it was created on, so where a request went is both what
//! HAProxy says (`X-Cadre-Backend`) and whether the session was found.
//! - A session's paths all reach one node, and sessions spread over all
//!   nodes (the hash key holds the id: `depth 3`).
//! - A node killed with SIGKILL is answered for by the others at once
//!   (retry and redispatch), marked down by the health check, and only its
//!   sessions move (consistent hashing); restarted, it gets them back. A
//!   paused node (SIGSTOP) is marked down too, and up once woken.
//! - A turn through HAProxy reaches the mock model from the session's node.
//! - HAProxy replays a request a dying node swallowed only when the replay
//!   is safe: never a POST without `Idempotency-Key`.
//! - HAProxy counts failed authentications per client address (the nodes
//!   see only HAProxy's) and refuses a client past its budget, not others.
//! - `deploy/haproxy.cfg` and `deploy/nginx.conf` are valid, the first
//!   routes and retries with the tested lines, and the second, run for real
//!   with only its addresses changed, keeps a session's paths on one node.

mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use support::cluster::{Cluster, ClusterOptions, node_name};
use support::haproxy::{BACKEND_HEADER, Haproxy, ensure_installed};
use support::{Client, Reply};

const NODES: usize = 3;
/// Session ids routed in the hash checks: enough that each node holds
/// several, few enough to stay fast.
const IDS: usize = 60;

/// The server HAProxy sent `GET path` to, and the node's status.
async fn route(client: &Client, path: &str) -> (String, StatusCode) {
    let response = client
        .request(Method::GET, path)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {path} through HAProxy: {e}"));
    let backend = response
        .headers()
        .get(BACKEND_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("GET {path}: no {BACKEND_HEADER} ({})", response.status()))
        .to_string();
    (backend, response.status())
}

/// Which node each of `ids` is routed to now.
async fn routes(client: &Client, ids: &[String]) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for id in ids {
        let (backend, status) = route(client, &format!("/v1/sessions/{id}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{id} is no session anywhere");
        map.insert(id.clone(), backend);
    }
    map
}

fn ids() -> Vec<String> {
    (0..IDS).map(|i| format!("routing-probe-{i:03}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_path_of_a_session_reaches_the_node_that_holds_it() {
    let cluster = Cluster::start(ClusterOptions::plain(NODES)).await;
    let client = cluster.client();
    // Four sessions created on each node directly: each exists there only.
    let mut sessions = Vec::new();
    for i in 0..NODES {
        for _ in 0..4 {
            sessions.push((
                cluster.node_client(i).session("assistant").await,
                node_name(i),
            ));
        }
    }
    for (id, home) in &sessions {
        let (first, status) = route(&client, &format!("/v1/sessions/{id}")).await;
        assert_eq!(
            status == StatusCode::OK,
            first == *home,
            "session {id} lives on {home}; HAProxy sent it to {first}, which answered {status}"
        );
        for path in ["", "/turns", "/messages", "/summary", "", "/turns"] {
            let (backend, _) = route(&client, &format!("/v1/sessions/{id}{path}")).await;
            assert_eq!(
                backend, first,
                "/v1/sessions/{id}{path} left the session's node"
            );
        }
    }
    // The key is the id, not the route: sessions spread over every node.
    let map = routes(&client, &ids()).await;
    for i in 0..NODES {
        let held = map.values().filter(|b| **b == node_name(i)).count();
        assert!(
            held > 0,
            "no session of {IDS} hashes to {}: {map:?}",
            node_name(i)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_is_marked_down_and_only_its_sessions_move() {
    let mut cluster = Cluster::start(ClusterOptions::plain(NODES)).await;
    let client = cluster.client();
    let ids = ids();
    let before = routes(&client, &ids).await;
    let victim = node_name(1);
    let on_victim: Vec<&String> = before
        .iter()
        .filter(|(_, b)| **b == victim)
        .map(|(id, _)| id)
        .collect();
    assert!(!on_victim.is_empty(), "no session hashes to {victim}");

    cluster.kill9(1);
    // Before the health check noticed: connections are refused, and HAProxy
    // retries on another node instead of answering 503.
    let (backend, status) = route(&client, &format!("/v1/sessions/{}", on_victim[0])).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "answered by a live node");
    assert_ne!(backend, victim);

    cluster
        .haproxy()
        .wait_down(&victim, Duration::from_secs(10));
    let during = routes(&client, &ids).await;
    let moved: Vec<&String> = ids.iter().filter(|id| before[*id] != during[*id]).collect();
    for id in &ids {
        if before[id] == victim {
            assert_ne!(during[id], victim, "{id} still routed to the dead node");
        } else {
            assert_eq!(during[id], before[id], "{id} moved though its node is up");
        }
    }
    assert_eq!(moved.len(), on_victim.len());
    assert!(
        moved.len() * 2 < IDS,
        "{} of {IDS} sessions moved: the hash is not consistent enough",
        moved.len()
    );

    cluster.restart(1);
    cluster.haproxy().wait_up(&victim, Duration::from_secs(10));
    assert_eq!(
        routes(&client, &ids).await,
        before,
        "the node got its sessions back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_through_haproxy_reaches_the_model_from_the_sessions_node() {
    let cluster = Cluster::start(ClusterOptions::plain(NODES).with_model()).await;
    let client = cluster.client();
    // A session HAProxy routes to the node that holds it: try one per node
    // until one lands home (each does with probability 1/3).
    let mut session = None;
    for attempt in 0..30 {
        let i = attempt % NODES;
        let id = cluster.node_client(i).session("assistant").await;
        if route(&client, &format!("/v1/sessions/{id}")).await.0 == node_name(i) {
            session = Some(id);
            break;
        }
    }
    let session = session.expect("one of 30 sessions hashes to its own node");
    cluster.model().push(Reply::text("through the balancer"));
    let (status, body) = client.say(&session, "hello").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(cluster.model().request_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_is_marked_down_and_back_up_once_woken() {
    let cluster = Cluster::start(ClusterOptions::plain(NODES)).await;
    let paused = node_name(2);
    cluster.sigstop(2);
    // Its checks time out (`timeout check 1s`, down after 2).
    cluster
        .haproxy()
        .wait_down(&paused, Duration::from_secs(10));
    for (id, backend) in routes(&cluster.client(), &ids()).await {
        assert_ne!(backend, paused, "{id} routed to a paused node");
    }
    cluster.sigcont(2);
    cluster.haproxy().wait_up(&paused, Duration::from_secs(10));
}

/// A backend that answers HAProxy's health check and swallows every other
/// request: it reads it whole, then closes without a word (a node dying
/// mid-request, seen from HAProxy). Returns its address and the methods of
/// the requests it swallowed.
fn swallowing_backend() -> (String, Arc<Mutex<Vec<String>>>) {
    fake_backend(None)
}

/// [`swallowing_backend`] that answers every request with `answer` (a
/// whole HTTP response) instead of closing in silence.
fn fake_backend(answer: Option<&'static [u8]>) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut head = Vec::new();
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                head.push(line);
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            let request_line = head.first().cloned().unwrap_or_default();
            if request_line.starts_with("GET /readyz ") {
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
            } else if !request_line.is_empty() {
                let method = request_line.split(' ').next().unwrap_or_default();
                record.lock().unwrap().push(method.to_string());
                if let Some(answer) = answer {
                    let _ = stream.write_all(answer);
                }
            }
        }
    });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swallowed_post_is_replayed_only_with_an_idempotency_key() {
    let (addr, seen) = swallowing_backend();
    let haproxy = Haproxy::start(&[("node0".to_string(), addr)]);
    haproxy.wait_up("node0", Duration::from_secs(10));
    let client = haproxy.client();
    let attempts = |method: Method, key: Option<&str>| {
        let request = client
            .request(method.clone(), "/v1/sessions/s/messages")
            .header("content-type", "application/json")
            .body(r#"{"content":"hi"}"#);
        let request = match key {
            Some(k) => request.header("idempotency-key", k),
            None => request,
        };
        let seen = seen.clone();
        async move {
            // HAProxy passes the node's silence on (it closes the client's
            // connection) or answers 502/504: either way, no answer.
            if let Ok(response) = request.send().await {
                assert!(
                    response.status().is_server_error(),
                    "{method}: {response:?}"
                );
            }
            std::mem::take(&mut *seen.lock().unwrap())
        }
    };
    assert_eq!(
        attempts(Method::POST, None).await,
        ["POST"],
        "a POST without a key reached the node once and must not be replayed"
    );
    assert_eq!(
        attempts(Method::POST, Some("k-1")).await,
        ["POST"; 3],
        "a POST with a key is replayed (retries 2)"
    );
    assert_eq!(attempts(Method::GET, None).await, ["GET"; 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_authentications_are_counted_per_client_address_at_the_balancer() {
    let (addr, seen) = fake_backend(Some(
        b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    ));
    let haproxy = Haproxy::start(&[("node0".to_string(), addr)]);
    haproxy.wait_up("node0", Duration::from_secs(10));
    let guesser = haproxy.client().with_key("wrong");
    for n in 1..=10 {
        let (status, _) = guesser.get("/v1/sessions").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "guess {n}");
    }
    let (status, _) = guesser.get("/v1/sessions").await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "the 11th guess in a minute"
    );
    assert_eq!(
        seen.lock().unwrap().len(),
        10,
        "the 11th never reached a node"
    );
    // Another client address still reaches the nodes.
    let other = Client::new(haproxy.addr())
        .with_local_address("127.0.0.2".parse().unwrap(), Duration::from_secs(10))
        .with_key("also-wrong");
    let (status, _) = other.get("/v1/sessions").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// The root of the repository.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_shipped_haproxy_config_is_valid() {
    ensure_installed("haproxy", "haproxy");
    let out = Command::new("haproxy")
        .args(["-c", "-f"])
        .arg(root().join("deploy/haproxy.cfg"))
        .output()
        .expect("haproxy runs");
    assert!(
        out.status.success(),
        "haproxy -c refuses deploy/haproxy.cfg:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_shipped_haproxy_config_routes_like_the_tested_one() {
    let shipped = std::fs::read_to_string(root().join("deploy/haproxy.cfg")).expect("read");
    let tested = support::haproxy::config(1, Path::new("/s"), &[]);
    for line in tested.lines().map(str::trim).filter(|l| {
        [
            "stick-table",
            "http-response sc-inc",
            "balance",
            "hash-type",
            "retry-on",
            "retries",
            "option redispatch",
            "http-request",
            "acl ",
            "option httpchk",
            "http-check",
        ]
        .iter()
        .any(|k| l.starts_with(k))
    }) {
        assert!(
            shipped.lines().any(|s| s.trim() == line),
            "deploy/haproxy.cfg lacks the tested line `{line}`"
        );
    }
}

/// nginx stopped when the test ends, however it ends: SIGTERM to the master
/// (a SIGKILL would leave its workers running), then reaped.
struct StopOnDrop(std::process::Child);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_nginx_config_keeps_a_session_on_one_node() {
    ensure_installed("nginx", "nginx-light");
    let cluster = Cluster::start(ClusterOptions::plain(NODES)).await;
    // deploy/nginx.conf with only the addresses changed, and a header
    // naming the node each answer came from.
    let port = support::haproxy::free_port();
    let mut conf = std::fs::read_to_string(root().join("deploy/nginx.conf"))
        .expect("read")
        .replace(
            "listen 8080;",
            &format!("listen 127.0.0.1:{port};\n        add_header X-Cadre-Backend $upstream_addr always;"),
        );
    let mut node_of = BTreeMap::new();
    for (i, shipped) in ["10.0.0.11:8080", "10.0.0.12:8080", "10.0.0.13:8080"]
        .iter()
        .enumerate()
    {
        assert!(conf.contains(shipped), "deploy/nginx.conf names {shipped}");
        let addr = cluster
            .node_url(i)
            .trim_start_matches("http://")
            .to_string();
        conf = conf.replace(shipped, &addr);
        node_of.insert(addr, node_name(i));
    }
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("nginx.conf"), conf).expect("write");
    let log = dir.path().join("error.log");
    let _nginx = StopOnDrop(
        Command::new("nginx")
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(dir.path().join("nginx.conf"))
            .arg("-g")
            .arg(format!(
                "daemon off; pid {}; error_log {};",
                dir.path().join("nginx.pid").display(),
                log.display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx starts"),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "nginx did not listen: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = Client::new(&format!("http://127.0.0.1:{port}"));
    let mut held = BTreeMap::new();
    for id in ids() {
        let (first, status) = route(&client, &format!("/v1/sessions/{id}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        for path in ["/turns", "/messages", "/summary"] {
            let (upstream, _) = route(&client, &format!("/v1/sessions/{id}{path}")).await;
            assert_eq!(
                upstream, first,
                "/v1/sessions/{id}{path} left the session's node"
            );
        }
        *held.entry(node_of[&first].clone()).or_insert(0) += 1;
    }
    assert_eq!(
        held.len(),
        NODES,
        "sessions spread over every node: {held:?}"
    );
}

#[test]
fn the_shipped_nginx_config_is_valid() {
    ensure_installed("nginx", "nginx-light");
    let out = Command::new("nginx")
        .arg("-t")
        .arg("-c")
        .arg(root().join("deploy/nginx.conf"))
        .output()
        .expect("nginx runs");
    assert!(
        out.status.success(),
        "nginx -t refuses deploy/nginx.conf:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
