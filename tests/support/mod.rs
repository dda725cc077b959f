//! Shared test harness: a real cadre (HTTP on a loopback port, redb in a temp
//! dir, real actors) against a model faked at the wire by [`mock_model`].
//!
//! `spawn_app(...)` returns a [`TestApp`]; its requests go through the one
//! HTTP client of the tests, [`client::Client`] (also what
//! [`server::Server::client`] gives for the real binary), whose helpers
//! return `(StatusCode, Value)`. Dropping the app shuts cadre down and
//! closes the database, so a test can start a second app on the same data
//! dir. With `CADRE_TEST_STORE=postgres` the app's store is the data dir's
//! database on a real PostgreSQL instead of redb ([`store`]: also how a
//! test seeds or inspects the store around an app on either backend).
#![allow(dead_code)]

pub mod client;
pub mod clients;
pub mod cluster;
pub mod gate;
pub mod haproxy;
pub mod mock_model;
pub mod packages;
pub mod ports;
pub mod postgres;
pub mod redis;
pub mod server;
pub mod sse;
pub mod store;
pub mod workflow;
pub mod ws;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cadre::Runtime;
use cadre::model::ModelEndpoint;
use cadre::model::openai::ClientOptions;
use cadre::server_config::ServerConfig;
use cadre::tools::{ToolDefinition, ToolHandler};
use reqwest::StatusCode;
use serde_json::Value;

#[allow(unused_imports)]
pub use client::{Client, send, try_send};
#[allow(unused_imports)]
pub use mock_model::{MockModel, Reply};
#[allow(unused_imports)]
pub use store::redb_only;

/// The agents cadre ships (`assistant`, `trading-copilot`, ...): a copy of
/// the files `tests/fixtures/shipped-agents.txt` lists, never the live
/// `agents/` folder, where a team adds its own agent files, tools and
/// `mcp.toml` (docs/agents.md) and the suite must not load them. The copy
/// is made once per content (its folder under cargo's test temp dir is
/// named by a hash of the files), shared by the tests of a process, and
/// read-only by convention: a test that changes agent files copies it
/// into a folder of its own first.
pub fn repo_agents() -> PathBuf {
    static COPY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    COPY.get_or_init(copy_shipped_agents).clone()
}

fn copy_shipped_agents() -> PathBuf {
    use std::hash::{Hash, Hasher};
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = repo.join("tests/fixtures/shipped-agents.txt");
    let listed = std::fs::read_to_string(&manifest).expect("tests/fixtures/shipped-agents.txt");
    let files: Vec<(&str, Vec<u8>)> = listed
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|name| {
            let bytes = std::fs::read(repo.join("agents").join(name))
                .unwrap_or_else(|e| panic!("shipped agent file agents/{name}: {e}"));
            (name, bytes)
        })
        .collect();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    files.hash(&mut hasher);
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let dest = root.join(format!("shipped-agents-{:016x}", hasher.finish()));
    if dest.is_dir() {
        return dest;
    }
    let staging = root.join(format!("shipped-agents-staging-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    for (name, bytes) in &files {
        let path = staging.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).expect("create the agents copy");
        std::fs::write(&path, bytes).expect("write the agents copy");
        let mode = std::fs::metadata(repo.join("agents").join(name))
            .expect("stat")
            .permissions();
        std::fs::set_permissions(&path, mode).expect("chmod the agents copy");
    }
    // Another test process may have made the same copy meanwhile.
    if std::fs::rename(&staging, &dest).is_err() {
        let _ = std::fs::remove_dir_all(&staging);
        assert!(dest.is_dir(), "could not make {}", dest.display());
    }
    dest
}

pub struct TestApp {
    pub base: String,
    /// A client of this app that presents no key.
    pub client: Client,
    pub runtime: Option<Runtime>,
    pub data_dir: PathBuf,
    /// Kept alive for the test's duration.
    _dirs: Vec<tempfile::TempDir>,
}

pub struct AppOptions {
    /// `None`: the offline provider.
    pub model_url: Option<String>,
    pub agents_dir: PathBuf,
    pub data_dir: Option<PathBuf>,
    pub tools: Vec<(ToolDefinition, Arc<dyn ToolHandler>)>,
    pub max_retries: u32,
    pub request_timeout: Duration,
    /// Server settings (concurrency, API limit, executor, tools).
    pub config: ServerConfig,
}

impl AppOptions {
    pub fn offline() -> Self {
        AppOptions {
            model_url: None,
            agents_dir: repo_agents(),
            data_dir: None,
            tools: Vec::new(),
            max_retries: 2,
            request_timeout: Duration::from_secs(10),
            config: ServerConfig::default(),
        }
    }

