//! N real `cadre serve` processes behind a real HAProxy, and the mock model.
//!
//! test ──▶ Cluster::client() ──▶ HAProxy ──▶ node0 | node1 | node2 (real binaries, own data dirs)
//!            node_client(i) ─────────────────▶ one node, bypassing HAProxy
//!                                             every node ──▶ MockModel (or the offline provider)
//!
//! The harness knows nothing of PostgreSQL or Redis: what makes the nodes a
//! cluster (`--store postgres://…`, `--redis redis://…`, `--node-id`,
//! `--advertise`) comes in as [`ClusterOptions::node_args`], a function of
//! the node's index and address, so the same harness runs plain redb nodes
//! (each its own data, HAProxy's routing alone) and cluster nodes. Decisions:
//! - **Fixed ports**: each node gets a free loopback port before anything
//!   starts, so `--advertise` can name it and a restarted node comes back
//!   where HAProxy's config looks for it (tokio binds with `SO_REUSEADDR`,
//!   so the port of a node killed a moment ago is free again).
//! - **Process-level faults only**: [`Cluster::kill9`] (SIGKILL, reaped),
//!   [`Cluster::restart`] (same port, same data dir, same arguments),
//!   [`Cluster::sigstop`] / [`Cluster::sigcont`] (a paused process keeps its
//!   sockets: connections hang instead of being refused).
//! - **Async start**: the mock model runs on the test's tokio runtime, and
//!   starting a node blocks its thread until the node printed its address;
//!   so tests using a cluster run on a multi-thread runtime.

use std::path::PathBuf;
use std::time::Duration;

use super::haproxy::{Haproxy, free_port};
use super::mock_model::MockModel;
use super::server::Server;
use super::{Client, repo_agents};

/// Extra `cadre serve` arguments of node `i` listening on `addr`
/// (`127.0.0.1:PORT`), e.g. `--node-id n{i} --advertise http://{addr}`.
pub type NodeArgs = Box<dyn Fn(usize, &str) -> Vec<String> + Send + Sync>;

pub struct ClusterOptions {
    pub nodes: usize,
    pub node_args: NodeArgs,
    /// Server config variables (`CADRE_*`) every node gets, in order (a
    /// later one overrides an earlier one).
    pub env: Vec<(String, String)>,
    pub agents: PathBuf,
    /// `false`: the nodes use the offline provider and no mock model runs.
    pub with_model: bool,
}

impl ClusterOptions {
    /// `nodes` plain nodes (no cluster flags) with the repository's agents
    /// and the offline provider. The HTTP API's per-caller rate limit is
    /// opened wide: behind HAProxy every keyless request comes from one
    /// address, the proxy's (a test about that limit sets it with
    /// [`Self::env`], which overrides).
    pub fn plain(nodes: usize) -> Self {
        ClusterOptions {
            nodes,
            node_args: Box::new(|_, _| Vec::new()),
            env: vec![
                ("CADRE_API_LIMIT_PER_SECOND".into(), "100000".into()),
                ("CADRE_API_LIMIT_BURST".into(), "100000".into()),
            ],
            agents: repo_agents(),
            with_model: false,
        }
    }

    /// The nodes answer from one [`MockModel`] ([`Cluster::model`]).
    pub fn with_model(mut self) -> Self {
        self.with_model = true;
        self
    }

    pub fn node_args(
        mut self,
        args: impl Fn(usize, &str) -> Vec<String> + Send + Sync + 'static,
    ) -> Self {
        self.node_args = Box::new(args);
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }
}

struct Node {
    /// `127.0.0.1:PORT`, kept across restarts.
    addr: String,
    data_dir: PathBuf,
    args: Vec<String>,
    /// `None` while killed.
    server: Option<Server>,
}