    pub fn with_model(model: &MockModel) -> Self {
        AppOptions {
            model_url: Some(model.base_url()),
            ..Self::offline()
        }
    }

    pub fn agents(mut self, dir: &Path) -> Self {
        self.agents_dir = dir.to_path_buf();
        self
    }

    pub fn data_dir(mut self, dir: &Path) -> Self {
        self.data_dir = Some(dir.to_path_buf());
        self
    }

    /// Server settings from TOML text, as a config file would hold them.
    pub fn config_toml(mut self, text: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("cadre.toml");
        std::fs::write(&path, text).expect("write config");
        self.config = ServerConfig::load(Some(&path), Vec::new()).expect("valid test config");
        self
    }

    pub fn tool(mut self, def: ToolDefinition, handler: Arc<dyn ToolHandler>) -> Self {
        self.tools.push((def, handler));
        self
    }
}

pub fn spawn_app(options: AppOptions) -> TestApp {
    let mut dirs = Vec::new();
    let data_dir = match options.data_dir {
        Some(d) => d,
        None => {
            let d = tempfile::tempdir().expect("temp dir");
            let p = d.path().to_path_buf();
            dirs.push(d);
            p
        }
    };
    let endpoint = ModelEndpoint {
        base_url: options.model_url,
        api_key: None,
        model: None,
    };
    let endpoint = if endpoint.base_url.is_some() {
        ModelEndpoint {
            api_key: Some("test-key".into()),
            model: Some("mock-model".into()),
            ..endpoint
        }
    } else {
        endpoint
    };
    // `CADRE_TEST_STORE=postgres` (the second pass of `scripts/test`): the
    // same test on a one-node cluster, its store the data dir's database on
    // a real PostgreSQL ([`store`]).
    let mut config = options.config;
    if let Some(url) = store::database_of(&data_dir) {
        config.cluster.node_id = Some(store::node_id(&url));
        config.cluster.store = Some(url);
    }
    let mut builder = Runtime::builder()
        .data_dir(&data_dir)
        .agents_dir(&options.agents_dir)
        .listen("127.0.0.1:0".parse().unwrap())
        .model_endpoint(endpoint)
        .tool_family(cadre_sample::tools)
        .config(config)
        .workers(2)
        .client_options(ClientOptions {
            request_timeout: options.request_timeout,
            max_retries: options.max_retries,
            retry_base_delay: Duration::from_millis(5),
            max_retry_after: Duration::from_secs(5),
            ..ClientOptions::default()
        });
    for (def, handler) in options.tools {
        builder = builder.tool(def, handler);
    }
    let runtime = builder.start().expect("cadre starts");
    let addr = runtime.addr().expect("listening");
    let base = format!("http://{addr}");
    TestApp {
        client: Client::new(&base),
        base,
        runtime: Some(runtime),
        data_dir,
        _dirs: dirs,
    }
}

/// Writes agent files into a fresh temp dir; returns it.
pub fn agents_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write agent file");
    }
    dir
}

/// The requests tests make most, through [`TestApp::client`].
impl TestApp {
    pub async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        self.client.post(path, body).await
    }

    pub async fn post_raw(&self, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
        self.client.post_raw(path, body).await
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.client.get(path).await
    }

    /// POSTs a message with `Accept: text/event-stream`; the response as is.
    pub async fn post_streaming(&self, session: &str, content: &str) -> reqwest::Response {
        self.client.post_streaming(session, content).await
    }

    /// Creates a session of `agent`; returns its id.
    pub async fn session(&self, agent: &str) -> String {
        self.client.session(agent).await
    }

    pub async fn say(&self, session: &str, content: &str) -> (StatusCode, Value) {
        self.client.say(session, content).await
    }

    /// A client of this app that presents `key`.
    pub fn with_key(&self, key: &str) -> Client {
        self.client.with_key(key)
    }

    /// Shuts cadre down (closing the database) and keeps the temp dirs.
    pub fn stop(&mut self) {
        self.runtime.take();
    }
}

/// An agent file with the given tools and limits.
pub fn agent_toml(name: &str, tools: &[&str], max_iterations: u32) -> String {
    let tools: Vec<String> = tools.iter().map(|t| format!("{t:?}")).collect();
    format!(
        "name = {name:?}\nsystem_prompt = \"You are a test agent.\"\ntools = [{}]\nmax_iterations = {max_iterations}\n",
        tools.join(", ")
    )
}