pub struct Cluster {
    nodes: Vec<Node>,
    haproxy: Haproxy,
    model: Option<MockModel>,
    options: ClusterOptions,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts the model, the nodes and HAProxy; returns once HAProxy's
    /// health check has marked every node up.
    pub async fn start(options: ClusterOptions) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let model = match options.with_model {
            true => Some(MockModel::start().await),
            false => None,
        };
        let nodes: Vec<Node> = (0..options.nodes)
            .map(|i| {
                let addr = format!("127.0.0.1:{}", free_port());
                Node {
                    args: (options.node_args)(i, &addr),
                    addr,
                    data_dir: dir.path().join(format!("node{i}")),
                    server: None,
                }
            })
            .collect();
        let backends: Vec<(String, String)> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (node_name(i), n.addr.clone()))
            .collect();
        let haproxy = Haproxy::start(&backends);
        let mut cluster = Cluster {
            nodes,
            haproxy,
            model,
            options,
            _dir: dir,
        };
        for i in 0..cluster.nodes.len() {
            cluster.launch(i);
        }
        cluster.wait_all_up(Duration::from_secs(30));
        cluster
    }

    fn launch(&mut self, i: usize) {
        let model_url = self.model.as_ref().map(MockModel::base_url);
        let mut env: Vec<(&str, &str)> = self
            .options
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        // The nodes' tools note runs beside themselves, in a folder the
        // sandbox makes read-only; the sandbox is tests/sandbox.rs's subject.
        env.push(("CADRE_TOOLS_SANDBOX", "off"));
        let node = &mut self.nodes[i];
        assert!(node.server.is_none(), "node {i} is already running");
        node.server = Some(Server::start_with_args(
            &node.data_dir,
            &self.options.agents,
            model_url.as_deref(),
            &node.addr,
            &node.args,
            &env,
        ));
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// A client of the cluster through HAProxy.
    pub fn client(&self) -> Client {
        self.haproxy.client()
    }

    pub fn haproxy(&self) -> &Haproxy {
        &self.haproxy
    }

    /// The mock model every node calls; panics when started without one.
    pub fn model(&self) -> &MockModel {
        self.model
            .as_ref()
            .expect("the cluster was started without_model")
    }

    /// Node `i`'s own URL, bypassing HAProxy.
    pub fn node_url(&self, i: usize) -> String {
        format!("http://{}", self.nodes[i].addr)
    }

    /// A client of node `i` alone.
    pub fn node_client(&self, i: usize) -> Client {
        Client::new(&self.node_url(i))
    }

    /// Node `i`'s process; panics while it is killed.
    pub fn node(&self, i: usize) -> &Server {
        self.nodes[i]
            .server
            .as_ref()
            .unwrap_or_else(|| panic!("node {i} is not running"))
    }

    /// SIGKILL node `i` and reap it: no shutdown code runs.
    pub fn kill9(&mut self, i: usize) {
        let mut server = self.nodes[i]
            .server
            .take()
            .unwrap_or_else(|| panic!("node {i} is not running"));
        server.kill_9();
    }

    /// Starts node `i` again on its port, data dir and arguments; returns
    /// once it printed its address (HAProxy marks it up a check later:
    /// [`Haproxy::wait_up`]).
    pub fn restart(&mut self, i: usize) {
        self.launch(i);
    }

    /// Pauses node `i` (SIGSTOP): it keeps its sockets but answers nothing.
    pub fn sigstop(&self, i: usize) {
        self.node(i).signal(libc::SIGSTOP);
    }

    /// Wakes node `i` paused by [`Self::sigstop`].
    pub fn sigcont(&self, i: usize) {
        self.node(i).signal(libc::SIGCONT);
    }

    /// Returns once HAProxy marked every running node up.
    pub fn wait_all_up(&self, within: Duration) {
        for (i, node) in self.nodes.iter().enumerate() {
            if node.server.is_some() {
                self.haproxy.wait_up(&node_name(i), within);
            }
        }
    }
}

/// Node `i`'s server name in HAProxy (what `X-Cadre-Backend` says).
pub fn node_name(i: usize) -> String {
    format!("node{i}")
}
